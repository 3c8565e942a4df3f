//! nftables mode: one `ip kube-proxy` table whose verdict maps send service traffic to
//! per-service chains, the way Kubernetes' nftables proxier lays it out:
//! `service-ips` (cluster/external/LB IP . proto . port), `service-nodeports`
//! (proto . port), `no-endpoint-services` / `no-endpoint-nodeports` (reject or drop), and
//! chains `service-*`, `local-*`, `external-*`, `endpoint-*`. `loadBalancerSourceRanges`:
//! `firewall-ips` (LB IP . proto . port) sends new connections, before DNAT, to the
//! service's `firewall-*` chain, which drops every source outside the allowed ones.
//!
//! Two differences from Kubernetes' layout, both measured (see [`choice_rules`]): a service
//! chain picks its endpoint with a cascade of `numgen` rules instead of an anonymous verdict
//! map per service, and DNATs to it right there — there are `endpoint-*` chains only for
//! services with session affinity, which need them for their sets. Kubernetes' endpoint
//! chain also marks a connection from the endpoint to itself (hairpin) for masquerading;
//! here one set of `ip . ip` pairs, `endpoint-hairpin`, does that in postrouting for every
//! endpoint: after DNAT, a connection whose source is its destination came back to itself.
//!
//! [`render`] computes the desired chains, map elements and affinity sets as data;
//! [`script`] turns (applied, desired) into an `nft -f` transaction: the whole table on the
//! first sync (atomically replacing whatever a previous run left), then only the changed
//! chains, map elements and sets.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::{self, Write as _};
use std::net::Ipv4Addr;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::chains::base32_prefix;
use crate::iptables::Config;
use crate::model::{Cidr, Endpoint, Protocol, ServicePort};
use crate::programmed::{PortId, Ports};

pub const TABLE: &str = "kube-proxy";
pub const MAP_SERVICE_IPS: &str = "service-ips";
pub const MAP_SERVICE_NODEPORTS: &str = "service-nodeports";
pub const MAP_NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const MAP_NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const MAP_FIREWALL_IPS: &str = "firewall-ips";
pub const SET_ENDPOINT_HAIRPIN: &str = "endpoint-hairpin";

/// The desired dynamic content of the table (all of it, or one service port's share).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// chain → rules.
    pub chains: BTreeMap<String, Vec<Rule>>,
    /// map → key → verdict.
    pub maps: BTreeMap<&'static str, BTreeMap<String, String>>,
    /// affinity set → timeout (s).
    pub sets: BTreeMap<String, u32>,
    /// fixed set → elements (`endpoint-hairpin`).
    pub elements: BTreeMap<&'static str, BTreeSet<String>>,
}

impl Ruleset {
    pub fn rule_count(&self) -> usize {
        self.chains.values().map(Vec::len).sum::<usize>()
            + self.maps.values().map(BTreeMap::len).sum::<usize>()
            + self.elements.values().map(BTreeSet::len).sum::<usize>()
    }
}

/// A jump or goto to a chain of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Jump(String),
    Goto(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

/// One rule of a service's chains. The forms an endpoint change rewrites are structured, so
/// that [`crate::nft_netlink`] can send them to the kernel without `nft`; the rarer ones
/// (firewall ranges, `fib`, affinity sets) are nft text. `Display` is the nft syntax.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// `ip daddr D <proto> dport P [ip saddr != CIDR] jump mark-for-masquerade`.
    MarkForMasquerade { daddr: Ipv4Addr, protocol: Protocol, dport: u16, unless_from: Option<Cidr> },
    /// `[numgen random mod N 0 ]meta l4proto <proto> dnat to IP:PORT`: taken with
    /// probability 1/N (always without `one_in`).
    Dnat { one_in: Option<u32>, protocol: Protocol, ip: Ipv4Addr, port: u16 },
    /// `[numgen random mod N 0 ]jump|goto CHAIN`.
    Verdict { one_in: Option<u32>, verdict: Verdict },
    /// Anything else, in nft syntax.
    Text(String),
}

impl Rule {
    fn goto(chain: &str) -> Rule {
        Rule::Verdict { one_in: None, verdict: Verdict::Goto(chain.to_string()) }
    }
    fn jump(chain: &str) -> Rule {
        Rule::Verdict { one_in: None, verdict: Verdict::Jump(chain.to_string()) }
    }
    /// The same action, taken with probability 1/n.
    fn one_in(self, n: u32) -> Rule {
        match self {
            Rule::Dnat { protocol, ip, port, .. } => Rule::Dnat { one_in: Some(n), protocol, ip, port },
            Rule::Verdict { verdict, .. } => Rule::Verdict { one_in: Some(n), verdict },
            other => Rule::Text(format!("numgen random mod {n} 0 {other}")),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let numgen = |f: &mut fmt::Formatter<'_>, one_in: &Option<u32>| match one_in {
            Some(n) => write!(f, "numgen random mod {n} 0 "),
            None => Ok(()),
        };
        match self {
            Rule::MarkForMasquerade { daddr, protocol, dport, unless_from } => {
                write!(f, "ip daddr {daddr} {} dport {dport} ", protocol.lower())?;
                if let Some(cidr) = unless_from {
                    write!(f, "ip saddr != {cidr} ")?;
                }
                f.write_str("jump mark-for-masquerade")
            }
            Rule::Dnat { one_in, protocol, ip, port } => {
                numgen(f, one_in)?;
                write!(f, "meta l4proto {} dnat to {ip}:{port}", protocol.lower())
            }
            Rule::Verdict { one_in, verdict } => {
                numgen(f, one_in)?;
                write!(f, "{verdict}")
            }
            Rule::Text(t) => f.write_str(t),
        }
    }
}

/// Kubernetes' `hashAndTruncate`: `HASH8-name`, at most 200 characters.
fn hash_name(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut s = format!("{}-{name}", base32_prefix(&digest, 8));
    if s.len() > 200 {
        s.truncate(197);
        s.push_str("...");
    }
    s
}

fn base(sp: &ServicePort) -> String {
    format!("{}/{}/{}/{}", sp.name.namespace, sp.name.name, sp.protocol.lower(), sp.name.port)
}
pub fn service_chain(sp: &ServicePort) -> String {
    format!("service-{}", hash_name(&base(sp)))
}
pub fn local_chain(sp: &ServicePort) -> String {
    format!("local-{}", hash_name(&base(sp)))
}
pub fn external_chain(sp: &ServicePort) -> String {
    format!("external-{}", hash_name(&base(sp)))
}
pub fn firewall_chain(sp: &ServicePort) -> String {
    format!("firewall-{}", hash_name(&base(sp)))
}
pub fn endpoint_chain(sp: &ServicePort, ep: &Endpoint) -> String {
    format!("endpoint-{}", hash_name(&format!("{}__{}/{}", base(sp), ep.ip, ep.port)))
}
pub fn affinity_set(sp: &ServicePort, ep: &Endpoint) -> String {
    format!("affinity-{}", hash_name(&format!("{}__{}/{}", base(sp), ep.ip, ep.port)))
}

/// The fixed part of the table: base chains hooked into netfilter, the maps, helpers.
pub fn base_script(cfg: &Config) -> String {
    let nodeport_match = if cfg.nodeport_addresses.is_empty() {
        "fib daddr type local".to_string()
    } else {
        let ips: Vec<String> = cfg.nodeport_addresses.iter().map(Ipv4Addr::to_string).collect();
        format!("ip daddr {{ {} }}", ips.join(", "))
    };
    format!(
        r#"table ip {TABLE} {{
	comment "rules for kube-proxy"
	map {MAP_SERVICE_IPS} {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }}
	map {MAP_SERVICE_NODEPORTS} {{ type inet_proto . inet_service : verdict ; comment "NodePort traffic" ; }}
	map {MAP_NO_ENDPOINT_SERVICES} {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to services with no endpoints" ; }}
	map {MAP_NO_ENDPOINT_NODEPORTS} {{ type inet_proto . inet_service : verdict ; comment "vmap to drop or reject packets to service nodeports with no endpoints" ; }}
	map {MAP_FIREWALL_IPS} {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment "destinations that are subject to LoadBalancerSourceRanges" ; }}
	set {SET_ENDPOINT_HAIRPIN} {{ type ipv4_addr . ipv4_addr ; comment "endpoint . endpoint: a service connection from an endpoint to itself is masqueraded" ; }}
	chain mark-for-masquerade {{
		meta mark set meta mark | 0x4000
	}}
	chain masquerading {{
		meta mark & 0x4000 == 0 return
		meta mark set meta mark ^ 0x4000
		masquerade fully-random
	}}
	chain reject-chain {{
		comment "helper for @no-endpoint-services / @no-endpoint-nodeports"
		reject
	}}
	chain services {{
		ip daddr . meta l4proto . th dport vmap @{MAP_SERVICE_IPS}
		{nodeport_match} meta l4proto . th dport vmap @{MAP_SERVICE_NODEPORTS}
	}}
	chain firewall-check {{
		ip daddr . meta l4proto . th dport vmap @{MAP_FIREWALL_IPS}
	}}
	chain service-endpoints-check {{
		ip daddr . meta l4proto . th dport vmap @{MAP_NO_ENDPOINT_SERVICES}
		{nodeport_match} meta l4proto . th dport vmap @{MAP_NO_ENDPOINT_NODEPORTS}
	}}
	chain nat-prerouting {{
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}}
	chain nat-output {{
		type nat hook output priority -100; policy accept;
		jump services
	}}
	chain nat-postrouting {{
		type nat hook postrouting priority srcnat; policy accept;
		ct status dnat ip saddr . ip daddr @{SET_ENDPOINT_HAIRPIN} masquerade fully-random
		jump masquerading
	}}
	chain filter-prerouting {{
		type filter hook prerouting priority -110; policy accept;
		ct state new jump firewall-check
	}}
	chain filter-input {{
		type filter hook input priority -110; policy accept;
		ct state new jump service-endpoints-check
	}}
	chain filter-forward {{
		type filter hook forward priority -110; policy accept;
		ct state new jump service-endpoints-check
	}}
	chain filter-output {{
		type filter hook output priority -110; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump firewall-check
	}}
}}
"#
    )
}

/// The desired chains, map elements and sets for `ports` (the union of their shares).
pub fn render<P: Borrow<ServicePort>>(ports: &[P], cfg: &Config) -> Ruleset {
    let mut rs = Ruleset::default();
    for m in
        [MAP_SERVICE_IPS, MAP_SERVICE_NODEPORTS, MAP_NO_ENDPOINT_SERVICES, MAP_NO_ENDPOINT_NODEPORTS, MAP_FIREWALL_IPS]
    {
        rs.maps.insert(m, BTreeMap::new());
    }
    rs.elements.insert(SET_ENDPOINT_HAIRPIN, BTreeSet::new());
    for sp in ports.iter().map(Borrow::borrow) {
        let part = render_port(sp, cfg);
        rs.chains.extend(part.chains);
        rs.sets.extend(part.sets);
        for (m, elems) in part.maps {
            rs.maps.entry(m).or_default().extend(elems);
        }
        for (set, elems) in part.elements {
            rs.elements.entry(set).or_default().extend(elems);
        }
    }
    rs
}

/// One service port's share of the table: its chains and sets, and the map and set
/// elements it needs.
pub fn render_port(sp: &ServicePort, cfg: &Config) -> Ruleset {
    let mut rs = Ruleset::default();
    let proto = sp.protocol.lower();
    let svc = service_chain(sp);
    let local = local_chain(sp);
    let ext = external_chain(sp);
    let chains = sp.chain_endpoints();
    let reject = |policy_local: bool| {
        if policy_local && sp.has_any_endpoint {
            "drop".to_string()
        } else {
            "goto reject-chain".to_string()
        }
    };

    let cip_key = format!("{} . {proto} . {}", sp.cluster_ip, sp.port);
    if !sp.cluster_endpoints.is_empty() {
        let target = if sp.internal_policy_local { &local } else { &svc };
        rs.maps.entry(MAP_SERVICE_IPS).or_default().insert(cip_key, format!("goto {target}"));
    } else {
        rs.maps.entry(MAP_NO_ENDPOINT_SERVICES).or_default().insert(cip_key, reject(sp.internal_policy_local));
    }

    if sp.has_external() {
        let ext_keys: Vec<String> = sp
            .external_ips
            .iter()
            .chain(&sp.load_balancer_ips)
            .map(|ip| format!("{ip} . {proto} . {}", sp.port))
            .collect();
        let np_key = sp.node_port.map(|np| format!("{proto} . {np}"));
        if !sp.external_endpoints.is_empty() {
            for k in ext_keys {
                rs.maps.entry(MAP_SERVICE_IPS).or_default().insert(k, format!("goto {ext}"));
            }
            if let Some(k) = np_key {
                rs.maps.entry(MAP_SERVICE_NODEPORTS).or_default().insert(k, format!("goto {ext}"));
            }
            let mut r = Vec::new();
            if sp.external_policy_local {
                let cluster_target = if chains.cluster.is_some() { &svc } else { &local };
                if let Some(cidr) = &cfg.cluster_cidr {
                    r.push(Rule::Text(format!("ip saddr {cidr} goto {cluster_target}")));
                }
                r.push(Rule::Text("fib saddr type local jump mark-for-masquerade".to_string()));
                r.push(Rule::Text(format!("fib saddr type local goto {cluster_target}")));
                r.push(Rule::goto(&local));
            } else {
                r.push(Rule::jump("mark-for-masquerade"));
                r.push(Rule::goto(&svc));
            }
            rs.chains.insert(ext, r);
        } else {
            let verdict = reject(sp.external_policy_local);
            for k in ext_keys {
                rs.maps.entry(MAP_NO_ENDPOINT_SERVICES).or_default().insert(k, verdict.clone());
            }
            if let Some(k) = np_key {
                rs.maps.entry(MAP_NO_ENDPOINT_NODEPORTS).or_default().insert(k, verdict.clone());
            }
        }
    }

    // Whatever the endpoints, as Kubernetes' nftables mode: the firewall runs before them.
    if sp.uses_firewall() {
        let fw = firewall_chain(sp);
        let sources: Vec<String> = sp.firewall_sources().iter().map(ToString::to_string).collect();
        rs.chains.insert(fw.clone(), vec![Rule::Text(format!("ip saddr != {{ {} }} drop", sources.join(", ")))]);
        for ip in &sp.load_balancer_ips {
            rs.maps
                .entry(MAP_FIREWALL_IPS)
                .or_default()
                .insert(format!("{ip} . {proto} . {}", sp.port), format!("goto {fw}"));
        }
    }

    if let Some(cluster_eps) = chains.cluster.as_ref().filter(|e| !e.is_empty()) {
        let mut r = Vec::new();
        let mark = |unless_from| Rule::MarkForMasquerade {
            daddr: sp.cluster_ip,
            protocol: sp.protocol,
            dport: sp.port,
            unless_from,
        };
        if cfg.masquerade_all {
            r.push(mark(None));
        } else if let Some(cidr) = &cfg.cluster_cidr {
            r.push(match Cidr::parse(cidr) {
                Some(c) => mark(Some(c)),
                None => Rule::Text(format!(
                    "ip daddr {} {proto} dport {} ip saddr != {cidr} jump mark-for-masquerade",
                    sp.cluster_ip, sp.port
                )),
            });
        }
        r.extend(lb_rules(sp, cluster_eps));
        rs.chains.insert(svc.clone(), r);
    }
    if let Some(local_eps) = chains.local.as_ref().filter(|e| !e.is_empty()) {
        rs.chains.insert(local.clone(), lb_rules(sp, local_eps));
    }
    for ep in chains.used() {
        rs.elements.entry(SET_ENDPOINT_HAIRPIN).or_default().insert(format!("{} . {}", ep.ip, ep.ip));
        if let Some(timeout) = sp.affinity_timeout {
            let set = affinity_set(sp, ep);
            let r = vec![Rule::Text(format!("update @{set} {{ ip saddr }}")), dnat(sp.protocol, ep)];
            rs.sets.insert(set, timeout);
            rs.chains.insert(endpoint_chain(sp, ep), r);
        }
    }
    rs
}

fn lb_rules(sp: &ServicePort, eps: &[Endpoint]) -> Vec<Rule> {
    let mut r = Vec::new();
    if sp.affinity_timeout.is_some() {
        // Each endpoint's chain records the client in its affinity set.
        for ep in eps {
            r.push(Rule::Text(format!("ip saddr @{} goto {}", affinity_set(sp, ep), endpoint_chain(sp, ep))));
        }
        r.extend(choice_rules(eps.iter().map(|ep| Rule::goto(&endpoint_chain(sp, ep)))));
    } else {
        r.extend(choice_rules(eps.iter().map(|ep| dnat(sp.protocol, ep))));
    }
    r
}

fn dnat(protocol: Protocol, ep: &Endpoint) -> Rule {
    Rule::Dnat { one_in: None, protocol, ip: ep.ip, port: ep.port }
}

/// The uniform choice among `actions` (a `goto` or a `dnat`): rule `i` of `n` takes its
/// action with probability `1/(n-i)` (`numgen random mod n-i 0`), so each is taken with
/// probability `1/n`, the last unconditionally.
///
/// Kubernetes writes one `numgen random mod n vmap { 0 : goto endpoint-… }` per service and
/// an `endpoint-*` chain per endpoint. Both cost more than they do there: each anonymous map
/// is a set of the table, and loading N of them is quadratic in the kernel (measured with
/// `nft -f` on this machine's kernel 6.18, 4,000 services × 5 endpoints: 33 s with verdict
/// maps, 87 s with `dnat … map` data maps, 2.1 s with this cascade); and `nft` reads every
/// chain of the table before each transaction, so 50,000 endpoint chains made every later
/// change slow.
fn choice_rules(actions: impl ExactSizeIterator<Item = Rule>) -> Vec<Rule> {
    let n = actions.len();
    actions.enumerate().map(|(i, action)| if i + 1 == n { action } else { action.one_in((n - i) as u32) }).collect()
}

/// One change to the table, in the order a [`Transaction`] applies them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// An affinity set (`ip saddr` with a timeout).
    AddSet {
        name: String,
        timeout: u32,
    },
    AddChain(String),
    /// Remove every rule of a chain.
    FlushChain(String),
    AddRule {
        chain: String,
        rule: Rule,
    },
    /// An element of a map (with its verdict) or of a set (`verdict: None`).
    AddElement {
        set: &'static str,
        key: String,
        verdict: Option<String>,
    },
    DeleteElement {
        set: &'static str,
        key: String,
    },
    DeleteChain(String),
    DeleteSet(String),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = format!("ip {TABLE}");
        match self {
            Op::AddSet { name, timeout } => {
                write!(f, "add set {t} {name} {{ type ipv4_addr ; flags dynamic,timeout ; timeout {timeout}s ; }}")
            }
            Op::AddChain(c) => write!(f, "add chain {t} {c}"),
            Op::FlushChain(c) => write!(f, "flush chain {t} {c}"),
            Op::AddRule { chain, rule } => write!(f, "add rule {t} {chain} {rule}"),
            Op::AddElement { set, key, verdict: Some(v) } => write!(f, "add element {t} {set} {{ {key} : {v} }}"),
            Op::AddElement { set, key, verdict: None } => write!(f, "add element {t} {set} {{ {key} }}"),
            Op::DeleteElement { set, key } => write!(f, "delete element {t} {set} {{ {key} }}"),
            Op::DeleteChain(c) => write!(f, "delete chain {t} {c}"),
            Op::DeleteSet(s) => write!(f, "delete set {t} {s}"),
        }
    }
}

/// What one sync writes: the whole table (`full`: replacing whatever is there, the base
/// chains and maps included), or only changes to the programmed one.
#[derive(Clone, Debug, Default)]
pub struct Transaction {
    pub full: bool,
    pub ops: Vec<Op>,
}

impl Transaction {
    /// The transaction as an `nft -f` script.
    pub fn script(&self, cfg: &Config) -> String {
        let mut out = String::new();
        if self.full {
            let _ = writeln!(out, "add table ip {TABLE}\ndelete table ip {TABLE}");
            out.push_str(&base_script(cfg));
        }
        for op in &self.ops {
            let _ = writeln!(out, "{op}");
        }
        out
    }
}

/// Where in a transaction an operation goes: new sets and chains before the rules and map
/// elements that reference them; map elements removed before the chains they point to.
#[derive(Default)]
struct Phases {
    /// The programmed value of each map key and set element touched, before this sync.
    touched_keys: BTreeMap<(&'static str, String), Option<String>>,
    touched_elements: BTreeMap<(&'static str, String), bool>,
    add_sets: Vec<Op>,
    add_chains: Vec<Op>,
    rules: Vec<Op>,
    flush_stale: Vec<Op>,
    delete_chains: Vec<Op>,
    delete_sets: Vec<Op>,
}

/// The table as programmed, kept per service port, so that a sync renders and compares
/// only the service ports whose inputs changed and writes only what changed in the kernel.
/// Map keys and set elements that several ports want (two services with one external IP;
/// one endpoint behind two services) are counted, so one port leaving does not remove what
/// another still needs.
#[derive(Default)]
pub struct Table {
    /// False until the first sync, which writes the whole table.
    written: bool,
    ports: Ports<Ruleset>,
    shares: Shares,
}

/// What the ports' shares add up to.
#[derive(Default)]
struct Shares {
    /// (map, key) → the ports that want it, with their verdicts; the first one's is programmed.
    map_keys: HashMap<(&'static str, String), Vec<(PortId, String)>>,
    /// (set, element) → how many ports want it.
    elements: HashMap<(&'static str, String), usize>,
    /// Rules in all chains.
    chain_rules: usize,
}

impl Table {
    /// Programmed rules, map elements and set elements.
    pub fn rule_count(&self) -> usize {
        self.shares.chain_rules + self.shares.map_keys.len() + self.shares.elements.len()
    }

    /// Bring the table to `ports`: the changes to write, or None when nothing changed. The
    /// table assumes the transaction is applied; after a failure, start again from
    /// `Table::default()` (a full sync).
    pub fn sync(&mut self, ports: &[Arc<ServicePort>], cfg: &Config) -> Option<Transaction> {
        let full = !self.written;
        self.written = true;
        let mut phases = Phases::default();
        let shares = &mut self.shares;
        self.ports.sync(
            ports,
            |sp| render_port(sp, cfg),
            |id, before, after| shares.change(id, before, after, &mut phases),
        );

        // Map elements: removed (or changed) before added; then the fixed sets' elements.
        let mut delete_elements = Vec::new();
        let mut add_elements = Vec::new();
        let Phases {
            touched_keys,
            touched_elements,
            add_sets,
            add_chains,
            rules,
            flush_stale,
            delete_chains,
            delete_sets,
        } = phases;
        for ((set, key), before) in touched_keys {
            let now = self.shares.map_keys.get(&(set, key.clone())).and_then(|o| o.first()).map(|(_, v)| v.clone());
            if before == now {
                continue;
            }
            if before.is_some() {
                delete_elements.push(Op::DeleteElement { set, key: key.clone() });
            }
            if now.is_some() {
                add_elements.push(Op::AddElement { set, key, verdict: now });
            }
        }
        let mut set_elements = Vec::new();
        for ((set, key), before) in touched_elements {
            let now = self.shares.elements.contains_key(&(set, key.clone()));
            match (before, now) {
                (true, false) => set_elements.push(Op::DeleteElement { set, key }),
                (false, true) => set_elements.push(Op::AddElement { set, key, verdict: None }),
                _ => {}
            }
        }
        set_elements.sort_by_key(|op| !matches!(op, Op::DeleteElement { .. }));

        let ops: Vec<Op> = [add_sets, add_chains, rules, delete_elements, add_elements, set_elements]
            .into_iter()
            .chain([flush_stale, delete_chains, delete_sets])
            .flatten()
            .collect();
        (full || !ops.is_empty()).then_some(Transaction { full, ops })
    }
}

impl Shares {
    /// Record that port `id`'s share goes from `before` to `after`.
    fn change(&mut self, id: &PortId, before: &Ruleset, after: &Ruleset, phases: &mut Phases) {
        for (set, timeout) in &after.sets {
            // (A changed timeout keeps the old set: sets cannot be redefined in place.)
            if !before.sets.contains_key(set) {
                phases.add_sets.push(Op::AddSet { name: set.clone(), timeout: *timeout });
            }
        }
        for set in before.sets.keys().filter(|s| !after.sets.contains_key(*s)) {
            phases.delete_sets.push(Op::DeleteSet(set.clone()));
        }
        for (chain, rules) in &after.chains {
            match before.chains.get(chain) {
                Some(r) if r == rules => continue,
                Some(r) => {
                    self.chain_rules -= r.len();
                    phases.rules.push(Op::FlushChain(chain.clone()));
                }
                None => phases.add_chains.push(Op::AddChain(chain.clone())),
            }
            self.chain_rules += rules.len();
            phases.rules.extend(rules.iter().map(|rule| Op::AddRule { chain: chain.clone(), rule: rule.clone() }));
        }
        for (chain, rules) in &before.chains {
            if !after.chains.contains_key(chain) {
                self.chain_rules -= rules.len();
                // Flushed first: stale chains may reference each other.
                phases.flush_stale.push(Op::FlushChain(chain.clone()));
                phases.delete_chains.push(Op::DeleteChain(chain.clone()));
            }
        }

        let empty = BTreeMap::new();
        let maps = before.maps.keys().chain(after.maps.keys()).copied().collect::<BTreeSet<_>>();
        for map in maps {
            let (old, new) = (before.maps.get(map).unwrap_or(&empty), after.maps.get(map).unwrap_or(&empty));
            for (key, verdict) in old.iter().filter(|(k, v)| new.get(*k) != Some(*v)) {
                let slot = (map, key.clone());
                let owners = self.map_keys.entry(slot.clone()).or_default();
                phases.touched_keys.entry(slot.clone()).or_insert_with(|| owners.first().map(|(_, v)| v.clone()));
                owners.retain(|(o, v)| !(o == id && v == verdict));
                if owners.is_empty() {
                    self.map_keys.remove(&slot);
                }
            }
            for (key, verdict) in new.iter().filter(|(k, v)| old.get(*k) != Some(*v)) {
                let slot = (map, key.clone());
                let owners = self.map_keys.entry(slot.clone()).or_default();
                phases.touched_keys.entry(slot).or_insert_with(|| owners.first().map(|(_, v)| v.clone()));
                owners.push((id.clone(), verdict.clone()));
            }
        }

        let none = BTreeSet::new();
        let sets = before.elements.keys().chain(after.elements.keys()).copied().collect::<BTreeSet<_>>();
        for set in sets {
            let (old, new) = (before.elements.get(set).unwrap_or(&none), after.elements.get(set).unwrap_or(&none));
            for key in old.difference(new) {
                let slot = (set, key.clone());
                phases.touched_elements.entry(slot.clone()).or_insert_with(|| self.elements.contains_key(&slot));
                if let Some(n) = self.elements.get_mut(&slot) {
                    *n -= 1;
                    if *n == 0 {
                        self.elements.remove(&slot);
                    }
                }
            }
            for key in new.difference(old) {
                let slot = (set, key.clone());
                phases.touched_elements.entry(slot.clone()).or_insert_with(|| self.elements.contains_key(&slot));
                *self.elements.entry(slot).or_default() += 1;
            }
        }
    }
}

/// The transaction that removes the table (`--cleanup`); harmless when it is absent.
pub fn cleanup_script() -> String {
    format!("add table ip {TABLE}\ndelete table ip {TABLE}\n")
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
    fn cfg() -> Config {
        Config { cluster_cidr: Some("10.244.0.0/16".into()), ..Default::default() }
    }
    fn text(rules: &[Rule]) -> Vec<String> {
        rules.iter().map(ToString::to_string).collect()
    }
    /// The `nft -f` script that brings a table programmed with `applied` (None: nothing
    /// programmed yet) to `desired`; None when nothing changes.
    fn script(applied: Option<&[ServicePort]>, desired: &[ServicePort]) -> Option<String> {
        let mut table = Table::default();
        if let Some(a) = applied {
            table.sync(&arcs(a), &cfg());
        }
        table.sync(&arcs(desired), &cfg()).map(|tx| tx.script(&cfg()))
    }
    fn arcs(ports: &[ServicePort]) -> Vec<Arc<ServicePort>> {
        ports.iter().cloned().map(Arc::new).collect()
    }

    #[test]
    fn cluster_ip_goes_through_the_service_ips_map_to_a_numgen_cascade() {
        let ports = service_ports(
            &[simple_service("web", "10.96.0.10", 80)],
            &[simple_slice("web", &["10.244.1.1", "10.244.1.2"], 8080)],
            &node(),
        );
        let rs = render(&ports, &cfg());
        let svc = service_chain(&ports[0]);
        assert!(svc.starts_with("service-") && svc.ends_with("-default/web/tcp/http"), "{svc}");
        assert_eq!(rs.maps[MAP_SERVICE_IPS]["10.96.0.10 . tcp . 80"], format!("goto {svc}"));
        let rules = text(&rs.chains[&svc]);
        assert_eq!(
            rules,
            [
                "ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade",
                "numgen random mod 2 0 meta l4proto tcp dnat to 10.244.1.1:8080",
                "meta l4proto tcp dnat to 10.244.1.2:8080",
            ]
        );
        // No endpoint chains without affinity; each endpoint is in the hairpin set.
        assert!(!rs.chains.keys().any(|c| c.starts_with("endpoint-")), "{:?}", rs.chains.keys());
        assert_eq!(
            rs.elements[SET_ENDPOINT_HAIRPIN].iter().collect::<Vec<_>>(),
            ["10.244.1.1 . 10.244.1.1", "10.244.1.2 . 10.244.1.2"]
        );
        let full = script(None, &ports).unwrap();
        assert!(full.contains("add element ip kube-proxy endpoint-hairpin { 10.244.1.1 . 10.244.1.1 }"), "{full}");
        assert!(base_script(&cfg()).contains("ct status dnat ip saddr . ip daddr @endpoint-hairpin masquerade"));
        // An endpoint that goes leaves the set, the other stays.
        let fewer = service_ports(
            &[simple_service("web", "10.96.0.10", 80)],
            &[simple_slice("web", &["10.244.1.1"], 8080)],
            &node(),
        );
        let inc = script(Some(&ports), &fewer).unwrap();
        assert!(inc.contains("delete element ip kube-proxy endpoint-hairpin { 10.244.1.2 . 10.244.1.2 }"), "{inc}");
        assert!(!inc.contains("10.244.1.1 . 10.244.1.1"), "{inc}");
    }

    #[test]
    fn the_cascade_chooses_each_endpoint_with_equal_probability() {
        let rules = text(&choice_rules(["a", "b", "c", "d"].iter().map(|c| Rule::goto(c))));
        assert_eq!(
            rules,
            ["numgen random mod 4 0 goto a", "numgen random mod 3 0 goto b", "numgen random mod 2 0 goto c", "goto d"]
        );
        // P(rule i) = prod_{j<i} (1 - 1/(n-j)) * 1/(n-i) = 1/n for every i.
        let n = rules.len();
        let mut reach = 1.0;
        for i in 0..n {
            let take = if i + 1 == n { 1.0 } else { 1.0 / (n - i) as f64 };
            assert!((reach * take - 1.0 / n as f64).abs() < 1e-12, "rule {i}");
            reach *= 1.0 - take;
        }
        assert_eq!(text(&choice_rules(std::iter::once(Rule::goto("only")))), ["goto only"]);
    }

    #[test]
    fn empty_service_rejects_and_nodeports_map() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}));
        let rs = render(&service_ports(std::slice::from_ref(&s), &[], &node()), &cfg());
        assert_eq!(rs.maps[MAP_NO_ENDPOINT_SERVICES]["10.96.0.10 . tcp . 80"], "goto reject-chain");
        assert_eq!(rs.maps[MAP_NO_ENDPOINT_NODEPORTS]["tcp . 30080"], "goto reject-chain");
        assert!(rs.chains.is_empty());

        let ports = service_ports(&[s], &[simple_slice("web", &["10.244.1.1"], 80)], &node());
        let rs = render(&ports, &cfg());
        let ext = external_chain(&ports[0]);
        assert_eq!(rs.maps[MAP_SERVICE_NODEPORTS]["tcp . 30080"], format!("goto {ext}"));
        assert_eq!(
            text(&rs.chains[&ext]),
            ["jump mark-for-masquerade".to_string(), format!("goto {}", service_chain(&ports[0]))]
        );
        assert!(rs.maps[MAP_NO_ENDPOINT_NODEPORTS].is_empty());
    }

    #[test]
    fn affinity_uses_dynamic_sets() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.10", "sessionAffinity": "ClientIP", "ports": [{"name": "http", "port": 80}]}}));
        let ports = service_ports(&[s], &[simple_slice("web", &["10.244.1.1"], 80)], &node());
        let rs = render(&ports, &cfg());
        assert_eq!(rs.sets.len(), 1);
        assert_eq!(*rs.sets.values().next().unwrap(), 10800);
        let svc = &rs.chains[&service_chain(&ports[0])];
        assert!(svc[1].to_string().starts_with("ip saddr @affinity-"));
        let full = script(None, &ports).unwrap();
        assert!(full.contains("flags dynamic,timeout ; timeout 10800s"));
    }

    #[test]
    fn first_script_replaces_the_table_then_updates_are_incremental() {
        let svcs = [simple_service("a", "10.96.0.1", 80), simple_service("b", "10.96.0.2", 80)];
        let one = service_ports(
            &svcs,
            &[simple_slice("a", &["10.0.0.1"], 80), simple_slice("b", &["10.0.0.2"], 80)],
            &node(),
        );
        let full = script(None, &one).unwrap();
        assert!(full.starts_with("add table ip kube-proxy\ndelete table ip kube-proxy\ntable ip kube-proxy {"));
        assert!(script(Some(&one), &one).is_none());

        // b loses its endpoint: its map element moves to no-endpoint-services, its chains go.
        let two = service_ports(&svcs, &[simple_slice("a", &["10.0.0.1"], 80)], &node());
        let inc = script(Some(&one), &two).unwrap();
        assert!(!inc.contains("table ip kube-proxy {"));
        assert!(inc.contains("delete element ip kube-proxy service-ips { 10.96.0.2 . tcp . 80 }"));
        assert!(
            inc.contains("add element ip kube-proxy no-endpoint-services { 10.96.0.2 . tcp . 80 : goto reject-chain }")
        );
        assert!(inc.contains("delete chain ip kube-proxy service-"));
        assert!(!inc.contains("-default/a/"), "a untouched:\n{inc}");
        let del = inc.find("delete element ip kube-proxy service-ips").unwrap();
        assert!(del < inc.find("delete chain").unwrap(), "map elements go before the chains they point to");
    }

    #[test]
    fn external_policy_local_and_no_local_endpoints_drop() {
        let s = svc(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "externalTrafficPolicy": "Local",
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}));
        let mut sl = simple_slice("web", &["10.244.1.1"], 80);
        sl.endpoints.as_mut().unwrap()[0].node_name = Some("node-b".into());
        let rs = render(&service_ports(&[s], &[sl], &node()), &cfg());
        assert_eq!(rs.maps[MAP_NO_ENDPOINT_NODEPORTS]["tcp . 30080"], "drop");
        assert!(rs.maps[MAP_SERVICE_IPS].contains_key("10.96.0.10 . tcp . 80"), "cluster traffic still served");
    }

    #[test]
    fn nodeport_addresses_in_base_script() {
        let c = Config { nodeport_addresses: vec!["192.168.1.10".parse().unwrap()], ..cfg() };
        assert!(base_script(&c).contains("ip daddr { 192.168.1.10 } meta l4proto . th dport vmap @service-nodeports"));
        assert!(base_script(&cfg()).contains("fib daddr type local meta l4proto . th dport vmap @service-nodeports"));
    }

    #[test]
    fn source_ranges_guard_load_balancer_ips_before_dnat() {
        let s = svc(json!({"metadata": {"name": "lb", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.20", "externalIPs": ["192.0.2.1"],
                     "loadBalancerSourceRanges": ["203.0.113.0/24", "192.168.0.0/16"],
                     "ports": [{"name": "http", "port": 80, "nodePort": 30081}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}}));
        let node = NodeInfo { name: "node-a".into(), ip: Some("192.168.1.10".parse().unwrap()) };
        let ports = service_ports(std::slice::from_ref(&s), &[simple_slice("lb", &["10.244.1.1"], 80)], &node);
        let rs = render(&ports, &cfg());
        let fw = firewall_chain(&ports[0]);
        assert!(fw.starts_with("firewall-") && fw.ends_with("-default/lb/tcp/http"), "{fw}");
        assert_eq!(rs.maps[MAP_FIREWALL_IPS].len(), 1, "only load balancer IPs, not external IPs");
        assert_eq!(rs.maps[MAP_FIREWALL_IPS]["198.51.100.7 . tcp . 80"], format!("goto {fw}"));
        assert_eq!(text(&rs.chains[&fw]), ["ip saddr != { 203.0.113.0/24, 192.168.0.0/16, 198.51.100.7/32 } drop"]);
        // The LB IP is still served through the external chain once past the firewall.
        assert_eq!(rs.maps[MAP_SERVICE_IPS]["198.51.100.7 . tcp . 80"], format!("goto {}", external_chain(&ports[0])));

        // The node outside the ranges: only the ranges; and the firewall stays without endpoints.
        let rs = render(&service_ports(std::slice::from_ref(&s), &[], &NodeInfo::named("node-a")), &cfg());
        assert_eq!(text(&rs.chains[&fw]), ["ip saddr != { 203.0.113.0/24, 192.168.0.0/16 } drop"]);

        // Removing the ranges removes the chain and the map element.
        let mut open = s;
        open.spec.as_mut().unwrap().load_balancer_source_ranges = None;
        let after = service_ports(&[open], &[simple_slice("lb", &["10.244.1.1"], 80)], &node);
        let inc = script(Some(&ports), &after).unwrap();
        assert!(inc.contains("delete element ip kube-proxy firewall-ips { 198.51.100.7 . tcp . 80 }"), "{inc}");
        assert!(inc.contains(&format!("delete chain ip kube-proxy {fw}")), "{inc}");
    }

    #[test]
    fn the_firewall_check_runs_before_dnat_for_new_connections() {
        let base = base_script(&cfg());
        let prerouting = &base[base.find("chain filter-prerouting {").unwrap()..];
        assert!(prerouting.contains("type filter hook prerouting priority -110;"));
        assert!(prerouting.contains("ct state new jump firewall-check"));
        let output = &base[base.find("chain filter-output {").unwrap()..];
        assert!(output[..output.find('}').unwrap()].contains("ct state new jump firewall-check"));
        assert!(base.contains("ip daddr . meta l4proto . th dport vmap @firewall-ips"));
    }

    #[test]
    fn a_sync_renders_only_changed_ports_and_keeps_what_another_port_still_needs() {
        // a and b share an endpoint (one hairpin element); c and d share an external IP.
        let ext = |name: &str, ip: &str| {
            svc(json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"clusterIP": ip, "externalIPs": ["192.0.2.9"], "ports": [{"name": "http", "port": 80}]}}))
        };
        let svcs = [
            simple_service("a", "10.96.0.1", 80),
            simple_service("b", "10.96.0.2", 80),
            ext("c", "10.96.0.3"),
            ext("d", "10.96.0.4"),
        ];
        let slices = [
            simple_slice("a", &["10.0.0.1"], 80),
            simple_slice("b", &["10.0.0.1"], 80),
            simple_slice("c", &["10.0.0.3"], 80),
            simple_slice("d", &["10.0.0.4"], 80),
        ];
        let all = service_ports(&svcs, &slices, &node());
        let mut table = Table::default();
        let full = table.sync(&arcs(&all), &cfg()).unwrap();
        assert!(full.full);
        assert_eq!(table.rule_count(), render(&all, &cfg()).rule_count());
        assert!(table.sync(&arcs(&all), &cfg()).is_none(), "nothing changed");

        // a and c go: the shared hairpin element and the external IP's key stay, now d's.
        let fewer: Vec<ServicePort> =
            all.iter().filter(|p| !["a", "c"].contains(&p.name.name.as_str())).cloned().collect();
        let tx = table.sync(&arcs(&fewer), &cfg()).unwrap();
        assert!(!tx.full);
        let script = tx.script(&cfg());
        assert!(!script.contains("10.0.0.1 . 10.0.0.1"), "b still needs the hairpin element:\n{script}");
        let d_ext = external_chain(&fewer.iter().find(|p| p.name.name == "d").unwrap().clone());
        // (c came first, so its verdict was programmed.)
        assert!(
            script.contains(&format!(
                "delete element ip kube-proxy service-ips {{ 192.0.2.9 . tcp . 80 }}\nadd element ip kube-proxy service-ips {{ 192.0.2.9 . tcp . 80 : goto {d_ext} }}"
            )),
            "the external IP goes to d's chain:\n{script}"
        );
        assert_eq!(table.rule_count(), render(&fewer, &cfg()).rule_count());
        // Every op of an endpoint or Service change is one netlink encodes.
        assert!(crate::nft_netlink::encode(&tx.ops).is_some(), "{script}");

        // b goes too: now the element goes.
        let only_d: Vec<ServicePort> = fewer.iter().filter(|p| p.name.name == "d").cloned().collect();
        let script = table.sync(&arcs(&only_d), &cfg()).unwrap().script(&cfg());
        assert!(script.contains("delete element ip kube-proxy endpoint-hairpin { 10.0.0.1 . 10.0.0.1 }"), "{script}");
        assert!(!script.contains("192.0.2.9"), "d keeps its external IP:\n{script}");
        assert_eq!(table.rule_count(), render(&only_d, &cfg()).rule_count());
    }
}
