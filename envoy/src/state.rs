//! The counters that outlive configuration changes: per cluster (round-robin position,
//! requests, retries and connections in flight, connection pools) and per endpoint
//! (requests in flight, outlier-detection state). `config::build` carries them over from
//! one snapshot to the next by cluster name and endpoint address; `upstream` decides with
//! them.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// A cluster's counters, kept across configuration changes.
#[derive(Debug, Default)]
pub struct ClusterState {
    pub rr: AtomicUsize,
    pub active_requests: AtomicU32,
    /// Retries in flight (bounded by `max_retries`).
    pub active_retries: AtomicU32,
    /// Open upstream connections (HTTP pools and TCP proxies), shared with the pools' connector.
    pub active_connections: Arc<AtomicU32>,
    /// Connection pools to this cluster's endpoints, made on first use.
    pub pools: OnceLock<crate::pool::Pools>,
}

impl ClusterState {
    /// The cluster's pools, made on first use with the cluster's connect timeout.
    pub fn pools(&self, connect_timeout: std::time::Duration) -> &crate::pool::Pools {
        self.pools.get_or_init(|| crate::pool::Pools::new(self.active_connections.clone(), connect_timeout))
    }
}

/// An endpoint's counters, kept across configuration changes (by address).
#[derive(Debug, Default)]
pub struct EndpointState {
    pub active_requests: AtomicU32,
    pub consecutive_5xx: AtomicU32,
    pub times_ejected: AtomicU32,
    /// Milliseconds on [`now_ms`]'s clock until which the endpoint is ejected.
    pub ejected_until: AtomicU64,
}

/// Milliseconds since the process started (a monotonic clock; never 0 after start-up work).
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

impl EndpointState {
    pub fn ejected(&self, now_ms: u64) -> bool {
        self.ejected_until.load(Ordering::Relaxed) > now_ms
    }
}
