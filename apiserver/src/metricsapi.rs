//! `metrics.k8s.io/v1beta1` (NodeMetrics, PodMetrics), what metrics-server serves and
//! `kubectl top` reads, computed on request from the kubelets' `/stats/summary` (reached as
//! `pods/log` reaches them: the Node's address and kubelet port). Read-only: get and list.
//!
//! The mapping from a Summary to the metrics objects is pure; the I/O asks every relevant
//! kubelet at once, each with a timeout, and leaves out the nodes that do not answer (as
//! metrics-server does).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult};
use crate::registry::generic::{ListOptions, Registry};
use crate::requestinfo::ResourcePath;

pub const GROUP: &str = "metrics.k8s.io";
pub const VERSION: &str = "v1beta1";
const API_VERSION: &str = "metrics.k8s.io/v1beta1";
/// How long one kubelet may take to answer.
const KUBELET_TIMEOUT: Duration = Duration::from_secs(5);
/// The span a CPU rate covers: the kubelet's default `--housekeeping-interval`, between
/// two samples of a container's cgroup.
const WINDOW: &str = "10s";

/// `GET /apis/metrics.k8s.io/v1beta1`.
pub fn resource_list() -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": API_VERSION,
        "resources": [
            {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics", "verbs": ["get", "list"]},
            {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics", "verbs": ["get", "list"]},
        ],
    })
}

/// CPU as a canonical decimal quantity from nanocores (`250m`, `1234567n`, `2`).
pub fn cpu_quantity(nanocores: u64) -> String {
    if nanocores == 0 {
        return "0".into();
    }
    let mut v = nanocores;
    for suffix in ["n", "u", "m"] {
        if !v.is_multiple_of(1000) {
            return format!("{v}{suffix}");
        }
        v /= 1000;
    }
    v.to_string()
}

/// Memory as a canonical binary quantity from bytes (`1536Ki`, `2Gi`, `1000`).
pub fn memory_quantity(bytes: u64) -> String {
    if bytes == 0 {
        return "0".into();
    }
    let mut v = bytes;
    let mut suffix = "";
    for s in ["Ki", "Mi", "Gi", "Ti", "Pi"] {
        if !v.is_multiple_of(1024) {
            break;
        }
        v /= 1024;
        suffix = s;
    }
    format!("{v}{suffix}")
}

fn u(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_u64).unwrap_or(0)
}

fn meta_of(obj: &Value, with_namespace: bool) -> Value {
    let mut m = json!({
        "name": obj.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
        "creationTimestamp": crate::registry::generic::now_rfc3339(),
    });
    if with_namespace {
        m["namespace"] = obj.pointer("/metadata/namespace").cloned().unwrap_or(Value::Null);
    }
    if let Some(l) = obj.pointer("/metadata/labels") {
        m["labels"] = l.clone();
    }
    m
}

/// The NodeMetrics of a Node from its kubelet's Summary. CPU is the node's own figure when
/// the Summary has one, else the sum of its pods' (kubelets sharing one host report only
/// their pods).
pub fn node_metrics(node: &Value, summary: &Value) -> Value {
    let cpu = match summary.pointer("/node/cpu/usageNanoCores").and_then(Value::as_u64) {
        Some(n) => n,
        None => summary
            .get("pods")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|p| u(p.pointer("/cpu/usageNanoCores")))
            .sum(),
    };
    let memory = u(summary.pointer("/node/memory/workingSetBytes"));
    let timestamp =
        summary.pointer("/node/memory/time").cloned().unwrap_or_else(|| json!(crate::registry::generic::now_rfc3339()));
    json!({
        "kind": "NodeMetrics",
        "apiVersion": API_VERSION,
        "metadata": meta_of(node, false),
        "timestamp": timestamp,
        "window": WINDOW,
        "usage": {"cpu": cpu_quantity(cpu), "memory": memory_quantity(memory)},
    })
}

/// The PodMetrics of a Pod from its entry in the kubelet's Summary (`pods[]`).
pub fn pod_metrics(pod: &Value, stats: &Value) -> Value {
    let containers: Vec<Value> = stats
        .get("containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            json!({
                "name": c.get("name").cloned().unwrap_or(Value::Null),
                "usage": {
                    "cpu": cpu_quantity(u(c.pointer("/cpu/usageNanoCores"))),
                    "memory": memory_quantity(u(c.pointer("/memory/workingSetBytes"))),
                },
            })
        })
        .collect();
    let timestamp = stats
        .pointer("/cpu/time")
        .or_else(|| stats.pointer("/containers/0/cpu/time"))
        .cloned()
        .unwrap_or_else(|| json!(crate::registry::generic::now_rfc3339()));
    json!({
        "kind": "PodMetrics",
        "apiVersion": API_VERSION,
        "metadata": meta_of(pod, true),
        "timestamp": timestamp,
        "window": WINDOW,
        "containers": containers,
    })
}

/// The Summary's pod entries by (namespace, name).
pub fn summary_pods(summary: &Value) -> HashMap<(String, String), Value> {
    summary
        .get("pods")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let ns = p.pointer("/podRef/namespace")?.as_str()?.to_string();
            let name = p.pointer("/podRef/name")?.as_str()?.to_string();
            Some(((ns, name), p.clone()))
        })
        .collect()
}

// ------------------------------------------------------------------ I/O

/// The kubelet's Summary, or None when it cannot be had in time.
async fn summary_of(node: &Value) -> Option<Value> {
    let (host, port) = crate::kubeletclient::kubelet_address(node).ok()?;
    let fetch = async {
        let resp = crate::kubeletclient::proxy_get(&host, port, "/stats/summary").await.ok()?;
        let body = axum::body::to_bytes(resp.into_body(), 64 << 20).await.ok()?;
        serde_json::from_slice::<Value>(&body).ok()
    };
    match tokio::time::timeout(KUBELET_TIMEOUT, fetch).await {
        Ok(Some(v)) => Some(v),
        _ => {
            let name = node.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            tracing::debug!(node = name, "no summary from the kubelet");
            None
        }
    }
}

fn list_of(kind: &str, items: Vec<Value>) -> Value {
    json!({"kind": format!("{kind}List"), "apiVersion": API_VERSION, "metadata": {}, "items": items})
}

/// Serve a `metrics.k8s.io/v1beta1` request (GET only).
pub async fn serve(reg: &Registry, rp: &ResourcePath, watch: bool, opts: ListOptions) -> ApiResult<Value> {
    if rp.version != VERSION || rp.subresource.is_some() {
        return Err(ApiError::not_found_message("the server could not find the requested resource"));
    }
    if watch {
        return Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"));
    }
    let nodes_res = crate::resources::find("", "v1", "nodes").ok_or_else(|| ApiError::internal("no nodes resource"))?;
    let pods_res = crate::resources::find("", "v1", "pods").ok_or_else(|| ApiError::internal("no pods resource"))?;
    let all = ListOptions { label_selector: Default::default(), field_selector: Default::default(), ..opts.clone() };
    match rp.resource.as_str() {
        "nodes" => {
            if rp.namespace.is_some() {
                return Err(ApiError::not_found_message("the server could not find the requested resource"));
            }
            let nodes: Vec<Value> = match &rp.name {
                Some(n) => {
                    vec![reg.get(nodes_res, "", n).await.map_err(|_| ApiError::not_found(GROUP, "nodemetrics", n))?]
                }
                None => reg.list(nodes_res, None, &opts).await?["items"].as_array().cloned().unwrap_or_default(),
            };
            let summaries = futures::future::join_all(nodes.iter().map(summary_of)).await;
            let items: Vec<Value> =
                nodes.iter().zip(summaries).filter_map(|(n, s)| s.map(|s| node_metrics(n, &s))).collect();
            match &rp.name {
                Some(n) => items.into_iter().next().ok_or_else(|| ApiError::not_found(GROUP, "nodemetrics", n)),
                None => Ok(list_of("NodeMetrics", items)),
            }
        }
        "pods" => {
            let pods: Vec<Value> = match (&rp.name, &rp.namespace) {
                (Some(n), Some(ns)) => vec![reg
                    .get(pods_res, ns, n)
                    .await
                    .map_err(|_| ApiError::not_found(GROUP, "podmetrics", &format!("{ns}/{n}")))?],
                (Some(_), None) => {
                    return Err(ApiError::not_found_message("the server could not find the requested resource"));
                }
                (None, ns) => {
                    reg.list(pods_res, ns.as_deref(), &opts).await?["items"].as_array().cloned().unwrap_or_default()
                }
            };
            // One Summary per node that runs one of these pods.
            let mut node_names: Vec<String> = pods
                .iter()
                .filter_map(|p| p.pointer("/spec/nodeName").and_then(Value::as_str))
                .map(String::from)
                .collect();
            node_names.sort();
            node_names.dedup();
            let nodes: Vec<Value> = reg.list(nodes_res, None, &all).await?["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| {
                    n.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .is_some_and(|x| node_names.binary_search(&x.to_string()).is_ok())
                })
                .cloned()
                .collect();
            let summaries = futures::future::join_all(nodes.iter().map(summary_of)).await;
            let mut stats: HashMap<(String, String), Value> = HashMap::new();
            for s in summaries.into_iter().flatten() {
                stats.extend(summary_pods(&s));
            }
            let mut items: BTreeMap<(String, String), Value> = BTreeMap::new();
            for p in &pods {
                let key = (
                    p.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default().to_string(),
                    p.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string(),
                );
                if let Some(st) = stats.get(&key) {
                    items.insert(key, pod_metrics(p, st));
                }
            }
            match (&rp.name, &rp.namespace) {
                (Some(n), Some(ns)) => items
                    .into_values()
                    .next()
                    .ok_or_else(|| ApiError::not_found(GROUP, "podmetrics", &format!("{ns}/{n}"))),
                _ => Ok(list_of("PodMetrics", items.into_values().collect())),
            }
        }
        _ => Err(ApiError::not_found_message("the server could not find the requested resource")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(cpu_quantity(0), "0");
        assert_eq!(cpu_quantity(1_234_567), "1234567n");
        assert_eq!(cpu_quantity(250_000_000), "250m");
        assert_eq!(cpu_quantity(2_000_000_000), "2");
        assert_eq!(cpu_quantity(1_500_000), "1500u");
        assert_eq!(memory_quantity(1536 * 1024), "1536Ki");
        assert_eq!(memory_quantity(2 << 30), "2Gi");
        assert_eq!(memory_quantity(1000), "1000");
    }

    fn summary() -> Value {
        json!({
            "node": {"nodeName": "n1", "memory": {"time": "2024-01-01T00:00:00Z", "workingSetBytes": 3u64 << 30}},
            "pods": [
                {"podRef": {"name": "a", "namespace": "default", "uid": "1"},
                 "cpu": {"time": "2024-01-01T00:00:01Z", "usageNanoCores": 250_000_000u64},
                 "containers": [
                    {"name": "c1", "cpu": {"usageNanoCores": 200_000_000u64}, "memory": {"workingSetBytes": 1u64 << 20}},
                    {"name": "c2", "cpu": {"usageNanoCores": 50_000_000u64}, "memory": {"workingSetBytes": 2u64 << 20}}]},
                {"podRef": {"name": "b", "namespace": "demo", "uid": "2"}, "cpu": {"usageNanoCores": 5_000_000u64}, "containers": []}
            ]
        })
    }

    #[test]
    fn node_metrics_from_a_summary() {
        let node = json!({"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}}});
        let m = node_metrics(&node, &summary());
        assert_eq!(m["kind"], "NodeMetrics");
        assert_eq!(m["metadata"]["name"], "n1");
        assert_eq!(m["metadata"]["labels"]["kubernetes.io/hostname"], "n1");
        // No node CPU in the summary: the pods' sum.
        assert_eq!(m["usage"], json!({"cpu": "255m", "memory": "3Gi"}));
        let mut s = summary();
        s["node"]["cpu"] = json!({"usageNanoCores": 1_000_000_000u64});
        assert_eq!(node_metrics(&node, &s)["usage"]["cpu"], "1");
    }

    #[test]
    fn pod_metrics_from_a_summary() {
        let pods = summary_pods(&summary());
        let st = &pods[&("default".to_string(), "a".to_string())];
        let pod = json!({"metadata": {"name": "a", "namespace": "default", "labels": {"app": "x"}}});
        let m = pod_metrics(&pod, st);
        assert_eq!(m["kind"], "PodMetrics");
        assert_eq!(m["metadata"]["namespace"], "default");
        assert_eq!(m["timestamp"], "2024-01-01T00:00:01Z");
        assert_eq!(
            m["containers"],
            json!([{"name": "c1", "usage": {"cpu": "200m", "memory": "1Mi"}}, {"name": "c2", "usage": {"cpu": "50m", "memory": "2Mi"}}])
        );
        assert!(pods.contains_key(&("demo".to_string(), "b".to_string())));
    }
}
