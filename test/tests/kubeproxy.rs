//! kubeproxy end to end, inside network namespaces the tests create (the host's rules are
//! never touched): Services and EndpointSlices created through the real apiserver, the real
//! kubeproxy programming real iptables / nftables in a "node" namespace, busybox httpd
//! "pods" in their own namespaces, curl as the client. DNS and Ingress (nginx) likewise.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use e2e::kubeproxy::{prerequisites, Lab};
use e2e::{eventually, ApiServer};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn slice_json(name: &str, svc: &str, ips: &[&str], port_name: &str) -> serde_json::Value {
    let eps: Vec<_> =
        ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-a"})).collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "endpoints": eps,
        "ports": [{"name": port_name, "port": 8080, "protocol": "TCP"}]})
}

async fn create_service(client: &kube::Client, v: serde_json::Value) -> Result<Service> {
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    Ok(api.create(&PostParams::default(), &serde_json::from_value(v)?).await?)
}

async fn put_slice(client: &kube::Client, v: serde_json::Value) -> Result<()> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let name = v["metadata"]["name"].as_str().context("name")?.to_string();
    let pp = PatchParams::apply("kubeproxy-e2e").force();
    match api.get_opt(&name).await? {
        Some(mut cur) => {
            let mut new: EndpointSlice = serde_json::from_value(v)?;
            new.metadata.resource_version = cur.metadata.resource_version.take();
            api.replace(&name, &PostParams::default(), &new).await?;
        }
        None => {
            let _ = pp;
            api.create(&PostParams::default(), &serde_json::from_value(v)?).await?;
        }
    }
    Ok(())
}

fn cluster_ip(s: &Service) -> String {
    s.spec.as_ref().and_then(|s| s.cluster_ip.clone()).unwrap_or_default()
}

/// `n` GETs of `url`; how many answers each pod gave.
fn spread(lab: &Lab, from: Option<usize>, url: &str, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let body = lab.curl(from, url).unwrap_or_else(|code| format!("curl exit {code}"));
        *seen.entry(body).or_default() += 1;
    }
    seen
}

/// The proxy rules as the kernel lists them, without counters (to compare across restarts).
/// nftables' listing is made one entry a line, each prefixed with its chain, map or set
/// (`chain service-…-default/web/tcp/http { :: meta l4proto tcp dnat to …`), and a set's
/// or map's elements one a line, so that a change shows as the entries it touched.
fn rules(lab: &Lab, mode: &str) -> String {
    let cmd = if mode == "nftables" { "nft list table ip kube-proxy" } else { "iptables-save" };
    let out = lab.node_sh(cmd);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // Comments, and affinity set elements (client state with expiry, not rules).
    let keep = |l: &str| !l.starts_with('#') && !l.contains(" expires ");
    if mode != "nftables" {
        return text
            .lines()
            .filter(|l| keep(l))
            .map(|l| match l.find(" [") {
                Some(i) if l.starts_with(':') => l[..i].to_string(),
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
    }
    let mut out = Vec::new();
    let mut block = String::new();
    let mut in_elements = false;
    for line in text.lines().map(str::trim).filter(|l| keep(l)) {
        if ["chain ", "map ", "set "].iter().any(|p| line.starts_with(p)) && line.ends_with('{') {
            block = line.to_string();
            continue;
        }
        let mut rest = line;
        if let Some(e) = rest.strip_prefix("elements = {") {
            in_elements = true;
            rest = e;
        }
        if in_elements {
            let end = rest.ends_with('}');
            for elem in rest.trim_end_matches('}').split(',').map(str::trim).filter(|e| !e.is_empty()) {
                out.push(format!("{block} :: element {elem}"));
            }
            in_elements = !end;
        } else if !rest.is_empty() && rest != "}" {
            out.push(format!("{block} :: {rest}"));
        }
    }
    out.join("\n")
}

async fn wait_synced(lab: &mut Lab) -> Result<()> {
    let r = eventually(WAIT, || {
        let ok = lab.metric("kubeproxy_sync_proxy_rules_last_timestamp_seconds").unwrap_or(0.0) > 0.0;
        async move { ok }
    })
    .await;
    if r.is_err() {
        bail!("kubeproxy did not sync (running={}); log:\n{}", lab.kubeproxy_running(), lab.kubeproxy_log());
    }
    Ok(())
}

/// The whole Service scenario in one proxy mode.
async fn service_routing(mode: &str) -> Result<()> {
    let tool = if mode == "nftables" { "nft" } else { "iptables-restore" };
    if !prerequisites(&["ip", "curl", "busybox", tool]) {
        return Ok(());
    }
    let api = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let client = api.client()?;
    let mut lab = Lab::new(3)?;
    let web = create_service(
        &client,
        json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "selector": {"app": "web"}, "externalIPs": ["192.0.2.10"],
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}}),
    )
    .await?;
    let empty = create_service(
        &client,
        json!({"metadata": {"name": "empty", "namespace": "default"},
            "spec": {"type": "NodePort", "ports": [{"name": "http", "port": 80, "nodePort": 30081}]}}),
    )
    .await?;
    let sticky = create_service(
        &client,
        json!({"metadata": {"name": "sticky", "namespace": "default"},
            "spec": {"sessionAffinity": "ClientIP", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
    )
    .await?;
    let (cip, empty_ip, sticky_ip) = (cluster_ip(&web), cluster_ip(&empty), cluster_ip(&sticky));
    let owned_ips: Vec<String> = lab.pods.iter().map(|p| p.ip.clone()).collect();
    let pod_ips: Vec<&str> = owned_ips.iter().map(String::as_str).collect();
    put_slice(&client, slice_json("web-abc", "web", &pod_ips, "http")).await?;
    put_slice(&client, slice_json("sticky-abc", "sticky", &pod_ips[..2], "http")).await?;

    lab.start_kubeproxy(api.port, &["--proxy-mode", mode])?;
    wait_synced(&mut lab).await?;
    let url = format!("http://{cip}/");
    eventually(WAIT, || {
        let ok = lab.curl(None, &url).is_ok_and(|b| b.starts_with("pod"));
        async move { ok }
    })
    .await
    .with_context(|| format!("cluster IP never answered; log:\n{}", lab.kubeproxy_log()))?;

    // Host → cluster IP: load spreads over all three endpoints.
    let seen = spread(&lab, None, &url, 30);
    assert_eq!(seen.keys().cloned().collect::<Vec<_>>(), ["pod0", "pod1", "pod2"], "{mode}: {seen:?}");
    // Node port on the node IP and on localhost (route_localnet).
    let seen = spread(&lab, None, &format!("http://{}:30080/", lab.node_ip), 30);
    assert_eq!(seen.len(), 3, "{mode} node port: {seen:?}");
    assert!(
        lab.curl(None, "http://127.0.0.1:30080/").is_ok_and(|b| b.starts_with("pod")),
        "{mode}: localhost node port"
    );
    // External IP.
    let seen = spread(&lab, None, "http://192.0.2.10/", 30);
    assert_eq!(seen.len(), 3, "{mode} external IP: {seen:?}");
    // Session affinity ClientIP: one client sticks to one endpoint.
    let seen = spread(&lab, None, &format!("http://{sticky_ip}/"), 20);
    assert!(seen.len() == 1 && seen.keys().all(|k| k.starts_with("pod")), "{mode} session affinity: {seen:?}");
    // Pod → service, and hairpin (pod0 reaching itself through the service).
    let seen = spread(&lab, Some(0), &url, 30);
    assert!(seen.contains_key("pod0") && seen.len() == 3, "{mode} pod-to-service and hairpin: {seen:?}");
    // A service without endpoints is rejected at once (connection refused, exit 7), not left hanging.
    assert_eq!(lab.curl(None, &format!("http://{empty_ip}/")), Err(7), "{mode}: empty service must reject");
    assert_eq!(
        lab.curl(None, &format!("http://{}:30081/", lab.node_ip)),
        Err(7),
        "{mode}: empty node port must reject"
    );
    assert_eq!(lab.curl(Some(1), &format!("http://{empty_ip}/")), Err(7), "{mode}: empty service from a pod");
    // Health and metrics.
    assert_eq!(lab.metrics("/healthz"), "ok");
    assert!(lab.metrics("/metrics").contains("kubeproxy_sync_proxy_rules_duration_seconds_count"));
    assert!(lab.metric("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds").unwrap_or(0.0) > 0.0);

    // Remove pod2's endpoint: once the rules no longer mention it, no request reaches it.
    let before_removal = rules(&lab, mode);
    let mut fewer = slice_json("web-abc", "web", &pod_ips[..2], "http");
    // As the EndpointSlice controller writes it: when the change happened.
    let changed_at = k8s_openapi::jiff::Timestamp::now();
    fewer["metadata"]["annotations"] =
        json!({"endpoints.kubernetes.io/last-change-trigger-time": changed_at.to_string()});
    put_slice(&client, fewer).await?;
    let gone = lab.pods[2].ip.clone();
    eventually(WAIT, || {
        let ok = !rules(&lab, mode).contains(&gone);
        async move { ok }
    })
    .await
    .context("removed endpoint still in the rules")?;
    // kube-proxy's network programming latency: from that time to rules carrying the change.
    let programmed = lab.metric("kubeproxy_network_programming_duration_seconds_count").unwrap_or(0.0);
    let took = lab.metric("kubeproxy_network_programming_duration_seconds_sum").unwrap_or(-1.0);
    assert!(
        programmed == 1.0 && (0.0..60.0).contains(&took),
        "{mode}: network programming count {programmed}, sum {took}"
    );
    // The change touched only web's rules: every entry that appeared or vanished is in one of
    // web's chains or names the removed endpoint; the other services' are as before.
    let lines = |s: &str| s.lines().map(str::to_string).collect::<BTreeSet<String>>();
    let (was, now) = (lines(&before_removal), lines(&rules(&lab, mode)));
    let changed: Vec<&String> = was
        .symmetric_difference(&now)
        // iptables' chain declarations (`:KUBE-SEP-… - [0:0]`) carry no service name.
        .filter(|l| !l.starts_with(':'))
        .collect();
    assert!(!changed.is_empty(), "{mode}: nothing changed");
    let foreign: Vec<&&String> = changed.iter().filter(|l| !l.contains("default/web") && !l.contains(&gone)).collect();
    assert!(foreign.is_empty(), "{mode}: an endpoint change of web touched other rules: {foreign:#?}");
    let seen = spread(&lab, None, &url, 30);
    assert!(!seen.contains_key("pod2") && seen.len() == 2, "{mode} after removing pod2: {seen:?}");

    // Add it back, then restart kubeproxy: traffic keeps flowing, rules converge with no duplicates.
    put_slice(&client, slice_json("web-abc", "web", &pod_ips, "http")).await?;
    eventually(WAIT, || {
        let ok = rules(&lab, mode).contains(&gone);
        async move { ok }
    })
    .await?;
    let before = rules(&lab, mode);
    lab.stop_kubeproxy();
    assert!(lab.curl(None, &url).is_ok(), "{mode}: rules stay while kubeproxy is down");
    lab.start_kubeproxy(api.port, &["--proxy-mode", mode])?;
    wait_synced(&mut lab).await?;
    let after = rules(&lab, mode);
    if mode == "nftables" {
        // A full rewrite lists chains in creation order: compare the (sorted) lines, counts included.
        let sorted = |s: &str| {
            let mut v: Vec<String> = s.lines().map(str::to_string).collect();
            v.sort();
            v
        };
        assert_eq!(sorted(&before), sorted(&after), "{mode}: rules after restart differ");
    } else {
        assert_eq!(before, after, "{mode}: rules after restart differ");
    }
    if mode == "iptables" {
        let jumps = after.lines().filter(|l| l.contains("-A PREROUTING") && l.contains("KUBE-SERVICES")).count();
        assert_eq!(jumps, 1, "one PREROUTING jump, not duplicated:\n{after}");
    }
    let seen = spread(&lab, None, &url, 30);
    assert_eq!(seen.len(), 3, "{mode} after restart: {seen:?}");

    // --cleanup removes everything.
    lab.stop_kubeproxy();
    let out = lab.kubeproxy_cleanup();
    assert!(out.status.success(), "cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
    let left = String::from_utf8_lossy(&lab.node_sh("iptables-save; nft list ruleset").stdout).into_owned();
    assert!(!left.contains("KUBE-") && !left.contains("kube-proxy"), "{mode}: left after cleanup:\n{left}");
    assert!(lab.curl(None, &url).is_err(), "{mode}: cluster IP still answers after cleanup");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn kubeproxy_iptables_mode_routes_cluster_ip_and_node_port() -> Result<()> {
    service_routing("iptables").await
}

#[tokio::test(flavor = "multi_thread")]
async fn kubeproxy_nftables_mode_routes_cluster_ip_and_node_port() -> Result<()> {
    service_routing("nftables").await
}

#[tokio::test(flavor = "multi_thread")]
async fn kubeproxy_ipvs_mode_fails_clearly_without_ip_vs() -> Result<()> {
    if !prerequisites(&["ip"]) {
        return Ok(());
    }
    if std::path::Path::new("/proc/net/ip_vs").exists() {
        eprintln!("this kernel has ip_vs; the failure path is not reachable here");
        return Ok(());
    }
    let api = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let mut lab = Lab::new(0)?;
    lab.start_kubeproxy(api.port, &["--proxy-mode", "ipvs"])?;
    eventually(WAIT, || {
        let done = !lab.kubeproxy_running();
        async move { done }
    })
    .await?;
    let log = lab.kubeproxy_log();
    assert!(log.contains("can't use the IPVS proxier") && log.contains("ip_vs"), "{log}");
    Ok(())
}

/// A fake upstream resolver on the host side of the lab: answers every A query with 203.0.113.9.
fn fake_upstream(bind_ip: &str) -> Result<std::net::SocketAddr> {
    let sock = std::net::UdpSocket::bind(format!("{bind_ip}:0"))?;
    let addr = sock.local_addr()?;
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, peer)) = sock.recv_from(&mut buf) {
            if n < 12 {
                continue;
            }
            let mut r = buf[..n].to_vec();
            r[2] |= 0x80; // QR
            r[3] = 0x80; // RA, NOERROR
            r[6..8].copy_from_slice(&[0, 1]); // ANCOUNT
            r[8..12].copy_from_slice(&[0, 0, 0, 0]);
            r.truncate(12 + question_len(&buf[12..n]));
            r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 203, 0, 113, 9]);
            let _ = sock.send_to(&r, peer);
        }
    });
    Ok(addr)
}

/// One A query over TCP (2-byte length framing); the raw response.
fn dns_over_tcp(server: &str, name: &str) -> Result<Vec<u8>> {
    use std::io::{Read, Write};
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let mut s = std::net::TcpStream::connect(server)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(&(q.len() as u16).to_be_bytes())?;
    s.write_all(&q)?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    let mut resp = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut resp)?;
    if resp.len() < 12 || resp[0..2] != [0x12, 0x34] || u16::from_be_bytes([resp[6], resp[7]]) == 0 {
        bail!("bad DNS/TCP response {resp:?}");
    }
    Ok(resp)
}

fn question_len(q: &[u8]) -> usize {
    let mut i = 0;
    while i < q.len() && q[i] != 0 {
        i += q[i] as usize + 1;
    }
    (i + 5).min(q.len())
}

#[tokio::test(flavor = "multi_thread")]
async fn kubeproxy_dns_and_nginx_ingress() -> Result<()> {
    if !prerequisites(&["ip", "curl", "busybox", "iptables-restore", "nginx"]) {
        return Ok(());
    }
    let api = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let client = api.client()?;
    let mut lab = Lab::new(3)?;
    let upstream = fake_upstream(&lab.host_ip)?;
    let web = create_service(
        &client,
        json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
    )
    .await?;
    let other = create_service(
        &client,
        json!({"metadata": {"name": "other", "namespace": "default"},
            "spec": {"ports": [{"name": "http", "port": 8000, "targetPort": 8080}]}}),
    )
    .await?;
    create_service(
        &client,
        json!({"metadata": {"name": "db", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 8080}]}}),
    )
    .await?;
    let ips: Vec<String> = lab.pods.iter().map(|p| p.ip.clone()).collect();
    put_slice(&client, slice_json("web-1", "web", &[&ips[0], &ips[1]], "http")).await?;
    put_slice(&client, slice_json("other-1", "other", &[&ips[2]], "http")).await?;
    put_slice(&client, slice_json("db-1", "db", &[&ips[0], &ips[1]], "http")).await?;
    let ingresses: Api<Ingress> = Api::namespaced(client.clone(), "default");
    let ing: Ingress = serde_json::from_value(json!({"metadata": {"name": "my", "namespace": "default"},
        "spec": {"ingressClassName": "nginx", "rules": [{"host": "myservice.com", "http": {"paths": [
            {"path": "/web", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
            {"path": "/other", "pathType": "Exact", "backend": {"service": {"name": "other", "port": {"name": "http"}}}}]}}]}}))?;
    ingresses.create(&PostParams::default(), &ing).await?;

    // The DNS server is reached by pods through a UDP Service, as kube-dns is: its endpoint is
    // this node's address, where kubeproxy serves DNS.
    let dns_svc = create_service(
        &client,
        json!({"metadata": {"name": "kube-dns", "namespace": "default"},
            "spec": {"ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}}),
    )
    .await?;
    let dns_ip = cluster_ip(&dns_svc);
    put_slice(
        &client,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kube-dns-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "kube-dns"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["192.168.77.1"], "conditions": {"ready": true}}],
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]}),
    )
    .await?;
    // Pods' resolv.conf as the kubelet writes it for dnsPolicy ClusterFirst.
    for p in &lab.pods {
        let dir = format!("/etc/netns/{}", p.ns);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            format!("{dir}/resolv.conf"),
            format!("nameserver {dns_ip}\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"),
        )?;
    }
    let ingress_dir = lab.dir.path().join("ingress");
    let ingress_dir_s = ingress_dir.display().to_string();
    let upstream_s = upstream.to_string();
    lab.start_kubeproxy(
        api.port,
        &[
            "--dns-bind-address",
            "0.0.0.0:53",
            "--dns-upstream",
            &upstream_s,
            "--node-ip",
            "192.168.77.1",
            "--ingress-dir",
            &ingress_dir_s,
            "--ingress-http-port",
            "80",
        ],
    )?;
    wait_synced(&mut lab).await?;

    let lookup = |args: &str| {
        String::from_utf8_lossy(&lab.node_sh(&format!("busybox nslookup {args} 127.0.0.1")).stdout).into_owned()
    };
    let (web_ip, other_ip) = (cluster_ip(&web), cluster_ip(&other));
    eventually(WAIT, || {
        let ok = lookup("web.default.svc.cluster.local").contains(&web_ip);
        async move { ok }
    })
    .await
    .with_context(|| format!("service name never resolved; log:\n{}", lab.kubeproxy_log()))?;
    let db = lookup("db.default.svc.cluster.local");
    assert!(db.contains(&ips[0]) && db.contains(&ips[1]) && !db.contains(&ips[2]), "headless: {db}");
    let srv = lookup("-type=srv _http._tcp.other.default.svc.cluster.local");
    assert!(srv.contains("8000") && srv.contains("other.default.svc.cluster.local"), "SRV: {srv}");
    let pod = lookup("10-244-0-12.default.pod.cluster.local");
    assert!(pod.contains("10.244.0.12"), "pod record: {pod}");
    let nx = lookup("nope.default.svc.cluster.local");
    assert!(nx.contains("NXDOMAIN"), "unknown service: {nx}");
    let fwd = lookup("example.org");
    assert!(fwd.contains("203.0.113.9"), "forwarded upstream: {fwd}");
    let host = lookup("myservice.com");
    assert!(host.contains("192.168.77.1"), "ingress host: {host}");

    // DNS over TCP, from the host to the node's uplink address.
    let tcp = dns_over_tcp(&format!("{}:53", lab.uplink_ip), "web.default.svc.cluster.local")?;
    let web_octets: Vec<u8> = web_ip.split('.').filter_map(|o| o.parse().ok()).collect();
    assert!(tcp.windows(4).any(|w| w == web_octets.as_slice()), "DNS over TCP answer lacks {web_ip}: {tcp:?}");
    // From a pod, through the UDP cluster IP of kube-dns.
    let via_service = String::from_utf8_lossy(
        &lab.pod_sh(1, &format!("busybox nslookup web.default.svc.cluster.local {dns_ip}")).stdout,
    )
    .into_owned();
    assert!(via_service.contains(&web_ip), "DNS through its UDP service from a pod: {via_service}");
    // From a pod: service names through the search path, and the ingress by host + path.
    let seen = spread(&lab, Some(2), "http://web/", 20);
    assert!(seen.keys().all(|k| k == "pod0" || k == "pod1") && seen.len() == 2, "web from a pod: {seen:?}");
    eventually(WAIT, || {
        let ok = lab.curl(Some(2), "http://myservice.com/web").is_ok_and(|b| b == "pod0" || b == "pod1");
        async move { ok }
    })
    .await
    .with_context(|| format!("ingress never routed /web; log:\n{}", lab.kubeproxy_log()))?;
    let seen = spread(&lab, Some(2), "http://myservice.com/web", 20);
    assert_eq!(
        seen.keys().cloned().collect::<BTreeSet<_>>(),
        ["pod0".to_string(), "pod1".to_string()].into(),
        "{seen:?}"
    );
    assert_eq!(lab.curl(Some(0), "http://myservice.com/other"), Ok("pod2".to_string()));
    let code = |lab: &Lab, host: &str, path: &str| {
        String::from_utf8_lossy(
            &lab.node_sh(&format!(
                "curl -s -o /dev/null -w %{{http_code}} -H \"Host: {host}\" http://192.168.77.1{path}"
            ))
            .stdout,
        )
        .into_owned()
    };
    assert_eq!(code(&lab, "myservice.com", "/other/x"), "404", "Exact path must not match a longer one");
    assert_eq!(code(&lab, "myservice.com", "/webx"), "404", "Prefix matches whole path elements");
    assert_eq!(code(&lab, "unknown.com", "/web"), "404", "no default backend");

    // The ingress' status carries the node address.
    eventually(WAIT, || {
        let ingresses = ingresses.clone();
        async move {
            ingresses
                .get("my")
                .await
                .ok()
                .and_then(|i| i.status)
                .and_then(|s| s.load_balancer)
                .and_then(|l| l.ingress)
                .is_some_and(|v| v.iter().any(|x| x.ip.as_deref() == Some("192.168.77.1")))
        }
    })
    .await
    .context("ingress status not updated")?;

    // Reload only on change: an irrelevant change, then a relevant one -> exactly one reload.
    let reloads = lab.metric("kubeproxy_ingress_nginx_reloads_total").unwrap_or(0.0);
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})))
        .await?;
    ingresses
        .patch(
            "my",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rules": [
                {"host": "myservice.com", "http": {"paths": [
                    {"path": "/web", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                    {"path": "/other", "pathType": "Exact", "backend": {"service": {"name": "other", "port": {"name": "http"}}}}]}},
                {"host": "second.com", "http": {"paths": [
                    {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "other", "port": {"number": 8000}}}}]}}]}})),
        )
        .await?;
    eventually(WAIT, || {
        let ok = code(&lab, "second.com", "/") == "200";
        async move { ok }
    })
    .await
    .context("new ingress host never served")?;
    assert_eq!(lab.metric("kubeproxy_ingress_nginx_reloads_total").unwrap_or(0.0), reloads + 1.0, "exactly one reload");
    let _ = other_ip;
    Ok(())
}
