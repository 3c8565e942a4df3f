//! Helpers for the controller-manager end-to-end tests: build and start the real
//! `controller-manager` binary against a test apiserver, and a fake node agent that
//! plays the kubelet's part (marks pods Running and Ready, or Succeeded for Job pods,
//! by patching `pods/status`) since the kubelet is not what those tests are about.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;

use crate::{free_port, ApiServer};

/// `controller-manager` (from [`crate::workspace_bins`]); `MINIK8S_CONTROLLER_MANAGER_BIN`
/// overrides it.
pub fn controller_manager_bin() -> PathBuf {
    crate::workspace_bin("controller-manager", "MINIK8S_CONTROLLER_MANAGER_BIN")
}

/// A running controller-manager; killed on drop.
pub struct ControllerManager {
    child: Option<Child>,
    pub port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl ControllerManager {
    /// Start against `api` with extra flags (default: no leader election).
    pub fn start(api: &ApiServer, args: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("controller-manager.log");
        let f = std::fs::File::create(&log)?;
        let port = free_port();
        let mut cmd = Command::new(controller_manager_bin());
        cmd.args(api.connect_args("controller-manager.conf"))
            .arg("--secure-port")
            .arg(port.to_string())
            .arg("--bind-address")
            .arg("127.0.0.1");
        if api.tls.is_some() {
            // The CA pods trust the apiserver by (the kube-root-ca.crt ConfigMaps).
            cmd.arg("--root-ca-file").arg(api.identity("ca.crt"));
        }
        if !args.iter().any(|a| a.starts_with("--leader-elect")) {
            cmd.arg("--leader-elect=false");
        }
        cmd.args(args).env("RUST_LOG", "info").stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f);
        let child = cmd.spawn().context("spawning controller-manager")?;
        Ok(ControllerManager { child: Some(child), port, log, _dir: dir })
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// CPU seconds (user + system) the process has used so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        crate::cpu_seconds(self.pid()?)
    }

    /// Is the process still running?
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ControllerManager {
    fn drop(&mut self) {
        self.stop();
        // Shown only when the test fails (the harness captures it otherwise).
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        eprintln!(
            "--- controller-manager log (last 60 lines) ---\n{}",
            lines[lines.len().saturating_sub(60)..].join("\n")
        );
    }
}

/// A stand-in for kubelets: every new pod is marked Running and Ready (with a pod IP),
/// or Succeeded when it belongs to a Job; pods being deleted are removed at once.
/// Set `ready` false to leave new pods Pending.
pub struct FakeNodeAgent {
    pub ready: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeNodeAgent {
    pub fn start(client: kube::Client) -> Self {
        let ready = Arc::new(AtomicBool::new(true));
        let r = ready.clone();
        let task = tokio::spawn(async move {
            let all: Api<Pod> = Api::all(client.clone());
            let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::<String>::new()));
            let counter = Arc::new(std::sync::atomic::AtomicU32::new(2));
            watcher(all, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .for_each_concurrent(64, |pod| {
                    let client = client.clone();
                    let r = r.clone();
                    let seen = seen.clone();
                    let counter = counter.clone();
                    async move {
                        let Ok(pod) = pod else { return };
                        let ns = pod.metadata.namespace.clone().unwrap_or_default();
                        let name = pod.metadata.name.clone().unwrap_or_default();
                        let uid = pod.metadata.uid.clone().unwrap_or_default();
                        let api: Api<Pod> = Api::namespaced(client, &ns);
                        if pod.metadata.deletion_timestamp.is_some() {
                            let _ = api.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
                            return;
                        }
                        let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                        if phase != "Pending" && !phase.is_empty() || !r.load(Ordering::SeqCst) {
                            return;
                        }
                        if !seen.lock().map(|mut s| s.insert(uid)).unwrap_or(false) {
                            return;
                        }
                        let is_job = pod.metadata.labels.as_ref().is_some_and(|l| l.contains_key("batch.kubernetes.io/job-name") || l.contains_key("job-name"));
                        let n = counter.fetch_add(1, Ordering::SeqCst);
                        let ip = format!("10.244.{}.{}", n / 250, n % 250 + 2);
                        let now = k8s_openapi::jiff::Timestamp::now().to_string();
                        let status = if is_job {
                            json!({"status": {"phase": "Succeeded", "podIP": ip, "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now, "reason": "PodCompleted"}]}})
                        } else {
                            json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now,
                                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now},
                                               {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}]}})
                        };
                        let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
                    }
                })
                .await;
        });
        FakeNodeAgent { ready, task }
    }
}

impl Drop for FakeNodeAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The usual set-up of a controller test: an apiserver, a namespace, the controller-manager
/// with default flags and a fake node agent. Fields drop agent first, apiserver last.
pub struct Fixture {
    pub agent: FakeNodeAgent,
    pub cm: ControllerManager,
    pub client: kube::Client,
    pub api: ApiServer,
    ns: String,
}

impl Fixture {
    pub async fn start(ns: &str) -> Result<Self> {
        let api = ApiServer::start()?;
        let client = api.client()?;
        namespace(&client, ns).await?;
        let cm = ControllerManager::start(&api, &[])?;
        let agent = FakeNodeAgent::start(client.clone());
        Ok(Fixture { agent, cm, client, api, ns: ns.to_string() })
    }

    /// An `Api` for a namespaced kind in the fixture's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}

/// Set a pod's Ready condition.
pub async fn set_pod_ready(client: &kube::Client, ns: &str, name: &str, ready: bool) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let s = if ready { "True" } else { "False" };
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": s, "lastTransitionTime": now},
                                                 {"type": "ContainersReady", "status": s, "lastTransitionTime": now}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Create a namespace.
pub async fn namespace(client: &kube::Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    api.create(&PostParams::default(), &ns).await?;
    Ok(())
}

/// A one-container Deployment labelled `app=<name>`.
pub fn deployment(name: &str, replicas: i32, image: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": image}]}}
        }
    }))?)
}

/// Run the official kubectl against `api`; its stdout, or an error with its output.
pub async fn kubectl_ok(api: &ApiServer, args: &[&str]) -> Result<String> {
    let out = api.kubectl(args)?;
    anyhow::ensure!(out.ok, "kubectl {args:?} failed: {}\n{}", out.stderr, out.stdout);
    Ok(out.stdout)
}
