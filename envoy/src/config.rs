//! The sidecar's configuration: xDS resources in, one immutable [`Snapshot`] out.
//!
//! [`build`] is pure: it reads the last accepted resources of every type (as the `xds` module
//! holds them) and translates them into the structures the data plane reads on every
//! connection and request: listeners with their filter chains, route tables with compiled
//! matchers, clusters with their endpoints. Anything invalid or unsupported that would change
//! how traffic is carried (a regex that does not compile, a filter we cannot honour, a
//! cluster type we do not implement) is a [`ConfigError`]: the `xds` module NACKs the update
//! and the previous snapshot stays in force.
//!
//! The counters that must outlive a configuration change (round-robin positions, active
//! requests, outlier-detection state, connection pools) live in [`ClusterState`] and
//! [`EndpointState`]; `build` carries them over from the previous snapshot by cluster name
//! and endpoint address.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as corepb;
use envoy_types::pb::envoy::config::endpoint::v3 as epb;
use envoy_types::pb::envoy::config::listener::v3 as lpb;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use envoy_types::pb::envoy::extensions::filters::common::fault::v3 as cfaultpb;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3 as faultpb;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcmpb;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3 as tcppb;
use envoy_types::pb::envoy::extensions::upstreams::http::v3 as uhpb;
use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;
use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
use envoy_types::pb::google::protobuf::Any;
use regex::Regex;

use crate::retry::{RetryOn, RetryPolicy};
use crate::state::{ClusterState, EndpointState};

pub const HCM: &str = "envoy.filters.network.http_connection_manager";
pub const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
pub const FAULT: &str = "envoy.filters.http.fault";
pub const ROUTER: &str = "envoy.filters.http.router";
const HTTP_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
/// Clusters a configuration may name without defining: both carry a connection to where
/// it was going (its original destination), as Istio's control plane defines them.
pub const PASSTHROUGH: &str = "PassthroughCluster";
pub const INBOUND_PASSTHROUGH: &str = "InboundPassthroughClusterIpv4";

/// Envoy's default circuit-breaker thresholds.
const DEFAULT_THRESHOLD: u32 = 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{kind} {name:?}: {message}")]
    Invalid { kind: &'static str, name: String, message: String },
}

fn invalid(kind: &'static str, name: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { kind, name: name.to_string(), message: message.into() }
}

/// The last accepted resources of every type, by resource name.
#[derive(Debug, Default, Clone)]
pub struct Resources {
    pub clusters: BTreeMap<String, cpb::Cluster>,
    pub endpoints: BTreeMap<String, epb::ClusterLoadAssignment>,
    pub listeners: BTreeMap<String, lpb::Listener>,
    pub routes: BTreeMap<String, rpb::RouteConfiguration>,
}

/// What the data plane reads: immutable, swapped whole.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The listener on the outbound capture port (`use_original_dst`), if configured.
    pub outbound: Option<Arc<Listener>>,
    /// The listener on the inbound capture port.
    pub inbound: Option<Arc<Listener>>,
    /// Listeners that take connections handed over by the outbound listener, by address
    /// (`0.0.0.0:<port>` for wildcard ones).
    pub by_addr: HashMap<SocketAddr, Arc<Listener>>,
    pub clusters: HashMap<String, Arc<Cluster>>,
    pub routes: HashMap<String, Arc<RouteTable>>,
}

#[derive(Debug)]
pub struct Listener {
    pub name: String,
    pub address: SocketAddr,
    pub chains: Vec<FilterChain>,
    pub default_chain: Option<FilterChain>,
}

#[derive(Debug, Clone)]
pub struct FilterChain {
    pub destination_port: Option<u16>,
    pub kind: ChainKind,
}

#[derive(Debug, Clone)]
pub enum ChainKind {
    Tcp(Arc<TcpProxy>),
    Http(Arc<HttpManager>),
}

#[derive(Debug)]
pub struct TcpProxy {
    pub target: Target,
}

/// Where a route or a TCP proxy sends traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Cluster(String),
    /// Clusters with their weights and the weights' total.
    Weighted(Vec<(String, u32)>, u32),
}

#[derive(Debug)]
pub struct HttpManager {
    pub routes: RouteSource,
    /// Whether the fault filter is in the filter chain, and its listener-wide settings.
    pub fault_filter: Option<Option<Arc<Fault>>>,
}

#[derive(Debug)]
pub enum RouteSource {
    Rds(String),
    Inline(Arc<RouteTable>),
}

#[derive(Debug, Default)]
pub struct RouteTable {
    pub virtual_hosts: Vec<VirtualHost>,
    /// Lower-cased exact domains → index into `virtual_hosts`.
    pub exact: HashMap<String, usize>,
    /// `*.suffix` domains, longest first: (suffix with its dot, index).
    pub suffixes: Vec<(String, usize)>,
    /// `prefix.*` domains, longest first: (prefix with its dot, index).
    pub prefixes: Vec<(String, usize)>,
    pub any: Option<usize>,
}

#[derive(Debug)]
pub struct VirtualHost {
    pub name: String,
    pub routes: Vec<Route>,
    pub fault: Option<Arc<Fault>>,
}

#[derive(Debug)]
pub struct Route {
    pub name: String,
    pub path: PathMatch,
    pub case_sensitive: bool,
    pub headers: Vec<HeaderMatch>,
    pub query: Vec<QueryMatch>,
    pub action: Action,
    pub fault: Option<Arc<Fault>>,
}

#[derive(Debug)]
pub enum PathMatch {
    Prefix(String),
    Exact(String),
    Regex(Regex),
}

#[derive(Debug)]
pub struct HeaderMatch {
    /// Lower-cased; `:method`, `:authority`, `:path`, `:scheme` name the pseudo-headers.
    pub name: String,
    pub matcher: ValueMatch,
    pub invert: bool,
    pub missing_as_empty: bool,
}

#[derive(Debug)]
pub struct QueryMatch {
    pub name: String,
    pub matcher: ValueMatch,
}

/// How a header or query value is matched.
#[derive(Debug)]
pub enum ValueMatch {
    Present(bool),
    Str { pattern: StrPattern, ignore_case: bool },
}

#[derive(Debug)]
pub enum StrPattern {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Contains(String),
    Regex(Regex),
}

#[derive(Debug)]
pub enum Action {
    Forward(Forward),
    Direct { status: u16, body: String },
}

#[derive(Debug)]
pub struct Forward {
    pub target: Target,
    pub prefix_rewrite: Option<String>,
    pub regex_rewrite: Option<(Regex, String)>,
    pub host_rewrite: Option<String>,
    pub timeout: Option<Duration>,
    pub retry: Option<Arc<RetryPolicy>>,
}

/// The fault filter's settings for a route (`HTTPFault`).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub delay: Option<(Duration, Percent)>,
    pub abort: Option<(u16, Percent)>,
}

/// A fraction as parts per million.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percent(pub u32);

impl Percent {
    pub const MILLION: u32 = 1_000_000;
    /// Whether a draw in `[0, 1_000_000)` falls inside the fraction.
    pub fn hit(self, draw: u32) -> bool {
        draw < self.0
    }
}

#[derive(Debug)]
pub struct Cluster {
    pub name: String,
    pub kind: ClusterKind,
    pub lb: LbPolicy,
    pub connect_timeout: Duration,
    pub limits: Limits,
    pub outlier: Option<Outlier>,
    pub http2: bool,
    /// Below this share of usable endpoints (percent) all endpoints are used (Envoy's panic mode).
    pub panic_threshold: f64,
    pub endpoints: Vec<Endpoint>,
    pub state: Arc<ClusterState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterKind {
    /// Endpoints from EDS or from the cluster's inline load assignment.
    Endpoints,
    /// The connection's original destination.
    OriginalDst,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbPolicy {
    RoundRobin,
    Random,
    LeastRequest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: u32,
    pub max_pending_requests: u32,
    pub max_requests: u32,
    pub max_retries: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_THRESHOLD,
            max_pending_requests: DEFAULT_THRESHOLD,
            max_requests: DEFAULT_THRESHOLD,
            max_retries: 3,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outlier {
    pub consecutive_5xx: u32,
    pub interval: Duration,
    pub base_ejection_time: Duration,
    pub max_ejection_percent: u32,
}

#[derive(Debug, Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// HEALTHY (or UNKNOWN/DEGRADED, which Envoy treats alike); UNHEALTHY and the rest take
    /// traffic only in panic mode. DRAINING endpoints are not in the list at all.
    pub healthy: bool,
    pub state: Arc<EndpointState>,
}

/// Translate `res` into a snapshot, carrying runtime state over from `prev`.
pub fn build(res: &Resources, prev: Option<&Snapshot>) -> Result<Snapshot, ConfigError> {
    let mut snap = Snapshot::default();
    for (name, c) in &res.clusters {
        let prev_cluster = prev.and_then(|p| p.clusters.get(name));
        let cluster = cluster(c, res, prev_cluster)?;
        snap.clusters.insert(name.clone(), Arc::new(cluster));
    }
    // The passthrough clusters exist even when the control plane does not define them.
    for name in [PASSTHROUGH, INBOUND_PASSTHROUGH] {
        if !snap.clusters.contains_key(name) {
            let state = prev.and_then(|p| p.clusters.get(name)).map(|c| c.state.clone()).unwrap_or_default();
            snap.clusters.insert(name.to_string(), Arc::new(passthrough(name, state)));
        }
    }
    for (name, rc) in &res.routes {
        snap.routes.insert(name.clone(), Arc::new(route_table(rc)?));
    }
    for l in res.listeners.values() {
        let use_original_dst = l.use_original_dst.as_ref().is_some_and(|b| b.value);
        let listener = Arc::new(listener(l)?);
        if use_original_dst
            && (l.name == "virtualInbound" || l.traffic_direction == corepb::TrafficDirection::Inbound as i32)
        {
            snap.inbound = Some(listener);
        } else if use_original_dst {
            snap.outbound = Some(listener);
        } else {
            snap.by_addr.insert(listener.address, listener);
        }
    }
    Ok(snap)
}

/// The resource names of the clusters that take their endpoints from EDS.
pub fn eds_names(clusters: &BTreeMap<String, cpb::Cluster>) -> Vec<String> {
    clusters
        .values()
        .filter(|c| discovery_type(c) == Some(cpb::cluster::DiscoveryType::Eds))
        .map(eds_service_name)
        .collect()
}

/// The route configurations the listeners name (RDS).
pub fn rds_names(listeners: &BTreeMap<String, lpb::Listener>) -> Vec<String> {
    let mut names = Vec::new();
    for l in listeners.values() {
        for chain in l.filter_chains.iter().chain(l.default_filter_chain.as_ref()) {
            for f in &chain.filters {
                if f.name != HCM {
                    continue;
                }
                let Some(any) = typed_config(f) else { continue };
                let Ok(hcm) = decode::<hcmpb::HttpConnectionManager>(any) else { continue };
                if let Some(hcmpb::http_connection_manager::RouteSpecifier::Rds(rds)) = hcm.route_specifier {
                    if !names.contains(&rds.route_config_name) {
                        names.push(rds.route_config_name);
                    }
                }
            }
        }
    }
    names.sort();
    names
}

fn eds_service_name(c: &cpb::Cluster) -> String {
    match &c.eds_cluster_config {
        Some(e) if !e.service_name.is_empty() => e.service_name.clone(),
        _ => c.name.clone(),
    }
}

fn discovery_type(c: &cpb::Cluster) -> Option<cpb::cluster::DiscoveryType> {
    match &c.cluster_discovery_type {
        None => Some(cpb::cluster::DiscoveryType::Static),
        Some(cpb::cluster::ClusterDiscoveryType::Type(t)) => cpb::cluster::DiscoveryType::try_from(*t).ok(),
        Some(cpb::cluster::ClusterDiscoveryType::ClusterType(_)) => None,
    }
}

/// Decode an `Any` holding a `T`, checking its type URL.
pub fn decode<T: prost::Message + prost::Name + Default>(any: &Any) -> Result<T, String> {
    let want = T::full_name();
    let got = any.type_url.rsplit('/').next().unwrap_or_default();
    if got != want {
        return Err(format!("expected {want}, got {}", any.type_url));
    }
    T::decode(any.value.as_slice()).map_err(|e| format!("decoding {want}: {e}"))
}

fn typed_config(f: &lpb::Filter) -> Option<&Any> {
    match &f.config_type {
        Some(lpb::filter::ConfigType::TypedConfig(any)) => Some(any),
        _ => None,
    }
}

fn duration(d: &Option<envoy_types::pb::google::protobuf::Duration>) -> Option<Duration> {
    d.as_ref().map(|d| Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32))
}

fn socket_addr(a: &Option<corepb::Address>) -> Result<SocketAddr, String> {
    let Some(corepb::address::Address::SocketAddress(sa)) = a.as_ref().and_then(|a| a.address.as_ref()) else {
        return Err("address is not a socket address".into());
    };
    let ip: IpAddr = sa.address.parse().map_err(|_| format!("address {:?} is not an IP address", sa.address))?;
    let port = match sa.port_specifier {
        Some(corepb::socket_address::PortSpecifier::PortValue(p)) => {
            u16::try_from(p).map_err(|_| format!("port {p} out of range"))?
        }
        _ => return Err("socket address without a port number".into()),
    };
    Ok(SocketAddr::new(ip, port))
}

// ---------------------------------------------------------------- clusters

#[allow(deprecated)] // http2_protocol_options: the older way to ask for HTTP/2
fn cluster(c: &cpb::Cluster, res: &Resources, prev: Option<&Arc<Cluster>>) -> Result<Cluster, ConfigError> {
    let err = |m: String| invalid("cluster", &c.name, m);
    use cpb::cluster::DiscoveryType as D;
    let dtype = discovery_type(c).ok_or_else(|| err("custom cluster types are not supported".into()))?;
    let kind = match dtype {
        D::Eds | D::Static => ClusterKind::Endpoints,
        D::OriginalDst => ClusterKind::OriginalDst,
        D::StrictDns | D::LogicalDns => return Err(err("DNS cluster types are not supported".into())),
    };
    use cpb::cluster::LbPolicy as L;
    let lb = match L::try_from(c.lb_policy) {
        Ok(L::RoundRobin) => LbPolicy::RoundRobin,
        Ok(L::Random) => LbPolicy::Random,
        Ok(L::LeastRequest) => LbPolicy::LeastRequest,
        // Only meaningful for ORIGINAL_DST clusters, which pick no endpoint.
        Ok(L::ClusterProvided) if kind == ClusterKind::OriginalDst => LbPolicy::RoundRobin,
        Ok(L::ClusterProvided) => return Err(err("CLUSTER_PROVIDED needs an ORIGINAL_DST cluster".into())),
        Ok(other) => return Err(err(format!("lb_policy {} is not supported", other.as_str_name()))),
        Err(_) => return Err(err(format!("unknown lb_policy {}", c.lb_policy))),
    };
    let mut limits = Limits::default();
    if let Some(t) = c.circuit_breakers.as_ref().and_then(|cb| cb.thresholds.first()) {
        let v = |x: &Option<envoy_types::pb::google::protobuf::UInt32Value>, d: u32| x.as_ref().map_or(d, |x| x.value);
        limits = Limits {
            max_connections: v(&t.max_connections, limits.max_connections),
            max_pending_requests: v(&t.max_pending_requests, limits.max_pending_requests),
            max_requests: v(&t.max_requests, limits.max_requests),
            max_retries: v(&t.max_retries, limits.max_retries),
        };
    }
    let outlier = c.outlier_detection.as_ref().map(|o| Outlier {
        consecutive_5xx: o.consecutive_5xx.as_ref().map_or(5, |v| v.value),
        interval: duration(&o.interval).unwrap_or(Duration::from_secs(10)),
        base_ejection_time: duration(&o.base_ejection_time).unwrap_or(Duration::from_secs(30)),
        max_ejection_percent: o.max_ejection_percent.as_ref().map_or(10, |v| v.value.min(100)),
    });
    let mut http2 = c.http2_protocol_options.is_some();
    if let Some(any) = c.typed_extension_protocol_options.get(HTTP_OPTIONS) {
        let opts = decode::<uhpb::HttpProtocolOptions>(any).map_err(err)?;
        use uhpb::http_protocol_options::explicit_http_config::ProtocolConfig as P;
        use uhpb::http_protocol_options::UpstreamProtocolOptions as U;
        if let Some(U::ExplicitHttpConfig(e)) = &opts.upstream_protocol_options {
            http2 = matches!(e.protocol_config, Some(P::Http2ProtocolOptions(_)));
        }
    }
    let panic_threshold =
        c.common_lb_config.as_ref().and_then(|l| l.healthy_panic_threshold.as_ref()).map_or(50.0, |p| p.value);
    let state = prev.map(|p| p.state.clone()).unwrap_or_default();
    let assignment = match dtype {
        D::Eds => res.endpoints.get(&eds_service_name(c)),
        _ => c.load_assignment.as_ref(),
    };
    let endpoints = match assignment {
        Some(cla) => endpoints(cla, prev).map_err(err)?,
        None => Vec::new(),
    };
    Ok(Cluster {
        name: c.name.clone(),
        kind,
        lb,
        connect_timeout: duration(&c.connect_timeout).unwrap_or(Duration::from_secs(5)),
        limits,
        outlier,
        http2,
        panic_threshold,
        endpoints,
        state,
    })
}

/// An `ORIGINAL_DST` cluster with Envoy's defaults.
fn passthrough(name: &str, state: Arc<ClusterState>) -> Cluster {
    Cluster {
        name: name.to_string(),
        kind: ClusterKind::OriginalDst,
        lb: LbPolicy::RoundRobin,
        connect_timeout: Duration::from_secs(10),
        limits: Limits {
            max_connections: u32::MAX,
            max_pending_requests: u32::MAX,
            max_requests: u32::MAX,
            max_retries: u32::MAX,
        },
        outlier: None,
        http2: false,
        panic_threshold: 50.0,
        endpoints: Vec::new(),
        state,
    }
}

fn endpoints(cla: &epb::ClusterLoadAssignment, prev: Option<&Arc<Cluster>>) -> Result<Vec<Endpoint>, String> {
    let mut out = Vec::new();
    for locality in &cla.endpoints {
        for lbe in &locality.lb_endpoints {
            let Some(epb::lb_endpoint::HostIdentifier::Endpoint(ep)) = &lbe.host_identifier else {
                return Err("named endpoints are not supported".into());
            };
            let addr = socket_addr(&ep.address)?;
            use corepb::HealthStatus as H;
            let status = H::try_from(lbe.health_status);
            // Draining endpoints take no new traffic, not even in panic mode (as Envoy
            // excludes them from the host set).
            if status == Ok(H::Draining) {
                continue;
            }
            let healthy = matches!(status, Ok(H::Unknown | H::Healthy | H::Degraded));
            let state = prev
                .and_then(|p| p.endpoints.iter().find(|e| e.addr == addr))
                .map(|e| e.state.clone())
                .unwrap_or_default();
            out.push(Endpoint { addr, healthy, state });
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- listeners

fn listener(l: &lpb::Listener) -> Result<Listener, ConfigError> {
    let err = |m: String| invalid("listener", &l.name, m);
    let address = socket_addr(&l.address).map_err(err)?;
    let mut chains = Vec::new();
    for fc in &l.filter_chains {
        if let Some(m) = &fc.filter_chain_match {
            // Chains for TLS or for particular server names/protocols need a TLS or protocol
            // inspector we do not have: they never match a plaintext connection here.
            if m.transport_protocol == "tls" || !m.server_names.is_empty() || !m.application_protocols.is_empty() {
                continue;
            }
        }
        chains.push(filter_chain(&l.name, fc)?);
    }
    let default_chain = l.default_filter_chain.as_ref().map(|fc| filter_chain(&l.name, fc)).transpose()?;
    Ok(Listener { name: l.name.clone(), address, chains, default_chain })
}

fn filter_chain(listener: &str, fc: &lpb::FilterChain) -> Result<FilterChain, ConfigError> {
    let err = |m: String| invalid("listener", listener, m);
    let destination_port = match fc.filter_chain_match.as_ref().and_then(|m| m.destination_port.as_ref()) {
        Some(p) => Some(u16::try_from(p.value).map_err(|_| err(format!("destination_port {} out of range", p.value)))?),
        None => None,
    };
    let mut kind = None;
    for f in &fc.filters {
        let any = typed_config(f);
        let k = match f.name.as_str() {
            HCM => {
                let any = any.ok_or_else(|| err(format!("{HCM} without typed_config")))?;
                let hcm = decode::<hcmpb::HttpConnectionManager>(any).map_err(err)?;
                ChainKind::Http(Arc::new(http_manager(listener, &hcm)?))
            }
            TCP_PROXY => {
                let any = any.ok_or_else(|| err(format!("{TCP_PROXY} without typed_config")))?;
                let tcp = decode::<tcppb::TcpProxy>(any).map_err(err)?;
                ChainKind::Tcp(Arc::new(tcp_proxy(listener, &tcp)?))
            }
            // Filters that only observe (stats, metadata exchange) change nothing we carry.
            "istio.stats" | "istio.metadata_exchange" | "envoy.filters.network.connection_limit" => continue,
            other => return Err(err(format!("network filter {other:?} is not supported"))),
        };
        if kind.is_some() {
            return Err(err("a filter chain may end in only one terminal filter".into()));
        }
        kind = Some(k);
    }
    let kind = kind.ok_or_else(|| err("filter chain without a tcp_proxy or http_connection_manager".into()))?;
    Ok(FilterChain { destination_port, kind })
}

fn tcp_proxy(listener: &str, t: &tcppb::TcpProxy) -> Result<TcpProxy, ConfigError> {
    use tcppb::tcp_proxy::ClusterSpecifier as C;
    let target = match &t.cluster_specifier {
        Some(C::Cluster(c)) => Target::Cluster(c.clone()),
        Some(C::WeightedClusters(w)) => {
            let clusters: Vec<(String, u32)> = w.clusters.iter().map(|c| (c.name.clone(), c.weight)).collect();
            let total = clusters.iter().map(|c| c.1).sum();
            if total == 0 {
                return Err(invalid("listener", listener, "tcp_proxy weighted_clusters with no weight"));
            }
            Target::Weighted(clusters, total)
        }
        None => return Err(invalid("listener", listener, "tcp_proxy without a cluster")),
    };
    Ok(TcpProxy { target })
}

fn http_manager(listener: &str, hcm: &hcmpb::HttpConnectionManager) -> Result<HttpManager, ConfigError> {
    let err = |m: String| invalid("listener", listener, m);
    use hcmpb::http_connection_manager::RouteSpecifier as R;
    let routes = match &hcm.route_specifier {
        Some(R::Rds(rds)) => RouteSource::Rds(rds.route_config_name.clone()),
        Some(R::RouteConfig(rc)) => RouteSource::Inline(Arc::new(route_table(rc)?)),
        _ => return Err(err("http_connection_manager needs rds or route_config".into())),
    };
    let mut fault_filter = None;
    let mut router = false;
    for f in &hcm.http_filters {
        if f.disabled {
            continue;
        }
        let any = match &f.config_type {
            Some(hcmpb::http_filter::ConfigType::TypedConfig(any)) => Some(any),
            _ => None,
        };
        match f.name.as_str() {
            FAULT => {
                let fault = match any {
                    Some(any) => Some(Arc::new(fault(&decode::<faultpb::HttpFault>(any).map_err(&err)?))),
                    None => None,
                };
                fault_filter = Some(fault.filter(|f| f.delay.is_some() || f.abort.is_some()));
            }
            ROUTER => router = true,
            "istio.stats" | "istio.metadata_exchange" | "istio.alpn" | "envoy.filters.http.grpc_stats" => {}
            other if f.is_optional => tracing::debug!(filter = other, "optional http filter ignored"),
            other => return Err(err(format!("http filter {other:?} is not supported"))),
        }
    }
    if !router {
        return Err(err(format!("http_connection_manager without {ROUTER}")));
    }
    Ok(HttpManager { routes, fault_filter })
}

fn fault(f: &faultpb::HttpFault) -> Fault {
    let delay = f.delay.as_ref().and_then(|d| match &d.fault_delay_secifier {
        Some(cfaultpb::fault_delay::FaultDelaySecifier::FixedDelay(dur)) => {
            Some((duration(&Some(*dur)).unwrap_or_default(), percent(&d.percentage)))
        }
        _ => None,
    });
    let abort = f.abort.as_ref().and_then(|a| match a.error_type {
        Some(faultpb::fault_abort::ErrorType::HttpStatus(code)) => {
            u16::try_from(code).ok().map(|code| (code, percent(&a.percentage)))
        }
        _ => None,
    });
    Fault { delay, abort }
}

/// A `FractionalPercent` as parts per million; absent means 100% (Envoy's default).
fn percent(p: &Option<FractionalPercent>) -> Percent {
    let Some(p) = p else { return Percent(Percent::MILLION) };
    use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType as D;
    let per_million = match D::try_from(p.denominator) {
        Ok(D::Hundred) | Err(_) => u64::from(p.numerator) * 10_000,
        Ok(D::TenThousand) => u64::from(p.numerator) * 100,
        Ok(D::Million) => u64::from(p.numerator),
    };
    Percent(per_million.min(u64::from(Percent::MILLION)) as u32)
}

// ---------------------------------------------------------------- routes

fn route_table(rc: &rpb::RouteConfiguration) -> Result<RouteTable, ConfigError> {
    let mut t = RouteTable::default();
    for (i, vh) in rc.virtual_hosts.iter().enumerate() {
        t.virtual_hosts.push(virtual_host(&rc.name, vh)?);
        for d in &vh.domains {
            let d = d.to_ascii_lowercase();
            if d == "*" {
                t.any.get_or_insert(i);
            } else if let Some(suffix) = d.strip_prefix('*') {
                t.suffixes.push((suffix.to_string(), i));
            } else if let Some(prefix) = d.strip_suffix('*') {
                t.prefixes.push((prefix.to_string(), i));
            } else if t.exact.insert(d.clone(), i).is_some() {
                return Err(invalid("route configuration", &rc.name, format!("domain {d:?} is in two virtual hosts")));
            }
        }
    }
    t.suffixes.sort_by_key(|s| std::cmp::Reverse(s.0.len()));
    t.prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
    Ok(t)
}

fn per_filter_fault(rc: &str, cfg: &std::collections::HashMap<String, Any>) -> Result<Option<Arc<Fault>>, ConfigError> {
    match cfg.get(FAULT) {
        None => Ok(None),
        Some(any) => {
            let f = decode::<faultpb::HttpFault>(any).map_err(|m| invalid("route configuration", rc, m))?;
            Ok(Some(Arc::new(fault(&f))))
        }
    }
}

fn virtual_host(rc: &str, vh: &rpb::VirtualHost) -> Result<VirtualHost, ConfigError> {
    let retry = vh.retry_policy.as_ref().map(|r| Arc::new(retry_policy(r)));
    let mut routes = Vec::with_capacity(vh.routes.len());
    for r in &vh.routes {
        routes.push(route(rc, r, retry.as_ref())?);
    }
    Ok(VirtualHost { name: vh.name.clone(), routes, fault: per_filter_fault(rc, &vh.typed_per_filter_config)? })
}

/// Compile an RE2 pattern that must match a whole value.
fn full_regex(rc: &str, pattern: &str) -> Result<Regex, ConfigError> {
    let err = |e: regex::Error| {
        // The parser's message spans lines (pattern, caret, error): keep the error.
        let text = e.to_string();
        let why = text.lines().last().unwrap_or_default().trim_start_matches("error: ").to_string();
        invalid("route configuration", rc, format!("regex {pattern:?} does not compile: {why}"))
    };
    Regex::new(pattern).map_err(err)?;
    Regex::new(&format!("^(?:{pattern})$")).map_err(err)
}

fn route(rc: &str, r: &rpb::Route, vh_retry: Option<&Arc<RetryPolicy>>) -> Result<Route, ConfigError> {
    let err = |m: String| invalid("route configuration", rc, format!("route {:?}: {m}", r.name));
    let m = r.r#match.as_ref().ok_or_else(|| err("route without match".into()))?;
    use rpb::route_match::PathSpecifier as P;
    let path = match &m.path_specifier {
        Some(P::Prefix(p)) => PathMatch::Prefix(p.clone()),
        Some(P::Path(p)) => PathMatch::Exact(p.clone()),
        Some(P::SafeRegex(re)) => PathMatch::Regex(full_regex(rc, &re.regex)?),
        Some(P::PathSeparatedPrefix(p)) => PathMatch::Prefix(p.clone()),
        _ => return Err(err("unsupported path match".into())),
    };
    let case_sensitive = m.case_sensitive.as_ref().is_none_or(|b| b.value);
    let path = match (path, case_sensitive) {
        (PathMatch::Prefix(p), false) => PathMatch::Prefix(p.to_ascii_lowercase()),
        (PathMatch::Exact(p), false) => PathMatch::Exact(p.to_ascii_lowercase()),
        (p, _) => p,
    };
    let mut headers = Vec::with_capacity(m.headers.len());
    for h in &m.headers {
        headers.push(header_match(rc, h)?);
    }
    let mut query = Vec::with_capacity(m.query_parameters.len());
    for q in &m.query_parameters {
        use rpb::query_parameter_matcher::QueryParameterMatchSpecifier as Q;
        let matcher = match &q.query_parameter_match_specifier {
            Some(Q::StringMatch(s)) => string_match(rc, s)?,
            Some(Q::PresentMatch(b)) => ValueMatch::Present(*b),
            None => ValueMatch::Present(true),
        };
        query.push(QueryMatch { name: q.name.clone(), matcher });
    }
    let action = match &r.action {
        Some(rpb::route::Action::Route(ra)) => Action::Forward(forward(rc, ra, vh_retry, &path).map_err(err)?),
        Some(rpb::route::Action::DirectResponse(d)) => {
            let body = match d.body.as_ref().and_then(|b| b.specifier.as_ref()) {
                Some(corepb::data_source::Specifier::InlineString(s)) => s.clone(),
                Some(corepb::data_source::Specifier::InlineBytes(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            };
            let status = u16::try_from(d.status).ok().filter(|s| (200..600).contains(s));
            Action::Direct { status: status.ok_or_else(|| err(format!("bad status {}", d.status)))?, body }
        }
        _ => return Err(err("only route and direct_response actions are supported".into())),
    };
    Ok(Route {
        name: r.name.clone(),
        path,
        case_sensitive,
        headers,
        query,
        action,
        fault: per_filter_fault(rc, &r.typed_per_filter_config)?,
    })
}

#[allow(deprecated)] // the older header_matcher fields are still what control planes send
fn header_match(rc: &str, h: &rpb::HeaderMatcher) -> Result<HeaderMatch, ConfigError> {
    use rpb::header_matcher::HeaderMatchSpecifier as H;
    let s = |p: StrPattern| ValueMatch::Str { pattern: p, ignore_case: false };
    let matcher = match &h.header_match_specifier {
        Some(H::ExactMatch(v)) => s(StrPattern::Exact(v.clone())),
        Some(H::PrefixMatch(v)) => s(StrPattern::Prefix(v.clone())),
        Some(H::SuffixMatch(v)) => s(StrPattern::Suffix(v.clone())),
        Some(H::ContainsMatch(v)) => s(StrPattern::Contains(v.clone())),
        Some(H::SafeRegexMatch(re)) => s(StrPattern::Regex(full_regex(rc, &re.regex)?)),
        Some(H::PresentMatch(b)) => ValueMatch::Present(*b),
        Some(H::StringMatch(sm)) => string_match(rc, sm)?,
        Some(H::RangeMatch(_)) => {
            return Err(invalid("route configuration", rc, format!("header {:?}: range match unsupported", h.name)))
        }
        None => ValueMatch::Present(true),
    };
    Ok(HeaderMatch {
        name: h.name.to_ascii_lowercase(),
        matcher,
        invert: h.invert_match,
        missing_as_empty: h.treat_missing_header_as_empty,
    })
}

fn string_match(rc: &str, m: &mpb::StringMatcher) -> Result<ValueMatch, ConfigError> {
    use mpb::string_matcher::MatchPattern as M;
    let lower = |v: &String| if m.ignore_case { v.to_ascii_lowercase() } else { v.clone() };
    let pattern = match &m.match_pattern {
        Some(M::Exact(v)) => StrPattern::Exact(lower(v)),
        Some(M::Prefix(v)) => StrPattern::Prefix(lower(v)),
        Some(M::Suffix(v)) => StrPattern::Suffix(lower(v)),
        Some(M::Contains(v)) => StrPattern::Contains(lower(v)),
        Some(M::SafeRegex(re)) => StrPattern::Regex(full_regex(rc, &re.regex)?),
        _ => return Err(invalid("route configuration", rc, "unsupported string matcher")),
    };
    Ok(ValueMatch::Str { pattern, ignore_case: m.ignore_case })
}

#[allow(deprecated)] // total_weight: still honoured when given
fn forward(
    rc: &str,
    ra: &rpb::RouteAction,
    vh_retry: Option<&Arc<RetryPolicy>>,
    path: &PathMatch,
) -> Result<Forward, String> {
    use rpb::route_action::ClusterSpecifier as C;
    let target = match &ra.cluster_specifier {
        Some(C::Cluster(c)) => Target::Cluster(c.clone()),
        Some(C::WeightedClusters(w)) => {
            let clusters: Vec<(String, u32)> =
                w.clusters.iter().map(|c| (c.name.clone(), c.weight.as_ref().map_or(0, |w| w.value))).collect();
            let sum: u32 = clusters.iter().map(|c| c.1).sum();
            let total = w.total_weight.as_ref().map_or(sum, |t| t.value);
            if total == 0 || sum == 0 {
                return Err("weighted_clusters with no weight".into());
            }
            Target::Weighted(clusters, total)
        }
        _ => return Err("only cluster and weighted_clusters are supported".into()),
    };
    let prefix_rewrite = Some(ra.prefix_rewrite.clone()).filter(|p| !p.is_empty());
    if prefix_rewrite.is_some() && matches!(path, PathMatch::Regex(_)) {
        return Err("prefix_rewrite with a safe_regex match".into());
    }
    let regex_rewrite = match &ra.regex_rewrite {
        Some(rr) => {
            let pattern = rr.pattern.as_ref().map(|p| p.regex.as_str()).unwrap_or_default();
            let re = Regex::new(pattern).map_err(|e| format!("regex_rewrite {pattern:?} does not compile: {e}"))?;
            Some((re, re2_substitution(&rr.substitution)))
        }
        None => None,
    };
    use rpb::route_action::HostRewriteSpecifier as HR;
    let host_rewrite = match &ra.host_rewrite_specifier {
        Some(HR::HostRewriteLiteral(h)) => Some(h.clone()),
        _ => None,
    };
    let _ = rc;
    let retry = match &ra.retry_policy {
        Some(r) => Some(Arc::new(retry_policy(r))),
        None => vh_retry.cloned(),
    };
    Ok(Forward {
        target,
        prefix_rewrite,
        regex_rewrite,
        host_rewrite,
        timeout: duration(&ra.timeout).filter(|d| !d.is_zero()),
        retry,
    })
}

/// RE2's `\1` back-references in a substitution, as the regex crate writes them (`${1}`).
fn re2_substitution(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek().is_some_and(char::is_ascii_digit) => {
                out.push_str("${");
                while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                    out.push(d);
                    chars.next();
                }
                out.push('}');
            }
            '$' => out.push_str("$$"),
            c => out.push(c),
        }
    }
    out
}

fn retry_policy(r: &rpb::RetryPolicy) -> RetryPolicy {
    RetryPolicy {
        on: RetryOn::parse(&r.retry_on),
        num_retries: r.num_retries.as_ref().map_or(1, |n| n.value),
        per_try_timeout: duration(&r.per_try_timeout).filter(|d| !d.is_zero()),
        retriable_status_codes: r.retriable_status_codes.iter().filter_map(|c| u16::try_from(*c).ok()).collect(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};

    pub fn any<T: prost::Message + prost::Name>(m: &T) -> Any {
        Any { type_url: T::type_url(), value: m.encode_to_vec() }
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

    pub fn eds_cluster(name: &str) -> cpb::Cluster {
        cpb::Cluster {
            name: name.into(),
            cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(
                cpb::cluster::DiscoveryType::Eds as i32,
            )),
            eds_cluster_config: Some(cpb::cluster::EdsClusterConfig { service_name: name.into(), eds_config: None }),
            ..Default::default()
        }
    }

    pub fn cla(name: &str, eps: &[(&str, u32, corepb::HealthStatus)]) -> epb::ClusterLoadAssignment {
        epb::ClusterLoadAssignment {
            cluster_name: name.into(),
            endpoints: vec![epb::LocalityLbEndpoints {
                lb_endpoints: eps
                    .iter()
                    .map(|(ip, port, h)| epb::LbEndpoint {
                        health_status: *h as i32,
                        host_identifier: Some(epb::lb_endpoint::HostIdentifier::Endpoint(epb::Endpoint {
                            address: sock(ip, *port),
                            ..Default::default()
                        })),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    pub fn route_to(name: &str, m: rpb::RouteMatch, cluster: &str) -> rpb::Route {
        rpb::Route {
            name: name.into(),
            r#match: Some(m),
            action: Some(rpb::route::Action::Route(rpb::RouteAction {
                cluster_specifier: Some(rpb::route_action::ClusterSpecifier::Cluster(cluster.into())),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    pub fn prefix(p: &str) -> rpb::RouteMatch {
        rpb::RouteMatch {
            path_specifier: Some(rpb::route_match::PathSpecifier::Prefix(p.into())),
            ..Default::default()
        }
    }

    pub fn regex_path(p: &str) -> rpb::RouteMatch {
        rpb::RouteMatch {
            path_specifier: Some(rpb::route_match::PathSpecifier::SafeRegex(mpb::RegexMatcher {
                regex: p.into(),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    pub fn route_config(name: &str, vhosts: Vec<(&str, Vec<&str>, Vec<rpb::Route>)>) -> rpb::RouteConfiguration {
        rpb::RouteConfiguration {
            name: name.into(),
            virtual_hosts: vhosts
                .into_iter()
                .map(|(n, domains, routes)| rpb::VirtualHost {
                    name: n.into(),
                    domains: domains.into_iter().map(String::from).collect(),
                    routes,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    pub fn http_listener(name: &str, ip: &str, port: u32, rds: &str) -> lpb::Listener {
        let hcm = hcmpb::HttpConnectionManager {
            stat_prefix: name.into(),
            route_specifier: Some(hcmpb::http_connection_manager::RouteSpecifier::Rds(hcmpb::Rds {
                route_config_name: rds.into(),
                config_source: None,
            })),
            http_filters: vec![hcmpb::HttpFilter { name: ROUTER.into(), ..Default::default() }],
            ..Default::default()
        };
        lpb::Listener {
            name: name.into(),
            address: sock(ip, port),
            bind_to_port: Some(BoolValue { value: false }),
            filter_chains: vec![lpb::FilterChain {
                filters: vec![lpb::Filter {
                    name: HCM.into(),
                    config_type: Some(lpb::filter::ConfigType::TypedConfig(any(&hcm))),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn resources() -> Resources {
        let mut r = Resources::default();
        r.clusters.insert(
            "outbound|80||a.default.svc.cluster.local".into(),
            eds_cluster("outbound|80||a.default.svc.cluster.local"),
        );
        r.endpoints.insert(
            "outbound|80||a.default.svc.cluster.local".into(),
            cla(
                "outbound|80||a.default.svc.cluster.local",
                &[
                    ("10.0.0.1", 8080, corepb::HealthStatus::Healthy),
                    ("10.0.0.2", 8080, corepb::HealthStatus::Draining),
                ],
            ),
        );
        r.listeners.insert("0.0.0.0_80".into(), http_listener("0.0.0.0_80", "0.0.0.0", 80, "80"));
        r.routes.insert(
            "80".into(),
            route_config(
                "80",
                vec![(
                    "a.default.svc.cluster.local:80",
                    vec!["a", "a:80", "a.default.svc.cluster.local"],
                    vec![route_to("r", prefix("/"), "outbound|80||a.default.svc.cluster.local")],
                )],
            ),
        );
        r
    }

    #[test]
    fn translates_the_contracts_resources() {
        let snap = build(&resources(), None).unwrap();
        let c = &snap.clusters["outbound|80||a.default.svc.cluster.local"];
        assert_eq!(c.endpoints.len(), 1, "DRAINING endpoints are left out");
        assert!(c.endpoints[0].healthy);
        assert_eq!(c.lb, LbPolicy::RoundRobin);
        let l = &snap.by_addr[&"0.0.0.0:80".parse().unwrap()];
        assert!(
            matches!(&l.chains[0].kind, ChainKind::Http(h) if matches!(&h.routes, RouteSource::Rds(n) if n == "80"))
        );
        assert_eq!(snap.routes["80"].exact["a:80"], 0);
        assert_eq!(rds_names(&resources().listeners), vec!["80".to_string()]);
        assert_eq!(eds_names(&resources().clusters), vec!["outbound|80||a.default.svc.cluster.local".to_string()]);
    }

    #[test]
    fn carries_runtime_state_over() {
        let first = build(&resources(), None).unwrap();
        let c = &first.clusters["outbound|80||a.default.svc.cluster.local"];
        c.endpoints[0].state.consecutive_5xx.store(3, std::sync::atomic::Ordering::Relaxed);
        let second = build(&resources(), Some(&first)).unwrap();
        let c2 = &second.clusters["outbound|80||a.default.svc.cluster.local"];
        assert!(Arc::ptr_eq(&c.state, &c2.state));
        assert_eq!(c2.endpoints[0].state.consecutive_5xx.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    #[test]
    fn invalid_regex_is_an_error() {
        let mut r = resources();
        r.routes.insert(
            "80".into(),
            route_config("80", vec![("v", vec!["*"], vec![route_to("bad", regex_path("/(unclosed"), "x")])]),
        );
        let e = build(&r, None).unwrap_err();
        assert!(e.to_string().contains("does not compile"), "{e}");
    }

    #[test]
    fn unknown_filter_is_an_error() {
        let mut r = resources();
        let mut l = http_listener("0.0.0.0_80", "0.0.0.0", 80, "80");
        l.filter_chains[0].filters[0].name = "envoy.filters.network.redis_proxy".into();
        r.listeners.insert(l.name.clone(), l);
        assert!(build(&r, None).unwrap_err().to_string().contains("not supported"));
    }

    #[test]
    fn cluster_settings() {
        let mut c = eds_cluster("c");
        c.lb_policy = cpb::cluster::LbPolicy::LeastRequest as i32;
        c.circuit_breakers = Some(cpb::CircuitBreakers {
            thresholds: vec![cpb::circuit_breakers::Thresholds {
                max_connections: Some(UInt32Value { value: 1 }),
                max_pending_requests: Some(UInt32Value { value: 2 }),
                ..Default::default()
            }],
            ..Default::default()
        });
        c.outlier_detection = Some(cpb::OutlierDetection {
            consecutive_5xx: Some(UInt32Value { value: 1 }),
            max_ejection_percent: Some(UInt32Value { value: 100 }),
            ..Default::default()
        });
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
        c.typed_extension_protocol_options.insert(HTTP_OPTIONS.into(), any(&opts));
        let mut r = Resources::default();
        r.clusters.insert("c".into(), c);
        let snap = build(&r, None).unwrap();
        let c = &snap.clusters["c"];
        assert_eq!(c.lb, LbPolicy::LeastRequest);
        assert_eq!(c.limits.max_connections, 1);
        assert_eq!(c.limits.max_pending_requests, 2);
        assert_eq!(c.limits.max_requests, 1024);
        assert_eq!(c.outlier.unwrap().consecutive_5xx, 1);
        assert_eq!(c.outlier.unwrap().base_ejection_time, Duration::from_secs(30));
        assert!(c.http2);
        assert!(c.endpoints.is_empty(), "no EDS yet");
    }

    #[test]
    fn fault_percentages() {
        let f = faultpb::HttpFault {
            abort: Some(faultpb::FaultAbort {
                percentage: Some(FractionalPercent { numerator: 50, denominator: 0 }),
                error_type: Some(faultpb::fault_abort::ErrorType::HttpStatus(418)),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(fault(&f).abort, Some((418, Percent(500_000))));
        assert!(Percent(500_000).hit(499_999));
        assert!(!Percent(500_000).hit(500_000));
    }

    #[test]
    fn substitution_backreferences() {
        assert_eq!(re2_substitution(r"/v2/\1"), "/v2/${1}");
        assert_eq!(re2_substitution("$x"), "$$x");
    }
}
