//! Persistent volumes end to end: the apiserver, the scheduler, the controller-manager
//! (persistentvolume-binder, local-path provisioner, pvc-/pv-protection) and a kubelet on the
//! real Docker engine, driven with the official kubectl.
//!
//! - a claim without a class gets the default `local-path` class, waits for its first pod,
//!   binds to a volume provisioned on that pod's node; the data outlives the pod; deleting
//!   the claim (Delete) removes the directory and the volume;
//! - Retain: the volume becomes Released and keeps its data; a claim in use is deleted only
//!   after its pod;
//! - a claim bigger than every volume of a class without a provisioner stays Pending with an
//!   event; a volume with two sources is refused (422); an NFS volume the node cannot mount
//!   keeps its pod ContainerCreating with a FailedMount event.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::controller_manager::ControllerManager;
use e2e::kubelet::{require_docker, Kubelet};
use e2e::scheduler::Scheduler;
use e2e::ApiServer;

struct Cluster {
    kubelet: Kubelet,
    cm: ControllerManager,
    _sched: Scheduler,
    api: ApiServer,
    /// `--local-path-dir`.
    base: tempfile::TempDir,
}

fn cluster(prefix: &str) -> Result<Option<Cluster>> {
    if !require_docker() {
        return Ok(None);
    }
    let api = ApiServer::start()?;
    let sched = Scheduler::start(&api, &[])?;
    let base = tempfile::tempdir()?;
    let dir = base.path().to_str().context("non-UTF-8 temp dir")?.to_string();
    let cm = ControllerManager::start(&api, &["--local-path-dir", &dir])?;
    let kubelet = Kubelet::start(&api.url(), prefix)?;
    Ok(Some(Cluster { kubelet, cm, _sched: sched, api, base }))
}

impl Cluster {
    fn logs(&self) -> String {
        let tail =
            |s: String| s.lines().rev().take(25).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        format!(
            "\ncontroller-manager log tail:\n{}\nkubelet log tail:\n{}",
            tail(self.cm.log()),
            tail(self.kubelet.log())
        )
    }

    /// The official kubectl; fails with its output and the components' log tails.
    fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = self.api.kubectl(args)?;
        if !out.ok {
            bail!("kubectl {}: {}{}{}", args.join(" "), out.stdout, out.stderr, self.logs());
        }
        Ok(out.stdout)
    }

    fn apply(&self, name: &str, yaml: &str) -> Result<e2e::KubectlOutput> {
        let path = self.api.data_dir.join(name);
        std::fs::write(&path, yaml)?;
        self.api.kubectl(&["apply", "-f", path.to_str().context("non-UTF-8 path")?])
    }

    fn get(&self, what: &[&str], jsonpath: &str) -> Result<String> {
        let jp = format!("jsonpath={jsonpath}");
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend(["-o", &jp]);
        let out = self.api.kubectl(&args)?;
        Ok(if out.ok { out.stdout.trim().to_string() } else { format!("error: {}", out.stderr.trim()) })
    }

    /// Poll `kubectl get -o jsonpath` until `ok` holds for its output.
    async fn wait(&self, what: &[&str], jsonpath: &str, secs: u64, ok: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.get(what, jsonpath)?;
            if ok(&v) {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!("kubectl get {} {jsonpath}: last {v:?}{}", what.join(" "), self.logs());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Poll the events about `name` until one has `reason`; all of them.
    async fn wait_event(&self, name: &str, reason: &str, secs: u64) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let e = self.events(name)?;
            if e.contains(reason) {
                return Ok(e);
            }
            ensure!(Instant::now() < deadline, "no {reason} event about {name}: {e:?}{}", self.logs());
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The events about an object, as `reason: message` lines.
    fn events(&self, name: &str) -> Result<String> {
        let sel = format!("involvedObject.name={name}");
        self.get(&["events", "--field-selector", &sel], "{range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
    }
}

fn pod(name: &str, claim: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts:\n    - name: data\n      mountPath: /data\n  volumes:\n  - name: data\n    persistentVolumeClaim:\n      claimName: {claim}\n"
    )
}

fn claim(name: &str, class: Option<&str>, size: &str) -> String {
    let class = class.map(|c| format!("  storageClassName: {c:?}\n")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n{class}  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: {size}\n"
    )
}

async fn wait_file(path: &Path, want: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = std::fs::read_to_string(path).unwrap_or_default();
        if got.trim() == want {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{}: want {want:?}, got {got:?}", path.display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_gone(c: &Cluster, what: &[&str], secs: u64) -> Result<()> {
    c.wait(what, "{.metadata.name}", secs, |v| v.contains("NotFound")).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread")]
async fn provisioned_local_volume_survives_its_pod_and_goes_with_its_claim() -> Result<()> {
    let Some(c) = cluster("pv-prov")? else { return Ok(()) };
    let t0 = Instant::now();
    let out = c.apply("claim.yaml", &claim("data", None, "64Mi"))?;
    ensure!(out.ok, "apply claim: {out:?}");
    // DefaultStorageClass admission, then WaitForFirstConsumer.
    let class = c.wait(&["pvc", "data"], "{.spec.storageClassName}", 30, |v| !v.is_empty()).await?;
    ensure!(class == "local-path", "class {class:?}");
    c.wait(&["pvc", "data"], "{.status.phase}", 30, |v| v == "Pending").await?;
    c.wait(&["events", "--field-selector", "involvedObject.name=data"], "{.items[*].reason}", 30, |v| {
        v.contains("WaitForFirstConsumer")
    })
    .await?;

    let out = c.apply("writer.yaml", &pod("writer", "data", "echo hello > /data/f && sleep 3600"))?;
    ensure!(out.ok, "apply pod: {out:?}");
    c.kubectl(&["wait", "--for=condition=Ready", "pod/writer", "--timeout=90s"])?;
    c.wait(&["pvc", "data"], "{.status.phase}", 30, |v| v == "Bound").await?;
    let pv = c.get(&["pvc", "data"], "{.spec.volumeName}")?;
    let ann = c.get(&["pvc", "data"], "{.metadata.annotations}")?;
    for want in [
        "pv.kubernetes.io/bind-completed",
        "volume.kubernetes.io/selected-node",
        "rancher.io/local-path",
        &c.kubelet.node,
    ] {
        ensure!(ann.contains(want), "claim annotations lack {want}: {ann}");
    }
    let path = PathBuf::from(c.get(&["pv", &pv], "{.spec.hostPath.path}")?);
    ensure!(path.starts_with(c.base.path()), "volume path {} not under --local-path-dir", path.display());
    let affinity =
        c.get(&["pv", &pv], "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}")?;
    ensure!(affinity == c.kubelet.node, "node affinity {affinity:?}");
    wait_file(&path.join("f"), "hello").await?;
    let events = c.events("data")?;
    ensure!(events.contains("ProvisioningSucceeded"), "claim events: {events}");
    // kubectl get pv,pvc: upstream's columns.
    let table = c.kubectl(&["get", "pv,pvc"])?;
    for col in ["CAPACITY", "ACCESS MODES", "RECLAIM POLICY", "STATUS", "CLAIM", "STORAGECLASS", "VOLUME"] {
        ensure!(table.contains(col), "kubectl get pv,pvc lacks {col}:\n{table}");
    }
    ensure!(table.contains("default/data") && table.contains("RWO") && table.contains("Delete"), "{table}");

    // The data outlives the pod.
    c.kubectl(&["delete", "pod", "writer", "--wait=true"])?;
    let out = c.apply("reader.yaml", &pod("reader", "data", "cat /data/f; sleep 3600"))?;
    ensure!(out.ok, "apply reader: {out:?}");
    c.kubectl(&["wait", "--for=condition=Ready", "pod/reader", "--timeout=90s"])?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.api.kubectl(&["logs", "reader"])?.stdout.contains("hello") {
        ensure!(Instant::now() < deadline, "reader never printed hello{}", c.logs());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Delete: the claim goes, then the directory and the volume.
    c.kubectl(&["delete", "pod", "reader", "--wait=true"])?;
    c.kubectl(&["delete", "pvc", "data", "--wait=true", "--timeout=60s"])?;
    wait_gone(&c, &["pv", &pv], 60).await?;
    ensure!(!path.exists(), "{} left after the volume was deleted", path.display());
    eprintln!("provisioned volume lifecycle: {:?}", t0.elapsed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn retained_volume_is_released_and_a_claim_in_use_waits_for_its_pod() -> Result<()> {
    let Some(c) = cluster("pv-keep")? else { return Ok(()) };
    let class = "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: keep\nprovisioner: rancher.io/local-path\nreclaimPolicy: Retain\nvolumeBindingMode: Immediate\n";
    ensure!(c.apply("class.yaml", class)?.ok, "class");
    ensure!(c.apply("claim.yaml", &claim("kept", Some("keep"), "32Mi"))?.ok, "claim");
    // Immediate: bound before any pod.
    c.wait(&["pvc", "kept"], "{.status.phase}", 60, |v| v == "Bound").await?;
    let pv = c.get(&["pvc", "kept"], "{.spec.volumeName}")?;
    ensure!(c.get(&["pv", &pv], "{.spec.persistentVolumeReclaimPolicy}")? == "Retain", "policy");
    ensure!(c.apply("user.yaml", &pod("user", "kept", "echo kept > /data/f && sleep 3600"))?.ok, "pod");
    c.kubectl(&["wait", "--for=condition=Ready", "pod/user", "--timeout=90s"])?;
    let path = PathBuf::from(c.get(&["pv", &pv], "{.spec.hostPath.path}")?);
    wait_file(&path.join("f"), "kept").await?;

    // In use: the claim is Terminating until the pod is gone.
    c.kubectl(&["delete", "pvc", "kept", "--wait=false"])?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fins = c.get(&["pvc", "kept"], "{.metadata.deletionTimestamp} {.metadata.finalizers}")?;
    ensure!(fins.contains("kubernetes.io/pvc-protection") && !fins.starts_with(' '), "claim in use: {fins:?}");
    ensure!(c.get(&["pv", &pv], "{.status.phase}")? == "Bound", "volume released while in use");
    c.kubectl(&["delete", "pod", "user", "--wait=true"])?;
    wait_gone(&c, &["pvc", "kept"], 60).await?;
    // Retain: Released, data kept.
    c.wait(&["pv", &pv], "{.status.phase}", 30, |v| v == "Released").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(std::fs::read_to_string(path.join("f"))?.trim() == "kept", "retained data lost");
    ensure!(c.get(&["pv", &pv], "{.status.phase}")? == "Released", "retained volume changed phase");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn unsatisfiable_claims_wait_and_bad_volumes_are_refused() -> Result<()> {
    let Some(c) = cluster("pv-bad")? else { return Ok(()) };
    let host = tempfile::tempdir()?;
    let static_objs = format!(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: static\nprovisioner: kubernetes.io/no-provisioner\n---\napiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: small\nspec:\n  capacity:\n    storage: 1Gi\n  accessModes: [ReadWriteOnce]\n  storageClassName: static\n  hostPath:\n    path: {}\n",
        host.path().display()
    );
    ensure!(c.apply("static.yaml", &static_objs)?.ok, "static objects");
    ensure!(c.apply("big.yaml", &claim("big", Some("static"), "5Gi"))?.ok, "claim");
    let events = c.wait_event("big", "ExternalProvisioning", 30).await?;
    ensure!(events.contains("kubernetes.io/no-provisioner"), "{events}");
    ensure!(c.get(&["pvc", "big"], "{.status.phase}")? == "Pending", "big claim not Pending");
    ensure!(c.get(&["pv", "small"], "{.status.phase}")? == "Available", "small volume taken");

    // Two sources: 422.
    let two = "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: two\nspec:\n  capacity:\n    storage: 1Gi\n  accessModes: [ReadWriteOnce]\n  hostPath:\n    path: /tmp/two\n  nfs:\n    server: 127.0.0.1\n    path: /exports\n";
    let out = c.apply("two.yaml", two)?;
    ensure!(!out.ok && out.stderr.contains("may not specify more than 1 volume type"), "two sources: {out:?}");

    // NFS on a node that cannot mount it: ContainerCreating and a FailedMount event.
    let nfs = "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: nfs-pv\nspec:\n  capacity:\n    storage: 1Gi\n  accessModes: [ReadWriteMany]\n  storageClassName: \"\"\n  nfs:\n    server: 127.0.0.1\n    path: /exports\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: nfs-claim\nspec:\n  storageClassName: \"\"\n  accessModes: [ReadWriteMany]\n  resources:\n    requests:\n      storage: 1Gi\n";
    ensure!(c.apply("nfs.yaml", nfs)?.ok, "nfs objects");
    c.wait(&["pvc", "nfs-claim"], "{.status.phase}", 30, |v| v == "Bound").await?;
    ensure!(c.apply("nfs-pod.yaml", &pod("nfs-user", "nfs-claim", "sleep 3600"))?.ok, "nfs pod");
    let events = c.wait_event("nfs-user", "FailedMount", 60).await?;
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs.lines().any(|l| matches!(l.split_whitespace().last(), Some("nfs" | "nfs4"))) {
        ensure!(events.contains("no NFS client support") && events.contains("nfs-common"), "{events}");
    }
    let reason = c
        .wait(&["pod", "nfs-user"], "{.status.containerStatuses[0].state.waiting.reason}", 30, |v| !v.is_empty())
        .await?;
    ensure!(reason == "ContainerCreating", "nfs pod waits with {reason:?}");
    // Nothing else broke: the kubelet still runs pods.
    ensure!(c.kubelet.log().lines().all(|l| !l.contains("panicked")), "kubelet panicked");
    ensure!(c.apply("ok.yaml", &claim("fine", None, "16Mi"))?.ok, "claim");
    ensure!(c.apply("ok-pod.yaml", &pod("fine", "fine", "sleep 3600"))?.ok, "pod");
    c.kubectl(&["wait", "--for=condition=Ready", "pod/fine", "--timeout=90s"])?;
    Ok(())
}
