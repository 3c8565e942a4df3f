//! The kubelet's gRPC and HTTPS probes against real servers, with the real kubelet on the
//! real Docker engine.
//!
//! No local image serves gRPC or TLS (busybox has neither), so the probed servers run on
//! the host and the pods use `hostNetwork: true` — the pod IP the prober dials is then the
//! node IP (127.0.0.1 here): etcd (which serves `grpc.health.v1.Health` on its client port)
//! for gRPC, `openssl s_server -www` with a self-signed certificate for HTTPS.
//! - gRPC readiness on etcd → Ready; gRPC liveness for a service etcd does not know
//!   (NOT_FOUND) → the container is restarted.
//! - HTTPS readiness on s_server → Ready (the self-signed certificate is not verified, as
//!   in Kubernetes); plain-HTTP liveness on the same TLS port → restarted.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::kubelet::{require_docker, Kubelet};
use e2e::{free_port, ApiServer};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use storage::etcd_test_server::EtcdServer;

/// `openssl s_server -www` on 127.0.0.1 with a fresh self-signed certificate; killed on drop.
struct TlsServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl TlsServer {
    fn start() -> Result<TlsServer> {
        let dir = tempfile::tempdir()?;
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let st = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=probe-test"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running openssl req (apt-get install openssl)")?;
        ensure!(st.success(), "openssl req failed");
        let port = free_port();
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept", &format!("127.0.0.1:{port}")])
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting openssl s_server")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            ensure!(Instant::now() < deadline, "openssl s_server not listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(TlsServer { child, port, _dir: dir })
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn host_pod(name: &str, node: &str, probes: Value) -> Result<Pod> {
    let mut c =
        json!({"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent", "command": ["sleep", "600"]});
    if let (Some(c), Some(p)) = (c.as_object_mut(), probes.as_object()) {
        c.extend(p.clone());
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "hostNetwork": true, "terminationGracePeriodSeconds": 1, "containers": [c]}
    }))?)
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

async fn wait(api: &Api<Pod>, kubelet: &Kubelet, name: &str, what: &str, pred: impl Fn(&Pod) -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let p = api.get(name).await?;
        if pred(&p) {
            return Ok(());
        }
        if Instant::now() > deadline {
            let log = kubelet.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            bail!("{name}: {what} not reached: {:?}\nkubelet log (newest first):\n{}", p.status, tail.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_and_https_probes_against_real_servers() -> Result<()> {
    if !require_docker() {
        return Ok(());
    }
    let etcd = EtcdServer::start().context("starting etcd")?;
    let etcd_port: u16 = etcd.endpoint().rsplit(':').next().and_then(|p| p.parse().ok()).context("etcd port")?;
    let tls = TlsServer::start()?;
    let api = ApiServer::start()?;
    let kubelet = Kubelet::start(&api.url(), "kl-probe")?;
    let pods: Api<Pod> = Api::namespaced(api.client()?, "default");
    let node = kubelet.node.clone();
    let pp = PostParams::default();
    let fast = |handler: Value| {
        let mut p = json!({"periodSeconds": 1, "failureThreshold": 2, "timeoutSeconds": 2});
        if let (Some(p), Some(h)) = (p.as_object_mut(), handler.as_object()) {
            p.extend(h.clone());
        }
        p
    };
    let specs = [
        ("grpc-ready", json!({"readinessProbe": fast(json!({"grpc": {"port": etcd_port}}))})),
        (
            "grpc-unknown",
            json!({"livenessProbe": fast(json!({"grpc": {"port": etcd_port, "service": "no-such-service"}}))}),
        ),
        (
            "https-ready",
            json!({"readinessProbe": fast(json!({"httpGet": {"port": tls.port, "path": "/", "scheme": "HTTPS"}}))}),
        ),
        (
            "http-on-tls",
            json!({"livenessProbe": fast(json!({"httpGet": {"port": tls.port, "path": "/", "scheme": "HTTP"}}))}),
        ),
    ];
    for (name, probes) in &specs {
        pods.create(&pp, &host_pod(name, &node, probes.clone())?).await?;
    }
    wait(&pods, &kubelet, "grpc-ready", "Ready via gRPC health", ready).await?;
    wait(&pods, &kubelet, "https-ready", "Ready via HTTPS", ready).await?;
    wait(&pods, &kubelet, "grpc-unknown", "restarted by the gRPC liveness probe", |p| restarts(p) >= 1).await?;
    wait(&pods, &kubelet, "http-on-tls", "restarted by the HTTP liveness probe", |p| restarts(p) >= 1).await?;
    // The passing probes never restarted their containers.
    for name in ["grpc-ready", "https-ready"] {
        let p = pods.get(name).await?;
        ensure!(restarts(&p) == 0 && ready(&p), "{name}: {:?}", p.status);
    }
    Ok(())
}
