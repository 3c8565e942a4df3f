//! The cloud node controller: a kubelet started with `--cloud-provider=external` registers
//! its Node with the taint [`UNINITIALIZED_TAINT`], which keeps ordinary pods off it until
//! this controller has asked the provider about the machine and written its
//! `spec.providerID`, instance-type and topology labels (and addresses, where the provider
//! knows better than the kubelet), and removed the taint.
//!
//! [`initialize`] is the decision (pure): the merge patch for one Node, or nothing.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::{json, Map, Value};

use crate::provider::{CloudError, InstanceMetadata, Instances};

/// Kubernetes' taint of a Node the cloud controller has not initialized yet.
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

pub fn is_uninitialized(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| t.iter().any(|t| t.key == UNINITIALIZED_TAINT))
}

/// The merge patch that initializes `node` with `meta`: providerID if it has none, the
/// labels (GA and beta names, as Kubernetes writes both), the addresses if the provider
/// gives any, and the taints without [`UNINITIALIZED_TAINT`] (with the resourceVersion, so
/// a concurrent change of the taints is not lost). None for an initialized Node.
pub fn initialize(node: &Node, meta: &InstanceMetadata) -> Option<Value> {
    if !is_uninitialized(node) {
        return None;
    }
    let mut labels = Map::new();
    let mut label = |keys: &[&str], v: &Option<String>| {
        if let Some(v) = v.as_ref().filter(|v| !v.is_empty()) {
            for k in keys {
                labels.insert(k.to_string(), json!(v));
            }
        }
    };
    label(&["node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"], &meta.instance_type);
    label(&["topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone"], &meta.zone);
    label(&["topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region"], &meta.region);
    let spec = node.spec.clone().unwrap_or_default();
    let taints: Vec<Value> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != UNINITIALIZED_TAINT)
        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
        .collect();
    let mut spec_patch = json!({"taints": if taints.is_empty() { Value::Null } else { json!(taints) }});
    if spec.provider_id.as_deref().is_none_or(str::is_empty) && !meta.provider_id.is_empty() {
        spec_patch["providerID"] = json!(meta.provider_id);
    }
    let mut patch = json!({
        "metadata": {"labels": labels, "resourceVersion": node.metadata.resource_version},
        "spec": spec_patch,
    });
    if !meta.addresses.is_empty() {
        patch["status"] = json!({"addresses": meta.addresses});
    }
    Some(patch)
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("asking the provider about the node: {0}")]
    Cloud(#[from] CloudError),
}

struct Ctx {
    client: kube::Client,
    instances: Arc<dyn Instances>,
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if !is_uninitialized(&node) {
        return Ok(Action::await_change());
    }
    let meta = ctx.instances.metadata(&node).await?;
    let Some(patch) = initialize(&node, &meta) else { return Ok(Action::await_change()) };
    let name = node.metadata.name.clone().unwrap_or_default();
    let api: Api<Node> = Api::all(ctx.client.clone());
    let status = patch.get("status").cloned();
    let mut main = patch;
    if let Some(m) = main.as_object_mut() {
        m.remove("status");
    }
    if let Some(status) = status {
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({ "status": status }))).await?;
    }
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&main)).await?;
    tracing::info!(node = %name, provider_id = %meta.provider_id, "initialized node");
    Ok(Action::await_change())
}

pub async fn run(client: kube::Client, instances: Arc<dyn Instances>) {
    let ctx = Arc::new(Ctx { client: client.clone(), instances });
    Controller::new(Api::<Node>::all(client), watcher::Config::default())
        .run(
            reconcile,
            |node, e, _| {
                tracing::warn!(node = ?node.metadata.name, error = %e, "node initialization failed");
                Action::requeue(Duration::from_secs(5))
            },
            ctx,
        )
        .for_each(|r| async move { crate::metrics::sync("cloud-node", r.is_ok()) })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_uninitialized_node_gets_its_provider_id_labels_and_loses_only_that_taint() {
        let n = node(json!({
            "metadata": {"name": "n1", "resourceVersion": "7"},
            "spec": {"taints": [
                {"key": UNINITIALIZED_TAINT, "value": "true", "effect": "NoSchedule"},
                {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}
        }));
        let meta = InstanceMetadata {
            provider_id: "local://n1".into(),
            instance_type: Some("local".into()),
            region: Some("lab".into()),
            zone: None,
            addresses: vec![],
        };
        let p = initialize(&n, &meta).unwrap();
        assert_eq!(p["spec"]["providerID"], "local://n1");
        assert_eq!(p["spec"]["taints"], json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]));
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(p["metadata"]["labels"]["node.kubernetes.io/instance-type"], "local");
        assert_eq!(p["metadata"]["labels"]["topology.kubernetes.io/region"], "lab");
        assert_eq!(p["metadata"]["labels"]["failure-domain.beta.kubernetes.io/region"], "lab");
        assert!(p["metadata"]["labels"].get("topology.kubernetes.io/zone").is_none(), "no zone, no label");
        assert!(p.get("status").is_none(), "the kubelet's addresses stay");
    }

    #[test]
    fn an_initialized_node_is_left_alone_and_a_set_provider_id_is_kept() {
        let meta = InstanceMetadata { provider_id: "local://n1".into(), ..Default::default() };
        assert_eq!(initialize(&node(json!({"metadata": {"name": "n1"}})), &meta), None);
        let n = node(json!({"metadata": {"name": "n1"}, "spec": {"providerID": "kind://x",
            "taints": [{"key": UNINITIALIZED_TAINT, "effect": "NoSchedule"}]}}));
        let p = initialize(&n, &meta).unwrap();
        assert!(p["spec"].get("providerID").is_none());
        assert_eq!(p["spec"]["taints"], Value::Null, "the last taint goes");
    }
}
