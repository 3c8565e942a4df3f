//! The xDS client: one ADS stream (state of the world) to the control plane.
//!
//! [`Ads`] is the protocol's state, pure: it takes each `DiscoveryResponse`, decides whether
//! to accept it (a new [`Snapshot`] from `config::build`) or reject it, and returns the
//! requests to send: the ACK or NACK, then any subscription the update changed (EDS names
//! after CDS, RDS names after LDS), in Envoy's order CDS, EDS, LDS, RDS. [`run`] is the I/O
//! around it: it connects, reconnects with backoff, and swaps the snapshot in; a lost
//! stream changes nothing in force, so restarting the control plane never interrupts traffic.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status;

use crate::config::{self, Resources, Snapshot};

pub const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

/// google.rpc.Code INVALID_ARGUMENT.
const INVALID_ARGUMENT: i32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Cds,
    Eds,
    Lds,
    Rds,
}

impl Type {
    pub const ALL: [Type; 4] = [Type::Cds, Type::Eds, Type::Lds, Type::Rds];

    pub fn url(self) -> &'static str {
        match self {
            Type::Cds => CDS,
            Type::Eds => EDS,
            Type::Lds => LDS,
            Type::Rds => RDS,
        }
    }

    pub fn from_url(url: &str) -> Option<Type> {
        Type::ALL.into_iter().find(|t| t.url() == url)
    }

    pub fn short(self) -> &'static str {
        match self {
            Type::Cds => "cds",
            Type::Eds => "eds",
            Type::Lds => "lds",
            Type::Rds => "rds",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Per type: what was last accepted and what is subscribed.
#[derive(Debug, Default, Clone)]
struct TypeState {
    /// The version of the last accepted response.
    version: String,
    /// The nonce of the last response (accepted or not).
    nonce: String,
    /// Whether a request for this type was sent on this stream.
    requested: bool,
    /// Whether a response of this type was ever accepted.
    acked: bool,
    /// Subscribed resource names (EDS and RDS; CDS and LDS subscribe to all).
    names: Vec<String>,
}

/// What handling a response produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Requests to send, in order.
    pub requests: Vec<DiscoveryRequest>,
    /// The new configuration, when the response was accepted.
    pub snapshot: Option<Snapshot>,
    /// The error, when it was rejected.
    pub rejected: Option<String>,
}

#[derive(Debug)]
pub struct Ads {
    node: Node,
    pub resources: Resources,
    types: [TypeState; 4],
    /// When CDS and LDS were first both accepted: the start of the wait for the endpoints and
    /// route configurations they name.
    warming_since: Option<Instant>,
}

/// How long readiness waits for the endpoints and route configurations the clusters and
/// listeners name (Envoy's `initial_fetch_timeout`, 15 s by default): a control plane that
/// never sends one does not keep the pod unready for ever.
pub const INITIAL_FETCH_TIMEOUT: Duration = Duration::from_secs(15);

impl Ads {
    pub fn new(node: Node) -> Ads {
        Ads { node, resources: Resources::default(), types: Default::default(), warming_since: None }
    }

    /// Whether the sidecar can carry traffic, as Envoy's initialization decides it: CDS and
    /// LDS accepted, and every cluster's endpoints (EDS) and every listener's route
    /// configuration (RDS) received — or [`INITIAL_FETCH_TIMEOUT`] passed since CDS and LDS
    /// were. A listener whose routes have not arrived answers 404 (no route), so a pod marked
    /// ready before that fails its first requests.
    pub fn ready(&self, now: Instant) -> bool {
        let Some(since) = self.warming_since else { return false };
        self.warm() || now.duration_since(since) >= INITIAL_FETCH_TIMEOUT
    }

    /// When [`Ads::ready`] turns true by itself if nothing arrives before: the end of the
    /// initial fetch timeout while warming.
    pub fn ready_deadline(&self) -> Option<Instant> {
        match self.warming_since {
            Some(since) if !self.warm() => Some(since + INITIAL_FETCH_TIMEOUT),
            _ => None,
        }
    }

    /// Every subscribed EDS and RDS name has arrived.
    fn warm(&self) -> bool {
        let eds = &self.types[Type::Eds.index()].names;
        let rds = &self.types[Type::Rds.index()].names;
        eds.iter().all(|n| self.resources.endpoints.contains_key(n))
            && rds.iter().all(|n| self.resources.routes.contains_key(n))
    }

    fn request(&self, t: Type) -> DiscoveryRequest {
        let s = &self.types[t.index()];
        DiscoveryRequest {
            version_info: s.version.clone(),
            node: Some(self.node.clone()),
            resource_names: s.names.clone(),
            type_url: t.url().to_string(),
            response_nonce: s.nonce.clone(),
            ..Default::default()
        }
    }

    /// The requests that open a (re)connected stream: CDS, then the subscriptions already
    /// known (EDS, LDS, RDS) with the versions in force, so the control plane can tell what
    /// the sidecar already has.
    pub fn open(&mut self) -> Vec<DiscoveryRequest> {
        let mut out = Vec::new();
        for t in Type::ALL {
            let s = &mut self.types[t.index()];
            s.nonce.clear();
            s.requested = false;
            let wanted = match t {
                Type::Cds => true,
                Type::Eds | Type::Rds => !s.names.is_empty(),
                Type::Lds => s.acked,
            };
            if wanted {
                s.requested = true;
                out.push(self.request(t));
            }
        }
        out
    }

    /// Handle one response; `current` is the snapshot in force (its runtime state carries over).
    pub fn handle(&mut self, resp: DiscoveryResponse, current: Option<&Snapshot>) -> Outcome {
        let Some(t) = Type::from_url(&resp.type_url) else {
            tracing::warn!(type_url = %resp.type_url, "ignoring a response of a type never requested");
            return Outcome::default();
        };
        self.types[t.index()].nonce = resp.nonce.clone();
        let candidate = match self.candidate(t, &resp.resources) {
            Ok(c) => c,
            Err(e) => return self.nack(t, e),
        };
        let snapshot = match config::build(&candidate, current) {
            Ok(s) => s,
            Err(e) => return self.nack(t, e.to_string()),
        };
        self.resources = candidate;
        let s = &mut self.types[t.index()];
        s.version = resp.version_info;
        s.acked = true;
        let mut requests = vec![self.request(t)];
        match t {
            Type::Cds => {
                requests.extend(self.subscribe(Type::Eds, config::eds_names(&self.resources.clusters)));
                if !self.types[Type::Lds.index()].requested {
                    self.types[Type::Lds.index()].requested = true;
                    requests.push(self.request(Type::Lds));
                }
            }
            Type::Lds => requests.extend(self.subscribe(Type::Rds, config::rds_names(&self.resources.listeners))),
            Type::Eds | Type::Rds => {}
        }
        if self.warming_since.is_none() && self.types[Type::Cds.index()].acked && self.types[Type::Lds.index()].acked {
            self.warming_since = Some(Instant::now());
        }
        Outcome { requests, snapshot: Some(snapshot), rejected: None }
    }

    /// A request for `t` when its subscription changes to `names`.
    fn subscribe(&mut self, t: Type, names: Vec<String>) -> Option<DiscoveryRequest> {
        let s = &mut self.types[t.index()];
        if s.names == names && (s.requested || names.is_empty()) {
            return None;
        }
        s.names = names;
        // Resources no longer subscribed are dropped.
        match t {
            Type::Eds => {
                let keep = &self.types[t.index()].names;
                self.resources.endpoints.retain(|k, _| keep.contains(k));
            }
            Type::Rds => {
                let keep = &self.types[t.index()].names;
                self.resources.routes.retain(|k, _| keep.contains(k));
            }
            _ => {}
        }
        let s = &mut self.types[t.index()];
        if s.names.is_empty() && !s.requested {
            return None;
        }
        s.requested = true;
        Some(self.request(t))
    }

    fn nack(&mut self, t: Type, message: String) -> Outcome {
        let mut req = self.request(t);
        req.error_detail = Some(Status { code: INVALID_ARGUMENT, message: message.clone(), details: Vec::new() });
        Outcome { requests: vec![req], snapshot: None, rejected: Some(message) }
    }

    /// The resources with type `t` replaced by (CDS, LDS) or updated with (EDS, RDS) `items`.
    fn candidate(&self, t: Type, items: &[Any]) -> Result<Resources, String> {
        let mut r = self.resources.clone();
        match t {
            Type::Cds => r.clusters = decode_all::<Cluster>(items, |c| c.name.clone())?,
            Type::Lds => r.listeners = decode_all::<Listener>(items, |l| l.name.clone())?,
            Type::Eds => r.endpoints.extend(decode_all::<ClusterLoadAssignment>(items, |c| c.cluster_name.clone())?),
            Type::Rds => r.routes.extend(decode_all::<RouteConfiguration>(items, |c| c.name.clone())?),
        }
        Ok(r)
    }
}

fn decode_all<T: prost::Message + prost::Name + Default>(
    items: &[Any],
    name: impl Fn(&T) -> String,
) -> Result<BTreeMap<String, T>, String> {
    let mut out = BTreeMap::new();
    for any in items {
        let v: T = config::decode(any)?;
        let n = name(&v);
        if out.insert(n.clone(), v).is_some() {
            return Err(format!("resource {n:?} appears twice"));
        }
    }
    Ok(out)
}

/// What the rest of the sidecar sees of the xDS client.
#[derive(Clone)]
pub struct Shared {
    pub snapshot: Arc<ArcSwap<Snapshot>>,
    pub ready: Arc<AtomicBool>,
}

/// Keep an ADS stream to `address` (`host:port`) for ever, reconnecting with backoff.
pub async fn run(address: String, node: Node, shared: Shared) {
    let mut ads = Ads::new(node);
    let mut backoff = Duration::from_millis(100);
    loop {
        match session(&address, &mut ads, &shared).await {
            Ok(got_response) if got_response => backoff = Duration::from_millis(100),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, %address, "xDS stream failed; keeping the configuration in force"),
        }
        let jitter = Duration::from_millis(rand::random::<u64>() % (backoff.as_millis() as u64 / 2 + 1));
        tokio::time::sleep(backoff + jitter).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

/// One stream; `Ok(true)` when it received at least one response before it ended.
async fn session(address: &str, ads: &mut Ads, shared: &Shared) -> anyhow::Result<bool> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let channel = endpoint.connect().await?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for r in ads.open() {
        tx.send(r).await?;
    }
    let mut stream =
        client.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
    tracing::info!(%address, "xDS stream open");
    let mut got = false;
    loop {
        // While warming, wake at the initial fetch timeout even if nothing arrives.
        let next = match ads.ready_deadline() {
            Some(deadline) if !shared.ready.load(Ordering::SeqCst) => {
                match tokio::time::timeout_at(deadline.into(), stream.message()).await {
                    Ok(r) => r?,
                    Err(_) => {
                        tracing::warn!(
                            timeout = ?INITIAL_FETCH_TIMEOUT,
                            "endpoints or route configurations named by the clusters and listeners did not arrive; ready without them"
                        );
                        shared.ready.store(true, Ordering::SeqCst);
                        continue;
                    }
                }
            }
            _ => stream.message().await?,
        };
        let Some(resp) = next else { break };
        got = true;
        let t = Type::from_url(&resp.type_url);
        let version = resp.version_info.clone();
        let current = shared.snapshot.load_full();
        let out = ads.handle(resp, Some(&current));
        if let Some(t) = t {
            let m = crate::metrics::get();
            match &out.rejected {
                Some(e) => {
                    m.xds_rejects.with_label_values(&[t.short()]).inc();
                    tracing::warn!(r#type = t.short(), %version, error = %e, "rejected (NACK)");
                }
                None => {
                    m.xds_updates.with_label_values(&[t.short()]).inc();
                    tracing::info!(r#type = t.short(), %version, "accepted (ACK)");
                }
            }
        }
        if let Some(s) = out.snapshot {
            shared.snapshot.store(Arc::new(s));
        }
        if ads.ready(Instant::now()) {
            shared.ready.store(true, Ordering::SeqCst);
        }
        for r in out.requests {
            tx.send(r).await?;
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{any, cla, eds_cluster, http_listener, prefix, regex_path, route_config, route_to};
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;

    fn resp(t: Type, version: &str, nonce: &str, resources: Vec<Any>) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: version.into(),
            nonce: nonce.into(),
            type_url: t.url().into(),
            resources,
            ..Default::default()
        }
    }

    fn types(reqs: &[DiscoveryRequest]) -> Vec<&str> {
        reqs.iter().map(|r| Type::from_url(&r.type_url).unwrap().short()).collect()
    }

    #[test]
    fn subscribes_in_order_and_acks() {
        let mut ads = Ads::new(Node { id: "n".into(), ..Default::default() });
        let open = ads.open();
        assert_eq!(types(&open), ["cds"]);
        assert_eq!(open[0].node.as_ref().unwrap().id, "n");

        let out = ads.handle(resp(Type::Cds, "1", "a", vec![any(&eds_cluster("outbound|80||a"))]), None);
        assert_eq!(types(&out.requests), ["cds", "eds", "lds"]);
        assert_eq!(out.requests[0].version_info, "1");
        assert_eq!(out.requests[0].response_nonce, "a");
        assert!(out.requests[0].error_detail.is_none());
        assert_eq!(out.requests[1].resource_names, ["outbound|80||a"]);
        assert!(!ads.ready(Instant::now()));

        let out = ads.handle(
            resp(Type::Eds, "1", "b", vec![any(&cla("outbound|80||a", &[("10.0.0.1", 80, HealthStatus::Healthy)]))]),
            None,
        );
        assert_eq!(types(&out.requests), ["eds"]);
        assert_eq!(out.snapshot.unwrap().clusters["outbound|80||a"].endpoints.len(), 1);

        let out =
            ads.handle(resp(Type::Lds, "1", "c", vec![any(&http_listener("0.0.0.0_80", "0.0.0.0", 80, "80"))]), None);
        assert_eq!(types(&out.requests), ["lds", "rds"]);
        assert_eq!(out.requests[1].resource_names, ["80"]);
        // The listener's routes have not arrived: not ready (it would answer 404), until
        // they do or the initial fetch timeout passes.
        let now = Instant::now();
        assert!(!ads.ready(now));
        assert!(ads.ready(now + INITIAL_FETCH_TIMEOUT));
        assert!(ads.ready_deadline().is_some());
        let out = ads.handle(resp(Type::Rds, "1", "d", vec![any(&route_config("80", vec![]))]), None);
        assert_eq!(types(&out.requests), ["rds"]);
        assert!(ads.ready(now));
        assert_eq!(ads.ready_deadline(), None);

        // A reconnect asks again for everything it has, with the versions in force.
        let open = ads.open();
        assert_eq!(types(&open), ["cds", "eds", "lds", "rds"]);
        assert_eq!(open[0].version_info, "1");
        assert_eq!(open[0].response_nonce, "");
    }

    #[test]
    fn nack_keeps_the_previous_version_and_configuration() {
        let mut ads = Ads::new(Node::default());
        ads.open();
        let good = route_config("80", vec![("v", vec!["*"], vec![route_to("ok", prefix("/"), "c")])]);
        ads.types[Type::Rds.index()].names = vec!["80".into()];
        let out = ads.handle(resp(Type::Rds, "1", "n1", vec![any(&good)]), None);
        assert!(out.rejected.is_none());
        let bad = route_config("80", vec![("v", vec!["*"], vec![route_to("bad", regex_path("(["), "c")])]);
        let out = ads.handle(resp(Type::Rds, "2", "n2", vec![any(&bad)]), None);
        assert!(out.snapshot.is_none());
        let nack = &out.requests[0];
        assert_eq!(nack.version_info, "1");
        assert_eq!(nack.response_nonce, "n2");
        let status = nack.error_detail.as_ref().unwrap();
        assert_eq!(status.code, 3);
        assert!(status.message.contains("does not compile"));
        assert_eq!(ads.resources.routes["80"].virtual_hosts[0].routes[0].name, "ok");
    }

    #[test]
    fn state_of_the_world_removes_absent_clusters() {
        let mut ads = Ads::new(Node::default());
        ads.open();
        ads.handle(resp(Type::Cds, "1", "a", vec![any(&eds_cluster("x")), any(&eds_cluster("y"))]), None);
        let out = ads.handle(resp(Type::Cds, "2", "b", vec![any(&eds_cluster("x"))]), None);
        let snap = out.snapshot.unwrap();
        assert!(snap.clusters.contains_key("x") && !snap.clusters.contains_key("y"));
        assert_eq!(types(&out.requests), ["cds", "eds"]);
        assert_eq!(out.requests[1].resource_names, ["x"]);
    }
}
