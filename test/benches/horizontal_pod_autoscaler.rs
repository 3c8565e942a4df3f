//! Benchmark: 1,000 HorizontalPodAutoscalers over 1,000 Deployments on simulated nodes (no
//! Docker). Fake kubelets serve `/stats/summary` (every pod at 100m of CPU against a 100m
//! request, a 50% target), so each HPA scales its Deployment 1 → 2 (its maxReplicas) and
//! then keeps computing at every sync. Prints: seconds from creating the HPAs until every
//! Deployment was rescaled; the duration of one periodic pass over all HPAs (the
//! controller's own gauge) against the 15 s sync period; CPU seconds per pass of the
//! controller-manager and of the apiserver (which serves metrics.k8s.io from the kubelets).
//!
//!     cargo bench -p e2e --bench horizontal_pod_autoscaler   # MINIK8S_BENCH_HPAS, MINIK8S_BENCH_NODES
//!
//! Set MINIK8S_APISERVER_BIN / MINIK8S_CONTROLLER_MANAGER_BIN to release binaries for release figures.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::{extract::State, routing::get, Json, Router};
use e2e::controller_manager::{namespace, ControllerManager, FakeNodeAgent};
use e2e::ApiServer;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::{json, Value};

const SYNC_PERIOD: u64 = 15;

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?.block_on(bench())
}

/// Pods by node: (namespace, name, uid).
type Placement = Arc<Mutex<BTreeMap<String, Vec<(String, String, String)>>>>;

/// One simulated kubelet's `/stats/summary`: every pod of its node at 100m CPU, 20Mi.
async fn summary(State((node, pods)): State<(String, Placement)>) -> Json<Value> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let list = pods.lock().map(|p| p.get(&node).cloned().unwrap_or_default()).unwrap_or_default();
    let pods: Vec<Value> = list
        .iter()
        .map(|(ns, name, uid)| {
            let c = json!({"name": "c", "cpu": {"time": now, "usageNanoCores": 100_000_000u64},
                           "memory": {"time": now, "workingSetBytes": 20u64 << 20}});
            json!({"podRef": {"namespace": ns, "name": name, "uid": uid}, "containers": [c],
                   "cpu": {"time": now, "usageNanoCores": 100_000_000u64}})
        })
        .collect();
    Json(json!({"node": {"nodeName": node, "memory": {"time": now, "workingSetBytes": 1u64 << 30}}, "pods": pods}))
}

async fn fake_kubelet(node: String, pods: Placement) -> Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let app = Router::new().route("/stats/summary", get(summary)).with_state((node, pods));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(port)
}

/// Create `n` objects built by `make(i)`, 32 at a time.
async fn create_all<K>(api: &Api<K>, n: usize, make: impl Fn(usize) -> Result<K>) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let objects = (0..n).map(make).collect::<Result<Vec<K>>>()?;
    futures::stream::iter(objects)
        .map(|o| async move { api.create(&PostParams::default(), &o).await.map(|_| ()) })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    Ok(())
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok())
}

async fn bench() -> Result<()> {
    let n: usize = std::env::var("MINIK8S_BENCH_HPAS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let nodes: usize = std::env::var("MINIK8S_BENCH_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let api = ApiServer::start()?;
    let client = api.client()?;
    namespace(&client, "bench").await?;

    // Simulated nodes whose kubelet port is a fake Summary server.
    let placement: Placement = Arc::default();
    for i in 0..nodes {
        let name = format!("sim-{i}");
        let port = fake_kubelet(name.clone(), placement.clone()).await?;
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))?;
        Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await?;
    }
    {
        let placement = placement.clone();
        let pods: Api<Pod> = Api::namespaced(client.clone(), "bench");
        tokio::spawn(async move {
            let mut store: BTreeMap<String, (String, String, String, String)> = BTreeMap::new();
            let mut events = watcher(pods, watcher::Config::default()).default_backoff().boxed();
            while let Some(Ok(ev)) = events.next().await {
                let mut apply = |p: &Pod, gone: bool| {
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    if gone || p.metadata.deletion_timestamp.is_some() {
                        store.remove(&uid);
                    } else if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                        let ns = p.metadata.namespace.clone().unwrap_or_default();
                        store.insert(uid.clone(), (node, ns, p.metadata.name.clone().unwrap_or_default(), uid));
                    }
                };
                match &ev {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => apply(p, false),
                    watcher::Event::Delete(p) => apply(p, true),
                    _ => continue,
                }
                let mut by_node: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
                for (node, ns, name, uid) in store.values() {
                    by_node.entry(node.clone()).or_default().push((ns.clone(), name.clone(), uid.clone()));
                }
                if let Ok(mut p) = placement.lock() {
                    *p = by_node;
                }
            }
        });
    }

    let cm = ControllerManager::start(
        &api,
        &[
            "--controllers=replicaset,deployment,horizontalpodautoscaling",
            "--horizontal-pod-autoscaler-cpu-initialization-period=0s",
        ],
    )?;
    let _agent = FakeNodeAgent::start(client.clone());
    let deps: Api<Deployment> = Api::namespaced(client.clone(), "bench");
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), "bench");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "bench");
    create_all(&deps, n, |i| {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": format!("d{i}")},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": format!("d{i}")}},
                "template": {"metadata": {"labels": {"app": format!("d{i}")}},
                    "spec": {"nodeName": format!("sim-{}", i % nodes),
                             "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m"}}}]}}}
        }))?)
    })
    .await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while pods.list_metadata(&ListParams::default()).await?.items.len() < n {
        anyhow::ensure!(Instant::now() < deadline, "pods not created in 600s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let t0 = Instant::now();
    create_all(&hpas, n, |i| {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": format!("d{i}")},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": format!("d{i}")},
                     "minReplicas": 1, "maxReplicas": 2,
                     "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]}
        }))?)
    })
    .await?;
    let created = t0.elapsed();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        anyhow::ensure!(Instant::now() < deadline, "not all Deployments rescaled in time");
        let list = deps.list(&ListParams::default()).await?;
        if list.items.iter().all(|d| d.spec.replicas == Some(2)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rescaled = t0.elapsed();

    // Steady state: three periodic passes over all HPAs.
    tokio::time::sleep(Duration::from_secs(SYNC_PERIOD)).await;
    let (cm0, api0) =
        (cm.cpu_seconds().context("cm cpu")?, e2e::cpu_seconds(api.pid().context("api pid")?).context("api cpu")?);
    tokio::time::sleep(Duration::from_secs(3 * SYNC_PERIOD)).await;
    let cm_cpu = (cm.cpu_seconds().context("cm cpu")? - cm0) / 3.0;
    let api_cpu = (e2e::cpu_seconds(api.pid().context("api pid")?).context("api cpu")? - api0) / 3.0;
    let text = e2e::metrics_text(cm.port).await?;
    let pass = metric(&text, "horizontal_pod_autoscaler_sync_duration_seconds").context("no pass gauge")?;
    println!(
        "BENCH hpa {n} HPAs over {n} Deployments on {nodes} simulated nodes: created in {:.1}s, all rescaled 1->2 after {:.1}s; \
         one pass over all HPAs {pass:.2}s = {:.3} of the {SYNC_PERIOD}s sync period; CPU per pass: controller-manager {cm_cpu:.2}s, apiserver {api_cpu:.2}s",
        created.as_secs_f64(),
        rescaled.as_secs_f64(),
        pass / SYNC_PERIOD as f64,
    );
    Ok(())
}
