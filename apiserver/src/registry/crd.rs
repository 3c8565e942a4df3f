//! CustomResourceDefinitions (apiextensions.k8s.io/v1): the CRD kind's strategy, the
//! resource definitions a CRD makes served, and the strategy of custom resources —
//! openAPIV3Schema defaulting and pruning (validation: [`super::crd_schema`]), status and
//! scale subresources. Pure; [`crate::crds`] keeps the served set in step with storage.

use serde_json::{json, Value};

use super::crd_schema::{check_crd_schema, Validator};
use super::{ScaleInfo, Strategy};
use crate::error::FieldError;
use crate::registry::{CustomInfo, ResourceDef, Sub};

/// The finalizer a CRD carries while its custom resources are deleted.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Set (or replace) a status condition of a CRD, keeping its transition time when the
/// status does not change.
pub fn set_condition(crd: &mut Value, type_: &str, status: &str, reason: &str, message: &str) {
    let now = super::generic::now_rfc3339();
    if !crd.get("status").is_some_and(Value::is_object) {
        crd["status"] = json!({});
    }
    let conds = &mut crd["status"]["conditions"];
    if !conds.is_array() {
        *conds = json!([]);
    }
    let Some(list) = conds.as_array_mut() else { return };
    let new = |since: Value| json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since});
    match list.iter_mut().find(|c| c["type"] == type_) {
        Some(c) => {
            let since = if c["status"] == status { c["lastTransitionTime"].clone() } else { json!(now) };
            *c = new(since);
        }
        None => list.push(new(json!(now))),
    }
}

/// The CustomResourceDefinition kind.
pub struct CrdStrategy;

pub static CRD: CrdStrategy = CrdStrategy;

impl Strategy for CrdStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        // Names are accepted and the CRD is established at once (no controller loop).
        let names = obj.pointer("/spec/names").cloned().unwrap_or(json!({}));
        let now = super::generic::now_rfc3339();
        let stored: Vec<Value> = obj
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .filter_map(|v| v.get("name").cloned())
            .collect();
        obj["status"] = json!({
            "acceptedNames": names,
            "storedVersions": stored,
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
        });
    }
    fn deletion_finalizers(&self) -> &'static [&'static str] {
        &[CLEANUP_FINALIZER]
    }
    fn on_deletion_marked(&self, obj: &mut Value) {
        set_condition(
            obj,
            "Terminating",
            "True",
            "InstanceDeletionPending",
            "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
        );
    }
    fn prepare_for_update(&self, new: &mut Value, old: &Value) {
        if let Some(names) = new.pointer("/spec/names").cloned() {
            if let Some(st) = new.get_mut("status").and_then(Value::as_object_mut) {
                st.insert("acceptedNames".into(), names);
            }
        }
        let _ = old;
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
        let (group, plural, kind) = (s("/spec/group"), s("/spec/names/plural"), s("/spec/names/kind"));
        if group.is_empty() {
            errs.push(FieldError::required("spec.group", ""));
        } else if !group.contains('.') {
            errs.push(FieldError::invalid("spec.group", &json!(group), "should be a domain with at least one dot"));
        }
        if plural.is_empty() {
            errs.push(FieldError::required("spec.names.plural", ""));
        }
        if kind.is_empty() {
            errs.push(FieldError::required("spec.names.kind", ""));
        }
        let name = s("/metadata/name");
        if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
            errs.push(FieldError::invalid("metadata.name", &json!(name), "must be spec.names.plural+\".\"+spec.group"));
        }
        match s("/spec/scope").as_str() {
            "Namespaced" | "Cluster" => {}
            other => errs.push(FieldError::not_supported("spec.scope", &json!(other), &["Cluster", "Namespaced"])),
        }
        let versions = obj.pointer("/spec/versions").and_then(Value::as_array).cloned().unwrap_or_default();
        if versions.is_empty() {
            errs.push(FieldError::required("spec.versions", "must have exactly one version marked as storage version"));
        } else if versions.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true)).count() != 1 {
            errs.push(FieldError::invalid(
                "spec.versions",
                &json!(versions.len()),
                "must have exactly one version marked as storage version",
            ));
        }
        for (i, v) in versions.iter().enumerate() {
            if let Some(schema) = v.pointer("/schema/openAPIV3Schema") {
                check_crd_schema(schema, &format!("spec.versions[{i}].schema.openAPIV3Schema"), &mut errs);
            }
        }
        errs
    }
}

/// The strategy of one custom resource version.
pub struct CustomStrategy {
    /// The version's schema, with its CEL rules and patterns compiled.
    pub validator: Validator,
    pub scale: Option<(String, String, String)>,
}

impl Strategy for CustomStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        apply_defaults(obj, self.validator.schema());
    }
    fn prepare_for_update(&self, new: &mut Value, _old: &Value) {
        apply_defaults(new, self.validator.schema());
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        self.validator.validate(obj, None)
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        self.validator.validate(new, Some(old))
    }
    fn validate_status_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        self.validator.validate(new, Some(old))
    }
    fn scale_info(&self, obj: &Value) -> Option<ScaleInfo> {
        let (spec, status, selector) = self.scale.as_ref()?;
        Some(ScaleInfo {
            spec_replicas: json_path(obj, spec).and_then(Value::as_i64).unwrap_or(0),
            status_replicas: json_path(obj, status).and_then(Value::as_i64).unwrap_or(0),
            selector: json_path(obj, selector).and_then(Value::as_str).unwrap_or_default().to_string(),
        })
    }
}

/// Fill in `default`s from the schema, recursively (Kubernetes defaults on read and write).
pub fn apply_defaults(v: &mut Value, schema: &Value) {
    match v {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, ps) in props {
                    if !m.contains_key(k) {
                        if let Some(d) = ps.get("default") {
                            m.insert(k.clone(), d.clone());
                        }
                    }
                    if let Some(child) = m.get_mut(k) {
                        apply_defaults(child, ps);
                    }
                }
            } else if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for child in m.values_mut() {
                    apply_defaults(child, ap);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                for child in a.iter_mut() {
                    apply_defaults(child, items);
                }
            }
        }
        _ => {}
    }
}

/// A simple JSONPath as printer columns and scale paths use: `.spec.replicas`,
/// `.status.conditions[0].type`.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    for part in path.trim_start_matches('.').split('.').filter(|p| !p.is_empty()) {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !name.is_empty() {
            cur = cur.get(name)?;
        }
        if let Some(i) = index {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Drop fields the structural schema does not know (unless it preserves unknown fields), as
/// the apiextensions apiserver prunes them; `apiVersion`, `kind` and `metadata` stay.
pub fn prune(v: &mut Value, schema: &Value, root: bool) {
    if schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true)
        && schema.get("properties").is_none()
    {
        return;
    }
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let preserve = schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
            m.retain(|k, _| {
                (root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                    || props.is_some_and(|p| p.contains_key(k))
                    || additional.is_some()
                    || preserve
            });
            for (k, x) in m.iter_mut() {
                if root && k == "metadata" {
                    continue;
                }
                if let Some(ps) = props.and_then(|p| p.get(k)) {
                    prune(x, ps, false);
                } else if let Some(ap) = additional {
                    prune(x, ap, false);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = schema.get("items") {
                a.iter_mut().for_each(|x| prune(x, items, false));
            }
        }
        _ => {}
    }
}

/// The typed decode of a custom resource: prune by the schema of its version.
fn normalize_custom(res: &ResourceDef, v: &Value) -> Result<Value, String> {
    let mut v = v.clone();
    if let Some(info) = res.custom {
        prune(&mut v, &info.schema, true);
    }
    if v.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err("metadata: expected an object".into());
    }
    Ok(v)
}

#[cfg(test)]
fn no_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    g.subschema_for::<serde_json::Value>()
}

/// The resource definitions a CRD serves (one per served version). Leaks: called only when
/// a CRD changes.
pub fn resource_defs(crd: &Value) -> Vec<&'static ResourceDef> {
    let s = |p: &str| crd.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    let group = leak(s("/spec/group"));
    let plural = s("/spec/names/plural");
    let kind = s("/spec/names/kind");
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return vec![];
    }
    let singular = match s("/spec/names/singular") {
        x if x.is_empty() => kind.to_lowercase(),
        x => x,
    };
    let strs = |p: &str| -> &'static [&'static str] {
        let v: Vec<&'static str> = crd
            .pointer(p)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|x| leak(x.to_string()))
            .collect();
        Box::leak(v.into_boxed_slice())
    };
    let short_names = strs("/spec/names/shortNames");
    let categories = strs("/spec/names/categories");
    let namespaced = s("/spec/scope") != "Cluster";
    let (plural, kind, singular) = (leak(plural), leak(kind), leak(singular));
    let storage = leak(format!("{group}/{plural}"));
    let terminating = crd.pointer("/metadata/deletionTimestamp").is_some();
    let versions = crd.pointer("/spec/versions").and_then(Value::as_array).cloned().unwrap_or_default();
    let is_served = |v: &Value| v.get("served").and_then(Value::as_bool) != Some(false);
    // The storage version, if served (otherwise every version is served as stored).
    let storage_version = versions
        .iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true) && is_served(v))
        .and_then(|v| v.get("name").and_then(Value::as_str))
        .map(|v| leak(v.to_string()));
    let mut out = Vec::new();
    for v in crd.pointer("/spec/versions").and_then(Value::as_array).into_iter().flatten() {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let Some(version) = v.get("name").and_then(Value::as_str) else { continue };
        let mut subs: Vec<Sub> = Vec::new();
        if v.pointer("/subresources/status").is_some() {
            subs.push(Sub::Status);
        }
        let scale = v.pointer("/subresources/scale").map(|sc| {
            let p = |k: &str| sc.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            (p("specReplicasPath"), p("statusReplicasPath"), p("labelSelectorPath"))
        });
        if scale.is_some() {
            subs.push(Sub::Scale);
        }
        let schema = v.pointer("/schema/openAPIV3Schema").cloned().unwrap_or(json!({}));
        let columns: Vec<(String, String, String, i64)> = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| {
                let g = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                (g("name"), g("type"), g("jsonPath"), c.get("priority").and_then(Value::as_i64).unwrap_or(0))
            })
            .collect();
        let strategy: &'static CustomStrategy =
            Box::leak(Box::new(CustomStrategy { validator: Validator::new(schema.clone()), scale }));
        let version: &'static str = leak(version.to_string());
        let storage_version = storage_version.filter(|s| *s != version);
        let custom: &'static CustomInfo =
            Box::leak(Box::new(CustomInfo { printer_columns: columns, schema, terminating, storage_version }));
        out.push(&*Box::leak(Box::new(ResourceDef {
            group,
            version,
            kind,
            plural,
            singular,
            short_names,
            categories,
            namespaced,
            subresources: Box::leak(subs.into_boxed_slice()),
            storage,
            strategy,
            normalize: normalize_custom,
            #[cfg(test)]
            schema: no_schema,
            custom: Some(custom),
        })));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({"metadata": {"name": "crontabs.stable.example.com"}, "spec": {
            "group": "stable.example.com", "scope": "Namespaced",
            "names": {"plural": "crontabs", "singular": "crontab", "kind": "CronTab", "shortNames": ["ct"]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                "additionalPrinterColumns": [{"name": "Spec", "type": "string", "jsonPath": ".spec.cronSpec"}],
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object",
                    "required": ["cronSpec"],
                    "properties": {"cronSpec": {"type": "string"}, "replicas": {"type": "integer", "default": 1},
                                   "mode": {"type": "string", "enum": ["a", "b"]}}}}}}}]}})
    }

    #[test]
    fn a_crd_serves_its_versions() {
        let defs = resource_defs(&crd());
        assert_eq!(defs.len(), 1);
        let d = defs[0];
        assert_eq!((d.group, d.version, d.plural, d.kind), ("stable.example.com", "v1", "crontabs", "CronTab"));
        assert!(d.namespaced && d.has_status() && d.has_sub("scale").is_some());
        assert_eq!(d.short_names, &["ct"]);
        assert!(CRD.validate(&crd()).is_empty());
    }

    #[test]
    fn a_deleted_crd_is_marked_terminating_and_serves_no_creates() {
        let mut c = crd();
        CRD.prepare_for_create(&mut c);
        assert_eq!(CRD.deletion_finalizers(), &[CLEANUP_FINALIZER]);
        CRD.on_deletion_marked(&mut c);
        let cond = |c: &Value, t: &str| {
            c["status"]["conditions"].as_array().unwrap().iter().find(|x| x["type"] == t).cloned().unwrap()
        };
        assert_eq!(cond(&c, "Terminating")["reason"], "InstanceDeletionPending");
        let since = cond(&c, "Terminating")["lastTransitionTime"].clone();
        set_condition(
            &mut c,
            "Terminating",
            "True",
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress",
        );
        assert_eq!(cond(&c, "Terminating")["reason"], "InstanceDeletionInProgress");
        assert_eq!(cond(&c, "Terminating")["lastTransitionTime"], since, "same status, same transition time");
        assert_eq!(cond(&c, "Established")["status"], "True", "other conditions kept");
        assert!(!resource_defs(&c)[0].custom.unwrap().terminating);
        c["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(resource_defs(&c)[0].custom.unwrap().terminating);
    }

    #[test]
    fn custom_resources_are_defaulted_and_validated() {
        let d = resource_defs(&crd())[0];
        let mut obj = json!({"metadata": {"name": "x"}, "spec": {"cronSpec": "* * * * *"}});
        d.strategy.prepare_for_create(&mut obj);
        assert_eq!(obj["spec"]["replicas"], 1);
        assert!(d.strategy.validate(&obj).is_empty());
        let bad = json!({"spec": {"replicas": "many", "mode": "c"}});
        let errs = d.strategy.validate(&bad);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, vec!["spec.cronSpec", "spec.mode", "spec.replicas"]);
        assert_eq!(d.strategy.scale_info(&obj).map(|s| s.spec_replicas), Some(1));
    }

    #[test]
    fn pruning_keeps_known_and_preserved_fields() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"a": {"type": "string"}}},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}}});
        let mut v = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n", "labels": {"q": "r"}},
                           "spec": {"a": "1", "b": 2}, "status": {"any": {"thing": 1}}, "labels": {"k": "v"}, "top": 1});
        prune(&mut v, &schema, true);
        assert_eq!(
            v,
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n", "labels": {"q": "r"}},
                             "spec": {"a": "1"}, "status": {"any": {"thing": 1}}, "labels": {"k": "v"}})
        );
    }

    #[test]
    fn json_paths() {
        let o = json!({"spec": {"a": [{"b": 1}]}});
        assert_eq!(json_path(&o, ".spec.a[0].b"), Some(&json!(1)));
        assert_eq!(json_path(&o, ".spec.x"), None);
    }
}
