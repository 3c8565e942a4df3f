//! A throwaway single-member etcd for tests and benchmarks: its own temporary data directory,
//! free loopback ports for clients and peers, killed and cleaned up on drop.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let mut etcd = storage::etcd_test_server::EtcdServer::start()?;
//! let endpoint = etcd.endpoint(); // "http://127.0.0.1:PORT"
//! etcd.stop()?; // SIGKILL
//! etcd.restart()?; // same data directory and ports
//! # Ok(()) }
//! ```
//!
//! The binary is `$ETCD_BIN` if set, else `etcd` on `PATH` (Debian: `apt-get install
//! etcd-server`). If it is missing, [`EtcdServer::start`] panics when `CI=true` and returns an
//! error otherwise: tests never skip silently.
//!
//! The data directory is removed on drop unless `MINIK8S_KEEP_ETCD_DIR` is set; etcd's log
//! is `etcd.log` beside it ([`EtcdServer::log_path`]).
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long `start`/`restart` wait for etcd to report itself healthy.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// etcd's default request limit is 1.5 MiB, too small for a 1.5 MiB value plus its key.
const MAX_REQUEST_BYTES: u32 = 3 * 1024 * 1024;
/// etcd's `--experimental-watch-progress-notify-interval` for test servers.
pub const PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_millis(500);

/// A running (or stopped) etcd owned by the test.
pub struct EtcdServer {
    cfg: Config,
    child: Option<Child>,
}

/// Everything needed to (re)start the same etcd member.
#[derive(Clone, Debug)]
struct Config {
    binary: PathBuf,
    dir: PathBuf,
    name: String,
    client_port: u16,
    peer_port: u16,
    /// `--initial-cluster` and `--initial-cluster-token`: of this member alone, or of the
    /// cluster [`EtcdServer::start_cluster`] made.
    initial_cluster: String,
    cluster_token: String,
}

impl std::fmt::Debug for EtcdServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdServer")
            .field("endpoint", &self.endpoint())
            .field("dir", &self.cfg.dir)
            .field("pid", &self.pid())
            .finish()
    }
}

fn other(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// The etcd binary, or a clear error (a panic under `CI=true`).
fn find_binary() -> io::Result<PathBuf> {
    let (found, looked) = match std::env::var_os("ETCD_BIN") {
        Some(bin) => {
            let path = PathBuf::from(bin);
            let looked = format!("ETCD_BIN={}", path.display());
            (Some(path).filter(|p| p.is_file()), looked)
        }
        None => {
            let found = std::env::var_os("PATH")
                .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join("etcd")).find(|p| p.is_file()));
            (found, "`etcd` on PATH; set ETCD_BIN to use another binary".to_string())
        }
    };
    match found {
        Some(path) => Ok(path),
        None => {
            let msg = format!(
                "the etcd binary was not found (looked for {looked}): install etcd >= 3.4 \
                 (Debian: `apt-get install etcd-server`) to run the etcd tests"
            );
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}");
            }
            Err(io::Error::new(io::ErrorKind::NotFound, msg))
        }
    }
}

fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn unique_dir() -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("minik8s-etcd-{}-{n}-{nanos}", std::process::id()));
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

impl EtcdServer {
    /// Start a fresh etcd and wait until it answers. Blocks (up to ~30 s); from async code
    /// prefer [`EtcdServer::start_async`].
    pub fn start() -> io::Result<Self> {
        let binary = find_binary()?;
        let mut last_err = None;
        // A free port can be taken by someone else before etcd binds it: try a few times.
        for _ in 0..3 {
            let dir = unique_dir()?;
            let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("minik8s-etcd").to_string();
            let mut cfg = Config {
                binary: binary.clone(),
                dir,
                name: name.clone(),
                client_port: free_port()?,
                peer_port: free_port()?,
                initial_cluster: String::new(),
                cluster_token: name,
            };
            while cfg.peer_port == cfg.client_port {
                cfg.peer_port = free_port()?;
            }
            cfg.initial_cluster = format!("{}=http://127.0.0.1:{}", cfg.name, cfg.peer_port);
            // Owned from here on, so that a failed attempt removes its directory.
            let mut server = EtcdServer { cfg, child: None };
            match server.cfg.spawn_and_wait() {
                Ok(child) => {
                    server.child = Some(child);
                    return Ok(server);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "etcd did not start; retrying on other ports");
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| other("etcd did not start".into())))
    }

    /// A cluster of `members` etcd members on loopback (one `--initial-cluster`), each an
    /// [`EtcdServer`] of its own that may be stopped and restarted; returns once every
    /// member is healthy (the cluster has a leader). Blocks.
    pub fn start_cluster(members: usize) -> io::Result<Vec<Self>> {
        let binary = find_binary()?;
        let mut ports = std::collections::BTreeSet::new();
        let mut cfgs = Vec::new();
        for i in 0..members {
            let dir = unique_dir()?;
            let token = format!("minik8s-etcd-cluster-{}", std::process::id());
            let (mut client_port, mut peer_port) = (free_port()?, free_port()?);
            while ports.contains(&client_port) || ports.contains(&peer_port) || client_port == peer_port {
                (client_port, peer_port) = (free_port()?, free_port()?);
            }
            ports.extend([client_port, peer_port]);
            let name = format!("member-{}", i + 1);
            cfgs.push(Config {
                binary: binary.clone(),
                dir,
                name,
                client_port,
                peer_port,
                initial_cluster: String::new(),
                cluster_token: token,
            });
        }
        let initial: Vec<String> =
            cfgs.iter().map(|c| format!("{}=http://127.0.0.1:{}", c.name, c.peer_port)).collect();
        let mut servers: Vec<EtcdServer> = cfgs
            .into_iter()
            .map(|mut cfg| {
                cfg.initial_cluster = initial.join(",");
                EtcdServer { cfg, child: None }
            })
            .collect();
        // All at once: no member is healthy before a quorum of them runs.
        for s in &mut servers {
            s.child = Some(s.cfg.spawn()?);
        }
        for s in &mut servers {
            let child = s.child.take().ok_or_else(|| other("etcd member not started".into()))?;
            s.child = Some(s.cfg.wait_healthy(child)?);
        }
        Ok(servers)
    }

    /// [`EtcdServer::start`] on a blocking thread.
    pub async fn start_async() -> io::Result<Self> {
        tokio::task::spawn_blocking(Self::start).await.map_err(|e| other(format!("etcd start task failed: {e}")))?
    }

    /// The client URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.cfg.endpoint()
    }

    /// [`EtcdServer::endpoint`] as a list, as `EtcdStore::connect` takes it.
    pub fn endpoints(&self) -> Vec<String> {
        vec![self.endpoint()]
    }

    pub fn data_dir(&self) -> PathBuf {
        self.cfg.data_dir()
    }

    /// etcd's stdout and stderr (appended across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.cfg.log_path()
    }

    /// The etcd process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kill etcd with SIGKILL (no graceful shutdown) and wait for it to exit. The data
    /// directory stays for [`EtcdServer::restart`]. No-op if it is not running.
    pub fn stop(&mut self) -> io::Result<()> {
        if let Some(mut child) = self.child.take() {
            if child.try_wait()?.is_none() {
                child.kill()?;
            }
            child.wait()?;
        }
        Ok(())
    }

    /// Freeze etcd with SIGSTOP: the process and its sockets stay, nothing answers (a hung
    /// server, as opposed to a dead one). Undo with [`EtcdServer::resume`].
    pub fn pause(&mut self) -> io::Result<()> {
        self.signal("STOP")
    }

    /// Continue a [`EtcdServer::pause`]d etcd with SIGCONT.
    pub fn resume(&mut self) -> io::Result<()> {
        self.signal("CONT")
    }

    fn signal(&mut self, name: &str) -> io::Result<()> {
        let Some(pid) = self.pid() else {
            return Err(other("etcd is not running".into()));
        };
        let status = Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status()?;
        if status.success() {
            Ok(())
        } else {
            Err(other(format!("kill -{name} {pid} failed: {status}")))
        }
    }

    /// Stop etcd with SIGTERM (graceful), falling back to SIGKILL after 10 s.
    pub fn terminate(&mut self) -> io::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if child.try_wait()?.is_none() {
            let status = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
            if status.is_ok_and(|s| s.success()) {
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    if child.try_wait()?.is_some() {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            child.kill()?;
        }
        child.wait()?;
        Ok(())
    }

    /// Stop etcd if it runs, then start it again on the same data directory and ports, and
    /// wait until it answers. Blocks; from async code prefer [`EtcdServer::restart_async`].
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop()?;
        self.child = Some(self.cfg.spawn_and_wait()?);
        Ok(())
    }

    /// [`EtcdServer::restart`] without blocking the async runtime.
    pub async fn restart_async(&mut self) -> io::Result<()> {
        self.stop()?;
        let cfg = self.cfg.clone();
        let child = tokio::task::spawn_blocking(move || cfg.spawn_and_wait())
            .await
            .map_err(|e| other(format!("etcd restart task failed: {e}")))??;
        self.child = Some(child);
        Ok(())
    }

    /// Whether the etcd process is alive.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Where the data directory and the log live.
    pub fn dir(&self) -> &Path {
        &self.cfg.dir
    }
}

impl Config {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    /// Start etcd and wait until it is healthy; on failure it is killed again.
    fn spawn_and_wait(&self) -> io::Result<Child> {
        let child = self.spawn()?;
        self.wait_healthy(child)
    }

    fn spawn(&self) -> io::Result<Child> {
        let log = File::options().create(true).append(true).open(self.log_path())?;
        let client_url = self.endpoint();
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(&self.cluster_token)
            .arg("--max-request-bytes")
            .arg(MAX_REQUEST_BYTES.to_string())
            // Quiet watches get progress notifications this often (10 minutes by default):
            // the only progress older etcd versions deliver in order (see `storage::etcd`).
            // etcd 3.6 still accepts the experimental name.
            .arg("--experimental-watch-progress-notify-interval")
            .arg(format!("{}ms", PROGRESS_NOTIFY_INTERVAL.as_millis()))
            .arg("--logger")
            .arg("zap")
            .arg("--log-outputs")
            .arg("stderr")
            .arg("--log-level")
            .arg("warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| other(format!("cannot run {}: {e}", self.binary.display())))?;
        tracing::debug!(pid = child.id(), endpoint = %client_url, dir = %self.dir.display(), "etcd started");
        Ok(child)
    }

    /// Wait until the started `child` is healthy; on failure it is killed.
    fn wait_healthy(&self, mut child: Child) -> io::Result<Child> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(other(format!("etcd exited with {status} before it was ready; log:\n{}", self.log_tail())));
            }
            if self.healthy() {
                return Ok(child);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(other(format!("etcd was not healthy within {READY_TIMEOUT:?}; log:\n{}", self.log_tail())));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `GET /health` answers `{"health":"true"...}` once etcd has a leader and serves reads.
    fn healthy(&self) -> bool {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.client_port));
        let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
            return false;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
        let request =
            format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n", self.client_port);
        if conn.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut response = Vec::new();
        let _ = conn.take(64 * 1024).read_to_end(&mut response);
        let response = String::from_utf8_lossy(&response);
        response.starts_with("HTTP/1.1 200") && response.contains("\"health\":\"true\"")
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.stop();
        if std::env::var_os("MINIK8S_KEEP_ETCD_DIR").is_none() {
            let _ = fs::remove_dir_all(&self.cfg.dir);
        } else {
            eprintln!("keeping etcd directory {}", self.cfg.dir.display());
        }
    }
}
