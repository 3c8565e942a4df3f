//! The Job controller (`pkg/controller/job`, batch/v1): runs pods until `completions`
//! succeed (or, with no completions, until one succeeds and none is active), at most
//! `parallelism` at a time; counts failures against `backoffLimit`; enforces
//! `activeDeadlineSeconds`; Indexed completion mode (one index per pod, the
//! `batch.kubernetes.io/job-completion-index` annotation/label and the
//! `JOB_COMPLETION_INDEX` variable, `status.completedIndexes`); Complete / Failed
//! conditions (with SuccessCriteriaMet / FailureTarget first, as Kubernetes 1.31+);
//! deletes finished Jobs after `ttlSecondsAfterFinished` (the TTL-after-finished
//! controller's job). Expectations as in the ReplicaSet controller.
//!
//! [`plan`] is the decision (pure); [`reconcile`] applies it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::events::{Recorder, NORMAL, WARNING};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
use k8s_openapi::api::core::v1::{EnvVar, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;

use crate::informer::{route_pods, trigger, Informer};
use crate::runner::{run_controller, Policy};
use crate::util::*;
use crate::Error;

pub const INDEX_KEY: &str = "batch.kubernetes.io/job-completion-index";

#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Pods to create: the completion index for Indexed jobs, else None.
    pub create: Vec<Option<i32>>,
    /// Active pods to delete (name, uid).
    pub delete: Vec<(String, String)>,
    pub status: JobStatus,
    /// (reason, message) when the Job finished in this sync.
    pub finished: Option<(String, String, bool)>,
    /// Delete the Job itself (TTL after finished).
    pub delete_job: bool,
    pub requeue: Option<Duration>,
}

fn finished_condition(job: &Job) -> Option<&JobCondition> {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"))
}

fn index_of(p: &Pod) -> Option<i32> {
    p.metadata.annotations.as_ref().and_then(|a| a.get(INDEX_KEY)).and_then(|v| v.parse().ok())
}

/// `0-2,4` style interval list.
pub fn format_indexes(set: &BTreeSet<i32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let v: Vec<i32> = set.iter().copied().collect();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if j == i { v[i].to_string() } else { format!("{}-{}", v[i], v[j]) });
        i = j + 1;
    }
    out.join(",")
}

fn cond(type_: &str, reason: &str, message: &str, now: Timestamp) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// The decision of one sync of `job` given the pods it owns.
pub fn plan(job: &Job, pods: &[Arc<Pod>], manage: bool, now: Timestamp) -> Plan {
    let mut plan = Plan::default();
    let spec = job.spec.clone().unwrap_or_default();
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let old = job.status.clone().unwrap_or_default();
    let owned: Vec<&Pod> =
        pods.iter().map(|p| p.as_ref()).filter(|p| controller_ref(&p.metadata).is_some_and(|r| r.uid == uid)).collect();
    let active: Vec<&Pod> = owned.iter().copied().filter(|p| is_pod_active(p)).collect();
    let succeeded: Vec<&Pod> = owned.iter().copied().filter(|p| pod_phase(p) == "Succeeded").collect();
    // Counts never go down (Kubernetes tracks them with pod finalizers; here the
    // status is the record once a finished pod is gone).
    let failed = (owned.iter().filter(|p| pod_phase(p) == "Failed").count() as i32).max(old.failed.unwrap_or(0));
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let completed_indexes: BTreeSet<i32> = succeeded.iter().filter_map(|p| index_of(p)).collect();
    let n_succeeded =
        if indexed { completed_indexes.len() as i32 } else { succeeded.len() as i32 }.max(old.succeeded.unwrap_or(0));
    let start = old.start_time.clone().unwrap_or(Time(now));
    plan.status = JobStatus {
        active: Some(active.len() as i32),
        succeeded: Some(n_succeeded),
        failed: Some(failed),
        ready: Some(active.iter().filter(|p| is_pod_ready(p)).count() as i32),
        terminating: Some(
            owned.iter().filter(|p| is_deleting(&p.metadata) && !matches!(pod_phase(p), "Succeeded" | "Failed")).count()
                as i32,
        ),
        start_time: Some(start.clone()),
        completion_time: old.completion_time.clone(),
        conditions: old.conditions.clone(),
        completed_indexes: if indexed { Some(format_indexes(&completed_indexes)) } else { None },
        ..Default::default()
    };

    // Finished: only the TTL remains.
    if let Some(c) = finished_condition(job) {
        if let Some(ttl) = spec.ttl_seconds_after_finished {
            let at = c.last_transition_time.as_ref().map(|t| t.0).unwrap_or(now);
            let expires = at.checked_add(SignedDuration::from_secs(ttl as i64)).unwrap_or(now);
            if expires <= now {
                plan.delete_job = true;
            } else {
                plan.requeue = Some(Duration::from_millis(expires.duration_since(now).as_millis().max(0) as u64 + 100));
            }
        }
        plan.status.active = Some(active.len() as i32);
        return plan;
    }
    if spec.suspend == Some(true) {
        plan.delete = active
            .iter()
            .map(|p| (p.metadata.name.clone().unwrap_or_default(), p.metadata.uid.clone().unwrap_or_default()))
            .collect();
        return plan;
    }
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    let deadline_exceeded = spec
        .active_deadline_seconds
        .is_some_and(|s| start.0.checked_add(SignedDuration::from_secs(s)).is_ok_and(|end| end <= now));
    let mut conds = old.conditions.clone().unwrap_or_default();
    let fail = if failed > backoff_limit {
        Some(("BackoffLimitExceeded", "Job has reached the specified backoff limit"))
    } else if deadline_exceeded {
        Some(("DeadlineExceeded", "Job was active longer than specified deadline"))
    } else {
        None
    };
    if let Some((reason, message)) = fail {
        plan.delete = active
            .iter()
            .map(|p| (p.metadata.name.clone().unwrap_or_default(), p.metadata.uid.clone().unwrap_or_default()))
            .collect();
        conds.push(cond("FailureTarget", reason, message, now));
        conds.push(cond("Failed", reason, message, now));
        plan.status.conditions = Some(conds);
        plan.finished = Some((reason.into(), message.into(), false));
        return plan;
    }
    let parallelism = spec.parallelism.unwrap_or(1).max(0);
    let complete = match spec.completions {
        Some(c) => n_succeeded >= c,
        None => n_succeeded > 0 && active.is_empty(),
    };
    if complete {
        conds.push(cond("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods", now));
        conds.push(cond("Complete", "CompletionsReached", "Reached expected number of succeeded pods", now));
        plan.status.conditions = Some(conds);
        plan.status.completion_time = Some(Time(now));
        plan.finished = Some(("Completed".into(), "Job completed".into(), true));
        if let Some(ttl) = spec.ttl_seconds_after_finished {
            plan.requeue = Some(Duration::from_secs(ttl.max(0) as u64) + Duration::from_millis(100));
        }
        return plan;
    }
    if let Some(s) = spec.active_deadline_seconds {
        if let Ok(end) = start.0.checked_add(SignedDuration::from_secs(s)) {
            plan.requeue = Some(Duration::from_millis(end.duration_since(now).as_millis().max(0) as u64 + 100));
        }
    }
    if !manage {
        return plan;
    }
    let want_active = match spec.completions {
        Some(c) => parallelism.min(c - n_succeeded),
        None if n_succeeded > 0 => 0,
        None => parallelism,
    }
    .max(0) as usize;
    if indexed {
        let completions = spec.completions.unwrap_or(1);
        let active_idx: BTreeSet<i32> = active.iter().filter_map(|p| index_of(p)).collect();
        let free: Vec<i32> =
            (0..completions).filter(|i| !completed_indexes.contains(i) && !active_idx.contains(i)).collect();
        let room = want_active.saturating_sub(active.len());
        plan.create = free.into_iter().take(room).map(Some).collect();
    } else if active.len() < want_active {
        plan.create = vec![None; want_active - active.len()];
    } else if active.len() > want_active {
        let mut ranked = active.clone();
        ranked.sort_by_key(|p| (is_pod_ready(p), std::cmp::Reverse(creation(&p.metadata))));
        plan.delete = ranked
            .iter()
            .take(active.len() - want_active)
            .map(|p| (p.metadata.name.clone().unwrap_or_default(), p.metadata.uid.clone().unwrap_or_default()))
            .collect();
    }
    plan
}

pub struct Ctx {
    client: kube::Client,
    pods: Informer<Pod>,
    expectations: Expectations,
    recorder: Recorder,
}

fn job_pod(job: &Job, index: Option<i32>) -> Pod {
    let name = job.metadata.name.clone().unwrap_or_default();
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let template = job.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    let prefix = match index {
        Some(i) => format!("{name}-{i}"),
        None => name.clone(),
    };
    let mut p = pod_from_template(&template, &ns, &prefix, owner_ref(job));
    p.metadata.name = Some(format!("{prefix}-{}", apimachinery::names::random_suffix()));
    p.metadata.generate_name = None;
    if let Some(i) = index {
        p.metadata.annotations.get_or_insert_with(Default::default).insert(INDEX_KEY.into(), i.to_string());
        p.metadata.labels.get_or_insert_with(Default::default).insert(INDEX_KEY.into(), i.to_string());
        for c in p.spec.iter_mut().flat_map(|s| s.containers.iter_mut()) {
            c.env.get_or_insert_with(Vec::new).push(EnvVar {
                name: "JOB_COMPLETION_INDEX".into(),
                value: Some(i.to_string()),
                value_from: None,
            });
        }
    }
    p
}

pub async fn reconcile(job: Arc<Job>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    if is_deleting(&job.metadata) {
        return Ok(Action::await_change());
    }
    let key = key(&job.metadata);
    let pods: Vec<Arc<Pod>> =
        ctx.pods.state().into_iter().filter(|p| p.metadata.namespace.as_deref() == Some(&ns)).collect();
    let manage = ctx.expectations.satisfied(&key);
    let plan = plan(&job, &pods, manage, Timestamp::now());
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    if plan.delete_job {
        match jobs.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Action::await_change());
    }
    let pod_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    if !plan.create.is_empty() {
        let new: Vec<Pod> = plan.create.iter().map(|i| job_pod(&job, *i)).collect();
        ctx.expectations.expect(&key, new.iter().filter_map(|p| p.metadata.name.clone()), []);
        let pp = PostParams::default();
        let results = futures::future::join_all(new.iter().map(|p| pod_api.create(&pp, p))).await;
        for (p, r) in new.iter().zip(results) {
            let pname = p.metadata.name.clone().unwrap_or_default();
            match r {
                Ok(_) => ctx.recorder.event(job.as_ref(), NORMAL, "SuccessfulCreate", format!("Created pod: {pname}")),
                Err(e) => {
                    ctx.expectations.lower(&key, Some(&pname), None);
                    ctx.recorder.event(job.as_ref(), WARNING, "FailedCreate", format!("Error creating: {e}"));
                }
            }
        }
    }
    if !plan.delete.is_empty() {
        ctx.expectations.expect(&key, [], plan.delete.iter().map(|(_, u)| u.clone()));
        for (n, u) in &plan.delete {
            match pod_api.delete(n, &DeleteParams::background()).await {
                Ok(_) => ctx.recorder.event(job.as_ref(), NORMAL, "SuccessfulDelete", format!("Deleted pod: {n}")),
                Err(_) => ctx.expectations.lower(&key, None, Some(u)),
            }
        }
    }
    if let Some((reason, message, ok)) = &plan.finished {
        ctx.recorder.event(job.as_ref(), if *ok { NORMAL } else { WARNING }, reason, message.clone());
    }
    let old = serde_json::to_value(job.status.clone().unwrap_or_default()).unwrap_or_default();
    let new = serde_json::to_value(&plan.status).unwrap_or_default();
    if old != new {
        match jobs.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": plan.status}))).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if !manage {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    Ok(Action::requeue(plan.requeue.unwrap_or(Duration::from_secs(300))))
}

pub async fn run(client: kube::Client, pods: Informer<Pod>, recorder: Recorder) {
    let ctx =
        Arc::new(Ctx { client: client.clone(), pods: pods.clone(), expectations: Expectations::default(), recorder });
    let (tx, triggers) = trigger::<Job>();
    let controller = Controller::new(Api::<Job>::all(client), watcher::Config::default()).reconcile_on(triggers);
    route_pods::<Job, _>(&pods, "Job", ctx.clone(), |c| &c.expectations, None, tx);
    pods.synced().await;
    run_controller(controller, reconcile, ctx, Policy { metric: "job", what: "job", retry: Duration::from_secs(1) })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use k8s_openapi::api::batch::v1::JobSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn job(completions: Option<i32>, parallelism: i32) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some("j".into()),
                namespace: Some("default".into()),
                uid: Some("uid-j".into()),
                ..Default::default()
            },
            spec: Some(JobSpec {
                completions,
                parallelism: Some(parallelism),
                template: template(&[("job-name", "j")], "busybox"),
                ..Default::default()
            }),
            status: Some(JobStatus { start_time: Some(Time(at(900))), ..Default::default() }),
        }
    }

    fn jp(j: &Job, name: &str, phase: &str) -> Arc<Pod> {
        let mut p = pod(name, &[("job-name", "j")], Some(j));
        set_phase(&mut p, phase);
        Arc::new(p)
    }

    #[test]
    fn runs_parallelism_until_completions() {
        let j = job(Some(5), 2);
        assert_eq!(plan(&j, &[], true, now()).create.len(), 2);
        let pods = vec![
            jp(&j, "a", "Succeeded"),
            jp(&j, "b", "Succeeded"),
            jp(&j, "c", "Succeeded"),
            jp(&j, "d", "Succeeded"),
            jp(&j, "e", "Running"),
        ];
        let p = plan(&j, &pods, true, now());
        assert!(p.create.is_empty(), "only 1 left to complete and 1 active");
        let pods = vec![
            jp(&j, "a", "Succeeded"),
            jp(&j, "b", "Succeeded"),
            jp(&j, "c", "Succeeded"),
            jp(&j, "d", "Succeeded"),
            jp(&j, "e", "Succeeded"),
        ];
        let p = plan(&j, &pods, true, now());
        let conds = p.status.conditions.unwrap();
        assert!(conds.iter().any(|c| c.type_ == "Complete" && c.status == "True"));
        assert_eq!(p.status.succeeded, Some(5));
        assert!(p.status.completion_time.is_some());
    }

    #[test]
    fn backoff_limit_fails_the_job() {
        let mut j = job(Some(1), 1);
        j.spec.as_mut().unwrap().backoff_limit = Some(1);
        let pods = vec![jp(&j, "a", "Failed"), jp(&j, "b", "Failed"), jp(&j, "c", "Running")];
        let p = plan(&j, &pods, true, now());
        assert_eq!(p.delete.len(), 1);
        let c = p.status.conditions.unwrap();
        assert!(c.iter().any(|c| c.type_ == "Failed" && c.reason.as_deref() == Some("BackoffLimitExceeded")));
        // One failure within the limit: replaced.
        let p = plan(&j, &[jp(&j, "a", "Failed")], true, now());
        assert_eq!(p.create.len(), 1);
        assert_eq!(p.status.failed, Some(1));
    }

    #[test]
    fn active_deadline() {
        let mut j = job(Some(1), 1);
        j.spec.as_mut().unwrap().active_deadline_seconds = Some(50);
        let p = plan(&j, &[jp(&j, "a", "Running")], true, now());
        assert!(p.status.conditions.unwrap().iter().any(|c| c.reason.as_deref() == Some("DeadlineExceeded")));
    }

    #[test]
    fn indexed_completion() {
        let mut j = job(Some(4), 2);
        j.spec.as_mut().unwrap().completion_mode = Some("Indexed".into());
        assert_eq!(plan(&j, &[], true, now()).create, vec![Some(0), Some(1)]);
        let mut done = (*jp(&j, "a", "Succeeded")).clone();
        done.metadata.annotations = Some(lbl(&[(INDEX_KEY, "0")]));
        let mut running = (*jp(&j, "b", "Running")).clone();
        running.metadata.annotations = Some(lbl(&[(INDEX_KEY, "1")]));
        let p = plan(&j, &[Arc::new(done), Arc::new(running)], true, now());
        assert_eq!(p.create, vec![Some(2)]);
        assert_eq!(p.status.completed_indexes.as_deref(), Some("0"));
        let pod = job_pod(&j, Some(3));
        assert_eq!(pod.metadata.annotations.unwrap()[INDEX_KEY], "3");
        assert_eq!(format_indexes(&[0, 1, 2, 4, 6, 7].into_iter().collect()), "0-2,4,6-7");
    }

    #[test]
    fn ttl_after_finished_deletes_the_job() {
        let mut j = job(Some(1), 1);
        j.spec.as_mut().unwrap().ttl_seconds_after_finished = Some(10);
        j.status.as_mut().unwrap().conditions = Some(vec![cond("Complete", "CompletionsReached", "x", at(995))]);
        assert!(!plan(&j, &[], true, now()).delete_job);
        j.status.as_mut().unwrap().conditions = Some(vec![cond("Complete", "CompletionsReached", "x", at(900))]);
        assert!(plan(&j, &[], true, now()).delete_job);
    }
}
