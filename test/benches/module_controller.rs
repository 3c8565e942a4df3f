//! Benchmark of module-controller at scale (one command):
//!
//! ```text
//! MC_BENCH_SCALES=1000x10000,5000x50000 cargo bench -p e2e --bench module_controller
//! ```
//!
//! Each scale `BASESxPODS` runs on its own fresh apiserver, broker and controller (release
//! builds): `base --simulate BASES` runs the bases over one MQTT connection; module pods are
//! created bound round-robin to their vnodes (the scheduler's part is measured by its own
//! benchmark). Reported per scale: time from the first create to all pods Running/Ready,
//! pods/s, the CPU seconds of the controller, the apiserver, the broker and the simulated bases
//! over that time, the controller's RSS (at the end and its peak), the tunnel messages per
//! second through the broker (the controller's side: received + sent), and the requests per
//! second the apiserver served by verb and resource (whose share the controller's background
//! writes — vnode statuses, Leases — take). The first scale is the baseline the others
//! are compared with. The default is one small scale (50x500) so the suite stays quick. No
//! timed assertions.

use std::time::{Duration, Instant};

use anyhow::Result;
use e2e::module_controller::*;
use e2e::{eventually, ApiServer};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

/// What one scale measured.
struct Run {
    bases: usize,
    pods: usize,
    join_s: f64,
    created_s: f64,
    total_s: f64,
    controller_cpu_s: f64,
    apiserver_cpu_s: f64,
    broker_cpu_s: f64,
    /// The simulated bases' process (load of the benchmark itself, on the same machine).
    simulator_cpu_s: f64,
    rss: u64,
    peak_rss: u64,
    messages_per_s: f64,
    /// Requests the apiserver served over the run, per second, by `verb resource[/sub]`,
    /// busiest first.
    api_requests: Vec<(String, f64)>,
}

impl Run {
    fn rate(&self) -> f64 {
        self.pods as f64 / self.total_s.max(1e-3)
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `MC_BENCH_SCALES` (`BASESxPODS,…`), else `MC_BENCH_BASES` x `MC_BENCH_PODS` (50x500).
fn scales() -> Vec<(usize, usize)> {
    match std::env::var("MC_BENCH_SCALES") {
        Ok(v) => v
            .split(',')
            .filter_map(|s| s.trim().split_once('x'))
            .map(|(b, p)| {
                let bad = || panic!("MC_BENCH_SCALES: {v:?} is not BASESxPODS,…");
                (b.parse().unwrap_or_else(|_| bad()), p.parse().unwrap_or_else(|_| bad()))
            })
            .collect(),
        Err(_) => vec![(env_usize("MC_BENCH_BASES", 50), env_usize("MC_BENCH_PODS", 500))],
    }
}

fn main() -> Result<()> {
    if !require("mosquitto", "mosquitto") {
        return Ok(());
    }
    e2e::use_release_apiserver();
    use_release_module_controller();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut runs = Vec::new();
    for (bases, pods) in scales() {
        let run = rt.block_on(module_pods_to_running_at_scale(bases, pods))?;
        println!(
            "module-controller bench: bases={} pods={} vnodes_ready_in={:.1}s created_in={:.1}s all_running_in={:.1}s \
             rate={:.0} pods/s controller_cpu={:.1}s ({:.0}% of one core) apiserver_cpu={:.1}s broker_cpu={:.1}s \
             simulator_cpu={:.1}s controller_rss={} MiB (peak {} MiB) tunnel_messages={:.0}/s",
            run.bases,
            run.pods,
            run.join_s,
            run.created_s,
            run.total_s,
            run.rate(),
            run.controller_cpu_s,
            run.controller_cpu_s / run.total_s.max(1e-3) * 100.0,
            run.apiserver_cpu_s,
            run.broker_cpu_s,
            run.simulator_cpu_s,
            run.rss >> 20,
            run.peak_rss >> 20,
            run.messages_per_s,
        );
        let mix: Vec<String> = run.api_requests.iter().map(|(k, r)| format!("{k}={r:.0}/s")).collect();
        println!("module-controller bench: apiserver requests: {}", mix.join(" "));
        runs.push(run);
    }
    if let Some((base, rest)) = runs.split_first() {
        for r in rest {
            println!(
                "module-controller bench: {}x{} vs {}x{} (baseline, same run): rate {:.2}x, controller CPU per pod {:.2}x, \
                 apiserver CPU per pod {:.2}x, peak RSS {:.2}x",
                r.bases,
                r.pods,
                base.bases,
                base.pods,
                r.rate() / base.rate(),
                (r.controller_cpu_s / r.pods as f64) / (base.controller_cpu_s / base.pods as f64).max(1e-9),
                (r.apiserver_cpu_s / r.pods as f64) / (base.apiserver_cpu_s / base.pods as f64).max(1e-9),
                r.peak_rss as f64 / (base.peak_rss as f64).max(1.0),
            );
        }
    }
    Ok(())
}

/// The apiserver's `apiserver_request_total` (watches aside) by `verb resource[/subresource]`.
fn api_requests(metrics: &str) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for line in metrics.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let label = |name: &str| {
            let at = line.find(&format!("{name}=\"")).map(|i| i + name.len() + 2)?;
            line[at..].split('"').next()
        };
        let (Some(verb), Some(resource)) = (label("verb"), label("resource")) else { continue };
        if verb == "WATCH" {
            continue;
        }
        let key = match label("subresource").filter(|s| !s.is_empty()) {
            Some(sub) => format!("{verb} {resource}/{sub}"),
            None => format!("{verb} {resource}"),
        };
        let n: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *out.entry(key).or_insert(0.0) += n;
    }
    out
}

/// The apiserver's /metrics text.
async fn api_metrics(c: &kube::Client) -> String {
    let req = http::Request::get("/metrics").body(Vec::new());
    match req {
        Ok(req) => c.request_text(req).await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Resolves once `n` pods labelled `bench=yes` are Ready, as a watch sees them.
async fn ready_count(pods: Api<Pod>, n: usize) {
    let cfg = kube::runtime::watcher::Config::default().labels("bench=yes");
    let mut stream = kube::runtime::watcher(pods, cfg).boxed();
    let mut ready = std::collections::HashSet::new();
    while let Some(ev) = stream.next().await {
        let Ok(ev) = ev else { continue };
        let (kube::runtime::watcher::Event::Apply(p) | kube::runtime::watcher::Event::InitApply(p)) = ev else {
            continue;
        };
        let is_ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if is_ready {
            ready.insert(p.metadata.name.unwrap_or_default());
        }
        if ready.len() >= n {
            return;
        }
    }
}

async fn module_pods_to_running_at_scale(bases: usize, pods_n: usize) -> Result<Run> {
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
    let sim = start_simulator(&broker, bases, "sim", dir.path(), "10")?;

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
    let (api_pid, broker_pid) = (api.pid().unwrap_or_default(), broker.pid().unwrap_or_default());
    let sim_pid = sim.pid().unwrap_or_default();
    // `MC_BENCH_IDLE_S`: first measure the bases' background load alone for that long.
    let idle = env_usize("MC_BENCH_IDLE_S", 0);
    if idle > 0 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let pids = [pid, api_pid, broker_pid, sim_pid];
        let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_and_rss(*p).unwrap_or_default().0).collect::<Vec<_>>();
        let (c0, a0) = (cpu(&pids), api_requests(&api_metrics(&c).await));
        tokio::time::sleep(Duration::from_secs(idle as u64)).await;
        let (c1, a1) = (cpu(&pids), api_requests(&api_metrics(&c).await));
        let share: Vec<f64> = c0.iter().zip(&c1).map(|(a, b)| (b - a) / idle as f64 * 100.0).collect();
        let mix: Vec<String> = a1
            .iter()
            .map(|(k, n)| (k, (n - a0.get(k).copied().unwrap_or(0.0)) / idle as f64))
            .filter(|(_, r)| *r >= 1.0)
            .map(|(k, r)| format!("{k}={r:.0}/s"))
            .collect();
        println!(
            "module-controller bench: idle with {bases} bases over {idle}s: controller {:.0}% apiserver {:.0}% broker {:.0}% \
             simulator {:.0}% of one core, rss {} MiB; apiserver requests: {}",
            share[0],
            share[1],
            share[2],
            share[3],
            cpu_and_rss(pid).unwrap_or_default().1 >> 20,
            mix.join(" ")
        );
    }
    let (cpu0, _) = cpu_and_rss(pid).unwrap_or_default();
    let (api_cpu0, _) = cpu_and_rss(api_pid).unwrap_or_default();
    let (broker_cpu0, _) = cpu_and_rss(broker_pid).unwrap_or_default();
    let (sim_cpu0, _) = cpu_and_rss(sim_pid).unwrap_or_default();
    let m0 = http_get(metrics_port, "/metrics").unwrap_or_default();
    let a0 = api_requests(&api_metrics(&c).await);
    let msgs = |m: &str| {
        metric_sum(m, "module_controller_tunnel_messages_received_total")
            + metric_sum(m, "module_controller_tunnel_commands_sent_total")
    };
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    // Readiness is counted from a watch started before the first create (a LIST of every pod
    // polled in a loop would load the apiserver more than the controller does at this scale).
    let ready = tokio::spawn(ready_count(pods.clone(), pods_n));
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
    let peak_rss = std::sync::atomic::AtomicU64::new(0);
    let ok = tokio::time::timeout(Duration::from_secs(1800), async {
        let mut ready = std::pin::pin!(ready);
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = &mut ready => break,
                _ = tick.tick() => {
                    if let Some((_, rss)) = cpu_and_rss(pid) {
                        peak_rss.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        }
    })
    .await;
    assert!(ok.is_ok(), "not all {pods_n} module pods reached Running\n{}", mc.log_text());
    let total = start.elapsed();
    let (cpu1, rss) = cpu_and_rss(pid).unwrap_or_default();
    let (api_cpu1, _) = cpu_and_rss(api_pid).unwrap_or_default();
    let (broker_cpu1, _) = cpu_and_rss(broker_pid).unwrap_or_default();
    let (sim_cpu1, _) = cpu_and_rss(sim_pid).unwrap_or_default();
    let m1 = http_get(metrics_port, "/metrics").unwrap_or_default();
    let secs = total.as_secs_f64().max(1e-3);
    let mut api_requests: Vec<(String, f64)> = api_requests(&api_metrics(&c).await)
        .into_iter()
        .map(|(k, n)| {
            let r = (n - a0.get(&k).copied().unwrap_or(0.0)) / secs;
            (k, r)
        })
        .filter(|(_, r)| *r >= 1.0)
        .collect();
    api_requests.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(Run {
        bases,
        pods: pods_n,
        join_s: join.as_secs_f64(),
        created_s: created.as_secs_f64(),
        total_s: secs,
        controller_cpu_s: cpu1 - cpu0,
        apiserver_cpu_s: api_cpu1 - api_cpu0,
        broker_cpu_s: broker_cpu1 - broker_cpu0,
        simulator_cpu_s: sim_cpu1 - sim_cpu0,
        rss,
        peak_rss: peak_rss.load(std::sync::atomic::Ordering::Relaxed).max(rss),
        messages_per_s: (msgs(&m1) - msgs(&m0)) / secs,
        api_requests,
    })
}
