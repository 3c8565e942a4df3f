"""Typed CRUD through the Python client's generated API (`kubernetes` package): every verb's
answer must decode as the type the API declares for it, e.g. `delete_namespaced_service`
returns a `V1Service`, as kube-apiserver answers, while a ConfigMap's delete answers a
`Status`. Run as `typed_crud.py SERVER_URL` (plain HTTP) or `typed_crud.py --kubeconfig
FILE` (its server, CA and client certificate: a tenant's, through tenant-proxy); prints one
`ok …` line per check and exits non-zero on the first failure."""

import sys

import kubernetes.client as k
import kubernetes.config
from kubernetes.client.rest import ApiException

cfg = k.Configuration()
if sys.argv[1] == "--kubeconfig":
    kubernetes.config.load_kube_config(config_file=sys.argv[2], client_configuration=cfg)
else:
    cfg.host = sys.argv[1]
client = k.ApiClient(cfg)
core = k.CoreV1Api(client)
storage = k.StorageV1Api(client)
NS = "default"


def check(what, got, typ):
    if not isinstance(got, typ):
        sys.exit(f"{what}: got {type(got).__name__}, want {typ.__name__}: {got!r:.300}")
    print("ok", what)
    return got


# Services: every verb answers a Service, delete included.
svc = {"metadata": {"name": "py-svc"}, "spec": {"ports": [{"port": 80}]}}
check("create service", core.create_namespaced_service(NS, svc), k.V1Service)
check("read service", core.read_namespaced_service("py-svc", NS), k.V1Service)
check("patch service", core.patch_namespaced_service("py-svc", NS, {"metadata": {"labels": {"a": "b"}}}), k.V1Service)
gone = check("delete service", core.delete_namespaced_service("py-svc", NS), k.V1Service)
assert gone.metadata.name == "py-svc" and gone.metadata.labels == {"a": "b"}, gone.metadata

# The other kinds whose delete answers the deleted object.
check("delete serviceaccount", (core.create_namespaced_service_account(NS, {"metadata": {"name": "py-sa"}}),
                                core.delete_namespaced_service_account("py-sa", NS))[1], k.V1ServiceAccount)
check("delete podtemplate", (core.create_namespaced_pod_template(NS, {"metadata": {"name": "py-pt"}, "template": {
    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}),
    core.delete_namespaced_pod_template("py-pt", NS))[1], k.V1PodTemplate)
check("delete resourcequota", (core.create_namespaced_resource_quota(NS, {"metadata": {"name": "py-rq"}, "spec": {
    "hard": {"pods": "10"}}}), core.delete_namespaced_resource_quota("py-rq", NS))[1], k.V1ResourceQuota)
check("delete storageclass", (storage.create_storage_class({"metadata": {"name": "py-sc"}, "provisioner": "example.com/x"}),
                              storage.delete_storage_class("py-sc"))[1], k.V1StorageClass)
check("delete pod", (core.create_namespaced_pod(NS, {"metadata": {"name": "py-pod"}, "spec": {
    "containers": [{"name": "c", "image": "busybox"}]}}), core.delete_namespaced_pod("py-pod", NS))[1], k.V1Pod)

# A claim kept by its protection finalizer: the answer is the claim, marked for deletion.
core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": "py-pvc"}, "spec": {
    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
kept = check("delete pvc", core.delete_namespaced_persistent_volume_claim("py-pvc", NS), k.V1PersistentVolumeClaim)
assert kept.metadata.deletion_timestamp is not None, kept.metadata
core.create_persistent_volume({"metadata": {"name": "py-pv"}, "spec": {
    "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/py-pv"}}})
check("delete pv", core.delete_persistent_volume("py-pv"), k.V1PersistentVolume)

# Kinds whose delete answers a Status.
core.create_namespaced_config_map(NS, {"metadata": {"name": "py-cm"}, "data": {"k": "v"}})
status = core.delete_namespaced_config_map("py-cm", NS)
if not (isinstance(status, dict) and status.get("kind") == "Status" and status.get("status") == "Success"):
    sys.exit(f"delete configmap: want a Success Status, got {status!r:.300}")
print("ok delete configmap (Status)")

# Errors: the client raises with the code and the Status body.
try:
    core.read_namespaced_service("py-svc", NS)
    sys.exit("read of a deleted service succeeded")
except ApiException as e:
    assert e.status == 404 and '"reason":"NotFound"' in e.body.replace(" ", ""), (e.status, e.body)
    print("ok 404 body")
