//! Benchmark of module-controller at scale (one command):
//!
//! ```text
//! MC_BENCH_BASES=1000 MC_BENCH_PODS=10000 cargo bench -p e2e --bench module_controller
//! ```
//!
//! `base --simulate N` runs N simulated bases over one MQTT connection; module pods are
//! created bound round-robin to their vnodes (the scheduler's part is measured by its own
//! benchmark); reported: time from the first create to all pods Running/Ready, pods/s, the
//! module-controller's CPU seconds and RSS, and tunnel messages per second. Defaults are
//! small (50 bases, 500 pods) so the suite stays quick. No timed assertions.

use std::time::{Duration, Instant};

use anyhow::Result;
use e2e::module_controller::*;
use e2e::{eventually, ApiServer};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(module_pods_to_running_at_scale())
}

async fn module_pods_to_running_at_scale() -> Result<()> {
    if !require("mosquitto", "mosquitto") {
        return Ok(());
    }
    let bases = env_usize("MC_BENCH_BASES", 50);
    let pods_n = env_usize("MC_BENCH_PODS", 500);
    let api = ApiServer::start()?;
    let broker = Broker::start()?;
    let dir = tempfile::tempdir()?;
    let c = api.client()?;
    let (mc, metrics_port) = start_controller(
        &api,
        &broker,
        "bench",
        &[
            "--base-unreachable-after",
            "60",
            "--node-lease-duration",
            "40",
            "--health-interval",
            "10",
            "--query-interval",
            "15",
            "--log-level",
            "warn",
        ],
    )?;
    let _sim = start_simulator(&broker, bases, "sim", dir.path(), "10")?;

    let nodes: Api<Node> = Api::all(c.clone());
    let lp = ListParams::default().labels("virtual-kubelet.koupleless.io/component=vnode");
    let t0 = Instant::now();
    let ok = eventually(Duration::from_secs(300), || async {
        nodes.list(&lp).await.map(|l| l.items.len() >= bases).unwrap_or(false)
    })
    .await;
    assert!(ok.is_ok(), "{bases} vnodes did not appear\n{}", mc.log_text());
    let join = t0.elapsed();

    let pid = mc.pid().unwrap_or_default();
    let (cpu0, _) = cpu_and_rss(pid).unwrap_or_default();
    let m0 = http_get(metrics_port, "/metrics").unwrap_or_default();
    let msgs = |m: &str| {
        metric_sum(m, "module_controller_tunnel_messages_received_total")
            + metric_sum(m, "module_controller_tunnel_commands_sent_total")
    };
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let start = Instant::now();
    let creates = futures::stream::iter(0..pods_n)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let p: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("bench-{i}"),
                                 "labels": {"virtual-kubelet.koupleless.io/component": "module", "bench": "yes"}},
                    "spec": {"nodeName": format!("vnode.sim-{}.dev", i % bases),
                             "containers": [{"name": format!("m{i}"), "image": "file:///m.jar",
                                             "env": [{"name": "BIZ_VERSION", "value": "1.0.0"}]}]}
                }))?;
                pods.create(&PostParams::default(), &p).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let failed = creates.iter().filter(|r| r.is_err()).count();
    assert_eq!(failed, 0, "pod creates failed: {:?}", creates.iter().find(|r| r.is_err()));
    let created = start.elapsed();
    let blp = ListParams::default().labels("bench=yes");
    let peak_rss = std::sync::atomic::AtomicU64::new(0);
    let ok = eventually(Duration::from_secs(1800), || async {
        if let Some((_, rss)) = cpu_and_rss(pid) {
            peak_rss.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
        }
        let l = pods.list(&blp).await.map(|l| l.items).unwrap_or_default();
        let running = l
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        running == pods_n
    })
    .await;
    assert!(ok.is_ok(), "not all {pods_n} module pods reached Running\n{}", mc.log_text());
    let total = start.elapsed();
    let (cpu1, rss) = cpu_and_rss(pid).unwrap_or_default();
    let m1 = http_get(metrics_port, "/metrics").unwrap_or_default();
    let secs = total.as_secs_f64().max(1e-3);
    println!(
        "module-controller bench: bases={bases} pods={pods_n} vnodes_ready_in={:.1}s created_in={:.1}s \
         all_running_in={:.1}s rate={:.0} pods/s controller_cpu={:.1}s ({:.0}% of one core) \
         controller_rss={} MiB (peak {} MiB) tunnel_messages={:.0}/s",
        join.as_secs_f64(),
        created.as_secs_f64(),
        secs,
        pods_n as f64 / secs,
        cpu1 - cpu0,
        (cpu1 - cpu0) / secs * 100.0,
        rss >> 20,
        peak_rss.load(std::sync::atomic::Ordering::Relaxed).max(rss) >> 20,
        (msgs(&m1) - msgs(&m0)) / secs,
    );
    Ok(())
}
