//! Liveness, readiness and startup probes (exec, httpGet over HTTP or HTTPS without
//! certificate verification, tcpSocket, gRPC `grpc.health.v1`) with Kubernetes'
//! timing fields. One task per probe of a running container; results land in a shared map
//! the pod worker reads, and every change wakes the worker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::runtime::Runtime;
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

impl ProbeKind {
    /// The `probe_type` label.
    pub fn label(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }
}

/// Where one pod's probe outcomes are counted (`/metrics/probes`).
#[derive(Clone)]
pub struct Recorder {
    pub total: prometheus::IntCounterVec,
    pub seconds: prometheus::HistogramVec,
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
}

impl Recorder {
    fn record(&self, kind: ProbeKind, container: &str, ok: bool, elapsed: Duration) {
        let result = if ok { "successful" } else { "failed" };
        let (ns, pod, uid) = (self.namespace.as_str(), self.pod.as_str(), self.pod_uid.as_str());
        self.total.with_label_values(&[kind.label(), result, container, pod, ns, uid]).inc();
        self.seconds.with_label_values(&[kind.label(), container, pod, ns]).observe(elapsed.as_secs_f64());
    }
}

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
    rt: &Runtime,
    container_id: &str,
    c: &Container,
    p: &Probe,
    ip: &str,
    timeout: Duration,
) -> Result<bool> {
    let fut = async {
        if let Some(e) = &p.exec {
            let cmd = e.command.clone().unwrap_or_default();
            return Ok(rt.run_command(container_id, cmd).await? == Some(0));
        }
        if let Some(h) = &p.http_get {
            let port = resolve_port(&h.port, c)?;
            let host = h.host.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| ip.to_string());
            let https = h.scheme.as_deref() == Some("HTTPS");
            let headers: Vec<(String, String)> =
                h.http_headers.iter().flatten().map(|hd| (hd.name.clone(), hd.value.clone())).collect();
            let path = h.path.clone().unwrap_or_else(|| "/".into());
            let code = http_get(&host, port, &path, &headers, https).await?;
            return Ok((200..400).contains(&code));
        }
        if let Some(g) = &p.grpc {
            let port = u16::try_from(g.port).map_err(|_| anyhow!("invalid port {}", g.port))?;
            return grpc_check(ip, port, g.service.as_deref().unwrap_or(""), timeout).await;
        }
        if let Some(t) = &p.tcp_socket {
            let port = resolve_port(&t.port, c)?;
            let host = t.host.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| ip.to_string());
            tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            return Ok(true);
        }
        bail!("probe has no supported handler (exec, httpGet, tcpSocket, grpc)")
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

/// The request line and headers of an httpGet probe (Kubernetes' `kube-probe` user agent;
/// the probe's own headers, a `Host` among them, override the defaults).
pub fn http_request(host: &str, port: u16, path: &str, headers: &[(String, String)]) -> String {
    let path = if path.starts_with('/') { path.to_string() } else { format!("/{path}") };
    let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    let mut req = format!("GET {path} HTTP/1.1\r\n");
    if !has("host") {
        req.push_str(&format!("Host: {host}:{port}\r\n"));
    }
    if !has("user-agent") {
        req.push_str("User-Agent: kube-probe/1.37\r\n");
    }
    if !has("accept") {
        req.push_str("Accept: */*\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Connection: close\r\n\r\n");
    req
}

/// The status code of an HTTP/1.x status line (`HTTP/1.1 200 OK`).
pub fn status_code(head: &[u8]) -> Option<u16> {
    let line = String::from_utf8_lossy(head);
    let mut parts = line.split_whitespace();
    parts.next().filter(|v| v.starts_with("HTTP/"))?;
    parts.next()?.parse().ok()
}

async fn read_status<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S, req: &str) -> Result<u16> {
    s.write_all(req.as_bytes()).await?;
    s.flush().await?;
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < buf.len() && !buf[..n].contains(&b'\n') {
        let r = s.read(&mut buf[n..]).await?;
        if r == 0 {
            break;
        }
        n += r;
    }
    status_code(&buf[..n]).ok_or_else(|| anyhow!("bad HTTP answer {:?}", String::from_utf8_lossy(&buf[..n])))
}

/// GET `path` over HTTP or HTTPS and return the status code. HTTPS does not verify the
/// server's certificate, as the kubelet's prober does not.
pub async fn http_get(host: &str, port: u16, path: &str, headers: &[(String, String)], https: bool) -> Result<u16> {
    let tcp = tokio::net::TcpStream::connect((host, port)).await?;
    let req = http_request(host, port, path, headers);
    if !https {
        return read_status(tcp, &req).await;
    }
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| anyhow!("{host:?} is no TLS server name: {e}"))?;
    let tls =
        tokio_rustls::TlsConnector::from(insecure_tls_config()?).connect(name, tcp).await.context("TLS handshake")?;
    read_status(tls, &req).await
}

/// A TLS client configuration that accepts any server certificate (probes check liveness,
/// not identity — Kubernetes' prober sets `InsecureSkipVerify` too).
fn insecure_tls_config() -> Result<Arc<rustls::ClientConfig>> {
    use std::sync::OnceLock;
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    if let Some(c) = CONFIG.get() {
        return Ok(c.clone());
    }
    let config = common::tls::client_config(None, None).context("the probes' TLS configuration")?;
    Ok(CONFIG.get_or_init(|| config).clone())
}

/// A gRPC probe: `grpc.health.v1.Health/Check` for `service` on `host:port` (plaintext
/// HTTP/2, as Kubernetes'); success only for `SERVING`.
pub async fn grpc_check(host: &str, port: u16, service: &str, timeout: Duration) -> Result<bool> {
    use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest};
    let host = if host.contains(':') { format!("[{host}]") } else { host.to_string() };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{host}:{port}"))
        .context("gRPC endpoint")?
        .connect_timeout(timeout)
        .timeout(timeout)
        .user_agent("kube-probe/1.37")
        .context("gRPC user agent")?;
    let channel = endpoint.connect().await.context("gRPC connect")?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest { service: service.to_string() })
        .await
        .map_err(|s| anyhow!("health check: {} {}", s.code(), s.message()))?;
    Ok(reply.into_inner().status == ServingStatus::Serving as i32)
}

/// Start the probe tasks of a running container. Returns their handles (abort them when the
/// container stops).
pub fn start(
    rt: Arc<Runtime>,
    results: ResultMap,
    container_id: String,
    c: Container,
    ip: String,
    wake: Arc<dyn Fn() + Send + Sync>,
    recorder: Recorder,
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
        let (rt, results, id, c, ip, wake, recorder) =
            (rt.clone(), results.clone(), container_id.clone(), c.clone(), ip.clone(), wake.clone(), recorder.clone());
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
                let began = std::time::Instant::now();
                let ok = run_once(&rt, &id, &c, &probe, &ip, t.timeout).await.unwrap_or(false);
                recorder.record(kind, &c.name, ok, began.elapsed());
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
    fn http_request_and_status_line() {
        let r = http_request("10.0.0.2", 8080, "healthz", &[("X-Custom".into(), "1".into())]);
        assert!(r.starts_with("GET /healthz HTTP/1.1\r\nHost: 10.0.0.2:8080\r\nUser-Agent: kube-probe/1.37\r\n"));
        assert!(r.contains("X-Custom: 1\r\n") && r.ends_with("\r\n\r\n"));
        let r = http_request("h", 1, "/", &[("host".into(), "example.com".into())]);
        assert!(!r.contains("Host: h:1") && r.contains("host: example.com\r\n"));
        assert_eq!(status_code(b"HTTP/1.1 302 Found\r\n"), Some(302));
        assert_eq!(status_code(b"HTTP/1.0 500"), Some(500));
        assert_eq!(status_code(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_code(b""), None);
    }

    /// A one-shot-per-connection HTTP server answering `/ok` 200 and anything else 500,
    /// over TLS with a self-signed certificate when `tls`.
    async fn serve(tls: bool) -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let acceptor = tls.then(|| {
            let key = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
            let cert = key.cert.der().clone();
            let pk = rustls::pki_types::PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into());
            let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert], pk)
                .unwrap();
            tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
        });
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S) {
                        let mut buf = vec![0u8; 1024];
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        let req = String::from_utf8_lossy(&buf[..n]);
                        let code = if req.starts_with("GET /ok ") { "200 OK" } else { "500 Internal Server Error" };
                        let _ = s.write_all(format!("HTTP/1.1 {code}\r\nContent-Length: 0\r\n\r\n").as_bytes()).await;
                        let _ = s.shutdown().await;
                    }
                    match acceptor {
                        Some(a) => {
                            if let Ok(t) = a.accept(s).await {
                                answer(t).await
                            }
                        }
                        None => answer(s).await,
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn http_and_https_probes() {
        let plain = serve(false).await;
        let tls = serve(true).await;
        assert_eq!(http_get("127.0.0.1", plain, "/ok", &[], false).await.unwrap(), 200);
        assert_eq!(http_get("127.0.0.1", plain, "/bad", &[], false).await.unwrap(), 500);
        // HTTPS against a self-signed certificate for another name: accepted, as Kubernetes does.
        assert_eq!(http_get("127.0.0.1", tls, "/ok", &[], true).await.unwrap(), 200);
        assert_eq!(http_get("127.0.0.1", tls, "/bad", &[], true).await.unwrap(), 500);
        // Plain HTTP to a TLS port is no HTTP answer; HTTPS to a plain port fails the handshake.
        assert!(http_get("127.0.0.1", tls, "/ok", &[], false).await.is_err());
        assert!(http_get("127.0.0.1", plain, "/ok", &[], true).await.is_err());
    }

    #[tokio::test]
    async fn grpc_probe_against_a_tonic_health_server() {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter.set_service_status("up", tonic_health::ServingStatus::Serving).await;
        reporter.set_service_status("down", tonic_health::ServingStatus::NotServing).await;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(l);
        tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming));
        let t = Duration::from_secs(5);
        // The empty service name is the server's overall health (SERVING by default).
        assert!(grpc_check("127.0.0.1", port, "", t).await.unwrap());
        assert!(grpc_check("127.0.0.1", port, "up", t).await.unwrap());
        assert!(!grpc_check("127.0.0.1", port, "down", t).await.unwrap());
        // An unknown service is NOT_FOUND: an error, so a failed probe.
        assert!(grpc_check("127.0.0.1", port, "nope", t).await.is_err());
        // Nothing listening: an error.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        assert!(grpc_check("127.0.0.1", closed, "", t).await.is_err());
    }

    #[test]
    fn defaults() {
        let t = timing(&Probe::default());
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.failure_threshold, 3);
        assert_eq!(t.timeout, Duration::from_secs(1));
    }
}
