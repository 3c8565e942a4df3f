//! The ReplicaSet controller (`pkg/controller/replicaset`): keeps `spec.replicas` active
//! pods matching the selector. It adopts matching orphans and releases owned pods that
//! stop matching (ownerReferences with `controller: true`), replaces failed pods,
//! deletes not-ready / unscheduled / newest pods first, creates in slow-start batches
//! (1, 2, 4, …; at most 500 per sync), and uses expectations so it never creates twice
//! while its pod cache catches up. Status: replicas, fullyLabeledReplicas,
//! readyReplicas, availableReplicas (minReadySeconds), observedGeneration.
//!
//! [`plan`] is the decision, a pure function of the ReplicaSet and the pods in its
//! namespace; [`reconcile`] applies it.

use std::cmp::Reverse;
use std::sync::Arc;
use std::time::Duration;

use apimachinery::labels::selector_or_nothing;
use common::events::{Recorder, NORMAL, WARNING};
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;

use crate::informer::{route_pods, trigger, Informer};
use crate::runner::{run_controller, Policy};
use crate::util::*;
use crate::Error;

/// `BurstReplicas`: the most pods one sync creates or deletes.
pub const BURST_REPLICAS: usize = 500;
/// `SlowStartInitialBatchSize`.
pub const SLOW_START_INITIAL_BATCH: usize = 1;

/// What one sync of a ReplicaSet should do.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Orphan pods to adopt (names).
    pub adopt: Vec<String>,
    /// Owned pods that no longer match, to release (names).
    pub release: Vec<String>,
    /// Pods to create.
    pub create: usize,
    /// Pods to delete: (name, uid), in order of preference.
    pub delete: Vec<(String, String)>,
    pub status: ReplicaSetStatus,
    /// Sync again after this long (a ready pod becomes available).
    pub requeue: Option<Duration>,
}

/// The decision of one sync. `manage` is false while expectations are outstanding:
/// then only status and ownership are computed.
pub fn plan(rs: &ReplicaSet, pods: &[Arc<Pod>], manage: bool, now: Timestamp) -> Plan {
    let mut plan = Plan::default();
    let spec = rs.spec.clone();
    let uid = rs.metadata.uid.as_deref().unwrap_or_default();
    let ns = rs.metadata.namespace.as_deref().unwrap_or_default();
    let rs_deleting = is_deleting(&rs.metadata);
    let selector = selector_or_nothing(Some(&spec.selector));
    let mut owned: Vec<&Pod> = Vec::new();
    for p in pods.iter().map(|p| p.as_ref()) {
        if p.metadata.namespace.as_deref() != Some(ns) {
            continue;
        }
        let lbls = labels(&p.metadata);
        let matches = selector.matches(&lbls);
        match controller_ref(&p.metadata) {
            Some(r) if r.uid == uid => {
                if matches || rs_deleting {
                    owned.push(p);
                } else if !is_deleting(&p.metadata) {
                    plan.release.push(p.metadata.name.clone().unwrap_or_default());
                }
            }
            Some(_) => {}
            None => {
                if matches && !rs_deleting && !is_deleting(&p.metadata) && is_pod_active(p) {
                    plan.adopt.push(p.metadata.name.clone().unwrap_or_default());
                    owned.push(p);
                }
            }
        }
    }
    let active: Vec<&Pod> = owned.iter().copied().filter(|p| is_pod_active(p)).collect();
    let want = spec.replicas.unwrap_or(1).max(0) as usize;
    if manage && !rs_deleting {
        if active.len() < want {
            plan.create = (want - active.len()).min(BURST_REPLICAS);
        } else if active.len() > want {
            let n = (active.len() - want).min(BURST_REPLICAS);
            let mut ranked = active.clone();
            ranked.sort_by_key(|p| deletion_rank(p));
            plan.delete = ranked
                .iter()
                .take(n)
                .map(|p| (p.metadata.name.clone().unwrap_or_default(), p.metadata.uid.clone().unwrap_or_default()))
                .collect();
        }
    }
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let template_labels =
        spec.template.as_ref().and_then(|t| t.metadata.as_ref()).and_then(|m| m.labels.clone()).unwrap_or_default();
    let fully =
        active.iter().filter(|p| template_labels.iter().all(|(k, v)| labels(&p.metadata).get(k) == Some(v))).count();
    let ready = active.iter().filter(|p| is_pod_ready(p)).count();
    let available = active.iter().filter(|p| is_pod_available(p, min_ready, now)).count();
    let terminating =
        owned.iter().filter(|p| is_deleting(&p.metadata) && !matches!(pod_phase(p), "Succeeded" | "Failed")).count();
    plan.requeue = active.iter().filter_map(|p| becomes_available_in(p, min_ready, now)).min();
    let old = rs.status.clone().unwrap_or_default();
    plan.status = ReplicaSetStatus {
        replicas: active.len() as i32,
        fully_labeled_replicas: Some(fully as i32),
        ready_replicas: Some(ready as i32),
        available_replicas: Some(available as i32),
        terminating_replicas: Some(terminating as i32),
        observed_generation: rs.metadata.generation,
        conditions: old.conditions.filter(|c| !c.is_empty()),
    };
    plan
}

/// `controller.ActivePods` order: the pods to delete first sort first — unscheduled
/// before scheduled, Pending before Unknown before Running, not ready before ready,
/// ready for less time before more, more restarts before fewer, newer before older.
fn deletion_rank(p: &Pod) -> (u8, u8, u8, Reverse<Timestamp>, Reverse<i32>, Reverse<Timestamp>) {
    let assigned = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let phase = match pod_phase(p) {
        "Pending" => 0,
        "Unknown" => 1,
        _ => 2,
    };
    let (ready, since) = pod_ready(p);
    let restarts = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).max().unwrap_or(0))
        .unwrap_or(0);
    (
        assigned as u8,
        phase,
        ready as u8,
        Reverse(since.unwrap_or(Timestamp::UNIX_EPOCH)),
        Reverse(restarts),
        Reverse(creation(&p.metadata)),
    )
}

/// Does the status differ in anything but conditions' timestamps?
fn status_changed(old: Option<&ReplicaSetStatus>, new: &ReplicaSetStatus) -> bool {
    let old = old.cloned().unwrap_or_default();
    old.replicas != new.replicas
        || old.fully_labeled_replicas.unwrap_or(0) != new.fully_labeled_replicas.unwrap_or(0)
        || old.ready_replicas.unwrap_or(0) != new.ready_replicas.unwrap_or(0)
        || old.available_replicas.unwrap_or(0) != new.available_replicas.unwrap_or(0)
        || old.terminating_replicas.unwrap_or(0) != new.terminating_replicas.unwrap_or(0)
        || old.observed_generation != new.observed_generation
        || old.conditions != new.conditions
}

pub struct Ctx {
    pub client: kube::Client,
    pub pods: Informer<Pod>,
    pub expectations: Expectations,
    pub recorder: Recorder,
}

pub async fn reconcile(rs: Arc<ReplicaSet>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = rs.metadata.namespace.clone().unwrap_or_default();
    let name = rs.metadata.name.clone().unwrap_or_default();
    let key = key(&rs.metadata);
    let pods: Vec<Arc<Pod>> =
        ctx.pods.state().into_iter().filter(|p| p.metadata.namespace.as_deref() == Some(&ns)).collect();
    let manage = ctx.expectations.satisfied(&key);
    let mut plan = plan(&rs, &pods, manage, Timestamp::now());
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let me = owner_ref(rs.as_ref());

    for p in &plan.adopt {
        let Some(pod) = pods.iter().find(|x| x.metadata.name.as_deref() == Some(p)) else { continue };
        let mut refs: Vec<OwnerReference> = pod.metadata.owner_references.clone().unwrap_or_default();
        refs.push(me.clone());
        let patch = json!({"metadata": {"ownerReferences": refs, "uid": pod.metadata.uid}});
        if let Err(e) = pod_api.patch(p, &PatchParams::default(), &Patch::Merge(&patch)).await {
            tracing::warn!(pod = %p, error = %e, "adopting pod");
        }
    }
    for p in &plan.release {
        let Some(pod) = pods.iter().find(|x| x.metadata.name.as_deref() == Some(p)) else { continue };
        let refs: Vec<OwnerReference> = pod
            .metadata
            .owner_references
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| Some(&r.uid) != rs.metadata.uid.as_ref())
            .collect();
        let patch = json!({"metadata": {"ownerReferences": refs, "uid": pod.metadata.uid}});
        if let Err(e) = pod_api.patch(p, &PatchParams::default(), &Patch::Merge(&patch)).await {
            tracing::warn!(pod = %p, error = %e, "releasing pod");
        }
    }

    let mut failure: Option<String> = None;
    if plan.create > 0 {
        let template = rs.spec.template.clone().unwrap_or_default();
        // Slow start: batches of 1, 2, 4, … stopping at the first failure.
        let mut remaining = plan.create;
        let mut batch = SLOW_START_INITIAL_BATCH.min(remaining);
        while batch > 0 {
            let pods: Vec<Pod> = (0..batch)
                .map(|_| {
                    let mut p = pod_from_template(&template, &ns, &name, me.clone());
                    p.metadata.name = Some(format!("{name}-{}", apimachinery::names::random_suffix()));
                    p.metadata.generate_name = None;
                    p
                })
                .collect();
            ctx.expectations.expect(&key, pods.iter().filter_map(|p| p.metadata.name.clone()), []);
            let pp = PostParams::default();
            let results = futures::future::join_all(pods.iter().map(|p| pod_api.create(&pp, p))).await;
            let mut ok = 0;
            for (p, r) in pods.iter().zip(results) {
                let pname = p.metadata.name.clone().unwrap_or_default();
                match r {
                    Ok(_) => {
                        ok += 1;
                        ctx.recorder.event(rs.as_ref(), NORMAL, "SuccessfulCreate", format!("Created pod: {pname}"));
                    }
                    Err(e) => {
                        ctx.expectations.lower(&key, Some(&pname), None);
                        ctx.recorder.event(rs.as_ref(), WARNING, "FailedCreate", format!("Error creating: {e}"));
                        failure = Some(e.to_string());
                    }
                }
            }
            remaining -= batch;
            if ok < batch {
                // Forget what was never sent.
                break;
            }
            batch = (batch * 2).min(remaining);
        }
    }
    if !plan.delete.is_empty() {
        ctx.expectations.expect(&key, [], plan.delete.iter().map(|(_, u)| u.clone()));
        let results = futures::future::join_all(plan.delete.iter().map(|(n, u)| {
            let dp = DeleteParams {
                preconditions: Some(Preconditions { uid: Some(u.clone()), resource_version: None }),
                ..Default::default()
            };
            let api = pod_api.clone();
            async move { api.delete(n, &dp).await }
        }))
        .await;
        for ((n, u), r) in plan.delete.iter().zip(results) {
            match r {
                Ok(_) => ctx.recorder.event(rs.as_ref(), NORMAL, "SuccessfulDelete", format!("Deleted pod: {n}")),
                Err(kube::Error::Api(e)) if e.code == 404 => ctx.expectations.lower(&key, None, Some(u)),
                Err(e) => {
                    ctx.expectations.lower(&key, None, Some(u));
                    ctx.recorder.event(rs.as_ref(), WARNING, "FailedDelete", format!("Error deleting: {e}"));
                    failure = Some(e.to_string());
                }
            }
        }
    }

    let mut conds: Vec<ReplicaSetCondition> = plan
        .status
        .conditions
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_.as_deref() != Some("ReplicaFailure"))
        .collect();
    if let Some(msg) = &failure {
        conds.push(ReplicaSetCondition {
            type_: Some("ReplicaFailure".into()),
            status: Some("True".into()),
            reason: Some(if plan.create > 0 { "FailedCreate" } else { "FailedDelete" }.into()),
            message: Some(msg.clone()),
            last_transition_time: Some(Time(Timestamp::now())),
        });
    }
    plan.status.conditions = (!conds.is_empty()).then_some(conds);
    if status_changed(rs.status.as_ref(), &plan.status) {
        let api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = json!({"status": plan.status});
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if failure.is_some() {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    if !manage {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    Ok(plan.requeue.map(Action::requeue).unwrap_or_else(|| Action::requeue(Duration::from_secs(300))))
}

/// Run the controller until `shutdown`.
pub async fn run(client: kube::Client, pods: Informer<Pod>, recorder: Recorder, workers: u16) {
    let ctx =
        Arc::new(Ctx { client: client.clone(), pods: pods.clone(), expectations: Expectations::default(), recorder });
    let (tx, triggers) = trigger::<ReplicaSet>();
    let controller = Controller::new(Api::<ReplicaSet>::all(client), watcher::Config::default())
        .with_config(kube::runtime::controller::Config::default().concurrency(workers))
        .reconcile_on(triggers);
    let selector: fn(&ReplicaSet) -> &LabelSelector = |rs| &rs.spec.selector;
    route_pods(&pods, "ReplicaSet", ctx.clone(), |c| &c.expectations, Some((controller.store(), selector)), tx);
    pods.synced().await;
    let policy = Policy { metric: "replicaset", what: "replicaset", retry: Duration::from_secs(1) };
    run_controller(controller, reconcile, ctx, policy).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn creates_missing_replicas() {
        let rs = rs("web", 3, &[("app", "web")]);
        let p = plan(&rs, &[Arc::new(pod("web-a", &[("app", "web")], Some(&rs)))], true, now());
        assert_eq!(p.create, 2);
        assert!(p.delete.is_empty());
        assert_eq!(p.status.replicas, 1);
    }

    #[test]
    fn no_creates_while_expectations_outstanding() {
        let rs = rs("web", 3, &[("app", "web")]);
        assert_eq!(plan(&rs, &[], false, now()).create, 0);
    }

    #[test]
    fn adopts_matching_orphans_and_releases_non_matching() {
        let rs = rs("web", 2, &[("app", "web")]);
        let orphan = pod::<ReplicaSet>("o", &[("app", "web")], None);
        let mut stray = pod("s", &[("app", "other")], Some(&rs));
        stray.metadata.name = Some("s".into());
        let other = pod("x", &[("app", "web")], Some(&super::tests::rs_uid("other", "uid-2")));
        let p = plan(&rs, &[Arc::new(orphan), Arc::new(stray), Arc::new(other)], true, now());
        assert_eq!(p.adopt, vec!["o".to_string()]);
        assert_eq!(p.release, vec!["s".to_string()]);
        assert_eq!(p.create, 1);
    }

    fn rs_uid(name: &str, uid: &str) -> ReplicaSet {
        let mut r = rs(name, 1, &[("app", "web")]);
        r.metadata.uid = Some(uid.into());
        r
    }

    #[test]
    fn failed_pods_are_replaced() {
        let rs = rs("web", 1, &[("app", "web")]);
        let mut failed = pod("f", &[("app", "web")], Some(&rs));
        set_phase(&mut failed, "Failed");
        let p = plan(&rs, &[Arc::new(failed)], true, now());
        assert_eq!(p.create, 1);
        assert_eq!(p.status.replicas, 0);
    }

    #[test]
    fn deletes_unscheduled_then_not_ready_then_newest() {
        let rs = rs("web", 1, &[("app", "web")]);
        let mut old_ready = pod("old-ready", &[("app", "web")], Some(&rs));
        make_running(&mut old_ready, "n1", true, 100);
        let mut new_ready = pod("new-ready", &[("app", "web")], Some(&rs));
        make_running(&mut new_ready, "n1", true, 200);
        let mut not_ready = pod("not-ready", &[("app", "web")], Some(&rs));
        make_running(&mut not_ready, "n1", false, 50);
        let unscheduled = pod("unscheduled", &[("app", "web")], Some(&rs));
        let pods: Vec<Arc<Pod>> = [old_ready, new_ready, not_ready, unscheduled].into_iter().map(Arc::new).collect();
        let p = plan(&rs, &pods, true, now());
        let names: Vec<&str> = p.delete.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["unscheduled", "not-ready", "new-ready"]);
    }

    #[test]
    fn available_honours_min_ready_seconds() {
        let mut rs = rs("web", 2, &[("app", "web")]);
        rs.spec.min_ready_seconds = Some(10);
        let mut a = pod("a", &[("app", "web")], Some(&rs));
        make_running(&mut a, "n1", true, 0); // ready since t=0, now = 1000
        let mut b = pod("b", &[("app", "web")], Some(&rs));
        make_running(&mut b, "n1", true, 995);
        let p = plan(&rs, &[Arc::new(a), Arc::new(b)], true, now());
        assert_eq!(p.status.ready_replicas, Some(2));
        assert_eq!(p.status.available_replicas, Some(1));
        assert_eq!(p.status.observed_generation, Some(1));
        assert!(p.requeue.is_some_and(|d| d <= Duration::from_secs(6)));
    }

    #[test]
    fn deleting_pods_do_not_count() {
        let rs = rs("web", 1, &[("app", "web")]);
        let mut gone = pod("g", &[("app", "web")], Some(&rs));
        gone.metadata.deletion_timestamp = Some(Time(now()));
        let p = plan(&rs, &[Arc::new(gone)], true, now());
        assert_eq!(p.create, 1);
        assert_eq!(p.status.terminating_replicas, Some(1));
    }
}
