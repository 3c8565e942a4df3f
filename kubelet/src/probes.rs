//! Liveness, readiness and startup probes (exec, httpGet, tcpSocket) with Kubernetes'
//! timing fields. One task per probe of a running container; results land in a shared map
//! the pod worker reads, and every change wakes the worker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::status::ProbeView;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

/// Results of one container's probes.
#[derive(Debug, Clone, Default)]
pub struct Results {
    pub view: ProbeView,
    /// Set when the liveness or startup probe failed `failureThreshold` times: the
    /// container must be killed (and restarted per the restart policy).
    pub kill: Option<String>,
}

pub type ResultMap = Arc<Mutex<HashMap<String, Results>>>;

/// Timing of a probe with Kubernetes' defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: i32,
    pub failure_threshold: i32,
}

pub fn timing(p: &Probe) -> Timing {
    Timing {
        initial_delay: Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64),
        period: Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64),
        timeout: Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64),
        success_threshold: p.success_threshold.unwrap_or(1).max(1),
        failure_threshold: p.failure_threshold.unwrap_or(3).max(1),
    }
}

/// Consecutive-result counting (pure): returns the new (result, successes, failures) after
/// one probe outcome, where result only flips after the threshold is met.
pub fn step(current: Option<bool>, ok: bool, succ: i32, fail: i32, t: &Timing) -> (Option<bool>, i32, i32) {
    let (succ, fail) = if ok { (succ + 1, 0) } else { (0, fail + 1) };
    let result = if ok && succ >= t.success_threshold {
        Some(true)
    } else if !ok && fail >= t.failure_threshold {
        Some(false)
    } else {
        current
    };
    (result, succ, fail)
}

fn resolve_port(port: &IntOrString, c: &Container) -> Result<u16> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| anyhow!("invalid port {p}")),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .or_else(|| name.parse().ok())
            .ok_or_else(|| anyhow!("unknown port name {name:?}")),
    }
}

/// Run one probe once: Ok(true) success, Ok(false) failure.
pub async fn run_once(
    docker: &Docker,
    container_id: &str,
    c: &Container,
    p: &Probe,
    ip: &str,
    timeout: Duration,
) -> Result<bool> {
    let fut = async {
        if let Some(e) = &p.exec {
            let cmd = e.command.clone().unwrap_or_default();
            let exec = docker
                .create_exec(
                    container_id,
                    CreateExecOptions {
                        cmd: Some(cmd),
                        attach_stdout: Some(true),
                        attach_stderr: Some(true),
                        ..Default::default()
                    },
                )
                .await
                .context("creating the exec")?;
            if let StartExecResults::Attached { mut output, .. } = docker.start_exec(&exec.id, None).await? {
                while output.next().await.is_some() {}
            }
            let info = docker.inspect_exec(&exec.id).await?;
            return Ok(info.exit_code == Some(0));
        }
        if let Some(h) = &p.http_get {
            let port = resolve_port(&h.port, c)?;
            let host = h.host.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| ip.to_string());
            if h.scheme.as_deref() == Some("HTTPS") {
                bail!("HTTPS probes are not supported");
            }
            let mut s = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n");
            for hd in h.http_headers.iter().flatten() {
                req.push_str(&format!("{}: {}\r\n", hd.name, hd.value));
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes()).await?;
            let mut buf = [0u8; 64];
            let mut n = 0;
            while n < 12 {
                let r = s.read(&mut buf[n..]).await?;
                if r == 0 {
                    break;
                }
                n += r;
            }
            let line = String::from_utf8_lossy(&buf[..n]);
            let code: u16 = line
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .ok_or_else(|| anyhow!("bad HTTP answer"))?;
            return Ok((200..400).contains(&code));
        }
        if let Some(t) = &p.tcp_socket {
            let port = resolve_port(&t.port, c)?;
            let host = t.host.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| ip.to_string());
            tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            return Ok(true);
        }
        bail!("probe has no supported handler (exec, httpGet, tcpSocket)")
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(ok)) => Ok(ok),
        Ok(Err(e)) => {
            tracing::debug!(error = %format!("{e:#}"), container = container_id, "probe failed");
            Ok(false)
        }
        Err(_) => Ok(false),
    }
}

/// Start the probe tasks of a running container. Returns their handles (abort them when the
/// container stops).
pub fn start(
    docker: Docker,
    results: ResultMap,
    container_id: String,
    c: Container,
    ip: String,
    wake: Arc<dyn Fn() + Send + Sync>,
) -> Vec<tokio::task::JoinHandle<()>> {
    if let Ok(mut m) = results.lock() {
        m.entry(container_id.clone()).or_default();
    }
    let mut out = Vec::new();
    let already_started =
        results.lock().ok().and_then(|m| m.get(&container_id).and_then(|r| r.view.started)) == Some(true);
    for (kind, probe) in [
        (ProbeKind::Startup, c.startup_probe.clone().filter(|_| !already_started)),
        (ProbeKind::Liveness, c.liveness_probe.clone()),
        (ProbeKind::Readiness, c.readiness_probe.clone()),
    ] {
        let Some(probe) = probe else { continue };
        let (docker, results, id, c, ip, wake) =
            (docker.clone(), results.clone(), container_id.clone(), c.clone(), ip.clone(), wake.clone());
        out.push(tokio::spawn(async move {
            let t = timing(&probe);
            let has_startup = c.startup_probe.is_some();
            tokio::time::sleep(t.initial_delay).await;
            let (mut result, mut succ, mut fail) = (None, 0, 0);
            loop {
                // Liveness and readiness wait for the startup probe.
                let started = results.lock().ok().and_then(|m| m.get(&id).and_then(|r| r.view.started)) == Some(true);
                if kind != ProbeKind::Startup && has_startup && !started {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                let ok = run_once(&docker, &id, &c, &probe, &ip, t.timeout).await.unwrap_or(false);
                let before = result;
                (result, succ, fail) = step(result, ok, succ, fail, &t);
                if result != before {
                    let mut done = false;
                    if let Ok(mut m) = results.lock() {
                        let r = m.entry(id.clone()).or_default();
                        match kind {
                            ProbeKind::Readiness => r.view.ready = result,
                            ProbeKind::Startup if result == Some(true) => {
                                r.view.started = Some(true);
                                done = true;
                            }
                            ProbeKind::Startup | ProbeKind::Liveness if result == Some(false) => {
                                let what = if kind == ProbeKind::Startup { "Startup" } else { "Liveness" };
                                r.kill = Some(format!(
                                    "Container {} failed {} probe, will be restarted",
                                    c.name,
                                    what.to_lowercase()
                                ));
                                done = true;
                            }
                            _ => {}
                        }
                    }
                    wake();
                    if done {
                        return;
                    }
                }
                tokio::time::sleep(t.period).await;
            }
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds() {
        let t = Timing {
            initial_delay: Duration::ZERO,
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: 1,
            failure_threshold: 3,
        };
        let (r, s, f) = step(None, false, 0, 0, &t);
        assert_eq!((r, s, f), (None, 0, 1));
        let (r, _, f) = step(r, false, s, f, &t);
        assert_eq!((r, f), (None, 2));
        let (r, s, f) = step(r, false, 0, f, &t);
        assert_eq!((r, f), (Some(false), 3));
        let (r, _, _) = step(r, true, s, f, &t);
        assert_eq!(r, Some(true));
    }

    #[test]
    fn defaults() {
        let t = timing(&Probe::default());
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.failure_threshold, 3);
        assert_eq!(t.timeout, Duration::from_secs(1));
    }
}
