//! iptables mode: the desired `nat` and `filter` chains as data ([`render`]), and the
//! `iptables-restore --noflush` input that moves the kernel from what was applied last to
//! that ([`restore_input`]) — only changed chains are rewritten, vanished ones deleted.
//!
//! Chains and rules follow Kubernetes' iptables proxier: `KUBE-SERVICES` → `KUBE-SVC-*`
//! (random-probability load balancing) → `KUBE-SEP-*` (DNAT), `KUBE-NODEPORTS`,
//! `KUBE-EXT-*` for external destinations, `KUBE-SVL-*` for `Local` traffic policies,
//! `KUBE-MARK-MASQ` + `KUBE-POSTROUTING` for masquerading, and `REJECT`/`DROP` in the
//! filter table for services without (local) endpoints.
//!
//! `loadBalancerSourceRanges`: traffic to a load balancer IP goes through the service's
//! `KUBE-FW-*` chain (nat), which passes the allowed sources on to `KUBE-EXT-*`; whatever
//! it does not pass keeps its destination and is dropped by the `KUBE-PROXY-FIREWALL` rule
//! for that IP (filter, before anything accepts it). Health check node ports are accepted
//! in the filter table's `KUBE-NODEPORTS`, for hosts whose `INPUT` policy drops.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use crate::chains::{ext_chain, fw_chain, sep_chain, svc_chain, svl_chain};
use crate::model::{Endpoint, ServicePort};

pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// The masquerade mark bit (`--iptables-masquerade-bit` 14).
pub const MASQ_MARK: &str = "0x4000";

/// What the rules depend on besides the services.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// `--cluster-cidr`: traffic from outside it to a cluster IP is masqueraded.
    pub cluster_cidr: Option<String>,
    /// Node addresses node ports answer on (from `--nodeport-addresses`); empty = every local address.
    pub nodeport_addresses: Vec<Ipv4Addr>,
    /// `--masquerade-all`.
    pub masquerade_all: bool,
}

/// chain name → its rules (each a full `-A CHAIN …` line).
pub type Table = BTreeMap<String, Vec<String>>;

/// The desired content of the two tables kube-proxy owns chains in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    pub filter: Table,
    pub nat: Table,
}

impl Tables {
    pub fn rule_count(&self) -> usize {
        self.filter.values().chain(self.nat.values()).map(Vec::len).sum()
    }
}

/// The jump rules from the built-in chains into ours: (table, chain, rule args).
/// They are inserted once with `iptables -I` (checked with `-C`), as Kubernetes does.
pub fn jump_rules() -> Vec<(&'static str, &'static str, Vec<String>)> {
    let j = |table: &'static str, chain: &'static str, extra: &[&str], comment: &str, target: &str| {
        let mut v: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        v.extend(["-m", "comment", "--comment", comment, "-j", target].iter().map(|s| s.to_string()));
        (table, chain, v)
    };
    let new = ["-m", "conntrack", "--ctstate", "NEW"];
    vec![
        j("filter", "INPUT", &new, "kubernetes externally-visible service portals", KUBE_EXTERNAL_SERVICES),
        j("filter", "FORWARD", &new, "kubernetes externally-visible service portals", KUBE_EXTERNAL_SERVICES),
        j("filter", "INPUT", &new, "kubernetes service portals", KUBE_SERVICES),
        j("filter", "FORWARD", &new, "kubernetes service portals", KUBE_SERVICES),
        j("filter", "OUTPUT", &new, "kubernetes service portals", KUBE_SERVICES),
        j("filter", "FORWARD", &[], "kubernetes forwarding rules", KUBE_FORWARD),
        j("filter", "INPUT", &[], "kubernetes firewall for dropping marked packets", KUBE_FIREWALL),
        j("filter", "OUTPUT", &[], "kubernetes firewall for dropping marked packets", KUBE_FIREWALL),
        j("filter", "INPUT", &[], "kubernetes health check service ports", KUBE_NODEPORTS),
        // Inserted last, so first in their chains, as in Kubernetes.
        j("filter", "INPUT", &new, "kubernetes load balancer firewall", KUBE_PROXY_FIREWALL),
        j("filter", "OUTPUT", &new, "kubernetes load balancer firewall", KUBE_PROXY_FIREWALL),
        j("filter", "FORWARD", &new, "kubernetes load balancer firewall", KUBE_PROXY_FIREWALL),
        j("nat", "PREROUTING", &[], "kubernetes service portals", KUBE_SERVICES),
        j("nat", "OUTPUT", &[], "kubernetes service portals", KUBE_SERVICES),
        j("nat", "POSTROUTING", &[], "kubernetes postrouting rules", KUBE_POSTROUTING),
    ]
}

fn q(s: &str) -> String {
    format!("\"{s}\"")
}

/// The desired chains for `ports`.
pub fn render<P: std::borrow::Borrow<ServicePort>>(ports: &[P], cfg: &Config) -> Tables {
    let mut t = Tables::default();
    for c in [KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_FIREWALL, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL] {
        t.filter.insert(c.to_string(), Vec::new());
    }
    for c in [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ] {
        t.nat.insert(c.to_string(), Vec::new());
    }
    let nat = &mut t.nat;
    let filter = &mut t.filter;
    let push = |table: &mut Table, chain: &str, rule: String| {
        table.entry(chain.to_string()).or_default().push(format!("-A {chain} {rule}"));
    };

    // Fixed chains.
    push(nat, KUBE_MARK_MASQ, format!("-j MARK --or-mark {MASQ_MARK}"));
    push(nat, KUBE_POSTROUTING, format!("-m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN"));
    push(nat, KUBE_POSTROUTING, format!("-j MARK --xor-mark {MASQ_MARK}"));
    push(
        nat,
        KUBE_POSTROUTING,
        format!("-m comment --comment {} -j MASQUERADE --random-fully", q("kubernetes service traffic requiring SNAT")),
    );
    push(
        filter,
        KUBE_FORWARD,
        format!(
            "-m comment --comment {} -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT",
            q("kubernetes forwarding rules")
        ),
    );
    push(
        filter,
        KUBE_FORWARD,
        format!(
            "-m comment --comment {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            q("kubernetes forwarding conntrack rule")
        ),
    );
    push(
        filter,
        KUBE_FIREWALL,
        format!(
            "! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment {} -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
            q("block incoming localnet connections")
        ),
    );

    for sp in ports.iter().map(std::borrow::Borrow::borrow) {
        let spn = sp.name.to_string();
        let proto = sp.protocol.lower();
        let svc = svc_chain(&sp.name, sp.protocol);
        let svl = svl_chain(&sp.name, sp.protocol);
        let ext = ext_chain(&sp.name, sp.protocol);
        let fw = fw_chain(&sp.name, sp.protocol);
        let has_internal = !sp.cluster_endpoints.is_empty();
        let has_external = !sp.external_endpoints.is_empty();
        let internal_chain = if sp.internal_policy_local { &svl } else { &svc };
        // Kubernetes uses the cluster chain when either policy is Cluster, the local one when either is Local.
        let uses_cluster_chain = !sp.internal_policy_local || (sp.has_external() && !sp.external_policy_local);
        let uses_local_chain = sp.internal_policy_local || (sp.has_external() && sp.external_policy_local);
        let match_cip = format!("-m {proto} -p {proto} -d {}/32 --dport {}", sp.cluster_ip, sp.port);

        // Cluster IP.
        if has_internal {
            push(
                nat,
                KUBE_SERVICES,
                format!("-m comment --comment {} {match_cip} -j {internal_chain}", q(&format!("{spn} cluster IP"))),
            );
        } else {
            let (comment, target) = no_endpoints(sp, sp.internal_policy_local);
            push(
                filter,
                KUBE_SERVICES,
                format!("-m comment --comment {} {match_cip} -j {target}", q(&format!("{spn} {comment}"))),
            );
        }

        // External destinations.
        if sp.has_external() {
            // Load balancer IPs behind source ranges go through the firewall chain.
            let uses_fw = has_external && sp.uses_firewall();
            let lb_target = if uses_fw { &fw } else { &ext };
            let dests: Vec<(String, &str, &String)> = sp
                .external_ips
                .iter()
                .map(|ip| (format!("{ip}/32"), "external IP", &ext))
                .chain(sp.load_balancer_ips.iter().map(|ip| (format!("{ip}/32"), "loadbalancer IP", lb_target)))
                .collect();
            if has_external {
                for (ip, what, target) in &dests {
                    push(
                        nat,
                        KUBE_SERVICES,
                        format!(
                            "-m comment --comment {} -m {proto} -p {proto} -d {ip} --dport {} -j {target}",
                            q(&format!("{spn} {what}")),
                            sp.port
                        ),
                    );
                }
                if uses_fw {
                    let comment = q(&format!("{spn} loadbalancer IP"));
                    for src in sp.firewall_sources() {
                        push(nat, &fw, format!("-m comment --comment {comment} -s {src} -j {ext}"));
                    }
                    // What the chain did not pass on keeps its destination: the filter drops it.
                    let dropped = q(&format!("other traffic to {spn} will be dropped by {KUBE_PROXY_FIREWALL}"));
                    push(nat, &fw, format!("-m comment --comment {dropped}"));
                    for ip in &sp.load_balancer_ips {
                        push(
                            filter,
                            KUBE_PROXY_FIREWALL,
                            format!(
                                "-m comment --comment {} -m {proto} -p {proto} -d {ip}/32 --dport {} -j DROP",
                                q(&format!("{spn} traffic not accepted by {fw}")),
                                sp.port
                            ),
                        );
                    }
                }
                if let Some(np) = sp.node_port {
                    push(
                        nat,
                        KUBE_NODEPORTS,
                        format!("-m comment --comment {} -m {proto} -p {proto} --dport {np} -j {ext}", q(&spn)),
                    );
                }
                // KUBE-EXT-*: masquerade (Cluster) or keep the client's source (Local).
                if sp.external_policy_local {
                    // Pods and the node itself reach external destinations like cluster traffic.
                    let cluster_target = if uses_cluster_chain { &svc } else { &svl };
                    if let Some(cidr) = &cfg.cluster_cidr {
                        push(
                            nat,
                            &ext,
                            format!(
                                "-s {cidr} -m comment --comment {} -j {cluster_target}",
                                q(&format!("pod traffic for {spn} external destinations"))
                            ),
                        );
                    }
                    push(
                        nat,
                        &ext,
                        format!(
                            "-m comment --comment {} -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}",
                            q(&format!("masquerade LOCAL traffic for {spn} external destinations"))
                        ),
                    );
                    push(
                        nat,
                        &ext,
                        format!(
                            "-m comment --comment {} -m addrtype --src-type LOCAL -j {cluster_target}",
                            q(&format!("route LOCAL traffic for {spn} external destinations"))
                        ),
                    );
                    push(nat, &ext, format!("-j {svl}"));
                } else {
                    push(
                        nat,
                        &ext,
                        format!(
                            "-m comment --comment {} -j {KUBE_MARK_MASQ}",
                            q(&format!("masquerade traffic for {spn} external destinations"))
                        ),
                    );
                    push(nat, &ext, format!("-j {svc}"));
                }
            } else {
                let (comment, target) = no_endpoints(sp, sp.external_policy_local);
                for (ip, _, _) in &dests {
                    push(
                        filter,
                        KUBE_EXTERNAL_SERVICES,
                        format!(
                            "-m comment --comment {} -m {proto} -p {proto} -d {ip} --dport {} -j {target}",
                            q(&format!("{spn} {comment}")),
                            sp.port
                        ),
                    );
                }
                if let Some(np) = sp.node_port {
                    push(
                        filter,
                        KUBE_EXTERNAL_SERVICES,
                        format!("-m comment --comment {} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j {target}", q(&format!("{spn} {comment}"))),
                    );
                }
            }
        }

        // Health check node ports are answered by kubeproxy itself, with or without endpoints.
        if let Some(hc) = sp.health_check_node_port {
            push(
                filter,
                KUBE_NODEPORTS,
                format!(
                    "-m comment --comment {} -m tcp -p tcp --dport {hc} -j ACCEPT",
                    q(&format!("{spn} health check node port"))
                ),
            );
        }

        // KUBE-SVC-* (all usable endpoints) and KUBE-SVL-* (local ones).
        let cluster_eps = crate::model::usable(&sp.all_endpoints, |_| true);
        let local_eps = crate::model::usable(&sp.all_endpoints, |e| e.local);
        if uses_cluster_chain && !cluster_eps.is_empty() {
            let rules = nat.entry(svc.clone()).or_default();
            let mut r = Vec::new();
            if cfg.masquerade_all {
                r.push(format!(
                    "-m comment --comment {} {match_cip} -j {KUBE_MARK_MASQ}",
                    q(&format!("{spn} cluster IP"))
                ));
            } else if let Some(cidr) = &cfg.cluster_cidr {
                r.push(format!(
                    "-m comment --comment {} {match_cip} ! -s {cidr} -j {KUBE_MARK_MASQ}",
                    q(&format!("{spn} cluster IP"))
                ));
            }
            r.extend(lb_rules(sp, &spn, &cluster_eps));
            rules.extend(r.into_iter().map(|x| format!("-A {svc} {x}")));
        }
        if uses_local_chain && !local_eps.is_empty() {
            let rules = nat.entry(svl.clone()).or_default();
            rules.extend(lb_rules(sp, &spn, &local_eps).into_iter().map(|x| format!("-A {svl} {x}")));
        }
        // KUBE-SEP-*: one per endpoint used by either chain.
        let mut seps: BTreeSet<&Endpoint> = BTreeSet::new();
        if uses_cluster_chain {
            seps.extend(cluster_eps.iter());
        }
        if uses_local_chain {
            seps.extend(local_eps.iter());
        }
        for ep in seps {
            let sep = sep_chain(&sp.name, sp.protocol, ep);
            let mut r = vec![format!("-m comment --comment {} -s {}/32 -j {KUBE_MARK_MASQ}", q(&spn), ep.ip)];
            let affinity =
                if sp.affinity_timeout.is_some() { format!(" -m recent --name {sep} --set") } else { String::new() };
            r.push(format!(
                "-m comment --comment {} -m {proto} -p {proto}{affinity} -j DNAT --to-destination {}",
                q(&spn),
                ep.addr()
            ));
            nat.insert(sep.clone(), r.into_iter().map(|x| format!("-A {sep} {x}")).collect());
        }
    }

    // Node ports: must be the last rule of KUBE-SERVICES.
    let comment = q("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
    if cfg.nodeport_addresses.is_empty() {
        push(
            nat,
            KUBE_SERVICES,
            format!("-m comment --comment {comment} -m addrtype --dst-type LOCAL -j {KUBE_NODEPORTS}"),
        );
    } else {
        for ip in &cfg.nodeport_addresses {
            push(nat, KUBE_SERVICES, format!("-m comment --comment {comment} -d {ip}/32 -j {KUBE_NODEPORTS}"));
        }
    }
    t
}

/// What to do with traffic for a service port without usable endpoints: `REJECT` when it
/// has none at all, `DROP` when only local ones are missing (as Kubernetes).
fn no_endpoints(sp: &ServicePort, policy_local: bool) -> (&'static str, &'static str) {
    if policy_local && sp.has_any_endpoint {
        ("has no local endpoints", "DROP")
    } else {
        ("has no endpoints", "REJECT")
    }
}

/// Rules of a `KUBE-SVC-*`/`KUBE-SVL-*` chain: affinity checks, then one
/// `statistic --mode random` rule per endpoint with probability 1/(n-i).
fn lb_rules(sp: &ServicePort, spn: &str, eps: &[Endpoint]) -> Vec<String> {
    let proto = sp.protocol.lower();
    let mut r = Vec::new();
    if let Some(timeout) = sp.affinity_timeout {
        for ep in eps {
            let sep = sep_chain(&sp.name, sp.protocol, ep);
            r.push(format!(
                "-m comment --comment {} -m recent --name {sep} --rcheck --seconds {timeout} --reap -j {sep}",
                q(&format!("{spn} -> {}", ep.addr()))
            ));
        }
    }
    let n = eps.len();
    for (i, ep) in eps.iter().enumerate() {
        let sep = sep_chain(&sp.name, sp.protocol, ep);
        let comment = q(&format!("{spn} -> {}", ep.addr()));
        if i + 1 < n {
            let p = 1.0 / (n - i) as f64;
            r.push(format!("-m comment --comment {comment} -m statistic --mode random --probability {p:.10} -j {sep}"));
        } else {
            r.push(format!("-m comment --comment {comment} -j {sep}"));
        }
    }
    let _ = proto;
    r
}

/// The `iptables-restore --noflush` input that turns `applied` into `desired`: changed and
/// new chains are declared (which flushes them) and refilled, vanished ones flushed and
/// deleted. `None` when nothing changed.
pub fn restore_input(applied: &Tables, desired: &Tables) -> Option<String> {
    let mut out = String::new();
    let mut changed = false;
    for (name, old, new) in [("filter", &applied.filter, &desired.filter), ("nat", &applied.nat, &desired.nat)] {
        let mut decl = String::new();
        let mut rules = String::new();
        let mut deletes = String::new();
        for (chain, r) in new {
            if old.get(chain) != Some(r) {
                let _ = writeln!(decl, ":{chain} - [0:0]");
                for rule in r {
                    let _ = writeln!(rules, "{rule}");
                }
            }
        }
        for chain in old.keys() {
            if !new.contains_key(chain) {
                let _ = writeln!(decl, ":{chain} - [0:0]");
                let _ = writeln!(deletes, "-X {chain}");
            }
        }
        if decl.is_empty() {
            continue;
        }
        changed = true;
        let _ = write!(out, "*{name}\n{decl}{rules}{deletes}COMMIT\n");
    }
    changed.then_some(out)
}

/// The chains kube-proxy owns, found in `iptables-save` output of one table:
/// every chain whose name starts with `KUBE-`.
pub fn owned_chains(save_output: &str) -> BTreeSet<String> {
    save_output
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| c.starts_with("KUBE-"))
        .map(str::to_string)
        .collect()
}

/// The restore input that removes every chain in `filter`/`nat` (for `--cleanup`).
pub fn cleanup_input(filter: &BTreeSet<String>, nat: &BTreeSet<String>) -> String {
    let mut applied = Tables::default();
    for c in filter {
        applied.filter.insert(c.clone(), vec!["?".into()]);
    }
    for c in nat {
        applied.nat.insert(c.clone(), vec!["?".into()]);
    }
    restore_input(&applied, &Tables::default()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{simple_service, simple_slice, slice, svc};
    use crate::model::{service_ports, NodeInfo};
    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;

    fn node() -> NodeInfo {
        NodeInfo::named("node-a")
    }
    fn cfg() -> Config {
        Config { cluster_cidr: Some("10.244.0.0/16".into()), ..Default::default() }
    }
    fn rules_of<'a>(t: &'a Table, prefix: &str) -> Vec<&'a String> {
        t.iter().filter(|(c, _)| c.starts_with(prefix)).flat_map(|(_, r)| r).collect()
    }

    #[test]
    fn cluster_ip_with_three_endpoints_balances_randomly() {
        let ports = service_ports(
            &[simple_service("web", "10.96.0.10", 80)],
            &[simple_slice("web", &["10.244.1.1", "10.244.1.2", "10.244.1.3"], 8080)],
            &node(),
        );
        let t = render(&ports, &cfg());
        let svc = svc_chain(&ports[0].name, ports[0].protocol);
        let services = &t.nat[KUBE_SERVICES];
        assert!(services[0].contains("-d 10.96.0.10/32 --dport 80") && services[0].ends_with(&format!("-j {svc}")));
        assert!(services.last().unwrap().contains("--dst-type LOCAL -j KUBE-NODEPORTS"));
        let svc_rules = &t.nat[&svc];
        assert_eq!(svc_rules.len(), 4);
        assert!(svc_rules[0].contains("! -s 10.244.0.0/16 -j KUBE-MARK-MASQ"));
        assert!(svc_rules[1].contains("--probability 0.3333333333"));
        assert!(svc_rules[2].contains("--probability 0.5000000000"));
        assert!(!svc_rules[3].contains("statistic"));
        let seps = rules_of(&t.nat, "KUBE-SEP-");
        assert_eq!(seps.len(), 6);
        assert!(seps.iter().any(|r| r.contains("-j DNAT --to-destination 10.244.1.2:8080")));
        assert!(seps.iter().any(|r| r.contains("-s 10.244.1.2/32 -j KUBE-MARK-MASQ")), "hairpin masquerade");
        assert!(t.filter[KUBE_SERVICES].is_empty());
    }

    #[test]
    fn service_without_endpoints_is_rejected() {
        let ports = service_ports(&[simple_service("web", "10.96.0.10", 80)], &[], &node());
        let t = render(&ports, &cfg());
        assert_eq!(t.filter[KUBE_SERVICES].len(), 1);
        let r = &t.filter[KUBE_SERVICES][0];
        assert!(r.contains("has no endpoints") && r.contains("-d 10.96.0.10/32 --dport 80 -j REJECT"), "{r}");
        assert_eq!(t.nat[KUBE_SERVICES].len(), 1, "only the nodeports rule");
        assert!(rules_of(&t.nat, "KUBE-SVC-").is_empty());
    }

    #[test]
    fn node_port_goes_through_ext_chain_with_masquerade() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.10",
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}));
        let ports = service_ports(&[s], &[simple_slice("web", &["10.244.1.1"], 8080)], &node());
        let t = render(&ports, &cfg());
        let ext = ext_chain(&ports[0].name, ports[0].protocol);
        let svc = svc_chain(&ports[0].name, ports[0].protocol);
        assert_eq!(t.nat[KUBE_NODEPORTS].len(), 1);
        assert!(t.nat[KUBE_NODEPORTS][0].contains(&format!("--dport 30080 -j {ext}")));
        assert_eq!(t.nat[&ext], [format!("-A {ext} -m comment --comment \"masquerade traffic for default/web:http external destinations\" -j KUBE-MARK-MASQ"), format!("-A {ext} -j {svc}")]);
    }

    #[test]
    fn node_port_without_endpoints_is_rejected_in_external_services() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "externalIPs": ["192.0.2.5"],
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}));
        let t = render(&service_ports(&[s], &[], &node()), &cfg());
        let ext = &t.filter[KUBE_EXTERNAL_SERVICES];
        assert_eq!(ext.len(), 2);
        assert!(ext[0].contains("-d 192.0.2.5/32 --dport 80 -j REJECT"));
        assert!(ext[1].contains("--dst-type LOCAL -m tcp -p tcp --dport 30080 -j REJECT"));
        assert!(t.nat[KUBE_NODEPORTS].is_empty());
    }

    #[test]
    fn external_and_load_balancer_ips_jump_to_ext_chain() {
        let s = svc(json!({"metadata": {"name": "lb", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.20", "externalIPs": ["192.0.2.1"],
                     "ports": [{"name": "http", "port": 80, "nodePort": 30081}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}}));
        let ports = service_ports(&[s], &[simple_slice("lb", &["10.244.1.1"], 80)], &node());
        let t = render(&ports, &cfg());
        let ext = ext_chain(&ports[0].name, ports[0].protocol);
        let services = &t.nat[KUBE_SERVICES];
        assert!(services
            .iter()
            .any(|r| r.contains("external IP") && r.contains("-d 192.0.2.1/32 --dport 80") && r.ends_with(&ext)));
        assert!(services
            .iter()
            .any(|r| r.contains("loadbalancer IP") && r.contains("-d 198.51.100.7/32") && r.ends_with(&ext)));
    }

    fn firewalled_lb(ranges: serde_json::Value) -> Service {
        svc(json!({"metadata": {"name": "lb", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.20", "externalIPs": ["192.0.2.1"],
                     "loadBalancerSourceRanges": ranges,
                     "ports": [{"name": "http", "port": 80, "nodePort": 30081}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}}))
    }

    #[test]
    fn source_ranges_send_load_balancer_traffic_through_the_firewall_chain() {
        let node = NodeInfo { name: "node-a".into(), ip: Some("192.168.1.10".parse().unwrap()) };
        let s = firewalled_lb(json!(["203.0.113.0/24", "192.168.0.0/16"]));
        let ports = service_ports(&[s], &[simple_slice("lb", &["10.244.1.1"], 80)], &node);
        let t = render(&ports, &cfg());
        let (fw, ext) = (fw_chain(&ports[0].name, ports[0].protocol), ext_chain(&ports[0].name, ports[0].protocol));
        let services = &t.nat[KUBE_SERVICES];
        assert!(services
            .iter()
            .any(|r| r.contains("-d 198.51.100.7/32 --dport 80") && r.ends_with(&format!("-j {fw}"))));
        assert!(
            services.iter().any(|r| r.contains("-d 192.0.2.1/32 --dport 80") && r.ends_with(&format!("-j {ext}"))),
            "external IPs are not filtered"
        );
        assert!(t.nat[KUBE_NODEPORTS][0].ends_with(&format!("-j {ext}")), "nor node ports");
        let passed =
            |src: &str| format!("-A {fw} -m comment --comment \"default/lb:http loadbalancer IP\" -s {src} -j {ext}");
        assert_eq!(
            t.nat[&fw],
            [
                passed("203.0.113.0/24"),
                passed("192.168.0.0/16"),
                passed("198.51.100.7/32"),
                format!("-A {fw} -m comment --comment \"other traffic to default/lb:http will be dropped by KUBE-PROXY-FIREWALL\""),
            ],
            "a range holds the node's IP: the load balancer IP itself is let through too"
        );
        assert_eq!(
            t.filter[KUBE_PROXY_FIREWALL],
            [format!("-A KUBE-PROXY-FIREWALL -m comment --comment \"default/lb:http traffic not accepted by {fw}\" -m tcp -p tcp -d 198.51.100.7/32 --dport 80 -j DROP")]
        );

        // A range without the node: only the ranges pass. No ranges: no firewall at all.
        let s = firewalled_lb(json!(["203.0.113.0/24"]));
        let t = render(&service_ports(&[s], &[simple_slice("lb", &["10.244.1.1"], 80)], &node), &cfg());
        assert_eq!(t.nat[&fw].len(), 2);
        let s = firewalled_lb(json!([]));
        let t = render(&service_ports(&[s], &[simple_slice("lb", &["10.244.1.1"], 80)], &node), &cfg());
        assert!(!t.nat.contains_key(&fw) && t.filter[KUBE_PROXY_FIREWALL].is_empty());
        assert!(t.nat[KUBE_SERVICES]
            .iter()
            .any(|r| r.contains("-d 198.51.100.7/32") && r.ends_with(&format!("-j {ext}"))));
    }

    #[test]
    fn local_load_balancer_ips_keep_the_source_and_health_check_ports_are_accepted() {
        let s = svc(json!({"metadata": {"name": "lb", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.20", "externalTrafficPolicy": "Local",
                     "healthCheckNodePort": 32000, "ports": [{"name": "http", "port": 80, "nodePort": 30081}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}}));
        let sl = slice(json!({"metadata": {"name": "lb-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "lb"}}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.1.1"], "nodeName": "node-a"}, {"addresses": ["10.244.2.1"], "nodeName": "node-b"}],
            "ports": [{"name": "http", "port": 80}]}));
        let ports = service_ports(std::slice::from_ref(&s), std::slice::from_ref(&sl), &node());
        let t = render(&ports, &cfg());
        let (ext, svl) = (ext_chain(&ports[0].name, ports[0].protocol), svl_chain(&ports[0].name, ports[0].protocol));
        assert!(t.nat[KUBE_SERVICES]
            .iter()
            .any(|r| r.contains("-d 198.51.100.7/32") && r.ends_with(&format!("-j {ext}"))));
        assert!(
            !t.nat[&ext].iter().any(|r| r.ends_with(KUBE_MARK_MASQ) && !r.contains("LOCAL")),
            "no masquerade: the source is kept"
        );
        assert!(t.nat[&ext].last().unwrap().ends_with(&format!("-j {svl}")));
        assert_eq!(t.nat[&svl].len(), 1, "only the local endpoint");
        let accept = "-A KUBE-NODEPORTS -m comment --comment \"default/lb:http health check node port\" -m tcp -p tcp --dport 32000 -j ACCEPT";
        assert_eq!(t.filter[KUBE_NODEPORTS], [accept]);

        // No local endpoint: load balancer traffic is dropped, the health check still answered.
        let t = render(&service_ports(&[s], &[sl], &NodeInfo::named("node-z")), &cfg());
        assert!(t.filter[KUBE_EXTERNAL_SERVICES]
            .iter()
            .any(|r| r.contains("has no local endpoints") && r.contains("-d 198.51.100.7/32 --dport 80 -j DROP")));
        assert_eq!(t.filter[KUBE_NODEPORTS], [accept]);
    }

    #[test]
    fn udp_service_uses_udp_matches() {
        let s = svc(json!({"metadata": {"name": "dns", "namespace": "kube-system"},
            "spec": {"clusterIP": "10.96.0.53", "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}));
        let sl = slice(json!({"metadata": {"name": "dns-1", "namespace": "kube-system",
                "labels": {"kubernetes.io/service-name": "dns"}}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.9"]}], "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}));
        let t = render(&service_ports(&[s], &[sl], &node()), &cfg());
        assert!(t.nat[KUBE_SERVICES][0].contains("-m udp -p udp -d 10.96.0.53/32 --dport 53"));
        assert!(rules_of(&t.nat, "KUBE-SEP-")
            .iter()
            .any(|r| r.contains("-m udp -p udp -j DNAT --to-destination 10.244.0.9:53")));
    }

    #[test]
    fn session_affinity_uses_recent_module() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.10", "sessionAffinity": "ClientIP",
                     "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
                     "ports": [{"name": "http", "port": 80}]}}));
        let ports = service_ports(&[s], &[simple_slice("web", &["10.244.1.1", "10.244.1.2"], 80)], &node());
        let t = render(&ports, &cfg());
        let svc = &t.nat[&svc_chain(&ports[0].name, ports[0].protocol)];
        assert_eq!(svc.iter().filter(|r| r.contains("--rcheck --seconds 600 --reap")).count(), 2);
        assert_eq!(
            rules_of(&t.nat, "KUBE-SEP-")
                .iter()
                .filter(|r| r.contains("-m recent --name KUBE-SEP-") && r.contains("--set -j DNAT"))
                .count(),
            2
        );
    }

    #[test]
    fn internal_traffic_policy_local_uses_svl_and_drops_without_local_endpoints() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.10", "internalTrafficPolicy": "Local",
                     "ports": [{"name": "http", "port": 80}]}}));
        let sl = slice(json!({"metadata": {"name": "web-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"}}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.1.1"], "nodeName": "node-a"}, {"addresses": ["10.244.2.1"], "nodeName": "node-b"}],
            "ports": [{"name": "http", "port": 80}]}));
        let ports = service_ports(std::slice::from_ref(&s), std::slice::from_ref(&sl), &node());
        let t = render(&ports, &cfg());
        let svl = svl_chain(&ports[0].name, ports[0].protocol);
        assert!(t.nat[KUBE_SERVICES][0].ends_with(&svl));
        assert_eq!(t.nat[&svl].len(), 1);
        assert!(rules_of(&t.nat, "KUBE-SVC-").is_empty());
        assert_eq!(rules_of(&t.nat, "KUBE-SEP-").len(), 2, "only the local endpoint's chain");

        let t = render(&service_ports(&[s], &[sl], &NodeInfo::named("node-z")), &cfg());
        assert!(
            t.filter[KUBE_SERVICES][0].contains("has no local endpoints")
                && t.filter[KUBE_SERVICES][0].ends_with("-j DROP")
        );
    }

    #[test]
    fn external_traffic_policy_local_keeps_source_and_uses_local_endpoints() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "externalTrafficPolicy": "Local",
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}));
        let sl = slice(json!({"metadata": {"name": "web-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"}}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.1.1"], "nodeName": "node-a"}, {"addresses": ["10.244.2.1"], "nodeName": "node-b"}],
            "ports": [{"name": "http", "port": 80}]}));
        let ports = service_ports(&[s], &[sl], &node());
        let t = render(&ports, &cfg());
        let ext = &t.nat[&ext_chain(&ports[0].name, ports[0].protocol)];
        let svl = svl_chain(&ports[0].name, ports[0].protocol);
        assert!(ext[0].contains("-s 10.244.0.0/16"));
        assert!(ext.last().unwrap().ends_with(&format!("-j {svl}")));
        assert_eq!(t.nat[&svl].len(), 1);
        assert_eq!(t.nat[&svc_chain(&ports[0].name, ports[0].protocol)].len(), 3, "masq + 2 endpoints");
    }

    #[test]
    fn nodeport_addresses_restrict_the_nodeports_jump() {
        let c = Config { nodeport_addresses: vec!["192.168.1.10".parse().unwrap()], ..cfg() };
        let t = render::<ServicePort>(&[], &c);
        assert_eq!(t.nat[KUBE_SERVICES].len(), 1);
        assert!(t.nat[KUBE_SERVICES][0].contains("-d 192.168.1.10/32 -j KUBE-NODEPORTS"));
    }

    #[test]
    fn restore_input_rewrites_only_changed_chains_and_deletes_stale_ones() {
        let svcs = [simple_service("a", "10.96.0.1", 80), simple_service("b", "10.96.0.2", 80)];
        let first = render(
            &service_ports(
                &svcs,
                &[simple_slice("a", &["10.0.0.1"], 80), simple_slice("b", &["10.0.0.2"], 80)],
                &node(),
            ),
            &cfg(),
        );
        let full = restore_input(&Tables::default(), &first).unwrap();
        assert!(full.starts_with("*filter\n") && full.contains("*nat\n") && full.ends_with("COMMIT\n"));
        assert!(restore_input(&first, &first).is_none(), "no change, no restore");

        // b's endpoint changes: b's SVC and SEP chains change, a's stay.
        let second = render(
            &service_ports(
                &svcs,
                &[simple_slice("a", &["10.0.0.1"], 80), simple_slice("b", &["10.0.0.3"], 80)],
                &node(),
            ),
            &cfg(),
        );
        let input = restore_input(&first, &second).unwrap();
        let ports = service_ports(&svcs, &[], &node());
        let a_svc = svc_chain(&ports[0].name, ports[0].protocol);
        let b_svc = svc_chain(&ports[1].name, ports[1].protocol);
        assert!(!input.contains(&a_svc), "{input}");
        assert!(input.contains(&format!(":{b_svc} - [0:0]")));
        assert!(!input.contains("*filter"), "filter unchanged");
        let old_sep = first.nat.keys().find(|c| c.starts_with("KUBE-SEP-") && !second.nat.contains_key(*c)).unwrap();
        assert!(input.contains(&format!("-X {old_sep}\n")));
        // Deletions come after the rules that used to reference them are replaced.
        assert!(input.find(&format!("-X {old_sep}")).unwrap() > input.find(&format!("-A {b_svc}")).unwrap());
    }

    #[test]
    fn owned_chains_and_cleanup() {
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:DOCKER - [0:0]\n:KUBE-SVC-ABC - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n";
        let owned = owned_chains(save);
        assert_eq!(owned.into_iter().collect::<Vec<_>>(), ["KUBE-SERVICES", "KUBE-SVC-ABC"]);
        let input = cleanup_input(&BTreeSet::new(), &owned_chains(save));
        assert_eq!(
            input,
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABC - [0:0]\n-X KUBE-SERVICES\n-X KUBE-SVC-ABC\nCOMMIT\n"
        );
    }
}
