//! StatefulSets: `kube_statefulset_*`, each series labelled `namespace`, `statefulset` first.

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};

use crate::render::{self, gauge, Family, Gen, Series};

/// The stateful sets' families, in the upstream exporter's order.
pub fn families(sets: &[&StatefulSet]) -> Vec<Family> {
    render::families(sets, &generators(), |s| {
        vec![("namespace", render::namespace_of(&s.metadata)), ("statefulset", render::name_of(&s.metadata))]
    })
}

fn status<'a, T>(s: &'a StatefulSet, field: impl FnOnce(&'a StatefulSetStatus) -> Option<T>) -> Option<T> {
    s.status.as_ref().and_then(field)
}

fn generators() -> Vec<Gen<StatefulSet>> {
    vec![
        gauge("kube_statefulset_created", "Unix creation timestamp", |s| {
            render::timestamp(s.metadata.creation_timestamp.as_ref())
        }),
        gauge("kube_statefulset_status_replicas", "The number of replicas per StatefulSet.", |s| {
            render::one(status(s, |st| Some(st.replicas)).unwrap_or(0))
        }),
        gauge("kube_statefulset_status_replicas_available", "The number of available replicas per StatefulSet.", |s| {
            render::one(status(s, |st| st.available_replicas).unwrap_or(0))
        }),
        gauge("kube_statefulset_status_replicas_current", "The number of current replicas per StatefulSet.", |s| {
            render::one(status(s, |st| st.current_replicas).unwrap_or(0))
        }),
        gauge("kube_statefulset_status_replicas_ready", "The number of ready replicas per StatefulSet.", |s| {
            render::one(status(s, |st| st.ready_replicas).unwrap_or(0))
        }),
        gauge("kube_statefulset_status_replicas_updated", "The number of updated replicas per StatefulSet.", |s| {
            render::one(status(s, |st| st.updated_replicas).unwrap_or(0))
        }),
        gauge("kube_statefulset_status_observed_generation", "The generation observed by the StatefulSet controller.", |s| {
            render::one(status(s, |st| st.observed_generation).unwrap_or(0) as f64)
        }),
        gauge("kube_statefulset_replicas", "Number of desired pods for a StatefulSet.", |s| {
            render::optional(s.spec.replicas)
        }),
        gauge("kube_statefulset_ordinals_start", "Start ordinal of the StatefulSet.", |s| {
            render::optional(s.spec.ordinals.as_ref().map(|o| o.start.unwrap_or(0)))
        }),
        gauge(
            "kube_statefulset_metadata_generation",
            "Sequence number representing a specific generation of the desired state for the StatefulSet.",
            |s| render::one(s.metadata.generation.unwrap_or(0) as f64),
        ),
        gauge(
            "kube_statefulset_persistentvolumeclaim_retention_policy",
            "Count of retention policy for StatefulSet template PVCs",
            |s| {
                let policy = s.spec.persistent_volume_claim_retention_policy.as_ref();
                let deleted = policy.and_then(|p| p.when_deleted.as_deref()).unwrap_or_default();
                let scaled = policy.and_then(|p| p.when_scaled.as_deref()).unwrap_or_default();
                if deleted.is_empty() && scaled.is_empty() {
                    return Vec::new();
                }
                vec![Series::with(&[("when_deleted", deleted), ("when_scaled", scaled)], 1.0)]
            },
        ),
        gauge(
            "kube_statefulset_status_current_revision",
            "Indicates the version of the StatefulSet used to generate Pods in the sequence [0,currentReplicas).",
            |s| {
                let rev = status(s, |st| st.current_revision.clone()).unwrap_or_default();
                vec![Series::with(&[("revision", &rev)], 1.0)]
            },
        ),
        gauge(
            "kube_statefulset_status_update_revision",
            "Indicates the version of the StatefulSet used to generate Pods in the sequence [replicas-updatedReplicas,replicas)",
            |s| {
                let rev = status(s, |st| st.update_revision.clone()).unwrap_or_default();
                vec![Series::with(&[("revision", &rev)], 1.0)]
            },
        ),
        gauge("kube_statefulset_deletion_timestamp", "Unix deletion timestamp", |s| {
            render::timestamp(s.metadata.deletion_timestamp.as_ref())
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    #[test]
    fn replicas_and_revisions() {
        let s: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "data", "generation": 2},
            "spec": {"replicas": 3, "selector": {}, "serviceName": "db", "template": {},
                     "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Delete"}},
            "status": {"replicas": 3, "readyReplicas": 3, "currentReplicas": 3, "updatedReplicas": 1, "availableReplicas": 3,
                       "currentRevision": "db-1", "updateRevision": "db-2", "observedGeneration": 2}
        }))
        .unwrap();
        let text = render_text(&families(&[&s]));
        let got = lines(&text);
        for w in [
            r#"kube_statefulset_replicas{namespace="data",statefulset="db"} 3"#,
            r#"kube_statefulset_status_replicas_ready{namespace="data",statefulset="db"} 3"#,
            r#"kube_statefulset_status_replicas_updated{namespace="data",statefulset="db"} 1"#,
            r#"kube_statefulset_status_current_revision{namespace="data",statefulset="db",revision="db-1"} 1"#,
            r#"kube_statefulset_status_update_revision{namespace="data",statefulset="db",revision="db-2"} 1"#,
            r#"kube_statefulset_persistentvolumeclaim_retention_policy{namespace="data",statefulset="db",when_deleted="Retain",when_scaled="Delete"} 1"#,
            r#"kube_statefulset_metadata_generation{namespace="data",statefulset="db"} 2"#,
        ] {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
        assert!(!text.contains("kube_statefulset_ordinals_start{"));
    }
}
