//! `hostPort`: a container port published on the node's addresses, as the CNI portmap
//! plugin does for Kubernetes' kubelet. One nat chain per node, `MK8S-HOSTPORTS-<hash>`,
//! jumped to from `PREROUTING` and `OUTPUT` for destinations local to this host, DNATs each
//! published port (to `hostIP` only when the pod names one) to the pod's IP and container
//! port; `MK8S-HP-MASQ-<hash>`, from `POSTROUTING`, masquerades what would not find its way
//! back otherwise: connections from the host's loopback (`curl 127.0.0.1:<hostPort>`; the
//! bridge accepts loopback sources with `route_localnet`) and a pod reaching itself through
//! its own host port (hairpin).
//!
//! [`of_pod`] and [`restore`] are the pure parts; [`apply`] writes them with
//! `iptables-restore --noflush` and inserts the jumps once. The scheduler keeps two pods of a
//! node from asking for one host port; nodes that share a host (several kubelets on one
//! machine) share its addresses, so a port published by two of them reaches the first.

use std::net::Ipv4Addr;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;

/// One published port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostPort {
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// The address it is published on; `None`: every address of the host.
    pub host_ip: Option<Ipv4Addr>,
    pub host_port: u16,
    pub pod_ip: Ipv4Addr,
    pub container_port: u16,
    /// `namespace/name`, for the rule's comment.
    pub pod: String,
}

/// The host ports a pod at `pod_ip` asks for (none for a hostNetwork pod: its processes
/// bind the node's ports themselves). Ports out of range are skipped (validation refuses
/// them before a pod gets here).
pub fn of_pod(pod: &Pod, pod_ip: Ipv4Addr) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    if spec.host_network == Some(true) {
        return Vec::new();
    }
    let name = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let mut out: Vec<HostPort> = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let host_port = u16::try_from(p.host_port?).ok().filter(|p| *p > 0)?;
            let container_port = u16::try_from(p.container_port).ok().filter(|p| *p > 0)?;
            // An address that is not IPv4 (this pod network is IPv4 only) is no port here,
            // rather than one on every address.
            let host_ip = match p.host_ip.as_deref().filter(|ip| !ip.is_empty()) {
                None => None,
                Some(ip) => Some(ip.parse::<Ipv4Addr>().ok()?).filter(|ip| !ip.is_unspecified()),
            };
            Some(HostPort {
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                host_ip,
                host_port,
                pod_ip,
                container_port,
                pod: name.clone(),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A short stable hash of the node's name for chain names (as the bridge's).
fn hash(node: &str) -> String {
    format!("{:08X}", crate::hosttools::fnv32(node))
}

/// The DNAT chain of `node`.
pub fn dnat_chain(node: &str) -> String {
    format!("MK8S-HOSTPORTS-{}", hash(node))
}

/// The masquerade chain of `node`.
pub fn masq_chain(node: &str) -> String {
    format!("MK8S-HP-MASQ-{}", hash(node))
}

/// The comment on the jumps (no spaces, so `iptables -S` output splits cleanly).
const COMMENT: &str = "minik8s-hostports";

/// The jumps into the chains: (built-in chain, rule arguments after `-A CHAIN`).
pub fn jumps(node: &str) -> Vec<(&'static str, Vec<String>)> {
    let local = |chain: String| -> Vec<String> {
        ["-m", "addrtype", "--dst-type", "LOCAL", "-m", "comment", "--comment", COMMENT, "-j", &chain]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let masq: Vec<String> =
        ["-m", "comment", "--comment", COMMENT, "-j", &masq_chain(node)].iter().map(|s| s.to_string()).collect();
    vec![("PREROUTING", local(dnat_chain(node))), ("OUTPUT", local(dnat_chain(node))), ("POSTROUTING", masq)]
}

/// `iptables-restore --noflush` input that rewrites both chains of `node` for `ports`.
pub fn restore(node: &str, ports: &[HostPort]) -> String {
    let (dnat, masq) = (dnat_chain(node), masq_chain(node));
    let mut out = format!("*nat\n:{dnat} - [0:0]\n:{masq} - [0:0]\n");
    for p in ports {
        let dest = p.host_ip.map(|ip| format!(" -d {ip}/32")).unwrap_or_default();
        out.push_str(&format!(
            "-A {dnat}{dest} -p {proto} -m {proto} --dport {hp} -m comment --comment \"{pod} hostPort {hp}\" -j DNAT --to-destination {ip}:{cp}\n",
            proto = p.protocol,
            hp = p.host_port,
            pod = p.pod,
            ip = p.pod_ip,
            cp = p.container_port,
        ));
    }
    for p in ports {
        for source in ["127.0.0.0/8".to_string(), format!("{}/32", p.pod_ip)] {
            out.push_str(&format!(
                "-A {masq} -s {source} -d {ip}/32 -p {proto} -m {proto} --dport {cp} -j MASQUERADE\n",
                ip = p.pod_ip,
                proto = p.protocol,
                cp = p.container_port,
            ));
        }
    }
    out.push_str("COMMIT\n");
    out
}

/// Whether `node`'s DNAT chain is in the kernel (from this or an earlier run).
pub async fn chains_exist(node: &str) -> bool {
    crate::hosttools::succeeds("iptables", &["-w", "-t", "nat", "-S", &dnat_chain(node)]).await
}

/// Write `node`'s chains for `ports`, insert the jumps that are missing, and let the
/// bridge carry loopback sources to the pods.
pub async fn apply(node: &str, bridge: Option<&str>, ports: &[HostPort]) -> Result<()> {
    crate::hosttools::run_with_input("iptables-restore", &["-w", "--noflush"], &restore(node, ports)).await?;
    for (chain, rule) in jumps(node) {
        let mut check = vec!["-w", "-t", "nat", "-C", chain];
        check.extend(rule.iter().map(String::as_str));
        if !crate::hosttools::succeeds("iptables", &check).await {
            let mut insert = vec!["-w", "-t", "nat", "-I", chain, "1"];
            insert.extend(rule.iter().map(String::as_str));
            crate::hosttools::run("iptables", &insert).await?;
        }
    }
    if let Some(br) = bridge {
        if let Err(e) = std::fs::write(format!("/proc/sys/net/ipv4/conf/{br}/route_localnet"), "1") {
            tracing::warn!(bridge = br, error = %e, "cannot enable route_localnet: 127.0.0.1:<hostPort> will not reach pods");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns"}, "spec": spec})).unwrap()
    }

    #[test]
    fn a_pods_host_ports() {
        let p = pod(json!({"containers": [
            {"name": "a", "ports": [
                {"containerPort": 80, "hostPort": 8080},
                {"containerPort": 53, "hostPort": 5353, "protocol": "UDP", "hostIP": "192.0.2.7"},
                {"containerPort": 443},
                {"containerPort": 8443, "hostPort": 8443, "hostIP": "2001:db8::1"}
            ]},
            {"name": "b", "ports": [{"containerPort": 9000, "hostPort": 9000, "hostIP": "0.0.0.0"}]}
        ]}));
        let ip: Ipv4Addr = "10.244.0.5".parse().unwrap();
        let got = of_pod(&p, ip);
        let hp = |proto: &str, host_ip: Option<&str>, host_port, container_port| HostPort {
            protocol: proto.into(),
            host_ip: host_ip.map(|s| s.parse().unwrap()),
            host_port,
            pod_ip: ip,
            container_port,
            pod: "ns/web".into(),
        };
        assert_eq!(
            got,
            vec![hp("tcp", None, 8080, 80), hp("tcp", None, 9000, 9000), hp("udp", Some("192.0.2.7"), 5353, 53)]
        );
        let host = pod(
            json!({"hostNetwork": true, "containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
        );
        assert!(of_pod(&host, ip).is_empty(), "a hostNetwork pod binds the node's ports itself");
    }

    #[test]
    fn chains_dnat_and_masquerade() {
        let p = pod(json!({"containers": [{"name": "a", "ports": [
            {"containerPort": 80, "hostPort": 8080},
            {"containerPort": 53, "hostPort": 5353, "protocol": "UDP", "hostIP": "192.0.2.7"}
        ]}]}));
        let ports = of_pod(&p, "10.244.0.5".parse().unwrap());
        let (dnat, masq) = (dnat_chain("node-1"), masq_chain("node-1"));
        assert!(dnat.len() <= 28 && masq.len() <= 28, "iptables chain names are at most 28 characters");
        let r = restore("node-1", &ports);
        assert_eq!(
            r,
            format!(
                "*nat\n:{dnat} - [0:0]\n:{masq} - [0:0]\n\
                 -A {dnat} -p tcp -m tcp --dport 8080 -m comment --comment \"ns/web hostPort 8080\" -j DNAT --to-destination 10.244.0.5:80\n\
                 -A {dnat} -d 192.0.2.7/32 -p udp -m udp --dport 5353 -m comment --comment \"ns/web hostPort 5353\" -j DNAT --to-destination 10.244.0.5:53\n\
                 -A {masq} -s 127.0.0.0/8 -d 10.244.0.5/32 -p tcp -m tcp --dport 80 -j MASQUERADE\n\
                 -A {masq} -s 10.244.0.5/32 -d 10.244.0.5/32 -p tcp -m tcp --dport 80 -j MASQUERADE\n\
                 -A {masq} -s 127.0.0.0/8 -d 10.244.0.5/32 -p udp -m udp --dport 53 -j MASQUERADE\n\
                 -A {masq} -s 10.244.0.5/32 -d 10.244.0.5/32 -p udp -m udp --dport 53 -j MASQUERADE\n\
                 COMMIT\n"
            )
        );
        // No ports: both chains emptied, still declared (the jumps keep pointing somewhere).
        assert_eq!(restore("node-1", &[]), format!("*nat\n:{dnat} - [0:0]\n:{masq} - [0:0]\nCOMMIT\n"));
        let j = jumps("node-1");
        assert_eq!(j.iter().map(|(c, _)| *c).collect::<Vec<_>>(), ["PREROUTING", "OUTPUT", "POSTROUTING"]);
        assert!(j[0].1.windows(2).any(|w| w == ["--dst-type", "LOCAL"]), "only destinations of this host");
        assert_eq!(j[2].1.last(), Some(&masq));
    }
}
