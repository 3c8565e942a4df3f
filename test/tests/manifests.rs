//! The pod-level manifests 07 (PV + PVC), 08 (Job) and 09 (namespace, ConfigMap, Secret)
//! from `test/manifests/`, applied with the official kubectl to a real cluster: the
//! apiserver, the scheduler, the controller-manager and a kubelet on the real Docker engine.
//! Each test reaches the state the manifest's comment describes and checks it the way a
//! user would (`kubectl wait`, `kubectl logs`, the files on the host).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::controller_manager::ControllerManager;
use e2e::kubelet::{node_containers, require_docker, Kubelet};
use e2e::scheduler::Scheduler;
use e2e::{manifests_dir, ApiServer};

/// A whole cluster with one node. Fields drop in order: the kubelet (removing its
/// containers) first, the apiserver last.
struct Cluster {
    kubelet: Kubelet,
    _cm: ControllerManager,
    _sched: Scheduler,
    api: ApiServer,
}

fn cluster(prefix: &str) -> Result<Option<Cluster>> {
    if !require_docker() {
        return Ok(None);
    }
    let api = ApiServer::start()?;
    let sched = Scheduler::start(&api, &[])?;
    let cm = ControllerManager::start(&api, &[])?;
    let kubelet = Kubelet::start(&api.url(), prefix)?;
    Ok(Some(Cluster { kubelet, _cm: cm, _sched: sched, api }))
}

impl Cluster {
    /// The official kubectl; fails with its stderr and the kubelet's log tail.
    fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = self.api.kubectl(args)?;
        if !out.ok {
            bail!("kubectl {}: {}{}\nkubelet log tail:\n{}", args.join(" "), out.stdout, out.stderr, self.log_tail());
        }
        Ok(out.stdout)
    }

    fn log_tail(&self) -> String {
        let log = self.kubelet.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Write `text` next to the apiserver's data and `kubectl apply -f` it.
    fn apply(&self, name: &str, text: &str) -> Result<String> {
        let path = self.api.data_dir.join(name);
        std::fs::write(&path, text)?;
        self.kubectl(&["apply", "-f", path.to_str().context("non-UTF-8 temp path")?])
    }

    /// Poll `kubectl get -o jsonpath` until it prints `want`.
    async fn wait_jsonpath(&self, args: &[&str], jsonpath: &str, want: &str, secs: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let jp = format!("jsonpath={jsonpath}");
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-o", &jp]);
        let mut last = String::new();
        while Instant::now() < deadline {
            let out = self.api.kubectl(&all)?;
            last = format!("{}{}", out.stdout, out.stderr);
            if out.ok && out.stdout.trim() == want {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        bail!(
            "kubectl get {} {jsonpath}: want {want:?}, last {last:?}\nkubelet log tail:\n{}",
            args.join(" "),
            self.log_tail()
        )
    }

    /// Poll `kubectl logs` until it contains every needle.
    async fn wait_logs(&self, args: &[&str], needles: &[&str], secs: u64) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut all = vec!["logs"];
        all.extend_from_slice(args);
        let mut last = String::new();
        while Instant::now() < deadline {
            let out = self.api.kubectl(&all)?;
            last = format!("{}{}", out.stdout, out.stderr);
            if out.ok && needles.iter().all(|n| out.stdout.contains(n)) {
                return Ok(out.stdout);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        bail!("kubectl logs {}: want {needles:?}, last {last:?}", args.join(" "))
    }

    async fn no_containers_left(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !node_containers(&self.kubelet.node).is_empty() {
            ensure!(Instant::now() < deadline, "containers left: {:?}", node_containers(&self.kubelet.node));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(())
    }
}

fn manifest(name: &str) -> Result<String> {
    let p = manifests_dir().join(name);
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// The file once it has `n` lines (a Running container may not have run its command yet).
async fn wait_lines(path: &std::path::Path, n: usize) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= n {
            ensure!(text.lines().count() == n, "{}: want {n} lines, got {text:?}", path.display());
            return Ok(text);
        }
        ensure!(Instant::now() < deadline, "{}: want {n} lines, got {text:?}", path.display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// 07: the persistentvolume-binder binds the claim to the PV (same class, big enough); the pod
/// mounts the PV's hostPath (moved to a temp dir so the test leaves nothing behind); what it
/// writes is on the host and survives the pod: a second pod on the same claim sees it.
#[tokio::test(flavor = "multi_thread")]
async fn manifest_07_pv_pvc_pod_writes_to_the_host_path() -> Result<()> {
    let Some(c) = cluster("mf-pv")? else { return Ok(()) };
    let host = tempfile::tempdir()?;
    let host_path = host.path().join("test-pv");
    let text = manifest("07-pv-pvc.yaml")?;
    ensure!(text.contains("path: /var/lib/minik8s/volumes/test-pv"), "07 manifest changed: {text}");
    let text = text.replace("path: /var/lib/minik8s/volumes/test-pv", &format!("path: {}", host_path.display()));
    let out = c.apply("07.yaml", &text)?;
    for what in ["persistentvolume/test-pv", "persistentvolumeclaim/test-pvc", "pod/pvc-pod"] {
        ensure!(out.contains(what), "apply output lacks {what}: {out}");
    }
    c.kubectl(&["wait", "--for=condition=Ready", "pod/pvc-pod", "--timeout=90s"])?;
    let node = c.kubectl(&["get", "pod", "pvc-pod", "-o", "jsonpath={.spec.nodeName}"])?;
    ensure!(node == c.kubelet.node, "scheduled to {node:?}, not {}", c.kubelet.node);
    let pvc = c.kubectl(&["get", "pvc", "test-pvc", "-o", "jsonpath={.spec.volumeName}"])?;
    ensure!(pvc == "test-pv", "claim bound to {pvc:?}");

    // The pod's `date >> /mnt/pv/log` landed in the PV's host path.
    let log = host_path.join("log");
    let first = wait_lines(&log, 1).await?;
    // And the pod sees what the host writes.
    std::fs::write(host_path.join("from-host"), "hello-from-host")?;
    let id = node_containers(&c.kubelet.node)
        .into_iter()
        .find(|(_, name, state)| name.contains("pvc-pod") && name.contains("c1") && state == "running")
        .map(|(id, _, _)| id)
        .context("no running c1 container")?;
    let cat = std::process::Command::new(e2e::kubelet::docker_bin())
        .args(["exec", &id, "cat", "/mnt/pv/from-host"])
        .output()?;
    ensure!(String::from_utf8_lossy(&cat.stdout) == "hello-from-host", "docker exec cat: {cat:?}");

    // Data survives the pod: a new pod on the same claim appends to the same file.
    c.kubectl(&["delete", "pod", "pvc-pod", "--grace-period=1"])?;
    c.no_containers_left().await?;
    ensure!(std::fs::read_to_string(&log)? == first, "deleting the pod changed the data");
    c.apply("07.yaml", &text)?;
    c.kubectl(&["wait", "--for=condition=Ready", "pod/pvc-pod", "--timeout=90s"])?;
    let second = wait_lines(&log, 2).await?;
    ensure!(second.starts_with(&first), "log after two pods: {second:?}");
    c.kubectl(&["delete", "pod", "pvc-pod", "--grace-period=1"])?;
    c.no_containers_left().await?;
    Ok(())
}

/// 08: three completions, two at a time; the Job reaches Complete and its logs print 5050.
#[tokio::test(flavor = "multi_thread")]
async fn manifest_08_job_completes_and_logs_the_sum() -> Result<()> {
    let Some(c) = cluster("mf-job")? else { return Ok(()) };
    let out = c.apply("08.yaml", &manifest("08-job.yaml")?)?;
    ensure!(out.contains("job.batch/sum"), "apply: {out}");
    c.kubectl(&["wait", "--for=condition=complete", "job/sum", "--timeout=120s"])?;
    let succeeded = c.kubectl(&["get", "job", "sum", "-o", "jsonpath={.status.succeeded}"])?;
    ensure!(succeeded == "3", "succeeded {succeeded:?}");
    let pods = c.kubectl(&[
        "get",
        "pods",
        "-l",
        "job-name=sum",
        "-o",
        "jsonpath={range .items[*]}{.status.phase} {.spec.nodeName}{\"\\n\"}{end}",
    ])?;
    let lines: Vec<&str> = pods.lines().collect();
    ensure!(lines.len() == 3, "want 3 job pods: {pods:?}");
    for l in &lines {
        ensure!(*l == format!("Succeeded {}", c.kubelet.node), "job pod: {l:?}");
    }
    let logs = c.wait_logs(&["job/sum"], &["5050"], 30).await?;
    ensure!(logs.trim() == "5050", "kubectl logs job/sum: {logs:?}");
    // Every pod computed the same sum.
    let names = c.kubectl(&["get", "pods", "-l", "job-name=sum", "-o", "name"])?;
    for n in names.lines() {
        let l = c.kubectl(&["logs", n])?;
        ensure!(l.trim() == "5050", "{n}: {l:?}");
    }
    c.kubectl(&["delete", "job", "sum", "--cascade=foreground"])?;
    c.no_containers_left().await?;
    Ok(())
}

/// 09: the pod prints the ConfigMap's GREETING (envFrom) and the Secret's file; deleting the
/// namespace removes everything in it, containers included.
#[tokio::test(flavor = "multi_thread")]
async fn manifest_09_namespace_configmap_secret() -> Result<()> {
    let Some(c) = cluster("mf-cfg")? else { return Ok(()) };
    let out = c.apply("09.yaml", &manifest("09-namespace-config.yaml")?)?;
    for what in ["namespace/demo", "configmap/settings", "secret/creds", "pod/reader"] {
        ensure!(out.contains(what), "apply output lacks {what}: {out}");
    }
    c.wait_jsonpath(&["get", "pod", "reader", "-n", "demo"], "{.status.phase}", "Succeeded", 90).await?;
    let logs = c.wait_logs(&["reader", "-n", "demo"], &["GREETING=hello", "s3cr3t"], 30).await?;
    ensure!(logs == "GREETING=hello\ns3cr3t", "kubectl logs reader: {logs:?}");
    let reason = c.kubectl(&[
        "get",
        "pod",
        "reader",
        "-n",
        "demo",
        "-o",
        "jsonpath={.status.containerStatuses[0].state.terminated.reason} {.status.containerStatuses[0].state.terminated.exitCode}",
    ])?;
    ensure!(reason == "Completed 0", "terminated: {reason:?}");

    c.kubectl(&["delete", "namespace", "demo", "--timeout=90s"])?;
    let out = c.api.kubectl(&["get", "namespace", "demo"])?;
    ensure!(!out.ok && out.stderr.contains("NotFound"), "namespace still there: {out:?}");
    let out = c.kubectl(&["get", "pods,configmaps,secrets", "-n", "demo", "-o", "name"])?;
    ensure!(out.trim().is_empty(), "left in demo: {out:?}");
    c.no_containers_left().await?;
    Ok(())
}
