//! Server-side printing (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`): the columns
//! `kubectl get` shows. Pure.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::resources::ResourceDef;

struct Col {
    name: &'static str,
    ty: &'static str,
    format: &'static str,
    priority: i64,
    description: &'static str,
}

const fn col(name: &'static str, ty: &'static str) -> Col {
    Col { name, ty, format: "", priority: 0, description: "" }
}

fn columns(res: &ResourceDef) -> Vec<Col> {
    let name = Col {
        name: "Name",
        ty: "string",
        format: "name",
        priority: 0,
        description: "Name must be unique within a namespace.",
    };
    let age = col("Age", "string");
    let mut cols = vec![name];
    match (res.group, res.plural) {
        ("", "pods") => {
            cols.extend([col("Ready", "string"), col("Status", "string"), col("Restarts", "string"), age]);
            cols.push(Col { priority: 1, ..col("IP", "string") });
            cols.push(Col { priority: 1, ..col("Node", "string") });
        }
        ("apps", "deployments") => {
            cols.extend([col("Ready", "string"), col("Up-to-date", "integer"), col("Available", "integer"), age])
        }
        ("apps", "replicasets") | ("", "replicationcontrollers") => {
            cols.extend([col("Desired", "integer"), col("Current", "integer"), col("Ready", "integer"), age])
        }
        ("apps", "statefulsets") => cols.extend([col("Ready", "string"), age]),
        ("apps", "daemonsets") => cols.extend([
            col("Desired", "integer"),
            col("Current", "integer"),
            col("Ready", "integer"),
            col("Available", "integer"),
            age,
        ]),
        ("", "services") => cols.extend([
            col("Type", "string"),
            col("Cluster-IP", "string"),
            col("External-IP", "string"),
            col("Port(s)", "string"),
            age,
        ]),
        ("", "namespaces") => cols.extend([col("Status", "string"), age]),
        ("", "nodes") => cols.extend([col("Status", "string"), col("Roles", "string"), age, col("Version", "string")]),
        ("", "configmaps") => cols.extend([col("Data", "integer"), age]),
        ("", "secrets") => cols.extend([col("Type", "string"), col("Data", "integer"), age]),
        ("batch", "jobs") => cols.extend([col("Completions", "string"), age]),
        ("", "persistentvolumeclaims") => {
            cols.extend([col("Status", "string"), col("Volume", "string"), col("Capacity", "string"), age])
        }
        ("", "persistentvolumes") => {
            cols.extend([col("Capacity", "string"), col("Status", "string"), col("Claim", "string"), age])
        }
        _ => cols.push(age),
    }
    cols
}

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

/// Kubernetes' short human durations ("5s", "3m20s", "4h", "2d").
pub fn human_duration(secs: i64) -> String {
    let secs = secs.max(0);
    if secs < 120 {
        return format!("{secs}s");
    }
    let mins = secs / 60;
    if mins < 10 {
        let s = secs % 60;
        return if s == 0 { format!("{mins}m") } else { format!("{mins}m{s}s") };
    }
    if mins < 180 {
        return format!("{mins}m");
    }
    let hours = mins / 60;
    if hours < 8 {
        let m = mins % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if days < 8 {
        let h = hours % 24;
        return if h == 0 { format!("{days}d") } else { format!("{days}d{h}h") };
    }
    if days < 365 * 2 {
        return format!("{days}d");
    }
    format!("{}y", days / 365)
}

fn age(obj: &Value) -> String {
    let Some(ts) = obj.pointer("/metadata/creationTimestamp").and_then(Value::as_str) else {
        return "<unknown>".into();
    };
    match ts.parse::<jiff::Timestamp>() {
        Ok(t) => human_duration(jiff::Timestamp::now().as_second() - t.as_second()),
        Err(_) => "<unknown>".into(),
    }
}

fn cells(res: &ResourceDef, o: &Value) -> Vec<Value> {
    let name = json!(s(o.pointer("/metadata/name")));
    let a = json!(age(o));
    let mut c = vec![name];
    match (res.group, res.plural) {
        ("", "pods") => {
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
            let ip = s(o.pointer("/status/podIP"));
            let node = s(o.pointer("/spec/nodeName"));
            c.extend([
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts.to_string()),
                a,
                json!(if ip.is_empty() { "<none>".to_string() } else { ip }),
                json!(if node.is_empty() { "<none>".to_string() } else { node }),
            ]);
        }
        ("apps", "deployments") => c.extend([
            json!(format!("{}/{}", i(o.pointer("/status/readyReplicas")), i(o.pointer("/spec/replicas")))),
            json!(i(o.pointer("/status/updatedReplicas"))),
            json!(i(o.pointer("/status/availableReplicas"))),
            a,
        ]),
        ("apps", "replicasets") | ("", "replicationcontrollers") => c.extend([
            json!(i(o.pointer("/spec/replicas"))),
            json!(i(o.pointer("/status/replicas"))),
            json!(i(o.pointer("/status/readyReplicas"))),
            a,
        ]),
        ("apps", "statefulsets") => c.extend([
            json!(format!("{}/{}", i(o.pointer("/status/readyReplicas")), i(o.pointer("/spec/replicas")))),
            a,
        ]),
        ("apps", "daemonsets") => c.extend([
            json!(i(o.pointer("/status/desiredNumberScheduled"))),
            json!(i(o.pointer("/status/currentNumberScheduled"))),
            json!(i(o.pointer("/status/numberReady"))),
            json!(i(o.pointer("/status/numberAvailable"))),
            a,
        ]),
        ("", "services") => {
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
            let cip = s(o.pointer("/spec/clusterIP"));
            c.extend([
                json!(ty),
                json!(if cip.is_empty() { "<none>".to_string() } else { cip }),
                json!(ext),
                json!(if ports.is_empty() { "<none>".to_string() } else { ports.join(",") }),
                a,
            ]);
        }
        ("", "namespaces") => c.extend([json!(s(o.pointer("/status/phase"))), a]),
        ("", "nodes") => {
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
            let roles: Vec<String> = o
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/").map(String::from))
                .collect();
            c.extend([
                json!(status),
                json!(if roles.is_empty() { "<none>".to_string() } else { roles.join(",") }),
                a,
                json!(s(o.pointer("/status/nodeInfo/kubeletVersion"))),
            ]);
        }
        ("", "configmaps") => {
            let n = ["data", "binaryData"]
                .iter()
                .map(|f| o.get(*f).and_then(Value::as_object).map_or(0, |m| m.len()))
                .sum::<usize>();
            c.extend([json!(n), a]);
        }
        ("", "secrets") => {
            let n = o.get("data").and_then(Value::as_object).map_or(0, |m| m.len());
            c.extend([json!(s(o.get("type"))), json!(n), a]);
        }
        ("batch", "jobs") => c.extend([
            json!(format!("{}/{}", i(o.pointer("/status/succeeded")), i(o.pointer("/spec/completions")).max(1))),
            a,
        ]),
        ("", "persistentvolumeclaims") => c.extend([
            json!(s(o.pointer("/status/phase"))),
            json!(s(o.pointer("/spec/volumeName"))),
            json!(s(o.pointer("/status/capacity/storage"))),
            a,
        ]),
        ("", "persistentvolumes") => {
            let claim = match (o.pointer("/spec/claimRef/namespace"), o.pointer("/spec/claimRef/name")) {
                (Some(ns), Some(n)) => format!("{}/{}", s(Some(ns)), s(Some(n))),
                _ => String::new(),
            };
            c.extend([
                json!(s(o.pointer("/spec/capacity/storage"))),
                json!(s(o.pointer("/status/phase"))),
                json!(claim),
                a,
            ]);
        }
        _ => c.push(a),
    }
    c
}

/// Convert a list (`{"metadata":…, "items":[…]}`) to a meta.k8s.io/v1 Table.
pub fn to_table(res: &ResourceDef, list: &Value, query: &HashMap<String, String>) -> Value {
    let cols: Vec<Value> = columns(res)
        .iter()
        .map(|c| json!({"name": c.name, "type": c.ty, "format": c.format, "description": c.description, "priority": c.priority}))
        .collect();
    let include = query.get("includeObject").map(String::as_str).unwrap_or("PartialObjectMetadata");
    let rows: Vec<Value> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            let mut row = json!({"cells": cells(res, o)});
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
    fn pod_table() {
        let res = crate::resources::find("", "v1", "pods").unwrap();
        let list = json!({"metadata": {"resourceVersion": "5"}, "items": [{
            "metadata": {"name": "p", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "containerStatuses": [{"ready": true, "restartCount": 2}]}}]});
        let t = to_table(res, &list, &HashMap::new());
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["rows"][0]["cells"][0], "p");
        assert_eq!(t["rows"][0]["cells"][1], "1/2");
        assert_eq!(t["rows"][0]["cells"][2], "Running");
        assert_eq!(t["rows"][0]["cells"][3], "2");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 7);
    }
}
