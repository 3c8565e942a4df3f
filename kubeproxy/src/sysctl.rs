//! The kernel settings Service routing needs (bridged pod traffic: `bridge-nf-call-iptables`,
//! `ip_forward`; Kubernetes: `route_localnet` for node ports on localhost), decided by a
//! pure function and applied by a thin shell that reports what it changed.

use std::path::{Path, PathBuf};

/// One wanted setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// Dotted name, e.g. `net.ipv4.ip_forward`.
    pub name: &'static str,
    pub value: &'static str,
    /// Only applied when its file exists (a module such as `br_netfilter` provides it).
    pub optional: bool,
}

/// The settings a proxy mode needs.
pub fn wanted(mode: &str) -> Vec<Setting> {
    let mut v = vec![
        Setting { name: "net.ipv4.ip_forward", value: "1", optional: false },
        // Node ports on 127.0.0.1 are DNATed to pod IPs: allow routing 127/8 sources.
        Setting { name: "net.ipv4.conf.all.route_localnet", value: "1", optional: false },
        // Pod-to-service traffic crossing a Linux bridge must traverse iptables (hairpin).
        Setting { name: "net.bridge.bridge-nf-call-iptables", value: "1", optional: true },
    ];
    if mode == "ipvs" {
        v.push(Setting { name: "net.ipv4.vs.conntrack", value: "1", optional: false });
    }
    v
}

/// `/proc/sys` path of a dotted name under `root`.
pub fn path(root: &Path, name: &str) -> PathBuf {
    root.join(name.replace('.', "/"))
}

/// What happened to one setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Unchanged,
    Changed { from: String },
    Absent,
}

/// Apply `settings` under `root` (normally `/proc/sys`); report each outcome.
pub fn apply(root: &Path, settings: &[Setting]) -> anyhow::Result<Vec<(Setting, Outcome)>> {
    let mut out = Vec::new();
    for s in settings {
        let p = path(root, s.name);
        let current = match std::fs::read_to_string(&p) {
            Ok(c) => c.trim().to_string(),
            Err(_) if s.optional => {
                out.push((s.clone(), Outcome::Absent));
                continue;
            }
            Err(e) => anyhow::bail!("reading sysctl {}: {e}", s.name),
        };
        if current == s.value {
            out.push((s.clone(), Outcome::Unchanged));
        } else {
            std::fs::write(&p, s.value).map_err(|e| anyhow::anyhow!("setting sysctl {}={}: {e}", s.name, s.value))?;
            out.push((s.clone(), Outcome::Changed { from: current }));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_only_what_differs_and_skips_absent_optional_ones() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (n, v) in [("net.ipv4.ip_forward", "0"), ("net.ipv4.conf.all.route_localnet", "1")] {
            let p = path(root, n);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, format!("{v}\n")).unwrap();
        }
        let res = apply(root, &wanted("iptables")).unwrap();
        assert_eq!(res[0].1, Outcome::Changed { from: "0".into() });
        assert_eq!(res[1].1, Outcome::Unchanged);
        assert_eq!(res[2].1, Outcome::Absent);
        assert_eq!(std::fs::read_to_string(path(root, "net.ipv4.ip_forward")).unwrap(), "1");
        assert!(wanted("ipvs").iter().any(|s| s.name == "net.ipv4.vs.conntrack"));
        // A missing mandatory one is an error.
        assert!(apply(root, &wanted("ipvs")).is_err());
    }
}
