//! [`Desired`] → `nft -f` input (pure): the whole table at start or after a failure, and
//! afterwards only what changed — set elements for pods that come and go, new chains for new
//! rule lists, map elements for pods that become or stop being isolated.
//!
//! The table, `ip minik8s-netpol`:
//! ```text
//! chain forward { type filter hook forward priority filter; policy accept;
//!     ct state established,related accept
//!     ip saddr vmap @egress-pods      # isolated source: its egress chain (allowed → return)
//!     ip daddr vmap @ingress-pods }   # isolated destination: its ingress chain (allowed → accept)
//! chain input { type filter hook input priority filter; policy accept;
//!     ct state established,related accept
//!     ip saddr vmap @egress-pods }    # a pod's egress to this node (its DNS, node ports)
//! ```
//! Each per-pod chain ends in `drop`. Traffic from the node to its pods (probes) leaves
//! through `output` and is not filtered, as Kubernetes requires.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::net::Ipv4Addr;

use super::desired::{Desired, Proto};

/// The table's family and name.
pub const TABLE: &str = "ip minik8s-netpol";

const BASE: &str = "type filter hook forward priority filter; policy accept;";
const INPUT: &str = "type filter hook input priority filter; policy accept;";

/// The script that replaces whatever table is there with `d`, in one transaction.
pub fn full(d: &Desired) -> String {
    let mut s = String::new();
    // `add` first so that `delete` never fails on a missing table.
    let _ = writeln!(s, "add table {TABLE}\ndelete table {TABLE}\nadd table {TABLE}");
    let _ = writeln!(s, "add map {TABLE} ingress-pods {{ type ipv4_addr : verdict; }}");
    let _ = writeln!(s, "add map {TABLE} egress-pods {{ type ipv4_addr : verdict; }}");
    let empty = Desired::default();
    s.push_str(&changes(&empty, d));
    let _ = writeln!(s, "add chain {TABLE} forward {{ {BASE} }}");
    let _ = writeln!(s, "add rule {TABLE} forward ct state established,related accept");
    let _ = writeln!(s, "add rule {TABLE} forward ip saddr vmap @egress-pods");
    let _ = writeln!(s, "add rule {TABLE} forward ip daddr vmap @ingress-pods");
    let _ = writeln!(s, "add chain {TABLE} input {{ {INPUT} }}");
    let _ = writeln!(s, "add rule {TABLE} input ct state established,related accept");
    let _ = writeln!(s, "add rule {TABLE} input ip saddr vmap @egress-pods");
    s
}

/// The script that removes the table (`kubeproxy --cleanup`).
pub fn cleanup() -> String {
    format!("add table {TABLE}\ndelete table {TABLE}\n")
}

/// The script that turns the table programmed as `old` into `new`; `None` when they are the same.
pub fn diff(old: &Desired, new: &Desired) -> Option<String> {
    let s = changes(old, new);
    (!s.is_empty()).then_some(s)
}

/// The commands between two states, in an order the kernel accepts: sets and chains exist
/// before anything refers to them, and go only after nothing does.
fn changes(old: &Desired, new: &Desired) -> String {
    let mut s = String::new();
    // New sets; elements of every set.
    for (name, now) in &new.peers {
        let before = old.peers.get(name);
        if before.is_none() {
            let _ = writeln!(s, "add set {TABLE} {name} {{ type ipv4_addr; }}");
        }
        elements(&mut s, name, before, now, |ip| ip.to_string());
    }
    for (name, now) in &new.named {
        let before = old.named.get(name);
        if before.is_none() {
            let _ = writeln!(s, "add set {TABLE} {name} {{ type ipv4_addr . inet_proto . inet_service; }}");
        }
        elements(&mut s, name, before, now, |(ip, p, n): &(Ipv4Addr, Proto, u16)| format!("{ip} . {} . {n}", p.nft()));
    }
    // New chains (named after their content: a chain never changes, it is replaced).
    for (name, rules) in &new.chains {
        if old.chains.get(name) == Some(rules) {
            continue;
        }
        if old.chains.contains_key(name) {
            let _ = writeln!(s, "flush chain {TABLE} {name}");
        } else {
            let _ = writeln!(s, "add chain {TABLE} {name}");
        }
        for r in rules {
            let _ = writeln!(s, "add rule {TABLE} {name} {r}");
        }
    }
    // Map elements: gone or changed ones out, new or changed ones in.
    for (map, before, now) in [("ingress-pods", &old.ingress, &new.ingress), ("egress-pods", &old.egress, &new.egress)]
    {
        let out: Vec<String> =
            before.iter().filter(|(ip, c)| now.get(ip) != Some(c)).map(|(ip, _)| ip.to_string()).collect();
        if !out.is_empty() {
            let _ = writeln!(s, "delete element {TABLE} {map} {{ {} }}", out.join(", "));
        }
        let added: Vec<String> =
            now.iter().filter(|(ip, c)| before.get(ip) != Some(c)).map(|(ip, c)| format!("{ip} : jump {c}")).collect();
        if !added.is_empty() {
            let _ = writeln!(s, "add element {TABLE} {map} {{ {} }}", added.join(", "));
        }
    }
    // Chains, then sets, nothing refers to any more.
    for name in old.chains.keys().filter(|n| !new.chains.contains_key(*n)) {
        let _ = writeln!(s, "delete chain {TABLE} {name}");
    }
    for name in old.peers.keys().filter(|n| !new.peers.contains_key(*n)) {
        let _ = writeln!(s, "delete set {TABLE} {name}");
    }
    for name in old.named.keys().filter(|n| !new.named.contains_key(*n)) {
        let _ = writeln!(s, "delete set {TABLE} {name}");
    }
    s
}

fn elements<T: Ord>(
    s: &mut String,
    set: &str,
    before: Option<&BTreeSet<T>>,
    now: &BTreeSet<T>,
    show: impl Fn(&T) -> String,
) {
    let empty = BTreeSet::new();
    let before = before.unwrap_or(&empty);
    let gone: Vec<String> = before.difference(now).map(&show).collect();
    let new: Vec<String> = now.difference(before).map(&show).collect();
    if !gone.is_empty() {
        let _ = writeln!(s, "delete element {TABLE} {set} {{ {} }}", gone.join(", "));
    }
    if !new.is_empty() {
        let _ = writeln!(s, "add element {TABLE} {set} {{ {} }}", new.join(", "));
    }
}

/// How many rules and elements `d` programs (for the sync log and metrics).
pub fn size(d: &Desired) -> usize {
    d.chains.values().map(Vec::len).sum::<usize>()
        + d.peers.values().map(BTreeSet::len).sum::<usize>()
        + d.named.values().map(BTreeSet::len).sum::<usize>()
        + d.ingress.len()
        + d.egress.len()
}

/// Isolated pods by direction, for the log.
pub fn isolated(d: &Desired) -> (usize, usize) {
    (d.ingress.len(), d.egress.len())
}

#[cfg(test)]
mod tests {
    use super::super::desired::tests::{namespaces, pod, policy};
    use super::super::desired::{compute, Desired};
    use super::*;
    use serde_json::json;

    fn desired(pods: &[super::super::desired::PodInfo]) -> Desired {
        let p = policy(
            "a",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "server"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}]}),
        );
        compute(&[&p], pods, &namespaces(&[("a", &[])])).0
    }

    #[test]
    fn the_full_script_replaces_the_table_and_declares_before_use() {
        let d = desired(&[
            pod("a", "s", "10.244.0.2", &[("app", "server")]),
            pod("a", "c", "10.244.0.3", &[("app", "client")]),
        ]);
        let s = full(&d);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines[..3],
            ["add table ip minik8s-netpol", "delete table ip minik8s-netpol", "add table ip minik8s-netpol"]
        );
        let pos =
            |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle} in\n{s}"));
        let set = d.peers.keys().next().unwrap();
        let chain = d.chains.keys().next().unwrap();
        assert!(pos(&format!("add set ip minik8s-netpol {set}")) < pos(&format!("add rule ip minik8s-netpol {chain}")));
        assert!(
            pos(&format!("add chain ip minik8s-netpol {chain}")) < pos("add element ip minik8s-netpol ingress-pods")
        );
        assert!(s.contains(&format!("add element ip minik8s-netpol {set} {{ 10.244.0.3 }}")));
        assert!(s.contains(&format!("add element ip minik8s-netpol ingress-pods {{ 10.244.0.2 : jump {chain} }}")));
        assert!(s.ends_with("add rule ip minik8s-netpol input ip saddr vmap @egress-pods\n"));
    }

    #[test]
    fn a_new_client_only_adds_a_set_element_and_a_new_server_a_map_element() {
        let mut pods =
            vec![pod("a", "s", "10.244.0.2", &[("app", "server")]), pod("a", "c", "10.244.0.3", &[("app", "client")])];
        let old = desired(&pods);
        assert_eq!(diff(&old, &old), None);
        pods.push(pod("a", "c2", "10.244.1.3", &[("app", "client")]));
        let set = old.peers.keys().next().unwrap().clone();
        let new = desired(&pods);
        assert_eq!(diff(&old, &new).unwrap(), format!("add element ip minik8s-netpol {set} {{ 10.244.1.3 }}\n"));
        pods.push(pod("a", "s2", "10.244.1.2", &[("app", "server")]));
        let newer = desired(&pods);
        let chain = newer.chains.keys().next().unwrap();
        assert_eq!(
            diff(&new, &newer).unwrap(),
            format!("add element ip minik8s-netpol ingress-pods {{ 10.244.1.2 : jump {chain} }}\n")
        );
        // The first client goes: its element goes.
        pods.remove(1);
        let fewer = desired(&pods);
        assert_eq!(diff(&newer, &fewer).unwrap(), format!("delete element ip minik8s-netpol {set} {{ 10.244.0.3 }}\n"));
    }

    #[test]
    fn a_policy_going_removes_map_elements_then_chains_then_sets() {
        let pods =
            [pod("a", "s", "10.244.0.2", &[("app", "server")]), pod("a", "c", "10.244.0.3", &[("app", "client")])];
        let old = desired(&pods);
        let s = diff(&old, &Desired::default()).unwrap();
        let set = old.peers.keys().next().unwrap();
        let chain = old.chains.keys().next().unwrap();
        assert_eq!(
            s,
            format!(
                "delete element ip minik8s-netpol ingress-pods {{ 10.244.0.2 }}\n\
                 delete chain ip minik8s-netpol {chain}\n\
                 delete set ip minik8s-netpol {set}\n"
            )
        );
    }
}
