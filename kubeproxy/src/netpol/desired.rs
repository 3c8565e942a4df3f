//! NetworkPolicies, Pods and Namespaces → the filter this node must enforce (pure).
//!
//! Kubernetes' rules (`networking.k8s.io/v1`):
//! - A pod is isolated for ingress when some policy in its namespace selects it and has
//!   `Ingress` among its `policyTypes` (the default when `policyTypes` is absent); for egress
//!   when one has `Egress` (the default only when the policy has egress rules). A pod no
//!   policy isolates is not filtered at all.
//! - Traffic to an isolated pod is allowed when any rule of any policy selecting it allows it
//!   (policies add up, they never subtract); everything else is dropped. A connection is
//!   checked when it opens, for the source's egress and the destination's ingress; replies
//!   follow the connection.
//! - A rule allows a peer (`from`/`to`) on a port (`ports`); an absent or empty list allows
//!   every peer or every port. A peer is a pod selector (in the policy's namespace), a
//!   namespace selector (every pod of the matching namespaces), both (those pods of those
//!   namespaces), or an `ipBlock` (a CIDR less its `except`s).
//! - A port is a number, a range (`endPort`) or a container port's name, with a protocol
//!   (TCP by default). A name is the destination pod's port: for ingress the selected pod's
//!   own, for egress each peer pod's.
//!
//! The result is what the nftables renderer ([`super::render`]) needs: one IP set per peer
//! selector (a new pod only adds an element), one set of `ip . protocol . port` per named port
//! of an egress rule, one chain per distinct rule list (replicas that the same policies select
//! share a chain, named after its content), and the maps from an isolated pod's IP to its
//! chains.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::rc::Rc;

use apimachinery::labels::Selector;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use crate::model::Cidr;

/// A transport protocol a policy port names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    /// Kubernetes' protocol names; TCP when absent.
    pub fn parse(s: Option<&str>) -> Option<Proto> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Proto::Tcp),
            "UDP" => Some(Proto::Udp),
            "SCTP" => Some(Proto::Sctp),
            _ => None,
        }
    }

    /// nftables' name of the protocol.
    pub fn nft(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }
}

/// What the filter needs of a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ip: Ipv4Addr,
    /// Named container ports: (name, protocol, number).
    pub ports: Vec<(String, Proto, u16)>,
}

impl PodInfo {
    /// The pods policies see: those with an IPv4 pod IP of their own (not the node's:
    /// `hostNetwork` pods are neither selected nor peers) that have not finished.
    pub fn of(pod: &Pod) -> Option<PodInfo> {
        let spec = pod.spec.as_ref()?;
        if spec.host_network == Some(true) {
            return None;
        }
        let status = pod.status.as_ref()?;
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return None;
        }
        let ip: Ipv4Addr = status
            .pod_ips
            .iter()
            .flatten()
            .map(|p| p.ip.as_str())
            .chain(status.pod_ip.as_deref())
            .find_map(|s| s.parse().ok())?;
        let ports = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let name = p.name.clone()?;
                let proto = Proto::parse(p.protocol.as_deref())?;
                Some((name, proto, u16::try_from(p.container_port).ok()?))
            })
            .collect();
        Some(PodInfo {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ip,
            ports,
        })
    }

    fn named_port(&self, name: &str, proto: Proto) -> Option<u16> {
        self.ports.iter().find(|(n, p, _)| n == name && *p == proto).map(|(_, _, n)| *n)
    }
}

/// The filter this node programs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    /// `peer-…` sets: the pod IPs a peer selector selects.
    pub peers: BTreeMap<String, BTreeSet<Ipv4Addr>>,
    /// `port-…` sets: `ip . protocol . port` of the pods that have an egress rule's named
    /// port (among the rule's peers).
    pub named: BTreeMap<String, BTreeSet<(Ipv4Addr, Proto, u16)>>,
    /// Per-pod chains by name: their rules, in order (the last drops).
    pub chains: BTreeMap<String, Vec<String>>,
    /// Isolated pods' IPs → their ingress chain.
    pub ingress: BTreeMap<Ipv4Addr, String>,
    /// Isolated pods' IPs → their egress chain.
    pub egress: BTreeMap<Ipv4Addr, String>,
}

/// A problem with one policy, reported and otherwise ignored (the apiserver validates
/// policies, so this is only what slipped past it).
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub policy: String,
    pub message: String,
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    fn addr(self) -> &'static str {
        match self {
            Direction::Ingress => "ip saddr",
            Direction::Egress => "ip daddr",
        }
    }

    /// What an allowing rule does: ingress is the last check, egress goes on to the
    /// destination's ingress.
    fn verdict(self) -> &'static str {
        match self {
            Direction::Ingress => "accept",
            Direction::Egress => "return",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress-",
            Direction::Egress => "egress-",
        }
    }
}

/// A peer, resolved.
enum Peer {
    /// Every source or destination.
    Any,
    /// The pods a selector pair selects: a set's name, and the pods.
    Pods(String, Rc<Vec<usize>>),
    /// A CIDR less its exceptions.
    Block(Cidr, Vec<Cidr>),
}

/// A policy port, resolved as far as it can be without knowing the destination pod.
enum Port {
    Any,
    Proto(Proto),
    Range(Proto, u16, u16),
    Named(Proto, String),
}

/// One rule of a policy with its peers resolved: every peer × every port is allowed.
type Rule = (Vec<Rc<Peer>>, Vec<Port>);

struct Compiled<'a> {
    namespace: &'a str,
    selector: Selector,
    /// The ingress rules, when the policy isolates for ingress.
    ingress: Option<Vec<Rule>>,
    /// The egress rules, when it isolates for egress.
    egress: Option<Vec<Rule>>,
}

/// Compute the filter. Pods and namespaces are everything the node's caches hold; the
/// policies too. Each policy's peers are resolved once (a peer selector shared by several
/// policies once for all), then each pod gets the rules of the policies selecting it.
pub fn compute(
    policies: &[&NetworkPolicy],
    pods: &[PodInfo],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> (Desired, Vec<Problem>) {
    let mut by_namespace: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, pod) in pods.iter().enumerate() {
        by_namespace.entry(pod.namespace.as_str()).or_default().push(i);
    }
    let mut b = Builder {
        pods,
        namespaces,
        by_namespace,
        peers: HashMap::new(),
        desired: Desired::default(),
        problems: Vec::new(),
    };
    let mut sorted: Vec<&NetworkPolicy> = policies.to_vec();
    sorted.sort_by(|a, b| (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name)));
    let mut compiled: Vec<Compiled> = Vec::new();
    for p in sorted {
        let namespace = p.metadata.namespace.as_deref().unwrap_or("default");
        let key = format!("{namespace}/{}", p.metadata.name.as_deref().unwrap_or(""));
        let Some(spec) = p.spec.as_ref() else { continue };
        // An absent podSelector is the empty one: every pod of the namespace.
        let selector =
            match spec.pod_selector.as_ref().map_or(Ok(Selector::everything()), Selector::from_label_selector) {
                Ok(s) => s,
                Err(e) => {
                    b.problems.push(Problem { policy: key, message: format!("spec.podSelector: {e}") });
                    continue;
                }
            };
        let (ingress, egress) = match &spec.policy_types {
            Some(types) => (types.iter().any(|t| t == "Ingress"), types.iter().any(|t| t == "Egress")),
            None => (true, spec.egress.as_ref().is_some_and(|e| !e.is_empty())),
        };
        let ingress = ingress.then(|| {
            let raw = spec.ingress.iter().flatten().enumerate();
            let raw: Vec<RawRule> =
                raw.map(|(i, r)| (r.from.as_ref(), r.ports.as_ref(), format!("spec.ingress[{i}]"))).collect();
            b.resolve(&key, namespace, Direction::Ingress, raw)
        });
        let egress = egress.then(|| {
            let raw = spec.egress.iter().flatten().enumerate();
            let raw: Vec<RawRule> =
                raw.map(|(i, r)| (r.to.as_ref(), r.ports.as_ref(), format!("spec.egress[{i}]"))).collect();
            b.resolve(&key, namespace, Direction::Egress, raw)
        });
        compiled.push(Compiled { namespace, selector, ingress, egress });
    }
    let mut in_namespace: BTreeMap<&str, Vec<&Compiled>> = BTreeMap::new();
    for c in &compiled {
        in_namespace.entry(c.namespace).or_default().push(c);
    }

    for (i, pod) in pods.iter().enumerate() {
        let Some(candidates) = in_namespace.get(pod.namespace.as_str()) else { continue };
        let selecting: Vec<&&Compiled> = candidates.iter().filter(|c| c.selector.matches(&pod.labels)).collect();
        for dir in [Direction::Ingress, Direction::Egress] {
            let applying: Vec<&Vec<Rule>> = selecting
                .iter()
                .filter_map(|c| match dir {
                    Direction::Ingress => c.ingress.as_ref(),
                    Direction::Egress => c.egress.as_ref(),
                })
                .collect();
            if applying.is_empty() {
                continue;
            }
            let mut rules: Vec<String> = Vec::new();
            for policy_rules in applying {
                for (peers, ports) in policy_rules {
                    for peer in peers {
                        for port in ports {
                            if let Some(rule) = b.rule(dir, peer, port, i) {
                                if !rules.contains(&rule) {
                                    rules.push(rule);
                                }
                            }
                        }
                    }
                }
            }
            rules.push("drop".to_string());
            let chain = format!("{}{}", dir.prefix(), short_hash(&rules.join("\n")));
            b.desired.chains.entry(chain.clone()).or_insert(rules);
            match dir {
                Direction::Ingress => b.desired.ingress.insert(pod.ip, chain),
                Direction::Egress => b.desired.egress.insert(pod.ip, chain),
            };
        }
    }
    (b.desired, b.problems)
}

/// A rule's peers (`from`/`to`), ports and field path.
type RawRule<'a> = (Option<&'a Vec<NetworkPolicyPeer>>, Option<&'a Vec<NetworkPolicyPort>>, String);

struct Builder<'a> {
    pods: &'a [PodInfo],
    namespaces: &'a BTreeMap<String, BTreeMap<String, String>>,
    /// Pod indexes by namespace.
    by_namespace: BTreeMap<&'a str, Vec<usize>>,
    /// Peer selectors resolved so far, by set name.
    peers: HashMap<String, Rc<Peer>>,
    desired: Desired,
    problems: Vec<Problem>,
}

impl Builder<'_> {
    /// A policy's rules in one direction with their peers and ports resolved.
    fn resolve(&mut self, key: &str, namespace: &str, dir: Direction, raw: Vec<RawRule>) -> Vec<Rule> {
        let mut out = Vec::new();
        for (peers, ports, path) in raw {
            let peers: Vec<Rc<Peer>> = match peers.filter(|p| !p.is_empty()) {
                None => vec![Rc::new(Peer::Any)],
                Some(list) => list
                    .iter()
                    .enumerate()
                    .filter_map(|(j, p)| self.peer(key, namespace, p, &format!("{path}.{}[{j}]", from_or_to(dir))))
                    .collect(),
            };
            let ports: Vec<Port> = match ports.filter(|p| !p.is_empty()) {
                None => vec![Port::Any],
                Some(list) => list
                    .iter()
                    .enumerate()
                    .filter_map(|(j, p)| self.port(key, p, &format!("{path}.ports[{j}]")))
                    .collect(),
            };
            out.push((peers, ports));
        }
        out
    }

    fn problem(&mut self, key: &str, message: String) {
        self.problems.push(Problem { policy: key.to_string(), message });
    }

    fn peer(&mut self, key: &str, namespace: &str, p: &NetworkPolicyPeer, path: &str) -> Option<Rc<Peer>> {
        if let Some(block) = &p.ip_block {
            return self.block(key, block, path).map(Rc::new);
        }
        let pod_sel = match p.pod_selector.as_ref().map(Selector::from_label_selector).transpose() {
            Ok(s) => s,
            Err(e) => {
                self.problem(key, format!("{path}.podSelector: {e}"));
                return None;
            }
        };
        let ns_sel = match p.namespace_selector.as_ref().map(Selector::from_label_selector).transpose() {
            Ok(s) => s,
            Err(e) => {
                self.problem(key, format!("{path}.namespaceSelector: {e}"));
                return None;
            }
        };
        if pod_sel.is_none() && ns_sel.is_none() {
            self.problem(key, format!("{path}: must specify a peer"));
            return None;
        }
        // The set is named after what selects, so policies with the same peer share it.
        let scope = match &ns_sel {
            None => format!("namespace={namespace}"),
            Some(s) => format!("namespaces={s}"),
        };
        let shown = pod_sel.as_ref().map(|s| s.to_string()).unwrap_or_else(|| "*".into());
        let name = format!("peer-{}", short_hash(&format!("{scope}|pods={shown}")));
        if let Some(found) = self.peers.get(&name) {
            return Some(found.clone());
        }
        let no_labels = BTreeMap::new();
        let mut selected: Vec<usize> = Vec::new();
        for (ns, members) in &self.by_namespace {
            let in_scope = match &ns_sel {
                None => *ns == namespace,
                Some(s) => s.matches(self.namespaces.get(*ns).unwrap_or(&no_labels)),
            };
            if in_scope {
                selected.extend(
                    members.iter().filter(|i| pod_sel.as_ref().is_none_or(|s| s.matches(&self.pods[**i].labels))),
                );
            }
        }
        self.desired.peers.insert(name.clone(), selected.iter().map(|i| self.pods[*i].ip).collect());
        let peer = Rc::new(Peer::Pods(name.clone(), Rc::new(selected)));
        self.peers.insert(name, peer.clone());
        Some(peer)
    }

    fn block(&mut self, key: &str, block: &IPBlock, path: &str) -> Option<Peer> {
        if block.cidr.contains(':') {
            return None; // IPv6: this cluster's pods have IPv4 addresses only.
        }
        let Some(cidr) = Cidr::parse(&block.cidr) else {
            self.problem(key, format!("{path}.ipBlock.cidr: {:?} is not a CIDR", block.cidr));
            return None;
        };
        let mut except = Vec::new();
        for e in block.except.iter().flatten().filter(|e| !e.contains(':')) {
            match Cidr::parse(e) {
                Some(x) => except.push(x),
                None => self.problem(key, format!("{path}.ipBlock.except: {e:?} is not a CIDR")),
            }
        }
        Some(Peer::Block(cidr, except))
    }

    fn port(&mut self, key: &str, p: &NetworkPolicyPort, path: &str) -> Option<Port> {
        let Some(proto) = Proto::parse(p.protocol.as_deref()) else {
            self.problem(key, format!("{path}.protocol: unsupported {:?}", p.protocol));
            return None;
        };
        match &p.port {
            None => Some(Port::Proto(proto)),
            Some(IntOrString::String(name)) => Some(Port::Named(proto, name.clone())),
            Some(IntOrString::Int(n)) => {
                let Ok(from) = u16::try_from(*n) else {
                    self.problem(key, format!("{path}.port: {n} is out of range"));
                    return None;
                };
                let to = match p.end_port {
                    Some(e) => u16::try_from(e).ok().filter(|e| *e >= from)?,
                    None => from,
                };
                Some(Port::Range(proto, from, to))
            }
        }
    }

    /// One rule; `None` when the combination matches nothing (a named port this pod does
    /// not have).
    fn rule(&mut self, dir: Direction, peer: &Peer, port: &Port, pod: usize) -> Option<String> {
        let addr = dir.addr();
        let verdict = dir.verdict();
        // An egress rule's named port is each destination's: one set of (ip, proto, port),
        // the same for every pod the rule applies to.
        if let (Direction::Egress, Port::Named(proto, name)) = (dir, port) {
            let peer_key = match peer {
                Peer::Any => "*".to_string(),
                Peer::Pods(set, _) => set.clone(),
                Peer::Block(cidr, except) => format!("{cidr}-{}", cidrs(except)),
            };
            let set = format!("port-{}", short_hash(&format!("{peer_key}|{}|{name}", proto.nft())));
            if !self.desired.named.contains_key(&set) {
                let has = |i: &usize| self.pods[*i].named_port(name, *proto).map(|n| (self.pods[*i].ip, *proto, n));
                let elements: BTreeSet<(Ipv4Addr, Proto, u16)> = match peer {
                    Peer::Any => (0..self.pods.len()).filter_map(|i| has(&i)).collect(),
                    Peer::Pods(_, pods) => pods.iter().filter_map(has).collect(),
                    Peer::Block(cidr, except) => (0..self.pods.len())
                        .filter(|i| in_block(self.pods[*i].ip, cidr, except))
                        .filter_map(|i| has(&i))
                        .collect(),
                };
                self.desired.named.insert(set.clone(), elements);
            }
            return Some(format!("ip daddr . meta l4proto . th dport @{set} {verdict}"));
        }
        let peer_match = match peer {
            Peer::Any => String::new(),
            Peer::Pods(set, _) => format!("{addr} @{set} "),
            Peer::Block(cidr, except) if except.is_empty() => format!("{addr} {cidr} "),
            Peer::Block(cidr, except) => format!("{addr} {cidr} {addr} != {{ {} }} ", cidrs(except)),
        };
        let port_match = match port {
            Port::Any => String::new(),
            Port::Proto(p) => format!("meta l4proto {} ", p.nft()),
            Port::Range(p, from, to) if from == to => format!("{} dport {from} ", p.nft()),
            Port::Range(p, from, to) => format!("{} dport {from}-{to} ", p.nft()),
            // Ingress: the selected pod's own port of that name.
            Port::Named(p, name) => format!("{} dport {} ", p.nft(), self.pods[pod].named_port(name, *p)?),
        };
        Some(format!("{peer_match}{port_match}{verdict}"))
    }
}

fn from_or_to(dir: Direction) -> &'static str {
    match dir {
        Direction::Ingress => "from",
        Direction::Egress => "to",
    }
}

fn in_block(ip: Ipv4Addr, cidr: &Cidr, except: &[Cidr]) -> bool {
    cidr.contains(ip) && !except.iter().any(|e| e.contains(ip))
}

fn cidrs(list: &[Cidr]) -> String {
    list.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
}

/// 16 hex digits of SHA-256: short, stable names for sets and chains.
fn short_hash(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Namespaces' labels by name, with the `kubernetes.io/metadata.name` label Kubernetes
/// sets on every namespace (so a selector on it works even where the label was not stored).
pub fn namespace_labels<'a>(
    namespaces: impl Iterator<Item = &'a Namespace>,
) -> BTreeMap<String, BTreeMap<String, String>> {
    namespaces
        .filter_map(|ns| {
            let name = ns.metadata.name.clone()?;
            let mut labels = ns.metadata.labels.clone().unwrap_or_default();
            labels.entry("kubernetes.io/metadata.name".into()).or_insert_with(|| name.clone());
            Some((name, labels))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub fn pod(ns: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ip: ip.parse().unwrap(),
            ports: Vec::new(),
        }
    }

    pub fn policy(ns: &str, name: &str, spec: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap()
    }

    pub fn namespaces(list: &[(&str, &[(&str, &str)])]) -> BTreeMap<String, BTreeMap<String, String>> {
        let objs: Vec<Namespace> = list
            .iter()
            .map(|(n, labels)| {
                let labels: BTreeMap<String, String> =
                    labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
                serde_json::from_value(json!({"metadata": {"name": n, "labels": labels}})).unwrap()
            })
            .collect();
        namespace_labels(objs.iter())
    }

    fn run(policies: &[NetworkPolicy], pods: &[PodInfo], ns: &BTreeMap<String, BTreeMap<String, String>>) -> Desired {
        let refs: Vec<&NetworkPolicy> = policies.iter().collect();
        let (d, problems) = compute(&refs, pods, ns);
        assert!(problems.is_empty(), "{problems:?}");
        d
    }

    fn chain_of<'a>(d: &'a Desired, map: &BTreeMap<Ipv4Addr, String>, ip: &str) -> &'a [String] {
        let name = &map[&ip.parse::<Ipv4Addr>().unwrap()];
        &d.chains[name]
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn no_policy_isolates_nothing() {
        let pods = [pod("a", "x", "10.244.0.2", &[("app", "x")])];
        let d = run(&[], &pods, &namespaces(&[("a", &[])]));
        assert_eq!(d, Desired::default());
    }

    #[test]
    fn default_deny_ingress_selects_every_pod_of_its_namespace_only() {
        let pods = [pod("a", "x", "10.244.0.2", &[("app", "x")]), pod("b", "y", "10.244.0.3", &[])];
        let deny = policy("a", "deny", json!({"podSelector": {}}));
        let d = run(&[deny], &pods, &namespaces(&[("a", &[]), ("b", &[])]));
        assert_eq!(d.ingress.keys().copied().collect::<Vec<_>>(), [ip("10.244.0.2")]);
        assert!(d.egress.is_empty(), "policyTypes default to Ingress without egress rules");
        assert_eq!(chain_of(&d, &d.ingress, "10.244.0.2"), ["drop"]);
    }

    #[test]
    fn a_pod_selector_peer_is_a_set_of_that_namespaces_matching_pods() {
        let pods = [
            pod("a", "server", "10.244.0.2", &[("app", "server")]),
            pod("a", "client", "10.244.0.3", &[("app", "client")]),
            pod("b", "client", "10.244.0.4", &[("app", "client")]),
        ];
        let p = policy(
            "a",
            "allow-client",
            json!({"podSelector": {"matchLabels": {"app": "server"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                                "ports": [{"port": 80}, {"protocol": "UDP", "port": 53, "endPort": 60}]}]}),
        );
        let d = run(&[p], &pods, &namespaces(&[("a", &[]), ("b", &[])]));
        let (set, members) = d.peers.iter().next().unwrap();
        assert_eq!(members.iter().copied().collect::<Vec<_>>(), [ip("10.244.0.3")], "not b's client");
        assert_eq!(
            chain_of(&d, &d.ingress, "10.244.0.2"),
            [
                format!("ip saddr @{set} tcp dport 80 accept"),
                format!("ip saddr @{set} udp dport 53-60 accept"),
                "drop".into()
            ]
        );
        assert_eq!(d.ingress.len(), 1);
    }

    #[test]
    fn namespace_selectors_alone_and_with_a_pod_selector() {
        let pods = [
            pod("a", "server", "10.244.0.2", &[("app", "server")]),
            pod("dev", "c1", "10.244.0.3", &[("app", "client")]),
            pod("dev", "other", "10.244.0.4", &[]),
            pod("prod", "c2", "10.244.0.5", &[("app", "client")]),
        ];
        let ns = namespaces(&[("a", &[]), ("dev", &[("team", "x")]), ("prod", &[])]);
        let only_ns = policy(
            "a",
            "from-dev",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}]}]}),
        );
        let d = run(&[only_ns], &pods, &ns);
        assert_eq!(
            d.peers.values().next().unwrap().iter().copied().collect::<Vec<_>>(),
            [ip("10.244.0.3"), ip("10.244.0.4")]
        );
        let both = policy(
            "a",
            "from-dev-clients",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "x"}},
                                                             "podSelector": {"matchLabels": {"app": "client"}}}]}]}),
        );
        let d = run(&[both], &pods, &ns);
        assert_eq!(d.peers.values().next().unwrap().iter().copied().collect::<Vec<_>>(), [ip("10.244.0.3")]);
        // Kubernetes' own namespace label selects by name.
        let by_name = policy(
            "a",
            "from-prod",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "prod"}}}]}]}),
        );
        let d = run(&[by_name], &pods, &ns);
        assert_eq!(d.peers.values().next().unwrap().iter().copied().collect::<Vec<_>>(), [ip("10.244.0.5")]);
    }

    #[test]
    fn policies_add_up_and_replicas_share_a_chain() {
        let pods = [
            pod("a", "web-1", "10.244.0.2", &[("app", "web")]),
            pod("a", "web-2", "10.244.1.2", &[("app", "web")]),
            pod("a", "db", "10.244.0.9", &[("app", "db")]),
        ];
        let web = json!({"matchLabels": {"app": "web"}});
        let p1 = policy("a", "p1", json!({"podSelector": web, "ingress": [{"ports": [{"port": 80}]}]}));
        let p2 = policy(
            "a",
            "p2",
            json!({"podSelector": web, "ingress": [{"from": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]}}]}]}),
        );
        let d = run(&[p2, p1], &pods, &namespaces(&[("a", &[])]));
        assert_eq!(d.ingress[&ip("10.244.0.2")], d.ingress[&ip("10.244.1.2")], "one chain for both replicas");
        assert_eq!(d.chains.len(), 1);
        assert_eq!(
            chain_of(&d, &d.ingress, "10.244.0.2"),
            ["tcp dport 80 accept", "ip saddr 192.168.0.0/16 ip saddr != { 192.168.1.0/24 } accept", "drop"],
            "in policy name order"
        );
        assert!(!d.ingress.contains_key(&ip("10.244.0.9")));
    }

    #[test]
    fn egress_rules_return_to_the_ingress_check_and_default_the_type() {
        let pods = [pod("a", "x", "10.244.0.2", &[]), pod("a", "y", "10.244.0.3", &[])];
        let p = policy(
            "a",
            "dns-only",
            json!({"podSelector": {}, "egress": [{"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]}),
        );
        let d = run(&[p], &pods, &namespaces(&[("a", &[])]));
        assert!(d.ingress.contains_key(&ip("10.244.0.2")), "Ingress is always among the default types");
        assert_eq!(chain_of(&d, &d.ingress, "10.244.0.2"), ["drop"]);
        assert_eq!(chain_of(&d, &d.egress, "10.244.0.2"), ["udp dport 53 return", "tcp dport 53 return", "drop"]);
        let only_egress = policy("a", "deny-egress", json!({"podSelector": {}, "policyTypes": ["Egress"]}));
        let d = run(&[only_egress], &pods, &namespaces(&[("a", &[])]));
        assert!(d.ingress.is_empty());
        assert_eq!(chain_of(&d, &d.egress, "10.244.0.3"), ["drop"]);
    }

    #[test]
    fn named_ports_are_the_destinations() {
        let mut server = pod("a", "server", "10.244.0.2", &[("app", "server")]);
        server.ports = vec![("http".into(), Proto::Tcp, 8080)];
        let mut other = pod("a", "other", "10.244.0.4", &[("app", "server")]);
        other.ports = vec![("http".into(), Proto::Tcp, 9090)];
        let client = pod("a", "client", "10.244.0.3", &[("app", "client")]);
        let pods = [server, other, client];
        let ingress = policy(
            "a",
            "in",
            json!({"podSelector": {"matchLabels": {"app": "server"}}, "ingress": [{"ports": [{"port": "http"}, {"port": "dns", "protocol": "UDP"}]}]}),
        );
        let egress = policy(
            "a",
            "out",
            json!({"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "server"}}}], "ports": [{"port": "http"}]}]}),
        );
        let d = run(&[ingress, egress], &pods, &namespaces(&[("a", &[])]));
        // Each server's own number; the UDP name no pod has matches nothing.
        assert_eq!(chain_of(&d, &d.ingress, "10.244.0.2"), ["tcp dport 8080 accept", "drop"]);
        assert_eq!(chain_of(&d, &d.ingress, "10.244.0.4"), ["tcp dport 9090 accept", "drop"]);
        let (set, elements) = d.named.iter().next().unwrap();
        assert_eq!(
            elements.iter().copied().collect::<Vec<_>>(),
            [(ip("10.244.0.2"), Proto::Tcp, 8080), (ip("10.244.0.4"), Proto::Tcp, 9090)]
        );
        assert_eq!(
            chain_of(&d, &d.egress, "10.244.0.3"),
            [format!("ip daddr . meta l4proto . th dport @{set} return"), "drop".into()]
        );
    }

    #[test]
    fn bad_parts_are_reported_and_the_rest_enforced() {
        let pods = [pod("a", "x", "10.244.0.2", &[])];
        let p = policy(
            "a",
            "half-bad",
            json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "nonsense"}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}]}]}),
        );
        let (d, problems) = compute(&[&p], &pods, &namespaces(&[("a", &[])]));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].policy, "a/half-bad");
        assert!(problems[0].message.starts_with("spec.ingress[0].from[0].ipBlock.cidr"), "{problems:?}");
        assert_eq!(chain_of(&d, &d.ingress, "10.244.0.2"), ["ip saddr 10.0.0.0/8 accept", "drop"]);
    }

    #[test]
    fn pods_without_their_own_ip_or_finished_are_left_out() {
        let base = json!({"metadata": {"namespace": "a", "name": "p", "labels": {"app": "x"}},
                          "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"name": "http", "containerPort": 80}]}]},
                          "status": {"phase": "Running", "podIP": "10.244.0.7", "podIPs": [{"ip": "10.244.0.7"}]}});
        let running: Pod = serde_json::from_value(base.clone()).unwrap();
        let info = PodInfo::of(&running).unwrap();
        assert_eq!((info.ip, info.ports.clone()), (ip("10.244.0.7"), vec![("http".into(), Proto::Tcp, 80)]));
        let mut host = base.clone();
        host["spec"]["hostNetwork"] = json!(true);
        assert!(PodInfo::of(&serde_json::from_value(host).unwrap()).is_none());
        let mut done = base.clone();
        done["status"]["phase"] = json!("Succeeded");
        assert!(PodInfo::of(&serde_json::from_value(done).unwrap()).is_none());
        let mut pending = base;
        pending["status"] = json!({"phase": "Pending"});
        assert!(PodInfo::of(&serde_json::from_value(pending).unwrap()).is_none());
    }
}
