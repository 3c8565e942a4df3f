//! CDS: `outbound|<port>|<subset>|<fqdn>` (EDS) for every Service port and DestinationRule
//! subset, with the rule's load balancer, connection pool and outlier detection;
//! `PassthroughCluster`, `BlackHoleCluster`, `InboundPassthroughClusterIpv4`; and per proxy
//! `inbound|<port>||` for its container ports.

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy,
};
use envoy_types::pb::envoy::config::cluster::v3::{
    circuit_breakers::Thresholds, CircuitBreakers, Cluster, OutlierDetection,
};
use envoy_types::pb::envoy::config::core::v3::{
    config_source::ConfigSourceSpecifier, AggregatedConfigSource, ApiVersion, ConfigSource, Http2ProtocolOptions,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;

use super::{any, duration, outbound_cluster, u32v, Mesh, Proxy};
use crate::model::{parse_duration, Protocol, TrafficPolicy};

/// The default `connect_timeout` (Istio's).
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// `{ads: {}, resource_api_version: V3}`: everything comes over the ADS stream.
pub fn ads() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        resource_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    }
}

fn base(name: &str, kind: DiscoveryType, lb: LbPolicy) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(kind as i32)),
        connect_timeout: Some(duration(CONNECT_TIMEOUT)),
        lb_policy: lb as i32,
        ..Default::default()
    }
}

fn original_dst(name: &str) -> Cluster {
    base(name, DiscoveryType::OriginalDst, LbPolicy::ClusterProvided)
}

fn http2(c: &mut Cluster) {
    let options = HttpProtocolOptions {
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions::default())),
        })),
        ..Default::default()
    };
    c.typed_extension_protocol_options.insert(HTTP_PROTOCOL_OPTIONS.to_string(), any(&options));
}

fn limit(v: Option<i64>) -> Option<envoy_types::pb::google::protobuf::UInt32Value> {
    v.and_then(|v| u32::try_from(v).ok()).map(u32v)
}

fn go_duration(s: Option<&String>) -> Option<envoy_types::pb::google::protobuf::Duration> {
    s.and_then(|s| parse_duration(s).ok()).map(duration)
}

/// An outbound EDS cluster with a DestinationRule's (merged) traffic policy.
pub fn outbound(name: &str, protocol: Protocol, policy: &TrafficPolicy) -> Cluster {
    let lb = match policy.load_balancer.as_ref().and_then(|l| l.simple.as_deref()) {
        Some("RANDOM") => LbPolicy::Random,
        Some("LEAST_REQUEST" | "LEAST_CONN") => LbPolicy::LeastRequest,
        _ => LbPolicy::RoundRobin,
    };
    let mut c = base(name, DiscoveryType::Eds, lb);
    c.eds_cluster_config = Some(EdsClusterConfig { eds_config: Some(ads()), service_name: name.to_string() });
    if let Some(pool) = &policy.connection_pool {
        let tcp = pool.tcp.as_ref();
        let http = pool.http.as_ref();
        if let Some(t) = go_duration(tcp.and_then(|t| t.connect_timeout.as_ref())) {
            c.connect_timeout = Some(t);
        }
        let thresholds = Thresholds {
            max_connections: limit(tcp.and_then(|t| t.max_connections)),
            max_pending_requests: limit(http.and_then(|h| h.http1_max_pending_requests)),
            max_requests: limit(http.and_then(|h| h.http2_max_requests)),
            max_retries: limit(http.and_then(|h| h.max_retries)),
            ..Default::default()
        };
        if thresholds != Thresholds::default() {
            c.circuit_breakers = Some(CircuitBreakers { thresholds: vec![thresholds], ..Default::default() });
        }
    }
    if let Some(o) = &policy.outlier_detection {
        c.outlier_detection = Some(OutlierDetection {
            consecutive_5xx: limit(o.consecutive_5xx_errors),
            interval: go_duration(o.interval.as_ref()),
            base_ejection_time: go_duration(o.base_ejection_time.as_ref()),
            max_ejection_percent: limit(o.max_ejection_percent),
            ..Default::default()
        });
    }
    if protocol == Protocol::Http2 {
        http2(&mut c);
    }
    c
}

/// The clusters every proxy gets: one per Service port, one per Service port and subset,
/// and the passthrough and black hole clusters.
pub fn shared(mesh: &Mesh) -> Vec<Cluster> {
    let rules = mesh.config.rules_by_host();
    let mut out = Vec::new();
    for svc in mesh.services.by_fqdn.values() {
        let rule = rules.get(svc.fqdn.as_str());
        let rule_policy = rule.and_then(|r| r.spec.traffic_policy.as_ref());
        for port in &svc.ports {
            let policy = TrafficPolicy::merged(rule_policy, None);
            out.push(outbound(&outbound_cluster(port.port, "", &svc.fqdn), port.protocol, &policy));
            for subset in rule.iter().flat_map(|r| r.spec.subsets.iter()) {
                let policy = TrafficPolicy::merged(rule_policy, subset.traffic_policy.as_ref());
                out.push(outbound(&outbound_cluster(port.port, &subset.name, &svc.fqdn), port.protocol, &policy));
            }
        }
    }
    out.push(original_dst(super::PASSTHROUGH));
    out.push(base(super::BLACKHOLE, DiscoveryType::Static, LbPolicy::RoundRobin));
    out.push(original_dst(super::INBOUND_PASSTHROUGH));
    out
}

/// A proxy's own clusters: `inbound|<port>||` per container port.
pub fn inbound(mesh: &Mesh, proxy: &Proxy) -> Vec<Cluster> {
    let mut ports: Vec<&(u32, Option<String>)> = proxy.ports.iter().collect();
    ports.sort();
    ports.dedup_by_key(|p| p.0);
    ports
        .into_iter()
        .map(|(port, name)| {
            let mut c = original_dst(&super::inbound_cluster(*port));
            if mesh.inbound_protocol(proxy, *port, name.as_deref()) == Protocol::Http2 {
                http2(&mut c);
            }
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::testutil::*;
    use serde_json::json;

    fn find<'a>(cs: &'a [Cluster], name: &str) -> &'a Cluster {
        cs.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no cluster {name}"))
    }

    #[test]
    fn every_service_port_is_an_eds_cluster() {
        let (svcs, slices, pods) = bookinfo();
        let cs = shared(&mesh_with(&svcs, &slices, &pods));
        let names: Vec<&str> = cs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "outbound|5432||db.default.svc.cluster.local",
                "outbound|50051||ratings.default.svc.cluster.local",
                "outbound|9080||reviews.default.svc.cluster.local",
                "PassthroughCluster",
                "BlackHoleCluster",
                "InboundPassthroughClusterIpv4",
            ]
        );
        let c = find(&cs, "outbound|9080||reviews.default.svc.cluster.local");
        assert_eq!(c.cluster_discovery_type, Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)));
        let eds = c.eds_cluster_config.as_ref().unwrap();
        assert_eq!(eds.service_name, c.name);
        assert_eq!(eds.eds_config, Some(ads()));
        assert_eq!(c.connect_timeout, Some(duration(std::time::Duration::from_secs(10))));
        assert_eq!(c.lb_policy, LbPolicy::RoundRobin as i32);
        assert!(c.typed_extension_protocol_options.is_empty());
        let p = find(&cs, "PassthroughCluster");
        assert_eq!(p.cluster_discovery_type, Some(ClusterDiscoveryType::Type(DiscoveryType::OriginalDst as i32)));
        assert_eq!(p.lb_policy, LbPolicy::ClusterProvided as i32);
        let b = find(&cs, "BlackHoleCluster");
        assert_eq!(b.cluster_discovery_type, Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)));
        assert!(b.load_assignment.is_none());
    }

    #[test]
    fn h2_ports_get_http2_protocol_options() {
        let (svcs, slices, pods) = bookinfo();
        let cs = shared(&mesh_with(&svcs, &slices, &pods));
        let c = find(&cs, "outbound|50051||ratings.default.svc.cluster.local");
        let opts = &c.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS];
        assert_eq!(opts.type_url, "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions");
        let decoded: HttpProtocolOptions = prost::Message::decode(opts.value.as_slice()).unwrap();
        assert!(matches!(
            decoded.upstream_protocol_options,
            Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(_))
            }))
        ));
    }

    #[test]
    fn destination_rules_shape_clusters_and_subsets() {
        let (svcs, slices, pods) = bookinfo();
        let rule = reviews_rule(json!({
            "loadBalancer": {"simple": "LEAST_REQUEST"},
            "connectionPool": {"tcp": {"maxConnections": 100, "connectTimeout": "250ms"},
                               "http": {"http1MaxPendingRequests": 10, "http2MaxRequests": 1000, "maxRetries": 3}},
            "outlierDetection": {"consecutive5xxErrors": 7, "interval": "5s", "baseEjectionTime": "30s", "maxEjectionPercent": 50}
        }));
        let cs = shared(&mesh_full(&svcs, &slices, &pods, &[], &[rule]));
        let main = find(&cs, "outbound|9080||reviews.default.svc.cluster.local");
        assert_eq!(main.lb_policy, LbPolicy::LeastRequest as i32);
        assert_eq!(main.connect_timeout, Some(duration(std::time::Duration::from_millis(250))));
        let t = &main.circuit_breakers.as_ref().unwrap().thresholds[0];
        assert_eq!(t.max_connections, Some(u32v(100)));
        assert_eq!(t.max_pending_requests, Some(u32v(10)));
        assert_eq!(t.max_requests, Some(u32v(1000)));
        assert_eq!(t.max_retries, Some(u32v(3)));
        let o = main.outlier_detection.as_ref().unwrap();
        assert_eq!(o.consecutive_5xx, Some(u32v(7)));
        assert_eq!(o.interval, Some(duration(std::time::Duration::from_secs(5))));
        assert_eq!(o.base_ejection_time, Some(duration(std::time::Duration::from_secs(30))));
        assert_eq!(o.max_ejection_percent, Some(u32v(50)));
        // v1 inherits the rule's policy; v2 overrides the load balancer only.
        let v1 = find(&cs, "outbound|9080|v1|reviews.default.svc.cluster.local");
        assert_eq!(v1.lb_policy, LbPolicy::LeastRequest as i32);
        assert_eq!(v1.eds_cluster_config.as_ref().unwrap().service_name, v1.name);
        let v2 = find(&cs, "outbound|9080|v2|reviews.default.svc.cluster.local");
        assert_eq!(v2.lb_policy, LbPolicy::Random as i32);
        assert_eq!(v2.outlier_detection, main.outlier_detection);
        assert_eq!(v2.circuit_breakers, main.circuit_breakers);
    }

    #[test]
    fn inbound_clusters_follow_the_pods_ports() {
        let (svcs, slices, pods) = bookinfo();
        let mesh = mesh_with(&svcs, &slices, &pods);
        let proxy = Proxy::from_node(&node("10.1.1.1", "ratings-1", "default"), &mesh).unwrap();
        let cs = inbound(&mesh, &proxy);
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].name, "inbound|50051||");
        assert_eq!(cs[0].cluster_discovery_type, Some(ClusterDiscoveryType::Type(DiscoveryType::OriginalDst as i32)));
        assert_eq!(cs[0].lb_policy, LbPolicy::ClusterProvided as i32);
        assert!(cs[0].typed_extension_protocol_options.contains_key(HTTP_PROTOCOL_OPTIONS));
    }
}
