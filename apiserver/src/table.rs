//! Server-side printing (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`): the columns
//! `kubectl get` shows. Pure.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::registry::ResourceDef;

fn s(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

fn i(v: Option<&Value>) -> i64 {
    v.and_then(Value::as_i64).unwrap_or(0)
}

pub use apimachinery::duration::human_duration;

fn age(obj: &Value) -> String {
    let Some(ts) = obj.pointer("/metadata/creationTimestamp").and_then(Value::as_str) else {
        return "<unknown>".into();
    };
    match ts.parse::<jiff::Timestamp>() {
        Ok(t) => human_duration(jiff::Timestamp::now().as_second() - t.as_second()),
        Err(_) => "<unknown>".into(),
    }
}

/// `translateTimestampSince`: "<unknown>" for a missing time.
fn since(ts: Option<&Value>) -> String {
    match ts.and_then(Value::as_str).map(|t| t.parse::<jiff::Timestamp>()) {
        Some(Ok(t)) => human_duration(jiff::Timestamp::now().as_second() - t.as_second()),
        _ => "<unknown>".into(),
    }
}

/// Event columns (printers.go `eventColumnDefinitions`): no leading Name; Name is a wide column.
fn event_table() -> (Vec<Value>, CellsFn) {
    let c = |name: &str, priority: i64, format: &str| json!({"name": name, "type": "string", "format": format, "description": "", "priority": priority});
    let cols = vec![
        c("Last Seen", 0, ""),
        c("Type", 0, ""),
        c("Reason", 0, ""),
        c("Object", 0, ""),
        c("Subobject", 1, ""),
        c("Source", 1, ""),
        c("Message", 0, ""),
        c("First Seen", 1, ""),
        c("Count", 1, ""),
        c("Name", 1, "name"),
    ];
    fn cells(o: &Value) -> Vec<Value> {
        let mut first = since(o.get("firstTimestamp"));
        if o.get("firstTimestamp").is_none_or(Value::is_null) {
            first = since(o.get("eventTime"));
        }
        let mut last = if o.get("lastTimestamp").is_none_or(Value::is_null) {
            first.clone()
        } else {
            since(o.get("lastTimestamp"))
        };
        let mut count = o.get("count").and_then(Value::as_i64).unwrap_or(0);
        if let Some(series) = o.get("series").filter(|x| x.is_object()) {
            last = since(series.get("lastObservedTime"));
            count = series.get("count").and_then(Value::as_i64).unwrap_or(0);
        } else if count == 0 {
            count = 1;
        }
        let mut component = s(o.pointer("/source/component"));
        if component.is_empty() {
            component = s(o.get("reportingComponent"));
        }
        let mut host = s(o.pointer("/source/host"));
        if host.is_empty() {
            host = s(o.get("reportingInstance"));
        }
        let source = if host.is_empty() { component } else { format!("{component}, {host}") };
        let object =
            format!("{}/{}", s(o.pointer("/involvedObject/kind")).to_lowercase(), s(o.pointer("/involvedObject/name")));
        vec![
            json!(last),
            json!(s(o.get("type"))),
            json!(s(o.get("reason"))),
            json!(object),
            json!(s(o.pointer("/involvedObject/fieldPath"))),
            json!(source),
            json!(s(o.get("message")).trim()),
            json!(first),
            json!(count.to_string()),
            json!(s(o.pointer("/metadata/name"))),
        ]
    }
    (cols, cells)
}

/// Convert a list (`{"metadata":…, "items":[…]}`) to a meta.k8s.io/v1 Table.
/// Columns and cells of a custom resource: Name and its additionalPrinterColumns (Age when
/// it declares none), as the apiextensions apiserver prints them.
fn custom_table(info: &crate::registry::CustomInfo) -> (Vec<Value>, Box<dyn Fn(&Value) -> Vec<Value> + '_>) {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    if info.printer_columns.is_empty() {
        cols.push(json!({"name": "Age", "type": "date", "format": "", "description": "", "priority": 0}));
        return (cols, Box::new(|o: &Value| vec![json!(s(o.pointer("/metadata/name"))), json!(age(o))]));
    }
    for (name, ty, _, priority) in &info.printer_columns {
        cols.push(json!({"name": name, "type": ty, "format": "", "description": "", "priority": priority}));
    }
    let cells = move |o: &Value| {
        let mut c = vec![json!(s(o.pointer("/metadata/name")))];
        for (_, ty, path, _) in &info.printer_columns {
            let v = crate::registry::crd::json_path(o, path).cloned().unwrap_or(Value::Null);
            // Dates print as ages, as the apiextensions table convertor does.
            let v = match (ty.as_str(), v.as_str().map(|t| t.parse::<jiff::Timestamp>())) {
                ("date", Some(Ok(t))) => json!(human_duration(jiff::Timestamp::now().as_second() - t.as_second())),
                _ => v,
            };
            c.push(v);
        }
        c
    };
    (cols, Box::new(cells))
}

pub fn to_table(res: &ResourceDef, list: &Value, query: &HashMap<String, String>) -> Value {
    match res.custom {
        Some(info) => {
            let (cols, cells) = custom_table(info);
            build(cols, &cells, list, query)
        }
        None => {
            let (cols, cells) = kind_table(res);
            build(cols, &cells, list, query)
        }
    }
}

/// Column definitions from (name, type, priority), as kubectl reads them.
fn cols(spec: &[(&str, &str, i64)]) -> Vec<Value> {
    spec.iter()
        .map(|(n, t, p)| {
            let (format, description) =
                if *n == "Name" { ("name", "Name must be unique within a namespace.") } else { ("", "") };
            json!({"name": n, "type": t, "format": format, "description": description, "priority": p})
        })
        .collect()
}

/// The Table of a Scale subresource (`kubectl get deploy x --subresource=scale`).
pub fn scale_table(scale: &Value, query: &HashMap<String, String>) -> Value {
    let cols =
        cols(&[("Name", "string", 0), ("Desired", "integer", 0), ("Available", "integer", 0), ("Age", "string", 0)]);
    let cell = |o: &Value| {
        vec![
            json!(s(o.pointer("/metadata/name"))),
            json!(i(o.pointer("/spec/replicas"))),
            json!(i(o.pointer("/status/replicas"))),
            json!(age(o)),
        ]
    };
    let list = json!({"metadata": {"resourceVersion": scale.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""))}, "items": [scale]});
    build(cols, &cell, &list, query)
}

/// The Table of ComponentStatuses (Kubernetes' printer: the `Healthy` condition's status,
/// message and error).
pub fn component_status_table(list: &Value, query: &HashMap<String, String>) -> Value {
    let cols =
        cols(&[("Name", "string", 0), ("Status", "string", 0), ("Message", "string", 0), ("Error", "string", 0)]);
    let cell = |o: &Value| {
        let healthy =
            o.get("conditions").and_then(Value::as_array).and_then(|c| c.iter().find(|c| c["type"] == "Healthy"));
        let status = match healthy.map(|c| &c["status"]) {
            Some(Value::String(st)) if st == "True" => "Healthy",
            Some(_) => "Unhealthy",
            None => "Unknown",
        };
        vec![
            json!(s(o.pointer("/metadata/name"))),
            json!(status),
            json!(s(healthy.and_then(|c| c.get("message")))),
            json!(s(healthy.and_then(|c| c.get("error")))),
        ]
    };
    build(cols, &cell, list, query)
}

/// A Table of `list`'s items: the columns, one row of cells per item, and the object each
/// row is for as `includeObject` asks.
fn build(
    cols: Vec<Value>,
    cell: &dyn Fn(&Value) -> Vec<Value>,
    list: &Value,
    query: &HashMap<String, String>,
) -> Value {
    let include = query.get("includeObject").map(String::as_str).unwrap_or("PartialObjectMetadata");
    let rows: Vec<Value> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            let mut row = json!({"cells": cell(o)});
            match include {
                "None" => {}
                "Object" => row["object"] = o.clone(),
                _ => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                    })
                }
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list.get("metadata").cloned().unwrap_or(json!({})),
        "columnDefinitions": cols,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(200), "3m20s");
        assert_eq!(human_duration(3600), "60m");
        assert_eq!(human_duration(5 * 3600 + 60), "5h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400), "3d");
    }

    #[test]
    fn scale_table_columns() {
        let scale = json!({"metadata": {"name": "web", "resourceVersion": "7", "creationTimestamp": "2020-01-01T00:00:00Z"},
                           "spec": {"replicas": 5}, "status": {"replicas": 3}});
        let t = scale_table(&scale, &HashMap::new());
        let names: Vec<&str> =
            t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Name", "Desired", "Available", "Age"]);
        assert_eq!(t["rows"][0]["cells"].as_array().unwrap()[..3], [json!("web"), json!(5), json!(3)]);
        assert_eq!(t["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn pod_table() {
        let res = crate::resources::find("", "v1", "pods").unwrap();
        let list = json!({"metadata": {"resourceVersion": "5"}, "items": [{
            "metadata": {"name": "p", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}],
                     "readinessGates": [{"conditionType": "example.com/lb"}, {"conditionType": "example.com/dns"}]},
            "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}],
                       "nominatedNodeName": "n2",
                       "conditions": [{"type": "example.com/lb", "status": "True"}, {"type": "example.com/dns", "status": "False"}]}}]});
        let t = to_table(res, &list, &HashMap::new());
        // kube-apiserver's columns for pods, `-o wide` ones (priority 1) included.
        let names: Vec<&str> =
            t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["Name", "Ready", "Status", "Restarts", "Age", "IP", "Node", "Nominated Node", "Readiness Gates"]
        );
        assert_eq!(t["rows"][0]["cells"][5], "<none>");
        assert_eq!(t["rows"][0]["cells"][7], "n2");
        assert_eq!(t["rows"][0]["cells"][8], "1/2");
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["rows"][0]["cells"][0], "p");
        assert_eq!(t["rows"][0]["cells"][1], "1/2");
        assert_eq!(t["rows"][0]["cells"][2], "Running");
        assert_eq!(t["rows"][0]["cells"][3], "2");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}

// ------------------------------------------------------------------ more kinds (printers.go)

fn none_if_empty(v: String) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v
    }
}

fn condition_true(o: &Value, ty: &str) -> bool {
    o.pointer("/status/conditions").and_then(Value::as_array).is_some_and(|cs| {
        cs.iter().any(|c| c.get("type") == Some(&json!(ty)) && c.get("status") == Some(&json!("True")))
    })
}

fn seconds_between(from: Option<&Value>, to: Option<&Value>) -> Option<i64> {
    let p = |v: Option<&Value>| v.and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let from = p(from)?;
    let to = p(to).unwrap_or_else(jiff::Timestamp::now);
    Some(to.as_second() - from.as_second())
}

type CellsFn = fn(&Value) -> Vec<Value>;

/// Every built-in kind's columns and cells, as kubectl prints them; NAME and AGE for a
/// kind without printer columns of its own.
fn kind_table(res: &ResourceDef) -> (Vec<Value>, CellsFn) {
    match (res.group, res.plural) {
        ("", "events") => event_table(),
        ("", "pods") => (
            cols(&[
                ("Name", "string", 0),
                ("Ready", "string", 0),
                ("Status", "string", 0),
                ("Restarts", "string", 0),
                ("Age", "string", 0),
                ("IP", "string", 1),
                ("Node", "string", 1),
                ("Nominated Node", "string", 1),
                ("Readiness Gates", "string", 1),
            ]),
            |o| {
                // `true/total` of the pod's readiness gates whose condition is True.
                let gates = o.pointer("/spec/readinessGates").and_then(Value::as_array).cloned().unwrap_or_default();
                let readiness_gates = if gates.is_empty() {
                    "<none>".to_string()
                } else {
                    let conds = o.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
                    let met = gates
                        .iter()
                        .filter(|g| {
                            conds.iter().find(|c| c.get("type") == g.get("conditionType")).and_then(|c| c.get("status"))
                                == Some(&json!("True"))
                        })
                        .count();
                    format!("{met}/{}", gates.len())
                };
                let statuses =
                    o.pointer("/status/containerStatuses").and_then(Value::as_array).cloned().unwrap_or_default();
                let total = o.pointer("/spec/containers").and_then(Value::as_array).map_or(0, Vec::len);
                let ready = statuses.iter().filter(|c| c.get("ready") == Some(&json!(true))).count();
                let restarts: i64 = statuses.iter().map(|c| i(c.get("restartCount"))).sum();
                let mut status = s(o.pointer("/status/reason"));
                if status.is_empty() {
                    status = s(o.pointer("/status/phase"));
                }
                for cs in &statuses {
                    if let Some(r) = cs.pointer("/state/waiting/reason").and_then(Value::as_str) {
                        status = r.to_string();
                    }
                }
                if o.pointer("/metadata/deletionTimestamp").is_some() {
                    status = "Terminating".into();
                }
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(format!("{ready}/{total}")),
                    json!(status),
                    json!(restarts.to_string()),
                    json!(age(o)),
                    json!(none_if_empty(s(o.pointer("/status/podIP")))),
                    json!(none_if_empty(s(o.pointer("/spec/nodeName")))),
                    json!(none_if_empty(s(o.pointer("/status/nominatedNodeName")))),
                    json!(readiness_gates),
                ]
            },
        ),
        ("apps", "deployments") => (
            cols(&[
                ("Name", "string", 0),
                ("Ready", "string", 0),
                ("Up-to-date", "integer", 0),
                ("Available", "integer", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(format!("{}/{}", i(o.pointer("/status/readyReplicas")), i(o.pointer("/spec/replicas")))),
                    json!(i(o.pointer("/status/updatedReplicas"))),
                    json!(i(o.pointer("/status/availableReplicas"))),
                    json!(age(o)),
                ]
            },
        ),
        ("apps", "replicasets") | ("", "replicationcontrollers") => (
            cols(&[
                ("Name", "string", 0),
                ("Desired", "integer", 0),
                ("Current", "integer", 0),
                ("Ready", "integer", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(i(o.pointer("/spec/replicas"))),
                    json!(i(o.pointer("/status/replicas"))),
                    json!(i(o.pointer("/status/readyReplicas"))),
                    json!(age(o)),
                ]
            },
        ),
        ("apps", "statefulsets") => {
            (cols(&[("Name", "string", 0), ("Ready", "string", 0), ("Age", "string", 0)]), |o| {
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(format!("{}/{}", i(o.pointer("/status/readyReplicas")), i(o.pointer("/spec/replicas")))),
                    json!(age(o)),
                ]
            })
        }
        ("", "services") => (
            cols(&[
                ("Name", "string", 0),
                ("Type", "string", 0),
                ("Cluster-IP", "string", 0),
                ("External-IP", "string", 0),
                ("Port(s)", "string", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let ports: Vec<String> = o
                    .pointer("/spec/ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        let proto = s(p.get("protocol"));
                        let proto = if proto.is_empty() { "TCP".to_string() } else { proto };
                        match p.get("nodePort").and_then(Value::as_i64) {
                            Some(np) => format!("{}:{np}/{proto}", i(p.get("port"))),
                            None => format!("{}/{proto}", i(p.get("port"))),
                        }
                    })
                    .collect();
                let ext: Vec<String> = o
                    .pointer("/status/loadBalancer/ingress")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|x| s(x.get("ip")))
                    .collect();
                let ty = s(o.pointer("/spec/type"));
                let ext = if !ext.is_empty() {
                    ext.join(",")
                } else if ty == "LoadBalancer" {
                    "<pending>".into()
                } else if ty == "ExternalName" {
                    s(o.pointer("/spec/externalName"))
                } else {
                    "<none>".into()
                };
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(ty),
                    json!(none_if_empty(s(o.pointer("/spec/clusterIP")))),
                    json!(ext),
                    json!(none_if_empty(ports.join(","))),
                    json!(age(o)),
                ]
            },
        ),
        ("", "namespaces") => (cols(&[("Name", "string", 0), ("Status", "string", 0), ("Age", "string", 0)]), |o| {
            vec![json!(s(o.pointer("/metadata/name"))), json!(s(o.pointer("/status/phase"))), json!(age(o))]
        }),
        ("", "nodes") => (
            cols(&[
                ("Name", "string", 0),
                ("Status", "string", 0),
                ("Roles", "string", 0),
                ("Age", "string", 0),
                ("Version", "string", 0),
            ]),
            |o| {
                let ready = o
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.iter().find(|c| c.get("type") == Some(&json!("Ready"))))
                    .map(|c| if c.get("status") == Some(&json!("True")) { "Ready" } else { "NotReady" })
                    .unwrap_or("Unknown");
                let mut status = ready.to_string();
                if o.pointer("/spec/unschedulable") == Some(&json!(true)) {
                    status.push_str(",SchedulingDisabled");
                }
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(status),
                    json!(apimachinery::printers::node_roles(o)),
                    json!(age(o)),
                    json!(s(o.pointer("/status/nodeInfo/kubeletVersion"))),
                ]
            },
        ),
        ("", "configmaps") => (cols(&[("Name", "string", 0), ("Data", "integer", 0), ("Age", "string", 0)]), |o| {
            let n = ["data", "binaryData"]
                .iter()
                .map(|f| o.get(*f).and_then(Value::as_object).map_or(0, |m| m.len()))
                .sum::<usize>();
            vec![json!(s(o.pointer("/metadata/name"))), json!(n), json!(age(o))]
        }),
        ("", "secrets") => {
            (cols(&[("Name", "string", 0), ("Type", "string", 0), ("Data", "integer", 0), ("Age", "string", 0)]), |o| {
                let n = o.get("data").and_then(Value::as_object).map_or(0, |m| m.len());
                vec![json!(s(o.pointer("/metadata/name"))), json!(s(o.get("type"))), json!(n), json!(age(o))]
            })
        }
        ("apps", "daemonsets") => (
            cols(&[
                ("Name", "string", 0),
                ("Desired", "integer", 0),
                ("Current", "integer", 0),
                ("Ready", "integer", 0),
                ("Up-to-date", "integer", 0),
                ("Available", "integer", 0),
                ("Node Selector", "string", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let sel: Vec<String> = o
                    .pointer("/spec/template/spec/nodeSelector")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect();
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(i(o.pointer("/status/desiredNumberScheduled"))),
                    json!(i(o.pointer("/status/currentNumberScheduled"))),
                    json!(i(o.pointer("/status/numberReady"))),
                    json!(i(o.pointer("/status/updatedNumberScheduled"))),
                    json!(i(o.pointer("/status/numberAvailable"))),
                    json!(none_if_empty(sel.join(","))),
                    json!(age(o)),
                ]
            },
        ),
        ("batch", "jobs") => (
            cols(&[
                ("Name", "string", 0),
                ("Status", "string", 0),
                ("Completions", "string", 0),
                ("Duration", "string", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let status = if condition_true(o, "Complete") {
                    "Complete"
                } else if condition_true(o, "Failed") {
                    "Failed"
                } else if condition_true(o, "Suspended") {
                    "Suspended"
                } else if condition_true(o, "FailureTarget") {
                    "FailureTarget"
                } else if condition_true(o, "SuccessCriteriaMet") {
                    "SuccessCriteriaMet"
                } else {
                    "Running"
                };
                let completions = match o.pointer("/spec/completions").and_then(Value::as_i64) {
                    Some(n) => format!("{}/{n}", i(o.pointer("/status/succeeded"))),
                    None => {
                        let p = o.pointer("/spec/parallelism").and_then(Value::as_i64).unwrap_or(1);
                        if p > 1 {
                            format!("{}/1 of {p}", i(o.pointer("/status/succeeded")))
                        } else {
                            format!("{}/1", i(o.pointer("/status/succeeded")))
                        }
                    }
                };
                let duration = seconds_between(o.pointer("/status/startTime"), o.pointer("/status/completionTime"))
                    .map(human_duration)
                    .unwrap_or_default();
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(status),
                    json!(completions),
                    json!(duration),
                    json!(age(o)),
                ]
            },
        ),
        ("batch", "cronjobs") => (
            cols(&[
                ("Name", "string", 0),
                ("Schedule", "string", 0),
                ("Timezone", "string", 0),
                ("Suspend", "boolean", 0),
                ("Active", "integer", 0),
                ("Last Schedule", "string", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let last = match o.pointer("/status/lastScheduleTime") {
                    Some(t) => since(Some(t)),
                    None => "<none>".into(),
                };
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(s(o.pointer("/spec/schedule"))),
                    json!(none_if_empty(s(o.pointer("/spec/timeZone")))),
                    json!(if o.pointer("/spec/suspend") == Some(&json!(true)) { "True" } else { "False" }),
                    json!(o.pointer("/status/active").and_then(Value::as_array).map_or(0, Vec::len)),
                    json!(last),
                    json!(age(o)),
                ]
            },
        ),
        ("autoscaling", "horizontalpodautoscalers") => (
            cols(&[
                ("Name", "string", 0),
                ("Reference", "string", 0),
                ("Targets", "string", 0),
                ("MinPods", "string", 0),
                ("MaxPods", "string", 0),
                ("Replicas", "string", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let reference = format!(
                    "{}/{}",
                    s(o.pointer("/spec/scaleTargetRef/kind")),
                    s(o.pointer("/spec/scaleTargetRef/name"))
                );
                let current =
                    o.pointer("/status/currentMetrics").and_then(Value::as_array).cloned().unwrap_or_default();
                let targets: Vec<String> = o
                    .pointer("/spec/metrics")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                    .map(|(idx, m)| {
                        let kind = s(m.get("type"));
                        let key = match kind.as_str() {
                            "Resource" => "resource",
                            "ContainerResource" => "containerResource",
                            "Pods" => "pods",
                            "Object" => "object",
                            _ => "external",
                        };
                        let quantity = |t: Option<&Value>| -> Option<String> {
                            let t = t?;
                            if let Some(u) = t.get("averageUtilization").and_then(Value::as_i64) {
                                return Some(format!("{u}%"));
                            }
                            t.get("averageValue").or_else(|| t.get("value")).map(|v| s(Some(v)))
                        };
                        let target =
                            quantity(m.pointer(&format!("/{key}/target"))).unwrap_or_else(|| "<unknown>".into());
                        let cur = quantity(current.get(idx).and_then(|c| c.pointer(&format!("/{key}/current"))))
                            .unwrap_or_else(|| "<unknown>".into());
                        let label = match key {
                            "resource" | "containerResource" => format!("{}: ", s(m.pointer(&format!("/{key}/name")))),
                            _ => String::new(),
                        };
                        format!("{label}{cur}/{target}")
                    })
                    .collect();
                let min = o
                    .pointer("/spec/minReplicas")
                    .and_then(Value::as_i64)
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "<unset>".into());
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(reference),
                    json!(if targets.is_empty() { "<none>".to_string() } else { targets.join(", ") }),
                    json!(min),
                    json!(i(o.pointer("/spec/maxReplicas")).to_string()),
                    json!(i(o.pointer("/status/currentReplicas")).to_string()),
                    json!(age(o)),
                ]
            },
        ),
        ("", "endpoints") => (cols(&[("Name", "string", 0), ("Endpoints", "string", 0), ("Age", "string", 0)]), |o| {
            let mut eps = Vec::new();
            for subset in o.get("subsets").and_then(Value::as_array).into_iter().flatten() {
                let ports: Vec<i64> = subset
                    .get("ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|p| i(p.get("port")))
                    .collect();
                for a in subset.get("addresses").and_then(Value::as_array).into_iter().flatten() {
                    let ip = s(a.get("ip"));
                    if ports.is_empty() {
                        eps.push(ip.clone());
                    }
                    for p in &ports {
                        eps.push(format!("{ip}:{p}"));
                    }
                }
            }
            let shown = if eps.len() > 3 {
                format!("{} + {} more...", eps[..3].join(","), eps.len() - 3)
            } else {
                eps.join(",")
            };
            vec![json!(s(o.pointer("/metadata/name"))), json!(none_if_empty(shown)), json!(age(o))]
        }),
        ("apiregistration.k8s.io", "apiservices") => (
            cols(&[("Name", "string", 0), ("Service", "string", 0), ("Available", "string", 0), ("Age", "string", 0)]),
            |o| {
                let service = match o.pointer("/spec/service").filter(|v| !v.is_null()) {
                    Some(svc) => format!("{}/{}", s(svc.get("namespace")), s(svc.get("name"))),
                    None => "Local".to_string(),
                };
                let available = o
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.iter().find(|c| c.get("type") == Some(&json!("Available"))))
                    .map(|c| match s(c.get("status")).as_str() {
                        "True" => "True".to_string(),
                        other => format!("{other} ({})", s(c.get("reason"))),
                    })
                    .unwrap_or_else(|| "Unknown".into());
                vec![json!(s(o.pointer("/metadata/name"))), json!(service), json!(available), json!(age(o))]
            },
        ),
        ("certificates.k8s.io", "certificatesigningrequests") => (
            cols(&[
                ("Name", "string", 0),
                ("Age", "string", 0),
                ("SignerName", "string", 0),
                ("Requestor", "string", 0),
                ("RequestedDuration", "string", 0),
                ("Condition", "string", 0),
            ]),
            |o| {
                let has = |ty: &str| {
                    o.pointer("/status/conditions")
                        .and_then(Value::as_array)
                        .is_some_and(|cs| cs.iter().any(|c| c.get("type") == Some(&json!(ty))))
                };
                // kubectl's order of precedence: Denied, Approved, Pending; then Failed, Issued.
                let mut condition = if has("Denied") {
                    "Denied"
                } else if has("Approved") {
                    "Approved"
                } else {
                    "Pending"
                }
                .to_string();
                if has("Failed") {
                    condition.push_str(",Failed");
                }
                if o.pointer("/status/certificate").and_then(Value::as_str).is_some_and(|c| !c.is_empty()) {
                    condition.push_str(",Issued");
                }
                let duration = o
                    .pointer("/spec/expirationSeconds")
                    .and_then(Value::as_i64)
                    .map(human_duration)
                    .unwrap_or_else(|| "<none>".into());
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(age(o)),
                    json!(s(o.pointer("/spec/signerName"))),
                    json!(s(o.pointer("/spec/username"))),
                    json!(duration),
                    json!(condition),
                ]
            },
        ),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations" | "validatingwebhookconfigurations") => {
            (cols(&[("Name", "string", 0), ("Webhooks", "integer", 0), ("Age", "string", 0)]), |o| {
                let n = o.get("webhooks").and_then(Value::as_array).map_or(0, Vec::len);
                vec![json!(s(o.pointer("/metadata/name"))), json!(n), json!(age(o))]
            })
        }
        ("storage.k8s.io", "storageclasses") => (
            cols(&[
                ("Name", "string", 0),
                ("Provisioner", "string", 0),
                ("ReclaimPolicy", "string", 0),
                ("VolumeBindingMode", "string", 0),
                ("AllowVolumeExpansion", "string", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let mut n = s(o.pointer("/metadata/name"));
                if o.pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class")
                    == Some(&json!("true"))
                {
                    n.push_str(" (default)");
                }
                let rp = s(o.get("reclaimPolicy"));
                let vbm = s(o.get("volumeBindingMode"));
                vec![
                    json!(n),
                    json!(s(o.get("provisioner"))),
                    json!(if rp.is_empty() { "Delete".to_string() } else { rp }),
                    json!(if vbm.is_empty() { "Immediate".to_string() } else { vbm }),
                    json!(if o.get("allowVolumeExpansion") == Some(&json!(true)) { "true" } else { "false" }),
                    json!(age(o)),
                ]
            },
        ),
        ("storage.k8s.io", "csidrivers") => (
            cols(&[
                ("Name", "string", 0),
                ("AttachRequired", "boolean", 0),
                ("PodInfoOnMount", "boolean", 0),
                ("StorageCapacity", "boolean", 0),
                ("TokenRequests", "string", 0),
                ("RequiresRepublish", "boolean", 0),
                ("Modes", "string", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let flag = |p: &str, default: bool| json!(o.pointer(p).and_then(Value::as_bool).unwrap_or(default));
                let list = |p: &str, f: &dyn Fn(&Value) -> String| {
                    let v: Vec<String> = o.pointer(p).and_then(Value::as_array).into_iter().flatten().map(f).collect();
                    v.join(",")
                };
                let tokens = list("/spec/tokenRequests", &|t| s(t.get("audience")));
                let modes = list("/spec/volumeLifecycleModes", &|m| s(Some(m)));
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    flag("/spec/attachRequired", true),
                    flag("/spec/podInfoOnMount", false),
                    flag("/spec/storageCapacity", false),
                    json!(if tokens.is_empty() { "<unset>".to_string() } else { tokens }),
                    flag("/spec/requiresRepublish", false),
                    json!(if modes.is_empty() { "<none>".to_string() } else { modes }),
                    json!(age(o)),
                ]
            },
        ),
        ("storage.k8s.io", "csinodes") => {
            (cols(&[("Name", "string", 0), ("Drivers", "integer", 0), ("Age", "string", 0)]), |o| {
                let n = o.pointer("/spec/drivers").and_then(Value::as_array).map_or(0, Vec::len);
                vec![json!(s(o.pointer("/metadata/name"))), json!(n), json!(age(o))]
            })
        }
        ("storage.k8s.io", "volumeattachments") => (
            cols(&[
                ("Name", "string", 0),
                ("Attacher", "string", 0),
                ("PV", "string", 0),
                ("Node", "string", 0),
                ("Attached", "boolean", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(s(o.pointer("/spec/attacher"))),
                    json!(s(o.pointer("/spec/source/persistentVolumeName"))),
                    json!(s(o.pointer("/spec/nodeName"))),
                    json!(o.pointer("/status/attached").and_then(Value::as_bool).unwrap_or(false)),
                    json!(age(o)),
                ]
            },
        ),
        ("node.k8s.io", "runtimeclasses") => {
            (cols(&[("Name", "string", 0), ("Handler", "string", 0), ("Age", "string", 0)]), |o| {
                vec![json!(s(o.pointer("/metadata/name"))), json!(s(o.get("handler"))), json!(age(o))]
            })
        }
        ("networking.k8s.io", "ingresses") => (
            cols(&[
                ("Name", "string", 0),
                ("Class", "string", 0),
                ("Hosts", "string", 0),
                ("Address", "string", 0),
                ("Ports", "string", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let hosts: Vec<String> = o
                    .pointer("/spec/rules")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|r| s(r.get("host")))
                    .map(|h| if h.is_empty() { "*".to_string() } else { h })
                    .collect();
                let addrs: Vec<String> = o
                    .pointer("/status/loadBalancer/ingress")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|x| {
                        let ip = s(x.get("ip"));
                        if ip.is_empty() {
                            s(x.get("hostname"))
                        } else {
                            ip
                        }
                    })
                    .collect();
                let tls = o.pointer("/spec/tls").and_then(Value::as_array).is_some_and(|t| !t.is_empty());
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(none_if_empty(s(o.pointer("/spec/ingressClassName")))),
                    json!(if hosts.is_empty() { "*".to_string() } else { hosts.join(",") }),
                    json!(addrs.join(",")),
                    json!(if tls { "80, 443" } else { "80" }),
                    json!(age(o)),
                ]
            },
        ),
        ("policy", "poddisruptionbudgets") => (
            cols(&[
                ("Name", "string", 0),
                ("Min Available", "string", 0),
                ("Max Unavailable", "string", 0),
                ("Allowed Disruptions", "integer", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let budget = |p: &str| match o.pointer(p) {
                    Some(Value::Number(n)) => n.to_string(),
                    Some(Value::String(s)) => s.clone(),
                    _ => "N/A".into(),
                };
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(budget("/spec/minAvailable")),
                    json!(budget("/spec/maxUnavailable")),
                    json!(i(o.pointer("/status/disruptionsAllowed"))),
                    json!(age(o)),
                ]
            },
        ),
        ("apps", "controllerrevisions") => (
            cols(&[
                ("Name", "string", 0),
                ("Controller", "string", 0),
                ("Revision", "integer", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let owner = o
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .and_then(|refs| refs.iter().find(|r| r.get("controller") == Some(&json!(true))))
                    .map(|r| {
                        let group =
                            s(r.get("apiVersion")).split_once('/').map(|(g, _)| format!(".{g}")).unwrap_or_default();
                        format!("{}{group}/{}", s(r.get("kind")).to_lowercase(), s(r.get("name")))
                    })
                    .unwrap_or_else(|| "<none>".into());
                vec![json!(s(o.pointer("/metadata/name"))), json!(owner), json!(i(o.get("revision"))), json!(age(o))]
            },
        ),
        ("", "podtemplates") => (
            cols(&[
                ("Name", "string", 0),
                ("Containers", "string", 0),
                ("Images", "string", 0),
                ("Pod Labels", "string", 0),
            ]),
            |o| {
                let containers =
                    o.pointer("/template/spec/containers").and_then(Value::as_array).cloned().unwrap_or_default();
                let field = |f: &str| containers.iter().map(|c| s(c.get(f))).collect::<Vec<_>>().join(",");
                let labels = o
                    .pointer("/template/metadata/labels")
                    .and_then(Value::as_object)
                    .map(|m| m.iter().map(|(k, v)| format!("{k}={}", s(Some(v)))).collect::<Vec<_>>().join(","))
                    .filter(|l| !l.is_empty())
                    .unwrap_or_else(|| "<none>".into());
                vec![json!(s(o.pointer("/metadata/name"))), json!(field("name")), json!(field("image")), json!(labels)]
            },
        ),
        ("coordination.k8s.io", "leases") => {
            (cols(&[("Name", "string", 0), ("Holder", "string", 0), ("Age", "string", 0)]), |o| {
                vec![json!(s(o.pointer("/metadata/name"))), json!(s(o.pointer("/spec/holderIdentity"))), json!(age(o))]
            })
        }
        ("", "serviceaccounts") => {
            (cols(&[("Name", "string", 0), ("Secrets", "string", 0), ("Age", "string", 0)]), |o| {
                let n = o.get("secrets").and_then(Value::as_array).map_or(0, Vec::len);
                vec![json!(s(o.pointer("/metadata/name"))), json!(n.to_string()), json!(age(o))]
            })
        }
        ("rbac.authorization.k8s.io", "roles") | ("rbac.authorization.k8s.io", "clusterroles") => {
            (cols(&[("Name", "string", 0), ("Created At", "date", 0)]), |o| {
                vec![json!(s(o.pointer("/metadata/name"))), json!(s(o.pointer("/metadata/creationTimestamp")))]
            })
        }
        ("rbac.authorization.k8s.io", "rolebindings") | ("rbac.authorization.k8s.io", "clusterrolebindings") => (
            cols(&[
                ("Name", "string", 0),
                ("Role", "string", 0),
                ("Age", "string", 0),
                ("Users", "string", 1),
                ("Groups", "string", 1),
                ("ServiceAccounts", "string", 1),
            ]),
            |o| {
                let subjects = o.get("subjects").and_then(Value::as_array).cloned().unwrap_or_default();
                let of = |kind: &str| -> String {
                    subjects
                        .iter()
                        .filter(|x| x.get("kind") == Some(&json!(kind)))
                        .map(|x| {
                            let ns = s(x.get("namespace"));
                            let n = s(x.get("name"));
                            if kind == "ServiceAccount" {
                                format!("{ns}/{n}")
                            } else {
                                n
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(format!("{}/{}", s(o.pointer("/roleRef/kind")), s(o.pointer("/roleRef/name")))),
                    json!(age(o)),
                    json!(of("User")),
                    json!(of("Group")),
                    json!(of("ServiceAccount")),
                ]
            },
        ),
        ("", "persistentvolumes") => (
            cols(&[
                ("Name", "string", 0),
                ("Capacity", "string", 0),
                ("Access Modes", "string", 0),
                ("Reclaim Policy", "string", 0),
                ("Status", "string", 0),
                ("Claim", "string", 0),
                ("StorageClass", "string", 0),
                ("VolumeAttributesClass", "string", 0),
                ("Reason", "string", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                let claim = match (o.pointer("/spec/claimRef/namespace"), o.pointer("/spec/claimRef/name")) {
                    (Some(ns), Some(n)) => format!("{}/{}", s(Some(ns)), s(Some(n))),
                    _ => String::new(),
                };
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(s(o.pointer("/spec/capacity/storage"))),
                    json!(apimachinery::printers::access_modes(o.pointer("/spec/accessModes"))),
                    json!(s(o.pointer("/spec/persistentVolumeReclaimPolicy"))),
                    json!(s(o.pointer("/status/phase"))),
                    json!(claim),
                    json!(s(o.pointer("/spec/storageClassName"))),
                    json!(none_if_empty(s(o.pointer("/spec/volumeAttributesClassName")))),
                    json!(s(o.pointer("/status/reason"))),
                    json!(age(o)),
                ]
            },
        ),
        ("", "persistentvolumeclaims") => (
            cols(&[
                ("Name", "string", 0),
                ("Status", "string", 0),
                ("Volume", "string", 0),
                ("Capacity", "string", 0),
                ("Access Modes", "string", 0),
                ("StorageClass", "string", 0),
                ("VolumeAttributesClass", "string", 0),
                ("Age", "string", 0),
            ]),
            |o| {
                vec![
                    json!(s(o.pointer("/metadata/name"))),
                    json!(s(o.pointer("/status/phase"))),
                    json!(s(o.pointer("/spec/volumeName"))),
                    json!(s(o.pointer("/status/capacity/storage"))),
                    json!(apimachinery::printers::access_modes(o.pointer("/status/accessModes"))),
                    json!(s(o.pointer("/spec/storageClassName"))),
                    json!(none_if_empty(s(o.pointer("/spec/volumeAttributesClassName")))),
                    json!(age(o)),
                ]
            },
        ),
        _ => (cols(&[("Name", "string", 0), ("Age", "string", 0)]), |o| {
            vec![json!(s(o.pointer("/metadata/name"))), json!(age(o))]
        }),
    }
}
