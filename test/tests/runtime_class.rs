//! RuntimeClass (`node.k8s.io/v1`) from manifest to container, and the CSI objects of
//! `storage.k8s.io/v1` (CSIDriver, CSINode, VolumeAttachment) a CSI driver's node plugin and
//! attacher write: served, defaulted, validated and printed as Kubernetes does, with the
//! official kubectl; a pod naming a RuntimeClass gets its overhead, node selector and
//! tolerations at admission, is refused when the class does not exist, and runs on the
//! Docker kubelet with the class's handler as its containers' runtime.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use e2e::kubelet::Node as Env;
use e2e::{official_kubectls, ApiServer};

const OBJECTS: &str = r#"apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: sandboxed}
handler: runsc
overhead: {podFixed: {cpu: 250m, memory: 64Mi}}
scheduling:
  nodeSelector: {sandbox: "yes"}
  tolerations: [{key: sandbox, operator: Exists, effect: NoSchedule}]
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: hostpath.csi.example.com}
spec:
  tokenRequests: [{audience: vault}]
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {name: node-1}
spec:
  drivers: [{name: hostpath.csi.example.com, nodeID: node-1, topologyKeys: [zone]}]
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {name: csi-1234}
spec:
  attacher: hostpath.csi.example.com
  nodeName: node-1
  source: {persistentVolumeName: pv-1}
"#;

fn header(out: &str) -> Vec<&str> {
    out.lines().next().unwrap_or_default().split_whitespace().collect()
}

fn row(out: &str) -> Vec<&str> {
    out.lines().nth(1).unwrap_or_default().split_whitespace().collect()
}

#[test]
fn runtime_classes_and_csi_objects_with_the_official_kubectl() -> Result<()> {
    for (v, bin) in official_kubectls(&["1.33", "1.27"]) {
        let server = ApiServer::start()?;
        let k = |args: &[&str]| server.kubectl_bin(&bin, args);
        let file = |name: &str, text: &str| -> Result<String> {
            let p = server.data_dir.join(name);
            std::fs::write(&p, text)?;
            Ok(p.to_string_lossy().into_owned())
        };
        let out = k(&["apply", "-f", &file("objects.yaml", OBJECTS)?])?;
        ensure!(out.ok, "kubectl {v} apply: {out:?}");

        // The columns of Kubernetes' printers, and the defaults it sets.
        let out = k(&["get", "runtimeclasses"])?;
        ensure!(header(&out.stdout) == ["NAME", "HANDLER", "AGE"], "kubectl {v}: {}", out.stdout);
        ensure!(row(&out.stdout)[..2] == ["sandboxed", "runsc"], "kubectl {v}: {}", out.stdout);
        let out = k(&["get", "csidrivers"])?;
        let want = [
            "NAME",
            "ATTACHREQUIRED",
            "PODINFOONMOUNT",
            "STORAGECAPACITY",
            "TOKENREQUESTS",
            "REQUIRESREPUBLISH",
            "MODES",
            "AGE",
        ];
        ensure!(header(&out.stdout) == want, "kubectl {v}: {}", out.stdout);
        ensure!(
            row(&out.stdout)[..7]
                == ["hostpath.csi.example.com", "true", "false", "false", "vault", "false", "Persistent"],
            "kubectl {v}: {}",
            out.stdout
        );
        let out = k(&["get", "csidriver", "hostpath.csi.example.com", "-o", "jsonpath={.spec.fsGroupPolicy}"])?;
        ensure!(out.stdout == "ReadWriteOnceWithFSType", "kubectl {v}: {out:?}");
        let out = k(&["get", "csinodes"])?;
        ensure!(header(&out.stdout) == ["NAME", "DRIVERS", "AGE"], "kubectl {v}: {}", out.stdout);
        ensure!(row(&out.stdout)[..2] == ["node-1", "1"], "kubectl {v}: {}", out.stdout);
        let patch = r#"{"status":{"attached":true}}"#;
        let out = k(&["patch", "volumeattachment", "csi-1234", "--subresource=status", "--type=merge", "-p", patch])?;
        ensure!(out.ok, "kubectl {v}: status patch: {out:?}");
        let out = k(&["get", "volumeattachments"])?;
        ensure!(
            header(&out.stdout) == ["NAME", "ATTACHER", "PV", "NODE", "ATTACHED", "AGE"],
            "kubectl {v}: {}",
            out.stdout
        );
        ensure!(
            row(&out.stdout)[..5] == ["csi-1234", "hostpath.csi.example.com", "pv-1", "node-1", "true"],
            "kubectl {v}: {}",
            out.stdout
        );

        // Validation: fixed fields stay fixed, required ones are required.
        let out = k(&["patch", "runtimeclass", "sandboxed", "--type=merge", "-p", r#"{"handler":"runc"}"#])?;
        ensure!(
            !out.ok && out.stderr.contains("handler: Invalid value: \"runc\": field is immutable"),
            "kubectl {v}: {out:?}"
        );
        let out = k(&[
            "patch",
            "csidriver",
            "hostpath.csi.example.com",
            "--type=merge",
            "-p",
            r#"{"spec":{"attachRequired":false}}"#,
        ])?;
        ensure!(
            !out.ok && out.stderr.contains("spec.attachRequired: Invalid value: false: field is immutable"),
            "kubectl {v}: {out:?}"
        );
        let bad = "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: bad}\nhandler: Not_A_Label\n";
        let out = k(&["apply", "-f", &file("bad.yaml", bad)?])?;
        ensure!(!out.ok && out.stderr.contains("handler: Invalid value: \"Not_A_Label\""), "kubectl {v}: {out:?}");
        let bad = "apiVersion: storage.k8s.io/v1\nkind: VolumeAttachment\nmetadata: {name: bad}\nspec: {source: {}}\n";
        let out = k(&["apply", "-f", &file("bad-va.yaml", bad)?])?;
        ensure!(
            !out.ok
                && out.stderr.contains("spec.attacher: Required value")
                && out.stderr.contains("spec.nodeName: Required value"),
            "kubectl {v}: {out:?}"
        );

        // RuntimeClass admission of pods.
        let pod = |name: &str, class: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  runtimeClassName: {class}\n  \
                 containers: [{{name: c, image: busybox}}]\n"
            )
        };
        let out = k(&["apply", "-f", &file("missing.yaml", &pod("p1", "missing"))?])?;
        ensure!(
            !out.ok
                && out.stderr.contains("pods \"p1\" is forbidden: pod rejected: RuntimeClass \"missing\" not found"),
            "kubectl {v}: {out:?}"
        );
        ensure!(k(&["apply", "-f", &file("ok.yaml", &pod("p2", "sandboxed"))?])?.ok);
        let out = k(&[
            "get",
            "pod",
            "p2",
            "-o",
            "jsonpath={.spec.overhead.cpu} {.spec.nodeSelector.sandbox} {.spec.tolerations[0].key}",
        ])?;
        ensure!(out.stdout == "250m yes sandbox", "kubectl {v}: {out:?}");
    }
    Ok(())
}

fn docker_runtime_of(pod: &str) -> Result<Vec<String>> {
    let docker = e2e::kubelet::docker_bin();
    let ids = Command::new(docker)
        .args(["ps", "-aq", "--filter", &format!("label=io.kubernetes.pod.name={pod}")])
        .output()?;
    let mut out = Vec::new();
    for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
        let r = Command::new(docker).args(["inspect", "-f", "{{.HostConfig.Runtime}}", id]).output()?;
        out.push(String::from_utf8_lossy(&r.stdout).trim().to_string());
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_runs_with_its_runtime_class_handler() -> Result<()> {
    let Some(env) = Env::start("rtclass")? else { return Ok(()) };
    let k = |args: &[&str]| env.api.kubectl(args);
    let node = env.kubelet.node.clone();
    let manifest = format!(
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {{name: plain}}\nhandler: runc\n---\n\
         apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {{name: exotic}}\nhandler: no-such-runtime\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: rc-plain}}\nspec:\n  nodeName: {node}\n  runtimeClassName: plain\n  \
         terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: busybox, imagePullPolicy: IfNotPresent, \
         command: [sleep, '3600']}}]\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: rc-exotic}}\nspec:\n  nodeName: {node}\n  runtimeClassName: exotic\n  \
         terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: busybox, imagePullPolicy: IfNotPresent, \
         command: [sleep, '3600']}}]\n"
    );
    let p = env.api.data_dir.join("rc.yaml");
    std::fs::write(&p, manifest)?;
    let out = k(&["apply", "-f", &p.to_string_lossy()])?;
    ensure!(out.ok, "{out:?}");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = k(&["get", "pod", "rc-plain", "-o", "jsonpath={.status.phase}"])?;
        if out.stdout == "Running" {
            break;
        }
        if Instant::now() > deadline {
            bail!("rc-plain not Running: {out:?}\n{}", env.kubelet.log());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let runtimes = docker_runtime_of("rc-plain")?;
    ensure!(
        runtimes.len() >= 2 && runtimes.iter().all(|r| r == "runc"),
        "sandbox and container runtimes: {runtimes:?}"
    );
    // A handler Docker does not know: the pod waits, and an event says why.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = k(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=rc-exotic",
            "-o",
            "jsonpath={.items[*].message}",
        ])?;
        if out.stdout.contains("no-such-runtime") {
            ensure!(out.stdout.contains("Failed to create pod sandbox"), "{out:?}");
            break;
        }
        if Instant::now() > deadline {
            bail!("no event for rc-exotic: {out:?}\n{}", env.kubelet.log());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let out = k(&["get", "pod", "rc-exotic", "-o", "jsonpath={.status.phase}"])?;
    ensure!(out.stdout == "Pending", "{out:?}");
    Ok(())
}
