//! The kubelet's pod network beyond the node, with the real kubelet on the real Docker
//! engine: egress masquerade and host-gw routes to other nodes' pod networks.
//!
//! "Another host" is a network namespace joined to this host by a veth pair on a
//! 198.18.N.0/30 link (RFC 2544 test addresses). It serves HTTP with busybox httpd, whose
//! CGI answers the client's address (`REMOTE_ADDR`). A Node object named `remote-…` says
//! that host runs pods in 10.246.N.0/24 with InternalIP 198.18.N.2; the namespace holds
//! 10.246.N.2 (a "remote pod") and routes this node's podCIDR back via 198.18.N.1, as its own
//! kubelet would. Then a pod of our kubelet
//! - reaches 198.18.N.2 (outside every pod network) and is seen there as 198.18.N.1, the
//!   host's address: masqueraded;
//! - reaches 10.246.N.2 through the route the kubelet added for the remote Node, and is
//!   seen there with its own pod IP: pod-to-pod traffic keeps its source.
//!
//! Deleting the Node removes the route. Everything (namespace, veth, routes, chain, server)
//! is removed on drop.
//!
//! A pod asking for a `hostPort` is reached on the host's addresses, on 127.0.0.1 and from
//! itself; a
//! second pod asking for the same port is not scheduled on the node until the first is gone,
//! and then the port reaches it; its rule goes with it, also when it is deleted while the
//! kubelet is down.
//!
//! The second test runs two real kubelets on two "hosts" (network namespaces joined by one
//! link, `ip netns exec kubelet …`): each routes the other's podCIDR via the other's
//! InternalIP, and a pod on one reaches a pod on the other keeping its pod IP.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::kubelet::{masq_chain, require_docker, Kubelet};
use e2e::scheduler::Scheduler;
use e2e::{free_port, ApiServer};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn sh(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0]).args(&args[1..]).output().with_context(|| format!("running {args:?}"))?;
    ensure!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The other "host": a network namespace, its veth link and its HTTP server.
struct OtherHost {
    ns: String,
    server: Option<Child>,
    _www: tempfile::TempDir,
}

impl OtherHost {
    fn start(n: u32, our_cidr: &str, port: u16) -> Result<OtherHost> {
        let ns = format!("mk8s-ext-{}", std::process::id());
        let www = tempfile::tempdir()?;
        let mut h = OtherHost { ns: ns.clone(), server: None, _www: www };
        let (host_if, peer_if) = (format!("mkxh{}", std::process::id()), format!("mkxp{}", std::process::id()));
        sh(&["ip", "netns", "add", &ns])?;
        sh(&["ip", "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if])?;
        sh(&["ip", "link", "set", &peer_if, "netns", &ns])?;
        sh(&["ip", "addr", "add", &format!("198.18.{n}.1/30"), "dev", &host_if])?;
        sh(&["ip", "link", "set", &host_if, "up"])?;
        let inns = |args: &[&str]| -> Result<String> {
            let mut all = vec!["ip", "netns", "exec", ns.as_str()];
            all.extend_from_slice(args);
            sh(&all)
        };
        inns(&["ip", "addr", "add", &format!("198.18.{n}.2/30"), "dev", &peer_if])?;
        inns(&["ip", "link", "set", &peer_if, "up"])?;
        inns(&["ip", "link", "set", "lo", "up"])?;
        inns(&["ip", "addr", "add", &format!("10.246.{n}.2/24"), "dev", "lo"])?;
        inns(&["ip", "route", "add", our_cidr, "via", &format!("198.18.{n}.1")])?;

        let cgi = h._www.path().join("cgi-bin");
        std::fs::create_dir_all(&cgi)?;
        let script = cgi.join("addr");
        std::fs::write(&script, "#!/bin/sh\necho 'Content-Type: text/plain'\necho\necho \"$REMOTE_ADDR\"\n")?;
        sh(&["chmod", "755", script.to_str().unwrap_or_default()])?;
        let www: PathBuf = h._www.path().to_path_buf();
        h.server = Some(
            Command::new("ip")
                .args(["netns", "exec", &ns, "busybox", "httpd", "-f", "-p", &format!("0.0.0.0:{port}"), "-h"])
                .arg(&www)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting busybox httpd")?,
        );
        // Wait until it answers inside the namespace.
        let deadline = Instant::now() + Duration::from_secs(10);
        let url = format!("http://198.18.{n}.2:{port}/cgi-bin/addr");
        loop {
            let out = Command::new("ip").args(["netns", "exec", &ns, "busybox", "wget", "-qO-", &url]).output()?;
            if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == format!("198.18.{n}.2") {
                break;
            }
            ensure!(Instant::now() < deadline, "busybox httpd does not answer in {ns}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(h)
    }
}

impl Drop for OtherHost {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Deleting the namespace deletes the veth pair, and with it every route through it.
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_egress_masqueraded_and_routed_to_other_hosts_pods() -> Result<()> {
    if !require_docker() {
        return Ok(());
    }
    let api = ApiServer::start()?;
    let kubelet = Kubelet::start(&api.url(), "kl-net")?;
    let client = api.client()?;
    let n = std::process::id() % 250 + 1;
    let port = free_port();
    let _other = OtherHost::start(n, &kubelet.pod_cidr, port)?;
    let remote_cidr = format!("10.246.{n}.0/24");

    // The Node of the other host, as its kubelet would register it.
    let nodes: Api<Node> = Api::all(client.clone());
    let remote = format!("remote-{}", std::process::id());
    let node: Node = serde_json::from_value(
        json!({"metadata": {"name": remote}, "spec": {"podCIDR": remote_cidr, "podCIDRs": [remote_cidr]}}),
    )?;
    nodes.create(&PostParams::default(), &node).await?;
    let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": format!("198.18.{n}.2")}]}});
    nodes.patch_status(&remote, &PatchParams::default(), &Patch::Merge(&status)).await?;

    // The kubelet routes the remote podCIDR via the remote node's InternalIP.
    let want = format!("{remote_cidr} via 198.18.{n}.2");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let routes = sh(&["ip", "-4", "route", "show", &remote_cidr])?;
        if routes.contains(&want) && routes.contains("proto 107") {
            break;
        }
        ensure!(Instant::now() < deadline, "no route {want:?}: {routes:?}\nkubelet log:\n{}", kubelet.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // No route for our own node (its bridge is local).
    let own = sh(&["ip", "-4", "route", "show", &kubelet.pod_cidr])?;
    ensure!(!own.contains("proto 107"), "route for the node's own podCIDR: {own}");
    let chain = masq_chain(&kubelet.node);
    let rules = sh(&["iptables", "-w", "-t", "nat", "-S", &chain])?;
    ensure!(rules.contains(&format!("-d {remote_cidr} -j RETURN")), "chain {chain}: {rules}");
    ensure!(rules.contains("-j MASQUERADE"), "chain {chain}: {rules}");
    let post = sh(&["iptables", "-w", "-t", "nat", "-S", "POSTROUTING"])?;
    ensure!(post.contains(&format!("-s {} ", kubelet.pod_cidr)) && post.contains(&format!("-j {chain}")), "{post}");

    // A pod asks both addresses who it is.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let script =
        format!("wget -qO- http://198.18.{n}.2:{port}/cgi-bin/addr; wget -qO- http://10.246.{n}.2:{port}/cgi-bin/addr");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "egress"},
        "spec": {"nodeName": kubelet.node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                 "command": ["sh", "-c", script]}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let pod = loop {
        let p = pods.get("egress").await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        if phase == "Succeeded" || phase == "Failed" {
            break p;
        }
        if Instant::now() > deadline {
            bail!("pod not finished: {:?}\nkubelet log:\n{}", p.status, kubelet.log());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let pod_ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).context("no pod IP")?;
    let out = api.kubectl(&["logs", "egress"])?;
    ensure!(out.ok, "kubectl logs: {}", out.stderr);
    let seen: Vec<&str> = out.stdout.lines().collect();
    ensure!(
        seen == [format!("198.18.{n}.1"), pod_ip.clone()],
        "seen {seen:?}; want the host's 198.18.{n}.1 (masqueraded) then the pod IP {pod_ip} (routed)"
    );

    // The Node gone, the route goes.
    nodes.delete(&remote, &DeleteParams::default()).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while sh(&["ip", "-4", "route", "show", &remote_cidr])?.contains("proto 107") {
        ensure!(Instant::now() < deadline, "route to {remote_cidr} left after the Node was deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pods.delete("egress", &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_port_reaches_the_pod_and_goes_with_it() -> Result<()> {
    if !require_docker() {
        return Ok(());
    }
    let api = ApiServer::start()?;
    let mut kubelet = Kubelet::start(&api.url(), "kl-hostport")?;
    let scheduler = Scheduler::start(&api, &[])?;
    let client = api.client()?;
    let host_port = free_port();
    // Any address of this host that is not loopback (the rule matches local destinations).
    let addrs = sh(&["ip", "-4", "-o", "addr", "show", "scope", "global"])?;
    let host_ip = addrs
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .context("this host has no global IPv4 address")?
        .to_string();
    let chain = format!("MK8S-HOSTPORTS-{}", &masq_chain(&kubelet.node)["MK8S-MASQ-".len()..]);
    let rules = || sh(&["iptables", "-w", "-t", "nat", "-S", &chain]).unwrap_or_default();
    // Two pods of the node asking for one host port; each serves its own name.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let web = |name: &str| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": kubelet.node}, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "web", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", "mkdir /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"],
                                     "ports": [{"containerPort": 8080, "hostPort": host_port}]}]}
        }))?)
    };
    // The host port answers with `name` on this host's address and on loopback.
    let answers = |name: &'static str| {
        let urls = [format!("http://{host_ip}:{host_port}/"), format!("http://127.0.0.1:{host_port}/")];
        let (kubelet, rules) = (&kubelet, &rules);
        async move {
            for url in urls {
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    let out = Command::new("curl").args(["-sS", "-m", "3", &url]).output()?;
                    let body = String::from_utf8_lossy(&out.stdout);
                    if body.trim() == name {
                        break;
                    }
                    ensure!(
                        Instant::now() < deadline,
                        "{url}: {body:?} {}\nchain:\n{}\nkubelet log:\n{}",
                        String::from_utf8_lossy(&out.stderr),
                        rules(),
                        kubelet.log()
                    );
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
            anyhow::Ok(())
        }
    };

    pods.create(&PostParams::default(), &web("first")?).await?;
    let first_ip = wait_ip(&pods, "first", || kubelet.log()).await?;
    answers("first").await?;
    // The pod itself, through its own host port (hairpin, masqueraded).
    // (`timeout`: this busybox's wget -T crashes.)
    let get = format!("timeout 5 wget -qO- http://{host_ip}:{host_port}/");
    let out = api.kubectl(&["exec", "first", "--", "sh", "-c", &get])?;
    ensure!(out.ok && out.stdout.trim() == "first", "the pod through its own host port: {out:?}\nchain:\n{}", rules());
    let r = rules();
    ensure!(
        r.contains(&format!("--dport {host_port}")) && r.contains(&format!("--to-destination {first_ip}:8080")),
        "chain {chain}: {r}"
    );

    // The port is taken on the only node: the second pod is not scheduled.
    pods.create(&PostParams::default(), &web("second")?).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p = pods.get("second").await?;
        let cond =
            p.status.and_then(|s| s.conditions).unwrap_or_default().into_iter().find(|c| c.type_ == "PodScheduled");
        if let Some(c) = cond.filter(|c| c.status == "False") {
            let message = c.message.unwrap_or_default();
            ensure!(message.contains("didn't have free ports for the requested pod ports"), "{message}");
            break;
        }
        ensure!(Instant::now() < deadline, "second pod not refused by the scheduler:\n{}", scheduler.log());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The first pod gone, its rule goes, and the port is the second pod's.
    pods.delete("first", &DeleteParams::default()).await?;
    let second_ip = wait_ip(&pods, "second", || kubelet.log()).await?;
    answers("second").await?;
    let r = rules();
    // (The second pod may have the first one's IP again: the rules are told apart by pod.)
    ensure!(!r.contains("default/first"), "the first pod's rule is left: {r}");
    ensure!(
        r.contains("default/second") && r.contains(&format!("--to-destination {second_ip}:8080")),
        "chain {chain}: {r}"
    );
    // Deleted while the kubelet is down: the restarted kubelet removes the rule with the pod.
    kubelet.kill();
    pods.delete("second", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    kubelet.restart()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while rules().contains(&format!("--dport {host_port}")) {
        ensure!(Instant::now() < deadline, "the host port rule is left after the pods were deleted\n{}", kubelet.log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(())
}

/// A network namespace standing for a host: its links, and the kubelet running inside it.
struct NsHost {
    ns: String,
    node: String,
    kubelet: Option<Child>,
    dir: tempfile::TempDir,
}

impl NsHost {
    fn exec(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["ip", "netns", "exec", self.ns.as_str()];
        all.extend_from_slice(args);
        sh(&all)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kubelet.log")).unwrap_or_default()
    }

    /// Start the real kubelet inside the namespace (`ip netns exec`), so its bridge, veths,
    /// routes and iptables rules are the namespace's own.
    fn start_kubelet(&mut self, server: &str, node_ip: &str, pod_cidr: &str) -> Result<()> {
        let log = std::fs::File::create(self.dir.path().join("kubelet.log"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(e2e::kubelet::kubelet_bin())
            .args(["--server", server, "--hostname-override", &self.node, "--node-ip", node_ip])
            .args(["--pod-cidr", pod_cidr, "--port", &free_port().to_string(), "--address", "0.0.0.0"])
            .arg("--root-dir")
            .arg(self.dir.path().join("root"))
            .args(["--log-level", "info,kubelet=debug"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the kubelet in a netns")?;
        self.kubelet = Some(child);
        Ok(())
    }
}

impl Drop for NsHost {
    fn drop(&mut self) {
        if let Some(mut c) = self.kubelet.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        e2e::kubelet::remove_node_containers(&self.node);
        // The namespace takes its bridge, veths, routes and iptables rules with it.
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// Two "hosts" (network namespaces, each running a real kubelet) joined by one link
/// 198.19.N.8/30; each reaches the apiserver on the root namespace over its own link. Each
/// kubelet routes the other's podCIDR via the other's InternalIP (host-gw), and a pod on
/// host A reaches a pod on host B by pod IP, seen there with its own pod IP (no masquerade
/// between pod networks).
#[tokio::test(flavor = "multi_thread")]
async fn two_kubelets_on_two_hosts_route_pod_traffic() -> Result<()> {
    if !require_docker() {
        return Ok(());
    }
    let api = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let pid = std::process::id();
    let n = pid % 250 + 1;
    let mut hosts = Vec::new();
    for (i, name) in ["a", "b"].iter().enumerate() {
        let ns = format!("mk8s-{name}-{pid}");
        sh(&["ip", "netns", "add", &ns])?;
        let h = NsHost { ns, node: format!("twohosts-{name}-{pid}"), kubelet: None, dir: tempfile::tempdir()? };
        // root <-> host link: 198.19.N.(4i+1) in root, .(4i+2) in the host.
        let (root_if, peer_if) = (format!("mkr{name}{pid}"), format!("mkn{name}{pid}"));
        sh(&["ip", "link", "add", &root_if, "type", "veth", "peer", "name", &peer_if])?;
        sh(&["ip", "link", "set", &peer_if, "netns", &h.ns])?;
        sh(&["ip", "addr", "add", &format!("198.19.{n}.{}/30", 4 * i + 1), "dev", &root_if])?;
        sh(&["ip", "link", "set", &root_if, "up"])?;
        h.exec(&["ip", "addr", "add", &format!("198.19.{n}.{}/30", 4 * i + 2), "dev", &peer_if])?;
        h.exec(&["ip", "link", "set", &peer_if, "up"])?;
        h.exec(&["ip", "link", "set", "lo", "up"])?;
        hosts.push(h);
    }
    // The hosts' shared link: A 198.19.N.9, B 198.19.N.10 — their InternalIPs.
    let (la, lb) = (format!("mkla{pid}"), format!("mklb{pid}"));
    hosts[0].exec(&["ip", "link", "add", &la, "type", "veth", "peer", "name", &lb])?;
    hosts[0].exec(&["ip", "link", "set", &lb, "netns", &hosts[1].ns])?;
    hosts[0].exec(&["ip", "addr", "add", &format!("198.19.{n}.9/30"), "dev", &la])?;
    hosts[0].exec(&["ip", "link", "set", &la, "up"])?;
    hosts[1].exec(&["ip", "addr", "add", &format!("198.19.{n}.10/30"), "dev", &lb])?;
    hosts[1].exec(&["ip", "link", "set", &lb, "up"])?;

    let cidrs = ["10.246.1.0/24", "10.246.2.0/24"];
    let ips = [format!("198.19.{n}.9"), format!("198.19.{n}.10")];
    for (i, h) in hosts.iter_mut().enumerate() {
        let server = format!("http://198.19.{n}.{}:{}", 4 * i + 1, api.port);
        h.start_kubelet(&server, &ips[i], cidrs[i])?;
    }

    // Each host routes the other's podCIDR via the other's InternalIP, and not its own.
    for (i, h) in hosts.iter().enumerate() {
        let other = 1 - i;
        let want = format!("{} via {} ", cidrs[other], ips[other]);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let routes = h.exec(&["ip", "-4", "route"])?;
            if routes.lines().any(|l| l.starts_with(&want) && l.contains("proto 107")) {
                ensure!(!routes.lines().any(|l| l.starts_with(cidrs[i]) && l.contains("proto 107")), "{routes}");
                break;
            }
            ensure!(Instant::now() < deadline, "{}: no route {want:?}: {routes}\nkubelet log:\n{}", h.ns, h.log());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    // A server pod on B answering the client's address, and a client pod on A.
    let pods: Api<Pod> = Api::namespaced(api.client()?, "default");
    let server_script =
        "mkdir -p /www/cgi-bin && printf '#!/bin/sh\\necho\\necho $REMOTE_ADDR\\n' > /www/cgi-bin/addr \
                         && chmod 755 /www/cgi-bin/addr && exec httpd -f -p 8080 -h /www";
    let mk = |name: &str, node: &str, script: &str, restart: &str| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": restart, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                     "command": ["sh", "-c", script]}]}
        }))?)
    };
    pods.create(&PostParams::default(), &mk("server", &hosts[1].node, server_script, "Always")?).await?;
    let server_ip = wait_ip(&pods, "server", || hosts[1].log()).await?;
    ensure!(server_ip.starts_with("10.246.2."), "server IP {server_ip}");
    let client_script = format!("until wget -qO- http://{server_ip}:8080/cgi-bin/addr; do sleep 0.5; done; sleep 600");
    pods.create(&PostParams::default(), &mk("client", &hosts[0].node, &client_script, "Always")?).await?;
    let client_ip = wait_ip(&pods, "client", || hosts[0].log()).await?;
    ensure!(client_ip.starts_with("10.246.1."), "client IP {client_ip}");

    // The client's output, from Docker (the apiserver cannot reach the hosts' kubelets).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new(e2e::kubelet::docker_bin())
            .args(["ps", "-q", "--filter", &format!("label=minik8s.io/node={}", hosts[0].node)])
            .output()?;
        let mut seen = String::new();
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let logs = Command::new(e2e::kubelet::docker_bin()).args(["logs", id]).output()?;
            seen.push_str(&String::from_utf8_lossy(&logs.stdout));
        }
        // busybox httpd in the pod listens dual-stack: IPv4 clients show as [::ffff:a.b.c.d].
        let lines: Vec<&str> = seen
            .lines()
            .map(|l| l.trim().trim_start_matches("[::ffff:").trim_end_matches(']'))
            .filter(|l| !l.is_empty())
            .collect();
        if !lines.is_empty() {
            ensure!(lines == [client_ip.as_str()], "server on B saw {lines:?}; want the client's pod IP {client_ip}");
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "client on A got no answer from {server_ip}\nA:\n{}\n{}\nB:\n{}\n{}\nforward: {} {}\ncontainers:\n{}",
            hosts[0].exec(&["ip", "route"]).unwrap_or_default(),
            hosts[0].exec(&["iptables-save"]).unwrap_or_default(),
            hosts[1].exec(&["ip", "route"]).unwrap_or_default(),
            hosts[1].exec(&["iptables-save"]).unwrap_or_default(),
            hosts[0].exec(&["cat", "/proc/sys/net/ipv4/ip_forward"]).unwrap_or_default(),
            hosts[1].exec(&["cat", "/proc/sys/net/ipv4/ip_forward"]).unwrap_or_default(),
            all_logs(&hosts)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(())
}

/// Wait until pod `name` runs; its IP (`log`: what to show when it does not).
async fn wait_ip(pods: &Api<Pod>, name: &str, log: impl Fn() -> String) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let p = pods.get(name).await?;
        let st = p.status.clone().unwrap_or_default();
        if let (Some("Running"), Some(ip)) = (st.phase.as_deref(), st.pod_ip.clone()) {
            return Ok(ip);
        }
        if Instant::now() > deadline {
            bail!("{name} not running: {st:?}\nkubelet log:\n{}", log());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every container's output on the hosts (for failure messages).
fn all_logs(hosts: &[NsHost]) -> String {
    let mut out = String::new();
    for h in hosts {
        for (id, name, state) in e2e::kubelet::node_containers(&h.node) {
            let logs = Command::new(e2e::kubelet::docker_bin()).args(["logs", &id]).output();
            let text =
                logs.map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)));
            out.push_str(&format!("{name} ({state}): {}\n", text.unwrap_or_default()));
        }
    }
    out
}
