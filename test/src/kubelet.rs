//! Helpers for the kubelet's end-to-end tests: build and start the real `kubelet` binary
//! against a test apiserver on the real Docker engine, each with a unique node name and
//! podCIDR, and remove everything it created (containers, bridge, files) on drop, also
//! when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Docker client binary (Debian's docker.io).
pub fn docker_bin() -> &'static str {
    if Path::new("/usr/bin/docker").exists() {
        "/usr/bin/docker"
    } else {
        "docker"
    }
}

/// Whether the Docker engine answers; under `CI=true` a missing engine is a failure, and
/// the local images (scripts/images) are built once per test process.
pub fn require_docker() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok = *OK.get_or_init(|| {
        let up = Command::new(docker_bin())
            .arg("info")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !up {
            return false;
        }
        let st = Command::new("bash")
            .arg(workspace().join("scripts/images"))
            .status()
            .unwrap_or_else(|e| panic!("cannot run scripts/images: {e}"));
        assert!(st.success(), "scripts/images failed");
        true
    });
    if !ok {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI=true but the Docker engine is not reachable (start dockerd): the kubelet tests need it");
        }
        eprintln!("SKIPPED: no Docker engine (set CI=true to make this a failure)");
    }
    ok
}

/// `kubelet` (from [`crate::workspace_bins`]); `MINIK8S_KUBELET_BIN` overrides it.
pub fn kubelet_bin() -> PathBuf {
    crate::workspace_bin("kubelet", "MINIK8S_KUBELET_BIN")
}

/// The kubelet's bridge name for a node (same hash as kubelet/src/network.rs).
pub fn bridge_name(node: &str) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in node.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    format!("mk8s{h:08x}")
}

/// The kubelet's egress masquerade chain for a node (same hash as kubelet/src/network.rs).
pub fn masq_chain(node: &str) -> String {
    format!("MK8S-MASQ-{}", &bridge_name(node)[4..].to_uppercase())
}

/// Remove a node's nat chains (egress masquerade `MK8S-MASQ-*`, host ports
/// `MK8S-HOSTPORTS-*` and `MK8S-HP-MASQ-*`) and the built-in chains' rules jumping to them.
pub fn remove_node_rules(node: &str) {
    let hash = &masq_chain(node)["MK8S-MASQ-".len()..];
    for chain in [format!("MK8S-MASQ-{hash}"), format!("MK8S-HOSTPORTS-{hash}"), format!("MK8S-HP-MASQ-{hash}")] {
        for builtin in ["PREROUTING", "OUTPUT", "POSTROUTING"] {
            let listing = Command::new("iptables").args(["-w", "-t", "nat", "-S", builtin]).output();
            let listing = listing.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
            let prefix = format!("-A {builtin} ");
            for l in listing.lines().filter(|l| l.ends_with(&format!("-j {chain}"))) {
                if let Some(rest) = l.strip_prefix(&prefix) {
                    let _ = Command::new("iptables")
                        .args(["-w", "-t", "nat", "-D", builtin])
                        .args(rest.split_whitespace())
                        .stderr(Stdio::null())
                        .status();
                }
            }
        }
        for op in ["-F", "-X"] {
            let _ = Command::new("iptables").args(["-w", "-t", "nat", op, &chain]).stderr(Stdio::null()).status();
        }
    }
}

/// A /24 in 10.245.0.0/16 that no route of this host uses yet.
fn free_pod_cidr() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let routes = Command::new("ip")
        .args(["-4", "route"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let seed = std::process::id();
    for _ in 0..250 {
        let x = (seed.wrapping_mul(31).wrapping_add(N.fetch_add(1, Ordering::SeqCst))) % 250 + 1;
        let prefix = format!("10.245.{x}.");
        if !routes.contains(&prefix) {
            return format!("10.245.{x}.0/24");
        }
    }
    panic!("no free /24 in 10.245.0.0/16");
}

/// Remove every container labelled with `node`.
pub fn remove_node_containers(node: &str) {
    let out =
        Command::new(docker_bin()).args(["ps", "-aq", "--filter", &format!("label=minik8s.io/node={node}")]).output();
    if let Ok(out) = out {
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect();
        if !ids.is_empty() {
            let _ = Command::new(docker_bin())
                .args(["rm", "-f", "-v"])
                .args(&ids)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Containers of `node` as (id, name, state), from the Docker CLI.
pub fn node_containers(node: &str) -> Vec<(String, String, String)> {
    let out = Command::new(docker_bin())
        .args([
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            &format!("label=minik8s.io/node={node}"),
            "--format",
            "{{.ID}} {{.Names}} {{.State}}",
        ])
        .output();
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let mut p = l.split_whitespace();
                Some((p.next()?.to_string(), p.next()?.to_string(), p.next()?.to_string()))
            })
            .collect()
    })
    .unwrap_or_default()
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// An apiserver with one kubelet on Docker: the set-up of the node-level suites. The kubelet
/// (and its pods' containers) goes first when it drops.
pub struct Node {
    pub kubelet: Kubelet,
    pub client: kube::Client,
    pub api: crate::ApiServer,
}

impl Node {
    /// `None` when Docker is missing outside CI (`require_docker`; under `CI=true` that fails).
    /// `prefix` names the node, so suites running at once do not share one.
    pub fn start(prefix: &str) -> Result<Option<Node>> {
        if !require_docker() {
            return Ok(None);
        }
        let api = crate::ApiServer::start()?;
        let kubelet = Kubelet::start(&api.url(), prefix)?;
        let client = api.client()?;
        Ok(Some(Node { kubelet, client, api }))
    }
}

/// A small whole cluster on Docker: the apiserver, the scheduler, the controller-manager and
/// kubelets (`nodes[0]` first). Fields drop in order: the kubelets (removing their
/// containers) first, the apiserver last.
pub struct Cluster {
    pub nodes: Vec<Kubelet>,
    pub cm: crate::controller_manager::ControllerManager,
    pub sched: crate::scheduler::Scheduler,
    pub api: crate::ApiServer,
}

impl Cluster {
    /// `None` when Docker is missing outside CI (`require_docker`). Nodes are named
    /// `<prefix>-<pid>-<n>`.
    pub fn start(prefix: &str, nodes: usize) -> Result<Option<Cluster>> {
        Self::start_with(prefix, nodes, &[])
    }

    /// [`Cluster::start`] with extra controller-manager flags (a `--local-path-dir` of the
    /// test's own, so provisioned volumes stay out of the host's default directory).
    pub fn start_with(prefix: &str, nodes: usize, cm_args: &[&str]) -> Result<Option<Cluster>> {
        if !require_docker() {
            return Ok(None);
        }
        let api = crate::ApiServer::start()?;
        let sched = crate::scheduler::Scheduler::start(&api, &[])?;
        let cm = crate::controller_manager::ControllerManager::start(&api, cm_args)?;
        let nodes = (0..nodes).map(|_| Kubelet::start(&api.url(), prefix)).collect::<Result<Vec<_>>>()?;
        Ok(Some(Cluster { nodes, cm, sched, api }))
    }

    /// Start one more kubelet.
    pub fn add_node(&mut self, prefix: &str) -> Result<&Kubelet> {
        self.nodes.push(Kubelet::start(&self.api.url(), prefix)?);
        Ok(&self.nodes[self.nodes.len() - 1])
    }

    /// The last lines of every kubelet's log, for a failure message.
    pub fn log_tail(&self) -> String {
        self.nodes
            .iter()
            .map(|k| {
                let log = k.log();
                let lines: Vec<&str> = log.lines().collect();
                format!("--- kubelet {} ---\n{}", k.node, lines[lines.len().saturating_sub(20)..].join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A running kubelet process for one node; on drop it is killed and its node's containers,
/// bridge and files are removed.
pub struct Kubelet {
    pub node: String,
    pub pod_cidr: String,
    /// The HTTPS API port (`--port`).
    pub port: u16,
    /// The plain-HTTP `/healthz` port (`--healthz-port`).
    pub healthz_port: u16,
    pub server: String,
    /// More flags (`--kubeconfig` of the node's identity).
    extra: Vec<String>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Kubelet {
    /// Start a kubelet with a unique node name (`<prefix>-<pid>-<n>`) against `server`.
    pub fn start(server: &str, prefix: &str) -> Result<Kubelet> {
        Self::start_named(server, &Self::node_name(prefix), &[])
    }

    /// A unique node name (`<prefix>-<pid>-<n>`), to start a kubelet under with
    /// [`Kubelet::start_named`].
    pub fn node_name(prefix: &str) -> String {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        format!("{prefix}-{}-{n}", std::process::id())
    }

    /// Start a kubelet as node `node` against `server`, with more flags (`--kubeconfig`).
    pub fn start_named(server: &str, node: &str, extra: &[String]) -> Result<Kubelet> {
        let mut k = Kubelet {
            node: node.to_string(),
            pod_cidr: free_pod_cidr(),
            port: crate::free_port(),
            healthz_port: crate::free_port(),
            server: server.to_string(),
            extra: extra.to_vec(),
            dir: tempfile::tempdir()?,
            child: None,
        };
        remove_node_containers(&k.node);
        k.spawn()?;
        Ok(k)
    }

    pub fn root_dir(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// Where device plugins register with this kubelet (its `--device-plugin-path`).
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.dir.path().join("device-plugins")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("kubelet.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path())?;
        let child = Command::new(kubelet_bin())
            .args(["--server", &self.server, "--hostname-override", &self.node, "--node-ip", "127.0.0.1"])
            .args(["--pod-cidr", &self.pod_cidr, "--port", &self.port.to_string(), "--address", "127.0.0.1"])
            .args(["--healthz-port", &self.healthz_port.to_string()])
            .arg("--root-dir")
            .arg(self.root_dir())
            .arg("--device-plugin-path")
            .arg(self.device_plugin_dir())
            .args(["--log-level", "info,kubelet=debug"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning kubelet")?;
        self.child = Some(child);
        // A bound, not a speed requirement: before its first log line the kubelet waits on
        // Docker (version negotiation), which can take long while Docker removes many
        // containers of earlier tests.
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut() {
                if let Some(st) = c.try_wait()? {
                    bail!("kubelet exited early ({st}); log:\n{}", self.log());
                }
            }
            if crate::raw(self.healthz_port, "GET", "/healthz", None, b"").map(|r| r.status == 200).unwrap_or(false) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("kubelet not healthy in 90s; log:\n{}", self.log())
    }

    /// SIGKILL the process (its pods keep running in Docker).
    /// The kubelet process's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    pub fn alive(&mut self) -> bool {
        self.child.as_mut().map(|c| matches!(c.try_wait(), Ok(None))).unwrap_or(false)
    }

    /// GET a path of the kubelet's HTTPS server without credentials (anonymous): (status, body).
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        self.get_with(path, &[])
    }

    /// GET a path of the kubelet's HTTPS server with more `curl` arguments (a client
    /// certificate, an `Authorization` header): (status, body). The kubelet's certificate is
    /// its own, self-signed: not verified.
    pub fn get_with(&self, path: &str, curl_args: &[&str]) -> Result<(u16, String)> {
        https_get(&format!("https://127.0.0.1:{}{path}", self.port), curl_args)
    }
}

/// GET `url` with `curl -k` and more arguments: (status, body).
pub fn https_get(url: &str, curl_args: &[&str]) -> Result<(u16, String)> {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "60", "-w", "\n%{http_code}"])
        .args(curl_args)
        .arg(url)
        .output()
        .context("running curl")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let code: u16 = code
        .trim()
        .parse()
        .with_context(|| format!("curl {url}: no status ({}): {}", out.status, String::from_utf8_lossy(&out.stderr)))?;
    anyhow::ensure!(code != 0, "curl {url} failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok((code, body.to_string()))
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.kill();
        remove_node_containers(&self.node);
        let _ = Command::new("ip").args(["link", "del", &bridge_name(&self.node)]).stderr(Stdio::null()).status();
        remove_node_rules(&self.node);
    }
}

/// Build `tag`, busybox plus host programs (with the shared libraries `ldd` names, at their
/// own paths): an image with a real client for tests, as nothing can be pulled. Idempotent.
pub fn host_programs_image(tag: &str, programs: &[&str]) -> Result<()> {
    let ctx = tempfile::tempdir()?;
    let root = ctx.path().join("root");
    let mut files: Vec<PathBuf> = Vec::new();
    for p in programs {
        files.push(PathBuf::from(p));
        let out = Command::new("ldd").arg(p).output().context("running ldd")?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
            let path = line.split("=>").last().unwrap_or_default().split_whitespace().next().unwrap_or_default();
            if path.starts_with('/') {
                files.push(PathBuf::from(path));
            }
        }
    }
    for f in &files {
        let dest = root.join(f.strip_prefix("/").unwrap_or(f));
        std::fs::create_dir_all(dest.parent().unwrap_or(&root))?;
        // Follow links: the image gets the library itself under the name asked for.
        std::fs::copy(f, &dest).with_context(|| format!("copying {}", f.display()))?;
    }
    std::fs::write(ctx.path().join("Dockerfile"), "FROM busybox:latest\nCOPY root/ /\n")?;
    let out = Command::new(docker_bin())
        .args(["build", "-q", "-t", tag])
        .arg(ctx.path())
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .context("running docker build")?;
    anyhow::ensure!(out.status.success(), "docker build {tag}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}
