//! The Istio API subset pilot implements, as typed Rust values: `VirtualService` and
//! `DestinationRule` specs (`networking.istio.io`), parsed from the objects' JSON, and the
//! Kubernetes Services they route to ([`ServiceIndex`]). Pure: no I/O.
//!
//! Field names follow Istio's API (camelCase in JSON); fields Istio has and pilot does not
//! implement are ignored when parsing (the CRD schema preserves them).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use serde::Deserialize;

/// `<namespace>/<name>` of an object.
pub type Key = (String, String);

// ---------------------------------------------------------------------------------------
// VirtualService

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualServiceSpec {
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub gateways: Vec<String>,
    #[serde(default)]
    pub http: Vec<HttpRoute>,
    #[serde(default)]
    pub tcp: Vec<TcpRoute>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, rename = "match")]
    pub matches: Vec<HttpMatch>,
    #[serde(default)]
    pub route: Vec<RouteDestination>,
    #[serde(default)]
    pub rewrite: Option<Rewrite>,
    #[serde(default)]
    pub timeout: Option<String>,
    #[serde(default)]
    pub retries: Option<Retries>,
    #[serde(default)]
    pub fault: Option<Fault>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatch {
    #[serde(default)]
    pub uri: Option<StringMatch>,
    #[serde(default)]
    pub headers: BTreeMap<String, StringMatch>,
    #[serde(default)]
    pub method: Option<StringMatch>,
    #[serde(default)]
    pub query_params: BTreeMap<String, StringMatch>,
    /// Only for the listener of this port.
    #[serde(default)]
    pub port: Option<u32>,
}

/// Istio's `StringMatch`: exactly one of `exact`, `prefix`, `regex`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct StringMatch {
    #[serde(default)]
    pub exact: Option<String>,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub regex: Option<String>,
}

/// A [`StringMatch`] once validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Match {
    Exact(String),
    Prefix(String),
    Regex(String),
}

impl StringMatch {
    /// The one kind of match this is, or why it is none.
    pub fn get(&self) -> Result<Match, String> {
        match (&self.exact, &self.prefix, &self.regex) {
            (Some(e), None, None) => Ok(Match::Exact(e.clone())),
            (None, Some(p), None) => Ok(Match::Prefix(p.clone())),
            (None, None, Some(r)) => Ok(Match::Regex(r.clone())),
            (None, None, None) => Err("a match must have one of exact, prefix or regex".into()),
            _ => Err("a match may have only one of exact, prefix or regex".into()),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteDestination {
    pub destination: Destination,
    #[serde(default)]
    pub weight: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    pub host: String,
    #[serde(default)]
    pub subset: Option<String>,
    #[serde(default)]
    pub port: Option<PortSelector>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct PortSelector {
    pub number: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rewrite {
    #[serde(default)]
    pub uri: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retries {
    #[serde(default)]
    pub attempts: Option<i64>,
    #[serde(default)]
    pub per_try_timeout: Option<String>,
    #[serde(default)]
    pub retry_on: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    #[serde(default)]
    pub delay: Option<FaultDelay>,
    #[serde(default)]
    pub abort: Option<FaultAbort>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultDelay {
    #[serde(default)]
    pub fixed_delay: Option<String>,
    #[serde(default)]
    pub percentage: Option<Percent>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultAbort {
    #[serde(default)]
    pub http_status: Option<i64>,
    #[serde(default)]
    pub percentage: Option<Percent>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Percent {
    pub value: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpRoute {
    #[serde(default, rename = "match")]
    pub matches: Vec<L4Match>,
    #[serde(default)]
    pub route: Vec<RouteDestination>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct L4Match {
    #[serde(default)]
    pub port: Option<u32>,
}

// ---------------------------------------------------------------------------------------
// DestinationRule

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationRuleSpec {
    pub host: String,
    #[serde(default)]
    pub traffic_policy: Option<TrafficPolicy>,
    #[serde(default)]
    pub subsets: Vec<Subset>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicy {
    #[serde(default)]
    pub load_balancer: Option<LoadBalancer>,
    #[serde(default)]
    pub connection_pool: Option<ConnectionPool>,
    #[serde(default)]
    pub outlier_detection: Option<OutlierDetection>,
}

impl TrafficPolicy {
    /// A subset's policy over the rule's, as Istio merges them: each top-level setting the
    /// subset has replaces the rule's.
    pub fn merged(rule: Option<&TrafficPolicy>, subset: Option<&TrafficPolicy>) -> TrafficPolicy {
        let rule = rule.cloned().unwrap_or_default();
        let Some(subset) = subset else { return rule };
        TrafficPolicy {
            load_balancer: subset.load_balancer.clone().or(rule.load_balancer),
            connection_pool: subset.connection_pool.clone().or(rule.connection_pool),
            outlier_detection: subset.outlier_detection.clone().or(rule.outlier_detection),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct LoadBalancer {
    #[serde(default)]
    pub simple: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ConnectionPool {
    #[serde(default)]
    pub tcp: Option<TcpSettings>,
    #[serde(default)]
    pub http: Option<HttpSettings>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpSettings {
    #[serde(default)]
    pub max_connections: Option<i64>,
    #[serde(default)]
    pub connect_timeout: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpSettings {
    #[serde(default)]
    pub http1_max_pending_requests: Option<i64>,
    #[serde(default)]
    pub http2_max_requests: Option<i64>,
    #[serde(default)]
    pub max_retries: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutlierDetection {
    #[serde(default, rename = "consecutive5xxErrors")]
    pub consecutive_5xx_errors: Option<i64>,
    #[serde(default)]
    pub interval: Option<String>,
    #[serde(default)]
    pub base_ejection_time: Option<String>,
    #[serde(default)]
    pub max_ejection_percent: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subset {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub traffic_policy: Option<TrafficPolicy>,
}

// ---------------------------------------------------------------------------------------
// Configuration objects and their accepted versions

/// A VirtualService or DestinationRule as pilot reads it from the API.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigObject {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub generation: i64,
    /// RFC 3339 creation time (orders conflicting objects: the oldest wins, as in Istio).
    pub created: String,
    pub spec: serde_json::Value,
}

impl ConfigObject {
    pub fn key(&self) -> Key {
        (self.namespace.clone(), self.name.clone())
    }
}

/// A VirtualService pilot uses: its spec and its hosts as FQDNs.
#[derive(Clone, Debug, PartialEq)]
pub struct VirtualService {
    pub namespace: String,
    pub name: String,
    pub created: String,
    pub spec: VirtualServiceSpec,
    pub hosts: Vec<String>,
}

/// A DestinationRule pilot uses, with its host as an FQDN.
#[derive(Clone, Debug, PartialEq)]
pub struct DestinationRule {
    pub namespace: String,
    pub name: String,
    pub created: String,
    pub spec: DestinationRuleSpec,
    pub host: String,
}

impl DestinationRule {
    pub fn subset(&self, name: &str) -> Option<&Subset> {
        self.spec.subsets.iter().find(|s| s.name == name)
    }
}

// ---------------------------------------------------------------------------------------
// Names

/// The FQDN a host names, seen from `namespace`: a short name (`reviews`) is a Service of
/// that namespace, `reviews.prod` and `reviews.prod.svc` are completed; anything else is
/// taken as written.
pub fn resolve_host(host: &str, namespace: &str, domain: &str) -> String {
    let parts: Vec<&str> = host.split('.').collect();
    match parts.as_slice() {
        [name] if *name != "*" => format!("{name}.{namespace}.svc.{domain}"),
        [name, ns] => format!("{name}.{ns}.svc.{domain}"),
        [name, ns, "svc"] => format!("{name}.{ns}.svc.{domain}"),
        _ => host.to_string(),
    }
}

/// The FQDN of a Service.
pub fn fqdn(name: &str, namespace: &str, domain: &str) -> String {
    format!("{name}.{namespace}.svc.{domain}")
}

/// A Go duration as Istio's API writes them (`5s`, `1.5s`, `100ms`, `1h30m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    apimachinery::duration::parse_go_duration(s)
}

// ---------------------------------------------------------------------------------------
// Services

/// How a Service port's traffic is carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Http,
    /// HTTP/2 (gRPC, h2c): the upstream speaks HTTP/2 too.
    Http2,
    Tcp,
}

impl Protocol {
    pub fn is_http(self) -> bool {
        matches!(self, Protocol::Http | Protocol::Http2)
    }

    /// Istio's protocol selection from a port name (`http`, `http-web`, `grpc-api`) and
    /// `appProtocol`.
    pub fn of(name: Option<&str>, app_protocol: Option<&str>) -> Protocol {
        match app_protocol.map(str::to_ascii_lowercase).as_deref() {
            Some("http") => return Protocol::Http,
            Some("http2" | "grpc" | "kubernetes.io/h2c") => return Protocol::Http2,
            _ => {}
        }
        let name = name.unwrap_or("").to_ascii_lowercase();
        let prefix = name.split('-').next().unwrap_or("");
        if name.starts_with("http2") || name.starts_with("grpc") {
            Protocol::Http2
        } else if prefix == "http" {
            Protocol::Http
        } else {
            Protocol::Tcp
        }
    }
}

/// A Service port's target on the pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPort {
    Number(u32),
    Name(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServicePort {
    pub name: String,
    pub port: u32,
    pub target: TargetPort,
    pub protocol: Protocol,
}

/// A Service as the mesh sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceInfo {
    pub namespace: String,
    pub name: String,
    pub fqdn: String,
    /// `None` for headless Services.
    pub cluster_ip: Option<String>,
    pub ports: Vec<ServicePort>,
    pub selector: Option<BTreeMap<String, String>>,
}

impl ServiceInfo {
    pub fn from_service(svc: &Service, domain: &str) -> Option<ServiceInfo> {
        let namespace = svc.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let name = svc.metadata.name.clone()?;
        let spec = svc.spec.as_ref()?;
        if spec.type_.as_deref() == Some("ExternalName") {
            return None;
        }
        let cluster_ip = spec.cluster_ip.clone().filter(|ip| !ip.is_empty() && ip != "None");
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
            .filter_map(|p| {
                let port = u32::try_from(p.port).ok()?;
                let target = match &p.target_port {
                    Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => {
                        TargetPort::Number(u32::try_from(*n).ok()?)
                    }
                    Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s)) => {
                        match s.parse::<u32>() {
                            Ok(n) => TargetPort::Number(n),
                            Err(_) => TargetPort::Name(s.clone()),
                        }
                    }
                    None => TargetPort::Number(port),
                };
                Some(ServicePort {
                    name: p.name.clone().unwrap_or_default(),
                    port,
                    target,
                    protocol: Protocol::of(p.name.as_deref(), p.app_protocol.as_deref()),
                })
            })
            .collect();
        Some(ServiceInfo {
            fqdn: fqdn(&name, &namespace, domain),
            namespace,
            name,
            cluster_ip,
            ports,
            selector: spec.selector.clone(),
        })
    }

    pub fn port(&self, number: u32) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.port == number)
    }
}

/// The cluster's Services by FQDN.
#[derive(Clone, Debug, Default)]
pub struct ServiceIndex {
    pub domain: String,
    pub by_fqdn: BTreeMap<String, ServiceInfo>,
}

impl ServiceIndex {
    pub fn build(services: &[Service], domain: &str) -> ServiceIndex {
        let by_fqdn =
            services.iter().filter_map(|s| ServiceInfo::from_service(s, domain)).map(|s| (s.fqdn.clone(), s)).collect();
        ServiceIndex { domain: domain.to_string(), by_fqdn }
    }

    pub fn get(&self, fqdn: &str) -> Option<&ServiceInfo> {
        self.by_fqdn.get(fqdn)
    }
}

/// The accepted configuration: the VirtualServices and DestinationRules in effect, the
/// oldest first (so the oldest wins a conflict, as in Istio).
#[derive(Clone, Debug, Default)]
pub struct MeshConfig {
    pub virtual_services: Vec<VirtualService>,
    pub destination_rules: Vec<DestinationRule>,
}

impl MeshConfig {
    /// The DestinationRule of a host (the oldest when there are several).
    pub fn rule_for(&self, fqdn: &str) -> Option<&DestinationRule> {
        self.destination_rules.iter().find(|d| d.host == fqdn)
    }

    /// The VirtualService routing a host (the oldest when there are several).
    pub fn virtual_service_for(&self, fqdn: &str) -> Option<&VirtualService> {
        self.virtual_services.iter().find(|v| v.hosts.iter().any(|h| h == fqdn))
    }

    /// Index by host, for generation.
    pub fn rules_by_host(&self) -> HashMap<&str, &DestinationRule> {
        let mut out = HashMap::new();
        for d in &self.destination_rules {
            out.entry(d.host.as_str()).or_insert(d);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_resolve_in_the_namespace() {
        assert_eq!(resolve_host("reviews", "prod", "cluster.local"), "reviews.prod.svc.cluster.local");
        assert_eq!(resolve_host("reviews.test", "prod", "cluster.local"), "reviews.test.svc.cluster.local");
        assert_eq!(resolve_host("reviews.test.svc", "prod", "cluster.local"), "reviews.test.svc.cluster.local");
        assert_eq!(
            resolve_host("reviews.test.svc.cluster.local", "prod", "cluster.local"),
            "reviews.test.svc.cluster.local"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("5 seconds").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn protocols_follow_istio_port_naming() {
        assert_eq!(Protocol::of(Some("http"), None), Protocol::Http);
        assert_eq!(Protocol::of(Some("http-web"), None), Protocol::Http);
        assert_eq!(Protocol::of(Some("http2"), None), Protocol::Http2);
        assert_eq!(Protocol::of(Some("grpc-api"), None), Protocol::Http2);
        assert_eq!(Protocol::of(Some("httpx"), None), Protocol::Tcp);
        assert_eq!(Protocol::of(Some("redis"), None), Protocol::Tcp);
        assert_eq!(Protocol::of(Some("web"), Some("kubernetes.io/h2c")), Protocol::Http2);
        assert_eq!(Protocol::of(None, Some("http")), Protocol::Http);
        assert_eq!(Protocol::of(None, None), Protocol::Tcp);
    }

    #[test]
    fn virtual_services_parse() {
        let spec: VirtualServiceSpec = serde_json::from_value(serde_json::json!({
            "hosts": ["reviews"],
            "http": [{"name": "v2", "match": [{"uri": {"prefix": "/v2"}, "headers": {"end-user": {"exact": "jason"}}}],
                      "route": [{"destination": {"host": "reviews", "subset": "v2", "port": {"number": 9080}}, "weight": 100}],
                      "timeout": "5s", "retries": {"attempts": 3, "perTryTimeout": "2s"}}],
            "unknownIstioField": true
        }))
        .unwrap();
        assert_eq!(spec.http[0].matches[0].headers["end-user"].get(), Ok(Match::Exact("jason".into())));
        assert_eq!(spec.http[0].route[0].destination.port, Some(PortSelector { number: 9080 }));
        assert_eq!(spec.http[0].retries.as_ref().unwrap().attempts, Some(3));
    }

    #[test]
    fn subset_policies_override_the_rules_field_by_field() {
        let rule = TrafficPolicy {
            load_balancer: Some(LoadBalancer { simple: Some("RANDOM".into()) }),
            outlier_detection: Some(OutlierDetection { consecutive_5xx_errors: Some(5), ..Default::default() }),
            ..Default::default()
        };
        let subset = TrafficPolicy {
            load_balancer: Some(LoadBalancer { simple: Some("LEAST_REQUEST".into()) }),
            ..Default::default()
        };
        let m = TrafficPolicy::merged(Some(&rule), Some(&subset));
        assert_eq!(m.load_balancer.unwrap().simple.as_deref(), Some("LEAST_REQUEST"));
        assert_eq!(m.outlier_detection.unwrap().consecutive_5xx_errors, Some(5));
    }
}
