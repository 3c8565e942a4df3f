//! The `kube-ipvs0` dummy device, the thin shell: IPVS only sees packets the host accepts
//! as its own, so every Service address (cluster, external and load balancer IPs) is bound
//! to this device as a /32, as kube-proxy does. The device stays down: the kernel adds the
//! local route of an address on a down device all the same, and a down dummy answers no
//! neighbour requests. [`sync`] creates it when missing and makes its addresses equal the
//! desired set ([`crate::ipvs::address_changes`]) in one `ip -batch`.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use anyhow::Context;

use crate::host::{parse_ip_addr, run_with_input};
use crate::ipvs::{address_changes, DUMMY_DEVICE};

fn ip(args: &[&str]) -> anyhow::Result<String> {
    run_with_input("ip", args, "")
}

/// Whether the device exists.
pub fn exists() -> bool {
    std::process::Command::new("ip")
        .args(["link", "show", "dev", DUMMY_DEVICE])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The link types tried, in order: `dummy` as kube-proxy; `ifb` where the kernel is built
/// without dummy devices (this machine's is): like a dummy it has no lower device and does
/// not answer ARP, and while down it carries no packets, only the addresses.
pub const LINK_TYPES: [&str; 2] = ["dummy", "ifb"];

/// Create the device when missing; returns the link type created (None: it existed).
pub fn ensure() -> anyhow::Result<Option<&'static str>> {
    if exists() {
        return Ok(None);
    }
    let mut errors = Vec::new();
    for kind in LINK_TYPES {
        match ip(&["link", "add", DUMMY_DEVICE, "type", kind]) {
            Ok(_) => {
                if kind != LINK_TYPES[0] {
                    tracing::info!(
                        device = DUMMY_DEVICE,
                        kind,
                        "the kernel has no dummy devices: created another kind"
                    );
                }
                return Ok(Some(kind));
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    anyhow::bail!("creating {DUMMY_DEVICE}: {}", errors.join("; "))
}

/// The device's IPv4 addresses (none when it does not exist).
pub fn addresses() -> anyhow::Result<BTreeSet<Ipv4Addr>> {
    if !exists() {
        return Ok(BTreeSet::new());
    }
    Ok(parse_ip_addr(&ip(&["-4", "-o", "addr", "show", "dev", DUMMY_DEVICE])?).into_iter().collect())
}

/// The `ip -batch` input that adds `add` and deletes `del` (pure).
pub fn batch(add: &[Ipv4Addr], del: &[Ipv4Addr]) -> String {
    let mut out = String::new();
    for a in add {
        out.push_str(&format!("address add {a}/32 dev {DUMMY_DEVICE}\n"));
    }
    for a in del {
        out.push_str(&format!("address del {a}/32 dev {DUMMY_DEVICE}\n"));
    }
    out
}

/// Make the device's addresses equal `desired`, from `current` (what it has, as read by
/// [`addresses`] or applied last). Returns how many addresses changed.
pub fn sync(current: &BTreeSet<Ipv4Addr>, desired: &BTreeSet<Ipv4Addr>) -> anyhow::Result<usize> {
    ensure()?;
    let (add, del) = address_changes(current, desired);
    if add.is_empty() && del.is_empty() {
        return Ok(0);
    }
    run_with_input("ip", &["-batch", "-"], &batch(&add, &del))
        .with_context(|| format!("changing the addresses of {DUMMY_DEVICE}"))?;
    Ok(add.len() + del.len())
}

/// Remove the device with its addresses (`--cleanup`); nothing when it does not exist.
pub fn remove() -> anyhow::Result<()> {
    if exists() {
        ip(&["link", "del", DUMMY_DEVICE])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_adds_then_deletes_host_addresses() {
        let a: Ipv4Addr = "10.96.0.1".parse().unwrap();
        let d: Ipv4Addr = "10.96.0.9".parse().unwrap();
        assert_eq!(
            batch(&[a], &[d]),
            "address add 10.96.0.1/32 dev kube-ipvs0\naddress del 10.96.0.9/32 dev kube-ipvs0\n"
        );
        assert_eq!(batch(&[], &[]), "");
    }
}
