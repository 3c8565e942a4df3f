//! The VXLAN backend of the pod network, as flannel's `vxlan` backend builds it: pure
//! decisions only (the netlink calls are in `netlink.rs`, the loop in `network.rs`).
//!
//! Every node has one VXLAN device ([`VXLAN_DEVICE`], VNI [`VNI`], UDP port [`VXLAN_PORT`],
//! local address = the node's InternalIP, no learning) whose address is the network address
//! of the node's podCIDR (`10.244.1.0/32` for `10.244.1.0/24`) and whose MTU is the
//! underlay's less [`VXLAN_OVERHEAD`]. The node publishes the device's MAC address (its
//! "VTEP") in its own Node's annotations ([`VTEP_MAC_ANNOTATION`], with
//! [`BACKEND_TYPE_ANNOTATION`] and [`PUBLIC_IP_ANNOTATION`]). For every other node with a
//! podCIDR, an InternalIP that is not on this host and a published VTEP, the node programs
//! - a route `podCIDR via <its network address> dev <vxlan> onlink`,
//! - a permanent neighbour `<its network address> lladdr <its MAC> dev <vxlan>` (no ARP over
//!   the overlay), and
//! - a forwarding entry `<its MAC> dst <its InternalIP> dev <vxlan>` (where to send the
//!   encapsulated frame).
//!
//! A node whose VTEP annotation is not a usable MAC address is skipped (and reported); the
//! others are unaffected.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use crate::cidr::Cidr;

/// The VXLAN device's name. It matches `mk8s+`, so the FORWARD rules of the node bridges
/// and the masquerade chain's "out of a MiniK8s device keeps its source" cover it too.
pub const VXLAN_DEVICE: &str = "mk8s.vxlan";
/// The VXLAN network identifier (flannel's default).
pub const VNI: u32 = 1;
/// The UDP port of the encapsulated traffic (flannel's default, the Linux kernel's
/// historical VXLAN port; IANA's is 4789).
pub const VXLAN_PORT: u16 = 8472;
/// Bytes the encapsulation adds: outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14).
pub const VXLAN_OVERHEAD: u32 = 50;

/// The node's VTEP MAC address (`aa:bb:cc:dd:ee:ff`).
pub const VTEP_MAC_ANNOTATION: &str = "minik8s.io/vtep-mac";
/// The backend the node's kubelet runs (`vxlan`); peers are only nodes that say `vxlan`.
pub const BACKEND_TYPE_ANNOTATION: &str = "minik8s.io/backend-type";
/// The underlay address the node's VTEP sends from (its InternalIP), for the record.
pub const PUBLIC_IP_ANNOTATION: &str = "minik8s.io/public-ip";
/// The value of [`BACKEND_TYPE_ANNOTATION`] for this backend.
pub const BACKEND_VXLAN: &str = "vxlan";

/// A MAC address usable as a VTEP: unicast and not all zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

impl FromStr for Mac {
    type Err = String;
    fn from_str(s: &str) -> Result<Mac, String> {
        let parts: Vec<&str> = s.trim().split(':').collect();
        if parts.len() != 6 {
            return Err(format!("{s:?} is not a MAC address (six hex octets separated by colons)"));
        }
        let mut out = [0u8; 6];
        for (o, p) in out.iter_mut().zip(&parts) {
            if p.len() != 2 {
                return Err(format!("{s:?} is not a MAC address (six hex octets separated by colons)"));
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| format!("{s:?} is not a MAC address (bad octet {p:?})"))?;
        }
        Mac::from_bytes(&out).ok_or_else(|| format!("{s:?} cannot be a VTEP: multicast or all-zero address"))
    }
}

impl Mac {
    /// The address of a link's bytes, if it is a usable VTEP address.
    pub fn from_bytes(b: &[u8]) -> Option<Mac> {
        let a: [u8; 6] = b.try_into().ok()?;
        if a == [0; 6] || a[0] & 1 == 1 {
            return None;
        }
        Some(Mac(a))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// What the overlay needs to know of a Node beyond its podCIDR and InternalIP: its VTEP
/// annotations as they are written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VtepAnnotations {
    pub backend_type: Option<String>,
    pub vtep_mac: Option<String>,
    pub public_ip: Option<String>,
}

impl VtepAnnotations {
    pub fn from_annotations(a: Option<&BTreeMap<String, String>>) -> VtepAnnotations {
        let get = |k: &str| a.and_then(|a| a.get(k)).cloned();
        VtepAnnotations {
            backend_type: get(BACKEND_TYPE_ANNOTATION),
            vtep_mac: get(VTEP_MAC_ANNOTATION),
            public_ip: get(PUBLIC_IP_ANNOTATION),
        }
    }
}

/// A node as the overlay sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayNode {
    pub name: String,
    pub pod_cidr: Option<Cidr>,
    pub internal_ip: Option<Ipv4Addr>,
    pub vtep: VtepAnnotations,
}

/// What a remote node's VTEP looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vtep {
    /// The node publishes no VXLAN VTEP (not yet, or it runs another backend).
    None,
    /// A VTEP with this MAC address.
    Mac(Mac),
}

/// The VTEP a node publishes: `Err(reason)` when its annotation is garbage.
pub fn vtep_of(a: &VtepAnnotations) -> Result<Vtep, String> {
    let Some(raw) = a.vtep_mac.as_deref() else { return Ok(Vtep::None) };
    let mac: Mac = raw.parse()?;
    if a.backend_type.as_deref() != Some(BACKEND_VXLAN) {
        return Ok(Vtep::None);
    }
    Ok(Vtep::Mac(mac))
}

/// Where the route to a podCIDR goes: a gateway, and for the overlay the device it is on
/// (`onlink`: the gateway needs no connected route).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Via {
    pub gateway: Ipv4Addr,
    /// The output interface's index; `None`: whichever the kernel finds for the gateway.
    pub device: Option<u32>,
}

impl Via {
    pub fn gateway(gateway: Ipv4Addr) -> Via {
        Via { gateway, device: None }
    }
    /// Whether a route the kernel has (`self`) is what `want` asks for.
    pub fn satisfies(&self, want: &Via) -> bool {
        self.gateway == want.gateway && (want.device.is_none() || want.device == self.device)
    }
}

/// Everything the VXLAN device needs for the other nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverlayPlan {
    /// podCIDR → via its node's network address on the VXLAN device.
    pub routes: BTreeMap<Cidr, Via>,
    /// Remote network address → its node's VTEP MAC (permanent neighbour entries).
    pub neighbours: BTreeMap<Ipv4Addr, Mac>,
    /// VTEP MAC → its node's underlay address (forwarding database entries).
    pub fdb: BTreeMap<Mac, Ipv4Addr>,
}

/// A node left out of the overlay and why (a warning, and an Event on that Node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub node: String,
    pub reason: String,
}

/// The overlay towards every other node: `device` is the VXLAN device's index. A node is a
/// peer when it has a podCIDR that overlaps neither this node's nor an earlier peer's (by
/// name), an InternalIP that is neither loopback nor an address of this host (nodes on this
/// host are reached through their local bridges), and a VXLAN VTEP. A garbage VTEP
/// annotation, or a MAC another node already uses from another address, skips the node.
pub fn desired_overlay(
    self_node: &str,
    own_cidr: Option<&Cidr>,
    nodes: &[OverlayNode],
    local_addrs: &HashSet<Ipv4Addr>,
    device: u32,
) -> (OverlayPlan, Vec<Skipped>) {
    let mut sorted: Vec<&OverlayNode> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut plan = OverlayPlan::default();
    let mut skipped = Vec::new();
    for n in sorted {
        if n.name == self_node {
            continue;
        }
        let mac = match vtep_of(&n.vtep) {
            Ok(Vtep::Mac(m)) => m,
            Ok(Vtep::None) => continue,
            Err(reason) => {
                skipped.push(Skipped { node: n.name.clone(), reason: format!("{VTEP_MAC_ANNOTATION}: {reason}") });
                continue;
            }
        };
        let (Some(cidr), Some(ip)) = (n.pod_cidr, n.internal_ip) else { continue };
        if ip.is_loopback() || ip.is_unspecified() || local_addrs.contains(&ip) {
            continue;
        }
        if own_cidr.is_some_and(|o| o.overlaps(&cidr)) || plan.routes.keys().any(|c| c.overlaps(&cidr)) {
            skipped.push(Skipped { node: n.name.clone(), reason: format!("podCIDR {cidr} overlaps another node's") });
            continue;
        }
        if let Some(other) = plan.fdb.get(&mac).filter(|other| **other != ip) {
            skipped.push(Skipped {
                node: n.name.clone(),
                reason: format!("VTEP MAC {mac} is already the VTEP of {other}"),
            });
            continue;
        }
        plan.routes.insert(cidr, Via { gateway: cidr.network, device: Some(device) });
        plan.neighbours.insert(cidr.network, mac);
        plan.fdb.insert(mac, ip);
    }
    (plan, skipped)
}

/// The neighbour entries to set (add or replace) and to delete on the VXLAN device, given
/// what it has (`current`: address → MAC of a permanent entry, `None` for any other entry).
/// Every entry on the device is the kubelet's: what is not wanted goes.
pub fn neighbour_changes(
    current: &BTreeMap<Ipv4Addr, Option<Mac>>,
    desired: &BTreeMap<Ipv4Addr, Mac>,
) -> (Vec<(Ipv4Addr, Mac)>, Vec<Ipv4Addr>) {
    let set = desired.iter().filter(|(ip, mac)| current.get(ip) != Some(&Some(**mac))).map(|(i, m)| (*i, *m)).collect();
    let del = current.keys().filter(|ip| !desired.contains_key(ip)).copied().collect();
    (set, del)
}

/// The forwarding entries to delete (whole MACs) and to set on the VXLAN device, given
/// what it has (`current`: MAC → the destinations it has, in any order). A MAC with more
/// than one destination is deleted first and set again.
pub fn fdb_changes(
    current: &BTreeMap<Mac, BTreeSet<Ipv4Addr>>,
    desired: &BTreeMap<Mac, Ipv4Addr>,
) -> (Vec<Mac>, Vec<(Mac, Ipv4Addr)>) {
    let mut del: Vec<Mac> = current.keys().filter(|m| !desired.contains_key(m)).copied().collect();
    let mut set = Vec::new();
    for (mac, ip) in desired {
        match current.get(mac) {
            Some(dsts) if dsts.len() == 1 && dsts.contains(ip) => {}
            Some(dsts) if dsts.len() > 1 => {
                del.push(*mac);
                set.push((*mac, *ip));
            }
            _ => set.push((*mac, *ip)),
        }
    }
    del.sort();
    (del, set)
}

/// The VXLAN device this node wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpec {
    pub vni: u32,
    pub port: u16,
    pub local: Ipv4Addr,
    pub mtu: u32,
}

/// The device as the kernel has it (`None`: attribute absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceState {
    pub is_vxlan: bool,
    pub vni: Option<u32>,
    pub port: Option<u16>,
    pub local: Option<Ipv4Addr>,
    pub learning: Option<bool>,
}

/// Why an existing device cannot be kept (it is deleted and created again), or `None`.
/// The MTU is not a reason: it is changed in place.
pub fn device_mismatch(have: &DeviceState, want: &DeviceSpec) -> Option<String> {
    if !have.is_vxlan {
        return Some("it is not a VXLAN device".into());
    }
    if have.vni != Some(want.vni) {
        return Some(format!("VNI {:?}, want {}", have.vni, want.vni));
    }
    if have.port != Some(want.port) {
        return Some(format!("UDP port {:?}, want {}", have.port, want.port));
    }
    if have.local != Some(want.local) {
        return Some(format!("local address {:?}, want {}", have.local, want.local));
    }
    if have.learning == Some(true) {
        return Some("learning is on".into());
    }
    None
}

/// The MTU of the overlay (the VXLAN device, the pods' veths and the bridge): the underlay
/// link's less the encapsulation.
pub fn overlay_mtu(underlay: u32) -> u32 {
    underlay.saturating_sub(VXLAN_OVERHEAD).max(576)
}

/// The merge patch of the Node's annotations that publishes this node's VTEP (`vtep`:
/// `Some((mac, public address))`) or withdraws a published one (`None`: another backend
/// runs), or `None` when the annotations already say so.
pub fn annotation_patch(have: &VtepAnnotations, vtep: Option<(Mac, Ipv4Addr)>) -> Option<serde_json::Value> {
    match vtep {
        Some((mac, ip)) => {
            let want = VtepAnnotations {
                backend_type: Some(BACKEND_VXLAN.into()),
                vtep_mac: Some(mac.to_string()),
                public_ip: Some(ip.to_string()),
            };
            (*have != want).then(|| {
                serde_json::json!({"metadata": {"annotations": {
                    BACKEND_TYPE_ANNOTATION: want.backend_type,
                    VTEP_MAC_ANNOTATION: want.vtep_mac,
                    PUBLIC_IP_ANNOTATION: want.public_ip,
                }}})
            })
        }
        None => (*have != VtepAnnotations::default()).then(|| {
            serde_json::json!({"metadata": {"annotations": {
                BACKEND_TYPE_ANNOTATION: null, VTEP_MAC_ANNOTATION: null, PUBLIC_IP_ANNOTATION: null,
            }}})
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(s: &str) -> Mac {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }
    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn node(name: &str, cidr: &str, addr: &str, vtep: Option<&str>) -> OverlayNode {
        OverlayNode {
            name: name.into(),
            pod_cidr: cidr.parse().ok(),
            internal_ip: addr.parse().ok(),
            vtep: VtepAnnotations {
                backend_type: vtep.map(|_| BACKEND_VXLAN.into()),
                vtep_mac: vtep.map(String::from),
                public_ip: None,
            },
        }
    }

    #[test]
    fn mac_addresses_parse_and_print() {
        assert_eq!(mac("0A:1b:2c:3d:4e:5f").to_string(), "0a:1b:2c:3d:4e:5f");
        assert_eq!(mac(" 02:00:00:00:00:01 ").0, [2, 0, 0, 0, 0, 1]);
        for bad in [
            "",
            "garbage",
            "02:00:00:00:00",
            "02:00:00:00:00:00:00",
            "02:00:00:00:00:zz",
            "2:0:0:0:0:1",
            "02-00-00-00-00-01",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad:?} parsed");
        }
        // Not a VTEP: all zeros, broadcast, multicast.
        for bad in ["00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01"] {
            assert!(bad.parse::<Mac>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(Mac::from_bytes(&[2, 0, 0, 0, 0]), None);
    }

    #[test]
    fn vtep_of_annotations() {
        let a = |t: Option<&str>, m: Option<&str>| VtepAnnotations {
            backend_type: t.map(String::from),
            vtep_mac: m.map(String::from),
            public_ip: None,
        };
        assert_eq!(vtep_of(&a(None, None)), Ok(Vtep::None));
        assert_eq!(vtep_of(&a(Some("vxlan"), Some("02:00:00:00:00:01"))), Ok(Vtep::Mac(mac("02:00:00:00:00:01"))));
        // Another backend's node is no peer, even with a MAC left behind.
        assert_eq!(vtep_of(&a(Some("host-gw"), Some("02:00:00:00:00:01"))), Ok(Vtep::None));
        assert_eq!(vtep_of(&a(None, Some("02:00:00:00:00:01"))), Ok(Vtep::None));
        // Garbage is an error whatever the backend says.
        assert!(vtep_of(&a(Some("vxlan"), Some("not-a-mac"))).is_err());
        assert!(vtep_of(&a(None, Some("not-a-mac"))).is_err());
    }

    #[test]
    fn overlay_towards_nodes_on_other_hosts() {
        let local: HashSet<Ipv4Addr> = [ip("192.168.1.10"), ip("127.0.0.1")].into();
        let own = c("10.244.0.0/24");
        let nodes = vec![
            node("me", "10.244.0.0/24", "192.168.1.10", Some("02:00:00:00:00:00")),
            node("same-host", "10.244.1.0/24", "192.168.1.10", Some("02:00:00:00:00:01")),
            node("loopback", "10.244.2.0/24", "127.0.0.2", Some("02:00:00:00:00:02")),
            node("remote", "10.244.3.0/24", "192.168.2.11", Some("02:00:00:00:00:03")),
            node("remote2", "10.244.4.0/24", "192.168.3.12", Some("02:00:00:00:00:04")),
            node("no-vtep", "10.244.5.0/24", "192.168.3.13", None),
            node("garbage", "10.244.6.0/24", "192.168.3.14", Some("not-a-mac")),
            node("no-cidr", "", "192.168.3.15", Some("02:00:00:00:00:07")),
            node("no-ip", "10.244.8.0/24", "", Some("02:00:00:00:00:08")),
            node("z-clash", "10.244.3.128/25", "192.168.3.16", Some("02:00:00:00:00:09")),
            node("z-mac-twice", "10.244.10.0/24", "192.168.3.17", Some("02:00:00:00:00:03")),
        ];
        let (plan, skipped) = desired_overlay("me", Some(&own), &nodes, &local, 7);
        assert_eq!(
            plan.routes,
            BTreeMap::from([
                (c("10.244.3.0/24"), Via { gateway: ip("10.244.3.0"), device: Some(7) }),
                (c("10.244.4.0/24"), Via { gateway: ip("10.244.4.0"), device: Some(7) }),
            ])
        );
        assert_eq!(
            plan.neighbours,
            BTreeMap::from([
                (ip("10.244.3.0"), mac("02:00:00:00:00:03")),
                (ip("10.244.4.0"), mac("02:00:00:00:00:04"))
            ])
        );
        assert_eq!(
            plan.fdb,
            BTreeMap::from([
                (mac("02:00:00:00:00:03"), ip("192.168.2.11")),
                (mac("02:00:00:00:00:04"), ip("192.168.3.12"))
            ])
        );
        let names: Vec<&str> = skipped.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(names, ["garbage", "z-clash", "z-mac-twice"]);
        assert!(skipped[0].reason.contains(VTEP_MAC_ANNOTATION) && skipped[0].reason.contains("not-a-mac"));
        // Two nodes of one remote host share its device: one MAC, one address, two routes.
        let shared = vec![
            node("a", "10.244.3.0/24", "192.168.2.11", Some("02:00:00:00:00:03")),
            node("b", "10.244.4.0/24", "192.168.2.11", Some("02:00:00:00:00:03")),
        ];
        let (plan, skipped) = desired_overlay("me", Some(&own), &shared, &local, 7);
        assert!(skipped.is_empty());
        assert_eq!((plan.routes.len(), plan.neighbours.len(), plan.fdb.len()), (2, 2, 1));
    }

    #[test]
    fn neighbour_and_fdb_changes() {
        let current = BTreeMap::from([
            (ip("10.244.1.0"), Some(mac("02:00:00:00:00:01"))), // kept
            (ip("10.244.2.0"), Some(mac("02:00:00:00:00:02"))), // MAC changed
            (ip("10.244.3.0"), None),                           // not permanent
            (ip("10.244.9.0"), Some(mac("02:00:00:00:00:09"))), // node gone
        ]);
        let desired = BTreeMap::from([
            (ip("10.244.1.0"), mac("02:00:00:00:00:01")),
            (ip("10.244.2.0"), mac("02:00:00:00:00:22")),
            (ip("10.244.3.0"), mac("02:00:00:00:00:03")),
            (ip("10.244.4.0"), mac("02:00:00:00:00:04")),
        ]);
        let (set, del) = neighbour_changes(&current, &desired);
        assert_eq!(
            set,
            vec![
                (ip("10.244.2.0"), mac("02:00:00:00:00:22")),
                (ip("10.244.3.0"), mac("02:00:00:00:00:03")),
                (ip("10.244.4.0"), mac("02:00:00:00:00:04")),
            ]
        );
        assert_eq!(del, vec![ip("10.244.9.0")]);

        let current = BTreeMap::from([
            (mac("02:00:00:00:00:01"), BTreeSet::from([ip("192.168.2.1")])), // kept
            (mac("02:00:00:00:00:02"), BTreeSet::from([ip("192.168.2.2")])), // node moved
            (mac("02:00:00:00:00:03"), BTreeSet::from([ip("192.168.2.3"), ip("192.168.2.33")])), // two
            (mac("02:00:00:00:00:09"), BTreeSet::from([ip("192.168.2.9")])), // gone
        ]);
        let desired = BTreeMap::from([
            (mac("02:00:00:00:00:01"), ip("192.168.2.1")),
            (mac("02:00:00:00:00:02"), ip("192.168.3.2")),
            (mac("02:00:00:00:00:03"), ip("192.168.2.3")),
            (mac("02:00:00:00:00:04"), ip("192.168.2.4")),
        ]);
        let (del, set) = fdb_changes(&current, &desired);
        assert_eq!(del, vec![mac("02:00:00:00:00:03"), mac("02:00:00:00:00:09")]);
        assert_eq!(
            set,
            vec![
                (mac("02:00:00:00:00:02"), ip("192.168.3.2")),
                (mac("02:00:00:00:00:03"), ip("192.168.2.3")),
                (mac("02:00:00:00:00:04"), ip("192.168.2.4")),
            ]
        );
        // Nothing to do when the kernel has what is wanted.
        let have: BTreeMap<Mac, BTreeSet<Ipv4Addr>> = desired.iter().map(|(m, i)| (*m, BTreeSet::from([*i]))).collect();
        assert_eq!(fdb_changes(&have, &desired), (vec![], vec![]));
    }

    #[test]
    fn an_existing_device_is_kept_only_when_it_matches() {
        let want = DeviceSpec { vni: 1, port: 8472, local: ip("192.168.1.10"), mtu: 1450 };
        let ok = DeviceState {
            is_vxlan: true,
            vni: Some(1),
            port: Some(8472),
            local: Some(ip("192.168.1.10")),
            learning: Some(false),
        };
        assert_eq!(device_mismatch(&ok, &want), None);
        assert!(device_mismatch(&DeviceState::default(), &want).is_some());
        assert!(device_mismatch(&DeviceState { vni: Some(2), ..ok.clone() }, &want).is_some());
        assert!(device_mismatch(&DeviceState { port: Some(4789), ..ok.clone() }, &want).is_some());
        assert!(device_mismatch(&DeviceState { local: Some(ip("192.168.1.11")), ..ok.clone() }, &want).is_some());
        assert!(device_mismatch(&DeviceState { learning: Some(true), ..ok.clone() }, &want).is_some());
        assert_eq!(overlay_mtu(1500), 1450);
        assert_eq!(overlay_mtu(9000), 8950);
        assert_eq!(overlay_mtu(100), 576);
    }

    #[test]
    fn routes_to_the_overlay_replace_host_gw_ones() {
        let hostgw = Via { gateway: ip("192.168.2.11"), device: Some(2) };
        let overlay = Via { gateway: ip("10.244.3.0"), device: Some(7) };
        assert!(hostgw.satisfies(&Via::gateway(ip("192.168.2.11"))));
        assert!(!hostgw.satisfies(&overlay));
        assert!(!Via { gateway: ip("10.244.3.0"), device: Some(8) }.satisfies(&overlay));
        assert!(overlay.satisfies(&overlay));
    }

    #[test]
    fn annotations_published_and_withdrawn() {
        let m = mac("02:aa:bb:cc:dd:ee");
        let addr = ip("192.168.1.10");
        let p = annotation_patch(&VtepAnnotations::default(), Some((m, addr))).unwrap();
        let a = &p["metadata"]["annotations"];
        assert_eq!(a[VTEP_MAC_ANNOTATION], "02:aa:bb:cc:dd:ee");
        assert_eq!(a[BACKEND_TYPE_ANNOTATION], "vxlan");
        assert_eq!(a[PUBLIC_IP_ANNOTATION], "192.168.1.10");
        let published = VtepAnnotations {
            backend_type: Some("vxlan".into()),
            vtep_mac: Some("02:aa:bb:cc:dd:ee".into()),
            public_ip: Some("192.168.1.10".into()),
        };
        assert_eq!(annotation_patch(&published, Some((m, addr))), None);
        // A new device (a new MAC) is published again.
        assert!(annotation_patch(&published, Some((mac("02:aa:bb:cc:dd:ef"), addr))).is_some());
        // host-gw withdraws a VTEP left from an earlier vxlan run, and otherwise writes nothing.
        let p = annotation_patch(&published, None).unwrap();
        assert!(p["metadata"]["annotations"][VTEP_MAC_ANNOTATION].is_null());
        assert_eq!(annotation_patch(&VtepAnnotations::default(), None), None);
    }
}
