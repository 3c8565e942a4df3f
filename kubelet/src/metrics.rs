//! The kubelet's Prometheus metrics: its own on `/metrics` (with the process defaults),
//! and the probe results on `/metrics/probes` (a registry of their own, as the kubelet
//! serves them apart).

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub pod_syncs: IntCounter,
    pub container_starts: IntCounter,
    pub pod_start_seconds: Histogram,
    /// `/metrics/probes`.
    pub probes: Registry,
    /// By probe_type, result, container, pod, namespace, pod_uid.
    pub probe_total: IntCounterVec,
    /// By probe_type, container, pod, namespace.
    pub probe_seconds: HistogramVec,
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
        let probes = Registry::new();
        let probe_total = IntCounterVec::new(
            Opts::new(
                "prober_probe_total",
                "[BETA] Cumulative number of a liveness, readiness or startup probe for a container by result.",
            ),
            &["probe_type", "result", "container", "pod", "namespace", "pod_uid"],
        )?;
        let probe_seconds = HistogramVec::new(
            HistogramOpts::new("prober_probe_duration_seconds", "[ALPHA] Duration in seconds for a probe response."),
            &["probe_type", "container", "pod", "namespace"],
        )?;
        probes.register(Box::new(probe_total.clone()))?;
        probes.register(Box::new(probe_seconds.clone()))?;
        Ok(Metrics { registry, pod_syncs, container_starts, pod_start_seconds, probes, probe_total, probe_seconds })
    }
}
