//! The proxy's own Prometheus metrics (on `--healthz-port`'s `/metrics`, never to tenants).

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    requests: IntCounterVec,
    latency: HistogramVec,
}

impl Metrics {
    pub fn new(registry: &Registry) -> anyhow::Result<Metrics> {
        let requests = IntCounterVec::new(
            Opts::new("tenant_proxy_requests_total", "Tenant requests by verb and HTTP status code."),
            &["verb", "code"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "tenant_proxy_request_duration_seconds",
                "Time to the answer's headers (a watch: to its start), conversion and the apiserver included.",
            )
            .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]),
            &["verb"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        Ok(Metrics { requests, latency })
    }

    pub fn observe(&self, verb: &str, code: u16, took: Duration) {
        self.requests.with_label_values(&[verb, &code.to_string()]).inc();
        self.latency.with_label_values(&[verb]).observe(took.as_secs_f64());
    }
}
