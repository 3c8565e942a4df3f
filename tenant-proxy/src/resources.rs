//! What the proxy knows of the upstream API: each resource's scope and kind, read from the
//! apiserver's discovery (so CRDs of every tenant are known as soon as they are served), and
//! what a tenant may do with each. Pure; `discovery.rs` fills it.

use std::collections::HashMap;

use serde_json::Value;

/// One upstream resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    pub group: String,
    pub version: String,
    /// The plural name (`pods`), without subresource.
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
}

/// The upstream resources by (group, plural) and by (group, kind).
#[derive(Clone, Debug, Default)]
pub struct Resources {
    by_plural: HashMap<(String, String), Resource>,
    by_kind: HashMap<(String, String), Resource>,
}

impl Resources {
    /// Add one group/version's `APIResourceList` (`/api/v1`, `/apis/<group>/<version>`).
    pub fn add_list(&mut self, group: &str, version: &str, list: &Value) {
        for r in list["resources"].as_array().into_iter().flatten() {
            let (Some(name), Some(kind)) = (r["name"].as_str(), r["kind"].as_str()) else { continue };
            if name.contains('/') {
                continue; // a subresource
            }
            let res = Resource {
                group: group.to_string(),
                version: version.to_string(),
                plural: name.to_string(),
                kind: kind.to_string(),
                namespaced: r["namespaced"].as_bool().unwrap_or(false),
            };
            self.by_kind.entry((group.to_string(), kind.to_string())).or_insert_with(|| res.clone());
            self.by_plural.entry((group.to_string(), name.to_string())).or_insert(res);
        }
    }

    /// The resource `plural` of upstream `group`.
    pub fn find(&self, group: &str, plural: &str) -> Option<&Resource> {
        self.by_plural.get(&(group.to_string(), plural.to_string()))
    }

    /// Every resource (one version each).
    pub fn all(&self) -> impl Iterator<Item = &Resource> {
        self.by_plural.values()
    }

    /// The resource of kind `kind` in upstream `group`.
    pub fn by_kind(&self, group: &str, kind: &str) -> Option<&Resource> {
        self.by_kind.get(&(group.to_string(), kind.to_string()))
    }
}

/// What a tenant may do with a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The tenant's own objects: namespaces or names converted.
    Own,
    /// Shared by every tenant and read-only to them (Nodes and their metrics: a lab user looks
    /// at the machines its pods run on, and must not cordon or delete them).
    SharedReadOnly,
    /// Reviews about the caller itself (`kubectl auth can-i`, `whoami`): converted and
    /// answered upstream for the impersonated user.
    SelfReview,
    /// The cluster administrator's alone: API registration, admission webhooks and policies,
    /// certificate signing, volume attachment, reviews of other identities.
    Forbidden,
}

/// What a tenant may do with upstream `group`'s resource `plural` (namespaced ones are
/// always its own: their namespaces are).
pub fn access(group: &str, plural: &str) -> Access {
    match (group, plural) {
        ("", "nodes")
        | ("metrics.k8s.io", "nodes")
        | ("", "componentstatuses")
        | ("node.k8s.io", "runtimeclasses")
        | ("storage.k8s.io", "csidrivers") => Access::SharedReadOnly,
        ("authorization.k8s.io", "selfsubjectaccessreviews" | "selfsubjectrulesreviews")
        | ("authentication.k8s.io", "selfsubjectreviews") => Access::SelfReview,
        ("apiregistration.k8s.io", _)
        | ("admissionregistration.k8s.io", _)
        | ("certificates.k8s.io", _)
        | ("flowcontrol.apiserver.k8s.io", _)
        | ("internal.apiserver.k8s.io", _)
        | ("authentication.k8s.io", _)
        | ("authorization.k8s.io", _)
        | ("storage.k8s.io", "volumeattachments" | "csinodes")
        | ("resource.k8s.io", _) => Access::Forbidden,
        _ => Access::Own,
    }
}

/// Whether the tenant's objects of this cluster-scoped resource are found by name prefix
/// (everything but CRDs, whose names carry the tenant in their group instead).
pub fn is_crd(group: &str, plural: &str) -> bool {
    group == "apiextensions.k8s.io" && plural == "customresourcedefinitions"
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn discovery_lists_fill_the_tables() {
        let mut r = Resources::default();
        r.add_list(
            "",
            "v1",
            &json!({"resources": [
                {"name": "pods", "kind": "Pod", "namespaced": true},
                {"name": "pods/log", "kind": "Pod", "namespaced": true},
                {"name": "namespaces", "kind": "Namespace", "namespaced": false},
            ]}),
        );
        assert!(r.find("", "pods").unwrap().namespaced);
        assert!(!r.by_kind("", "Namespace").unwrap().namespaced);
        assert!(r.find("", "namespaces").is_some());
        assert!(r.find("", "pods/log").is_none());
    }

    #[test]
    fn tenants_own_everything_but_what_is_the_cluster_s() {
        assert_eq!(access("", "pods"), Access::Own);
        assert_eq!(access("rbac.authorization.k8s.io", "clusterroles"), Access::Own);
        assert_eq!(access("", "nodes"), Access::SharedReadOnly);
        assert_eq!(access("metrics.k8s.io", "nodes"), Access::SharedReadOnly, "kubectl top node");
        assert_eq!(access("admissionregistration.k8s.io", "validatingwebhookconfigurations"), Access::Forbidden);
        assert_eq!(access("authorization.k8s.io", "selfsubjectaccessreviews"), Access::SelfReview);
        assert_eq!(access("authorization.k8s.io", "subjectaccessreviews"), Access::Forbidden);
    }
}
