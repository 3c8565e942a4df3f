//! The cloud-controller-manager for the tests: built once per test process, started
//! (optionally inside a network namespace, as the kubeproxy lab's node) with a log file,
//! its `/metrics` read back, killed like a crash or on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, Result};

/// `cloud-controller-manager`, built once per test process (`MINIK8S_CCM_BIN` overrides).
pub fn ccm_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| crate::workspace_bin("cloud-controller-manager", "MINIK8S_CCM_BIN")).clone()
}

/// A running cloud-controller-manager.
pub struct CloudControllerManager {
    child: Option<Child>,
    netns: Option<String>,
    /// Its /healthz and /metrics port (on 127.0.0.1 of its namespace).
    pub port: u16,
    pub log: PathBuf,
}

impl CloudControllerManager {
    /// Start it with `args` (plus `--secure-port`, `--bind-address 127.0.0.1` and no leader
    /// election), inside `netns` if given, appending to `log`.
    pub fn start(netns: Option<&str>, port: u16, log: &Path, args: &[&str]) -> Result<Self> {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(ccm_bin());
                c
            }
            None => Command::new(ccm_bin()),
        };
        let child = cmd
            .args(["--secure-port", &port.to_string(), "--bind-address", "127.0.0.1", "--leader-elect=false"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .context("starting cloud-controller-manager")?;
        Ok(Self { child: Some(child), netns: netns.map(String::from), port, log: log.to_path_buf() })
    }

    /// CPU seconds (user + system) it has used so far (started outside a namespace: with
    /// `ip netns exec` this is `ip`'s pid until it execs).
    pub fn cpu_seconds(&self) -> Option<f64> {
        crate::cpu_seconds(self.child.as_ref()?.id())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kill it (SIGKILL, like a crash).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Its /metrics page.
    pub fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.port);
        let out = match &self.netns {
            Some(ns) => Command::new("ip").args(["netns", "exec", ns, "curl", "-s", "--max-time", "5", &url]).output(),
            None => Command::new("curl").args(["-s", "--max-time", "5", &url]).output(),
        };
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    }

    /// The sum of a metric's samples whose labels contain every one of `labels`.
    pub fn metric_sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter(|l| labels.iter().all(|x| l.contains(x)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for CloudControllerManager {
    fn drop(&mut self) {
        self.kill();
    }
}
