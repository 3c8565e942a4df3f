//! CronJobs: `kube_cronjob_*`, each series labelled `namespace`, `cronjob` first.
//!
//! `kube_cronjob_next_schedule_time` and `kube_cronjob_schedule_invalid` are not
//! exported: they need a cron schedule parser this crate does not have.

use k8s_openapi::api::batch::v1::CronJob;

use crate::render::{self, alpha, gauge, Family, Gen, Series};

/// The cron jobs' families, in the upstream exporter's order.
pub fn families(cronjobs: &[&CronJob]) -> Vec<Family> {
    render::families(cronjobs, &generators(), |c| {
        vec![("namespace", render::namespace_of(&c.metadata)), ("cronjob", render::name_of(&c.metadata))]
    })
}

fn generators() -> Vec<Gen<CronJob>> {
    vec![
        gauge("kube_cronjob_info", "Info about cronjob.", |c| {
            let schedule = c.spec.schedule.as_str();
            let policy = c.spec.concurrency_policy.as_deref().unwrap_or_default();
            let tz = c.spec.time_zone.as_deref().unwrap_or("local");
            vec![Series::with(&[("schedule", schedule), ("concurrency_policy", policy), ("timezone", tz)], 1.0)]
        }),
        gauge("kube_cronjob_created", "Unix creation timestamp", |c| {
            render::timestamp(c.metadata.creation_timestamp.as_ref())
        }),
        gauge("kube_cronjob_status_active", "Active holds pointers to currently running jobs.", |c| {
            render::one(c.status.as_ref().and_then(|s| s.active.as_ref()).map(|a| a.len()).unwrap_or(0) as f64)
        }),
        gauge(
            "kube_cronjob_status_last_schedule_time",
            "LastScheduleTime keeps information of when was the last time the job was successfully scheduled.",
            |c| render::timestamp(c.status.as_ref().and_then(|s| s.last_schedule_time.as_ref())),
        ),
        gauge(
            "kube_cronjob_status_last_successful_time",
            "LastSuccessfulTime keeps information of when was the last time the job was completed successfully.",
            |c| render::timestamp(c.status.as_ref().and_then(|s| s.last_successful_time.as_ref())),
        ),
        gauge(
            "kube_cronjob_spec_suspend",
            "Suspend flag tells the controller to suspend subsequent executions.",
            |c| render::one(render::bool_value(c.spec.suspend.unwrap_or(false))),
        ),
        gauge(
            "kube_cronjob_spec_starting_deadline_seconds",
            "Deadline in seconds for starting the job if it misses scheduled time for any reason.",
            |c| render::optional(c.spec.starting_deadline_seconds.map(|v| v as f64)),
        ),
        gauge(
            "kube_cronjob_metadata_resource_version",
            "Resource version representing a specific version of the cronjob.",
            |c| render::optional(c.metadata.resource_version.as_deref().and_then(|v| v.parse::<f64>().ok())),
        ),
        alpha(
            "kube_cronjob_spec_successful_job_history_limit",
            "Successful job history limit tells the controller how many completed jobs should be preserved.",
            |c| render::optional(c.spec.successful_jobs_history_limit),
        ),
        alpha(
            "kube_cronjob_spec_failed_job_history_limit",
            "Failed job history limit tells the controller how many failed jobs should be preserved.",
            |c| render::optional(c.spec.failed_jobs_history_limit),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    #[test]
    fn schedule_and_history() {
        let c: CronJob = serde_json::from_value(json!({
            "metadata": {"name": "nightly", "namespace": "ops", "resourceVersion": "1234"},
            "spec": {"schedule": "0 3 * * *", "concurrencyPolicy": "Forbid", "suspend": true,
                     "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1, "jobTemplate": {}},
            "status": {"active": [{"name": "nightly-1"}], "lastScheduleTime": "2024-06-14T10:00:00Z"}
        }))
        .unwrap();
        let text = render_text(&families(&[&c]));
        let got = lines(&text);
        for w in [
            r#"kube_cronjob_info{namespace="ops",cronjob="nightly",schedule="0 3 * * *",concurrency_policy="Forbid",timezone="local"} 1"#,
            r#"kube_cronjob_status_active{namespace="ops",cronjob="nightly"} 1"#,
            r#"kube_cronjob_status_last_schedule_time{namespace="ops",cronjob="nightly"} 1.7183592e+09"#,
            r#"kube_cronjob_spec_suspend{namespace="ops",cronjob="nightly"} 1"#,
            r#"kube_cronjob_metadata_resource_version{namespace="ops",cronjob="nightly"} 1234"#,
            r#"kube_cronjob_spec_successful_job_history_limit{namespace="ops",cronjob="nightly"} 3"#,
            r#"kube_cronjob_spec_failed_job_history_limit{namespace="ops",cronjob="nightly"} 1"#,
        ] {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
    }
}
