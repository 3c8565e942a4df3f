//! Scheduling throughput in the style of Kubernetes' scheduler_perf `SchedulingBasic`:
//! N nodes and M pods created through the API of a real apiserver (release build, embedded
//! store), pods/s from the first pod creation to the last successful binding.
//!
//! ```text
//! cargo run --release -p scheduler --example scheduler_bench
//! BENCH_NODES=500 BENCH_PODS=1000 cargo run --release -p scheduler --example scheduler_bench   # quick
//! BENCH_SCENARIOS=basic,anti-affinity,spread   # which workloads (default: all three)
//! ```
//!
//! Baseline, measured in the same run: creating the same M pods with no scheduler (the
//! API's own ceiling for this workload); each scenario prints its ratio to it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Build the release apiserver (unless `MINIK8S_APISERVER_BIN` names one).
fn apiserver_bin() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("MINIK8S_APISERVER_BIN") {
        return Ok(PathBuf::from(p));
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "--release", "-q", "-p", "apiserver", "--bin", "apiserver"])
        .current_dir(workspace())
        .status()?;
    if !st.success() {
        bail!("building the apiserver failed");
    }
    let dir = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| workspace().join("target"));
    Ok(dir.join("release").join("apiserver"))
}

struct ApiServer {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_apiserver(bin: &Path) -> Result<ApiServer> {
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let log = std::fs::File::create(dir.path().join("apiserver.log"))?;
    let child = Command::new(bin)
        .args(["--port", &port.to_string(), "--log-level", "warn", "--data-dir"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the apiserver")?;
    let url = format!("http://127.0.0.1:{port}");
    let s = ApiServer { child, url, _dir: dir };
    let client = client(&s.url)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if client.apiserver_version().await.is_ok() {
            let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
            if ns.get("default").await.is_ok() {
                return Ok(s);
            }
        }
        if Instant::now() > deadline {
            bail!("apiserver did not come up");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn client(url: &str) -> Result<kube::Client> {
    Ok(kube::Client::try_from(kube::Config::new(url.parse()?))?)
}

/// scheduler_perf's node-default.yaml: 4 cpu, 32Gi, 110 pods; plus hostname and zone labels.
fn node(i: usize) -> Value {
    let name = format!("node-{i}");
    let alloc = json!({"cpu": "4", "memory": "32Gi", "pods": "110"});
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": format!("zone-{}", i % 10)}},
        "status": {"capacity": alloc, "allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}})
}

/// scheduler_perf's pod-default.yaml (100m cpu, 500Mi), plus the scenario's constraints.
fn pod(i: usize, scenario: &str, scheduler: &str) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i}"), "labels": {"app": "bench"}},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m", "memory": "500Mi"}, "limits": {"cpu": "100m", "memory": "500Mi"}}}]}});
    match scenario {
        // Ten groups of pods; a pod keeps away from the pods of its own group per node.
        "anti-affinity" => {
            let g = format!("g{}", i % 10);
            p["metadata"]["labels"]["group"] = json!(g);
            p["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"group": g}}, "topologyKey": "kubernetes.io/hostname"}]}});
        }
        "spread" => {
            p["spec"]["topologySpreadConstraints"] = json!([{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "bench"}}}]);
        }
        _ => {}
    }
    p
}

async fn create_all<K>(api: &Api<K>, objs: Vec<Value>, concurrency: usize) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let results: Vec<Result<()>> = futures::stream::iter(objs)
        .map(|o| async move {
            let obj: K = serde_json::from_value(o)?;
            api.create(&PostParams::default(), &obj).await?;
            Ok(())
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    for r in results {
        r?;
    }
    Ok(())
}

/// Create M pods nobody schedules: the API's ceiling for this workload.
async fn baseline(bin: &Path, pods: usize, concurrency: usize) -> Result<f64> {
    let api = start_apiserver(bin).await?;
    let c = client(&api.url)?;
    let papi: Api<Pod> = Api::namespaced(c, "default");
    let t0 = Instant::now();
    create_all(&papi, (0..pods).map(|i| pod(i, "basic", "nobody")).collect(), concurrency).await?;
    Ok(pods as f64 / t0.elapsed().as_secs_f64())
}

/// CPU seconds (user + system) used so far by a process.
fn cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

struct Outcome {
    apiserver_cpu: f64,
    bench_cpu: f64,
    pods_per_sec: f64,
    create_secs: f64,
    total_secs: f64,
}

async fn scenario(bin: &Path, name: &str, nodes: usize, pods: usize, concurrency: usize) -> Result<Outcome> {
    let api = start_apiserver(bin).await?;
    let c = client(&api.url)?;
    let napi: Api<Node> = Api::all(c.clone());
    let t = Instant::now();
    create_all(&napi, (0..nodes).map(node).collect(), concurrency).await?;
    eprintln!("  {name}: {nodes} nodes created in {:.1}s", t.elapsed().as_secs_f64());

    // The scheduler runs in this process on its own runtime and connection pool.
    let registry = prometheus::Registry::new();
    let metrics = scheduler::scheduler::Metrics::new(&registry)?;
    let mut profiles = scheduler::config::build(None, None)?;
    profiles.parallelism = env_usize("BENCH_PARALLELISM", profiles.parallelism);
    let sched_client = client(&api.url)?;
    let ready = common::Ready::default();
    let ready2 = ready.clone();
    let m2 = metrics.clone();
    std::thread::spawn(move || {
        let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => return eprintln!("scheduler runtime: {e}"),
        };
        rt.block_on(async move {
            let s = scheduler::scheduler::Scheduler::new(sched_client, profiles, m2);
            if let Err(e) = s.run(ready2).await {
                eprintln!("scheduler stopped: {e:#}");
            }
        });
    });
    while !ready.get() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let bound = || metrics.binds.with_label_values(&["ok"]).get() as usize;
    let papi: Api<Pod> = Api::namespaced(c.clone(), "default");
    let api_pid = api.child.id().to_string();
    let (a0, b0) = (cpu_secs(&api_pid), cpu_secs("self"));
    let t0 = Instant::now();
    create_all(&papi, (0..pods).map(|i| pod(i, name, "default-scheduler")).collect(), concurrency).await?;
    let create_secs = t0.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last = (bound(), Instant::now());
    while bound() < pods {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let b = bound();
        if b != last.0 {
            last = (b, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(30) || Instant::now() > deadline {
            bail!("{name}: only {b}/{pods} pods bound, no progress for 30s");
        }
    }
    let total_secs = t0.elapsed().as_secs_f64();
    Ok(Outcome {
        apiserver_cpu: cpu_secs(&api_pid) - a0,
        bench_cpu: cpu_secs("self") - b0,
        pods_per_sec: pods as f64 / total_secs,
        create_secs,
        total_secs,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let nodes = env_usize("BENCH_NODES", 5000);
    let pods = env_usize("BENCH_PODS", 10000);
    let concurrency = env_usize("BENCH_CONCURRENCY", 64);
    let scenarios = std::env::var("BENCH_SCENARIOS").unwrap_or_else(|_| "basic,anti-affinity,spread".into());
    let bin = apiserver_bin()?;
    println!("scheduler benchmark: {nodes} nodes, {pods} pods, {concurrency} concurrent creates, apiserver on the embedded store");
    let base = baseline(&bin, pods, concurrency).await?;
    println!("{:<16} {:>10.0} pods/s  (create {pods} pods, no scheduler)", "baseline", base);
    for name in scenarios.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let o = scenario(&bin, name, nodes, pods, concurrency).await?;
        println!(
            "{:<16} {:>10.0} pods/s  (first create → last binding {:.2}s; creates done at {:.2}s; {:.2}x baseline; cpu: apiserver {:.1}s, scheduler+client {:.1}s)",
            name,
            o.pods_per_sec,
            o.total_secs,
            o.create_secs,
            o.pods_per_sec / base,
            o.apiserver_cpu,
            o.bench_cpu
        );
    }
    Ok(())
}
