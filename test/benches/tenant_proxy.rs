//! What the tenant proxy costs: the same requests straight to the apiserver (the baseline,
//! measured in the same run) and through `tenant-proxy` as a tenant's administrator.
//!
//!     cargo bench -p e2e --bench tenant_proxy
//!     BENCH_SECONDS=5 BENCH_WATCHES=1000 cargo bench -p e2e --bench tenant_proxy
//!
//! Release builds of both; both over TLS with client certificates, the apiserver as the
//! cluster admin, the proxy as tenant `acme`'s (no impersonation). Figures:
//! - get of one ConfigMap, list of a namespace's 100 ConfigMaps, create: requests/s and
//!   p50/p99 latency with 1 and 16 concurrent clients, the ratio and p50 difference, and the
//!   CPU time the apiserver and the proxy spend per proxied request (on a 2-core machine the
//!   rate ratio is mostly the proxy's CPU taken from the apiserver and the client);
//! - watch delivery: one watch each way on the same namespace, 200 creates; p50/p99 from
//!   sending the create to the event's arrival;
//! - memory: the resident set of the proxy and of the apiserver before and after
//!   BENCH_WATCHES (default 1,000) open watches of a tenant (each on its own connection, on a
//!   quiet namespace), per 1,000: what the proxy adds beside what the apiserver holds.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::tenancy::TenantProxy;
use e2e::ApiServer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

fn seconds() -> Duration {
    Duration::from_secs_f64(std::env::var("BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3.0))
}

async fn client_of(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

fn pct(lat: &[f64], p: f64) -> f64 {
    if lat.is_empty() {
        return f64::NAN;
    }
    lat[((lat.len() as f64 - 1.0) * p).round() as usize]
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn configmap(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v".repeat(200)}})).unwrap_or_default()
}

/// The processes whose CPU time a phase reports: the apiserver's and the proxy's.
#[derive(Clone, Copy)]
struct Pids {
    api: u32,
    proxy: u32,
}

fn cpu(pid: u32) -> f64 {
    e2e::cpu_seconds(pid).unwrap_or(0.0)
}

async fn measure(what: &str, clients: usize, pids: Pids, direct: Api<ConfigMap>, proxied: Api<ConfigMap>) {
    let run = |api: Api<ConfigMap>, tag: &'static str| {
        let what = what.to_string();
        async move {
            let api = Arc::new(api);
            e2e::load(clients, seconds(), move |n| {
                let api = api.clone();
                let what = what.clone();
                async move {
                    let r = match what.as_str() {
                        "get" => api.get("cm-0").await.map(|_| ()),
                        "list" => api.list(&ListParams::default()).await.map(|_| ()),
                        _ => api
                            .create(&PostParams::default(), &configmap(&format!("{tag}{clients}-{n}")))
                            .await
                            .map(|_| ()),
                    };
                    if let Err(e) = r {
                        eprintln!("{what}: {e}");
                    }
                }
            })
            .await
        }
    };
    let (d_rate, d_lat) = run(direct, "d").await;
    let (api0, proxy0) = (cpu(pids.api), cpu(pids.proxy));
    let (p_rate, p_lat) = run(proxied, "p").await;
    let n = p_lat.len().max(1) as f64;
    let (api_us, proxy_us) = ((cpu(pids.api) - api0) / n * 1e6, (cpu(pids.proxy) - proxy0) / n * 1e6);
    println!(
        "{what:<6} x{clients:<2}  direct {d_rate:>7.0}/s p50 {:>6.2} ms p99 {:>6.2} ms | proxy {p_rate:>7.0}/s p50 {:>6.2} ms p99 {:>6.2} ms | rate {:>4.0}%  p50 +{:.2} ms | CPU per request through the proxy: apiserver {api_us:.0} us, proxy {proxy_us:.0} us",
        pct(&d_lat, 0.5),
        pct(&d_lat, 0.99),
        pct(&p_lat, 0.5),
        pct(&p_lat, 0.99),
        100.0 * p_rate / d_rate,
        pct(&p_lat, 0.5) - pct(&d_lat, 0.5),
    );
}

/// Arrival times of the first `n` ADDED events of a watch from `rv` (no initial events).
fn watch_arrivals(api: Api<ConfigMap>, rv: String, n: usize) -> tokio::task::JoinHandle<Vec<(String, Instant)>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        let Ok(stream) = api.watch(&WatchParams::default().timeout(120), &rv).await else { return out };
        let mut stream = stream.boxed();
        while let Some(ev) = stream.next().await {
            if let Ok(WatchEvent::Added(cm)) = ev {
                if let Some(name) = cm.metadata.name.filter(|n| n.starts_with("w-")) {
                    out.push((name, Instant::now()));
                    if out.len() == n {
                        break;
                    }
                }
            }
        }
        out
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    e2e::use_release_apiserver();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if std::env::var("MINIK8S_TENANT_PROXY_BIN").is_err() {
        let ok = e2e::cargo_command()
            .args(["build", "-q", "--release", "-p", "tenant-proxy"])
            .current_dir(&root)
            .status()?
            .success();
        anyhow::ensure!(ok, "building the release tenant-proxy failed");
    }
    let bin = std::env::var("MINIK8S_TENANT_PROXY_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| e2e::target_dir().join("release/tenant-proxy"));
    let api = ApiServer::start_tls(&[], &[])?;
    let proxy = TenantProxy::start_bin(&api, &bin)?;
    proxy.add_tenant("acme")?;
    let direct = client_of(&api.identity("admin.conf")).await?;
    let tenant = client_of(&proxy.kubeconfig("acme", "admin", "system:masters")?).await?;
    let d_api: Api<ConfigMap> = Api::namespaced(direct.clone(), "acme-default");
    let p_api: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    // The tenant's first request makes its namespaces.
    p_api.list(&ListParams::default().limit(1)).await.context("the tenant's first request")?;
    let list_ns_d: Api<ConfigMap> = Api::namespaced(direct.clone(), "acme-kube-public");
    let list_ns_p: Api<ConfigMap> = Api::namespaced(tenant.clone(), "kube-public");
    for i in 0..100 {
        list_ns_d.create(&PostParams::default(), &configmap(&format!("cm-{i}"))).await?;
    }
    d_api.create(&PostParams::default(), &configmap("cm-0")).await?;

    println!("tenant-proxy vs the apiserver directly (same run, release builds, TLS both ways)");
    let pids = Pids { api: api.pid().context("the apiserver's pid")?, proxy: proxy.pid().context("the proxy's pid")? };
    for clients in [1, 16] {
        measure("get", clients, pids, d_api.clone(), p_api.clone()).await;
        measure("list", clients, pids, list_ns_d.clone(), list_ns_p.clone()).await;
        measure("create", clients, pids, d_api.clone(), p_api.clone()).await;
    }

    // Watch delivery: both watches on acme-default, creates straight to the apiserver.
    let wn = 200;
    let rv = d_api.list(&ListParams::default().limit(1)).await?.metadata.resource_version.unwrap_or_default();
    let w_d = watch_arrivals(Api::namespaced(direct.clone(), "acme-default"), rv.clone(), wn);
    let w_p = watch_arrivals(Api::namespaced(tenant.clone(), "default"), rv, wn);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut created = std::collections::HashMap::new();
    for i in 0..wn {
        let name = format!("w-{i}");
        // From the moment the create is sent: the event may arrive before its answer.
        created.insert(name.clone(), Instant::now());
        d_api.create(&PostParams::default(), &configmap(&name)).await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let delays = |arrivals: Vec<(String, Instant)>| {
        let mut v: Vec<f64> = arrivals
            .iter()
            .filter_map(|(n, t)| created.get(n).map(|c| t.saturating_duration_since(*c).as_secs_f64() * 1000.0))
            .collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    };
    let (d, p) = (delays(w_d.await?), delays(w_p.await?));
    println!(
        "watch delivery ({} / {} events)  direct p50 {:.2} ms p99 {:.2} ms | proxy p50 {:.2} ms p99 {:.2} ms",
        d.len(),
        p.len(),
        pct(&d, 0.5),
        pct(&d, 0.99),
        pct(&p, 0.5),
        pct(&p, 0.99)
    );

    // Memory per 1,000 open tenant watches.
    let watches: usize = std::env::var("BENCH_WATCHES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let pid = proxy.pid().context("the proxy's pid")?;
    let api_pid = api.pid().context("the apiserver's pid")?;
    // Both return freed heap to the system every 10 s: let the creates' garbage go first.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let (before, api_before) = (rss_kib(pid), rss_kib(api_pid));
    let mut open = Vec::new();
    let kubeconfig = proxy.kubeconfig("acme", "admin", "system:masters")?;
    for _ in 0..watches {
        // One client each: a watch holds its connection.
        let c = client_of(&kubeconfig).await?;
        let api: Api<ConfigMap> = Api::namespaced(c, "kube-node-lease");
        let stream = api.watch(&WatchParams::default().timeout(300), "0").await?;
        open.push(stream.boxed());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (after, api_after) = (rss_kib(pid), rss_kib(api_pid));
    let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / 1024.0 * 1000.0 / watches as f64;
    println!(
        "memory with {watches} tenant watches: proxy RSS {:.1} -> {:.1} MiB ({:.1} MiB per 1,000); the apiserver's {:.1} -> {:.1} MiB ({:.1} MiB per 1,000)",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        per(after, before),
        api_before as f64 / 1024.0,
        api_after as f64 / 1024.0,
        per(api_after, api_before),
    );
    drop(open);
    Ok(())
}
