//! The iptables rules IPVS mode needs beside the virtual servers, as kube-proxy's IPVS
//! proxier has them (pure): IPVS only balances; masquerading, node-port handling and the
//! filter around the Service addresses stay in iptables. kube-proxy matches with ipsets
//! (`KUBE-CLUSTER-IP`, `KUBE-NODE-PORT-TCP`, `KUBE-LOOP-BACK`, …); here each set member is a
//! plain rule of its own (no `ipset` tool or module needed), in the same chains:
//!
//! - `nat KUBE-SERVICES` (from `PREROUTING`, `OUTPUT`): traffic to a cluster IP from outside
//!   `--cluster-cidr` (all of it with `--masquerade-all`; without a cluster CIDR, the node's
//!   own traffic that took a Service address as its source) goes through `KUBE-MARK-MASQ`;
//!   so does traffic to external and load balancer IPs unless `externalTrafficPolicy: Local`;
//!   every Service address:port then leaves the chain (`ACCEPT`), the rest destined to a
//!   node address goes to `KUBE-NODE-PORT`.
//! - `nat KUBE-NODE-PORT`: node ports (not `Local` ones) are marked for masquerading.
//! - `nat KUBE-POSTROUTING` (from `POSTROUTING`): hairpin traffic (an endpoint reaching itself
//!   through its Service) is masqueraded, then every marked packet.
//! - `filter KUBE-FORWARD`: marked and established traffic is forwarded.
//! - `filter KUBE-NODE-PORT` (from `INPUT`): health check node ports are accepted.
//! - `filter KUBE-IPVS-FILTER` (from `INPUT`): new connections to an address on `kube-ipvs0`
//!   on a port no Service has are rejected, so that the host's own listeners are not
//!   reachable through Service addresses.
//!
//! Rules are written as `iptables-save` prints them, so that a listing compares equal.
//! `loadBalancerSourceRanges` are not applied in this mode.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use crate::iptables::{Config, Tables, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_POSTROUTING, KUBE_SERVICES, MASQ_MARK};
use crate::model::{Protocol, ServicePort};

pub const KUBE_NODE_PORT: &str = "KUBE-NODE-PORT";
pub const KUBE_IPVS_FILTER: &str = "KUBE-IPVS-FILTER";

/// The jump rules from the built-in chains into ours: (table, chain, rule args), inserted
/// once at the top of their chains (checked with `iptables -C`).
pub fn jump_rules() -> Vec<(&'static str, &'static str, Vec<String>)> {
    let j = |table: &'static str, chain: &'static str, comment: &str, target: &str| {
        let v = ["-m", "comment", "--comment", comment, "-j", target].iter().map(|s| s.to_string()).collect();
        (table, chain, v)
    };
    vec![
        j("nat", "PREROUTING", "kubernetes service portals", KUBE_SERVICES),
        j("nat", "OUTPUT", "kubernetes service portals", KUBE_SERVICES),
        j("nat", "POSTROUTING", "kubernetes postrouting rules", KUBE_POSTROUTING),
        j("filter", "FORWARD", "kubernetes forwarding rules", KUBE_FORWARD),
        j("filter", "INPUT", "kubernetes health check rules", KUBE_NODE_PORT),
        j("filter", "INPUT", "kubernetes ipvs access filter", KUBE_IPVS_FILTER),
    ]
}

/// `-p tcp -m comment --comment "…" -m tcp --dport N`, as iptables-save orders them.
fn port_match(p: Protocol, comment: &str, port: u16) -> String {
    let p = p.lower();
    format!("-p {p} -m comment --comment \"{comment}\" -m {p} --dport {port}")
}

/// The Service addresses of a port with what they are: cluster, external and LB IPs.
fn addresses(sp: &ServicePort) -> Vec<(Ipv4Addr, &'static str)> {
    let mut v = vec![(sp.cluster_ip, "cluster IP")];
    v.extend(sp.external_ips.iter().map(|ip| (*ip, "external IP")));
    v.extend(sp.load_balancer_ips.iter().map(|ip| (*ip, "loadbalancer IP")));
    v
}

/// The `filter` and `nat` chains of IPVS mode for `ports`; `node_ips` are the node's own
/// addresses, never rejected even when a Service uses one as an external IP.
pub fn render<P: std::borrow::Borrow<ServicePort>>(ports: &[P], cfg: &Config, node_ips: &[Ipv4Addr]) -> Tables {
    let mut seen = BTreeSet::new();
    let ports: Vec<&ServicePort> =
        ports.iter().map(std::borrow::Borrow::borrow).filter(|sp| seen.insert(&sp.name)).collect();
    let mut t = Tables::default();
    let mut nat =
        |chain: &str, rule: String| t.nat.entry(chain.to_string()).or_default().push(format!("-A {chain} {rule}"));

    for sp in &ports {
        let spn = sp.name.to_string();
        let m = |what: &str, port: u16| port_match(sp.protocol, &format!("{spn} {what}"), port);
        let cip = sp.cluster_ip;
        if cfg.masquerade_all {
            nat(KUBE_SERVICES, format!("-d {cip}/32 {} -j {KUBE_MARK_MASQ}", m("cluster IP", sp.port)));
        } else if let Some(cidr) = &cfg.cluster_cidr {
            nat(KUBE_SERVICES, format!("! -s {cidr} -d {cip}/32 {} -j {KUBE_MARK_MASQ}", m("cluster IP", sp.port)));
        } else {
            nat(KUBE_SERVICES, format!("-s {cip}/32 {} -j {KUBE_MARK_MASQ}", m("cluster IP", sp.port)));
        }
        if !sp.external_policy_local {
            for (ip, what) in addresses(sp).into_iter().skip(1) {
                nat(KUBE_SERVICES, format!("-d {ip}/32 {} -j {KUBE_MARK_MASQ}", m(what, sp.port)));
            }
        }
    }
    for sp in &ports {
        let spn = sp.name.to_string();
        for (ip, what) in addresses(sp) {
            nat(
                KUBE_SERVICES,
                format!("-d {ip}/32 {} -j ACCEPT", port_match(sp.protocol, &format!("{spn} {what}"), sp.port)),
            );
        }
    }
    let comment = "-m comment --comment \"kubernetes service nodeports\"";
    if cfg.nodeport_addresses.is_empty() {
        nat(KUBE_SERVICES, format!("{comment} -m addrtype --dst-type LOCAL -j {KUBE_NODE_PORT}"));
    } else {
        for ip in &cfg.nodeport_addresses {
            nat(KUBE_SERVICES, format!("-d {ip}/32 {comment} -j {KUBE_NODE_PORT}"));
        }
    }
    t.nat.entry(KUBE_NODE_PORT.to_string()).or_default();
    for sp in ports.iter().filter(|sp| !sp.external_policy_local) {
        if let Some(np) = sp.node_port {
            let rule =
                format!("{} -j {KUBE_MARK_MASQ}", port_match(sp.protocol, &format!("{} node port", sp.name), np));
            t.nat.entry(KUBE_NODE_PORT.to_string()).or_default().push(format!("-A {KUBE_NODE_PORT} {rule}"));
        }
    }
    let mut nat =
        |chain: &str, rule: String| t.nat.entry(chain.to_string()).or_default().push(format!("-A {chain} {rule}"));
    nat(KUBE_MARK_MASQ, format!("-j MARK --set-xmark {MASQ_MARK}/{MASQ_MARK}"));
    let hairpin: BTreeSet<(Protocol, Ipv4Addr, u16)> = ports
        .iter()
        .flat_map(|sp| sp.cluster_endpoints.iter().chain(&sp.external_endpoints).map(|e| (sp.protocol, e.ip, e.port)))
        .collect();
    for (p, ip, port) in hairpin {
        nat(
            KUBE_POSTROUTING,
            format!(
                "-s {ip}/32 -d {ip}/32 {} -j MASQUERADE",
                port_match(p, "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose", port)
            ),
        );
    }
    nat(KUBE_POSTROUTING, format!("-m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"));
    nat(KUBE_POSTROUTING, format!("-j MARK --set-xmark {MASQ_MARK}/0x0"));
    nat(
        KUBE_POSTROUTING,
        "-m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully".into(),
    );

    let mut filter =
        |chain: &str, rule: String| t.filter.entry(chain.to_string()).or_default().push(format!("-A {chain} {rule}"));
    filter(
        KUBE_FORWARD,
        format!(
            "-m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"
        ),
    );
    filter(
        KUBE_FORWARD,
        "-m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
            .into(),
    );
    t.filter.entry(KUBE_NODE_PORT.to_string()).or_default();
    t.filter.entry(KUBE_IPVS_FILTER.to_string()).or_default();
    let mut filter =
        |chain: &str, rule: String| t.filter.entry(chain.to_string()).or_default().push(format!("-A {chain} {rule}"));
    for sp in &ports {
        if let Some(hc) = sp.health_check_node_port {
            filter(
                KUBE_NODE_PORT,
                format!("{} -j ACCEPT", port_match(Protocol::Tcp, &format!("{} health check node port", sp.name), hc)),
            );
        }
    }
    let mut bound = BTreeSet::new();
    for sp in &ports {
        for (ip, what) in addresses(sp) {
            filter(
                KUBE_IPVS_FILTER,
                format!("-d {ip}/32 {} -j RETURN", port_match(sp.protocol, &format!("{} {what}", sp.name), sp.port)),
            );
            bound.insert(ip);
        }
    }
    for ip in bound.iter().filter(|ip| !node_ips.contains(ip)) {
        filter(
            KUBE_IPVS_FILTER,
            format!("-d {ip}/32 -m conntrack --ctstate NEW -j REJECT --reject-with icmp-port-unreachable"),
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{simple_slice, svc};
    use crate::model::{service_ports, NodeInfo};
    use serde_json::json;

    fn ports() -> Vec<ServicePort> {
        let web = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "externalIPs": ["192.0.2.7"],
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}}));
        let local = svc(json!({"metadata": {"name": "loc", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.11", "externalTrafficPolicy": "Local",
                     "healthCheckNodePort": 32000,
                     "ports": [{"name": "http", "port": 80, "nodePort": 30081, "protocol": "UDP"}]}}));
        service_ports(
            &[web, local],
            // loc's slice has TCP ports only: no endpoint for its UDP port.
            &[simple_slice("web", &["10.244.1.1"], 8080), simple_slice("loc", &["10.244.1.2"], 8080)],
            &NodeInfo::named("node-a"),
        )
    }

    #[test]
    fn rules_as_kube_proxys_ipvs_mode_has_them() {
        let cfg = Config { cluster_cidr: Some("10.244.0.0/16".into()), ..Default::default() };
        let t = render(&ports(), &cfg, &["192.0.2.7".parse().unwrap()]);
        let lines = |c: &Vec<String>| c.join("\n");
        assert_eq!(
            lines(&t.nat[KUBE_SERVICES]),
            [
                r#"-A KUBE-SERVICES ! -s 10.244.0.0/16 -d 10.96.0.11/32 -p udp -m comment --comment "default/loc:http cluster IP" -m udp --dport 80 -j KUBE-MARK-MASQ"#,
                r#"-A KUBE-SERVICES ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ"#,
                r#"-A KUBE-SERVICES -d 192.0.2.7/32 -p tcp -m comment --comment "default/web:http external IP" -m tcp --dport 80 -j KUBE-MARK-MASQ"#,
                r#"-A KUBE-SERVICES -d 198.51.100.1/32 -p tcp -m comment --comment "default/web:http loadbalancer IP" -m tcp --dport 80 -j KUBE-MARK-MASQ"#,
                r#"-A KUBE-SERVICES -d 10.96.0.11/32 -p udp -m comment --comment "default/loc:http cluster IP" -m udp --dport 80 -j ACCEPT"#,
                r#"-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j ACCEPT"#,
                r#"-A KUBE-SERVICES -d 192.0.2.7/32 -p tcp -m comment --comment "default/web:http external IP" -m tcp --dport 80 -j ACCEPT"#,
                r#"-A KUBE-SERVICES -d 198.51.100.1/32 -p tcp -m comment --comment "default/web:http loadbalancer IP" -m tcp --dport 80 -j ACCEPT"#,
                r#"-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT"#,
            ]
            .join("\n")
        );
        assert_eq!(
            t.nat[KUBE_NODE_PORT],
            [
                r#"-A KUBE-NODE-PORT -p tcp -m comment --comment "default/web:http node port" -m tcp --dport 30080 -j KUBE-MARK-MASQ"#
            ],
            "a Local node port keeps the client's address"
        );
        assert_eq!(t.nat[KUBE_MARK_MASQ], ["-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"]);
        assert_eq!(
            lines(&t.nat[KUBE_POSTROUTING]),
            [
                r#"-A KUBE-POSTROUTING -s 10.244.1.1/32 -d 10.244.1.1/32 -p tcp -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m tcp --dport 8080 -j MASQUERADE"#,
                "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
                "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
                r#"-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully"#,
            ]
            .join("\n")
        );
        assert_eq!(
            t.filter[KUBE_NODE_PORT],
            [
                r#"-A KUBE-NODE-PORT -p tcp -m comment --comment "default/loc:http health check node port" -m tcp --dport 32000 -j ACCEPT"#
            ]
        );
        let f = &t.filter[KUBE_IPVS_FILTER];
        assert_eq!(f.len(), 4 + 3, "a RETURN per Service address and port, a REJECT per address");
        assert_eq!(
            f[4..],
            [
                "-A KUBE-IPVS-FILTER -d 10.96.0.10/32 -m conntrack --ctstate NEW -j REJECT --reject-with icmp-port-unreachable",
                "-A KUBE-IPVS-FILTER -d 10.96.0.11/32 -m conntrack --ctstate NEW -j REJECT --reject-with icmp-port-unreachable",
                "-A KUBE-IPVS-FILTER -d 198.51.100.1/32 -m conntrack --ctstate NEW -j REJECT --reject-with icmp-port-unreachable",
            ],
            "the node's own address (192.0.2.7 here) is never rejected"
        );
        assert_eq!(t.filter[KUBE_FORWARD].len(), 2);
        let chains: Vec<_> = t.nat.keys().chain(t.filter.keys()).map(String::as_str).collect();
        assert_eq!(
            chains,
            [
                "KUBE-MARK-MASQ",
                "KUBE-NODE-PORT",
                "KUBE-POSTROUTING",
                "KUBE-SERVICES",
                "KUBE-FORWARD",
                "KUBE-IPVS-FILTER",
                "KUBE-NODE-PORT"
            ]
        );
    }

    #[test]
    fn masquerade_all_and_no_cluster_cidr() {
        let all = render(&ports(), &Config { masquerade_all: true, ..Default::default() }, &[]);
        assert!(all.nat[KUBE_SERVICES][0].starts_with("-A KUBE-SERVICES -d 10.96.0.11/32 -p udp "));
        let none = render(&ports(), &Config::default(), &[]);
        // Node-originated traffic that picked a Service address as its source.
        assert!(none.nat[KUBE_SERVICES][0].starts_with("-A KUBE-SERVICES -s 10.96.0.11/32 -p udp "));
        let np = Config { nodeport_addresses: vec!["192.168.1.10".parse().unwrap()], ..Default::default() };
        assert_eq!(
            render(&ports(), &np, &[]).nat[KUBE_SERVICES].last().unwrap(),
            r#"-A KUBE-SERVICES -d 192.168.1.10/32 -m comment --comment "kubernetes service nodeports" -j KUBE-NODE-PORT"#
        );
        let empty = render::<ServicePort>(&[], &Config::default(), &[]);
        assert_eq!(empty.nat[KUBE_NODE_PORT], Vec::<String>::new());
        assert_eq!(empty.filter[KUBE_IPVS_FILTER], Vec::<String>::new());
        assert_eq!(jump_rules().len(), 6);
    }
}
