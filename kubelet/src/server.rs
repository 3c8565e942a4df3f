//! The kubelet's HTTPS server on `--port`: `/healthz`, `/metrics` (its own),
//! `/metrics/cadvisor`, `/metrics/resource` and `/metrics/probes` (containers and probes,
//! [`crate::cadvisor`]), and
//! `/containerLogs/<namespace>/<pod>/<container>` (query: follow, tailLines, previous,
//! timestamps, sinceSeconds, limitBytes) as the apiserver's `pods/log` proxy expects, and
//! `/stats/summary` (CPU and memory per container), and the streaming endpoints of
//! `streaming/` (`/exec`, `/attach`, `/portForward`). Every request passes [`common::kubelet_auth`]
//! first. The certificate is `--tls-cert-file`, or one the kubelet makes for itself
//! ([`serving_certificate`]).
//!
//! [`serve_healthz`] is the plain-HTTP `/healthz` of `--healthz-port` (loopback by
//! default), for local health checks that hold no credentials.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use serde::Deserialize;

use crate::kubelet::Kubelet;
use crate::runtime::LogOptions;

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct LogQuery {
    #[serde(default)]
    follow: Option<String>,
    #[serde(default)]
    tail_lines: Option<i64>,
    #[serde(default)]
    previous: Option<String>,
    #[serde(default)]
    timestamps: Option<String>,
    #[serde(default)]
    since_seconds: Option<i64>,
    #[serde(default)]
    limit_bytes: Option<usize>,
}

fn truthy(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("true" | "1" | ""))
}

/// Serve the kubelet's API over TLS on `addr`, every request checked by `auth`.
pub async fn serve(
    addr: SocketAddr,
    k: Arc<Kubelet>,
    tls: Arc<rustls::ServerConfig>,
    auth: Arc<common::kubelet_auth::Auth>,
    node: &str,
) -> anyhow::Result<SocketAddr> {
    let node: Arc<str> = node.into();
    // The machine's size (`machine_*`) does not change while the kubelet runs.
    let host = crate::node::host_facts(&k.root_dir);
    let machine = crate::cadvisor::Machine { cores: host.cpus as u64, memory_bytes: host.memory_bytes };
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/metrics/cadvisor", get(move |State(k)| cadvisor(k, machine)))
        .route("/metrics/resource", get(resource))
        .route("/metrics/probes", get(probes))
        .route("/containerLogs/{ns}/{pod}/{container}", get(logs))
        .route("/stats/summary", get(summary))
        .merge(crate::streaming::routes())
        .with_state(k)
        .layer(axum::middleware::from_fn_with_state((auth, node), common::kubelet_auth::layer));
    common::kubelet_auth::serve(addr, app, tls).await
}

/// The plain-HTTP `/healthz` on `addr` (Kubernetes' `--healthz-port`, 10248 on loopback).
pub async fn serve_healthz(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    let app = Router::new().route("/healthz", get(|| async { "ok" }));
    tokio::spawn(common::serve::serve(listener, app, std::future::pending(), common::serve::IDLE_TIMEOUT));
    Ok(bound)
}

/// The TLS configuration of `--port`: `--tls-cert-file`/`--tls-private-key-file` when
/// given, else `kubelet.crt`/`kubelet.key` in `cert_dir`, made (self-signed, for the node's
/// name and addresses) when missing, as Kubernetes' kubelet does. Client certificates are
/// checked against `client_ca`.
pub fn serving_certificate(
    files: Option<(&std::path::Path, &std::path::Path)>,
    cert_dir: &std::path::Path,
    names: &[String],
    client_ca: Option<&std::path::Path>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let (cert, key) = match files {
        Some((cert, key)) => (cert.to_path_buf(), key.to_path_buf()),
        None => {
            let (cert, key) = (cert_dir.join("kubelet.crt"), cert_dir.join("kubelet.key"));
            if !cert.exists() || !key.exists() {
                let host = names.first().map(String::as_str).unwrap_or("localhost");
                let (chain, private) = common::pki::self_signed_serving(host, names, common::pki::now())?;
                std::fs::create_dir_all(cert_dir).with_context(|| format!("creating {}", cert_dir.display()))?;
                common::write_private(&key, private.as_bytes())?;
                std::fs::write(&cert, chain).with_context(|| format!("writing {}", cert.display()))?;
                tracing::info!(cert = %cert.display(), "made a self-signed serving certificate");
            }
            (cert, key)
        }
    };
    Ok(common::tls::server_config(&common::tls::TlsFiles { cert: &cert, key: &key, client_ca })?)
}

/// The serving configuration of `--rotate-server-certificates`: the certificate of the
/// identity the rotation keeps (loaded from `kubelet-server-current.pem` in `cert_dir` while
/// that is valid, else none until the first is issued), and where rotation saves it.
pub fn rotating_serving_certificate(
    cert_dir: &std::path::Path,
    client_ca: Option<&std::path::Path>,
) -> anyhow::Result<(Arc<rustls::ServerConfig>, Arc<common::identity::Identity>, crate::certificate::Store)> {
    let path = cert_dir.join("kubelet-server-current.pem");
    let now = common::pki::now().unix_timestamp();
    let saved = std::fs::read_to_string(&path).ok().and_then(|t| crate::certificate::saved_identity(&t, now));
    let identity = saved.unwrap_or_else(common::identity::Identity::empty);
    let roots = client_ca.map(|p| common::tls::read_roots("--client-ca-file", p)).transpose()?;
    let tls = common::tls::server_config_with(identity.clone(), roots)?;
    Ok((tls, identity, crate::certificate::Store::Pem(path)))
}

async fn metrics(State(k): State<Arc<Kubelet>>) -> Response {
    let mut families = prometheus::gather();
    families.extend(k.metrics.registry.gather());
    common::metrics_response(&families)
}

async fn probes(State(k): State<Arc<Kubelet>>) -> Response {
    common::metrics_response(&k.metrics.probes.gather())
}

/// A rendering of the containers' samples, or the error that kept them from being read.
fn exposition(rendered: anyhow::Result<String>) -> Response {
    match rendered {
        Ok(text) => (StatusCode::OK, [(header::CONTENT_TYPE, common::exposition::CONTENT_TYPE)], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")).into_response(),
    }
}

async fn cadvisor(k: Arc<Kubelet>, machine: crate::cadvisor::Machine) -> Response {
    let samples = crate::stats::samples(&k.rt, &k.stats).await;
    exposition(samples.map(|(containers, pods)| crate::cadvisor::render(&containers, &pods, machine)))
}

async fn resource(State(k): State<Arc<Kubelet>>) -> Response {
    let samples = crate::stats::samples(&k.rt, &k.stats).await;
    exposition(
        samples.map(|(containers, _)| crate::cadvisor::render_resource(&containers, &crate::stats::node_reading())),
    )
}

async fn summary(State(k): State<Arc<Kubelet>>) -> Response {
    match crate::stats::summary(&k.rt, &k.stats, &k.node).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")).into_response(),
    }
}

async fn logs(
    State(k): State<Arc<Kubelet>>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    let records = match k.rt.list(None).await {
        Ok(r) => r,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")).into_response(),
    };
    let mine: Vec<_> = records.into_iter().filter(|r| r.pod_namespace == ns && r.pod_name == pod).collect();
    let (latest, prev) = crate::status::named(&mine, &container);
    let target = if truthy(&q.previous) { prev } else { latest };
    let Some(target) = target else {
        let what = if truthy(&q.previous) { "previous terminated container" } else { "container" };
        return (StatusCode::NOT_FOUND, format!("{what} \"{container}\" in pod \"{pod}\" not found")).into_response();
    };
    let since = q.since_seconds.map(|s| {
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
            - s) as i32
    });
    let opts = LogOptions {
        follow: truthy(&q.follow),
        timestamps: truthy(&q.timestamps),
        tail_lines: q.tail_lines,
        since: since.unwrap_or(0),
    };
    let limit = q.limit_bytes;
    let stream = k.rt.logs(&target.id, &opts);
    let mut sent = 0usize;
    let body = stream.take_while(move |item| {
        let ok = match (limit, item) {
            (Some(l), Ok(b)) => {
                let go = sent < l;
                sent += b.len();
                go
            }
            _ => true,
        };
        futures::future::ready(ok)
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from_stream(body))
        .unwrap_or_else(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())
}
