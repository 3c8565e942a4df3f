//! `kubectl describe` for statefulsets, daemonsets, jobs, cronjobs, configmaps, secrets,
//! ingresses, persistentvolumeclaims and persistentvolumes: our kubectl prints what the
//! official one prints, on the same server.

use anyhow::{ensure, Result};
use e2e::kubectl::{official_kubectl, our_kubectl, run};
use e2e::{manifests_dir, ApiServer};

const EXTRA: &str = "apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, labels: {app: db}}
spec:
  serviceName: db
  replicas: 2
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: c, image: busybox, ports: [{containerPort: 80}]}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], storageClassName: manual, resources: {requests: {storage: 1Gi}}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, annotations: {note: x}}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      nodeSelector: {disk: ssd}
      containers: [{name: c, image: busybox, env: [{name: A, value: b}]}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: tick}
spec:
  schedule: '*/5 * * * *'
  startingDeadlineSeconds: 30
  jobTemplate:
    spec:
      completions: 2
      template:
        spec:
          restartPolicy: Never
          containers: [{name: c, image: busybox, command: [echo, hi]}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: bin, labels: {a: b}}
data: {two: \"line1\\nline2\"}
binaryData: {blob: AAECAw==}
";

// One key per data map: kubectl describe prints ConfigMap and Secret data in Go's map order,
// which is random for several keys, so only single-key sections compare byte for byte.
#[test]
fn describe_more_kinds_like_the_official_kubectl() -> Result<()> {
    let Some(official) = official_kubectl() else {
        eprintln!("skipping: no official kubectl");
        return Ok(());
    };
    if !manifests_dir().exists() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "manifests missing");
        return Ok(());
    }
    let ours = our_kubectl();
    let server = ApiServer::start()?;
    let url = server.url();
    for f in ["04-service.yaml", "06-ingress.yaml", "07-pv-pvc.yaml", "08-job.yaml", "09-namespace-config.yaml"] {
        let out = run(&official, &url, &["apply", "-f", &manifests_dir().join(f).to_string_lossy()], None)?;
        ensure!(out.code == 0, "{f}: {out:?}");
    }
    let out = run(&official, &url, &["apply", "-f", "-"], Some(EXTRA))?;
    ensure!(out.code == 0, "{out:?}");
    let cases: &[&[&str]] = &[
        &["describe", "statefulset", "db"],
        &["describe", "daemonset", "agent"],
        &["describe", "job", "sum"],
        &["describe", "cronjob", "tick"],
        &["describe", "configmap", "bin"],
        &["describe", "configmap", "settings", "-n", "demo"],
        &["describe", "secret", "creds", "-n", "demo"],
        &["describe", "ingress", "my-dns"],
        &["describe", "pvc", "test-pvc"],
        &["describe", "pv", "test-pv"],
        &["describe", "pv"],
        &["describe", "jobs"],
    ];
    for args in cases {
        let a = run(&ours, &url, args, None)?;
        let b = run(&official, &url, args, None)?;
        ensure!(b.code == 0, "official {args:?}: {b:?}");
        ensure!(a == b, "{args:?}:\nours:\n{}{}\nofficial:\n{}{}", a.stdout, a.stderr, b.stdout, b.stderr);
    }
    Ok(())
}
