//! The pod network's link operations over rtnetlink (crate `rtnetlink`): the node bridge,
//! a veth pair per pod, the move of its inner end into the pause container's network
//! namespace (by PID), and the configuration inside that namespace (done on a dedicated
//! thread that has joined the namespace with `setns(2)`); the host-gw routes to other
//! nodes' pod networks (marked with [`ROUTE_PROTOCOL`]) and the host's own addresses.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use anyhow::{anyhow, Context, Result};
use futures::TryStreamExt;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteProtocol};
use rtnetlink::{new_connection, Handle, LinkBridge, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::cidr::Cidr;

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

/// Create the bridge if missing, give it the gateway address, bring it up.
pub async fn ensure_bridge(name: &str, cidr: &Cidr) -> Result<()> {
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
    h.link().set(LinkUnspec::new_with_index(idx).up().build()).execute().await.context("bringing the bridge up")?;
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
///
/// `capture` (a meshed pod's traffic capture, `iptables-restore` input) is loaded in the
/// namespace too, before any of the pod's containers starts.
pub async fn setup_pod(
    bridge: &str,
    host: &str,
    peer: &str,
    pid: i64,
    ip: Ipv4Addr,
    cidr: &Cidr,
    capture: Option<String>,
) -> Result<()> {
    let h = connect()?;
    if let Some(idx) = index(&h, host).await? {
        let _ = h.link().del(idx).execute().await;
    }
    h.link().add(LinkVeth::new(host, peer).build()).execute().await.context("creating the veth pair")?;
    let br = must_index(&h, bridge).await?;
    let host_idx = must_index(&h, host).await?;
    h.link()
        .set(LinkUnspec::new_with_index(host_idx).controller(br).up().build())
        .execute()
        .await
        .context("attaching the veth to the bridge")?;
    let peer_idx = must_index(&h, peer).await?;
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

fn node_route(cidr: &Cidr, gw: Ipv4Addr) -> rtnetlink::packet_route::route::RouteMessage {
    RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(cidr.network, cidr.prefix)
        .gateway(gw)
        .protocol(RouteProtocol::Other(ROUTE_PROTOCOL))
        .build()
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

/// The main table's routes carrying [`ROUTE_PROTOCOL`]: destination → gateway.
pub async fn our_routes() -> Result<BTreeMap<Cidr, Ipv4Addr>> {
    let h = connect()?;
    let mut out = BTreeMap::new();
    let mut s = h.route().get(RouteMessageBuilder::<Ipv4Addr>::new().build()).execute();
    while let Some(m) = s.try_next().await.context("listing routes")? {
        if m.header.protocol != RouteProtocol::Other(ROUTE_PROTOCOL) {
            continue;
        }
        let (mut dst, mut gw) = (None, None);
        for a in &m.attributes {
            match a {
                RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(*ip),
                RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gw = Some(*ip),
                _ => {}
            }
        }
        if let (Some(dst), Some(gw)) = (dst, gw) {
            out.insert(Cidr { network: dst, prefix: m.header.destination_prefix_length }, gw);
        }
    }
    Ok(out)
}

/// Add or replace the route `cidr via gw`.
pub async fn replace_route(cidr: &Cidr, gw: Ipv4Addr) -> Result<()> {
    let h = connect()?;
    h.route()
        .add(node_route(cidr, gw))
        .replace()
        .execute()
        .await
        .with_context(|| format!("ip route replace {cidr} via {gw}"))
}

/// Remove the route `cidr via gw` (gone already is fine).
pub async fn delete_route(cidr: &Cidr, gw: Ipv4Addr) -> Result<()> {
    let h = connect()?;
    match h.route().del(node_route(cidr, gw)).execute().await {
        Ok(()) => Ok(()),
        Err(rtnetlink::Error::NetlinkError(m)) if m.raw_code() == -libc::ESRCH => Ok(()),
        Err(e) => Err(e).with_context(|| format!("ip route del {cidr} via {gw}")),
    }
}
