//! Plumbing every MiniK8s component shares, so each binary says only what it does:
//! - [`client`]: a `kube::Client` from the usual `--kubeconfig` / `--server` flags;
//! - [`init_tracing`]: `tracing` logs with a `-v`-style level or `RUST_LOG`;
//! - [`serve_health`]: `/healthz`, `/readyz` and Prometheus `/metrics` on one port;
//! - [`exposition`]: the Prometheus text format for series computed at scrape time;
//! - [`leader`]: leader election over a `coordination.k8s.io/v1` Lease;
//! - [`events`]: core/v1 Events, written in the background;
//! - [`backoff`]: the container restart back-off (CrashLoopBackOff) and `restartPolicy`;
//! - [`memory`]: freed heap pages returned to the system now and then;
//! - [`lock`]: process locks, so what must be unique on a host runs once;
//! - [`pki`]: the cluster CA, the apiserver's certificate and the identities' kubeconfigs;
//! - [`tls`] and [`serve`]: HTTPS listeners (the apiserver's secure port, the kubelet's
//!   port) and the TLS client configuration of the apiserver's calls to kubelets.

pub mod backoff;
pub mod certbundle;
pub mod events;
pub mod exposition;
pub mod identity;
pub mod kubelet_auth;
pub mod leader;
pub mod lock;
pub mod memory;
pub mod mesh;
pub mod pki;
pub mod serve;
pub mod tls;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// A client for the apiserver.
///
/// `server` (the `--server` flag) wins over the kubeconfig's server. With neither a
/// `kubeconfig` path nor `$KUBECONFIG`/`~/.kube/config`, `server` alone is enough.
pub async fn client(kubeconfig: Option<&Path>, server: Option<&str>) -> anyhow::Result<kube::Client> {
    kube::Client::try_from(config(kubeconfig, server).await?).context("building the API client")
}

/// The client configuration [`client`] builds on (for clients of other identities to the
/// same server).
pub async fn config(kubeconfig: Option<&Path>, server: Option<&str>) -> anyhow::Result<kube::Config> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None => match server {
            Some(url) => kube::Config::new(url.parse().with_context(|| format!("--server {url:?} is not a URL"))?),
            None => {
                kube::Config::infer().await.context("no --kubeconfig or --server, and no usable default kubeconfig")?
            }
        },
    };
    if let Some(url) = server {
        config.cluster_url = url.parse().with_context(|| format!("--server {url:?} is not a URL"))?;
    }
    Ok(config)
}

/// The host's primary IPv4 address: the source address of its route to a public address
/// (nothing is sent). `None` without such a route.
pub fn default_host_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    Some(s.local_addr().ok()?.ip()).filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

/// The log filter of a binary's `--log-level` (wins when given) and `-v` (Kubernetes'
/// verbosity: 0-1 info, 2-4 debug, 5 and more trace).
pub fn log_filter(log_level: Option<&str>, verbosity: u8) -> String {
    match (log_level, verbosity) {
        (Some(l), _) => l.to_string(),
        (None, 0..=1) => "info".into(),
        (None, 2..=4) => "debug".into(),
        (None, _) => "trace".into(),
    }
}

/// Log to stderr with `tracing`. `level` is a filter such as `info` or
/// `info,kube=debug`; `RUST_LOG` overrides it.
pub fn init_tracing(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).try_init();
}

/// Readiness a component flips once its caches are synced (or it leads).
#[derive(Clone, Default)]
pub struct Ready(Arc<AtomicBool>);

impl Ready {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst)
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Serve `/healthz` (always ok while the process runs), `/readyz` (from `ready`) and
/// `/metrics` (the default Prometheus registry plus `registry`) on `addr`. Returns once
/// the port is bound; serving goes on in a background task.
pub async fn serve_health(
    addr: SocketAddr,
    registry: prometheus::Registry,
    ready: Ready,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    let app = health_router(registry, ready);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "health/metrics server stopped");
        }
    });
    Ok(bound)
}

/// The routes [`serve_health`] serves, for a server that answers some of them its own way.
pub fn health_router(registry: prometheus::Registry, ready: Ready) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.get();
                async move {
                    if ready {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
        .route("/metrics", get(move || metrics(registry.clone())))
}

async fn metrics(registry: prometheus::Registry) -> axum::response::Response {
    let mut families = prometheus::gather();
    families.extend(registry.gather());
    metrics_response(&families)
}

/// A `/metrics` answer: `families` in the Prometheus text format.
pub fn metrics_response(families: &[prometheus::proto::MetricFamily]) -> axum::response::Response {
    use prometheus::Encoder;
    let mut body = Vec::new();
    match prometheus::TextEncoder::new().encode(families, &mut body) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Write `path` with mode 0600 through a temporary file beside it and a rename, so a reader
/// never sees a half-written secret (keys, certificates, tokens).
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn health_and_metrics_are_served() {
        let registry = prometheus::Registry::new();
        let counter = prometheus::IntCounter::new("minik8s_test_total", "a test counter").unwrap();
        registry.register(Box::new(counter.clone())).unwrap();
        counter.inc();
        let ready = Ready::default();
        let addr = serve_health("127.0.0.1:0".parse().unwrap(), registry, ready.clone()).await.unwrap();
        let get = |path: &str| {
            let url = format!("http://{addr}{path}");
            async move {
                let out = tokio::process::Command::new("curl")
                    .args(["-s", "-o", "-", "-w", "\n%{http_code}", &url])
                    .output()
                    .await
                    .unwrap();
                String::from_utf8(out.stdout).unwrap()
            }
        };
        assert!(get("/healthz").await.ends_with("200"));
        assert!(get("/readyz").await.ends_with("503"));
        ready.set(true);
        assert!(get("/readyz").await.ends_with("200"));
        assert!(get("/metrics").await.contains("minik8s_test_total 1"));
    }
}
