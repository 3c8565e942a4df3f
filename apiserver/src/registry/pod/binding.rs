//! `pods/binding`: the scheduler's placement of a pod on a node, as Kubernetes' binding REST
//! does it — the Binding body is checked ([`target`]), then the pod's `spec.nodeName` is set
//! once, with `PodScheduled=True` and the Binding's annotations ([`bound`], pure), in one
//! guarded update.

use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult, FieldError};
use crate::registry::generic::{now_rfc3339, Intent, Registry, UpdateKind, WriteOptions};
use crate::registry::set_at;
use crate::registry::ResourceDef;

/// The node a Binding body names, after Kubernetes' checks of the body.
pub fn target(binding: &Value, name: &str) -> ApiResult<String> {
    let kind = binding.get("kind").and_then(Value::as_str).unwrap_or("Binding");
    if kind != "Binding" {
        return Err(ApiError::bad_request(format!(
            "the kind in the body ({kind}) does not match the expected kind (Binding)"
        )));
    }
    let body_name = binding.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(name);
    if body_name != name {
        return Err(ApiError::bad_request("name in URL does not match name in Binding object"));
    }
    let target = binding.pointer("/target/name").and_then(Value::as_str).unwrap_or_default().to_string();
    if target.is_empty() {
        return Err(ApiError::invalid("", "Binding", name, vec![FieldError::required("target.name", "")]));
    }
    let target_kind = binding.pointer("/target/kind").and_then(Value::as_str).unwrap_or("Node");
    if !target_kind.is_empty() && target_kind != "Node" {
        return Err(ApiError::invalid(
            "",
            "Binding",
            name,
            vec![FieldError::not_supported("target.kind", &json!(target_kind), &["Node"])],
        ));
    }
    Ok(target)
}

/// The pod `current` bound to `node` by `binding` (its uid precondition and annotations),
/// or the conflict Kubernetes answers: the uid differs, the pod is being deleted, or it is
/// already on a node.
pub fn bound(current: &Value, binding: &Value, node: &str, name: &str, now: &str) -> ApiResult<Value> {
    let conflict = |why: String| ApiError::conflict("", "pods/binding", name, &why);
    if let Some(uid) = binding.pointer("/metadata/uid").and_then(Value::as_str) {
        let actual = current.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
        if actual != uid {
            return Err(conflict(format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
            )));
        }
    }
    if current.pointer("/metadata/deletionTimestamp").is_some() {
        return Err(conflict(format!("pod {name} is being deleted, cannot be assigned to a host")));
    }
    let on = current.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default();
    if !on.is_empty() {
        return Err(conflict(format!("pod {name} is already assigned to node \"{on}\"")));
    }
    let mut new = current.clone();
    set_at(&mut new, "/spec/nodeName", json!(node));
    for (k, v) in binding.pointer("/metadata/annotations").and_then(Value::as_object).into_iter().flatten() {
        set_at(&mut new, &format!("/metadata/annotations/{}", crate::registry::escape_token(k)), v.clone());
    }
    let cond = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    match new.pointer_mut("/status/conditions").and_then(Value::as_array_mut) {
        Some(list) => {
            list.retain(|c| c.get("type").and_then(Value::as_str) != Some("PodScheduled"));
            list.push(cond);
        }
        None => set_at(&mut new, "/status/conditions", json!([cond])),
    }
    Ok(new)
}

/// POST `pods/<name>/binding`.
pub async fn bind(
    reg: &Registry,
    pods: &ResourceDef,
    ns: &str,
    name: &str,
    binding: &Value,
    opts: &WriteOptions,
) -> ApiResult<()> {
    let node = target(binding, name)?;
    reg.guaranteed_update(pods, ns, name, UpdateKind::Internal, opts, |current| {
        let Some(current) = current else { return Ok(None) };
        Ok(Some(Intent { object: bound(current, binding, &node, name, &now_rfc3339())?, precondition: None }))
    })
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({"metadata": {"name": "p", "uid": "u1"}, "spec": {}, "status": {"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}})
    }

    #[test]
    fn a_binding_sets_the_node_once_with_pod_scheduled() {
        let b = json!({"metadata": {"name": "p", "annotations": {"a/b": "c"}}, "target": {"name": "n1"}});
        assert_eq!(target(&b, "p").unwrap(), "n1");
        let new = bound(&pod(), &b, "n1", "p", "T").unwrap();
        assert_eq!(new["spec"]["nodeName"], "n1");
        assert_eq!(new["metadata"]["annotations"]["a/b"], "c");
        assert_eq!(
            new["status"]["conditions"],
            json!([{"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": "T"}])
        );
        let again = bound(&new, &b, "n2", "p", "T").unwrap_err();
        assert_eq!((again.code, again.message.contains("already assigned to node \"n1\"")), (409, true));
    }

    #[test]
    fn bad_bindings_are_refused_as_kubernetes_refuses_them() {
        assert_eq!(target(&json!({"metadata": {"name": "q"}, "target": {"name": "n"}}), "p").unwrap_err().code, 400);
        assert_eq!(target(&json!({"target": {}}), "p").unwrap_err().code, 422);
        assert_eq!(target(&json!({"target": {"name": "n", "kind": "Pod"}}), "p").unwrap_err().code, 422);
        let wrong_uid = json!({"metadata": {"uid": "u2"}, "target": {"name": "n"}});
        assert!(bound(&pod(), &wrong_uid, "n", "p", "T").unwrap_err().message.contains("UID in precondition: u2"));
        let mut deleting = pod();
        deleting["metadata"]["deletionTimestamp"] = json!("T");
        assert!(bound(&deleting, &json!({}), "n", "p", "T").unwrap_err().message.contains("is being deleted"));
    }
}
