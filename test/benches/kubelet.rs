//! Benchmark: pod startup latency through MiniK8s (create → Running and Ready, observed
//! through a watch) for 1 and for 30 pods at once, beside raw Docker creating and starting
//! the same pause + app containers (over the Engine API socket) in the same run.
//!
//!     cargo bench -p e2e --bench kubelet
//!
//! Prints p50/p99 for both and the ratio; asserts nothing about speed.
//!
//! Then the cost of `/stats/summary` with 100 running pods (MINIK8S_BENCH_STATS_PODS): the
//! kubelet serves it from cgroup readings refreshed every `--housekeeping-interval`; the
//! baseline, measured in the same run, is what a summary used to cost — one Docker stats
//! call per container, all at once. Also the kubelet's CPU over a minute at idle while a
//! metrics pipeline asks for a summary every 15 s.
//!
//! Then Prometheus' view of the same 100 pods: the duration and series count of a
//! `/metrics/cadvisor` scrape, and the kubelet's CPU over a minute with a scrape every 15 s
//! beside a minute with no request at all (the baseline, same run).
//! `MINIK8S_BENCH_STATS_ONLY=1` skips the start-up latency part.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use e2e::kubelet::{docker_bin, node_containers, require_docker, Kubelet};
use e2e::ApiServer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use serde_json::{json, Value};

/// One Docker Engine API call over /var/run/docker.sock; returns (status, body).
fn docker_api(method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
    let mut s = UnixStream::connect("/var/run/docker.sock").context("connecting to the Docker socket")?;
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} /v1.41{path} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
        payload.len()
    );
    s.write_all(req.as_bytes())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let (head, rest) = text.split_once("\r\n\r\n").context("bad HTTP answer")?;
    let status: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("bad status")?;
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        rest.lines().filter(|l| l.starts_with('{')).collect::<String>()
    } else {
        rest.to_string()
    };
    Ok((status, serde_json::from_str(&body).unwrap_or(Value::Null)))
}

fn create_start(name: &str, body: Value) -> Result<String> {
    let (st, v) = docker_api("POST", &format!("/containers/create?name={name}"), Some(&body))?;
    if st != 201 {
        bail!("create {name}: {st} {v}");
    }
    let id = v["Id"].as_str().context("no Id")?.to_string();
    let (st, v) = docker_api("POST", &format!("/containers/{id}/start"), None)?;
    if st != 204 {
        bail!("start {name}: {st} {v}");
    }
    Ok(id)
}

/// Raw Docker: `n` pods at once, each a pause container (no network) and a busybox app
/// container joined to it. Per-pod latency from the common start.
fn raw_docker(n: usize, tag: &str) -> Result<Vec<Duration>> {
    let label = format!("minik8s.io/bench={tag}");
    let t0 = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let tag = tag.to_string();
            std::thread::spawn(move || -> Result<Duration> {
                let labels = json!({"minik8s.io/bench": tag});
                let pause = create_start(
                    &format!("bench-{tag}-{i}-pause"),
                    json!({"Image": "minik8s/pause:latest", "Labels": labels, "HostConfig": {"NetworkMode": "none", "IpcMode": "shareable"}}),
                )?;
                create_start(
                    &format!("bench-{tag}-{i}-app"),
                    json!({"Image": "busybox", "Entrypoint": ["sh", "-c", "sleep 3600"], "Labels": labels,
                           "HostConfig": {"NetworkMode": format!("container:{pause}"), "IpcMode": format!("container:{pause}")}}),
                )?;
                Ok(t0.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.join().map_err(|_| anyhow::anyhow!("thread panicked"))??);
    }
    let ids =
        std::process::Command::new(docker_bin()).args(["ps", "-aq", "--filter", &format!("label={label}")]).output()?;
    let ids: Vec<String> = String::from_utf8_lossy(&ids.stdout).split_whitespace().map(str::to_string).collect();
    if !ids.is_empty() {
        std::process::Command::new(docker_bin()).args(["rm", "-f"]).args(&ids).output()?;
    }
    Ok(out)
}

fn ready(p: &Pod) -> bool {
    let st = p.status.clone().unwrap_or_default();
    st.phase.as_deref() == Some("Running")
        && st.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Through MiniK8s: create `n` pods at once, time each to Running+Ready seen by a watch.
async fn minik8s(api: &Api<Pod>, kubelet: &Kubelet, n: usize, tag: &str) -> Result<Vec<Duration>> {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let w = {
        let (api, seen) = (api.clone(), seen.clone());
        tokio::spawn(async move {
            let mut s = watcher(api, watcher::Config::default()).boxed();
            while let Some(ev) = s.next().await {
                if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev {
                    if ready(&p) {
                        if let (Some(name), Ok(mut m)) = (p.metadata.name.clone(), seen.lock()) {
                            m.entry(name).or_insert_with(Instant::now);
                        }
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let names: Vec<String> = (0..n).map(|i| format!("bench-{tag}-{i}")).collect();
    let t0 = Instant::now();
    let creates = names.iter().map(|name| {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": kubelet.node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", "sleep 3600"]}]}
        }))
        .expect("static pod json");
        async move { api.create(&PostParams::default(), &pod).await }
    });
    for r in futures::future::join_all(creates).await {
        r?;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if seen.lock().map(|m| names.iter().all(|n| m.contains_key(n))).unwrap_or(false) {
            break;
        }
        if Instant::now() > deadline {
            w.abort();
            bail!("not all pods ready in 180s; kubelet log:\n{}", kubelet.log());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.abort();
    let out = {
        let m = seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        names.iter().map(|n| m[n].duration_since(t0)).collect()
    };
    for name in &names {
        api.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !node_containers(&kubelet.node).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(out)
}

fn pct(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn main() -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(pod_startup_latency())
}

async fn pod_startup_latency() -> Result<()> {
    if !require_docker() {
        bail!("the Docker engine is not running: start dockerd (scripts/test does)");
    }
    let server = ApiServer::start()?;
    let kubelet = Kubelet::start(&server.url(), "kl-bench")?;
    let api: Api<Pod> = Api::namespaced(server.client()?, "default");
    if std::env::var("MINIK8S_BENCH_STATS_ONLY").is_ok() {
        return stats_cost(&api, &kubelet).await;
    }
    // Warm-up (bridge creation, image inspect caches).
    minik8s(&api, &kubelet, 1, "warm").await?;
    raw_docker(1, "warm")?;
    println!("\npod startup latency (create → Running+Ready via watch) vs raw Docker (pause + app create+start)");
    println!(
        "{:>5} | {:>12} {:>12} | {:>12} {:>12} | {:>9}",
        "pods", "minik8s p50", "minik8s p99", "docker p50", "docker p99", "p99 ratio"
    );
    for n in [1usize, 30] {
        let k = minik8s(&api, &kubelet, n, &format!("k{n}")).await?;
        let d = raw_docker(n, &format!("d{n}-{}", std::process::id()))?;
        let (k50, k99, d50, d99) = (pct(&k, 0.5), pct(&k, 0.99), pct(&d, 0.5), pct(&d, 0.99));
        println!(
            "{n:>5} | {:>10.0}ms {:>10.0}ms | {:>10.0}ms {:>10.0}ms | {:>8.2}x",
            k50.as_secs_f64() * 1e3,
            k99.as_secs_f64() * 1e3,
            d50.as_secs_f64() * 1e3,
            d99.as_secs_f64() * 1e3,
            k99.as_secs_f64() / d99.as_secs_f64().max(1e-6)
        );
    }
    stats_cost(&api, &kubelet).await
}

/// A Prometheus scrape of `/metrics/cadvisor` with `n` pods running: its duration (p50 and
/// max of 10), its size and series count, and the kubelet's CPU over 60 s with a scrape every
/// 15 s beside 60 s with no request (the baseline).
async fn cadvisor_cost(kubelet: &Kubelet, n: usize) -> Result<()> {
    let mut times = Vec::new();
    let mut body = String::new();
    for _ in 0..10 {
        let t = Instant::now();
        let (status, b) = kubelet.get("/metrics/cadvisor")?;
        times.push(t.elapsed());
        anyhow::ensure!(status == 200, "/metrics/cadvisor: {status}");
        body = b;
    }
    let series = body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count();
    let pid = kubelet.pid().context("kubelet pid")?;
    let window = |scrape: bool| async move {
        let cpu0 = e2e::cpu_seconds(pid).context("kubelet cpu")?;
        for _ in 0..4 {
            if scrape {
                kubelet.get("/metrics/cadvisor")?;
            }
            tokio::time::sleep(Duration::from_secs(15)).await;
        }
        anyhow::Ok(e2e::cpu_seconds(pid).context("kubelet cpu")? - cpu0)
    };
    let idle = window(false).await?;
    let scraped = window(true).await?;
    times.sort();
    println!(
        "\n/metrics/cadvisor with {n} running pods: {:.1}ms p50, {:.1}ms max of 10 scrapes; {series} series, {} KiB; \
         kubelet CPU over 60 s: {scraped:.2}s with a scrape every 15 s ({:.2}% of a core) vs {idle:.2}s with none ({:.2}%): \
         the scrapes cost {:.2}% of a core",
        pct(&times, 0.5).as_secs_f64() * 1e3,
        times.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
        body.len() / 1024,
        scraped / 60.0 * 100.0,
        idle / 60.0 * 100.0,
        (scraped - idle).max(0.0) / 60.0 * 100.0
    );
    Ok(())
}

/// `/stats/summary` with many running pods: the kubelet's answer vs one Docker stats call
/// per container (the old way), and the kubelet's idle CPU with a summary every 15 s.
async fn stats_cost(api: &Api<Pod>, kubelet: &Kubelet) -> Result<()> {
    let n: usize = std::env::var("MINIK8S_BENCH_STATS_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    for i in 0..n {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("stats-{i}")},
            "spec": {"nodeName": kubelet.node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "app", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", "sleep 3600"]}]}
        }))?;
        api.create(&PostParams::default(), &pod).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let app_ids = loop {
        // Running app containers of this node (names carry the container name `app`).
        let ids: Vec<String> = node_containers(&kubelet.node)
            .into_iter()
            .filter(|(_, name, state)| state == "running" && name.starts_with("k8s_app_"))
            .map(|(id, _, _)| id)
            .collect();
        if ids.len() >= n {
            break ids;
        }
        if Instant::now() > deadline {
            bail!("only {} of {n} pods running after 600s", ids.len());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    // Let the housekeeping take two samples of every container.
    tokio::time::sleep(Duration::from_secs(21)).await;
    let mut ours = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        let (status, body) = kubelet.get("/stats/summary")?;
        ours.push(t.elapsed());
        let pods = serde_json::from_str::<Value>(&body)?["pods"].as_array().map(Vec::len).unwrap_or(0);
        anyhow::ensure!(status == 200 && pods >= n, "summary: {status}, {pods} pods");
    }
    let mut docker = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let handles: Vec<_> = app_ids
            .iter()
            .map(|id| {
                let path = format!("/containers/{id}/stats?stream=false");
                std::thread::spawn(move || docker_api("GET", &path, None).map(|_| ()))
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("stats thread panicked"))??;
        }
        docker.push(t.elapsed());
    }
    let pid = kubelet.pid().context("kubelet pid")?;
    let cpu0 = e2e::cpu_seconds(pid).context("kubelet cpu")?;
    for _ in 0..4 {
        kubelet.get("/stats/summary")?;
        tokio::time::sleep(Duration::from_secs(15)).await;
    }
    let idle_cpu = e2e::cpu_seconds(pid).context("kubelet cpu")? - cpu0;
    let (o50, d50) = (pct(&ours, 0.5), pct(&docker, 0.5));
    println!(
        "\n/stats/summary with {n} running pods: {:.1}ms (p50 of 10) vs one Docker stats call per container {:.0}ms (p50 of 3): {:.0}x faster; \
         kubelet CPU over 60 s idle with a summary every 15 s: {idle_cpu:.2}s ({:.1}% of a core)",
        o50.as_secs_f64() * 1e3,
        d50.as_secs_f64() * 1e3,
        d50.as_secs_f64() / o50.as_secs_f64().max(1e-6),
        idle_cpu / 60.0 * 100.0
    );
    cadvisor_cost(kubelet, n).await?;
    for i in 0..n {
        api.delete(&format!("stats-{i}"), &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
            .await?;
    }
    Ok(())
}
