//! The kubelet's HTTP server on `--port`: `/healthz`, `/metrics`, and
//! `/containerLogs/<namespace>/<pod>/<container>` (query: follow, tailLines, previous,
//! timestamps, sinceSeconds, limitBytes) as the apiserver's `pods/log` proxy expects, and
//! `/stats/summary` (CPU and memory per container), and the streaming endpoints of
//! `streaming/` (`/exec`, `/attach`).

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

pub async fn serve(addr: SocketAddr, k: Arc<Kubelet>) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/containerLogs/{ns}/{pod}/{container}", get(logs))
        .route("/stats/summary", get(summary))
        .merge(crate::streaming::routes())
        .with_state(k);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "kubelet server stopped");
        }
    });
    Ok(bound)
}

async fn metrics(State(k): State<Arc<Kubelet>>) -> Response {
    use prometheus::Encoder;
    let mut families = prometheus::gather();
    families.extend(k.metrics.registry.gather());
    let mut body = Vec::new();
    match prometheus::TextEncoder::new().encode(&families, &mut body) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
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
