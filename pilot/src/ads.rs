//! The ADS server: `AggregatedDiscoveryService/StreamAggregatedResources`, state of the
//! world, one stream per sidecar.
//!
//! [`Connection`] is one stream's protocol state, without I/O: per type the names asked
//! for, what was last sent (a hash of the content, the version, the nonce) and what was
//! ACKed. A request carrying the nonce of the last response ACKs it (or NACKs it, with
//! `error_detail`: logged, counted, and the same content is not sent again); a request
//! with an older nonce is stale and ignored; one with no nonce subscribes (again). A
//! response goes out only when the content for that proxy differs from what it last got.
//! Versions are the snapshot's version (or one more than the type's last version, so they
//! only grow on a stream); nonces are unique in the process.
//!
//! [`Ads`] runs a task per stream that feeds requests and new snapshots (from
//! [`crate::watch`]) to its [`Connection`] and sends what it answers, in the order CDS,
//! EDS, LDS, RDS. Until the first snapshot exists (pilot's watches have not listed yet),
//! requests are remembered and nothing is sent: a restarted pilot never answers with an
//! empty configuration.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Struct;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::metrics::Metrics;
use crate::xds::{Proxy, Snapshot, TypeUrl};

/// A snapshot as published to the streams, with the time of the first change it carries
/// (for `pilot_proxy_convergence_time`).
#[derive(Debug)]
pub struct Published {
    pub snapshot: Arc<Snapshot>,
    pub since: Instant,
}

/// The latest snapshot (`None` until pilot's watches have all listed).
pub type Feed = watch::Receiver<Option<Arc<Published>>>;

/// Unique nonces.
#[derive(Debug, Default)]
pub struct Nonces(AtomicU64);

impl Nonces {
    fn next(&self) -> String {
        (self.0.fetch_add(1, Ordering::Relaxed) + 1).to_string()
    }
}

#[derive(Debug, Default)]
struct Watch {
    /// The names asked for (EDS, RDS; empty for CDS, LDS).
    names: Vec<String>,
    sent_hash: Option<u64>,
    version: u64,
    nonce: String,
    acked: Option<String>,
    /// The change the last response carried, until it is ACKed.
    pending: Option<Instant>,
}

/// What a request led to, besides responses.
#[derive(Debug, Default, PartialEq)]
pub struct Reply {
    pub responses: Vec<DiscoveryResponse>,
    /// A NACK: its type, the version rejected and the proxy's message.
    pub nack: Option<(TypeUrl, String, String)>,
    /// An ACK of a push, and how long since the change it carried.
    pub converged: Option<Duration>,
}

/// One stream's protocol state.
#[derive(Debug)]
pub struct Connection {
    pub proxy: Option<Proxy>,
    meta: Option<Struct>,
    watches: BTreeMap<TypeUrl, Watch>,
    nonces: Arc<Nonces>,
}

impl Connection {
    pub fn new(nonces: Arc<Nonces>) -> Connection {
        Connection { proxy: None, meta: None, watches: BTreeMap::new(), nonces }
    }

    /// The version the proxy last ACKed for a type.
    pub fn acked(&self, t: TypeUrl) -> Option<&str> {
        self.watches.get(&t).and_then(|w| w.acked.as_deref())
    }

    /// Handle one request, `current` being the latest snapshot.
    pub fn on_request(
        &mut self,
        req: DiscoveryRequest,
        current: Option<&Published>,
        now: Instant,
    ) -> Result<Reply, Status> {
        if self.proxy.is_none() {
            let node =
                req.node.as_ref().ok_or_else(|| Status::invalid_argument("the first request carries no node"))?;
            let mesh = current.map(|p| p.snapshot.mesh.clone()).unwrap_or_default();
            let proxy = Proxy::from_node(node, &mesh).map_err(|e| Status::invalid_argument(e.to_string()))?;
            tracing::info!(proxy = proxy.id, "proxy connected");
            self.proxy = Some(proxy);
            self.meta = node.metadata.clone();
        }
        let mut reply = Reply::default();
        let Some(t) = TypeUrl::parse(&req.type_url) else {
            tracing::debug!(type_url = req.type_url, "request for a type pilot does not serve");
            return Ok(reply);
        };
        let w = self.watches.entry(t).or_default();
        if req.response_nonce.is_empty() {
            // A (re)subscription: whatever it had before, it gets the current content.
            w.sent_hash = None;
        } else if req.response_nonce != w.nonce {
            tracing::trace!(nonce = req.response_nonce, "stale request ignored");
            return Ok(reply);
        } else if let Some(err) = &req.error_detail {
            reply.nack = Some((t, w.version.to_string(), err.message.clone()));
            w.pending = None;
        } else {
            w.acked = Some(req.version_info.clone());
            if let Some(since) = w.pending.take() {
                reply.converged = Some(now.saturating_duration_since(since));
            }
        }
        w.names = if t.wildcard() { Vec::new() } else { req.resource_names };
        if let Some(p) = current {
            reply.responses.extend(self.respond(t, p, None));
        }
        Ok(reply)
    }

    /// Handle a new snapshot: what changed for this proxy, in push order.
    pub fn on_snapshot(&mut self, published: &Published) -> Vec<DiscoveryResponse> {
        if let Some(proxy) = self.proxy.as_mut() {
            proxy.refresh(&published.snapshot.mesh, self.meta.as_ref());
        }
        TypeUrl::ALL.into_iter().filter_map(|t| self.respond(t, published, Some(published.since))).collect()
    }

    fn respond(&mut self, t: TypeUrl, published: &Published, change: Option<Instant>) -> Option<DiscoveryResponse> {
        let proxy = self.proxy.as_ref()?;
        let w = self.watches.get_mut(&t)?;
        if w.sent_hash == Some(published.snapshot.hash(proxy, t, &w.names)) {
            return None;
        }
        let res = published.snapshot.resources(proxy, t, &w.names);
        w.sent_hash = Some(res.hash);
        w.version = published.snapshot.version.max(w.version + 1);
        w.nonce = self.nonces.next();
        if let Some(since) = change {
            w.pending = Some(w.pending.map_or(since, |p| p.min(since)));
        }
        Some(DiscoveryResponse {
            version_info: w.version.to_string(),
            resources: res.items.into_iter().map(|r| r.any).collect(),
            type_url: t.url().to_string(),
            nonce: w.nonce.clone(),
            control_plane: Some(ControlPlane { identifier: format!("pilot-{}", env!("CARGO_PKG_VERSION")) }),
            ..Default::default()
        })
    }
}

/// The gRPC service.
#[derive(Clone)]
pub struct Ads {
    feed: Feed,
    metrics: Metrics,
    nonces: Arc<Nonces>,
    /// Set on shutdown: every stream ends (the sidecars keep their configuration and
    /// reconnect).
    stop: Arc<watch::Sender<bool>>,
}

impl Ads {
    pub fn new(feed: Feed, metrics: Metrics) -> Ads {
        Ads { feed, metrics, nonces: Arc::new(Nonces::default()), stop: Arc::new(watch::channel(false).0) }
    }

    /// End every stream.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    pub fn server(self) -> AggregatedDiscoveryServiceServer<Ads> {
        AggregatedDiscoveryServiceServer::new(self)
    }
}

/// Serve ADS on `listener` (plaintext HTTP/2) until `shutdown`, then end the streams.
pub async fn serve(
    listener: tokio::net::TcpListener,
    ads: Ads,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let stopper = ads.clone();
    let shutdown = async move {
        shutdown.await;
        stopper.stop();
    };
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(ads.server())
        .serve_with_incoming_shutdown(tonic::transport::server::TcpIncoming::from(listener), shutdown)
        .await
}

struct Connected(Metrics);

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.connected.dec();
    }
}

async fn run_stream(
    mut inbound: Streaming<DiscoveryRequest>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    mut feed: Feed,
    metrics: Metrics,
    nonces: Arc<Nonces>,
    mut stop: watch::Receiver<bool>,
) {
    if *stop.borrow_and_update() {
        return;
    }
    metrics.connected.inc();
    let _connected = Connected(metrics.clone());
    let mut conn = Connection::new(nonces);
    feed.borrow_and_update();
    loop {
        let responses = tokio::select! {
            req = inbound.message() => match req {
                Ok(Some(req)) => {
                    let current = feed.borrow().clone();
                    match conn.on_request(req, current.as_deref(), Instant::now()) {
                        Ok(reply) => {
                            if let Some((t, version, message)) = &reply.nack {
                                metrics.rejects.with_label_values(&[t.short()]).inc();
                                let proxy = conn.proxy.as_ref().map(|p| p.id.as_str()).unwrap_or("");
                                tracing::warn!(proxy, r#type = t.short(), version, message, "proxy rejected configuration");
                            }
                            if let Some(d) = reply.converged {
                                metrics.convergence.observe(d.as_secs_f64());
                            }
                            reply.responses
                        }
                        Err(status) => {
                            tracing::warn!(error = %status.message(), "closing a stream");
                            let _ = tx.send(Err(status)).await;
                            break;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "stream ended");
                    break;
                }
            },
            _ = stop.changed() => break,
            changed = feed.changed() => {
                if changed.is_err() {
                    break;
                }
                let current = feed.borrow_and_update().clone();
                match current {
                    Some(p) => conn.on_snapshot(&p),
                    None => Vec::new(),
                }
            }
        };
        for r in responses {
            let t = TypeUrl::parse(&r.type_url).map(TypeUrl::short).unwrap_or("unknown");
            if tx.send(Ok(r)).await.is_err() {
                return;
            }
            metrics.pushes.with_label_values(&[t]).inc();
        }
    }
    if let Some(p) = &conn.proxy {
        tracing::info!(proxy = p.id, "proxy disconnected");
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(run_stream(
            request.into_inner(),
            tx,
            self.feed.clone(),
            self.metrics.clone(),
            self.nonces.clone(),
            self.stop.subscribe(),
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("pilot serves state-of-the-world ADS only"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::testutil::*;
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    use serde_json::json;

    fn published(version: u64, weight: i64) -> Published {
        let (svcs, slices, pods) = bookinfo();
        let vs = config(
            "reviews",
            json!({"hosts": ["reviews"], "http": [{"route": [
                {"destination": {"host": "reviews", "subset": "v1"}, "weight": weight},
                {"destination": {"host": "reviews", "subset": "v2"}, "weight": 100 - weight}]}]}),
        );
        let mesh = mesh_full(&svcs, &slices, &pods, &[vs], &[reviews_rule(json!(null))]);
        Published { snapshot: Arc::new(Snapshot::build(version, Arc::new(mesh))), since: Instant::now() }
    }

    fn request(t: TypeUrl, names: &[&str], ack_of: Option<&DiscoveryResponse>) -> DiscoveryRequest {
        DiscoveryRequest {
            node: Some(node("10.1.3.1", "productpage", "default")),
            type_url: t.url().to_string(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            version_info: ack_of.map(|r| r.version_info.clone()).unwrap_or_default(),
            response_nonce: ack_of.map(|r| r.nonce.clone()).unwrap_or_default(),
            ..Default::default()
        }
    }

    fn nack(t: TypeUrl, names: &[&str], of: &DiscoveryResponse, good_version: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: t.url().to_string(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            version_info: good_version.to_string(),
            response_nonce: of.nonce.clone(),
            error_detail: Some(RpcStatus { code: 3, message: "bad route".into(), details: vec![] }),
            ..Default::default()
        }
    }

    fn one(reply: Reply) -> DiscoveryResponse {
        assert_eq!(reply.responses.len(), 1, "{reply:?}");
        reply.responses.into_iter().next().unwrap()
    }

    #[test]
    fn subscribe_ack_and_push_only_what_changed() {
        let p1 = published(1, 90);
        let mut c = Connection::new(Arc::default());
        let now = Instant::now();
        let cds = one(c.on_request(request(TypeUrl::Cluster, &[], None), Some(&p1), now).unwrap());
        assert_eq!(cds.type_url, crate::xds::CLUSTER_TYPE);
        assert_eq!(cds.version_info, "1");
        // productpage: 3 services + 2 subsets + 3 special clusters + 2 inbound ports.
        assert_eq!(cds.resources.len(), 10);
        let ack = c.on_request(request(TypeUrl::Cluster, &[], Some(&cds)), Some(&p1), now).unwrap();
        assert!(ack.responses.is_empty());
        assert_eq!(c.acked(TypeUrl::Cluster), Some("1"));
        let names = p1.snapshot.eds_cluster_names();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let eds = one(c.on_request(request(TypeUrl::Endpoint, &names, None), Some(&p1), now).unwrap());
        assert_eq!(eds.resources.len(), 5);
        c.on_request(request(TypeUrl::Endpoint, &names, Some(&eds)), Some(&p1), now).unwrap();
        let lds = one(c.on_request(request(TypeUrl::Listener, &[], None), Some(&p1), now).unwrap());
        assert_eq!(lds.resources.len(), 5);
        c.on_request(request(TypeUrl::Listener, &[], Some(&lds)), Some(&p1), now).unwrap();
        let rds = one(c.on_request(request(TypeUrl::Route, &["9080", "50051"], None), Some(&p1), now).unwrap());
        assert_eq!(rds.resources.len(), 2);
        c.on_request(request(TypeUrl::Route, &["9080", "50051"], Some(&rds)), Some(&p1), now).unwrap();

        // The same mesh again: nothing to push.
        assert!(c.on_snapshot(&published(2, 90)).is_empty());
        // A weight changes: only RDS is pushed, at the new version.
        let p3 = published(3, 50);
        let pushed = c.on_snapshot(&p3);
        assert_eq!(pushed.len(), 1);
        assert_eq!(pushed[0].type_url, crate::xds::ROUTE_TYPE);
        assert_eq!(pushed[0].version_info, "3");
        assert_ne!(pushed[0].nonce, rds.nonce);
        let reply = c
            .on_request(request(TypeUrl::Route, &["9080", "50051"], Some(&pushed[0])), Some(&p3), Instant::now())
            .unwrap();
        assert!(reply.converged.is_some());
        assert_eq!(c.acked(TypeUrl::Route), Some("3"));
    }

    #[test]
    fn nacks_are_reported_and_not_resent() {
        let p1 = published(1, 90);
        let mut c = Connection::new(Arc::default());
        let now = Instant::now();
        let rds = one(c.on_request(request(TypeUrl::Route, &["9080"], None), Some(&p1), now).unwrap());
        c.on_request(request(TypeUrl::Route, &["9080"], Some(&rds)), Some(&p1), now).unwrap();
        let p2 = published(2, 40);
        let pushed = c.on_snapshot(&p2);
        let reply = c.on_request(nack(TypeUrl::Route, &["9080"], &pushed[0], "1"), Some(&p2), now).unwrap();
        assert_eq!(reply.nack, Some((TypeUrl::Route, "2".to_string(), "bad route".to_string())));
        assert!(reply.responses.is_empty());
        assert_eq!(c.acked(TypeUrl::Route), Some("1"));
        // Nothing changed since: nothing is sent again.
        assert!(c.on_snapshot(&published(3, 40)).is_empty());
        // A new change is pushed at a new version.
        let again = c.on_snapshot(&published(4, 30));
        assert_eq!(again[0].version_info, "4");
    }

    #[test]
    fn stale_nonces_are_ignored_and_new_names_answered() {
        let p1 = published(1, 90);
        let mut c = Connection::new(Arc::default());
        let now = Instant::now();
        let first = one(c
            .on_request(
                request(TypeUrl::Endpoint, &["outbound|9080||reviews.default.svc.cluster.local"], None),
                Some(&p1),
                now,
            )
            .unwrap());
        c.on_request(
            request(TypeUrl::Endpoint, &["outbound|9080||reviews.default.svc.cluster.local"], Some(&first)),
            Some(&p1),
            now,
        )
        .unwrap();
        // More names: answered, with a higher version on the same snapshot.
        let names = ["outbound|9080||reviews.default.svc.cluster.local", "outbound|5432||db.default.svc.cluster.local"];
        let second = one(c.on_request(request(TypeUrl::Endpoint, &names, Some(&first)), Some(&p1), now).unwrap());
        assert_eq!(second.resources.len(), 2);
        assert_eq!(second.version_info, "2");
        // A request with the first (now stale) nonce is ignored.
        let stale = c.on_request(request(TypeUrl::Endpoint, &["x"], Some(&first)), Some(&p1), now).unwrap();
        assert_eq!(stale, Reply::default());
    }

    #[test]
    fn nothing_is_sent_before_the_first_snapshot() {
        let mut c = Connection::new(Arc::default());
        let reply = c.on_request(request(TypeUrl::Cluster, &[], None), None, Instant::now()).unwrap();
        assert!(reply.responses.is_empty());
        let pushed = c.on_snapshot(&published(1, 90));
        assert_eq!(pushed.len(), 1);
        assert_eq!(pushed[0].type_url, crate::xds::CLUSTER_TYPE);
    }

    #[test]
    fn the_first_request_must_name_the_node() {
        let mut c = Connection::new(Arc::default());
        let mut req = request(TypeUrl::Cluster, &[], None);
        req.node = None;
        assert_eq!(c.on_request(req, None, Instant::now()).unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    /// A real server and a real gRPC client: subscribe in order, ACK, get a pushed RDS
    /// change, NACK it, and reconnect to the same content.
    #[tokio::test]
    async fn over_grpc() {
        use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
        let (publish, feed) = watch::channel(None);
        publish.send_replace(Some(Arc::new(published(1, 90))));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Metrics::new();
        let ads = Ads::new(feed, metrics.clone());
        tokio::spawn(serve(listener, ads.clone(), std::future::pending()));

        async fn open(addr: std::net::SocketAddr) -> (mpsc::Sender<DiscoveryRequest>, Streaming<DiscoveryResponse>) {
            let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}")).await.unwrap();
            let (tx, rx) = mpsc::channel(16);
            tx.send(request(TypeUrl::Cluster, &[], None)).await.unwrap();
            let stream = client.stream_aggregated_resources(ReceiverStream::new(rx)).await.unwrap().into_inner();
            (tx, stream)
        }
        async fn timeout(s: &mut Streaming<DiscoveryResponse>) -> DiscoveryResponse {
            tokio::time::timeout(Duration::from_secs(5), s.message()).await.unwrap().unwrap().unwrap()
        }

        let (tx, mut stream) = open(addr).await;
        let cds = timeout(&mut stream).await;
        assert_eq!(cds.type_url, crate::xds::CLUSTER_TYPE);
        tx.send(request(TypeUrl::Cluster, &[], Some(&cds))).await.unwrap();
        tx.send(request(TypeUrl::Listener, &[], None)).await.unwrap();
        let lds = timeout(&mut stream).await;
        assert_eq!(lds.type_url, crate::xds::LISTENER_TYPE);
        tx.send(request(TypeUrl::Listener, &[], Some(&lds))).await.unwrap();
        tx.send(request(TypeUrl::Route, &["9080"], None)).await.unwrap();
        let rds = timeout(&mut stream).await;
        assert_eq!((rds.type_url.as_str(), rds.version_info.as_str()), (crate::xds::ROUTE_TYPE, "1"));
        tx.send(request(TypeUrl::Route, &["9080"], Some(&rds))).await.unwrap();

        // A weight changes: RDS alone is pushed.
        publish.send_replace(Some(Arc::new(published(2, 10))));
        let pushed = timeout(&mut stream).await;
        assert_eq!((pushed.type_url.as_str(), pushed.version_info.as_str()), (crate::xds::ROUTE_TYPE, "2"));
        assert_ne!(pushed.resources, rds.resources);
        // The proxy rejects it; nothing is resent, the next change is pushed.
        tx.send(nack(TypeUrl::Route, &["9080"], &pushed, "1")).await.unwrap();
        // (A NACK that arrives after a newer response is stale and ignored: let it land.)
        tokio::time::sleep(Duration::from_millis(100)).await;
        publish.send_replace(Some(Arc::new(published(3, 10))));
        publish.send_replace(Some(Arc::new(published(4, 20))));
        let next = timeout(&mut stream).await;
        assert_eq!(next.version_info, "4");
        tx.send(request(TypeUrl::Route, &["9080"], Some(&next))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(metrics.rejects.with_label_values(&["rds"]).get(), 1);
        assert_eq!(metrics.connected.get(), 1);

        // A second connection (a restarted sidecar, or pilot) gets the same content.
        let (tx2, mut stream2) = open(addr).await;
        let cds2 = timeout(&mut stream2).await;
        assert_eq!(cds2.resources, cds.resources);
        tx2.send(request(TypeUrl::Route, &["9080"], None)).await.unwrap();
        let rds2 = timeout(&mut stream2).await;
        assert_eq!(rds2.resources, next.resources);
        drop((tx, stream));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(metrics.connected.get(), 1);

        // Shutting down ends the streams (cleanly: the sidecar keeps its configuration).
        ads.stop();
        let end = tokio::time::timeout(Duration::from_secs(5), stream2.message()).await.unwrap();
        assert!(matches!(end, Ok(None)), "{end:?}");
        drop(tx2);
    }
}
