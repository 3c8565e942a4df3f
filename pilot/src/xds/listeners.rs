//! LDS: `virtualOutbound` (15001, hands connections to the listener of their original
//! destination, else passthrough), `0.0.0.0_<port>` per HTTP port (RDS `"<port>"`),
//! `<cluster IP>_<port>` per TCP Service port (`tcp_proxy`), and per proxy `virtualInbound`
//! (15006, a chain per container port).

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    route::Action, route_action::ClusterSpecifier as RouteCluster, route_match::PathSpecifier, Route, RouteAction,
    RouteConfiguration, RouteMatch, VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{CodecType, RouteSpecifier},
    http_filter, HttpConnectionManager, HttpFilter, Rds,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    tcp_proxy::{weighted_cluster::ClusterWeight, ClusterSpecifier, WeightedCluster},
    TcpProxy,
};
use envoy_types::pb::google::protobuf::BoolValue;

use super::clusters::ads;
use super::endpoints::socket_address;
use super::routes::{self, Target};
use super::{any, duration, inbound_cluster, outbound_cluster, u32v, Mesh, Proxy};

pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
/// The capture ports (the kubelet redirects the pod's traffic to them).
pub const OUTBOUND_PORT: u32 = common::mesh::OUTBOUND_PORT as u32;
pub const INBOUND_PORT: u32 = common::mesh::INBOUND_PORT as u32;

pub const HCM: &str = "envoy.filters.network.http_connection_manager";
pub const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
pub const ROUTER: &str = "envoy.filters.http.router";
pub const FAULT: &str = "envoy.filters.http.fault";

fn boolv(value: bool) -> Option<BoolValue> {
    Some(BoolValue { value })
}

fn filter<M: prost::Message + prost::Name>(name: &str, config: &M) -> Filter {
    Filter { name: name.to_string(), config_type: Some(filter::ConfigType::TypedConfig(any(config))) }
}

fn tcp_proxy(stat_prefix: &str, to: ClusterSpecifier) -> Filter {
    filter(
        TCP_PROXY,
        &TcpProxy { stat_prefix: stat_prefix.to_string(), cluster_specifier: Some(to), ..Default::default() },
    )
}

fn tcp_proxy_to(cluster: &str) -> Filter {
    tcp_proxy(cluster, ClusterSpecifier::Cluster(cluster.to_string()))
}

fn http_filters(fault: bool) -> Vec<HttpFilter> {
    let mut out = Vec::new();
    if fault {
        out.push(HttpFilter {
            name: FAULT.into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(any(&HttpFault::default()))),
            ..Default::default()
        });
    }
    out.push(HttpFilter {
        name: ROUTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&Router::default()))),
        ..Default::default()
    });
    out
}

fn hcm(stat_prefix: &str, routes: RouteSpecifier, fault: bool) -> Filter {
    filter(
        HCM,
        &HttpConnectionManager {
            codec_type: CodecType::Auto as i32,
            stat_prefix: stat_prefix.to_string(),
            route_specifier: Some(routes),
            http_filters: http_filters(fault),
            ..Default::default()
        },
    )
}

/// The port numbers some Service exposes as HTTP, ascending (but the capture ports: their
/// `0.0.0.0:<port>` belongs to `virtualOutbound` and `virtualInbound`).
pub fn http_ports(mesh: &Mesh) -> BTreeSet<u32> {
    mesh.services
        .by_fqdn
        .values()
        .flat_map(|s| &s.ports)
        .filter(|p| p.protocol.is_http() && p.port != OUTBOUND_PORT && p.port != INBOUND_PORT)
        .map(|p| p.port)
        .collect()
}

/// `virtualOutbound`: where outbound connections are captured.
pub fn virtual_outbound() -> Listener {
    Listener {
        name: VIRTUAL_OUTBOUND.into(),
        address: Some(socket_address("0.0.0.0", OUTBOUND_PORT)),
        use_original_dst: boolv(true),
        traffic_direction: TrafficDirection::Outbound as i32,
        default_filter_chain: Some(FilterChain {
            name: super::PASSTHROUGH.into(),
            filters: vec![tcp_proxy_to(super::PASSTHROUGH)],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `0.0.0.0_<port>`: HTTP to any Service on this port, routed by RDS `"<port>"`.
pub fn http_outbound(port: u32, fault: bool) -> Listener {
    let name = format!("0.0.0.0_{port}");
    let rds = RouteSpecifier::Rds(Rds { config_source: Some(ads()), route_config_name: port.to_string() });
    Listener {
        address: Some(socket_address("0.0.0.0", port)),
        bind_to_port: boolv(false),
        traffic_direction: TrafficDirection::Outbound as i32,
        filter_chains: vec![FilterChain { filters: vec![hcm(&name, rds, fault)], ..Default::default() }],
        name,
        ..Default::default()
    }
}

/// `<cluster IP>_<port>`: TCP to one Service port.
pub fn tcp_outbound(ip: &str, port: u32, to: Vec<Target>) -> Listener {
    let name = format!("{ip}_{port}");
    let spec = match to.as_slice() {
        [one] => ClusterSpecifier::Cluster(one.cluster.clone()),
        _ => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: to
                .iter()
                .map(|t| ClusterWeight { name: t.cluster.clone(), weight: t.weight, ..Default::default() })
                .collect(),
        }),
    };
    Listener {
        address: Some(socket_address(ip, port)),
        bind_to_port: boolv(false),
        traffic_direction: TrafficDirection::Outbound as i32,
        filter_chains: vec![FilterChain { filters: vec![tcp_proxy(&name, spec)], ..Default::default() }],
        name,
        ..Default::default()
    }
}

/// The listeners every proxy shares.
pub fn outbound(mesh: &Mesh) -> Vec<Listener> {
    let mut out = vec![virtual_outbound()];
    for port in http_ports(mesh) {
        out.push(http_outbound(port, routes::has_fault(mesh, port)));
    }
    for svc in mesh.services.by_fqdn.values() {
        let Some(ip) = &svc.cluster_ip else { continue };
        for p in svc.ports.iter().filter(|p| !p.protocol.is_http()) {
            let to = routes::tcp_targets(mesh, svc, p.port)
                .unwrap_or_else(|| vec![Target { cluster: outbound_cluster(p.port, "", &svc.fqdn), weight: 100 }]);
            out.push(tcp_outbound(ip, p.port, to));
        }
    }
    out
}

/// `virtualInbound`: a chain per container port of the proxy's pod, then passthrough.
pub fn virtual_inbound(mesh: &Mesh, proxy: &Proxy) -> Listener {
    let mut ports: Vec<&(u32, Option<String>)> = proxy.ports.iter().collect();
    ports.sort();
    ports.dedup_by_key(|p| p.0);
    let chains = ports
        .into_iter()
        .map(|(port, name)| {
            let cluster = inbound_cluster(*port);
            let f = if mesh.inbound_protocol(proxy, *port, name.as_deref()).is_http() {
                let config = RouteConfiguration {
                    name: cluster.clone(),
                    virtual_hosts: vec![VirtualHost {
                        name: format!("inbound|http|{port}"),
                        domains: vec!["*".into()],
                        routes: vec![Route {
                            r#match: Some(RouteMatch {
                                path_specifier: Some(PathSpecifier::Prefix("/".into())),
                                ..Default::default()
                            }),
                            action: Some(Action::Route(RouteAction {
                                cluster_specifier: Some(RouteCluster::Cluster(cluster.clone())),
                                timeout: Some(duration(std::time::Duration::ZERO)),
                                ..Default::default()
                            })),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                };
                hcm(&cluster, RouteSpecifier::RouteConfig(config), false)
            } else {
                tcp_proxy_to(&cluster)
            };
            FilterChain {
                name: cluster,
                filter_chain_match: Some(FilterChainMatch {
                    destination_port: Some(u32v(*port)),
                    ..Default::default()
                }),
                filters: vec![f],
                ..Default::default()
            }
        })
        .collect();
    Listener {
        name: VIRTUAL_INBOUND.into(),
        address: Some(socket_address("0.0.0.0", INBOUND_PORT)),
        use_original_dst: boolv(true),
        traffic_direction: TrafficDirection::Inbound as i32,
        filter_chains: chains,
        default_filter_chain: Some(FilterChain {
            name: super::INBOUND_PASSTHROUGH.into(),
            filters: vec![tcp_proxy_to(super::INBOUND_PASSTHROUGH)],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::endpoints::socket_address;
    use crate::xds::testutil::*;
    use prost::Message;
    use serde_json::json;

    fn typed<M: Message + Default>(f: &Filter) -> M {
        let Some(filter::ConfigType::TypedConfig(a)) = &f.config_type else { panic!("no typed config") };
        M::decode(a.value.as_slice()).unwrap()
    }

    fn find<'a>(ls: &'a [Listener], name: &str) -> &'a Listener {
        ls.iter().find(|l| l.name == name).unwrap_or_else(|| panic!("no listener {name}"))
    }

    #[test]
    fn outbound_listeners_by_protocol() {
        let (svcs, slices, pods) = bookinfo();
        let ls = outbound(&mesh_with(&svcs, &slices, &pods));
        let names: Vec<&str> = ls.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, vec!["virtualOutbound", "0.0.0.0_9080", "0.0.0.0_50051", "10.96.0.12_5432"]);

        let vo = find(&ls, "virtualOutbound");
        assert_eq!(vo.address, Some(socket_address("0.0.0.0", 15001)));
        assert_eq!(vo.use_original_dst, boolv(true));
        assert_eq!(vo.traffic_direction, TrafficDirection::Outbound as i32);
        let chain = vo.default_filter_chain.as_ref().unwrap();
        assert_eq!(chain.filters[0].name, TCP_PROXY);
        let tp: TcpProxy = typed(&chain.filters[0]);
        assert_eq!(tp.cluster_specifier, Some(ClusterSpecifier::Cluster("PassthroughCluster".into())));

        let http = find(&ls, "0.0.0.0_9080");
        assert_eq!(http.address, Some(socket_address("0.0.0.0", 9080)));
        assert_eq!(http.bind_to_port, boolv(false));
        assert_eq!(http.filter_chains.len(), 1);
        let f = &http.filter_chains[0].filters[0];
        assert_eq!(f.name, HCM);
        let m: HttpConnectionManager = typed(f);
        assert_eq!(m.codec_type, CodecType::Auto as i32);
        assert_eq!(m.stat_prefix, "0.0.0.0_9080");
        assert_eq!(
            m.route_specifier,
            Some(RouteSpecifier::Rds(Rds { config_source: Some(ads()), route_config_name: "9080".into() }))
        );
        let names: Vec<&str> = m.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, vec![ROUTER]);

        let tcp = find(&ls, "10.96.0.12_5432");
        assert_eq!(tcp.address, Some(socket_address("10.96.0.12", 5432)));
        assert_eq!(tcp.bind_to_port, boolv(false));
        let tp: TcpProxy = typed(&tcp.filter_chains[0].filters[0]);
        assert_eq!(
            tp.cluster_specifier,
            Some(ClusterSpecifier::Cluster("outbound|5432||db.default.svc.cluster.local".into()))
        );
    }

    #[test]
    fn faults_add_the_fault_filter() {
        let (svcs, slices, pods) = bookinfo();
        let vs = config(
            "reviews",
            json!({"hosts": ["reviews"], "http": [{"fault": {"abort": {"httpStatus": 503}}, "route": [{"destination": {"host": "reviews"}}]}]}),
        );
        let ls = outbound(&mesh_full(&svcs, &slices, &pods, &[vs], &[]));
        let m: HttpConnectionManager = typed(&find(&ls, "0.0.0.0_9080").filter_chains[0].filters[0]);
        let names: Vec<&str> = m.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, vec![FAULT, ROUTER]);
        let m: HttpConnectionManager = typed(&find(&ls, "0.0.0.0_50051").filter_chains[0].filters[0]);
        assert_eq!(m.http_filters.len(), 1);
    }

    #[test]
    fn tcp_routes_split_by_weight() {
        let (mut svcs, slices, pods) = bookinfo();
        svcs.push(service("db2", "10.96.0.13", &[("tcp-postgres", 5432, 5432)]));
        let vs = config(
            "db",
            json!({"hosts": ["db"], "tcp": [{"match": [{"port": 5432}], "route": [
                {"destination": {"host": "db"}, "weight": 90}, {"destination": {"host": "db2"}, "weight": 10}]}]}),
        );
        let ls = outbound(&mesh_full(&svcs, &slices, &pods, &[vs], &[]));
        let tp: TcpProxy = typed(&find(&ls, "10.96.0.12_5432").filter_chains[0].filters[0]);
        let Some(ClusterSpecifier::WeightedClusters(w)) = tp.cluster_specifier else { panic!() };
        let got: Vec<(&str, u32)> = w.clusters.iter().map(|c| (c.name.as_str(), c.weight)).collect();
        assert_eq!(
            got,
            vec![
                ("outbound|5432||db.default.svc.cluster.local", 90),
                ("outbound|5432||db2.default.svc.cluster.local", 10)
            ]
        );
    }

    #[test]
    fn virtual_inbound_has_a_chain_per_container_port() {
        let (svcs, slices, pods) = bookinfo();
        let mesh = mesh_with(&svcs, &slices, &pods);
        let proxy = Proxy::from_node(&node("10.1.3.1", "productpage", "default"), &mesh).unwrap();
        let l = virtual_inbound(&mesh, &proxy);
        assert_eq!(l.name, "virtualInbound");
        assert_eq!(l.address, Some(socket_address("0.0.0.0", 15006)));
        assert_eq!(l.use_original_dst, boolv(true));
        assert_eq!(l.traffic_direction, TrafficDirection::Inbound as i32);
        assert_eq!(l.filter_chains.len(), 2);
        let http = &l.filter_chains[0];
        assert_eq!(http.filter_chain_match.as_ref().unwrap().destination_port, Some(u32v(9080)));
        let m: HttpConnectionManager = typed(&http.filters[0]);
        let Some(RouteSpecifier::RouteConfig(rc)) = m.route_specifier else { panic!("no inline routes") };
        assert_eq!(rc.name, "inbound|9080||");
        assert_eq!(rc.virtual_hosts[0].domains, vec!["*"]);
        let Some(Action::Route(ra)) = &rc.virtual_hosts[0].routes[0].action else { panic!() };
        assert_eq!(ra.cluster_specifier, Some(RouteCluster::Cluster("inbound|9080||".into())));
        let tcp = &l.filter_chains[1];
        assert_eq!(tcp.filter_chain_match.as_ref().unwrap().destination_port, Some(u32v(9999)));
        let tp: TcpProxy = typed(&tcp.filters[0]);
        assert_eq!(tp.cluster_specifier, Some(ClusterSpecifier::Cluster("inbound|9999||".into())));
        let d: TcpProxy = typed(&l.default_filter_chain.as_ref().unwrap().filters[0]);
        assert_eq!(d.cluster_specifier, Some(ClusterSpecifier::Cluster("InboundPassthroughClusterIpv4".into())));
    }
}
