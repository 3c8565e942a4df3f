//! A network lab for the kubeproxy tests, so the host's own rules are never touched:
//! - a "node" network namespace with a veth `eth0` (the node IP) and a default route,
//!   joined to the host by a veth pair (the node reaches the apiserver over it);
//! - "pod" namespaces routed from the node over point-to-point veths (no bridge), each
//!   running `busybox httpd` that answers with the pod's name (on `/`, `/web`, `/other`);
//! - `kubeproxy` started inside the node namespace with `ip netns exec`.
//!
//! Everything is removed on drop (deleting a namespace deletes its veths and rules).

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context, Result};

/// `kubeproxy` (from [`crate::workspace_bins`]); `MINIK8S_KUBEPROXY_BIN` overrides it.
pub fn kubeproxy_bin() -> PathBuf {
    crate::workspace_bin("kubeproxy", "MINIK8S_KUBEPROXY_BIN")
}

/// Whether the prerequisites are here. Under `CI=true` a missing one fails the test;
/// otherwise the test is skipped with a message. Returns false to skip.
pub fn prerequisites(programs: &[&str]) -> bool {
    let missing: Vec<&str> = programs
        .iter()
        .copied()
        .filter(|p| {
            Command::new("sh")
                .args(["-c", &format!("command -v {p}")])
                .output()
                .map(|o| !o.status.success())
                .unwrap_or(true)
        })
        .collect();
    let root = unsafe_is_root();
    if missing.is_empty() && root {
        return true;
    }
    let msg = format!("kubeproxy e2e prerequisites missing: programs {missing:?}, root={root}");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{msg}");
    }
    eprintln!("SKIP: {msg}");
    false
}

fn unsafe_is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

/// Run a command; fail with its output.
pub fn sh(cmd: &str) -> Result<String> {
    let out = Command::new("sh").args(["-c", cmd]).output().with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!(
            "`{cmd}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Run a command, returning its raw output whatever the exit status.
pub fn sh_output(cmd: &str) -> Output {
    Command::new("sh").args(["-c", cmd]).output().unwrap_or_else(|e| panic!("running {cmd}: {e}"))
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One lab: a node namespace and its pods.
pub struct Lab {
    pub id: u32,
    pub node_ns: String,
    /// The node's address (on its eth0).
    pub node_ip: String,
    /// The host side of the host↔node veth (what the node uses to reach the apiserver).
    pub host_ip: String,
    /// The node side of that veth (reachable from the host).
    pub uplink_ip: String,
    pub pods: Vec<Pod>,
    pub dir: tempfile::TempDir,
    kubeproxy: Option<Child>,
}

/// A "pod": a namespace with an address and an HTTP server answering its name.
pub struct Pod {
    pub name: String,
    pub ns: String,
    pub ip: String,
    server: Option<Child>,
}

impl Lab {
    /// Create the node namespace and `pods` pods (IPs 10.244.0.11, .12, …, port 8080).
    pub fn new(pods: usize) -> Result<Lab> {
        // Unique per process and test; interface names stay under 15 characters.
        let id = (std::process::id() % 200) * 50 + SEQ.fetch_add(1, Ordering::SeqCst) % 50;
        let (a, b) = (id / 250, id % 250);
        let node_ns = format!("kpnode{id}");
        let host_if = format!("kph{id}");
        let host_ip = format!("100.127.{a}.{}", b + 1);
        let node_side = format!("100.126.{a}.{}", b + 1);
        let _ = sh_output(&format!("ip netns del {node_ns} 2>/dev/null; ip link del {host_if} 2>/dev/null"));
        let dir = tempfile::tempdir()?;
        let mut lab = Lab {
            id,
            node_ns: node_ns.clone(),
            node_ip: "192.168.77.1".into(),
            host_ip: host_ip.clone(),
            uplink_ip: node_side.clone(),
            pods: Vec::new(),
            dir,
            kubeproxy: None,
        };
        sh(&format!(
            "set -e; ip netns add {node_ns}; ip -n {node_ns} link set lo up; \
             ip -n {node_ns} link add eth0 type veth peer name eth0p; ip -n {node_ns} link set eth0p up; ip -n {node_ns} addr add 192.168.77.1/24 dev eth0; \
             ip -n {node_ns} link set eth0 up; ip -n {node_ns} route add default dev eth0; \
             ip link add {host_if} type veth peer name up0 netns {node_ns}; \
             ip addr add {host_ip}/32 dev {host_if}; ip link set {host_if} up; \
             ip -n {node_ns} addr add {node_side}/32 dev up0; ip -n {node_ns} link set up0 up; \
             ip route add {node_side}/32 dev {host_if}; ip -n {node_ns} route add {host_ip}/32 dev up0"
        ))?;
        for i in 0..pods {
            lab.add_pod(i)?;
        }
        Ok(lab)
    }

    fn add_pod(&mut self, i: usize) -> Result<()> {
        let name = format!("pod{i}");
        let ns = format!("kppod{}-{i}", self.id);
        let ip = format!("10.244.0.{}", 11 + i);
        let node = &self.node_ns;
        let host_side = format!("kv{i}");
        let _ = sh_output(&format!("ip netns del {ns} 2>/dev/null"));
        sh(&format!(
            "set -e; ip netns add {ns}; ip -n {ns} link set lo up; \
             ip -n {node} link add {host_side} type veth peer name eth0 netns {ns}; \
             ip -n {node} addr add 10.244.0.1/32 dev {host_side}; ip -n {node} link set {host_side} up; \
             ip -n {node} route add {ip}/32 dev {host_side}; \
             ip -n {ns} addr add {ip}/32 dev eth0; ip -n {ns} link set eth0 up; \
             ip -n {ns} route add 10.244.0.1/32 dev eth0; ip -n {ns} route add default via 10.244.0.1 dev eth0"
        ))?;
        let www = self.dir.path().join(&name);
        std::fs::create_dir_all(&www)?;
        for f in ["index.html", "web", "other"] {
            std::fs::write(www.join(f), format!("{name}\n"))?;
        }
        let server = Command::new("ip")
            .args(["netns", "exec", &ns, "busybox", "httpd", "-f", "-p", "8080", "-h"])
            .arg(&www)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting busybox httpd")?;
        self.pods.push(Pod { name, ns, ip, server: Some(server) });
        Ok(())
    }

    /// Run `cmd` (a shell command line) inside the node namespace.
    pub fn node_sh(&self, cmd: &str) -> Output {
        sh_output(&format!("ip netns exec {} sh -c '{}'", self.node_ns, cmd.replace('\'', "'\\''")))
    }

    /// Run `cmd` inside pod `i`'s namespace.
    pub fn pod_sh(&self, i: usize, cmd: &str) -> Output {
        sh_output(&format!("ip netns exec {} sh -c '{}'", self.pods[i].ns, cmd.replace('\'', "'\\''")))
    }

    /// GET `url` from the node namespace (or pod `from`): Ok(body) or Err(curl exit code).
    pub fn curl(&self, from: Option<usize>, url: &str) -> std::result::Result<String, i32> {
        let cmd = format!("curl -s --max-time 5 {url}");
        let out = match from {
            None => self.node_sh(&cmd),
            Some(i) => self.pod_sh(i, &cmd),
        };
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(out.status.code().unwrap_or(-1))
        }
    }

    /// The path of kubeproxy's log file.
    pub fn kubeproxy_log_path(&self) -> PathBuf {
        self.dir.path().join("kubeproxy.log")
    }

    pub fn kubeproxy_log(&self) -> String {
        std::fs::read_to_string(self.kubeproxy_log_path()).unwrap_or_default()
    }

    /// Start kubeproxy in the node namespace against the apiserver on `api_port` (bound on 0.0.0.0).
    pub fn start_kubeproxy(&mut self, api_port: u16, extra: &[&str]) -> Result<()> {
        self.stop_kubeproxy();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.kubeproxy_log_path())?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.node_ns])
            .arg(kubeproxy_bin())
            .args([
                "--master",
                &format!("http://{}:{api_port}", self.host_ip),
                "--hostname-override",
                "node-a",
                "--cluster-cidr",
                "10.244.0.0/16",
                "--iptables-min-sync-period",
                "0s",
                "--metrics-bind-address",
                "127.0.0.1:10249",
                "--healthz-bind-address",
                "127.0.0.1:10256",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting kubeproxy")?;
        self.kubeproxy = Some(child);
        Ok(())
    }

    /// SIGTERM-less stop (kill), like a crash: rules stay in place.
    pub fn stop_kubeproxy(&mut self) {
        if let Some(mut c) = self.kubeproxy.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether kubeproxy is still running.
    pub fn kubeproxy_running(&mut self) -> bool {
        self.kubeproxy.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Run `kubeproxy --cleanup` in the node namespace.
    pub fn kubeproxy_cleanup(&self) -> Output {
        sh_output(&format!("ip netns exec {} {} --cleanup", self.node_ns, kubeproxy_bin().display()))
    }

    /// GET a path of kubeproxy's metrics/health server.
    pub fn metrics(&self, path: &str) -> String {
        String::from_utf8_lossy(&self.node_sh(&format!("curl -s --max-time 5 http://127.0.0.1:10249{path}")).stdout)
            .into_owned()
    }

    /// A metric's value from /metrics (first sample).
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics("/metrics")
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop_kubeproxy();
        for p in &mut self.pods {
            if let Some(mut s) = p.server.take() {
                let _ = s.kill();
                let _ = s.wait();
            }
            let _ = sh_output(&format!("ip netns del {}", p.ns));
        }
        // Processes started inside (nginx) die with their parent kubeproxy's kill_on_drop;
        // kill anything left in the node namespace by pid, then delete it.
        let _ = sh_output(&format!("ip netns pids {} | xargs -r kill -9", self.node_ns));
        let _ = sh_output(&format!("ip netns del {}", self.node_ns));
        let _ = sh_output(&format!("ip link del kph{}", self.id));
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.node_ns));
        for p in &self.pods {
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", p.ns));
        }
    }
}
