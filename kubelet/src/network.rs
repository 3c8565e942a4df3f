//! The pod network, CNI-style: one Linux bridge per node (named after the node) holding
//! the first address of the node's podCIDR as the pods' gateway; each pod gets a veth pair
//! whose inner end is moved into the pause container's network namespace (found through
//! its PID), named `eth0`, addressed from the podCIDR, with a default route via the bridge.
//!
//! Pods of different nodes on one host reach each other through the host's routing table
//! (every bridge has a connected route for its podCIDR) and FORWARD rules that accept
//! traffic from and to the `mk8s*` bridges. Address allocation is a pure function of the
//! addresses the running pause containers carry in their labels, so it survives restarts.
//!
//! Links are configured over rtnetlink (see `netlink.rs`); the FORWARD rules with iptables.

use std::collections::HashSet;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use anyhow::{bail, Context, Result};

/// An IPv4 CIDR block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub network: Ipv4Addr,
    pub prefix: u8,
}

impl FromStr for Cidr {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Cidr> {
        let (a, p) = s.split_once('/').with_context(|| format!("{s:?} is not a CIDR"))?;
        let addr: Ipv4Addr = a.parse().with_context(|| format!("{s:?}: bad address"))?;
        let prefix: u8 = p.parse().with_context(|| format!("{s:?}: bad prefix"))?;
        if prefix > 30 {
            bail!("{s:?}: prefix must be at most /30");
        }
        let mask = mask(prefix);
        Ok(Cidr { network: Ipv4Addr::from(u32::from(addr) & mask), prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    }
}

impl Cidr {
    /// The bridge's address, the pods' default gateway.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }
    #[allow(dead_code)]
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.prefix) == u32::from(self.network)
    }
    fn broadcast(&self) -> u32 {
        u32::from(self.network) | !mask(self.prefix)
    }
}

/// The lowest address of `cidr` that is neither the network, the gateway, the broadcast
/// address nor in `used`.
pub fn allocate(cidr: &Cidr, used: &HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    let first = u32::from(cidr.network) + 2;
    (first..cidr.broadcast()).map(Ipv4Addr::from).find(|ip| !used.contains(ip))
}

/// A short stable hash for interface names (at most 15 bytes on Linux).
fn fnv32(s: &str) -> u32 {
    let mut h: u32 = 0x811c9dc5;
    for b in s.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    h
}

pub fn bridge_name(node: &str) -> String {
    format!("mk8s{:08x}", fnv32(node))
}

/// Host-side veth of a pod (`mkv…`) and the temporary name of its peer (`mkp…`).
pub fn veth_names(pod_uid: &str) -> (String, String) {
    let h = fnv32(pod_uid);
    (format!("mkv{h:08x}"), format!("mkp{h:08x}"))
}

async fn run(cmd: &str, args: &[&str]) -> Result<()> {
    let out = tokio::process::Command::new(cmd).args(args).output().await.with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

async fn succeeds(cmd: &str, args: &[&str]) -> bool {
    tokio::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Create (or fix up) the node's bridge with the gateway address, enable forwarding and
/// accept forwarded traffic of the MiniK8s bridges (Docker sets FORWARD's policy to DROP).
pub async fn ensure_bridge(node: &str, cidr: &Cidr) -> Result<String> {
    let br = bridge_name(node);
    crate::netlink::ensure_bridge(&br, cidr).await?;
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

/// Plug the network namespace of process `pid` (the pause container) into the bridge.
pub async fn setup_pod(bridge: &str, pod_uid: &str, pid: i64, ip: Ipv4Addr, cidr: &Cidr) -> Result<()> {
    let (host, peer) = veth_names(pod_uid);
    if let Err(e) = crate::netlink::setup_pod(bridge, &host, &peer, pid, ip, cidr).await {
        let _ = crate::netlink::delete(&host).await;
        return Err(e);
    }
    Ok(())
}

/// Remove a pod's host-side veth (normally gone with its namespace already).
pub async fn teardown_pod(pod_uid: &str) {
    let (host, _) = veth_names(pod_uid);
    let _ = crate::netlink::delete(&host).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parse_and_gateway() {
        let c: Cidr = "10.244.3.7/24".parse().unwrap();
        assert_eq!(c.to_string(), "10.244.3.0/24");
        assert_eq!(c.gateway(), Ipv4Addr::new(10, 244, 3, 1));
        assert!(c.contains(Ipv4Addr::new(10, 244, 3, 200)));
        assert!(!c.contains(Ipv4Addr::new(10, 244, 4, 1)));
        assert!("10.0.0.0".parse::<Cidr>().is_err());
    }

    #[test]
    fn allocation_skips_used_and_reserved() {
        let c: Cidr = "10.1.0.0/30".parse().unwrap();
        let mut used = HashSet::new();
        assert_eq!(allocate(&c, &used), Some(Ipv4Addr::new(10, 1, 0, 2)));
        used.insert(Ipv4Addr::new(10, 1, 0, 2));
        assert_eq!(allocate(&c, &used), None);
    }

    #[test]
    fn interface_names_fit() {
        assert!(bridge_name("a-very-long-node-name-indeed").len() <= 15);
        let (h, p) = veth_names("0b5e7d4c-0000-4000-8000-000000000000");
        assert!(h.len() <= 15 && p.len() <= 15 && h != p);
    }
}
