//! Start the real `scheduler` binary against a test apiserver, and build Nodes and Pods
//! for scheduler tests.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::{free_port, ApiServer};

/// `scheduler` (from [`crate::workspace_bins`]); `MINIK8S_SCHEDULER_BIN` overrides it.
pub fn scheduler_bin() -> PathBuf {
    crate::workspace_bin("scheduler", "MINIK8S_SCHEDULER_BIN")
}

/// A running scheduler process; killed on drop.
pub struct Scheduler {
    child: Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Scheduler {
    /// Start with `--leader-elect=false` plus `args`.
    pub fn start(api: &ApiServer, args: &[&str]) -> Result<Self> {
        let port = free_port();
        let log = api.data_dir.join(format!("scheduler-{port}.log"));
        let f = std::fs::File::create(&log)?;
        let child = Command::new(scheduler_bin())
            .args(api.connect_args("scheduler.conf"))
            .arg("--bind-address")
            .arg("127.0.0.1")
            .arg("--secure-port")
            .arg(port.to_string())
            .arg("--log-level")
            .arg("info,scheduler=debug")
            .args(if args.iter().any(|a| a.starts_with("--leader-elect")) {
                &[][..]
            } else {
                &["--leader-elect=false"][..]
            })
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .context("spawning scheduler")?;
        Ok(Scheduler { child, port, log })
    }
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Node with allocatable `cpu`, `memory`, 110 pods, `labels` (plus kubernetes.io/hostname),
/// `taints`, and extra allocatable resources.
pub fn node(name: &str, cpu: &str, memory: &str, labels: Value, taints: Value, extra: Value) -> Value {
    let mut labels = labels;
    labels["kubernetes.io/hostname"] = json!(name);
    let mut alloc = json!({"cpu": cpu, "memory": memory, "pods": "110"});
    if let Some(m) = extra.as_object() {
        for (k, v) in m {
            alloc[k] = v.clone();
        }
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {"capacity": alloc.clone(), "allocatable": alloc,
                   "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// A pod with one container requesting `cpu`/`memory`, and `spec` merged in.
pub fn pod(name: &str, labels: Value, cpu: &str, memory: &str, spec: Value) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "busybox",
            "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
    });
    if let Some(m) = spec.as_object() {
        for (k, v) in m {
            p["spec"][k] = v.clone();
        }
    }
    p
}
