"""A minimal operator written with kopf, as operator authors write them: for every
Greeting (demo.example.com/v1) it creates a ConfigMap `<name>-child` adopted by the
Greeting (kopf.adopt: an ownerReference with controller and blockOwnerDeletion), so
that Kubernetes' garbage collector deletes the child with its owner.

Run: KUBECONFIG=... python -m kopf run --standalone --all-namespaces greeting_operator.py
"""

import kopf
import kubernetes


@kopf.on.login()
def login(**kwargs):
    return kopf.login_via_client(**kwargs)


@kopf.on.create("demo.example.com", "v1", "greetings")
def create_child(spec, name, namespace, logger, **_):
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-child"},
        "data": {"text": spec.get("text", "")},
    }
    kopf.adopt(child)
    kubernetes.config.load_kube_config()
    kubernetes.client.CoreV1Api().create_namespaced_config_map(namespace, child)
    logger.info("created %s-child", name)
    return {"child": f"{name}-child"}
