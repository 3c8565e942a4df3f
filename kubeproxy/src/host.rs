//! This host's tools and addresses: running a program with its input (`iptables-restore`,
//! `nft -f`, `ip -batch`), and the IPv4 addresses `ip` lists. The shells of every mode and of
//! the network policies use them.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

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

pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    run_with_input(program, args, "")
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
