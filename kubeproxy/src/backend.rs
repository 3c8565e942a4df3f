//! The thin I/O shells that apply the rendered rules: `iptables-restore --noflush`, `nft -f`,
//! and (on kernels with `ip_vs`) IPVS. Each remembers what it applied last so the next sync
//! writes only the difference; after a failure or at start it resyncs from what the kernel has.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{bail, Context};

use crate::iptables::{self, Config, Tables};
use crate::model::ServicePort;
use crate::{ipvs, nft_netlink, nftables};

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

/// Run `program args` feeding `input` on stdin; fail with its stderr.
pub fn run_with_input(program: &str, args: &[&str], input: &str) -> anyhow::Result<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).with_context(|| format!("writing to {program}"))?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{program} {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    run_with_input(program, args, "")
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
        for (table, chain, args) in iptables::jump_rules() {
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

/// IPVS mode: computes the operations; refuses to start without `ip_vs`.
pub struct Ipvs {
    node_ips: Vec<std::net::Ipv4Addr>,
    scheduler: String,
    applied: ipvs::State,
}

impl Ipvs {
    pub fn new(node_ips: Vec<std::net::Ipv4Addr>, scheduler: String) -> anyhow::Result<Self> {
        ipvs::check_kernel()?;
        Ok(Ipvs { node_ips, scheduler, applied: ipvs::State::default() })
    }
}

impl Backend for Ipvs {
    fn name(&self) -> &'static str {
        "ipvs"
    }

    fn sync(&mut self, ports: &[Arc<ServicePort>]) -> anyhow::Result<SyncStats> {
        let desired = ipvs::desired(ports, &self.node_ips, &self.scheduler);
        let ops = ipvs::diff(&self.applied, &desired);
        let messages: Vec<Vec<u8>> =
            ops.iter().enumerate().filter_map(|(i, op)| crate::ipvs_netlink::encode(op, 0, i as u32)).collect();
        // Sending them over a generic netlink socket is not implemented yet (no kernel with
        // ip_vs here to test it on); `Ipvs::new` refuses to start without ip_vs anyway.
        bail!(
            "IPVS: {} operations ({} netlink messages) computed, but sending them to the kernel is not implemented",
            ops.len(),
            messages.len()
        )
    }

    fn invalidate(&mut self) {
        self.applied = ipvs::State::default();
    }
}

/// The IPv4 addresses of this host (`ip -4 -o addr`), for `--nodeport-addresses` CIDRs.
pub fn local_addresses() -> anyhow::Result<Vec<std::net::Ipv4Addr>> {
    let out = run("ip", &["-4", "-o", "addr", "show"])?;
    Ok(parse_ip_addr(&out))
}

/// Parse `ip -4 -o addr show` output into addresses.
pub fn parse_ip_addr(out: &str) -> Vec<std::net::Ipv4Addr> {
    let mut set = BTreeSet::new();
    for line in out.lines() {
        let mut it = line.split_whitespace();
        while let Some(w) = it.next() {
            if w == "inet" {
                if let Some(ip) = it.next().and_then(|a| a.split('/').next()).and_then(|a| a.parse().ok()) {
                    set.insert(ip);
                }
            }
        }
    }
    set.into_iter().collect()
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
