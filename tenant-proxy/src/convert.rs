//! Objects between a tenant and the apiserver ("protocol conversion"); pure.
//!
//! [`Converter::up`] turns what a tenant sends into what is stored (namespaces, cluster-scoped
//! names, CRD groups, RBAC subjects and every cross reference under the tenant's prefix);
//! [`Converter::down`] turns what the apiserver answers back, and says whether it belongs to
//! the tenant at all: an object that does not is dropped, whatever asked for it. Lists,
//! Tables, watch events and `Status` bodies go through [`Converter::body_down`].

use serde_json::Value;

use crate::resources::{access, Access, Resource, Resources};
use crate::tenant::Tenant;

/// The label and annotation keys of RBAC's ClusterRole aggregation: a tenant's ClusterRole
/// carrying one would add its rules to the cluster's own `admin`, `edit` or `view`, so the key
/// is stored under the tenant's own name.
pub const AGGREGATE_PREFIX: &str = "rbac.authorization.k8s.io/aggregate-to-";

/// The tenant's own form of [`AGGREGATE_PREFIX`]: `acme.tenant.minik8s.io/aggregate-to-`.
pub fn tenant_aggregate_prefix(tenant: &Tenant) -> String {
    format!("{}.tenant.minik8s.io/aggregate-to-", tenant.name())
}

pub struct Converter<'a> {
    pub tenant: &'a Tenant,
    pub resources: &'a Resources,
}

/// What an object is, upstream: its group, kind, and scope when known.
struct Shape {
    group: String,
    kind: String,
    namespaced: Option<bool>,
    plural: Option<String>,
}

fn str_at<'v>(v: &'v Value, pointer: &str) -> Option<&'v str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// Apply `f` to the string at `pointer`, if there is one.
fn map_str(v: &mut Value, pointer: &str, f: impl FnOnce(&str) -> Option<String>) -> bool {
    match v.pointer_mut(pointer) {
        Some(Value::String(s)) => match f(s) {
            Some(n) => {
                *s = n;
                true
            }
            None => false,
        },
        _ => true,
    }
}

fn each<'v>(v: &'v mut Value, pointer: &str) -> impl Iterator<Item = &'v mut Value> {
    v.pointer_mut(pointer).and_then(Value::as_array_mut).into_iter().flatten()
}

impl<'a> Converter<'a> {
    pub fn new(tenant: &'a Tenant, resources: &'a Resources) -> Self {
        Converter { tenant, resources }
    }

    fn shape(&self, obj: &Value, upstream_group: Option<&str>, res: Option<&Resource>) -> Shape {
        let from_object =
            obj["apiVersion"].as_str().zip(obj["kind"].as_str()).filter(|(_, k)| *k != "PartialObjectMetadata");
        if let Some((api_version, kind)) = from_object {
            let group = match upstream_group {
                Some(g) => g.to_string(),
                None => api_version.rsplit_once('/').map(|(g, _)| g.to_string()).unwrap_or_default(),
            };
            let found = self.resources.by_kind(&group, kind).or(res.filter(|r| r.kind == kind));
            return Shape {
                namespaced: found.map(|r| r.namespaced),
                plural: found.map(|r| r.plural.clone()),
                group,
                kind: kind.to_string(),
            };
        }
        match res {
            Some(r) => Shape {
                group: r.group.clone(),
                kind: r.kind.clone(),
                namespaced: Some(r.namespaced),
                plural: Some(r.plural.clone()),
            },
            None => Shape { group: String::new(), kind: String::new(), namespaced: None, plural: None },
        }
    }

    /// Whether objects of this cluster-scoped resource are the tenant's (names converted).
    fn owns_cluster_scoped(&self, group: &str, plural: &str) -> bool {
        access(group, plural) == Access::Own
    }

    /// A name of a cluster-scoped kind, as stored.
    fn cluster_name_up(&self, group: &str, plural: &str, name: &str) -> String {
        if crate::resources::is_crd(group, plural) {
            self.tenant.crd_name_up(name)
        } else if self.owns_cluster_scoped(group, plural) {
            self.tenant.up(name)
        } else {
            name.to_string()
        }
    }

    fn cluster_name_down(&self, group: &str, plural: &str, name: &str) -> Option<String> {
        if crate::resources::is_crd(group, plural) {
            self.tenant.crd_name_down(name)
        } else if self.owns_cluster_scoped(group, plural) {
            self.tenant.down(name).map(str::to_string)
        } else {
            Some(name.to_string())
        }
    }

    /// A reference's name to an object of `kind` in the tenant's `group` (as the tenant wrote it).
    fn ref_name_up(&self, api_version: &str, kind: &str, name: &str) -> String {
        let group =
            self.tenant.api_version_up(api_version).rsplit_once('/').map(|(g, _)| g.to_string()).unwrap_or_default();
        match self.resources.by_kind(&group, kind) {
            Some(r) if !r.namespaced => self.cluster_name_up(&group, &r.plural, name),
            _ => name.to_string(),
        }
    }

    fn ref_name_down(&self, api_version: &str, kind: &str, name: &str) -> String {
        let group = api_version.rsplit_once('/').map(|(g, _)| g.to_string()).unwrap_or_default();
        match self.resources.by_kind(&group, kind) {
            Some(r) if !r.namespaced => {
                self.cluster_name_down(&group, &r.plural, name).unwrap_or_else(|| name.to_string())
            }
            _ => name.to_string(),
        }
    }

    // ------------------------------------------------------------------ up

    /// A tenant's object (or a patch shaped like one) as it is stored. `res` is the
    /// resource the request addresses (upstream), for bodies without apiVersion and kind.
    pub fn up(&self, obj: &mut Value, res: Option<&Resource>) {
        if !obj.is_object() {
            return;
        }
        let t = self.tenant;
        let tenant_api_version = obj["apiVersion"].as_str().map(str::to_string);
        if let Some(av) = &tenant_api_version {
            obj["apiVersion"] = Value::String(t.api_version_up(av));
        }
        let shape = self.shape(obj, None, res);
        let namespaced = shape.namespaced.unwrap_or_else(|| obj.pointer("/metadata/namespace").is_some());
        if namespaced {
            map_str(obj, "/metadata/namespace", |ns| Some(t.up(ns)));
        } else if let Some(plural) = &shape.plural {
            map_str(obj, "/metadata/name", |n| Some(self.cluster_name_up(&shape.group, plural, n)));
            if self.owns_cluster_scoped(&shape.group, plural) && !crate::resources::is_crd(&shape.group, plural) {
                map_str(obj, "/metadata/generateName", |n| Some(t.up(n)));
            }
        }
        for owner in each(obj, "/metadata/ownerReferences") {
            let av = owner["apiVersion"].as_str().unwrap_or_default().to_string();
            let kind = owner["kind"].as_str().unwrap_or_default().to_string();
            map_str(owner, "/name", |n| Some(self.ref_name_up(&av, &kind, n)));
            map_str(owner, "/apiVersion", |a| Some(t.api_version_up(a)));
        }
        self.kind_up(obj, &shape.group, &shape.kind);
    }

    fn kind_up(&self, obj: &mut Value, group: &str, kind: &str) {
        let t = self.tenant;
        match (group, kind) {
            ("apiextensions.k8s.io", "CustomResourceDefinition") => {
                map_str(obj, "/spec/group", |g| Some(t.group_up(g)));
            }
            ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
                let cluster = kind == "ClusterRoleBinding";
                for s in each(obj, "/subjects") {
                    self.subject_up(s, cluster);
                }
                if str_at(obj, "/roleRef/kind") == Some("ClusterRole") {
                    map_str(obj, "/roleRef/name", |n| Some(t.up(n)));
                }
            }
            ("rbac.authorization.k8s.io", "ClusterRole") => {
                self.aggregation_keys(obj, true);
            }
            ("", "PersistentVolume") => {
                map_str(obj, "/spec/claimRef/namespace", |n| Some(t.up(n)));
                map_str(obj, "/spec/storageClassName", |n| Some(class_up(t, n)));
            }
            ("", "PersistentVolumeClaim") => {
                map_str(obj, "/spec/volumeName", |n| Some(class_up(t, n)));
                map_str(obj, "/spec/storageClassName", |n| Some(class_up(t, n)));
            }
            ("", "Namespace") => {
                map_str(obj, "/metadata/labels/kubernetes.io~1metadata.name", |n| Some(t.up(n)));
            }
            ("", "Event") => {
                map_str(obj, "/involvedObject/namespace", |n| Some(t.up(n)));
            }
            ("events.k8s.io", "Event") => {
                map_str(obj, "/regarding/namespace", |n| Some(t.up(n)));
            }
            ("", "Endpoints") => {
                for subset in each(obj, "/subsets") {
                    for list in ["/addresses", "/notReadyAddresses"] {
                        for a in each(subset, list) {
                            map_str(a, "/targetRef/namespace", |n| Some(t.up(n)));
                        }
                    }
                }
            }
            ("discovery.k8s.io", "EndpointSlice") => {
                for e in each(obj, "/endpoints") {
                    map_str(e, "/targetRef/namespace", |n| Some(t.up(n)));
                }
            }
            ("networking.k8s.io", "Ingress") => {
                map_str(obj, "/spec/ingressClassName", |n| Some(t.up(n)));
            }
            ("authorization.k8s.io", "SelfSubjectAccessReview") => {
                let plural = str_at(obj, "/spec/resourceAttributes/resource").unwrap_or_default().to_string();
                let group = t.group_up(str_at(obj, "/spec/resourceAttributes/group").unwrap_or_default());
                map_str(obj, "/spec/resourceAttributes/namespace", |n| Some(t.up(n)));
                map_str(obj, "/spec/resourceAttributes/group", |_| Some(group.clone()));
                if self.resources.find(&group, &plural).is_some_and(|r| !r.namespaced) {
                    map_str(obj, "/spec/resourceAttributes/name", |n| Some(self.cluster_name_up(&group, &plural, n)));
                }
            }
            ("authorization.k8s.io", "SelfSubjectRulesReview") => {
                map_str(obj, "/spec/namespace", |n| Some(t.up(n)));
            }
            _ => {}
        }
        for spec in pod_specs(obj) {
            map_str(spec, "/priorityClassName", |n| Some(priority_up(t, n)));
        }
        for claim in each(obj, "/spec/volumeClaimTemplates") {
            map_str(claim, "/spec/storageClassName", |n| Some(class_up(t, n)));
        }
    }

    fn subject_up(&self, s: &mut Value, cluster_binding: bool) {
        let t = self.tenant;
        match s["kind"].as_str() {
            Some("User" | "Group") => {
                map_str(s, "/name", |n| Some(t.subject_up(n)));
            }
            Some("ServiceAccount") if cluster_binding => {
                // The service account's own token must not get cluster-wide rights upstream
                // (its pods could then reach every tenant's objects past the proxy): a
                // ClusterRoleBinding names it as a user only the proxy impersonates.
                let ns = s["namespace"].as_str().unwrap_or_default().to_string();
                let name = s["name"].as_str().unwrap_or_default().to_string();
                *s = serde_json::json!({
                    "kind": "User",
                    "apiGroup": "rbac.authorization.k8s.io",
                    "name": t.subject_up(&format!("system:serviceaccount:{ns}:{name}")),
                });
            }
            Some("ServiceAccount") => {
                map_str(s, "/namespace", |n| Some(t.up(n)));
            }
            _ => {}
        }
    }

    fn subject_down(&self, s: &mut Value) {
        let t = self.tenant;
        let kind = s["kind"].as_str().unwrap_or_default().to_string();
        let name = s["name"].as_str().unwrap_or_default().to_string();
        match kind.as_str() {
            "User" | "Group" => {
                let inner = t.subject_down(&name).unwrap_or(&name).to_string();
                match inner.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')) {
                    Some((ns, sa)) if kind == "User" => {
                        *s = serde_json::json!({"kind": "ServiceAccount", "namespace": ns, "name": sa});
                    }
                    _ => s["name"] = Value::String(inner),
                }
            }
            "ServiceAccount" => {
                map_str(s, "/namespace", |n| Some(t.down_or_same(n).to_string()));
            }
            _ => {}
        }
    }

    /// ClusterRole aggregation keys under the tenant's name (`up`) or back.
    fn aggregation_keys(&self, obj: &mut Value, up: bool) {
        let own = tenant_aggregate_prefix(self.tenant);
        let (from, to) = if up { (AGGREGATE_PREFIX, own.as_str()) } else { (own.as_str(), AGGREGATE_PREFIX) };
        let rename = |m: &mut Value| {
            if let Some(map) = m.as_object_mut() {
                let keys: Vec<String> = map.keys().filter(|k| k.starts_with(from)).cloned().collect();
                for k in keys {
                    if let Some(v) = map.remove(&k) {
                        map.insert(format!("{to}{}", &k[from.len()..]), v);
                    }
                }
            }
        };
        if let Some(labels) = obj.pointer_mut("/metadata/labels") {
            rename(labels);
        }
        for sel in each(obj, "/aggregationRule/clusterRoleSelectors") {
            if let Some(m) = sel.get_mut("matchLabels") {
                rename(m);
            }
            for e in each(sel, "/matchExpressions") {
                map_str(e, "/key", |k| {
                    Some(k.strip_prefix(from).map(|r| format!("{to}{r}")).unwrap_or_else(|| k.to_string()))
                });
            }
        }
    }

    // ------------------------------------------------------------------ down

    /// An upstream object as the tenant sees it; false if it is not the tenant's.
    pub fn down(&self, obj: &mut Value, res: Option<&Resource>) -> bool {
        if !obj.is_object() {
            return false;
        }
        let t = self.tenant;
        let shape = self.shape(obj, None, res);
        if let Some(av) = obj["apiVersion"].as_str() {
            match t.api_version_down(av) {
                Some(d) => obj["apiVersion"] = Value::String(d),
                None => return false,
            }
        }
        let namespace = str_at(obj, "/metadata/namespace").filter(|n| !n.is_empty()).map(str::to_string);
        let namespaced = shape.namespaced.unwrap_or(namespace.is_some());
        if namespaced {
            let Some(ns) = namespace.as_deref().and_then(|n| t.down(n)) else { return false };
            obj["metadata"]["namespace"] = Value::String(ns.to_string());
        } else {
            let Some(plural) = &shape.plural else { return false };
            if access(&shape.group, plural) == Access::Forbidden {
                return false;
            }
            let name = str_at(obj, "/metadata/name").unwrap_or_default().to_string();
            match self.cluster_name_down(&shape.group, plural, &name) {
                Some(n) => obj["metadata"]["name"] = Value::String(n),
                None => return false,
            }
            if self.owns_cluster_scoped(&shape.group, plural) {
                map_str(obj, "/metadata/generateName", |n| Some(t.down_or_same(n).to_string()));
            }
        }
        for owner in each(obj, "/metadata/ownerReferences") {
            let av = owner["apiVersion"].as_str().unwrap_or_default().to_string();
            let kind = owner["kind"].as_str().unwrap_or_default().to_string();
            map_str(owner, "/name", |n| Some(self.ref_name_down(&av, &kind, n)));
            map_str(owner, "/apiVersion", |a| Some(t.api_version_down(a).unwrap_or_else(|| a.to_string())));
        }
        self.kind_down(obj, &shape.group, &shape.kind);
        true
    }

    fn kind_down(&self, obj: &mut Value, group: &str, kind: &str) {
        let t = self.tenant;
        let same = |n: &str| Some(t.down_or_same(n).to_string());
        match (group, kind) {
            ("apiextensions.k8s.io", "CustomResourceDefinition") => {
                map_str(obj, "/spec/group", |g| Some(t.group_down(g).unwrap_or(g).to_string()));
            }
            ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
                for s in each(obj, "/subjects") {
                    self.subject_down(s);
                }
                if str_at(obj, "/roleRef/kind") == Some("ClusterRole") {
                    map_str(obj, "/roleRef/name", same);
                }
            }
            ("rbac.authorization.k8s.io", "ClusterRole") => self.aggregation_keys(obj, false),
            ("", "PersistentVolume") => {
                map_str(obj, "/spec/claimRef/namespace", same);
                map_str(obj, "/spec/storageClassName", same);
            }
            ("", "PersistentVolumeClaim") => {
                map_str(obj, "/spec/volumeName", same);
                map_str(obj, "/spec/storageClassName", same);
            }
            ("", "Namespace") => {
                map_str(obj, "/metadata/labels/kubernetes.io~1metadata.name", same);
            }
            ("", "Event") => {
                map_str(obj, "/involvedObject/namespace", same);
            }
            ("events.k8s.io", "Event") => {
                map_str(obj, "/regarding/namespace", same);
            }
            ("", "Endpoints") => {
                for subset in each(obj, "/subsets") {
                    for list in ["/addresses", "/notReadyAddresses"] {
                        for a in each(subset, list) {
                            map_str(a, "/targetRef/namespace", same);
                        }
                    }
                }
            }
            ("discovery.k8s.io", "EndpointSlice") => {
                for e in each(obj, "/endpoints") {
                    map_str(e, "/targetRef/namespace", same);
                }
            }
            ("networking.k8s.io", "Ingress") => {
                map_str(obj, "/spec/ingressClassName", same);
            }
            ("authorization.k8s.io", "SelfSubjectAccessReview") => {
                map_str(obj, "/spec/resourceAttributes/namespace", same);
                map_str(obj, "/spec/resourceAttributes/name", same);
                map_str(obj, "/spec/resourceAttributes/group", |g| Some(t.group_down(g).unwrap_or(g).to_string()));
            }
            ("authorization.k8s.io", "SelfSubjectRulesReview") => {
                map_str(obj, "/spec/namespace", same);
            }
            ("authentication.k8s.io", "SelfSubjectReview") => {
                map_str(obj, "/status/userInfo/username", |u| Some(t.subject_down(u).unwrap_or(u).to_string()));
                for g in each(obj, "/status/userInfo/groups") {
                    if let Some(s) = g.as_str().and_then(|s| t.subject_down(s)) {
                        *g = Value::String(s.to_string());
                    }
                }
            }
            _ => {}
        }
        for spec in pod_specs(obj) {
            map_str(spec, "/priorityClassName", same);
        }
        for claim in each(obj, "/spec/volumeClaimTemplates") {
            map_str(claim, "/spec/storageClassName", same);
        }
    }

    /// A `Status` as the tenant sees it: names and groups in its details without the
    /// tenant's prefix, and the messages with the tenant's own names.
    pub fn status_down(&self, status: &mut Value) {
        let t = self.tenant;
        let group = str_at(status, "/details/group").unwrap_or_default().to_string();
        let kind = str_at(status, "/details/kind").unwrap_or_default().to_string();
        if let Some(r) = self.resources.find(&group, &kind).filter(|r| !r.namespaced) {
            let (g, p) = (r.group.clone(), r.plural.clone());
            map_str(status, "/details/name", |n| {
                Some(self.cluster_name_down(&g, &p, n).unwrap_or_else(|| n.to_string()))
            });
        }
        map_str(status, "/details/group", |g| Some(t.group_down(g).unwrap_or(g).to_string()));
        map_str(status, "/message", |m| Some(self.text_down(m)));
        for c in each(status, "/details/causes") {
            map_str(c, "/message", |m| Some(self.text_down(m)));
            map_str(c, "/field", |m| Some(self.text_down(m)));
        }
    }

    /// A message with the tenant's stored names as the tenant knows them.
    pub fn text_down(&self, text: &str) -> String {
        let name = self.tenant.name();
        text.replace(&format!("tenant:{name}:"), "")
            .replace(&format!("\"{name}-"), "\"")
            .replace(&format!(" {name}-"), " ")
            .replace(&format!(".{name}."), ".")
            .replace(&format!("\"{name}."), "\"")
    }

    /// Any JSON answer: a list, a Table, a Status or one object. False when it is one
    /// object that is not the tenant's (the caller answers 404).
    pub fn body_down(&self, body: &mut Value, res: Option<&Resource>) -> bool {
        match body["kind"].as_str() {
            Some("Status") => {
                self.status_down(body);
                true
            }
            Some("Table") => {
                self.table_down(body, res);
                true
            }
            Some(k) if k.ends_with("List") && body.get("items").is_some_and(Value::is_array) => {
                if let Some(av) = body["apiVersion"].as_str() {
                    body["apiVersion"] =
                        Value::String(self.tenant.api_version_down(av).unwrap_or_else(|| av.to_string()));
                }
                if let Some(items) = body["items"].as_array_mut() {
                    items.retain_mut(|item| self.down(item, res));
                }
                true
            }
            _ => self.down(body, res),
        }
    }

    /// A `meta.k8s.io` Table: rows that are not the tenant's go, the name column of a
    /// cluster-scoped resource loses the prefix.
    fn table_down(&self, table: &mut Value, res: Option<&Resource>) {
        let name_column = table["columnDefinitions"]
            .as_array()
            .and_then(|cols| cols.iter().position(|c| c["format"] == "name"))
            .unwrap_or(0);
        let cluster = res.filter(|r| !r.namespaced).map(|r| (r.group.clone(), r.plural.clone()));
        if let Some(rows) = table["rows"].as_array_mut() {
            rows.retain_mut(|row| {
                let keep = match row.get_mut("object") {
                    Some(o) => self.down(o, res),
                    None => false,
                };
                if let (true, Some((g, p))) = (keep, &cluster) {
                    if let Some(Value::String(cell)) = row.pointer_mut(&format!("/cells/{name_column}")) {
                        if let Some(n) = self.cluster_name_down(g, p, cell) {
                            *cell = n;
                        }
                    }
                }
                keep
            });
        }
    }

    /// One watch event: None if the tenant must not see it.
    pub fn event_down(&self, event: &mut Value, res: Option<&Resource>) -> bool {
        match event["type"].as_str() {
            Some("ERROR") => {
                self.status_down(&mut event["object"]);
                true
            }
            Some("BOOKMARK") => {
                if let Some(av) = event["object"]["apiVersion"].as_str() {
                    event["object"]["apiVersion"] =
                        Value::String(self.tenant.api_version_down(av).unwrap_or_else(|| av.to_string()));
                }
                true
            }
            _ => {
                let obj = &mut event["object"];
                if obj["kind"] == "Table" {
                    self.table_down(obj, res);
                    obj["rows"].as_array().is_some_and(|r| !r.is_empty())
                } else {
                    self.down(obj, res)
                }
            }
        }
    }
}

/// A storage or ingress class name or a PV name: the tenant's (empty stays empty).
fn class_up(t: &Tenant, name: &str) -> String {
    if name.is_empty() {
        String::new()
    } else {
        t.up(name)
    }
}

/// A PriorityClass name: Kubernetes' `system-` classes are the cluster's.
fn priority_up(t: &Tenant, name: &str) -> String {
    if name.is_empty() || name.starts_with("system-") {
        name.to_string()
    } else {
        t.up(name)
    }
}

/// The pod specs of an object: a Pod's, a workload's template, a CronJob's job template.
fn pod_specs(obj: &mut Value) -> Vec<&mut Value> {
    let kind = obj["kind"].as_str().unwrap_or_default().to_string();
    let pointer = match kind.as_str() {
        "Pod" => "/spec",
        "CronJob" => "/spec/jobTemplate/spec/template/spec",
        "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" | "Job" | "ReplicationController" | "PodTemplate" => {
            if kind == "PodTemplate" {
                "/template/spec"
            } else {
                "/spec/template/spec"
            }
        }
        _ => return vec![],
    };
    obj.pointer_mut(pointer).into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resources() -> Resources {
        let mut r = Resources::default();
        r.add_list(
            "",
            "v1",
            &json!({"resources": [
                {"name": "pods", "kind": "Pod", "namespaced": true},
                {"name": "namespaces", "kind": "Namespace", "namespaced": false},
                {"name": "nodes", "kind": "Node", "namespaced": false},
                {"name": "persistentvolumes", "kind": "PersistentVolume", "namespaced": false},
                {"name": "persistentvolumeclaims", "kind": "PersistentVolumeClaim", "namespaced": true},
            ]}),
        );
        r.add_list(
            "rbac.authorization.k8s.io",
            "v1",
            &json!({"resources": [
                {"name": "clusterroles", "kind": "ClusterRole", "namespaced": false},
                {"name": "clusterrolebindings", "kind": "ClusterRoleBinding", "namespaced": false},
            ]}),
        );
        r.add_list(
            "apiextensions.k8s.io",
            "v1",
            &json!({"resources": [{"name": "customresourcedefinitions", "kind": "CustomResourceDefinition", "namespaced": false}]}),
        );
        r.add_list(
            "acme.example.com",
            "v1",
            &json!({"resources": [{"name": "widgets", "kind": "Widget", "namespaced": true}]}),
        );
        r.add_list(
            "acme.example.com",
            "v1",
            &json!({"resources": [{"name": "gadgets", "kind": "Gadget", "namespaced": false}]}),
        );
        r
    }

    #[test]
    fn namespaced_objects_and_their_owners() {
        let t = Tenant::new("acme").unwrap();
        let r = resources();
        let c = Converter::new(&t, &r);
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default",
            "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "Gadget", "name": "g", "uid": "1"},
                                {"apiVersion": "example.com/v1", "kind": "Widget", "name": "w", "uid": "2"}]},
            "spec": {"priorityClassName": "high"}});
        let original = pod.clone();
        c.up(&mut pod, None);
        assert_eq!(pod["metadata"]["namespace"], "acme-default");
        assert_eq!(pod["metadata"]["name"], "web");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["apiVersion"], "acme.example.com/v1");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["name"], "acme-g");
        assert_eq!(pod["metadata"]["ownerReferences"][1]["name"], "w");
        assert_eq!(pod["spec"]["priorityClassName"], "acme-high");
        assert!(c.down(&mut pod, None));
        assert_eq!(pod, original);
        let mut other =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "bob-default"}});
        assert!(!c.down(&mut other, None));
        let mut system =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dns", "namespace": "kube-system"}});
        assert!(!c.down(&mut system, None));
    }

    #[test]
    fn cluster_scoped_names_crds_and_nodes() {
        let t = Tenant::new("acme").unwrap();
        let r = resources();
        let c = Converter::new(&t, &r);
        let mut ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "prod"}});
        c.up(&mut ns, None);
        assert_eq!(ns["metadata"]["name"], "acme-prod");
        let mut crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com"}});
        c.up(&mut crd, None);
        assert_eq!(crd["metadata"]["name"], "widgets.acme.example.com");
        assert_eq!(crd["spec"]["group"], "acme.example.com");
        assert!(c.down(&mut crd, None));
        assert_eq!(crd["metadata"]["name"], "widgets.example.com");
        let mut theirs = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.bob.example.com"}, "spec": {"group": "bob.example.com"}});
        assert!(!c.down(&mut theirs, None));
        let mut node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}});
        assert!(c.down(&mut node, None));
        assert_eq!(node["metadata"]["name"], "node-1");
        let mut admins =
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "admin"}});
        assert!(!c.down(&mut admins, None), "the cluster's own ClusterRoles are not the tenant's");
    }

    #[test]
    fn rbac_subjects_and_role_refs() {
        let t = Tenant::new("acme").unwrap();
        let r = resources();
        let c = Converter::new(&t, &r);
        let mut b = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "readers"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"},
            "subjects": [{"kind": "User", "name": "jane"}, {"kind": "Group", "name": "devs"},
                         {"kind": "ServiceAccount", "namespace": "prod", "name": "bot"}]});
        let original = b.clone();
        c.up(&mut b, None);
        assert_eq!(b["metadata"]["name"], "acme-readers");
        assert_eq!(b["roleRef"]["name"], "acme-reader");
        assert_eq!(b["subjects"][0]["name"], "tenant:acme:jane");
        assert_eq!(b["subjects"][1]["name"], "tenant:acme:devs");
        assert_eq!(
            b["subjects"][2],
            json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io",
            "name": "tenant:acme:system:serviceaccount:prod:bot"})
        );
        assert!(c.down(&mut b, None));
        assert_eq!(b, original);
    }

    #[test]
    fn aggregation_labels_stay_inside_the_tenant() {
        let t = Tenant::new("acme").unwrap();
        let r = resources();
        let c = Converter::new(&t, &r);
        let mut role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "extra", "labels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}}});
        let original = role.clone();
        c.up(&mut role, None);
        assert_eq!(role["metadata"]["labels"], json!({"acme.tenant.minik8s.io/aggregate-to-admin": "true"}));
        assert!(c.down(&mut role, None));
        assert_eq!(role, original);
    }

    #[test]
    fn volumes_bind_inside_the_tenant() {
        let t = Tenant::new("acme").unwrap();
        let r = resources();
        let c = Converter::new(&t, &r);
        let mut pv = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"},
            "spec": {"storageClassName": "manual", "claimRef": {"namespace": "default", "name": "data"}}});
        c.up(&mut pv, None);
        assert_eq!(pv["metadata"]["name"], "acme-pv1");
        assert_eq!(pv["spec"]["storageClassName"], "acme-manual");
        assert_eq!(pv["spec"]["claimRef"]["namespace"], "acme-default");
        let mut pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": "acme-default"},
            "spec": {"storageClassName": "", "volumeName": "acme-pv1"}});
        assert!(c.down(&mut pvc, None));
        assert_eq!(pvc["spec"]["volumeName"], "pv1");
        assert_eq!(pvc["spec"]["storageClassName"], "", "no class stays no class");
        assert_eq!(pvc["metadata"]["namespace"], "default");
    }

    #[test]
    fn lists_tables_events_and_statuses() {
        let t = Tenant::new("acme").unwrap();
        let r = resources();
        let c = Converter::new(&t, &r);
        let ns = r.find("", "namespaces").cloned();
        let mut list = json!({"kind": "NamespaceList", "apiVersion": "v1", "items": [
            {"metadata": {"name": "acme-prod"}}, {"metadata": {"name": "bob-prod"}}]});
        c.body_down(&mut list, ns.as_ref());
        assert_eq!(list["items"], json!([{"metadata": {"name": "prod"}}]));
        let mut table = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "columnDefinitions": [{"name": "Name", "format": "name"}, {"name": "Status", "format": ""}],
            "rows": [{"cells": ["acme-prod", "Active"], "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "acme-prod"}}},
                     {"cells": ["bob-prod", "Active"], "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "bob-prod"}}}]});
        c.body_down(&mut table, ns.as_ref());
        assert_eq!(table["rows"].as_array().unwrap().len(), 1);
        assert_eq!(table["rows"][0]["cells"][0], "prod");
        assert_eq!(table["rows"][0]["object"]["metadata"]["name"], "prod");
        let mut status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound",
            "message": "namespaces \"acme-prod\" not found", "details": {"name": "acme-prod", "kind": "namespaces"}});
        c.body_down(&mut status, None);
        assert_eq!(status["message"], "namespaces \"prod\" not found");
        assert_eq!(status["details"]["name"], "prod");
        let pods = r.find("", "pods").cloned();
        let mut event = json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "bob-a"}}});
        assert!(!c.event_down(&mut event, pods.as_ref()));
        let mut forbidden = json!({"kind": "Status", "message": "User \"tenant:acme:jane\" cannot list resource \"pods\" in API group \"\" in the namespace \"acme-prod\""});
        c.status_down(&mut forbidden);
        assert_eq!(
            forbidden["message"],
            "User \"jane\" cannot list resource \"pods\" in API group \"\" in the namespace \"prod\""
        );
    }
}
