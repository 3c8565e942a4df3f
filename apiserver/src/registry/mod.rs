//! Registry: one generic store for every kind ([`generic`]) plus one small strategy per kind
//! ([`kinds`]) saying only what is special about it — Kubernetes' registry/strategy idea.

use serde_json::{Map, Value};

use crate::error::FieldError;
use crate::validation::NameRule;

pub mod apply;
pub mod crd;
pub mod generic;
pub mod kinds;
pub mod pod;
pub mod service;
pub mod workloads;

/// What is special about one kind. Every method is pure; the generic store does the I/O.
pub trait Strategy: Send + Sync + 'static {
    /// How `metadata.name` is validated.
    fn name_rule(&self) -> NameRule {
        NameRule::Dns1123Subdomain
    }
    /// Defaults and server-set fields on create (after uid/timestamps are set). Status is
    /// already cleared for kinds with a status subresource unless `keep_status_on_create`.
    fn prepare_for_create(&self, _obj: &mut Value) {}
    /// Called on a main-resource update. `new.status` has already been reset to the old one
    /// for kinds with a status subresource.
    fn prepare_for_update(&self, _new: &mut Value, _old: &Value) {}
    /// Kind-specific validation of a whole object (metadata is validated generically).
    fn validate(&self, _obj: &Value) -> Vec<FieldError> {
        vec![]
    }
    /// Kind-specific validation of an update: by default `validate(new)`.
    fn validate_update(&self, new: &Value, _old: &Value) -> Vec<FieldError> {
        self.validate(new)
    }
    /// Field-selector value of a kind-specific field; None = not supported.
    fn field_value(&self, _obj: &Value, _field: &str) -> Option<String> {
        None
    }
    /// Keep a client-provided status on create (Nodes, Events …).
    fn keep_status_on_create(&self) -> bool {
        false
    }
    /// Whether `metadata.generation` is maintained (bumped on spec changes).
    fn tracks_generation(&self) -> bool {
        true
    }
    /// PUT of a missing object creates it.
    fn allow_create_on_update(&self) -> bool {
        false
    }
    /// Graceful deletion: Some(seconds > 0) to mark the object and let its owner (the
    /// kubelet) finish the delete; None or Some(0) deletes at once.
    fn graceful_delete_seconds(&self, _obj: &Value, _requested: Option<i64>) -> Option<i64> {
        None
    }
    /// Delete answers the deleted object instead of a Status.
    fn return_deleted_object(&self) -> bool {
        false
    }
    /// Something besides `metadata.finalizers` keeps the object from going away at once
    /// (Namespace: `spec.finalizers`).
    fn deletion_blocked(&self, _obj: &Value) -> bool {
        false
    }
    /// Called when the object is marked for deletion (deletionTimestamp set).
    fn on_deletion_marked(&self, _obj: &mut Value) {}
    /// Service IP / node port allocation applies to this kind.
    fn allocates_service_addresses(&self) -> bool {
        false
    }
    /// The scale subresource: (spec.replicas, status.replicas, label selector string).
    fn scale_info(&self, _obj: &Value) -> Option<ScaleInfo> {
        None
    }
}

#[derive(Clone, Debug)]
pub struct ScaleInfo {
    pub spec_replicas: i64,
    pub status_replicas: i64,
    pub selector: String,
}

// ----------------------------------------------------------------- small JSON helpers

pub fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

/// Set `pointer` to `value` if absent or null, creating intermediate objects.
pub fn default_at(obj: &mut Value, pointer: &str, value: Value) {
    if obj.pointer(pointer).is_some_and(|v| !v.is_null()) {
        return;
    }
    set_at(obj, pointer, value);
}

/// Set `pointer` to `value`, creating intermediate objects (replacing scalars). Numeric
/// tokens index into existing arrays.
pub fn set_at(obj: &mut Value, pointer: &str, value: Value) {
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    let mut cur = obj;
    for (i, p) in parts.iter().enumerate() {
        let last = i == parts.len() - 1;
        if let Value::Array(arr) = cur {
            let Some(slot) = p.parse::<usize>().ok().and_then(|idx| arr.get_mut(idx)) else { return };
            if last {
                *slot = value;
                return;
            }
            cur = slot;
            continue;
        }
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Some(map) = cur.as_object_mut() else { return };
        let p = unescape_token(p);
        if last {
            map.insert(p, value);
            return;
        }
        cur = map.entry(p).or_insert_with(|| Value::Object(Map::new()));
    }
}

pub fn remove_at(obj: &mut Value, pointer: &str) -> Option<Value> {
    let (parent, last) = pointer.rsplit_once('/')?;
    let parent = if parent.is_empty() { Some(obj) } else { obj.pointer_mut(parent) };
    parent.and_then(Value::as_object_mut).and_then(|m| m.remove(&unescape_token(last)))
}

/// JSON-pointer token unescaping (`~1` is `/`, `~0` is `~`).
fn unescape_token(t: &str) -> String {
    t.replace("~1", "/").replace("~0", "~")
}

/// JSON-pointer token escaping.
pub fn escape_token(t: &str) -> String {
    t.replace('~', "~0").replace('/', "~1")
}

/// The object without metadata, status, apiVersion and kind: what a generation tracks.
pub fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        for k in ["metadata", "status", "apiVersion", "kind"] {
            m.remove(k);
        }
    }
    v
}

/// The common field-selector fields.
pub fn common_field_value(obj: &Value, field: &str) -> Option<String> {
    match field {
        "metadata.name" => Some(str_at(obj, "/metadata/name").unwrap_or_default().to_string()),
        "metadata.namespace" => Some(str_at(obj, "/metadata/namespace").unwrap_or_default().to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointers() {
        let mut v = json!({});
        default_at(&mut v, "/spec/replicas", json!(1));
        assert_eq!(v, json!({"spec": {"replicas": 1}}));
        default_at(&mut v, "/spec/replicas", json!(3));
        assert_eq!(v["spec"]["replicas"], 1);
        set_at(&mut v, "/spec/replicas", json!(3));
        assert_eq!(v["spec"]["replicas"], 3);
        assert_eq!(remove_at(&mut v, "/spec/replicas"), Some(json!(3)));
        let mut p = json!({"spec": {"ports": [{"port": 80}]}});
        set_at(&mut p, "/spec/ports/0/nodePort", json!(30001));
        assert_eq!(p, json!({"spec": {"ports": [{"port": 80, "nodePort": 30001}]}}));
        set_at(&mut p, "/metadata/labels/a~1b", json!("x"));
        assert_eq!(p["metadata"]["labels"]["a/b"], "x");
        assert_eq!(
            spec_part(&json!({"kind": "X", "metadata": {}, "spec": {"a": 1}, "status": {}})),
            json!({"spec": {"a": 1}})
        );
    }
}
