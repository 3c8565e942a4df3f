//! Traffic capture for meshed pods: which pods get it (those the sidecar injector marked
//! with `sidecar.istio.io/status`) and the `iptables-restore` input that, inside the pod's
//! network namespace, sends its TCP traffic through the sidecar (pure; the kubelet applies
//! it when it creates the pod's network, before any container starts).
//!
//! The rules are Istio's: outbound TCP to anything but loopback, from any user but the
//! sidecar's (uid 1337), is redirected to the sidecar's outbound port 15001; inbound TCP to
//! any port but the sidecar's own (15001, 15006, 15008, 15020, 15021, 15090) is redirected
//! to its inbound port 15006. The sidecar reads each connection's original destination with
//! `SO_ORIGINAL_DST`. The annotations `traffic.sidecar.istio.io/excludeOutboundPorts`,
//! `excludeInboundPorts` and `excludeOutboundIPRanges` carve out more.

use std::collections::BTreeMap;

/// The injector's mark on a pod that has the sidecar.
pub const STATUS_ANNOTATION: &str = "sidecar.istio.io/status";
/// The sidecar runs as this user; its own connections are never redirected.
pub const SIDECAR_UID: u32 = 1337;
pub const OUTBOUND_PORT: u16 = 15001;
pub const INBOUND_PORT: u16 = 15006;
/// Ports of the sidecar itself that inbound capture leaves alone.
pub const SIDECAR_PORTS: [u16; 6] = [15001, 15006, 15008, 15020, 15021, 15090];

const EXCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeOutboundPorts";
const EXCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
const EXCLUDE_OUTBOUND_RANGES: &str = "traffic.sidecar.istio.io/excludeOutboundIPRanges";

/// What to capture for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capture {
    pub exclude_inbound_ports: Vec<u16>,
    pub exclude_outbound_ports: Vec<u16>,
    /// IPv4 CIDRs (`10.0.0.0/8`) whose traffic bypasses the sidecar.
    pub exclude_outbound_ranges: Vec<String>,
}

fn ports(s: &str, what: &str) -> Result<Vec<u16>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u16>().map_err(|_| format!("{what}: {p:?} is not a port")))
        .collect()
}

fn cidr(s: &str) -> Result<String, String> {
    let (ip, prefix) = s.split_once('/').unwrap_or((s, "32"));
    let ok = ip.parse::<std::net::Ipv4Addr>().is_ok() && prefix.parse::<u8>().is_ok_and(|p| p <= 32);
    if ok {
        Ok(format!("{ip}/{prefix}"))
    } else {
        Err(format!("{EXCLUDE_OUTBOUND_RANGES}: {s:?} is not an IPv4 CIDR"))
    }
}

/// The capture a pod with these annotations needs: `None` for a pod without the sidecar;
/// an error names an annotation that does not parse (the pod's network is then not set up,
/// rather than set up leaking traffic past the sidecar).
pub fn capture_for(annotations: &BTreeMap<String, String>) -> Result<Option<Capture>, String> {
    if !annotations.contains_key(STATUS_ANNOTATION) {
        return Ok(None);
    }
    let get = |k: &str| annotations.get(k).map(String::as_str).unwrap_or_default();
    let ranges = get(EXCLUDE_OUTBOUND_RANGES)
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty() && *r != "*")
        .map(cidr)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Capture {
        exclude_inbound_ports: ports(get(EXCLUDE_INBOUND_PORTS), EXCLUDE_INBOUND_PORTS)?,
        exclude_outbound_ports: ports(get(EXCLUDE_OUTBOUND_PORTS), EXCLUDE_OUTBOUND_PORTS)?,
        exclude_outbound_ranges: ranges,
    }))
}

/// The `iptables-restore` input (nat table) for `c`, to run inside the pod's namespace.
pub fn iptables_restore(c: &Capture) -> String {
    let mut out = String::from(
        "*nat\n:MESH_INBOUND - [0:0]\n:MESH_IN_REDIRECT - [0:0]\n:MESH_OUTPUT - [0:0]\n:MESH_REDIRECT - [0:0]\n\
         -A PREROUTING -p tcp -j MESH_INBOUND\n-A OUTPUT -p tcp -j MESH_OUTPUT\n",
    );
    for p in SIDECAR_PORTS.iter().chain(&c.exclude_inbound_ports) {
        out.push_str(&format!("-A MESH_INBOUND -p tcp --dport {p} -j RETURN\n"));
    }
    out.push_str("-A MESH_INBOUND -p tcp -j MESH_IN_REDIRECT\n");
    out.push_str(&format!("-A MESH_IN_REDIRECT -p tcp -j REDIRECT --to-ports {INBOUND_PORT}\n"));
    out.push_str(&format!("-A MESH_OUTPUT -m owner --uid-owner {SIDECAR_UID} -j RETURN\n"));
    out.push_str("-A MESH_OUTPUT -o lo -j RETURN\n-A MESH_OUTPUT -d 127.0.0.0/8 -j RETURN\n");
    for p in &c.exclude_outbound_ports {
        out.push_str(&format!("-A MESH_OUTPUT -p tcp --dport {p} -j RETURN\n"));
    }
    for r in &c.exclude_outbound_ranges {
        out.push_str(&format!("-A MESH_OUTPUT -d {r} -j RETURN\n"));
    }
    out.push_str("-A MESH_OUTPUT -j MESH_REDIRECT\n");
    out.push_str(&format!("-A MESH_REDIRECT -p tcp -j REDIRECT --to-ports {OUTBOUND_PORT}\n"));
    out.push_str("COMMIT\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn only_injected_pods_are_captured() {
        assert_eq!(capture_for(&annotations(&[])), Ok(None));
        let c = capture_for(&annotations(&[(STATUS_ANNOTATION, "{}")])).unwrap().unwrap();
        let rules = iptables_restore(&c);
        assert!(rules.contains("-A MESH_OUTPUT -m owner --uid-owner 1337 -j RETURN"));
        assert!(rules.contains("REDIRECT --to-ports 15001"));
        assert!(rules.contains("REDIRECT --to-ports 15006"));
        for p in SIDECAR_PORTS {
            assert!(rules.contains(&format!("--dport {p} -j RETURN")));
        }
        // The sidecar's own traffic is exempt before anything is redirected.
        let uid = rules.find("--uid-owner").unwrap();
        assert!(uid < rules.find("-A MESH_OUTPUT -j MESH_REDIRECT").unwrap());
    }

    #[test]
    fn exclusions_come_from_the_annotations_and_bad_ones_are_errors() {
        let c = capture_for(&annotations(&[
            (STATUS_ANNOTATION, "{}"),
            (EXCLUDE_OUTBOUND_PORTS, "5432, 6379"),
            (EXCLUDE_INBOUND_PORTS, "9000"),
            (EXCLUDE_OUTBOUND_RANGES, "10.96.0.0/12,192.0.2.1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.exclude_outbound_ports, vec![5432, 6379]);
        assert_eq!(c.exclude_outbound_ranges, vec!["10.96.0.0/12".to_string(), "192.0.2.1/32".to_string()]);
        let rules = iptables_restore(&c);
        assert!(rules.contains("-A MESH_OUTPUT -d 10.96.0.0/12 -j RETURN"));
        assert!(rules.contains("-A MESH_INBOUND -p tcp --dport 9000 -j RETURN"));
        assert!(capture_for(&annotations(&[(STATUS_ANNOTATION, "{}"), (EXCLUDE_INBOUND_PORTS, "http")])).is_err());
        assert!(
            capture_for(&annotations(&[(STATUS_ANNOTATION, "{}"), (EXCLUDE_OUTBOUND_RANGES, "10.0.0.0/33")])).is_err()
        );
    }
}
