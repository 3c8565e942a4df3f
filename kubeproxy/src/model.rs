//! What the proxy needs to know about Services and EndpointSlices, computed as a pure
//! function of the API objects (Kubernetes' `ServicePortMap` + `EndpointsMap` +
//! `CategorizeEndpoints`).
//!
//! [`service_ports`] turns Services and EndpointSlices into one [`ServicePort`] per
//! (service, port) with the endpoints that cluster-internal and external traffic may use,
//! after applying ready/serving/terminating rules and the traffic policies. Every proxy
//! mode renders its rules from this list and nothing else, the LoadBalancer firewall
//! (`loadBalancerSourceRanges`) included; the health check server
//! ([`crate::healthcheck`]) reads the same list.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label on an EndpointSlice naming its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// A Service with this label is served by another proxy, not this one.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Default session affinity timeout (seconds), as in Kubernetes.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;

/// Transport protocol of a service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
    /// Lower-case name as used by iptables/nftables (`tcp`).
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// `namespace/name:port` — Kubernetes' `ServicePortName`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub namespace: String,
    pub name: String,
    pub port: String,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}/{}", self.namespace, self.name)
        } else {
            write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
        }
    }
}

/// An IPv4 CIDR, its address reduced to the network (as Kubernetes prints a parsed one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub network: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    /// `a.b.c.d/n` (surrounding spaces allowed, as in `loadBalancerSourceRanges`); `None`
    /// for anything else, IPv6 included.
    pub fn parse(s: &str) -> Option<Cidr> {
        let (addr, prefix) = s.trim().split_once('/')?;
        let addr: Ipv4Addr = addr.parse().ok()?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32)?;
        Some(Cidr { network: Ipv4Addr::from(u32::from(addr) & Self::mask(prefix)), prefix })
    }

    /// The one address `ip`.
    pub fn host(ip: Ipv4Addr) -> Cidr {
        Cidr { network: ip, prefix: 32 }
    }

    fn mask(prefix: u8) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & Self::mask(self.prefix) == u32::from(self.network)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// One backend of a service port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// On this node (its `nodeName` is ours).
    pub local: bool,
}

impl Endpoint {
    /// `ip:port`, as used in chain-name hashes and DNAT targets.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }
}

/// Everything the rules of one service port depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub protocol: Protocol,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    pub node_port: Option<u16>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<Ipv4Addr>,
    /// `status.loadBalancer.ingress[].ip` (VIP-mode ones: the traffic arrives addressed to them).
    pub load_balancer_ips: Vec<Ipv4Addr>,
    /// `spec.loadBalancerSourceRanges`: when set, only these sources may reach the load
    /// balancer IPs (node ports and external IPs are not filtered, as in Kubernetes).
    pub load_balancer_source_ranges: Vec<Cidr>,
    /// One of the source ranges holds this node's IP: the node may then also reach the
    /// load balancer IPs from the load balancer IPs themselves (a VIP bound on the node
    /// loops back with itself as source).
    pub source_ranges_allow_node: bool,
    /// `spec.healthCheckNodePort` of a LoadBalancer with `externalTrafficPolicy: Local`.
    pub health_check_node_port: Option<u16>,
    /// `sessionAffinity: ClientIP` timeout in seconds.
    pub affinity_timeout: Option<u32>,
    pub internal_policy_local: bool,
    pub external_policy_local: bool,
    /// Every endpoint known for this port (deduplicated, sorted).
    pub all_endpoints: Vec<Endpoint>,
    /// The endpoints cluster-internal traffic goes to (after `internalTrafficPolicy`).
    pub cluster_endpoints: Vec<Endpoint>,
    /// The endpoints external traffic (node ports, external/LB IPs) goes to.
    pub external_endpoints: Vec<Endpoint>,
    /// Whether any endpoint exists at all (to tell "no endpoints" from "no local endpoints").
    pub has_any_endpoint: bool,
}

impl ServicePort {
    /// Has external destinations (node port, external IPs, load balancer IPs).
    pub fn has_external(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }

    /// Which of the port's two endpoint chains exist and what they choose from, as
    /// Kubernetes' proxies decide it: the cluster chain (every usable endpoint) when either
    /// traffic policy is Cluster, the local chain (the usable local ones) when either is Local.
    pub fn chain_endpoints(&self) -> ChainEndpoints {
        let external = self.has_external();
        let uses_cluster = !self.internal_policy_local || (external && !self.external_policy_local);
        let uses_local = self.internal_policy_local || (external && self.external_policy_local);
        ChainEndpoints {
            cluster: uses_cluster.then(|| usable(&self.all_endpoints, |_| true)),
            local: uses_local.then(|| usable(&self.all_endpoints, |e| e.local)),
        }
    }

    /// Traffic to the load balancer IPs goes through a firewall (Kubernetes' `usesFWChain`
    /// before the endpoint condition each mode adds).
    pub fn uses_firewall(&self) -> bool {
        !self.load_balancer_ips.is_empty() && !self.load_balancer_source_ranges.is_empty()
    }

    /// The sources the firewall lets through: the source ranges, then the load balancer
    /// IPs themselves when a range holds this node's IP.
    pub fn firewall_sources(&self) -> Vec<Cidr> {
        let mut sources = self.load_balancer_source_ranges.clone();
        if self.source_ranges_allow_node {
            sources.extend(self.load_balancer_ips.iter().copied().map(Cidr::host));
        }
        sources
    }
}

/// Node facts the computation needs.
#[derive(Clone, Debug, Default)]
pub struct NodeInfo {
    pub name: String,
    /// The node's primary IP (`--node-ip`, else its Node's address), for
    /// `loadBalancerSourceRanges` that allow the node itself.
    pub ip: Option<Ipv4Addr>,
}

impl NodeInfo {
    pub fn named(name: impl Into<String>) -> NodeInfo {
        NodeInfo { name: name.into(), ip: None }
    }
}

/// A Node's primary IPv4 address as Kubernetes picks it: its first `InternalIP`, else its
/// first `ExternalIP`.
pub fn node_primary_ip(node: &Node) -> Option<Ipv4Addr> {
    let addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    let of = |kind: &str| {
        addresses.into_iter().flatten().filter(|a| a.type_ == kind).find_map(|a| a.address.parse::<Ipv4Addr>().ok())
    };
    of("InternalIP").or_else(|| of("ExternalIP"))
}

/// A service port's endpoint chains ([`ServicePort::chain_endpoints`]): `None` for a chain
/// the port does not use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChainEndpoints {
    pub cluster: Option<Vec<Endpoint>>,
    pub local: Option<Vec<Endpoint>>,
}

impl ChainEndpoints {
    /// Every endpoint a used chain chooses from, once each.
    pub fn used(&self) -> BTreeSet<&Endpoint> {
        self.cluster.iter().chain(&self.local).flatten().collect()
    }
}

/// Kubernetes' `CategorizeEndpoints` for one set of endpoints: ready ones, else
/// serving-and-terminating ones (the fallback while a rollout drains).
pub fn usable(endpoints: &[Endpoint], filter: impl Fn(&Endpoint) -> bool) -> Vec<Endpoint> {
    let ready: Vec<Endpoint> = endpoints.iter().filter(|e| e.ready && filter(e)).cloned().collect();
    if !ready.is_empty() {
        return ready;
    }
    endpoints.iter().filter(|e| e.serving && e.terminating && filter(e)).cloned().collect()
}

/// The service ports the proxy must program, sorted by name and protocol.
///
/// Skips headless (`clusterIP: None`) and `ExternalName` services and non-IPv4 addresses.
pub fn service_ports(services: &[Service], slices: &[EndpointSlice], node: &NodeInfo) -> Vec<ServicePort> {
    let by_service = slices_by_service(slices);
    let mut out = Vec::new();
    let empty = Vec::new();
    for svc in services {
        let key = service_key(svc);
        service_ports_of(svc, by_service.get(&key).unwrap_or(&empty), node, &mut out);
    }
    out.sort_by(|a, b| (&a.name, a.protocol).cmp(&(&b.name, b.protocol)));
    out
}

/// The IPv4 EndpointSlices of each Service, by (namespace, service name).
fn slices_by_service<E: Borrow<EndpointSlice>>(slices: &[E]) -> HashMap<(&str, &str), Vec<&EndpointSlice>> {
    let mut by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for s in slices.iter().map(Borrow::borrow) {
        if s.address_type != "IPv4" {
            continue;
        }
        let Some(svc) = s.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)) else { continue };
        by_service.entry((s.metadata.namespace.as_deref().unwrap_or(""), svc)).or_default().push(s);
    }
    by_service
}

/// A Service's (namespace, name), as its slices name it.
fn service_key(svc: &Service) -> (&str, &str) {
    (svc.metadata.namespace.as_deref().unwrap_or("default"), svc.metadata.name.as_deref().unwrap_or_default())
}

/// [`service_ports`] kept between syncs: a Service's ports are computed again only when the
/// Service or one of its EndpointSlices changed (by resourceVersion), as kube-proxy's change
/// trackers do; an object without a resourceVersion counts as changed every time.
///
/// It also collects the `endpoints.kubernetes.io/last-change-trigger-time` of each slice
/// that changed (times after the cache was made, as kube-proxy's endpoints tracker), for
/// `network_programming_duration_seconds`.
pub struct PortCache {
    /// namespace → name → its ports.
    services: HashMap<String, HashMap<String, Cached>>,
    generation: u64,
    started: jiff::Timestamp,
    trigger_times: Vec<jiff::Timestamp>,
}

impl Default for PortCache {
    fn default() -> Self {
        PortCache::since(jiff::Timestamp::now())
    }
}

struct Cached {
    /// The Service's resourceVersion, then its slices' names and resourceVersions.
    versions: Option<Vec<String>>,
    ports: Vec<Arc<ServicePort>>,
    seen: u64,
    /// slice name → its trigger-time annotation.
    triggers: HashMap<String, String>,
}

/// The annotation the EndpointSlice controller sets to when the change a slice carries happened.
pub const LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

impl PortCache {
    /// A cache that collects trigger times after `started`.
    pub fn since(started: jiff::Timestamp) -> PortCache {
        PortCache { services: HashMap::new(), generation: 0, started, trigger_times: Vec::new() }
    }

    /// The trigger times of the changes computed since the last call.
    pub fn take_trigger_times(&mut self) -> Vec<jiff::Timestamp> {
        std::mem::take(&mut self.trigger_times)
    }

    /// The same list as [`service_ports`] of the same objects.
    pub fn ports<S: Borrow<Service>, E: Borrow<EndpointSlice>>(
        &mut self,
        services: &[S],
        slices: &[E],
        node: &NodeInfo,
    ) -> Vec<Arc<ServicePort>> {
        self.generation += 1;
        let mut by_service = slices_by_service(slices);
        let mut out = Vec::new();
        for svc in services {
            let svc = svc.borrow();
            let (ns, name) = service_key(svc);
            let mut svc_slices = by_service.remove(&(ns, name)).unwrap_or_default();
            svc_slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            // (Compared before anything is copied: most Services did not change.)
            let metas = || std::iter::once(&svc.metadata).chain(svc_slices.iter().map(|s| &s.metadata));
            let versions = || metas().flat_map(|m| [m.name.as_deref(), m.resource_version.as_deref()]);
            let cached = self.services.get_mut(ns).and_then(|by_name| by_name.get_mut(name));
            let n = 2 * (1 + svc_slices.len());
            let unchanged = cached.as_ref().is_some_and(|c| {
                c.versions.as_ref().is_some_and(|v| v.len() == n && v.iter().zip(versions()).all(|(a, b)| b == Some(a)))
            });
            match (cached, unchanged) {
                (Some(c), true) => {
                    c.seen = self.generation;
                    out.extend(c.ports.iter().cloned());
                }
                (cached, _) => {
                    let mut computed = Vec::new();
                    service_ports_of(svc, &svc_slices, node, &mut computed);
                    let ports: Vec<Arc<ServicePort>> = computed.into_iter().map(Arc::new).collect();
                    out.extend(ports.iter().cloned());
                    let before = cached.map(|c| std::mem::take(&mut c.triggers)).unwrap_or_default();
                    let mut triggers = HashMap::new();
                    for sl in &svc_slices {
                        let Some(t) = sl.metadata.annotations.as_ref().and_then(|a| a.get(LAST_CHANGE_TRIGGER_TIME))
                        else {
                            continue;
                        };
                        let name = sl.metadata.name.clone().unwrap_or_default();
                        if before.get(&name) != Some(t) {
                            if let Ok(at) = t.parse::<jiff::Timestamp>() {
                                if at > self.started {
                                    self.trigger_times.push(at);
                                }
                            }
                        }
                        triggers.insert(name, t.clone());
                    }
                    let versions = versions().map(|v| v.map(String::from)).collect();
                    let entry = Cached { versions, ports, seen: self.generation, triggers };
                    self.services.entry(ns.to_string()).or_default().insert(name.to_string(), entry);
                }
            }
        }
        let generation = self.generation;
        for by_name in self.services.values_mut() {
            by_name.retain(|_, c| c.seen == generation);
        }
        self.services.retain(|_, by_name| !by_name.is_empty());
        out.sort_by(|a, b| (&a.name, a.protocol).cmp(&(&b.name, b.protocol)));
        out
    }
}

/// One Service's ports, given its EndpointSlices, appended to `out`.
fn service_ports_of(svc: &Service, svc_slices: &[&EndpointSlice], node: &NodeInfo, out: &mut Vec<ServicePort>) {
    let Some(spec) = svc.spec.as_ref() else { return };
    if spec.type_.as_deref() == Some("ExternalName") {
        return;
    }
    // Services handed to another proxy implementation are not ours (Kubernetes' label).
    if svc.metadata.labels.as_ref().is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME)) {
        return;
    }
    let Some(cluster_ip) = spec.cluster_ip.as_deref().and_then(|ip| ip.parse::<Ipv4Addr>().ok()) else {
        return; // headless, unallocated or IPv6
    };
    let namespace = svc.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = svc.metadata.name.clone().unwrap_or_default();
    let external_ips: Vec<Ipv4Addr> = spec.external_ips.iter().flatten().filter_map(|ip| ip.parse().ok()).collect();
    // An ingress in `Proxy` mode is reached through the load balancer's own proxy, never
    // addressed to its IP on the node: Kubernetes leaves it alone.
    let load_balancer_ips: Vec<Ipv4Addr> = if spec.type_.as_deref() == Some("LoadBalancer") {
        svc.status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
            .filter_map(|i| i.ip.as_deref().and_then(|ip| ip.parse().ok()))
            .collect()
    } else {
        Vec::new()
    };
    let load_balancer_source_ranges: Vec<Cidr> =
        spec.load_balancer_source_ranges.iter().flatten().filter_map(|r| Cidr::parse(r)).collect();
    let source_ranges_allow_node = node.ip.is_some_and(|ip| load_balancer_source_ranges.iter().any(|r| r.contains(ip)));
    let health_check_node_port = (spec.type_.as_deref() == Some("LoadBalancer")
        && spec.external_traffic_policy.as_deref() == Some("Local"))
    .then(|| spec.health_check_node_port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0))
    .flatten();
    let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
    });
    let node_port_type = matches!(spec.type_.as_deref(), Some("NodePort") | Some("LoadBalancer"));
    let internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let external_policy_local = spec.external_traffic_policy.as_deref() == Some("Local");
    for p in spec.ports.iter().flatten() {
        let Some(protocol) = Protocol::parse(p.protocol.as_deref()) else { continue };
        let Ok(port) = u16::try_from(p.port) else { continue };
        let port_name = p.name.clone().unwrap_or_default();
        let all_endpoints = endpoints_for(svc_slices, &port_name, protocol, node);
        let cluster_endpoints = usable(&all_endpoints, |e| !internal_policy_local || e.local);
        let external_endpoints = usable(&all_endpoints, |e| !external_policy_local || e.local);
        let node_port =
            if node_port_type { p.node_port.and_then(|n| u16::try_from(n).ok()).filter(|n| *n != 0) } else { None };
        out.push(ServicePort {
            name: ServicePortName { namespace: namespace.clone(), name: name.clone(), port: port_name },
            protocol,
            cluster_ip,
            port,
            node_port,
            external_ips: external_ips.clone(),
            load_balancer_ips: load_balancer_ips.clone(),
            load_balancer_source_ranges: load_balancer_source_ranges.clone(),
            source_ranges_allow_node,
            health_check_node_port,
            affinity_timeout,
            internal_policy_local,
            external_policy_local,
            has_any_endpoint: !all_endpoints.is_empty(),
            all_endpoints,
            cluster_endpoints,
            external_endpoints,
        });
    }
}

/// The endpoints of one service port across its slices, deduplicated by `ip:port`
/// (a ready copy wins over a not-ready one), sorted.
fn endpoints_for(slices: &[&EndpointSlice], port_name: &str, protocol: Protocol, node: &NodeInfo) -> Vec<Endpoint> {
    let mut found: BTreeMap<(Ipv4Addr, u16), Endpoint> = BTreeMap::new();
    for slice in slices {
        let Some(port) = slice.ports.iter().flatten().find(|sp| {
            sp.name.as_deref().unwrap_or("") == port_name && Protocol::parse(sp.protocol.as_deref()) == Some(protocol)
        }) else {
            continue;
        };
        let Some(port) = port.port.and_then(|p| u16::try_from(p).ok()) else { continue };
        for ep in slice.endpoints.iter().flatten() {
            let cond = ep.conditions.as_ref();
            let ready = cond.and_then(|c| c.ready).unwrap_or(true);
            let serving = cond.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
            let local = !node.name.is_empty() && ep.node_name.as_deref() == Some(node.name.as_str());
            for addr in &ep.addresses {
                let Ok(ip) = addr.parse::<Ipv4Addr>() else { continue };
                let e = Endpoint { ip, port, ready, serving, terminating, local };
                match found.get(&(ip, port)) {
                    Some(old) if old.ready || !e.ready => {}
                    _ => {
                        found.insert((ip, port), e);
                    }
                }
            }
        }
    }
    found.into_values().collect()
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use serde_json::json;

    pub fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }
    pub fn slice(v: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(v).unwrap()
    }
    pub fn simple_service(name: &str, ip: &str, port: i32) -> Service {
        svc(json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}}))
    }
    pub fn simple_slice(svc_name: &str, ips: &[&str], port: i32) -> EndpointSlice {
        let eps: Vec<_> = ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect();
        slice(json!({"metadata": {"name": format!("{svc_name}-abc"), "namespace": "default",
                "labels": {"kubernetes.io/service-name": svc_name}},
            "addressType": "IPv4", "endpoints": eps, "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}))
    }
    fn node() -> NodeInfo {
        NodeInfo::named("node-a")
    }

    #[test]
    fn cluster_ip_service_with_ready_endpoints() {
        let ports = service_ports(
            &[simple_service("web", "10.96.0.10", 80)],
            &[simple_slice("web", &["10.244.0.3", "10.244.0.2"], 8080)],
            &node(),
        );
        assert_eq!(ports.len(), 1);
        let p = &ports[0];
        assert_eq!(p.name.to_string(), "default/web:http");
        assert_eq!(p.cluster_ip, "10.96.0.10".parse::<Ipv4Addr>().unwrap());
        assert_eq!(p.port, 80);
        assert_eq!(p.node_port, None);
        let addrs: Vec<_> = p.cluster_endpoints.iter().map(|e| e.addr()).collect();
        assert_eq!(addrs, ["10.244.0.2:8080", "10.244.0.3:8080"]);
        assert!(p.has_any_endpoint);
    }

    #[test]
    fn headless_and_external_name_services_are_skipped() {
        let headless = svc(json!({"metadata": {"name": "h", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}));
        let en = svc(json!({"metadata": {"name": "e", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "example.com"}}));
        assert!(service_ports(&[headless, en], &[], &node()).is_empty());
    }

    #[test]
    fn services_for_another_proxy_are_skipped() {
        let mut s = simple_service("web", "10.96.0.10", 80);
        s.metadata.labels = Some([(LABEL_SERVICE_PROXY_NAME.to_string(), "other".to_string())].into());
        assert!(service_ports(&[s], &[], &node()).is_empty());
    }

    #[test]
    fn service_without_endpoints_has_none() {
        let ports = service_ports(&[simple_service("web", "10.96.0.10", 80)], &[], &node());
        assert!(ports[0].cluster_endpoints.is_empty());
        assert!(!ports[0].has_any_endpoint);
    }

    #[test]
    fn not_ready_endpoints_are_excluded_and_terminating_are_a_fallback() {
        let s = slice(json!({"metadata": {"name": "web-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": false}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": true, "terminating": true}}],
            "ports": [{"name": "http", "port": 80}]}));
        let ports = service_ports(&[simple_service("web", "10.96.0.10", 80)], std::slice::from_ref(&s), &node());
        let addrs: Vec<_> = ports[0].cluster_endpoints.iter().map(|e| e.ip.to_string()).collect();
        assert_eq!(addrs, ["10.0.0.1"]);

        // Without any ready endpoint, the serving+terminating one is used.
        let mut s2 = s;
        s2.endpoints.as_mut().unwrap().remove(0);
        let ports = service_ports(&[simple_service("web", "10.96.0.10", 80)], &[s2], &node());
        let addrs: Vec<_> = ports[0].cluster_endpoints.iter().map(|e| e.ip.to_string()).collect();
        assert_eq!(addrs, ["10.0.0.3"]);
    }

    #[test]
    fn endpoints_are_deduplicated_across_slices_and_unnamed_ports_match() {
        let service = svc(json!({"metadata": {"name": "web", "namespace": "ns1"},
            "spec": {"clusterIP": "10.96.0.11", "ports": [{"port": 80}]}}));
        let mk = |n: &str, ips: &[&str]| {
            slice(json!({"metadata": {"name": n, "namespace": "ns1", "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "endpoints": ips.iter().map(|i| json!({"addresses": [i]})).collect::<Vec<_>>(),
                "ports": [{"port": 8080, "protocol": "TCP"}]}))
        };
        let ports = service_ports(&[service], &[mk("a", &["10.0.0.1", "10.0.0.2"]), mk("b", &["10.0.0.2"])], &node());
        assert_eq!(ports[0].name.to_string(), "ns1/web");
        assert_eq!(ports[0].cluster_endpoints.len(), 2);
    }

    #[test]
    fn slices_of_other_namespaces_and_other_protocols_do_not_match() {
        let mut other_ns = simple_slice("web", &["10.0.0.9"], 80);
        other_ns.metadata.namespace = Some("other".into());
        let mut udp = simple_slice("web", &["10.0.0.8"], 80);
        udp.ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        let ports = service_ports(&[simple_service("web", "10.96.0.10", 80)], &[other_ns, udp], &node());
        assert!(ports[0].cluster_endpoints.is_empty());
    }

    #[test]
    fn nodeport_external_ips_load_balancer_and_affinity() {
        let s = svc(json!({"metadata": {"name": "lb", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.20", "externalIPs": ["192.0.2.1"],
                     "sessionAffinity": "ClientIP",
                     "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053},
                               {"name": "web", "port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}}));
        let ports = service_ports(&[s], &[], &node());
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].protocol, Protocol::Udp);
        assert_eq!(ports[0].node_port, Some(30053));
        assert_eq!(ports[1].node_port, Some(30080));
        assert_eq!(ports[1].external_ips, ["192.0.2.1".parse::<Ipv4Addr>().unwrap()]);
        assert_eq!(ports[1].load_balancer_ips, ["198.51.100.7".parse::<Ipv4Addr>().unwrap()]);
        assert_eq!(ports[1].affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
        assert!(ports[1].has_external());
    }

    #[test]
    fn cluster_ip_type_ignores_node_port_field() {
        let s = svc(json!({"metadata": {"name": "c", "namespace": "default"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.21", "ports": [{"port": 80, "nodePort": 30001}]}}));
        assert_eq!(service_ports(&[s], &[], &node())[0].node_port, None);
    }

    #[test]
    fn traffic_policy_local_selects_local_endpoints() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.30", "internalTrafficPolicy": "Local",
                     "externalTrafficPolicy": "Local", "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}));
        let sl = slice(json!({"metadata": {"name": "web-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "node-a"},
                          {"addresses": ["10.0.0.2"], "nodeName": "node-b"}],
            "ports": [{"name": "http", "port": 80}]}));
        let ports = service_ports(std::slice::from_ref(&s), std::slice::from_ref(&sl), &node());
        let p = &ports[0];
        assert_eq!(p.all_endpoints.len(), 2);
        assert_eq!(p.cluster_endpoints.iter().map(|e| e.ip.to_string()).collect::<Vec<_>>(), ["10.0.0.1"]);
        assert_eq!(p.external_endpoints.iter().map(|e| e.ip.to_string()).collect::<Vec<_>>(), ["10.0.0.1"]);
        // On a node without local endpoints, nothing is usable but endpoints exist.
        let other = NodeInfo::named("node-c");
        let p = &service_ports(&[s], &[sl], &other)[0];
        assert!(p.cluster_endpoints.is_empty() && p.external_endpoints.is_empty());
        assert!(p.has_any_endpoint);
    }

    #[test]
    fn display_of_service_port_name() {
        let n = ServicePortName { namespace: "a".into(), name: "b".into(), port: "".into() };
        assert_eq!(n.to_string(), "a/b");
    }

    #[test]
    fn cidrs_parse_to_their_network() {
        let c = Cidr::parse(" 10.1.2.3/8 ").unwrap();
        assert_eq!(c.to_string(), "10.0.0.0/8");
        assert!(c.contains("10.200.0.1".parse().unwrap()) && !c.contains("11.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("203.0.113.1".parse().unwrap()));
        assert_eq!(Cidr::host("192.0.2.7".parse().unwrap()).to_string(), "192.0.2.7/32");
        for bad in ["10.0.0.0", "10.0.0.0/33", "2001:db8::/64", "x/8", "10.0.0.0/"] {
            assert!(Cidr::parse(bad).is_none(), "{bad}");
        }
    }

    fn local_lb(extra: serde_json::Value) -> Service {
        let mut v = json!({"metadata": {"name": "lb", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.40", "externalTrafficPolicy": "Local",
                     "healthCheckNodePort": 32000,
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}, {"ip": "198.51.100.8", "ipMode": "Proxy"}]}}});
        if let (Some(spec), Some(more)) = (v["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(more.clone());
        }
        svc(v)
    }

    #[test]
    fn load_balancer_ips_under_local_policy_use_only_local_endpoints_like_node_ports() {
        let sl = slice(json!({"metadata": {"name": "lb-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "lb"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "node-a"},
                          {"addresses": ["10.0.0.2"], "nodeName": "node-b"}],
            "ports": [{"name": "http", "port": 8080}]}));
        let p = &service_ports(&[local_lb(json!({}))], std::slice::from_ref(&sl), &node())[0];
        assert_eq!(p.load_balancer_ips, ["198.51.100.7".parse::<Ipv4Addr>().unwrap()], "Proxy-mode ingress left out");
        assert!(p.external_policy_local, "the source is kept");
        assert_eq!(p.external_endpoints.iter().map(|e| e.ip.to_string()).collect::<Vec<_>>(), ["10.0.0.1"]);
        assert_eq!(p.cluster_endpoints.len(), 2, "cluster traffic still reaches both");
        assert_eq!(p.health_check_node_port, Some(32000));
        // No local endpoint: nothing for external traffic, though endpoints exist.
        let p = &service_ports(&[local_lb(json!({}))], &[sl], &NodeInfo::named("node-c"))[0];
        assert!(p.external_endpoints.is_empty() && p.has_any_endpoint);
    }

    #[test]
    fn health_check_node_port_only_for_local_load_balancers() {
        let cluster = local_lb(json!({"externalTrafficPolicy": "Cluster"}));
        assert_eq!(service_ports(&[cluster], &[], &node())[0].health_check_node_port, None);
        let node_port = local_lb(json!({"type": "NodePort"}));
        assert_eq!(service_ports(&[node_port], &[], &node())[0].health_check_node_port, None);
    }

    #[test]
    fn source_ranges_and_the_node_exception() {
        let s = local_lb(
            json!({"loadBalancerSourceRanges": ["203.0.113.0/24", " 192.168.1.1/16 ", "bogus", "2001:db8::/64"]}),
        );
        let p = &service_ports(std::slice::from_ref(&s), &[], &node())[0];
        assert!(p.uses_firewall());
        let shown: Vec<String> = p.load_balancer_source_ranges.iter().map(Cidr::to_string).collect();
        assert_eq!(shown, ["203.0.113.0/24", "192.168.0.0/16"], "invalid and IPv6 ranges dropped");
        assert!(!p.source_ranges_allow_node, "no node IP known");
        assert_eq!(p.firewall_sources().len(), 2);

        let at = NodeInfo { name: "node-a".into(), ip: Some("192.168.7.7".parse().unwrap()) };
        let p = &service_ports(std::slice::from_ref(&s), &[], &at)[0];
        assert!(p.source_ranges_allow_node);
        let sources: Vec<String> = p.firewall_sources().iter().map(Cidr::to_string).collect();
        assert_eq!(sources, ["203.0.113.0/24", "192.168.0.0/16", "198.51.100.7/32"]);

        let outside = NodeInfo { name: "node-a".into(), ip: Some("172.16.0.1".parse().unwrap()) };
        assert!(!service_ports(std::slice::from_ref(&s), &[], &outside)[0].source_ranges_allow_node);
        // Without load balancer IPs there is nothing to guard.
        let mut no_ip = s;
        no_ip.status = None;
        assert!(!service_ports(&[no_ip], &[], &node())[0].uses_firewall());
    }

    #[test]
    fn a_nodes_primary_ip_is_its_internal_one() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"addresses": [
            {"type": "Hostname", "address": "n"}, {"type": "ExternalIP", "address": "203.0.113.5"},
            {"type": "InternalIP", "address": "fd00::5"}, {"type": "InternalIP", "address": "192.168.1.5"}]}}))
        .unwrap();
        assert_eq!(node_primary_ip(&node), Some("192.168.1.5".parse().unwrap()));
        let external: Node = serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"addresses": [
            {"type": "ExternalIP", "address": "203.0.113.5"}]}}))
        .unwrap();
        assert_eq!(node_primary_ip(&external), Some("203.0.113.5".parse().unwrap()));
        assert_eq!(node_primary_ip(&serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap()), None);
    }

    #[test]
    fn the_port_cache_recomputes_only_what_changed_and_agrees_with_service_ports() {
        let plain = |v: Vec<Arc<ServicePort>>| v.iter().map(|p| (**p).clone()).collect::<Vec<_>>();
        let with_rv = |mut s: Service, rv: &str| {
            s.metadata.resource_version = Some(rv.into());
            s
        };
        let slice_rv = |mut s: EndpointSlice, rv: &str| {
            s.metadata.resource_version = Some(rv.into());
            s
        };
        let node = NodeInfo::named("n");
        let svcs = vec![
            with_rv(simple_service("a", "10.96.0.1", 80), "1"),
            with_rv(simple_service("b", "10.96.0.2", 80), "2"),
        ];
        let slices = vec![
            slice_rv(simple_slice("a", &["10.0.0.1"], 80), "3"),
            slice_rv(simple_slice("b", &["10.0.0.2"], 80), "4"),
        ];
        let mut cache = PortCache::default();
        assert_eq!(plain(cache.ports(&svcs, &slices, &node)), service_ports(&svcs, &slices, &node));
        // A cached Service is not computed again: a changed object under an unchanged
        // resourceVersion shows the cached answer (which is how the cache is seen to work).
        let mut stale = slices.clone();
        stale[1] = slice_rv(simple_slice("b", &["10.0.0.9"], 80), "4");
        assert_eq!(plain(cache.ports(&svcs, &stale, &node)), service_ports(&svcs, &slices, &node));
        // A new resourceVersion is computed again; a Service gone is gone.
        let mut changed = slices.clone();
        changed[1] = slice_rv(simple_slice("b", &["10.0.0.9"], 80), "5");
        assert_eq!(plain(cache.ports(&svcs, &changed, &node)), service_ports(&svcs, &changed, &node));
        assert_eq!(plain(cache.ports(&svcs[..1], &changed, &node)), service_ports(&svcs[..1], &changed, &node));
        // Objects without resourceVersions are always computed again.
        let plain = vec![simple_service("a", "10.96.0.1", 8080)];
        assert_eq!(cache.ports(&plain, &changed, &node)[0].port, 8080);
    }

    #[test]
    fn the_port_cache_collects_each_new_trigger_time_once() {
        let node = NodeInfo::named("n");
        let svc = |rv: &str| {
            let mut s = simple_service("a", "10.96.0.1", 80);
            s.metadata.resource_version = Some(rv.into());
            s
        };
        let slice = |rv: &str, t: &str| {
            let mut s = simple_slice("a", &["10.0.0.1"], 80);
            s.metadata.resource_version = Some(rv.into());
            s.metadata.annotations = Some([(LAST_CHANGE_TRIGGER_TIME.to_string(), t.to_string())].into());
            s
        };
        let mut cache = PortCache::since("2026-01-01T00:00:00Z".parse().unwrap());
        // A change from before the cache was made is not this proxy's programming latency.
        cache.ports(&[svc("1")], &[slice("2", "2025-12-31T23:00:00Z")], &node);
        assert!(cache.take_trigger_times().is_empty());
        cache.ports(&[svc("1")], &[slice("3", "2026-01-01T00:00:01Z")], &node);
        assert_eq!(cache.take_trigger_times(), ["2026-01-01T00:00:01Z".parse::<jiff::Timestamp>().unwrap()]);
        // The Service changes, the slice's annotation does not: no new trigger time.
        cache.ports(&[svc("4")], &[slice("3", "2026-01-01T00:00:01Z")], &node);
        assert!(cache.take_trigger_times().is_empty());
    }
}
