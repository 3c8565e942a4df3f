//! The local-path provisioner (`rancher.io/local-path`, as k3s and kind ship it): a volume
//! is a directory `<--local-path-dir>/<pv>_<namespace>_<claim>` on one node.
//!
//! - Provisioning only writes the PersistentVolume: a hostPath volume of type
//!   `DirectoryOrCreate` with a required node affinity to the node (the scheduler's choice
//!   for WaitForFirstConsumer, else the first ready schedulable node by name). The kubelet
//!   of that node creates the directory when a pod first mounts it, so nothing else has to
//!   reach the node.
//! - Deleting (reclaim policy Delete) runs a helper pod on that node (`nodeName` set, so no
//!   scheduling) that mounts the parent directory and removes the volume's directory; once
//!   it has Succeeded the pod and the PersistentVolume are deleted. The same path works
//!   whichever host the node is on; it needs the `--local-path-helper-image` (busybox) there.
//!
//! [`provisioned_volume`], [`helper_pod`], [`volume_node`] and [`pick_node`] are pure.

use std::collections::BTreeMap;
use std::time::Duration;

use common::events::{NORMAL, WARNING};
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, Namespace, Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, Pod, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::controller::Action;
use serde_json::json;

use super::binder::Ctx;
use super::*;
use crate::Error;

pub const PROVISIONER: &str = "rancher.io/local-path";
pub const DEFAULT_CLASS: &str = "local-path";
/// Where the helper pods run.
pub const HELPER_NAMESPACE: &str = "kube-system";
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The default StorageClass (k3s' `local-path`): WaitForFirstConsumer, so the volume is
/// made on the node the scheduler picks for the claim's first pod; Delete.
pub fn default_class() -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(DEFAULT_CLASS.into()),
            annotations: Some(BTreeMap::from([(ANN_DEFAULT_CLASS.to_string(), "true".to_string())])),
            ..Default::default()
        },
        provisioner: PROVISIONER.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..Default::default()
    }
}

/// The name a provisioned volume gets (`pvc-<claim uid>`, as upstream's provisioners name them).
pub fn volume_name(c: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", c.metadata.uid.as_deref().unwrap_or(""))
}

/// The volume for claim `c` of `class` on `node`, under `base`; an error says why none can be made.
pub fn provisioned_volume(
    c: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
    base: &str,
) -> Result<PersistentVolume, String> {
    let spec = c.spec.clone().unwrap_or_default();
    if spec.selector.is_some() {
        return Err("claim.Spec.Selector is not supported".into());
    }
    if spec.volume_mode.as_deref().is_some_and(|m| m != "Filesystem") {
        return Err("only the Filesystem volume mode is supported".into());
    }
    if c.metadata.uid.as_deref().unwrap_or("").is_empty() || node.is_empty() {
        return Err("the claim has no UID or no node was chosen".into());
    }
    if !base.starts_with('/') {
        return Err(format!("the base directory {base:?} is not absolute"));
    }
    let ns = c.metadata.namespace.clone().unwrap_or_default();
    let claim = c.metadata.name.clone().unwrap_or_default();
    let name = volume_name(c);
    let path = format!("{}/{name}_{ns}_{claim}", base.trim_end_matches('/'));
    let storage = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned()
        .unwrap_or_else(|| Quantity("0".into()));
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name),
            annotations: Some(BTreeMap::from([(ANN_PROVISIONED_BY.to_string(), PROVISIONER.to_string())])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_string(), storage)])),
            access_modes: spec.access_modes.clone(),
            persistent_volume_reclaim_policy: Some(class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into())),
            storage_class_name: class.metadata.name.clone(),
            volume_mode: Some("Filesystem".into()),
            host_path: Some(HostPathVolumeSource { path, type_: Some("DirectoryOrCreate".into()) }),
            mount_options: class.mount_options.clone(),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: HOSTNAME_LABEL.into(),
                            operator: "In".into(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            }),
            // Pre-bound to its claim, as a provisioner hands it over.
            claim_ref: Some(ObjectReference {
                kind: Some("PersistentVolumeClaim".into()),
                api_version: Some("v1".into()),
                namespace: Some(ns),
                name: Some(claim),
                uid: c.metadata.uid.clone(),
                resource_version: c.metadata.resource_version.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}

/// For Immediate binding: the first Ready node without `spec.unschedulable`, by name.
pub fn pick_node(nodes: &[Node]) -> Option<String> {
    let mut ok: Vec<&str> = nodes
        .iter()
        .filter(|n| !n.spec.as_ref().is_some_and(|s| s.unschedulable == Some(true)))
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    ok.sort();
    ok.first().map(|s| s.to_string())
}

/// The node a local-path volume lives on (its node affinity's hostname).
pub fn volume_node(v: &PersistentVolume) -> Option<String> {
    let sel = v.spec.as_ref()?.node_affinity.as_ref()?.required.as_ref()?;
    sel.node_selector_terms.iter().flat_map(|t| t.match_expressions.iter().flatten()).find_map(|r| {
        (r.key == HOSTNAME_LABEL && r.operator == "In").then(|| r.values.as_ref()?.first().cloned()).flatten()
    })
}

pub fn helper_pod_name(v: &PersistentVolume) -> String {
    format!("helper-pod-delete-{}", v.metadata.name.as_deref().unwrap_or(""))
}

/// The pod that removes a volume's directory on its node.
pub fn helper_pod(v: &PersistentVolume, image: &str) -> Result<Pod, String> {
    let node = volume_node(v).ok_or("the volume has no node affinity to a hostname")?;
    let path =
        v.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone()).ok_or("not a hostPath volume")?;
    let path = path.trim_end_matches('/');
    let (parent, dir) = path.rsplit_once('/').ok_or("the volume's path has no parent")?;
    if parent.is_empty() || dir.is_empty() || dir == "." || dir == ".." || path.split('/').any(|p| p == "..") {
        return Err(format!("refusing to delete {path:?}"));
    }
    serde_json::from_value(json!({
        "metadata": {"name": helper_pod_name(v), "namespace": HELPER_NAMESPACE,
                     "labels": {"app": "local-path-provisioner-helper"}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "volumes": [{"name": "data", "hostPath": {"path": parent, "type": "DirectoryOrCreate"}}],
            "containers": [{
                "name": "helper-pod", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["rm", "-rf", format!("/data/{dir}")],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }]
        }
    }))
    .map_err(|e| e.to_string())
}

/// Provision a volume for `c` (the claim's sync found none and asked `rancher.io/local-path`).
pub async fn provision(
    ctx: &Ctx,
    c: &PersistentVolumeClaim,
    class: &StorageClass,
    node: Option<String>,
) -> Result<(), Error> {
    let name = volume_name(c);
    if ctx.volumes.state().iter().any(|v| v.metadata.name.as_deref() == Some(name.as_str())) {
        return Ok(()); // made already; the claim binds to it
    }
    let key = format!("{}/{}", c.metadata.namespace.as_deref().unwrap_or(""), c.metadata.name.as_deref().unwrap_or(""));
    let node = match node {
        Some(n) => n,
        None => {
            let nodes = Api::<Node>::all(ctx.client.clone()).list(&ListParams::default()).await?;
            match pick_node(&nodes.items) {
                Some(n) => n,
                None => {
                    let msg = format!(
                        "failed to provision volume with StorageClass \"{}\": no ready node",
                        class.metadata.name.as_deref().unwrap_or("")
                    );
                    ctx.provisioner_recorder.event(c, WARNING, "ProvisioningFailed", msg);
                    return Ok(());
                }
            }
        }
    };
    let pv = match provisioned_volume(c, class, &node, &ctx.args.local_path_dir) {
        Ok(pv) => pv,
        Err(why) => {
            let msg = format!(
                "failed to provision volume with StorageClass \"{}\": {why}",
                class.metadata.name.as_deref().unwrap_or("")
            );
            ctx.provisioner_recorder.event(c, WARNING, "ProvisioningFailed", msg);
            return Ok(());
        }
    };
    ctx.provisioner_recorder.event(
        c,
        NORMAL,
        "Provisioning",
        format!("External provisioner is provisioning volume for claim \"{key}\""),
    );
    let created = Api::<PersistentVolume>::all(ctx.client.clone()).create(&PostParams::default(), &pv).await;
    match allow(created, 409) {
        Ok(()) => {
            tracing::info!(claim = %key, volume = %name, %node, "provisioned");
            ctx.provisioner_recorder.event(
                c,
                NORMAL,
                "ProvisioningSucceeded",
                format!("Successfully provisioned volume {name}"),
            );
            Ok(())
        }
        Err(e) => {
            ctx.provisioner_recorder.event(
                c,
                WARNING,
                "ProvisioningFailed",
                format!("failed to provision volume: {e}"),
            );
            Err(e.into())
        }
    }
}

/// Delete a released local-path volume: its directory (through the helper pod), then the object.
pub async fn delete(ctx: &Ctx, v: &PersistentVolume) -> Result<Action, Error> {
    let pv_name = v.metadata.name.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), HELPER_NAMESPACE);
    let pod_name = helper_pod_name(v);
    let Some(pod) = pods.get_opt(&pod_name).await? else {
        let pod = match helper_pod(v, &ctx.args.local_path_helper_image) {
            Ok(p) => p,
            Err(why) => {
                let msg = format!("failed to delete volume {pv_name}: {why}");
                ctx.recorder.event(v, WARNING, "VolumeFailedDelete", msg.clone());
                let patch = json!({"status": {"phase": "Failed", "message": msg}});
                Api::<PersistentVolume>::all(ctx.client.clone())
                    .patch_status(&pv_name, &Default::default(), &kube::api::Patch::Merge(&patch))
                    .await?;
                return Ok(Action::await_change());
            }
        };
        let ns = Namespace {
            metadata: ObjectMeta { name: Some(HELPER_NAMESPACE.into()), ..Default::default() },
            ..Default::default()
        };
        allow(Api::<Namespace>::all(ctx.client.clone()).create(&PostParams::default(), &ns).await, 409)?;
        allow(pods.create(&PostParams::default(), &pod).await, 409)?;
        tracing::info!(volume = %pv_name, pod = %pod_name, "deleting the volume's directory");
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    match phase {
        "Succeeded" => {
            let _ = pods.delete(&pod_name, &DeleteParams::default()).await;
            allow(
                Api::<PersistentVolume>::all(ctx.client.clone()).delete(&pv_name, &DeleteParams::default()).await,
                404,
            )?;
            tracing::info!(volume = %pv_name, "deleted");
            Ok(Action::await_change())
        }
        "Failed" => {
            let msg = format!("failed to delete volume {pv_name}: helper pod {HELPER_NAMESPACE}/{pod_name} failed");
            ctx.recorder.event(v, WARNING, "VolumeFailedDelete", msg);
            let _ = pods.delete(&pod_name, &DeleteParams::default()).await;
            Ok(Action::requeue(Duration::from_secs(10)))
        }
        _ => Ok(Action::requeue(Duration::from_secs(1))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "ns", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                     "storageClassName": "local-path"}
        }))
        .unwrap()
    }

    #[test]
    fn provisions_a_node_affine_host_path_pre_bound_to_its_claim() {
        let pv = provisioned_volume(&claim(), &default_class(), "n1", "/var/lib/lp/").unwrap();
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-u1"));
        let s = pv.spec.as_ref().unwrap();
        assert_eq!(s.host_path.as_ref().unwrap().path, "/var/lib/lp/pvc-u1_ns_data");
        assert_eq!(s.host_path.as_ref().unwrap().type_.as_deref(), Some("DirectoryOrCreate"));
        assert_eq!(s.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
        assert_eq!(s.storage_class_name.as_deref(), Some("local-path"));
        assert_eq!(s.capacity.as_ref().unwrap()["storage"].0, "1Gi");
        assert_eq!(s.claim_ref.as_ref().unwrap().uid.as_deref(), Some("u1"));
        assert_eq!(volume_node(&pv).as_deref(), Some("n1"));
        assert_eq!(annotation(&pv.metadata, ANN_PROVISIONED_BY), Some(PROVISIONER));
        let mut sel = claim();
        sel.spec.as_mut().unwrap().selector = Some(Default::default());
        assert!(provisioned_volume(&sel, &default_class(), "n1", "/x").is_err());
        assert!(provisioned_volume(&claim(), &default_class(), "n1", "relative").is_err());
    }

    #[test]
    fn the_helper_pod_removes_only_the_volume_directory_on_its_node() {
        let pv = provisioned_volume(&claim(), &default_class(), "n1", "/var/lib/lp").unwrap();
        let pod = helper_pod(&pv, "busybox").unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.volumes.unwrap()[0].host_path.as_ref().unwrap().path, "/var/lib/lp");
        assert_eq!(spec.containers[0].command.as_ref().unwrap(), &["rm", "-rf", "/data/pvc-u1_ns_data"]);
        let mut bad = pv.clone();
        bad.spec.as_mut().unwrap().host_path.as_mut().unwrap().path = "/var/lib/../..".into();
        assert!(helper_pod(&bad, "busybox").is_err());
        bad.spec.as_mut().unwrap().host_path.as_mut().unwrap().path = "/".into();
        assert!(helper_pod(&bad, "busybox").is_err());
    }

    #[test]
    fn immediate_binding_picks_the_first_ready_schedulable_node() {
        let node = |name: &str, ready: bool, unsched: bool| -> Node {
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"unschedulable": unsched},
                "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}}))
            .unwrap()
        };
        let nodes = [node("c", true, false), node("a", false, false), node("b", true, true), node("d", true, false)];
        assert_eq!(pick_node(&nodes).as_deref(), Some("c"));
        assert_eq!(pick_node(&[]), None);
    }
}
