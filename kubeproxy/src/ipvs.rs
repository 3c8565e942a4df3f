//! IPVS mode as pure data: the virtual servers (cluster IPs, external/LB IPs, node ports on
//! each node address) with their real servers, and the operations that move the kernel's
//! IPVS table from one state to another ([`diff`]) — what [`crate::ipvs_netlink`] sends over
//! the generic netlink `IPVS` family. Addresses of virtual servers are bound to the
//! `kube-ipvs0` dummy device ([`address_changes`], [`crate::ipvs_dummy`]), as Kubernetes does.
//!
//! `ipvs_netlink::check_kernel` asks the kernel's generic netlink controller for the `IPVS`
//! family before anything is written: where the kernel has no `ip_vs` module the mode fails
//! at start with a clear message.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use crate::model::{Endpoint, Protocol, ServicePort};

pub const DUMMY_DEVICE: &str = "kube-ipvs0";

/// Identity of a virtual server.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VsKey {
    pub addr: Ipv4Addr,
    pub port: u16,
    pub protocol: Protocol,
}

/// A virtual server's settings.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct VirtualServer {
    pub key: VsKey,
    /// Scheduler (`--ipvs-scheduler`, default `rr`).
    pub scheduler: String,
    /// Persistence timeout for `sessionAffinity: ClientIP`.
    pub persistence_timeout: Option<u32>,
}

/// A real server (backend) of a virtual server.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RealServer {
    pub addr: Ipv4Addr,
    pub port: u16,
    pub weight: u32,
}

/// The whole IPVS table: virtual servers with their real servers, plus the addresses
/// bound to the dummy device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub services: BTreeMap<VsKey, (VirtualServer, BTreeSet<RealServer>)>,
    pub bound: BTreeSet<Ipv4Addr>,
}

/// One IPVS (or address) operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    BindAddress(Ipv4Addr),
    UnbindAddress(Ipv4Addr),
    AddVirtualServer(VirtualServer),
    UpdateVirtualServer(VirtualServer),
    DeleteVirtualServer(VsKey),
    AddRealServer(VsKey, RealServer),
    DeleteRealServer(VsKey, RealServer),
}

fn reals(eps: &[Endpoint]) -> BTreeSet<RealServer> {
    eps.iter().map(|e| RealServer { addr: e.ip, port: e.port, weight: 1 }).collect()
}

/// The desired IPVS state. Node ports get a virtual server on each of `node_ips`.
pub fn desired<P: std::borrow::Borrow<ServicePort>>(ports: &[P], node_ips: &[Ipv4Addr], scheduler: &str) -> State {
    let mut st = State::default();
    for sp in ports.iter().map(std::borrow::Borrow::borrow) {
        let mut add = |addr: Ipv4Addr, port: u16, eps: &[Endpoint], bind: bool| {
            let key = VsKey { addr, port, protocol: sp.protocol };
            let vs = VirtualServer {
                key: key.clone(),
                scheduler: scheduler.to_string(),
                persistence_timeout: sp.affinity_timeout,
            };
            st.services.insert(key, (vs, reals(eps)));
            if bind {
                st.bound.insert(addr);
            }
        };
        add(sp.cluster_ip, sp.port, &sp.cluster_endpoints, true);
        for ip in sp.external_ips.iter().chain(&sp.load_balancer_ips) {
            add(*ip, sp.port, &sp.external_endpoints, true);
        }
        if let Some(np) = sp.node_port {
            for ip in node_ips {
                add(*ip, np, &sp.external_endpoints, false);
            }
        }
    }
    st
}

/// The operations that turn `current` into `desired`, in an order the kernel accepts:
/// bind addresses, add/update virtual servers, real server changes, then deletions.
pub fn diff(current: &State, desired: &State) -> Vec<Op> {
    let mut ops = Vec::new();
    for ip in desired.bound.difference(&current.bound) {
        ops.push(Op::BindAddress(*ip));
    }
    for (key, (vs, rs)) in &desired.services {
        let empty = BTreeSet::new();
        let cur_rs = match current.services.get(key) {
            None => {
                ops.push(Op::AddVirtualServer(vs.clone()));
                &empty
            }
            Some((cur_vs, cur_rs)) => {
                if cur_vs != vs {
                    ops.push(Op::UpdateVirtualServer(vs.clone()));
                }
                cur_rs
            }
        };
        // A real server whose weight changed (one read back from the kernel with another
        // weight) is deleted before it is added again: the kernel knows it by address and port.
        let adds: Vec<&RealServer> = rs.difference(cur_rs).collect();
        let (readded, gone): (Vec<&RealServer>, Vec<&RealServer>) =
            cur_rs.difference(rs).partition(|old| adds.iter().any(|r| (r.addr, r.port) == (old.addr, old.port)));
        for r in readded {
            ops.push(Op::DeleteRealServer(key.clone(), r.clone()));
        }
        for r in adds {
            ops.push(Op::AddRealServer(key.clone(), r.clone()));
        }
        for r in gone {
            ops.push(Op::DeleteRealServer(key.clone(), r.clone()));
        }
    }
    for key in current.services.keys() {
        if !desired.services.contains_key(key) {
            ops.push(Op::DeleteVirtualServer(key.clone()));
        }
    }
    for ip in current.bound.difference(&desired.bound) {
        ops.push(Op::UnbindAddress(*ip));
    }
    ops
}

/// A human description of an operation, for errors.
pub fn describe(op: &Op) -> String {
    let vs = |k: &VsKey| format!("{} {}:{}", k.protocol.lower(), k.addr, k.port);
    match op {
        Op::BindAddress(ip) => format!("bind {ip} to {DUMMY_DEVICE}"),
        Op::UnbindAddress(ip) => format!("unbind {ip} from {DUMMY_DEVICE}"),
        Op::AddVirtualServer(v) => format!("add virtual server {} (scheduler {})", vs(&v.key), v.scheduler),
        Op::UpdateVirtualServer(v) => format!("update virtual server {} (scheduler {})", vs(&v.key), v.scheduler),
        Op::DeleteVirtualServer(k) => format!("delete virtual server {}", vs(k)),
        Op::AddRealServer(k, r) => format!("add real server {}:{} to {}", r.addr, r.port, vs(k)),
        Op::DeleteRealServer(k, r) => format!("delete real server {}:{} from {}", r.addr, r.port, vs(k)),
    }
}

/// The address changes that make `kube-ipvs0`'s addresses (`current`) equal `desired`:
/// (to add, to delete), each sorted.
pub fn address_changes(current: &BTreeSet<Ipv4Addr>, desired: &BTreeSet<Ipv4Addr>) -> (Vec<Ipv4Addr>, Vec<Ipv4Addr>) {
    (desired.difference(current).copied().collect(), current.difference(desired).copied().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{simple_service, simple_slice, svc};
    use crate::model::{service_ports, NodeInfo};
    use serde_json::json;

    fn node() -> NodeInfo {
        NodeInfo::named("node-a")
    }
    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn cluster_ip_and_node_ports_become_virtual_servers() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "sessionAffinity": "ClientIP",
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}));
        let ports = service_ports(&[s], &[simple_slice("web", &["10.244.1.1", "10.244.1.2"], 8080)], &node());
        let st = desired(&ports, &[ip("192.168.1.10"), ip("127.0.0.1")], "rr");
        assert_eq!(st.services.len(), 3);
        let (vs, rs) = &st.services[&VsKey { addr: ip("10.96.0.10"), port: 80, protocol: Protocol::Tcp }];
        assert_eq!(vs.persistence_timeout, Some(10800));
        assert_eq!(rs.len(), 2);
        assert!(st.services.contains_key(&VsKey { addr: ip("192.168.1.10"), port: 30080, protocol: Protocol::Tcp }));
        assert_eq!(
            st.bound.iter().copied().collect::<Vec<_>>(),
            [ip("10.96.0.10")],
            "node IPs are not bound to the dummy device"
        );
    }

    #[test]
    fn from_scratch_then_one_endpoint_change() {
        let svcs = [simple_service("a", "10.96.0.1", 80)];
        let one =
            desired(&service_ports(&svcs, &[simple_slice("a", &["10.0.0.1", "10.0.0.2"], 80)], &node()), &[], "rr");
        let ops = diff(&State::default(), &one);
        assert_eq!(ops[0], Op::BindAddress(ip("10.96.0.1")));
        assert!(matches!(ops[1], Op::AddVirtualServer(_)));
        assert_eq!(ops.iter().filter(|o| matches!(o, Op::AddRealServer(..))).count(), 2);
        assert!(diff(&one, &one).is_empty());

        let two =
            desired(&service_ports(&svcs, &[simple_slice("a", &["10.0.0.1", "10.0.0.3"], 80)], &node()), &[], "rr");
        let key = VsKey { addr: ip("10.96.0.1"), port: 80, protocol: Protocol::Tcp };
        assert_eq!(
            diff(&one, &two),
            [
                Op::AddRealServer(key.clone(), RealServer { addr: ip("10.0.0.3"), port: 80, weight: 1 }),
                Op::DeleteRealServer(key, RealServer { addr: ip("10.0.0.2"), port: 80, weight: 1 }),
            ]
        );
    }

    #[test]
    fn a_weight_change_deletes_before_adding_again() {
        let one = desired(
            &service_ports(&[simple_service("a", "10.96.0.1", 80)], &[simple_slice("a", &["10.0.0.1"], 80)], &node()),
            &[],
            "rr",
        );
        let key = VsKey { addr: ip("10.96.0.1"), port: 80, protocol: Protocol::Tcp };
        let mut read_back = one.clone();
        let (_, reals) = read_back.services.get_mut(&key).unwrap();
        *reals = [RealServer { addr: ip("10.0.0.1"), port: 80, weight: 0 }].into();
        assert_eq!(
            diff(&read_back, &one),
            [
                Op::DeleteRealServer(key.clone(), RealServer { addr: ip("10.0.0.1"), port: 80, weight: 0 }),
                Op::AddRealServer(key, RealServer { addr: ip("10.0.0.1"), port: 80, weight: 1 }),
            ]
        );
    }

    #[test]
    fn removed_service_deletes_virtual_server_and_unbinds() {
        let one = desired(&service_ports(&[simple_service("a", "10.96.0.1", 80)], &[], &node()), &[], "rr");
        let ops = diff(&one, &State::default());
        assert_eq!(
            ops,
            [
                Op::DeleteVirtualServer(VsKey { addr: ip("10.96.0.1"), port: 80, protocol: Protocol::Tcp }),
                Op::UnbindAddress(ip("10.96.0.1"))
            ]
        );
    }

    #[test]
    fn scheduler_change_updates_virtual_server() {
        let ports = service_ports(&[simple_service("a", "10.96.0.1", 80)], &[], &node());
        let ops = diff(&desired(&ports, &[], "rr"), &desired(&ports, &[], "lc"));
        assert!(matches!(&ops[..], [Op::UpdateVirtualServer(vs)] if vs.scheduler == "lc"));
    }

    #[test]
    fn address_changes_add_missing_and_delete_stale() {
        let set = |v: &[&str]| v.iter().map(|s| ip(s)).collect::<BTreeSet<_>>();
        let (add, del) =
            address_changes(&set(&["10.96.0.1", "10.96.0.2"]), &set(&["10.96.0.2", "10.96.0.3", "1.2.3.4"]));
        assert_eq!(add, [ip("1.2.3.4"), ip("10.96.0.3")]);
        assert_eq!(del, [ip("10.96.0.1")]);
        assert_eq!(address_changes(&set(&["10.96.0.1"]), &set(&["10.96.0.1"])), (vec![], vec![]));
    }

    #[test]
    fn operations_are_described_for_errors() {
        let key = VsKey { addr: ip("10.96.0.1"), port: 80, protocol: Protocol::Tcp };
        let rs = RealServer { addr: ip("10.0.0.1"), port: 8080, weight: 1 };
        assert_eq!(describe(&Op::AddRealServer(key.clone(), rs)), "add real server 10.0.0.1:8080 to tcp 10.96.0.1:80");
        assert_eq!(describe(&Op::DeleteVirtualServer(key)), "delete virtual server tcp 10.96.0.1:80");
    }
}
