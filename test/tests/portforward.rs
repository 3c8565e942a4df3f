//! `kubectl port-forward` end to end: the official kubectl (1.33 and 1.32 tunnel SPDY through a
//! WebSocket, 1.29 and 1.27 speak plain SPDY), the `kube` crate (`v4.channel.k8s.io` WebSocket) and our
//! kubectl (pod/, svc/, deploy/), through the real apiserver's upgrade proxy to the real
//! kubelet on Docker; a hostNetwork pod (forwarded on the host); plus kubectl 1.27's `exec`
//! and `attach` over SPDY. The pod serves one page on :80 and another on 127.0.0.1:8081 only
//! (reachable solely from inside its network namespace). Every test removes its node's
//! containers on drop, also on failure; forwarders are killed on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use e2e::kubectl::{our_kubectl, run};
use e2e::kubelet::Node as Env;
use e2e::{kubectl_bin, official_kubectls};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SERVE: &str = "mkdir -p /www /local; echo pod-page > /www/index.html; echo local-only > /local/index.html; \
     seq 1 500000 > /www/big; \
     httpd -f -p 80 -h /www & httpd -f -p 127.0.0.1:8081 -h /local & while true; do sleep 1; done";

/// The body of `/big` (`seq 1 500000`, 3.4 MB).
fn big_body() -> String {
    (1..=500000).map(|i| format!("{i}\n")).collect()
}

/// GET `path` over a fresh connection to 127.0.0.1:`port`: the body (after the headers).
fn http_get_body(port: u16, path: &str) -> Result<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: web\r\n\r\n").as_bytes())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let at =
        out.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| anyhow!("no headers in {} bytes", out.len()))?;
    Ok(out.split_off(at + 4))
}

/// The web pod (labels app=web, named container port `http` = 80), Running.
async fn web_pod(env: &Env) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"nodeName": env.kubelet.node, "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "web", "image": "busybox", "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", SERVE],
            "ports": [{"name": "http", "containerPort": 80}],
        }]},
    }))?;
    let api: Api<Pod> = Api::namespaced(env.api.client()?, "default");
    api.create(&PostParams::default(), &pod).await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let p = api.get("web").await?;
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            break;
        }
        if Instant::now() > deadline {
            bail!("pod web not Running in 90s; kubelet log:\n{}", kubelet_log(env));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Both servers answer (through the kube crate's port-forward, which tolerates a refused
    // port) before any test connects.
    for port in [80u16, 8081] {
        loop {
            let page = kube_get(&api, port).await.unwrap_or_default();
            if page.contains("200 OK") {
                break;
            }
            if Instant::now() > deadline {
                bail!("port {port} of pod web does not answer: {page:?}; kubelet log:\n{}", kubelet_log(env));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    Ok(())
}

/// GET / from the pod's `port` through one `kube` port-forward.
async fn kube_get(api: &Api<Pod>, port: u16) -> Result<String> {
    kube_get_path(api, port, "/").await
}

async fn kube_get_path(api: &Api<Pod>, port: u16, path: &str) -> Result<String> {
    let mut pf = api.portforward("web", &[port]).await?;
    let mut s = pf.take_stream(port).ok_or_else(|| anyhow!("no stream"))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).await?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The kubelet's log without terminal colours.
fn kubelet_log(env: &Env) -> String {
    let raw = env.kubelet.log();
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ … final byte in @..~
            for d in chars.by_ref() {
                if ('@'..='~').contains(&d) && d != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// GET / over a fresh connection to 127.0.0.1:`port`; the whole response ("" when the far
/// side closes without answering).
fn http_get(port: u16) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).with_context(|| format!("connecting to {port}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: web\r\n\r\n")?;
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => bail!("GET through port {port}: {e} after {:?}", String::from_utf8_lossy(&out)),
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// HTTP GET until the server answers (httpd may still be starting when the pod turns Running).
fn http_get_page(port: u16) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let page = http_get(port)?;
        if page.contains("200 OK") || Instant::now() > deadline {
            return Ok(page);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A running `kubectl port-forward`; killed on drop.
struct Forwarder {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: tempfile::NamedTempFile,
}

impl Forwarder {
    fn start(bin: &Path, server: &str, args: &[&str]) -> Result<Forwarder> {
        let stderr = tempfile::NamedTempFile::new()?;
        let mut child = Command::new(bin)
            .arg("--server")
            .arg(server)
            .arg("port-forward")
            .args(args)
            .env("KUBECONFIG", "/dev/null")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr.reopen()?)
            .spawn()
            .with_context(|| format!("running {}", bin.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Forwarder { child, lines, stderr })
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }

    /// The local ports of the first `n` `Forwarding from 127.0.0.1:L -> R` lines, as (L, R).
    fn ports(&mut self, n: usize) -> Result<Vec<(u16, u16)>> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut out = Vec::new();
        while out.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .map_err(|_| anyhow!("no `Forwarding from` line; stderr: {}", self.stderr()))?;
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                let (l, r) = rest.split_once(" -> ").ok_or_else(|| anyhow!("odd line {line:?}"))?;
                out.push((l.parse()?, r.parse()?));
            }
        }
        Ok(out)
    }

    /// Whether the process has exited (waiting up to `wait`).
    fn exited(&mut self, wait: Duration) -> Result<Option<std::process::ExitStatus>> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(Some(st));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn official_kubectl_port_forward() -> Result<()> {
    let Some(env) = Env::start("pf-official")? else { return Ok(()) };
    web_pod(&env).await?;
    let mut clients = official_kubectls(&["1.33", "1.29", "1.27"]);
    clients.push(("1.32".into(), kubectl_bin()));
    for (v, bin) in clients {
        let log_before = kubelet_log(&env).len();
        let mut pf = Forwarder::start(&bin, &env.api.url(), &["pod/web", "0:80", "0:8081", "0:81"])?;
        let ports = pf.ports(3)?;
        ensure!(ports.iter().map(|p| p.1).collect::<Vec<_>>() == [80, 8081, 81], "kubectl {v}: {ports:?}");
        ensure!(ports.iter().all(|p| p.0 != 0), "kubectl {v}: a random local port is printed: {ports:?}");
        let page = http_get_page(ports[0].0).with_context(|| format!("kubectl {v}: {}", pf.stderr()))?;
        ensure!(page.contains("200 OK") && page.contains("pod-page"), "kubectl {v}: {page}\n{}", pf.stderr());
        // Twice more, concurrently: every connection is its own stream pair.
        let (a, b) = (ports[0].0, ports[1].0);
        let (pa, pb) = std::thread::scope(|s| {
            let ta = s.spawn(move || http_get(a));
            let tb = s.spawn(move || http_get_page(b));
            (ta.join(), tb.join())
        });
        let (pa, pb) = (pa.map_err(|_| anyhow!("panic"))?, pb.map_err(|_| anyhow!("panic"))?);
        let (pa, pb) = (pa.with_context(|| pf.stderr())?, pb.with_context(|| pf.stderr())?);
        ensure!(pa.contains("pod-page"), "kubectl {v}: {pa}");
        // 127.0.0.1 inside the pod is reachable: the dial happens in the pod's namespace.
        ensure!(pb.contains("local-only"), "kubectl {v}: {pb}\n{}", pf.stderr());
        // Megabytes arrive whole and in order (many SPDY frames, WebSocket messages).
        let t = Instant::now();
        let body = http_get_body(ports[0].0, "/big")?;
        let secs = t.elapsed().as_secs_f64();
        ensure!(body == big_body().as_bytes(), "kubectl {v}: /big came back as {} bytes", body.len());
        println!(
            "kubectl {v}: {} bytes through port-forward in {secs:.2} s ({:.1} MB/s)",
            body.len(),
            body.len() as f64 / secs / 1e6
        );

        // Nothing listens on 81: the connection closes and kubectl reports the kubelet's error.
        let refused = http_get(ports[2].0).with_context(|| format!("kubectl {v}: {}", pf.stderr()))?;
        ensure!(!refused.contains("200 OK"), "kubectl {v}: {refused}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !pf.stderr().contains("error forwarding port 81") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let err = pf.stderr();
        ensure!(
            err.to_lowercase().contains("error occurred forwarding") && err.contains("error forwarding port 81 to pod"),
            "kubectl {v} stderr: {err}"
        );
        ensure!(err.contains("connection refused"), "kubectl {v} stderr: {err}");
        // Every release tested (1.27 onwards) then drops the whole connection and exits.
        let st = pf.exited(Duration::from_secs(20))?;
        ensure!(st.is_some_and(|s| !s.success()), "kubectl {v} should stop after the error: {st:?}");
        ensure!(pf.stderr().contains("lost connection to pod"), "kubectl {v}: {}", pf.stderr());
        drop(pf);

        // The transport each release uses reached the kubelet.
        let log = kubelet_log(&env);
        let log = &log[log_before.min(log.len())..];
        let minor: u32 = v.split('.').nth(1).and_then(|m| m.parse().ok()).unwrap_or(99);
        let want = if minor >= 31 { "transport=WebSocket SPDY/3.1+portforward.k8s.io" } else { "transport=SPDY" };
        ensure!(log.contains(want), "kubectl {v}: kubelet log lacks {want:?}:\n{log}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_crate_port_forward() -> Result<()> {
    let Some(env) = Env::start("pf-kube")? else { return Ok(()) };
    web_pod(&env).await?;
    let api: Api<Pod> = Api::namespaced(env.api.client()?, "default");
    // Two ports on one connection; the loopback-only one too. (The v4 protocol has no
    // per-port end of stream: the socket closes once every port's connection has.)
    let mut pf = api.portforward("web", &[80, 8081]).await.map_err(|e| anyhow!("pf2: {e:?}"))?;
    let mut streams = Vec::new();
    for port in [80u16, 8081] {
        let mut s = pf.take_stream(port).ok_or_else(|| anyhow!("no stream for {port}"))?;
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.map_err(|e| anyhow!("write {port}: {e:?}"))?;
        streams.push(s);
    }
    let mut pages = Vec::new();
    for mut s in streams {
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.map_err(|e| anyhow!("read: {e:?}"))?;
        pages.push(String::from_utf8_lossy(&out).into_owned());
    }
    let pflog = || kubelet_log(&env).lines().filter(|l| l.contains("port")).collect::<Vec<_>>().join("\n");
    ensure!(pages[0].contains("pod-page"), "{:?} {:?}\n{}", pages[0], pages[1], pflog());
    ensure!(pages[1].contains("local-only"), "{:?}\n{}", pages[1], pflog());
    let big = kube_get_path(&api, 80, "/big").await?;
    ensure!(big.ends_with(&big_body()), "/big through kube: {} bytes", big.len());
    drop(pf);

    // A closed port: the error channel says why.
    let mut pf = api.portforward("web", &[81]).await?;
    let err = pf.take_error(81).ok_or_else(|| anyhow!("no error future"))?;
    let msg = tokio::time::timeout(Duration::from_secs(30), err).await?.unwrap_or_default();
    ensure!(msg.contains("error forwarding port 81 to pod") && msg.contains("connection refused"), "{msg:?}");

    // The kubelet refuses what it cannot serve, with a Status.
    let (code, body) = env.kubelet.get("/portForward/default/web")?;
    ensure!(code == 400 && body.contains("Upgrade request required"), "{code} {body}");
    let (code, body) = env.kubelet.get("/portForward/default/nope")?;
    ensure!(code == 404 && body.contains("\"kind\":\"Status\""), "{code} {body}");
    let (code, head) = env.kubelet.get_with(
        "/portForward/default/web",
        &[
            "-i",
            "-X",
            "POST",
            "-H",
            "Connection: Upgrade",
            "-H",
            "Upgrade: SPDY/3.1",
            "-H",
            "X-Stream-Protocol-Version: v9.bogus",
        ],
    )?;
    let head = head.to_lowercase();
    ensure!(code == 403, "{code} {head}");
    ensure!(head.contains("x-accepted-stream-protocol-versions: portforward.k8s.io"), "{head}");

    // A pod that does not exist: a Status, not a hang.
    let e = api.portforward("nope", &[80]).await.err().ok_or_else(|| anyhow!("forwarding to a missing pod worked"))?;
    ensure!(e.to_string().contains("not found"), "{e}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn our_kubectl_port_forward() -> Result<()> {
    let Some(env) = Env::start("pf-ours")? else { return Ok(()) };
    web_pod(&env).await?;
    let client = env.api.client()?;
    let svc: Value = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "www", "port": 8080, "targetPort": "http"}]}});
    let deploy: Value = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "busybox"}]}}}});
    let svcs: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), "default");
    svcs.create(&PostParams::default(), &serde_json::from_value(svc)?).await?;
    let deps: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(client, "default");
    deps.create(&PostParams::default(), &serde_json::from_value(deploy)?).await?;

    let ours = our_kubectl();
    for (target, remote, expect_remote) in
        [("web", "0:80", 80), ("pod/web", "0:http", 80), ("svc/web", "0:8080", 80), ("deploy/web", "0:8081", 8081)]
    {
        let mut pf = Forwarder::start(&ours, &env.api.url(), &[target, remote, "--address", "127.0.0.1"])?;
        let ports = pf.ports(1)?;
        ensure!(ports[0].1 == expect_remote, "{target}: {ports:?}");
        let page = http_get_page(ports[0].0)?;
        let want = if expect_remote == 8081 { "local-only" } else { "pod-page" };
        ensure!(page.contains(want), "{target}: {page}\n{}", pf.stderr());
    }

    // A closed port: the error is printed and the forwarder keeps going.
    let mut pf = Forwarder::start(&ours, &env.api.url(), &["pod/web", "0:81", "0:80"])?;
    let ports = pf.ports(2)?;
    let refused = http_get(ports[0].0)?;
    ensure!(refused.is_empty(), "{refused}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pf.stderr().contains("error forwarding port 81") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(pf.stderr().contains("an error occurred forwarding"), "{}", pf.stderr());
    ensure!(http_get(ports[1].0)?.contains("pod-page"), "{}", pf.stderr());

    // Usage errors, as kubectl words them.
    let r = run(&ours, &env.api.url(), &["port-forward", "pod/web"], None)?;
    ensure!(r.code == 1 && r.stderr.contains("TYPE/NAME and list of ports are required"), "{r:?}");
    let r = run(&ours, &env.api.url(), &["port-forward", "svc/web", "0:9999"], None)?;
    ensure!(r.code == 1 && r.stderr.contains("does not have a service port 9999"), "{r:?}");
    let r = run(&ours, &env.api.url(), &["port-forward", "pod/missing", "80"], None)?;
    ensure!(r.code == 1 && r.stderr.contains("not found"), "{r:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_127_exec_over_spdy() -> Result<()> {
    let Some(env) = Env::start("spdy-exec")? else { return Ok(()) };
    web_pod(&env).await?;
    for (v, bin) in official_kubectls(&["1.27"]) {
        let log_before = kubelet_log(&env).len();
        let r = run(&bin, &env.api.url(), &["exec", "web", "--", "sh", "-c", "echo out; echo err >&2"], None)?;
        ensure!(r.code == 0 && r.stdout == "out\n" && r.stderr == "err\n", "kubectl {v}: {r:?}");
        // Exit codes travel in the v4 Status.
        let r = run(&bin, &env.api.url(), &["exec", "web", "--", "sh", "-c", "exit 3"], None)?;
        ensure!(r.code == 3, "kubectl {v}: {r:?}");
        ensure!(r.stderr.contains("command terminated with exit code 3"), "kubectl {v}: {r:?}");
        // stdin reaches the command and its end ends the command.
        let r = run(
            &bin,
            &env.api.url(),
            &["exec", "-i", "web", "--", "sh", "-c", "tr a-z A-Z; echo done"],
            Some("hello spdy\n"),
        )?;
        ensure!(r.code == 0 && r.stdout == "HELLO SPDY\ndone\n", "kubectl {v}: {r:?}");
        // Megabytes of stdin arrive whole.
        let input = "0123456789".repeat(200_000);
        let r = run(&bin, &env.api.url(), &["exec", "-i", "web", "--", "wc", "-c"], Some(&input))?;
        ensure!(r.code == 0 && r.stdout.trim() == "2000000", "kubectl {v}: {r:?}");
        // More output than one SPDY frame, in order.
        let r = run(&bin, &env.api.url(), &["exec", "web", "--", "sh", "-c", "seq 1 20000"], None)?;
        let want: String = (1..=20000).map(|i| format!("{i}\n")).collect();
        ensure!(r.code == 0 && r.stdout == want, "kubectl {v}: {} bytes, stderr {}", r.stdout.len(), r.stderr);
        // Errors before the upgrade.
        let r = run(&bin, &env.api.url(), &["exec", "web", "-c", "nope", "--", "true"], None)?;
        ensure!(r.code == 1 && r.stderr.contains("nope"), "kubectl {v}: {r:?}");
        let log = kubelet_log(&env);
        ensure!(log[log_before.min(log.len())..].contains("transport=SPDY"), "kubectl {v} did not use SPDY:\n{log}");

        // attach -i over SPDY: the main process reads the line and answers.
        let name = format!("listener-{}", v.replace('.', "-"));
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": env.kubelet.node, "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox", "imagePullPolicy": "IfNotPresent", "stdin": true,
                                "command": ["sh", "-c", "read line; echo got $line"]}]},
        }))?;
        let api: Api<Pod> = Api::namespaced(env.api.client()?, "default");
        api.create(&PostParams::default(), &pod).await?;
        let deadline = Instant::now() + Duration::from_secs(90);
        while api.get(&name).await?.status.and_then(|s| s.phase).as_deref() != Some("Running") {
            ensure!(Instant::now() < deadline, "{name} not running: {}", kubelet_log(&env));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let r = run(&bin, &env.api.url(), &["attach", "-i", &name], Some("hello\n"))?;
        ensure!(r.code == 0 && r.stdout == "got hello\n", "kubectl {v} attach -i: {r:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn host_network_pod_forwards_on_the_host() -> Result<()> {
    let Some(env) = Env::start("pf-hostnet")? else { return Ok(()) };
    // A server on the host's loopback, started by a hostNetwork pod.
    let port = e2e::free_port();
    let script = format!(
        "mkdir -p /www; echo host-page > /www/index.html; httpd -f -p 127.0.0.1:{port} -h /www & while true; do sleep 1; done"
    );
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hostweb", "namespace": "default"},
        "spec": {"nodeName": env.kubelet.node, "hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "web", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                 "command": ["sh", "-c", script]}]},
    }))?;
    let api: Api<Pod> = Api::namespaced(env.api.client()?, "default");
    api.create(&PostParams::default(), &pod).await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let page = match api.portforward("hostweb", &[port]).await {
            Ok(mut pf) => {
                let mut s = pf.take_stream(port).ok_or_else(|| anyhow!("no stream"))?;
                s.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
                let mut out = Vec::new();
                s.read_to_end(&mut out).await?;
                String::from_utf8_lossy(&out).into_owned()
            }
            Err(e) => e.to_string(),
        };
        if page.contains("host-page") {
            break;
        }
        ensure!(Instant::now() < deadline, "no answer from the hostNetwork pod: {page}\n{}", kubelet_log(&env));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The same server answers on the host itself: the forward really ended on the host.
    ensure!(http_get(port)?.contains("host-page"));
    Ok(())
}
