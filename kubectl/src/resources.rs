//! Resource types: a static table of well-known built-in kinds (so the common commands need
//! no discovery round trips), full API discovery for everything else (cached per run), and
//! the pure name resolution shared by both (`po`, `pods`, `pod`, `Pod`, `deployments.apps`).

use serde_json::Value;

/// One served resource type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRes {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    pub verbs: Vec<String>,
    pub categories: Vec<String>,
}

impl ApiRes {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods`, `deployments.apps`: how kubectl names the resource in messages.
    pub fn plural_group(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `pod`, `deployment.apps`: the prefix of `-o name` and of apply's result lines.
    pub fn kind_group(&self) -> String {
        let k = self.kind.to_lowercase();
        if self.group.is_empty() {
            k
        } else {
            format!("{k}.{}", self.group)
        }
    }

    /// The collection path, in `ns` if the resource is namespaced and `ns` is given.
    pub fn collection_path(&self, ns: Option<&str>) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        match ns {
            Some(ns) if self.namespaced => format!("{base}/namespaces/{ns}/{}", self.plural),
            _ => format!("{base}/{}", self.plural),
        }
    }

    pub fn object_path(&self, ns: Option<&str>, name: &str) -> String {
        format!("{}/{}", self.collection_path(ns), name)
    }

    /// Whether this is a built-in kind (strategic merge patch applies), not a CRD.
    pub fn is_builtin(&self) -> bool {
        BUILTIN_GROUPS.contains(&self.group.as_str())
    }
}

const BUILTIN_GROUPS: &[&str] = &[
    "",
    "apps",
    "batch",
    "autoscaling",
    "policy",
    "networking.k8s.io",
    "discovery.k8s.io",
    "coordination.k8s.io",
    "storage.k8s.io",
    "rbac.authorization.k8s.io",
    "scheduling.k8s.io",
    "apiextensions.k8s.io",
    "admissionregistration.k8s.io",
    "certificates.k8s.io",
    "events.k8s.io",
    "node.k8s.io",
];

/// (group, version, kind, plural, short names, namespaced, in category "all")
type Row = (&'static str, &'static str, &'static str, &'static str, &'static [&'static str], bool, bool);

/// Well-known built-in resources, in discovery order.
const WELL_KNOWN: &[Row] = &[
    ("", "v1", "Namespace", "namespaces", &["ns"], false, false),
    ("", "v1", "Pod", "pods", &["po"], true, true),
    ("", "v1", "Node", "nodes", &["no"], false, false),
    ("", "v1", "Service", "services", &["svc"], true, true),
    ("", "v1", "Endpoints", "endpoints", &["ep"], true, false),
    ("", "v1", "ConfigMap", "configmaps", &["cm"], true, false),
    ("", "v1", "Secret", "secrets", &[], true, false),
    ("", "v1", "ServiceAccount", "serviceaccounts", &["sa"], true, false),
    ("", "v1", "Event", "events", &["ev"], true, false),
    ("", "v1", "PersistentVolume", "persistentvolumes", &["pv"], false, false),
    ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", &["pvc"], true, false),
    ("", "v1", "ResourceQuota", "resourcequotas", &["quota"], true, false),
    ("", "v1", "LimitRange", "limitranges", &["limits"], true, false),
    ("", "v1", "ReplicationController", "replicationcontrollers", &["rc"], true, true),
    ("apps", "v1", "Deployment", "deployments", &["deploy"], true, true),
    ("apps", "v1", "ReplicaSet", "replicasets", &["rs"], true, true),
    ("apps", "v1", "StatefulSet", "statefulsets", &["sts"], true, true),
    ("apps", "v1", "DaemonSet", "daemonsets", &["ds"], true, true),
    ("batch", "v1", "Job", "jobs", &[], true, true),
    ("batch", "v1", "CronJob", "cronjobs", &["cj"], true, true),
    ("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", &["hpa"], true, true),
    ("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", &[], true, false),
    ("coordination.k8s.io", "v1", "Lease", "leases", &[], true, false),
    ("storage.k8s.io", "v1", "StorageClass", "storageclasses", &["sc"], false, false),
    ("storage.k8s.io", "v1", "CSIDriver", "csidrivers", &[], false, false),
    ("storage.k8s.io", "v1", "CSINode", "csinodes", &[], false, false),
    ("storage.k8s.io", "v1", "VolumeAttachment", "volumeattachments", &[], false, false),
    ("node.k8s.io", "v1", "RuntimeClass", "runtimeclasses", &[], false, false),
    ("networking.k8s.io", "v1", "Ingress", "ingresses", &["ing"], true, false),
    ("networking.k8s.io", "v1", "IngressClass", "ingressclasses", &[], false, false),
    ("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", &["netpol"], true, false),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles", &[], true, false),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", &[], false, false),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", &[], true, false),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", &[], false, false),
    ("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", &["pc"], false, false),
];

/// Short names that Kubernetes serves for two resources (kubectl warns about the one it
/// does not pick): `ev` is also events.k8s.io's.
pub fn shadowed_short_name(arg: &str) -> Option<&'static str> {
    match arg {
        "ev" => Some("events.events.k8s.io"),
        _ => None,
    }
}

/// The static table as `ApiRes` values.
pub fn well_known() -> Vec<ApiRes> {
    WELL_KNOWN
        .iter()
        .map(|(g, v, k, p, short, ns, all)| ApiRes {
            group: g.to_string(),
            version: v.to_string(),
            kind: k.to_string(),
            plural: p.to_string(),
            singular: k.to_lowercase(),
            short_names: short.iter().map(|s| s.to_string()).collect(),
            namespaced: *ns,
            verbs: ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            categories: if *all { vec!["all".to_string()] } else { vec![] },
        })
        .collect()
}

/// Find the resource a user typed (`po`, `pods`, `Pod`, `deployments.apps`, `deploy.v1.apps`).
pub fn resolve(arg: &str, table: &[ApiRes]) -> Option<ApiRes> {
    let lower = arg.to_lowercase();
    let (name, group) = match lower.split_once('.') {
        Some((n, g)) => (n.to_string(), Some(g.to_string())),
        None => (lower.clone(), None),
    };
    let name_matches = |r: &ApiRes| {
        r.plural == name
            || r.singular == name
            || r.kind.to_lowercase() == name
            || r.short_names.iter().any(|s| *s == name)
    };
    let group_matches = |r: &ApiRes| match &group {
        None => true,
        Some(g) => r.group == *g || format!("{}.{}", r.version, r.group) == *g,
    };
    // Exact plural/singular/short matches beat kind matches; the core group wins ties, as
    // it does in kubectl's priority RESTMapper.
    let mut candidates: Vec<&ApiRes> = table.iter().filter(|r| name_matches(r) && group_matches(r)).collect();
    candidates.sort_by_key(|r| if r.group.is_empty() { 0 } else { 1 });
    candidates.first().map(|r| (*r).clone())
}

/// Find a resource by apiVersion and kind (for manifests).
pub fn by_kind(api_version: &str, kind: &str, table: &[ApiRes]) -> Option<ApiRes> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    table.iter().find(|r| r.group == group && r.version == version && r.kind == kind).cloned()
}

/// Parse one `APIResourceList` document into resources (subresources skipped).
pub fn parse_resource_list(doc: &Value) -> Vec<ApiRes> {
    let gv = doc.get("groupVersion").and_then(Value::as_str).unwrap_or("v1");
    let (group, version) = match gv.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), gv.to_string()),
    };
    let strs = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(String::from).collect()
    };
    doc.get("resources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let name = r.get("name")?.as_str()?;
            if name.contains('/') {
                return None;
            }
            let kind = r.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
            let singular = match r.get("singularName").and_then(Value::as_str) {
                Some(s) if !s.is_empty() => s.to_string(),
                _ => kind.to_lowercase(),
            };
            Some(ApiRes {
                group: group.clone(),
                version: version.clone(),
                kind,
                plural: name.to_string(),
                singular,
                short_names: strs(r.get("shortNames")),
                namespaced: r.get("namespaced").and_then(Value::as_bool).unwrap_or(false),
                verbs: strs(r.get("verbs")),
                categories: strs(r.get("categories")),
            })
        })
        .collect()
}

/// The preferred group versions listed in an `APIGroupList`.
pub fn preferred_versions(groups: &Value) -> Vec<String> {
    groups
        .get("groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|g| {
            g.pointer("/preferredVersion/groupVersion")
                .or_else(|| g.pointer("/versions/0/groupVersion"))
                .and_then(Value::as_str)
                .map(String::from)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn short_plural_singular_kind() {
        let t = well_known();
        for (arg, plural) in [
            ("po", "pods"),
            ("pods", "pods"),
            ("pod", "pods"),
            ("Pod", "pods"),
            ("svc", "services"),
            ("deploy", "deployments"),
            ("deployments.apps", "deployments"),
            ("deployment.v1.apps", "deployments"),
            ("rs", "replicasets"),
            ("ns", "namespaces"),
            ("no", "nodes"),
            ("cm", "configmaps"),
            ("ev", "events"),
            ("ing", "ingresses"),
            ("pv", "persistentvolumes"),
            ("pvc", "persistentvolumeclaims"),
            ("hpa", "horizontalpodautoscalers"),
        ] {
            assert_eq!(resolve(arg, &t).map(|r| r.plural), Some(plural.to_string()), "{arg}");
        }
        assert_eq!(resolve("foo", &t), None);
        assert_eq!(resolve("pods.apps", &t), None);
    }

    #[test]
    fn names_and_paths() {
        let t = well_known();
        let d = resolve("deploy", &t).unwrap();
        assert_eq!(d.kind_group(), "deployment.apps");
        assert_eq!(d.object_path(Some("x"), "web"), "/apis/apps/v1/namespaces/x/deployments/web");
        let n = resolve("no", &t).unwrap();
        assert_eq!(n.object_path(Some("x"), "n1"), "/api/v1/nodes/n1");
        assert_eq!(by_kind("apps/v1", "Deployment", &t).unwrap().plural, "deployments");
    }

    #[test]
    fn parses_discovery() {
        let doc = json!({"groupVersion": "example.com/v1", "resources": [
            {"name": "widgets", "singularName": "widget", "kind": "Widget", "namespaced": true,
             "shortNames": ["wd"], "verbs": ["get", "list"], "categories": ["all"]},
            {"name": "widgets/status", "kind": "Widget", "namespaced": true, "verbs": ["get"]}]});
        let rs = parse_resource_list(&doc);
        assert_eq!(rs.len(), 1);
        assert_eq!(resolve("wd", &rs).unwrap().api_version(), "example.com/v1");
        assert!(!rs[0].is_builtin());
        let groups = json!({"groups": [{"name": "apps", "preferredVersion": {"groupVersion": "apps/v1"}}]});
        assert_eq!(preferred_versions(&groups), vec!["apps/v1"]);
    }
}
