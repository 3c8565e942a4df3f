//! PersistentVolumeClaims: `kube_persistentvolumeclaim_*`, each series labelled
//! `namespace`, `persistentvolumeclaim` first.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::render::{self, alpha, gauge, Family, Gen, Series};

/// The claims' families, in the upstream exporter's order.
pub fn families(claims: &[&PersistentVolumeClaim]) -> Vec<Family> {
    render::families(claims, &generators(), |c| {
        vec![("namespace", render::namespace_of(&c.metadata)), ("persistentvolumeclaim", render::name_of(&c.metadata))]
    })
}

/// The class: the old beta annotation wins over `spec.storageClassName`.
fn storage_class(c: &PersistentVolumeClaim) -> &str {
    if let Some(class) = c.metadata.annotations.as_ref().and_then(|a| a.get("volume.beta.kubernetes.io/storage-class"))
    {
        return class;
    }
    c.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).unwrap_or_default()
}

fn generators() -> Vec<Gen<PersistentVolumeClaim>> {
    vec![
        gauge("kube_persistentvolumeclaim_info", "Information about persistent volume claim.", |c| {
            let spec = c.spec.as_ref();
            vec![Series::with(
                &[
                    ("storageclass", storage_class(c)),
                    ("volumename", spec.and_then(|s| s.volume_name.as_deref()).unwrap_or_default()),
                    ("volumemode", spec.and_then(|s| s.volume_mode.as_deref()).unwrap_or_default()),
                ],
                1.0,
            )]
        }),
        gauge(
            "kube_persistentvolumeclaim_status_phase",
            "The phase the persistent volume claim is currently in.",
            |c| {
                let Some(phase) = c.status.as_ref().and_then(|s| s.phase.as_deref()).filter(|p| !p.is_empty()) else {
                    return Vec::new();
                };
                ["Lost", "Bound", "Pending"]
                    .into_iter()
                    .map(|p| Series::with(&[("phase", p)], render::bool_value(p == phase)))
                    .collect()
            },
        ),
        gauge(
            "kube_persistentvolumeclaim_resource_requests_storage_bytes",
            "The capacity of storage requested by the persistent volume claim.",
            |c| {
                let storage = c
                    .spec
                    .as_ref()
                    .and_then(|s| s.resources.as_ref())
                    .and_then(|r| r.requests.as_ref())
                    .and_then(|r| r.get("storage"));
                render::optional(storage.map(crate::resource::whole))
            },
        ),
        gauge(
            "kube_persistentvolumeclaim_access_mode",
            "The access mode(s) specified by the persistent volume claim.",
            |c| {
                let modes = c.spec.as_ref().and_then(|s| s.access_modes.as_deref()).unwrap_or_default();
                modes.iter().map(|m| Series::with(&[("access_mode", m)], 1.0)).collect()
            },
        ),
        alpha(
            "kube_persistentvolumeclaim_status_condition",
            "Information about status of different conditions of persistent volume claim.",
            |c| {
                let conditions = c.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
                conditions
                    .iter()
                    .flat_map(|c| render::condition_series(&[("condition", &c.type_)], "status", &c.status))
                    .collect()
            },
        ),
        alpha("kube_persistentvolumeclaim_created", "Unix creation timestamp", |c| {
            render::timestamp(c.metadata.creation_timestamp.as_ref())
        }),
        alpha("kube_persistentvolumeclaim_deletion_timestamp", "Unix deletion timestamp", |c| {
            render::timestamp(c.metadata.deletion_timestamp.as_ref())
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    #[test]
    fn bound_claim() {
        let c: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "db"},
            "spec": {"storageClassName": "local-path", "volumeName": "pv-1", "volumeMode": "Filesystem",
                     "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
            "status": {"phase": "Bound"}
        }))
        .unwrap();
        let text = render_text(&families(&[&c]));
        let got = lines(&text);
        for w in [
            r#"kube_persistentvolumeclaim_info{namespace="db",persistentvolumeclaim="data",storageclass="local-path",volumename="pv-1",volumemode="Filesystem"} 1"#,
            r#"kube_persistentvolumeclaim_status_phase{namespace="db",persistentvolumeclaim="data",phase="Lost"} 0"#,
            r#"kube_persistentvolumeclaim_status_phase{namespace="db",persistentvolumeclaim="data",phase="Bound"} 1"#,
            r#"kube_persistentvolumeclaim_status_phase{namespace="db",persistentvolumeclaim="data",phase="Pending"} 0"#,
            r#"kube_persistentvolumeclaim_resource_requests_storage_bytes{namespace="db",persistentvolumeclaim="data"} 1.073741824e+10"#,
            r#"kube_persistentvolumeclaim_access_mode{namespace="db",persistentvolumeclaim="data",access_mode="ReadWriteOnce"} 1"#,
        ] {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
    }
}
