//! Benchmark: 500 PersistentVolumeClaims of an Immediate class of the local-path provisioner
//! (`rancher.io/local-path`) on one simulated Node (no Docker, no kubelet: provisioning only
//! writes the PersistentVolume). Prints p50 / p99 of create → Bound, measured on a watch,
//! and the same percentiles of create → seen on a watch for as many ConfigMaps in the same
//! run (the API's floor), with their ratio.
//!
//!     cargo test -p e2e --bench volumes      # MINIK8S_BENCH_CLAIMS changes the count
//!
//! Set MINIK8S_APISERVER_BIN / MINIK8S_CONTROLLER_MANAGER_BIN to release binaries for release figures.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::controller_manager::{namespace, ControllerManager};
use e2e::ApiServer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?.block_on(bench())
}

/// When each object was created (client side) and when the watch first saw it done.
#[derive(Default)]
struct Times {
    created: HashMap<String, Instant>,
    done: HashMap<String, Instant>,
}

type Shared = Arc<Mutex<Times>>;

/// Follow `api` and record, per name, the first time `done` holds.
fn follow<K>(api: Api<K>, times: Shared, done: fn(&K) -> bool)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default()).default_backoff().applied_objects().boxed();
        while let Some(Ok(o)) = events.next().await {
            if done(&o) {
                let now = Instant::now();
                if let (Ok(mut t), Some(n)) = (times.lock(), o.meta().name.clone()) {
                    t.done.entry(n).or_insert(now);
                }
            }
        }
    });
}

/// Create `n` objects built by `make(i)`, 32 at a time, noting each one's creation time.
async fn create_all<K>(api: &Api<K>, n: usize, times: &Shared, make: impl Fn(usize) -> Result<K>) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let objects = (0..n).map(make).collect::<Result<Vec<K>>>()?;
    let results = futures::stream::iter(objects)
        .map(|o| async move {
            let name = o.meta().name.clone().unwrap_or_default();
            let t = Instant::now();
            api.create(&PostParams::default(), &o).await.map(|_| (name, t))
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    for r in results {
        let (name, t) = r?;
        if let Ok(mut times) = times.lock() {
            times.created.insert(name, t);
        }
    }
    Ok(())
}

/// Wait until all `n` are done; (p50, p99) of create → done, in milliseconds.
async fn percentiles(times: &Shared, n: usize, what: &str) -> Result<(f64, f64)> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = times.lock().map(|t| t.done.len()).unwrap_or(0);
        if done >= n {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "{what}: only {done} of {n} done in 600s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t = times.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let mut ms: Vec<f64> = t
        .created
        .iter()
        .filter_map(|(name, c)| t.done.get(name).map(|d| d.saturating_duration_since(*c).as_secs_f64() * 1000.0))
        .collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    anyhow::ensure!(ms.len() == n, "{what}: {} measured of {n}", ms.len());
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    Ok((at(0.50), at(0.99)))
}

async fn bench() -> Result<()> {
    let n: usize = std::env::var("MINIK8S_BENCH_CLAIMS").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
    let api = ApiServer::start()?;
    let client = api.client()?;
    namespace(&client, "bench").await?;

    // One Ready simulated node for the provisioner to place Immediate volumes on.
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "sim-0",
        "labels": {"kubernetes.io/hostname": "sim-0"}}}))?;
    nodes.create(&PostParams::default(), &node).await?;
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    nodes.patch_status("sim-0", &PatchParams::default(), &Patch::Merge(&ready)).await?;
    let class: StorageClass = serde_json::from_value(json!({"metadata": {"name": "now"},
        "provisioner": "rancher.io/local-path", "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}))?;
    Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await?;

    // Baseline: create → seen on a watch, for as many ConfigMaps.
    let base: Shared = Arc::default();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "bench");
    follow(maps.clone(), base.clone(), |_| true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    create_all(&maps, n, &base, |i| Ok(serde_json::from_value(json!({"metadata": {"name": format!("m{i}")}}))?))
        .await?;
    let (b50, b99) = percentiles(&base, n, "configmaps").await?;

    let _cm = ControllerManager::start(&api, &["--controllers=persistentvolume-binder,pvc-protection,pv-protection"])?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "bench");
    let bound: Shared = Arc::default();
    follow(claims.clone(), bound.clone(), |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"));
    // The binder is up once the default class it creates at start exists.
    let classes: Api<StorageClass> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while classes.get_opt("local-path").await?.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "the controller-manager did not start in 60s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t0 = Instant::now();
    create_all(&claims, n, &bound, |i| {
        Ok(serde_json::from_value(json!({"metadata": {"name": format!("c{i}")},
            "spec": {"storageClassName": "now", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Mi"}}}}))?)
    })
    .await?;
    let (p50, p99) = percentiles(&bound, n, "claims").await.context("claims bound")?;
    let all = t0.elapsed().as_secs_f64();
    println!(
        "BENCH volumes {n} claims (Immediate, rancher.io/local-path) create -> Bound: p50 {p50:.0} ms, p99 {p99:.0} ms, \
         all bound after {all:.1}s; baseline {n} ConfigMaps create -> watched: p50 {b50:.0} ms, p99 {b99:.0} ms; \
         ratio p50 {:.1}x, p99 {:.1}x",
        p50 / b50.max(0.001),
        p99 / b99.max(0.001),
    );
    Ok(())
}
