//! Client-side apply's three-way merge (kubectl's `CreateThreeWayMergePatch`): from the
//! last-applied configuration (original), the new manifest (modified) and the live object
//! (current), the patch that makes current match modified and removes what the user
//! removed since the last apply — and nothing else, so fields the server or other writers
//! set survive. Strategic form (`$setElementOrder`, `$patch: delete` for lists merged by
//! key) for built-in kinds, JSON merge patch form for CRDs. Pure.

use serde_json::{Map, Value};

/// The annotation client-side apply keeps the last applied manifest in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The manifest with its last-applied annotation set (compact JSON with sorted keys and a
/// trailing newline, as kubectl writes it); returns (modified object, annotation value).
pub fn with_last_applied(manifest: &Value) -> (Value, String) {
    let mut clean = manifest.clone();
    // Like kubectl: the recorded copy has the annotation map (possibly empty) without itself.
    if let Some(meta) = clean.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta.entry("annotations").or_insert_with(|| Value::Object(Map::new()));
        if let Some(a) = annotations.as_object_mut() {
            a.remove(LAST_APPLIED);
        }
    }
    let mut annotation = go_json(&crate::print::sorted(&clean));
    annotation.push('\n');
    let mut modified = clean;
    if let Some(a) = modified.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        a.insert(LAST_APPLIED.to_string(), Value::String(annotation.clone()));
    }
    (modified, annotation)
}

/// Compact JSON escaped the way Go's encoding/json does (`<`, `>`, `&`, U+2028, U+2029).
pub fn go_json(v: &Value) -> String {
    serde_json::to_string(v)
        .unwrap_or_default()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// The last-applied configuration recorded on a live object, if any.
pub fn last_applied(current: &Value) -> Option<Value> {
    let s = current.pointer("/metadata/annotations")?.get(LAST_APPLIED)?.as_str()?;
    serde_json::from_str(s).ok()
}

/// Which patch dialect to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Strategic,
    Merge,
}

/// The three-way patch; an empty object means "unchanged".
pub fn three_way(original: Option<&Value>, modified: &Value, current: &Value, dialect: Dialect) -> Value {
    let empty = Map::new();
    let m = modified.as_object().unwrap_or(&empty);
    Value::Object(diff_map(original.and_then(Value::as_object), m, current.as_object(), dialect))
}

fn diff_map(
    orig: Option<&Map<String, Value>>,
    modi: &Map<String, Value>,
    cur: Option<&Map<String, Value>>,
    d: Dialect,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, mv) in modi {
        let cv = cur.and_then(|c| c.get(k));
        let ov = orig.and_then(|o| o.get(k));
        match (mv, cv) {
            (Value::Object(mm), Some(Value::Object(cm))) => {
                let sub = diff_map(ov.and_then(Value::as_object), mm, Some(cm), d);
                if !sub.is_empty() {
                    out.insert(k.clone(), Value::Object(sub));
                }
            }
            (Value::Array(ml), Some(Value::Array(cl))) => {
                let ol = ov.and_then(Value::as_array);
                diff_list(k, ol, ml, cl, d, &mut out);
            }
            _ => {
                if cv != Some(mv) {
                    out.insert(k.clone(), mv.clone());
                }
            }
        }
    }
    if let Some(o) = orig {
        for k in o.keys() {
            if !modi.contains_key(k) && cur.is_some_and(|c| c.contains_key(k)) {
                out.insert(k.clone(), Value::Null);
            }
        }
    }
    out
}

/// Whether `modified` (with `original`) asks for any change to `current`.
fn changed(orig: Option<&Value>, modi: &Value, cur: &Value, d: Dialect) -> bool {
    match (modi, cur) {
        (Value::Object(mm), Value::Object(cm)) => {
            !diff_map(orig.and_then(Value::as_object), mm, Some(cm), d).is_empty()
        }
        (Value::Array(ml), Value::Array(cl)) => {
            let mut tmp = Map::new();
            diff_list("", orig.and_then(Value::as_array), ml, cl, d, &mut tmp);
            !tmp.is_empty()
        }
        _ => modi != cur,
    }
}

fn diff_list(
    field: &str,
    orig: Option<&Vec<Value>>,
    modi: &[Value],
    cur: &[Value],
    d: Dialect,
    out: &mut Map<String, Value>,
) {
    let key = if d == Dialect::Strategic { merge_key(field, modi.first().or(cur.first())) } else { None };
    let Some(key) = key else {
        // Replaced as a whole when any element changed (positionally).
        let differs = modi.len() != cur.len()
            || modi.iter().zip(cur).enumerate().any(|(i, (m, c))| changed(orig.and_then(|o| o.get(i)), m, c, d));
        if differs {
            out.insert(field.to_string(), Value::Array(modi.to_vec()));
        }
        return;
    };
    let find = |list: &[Value], kv: &Value| list.iter().find(|e| e.get(key) == Some(kv)).cloned();
    let mut entries = Vec::new();
    for e in modi {
        let Some(kv) = e.get(key) else {
            out.insert(field.to_string(), Value::Array(modi.to_vec()));
            return;
        };
        match find(cur, kv) {
            None => entries.push(e.clone()),
            Some(ce) => {
                let oe = orig.and_then(|o| find(o, kv));
                if let (Some(em), Some(cm)) = (e.as_object(), ce.as_object()) {
                    let mut sub = diff_map(oe.as_ref().and_then(Value::as_object), em, Some(cm), d);
                    if !sub.is_empty() {
                        sub.insert(key.to_string(), kv.clone());
                        entries.push(Value::Object(sub));
                    }
                }
            }
        }
    }
    for oe in orig.into_iter().flatten() {
        if let Some(kv) = oe.get(key) {
            if find(modi, kv).is_none() && find(cur, kv).is_some() {
                let mut del = Map::new();
                del.insert(key.to_string(), kv.clone());
                del.insert("$patch".into(), Value::String("delete".into()));
                entries.push(Value::Object(del));
            }
        }
    }
    let mod_keys: Vec<&Value> = modi.iter().filter_map(|e| e.get(key)).collect();
    let cur_order: Vec<&Value> = cur.iter().filter_map(|e| e.get(key)).filter(|k| mod_keys.contains(k)).collect();
    if entries.is_empty() && mod_keys == cur_order {
        return;
    }
    let order: Vec<Value> = mod_keys
        .iter()
        .map(|kv| {
            let mut m = Map::new();
            m.insert(key.to_string(), (*kv).clone());
            Value::Object(m)
        })
        .collect();
    out.insert(format!("$setElementOrder/{field}"), Value::Array(order));
    if !entries.is_empty() {
        out.insert(field.to_string(), Value::Array(entries));
    }
}

/// The strategic-merge key of a list field of the built-in kinds.
pub fn merge_key(field: &str, sample: Option<&Value>) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(image: &str, extra_env: bool) -> Value {
        let mut env = vec![json!({"name": "A", "value": "1"})];
        if extra_env {
            env.push(json!({"name": "B", "value": "2"}));
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "x"}},
               "spec": {"containers": [{"name": "c", "image": image, "env": env}]}})
    }

    /// The live object: the applied manifest plus server defaults and status.
    fn live(applied: &Value) -> Value {
        let mut l = applied.clone();
        l["metadata"]["uid"] = json!("u");
        l["spec"]["containers"][0]["terminationMessagePath"] = json!("/dev/termination-log");
        l["spec"]["restartPolicy"] = json!("Always");
        l["status"] = json!({"phase": "Pending"});
        l
    }

    #[test]
    fn annotation_is_sorted_json_with_newline() {
        let (m, a) = with_last_applied(&json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p"}}));
        assert_eq!(a, "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"annotations\":{},\"name\":\"p\"}}\n");
        assert_eq!(m["metadata"]["annotations"][LAST_APPLIED], json!(a));
        assert_eq!(
            last_applied(&m),
            Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"annotations": {}, "name": "p"}}))
        );
        assert_eq!(go_json(&json!({"c": "a > b & <c>"})), r#"{"c":"a \u003e b \u0026 \u003cc\u003e"}"#);
    }

    #[test]
    fn unchanged_when_only_defaults_differ() {
        let (m, _) = with_last_applied(&pod("busybox", false));
        let cur = live(&m);
        let orig = last_applied(&cur);
        assert_eq!(three_way(orig.as_ref(), &m, &cur, Dialect::Strategic), json!({}));
        assert_eq!(three_way(orig.as_ref(), &m, &cur, Dialect::Merge), json!({}));
    }

    #[test]
    fn change_in_merge_keyed_list() {
        let (m1, _) = with_last_applied(&pod("busybox", true));
        let cur = live(&m1);
        let (m2, a2) = with_last_applied(&pod("nginx", false));
        let p = three_way(last_applied(&cur).as_ref(), &m2, &cur, Dialect::Strategic);
        assert_eq!(
            p,
            json!({
                "metadata": {"annotations": {LAST_APPLIED: a2}},
                "spec": {
                    "$setElementOrder/containers": [{"name": "c"}],
                    "containers": [{
                        "name": "c",
                        "image": "nginx",
                        "$setElementOrder/env": [{"name": "A"}],
                        "env": [{"name": "B", "$patch": "delete"}],
                    }],
                },
            })
        );
    }

    #[test]
    fn removed_field_is_deleted_and_others_kept() {
        let (m1, _) = with_last_applied(&pod("busybox", false));
        let cur = live(&m1);
        let mut next = pod("busybox", false);
        next["metadata"].as_object_mut().unwrap().remove("labels");
        let (m2, _) = with_last_applied(&next);
        let p = three_way(last_applied(&cur).as_ref(), &m2, &cur, Dialect::Merge);
        assert_eq!(p["metadata"]["labels"], Value::Null);
        assert!(p["metadata"].as_object().unwrap().contains_key("labels"));
        assert!(p.get("spec").is_none(), "{p}");
        assert!(p.get("status").is_none());
    }

    #[test]
    fn plain_lists_replace_whole() {
        let cur = json!({"spec": {"args": ["a", "b"], "rules": [{"host": "h", "x": 1}]}});
        let m = json!({"spec": {"args": ["a"], "rules": [{"host": "h"}]}});
        let p = three_way(None, &m, &cur, Dialect::Strategic);
        assert_eq!(p, json!({"spec": {"args": ["a"]}}));
    }
}
