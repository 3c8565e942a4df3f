//! `autoscaling/v1` HorizontalPodAutoscalers are a view of the `autoscaling/v2` objects in
//! storage, converted as Kubernetes' `pkg/apis/autoscaling/v1` conversion does:
//! `targetCPUUtilizationPercentage` is the first `Resource` cpu metric with a `Utilization`
//! target, `currentCPUUtilizationPercentage` the cpu utilization in status; every other
//! metric, the current metrics, the conditions and the behavior travel in the
//! `autoscaling.alpha.kubernetes.io/*` annotations so a v1 round trip loses nothing.
//! Pure functions.

use serde_json::{json, Map, Value};

use crate::registry::set_at;

pub const METRIC_SPECS: &str = "autoscaling.alpha.kubernetes.io/metrics";
pub const METRIC_STATUSES: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
pub const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";
pub const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";
/// Kubernetes' implicit target of a v1 HPA without one.
pub const DEFAULT_CPU_UTILIZATION: i64 = 80;

const ROUND_TRIP: &[&str] = &[METRIC_SPECS, METRIC_STATUSES, CONDITIONS, BEHAVIOR];

/// Copy the value at `from` in `src` to `to` in `dst`, if present and not null.
fn mv(src: &Value, from: &str, dst: &mut Value, to: &str) {
    if let Some(v) = src.pointer(from).filter(|v| !v.is_null()) {
        set_at(dst, to, v.clone());
    }
}

/// Like [`mv`], but a missing quantity becomes "0" (a required `resource.Quantity` in v1).
fn mv_quantity(src: &Value, from: &str, dst: &mut Value, to: &str) {
    let v = src.pointer(from).filter(|v| !v.is_null()).cloned().unwrap_or(json!("0"));
    set_at(dst, to, v);
}

fn is_cpu_resource(m: &Value) -> bool {
    m.get("type").and_then(Value::as_str) == Some("Resource")
        && m.pointer("/resource/name").and_then(Value::as_str) == Some("cpu")
}

// ------------------------------------------------------------------ metrics

/// The part of a metric a field belongs to: the HPA's spec or its status.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Spec,
    Status,
}

/// One field of a metric: where it is in autoscaling/v2, where in v1, and whether v1
/// requires it (a required `resource.Quantity`, "0" when v2 has none).
type Field = (&'static str, &'static str, bool);
const OPTIONAL: bool = false;
const REQUIRED: bool = true;

/// The one table both directions of the conversion read: every metric field of every
/// metric type, in spec and status.
fn fields(ty: &str, part: Part) -> &'static [Field] {
    use Part::*;
    match (ty, part) {
        ("Resource", Spec) => &[
            ("/resource/name", "/resource/name", OPTIONAL),
            ("/resource/target/averageUtilization", "/resource/targetAverageUtilization", OPTIONAL),
            ("/resource/target/averageValue", "/resource/targetAverageValue", OPTIONAL),
        ],
        ("ContainerResource", Spec) => &[
            ("/containerResource/name", "/containerResource/name", OPTIONAL),
            ("/containerResource/container", "/containerResource/container", OPTIONAL),
            ("/containerResource/target/averageUtilization", "/containerResource/targetAverageUtilization", OPTIONAL),
            ("/containerResource/target/averageValue", "/containerResource/targetAverageValue", OPTIONAL),
        ],
        ("Pods", Spec) => &[
            ("/pods/metric/name", "/pods/metricName", OPTIONAL),
            ("/pods/target/averageValue", "/pods/targetAverageValue", REQUIRED),
            ("/pods/metric/selector", "/pods/selector", OPTIONAL),
        ],
        ("Object", Spec) => &[
            ("/object/describedObject", "/object/target", OPTIONAL),
            ("/object/metric/name", "/object/metricName", OPTIONAL),
            ("/object/target/value", "/object/targetValue", REQUIRED),
            ("/object/metric/selector", "/object/selector", OPTIONAL),
            ("/object/target/averageValue", "/object/averageValue", OPTIONAL),
        ],
        ("External", Spec) => &[
            ("/external/metric/name", "/external/metricName", OPTIONAL),
            ("/external/metric/selector", "/external/metricSelector", OPTIONAL),
            ("/external/target/value", "/external/targetValue", OPTIONAL),
            ("/external/target/averageValue", "/external/targetAverageValue", OPTIONAL),
        ],
        ("Resource", Status) => &[
            ("/resource/name", "/resource/name", OPTIONAL),
            ("/resource/current/averageUtilization", "/resource/currentAverageUtilization", OPTIONAL),
            ("/resource/current/averageValue", "/resource/currentAverageValue", REQUIRED),
        ],
        ("ContainerResource", Status) => &[
            ("/containerResource/name", "/containerResource/name", OPTIONAL),
            ("/containerResource/container", "/containerResource/container", OPTIONAL),
            ("/containerResource/current/averageUtilization", "/containerResource/currentAverageUtilization", OPTIONAL),
            ("/containerResource/current/averageValue", "/containerResource/currentAverageValue", REQUIRED),
        ],
        ("Pods", Status) => &[
            ("/pods/metric/name", "/pods/metricName", OPTIONAL),
            ("/pods/current/averageValue", "/pods/currentAverageValue", REQUIRED),
            ("/pods/metric/selector", "/pods/selector", OPTIONAL),
        ],
        ("Object", Status) => &[
            ("/object/describedObject", "/object/target", OPTIONAL),
            ("/object/metric/name", "/object/metricName", OPTIONAL),
            ("/object/current/value", "/object/currentValue", REQUIRED),
            ("/object/metric/selector", "/object/selector", OPTIONAL),
            ("/object/current/averageValue", "/object/averageValue", OPTIONAL),
        ],
        ("External", Status) => &[
            ("/external/metric/name", "/external/metricName", OPTIONAL),
            ("/external/metric/selector", "/external/metricSelector", OPTIONAL),
            ("/external/current/value", "/external/currentValue", REQUIRED),
            ("/external/current/averageValue", "/external/currentAverageValue", OPTIONAL),
        ],
        _ => &[],
    }
}

/// The member of a metric that holds its source (`resource`, `pods`, …), by its type.
fn source_key(ty: &str) -> Option<&'static str> {
    Some(match ty {
        "Resource" => "resource",
        "ContainerResource" => "containerResource",
        "Pods" => "pods",
        "Object" => "object",
        "External" => "external",
        _ => return None,
    })
}

fn has(m: &Value, pointer: &str) -> bool {
    m.pointer(pointer).is_some_and(|v| !v.is_null())
}

/// A metric (spec or status) from autoscaling/v2 to v1.
fn metric_to_v1(m: &Value, part: Part) -> Value {
    let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
    let mut out = json!({"type": ty});
    let Some(key) = source_key(ty) else { return out };
    out[key] = json!({});
    for &(v2, v1, required_in_v1) in fields(ty, part) {
        if required_in_v1 {
            mv_quantity(m, v2, &mut out, v1);
        } else {
            mv(m, v2, &mut out, v1);
        }
    }
    out
}

/// A metric (spec or status) from autoscaling/v1 to v2: v2's `metric`, `target` and
/// `current` objects exist even when empty, and a target's type follows from the v1 field
/// that is set.
fn metric_from_v1(m: &Value, part: Part) -> Value {
    let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
    let mut out = json!({"type": ty});
    let Some(key) = source_key(ty) else { return out };
    let resource = matches!(ty, "Resource" | "ContainerResource");
    out[key] = match part {
        Part::Spec => {
            let target = match ty {
                "Object" if has(m, "/object/averageValue") => "AverageValue",
                "Object" => "Value",
                "External" if has(m, "/external/targetValue") => "Value",
                "Pods" | "External" => "AverageValue",
                _ if has(m, &format!("/{key}/targetAverageUtilization")) => "Utilization",
                _ => "AverageValue",
            };
            if resource {
                json!({"target": {"type": target}})
            } else {
                json!({"metric": {}, "target": {"type": target}})
            }
        }
        Part::Status if resource => json!({"current": {}}),
        Part::Status => json!({"metric": {}, "current": {}}),
    };
    for &(v2, v1, _) in fields(ty, part) {
        mv(m, v1, &mut out, v2);
    }
    out
}

fn metric_spec_to_v1(m: &Value) -> Value {
    metric_to_v1(m, Part::Spec)
}

fn metric_status_to_v1(m: &Value) -> Value {
    metric_to_v1(m, Part::Status)
}

fn metric_spec_from_v1(m: &Value) -> Value {
    metric_from_v1(m, Part::Spec)
}

fn metric_status_from_v1(m: &Value) -> Value {
    metric_from_v1(m, Part::Status)
}

/// Kubernetes stores the behavior annotation as its internal Go type, which has no JSON
/// tags: the field names are Go's (`ScaleUp`, `StabilizationWindowSeconds`, …).
fn rename_keys(v: &Value, f: fn(&str) -> String) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (f(k), rename_keys(v, f))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(|v| rename_keys(v, f)).collect()),
        other => other.clone(),
    }
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().collect::<String>() + c.as_str()).unwrap_or_default()
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_lowercase().collect::<String>() + c.as_str()).unwrap_or_default()
}

fn non_empty_array(v: Option<&Value>) -> Option<&Vec<Value>> {
    v.and_then(Value::as_array).filter(|a| !a.is_empty())
}

// ------------------------------------------------------------------ objects

/// autoscaling/v2 (storage) → autoscaling/v1.
pub fn to_v1(obj: &Value) -> Value {
    let mut out = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler"});
    let mut meta = obj.get("metadata").cloned().unwrap_or(json!({}));
    // Only the annotations this conversion writes survive.
    if let Some(ann) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
        for k in ROUND_TRIP {
            ann.remove(*k);
        }
    }
    let mut annotations = Map::new();

    let mut spec = json!({});
    mv(obj, "/spec/scaleTargetRef", &mut spec, "/scaleTargetRef");
    mv(obj, "/spec/minReplicas", &mut spec, "/minReplicas");
    mv(obj, "/spec/maxReplicas", &mut spec, "/maxReplicas");
    let metrics = obj.pointer("/spec/metrics").and_then(Value::as_array).cloned().unwrap_or_default();
    let utilization = |m: &Value| m.pointer("/resource/target/averageUtilization").filter(|v| !v.is_null()).cloned();
    if let Some(u) = metrics.iter().filter(|m| is_cpu_resource(m)).find_map(utilization) {
        spec["targetCPUUtilizationPercentage"] = u;
    }
    let others: Vec<Value> =
        metrics.iter().filter(|m| !(is_cpu_resource(m) && utilization(m).is_some())).map(metric_spec_to_v1).collect();
    if !others.is_empty() {
        annotations.insert(METRIC_SPECS.into(), json!(serde_json::to_string(&others).unwrap_or_default()));
    }
    if let Some(b) = obj.pointer("/spec/behavior").filter(|b| b.is_object()) {
        let go = rename_keys(b, upper_first);
        annotations.insert(BEHAVIOR.into(), json!(serde_json::to_string(&go).unwrap_or_default()));
    }

    let mut status = json!({});
    mv(obj, "/status/observedGeneration", &mut status, "/observedGeneration");
    mv(obj, "/status/lastScaleTime", &mut status, "/lastScaleTime");
    status["currentReplicas"] = obj.pointer("/status/currentReplicas").cloned().unwrap_or(json!(0));
    status["desiredReplicas"] = obj.pointer("/status/desiredReplicas").cloned().unwrap_or(json!(0));
    if let Some(current) = non_empty_array(obj.pointer("/status/currentMetrics")) {
        for m in current.iter().filter(|m| is_cpu_resource(m)) {
            if let Some(u) = m.pointer("/resource/current/averageUtilization").filter(|v| !v.is_null()) {
                status["currentCPUUtilizationPercentage"] = u.clone();
            }
        }
        let v1: Vec<Value> = current.iter().map(metric_status_to_v1).collect();
        annotations.insert(METRIC_STATUSES.into(), json!(serde_json::to_string(&v1).unwrap_or_default()));
    }
    if let Some(conds) = non_empty_array(obj.pointer("/status/conditions")) {
        annotations.insert(CONDITIONS.into(), json!(serde_json::to_string(conds).unwrap_or_default()));
    }

    if !annotations.is_empty() {
        let existing = meta.get("annotations").and_then(Value::as_object).cloned().unwrap_or_default();
        let mut all = existing;
        all.extend(annotations);
        meta["annotations"] = Value::Object(all);
    } else if meta.get("annotations").and_then(Value::as_object).is_some_and(Map::is_empty) {
        if let Some(m) = meta.as_object_mut() {
            m.remove("annotations");
        }
    }
    out["metadata"] = meta;
    out["spec"] = spec;
    out["status"] = status;
    out
}

/// autoscaling/v1 → autoscaling/v2 (storage). Fails only on a malformed round-trip annotation.
pub fn from_v1(obj: &Value) -> Result<Value, String> {
    let mut out = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler"});
    let mut meta = obj.get("metadata").cloned().unwrap_or(json!({}));
    let mut taken: Map<String, Value> = Map::new();
    if let Some(ann) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
        for k in ROUND_TRIP {
            if let Some(v) = ann.remove(*k) {
                let text = v.as_str().unwrap_or_default();
                let parsed: Value =
                    serde_json::from_str(text).map_err(|e| format!("metadata.annotations[{k}]: invalid JSON: {e}"))?;
                taken.insert(k.to_string(), parsed);
            }
        }
        if ann.is_empty() {
            if let Some(m) = meta.as_object_mut() {
                m.remove("annotations");
            }
        }
    }
    let list = |k: &str| -> Result<Vec<Value>, String> {
        match taken.get(k) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => Ok(a.clone()),
            Some(_) => Err(format!("metadata.annotations[{k}]: must be a JSON array")),
        }
    };

    let mut spec = json!({});
    mv(obj, "/spec/scaleTargetRef", &mut spec, "/scaleTargetRef");
    mv(obj, "/spec/minReplicas", &mut spec, "/minReplicas");
    mv(obj, "/spec/maxReplicas", &mut spec, "/maxReplicas");
    let mut metrics: Vec<Value> = list(METRIC_SPECS)?.iter().map(metric_spec_from_v1).collect();
    if let Some(t) = obj.pointer("/spec/targetCPUUtilizationPercentage").filter(|v| !v.is_null()) {
        metrics.push(json!({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": t}}}));
    }
    if metrics.is_empty() {
        // v1 had an implicit default target; v2 states it.
        metrics.push(json!({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION}}}));
    }
    spec["metrics"] = json!(metrics);
    if let Some(b) = taken.get(BEHAVIOR).filter(|b| b.as_object().is_some_and(|m| !m.is_empty())) {
        spec["behavior"] = rename_keys(b, lower_first);
    }

    let mut status = json!({});
    mv(obj, "/status/observedGeneration", &mut status, "/observedGeneration");
    mv(obj, "/status/lastScaleTime", &mut status, "/lastScaleTime");
    mv(obj, "/status/currentReplicas", &mut status, "/currentReplicas");
    status["desiredReplicas"] = obj.pointer("/status/desiredReplicas").cloned().unwrap_or(json!(0));
    if let Some(c) = obj.pointer("/status/currentCPUUtilizationPercentage").filter(|v| !v.is_null()) {
        status["currentMetrics"] =
            json!([{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": c}}}]);
    }
    if taken.contains_key(METRIC_STATUSES) {
        let current: Vec<Value> = list(METRIC_STATUSES)?.iter().map(metric_status_from_v1).collect();
        status["currentMetrics"] = json!(current);
    }
    let conditions = list(CONDITIONS)?;
    if !conditions.is_empty() {
        status["conditions"] = json!(conditions);
    }

    out["metadata"] = meta;
    out["spec"] = spec;
    if obj.get("status").is_some_and(|s| !s.is_null()) || status.as_object().is_some_and(|m| m.len() > 1) {
        out["status"] = status;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_type_converts_both_ways_through_the_one_table() {
        let specs = json!([
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
            {"type": "ContainerResource", "containerResource": {"name": "memory", "container": "app", "target": {"type": "AverageValue", "averageValue": "1Gi"}}},
            {"type": "Pods", "pods": {"metric": {"name": "qps", "selector": {"matchLabels": {"a": "b"}}}, "target": {"type": "AverageValue", "averageValue": "10"}}},
            {"type": "Object", "object": {"describedObject": {"kind": "Service", "name": "s"}, "metric": {"name": "rps"}, "target": {"type": "AverageValue", "averageValue": "3", "value": "2k"}}},
            {"type": "External", "external": {"metric": {"name": "queue", "selector": {}}, "target": {"type": "AverageValue", "averageValue": "30"}}},
        ]);
        let statuses = json!([
            {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 40, "averageValue": "20m"}}},
            {"type": "ContainerResource", "containerResource": {"name": "cpu", "container": "app", "current": {"averageValue": "5m"}}},
            {"type": "Pods", "pods": {"metric": {"name": "qps"}, "current": {"averageValue": "4"}}},
            {"type": "Object", "object": {"describedObject": {"kind": "Service", "name": "s"}, "metric": {"name": "rps"}, "current": {"value": "1k"}}},
            {"type": "External", "external": {"metric": {"name": "queue"}, "current": {"value": "7", "averageValue": "1"}}},
        ]);
        for m in specs.as_array().unwrap() {
            assert_eq!(&metric_spec_from_v1(&metric_spec_to_v1(m)), m);
        }
        for m in statuses.as_array().unwrap() {
            assert_eq!(&metric_status_from_v1(&metric_status_to_v1(m)), m);
        }
        // v1 requires the quantities v2 may leave out.
        let pods = json!({"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue"}}});
        assert_eq!(
            metric_spec_to_v1(&pods),
            json!({"type": "Pods", "pods": {"metricName": "qps", "targetAverageValue": "0"}})
        );
        assert_eq!(metric_spec_to_v1(&json!({"type": "Unknown"})), json!({"type": "Unknown"}));
    }

    fn manifest_v2() -> Value {
        json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "default", "annotations": {"team": "a"}},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 1, "maxReplicas": 5,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
                    {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
                    {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}},
                    {"type": "External", "external": {"metric": {"name": "queue"}, "target": {"type": "Value", "value": "30"}}},
                    {"type": "Object", "object": {"describedObject": {"kind": "Service", "name": "s", "apiVersion": "v1"}, "metric": {"name": "rps"}, "target": {"type": "Value", "value": "2k"}}}
                ],
                "behavior": {"scaleUp": {"stabilizationWindowSeconds": 20, "selectPolicy": "Max", "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}
            },
            "status": {
                "currentReplicas": 2, "desiredReplicas": 3,
                "currentMetrics": [
                    {"type": "Resource", "resource": {"name": "memory", "current": {"averageValue": "50Mi"}}},
                    {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 40, "averageValue": "20m"}}}
                ],
                "conditions": [{"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale", "lastTransitionTime": "2024-01-01T00:00:00Z"}]
            }
        })
    }

    #[test]
    fn cpu_utilization_becomes_the_v1_target_and_the_rest_annotations() {
        let v1 = to_v1(&manifest_v2());
        assert_eq!(v1["apiVersion"], "autoscaling/v1");
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 50);
        assert_eq!(v1["spec"]["maxReplicas"], 5);
        assert_eq!(v1["status"]["currentCPUUtilizationPercentage"], 40);
        assert_eq!(v1["status"]["desiredReplicas"], 3);
        assert!(v1["spec"].get("metrics").is_none());
        let ann = &v1["metadata"]["annotations"];
        assert_eq!(ann["team"], "a");
        let others: Value = serde_json::from_str(ann[METRIC_SPECS].as_str().unwrap()).unwrap();
        assert_eq!(others.as_array().unwrap().len(), 4, "cpu utilization is not repeated: {others}");
        assert_eq!(others[0]["resource"], json!({"name": "memory", "targetAverageValue": "100Mi"}));
        assert_eq!(others[1]["pods"], json!({"metricName": "qps", "targetAverageValue": "10"}));
        assert_eq!(others[2]["external"], json!({"metricName": "queue", "targetValue": "30"}));
        assert_eq!(others[3]["object"]["target"]["kind"], "Service");
        let statuses: Value = serde_json::from_str(ann[METRIC_STATUSES].as_str().unwrap()).unwrap();
        assert_eq!(
            statuses[1]["resource"],
            json!({"name": "cpu", "currentAverageUtilization": 40, "currentAverageValue": "20m"})
        );
        let behavior: Value = serde_json::from_str(ann[BEHAVIOR].as_str().unwrap()).unwrap();
        assert_eq!(behavior["ScaleUp"]["Policies"][0]["PeriodSeconds"], 60);
        assert!(ann[CONDITIONS].as_str().unwrap().contains("ReadyForNewScale"));
    }

    #[test]
    fn v1_round_trip_restores_the_v2_object() {
        let v2 = manifest_v2();
        let back = from_v1(&to_v1(&v2)).unwrap();
        // The cpu target comes back after the other metrics, as in Kubernetes.
        let metrics = back["spec"]["metrics"].as_array().unwrap();
        assert_eq!(metrics.len(), 5);
        assert_eq!(metrics[4], v2["spec"]["metrics"][1]);
        for (i, j) in [(0, 0), (1, 2), (2, 3), (3, 4)] {
            assert_eq!(metrics[i], v2["spec"]["metrics"][j], "metric {j}");
        }
        assert_eq!(back["spec"]["behavior"], v2["spec"]["behavior"]);
        assert_eq!(back["status"]["conditions"], v2["status"]["conditions"]);
        assert_eq!(back["status"]["currentMetrics"], v2["status"]["currentMetrics"]);
        assert_eq!(back["metadata"]["annotations"], json!({"team": "a"}));
    }

    #[test]
    fn plain_v1_objects() {
        let v1 = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "h"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "d"}, "maxReplicas": 3, "targetCPUUtilizationPercentage": 70}});
        let v2 = from_v1(&v1).unwrap();
        assert_eq!(v2["apiVersion"], "autoscaling/v2");
        assert_eq!(
            v2["spec"]["metrics"],
            json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}])
        );
        assert!(v2.get("status").is_none());
        assert_eq!(to_v1(&v2)["spec"], v1["spec"]);
        // No target at all: Kubernetes' implicit 80 %.
        let mut none = v1.clone();
        none["spec"].as_object_mut().unwrap().remove("targetCPUUtilizationPercentage");
        assert_eq!(from_v1(&none).unwrap()["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 80);
        // A broken annotation is an error, not a panic.
        let mut bad = v1.clone();
        bad["metadata"]["annotations"] = json!({METRIC_SPECS: "{"});
        assert!(from_v1(&bad).unwrap_err().contains(METRIC_SPECS));
    }

    #[test]
    fn utilization_after_an_average_value_cpu_metric() {
        // Kubernetes' #101370: the first cpu metric with a utilization target wins.
        let v2 = json!({"spec": {"maxReplicas": 3, "metrics": [
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "AverageValue", "averageValue": "300m"}}},
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]}});
        let v1 = to_v1(&v2);
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 70);
        let others: Value =
            serde_json::from_str(v1["metadata"]["annotations"][METRIC_SPECS].as_str().unwrap()).unwrap();
        assert_eq!(others, json!([{"type": "Resource", "resource": {"name": "cpu", "targetAverageValue": "300m"}}]));
    }
}
