//! End-to-end tests of the `scheduler` binary against the real apiserver, with Nodes
//! created through the API (no kubelet): placement honours node selectors and affinity,
//! taints, resources (including extended ones), pod anti-affinity and topology spread;
//! a pod that fits nowhere gets `PodScheduled=False` and a `FailedScheduling` event with
//! Kubernetes' message, and is scheduled once a fitting node is added; `schedulerName`
//! is honoured; leader election, /healthz and /metrics work.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use e2e::scheduler::{node, pod, Scheduler};
use e2e::{eventually, ApiServer};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

async fn create_node(c: &kube::Client, n: Value) -> Result<()> {
    let api: Api<Node> = Api::all(c.clone());
    api.create(&PostParams::default(), &serde_json::from_value(n)?).await?;
    Ok(())
}

async fn create_pod(c: &kube::Client, p: Value) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(c.clone(), "default");
    api.create(&PostParams::default(), &serde_json::from_value(p)?).await?;
    Ok(())
}

async fn node_of(c: &kube::Client, name: &str) -> Option<String> {
    let api: Api<Pod> = Api::namespaced(c.clone(), "default");
    api.get(name).await.ok().and_then(|p| p.spec.and_then(|s| s.node_name)).filter(|n| !n.is_empty())
}

/// Wait for the pod to be bound; its node.
async fn wait_bound(c: &kube::Client, name: &str, sched: &Scheduler) -> String {
    let ok = eventually(WAIT, || async { node_of(c, name).await.is_some() }).await;
    assert!(ok.is_ok(), "pod {name} was not scheduled; scheduler log:\n{}", sched.log());
    node_of(c, name).await.unwrap_or_default()
}

fn start() -> ApiServer {
    ApiServer::start().unwrap_or_else(|e| panic!("starting the apiserver: {e:#}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn placement_honours_selectors_affinity_taints_and_resources() -> Result<()> {
    let api = start();
    let c = api.client()?;
    create_node(&c, node("ssd", "4", "8Gi", json!({"disk": "ssd", "zone": "z1"}), json!([]), json!({}))).await?;
    create_node(&c, node("hdd", "4", "8Gi", json!({"disk": "hdd", "zone": "z2"}), json!([]), json!({}))).await?;
    create_node(
        &c,
        node(
            "gpu",
            "8",
            "16Gi",
            json!({"zone": "z2"}),
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
            json!({"nvidia.com/gpu": "2"}),
        ),
    )
    .await?;
    let sched = Scheduler::start(&api, &[])?;

    // nodeSelector
    create_pod(&c, pod("sel", json!({}), "100m", "64Mi", json!({"nodeSelector": {"disk": "ssd"}}))).await?;
    // required node affinity
    create_pod(
        &c,
        pod(
            "aff",
            json!({}),
            "100m",
            "64Mi",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]}]}}}}),
        ),
    )
    .await?;
    // extended resource + toleration: only the tainted gpu node has it
    let mut gpu = pod(
        "gpu",
        json!({}),
        "100m",
        "64Mi",
        json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]}),
    );
    // An extended resource is asked for by its limit (the request defaults to it and must
    // equal it; a request alone is refused, as Kubernetes does).
    gpu["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
    create_pod(&c, gpu).await?;
    // a pod that tolerates nothing never lands on the tainted node
    for i in 0..4 {
        create_pod(&c, pod(&format!("plain-{i}"), json!({}), "500m", "64Mi", json!({}))).await?;
    }
    // only 'gpu' has 8 cpu; the taint is tolerated
    create_pod(&c, pod("big", json!({}), "6", "1Gi", json!({"tolerations": [{"operator": "Exists"}]}))).await?;

    assert_eq!(wait_bound(&c, "sel", &sched).await, "ssd");
    assert_eq!(wait_bound(&c, "aff", &sched).await, "hdd");
    assert_eq!(wait_bound(&c, "gpu", &sched).await, "gpu");
    assert_eq!(wait_bound(&c, "big", &sched).await, "gpu");
    for i in 0..4 {
        assert_ne!(wait_bound(&c, &format!("plain-{i}"), &sched).await, "gpu", "untolerated taint ignored");
    }
    // The binding set PodScheduled=True and the scheduler wrote a Scheduled event.
    let p: Api<Pod> = Api::namespaced(c.clone(), "default");
    let got = p.get("sel").await?;
    let cond =
        got.status.and_then(|s| s.conditions).unwrap_or_default().into_iter().find(|c| c.type_ == "PodScheduled");
    assert_eq!(cond.map(|c| c.status).as_deref(), Some("True"));
    let evs: Api<Event> = Api::namespaced(c.clone(), "default");
    eventually(WAIT, || async {
        evs.list(&ListParams::default())
            .await
            .map(|l| {
                l.items.iter().any(|e| {
                    e.reason.as_deref() == Some("Scheduled")
                        && e.message.as_deref() == Some("Successfully assigned default/sel to ssd")
                })
            })
            .unwrap_or(false)
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn required_anti_affinity_spreads_replicas_and_blocks_the_extra_one() -> Result<()> {
    let api = start();
    let c = api.client()?;
    for n in ["a", "b", "c"] {
        create_node(&c, node(n, "4", "8Gi", json!({}), json!([]), json!({}))).await?;
    }
    let sched = Scheduler::start(&api, &[])?;
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    for i in 0..4 {
        create_pod(&c, pod(&format!("db-{i}"), json!({"app": "db"}), "100m", "64Mi", anti.clone())).await?;
    }
    // Pods with pod affinity to db follow one of them.
    create_pod(
        &c,
        pod(
            "follower",
            json!({"app": "web"}),
            "100m",
            "64Mi",
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}]}}}),
        ),
    )
    .await?;
    let p: Api<Pod> = Api::namespaced(c.clone(), "default");
    // Three of the four are placed, each on its own node.
    eventually(WAIT, || async {
        let mut n = 0;
        for i in 0..4 {
            n += usize::from(node_of(&c, &format!("db-{i}")).await.is_some());
        }
        n == 3
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}; scheduler log:\n{}", sched.log()))?;
    let mut nodes = BTreeMap::new();
    let mut pending = None;
    for i in 0..4 {
        match node_of(&c, &format!("db-{i}")).await {
            Some(n) => *nodes.entry(n).or_insert(0) += 1,
            None => pending = Some(format!("db-{i}")),
        }
    }
    assert_eq!(nodes.len(), 3, "anti-affinity violated: {nodes:?}");
    let pending = pending.unwrap_or_default();
    let msg = "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.";
    let r = eventually(WAIT, || async {
        p.get(&pending).await.ok().and_then(|p| p.status).and_then(|s| s.conditions).unwrap_or_default().iter().any(
            |c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
                    && c.message.as_deref() == Some(msg)
            },
        )
    })
    .await;
    if let Err(e) = r {
        anyhow::bail!("{e}: {:?}", p.get(&pending).await.ok().and_then(|p| p.status));
    }
    let follower = wait_bound(&c, "follower", &sched).await;
    assert!(nodes.contains_key(&follower), "follower on {follower}, db pods on {nodes:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn topology_spread_balances_zones() -> Result<()> {
    let api = start();
    let c = api.client()?;
    for (n, z) in [("z1-a", "z1"), ("z1-b", "z1"), ("z1-c", "z1"), ("z2-a", "z2")] {
        create_node(&c, node(n, "4", "8Gi", json!({"topology.kubernetes.io/zone": z}), json!([]), json!({}))).await?;
    }
    let sched = Scheduler::start(&api, &[])?;
    let spread = json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]});
    let mut zones = BTreeMap::<String, i32>::new();
    // One at a time, so each decision sees the previous placements through the watch.
    for i in 0..6 {
        let name = format!("web-{i}");
        create_pod(&c, pod(&name, json!({"app": "web"}), "100m", "64Mi", spread.clone())).await?;
        let n = wait_bound(&c, &name, &sched).await;
        *zones.entry(n[..2].to_string()).or_default() += 1;
    }
    assert_eq!(zones, BTreeMap::from([("z1".to_string(), 3), ("z2".to_string(), 3)]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn unschedulable_pod_gets_condition_and_event_then_fits_on_a_new_node() -> Result<()> {
    let api = start();
    let c = api.client()?;
    create_node(
        &c,
        node(
            "tainted",
            "8",
            "8Gi",
            json!({}),
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
            json!({}),
        ),
    )
    .await?;
    create_node(&c, node("small-1", "1", "8Gi", json!({}), json!([]), json!({}))).await?;
    create_node(&c, node("small-2", "1", "8Gi", json!({}), json!([]), json!({}))).await?;
    let sched = Scheduler::start(&api, &[])?;
    create_pod(&c, pod("hungry", json!({}), "2", "1Gi", json!({}))).await?;

    let want = "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 2 Insufficient cpu.";
    let p: Api<Pod> = Api::namespaced(c.clone(), "default");
    let has_condition = || async {
        p.get("hungry").await.ok().and_then(|p| p.status).and_then(|s| s.conditions).unwrap_or_default().iter().any(
            |c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
                    && c.message.as_deref() == Some(want)
            },
        )
    };
    if let Err(e) = eventually(WAIT, has_condition).await {
        anyhow::bail!("{e}: status {:?}\nlog:\n{}", p.get("hungry").await.ok().and_then(|p| p.status), sched.log());
    }
    let evs: Api<Event> = Api::namespaced(c.clone(), "default");
    eventually(WAIT, || async {
        evs.list(&ListParams::default())
            .await
            .map(|l| {
                l.items.iter().any(|e| {
                    e.reason.as_deref() == Some("FailedScheduling")
                        && e.type_.as_deref() == Some("Warning")
                        && e.message.as_deref() == Some(want)
                        && e.involved_object.name.as_deref() == Some("hungry")
                        && e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("default-scheduler")
                })
            })
            .unwrap_or(false)
    })
    .await?;
    // kubectl describe shows it as users know it.
    let d = api.kubectl(&["describe", "pod", "hungry"])?;
    assert!(
        d.stdout.contains("FailedScheduling") && d.stdout.contains("2 Insufficient cpu"),
        "kubectl describe:\n{}{}",
        d.stdout,
        d.stderr
    );

    // A node that fits arrives: the pod is requeued and scheduled there.
    create_node(&c, node("big", "4", "8Gi", json!({}), json!([]), json!({}))).await?;
    assert_eq!(wait_bound(&c, "hungry", &sched).await, "big");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn scheduler_name_selects_the_profile_or_another_scheduler() -> Result<()> {
    let api = start();
    let c = api.client()?;
    for n in ["n1", "n2", "n3"] {
        create_node(&c, node(n, "4", "8Gi", json!({}), json!([]), json!({}))).await?;
    }
    let sched = Scheduler::start(&api, &[])?;
    create_pod(&c, pod("elsewhere", json!({}), "100m", "64Mi", json!({"schedulerName": "someone-else"}))).await?;
    // round-robin: one pod at a time goes to n1, n2, n3, n1
    let mut got = Vec::new();
    for i in 0..4 {
        let name = format!("rr-{i}");
        create_pod(&c, pod(&name, json!({}), "100m", "64Mi", json!({"schedulerName": "round-robin"}))).await?;
        got.push(wait_bound(&c, &name, &sched).await);
    }
    assert_eq!(got, vec!["n1", "n2", "n3", "n1"]);
    create_pod(&c, pod("rnd", json!({}), "100m", "64Mi", json!({"schedulerName": "random"}))).await?;
    wait_bound(&c, "rnd", &sched).await;
    // The pod for another scheduler was left alone: no node, no condition.
    let p: Api<Pod> = Api::namespaced(c.clone(), "default");
    let other = p.get("elsewhere").await?;
    assert!(other.spec.and_then(|s| s.node_name).is_none());
    assert!(other.status.and_then(|s| s.conditions).unwrap_or_default().iter().all(|c| c.type_ != "PodScheduled"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn profile_flag_and_leader_election_health_and_metrics() -> Result<()> {
    let api = start();
    let c = api.client()?;
    create_node(&c, node("plain", "4", "8Gi", json!({}), json!([]), json!({}))).await?;
    create_node(&c, node("match", "4", "8Gi", json!({"app": "web"}), json!([]), json!({}))).await?;
    let sched = Scheduler::start(&api, &["--leader-elect=true", "--profile", "node-affinity-first"])?;
    // The scheduler takes the kube-system/kube-scheduler Lease before scheduling.
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-system");
    eventually(WAIT, || async {
        leases
            .get("kube-scheduler")
            .await
            .ok()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .is_some_and(|h| !h.is_empty())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}; log:\n{}", sched.log()))?;
    // node-affinity-first puts a pod labelled app=web on the node labelled app=web.
    for i in 0..3 {
        let name = format!("web-{i}");
        create_pod(&c, pod(&name, json!({"app": "web"}), "100m", "64Mi", json!({}))).await?;
        assert_eq!(wait_bound(&c, &name, &sched).await, "match");
    }
    let get = |path: &str| e2e::raw(sched.port, "GET", path, None, b"");
    assert_eq!(get("/healthz")?.status, 200);
    assert_eq!(get("/readyz")?.status, 200);
    let m = get("/metrics")?.text();
    assert!(
        m.contains("scheduler_schedule_attempts_total{profile=\"default-scheduler\",result=\"scheduled\"} 3"),
        "metrics:\n{m}"
    );
    assert!(m.contains("scheduler_pending_pods"), "metrics:\n{m}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn config_file_profiles_are_honoured() -> Result<()> {
    let api = start();
    let c = api.client()?;
    create_node(
        &c,
        node(
            "only",
            "4",
            "8Gi",
            json!({}),
            json!([{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
            json!({}),
        ),
    )
    .await?;
    let cfg = api.data_dir.join("scheduler-config.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n\
         - schedulerName: default-scheduler\n\
         - schedulerName: ignore-taints\n  plugins:\n    filter:\n      disabled: [{name: TaintToleration}]\n",
    )?;
    let sched = Scheduler::start(&api, &["--config", cfg.to_str().unwrap_or_default()])?;
    create_pod(&c, pod("strict", json!({}), "100m", "64Mi", json!({}))).await?;
    create_pod(&c, pod("lax", json!({}), "100m", "64Mi", json!({"schedulerName": "ignore-taints"}))).await?;
    assert_eq!(wait_bound(&c, "lax", &sched).await, "only");
    let p: Api<Pod> = Api::namespaced(c.clone(), "default");
    let want = "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: x}.";
    eventually(WAIT, || async {
        p.get("strict")
            .await
            .ok()
            .and_then(|p| p.status)
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.message.as_deref() == Some(want))
    })
    .await?;
    assert!(node_of(&c, "strict").await.is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_election_fails_over_to_the_standby() -> Result<()> {
    let api = start();
    let c = api.client()?;
    create_node(&c, node("n1", "4", "8Gi", json!({}), json!([]), json!({}))).await?;
    let args = [
        "--leader-elect=true",
        "--leader-elect-lease-duration=3s",
        "--leader-elect-renew-deadline=2s",
        "--leader-elect-retry-period=500ms",
    ];
    let first = Scheduler::start(&api, &args)?;
    eventually(WAIT, || async { first.log().contains("successfully acquired lease") })
        .await
        .map_err(|e| anyhow::anyhow!("{e}; log:\n{}", first.log()))?;
    let standby = Scheduler::start(&api, &args)?;
    create_pod(&c, pod("before", json!({}), "100m", "64Mi", json!({}))).await?;
    assert_eq!(wait_bound(&c, "before", &first).await, "n1");
    assert!(!standby.log().contains("successfully acquired lease"), "two leaders:\n{}", standby.log());
    // The leader dies; the standby takes the Lease once it expires, and schedules.
    drop(first);
    eventually(WAIT, || async { standby.log().contains("successfully acquired lease") })
        .await
        .map_err(|e| anyhow::anyhow!("{e}; standby log:\n{}", standby.log()))?;
    create_pod(&c, pod("after", json!({}), "100m", "64Mi", json!({}))).await?;
    assert_eq!(wait_bound(&c, "after", &standby).await, "n1");
    Ok(())
}
