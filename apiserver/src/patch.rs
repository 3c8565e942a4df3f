//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386), and strategic merge
//! patch. Pure functions.
//!
//! Strategic merge patch here is driven by a table of list merge keys by field name
//! (`containers` merge by `name`, `volumeMounts` by `mountPath` …) rather than by the
//! per-type schema Kubernetes uses; it supports the `$patch: delete|replace` and
//! `$setElementOrder`/`$retainKeys`/`$deleteFromPrimitiveList` directives kubectl sends.
//! TODO: drive merge keys from the OpenAPI schema (x-kubernetes-patch-merge-key) once
//! /openapi is served, so lists that share a field name but not a merge key are exact.

use serde_json::{Map, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        match base.as_str() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchError {
    /// The body is not a patch of this type (400).
    Decode(String),
    /// The patch does not apply to the object (422).
    Apply(String),
}

pub fn apply(kind: PatchType, doc: &Value, body: &[u8]) -> Result<Value, PatchError> {
    match kind {
        PatchType::Json => {
            let patch: json_patch::Patch =
                serde_json::from_slice(body).map_err(|e| PatchError::Decode(format!("error decoding patch: {e}")))?;
            let mut out = doc.clone();
            json_patch::patch(&mut out, &patch).map_err(|e| PatchError::Apply(e.to_string()))?;
            Ok(out)
        }
        PatchType::Merge => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| PatchError::Decode(format!("error decoding patch: {e}")))?;
            if !patch.is_object() {
                return Err(PatchError::Decode("error decoding patch: merge patch must be a JSON object".into()));
            }
            let mut out = doc.clone();
            json_patch::merge(&mut out, &patch);
            Ok(out)
        }
        PatchType::Strategic => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| PatchError::Decode(format!("error decoding patch: {e}")))?;
            if !patch.is_object() {
                return Err(PatchError::Decode(
                    "error decoding patch: strategic merge patch must be a JSON object".into(),
                ));
            }
            strategic_merge(doc, &patch, "").map_err(PatchError::Apply)
        }
        PatchType::Apply => Err(PatchError::Decode("server-side apply is not supported yet".into())),
    }
}

/// Merge key of a list field, by field name (None: the list is replaced).
fn merge_key(field: &str, sample: Option<&Value>) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "containerStatuses"
        | "initContainerStatuses" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" => Some("type"),
        "addresses" if sample.is_some_and(|s| s.get("type").is_some() && s.get("address").is_some()) => Some("type"),
        "hostAliases" => Some("ip"),
        "topologySpreadConstraints" => Some("topologyKey"),
        "ownerReferences" => Some("uid"),
        "ports" => match sample {
            Some(s) if s.get("containerPort").is_some() => Some("containerPort"),
            Some(s) if s.get("port").is_some() => Some("port"),
            _ => None,
        },
        _ => None,
    }
}

/// Primitive lists that merge as sets.
fn merges_primitives(field: &str) -> bool {
    matches!(field, "finalizers")
}

fn strategic_merge(doc: &Value, patch: &Value, field: &str) -> Result<Value, String> {
    let (Some(patch_map), true) = (patch.as_object(), true) else {
        return Ok(patch.clone());
    };
    if patch_map.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut m = patch_map.clone();
        m.remove("$patch");
        return Ok(Value::Object(m));
    }
    let mut out: Map<String, Value> = doc.as_object().cloned().unwrap_or_default();
    // $retainKeys: drop keys not listed.
    if let Some(keep) = patch_map.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        out.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, pv) in patch_map {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(list_field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(cur)), Some(del)) = (out.get_mut(list_field), pv.as_array()) {
                cur.retain(|v| !del.contains(v));
            }
            continue;
        }
        if pv.is_null() {
            out.remove(k);
            continue;
        }
        let cur = out.get(k).cloned().unwrap_or(Value::Null);
        let merged = match (pv, &cur) {
            (Value::Object(pm), _) if pm.get("$patch").and_then(Value::as_str) == Some("delete") => {
                out.remove(k);
                continue;
            }
            (Value::Object(_), Value::Object(_)) | (Value::Object(_), Value::Null) => strategic_merge(&cur, pv, k)?,
            (Value::Array(pl), Value::Array(cl)) => {
                merge_list(k, cl, pl, patch_map.get(&format!("$setElementOrder/{k}")))?
            }
            _ => strip_directives(pv),
        };
        out.insert(k.clone(), merged);
    }
    let _ = field;
    Ok(Value::Object(out))
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k.clone(), strip_directives(v))).collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn merge_list(field: &str, cur: &[Value], patch: &[Value], order: Option<&Value>) -> Result<Value, String> {
    if merges_primitives(field) {
        let mut out = cur.to_vec();
        for v in patch {
            if !out.contains(v) {
                out.push(v.clone());
            }
        }
        return Ok(Value::Array(out));
    }
    // A `{"$patch": "replace"}` element replaces the whole list.
    if patch.iter().any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace")) {
        return Ok(Value::Array(patch.iter().filter(|p| p.get("$patch").is_none()).map(strip_directives).collect()));
    }
    let Some(key) = merge_key(field, patch.first().or(cur.first())) else {
        return Ok(Value::Array(patch.iter().map(strip_directives).collect()));
    };
    let mut out: Vec<Value> = cur.to_vec();
    for p in patch {
        let Some(kv) = p.get(key) else {
            return Err(format!("map: {p} does not contain declared merge key: {key}"));
        };
        let pos = out.iter().position(|c| c.get(key) == Some(kv));
        if p.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(i) = pos {
                out.remove(i);
            }
            continue;
        }
        match pos {
            Some(i) => out[i] = strategic_merge(&out[i], p, field)?,
            None => out.push(strategic_merge(&Value::Null, p, field)?),
        }
    }
    // $setElementOrder gives the final order of the listed elements.
    if let Some(order) = order.and_then(Value::as_array) {
        let rank = |v: &Value| order.iter().position(|o| o.get(key).is_some() && o.get(key) == v.get(key));
        out.sort_by_key(|v| rank(v).unwrap_or(usize::MAX));
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types() {
        assert_eq!(PatchType::from_content_type("application/merge-patch+json; charset=utf-8"), Some(PatchType::Merge));
        assert_eq!(PatchType::from_content_type("application/json-patch+json"), Some(PatchType::Json));
        assert_eq!(PatchType::from_content_type("text/plain"), None);
    }

    #[test]
    fn merge_and_json_patch() {
        let doc = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        let out = apply(PatchType::Merge, &doc, br#"{"metadata":{"labels":{"a":null,"c":"3"}}}"#).unwrap();
        assert_eq!(out, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
        let out =
            apply(PatchType::Json, &doc, br#"[{"op":"replace","path":"/metadata/labels/a","value":"9"}]"#).unwrap();
        assert_eq!(out["metadata"]["labels"]["a"], "9");
        assert!(matches!(apply(PatchType::Json, &doc, b"{"), Err(PatchError::Decode(_))));
        assert!(matches!(
            apply(PatchType::Json, &doc, br#"[{"op":"test","path":"/metadata/labels/a","value":"x"}]"#),
            Err(PatchError::Apply(_))
        ));
        assert!(matches!(apply(PatchType::Merge, &doc, b"[1]"), Err(PatchError::Decode(_))));
    }

    #[test]
    fn strategic_containers_by_name() {
        let doc = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        let patch = br#"{"spec":{"$setElementOrder/containers":[{"name":"b"},{"name":"a"}],"containers":[{"name":"a","image":"z"}]}}"#;
        let out = apply(PatchType::Strategic, &doc, patch).unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "b", "image": "y"}, {"name": "a", "image": "z"}]));
        let del = br#"{"spec":{"containers":[{"name":"a","$patch":"delete"}]}}"#;
        let out = apply(PatchType::Strategic, &doc, del).unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "b", "image": "y"}]));
    }

    #[test]
    fn strategic_other_lists_replace() {
        let doc = json!({"spec": {"args": ["a", "b"]}, "metadata": {"finalizers": ["x"]}});
        let out =
            apply(PatchType::Strategic, &doc, br#"{"spec":{"args":["c"]},"metadata":{"finalizers":["y"]}}"#).unwrap();
        assert_eq!(out["spec"]["args"], json!(["c"]));
        assert_eq!(out["metadata"]["finalizers"], json!(["x", "y"]));
        let out = apply(PatchType::Strategic, &doc, br#"{"metadata":{"$deleteFromPrimitiveList/finalizers":["x"]}}"#)
            .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!([]));
    }
}
