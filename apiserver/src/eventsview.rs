//! `events.k8s.io/v1` Events are a view of the core/v1 Events in storage: the same objects,
//! converted field by field as Kubernetes' `events/v1` conversion does. Pure functions.

use serde_json::{json, Map, Value};

/// (core/v1 field, events.k8s.io/v1 field)
const FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("related", "related"),
    ("reason", "reason"),
    ("message", "note"),
    ("type", "type"),
    ("action", "action"),
    ("eventTime", "eventTime"),
    ("series", "series"),
    ("reportingComponent", "reportingController"),
    ("reportingInstance", "reportingInstance"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn convert(obj: &Value, from_core: bool, api_version: &str) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    if let Some(m) = obj.get("metadata") {
        out.insert("metadata".into(), m.clone());
    }
    for (core, v1) in FIELDS {
        let (src, dst) = if from_core { (core, v1) } else { (v1, core) };
        if let Some(v) = obj.get(*src).filter(|v| !v.is_null()) {
            let v = match (*src, v) {
                // core/v1 EventSeries carries a deprecated `state`; events/v1 does not.
                ("series", Value::Object(s)) => {
                    let mut s = s.clone();
                    s.remove("state");
                    Value::Object(s)
                }
                _ => v.clone(),
            };
            out.insert(dst.to_string(), v);
        }
    }
    Value::Object(out)
}

/// core/v1 → events.k8s.io/v1
pub fn to_v1(core: &Value) -> Value {
    convert(core, true, "events.k8s.io/v1")
}

/// events.k8s.io/v1 → core/v1
pub fn from_v1(ev: &Value) -> Value {
    convert(ev, false, "v1")
}

/// An events.k8s.io/v1 field selector field as the core/v1 field it filters on.
pub fn core_field(field: &str) -> String {
    if let Some(rest) = field.strip_prefix("regarding.") {
        return format!("involvedObject.{rest}");
    }
    if let Some(rest) = field.strip_prefix("deprecatedSource.") {
        return format!("source.{rest}");
    }
    match field {
        "reportingController" => "reportingComponent".into(),
        "note" => "message".into(),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "d"},
            "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "Started", "message": "hi", "type": "Normal",
            "source": {"component": "kubelet"}, "count": 2, "firstTimestamp": "2024-01-01T00:00:00Z",
            "reportingComponent": "kubelet", "reportingInstance": "n1"});
        let v1 = to_v1(&core);
        assert_eq!(v1["apiVersion"], "events.k8s.io/v1");
        assert_eq!(v1["regarding"]["name"], "p");
        assert_eq!(v1["note"], "hi");
        assert_eq!(v1["deprecatedCount"], 2);
        assert_eq!(v1["reportingController"], "kubelet");
        assert_eq!(from_v1(&v1), core);
        assert_eq!(core_field("regarding.name"), "involvedObject.name");
        assert_eq!(core_field("reportingController"), "reportingComponent");
    }
}
