//! Stale UDP conntrack entries: UDP has no connection teardown, so after an endpoint goes
//! away (or a service gets its first endpoint after REJECTing) clients keep using the old
//! conntrack entry. Like Kubernetes, compute which entries to delete from the change of
//! service ports ([`stale_entries`], pure) and delete them with the `conntrack` tool.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use crate::model::{Protocol, ServicePort};

/// One `conntrack -D` filter.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Delete {
    /// Flows to a service IP:port (it had no endpoints: cached REJECTs).
    ServiceIp { ip: Ipv4Addr, port: u16 },
    /// Flows to a node port (it had no endpoints).
    NodePort { port: u16 },
    /// Flows DNATed from a service IP to a removed endpoint.
    Endpoint { service_ip: Ipv4Addr, endpoint: Ipv4Addr },
}

impl Delete {
    /// Arguments of `conntrack`.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["-D".into(), "-p".into(), "udp".into()];
        match self {
            Delete::ServiceIp { ip, port } => {
                a.extend(["--orig-dst".into(), ip.to_string(), "--dport".into(), port.to_string()])
            }
            Delete::NodePort { port } => a.extend(["--dport".into(), port.to_string()]),
            Delete::Endpoint { service_ip, endpoint } => {
                a.extend(["--orig-dst".into(), service_ip.to_string(), "--dst-nat".into(), endpoint.to_string()])
            }
        }
        a
    }
}

fn service_ips(p: &ServicePort) -> Vec<Ipv4Addr> {
    let mut v = vec![p.cluster_ip];
    v.extend(&p.external_ips);
    v.extend(&p.load_balancer_ips);
    v
}

/// The UDP conntrack entries that must go when the service ports change from `old` to `new`.
pub fn stale_entries<P: Borrow<ServicePort>>(old: &[P], new: &[P]) -> BTreeSet<Delete> {
    let mut out = BTreeSet::new();
    let key = |p: &ServicePort| (p.name.clone(), p.protocol);
    for n in new.iter().map(Borrow::borrow).filter(|p| p.protocol == Protocol::Udp) {
        let o = old.iter().map(Borrow::borrow).find(|o| key(o) == key(n));
        let old_eps: BTreeSet<Ipv4Addr> =
            o.map(|o| o.cluster_endpoints.iter().map(|e| e.ip).collect()).unwrap_or_default();
        let new_eps: BTreeSet<Ipv4Addr> = n.cluster_endpoints.iter().map(|e| e.ip).collect();
        // Had no endpoints (rejected) and now has some.
        if o.is_some_and(|o| o.cluster_endpoints.is_empty()) && !new_eps.is_empty() {
            for ip in service_ips(n) {
                out.insert(Delete::ServiceIp { ip, port: n.port });
            }
            if let Some(port) = n.node_port {
                out.insert(Delete::NodePort { port });
            }
        }
        for gone in old_eps.difference(&new_eps) {
            for ip in service_ips(n) {
                out.insert(Delete::Endpoint { service_ip: ip, endpoint: *gone });
            }
        }
    }
    // Removed UDP services: their endpoints' flows.
    for o in old.iter().map(Borrow::borrow).filter(|p: &&ServicePort| p.protocol == Protocol::Udp) {
        if !new.iter().any(|n| key(n.borrow()) == key(o)) {
            for e in &o.cluster_endpoints {
                for ip in service_ips(o) {
                    out.insert(Delete::Endpoint { service_ip: ip, endpoint: e.ip });
                }
            }
        }
    }
    out
}

/// Delete the entries with `conntrack`; a missing tool is reported once by the caller.
pub fn delete(entries: &BTreeSet<Delete>) -> anyhow::Result<()> {
    for e in entries {
        let out = std::process::Command::new("conntrack").args(e.args()).output()?;
        // Exit status 1 with "0 flow entries" is fine: nothing to delete.
        if !out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("0 flow entries") {
            tracing::warn!(args = ?e.args(), stderr = %String::from_utf8_lossy(&out.stderr).trim(), "conntrack delete failed");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{simple_slice, svc};
    use crate::model::{service_ports, NodeInfo};
    use serde_json::json;

    fn ports(ips: &[&str]) -> Vec<ServicePort> {
        let s = svc(json!({"metadata": {"name": "dns", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.53", "ports": [{"name": "http", "port": 53, "protocol": "UDP"}]}}));
        let mut sl = simple_slice("dns", ips, 53);
        sl.ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        service_ports(&[s], &[sl], &NodeInfo::default())
    }

    #[test]
    fn removed_udp_endpoint_flows_are_deleted() {
        let d = stale_entries(&ports(&["10.0.0.1", "10.0.0.2"]), &ports(&["10.0.0.1"]));
        assert_eq!(
            d.into_iter().collect::<Vec<_>>(),
            [Delete::Endpoint { service_ip: "10.96.0.53".parse().unwrap(), endpoint: "10.0.0.2".parse().unwrap() }]
        );
    }

    #[test]
    fn first_endpoint_clears_cached_rejects() {
        let d = stale_entries(&ports(&[]), &ports(&["10.0.0.1"]));
        let v: Vec<_> = d.into_iter().collect();
        assert_eq!(v, [Delete::ServiceIp { ip: "10.96.0.53".parse().unwrap(), port: 53 }]);
        assert_eq!(v[0].args(), ["-D", "-p", "udp", "--orig-dst", "10.96.0.53", "--dport", "53"]);
    }

    #[test]
    fn unchanged_or_tcp_needs_nothing() {
        assert!(stale_entries(&ports(&["10.0.0.1"]), &ports(&["10.0.0.1"])).is_empty());
        let tcp = service_ports(
            &[crate::model::tests::simple_service("web", "10.96.0.10", 80)],
            &[simple_slice("web", &["10.0.0.1"], 80)],
            &NodeInfo::default(),
        );
        assert!(stale_entries(&tcp, &[]).is_empty());
        // A removed UDP service: its endpoints' flows go.
        assert_eq!(stale_entries(&ports(&["10.0.0.1"]), &[]).len(), 1);
    }
}
