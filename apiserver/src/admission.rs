//! Admission that needs other objects, run on the request path before the strategy (which
//! never looks anything up). Each rule is a pure function of the object and what was read
//! for it; `server.rs` reads and calls.
//!
//! - DefaultStorageClass: a PersistentVolumeClaim created without `spec.storageClassName`
//!   (absent, not `""`: that asks for no class) gets the default StorageClass — the one
//!   annotated `storageclass.kubernetes.io/is-default-class: "true"`, the newest (then the
//!   first by name) when several are.
//! - ServiceAccount (with a token issuer configured): a pod runs as a service account that
//!   exists (`default` when it names none) and, unless `automountServiceAccountToken` is false
//!   on the pod or else on the account, gets the projected `kube-api-access-<suffix>` volume
//!   (a bound token, the cluster CA from the `kube-root-ca.crt` ConfigMap, its namespace)
//!   mounted read-only at `/var/run/secrets/kubernetes.io/serviceaccount` in every container.
//! - RuntimeClass: a pod naming a RuntimeClass that does not exist is refused; one that
//!   exists gives the pod its `overhead` (a different one is refused), its node selector
//!   (a conflicting key is refused) and its tolerations.

use serde_json::{json, Value};

pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

/// The default class's name among `classes` (StorageClass objects), if any.
pub fn default_storage_class(classes: &[Value]) -> Option<String> {
    let mut defaults: Vec<(&str, &str)> = classes
        .iter()
        .filter(|c| {
            c.pointer("/metadata/annotations")
                .and_then(|a| a.get(ANN_DEFAULT_CLASS))
                .and_then(Value::as_str)
                .is_some_and(|v| v == "true")
        })
        .filter_map(|c| {
            let name = c.pointer("/metadata/name")?.as_str()?;
            let created = c.pointer("/metadata/creationTimestamp").and_then(Value::as_str).unwrap_or("");
            Some((created, name))
        })
        .collect();
    // Newest first (RFC 3339 times of one format sort as text), then by name.
    defaults.sort_by(|a, b| b.0.cmp(a.0).then(a.1.cmp(b.1)));
    defaults.first().map(|(_, n)| n.to_string())
}

/// Does this claim ask for the default class (no `spec.storageClassName` at all)?
pub fn wants_default_class(claim: &Value) -> bool {
    claim.pointer("/spec/storageClassName").is_none_or(Value::is_null)
}

/// Set the claim's class to `default` when it names none.
pub fn admit_claim(claim: &mut Value, default: Option<&str>) {
    if let (true, Some(d)) = (wants_default_class(claim), default) {
        if let Some(spec) = claim.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("storageClassName".into(), Value::String(d.to_string()));
        }
    }
}

/// The RuntimeClass a pod names (`spec.runtimeClassName`), if any.
pub fn runtime_class_name(pod: &Value) -> Option<&str> {
    pod.pointer("/spec/runtimeClassName").and_then(Value::as_str).filter(|n| !n.is_empty())
}

/// RuntimeClass admission of a new pod, given the class it names as read (None: it does not
/// exist). Err is the reason, worded as Kubernetes words it, for a 403.
pub fn admit_runtime_class(pod: &mut Value, class: Option<&Value>) -> Result<(), String> {
    let overhead = pod.pointer("/spec/overhead").filter(|o| !o.is_null()).cloned();
    let Some(name) = runtime_class_name(pod).map(str::to_string) else {
        return match overhead {
            Some(_) => Err("pod rejected: Pod Overhead set without corresponding RuntimeClass".into()),
            None => Ok(()),
        };
    };
    let Some(class) = class else { return Err(format!("pod rejected: RuntimeClass {name:?} not found")) };
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return Ok(()) };
    if let Some(fixed) = class.pointer("/overhead/podFixed").filter(|o| !o.is_null()) {
        match overhead {
            Some(o) if &o != fixed => {
                return Err("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead".into())
            }
            _ => {
                spec.insert("overhead".into(), fixed.clone());
            }
        }
    }
    if let Some(selector) = class.pointer("/scheduling/nodeSelector").and_then(Value::as_object) {
        let pod_selector = spec.entry("nodeSelector").or_insert_with(|| json!({}));
        if let Some(ps) = pod_selector.as_object_mut() {
            for (k, v) in selector {
                match ps.get(k) {
                    Some(pv) if pv != v => {
                        let show = |x: &Value| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string());
                        return Err(format!(
                            "conflict: runtimeClass.scheduling.nodeSelector[{k}] = {}; pod.spec.nodeSelector[{k}] = {}",
                            show(v),
                            show(pv)
                        ));
                    }
                    _ => {
                        ps.insert(k.clone(), v.clone());
                    }
                }
            }
        }
    }
    if let Some(tols) = class.pointer("/scheduling/tolerations").and_then(Value::as_array) {
        let pod_tols = spec.entry("tolerations").or_insert_with(|| json!([]));
        if let Some(list) = pod_tols.as_array_mut() {
            for t in tols {
                if !list.contains(t) {
                    list.push(t.clone());
                }
            }
        }
    }
    Ok(())
}

/// Where in-cluster clients look for the token, CA and namespace.
pub const SERVICE_ACCOUNT_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The lifetime the token volume asks for (Kubernetes' 1 h + 7 s, which marks tokens the
/// kubelet refreshes).
pub const TOKEN_VOLUME_EXPIRATION_SECONDS: i64 = 3607;

/// The service account a pod runs as (`default` when it names none).
pub fn service_account_name(pod: &Value) -> String {
    ["/spec/serviceAccountName", "/spec/serviceAccount"]
        .iter()
        .find_map(|p| pod.pointer(p).and_then(Value::as_str).filter(|s| !s.is_empty()))
        .unwrap_or("default")
        .to_string()
}

/// Mirror pods (static pods' API copies) are left alone.
pub fn is_mirror_pod(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations/kubernetes.io~1config.mirror").is_some()
}

/// Name the service account on the pod and mount its token, as the ServiceAccount
/// admission plugin does; `suffix` names the volume (`kube-api-access-<suffix>`).
pub fn mount_service_account_token(pod: &mut Value, account: &Value, suffix: &str) {
    let name = service_account_name(pod);
    pod["spec"]["serviceAccountName"] = json!(name);
    let automount = pod
        .pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| account.get("automountServiceAccountToken").and_then(Value::as_bool))
        .unwrap_or(true);
    if !automount {
        return;
    }
    let mounted = |c: &Value| {
        c.get("volumeMounts")
            .and_then(Value::as_array)
            .is_some_and(|ms| ms.iter().any(|m| m["mountPath"] == SERVICE_ACCOUNT_MOUNT_PATH))
    };
    let volume = format!("kube-api-access-{suffix}");
    let mut added = false;
    for list in ["initContainers", "containers"] {
        for c in pod["spec"].get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            if mounted(c) {
                continue;
            }
            let mount = json!({"name": volume, "mountPath": SERVICE_ACCOUNT_MOUNT_PATH, "readOnly": true});
            match c.get_mut("volumeMounts").and_then(Value::as_array_mut) {
                Some(ms) => ms.push(mount),
                None => c["volumeMounts"] = json!([mount]),
            }
            added = true;
        }
    }
    if !added {
        return;
    }
    let v = json!({"name": volume, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": TOKEN_VOLUME_EXPIRATION_SECONDS, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}});
    match pod["spec"].get_mut("volumes").and_then(Value::as_array_mut) {
        Some(vs) => vs.push(v),
        None => pod["spec"]["volumes"] = json!([v]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, default: bool, created: &str) -> Value {
        let ann = if default { json!({ANN_DEFAULT_CLASS: "true"}) } else { json!({ANN_DEFAULT_CLASS: "false"}) };
        json!({"metadata": {"name": name, "annotations": ann, "creationTimestamp": created}})
    }

    #[test]
    fn the_newest_default_class_wins() {
        assert_eq!(default_storage_class(&[]), None);
        assert_eq!(default_storage_class(&[class("a", false, "2024-01-01T00:00:00Z")]), None);
        let classes = [
            class("old", true, "2024-01-01T00:00:00Z"),
            class("new", true, "2024-06-01T00:00:00Z"),
            class("plain", false, "2025-01-01T00:00:00Z"),
        ];
        assert_eq!(default_storage_class(&classes).as_deref(), Some("new"));
    }

    #[test]
    fn only_a_claim_without_a_class_gets_the_default() {
        let mut none = json!({"spec": {"accessModes": ["ReadWriteOnce"]}});
        admit_claim(&mut none, Some("local-path"));
        assert_eq!(none["spec"]["storageClassName"], "local-path");
        let mut empty = json!({"spec": {"storageClassName": ""}});
        admit_claim(&mut empty, Some("local-path"));
        assert_eq!(empty["spec"]["storageClassName"], "");
        let mut named = json!({"spec": {"storageClassName": "fast"}});
        admit_claim(&mut named, Some("local-path"));
        assert_eq!(named["spec"]["storageClassName"], "fast");
        let mut no_default = json!({"spec": {}});
        admit_claim(&mut no_default, None);
        assert!(no_default["spec"].get("storageClassName").is_none());
    }

    #[test]
    fn a_runtime_class_gives_its_overhead_selector_and_tolerations() {
        let class = json!({"handler": "runc", "overhead": {"podFixed": {"cpu": "250m"}},
            "scheduling": {"nodeSelector": {"gpu": "yes"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}});
        let mut pod = json!({"spec": {"runtimeClassName": "fast", "nodeSelector": {"zone": "a"}, "containers": []}});
        admit_runtime_class(&mut pod, Some(&class)).unwrap();
        assert_eq!(pod["spec"]["overhead"], json!({"cpu": "250m"}));
        assert_eq!(pod["spec"]["nodeSelector"], json!({"zone": "a", "gpu": "yes"}));
        assert_eq!(pod["spec"]["tolerations"], json!([{"key": "gpu", "operator": "Exists"}]));
        assert_eq!(
            admit_runtime_class(&mut json!({"spec": {"runtimeClassName": "nope"}}), None),
            Err("pod rejected: RuntimeClass \"nope\" not found".into())
        );
        let mut conflict = json!({"spec": {"runtimeClassName": "fast", "nodeSelector": {"gpu": "no"}}});
        let err = admit_runtime_class(&mut conflict, Some(&class)).unwrap_err();
        assert_eq!(err, "conflict: runtimeClass.scheduling.nodeSelector[gpu] = yes; pod.spec.nodeSelector[gpu] = no");
        let mut other = json!({"spec": {"runtimeClassName": "fast", "overhead": {"cpu": "1"}}});
        assert!(admit_runtime_class(&mut other, Some(&class)).unwrap_err().contains("doesn't match"));
        let mut bare = json!({"spec": {"overhead": {"cpu": "1"}}});
        assert!(admit_runtime_class(&mut bare, None).unwrap_err().contains("without corresponding RuntimeClass"));
        let mut plain = json!({"spec": {}});
        assert!(admit_runtime_class(&mut plain, None).is_ok() && plain == json!({"spec": {}}));
    }

    #[test]
    fn pods_get_their_service_account_s_token_volume() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "i"}],
            "containers": [{"name": "a", "volumeMounts": [{"name": "x", "mountPath": "/x"}]},
                           {"name": "b", "volumeMounts": [{"name": "mine", "mountPath": SERVICE_ACCOUNT_MOUNT_PATH}]}]}});
        mount_service_account_token(&mut pod, &json!({}), "abcde");
        assert_eq!(pod["spec"]["serviceAccountName"], "default");
        assert_eq!(pod["spec"]["volumes"][0]["name"], "kube-api-access-abcde");
        let sources = &pod["spec"]["volumes"][0]["projected"]["sources"];
        assert_eq!(sources[0]["serviceAccountToken"]["expirationSeconds"], 3607);
        assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
        assert_eq!(pod["spec"]["initContainers"][0]["volumeMounts"][0]["name"], "kube-api-access-abcde");
        assert_eq!(pod["spec"]["containers"][0]["volumeMounts"][1]["readOnly"], true);
        assert_eq!(pod["spec"]["containers"][1]["volumeMounts"].as_array().unwrap().len(), 1, "its own mount stays");
    }

    #[test]
    fn automount_false_on_the_pod_wins_over_the_account() {
        let account_off = json!({"automountServiceAccountToken": false});
        let mut pod = json!({"spec": {"serviceAccountName": "ci", "containers": [{"name": "a"}]}});
        mount_service_account_token(&mut pod, &account_off, "x");
        assert!(pod["spec"].get("volumes").is_none(), "the account opts out");
        let mut pod = json!({"spec": {"automountServiceAccountToken": true, "containers": [{"name": "a"}]}});
        mount_service_account_token(&mut pod, &account_off, "x");
        assert_eq!(pod["spec"]["volumes"].as_array().unwrap().len(), 1, "the pod opts back in");
        let mut pod = json!({"spec": {"automountServiceAccountToken": false, "containers": [{"name": "a"}]}});
        mount_service_account_token(&mut pod, &json!({}), "x");
        assert!(pod["spec"].get("volumes").is_none());
        assert_eq!(service_account_name(&json!({"spec": {"serviceAccount": "old"}})), "old");
        assert!(is_mirror_pod(&json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}})));
    }
}
