//! VolumeBinding (kube-scheduler's plugin, as far as MiniK8s needs it): a pod whose claim is
//! bound to a volume with a node affinity goes only where that affinity admits; a pod with
//! an unbound WaitForFirstConsumer claim goes where a matching Available volume may be
//! used or, when the claim's class has a provisioner, anywhere (the scheduler then sets
//! `volume.kubernetes.io/selected-node` on the claim and the provisioner provisions there);
//! a missing or deleting claim, or an unbound claim of an Immediate class, fits nowhere
//! until it changes.
//!
//! [`pod_volumes`] digests the claims, volumes and classes the shell read for one pod;
//! [`filter`] is the per-node check. Both pure. Unlike upstream the scheduler does not bind
//! static volumes itself: the persistentvolume-binder does, for the selected node.

use std::collections::HashMap;

use apimachinery::scheduling::node_selector_matches;
use k8s_openapi::api::core::v1::{NodeSelector, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use super::filters::Reasons;
use super::types::Labels;

pub const ERR_NODE_CONFLICT: &str = "node(s) had volume node affinity conflict";
pub const ERR_BIND_CONFLICT: &str = "node(s) didn't find available persistent volumes to bind";
pub const ERR_UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

/// One unbound WaitForFirstConsumer claim.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DelayedClaim {
    pub name: String,
    /// Its class has a provisioner: any node will do.
    pub provisionable: bool,
    /// Node affinities of the Available volumes that would satisfy it (None: any node).
    pub candidates: Vec<Option<NodeSelector>>,
}

/// What VolumeBinding knows of one pod's claims.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodVolumes {
    /// Why no node fits whatever its labels.
    pub unresolvable: Option<String>,
    /// Node affinities of the volumes its bound (or pre-bound) claims use.
    pub bound: Vec<NodeSelector>,
    pub delayed: Vec<DelayedClaim>,
}

fn quantity(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> i64 {
    q.map(|q| apimachinery::quantity::value(&q.0)).unwrap_or(0)
}

/// Could `v` serve `c` (class, capacity, access modes, Available and unclaimed)?
fn could_serve(v: &PersistentVolume, c: &PersistentVolumeClaim) -> bool {
    let (Some(vs), Some(cs)) = (v.spec.as_ref(), c.spec.as_ref()) else { return false };
    let phase = v.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("");
    let want = quantity(cs.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")));
    let have = quantity(vs.capacity.as_ref().and_then(|c| c.get("storage")));
    let modes = vs.access_modes.clone().unwrap_or_default();
    phase == "Available"
        && vs.claim_ref.is_none()
        && v.metadata.deletion_timestamp.is_none()
        && vs.storage_class_name.as_deref().unwrap_or("") == cs.storage_class_name.as_deref().unwrap_or("")
        && have >= want
        && cs.access_modes.iter().flatten().all(|m| modes.contains(m))
}

fn affinity(v: &PersistentVolume) -> Option<NodeSelector> {
    v.spec.as_ref()?.node_affinity.as_ref()?.required.clone()
}

/// Digest the pod's claims (`claims`: name → the claim, None when it does not exist).
pub fn pod_volumes(
    claim_names: &[String],
    claims: &HashMap<String, Option<PersistentVolumeClaim>>,
    volumes: &[PersistentVolume],
    classes: &[StorageClass],
) -> PodVolumes {
    let mut out = PodVolumes::default();
    for name in claim_names {
        let Some(Some(c)) = claims.get(name) else {
            out.unresolvable = Some(format!("persistentvolumeclaim \"{name}\" not found"));
            return out;
        };
        if c.metadata.deletion_timestamp.is_some() {
            out.unresolvable = Some(format!("persistentvolumeclaim \"{name}\" is being deleted"));
            return out;
        }
        let spec = c.spec.clone().unwrap_or_default();
        if let Some(vname) = spec.volume_name.as_deref().filter(|v| !v.is_empty()) {
            if let Some(sel) = volumes.iter().find(|v| v.metadata.name.as_deref() == Some(vname)).and_then(affinity) {
                out.bound.push(sel);
            }
            continue;
        }
        let class_name = spec.storage_class_name.as_deref().unwrap_or("");
        let class = classes.iter().find(|k| k.metadata.name.as_deref() == Some(class_name));
        match class {
            Some(k) if k.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer") => {
                out.delayed.push(DelayedClaim {
                    name: name.clone(),
                    provisionable: !k.provisioner.is_empty() && k.provisioner != NO_PROVISIONER,
                    candidates: volumes.iter().filter(|v| could_serve(v, c)).map(affinity).collect(),
                });
            }
            _ => {
                out.unresolvable = Some(ERR_UNBOUND_IMMEDIATE.into());
                return out;
            }
        }
    }
    out
}

/// The VolumeBinding filter for one node.
pub fn filter(v: &PodVolumes, node: &str, labels: &Labels) -> Result<(), Reasons> {
    if let Some(r) = &v.unresolvable {
        return Err(vec![r.clone()]);
    }
    if v.bound.iter().any(|sel| !node_selector_matches(sel, node, labels)) {
        return Err(vec![ERR_NODE_CONFLICT.into()]);
    }
    let fits = |d: &DelayedClaim| {
        d.provisionable
            || d.candidates.iter().any(|c| c.as_ref().is_none_or(|sel| node_selector_matches(sel, node, labels)))
    };
    if !v.delayed.iter().all(fits) {
        return Err(vec![ERR_BIND_CONFLICT.into()]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(name: &str, size: &str, class: &str, node: Option<&str>, phase: &str) -> PersistentVolume {
        let mut v = json!({"metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                     "hostPath": {"path": "/x"}},
            "status": {"phase": phase}});
        if let Some(n) = node {
            v["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [n]}]}]}});
        }
        serde_json::from_value(v).unwrap()
    }

    fn pvc(class: &str, size: &str, volume: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class, "volumeName": volume,
                     "resources": {"requests": {"storage": size}}}}))
        .unwrap()
    }

    fn class(name: &str, provisioner: &str, mode: &str) -> StorageClass {
        serde_json::from_value(
            json!({"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}),
        )
        .unwrap()
    }

    fn host(n: &str) -> Labels {
        Labels::from([("kubernetes.io/hostname".to_string(), n.to_string())])
    }

    fn digest(c: Option<PersistentVolumeClaim>, vols: &[PersistentVolume]) -> PodVolumes {
        let classes = [
            class("local-path", "rancher.io/local-path", "WaitForFirstConsumer"),
            class("static", NO_PROVISIONER, "WaitForFirstConsumer"),
            class("now", "rancher.io/local-path", "Immediate"),
        ];
        pod_volumes(&["data".into()], &HashMap::from([("data".to_string(), c)]), vols, &classes)
    }

    #[test]
    fn a_bound_node_affine_volume_pins_the_pod() {
        let v =
            digest(Some(pvc("local-path", "1Gi", Some("pv1"))), &[pv("pv1", "1Gi", "local-path", Some("n1"), "Bound")]);
        assert_eq!(filter(&v, "n1", &host("n1")), Ok(()));
        assert_eq!(filter(&v, "n2", &host("n2")), Err(vec![ERR_NODE_CONFLICT.to_string()]));
        // A volume without affinity admits every node.
        let v = digest(Some(pvc("", "1Gi", Some("pv1"))), &[pv("pv1", "1Gi", "", None, "Bound")]);
        assert_eq!(filter(&v, "n2", &host("n2")), Ok(()));
    }

    #[test]
    fn wait_for_first_consumer_claims() {
        // A provisioner: any node.
        let v = digest(Some(pvc("local-path", "1Gi", None)), &[]);
        assert_eq!(filter(&v, "n2", &host("n2")), Ok(()));
        assert_eq!(v.delayed[0].name, "data");
        // No provisioner: only where a matching Available volume may be used.
        let vols = [
            pv("small", "100Mi", "static", Some("n1"), "Available"),
            pv("n2-vol", "1Gi", "static", Some("n2"), "Available"),
            pv("n3-bound", "1Gi", "static", Some("n3"), "Bound"),
        ];
        let v = digest(Some(pvc("static", "1Gi", None)), &vols);
        assert_eq!(filter(&v, "n2", &host("n2")), Ok(()));
        for n in ["n1", "n3"] {
            assert_eq!(filter(&v, n, &host(n)), Err(vec![ERR_BIND_CONFLICT.to_string()]));
        }
    }

    #[test]
    fn missing_deleting_and_unbound_immediate_claims_fit_nowhere() {
        let v = digest(None, &[]);
        assert_eq!(filter(&v, "n1", &host("n1")), Err(vec!["persistentvolumeclaim \"data\" not found".to_string()]));
        let mut deleting = pvc("local-path", "1Gi", None);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(digest(Some(deleting), &[]).unresolvable.unwrap().contains("is being deleted"));
        let v = digest(Some(pvc("now", "1Gi", None)), &[]);
        assert_eq!(filter(&v, "n1", &host("n1")), Err(vec![ERR_UNBOUND_IMMEDIATE.to_string()]));
        let v = digest(Some(pvc("", "1Gi", None)), &[]);
        assert_eq!(v.unresolvable.as_deref(), Some(ERR_UNBOUND_IMMEDIATE));
    }
}
