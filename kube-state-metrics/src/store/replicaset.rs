//! ReplicaSets: `kube_replicaset_*`, each series labelled `namespace`, `replicaset` first.

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};

use crate::render::{self, alpha, gauge, Family, Gen};

/// The replica sets' families, in the upstream exporter's order.
pub fn families(sets: &[&ReplicaSet]) -> Vec<Family> {
    render::families(sets, &generators(), |r| {
        vec![("namespace", render::namespace_of(&r.metadata)), ("replicaset", render::name_of(&r.metadata))]
    })
}

fn status<'a, T>(r: &'a ReplicaSet, field: impl FnOnce(&'a ReplicaSetStatus) -> Option<T>) -> Option<T> {
    r.status.as_ref().and_then(field)
}

fn generators() -> Vec<Gen<ReplicaSet>> {
    vec![
        gauge("kube_replicaset_created", "Unix creation timestamp", |r| {
            render::timestamp(r.metadata.creation_timestamp.as_ref())
        }),
        gauge("kube_replicaset_status_replicas", "The number of replicas per ReplicaSet.", |r| {
            render::one(status(r, |s| Some(s.replicas)).unwrap_or(0))
        }),
        gauge(
            "kube_replicaset_status_fully_labeled_replicas",
            "The number of fully labeled replicas per ReplicaSet.",
            |r| render::one(status(r, |s| s.fully_labeled_replicas).unwrap_or(0)),
        ),
        gauge("kube_replicaset_status_ready_replicas", "The number of ready replicas per ReplicaSet.", |r| {
            render::one(status(r, |s| s.ready_replicas).unwrap_or(0))
        }),
        alpha(
            "kube_replicaset_status_terminating_replicas",
            "The number of terminating replicas per ReplicaSet.",
            |r| render::optional(status(r, |s| s.terminating_replicas)),
        ),
        gauge(
            "kube_replicaset_status_observed_generation",
            "The generation observed by the ReplicaSet controller.",
            |r| render::one(status(r, |s| s.observed_generation).unwrap_or(0) as f64),
        ),
        gauge("kube_replicaset_spec_replicas", "Number of desired pods for a ReplicaSet.", |r| {
            render::optional(r.spec.replicas)
        }),
        gauge(
            "kube_replicaset_metadata_generation",
            "Sequence number representing a specific generation of the desired state.",
            |r| render::one(r.metadata.generation.unwrap_or(0) as f64),
        ),
        gauge("kube_replicaset_owner", "Information about the ReplicaSet's owner.", |r| {
            render::owner_series(r.metadata.owner_references.as_ref())
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    #[test]
    fn replicas_and_owner() {
        let r: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": "web-abc", "namespace": "default", "generation": 1,
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "d1", "controller": true}]},
            "spec": {"replicas": 2, "selector": {}},
            "status": {"replicas": 2, "readyReplicas": 1, "fullyLabeledReplicas": 2, "observedGeneration": 1}
        }))
        .unwrap();
        let text = render_text(&families(&[&r]));
        let got = lines(&text);
        for w in [
            r#"kube_replicaset_spec_replicas{namespace="default",replicaset="web-abc"} 2"#,
            r#"kube_replicaset_status_replicas{namespace="default",replicaset="web-abc"} 2"#,
            r#"kube_replicaset_status_ready_replicas{namespace="default",replicaset="web-abc"} 1"#,
            r#"kube_replicaset_status_fully_labeled_replicas{namespace="default",replicaset="web-abc"} 2"#,
            r#"kube_replicaset_status_observed_generation{namespace="default",replicaset="web-abc"} 1"#,
            r#"kube_replicaset_metadata_generation{namespace="default",replicaset="web-abc"} 1"#,
            r#"kube_replicaset_owner{namespace="default",replicaset="web-abc",owner_kind="Deployment",owner_name="web",owner_is_controller="true"} 1"#,
        ] {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
        assert!(!text.contains("kube_replicaset_created{"));
    }
}
