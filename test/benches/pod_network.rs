//! Pod-to-pod throughput and latency: on one node, across nodes with host-gw, across nodes
//! over the VXLAN overlay — in one run, as ratios against the same-node figures.
//!
//! ```text
//! cargo bench -p e2e --bench pod_network          # as root; BENCH_MB (256), BENCH_RTTS (5000)
//! ```
//!
//! The lab of the overlay suite (`e2e::podnet`): two node namespaces on one shared subnet
//! (a veth pair, MTU 1500: the same underlay for both backends), each running the real
//! kubelet's pod network alone (`--network-only`), pods as namespaces plugged into the
//! node bridges. Throughput: one TCP connection sends BENCH_MB MiB to a sink that answers
//! with the count; latency: BENCH_RTTS one-byte TCP round trips (no Nagle), p50 and p99.
//! Everything crosses real veths, bridges, routes and (for vxlan) the kernel's VXLAN
//! encapsulation on this machine's CPU, so the ratios say what each path costs in CPU.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use e2e::bench::{env_or, percentile};
use e2e::podnet::{create_node, in_netns, prerequisites, sh, FakePod, Lab, VXLAN_DEVICE};
use e2e::ApiServer;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::json;

struct Figures {
    /// The sending pod's MTU.
    mtu: String,
    mib_per_s: f64,
    p50_us: f64,
    p99_us: f64,
}

/// A sink in `to`'s namespace for one connection: reads to the end, answers the count.
fn sink(to: &FakePod, port: u16) -> Result<std::thread::JoinHandle<std::io::Result<()>>> {
    let listener = in_netns(&to.ns, move || TcpListener::bind(("0.0.0.0", port)))?;
    Ok(std::thread::spawn(move || {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 16];
        let mut n: u64 = 0;
        loop {
            let got = s.read(&mut buf)?;
            if got == 0 {
                break;
            }
            n += got as u64;
        }
        s.write_all(&n.to_be_bytes())
    }))
}

/// An echo server of one connection in `to`'s namespace.
fn echo(to: &FakePod, port: u16) -> Result<std::thread::JoinHandle<std::io::Result<()>>> {
    let listener = in_netns(&to.ns, move || TcpListener::bind(("0.0.0.0", port)))?;
    Ok(std::thread::spawn(move || {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 1];
        while s.read(&mut b)? == 1 {
            s.write_all(&b)?;
        }
        Ok(())
    }))
}

fn measure(from: &FakePod, to: &FakePod, port: u16, mib: u64, rtts: usize) -> Result<Figures> {
    let addr: SocketAddr = format!("{}:{port}", to.ip).parse()?;
    let server = sink(to, port)?;
    let bytes = mib << 20;
    let (took, counted) = in_netns(&from.ns, move || {
        let chunk = vec![0x5au8; 1 << 16];
        let start = Instant::now();
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            s.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        s.shutdown(std::net::Shutdown::Write)?;
        let mut count = [0u8; 8];
        s.read_exact(&mut count)?;
        Ok((start.elapsed(), u64::from_be_bytes(count)))
    })?;
    server.join().map_err(|_| anyhow::anyhow!("sink panicked"))??;
    ensure!(counted == bytes, "the sink counted {counted} of {bytes} bytes");

    let addr: SocketAddr = format!("{}:{}", to.ip, port + 1).parse()?;
    let server = echo(to, port + 1)?;
    let mut samples = in_netns(&from.ns, move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        s.set_nodelay(true)?;
        let mut out = Vec::with_capacity(rtts);
        let mut b = [7u8; 1];
        for _ in 0..rtts {
            let t = Instant::now();
            s.write_all(&b)?;
            s.read_exact(&mut b)?;
            out.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(out)
    })?;
    server.join().map_err(|_| anyhow::anyhow!("echo panicked"))??;
    samples.sort_by(f64::total_cmp);
    let link = sh(&format!("ip -n {} link show eth0", from.ns))?;
    let mtu = link.split_whitespace().skip_while(|w| *w != "mtu").nth(1).unwrap_or("?").to_string();
    Ok(Figures {
        mtu,
        mib_per_s: mib as f64 / took.as_secs_f64(),
        p50_us: percentile(&samples, 0.50),
        p99_us: percentile(&samples, 0.99),
    })
}

async fn wait_until(what: &str, mut check: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        ensure!(Instant::now() < deadline, "{what}: not within 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let mib: u64 = env_or("BENCH_MB", 256);
    let rtts: usize = env_or("BENCH_RTTS", 5000);
    let api = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let nodes: Api<Node> = Api::all(api.client()?);
    let mut lab = Lab::new()?;
    let tag = lab.id;
    let host_a = lab.add_node("a")?;
    let host_b = lab.add_node("b")?;
    let (ns_a, ns_b) = (lab.ns("a"), lab.ns("b"));
    sh(&format!(
        "set -e; ip -n {ns_a} link add eth0 type veth peer name eth0 netns {ns_b}; \
         ip -n {ns_a} addr add 192.168.120.2/24 dev eth0; ip -n {ns_a} link set eth0 up; \
         ip -n {ns_b} addr add 192.168.120.3/24 dev eth0; ip -n {ns_b} link set eth0 up"
    ))?;
    let a1 = lab.add_pod("a1", "10.244.11.2")?;
    let a2 = lab.add_pod("a2", "10.244.11.3")?;
    let b1 = lab.add_pod("b1", "10.244.12.2")?;
    let (node_a, node_b) = (format!("bench-a-{tag}"), format!("bench-b-{tag}"));
    create_node(&nodes, &node_a, "10.244.11.0/24", "192.168.120.2", json!({})).await?;
    create_node(&nodes, &node_b, "10.244.12.0/24", "192.168.120.3", json!({})).await?;
    let (server_a, server_b) = (format!("http://{host_a}:{}", api.port), format!("http://{host_b}:{}", api.port));

    let mut rows: Vec<(&str, Figures)> = Vec::new();
    let mut port = 9000;
    for backend in ["host-gw", "vxlan"] {
        lab.start_kubelet("a", &node_a, &server_a, "192.168.120.2", "10.244.11.0/24", backend, &[&a1, &a2])?;
        lab.start_kubelet("b", &node_b, &server_b, "192.168.120.3", "10.244.12.0/24", backend, &[&b1])?;
        let want = if backend == "vxlan" { format!("dev {VXLAN_DEVICE}") } else { "dev eth0 proto 107".into() };
        wait_until(&format!("{backend} route from a to b"), || {
            lab.exec("a", "ip -4 route show 10.244.12.0/24").is_ok_and(|r| r.contains(&want))
        })
        .await
        .with_context(|| lab.log("a"))?;
        wait_until(&format!("{backend} route from b to a"), || {
            lab.exec("b", "ip -4 route show 10.244.11.0/24").is_ok_and(|r| r.contains(&want))
        })
        .await
        .with_context(|| lab.log("b"))?;
        // The kubelet plugs the pods in again with its backend's MTU (1450 under vxlan on this
        // 1500-byte underlay). Same node is measured once, under host-gw: the baseline.
        if backend == "host-gw" {
            rows.push(("same node", measure(&a1, &a2, port, mib, rtts)?));
            port += 2;
        }
        let label = if backend == "vxlan" { "other node, vxlan" } else { "other node, host-gw" };
        rows.push((label, measure(&a1, &b1, port, mib, rtts)?));
        port += 2;
    }

    let base_tp = rows[0].1.mib_per_s;
    let base_p50 = rows[0].1.p50_us;
    println!("pod to pod, {mib} MiB over one TCP connection, {rtts} one-byte round trips");
    println!(
        "{:<22} {:>5} {:>10} {:>8} {:>10} {:>10} {:>9}",
        "path", "MTU", "MiB/s", "ratio", "p50 µs", "p99 µs", "p50 ratio"
    );
    for (what, f) in &rows {
        println!(
            "{what:<22} {:>5} {:>10.0} {:>7.2}x {:>10.1} {:>10.1} {:>8.2}x",
            f.mtu,
            f.mib_per_s,
            f.mib_per_s / base_tp,
            f.p50_us,
            f.p99_us,
            f.p50_us / base_p50
        );
    }
    Ok(())
}
