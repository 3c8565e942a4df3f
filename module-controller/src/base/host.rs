//! Module hosting of the reference base. A module is an artifact named by URL
//! (`file://`, `http://`, `https://`, or a bare absolute path): the base fetches it, checks
//! it (non-empty; by content: `#!` script or ELF executable run directly, a `.jar`/zip run
//! with `java -jar` when a JVM is on the PATH) and runs it as a supervised child process
//! whose output goes to a log file. States: RESOLVED (fetching/starting) → ACTIVATED, BROKEN
//! with a reason on any failure (including the child exiting), removed after uninstall
//! (reported DEACTIVATED by the operation). [`SimHost`] only changes states.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::protocol::{
    now_ms, BizModel, CpuInfo, HealthData, HealthDataWrapper, HealthResponse, JvmInfo, MasterBizInfo, SimpleBizInfo,
    StateRecord, BIZ_STATE_ACTIVATED, BIZ_STATE_BROKEN, BIZ_STATE_RESOLVED, CODE_SUCCESS,
};

/// Why an operation failed: a CamelCase reason and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: String,
    pub message: String,
}

impl Failure {
    fn new(reason: &str, message: impl Into<String>) -> Self {
        Failure { reason: reason.into(), message: message.into() }
    }
}

/// What hosts modules.
#[async_trait::async_trait]
pub trait Host: Send + Sync {
    async fn install(&self, biz: &BizModel) -> Result<(), Failure>;
    async fn uninstall(&self, biz: &BizModel) -> Result<(), Failure>;
    fn list(&self) -> Vec<SimpleBizInfo>;
    fn health(&self) -> HealthResponse;
    /// The module's log (`name` or `name:version`), if any.
    fn logs(&self, name: &str) -> Option<String> {
        let _ = name;
        None
    }
}

fn record(state: &str, reason: &str, message: &str) -> StateRecord {
    StateRecord { change_time: now_ms(), state: state.into(), reason: reason.into(), message: message.into() }
}

fn info(biz: &BizModel, state: &str, reason: &str, message: &str) -> SimpleBizInfo {
    SimpleBizInfo {
        name: biz.biz_name.clone(),
        version: biz.biz_version.clone(),
        state: state.into(),
        latest_state_record: Some(record(state, reason, message)),
    }
}

fn health(max: u64, committed: u64, used: u64, cpu_used: f64) -> HealthResponse {
    HealthResponse {
        code: CODE_SUCCESS.into(),
        data: HealthDataWrapper {
            health_data: HealthData {
                jvm: JvmInfo {
                    used_metaspace: used as f64,
                    committed_metaspace: committed as f64,
                    max_metaspace: max as f64,
                    other: Default::default(),
                },
                cpu: CpuInfo {
                    count: std::thread::available_parallelism().map(|n| n.get() as i64).unwrap_or(1),
                    total_used_percent: cpu_used,
                    other: Default::default(),
                },
                master_biz_info: MasterBizInfo {
                    biz_name: "base".into(),
                    biz_state: BIZ_STATE_ACTIVATED.into(),
                    biz_version: "1.0.0".into(),
                },
            },
        },
        message: String::new(),
    }
}

/// The simulator's host: installs succeed at once (unless the URL's scheme is `fail:`).
#[derive(Default)]
pub struct SimHost {
    modules: Mutex<BTreeMap<String, SimpleBizInfo>>,
}

#[async_trait::async_trait]
impl Host for SimHost {
    async fn install(&self, biz: &BizModel) -> Result<(), Failure> {
        let (state, res) = if biz.biz_url.starts_with("fail:") {
            (BIZ_STATE_BROKEN, Err(Failure::new("InstallFailed", "simulated failure")))
        } else {
            (BIZ_STATE_ACTIVATED, Ok(()))
        };
        let (reason, msg) = res.as_ref().err().map(|f| (f.reason.clone(), f.message.clone())).unwrap_or_default();
        if let Ok(mut m) = self.modules.lock() {
            m.insert(biz.key(), info(biz, state, &reason, &msg));
        }
        res
    }
    async fn uninstall(&self, biz: &BizModel) -> Result<(), Failure> {
        if let Ok(mut m) = self.modules.lock() {
            m.remove(&biz.key());
        }
        Ok(())
    }
    fn list(&self) -> Vec<SimpleBizInfo> {
        self.modules.lock().map(|m| m.values().cloned().collect()).unwrap_or_default()
    }
    fn health(&self) -> HealthResponse {
        let n = self.modules.lock().map(|m| m.len() as u64).unwrap_or(0);
        health(1 << 30, n * (1 << 20), n * (1 << 20), 0.0)
    }
}

/// How the artifact is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArtifactKind {
    Executable,
    Jar,
}

/// Check an artifact by its first bytes.
pub fn classify(head: &[u8]) -> Result<ArtifactKind, Failure> {
    if head.is_empty() {
        return Err(Failure::new("InvalidArtifact", "artifact is empty"));
    }
    if head.starts_with(b"#!") || head.starts_with(b"\x7fELF") {
        Ok(ArtifactKind::Executable)
    } else if head.starts_with(b"PK\x03\x04") {
        Ok(ArtifactKind::Jar)
    } else {
        Err(Failure::new("InvalidArtifact", "artifact is neither an executable (#! or ELF) nor a jar"))
    }
}

/// Where a `file://` URL (or bare absolute path) points, under `root` when given.
pub fn local_path(url: &str, root: Option<&Path>) -> Option<PathBuf> {
    let path = url.strip_prefix("file://").or_else(|| url.starts_with('/').then_some(url))?;
    if path.is_empty() {
        return None;
    }
    Some(match root {
        Some(r) => r.join(path.trim_start_matches('/')),
        None => PathBuf::from(path),
    })
}

struct Hosted {
    info: SimpleBizInfo,
    pid: Option<u32>,
    log: PathBuf,
    exited: Option<tokio::sync::watch::Receiver<bool>>,
}

/// Real hosting: fetch, check, run, supervise.
pub struct ProcessHost {
    work_dir: PathBuf,
    artifact_root: Option<PathBuf>,
    memory: u64,
    startup_grace: Duration,
    modules: Arc<Mutex<BTreeMap<String, Hosted>>>,
}

impl ProcessHost {
    pub fn new(work_dir: PathBuf, artifact_root: Option<PathBuf>, memory: u64) -> Self {
        ProcessHost {
            work_dir,
            artifact_root,
            memory,
            startup_grace: Duration::from_millis(500),
            modules: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    fn set(&self, biz: &BizModel, state: &str, reason: &str, message: &str) {
        if let Ok(mut m) = self.modules.lock() {
            if let Some(h) = m.get_mut(&biz.key()) {
                h.info = info(biz, state, reason, message);
            }
        }
    }

    async fn fetch(&self, biz: &BizModel, dest: &Path) -> Result<(), Failure> {
        let url = biz.biz_url.as_str();
        if let Some(src) = local_path(url, self.artifact_root.as_deref()) {
            tokio::fs::copy(&src, dest)
                .await
                .map_err(|e| Failure::new("DownloadFailed", format!("cannot read {}: {e}", src.display())))?;
            return Ok(());
        }
        if url.starts_with("http://") {
            return http_get(url, dest).await;
        }
        if url.starts_with("https://") {
            // TLS through curl, so the base carries no TLS stack of its own.
            let out = tokio::process::Command::new("curl")
                .args(["-fsSL", "--max-time", "60", "-o"])
                .arg(dest)
                .arg(url)
                .output()
                .await
                .map_err(|e| Failure::new("DownloadFailed", format!("cannot run curl for {url}: {e}")))?;
            if !out.status.success() {
                return Err(Failure::new(
                    "DownloadFailed",
                    format!("{url}: {}", String::from_utf8_lossy(&out.stderr).trim()),
                ));
            }
            return Ok(());
        }
        Err(Failure::new("InvalidArtifact", format!("unsupported module URL {url:?} (file://, http://, https://)")))
    }

    async fn start(&self, biz: &BizModel) -> Result<(), Failure> {
        let dir = self.work_dir.join("modules").join(format!("{}-{}", biz.biz_name, biz.biz_version));
        tokio::fs::create_dir_all(&dir).await.map_err(|e| Failure::new("InstallFailed", e.to_string()))?;
        let artifact = dir.join("artifact");
        self.fetch(biz, &artifact).await?;
        let mut head = vec![0u8; 8];
        {
            use tokio::io::AsyncReadExt;
            let mut f =
                tokio::fs::File::open(&artifact).await.map_err(|e| Failure::new("InstallFailed", e.to_string()))?;
            let n = f.read(&mut head).await.map_err(|e| Failure::new("InstallFailed", e.to_string()))?;
            head.truncate(n);
        }
        let kind = classify(&head)?;
        let mut cmd = match kind {
            ArtifactKind::Executable => {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o755));
                tokio::process::Command::new(&artifact)
            }
            ArtifactKind::Jar => {
                if !which("java") {
                    return Err(Failure::new("NoJVM", "module is a jar and no java is on the PATH"));
                }
                let mut c = tokio::process::Command::new("java");
                c.arg("-jar").arg(&artifact);
                c
            }
        };
        let log = dir.join("module.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| Failure::new("InstallFailed", e.to_string()))?;
        let err = out.try_clone().map_err(|e| Failure::new("InstallFailed", e.to_string()))?;
        cmd.current_dir(&dir)
            .env("BIZ_NAME", &biz.biz_name)
            .env("BIZ_VERSION", &biz.biz_version)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(false);
        // SAFETY: prctl(2) only, between fork and exec: the module dies with its base
        // even when the base is SIGKILLed.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        // A freshly written executable can be briefly "busy" (ETXTBSY) when another
        // thread forked while our write descriptor was open: the child holds a copy of
        // it until its exec. That clears within milliseconds, so retry a few times.
        let mut attempt = 0;
        let mut child = loop {
            match cmd.spawn() {
                Ok(c) => break c,
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 20 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Err(e) => return Err(Failure::new("StartFailed", e.to_string())),
            }
        };
        let pid = child.id();
        let (tx, rx) = tokio::sync::watch::channel(false);
        if let Ok(mut m) = self.modules.lock() {
            if let Some(h) = m.get_mut(&biz.key()) {
                h.pid = pid;
                h.log = log.clone();
                h.exited = Some(rx.clone());
            }
        }
        // Supervise: an exit while ACTIVATED makes the module BROKEN.
        let modules = self.modules.clone();
        let biz2 = biz.clone();
        let log2 = log.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let _ = tx.send(true);
            let msg = match status {
                Ok(s) => format!("module process exited ({s}); log tail: {}", tail(&log2, 5)),
                Err(e) => format!("waiting for the module process: {e}"),
            };
            if let Ok(mut m) = modules.lock() {
                if let Some(h) = m.get_mut(&biz2.key()).filter(|h| h.pid == pid) {
                    h.pid = None;
                    if h.info.state != crate::protocol::BIZ_STATE_DEACTIVATED {
                        tracing::warn!(module = %biz2.key(), %msg, "module exited");
                        h.info = info(&biz2, BIZ_STATE_BROKEN, "ModuleExited", &msg);
                    }
                }
            }
        });
        let mut rx2 = rx;
        if tokio::time::timeout(self.startup_grace, rx2.wait_for(|e| *e)).await.is_ok() {
            return Err(Failure::new(
                "ModuleExited",
                format!("module exited during startup; log tail: {}", tail(&log, 5)),
            ));
        }
        Ok(())
    }
}

fn which(prog: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file())).unwrap_or(false)
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join(" | ")
}

async fn http_get(url: &str, dest: &Path) -> Result<(), Failure> {
    use http_body_util::{BodyExt, Empty};
    let fail = |m: String| Failure::new("DownloadFailed", m);
    let uri: http::Uri = url.parse().map_err(|e| fail(format!("bad URL {url}: {e}")))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let resp = tokio::time::timeout(Duration::from_secs(60), client.get(uri))
        .await
        .map_err(|_| fail(format!("{url}: timed out")))?
        .map_err(|e| fail(format!("{url}: {e}")))?;
    if !resp.status().is_success() {
        return Err(fail(format!("{url}: HTTP {}", resp.status())));
    }
    let body = resp.into_body().collect().await.map_err(|e| fail(format!("{url}: {e}")))?.to_bytes();
    tokio::fs::write(dest, &body).await.map_err(|e| fail(e.to_string()))
}

fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

#[async_trait::async_trait]
impl Host for ProcessHost {
    async fn install(&self, biz: &BizModel) -> Result<(), Failure> {
        if biz.biz_name.is_empty() {
            return Err(Failure::new("InvalidRequest", "bizName is empty"));
        }
        {
            let Ok(mut m) = self.modules.lock() else { return Err(Failure::new("InstallFailed", "lock")) };
            if let Some(h) = m.get(&biz.key()) {
                if h.info.state == BIZ_STATE_ACTIVATED || h.info.state == BIZ_STATE_RESOLVED {
                    return Ok(());
                }
            }
            m.insert(
                biz.key(),
                Hosted {
                    info: info(biz, BIZ_STATE_RESOLVED, "", "installing"),
                    pid: None,
                    log: PathBuf::new(),
                    exited: None,
                },
            );
        }
        match self.start(biz).await {
            Ok(()) => {
                tracing::info!(module = %biz.key(), "module ACTIVATED");
                self.set(biz, BIZ_STATE_ACTIVATED, "", "");
                Ok(())
            }
            Err(f) => {
                tracing::warn!(module = %biz.key(), reason = %f.reason, message = %f.message, "module BROKEN");
                self.set(biz, BIZ_STATE_BROKEN, &f.reason, &f.message);
                Err(f)
            }
        }
    }

    async fn uninstall(&self, biz: &BizModel) -> Result<(), Failure> {
        let (pid, exited) = {
            let Ok(mut m) = self.modules.lock() else { return Err(Failure::new("UninstallFailed", "lock")) };
            let Some(h) = m.get_mut(&biz.key()) else { return Ok(()) };
            h.info = info(biz, crate::protocol::BIZ_STATE_DEACTIVATED, "", "uninstalling");
            (h.pid, h.exited.clone())
        };
        if let (Some(pid), Some(mut exited)) = (pid, exited) {
            let group = -(pid as i32);
            // SAFETY: kill(2) on the module's own process group.
            unsafe { libc::kill(group, libc::SIGTERM) };
            if tokio::time::timeout(Duration::from_secs(5), exited.wait_for(|e| *e)).await.is_err() {
                unsafe { libc::kill(group, libc::SIGKILL) };
                let _ = tokio::time::timeout(Duration::from_secs(5), exited.wait_for(|e| *e)).await;
            }
        }
        if let Ok(mut m) = self.modules.lock() {
            m.remove(&biz.key());
        }
        tracing::info!(module = %biz.key(), "module DEACTIVATED and removed");
        Ok(())
    }

    fn list(&self) -> Vec<SimpleBizInfo> {
        self.modules.lock().map(|m| m.values().map(|h| h.info.clone()).collect()).unwrap_or_default()
    }

    fn health(&self) -> HealthResponse {
        let pids: Vec<u32> =
            self.modules.lock().map(|m| m.values().filter_map(|h| h.pid).collect()).unwrap_or_default();
        let used: u64 = rss_bytes(std::process::id()) + pids.iter().map(|p| rss_bytes(*p)).sum::<u64>();
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()))
            .unwrap_or(0.0);
        let cpus = std::thread::available_parallelism().map(|n| n.get() as f64).unwrap_or(1.0);
        health(self.memory, used, used, (load / cpus * 100.0).min(100.0))
    }

    fn logs(&self, name: &str) -> Option<String> {
        let m = self.modules.lock().ok()?;
        let h = m.iter().find(|(k, h)| k.as_str() == name || h.info.name == name).map(|(_, h)| h)?;
        std::fs::read_to_string(&h.log).ok()
    }
}

impl Drop for ProcessHost {
    fn drop(&mut self) {
        if let Ok(m) = self.modules.lock() {
            for h in m.values() {
                if let Some(pid) = h.pid {
                    // SAFETY: kill(2) on a module process group this host started.
                    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn biz(name: &str, url: &str) -> BizModel {
        BizModel { biz_name: name.into(), biz_version: "0.0.1".into(), biz_url: url.into() }
    }

    #[test]
    fn artifacts_are_checked_by_content() {
        assert_eq!(classify(b"#!/bin/sh\n"), Ok(ArtifactKind::Executable));
        assert_eq!(classify(b"\x7fELF\x02"), Ok(ArtifactKind::Executable));
        assert_eq!(classify(b"PK\x03\x04xx"), Ok(ArtifactKind::Jar));
        assert_eq!(classify(b"").unwrap_err().reason, "InvalidArtifact");
        assert_eq!(classify(b"hello").unwrap_err().reason, "InvalidArtifact");
    }

    #[test]
    fn file_urls_resolve_under_the_artifact_root() {
        assert_eq!(local_path("file:///a/b.jar", None), Some(PathBuf::from("/a/b.jar")));
        assert_eq!(local_path("file:///a/b.jar", Some(Path::new("/r"))), Some(PathBuf::from("/r/a/b.jar")));
        assert_eq!(local_path("/a", None), Some(PathBuf::from("/a")));
        assert_eq!(local_path("http://x/a", None), None);
    }

    #[tokio::test]
    async fn a_script_module_runs_logs_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let art = dir.path().join("m.jar");
        std::fs::write(&art, "#!/bin/sh\necho hello from $BIZ_NAME $BIZ_VERSION\nexec sleep 60\n").unwrap();
        let host = ProcessHost::new(dir.path().join("work"), None, 1 << 30);
        let b = biz("m", &format!("file://{}", art.display()));
        host.install(&b).await.unwrap();
        assert_eq!(host.list()[0].state, "ACTIVATED");
        let mut logs = String::new();
        for _ in 0..50 {
            logs = host.logs("m").unwrap_or_default();
            if !logs.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(logs.contains("hello from m 0.0.1"), "{logs}");
        assert!(host.health().data.health_data.jvm.committed_metaspace > 0.0);
        host.uninstall(&b).await.unwrap();
        assert!(host.list().is_empty());
    }

    #[tokio::test]
    async fn failures_are_broken_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let host = ProcessHost::new(dir.path().join("work"), None, 1 << 30);
        let f = host.install(&biz("missing", "file:///nonexistent/x.jar")).await.unwrap_err();
        assert_eq!(f.reason, "DownloadFailed");
        let l = host.list();
        assert_eq!(l[0].state, "BROKEN");
        assert_eq!(l[0].latest_state_record.as_ref().unwrap().reason, "DownloadFailed");
        let bad = dir.path().join("bad.sh");
        std::fs::write(&bad, "#!/bin/sh\necho dying\nexit 3\n").unwrap();
        let f = host.install(&biz("dies", &format!("file://{}", bad.display()))).await.unwrap_err();
        assert_eq!(f.reason, "ModuleExited", "{}", f.message);
        let f = host.install(&biz("u", "ftp://x/y")).await.unwrap_err();
        assert_eq!(f.reason, "InvalidArtifact");
        let f = host.install(&biz("h", "http://127.0.0.1:1/x.jar")).await.unwrap_err();
        assert_eq!(f.reason, "DownloadFailed");
    }
}
