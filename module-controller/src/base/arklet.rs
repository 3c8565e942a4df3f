//! The base side of the HTTP tunnel: an arklet-style API (`POST /installBiz`,
//! `/uninstallBiz`, `/queryAllBiz`, `/health`; `GET /logs/{name}` for a module's output) and
//! heartbeats POSTed to the controller's `/heartbeat`, plus one `/queryBaseline` at start.

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::agent::{operation_reply, BaseEntry};
use crate::http_tunnel::post_json;
use crate::protocol::{BizModel, CMD_INSTALL_BIZ, CMD_UNINSTALL_BIZ, CODE_SUCCESS};

async fn install(State(b): State<Arc<BaseEntry>>, Json(biz): Json<BizModel>) -> Json<serde_json::Value> {
    tracing::info!(base = %b.identity.id, command = CMD_INSTALL_BIZ, module = %biz.key(), "command received");
    let r = b.host.install(&biz).await;
    Json(serde_json::to_value(operation_reply(CMD_INSTALL_BIZ, &biz, &b.identity.id, &r).response).unwrap_or_default())
}

async fn uninstall(State(b): State<Arc<BaseEntry>>, Json(biz): Json<BizModel>) -> Json<serde_json::Value> {
    tracing::info!(base = %b.identity.id, command = CMD_UNINSTALL_BIZ, module = %biz.key(), "command received");
    let r = b.host.uninstall(&biz).await;
    Json(
        serde_json::to_value(operation_reply(CMD_UNINSTALL_BIZ, &biz, &b.identity.id, &r).response).unwrap_or_default(),
    )
}

async fn query_all(State(b): State<Arc<BaseEntry>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({"code": CODE_SUCCESS, "data": b.host.list()}))
}

async fn health(State(b): State<Arc<BaseEntry>>) -> Json<serde_json::Value> {
    Json(serde_json::to_value(b.host.health()).unwrap_or_default())
}

async fn logs(State(b): State<Arc<BaseEntry>>, Path(name): Path<String>) -> (http::StatusCode, String) {
    match b.host.logs(&name) {
        Some(l) => (http::StatusCode::OK, l),
        None => (http::StatusCode::NOT_FOUND, format!("no module {name}")),
    }
}

/// What the apiserver's `pods/log` proxy asks a node for: the module's output
/// (module name = container name); `tailLines` honoured.
async fn container_logs(
    State(b): State<Arc<BaseEntry>>,
    Path((_ns, _pod, container)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> (http::StatusCode, String) {
    let Some(text) = b.host.logs(&container) else {
        return (http::StatusCode::NOT_FOUND, format!("module {container} is not installed on this base"));
    };
    match q.get("tailLines").and_then(|t| t.parse::<usize>().ok()) {
        Some(n) => {
            let lines: Vec<&str> = text.lines().collect();
            let mut out = lines[lines.len().saturating_sub(n)..].join("\n");
            out.push('\n');
            (http::StatusCode::OK, out)
        }
        None => (http::StatusCode::OK, text),
    }
}

/// The arklet-style API of one base.
pub fn router(base: Arc<BaseEntry>) -> Router {
    Router::new()
        .route("/installBiz", post(install))
        .route("/uninstallBiz", post(uninstall))
        .route("/queryAllBiz", post(query_all))
        .route("/health", post(health))
        .route("/logs/{name}", get(logs))
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .with_state(base)
}

/// Serve the arklet API (and the kubelet-style `/containerLogs`) on `listener`.
pub fn serve(base: Arc<BaseEntry>, listener: tokio::net::TcpListener) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "arklet API listening");
    }
    let app = router(base);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "arklet API stopped");
        }
    });
}

/// Post heartbeats to `tunnel` (e.g. `http://127.0.0.1:7777`) every `interval`, after one
/// baseline query (the arklet API is served separately, see [`serve`]).
pub async fn run_http(base: Arc<BaseEntry>, tunnel: &str, interval: Duration) -> anyhow::Result<()> {
    let tunnel = tunnel.trim_end_matches('/').to_string();
    // Baseline: retried until the controller answers.
    loop {
        match post_json(&format!("{tunnel}/queryBaseline"), &base.identity.metadata()).await {
            Ok(v) => {
                let list: Vec<BizModel> = serde_json::from_value(v).unwrap_or_default();
                tracing::info!(modules = list.len(), "installing baseline");
                for biz in &list {
                    let _ = base.host.install(biz).await;
                }
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "baseline query failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    loop {
        if let Err(e) = post_json(&format!("{tunnel}/heartbeat"), &base.identity.heartbeat()).await {
            tracing::warn!(error = %e, "heartbeat failed");
        }
        tokio::time::sleep(interval).await;
    }
}
