//! Helpers for the module-controller end-to-end tests: a real `mosquitto` broker on a free
//! port with a temp config, the `module-controller` and `base` binaries, a raw MQTT 3.1.1
//! publisher (to inject malformed or stale messages exactly as bytes), and process probes
//! (is a module's child process running, CPU and RSS of a process).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{free_port, ApiServer};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn target_dir() -> PathBuf {
    std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| root().join("target"))
}

/// The directory of the `module-controller` package's two binaries ([`crate::workspace_bins`]).
/// `MINIK8S_MODULE_CONTROLLER_DIR` overrides it (a directory holding both binaries).
pub fn bin_dir() -> PathBuf {
    match std::env::var("MINIK8S_MODULE_CONTROLLER_DIR") {
        Ok(d) => PathBuf::from(d),
        Err(_) => crate::workspace_bins(),
    }
}

/// Whether a prerequisite program is installed; under `CI=true` a missing one panics.
/// Returns false (the test should return early, saying so) otherwise.
pub fn require(program: &str, package: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).chain([PathBuf::from("/usr/sbin")]).any(|d| d.join(program).is_file()))
        .unwrap_or(false);
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("prerequisite missing: `{program}` (Debian package `{package}`); install it with apt-get install {package}");
        }
        eprintln!("SKIPPING: `{program}` is not installed (apt-get install {package})");
    }
    found
}

fn mosquitto_bin() -> PathBuf {
    for d in ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"] {
        let p = Path::new(d).join("mosquitto");
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from("mosquitto")
}

/// A process with a log file; killed on drop.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
    program: PathBuf,
    args: Vec<String>,
}

impl Proc {
    fn spawn(program: PathBuf, args: Vec<String>, log: PathBuf) -> Result<Self> {
        let mut p = Proc { child: None, log, program, args };
        p.start()?;
        Ok(p)
    }

    fn start(&mut self) -> Result<()> {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .with_context(|| format!("spawning {}", self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again with the same arguments (after [`Proc::kill`]).
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.start()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().map(|s| s.is_some()).unwrap_or(true),
            None => true,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A private mosquitto broker.
pub struct Broker {
    pub port: u16,
    proc: Proc,
    _dir: tempfile::TempDir,
}

impl Broker {
    pub fn start() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        Self::spawn(dir, port, format!("listener {port} 127.0.0.1\n"))
    }

    /// A broker whose only listener speaks TLS, with a certificate from a throw-away CA
    /// (made with `openssl`); returns the CA file clients must trust.
    pub fn start_tls() -> Result<(Self, PathBuf)> {
        let dir = tempfile::tempdir()?;
        let port = free_port();
        let d = dir.path();
        std::fs::write(d.join("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n")?;
        for args in [
            "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=minik8s-test-ca",
            "req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost",
            "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile san.ext",
        ] {
            let out = std::process::Command::new("openssl").args(args.split(' ')).current_dir(d).output()?;
            if !out.status.success() {
                bail!("openssl {args}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let conf = format!(
            // `user root`: started as root, mosquitto would drop to its own user, which
            // cannot read the key in this private temp dir (ignored when not root).
            "user root\nlistener {port} 127.0.0.1\ncafile {0}/ca.pem\ncertfile {0}/server.pem\nkeyfile {0}/server.key\n",
            d.display()
        );
        let ca = d.join("ca.pem");
        Ok((Self::spawn(dir, port, conf)?, ca))
    }

    fn spawn(dir: tempfile::TempDir, port: u16, listener: String) -> Result<Self> {
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!("{listener}allow_anonymous true\npersistence false\nmax_queued_messages 100000\n"),
        )?;
        let p = Proc::spawn(
            mosquitto_bin(),
            vec!["-c".into(), conf.display().to_string()],
            dir.path().join("mosquitto.log"),
        )?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("mosquitto did not listen on {port}: {}", p.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Broker { port, proc: p, _dir: dir })
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The mosquitto process.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }
}

/// For benchmarks: build the release `module-controller` and `base` and have [`bin_dir`]
/// return their directory (what users run), unless `MINIK8S_MODULE_CONTROLLER_DIR` names one.
pub fn use_release_module_controller() {
    if std::env::var("MINIK8S_MODULE_CONTROLLER_DIR").is_ok() {
        return;
    }
    let status = crate::cargo_command()
        .args(["build", "-q", "--release", "-p", "module-controller", "--bins"])
        .current_dir(root())
        .status()
        .expect("cargo build --release -p module-controller");
    assert!(status.success(), "building the release module-controller failed");
    std::env::set_var("MINIK8S_MODULE_CONTROLLER_DIR", target_dir().join("release"));
}

/// Start `module-controller` against `api` and `broker` with quick test timers plus `extra`.
/// Its /metrics port is returned in `.1`.
pub fn start_controller(api: &ApiServer, broker: &Broker, client_id: &str, extra: &[&str]) -> Result<(Proc, u16)> {
    let port = free_port();
    let mut args: Vec<String> = vec![
        "--server".into(),
        api.url(),
        "--mqtt-broker".into(),
        broker.address(),
        "--client-id".into(),
        client_id.into(),
        "--health-bind-address".into(),
        format!("127.0.0.1:{port}"),
        "--http-tunnel-port".into(),
        "0".into(),
        // The vnodes' kubelet API (module logs) on a free port of loopback.
        "--address".into(),
        "127.0.0.1".into(),
        "--port".into(),
        "0".into(),
        "--node-ip".into(),
        "127.0.0.1".into(),
        "--base-unreachable-after".into(),
        "4".into(),
        "--node-lease-duration".into(),
        "8".into(),
        "--health-interval".into(),
        "2".into(),
        "--query-interval".into(),
        "2".into(),
        "--log-level".into(),
        "info,module_controller=debug".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let log = api.data_dir.join(format!("module-controller-{client_id}.log"));
    Ok((Proc::spawn(bin_dir().join("module-controller"), args, log)?, port))
}

/// A reference base process (real module hosting) with its own work dir; `file://` module
/// URLs resolve under `artifact_root`.
pub fn start_base(broker: &Broker, id: &str, artifact_root: &Path, work: &Path, extra: &[&str]) -> Result<Proc> {
    let mut args: Vec<String> = vec![
        "--id".into(),
        id.into(),
        "--mqtt-broker".into(),
        broker.address(),
        "--heartbeat-interval".into(),
        "1".into(),
        "--artifact-root".into(),
        artifact_root.display().to_string(),
        "--work-dir".into(),
        work.join(id).display().to_string(),
        "--arklet-port".into(),
        "0".into(),
        "--local-ip".into(),
        "127.0.0.1".into(),
        "--log-level".into(),
        "info".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    std::fs::create_dir_all(work)?;
    Proc::spawn(bin_dir().join("base"), args, work.join(format!("base-{id}.log")))
}

/// `base --simulate n`.
pub fn start_simulator(broker: &Broker, n: usize, prefix: &str, work: &Path, heartbeat: &str) -> Result<Proc> {
    let args = vec![
        "--simulate".into(),
        n.to_string(),
        "--id".into(),
        prefix.into(),
        "--mqtt-broker".into(),
        broker.address(),
        "--heartbeat-interval".into(),
        heartbeat.into(),
    ];
    std::fs::create_dir_all(work)?;
    Proc::spawn(bin_dir().join("base"), args, work.join(format!("simulator-{prefix}.log")))
}

/// Write a module artifact (a shell script that logs and stays up) at `root` + `url_path`.
pub fn write_module(root: &Path, url_path: &str, name: &str) -> Result<()> {
    let p = root.join(url_path.trim_start_matches('/'));
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(
        &p,
        format!("#!/bin/sh\necho \"module {name} $BIZ_VERSION started\"\nwhile true; do sleep 1; done\n"),
    )?;
    Ok(())
}

/// Pids whose command line mentions `needle` (module processes run `<work>/modules/<name>-<version>/artifact`).
pub fn pids_with(needle: &str) -> Vec<u32> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                if cmd.contains(needle) {
                    out.push(pid);
                }
            }
        }
    }
    out
}

/// (CPU seconds, RSS bytes) of a process.
pub fn cpu_and_rss(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    let rss_pages: u64 = f.get(21)?.parse().ok()?;
    Some((ticks / 100.0, rss_pages * 4096))
}

/// GET a path on 127.0.0.1:port; the body.
pub fn http_get(port: u16, path: &str) -> Result<String> {
    let r = crate::raw(port, "GET", path, None, b"")?;
    Ok(r.text())
}

/// Sum of a Prometheus counter's samples whose line starts with `prefix`.
pub fn metric_sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Publish one message with a minimal MQTT 3.1.1 client (CONNECT, PUBLISH QoS 0,
/// DISCONNECT), so tests control the exact bytes.
pub fn mqtt_publish(port: u16, topic: &str, payload: &[u8]) -> Result<()> {
    fn remaining_len(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let mut b = (n % 128) as u8;
            n /= 128;
            if n > 0 {
                b |= 0x80;
            }
            out.push(b);
            if n == 0 {
                break;
            }
        }
    }
    fn string(s: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&(s.len() as u16).to_be_bytes());
        out.extend_from_slice(s);
    }
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let client_id = format!("e2e-{}-{}", std::process::id(), free_port());
    let mut body = vec![];
    string(b"MQTT", &mut body);
    body.extend_from_slice(&[4, 0x02, 0, 30]);
    string(client_id.as_bytes(), &mut body);
    let mut pkt = vec![0x10];
    remaining_len(body.len(), &mut pkt);
    pkt.extend_from_slice(&body);
    s.write_all(&pkt)?;
    let mut ack = [0u8; 4];
    s.read_exact(&mut ack)?;
    if ack[0] != 0x20 || ack[3] != 0 {
        bail!("MQTT CONNACK refused: {ack:?}");
    }
    let mut body = vec![];
    string(topic.as_bytes(), &mut body);
    body.extend_from_slice(payload);
    let mut pkt = vec![0x30];
    remaining_len(body.len(), &mut pkt);
    pkt.extend_from_slice(&body);
    s.write_all(&pkt)?;
    s.write_all(&[0xe0, 0])?;
    s.flush()?;
    Ok(())
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
