//! Health checks for load balancers, as kube-proxy answers them.
//!
//! - Per Service: a LoadBalancer with `externalTrafficPolicy: Local` has a
//!   `healthCheckNodePort`; on that port (every node address, or the `--nodeport-addresses`
//!   ones) any HTTP request is answered with how many ready endpoints of the Service run on
//!   this node: 200 when there is one, 503 otherwise, so the load balancer sends traffic
//!   only to nodes that can serve it without leaving the node. The JSON is kube-proxy's,
//!   byte for byte.
//! - The proxy's own `/healthz` and `/livez` (`--healthz-bind-address`): healthy unless a
//!   change of Services or endpoints has waited longer than twice `--iptables-sync-period`
//!   for its rules; `/healthz` also says whether the node is eligible for load balancer
//!   traffic (not being deleted, no `ToBeDeletedByClusterAutoscaler` taint).
//!
//! What to listen on and what to answer are pure functions ([`services`],
//! [`listener_changes`], [`service_response`], [`HealthState`]); [`ServiceHealthServer`]
//! and [`serve_proxy_health`] are the tokio shells around them.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime};

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::oneshot;

use crate::model::ServicePort;

/// A Service's namespace and name.
pub type ServiceName = (String, String);

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// What one Service's health check serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceHealth {
    /// Its `healthCheckNodePort`.
    pub port: u16,
    /// Its ready endpoints on this node (distinct `ip:port` over all its ports).
    pub local_endpoints: usize,
}

/// The Services that want a health check, from the proxy's service ports.
pub fn services<P: std::borrow::Borrow<ServicePort>>(ports: &[P]) -> BTreeMap<ServiceName, ServiceHealth> {
    let mut endpoints: BTreeMap<ServiceName, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for sp in ports.iter().map(std::borrow::Borrow::borrow) {
        let Some(port) = sp.health_check_node_port else { continue };
        let name = (sp.name.namespace.clone(), sp.name.name.clone());
        let local = endpoints.entry(name.clone()).or_default();
        local.extend(sp.all_endpoints.iter().filter(|e| e.local && e.ready).map(|e| e.addr()));
        out.entry(name).or_insert(ServiceHealth { port, local_endpoints: 0 });
    }
    for (name, health) in &mut out {
        health.local_endpoints = endpoints.get(name).map_or(0, |e| e.len());
    }
    out
}

/// The listeners to close and to open to go from `open` (Service → port listened on) to
/// `wanted`. A Service whose port changed is closed and opened again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenerChanges {
    pub close: Vec<ServiceName>,
    pub open: Vec<(ServiceName, u16)>,
}

pub fn listener_changes(
    open: &BTreeMap<ServiceName, u16>,
    wanted: &BTreeMap<ServiceName, ServiceHealth>,
) -> ListenerChanges {
    let close = open
        .iter()
        .filter(|(name, port)| wanted.get(*name).is_none_or(|w| w.port != **port))
        .map(|(name, _)| name.clone())
        .collect();
    let opened = wanted
        .iter()
        .filter(|(name, w)| open.get(*name) != Some(&w.port))
        .map(|(name, w)| (name.clone(), w.port))
        .collect();
    ListenerChanges { close, open: opened }
}

/// A Service's health check answer: 200 with local endpoints and a healthy proxy, else 503.
pub fn service_response(name: &ServiceName, local_endpoints: usize, proxy_healthy: bool) -> (StatusCode, String) {
    let code = if local_endpoints > 0 && proxy_healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {proxy_healthy}\n}}",
        quote(&name.0),
        quote(&name.1),
    );
    (code, body)
}

/// A moment as the health state keeps it: wall clock for showing, monotonic for measuring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub wall: SystemTime,
    /// Since this process started (Go's monotonic clock reading).
    pub since_start: Duration,
}

impl Stamp {
    pub fn now() -> Stamp {
        static START: OnceLock<Instant> = OnceLock::new();
        let start = *START.get_or_init(Instant::now);
        Stamp { wall: SystemTime::now(), since_start: start.elapsed() }
    }
}

/// The proxy's health: when its rules were last brought up to date, the oldest change not
/// yet applied, and whether its node takes load balancer traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthState {
    pub last_updated: Option<Stamp>,
    pub oldest_queued: Option<Stamp>,
    pub node_eligible: bool,
}

impl Default for HealthState {
    /// Eligible until the Node says otherwise, as kube-proxy starts.
    fn default() -> Self {
        HealthState { last_updated: None, oldest_queued: None, node_eligible: true }
    }
}

impl HealthState {
    /// A change arrived that the rules do not have yet.
    pub fn queued(&mut self, now: Stamp) {
        self.oldest_queued.get_or_insert(now);
    }

    /// The rules were brought up to date.
    pub fn updated(&mut self, now: Stamp) {
        self.oldest_queued = None;
        self.last_updated = Some(now);
    }

    /// Healthy unless a change has waited `timeout` or longer since the rules were first
    /// written; with the time of the last update.
    pub fn healthy(&self, now: Stamp, timeout: Duration) -> (bool, Option<Stamp>) {
        let late = self.last_updated.is_some()
            && self.oldest_queued.is_some_and(|q| now.since_start.saturating_sub(q.since_start) >= timeout);
        (!late, self.last_updated)
    }

    /// `/healthz`: the proxy healthy and the node eligible.
    pub fn healthz(&self, now: Stamp, timeout: Duration) -> (StatusCode, String) {
        let (healthy, last) = self.healthy(now, timeout);
        let healthy = healthy && self.node_eligible;
        // A healthy answer reports "now" as the last update, as kube-proxy does.
        let (code, last) = if healthy { (StatusCode::OK, Some(now)) } else { (StatusCode::SERVICE_UNAVAILABLE, last) };
        let body = format!(
            "{{\"lastUpdated\": \"{}\",\"currentTime\": \"{}\", \"nodeEligible\": {}}}",
            go_time(last),
            go_time(Some(now)),
            self.node_eligible
        );
        (code, body)
    }

    /// `/livez`: the proxy healthy, whatever the node.
    pub fn livez(&self, now: Stamp, timeout: Duration) -> (StatusCode, String) {
        let (healthy, last) = self.healthy(now, timeout);
        let (code, last) = if healthy { (StatusCode::OK, Some(now)) } else { (StatusCode::SERVICE_UNAVAILABLE, last) };
        (code, format!("{{\"lastUpdated\": \"{}\",\"currentTime\": \"{}\"}}", go_time(last), go_time(Some(now))))
    }
}

/// A time as kube-proxy prints one (Go's `Time.String()` in UTC: fraction without trailing
/// zeros, then the monotonic reading); `None` is Go's zero time.
pub fn go_time(t: Option<Stamp>) -> String {
    let Some(t) = t else { return "0001-01-01 00:00:00 +0000 UTC".into() };
    let wall = match jiff::Timestamp::try_from(t.wall) {
        Ok(ts) => ts.to_zoned(jiff::tz::TimeZone::UTC),
        Err(_) => return "0001-01-01 00:00:00 +0000 UTC".into(),
    };
    let mut s = format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        wall.year(),
        wall.month(),
        wall.day(),
        wall.hour(),
        wall.minute(),
        wall.second()
    );
    let nanos = wall.subsec_nanosecond();
    if nanos > 0 {
        let frac = format!("{nanos:09}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push_str(" +0000 UTC");
    s.push_str(&format!(" m=+{}.{:09}", t.since_start.as_secs(), t.since_start.subsec_nanos()));
    s
}

/// Whether `node` takes load balancer traffic: not being deleted, not marked for deletion
/// by the cluster autoscaler.
pub fn node_eligible(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && !node.spec.iter().flat_map(|s| s.taints.iter().flatten()).any(|t| t.key == TO_BE_DELETED_TAINT)
}

/// Follow this node's Node object into `health`'s eligibility until the process ends.
pub async fn watch_node(client: kube::Client, node: String, health: Arc<ProxyHealth>) {
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};
    let api: kube::Api<Node> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => health.set_node_eligible(node_eligible(&n)),
            Ok(watcher::Event::Delete(_)) => health.set_node_eligible(false),
            Ok(_) => {}
            Err(e) => tracing::warn!(node = %node, error = %e, "node watch failed; retrying"),
        }
    }
}

/// The shared health state with its timeout (twice `--iptables-sync-period`, as kube-proxy).
#[derive(Debug)]
pub struct ProxyHealth {
    state: Mutex<HealthState>,
    timeout: Duration,
}

impl ProxyHealth {
    pub fn new(timeout: Duration) -> Arc<ProxyHealth> {
        Arc::new(ProxyHealth { state: Mutex::new(HealthState::default()), timeout })
    }

    fn with<T>(&self, f: impl FnOnce(&mut HealthState) -> T) -> T {
        let mut guard = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut guard)
    }

    pub fn queued(&self) {
        self.with(|s| s.queued(Stamp::now()))
    }
    pub fn updated(&self) {
        self.with(|s| s.updated(Stamp::now()))
    }
    pub fn set_node_eligible(&self, eligible: bool) {
        self.with(|s| s.node_eligible = eligible)
    }
    /// Whether the proxy is healthy, whatever the node (a Service health check's
    /// `serviceProxyHealthy`).
    pub fn is_healthy(&self) -> bool {
        self.with(|s| s.healthy(Stamp::now(), self.timeout).0)
    }
    fn healthz(&self) -> (StatusCode, String) {
        self.with(|s| s.healthz(Stamp::now(), self.timeout))
    }
    fn livez(&self) -> (StatusCode, String) {
        self.with(|s| s.livez(Stamp::now(), self.timeout))
    }
}

/// A JSON answer with kube-proxy's headers.
fn json_response((code, body): (StatusCode, String)) -> Response {
    let mut r = (code, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    r
}

/// The proxy's `/healthz` and `/livez`; every other path goes to `others` (what else is
/// served on that address, whose own `/healthz` and `/livez` these replace).
pub fn proxy_health_router(health: Arc<ProxyHealth>, others: Router) -> Router {
    let h = health.clone();
    Router::new()
        .route("/healthz", get(move || std::future::ready(json_response(h.healthz()))))
        .route("/livez", get(move || std::future::ready(json_response(health.livez()))))
        .fallback_service(others)
}

/// Serve `router` on `addr` in the background; the address bound.
pub async fn serve(addr: SocketAddr, router: Router) -> anyhow::Result<SocketAddr> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    tokio::spawn(common::serve::serve(listener, router, std::future::pending(), common::serve::IDLE_TIMEOUT));
    Ok(bound)
}

/// One Service's open health check: its port and how to stop its servers.
struct Listener {
    port: u16,
    /// Dropping these stops the servers (one per bind address).
    _stop: Vec<oneshot::Sender<()>>,
}

/// The Service health checks of this node: listeners opened and closed as Services come
/// and go, answering from the latest endpoint counts.
pub struct ServiceHealthServer {
    bind_ips: Vec<IpAddr>,
    proxy: Arc<ProxyHealth>,
    counts: Arc<RwLock<BTreeMap<ServiceName, usize>>>,
    listeners: BTreeMap<ServiceName, Listener>,
}

impl ServiceHealthServer {
    /// Listening on `bind_ips` (empty: every address).
    pub fn new(bind_ips: Vec<IpAddr>, proxy: Arc<ProxyHealth>) -> ServiceHealthServer {
        let bind_ips = if bind_ips.is_empty() { vec![IpAddr::from([0, 0, 0, 0])] } else { bind_ips };
        ServiceHealthServer { bind_ips, proxy, counts: Default::default(), listeners: BTreeMap::new() }
    }

    /// Make the listeners and counts match `wanted`. A port that cannot be opened is
    /// logged and tried again at the next sync.
    pub async fn sync(&mut self, wanted: &BTreeMap<ServiceName, ServiceHealth>) {
        let open: BTreeMap<ServiceName, u16> = self.listeners.iter().map(|(n, l)| (n.clone(), l.port)).collect();
        let changes = listener_changes(&open, wanted);
        for name in changes.close {
            if let Some(l) = self.listeners.remove(&name) {
                tracing::info!(service = %format!("{}/{}", name.0, name.1), port = l.port, "closing health check");
            }
        }
        {
            let mut counts = self.counts.write().unwrap_or_else(|poisoned| poisoned.into_inner());
            *counts = wanted.iter().map(|(n, h)| (n.clone(), h.local_endpoints)).collect();
        }
        for (name, port) in changes.open {
            let shown = format!("{}/{}", name.0, name.1);
            match self.open(&name, port).await {
                Ok(stop) => {
                    tracing::info!(service = %shown, port, "opened health check");
                    self.listeners.insert(name, Listener { port, _stop: stop });
                }
                Err(e) => {
                    tracing::error!(service = %shown, port, error = %format!("{e:#}"), "failed to start health check")
                }
            }
        }
    }

    async fn open(&self, name: &ServiceName, port: u16) -> anyhow::Result<Vec<oneshot::Sender<()>>> {
        let mut listeners = Vec::new();
        for ip in &self.bind_ips {
            // All or none: a failure drops the ones already bound.
            listeners.push(tokio::net::TcpListener::bind(SocketAddr::new(*ip, port)).await?);
        }
        let (counts, proxy, name) = (self.counts.clone(), self.proxy.clone(), name.clone());
        let router = Router::new().fallback(move || {
            let n = counts.read().map(|c| c.get(&name).copied().unwrap_or(0)).unwrap_or(0);
            std::future::ready(json_response(service_response(&name, n, proxy.is_healthy())))
        });
        let mut stops = Vec::new();
        for listener in listeners {
            let (stop, stopped) = oneshot::channel::<()>();
            let shutdown = async move {
                let _ = stopped.await;
            };
            tokio::spawn(common::serve::serve(listener, router.clone(), shutdown, common::serve::IDLE_TIMEOUT));
            stops.push(stop);
        }
        Ok(stops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{slice, svc};
    use crate::model::{service_ports, NodeInfo};
    use serde_json::json;

    fn name(n: &str) -> ServiceName {
        ("default".into(), n.into())
    }

    fn at(secs: u64) -> Stamp {
        Stamp {
            wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs),
            since_start: Duration::from_secs(secs),
        }
    }

    #[test]
    fn only_local_load_balancers_have_health_checks_counting_ready_endpoints_here() {
        let lb = |n: &str, policy: &str| {
            svc(json!({"metadata": {"name": n, "namespace": "default"},
                "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.40", "externalTrafficPolicy": policy,
                         "healthCheckNodePort": 32000,
                         "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]}}))
        };
        let sl = slice(json!({"metadata": {"name": "web-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"}}, "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "nodeName": "node-a"},
                {"addresses": ["10.0.0.2"], "nodeName": "node-a", "conditions": {"ready": false}},
                {"addresses": ["10.0.0.3"], "nodeName": "node-b"}],
            "ports": [{"name": "http", "port": 8080}, {"name": "https", "port": 8443}]}));
        let ports = service_ports(&[lb("web", "Local"), lb("other", "Cluster")], &[sl], &NodeInfo::named("node-a"));
        let s = services(&ports);
        assert_eq!(s.len(), 1, "{s:?}");
        // One pod here, two ports: 10.0.0.1:8080 and 10.0.0.1:8443, as kube-proxy counts.
        assert_eq!(s[&name("web")], ServiceHealth { port: 32000, local_endpoints: 2 });
        let none = services(&service_ports(&[lb("web", "Local")], &[], &NodeInfo::named("node-a")));
        assert_eq!(none[&name("web")].local_endpoints, 0);
    }

    #[test]
    fn listeners_open_and_close_with_their_services_and_ports() {
        let wanted = |v: &[(&str, u16)]| -> BTreeMap<ServiceName, ServiceHealth> {
            v.iter().map(|(n, p)| (name(n), ServiceHealth { port: *p, local_endpoints: 1 })).collect()
        };
        let open: BTreeMap<ServiceName, u16> = [(name("a"), 32000), (name("b"), 32001)].into();
        let c = listener_changes(&open, &wanted(&[("a", 32000), ("b", 32005), ("c", 32002)]));
        assert_eq!(c.close, [name("b")]);
        assert_eq!(c.open, [(name("b"), 32005), (name("c"), 32002)]);
        assert_eq!(listener_changes(&open, &wanted(&[("a", 32000), ("b", 32001)])), ListenerChanges::default());
        assert_eq!(listener_changes(&open, &BTreeMap::new()).close, [name("a"), name("b")]);
    }

    #[test]
    fn service_answers_are_kube_proxys() {
        let (code, body) = service_response(&("ns".into(), "web".into()), 1, true);
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": true\n}"
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v,
            json!({"service": {"namespace": "ns", "name": "web"}, "localEndpoints": 1, "serviceProxyHealthy": true})
        );
        assert_eq!(service_response(&name("web"), 0, true).0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(service_response(&name("web"), 3, false).0, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn proxy_health_turns_bad_only_when_a_change_waits_too_long() {
        let timeout = Duration::from_secs(60);
        let mut s = HealthState::default();
        assert!(s.healthy(at(0), timeout).0, "healthy while starting");
        s.updated(at(1));
        s.queued(at(10));
        s.queued(at(20));
        assert!(s.healthy(at(69), timeout).0, "the oldest change counts, and it is not late yet");
        let (ok, last) = s.healthy(at(70), timeout);
        assert!(!ok);
        assert_eq!(last, Some(at(1)));
        let (code, body) = s.livez(at(70), timeout);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.starts_with("{\"lastUpdated\": \"2023-11-14 22:13:21 +0000 UTC m=+1.000000000\",\"currentTime\": "),
            "{body}"
        );
        s.updated(at(71));
        assert!(s.healthy(at(500), timeout).0, "nothing waiting");
    }

    #[test]
    fn healthz_reports_node_eligibility_and_answers_503_for_an_ineligible_node() {
        let timeout = Duration::from_secs(60);
        let mut s = HealthState::default();
        s.updated(at(0));
        let (code, body) = s.healthz(at(5), timeout);
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            body,
            "{\"lastUpdated\": \"2023-11-14 22:13:25 +0000 UTC m=+5.000000000\",\"currentTime\": \"2023-11-14 22:13:25 +0000 UTC m=+5.000000000\", \"nodeEligible\": true}"
        );
        s.node_eligible = false;
        let (code, body) = s.healthz(at(5), timeout);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("\"lastUpdated\": \"2023-11-14 22:13:20 +0000 UTC m=+0.000000000\""), "{body}");
        assert!(body.ends_with("\"nodeEligible\": false}"));
        assert_eq!(s.livez(at(5), timeout).0, StatusCode::OK, "livez ignores the node");
    }

    #[test]
    fn go_time_strings() {
        assert_eq!(go_time(None), "0001-01-01 00:00:00 +0000 UTC");
        let t = Stamp {
            wall: SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 120_000_000),
            since_start: Duration::new(75, 5),
        };
        assert_eq!(go_time(Some(t)), "2023-11-14 22:13:20.12 +0000 UTC m=+75.000000005");
    }

    #[test]
    fn nodes_being_deleted_or_marked_by_the_autoscaler_are_not_eligible() {
        let node = |v: serde_json::Value| -> Node { serde_json::from_value(v).unwrap() };
        assert!(node_eligible(&node(json!({"metadata": {"name": "n"}}))));
        assert!(!node_eligible(&node(json!({"metadata": {"name": "n", "deletionTimestamp": "2024-01-01T00:00:00Z"}}))));
        assert!(!node_eligible(&node(json!({"metadata": {"name": "n"},
            "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}}))));
        assert!(node_eligible(&node(json!({"metadata": {"name": "n"},
            "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}}))));
    }

    /// One HTTP/1.0 GET to `addr`: the raw answer.
    async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn the_proxy_health_address_answers_its_own_healthz_and_passes_the_rest_on() {
        let health = ProxyHealth::new(Duration::from_secs(60));
        health.updated();
        let others = Router::new().route("/readyz", get(|| async { "ok" }));
        let addr = serve("127.0.0.1:0".parse().unwrap(), proxy_health_router(health, others)).await.unwrap();
        let healthz = http_get(addr, "/healthz").await.unwrap();
        assert!(healthz.starts_with("HTTP/1.0 200") || healthz.starts_with("HTTP/1.1 200"), "{healthz}");
        assert!(healthz.to_ascii_lowercase().contains("content-type: application/json"), "{healthz}");
        assert!(healthz.contains("\"nodeEligible\": true}"), "{healthz}");
        assert!(http_get(addr, "/livez").await.unwrap().contains("\"currentTime\""));
        assert!(http_get(addr, "/readyz").await.unwrap().ends_with("ok"));
    }

    #[tokio::test]
    async fn service_health_listeners_follow_sync() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let health = ProxyHealth::new(Duration::from_secs(60));
        let mut server = ServiceHealthServer::new(vec![addr.ip()], health);
        let wanted = |n| -> BTreeMap<ServiceName, ServiceHealth> {
            [(name("web"), ServiceHealth { port, local_endpoints: n })].into()
        };
        server.sync(&wanted(0)).await;
        let answer = http_get(addr, "/any/path").await.unwrap();
        assert!(answer.contains(" 503 "), "{answer}");
        assert!(answer.to_ascii_lowercase().contains("x-content-type-options: nosniff"), "{answer}");
        assert!(answer.contains("\"localEndpoints\": 0"), "{answer}");
        server.sync(&wanted(2)).await;
        let answer = http_get(addr, "/").await.unwrap();
        assert!(answer.contains(" 200 ") && answer.contains("\"localEndpoints\": 2"), "{answer}");
        server.sync(&BTreeMap::new()).await;
        let mut closed = false;
        for _ in 0..50 {
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                closed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(closed, "the listener is closed with its Service");
        // And opened again on the same port.
        server.sync(&wanted(1)).await;
        assert!(http_get(addr, "/").await.unwrap().contains(" 200 "));
    }
}
