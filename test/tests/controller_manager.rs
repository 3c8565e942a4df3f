//! End to end: the real controller-manager against the real apiserver, with a fake node
//! agent (in the test) marking pods Running/Ready in place of kubelets.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::controller_manager::{
    deployment, kubectl_ok, namespace, set_pod_ready, ControllerManager, FakeNodeAgent, Fixture,
};
use e2e::{eventually, ApiServer};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn replicaset(name: &str, replicas: i32) -> Result<ReplicaSet> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}
        }
    }))?)
}

fn owned_by(p: &Pod, uid: &str) -> bool {
    p.metadata.owner_references.iter().flatten().any(|r| r.uid == uid && r.controller == Some(true))
}

async fn active_pods(pods: &Api<Pod>, selector: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect())
        .unwrap_or_default()
}

async fn rs_status(api: &Api<ReplicaSet>, name: &str) -> (i32, i32, i32) {
    match api.get(name).await {
        Ok(rs) => {
            let s = rs.status.unwrap_or_default();
            (s.replicas, s.ready_replicas.unwrap_or(0), s.available_replicas.unwrap_or(0))
        }
        Err(_) => (-1, -1, -1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicaset_scales_adopts_and_replaces_pods() -> Result<()> {
    let t = Fixture::start("rs").await?;
    let client = &t.client;
    let rss: Api<ReplicaSet> = t.api();
    let pods: Api<Pod> = t.api();

    // An orphan that matches is adopted, so only two pods are created.
    let orphan: Pod = serde_json::from_value(json!({"metadata": {"name": "orphan", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}))?;
    pods.create(&PostParams::default(), &orphan).await?;
    let rs = rss.create(&PostParams::default(), &replicaset("web", 3)?).await?;
    let uid = rs.metadata.uid.clone().context("uid")?;
    eventually(WAIT, || async { rs_status(&rss, "web").await == (3, 3, 3) }).await.context("3 ready replicas")?;
    let ps = active_pods(&pods, "app=web").await;
    assert_eq!(ps.len(), 3, "exactly 3 pods, no double creation");
    assert!(ps.iter().all(|p| owned_by(p, &uid)), "all pods owned by the ReplicaSet");
    assert!(ps.iter().any(|p| p.metadata.name.as_deref() == Some("orphan")), "the orphan was adopted");
    let got = rss.get("web").await?;
    assert_eq!(got.status.as_ref().and_then(|s| s.observed_generation), got.metadata.generation);

    // Scale up to 5.
    rss.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 5}}))).await?;
    eventually(WAIT, || async { rs_status(&rss, "web").await == (5, 5, 5) }).await.context("scale up to 5")?;
    assert_eq!(active_pods(&pods, "app=web").await.len(), 5);

    // A deleted pod is replaced; a failed pod is replaced.
    let victim = active_pods(&pods, "app=web").await[0].metadata.name.clone().context("name")?;
    pods.delete(&victim, &DeleteParams::default()).await?;
    let failed = active_pods(&pods, "app=web").await[1].metadata.name.clone().context("name")?;
    pods.patch_status(&failed, &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Failed"}}))).await?;
    eventually(WAIT, || async {
        let ps = active_pods(&pods, "app=web").await;
        let running =
            ps.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count();
        running == 5 && ps.iter().all(|p| p.metadata.name.as_deref() != Some(victim.as_str()))
    })
    .await
    .context("deleted and failed pods replaced")?;

    // Scale down to 1: a not-ready pod goes first.
    let not_ready = active_pods(&pods, "app=web")
        .await
        .into_iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .and_then(|p| p.metadata.name)
        .context("a running pod")?;
    set_pod_ready(&client, "rs", &not_ready, false).await?;
    eventually(WAIT, || async { rs_status(&rss, "web").await.1 == 4 }).await.context("readyReplicas 4")?;
    rss.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1}}))).await?;
    eventually(WAIT, || async { active_pods(&pods, "app=web").await.iter().filter(|p| is_running(p)).count() == 1 })
        .await
        .context("scale down to 1")?;
    assert!(
        active_pods(&pods, "app=web").await.iter().all(|p| p.metadata.name.as_deref() != Some(not_ready.as_str())),
        "the not-ready pod was deleted first"
    );

    // A pod relabelled out of the selector is released (and replaced).
    let last = active_pods(&pods, "app=web")
        .await
        .into_iter()
        .find(is_running)
        .and_then(|p| p.metadata.name)
        .context("pod")?;
    pods.patch(&last, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"app": "gone"}}}))).await?;
    eventually(WAIT, || async {
        let released = pods.get(&last).await.map(|p| !owned_by(&p, &uid)).unwrap_or(false);
        released && rs_status(&rss, "web").await.0 == 1
    })
    .await
    .context("relabelled pod released and replaced")?;

    // /healthz and /metrics.
    assert_eq!(e2e::raw(t.cm.port, "GET", "/healthz", None, b"")?.status, 200);
    let metrics = e2e::raw(t.cm.port, "GET", "/metrics", None, b"")?.text();
    assert!(
        metrics.contains("controller_manager_syncs_total{controller=\"replicaset\",result=\"success\"}"),
        "{metrics}"
    );

    // Events as Kubernetes records them.
    let events: Api<k8s_openapi::api::core::v1::Event> = t.api();
    let evs = events.list(&ListParams::default()).await?;
    assert!(evs.items.iter().any(|e| e.reason.as_deref() == Some("SuccessfulCreate")));
    assert!(evs.items.iter().any(|e| e.reason.as_deref() == Some("SuccessfulDelete")));
    Ok(())
}

fn is_running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployment_rollout_status_and_undo_with_kubectl() -> Result<()> {
    let t = Fixture::start("dep").await?;
    let api = &t.api;
    let deps: Api<Deployment> = t.api();
    let rss: Api<ReplicaSet> = t.api();
    let pods: Api<Pod> = t.api();
    deps.create(&PostParams::default(), &deployment("web", 4, "nginx:1")?).await?;
    let out = kubectl_ok(&api, &["-n", "dep", "rollout", "status", "deployment/web", "--timeout=60s"]).await?;
    assert!(out.contains("successfully rolled out"), "{out}");

    // A new template rolls out; the old ReplicaSet ends at 0.
    kubectl_ok(&api, &["-n", "dep", "set", "image", "deployment/web", "c=nginx:2"]).await?;
    let out = kubectl_ok(&api, &["-n", "dep", "rollout", "status", "deployment/web", "--timeout=60s"]).await?;
    assert!(out.contains("successfully rolled out"), "{out}");
    let list = rss.list(&ListParams::default()).await?;
    assert_eq!(list.items.len(), 2);
    let by_rev = |rev: &str| {
        list.items
            .iter()
            .find(|r| {
                r.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("deployment.kubernetes.io/revision"))
                    .map(String::as_str)
                    == Some(rev)
            })
            .cloned()
    };
    let r1 = by_rev("1").context("revision 1")?;
    let r2 = by_rev("2").context("revision 2")?;
    assert_eq!(r1.spec.replicas, Some(0));
    assert_eq!(r2.spec.replicas, Some(4));
    let ps = active_pods(&pods, "app=web").await;
    assert_eq!(ps.len(), 4);
    assert!(ps.iter().all(|p| p.spec.as_ref().map(|s| s.containers[0].image.as_deref()) == Some(Some("nginx:2"))));
    let d = deps.get("web").await?;
    let st = d.status.clone().unwrap_or_default();
    assert_eq!((st.replicas, st.updated_replicas, st.available_replicas), (Some(4), Some(4), Some(4)));
    let conds = st.conditions.unwrap_or_default();
    assert!(conds
        .iter()
        .any(|c| c.type_.as_deref() == Some("Progressing") && c.reason.as_deref() == Some("NewReplicaSetAvailable")));

    // kubectl rollout history / undo.
    let hist = kubectl_ok(&api, &["-n", "dep", "rollout", "history", "deployment/web"]).await?;
    assert!(hist.contains('1') && hist.contains('2'), "{hist}");
    kubectl_ok(&api, &["-n", "dep", "rollout", "undo", "deployment/web"]).await?;
    kubectl_ok(&api, &["-n", "dep", "rollout", "status", "deployment/web", "--timeout=60s"]).await?;
    eventually(WAIT, || async {
        let ps = active_pods(&pods, "app=web").await;
        ps.len() == 4
            && ps.iter().all(|p| p.spec.as_ref().map(|s| s.containers[0].image.as_deref()) == Some(Some("nginx:1")))
    })
    .await
    .context("undo back to nginx:1")?;
    let r1 = rss.get(r1.metadata.name.as_deref().context("name")?).await?;
    assert_eq!(
        r1.metadata.annotations.as_ref().and_then(|a| a.get("deployment.kubernetes.io/revision")).map(String::as_str),
        Some("3")
    );

    // rollout restart makes a new ReplicaSet; scaling works; events tell the story.
    kubectl_ok(&api, &["-n", "dep", "rollout", "restart", "deployment/web"]).await?;
    kubectl_ok(&api, &["-n", "dep", "rollout", "status", "deployment/web", "--timeout=60s"]).await?;
    assert_eq!(rss.list(&ListParams::default()).await?.items.len(), 3);
    kubectl_ok(&api, &["-n", "dep", "scale", "deployment/web", "--replicas=2"]).await?;
    eventually(WAIT, || async { active_pods(&pods, "app=web").await.len() == 2 }).await.context("scaled to 2")?;
    let describe = kubectl_ok(&api, &["-n", "dep", "describe", "deployment", "web"]).await?;
    assert!(describe.contains("ScalingReplicaSet"), "{describe}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recreate_and_paused_deployments() -> Result<()> {
    let t = Fixture::start("rec").await?;
    let api = &t.api;
    let deps: Api<Deployment> = t.api();
    let pods: Api<Pod> = t.api();
    let mut d = deployment("rec", 3, "nginx:1")?;
    d.spec.strategy = Some(serde_json::from_value(json!({"type": "Recreate"}))?);
    deps.create(&PostParams::default(), &d).await?;
    kubectl_ok(&api, &["-n", "rec", "rollout", "status", "deployment/rec", "--timeout=60s"]).await?;
    kubectl_ok(&api, &["-n", "rec", "rollout", "pause", "deployment/rec"]).await?;
    kubectl_ok(&api, &["-n", "rec", "set", "image", "deployment/rec", "c=nginx:2"]).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ps = active_pods(&pods, "app=rec").await;
    assert!(
        ps.iter().all(|p| p.spec.as_ref().map(|s| s.containers[0].image.as_deref()) == Some(Some("nginx:1"))),
        "paused: no rollout"
    );
    kubectl_ok(&api, &["-n", "rec", "rollout", "resume", "deployment/rec"]).await?;
    kubectl_ok(&api, &["-n", "rec", "rollout", "status", "deployment/rec", "--timeout=60s"]).await?;
    eventually(WAIT, || async {
        let ps = active_pods(&pods, "app=rec").await;
        ps.len() == 3
            && ps.iter().all(|p| p.spec.as_ref().map(|s| s.containers[0].image.as_deref()) == Some(Some("nginx:2")))
    })
    .await
    .context("recreated with nginx:2")?;
    Ok(())
}

fn slice_conditions(slices: &[EndpointSlice]) -> BTreeMap<String, (bool, bool, bool)> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .map(|e| {
            let c = e.conditions.clone().unwrap_or_default();
            (
                e.target_ref.as_ref().and_then(|r| r.name.clone()).unwrap_or_default(),
                (c.ready.unwrap_or(false), c.serving.unwrap_or(false), c.terminating.unwrap_or(false)),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn endpointslices_and_endpoints_follow_pod_readiness() -> Result<()> {
    let t = Fixture::start("ep").await?;
    let client = &t.client;
    let svcs: Api<Service> = t.api();
    let slices: Api<EndpointSlice> = t.api();
    let eps: Api<Endpoints> = t.api();
    let pods: Api<Pod> = t.api();
    let rss: Api<ReplicaSet> = t.api();
    let mut rs = replicaset("web", 3)?;
    if let Some(spec) = rs.spec.template.as_mut().and_then(|t| t.spec.as_mut()) {
        spec.containers[0].ports = Some(vec![serde_json::from_value(json!({"name": "http", "containerPort": 8080}))?]);
    }
    rss.create(&PostParams::default(), &rs).await?;
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}))?;
    svcs.create(&PostParams::default(), &svc).await?;
    let by_svc = ListParams::default().labels("kubernetes.io/service-name=web");
    eventually(WAIT, || async {
        let l = slices.list(&by_svc).await.map(|l| l.items).unwrap_or_default();
        let c = slice_conditions(&l);
        c.len() == 3 && c.values().all(|v| *v == (true, true, false))
    })
    .await
    .context("3 ready endpoints")?;
    let l = slices.list(&by_svc).await?.items;
    assert_eq!(l[0].ports.as_ref().and_then(|p| p[0].port), Some(8080), "named targetPort resolved");
    assert_eq!(l[0].address_type, "IPv4");

    // Readiness flips are reflected in both APIs.
    let victim = active_pods(&pods, "app=web").await[0].metadata.name.clone().context("pod")?;
    set_pod_ready(&client, "ep", &victim, false).await?;
    eventually(WAIT, || async {
        let l = slices.list(&by_svc).await.map(|l| l.items).unwrap_or_default();
        slice_conditions(&l).get(&victim) == Some(&(false, false, false))
    })
    .await
    .context("not-ready endpoint")?;
    // The slice says when the change it carries happened: the pod's Ready transition
    // (`endpoints.kubernetes.io/last-change-trigger-time`, what kube-proxy measures from).
    let ready_at = pods
        .get(&victim)
        .await?
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time)
        .context("Ready transition time")?
        .0;
    eventually(WAIT, || async {
        let l = slices.list(&by_svc).await.map(|l| l.items).unwrap_or_default();
        l.iter().any(|s| {
            s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("endpoints.kubernetes.io/last-change-trigger-time"))
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                == Some(ready_at)
        })
    })
    .await
    .context("the slice's trigger time is the pod's Ready transition")?;
    eventually(WAIT, || async {
        let Ok(e) = eps.get("web").await else { return false };
        let sub = e.subsets.unwrap_or_default();
        sub.len() == 1
            && sub[0].addresses.as_ref().map(|a| a.len()) == Some(2)
            && sub[0].not_ready_addresses.as_ref().map(|a| a.len()) == Some(1)
            && sub[0].ports.as_ref().map(|p| p[0].port) == Some(8080)
    })
    .await
    .context("legacy Endpoints")?;

    // Scale down: the deleted pod leaves.
    rss.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1}}))).await?;
    eventually(WAIT, || async {
        let l = slices.list(&by_svc).await.map(|l| l.items).unwrap_or_default();
        slice_conditions(&l).len() == 1
    })
    .await
    .context("one endpoint after scale-down")?;
    Ok(())
}

async fn gone<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    matches!(api.get_opt(name).await, Ok(None))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_delete_cascade_background_foreground_orphan() -> Result<()> {
    let t = Fixture::start("gc").await?;
    let api = &t.api;
    let deps: Api<Deployment> = t.api();
    let rss: Api<ReplicaSet> = t.api();
    let pods: Api<Pod> = t.api();
    for name in ["bg", "fg", "orphan"] {
        deps.create(&PostParams::default(), &deployment(name, 2, "nginx:1")?).await?;
        kubectl_ok(&api, &["-n", "gc", "rollout", "status", &format!("deployment/{name}"), "--timeout=60s"]).await?;
    }

    // Background (kubectl's default): the Deployment goes at once, the rest follows.
    kubectl_ok(&api, &["-n", "gc", "delete", "deployment", "bg"]).await?;
    eventually(WAIT, || async {
        active_pods(&pods, "app=bg").await.is_empty()
            && rss.list(&ListParams::default().labels("app=bg")).await.map(|l| l.items.is_empty()).unwrap_or(false)
    })
    .await
    .context("background cascade")?;

    // Foreground: the Deployment stays (with the finalizer) until its dependents are gone.
    kubectl_ok(&api, &["-n", "gc", "delete", "deployment", "fg", "--cascade=foreground", "--wait=false"]).await?;
    let d = deps.get_opt("fg").await?;
    if let Some(d) = d {
        assert!(
            d.metadata.finalizers.iter().flatten().any(|f| f == "foregroundDeletion"),
            "foregroundDeletion finalizer set"
        );
    }
    eventually(WAIT, || async { gone(&deps, "fg").await }).await.context("foreground deletion finished")?;
    assert!(active_pods(&pods, "app=fg").await.is_empty(), "pods gone before the owner");
    assert!(rss.list(&ListParams::default().labels("app=fg")).await?.items.is_empty());

    // Orphan: the ReplicaSet and pods stay, without the owner reference.
    kubectl_ok(&api, &["-n", "gc", "delete", "deployment", "orphan", "--cascade=orphan"]).await?;
    eventually(WAIT, || async { gone(&deps, "orphan").await }).await.context("orphaned deployment deleted")?;
    eventually(WAIT, || async {
        let l = rss.list(&ListParams::default().labels("app=orphan")).await.map(|l| l.items).unwrap_or_default();
        l.len() == 1 && l[0].metadata.owner_references.as_ref().is_none_or(|r| r.is_empty())
    })
    .await
    .context("ReplicaSet orphaned")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(active_pods(&pods, "app=orphan").await.len(), 2, "pods kept");

    // A dependent whose owner is gone is collected (owner deleted while the collector runs).
    let cms: Api<ConfigMap> = t.api();
    let rs = rss.list(&ListParams::default().labels("app=orphan")).await?.items.remove(0);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dep", "ownerReferences": [{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs.metadata.name, "uid": rs.metadata.uid}]}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    rss.delete(rs.metadata.name.as_deref().context("name")?, &DeleteParams::default()).await?;
    eventually(WAIT, || async { gone(&cms, "dep").await && active_pods(&pods, "app=orphan").await.is_empty() })
        .await
        .context("dangling dependents collected")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_deletion_removes_contents_then_namespace() -> Result<()> {
    let t = Fixture::start("doomed").await?;
    let (api, client) = (&t.api, &t.client);
    let deps: Api<Deployment> = t.api();
    deps.create(&PostParams::default(), &deployment("web", 2, "nginx:1")?).await?;
    let cms: Api<ConfigMap> = t.api();
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"a": "b"}}))?,
    )
    .await?;
    let pods: Api<Pod> = t.api();
    eventually(WAIT, || async { active_pods(&pods, "app=web").await.len() == 2 }).await.context("pods up")?;
    kubectl_ok(&api, &["delete", "namespace", "doomed", "--timeout=60s"]).await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    eventually(WAIT, || async { gone(&nss, "doomed").await }).await.context("namespace gone")?;
    assert!(pods.list(&ListParams::default()).await.map(|l| l.items.is_empty()).unwrap_or(true));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_namespace_has_a_default_service_account() -> Result<()> {
    let t = Fixture::start("team").await?;
    let (api, client) = (&t.api, &t.client);
    // The system namespaces and a new one get theirs.
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease", "team"] {
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        eventually(WAIT, || async { sas.get_opt("default").await.ok().flatten().is_some() })
            .await
            .with_context(|| format!("default service account in {ns}"))?;
    }
    // A deleted one comes back (a new object), and the official kubectl lists it.
    let sas: Api<ServiceAccount> = t.api();
    let first = sas.get("default").await?.metadata.uid;
    sas.delete("default", &DeleteParams::default()).await?;
    eventually(WAIT, || async {
        sas.get_opt("default").await.ok().flatten().is_some_and(|sa| sa.metadata.uid != first)
    })
    .await
    .context("default service account recreated")?;
    let out = api.kubectl(&["get", "serviceaccounts", "-n", "team", "-o", "name"])?;
    assert_eq!(out.stdout.trim(), "serviceaccount/default", "{out:?}");
    // A deleted namespace goes away with its service account, which is not recreated.
    kubectl_ok(api, &["delete", "namespace", "team", "--timeout=60s"]).await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    eventually(WAIT, || async { gone(&nss, "team").await }).await.context("namespace gone")?;
    assert!(sas.get_opt("default").await?.is_none());
    assert!(!t.cm.log().contains("service account sync failed"), "{}", t.cm.log());
    Ok(())
}

async fn budget(api: &Api<PodDisruptionBudget>, name: &str) -> (i32, i32, i32, i32) {
    let s = api.get(name).await.ok().and_then(|p| p.status).unwrap_or_default();
    let n = |v: Option<i32>| v.unwrap_or(-1);
    (n(s.expected_pods), n(s.desired_healthy), n(s.current_healthy), n(s.disruptions_allowed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disruption_budgets_gate_evictions() -> Result<()> {
    let t = Fixture::start("pdb").await?;
    let api = &t.api;
    let deps: Api<Deployment> = t.api();
    deps.create(&PostParams::default(), &deployment("web", 3, "nginx:1")?).await?;
    deps.create(&PostParams::default(), &deployment("db", 4, "nginx:1")?).await?;
    let pdbs: Api<PodDisruptionBudget> = t.api();
    for (name, budget) in [("web", json!({"minAvailable": 2})), ("db", json!({"maxUnavailable": "25%"}))] {
        let mut spec = budget;
        spec["selector"] = json!({"matchLabels": {"app": name}});
        pdbs.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?,
        )
        .await?;
    }
    // minAvailable 2 of 3 ready pods: one disruption; maxUnavailable 25% of the Deployment's 4: one.
    eventually(WAIT, || async { budget(&pdbs, "web").await == (3, 2, 3, 1) }).await.context("web budget")?;
    eventually(WAIT, || async { budget(&pdbs, "db").await == (4, 3, 4, 1) }).await.context("db budget")?;
    let out = kubectl_ok(api, &["get", "pdb", "-n", "pdb"]).await?;
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS", "AGE"]);
    assert_eq!(rows[1][..4], ["db", "N/A", "25%", "1"]);
    assert_eq!(rows[2][..4], ["web", "2", "N/A", "1"]);

    // The first eviction spends the budget; the next is refused with 429 until the
    // Deployment's replacement is ready.
    let pods: Api<Pod> = t.api();
    let web = active_pods(&pods, "app=web").await;
    let names: Vec<String> = web.iter().filter_map(|p| p.metadata.name.clone()).collect();
    // Replacements stay Pending (not ready) until the agent is let go again.
    t.agent.ready.store(false, std::sync::atomic::Ordering::SeqCst);
    pods.evict(&names[0], &EvictParams::default()).await?;
    // (Raw HTTP: the kube client retries 429s on its own.)
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": names[1]}});
    let path = format!("/api/v1/namespaces/pdb/pods/{}/eviction", names[1]);
    let r = e2e::raw(api.port, "POST", &path, Some("application/json"), eviction.to_string().as_bytes())?;
    assert_eq!(r.status, 429, "{}", r.text());
    let status = r.json();
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["message"], "Cannot evict pod as it would violate the pod's disruption budget.");
    assert_eq!(status["details"]["causes"][0]["reason"], "DisruptionBudget");
    // "has 3" until the controller has seen the first eviction through, then "has 2".
    let cause = status["details"]["causes"][0]["message"].as_str().unwrap_or_default();
    assert!(cause.starts_with("The disruption budget web needs 2 healthy pods and has "), "{cause}");
    assert!(pods.get_opt(&names[1]).await?.is_some_and(|p| p.metadata.deletion_timestamp.is_none()));
    t.agent.ready.store(true, std::sync::atomic::Ordering::SeqCst);
    kubectl_ok(api, &["annotate", "pods", "-n", "pdb", "-l", "app=web", "nudge=1"]).await?;
    eventually(WAIT, || async {
        budget(&pdbs, "web").await == (3, 2, 3, 1) && active_pods(&pods, "app=web").await.len() == 3
    })
    .await
    .context("budget back once the replacement is ready")?;
    pods.evict(&names[1], &EvictParams::default()).await.context("eviction allowed again")?;

    // A dry run spends nothing; a pod outside every budget goes freely.
    let db = active_pods(&pods, "app=db").await;
    let db0 = db[0].metadata.name.clone().unwrap_or_default();
    // (`?dryRun=All`: the kube crate sends EvictParams' delete_options under a key the
    // apiserver does not read, as Kubernetes would not either.)
    let dry = EvictParams { post_options: PostParams { dry_run: true, ..Default::default() }, ..Default::default() };
    pods.evict(&db0, &dry).await?;
    assert_eq!(budget(&pdbs, "db").await.3, 1);
    assert!(pods.get_opt(&db0).await?.is_some_and(|p| p.metadata.deletion_timestamp.is_none()));
    let lone: Pod = serde_json::from_value(json!({"metadata": {"name": "lone", "labels": {"app": "lone"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}))?;
    pods.create(&PostParams::default(), &lone).await?;
    eventually(WAIT, || async { active_pods(&pods, "app=lone").await.iter().any(|p| crate_ready(p)) }).await?;
    pods.evict("lone", &EvictParams::default()).await?;
    assert!(!t.cm.log().contains("disruption budget sync failed"), "{}", t.cm.log());
    Ok(())
}

fn crate_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_complete_fail_and_index() -> Result<()> {
    let t = Fixture::start("jobs").await?;
    let api = &t.api;
    let jobs: Api<Job> = t.api();
    let job: Job = serde_json::from_value(json!({"metadata": {"name": "sum"}, "spec": {
        "completions": 4, "parallelism": 2, "completionMode": "Indexed", "ttlSecondsAfterFinished": 3,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1"}]}}}}))?;
    jobs.create(&PostParams::default(), &job).await?;
    kubectl_ok(&api, &["-n", "jobs", "wait", "--for=condition=complete", "job/sum", "--timeout=60s"]).await?;
    let j = jobs.get("sum").await?;
    let st = j.status.clone().unwrap_or_default();
    assert_eq!(st.succeeded, Some(4));
    assert_eq!(st.completed_indexes.as_deref(), Some("0-3"));
    assert!(st.completion_time.is_some());
    // TTL after finished.
    eventually(WAIT, || async { gone(&jobs, "sum").await }).await.context("deleted after ttlSecondsAfterFinished")?;

    // A Job whose pods fail hits its backoff limit.
    let bad: Job = serde_json::from_value(json!({"metadata": {"name": "bad"}, "spec": {"backoffLimit": 1,
        "template": {"metadata": {"labels": {"fail": "yes"}}, "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1"}]}}}}))?;
    // The agent leaves these pods alone; the test fails them.
    t.agent.ready.store(false, std::sync::atomic::Ordering::SeqCst);
    jobs.create(&PostParams::default(), &bad).await?;
    let pods: Api<Pod> = t.api();
    let deadline = Instant::now() + WAIT;
    loop {
        // Fail every pod of the job as a kubelet would report a crashing container.
        for p in pods.list(&ListParams::default().labels("fail=yes")).await?.items {
            if p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Failed") {
                let _ = pods
                    .patch_status(
                        p.metadata.name.as_deref().unwrap_or_default(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"phase": "Failed"}})),
                    )
                    .await;
            }
        }
        let j = jobs.get("bad").await?;
        let failed = j.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
            c.iter().any(|c| c.type_ == "Failed" && c.reason.as_deref() == Some("BackoffLimitExceeded"))
        });
        if failed {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "job never failed: {:?}", j.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_ipam_assigns_pod_cidrs() -> Result<()> {
    let api = ApiServer::start()?;
    let client = api.client()?;
    let _cm = ControllerManager::start(&api, &["--controllers=nodeipam", "--cluster-cidr=10.250.0.0/16"])?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for n in ["n1", "n2", "n3"] {
        nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": n}}))?).await?;
    }
    eventually(WAIT, || async {
        let l = nodes.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let cidrs: std::collections::BTreeSet<String> =
            l.iter().filter_map(|n| n.spec.as_ref().and_then(|s| s.pod_cidr.clone())).collect();
        cidrs.len() == 3 && cidrs.iter().all(|c| c.starts_with("10.250.") && c.ends_with("/24"))
    })
    .await
    .context("distinct /24s")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_the_leader_acts_and_a_follower_takes_over() -> Result<()> {
    let api = ApiServer::start()?;
    let client = api.client()?;
    namespace(&client, "le").await?;
    let flags = [
        "--leader-elect=true",
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=3s",
        "--leader-elect-retry-period=1s",
    ];
    let mut a = ControllerManager::start(&api, &flags)?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), "kube-system");
    let holder = || async {
        leases
            .get_opt("kube-controller-manager")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec.and_then(|s| s.holder_identity))
    };
    eventually(WAIT, || async { holder().await.is_some() }).await.context("a leader")?;
    let first = holder().await.context("holder")?;
    let mut b = ControllerManager::start(&api, &flags)?;
    let _agent = FakeNodeAgent::start(client.clone());
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), "le");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "le");
    rss.create(&PostParams::default(), &replicaset("web", 3)?).await?;
    eventually(WAIT, || async { rs_status(&rss, "web").await == (3, 3, 3) }).await.context("3 replicas")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(active_pods(&pods, "app=web").await.len(), 3, "no duplicate pods with two replicas");
    assert!(
        b.log().contains("attempting to acquire leader lease") && !b.log().contains("starting controllers"),
        "the follower waits:\n{}",
        b.log()
    );

    // Kill the leader: the other takes over and keeps acting, without duplicates.
    a.stop();
    eventually(Duration::from_secs(30), || async { holder().await.is_some_and(|h| h != first) })
        .await
        .context("takeover")?;
    rss.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 5}}))).await?;
    eventually(WAIT, || async { rs_status(&rss, "web").await == (5, 5, 5) }).await.context("new leader scales")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(active_pods(&pods, "app=web").await.len(), 5);
    assert!(b.running());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_node_is_tainted_and_its_pods_evicted() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Node;
    let api = ApiServer::start()?;
    let client = api.client()?;
    namespace(&client, "nl").await?;
    let _ = namespace(&client, "kube-node-lease").await;
    let _cm = ControllerManager::start(
        &api,
        &["--node-monitor-grace-period=3s", "--node-monitor-period=1s", "--default-unreachable-toleration-seconds=2"],
    )?;
    let _agent = FakeNodeAgent::start(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "n1"}}))?).await?;
    let now = || k8s_openapi::jiff::Timestamp::now().to_string();
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": now(), "lastTransitionTime": now()}]}}),
            ),
        )
        .await?;
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}}),
    )?;
    leases.create(&PostParams::default(), &lease).await?;
    // A heartbeat task, like a kubelet's.
    let beating = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (b, l) = (beating.clone(), leases.clone());
    let hb = tokio::spawn(async move {
        loop {
            if b.load(std::sync::atomic::Ordering::SeqCst) {
                let t = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string();
                let _ = l.patch("n1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"renewTime": t}}))).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), "nl");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "nl");
    rss.create(&PostParams::default(), &replicaset("web", 2)?).await?;
    eventually(WAIT, || async { active_pods(&pods, "app=web").await.len() == 2 }).await.context("pods")?;
    // Bind them to n1 (the scheduler's job).
    for p in active_pods(&pods, "app=web").await {
        let name = p.metadata.name.clone().context("name")?;
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": {"kind": "Node", "name": "n1"}});
        let _: serde_json::Value = pods.create_subresource("binding", &name, &PostParams::default(), &binding).await?;
    }
    let on_n1 = || async {
        active_pods(&pods, "app=web")
            .await
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("n1"))
            .count()
    };
    eventually(WAIT, || async { on_n1().await == 2 }).await.context("bound")?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let n = nodes.get("n1").await?;
    assert!(
        n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_none_or(|t| t.is_empty()),
        "a heartbeating node is not tainted"
    );

    // The kubelet stops: Ready=Unknown, unreachable taints, pods evicted and recreated.
    beating.store(false, std::sync::atomic::Ordering::SeqCst);
    eventually(WAIT, || async {
        let Ok(n) = nodes.get("n1").await else { return false };
        let unknown = n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
            c.iter().any(|c| {
                c.type_ == "Ready" && c.status == "Unknown" && c.reason.as_deref() == Some("NodeStatusUnknown")
            })
        });
        let tainted =
            n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| {
                t.iter().any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute")
            });
        unknown && tainted
    })
    .await
    .context("node marked unreachable")?;
    eventually(WAIT, || async { on_n1().await == 0 && active_pods(&pods, "app=web").await.len() == 2 })
        .await
        .context("pods evicted and replaced")?;

    // It comes back: untainted.
    beating.store(true, std::sync::atomic::Ordering::SeqCst);
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": now(), "lastTransitionTime": now()}]}}),
            ),
        )
        .await?;
    eventually(WAIT, || async {
        nodes
            .get("n1")
            .await
            .ok()
            .is_some_and(|n| n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_none_or(|t| t.is_empty()))
    })
    .await
    .context("untainted")?;
    hb.abort();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cronjob_starts_jobs_on_schedule() -> Result<()> {
    use k8s_openapi::api::batch::v1::CronJob;
    let t = Fixture::start("cron").await?;
    let cjs: Api<CronJob> = t.api();
    let jobs: Api<Job> = t.api();
    let cj: CronJob = serde_json::from_value(json!({"metadata": {"name": "tick"}, "spec": {"schedule": "* * * * *",
        "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "busybox:1"}]}}}}}}))?;
    cjs.create(&PostParams::default(), &cj).await?;
    // The next minute boundary is at most 60 s away.
    eventually(Duration::from_secs(90), || async {
        let Ok(c) = cjs.get("tick").await else { return false };
        let st = c.status.unwrap_or_default();
        st.last_schedule_time.is_some() && st.last_successful_time.is_some()
    })
    .await
    .context("a scheduled job ran and succeeded")?;
    let l = jobs.list(&ListParams::default()).await?.items;
    assert!(!l.is_empty());
    let name = l[0].metadata.name.clone().unwrap_or_default();
    assert!(name.starts_with("tick-"), "{name}");
    assert!(l[0].metadata.owner_references.iter().flatten().any(|r| r.kind == "CronJob" && r.controller == Some(true)));
    Ok(())
}
