//! Benchmark: the workload controllers on simulated nodes (no Docker; a fake node agent marks
//! pods Running and Ready). In one run:
//!
//! - a Deployment of 100 → all available (the baseline), then a StatefulSet of 100 with
//!   `podManagementPolicy: Parallel` → all Ready: seconds, controller-manager CPU seconds,
//!   and the StatefulSet / Deployment ratios;
//! - a DaemonSet over 1,000 simulated Nodes → a pod for every node: seconds and
//!   controller-manager CPU seconds, and its CPU per pod against the Deployment's.
//!
//!     cargo test -p e2e --bench workloads    # MINIK8S_BENCH_REPLICAS (100), MINIK8S_BENCH_NODES (1000)
//!
//! Set MINIK8S_APISERVER_BIN / MINIK8S_CONTROLLER_MANAGER_BIN to release binaries for release figures.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::controller_manager::{deployment, namespace, ControllerManager, FakeNodeAgent};
use e2e::ApiServer;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?.block_on(bench())
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Poll `done` every 200 ms; the seconds it took and the controller-manager's CPU seconds.
async fn measure<F, Fut>(
    cm: &ControllerManager,
    what: &str,
    start: impl std::future::Future<Output = Result<()>>,
    mut done: F,
) -> Result<(f64, f64)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let cpu0 = cm.cpu_seconds().context("controller-manager CPU time")?;
    let t0 = Instant::now();
    start.await?;
    let deadline = t0 + Duration::from_secs(600);
    while !done().await? {
        anyhow::ensure!(Instant::now() < deadline, "{what}: not done in 600s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((secs, cm.cpu_seconds().context("controller-manager CPU time")? - cpu0))
}

async fn bench() -> Result<()> {
    let replicas = env("MINIK8S_BENCH_REPLICAS", 100);
    let n_nodes = env("MINIK8S_BENCH_NODES", 1000);
    let api = ApiServer::start()?;
    let client = api.client()?;
    for ns in ["deploy", "sts", "ds"] {
        namespace(&client, ns).await?;
    }
    let cm = ControllerManager::start(&api, &["--controllers=replicaset,deployment,statefulset,daemonset"])?;
    let _agent = FakeNodeAgent::start(client.clone());
    let pp = PostParams::default();

    // Baseline: a Deployment of `replicas`.
    let deps: Api<Deployment> = Api::namespaced(client.clone(), "deploy");
    let dep = deployment("web", replicas as i32, "nginx:1")?;
    let (dep_s, dep_cpu) = measure(
        &cm,
        "deployment",
        async {
            deps.create(&pp, &dep).await?;
            Ok(())
        },
        || async {
            let d = deps.get("web").await?;
            Ok(d.status.and_then(|s| s.available_replicas) == Some(replicas as i32))
        },
    )
    .await?;

    // A Parallel StatefulSet of `replicas`.
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "sts");
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": replicas, "serviceName": "web", "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}
    }))?;
    let (sts_s, sts_cpu) = measure(
        &cm,
        "statefulset",
        async {
            sets.create(&pp, &set).await?;
            Ok(())
        },
        || async {
            let s = sets.get("web").await?;
            Ok(s.status.and_then(|s| s.ready_replicas) == Some(replicas as i32))
        },
    )
    .await?;

    // A DaemonSet over `n_nodes` simulated Nodes (created before the measurement).
    let nodes: Api<Node> = Api::all(client.clone());
    let made = futures::stream::iter(0..n_nodes)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let node: Node = serde_json::from_value(json!({"metadata": {"name": format!("sim-{i}"),
                    "labels": {"kubernetes.io/hostname": format!("sim-{i}")}}}))?;
                nodes.create(&PostParams::default(), &node).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    made.into_iter().collect::<Result<Vec<_>>>()?;
    let daemons: Api<DaemonSet> = Api::namespaced(client.clone(), "ds");
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}
    }))?;
    let ds_pods: Api<Pod> = Api::namespaced(client.clone(), "ds");
    let (ds_s, ds_cpu) = measure(
        &cm,
        "daemonset",
        async {
            daemons.create(&pp, &ds).await?;
            Ok(())
        },
        || async { Ok(ds_pods.list_metadata(&ListParams::default()).await?.items.len() >= n_nodes) },
    )
    .await?;
    let n = ds_pods.list_metadata(&ListParams::default()).await?.items.len();
    anyhow::ensure!(n == n_nodes, "{n} daemon pods for {n_nodes} nodes");

    let per_pod = |cpu: f64, pods: usize| cpu * 1000.0 / pods as f64;
    println!(
        "BENCH workloads deployment {replicas} -> all available: {dep_s:.2}s, controller-manager CPU {dep_cpu:.2}s (baseline)"
    );
    println!(
        "BENCH workloads statefulset {replicas} (Parallel) -> all Ready: {sts_s:.2}s, controller-manager CPU {sts_cpu:.2}s; \
         ratio to the deployment: time {:.2}x, CPU {:.2}x",
        sts_s / dep_s,
        sts_cpu / dep_cpu.max(0.001)
    );
    println!(
        "BENCH workloads daemonset over {n_nodes} simulated nodes -> {n_nodes} pods created: {ds_s:.2}s, \
         controller-manager CPU {ds_cpu:.2}s ({:.2} ms per pod; deployment {:.2} ms per pod: {:.2}x)",
        per_pod(ds_cpu, n_nodes),
        per_pod(dep_cpu, replicas),
        per_pod(ds_cpu, n_nodes) / per_pod(dep_cpu, replicas).max(0.000_001)
    );
    Ok(())
}
