//! The MQTT tunnel: Koupleless' topics and JSON over a broker (Debian's `mosquitto`), with
//! `rumqttc`. On connect it subscribes to every base's heartbeat and baseline query; per
//! base (once this controller owns the vnode) to its health, module list and operation
//! results. Commands are published QoS 0, retained, as upstream does. Malformed and stale
//! (≥ 10 s) messages are dropped with a log line.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS, SubscribeFilter};

use crate::mapping;
use crate::metrics::METRICS;
use crate::protocol::{
    now_ms, open_envelope, BaseMetadata, BizModel, BizOperationResponse, HealthResponse, HeartbeatData, MessageError,
    SimpleBizData, Topics, CMD_HEALTH, CMD_INSTALL_BIZ, CMD_QUERY_ALL_BIZ, CMD_UNINSTALL_BIZ,
};
use crate::tunnel::{QueryBaseline, QueryBaselineRequest, Tunnel, TunnelCallbacks};

/// The tunnel's key (the vnode's `vnode.koupleless.io/tunnel` label), as upstream names it.
pub const MQTT_TUNNEL_KEY: &str = "mqtt_tunnel_provider";

/// How to reach the broker.
#[derive(Clone, Debug)]
pub struct MqttConfig {
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<String>,
    /// TLS to the broker; plain TCP when None.
    pub tls: Option<MqttTls>,
}

/// The broker flags both binaries take (`#[command(flatten)]`).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct MqttArgs {
    /// MQTT broker `host:port`.
    #[arg(long)]
    pub mqtt_broker: Option<String>,
    #[arg(long, env = "MQTT_USERNAME")]
    pub mqtt_username: Option<String>,
    #[arg(long, env = "MQTT_PASSWORD")]
    pub mqtt_password: Option<String>,
    /// A file whose first line is the password (kept off the command line).
    #[arg(long, conflicts_with = "mqtt_password")]
    pub mqtt_password_file: Option<std::path::PathBuf>,
    /// PEM CA bundle that signed the broker's certificate: connect with TLS.
    #[arg(long)]
    pub mqtt_ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate for mutual TLS (with --mqtt-client-key-file).
    #[arg(long)]
    pub mqtt_client_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of --mqtt-client-cert-file.
    #[arg(long)]
    pub mqtt_client_key_file: Option<std::path::PathBuf>,
}

impl MqttArgs {
    /// The connection to `broker` these flags describe.
    pub fn config(&self, broker: &str) -> anyhow::Result<MqttConfig> {
        let mut cfg = MqttConfig::parse(broker)?;
        cfg.username = self.mqtt_username.clone();
        cfg.password = match &self.mqtt_password_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("--mqtt-password-file {}: {e}", path.display()))?;
                Some(text.lines().next().unwrap_or_default().to_string())
            }
            None => self.mqtt_password.clone(),
        };
        cfg.tls = MqttTls::from_flags(
            self.mqtt_ca_file.as_deref(),
            self.mqtt_client_cert_file.as_deref(),
            self.mqtt_client_key_file.as_deref(),
        )?;
        Ok(cfg)
    }
}

/// TLS material for the broker connection, PEM: the CA that signed the broker's
/// certificate, and optionally a client certificate and key for mutual TLS.
#[derive(Clone)]
pub struct MqttTls {
    ca: Vec<u8>,
    client_auth: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for MqttTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttTls").field("client_auth", &self.client_auth.is_some()).finish_non_exhaustive()
    }
}

impl MqttTls {
    /// From the `--mqtt-ca-file`, `--mqtt-client-cert-file` and `--mqtt-client-key-file`
    /// flags: None without a CA; a client certificate needs its key and the reverse.
    pub fn from_flags(
        ca: Option<&std::path::Path>,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> anyhow::Result<Option<Self>> {
        let read = |p: &std::path::Path, what: &str| {
            std::fs::read(p).map_err(|e| anyhow::anyhow!("reading the MQTT {what} {}: {e}", p.display()))
        };
        let Some(ca) = ca else {
            if cert.is_some() || key.is_some() {
                anyhow::bail!("--mqtt-client-cert-file/--mqtt-client-key-file need --mqtt-ca-file (TLS)");
            }
            return Ok(None);
        };
        let client_auth = match (cert, key) {
            (Some(c), Some(k)) => Some((read(c, "client certificate")?, read(k, "client key")?)),
            (None, None) => None,
            _ => anyhow::bail!("--mqtt-client-cert-file and --mqtt-client-key-file go together"),
        };
        // rustls needs a process-wide crypto provider; ring builds with a C compiler only.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(Some(MqttTls { ca: read(ca, "CA file")?, client_auth }))
    }
}

impl MqttConfig {
    /// From `host:port` (port defaults to 1883).
    pub fn parse(broker: &str) -> anyhow::Result<Self> {
        let (host, port) = match broker.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().map_err(|_| anyhow::anyhow!("bad MQTT port in {broker:?}"))?),
            None => (broker.to_string(), 1883),
        };
        if host.is_empty() {
            anyhow::bail!("empty MQTT host in {broker:?}");
        }
        Ok(MqttConfig { host, port, username: None, password: None, tls: None })
    }

    /// Client options with a big packet limit and queue.
    pub fn options(&self, client_id: &str) -> MqttOptions {
        let mut o = MqttOptions::new(client_id, self.host.clone(), self.port);
        o.set_keep_alive(Duration::from_secs(30));
        o.set_max_packet_size(64 << 20, 64 << 20);
        o.set_clean_session(true);
        o.set_request_channel_capacity(100_000);
        o.set_inflight(1000);
        if let (Some(u), Some(p)) = (&self.username, &self.password) {
            o.set_credentials(u.clone(), p.clone());
        }
        if let Some(tls) = &self.tls {
            o.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Simple {
                ca: tls.ca.clone(),
                alpn: None,
                client_auth: tls.client_auth.clone(),
            }));
        }
        o
    }
}

/// The MQTT implementation of [`Tunnel`].
pub struct MqttTunnel {
    config: MqttConfig,
    topics: OnceLock<Topics>,
    client: OnceLock<AsyncClient>,
    ready: Arc<AtomicBool>,
    callbacks: Arc<RwLock<Option<Arc<dyn TunnelCallbacks>>>>,
    query: Arc<RwLock<Option<QueryBaseline>>>,
    owned: Arc<Mutex<HashSet<String>>>,
}

impl MqttTunnel {
    pub fn new(config: MqttConfig) -> Self {
        MqttTunnel {
            config,
            topics: OnceLock::new(),
            client: OnceLock::new(),
            ready: Arc::new(AtomicBool::new(false)),
            callbacks: Arc::new(RwLock::new(None)),
            query: Arc::new(RwLock::new(None)),
            owned: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    fn parts(&self) -> anyhow::Result<(&AsyncClient, &Topics)> {
        match (self.client.get(), self.topics.get()) {
            (Some(c), Some(t)) => Ok((c, t)),
            _ => anyhow::bail!("MQTT tunnel not started"),
        }
    }

    async fn command(&self, node_id: &str, cmd: &str, body: serde_json::Value) -> anyhow::Result<()> {
        let (client, topics) = self.parts()?;
        let payload = serde_json::to_vec(&body)?;
        client.publish(topics.command(node_id, cmd), QoS::AtMostOnce, true, payload).await?;
        METRICS.commands_sent.with_label_values(&[cmd]).inc();
        Ok(())
    }
}

/// What the event loop needs to dispatch messages.
struct Dispatcher {
    topics: Topics,
    client: AsyncClient,
    callbacks: Arc<RwLock<Option<Arc<dyn TunnelCallbacks>>>>,
    query: Arc<RwLock<Option<QueryBaseline>>>,
    owned: Arc<Mutex<HashSet<String>>>,
}

fn drop_message(topic: &str, err: &MessageError) {
    let reason = match err {
        MessageError::Malformed(_) => "malformed",
        MessageError::Stale { .. } => "stale",
    };
    METRICS.messages_dropped.with_label_values(&[reason]).inc();
    tracing::warn!(%topic, error = %err, "dropping tunnel message");
}

impl Dispatcher {
    fn callbacks(&self) -> Option<Arc<dyn TunnelCallbacks>> {
        self.callbacks.read().ok().and_then(|c| c.clone())
    }

    fn is_owned(&self, id: &str) -> bool {
        self.owned.lock().map(|o| o.contains(id)).unwrap_or(false)
    }

    async fn dispatch(&self, topic: &str, payload: &[u8]) {
        let Some((id, kind)) = self.topics.parse(topic) else {
            tracing::debug!(%topic, "ignoring message on a foreign topic");
            return;
        };
        let Some(kind) = kind.strip_prefix("base/") else { return };
        METRICS.messages_received.with_label_values(&[kind]).inc();
        let now = now_ms();
        let Some(cb) = self.callbacks() else { return };
        match kind {
            "heart" => match open_envelope::<HeartbeatData>(payload, now) {
                Ok(hb) => match mapping::heartbeat_to_node_info(&hb) {
                    Some(info) => cb.on_node_discovered(id, info),
                    None => drop_message(topic, &MessageError::Malformed("heartbeat without identity".into())),
                },
                Err(e) => drop_message(topic, &e),
            },
            "queryBaseline" => match open_envelope::<BaseMetadata>(payload, now) {
                Ok(meta) => self.answer_baseline(id, meta).await,
                Err(e) => drop_message(topic, &e),
            },
            _ if !self.is_owned(id) => {
                METRICS.messages_dropped.with_label_values(&["unowned"]).inc();
            }
            "health" => match open_envelope::<HealthResponse>(payload, now) {
                Ok(h) => match mapping::health_to_status(&h) {
                    Some(data) => cb.on_node_status(id, data),
                    None => tracing::warn!(%topic, code = %h.code, "base health query failed"),
                },
                Err(e) => drop_message(topic, &e),
            },
            "simpleBiz" | "biz" => match open_envelope::<SimpleBizData>(payload, now) {
                Ok(list) => cb.on_all_container_status(id, mapping::simple_biz_to_statuses(&list.into_vec())),
                Err(e) => drop_message(topic, &e),
            },
            "bizOperation" => match open_envelope::<BizOperationResponse>(payload, now) {
                Ok(op) => {
                    let resp = mapping::op_response(&op);
                    match op.command.as_str() {
                        CMD_INSTALL_BIZ => cb.on_start_container_response(id, resp),
                        CMD_UNINSTALL_BIZ => cb.on_shutdown_container_response(id, resp),
                        other => tracing::debug!(command = %other, "ignoring biz operation result"),
                    }
                }
                Err(e) => drop_message(topic, &e),
            },
            "batchInstallBizResponse" => match open_envelope::<Vec<BizOperationResponse>>(payload, now) {
                Ok(ops) => {
                    tracing::info!(base = %id, modules = ops.len(), "base installed its baseline");
                    for op in ops {
                        cb.on_start_container_response(id, mapping::op_response(&op));
                    }
                }
                Err(e) => drop_message(topic, &e),
            },
            other => tracing::debug!(kind = %other, "ignoring base message"),
        }
    }

    async fn answer_baseline(&self, id: &str, meta: BaseMetadata) {
        let Some(query) = self.query.read().ok().and_then(|q| q.clone()) else { return };
        let req = QueryBaselineRequest {
            identity: id.to_string(),
            name: meta.name,
            version: meta.version,
            cluster_name: meta.cluster_name,
        };
        let baseline: Vec<BizModel> = query(req).iter().map(mapping::biz_model).collect();
        if let Some(cb) = self.callbacks() {
            cb.on_baseline_sent(id, baseline.iter().map(|b| b.key()).collect());
        }
        let body = match serde_json::to_vec(&baseline) {
            Ok(b) => b,
            Err(e) => return tracing::error!(error = %e, "encoding baseline"),
        };
        if let Err(e) = self.client.publish(self.topics.base(id, "baseline"), QoS::AtLeastOnce, false, body).await {
            tracing::warn!(error = %e, base = %id, "publishing baseline");
        }
    }

    async fn subscribe_all(&self) {
        let mut filters = vec![
            SubscribeFilter::new(self.topics.heart_all(), QoS::AtLeastOnce),
            SubscribeFilter::new(self.topics.query_baseline_all(), QoS::AtLeastOnce),
        ];
        let owned: Vec<String> = self.owned.lock().map(|o| o.iter().cloned().collect()).unwrap_or_default();
        for id in owned {
            filters.extend(
                self.topics.per_base_subscriptions(&id).into_iter().map(|t| SubscribeFilter::new(t, QoS::AtLeastOnce)),
            );
        }
        for chunk in filters.chunks(500) {
            if let Err(e) = self.client.subscribe_many(chunk.to_vec()).await {
                tracing::error!(error = %e, "MQTT subscribe failed");
            }
        }
    }
}

#[async_trait::async_trait]
impl Tunnel for MqttTunnel {
    fn key(&self) -> &str {
        MQTT_TUNNEL_KEY
    }

    async fn start(&self, client_id: &str, env: &str) -> anyhow::Result<()> {
        let topics = Topics::new(env);
        let (client, mut eventloop) =
            AsyncClient::new(self.config.options(&format!("module-controller-{client_id}")), 100_000);
        let _ = self.topics.set(topics.clone());
        let _ = self.client.set(client.clone());
        let dispatcher = Arc::new(Dispatcher {
            topics,
            client,
            callbacks: self.callbacks.clone(),
            query: self.query.clone(),
            owned: self.owned.clone(),
        });
        let ready = self.ready.clone();
        let broker = format!("{}:{}", self.config.host, self.config.port);
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        tracing::info!(%broker, "connected to the MQTT broker");
                        ready.store(true, Ordering::SeqCst);
                        let d = dispatcher.clone();
                        tokio::spawn(async move { d.subscribe_all().await });
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        dispatcher.dispatch(&p.topic, &p.payload).await;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        ready.store(false, Ordering::SeqCst);
                        tracing::warn!(%broker, error = %e, "MQTT connection error; reconnecting");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
        Ok(())
    }

    fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    fn register_callbacks(&self, callbacks: Arc<dyn TunnelCallbacks>) {
        if let Ok(mut c) = self.callbacks.write() {
            *c = Some(callbacks);
        }
    }

    fn register_query(&self, query: QueryBaseline) {
        if let Ok(mut q) = self.query.write() {
            *q = Some(query);
        }
    }

    async fn on_node_start(&self, node_id: &str) {
        if let Ok(mut o) = self.owned.lock() {
            o.insert(node_id.to_string());
        }
        let Ok((client, topics)) = self.parts() else { return };
        let filters =
            topics.per_base_subscriptions(node_id).into_iter().map(|t| SubscribeFilter::new(t, QoS::AtLeastOnce));
        if let Err(e) = client.subscribe_many(filters).await {
            tracing::warn!(error = %e, base = %node_id, "subscribing to base topics");
        }
    }

    async fn on_node_stop(&self, node_id: &str) {
        if let Ok(mut o) = self.owned.lock() {
            o.remove(node_id);
        }
        let Ok((client, topics)) = self.parts() else { return };
        for t in topics.per_base_subscriptions(node_id) {
            let _ = client.unsubscribe(t).await;
        }
    }

    async fn fetch_health_data(&self, node_id: &str) -> anyhow::Result<()> {
        self.command(node_id, CMD_HEALTH, serde_json::json!({})).await
    }

    async fn query_all_container_status(&self, node_id: &str) -> anyhow::Result<()> {
        self.command(node_id, CMD_QUERY_ALL_BIZ, serde_json::json!({})).await
    }

    async fn start_container(&self, node_id: &str, _pod_key: &str, container: &Container) -> anyhow::Result<()> {
        self.command(node_id, CMD_INSTALL_BIZ, serde_json::to_value(mapping::biz_model(container))?).await
    }

    async fn shutdown_container(&self, node_id: &str, _pod_key: &str, container: &Container) -> anyhow::Result<()> {
        self.command(node_id, CMD_UNINSTALL_BIZ, serde_json::to_value(mapping::biz_model(container))?).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        mqtt: MqttArgs,
    }

    #[test]
    fn the_password_comes_from_a_flag_or_the_first_line_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret\n").unwrap();
        let f = Flags::parse_from(["x", "--mqtt-username", "minik8s", "--mqtt-password-file", file.to_str().unwrap()]);
        let cfg = f.mqtt.config("127.0.0.1:1883").unwrap();
        assert_eq!((cfg.username.as_deref(), cfg.password.as_deref()), (Some("minik8s"), Some("s3cret")));
        let missing = Flags::parse_from(["x", "--mqtt-password-file", "/nonexistent/password"]);
        let err = missing.mqtt.config("127.0.0.1:1883").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("--mqtt-password-file /nonexistent/password"), "{err}");
        assert!(Flags::try_parse_from(["x", "--mqtt-password", "a", "--mqtt-password-file", "b"]).is_err());
    }

    #[test]
    fn broker_address_parses() {
        let c = MqttConfig::parse("127.0.0.1:1884").unwrap();
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 1884));
        assert_eq!(MqttConfig::parse("broker").unwrap().port, 1883);
        assert!(MqttConfig::parse(":1883").is_err());
        assert!(MqttConfig::parse("h:x").is_err());
    }
}
