//! Strategic merge patch (`application/strategic-merge-patch+json`), as
//! `k8s.io/apimachinery/pkg/util/strategicpatch` applies it.
//!
//! How a list merges comes from the OpenAPI schema of the object, not from a hand-kept table:
//! a property's `x-kubernetes-patch-strategy` (`merge`, `replace`, `retainKeys`, or a
//! comma-separated combination) and `x-kubernetes-patch-merge-key`. Lists without the `merge`
//! strategy are replaced; lists of maps with it merge element-wise by the merge key; lists of
//! primitives with it merge as sets. Maps merge recursively unless their strategy is `replace`.
//!
//! Directives: `$patch: replace|delete|merge` (in maps and as list elements),
//! `$setElementOrder/<list>`, `$retainKeys`, `$deleteFromPrimitiveList/<list>`.
//! A `null` value deletes a key.
//!
//! The schema is a JSON value in OpenAPI form (`properties`, `items`, `additionalProperties`,
//! `$ref` into a definitions map, `allOf: [{$ref}]`), see [`Schema`].

use serde_json::{Map, Value};

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER_PREFIX: &str = "$setElementOrder/";
const DELETE_PRIMITIVE_PREFIX: &str = "$deleteFromPrimitiveList/";

/// Named schemas that `$ref`s point into (keyed by definition name; the last segment of a
/// reference is the name). A map holds them all; an apiserver may parse them on demand.
pub trait Definitions: Sync {
    fn definition(&self, name: &str) -> Option<&Value>;
}

impl Definitions for Map<String, Value> {
    fn definition(&self, name: &str) -> Option<&Value> {
        self.get(name)
    }
}

/// A position in an OpenAPI schema: the node and the definitions `$ref`s point into.
/// `node: None` means "no schema known" (maps merge, lists replace).
#[derive(Clone, Copy)]
pub struct Schema<'a> {
    defs: Option<&'a dyn Definitions>,
    node: Option<&'a Value>,
}

impl std::fmt::Debug for Schema<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema").field("node", &self.node).finish_non_exhaustive()
    }
}

/// The patch metadata of one field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PatchMeta {
    pub merge_key: Option<String>,
    pub strategies: Vec<String>,
}

impl PatchMeta {
    fn has(&self, s: &str) -> bool {
        self.strategies.iter().any(|x| x == s)
    }
    /// Read the `x-kubernetes-patch-*` extensions of a property schema.
    pub fn of(node: &Value) -> PatchMeta {
        PatchMeta {
            merge_key: node.get("x-kubernetes-patch-merge-key").and_then(Value::as_str).map(String::from),
            strategies: node
                .get("x-kubernetes-patch-strategy")
                .and_then(Value::as_str)
                .map(|s| s.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect())
                .unwrap_or_default(),
        }
    }
}

impl<'a> Schema<'a> {
    /// No schema: maps merge recursively, lists are replaced.
    pub fn none() -> Schema<'static> {
        Schema { defs: None, node: None }
    }

    /// `node` with `$ref`s resolved against `defs`.
    pub fn new(defs: &'a dyn Definitions, node: &'a Value) -> Self {
        Schema { defs: Some(defs), node: Some(node) }
    }

    fn resolve(&self) -> Option<&'a Value> {
        let mut node = self.node?;
        for _ in 0..16 {
            let reference = node.get("$ref").and_then(Value::as_str).or_else(|| {
                node.get("allOf")
                    .and_then(Value::as_array)
                    .filter(|a| a.len() == 1)
                    .and_then(|a| a[0].get("$ref"))
                    .and_then(Value::as_str)
            });
            match reference {
                Some(r) => {
                    let name = r.rsplit('/').next().unwrap_or(r);
                    node = self.defs?.definition(name)?;
                }
                None => return Some(node),
            }
        }
        None
    }

    fn at(&self, node: Option<&'a Value>) -> Schema<'a> {
        Schema { defs: self.defs, node }
    }

    /// The schema and patch metadata of a map entry (a property, or the values of a map).
    pub fn field(&self, name: &str) -> (Schema<'a>, PatchMeta) {
        let Some(node) = self.resolve() else { return (self.at(None), PatchMeta::default()) };
        let prop = node
            .get("properties")
            .and_then(|p| p.get(name))
            .or_else(|| node.get("additionalProperties").filter(|a| a.is_object()));
        match prop {
            Some(p) => (self.at(Some(p)), PatchMeta::of(p)),
            None => (self.at(None), PatchMeta::default()),
        }
    }

    /// Whether this is a struct (an object with declared properties, like `spec`), not a
    /// map (`labels`, `data`): field ownership counts a map as a member, a struct not.
    pub fn is_struct(&self) -> bool {
        self.resolve().and_then(|n| n.get("properties")).and_then(Value::as_object).is_some_and(|p| !p.is_empty())
    }

    /// The schema of a list's elements.
    pub fn items(&self) -> Schema<'a> {
        self.at(self.resolve().and_then(|n| n.get("items")))
    }
}

/// Why a strategic merge patch does not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchError(pub String);

impl std::fmt::Display for PatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PatchError {}

/// Apply a strategic merge patch to `original`, both JSON objects.
pub fn strategic_merge_patch(original: &Value, patch: &Value, schema: Schema<'_>) -> Result<Value, PatchError> {
    let Some(patch) = patch.as_object() else {
        return Err(PatchError("strategic merge patch must be a JSON object".into()));
    };
    let original = original.as_object().cloned().unwrap_or_default();
    merge_map(original, patch, schema).map(Value::Object)
}

fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    schema: Schema<'_>,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(d) = patch.get(DIRECTIVE) {
        match d.as_str() {
            Some("replace") => {
                let mut p = patch.clone();
                p.remove(DIRECTIVE);
                return Ok(strip_map(&p));
            }
            Some("delete") => return Ok(Map::new()),
            Some("merge") => {}
            _ => return Err(PatchError(format!("Unexpected: unknown patch type: {}, in map: {}", d, json(patch)))),
        }
    }
    if let Some(keep) = patch.get(RETAIN_KEYS) {
        let keep = keep
            .as_array()
            .ok_or_else(|| PatchError(format!("invalid patch: $retainKeys must be a list, got {keep}")))?;
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        for k in patch.keys().filter(|k| !k.starts_with('$')) {
            if !keep.contains(&k.as_str()) {
                return Err(PatchError(format!(
                    "The value in $retainKeys does not match the key in patch: {k} is not in {keep:?}"
                )));
            }
        }
        original.retain(|k, _| keep.contains(&k.as_str()));
    }
    // $deleteFromPrimitiveList/<key>
    for (k, v) in patch {
        let Some(list_key) = k.strip_prefix(DELETE_PRIMITIVE_PREFIX) else { continue };
        let del = v.as_array().ok_or_else(|| PatchError(format!("invalid patch: {k} must be a list, got {v}")))?;
        if let Some(Value::Array(cur)) = original.get_mut(list_key) {
            cur.retain(|x| !del.contains(x));
        }
    }
    for (k, pv) in patch {
        if k.starts_with('$') {
            continue;
        }
        if pv.is_null() {
            original.remove(k);
            continue;
        }
        let (sub, meta) = schema.field(k);
        let order = patch.get(&format!("{SET_ORDER_PREFIX}{k}")).and_then(Value::as_array);
        let merged = match (original.remove(k), pv) {
            (Some(Value::Object(o)), Value::Object(p)) if !meta.has("replace") => Value::Object(merge_map(o, p, sub)?),
            (None, Value::Object(p)) => Value::Object(merge_map(Map::new(), p, sub)?),
            (Some(Value::Array(o)), Value::Array(p)) => merge_list(o, p, sub.items(), &meta, order)?,
            (None, Value::Array(p)) => merge_list(Vec::new(), p, sub.items(), &meta, order)?,
            (_, other) => strip(other),
        };
        // A map emptied by `$patch: delete` disappears.
        if matches!(pv.get(DIRECTIVE).and_then(Value::as_str), Some("delete")) {
            continue;
        }
        original.insert(k.clone(), merged);
    }
    // $setElementOrder for a list the patch did not touch.
    for (k, order) in patch {
        let Some(list_key) = k.strip_prefix(SET_ORDER_PREFIX) else { continue };
        if patch.contains_key(list_key) {
            continue;
        }
        let (_, meta) = schema.field(list_key);
        if let (Some(Value::Array(cur)), Some(order)) = (original.get_mut(list_key), order.as_array()) {
            let items = std::mem::take(cur);
            *cur = reorder(items, order, meta.merge_key.as_deref());
        }
    }
    Ok(original)
}

fn merge_list(
    original: Vec<Value>,
    patch: &[Value],
    items: Schema<'_>,
    meta: &PatchMeta,
    order: Option<&Vec<Value>>,
) -> Result<Value, PatchError> {
    // `[{"$patch": "replace"}, …]` replaces the list whatever its strategy.
    if patch.iter().any(|p| p.get(DIRECTIVE).and_then(Value::as_str) == Some("replace")) {
        return Ok(Value::Array(patch.iter().filter(|p| p.get(DIRECTIVE).is_none()).map(strip).collect()));
    }
    if !meta.has("merge") {
        return Ok(Value::Array(patch.iter().map(strip).collect()));
    }
    let is_maps = patch.iter().chain(original.iter()).any(Value::is_object);
    let mut out = original;
    if !is_maps {
        for p in patch {
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        return Ok(Value::Array(match order {
            Some(order) => reorder(out, order, None),
            None => out,
        }));
    }
    let Some(key) = meta.merge_key.as_deref() else {
        return Err(PatchError("merging lists of maps requires a patch merge key".into()));
    };
    for p in patch {
        let Some(pm) = p.as_object() else {
            return Err(PatchError(format!("unable to merge a non-map element {p} into a list of maps")));
        };
        let directive = pm.get(DIRECTIVE).and_then(Value::as_str);
        let Some(kv) = pm.get(key) else {
            return Err(PatchError(format!("map: {} does not contain declared merge key: {key}", json(pm))));
        };
        let pos = out.iter().position(|c| c.get(key) == Some(kv));
        match directive {
            Some("delete") => {
                if let Some(i) = pos {
                    out.remove(i);
                }
                continue;
            }
            None | Some("merge") => {}
            Some(other) => {
                return Err(PatchError(format!("Unexpected: unknown patch type: {other}, in map: {}", json(pm))))
            }
        }
        match pos {
            Some(i) => {
                let cur = match out[i].take() {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                out[i] = Value::Object(merge_map(cur, pm, items)?);
            }
            None => out.push(Value::Object(merge_map(Map::new(), pm, items)?)),
        }
    }
    Ok(Value::Array(match order {
        Some(order) => reorder(out, order, Some(key)),
        None => out,
    }))
}

/// Order `items` as `$setElementOrder` lists them (by merge key for maps, by value for
/// primitives); items it does not mention keep their relative order after the listed ones.
fn reorder(items: Vec<Value>, order: &[Value], key: Option<&str>) -> Vec<Value> {
    let ident = |v: &Value| -> Option<Value> {
        match key {
            Some(k) => v.get(k).cloned(),
            None => Some(v.clone()),
        }
    };
    let rank = |v: &Value| -> usize {
        let id = ident(v);
        order.iter().position(|o| id.is_some() && ident(o) == id).unwrap_or(usize::MAX)
    };
    let mut indexed: Vec<(usize, usize, Value)> =
        items.into_iter().enumerate().map(|(i, v)| (rank(&v), i, v)).collect();
    indexed.sort_by_key(|(r, i, _)| (*r, *i));
    indexed.into_iter().map(|(_, _, v)| v).collect()
}

/// A patch value with directives and nulls removed (what lands in the object when there
/// is nothing to merge into).
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip_map(m)),
        Value::Array(a) => Value::Array(a.iter().filter(|x| x.get(DIRECTIVE).is_none()).map(strip).collect()),
        other => other.clone(),
    }
}

fn strip_map(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter().filter(|(k, v)| !k.starts_with('$') && !v.is_null()).map(|(k, v)| (k.clone(), strip(v))).collect()
}

fn json(m: &Map<String, Value>) -> String {
    serde_json::to_string(m).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A small schema in the shape of Kubernetes' PodSpec / Container definitions.
    fn defs() -> Map<String, Value> {
        let v = json!({
            "Pod": {"type": "object", "properties": {
                "metadata": {"$ref": "#/definitions/ObjectMeta"},
                "spec": {"allOf": [{"$ref": "#/definitions/PodSpec"}], "description": "spec"}
            }},
            "ObjectMeta": {"type": "object", "properties": {
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-patch-strategy": "merge"}
            }},
            "PodSpec": {"type": "object", "properties": {
                "containers": {"type": "array", "items": {"$ref": "#/definitions/Container"},
                               "x-kubernetes-patch-merge-key": "name", "x-kubernetes-patch-strategy": "merge"},
                "volumes": {"type": "array", "items": {"$ref": "#/definitions/Volume"},
                            "x-kubernetes-patch-merge-key": "name", "x-kubernetes-patch-strategy": "merge,retainKeys"},
                "tolerations": {"type": "array", "items": {"type": "object"}},
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"},
                                 "x-kubernetes-patch-strategy": "replace"}
            }},
            "Container": {"type": "object", "properties": {
                "name": {"type": "string"},
                "image": {"type": "string"},
                "args": {"type": "array", "items": {"type": "string"}},
                "env": {"type": "array", "items": {"$ref": "#/definitions/EnvVar"},
                        "x-kubernetes-patch-merge-key": "name", "x-kubernetes-patch-strategy": "merge"},
                "ports": {"type": "array", "items": {"type": "object"},
                          "x-kubernetes-patch-merge-key": "containerPort", "x-kubernetes-patch-strategy": "merge"}
            }},
            "EnvVar": {"type": "object", "properties": {"name": {"type": "string"}, "value": {"type": "string"}}},
            "Volume": {"type": "object", "properties": {
                "name": {"type": "string"}, "emptyDir": {"type": "object"}, "hostPath": {"type": "object"}
            }}
        });
        v.as_object().cloned().unwrap_or_default()
    }

    fn pod_patch(original: Value, patch: Value) -> Result<Value, PatchError> {
        let d = defs();
        let root = d["Pod"].clone();
        strategic_merge_patch(&original, &patch, Schema::new(&d, &root))
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let out = pod_patch(
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
        )
        .unwrap();
        assert_eq!(out, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
    }

    #[test]
    fn lists_of_maps_merge_by_key_and_keep_order() {
        let original = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
            {"name": "b", "image": "b:1"}
        ]}});
        let out = pod_patch(
            original.clone(),
            json!({"spec": {"containers": [{"name": "a", "image": "a:2"}, {"name": "c", "image": "c:1"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([
                {"name": "a", "image": "a:2", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
                {"name": "b", "image": "b:1"},
                {"name": "c", "image": "c:1"}
            ])
        );
        // Deleting one env var by merge key, as kubectl apply does when a var leaves the file.
        let out = pod_patch(
            original,
            json!({"spec": {"containers": [{"name": "a", "env": [{"name": "X", "$patch": "delete"}],
                   "$setElementOrder/env": [{"name": "Y"}]}],
                   "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"][0]["env"], json!([{"name": "Y", "value": "2"}]));
        assert_eq!(out["spec"]["containers"][1]["name"], "b");
    }

    #[test]
    fn lists_without_merge_strategy_are_replaced() {
        let out = pod_patch(
            json!({"spec": {"tolerations": [{"key": "a"}], "containers": [{"name": "a", "args": ["x", "y"]}]}}),
            json!({"spec": {"tolerations": [{"key": "b"}], "containers": [{"name": "a", "args": ["z"]}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "b"}]));
        assert_eq!(out["spec"]["containers"][0]["args"], json!(["z"]));
    }

    #[test]
    fn unknown_fields_merge_maps_and_replace_lists() {
        let out = strategic_merge_patch(
            &json!({"x": {"a": 1, "l": [1, 2]}}),
            &json!({"x": {"b": 2, "l": [3]}}),
            Schema::none(),
        )
        .unwrap();
        assert_eq!(out, json!({"x": {"a": 1, "b": 2, "l": [3]}}));
    }

    #[test]
    fn primitive_merge_lists_are_sets() {
        let original = json!({"metadata": {"finalizers": ["a", "b"]}});
        let out = pod_patch(original.clone(), json!({"metadata": {"finalizers": ["b", "c"]}})).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        let out =
            pod_patch(original.clone(), json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}})).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
        let out = pod_patch(original, json!({"metadata": {"$setElementOrder/finalizers": ["b", "a"]}})).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "a"]));
    }

    #[test]
    fn patch_replace_directive() {
        // In a map: the map becomes the patch.
        let out = pod_patch(
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            json!({"metadata": {"labels": {"$patch": "replace", "c": "3"}}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"c": "3"}));
        // In a merging list: the list becomes the other elements.
        let out = pod_patch(
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}),
            json!({"spec": {"containers": [{"$patch": "replace"}, {"name": "c"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "c"}]));
    }

    #[test]
    fn patch_delete_directive_on_a_map() {
        let out = pod_patch(
            json!({"metadata": {"labels": {"a": "1"}}, "spec": {}}),
            json!({"metadata": {"labels": {"$patch": "delete"}}}),
        )
        .unwrap();
        assert_eq!(out, json!({"metadata": {}, "spec": {}}));
    }

    #[test]
    fn replace_strategy_on_a_map() {
        let out =
            pod_patch(json!({"spec": {"nodeSelector": {"a": "1"}}}), json!({"spec": {"nodeSelector": {"b": "2"}}}))
                .unwrap();
        assert_eq!(out["spec"]["nodeSelector"], json!({"b": "2"}));
    }

    #[test]
    fn retain_keys_drops_other_fields_of_a_union() {
        let out = pod_patch(
            json!({"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}),
            json!({"spec": {"volumes": [{"name": "v", "hostPath": {"path": "/x"},
                   "$retainKeys": ["hostPath", "name"]}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["volumes"], json!([{"name": "v", "hostPath": {"path": "/x"}}]));
        let bad = pod_patch(
            json!({"spec": {"volumes": [{"name": "v"}]}}),
            json!({"spec": {"volumes": [{"name": "v", "hostPath": {}, "$retainKeys": ["name"]}]}}),
        );
        assert!(bad.is_err());
    }

    #[test]
    fn set_element_order_reorders_merged_list() {
        let out = pod_patch(
            json!({"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]}}),
            json!({"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                   "containers": [{"name": "a", "image": "3"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "b", "image": "2"}, {"name": "a", "image": "3"}]));
    }

    #[test]
    fn missing_merge_key_is_an_error() {
        let err = pod_patch(json!({"spec": {"containers": []}}), json!({"spec": {"containers": [{"image": "x"}]}}));
        assert!(err.unwrap_err().0.contains("does not contain declared merge key: name"));
    }

    #[test]
    fn merge_key_other_than_name() {
        let out = pod_patch(
            json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80, "name": "http"}]}]}}),
            json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80, "protocol": "TCP"},
                   {"containerPort": 443}]}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"][0]["ports"],
            json!([{"containerPort": 80, "name": "http", "protocol": "TCP"}, {"containerPort": 443}])
        );
    }

    #[test]
    fn new_values_lose_directives_and_nulls() {
        let out = pod_patch(json!({}), json!({"metadata": {"labels": {"a": "1", "b": null}}})).unwrap();
        assert_eq!(out, json!({"metadata": {"labels": {"a": "1"}}}));
    }
}
