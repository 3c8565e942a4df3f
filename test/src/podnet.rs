//! A lab for the pod network without Docker: "nodes" and "pods" as network namespaces on
//! this host, each node running the real kubelet's pod network alone (`--network-only`: the
//! same `PodNetwork` and Node watch a full kubelet runs), pods plugged into its bridge as
//! pause containers are, and the traffic made from this process by threads that joined a
//! pod's namespace. Used by the overlay suite and the pod network benchmark; everything
//! (namespaces, links, processes) goes when the [`Lab`] is dropped.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

extern "C" {
    /// glibc's setns(2) (std links libc; the e2e crate has no libc binding of its own).
    fn setns(fd: i32, nstype: i32) -> i32;
}
pub const CLONE_NEWNET: i32 = 0x4000_0000;

pub const VXLAN_DEVICE: &str = "mk8s.vxlan";
pub const VTEP_MAC: &str = "minik8s.io/vtep-mac";
pub const BACKEND_TYPE: &str = "minik8s.io/backend-type";
pub const PUBLIC_IP: &str = "minik8s.io/public-ip";

/// Root, iproute2 (`ip`, `bridge`), iptables and VXLAN devices in network namespaces
/// (probed once per process). Under `CI=true` a missing one fails the test; otherwise it
/// is skipped.
pub fn prerequisites() -> bool {
    static MISSING: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let missing = MISSING.get_or_init(missing_prerequisites);
    if missing.is_empty() {
        return true;
    }
    let msg = format!("overlay e2e prerequisites missing: {missing:?}");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{msg}");
    }
    eprintln!("SKIP: {msg}");
    false
}

fn missing_prerequisites() -> Vec<String> {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let mut missing: Vec<String> = ["ip", "bridge", "iptables", "sleep"]
        .iter()
        .filter(|p| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {p}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|p| p.to_string())
        .collect();
    if !root {
        missing.push("root".into());
    } else if missing.is_empty() {
        let probe = format!("mk8s-vxprobe-{}", std::process::id());
        let ok = Command::new("sh")
            .args([
                "-c",
                &format!(
                    "ip netns add {probe} && ip -n {probe} link add vx type vxlan id 1 dstport 8472 nolearning; \
                     rc=$?; ip netns del {probe} 2>/dev/null; exit $rc"
                ),
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            missing.push("VXLAN devices in a network namespace".into());
        }
    }
    missing
}

/// Run a shell command line; its stdout, or an error with its output.
pub fn sh(cmd: &str) -> Result<String> {
    let out = Command::new("sh").args(["-c", cmd]).output().with_context(|| format!("running {cmd}"))?;
    ensure!(
        out.status.success(),
        "`{cmd}` failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Like [`sh`], but any outcome is text (for failure messages).
pub fn show(cmd: &str) -> String {
    match Command::new("sh").args(["-c", cmd]).output() {
        Ok(o) => format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        Err(e) => e.to_string(),
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The namespaces, processes and files of one test; all removed on drop.
pub struct Lab {
    pub id: u32,
    namespaces: Vec<String>,
    kubelets: BTreeMap<String, Child>,
    sleepers: Vec<Child>,
    dir: tempfile::TempDir,
    mgmt: u32,
}

/// A simulated pod: a namespace and the process holding it.
pub struct FakePod {
    pub ns: String,
    pub pid: u32,
    pub ip: String,
}

impl Lab {
    pub fn new() -> Result<Lab> {
        let id = (std::process::id() % 100) * 10 + SEQ.fetch_add(1, Ordering::SeqCst) % 10;
        Ok(Lab {
            id,
            namespaces: Vec::new(),
            kubelets: BTreeMap::new(),
            sleepers: Vec::new(),
            dir: tempfile::tempdir()?,
            mgmt: 0,
        })
    }

    pub fn ns(&self, name: &str) -> String {
        format!("ovl{}-{name}", self.id)
    }

    pub fn add_ns(&mut self, name: &str) -> Result<String> {
        let ns = self.ns(name);
        let _ = show(&format!("ip netns del {ns} 2>/dev/null"));
        sh(&format!("ip netns add {ns} && ip -n {ns} link set lo up"))?;
        self.namespaces.push(ns.clone());
        Ok(ns)
    }

    /// A node namespace with a management link to this host (a /30 of 100.64.0.0/10); the
    /// address of this host's end, where the node reaches the apiserver.
    pub fn add_node(&mut self, name: &str) -> Result<String> {
        let ns = self.add_ns(name)?;
        let k = self.id * 8 + self.mgmt;
        self.mgmt += 1;
        let (a, b, c) = (64 + k / 16384, (k / 64) % 256, (k % 64) * 4);
        let (host, node) = (format!("100.{a}.{b}.{}", c + 1), format!("100.{a}.{b}.{}", c + 2));
        let host_if = format!("ovm{}{name}", self.id);
        sh(&format!(
            "set -e; ip link add {host_if} type veth peer name mgmt netns {ns}; \
             ip addr add {host}/30 dev {host_if}; ip link set {host_if} up; \
             ip -n {ns} addr add {node}/30 dev mgmt; ip -n {ns} link set mgmt up"
        ))?;
        Ok(host)
    }

    /// A pod namespace with a process in it (the kubelet plugs that process's namespace in).
    pub fn add_pod(&mut self, name: &str, ip: &str) -> Result<FakePod> {
        let ns = self.add_ns(name)?;
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, "sleep", "3600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting a pod's sleep")?;
        let pid = child.id();
        self.sleepers.push(child);
        // `ip netns exec` has joined the namespace once it has become `sleep`.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim() != "sleep" {
            ensure!(Instant::now() < deadline, "the sleep of {ns} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(FakePod { ns, pid, ip: ip.into() })
    }

    pub fn log_path(&self, node: &str) -> PathBuf {
        self.dir.path().join(format!("{node}.log"))
    }

    pub fn log(&self, node: &str) -> String {
        std::fs::read_to_string(self.log_path(node)).unwrap_or_default()
    }

    /// Start the real kubelet (`--network-only`) in `node`'s namespace.
    #[allow(clippy::too_many_arguments)]
    pub fn start_kubelet(
        &mut self,
        node: &str,
        node_name: &str,
        server: &str,
        node_ip: &str,
        pod_cidr: &str,
        backend: &str,
        pods: &[&FakePod],
    ) -> Result<()> {
        self.stop_kubelet(node);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(node))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(node)])
            .arg(crate::kubelet::kubelet_bin())
            .args(["--server", server, "--hostname-override", node_name, "--node-ip", node_ip])
            .args(["--pod-cidr", pod_cidr, "--network-backend", backend, "--network-only"])
            .arg("--root-dir")
            .arg(self.dir.path().join(format!("root-{node}")))
            .args(["--log-level", "info,kubelet=debug"]);
        for p in pods {
            cmd.args(["--network-only-pod", &format!("{}={}", p.pid, p.ip)]);
        }
        let child =
            cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).spawn().context("starting the kubelet")?;
        self.kubelets.insert(node.to_string(), child);
        Ok(())
    }

    pub fn stop_kubelet(&mut self, node: &str) {
        if let Some(mut c) = self.kubelets.remove(node) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `ip …` (or any command) in namespace `name` of this lab.
    pub fn exec(&self, name: &str, cmd: &str) -> Result<String> {
        sh(&format!("ip netns exec {} {cmd}", self.ns(name)))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.kubelets) {
            let _ = c.kill();
            let _ = c.wait();
        }
        for mut c in std::mem::take(&mut self.sleepers) {
            let _ = c.kill();
            let _ = c.wait();
        }
        // A namespace takes its links (and their peers elsewhere), routes and rules with it.
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        }
    }
}

/// Run `f` on a thread that joined network namespace `ns` (sockets it opens live there).
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> Result<T> {
    let file = File::open(format!("/run/netns/{ns}")).with_context(|| format!("opening namespace {ns}"))?;
    let joined = std::thread::spawn(move || {
        // SAFETY: setns on this thread only, with a namespace fd that outlives the call.
        if unsafe { setns(file.as_raw_fd(), CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        f()
    })
    .join()
    .map_err(|_| anyhow!("thread in {ns} panicked"))?;
    Ok(joined?)
}

/// 1 MB of deterministic bytes.
pub fn payload() -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// A TCP echo server in `ns` for one connection: reads to the end, writes it all back.
pub fn tcp_echo_server(ns: &str, port: u16) -> Result<std::thread::JoinHandle<std::io::Result<usize>>> {
    let listener = in_netns(ns, move || TcpListener::bind(("0.0.0.0", port)))?;
    Ok(std::thread::spawn(move || {
        let (mut s, _) = listener.accept()?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        s.write_all(&buf)?;
        Ok(buf.len())
    }))
}

/// From `ns`: send `data` to `to` over TCP, read the echo back.
pub fn tcp_echo(ns: &str, to: SocketAddr, data: Vec<u8>) -> Result<Vec<u8>> {
    in_netns(ns, move || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_write_timeout(Some(Duration::from_secs(30)))?;
        s.write_all(&data)?;
        s.shutdown(std::net::Shutdown::Write)?;
        let mut back = Vec::new();
        s.read_to_end(&mut back)?;
        Ok(back)
    })
}

/// A UDP echo server in `ns` until it receives `bye` (or nothing for 30 s).
pub fn udp_echo_server(ns: &str, port: u16) -> Result<std::thread::JoinHandle<()>> {
    let sock = in_netns(ns, move || UdpSocket::bind(("0.0.0.0", port)))?;
    sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            if &buf[..n] == b"bye" {
                return;
            }
            let _ = sock.send_to(&buf[..n], from);
        }
    }))
}

/// From `ns`: each of `sizes` as one datagram to `to`, echoed back intact (a few tries each).
pub fn udp_echo(ns: &str, to: SocketAddr, sizes: &[usize]) -> Result<()> {
    let sock = in_netns(ns, || UdpSocket::bind(("0.0.0.0", 0)))?;
    sock.set_read_timeout(Some(Duration::from_millis(700)))?;
    let data = payload();
    for &n in sizes {
        let msg = &data[..n];
        let mut ok = false;
        for _ in 0..5 {
            sock.send_to(msg, to).with_context(|| format!("sending {n} bytes to {to}"))?;
            let mut buf = vec![0u8; 65536];
            if let Ok((got, _)) = sock.recv_from(&mut buf) {
                ensure!(&buf[..got] == msg, "UDP echo of {n} bytes came back as {got} different bytes");
                ok = true;
                break;
            }
        }
        ensure!(ok, "no UDP echo of {n} bytes from {to}");
    }
    Ok(())
}

/// Pod-to-pod over TCP (1 MB there and back) and UDP, from `from` to `to`.
pub fn pod_traffic(from: &FakePod, to: &FakePod, port: u16) -> Result<()> {
    let addr: SocketAddr = format!("{}:{port}", to.ip).parse()?;
    let server = tcp_echo_server(&to.ns, port)?;
    let data = payload();
    let back = tcp_echo(&from.ns, addr, data.clone())?;
    let received = server.join().map_err(|_| anyhow!("TCP server panicked"))??;
    ensure!(received == data.len(), "the server received {received} of {} bytes", data.len());
    ensure!(back == data, "the 1 MB came back altered ({} bytes)", back.len());
    let udp = udp_echo_server(&to.ns, port)?;
    // The largest datagram that fits the overlay's MTU of 1350 unfragmented: 1350 - 28.
    let res = udp_echo(&from.ns, addr, &[16, 1000, 1322]);
    // End the server (from the server's own namespace, whatever the overlay does).
    let _ = in_netns(&to.ns, move || {
        let s = UdpSocket::bind(("127.0.0.1", 0))?;
        s.send_to(b"bye", ("127.0.0.1", port))?;
        Ok(())
    });
    let _ = udp.join();
    res
}

pub async fn create_node(
    nodes: &Api<Node>,
    name: &str,
    cidr: &str,
    ip: &str,
    annotations: serde_json::Value,
) -> Result<()> {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": ip}]}});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await?;
    Ok(())
}

/// The router's packet and byte counters of the mangle PREROUTING rule commented
/// `comment` (before routing: packets it has no route for count too). With GSO a packet
/// may be a burst of segments; the bytes are exact.
pub fn forwarded(lab: &Lab, comment: &str) -> Result<(u64, u64)> {
    let out = lab.exec("r", "iptables -w -t mangle -nvx -L PREROUTING")?;
    let line = out.lines().find(|l| l.contains(comment)).with_context(|| format!("no rule {comment}: {out}"))?;
    let mut f = line.split_whitespace();
    let mut num = || -> Result<u64> { Ok(f.next().unwrap_or("0").parse()?) };
    Ok((num()?, num()?))
}
