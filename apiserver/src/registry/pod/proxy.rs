//! The pod's proxied subresources: `pods/log` (the kubelet's
//! `/containerLogs/<namespace>/<pod>/<container>`, streamed back) and `pods/exec`,
//! `pods/attach`, `pods/portforward` (the kubelet's `/exec`, `/attach`, `/portForward`,
//! through [`crate::kubeletclient`]'s upgrade-aware proxy). The decisions — which container,
//! which query, which path — are pure functions.

use std::collections::HashMap;

use axum::response::Response;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::kubeletclient;
use crate::registry::generic::Registry;
use crate::registry::ResourceDef;

/// The container a log request is for: the `container` parameter, or the pod's only container.
pub fn log_container(pod: &Value, requested: Option<&str>) -> ApiResult<String> {
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let names = |p: &str| -> Vec<String> {
        pod.pointer(p)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(String::from))
            .collect()
    };
    let app = names("/spec/containers");
    let init = names("/spec/initContainers");
    let ephemeral = names("/spec/ephemeralContainers");
    match requested.filter(|c| !c.is_empty()) {
        Some(c) if app.iter().chain(&init).chain(&ephemeral).any(|x| x == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!("container {c} is not valid for pod {name}"))),
        None if app.len() == 1 => Ok(app[0].clone()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]{}{}",
            app.join(" "),
            if init.is_empty() {
                String::new()
            } else {
                format!(" or one of the init containers: [{}]", init.join(" "))
            },
            if ephemeral.is_empty() {
                String::new()
            } else {
                format!(" or one of the ephemeral containers: [{}]", ephemeral.join(" "))
            }
        ))),
    }
}

/// The query passed on to the kubelet (the log options it understands).
pub fn log_query(query: &HashMap<String, String>) -> String {
    let mut parts = Vec::new();
    for k in ["follow", "previous", "timestamps", "tailLines", "sinceSeconds", "limitBytes", "sinceTime"] {
        if let Some(v) = query.get(k).filter(|v| !v.is_empty()) {
            parts.push(format!("{k}={}", v.replace(['&', ' ', '#'], "")));
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// The streaming subresources proxied through an upgrade ([`stream`]).
pub fn is_stream_subresource(rp: &crate::requestinfo::ResourcePath) -> bool {
    rp.group.is_empty()
        && rp.resource == "pods"
        && matches!(rp.subresource.as_deref(), Some("exec" | "attach" | "portforward"))
}

/// The container an exec/attach request is for: the `container` parameter, else the
/// `kubectl.kubernetes.io/default-container` annotation (when it names a container), else
/// the pod's only container (Kubernetes' `validateContainer` rules and messages).
pub fn stream_container(pod: &Value, requested: Option<&str>) -> ApiResult<String> {
    let requested = requested.filter(|c| !c.is_empty());
    if requested.is_none() {
        if let Some(d) =
            pod.pointer("/metadata/annotations/kubectl.kubernetes.io~1default-container").and_then(Value::as_str)
        {
            if let Ok(c) = log_container(pod, Some(d)) {
                return Ok(c);
            }
        }
        let none = pod.pointer("/spec/containers").and_then(Value::as_array).is_none_or(|a| a.is_empty());
        if none {
            let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            return Err(ApiError::bad_request(format!("a container name must be specified for pod {name}")));
        }
    }
    log_container(pod, requested)
}

/// The values of `key` in a raw query string, in order (`command=` repeats).
pub fn query_values(raw: &str, key: &str) -> Vec<String> {
    raw.split('&')
        .filter_map(|p| p.split_once('=').or(Some((p, ""))))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| crate::requestinfo::percent_decode(v))
        .collect()
}

/// The kubelet path a streaming request goes to (`raw_query` passed through).
pub fn kubelet_stream_path(sub: &str, ns: &str, pod: &str, container: &str, raw_query: &str) -> String {
    let q = if raw_query.is_empty() { String::new() } else { format!("?{raw_query}") };
    match sub {
        "portforward" => format!("/portForward/{ns}/{pod}{q}"),
        _ => format!("/{sub}/{ns}/{pod}/{container}{q}"),
    }
}

/// The node a pod runs on (400 while it has none, as Kubernetes answers).
fn node_of<'a>(pod: &'a Value, name: &str) -> ApiResult<&'a str> {
    match pod.pointer("/spec/nodeName").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => Ok(n),
        _ => Err(ApiError::bad_request(format!("pod {name} does not have a host assigned"))),
    }
}

/// `pods/log`: the container's log from the kubelet of the pod's node, streamed back.
pub async fn logs(
    reg: &Registry,
    pods: &ResourceDef,
    nodes: &ResourceDef,
    ns: &str,
    name: &str,
    query: &HashMap<String, String>,
) -> ApiResult<Response> {
    let pod = reg.get(pods, ns, name).await?;
    let container = log_container(&pod, query.get("container").map(String::as_str))?;
    let (host, port) = kubeletclient::address_of(reg, nodes, node_of(&pod, name)?).await?;
    kubeletclient::proxy_get(&host, port, &format!("/containerLogs/{ns}/{name}/{container}{}", log_query(query))).await
}

/// `pods/{exec,attach,portforward}`: resolve the pod's kubelet and proxy the upgrade
/// (`kubectl port-forward` goes through here too, to the kubelet's `/portForward`).
pub async fn stream(
    reg: &Registry,
    pods: &ResourceDef,
    nodes: &ResourceDef,
    parts: &mut http::request::Parts,
    rp: &crate::requestinfo::ResourcePath,
) -> ApiResult<Response> {
    use http::Method;
    let sub = rp.subresource.as_deref().unwrap_or_default();
    if parts.method != Method::GET && parts.method != Method::POST {
        return Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"));
    }
    let (Some(ns), Some(name)) = (rp.namespace.as_deref(), rp.name.as_deref()) else {
        return Err(ApiError::not_found_message("the server could not find the requested resource"));
    };
    let pod = reg.get(pods, ns, name).await?;
    let raw_query = parts.uri.query().unwrap_or_default().to_string();
    let container = if sub == "portforward" {
        String::new()
    } else {
        let requested = query_values(&raw_query, "container").into_iter().next();
        stream_container(&pod, requested.as_deref())?
    };
    let (host, port) = kubeletclient::address_of(reg, nodes, node_of(&pod, name)?).await?;
    let path = kubelet_stream_path(sub, ns, name, &container, &raw_query);
    kubeletclient::proxy_upgrade(&host, port, &path, parts).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn picks_the_container() {
        let one = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(log_container(&one, None).unwrap(), "a");
        let two = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let e = log_container(&two, None).unwrap_err();
        assert_eq!(e.message, "a container name must be specified for pod p, choose one of: [a b]");
        assert_eq!(log_container(&two, Some("b")).unwrap(), "b");
        assert_eq!(log_container(&two, Some("z")).unwrap_err().code, 400);
    }

    #[test]
    fn passes_log_options() {
        let q: HashMap<String, String> = [("follow", "true"), ("tailLines", "5"), ("container", "x")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let s = log_query(&q);
        assert!(
            s.starts_with('?') && s.contains("follow=true") && s.contains("tailLines=5") && !s.contains("container")
        );
    }

    #[test]
    fn stream_container_rules() {
        let two = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        assert_eq!(stream_container(&two, Some("b")).unwrap(), "b");
        let e = stream_container(&two, None).unwrap_err();
        assert_eq!(e.message, "a container name must be specified for pod p, choose one of: [a b]");
        assert_eq!(stream_container(&two, Some("z")).unwrap_err().message, "container z is not valid for pod p");
        let mut debugged = two.clone();
        debugged["spec"]["ephemeralContainers"] = json!([{"name": "debugger"}]);
        assert_eq!(stream_container(&debugged, Some("debugger")).unwrap(), "debugger");
        assert!(stream_container(&debugged, None)
            .unwrap_err()
            .message
            .ends_with(" or one of the ephemeral containers: [debugger]"));
        let mut annotated = two.clone();
        annotated["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/default-container": "b"});
        assert_eq!(stream_container(&annotated, None).unwrap(), "b");
        annotated["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/default-container": "gone"});
        assert_eq!(stream_container(&annotated, None).unwrap_err().code, 400);
        let empty = json!({"metadata": {"name": "p"}, "spec": {"containers": []}});
        assert_eq!(stream_container(&empty, None).unwrap_err().message, "a container name must be specified for pod p");
    }

    #[test]
    fn stream_paths_and_query() {
        let q = "command=sh&command=-c&command=echo%20hi%26&container=c&stdout=true";
        assert_eq!(query_values(q, "command"), vec!["sh", "-c", "echo hi&"]);
        assert_eq!(query_values(q, "container"), vec!["c"]);
        assert_eq!(kubelet_stream_path("exec", "ns", "p", "c", q), format!("/exec/ns/p/c?{q}"));
        assert_eq!(kubelet_stream_path("attach", "ns", "p", "c", ""), "/attach/ns/p/c");
        assert_eq!(kubelet_stream_path("portforward", "ns", "p", "", "ports=80"), "/portForward/ns/p?ports=80");
    }
}
