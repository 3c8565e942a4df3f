//! What the sidecar's integration tests share: a network namespace with a pod's capture
//! rules, a fake control plane speaking ADS, upstream servers, xDS resource builders and the
//! `envoy` process itself.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as corepb;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use envoy_types::pb::envoy::config::listener::v3 as lpb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcmpb;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3 as tcppb;
use envoy_types::pb::envoy::extensions::upstreams::http::v3 as uhpb;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::{Any, BoolValue, Duration as PbDuration, UInt32Value};
use futures::Stream;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const POD_IP: &str = "10.77.0.1";
/// The inbound port the capture rules send to 15006 (as PREROUTING would for a pod).
pub const INBOUND_APP_PORT: u16 = 9080;

// ---------------------------------------------------------------- network namespace

/// A network namespace with a pod's capture rules: outbound TCP from any uid but 1337 and
/// not to loopback → 15001; TCP to `POD_IP:INBOUND_APP_PORT` → 15006. Test addresses
/// (10.77.0.0/24) live on its loopback device and Service IPs (10.96.0.0/16) route there.
/// Deleted on drop, also when a test fails.
pub struct Netns {
    pub name: String,
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run(args: &[&str], stdin: Option<&str>) {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..]).stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    if let Some(input) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{args:?} failed: {status}");
}

impl Netns {
    /// `None` (test skipped) when the prerequisites are missing, unless `CI=true`.
    pub fn create(tag: &str, addresses: &[&str]) -> Option<Netns> {
        let root = unsafe { libc::geteuid() } == 0;
        let missing: Vec<&str> = ["ip", "iptables-restore"].into_iter().filter(|t| !have(t)).collect();
        if !root || !missing.is_empty() {
            let why = if root { format!("missing {}", missing.join(", ")) } else { "not root".to_string() };
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("cannot run the capture test: {why}");
            }
            eprintln!("SKIPPED: the capture test needs root, ip and iptables-restore: {why}");
            return None;
        }
        let name = format!("envoy-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        run(&["ip", "netns", "add", &name], None);
        let ns = Netns { name };
        run(&["ip", "-n", &ns.name, "link", "set", "lo", "up"], None);
        for a in std::iter::once(&POD_IP).chain(addresses) {
            run(&["ip", "-n", &ns.name, "addr", "add", &format!("{a}/32"), "dev", "lo"], None);
        }
        run(&["ip", "-n", &ns.name, "route", "add", "10.96.0.0/16", "dev", "lo"], None);
        let rules = format!(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
             -A OUTPUT -p tcp -m owner --uid-owner 1337 -j RETURN\n\
             -A OUTPUT -p tcp -d 127.0.0.0/8 -j RETURN\n\
             -A OUTPUT -p tcp -d {POD_IP}/32 --dport {INBOUND_APP_PORT} -j REDIRECT --to-ports 15006\n\
             -A OUTPUT -p tcp -j REDIRECT --to-ports 15001\nCOMMIT\n"
        );
        run(&["ip", "netns", "exec", &ns.name, "iptables-restore"], Some(&rules));
        Some(ns)
    }
}

/// Move the calling thread (and the threads and processes it starts) into namespace `name`.
fn enter(name: &str) {
    let f = std::fs::File::open(format!("/var/run/netns/{name}")).unwrap();
    use std::os::fd::AsRawFd;
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Run `f` on a runtime whose threads live in the namespace `tag` (with `addresses`).
pub fn in_netns<F, Fut>(tag: &str, addresses: &[&str], f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let Some(ns) = Netns::create(tag, addresses) else { return };
    let name = ns.name.clone();
    // A thread of its own, so that the test harness's thread stays in the host namespace.
    let result = std::thread::spawn(move || {
        enter(&name);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(f());
    })
    .join();
    drop(ns);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

// ---------------------------------------------------------------- the sidecar

pub struct Envoy {
    pub child: Child,
}

impl Envoy {
    /// Start `envoy proxy sidecar` as uid 1337 (so its own traffic is not captured).
    pub fn start(discovery: SocketAddr) -> Envoy {
        // ENVOY_BIN: another build of the binary (a release one, for measurements).
        let bin = std::env::var("ENVOY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_envoy").to_string());
        let child = Command::new(bin)
            .args(["proxy", "sidecar", "--discovery-address", &discovery.to_string(), "--drain-duration", "1s"])
            .env("POD_NAME", "client-7d9f")
            .env("POD_NAMESPACE", "default")
            .env("INSTANCE_IP", POD_IP)
            .env("ISTIO_META_WORKLOAD_NAME", "client")
            .env("RUST_LOG", "warn")
            .uid(1337)
            .gid(1337)
            .spawn()
            .expect("starting envoy");
        Envoy { child }
    }

    pub fn node_id() -> String {
        format!("sidecar~{POD_IP}~client-7d9f.default~default.svc.cluster.local")
    }

    pub fn terminate(&self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wait until `/healthz/ready` answers 200.
pub async fn wait_ready() {
    for _ in 0..200 {
        if let Ok(r) = get_local("http://127.0.0.1:15021/healthz/ready").await {
            if r.0 == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("envoy never became ready");
}

pub async fn ready_status() -> u16 {
    get_local("http://127.0.0.1:15021/healthz/ready").await.map(|r| r.0).unwrap_or(0)
}

pub async fn metrics() -> String {
    get_local("http://127.0.0.1:15090/stats/prometheus").await.unwrap().1
}

async fn get_local(url: &str) -> Result<(u16, String), String> {
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let resp = client.get(url.parse().unwrap()).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

// ---------------------------------------------------------------- clients

pub type Client = hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http()
}

pub fn h2c_client() -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).http2_only(true).build_http()
}

pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

pub async fn get(client: &Client, url: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = http::Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp =
        client.request(req.body(Full::new(Bytes::new())).unwrap()).await.unwrap_or_else(|e| panic!("GET {url}: {e:?}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
}

// ---------------------------------------------------------------- upstreams

#[derive(Clone, Copy, Debug)]
pub enum Mode {
    Ok,
    /// 503 on every odd-numbered request.
    FailEveryOther,
    /// Always 500.
    Fail,
    /// Answer after this long.
    Slow(Duration),
}

/// An HTTP server (HTTP/1.1 and h2c) answering its `name`, and headers telling what it saw:
/// `x-path`, `x-version`, `x-peer-id` (the `x-envoy-peer-metadata-id` it received).
/// Returns its request counter.
pub async fn http_upstream(addr: &str, name: &'static str, mode: Mode) -> Arc<AtomicUsize> {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let c = c.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        let status = match mode {
                            Mode::Ok => 200,
                            Mode::FailEveryOther if n % 2 == 1 => 503,
                            Mode::FailEveryOther => 200,
                            Mode::Fail => 500,
                            Mode::Slow(d) => {
                                tokio::time::sleep(d).await;
                                200
                            }
                        };
                        let peer = req
                            .headers()
                            .get("x-envoy-peer-metadata-id")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let resp = http::Response::builder()
                            .status(status)
                            .header("x-upstream", name)
                            .header("x-path", req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/"))
                            .header("x-version", format!("{:?}", req.version()))
                            .header("x-peer-id", peer)
                            .body(Full::new(Bytes::from(name)))
                            .unwrap();
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    count
}

/// A TCP server that answers each read with `prefix` followed by what it read.
pub async fn tcp_echo(addr: &str, prefix: &'static str) {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut out = prefix.as_bytes().to_vec();
                    out.extend_from_slice(&buf[..n]);
                    if s.write_all(&out).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
}

/// Connect to `addr` (captured), send `msg`, return the answer.
pub async fn tcp_roundtrip(addr: &str, msg: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.write_all(msg.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("tcp answer in time").unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

// ---------------------------------------------------------------- fake control plane

/// A type's version and its resources by name.
type Versioned = (u64, Vec<(String, Any)>);

#[derive(Default)]
struct CpState {
    counter: u64,
    /// type URL → (version, resources by name).
    resources: HashMap<&'static str, Versioned>,
    requests: Vec<DiscoveryRequest>,
}

/// An ADS server that holds resources per type, answers subscriptions, pushes changes and
/// records every request (ACKs and NACKs).
#[derive(Clone, Default)]
pub struct ControlPlane {
    state: Arc<Mutex<CpState>>,
    push: Arc<tokio::sync::Notify>,
    /// Bumped to end every open stream (a control plane that goes away).
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl ControlPlane {
    /// Replace the resources of `type_url` under a new version; subscribed streams get them.
    pub fn set(&self, type_url: &'static str, resources: Vec<(String, Any)>) -> String {
        let mut s = self.state.lock().unwrap();
        s.counter += 1;
        let v = s.counter;
        s.resources.insert(type_url, (v, resources));
        drop(s);
        self.push.notify_waiters();
        v.to_string()
    }

    /// End every open stream, as a control plane that exits does.
    pub fn disconnect_all(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn requests(&self) -> Vec<DiscoveryRequest> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Serve on `listener` until the returned handle is aborted.
    pub fn serve(&self, listener: tokio::net::TcpListener) -> tokio::task::JoinHandle<()> {
        let svc = AggregatedDiscoveryServiceServer::new(self.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        })
    }

    fn response(&self, type_url: &str, names: &[String], nonce: u64) -> Option<(u64, DiscoveryResponse)> {
        let s = self.state.lock().unwrap();
        let (version, resources) = s.resources.get(type_url)?;
        let wildcard = type_url == CDS || type_url == LDS;
        let resources =
            resources.iter().filter(|(n, _)| wildcard || names.contains(n)).map(|(_, a)| a.clone()).collect();
        Some((
            *version,
            DiscoveryResponse {
                version_info: version.to_string(),
                resources,
                type_url: type_url.to_string(),
                nonce: format!("nonce-{nonce}"),
                ..Default::default()
            },
        ))
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for ControlPlane {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream =
        Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<ResponseStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let cp = self.clone();
        let mut generation = self.generation.subscribe();
        tokio::spawn(async move {
            let mut subscribed: HashMap<String, Vec<String>> = HashMap::new();
            let mut sent: HashMap<String, u64> = HashMap::new();
            let mut nonce = 0u64;
            loop {
                let pushed = cp.push.notified();
                tokio::select! {
                    msg = inbound.message() => {
                        let Ok(Some(req)) = msg else { break };
                        cp.state.lock().unwrap().requests.push(req.clone());
                        let changed = subscribed.get(&req.type_url) != Some(&req.resource_names);
                        subscribed.insert(req.type_url.clone(), req.resource_names.clone());
                        if changed {
                            nonce += 1;
                            if let Some((v, resp)) = cp.response(&req.type_url, &req.resource_names, nonce) {
                                sent.insert(req.type_url.clone(), v);
                                if tx.send(Ok(resp)).await.is_err() { break }
                            }
                        }
                    }
                    _ = pushed => {}
                    _ = generation.changed() => break,
                }
                // Whatever changed since it was last sent (pushes, or while handling a request).
                for t in [CDS, EDS, LDS, RDS] {
                    let Some(names) = subscribed.get(t) else { continue };
                    let version = cp.state.lock().unwrap().resources.get(t).map(|r| r.0);
                    if version.is_none() || sent.get(t) == version.as_ref() {
                        continue;
                    }
                    nonce += 1;
                    if let Some((v, resp)) = cp.response(t, names, nonce) {
                        sent.insert(t.to_string(), v);
                        if tx.send(Ok(resp)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        _: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only"))
    }
}

/// Start a control plane on a loopback port (not captured) of the current namespace.
pub async fn control_plane() -> (ControlPlane, SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cp = ControlPlane::default();
    let handle = cp.serve(listener);
    (cp, addr, handle)
}

// ---------------------------------------------------------------- resources (as pilot writes them)

pub fn any<T: Message + prost::Name>(m: &T) -> Any {
    Any { type_url: T::type_url(), value: m.encode_to_vec() }
}

pub fn named<T: Message + prost::Name>(name: &str, m: &T) -> (String, Any) {
    (name.to_string(), any(m))
}

pub fn sock(ip: &str, port: u32) -> Option<corepb::Address> {
    Some(corepb::Address {
        address: Some(corepb::address::Address::SocketAddress(corepb::SocketAddress {
            address: ip.into(),
            port_specifier: Some(corepb::socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    })
}

fn dur(ms: u64) -> Option<PbDuration> {
    Some(PbDuration { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 })
}

fn ads_source() -> Option<corepb::ConfigSource> {
    Some(corepb::ConfigSource {
        config_source_specifier: Some(corepb::config_source::ConfigSourceSpecifier::Ads(Default::default())),
        resource_api_version: corepb::ApiVersion::V3 as i32,
        ..Default::default()
    })
}

pub fn eds_cluster(name: &str) -> cpb::Cluster {
    cpb::Cluster {
        name: name.into(),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(cpb::cluster::DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(cpb::cluster::EdsClusterConfig {
            service_name: name.into(),
            eds_config: ads_source(),
        }),
        connect_timeout: dur(10_000),
        ..Default::default()
    }
}

pub fn with_outlier(mut c: cpb::Cluster, consecutive_5xx: u32) -> cpb::Cluster {
    c.outlier_detection = Some(cpb::OutlierDetection {
        consecutive_5xx: Some(UInt32Value { value: consecutive_5xx }),
        interval: dur(1000),
        base_ejection_time: dur(30_000),
        max_ejection_percent: Some(UInt32Value { value: 100 }),
        ..Default::default()
    });
    c
}

pub fn with_max_requests(mut c: cpb::Cluster, max_requests: u32) -> cpb::Cluster {
    c.circuit_breakers = Some(cpb::CircuitBreakers {
        thresholds: vec![cpb::circuit_breakers::Thresholds {
            max_requests: Some(UInt32Value { value: max_requests }),
            ..Default::default()
        }],
        ..Default::default()
    });
    c
}

pub fn with_http2(mut c: cpb::Cluster) -> cpb::Cluster {
    let opts = uhpb::HttpProtocolOptions {
        upstream_protocol_options: Some(uhpb::http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
            uhpb::http_protocol_options::ExplicitHttpConfig {
                protocol_config: Some(
                    uhpb::http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                        Default::default(),
                    ),
                ),
            },
        )),
        ..Default::default()
    };
    c.typed_extension_protocol_options
        .insert("envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(), any(&opts));
    c
}

pub fn original_dst_cluster(name: &str) -> cpb::Cluster {
    cpb::Cluster {
        name: name.into(),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(
            cpb::cluster::DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: cpb::cluster::LbPolicy::ClusterProvided as i32,
        connect_timeout: dur(10_000),
        ..Default::default()
    }
}

pub fn cla(name: &str, endpoints: &[&str]) -> epb::ClusterLoadAssignment {
    epb::ClusterLoadAssignment {
        cluster_name: name.into(),
        endpoints: vec![epb::LocalityLbEndpoints {
            lb_endpoints: endpoints
                .iter()
                .map(|e| {
                    let (ip, port) = e.split_once(':').unwrap();
                    epb::LbEndpoint {
                        health_status: corepb::HealthStatus::Healthy as i32,
                        host_identifier: Some(epb::lb_endpoint::HostIdentifier::Endpoint(epb::Endpoint {
                            address: sock(ip, port.parse().unwrap()),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn tcp_proxy_filter(cluster: &str) -> lpb::Filter {
    let tcp = tcppb::TcpProxy {
        stat_prefix: cluster.into(),
        cluster_specifier: Some(tcppb::tcp_proxy::ClusterSpecifier::Cluster(cluster.into())),
        ..Default::default()
    };
    lpb::Filter {
        name: "envoy.filters.network.tcp_proxy".into(),
        config_type: Some(lpb::filter::ConfigType::TypedConfig(any(&tcp))),
    }
}

fn hcm_filter(name: &str, routes: hcmpb::http_connection_manager::RouteSpecifier, fault: bool) -> lpb::Filter {
    let mut http_filters = Vec::new();
    if fault {
        http_filters.push(hcmpb::HttpFilter { name: "envoy.filters.http.fault".into(), ..Default::default() });
    }
    http_filters.push(hcmpb::HttpFilter { name: "envoy.filters.http.router".into(), ..Default::default() });
    let hcm = hcmpb::HttpConnectionManager {
        stat_prefix: name.into(),
        route_specifier: Some(routes),
        http_filters,
        ..Default::default()
    };
    lpb::Filter {
        name: "envoy.filters.network.http_connection_manager".into(),
        config_type: Some(lpb::filter::ConfigType::TypedConfig(any(&hcm))),
    }
}

/// `virtualOutbound`: 0.0.0.0:15001, default chain to PassthroughCluster.
pub fn virtual_outbound() -> lpb::Listener {
    lpb::Listener {
        name: "virtualOutbound".into(),
        address: sock("0.0.0.0", 15001),
        use_original_dst: Some(BoolValue { value: true }),
        default_filter_chain: Some(lpb::FilterChain {
            filters: vec![tcp_proxy_filter("PassthroughCluster")],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `virtualInbound`: an HTTP chain for `http_port` (inline route to `inbound|<port>||`).
pub fn virtual_inbound(http_port: u32) -> lpb::Listener {
    let cluster = format!("inbound|{http_port}||");
    let rc = rpb::RouteConfiguration {
        name: cluster.clone(),
        virtual_hosts: vec![rpb::VirtualHost {
            name: "inbound|http|".into(),
            domains: vec!["*".into()],
            routes: vec![route("default", prefix("/"), to_cluster(&cluster))],
            ..Default::default()
        }],
        ..Default::default()
    };
    lpb::Listener {
        name: "virtualInbound".into(),
        address: sock("0.0.0.0", 15006),
        use_original_dst: Some(BoolValue { value: true }),
        traffic_direction: corepb::TrafficDirection::Inbound as i32,
        filter_chains: vec![lpb::FilterChain {
            filter_chain_match: Some(lpb::FilterChainMatch {
                destination_port: Some(UInt32Value { value: http_port }),
                ..Default::default()
            }),
            filters: vec![hcm_filter(
                "virtualInbound",
                hcmpb::http_connection_manager::RouteSpecifier::RouteConfig(rc),
                false,
            )],
            ..Default::default()
        }],
        default_filter_chain: Some(lpb::FilterChain {
            filters: vec![tcp_proxy_filter("InboundPassthroughClusterIpv4")],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `0.0.0.0_<port>`: HTTP, routes from RDS `"<port>"`.
pub fn http_listener(port: u32, fault: bool) -> lpb::Listener {
    let name = format!("0.0.0.0_{port}");
    let rds = hcmpb::http_connection_manager::RouteSpecifier::Rds(hcmpb::Rds {
        config_source: ads_source(),
        route_config_name: port.to_string(),
    });
    lpb::Listener {
        name: name.clone(),
        address: sock("0.0.0.0", port),
        bind_to_port: Some(BoolValue { value: false }),
        filter_chains: vec![lpb::FilterChain { filters: vec![hcm_filter(&name, rds, fault)], ..Default::default() }],
        ..Default::default()
    }
}

/// `<ip>_<port>`: TCP to `cluster`.
pub fn tcp_listener(ip: &str, port: u32, cluster: &str) -> lpb::Listener {
    lpb::Listener {
        name: format!("{ip}_{port}"),
        address: sock(ip, port),
        bind_to_port: Some(BoolValue { value: false }),
        filter_chains: vec![lpb::FilterChain { filters: vec![tcp_proxy_filter(cluster)], ..Default::default() }],
        ..Default::default()
    }
}

pub fn prefix(p: &str) -> rpb::RouteMatch {
    rpb::RouteMatch { path_specifier: Some(rpb::route_match::PathSpecifier::Prefix(p.into())), ..Default::default() }
}

pub fn regex(p: &str) -> rpb::RouteMatch {
    rpb::RouteMatch {
        path_specifier: Some(rpb::route_match::PathSpecifier::SafeRegex(
            envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher { regex: p.into(), ..Default::default() },
        )),
        ..Default::default()
    }
}

#[allow(deprecated)]
pub fn with_header(mut m: rpb::RouteMatch, name: &str, exact: &str) -> rpb::RouteMatch {
    m.headers.push(rpb::HeaderMatcher {
        name: name.into(),
        header_match_specifier: Some(rpb::header_matcher::HeaderMatchSpecifier::StringMatch(
            envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher {
                match_pattern: Some(envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern::Exact(
                    exact.into(),
                )),
                ignore_case: false,
            },
        )),
        ..Default::default()
    });
    m
}

pub fn to_cluster(c: &str) -> rpb::RouteAction {
    rpb::RouteAction {
        cluster_specifier: Some(rpb::route_action::ClusterSpecifier::Cluster(c.into())),
        ..Default::default()
    }
}

pub fn weighted(clusters: &[(&str, u32)]) -> rpb::RouteAction {
    rpb::RouteAction {
        cluster_specifier: Some(rpb::route_action::ClusterSpecifier::WeightedClusters(rpb::WeightedCluster {
            clusters: clusters
                .iter()
                .map(|(n, w)| rpb::weighted_cluster::ClusterWeight {
                    name: (*n).into(),
                    weight: Some(UInt32Value { value: *w }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

pub fn retries(mut a: rpb::RouteAction, retry_on: &str, n: u32) -> rpb::RouteAction {
    a.retry_policy = Some(rpb::RetryPolicy {
        retry_on: retry_on.into(),
        num_retries: Some(UInt32Value { value: n }),
        ..Default::default()
    });
    a
}

pub fn timeout(mut a: rpb::RouteAction, ms: u64) -> rpb::RouteAction {
    a.timeout = dur(ms);
    a
}

pub fn route(name: &str, m: rpb::RouteMatch, a: rpb::RouteAction) -> rpb::Route {
    rpb::Route { name: name.into(), r#match: Some(m), action: Some(rpb::route::Action::Route(a)), ..Default::default() }
}

/// A virtual host for Service `name` in `default` on `port`, reachable at `vip`.
pub fn service_vhost(name: &str, vip: &str, port: u32, routes: Vec<rpb::Route>) -> rpb::VirtualHost {
    let fqdn = format!("{name}.default.svc.cluster.local");
    let mut domains = Vec::new();
    for d in [fqdn.clone(), format!("{name}.default.svc"), format!("{name}.default"), name.to_string(), vip.to_string()]
    {
        domains.push(format!("{d}:{port}"));
        domains.push(d);
    }
    rpb::VirtualHost { name: format!("{fqdn}:{port}"), domains, routes, ..Default::default() }
}

pub fn route_config(name: &str, vhosts: Vec<rpb::VirtualHost>) -> rpb::RouteConfiguration {
    rpb::RouteConfiguration { name: name.into(), virtual_hosts: vhosts, ..Default::default() }
}
