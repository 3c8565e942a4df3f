//! Output formats shared by the commands: `-o json|yaml|name|wide|jsonpath=…|custom-columns=…`,
//! kubectl's tab-aligned tables and human ages. Pure functions.

pub mod columns;
pub mod jsonpath;
pub mod table;
pub mod tabwriter;
pub mod yaml;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{KubectlError, Result};

/// A parsed `-o/--output` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Table,
    Wide,
    Json,
    Yaml,
    Name,
    JsonPath(String),
    CustomColumns(String),
}

impl Output {
    pub fn parse(s: Option<&str>) -> Result<Output> {
        let Some(s) = s else { return Ok(Output::Table) };
        if let Some(t) = s.strip_prefix("jsonpath=").or_else(|| s.strip_prefix("jsonpath-as-json=")) {
            return Ok(Output::JsonPath(t.to_string()));
        }
        if let Some(t) = s.strip_prefix("custom-columns=") {
            return Ok(Output::CustomColumns(t.to_string()));
        }
        match s {
            "" => Ok(Output::Table),
            "wide" => Ok(Output::Wide),
            "json" => Ok(Output::Json),
            "yaml" => Ok(Output::Yaml),
            "name" => Ok(Output::Name),
            other => Err(KubectlError::msg(format!(
                "unable to match a printer suitable for the output format \"{other}\", allowed formats are: custom-columns,custom-columns-file,go-template,go-template-file,json,jsonpath,jsonpath-as-json,jsonpath-file,name,template,templatefile,wide,yaml"
            ))),
        }
    }

    /// Whether this format needs whole objects (not the server's Table).
    pub fn needs_objects(&self) -> bool {
        !matches!(self, Output::Table | Output::Wide)
    }
}

/// Sort object keys recursively, as Go's map marshalling does.
pub fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), sorted(&m[k]));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// kubectl's JSON: keys sorted, 4-space indentation, trailing newline.
pub fn to_json(v: &Value) -> String {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    let _ = sorted(v).serialize(&mut ser);
    let mut s = String::from_utf8_lossy(&buf).replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026");
    s.push('\n');
    s
}

/// kubectl's YAML: keys sorted, go-yaml's styles.
pub fn to_yaml(v: &Value) -> String {
    yaml::to_yaml(&sorted(v))
}

/// `v` without `metadata.managedFields` (its own, or its items' when a list), as kubectl
/// prints objects in json and yaml unless asked (`--show-managed-fields`).
pub fn omit_managed_fields(v: &Value) -> Value {
    let mut out = v.clone();
    let strip = |o: &mut Value| {
        if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
    };
    strip(&mut out);
    if let Some(items) = out.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(strip);
    }
    out
}

/// A `kind: List` wrapping `items`, as kubectl prints several objects.
pub fn as_list(items: Vec<Value>) -> Value {
    serde_json::json!({"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}})
}

/// Kubernetes' short human durations ("5s", "3m20s", "4h", "2d"), shared with the apiserver.
pub use apimachinery::duration::human_duration;

/// The age of an RFC 3339 timestamp, now.
pub fn age(ts: Option<&str>) -> String {
    match ts.and_then(|t| t.parse::<jiff::Timestamp>().ok()) {
        Some(t) => human_duration(jiff::Timestamp::now().as_second() - t.as_second()),
        None => "<unknown>".into(),
    }
}

/// `k=v,k2=v2` sorted by key, or `<none>`.
pub fn labels_string(labels: Option<&Value>) -> String {
    let Some(m) = labels.and_then(Value::as_object) else { return "<none>".into() };
    if m.is_empty() {
        return "<none>".into();
    }
    let mut kv: Vec<String> = m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect();
    kv.sort();
    kv.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn output_flags() {
        assert_eq!(Output::parse(None).unwrap(), Output::Table);
        assert_eq!(Output::parse(Some("jsonpath={.a}")).unwrap(), Output::JsonPath("{.a}".into()));
        assert!(Output::parse(Some("bogus")).is_err());
    }

    #[test]
    fn json_is_sorted_and_four_spaces() {
        assert_eq!(to_json(&json!({"b": 1, "a": [true]})), "{\n    \"a\": [\n        true\n    ],\n    \"b\": 1\n}\n");
        assert_eq!(to_yaml(&json!({"b": 1, "a": "x"})), "a: x\nb: 1\n");
    }

    #[test]
    fn durations_and_labels() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(200), "3m20s");
        assert_eq!(human_duration(5 * 3600 + 60), "5h1m");
        assert_eq!(human_duration(3 * 86400), "3d");
        assert_eq!(labels_string(Some(&json!({"b": "2", "a": "1"}))), "a=1,b=2");
        assert_eq!(labels_string(None), "<none>");
    }
}
