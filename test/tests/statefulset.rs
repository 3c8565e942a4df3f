//! The StatefulSet controller end to end. At the API (the real controller-manager, a fake
//! node agent playing the kubelets): a selector that does not match the template is a 422;
//! pods come up one at a time in ordinal order, each after its predecessor is Ready; each has
//! its claims from `volumeClaimTemplates` (`data-web-<n>`), its identity labels, hostname and
//! subdomain, and its hostname on the headless Service's endpoints; a deleted pod comes back
//! under its name with the same claim; a partitioned rolling update replaces only the
//! ordinals at or above the partition; `kubectl rollout history` / `undo` work; scaling down
//! removes the highest ordinals and, with `whenScaled: Delete`, their claims; with
//! `whenDeleted: Delete` the last claim goes with the set; `Parallel` creates every pod at once.
//!
//! On Docker (apiserver, scheduler, controller-manager, a kubelet): three pods come up in
//! order behind a readiness probe, `kubectl rollout status` (the official kubectl) waits for
//! them, a deleted pod is back under its name, and a partition-2 update replaces web-2 only.
//!
//! Cluster DNS (kubeproxy's, in a network namespace, the pods played by the fake agent)
//! answers the stable names `web-<n>.web.<ns>.svc.cluster.local` through the headless Service.
//!
//! With volumes, on Docker (two kubelets, the binder and the local-path provisioner): the
//! claims of `volumeClaimTemplates` without a class get the default `local-path` class and
//! are provisioned on their pod's node; each pod writes its hostname into `/data/id`; a
//! deleted web-1 comes back on its volume's node, bound to `data-web-1`, and reads (through
//! `kubectl exec`) what the first web-1 wrote.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::controller_manager::{kubectl_ok, namespace, ControllerManager, FakeNodeAgent, Fixture};
use e2e::kubelet::Cluster;
use e2e::kubeproxy::{prerequisites, Lab};
use e2e::{eventually, ApiServer};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

fn statefulset(spec: Value) -> Result<StatefulSet> {
    let mut full = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                "command": ["sh", "-c", "sleep 3600"]}]}}
        }
    });
    if let (Some(s), Some(extra)) = (full.pointer_mut("/spec").and_then(Value::as_object_mut), spec.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    Ok(serde_json::from_value(full)?)
}

async fn live_pods(pods: &Api<Pod>) -> Vec<Pod> {
    let list = pods.list(&ListParams::default().labels("app=web")).await;
    let mut out: Vec<Pod> = list
        .map(|l| l.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect())
        .unwrap_or_default();
    out.sort_by_key(|p| p.metadata.name.clone());
    out
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter().filter_map(|p| p.metadata.name.clone()).collect()
}

fn label<'a>(p: &'a Pod, k: &str) -> &'a str {
    p.metadata.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str).unwrap_or("")
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Wait until the live pods are exactly `want` (by name) and `ok` holds for them.
async fn wait_pods(pods: &Api<Pod>, want: &[&str], ok: impl Fn(&[Pod]) -> bool) -> Result<Vec<Pod>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = live_pods(pods).await;
        if names(&now) == want && ok(&now) {
            return Ok(now);
        }
        if Instant::now() > deadline {
            bail!("pods: want {want:?}, have {:?}", names(&now));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn status(sets: &Api<StatefulSet>) -> Result<k8s_openapi::api::apps::v1::StatefulSetStatus> {
    Ok(sets.get("web").await?.status.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identity_claims_order_and_partitioned_update_at_the_api() -> Result<()> {
    let t = Fixture::start("sts").await?;
    let sets: Api<StatefulSet> = t.api();
    let pods: Api<Pod> = t.api();
    let claims: Api<PersistentVolumeClaim> = t.api();
    let revisions: Api<ControllerRevision> = t.api();
    let pp = PostParams::default();

    // The apiserver refuses a selector the template's labels do not match.
    let mut bad = statefulset(json!({}))?;
    bad.spec.selector.match_labels = Some([("app".to_string(), "other".to_string())].into());
    match sets.create(&pp, &bad).await {
        Err(kube::Error::Api(e)) => ensure!(e.code == 422, "want 422, got {e:?}"),
        other => bail!("a mismatched selector was accepted: {other:?}"),
    }

    // Pods are held Pending, so only web-0 exists until it is made Ready by hand.
    t.agent.ready.store(false, std::sync::atomic::Ordering::SeqCst);
    let set = statefulset(json!({
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Delete"},
        "volumeClaimTemplates": [{"metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}}]
    }))?;
    let set = sets.create(&pp, &set).await?;
    let set_uid = set.metadata.uid.clone().unwrap_or_default();
    wait_pods(&pods, &["web-0"], |_| true).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(names(&live_pods(&pods).await) == ["web-0"], "web-1 was created before web-0 was Ready");
    t.agent.ready.store(true, std::sync::atomic::Ordering::SeqCst);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let running = json!({"status": {"phase": "Running", "podIP": "10.244.9.9", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": now}]}});
    pods.patch_status("web-0", &PatchParams::default(), &Patch::Merge(&running)).await?;
    let all = wait_pods(&pods, &["web-0", "web-1", "web-2"], |ps| ps.iter().all(ready)).await?;

    let update_revision = status(&sets).await?.update_revision.unwrap_or_default();
    for (i, p) in all.iter().enumerate() {
        let name = format!("web-{i}");
        ensure!(label(p, "statefulset.kubernetes.io/pod-name") == name, "{name}: pod-name label");
        ensure!(label(p, "apps.kubernetes.io/pod-index") == i.to_string(), "{name}: pod-index label");
        ensure!(label(p, "controller-revision-hash") == update_revision, "{name}: revision label");
        let spec = p.spec.clone().unwrap_or_default();
        ensure!(spec.hostname.as_deref() == Some(name.as_str()) && spec.subdomain.as_deref() == Some("web"));
        let claim =
            spec.volumes.iter().flatten().find(|v| v.name == "data").and_then(|v| v.persistent_volume_claim.clone());
        ensure!(claim.map(|c| c.claim_name) == Some(format!("data-{name}")), "{name}: its volume names its claim");
        let owner = p.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true));
        ensure!(owner.is_some_and(|o| o.uid == set_uid && o.kind == "StatefulSet"), "{name}: controller reference");
        let c = claims.get(&format!("data-{name}")).await.with_context(|| format!("claim data-{name}"))?;
        ensure!(c.metadata.labels.as_ref().and_then(|l| l.get("app")).map(String::as_str) == Some("web"));
    }
    // Behind the headless Service `web`, each pod's endpoint carries its hostname: the name
    // cluster DNS answers as web-<n>.web.sts.svc.cluster.local.
    let headless: Service = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]}}))?;
    t.api::<Service>().create(&pp, &headless).await?;
    let slices: Api<EndpointSlice> = t.api();
    eventually(WAIT, || async {
        let list = slices.list(&ListParams::default().labels("kubernetes.io/service-name=web")).await;
        let mut hosts: Vec<String> = list
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .flat_map(|s| s.endpoints.unwrap_or_default())
            .filter_map(|e| e.hostname)
            .collect();
        hosts.sort();
        hosts == ["web-0", "web-1", "web-2"]
    })
    .await
    .context("the headless Service's endpoints carry the pods' hostnames")?;
    let revs = revisions.list(&ListParams::default()).await?.items;
    ensure!(revs.len() == 1 && revs[0].metadata.name.as_deref() == Some(update_revision.as_str()), "{revs:?}");

    // A deleted pod comes back under its name, with the same claim.
    let old_uid = uid(&all[1]);
    pods.delete("web-1", &DeleteParams::default()).await?;
    let back =
        wait_pods(&pods, &["web-0", "web-1", "web-2"], |ps| uid(&ps[1]) != old_uid && ps.iter().all(ready)).await?;
    let vols = back[1].spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
    ensure!(vols.iter().any(|v| v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == "data-web-1")));
    ensure!(claims.list(&ListParams::default()).await?.items.len() == 3, "no new claim");

    // Partition 2: only web-2 is replaced.
    let uids: Vec<String> = back.iter().map(uid).collect();
    let patch = json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}},
        "template": {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}}});
    sets.patch("web", &PatchParams::default(), &Patch::Strategic(&patch)).await?;
    let update_was = update_revision.clone();
    eventually(WAIT, || async {
        let s = status(&sets).await.unwrap_or_default();
        s.updated_replicas == Some(1) && s.ready_replicas == Some(3) && s.update_revision != Some(update_was.clone())
    })
    .await
    .context("partitioned update")?;
    let new_revision = status(&sets).await?.update_revision.unwrap_or_default();
    let after = wait_pods(&pods, &["web-0", "web-1", "web-2"], |ps| ps.iter().all(ready)).await?;
    ensure!(uid(&after[0]) == uids[0] && uid(&after[1]) == uids[1], "web-0/web-1 were replaced");
    ensure!(uid(&after[2]) != uids[2] && label(&after[2], "controller-revision-hash") == new_revision);
    ensure!(label(&after[0], "controller-revision-hash") == update_revision);
    ensure!(status(&sets).await?.current_revision.as_deref() == Some(update_revision.as_str()));
    let out = kubectl_ok(&t.api, &["-n", "sts", "rollout", "status", "statefulset/web", "--timeout=60s"]).await?;
    ensure!(out.contains("partitioned roll out complete: 1 new pods have been updated"), "{out}");
    ensure!(revisions.list(&ListParams::default()).await?.items.len() == 2);

    // `kubectl rollout history` lists both revisions; `undo` brings the first template back,
    // as the first revision renumbered 3.
    let hist = kubectl_ok(&t.api, &["-n", "sts", "rollout", "history", "statefulset/web"]).await?;
    ensure!(hist.contains("1 ") && hist.contains("2 "), "{hist}");
    kubectl_ok(&t.api, &["-n", "sts", "rollout", "undo", "statefulset/web"]).await?;
    let image = |s: &StatefulSet| {
        s.spec.template.spec.as_ref().and_then(|p| p.containers.first()).and_then(|c| c.image.clone())
    };
    ensure!(image(&sets.get("web").await?).as_deref() == Some("busybox"), "undo restores the template");
    eventually(WAIT, || async {
        let s = status(&sets).await.unwrap_or_default();
        let renumbered = revisions.get(&update_revision).await.ok().and_then(|r| r.revision) == Some(3);
        s.update_revision.as_deref() == Some(update_revision.as_str()) && renumbered
    })
    .await
    .context("undo: the first revision is the update revision again, numbered 3")?;

    // Scale to 1: web-2 and web-1 go, and with whenScaled=Delete their claims too.
    sets.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1}}))).await?;
    wait_pods(&pods, &["web-0"], |_| true).await?;
    eventually(WAIT, || async {
        let left = claims.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        left.iter().filter_map(|c| c.metadata.name.clone()).collect::<Vec<_>>() == ["data-web-0"]
    })
    .await
    .context("the scaled-down claims are deleted, data-web-0 stays")?;

    // whenDeleted=Delete: the set becomes its claim's owner, and deleting the set deletes it.
    let policy = json!({"spec": {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete"}}});
    sets.patch("web", &PatchParams::default(), &Patch::Merge(&policy)).await?;
    eventually(WAIT, || async {
        let c = claims.get("data-web-0").await.ok();
        c.and_then(|c| c.metadata.owner_references).is_some_and(|r| r.iter().any(|r| r.uid == set_uid))
    })
    .await
    .context("data-web-0 owned by the set")?;
    sets.delete("web", &DeleteParams::default()).await?;
    eventually(WAIT, || async {
        let left = claims.list(&ListParams::default()).await.map(|l| l.items.len()).unwrap_or(1);
        left == 0 && live_pods(&pods).await.is_empty()
    })
    .await
    .context("the set's pods and claim are deleted with it")?;

    // Parallel: every pod is created at once, none waiting for another to be Ready.
    t.agent.ready.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut par = statefulset(json!({"podManagementPolicy": "Parallel"}))?;
    par.metadata.name = Some("par".into());
    sets.create(&pp, &par).await?;
    eventually(WAIT, || async {
        let list = pods.list(&ListParams::default().labels("app=web")).await.map(|l| l.items).unwrap_or_default();
        let pending = list.iter().filter(|p| !ready(p)).count();
        names(&list) == ["par-0", "par-1", "par-2"] && pending == 3
    })
    .await
    .context("Parallel: three Pending pods")?;
    Ok(())
}

fn ready_since(p: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    let c = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(c.last_transition_time.as_ref()?.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_come_up_in_order_on_docker_and_keep_their_names() -> Result<()> {
    let Some(c) = Cluster::start("sts", 1)? else { return Ok(()) };
    let client = c.api.client()?;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut set = statefulset(json!({}))?;
    if let Some(ctr) = set.spec.template.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        ctr.readiness_probe = Some(serde_json::from_value(json!({
            "exec": {"command": ["true"]}, "initialDelaySeconds": 2, "periodSeconds": 1
        }))?);
    }
    sets.create(&PostParams::default(), &set).await?;
    let out = c.api.kubectl(&["rollout", "status", "statefulset/web", "--timeout=180s"])?;
    ensure!(out.ok, "rollout status: {}{}\n{}", out.stdout, out.stderr, c.log_tail());
    ensure!(out.stdout.contains("partitioned roll out complete: 3 new pods have been updated"), "{}", out.stdout);
    let all = wait_pods(&pods, &["web-0", "web-1", "web-2"], |ps| ps.iter().all(ready)).await?;
    // Each pod was created only once its predecessor was Ready.
    for i in 1..3 {
        let created = all[i].metadata.creation_timestamp.as_ref().map(|t| t.0);
        let prev_ready = ready_since(&all[i - 1]);
        ensure!(
            created.is_some() && prev_ready.is_some() && created >= prev_ready,
            "web-{i} created at {created:?}, before web-{} was Ready at {prev_ready:?}",
            i - 1
        );
    }
    for p in &all {
        ensure!(p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(c.nodes[0].node.as_str()));
    }

    // web-1 deleted comes back as web-1.
    let old = uid(&all[1]);
    pods.delete("web-1", &DeleteParams::default()).await?;
    let back = wait_pods(&pods, &["web-0", "web-1", "web-2"], |ps| uid(&ps[1]) != old && ps.iter().all(ready))
        .await
        .with_context(|| c.log_tail())?;

    // Partition 2: a template change replaces web-2 only.
    let uids: Vec<String> = back.iter().map(uid).collect();
    let patch = json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}},
        "template": {"metadata": {"annotations": {"rollout": "2"}}}}});
    sets.patch("web", &PatchParams::default(), &Patch::Strategic(&patch)).await?;
    let after = wait_pods(&pods, &["web-0", "web-1", "web-2"], |ps| uid(&ps[2]) != uids[2] && ps.iter().all(ready))
        .await
        .with_context(|| c.log_tail())?;
    ensure!(uid(&after[0]) == uids[0] && uid(&after[1]) == uids[1], "web-0/web-1 were replaced");
    let out = c.api.kubectl(&["rollout", "status", "statefulset/web", "--timeout=120s"])?;
    ensure!(out.ok, "rollout status: {}{}", out.stdout, out.stderr);
    ensure!(out.stdout.contains("partitioned roll out complete: 1 new pods have been updated"), "{}", out.stdout);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stable_dns_names_through_a_headless_service() -> Result<()> {
    if !prerequisites(&["ip", "busybox", "iptables-restore"]) {
        return Ok(());
    }
    let api = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let client = api.client()?;
    namespace(&client, "dns").await?;
    let _cm = ControllerManager::start(&api, &[])?;
    let _agent = FakeNodeAgent::start(client.clone());
    let headless: Service = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]}}))?;
    Api::<Service>::namespaced(client.clone(), "dns").create(&PostParams::default(), &headless).await?;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "dns");
    sets.create(&PostParams::default(), &statefulset(json!({"replicas": 2}))?).await?;
    let pods: Api<Pod> = Api::namespaced(client, "dns");
    let running = wait_pods(&pods, &["web-0", "web-1"], |ps| ps.iter().all(ready)).await?;
    let mut lab = Lab::new(0)?;
    lab.start_kubeproxy(api.port, &["--dns-bind-address", "0.0.0.0:53"])?;
    for p in &running {
        let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();
        let name = format!("{}.web.dns.svc.cluster.local", p.metadata.name.as_deref().unwrap_or_default());
        let mut last = String::new();
        let found = eventually(WAIT, || {
            let out = lab.node_sh(&format!("busybox nslookup {name} 127.0.0.1"));
            last = String::from_utf8_lossy(&out.stdout).into_owned();
            let ok = !ip.is_empty() && last.contains(&ip);
            async move { ok }
        })
        .await;
        ensure!(found.is_ok(), "{name} does not resolve to {ip}: {last}\nkubeproxy log:\n{}", lab.kubeproxy_log());
    }
    Ok(())
}

/// `kubectl exec <pod> -- cat /data/id` (the official kubectl), trimmed; `None` while it fails.
fn read_id(c: &Cluster, pod: &str) -> Result<Option<String>> {
    let out = c.api.kubectl(&["exec", pod, "--", "cat", "/data/id"])?;
    Ok(out.ok.then(|| out.stdout.trim().to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_from_templates_are_provisioned_and_outlive_their_pods_on_docker() -> Result<()> {
    // Two nodes: the replacement web-1 must follow its node-affine local volume.
    let base = tempfile::tempdir()?;
    let dir = base.path().to_str().context("non-UTF-8 temp dir")?.to_string();
    let Some(c) = Cluster::start_with("stsvol", 2, &["--local-path-dir", &dir])? else { return Ok(()) };
    let client = c.api.client()?;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let volumes: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client);
    // Each pod writes its hostname (and a token telling one write from another) once; it is
    // Ready when the file is there. No storageClassName: the default class provisions.
    let mut set = statefulset(json!({
        "volumeClaimTemplates": [{"metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}}]
    }))?;
    let write = "test -s /data/id || echo \"$(hostname) $(cat /proc/sys/kernel/random/uuid)\" > /data/id; sleep 3600";
    if let Some(ps) = set.spec.template.spec.as_mut() {
        ps.containers[0].command = Some(vec!["sh".into(), "-c".into(), write.into()]);
        ps.containers[0].volume_mounts =
            Some(vec![serde_json::from_value(json!({"name": "data", "mountPath": "/data"}))?]);
        ps.containers[0].readiness_probe = Some(serde_json::from_value(json!({
            "exec": {"command": ["test", "-s", "/data/id"]}, "periodSeconds": 1
        }))?);
    }
    sets.create(&PostParams::default(), &set).await?;
    let out = c.api.kubectl(&["rollout", "status", "statefulset/web", "--timeout=240s"])?;
    ensure!(out.ok, "rollout status: {}{}\n{}\n{}", out.stdout, out.stderr, c.log_tail(), c.cm.log());
    let all = wait_pods(&pods, &["web-0", "web-1", "web-2"], |ps| ps.iter().all(ready)).await?;

    // Every claim got the default class and is Bound to a local-path volume.
    for i in 0..3 {
        let claim = claims.get(&format!("data-web-{i}")).await?;
        let spec = claim.spec.clone().unwrap_or_default();
        ensure!(spec.storage_class_name.as_deref() == Some("local-path"), "data-web-{i}: {spec:?}");
        let phase = claim.status.as_ref().and_then(|s| s.phase.clone());
        ensure!(phase.as_deref() == Some("Bound"), "data-web-{i} is {phase:?}");
        let id = read_id(&c, &format!("web-{i}"))?.context("reading /data/id")?;
        ensure!(id.starts_with(&format!("web-{i} ")), "web-{i} wrote {id:?}");
    }
    let before = read_id(&c, "web-1")?.context("reading web-1's /data/id")?;
    let volume = claims.get("data-web-1").await?.spec.and_then(|s| s.volume_name).unwrap_or_default();
    let pinned = volumes
        .get(&volume)
        .await?
        .spec
        .and_then(|s| s.node_affinity)
        .and_then(|a| a.required)
        .and_then(|r| r.node_selector_terms.first().cloned())
        .and_then(|t| t.match_expressions)
        .and_then(|e| e.first().and_then(|e| e.values.as_ref()?.first().cloned()))
        .unwrap_or_default();
    let node_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    ensure!(node_of(&all[1]) == pinned, "web-1 runs on {}, its volume {volume} is on {pinned:?}", node_of(&all[1]));

    // web-1 deleted comes back as web-1, with claim data-web-1, on the volume's node, and
    // finds what the first web-1 wrote.
    let old = uid(&all[1]);
    pods.delete("web-1", &DeleteParams::default()).await?;
    let back = wait_pods(&pods, &["web-0", "web-1", "web-2"], |ps| uid(&ps[1]) != old && ps.iter().all(ready))
        .await
        .with_context(|| c.log_tail())?;
    let vols = back[1].spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
    ensure!(vols.iter().any(|v| v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == "data-web-1")));
    ensure!(node_of(&back[1]) == pinned, "the new web-1 runs on {}, not on its volume's node", node_of(&back[1]));
    ensure!(claims.get("data-web-1").await?.spec.and_then(|s| s.volume_name) == Some(volume.clone()));
    ensure!(claims.list(&ListParams::default()).await?.items.len() == 3, "no new claim");
    let after = read_id(&c, "web-1")?.context("reading the new web-1's /data/id")?;
    ensure!(after == before, "web-1's data: {after:?}, it wrote {before:?}");
    Ok(())
}
