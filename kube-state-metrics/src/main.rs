//! `kube-state-metrics`: MiniK8s' object-state exporter. It watches API objects through
//! the apiserver like any other client and, on each scrape of `/metrics`, renders
//! Prometheus series describing their state with the upstream kube-state-metrics' names,
//! labels and value conventions:
//! - `render.rs`: the text format and the family/series vocabulary;
//! - `resource.rs`: resource quantities as `resource`/`unit` series;
//! - `store/`: one pure function per kind, objects → families;
//! - `watch.rs`: one reflector store per resource (the only I/O with the apiserver);
//! - `discovery.rs`: Prometheus' HTTP service discovery (`/sd/<role>`) from the same stores,
//!   for a Prometheus built without its Kubernetes discovery (Debian's);
//! - `telemetry.rs`: the exporter's own metrics, on the telemetry port.
//!
//! Upstream's flags: `--kubeconfig`, `--apiserver` (here `--server`), `--host`, `--port`
//! (8080), `--telemetry-host`, `--telemetry-port` (8081), `--resources`, `-v`.

mod discovery;
mod render;
mod resource;
mod store;
mod telemetry;
mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use clap::Parser;

use crate::watch::{Discovery, Source};

#[derive(Parser, Debug)]
#[command(name = "kube-state-metrics", about = "MiniK8s object-state exporter")]
struct Args {
    /// Path to a kubeconfig file.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The address of the apiserver (overrides the kubeconfig's).
    #[arg(long, alias = "apiserver")]
    server: Option<String>,
    /// Address to serve the objects' metrics on.
    #[arg(long, default_value = "0.0.0.0")]
    host: String,
    /// Port for the objects' metrics (0 = pick a free one).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Address to serve the exporter's own metrics on.
    #[arg(long, default_value = "0.0.0.0")]
    telemetry_host: String,
    /// Port for the exporter's own metrics and /healthz (0 = pick a free one).
    #[arg(long, default_value_t = 8081)]
    telemetry_port: u16,
    /// Comma-separated resources to export (default: all of them).
    #[arg(long, default_value = "", hide_default_value = true)]
    resources: String,
    /// Log verbosity: 0-1 info, 2-4 debug, 5 and more trace.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    verbosity: u8,
    /// Log filter (`info`, `info,kube=debug`); overrides -v. RUST_LOG overrides both.
    #[arg(long)]
    log_level: Option<String>,
    /// Also serve Prometheus' HTTP service discovery of the cluster's targets on
    /// `/sd/node|pod|endpoints|service` (a MiniK8s addition; it watches endpoints too).
    #[arg(long, default_value_t = false)]
    discovery: bool,
}

impl Args {
    fn log_filter(&self) -> String {
        common::log_filter(self.log_level.as_deref(), self.verbosity)
    }
}

/// Whether every source has listed once.
fn synced(sources: &[Source]) -> bool {
    sources.iter().all(Source::synced)
}

/// The text every scrape answers: each source's families, in the sources' order.
fn exposition(sources: &[Source]) -> String {
    let mut out = String::new();
    for s in sources {
        render::write(&mut out, &s.families());
    }
    out
}

async fn metrics(sources: Arc<Vec<Source>>) -> Response {
    if !synced(&sources) {
        let waiting: Vec<&str> = sources.iter().filter(|s| !s.synced()).map(|s| s.resource).collect();
        let body = format!("not synced yet: {}\n", waiting.join(", "));
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    let started = Instant::now();
    let body = match tokio::task::spawn_blocking(move || exposition(&sources)).await {
        Ok(body) => body,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    telemetry::scrape(started.elapsed().as_secs_f64());
    (StatusCode::OK, [(header::CONTENT_TYPE, common::exposition::CONTENT_TYPE)], body).into_response()
}

/// `GET /sd/<role>`: the role's targets as Prometheus' HTTP discovery reads them (503 until
/// the stores it reads have listed, 404 for a role not served).
async fn sd(discovery: Arc<Discovery>, role: String) -> Response {
    match discovery.targets(&role) {
        None => (StatusCode::NOT_FOUND, format!("no role {role:?}; roles: {}\n", discovery::ROLES.join(", ")))
            .into_response(),
        Some(Err(waiting)) => (StatusCode::SERVICE_UNAVAILABLE, format!("not synced yet: {waiting}\n")).into_response(),
        Some(Ok(groups)) => axum::Json(groups).into_response(),
    }
}

/// The main port: `/metrics` (503 until every store has synced, so a scrape never sees
/// half the cluster), `/sd/<role>` when discovery is on, `/healthz`, `/livez`, `/readyz`.
fn router(sources: Arc<Vec<Source>>, discovery: Option<Arc<Discovery>>) -> Router {
    let (m, r) = (sources.clone(), sources);
    let router = match discovery {
        Some(d) => Router::new().route(
            "/sd/{role}",
            get(move |axum::extract::Path(role): axum::extract::Path<String>| sd(d.clone(), role)),
        ),
        None => Router::new(),
    };
    router
        .route("/metrics", get(move || metrics(m.clone())))
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = synced(&r);
                async move {
                    if ready {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::init_tracing(&args.log_filter());
    let resources = store::parse_resources(&args.resources).map_err(|e| anyhow::anyhow!("--resources: {e}"))?;
    let client = common::client(args.kubeconfig.as_deref(), args.server.as_deref()).await?;
    let _trimmer = common::memory::spawn_trimmer(common::memory::TRIM_INTERVAL);

    let ready = common::Ready::default();
    let telemetry_addr: SocketAddr = format!("{}:{}", args.telemetry_host, args.telemetry_port)
        .parse()
        .context("--telemetry-host/--telemetry-port")?;
    let bound = common::serve_health(telemetry_addr, prometheus::Registry::new(), ready.clone()).await?;
    tracing::info!(%bound, "serving the exporter's own metrics");

    let mut shared = watch::Shared::default();
    let sources: Arc<Vec<Source>> =
        Arc::new(resources.iter().filter_map(|r| watch::start(&client, r, &mut shared)).collect());
    tracing::info!(resources = ?resources, "watching");
    let discovery = args.discovery.then(|| Arc::new(Discovery::start(&client, shared)));

    let addr: SocketAddr = format!("{}:{}", args.host, args.port).parse().context("--host/--port")?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    tracing::info!(bound = %listener.local_addr()?, "serving /metrics");
    let server = axum::serve(listener, router(sources.clone(), discovery));

    let s = sources.clone();
    tokio::spawn(async move {
        while !synced(&s) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tracing::info!("every store has synced");
        ready.set(true);
    });
    server.await.context("serving /metrics")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{Desc, Family, Series, Stability, Type};

    #[test]
    fn flags() {
        let a = Args::try_parse_from(["kube-state-metrics"]).unwrap();
        assert_eq!(
            (a.host.as_str(), a.port, a.telemetry_host.as_str(), a.telemetry_port),
            ("0.0.0.0", 8080, "0.0.0.0", 8081)
        );
        assert_eq!(store::parse_resources(&a.resources).unwrap(), store::RESOURCES);
        assert_eq!(a.log_filter(), "info");
        let a = Args::try_parse_from([
            "kube-state-metrics",
            "-v",
            "4",
            "--apiserver",
            "https://x:6443",
            "--resources=pods",
        ])
        .unwrap();
        assert_eq!((a.log_filter().as_str(), a.server.as_deref()), ("debug", Some("https://x:6443")));
        assert_eq!(store::parse_resources(&a.resources).unwrap(), ["pods"]);
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn metrics_wait_for_every_store() {
        let fam = Family {
            desc: Desc { name: "kube_x", help: "h", kind: Type::Gauge, stability: Stability::Alpha },
            series: vec![Series::with(&[("a", "b")], 1.0)],
        };
        for (synced, status) in [(false, "503"), (true, "200")] {
            let sources =
                Arc::new(vec![Source::fixed("pods", true, vec![fam.clone()]), Source::fixed("nodes", synced, vec![])]);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, router(sources, None)).await });
            let m = get(addr, "/metrics").await;
            assert!(m.starts_with(&format!("HTTP/1.1 {status}")), "{m}");
            let r = get(addr, "/readyz").await;
            assert!(r.starts_with(&format!("HTTP/1.1 {status}")), "{r}");
            assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
            if synced {
                assert!(m.contains("content-type: text/plain; version=0.0.4; charset=utf-8"), "{m}");
                assert!(m.ends_with("# HELP kube_x h\n# TYPE kube_x gauge\nkube_x{a=\"b\"} 1\n"), "{m}");
            } else {
                assert!(m.contains("not synced yet: nodes"), "{m}");
            }
        }
    }
}
