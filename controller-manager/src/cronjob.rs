//! The CronJob controller (`pkg/controller/cronjob`, batch/v1): creates a Job named
//! `<cronjob>-<scheduled time in minutes>` at each time of the standard 5-field cron
//! `schedule` (UTC; `@hourly`-style macros too), honouring `suspend`,
//! `startingDeadlineSeconds`, `concurrencyPolicy` (Allow / Forbid / Replace) and the
//! successful/failed history limits; status `active`, `lastScheduleTime`,
//! `lastSuccessfulTime`.
//!
//! [`Schedule`] (parse / next) and [`plan`] are the decisions (pure).

use std::sync::Arc;
use std::time::Duration;

use common::events::{Recorder, NORMAL, WARNING};
use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{tz::TimeZone, SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;

use crate::informer::{trigger, Informer};
use crate::runner::{run_controller, Policy};
use crate::util::*;
use crate::Error;

/// A parsed cron schedule (bit sets per field, as robfig/cron keeps them).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    minute: u64,
    hour: u64,
    dom: u64,
    month: u64,
    dow: u64,
    dom_star: bool,
    dow_star: bool,
}

fn field(s: &str, min: u32, max: u32, names: &[&str]) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    let star = s.starts_with('*') || s.starts_with('?');
    for part in s.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, st)) => (r, st.parse::<u32>().map_err(|_| format!("invalid step {st:?}"))?),
            None => (part, 1),
        };
        if step == 0 {
            return Err("step must be positive".into());
        }
        let value = |v: &str| -> Result<u32, String> {
            if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(v)) {
                return Ok(i as u32 + min);
            }
            v.parse::<u32>().map_err(|_| format!("invalid value {v:?}"))
        };
        let (lo, hi) = if range == "*" || range == "?" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a)?, value(b)?)
        } else {
            let v = value(range)?;
            (v, if part.contains('/') { max } else { v })
        };
        // Day of week 7 is Sunday.
        let (lo, hi) = if max == 6 && hi == 7 { (lo, 7) } else { (lo, hi) };
        if lo < min || hi > max.max(if max == 6 { 7 } else { max }) || lo > hi {
            return Err(format!("value out of range in {part:?}"));
        }
        let mut v = lo;
        while v <= hi {
            bits |= 1 << (if max == 6 && v == 7 { 0 } else { v });
            v += step;
        }
    }
    Ok((bits, star))
}

impl Schedule {
    pub fn parse(s: &str) -> Result<Schedule, String> {
        let s = s.trim();
        let s = match s {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other => other,
        };
        if s.starts_with("TZ=") || s.starts_with("CRON_TZ=") {
            return Err("time zones in the schedule are not supported; use spec.timeZone".into());
        }
        let f: Vec<&str> = s.split_whitespace().collect();
        if f.len() != 5 {
            return Err(format!("expected exactly 5 fields, found {}: {s:?}", f.len()));
        }
        let months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
        let days = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
        let (minute, _) = field(f[0], 0, 59, &[])?;
        let (hour, _) = field(f[1], 0, 23, &[])?;
        let (dom, dom_star) = field(f[2], 1, 31, &[])?;
        let (month, _) = field(f[3], 1, 12, &months)?;
        let (dow, dow_star) = field(f[4], 0, 6, &days)?;
        Ok(Schedule { minute, hour, dom, month, dow, dom_star, dow_star })
    }

    fn day_matches(&self, dom: u32, dow: u32) -> bool {
        let a = self.dom & (1 << dom) != 0;
        let b = self.dow & (1 << dow) != 0;
        if self.dom_star || self.dow_star {
            a && b
        } else {
            a || b
        }
    }

    /// The first schedule time strictly after `t` (UTC), within five years.
    pub fn next(&self, t: Timestamp) -> Option<Timestamp> {
        let start = t.checked_add(SignedDuration::from_secs(60 - t.as_second().rem_euclid(60))).ok()?;
        let mut z = start.to_zoned(TimeZone::UTC);
        let end = t.checked_add(SignedDuration::from_hours(24 * 366 * 5)).ok()?;
        while z.timestamp() <= end {
            let (month, day, dow, hour, minute) = (
                z.month() as u32,
                z.day() as u32,
                z.weekday().to_sunday_zero_offset() as u32,
                z.hour() as u32,
                z.minute() as u32,
            );
            if self.month & (1 << month) == 0 || !self.day_matches(day, dow) {
                // Next day at 00:00.
                let next = z.date().tomorrow().ok()?.to_zoned(TimeZone::UTC).ok()?;
                z = next;
                continue;
            }
            if self.hour & (1 << hour) == 0 {
                z = z.checked_add(SignedDuration::from_mins(60 - minute as i64)).ok()?;
                continue;
            }
            if self.minute & (1 << minute) == 0 {
                z = z.checked_add(SignedDuration::from_mins(1)).ok()?;
                continue;
            }
            return Some(z.timestamp());
        }
        None
    }
}

#[derive(Debug, Default)]
pub struct Plan {
    /// Create a Job for this scheduled time.
    pub create: Option<(Job, Timestamp)>,
    /// Jobs to delete (name), with the reason (history limit or Replace).
    pub delete: Vec<String>,
    pub status: CronJobStatus,
    /// (type, reason, message) events.
    pub events: Vec<(&'static str, &'static str, String)>,
    pub requeue: Option<Duration>,
}

fn job_finished(j: &Job) -> Option<&'static str> {
    let conds = j.status.as_ref().and_then(|s| s.conditions.as_ref())?;
    if conds.iter().any(|c| c.type_ == "Complete" && c.status == "True") {
        Some("Complete")
    } else if conds.iter().any(|c| c.type_ == "Failed" && c.status == "True") {
        Some("Failed")
    } else {
        None
    }
}

fn job_ref(j: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: j.metadata.name.clone(),
        namespace: j.metadata.namespace.clone(),
        uid: j.metadata.uid.clone(),
        resource_version: j.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// The Job for a scheduled time (`getJobFromTemplate2`).
pub fn job_for(cj: &CronJob, scheduled: Timestamp) -> Job {
    let spec = cj.spec.clone();
    let tmeta = spec.job_template.metadata.clone().unwrap_or_default();
    let name = format!("{}-{}", cj.metadata.name.as_deref().unwrap_or(""), scheduled.as_second().div_euclid(60));
    let mut annotations = tmeta.annotations.unwrap_or_default();
    annotations.insert("batch.kubernetes.io/cronjob-scheduled-timestamp".into(), scheduled.to_string());
    Job {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: cj.metadata.namespace.clone(),
            labels: tmeta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![owner_ref(cj)]),
            ..Default::default()
        },
        spec: Some(spec.job_template.spec.clone().unwrap_or_default()),
        status: None,
    }
}

/// The decision of one sync of `cj` given the Jobs in its namespace.
pub fn plan(cj: &CronJob, jobs: &[Arc<Job>], now: Timestamp) -> Result<Plan, String> {
    let mut plan = Plan::default();
    let spec = cj.spec.clone();
    let uid = cj.metadata.uid.clone().unwrap_or_default();
    let old = cj.status.clone().unwrap_or_default();
    let mut owned: Vec<&Job> =
        jobs.iter().map(|j| j.as_ref()).filter(|j| controller_ref(&j.metadata).is_some_and(|r| r.uid == uid)).collect();
    owned.sort_by_key(|j| creation(&j.metadata));
    let active: Vec<&Job> =
        owned.iter().copied().filter(|j| job_finished(j).is_none() && !is_deleting(&j.metadata)).collect();
    let mut status = CronJobStatus {
        active: (!active.is_empty()).then(|| active.iter().map(|j| job_ref(j)).collect()),
        last_schedule_time: old.last_schedule_time.clone(),
        last_successful_time: old.last_successful_time.clone(),
    };
    for j in owned.iter().filter(|j| job_finished(j) == Some("Complete")) {
        let t = j.status.as_ref().and_then(|s| s.completion_time.clone());
        if t.as_ref().map(|t| t.0) > status.last_successful_time.as_ref().map(|t| t.0) {
            status.last_successful_time = t;
        }
    }
    // History limits.
    for (kind, limit) in [
        ("Complete", spec.successful_jobs_history_limit.unwrap_or(3)),
        ("Failed", spec.failed_jobs_history_limit.unwrap_or(1)),
    ] {
        let finished: Vec<&&Job> =
            owned.iter().filter(|j| job_finished(j) == Some(kind) && !is_deleting(&j.metadata)).collect();
        let extra = finished.len().saturating_sub(limit.max(0) as usize);
        plan.delete.extend(finished.iter().take(extra).filter_map(|j| j.metadata.name.clone()));
    }
    let schedule = Schedule::parse(&spec.schedule)?;
    if spec.time_zone.as_deref().is_some_and(|z| z != "UTC" && z != "Etc/UTC") {
        return Err(format!("unsupported timeZone {:?} (only UTC)", spec.time_zone));
    }
    let since = old.last_schedule_time.as_ref().map(|t| t.0).unwrap_or_else(|| creation(&cj.metadata));
    // The most recent unmet schedule time.
    let mut latest = None;
    let mut t = since;
    let mut missed = 0;
    while let Some(n) = schedule.next(t) {
        if n > now {
            plan.requeue = Some(Duration::from_millis(n.duration_since(now).as_millis().max(0) as u64 + 100));
            break;
        }
        latest = Some(n);
        missed += 1;
        t = n;
        if missed > 1000 {
            // Far behind: jump to recent times.
            t = now.checked_sub(SignedDuration::from_hours(1)).unwrap_or(now).max(n);
        }
    }
    if missed > 100 {
        plan.events.push((
            WARNING,
            "TooManyMissedTimes",
            "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew".into(),
        ));
    }
    let suspended = spec.suspend.unwrap_or(false);
    if let (Some(scheduled), false) = (latest, suspended) {
        let too_late = spec
            .starting_deadline_seconds
            .is_some_and(|d| scheduled.checked_add(SignedDuration::from_secs(d)).is_ok_and(|end| end < now));
        let name = format!("{}-{}", cj.metadata.name.as_deref().unwrap_or(""), scheduled.as_second().div_euclid(60));
        let exists = owned.iter().any(|j| j.metadata.name.as_deref() == Some(&name));
        if too_late {
            plan.events.push((WARNING, "MissSchedule", format!("Missed scheduled time to start a job: {scheduled}")));
            status.last_schedule_time = Some(Time(scheduled));
        } else if exists {
            status.last_schedule_time = Some(Time(scheduled));
        } else {
            match spec.concurrency_policy.as_deref() {
                Some("Forbid") if !active.is_empty() => {
                    plan.events.push((
                        NORMAL,
                        "JobAlreadyActive",
                        "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
                    ));
                    plan.requeue = Some(Duration::from_secs(1));
                }
                policy => {
                    if policy == Some("Replace") {
                        plan.delete.extend(active.iter().filter_map(|j| j.metadata.name.clone()));
                    }
                    plan.create = Some((job_for(cj, scheduled), scheduled));
                    status.last_schedule_time = Some(Time(scheduled));
                }
            }
        }
    }
    plan.status = status;
    Ok(plan)
}

struct Ctx {
    client: kube::Client,
    jobs: Informer<Job>,
    recorder: Recorder,
}

async fn reconcile(cj: Arc<CronJob>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if is_deleting(&cj.metadata) {
        return Ok(Action::await_change());
    }
    let ns = cj.metadata.namespace.clone().unwrap_or_default();
    let name = cj.metadata.name.clone().unwrap_or_default();
    let jobs: Vec<Arc<Job>> =
        ctx.jobs.state().into_iter().filter(|j| j.metadata.namespace.as_deref() == Some(&ns)).collect();
    let plan = match plan(&cj, &jobs, Timestamp::now()) {
        Ok(p) => p,
        Err(e) => {
            ctx.recorder.event(
                cj.as_ref(),
                WARNING,
                "InvalidSchedule",
                format!("invalid schedule: {}: {e}", cj.spec.schedule),
            );
            return Ok(Action::await_change());
        }
    };
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    for (t, reason, msg) in &plan.events {
        ctx.recorder.event(cj.as_ref(), t, reason, msg.clone());
    }
    for j in &plan.delete {
        match api.delete(j, &DeleteParams::background()).await {
            Ok(_) => ctx.recorder.event(cj.as_ref(), NORMAL, "SuccessfulDelete", format!("Deleted job {j}")),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Some((job, _)) = &plan.create {
        let jn = job.metadata.name.clone().unwrap_or_default();
        match api.create(&PostParams::default(), job).await {
            Ok(_) => ctx.recorder.event(cj.as_ref(), NORMAL, "SuccessfulCreate", format!("Created job {jn}")),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                ctx.recorder.event(cj.as_ref(), WARNING, "FailedCreate", format!("Error creating job: {e}"));
                return Err(e.into());
            }
        }
    }
    let old = serde_json::to_value(cj.status.clone().unwrap_or_default()).unwrap_or_default();
    let new = serde_json::to_value(&plan.status).unwrap_or_default();
    if old != new {
        let cjs: Api<CronJob> = Api::namespaced(ctx.client.clone(), &ns);
        let mut body = json!({"status": plan.status});
        if plan.status.active.is_none() {
            body["status"]["active"] = serde_json::Value::Null;
        }
        cjs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body)).await?;
    }
    Ok(Action::requeue(plan.requeue.unwrap_or(Duration::from_secs(60)).min(Duration::from_secs(60))))
}

pub async fn run(client: kube::Client, recorder: Recorder) {
    let jobs = Informer::start(Api::<Job>::all(client.clone()));
    let ctx = Arc::new(Ctx { client: client.clone(), jobs: jobs.clone(), recorder });
    let (tx, triggers) = trigger::<CronJob>();
    let controller = Controller::new(Api::<CronJob>::all(client), watcher::Config::default()).reconcile_on(triggers);
    jobs.add_handler(move |j, _| {
        if let Some(r) = controller_ref(&j.metadata).filter(|r| r.kind == "CronJob") {
            let _ = tx.send(ObjectRef::new(&r.name).within(j.metadata.namespace.as_deref().unwrap_or("")));
        }
    });
    jobs.synced().await;
    run_controller(
        controller,
        reconcile,
        ctx,
        Policy { metric: "cronjob", what: "cronjob", retry: Duration::from_secs(2) },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use k8s_openapi::api::batch::v1::{CronJobSpec, JobCondition, JobSpec, JobStatus, JobTemplateSpec};

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_steps_schedules() {
        let every5 = Schedule::parse("*/5 * * * *").unwrap();
        assert_eq!(every5.next(ts("2026-01-01T10:02:30Z")), Some(ts("2026-01-01T10:05:00Z")));
        assert_eq!(every5.next(ts("2026-01-01T10:05:00Z")), Some(ts("2026-01-01T10:10:00Z")));
        let daily = Schedule::parse("@daily").unwrap();
        assert_eq!(daily.next(ts("2026-01-01T10:00:00Z")), Some(ts("2026-01-02T00:00:00Z")));
        // 2026-01-05 is a Monday.
        let weekdays = Schedule::parse("30 9 * * mon-fri").unwrap();
        assert_eq!(weekdays.next(ts("2026-01-03T12:00:00Z")), Some(ts("2026-01-05T09:30:00Z")));
        let sunday7 = Schedule::parse("0 0 * * 7").unwrap();
        assert_eq!(sunday7.next(ts("2026-01-01T00:00:00Z")), Some(ts("2026-01-04T00:00:00Z")));
        // Both day fields restricted: either matches.
        let either = Schedule::parse("0 0 1 * mon").unwrap();
        assert_eq!(either.next(ts("2026-01-01T01:00:00Z")), Some(ts("2026-01-05T00:00:00Z")));
        assert!(Schedule::parse("* * * *").is_err());
        assert!(Schedule::parse("61 * * * *").is_err());
    }

    fn cronjob(schedule: &str, policy: Option<&str>) -> CronJob {
        CronJob {
            metadata: ObjectMeta {
                name: Some("cj".into()),
                namespace: Some("default".into()),
                uid: Some("uid-cj".into()),
                creation_timestamp: Some(Time(ts("2026-01-01T00:00:30Z"))),
                ..Default::default()
            },
            spec: CronJobSpec {
                schedule: schedule.into(),
                concurrency_policy: policy.map(Into::into),
                job_template: JobTemplateSpec {
                    metadata: None,
                    spec: Some(JobSpec { template: template(&[], "busybox"), ..Default::default() }),
                },
                ..Default::default()
            },
            status: None,
        }
    }

    #[test]
    fn creates_the_latest_missed_job_and_respects_forbid() {
        let cj = cronjob("* * * * *", Some("Forbid"));
        let p = plan(&cj, &[], ts("2026-01-01T00:03:10Z")).unwrap();
        let (job, t) = p.create.unwrap();
        assert_eq!(t, ts("2026-01-01T00:03:00Z"));
        assert_eq!(job.metadata.name.as_deref(), Some(format!("cj-{}", t.as_second() / 60).as_str()));
        assert_eq!(p.status.last_schedule_time, Some(Time(t)));
        // An active job from the previous run blocks the next one under Forbid.
        let mut running = job_for(&cj, ts("2026-01-01T00:02:00Z"));
        running.metadata.uid = Some("j1".into());
        let p = plan(&cj, &[Arc::new(running.clone())], ts("2026-01-01T00:03:10Z")).unwrap();
        assert!(p.create.is_none());
        assert_eq!(p.status.active.map(|a| a.len()), Some(1));
        // Replace deletes it.
        let cj = cronjob("* * * * *", Some("Replace"));
        let p = plan(&cj, &[Arc::new(running)], ts("2026-01-01T00:03:10Z")).unwrap();
        assert!(p.create.is_some());
        assert_eq!(p.delete.len(), 1);
    }

    #[test]
    fn history_limits() {
        let cj = cronjob("0 0 1 1 *", None);
        let jobs: Vec<Arc<Job>> = (0..5)
            .map(|i| {
                let mut j = job_for(&cj, ts("2026-01-01T00:00:00Z"));
                j.metadata.name = Some(format!("j{i}"));
                j.metadata.creation_timestamp = Some(Time(at(i)));
                j.status = Some(JobStatus {
                    conditions: Some(vec![JobCondition {
                        type_: "Complete".into(),
                        status: "True".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                });
                Arc::new(j)
            })
            .collect();
        let p = plan(&cj, &jobs, ts("2026-01-01T00:10:00Z")).unwrap();
        assert_eq!(p.delete, vec!["j0".to_string(), "j1".to_string()]);
    }
}
