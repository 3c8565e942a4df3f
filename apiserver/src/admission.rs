//! Admission that needs other objects, run on the request path before the strategy (which
//! never looks anything up). Each rule is a pure function of the object and what was read
//! for it; `server.rs` reads and calls.
//!
//! - DefaultStorageClass: a PersistentVolumeClaim created without `spec.storageClassName`
//!   (absent, not `""`: that asks for no class) gets the default StorageClass — the one
//!   annotated `storageclass.kubernetes.io/is-default-class: "true"`, the newest (then the
//!   first by name) when several are.

use serde_json::Value;

pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

/// The default class's name among `classes` (StorageClass objects), if any.
pub fn default_storage_class(classes: &[Value]) -> Option<String> {
    let mut defaults: Vec<(&str, &str)> = classes
        .iter()
        .filter(|c| {
            c.pointer("/metadata/annotations")
                .and_then(|a| a.get(ANN_DEFAULT_CLASS))
                .and_then(Value::as_str)
                .is_some_and(|v| v == "true")
        })
        .filter_map(|c| {
            let name = c.pointer("/metadata/name")?.as_str()?;
            let created = c.pointer("/metadata/creationTimestamp").and_then(Value::as_str).unwrap_or("");
            Some((created, name))
        })
        .collect();
    // Newest first (RFC 3339 times of one format sort as text), then by name.
    defaults.sort_by(|a, b| b.0.cmp(a.0).then(a.1.cmp(b.1)));
    defaults.first().map(|(_, n)| n.to_string())
}

/// Does this claim ask for the default class (no `spec.storageClassName` at all)?
pub fn wants_default_class(claim: &Value) -> bool {
    claim.pointer("/spec/storageClassName").is_none_or(Value::is_null)
}

/// Set the claim's class to `default` when it names none.
pub fn admit_claim(claim: &mut Value, default: Option<&str>) {
    if let (true, Some(d)) = (wants_default_class(claim), default) {
        if let Some(spec) = claim.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("storageClassName".into(), Value::String(d.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, default: bool, created: &str) -> Value {
        let ann = if default { json!({ANN_DEFAULT_CLASS: "true"}) } else { json!({ANN_DEFAULT_CLASS: "false"}) };
        json!({"metadata": {"name": name, "annotations": ann, "creationTimestamp": created}})
    }

    #[test]
    fn the_newest_default_class_wins() {
        assert_eq!(default_storage_class(&[]), None);
        assert_eq!(default_storage_class(&[class("a", false, "2024-01-01T00:00:00Z")]), None);
        let classes = [
            class("old", true, "2024-01-01T00:00:00Z"),
            class("new", true, "2024-06-01T00:00:00Z"),
            class("plain", false, "2025-01-01T00:00:00Z"),
        ];
        assert_eq!(default_storage_class(&classes).as_deref(), Some("new"));
    }

    #[test]
    fn only_a_claim_without_a_class_gets_the_default() {
        let mut none = json!({"spec": {"accessModes": ["ReadWriteOnce"]}});
        admit_claim(&mut none, Some("local-path"));
        assert_eq!(none["spec"]["storageClassName"], "local-path");
        let mut empty = json!({"spec": {"storageClassName": ""}});
        admit_claim(&mut empty, Some("local-path"));
        assert_eq!(empty["spec"]["storageClassName"], "");
        let mut named = json!({"spec": {"storageClassName": "fast"}});
        admit_claim(&mut named, Some("local-path"));
        assert_eq!(named["spec"]["storageClassName"], "fast");
        let mut no_default = json!({"spec": {}});
        admit_claim(&mut no_default, None);
        assert!(no_default["spec"].get("storageClassName").is_none());
    }
}
