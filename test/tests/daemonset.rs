//! The DaemonSet controller on a real cluster (apiserver, scheduler, controller-manager and
//! kubelets on Docker): one pod per node, placed by the scheduler through the pod's required
//! `matchFields metadata.name` affinity; a node tainted NoSchedule without a toleration gets
//! none until the taint goes; a node that joins gets one; `kubectl rollout status` (the
//! official kubectl) waits for a rollout and a template change replaces every pod; a node that
//! is removed loses its pod, which the pod garbage collector then force-deletes (no kubelet is
//! left to finish it).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::eventually;
use e2e::kubelet::Cluster;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

fn node_of(p: &Pod) -> String {
    p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The live (not terminating) daemon pods, by node name.
async fn pods_by_node(pods: &Api<Pod>) -> Vec<(String, Pod)> {
    let list = pods.list(&ListParams::default().labels("app=agent")).await.map(|l| l.items).unwrap_or_default();
    let mut out: Vec<(String, Pod)> =
        list.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).map(|p| (node_of(&p), p)).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Wait until exactly one Ready pod runs on each of `nodes` and there are no others.
async fn wait_one_per_node(c: &Cluster, pods: &Api<Pod>, nodes: &[&str]) -> Result<Vec<Pod>> {
    let mut want: Vec<String> = nodes.iter().map(|s| s.to_string()).collect();
    want.sort();
    let deadline = Instant::now() + WAIT;
    loop {
        let now = pods_by_node(pods).await;
        let on: Vec<String> = now.iter().map(|(n, _)| n.clone()).collect();
        if on == want && now.iter().all(|(_, p)| ready(p)) {
            return Ok(now.into_iter().map(|(_, p)| p).collect());
        }
        if Instant::now() > deadline {
            bail!("daemon pods on {on:?}, want one Ready pod on each of {want:?}\n{}", c.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn status(sets: &Api<DaemonSet>) -> DaemonSetStatus {
    sets.get("agent").await.ok().and_then(|d| d.status).unwrap_or_default()
}

fn kubectl(c: &Cluster, args: &[&str]) -> Result<String> {
    let out = c.api.kubectl(args)?;
    ensure!(out.ok, "kubectl {}: {}{}", args.join(" "), out.stdout, out.stderr);
    Ok(out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_pod_per_eligible_node() -> Result<()> {
    // A short pod-gc quarantine, so the removed node's pod is collected within the test.
    let Some(mut c) = Cluster::start_with("ds", 2, &["--pod-gc-orphan-quarantine=2s"])? else { return Ok(()) };
    let client = c.api.client()?;
    let nodes_api: Api<Node> = Api::all(client.clone());
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let (n1, n2) = (c.nodes[0].node.clone(), c.nodes[1].node.clone());
    eventually(WAIT, || async {
        let names: Vec<String> = nodes_api
            .list(&ListParams::default())
            .await
            .map(|l| l.items.into_iter().filter_map(|n| n.metadata.name).collect())
            .unwrap_or_default();
        names.contains(&n1) && names.contains(&n2)
    })
    .await
    .context("both nodes registered")?;
    kubectl(&c, &["taint", "nodes", &n2, "dedicated=special:NoSchedule"])?;

    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                "command": ["sh", "-c", "sleep 3600"]}]}}
        }
    }))?;
    sets.create(&PostParams::default(), &ds).await?;

    // The tainted node gets none.
    let first = wait_one_per_node(&c, &pods, &[&n1]).await?;
    let spec = first[0].spec.clone().unwrap_or_default();
    let terms = spec
        .affinity
        .and_then(|a| a.node_affinity)
        .and_then(|n| n.required_during_scheduling_ignored_during_execution)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    let fields = terms.first().and_then(|t| t.match_fields.clone()).unwrap_or_default();
    ensure!(
        fields.len() == 1 && fields[0].key == "metadata.name" && fields[0].values.as_deref() == Some(&[n1.clone()][..]),
        "the pod's node affinity: {terms:?}"
    );
    ensure!(spec.tolerations.iter().flatten().any(|t| t.key.as_deref() == Some("node.kubernetes.io/unreachable")));
    eventually(WAIT, || async {
        let s = status(&sets).await;
        s.desired_number_scheduled == 1 && s.number_ready == 1 && s.number_available == Some(1)
    })
    .await
    .context("status: 1 desired, 1 ready")?;
    let out = kubectl(&c, &["rollout", "status", "daemonset/agent", "--timeout=120s"])?;
    ensure!(out.contains("daemon set \"agent\" successfully rolled out"), "{out}");

    // A node that joins gets one; the untainted node gets one.
    let n3 = c.add_node("ds")?.node.clone();
    wait_one_per_node(&c, &pods, &[&n1, &n3]).await?;
    kubectl(&c, &["taint", "nodes", &n2, "dedicated-"])?;
    let all = wait_one_per_node(&c, &pods, &[&n1, &n2, &n3]).await?;

    // A template change replaces every pod, one node at a time (maxUnavailable 1).
    let uids: Vec<String> = all.iter().filter_map(|p| p.metadata.uid.clone()).collect();
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {"rollout": "2"}}}}});
    sets.patch("agent", &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let out = kubectl(&c, &["rollout", "status", "daemonset/agent", "--timeout=180s"])?;
    ensure!(out.contains("successfully rolled out"), "{out}");
    let after = wait_one_per_node(&c, &pods, &[&n1, &n2, &n3]).await?;
    ensure!(after.iter().all(|p| !uids.contains(&p.metadata.uid.clone().unwrap_or_default())), "not all replaced");
    let s = status(&sets).await;
    ensure!(s.desired_number_scheduled == 3 && s.updated_number_scheduled == Some(3), "{s:?}");

    // A removed node loses its pod.
    let gone = c.nodes.pop().context("three nodes")?;
    drop(gone);
    nodes_api.delete(&n3, &DeleteParams::default()).await?;
    let deadline = Instant::now() + WAIT;
    loop {
        let on: Vec<String> = pods_by_node(&pods).await.into_iter().map(|(n, _)| n).collect();
        let s = status(&sets).await;
        if !on.contains(&n3) && s.desired_number_scheduled == 2 {
            break;
        }
        ensure!(Instant::now() < deadline, "the removed node's pod stays: {on:?}, {s:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // With no kubelet to finish it, the pod would stay Terminating: the pod garbage collector
    // force-deletes it once the node is confirmed gone.
    let deadline = Instant::now() + WAIT;
    loop {
        let list = pods.list(&ListParams::default().labels("app=agent")).await?.items;
        let left: Vec<String> =
            list.iter().filter(|p| node_of(p) == n3).filter_map(|p| p.metadata.name.clone()).collect();
        if left.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the removed node's pods are still there (Terminating): {left:?}\n{}",
            c.cm.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
