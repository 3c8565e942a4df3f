//! The netlink path against the kernel, as root, in a network namespace of its own (the
//! host's rules are never touched): a table programmed with `nft -f` and then changed over
//! netlink must list exactly as the same final state written from scratch by `nft`. This
//! proves the encoding rule by rule (`nft` prints the kernel's expressions back as text, so
//! an expression encoded differently from nft's own shows up as a different line).

use std::collections::BTreeMap;
use std::process::Command;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kubeproxy::iptables::Config;
use kubeproxy::model::{service_ports, NodeInfo};
use kubeproxy::nftables::Table;
use kubeproxy::{backend, nft_netlink};
use serde_json::json;

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    assert!(out.status.success(), "`{cmd}`: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn prerequisites() -> bool {
    let root = sh("id -u").trim() == "0";
    let nft =
        Command::new("sh").args(["-c", "command -v nft && command -v ip"]).output().is_ok_and(|o| o.status.success());
    if root && nft {
        return true;
    }
    let msg = format!("nft netlink test needs root and nft, ip (root={root}, tools={nft})");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
    eprintln!("SKIP: {msg}");
    false
}

fn service(name: &str, ip: &str, extra: serde_json::Value) -> Service {
    let mut spec = json!({"clusterIP": ip, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec})).expect("service")
}

fn slice(svc: &str, ips: &[&str]) -> EndpointSlice {
    let eps: Vec<_> = ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect();
    serde_json::from_value(json!({"metadata": {"name": format!("{svc}-x"), "namespace": "default",
        "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "endpoints": eps, "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}))
    .expect("slice")
}

/// `nft list table` as chain/map/set → its lines: rules in order, elements sorted.
fn listing() -> BTreeMap<String, Vec<String>> {
    let text = sh("nft list table ip kube-proxy");
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut block = String::new();
    let mut in_elements = false;
    for line in text.lines().map(str::trim) {
        if ["chain ", "map ", "set "].iter().any(|p| line.starts_with(p)) && line.ends_with('{') {
            block = line.to_string();
            out.entry(block.clone()).or_default();
            continue;
        }
        let mut rest = line;
        if let Some(e) = rest.strip_prefix("elements = {") {
            in_elements = true;
            rest = e;
        }
        let entry = out.entry(block.clone()).or_default();
        if in_elements {
            in_elements = !rest.ends_with('}');
            entry.extend(
                rest.trim_end_matches('}').split(',').map(str::trim).filter(|e| !e.is_empty()).map(String::from),
            );
            entry.sort();
        } else if !rest.is_empty() && rest != "}" {
            entry.push(rest.to_string());
        }
    }
    out
}

fn scenario() {
    // A /9 cluster CIDR: the masquerade rule's `ip saddr !=` needs a mask, not whole bytes.
    let cfg = Config { cluster_cidr: Some("10.128.0.0/9".into()), ..Default::default() };
    let node = NodeInfo::named("node-a");
    let svcs0 = vec![
        service("a", "10.96.0.1", json!({})),
        service(
            "b",
            "10.96.0.2",
            json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}),
        ),
        service("c", "10.96.0.3", json!({"sessionAffinity": "ClientIP"})),
        service("e", "10.96.0.5", json!({"ports": [{"name": "http", "port": 53, "protocol": "UDP"}]})),
    ];
    let slices0 = vec![
        slice("a", &["10.128.0.1", "10.128.0.2", "10.128.0.3"]),
        slice("b", &["10.128.1.1", "10.128.1.2"]),
        slice("c", &["10.128.2.1", "10.128.2.2"]),
    ];
    let arcs = |v: Vec<kubeproxy::model::ServicePort>| v.into_iter().map(std::sync::Arc::new).collect::<Vec<_>>();
    let p0 = arcs(service_ports(&svcs0, &slices0, &node));
    // a: one endpoint replaced and one more; b: no endpoints left; e: gone; f: new, with an
    // endpoint a also has (a shared hairpin element).
    let mut svcs1: Vec<Service> = svcs0.iter().filter(|s| s.metadata.name.as_deref() != Some("e")).cloned().collect();
    svcs1.push(service("f", "10.96.0.6", json!({})));
    let slices1 = vec![
        slice("a", &["10.128.0.9", "10.128.0.2", "10.128.0.3", "10.128.0.4"]),
        slice("c", &["10.128.2.1", "10.128.2.2"]),
        slice("f", &["10.128.0.2", "10.128.3.1"]),
    ];
    let p1 = arcs(service_ports(&svcs1, &slices1, &node));

    let apply_script = |tx: &kubeproxy::nftables::Transaction| {
        backend::run_with_input("nft", &["-f", "-"], &tx.script(&cfg)).expect("nft -f");
    };
    let mut table = Table::default();
    apply_script(&table.sync(&p0, &cfg).expect("first sync"));
    let tx = table.sync(&p1, &cfg).expect("changes");
    assert!(!tx.full);
    let batch = nft_netlink::encode(&tx.ops).unwrap_or_else(|| panic!("not all encodable:\n{}", tx.script(&cfg)));
    nft_netlink::send(&batch).unwrap_or_else(|e| panic!("{e:#}\n{}", tx.script(&cfg)));
    let changed = listing();

    sh("nft delete table ip kube-proxy");
    let mut fresh = Table::default();
    apply_script(&fresh.sync(&p1, &cfg).expect("fresh sync"));
    let written = listing();
    for (block, lines) in &written {
        assert_eq!(
            changed.get(block),
            Some(lines),
            "{block}\nover netlink: {:#?}\nby nft: {lines:#?}",
            changed.get(block)
        );
    }
    assert_eq!(changed.len(), written.len(), "blocks: {:?} vs {:?}", changed.keys(), written.keys());
    assert!(changed.keys().any(|b| b.contains("/a/tcp/http")), "{:?}", changed.keys());

    // A refusal is an error naming the operation, and changes nothing.
    let before = listing();
    let bad = vec![kubeproxy::nftables::Op::AddRule {
        chain: "no-such-chain".into(),
        rule: kubeproxy::nftables::Rule::Text(String::new()),
    }];
    assert!(nft_netlink::encode(&bad).is_none());
    let bad = vec![
        kubeproxy::nftables::Op::FlushChain(
            changed
                .keys()
                .find(|b| b.starts_with("chain service-"))
                .map(|b| b[6..b.len() - 2].to_string())
                .expect("a chain"),
        ),
        kubeproxy::nftables::Op::DeleteChain("no-such-chain".into()),
    ];
    let err = nft_netlink::send(&nft_netlink::encode(&bad).expect("encodable")).expect_err("refused");
    assert!(format!("{err:#}").contains("operation 2"), "{err:#}");
    assert_eq!(listing(), before, "a refused transaction changes nothing");
}

#[test]
fn changes_sent_over_netlink_list_as_nft_writes_them() {
    if !prerequisites() {
        return;
    }
    let ns = format!("kpnl{}", std::process::id());
    sh(&format!("ip netns add {ns}"));
    let path = format!("/run/netns/{ns}");
    let result = std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(&path).expect("netns file");
        // SAFETY: a namespace descriptor; setns changes only this thread (and what it spawns).
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        scenario();
    })
    .join();
    sh(&format!("ip netns del {ns}"));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
