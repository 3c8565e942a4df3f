//! The discovery documents (`/api`, `/apis`, `/apis/<group>`, the APIResourceLists): what
//! the resource table serves, plus the groups answered without storage (`metrics.k8s.io`,
//! the access and identity reviews).

use serde_json::{json, Value};

use crate::resources::{all, find, ResourceDef, Sub, VERBS_ALL};

/// Groups with their versions, in table order; the first version is preferred.
pub fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for r in all().into_iter().filter(|r| !r.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, vs)) => {
                if !vs.contains(&r.version) {
                    vs.push(r.version)
                }
            }
            None => out.push((r.group, vec![r.version])),
        }
    }
    // Served by crate::metricsapi from the kubelets, not from storage.
    out.push((crate::metricsapi::GROUP, vec![crate::metricsapi::VERSION]));
    // Answered by crate::reviews, never stored.
    out.push((crate::reviews::AUTHENTICATION, vec![crate::reviews::VERSION]));
    out.push((crate::reviews::AUTHORIZATION, vec![crate::reviews::VERSION]));
    out
}

/// `GET /api`
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_doc(group: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> =
        versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect();
    json!({
        "name": group,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(Value::Null),
    })
}

/// `GET /apis`
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = groups().iter().map(|(g, vs)| group_doc(g, vs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/<group>`
pub fn api_group(group: &str) -> Option<Value> {
    groups().iter().find(|(g, _)| *g == group).map(|(g, vs)| {
        let mut doc = group_doc(g, vs);
        doc["kind"] = "APIGroup".into();
        doc["apiVersion"] = "v1".into();
        doc
    })
}

/// `GET /api/v1` or `GET /apis/<group>/<version>`: an APIResourceList, or None if the
/// group/version is not served.
pub fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    if group == crate::metricsapi::GROUP {
        return (version == crate::metricsapi::VERSION).then(crate::metricsapi::resource_list);
    }
    if crate::reviews::serves(group) {
        return crate::reviews::resource_list(group, version);
    }
    let mut resources = Vec::new();
    for r in all().into_iter().filter(|r| r.group == group && r.version == version) {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS_ALL,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        // A converted view publishes the hash of the version it is stored as.
        let stored = crate::views::of(r).and_then(|v| find(v.storage.0, v.storage.1, v.storage.2)).unwrap_or(r);
        entry["storageVersionHash"] = Value::String(storage_version_hash(stored));
        resources.push(entry);
        for s in r.subresources {
            let (kind, verbs, group_version): (&str, Vec<&str>, Option<(&str, &str)>) = match s {
                Sub::Status => (r.kind, vec!["get", "patch", "update"], None),
                Sub::Scale => ("Scale", vec!["get", "patch", "update"], Some(("autoscaling", "v1"))),
                Sub::Binding => ("Binding", vec!["create"], None),
                Sub::Eviction => ("Eviction", vec!["create"], Some(("policy", "v1"))),
                Sub::Token => ("TokenRequest", vec!["create"], Some(("authentication.k8s.io", "v1"))),
                Sub::Finalize => (r.kind, vec!["update"], None),
                Sub::Approval => (r.kind, vec!["get", "patch", "update"], None),
                Sub::EphemeralContainers => (r.kind, vec!["get", "patch", "update"], None),
                Sub::NotYetServed("log", _) => ("Pod", vec!["get"], None),
                Sub::NotYetServed("exec", _) => ("PodExecOptions", vec!["create", "get"], None),
                Sub::NotYetServed("attach", _) => ("PodAttachOptions", vec!["create", "get"], None),
                Sub::NotYetServed("portforward", _) => ("PodPortForwardOptions", vec!["create", "get"], None),
                Sub::NotYetServed(_, _) => (
                    if r.kind == "Pod" { "PodProxyOptions" } else { "NodeProxyOptions" },
                    vec!["create", "delete", "get", "patch", "update"],
                    None,
                ),
            };
            let mut sub = json!({
                "name": format!("{}/{}", r.plural, s.name()),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": verbs,
            });
            if let Some((g, v)) = group_version {
                sub["group"] = g.into();
                sub["version"] = v.into();
            }
            resources.push(sub);
        }
    }
    if group.is_empty() && version == "v1" {
        resources.push(crate::componentstatus::discovery_entry());
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }))
}

/// A stable hash of the storage location, as Kubernetes publishes (8 bytes, base64).
fn storage_version_hash(r: &ResourceDef) -> String {
    use base64::Engine;
    // FNV-1a over "group/version/kind" of the storage version.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in format!("{}/{}/{}", r.group, r.version, r.kind).bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    base64::engine::general_purpose::STANDARD.encode(h.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_subresources() {
        let core = api_resource_list("", "v1").unwrap();
        let names: Vec<&str> =
            core["resources"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
        for n in ["pods", "pods/status", "pods/binding", "pods/eviction", "pods/log", "namespaces/finalize"] {
            assert!(names.contains(&n), "{n} missing");
        }
        let apps = api_resource_list("apps", "v1").unwrap();
        let scale = apps["resources"].as_array().unwrap().iter().find(|r| r["name"] == "deployments/scale").unwrap();
        assert_eq!(scale["group"], "autoscaling");
        assert_eq!(scale["kind"], "Scale");
        assert!(api_resource_list("nope", "v1").is_none());
        let groups = api_group_list();
        assert!(groups["groups"].as_array().unwrap().iter().any(|g| g["name"] == "apps"));
    }
}
