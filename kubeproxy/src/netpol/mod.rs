//! NetworkPolicy enforcement: every node filters the pod traffic it forwards by the
//! cluster's `networking.k8s.io/v1` NetworkPolicies, in an nftables table of its own
//! (`ip minik8s-netpol`).
//!
//! It runs inside kubeproxy because kubeproxy already is the per-node agent that watches the
//! cluster and programs this node's packet filter (as kube-router does both in one daemon);
//! a separate daemon would be a second set of watches and a second thing to deploy for the
//! same kernel tables. The table is its own, so the Service rules and the policies sync
//! independently and neither rewrites the other.
//!
//! - [`desired`] — policies, pods and namespaces → sets, chains and maps (pure).
//! - [`render`] — those → `nft -f` input: the whole table, or only what changed (pure).
//! - [`run`] — the shell: reflectors of the three kinds, a short debounce, `nft -f`.
//!
//! Every node applies every pod's policies to what it forwards: the source's egress where
//! the traffic leaves its node, the destination's ingress where it arrives (and, harmlessly,
//! again wherever both are seen), so a node needs no idea of which pods are "its own" —
//! several nodes sharing one machine (`scripts/cluster up --nodes 2`) share one table.

pub mod desired;
pub mod render;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::Store;
use kube::Client;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Registry};
use tokio::sync::Notify;

use crate::backend::run_with_input;
use crate::proxier::cache;

/// The Prometheus metrics of the policy sync.
#[derive(Clone)]
pub struct Metrics {
    sync_duration: Histogram,
    sync_errors: IntCounter,
    isolated_ingress: IntGauge,
    isolated_egress: IntGauge,
}

impl Metrics {
    pub fn new(registry: &Registry) -> anyhow::Result<Self> {
        let m = Metrics {
            sync_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "kubeproxy_sync_network_policies_duration_seconds",
                    "From computing the NetworkPolicy filter to the kernel having it, in seconds",
                )
                .buckets(prometheus::exponential_buckets(0.001, 2.0, 14)?),
            )?,
            sync_errors: IntCounter::new(
                "kubeproxy_sync_network_policies_errors_total",
                "NetworkPolicy filter syncs that failed",
            )?,
            isolated_ingress: IntGauge::new(
                "kubeproxy_network_policy_isolated_pods_ingress",
                "Pods some NetworkPolicy isolates for ingress",
            )?,
            isolated_egress: IntGauge::new(
                "kubeproxy_network_policy_isolated_pods_egress",
                "Pods some NetworkPolicy isolates for egress",
            )?,
        };
        registry.register(Box::new(m.sync_duration.clone()))?;
        registry.register(Box::new(m.sync_errors.clone()))?;
        registry.register(Box::new(m.isolated_ingress.clone()))?;
        registry.register(Box::new(m.isolated_egress.clone()))?;
        Ok(m)
    }
}

/// How long changes are gathered before a sync: a Deployment's pods coming up together
/// make one transaction, and a policy change still reaches the kernel well within a second.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Every so often the whole table is written again, repairing whatever changed it.
const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// Remove the table (`kubeproxy --cleanup`).
pub fn cleanup() -> anyhow::Result<()> {
    run_with_input("nft", &["-f", "-"], &render::cleanup())?;
    Ok(())
}

/// Enforce the cluster's NetworkPolicies on this node until the process ends.
pub async fn run(client: Client, metrics: Metrics) -> anyhow::Result<()> {
    let notify = Arc::new(Notify::new());
    let policies: Store<NetworkPolicy> = cache(&client, notify.clone());
    let pods: Store<Pod> = cache(&client, notify.clone());
    let namespaces: Store<Namespace> = cache(&client, notify.clone());
    policies.wait_until_ready().await?;
    pods.wait_until_ready().await?;
    namespaces.wait_until_ready().await?;
    tracing::info!("NetworkPolicy caches synced; programming the filter");
    // What the kernel has, as far as we know; None = unknown (write the whole table).
    let mut programmed: Option<desired::Desired> = None;
    let mut last_full = Instant::now();
    let mut reported: Vec<desired::Problem> = Vec::new();
    loop {
        if last_full.elapsed() >= FULL_SYNC_PERIOD {
            programmed = None;
            last_full = Instant::now();
        }
        let start = Instant::now();
        let pol = policies.state();
        let pol: Vec<&NetworkPolicy> = pol.iter().map(|p| p.as_ref()).collect();
        let infos: Vec<desired::PodInfo> = pods.state().iter().filter_map(|p| desired::PodInfo::of(p)).collect();
        let ns = desired::namespace_labels(namespaces.state().iter().map(|n| n.as_ref()));
        let (want, problems) = desired::compute(&pol, &infos, &ns);
        for p in problems.iter().filter(|p| !reported.contains(p)) {
            tracing::warn!(policy = %p.policy, problem = %p.message, "part of a NetworkPolicy is ignored");
        }
        reported = problems;
        let script = match &programmed {
            None => Some(render::full(&want)),
            Some(old) => render::diff(old, &want),
        };
        if let Some(script) = script {
            match tokio::task::block_in_place(|| run_with_input("nft", &["-f", "-"], &script)) {
                Ok(_) => {
                    let took = start.elapsed();
                    metrics.sync_duration.observe(took.as_secs_f64());
                    let (ingress, egress) = render::isolated(&want);
                    metrics.isolated_ingress.set(ingress as i64);
                    metrics.isolated_egress.set(egress as i64);
                    tracing::info!(
                        policies = pol.len(),
                        isolated_ingress = ingress,
                        isolated_egress = egress,
                        elements = render::size(&want),
                        full = programmed.is_none(),
                        elapsed = ?took,
                        "synced the NetworkPolicy filter"
                    );
                    programmed = Some(want);
                }
                Err(e) => {
                    metrics.sync_errors.inc();
                    tracing::error!(error = %format!("{e:#}"), "NetworkPolicy filter sync failed; rewriting the whole table next");
                    programmed = None;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        notify.notified().await;
        tokio::time::sleep(DEBOUNCE).await;
    }
}
