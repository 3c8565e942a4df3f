//! High-availability benchmark: what a second apiserver adds, and how long clients wait when
//! one dies.
//!
//!     cargo bench -p e2e --bench high_availability
//!     BENCH_SECONDS=5 BENCH_KILLS=20 BENCH_CLIENTS=16 cargo bench -p e2e --bench high_availability
//!
//! Over one 3-member etcd cluster on loopback (Debian's etcd), in the same run:
//! - pod creates/s from 2 and from 16 keep-alive clients through one apiserver, then with the
//!   clients split over two apiservers, beside the raw guarded create on the same etcd cluster
//!   (the storage layer: what any number of apiservers share);
//! - failover: BENCH_CLIENTS clients (default 8) read through `minik8s-supervisor
//!   apiserver-lb` (the balancer of `scripts/cluster up --ha`) in a loop while the
//!   apiservers are SIGKILLed in turn (BENCH_KILLS times, default 10) and started again: the
//!   time from each kill until every client has been answered again, and until each one has.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::bench::{env_or, percentile, seconds};
use e2e::ApiServer;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use storage::Store;

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "app", "image": "busybox", "command": ["sleep", "3600"]}]}
    }))
    .expect("pod literal")
}

fn client(url: &str) -> kube::Client {
    let mut config = kube::Config::new(url.parse().expect("url"));
    config.read_timeout = Some(Duration::from_secs(2));
    config.connect_timeout = Some(Duration::from_secs(2));
    kube::Client::try_from(config).expect("client")
}

/// Pod creates from `concurrency` clients, client i through `servers[i % len]`, each with a
/// connection of its own: (creates/s, sorted latencies ms).
async fn creates(servers: &[&ApiServer], concurrency: usize, prefix: &str) -> (f64, Vec<f64>) {
    let apis: Arc<Vec<Api<Pod>>> = Arc::new(
        (0..concurrency).map(|i| Api::namespaced(client(&servers[i % servers.len()].url()), "default")).collect(),
    );
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let prefix = prefix.to_string();
    e2e::load(concurrency, seconds(), move |n| {
        let (apis, prefix) = (apis.clone(), prefix.clone());
        // Each task takes the next client once per operation: a round robin over the clients.
        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % apis.len();
        async move {
            apis[i].create(&PostParams::default(), &pod(&format!("{prefix}{n}"))).await.expect("create");
        }
    })
    .await
}

/// The storage layer's guarded create (create-if-absent) on the same etcd cluster.
async fn raw_rate(store: Arc<dyn Store>, concurrency: usize, value: Bytes) -> f64 {
    let prefix = format!("/bench/raw/c{concurrency}/");
    e2e::load(concurrency, seconds(), move |n| {
        let (store, value, key) = (store.clone(), value.clone(), format!("{prefix}{n:09}"));
        async move {
            store.create(&key, value).await.expect("storage create");
        }
    })
    .await
    .0
}

/// Kill the apiservers in turn under reading clients behind the balancer: per kill, the
/// time until every client was answered again, and each client's own wait (ms).
async fn failover(servers: &mut [ApiServer], lb_url: &str, clients: usize, kills: usize) -> (Vec<f64>, Vec<f64>) {
    let last_ok: Arc<Vec<Mutex<Instant>>> = Arc::new((0..clients).map(|_| Mutex::new(Instant::now())).collect());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (last_ok, stop, api) = (last_ok.clone(), stop.clone(), Api::<Namespace>::all(client(lb_url)));
        tasks.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if api.get("default").await.is_ok() {
                    *last_ok[i].lock().expect("lock") = Instant::now();
                } else {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }));
    }
    let (mut all, mut each) = (Vec::new(), Vec::new());
    for k in 0..kills {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let victim = &mut servers[k % 2];
        let killed = Instant::now();
        victim.stop();
        let deadline = killed + Duration::from_secs(30);
        let mut waits = vec![None; clients];
        while waits.iter().any(Option::is_none) && Instant::now() < deadline {
            for (i, w) in waits.iter_mut().enumerate() {
                let t = *last_ok[i].lock().expect("lock");
                if w.is_none() && t > killed {
                    *w = Some((t - killed).as_secs_f64() * 1000.0);
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let waits: Vec<f64> = waits.into_iter().map(|w| w.unwrap_or(30_000.0)).collect();
        all.push(waits.iter().copied().fold(0.0, f64::max));
        each.extend(waits);
        tokio::task::block_in_place(|| victim.restart()).expect("restart apiserver");
        // The balancer's checker dials every backend each second: let it see this one again.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    all.sort_by(|a, b| a.total_cmp(b));
    each.sort_by(|a, b| a.total_cmp(b));
    (all, each)
}

fn main() {
    e2e::use_release_apiserver();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    println!("high-availability benchmark: {:?} per rate figure", seconds());
    let etcd = storage::etcd_test_server::EtcdServer::start_cluster(3).expect("a 3-member etcd (Debian etcd-server)");
    let endpoints: Vec<String> = etcd.iter().map(|m| m.endpoint()).collect();
    let joined = endpoints.join(",");
    let mut servers = [
        ApiServer::start_with(&["--etcd-servers", &joined]).expect("apiserver A"),
        ApiServer::start_with(&["--etcd-servers", &joined]).expect("apiserver B"),
    ];
    let value = Bytes::from(serde_json::to_vec(&pod("a-stored-pod-of-typical-size")).expect("json"));

    println!("\npod creates/s over a 3-member etcd cluster");
    println!(
        "  {:<12} {:>16} {:>16} {:>8} {:>16} {:>10}",
        "clients", "1 apiserver", "2 apiservers", "2 vs 1", "raw etcd", "1 vs raw"
    );
    for concurrency in [2, 16] {
        let (one, lat1) = rt.block_on(creates(&[&servers[0]], concurrency, &format!("one-{concurrency}-")));
        let (two, _) = rt.block_on(creates(&[&servers[0], &servers[1]], concurrency, &format!("two-{concurrency}-")));
        let raw = rt.block_on(async {
            let store: Arc<dyn Store> = Arc::new(storage::etcd::EtcdStore::connect(&endpoints).await.expect("etcd"));
            raw_rate(store, concurrency, value.clone()).await
        });
        println!(
            "  {:<12} {:>16} {:>16} {:>7.2}× {:>16} {:>9.0}%",
            concurrency,
            format!("{one:.0} (p99 {:.1} ms)", percentile(&lat1, 0.99)),
            format!("{two:.0}"),
            two / one,
            format!("{raw:.0}"),
            one / raw * 100.0
        );
    }

    let lb_port = e2e::free_port();
    let lb_url = format!("http://127.0.0.1:{lb_port}");
    let mut lb = std::process::Command::new(e2e::supervisor_bin())
        .args(["apiserver-lb", "--listen", &format!("127.0.0.1:{lb_port}")])
        .args(servers.iter().flat_map(|s| ["--backend".to_string(), format!("127.0.0.1:{}", s.port)]))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("minik8s-supervisor apiserver-lb");
    let ready = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", lb_port)).is_err() && Instant::now() < ready {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (clients, kills) = (env_or("BENCH_CLIENTS", 8usize), env_or("BENCH_KILLS", 10usize));
    let (all, each) = rt.block_on(failover(&mut servers, &lb_url, clients, kills));
    let _ = lb.kill();
    let _ = lb.wait();
    println!(
        "\nfailover: {clients} clients reading through the balancer, {kills} apiserver kills (SIGKILL, then restart)"
    );
    println!(
        "  until every client was answered again: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.last().copied().unwrap_or(0.0)
    );
    println!(
        "  each client's own wait:                p50 {:.1} ms, p99 {:.1} ms",
        percentile(&each, 0.5),
        percentile(&each, 0.99)
    );
}
