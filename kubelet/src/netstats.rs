//! A pod's network counters: `/proc/<pid>/net/dev` of a process in the pod's network
//! namespace (its sandbox), per interface, as cAdvisor reads them. Loopback and the host
//! side of container links (`veth*`, `docker*`) are left out, as cAdvisor leaves them out.
//!
//! [`parse`] is pure; [`read`] does the file I/O.

/// One interface's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

const IGNORED_PREFIXES: [&str; 3] = ["lo", "veth", "docker"];

/// Parse the text of `/proc/net/dev`: two header lines, then
/// `name: rx_bytes rx_packets rx_errs rx_drop fifo frame compressed multicast tx_bytes tx_packets tx_errs tx_drop …`.
pub fn parse(text: &str) -> Vec<Interface> {
    let mut out: Vec<Interface> = text
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let name = name.trim();
            if name.is_empty() || IGNORED_PREFIXES.iter().any(|p| name.starts_with(p)) {
                return None;
            }
            let v: Vec<u64> = rest.split_whitespace().map(|f| f.parse().ok()).collect::<Option<_>>()?;
            (v.len() >= 12).then(|| Interface {
                name: name.to_string(),
                rx_bytes: v[0],
                rx_packets: v[1],
                rx_errors: v[2],
                rx_dropped: v[3],
                tx_bytes: v[8],
                tx_packets: v[9],
                tx_errors: v[10],
                tx_dropped: v[11],
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The interfaces of `pid`'s network namespace.
pub fn read(pid: i64) -> Vec<Interface> {
    if pid <= 0 {
        return Vec::new();
    }
    std::fs::read_to_string(format!("/proc/{pid}/net/dev")).map(|t| parse(&t)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_without_loopback_and_host_links() {
        let text = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    3193      29    0    0    0     0          0         0     3193      29    0    0    0     0       0          0
  eth0: 1234567    890    1    2    0     0          0         0   765432     321    3    4    0     0       0          0
veth12ab:      5       1    0    0    0     0          0         0        5       1    0    0    0     0       0          0
  broken: 1 2 3
";
        assert_eq!(
            parse(text),
            vec![Interface {
                name: "eth0".into(),
                rx_bytes: 1_234_567,
                rx_packets: 890,
                rx_errors: 1,
                rx_dropped: 2,
                tx_bytes: 765_432,
                tx_packets: 321,
                tx_errors: 3,
                tx_dropped: 4,
            }]
        );
        assert!(read(0).is_empty());
    }
}
