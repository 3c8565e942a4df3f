//! iptables mode: the desired `nat` and `filter` chains as data, one service port's share at
//! a time ([`render_port`]: its own chains and its rules in the shared ones), and [`Table`],
//! which keeps those shares as programmed and turns each sync into the `iptables-restore
//! --noflush` input of only what changed: the changed ports' own chains, a shared chain only
//! when some port's rules in it changed, vanished chains deleted (kube-proxy's partial syncs).
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
use std::sync::Arc;

use crate::model::{Endpoint, ServicePort};
use crate::programmed::{PortId, Ports};

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
pub type Chains = BTreeMap<String, Vec<String>>;

/// The desired content of the two tables kube-proxy owns chains in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    pub filter: Chains,
    pub nat: Chains,
}

impl Tables {
    pub fn rule_count(&self) -> usize {
        self.filter.values().chain(self.nat.values()).map(Vec::len).sum()
    }

    fn table_mut(&mut self, table: &str) -> &mut Chains {
        if table == FILTER {
            &mut self.filter
        } else {
            &mut self.nat
        }
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

const NAT: &str = "nat";
const FILTER: &str = "filter";

/// The chains every service port adds rules to; all other chains of a service port are its
/// own (`KUBE-SVC/SVL/EXT/FW/SEP-*`, all in `nat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shared {
    FilterServices,
    FilterExternalServices,
    FilterNodePorts,
    FilterProxyFirewall,
    NatServices,
    NatNodePorts,
}

impl Shared {
    pub const ALL: [Shared; 6] = [
        Shared::FilterServices,
        Shared::FilterExternalServices,
        Shared::FilterNodePorts,
        Shared::FilterProxyFirewall,
        Shared::NatServices,
        Shared::NatNodePorts,
    ];

    /// (table, chain).
    pub fn name(self) -> (&'static str, &'static str) {
        match self {
            Shared::FilterServices => (FILTER, KUBE_SERVICES),
            Shared::FilterExternalServices => (FILTER, KUBE_EXTERNAL_SERVICES),
            Shared::FilterNodePorts => (FILTER, KUBE_NODEPORTS),
            Shared::FilterProxyFirewall => (FILTER, KUBE_PROXY_FIREWALL),
            Shared::NatServices => (NAT, KUBE_SERVICES),
            Shared::NatNodePorts => (NAT, KUBE_NODEPORTS),
        }
    }

    fn of(table: &str, chain: &str) -> Option<Shared> {
        Shared::ALL.into_iter().find(|s| s.name() == (table, chain))
    }

    /// The rules after every port's: the jump to the node ports, which must be the last rule
    /// of `KUBE-SERVICES`.
    fn tail(self, cfg: &Config) -> Vec<String> {
        if self != Shared::NatServices {
            return Vec::new();
        }
        let comment = q("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
        if cfg.nodeport_addresses.is_empty() {
            vec![format!(
                "-A {KUBE_SERVICES} -m comment --comment {comment} -m addrtype --dst-type LOCAL -j {KUBE_NODEPORTS}"
            )]
        } else {
            cfg.nodeport_addresses
                .iter()
                .map(|ip| format!("-A {KUBE_SERVICES} -m comment --comment {comment} -d {ip}/32 -j {KUBE_NODEPORTS}"))
                .collect()
        }
    }
}

/// One service port's share of the tables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortRules {
    /// Its own chains, all in `nat`: chain → rules.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Its rules in the shared chains.
    pub shared: BTreeMap<Shared, Vec<String>>,
}

impl PortRules {
    fn push(&mut self, table: &'static str, chain: &str, rule: String) {
        let line = format!("-A {chain} {rule}");
        match Shared::of(table, chain) {
            Some(s) => self.shared.entry(s).or_default().push(line),
            None => {
                debug_assert_eq!(table, NAT, "a service port's own chains are in nat");
                self.chains.entry(chain.to_string()).or_default().push(line)
            }
        }
    }

    fn rule_count(&self) -> usize {
        self.chains.values().chain(self.shared.values()).map(Vec::len).sum()
    }
}

/// The chains whose rules do not depend on the services, and every shared chain (empty).
fn fixed() -> Tables {
    let mut t = Tables::default();
    for s in Shared::ALL {
        let (table, chain) = s.name();
        t.table_mut(table).insert(chain.to_string(), Vec::new());
    }
    let push = |table: &mut Chains, chain: &str, rule: String| {
        table.entry(chain.to_string()).or_default().push(format!("-A {chain} {rule}"));
    };
    let (nat, filter) = (&mut t.nat, &mut t.filter);
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
    t
}

/// The desired chains for `ports` (as a first [`Table::sync`] writes them).
pub fn render<P: std::borrow::Borrow<ServicePort>>(ports: &[P], cfg: &Config) -> Tables {
    let mut parts: BTreeMap<&PortId, PortRules> = BTreeMap::new();
    for sp in ports.iter().map(std::borrow::Borrow::borrow) {
        parts.entry(&sp.name).or_insert_with(|| render_port(sp, cfg));
    }
    assemble(parts.values(), cfg)
}

/// The whole tables from the ports' shares, in the order given.
fn assemble<'a>(parts: impl Iterator<Item = &'a PortRules> + Clone, cfg: &Config) -> Tables {
    let mut t = fixed();
    for part in parts.clone() {
        t.nat.extend(part.chains.iter().map(|(c, r)| (c.clone(), r.clone())));
    }
    for s in Shared::ALL {
        let (table, chain) = s.name();
        let rules = shared_chain(s, parts.clone(), cfg);
        t.table_mut(table).insert(chain.to_string(), rules);
    }
    t
}

/// A shared chain's rules: every port's, in the order given, then its tail.
fn shared_chain<'a>(s: Shared, parts: impl Iterator<Item = &'a PortRules>, cfg: &Config) -> Vec<String> {
    let mut rules: Vec<String> = parts.filter_map(|p| p.shared.get(&s)).flatten().cloned().collect();
    rules.extend(s.tail(cfg));
    rules
}

/// One service port's chains and its rules in the shared chains.
pub fn render_port(sp: &ServicePort, cfg: &Config) -> PortRules {
    let mut part = PortRules::default();
    let spn = sp.name.to_string();
    let proto = sp.protocol.lower();
    let svc = svc_chain(&sp.name, sp.protocol);
    let svl = svl_chain(&sp.name, sp.protocol);
    let ext = ext_chain(&sp.name, sp.protocol);
    let fw = fw_chain(&sp.name, sp.protocol);
    let has_internal = !sp.cluster_endpoints.is_empty();
    let has_external = !sp.external_endpoints.is_empty();
    let internal_chain = if sp.internal_policy_local { &svl } else { &svc };
    let chains = sp.chain_endpoints();
    let match_cip = format!("-m {proto} -p {proto} -d {}/32 --dport {}", sp.cluster_ip, sp.port);

    // Cluster IP.
    if has_internal {
        part.push(
            NAT,
            KUBE_SERVICES,
            format!("-m comment --comment {} {match_cip} -j {internal_chain}", q(&format!("{spn} cluster IP"))),
        );
    } else {
        let (comment, target) = no_endpoints(sp, sp.internal_policy_local);
        part.push(
            FILTER,
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
                part.push(
                    NAT,
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
                    part.push(NAT, &fw, format!("-m comment --comment {comment} -s {src} -j {ext}"));
                }
                // What the chain did not pass on keeps its destination: the filter drops it.
                let dropped = q(&format!("other traffic to {spn} will be dropped by {KUBE_PROXY_FIREWALL}"));
                part.push(NAT, &fw, format!("-m comment --comment {dropped}"));
                for ip in &sp.load_balancer_ips {
                    part.push(
                        FILTER,
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
                part.push(
                    NAT,
                    KUBE_NODEPORTS,
                    format!("-m comment --comment {} -m {proto} -p {proto} --dport {np} -j {ext}", q(&spn)),
                );
            }
            // KUBE-EXT-*: masquerade (Cluster) or keep the client's source (Local).
            if sp.external_policy_local {
                // Pods and the node itself reach external destinations like cluster traffic.
                let cluster_target = if chains.cluster.is_some() { &svc } else { &svl };
                if let Some(cidr) = &cfg.cluster_cidr {
                    part.push(
                        NAT,
                        &ext,
                        format!(
                            "-s {cidr} -m comment --comment {} -j {cluster_target}",
                            q(&format!("pod traffic for {spn} external destinations"))
                        ),
                    );
                }
                part.push(
                    NAT,
                    &ext,
                    format!(
                        "-m comment --comment {} -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}",
                        q(&format!("masquerade LOCAL traffic for {spn} external destinations"))
                    ),
                );
                part.push(
                    NAT,
                    &ext,
                    format!(
                        "-m comment --comment {} -m addrtype --src-type LOCAL -j {cluster_target}",
                        q(&format!("route LOCAL traffic for {spn} external destinations"))
                    ),
                );
                part.push(NAT, &ext, format!("-j {svl}"));
            } else {
                part.push(
                    NAT,
                    &ext,
                    format!(
                        "-m comment --comment {} -j {KUBE_MARK_MASQ}",
                        q(&format!("masquerade traffic for {spn} external destinations"))
                    ),
                );
                part.push(NAT, &ext, format!("-j {svc}"));
            }
        } else {
            let (comment, target) = no_endpoints(sp, sp.external_policy_local);
            for (ip, _, _) in &dests {
                part.push(
                    FILTER,
                    KUBE_EXTERNAL_SERVICES,
                    format!(
                        "-m comment --comment {} -m {proto} -p {proto} -d {ip} --dport {} -j {target}",
                        q(&format!("{spn} {comment}")),
                        sp.port
                    ),
                );
            }
            if let Some(np) = sp.node_port {
                part.push(
                    FILTER,
                    KUBE_EXTERNAL_SERVICES,
                    format!("-m comment --comment {} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {np} -j {target}", q(&format!("{spn} {comment}"))),
                );
            }
        }
    }

    // Health check node ports are answered by kubeproxy itself, with or without endpoints.
    if let Some(hc) = sp.health_check_node_port {
        part.push(
            FILTER,
            KUBE_NODEPORTS,
            format!(
                "-m comment --comment {} -m tcp -p tcp --dport {hc} -j ACCEPT",
                q(&format!("{spn} health check node port"))
            ),
        );
    }

    // KUBE-SVC-* (all usable endpoints) and KUBE-SVL-* (local ones).
    if let Some(cluster_eps) = chains.cluster.as_ref().filter(|e| !e.is_empty()) {
        let mut r = Vec::new();
        if cfg.masquerade_all {
            r.push(format!("-m comment --comment {} {match_cip} -j {KUBE_MARK_MASQ}", q(&format!("{spn} cluster IP"))));
        } else if let Some(cidr) = &cfg.cluster_cidr {
            r.push(format!(
                "-m comment --comment {} {match_cip} ! -s {cidr} -j {KUBE_MARK_MASQ}",
                q(&format!("{spn} cluster IP"))
            ));
        }
        r.extend(lb_rules(sp, &spn, cluster_eps));
        for rule in r {
            part.push(NAT, &svc, rule);
        }
    }
    if let Some(local_eps) = chains.local.as_ref().filter(|e| !e.is_empty()) {
        for rule in lb_rules(sp, &spn, local_eps) {
            part.push(NAT, &svl, rule);
        }
    }
    // KUBE-SEP-*: one per endpoint used by either chain.
    for ep in chains.used() {
        let sep = sep_chain(&sp.name, sp.protocol, ep);
        part.push(NAT, &sep, format!("-m comment --comment {} -s {}/32 -j {KUBE_MARK_MASQ}", q(&spn), ep.ip));
        let affinity =
            if sp.affinity_timeout.is_some() { format!(" -m recent --name {sep} --set") } else { String::new() };
        part.push(
            NAT,
            &sep,
            format!(
                "-m comment --comment {} -m {proto} -p {proto}{affinity} -j DNAT --to-destination {}",
                q(&spn),
                ep.addr()
            ),
        );
    }
    part
}

/// The tables as programmed, kept per service port, so that a sync renders only the service
/// ports whose inputs changed, rewrites only their own chains, and rewrites a shared chain
/// (`KUBE-SERVICES`, `KUBE-NODEPORTS`, …) only when some port's rules in it changed — a
/// Service added or removed, or one gaining its first or losing its last endpoint, not an
/// endpoint replaced: kube-proxy's partial syncs.
pub struct Table {
    /// Our chains the kernel had before the first sync (content unknown); None once written.
    kernel: Option<Tables>,
    cfg: Config,
    ports: Ports<PortRules>,
    rules: usize,
}

/// What a sync rewrites: own chains (`nat`), shared chains, chains to delete.
#[derive(Default)]
struct Changes {
    declare: String,
    rules: String,
    deletes: String,
    shared: BTreeSet<Shared>,
}

impl Changes {
    /// Port's share goes from `before` to `after`.
    fn note(&mut self, before: &PortRules, after: &PortRules) {
        for (chain, rules) in &after.chains {
            if before.chains.get(chain) != Some(rules) {
                let _ = writeln!(self.declare, ":{chain} - [0:0]");
                for rule in rules {
                    let _ = writeln!(self.rules, "{rule}");
                }
            }
        }
        for chain in before.chains.keys().filter(|c| !after.chains.contains_key(*c)) {
            let _ = writeln!(self.declare, ":{chain} - [0:0]");
            let _ = writeln!(self.deletes, "-X {chain}");
        }
        self.shared.extend(Shared::ALL.into_iter().filter(|s| before.shared.get(s) != after.shared.get(s)));
    }
}

impl Table {
    /// A table over the kernel's `existing` chains (names; their content is not needed): the
    /// first sync writes every chain and deletes those no longer wanted.
    pub fn over(existing: Tables) -> Table {
        Table { kernel: Some(existing), cfg: Config::default(), ports: Ports::default(), rules: 0 }
    }

    /// Rules in both tables.
    pub fn rule_count(&self) -> usize {
        self.rules
    }

    /// The whole tables as programmed.
    pub fn tables(&self) -> Tables {
        assemble(self.ports.parts(), &self.cfg)
    }

    /// Bring the tables to `ports`: the `iptables-restore --noflush` input, or None when
    /// nothing changed. The table assumes the input is applied; after a failure, start
    /// again with [`Table::over`] the kernel's chains.
    pub fn sync(&mut self, ports: &[Arc<ServicePort>], cfg: &Config) -> Option<String> {
        // The first sync, or another configuration: every chain again.
        let everything = match self.kernel.take() {
            Some(kernel) => Some(kernel),
            None => (self.cfg != *cfg).then(|| self.tables()),
        };
        if let Some(existing) = everything {
            self.cfg = cfg.clone();
            self.ports.clear();
            self.ports.sync(ports, |sp| render_port(sp, cfg), |_, _, _| {});
            let desired = self.tables();
            self.rules = desired.rule_count();
            return restore_input(&existing, &desired);
        }

        let mut changes = Changes::default();
        let rules = &mut self.rules;
        self.ports.sync(
            ports,
            |sp| render_port(sp, cfg),
            |_, before, after| {
                changes.note(before, after);
                *rules = *rules + after.rule_count() - before.rule_count();
            },
        );
        let (mut filter, mut nat) = ((String::new(), String::new()), (changes.declare, changes.rules));
        for s in &changes.shared {
            let (table, chain) = s.name();
            let (declare, rules) = if table == FILTER { &mut filter } else { &mut nat };
            let _ = writeln!(declare, ":{chain} - [0:0]");
            for rule in shared_chain(*s, self.ports.parts(), cfg) {
                let _ = writeln!(rules, "{rule}");
            }
        }
        let mut out = String::new();
        if !filter.0.is_empty() {
            let _ = write!(out, "*filter\n{}{}COMMIT\n", filter.0, filter.1);
        }
        if !nat.0.is_empty() {
            let _ = write!(out, "*nat\n{}{}{}COMMIT\n", nat.0, nat.1, changes.deletes);
        }
        (!out.is_empty()).then_some(out)
    }
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

/// The same from `nft list chains ip` output, for the iptables tables of iptables-nft: the
/// names without the rules, which `iptables-save` reads and prints too (at 10,000 Services
/// 0.2 s against 7 s per table, measured).
pub fn owned_chains_in_nft_listing(listing: &str, table: &str) -> BTreeSet<String> {
    let mut current = None;
    let mut chains = BTreeSet::new();
    for line in listing.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("table ip ") {
            current = rest.strip_suffix('{').map(str::trim);
        } else if let Some(rest) = line.strip_prefix("chain ") {
            let name = rest.trim_end_matches('{').trim();
            if current == Some(table) && name.starts_with("KUBE-") {
                chains.insert(name.to_string());
            }
        }
    }
    chains
}

/// The chains the jump rules sit in, per table.
pub fn jump_rule_chains(table: &str) -> BTreeSet<&'static str> {
    jump_rules().into_iter().filter(|(t, _, _)| *t == table).map(|(_, chain, _)| chain).collect()
}

/// One table as `--cleanup` finds it: the chains kube-proxy owns, and rules of other chains
/// (as `iptables-save`/`iptables -S` print them) that may jump into them.
pub struct Found<'a> {
    pub owned: BTreeSet<String>,
    pub rules: &'a str,
}

/// The restore input that removes every chain kube-proxy owns and every rule in another
/// chain that jumps into one of them (the jump rules), in one transaction (`--cleanup`);
/// None when there is nothing of ours.
pub fn cleanup_input(filter: &Found, nat: &Found) -> Option<String> {
    let mut out = String::new();
    for (name, found) in [(FILTER, filter), (NAT, nat)] {
        let owned = &found.owned;
        if owned.is_empty() {
            continue;
        }
        let jumps = found.rules.lines().filter_map(|l| l.strip_prefix("-A ")).filter(|rule| {
            let chain = rule.split_whitespace().next().unwrap_or_default();
            !owned.contains(chain) && target(rule).is_some_and(|t| owned.contains(t))
        });
        let _ = writeln!(out, "*{name}");
        for chain in owned {
            let _ = writeln!(out, ":{chain} - [0:0]");
        }
        for rule in jumps {
            let _ = writeln!(out, "-D {rule}");
        }
        for chain in owned {
            let _ = writeln!(out, "-X {chain}");
        }
        out.push_str("COMMIT\n");
    }
    (!out.is_empty()).then_some(out)
}

/// The chain a rule jumps or goes to (`-j`/`-g`), as `iptables-save` prints it.
fn target(rule: &str) -> Option<&str> {
    let words: Vec<&str> = rule.split_whitespace().collect();
    words.windows(2).rev().find(|w| w[0] == "-j" || w[0] == "-g").map(|w| w[1])
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
    fn rules_of<'a>(t: &'a Chains, prefix: &str) -> Vec<&'a String> {
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
    fn owned_chains_and_cleanup_in_one_restore() {
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:DOCKER - [0:0]\n:KUBE-SVC-ABC - [0:0]\n\
                    -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
                    -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n-A KUBE-SERVICES -j KUBE-SVC-ABC\nCOMMIT\n";
        let owned = owned_chains(save);
        assert_eq!(owned.into_iter().collect::<Vec<_>>(), ["KUBE-SERVICES", "KUBE-SVC-ABC"]);
        let nothing = Found { owned: BTreeSet::new(), rules: "" };
        assert_eq!(
            cleanup_input(&nothing, &Found { owned: owned_chains(save), rules: save }).unwrap(),
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-ABC - [0:0]\n\
             -D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -X KUBE-SERVICES\n-X KUBE-SVC-ABC\nCOMMIT\n",
            "the jump into our chain goes in the same restore; Docker's rule stays"
        );
        assert_eq!(cleanup_input(&nothing, &Found { owned: BTreeSet::new(), rules: save }), None);

        // The names from nft's listing of iptables-nft's tables.
        let listing = "table ip filter {\n\tchain INPUT {\n\t\ttype filter hook input priority filter; policy accept;\n\t}\n\tchain KUBE-SERVICES {\n\t}\n}\n\
                       table ip nat {\n\tchain KUBE-SERVICES {\n\t}\n\tchain DOCKER {\n\t}\n\tchain KUBE-SVC-ABC {\n\t}\n}\n\
                       table ip kube-proxy {\n\tchain KUBE-NOT-OURS-HERE {\n\t}\n}\n";
        assert_eq!(owned_chains_in_nft_listing(listing, "nat"), owned_chains(save));
        assert_eq!(owned_chains_in_nft_listing(listing, "filter").into_iter().collect::<Vec<_>>(), ["KUBE-SERVICES"]);
        assert_eq!(jump_rule_chains("nat").into_iter().collect::<Vec<_>>(), ["OUTPUT", "POSTROUTING", "PREROUTING"]);
    }

    /// What `iptables-restore --noflush` does with `input`, on tables held as data; it
    /// refuses, as the kernel does, to delete a chain a rule still jumps to, to append to a
    /// chain that does not exist, and a deletion of a chain not flushed first.
    fn apply(t: &mut Tables, input: &str) {
        let mut table = "";
        for line in input.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = if name == "filter" { FILTER } else { NAT };
            } else if line == "COMMIT" {
                continue;
            } else if let Some(decl) = line.strip_prefix(':') {
                let chain = decl.split_whitespace().next().unwrap();
                t.table_mut(table).insert(chain.to_string(), Vec::new());
            } else if let Some(chain) = line.strip_prefix("-X ") {
                let rules = t.table_mut(table).remove(chain).unwrap_or_else(|| panic!("no chain {chain}"));
                assert!(rules.is_empty(), "{chain} deleted without a flush");
                let chains = t.table_mut(table);
                let users: Vec<&String> = chains.values().flatten().filter(|r| target(r) == Some(chain)).collect();
                assert!(users.is_empty(), "{chain} deleted while referenced: {users:?}");
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let chain = rule.split_whitespace().next().unwrap();
                let rules = t.table_mut(table).get_mut(chain).unwrap_or_else(|| panic!("append to missing {chain}"));
                rules.push(line.to_string());
            } else {
                panic!("unexpected restore line {line}");
            }
        }
    }

    #[test]
    fn a_sync_rewrites_only_the_chains_that_changed_and_ends_where_a_full_render_does() {
        let services = |names: &[&str]| -> Vec<Service> {
            names.iter().enumerate().map(|(i, n)| simple_service(n, &format!("10.96.0.{}", i + 1), 80)).collect()
        };
        let arcs = |ports: Vec<ServicePort>| ports.into_iter().map(Arc::new).collect::<Vec<_>>();
        let step = |table: &mut Table, kernel: &mut Tables, ports: &[Arc<ServicePort>], cfg: &Config| {
            let input = table.sync(ports, cfg);
            if let Some(input) = &input {
                apply(kernel, input);
            }
            let want = render(ports, cfg);
            assert_eq!(*kernel, want, "after {input:?}");
            assert_eq!(table.rule_count(), want.rule_count());
            assert_eq!(table.tables(), want);
            input
        };
        // The kernel starts with a stale chain of ours and its jump.
        let mut kernel = Tables::default();
        kernel.nat.insert("KUBE-SVC-STALE".into(), vec!["?".into()]);
        kernel.nat.insert(KUBE_SERVICES.into(), vec!["?".into()]);
        let mut table = Table::over(kernel.clone());
        for rules in kernel.nat.values_mut() {
            rules.clear(); // (what the kernel's "?" stands for: flushed by a declaration)
        }
        let c = cfg();
        let eps = |a: &str, b: &str, c: &str| {
            vec![simple_slice("a", &[a], 80), simple_slice("b", &[b], 80), simple_slice("c", &[c], 80)]
        };
        let svcs = services(&["a", "b", "c"]);
        let first = step(
            &mut table,
            &mut kernel,
            &arcs(service_ports(&svcs, &eps("10.0.0.1", "10.0.0.2", "10.0.0.3"), &node())),
            &c,
        )
        .unwrap();
        assert!(first.contains("-X KUBE-SVC-STALE"), "{first}");
        let same = arcs(service_ports(&svcs, &eps("10.0.0.1", "10.0.0.2", "10.0.0.3"), &node()));
        assert_eq!(step(&mut table, &mut kernel, &same, &c), None, "nothing changed (other Arcs, equal ports)");

        // b's endpoint is replaced: only b's own chains, no shared chain, no filter table.
        let b_moved = arcs(service_ports(&svcs, &eps("10.0.0.1", "10.0.0.9", "10.0.0.3"), &node()));
        let input = step(&mut table, &mut kernel, &b_moved, &c).unwrap();
        let b_svc = svc_chain(&b_moved[1].name, b_moved[1].protocol);
        let declared: Vec<&str> = input.lines().filter_map(|l| l.strip_prefix(':')).collect();
        assert_eq!(declared.len(), 3, "b's service chain, its new and its old endpoint chain:\n{input}");
        assert!(declared.iter().all(|d| d.starts_with(&b_svc) || d.starts_with("KUBE-SEP-")), "{input}");
        assert!(!input.contains("*filter") && !input.contains(KUBE_SERVICES), "{input}");

        // d is added: KUBE-SERVICES is rewritten with it; a loses its endpoints (a REJECT in
        // filter, its chains deleted); c goes.
        let svcs = services(&["a", "b", "c", "d"]);
        let slices = vec![simple_slice("b", &["10.0.0.9"], 80), simple_slice("d", &["10.0.0.4"], 80)];
        let mut changed = arcs(service_ports(&svcs, &slices, &node()));
        changed.retain(|p| p.name.name != "c");
        let input = step(&mut table, &mut kernel, &changed, &c).unwrap();
        assert!(input.contains(&format!(":{KUBE_SERVICES} - [0:0]")) && input.contains("*filter"), "{input}");
        assert!(!input.contains(&format!(":{b_svc}")), "b is unchanged:\n{input}");
        assert!(kernel.filter[KUBE_SERVICES].iter().any(|r| r.contains("default/a:http has no endpoints")));

        // The same port twice: the first one counts, as in a full render.
        let mut twice = changed.clone();
        twice.push(Arc::new(
            service_ports(&services(&["b"]), &[simple_slice("b", &["10.0.0.7"], 80)], &node()).remove(0),
        ));
        assert_eq!(step(&mut table, &mut kernel, &twice, &c), None);

        // Another configuration rewrites everything for it.
        let other = Config { nodeport_addresses: vec!["192.168.1.10".parse().unwrap()], ..cfg() };
        let input = step(&mut table, &mut kernel, &changed, &other).unwrap();
        assert!(input.contains("-d 192.168.1.10/32 -j KUBE-NODEPORTS"), "{input}");
        // Everything goes.
        step(&mut table, &mut kernel, &[], &other).unwrap();
    }
}
