//! The HTTP tunnel: bases POST heartbeats (`/heartbeat`, bare heartbeat JSON, answered
//! `SUCCESS`) and baseline queries (`/queryBaseline`) to the controller's port (7777); the
//! controller calls each base's arklet-style API at `http://{localIP}:{port}/{installBiz,
//! uninstallBiz, queryAllBiz, health}` and turns the replies into the same callbacks as the
//! MQTT tunnel (install SUCCESS ⇒ ACTIVATED, anything else ⇒ BROKEN).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::Container;

use crate::mapping;
use crate::metrics::METRICS;
use crate::protocol::{
    ArkResponse, BaseMetadata, BizModel, BizOperationResponse, HealthResponse, HeartbeatData, SimpleBizData,
    CMD_HEALTH, CMD_INSTALL_BIZ, CMD_QUERY_ALL_BIZ, CMD_UNINSTALL_BIZ, CODE_FAILED,
};
use crate::tunnel::{QueryBaseline, QueryBaselineRequest, Tunnel, TunnelCallbacks};

pub const HTTP_TUNNEL_KEY: &str = "http_tunnel_provider";

/// POST `body` as JSON to `url`; the reply's JSON.
pub async fn post_json<T: serde::Serialize>(url: &str, body: &T) -> anyhow::Result<serde_json::Value> {
    let uri: http::Uri = url.parse()?;
    let client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
    let resp = tokio::time::timeout(Duration::from_secs(30), client.request(req)).await??;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        anyhow::bail!("{url}: HTTP {status}: {}", String::from_utf8_lossy(&bytes));
    }
    Ok(serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into())))
}

#[derive(Clone)]
struct Shared {
    callbacks: Arc<RwLock<Option<Arc<dyn TunnelCallbacks>>>>,
    query: Arc<RwLock<Option<QueryBaseline>>>,
    /// Base id → arklet base URL.
    bases: Arc<Mutex<HashMap<String, String>>>,
}

/// The HTTP implementation of [`Tunnel`].
pub struct HttpTunnel {
    port: u16,
    shared: Shared,
    ready: Arc<AtomicBool>,
}

impl HttpTunnel {
    pub fn new(port: u16) -> Self {
        HttpTunnel {
            port,
            shared: Shared {
                callbacks: Arc::new(RwLock::new(None)),
                query: Arc::new(RwLock::new(None)),
                bases: Arc::new(Mutex::new(HashMap::new())),
            },
            ready: Arc::new(AtomicBool::new(false)),
        }
    }

    fn url(&self, id: &str, cmd: &str) -> anyhow::Result<String> {
        let bases = self.shared.bases.lock().map_err(|_| anyhow::anyhow!("lock"))?;
        let base = bases.get(id).ok_or_else(|| anyhow::anyhow!("base {id} unknown to the HTTP tunnel"))?;
        Ok(format!("{base}/{cmd}"))
    }

    fn callbacks(&self) -> Option<Arc<dyn TunnelCallbacks>> {
        self.shared.callbacks.read().ok().and_then(|c| c.clone())
    }

    async fn call(&self, id: &str, cmd: &str, body: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let url = self.url(id, cmd)?;
        METRICS.commands_sent.with_label_values(&[cmd]).inc();
        post_json(&url, &body).await
    }

    async fn operation(&self, id: &str, cmd: &str, container: &Container) {
        let biz = mapping::biz_model(container);
        let response = match self.call(id, cmd, serde_json::to_value(&biz).unwrap_or_default()).await {
            Ok(v) => serde_json::from_value::<ArkResponse>(v).unwrap_or_else(|e| ArkResponse {
                code: CODE_FAILED.into(),
                message: format!("malformed arklet reply: {e}"),
                ..Default::default()
            }),
            Err(e) => ArkResponse { code: CODE_FAILED.into(), message: e.to_string(), ..Default::default() },
        };
        let op = BizOperationResponse {
            command: cmd.into(),
            biz_name: biz.biz_name.clone(),
            biz_version: biz.biz_version.clone(),
            response,
        };
        let resp = mapping::op_response(&op);
        if let Some(cb) = self.callbacks() {
            if cmd == CMD_INSTALL_BIZ {
                cb.on_start_container_response(id, resp);
            } else {
                cb.on_shutdown_container_response(id, resp);
            }
        }
    }
}

async fn heartbeat(State(s): State<Shared>, body: Bytes) -> (http::StatusCode, String) {
    METRICS.messages_received.with_label_values(&["heart"]).inc();
    let hb: HeartbeatData = match serde_json::from_slice(&body) {
        Ok(h) => h,
        Err(e) => {
            METRICS.messages_dropped.with_label_values(&["malformed"]).inc();
            tracing::warn!(error = %e, "dropping malformed HTTP heartbeat");
            return (http::StatusCode::BAD_REQUEST, format!("malformed heartbeat: {e}"));
        }
    };
    let Some(info) = mapping::heartbeat_to_node_info(&hb) else {
        METRICS.messages_dropped.with_label_values(&["malformed"]).inc();
        tracing::warn!("dropping HTTP heartbeat without identity");
        return (http::StatusCode::BAD_REQUEST, "heartbeat without identity".into());
    };
    let id = hb.base_metadata.identity.clone();
    let port = if hb.port > 0 { hb.port } else { crate::protocol::DEFAULT_ARKLET_PORT as i32 };
    if let Ok(mut b) = s.bases.lock() {
        b.insert(id.clone(), format!("http://{}:{port}", hb.local_ip));
    }
    if let Some(cb) = s.callbacks.read().ok().and_then(|c| c.clone()) {
        cb.on_node_discovered(&id, info);
    }
    (http::StatusCode::OK, "SUCCESS".into())
}

async fn query_baseline(State(s): State<Shared>, body: Bytes) -> (http::StatusCode, String) {
    let meta: BaseMetadata = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => return (http::StatusCode::BAD_REQUEST, format!("malformed baseline query: {e}")),
    };
    let Some(query) = s.query.read().ok().and_then(|q| q.clone()) else {
        return (http::StatusCode::OK, "[]".into());
    };
    let req = QueryBaselineRequest {
        identity: meta.identity.clone(),
        name: meta.name,
        version: meta.version,
        cluster_name: meta.cluster_name,
    };
    let list: Vec<BizModel> = query(req).iter().map(mapping::biz_model).collect();
    if let Some(cb) = s.callbacks.read().ok().and_then(|c| c.clone()) {
        cb.on_baseline_sent(&meta.identity, list.iter().map(|b| b.key()).collect());
    }
    (http::StatusCode::OK, serde_json::to_string(&list).unwrap_or_else(|_| "[]".into()))
}

#[async_trait::async_trait]
impl Tunnel for HttpTunnel {
    fn key(&self) -> &str {
        HTTP_TUNNEL_KEY
    }

    async fn start(&self, _client_id: &str, _env: &str) -> anyhow::Result<()> {
        let app = Router::new()
            .route("/heartbeat", post(heartbeat))
            .route("/queryBaseline", post(query_baseline))
            .with_state(self.shared.clone());
        let listener = tokio::net::TcpListener::bind(("0.0.0.0", self.port)).await?;
        tracing::info!(addr = %listener.local_addr()?, "HTTP tunnel listening");
        self.ready.store(true, Ordering::SeqCst);
        let ready = self.ready.clone();
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "HTTP tunnel stopped");
            }
            ready.store(false, Ordering::SeqCst);
        });
        Ok(())
    }

    fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    fn register_callbacks(&self, callbacks: Arc<dyn TunnelCallbacks>) {
        if let Ok(mut c) = self.shared.callbacks.write() {
            *c = Some(callbacks);
        }
    }

    fn register_query(&self, query: QueryBaseline) {
        if let Ok(mut q) = self.shared.query.write() {
            *q = Some(query);
        }
    }

    async fn on_node_start(&self, _node_id: &str) {}

    async fn on_node_stop(&self, _node_id: &str) {}

    async fn fetch_health_data(&self, node_id: &str) -> anyhow::Result<()> {
        let v = self.call(node_id, CMD_HEALTH, serde_json::json!({})).await?;
        let h: HealthResponse = serde_json::from_value(v)?;
        if let (Some(data), Some(cb)) = (mapping::health_to_status(&h), self.callbacks()) {
            cb.on_node_status(node_id, data);
        }
        Ok(())
    }

    async fn query_all_container_status(&self, node_id: &str) -> anyhow::Result<()> {
        let v = self.call(node_id, CMD_QUERY_ALL_BIZ, serde_json::json!({})).await?;
        let list: SimpleBizData = serde_json::from_value(v)?;
        if let Some(cb) = self.callbacks() {
            cb.on_all_container_status(node_id, mapping::simple_biz_to_statuses(&list.into_vec()));
        }
        Ok(())
    }

    async fn start_container(&self, node_id: &str, _pod_key: &str, container: &Container) -> anyhow::Result<()> {
        self.operation(node_id, CMD_INSTALL_BIZ, container).await;
        Ok(())
    }

    async fn shutdown_container(&self, node_id: &str, _pod_key: &str, container: &Container) -> anyhow::Result<()> {
        self.operation(node_id, CMD_UNINSTALL_BIZ, container).await;
        Ok(())
    }
}
