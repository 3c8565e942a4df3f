//! The StatefulSet controller (`pkg/controller/statefulset`): pods with stable names
//! `<set>-<ordinal>` (labels `statefulset.kubernetes.io/pod-name`,
//! `apps.kubernetes.io/pod-index`, `controller-revision-hash`; hostname = the pod's name,
//! subdomain = `spec.serviceName`), one PersistentVolumeClaim per `volumeClaimTemplates` entry
//! and ordinal (`<template>-<set>-<ordinal>`, created before the pod and kept when the pod
//! goes; `persistentVolumeClaimRetentionPolicy` as owner references for the garbage
//! collector). `OrderedReady` creates in ordinal order, each after its predecessors are
//! Running and Ready, and removes in reverse; `Parallel` does all at once. Updates:
//! `RollingUpdate` replaces pods with ordinals >= `partition`, highest first, one at a time,
//! each after the previous is Ready again; `OnDelete` only makes replacements of deleted pods
//! from the new template. Templates are ControllerRevisions (`history.rs`);
//! status is what `kubectl rollout status statefulset/…` reads.
//!
//! [`plan`] is the decision, a pure function of the set, its pods, revisions and claims;
//! [`reconcile`] applies it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use apimachinery::labels::selector_or_nothing;
use common::events::{Recorder, NORMAL, WARNING};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;

use crate::history::{self, Update, HASH_LABEL, REVISION_HASH_LABEL};
use crate::informer::{route_pods, trigger, Informer};
use crate::runner::{run_controller, Policy};
use crate::util::*;
use crate::Error;

pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// One write of a sync, in the order they are made.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    CreateRevision(Box<ControllerRevision>),
    /// Give an existing revision a new number (its template came back).
    RenumberRevision(String, i64),
    AdoptPod(String),
    ReleasePod(String),
    CreateClaim(Box<PersistentVolumeClaim>),
    CreatePod(Box<Pod>),
    /// Merge these labels into a pod whose identity labels are missing.
    LabelPod(String, BTreeMap<String, String>),
    /// (name, uid, why): `failed`, `scale down` or `update`.
    DeletePod(String, String, &'static str),
    /// Replace a claim's owner references (retention policy).
    SetClaimOwners(String, Vec<OwnerReference>),
    DeleteRevision(String),
}

#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub status: StatefulSetStatus,
    pub requeue: Option<Duration>,
}

/// The ordinal of a pod of `set` named `<set>-<n>` (`getParentNameAndOrdinal`).
pub fn ordinal(set_name: &str, pod_name: &str) -> Option<i32> {
    let n = pod_name.strip_prefix(set_name)?.strip_prefix('-')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// `isRunningAndReady`.
fn running_and_ready(p: &Pod) -> bool {
    pod_phase(p) == "Running" && is_pod_ready(p)
}

fn revision_of(p: &Pod) -> &str {
    p.metadata.labels.as_ref().and_then(|l| l.get(REVISION_HASH_LABEL)).map(String::as_str).unwrap_or("")
}

/// The claims of `ordinal`: (template name, claim name).
fn claim_names(set: &StatefulSet, ordinal: i32) -> Vec<(String, String)> {
    let set_name = set.metadata.name.as_deref().unwrap_or_default();
    set.spec
        .volume_claim_templates
        .iter()
        .flatten()
        .map(|t| {
            let t = t.metadata.name.clone().unwrap_or_default();
            let claim = format!("{t}-{set_name}-{ordinal}");
            (t, claim)
        })
        .collect()
}

/// The pod of `ordinal` made from `template` at `revision` (`newVersionedStatefulSetPod`).
pub fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, revision: &str, ordinal: i32) -> Pod {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let mut pod = pod_from_template(template, &ns, &set_name, owner_ref(set));
    let name = format!("{set_name}-{ordinal}");
    pod.metadata.generate_name = None;
    pod.metadata.name = Some(name.clone());
    let l = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    l.insert(POD_NAME_LABEL.into(), name.clone());
    l.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    l.insert(REVISION_HASH_LABEL.into(), revision.to_string());
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.hostname = Some(name);
    if let Some(svc) = set.spec.service_name.as_deref().filter(|s| !s.is_empty()) {
        spec.subdomain = Some(svc.to_string());
    }
    let claims = claim_names(set, ordinal);
    if !claims.is_empty() {
        let mut volumes: Vec<Volume> = claims
            .iter()
            .map(|(t, c)| Volume {
                name: t.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: c.clone(),
                    read_only: None,
                }),
                ..Default::default()
            })
            .collect();
        let rest = spec.volumes.take().unwrap_or_default();
        volumes.extend(rest.into_iter().filter(|v| !claims.iter().any(|(t, _)| *t == v.name)));
        spec.volumes = Some(volumes);
    }
    pod
}

/// The claim of `template` for `ordinal` (`getPersistentVolumeClaims`): the template with
/// the selector's labels, owned by the set when `whenDeleted` is Delete.
fn new_claim(set: &StatefulSet, template: &PersistentVolumeClaim, claim: &str) -> PersistentVolumeClaim {
    let mut c = template.clone();
    let mut labels = c.metadata.labels.take().unwrap_or_default();
    labels.extend(set.spec.selector.match_labels.clone().unwrap_or_default());
    let policy = retention(set);
    c.metadata = ObjectMeta {
        name: Some(claim.to_string()),
        namespace: set.metadata.namespace.clone(),
        labels: Some(labels),
        annotations: c.metadata.annotations.take(),
        owner_references: (policy.0 == "Delete").then(|| vec![plain_ref(owner_ref(set))]),
        ..Default::default()
    };
    c.status = None;
    c
}

/// (whenDeleted, whenScaled).
fn retention(set: &StatefulSet) -> (&str, &str) {
    let p = set.spec.persistent_volume_claim_retention_policy.as_ref();
    (
        p.and_then(|p| p.when_deleted.as_deref()).unwrap_or("Retain"),
        p.and_then(|p| p.when_scaled.as_deref()).unwrap_or("Retain"),
    )
}

/// An owner reference that is not the claim's controller.
fn plain_ref(mut r: OwnerReference) -> OwnerReference {
    r.controller = None;
    r.block_owner_deletion = None;
    r
}

/// The owner references a claim should have (`updateClaimOwnerRefForSetAndPod`): to the set
/// when whenDeleted is Delete (unless the pod is scaled away and whenScaled deletes it), to the
/// pod when whenScaled is Delete and the pod is condemned.
fn claim_owners(set: &StatefulSet, pod: &Pod, claim: &PersistentVolumeClaim, condemned: bool) -> Vec<OwnerReference> {
    let set_uid = set.metadata.uid.clone().unwrap_or_default();
    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut refs: Vec<OwnerReference> = claim
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.uid != set_uid && r.uid != pod_uid)
        .collect();
    let (deleted, scaled) = retention(set);
    let to_pod = scaled == "Delete" && condemned;
    if deleted == "Delete" && !to_pod {
        refs.push(plain_ref(owner_ref(set)));
    }
    if to_pod {
        refs.push(OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod_uid,
            controller: None,
            block_owner_deletion: None,
        });
    }
    refs
}

/// The decision of one sync. `revisions` and `claims` may hold other objects of the
/// namespace; `manage` is false while earlier creates and deletes are not yet in the cache.
pub fn plan(
    set: &StatefulSet,
    pods: &[Arc<Pod>],
    revisions: &[Arc<ControllerRevision>],
    claims: &[Arc<PersistentVolumeClaim>],
    manage: bool,
    now: Timestamp,
) -> Plan {
    let mut steps = Vec::new();
    let spec = &set.spec;
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let deleting = is_deleting(&set.metadata);
    let old = set.status.clone().unwrap_or_default();
    let collision = old.collision_count;

    // Revisions: the update revision is the template's; the current one is the status'
    // while it exists.
    let owned_revs = history::owned(set, revisions);
    let update_template = spec.template.clone();
    let update_name = match history::update_revision(set, &owned_revs, &spec.template, collision, HASH_LABEL) {
        Update::Existing { name, renumber } => {
            if let Some(n) = renumber {
                steps.push(Step::RenumberRevision(name.clone(), n));
            }
            name
        }
        Update::New(r) => {
            let name = r.metadata.name.clone().unwrap_or_default();
            steps.push(Step::CreateRevision(r));
            name
        }
    };
    let current = old
        .current_revision
        .as_ref()
        .and_then(|c| owned_revs.iter().find(|r| r.metadata.name.as_ref() == Some(c)))
        .and_then(|r| Some((r.metadata.name.clone()?, history::template_of(r)?)));
    let (current_name, current_template) = current.unwrap_or_else(|| (update_name.clone(), update_template.clone()));

    // Pods: owned members, adoptable orphans, owned pods that stopped matching.
    let selector = selector_or_nothing(Some(&spec.selector));
    let mut members: Vec<&Pod> = Vec::new();
    for p in pods.iter().map(Arc::as_ref).filter(|p| p.metadata.namespace.as_deref() == Some(&ns)) {
        let name = p.metadata.name.clone().unwrap_or_default();
        let matches = selector.matches(&labels(&p.metadata));
        let member = ordinal(&set_name, &name).is_some();
        match controller_ref(&p.metadata) {
            Some(r) if r.uid == uid => {
                if (matches && member) || deleting {
                    members.push(p);
                } else if !is_deleting(&p.metadata) {
                    steps.push(Step::ReleasePod(name));
                }
            }
            None if matches && member && !deleting && !is_deleting(&p.metadata) => {
                steps.push(Step::AdoptPod(name));
                members.push(p);
            }
            _ => {}
        }
    }

    let replicas = spec.replicas.unwrap_or(1).max(0);
    let start = spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0).max(0);
    let monotonic = spec.pod_management_policy.as_deref() != Some("Parallel");
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let mut slots: Vec<Option<&Pod>> = vec![None; replicas as usize];
    let mut condemned: Vec<(i32, &Pod)> = Vec::new();
    for p in &members {
        let Some(o) = ordinal(&set_name, p.metadata.name.as_deref().unwrap_or_default()) else { continue };
        if o >= start && o < start + replicas {
            slots[(o - start) as usize] = Some(p);
        } else {
            condemned.push((o, p));
        }
    }
    condemned.sort_by_key(|(o, _)| std::cmp::Reverse(*o));

    // Status from what exists (`updateStatefulSet`'s counts).
    let mut status = StatefulSetStatus {
        observed_generation: set.metadata.generation,
        collision_count: collision,
        current_revision: Some(current_name.clone()),
        update_revision: Some(update_name.clone()),
        conditions: old.conditions.clone(),
        ..Default::default()
    };
    let (mut ready, mut available, mut cur, mut upd) = (0, 0, 0, 0);
    for p in &members {
        status.replicas += 1;
        if running_and_ready(p) {
            ready += 1;
            if is_pod_available(p, min_ready, now) {
                available += 1;
            }
        }
        if !is_deleting(&p.metadata) {
            if revision_of(p) == current_name {
                cur += 1;
            }
            if revision_of(p) == update_name {
                upd += 1;
            }
        }
    }
    let mut requeue = members.iter().filter_map(|p| becomes_available_in(p, min_ready, now)).min();

    // Claims' owner references follow the retention policy for every pod that exists.
    let claim_by_name = |n: &str| {
        claims.iter().find(|c| c.metadata.namespace.as_deref() == Some(&ns) && c.metadata.name.as_deref() == Some(n))
    };
    if !deleting {
        let all = slots.iter().flatten().map(|p| (*p, false)).chain(condemned.iter().map(|(_, p)| (*p, true)));
        for (p, is_condemned) in all {
            let Some(o) = ordinal(&set_name, p.metadata.name.as_deref().unwrap_or_default()) else { continue };
            for (_, c) in claim_names(set, o) {
                let Some(claim) = claim_by_name(&c) else { continue };
                let want = claim_owners(set, p, claim, is_condemned);
                if want != claim.metadata.owner_references.clone().unwrap_or_default() {
                    steps.push(Step::SetClaimOwners(c, want));
                }
            }
        }
    }

    let healthy = |p: &Pod| running_and_ready(p) && is_pod_available(p, min_ready, now) && !is_deleting(&p.metadata);
    let mut stop = deleting || !manage;
    // The replicas, in ordinal order (`processReplica`).
    let mut just_created: HashSet<usize> = HashSet::new();
    for (i, slot) in slots.iter().enumerate() {
        if stop {
            break;
        }
        let o = start + i as i32;
        match slot {
            Some(p) if matches!(pod_phase(p), "Failed" | "Succeeded") => {
                if !is_deleting(&p.metadata) {
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    steps.push(Step::DeletePod(p.metadata.name.clone().unwrap_or_default(), uid, "failed"));
                }
                stop = monotonic;
            }
            None => {
                // Partitioned updates make the pods below the partition from the current revision.
                let (rev, template) = if o < partition(set) {
                    (&current_name, &current_template)
                } else {
                    (&update_name, &update_template)
                };
                let mut blocked = false;
                for (t, c) in claim_names(set, o) {
                    match claim_by_name(&c) {
                        Some(existing) => blocked |= is_deleting(&existing.metadata),
                        None => {
                            if let Some(tpl) = spec
                                .volume_claim_templates
                                .iter()
                                .flatten()
                                .find(|x| x.metadata.name.as_deref() == Some(&t))
                            {
                                steps.push(Step::CreateClaim(Box::new(new_claim(set, tpl, &c))));
                            }
                        }
                    }
                }
                if blocked {
                    // A claim of this ordinal is going away: wait for it.
                    requeue = Some(requeue.map_or(Duration::from_secs(1), |r| r.min(Duration::from_secs(1))));
                    stop = monotonic;
                    continue;
                }
                steps.push(Step::CreatePod(Box::new(new_pod(set, template, rev, o))));
                just_created.insert(i);
                status.replicas += 1;
                if *rev == current_name {
                    cur += 1;
                }
                if *rev == update_name {
                    upd += 1;
                }
                stop = monotonic;
            }
            Some(p) => {
                if !healthy(p) {
                    stop = monotonic;
                    continue;
                }
                let name = p.metadata.name.clone().unwrap_or_default();
                let l = labels(&p.metadata);
                if l.get(POD_NAME_LABEL) != Some(&name) || l.get(POD_INDEX_LABEL) != Some(&o.to_string()) {
                    let fix = BTreeMap::from([
                        (POD_NAME_LABEL.to_string(), name.clone()),
                        (POD_INDEX_LABEL.to_string(), o.to_string()),
                    ]);
                    steps.push(Step::LabelPod(name, fix));
                }
            }
        }
    }

    // Scale down: the condemned, highest ordinal first (`processCondemned`).
    if !stop {
        let first_unhealthy = slots
            .iter()
            .flatten()
            .copied()
            .chain(condemned.iter().rev().map(|(_, p)| *p))
            .find(|p| !healthy(p))
            .and_then(|p| p.metadata.uid.clone());
        for (_, p) in &condemned {
            if is_deleting(&p.metadata) {
                if monotonic {
                    stop = true;
                    break;
                }
                continue;
            }
            if monotonic && !running_and_ready(p) && p.metadata.uid != first_unhealthy {
                stop = true;
                break;
            }
            let uid = p.metadata.uid.clone().unwrap_or_default();
            steps.push(Step::DeletePod(p.metadata.name.clone().unwrap_or_default(), uid, "scale down"));
            if monotonic {
                stop = true;
                break;
            }
        }
    }

    // Rolling update: the highest ordinal >= partition not at the update revision, one at a time.
    if !stop && update_type(set) == "RollingUpdate" {
        let min = (partition(set) - start).max(0) as usize;
        for i in (min..slots.len()).rev() {
            let Some(p) = slots[i].filter(|_| !just_created.contains(&i)) else { break };
            if revision_of(p) != update_name && !is_deleting(&p.metadata) {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                steps.push(Step::DeletePod(p.metadata.name.clone().unwrap_or_default(), uid, "update"));
                if revision_of(p) == current_name {
                    cur -= 1;
                }
                break;
            }
            if !healthy(p) {
                break;
            }
        }
    }

    status.ready_replicas = Some(ready);
    status.available_replicas = Some(available);
    status.current_replicas = Some(cur);
    status.updated_replicas = Some(upd);
    // `completeRollingUpdate`.
    if update_type(set) == "RollingUpdate" && upd == status.replicas && ready == status.replicas {
        status.current_replicas = Some(upd);
        status.current_revision = Some(update_name.clone());
    }

    // History: keep the revisions pods use, the current and the update one.
    if !deleting {
        let mut live: HashSet<String> = members.iter().map(|p| revision_of(p).to_string()).collect();
        live.insert(update_name.clone());
        live.extend(status.current_revision.clone());
        for r in history::to_truncate(&owned_revs, &live, spec.revision_history_limit) {
            steps.push(Step::DeleteRevision(r));
        }
    }
    Plan { steps, status, requeue }
}

fn update_type(set: &StatefulSet) -> &str {
    set.spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref()).unwrap_or("RollingUpdate")
}

fn partition(set: &StatefulSet) -> i32 {
    if update_type(set) != "RollingUpdate" {
        return 0;
    }
    set.spec.update_strategy.as_ref().and_then(|s| s.rolling_update.as_ref()).and_then(|r| r.partition).unwrap_or(0)
}

fn status_changed(old: Option<&StatefulSetStatus>, new: &StatefulSetStatus) -> bool {
    let old = old.cloned().unwrap_or_default();
    let norm = |s: &StatefulSetStatus| {
        (
            s.replicas,
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0),
            s.current_replicas.unwrap_or(0),
            s.updated_replicas.unwrap_or(0),
            s.current_revision.clone(),
            s.update_revision.clone(),
            s.observed_generation,
            s.collision_count,
        )
    };
    norm(&old) != norm(new)
}

pub struct Ctx {
    pub client: kube::Client,
    pub pods: Informer<Pod>,
    pub revisions: Informer<ControllerRevision>,
    /// The claims, cached: a sync reads them without asking the apiserver (a claim the cache
    /// has not seen yet is created again, and that 409 is ignored).
    pub claims: Informer<PersistentVolumeClaim>,
    pub expectations: Expectations,
    pub recorder: Recorder,
}

/// `recordPodEvent` / `recordClaimEvent`: `SuccessfulCreate` "create Pod web-0 in StatefulSet
/// web successful", or `FailedCreate` "create Pod web-0 in StatefulSet web failed error: …".
fn record(recorder: &Recorder, set: &StatefulSet, verb: &str, what: &str, err: Option<&kube::Error>) {
    let set_name = set.metadata.name.as_deref().unwrap_or_default();
    let lower = verb.to_lowercase();
    match err {
        None => recorder.event(
            set,
            NORMAL,
            &format!("Successful{verb}"),
            format!("{lower} {what} in StatefulSet {set_name} successful"),
        ),
        Some(e) => recorder.event(
            set,
            WARNING,
            &format!("Failed{verb}"),
            format!("{lower} {what} in StatefulSet {set_name} failed error: {e}"),
        ),
    }
}

pub async fn reconcile(set: Arc<StatefulSet>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let name = set.metadata.name.clone().unwrap_or_default();
    let key = key(&set.metadata);
    let in_ns = |m: &ObjectMeta| m.namespace.as_deref() == Some(ns.as_str());
    let pods: Vec<Arc<Pod>> = ctx.pods.state().into_iter().filter(|p| in_ns(&p.metadata)).collect();
    let revisions: Vec<Arc<ControllerRevision>> =
        ctx.revisions.state().into_iter().filter(|r| in_ns(&r.metadata)).collect();
    let claim_api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let claims: Vec<Arc<PersistentVolumeClaim>> =
        if set.spec.volume_claim_templates.as_ref().is_some_and(|t| !t.is_empty()) {
            ctx.claims.state().into_iter().filter(|c| in_ns(&c.metadata)).collect()
        } else {
            Vec::new()
        };
    let manage = ctx.expectations.satisfied(&key);
    let plan = plan(&set, &pods, &revisions, &claims, manage, Timestamp::now());
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let set_api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
    let pp = PatchParams::default();
    let me = owner_ref(set.as_ref());
    for step in &plan.steps {
        match step {
            Step::CreateRevision(r) => {
                let collisions = set.status.as_ref().and_then(|s| s.collision_count);
                if !history::create(&ctx.client, set.as_ref(), r, collisions).await? {
                    return Ok(Action::requeue(Duration::from_millis(100)));
                }
            }
            Step::RenumberRevision(r, n) => history::renumber(&ctx.client, &ns, r, *n).await?,
            Step::AdoptPod(p) | Step::ReleasePod(p) => {
                if let Some(pod) = pods.iter().find(|x| x.metadata.name.as_deref() == Some(p)) {
                    set_controller(&pod_api, pod, &me, matches!(step, Step::AdoptPod(_))).await;
                }
            }
            Step::CreateClaim(c) => {
                let what = format!("Claim {}", c.metadata.name.as_deref().unwrap_or_default());
                match claim_api.create(&PostParams::default(), c).await {
                    Ok(_) => record(&ctx.recorder, &set, "Create", &what, None),
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => {
                        record(&ctx.recorder, &set, "Create", &what, Some(&e));
                        return Err(e.into());
                    }
                }
            }
            Step::CreatePod(p) => {
                let what = format!("Pod {}", p.metadata.name.as_deref().unwrap_or_default());
                match ctx.expectations.create_pod(&pod_api, &key, p).await {
                    Ok(()) => record(&ctx.recorder, &set, "Create", &what, None),
                    // The old pod of this name is still going away.
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => {
                        record(&ctx.recorder, &set, "Create", &what, Some(&e));
                        return Err(e.into());
                    }
                }
            }
            Step::LabelPod(p, l) => {
                ignore_not_found(pod_api.patch(p, &pp, &Patch::Merge(json!({"metadata": {"labels": l}}))).await)?;
            }
            Step::DeletePod(p, uid, why) => match ctx.expectations.delete_pod(&pod_api, &key, p, uid).await {
                Ok(true) => {
                    tracing::info!(statefulset = %key, pod = %p, reason = why, "deleting pod");
                    record(&ctx.recorder, &set, "Delete", &format!("Pod {p}"), None);
                }
                Ok(false) => {}
                Err(e) => {
                    record(&ctx.recorder, &set, "Delete", &format!("Pod {p}"), Some(&e));
                    return Err(e.into());
                }
            },
            Step::SetClaimOwners(c, refs) => {
                let patch = json!({"metadata": {"ownerReferences": refs}});
                ignore_not_found(claim_api.patch(c, &pp, &Patch::Merge(&patch)).await)?;
            }
            Step::DeleteRevision(r) => history::delete(&ctx.client, &ns, r).await?,
        }
    }
    if status_changed(set.status.as_ref(), &plan.status) {
        ignore_not_found(set_api.patch_status(&name, &pp, &Patch::Merge(json!({"status": plan.status}))).await)?;
    }
    if !manage {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    Ok(Action::requeue(plan.requeue.unwrap_or(Duration::from_secs(300))))
}

/// Run the controller.
pub async fn run(
    client: kube::Client,
    pods: Informer<Pod>,
    revisions: Informer<ControllerRevision>,
    recorder: Recorder,
) {
    let claims = Informer::start(Api::<PersistentVolumeClaim>::all(client.clone()));
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        pods: pods.clone(),
        revisions: revisions.clone(),
        claims: claims.clone(),
        expectations: Expectations::default(),
        recorder,
    });
    let (tx, triggers) = trigger::<StatefulSet>();
    let controller =
        Controller::new(Api::<StatefulSet>::all(client), watcher::Config::default()).reconcile_on(triggers);
    let store = controller.store();
    let tx2 = tx.clone();
    let selector: fn(&StatefulSet) -> &LabelSelector = |s| &s.spec.selector;
    route_pods(&pods, "StatefulSet", ctx.clone(), |c| &c.expectations, Some((store, selector)), tx);
    revisions.add_handler(move |r, _| {
        if let Some(o) = controller_ref(&r.metadata).filter(|o| o.kind == "StatefulSet") {
            let ns = r.metadata.namespace.clone().unwrap_or_default();
            let _ = tx2.send(ObjectRef::new(&o.name).within(&ns));
        }
    });
    pods.synced().await;
    revisions.synced().await;
    claims.synced().await;
    let policy = Policy { metric: "statefulset", what: "statefulset", retry: Duration::from_secs(1) };
    run_controller(controller, reconcile, ctx, policy).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn sts(replicas: i32, policy: &str) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "uid-web", "generation": 1},
            "spec": {
                "replicas": replicas, "serviceName": "web", "podManagementPolicy": policy,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}
            }
        }))
        .unwrap()
    }

    /// The revision of `set`'s current template, as the API would hold it.
    fn revision(set: &StatefulSet) -> Arc<ControllerRevision> {
        let Update::New(r) = history::update_revision(set, &[], &set.spec.template, None, HASH_LABEL) else { panic!() };
        Arc::new(*r)
    }

    /// The pods `plan` creates, as they appear once they exist (running, ready or not).
    fn created(p: &Plan) -> Vec<Pod> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::CreatePod(p) => Some((**p).clone()),
                _ => None,
            })
            .collect()
    }

    fn exists(mut p: Pod, ready: bool) -> Arc<Pod> {
        let n = p.metadata.name.clone().unwrap();
        p.metadata.uid = Some(format!("uid-{n}"));
        make_running(&mut p, "n1", ready, 100);
        Arc::new(p)
    }

    /// `set`'s revision and its pods, all at that revision, running and ready.
    fn rolled_out(set: &StatefulSet) -> (Arc<ControllerRevision>, String, Vec<Arc<Pod>>) {
        let rev = revision(set);
        let name = rev.metadata.name.clone().unwrap();
        let n = set.spec.replicas.unwrap_or(1);
        let pods = (0..n).map(|o| exists(new_pod(set, &set.spec.template, &name, o), true)).collect();
        (rev, name, pods)
    }

    fn deleted(p: &Plan) -> Vec<(String, &'static str)> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::DeletePod(n, _, why) => Some((n.clone(), *why)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn ordinals_parse_only_members() {
        assert_eq!(ordinal("web", "web-0"), Some(0));
        assert_eq!(ordinal("web", "web-12"), Some(12));
        assert_eq!(ordinal("web", "web-x"), None);
        assert_eq!(ordinal("web", "webby-1"), None);
        assert_eq!(ordinal("web", "web-+1"), None);
    }

    #[test]
    fn ordered_ready_creates_one_at_a_time_after_the_previous_is_ready() {
        let set = sts(3, "OrderedReady");
        let revs = vec![revision(&set)];
        let p = plan(&set, &[], &revs, &[], true, now());
        let c = created(&p);
        assert_eq!(c.len(), 1);
        let web0 = &c[0];
        assert_eq!(web0.metadata.name.as_deref(), Some("web-0"));
        let l = web0.metadata.labels.clone().unwrap();
        assert_eq!(l[POD_NAME_LABEL], "web-0");
        assert_eq!(l[POD_INDEX_LABEL], "0");
        assert_eq!(l[REVISION_HASH_LABEL], revs[0].metadata.name.clone().unwrap());
        let spec = web0.spec.clone().unwrap();
        assert_eq!((spec.hostname.as_deref(), spec.subdomain.as_deref()), (Some("web-0"), Some("web")));
        assert_eq!(controller_ref(&web0.metadata).map(|r| r.kind.as_str()), Some("StatefulSet"));
        // web-0 not ready yet: nothing more.
        let pods = vec![exists(web0.clone(), false)];
        assert!(created(&plan(&set, &pods, &revs, &[], true, now())).is_empty());
        // Ready: web-1 comes next.
        let pods = vec![exists(web0.clone(), true)];
        let c = created(&plan(&set, &pods, &revs, &[], true, now()));
        assert_eq!(c.iter().map(|p| p.metadata.name.clone().unwrap()).collect::<Vec<_>>(), ["web-1"]);
        // Nothing while expectations are outstanding.
        assert!(created(&plan(&set, &pods, &revs, &[], false, now())).is_empty());
    }

    #[test]
    fn parallel_creates_all_at_once_and_a_missing_pod_comes_back_with_its_name() {
        let set = sts(3, "Parallel");
        let revs = vec![revision(&set)];
        let p = plan(&set, &[], &revs, &[], true, now());
        let all = created(&p);
        assert_eq!(all.len(), 3);
        assert_eq!(p.status.replicas, 3);
        let pods: Vec<Arc<Pod>> = [&all[0], &all[2]].iter().map(|p| exists((*p).clone(), true)).collect();
        let c = created(&plan(&set, &pods, &revs, &[], true, now()));
        assert_eq!(c.iter().map(|p| p.metadata.name.clone().unwrap()).collect::<Vec<_>>(), ["web-1"]);
    }

    #[test]
    fn scale_down_removes_the_highest_ordinal_first_one_at_a_time() {
        let set3 = sts(3, "OrderedReady");
        let (rev, _, pods) = rolled_out(&set3);
        let revs = vec![rev];
        let set1 = sts(1, "OrderedReady");
        let p = plan(&set1, &pods, &revs, &[], true, now());
        assert_eq!(deleted(&p), [("web-2".to_string(), "scale down")]);
        let par = sts(1, "Parallel");
        let p = plan(&par, &pods, &revs, &[], true, now());
        assert_eq!(deleted(&p).len(), 2);
        // A terminating condemned pod blocks the next one in OrderedReady.
        let mut dying = (*pods[2]).clone();
        dying.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
        let pods2 = vec![pods[0].clone(), pods[1].clone(), Arc::new(dying)];
        assert!(deleted(&plan(&set1, &pods2, &revs, &[], true, now())).is_empty());
    }

    #[test]
    fn rolling_update_with_partition_replaces_only_high_ordinals_highest_first() {
        let old = sts(3, "OrderedReady");
        let (old_rev, old_name, pods) = rolled_out(&old);
        let mut new = old.clone();
        new.spec.template = template(&[("app", "web")], "nginx:2");
        new.spec.update_strategy.as_mut().unwrap().rolling_update.as_mut().unwrap().partition = Some(2);
        new.status = Some(StatefulSetStatus { current_revision: Some(old_name.clone()), ..Default::default() });
        // The first sync makes the new revision …
        let p = plan(&new, &pods, std::slice::from_ref(&old_rev), &[], true, now());
        let Some(Step::CreateRevision(new_rev)) = p.steps.first().cloned() else { panic!("{:?}", p.steps) };
        assert_eq!(new_rev.revision, Some(2));
        // … and replaces web-2 only.
        assert_eq!(deleted(&p), [("web-2".to_string(), "update")]);
        let revs = vec![old_rev.clone(), Arc::new(*new_rev.clone())];
        let new_name = new_rev.metadata.name.clone().unwrap();
        // web-2 gone: it is recreated at the update revision, web-0/1 untouched.
        let p = plan(&new, &pods[..2], &revs, &[], true, now());
        let c = created(&p);
        assert_eq!(c.len(), 1);
        assert_eq!(labels(&c[0].metadata)[REVISION_HASH_LABEL], new_name);
        assert_eq!(c[0].spec.as_ref().unwrap().containers[0].image.as_deref(), Some("nginx:2"));
        let mut now_pods = pods[..2].to_vec();
        now_pods.push(exists(c[0].clone(), true));
        let p = plan(&new, &now_pods, &revs, &[], true, now());
        assert!(deleted(&p).is_empty());
        assert_eq!(p.status.updated_replicas, Some(1));
        assert_eq!(p.status.current_revision.as_deref(), Some(old_name.as_str()));
        // A pod below the partition that is deleted comes back at the current revision.
        let p = plan(&new, &[now_pods[0].clone(), now_pods[2].clone()], &revs, &[], true, now());
        let c = created(&p);
        assert_eq!(labels(&c[0].metadata)[REVISION_HASH_LABEL], old_name);
        // Partition 0: web-1 next (highest not updated), then web-0; then the rollout completes.
        let mut all = new.clone();
        all.spec.update_strategy.as_mut().unwrap().rolling_update.as_mut().unwrap().partition = Some(0);
        assert_eq!(deleted(&plan(&all, &now_pods, &revs, &[], true, now())), [("web-1".to_string(), "update")]);
        let done: Vec<Arc<Pod>> =
            (0..3).map(|o| exists(new_pod(&all, &all.spec.template, &new_name, o), true)).collect();
        let p = plan(&all, &done, &revs, &[], true, now());
        assert_eq!(p.status.current_revision.as_deref(), Some(new_name.as_str()));
        assert_eq!((p.status.current_replicas, p.status.updated_replicas), (Some(3), Some(3)));
        // An unready updated pod holds the rollout.
        let mut waiting = now_pods.clone();
        waiting[2] = exists((*now_pods[2]).clone(), false);
        assert!(deleted(&plan(&all, &waiting, &revs, &[], true, now())).is_empty());
    }

    #[test]
    fn on_delete_never_deletes_for_an_update() {
        let old = sts(2, "OrderedReady");
        let (old_rev, _, pods) = rolled_out(&old);
        let mut new = old.clone();
        new.spec.template = template(&[("app", "web")], "nginx:2");
        new.spec.update_strategy = serde_json::from_value(json!({"type": "OnDelete"})).unwrap();
        let p = plan(&new, &pods, &[old_rev], &[], true, now());
        assert!(deleted(&p).is_empty());
    }

    #[test]
    fn claims_are_made_before_the_pod_and_follow_the_retention_policy() {
        let mut set = sts(2, "OrderedReady");
        set.spec.volume_claim_templates = Some(vec![serde_json::from_value(json!({
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}
        }))
        .unwrap()]);
        set.spec.persistent_volume_claim_retention_policy =
            serde_json::from_value(json!({"whenDeleted": "Delete", "whenScaled": "Delete"})).unwrap();
        let revs = vec![revision(&set)];
        let p = plan(&set, &[], &revs, &[], true, now());
        let Step::CreateClaim(claim) = &p.steps[0] else { panic!("{:?}", p.steps) };
        assert_eq!(claim.metadata.name.as_deref(), Some("data-web-0"));
        assert_eq!(claim.metadata.labels.as_ref().unwrap()["app"], "web");
        assert_eq!(claim.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-web");
        let Step::CreatePod(pod) = &p.steps[1] else { panic!() };
        let vols = pod.spec.as_ref().unwrap().volumes.clone().unwrap();
        assert_eq!(vols[0].name, "data");
        assert_eq!(vols[0].persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()), Some("data-web-0"));
        // An existing claim is reused; scaled down, its pod becomes its owner instead of the set.
        let claims: Vec<Arc<PersistentVolumeClaim>> = (0..2)
            .map(|o| {
                Arc::new(new_claim(
                    &set,
                    &set.spec.volume_claim_templates.as_ref().unwrap()[0],
                    &format!("data-web-{o}"),
                ))
            })
            .collect();
        let rev = revs[0].metadata.name.clone().unwrap();
        let pods: Vec<Arc<Pod>> = (0..2).map(|o| exists(new_pod(&set, &set.spec.template, &rev, o), true)).collect();
        assert!(plan(&set, &pods, &revs, &claims, true, now()).steps.is_empty());
        set.spec.replicas = Some(1);
        let p = plan(&set, &pods, &revs, &claims, true, now());
        let owners = p.steps.iter().position(|s| matches!(s, Step::SetClaimOwners(c, refs) if c == "data-web-1" && refs.len() == 1 && refs[0].kind == "Pod"));
        let delete = p.steps.iter().position(|s| matches!(s, Step::DeletePod(n, _, _) if n == "web-1"));
        assert!(owners.is_some() && owners < delete, "{:?}", p.steps);
    }

    #[test]
    fn failed_pods_are_replaced_and_old_revisions_truncated() {
        let mut set = sts(1, "OrderedReady");
        set.spec.revision_history_limit = Some(0);
        let old_rev = revision(&set);
        let mut failed = new_pod(&set, &set.spec.template, old_rev.metadata.name.as_deref().unwrap(), 0);
        failed.metadata.uid = Some("u".into());
        set_phase(&mut failed, "Failed");
        let p = plan(&set, &[Arc::new(failed)], std::slice::from_ref(&old_rev), &[], true, now());
        assert_eq!(deleted(&p), [("web-0".to_string(), "failed")]);
        set.spec.template = template(&[("app", "web")], "nginx:2");
        let p = plan(&set, &[], std::slice::from_ref(&old_rev), &[], true, now());
        assert!(p.steps.contains(&Step::DeleteRevision(old_rev.metadata.name.clone().unwrap())), "{:?}", p.steps);
    }
}
