//! Jobs: `kube_job_*`, each series labelled `namespace`, `job_name` first.

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};

use crate::render::{self, alpha, gauge, Family, Gen, Series};

/// The jobs' families, in the upstream exporter's order.
pub fn families(jobs: &[&Job]) -> Vec<Family> {
    render::families(jobs, &generators(), |j| {
        vec![("namespace", render::namespace_of(&j.metadata)), ("job_name", render::name_of(&j.metadata))]
    })
}

/// Failure reasons that get a series of their own in `kube_job_status_failed`.
const FAILURE_REASONS: &[&str] = &["BackoffLimitExceeded", "DeadlineExceeded", "Evicted"];

fn status<'a, T>(j: &'a Job, field: impl FnOnce(&'a JobStatus) -> Option<T>) -> Option<T> {
    j.status.as_ref().and_then(field)
}

fn conditions(j: &Job) -> &[JobCondition] {
    j.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default()
}

fn generators() -> Vec<Gen<Job>> {
    vec![
        gauge("kube_job_info", "Information about job.", |_| render::one(1.0)),
        gauge("kube_job_created", "Unix creation timestamp", |j| render::timestamp(j.metadata.creation_timestamp.as_ref())),
        gauge(
            "kube_job_spec_parallelism",
            "The maximum desired number of pods the job should run at any given time.",
            |j| render::optional(j.spec.as_ref().and_then(|s| s.parallelism)),
        ),
        gauge(
            "kube_job_spec_completions",
            "The desired number of successfully finished pods the job should be run with.",
            |j| render::optional(j.spec.as_ref().and_then(|s| s.completions)),
        ),
        gauge(
            "kube_job_spec_active_deadline_seconds",
            "The duration in seconds relative to the startTime that the job may be active before the system tries to terminate it.",
            |j| render::optional(j.spec.as_ref().and_then(|s| s.active_deadline_seconds).map(|v| v as f64)),
        ),
        gauge("kube_job_status_succeeded", "The number of pods which reached Phase Succeeded.", |j| {
            render::one(status(j, |s| s.succeeded).unwrap_or(0))
        }),
        gauge("kube_job_status_failed", "The number of pods which reached Phase Failed and the reason for failure.", failed),
        gauge("kube_job_status_active", "The number of actively running pods.", |j| {
            render::one(status(j, |s| s.active).unwrap_or(0))
        }),
        alpha("kube_job_status_ready", "The number of ready pods that belong to this Job.", |j| {
            render::one(status(j, |s| s.ready).unwrap_or(0))
        }),
        gauge("kube_job_complete", "The job has completed its execution.", |j| condition(j, "Complete")),
        gauge("kube_job_failed", "The job has failed its execution.", |j| condition(j, "Failed")),
        gauge(
            "kube_job_status_start_time",
            "StartTime represents time when the job was acknowledged by the Job Manager.",
            |j| render::timestamp(status(j, |s| s.start_time.as_ref())),
        ),
        gauge(
            "kube_job_status_completion_time",
            "CompletionTime represents time when the job was completed.",
            |j| render::timestamp(status(j, |s| s.completion_time.as_ref())),
        ),
        alpha("kube_job_status_suspended", "The number of pods which reached Phase Suspended.", |j| {
            conditions(j)
                .iter()
                .filter(|c| c.type_ == "Suspended")
                .map(|c| Series::value(render::bool_value(c.status == "True")))
                .collect()
        }),
        gauge("kube_job_owner", "Information about the Job's owner.", |j| {
            render::owner_series(j.metadata.owner_references.as_ref())
        }),
    ]
}

/// No failed pods: one bare 0. Otherwise a series per known reason of each `Failed`
/// condition, and the count under `reason=""` when no known reason explains it.
fn failed(j: &Job) -> Vec<Series> {
    let count = status(j, |s| s.failed).unwrap_or(0);
    if count == 0 {
        return render::one(0.0);
    }
    let mut out = Vec::new();
    let mut known = false;
    for c in conditions(j).iter().filter(|c| c.type_ == "Failed") {
        let reason = c.reason.as_deref().unwrap_or_default();
        for r in FAILURE_REASONS {
            known |= reason == *r;
            out.push(Series::with(&[("reason", r)], render::bool_value(reason == *r)));
        }
    }
    if !known {
        out.push(Series::with(&[("reason", "")], f64::from(count)));
    }
    out
}

fn condition(j: &Job, type_: &str) -> Vec<Series> {
    conditions(j)
        .iter()
        .filter(|c| c.type_ == type_)
        .flat_map(|c| render::condition_series(&[], "condition", &c.status))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    #[test]
    fn failed_job() {
        let j: Job = serde_json::from_value(json!({
            "metadata": {"name": "pi", "namespace": "default",
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "pi-cron", "uid": "c1", "controller": true}]},
            "spec": {"parallelism": 1, "completions": 1, "template": {}},
            "status": {"failed": 3, "startTime": "2024-06-14T10:00:00Z",
                       "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
        }))
        .unwrap();
        let text = render_text(&families(&[&j]));
        let got = lines(&text);
        for w in [
            r#"kube_job_info{namespace="default",job_name="pi"} 1"#,
            r#"kube_job_spec_parallelism{namespace="default",job_name="pi"} 1"#,
            r#"kube_job_status_failed{namespace="default",job_name="pi",reason="BackoffLimitExceeded"} 1"#,
            r#"kube_job_status_failed{namespace="default",job_name="pi",reason="DeadlineExceeded"} 0"#,
            r#"kube_job_status_succeeded{namespace="default",job_name="pi"} 0"#,
            r#"kube_job_status_active{namespace="default",job_name="pi"} 0"#,
            r#"kube_job_failed{namespace="default",job_name="pi",condition="true"} 1"#,
            r#"kube_job_status_start_time{namespace="default",job_name="pi"} 1.7183592e+09"#,
            r#"kube_job_owner{namespace="default",job_name="pi",owner_kind="CronJob",owner_name="pi-cron",owner_is_controller="true"} 1"#,
        ] {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
        assert!(!text.contains("reason=\"\""));
        assert!(!text.contains("kube_job_complete{"));
    }

    #[test]
    fn failures_without_a_known_reason_and_none() {
        let j: Job = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "n"}, "spec": {"template": {}}, "status": {"failed": 2}
        }))
        .unwrap();
        assert_eq!(failed(&j), [Series::with(&[("reason", "")], 2.0)]);
        let ok: Job = serde_json::from_value(json!({"metadata": {"name": "b"}, "spec": {"template": {}}})).unwrap();
        assert_eq!(failed(&ok), [Series::value(0.0)]);
    }
}
