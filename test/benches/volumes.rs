//! Benchmark: 500 PersistentVolumeClaims of an Immediate class of the local-path provisioner
//! (`rancher.io/local-path`) on one simulated Node (no Docker, no kubelet: provisioning only
//! writes the PersistentVolume). Prints p50 / p99 of create → Bound, measured on a watch,
//! and the same percentiles of create → seen on a watch for as many ConfigMaps in the same
//! run (the API's floor), with their ratio.
//!
//!     cargo test -p e2e --bench volumes      # MINIK8S_BENCH_CLAIMS changes the count
//!
//! Set MINIK8S_APISERVER_BIN / MINIK8S_CONTROLLER_MANAGER_BIN to release binaries for release figures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::bench::{create_all, follow, percentiles, Shared};
use e2e::controller_manager::{namespace, ControllerManager};
use e2e::ApiServer;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?.block_on(bench())
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
