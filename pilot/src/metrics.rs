//! pilot's own metrics, with istiod's names, on the monitoring port's `/metrics`:
//! - `pilot_xds`: connected proxies;
//! - `pilot_xds_pushes{type}`: responses sent, by type (`cds`, `eds`, `lds`, `rds`);
//! - `pilot_xds_rejects_total{type}`: NACKs received, by type;
//! - `pilot_proxy_convergence_time`: seconds from the first change of a push to the
//!   proxy's ACK of it;
//! - `pilot_push_triggers{type}`: what triggered recomputes (`service`, `endpoint`, `pod`,
//!   `namespace`, `virtualservice`, `destinationrule`);
//! - `pilot_snapshot_compute_seconds`: how long computing a new snapshot takes.

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub connected: IntGauge,
    pub pushes: IntCounterVec,
    pub rejects: IntCounterVec,
    pub convergence: Histogram,
    pub triggers: IntCounterVec,
    pub compute: Histogram,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let connected = IntGauge::new("pilot_xds", "Number of endpoints connected to this pilot using XDS.")
            .unwrap_or_else(|_| unreachable!("a valid metric name"));
        let counter = |name: &str, help: &str| {
            IntCounterVec::new(Opts::new(name, help), &["type"]).unwrap_or_else(|_| unreachable!("a valid metric name"))
        };
        let pushes = counter("pilot_xds_pushes", "xDS responses sent to proxies, by type (cds, eds, lds, rds).");
        let rejects = counter("pilot_xds_rejects_total", "Total number of XDS responses from pilot rejected by proxy.");
        let triggers = counter("pilot_push_triggers", "Total number of times a push was triggered, labeled by reason.");
        let convergence = Histogram::with_opts(
            HistogramOpts::new(
                "pilot_proxy_convergence_time",
                "Delay in seconds between config change and a proxy receiving all required configuration.",
            )
            .buckets(vec![0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0]),
        )
        .unwrap_or_else(|_| unreachable!("a valid metric name"));
        let compute = Histogram::with_opts(
            HistogramOpts::new(
                "pilot_snapshot_compute_seconds",
                "Time to compute the shared xDS configuration of a push.",
            )
            .buckets(prometheus::exponential_buckets(0.001, 2.0, 14).unwrap_or_default()),
        )
        .unwrap_or_else(|_| unreachable!("a valid metric name"));
        for c in [
            Box::new(connected.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(pushes.clone()),
            Box::new(rejects.clone()),
            Box::new(triggers.clone()),
            Box::new(convergence.clone()),
            Box::new(compute.clone()),
        ] {
            let _ = registry.register(c);
        }
        Metrics { registry, connected, pushes, rejects, convergence, triggers, compute }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
