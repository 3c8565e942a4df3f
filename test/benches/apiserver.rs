//! apiserver benchmark: the REST API over each storage backend beside the storage layer
//! beneath it, measured in the same run.
//!
//!     cargo bench -p e2e --bench apiserver                # embedded and etcd
//!     cargo bench -p e2e --bench apiserver -- embedded    # one backend
//!     cargo bench -p e2e --bench apiserver -- memory      # resident set with 500 pods
//!     BENCH_SECONDS=5 BENCH_WATCHERS=1000 BENCH_PODS=10000 cargo bench -p e2e --bench apiserver
//!     BENCH_APISERVER_BIN=/path/to/older/apiserver cargo bench -p e2e --bench apiserver  # before/after
//!
//! Figures: pod creates/s from one keep-alive client (with p50/p99 latency) and from 16,
//! pod status patches/s (a kubelet's condition write), gets/s, a full list of 10,000 pods, and watch delivery latency (create issued → event
//! received) with 1,000 concurrent watchers. The storage layer's create rate with the same
//! concurrency and a stored pod's size is the baseline; the "HTTP floor" rows are the same
//! client call answered by a bare HTTP server, the most any apiserver could do; the "wire
//! bound" composes the two (a request crosses the HTTP hop, then the storage call):
//! `1 / (1/floor + 1/storage)`, the rate of an apiserver that adds no work of its own. `memory`: the apiserver's resident
//! set at start and with 100 and 500 pods.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::bench::{env_or, percentile, seconds};
use e2e::ApiServer;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use storage::Store;

fn pod(name: &str, t: Option<u128>) -> Pod {
    let mut annotations = serde_json::Map::new();
    if let Some(t) = t {
        annotations.insert("bench/t".into(), json!(t.to_string()));
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "bench"}, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "busybox", "command": ["sleep", "3600"]}]}
    }))
    .expect("pod literal")
}

/// Run `op(n)` from `concurrency` tasks for the bench duration: (ops/s, sorted latencies ms).
async fn run<F, Fut>(concurrency: usize, op: F) -> (f64, Vec<f64>)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    e2e::load(concurrency, seconds(), op).await
}

/// Pod creates (named `prefix<n>`) from `concurrency` clients: (creates/s, sorted latencies ms).
async fn creates(pods: &Api<Pod>, concurrency: usize, prefix: String) -> (f64, Vec<f64>) {
    let pods = pods.clone();
    run(concurrency, move |n| {
        let (p, name) = (pods.clone(), format!("{prefix}{n}"));
        async move {
            p.create(&PostParams::default(), &pod(&name, None)).await.expect("create");
        }
    })
    .await
}

/// The storage layer's create rate for values the size of a stored pod; `watched`: while
/// one watcher receives every write, as the apiserver's own watch of its keys (the watch
/// cache) receives every create.
async fn storage_rate(store: Arc<dyn Store>, concurrency: usize, value: Bytes, watched: bool) -> f64 {
    let prefix = format!("/bench/{}/c{concurrency}/", if watched { "watched" } else { "raw" });
    let drain = if watched {
        let from = store.current_revision().await.expect("revision");
        let mut events = store.watch(&prefix, from).await.expect("watch");
        Some(tokio::spawn(async move { while let Some(Ok(_)) = events.next().await {} }))
    } else {
        None
    };
    let rate = run(concurrency, move |n| {
        let (store, value, key) = (store.clone(), value.clone(), format!("{prefix}{n:09}"));
        async move {
            store.create(&key, value).await.expect("storage create");
        }
    })
    .await
    .0;
    if let Some(d) = drain {
        d.abort();
    }
    rate
}

/// The floor under any apiserver on this machine: a bare HTTP server (axum, on its own
/// runtime thread, as another process would be) answering every request with a stored
/// pod's bytes, driven by the same kube client call as the creates. What the apiserver adds
/// on top of this is its own work; what this costs is the protocol's and the client's.
fn http_floor(body: Bytes) -> kube::Client {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let app = axum::Router::new().fallback(move || {
                let body = body.clone();
                async move { (axum::http::StatusCode::CREATED, [("content-type", "application/json")], body) }
            });
            let _ = axum::serve(listener, app).await;
        });
    });
    let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
    kube::Client::try_from(config).expect("client")
}

struct Figures {
    rows: Vec<(String, String, String, String)>,
}

impl Figures {
    fn row(&mut self, what: &str, ours: String, base: String, ratio: String) {
        self.rows.push((what.into(), ours, base, ratio));
    }
    fn print(&self, title: &str) {
        println!("\n{title}");
        println!("  {:<40} {:>22} {:>16} {:>8}", "measure", "apiserver", "storage layer", "ratio");
        for (a, b, c, d) in &self.rows {
            println!("  {a:<40} {b:>22} {c:>16} {d:>8}");
        }
    }
}

async fn bench_backend(server: &ApiServer, store: Arc<dyn Store>) -> Figures {
    let mut f = Figures { rows: Vec::new() };
    let client = server.client().expect("client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // The stored size of a pod, for the storage baseline.
    let sample = pods.create(&PostParams::default(), &pod("size-sample", None)).await.expect("create sample");
    let value = Bytes::from(serde_json::to_vec(&sample).expect("encode"));
    f.row(
        &format!("(baseline: guarded create of {} B)", value.len()),
        String::new(),
        "txn: mod_rev = 0".into(),
        String::new(),
    );

    let floor: Api<Pod> = Api::namespaced(http_floor(value.clone()), "default");
    for concurrency in [1usize, 16] {
        let (rate, lat) = creates(&pods, concurrency, format!("c{concurrency}-")).await;
        let raw = storage_rate(store.clone(), concurrency, value.clone(), false).await;
        f.row(
            &format!("pod creates/s, {concurrency} client(s)"),
            format!("{rate:.0}/s p50 {:.2} p99 {:.2} ms", percentile(&lat, 0.5), percentile(&lat, 0.99)),
            format!("{raw:.0}/s"),
            format!("{:.0}%", rate / raw * 100.0),
        );
        let watched = storage_rate(store.clone(), concurrency, value.clone(), true).await;
        f.row(
            "  (baseline with a watcher on the keys)",
            String::new(),
            format!("{watched:.0}/s"),
            format!("{:.0}%", rate / watched * 100.0),
        );
        let (bare, _) = creates(&floor, concurrency, "f".into()).await;
        f.row(
            &format!("  HTTP floor, {concurrency} client(s)"),
            format!("{bare:.0}/s (ours: {:.0}%)", rate / bare * 100.0),
            format!("{raw:.0}/s"),
            format!("{:.0}%", bare / raw * 100.0),
        );
        // An apiserver doing no work of its own still pays both hops: the client's request
        // (the floor) and the storage call (the baseline), one after the other on one
        // client, and from one CPU budget when the machine is saturated. That is the most
        // any apiserver over this store could create on this machine.
        let wire = 1.0 / (1.0 / bare + 1.0 / raw);
        f.row(
            &format!("  wire bound (floor then store), {concurrency}"),
            format!("{wire:.0}/s (ours: {:.0}%)", rate / wire * 100.0),
            String::new(),
            String::new(),
        );
    }

    // Status writes as a kubelet makes them (a strategic merge patch of a condition), over
    // 100 pods: the update path (read, patch, field ownership, guarded write).
    for concurrency in [1usize, 16] {
        let p = pods.clone();
        let (rate, lat) = run(concurrency, move |n| {
            let p = p.clone();
            async move {
                let status = json!({"status": {"conditions": [
                    {"type": "Ready", "status": "False", "reason": "Bench", "message": format!("write {n}")}]}});
                p.patch_status(&format!("c1-{}", n % 100), &PatchParams::default(), &Patch::Strategic(status))
                    .await
                    .expect("patch status");
            }
        })
        .await;
        f.row(
            &format!("pod status patches/s, {concurrency} client(s)"),
            format!("{rate:.0}/s p50 {:.2} p99 {:.2} ms", percentile(&lat, 0.5), percentile(&lat, 0.99)),
            "-".into(),
            "-".into(),
        );
    }

    for concurrency in [1usize, 16] {
        let p = pods.clone();
        let (rate, lat) = run(concurrency, move |n| {
            let p = p.clone();
            async move {
                p.get(&format!("c1-{}", n % 100)).await.expect("get");
            }
        })
        .await;
        f.row(
            &format!("pod gets/s, {concurrency} client(s)"),
            format!("{rate:.0}/s p99 {:.2} ms", percentile(&lat, 0.99)),
            "-".into(),
            "-".into(),
        );
    }

    // Top up to the list size, then list them all at once and in pages.
    let want: usize = env_or("BENCH_PODS", 10_000);
    let have = pods.list_metadata(&ListParams::default()).await.expect("count").items.len();
    futures::stream::iter(have..want)
        .map(|i| {
            let p = pods.clone();
            async move { p.create(&PostParams::default(), &pod(&format!("fill-{i}"), None)).await.map(|_| ()) }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("fill");
    let t = Instant::now();
    let all = pods.list(&ListParams::default()).await.expect("list");
    let full = t.elapsed().as_secs_f64() * 1000.0;
    let t = Instant::now();
    let mut paged = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = pods.list(&params).await.expect("page");
        paged += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => break,
        }
    }
    let pages = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(paged, all.items.len());
    // The storage layer reading as many pod-sized values.
    futures::stream::iter(0..all.items.len())
        .map(|i| {
            let (store, value) = (store.clone(), value.clone());
            async move { store.create(&format!("/bench/list/{i:09}"), value).await.map(|_| ()) }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("fill storage");
    let t = Instant::now();
    let range = store.range(storage::Range::prefix("/bench/list/")).await.expect("range");
    let raw_list = t.elapsed().as_secs_f64() * 1000.0;
    f.row(
        &format!("list {} pods (one request)", all.items.len()),
        format!("{full:.0} ms"),
        format!("{raw_list:.0} ms ({} keys)", range.kvs.len()),
        format!("{:.0}%", raw_list / full * 100.0),
    );
    f.row(&format!("list {} pods (pages of 500)", paged), format!("{pages:.0} ms"), "-".into(), "-".into());

    // Watch delivery with many concurrent watchers.
    let watchers: usize = env_or("BENCH_WATCHERS", 1000);
    let events: usize = env_or("BENCH_WATCH_EVENTS", 50);
    let base = Instant::now();
    let rv = pods.list_metadata(&ListParams::default().limit(1)).await.expect("rv").metadata.resource_version;
    let rv = rv.unwrap_or_default();
    let mut tasks = Vec::new();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(watchers);
    for w in 0..watchers {
        // One connection per watcher, as separate clients would have.
        let p: Api<Pod> = Api::namespaced(server.client().expect("client"), "default");
        let rv = rv.clone();
        let ready_tx = ready_tx.clone();
        tasks.push(tokio::spawn(async move {
            let params = WatchParams::default().labels("bench-watch=yes").timeout(290);
            let mut stream = match p.watch(&params, &rv).await {
                Ok(s) => s.boxed(),
                Err(e) => panic!("watcher {w}: {e}"),
            };
            let _ = ready_tx.send(()).await;
            let mut lat = Vec::with_capacity(events);
            while lat.len() < events {
                match tokio::time::timeout(Duration::from_secs(60), stream.next()).await {
                    Ok(Some(Ok(WatchEvent::Added(pod)))) => {
                        let t: u128 = pod
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get("bench/t"))
                            .and_then(|t| t.parse().ok())
                            .unwrap_or(0);
                        let sent = base + Duration::from_nanos(t as u64);
                        lat.push(sent.elapsed().as_secs_f64() * 1000.0);
                    }
                    Ok(Some(Ok(_))) => {}
                    other => panic!("watcher {w} after {} events: {other:?}", lat.len()),
                }
            }
            lat
        }));
    }
    drop(ready_tx);
    for _ in 0..watchers {
        ready_rx.recv().await.expect("watcher ready");
    }
    for i in 0..events {
        let mut p = pod(&format!("watched-{i}"), Some(base.elapsed().as_nanos()));
        p.metadata.labels.get_or_insert_with(Default::default).insert("bench-watch".into(), "yes".into());
        pods.create(&PostParams::default(), &p).await.expect("create watched");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("watcher"));
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    f.row(
        &format!("watch delivery, {watchers} watchers"),
        format!("p50 {:.1} ms p99 {:.1} ms", percentile(&lat, 0.5), percentile(&lat, 0.99)),
        "-".into(),
        "-".into(),
    );
    f.row(&format!("  ({} events delivered)", lat.len()), String::new(), String::new(), String::new());
    f
}

fn rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The apiserver's resident set as a cluster uses it: a fresh embedded-store apiserver
/// with a pod watch open (as a kubelet or the scheduler holds one), at start, after 100 and
/// 500 pod creates, and after a full list. The reference MiniK8s peer measured 15 MB with
/// 500 pods on this machine.
async fn bench_memory() {
    let server = ApiServer::start().expect("start apiserver");
    let pid = server.pid().expect("apiserver pid");
    let pods: Api<Pod> = Api::namespaced(server.client().expect("client"), "default");
    let watch = pods.watch(&WatchParams::default(), "0").await.expect("watch pods");
    let drain = tokio::spawn(watch.for_each(|_| async {}));
    let settle = || tokio::time::sleep(Duration::from_millis(500));
    settle().await;
    let mut rows = vec![("start".to_string(), rss_mb(pid))];
    for i in 0..500 {
        pods.create(&PostParams::default(), &pod(&format!("mem-{i:03}"), None)).await.expect("create pod");
        if i + 1 == 100 || i + 1 == 500 {
            settle().await;
            rows.push((format!("{} pods", i + 1), rss_mb(pid)));
        }
    }
    let all = pods.list(&ListParams::default()).await.expect("list pods");
    settle().await;
    rows.push((format!("after a list of {} pods", all.items.len()), rss_mb(pid)));
    drain.abort();
    println!("\napiserver resident memory (embedded store, release build, one pod watch open)");
    for (what, mb) in rows {
        println!("  {what:<40} {mb:>8.1} MB");
    }
    println!("  (the reference MiniK8s peer: 15 MB with 500 pods)");
}

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wants = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));

    // The release apiserver: benchmarks measure what users run. BENCH_APISERVER_BIN
    // benchmarks another build instead (e.g. an older one, for before/after figures).
    e2e::use_release_apiserver();

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    println!("apiserver benchmark: {:?} per rate figure", seconds());

    if wants("memory") {
        rt.block_on(bench_memory());
    }
    if wants("embedded") {
        let server = ApiServer::start().expect("start apiserver");
        let dir = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn Store> =
            Arc::new(storage::embedded::SqliteStore::open(dir.path().join("raw.db")).expect("open store"));
        let f = rt.block_on(bench_backend(&server, store));
        f.print("embedded store (SQLite)");
        println!("  apiserver resident memory now: {:.0} MB", server.pid().map_or(0.0, rss_mb));
    }
    if wants("etcd") {
        let etcd = storage::etcd_test_server::EtcdServer::start().expect("start etcd (Debian etcd-server)");
        let endpoint = etcd.endpoint();
        let server = ApiServer::start_with(&["--etcd-servers", &endpoint]).expect("start apiserver on etcd");
        let f = rt.block_on(async {
            let store: Arc<dyn Store> =
                Arc::new(storage::etcd::EtcdStore::connect(std::slice::from_ref(&endpoint)).await.expect("etcd"));
            bench_backend(&server, store).await
        });
        f.print("etcd");
        println!("  apiserver resident memory now: {:.0} MB", server.pid().map_or(0.0, rss_mb));
    }
}
