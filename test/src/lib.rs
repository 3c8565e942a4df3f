//! Shared helpers for the end-to-end tests: build and start the real `apiserver` binary on a
//! free port with a temporary data dir, talk to it with the `kube` crate, with raw HTTP, and
//! with the official kubectl.

pub mod bench;
pub mod cloud_controller_manager;
pub mod cluster;
pub mod kubectl;
pub mod linearizability;
pub mod scheduler;
pub mod tenancy;

pub mod controller_manager;

pub mod module_controller;

pub mod kubeproxy;

pub mod kubelet;

pub mod podnet;

pub mod tls;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The workspace's target directory.
pub fn target_dir() -> PathBuf {
    if let Ok(d) = std::env::var("CARGO_TARGET_DIR") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target")
}

/// Build every binary of the workspace once per test process (cargo's lock serializes
/// concurrent builds) and return the directory that holds them (`target/debug`).
///
/// One build, with the whole workspace's features, for every binary a test runs: cargo
/// resolves features per build, so `cargo build -p apiserver` alone compiled kube without
/// the features other members enable (and storage without `test-support`) — a second
/// variant of kube and of everything above it, rebuilt by the first test that asked (~100 s
/// in CI), and again for each other component built alone. `cargo build --workspace` is
/// what a clean checkout's first build runs, so after it this only checks and links.
pub fn workspace_bins() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let status = crate::cargo_command()
            .args(["build", "-q", "--workspace", "--bins"])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .status()
            .unwrap_or_else(|e| panic!("cannot run cargo build --workspace --bins: {e}"));
        assert!(status.success(), "cargo build --workspace --bins failed");
        target_dir().join("debug")
    })
    .clone()
}

/// The workspace binary `bin` (built by [`workspace_bins`]); the environment variable
/// `env_override` names another.
pub fn workspace_bin(bin: &str, env_override: &str) -> PathBuf {
    if let Ok(p) = std::env::var(env_override) {
        return PathBuf::from(p);
    }
    let path = workspace_bins().join(bin);
    assert!(path.exists(), "{} missing after the build", path.display());
    path
}

/// `apiserver`; `MINIK8S_APISERVER_BIN` overrides it.
pub fn apiserver_bin() -> PathBuf {
    workspace_bin("apiserver", "MINIK8S_APISERVER_BIN")
}

/// A `cargo` command for building workspace binaries from inside a test: without the
/// variables cargo sets for the test process ([`strip_test_env`]).
pub fn cargo_command() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    strip_test_env(&mut cmd);
    cmd
}

/// Remove from `cmd`'s environment what cargo sets for a test process (`CARGO_MANIFEST_DIR`,
/// `CARGO_PKG_*` …). A build started with them differs from the outer `cargo test` for
/// build scripts that watch them (ring's watches `CARGO_MANIFEST_DIR`): each such build
/// re-ran them and rebuilt everything above (rustls, kube, the apiserver: ~40 s per test
/// binary), and the next `cargo test` rebuilt it all again.
pub fn strip_test_env(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_for_tests = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
            || matches!(
                name.as_ref(),
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
            );
        if set_for_tests {
            cmd.env_remove(name.as_ref());
        }
    }
}

/// `device-plugin` (the sample and NVIDIA device plugins); `MINIK8S_DEVICE_PLUGIN_BIN`
/// overrides it.
pub fn device_plugin_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("device-plugin", "MINIK8S_DEVICE_PLUGIN_BIN")).clone()
}

/// `minik8s-supervisor` (whose `certs` command makes a cluster's PKI);
/// `MINIK8S_SUPERVISOR_BIN` overrides it.
pub fn supervisor_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("minik8s-supervisor", "MINIK8S_SUPERVISOR_BIN")).clone()
}

/// `minik8s-supervisor certs init --dir DIR --server SERVER --node N…`: a cluster CA, the
/// apiserver's certificate and every identity's kubeconfig (`admin.conf`, `scheduler.conf`,
/// `controller-manager.conf`, `kube-proxy.conf`, `kubelet-<node>.conf`).
pub fn certs_init(dir: &Path, server: &str, nodes: &[&str]) -> Result<()> {
    let mut cmd = Command::new(supervisor_bin());
    cmd.args(["certs", "init", "--dir"]).arg(dir).args(["--server", server]);
    for n in nodes {
        cmd.args(["--node", n]);
    }
    let out = cmd.output().context("running minik8s-supervisor certs init")?;
    if !out.status.success() {
        bail!("certs init failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The secure port of a test apiserver and the PKI it was started with.
#[derive(Clone, Debug)]
pub struct Tls {
    pub secure_port: u16,
    /// `certs init`'s directory: `ca.crt`, the identities' kubeconfigs, ….
    pub pki: PathBuf,
}

/// Exclusive use of the host for a test that runs a cluster with `scripts/cluster` (its
/// kubelets are named `node-N` on the shared Docker engine, its kubeproxy owns the host's
/// Service rules): waits for any other such test, in any test binary. Hold the returned
/// file for the test's duration.
pub fn host_cluster_lock() -> std::fs::File {
    let path = std::env::temp_dir().join("minik8s-host-cluster.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    file.lock().unwrap_or_else(|e| panic!("cannot lock {}: {e}", path.display()));
    file
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

/// A running apiserver process; killed on drop.
pub struct ApiServer {
    pub port: u16,
    pub data_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    _pki: Option<tempfile::TempDir>,
    child: Option<Child>,
    pub extra_args: Vec<String>,
    /// The apiserver's own etcd under `MINIK8S_E2E_BACKEND=etcd` (stopped after it).
    _etcd: Option<storage::etcd_test_server::EtcdServer>,
    /// With [`ApiServer::start_tls`]: the secure port and its PKI.
    pub tls: Option<Tls>,
}

impl ApiServer {
    /// Start on a fresh data dir.
    pub fn start() -> Result<Self> {
        Self::start_with(&[])
    }

    /// Start with extra flags. With `MINIK8S_E2E_BACKEND=etcd` (and no `--etcd-servers`
    /// given), the apiserver gets a fresh etcd of its own instead of the embedded store, so
    /// the same tests run on both backends (scripts/test runs the apiserver suites so).
    pub fn start_with(args: &[&str]) -> Result<Self> {
        let tmp = tempfile::tempdir()?;
        let mut extra_args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut etcd = None;
        if std::env::var("MINIK8S_E2E_BACKEND").as_deref() == Ok("etcd") && !args.contains(&"--etcd-servers") {
            let server = storage::etcd_test_server::EtcdServer::start()
                .context("MINIK8S_E2E_BACKEND=etcd: starting etcd (Debian package etcd-server)")?;
            extra_args.extend(["--etcd-servers".to_string(), server.endpoint()]);
            etcd = Some(server);
        }
        let mut s = ApiServer {
            port: free_port(),
            data_dir: tmp.path().to_path_buf(),
            _tmp: Some(tmp),
            _pki: None,
            child: None,
            extra_args,
            _etcd: etcd,
            tls: None,
        };
        s.spawn()?;
        Ok(s)
    }

    /// Start with a fresh PKI (`certs init`, kubelet identities for `nodes`) on a secure
    /// port with the client CA and the PKI's ServiceAccount key, plus `args`. The plain-HTTP port stays (readiness; it
    /// authenticates like the secure one, without client certificates).
    pub fn start_tls(nodes: &[&str], args: &[&str]) -> Result<Self> {
        let secure_port = free_port();
        let pki_tmp = tempfile::tempdir()?;
        let pki = pki_tmp.path().join("pki");
        certs_init(&pki, &format!("https://127.0.0.1:{secure_port}"), nodes)?;
        let mut all: Vec<String> = vec!["--secure-port".into(), secure_port.to_string()];
        for (flag, file) in [
            ("--tls-cert-file", "apiserver.crt"),
            ("--tls-private-key-file", "apiserver.key"),
            ("--client-ca-file", "ca.crt"),
            ("--service-account-signing-key-file", "sa.key"),
            ("--service-account-key-file", "sa.pub"),
            ("--kubelet-client-certificate", "apiserver-kubelet-client.crt"),
            ("--kubelet-client-key", "apiserver-kubelet-client.key"),
        ] {
            all.extend([flag.to_string(), pki.join(file).display().to_string()]);
        }
        all.extend(args.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let mut s = Self::start_with(&refs)?;
        s.tls = Some(Tls { secure_port, pki });
        s._pki = Some(pki_tmp);
        Ok(s)
    }

    /// The secure URL (`https://127.0.0.1:<secure port>`); panics without TLS.
    pub fn https_url(&self) -> String {
        let tls = self.tls.as_ref().expect("an apiserver started with start_tls");
        format!("https://127.0.0.1:{}", tls.secure_port)
    }

    /// The kubeconfig of one identity of the PKI (`admin.conf`, `scheduler.conf`,
    /// `kubelet-<node>.conf`, …); panics without TLS.
    pub fn identity(&self, kubeconfig: &str) -> PathBuf {
        self.tls.as_ref().expect("an apiserver started with start_tls").pki.join(kubeconfig)
    }

    /// The flags that point a component at this server: `--master URL` for plain HTTP;
    /// the secure URL and the identity's kubeconfig with TLS.
    pub fn connect_args(&self, kubeconfig: &str) -> Vec<String> {
        match &self.tls {
            None => vec!["--master".into(), self.url()],
            Some(_) => vec![
                "--master".into(),
                self.https_url(),
                "--kubeconfig".into(),
                self.identity(kubeconfig).display().to_string(),
            ],
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.data_dir.join("apiserver.log"))?;
        let mut cmd = Command::new(apiserver_bin());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--log-level")
            .arg("info")
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Ok(etcd) = std::env::var("MINIK8S_E2E_ETCD") {
            cmd.arg("--etcd-servers").arg(etcd);
        }
        self.child = Some(cmd.spawn().context("spawning apiserver")?);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!("apiserver exited early ({status}); log:\n{}", self.log());
                }
            }
            if let Ok(r) = raw(self.port, "GET", "/readyz", None, b"") {
                // 401: serving, with anonymous requests off (it listens once bootstrapped).
                if r.status == 200 || r.status == 401 {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("apiserver not ready in 30s; log:\n{}", self.log())
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("apiserver.log")).unwrap_or_default()
    }

    /// Stop the process (SIGKILL) and keep the data dir.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop the process as a service manager does (SIGTERM, then wait for it to exit, at
    /// most 10 s before SIGKILL) and keep the data dir.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop and start again on the same port and data.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn()
    }

    pub fn client(&self) -> Result<kube::Client> {
        let config = kube::Config::new(self.url().parse()?);
        Ok(kube::Client::try_from(config)?)
    }

    /// A kubeconfig file for this server (no credentials), for clients that read one.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        let kc = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: minik8s, cluster: {{server: \"{}\"}}}}]\n\
             contexts: [{{name: minik8s, context: {{cluster: minik8s, user: user}}}}]\n\
             users: [{{name: user, user: {{}}}}]\ncurrent-context: minik8s\n",
            self.url()
        );
        std::fs::write(path, kc).with_context(|| format!("writing {}", path.display()))
    }

    /// Run the official kubectl against this server. Returns (exit ok, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> Result<KubectlOutput> {
        self.kubectl_bin(&kubectl_bin(), args)
    }

    /// Run a given kubectl binary against this server, with its own discovery/HTTP cache
    /// (a port reused by a later server must not see this one's cached OpenAPI).
    pub fn kubectl_bin(&self, bin: &Path, args: &[&str]) -> Result<KubectlOutput> {
        let out = Command::new(bin)
            .arg("--server")
            .arg(self.url())
            .arg("--cache-dir")
            .arg(self.data_dir.join("kubectl-cache"))
            .args(args)
            .env("KUBECONFIG", "/dev/null")
            .output()
            .context("running kubectl")?;
        Ok(out.into())
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug)]
pub struct KubectlOutput {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for KubectlOutput {
    fn from(out: std::process::Output) -> Self {
        KubectlOutput {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The official kubectl with `--kubeconfig kubeconfig` and `stdin` as its input: whether it
/// succeeded, and its stdout followed by its stderr (the cluster-script suites' kubectl).
pub fn kubectl_at(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(kubectl_bin())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run kubectl: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.unwrap_or_default().as_bytes()).expect("kubectl stdin");
    drop(input);
    let out = child.wait_with_output().expect("kubectl output");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// For benchmarks: build the release apiserver and have [`ApiServer`] start it (they
/// measure what users run), unless `BENCH_APISERVER_BIN` names another build (e.g. an
/// older one, for before/after figures).
pub fn use_release_apiserver() {
    if let Ok(bin) = std::env::var("BENCH_APISERVER_BIN") {
        std::env::set_var("MINIK8S_APISERVER_BIN", bin);
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = crate::cargo_command()
        .args(["build", "-q", "--release", "-p", "apiserver"])
        .current_dir(&root)
        .status()
        .expect("cargo build --release -p apiserver");
    assert!(status.success(), "building the release apiserver failed");
    std::env::set_var("MINIK8S_APISERVER_BIN", target_dir().join("release/apiserver"));
}

/// The official kubectl: `MINIK8S_KUBECTL`, else /usr/bin/kubectl (google-cloud-cli).
pub fn kubectl_bin() -> PathBuf {
    std::env::var("MINIK8S_KUBECTL").map(PathBuf::from).unwrap_or_else(|_| PathBuf::from("/usr/bin/kubectl"))
}

/// An official kubectl release shipped with google-cloud-cli (`1.27` … `1.33`).
pub fn official_kubectl(version: &str) -> PathBuf {
    PathBuf::from(format!("/usr/lib/google-cloud-sdk/bin/kubectl.{version}"))
}

/// The official kubectl releases the compatibility tests run: those present, or all of them
/// (a missing one fails) under `CI=true`.
pub fn official_kubectls(versions: &[&str]) -> Vec<(String, PathBuf)> {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let mut out = Vec::new();
    for v in versions {
        let p = official_kubectl(v);
        if p.exists() {
            out.push((v.to_string(), p));
        } else if ci {
            panic!("kubectl {v} ({}) is missing", p.display());
        } else {
            eprintln!("skipping kubectl {v}: {} is missing", p.display());
        }
    }
    out
}

/// Debian's kubectl 1.20 (package `kubernetes-client`), unpacked by scripts/test into
/// `${XDG_CACHE_HOME:-~/.cache}/minik8s/kubectl-1.20` (`MINIK8S_KUBECTL_120` overrides).
/// `None` when missing; under `CI=true` that is a failure.
pub fn debian_kubectl() -> Option<PathBuf> {
    let path = match std::env::var("MINIK8S_KUBECTL_120") {
        Ok(p) => PathBuf::from(p),
        Err(_) => {
            let cache = std::env::var("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|_| {
                PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache")
            });
            cache.join("minik8s/kubectl-1.20/usr/bin/kubectl")
        }
    };
    if path.exists() {
        return Some(path);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("Debian's kubectl 1.20 ({}) is missing: run scripts/test, which unpacks it", path.display());
    }
    None
}

/// `${XDG_CACHE_HOME:-~/.cache}/minik8s`, where scripts/test keeps what it fetches.
pub fn cache_dir() -> PathBuf {
    let cache = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache"));
    cache.join("minik8s")
}

/// Whether `program args…` (run in `dir`) succeeds: how a client library's installation is
/// probed. When it does not, the test is skipped with `missing` said, or under `CI=true` fails.
fn client_library_found(program: &Path, args: &[&str], dir: Option<&Path>, missing: &str) -> bool {
    let mut cmd = Command::new(program);
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    if cmd.status().is_ok_and(|s| s.success()) {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{missing} is missing: run scripts/test, which installs it");
    }
    eprintln!("skipping: {missing} is missing (scripts/test installs it)");
    false
}

/// A Python interpreter with the third-party client libraries the tests drive (the
/// `kubernetes` client, the kopf operator framework; `test/requirements.txt`), from the
/// virtual environment scripts/test makes (`MINIK8S_PYTHON` overrides). `None` when
/// missing; under `CI=true` that is a failure.
pub fn python_clients() -> Option<PathBuf> {
    let path =
        std::env::var("MINIK8S_PYTHON").map(PathBuf::from).unwrap_or_else(|_| cache_dir().join("venv/bin/python"));
    let missing = format!("{} with kopf and kubernetes", path.display());
    client_library_found(&path, &["-c", "import kopf, kubernetes"], None, &missing).then_some(path)
}

/// The directory where scripts/test installed the JavaScript client the tests drive
/// (`@kubernetes/client-node`, `test/clients/package.json`), with `node_modules` in it: a
/// script copied there imports it. `None` when missing; under `CI=true` that is a failure.
pub fn node_clients() -> Option<PathBuf> {
    let dir = cache_dir().join("node-clients");
    let missing = format!("node with @kubernetes/client-node in {}", dir.display());
    let probe = ["-e", "import('@kubernetes/client-node')"];
    client_library_found(Path::new("node"), &probe, Some(&dir), &missing).then_some(dir)
}

/// What the browser tests drive: the directory of [`node_clients`] (with `playwright-core`
/// in its `node_modules`) and Debian's Chromium (`MINIK8S_CHROMIUM` overrides
/// `/usr/bin/chromium`). `None` when either is missing; under `CI=true` that is a failure.
pub fn browser() -> Option<(PathBuf, PathBuf)> {
    let dir = node_clients()?;
    let missing = format!("node with playwright-core in {}", dir.display());
    if !client_library_found(Path::new("node"), &["-e", "import('playwright-core')"], Some(&dir), &missing) {
        return None;
    }
    let chromium = std::env::var("MINIK8S_CHROMIUM").map(PathBuf::from).unwrap_or_else(|_| "/usr/bin/chromium".into());
    let missing = format!("{} (Debian's chromium)", chromium.display());
    client_library_found(&chromium, &["--version"], None, &missing).then_some((dir, chromium))
}

/// The test manifests (`test/manifests/`; `MINIK8S_MANIFESTS` overrides).
pub fn manifests_dir() -> PathBuf {
    std::env::var("MINIK8S_MANIFESTS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests"))
}

/// A raw HTTP response.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    /// Newline-delimited JSON (watch streams).
    pub fn lines(&self) -> Vec<serde_json::Value> {
        self.text().lines().filter(|l| !l.trim().is_empty()).filter_map(|l| serde_json::from_str(l).ok()).collect()
    }
}

/// A minimal HTTP/1.1 client (one request per connection) so tests can send exactly the
/// bytes they mean, including malformed ones.
pub fn raw(port: u16, method: &str, path: &str, content_type: Option<&str>, body: &[u8]) -> Result<RawResponse> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nAccept: application/json\r\n"
    );
    if let Some(ct) = content_type {
        req.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(req.as_bytes())?;
    // A server may answer (413) before reading a large body; ignore write errors then.
    let _ = s.write_all(body);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    parse_response(&buf)
}

fn parse_response(buf: &[u8]) -> Result<RawResponse> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").context("no HTTP header end")?;
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("bad status line")?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))).collect();
    let mut body = buf[head_end + 4..].to_vec();
    let chunked =
        headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Ok(RawResponse { status, headers, body })
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = b.windows(2).position(|w| w == b"\r\n") else { break };
        let size_str = String::from_utf8_lossy(&b[..line_end]);
        let Ok(size) = usize::from_str_radix(size_str.split(';').next().unwrap_or("0").trim(), 16) else { break };
        if size == 0 {
            break;
        }
        let start = line_end + 2;
        if b.len() < start + size {
            out.extend_from_slice(&b[start..]);
            break;
        }
        out.extend_from_slice(&b[start..start + size]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

/// The Prometheus text a component serves on `127.0.0.1:<port>/metrics` (through curl).
pub async fn metrics_text(port: u16) -> Result<String> {
    let out = tokio::process::Command::new("curl")
        .args(["-fsS", &format!("http://127.0.0.1:{port}/metrics")])
        .output()
        .await
        .context("curl /metrics")?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// User plus system CPU seconds a process has used so far (`/proc/<pid>/stat`).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Run `op(n)` (n counting up) from `concurrency` tasks for `duration`, for benchmarks:
/// (operations per second, every operation's latency in ms, sorted).
pub async fn load<F, Fut>(concurrency: usize, duration: Duration, op: F) -> (f64, Vec<f64>)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let op = Arc::new(op);
    let counter = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (op, counter) = (op.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                op(n).await;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("bench task"));
    }
    let rate = lat.len() as f64 / start.elapsed().as_secs_f64();
    lat.sort_by(|a, b| a.total_cmp(b));
    (rate, lat)
}

/// Wait until `f` returns true (polling), or fail after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("condition not met within {timeout:?}")
}
