//! DaemonSets: `kube_daemonset_*`, each series labelled `namespace`, `daemonset` first.

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};

use crate::render::{self, alpha, gauge, Family, Gen};

/// The daemon sets' families, in the upstream exporter's order.
pub fn families(sets: &[&DaemonSet]) -> Vec<Family> {
    render::families(sets, &generators(), |d| {
        vec![("namespace", render::namespace_of(&d.metadata)), ("daemonset", render::name_of(&d.metadata))]
    })
}

fn status<'a, T>(d: &'a DaemonSet, field: impl FnOnce(&'a DaemonSetStatus) -> Option<T>) -> Option<T> {
    d.status.as_ref().and_then(field)
}

fn generators() -> Vec<Gen<DaemonSet>> {
    vec![
        gauge("kube_daemonset_created", "Unix creation timestamp", |d| {
            render::timestamp(d.metadata.creation_timestamp.as_ref())
        }),
        gauge(
            "kube_daemonset_status_current_number_scheduled",
            "The number of nodes running at least one daemon pod and are supposed to.",
            |d| render::one(status(d, |s| Some(s.current_number_scheduled)).unwrap_or(0)),
        ),
        gauge(
            "kube_daemonset_status_desired_number_scheduled",
            "The number of nodes that should be running the daemon pod.",
            |d| render::one(status(d, |s| Some(s.desired_number_scheduled)).unwrap_or(0)),
        ),
        gauge(
            "kube_daemonset_status_number_available",
            "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available",
            |d| render::one(status(d, |s| s.number_available).unwrap_or(0)),
        ),
        gauge(
            "kube_daemonset_status_number_misscheduled",
            "The number of nodes running a daemon pod but are not supposed to.",
            |d| render::one(status(d, |s| Some(s.number_misscheduled)).unwrap_or(0)),
        ),
        gauge(
            "kube_daemonset_status_number_ready",
            "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
            |d| render::one(status(d, |s| Some(s.number_ready)).unwrap_or(0)),
        ),
        gauge(
            "kube_daemonset_status_number_unavailable",
            "The number of nodes that should be running the daemon pod and have none of the daemon pod running and available",
            |d| render::one(status(d, |s| s.number_unavailable).unwrap_or(0)),
        ),
        gauge(
            "kube_daemonset_status_observed_generation",
            "The most recent generation observed by the daemon set controller.",
            |d| render::one(status(d, |s| s.observed_generation).unwrap_or(0) as f64),
        ),
        gauge(
            "kube_daemonset_status_updated_number_scheduled",
            "The total number of nodes that are running updated daemon pod",
            |d| render::one(status(d, |s| s.updated_number_scheduled).unwrap_or(0)),
        ),
        gauge(
            "kube_daemonset_metadata_generation",
            "Sequence number representing a specific generation of the desired state.",
            |d| render::one(d.metadata.generation.unwrap_or(0) as f64),
        ),
        alpha("kube_daemonset_deletion_timestamp", "Unix deletion timestamp", |d| {
            render::timestamp(d.metadata.deletion_timestamp.as_ref())
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    #[test]
    fn scheduling_numbers() {
        let d: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "kube-proxy", "namespace": "kube-system", "generation": 1},
            "spec": {"selector": {}, "template": {}},
            "status": {"currentNumberScheduled": 2, "desiredNumberScheduled": 3, "numberMisscheduled": 0, "numberReady": 2,
                       "numberAvailable": 2, "numberUnavailable": 1, "updatedNumberScheduled": 3, "observedGeneration": 1}
        }))
        .unwrap();
        let text = render_text(&families(&[&d]));
        let got = lines(&text);
        for w in [
            r#"kube_daemonset_status_current_number_scheduled{namespace="kube-system",daemonset="kube-proxy"} 2"#,
            r#"kube_daemonset_status_desired_number_scheduled{namespace="kube-system",daemonset="kube-proxy"} 3"#,
            r#"kube_daemonset_status_number_misscheduled{namespace="kube-system",daemonset="kube-proxy"} 0"#,
            r#"kube_daemonset_status_number_ready{namespace="kube-system",daemonset="kube-proxy"} 2"#,
            r#"kube_daemonset_status_number_available{namespace="kube-system",daemonset="kube-proxy"} 2"#,
            r#"kube_daemonset_status_number_unavailable{namespace="kube-system",daemonset="kube-proxy"} 1"#,
            r#"kube_daemonset_status_updated_number_scheduled{namespace="kube-system",daemonset="kube-proxy"} 3"#,
            r#"kube_daemonset_metadata_generation{namespace="kube-system",daemonset="kube-proxy"} 1"#,
        ] {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
    }
}
