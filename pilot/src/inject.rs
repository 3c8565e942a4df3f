//! Sidecar injection: what the `/inject` admission webhook adds to a pod it is asked about
//! (the contract's "Injection"): the `istio-proxy` container, the `sidecar.istio.io/status`
//! annotation (the kubelet's cue to capture the pod's traffic) and the
//! `security.istio.io/tlsMode: istio` label, as an RFC 6902 JSON patch. Pure.

use base64::Engine;
use serde_json::{json, Value};

pub const PROXY_CONTAINER: &str = "istio-proxy";
/// The injector's mark, which the kubelet reads to capture the pod's traffic.
pub const STATUS_ANNOTATION: &str = common::mesh::STATUS_ANNOTATION;
pub const INJECT_KEY: &str = "sidecar.istio.io/inject";
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";
/// The sidecar's uid: the capture rules leave its own traffic alone.
pub const PROXY_UID: u32 = common::mesh::SIDECAR_UID;

/// What an injected container is made of.
#[derive(Clone, Debug, PartialEq)]
pub struct Injection {
    pub image: String,
    /// `<host>:<port>` of pilot's xDS port.
    pub discovery_address: String,
    pub cluster_domain: String,
}

/// Why a pod is left alone (or `None`: inject it).
pub fn skip_reason(pod: &Value) -> Option<&'static str> {
    let meta = &pod["metadata"];
    if pod["spec"]["hostNetwork"].as_bool() == Some(true) {
        return Some("the pod uses the host's network");
    }
    if meta["annotations"].get(STATUS_ANNOTATION).is_some() {
        return Some("the pod is already injected");
    }
    let containers = pod["spec"]["containers"].as_array();
    if containers.into_iter().flatten().any(|c| c["name"] == PROXY_CONTAINER) {
        return Some("the pod already has an istio-proxy container");
    }
    let off = |m: &Value| m.get(INJECT_KEY).and_then(Value::as_str).is_some_and(|v| v.eq_ignore_ascii_case("false"));
    if off(&meta["annotations"]) || off(&meta["labels"]) {
        return Some("sidecar.istio.io/inject is false");
    }
    None
}

/// The workload a pod belongs to: its Deployment (the ReplicaSet's name less the pod
/// template hash), other controller's name, or its own name.
pub fn workload_name(pod: &Value) -> String {
    let meta = &pod["metadata"];
    let owner = meta["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["controller"].as_bool() == Some(true))
        .or_else(|| meta["ownerReferences"].get(0));
    if let Some(o) = owner {
        let name = o["name"].as_str().unwrap_or_default();
        if o["kind"] == "ReplicaSet" {
            if let Some(hash) = meta["labels"]["pod-template-hash"].as_str() {
                if let Some(base) = name.strip_suffix(hash).and_then(|b| b.strip_suffix('-')) {
                    return base.to_string();
                }
            }
        }
        if !name.is_empty() {
            return name.to_string();
        }
    }
    match meta["name"].as_str().filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => meta["generateName"].as_str().unwrap_or_default().trim_end_matches('-').to_string(),
    }
}

fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}})
}

/// The `istio-proxy` container.
pub fn container(cfg: &Injection, workload: &str) -> Value {
    json!({
        "name": PROXY_CONTAINER,
        "image": cfg.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["proxy", "sidecar", "--discovery-address", cfg.discovery_address, "--cluster-domain", cfg.cluster_domain],
        "env": [
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("INSTANCE_IP", "status.podIP"),
            {"name": "ISTIO_META_WORKLOAD_NAME", "value": workload},
        ],
        "ports": [{"name": "http-envoy-prom", "containerPort": 15090, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/healthz/ready", "port": 15021},
            "initialDelaySeconds": 1, "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 30
        },
        "securityContext": {"runAsUser": PROXY_UID, "runAsGroup": PROXY_UID, "runAsNonRoot": true, "allowPrivilegeEscalation": false},
    })
}

/// The `sidecar.istio.io/status` annotation's value.
pub fn status() -> String {
    json!({"containers": [PROXY_CONTAINER], "version": env!("CARGO_PKG_VERSION")}).to_string()
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Add `key: value` to a map at `path` (`/metadata/annotations`), creating the map when
/// the pod has none.
fn add_to_map(pod_map: &Value, path: &str, key: &str, value: &str) -> Value {
    if pod_map.is_object() {
        json!({"op": "add", "path": format!("{path}/{}", escape(key)), "value": value})
    } else {
        json!({"op": "add", "path": path, "value": {key: value}})
    }
}

/// The JSON patch that injects `pod`, or `None` when it is to be left alone.
pub fn inject(pod: &Value, cfg: &Injection) -> Option<Vec<Value>> {
    if let Some(why) = skip_reason(pod) {
        tracing::debug!(reason = why, "not injecting");
        return None;
    }
    let meta = &pod["metadata"];
    let mut ops = Vec::new();
    let c = container(cfg, &workload_name(pod));
    if pod["spec"]["containers"].is_array() {
        ops.push(json!({"op": "add", "path": "/spec/containers/-", "value": c}));
    } else {
        ops.push(json!({"op": "add", "path": "/spec/containers", "value": [c]}));
    }
    ops.push(add_to_map(&meta["annotations"], "/metadata/annotations", STATUS_ANNOTATION, &status()));
    ops.push(add_to_map(&meta["labels"], "/metadata/labels", TLS_MODE_LABEL, "istio"));
    Some(ops)
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReviewError {
    #[error("not an admission.k8s.io/v1 AdmissionReview with a request")]
    NoRequest,
}

/// Answer an `admission.k8s.io/v1` AdmissionReview: always allowed, with the injection
/// patch (base64 JSON patch) for a pod CREATE that is to be injected.
pub fn review(body: &Value, cfg: &Injection) -> Result<Value, ReviewError> {
    let req = body.get("request").filter(|r| r.is_object()).ok_or(ReviewError::NoRequest)?;
    let uid = req["uid"].clone();
    let mut response = json!({"uid": uid, "allowed": true});
    let is_pod = req["kind"]["kind"] == "Pod" || req["resource"]["resource"] == "pods";
    let create = req["operation"].as_str().is_none_or(|op| op == "CREATE");
    if is_pod && create {
        let mut pod = req["object"].clone();
        // A pod created with generateName has no name yet; the request's namespace is its.
        if pod["metadata"]["namespace"].is_null() {
            if let (Some(m), Some(ns)) = (pod["metadata"].as_object_mut(), req["namespace"].as_str()) {
                m.insert("namespace".into(), json!(ns));
            }
        }
        if let Some(patch) = inject(&pod, cfg) {
            let bytes = serde_json::to_vec(&patch).unwrap_or_default();
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
    }
    Ok(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Injection {
        Injection {
            image: "minik8s/envoy:latest".into(),
            discovery_address: "192.168.1.10:15010".into(),
            cluster_domain: "cluster.local".into(),
        }
    }

    fn pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "web-5d8f7c-", "namespace": "default",
                         "labels": {"app": "web", "pod-template-hash": "5d8f7c"},
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "web-5d8f7c", "controller": true}]},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]}
        })
    }

    fn apply(pod: &Value, ops: Vec<Value>) -> Value {
        let mut out = pod.clone();
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut out, &patch).unwrap();
        out
    }

    #[test]
    fn a_pod_gets_the_sidecar_annotation_and_label() {
        let p = pod();
        let out = apply(&p, inject(&p, &cfg()).unwrap());
        let c = &out["spec"]["containers"][1];
        assert_eq!(c["name"], "istio-proxy");
        assert_eq!(c["image"], "minik8s/envoy:latest");
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c["securityContext"]["runAsUser"], 1337);
        assert_eq!(
            c["args"],
            json!([
                "proxy",
                "sidecar",
                "--discovery-address",
                "192.168.1.10:15010",
                "--cluster-domain",
                "cluster.local"
            ])
        );
        let env: Vec<&str> = c["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(env, vec!["POD_NAME", "POD_NAMESPACE", "INSTANCE_IP", "ISTIO_META_WORKLOAD_NAME"]);
        assert_eq!(c["env"][2]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
        assert_eq!(c["env"][3]["value"], "web");
        assert_eq!(c["ports"][0]["containerPort"], 15090);
        assert_eq!(c["ports"][0]["name"], "http-envoy-prom");
        assert_eq!(c["readinessProbe"]["httpGet"], json!({"path": "/healthz/ready", "port": 15021}));
        let status: Value =
            serde_json::from_str(out["metadata"]["annotations"][STATUS_ANNOTATION].as_str().unwrap()).unwrap();
        assert_eq!(status["containers"], json!(["istio-proxy"]));
        assert_eq!(out["metadata"]["labels"][TLS_MODE_LABEL], "istio");
        assert_eq!(out["metadata"]["labels"]["app"], "web");
    }

    #[test]
    fn injection_is_idempotent() {
        let p = pod();
        let once = apply(&p, inject(&p, &cfg()).unwrap());
        assert_eq!(inject(&once, &cfg()), None);
    }

    #[test]
    fn existing_annotations_are_kept() {
        let mut p = pod();
        p["metadata"]["annotations"] = json!({"a/b": "c"});
        let out = apply(&p, inject(&p, &cfg()).unwrap());
        assert_eq!(out["metadata"]["annotations"]["a/b"], "c");
        assert!(out["metadata"]["annotations"][STATUS_ANNOTATION].is_string());
    }

    #[test]
    fn host_network_and_opted_out_pods_are_skipped() {
        let mut p = pod();
        p["spec"]["hostNetwork"] = json!(true);
        assert_eq!(inject(&p, &cfg()), None);
        let mut p = pod();
        p["metadata"]["labels"][INJECT_KEY] = json!("false");
        assert_eq!(inject(&p, &cfg()), None);
    }

    #[test]
    fn workload_names() {
        assert_eq!(workload_name(&pod()), "web");
        assert_eq!(workload_name(&json!({"metadata": {"name": "solo"}})), "solo");
        assert_eq!(
            workload_name(
                &json!({"metadata": {"name": "db-0", "ownerReferences": [{"kind": "StatefulSet", "name": "db", "controller": true}]}})
            ),
            "db"
        );
    }

    #[test]
    fn reviews_answer_with_a_base64_json_patch() {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "default",
                        "operation": "CREATE", "object": pod()}});
        let out = review(&body, &cfg()).unwrap();
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        let r = &out["response"];
        assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(r["allowed"], true);
        assert_eq!(r["patchType"], "JSONPatch");
        let bytes = base64::engine::general_purpose::STANDARD.decode(r["patch"].as_str().unwrap()).unwrap();
        let ops: Vec<Value> = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(ops.len(), 3);
        // Already injected: allowed, no patch.
        let mut again = body.clone();
        again["request"]["object"] = apply(&pod(), ops);
        let out = review(&again, &cfg()).unwrap();
        assert_eq!(out["response"]["allowed"], true);
        assert!(out["response"].get("patch").is_none());
        assert_eq!(review(&json!({}), &cfg()), Err(ReviewError::NoRequest));
    }
}
