//! The `scale` subresource (autoscaling/v1 `Scale`) of every kind whose strategy reports one
//! (Deployment, ReplicaSet, StatefulSet, ReplicationController, custom resources with a scale
//! subresource): read as a Scale, written by changing `spec.replicas` of the object.

use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult, FieldError};
use crate::patch::PatchType;
use crate::registry::generic::{Intent, Outcome, Registry, UpdateKind, WriteOptions};
use crate::registry::set_at;
use crate::registry::ResourceDef;

/// How a client writes a Scale.
pub enum ScaleWrite<'a> {
    /// PUT of a whole Scale.
    Replace(Value),
    /// PATCH of the current Scale.
    Patch(PatchType, &'a [u8]),
}

/// Write `spec.replicas` through the Scale of `res`/`name`; answers the new Scale.
pub async fn update(
    reg: &Registry,
    res: &ResourceDef,
    ns: &str,
    name: &str,
    write: ScaleWrite<'_>,
    opts: &WriteOptions,
) -> ApiResult<Value> {
    let out: Outcome = reg
        .guaranteed_update(res, ns, name, UpdateKind::Internal, opts, |current| {
            let Some(current) = current else { return Ok(None) };
            let cur_scale = scale_of(res, current)?;
            let desired = match &write {
                ScaleWrite::Replace(b) => b.clone(),
                ScaleWrite::Patch(pt, bytes) => {
                    crate::patch::apply(*pt, &cur_scale, bytes, ("autoscaling", "v1", "Scale"))?
                }
            };
            let (replicas, precondition) = check_scale(&desired, &cur_scale, name)?;
            let mut new = current.clone();
            set_at(&mut new, "/spec/replicas", json!(replicas));
            Ok(Some(Intent { object: new, precondition }))
        })
        .await?;
    scale_of(res, &out.object)
}

pub fn scale_of(res: &ResourceDef, obj: &Value) -> ApiResult<Value> {
    let info = res
        .strategy
        .scale_info(obj)
        .ok_or_else(|| ApiError::not_found_message("the server could not find the requested resource"))?;
    let meta = obj.get("metadata").cloned().unwrap_or(json!({}));
    let mut m = json!({});
    for f in ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"] {
        if let Some(v) = meta.get(f) {
            m[f] = v.clone();
        }
    }
    Ok(json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": m,
        "spec": {"replicas": info.spec_replicas},
        "status": {"replicas": info.status_replicas, "selector": info.selector},
    }))
}

/// Validate a desired Scale: returns spec.replicas and the resourceVersion precondition.
pub fn check_scale(desired: &Value, current: &Value, name: &str) -> ApiResult<(i64, Option<i64>)> {
    let kind = desired.get("kind").and_then(Value::as_str).unwrap_or("Scale");
    if kind != "Scale" {
        return Err(ApiError::bad_request(format!(
            "the kind in the body ({kind}) does not match the expected kind (Scale)"
        )));
    }
    let body_name = desired.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(name);
    super::name_matches_url(body_name, name)?;
    let replicas = match desired.pointer("/spec/replicas") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_i64().ok_or_else(|| ApiError::bad_request("Scale.spec.replicas must be an integer"))?,
    };
    if replicas < 0 || replicas > i32::MAX as i64 {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            name,
            vec![FieldError::invalid("spec.replicas", &json!(replicas), "must be greater than or equal to 0")],
        ));
    }
    let cur_rv = current.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default();
    let precondition = match desired.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
        Some(rv) if !rv.is_empty() && rv != cur_rv => crate::resourceversion::parse(rv)?,
        Some(rv) => crate::resourceversion::parse(rv).ok().flatten(),
        _ => None,
    };
    Ok((replicas, precondition))
}
