//! The thin I/O shells that apply the rendered rules: `iptables-restore --noflush`, `nft -f`,
//! and (on kernels with `ip_vs`) IPVS. Each remembers what it applied last so the next sync
//! writes only the difference; after a failure or at start it resyncs from what the kernel has.

use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::Context;

use crate::host::run;
pub use crate::host::{local_addresses, parse_ip_addr, run_with_input};
use crate::iptables::{self, Config, Tables};
use crate::model::ServicePort;
use crate::{ipvs, ipvs_dummy, ipvs_iptables, ipvs_netlink, nft_netlink, nftables};

/// The outcome of one sync.
#[derive(Clone, Debug, Default)]
pub struct SyncStats {
    /// Rules (or map elements / real servers) in the desired state.
    pub rules: usize,
    /// Whether anything was written to the kernel.
    pub wrote: bool,
    /// Bytes of restore/script input written.
    pub bytes: usize,
    /// Time spent in the kernel's tool (`iptables-restore`, `nft`) of that.
    pub apply: std::time::Duration,
}

/// A proxy mode.
pub trait Backend: Send {
    fn name(&self) -> &'static str;
    /// Make the kernel match `ports`.
    fn sync(&mut self, ports: &[Arc<ServicePort>]) -> anyhow::Result<SyncStats>;
    /// Forget what was applied, so the next sync rewrites everything from the kernel's state.
    fn invalidate(&mut self);
}

/// Insert each jump rule at the top of its chain unless `iptables -C` finds it there.
pub fn ensure_jump_rules(rules: &[(&str, &str, Vec<String>)]) -> anyhow::Result<()> {
    for (table, chain, args) in rules {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut check = vec!["-w", "-t", table, "-C", chain];
        check.extend(&a);
        if run("iptables", &check).is_err() {
            let mut insert = vec!["-w", "-t", table, "-I", chain, "1"];
            insert.extend(&a);
            run("iptables", &insert)?;
        }
    }
    Ok(())
}

/// iptables mode: every chain on the first sync (and after a failure), then only the
/// chains that changed ([`iptables::Table`]).
pub struct Iptables {
    pub cfg: Config,
    /// None until the first sync, and after a failed one: the next sync starts from the
    /// kernel's chains.
    table: Option<iptables::Table>,
}

impl Iptables {
    pub fn new(cfg: Config) -> Self {
        Iptables { cfg, table: None }
    }

    /// What the kernel has now, as far as our chains go: their names with unknown content.
    fn kernel_state() -> anyhow::Result<Tables> {
        let (filter, nat) = Self::our_chains()?;
        let unknown = |names: BTreeSet<String>| names.into_iter().map(|c| (c, vec!["?".to_string()])).collect();
        Ok(Tables { filter: unknown(filter), nat: unknown(nat) })
    }

    /// Whether `iptables` is iptables-nft (Debian's default), whose tables `nft` lists.
    fn is_nft() -> bool {
        static NFT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *NFT.get_or_init(|| {
            run("iptables", &["--version"]).is_ok_and(|v| v.contains("nf_tables")) && run("nft", &["--version"]).is_ok()
        })
    }

    /// The names of our chains in the filter and nat tables: from one `nft list chains ip`
    /// where that lists iptables' tables (it reads no rules), else from `iptables-save`.
    fn our_chains() -> anyhow::Result<(BTreeSet<String>, BTreeSet<String>)> {
        if Self::is_nft() {
            if let Ok(listing) = run("nft", &["list", "chains", "ip"]) {
                return Ok((
                    iptables::owned_chains_in_nft_listing(&listing, "filter"),
                    iptables::owned_chains_in_nft_listing(&listing, "nat"),
                ));
            }
        }
        let save = |table: &str| run("iptables-save", &["-t", table]).map(|out| iptables::owned_chains(&out));
        Ok((save("filter")?, save("nat")?))
    }

    fn ensure_jumps() -> anyhow::Result<()> {
        ensure_jump_rules(&iptables::jump_rules())
    }

    /// Remove the jump rules and every `KUBE-*` chain (`--cleanup`), in one restore.
    pub fn cleanup() -> anyhow::Result<()> {
        // Our chains by name, and the rules of the chains the jump rules are in.
        let (filter, nat) = Self::our_chains()?;
        let rules = |table: &str| -> anyhow::Result<String> {
            let chains = iptables::jump_rule_chains(table);
            chains.into_iter().map(|chain| run("iptables", &["-w", "-t", table, "-S", chain])).collect()
        };
        let (filter_rules, nat_rules) = (rules("filter")?, rules("nat")?);
        let input = iptables::cleanup_input(
            &iptables::Found { owned: filter, rules: &filter_rules },
            &iptables::Found { owned: nat, rules: &nat_rules },
        );
        if let Some(input) = input {
            run_with_input("iptables-restore", &["-w", "--noflush"], &input)?;
        }
        Ok(())
    }
}

impl Backend for Iptables {
    fn name(&self) -> &'static str {
        "iptables"
    }

    fn sync(&mut self, ports: &[Arc<ServicePort>]) -> anyhow::Result<SyncStats> {
        let first = self.table.is_none();
        let mut table = match self.table.take() {
            Some(t) => t,
            None => iptables::Table::over(Self::kernel_state()?),
        };
        let input = table.sync(ports, &self.cfg);
        let mut stats = SyncStats { rules: table.rule_count(), ..Default::default() };
        if let Some(input) = input {
            stats.bytes = input.len();
            stats.wrote = true;
            // On failure the table is dropped: the next sync starts from the kernel again.
            let t = std::time::Instant::now();
            run_with_input("iptables-restore", &["-w", "--noflush"], &input)?;
            stats.apply = t.elapsed();
        }
        if first {
            Self::ensure_jumps()?;
        }
        self.table = Some(table);
        Ok(stats)
    }

    fn invalidate(&mut self) {
        self.table = None;
    }
}

/// nftables mode: the whole table with `nft -f` on the first sync (and after a failure),
/// then only what changed, sent as one netlink transaction when every change is of a form
/// [`crate::nft_netlink`] encodes (an endpoint or a Service coming or going), else with
/// `nft -f`. `nft` lists the whole table before each transaction, which at 10,000 Services
/// costs it more than the change.
pub struct Nftables {
    pub cfg: Config,
    table: nftables::Table,
    /// Opened at the first change sent over netlink.
    netlink: Option<nft_netlink::Connection>,
}

impl Nftables {
    pub fn new(cfg: Config) -> Self {
        Nftables { cfg, table: nftables::Table::default(), netlink: None }
    }

    /// Remove the `kube-proxy` table (`--cleanup`).
    pub fn cleanup() -> anyhow::Result<()> {
        run_with_input("nft", &["-f", "-"], &nftables::cleanup_script())?;
        Ok(())
    }
}

impl Backend for Nftables {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn sync(&mut self, ports: &[Arc<ServicePort>]) -> anyhow::Result<SyncStats> {
        let tx = self.table.sync(ports, &self.cfg);
        let mut stats = SyncStats { rules: self.table.rule_count(), ..Default::default() };
        let Some(tx) = tx else { return Ok(stats) };
        stats.wrote = true;
        let t = std::time::Instant::now();
        match (!tx.full).then(|| nft_netlink::encode(&tx.ops)).flatten() {
            Some(batch) => {
                stats.bytes = batch.len();
                let conn = match self.netlink.as_mut() {
                    Some(c) => c,
                    None => self.netlink.insert(nft_netlink::Connection::open()?),
                };
                conn.send(&batch).context("nftables netlink transaction")?;
            }
            None => {
                let script = tx.script(&self.cfg);
                stats.bytes = script.len();
                run_with_input("nft", &["-f", "-"], &script)?;
            }
        }
        stats.apply = t.elapsed();
        Ok(stats)
    }

    fn invalidate(&mut self) {
        self.table = nftables::Table::default();
        self.netlink = None;
    }
}

/// IPVS mode: each sync makes `kube-ipvs0`'s addresses equal the Service addresses, writes
/// the iptables helpers that changed ([`crate::ipvs_iptables`], `iptables-restore
/// --noflush`), then sends the IPVS operations between what was applied and what is desired
/// over generic netlink ([`ipvs_netlink::Connection`]). Refuses to start without `ip_vs`.
/// After a failure everything is read again from the kernel: the device's addresses, the
/// virtual servers on them and on the node addresses (an `IPVS_CMD_GET_SERVICE` dump and
/// one `IPVS_CMD_GET_DEST` dump each), and the iptables chains are all rewritten.
pub struct Ipvs {
    node_ips: Vec<std::net::Ipv4Addr>,
    scheduler: String,
    cfg: Config,
    /// What the last successful sync left in the kernel; None at start and after a failure.
    applied: Option<ipvs::State>,
    /// The iptables helpers as written last; None: every chain is written again.
    rules: Option<Tables>,
    netlink: Option<ipvs_netlink::Connection>,
}

impl Ipvs {
    /// Checks the kernel first (the `IPVS` generic netlink family), before anything is written.
    pub fn new(node_ips: Vec<std::net::Ipv4Addr>, scheduler: String, cfg: Config) -> anyhow::Result<Self> {
        ipvs_netlink::check_kernel()?;
        Ok(Ipvs { node_ips, scheduler, cfg, applied: None, rules: None, netlink: None })
    }

    /// The same without the kernel check: the integration test runs a sync's address and
    /// iptables steps for real on kernels without IPVS (the netlink step then fails).
    #[doc(hidden)]
    pub fn unchecked(node_ips: Vec<std::net::Ipv4Addr>, scheduler: String, cfg: Config) -> Self {
        Ipvs { node_ips, scheduler, cfg, applied: None, rules: None, netlink: None }
    }

    /// Remove `kube-ipvs0` and, where the kernel has IPVS, every virtual server (`--cleanup`,
    /// as kube-proxy's, which flushes the IPVS table).
    pub fn cleanup() -> anyhow::Result<()> {
        ipvs_dummy::remove()?;
        if ipvs_netlink::resolve_family(ipvs_netlink::IPVS_GENL_NAME)?.is_some() {
            ipvs_netlink::Connection::open()?.flush()?;
        }
        Ok(())
    }

    fn try_sync(&mut self, ports: &[Arc<ServicePort>], stats: &mut SyncStats) -> anyhow::Result<()> {
        let desired = ipvs::desired(ports, &self.node_ips, &self.scheduler);
        stats.rules = desired.services.values().map(|(_, r)| 1 + r.len()).sum();
        // 1. The Service addresses on kube-ipvs0.
        let bound = match &self.applied {
            Some(a) => a.bound.clone(),
            None => ipvs_dummy::addresses()?,
        };
        let t = std::time::Instant::now();
        if ipvs_dummy::sync(&bound, &desired.bound)? > 0 {
            stats.wrote = true;
        }
        // 2. The iptables helpers.
        let rules = ipvs_iptables::render(ports, &self.cfg, &self.node_ips);
        let first = self.rules.is_none();
        if let Some(input) = iptables::restore_input(self.rules.as_ref().unwrap_or(&Tables::default()), &rules) {
            stats.bytes += input.len();
            stats.wrote = true;
            run_with_input("iptables-restore", &["-w", "--noflush"], &input)?;
        }
        if first {
            ensure_jump_rules(&ipvs_iptables::jump_rules())?;
        }
        self.rules = Some(rules);
        // 3. The virtual servers.
        let conn = match self.netlink.as_mut() {
            Some(c) => c,
            None => self.netlink.insert(ipvs_netlink::Connection::open()?),
        };
        let current = match self.applied.take() {
            Some(a) => a,
            None => {
                let node_ips = &self.node_ips;
                let ours = |k: &ipvs::VsKey| {
                    bound.contains(&k.addr) || desired.bound.contains(&k.addr) || node_ips.contains(&k.addr)
                };
                ipvs::State { services: conn.read(ours)?, bound: desired.bound.clone() }
            }
        };
        let ops = ipvs::diff(&ipvs::State { bound: desired.bound.clone(), ..current }, &desired);
        if !ops.is_empty() {
            stats.wrote = true;
            conn.apply(&ops)?;
        }
        stats.apply = t.elapsed();
        self.applied = Some(desired);
        Ok(())
    }
}

impl Backend for Ipvs {
    fn name(&self) -> &'static str {
        "ipvs"
    }

    fn sync(&mut self, ports: &[Arc<ServicePort>]) -> anyhow::Result<SyncStats> {
        let mut stats = SyncStats::default();
        match self.try_sync(ports, &mut stats) {
            Ok(()) => Ok(stats),
            Err(e) => {
                self.invalidate();
                Err(e)
            }
        }
    }

    fn invalidate(&mut self) {
        self.applied = None;
        self.rules = None;
        self.netlink = None;
    }
}

/// Whether `ip` is inside `cidr` (`a.b.c.d/n`; a bare address is `/32`).
pub fn cidr_contains(cidr: &str, ip: std::net::Ipv4Addr) -> bool {
    let cidr = if cidr.contains('/') { cidr.to_string() } else { format!("{cidr}/32") };
    crate::model::Cidr::parse(&cidr).is_some_and(|c| c.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ip_addr_output() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n2: eth0    inet 192.168.1.10/24 brd 192.168.1.255 scope global eth0\n";
        assert_eq!(
            parse_ip_addr(out),
            ["127.0.0.1".parse::<std::net::Ipv4Addr>().unwrap(), "192.168.1.10".parse().unwrap()]
        );
    }

    #[test]
    fn cidr_matching() {
        assert!(cidr_contains("192.168.0.0/16", "192.168.4.1".parse().unwrap()));
        assert!(!cidr_contains("192.168.0.0/16", "10.0.0.1".parse().unwrap()));
        assert!(cidr_contains("0.0.0.0/0", "10.0.0.1".parse().unwrap()));
        assert!(cidr_contains("127.0.0.1/32", "127.0.0.1".parse().unwrap()));
        assert!(!cidr_contains("bogus", "127.0.0.1".parse().unwrap()));
    }
}
