//! Deployments: `kube_deployment_*`, each series labelled `namespace`, `deployment` first.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::render::{self, alpha, gauge, Family, Gen, Series};

/// The deployments' families, in the upstream exporter's order.
pub fn families(deployments: &[&Deployment]) -> Vec<Family> {
    render::families(deployments, &generators(), |d| {
        vec![("namespace", render::namespace_of(&d.metadata)), ("deployment", render::name_of(&d.metadata))]
    })
}

/// The reasons the deployment controller gives its conditions; any other reads `unknown`.
const REASONS: &[&str] = &[
    "ReplicaSetUpdated",
    "ReplicaSetCreateError",
    "NewReplicaSetCreated",
    "FoundNewReplicaSet",
    "NewReplicaSetAvailable",
    "ProgressDeadlineExceeded",
    "DeploymentPaused",
    "DeploymentResumed",
    "MinimumReplicasAvailable",
    "MinimumReplicasUnavailable",
    "",
];

fn status<'a, T>(d: &'a Deployment, field: impl FnOnce(&'a DeploymentStatus) -> Option<T>) -> Option<T> {
    d.status.as_ref().and_then(field)
}

fn generators() -> Vec<Gen<Deployment>> {
    vec![
        alpha("kube_deployment_owner", "Information about the Deployment's owner.", |d| {
            match d.metadata.owner_references.as_deref() {
                Some(owners) if !owners.is_empty() => {
                    owners.iter().map(|o| Series::with(&[("owner_kind", &o.kind), ("owner_name", &o.name)], 1.0)).collect()
                }
                _ => vec![Series::with(&[("owner_kind", ""), ("owner_name", "")], 1.0)],
            }
        }),
        gauge("kube_deployment_created", "Unix creation timestamp", |d| {
            render::timestamp(d.metadata.creation_timestamp.as_ref())
        }),
        gauge("kube_deployment_status_replicas", "The number of replicas per deployment.", |d| {
            render::one(status(d, |s| s.replicas).unwrap_or(0))
        }),
        gauge("kube_deployment_status_replicas_ready", "The number of ready replicas per deployment.", |d| {
            render::one(status(d, |s| s.ready_replicas).unwrap_or(0))
        }),
        gauge("kube_deployment_status_replicas_available", "The number of available replicas per deployment.", |d| {
            render::one(status(d, |s| s.available_replicas).unwrap_or(0))
        }),
        gauge("kube_deployment_status_replicas_unavailable", "The number of unavailable replicas per deployment.", |d| {
            render::one(status(d, |s| s.unavailable_replicas).unwrap_or(0))
        }),
        gauge("kube_deployment_status_replicas_updated", "The number of updated replicas per deployment.", |d| {
            render::one(status(d, |s| s.updated_replicas).unwrap_or(0))
        }),
        alpha("kube_deployment_status_terminating_replicas", "The number of terminating replicas per deployment.", |d| {
            render::optional(status(d, |s| s.terminating_replicas))
        }),
        gauge("kube_deployment_status_observed_generation", "The generation observed by the deployment controller.", |d| {
            render::one(status(d, |s| s.observed_generation).unwrap_or(0) as f64)
        }),
        gauge("kube_deployment_status_condition", "The current status conditions of a deployment.", |d| {
            status(d, |s| s.conditions.as_deref())
                .unwrap_or_default()
                .iter()
                .flat_map(|c| {
                    let reason = c.reason.as_deref().unwrap_or_default();
                    let reason = if REASONS.contains(&reason) { reason } else { "unknown" };
                    let type_ = c.type_.as_deref().unwrap_or_default();
                    render::condition_series(&[("reason", reason), ("condition", type_)], "status", c.status.as_deref().unwrap_or_default())
                })
                .collect()
        }),
        gauge("kube_deployment_spec_replicas", "Number of desired pods for a deployment.", |d| {
            render::optional(d.spec.replicas)
        }),
        gauge(
            "kube_deployment_spec_paused",
            "Whether the deployment is paused and will not be processed by the deployment controller.",
            |d| render::one(render::bool_value(d.spec.paused.unwrap_or(false))),
        ),
        gauge(
            "kube_deployment_spec_strategy_rollingupdate_max_unavailable",
            "Maximum number of unavailable replicas during a rolling update of a deployment.",
            |d| rolling_update(d, false),
        ),
        gauge(
            "kube_deployment_spec_strategy_rollingupdate_max_surge",
            "Maximum number of replicas that can be scheduled above the desired number of replicas during a rolling update of a deployment.",
            |d| rolling_update(d, true),
        ),
        gauge(
            "kube_deployment_metadata_generation",
            "Sequence number representing a specific generation of the desired state.",
            |d| render::one(d.metadata.generation.unwrap_or(0) as f64),
        ),
        alpha("kube_deployment_deletion_timestamp", "Unix deletion timestamp", |d| {
            render::timestamp(d.metadata.deletion_timestamp.as_ref())
        }),
    ]
}

/// `maxSurge` (rounded up) or `maxUnavailable` (rounded down) in pods; none without a
/// rolling update, replicas or a value that reads.
fn rolling_update(d: &Deployment, surge: bool) -> Vec<Series> {
    let spec = &d.spec;
    let (Some(ru), Some(replicas)) = (spec.strategy.as_ref().and_then(|s| s.rolling_update.as_ref()), spec.replicas)
    else {
        return Vec::new();
    };
    let v = if surge { ru.max_surge.as_ref() } else { ru.max_unavailable.as_ref() };
    v.and_then(|v| scaled(v, replicas, surge)).map(|v| vec![Series::value(v as f64)]).unwrap_or_default()
}

/// An int-or-percent of `total`, as Kubernetes scales it.
pub fn scaled(v: &IntOrString, total: i32, round_up: bool) -> Option<i64> {
    match v {
        IntOrString::Int(i) => Some(i64::from(*i)),
        IntOrString::String(s) => {
            let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
            let x = pct * i64::from(total);
            Some(if round_up { (x + 99).div_euclid(100) } else { x.div_euclid(100) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    #[test]
    fn replica_series() {
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "generation": 3, "creationTimestamp": "2024-06-14T10:00:00Z"},
            "spec": {"replicas": 3, "selector": {}, "template": {},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}},
            "status": {"replicas": 3, "readyReplicas": 2, "availableReplicas": 2, "unavailableReplicas": 1, "updatedReplicas": 3,
                       "observedGeneration": 3,
                       "conditions": [{"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
                                      {"type": "Progressing", "status": "True", "reason": "SomethingElse"}]}
        }))
        .unwrap();
        let text = render_text(&families(&[&d]));
        assert!(text.contains(concat!(
            "# HELP kube_deployment_status_replicas [STABLE] The number of replicas per deployment.\n",
            "# TYPE kube_deployment_status_replicas gauge\n",
            "kube_deployment_status_replicas{namespace=\"default\",deployment=\"web\"} 3\n",
            "# HELP kube_deployment_status_replicas_ready [STABLE] The number of ready replicas per deployment.\n",
            "# TYPE kube_deployment_status_replicas_ready gauge\n",
            "kube_deployment_status_replicas_ready{namespace=\"default\",deployment=\"web\"} 2\n",
            "# HELP kube_deployment_status_replicas_available [STABLE] The number of available replicas per deployment.\n",
            "# TYPE kube_deployment_status_replicas_available gauge\n",
            "kube_deployment_status_replicas_available{namespace=\"default\",deployment=\"web\"} 2\n",
            "# HELP kube_deployment_status_replicas_unavailable [STABLE] The number of unavailable replicas per deployment.\n",
            "# TYPE kube_deployment_status_replicas_unavailable gauge\n",
            "kube_deployment_status_replicas_unavailable{namespace=\"default\",deployment=\"web\"} 1\n",
            "# HELP kube_deployment_status_replicas_updated [STABLE] The number of updated replicas per deployment.\n",
            "# TYPE kube_deployment_status_replicas_updated gauge\n",
            "kube_deployment_status_replicas_updated{namespace=\"default\",deployment=\"web\"} 3\n",
            "# HELP kube_deployment_status_terminating_replicas The number of terminating replicas per deployment.\n",
            "# TYPE kube_deployment_status_terminating_replicas gauge\n",
            "# HELP kube_deployment_status_observed_generation [STABLE] The generation observed by the deployment controller.\n",
        )));
        let got = lines(&text);
        for w in [
            r#"kube_deployment_spec_replicas{namespace="default",deployment="web"} 3"#,
            r#"kube_deployment_spec_paused{namespace="default",deployment="web"} 0"#,
            r#"kube_deployment_metadata_generation{namespace="default",deployment="web"} 3"#,
            r#"kube_deployment_status_observed_generation{namespace="default",deployment="web"} 3"#,
            r#"kube_deployment_spec_strategy_rollingupdate_max_surge{namespace="default",deployment="web"} 1"#,
            r#"kube_deployment_spec_strategy_rollingupdate_max_unavailable{namespace="default",deployment="web"} 0"#,
            r#"kube_deployment_status_condition{namespace="default",deployment="web",reason="MinimumReplicasUnavailable",condition="Available",status="false"} 1"#,
            r#"kube_deployment_status_condition{namespace="default",deployment="web",reason="unknown",condition="Progressing",status="true"} 1"#,
            r#"kube_deployment_owner{namespace="default",deployment="web",owner_kind="",owner_name=""} 1"#,
            r#"kube_deployment_created{namespace="default",deployment="web"} 1.7183592e+09"#,
        ] {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
    }

    #[test]
    fn int_or_percent() {
        assert_eq!(scaled(&IntOrString::String("25%".into()), 10, true), Some(3));
        assert_eq!(scaled(&IntOrString::String("25%".into()), 10, false), Some(2));
        assert_eq!(scaled(&IntOrString::Int(2), 10, false), Some(2));
        assert_eq!(scaled(&IntOrString::String("x".into()), 10, false), None);
    }
}
