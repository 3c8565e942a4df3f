//! The sync loop: reflectors for Services and EndpointSlices feed a debounced loop that
//! recomputes the service ports and hands them to the backend — at most once per
//! `--iptables-min-sync-period`, at least once per `--iptables-sync-period`, like
//! Kubernetes' `BoundedFrequencyRunner`; a Service's ports are computed again only when it
//! or its EndpointSlices changed ([`PortCache`]). Each change is noted in the proxy's health as
//! waiting and each successful sync as done; after a successful sync the Service health
//! checks follow the new service ports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::backend::Backend;
use crate::healthcheck::{self, ProxyHealth, ServiceHealthServer};
use crate::model::{NodeInfo, PortCache};

/// A reflector-backed cache of one kind, notifying `notify` on every change.
pub fn cache<K>(client: &Client, notify: Arc<Notify>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    cache_with(client, move || notify.notify_one())
}

/// A reflector-backed cache of one kind, calling `on_change` on every change.
pub fn cache_with<K>(client: &Client, on_change: impl Fn() + Send + 'static) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let api: Api<K> = Api::all(client.clone());
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => on_change(),
                Err(e) => tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying"),
            }
        }
    });
    reader
}

/// Prometheus metrics of the sync loop (Kubernetes' names).
#[derive(Clone)]
pub struct Metrics {
    pub sync_duration: Histogram,
    pub last_sync: IntGauge,
    /// When a change last asked for a sync.
    pub last_queued: IntGauge,
    pub rules: IntGauge,
    pub sync_errors: IntCounter,
    /// From the change a slice carries (its trigger-time annotation) to the rules carrying it.
    pub network_programming: Histogram,
}

impl Metrics {
    pub fn new(registry: &Registry) -> anyhow::Result<Self> {
        let m = Metrics {
            sync_duration: Histogram::with_opts(
                HistogramOpts::new("kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds")
                    .buckets(prometheus::exponential_buckets(0.001, 2.0, 16)?),
            )?,
            last_sync: IntGauge::new(
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                "The last time proxy rules were successfully synced",
            )?,
            last_queued: IntGauge::new(
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "The last time a sync of proxy rules was queued",
            )?,
            rules: IntGauge::new(
                "kubeproxy_sync_proxy_rules_total",
                "Number of proxy rules (or map elements) programmed",
            )?,
            sync_errors: IntCounter::new("kubeproxy_sync_proxy_rules_errors_total", "Failed syncs")?,
            network_programming: Histogram::with_opts(
                HistogramOpts::new(
                    "kubeproxy_network_programming_duration_seconds",
                    "In Cluster Network Programming Latency in seconds",
                )
                .buckets(network_programming_buckets()),
            )?,
        };
        registry.register(Box::new(m.sync_duration.clone()))?;
        registry.register(Box::new(m.last_sync.clone()))?;
        registry.register(Box::new(m.last_queued.clone()))?;
        registry.register(Box::new(m.rules.clone()))?;
        registry.register(Box::new(m.sync_errors.clone()))?;
        registry.register(Box::new(m.network_programming.clone()))?;
        Ok(m)
    }
}

/// kube-proxy's buckets: 0, 0.25 s and 0.5 s, 1 s steps to 59 s, 5 s steps to 115 s, 30 s
/// steps to 5 minutes.
fn network_programming_buckets() -> Vec<f64> {
    let linear = |start: f64, step: f64, n: usize| (0..n).map(move |i| start + step * i as f64);
    std::iter::once(0.0)
        .chain(linear(0.25, 0.25, 2))
        .chain(linear(1.0, 1.0, 59))
        .chain(linear(60.0, 5.0, 12))
        .chain(linear(120.0, 30.0, 7))
        .collect()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// As kube-proxy: at least once an hour a sync rewrites every rule, from what the kernel has,
/// repairing whatever else changed them; the syncs between write only what changed.
const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// Settings of the loop.
pub struct LoopConfig {
    pub min_sync_period: Duration,
    pub sync_period: Duration,
}

/// What the loop reports its health to.
pub struct Health {
    /// The proxy's own health (`/healthz`, `/livez`).
    pub proxy: Arc<ProxyHealth>,
    /// The Service health checks.
    pub services: ServiceHealthServer,
}

/// Run the proxy until the process ends.
pub async fn run(
    client: Client,
    mut backend: Box<dyn Backend>,
    node: NodeInfo,
    cfg: LoopConfig,
    metrics: Metrics,
    ready: common::Ready,
    mut health: Health,
) -> anyhow::Result<()> {
    let notify = Arc::new(Notify::new());
    let changed = || {
        let (notify, proxy, queued) = (notify.clone(), health.proxy.clone(), metrics.last_queued.clone());
        move || {
            proxy.queued();
            queued.set(unix_now());
            notify.notify_one();
        }
    };
    let services: Store<Service> = cache_with(&client, changed());
    let slices: Store<EndpointSlice> = cache_with(&client, changed());
    // Healthy from the start, in case the first sync never succeeds (as kube-proxy).
    health.proxy.updated();
    services.wait_until_ready().await?;
    slices.wait_until_ready().await?;
    tracing::info!(mode = backend.name(), node = %node.name, "caches synced; programming rules");
    let mut last_sync: Option<Instant> = None;
    let mut last_ports = Vec::new();
    // Only Services whose object or slices changed are computed again.
    let mut port_cache = PortCache::default();
    let mut conntrack_missing_logged = false;
    let mut last_full = Instant::now();
    loop {
        // Bounded frequency: not more often than min_sync_period.
        if let Some(last) = last_sync {
            let since = last.elapsed();
            if since < cfg.min_sync_period {
                tokio::time::sleep(cfg.min_sync_period - since).await;
            }
        }
        if last_full.elapsed() >= FULL_SYNC_PERIOD {
            backend.invalidate();
            last_full = Instant::now();
        }
        let svcs = services.state();
        let eps = slices.state();
        let start = Instant::now();
        let ports = port_cache.ports(&svcs, &eps, &node);
        let result = tokio::task::block_in_place(|| backend.sync(&ports));
        let took = start.elapsed();
        last_sync = Some(Instant::now());
        match result {
            Ok(stats) => {
                metrics.sync_duration.observe(took.as_secs_f64());
                metrics.rules.set(stats.rules as i64);
                metrics.last_sync.set(unix_now());
                let now = jiff::Timestamp::now();
                for t in port_cache.take_trigger_times() {
                    metrics.network_programming.observe(now.duration_since(t).as_secs_f64().max(0.0));
                }
                if stats.wrote {
                    tracing::info!(services = svcs.len(), ports = ports.len(), rules = stats.rules, bytes = stats.bytes, elapsed = ?took, "synced proxy rules");
                } else {
                    tracing::debug!(elapsed = ?took, "proxy rules unchanged");
                }
                ready.set(true);
                health.proxy.updated();
                health.services.sync(&healthcheck::services(&ports)).await;
                // After the rules changed: drop UDP flows pinned to what is gone.
                let stale = crate::conntrack::stale_entries(&last_ports, &ports);
                if !stale.is_empty() {
                    if let Err(e) = tokio::task::block_in_place(|| crate::conntrack::delete(&stale)) {
                        if !conntrack_missing_logged {
                            tracing::warn!(error = %e, "cannot clear stale UDP conntrack entries (is the conntrack tool installed?)");
                            conntrack_missing_logged = true;
                        }
                    }
                }
                last_ports = ports;
            }
            Err(e) => {
                metrics.sync_errors.inc();
                tracing::error!(error = %format!("{e:#}"), "sync failed; will resync from the kernel's state");
                backend.invalidate();
                // Retry soon rather than at the next change or period.
                tokio::time::sleep(cfg.min_sync_period.max(Duration::from_secs(1))).await;
                continue;
            }
        }
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(cfg.sync_period) => {}
        }
    }
}
