//! The Deployment controller (`pkg/controller/deployment`): one ReplicaSet per pod
//! template, named `<deployment>-<pod-template-hash>`; RollingUpdate (maxSurge /
//! maxUnavailable as counts or percentages) and Recreate; the revision annotation
//! (`deployment.kubernetes.io/revision`) that `kubectl rollout history/undo` read — an
//! undo copies an old ReplicaSet's template back, and that ReplicaSet becomes the new
//! one with the next revision; `revisionHistoryLimit` old ReplicaSets kept; pause;
//! `progressDeadlineSeconds` with the Progressing condition; status exactly as
//! `kubectl rollout status` reads it.
//!
//! [`plan`] is the decision (pure); [`reconcile`] applies it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use apimachinery::labels::{selector_or_nothing, selects};
use common::events::{Recorder, NORMAL};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::{json, Value};

use crate::informer::{trigger, Informer};
use crate::runner::{run_controller, Policy};
use crate::util::*;
use crate::Error;

pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
pub const HASH_LABEL: &str = "pod-template-hash";

/// One write the controller makes.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    CreateReplicaSet(Box<ReplicaSet>),
    /// Scale a ReplicaSet (name, from, to), also writing the replica annotations.
    Scale(String, i32, i32),
    /// Set the revision annotation of an existing ReplicaSet (it became the new one).
    SetRevision(String, String),
    AdoptReplicaSet(String),
    DeleteReplicaSet(String),
    /// Set the Deployment's revision annotation.
    AnnotateDeployment(String),
}

#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub status: DeploymentStatus,
    pub requeue: Option<Duration>,
}

fn revision(rs: &ReplicaSet) -> i64 {
    rs.metadata.annotations.as_ref().and_then(|a| a.get(REVISION)).and_then(|r| r.parse().ok()).unwrap_or(0)
}

fn spec_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.replicas.unwrap_or(0)
}

fn st(rs: &ReplicaSet) -> (i32, i32, i32) {
    let s = rs.status.clone().unwrap_or_default();
    (s.replicas, s.ready_replicas.unwrap_or(0), s.available_replicas.unwrap_or(0))
}

/// The template without the `pod-template-hash` label, as JSON, for comparison.
fn template_without_hash(t: Option<&PodTemplateSpec>) -> Value {
    let mut v = serde_json::to_value(t.cloned().unwrap_or_default()).unwrap_or(Value::Null);
    if let Some(l) = v.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) {
        l.remove(HASH_LABEL);
        if l.is_empty() {
            if let Some(m) = v.pointer_mut("/metadata").and_then(Value::as_object_mut) {
                m.remove("labels");
            }
        }
    }
    if let Some(m) = v.pointer_mut("/metadata").and_then(Value::as_object_mut) {
        if m.is_empty() {
            v.as_object_mut().map(|o| o.remove("metadata"));
        }
    }
    v
}

/// `controller.ComputeHash`: FNV-32a of the template (and the collision count), encoded
/// with `rand.SafeEncodeString`.
pub fn pod_template_hash(t: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    compute_hash(template_without_hash(Some(t)).to_string().as_bytes(), collision_count)
}

/// maxSurge and maxUnavailable resolved against `replicas` (`ResolveFenceposts`).
pub fn fenceposts(d: &Deployment) -> (i32, i32) {
    let spec = d.spec.clone();
    let replicas = spec.replicas.unwrap_or(1);
    let ru = spec.strategy.and_then(|s| s.rolling_update).unwrap_or_default();
    let surge = scaled_value(ru.max_surge.as_ref(), replicas, true, "25%");
    let mut unavailable = scaled_value(ru.max_unavailable.as_ref(), replicas, false, "25%");
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    (surge, unavailable)
}

fn is_recreate(d: &Deployment) -> bool {
    d.spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate")
}

/// The new ReplicaSet for `d` (not yet created).
pub fn new_replicaset(d: &Deployment, replicas: i32, revision: i64) -> ReplicaSet {
    let spec = d.spec.clone();
    let collision = d.status.as_ref().and_then(|s| s.collision_count);
    let hash = pod_template_hash(&spec.template, collision);
    let mut template = spec.template.clone();
    let mut tmeta = template.metadata.clone().unwrap_or_default();
    let mut tl = tmeta.labels.clone().unwrap_or_default();
    tl.insert(HASH_LABEL.into(), hash.clone());
    tmeta.labels = Some(tl.clone());
    template.metadata = Some(tmeta);
    let mut selector = spec.selector.clone();
    selector.match_labels.get_or_insert_with(BTreeMap::new).insert(HASH_LABEL.into(), hash.clone());
    let mut annotations: BTreeMap<String, String> = d
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k != REVISION && k != "kubectl.kubernetes.io/last-applied-configuration")
        .collect();
    annotations.insert(REVISION.into(), revision.to_string());
    annotations.insert(DESIRED_REPLICAS.into(), spec.replicas.unwrap_or(1).to_string());
    annotations.insert(MAX_REPLICAS.into(), (spec.replicas.unwrap_or(1) + fenceposts(d).0).to_string());
    let name = d.metadata.name.clone().unwrap_or_default();
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(format!("{name}-{hash}")),
            namespace: d.metadata.namespace.clone(),
            labels: Some(tl),
            annotations: Some(annotations),
            owner_references: Some(vec![owner_ref(d)]),
            ..Default::default()
        },
        spec: ReplicaSetSpec {
            replicas: Some(replicas),
            min_ready_seconds: spec.min_ready_seconds,
            selector,
            template: Some(template),
        },
        status: None,
    }
}

fn condition(status: &str, reason: &str, message: String, now: Timestamp) -> DeploymentCondition {
    DeploymentCondition {
        type_: Some("Progressing".into()),
        status: Some(status.into()),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// The decision of one sync of `d`, given the ReplicaSets in its namespace and (for
/// Recreate) the pods there.
pub fn plan(d: &Deployment, all_rs: &[Arc<ReplicaSet>], pods: &[Arc<Pod>], now: Timestamp) -> Plan {
    let mut steps = Vec::new();
    let spec = d.spec.clone();
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let ns = d.metadata.namespace.clone().unwrap_or_default();
    let replicas = spec.replicas.unwrap_or(1);
    let deleting = is_deleting(&d.metadata);
    let paused = spec.paused.unwrap_or(false);
    let selector = selector_or_nothing(Some(&spec.selector));
    let empty_selector = selector.is_empty();

    // Owned ReplicaSets (adopting matching orphans).
    let mut owned: Vec<ReplicaSet> = Vec::new();
    for rs in all_rs.iter().filter(|r| r.metadata.namespace.as_deref() == Some(&ns)) {
        match controller_ref(&rs.metadata) {
            Some(r) if r.uid == uid => owned.push(rs.as_ref().clone()),
            None if !deleting
                && !empty_selector
                && selector.matches(&labels(&rs.metadata))
                && !is_deleting(&rs.metadata) =>
            {
                steps.push(Step::AdoptReplicaSet(rs.metadata.name.clone().unwrap_or_default()));
                owned.push(rs.as_ref().clone());
            }
            _ => {}
        }
    }
    owned.sort_by_key(|r| (creation(&r.metadata), r.metadata.name.clone()));
    let target = template_without_hash(Some(&spec.template));
    let new_idx = owned.iter().position(|r| template_without_hash(r.spec.template.as_ref()) == target);
    let max_old_rev =
        owned.iter().enumerate().filter(|(i, _)| Some(*i) != new_idx).map(|(_, r)| revision(r)).max().unwrap_or(0);
    let (surge, max_unavailable) = fenceposts(d);
    let mut created: Option<String> = None;
    let mut scaled_up = false;

    let mut new_rs: Option<ReplicaSet> = new_idx.map(|i| owned[i].clone());
    let mut old: Vec<ReplicaSet> =
        owned.iter().enumerate().filter(|(i, _)| Some(*i) != new_idx).map(|(_, r)| r.clone()).collect();

    if !deleting && !empty_selector {
        // Revision bookkeeping (an undone-to ReplicaSet gets the next revision).
        if let Some(n) = &mut new_rs {
            if revision(n) <= max_old_rev || revision(n) == 0 {
                let rev = (max_old_rev + 1).to_string();
                steps.push(Step::SetRevision(n.metadata.name.clone().unwrap_or_default(), rev.clone()));
                n.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(REVISION.into(), rev);
            }
        }
        let old_active: i32 = old.iter().map(spec_replicas).sum();
        let old_pods_running = pods.iter().any(|p| {
            !matches!(pod_phase(p), "Succeeded" | "Failed")
                && controller_ref(&p.metadata)
                    .is_some_and(|r| old.iter().any(|o| o.metadata.uid.as_deref() == Some(&r.uid)))
        });
        if paused {
            // Paused: no rollout, only scaling of a settled Deployment.
            if let Some(n) = &new_rs {
                if old_active == 0 && spec_replicas(n) != replicas {
                    steps.push(Step::Scale(n.metadata.name.clone().unwrap_or_default(), spec_replicas(n), replicas));
                }
            }
        } else if is_recreate(d) {
            for o in &old {
                if spec_replicas(o) > 0 {
                    steps.push(Step::Scale(o.metadata.name.clone().unwrap_or_default(), spec_replicas(o), 0));
                }
            }
            if old_active == 0 && !old_pods_running {
                match &new_rs {
                    None => {
                        let rs = new_replicaset(d, replicas, max_old_rev + 1);
                        created = rs.metadata.name.clone();
                        steps.push(Step::CreateReplicaSet(Box::new(rs)));
                    }
                    Some(n) if spec_replicas(n) != replicas => {
                        steps.push(Step::Scale(
                            n.metadata.name.clone().unwrap_or_default(),
                            spec_replicas(n),
                            replicas,
                        ));
                    }
                    _ => {}
                }
            }
        } else {
            // RollingUpdate: scale the new ReplicaSet up within maxSurge …
            let current: i32 = owned.iter().map(spec_replicas).sum();
            let new_count = |n_replicas: i32, current: i32| -> i32 {
                if n_replicas > replicas {
                    return replicas;
                }
                let max_total = replicas + surge;
                if current >= max_total {
                    return n_replicas;
                }
                n_replicas + (max_total - current).min(replicas - n_replicas)
            };
            match &mut new_rs {
                None => {
                    let count = new_count(0, current);
                    let rs = new_replicaset(d, count, max_old_rev + 1);
                    created = rs.metadata.name.clone();
                    scaled_up = count > 0;
                    steps.push(Step::CreateReplicaSet(Box::new(rs.clone())));
                    new_rs = Some(rs);
                }
                Some(n) => {
                    let want = new_count(spec_replicas(n), current);
                    if want != spec_replicas(n) {
                        scaled_up = want > spec_replicas(n);
                        steps.push(Step::Scale(n.metadata.name.clone().unwrap_or_default(), spec_replicas(n), want));
                        n.spec.replicas = Some(want);
                    }
                }
            }
            // … then the old ones down within maxUnavailable.
            if !scaled_up && old_active > 0 {
                let n = new_rs.as_ref().map(|n| (spec_replicas(n), st(n).2)).unwrap_or((0, 0));
                let all_pods: i32 = old_active + n.0;
                let min_available = replicas - max_unavailable;
                let new_unavailable = n.0 - n.1;
                let mut max_scaled_down = all_pods - min_available - new_unavailable;
                if max_scaled_down > 0 {
                    // Unhealthy replicas first (oldest ReplicaSets first).
                    let mut old_sorted: Vec<&mut ReplicaSet> = old.iter_mut().collect();
                    old_sorted.sort_by_key(|r| creation(&r.metadata));
                    let mut cleaned = 0;
                    for o in old_sorted.iter_mut() {
                        if max_scaled_down - cleaned <= 0 {
                            break;
                        }
                        let r = spec_replicas(o);
                        let unhealthy = r - st(o).2;
                        if r == 0 || unhealthy <= 0 {
                            continue;
                        }
                        let down = unhealthy.min(max_scaled_down - cleaned);
                        cleaned += down;
                        steps.push(Step::Scale(o.metadata.name.clone().unwrap_or_default(), r, r - down));
                        o.spec.replicas = Some(r - down);
                    }
                    max_scaled_down -= cleaned;
                    // Then available ones, keeping minAvailable.
                    let available: i32 = old_sorted.iter().map(|o| st(o).2.min(spec_replicas(o))).sum::<i32>() + n.1;
                    let mut total = (available - min_available).min(max_scaled_down.max(0));
                    if available > min_available {
                        for o in old_sorted.iter_mut() {
                            if total <= 0 {
                                break;
                            }
                            let r = spec_replicas(o);
                            if r == 0 {
                                continue;
                            }
                            let down = r.min(total);
                            total -= down;
                            let name = o.metadata.name.clone().unwrap_or_default();
                            // Merge with a previous step for the same ReplicaSet.
                            let from = steps
                                .iter()
                                .rev()
                                .find_map(|s| match s {
                                    Step::Scale(n, f, _) if *n == name => Some(*f),
                                    _ => None,
                                })
                                .unwrap_or(r);
                            steps.retain(|s| !matches!(s, Step::Scale(n, _, _) if *n == name));
                            steps.push(Step::Scale(name, from, r - down));
                            o.spec.replicas = Some(r - down);
                        }
                    }
                }
            }
        }
        if let Some(n) = &new_rs {
            let rev = revision(n).to_string();
            if d.metadata.annotations.as_ref().and_then(|a| a.get(REVISION)) != Some(&rev) {
                steps.push(Step::AnnotateDeployment(rev));
            }
        }
    }

    // Status, from the ReplicaSets' observed status.
    let sum = |f: &dyn Fn(&ReplicaSet) -> i32| owned.iter().map(f).sum::<i32>();
    let new_status = new_rs.as_ref().filter(|_| created.is_none()).map(st).unwrap_or((0, 0, 0));
    let old_status = d.status.clone().unwrap_or_default();
    let mut status = DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: Some(sum(&|r| st(r).0)),
        updated_replicas: Some(new_status.0),
        ready_replicas: Some(sum(&|r| st(r).1)),
        available_replicas: Some(sum(&|r| st(r).2)),
        unavailable_replicas: Some((replicas - sum(&|r| st(r).2)).max(0)),
        terminating_replicas: None,
        collision_count: old_status.collision_count,
        conditions: None,
    };
    let mut conds: Vec<DeploymentCondition> = old_status.conditions.clone().unwrap_or_default();
    let set = |conds: &mut Vec<DeploymentCondition>, mut c: DeploymentCondition, keep_update_time: bool| {
        if let Some(cur) = conds.iter().find(|x| x.type_ == c.type_) {
            if cur.status == c.status {
                c.last_transition_time = cur.last_transition_time.clone();
                if cur.reason == c.reason && keep_update_time {
                    c.last_update_time = cur.last_update_time.clone();
                }
            }
        }
        conds.retain(|x| x.type_ != c.type_);
        conds.push(c);
    };
    let available = status.available_replicas.unwrap_or(0);
    let mut avail = if available >= replicas - max_unavailable {
        condition("True", "MinimumReplicasAvailable", "Deployment has minimum availability.".into(), now)
    } else {
        condition("False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.".into(), now)
    };
    avail.type_ = Some("Available".into());
    set(&mut conds, avail, true);
    let rs_name = new_rs.as_ref().and_then(|n| n.metadata.name.clone()).unwrap_or_default();
    let deadline = spec.progress_deadline_seconds.filter(|s| *s < i32::MAX);
    let mut requeue = None;
    if paused {
        set(&mut conds, condition("Unknown", "DeploymentPaused", "Deployment is paused".into(), now), true);
    } else if !deleting {
        let cur = conds.iter().find(|c| c.type_.as_deref() == Some("Progressing")).cloned();
        let was_paused = cur.as_ref().is_some_and(|c| c.reason.as_deref() == Some("DeploymentPaused"));
        let complete = status.updated_replicas == Some(replicas)
            && status.replicas == Some(replicas)
            && available >= replicas
            && created.is_none()
            && steps.iter().all(|s| !matches!(s, Step::Scale(..)));
        let progressed = new_status.0 > old_status.updated_replicas.unwrap_or(0)
            || status.ready_replicas > old_status.ready_replicas
            || available > old_status.available_replicas.unwrap_or(0)
            || status.replicas < old_status.replicas
            || steps.iter().any(|s| matches!(s, Step::Scale(..)));
        if was_paused {
            set(&mut conds, condition("Unknown", "DeploymentResumed", "Deployment is resumed".into(), now), true);
        } else if complete {
            set(
                &mut conds,
                condition(
                    "True",
                    "NewReplicaSetAvailable",
                    format!("ReplicaSet \"{rs_name}\" has successfully progressed."),
                    now,
                ),
                true,
            );
        } else if let Some(c) = &created {
            set(
                &mut conds,
                condition("True", "NewReplicaSetCreated", format!("Created new replica set \"{c}\""), now),
                false,
            );
        } else if progressed {
            set(
                &mut conds,
                condition("True", "ReplicaSetUpdated", format!("ReplicaSet \"{rs_name}\" is progressing."), now),
                false,
            );
        } else if let (Some(secs), Some(c)) = (deadline, &cur) {
            let last = c.last_update_time.as_ref().map(|t| t.0).unwrap_or(now);
            let end = last.checked_add(SignedDuration::from_secs(secs as i64)).unwrap_or(now);
            if c.reason.as_deref() != Some("NewReplicaSetAvailable")
                && c.reason.as_deref() != Some("ProgressDeadlineExceeded")
            {
                if end <= now {
                    set(
                        &mut conds,
                        condition(
                            "False",
                            "ProgressDeadlineExceeded",
                            format!("ReplicaSet \"{rs_name}\" has timed out progressing."),
                            now,
                        ),
                        true,
                    );
                } else {
                    let wait = end.duration_since(now);
                    requeue = Some(Duration::from_millis(wait.as_millis().max(0) as u64 + 100));
                }
            }
        }
        // Revision history: delete the oldest fully scaled-down old ReplicaSets.
        let limit = spec.revision_history_limit.unwrap_or(10).max(0) as usize;
        if complete && old.len() > limit {
            let mut cleanable: Vec<&ReplicaSet> =
                old.iter().filter(|o| spec_replicas(o) == 0 && st(o).0 == 0 && !is_deleting(&o.metadata)).collect();
            cleanable.sort_by_key(|o| (revision(o), creation(&o.metadata)));
            for o in cleanable.into_iter().take(old.len() - limit) {
                steps.push(Step::DeleteReplicaSet(o.metadata.name.clone().unwrap_or_default()));
            }
        }
    }
    conds.sort_by_key(|c| if c.type_.as_deref() == Some("Available") { 0 } else { 1 });
    status.conditions = Some(conds);
    Plan { steps, status, requeue }
}

fn status_changed(old: Option<&DeploymentStatus>, new: &DeploymentStatus) -> bool {
    let strip = |s: &DeploymentStatus| {
        let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
        for c in v.pointer_mut("/conditions").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(o) = c.as_object_mut() {
                o.remove("lastUpdateTime");
                o.remove("lastTransitionTime");
            }
        }
        v
    };
    let old = old.cloned().unwrap_or_default();
    strip(&old) != strip(new)
        || old
            .conditions
            .iter()
            .flatten()
            .zip(new.conditions.iter().flatten())
            .any(|(a, b)| a.last_update_time != b.last_update_time && b.reason.as_deref() == Some("ReplicaSetUpdated"))
}

pub struct Ctx {
    pub client: kube::Client,
    pub rs: Informer<ReplicaSet>,
    pub pods: Informer<Pod>,
    pub recorder: Recorder,
}

pub async fn reconcile(d: Arc<Deployment>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = d.metadata.namespace.clone().unwrap_or_default();
    let name = d.metadata.name.clone().unwrap_or_default();
    let rss: Vec<Arc<ReplicaSet>> =
        ctx.rs.state().into_iter().filter(|r| r.metadata.namespace.as_deref() == Some(&ns)).collect();
    let pods: Vec<Arc<Pod>> = if is_recreate(&d) {
        ctx.pods.state().into_iter().filter(|p| p.metadata.namespace.as_deref() == Some(&ns)).collect()
    } else {
        Vec::new()
    };
    let plan = plan(&d, &rss, &pods, Timestamp::now());
    let rs_api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &ns);
    let d_api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let pp = PatchParams::default();
    let replicas = d.spec.replicas.unwrap_or(1);
    let max = replicas + fenceposts(&d).0;
    for step in &plan.steps {
        match step {
            Step::CreateReplicaSet(rs) => match rs_api.create(&PostParams::default(), rs).await {
                Ok(_) => {
                    let n = rs.metadata.name.clone().unwrap_or_default();
                    let to = rs.spec.replicas.unwrap_or(0);
                    if to > 0 {
                        ctx.recorder.event(
                            d.as_ref(),
                            NORMAL,
                            "ScalingReplicaSet",
                            format!("Scaled up replica set {n} from 0 to {to}"),
                        );
                    }
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    // Same name with another template: a hash collision.
                    let existing = rs_api.get_opt(rs.metadata.name.as_deref().unwrap_or_default()).await?;
                    let ours = existing
                        .as_ref()
                        .and_then(|e| controller_ref(&e.metadata))
                        .is_some_and(|r| Some(&r.uid) == d.metadata.uid.as_ref());
                    if !ours {
                        let c = d.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0) + 1;
                        d_api.patch_status(&name, &pp, &Patch::Merge(json!({"status": {"collisionCount": c}}))).await?;
                        return Ok(Action::requeue(Duration::from_millis(100)));
                    }
                }
                Err(e) => return Err(e.into()),
            },
            Step::Scale(n, from, to) => {
                let patch = json!({
                    "metadata": {"annotations": {DESIRED_REPLICAS: replicas.to_string(), MAX_REPLICAS: max.to_string()}},
                    "spec": {"replicas": to}
                });
                rs_api.patch(n, &pp, &Patch::Merge(&patch)).await?;
                let dir = if to > from { "up" } else { "down" };
                ctx.recorder.event(
                    d.as_ref(),
                    NORMAL,
                    "ScalingReplicaSet",
                    format!("Scaled {dir} replica set {n} from {from} to {to}"),
                );
            }
            Step::SetRevision(n, rev) => {
                rs_api.patch(n, &pp, &Patch::Merge(json!({"metadata": {"annotations": {REVISION: rev}}}))).await?;
            }
            Step::AdoptReplicaSet(n) => {
                let Some(rs) = rss.iter().find(|r| r.metadata.name.as_deref() == Some(n)) else { continue };
                let mut refs = rs.metadata.owner_references.clone().unwrap_or_default();
                refs.push(owner_ref(d.as_ref()));
                rs_api
                    .patch(
                        n,
                        &pp,
                        &Patch::Merge(json!({"metadata": {"ownerReferences": refs, "uid": rs.metadata.uid}})),
                    )
                    .await?;
            }
            Step::DeleteReplicaSet(n) => match rs_api.delete(n, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            },
            Step::AnnotateDeployment(rev) => {
                d_api.patch(&name, &pp, &Patch::Merge(json!({"metadata": {"annotations": {REVISION: rev}}}))).await?;
            }
        }
    }
    if status_changed(d.status.as_ref(), &plan.status) {
        match d_api.patch_status(&name, &pp, &Patch::Merge(json!({"status": plan.status}))).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::requeue(plan.requeue.unwrap_or(Duration::from_secs(300))))
}

pub async fn run(client: kube::Client, pods: Informer<Pod>, recorder: Recorder, workers: u16) {
    let rs = Informer::start(Api::<ReplicaSet>::all(client.clone()));
    let ctx = Arc::new(Ctx { client: client.clone(), rs: rs.clone(), pods: pods.clone(), recorder });
    let (tx, triggers) = trigger::<Deployment>();
    let controller = Controller::new(Api::<Deployment>::all(client), watcher::Config::default())
        .with_config(kube::runtime::controller::Config::default().concurrency(workers))
        .reconcile_on(triggers);
    let store = controller.store();
    let tx2 = tx.clone();
    rs.add_handler(move |r, _| {
        let ns = r.metadata.namespace.clone().unwrap_or_default();
        match controller_ref(&r.metadata) {
            Some(o) if o.kind == "Deployment" => {
                let _ = tx.send(ObjectRef::new(&o.name).within(&ns));
            }
            Some(_) => {}
            None => {
                for d in store.state() {
                    if d.metadata.namespace.as_deref() == Some(&ns)
                        && selects(Some(&d.spec.selector), &labels(&r.metadata))
                    {
                        let _ = tx.send(ObjectRef::from_obj(d.as_ref()));
                    }
                }
            }
        }
    });
    // Recreate waits for old pods to go: a pod's deletion wakes its Deployment.
    let rs_store = rs.store.clone();
    pods.add_handler(move |p, deleted| {
        if !deleted {
            return;
        }
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        if let Some(r) = controller_ref(&p.metadata).filter(|r| r.kind == "ReplicaSet") {
            if let Some(rs) = rs_store.get(&ObjectRef::new(&r.name).within(&ns)) {
                if let Some(o) = controller_ref(&rs.metadata).filter(|o| o.kind == "Deployment") {
                    let _ = tx2.send(ObjectRef::new(&o.name).within(&ns));
                }
            }
        }
    });
    pods.synced().await;
    rs.synced().await;
    run_controller(
        controller,
        reconcile,
        ctx,
        Policy { metric: "deployment", what: "deployment", retry: Duration::from_secs(1) },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStrategy, ReplicaSetStatus, RollingUpdateDeployment};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn deploy(replicas: i32, image: &str) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("uid-d".into()),
                generation: Some(1),
                ..Default::default()
            },
            spec: DeploymentSpec {
                replicas: Some(replicas),
                selector: LabelSelector { match_labels: Some(lbl(&[("app", "web")])), match_expressions: None },
                template: template(&[("app", "web")], image),
                ..Default::default()
            },
            status: None,
        }
    }

    fn with_status(mut rs: ReplicaSet, replicas: i32, available: i32) -> Arc<ReplicaSet> {
        rs.status = Some(ReplicaSetStatus {
            replicas,
            ready_replicas: Some(available),
            available_replicas: Some(available),
            ..Default::default()
        });
        rs.metadata.uid = Some(format!("uid-{}", rs.metadata.name.clone().unwrap()));
        Arc::new(rs)
    }

    #[test]
    fn first_sync_creates_new_replicaset_with_hash_and_revision_1() {
        let d = deploy(3, "nginx:1");
        let p = plan(&d, &[], &[], now());
        let Step::CreateReplicaSet(rs) = &p.steps[0] else { panic!("{:?}", p.steps) };
        let hash = pod_template_hash(&d.spec.template, None);
        assert_eq!(rs.metadata.name.as_deref(), Some(format!("web-{hash}").as_str()));
        assert_eq!(rs.spec.replicas, Some(3));
        assert_eq!(rs.metadata.annotations.as_ref().unwrap()[REVISION], "1");
        assert_eq!(rs.spec.selector.match_labels.as_ref().unwrap()[HASH_LABEL], hash);
        assert!(p.steps.contains(&Step::AnnotateDeployment("1".into())));
        let c = p.status.conditions.unwrap();
        assert!(c
            .iter()
            .any(|c| c.type_.as_deref() == Some("Progressing") && c.reason.as_deref() == Some("NewReplicaSetCreated")));
    }

    #[test]
    fn hash_ignores_the_hash_label_and_changes_with_the_template() {
        let a = template(&[("app", "web")], "nginx:1");
        let mut a2 = a.clone();
        a2.metadata.as_mut().unwrap().labels.as_mut().unwrap().insert(HASH_LABEL.into(), "x".into());
        assert_eq!(pod_template_hash(&a, None), pod_template_hash(&a2, None));
        assert_ne!(pod_template_hash(&a, None), pod_template_hash(&template(&[("app", "web")], "nginx:2"), None));
        assert_ne!(pod_template_hash(&a, None), pod_template_hash(&a, Some(1)));
    }

    #[test]
    fn rolling_update_respects_max_surge_then_max_unavailable() {
        // 4 replicas, default 25%/25% → surge 1, unavailable 1.
        let old_d = deploy(4, "nginx:1");
        let old_rs = with_status(new_replicaset(&old_d, 4, 1), 4, 4);
        let d = deploy(4, "nginx:2");
        let p = plan(&d, std::slice::from_ref(&old_rs), &[], now());
        let Step::CreateReplicaSet(new) = &p.steps[0] else { panic!("{:?}", p.steps) };
        assert_eq!(new.spec.replicas, Some(1), "maxSurge 1 above 4");
        assert_eq!(new.metadata.annotations.as_ref().unwrap()[REVISION], "2");
        assert!(!p.steps.iter().any(|s| matches!(s, Step::Scale(..))), "no scale-down in the scale-up pass");

        // Next sync: new RS at 1 (not yet available): old may go down to 3 (minAvailable 3).
        let new = with_status(new_replicaset(&d, 1, 2), 1, 0);
        let p = plan(&d, &[old_rs.clone(), new.clone()], &[], now());
        let old_name = old_rs.metadata.name.clone().unwrap();
        assert_eq!(scales(&p), vec![Step::Scale(old_name.clone(), 4, 3)]);

        // Old at 3, new at 1 available: new up to 2.
        let mut old3 = (*old_rs).clone();
        old3.spec.replicas = Some(3);
        let old3 = with_status(old3, 3, 3);
        let new1 = with_status(new_replicaset(&d, 1, 2), 1, 1);
        let p = plan(&d, &[old3, new1.clone()], &[], now());
        assert_eq!(scales(&p), vec![Step::Scale(new1.metadata.name.clone().unwrap(), 1, 2)]);
    }

    fn scales(p: &Plan) -> Vec<Step> {
        p.steps.iter().filter(|s| matches!(s, Step::Scale(..))).cloned().collect()
    }

    #[test]
    fn percentages_and_counts() {
        let mut d = deploy(10, "x");
        d.spec.strategy = Some(DeploymentStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDeployment {
                max_surge: Some(IntOrString::String("30%".into())),
                max_unavailable: Some(IntOrString::Int(0)),
            }),
        });
        assert_eq!(fenceposts(&d), (3, 0));
        d.spec.strategy.as_mut().unwrap().rolling_update.as_mut().unwrap().max_surge = Some(IntOrString::Int(0));
        assert_eq!(fenceposts(&d), (0, 1), "both zero → maxUnavailable 1");
    }

    #[test]
    fn recreate_scales_old_to_zero_before_creating() {
        let mut d = deploy(2, "nginx:2");
        d.spec.strategy = Some(DeploymentStrategy { type_: Some("Recreate".into()), rolling_update: None });
        let old_rs = with_status(new_replicaset(&deploy(2, "nginx:1"), 2, 1), 2, 2);
        let p = plan(&d, std::slice::from_ref(&old_rs), &[], now());
        assert_eq!(p.steps, vec![Step::Scale(old_rs.metadata.name.clone().unwrap(), 2, 0)]);
        // Old at 0 but a pod still running: wait.
        let mut old0 = (*old_rs).clone();
        old0.spec.replicas = Some(0);
        let old0 = with_status(old0, 0, 0);
        let pod = Arc::new(pod("p", &[("app", "web")], Some(old0.as_ref())));
        assert!(plan(&d, std::slice::from_ref(&old0), &[pod], now()).steps.is_empty());
        let p = plan(&d, &[old0], &[], now());
        assert!(matches!(&p.steps[0], Step::CreateReplicaSet(rs) if rs.spec.replicas == Some(2)));
    }

    #[test]
    fn undo_gives_the_old_replicaset_the_next_revision() {
        let d1 = deploy(1, "nginx:1");
        let rs1 = with_status(new_replicaset(&d1, 0, 1), 0, 0);
        let rs2 = with_status(new_replicaset(&deploy(1, "nginx:2"), 1, 2), 1, 1);
        // kubectl rollout undo put template 1 back.
        let p = plan(&d1, &[rs1.clone(), rs2], &[], now());
        assert!(p.steps.contains(&Step::SetRevision(rs1.metadata.name.clone().unwrap(), "3".into())));
        assert!(p.steps.contains(&Step::AnnotateDeployment("3".into())));
    }

    #[test]
    fn complete_rollout_status_and_history_limit() {
        let mut d = deploy(2, "nginx:3");
        d.spec.revision_history_limit = Some(1);
        let a = with_status(new_replicaset(&deploy(2, "nginx:1"), 0, 1), 0, 0);
        let b = with_status(new_replicaset(&deploy(2, "nginx:2"), 0, 2), 0, 0);
        let mut c = new_replicaset(&d, 2, 3);
        c.metadata.creation_timestamp = Some(Time(at(50)));
        let c = with_status(c, 2, 2);
        d.metadata.annotations = Some(lbl(&[(REVISION, "3")]));
        let p = plan(&d, &[a.clone(), b, c], &[], now());
        assert_eq!(p.steps, vec![Step::DeleteReplicaSet(a.metadata.name.clone().unwrap())]);
        assert_eq!(p.status.updated_replicas, Some(2));
        assert_eq!(p.status.available_replicas, Some(2));
        assert_eq!(p.status.observed_generation, Some(1));
        let conds = p.status.conditions.unwrap();
        assert!(conds.iter().any(
            |c| c.type_.as_deref() == Some("Progressing") && c.reason.as_deref() == Some("NewReplicaSetAvailable")
        ));
        assert!(conds.iter().any(|c| c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True")));
    }

    #[test]
    fn paused_deployment_does_not_roll_out() {
        let mut d = deploy(2, "nginx:2");
        d.spec.paused = Some(true);
        let old = with_status(new_replicaset(&deploy(2, "nginx:1"), 2, 1), 2, 2);
        let p = plan(&d, &[old], &[], now());
        assert!(p.steps.is_empty());
        assert!(p.status.conditions.unwrap().iter().any(|c| c.reason.as_deref() == Some("DeploymentPaused")));
    }

    #[test]
    fn progress_deadline_exceeded() {
        let mut d = deploy(2, "nginx:1");
        d.spec.progress_deadline_seconds = Some(60);
        let rs = with_status(new_replicaset(&d, 2, 1), 2, 0);
        d.metadata.annotations = Some(lbl(&[(REVISION, "1")]));
        let mut cond = condition("True", "ReplicaSetUpdated", "x".into(), at(100));
        cond.last_update_time = Some(Time(at(100)));
        d.status = Some(DeploymentStatus {
            replicas: Some(2),
            updated_replicas: Some(2),
            ready_replicas: Some(0),
            available_replicas: Some(0),
            conditions: Some(vec![cond]),
            ..Default::default()
        });
        let p = plan(&d, &[rs], &[], now());
        let conds = p.status.conditions.unwrap();
        let c = conds.iter().find(|c| c.type_.as_deref() == Some("Progressing")).unwrap();
        assert_eq!((c.status.as_deref(), c.reason.as_deref()), (Some("False"), Some("ProgressDeadlineExceeded")));
    }
}
