//! The pod network, CNI-style, owned by one [`PodNetwork`]: one Linux bridge per node
//! (named after the node) holding the first address of the node's podCIDR as the pods'
//! gateway; each pod gets a veth pair whose inner end is moved into the pause container's
//! network namespace (found through its PID), named `eth0`, addressed from the podCIDR,
//! with a default route via the bridge, and its host end in hairpin mode.
//!
//! Pods of different nodes on one host reach each other through the host's routing table
//! (every bridge has a connected route for its podCIDR) and FORWARD rules that accept
//! traffic from and to the `mk8s*` bridges. Address allocation is a pure function ([`allocate`])
//! of the addresses the running pause containers carry in their labels, so it survives restarts.
//!
//! Links are configured over rtnetlink (see `netlink.rs`); the FORWARD rules with iptables.
//!
//! Beyond the node, two things the CNI bridge plugin and flannel's host-gw backend do:
//! - **egress masquerade** (the bridge plugin's `ipMasq`): pod traffic leaving the cluster's
//!   pod networks is SNATed to the node's address by a per-node nat chain
//!   `MK8S-MASQ-<hash>` jumped to from POSTROUTING for `-s <podCIDR>`; traffic to any
//!   node's podCIDR or out of a MiniK8s bridge keeps the pod's address. Written with
//!   `iptables-restore --noflush` (idempotent); the kube-proxy's chains are `KUBE-*`, so
//!   the names never collide. [`masq_restore`] and [`stale_jumps`] are the pure parts.
//! - **cross-host routes**, by one of two backends (`--network-backend`), from a watch of
//!   Nodes; nodes on this host need no route either way (their bridges are local):
//!   - `host-gw` (the default): for every other node whose InternalIP is not an address of
//!     this host, a route `podCIDR via InternalIP` (protocol
//!     [`crate::netlink::ROUTE_PROTOCOL`], so stale ones are found and removed — only those
//!     to a podCIDR of this cluster). The hosts must share a link. [`desired_routes`] and
//!     [`route_changes`] are the decision.
//!   - `vxlan`: flannel's VXLAN overlay (see `overlay.rs`): a VXLAN device per host, its
//!     MAC published in the Node's annotations, and for every other node a route via the
//!     device, a neighbour and a forwarding entry; the hosts need only reach each other
//!     over UDP. The pods' veths and the bridge get the overlay's MTU.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};

use crate::cidr::Cidr;
use crate::hosttools::{fnv32, output, run, run_with_input, succeeds};
use crate::labels::Kind;
use crate::overlay::{OverlayNode, Via, VtepAnnotations};
use crate::runtime::{ContainerRecord, Runtime, State};

/// How pod traffic reaches other hosts' nodes (`--network-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Routes `podCIDR via InternalIP`: the hosts share one link (flannel's host-gw).
    #[value(name = "host-gw")]
    HostGw,
    /// A VXLAN overlay (flannel's vxlan): the hosts only need to reach each other over UDP.
    Vxlan,
}

/// The node's pod network: its podCIDR, the pod IPs in use, the bridge, and each pod's
/// link to it. The pod workers ask it for an address and a link; the node loop
/// ([`PodNetwork::run_node_network`]) keeps the masquerade and the routes to other nodes.
pub struct PodNetwork {
    node: String,
    /// The node's address (InternalIP): the overlay's underlay address.
    node_ip: Ipv4Addr,
    backend: Backend,
    /// The container runtime (`None` when the kubelet runs only the network, `--network-only`).
    rt: Option<Arc<Runtime>>,
    /// The pods' MTU once known (`None`: the kernel's default; the overlay's otherwise).
    pod_mtu: tokio::sync::OnceCell<Option<u32>>,
    /// `--pod-cidr`, or the Node's `spec.podCIDR` once node IPAM gave one.
    pod_cidr: Mutex<Option<Cidr>>,
    /// The node's bridge once created.
    bridge: tokio::sync::Mutex<Option<String>>,
    /// Pod IPs in use; filled from the pause containers' labels on first use, so it
    /// survives restarts.
    ips: tokio::sync::Mutex<Option<HashSet<Ipv4Addr>>>,
    /// The host ports each pod publishes (by pod UID), as the pod workers report them.
    host_ports: tokio::sync::Mutex<HostPorts>,
}

/// The host ports of the node's pods and whether the kernel has them.
#[derive(Default)]
struct HostPorts {
    by_pod: BTreeMap<String, Vec<crate::hostport::HostPort>>,
    /// False until the chains were written once by this kubelet (or after a failed write):
    /// the next report writes them even when it changes nothing.
    applied: bool,
}

impl PodNetwork {
    pub fn new(
        node: &str,
        node_ip: Ipv4Addr,
        backend: Backend,
        rt: Option<Arc<Runtime>>,
        pod_cidr: Option<Cidr>,
    ) -> PodNetwork {
        PodNetwork {
            node: node.to_string(),
            node_ip,
            backend,
            rt,
            pod_mtu: tokio::sync::OnceCell::new(),
            pod_cidr: Mutex::new(pod_cidr),
            bridge: tokio::sync::Mutex::new(None),
            ips: tokio::sync::Mutex::new(None),
            host_ports: tokio::sync::Mutex::new(HostPorts::default()),
        }
    }

    fn runtime(&self) -> Result<&Arc<Runtime>> {
        self.rt.as_ref().ok_or_else(|| anyhow!("no container runtime: this kubelet runs only the pod network"))
    }

    /// The MTU of the pods' links and the bridge: the overlay's (the underlay link's less
    /// the encapsulation) with the VXLAN backend, else the kernel's default.
    async fn pod_mtu(&self) -> Option<u32> {
        *self
            .pod_mtu
            .get_or_init(|| async {
                match self.backend {
                    Backend::HostGw => None,
                    Backend::Vxlan => Some(crate::overlay::overlay_mtu(underlay_mtu(self.node_ip).await)),
                }
            })
            .await
    }

    /// The node's podCIDR, if it has one yet.
    pub fn cidr(&self) -> Option<Cidr> {
        self.pod_cidr.lock().ok().and_then(|c| *c)
    }

    /// The podCIDR node IPAM gave this node.
    pub fn set_cidr(&self, cidr: Cidr) {
        if let Ok(mut c) = self.pod_cidr.lock() {
            *c = Some(cidr);
        }
    }

    /// Reserve a free pod IP of the podCIDR; returns it with the podCIDR.
    pub async fn allocate_ip(&self) -> Result<(Ipv4Addr, Cidr)> {
        let cidr = self.cidr().ok_or_else(|| anyhow!("network is not ready: the node has no podCIDR"))?;
        let mut ips = self.ips.lock().await;
        if ips.is_none() {
            let used = self
                .runtime()?
                .list(None)
                .await?
                .iter()
                .filter(|r| r.kind == Kind::Sandbox && r.state != State::Exited)
                .filter_map(|r| r.pod_ip().and_then(|ip| ip.parse().ok()))
                .collect();
            *ips = Some(used);
        }
        let used = ips.get_or_insert_with(HashSet::new);
        let ip = allocate(&cidr, used).ok_or_else(|| anyhow!("no free address in podCIDR {cidr}"))?;
        used.insert(ip);
        Ok((ip, cidr))
    }

    /// Give back one reserved IP (its sandbox never came up).
    pub async fn release_ip(&self, ip: Ipv4Addr) {
        if let Some(used) = self.ips.lock().await.as_mut() {
            used.remove(&ip);
        }
    }

    /// Give back the IPs of removed pause containers.
    pub async fn release_ips(&self, records: &[ContainerRecord]) {
        let mut ips = self.ips.lock().await;
        if let Some(used) = ips.as_mut() {
            for r in records.iter().filter(|r| r.kind == Kind::Sandbox) {
                if let Some(ip) = r.pod_ip().and_then(|ip| ip.parse::<Ipv4Addr>().ok()) {
                    used.remove(&ip);
                }
            }
        }
    }

    /// Plug a pod's pause container (`sandbox_id`) into the node's bridge (created on first
    /// use) with address `ip`. On failure the pod's veth is gone again.
    /// `capture`: a meshed pod's traffic capture rules (see `common::mesh`).
    pub async fn attach(
        &self,
        pod_uid: &str,
        sandbox_id: &str,
        ip: Ipv4Addr,
        cidr: &Cidr,
        capture: Option<String>,
    ) -> Result<()> {
        let pid = self.runtime()?.pid(sandbox_id).await?.ok_or_else(|| anyhow!("pause container has no pid"))?;
        self.attach_pid(pod_uid, pid, ip, cidr, capture).await
    }

    /// [`PodNetwork::attach`] for the network namespace of process `pid` (the pause
    /// container's; with `--network-only`, any process's).
    pub async fn attach_pid(
        &self,
        pod_uid: &str,
        pid: i64,
        ip: Ipv4Addr,
        cidr: &Cidr,
        capture: Option<String>,
    ) -> Result<()> {
        let mtu = self.pod_mtu().await;
        let bridge = {
            let mut b = self.bridge.lock().await;
            match b.as_ref() {
                Some(b) => b.clone(),
                None => {
                    let name = ensure_bridge(&self.node, cidr, mtu).await?;
                    *b = Some(name.clone());
                    name
                }
            }
        };
        let (host, peer) = veth_names(pod_uid);
        if let Err(e) = crate::netlink::setup_pod(&bridge, &host, &peer, pid, ip, cidr, capture, mtu).await {
            let _ = crate::netlink::delete(&host).await;
            return Err(e);
        }
        // Hairpin (kubelet's --hairpin-mode=hairpin-veth): a pod reaching itself through a
        // Service's cluster IP leaves and re-enters by its own bridge port.
        if let Err(e) = std::fs::write(format!("/sys/class/net/{host}/brport/hairpin_mode"), "1") {
            tracing::warn!(veth = %host, error = %e, "cannot enable hairpin mode: the pod cannot reach itself through a Service");
        }
        Ok(())
    }

    /// The host ports pod `pod_uid` publishes now (none once it is gone): the node's
    /// hostPort chains are rewritten when the node's set changes (see `hostport.rs`).
    pub async fn publish_host_ports(&self, pod_uid: &str, ports: Vec<crate::hostport::HostPort>) {
        let mut hp = self.host_ports.lock().await;
        let unchanged = match hp.by_pod.get(pod_uid) {
            Some(old) => *old == ports,
            None => ports.is_empty(),
        };
        if unchanged && hp.applied {
            return;
        }
        if ports.is_empty() {
            hp.by_pod.remove(pod_uid);
        } else {
            hp.by_pod.insert(pod_uid.to_string(), ports);
        }
        // Nothing published and never written by this kubelet: no chains to create, but
        // an earlier run's (pods deleted while the kubelet was down) are emptied.
        if hp.by_pod.is_empty() && !hp.applied && unchanged && !crate::hostport::chains_exist(&self.node).await {
            hp.applied = true;
            return;
        }
        let all: Vec<crate::hostport::HostPort> = hp.by_pod.values().flatten().cloned().collect();
        let bridge = self.bridge.lock().await.clone();
        match crate::hostport::apply(&self.node, bridge.as_deref(), &all).await {
            Ok(()) => {
                hp.applied = true;
                tracing::info!(ports = all.len(), "wrote the host port rules");
            }
            Err(e) => {
                hp.applied = false;
                tracing::warn!(error = %format!("{e:#}"), "cannot write the host port rules");
            }
        }
    }

    /// Remove a pod's host-side veth (normally gone with its namespace already).
    pub async fn detach(&self, pod_uid: &str) {
        let (host, _) = veth_names(pod_uid);
        let _ = crate::netlink::delete(&host).await;
    }
}

/// The lowest address of `cidr` that is neither the network, the gateway, the broadcast
/// address nor in `used`.
pub fn allocate(cidr: &Cidr, used: &HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    let first = u32::from(cidr.network) + 2;
    (first..cidr.broadcast()).map(Ipv4Addr::from).find(|ip| !used.contains(ip))
}

pub fn bridge_name(node: &str) -> String {
    format!("mk8s{:08x}", fnv32(node))
}

/// Host-side veth of a pod (`mkv…`) and the temporary name of its peer (`mkp…`).
pub fn veth_names(pod_uid: &str) -> (String, String) {
    let h = fnv32(pod_uid);
    (format!("mkv{h:08x}"), format!("mkp{h:08x}"))
}

/// Create (or fix up) the node's bridge with the gateway address, enable forwarding and
/// accept forwarded traffic of the MiniK8s bridges (Docker sets FORWARD's policy to DROP).
async fn ensure_bridge(node: &str, cidr: &Cidr, mtu: Option<u32>) -> Result<String> {
    let br = bridge_name(node);
    crate::netlink::ensure_bridge(&br, cidr, mtu).await?;
    if let Err(e) = std::fs::write("/proc/sys/net/ipv4/ip_forward", "1") {
        tracing::warn!(error = %e, "cannot enable ip_forward");
    }
    for rule in [["-i", "mk8s+", "-j", "ACCEPT"], ["-o", "mk8s+", "-j", "ACCEPT"]] {
        let mut check = vec!["-w", "-C", "FORWARD"];
        check.extend_from_slice(&rule);
        if !succeeds("iptables", &check).await {
            let mut add = vec!["-w", "-I", "FORWARD"];
            add.extend_from_slice(&rule);
            if let Err(e) = run("iptables", &add).await {
                tracing::warn!(error = %format!("{e:#}"), "cannot add the FORWARD rule for pod bridges");
            }
        }
    }
    Ok(br)
}

/// The per-node nat chain for egress masquerade (`MK8S-MASQ-` + the bridge's hash).
pub fn masq_chain(node: &str) -> String {
    format!("MK8S-MASQ-{:08X}", fnv32(node))
}

/// The comment on the POSTROUTING jump (no spaces, so `iptables -S` output splits cleanly).
const MASQ_COMMENT: &str = "minik8s-pod-egress";

/// The POSTROUTING rule (after `-A POSTROUTING`) that sends this node's pod traffic to its chain.
pub fn masq_jump(chain: &str, pod_cidr: &Cidr) -> Vec<String> {
    ["-s", &pod_cidr.to_string(), "-m", "comment", "--comment", MASQ_COMMENT, "-j", chain]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// `iptables-restore --noflush` input that (re)writes the chain: traffic to a pod network of
/// the cluster (any node's podCIDR, or out of a MiniK8s bridge on this host) and to
/// multicast returns untouched; everything else is masqueraded.
pub fn masq_restore(chain: &str, pod_cidr: &Cidr, cluster_cidrs: &BTreeSet<Cidr>) -> String {
    let mut out = format!("*nat\n:{chain} - [0:0]\n");
    out.push_str(&format!("-A {chain} -o mk8s+ -j RETURN\n"));
    let mut dests: BTreeSet<Cidr> = cluster_cidrs.clone();
    dests.insert(*pod_cidr);
    for d in dests {
        out.push_str(&format!("-A {chain} -d {d} -j RETURN\n"));
    }
    out.push_str(&format!("-A {chain} -d 224.0.0.0/4 -j RETURN\n"));
    out.push_str(&format!("-A {chain} -j MASQUERADE\n"));
    out.push_str("COMMIT\n");
    out
}

/// The POSTROUTING rules of `iptables -t nat -S POSTROUTING` output that jump to `chain`
/// but are not `keep` (e.g. left from an earlier podCIDR): the arguments to `-D POSTROUTING`.
pub fn stale_jumps(listing: &str, chain: &str, keep: Option<&[String]>) -> Vec<Vec<String>> {
    listing
        .lines()
        .filter_map(|l| l.strip_prefix("-A POSTROUTING "))
        .map(|rest| rest.split_whitespace().map(|s| s.trim_matches('"').to_string()).collect::<Vec<_>>())
        .filter(|args| args.windows(2).any(|w| w[0] == "-j" && w[1] == chain))
        .filter(|args| keep != Some(&args[..]))
        .collect()
}

/// What the route decision needs to know of a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNet {
    pub name: String,
    pub pod_cidr: Option<Cidr>,
    pub internal_ip: Option<Ipv4Addr>,
    /// The Node's UID (the involved object of events about it).
    pub uid: Option<String>,
    /// Its VTEP annotations (the VXLAN backend).
    pub vtep: VtepAnnotations,
}

impl NodeNet {
    pub fn from_node(n: &Node) -> NodeNet {
        let spec = n.spec.clone().unwrap_or_default();
        let pod_cidr = spec
            .pod_cidr
            .or_else(|| spec.pod_cidrs.and_then(|v| v.into_iter().next()))
            .and_then(|c| c.parse::<Cidr>().ok());
        let internal_ip = n
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP").and_then(|a| a.address.parse().ok()));
        NodeNet {
            name: n.metadata.name.clone().unwrap_or_default(),
            pod_cidr,
            internal_ip,
            uid: n.metadata.uid.clone(),
            vtep: VtepAnnotations::from_annotations(n.metadata.annotations.as_ref()),
        }
    }

    fn overlay(&self) -> OverlayNode {
        OverlayNode {
            name: self.name.clone(),
            pod_cidr: self.pod_cidr,
            internal_ip: self.internal_ip,
            vtep: self.vtep.clone(),
        }
    }
}

/// host-gw: the routes `podCIDR via InternalIP` this host needs — one per other node whose
/// InternalIP is not an address of this host (such nodes' bridges are local) nor loopback,
/// and whose podCIDR overlaps neither this node's nor an earlier-chosen one (first by name
/// wins, so every host decides alike).
pub fn desired_routes(
    self_node: &str,
    own_cidr: Option<&Cidr>,
    nodes: &[NodeNet],
    local_addrs: &HashSet<Ipv4Addr>,
) -> BTreeMap<Cidr, Via> {
    let mut sorted: Vec<&NodeNet> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out: BTreeMap<Cidr, Via> = BTreeMap::new();
    for n in sorted {
        if n.name == self_node {
            continue;
        }
        let (Some(cidr), Some(ip)) = (n.pod_cidr, n.internal_ip) else { continue };
        if ip.is_loopback() || ip.is_unspecified() || local_addrs.contains(&ip) {
            continue;
        }
        if own_cidr.is_some_and(|o| o.overlaps(&cidr)) || out.keys().any(|c| c.overlaps(&cidr)) {
            tracing::warn!(node = %n.name, %cidr, "podCIDR overlaps another node's; no route");
            continue;
        }
        out.insert(cidr, Via::gateway(ip));
    }
    out
}

/// Write the node's egress masquerade chain and its POSTROUTING jump (idempotent), and drop
/// jumps left from another podCIDR.
pub async fn apply_masquerade(node: &str, pod_cidr: &Cidr, cluster_cidrs: &BTreeSet<Cidr>) -> Result<()> {
    let chain = masq_chain(node);
    run_with_input("iptables-restore", &["-w", "--noflush"], &masq_restore(&chain, pod_cidr, cluster_cidrs)).await?;
    let jump = masq_jump(&chain, pod_cidr);
    let listing = output("iptables", &["-w", "-t", "nat", "-S", "POSTROUTING"]).await?;
    for stale in stale_jumps(&listing, &chain, Some(&jump)) {
        let mut args = vec!["-w", "-t", "nat", "-D", "POSTROUTING"];
        args.extend(stale.iter().map(String::as_str));
        run("iptables", &args).await?;
    }
    let mut check = vec!["-w", "-t", "nat", "-C", "POSTROUTING"];
    check.extend(jump.iter().map(String::as_str));
    if !succeeds("iptables", &check).await {
        let mut add = vec!["-w", "-t", "nat", "-A", "POSTROUTING"];
        add.extend(jump.iter().map(String::as_str));
        run("iptables", &add).await?;
    }
    Ok(())
}

/// Routes `destination via gateway [dev …]`.
type RouteList = Vec<(Cidr, Via)>;

/// The route changes that make this host's `proto 107` routes match `desired`: routes to add
/// or replace, and routes to delete. Only routes to a podCIDR of this cluster (`known`: every
/// podCIDR its Nodes have had) are deleted, so a kubelet of another cluster sharing the host
/// keeps its routes. A host-gw route leaves the device to the kernel; an overlay route
/// names the VXLAN device (so switching backends replaces every route).
pub fn route_changes(
    current: &BTreeMap<Cidr, Via>,
    desired: &BTreeMap<Cidr, Via>,
    known: &BTreeSet<Cidr>,
) -> (RouteList, RouteList) {
    let add = desired
        .iter()
        .filter(|(c, want)| !current.get(c).is_some_and(|have| have.satisfies(want)))
        .map(|(c, g)| (*c, *g))
        .collect();
    let del =
        current.iter().filter(|(c, _)| known.contains(c) && !desired.contains_key(c)).map(|(c, g)| (*c, *g)).collect();
    (add, del)
}

/// Apply [`route_changes`] to the host's routing table. A route that cannot be added is a
/// warning for host-gw (a node not on-link) and an error for the overlay.
async fn apply_routes(desired: &BTreeMap<Cidr, Via>, known: &BTreeSet<Cidr>) -> Result<()> {
    let current = crate::netlink::our_routes().await?;
    let (add, del) = route_changes(&current, desired, known);
    for (cidr, via) in del {
        tracing::info!(%cidr, gw = %via.gateway, "removing route to another node's pods");
        crate::netlink::delete_route(&cidr, &via).await?;
    }
    let mut failed = 0;
    for (cidr, via) in add {
        tracing::info!(%cidr, gw = %via.gateway, dev = ?via.device, "route to another node's pods");
        if let Err(e) = crate::netlink::replace_route(&cidr, &via).await {
            failed += 1;
            tracing::warn!(%cidr, gw = %via.gateway, error = %format!("{e:#}"), "cannot add the route (node not on-link?)");
        }
    }
    if failed > 0 && desired.values().any(|v| v.device.is_some()) {
        return Err(anyhow!("{failed} overlay routes could not be added"));
    }
    Ok(())
}

/// The MTU of the link holding `node_ip`, else 1500.
async fn underlay_mtu(node_ip: Ipv4Addr) -> u32 {
    match crate::netlink::mtu_of_address(node_ip).await {
        Ok(Some(m)) => m,
        Ok(None) => {
            tracing::warn!(%node_ip, "the node's address is on no link of this host; assuming an underlay MTU of 1500");
            1500
        }
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "cannot read the underlay's MTU; assuming 1500");
            1500
        }
    }
}

/// The VXLAN device as this kubelet last made sure of it.
#[derive(Debug, Clone, Copy)]
struct Vtep {
    index: u32,
    mac: crate::overlay::Mac,
}

/// Make the node's VXLAN device what it should be: created (again, when its configuration
/// differs), MTU, up, and the network address of the podCIDR.
async fn ensure_vtep(node_ip: Ipv4Addr, own: Option<&Cidr>) -> Result<Vtep> {
    use crate::overlay::{DeviceSpec, VNI, VXLAN_DEVICE, VXLAN_PORT};
    let mtu = crate::overlay::overlay_mtu(underlay_mtu(node_ip).await);
    let spec = DeviceSpec { vni: VNI, port: VXLAN_PORT, local: node_ip, mtu };
    let (index, mac, recreated) = crate::netlink::ensure_vxlan(VXLAN_DEVICE, &spec).await?;
    if let Some(why) = recreated {
        tracing::warn!(device = VXLAN_DEVICE, reason = %why, "recreated the VXLAN device");
    }
    if let Some(own) = own {
        crate::netlink::ensure_host_address(index, own.network).await?;
    }
    Ok(Vtep { index, mac })
}

/// Make the VXLAN device's neighbours and forwarding entries match `plan`.
async fn apply_overlay_entries(device: u32, plan: &crate::overlay::OverlayPlan) -> Result<()> {
    let current = crate::netlink::neighbours(device).await?;
    let (set, del) = crate::overlay::neighbour_changes(&current, &plan.neighbours);
    for ip in del {
        tracing::info!(%ip, "removing the overlay neighbour");
        crate::netlink::delete_neighbour(device, ip).await?;
    }
    for (ip, mac) in set {
        tracing::info!(%ip, %mac, "overlay neighbour");
        crate::netlink::set_neighbour(device, ip, mac).await?;
    }
    let current = crate::netlink::fdb(device).await?;
    let (del, set) = crate::overlay::fdb_changes(&current, &plan.fdb);
    for mac in del {
        tracing::info!(%mac, "removing the overlay forwarding entry");
        crate::netlink::delete_fdb(device, mac).await?;
    }
    for (mac, ip) in set {
        tracing::info!(%mac, dst = %ip, "overlay forwarding entry");
        crate::netlink::set_fdb(device, mac, ip).await?;
    }
    Ok(())
}

/// What the loop last applied, so an unchanged state writes nothing.
#[derive(Default)]
struct Applied {
    masq: Option<(Cidr, BTreeSet<Cidr>)>,
    routes: Option<BTreeMap<Cidr, Via>>,
    overlay: Option<crate::overlay::OverlayPlan>,
    vtep: Option<Vtep>,
}

impl PodNetwork {
    /// The network loop: a watch of Nodes driving the egress masquerade chain and the
    /// backend's routes (and, for VXLAN, the device, its entries and this Node's VTEP
    /// annotations), re-applied on every change and once a minute (in case something
    /// flushed them). `events`: where a node skipped for a bad VTEP is reported.
    pub async fn run_node_network(self: Arc<Self>, client: kube::Client, events: crate::events::Events) {
        let api: Api<Node> = Api::all(client);
        let mut stream = watcher(api.clone(), watcher::Config::default()).default_backoff().boxed();
        let mut nodes: HashMap<String, NodeNet> = HashMap::new();
        let mut relist: HashMap<String, NodeNet> = HashMap::new();
        let mut synced = false;
        let mut applied = Applied::default();
        let mut known: BTreeSet<Cidr> = BTreeSet::new();
        // The (node, reason) pairs already reported, so each bad annotation is one event.
        let mut reported: HashSet<(String, String)> = HashSet::new();
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    Some(Ok(watcher::Event::Apply(n))) => { nodes.insert(n.metadata.name.clone().unwrap_or_default(), NodeNet::from_node(&n)); }
                    Some(Ok(watcher::Event::Delete(n))) => { nodes.remove(n.metadata.name.as_deref().unwrap_or_default()); }
                    Some(Ok(watcher::Event::Init)) => relist.clear(),
                    Some(Ok(watcher::Event::InitApply(n))) => { relist.insert(n.metadata.name.clone().unwrap_or_default(), NodeNet::from_node(&n)); }
                    Some(Ok(watcher::Event::InitDone)) => { nodes = std::mem::take(&mut relist); synced = true; }
                    Some(Err(e)) => { tracing::debug!(error = %e, "node watch"); continue; }
                    None => return,
                },
                _ = tick.tick() => { applied = Applied::default(); }
            }
            if !synced {
                continue;
            }
            let own = self.cidr().or_else(|| nodes.get(&self.node).and_then(|n| n.pod_cidr));
            let list: Vec<NodeNet> = nodes.values().cloned().collect();
            let before = known.len();
            known.extend(list.iter().filter_map(|n| n.pod_cidr));
            if known.len() != before {
                applied.routes = None;
            }
            if let Some(own) = own {
                let cluster: BTreeSet<Cidr> = list.iter().filter_map(|n| n.pod_cidr).collect();
                let want = (own, cluster);
                if applied.masq.as_ref() != Some(&want) {
                    match apply_masquerade(&self.node, &want.0, &want.1).await {
                        Ok(()) => applied.masq = Some(want),
                        Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot write the egress masquerade rules"),
                    }
                }
            }
            let local = match crate::netlink::local_ipv4_addrs().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot list this host's addresses");
                    continue;
                }
            };
            match self.backend {
                Backend::HostGw => {
                    // A VTEP published by an earlier vxlan run is withdrawn.
                    if let Some(me) = nodes.get(&self.node) {
                        self.publish_vtep(&api, &me.vtep, None).await;
                    }
                    let want = desired_routes(&self.node, own.as_ref(), &list, &local);
                    if applied.routes.as_ref() != Some(&want) {
                        match apply_routes(&want, &known).await {
                            Ok(()) => applied.routes = Some(want),
                            Err(e) => {
                                tracing::warn!(error = %format!("{e:#}"), "cannot apply the routes to other nodes")
                            }
                        }
                    }
                }
                Backend::Vxlan => {
                    self.overlay_step(&api, &events, own.as_ref(), &nodes, &local, &known, &mut applied, &mut reported)
                        .await
                }
            }
        }
    }

    /// One pass of the VXLAN backend: the device, this Node's annotations, and the routes,
    /// neighbours and forwarding entries towards the other nodes.
    #[allow(clippy::too_many_arguments)]
    async fn overlay_step(
        &self,
        api: &Api<Node>,
        events: &crate::events::Events,
        own: Option<&Cidr>,
        nodes: &HashMap<String, NodeNet>,
        local: &HashSet<Ipv4Addr>,
        known: &BTreeSet<Cidr>,
        applied: &mut Applied,
        reported: &mut HashSet<(String, String)>,
    ) {
        let vtep = match applied.vtep {
            Some(v) => v,
            None => match ensure_vtep(self.node_ip, own).await {
                Ok(v) => {
                    applied.vtep = Some(v);
                    // A new device has none of the entries.
                    applied.overlay = None;
                    applied.routes = None;
                    v
                }
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot set up the VXLAN device");
                    return;
                }
            },
        };
        if let Some(me) = nodes.get(&self.node) {
            self.publish_vtep(api, &me.vtep, Some((vtep.mac, self.node_ip))).await;
        }
        let overlay_nodes: Vec<OverlayNode> = nodes.values().map(NodeNet::overlay).collect();
        let (plan, skipped) = crate::overlay::desired_overlay(&self.node, own, &overlay_nodes, local, vtep.index);
        reported.retain(|(node, reason)| skipped.iter().any(|s| &s.node == node && &s.reason == reason));
        for s in skipped {
            if reported.insert((s.node.clone(), s.reason.clone())) {
                tracing::warn!(node = %s.node, reason = %s.reason, "node left out of the overlay");
                let uid = nodes.get(&s.node).and_then(|n| n.uid.clone());
                events.node_warning(
                    &s.node,
                    uid,
                    "InvalidVtep",
                    format!("Node left out of the VXLAN overlay: {}", s.reason),
                );
            }
        }
        if applied.overlay.as_ref() != Some(&plan) || applied.routes.as_ref() != Some(&plan.routes) {
            let res = async {
                apply_overlay_entries(vtep.index, &plan).await?;
                apply_routes(&plan.routes, known).await
            }
            .await;
            match res {
                Ok(()) => {
                    applied.routes = Some(plan.routes.clone());
                    applied.overlay = Some(plan);
                }
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot program the overlay");
                    // The device may be gone: look again next time.
                    applied.vtep = None;
                }
            }
        }
    }

    /// Patch this Node's VTEP annotations when they differ from `vtep` (`None`: withdraw).
    async fn publish_vtep(
        &self,
        api: &Api<Node>,
        have: &VtepAnnotations,
        vtep: Option<(crate::overlay::Mac, Ipv4Addr)>,
    ) {
        let Some(patch) = crate::overlay::annotation_patch(have, vtep) else { return };
        match api.patch(&self.node, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await {
            Ok(_) => tracing::info!(vtep = ?vtep.map(|v| v.0.to_string()), "published the node's VTEP annotations"),
            Err(e) => tracing::warn!(error = %e, "cannot patch the node's VTEP annotations"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_skips_used_and_reserved() {
        let c: Cidr = "10.1.0.0/30".parse().unwrap();
        let mut used = HashSet::new();
        assert_eq!(allocate(&c, &used), Some(Ipv4Addr::new(10, 1, 0, 2)));
        used.insert(Ipv4Addr::new(10, 1, 0, 2));
        assert_eq!(allocate(&c, &used), None);
    }

    fn nn(name: &str, cidr: &str, ip: &str) -> NodeNet {
        NodeNet {
            name: name.into(),
            pod_cidr: cidr.parse().ok(),
            internal_ip: ip.parse().ok(),
            uid: None,
            vtep: VtepAnnotations::default(),
        }
    }

    #[test]
    fn routes_only_to_nodes_on_other_hosts() {
        let local: HashSet<Ipv4Addr> = ["192.168.1.10".parse().unwrap(), "127.0.0.1".parse().unwrap()].into();
        let own: Cidr = "10.244.0.0/24".parse().unwrap();
        let nodes = vec![
            nn("me", "10.244.0.0/24", "192.168.1.10"),
            nn("same-host", "10.244.1.0/24", "192.168.1.10"),
            nn("loopback", "10.244.2.0/24", "127.0.0.2"),
            nn("remote", "10.244.3.0/24", "192.168.1.11"),
            nn("no-cidr", "", "192.168.1.12"),
            nn("no-ip", "10.244.5.0/24", ""),
            nn("clash-own", "10.244.0.0/25", "192.168.1.13"),
            nn("z-clash", "10.244.3.128/25", "192.168.1.14"),
        ];
        let want = desired_routes("me", Some(&own), &nodes, &local);
        assert_eq!(
            want,
            BTreeMap::from([("10.244.3.0/24".parse().unwrap(), Via::gateway("192.168.1.11".parse().unwrap()))])
        );
        // Without a podCIDR of its own the node still routes to the others.
        assert_eq!(desired_routes("me", None, &nodes, &local).len(), 2);
    }

    #[test]
    fn route_changes_leave_other_clusters_routes() {
        let c = |s: &str| s.parse::<Cidr>().unwrap();
        let ip = |s: &str| Via::gateway(s.parse::<Ipv4Addr>().unwrap());
        let current = BTreeMap::from([
            (c("10.244.1.0/24"), ip("192.168.1.11")), // still wanted
            (c("10.244.2.0/24"), ip("192.168.1.12")), // node moved to a new IP
            (c("10.244.3.0/24"), ip("192.168.1.13")), // node deleted
            (c("10.99.0.0/24"), ip("192.168.1.50")),  // another cluster's
        ]);
        let desired = BTreeMap::from([
            (c("10.244.1.0/24"), ip("192.168.1.11")),
            (c("10.244.2.0/24"), ip("192.168.1.22")),
            (c("10.244.4.0/24"), ip("192.168.1.14")),
        ]);
        let known: BTreeSet<Cidr> = ["10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24", "10.244.4.0/24"].map(c).into();
        let (add, del) = route_changes(&current, &desired, &known);
        assert_eq!(add, vec![(c("10.244.2.0/24"), ip("192.168.1.22")), (c("10.244.4.0/24"), ip("192.168.1.14"))]);
        assert_eq!(del, vec![(c("10.244.3.0/24"), ip("192.168.1.13"))]);
        // The kernel reports the device of a host-gw route; any device will do. Switching to
        // the overlay replaces it with a route on the VXLAN device.
        let on_eth = |g: &str| Via { gateway: g.parse().unwrap(), device: Some(2) };
        let current = BTreeMap::from([(c("10.244.1.0/24"), on_eth("192.168.1.11"))]);
        let desired = BTreeMap::from([(c("10.244.1.0/24"), ip("192.168.1.11"))]);
        assert_eq!(route_changes(&current, &desired, &known), (vec![], vec![]));
        let overlay = Via { gateway: "10.244.1.0".parse().unwrap(), device: Some(9) };
        let desired = BTreeMap::from([(c("10.244.1.0/24"), overlay)]);
        assert_eq!(route_changes(&current, &desired, &known), (vec![(c("10.244.1.0/24"), overlay)], vec![]));
    }

    #[test]
    fn masquerade_chain_returns_cluster_traffic_and_masquerades_the_rest() {
        let chain = masq_chain("node-a");
        assert!(chain.starts_with("MK8S-MASQ-") && chain.len() <= 28);
        let own: Cidr = "10.244.0.0/24".parse().unwrap();
        let cluster: BTreeSet<Cidr> = ["10.244.1.0/24".parse().unwrap(), own].into();
        let r = masq_restore(&chain, &own, &cluster);
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(lines[0], "*nat");
        assert_eq!(lines[1], format!(":{chain} - [0:0]"));
        assert_eq!(lines[2], format!("-A {chain} -o mk8s+ -j RETURN"));
        assert_eq!(lines[3], format!("-A {chain} -d 10.244.0.0/24 -j RETURN"));
        assert_eq!(lines[4], format!("-A {chain} -d 10.244.1.0/24 -j RETURN"));
        assert_eq!(lines[5], format!("-A {chain} -d 224.0.0.0/4 -j RETURN"));
        assert_eq!(lines[6], format!("-A {chain} -j MASQUERADE"));
        assert_eq!(lines[7], "COMMIT");
    }

    #[test]
    fn stale_jumps_keep_the_current_one() {
        let chain = masq_chain("node-a");
        let listing = format!(
            "-P POSTROUTING ACCEPT\n-A POSTROUTING -j KUBE-POSTROUTING\n\
             -A POSTROUTING -s 10.244.9.0/24 -m comment --comment minik8s-pod-egress -j {chain}\n\
             -A POSTROUTING -s 10.244.0.0/24 -m comment --comment minik8s-pod-egress -j {chain}\n\
             -A POSTROUTING -s 10.244.1.0/24 -m comment --comment minik8s-pod-egress -j MK8S-MASQ-OTHER\n"
        );
        let keep = masq_jump(&chain, &"10.244.0.0/24".parse().unwrap());
        let stale = stale_jumps(&listing, &chain, Some(&keep));
        assert_eq!(stale, vec![masq_jump(&chain, &"10.244.9.0/24".parse().unwrap())]);
        assert_eq!(stale_jumps(&listing, &chain, None).len(), 2);
    }

    #[test]
    fn interface_names_fit() {
        assert!(bridge_name("a-very-long-node-name-indeed").len() <= 15);
        let (h, p) = veth_names("0b5e7d4c-0000-4000-8000-000000000000");
        assert!(h.len() <= 15 && p.len() <= 15 && h != p);
    }
}
