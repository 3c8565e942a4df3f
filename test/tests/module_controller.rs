//! End-to-end tests of `module-controller` and the reference `base`: a real mosquitto, the
//! real apiserver, scheduler and controller-manager binaries, the official kubectl.
//!
//! - three bases join → three vnodes with Koupleless labels and taints; the seed's module
//!   pod (`10-module-pod.yaml`) is scheduled onto one, installed, Running/Ready; delete
//!   uninstalls it (the module's process ends) and removes the pod;
//! - a killed base → its vnode Ready=Unknown and its module pods not Ready; restarted →
//!   reconciled (module reinstalled); `kubectl logs` of a module pod shows the module's output;
//! - a dead base's Deployment pods are evicted by the node lifecycle controller and
//!   recreated on the other bases;
//! - the same path over the HTTP tunnel;
//! - the module Deployment (`11-module-deployment.yaml`) spreads one pod per base;
//! - bad input: malformed and stale messages dropped; an unreachable module URL gives a
//!   waiting container with the reason; a module no pod owns is uninstalled;
//! - two controller replicas: one Lease holder per vnode, takeover when it dies, one install.
//!
//! Module artifacts are shell scripts written under a per-test artifact root that the bases
//! resolve `file://` URLs against (`base --artifact-root`), so the manifests' paths
//! (`file:///var/lib/minik8s/modules/...`) work unchanged.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use e2e::module_controller::*;
use e2e::{eventually, manifests_dir, ApiServer};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn prerequisites() -> bool {
    require("mosquitto", "mosquitto") && require("kubectl", "google-cloud-cli (kubectl)")
}

async fn node_ready(c: &kube::Client, name: &str) -> Option<String> {
    let api: Api<Node> = Api::all(c.clone());
    let n = api.get_opt(name).await.ok()??;
    n.status?.conditions?.into_iter().find(|c| c.type_ == "Ready").map(|c| c.status)
}

async fn pod(c: &kube::Client, name: &str) -> Option<Pod> {
    Api::<Pod>::namespaced(c.clone(), "default").get_opt(name).await.ok()?
}

fn pod_ready(p: &Pod) -> bool {
    let s = p.status.as_ref();
    s.and_then(|s| s.phase.as_deref()) == Some("Running")
        && s.and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn wait_pod_ready(c: &kube::Client, name: &str, logs: &dyn Fn() -> String) -> Pod {
    let ok = eventually(WAIT, || async { pod(c, name).await.is_some_and(|p| pod_ready(&p)) }).await;
    assert!(ok.is_ok(), "pod {name} not Running/Ready: {:?}\n{}", pod(c, name).await.and_then(|p| p.status), logs());
    pod(c, name).await.unwrap_or_default()
}

/// A module pod bound directly to `node` (no scheduler involved).
fn bound_module_pod(name: &str, node: &str, module: &str, url: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"virtual-kubelet.koupleless.io/component": "module"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": module, "image": url, "env": [{"name": "BIZ_VERSION", "value": "1.0.0"}]}],
            "tolerations": [
                {"key": "schedule.koupleless.io/virtual-node", "operator": "Equal", "value": "True", "effect": "NoExecute"},
                {"key": "schedule.koupleless.io/node-env", "operator": "Equal", "value": "dev", "effect": "NoExecute"}]
        }
    }))
    .unwrap_or_default()
}

fn module_procs(work: &Path, base: &str, module_dir: &str) -> Vec<u32> {
    pids_with(&work.join(base).join("modules").join(module_dir).join("artifact").display().to_string())
}

/// Kill the one process of `module_dir` on `base` with SIGKILL, as a crash would.
fn crash_module(work: &Path, base: &str, module_dir: &str) {
    let pids = module_procs(work, base, module_dir);
    assert_eq!(pids.len(), 1, "one {module_dir} process on {base}");
    let st = std::process::Command::new("kill").args(["-9", &pids[0].to_string()]).status();
    assert!(st.is_ok_and(|s| s.success()), "kill {}", pids[0]);
}

struct Env {
    api: ApiServer,
    broker: Broker,
    dir: tempfile::TempDir,
}

impl Env {
    fn start() -> Result<Self> {
        let api = ApiServer::start()?;
        let broker = Broker::start()?;
        let dir = tempfile::tempdir()?;
        for m in ["biz1", "biz2", "biz3", "ghost"] {
            write_module(&dir.path().join("root"), &format!("/var/lib/minik8s/modules/{m}-0.0.1.jar"), m)?;
            write_module(&dir.path().join("root"), &format!("/modules/{m}.sh"), m)?;
        }
        Ok(Env { api, broker, dir })
    }
    fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("root")
    }
    fn work(&self) -> std::path::PathBuf {
        self.dir.path().join("work")
    }
    fn base(&self, id: &str) -> Result<Proc> {
        start_base(&self.broker, id, &self.root(), &self.work(), &[])
    }
    fn module_url(&self, m: &str) -> String {
        format!("file:///modules/{m}.sh")
    }
}

/// A controller-manager that notices a silent node in seconds and evicts its pods at once.
fn evicting_controller_manager(api: &ApiServer) -> Result<e2e::controller_manager::ControllerManager> {
    e2e::controller_manager::ControllerManager::start(
        api,
        &[
            "--node-monitor-grace-period",
            "6s",
            "--node-monitor-period",
            "1s",
            "--default-unreachable-toleration-seconds",
            "0",
        ],
    )
}

async fn wait_vnodes_ready(c: &kube::Client, ids: &[&str], logs: &dyn Fn() -> String) {
    for id in ids {
        let name = format!("vnode.{id}.dev");
        let ok = eventually(WAIT, || async { node_ready(c, &name).await.as_deref() == Some("True") }).await;
        assert!(ok.is_ok(), "vnode {name} not Ready\n{}", logs());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bases_become_vnodes_and_the_module_pod_runs_is_deleted_and_survives_a_base_restart() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let env = Env::start()?;
    let c = env.api.client()?;
    let (mc, _) = start_controller(&env.api, &env.broker, "mc-1", &[])?;
    let _sched = e2e::scheduler::Scheduler::start(&env.api, &[])?;
    let mut bases = vec![env.base("b1")?, env.base("b2")?, env.base("b3")?];
    let logs = || format!("controller log:\n{}", mc.log_text());
    wait_vnodes_ready(&c, &["b1", "b2", "b3"], &logs).await;

    // The labels and taints Koupleless gives a base's virtual node.
    let nodes: Api<Node> = Api::all(c.clone());
    let n = nodes.get("vnode.b1.dev").await?;
    let labels = n.metadata.labels.clone().unwrap_or_default();
    for (k, v) in [
        ("vnode.koupleless.io/name", "base"),
        ("vnode.koupleless.io/version", "1.0.0"),
        ("vnode.koupleless.io/tunnel", "mqtt_tunnel_provider"),
        ("base.koupleless.io/stack", "java"),
        ("base.koupleless.io/name", "base"),
        ("base.koupleless.io/version", "1.0.0"),
        ("base.koupleless.io/cluster-name", "default"),
        ("virtual-kubelet.koupleless.io/component", "vnode"),
        ("virtual-kubelet.koupleless.io/env", "dev"),
        ("kubernetes.io/hostname", "vnode.b1.dev"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "label {k} of {labels:?}");
    }
    assert!(labels.contains_key("base.koupleless.io/host-name"));
    let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(taints.iter().any(|t| t.key == "schedule.koupleless.io/virtual-node"
        && t.value.as_deref() == Some("True")
        && t.effect == "NoExecute"));
    assert!(taints.iter().any(|t| t.key == "schedule.koupleless.io/node-env" && t.value.as_deref() == Some("dev")));
    let status = n.status.unwrap_or_default();
    assert_eq!(status.capacity.unwrap_or_default().get("pods").map(|q| q.0.as_str()), Some("65535"));
    let ok = eventually(WAIT, || async {
        nodes.get("vnode.b1.dev").await.ok().and_then(|n| n.status?.capacity?.get("memory").cloned()).is_some()
    })
    .await;
    assert!(ok.is_ok(), "no memory capacity from the base's health");

    // The seed's module pod, applied with the official kubectl, scheduled by the scheduler.
    let manifest = manifests_dir().join("10-module-pod.yaml");
    let out = env.api.kubectl(&["apply", "--validate=false", "-f", &manifest.display().to_string()])?;
    assert!(out.ok, "kubectl apply: {out:?}");
    let p = wait_pod_ready(&c, "test-single-module-biz1", &logs).await;
    let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
    let base = node.strip_prefix("vnode.").and_then(|s| s.strip_suffix(".dev")).unwrap_or_default().to_string();
    assert!(["b1", "b2", "b3"].contains(&base.as_str()), "scheduled onto {node}");
    let cs = p.status.and_then(|s| s.container_statuses).unwrap_or_default();
    assert!(cs[0].ready && cs[0].state.as_ref().and_then(|s| s.running.as_ref()).is_some(), "{cs:?}");
    assert_eq!(module_procs(&env.work(), &base, "biz1-0.0.1").len(), 1, "the module runs on its base");
    let log_file = env.work().join(&base).join("modules/biz1-0.0.1/module.log");
    let ok = eventually(WAIT, || async {
        std::fs::read_to_string(&log_file).unwrap_or_default().contains("module biz1 0.0.1 started")
    })
    .await;
    assert!(ok.is_ok(), "module output not captured in {}", log_file.display());

    // `kubectl logs` of the module pod: the apiserver's pods/log proxy reaches the base.
    let out = env.api.kubectl(&["logs", "test-single-module-biz1"])?;
    assert!(out.ok && out.stdout.contains("module biz1 0.0.1 started"), "kubectl logs: {out:?}");

    // Delete → uninstall (process ends) → pod removed.
    let out = env.api.kubectl(&["delete", "pod", "test-single-module-biz1", "--wait=false"])?;
    assert!(out.ok, "kubectl delete: {out:?}");
    let ok = eventually(WAIT, || async { pod(&c, "test-single-module-biz1").await.is_none() }).await;
    assert!(ok.is_ok(), "pod not removed\n{}", logs());
    let ok = eventually(WAIT, || async { module_procs(&env.work(), &base, "biz1-0.0.1").is_empty() }).await;
    assert!(ok.is_ok(), "module still running after delete");

    // A base killed → Ready=Unknown (the Node stays); restarted → its module reinstalled.
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &bound_module_pod("on-b1", "vnode.b1.dev", "biz3", &env.module_url("biz3")))
        .await?;
    wait_pod_ready(&c, "on-b1", &logs).await;
    assert_eq!(module_procs(&env.work(), "b1", "biz3-1.0.0").len(), 1);
    bases[0].kill();
    let ok = eventually(WAIT, || async { node_ready(&c, "vnode.b1.dev").await.as_deref() == Some("Unknown") }).await;
    assert!(ok.is_ok(), "vnode.b1.dev not Unknown after its base died\n{}", logs());
    assert!(nodes.get_opt("vnode.b1.dev").await?.is_some(), "the vnode must not be deleted");
    let ok = eventually(WAIT, || async { pod(&c, "on-b1").await.is_some_and(|p| !pod_ready(&p)) }).await;
    assert!(ok.is_ok(), "module pod of a silent base must not stay Ready");
    let ok = eventually(WAIT, || async { module_procs(&env.work(), "b1", "biz3-1.0.0").is_empty() }).await;
    assert!(ok.is_ok(), "module processes die with their base");
    bases[0].restart()?;
    wait_vnodes_ready(&c, &["b1"], &logs).await;
    let ok = eventually(WAIT, || async { module_procs(&env.work(), "b1", "biz3-1.0.0").len() == 1 }).await;
    assert!(ok.is_ok(), "module not reinstalled on the returning base\n{}", logs());
    wait_pod_ready(&c, "on-b1", &logs).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn module_deployment_spreads_one_pod_per_base() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let env = Env::start()?;
    let c = env.api.client()?;
    let (mc, _) = start_controller(&env.api, &env.broker, "mc-1", &[])?;
    let _sched = e2e::scheduler::Scheduler::start(&env.api, &[])?;
    let _cm = e2e::controller_manager::ControllerManager::start(&env.api, &[])?;
    let _bases = vec![env.base("b1")?, env.base("b2")?, env.base("b3")?];
    let logs = || format!("controller log:\n{}", mc.log_text());
    wait_vnodes_ready(&c, &["b1", "b2", "b3"], &logs).await;
    let manifest = manifests_dir().join("11-module-deployment.yaml");
    let out = env.api.kubectl(&["apply", "--validate=false", "-f", &manifest.display().to_string()])?;
    assert!(out.ok, "kubectl apply: {out:?}");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let lp = ListParams::default().labels("module.koupleless.io/name=biz2");
    let ok = eventually(WAIT, || async {
        let l = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
        l.len() == 3 && l.iter().all(pod_ready)
    })
    .await;
    if ok.is_err() {
        let all = env.api.kubectl(&["get", "deploy,rs,pods", "-o", "wide"])?;
        panic!("3 biz2 pods not Running/Ready: {all:?}\ncontroller-manager:\n{}\n{}", _cm.log(), logs());
    }
    let nodes: BTreeSet<String> =
        pods.list(&lp).await?.items.into_iter().filter_map(|p| p.spec.and_then(|s| s.node_name)).collect();
    assert_eq!(nodes.len(), 3, "anti-affinity spreads biz2 one per base: {nodes:?}");
    for b in ["b1", "b2", "b3"] {
        assert_eq!(module_procs(&env.work(), b, "biz2-0.0.1").len(), 1, "biz2 runs once on {b}");
    }
    Ok(())
}

/// A module Deployment written as Koupleless' documentation writes one: its pods select bases
/// by `vnode.koupleless.io/name`, `vnode.koupleless.io/version` and `base.koupleless.io/stack`
/// and tolerate the vnode taints. Two bases of that name run it, a base of another name never
/// does; scaled up it runs twice; its base killed, its pods come back on the other matching base.
#[tokio::test(flavor = "multi_thread")]
async fn a_module_deployment_from_koupleless_documentation_runs_on_the_bases_it_selects() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let env = Env::start()?;
    let c = env.api.client()?;
    let (mc, _) = start_controller(&env.api, &env.broker, "mc-1", &[])?;
    let _sched = e2e::scheduler::Scheduler::start(&env.api, &[])?;
    let _cm = evicting_controller_manager(&env.api)?;
    let sample = ["--name", "koupleless-sample", "--version", "1.0.0"];
    let mut bases = vec![
        start_base(&env.broker, "b1", &env.root(), &env.work(), &sample)?,
        start_base(&env.broker, "b2", &env.root(), &env.work(), &sample)?,
        env.base("b3")?, // named `base`: not selected
    ];
    let logs = || format!("controller log:\n{}", mc.log_text());
    wait_vnodes_ready(&c, &["b1", "b2", "b3"], &logs).await;
    let manifest = env.dir.path().join("biz1.yaml");
    std::fs::write(
        &manifest,
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: biz1
  labels:
    virtual-kubelet.koupleless.io/component: module-deployment
spec:
  replicas: 1
  selector:
    matchLabels:
      module: biz1
  template:
    metadata:
      labels:
        module: biz1
        virtual-kubelet.koupleless.io/component: module
    spec:
      containers:
        - name: biz1
          image: file:///var/lib/minik8s/modules/biz1-0.0.1.jar
          env:
            - name: BIZ_VERSION
              value: 0.0.1
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - key: base.koupleless.io/stack
                    operator: In
                    values:
                      - java
                  - key: vnode.koupleless.io/version
                    operator: In
                    values:
                      - 1.0.0
                  - key: vnode.koupleless.io/name
                    operator: In
                    values:
                      - koupleless-sample
      tolerations:
        - key: "schedule.koupleless.io/virtual-node"
          operator: "Equal"
          value: "True"
          effect: "NoExecute"
        - key: "schedule.koupleless.io/node-env"
          operator: "Equal"
          value: "dev"
          effect: "NoExecute"
"#,
    )?;
    let out = env.api.kubectl(&["apply", "-f", &manifest.display().to_string()])?;
    assert!(out.ok, "kubectl apply: {out:?}");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let lp = ListParams::default().labels("module=biz1");
    let running = || async {
        pods.list(&lp).await.map(|l| l.items).unwrap_or_default().into_iter().filter(pod_ready).collect::<Vec<_>>()
    };
    let node_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    let selected = ["vnode.b1.dev", "vnode.b2.dev"];
    let wait_running = |n: usize, not_on: Option<String>| {
        let running = &running;
        async move {
            eventually(Duration::from_secs(120), || async {
                let r = running().await;
                r.len() == n && r.iter().all(|p| Some(node_of(p)) != not_on)
            })
            .await
        }
    };
    let fail = |what: &str| -> String {
        let all = env.api.kubectl(&["get", "nodes,deploy,pods", "-o", "wide", "--show-labels"]);
        format!("{what}: {all:?}\ncontroller-manager:\n{}\n{}", _cm.log(), logs())
    };
    assert!(wait_running(1, None).await.is_ok(), "{}", fail("biz1 not Running"));
    let on = node_of(&running().await[0]);
    assert!(selected.contains(&on.as_str()), "biz1 on {on}, not on a koupleless-sample base");
    let base = on.trim_start_matches("vnode.").trim_end_matches(".dev").to_string();
    assert_eq!(module_procs(&env.work(), &base, "biz1-0.0.1").len(), 1, "the module runs on {base}");

    let out = env.api.kubectl(&["scale", "deployment", "biz1", "--replicas=2"])?;
    assert!(out.ok, "kubectl scale: {out:?}");
    assert!(wait_running(2, None).await.is_ok(), "{}", fail("biz1 not scaled to 2"));
    for p in running().await {
        assert!(selected.contains(&node_of(&p).as_str()), "a biz1 pod on {}", node_of(&p));
    }

    // The base of the first pod dies: both replicas end up on the other selected base.
    let idx = selected.iter().position(|n| *n == on).unwrap_or_default();
    bases[idx].kill();
    let moved = wait_running(2, Some(on.clone())).await;
    assert!(moved.is_ok(), "{}", fail(&format!("biz1 pods not recreated away from {on}")));
    let other = selected[1 - idx];
    for p in running().await {
        assert_eq!(node_of(&p), other, "after {on} died");
    }
    assert!(module_procs(&env.work(), "b3", "biz1-0.0.1").is_empty(), "the base named `base` never runs biz1");
    drop(bases);
    Ok(())
}

/// Koupleless' peer mode — one module replica on every base of a name — is a DaemonSet whose
/// pods select those bases and tolerate the vnode taints: three bases get one module each, a
/// fourth base that joins gets one too, a base of another name none.
#[tokio::test(flavor = "multi_thread")]
async fn peer_modules_are_a_daemon_set_over_the_bases_of_a_name() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let env = Env::start()?;
    let c = env.api.client()?;
    let (mc, _) = start_controller(&env.api, &env.broker, "mc-1", &[])?;
    let _sched = e2e::scheduler::Scheduler::start(&env.api, &[])?;
    let cm = e2e::controller_manager::ControllerManager::start(&env.api, &[])?;
    let peer = ["--name", "peer-base"];
    let mut bases = Vec::new();
    for id in ["p1", "p2", "p3"] {
        bases.push(start_base(&env.broker, id, &env.root(), &env.work(), &peer)?);
    }
    bases.push(env.base("other")?);
    let logs = || format!("controller log:\n{}", mc.log_text());
    wait_vnodes_ready(&c, &["p1", "p2", "p3", "other"], &logs).await;
    let manifest = env.dir.path().join("peer.yaml");
    std::fs::write(
        &manifest,
        r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {name: biz2-peer, namespace: default}
spec:
  selector: {matchLabels: {module: biz2-peer}}
  template:
    metadata:
      labels: {module: biz2-peer, virtual-kubelet.koupleless.io/component: module}
    spec:
      containers:
        - name: biz2
          image: file:///var/lib/minik8s/modules/biz2-0.0.1.jar
          env: [{name: BIZ_VERSION, value: 0.0.1}]
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - {key: vnode.koupleless.io/name, operator: In, values: [peer-base]}
      tolerations:
        - {key: schedule.koupleless.io/virtual-node, operator: Equal, value: "True", effect: NoExecute}
        - {key: schedule.koupleless.io/node-env, operator: Equal, value: dev, effect: NoExecute}
"#,
    )?;
    let out = env.api.kubectl(&["apply", "-f", &manifest.display().to_string()])?;
    assert!(out.ok, "kubectl apply: {out:?}");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let lp = ListParams::default().labels("module=biz2-peer");
    let placed = |want: &'static [&'static str]| {
        let (pods, lp) = (pods.clone(), lp.clone());
        async move {
            eventually(Duration::from_secs(90), || async {
                let l = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
                let nodes: BTreeSet<String> =
                    l.iter().filter(|p| pod_ready(p)).filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
                l.len() == want.len() && nodes == want.iter().map(|b| format!("vnode.{b}.dev")).collect()
            })
            .await
        }
    };
    let diag = || {
        let all = env.api.kubectl(&["get", "ds,pods", "-o", "wide"]);
        format!("{all:?}\ncontroller-manager:\n{}\n{}", cm.log(), logs())
    };
    assert!(placed(&["p1", "p2", "p3"]).await.is_ok(), "one biz2 per peer-base base: {}", diag());
    for b in ["p1", "p2", "p3"] {
        assert_eq!(module_procs(&env.work(), b, "biz2-0.0.1").len(), 1, "biz2 runs on {b}");
    }
    let out = env.api.kubectl(&["rollout", "status", "daemonset/biz2-peer", "--timeout=60s"])?;
    assert!(out.ok, "kubectl rollout status: {out:?}");

    // A fourth base of the name joins: it gets the module too; `other` never does.
    bases.push(start_base(&env.broker, "p4", &env.root(), &env.work(), &peer)?);
    wait_vnodes_ready(&c, &["p4"], &logs).await;
    assert!(placed(&["p1", "p2", "p3", "p4"]).await.is_ok(), "the joining base got no biz2: {}", diag());
    assert!(module_procs(&env.work(), "other", "biz2-0.0.1").is_empty());
    drop(bases);
    Ok(())
}

/// A module that dies is installed again as the kubelet restarts a container: the first
/// time at once, then after a back-off (`CrashLoopBackOff`, a `BackOff` event); the pod's
/// container status counts the restarts and says how the last instance ended, and
/// `kubectl describe pod` shows why. Under `restartPolicy: Never` it stays down.
#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_module_restarts_with_back_off_and_the_pod_says_so() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let env = Env::start()?;
    let c = env.api.client()?;
    let (mc, _) = start_controller(&env.api, &env.broker, "mc-1", &[])?;
    let _bases = vec![env.base("b1")?];
    let logs = || format!("controller log:\n{}", mc.log_text());
    wait_vnodes_ready(&c, &["b1"], &logs).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &bound_module_pod("crashy", "vnode.b1.dev", "biz3", &env.module_url("biz3")))
        .await?;
    wait_pod_ready(&c, "crashy", &logs).await;
    let crash = || crash_module(&env.work(), "b1", "biz3-1.0.0");
    let status = |p: &Pod| p.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default().remove(0);
    let restarted_to = |n: i32| {
        let c = c.clone();
        async move {
            eventually(WAIT, || async {
                pod(&c, "crashy").await.is_some_and(|p| pod_ready(&p) && status(&p).restart_count == n)
            })
            .await
        }
    };

    // First crash: installed again at once.
    crash();
    assert!(restarted_to(1).await.is_ok(), "no first restart\n{}", logs());
    let p = pod(&c, "crashy").await.unwrap_or_default();
    let last = status(&p).last_state.and_then(|s| s.terminated).unwrap_or_default();
    assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("ModuleExited")), "{last:?}");
    assert!(last.message.unwrap_or_default().contains("module process exited"));
    assert_eq!(module_procs(&env.work(), "b1", "biz3-1.0.0").len(), 1, "biz3 runs again");

    // Second crash: a 10 s back-off, seen as CrashLoopBackOff, then running again.
    crash();
    let waiting = eventually(WAIT, || async {
        pod(&c, "crashy").await.is_some_and(|p| {
            let w = status(&p).state.and_then(|s| s.waiting).unwrap_or_default();
            w.reason.as_deref() == Some("CrashLoopBackOff")
                && w.message
                    .is_some_and(|m| m.starts_with("back-off 10s restarting failed container=biz3 pod=crashy_default("))
        })
    })
    .await;
    assert!(waiting.is_ok(), "no CrashLoopBackOff\n{}", logs());
    assert!(restarted_to(2).await.is_ok(), "no restart after the back-off\n{}", logs());

    // What a user reads: the events, through the official kubectl.
    let out = env.api.kubectl(&["describe", "pod", "crashy"])?;
    assert!(out.ok, "kubectl describe: {out:?}");
    for want in [
        "Restart Count:  2",
        "Last State:     Terminated",
        "ModuleExited",
        "BackOff",
        "Failed",
        "Started",
        "Installing",
    ] {
        assert!(out.stdout.contains(want), "describe lacks {want:?}:\n{}", out.stdout);
    }

    // restartPolicy Never: a crash is final.
    let mut once = bound_module_pod("once", "vnode.b1.dev", "biz1", &env.module_url("biz1"));
    if let Some(spec) = once.spec.as_mut() {
        spec.restart_policy = Some("Never".into());
    }
    pods.create(&PostParams::default(), &once).await?;
    wait_pod_ready(&c, "once", &logs).await;
    crash_module(&env.work(), "b1", "biz1-1.0.0");
    let down = eventually(WAIT, || async { pod(&c, "once").await.is_some_and(|p| !pod_ready(&p)) }).await;
    assert!(down.is_ok(), "the pod still Ready after its module died");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(module_procs(&env.work(), "b1", "biz1-1.0.0").is_empty(), "restarted under restartPolicy Never");
    let p = pod(&c, "once").await.unwrap_or_default();
    assert_eq!(status(&p).restart_count, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_dropped_and_failures_are_reported() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let env = Env::start()?;
    let c = env.api.client()?;
    let (mc, metrics_port) = start_controller(&env.api, &env.broker, "mc-1", &[])?;
    let _b1 = env.base("b1")?;
    let logs = || format!("controller log:\n{}", mc.log_text());
    wait_vnodes_ready(&c, &["b1"], &logs).await;

    // Malformed and stale heartbeats are dropped with a log line; a fresh one after them works.
    let hb = |id: &str, ts: i64| {
        json!({"publishTimestamp": ts, "data": {"baseMetadata": {"identity": id, "version": "1.0.0",
            "clusterName": "c", "name": "base"}, "localIP": "127.0.0.1", "localHostName": "h", "port": 1238,
            "state": "ACTIVATED"}})
        .to_string()
    };
    mqtt_publish(env.broker.port, "koupleless_dev/bad1/base/heart", b"{this is not json")?;
    mqtt_publish(env.broker.port, "koupleless_dev/bad2/base/heart", br#"{"data": {"baseMetadata": {}}}"#)?;
    mqtt_publish(env.broker.port, "koupleless_dev/stale1/base/heart", hb("stale1", now_ms() - 20_000).as_bytes())?;
    mqtt_publish(env.broker.port, "koupleless_dev/fresh1/base/heart", hb("fresh1", now_ms()).as_bytes())?;
    let nodes: Api<Node> = Api::all(c.clone());
    let ok = eventually(WAIT, || async { nodes.get_opt("vnode.fresh1.dev").await.ok().flatten().is_some() }).await;
    assert!(ok.is_ok(), "fresh heartbeat not turned into a vnode\n{}", logs());
    for n in ["vnode.bad1.dev", "vnode.bad2.dev", "vnode.stale1.dev"] {
        assert!(nodes.get_opt(n).await?.is_none(), "{n} must not exist");
    }
    let m = http_get(metrics_port, "/metrics")?;
    assert!(metric_sum(&m, "module_controller_tunnel_messages_dropped_total{reason=\"stale\"}") >= 1.0, "{m}");
    assert!(metric_sum(&m, "module_controller_tunnel_messages_dropped_total{reason=\"malformed\"}") >= 2.0, "{m}");
    let log = mc.log_text();
    assert!(log.contains("dropping tunnel message") && log.contains("stale message"), "{log}");

    // An unreachable module URL: the container waits with the reason.
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let port = e2e::free_port();
    pods.create(
        &PostParams::default(),
        &bound_module_pod("unreachable", "vnode.b1.dev", "nowhere", &format!("http://127.0.0.1:{port}/nowhere.jar")),
    )
    .await?;
    let waiting_reason = |p: Option<Pod>| {
        p.and_then(|p| p.status?.container_statuses?.first()?.state.as_ref()?.waiting.as_ref()?.reason.clone())
    };
    let ok = eventually(WAIT, || async {
        waiting_reason(pod(&c, "unreachable").await).as_deref() == Some("DownloadFailed")
    })
    .await;
    assert!(
        ok.is_ok(),
        "no DownloadFailed reason: {:?}\n{}",
        pod(&c, "unreachable").await.and_then(|p| p.status),
        logs()
    );
    let p = pod(&c, "unreachable").await.unwrap_or_default();
    assert!(!pod_ready(&p));

    // A module the base runs that no pod owns is uninstalled.
    let install = json!({"bizName": "ghost", "bizVersion": "1.0.0", "bizUrl": env.module_url("ghost")}).to_string();
    mqtt_publish(env.broker.port, "koupleless_dev/b1/installBiz", install.as_bytes())?;
    let base_log = env.work().join("base-b1.log");
    let ok = eventually(WAIT, || async {
        let l = std::fs::read_to_string(&base_log).unwrap_or_default();
        l.contains("module ACTIVATED module=ghost:1.0.0")
            && l.contains("module DEACTIVATED and removed module=ghost:1.0.0")
    })
    .await;
    assert!(
        ok.is_ok(),
        "ghost module not installed then uninstalled\nbase log:\n{}\n{}",
        std::fs::read_to_string(&base_log).unwrap_or_default(),
        logs()
    );
    assert!(module_procs(&env.work(), "b1", "ghost-1.0.0").is_empty());
    Ok(())
}

async fn lease_holder(c: &kube::Client, node: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    api.get_opt(node).await.ok()??.spec?.holder_identity
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_own_each_vnode_once_and_take_over() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let env = Env::start()?;
    let c = env.api.client()?;
    let (mut a, _) = start_controller(&env.api, &env.broker, "mc-a", &[])?;
    let (mut b, _) = start_controller(&env.api, &env.broker, "mc-b", &[])?;
    let _b1 = env.base("b1")?;
    let logs = |a: &Proc, b: &Proc| format!("mc-a:\n{}\nmc-b:\n{}", a.log_text(), b.log_text());
    wait_vnodes_ready(&c, &["b1"], &|| logs(&a, &b)).await;
    let holder = lease_holder(&c, "vnode.b1.dev").await.unwrap_or_default();
    assert!(holder == "mc-a" || holder == "mc-b", "holder {holder:?}");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &bound_module_pod("m1", "vnode.b1.dev", "biz1", &env.module_url("biz1")))
        .await?;
    wait_pod_ready(&c, "m1", &|| logs(&a, &b)).await;

    // Kill the holder; the other replica takes the vnode over and serves it.
    let other = if holder == "mc-a" {
        a.kill();
        "mc-b"
    } else {
        b.kill();
        "mc-a"
    };
    let ok = eventually(WAIT, || async { lease_holder(&c, "vnode.b1.dev").await.as_deref() == Some(other) }).await;
    assert!(ok.is_ok(), "{other} did not take over\n{}", logs(&a, &b));
    pods.create(&PostParams::default(), &bound_module_pod("m2", "vnode.b1.dev", "biz2", &env.module_url("biz2")))
        .await?;
    wait_pod_ready(&c, "m2", &|| logs(&a, &b)).await;
    wait_pod_ready(&c, "m1", &|| logs(&a, &b)).await;
    pods.delete("m1", &DeleteParams::default()).await?;
    let ok = eventually(WAIT, || async { pod(&c, "m1").await.is_none() }).await;
    assert!(ok.is_ok(), "m1 not removed by the new owner\n{}", logs(&a, &b));

    // Never two installs of one module: the base saw exactly one installBiz per module.
    let base_log = std::fs::read_to_string(env.work().join("base-b1.log")).unwrap_or_default();
    for m in ["biz1:1.0.0", "biz2:1.0.0"] {
        let n =
            base_log.lines().filter(|l| l.contains("command=installBiz") && l.contains(&format!("module={m}"))).count();
        assert_eq!(n, 1, "installs of {m}:\n{base_log}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_http_tunnel_serves_a_base_end_to_end() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let env = Env::start()?;
    let c = env.api.client()?;
    let tunnel_port = e2e::free_port();
    let (mc, _) =
        start_controller(&env.api, &env.broker, "mc-http", &["--http-tunnel-port", &tunnel_port.to_string()])?;
    let arklet_port = e2e::free_port();
    let mut base = start_base(
        &env.broker,
        "h1",
        &env.root(),
        &env.work(),
        &[
            "--http-tunnel",
            &format!("http://127.0.0.1:{tunnel_port}"),
            "--arklet-port",
            &arklet_port.to_string(),
            "--local-ip",
            "127.0.0.1",
        ],
    )?;
    let logs = || format!("controller log:\n{}", mc.log_text());
    wait_vnodes_ready(&c, &["h1"], &logs).await;
    let n = Api::<Node>::all(c.clone()).get("vnode.h1.dev").await?;
    let labels = n.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("vnode.koupleless.io/tunnel").map(String::as_str), Some("http_tunnel_provider"));
    assert_eq!(labels.get("base.koupleless.io/tunnel-port"), Some(&arklet_port.to_string()));

    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &bound_module_pod("h-m1", "vnode.h1.dev", "biz1", &env.module_url("biz1")))
        .await?;
    wait_pod_ready(&c, "h-m1", &logs).await;
    assert_eq!(module_procs(&env.work(), "h1", "biz1-1.0.0").len(), 1);
    let ok = eventually(WAIT, || async {
        http_get(arklet_port, "/logs/biz1").unwrap_or_default().contains("module biz1 1.0.0 started")
    })
    .await;
    assert!(ok.is_ok(), "module output not served by the base");

    // Base killed → Unknown; restarted → module reinstalled.
    base.kill();
    let ok = eventually(WAIT, || async { node_ready(&c, "vnode.h1.dev").await.as_deref() == Some("Unknown") }).await;
    assert!(ok.is_ok(), "vnode.h1.dev not Unknown\n{}", logs());
    base.restart()?;
    wait_vnodes_ready(&c, &["h1"], &logs).await;
    let ok = eventually(WAIT, || async { module_procs(&env.work(), "h1", "biz1-1.0.0").len() == 1 }).await;
    assert!(ok.is_ok(), "module not reinstalled over HTTP\n{}", logs());

    // Delete → uninstalled → removed.
    pods.delete("h-m1", &DeleteParams::default()).await?;
    let ok = eventually(WAIT, || async { pod(&c, "h-m1").await.is_none() }).await;
    assert!(ok.is_ok(), "pod not removed\n{}", logs());
    let ok = eventually(WAIT, || async { module_procs(&env.work(), "h1", "biz1-1.0.0").is_empty() }).await;
    assert!(ok.is_ok(), "module still running after delete");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_base_s_module_pods_are_recreated_on_the_other_bases() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let env = Env::start()?;
    let c = env.api.client()?;
    let (mc, _) = start_controller(&env.api, &env.broker, "mc-1", &[])?;
    let _sched = e2e::scheduler::Scheduler::start(&env.api, &[])?;
    let _cm = evicting_controller_manager(&env.api)?;
    let mut bases = vec![env.base("b1")?, env.base("b2")?, env.base("b3")?];
    let logs = || format!("controller log:\n{}", mc.log_text());
    wait_vnodes_ready(&c, &["b1", "b2", "b3"], &logs).await;
    let manifest = env.dir.path().join("biz3.yaml");
    std::fs::write(
        &manifest,
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: biz3, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {module.koupleless.io/name: biz3}}
  template:
    metadata:
      labels: {virtual-kubelet.koupleless.io/component: module, module.koupleless.io/name: biz3}
    spec:
      containers:
        - name: biz3
          image: file:///modules/biz3.sh
          env: [{name: BIZ_VERSION, value: 1.0.0}]
      tolerations:
        - {key: schedule.koupleless.io/virtual-node, operator: Equal, value: "True", effect: NoExecute}
        - {key: schedule.koupleless.io/node-env, operator: Equal, value: dev, effect: NoExecute}
"#,
    )?;
    let out = env.api.kubectl(&["apply", "--validate=false", "-f", &manifest.display().to_string()])?;
    assert!(out.ok, "kubectl apply: {out:?}");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let lp = ListParams::default().labels("module.koupleless.io/name=biz3");
    let running = || async {
        pods.list(&lp).await.map(|l| l.items).unwrap_or_default().into_iter().filter(pod_ready).collect::<Vec<_>>()
    };
    let ok = eventually(WAIT, || async { running().await.len() == 3 }).await;
    assert!(ok.is_ok(), "biz3 not Running\n{}", logs());
    let victim = running().await[0].spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    let idx = ["vnode.b1.dev", "vnode.b2.dev", "vnode.b3.dev"].iter().position(|n| *n == victim);
    let Some(idx) = idx else { panic!("biz3 pod on unexpected node {victim:?}") };
    eprintln!("killing the base of {victim}");
    bases[idx].kill();
    let ok = eventually(WAIT, || async { node_ready(&c, &victim).await.as_deref() == Some("Unknown") }).await;
    assert!(ok.is_ok(), "{victim} not Unknown");
    let ok = eventually(Duration::from_secs(120), || async {
        let r = running().await;
        r.len() == 3 && r.iter().all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(victim.as_str()))
    })
    .await;
    if ok.is_err() {
        let all = env.api.kubectl(&["get", "nodes,pods", "-o", "wide"])?;
        panic!("biz3 pods not recreated away from {victim}: {all:?}\ncontroller-manager:\n{}\n{}", _cm.log(), logs());
    }
    Ok(())
}

/// The MQTT tunnel over TLS: a broker with only a TLS listener; the controller and a base
/// that trust its CA get a Ready vnode, a base speaking plain MQTT to it gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_mqtt_tunnel_works_over_tls() -> Result<()> {
    if !prerequisites() || !require("openssl", "openssl") {
        return Ok(());
    }
    let api = ApiServer::start()?;
    let (broker, ca) = Broker::start_tls()?;
    let ca = ca.display().to_string();
    let dir = tempfile::tempdir()?;
    let (root, work) = (dir.path().join("root"), dir.path().join("work"));
    std::fs::create_dir_all(&root)?;
    let (mc, _) = start_controller(&api, &broker, "mc-tls", &["--mqtt-ca-file", &ca])?;
    let _tls_base = start_base(&broker, "tls1", &root, &work, &["--mqtt-ca-file", &ca])?;
    let plain_base = start_base(&broker, "plain1", &root, &work, &[])?;
    let c = api.client()?;
    let logs = || format!("controller log:\n{}", mc.log_text());
    wait_vnodes_ready(&c, &["tls1"], &logs).await;
    assert_eq!(
        node_ready(&c, "vnode.plain1.dev").await,
        None,
        "a plain-MQTT base must not get through a TLS-only broker"
    );
    assert!(!plain_base.log_text().is_empty(), "the plain base logs its connection failures");

    // A client certificate without its key is refused at start with a clear message.
    let out = std::process::Command::new(bin_dir().join("module-controller"))
        .args(["--server", &api.url(), "--mqtt-broker", &broker.address(), "--mqtt-ca-file", &ca])
        .args(["--mqtt-client-cert-file", &ca, "--http-tunnel-port", "0"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--mqtt-client-key-file"), "{err}");
    Ok(())
}
