//! NetworkPolicy sync benchmark, one command (as root, needs `nft`):
//!
//! ```text
//! cargo run --release -p kubeproxy --example netpol_bench [-- POLICIES PODS]
//! ```
//!
//! In a network namespace of its own (the host's tables are never touched), with POLICIES
//! NetworkPolicies over PODS pods (default 1,000 over 5,000, in 100 namespaces):
//! - the whole filter: computed from the objects, rendered, loaded by `nft -f`;
//! - one change — a pod added, a policy's port changed, a pod deleted — synced as kubeproxy
//!   syncs it (computed again, only the difference written), against the baseline of
//!   writing the whole table again for the same change, measured in the same run.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::networking::v1::NetworkPolicy;
use kubeproxy::backend::run_with_input;
use kubeproxy::netpol::desired::{compute, Desired, PodInfo, Proto};
use kubeproxy::netpol::render;
use serde_json::json;

const NAMESPACES: usize = 100;
const APPS: usize = 10;

fn sh(cmd: &str) -> anyhow::Result<()> {
    let st = Command::new("sh").args(["-c", cmd]).status()?;
    anyhow::ensure!(st.success(), "`{cmd}` failed");
    Ok(())
}

fn pod(i: usize) -> PodInfo {
    let ns = i % NAMESPACES;
    PodInfo {
        namespace: format!("ns-{ns}"),
        name: format!("pod-{i}"),
        labels: [("app".to_string(), format!("app-{}", (i / NAMESPACES) % APPS))].into_iter().collect(),
        ip: std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 244, 0, 2)) + i as u32),
        ports: vec![("http".into(), Proto::Tcp, 8080), ("metrics".into(), Proto::Tcp, 9090)],
    }
}

/// Policy `i`: in namespace i % 100, selecting one app; ingress from the next app of the
/// namespace on a named port, from a labelled namespace, and from an ipBlock; every fourth
/// also restricts egress to the namespace's pods and DNS.
fn policy(i: usize, port: &str) -> NetworkPolicy {
    let ns = i % NAMESPACES;
    let app = (i / NAMESPACES) % APPS;
    let mut spec = json!({
        "podSelector": {"matchLabels": {"app": format!("app-{app}")}},
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {"app": format!("app-{}", (app + 1) % APPS)}}}],
             "ports": [{"port": port}]},
            {"from": [{"namespaceSelector": {"matchLabels": {"team": format!("t{}", ns % 7)}}}],
             "ports": [{"port": 8080}, {"port": 9000, "endPort": 9100}]},
            {"from": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": [format!("192.168.{}.0/24", ns % 256)]}}]}
        ]
    });
    if i.is_multiple_of(4) {
        spec["egress"] = json!([
            {"to": [{"podSelector": {}}]},
            {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
        ]);
        spec["policyTypes"] = json!(["Ingress", "Egress"]);
    }
    serde_json::from_value(
        json!({"metadata": {"namespace": format!("ns-{ns}"), "name": format!("p-{i}")}, "spec": spec}),
    )
    .expect("policy")
}

struct Timed {
    compute: Duration,
    apply: Duration,
    bytes: usize,
}

fn sync(
    old: Option<&Desired>,
    policies: &[NetworkPolicy],
    pods: &[PodInfo],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> anyhow::Result<(Desired, Timed)> {
    let start = Instant::now();
    let refs: Vec<&NetworkPolicy> = policies.iter().collect();
    let (want, problems) = compute(&refs, pods, namespaces);
    anyhow::ensure!(problems.is_empty(), "{problems:?}");
    let script = match old {
        None => render::full(&want),
        Some(old) => render::diff(old, &want).unwrap_or_default(),
    };
    let compute = start.elapsed();
    let start = Instant::now();
    if !script.is_empty() {
        run_with_input("nft", &["-f", "-"], &script)?;
    }
    Ok((want, Timed { compute, apply: start.elapsed(), bytes: script.len() }))
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn inner(n_policies: usize, n_pods: usize) -> anyhow::Result<()> {
    let mut pods: Vec<PodInfo> = (0..n_pods).map(pod).collect();
    let mut policies: Vec<NetworkPolicy> = (0..n_policies).map(|i| policy(i, "http")).collect();
    let namespaces: BTreeMap<String, BTreeMap<String, String>> = (0..NAMESPACES)
        .map(|ns| {
            let labels = [("team".to_string(), format!("t{}", ns % 7))].into_iter().collect();
            (format!("ns-{ns}"), labels)
        })
        .collect();

    let (mut programmed, t) = sync(None, &policies, &pods, &namespaces)?;
    println!(
        "whole filter, {n_policies} policies over {n_pods} pods: compute+render {}, nft -f {} ({} KB; {} chains, {} sets, {} isolated for ingress, {} for egress)",
        ms(t.compute),
        ms(t.apply),
        t.bytes / 1024,
        programmed.chains.len(),
        programmed.peers.len() + programmed.named.len(),
        programmed.ingress.len(),
        programmed.egress.len()
    );

    type Change = Box<dyn Fn(&mut Vec<PodInfo>, &mut Vec<NetworkPolicy>)>;
    let changes: [(&str, Change); 3] = [
        ("a pod added", Box::new(move |pods, _| pods.push(pod(n_pods)))),
        ("a policy's port changed", Box::new(|_, pols| pols[1] = policy(1, "metrics"))),
        (
            "a pod deleted",
            Box::new(|pods, _| {
                pods.remove(17);
            }),
        ),
    ];
    println!(
        "{:<26} {:>12} {:>12} {:>10} {:>14} {:>8}",
        "one change", "incremental", "(compute)", "bytes", "whole table", "ratio"
    );
    for (what, change) in changes.iter() {
        change(&mut pods, &mut policies);
        let (want, inc) = sync(Some(&programmed), &policies, &pods, &namespaces)?;
        // The baseline: the same state written as a whole table.
        let (_, full) = sync(None, &policies, &pods, &namespaces)?;
        programmed = want;
        let (i, f) = (inc.compute + inc.apply, full.compute + full.apply);
        println!(
            "{what:<26} {:>12} {:>12} {:>10} {:>14} {:>7.1}x",
            ms(i),
            ms(inc.compute),
            inc.bytes,
            ms(f),
            f.as_secs_f64() / i.as_secs_f64()
        );
    }
    run_with_input("nft", &["-f", "-"], &render::cleanup())?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let num = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (policies, pods) = (num(1, 1_000), num(2, 5_000));
    if std::env::var("NETPOL_BENCH_INNER").is_ok() {
        return inner(policies, pods);
    }
    let ns = format!("npbench{}", std::process::id());
    sh(&format!("ip netns add {ns}"))?;
    let st = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(std::env::current_exe()?)
        .args([policies.to_string(), pods.to_string()])
        .env("NETPOL_BENCH_INNER", "1")
        .status();
    let _ = sh(&format!("ip netns del {ns}"));
    anyhow::ensure!(st?.success(), "benchmark failed");
    Ok(())
}
