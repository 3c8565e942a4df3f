//! The DaemonSet controller (`pkg/controller/daemon`): one pod per eligible node. A node is
//! eligible when the template's nodeName (if any), nodeSelector and required node affinity
//! match it and every NoSchedule / NoExecute taint is tolerated — with the tolerations
//! upstream adds to every daemon pod (not-ready and unreachable NoExecute; disk-, memory-,
//! pid-pressure and unschedulable NoSchedule; network-unavailable for hostNetwork pods). A
//! pod stays on a node whose only untolerated taints are NoSchedule. Pods are created with a
//! required node affinity `metadata.name In [node]` (matchFields), so the scheduler places
//! them; pods on nodes that are gone or no longer eligible are deleted, failed ones replaced.
//! Updates: `RollingUpdate` within `maxUnavailable` (delete old, then create) or `maxSurge`
//! (create new beside old, delete old once the new one is available), and `OnDelete`.
//! Templates are ControllerRevisions (`history.rs`), pods carry `controller-revision-hash`;
//! status is what `kubectl rollout status daemonset/…` reads.
//!
//! [`plan`] is the decision, a pure function of the DaemonSet, the nodes, the pods and the
//! revisions; [`reconcile`] applies it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use apimachinery::labels::selector_or_nothing;
use apimachinery::scheduling::{node_selector_matches, tolerated};
use common::events::{Recorder, NORMAL, WARNING};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodTemplateSpec,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;

use crate::history::{self, Update, REVISION_HASH_LABEL};
use crate::informer::{route_pods, trigger, Informer};
use crate::runner::{run_controller, Policy};
use crate::util::*;
use crate::Error;

/// The deprecated label with the DaemonSet's generation that upstream still sets.
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";

/// One write of a sync.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    CreateRevision(Box<ControllerRevision>),
    RenumberRevision(String, i64),
    AdoptPod(String),
    ReleasePod(String),
    /// A daemon pod for this node.
    CreatePod(String),
    /// (name, uid, why).
    DeletePod(String, String, &'static str),
    DeleteRevision(String),
}

#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub status: DaemonSetStatus,
    /// The pod template's hash (the `controller-revision-hash` of new pods).
    pub hash: String,
    pub requeue: Option<Duration>,
}

fn toleration(key: &str, effect: &str) -> Toleration {
    Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Default::default()
    }
}

/// The template's tolerations plus those of every daemon pod (`AddOrUpdateDaemonPodTolerations`).
pub fn daemon_tolerations(template: &PodTemplateSpec) -> Vec<Toleration> {
    let spec = template.spec.clone().unwrap_or_default();
    let mut out = spec.tolerations.unwrap_or_default();
    let mut add = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if spec.host_network == Some(true) {
        add.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    for (k, e) in add {
        let t = toleration(k, e);
        match out.iter_mut().find(|x| x.key == t.key && x.effect == t.effect) {
            Some(x) => *x = t,
            None => out.push(t),
        }
    }
    out
}

/// `NodeShouldRunDaemonPod`: (should run, should continue running).
pub fn should_run(ds: &DaemonSet, node: &Node) -> (bool, bool) {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let labels = labels(&node.metadata);
    let spec = ds.spec.template.spec.clone().unwrap_or_default();
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty() && n != name) {
        return (false, false);
    }
    let selector_ok = spec.node_selector.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    if !selector_ok || required.is_some_and(|r| !node_selector_matches(r, name, &labels)) {
        return (false, false);
    }
    let tolerations = daemon_tolerations(&ds.spec.template);
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    let untolerated =
        |effects: &[&str]| taints.iter().any(|t| effects.contains(&t.effect.as_str()) && !tolerated(&tolerations, t));
    if untolerated(&["NoSchedule", "NoExecute"]) {
        return (false, !untolerated(&["NoExecute"]));
    }
    (true, true)
}

/// The node a daemon pod is for: its nodeName, or the node its required affinity names
/// (`GetTargetNodeName`).
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().flat_map(|t| t.match_fields.iter().flatten()).find_map(|r| {
        let v = r.values.as_deref().unwrap_or_default();
        (r.key == "metadata.name" && r.operator == "In" && v.len() == 1).then(|| v[0].clone())
    })
}

/// The daemon pod for `node` (`NewPod` + `ReplaceDaemonSetPodNodeNameNodeAffinity`): the
/// template with the revision hash, the daemon tolerations and a required node affinity for
/// exactly that node (preferred terms kept).
pub fn new_pod(ds: &DaemonSet, hash: &str, node: &str) -> Pod {
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let name = ds.metadata.name.clone().unwrap_or_default();
    let mut pod = pod_from_template(&ds.spec.template, &ns, &name, owner_ref(ds));
    let l = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    l.insert(REVISION_HASH_LABEL.into(), hash.to_string());
    if let Some(g) = ds.metadata.generation {
        l.insert(TEMPLATE_GENERATION_LABEL.into(), g.to_string());
    }
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.tolerations = Some(daemon_tolerations(&ds.spec.template));
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let na = affinity.node_affinity.get_or_insert_with(NodeAffinity::default);
    na.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.to_string()]),
            }]),
        }],
    });
    pod
}

/// `podByCreationTimestampAndPhase`: scheduled first, then oldest, then by name.
fn oldest_first(pods: &mut [&Pod]) {
    pods.sort_by_key(|p| {
        let scheduled = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
        (!scheduled, creation(&p.metadata), p.metadata.name.clone())
    });
}

fn hash_of(p: &Pod) -> &str {
    p.metadata.labels.as_ref().and_then(|l| l.get(REVISION_HASH_LABEL)).map(String::as_str).unwrap_or("")
}

fn name_uid(p: &Pod) -> (String, String) {
    (p.metadata.name.clone().unwrap_or_default(), p.metadata.uid.clone().unwrap_or_default())
}

/// (maxSurge, maxUnavailable) against the desired number of pods.
fn budgets(ds: &DaemonSet, desired: i32) -> (i32, i32) {
    let ru = ds.spec.update_strategy.as_ref().and_then(|s| s.rolling_update.clone()).unwrap_or_default();
    let surge = scaled_value(ru.max_surge.as_ref(), desired, true, "0");
    let mut unavailable = scaled_value(ru.max_unavailable.as_ref(), desired, true, "1");
    if desired > 0 && surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    (surge, unavailable)
}

/// The decision of one sync. `manage` is false while earlier creates and deletes are not
/// yet in the cache (then only ownership, revisions and status).
pub fn plan(
    ds: &DaemonSet,
    nodes: &[Arc<Node>],
    pods: &[Arc<Pod>],
    revisions: &[Arc<ControllerRevision>],
    manage: bool,
    now: Timestamp,
) -> Plan {
    let mut steps = Vec::new();
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let ds_name = ds.metadata.name.clone().unwrap_or_default();
    let uid = ds.metadata.uid.clone().unwrap_or_default();
    let deleting = is_deleting(&ds.metadata);
    let old = ds.status.clone().unwrap_or_default();
    let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);

    let owned_revs = history::owned(ds, revisions);
    let hash =
        match history::update_revision(ds, &owned_revs, &ds.spec.template, old.collision_count, REVISION_HASH_LABEL) {
            Update::Existing { name, renumber } => {
                if let Some(n) = renumber {
                    steps.push(Step::RenumberRevision(name.clone(), n));
                }
                let rev = owned_revs.iter().find(|r| r.metadata.name.as_ref() == Some(&name));
                rev.and_then(|r| r.metadata.labels.as_ref()?.get(REVISION_HASH_LABEL).cloned())
                    .unwrap_or_else(|| history::hash_of_name(&ds_name, &name).to_string())
            }
            Update::New(r) => {
                let h =
                    r.metadata.labels.as_ref().and_then(|l| l.get(REVISION_HASH_LABEL).cloned()).unwrap_or_default();
                steps.push(Step::CreateRevision(r));
                h
            }
        };

    // Ownership.
    let selector = selector_or_nothing(Some(&ds.spec.selector));
    let mut owned: Vec<&Pod> = Vec::new();
    for p in pods.iter().map(Arc::as_ref).filter(|p| p.metadata.namespace.as_deref() == Some(&ns)) {
        let matches = selector.matches(&labels(&p.metadata));
        match controller_ref(&p.metadata) {
            Some(r) if r.uid == uid => {
                if matches || deleting {
                    owned.push(p);
                } else if !is_deleting(&p.metadata) {
                    steps.push(Step::ReleasePod(name_uid(p).0));
                }
            }
            None if matches && !deleting && !is_deleting(&p.metadata) && is_pod_active(p) => {
                steps.push(Step::AdoptPod(name_uid(p).0));
                owned.push(p);
            }
            _ => {}
        }
    }
    // Pods by target node, leaving out terminal pods already being deleted.
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    let mut orphaned: Vec<&Pod> = Vec::new();
    for p in &owned {
        if is_deleting(&p.metadata) && matches!(pod_phase(p), "Succeeded" | "Failed") {
            continue;
        }
        match target_node(p) {
            Some(n) => by_node.entry(n).or_default().push(p),
            None => orphaned.push(p),
        }
    }
    let node_names: HashSet<&str> = nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();

    // Manage: which nodes need a pod, which pods must go (`podsShouldBeOnNode`).
    let mut manage_steps: Vec<Step> = Vec::new();
    let mut desired = 0;
    let surge_allowed = update_type(ds) == "RollingUpdate" && budgets(ds, 1).0 > 0;
    let mut eligible: HashMap<&str, bool> = HashMap::new();
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let (run, keep) = should_run(ds, node);
        eligible.insert(name, run);
        desired += run as i32;
        let on_node = by_node.get(name).cloned().unwrap_or_default();
        if keep {
            let mut running: Vec<&Pod> = Vec::new();
            for p in on_node.iter().filter(|p| !is_deleting(&p.metadata)) {
                if matches!(pod_phase(p), "Failed" | "Succeeded") {
                    let (n, u) = name_uid(p);
                    manage_steps.push(Step::DeletePod(n, u, "failed"));
                } else {
                    running.push(p);
                }
            }
            if run && running.is_empty() {
                manage_steps.push(Step::CreatePod(name.to_string()));
            }
            if running.len() > 1 {
                oldest_first(&mut running);
                let mut extra: Vec<&Pod> = Vec::new();
                if !surge_allowed {
                    extra.extend(&running[1..]);
                } else {
                    // Two pods only while the new one is not yet available and the old one is ready.
                    let (mut new, mut old_pod) = (None, None);
                    for p in &running {
                        let slot = if hash_of(p) == hash { &mut new } else { &mut old_pod };
                        if slot.is_none() {
                            *slot = Some(*p);
                        } else {
                            extra.push(p);
                        }
                    }
                    if let (Some(n), Some(o)) = (new, old_pod) {
                        if !is_pod_ready(o) || is_pod_available(n, min_ready, now) {
                            extra.push(o);
                        }
                    }
                }
                for p in extra {
                    let (n, u) = name_uid(p);
                    manage_steps.push(Step::DeletePod(n, u, "excess"));
                }
            }
        } else {
            for p in on_node.iter().filter(|p| !is_deleting(&p.metadata)) {
                let (n, u) = name_uid(p);
                manage_steps.push(Step::DeletePod(n, u, "not eligible"));
            }
        }
    }
    // Pods for nodes that are gone.
    for (node, ps) in &by_node {
        if !node_names.contains(node.as_str()) {
            for p in ps.iter().filter(|p| !is_deleting(&p.metadata)) {
                let (n, u) = name_uid(p);
                manage_steps.push(Step::DeletePod(n, u, "node gone"));
            }
        }
    }
    for p in orphaned.iter().filter(|p| !is_deleting(&p.metadata)) {
        let (n, u) = name_uid(p);
        manage_steps.push(Step::DeletePod(n, u, "no node"));
    }

    let manage_now = manage && !deleting;
    let idle = manage_steps.is_empty();
    if manage_now {
        steps.extend(manage_steps);
    }
    // Rolling update, once nothing else is in flight.
    if manage_now && idle && update_type(ds) == "RollingUpdate" {
        steps.extend(rolling_update(ds, &by_node, &eligible, &hash, desired, now));
    }

    // Status (`updateDaemonSetStatus`).
    let mut status = DaemonSetStatus {
        desired_number_scheduled: desired,
        observed_generation: ds.metadata.generation,
        collision_count: old.collision_count,
        conditions: old.conditions.clone(),
        ..Default::default()
    };
    let (mut available, mut updated) = (0, 0);
    let mut requeue = None;
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let mut on_node = by_node.get(name).cloned().unwrap_or_default();
        let scheduled = !on_node.is_empty();
        if eligible.get(name).copied().unwrap_or(false) {
            if !scheduled {
                continue;
            }
            status.current_number_scheduled += 1;
            oldest_first(&mut on_node);
            let p = on_node[0];
            if is_pod_ready(p) {
                status.number_ready += 1;
                if is_pod_available(p, min_ready, now) {
                    available += 1;
                } else {
                    requeue = requeue.into_iter().chain(becomes_available_in(p, min_ready, now)).min();
                }
            }
            if hash_of(p) == hash {
                updated += 1;
            }
        } else if scheduled {
            status.number_misscheduled += 1;
        }
    }
    status.number_available = Some(available);
    status.updated_number_scheduled = Some(updated);
    status.number_unavailable = Some(desired - available);

    if !deleting {
        let mut live: HashSet<String> = HashSet::new();
        let live_hashes: HashSet<&str> = owned.iter().map(|p| hash_of(p)).chain([hash.as_str()]).collect();
        for r in &owned_revs {
            let rh = r.metadata.labels.as_ref().and_then(|l| l.get(REVISION_HASH_LABEL)).map(String::as_str);
            if rh.is_some_and(|h| live_hashes.contains(h)) {
                live.extend(r.metadata.name.clone());
            }
        }
        for r in history::to_truncate(&owned_revs, &live, ds.spec.revision_history_limit) {
            steps.push(Step::DeleteRevision(r));
        }
    }
    Plan { steps, status, hash, requeue }
}

fn update_type(ds: &DaemonSet) -> &str {
    ds.spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref()).unwrap_or("RollingUpdate")
}

/// `findUpdatedPodsOnNode`: (new, old), or None when a node has more than one of either.
fn updated_and_old<'a>(pods: &[&'a Pod], hash: &str) -> Option<(Option<&'a Pod>, Option<&'a Pod>)> {
    let (mut new, mut old) = (None, None);
    for p in pods.iter().filter(|p| !is_deleting(&p.metadata)) {
        let slot = if hash_of(p) == hash { &mut new } else { &mut old };
        if slot.is_some() {
            return None;
        }
        *slot = Some(*p);
    }
    Some((new, old))
}

/// `rollingUpdate`: old pods replaced within maxUnavailable (delete first) or maxSurge
/// (create first, delete the old pod once the new one is available).
fn rolling_update(
    ds: &DaemonSet,
    by_node: &BTreeMap<String, Vec<&Pod>>,
    eligible: &HashMap<&str, bool>,
    hash: &str,
    desired: i32,
    now: Timestamp,
) -> Vec<Step> {
    let (max_surge, max_unavailable) = budgets(ds, desired);
    let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);
    let available = |p: &Pod| is_pod_available(p, min_ready, now);
    let mut steps = Vec::new();
    if max_surge == 0 {
        let mut unavailable = 0;
        let mut replace: Vec<&Pod> = Vec::new();
        let mut candidates: Vec<&Pod> = Vec::new();
        for pods in by_node.values() {
            match updated_and_old(pods, hash) {
                None | Some((None, None)) | Some((Some(_), Some(_))) => unavailable += 1,
                Some((Some(new), None)) => unavailable += !available(new) as i32,
                Some((None, Some(old))) => {
                    if !available(old) {
                        replace.push(old);
                    } else if unavailable < max_unavailable {
                        candidates.push(old);
                    }
                }
            }
        }
        let room = (max_unavailable - unavailable).max(0) as usize;
        for p in replace.into_iter().chain(candidates.into_iter().take(room)) {
            let (n, u) = name_uid(p);
            steps.push(Step::DeletePod(n, u, "update"));
        }
        return steps;
    }
    let mut surging = 0;
    let mut allowed: Vec<String> = Vec::new();
    let mut candidates: Vec<String> = Vec::new();
    for (node, pods) in by_node {
        let Some((new, Some(old))) = updated_and_old(pods, hash) else { continue };
        match new {
            None if !available(old) => {
                if eligible.get(node.as_str()).copied().unwrap_or(false) {
                    allowed.push(node.clone());
                } else {
                    let (n, u) = name_uid(old);
                    steps.push(Step::DeletePod(n, u, "update"));
                }
            }
            None => {
                if surging < max_surge {
                    candidates.push(node.clone());
                }
            }
            Some(new) if !available(new) => surging += 1,
            Some(_) => {
                let (n, u) = name_uid(old);
                steps.push(Step::DeletePod(n, u, "update"));
            }
        }
    }
    let room = (max_surge - surging).max(0) as usize;
    for node in allowed.into_iter().chain(candidates.into_iter().take(room)) {
        steps.push(Step::CreatePod(node));
    }
    steps
}

fn status_changed(old: Option<&DaemonSetStatus>, new: &DaemonSetStatus) -> bool {
    let old = old.cloned().unwrap_or_default();
    let norm = |s: &DaemonSetStatus| {
        (
            s.desired_number_scheduled,
            s.current_number_scheduled,
            s.number_ready,
            s.number_misscheduled,
            s.number_available.unwrap_or(0),
            s.updated_number_scheduled.unwrap_or(0),
            s.number_unavailable.unwrap_or(0),
            s.observed_generation,
            s.collision_count,
        )
    };
    norm(&old) != norm(new)
}

pub struct Ctx {
    pub client: kube::Client,
    pub pods: Informer<Pod>,
    pub nodes: Informer<Node>,
    pub revisions: Informer<ControllerRevision>,
    pub expectations: Expectations,
    pub recorder: Recorder,
}

pub async fn reconcile(ds: Arc<DaemonSet>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let name = ds.metadata.name.clone().unwrap_or_default();
    let key = key(&ds.metadata);
    let pods: Vec<Arc<Pod>> =
        ctx.pods.state().into_iter().filter(|p| p.metadata.namespace.as_deref() == Some(&ns)).collect();
    let revisions: Vec<Arc<ControllerRevision>> =
        ctx.revisions.state().into_iter().filter(|r| r.metadata.namespace.as_deref() == Some(&ns)).collect();
    let nodes = ctx.nodes.state();
    let manage = ctx.expectations.satisfied(&key);
    let plan = plan(&ds, &nodes, &pods, &revisions, manage, Timestamp::now());
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let ds_api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ns);
    let pp = PatchParams::default();
    let me = owner_ref(ds.as_ref());
    let mut failure = None;
    for step in &plan.steps {
        match step {
            Step::CreateRevision(r) => {
                let collisions = ds.status.as_ref().and_then(|s| s.collision_count);
                if !history::create(&ctx.client, ds.as_ref(), r, collisions).await? {
                    return Ok(Action::requeue(Duration::from_millis(100)));
                }
            }
            Step::RenumberRevision(r, n) => history::renumber(&ctx.client, &ns, r, *n).await?,
            Step::AdoptPod(p) | Step::ReleasePod(p) => {
                if let Some(pod) = pods.iter().find(|x| x.metadata.name.as_deref() == Some(p)) {
                    set_controller(&pod_api, pod, &me, matches!(step, Step::AdoptPod(_))).await;
                }
            }
            Step::CreatePod(node) => {
                let mut pod = new_pod(&ds, &plan.hash, node);
                let pname = format!("{name}-{}", apimachinery::names::random_suffix());
                pod.metadata.name = Some(pname.clone());
                pod.metadata.generate_name = None;
                match ctx.expectations.create_pod(&pod_api, &key, &pod).await {
                    Ok(()) => {
                        ctx.recorder.event(ds.as_ref(), NORMAL, "SuccessfulCreate", format!("Created pod: {pname}"))
                    }
                    Err(e) => {
                        ctx.recorder.event(ds.as_ref(), WARNING, "FailedCreate", format!("Error creating: {e}"));
                        failure = Some(e);
                    }
                }
            }
            Step::DeletePod(p, uid, why) => match ctx.expectations.delete_pod(&pod_api, &key, p, uid).await {
                Ok(true) => {
                    tracing::info!(daemonset = %key, pod = %p, reason = why, "deleting pod");
                    ctx.recorder.event(ds.as_ref(), NORMAL, "SuccessfulDelete", format!("Deleted pod: {p}"));
                }
                Ok(false) => {}
                Err(e) => {
                    ctx.recorder.event(ds.as_ref(), WARNING, "FailedDelete", format!("Error deleting: {e}"));
                    failure = Some(e);
                }
            },
            Step::DeleteRevision(r) => history::delete(&ctx.client, &ns, r).await?,
        }
    }
    if status_changed(ds.status.as_ref(), &plan.status) {
        ignore_not_found(ds_api.patch_status(&name, &pp, &Patch::Merge(json!({"status": plan.status}))).await)?;
    }
    if let Some(e) = failure {
        return Err(e.into());
    }
    if !manage {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    Ok(Action::requeue(plan.requeue.unwrap_or(Duration::from_secs(300))))
}

/// What of a node decides where daemon pods run (a change of anything else, such as a
/// heartbeat, wakes no DaemonSet).
fn node_fingerprint(n: &Node) -> String {
    let spec = n.spec.as_ref();
    json!([n.metadata.labels, spec.and_then(|s| s.taints.clone()), spec.and_then(|s| s.unschedulable)]).to_string()
}

/// Run the controller.
pub async fn run(
    client: kube::Client,
    pods: Informer<Pod>,
    revisions: Informer<ControllerRevision>,
    recorder: Recorder,
) {
    let nodes = Informer::start(Api::<Node>::all(client.clone()));
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        pods: pods.clone(),
        nodes: nodes.clone(),
        revisions: revisions.clone(),
        expectations: Expectations::default(),
        recorder,
    });
    let (tx, triggers) = trigger::<DaemonSet>();
    let controller = Controller::new(Api::<DaemonSet>::all(client), watcher::Config::default()).reconcile_on(triggers);
    let store = controller.store();
    let (tx_pods, tx_revs, tx_nodes) = (tx.clone(), tx.clone(), tx);
    let selector: fn(&DaemonSet) -> &LabelSelector = |d| &d.spec.selector;
    route_pods(&pods, "DaemonSet", ctx.clone(), |c| &c.expectations, Some((store.clone(), selector)), tx_pods);
    revisions.add_handler(move |r, _| {
        if let Some(o) = controller_ref(&r.metadata).filter(|o| o.kind == "DaemonSet") {
            let ns = r.metadata.namespace.clone().unwrap_or_default();
            let _ = tx_revs.send(ObjectRef::new(&o.name).within(&ns));
        }
    });
    let seen: Mutex<HashMap<String, String>> = Mutex::default();
    nodes.add_handler(move |n, deleted| {
        let name = n.metadata.name.clone().unwrap_or_default();
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        let changed = if deleted {
            seen.remove(&name).is_some()
        } else {
            seen.insert(name, node_fingerprint(n)).as_ref() != Some(&node_fingerprint(n))
        };
        if changed {
            for d in store.state() {
                let _ = tx_nodes.send(ObjectRef::from_obj(d.as_ref()));
            }
        }
    });
    pods.synced().await;
    revisions.synced().await;
    nodes.synced().await;
    let policy = Policy { metric: "daemonset", what: "daemonset", retry: Duration::from_secs(1) };
    run_controller(controller, reconcile, ctx, policy).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn ds(update: serde_json::Value) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "default", "uid": "uid-agent", "generation": 1},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
                "updateStrategy": update
            }
        }))
        .unwrap()
    }

    fn node(name: &str, labels: serde_json::Value, taints: serde_json::Value) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}))
                .unwrap(),
        )
    }

    fn revision(d: &DaemonSet) -> Arc<ControllerRevision> {
        revision_after(d, &[])
    }

    fn revision_after(d: &DaemonSet, prior: &[Arc<ControllerRevision>]) -> Arc<ControllerRevision> {
        let Update::New(r) = history::update_revision(d, prior, &d.spec.template, None, REVISION_HASH_LABEL) else {
            panic!()
        };
        Arc::new(*r)
    }

    /// A daemon pod of `d` at `hash`, scheduled on `node` and running (ready or not).
    fn daemon_pod(d: &DaemonSet, hash: &str, node: &str, name: &str, ready: bool, since: i64) -> Arc<Pod> {
        let mut p = new_pod(d, hash, node);
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(format!("uid-{name}"));
        make_running(&mut p, node, ready, since);
        Arc::new(p)
    }

    fn creates(p: &Plan) -> Vec<&str> {
        p.steps.iter().filter_map(|s| if let Step::CreatePod(n) = s { Some(n.as_str()) } else { None }).collect()
    }

    fn deletes(p: &Plan) -> Vec<(&str, &str)> {
        p.steps
            .iter()
            .filter_map(|s| if let Step::DeletePod(n, _, why) = s { Some((n.as_str(), *why)) } else { None })
            .collect()
    }

    #[test]
    fn one_pod_per_eligible_node_with_node_affinity_and_daemon_tolerations() {
        let mut d = ds(json!({"type": "RollingUpdate"}));
        d.spec.template.spec.as_mut().unwrap().node_selector = Some(lbl(&[("role", "worker")]));
        let nodes = vec![
            node("a", json!({"role": "worker"}), json!([])),
            node("b", json!({"role": "db"}), json!([])),
            node("c", json!({"role": "worker"}), json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])),
            node(
                "d",
                json!({"role": "worker"}),
                json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
                                                        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
            ),
        ];
        let revs = vec![revision(&d)];
        let p = plan(&d, &nodes, &[], &revs, true, now());
        assert_eq!(creates(&p), ["a", "d"]);
        assert_eq!(p.status.desired_number_scheduled, 2);
        let pod = new_pod(&d, &p.hash, "a");
        assert_eq!(target_node(&pod).as_deref(), Some("a"));
        let tols = pod.spec.as_ref().unwrap().tolerations.clone().unwrap();
        assert_eq!(tols.len(), 6);
        assert!(tols.iter().any(|t| t.key.as_deref() == Some("node.kubernetes.io/unreachable")
            && t.effect.as_deref() == Some("NoExecute")
            && t.operator.as_deref() == Some("Exists")));
        assert_eq!(labels(&pod.metadata)[REVISION_HASH_LABEL], p.hash);
        assert_eq!(p.hash, revs[0].metadata.labels.as_ref().unwrap()[REVISION_HASH_LABEL]);
        // A toleration in the template opens the tainted node.
        d.spec.template.spec.as_mut().unwrap().tolerations =
            Some(vec![serde_json::from_value(json!({"key": "dedicated", "operator": "Exists"})).unwrap()]);
        assert_eq!(creates(&plan(&d, &nodes, &[], &revs, true, now())), ["a", "c", "d"]);
    }

    #[test]
    fn taints_decide_whether_a_pod_may_stay() {
        let d = ds(json!({"type": "RollingUpdate"}));
        let no_schedule = node("a", json!({}), json!([{"key": "k", "effect": "NoSchedule"}]));
        let no_execute = node("b", json!({}), json!([{"key": "k", "effect": "NoExecute"}]));
        assert_eq!(should_run(&d, &no_schedule), (false, true));
        assert_eq!(should_run(&d, &no_execute), (false, false));
        let revs = vec![revision(&d)];
        let h = revs[0].metadata.labels.as_ref().unwrap()[REVISION_HASH_LABEL].clone();
        let pods = vec![daemon_pod(&d, &h, "a", "pa", true, 10), daemon_pod(&d, &h, "b", "pb", true, 10)];
        let p = plan(&d, &[no_schedule, no_execute], &pods, &revs, true, now());
        assert_eq!(deletes(&p), [("pb", "not eligible")]);
        assert_eq!(p.status.number_misscheduled, 2);
    }

    #[test]
    fn removed_nodes_lose_their_pods_and_extra_pods_go() {
        let d = ds(json!({"type": "RollingUpdate"}));
        let revs = vec![revision(&d)];
        let h = revs[0].metadata.labels.as_ref().unwrap()[REVISION_HASH_LABEL].clone();
        let pods = vec![
            daemon_pod(&d, &h, "a", "old", true, 10),
            daemon_pod(&d, &h, "a", "new", true, 20),
            daemon_pod(&d, &h, "gone", "g", true, 10),
        ];
        let p = plan(&d, &[node("a", json!({}), json!([]))], &pods, &revs, true, now());
        assert_eq!(deletes(&p), [("new", "excess"), ("g", "node gone")]);
        assert!(creates(&p).is_empty());
        assert_eq!(p.status.number_ready, 1);
        assert!(plan(&d, &[node("a", json!({}), json!([]))], &pods, &revs, false, now()).steps.is_empty());
    }

    #[test]
    fn rolling_update_stays_within_max_unavailable() {
        let old = ds(json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2, "maxSurge": 0}}));
        let old_rev = revision(&old);
        let oh = old_rev.metadata.labels.as_ref().unwrap()[REVISION_HASH_LABEL].clone();
        let nodes: Vec<Arc<Node>> = ["a", "b", "c", "d"].iter().map(|n| node(n, json!({}), json!([]))).collect();
        let pods: Vec<Arc<Pod>> =
            ["a", "b", "c", "d"].iter().map(|n| daemon_pod(&old, &oh, n, &format!("p{n}"), true, 10)).collect();
        let mut new = old.clone();
        new.spec.template = template(&[("app", "agent")], "busybox:2");
        new.metadata.generation = Some(2);
        let p = plan(&new, &nodes, &pods, std::slice::from_ref(&old_rev), true, now());
        assert!(matches!(p.steps[0], Step::CreateRevision(_)));
        assert_eq!(deletes(&p).len(), 2);
        assert_eq!(p.status.updated_number_scheduled, Some(0));
        // One node already has an unavailable new pod: only one more old pod goes.
        let mut pods2 = pods.clone();
        pods2[0] = daemon_pod(&new, &p.hash, "a", "na", false, 10);
        let revs = vec![old_rev.clone(), revision_after(&new, std::slice::from_ref(&old_rev))];
        let p2 = plan(&new, &nodes, &pods2, &revs, true, now());
        assert_eq!(deletes(&p2).len(), 1);
        assert_eq!(p2.status.updated_number_scheduled, Some(1));
        // OnDelete: never.
        let mut on_delete = new.clone();
        on_delete.spec.update_strategy = serde_json::from_value(json!({"type": "OnDelete"})).unwrap();
        assert!(deletes(&plan(&on_delete, &nodes, &pods, &revs, true, now())).is_empty());
    }

    #[test]
    fn rolling_update_with_surge_creates_first_then_deletes_the_old_pod() {
        let old = ds(json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}));
        let old_rev = revision(&old);
        let oh = old_rev.metadata.labels.as_ref().unwrap()[REVISION_HASH_LABEL].clone();
        let nodes: Vec<Arc<Node>> = ["a", "b"].iter().map(|n| node(n, json!({}), json!([]))).collect();
        let pods: Vec<Arc<Pod>> =
            ["a", "b"].iter().map(|n| daemon_pod(&old, &oh, n, &format!("p{n}"), true, 10)).collect();
        let mut new = old.clone();
        new.spec.template = template(&[("app", "agent")], "busybox:2");
        let revs = vec![old_rev.clone(), revision_after(&new, std::slice::from_ref(&old_rev))];
        let p = plan(&new, &nodes, &pods, &revs, true, now());
        assert_eq!(creates(&p), ["a"]);
        assert!(deletes(&p).is_empty());
        // The new pod on a is not available yet: wait.
        let mut pods2 = pods.clone();
        pods2.push(daemon_pod(&new, &p.hash, "a", "na", false, 20));
        let p2 = plan(&new, &nodes, &pods2, &revs, true, now());
        assert!(p2.steps.is_empty(), "{:?}", p2.steps);
        // Available: the old pod on a goes (manage keeps both until then).
        pods2[2] = daemon_pod(&new, &p.hash, "a", "na", true, 20);
        let p3 = plan(&new, &nodes, &pods2, &revs, true, now());
        assert_eq!(deletes(&p3), [("pa", "excess")]);
    }
}
