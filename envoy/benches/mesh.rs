//! What a meshed HTTP call costs: latency, throughput and the sidecars' CPU and memory.
//!
//! Run: `cargo bench -p envoy --bench mesh` (as root; needs `ip` and `iptables-restore`,
//! otherwise it prints SKIPPED and exits). `ENVOY_BIN=<path>` measures another build of the
//! sidecar; by default it is the binary `cargo bench` builds (release profile).
//!
//! The setup, built fresh for each run and torn down at the end (also on a panic):
//!
//! ```text
//!  netns meshbench-client (10.250.0.1)          netns meshbench-server (10.250.0.2)
//!  load generator ──┐                           ┌──> HTTP server :9080 (fixed 100-byte body)
//!                   │ capture → :15001          │ capture → :15006
//!                   v                           │
//!  envoy sidecar (uid 1337) ── veth-c ═══ veth-s ──> envoy sidecar (uid 1337)
//! ```
//!
//! The load generator (tokio + hyper's HTTP/1.1 client) and the HTTP server (hyper) are
//! tasks of this program, on tokio runtimes whose threads live in their pod's namespace;
//! they share the machine's CPUs with the two sidecar processes, as pods on a node do.
//! Each pod runs the real `envoy` sidecar, configured over ADS by the fake control plane of
//! the integration tests (`tests/support`) with what pilot sends for a Service `reviews`
//! (cluster IP 10.96.0.50, port 9080, endpoint 10.250.0.2:9080): `virtualOutbound`,
//! `virtualInbound` (the server pod's with a chain for its port 9080), listener `0.0.0.0_9080`
//! with route configuration `"9080"` (RDS) to cluster `outbound|9080||reviews...` (EDS).
//! The capture rules are exactly the kubelet's: `common::mesh::iptables_restore` for a pod
//! carrying the injector's `sidecar.istio.io/status` annotation. The cluster IP is routed onto
//! the veth with no host behind it, so without the client's sidecar it is unreachable.
//!
//! Two paths, each under three loads of keep-alive connections — 1 and 16 connections in a
//! closed loop (each sends its next request when the previous response body has arrived),
//! and 16 connections sending 1,000 requests/s in all — 1 s of warm-up then 5 s measured,
//! direct and mesh alternating so that drift hits both alike:
//! - direct: the load generator calls `10.250.0.2:9080`, no capture rules in either pod;
//! - mesh: it calls `reviews:9080` at `10.96.0.50:9080`, capture rules loaded in both pods,
//!   so every request goes client sidecar (outbound) → server sidecar (inbound) → server.
//!
//! Sidecar cost: CPU time (utime + stime from `/proc/<pid>/stat`) over the measured seconds
//! divided by the requests in them — CPU seconds per 1,000 requests, which is the same number
//! as vCPU per 1,000 requests/s — and the resident set (`VmRSS`, peak `VmHWM`) at the end.
//! The sidecars' own `istio_requests_total` counters show that mesh requests went through
//! both of them and direct ones through neither.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::config::route::v3 as rpb;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;
use support::{
    cla, control_plane, eds_cluster, http_listener, named, original_dst_cluster, prefix, route, route_config,
    service_vhost, to_cluster, virtual_inbound, virtual_outbound, ControlPlane, CDS, EDS, LDS, RDS,
};

const CLIENT_NETNS: &str = "meshbench-client";
const SERVER_NETNS: &str = "meshbench-server";
const CLIENT_IP: &str = "10.250.0.1";
const SERVER_IP: &str = "10.250.0.2";
const SERVICE_IP: &str = "10.96.0.50";
const PORT: u16 = 9080;
const CLUSTER: &str = "outbound|9080||reviews.default.svc.cluster.local";

/// The loads: as fast as the connections go (closed loop), and a fixed 1,000 requests/s
/// over 16 connections, the load Istio's own figures are given for.
const LOADS: [Load; 3] =
    [Load { conns: 1, rate: None }, Load { conns: 16, rate: None }, Load { conns: 16, rate: Some(1000) }];
const WARM_UP: Duration = Duration::from_secs(1);
const MEASURED: Duration = Duration::from_secs(5);

/// What the server answers (100 bytes).
const BODY: &[u8; 100] =
    br#"{"id":"0","podname":"reviews-v1","reviews":[{"reviewer":"Reviewer1","text":"A very good fun read"}]}"#;

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs benches without it.
    if !std::env::args().any(|a| a == "--bench") {
        println!("the mesh benchmark runs under `cargo bench -p envoy --bench mesh`; nothing to do here");
        return;
    }
    if let Some(why) = missing_prerequisites() {
        println!("SKIPPED: the mesh benchmark needs root, ip and iptables-restore: {why}");
        return;
    }
    let bin = std::env::var("ENVOY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_envoy").to_string());

    // Dropped in reverse order, also on a panic: sidecars, pods' runtimes, namespaces.
    let _namespaces = Namespaces::create();
    let client = Pod::new(CLIENT_NETNS);
    let server = Pod::new(SERVER_NETNS);

    server.run(http_server());
    let (_client_cp, client_xds) = client.run(pod_config(None));
    let (_server_cp, server_xds) = server.run(pod_config(Some(PORT as u32)));
    let client_sidecar = Sidecar::start(&bin, CLIENT_NETNS, client_xds, ("client-7d9f", CLIENT_IP, "client"));
    let server_sidecar = Sidecar::start(&bin, SERVER_NETNS, server_xds, ("reviews-v1-5b8c", SERVER_IP, "reviews-v1"));
    client.run(support::wait_ready());
    server.run(support::wait_ready());

    println!("envoy: {bin} (default --concurrency 2), {} CPUs on this machine", num_cpus());
    println!(
        "{} s warm-up + {} s measured per case; direct = no capture rules; mesh = kubelet's capture rules in both pods\n",
        WARM_UP.as_secs(),
        MEASURED.as_secs()
    );

    let sidecars = [&client_sidecar, &server_sidecar];
    let mut results = Vec::new();
    for load in LOADS {
        for mesh in [false, true] {
            set_capture(CLIENT_NETNS, mesh);
            set_capture(SERVER_NETNS, mesh);
            let before = [client.run(requests_seen()), server.run(requests_seen())];
            let (target, host) = if mesh {
                (format!("{SERVICE_IP}:{PORT}"), format!("reviews:{PORT}"))
            } else {
                (format!("{SERVER_IP}:{PORT}"), format!("{SERVER_IP}:{PORT}"))
            };
            let mut r = measure(&client, target.parse().unwrap(), host, load, &sidecars);
            let after = [client.run(requests_seen()), server.run(requests_seen())];
            r.through_sidecars = [after[0] - before[0], after[1] - before[1]];
            r.mesh = mesh;
            results.push(r);
        }
    }
    set_capture(CLIENT_NETNS, false);
    set_capture(SERVER_NETNS, false);
    let memory = [client_sidecar.memory(), server_sidecar.memory()];
    report(&results, memory);
}

// ---------------------------------------------------------------- measuring

#[derive(Clone, Copy, Default, PartialEq)]
struct Load {
    conns: usize,
    /// Requests per second over all connections; `None`: each sends its next request as
    /// soon as the previous response has arrived.
    rate: Option<u32>,
}

impl Load {
    fn label(&self) -> String {
        let conns = format!("{} conn{}", self.conns, if self.conns == 1 { "" } else { "s" });
        match self.rate {
            Some(rate) => format!("{conns} @ {rate}/s"),
            None => conns,
        }
    }
}

#[derive(Default)]
struct Case {
    mesh: bool,
    load: Load,
    /// All requests sent, warm-up included.
    sent: usize,
    rps: f64,
    /// p50, p90, p99 in µs.
    latency: [u64; 3],
    /// CPU seconds the client's and the server's sidecar used in the measured seconds:
    /// [user, system].
    cpu: [[f64; 2]; 2],
    /// Requests completed in the measured seconds.
    requests: usize,
    /// Requests the client's and the server's sidecar counted in `istio_requests_total`.
    through_sidecars: [u64; 2],
}

/// Run the load generator in the client pod: `load` against `target`.
fn measure(client: &Pod, target: SocketAddr, host: String, load: Load, sidecars: &[&Sidecar; 2]) -> Case {
    let start = Instant::now();
    let measured_from = start + WARM_UP;
    let until = measured_from + MEASURED;
    let tasks: Vec<_> = (0..load.conns)
        .map(|i| {
            // With a rate, each connection sends every `interval`, the connections staggered.
            let schedule = load.rate.map(|rate| {
                let interval = Duration::from_secs_f64(load.conns as f64 / rate as f64);
                (start + interval.mul_f64(i as f64 / load.conns as f64), interval)
            });
            client.rt.spawn(connection(target, host.clone(), schedule, measured_from, until))
        })
        .collect();
    std::thread::sleep(measured_from.saturating_duration_since(Instant::now()));
    let cpu_before = sidecars.map(Sidecar::cpu_seconds);
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    let cpu_after = sidecars.map(Sidecar::cpu_seconds);
    let mut samples = Vec::new();
    let mut sent = 0;
    for t in tasks {
        let (s, n) = client.rt.block_on(t).expect("a load generator connection failed");
        samples.extend(s);
        sent += n;
    }
    samples.sort_unstable();
    let pct = |p: usize| samples[(samples.len() * p / 100).min(samples.len() - 1)];
    let requests = samples.len();
    let cpu = [0, 1].map(|i| [0, 1].map(|j| cpu_after[i][j] - cpu_before[i][j]));
    Case {
        load,
        requests,
        sent,
        rps: requests as f64 / MEASURED.as_secs_f64(),
        latency: [pct(50), pct(90), pct(99)],
        cpu,
        ..Default::default()
    }
}

/// One keep-alive connection sending GETs until `until`: back to back, or at the times of
/// `schedule` (first send, interval). Returns the latencies (µs, request sent → whole
/// response body received) of the requests sent from `measured_from` on, and how many it
/// sent in all.
async fn connection(
    target: SocketAddr,
    host: String,
    mut schedule: Option<(Instant, Duration)>,
    measured_from: Instant,
    until: Instant,
) -> (Vec<u64>, usize) {
    let stream = tokio::net::TcpStream::connect(target).await.unwrap_or_else(|e| panic!("connect {target}: {e}"));
    stream.set_nodelay(true).unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut samples = Vec::with_capacity(100_000);
    let mut sent = 0;
    loop {
        if let Some((next, interval)) = &mut schedule {
            tokio::time::sleep_until((*next).into()).await;
            *next += *interval;
        }
        sender.ready().await.expect("connection closed");
        let t = Instant::now();
        if t >= until {
            return (samples, sent);
        }
        let req = http::Request::get("/").header(http::header::HOST, &host).body(Empty::<Bytes>::new()).unwrap();
        let resp = sender.send_request(req).await.unwrap_or_else(|e| panic!("GET http://{target}/: {e}"));
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("response body").to_bytes();
        assert!(status == 200 && body.len() == BODY.len(), "GET http://{target}/ (Host {host}): {status}, {body:?}");
        sent += 1;
        if t >= measured_from {
            samples.push(t.elapsed().as_micros() as u64);
        }
    }
}

/// The server pod's application: HTTP/1.1 on :9080, `BODY` for every request.
async fn http_server() {
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", PORT)).await.expect("binding :9080");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    let resp = http::Response::builder()
                        .header(http::header::CONTENT_TYPE, "application/json")
                        .body(Full::new(Bytes::from_static(BODY)))
                        .unwrap();
                    Ok::<_, Infallible>(resp)
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
}

/// The sum of `istio_requests_total` of the sidecar of the pod this runs in.
async fn requests_seen() -> u64 {
    support::metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("istio_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

// ---------------------------------------------------------------- the mesh's configuration

/// A control plane (on the pod's loopback) holding what pilot sends this pod's sidecar: the
/// Service `reviews` for outbound calls and, when the pod serves `inbound_port`, the inbound
/// chain for it.
async fn pod_config(inbound_port: Option<u32>) -> (ControlPlane, SocketAddr) {
    let (cp, addr, _server) = control_plane().await;
    let mut clusters = vec![named(CLUSTER, &eds_cluster(CLUSTER))];
    let mut inbound = virtual_inbound(PORT as u32);
    match inbound_port {
        Some(port) => {
            let name = format!("inbound|{port}||");
            clusters.push(named(&name, &original_dst_cluster(&name)));
        }
        None => inbound.filter_chains.clear(),
    }
    cp.set(CDS, clusters);
    cp.set(EDS, vec![named(CLUSTER, &cla(CLUSTER, &[&format!("{SERVER_IP}:{PORT}")]))]);
    cp.set(
        LDS,
        vec![
            named("virtualOutbound", &virtual_outbound()),
            named("virtualInbound", &inbound),
            named("0.0.0.0_9080", &http_listener(PORT as u32, false)),
        ],
    );
    let reviews =
        service_vhost("reviews", SERVICE_IP, PORT as u32, vec![route("default", prefix("/"), to_cluster(CLUSTER))]);
    let allow_any = rpb::VirtualHost {
        name: "allow_any".into(),
        domains: vec!["*".into()],
        routes: vec![route("allow_any", prefix("/"), to_cluster("PassthroughCluster"))],
        ..Default::default()
    };
    cp.set(RDS, vec![named("9080", &route_config("9080", vec![reviews, allow_any]))]);
    (cp, addr)
}

/// Load (`on`) or remove the kubelet's capture rules in namespace `netns`.
fn set_capture(netns: &str, on: bool) {
    // Without --noflush, iptables-restore replaces the whole nat table: empty it first.
    run(&["ip", "netns", "exec", netns, "iptables-restore"], Some("*nat\nCOMMIT\n"));
    if on {
        let annotations = BTreeMap::from([(
            common::mesh::STATUS_ANNOTATION.to_string(),
            r#"{"containers":["istio-proxy"]}"#.to_string(),
        )]);
        let capture = common::mesh::capture_for(&annotations).unwrap().expect("a pod with the sidecar is captured");
        let rules = common::mesh::iptables_restore(&capture);
        // As the kubelet loads them.
        run(&["ip", "netns", "exec", netns, "iptables-restore", "--noflush"], Some(&rules));
    }
}

// ---------------------------------------------------------------- pods and sidecars

fn missing_prerequisites() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    let have = |tool: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let missing: Vec<&str> = ["ip", "iptables-restore"].into_iter().filter(|t| !have(t)).collect();
    (!missing.is_empty()).then(|| format!("missing {}", missing.join(", ")))
}

fn run(args: &[&str], stdin: Option<&str>) {
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .spawn()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{args:?} failed: {status}");
}

/// The two pods' network namespaces joined by a veth pair; deleted on drop (which also
/// removes the veth pair).
struct Namespaces;

impl Namespaces {
    fn create() -> Namespaces {
        // Left over by a run that was killed.
        Namespaces::delete();
        run(&["ip", "netns", "add", CLIENT_NETNS], None);
        let guard = Namespaces;
        run(&["ip", "netns", "add", SERVER_NETNS], None);
        run(
            &[
                "ip",
                "link",
                "add",
                "veth-c",
                "netns",
                CLIENT_NETNS,
                "type",
                "veth",
                "peer",
                "name",
                "veth-s",
                "netns",
                SERVER_NETNS,
            ],
            None,
        );
        for (ns, dev, ip) in [(CLIENT_NETNS, "veth-c", CLIENT_IP), (SERVER_NETNS, "veth-s", SERVER_IP)] {
            run(&["ip", "-n", ns, "link", "set", "lo", "up"], None);
            run(&["ip", "-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev], None);
            run(&["ip", "-n", ns, "link", "set", dev, "up"], None);
        }
        // Service IPs: onto the veth, where nobody answers for them.
        run(&["ip", "-n", CLIENT_NETNS, "route", "add", "10.96.0.0/12", "dev", "veth-c"], None);
        guard
    }

    fn delete() {
        for ns in [CLIENT_NETNS, SERVER_NETNS] {
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        }
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        Namespaces::delete();
    }
}

/// Move the calling thread into network namespace `netns`.
fn enter(netns: &str) {
    let f = std::fs::File::open(format!("/var/run/netns/{netns}")).unwrap();
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {netns}: {}", std::io::Error::last_os_error());
}

/// A pod's processes in this program: a tokio runtime whose threads all live in the pod's
/// network namespace, so that every socket its tasks open belongs to the pod.
struct Pod {
    rt: tokio::runtime::Runtime,
}

impl Pod {
    fn new(netns: &'static str) -> Pod {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .on_thread_start(move || enter(netns))
            .enable_all()
            .build()
            .unwrap();
        Pod { rt }
    }

    /// Run `f` on the pod's threads (not on the calling thread, which is in the host's
    /// namespace) and wait for it.
    fn run<F>(&self, f: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.rt.block_on(self.rt.spawn(f)).expect("a task in the pod failed")
    }
}

/// An `envoy proxy sidecar` process in a pod's namespace, as uid 1337; killed on drop.
struct Sidecar {
    child: Child,
}

impl Sidecar {
    /// `pod`: its name, IP and workload name (the downward API's values).
    fn start(bin: &str, netns: &str, discovery: SocketAddr, pod: (&str, &str, &str)) -> Sidecar {
        let ns = std::fs::File::open(format!("/var/run/netns/{netns}")).unwrap();
        let parent = std::process::id() as i32;
        let mut cmd = Command::new(bin);
        cmd.args(["proxy", "sidecar", "--discovery-address", &discovery.to_string(), "--drain-duration", "1s"])
            .env("POD_NAME", pod.0)
            .env("POD_NAMESPACE", "default")
            .env("INSTANCE_IP", pod.1)
            .env("ISTIO_META_WORKLOAD_NAME", pod.2)
            .env("RUST_LOG", "warn");
        // In the child before exec: enter the pod's namespace (needs root), become uid 1337,
        // and die with this program even when it is killed before it can clean up.
        unsafe {
            cmd.pre_exec(move || {
                let check = |rc: i32| if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
                check(libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET))?;
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setgid(common::mesh::SIDECAR_UID))?;
                check(libc::setuid(common::mesh::SIDECAR_UID))?;
                check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))?;
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        Sidecar { child: cmd.spawn().unwrap_or_else(|e| panic!("starting {bin}: {e}")) }
    }

    /// CPU time used so far (all threads), in seconds: [user, system].
    fn cpu_seconds(&self) -> [f64; 2] {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).expect("sidecar's stat");
        // Fields after the command name: state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        [11, 12].map(|i| fields[i].parse::<f64>().unwrap() / tick)
    }

    /// Resident set now and at its peak, in MB.
    fn memory(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("sidecar's status");
        let kb = |key: &str| {
            let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_default();
            line.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        };
        (kb("VmRSS:") / 1000.0, kb("VmHWM:") / 1000.0)
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

// ---------------------------------------------------------------- the report

/// Figures to hold the results against.
struct Anchors {
    /// Latency added at p90 by the two sidecars of a call.
    added_p90: &'static str,
    /// CPU per sidecar at 1,000 requests/s.
    vcpu: &'static str,
    /// Memory per sidecar at 1,000 requests/s.
    memory: &'static str,
}

/// Istio's published figures for its Envoy sidecar (16 connections, 1,000 requests/s).
const ISTIO: Anchors = Anchors { added_p90: "2.65 ms", vcpu: "0.35 vCPU", memory: "40 MB per 1,000 req/s" };
/// What this sidecar aims for.
const TARGET: Anchors = Anchors { added_p90: "< 0.5 ms", vcpu: "< 0.1 vCPU", memory: "< 10 MB per 1,000 req/s" };

fn report(results: &[Case], memory: [(f64, f64); 2]) {
    let ms = |us: u64| us as f64 / 1000.0;
    let direct = |r: &Case| results.iter().find(|d| !d.mesh && d.load == r.load).unwrap();
    println!(
        "{:<7} {:<18} {:>8} {:>8} {:>8} {:>8}   {:>7} {:>7}   sidecars saw (out/in of sent)",
        "path", "load", "req/s", "p50 ms", "p90 ms", "p99 ms", "req/s ×", "p90 ×"
    );
    for r in results {
        println!(
            "{:<7} {:<18} {:>8.0} {:>8.3} {:>8.3} {:>8.3}   {:>7.2} {:>7.2}   {}/{} of {}",
            if r.mesh { "mesh" } else { "direct" },
            r.load.label(),
            r.rps,
            ms(r.latency[0]),
            ms(r.latency[1]),
            ms(r.latency[2]),
            r.rps / direct(r).rps,
            r.latency[1] as f64 / direct(r).latency[1] as f64,
            r.through_sidecars[0],
            r.through_sidecars[1],
            r.sent,
        );
    }
    println!("(× = mesh / direct under the same load; latency = request sent → whole response body received)\n");

    println!("{:<54} {:>14}   {:<24} Istio's Envoy", "", "these sidecars", "target");
    for r in results.iter().filter(|r| r.mesh) {
        let added = ms(r.latency[1]) - ms(direct(r).latency[1]);
        let what = format!("added p90 latency, both sidecars, {}", r.load.label());
        println!("{what:<54} {:>11.3} ms   {:<24} {}", added, TARGET.added_p90, ISTIO.added_p90);
    }
    for r in results.iter().filter(|r| r.mesh) {
        for (i, side) in ["client", "server"].iter().enumerate() {
            let what = format!("vCPU per 1,000 req/s, {side} sidecar, {}", r.load.label());
            let [user, system] = r.cpu[i].map(|s| s / r.requests as f64 * 1000.0);
            println!(
                "{what:<54} {:>14.3}   {:<24} {:<12} user {user:.3} + system {system:.3}",
                user + system,
                TARGET.vcpu,
                ISTIO.vcpu
            );
        }
    }
    for (i, side) in ["client", "server"].iter().enumerate() {
        let what = format!("RSS at the end (peak), {side} sidecar");
        let mb = format!("{:.1} ({:.1}) MB", memory[i].0, memory[i].1);
        println!("{what:<54} {mb:>14}   {:<24} {}", TARGET.memory, ISTIO.memory);
    }
    let idle = [0, 1].map(|i| {
        let direct: Vec<&Case> = results.iter().filter(|r| !r.mesh).collect();
        let seconds: f64 = direct.iter().map(|r| r.cpu[i][0] + r.cpu[i][1]).sum();
        seconds / (direct.len() as f64 * MEASURED.as_secs_f64()) * 1000.0
    });
    println!(
        "(without traffic, during the direct cases, the sidecars used {:.1} and {:.1} ms of CPU per second)",
        idle[0], idle[1]
    );
    let peak = results.iter().filter(|r| r.mesh).map(|r| r.rps).fold(0.0, f64::max);
    println!("(RSS is the whole process, not divided by the rate; the sidecars carried up to {peak:.0} req/s)");
}
