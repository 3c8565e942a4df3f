//! EDS: a `ClusterLoadAssignment` per outbound cluster: the Service's ready endpoints
//! (`HEALTHY`) and terminating ones (`DRAINING`) on the port's target, a subset's filtered
//! by its pods' labels.

use envoy_types::pb::envoy::config::core::v3::{
    address, socket_address::PortSpecifier, socket_address::Protocol as SocketProtocol, Address, HealthStatus,
    SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};

use super::mesh::{EndpointInfo, Health};
use super::{outbound_cluster, Mesh};
use crate::model::{ServiceInfo, ServicePort};

pub fn socket_address(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            protocol: SocketProtocol::Tcp as i32,
            address: ip.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// An assignment with no endpoints (what a proxy gets for a cluster pilot does not know).
pub fn empty(name: &str) -> ClusterLoadAssignment {
    ClusterLoadAssignment { cluster_name: name.to_string(), ..Default::default() }
}

/// The port an endpoint serves a Service port on: the slice port of the same name.
fn target(ep: &EndpointInfo, port: &ServicePort, svc: &ServiceInfo) -> Option<u32> {
    ep.ports
        .get(&port.name)
        .copied()
        .or_else(|| (svc.ports.len() == 1 && ep.ports.len() == 1).then(|| ep.ports.values().next().copied()).flatten())
}

fn assignment<'a>(name: String, eps: impl Iterator<Item = (&'a EndpointInfo, u32)>) -> ClusterLoadAssignment {
    let lb_endpoints: Vec<LbEndpoint> = eps
        .map(|(ep, port)| LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(socket_address(&ep.ip, port)),
                ..Default::default()
            })),
            health_status: match ep.health {
                Health::Healthy => HealthStatus::Healthy as i32,
                Health::Draining => HealthStatus::Draining as i32,
            },
            ..Default::default()
        })
        .collect();
    ClusterLoadAssignment {
        cluster_name: name,
        endpoints: if lb_endpoints.is_empty() {
            vec![]
        } else {
            vec![LocalityLbEndpoints { lb_endpoints, ..Default::default() }]
        },
        ..Default::default()
    }
}

/// The assignments of every outbound cluster ([`super::clusters::shared`]'s EDS clusters).
pub fn all(mesh: &Mesh) -> Vec<ClusterLoadAssignment> {
    let rules = mesh.config.rules_by_host();
    let none = Vec::new();
    let mut out = Vec::new();
    for svc in mesh.services.by_fqdn.values() {
        let eps = mesh.endpoints.get(&(svc.namespace.clone(), svc.name.clone())).unwrap_or(&none);
        let subsets = rules.get(svc.fqdn.as_str()).map(|r| r.spec.subsets.as_slice()).unwrap_or(&[]);
        for port in &svc.ports {
            let on_port = || eps.iter().filter_map(|ep| Some((ep, target(ep, port, svc)?)));
            out.push(assignment(outbound_cluster(port.port, "", &svc.fqdn), on_port()));
            for subset in subsets {
                let selected = on_port().filter(|(ep, _)| {
                    mesh.pod_labels(ep)
                        .is_some_and(|labels| subset.labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
                });
                out.push(assignment(outbound_cluster(port.port, &subset.name, &svc.fqdn), selected));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::testutil::*;
    use serde_json::json;

    fn endpoints(cla: &ClusterLoadAssignment) -> Vec<(String, u32, i32)> {
        cla.endpoints
            .iter()
            .flat_map(|l| &l.lb_endpoints)
            .map(|e| {
                let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier else { panic!() };
                let Some(address::Address::SocketAddress(sa)) = &ep.address.as_ref().unwrap().address else { panic!() };
                let Some(PortSpecifier::PortValue(p)) = sa.port_specifier else { panic!() };
                (sa.address.clone(), p, e.health_status)
            })
            .collect()
    }

    #[test]
    fn ready_endpoints_are_healthy_terminating_ones_draining() {
        let (svcs, slices, pods) = bookinfo();
        let all = all(&mesh_full(&svcs, &slices, &pods, &[], &[reviews_rule(json!(null))]));
        let get = |n: &str| all.iter().find(|c| c.cluster_name == n).unwrap();
        let h = HealthStatus::Healthy as i32;
        let d = HealthStatus::Draining as i32;
        assert_eq!(
            endpoints(get("outbound|9080||reviews.default.svc.cluster.local")),
            vec![("10.1.0.1".into(), 9080, h), ("10.1.0.2".into(), 9080, h), ("10.1.0.3".into(), 9080, d)]
        );
        assert_eq!(
            endpoints(get("outbound|9080|v1|reviews.default.svc.cluster.local")),
            vec![("10.1.0.1".into(), 9080, h)]
        );
        assert_eq!(
            endpoints(get("outbound|9080|v2|reviews.default.svc.cluster.local")),
            vec![("10.1.0.2".into(), 9080, h), ("10.1.0.3".into(), 9080, d)]
        );
        assert_eq!(endpoints(get("outbound|5432||db.default.svc.cluster.local")), vec![("10.1.2.1".into(), 5432, h)]);
    }

    #[test]
    fn service_ports_map_to_the_slices_target_ports() {
        let svc = service("web", "10.96.0.20", &[("http", 80, 8080)]);
        let s = slice("web", &[("http", 8080)], &[("10.1.5.1", "web-1", true, false)]);
        let all = all(&mesh_with(&[svc], &[s], &[]));
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].cluster_name, "outbound|80||web.default.svc.cluster.local");
        assert_eq!(endpoints(&all[0]), vec![("10.1.5.1".into(), 8080, HealthStatus::Healthy as i32)]);
    }

    #[test]
    fn services_without_endpoints_get_empty_assignments() {
        let svc = service("web", "10.96.0.20", &[("http", 80, 8080)]);
        let all = all(&mesh_with(&[svc], &[], &[]));
        assert_eq!(all, vec![empty("outbound|80||web.default.svc.cluster.local")]);
    }
}
