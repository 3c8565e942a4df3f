//! `metrics.k8s.io/v1beta1` from the kubelets' `/stats/summary`: a real kubelet runs a
//! CPU-burning pod in Docker; the official `kubectl top nodes|pods` and ours print its usage.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use e2e::kubectl::{our_kubectl, run};
use e2e::kubelet::{require_docker, Kubelet};
use e2e::{kubectl_bin, ApiServer};
use serde_json::Value;

fn words(l: &str) -> Vec<&str> {
    l.split_whitespace().collect()
}

#[test]
fn kubectl_top_reads_kubelet_stats() -> Result<()> {
    if !require_docker() {
        return Ok(());
    }
    if !kubectl_bin().exists() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "official kubectl missing");
        return Ok(());
    }
    let api = ApiServer::start()?;
    let kubelet = Kubelet::start(&api.url(), "top")?;
    let url = api.url();
    let official = kubectl_bin();
    let ours = our_kubectl();
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: burner\nspec:\n  nodeName: {}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: spin\n    image: busybox\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c, 'while true; do :; done']\n  - name: idle\n    image: busybox\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c, 'sleep 3600']\n",
        kubelet.node
    );
    let out = run(&official, &url, &["create", "-f", "-"], Some(&pod))?;
    ensure!(out.code == 0, "{out:?}");

    // Discovery says the Metrics API is there; no pods elsewhere.
    let out = run(&official, &url, &["api-resources", "--api-group=metrics.k8s.io", "--no-headers"], None)?;
    ensure!(
        out.code == 0
            && out.stdout.lines().any(|l| words(l) == ["pods", "metrics.k8s.io/v1beta1", "true", "PodMetrics"]),
        "{out:?}"
    );

    // Wait for the pod to run and its metrics to appear.
    let deadline = Instant::now() + Duration::from_secs(90);
    let top_pods = loop {
        let out = run(&official, &url, &["top", "pods"], None)?;
        if out.code == 0 && out.stdout.contains("burner") {
            break out;
        }
        if Instant::now() > deadline {
            bail!("no pod metrics: {out:?}\nkubelet log:\n{}", kubelet.log());
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let lines: Vec<&str> = top_pods.stdout.lines().collect();
    ensure!(words(lines[0]) == ["NAME", "CPU(cores)", "MEMORY(bytes)"], "{top_pods:?}");
    let row = words(lines[1]);
    ensure!(row[0] == "burner" && row[1].ends_with('m') && row[2].ends_with("Mi"), "{top_pods:?}");
    // A busy loop uses CPU (it is measured, not asserted against a timing).
    let millis: i64 = row[1].trim_end_matches('m').parse()?;
    ensure!(millis > 0, "the spinning container shows no CPU: {top_pods:?}");

    // The raw objects.
    let out =
        run(&official, &url, &["get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/burner"], None)?;
    let m: Value = serde_json::from_str(&out.stdout)?;
    ensure!(m["kind"] == "PodMetrics" && m["containers"].as_array().map(Vec::len) == Some(2), "{out:?}");

    // kubectl top nodes, official then ours: same header, the node with usage and percentages.
    for (bin, label) in [(&official, "official"), (&ours, "ours")] {
        let out = run(bin, &url, &["top", "nodes"], None)?;
        ensure!(out.code == 0, "{label}: {out:?}");
        let lines: Vec<&str> = out.stdout.lines().collect();
        ensure!(words(lines[0]) == ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"], "{label}: {out:?}");
        let row = lines.iter().map(|l| words(l)).find(|w| w[0] == kubelet.node);
        ensure!(
            row.as_ref().is_some_and(|w| w.len() == 5
                && w[1].ends_with('m')
                && w[2].ends_with('%')
                && w[3].ends_with("Mi")
                && w[4].ends_with('%')),
            "{label}: {out:?}"
        );
        let out = run(bin, &url, &["top", "pods", "--containers"], None)?;
        ensure!(out.code == 0, "{label}: {out:?}");
        let lines: Vec<Vec<&str>> = out.stdout.lines().map(words).collect();
        ensure!(lines[0] == ["POD", "NAME", "CPU(cores)", "MEMORY(bytes)"], "{label}: {out:?}");
        ensure!(
            lines.iter().any(|w| w[..2] == ["burner", "spin"]) && lines.iter().any(|w| w[..2] == ["burner", "idle"]),
            "{label}: {out:?}"
        );
        let out = run(bin, &url, &["top", "pods", "-A"], None)?;
        ensure!(
            out.code == 0
                && words(out.stdout.lines().next().unwrap_or_default())
                    == ["NAMESPACE", "NAME", "CPU(cores)", "MEMORY(bytes)"],
            "{label}: {out:?}"
        );
        // A namespace without pods.
        let out = run(bin, &url, &["top", "pods", "-n", "kube-system"], None)?;
        ensure!(
            out.code == 0 && out.stderr.trim() == "No resources found in kube-system namespace.",
            "{label}: {out:?}"
        );
    }
    // Ours prints the same header bytes as the official one.
    let a = run(&official, &url, &["top", "pods"], None)?;
    let b = run(&ours, &url, &["top", "pods"], None)?;
    ensure!(a.stdout.lines().next() == b.stdout.lines().next(), "{a:?}\n{b:?}");

    let out = run(&official, &url, &["delete", "pod", "burner", "--wait=true", "--timeout=60s"], None)?;
    ensure!(out.code == 0, "{out:?}");
    Ok(())
}
