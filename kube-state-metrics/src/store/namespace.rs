//! Namespaces: `kube_namespace_*`, each series labelled `namespace` first.

use k8s_openapi::api::core::v1::Namespace;

use crate::render::{self, alpha, gauge, Family, Gen, Series};

/// The namespaces' families, in the upstream exporter's order.
pub fn families(namespaces: &[&Namespace]) -> Vec<Family> {
    render::families(namespaces, &generators(), |n| vec![("namespace", render::name_of(&n.metadata))])
}

fn generators() -> Vec<Gen<Namespace>> {
    vec![
        gauge("kube_namespace_created", "Unix creation timestamp", |n| {
            render::timestamp(n.metadata.creation_timestamp.as_ref())
        }),
        gauge("kube_namespace_status_phase", "kubernetes namespace status phase.", |n| {
            let phase = n.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
            ["Active", "Terminating"]
                .into_iter()
                .map(|p| Series::with(&[("phase", p)], render::bool_value(p == phase)))
                .collect()
        }),
        alpha("kube_namespace_status_condition", "The condition of a namespace.", |n| {
            let conditions = n.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
            conditions
                .iter()
                .flat_map(|c| render::condition_series(&[("condition", &c.type_)], "status", &c.status))
                .collect()
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::render_text;
    use serde_json::json;

    #[test]
    fn phases() {
        let n: Namespace = serde_json::from_value(json!({
            "metadata": {"name": "default", "creationTimestamp": "2024-06-14T10:00:00Z"},
            "status": {"phase": "Active"}
        }))
        .unwrap();
        assert_eq!(
            render_text(&families(&[&n])),
            concat!(
                "# HELP kube_namespace_created [STABLE] Unix creation timestamp\n",
                "# TYPE kube_namespace_created gauge\n",
                "kube_namespace_created{namespace=\"default\"} 1.7183592e+09\n",
                "# HELP kube_namespace_status_phase [STABLE] kubernetes namespace status phase.\n",
                "# TYPE kube_namespace_status_phase gauge\n",
                "kube_namespace_status_phase{namespace=\"default\",phase=\"Active\"} 1\n",
                "kube_namespace_status_phase{namespace=\"default\",phase=\"Terminating\"} 0\n",
                "# HELP kube_namespace_status_condition The condition of a namespace.\n",
                "# TYPE kube_namespace_status_condition gauge\n",
            )
        );
    }
}
