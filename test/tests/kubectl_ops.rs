//! `kubectl logs`, `drain` and `rollout undo` with our kubectl beside the official one, on a
//! real cluster slice: apiserver, controller-manager and a kubelet running pods in Docker.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use e2e::controller_manager::ControllerManager;
use e2e::kubectl::{official_kubectl, our_kubectl, run, Run};
use e2e::kubelet::{require_docker, Kubelet};
use e2e::ApiServer;

fn pod(name: &str, node: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: busybox\n    imagePullPolicy: IfNotPresent\n    command: [sh, -c, '{script}']\n"
    )
}

fn wait_running(k: &Path, url: &str, name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = run(k, url, &["get", "pod", name, "-o", "jsonpath={.status.phase}"], None)?;
        if out.stdout == "Running" {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("pod {name} not running: {out:?}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn same(ours: &Path, official: &Path, url: &str, args: &[&str]) -> Result<Run> {
    let a = run(ours, url, args, None)?;
    let b = run(official, url, args, None)?;
    ensure!(a == b, "kubectl {args:?}:\nours {a:?}\nofficial {b:?}");
    Ok(a)
}

#[test]
fn logs_drain_and_rollout_undo_like_the_official_kubectl() -> Result<()> {
    if !require_docker() {
        return Ok(());
    }
    let Some(official) = official_kubectl() else {
        eprintln!("skipping: no official kubectl");
        return Ok(());
    };
    let ours = our_kubectl();
    let api = ApiServer::start()?;
    let _cm = ControllerManager::start(&api, &[])?;
    let kubelet = Kubelet::start(&api.url(), "ops")?;
    let url = api.url();
    let node = kubelet.node.clone();

    // ---- logs
    let out = run(
        &official,
        &url,
        &["create", "-f", "-"],
        Some(&pod("talker", &node, "echo one; echo two; echo three; sleep 3600")),
    )?;
    ensure!(out.code == 0, "{out:?}");
    wait_running(&official, &url, "talker")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while run(&official, &url, &["logs", "talker"], None)?.stdout != "one\ntwo\nthree\n" {
        ensure!(Instant::now() < deadline, "logs never complete");
        std::thread::sleep(Duration::from_millis(300));
    }
    let out = same(&ours, &official, &url, &["logs", "talker"])?;
    ensure!(out.stdout == "one\ntwo\nthree\n", "{out:?}");
    let out = same(&ours, &official, &url, &["logs", "talker", "--tail=2"])?;
    ensure!(out.stdout == "two\nthree\n", "{out:?}");
    same(&ours, &official, &url, &["logs", "pod/talker", "-c", "main", "--limit-bytes=4"])?;
    let out = same(&ours, &official, &url, &["logs", "talker", "-c", "nope"])?;
    ensure!(out.code == 1, "{out:?}");
    let out = same(&ours, &official, &url, &["logs", "missing"])?;
    ensure!(out.code == 1 && out.stderr.contains("NotFound"), "{out:?}");

    // ---- drain: refused for a pod without a controller, then forced; same words from both
    let mut drains = Vec::new();
    for (bin, label) in [(&ours, "ours"), (&official, "official")] {
        if run(bin, &url, &["get", "pod", "talker"], None)?.code != 0 {
            let out = run(bin, &url, &["create", "-f", "-"], Some(&pod("talker", &node, "sleep 3600")))?;
            ensure!(out.code == 0, "{label}: {out:?}");
            wait_running(bin, &url, "talker")?;
        }
        let refused = run(bin, &url, &["drain", &node, "--timeout=60s"], None)?;
        ensure!(refused.code == 1, "{label}: {refused:?}");
        let forced = run(bin, &url, &["drain", &node, "--force", "--timeout=60s"], None)?;
        ensure!(forced.code == 0, "{label}: {forced:?}");
        let gone = run(bin, &url, &["get", "pod", "talker"], None)?;
        ensure!(gone.code == 1, "{label}: the pod was not evicted: {gone:?}");
        let spec = run(bin, &url, &["get", "node", &node, "-o", "jsonpath={.spec.unschedulable}"], None)?;
        ensure!(spec.stdout == "true", "{label}: {spec:?}");
        let out = run(bin, &url, &["uncordon", &node], None)?;
        ensure!(out.code == 0 && out.stdout == format!("node/{node} uncordoned\n"), "{label}: {out:?}");
        drains.push((refused, forced));
    }
    ensure!(drains[0].0 == drains[1].0, "refused drain:\nours {:?}\nofficial {:?}", drains[0].0, drains[1].0);
    ensure!(drains[0].1 == drains[1].1, "forced drain:\nours {:?}\nofficial {:?}", drains[0].1, drains[1].1);

    // ---- drain against a PodDisruptionBudget: the second eviction waits (429, retried every
    // 5 s) until the Deployment's replacement is ready (6 s after it starts), then the drain
    // completes.
    for (bin, label) in [(&ours, "ours"), (&official, "official")] {
        let manifest = format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: guarded\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: guarded}}\n  template:\n    metadata:\n      labels: {{app: guarded}}\n    spec:\n      nodeName: {node}\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: main\n        image: busybox\n        imagePullPolicy: IfNotPresent\n        command: [sleep, '3600']\n        readinessProbe:\n          exec:\n            command: ['true']\n          initialDelaySeconds: 6\n          periodSeconds: 1\n---\napiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: guarded\nspec:\n  minAvailable: 1\n  selector:\n    matchLabels: {{app: guarded}}\n"
        );
        let out = run(&official, &url, &["apply", "-f", "-"], Some(&manifest))?;
        ensure!(out.code == 0, "{out:?}");
        let deadline = Instant::now() + Duration::from_secs(90);
        while run(&official, &url, &["get", "pdb", "guarded", "-o", "jsonpath={.status.disruptionsAllowed}"], None)?
            .stdout
            != "1"
        {
            ensure!(Instant::now() < deadline, "{label}: the budget never allowed a disruption");
            std::thread::sleep(Duration::from_millis(300));
        }
        let drained = run(bin, &url, &["drain", &node, "--timeout=120s"], None)?;
        ensure!(drained.code == 0, "{label}: {drained:?}");
        let waited = "(will retry after 5s): Cannot evict pod as it would violate the pod's disruption budget.";
        ensure!(drained.stderr.contains(waited), "{label}: no 429 retry: {drained:?}");
        ensure!(drained.stdout.ends_with(&format!("node/{node} drained\n")), "{label}: {drained:?}");
        let out = run(bin, &url, &["delete", "-f", "-"], Some(&manifest))?;
        ensure!(out.code == 0, "{label}: {out:?}");
        let out = run(bin, &url, &["uncordon", &node], None)?;
        ensure!(out.code == 0, "{label}: {out:?}");
    }

    // ---- rollout undo: two revisions, back and forth
    let out = run(&official, &url, &["create", "deployment", "web", "--image=busybox:1", "--replicas=0"], None)?;
    ensure!(out.code == 0, "{out:?}");
    let out = run(&official, &url, &["set", "image", "deployment/web", "busybox=busybox:2"], None)?;
    ensure!(out.code == 0, "{out:?}");
    let image = |k: &Path| {
        run(k, &url, &["get", "deploy", "web", "-o", "jsonpath={.spec.template.spec.containers[0].image}"], None)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while run(&official, &url, &["get", "rs", "-o", "name"], None)?.stdout.lines().count() < 2 {
        ensure!(Instant::now() < deadline, "the deployment controller made no second ReplicaSet");
        std::thread::sleep(Duration::from_millis(300));
    }
    let a = run(&ours, &url, &["rollout", "undo", "deployment/web"], None)?;
    ensure!(a.code == 0 && a.stdout == "deployment.apps/web rolled back\n", "{a:?}");
    ensure!(image(&ours)?.stdout == "busybox:1", "ours did not roll back");
    // The controller records the new revision before the next undo.
    std::thread::sleep(Duration::from_secs(2));
    let b = run(&official, &url, &["rollout", "undo", "deployment/web"], None)?;
    ensure!(a == b, "rollout undo:\nours {a:?}\nofficial {b:?}");
    ensure!(image(&official)?.stdout == "busybox:2", "official did not roll back");
    same(&ours, &official, &url, &["rollout", "undo", "deployment/web", "--to-revision=99"])?;
    let h = same(&ours, &official, &url, &["rollout", "history", "deployment/web"])?;
    ensure!(h.code == 0, "{h:?}");
    Ok(())
}
