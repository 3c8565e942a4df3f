//! The real apiserver driven by the `kube` crate: typed CRUD for every kind, pagination,
//! concurrency, finalizers, generation, subresources.

use std::fmt::Debug;
use std::time::Duration;

use anyhow::{anyhow, ensure, Result};
use e2e::ApiServer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        _ => 0,
    }
}

/// Create, get, list, replace (and a stale replace), merge and JSON patch, delete.
async fn crud<K>(api: Api<K>, obj: Value) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
    K::DynamicType: Default,
{
    let obj: K = serde_json::from_value(obj)?;
    let name = obj.meta().name.clone().ok_or_else(|| anyhow!("test object without a name"))?;
    let kind = K::kind(&Default::default()).to_string();
    let created = api.create(&PostParams::default(), &obj).await.map_err(|e| anyhow!("{kind} create: {e}"))?;
    ensure!(created.meta().uid.is_some(), "{kind}: no uid");
    ensure!(created.meta().creation_timestamp.is_some(), "{kind}: no creationTimestamp");
    let rv1: i64 = created.resource_version().unwrap_or_default().parse()?;
    let got = api.get(&name).await?;
    ensure!(got.resource_version() == created.resource_version(), "{kind}: get returns another version");
    let list = api.list(&ListParams::default()).await?;
    ensure!(list.items.iter().any(|o| o.name_any() == name), "{kind}: not listed");
    ensure!(list.metadata.resource_version.is_some(), "{kind}: list without resourceVersion");

    let mut upd = got.clone();
    upd.meta_mut().labels.get_or_insert_with(Default::default).insert("e2e".into(), "yes".into());
    let replaced =
        api.replace(&name, &PostParams::default(), &upd).await.map_err(|e| anyhow!("{kind} replace: {e}"))?;
    let rv2: i64 = replaced.resource_version().unwrap_or_default().parse()?;
    ensure!(rv2 > rv1, "{kind}: resourceVersion did not increase ({rv1} -> {rv2})");
    ensure!(replaced.labels().get("e2e").map(String::as_str) == Some("yes"), "{kind}: label lost");
    // The same write again carries a stale resourceVersion: 409.
    let stale = api.replace(&name, &PostParams::default(), &upd).await;
    ensure!(stale.as_ref().err().map(code) == Some(409), "{kind}: stale replace gave {:?}", stale.err());

    let p = Patch::Merge(json!({"metadata": {"annotations": {"e2e/merge": "1"}}}));
    let patched =
        api.patch(&name, &PatchParams::default(), &p).await.map_err(|e| anyhow!("{kind} merge patch: {e}"))?;
    ensure!(patched.annotations().get("e2e/merge").map(String::as_str) == Some("1"), "{kind}: merge patch lost");
    let jp = serde_json::to_vec(&json!([{"op": "add", "path": "/metadata/labels/jsonpatch", "value": "yes"}]))?;
    let req = http::Request::patch(format!("{}/{name}", api.resource_url()))
        .header("content-type", "application/json-patch+json")
        .body(jp)?;
    let patched: K = api.clone().into_client().request(req).await.map_err(|e| anyhow!("{kind} json patch: {e}"))?;
    ensure!(patched.labels().get("jsonpatch").map(String::as_str) == Some("yes"), "{kind}: json patch lost");

    api.delete(&name, &DeleteParams::default()).await.map_err(|e| anyhow!("{kind} delete: {e}"))?;
    if matches!(kind.as_str(), "PersistentVolume" | "PersistentVolumeClaim") {
        // The apiserver's pv-/pvc-protection finalizer holds the object until the
        // controller-manager (not running here) drops it: do its part.
        let held = api.get(&name).await?;
        ensure!(held.meta().deletion_timestamp.is_some(), "{kind}: no deletionTimestamp while finalized");
        let p = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        api.patch(&name, &PatchParams::default(), &p).await.map_err(|e| anyhow!("{kind} finalizers: {e}"))?;
    }
    let gone = api.get(&name).await;
    ensure!(
        gone.as_ref().err().map(code) == Some(404),
        "{kind}: still there after delete: {:?}",
        gone.map(|o| o.meta().clone())
    );
    Ok(())
}

fn pod_spec() -> Value {
    json!({"containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent"}]})
}

fn template(labels: Value, restart: &str) -> Value {
    json!({"metadata": {"labels": labels}, "spec": {"restartPolicy": restart, "containers": [{"name": "c", "image": "busybox"}]}})
}

macro_rules! ns_crud {
    ($client:expr, $ty:ty, $obj:expr) => {
        crud::<$ty>(Api::namespaced($client.clone(), "default"), $obj).await?
    };
}
macro_rules! cluster_crud {
    ($client:expr, $ty:ty, $obj:expr) => {
        crud::<$ty>(Api::all($client.clone()), $obj).await?
    };
}

#[tokio::test]
async fn typed_crud_for_every_kind() -> Result<()> {
    use k8s_openapi::api::*;
    let server = ApiServer::start()?;
    let c: Client = server.client()?;
    let sel = json!({"matchLabels": {"app": "x"}});
    let lbl = json!({"app": "x"});
    ns_crud!(c, core::v1::Pod, json!({"metadata": {"name": "p1"}, "spec": pod_spec()}));
    ns_crud!(c, core::v1::Service, json!({"metadata": {"name": "s1"}, "spec": {"ports": [{"port": 80}]}}));
    ns_crud!(
        c,
        core::v1::Endpoints,
        json!({"metadata": {"name": "e1"}, "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]})
    );
    ns_crud!(c, core::v1::ConfigMap, json!({"metadata": {"name": "cm1"}, "data": {"k": "v"}}));
    ns_crud!(c, core::v1::Secret, json!({"metadata": {"name": "sec1"}, "stringData": {"k": "v"}}));
    ns_crud!(c, core::v1::ServiceAccount, json!({"metadata": {"name": "sa1"}}));
    ns_crud!(
        c,
        core::v1::Event,
        json!({"metadata": {"name": "ev1"}, "involvedObject": {"kind": "Pod", "name": "p1", "namespace": "default"}, "reason": "Test", "message": "m", "type": "Normal"})
    );
    ns_crud!(
        c,
        core::v1::PersistentVolumeClaim,
        json!({"metadata": {"name": "pvc1"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    );
    ns_crud!(c, core::v1::ResourceQuota, json!({"metadata": {"name": "rq1"}, "spec": {"hard": {"pods": "10"}}}));
    ns_crud!(
        c,
        core::v1::LimitRange,
        json!({"metadata": {"name": "lr1"}, "spec": {"limits": [{"type": "Container", "default": {"cpu": "100m"}}]}})
    );
    ns_crud!(
        c,
        core::v1::ReplicationController,
        json!({"metadata": {"name": "rc1"}, "spec": {"replicas": 1, "selector": {"app": "x"}, "template": template(lbl.clone(), "Always")}})
    );
    ns_crud!(
        c,
        apps::v1::Deployment,
        json!({"metadata": {"name": "d1"}, "spec": {"selector": sel, "template": template(lbl.clone(), "Always")}})
    );
    ns_crud!(
        c,
        apps::v1::ReplicaSet,
        json!({"metadata": {"name": "rs1"}, "spec": {"selector": sel, "template": template(lbl.clone(), "Always")}})
    );
    ns_crud!(
        c,
        apps::v1::StatefulSet,
        json!({"metadata": {"name": "sts1"}, "spec": {"serviceName": "s", "selector": sel, "template": template(lbl.clone(), "Always")}})
    );
    ns_crud!(
        c,
        apps::v1::DaemonSet,
        json!({"metadata": {"name": "ds1"}, "spec": {"selector": sel, "template": template(lbl.clone(), "Always")}})
    );
    ns_crud!(
        c,
        batch::v1::Job,
        json!({"metadata": {"name": "j1"}, "spec": {"template": template(json!({}), "Never")}})
    );
    ns_crud!(
        c,
        batch::v1::CronJob,
        json!({"metadata": {"name": "cj1"}, "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template(json!({}), "OnFailure")}}}})
    );
    ns_crud!(
        c,
        autoscaling::v2::HorizontalPodAutoscaler,
        json!({"metadata": {"name": "h1"}, "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d1"}, "maxReplicas": 3}})
    );
    ns_crud!(
        c,
        discovery::v1::EndpointSlice,
        json!({"metadata": {"name": "es1"}, "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}]})
    );
    ns_crud!(
        c,
        coordination::v1::Lease,
        json!({"metadata": {"name": "l1"}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15}})
    );
    ns_crud!(
        c,
        networking::v1::Ingress,
        json!({"metadata": {"name": "ing1"}, "spec": {"rules": [{"host": "a.example.com", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "s1", "port": {"number": 80}}}}]}}]}})
    );
    ns_crud!(c, networking::v1::NetworkPolicy, json!({"metadata": {"name": "np1"}, "spec": {"podSelector": {}}}));
    ns_crud!(
        c,
        rbac::v1::Role,
        json!({"metadata": {"name": "r1"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
    );
    ns_crud!(
        c,
        rbac::v1::RoleBinding,
        json!({"metadata": {"name": "rb1"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r1"}, "subjects": [{"kind": "ServiceAccount", "name": "sa1", "namespace": "default"}]})
    );
    cluster_crud!(c, core::v1::Node, json!({"metadata": {"name": "n1"}, "spec": {"podCIDR": "10.244.1.0/24"}}));
    cluster_crud!(
        c,
        core::v1::PersistentVolume,
        json!({"metadata": {"name": "pv1"}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/pv1"}}})
    );
    cluster_crud!(
        c,
        storage::v1::StorageClass,
        json!({"metadata": {"name": "sc1"}, "provisioner": "minik8s.io/hostpath"})
    );
    cluster_crud!(
        c,
        networking::v1::IngressClass,
        json!({"metadata": {"name": "ic1"}, "spec": {"controller": "minik8s.io/nginx"}})
    );
    cluster_crud!(
        c,
        rbac::v1::ClusterRole,
        json!({"metadata": {"name": "cr1"}, "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]})
    );
    cluster_crud!(
        c,
        rbac::v1::ClusterRoleBinding,
        json!({"metadata": {"name": "crb1"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cr1"}, "subjects": [{"kind": "User", "name": "u"}]})
    );
    cluster_crud!(c, scheduling::v1::PriorityClass, json!({"metadata": {"name": "pc1"}, "value": 1000}));
    ns_crud!(
        c,
        policy::v1::PodDisruptionBudget,
        json!({"metadata": {"name": "pdb1"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}}})
    );
    ns_crud!(c, apps::v1::ControllerRevision, json!({"metadata": {"name": "cr1"}, "revision": 1, "data": {"a": 1}}));
    ns_crud!(c, core::v1::PodTemplate, json!({"metadata": {"name": "pt1"}, "template": template(json!({}), "Always")}));
    Ok(())
}

#[tokio::test]
async fn namespaces_lifecycle() -> Result<()> {
    let server = ApiServer::start()?;
    let c = server.client()?;
    let nss: Api<Namespace> = Api::all(c.clone());
    for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        nss.get(n).await.map_err(|e| anyhow!("system namespace {n}: {e}"))?;
    }
    // Creating into a missing namespace is 404 `namespaces "nope" not found`.
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "nope");
    let err = cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "x"}}))?).await;
    match err {
        Err(kube::Error::Api(s)) => {
            ensure!(s.code == 404 && s.message == "namespaces \"nope\" not found", "{s:?}");
        }
        other => anyhow::bail!("expected 404, got {other:?}"),
    }
    nss.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "tmp"}}))?).await?;
    nss.delete("tmp", &DeleteParams::default()).await?;
    let ns = nss.get("tmp").await?;
    ensure!(ns.status.and_then(|s| s.phase).as_deref() == Some("Terminating"), "namespace not Terminating");
    // A terminating namespace refuses new objects with 403.
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "tmp");
    let err = cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "x"}}))?).await;
    ensure!(err.as_ref().err().map(code) == Some(403), "{err:?}");
    // The namespace controller's last step: finalize, then the namespace is gone.
    let mut ns = nss.get("tmp").await?;
    ns.spec = Some(k8s_openapi::api::core::v1::NamespaceSpec { finalizers: Some(vec![]) });
    let body = serde_json::to_vec(&ns)?;
    let req = http::Request::put(format!("/api/v1/namespaces/tmp/finalize"))
        .header("content-type", "application/json")
        .body(body)?;
    let _: Namespace = c.request(req).await?;
    let gone = nss.get("tmp").await;
    ensure!(gone.as_ref().err().map(code) == Some(404), "namespace still there: {gone:?}");
    Ok(())
}

#[tokio::test]
async fn list_pagination_over_1000_objects_is_a_consistent_snapshot() -> Result<()> {
    let server = ApiServer::start()?;
    let c = server.client()?;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let total = 1050usize;
    let names: Vec<String> = (0..total).map(|i| format!("cm-{i:05}")).collect();
    futures::stream::iter(names.iter().cloned())
        .map(|n| {
            let cms = cms.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": n, "labels": {"batch": "a"}}}))?;
                cms.create(&PostParams::default(), &cm).await.map(|_| ()).map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut first_rv = None;
    let mut pages = 0;
    loop {
        let mut lp = ListParams::default().labels("batch=a").limit(100);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = cms.list(&lp).await?;
        pages += 1;
        ensure!(page.items.len() <= 100);
        let rv = page.metadata.resource_version.clone();
        if first_rv.is_none() {
            first_rv = rv.clone();
            // Writes after the first page must not show up in later pages.
            let late: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": "cm-00000a-late", "labels": {"batch": "a"}}}))?;
            cms.create(&PostParams::default(), &late).await?;
            cms.delete("cm-00999", &DeleteParams::default()).await?;
        } else {
            ensure!(rv == first_rv, "page served at another revision: {rv:?} vs {first_rv:?}");
        }
        seen.extend(page.items.iter().map(|o| o.name_any()));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => token = Some(t),
            _ => break,
        }
    }
    ensure!(pages == 11, "expected 11 pages, got {pages}");
    ensure!(seen == names, "pages are not the snapshot: {} items", seen.len());
    // A fresh list sees the late changes.
    let all = cms.list(&ListParams::default().labels("batch=a")).await?;
    ensure!(all.items.len() == total, "{}", all.items.len());
    // A garbage continue token is refused.
    let bad = cms.list(&ListParams::default().limit(5).continue_token("garbage")).await;
    ensure!(bad.as_ref().err().map(code) == Some(422), "{bad:?}");
    Ok(())
}

use futures::StreamExt;

#[tokio::test]
async fn sixteen_concurrent_read_modify_write_updaters_lose_nothing() -> Result<()> {
    let server = ApiServer::start()?;
    let c = server.client()?;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "counter"}, "data": {"n": "0"}}))?,
    )
    .await?;
    let per = 25;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let cms = cms.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0u32;
            for _ in 0..per {
                loop {
                    let mut cm = cms.get("counter").await?;
                    let n: i64 = cm.data.as_ref().and_then(|d| d.get("n")).and_then(|v| v.parse().ok()).unwrap_or(0);
                    cm.data.get_or_insert_with(Default::default).insert("n".into(), (n + 1).to_string());
                    match cms.replace("counter", &PostParams::default(), &cm).await {
                        Ok(_) => break,
                        Err(e) if code(&e) == 409 => conflicts += 1,
                        Err(e) => return Err(anyhow::Error::from(e)),
                    }
                }
            }
            Ok::<u32, anyhow::Error>(conflicts)
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await??;
    }
    let cm = cms.get("counter").await?;
    let n = cm.data.and_then(|d| d.get("n").cloned()).unwrap_or_default();
    ensure!(n == (16 * per).to_string(), "counter is {n}, expected {}", 16 * per);
    eprintln!("16 updaters x {per}: {conflicts} conflicts retried");
    Ok(())
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() -> Result<()> {
    let server = ApiServer::start()?;
    let c = server.client()?;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}))?,
    )
    .await?;
    cms.delete("held", &DeleteParams::default()).await?;
    let cm = cms.get("held").await?;
    ensure!(cm.metadata.deletion_timestamp.is_some(), "no deletionTimestamp");
    // No new finalizers on an object being deleted.
    let add = cms
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}})),
        )
        .await;
    ensure!(add.as_ref().err().map(code) == Some(422), "{add:?}");
    // Other changes are fine; removing the last finalizer deletes.
    cms.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}))).await?;
    cms.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    let gone = cms.get("held").await;
    ensure!(gone.as_ref().err().map(code) == Some(404), "{gone:?}");
    // Foreground propagation adds the foregroundDeletion finalizer (the garbage collector
    // removes it).
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "fg"}}))?).await?;
    cms.delete("fg", &DeleteParams::foreground()).await?;
    let fg = cms.get("fg").await?;
    ensure!(fg.finalizers().contains(&"foregroundDeletion".to_string()), "{:?}", fg.finalizers());
    Ok(())
}

#[tokio::test]
async fn generation_status_and_scale_subresources() -> Result<()> {
    let server = ApiServer::start()?;
    let c = server.client()?;
    let deps: Api<Deployment> = Api::namespaced(c.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"replicas": 2,
        "selector": {"matchLabels": {"app": "web"}}, "template": template(json!({"app": "web"}), "Always")},
        "status": {"replicas": 99}}))?;
    let d = deps.create(&PostParams::default(), &d).await?;
    ensure!(d.metadata.generation == Some(1));
    ensure!(d.status.as_ref().and_then(|s| s.replicas).is_none(), "status was not cleared on create");
    // Metadata-only change: generation stays.
    let d =
        deps.patch("web", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}))).await?;
    ensure!(d.metadata.generation == Some(1), "{:?}", d.metadata.generation);
    // Spec change: generation bumps.
    let d = deps.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minReadySeconds": 5}}))).await?;
    ensure!(d.metadata.generation == Some(2));
    // Status through the main resource is ignored; through /status it sticks, without
    // touching spec or generation.
    let d = deps.patch("web", &PatchParams::default(), &Patch::Merge(json!({"status": {"replicas": 7}}))).await?;
    ensure!(d.status.as_ref().and_then(|s| s.replicas).is_none());
    let d = deps
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 2, "observedGeneration": 2}, "spec": {"replicas": 50}})),
        )
        .await?;
    ensure!(d.status.as_ref().and_then(|s| s.replicas) == Some(2));
    ensure!(d.spec.replicas == Some(2), "status update changed spec");
    ensure!(d.metadata.generation == Some(2));
    // Scale subresource.
    let scale = deps.get_scale("web").await?;
    ensure!(scale.spec.and_then(|s| s.replicas) == Some(2));
    ensure!(scale.status.as_ref().and_then(|s| s.selector.clone()).as_deref() == Some("app=web"));
    deps.patch_scale("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 4}}))).await?;
    let d = deps.get("web").await?;
    ensure!(d.spec.replicas == Some(4));
    ensure!(d.metadata.generation == Some(3));
    let bad = deps.patch_scale("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": -1}}))).await;
    ensure!(bad.as_ref().err().map(code) == Some(422), "{bad:?}");
    Ok(())
}

#[tokio::test]
async fn pod_binding_and_eviction() -> Result<()> {
    let server = ApiServer::start()?;
    let c = server.client()?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": pod_spec()}))?,
    )
    .await?;
    let p = pods.get("p").await?;
    ensure!(p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"));
    let spec = p.spec.clone().unwrap_or_default();
    ensure!(
        spec.restart_policy.as_deref() == Some("Always") && spec.scheduler_name.as_deref() == Some("default-scheduler")
    );
    let bind = |node: &str| {
        let body = serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": node}}))
            .unwrap_or_default();
        http::Request::post("/api/v1/namespaces/default/pods/p/binding")
            .header("content-type", "application/json")
            .body(body)
    };
    let _: kube::core::Status = c.request(bind("node-1")?).await?;
    let p = pods.get("p").await?;
    ensure!(p.spec.and_then(|s| s.node_name).as_deref() == Some("node-1"));
    let again = c.request::<kube::core::Status>(bind("node-2")?).await;
    ensure!(again.as_ref().err().map(code) == Some(409), "{again:?}");
    // Bound pods delete gracefully: marked, not gone, until deleted with grace 0.
    pods.delete("p", &DeleteParams::default()).await?;
    let p = pods.get("p").await?;
    ensure!(p.metadata.deletion_grace_period_seconds == Some(30), "{:?}", p.metadata.deletion_grace_period_seconds);
    pods.delete("p", &DeleteParams::default().grace_period(0)).await?;
    ensure!(pods.get("p").await.err().map(|e| code(&e)) == Some(404));
    // Eviction of an unbound pod deletes it.
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "q"}, "spec": pod_spec()}))?,
    )
    .await?;
    pods.evict("q", &Default::default()).await?;
    ensure!(pods.get("q").await.err().map(|e| code(&e)) == Some(404));
    Ok(())
}

#[tokio::test]
async fn service_addresses_are_allocated_and_released() -> Result<()> {
    let server = ApiServer::start_with(&[
        "--service-cluster-ip-range",
        "10.100.0.0/24",
        "--service-node-port-range",
        "30000-30009",
    ])?;
    let c = server.client()?;
    let svcs: Api<Service> = Api::namespaced(c.clone(), "default");
    let svc = |name: &str, extra: Value| -> Result<Service> {
        let mut v = json!({"metadata": {"name": name}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        json_patch::merge(&mut v, &extra);
        Ok(serde_json::from_value(v)?)
    };
    let a = svcs
        .create(&PostParams::default(), &svc("a", json!({"spec": {"ports": [{"port": 80, "nodePort": 30005}]}}))?)
        .await
        .map_err(|e| anyhow!("L{}: {e}", line!()))?;
    let a_ip = a.spec.as_ref().and_then(|s| s.cluster_ip.clone()).unwrap_or_default();
    ensure!(a_ip.starts_with("10.100.0."), "{a_ip}");
    // Taken node port → 422; out of range → 422; taken IP → 422; nothing half stored.
    let taken = svcs
        .create(&PostParams::default(), &svc("b", json!({"spec": {"ports": [{"port": 80, "nodePort": 30005}]}}))?)
        .await;
    ensure!(taken.as_ref().err().map(code) == Some(422), "{taken:?}");
    let out = svcs
        .create(&PostParams::default(), &svc("b", json!({"spec": {"ports": [{"port": 80, "nodePort": 31000}]}}))?)
        .await;
    ensure!(out.as_ref().err().map(code) == Some(422), "{out:?}");
    let ip = svcs.create(&PostParams::default(), &svc("b", json!({"spec": {"clusterIP": a_ip.clone()}}))?).await;
    ensure!(ip.as_ref().err().map(code) == Some(422), "{ip:?}");
    let bad_ip = svcs.create(&PostParams::default(), &svc("b", json!({"spec": {"clusterIP": "10.0.0.5"}}))?).await;
    ensure!(bad_ip.as_ref().err().map(code) == Some(422), "{bad_ip:?}");
    ensure!(svcs.get("b").await.is_err(), "a refused service was stored");
    // Dynamic node ports fill the rest of the range.
    let b =
        svcs.create(&PostParams::default(), &svc("b", json!({}))?).await.map_err(|e| anyhow!("L{}: {e}", line!()))?;
    let np = b.spec.as_ref().and_then(|s| s.ports.as_ref()).and_then(|p| p[0].node_port).unwrap_or(0);
    ensure!((30000..=30009).contains(&np) && np != 30005, "{np}");
    // Delete releases: the port and the IP can be taken again.
    svcs.delete("a", &DeleteParams::default()).await.map_err(|e| anyhow!("L{}: {e}", line!()))?;
    svcs.create(
        &PostParams::default(),
        &svc("c", json!({"spec": {"clusterIP": a_ip, "ports": [{"port": 80, "nodePort": 30005}]}}))?,
    )
    .await
    .map_err(|e| anyhow!("L{}: {e}", line!()))?;
    // Updates keep the allocations (kubectl replace without clusterIP).
    let mut c2 = svcs.get("c").await.map_err(|e| anyhow!("L{}: {e}", line!()))?;
    if let Some(s) = c2.spec.as_mut() {
        s.cluster_ip = None;
        s.cluster_ips = None;
    }
    let c3 = svcs.replace("c", &PostParams::default(), &c2).await.map_err(|e| anyhow!("L{}: {e}", line!()))?;
    ensure!(c3.spec.and_then(|s| s.cluster_ip) == a.spec.and_then(|s| s.cluster_ip));
    Ok(())
}

#[tokio::test]
async fn field_and_label_selectors() -> Result<()> {
    let server = ApiServer::start()?;
    let c = server.client()?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    for (n, tier) in [("a", "fe"), ("b", "be"), ("c", "fe")] {
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": n, "labels": {"tier": tier}}, "spec": pod_spec()}))?,
        )
        .await?;
    }
    let names = |l: kube::core::ObjectList<Pod>| l.items.iter().map(|p| p.name_any()).collect::<Vec<_>>();
    ensure!(names(pods.list(&ListParams::default().labels("tier=fe")).await?) == ["a", "c"]);
    ensure!(names(pods.list(&ListParams::default().labels("tier in (be,xx)")).await?) == ["b"]);
    ensure!(names(pods.list(&ListParams::default().labels("tier notin (fe)")).await?) == ["b"]);
    ensure!(names(pods.list(&ListParams::default().fields("metadata.name=c")).await?) == ["c"]);
    ensure!(names(pods.list(&ListParams::default().fields("status.phase=Pending,spec.nodeName=")).await?).len() == 3);
    let all: Api<Pod> = Api::all(c.clone());
    ensure!(all.list(&ListParams::default()).await?.items.len() == 3);
    let bad = pods.list(&ListParams::default().fields("spec.bogus=1")).await;
    ensure!(bad.as_ref().err().map(code) == Some(400), "{bad:?}");
    let bad = pods.list(&ListParams::default().labels("a in (")).await;
    ensure!(bad.as_ref().err().map(code) == Some(400), "{bad:?}");
    tokio::time::sleep(Duration::from_millis(1)).await;
    Ok(())
}

/// The `kubernetes` Service's endpoints name this apiserver: the host's primary address for
/// an apiserver listening on every address, none for one on loopback only (pods could not
/// reach it).
#[tokio::test]
async fn the_kubernetes_service_has_endpoints_when_pods_can_reach_the_apiserver() -> Result<()> {
    use k8s_openapi::api::core::v1::Endpoints;
    let everywhere = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let eps: Api<Endpoints> = Api::namespaced(everywhere.client()?, "default");
    let ep = eps.get("kubernetes").await?;
    let subset = ep.subsets.unwrap_or_default().into_iter().next().ok_or_else(|| anyhow!("no subsets"))?;
    let ip: std::net::IpAddr = subset.addresses.unwrap_or_default()[0].ip.parse()?;
    ensure!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
    ensure!(subset.ports.unwrap_or_default()[0].port == everywhere.port as i32);

    let local = ApiServer::start()?;
    let eps: Api<Endpoints> = Api::namespaced(local.client()?, "default");
    ensure!(eps.get_opt("kubernetes").await?.is_none(), "a loopback-only apiserver advertised endpoints");
    Ok(())
}

/// A NetworkPolicy with a bad CIDR, `except` outside its block, a port range upside down or a
/// peer with nothing in it is refused with 422 and the field named, as kube-apiserver
/// refuses it, and nothing is stored; the official kubectl prints the reason with the field
/// path once.
#[tokio::test]
async fn network_policies_with_bad_peers_or_ports_are_refused() -> Result<()> {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let server = ApiServer::start()?;
    let nps: Api<NetworkPolicy> = Api::namespaced(server.client()?, "default");
    let np = |name: &str, ingress: Value| -> Result<NetworkPolicy> {
        Ok(serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"podSelector": {}, "ingress": [ingress]}}),
        )?)
    };
    for (name, ingress, field, message) in [
        (
            "cidr",
            json!({"from": [{"ipBlock": {"cidr": "10.0.0.300/8"}}]}),
            "spec.ingress[0].from[0].ipBlock.cidr",
            "must be a valid CIDR value",
        ),
        (
            "except",
            json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.1.0.0/24"]}}]}),
            "spec.ingress[0].from[0].ipBlock.except[0]",
            "must be a strict subset of `cidr`",
        ),
        (
            "range",
            json!({"ports": [{"port": 9000, "endPort": 8000}]}),
            "spec.ingress[0].ports[0].endPort",
            "must be greater than or equal to `port`",
        ),
        ("peer", json!({"from": [{}]}), "spec.ingress[0].from[0]", "must specify a peer"),
    ] {
        let refused = nps.create(&PostParams::default(), &np(name, ingress)?).await;
        match &refused {
            Err(kube::Error::Api(s)) => ensure!(
                s.code == 422
                    && s.reason == "Invalid"
                    && s.message.contains(&format!("{field}: "))
                    && s.message.contains(message),
                "{name}: {s:?}"
            ),
            other => anyhow::bail!("{name}: {other:?}"),
        }
        ensure!(nps.get_opt(name).await?.is_none(), "{name}: a refused NetworkPolicy was stored");
    }
    let ok = np(
        "ok",
        json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}}], "ports": [{"port": 8000, "endPort": 9000}]}),
    )?;
    nps.create(&PostParams::default(), &ok).await?;

    // What a user of the official kubectl reads.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("np.yaml");
    std::fs::write(
        &file,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: bad\nspec:\n  podSelector: {}\n  ingress:\n  - from:\n    - ipBlock:\n        cidr: 10.0.0.0/33\n",
    )?;
    let out = server.kubectl(&["apply", "-f", file.to_str().unwrap_or_default()])?;
    // The field path once: a Status cause's message leaves its field out (kubectl prints both).
    ensure!(
        !out.ok
            && out.stderr
                == "The NetworkPolicy \"bad\" is invalid: spec.ingress[0].from[0].ipBlock.cidr: Invalid value: \"10.0.0.0/33\": \
                    must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)\n",
        "{out:?}"
    );
    Ok(())
}
