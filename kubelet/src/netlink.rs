//! The pod network's link operations over rtnetlink (crate `rtnetlink`): the node bridge,
//! a veth pair per pod, the move of its inner end into the pause container's network
//! namespace (by PID), and the configuration inside that namespace (done on a dedicated
//! thread that has joined the namespace with `setns(2)`); the routes to other nodes' pod
//! networks (marked with [`ROUTE_PROTOCOL`]) and the host's own addresses; the VXLAN
//! backend's device, its neighbour entries and its forwarding database (AF_BRIDGE
//! neighbour messages with `NTF_SELF`, what `bridge fdb … self` sends).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use anyhow::{anyhow, Context, Result};
use futures::TryStreamExt;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkInfo, LinkMessage};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteProtocol};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{new_connection, Handle, LinkBridge, LinkUnspec, LinkVeth, LinkVxlan, RouteMessageBuilder};

use crate::cidr::Cidr;
use crate::overlay::{DeviceSpec, DeviceState, Mac, Via};

fn connect() -> Result<Handle> {
    let (conn, handle, _) = new_connection().context("opening a netlink socket")?;
    tokio::spawn(conn);
    Ok(handle)
}

fn not_found(e: &rtnetlink::Error) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.raw_code() == -libc::ENODEV)
}

/// The index of link `name`, if it exists.
async fn index(h: &Handle, name: &str) -> Result<Option<u32>> {
    match h.link().get().match_name(name.to_string()).execute().try_next().await {
        Ok(Some(l)) => Ok(Some(l.header.index)),
        Ok(None) => Ok(None),
        Err(e) if not_found(&e) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("looking up link {name}")),
    }
}

async fn must_index(h: &Handle, name: &str) -> Result<u32> {
    index(h, name).await?.ok_or_else(|| anyhow!("link {name} not found"))
}

/// Create the bridge if missing, give it the gateway address (and `mtu`, if given), bring
/// it up.
pub async fn ensure_bridge(name: &str, cidr: &Cidr, mtu: Option<u32>) -> Result<()> {
    let h = connect()?;
    if index(&h, name).await?.is_none() {
        if let Err(e) = h.link().add(LinkBridge::new(name).build()).execute().await {
            if !matches!(&e, rtnetlink::Error::NetlinkError(m) if m.raw_code() == -libc::EEXIST) {
                return Err(e).with_context(|| format!("creating bridge {name}"));
            }
        }
    }
    let idx = must_index(&h, name).await?;
    h.address()
        .add(idx, IpAddr::V4(cidr.gateway()), cidr.prefix)
        .replace()
        .execute()
        .await
        .with_context(|| format!("addressing bridge {name}"))?;
    let mut set = LinkUnspec::new_with_index(idx).up();
    if let Some(mtu) = mtu {
        set = set.mtu(mtu);
    }
    h.link().set(set.build()).execute().await.context("bringing the bridge up")?;
    Ok(())
}

/// Delete link `name` if it exists.
pub async fn delete(name: &str) -> Result<()> {
    let h = connect()?;
    if let Some(idx) = index(&h, name).await? {
        h.link().del(idx).execute().await.with_context(|| format!("deleting {name}"))?;
    }
    Ok(())
}

/// Create the veth pair, enslave the host end to the bridge, move the peer into the
/// namespace of `pid`, and configure it there as `eth0` with `ip` and a default route.
/// `mtu`: both ends' MTU (the overlay's), else the kernel's default.
///
/// `capture` (a meshed pod's traffic capture, `iptables-restore` input) is loaded in the
/// namespace too, before any of the pod's containers starts.
#[allow(clippy::too_many_arguments)]
pub async fn setup_pod(
    bridge: &str,
    host: &str,
    peer: &str,
    pid: i64,
    ip: Ipv4Addr,
    cidr: &Cidr,
    capture: Option<String>,
    mtu: Option<u32>,
) -> Result<()> {
    let h = connect()?;
    if let Some(idx) = index(&h, host).await? {
        let _ = h.link().del(idx).execute().await;
    }
    h.link().add(LinkVeth::new(host, peer).build()).execute().await.context("creating the veth pair")?;
    let br = must_index(&h, bridge).await?;
    let host_idx = must_index(&h, host).await?;
    let peer_idx = must_index(&h, peer).await?;
    if let Some(mtu) = mtu {
        for idx in [host_idx, peer_idx] {
            h.link()
                .set(LinkUnspec::new_with_index(idx).mtu(mtu).build())
                .execute()
                .await
                .context("setting the veth's MTU")?;
        }
    }
    h.link()
        .set(LinkUnspec::new_with_index(host_idx).controller(br).up().build())
        .execute()
        .await
        .context("attaching the veth to the bridge")?;
    let pid_u32 = u32::try_from(pid).map_err(|_| anyhow!("bad pid {pid}"))?;
    h.link()
        .set(LinkUnspec::new_with_index(peer_idx).setns_by_pid(pid_u32).build())
        .execute()
        .await
        .context("moving the veth into the pod's namespace")?;
    let (peer, cidr) = (peer.to_string(), *cidr);
    let inside = tokio::task::spawn_blocking(move || {
        in_netns(pid, move || async move {
            configure_inside(peer, ip, cidr).await?;
            match capture {
                Some(rules) => load_capture(&rules),
                None => Ok(()),
            }
        })
    })
    .await;
    inside.map_err(|e| anyhow!("netns thread: {e}"))?
}

/// Load `rules` with `iptables-restore --noflush` in this thread's network namespace (the
/// child process inherits it).
fn load_capture(rules: &str) -> Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new("iptables-restore")
        .arg("--noflush")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running iptables-restore for the sidecar's traffic capture")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(rules.as_bytes()).context("writing the capture rules")?;
    }
    let out = child.wait_with_output().context("waiting for iptables-restore")?;
    if !out.status.success() {
        return Err(anyhow!(
            "iptables-restore (sidecar traffic capture): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Run `f` (async) on a fresh thread that joined the network namespace of `pid`.
fn in_netns<F, Fut>(pid: i64, f: F) -> Result<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<()>>,
{
    let path = format!("/proc/{pid}/ns/net");
    let ns = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    std::thread::spawn(move || -> Result<()> {
        // SAFETY: setns on this thread only, with a valid namespace fd that outlives the call.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("setns into the pod's network namespace");
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(f())
    })
    .join()
    .map_err(|_| anyhow!("netns thread panicked"))?
}

async fn configure_inside(peer: String, ip: Ipv4Addr, cidr: Cidr) -> Result<()> {
    let h = connect()?;
    let idx = must_index(&h, &peer).await?;
    h.link()
        .set(LinkUnspec::new_with_index(idx).name("eth0".into()).build())
        .execute()
        .await
        .context("renaming to eth0")?;
    h.address().add(idx, IpAddr::V4(ip), cidr.prefix).execute().await.context("adding the pod IP")?;
    h.link().set(LinkUnspec::new_with_index(idx).up().build()).execute().await.context("eth0 up")?;
    let lo = must_index(&h, "lo").await?;
    h.link().set(LinkUnspec::new_with_index(lo).up().build()).execute().await.context("lo up")?;
    let route = RouteMessageBuilder::<Ipv4Addr>::new().gateway(cidr.gateway()).build();
    h.route().add(route).execute().await.context("adding the default route")?;
    Ok(())
}

/// The route protocol marking MiniK8s' routes to other nodes' pod networks (`ip route`
/// shows it as `proto 107`), so the kubelet finds and replaces only its own.
pub const ROUTE_PROTOCOL: u8 = 107;

fn node_route(cidr: &Cidr, via: &Via) -> rtnetlink::packet_route::route::RouteMessage {
    let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(cidr.network, cidr.prefix)
        .gateway(via.gateway)
        .protocol(RouteProtocol::Other(ROUTE_PROTOCOL));
    if let Some(dev) = via.device {
        b = b.output_interface(dev).onlink();
    }
    b.build()
}

/// Every IPv4 address of this host's interfaces.
pub async fn local_ipv4_addrs() -> Result<HashSet<Ipv4Addr>> {
    let h = connect()?;
    let mut out = HashSet::new();
    let mut s = h.address().get().execute();
    while let Some(m) = s.try_next().await.context("listing addresses")? {
        for a in m.attributes {
            if let AddressAttribute::Address(IpAddr::V4(ip)) | AddressAttribute::Local(IpAddr::V4(ip)) = a {
                out.insert(ip);
            }
        }
    }
    Ok(out)
}

/// The main table's routes carrying [`ROUTE_PROTOCOL`]: destination → gateway and device.
pub async fn our_routes() -> Result<BTreeMap<Cidr, Via>> {
    let h = connect()?;
    let mut out = BTreeMap::new();
    let mut s = h.route().get(RouteMessageBuilder::<Ipv4Addr>::new().build()).execute();
    while let Some(m) = s.try_next().await.context("listing routes")? {
        if m.header.protocol != RouteProtocol::Other(ROUTE_PROTOCOL) {
            continue;
        }
        let (mut dst, mut gw, mut dev) = (None, None, None);
        for a in &m.attributes {
            match a {
                RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(*ip),
                RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gw = Some(*ip),
                RouteAttribute::Oif(i) => dev = Some(*i),
                _ => {}
            }
        }
        if let (Some(dst), Some(gateway)) = (dst, gw) {
            out.insert(Cidr { network: dst, prefix: m.header.destination_prefix_length }, Via { gateway, device: dev });
        }
    }
    Ok(out)
}

/// Add or replace the route `cidr via gw [dev D onlink]`.
pub async fn replace_route(cidr: &Cidr, via: &Via) -> Result<()> {
    let h = connect()?;
    h.route()
        .add(node_route(cidr, via))
        .replace()
        .execute()
        .await
        .with_context(|| format!("ip route replace {cidr} via {}", via.gateway))
}

/// Remove the route `cidr via gw` (gone already is fine).
pub async fn delete_route(cidr: &Cidr, via: &Via) -> Result<()> {
    let h = connect()?;
    match h.route().del(node_route(cidr, via)).execute().await {
        Ok(()) => Ok(()),
        Err(rtnetlink::Error::NetlinkError(m)) if m.raw_code() == -libc::ESRCH => Ok(()),
        Err(e) => Err(e).with_context(|| format!("ip route del {cidr} via {}", via.gateway)),
    }
}

/// The MTU of the link holding address `ip` (the underlay of the overlay), if any has it.
pub async fn mtu_of_address(ip: Ipv4Addr) -> Result<Option<u32>> {
    let h = connect()?;
    let mut owner = None;
    let mut s = h.address().get().execute();
    while let Some(m) = s.try_next().await.context("listing addresses")? {
        let has = m.attributes.iter().any(|a| {
            matches!(a, AddressAttribute::Address(IpAddr::V4(a)) | AddressAttribute::Local(IpAddr::V4(a)) if *a == ip)
        });
        if has {
            owner = Some(m.header.index);
            break;
        }
    }
    let Some(idx) = owner else { return Ok(None) };
    let mut links = h.link().get().match_index(idx).execute();
    let link = links.try_next().await.context("looking up the underlay link")?;
    Ok(link.and_then(|l| {
        l.attributes.iter().find_map(|a| match a {
            LinkAttribute::Mtu(m) => Some(*m),
            _ => None,
        })
    }))
}

/// How the kernel has link `l` configured, as far as a VXLAN device goes.
fn device_state(l: &LinkMessage) -> DeviceState {
    let mut st = DeviceState::default();
    for a in &l.attributes {
        let LinkAttribute::LinkInfo(infos) = a else { continue };
        for i in infos {
            match i {
                LinkInfo::Kind(InfoKind::Vxlan) => st.is_vxlan = true,
                LinkInfo::Data(InfoData::Vxlan(data)) => {
                    for d in data {
                        match d {
                            InfoVxlan::Id(v) => st.vni = Some(*v),
                            InfoVxlan::Port(p) => st.port = Some(*p),
                            InfoVxlan::Local(ip) => st.local = Some(*ip),
                            InfoVxlan::Learning(l) => st.learning = Some(*l),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
    }
    st
}

async fn link_by_name(h: &Handle, name: &str) -> Result<Option<LinkMessage>> {
    match h.link().get().match_name(name.to_string()).execute().try_next().await {
        Ok(l) => Ok(l),
        Err(e) if not_found(&e) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("looking up link {name}")),
    }
}

/// Create the VXLAN device `name` as `spec` says (an existing one of another configuration
/// is deleted first: the reason is returned), set its MTU and bring it up; its index and
/// MAC address.
pub async fn ensure_vxlan(name: &str, spec: &DeviceSpec) -> Result<(u32, Mac, Option<String>)> {
    let h = connect()?;
    let mut recreated = None;
    if let Some(l) = link_by_name(&h, name).await? {
        if let Some(why) = crate::overlay::device_mismatch(&device_state(&l), spec) {
            h.link().del(l.header.index).execute().await.with_context(|| format!("deleting {name} ({why})"))?;
            recreated = Some(why);
        }
    }
    if link_by_name(&h, name).await?.is_none() {
        let add = LinkVxlan::new(name, spec.vni).port(spec.port).local(spec.local).learning(false).build();
        if let Err(e) = h.link().add(add).execute().await {
            if !matches!(&e, rtnetlink::Error::NetlinkError(m) if m.raw_code() == -libc::EEXIST) {
                return Err(e).with_context(|| format!("creating the VXLAN device {name}"));
            }
        }
    }
    let l = link_by_name(&h, name).await?.ok_or_else(|| anyhow!("link {name} not found"))?;
    let idx = l.header.index;
    h.link()
        .set(LinkUnspec::new_with_index(idx).mtu(spec.mtu).up().build())
        .execute()
        .await
        .with_context(|| format!("setting {name} up with MTU {}", spec.mtu))?;
    let mac = l
        .attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(b) => Mac::from_bytes(b),
            _ => None,
        })
        .ok_or_else(|| anyhow!("{name} has no usable MAC address"))?;
    Ok((idx, mac, recreated))
}

/// Give link `idx` the address `ip/32` (idempotent).
pub async fn ensure_host_address(idx: u32, ip: Ipv4Addr) -> Result<()> {
    let h = connect()?;
    h.address().add(idx, IpAddr::V4(ip), 32).replace().execute().await.with_context(|| format!("adding {ip}/32"))
}

/// The IPv4 neighbour entries of link `idx`: address → MAC of a permanent entry (`None` for
/// any other entry).
pub async fn neighbours(idx: u32) -> Result<BTreeMap<Ipv4Addr, Option<Mac>>> {
    let h = connect()?;
    let mut out = BTreeMap::new();
    let mut s = h.neighbours().get().set_family(rtnetlink::IpVersion::V4).execute();
    while let Some(m) = s.try_next().await.context("listing neighbours")? {
        if m.header.ifindex != idx {
            continue;
        }
        let mut dst = None;
        let mut mac = None;
        for a in &m.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => dst = Some(*ip),
                NeighbourAttribute::LinkLocalAddress(b) => mac = Mac::from_bytes(b),
                _ => {}
            }
        }
        if let Some(dst) = dst {
            out.insert(dst, mac.filter(|_| m.header.state == NeighbourState::Permanent));
        }
    }
    Ok(out)
}

/// `ip neigh replace ip lladdr mac dev idx nud permanent`.
pub async fn set_neighbour(idx: u32, ip: Ipv4Addr, mac: Mac) -> Result<()> {
    let h = connect()?;
    h.neighbours()
        .add(idx, IpAddr::V4(ip))
        .link_local_address(&mac.0)
        .state(NeighbourState::Permanent)
        .replace()
        .execute()
        .await
        .with_context(|| format!("ip neigh replace {ip} lladdr {mac}"))
}

/// `ip neigh del ip dev idx` (gone already is fine).
pub async fn delete_neighbour(idx: u32, ip: Ipv4Addr) -> Result<()> {
    let h = connect()?;
    let mut m = NeighbourMessage::default();
    m.header.family = AddressFamily::Inet;
    m.header.ifindex = idx;
    m.attributes.push(NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)));
    delete_neighbour_message(&h, m).await.with_context(|| format!("ip neigh del {ip}"))
}

/// Delete the neighbour (or forwarding) entry `m` names; one already gone is fine.
async fn delete_neighbour_message(h: &Handle, m: NeighbourMessage) -> Result<(), rtnetlink::Error> {
    match h.neighbours().del(m).execute().await {
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENOENT => Ok(()),
        other => other,
    }
}

/// The forwarding database of the VXLAN device `idx` (`bridge fdb show dev …`): MAC → the
/// underlay addresses it is sent to.
pub async fn fdb(idx: u32) -> Result<BTreeMap<Mac, BTreeSet<Ipv4Addr>>> {
    let h = connect()?;
    let mut req = h.neighbours().get();
    req.message_mut().header.family = AddressFamily::Bridge;
    let mut out: BTreeMap<Mac, BTreeSet<Ipv4Addr>> = BTreeMap::new();
    let mut s = req.execute();
    while let Some(m) = s.try_next().await.context("listing the forwarding database")? {
        if m.header.ifindex != idx {
            continue;
        }
        let mut dst = None;
        let mut mac = None;
        for a in &m.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => dst = Some(*ip),
                // In an AF_BRIDGE message the crate leaves the destination as raw bytes.
                NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                    dst = <[u8; 4]>::try_from(b.as_slice()).ok().map(Ipv4Addr::from)
                }
                NeighbourAttribute::LinkLocalAddress(b) => mac = b.as_slice().try_into().ok().map(Mac),
                _ => {}
            }
        }
        if let Some(mac) = mac {
            let dsts = out.entry(mac).or_default();
            dsts.extend(dst);
        }
    }
    Ok(out)
}

/// `bridge fdb replace mac dev idx dst ip self permanent`.
pub async fn set_fdb(idx: u32, mac: Mac, ip: Ipv4Addr) -> Result<()> {
    let h = connect()?;
    h.neighbours()
        .add_bridge(idx, &mac.0)
        .destination(IpAddr::V4(ip))
        .flags(NeighbourFlags::Own)
        .state(NeighbourState::Permanent)
        .replace()
        .execute()
        .await
        .with_context(|| format!("bridge fdb replace {mac} dst {ip}"))
}

/// `bridge fdb del mac dev idx self` (every destination of the MAC; gone already is fine).
pub async fn delete_fdb(idx: u32, mac: Mac) -> Result<()> {
    let h = connect()?;
    let mut m = NeighbourMessage::default();
    m.header.family = AddressFamily::Bridge;
    m.header.ifindex = idx;
    m.header.flags = NeighbourFlags::Own;
    m.attributes.push(NeighbourAttribute::LinkLocalAddress(mac.0.to_vec()));
    delete_neighbour_message(&h, m).await.with_context(|| format!("bridge fdb del {mac}"))
}
