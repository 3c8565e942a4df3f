//! The kubelet's Prometheus metrics (served on `/metrics` with the process defaults).

use prometheus::{Histogram, HistogramOpts, IntCounter, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub pod_syncs: IntCounter,
    pub container_starts: IntCounter,
    pub pod_start_seconds: Histogram,
}

impl Metrics {
    pub fn new() -> anyhow::Result<Metrics> {
        let registry = Registry::new();
        let pod_syncs = IntCounter::new("kubelet_pod_worker_syncs_total", "Pod worker syncs")?;
        let container_starts = IntCounter::new("kubelet_started_containers_total", "Containers started")?;
        let pod_start_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "kubelet_pod_start_duration_seconds",
                "Seconds from a pod's first sync to Running and Ready",
            )
            .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0]),
        )?;
        registry.register(Box::new(pod_syncs.clone()))?;
        registry.register(Box::new(container_starts.clone()))?;
        registry.register(Box::new(pod_start_seconds.clone()))?;
        Ok(Metrics { registry, pod_syncs, container_starts, pod_start_seconds })
    }
}
