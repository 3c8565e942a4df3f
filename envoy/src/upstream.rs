//! Upstream decisions: load balancing over a cluster's endpoints, outlier detection
//! (ejecting endpoints after consecutive 5xx) and circuit breaking (admitting a request or a
//! connection). Everything here is lock-free: counters are atomics that outlive
//! configuration changes, and the decisions take the time and the random draw as arguments
//! so that tests drive them without I/O.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::config::{Cluster, Endpoint, LbPolicy, Limits};
pub use crate::state::now_ms;

/// A guard on an atomic counter: incremented on creation, decremented on drop.
pub struct Gauge<'a>(&'a AtomicU32);

impl<'a> Gauge<'a> {
    pub fn inc(c: &'a AtomicU32) -> Gauge<'a> {
        c.fetch_add(1, Ordering::Relaxed);
        Gauge(c)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether an endpoint takes new requests: `healthy` from EDS and not ejected.
fn usable(e: &Endpoint, now_ms: u64) -> bool {
    e.healthy && !e.state.ejected(now_ms)
}

/// Choose an endpoint of `c` for a request, avoiding `avoid` (the endpoint a retried attempt
/// used) when another is usable. `draw` is a random number. `None`: no healthy upstream.
pub fn pick(c: &Cluster, now_ms: u64, avoid: Option<SocketAddr>, draw: u64) -> Option<&Endpoint> {
    let total = c.endpoints.len();
    if total == 0 {
        return None;
    }
    let usable_count = c.endpoints.iter().filter(|e| usable(e, now_ms)).count();
    // Envoy's panic mode: below the threshold every endpoint takes traffic.
    let panic = (usable_count as f64) * 100.0 < c.panic_threshold * total as f64;
    let ok = |e: &Endpoint| panic || usable(e, now_ms);
    let candidates = if panic { total } else { usable_count };
    if candidates == 0 {
        return None;
    }
    let avoid = avoid.filter(|a| candidates > 1 && c.endpoints.iter().any(|e| ok(e) && e.addr == *a));
    let eligible = |e: &&Endpoint| ok(e) && Some(e.addr) != avoid;
    let n = candidates - usize::from(avoid.is_some());
    let nth = |i: usize| c.endpoints.iter().filter(eligible).nth(i % n);
    match c.lb {
        LbPolicy::RoundRobin => nth(c.state.rr.fetch_add(1, Ordering::Relaxed)),
        LbPolicy::Random => nth(draw as usize),
        LbPolicy::LeastRequest => {
            // Power of two choices on active requests.
            let a = nth(draw as usize)?;
            let b = nth((draw >> 32) as usize)?;
            let load = |e: &Endpoint| e.state.active_requests.load(Ordering::Relaxed);
            Some(if load(b) < load(a) { b } else { a })
        }
    }
}

/// Record the outcome of a request to `e` for outlier detection; `true` when it ejected `e`.
pub fn record(c: &Cluster, e: &Endpoint, failed_5xx: bool, now_ms: u64) -> bool {
    let Some(o) = c.outlier else { return false };
    if !failed_5xx {
        e.state.consecutive_5xx.store(0, Ordering::Relaxed);
        return false;
    }
    let n = e.state.consecutive_5xx.fetch_add(1, Ordering::Relaxed) + 1;
    if o.consecutive_5xx == 0 || n < o.consecutive_5xx || e.state.ejected(now_ms) {
        return false;
    }
    let ejected = c.endpoints.iter().filter(|x| x.state.ejected(now_ms)).count() as u64;
    if ejected * 100 >= u64::from(o.max_ejection_percent) * c.endpoints.len() as u64 {
        return false;
    }
    let times = e.state.times_ejected.fetch_add(1, Ordering::Relaxed) + 1;
    let until = now_ms + o.base_ejection_time.as_millis() as u64 * u64::from(times);
    e.state.ejected_until.store(until, Ordering::Relaxed);
    e.state.consecutive_5xx.store(0, Ordering::Relaxed);
    true
}

/// Whether a new request fits the cluster's circuit breakers, given the requests already in
/// flight. Over HTTP/1.1 each request in flight holds a connection; those beyond
/// `max_connections` wait for one, and at most `max_pending_requests` may wait.
pub fn admit_request(limits: &Limits, active: u32, http2: bool) -> bool {
    if active >= limits.max_requests {
        return false;
    }
    if http2 {
        return true;
    }
    active < limits.max_connections || active - limits.max_connections < limits.max_pending_requests
}

/// Whether a new TCP connection fits the cluster's `max_connections`.
pub fn admit_connection(limits: &Limits, active: u32) -> bool {
    active < limits.max_connections
}

/// Pick a cluster name from weights: `draw` is uniform in `[0, total)`.
pub fn pick_weighted(clusters: &[(String, u32)], draw: u32) -> Option<&str> {
    let mut acc = 0u32;
    for (name, w) in clusters {
        acc = acc.saturating_add(*w);
        if draw < acc {
            return Some(name);
        }
    }
    clusters.last().map(|c| c.0.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClusterKind, Outlier};
    use std::time::Duration;

    fn cluster(n: usize, lb: LbPolicy, outlier: Option<Outlier>) -> Cluster {
        Cluster {
            name: "c".into(),
            kind: ClusterKind::Endpoints,
            lb,
            connect_timeout: Duration::from_secs(1),
            limits: Limits::default(),
            outlier,
            http2: false,
            panic_threshold: 50.0,
            endpoints: (0..n)
                .map(|i| Endpoint {
                    addr: SocketAddr::from(([10, 0, 0, i as u8 + 1], 80)),
                    healthy: true,
                    state: Default::default(),
                })
                .collect(),
            state: Default::default(),
        }
    }

    fn outlier() -> Option<Outlier> {
        Some(Outlier {
            consecutive_5xx: 2,
            interval: Duration::from_secs(1),
            base_ejection_time: Duration::from_secs(10),
            max_ejection_percent: 50,
        })
    }

    #[test]
    fn round_robin_cycles() {
        let c = cluster(3, LbPolicy::RoundRobin, None);
        let picks: Vec<u8> = (0..6).map(|_| pick(&c, 1, None, 0).unwrap().addr.ip().to_string().len() as u8).collect();
        assert_eq!(picks.len(), 6);
        let ips: Vec<SocketAddr> = (0..3).map(|_| pick(&c, 1, None, 0).unwrap().addr).collect();
        assert_eq!(ips.iter().collect::<std::collections::HashSet<_>>().len(), 3);
    }

    #[test]
    fn unhealthy_and_avoided_endpoints_are_skipped() {
        let mut c = cluster(3, LbPolicy::RoundRobin, None);
        c.endpoints[1].healthy = false;
        for _ in 0..10 {
            let e = pick(&c, 1, Some(c.endpoints[0].addr), 0).unwrap();
            assert_eq!(e.addr, c.endpoints[2].addr);
        }
    }

    #[test]
    fn no_healthy_upstream() {
        let c = cluster(0, LbPolicy::Random, None);
        assert!(pick(&c, 1, None, 7).is_none());
        let mut c = cluster(1, LbPolicy::Random, None);
        c.endpoints[0].healthy = false;
        c.panic_threshold = 0.0;
        assert!(pick(&c, 1, None, 7).is_none());
    }

    #[test]
    fn least_request_prefers_idle() {
        let c = cluster(2, LbPolicy::LeastRequest, None);
        c.endpoints[0].state.active_requests.store(5, Ordering::Relaxed);
        // draw picks endpoint 0 and endpoint 1 as the two choices.
        let draw = 1u64 << 32;
        assert_eq!(pick(&c, 1, None, draw).unwrap().addr, c.endpoints[1].addr);
    }

    #[test]
    fn outlier_ejects_after_consecutive_5xx_and_caps_the_share() {
        let c = cluster(2, LbPolicy::RoundRobin, outlier());
        let (a, b) = (&c.endpoints[0], &c.endpoints[1]);
        assert!(!record(&c, a, true, 100));
        assert!(!record(&c, a, false, 100), "a success resets the count");
        assert!(!record(&c, a, true, 100));
        assert!(record(&c, a, true, 100));
        assert!(a.state.ejected(100));
        assert!(!a.state.ejected(100 + 10_000));
        // Ejecting b too would exceed 50%.
        assert!(!record(&c, b, true, 200));
        assert!(!record(&c, b, true, 200));
        assert!(!b.state.ejected(200));
        // Every pick avoids a while it is ejected.
        for _ in 0..4 {
            assert_eq!(pick(&c, 200, None, 0).unwrap().addr, b.addr);
        }
        // The second ejection lasts twice as long.
        record(&c, a, true, 20_000);
        assert!(record(&c, a, true, 20_000));
        assert!(a.state.ejected(20_000 + 19_999));
    }

    #[test]
    fn circuit_breakers() {
        let l = Limits { max_connections: 1, max_pending_requests: 1, max_requests: 100, max_retries: 3 };
        assert!(admit_request(&l, 0, false));
        assert!(admit_request(&l, 1, false));
        assert!(!admit_request(&l, 2, false));
        assert!(admit_request(&l, 2, true));
        let l = Limits { max_requests: 2, ..l };
        assert!(!admit_request(&l, 2, true));
        assert!(admit_connection(&l, 0));
        assert!(!admit_connection(&l, 1));
    }

    #[test]
    fn weighted_pick() {
        let w = vec![("a".to_string(), 80), ("b".to_string(), 20)];
        assert_eq!(pick_weighted(&w, 0), Some("a"));
        assert_eq!(pick_weighted(&w, 79), Some("a"));
        assert_eq!(pick_weighted(&w, 80), Some("b"));
        assert_eq!(pick_weighted(&w, 99), Some("b"));
    }
}
