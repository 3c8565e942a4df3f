//! Benchmark: a Deployment scaled 0 → 1,000 replicas with a fake node agent marking pods
//! Running: seconds until 1,000 pods exist and until all are available, and the
//! controller-manager's CPU seconds.
//!
//!     cargo bench -p e2e --bench controller_manager      # MINIK8S_BENCH_REPLICAS changes the count
//!
//! Set MINIK8S_APISERVER_BIN / MINIK8S_CONTROLLER_MANAGER_BIN to release binaries for release figures.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::controller_manager::{deployment, kubectl_ok, namespace, ControllerManager, FakeNodeAgent};
use e2e::ApiServer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?
        .block_on(benchmark_deployment_scale_0_to_1000())
}

async fn benchmark_deployment_scale_0_to_1000() -> Result<()> {
    let replicas: i32 = std::env::var("MINIK8S_BENCH_REPLICAS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let api = ApiServer::start()?;
    let client = api.client()?;
    namespace(&client, "bench").await?;
    let cm = ControllerManager::start(&api, &[])?;
    let _agent = FakeNodeAgent::start(client.clone());
    let deps: Api<Deployment> = Api::namespaced(client.clone(), "bench");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "bench");
    deps.create(&PostParams::default(), &deployment("bench", 0, "nginx:1")?).await?;
    kubectl_ok(&api, &["-n", "bench", "rollout", "status", "deployment/bench", "--timeout=60s"]).await?;
    let cpu0 = cm.cpu_seconds().context("controller-manager CPU time")?;
    let t0 = Instant::now();
    deps.patch("bench", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": replicas}}))).await?;
    let mut all_exist = None;
    let deadline = t0 + Duration::from_secs(600);
    loop {
        anyhow::ensure!(Instant::now() < deadline, "not done in 600s");
        if all_exist.is_none() {
            let n = pods.list_metadata(&ListParams::default()).await?.items.len();
            if n >= replicas as usize {
                all_exist = Some(t0.elapsed());
            }
        }
        let d = deps.get("bench").await?;
        if all_exist.is_some() && d.status.as_ref().and_then(|s| s.available_replicas) == Some(replicas) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_available = t0.elapsed();
    let cpu = cm.cpu_seconds().context("controller-manager CPU time")? - cpu0;
    let n = pods.list_metadata(&ListParams::default()).await?.items.len();
    assert_eq!(n, replicas as usize, "no extra pods");
    println!(
        "BENCH deployment 0 -> {replicas}: all pods exist after {:.2}s, all available after {:.2}s, controller-manager CPU {:.2}s",
        all_exist.unwrap_or_default().as_secs_f64(),
        all_available.as_secs_f64(),
        cpu
    );
    Ok(())
}
