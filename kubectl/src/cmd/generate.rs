//! The objects `kubectl create <generator>` builds (deployment, service clusterip|nodeport,
//! configmap, secret generic, job, serviceaccount, namespace), field for field as the
//! official kubectl's generators build them. Pure, except reading `--from-file` files.

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::{json, Map, Value};

use crate::error::{KubectlError, Result};

/// The flags the generators read.
#[derive(Debug, Default, Clone)]
pub struct GenFlags {
    pub image: Vec<String>,
    pub replicas: Option<i64>,
    pub port: Option<i64>,
    pub tcp: Vec<String>,
    pub node_port: Option<i64>,
    pub clusterip: Option<String>,
    pub from_literal: Vec<String>,
    pub from_file: Vec<String>,
    pub secret_type: Option<String>,
    pub command: Vec<String>,
}

fn err(m: impl Into<String>) -> KubectlError {
    KubectlError::msg(m.into())
}

fn meta(name: &str, labels: Option<&str>) -> Value {
    let mut m = json!({"name": name, "creationTimestamp": null});
    if let Some(app) = labels {
        m["labels"] = json!({"app": app});
    }
    m
}

/// A container name from an image reference: the last path part without tag or digest,
/// `_` made `-`, duplicates numbered (kubectl's sanitizeAndUniquify).
pub fn container_names(images: &[String]) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    images
        .iter()
        .map(|img| {
            let last = img.rsplit('/').next().unwrap_or(img);
            let base = last.split(['@']).next().unwrap_or(last).split(':').next().unwrap_or(last).replace('_', "-");
            let n = seen.entry(base.clone()).or_insert(0);
            *n += 1;
            if *n == 1 {
                base
            } else {
                format!("{base}-{}", *n)
            }
        })
        .collect()
}

/// (key, value) pairs from `--from-literal=k=v`.
fn literals(list: &[String]) -> Result<Vec<(String, String)>> {
    list.iter()
        .map(|l| match l.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(err(format!("invalid literal source {l}, expected key=value"))),
        })
        .collect()
}

/// (key, bytes) pairs from `--from-file=[key=]path` (files only).
fn files(list: &[String]) -> Result<Vec<(String, Vec<u8>)>> {
    list.iter()
        .map(|f| {
            let (key, path) = match f.split_once('=') {
                Some((k, p)) => (k.to_string(), p.to_string()),
                None => {
                    let base = std::path::Path::new(f).file_name().map(|n| n.to_string_lossy().into_owned());
                    (base.unwrap_or_else(|| f.clone()), f.clone())
                }
            };
            let bytes = std::fs::read(&path).map_err(|e| err(format!("error reading {path}: {e}")))?;
            Ok((key, bytes))
        })
        .collect()
}

fn check_unique(keys: &mut Vec<String>, k: &str, kind: &str) -> Result<()> {
    if keys.iter().any(|x| x == k) {
        return Err(err(format!("cannot add key {k}, another key by that name already exists in {kind}")));
    }
    keys.push(k.to_string());
    Ok(())
}

fn ports(tcp: &[String], node_port: Option<i64>) -> Result<Vec<Value>> {
    tcp.iter()
        .map(|t| {
            let (port, target) = t.split_once(':').unwrap_or((t, t));
            let port: i64 = port.parse().map_err(|_| err(format!("invalid port {t}")))?;
            let target_v = match target.parse::<i64>() {
                Ok(n) => json!(n),
                Err(_) => json!(target),
            };
            let mut p = json!({"name": t.replace(':', "-"), "port": port, "protocol": "TCP", "targetPort": target_v});
            if let Some(np) = node_port.filter(|n| *n > 0) {
                p["nodePort"] = json!(np);
            }
            Ok(p)
        })
        .collect()
}

/// The object for `kubectl create <generator> NAME …`; `args` is the positional words.
pub fn generate(args: &[String], f: &GenFlags) -> Result<Value> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["namespace" | "ns", name] => {
            Ok(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": meta(name, None), "spec": {}, "status": {}}))
        }
        ["serviceaccount" | "sa", name] => {
            Ok(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name, None)}))
        }
        ["deployment" | "deploy", name] => {
            if f.image.is_empty() {
                return Err(err("required flag(s) \"image\" not set"));
            }
            let names = container_names(&f.image);
            let mut containers: Vec<Value> = f
                .image
                .iter()
                .zip(&names)
                .map(|(img, n)| {
                    let mut c = json!({"name": n, "image": img, "resources": {}});
                    if !f.command.is_empty() {
                        c["command"] = json!(f.command);
                    }
                    c
                })
                .collect();
            if let (Some(p), Some(c)) = (f.port.filter(|p| *p >= 0), containers.first_mut()) {
                c["ports"] = json!([{"containerPort": p}]);
            }
            Ok(json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name, Some(name)),
                "spec": {
                    "replicas": f.replicas.unwrap_or(1),
                    "selector": {"matchLabels": {"app": name}},
                    "strategy": {},
                    "template": {"metadata": {"creationTimestamp": null, "labels": {"app": name}}, "spec": {"containers": containers}},
                },
                "status": {},
            }))
        }
        ["service" | "svc", ty @ ("clusterip" | "nodeport"), name] => {
            let ty = if *ty == "clusterip" { "ClusterIP" } else { "NodePort" };
            if f.tcp.is_empty() && !(ty == "ClusterIP" && f.clusterip.as_deref() == Some("None")) {
                return Err(err("at least one tcp port specifier must be provided"));
            }
            let mut spec = json!({"selector": {"app": name}, "type": ty});
            if !f.tcp.is_empty() {
                spec["ports"] = json!(ports(&f.tcp, f.node_port)?);
            }
            if let Some(ip) = &f.clusterip {
                spec["clusterIP"] = json!(ip);
            }
            Ok(
                json!({"apiVersion": "v1", "kind": "Service", "metadata": meta(name, Some(name)), "spec": spec, "status": {"loadBalancer": {}}}),
            )
        }
        ["configmap" | "cm", name] => {
            let mut keys = Vec::new();
            let mut data = Map::new();
            let mut binary = Map::new();
            for (k, bytes) in files(&f.from_file)? {
                check_unique(&mut keys, &k, "data")?;
                match String::from_utf8(bytes) {
                    Ok(s) => data.insert(k, json!(s)),
                    Err(e) => binary.insert(k, json!(base64::engine::general_purpose::STANDARD.encode(e.into_bytes()))),
                };
            }
            for (k, v) in literals(&f.from_literal)? {
                check_unique(&mut keys, &k, "data")?;
                data.insert(k, json!(v));
            }
            let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(name, None)});
            if !data.is_empty() {
                cm["data"] = Value::Object(data);
            }
            if !binary.is_empty() {
                cm["binaryData"] = Value::Object(binary);
            }
            Ok(cm)
        }
        ["secret", "generic", name] => {
            let mut keys = Vec::new();
            let mut data = Map::new();
            let b64 = |b: &[u8]| json!(base64::engine::general_purpose::STANDARD.encode(b));
            for (k, bytes) in files(&f.from_file)? {
                check_unique(&mut keys, &k, "data")?;
                data.insert(k, b64(&bytes));
            }
            for (k, v) in literals(&f.from_literal)? {
                check_unique(&mut keys, &k, "data")?;
                data.insert(k, b64(v.as_bytes()));
            }
            let mut s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta(name, None)});
            if !data.is_empty() {
                s["data"] = Value::Object(data);
            }
            if let Some(t) = f.secret_type.as_deref().filter(|t| !t.is_empty()) {
                s["type"] = json!(t);
            }
            Ok(s)
        }
        ["job", name] => {
            let Some(image) = f.image.first() else {
                return Err(err("--image must be specified"));
            };
            let mut c = json!({"name": name, "image": image, "resources": {}});
            if !f.command.is_empty() {
                c["command"] = json!(f.command);
            }
            Ok(json!({
                "apiVersion": "batch/v1", "kind": "Job", "metadata": meta(name, None),
                "spec": {"template": {"metadata": {"creationTimestamp": null}, "spec": {"containers": [c], "restartPolicy": "Never"}}},
                "status": {},
            }))
        }
        [] => Err(err("must specify one of -f and -k")),
        [kind, ..] => Err(err(format!(
            "unknown generator or missing NAME for \"{kind}\" (supported: deployment, service clusterip|nodeport, configmap, secret generic, job, serviceaccount, namespace)"
        ))),
    }
}

/// The collection the generated object is created in: (api path prefix, plural, namespaced).
pub fn target(obj: &Value) -> (&'static str, &'static str, bool) {
    match obj.get("kind").and_then(Value::as_str).unwrap_or_default() {
        "Deployment" => ("/apis/apps/v1", "deployments", true),
        "Service" => ("/api/v1", "services", true),
        "ConfigMap" => ("/api/v1", "configmaps", true),
        "Secret" => ("/api/v1", "secrets", true),
        "Job" => ("/apis/batch/v1", "jobs", true),
        "ServiceAccount" => ("/api/v1", "serviceaccounts", true),
        _ => ("/api/v1", "namespaces", false),
    }
}

/// The object as sent: without the null/empty fields the printed form carries.
pub fn for_server(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("creationTimestamp");
    }
    if let Some(m) = o.pointer_mut("/spec/template/metadata").and_then(Value::as_object_mut) {
        m.remove("creationTimestamp");
    }
    if let Some(m) = o.as_object_mut() {
        m.remove("status");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn deployment_like_kubectl() {
        let f = GenFlags {
            image: s(&["busybox:latest", "reg.io/a/my_app@sha256:00", "busybox"]),
            port: Some(80),
            replicas: Some(2),
            ..Default::default()
        };
        let d = generate(&s(&["deployment", "web"]), &f).unwrap();
        assert_eq!(d["spec"]["replicas"], 2);
        assert_eq!(d["spec"]["selector"]["matchLabels"]["app"], "web");
        let names: Vec<&str> = d["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["busybox", "my-app", "busybox-2"]);
        assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["ports"], json!([{"containerPort": 80}]));
        assert!(d["spec"]["template"]["spec"]["containers"][1].get("ports").is_none());
        assert!(generate(&s(&["deployment", "web"]), &GenFlags::default()).is_err());
    }

    #[test]
    fn services_configmaps_secrets_jobs() {
        let f = GenFlags { tcp: s(&["80:8080", "443"]), node_port: Some(30001), ..Default::default() };
        let svc = generate(&s(&["service", "nodeport", "web"]), &f).unwrap();
        assert_eq!(svc["spec"]["type"], "NodePort");
        assert_eq!(
            svc["spec"]["ports"][0],
            json!({"name": "80-8080", "nodePort": 30001, "port": 80, "protocol": "TCP", "targetPort": 8080})
        );
        assert_eq!(svc["spec"]["ports"][1]["targetPort"], 443);
        let f = GenFlags { from_literal: s(&["a=b", "c=d=e"]), ..Default::default() };
        let cm = generate(&s(&["configmap", "c"]), &f).unwrap();
        assert_eq!(cm["data"], json!({"a": "b", "c": "d=e"}));
        let sec = generate(&s(&["secret", "generic", "s"]), &f).unwrap();
        assert_eq!(sec["data"], json!({"a": "Yg==", "c": "ZD1l"}));
        assert!(sec.get("type").is_none());
        let dup = GenFlags { from_literal: s(&["a=1", "a=2"]), ..Default::default() };
        assert!(generate(&s(&["configmap", "c"]), &dup).is_err());
        let f = GenFlags { image: s(&["busybox"]), command: s(&["echo", "hi"]), ..Default::default() };
        let job = generate(&s(&["job", "j"]), &f).unwrap();
        assert_eq!(
            job["spec"]["template"]["spec"]["containers"][0],
            json!({"name": "j", "image": "busybox", "command": ["echo", "hi"], "resources": {}})
        );
        assert_eq!(job["spec"]["template"]["spec"]["restartPolicy"], "Never");
        assert!(generate(&s(&["bogus", "x"]), &f).is_err());
        let sent = for_server(&job);
        assert!(sent.get("status").is_none() && sent.pointer("/metadata/creationTimestamp").is_none());
    }
}
