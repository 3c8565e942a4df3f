//! kubeproxy benchmark, one command (as root):
//!
//! ```text
//! cargo run --release -p kubeproxy --example kubeproxy_bench [-- SERVICES ENDPOINTS REQUESTS]
//! ```
//!
//! `KUBEPROXY_BENCH_MODES=nftables` (comma-separated; default `iptables,nftables`) limits
//! the rule modes measured.
//!
//! In a network namespace of its own (the host's rules are never touched), with SERVICES
//! Services × ENDPOINTS endpoints (default 10,000 × 5):
//! - iptables and nftables: time to sync everything from scratch, then one endpoint change,
//!   then one Service added, a rolling update of 100 pods behind one Service (CPU and wall
//!   time), then the cleanup;
//! - IPVS: time to compute the operations (this kernel may have no ip_vs to apply them);
//! - requests/s (one TCP connection per request) to a backend through a cluster IP with the
//!   whole rule set loaded, against the same backend reached directly.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kubeproxy::backend::{Backend, Iptables, Nftables};
use kubeproxy::iptables::Config;
use kubeproxy::model::{service_ports, NodeInfo, ServicePort};
use serde_json::json;

const POD_IP: &str = "10.250.0.2";
const TARGET_CIP: &str = "10.96.255.254";
/// The backend answers on these ports: the direct measurement and each mode's target
/// Service use their own, so that no measurement's connections (the backend's TIME_WAIT
/// sockets, conntrack entries) collide with the next one's, which made a measurement taken
/// right after another several times slower.
const BACKEND_PORTS: [u16; 3] = [8080, 8081, 8082];

fn sh(cmd: &str) -> anyhow::Result<()> {
    let st = Command::new("sh").args(["-c", cmd]).status()?;
    anyhow::ensure!(st.success(), "`{cmd}` failed");
    Ok(())
}

/// `n` Services of `eps` endpoints (the last one's first endpoint moved by `generation`), plus
/// `added` more, plus the target Service (its backend on `target_port`).
fn objects(
    n: usize,
    eps: usize,
    generation: u32,
    added: usize,
    target_port: u16,
) -> (Vec<Service>, Vec<EndpointSlice>) {
    let mut svcs = Vec::with_capacity(n + added + 1);
    let mut slices = Vec::with_capacity(n + added + 1);
    for j in 0..added {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 97, 0, 10)) + j as u32);
        svcs.push(
            serde_json::from_value(json!({"metadata": {"name": format!("new-{j}"), "namespace": "bench"},
                "spec": {"clusterIP": ip.to_string(), "ports": [{"name": "http", "port": 80}]}}))
            .expect("static json"),
        );
        let addrs: Vec<_> = (0..eps)
            .map(|e| json!({"addresses": [Ipv4Addr::new(10, 127, j as u8, e as u8).to_string()], "conditions": {"ready": true}}))
            .collect();
        slices.push(
            serde_json::from_value(json!({"metadata": {"name": format!("new-{j}-x"), "namespace": "bench",
                    "labels": {"kubernetes.io/service-name": format!("new-{j}")}},
                "addressType": "IPv4", "endpoints": addrs, "ports": [{"name": "http", "port": 8080}]}))
            .expect("static json"),
        );
    }
    for i in 0..n {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 10)) + i as u32);
        svcs.push(
            // The first 2,700 are NodePort services (the node port range has room for that many).
            serde_json::from_value(
                json!({"metadata": {"name": format!("svc-{i}"), "namespace": "bench", "resourceVersion": "1"},
                "spec": {"type": if i < 2700 { "NodePort" } else { "ClusterIP" }, "clusterIP": ip.to_string(),
                         "ports": [{"name": "http", "port": 80, "nodePort": 30000 + i.min(2699)}]}}),
            )
            .expect("static json"),
        );
        let addrs: Vec<_> = (0..eps)
            .map(|e| {
                // The last service's first endpoint changes with `generation`.
                let bump = if i == n - 1 && e == 0 { generation } else { 0 };
                let ip =
                    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (i * eps + e) as u32 + bump * 1_000_000);
                json!({"addresses": [ip.to_string()], "conditions": {"ready": true}})
            })
            .collect();
        slices.push(
            serde_json::from_value(json!({"metadata": {"name": format!("svc-{i}-x"), "namespace": "bench",
                    "resourceVersion": if i == n - 1 { (1 + generation).to_string() } else { "1".to_string() },
                    "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
                "addressType": "IPv4", "endpoints": addrs, "ports": [{"name": "http", "port": 8080}]}))
            .expect("static json"),
        );
    }
    // The service the request benchmark goes through, listed last in KUBE-SERVICES order terms.
    svcs.push(
        serde_json::from_value(json!({"metadata": {"name": "zz-target", "namespace": "bench"},
            "spec": {"clusterIP": TARGET_CIP, "ports": [{"name": "http", "port": 80}]}}))
        .expect("static json"),
    );
    slices.push(
        serde_json::from_value(json!({"metadata": {"name": "zz-target-x", "namespace": "bench",
                "labels": {"kubernetes.io/service-name": "zz-target"}},
            "addressType": "IPv4", "endpoints": [{"addresses": [POD_IP]}], "ports": [{"name": "http", "port": target_port}]}))
        .expect("static json"),
    );
    (svcs, slices)
}

fn ports(n: usize, eps: usize, generation: u32, added: usize, target_port: u16) -> (Vec<Arc<ServicePort>>, Duration) {
    let (s, e) = objects(n, eps, generation, added, target_port);
    let t = Instant::now();
    let p = service_ports(&s, &e, &NodeInfo::named("bench"));
    (p.into_iter().map(Arc::new).collect(), t.elapsed())
}

/// A tiny HTTP server: one response per connection.
fn serve() -> anyhow::Result<()> {
    let mut listeners: Vec<TcpListener> =
        BACKEND_PORTS.iter().map(|p| TcpListener::bind(("0.0.0.0", *p))).collect::<Result<_, _>>()?;
    let last = listeners.pop().expect("ports");
    for l in listeners {
        std::thread::spawn(move || accept(l));
    }
    accept(last);
    Ok(())
}

fn accept(l: TcpListener) {
    for c in l.incoming() {
        let Ok(mut c) = c else { continue };
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf);
            let _ = c.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok");
        });
    }
}

/// Requests/s with `threads` clients, one connection per request, for `n` requests in total.
fn load(addr: &str, n: usize, threads: usize) -> f64 {
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let addr = addr.to_string();
            std::thread::spawn(move || {
                let mut ok = 0;
                for _ in 0..n / threads {
                    if let Ok(mut s) = TcpStream::connect(&addr) {
                        let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n");
                        let mut b = Vec::new();
                        if s.read_to_end(&mut b).is_ok() && b.ends_with(b"ok") {
                            ok += 1;
                        }
                    }
                }
                ok
            })
        })
        .collect();
    let ok: usize = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    assert!(ok * 100 >= n * 99, "{addr}: only {ok}/{n} requests succeeded");
    ok as f64 / start.elapsed().as_secs_f64()
}

/// CPU seconds (user + system) of this process and its finished children so far.
fn cpu_seconds() -> f64 {
    let secs = |who| {
        // SAFETY: getrusage fills the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut u) };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(u.ru_utime) + tv(u.ru_stime)
    };
    secs(libc::RUSAGE_SELF) + secs(libc::RUSAGE_CHILDREN)
}

/// A rolling update of 100 pods behind one Service (one of the `n`), as the proxy sees it:
/// each step a new endpoint becomes ready, then an old one goes (maxSurge 1,
/// maxUnavailable 0): 200 syncs. The proxy's CPU (kernel time included) and wall time.
fn rollout(backend: &mut dyn Backend, mut ports: Vec<Arc<ServicePort>>, n: usize) -> anyhow::Result<String> {
    let name = format!("svc-{}", n / 2);
    let i = ports.iter().position(|p| p.name.name == name).ok_or_else(|| anyhow::anyhow!("no {name}"))?;
    let ep = |k: u32| kubeproxy::model::Endpoint {
        ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 200, 0, 0)) + k),
        port: 8080,
        ready: true,
        serving: true,
        terminating: false,
        local: false,
    };
    let set = |ports: &mut Vec<Arc<ServicePort>>, eps: Vec<kubeproxy::model::Endpoint>| {
        let p = Arc::make_mut(&mut ports[i]);
        p.all_endpoints = eps.clone();
        p.cluster_endpoints = eps;
        p.has_any_endpoint = true;
    };
    let mut eps: Vec<_> = (0..100).map(ep).collect();
    set(&mut ports, eps.clone());
    backend.sync(&ports)?;
    let (cpu, t) = (cpu_seconds(), Instant::now());
    for k in 0..100u32 {
        eps.push(ep(1000 + k));
        set(&mut ports, eps.clone());
        backend.sync(&ports)?;
        eps.remove(0);
        set(&mut ports, eps.clone());
        backend.sync(&ports)?;
    }
    let (cpu, wall) = (cpu_seconds() - cpu, t.elapsed());
    Ok(format!(
        "rollout of 100 pods behind one Service (200 syncs): {wall:.2?} wall, {cpu:.2} s CPU ({:.1} ms per sync)",
        cpu * 1000.0 / 200.0
    ))
}

fn bench_mode(
    name: &str,
    mut backend: Box<dyn Backend>,
    n: usize,
    eps: usize,
    requests: usize,
    direct: f64,
    target_port: u16,
) -> anyhow::Result<()> {
    // As the proxy does it: the model from its cache (Services computed again only when
    // they changed), then the backend; "one endpoint change" is both together.
    let mut cache = kubeproxy::model::PortCache::default();
    let node = NodeInfo::named("bench");
    let (s0, e0) = objects(n, eps, 0, 0, target_port);
    let t = Instant::now();
    let p0 = cache.ports(&s0, &e0, &node);
    let compute = t.elapsed();
    let t = Instant::now();
    let stats = backend.sync(&p0)?;
    let full = t.elapsed();
    let (s1, e1) = objects(n, eps, 1, 0, target_port);
    let t = Instant::now();
    let p1 = cache.ports(&s1, &e1, &node);
    let stats1 = backend.sync(&p1)?;
    let one = t.elapsed();
    let (s2, e2) = objects(n, eps, 1, 1, target_port);
    let t = Instant::now();
    let p2 = cache.ports(&s2, &e2, &node);
    let stats2 = backend.sync(&p2)?;
    let added = t.elapsed();
    let rollout = rollout(backend.as_mut(), p2.clone(), n)?;
    let rps = load(&format!("{TARGET_CIP}:80"), requests, 4);
    println!("{name:9} {rollout}");
    println!(
        "{name:9} from scratch: {:>8.2?} ({} rules, {} KiB input; model {:.2?})   one endpoint change (model + rules): {:>8.2?} ({} bytes, {:.2?} applying)   one service added: {:>8.2?} ({} bytes)   via cluster IP: {rps:>7.0} req/s = {:.2}x direct",
        full,
        stats.rules,
        stats.bytes / 1024,
        compute,
        one,
        stats1.bytes,
        stats1.apply,
        added,
        stats2.bytes,
        rps / direct
    );
    Ok(())
}

fn inner(n: usize, eps: usize, requests: usize) -> anyhow::Result<()> {
    // The backend "pod": a namespace routed from this one.
    let pod = format!("kpbenchpod{}", std::process::id());
    sh(&format!(
        "set -e; ip link set lo up; ip link add eth0 type veth peer name eth0p; ip link set eth0p up; \
         ip addr add 192.168.200.1/24 dev eth0; ip link set eth0 up; ip route add default dev eth0; \
         ip netns add {pod}; ip link add kv0 type veth peer name eth0 netns {pod}; \
         ip addr add 10.250.0.1/32 dev kv0; ip link set kv0 up; ip route add {POD_IP}/32 dev kv0; \
         ip -n {pod} link set lo up; ip -n {pod} addr add {POD_IP}/32 dev eth0; ip -n {pod} link set eth0 up; \
         ip -n {pod} route add 10.250.0.1/32 dev eth0; ip -n {pod} route add default via 10.250.0.1; \
         sysctl -qw net.ipv4.ip_forward=1"
    ))?;
    let exe = std::env::current_exe()?;
    let mut server = Command::new("ip").args(["netns", "exec", &pod]).arg(&exe).arg("--serve").spawn()?;
    let result = (|| -> anyhow::Result<()> {
        for _ in 0..100 {
            if TcpStream::connect(format!("{POD_IP}:{}", BACKEND_PORTS[0])).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        println!(
            "{n} services x {eps} endpoints (+1 target service), {requests} requests per measurement, 4 client threads"
        );
        let direct = load(&format!("{POD_IP}:{}", BACKEND_PORTS[0]), requests, 4);
        println!("direct to the backend: {direct:.0} req/s");
        let cfg = Config { cluster_cidr: Some("10.128.0.0/9".into()), ..Default::default() };
        {
            // Where an nftables sync's own time goes (pure functions, no kernel).
            let (p0, _) = ports(n, eps, 0, 0, BACKEND_PORTS[1]);
            let (p1, _) = ports(n, eps, 1, 0, BACKEND_PORTS[1]);
            // The proxy's model cache: from scratch, then one changed EndpointSlice.
            let (s0, e0) = objects(n, eps, 0, 0, BACKEND_PORTS[1]);
            let (s1, e1) = objects(n, eps, 1, 0, BACKEND_PORTS[1]);
            let mut cache = kubeproxy::model::PortCache::default();
            let node = NodeInfo::named("bench");
            let t = Instant::now();
            cache.ports(&s0, &e0, &node);
            let scratch = t.elapsed();
            let t = Instant::now();
            let cached = cache.ports(&s1, &e1, &node);
            let model_one = t.elapsed();
            assert_eq!(cached, p1, "the cache agrees with service_ports");
            // Baseline, what the proxy did before the cache: copy every object out of the
            // reflector stores, then compute every Service.
            let stores = (
                s1.iter().map(|s| std::sync::Arc::new(s.clone())).collect::<Vec<_>>(),
                e1.iter().map(|e| std::sync::Arc::new(e.clone())).collect::<Vec<_>>(),
            );
            let t = Instant::now();
            let copied: (Vec<Service>, Vec<EndpointSlice>) =
                (stores.0.iter().map(|s| (**s).clone()).collect(), stores.1.iter().map(|e| (**e).clone()).collect());
            let all = service_ports(&copied.0, &copied.1, &node);
            let baseline = t.elapsed();
            assert!(all.iter().eq(p1.iter().map(|p| &**p)));
            let t = Instant::now();
            cache.ports(&stores.0, &stores.1, &node);
            let from_stores = t.elapsed();
            println!(
                "model     from scratch: {scratch:.2?}; one endpoint change: cached {model_one:.2?}, from the stores' Arcs {from_stores:.2?} vs copy + service_ports {baseline:.2?} (baseline) = {:.2}x",
                from_stores.as_secs_f64() / baseline.as_secs_f64()
            );
            let mut table = kubeproxy::nftables::Table::default();
            let t = Instant::now();
            let full = table.sync(&p0, &cfg).map_or(0, |tx| tx.ops.len());
            let from_scratch = t.elapsed();
            let t = Instant::now();
            let tx = table.sync(&p1, &cfg);
            let one = t.elapsed();
            let netlink = tx.as_ref().and_then(|tx| kubeproxy::nft_netlink::encode(&tx.ops)).map_or(0, |b| b.len());
            println!(
                "nftables  changes computed from scratch: {from_scratch:.2?} ({full} operations); for one endpoint change: {one:.2?} ({} operations, {netlink} bytes of netlink)",
                tx.map_or(0, |tx| tx.ops.len())
            );
        }
        {
            // Where an iptables sync's own time goes: the partial sync against rendering and
            // comparing everything (what the proxy did before, the baseline).
            let (p0, _) = ports(n, eps, 0, 0, BACKEND_PORTS[1]);
            let (p1, _) = ports(n, eps, 1, 0, BACKEND_PORTS[1]);
            let mut table = kubeproxy::iptables::Table::over(Default::default());
            let t = Instant::now();
            let full = table.sync(&p0, &cfg).map_or(0, |s| s.len());
            let from_scratch = t.elapsed();
            let t = Instant::now();
            let partial = table.sync(&p1, &cfg).map_or(0, |s| s.len());
            let one = t.elapsed();
            let r0 = kubeproxy::iptables::render(&p0, &cfg);
            let t = Instant::now();
            let r1 = kubeproxy::iptables::render(&p1, &cfg);
            let whole = kubeproxy::iptables::restore_input(&r0, &r1).map_or(0, |s| s.len());
            let baseline = t.elapsed();
            println!(
                "iptables  restore input from scratch: {from_scratch:.2?} ({full} bytes); for one endpoint change: partial {one:.2?} ({partial} bytes) vs render everything + compare {baseline:.2?} ({whole} bytes, baseline) = {:.3}x",
                one.as_secs_f64() / baseline.as_secs_f64()
            );
        }
        let modes = std::env::var("KUBEPROXY_BENCH_MODES").unwrap_or_else(|_| "iptables,nftables".into());
        if modes.split(',').any(|m| m == "iptables") {
            bench_mode("iptables", Box::new(Iptables::new(cfg.clone())), n, eps, requests, direct, BACKEND_PORTS[1])?;
            let t = Instant::now();
            Iptables::cleanup()?;
            println!("iptables  cleanup: {:.2?}", t.elapsed());
        }
        if modes.split(',').any(|m| m == "nftables") {
            bench_mode("nftables", Box::new(Nftables::new(cfg)), n, eps, requests, direct, BACKEND_PORTS[2])?;
            let t = Instant::now();
            Nftables::cleanup()?;
            println!("nftables  cleanup: {:.2?}", t.elapsed());
        }
        // IPVS: operations only.
        let (p0, _) = ports(n, eps, 0, 0, BACKEND_PORTS[1]);
        let (p1, _) = ports(n, eps, 1, 0, BACKEND_PORTS[1]);
        let node_ips = ["192.168.200.1".parse()?];
        let t = Instant::now();
        let s0 = kubeproxy::ipvs::desired(&p0, &node_ips, "rr");
        let ops0 = kubeproxy::ipvs::diff(&Default::default(), &s0);
        let full = t.elapsed();
        let t = Instant::now();
        let s1 = kubeproxy::ipvs::desired(&p1, &node_ips, "rr");
        let ops1 = kubeproxy::ipvs::diff(&s0, &s1);
        let one = t.elapsed();
        println!("ipvs      from scratch: {full:>8.2?} ({} operations, computed only)   one endpoint change: {one:>8.2?} ({} operations)", ops0.len(), ops1.len());
        Ok(())
    })();
    let _ = server.kill();
    let _ = server.wait();
    let _ = sh(&format!("ip netns del {pod}"));
    result
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--serve") {
        return serve();
    }
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (n, eps, requests) = (num(1, 10_000), num(2, 5), num(3, 4_000));
    if std::env::var("KP_BENCH_INNER").is_ok() {
        return inner(n, eps, requests);
    }
    let ns = format!("kpbench{}", std::process::id());
    sh(&format!("ip netns add {ns}"))?;
    let st = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe()?)
        .args([n.to_string(), eps.to_string(), requests.to_string()])
        .env("KP_BENCH_INNER", "1")
        .status();
    let _ = sh(&format!("ip netns del {ns}"));
    anyhow::ensure!(st?.success(), "benchmark failed");
    Ok(())
}
