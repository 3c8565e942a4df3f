//! The kubelet's VXLAN overlay (`--network-backend vxlan`, flannel's vxlan design) against
//! host-gw, with the real kubelet's pod network code in network namespaces, no Docker.
//!
//! Each "node" is a network namespace running the real kubelet binary with `--network-only`
//! (the same `PodNetwork` and Node watch a full kubelet runs: bridge, pod veths, egress
//! masquerade, host-gw routes or the VXLAN device, its neighbours and forwarding entries,
//! the Node's VTEP annotations), started with `ip netns exec`. Its "pods" are network
//! namespaces holding a `sleep`, which the kubelet plugs into its bridge as it plugs a pause
//! container's namespace (`--network-only-pod PID=IP`). The test writes the Node objects
//! (podCIDR, InternalIP) to a real apiserver, as registration and node IPAM would; each
//! node reaches the apiserver over a management link of its own to this host.
//!
//! The underlay is routed: nodes A (192.168.101.2/24) and B (192.168.102.2/24) sit on
//! different subnets behind a "router" namespace, with an underlay MTU of 1400. Then:
//! - host-gw cannot route A's pods to B's (B's InternalIP is not on-link for A): a TCP
//!   connection fails;
//! - vxlan: the device (VNI 1, port 8472, local = InternalIP, nolearning, MTU 1350, the
//!   podCIDR's network address), the annotations, the routes, neighbours and forwarding
//!   entries are there; the pods' veths and bridges have MTU 1350; TCP (1 MB echoed back
//!   intact) and UDP (up to a full-MTU datagram) pass, and the router forwards only UDP
//!   8472, never a plain pod packet;
//! - a third Node with a garbage VTEP annotation is skipped with a Warning event about it,
//!   A and B keep talking; fixed, it gets its entries; deleted, they go.
//!
//! A second test puts two nodes on one shared subnet, where host-gw works.
//!
//! The traffic is made by this test process: a thread joins a pod's namespace (`setns`)
//! to open its sockets there. Everything (namespaces, links, processes) goes on drop.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::podnet::{
    create_node, forwarded, in_netns, pod_traffic, prerequisites, sh, tcp_echo, Lab, BACKEND_TYPE, PUBLIC_IP, VTEP_MAC,
    VXLAN_DEVICE,
};
use e2e::ApiServer;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

/// Poll `check` (which says what it saw when false) until it holds.
async fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<(bool, String)>) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let (ok, seen) = check()?;
        if ok {
            return Ok(seen);
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}; last seen:\n{seen}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn vxlan_overlay_across_routed_subnets() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let started = Instant::now();
    let api = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let nodes: Api<Node> = Api::all(api.client()?);
    let mut lab = Lab::new()?;
    let tag = lab.id;

    // The routed underlay: A and B on two subnets behind the router, MTU 1400.
    let router = lab.add_ns("r")?;
    let host_a = lab.add_node("a")?;
    let host_b = lab.add_node("b")?;
    let (ns_a, ns_b) = (lab.ns("a"), lab.ns("b"));
    sh(&format!(
        "set -e; ip netns exec {router} sysctl -qw net.ipv4.ip_forward=1; \
         ip -n {router} link add ra type veth peer name eth0 netns {ns_a}; \
         ip -n {router} link add rb type veth peer name eth0 netns {ns_b}; \
         for l in ra rb; do ip -n {router} link set $l mtu 1400 up; done; \
         ip -n {router} addr add 192.168.101.1/24 dev ra; ip -n {router} addr add 192.168.102.1/24 dev rb; \
         ip -n {ns_a} link set eth0 mtu 1400 up; ip -n {ns_a} addr add 192.168.101.2/24 dev eth0; \
         ip -n {ns_a} route add default via 192.168.101.1; \
         ip -n {ns_b} link set eth0 mtu 1400 up; ip -n {ns_b} addr add 192.168.102.2/24 dev eth0; \
         ip -n {ns_b} route add default via 192.168.102.1; \
         ip netns exec {router} iptables -w -t mangle -A PREROUTING -p udp --dport 8472 -m comment --comment vxlan-8472; \
         ip netns exec {router} iptables -w -t mangle -A PREROUTING -d 10.244.0.0/16 -m comment --comment plain-pod-traffic"
    ))?;
    let pod_a = lab.add_pod("a1", "10.244.1.2")?;
    let pod_b = lab.add_pod("b1", "10.244.2.2")?;
    let (node_a, node_b, node_c) = (format!("ovl-a-{tag}"), format!("ovl-b-{tag}"), format!("ovl-c-{tag}"));
    create_node(&nodes, &node_a, "10.244.1.0/24", "192.168.101.2", json!({})).await?;
    create_node(&nodes, &node_b, "10.244.2.0/24", "192.168.102.2", json!({})).await?;
    let server_a = format!("http://{host_a}:{}", api.port);
    let server_b = format!("http://{host_b}:{}", api.port);

    // host-gw: B's InternalIP is not on A's link, so there is no route and no way.
    lab.start_kubelet("a", &node_a, &server_a, "192.168.101.2", "10.244.1.0/24", "host-gw", &[&pod_a])?;
    lab.start_kubelet("b", &node_b, &server_b, "192.168.102.2", "10.244.2.0/24", "host-gw", &[&pod_b])?;
    for (n, name) in [("a", &node_a), ("b", &node_b)] {
        wait_for(&format!("host-gw kubelet {n} tries its route"), Duration::from_secs(60), || {
            let log = lab.log(n);
            Ok((log.contains("cannot add the route"), log))
        })
        .await?;
        let routes = lab.exec(n, "ip -4 route")?;
        ensure!(!routes.contains("proto 107"), "{name}: host-gw route across subnets: {routes}");
    }
    let addr_b: SocketAddr = "10.244.2.2:7000".parse()?;
    let _listener = in_netns(&pod_b.ns, || TcpListener::bind(("0.0.0.0", 7000)))?;
    match tcp_echo(&pod_a.ns, addr_b, b"hello".to_vec()) {
        Err(_) => {}
        Ok(_) => bail!("host-gw across routed subnets reached B's pod"),
    }
    ensure!(forwarded(&lab, "plain-pod-traffic")?.0 > 0, "the failed attempt should have gone (plain) to the router");
    ensure!(forwarded(&lab, "vxlan-8472")?.0 == 0, "VXLAN traffic under host-gw");
    drop(_listener);

    // vxlan: the same nodes and pods, the kubelets restarted with the overlay.
    lab.exec("r", "iptables -w -t mangle -Z PREROUTING")?;
    lab.start_kubelet("a", &node_a, &server_a, "192.168.101.2", "10.244.1.0/24", "vxlan", &[&pod_a])?;
    lab.start_kubelet("b", &node_b, &server_b, "192.168.102.2", "10.244.2.0/24", "vxlan", &[&pod_b])?;
    let mut macs = BTreeMap::new();
    for (n, name) in [("a", &node_a), ("b", &node_b)] {
        let deadline = Instant::now() + Duration::from_secs(60);
        let node = loop {
            let node = nodes.get(name).await?;
            let a = node.metadata.annotations.clone().unwrap_or_default();
            if a.contains_key(VTEP_MAC) {
                break node;
            }
            ensure!(Instant::now() < deadline, "{name}: no VTEP annotation: {a:?}\nkubelet log:\n{}", lab.log(n));
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let a = node.metadata.annotations.unwrap_or_default();
        let dev = lab.exec(n, &format!("ip -d link show {VXLAN_DEVICE}"))?;
        let mac = a[VTEP_MAC].clone();
        ensure!(dev.contains(&format!("link/ether {mac} ")), "{name}: annotation {mac} is not the device's: {dev}");
        let ip = if n == "a" { "192.168.101.2" } else { "192.168.102.2" };
        ensure!(a.get(BACKEND_TYPE).map(String::as_str) == Some("vxlan"), "{a:?}");
        ensure!(a.get(PUBLIC_IP).map(String::as_str) == Some(ip), "{a:?}");
        for want in
            ["vxlan id 1 ", &format!("local {ip} "), "dstport 8472 ", "nolearning ", "mtu 1350 ", "state UNKNOWN"]
        {
            ensure!(dev.contains(want), "{name}: {want:?} missing from the device: {dev}");
        }
        let net = if n == "a" { "10.244.1.0/32" } else { "10.244.2.0/32" };
        let addrs = lab.exec(n, &format!("ip -4 addr show dev {VXLAN_DEVICE}"))?;
        ensure!(addrs.contains(net), "{name}: device address {net} missing: {addrs}");
        macs.insert(n, mac);
    }
    // Routes, neighbours and forwarding entries towards the other node.
    for (n, other, cidr, gw, underlay) in [
        ("a", "b", "10.244.2.0/24", "10.244.2.0", "192.168.102.2"),
        ("b", "a", "10.244.1.0/24", "10.244.1.0", "192.168.101.2"),
    ] {
        let mac = macs[other].clone();
        wait_for(&format!("{n}: overlay towards {other}"), Duration::from_secs(30), || {
            let route = lab.exec(n, &format!("ip -4 route show {cidr}"))?;
            let neigh = lab.exec(n, &format!("ip -4 neigh show dev {VXLAN_DEVICE}"))?;
            let fdb = lab.exec(n, &format!("bridge fdb show dev {VXLAN_DEVICE}"))?;
            let ok = route.contains(&format!("via {gw} dev {VXLAN_DEVICE} proto 107 onlink"))
                && neigh.contains(&format!("{gw} lladdr {mac} PERMANENT"))
                && fdb.contains(&format!("{mac} dst {underlay} self permanent"));
            Ok((ok, format!("route: {route}neigh: {neigh}fdb: {fdb}log:\n{}", lab.log(n))))
        })
        .await?;
    }
    // The pods' links and the bridges have the overlay's MTU.
    for (n, pod) in [("a", &pod_a), ("b", &pod_b)] {
        let eth0 = sh(&format!("ip -n {} link show eth0", pod.ns))?;
        ensure!(eth0.contains("mtu 1350 "), "{}: pod eth0 MTU: {eth0}", pod.ns);
        let links = lab.exec(n, "ip -o link show")?;
        let bridge = links.lines().find(|l| l.contains(": mk8s") && !l.contains(VXLAN_DEVICE) && !l.contains("master"));
        ensure!(bridge.is_some_and(|l| l.contains("mtu 1350 ")), "{n}: bridge MTU: {links}");
    }

    // Pod to pod across the overlay, both ways.
    pod_traffic(&pod_a, &pod_b, 7001).with_context(|| format!("A -> B\nA:\n{}\nB:\n{}", lab.log("a"), lab.log("b")))?;
    pod_traffic(&pod_b, &pod_a, 7002).context("B -> A")?;
    // 1 MB each way and back: at least 4 MiB crossed the router, all of it in UDP 8472.
    let (packets, bytes) = forwarded(&lab, "vxlan-8472")?;
    let (plain, _) = forwarded(&lab, "plain-pod-traffic")?;
    ensure!(bytes >= 4 << 20, "the router forwarded {bytes} bytes ({packets} packets) of UDP 8472 for 4 MB");
    ensure!(plain == 0, "the router forwarded {plain} plain pod packets");
    let tx = lab.exec("a", &format!("cat /sys/class/net/{VXLAN_DEVICE}/statistics/tx_bytes"))?;
    ensure!(tx.trim().parse::<u64>()? >= 2 << 20, "A's VXLAN device sent {tx} bytes for 2 MB");
    eprintln!("UDP 8472 through the router: {packets} packets (GSO bursts), {bytes} bytes");

    // A third node with a garbage VTEP annotation: skipped, with an event; A and B go on.
    create_node(
        &nodes,
        &node_c,
        "10.244.3.0/24",
        "192.168.103.2",
        json!({VTEP_MAC: "not-a-mac", BACKEND_TYPE: "vxlan", PUBLIC_IP: "192.168.103.2"}),
    )
    .await?;
    let events: Api<Event> = Api::namespaced(api.client()?, "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = events.list(&ListParams::default()).await?;
        let about_c: Vec<&Event> =
            list.items.iter().filter(|e| e.involved_object.name.as_deref() == Some(node_c.as_str())).collect();
        let from: Vec<String> = about_c
            .iter()
            .filter(|e| e.reason.as_deref() == Some("InvalidVtep") && e.type_.as_deref() == Some("Warning"))
            .filter(|e| e.message.as_deref().is_some_and(|m| m.contains("not-a-mac")))
            .filter_map(|e| e.source.as_ref().and_then(|s| s.host.clone()))
            .collect();
        if from.contains(&node_a) && from.contains(&node_b) {
            ensure!(about_c.iter().all(|e| e.involved_object.kind.as_deref() == Some("Node")), "{about_c:?}");
            break;
        }
        ensure!(Instant::now() < deadline, "no InvalidVtep events about {node_c} from both nodes: {about_c:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for n in ["a", "b"] {
        ensure!(lab.log(n).contains("node left out of the overlay"), "{n}: no warning logged");
        let route = lab.exec(n, "ip -4 route show 10.244.3.0/24")?;
        ensure!(route.trim().is_empty(), "{n}: a route to the garbage node: {route}");
    }
    pod_traffic(&pod_a, &pod_b, 7003).context("A -> B with a garbage node in the cluster")?;

    // Fixed, it is a peer; deleted, its entries go.
    let good = "02:00:00:0c:0c:0c";
    nodes
        .patch(&node_c, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {VTEP_MAC: good}}})))
        .await?;
    for n in ["a", "b"] {
        wait_for(&format!("{n}: overlay towards the fixed node"), Duration::from_secs(30), || {
            let route = lab.exec(n, "ip -4 route show 10.244.3.0/24")?;
            let neigh = lab.exec(n, &format!("ip -4 neigh show dev {VXLAN_DEVICE}"))?;
            let fdb = lab.exec(n, &format!("bridge fdb show dev {VXLAN_DEVICE}"))?;
            let ok = route.contains(&format!("via 10.244.3.0 dev {VXLAN_DEVICE}"))
                && neigh.contains(&format!("10.244.3.0 lladdr {good} PERMANENT"))
                && fdb.contains(&format!("{good} dst 192.168.103.2"));
            Ok((ok, format!("route: {route}neigh: {neigh}fdb: {fdb}")))
        })
        .await?;
    }
    nodes.delete(&node_c, &DeleteParams::default()).await?;
    for n in ["a", "b"] {
        wait_for(&format!("{n}: the deleted node's entries go"), Duration::from_secs(30), || {
            let route = lab.exec(n, "ip -4 route show 10.244.3.0/24")?;
            let neigh = lab.exec(n, &format!("ip -4 neigh show dev {VXLAN_DEVICE}"))?;
            let fdb = lab.exec(n, &format!("bridge fdb show dev {VXLAN_DEVICE}"))?;
            let ok = route.trim().is_empty() && !neigh.contains("10.244.3.0") && !fdb.contains(good);
            Ok((ok, format!("route: {route}neigh: {neigh}fdb: {fdb}")))
        })
        .await?;
    }
    pod_traffic(&pod_a, &pod_b, 7004).context("A -> B after the third node left")?;
    // The kubelets read their entries back: through every change above, each wrote its
    // peer's neighbour and forwarding entry once.
    for (n, other) in [("a", "b"), ("b", "a")] {
        let log = lab.log(n);
        for what in ["overlay neighbour", "overlay forwarding entry"] {
            let writes = log.lines().filter(|l| l.contains(what) && l.contains(&macs[other])).count();
            ensure!(writes == 1, "{n} wrote the {what} of {other} {writes} times:\n{log}");
        }
    }
    eprintln!("overlay test took {:?}", started.elapsed());
    Ok(())
}

/// Two nodes on one shared subnet: host-gw routes `podCIDR via InternalIP`, and pods talk.
#[tokio::test(flavor = "multi_thread")]
async fn host_gw_on_one_shared_subnet() -> Result<()> {
    if !prerequisites() {
        return Ok(());
    }
    let api = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let nodes: Api<Node> = Api::all(api.client()?);
    let mut lab = Lab::new()?;
    let tag = lab.id;
    let host_d = lab.add_node("d")?;
    let host_e = lab.add_node("e")?;
    let (ns_d, ns_e) = (lab.ns("d"), lab.ns("e"));
    sh(&format!(
        "set -e; ip -n {ns_d} link add eth0 type veth peer name eth0 netns {ns_e}; \
         ip -n {ns_d} addr add 192.168.110.2/24 dev eth0; ip -n {ns_d} link set eth0 up; \
         ip -n {ns_e} addr add 192.168.110.3/24 dev eth0; ip -n {ns_e} link set eth0 up"
    ))?;
    let pod_d = lab.add_pod("d1", "10.244.4.2")?;
    let pod_e = lab.add_pod("e1", "10.244.5.2")?;
    let (node_d, node_e) = (format!("ovl-d-{tag}"), format!("ovl-e-{tag}"));
    create_node(&nodes, &node_d, "10.244.4.0/24", "192.168.110.2", json!({})).await?;
    create_node(&nodes, &node_e, "10.244.5.0/24", "192.168.110.3", json!({})).await?;
    let server_d = format!("http://{host_d}:{}", api.port);
    let server_e = format!("http://{host_e}:{}", api.port);
    lab.start_kubelet("d", &node_d, &server_d, "192.168.110.2", "10.244.4.0/24", "host-gw", &[&pod_d])?;
    lab.start_kubelet("e", &node_e, &server_e, "192.168.110.3", "10.244.5.0/24", "host-gw", &[&pod_e])?;
    for (n, cidr, gw) in [("d", "10.244.5.0/24", "192.168.110.3"), ("e", "10.244.4.0/24", "192.168.110.2")] {
        wait_for(&format!("{n}: host-gw route"), Duration::from_secs(60), || {
            let route = lab.exec(n, &format!("ip -4 route show {cidr}"))?;
            Ok((route.contains(&format!("via {gw} dev eth0 proto 107")), format!("{route}\n{}", lab.log(n))))
        })
        .await?;
        let links = lab.exec(n, "ip -o link show")?;
        ensure!(!links.contains(VXLAN_DEVICE), "{n}: a VXLAN device under host-gw: {links}");
    }
    // Pods on a 1500-byte link here: the datagrams of pod_traffic fit either way.
    pod_traffic(&pod_d, &pod_e, 7101).with_context(|| format!("D -> E\nD:\n{}\nE:\n{}", lab.log("d"), lab.log("e")))?;
    pod_traffic(&pod_e, &pod_d, 7102).context("E -> D")?;
    // No VTEP annotations under host-gw.
    let a = nodes.get(&node_d).await?.metadata.annotations.unwrap_or_default();
    ensure!(!a.contains_key(VTEP_MAC), "{a:?}");
    Ok(())
}
