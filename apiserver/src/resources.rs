//! The static table of served resources. It drives discovery and routing; each entry
//! points at the strategy (what is special about the kind) and at the typed decoder used
//! to check an object's shape.

use serde_json::{json, Value};

use crate::registry::kinds;
use crate::registry::Strategy;

/// Decode into the k8s-openapi type and re-encode: rejects wrong shapes (with a field
/// path) and drops unknown fields, as Kubernetes' typed decoding does.
pub type NormalizeFn = fn(Value) -> Result<Value, String>;

/// The OpenAPI schema of the kind: a `$ref` into the generator's definitions (only the
/// generator of the committed OpenAPI documents, a test, calls it).
#[cfg(test)]
pub type SchemaFn = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

fn normalize_as<T>(v: Value) -> Result<Value, String>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    // Fast path without path tracking; only a failure is decoded again for its path.
    let typed: T = match T::deserialize(&v) {
        Ok(t) => t,
        Err(_) => serde_path_to_error::deserialize(&v).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path.is_empty() || path == "." {
                inner.to_string()
            } else {
                format!("{path}: {inner}")
            }
        })?,
    };
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// What a CustomResourceDefinition adds to a served resource.
#[derive(Debug)]
pub struct CustomInfo {
    /// additionalPrinterColumns: (name, type, jsonPath, priority).
    pub printer_columns: Vec<(String, String, String, i64)>,
    /// The version's openAPIV3Schema.
    pub schema: Value,
    /// The CRD is being deleted: its objects are served for reads, updates and deletes
    /// while they are removed, but no new ones are created.
    pub terminating: bool,
}

/// A subresource of a resource, e.g. `pods/status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sub {
    Status,
    Scale,
    Binding,
    Eviction,
    Finalize,
    /// `pods/ephemeralcontainers`: only `spec.ephemeralContainers` changes (`kubectl debug`).
    EphemeralContainers,
    /// Listed in discovery, served by a later part of the system (log, exec, proxy …).
    NotYetServed(&'static str, &'static str),
}

impl Sub {
    pub fn name(&self) -> &'static str {
        match self {
            Sub::Status => "status",
            Sub::Scale => "scale",
            Sub::Binding => "binding",
            Sub::Eviction => "eviction",
            Sub::Finalize => "finalize",
            Sub::EphemeralContainers => "ephemeralcontainers",
            Sub::NotYetServed(n, _) => n,
        }
    }
}

pub const VERBS_ALL: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/// One served resource at one group/version.
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub namespaced: bool,
    pub subresources: &'static [Sub],
    /// The storage prefix segment (`/registry/<storage>/...`). Two versions of one
    /// resource share it.
    pub storage: &'static str,
    pub strategy: &'static dyn Strategy,
    pub normalize: NormalizeFn,
    #[cfg(test)]
    pub schema: SchemaFn,
    /// Set for resources served from a CustomResourceDefinition.
    pub custom: Option<&'static CustomInfo>,
}

impl std::fmt::Debug for ResourceDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} {}", self.group, self.version, self.plural)
    }
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    pub fn has_sub(&self, s: &str) -> Option<Sub> {
        self.subresources.iter().copied().find(|x| x.name() == s)
    }
    pub fn has_status(&self) -> bool {
        self.subresources.contains(&Sub::Status)
    }
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

macro_rules! res {
    ($g:expr, $v:expr, $kind:expr, $plural:expr, $singular:expr, $short:expr, $cat:expr, $ns:expr, $subs:expr, $strategy:expr, $ty:ty) => {
        ResourceDef {
            group: $g,
            version: $v,
            kind: $kind,
            plural: $plural,
            singular: $singular,
            short_names: $short,
            categories: $cat,
            namespaced: $ns,
            subresources: $subs,
            storage: $plural,
            strategy: $strategy,
            normalize: normalize_as::<$ty>,
            #[cfg(test)]
            schema: |g| g.subschema_for::<$ty>(),
            custom: None,
        }
    };
}

use k8s_openapi::api as k;

const ALL: &[&str] = &["all"];
const NONE: &[&str] = &[];
const STATUS: &[Sub] = &[Sub::Status];
const SCALABLE: &[Sub] = &[Sub::Status, Sub::Scale];
const POD_SUBS: &[Sub] = &[
    Sub::Status,
    Sub::Binding,
    Sub::Eviction,
    Sub::EphemeralContainers,
    Sub::NotYetServed("log", "the kubelet connection"),
    Sub::NotYetServed("exec", "the kubelet connection"),
    Sub::NotYetServed("attach", "the kubelet connection"),
    Sub::NotYetServed("portforward", "the kubelet connection"),
    Sub::NotYetServed("proxy", "the kubelet connection"),
];

/// Every resource the apiserver serves.
pub static RESOURCES: &[ResourceDef] = &[
    // core/v1
    res!(
        "",
        "v1",
        "Namespace",
        "namespaces",
        "namespace",
        &["ns"],
        NONE,
        false,
        &[Sub::Status, Sub::Finalize],
        &kinds::NAMESPACE,
        k::core::v1::Namespace
    ),
    res!("", "v1", "Pod", "pods", "pod", &["po"], ALL, true, POD_SUBS, &kinds::POD, k::core::v1::Pod),
    res!(
        "",
        "v1",
        "Node",
        "nodes",
        "node",
        &["no"],
        NONE,
        false,
        &[Sub::Status, Sub::NotYetServed("proxy", "the kubelet connection")],
        &kinds::NODE,
        k::core::v1::Node
    ),
    res!(
        "",
        "v1",
        "Service",
        "services",
        "service",
        &["svc"],
        ALL,
        true,
        &[Sub::Status, Sub::NotYetServed("proxy", "the service proxy")],
        &kinds::SERVICE,
        k::core::v1::Service
    ),
    res!(
        "",
        "v1",
        "Endpoints",
        "endpoints",
        "endpoints",
        &["ep"],
        NONE,
        true,
        &[],
        &kinds::ENDPOINTS,
        k::core::v1::Endpoints
    ),
    res!(
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        "configmap",
        &["cm"],
        NONE,
        true,
        &[],
        &kinds::CONFIGMAP,
        k::core::v1::ConfigMap
    ),
    res!("", "v1", "Secret", "secrets", "secret", NONE, NONE, true, &[], &kinds::SECRET, k::core::v1::Secret),
    res!(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        &["sa"],
        NONE,
        true,
        &[],
        &kinds::SERVICEACCOUNT,
        k::core::v1::ServiceAccount
    ),
    res!("", "v1", "Event", "events", "event", &["ev"], NONE, true, &[], &kinds::EVENT, k::core::v1::Event),
    res!(
        "",
        "v1",
        "PersistentVolume",
        "persistentvolumes",
        "persistentvolume",
        &["pv"],
        NONE,
        false,
        STATUS,
        &kinds::PV,
        k::core::v1::PersistentVolume
    ),
    res!(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        &["pvc"],
        NONE,
        true,
        STATUS,
        &kinds::PVC,
        k::core::v1::PersistentVolumeClaim
    ),
    res!(
        "",
        "v1",
        "ResourceQuota",
        "resourcequotas",
        "resourcequota",
        &["quota"],
        NONE,
        true,
        STATUS,
        &kinds::RESOURCEQUOTA,
        k::core::v1::ResourceQuota
    ),
    res!(
        "",
        "v1",
        "LimitRange",
        "limitranges",
        "limitrange",
        &["limits"],
        NONE,
        true,
        &[],
        &kinds::LIMITRANGE,
        k::core::v1::LimitRange
    ),
    res!(
        "",
        "v1",
        "ReplicationController",
        "replicationcontrollers",
        "replicationcontroller",
        &["rc"],
        ALL,
        true,
        SCALABLE,
        &kinds::REPLICATIONCONTROLLER,
        k::core::v1::ReplicationController
    ),
    res!(
        "",
        "v1",
        "PodTemplate",
        "podtemplates",
        "podtemplate",
        NONE,
        NONE,
        true,
        &[],
        &kinds::PODTEMPLATE,
        k::core::v1::PodTemplate
    ),
    // apps/v1
    res!(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "deployment",
        &["deploy"],
        ALL,
        true,
        SCALABLE,
        &kinds::DEPLOYMENT,
        k::apps::v1::Deployment
    ),
    res!(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        &["rs"],
        ALL,
        true,
        SCALABLE,
        &kinds::REPLICASET,
        k::apps::v1::ReplicaSet
    ),
    res!(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        "statefulset",
        &["sts"],
        ALL,
        true,
        SCALABLE,
        &kinds::STATEFULSET,
        k::apps::v1::StatefulSet
    ),
    res!(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        &["ds"],
        ALL,
        true,
        STATUS,
        &kinds::DAEMONSET,
        k::apps::v1::DaemonSet
    ),
    res!(
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
        NONE,
        NONE,
        true,
        &[],
        &kinds::CONTROLLERREVISION,
        k::apps::v1::ControllerRevision
    ),
    // batch/v1
    res!("batch", "v1", "Job", "jobs", "job", NONE, ALL, true, STATUS, &kinds::JOB, k::batch::v1::Job),
    res!(
        "batch",
        "v1",
        "CronJob",
        "cronjobs",
        "cronjob",
        &["cj"],
        ALL,
        true,
        STATUS,
        &kinds::CRONJOB,
        k::batch::v1::CronJob
    ),
    // autoscaling/v2 (storage version), then autoscaling/v1: a converted view of the same storage
    // (crate::hpaview, served by server::converted_view)
    res!(
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        &["hpa"],
        ALL,
        true,
        STATUS,
        &kinds::HPA,
        k::autoscaling::v2::HorizontalPodAutoscaler
    ),
    res!(
        "autoscaling",
        "v1",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        &["hpa"],
        ALL,
        true,
        STATUS,
        &kinds::HPA,
        k::autoscaling::v1::HorizontalPodAutoscaler
    ),
    // discovery.k8s.io/v1
    res!(
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        "endpointslice",
        NONE,
        NONE,
        true,
        &[],
        &kinds::ENDPOINTSLICE,
        k::discovery::v1::EndpointSlice
    ),
    // coordination.k8s.io/v1
    res!(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        "lease",
        NONE,
        NONE,
        true,
        &[],
        &kinds::LEASE,
        k::coordination::v1::Lease
    ),
    // storage.k8s.io/v1
    res!(
        "storage.k8s.io",
        "v1",
        "StorageClass",
        "storageclasses",
        "storageclass",
        &["sc"],
        NONE,
        false,
        &[],
        &kinds::STORAGECLASS,
        k::storage::v1::StorageClass
    ),
    // networking.k8s.io/v1
    res!(
        "networking.k8s.io",
        "v1",
        "Ingress",
        "ingresses",
        "ingress",
        &["ing"],
        NONE,
        true,
        STATUS,
        &kinds::INGRESS,
        k::networking::v1::Ingress
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "IngressClass",
        "ingressclasses",
        "ingressclass",
        NONE,
        NONE,
        false,
        &[],
        &kinds::INGRESSCLASS,
        k::networking::v1::IngressClass
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        "networkpolicy",
        &["netpol"],
        NONE,
        true,
        &[],
        &kinds::NETWORKPOLICY,
        k::networking::v1::NetworkPolicy
    ),
    // rbac.authorization.k8s.io/v1
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        "role",
        NONE,
        NONE,
        true,
        &[],
        &kinds::RBAC,
        k::rbac::v1::Role
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        NONE,
        NONE,
        false,
        &[],
        &kinds::RBAC,
        k::rbac::v1::ClusterRole
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        NONE,
        NONE,
        true,
        &[],
        &kinds::RBAC_BINDING,
        k::rbac::v1::RoleBinding
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        NONE,
        NONE,
        false,
        &[],
        &kinds::RBAC_BINDING,
        k::rbac::v1::ClusterRoleBinding
    ),
    // events.k8s.io/v1: a converted view of the core/v1 Events (same storage), see server.rs
    res!(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        "event",
        &["ev"],
        NONE,
        true,
        &[],
        &kinds::EVENT,
        k::events::v1::Event
    ),
    // apiextensions.k8s.io/v1
    res!(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        "customresourcedefinition",
        &["crd", "crds"],
        &["api-extensions"],
        false,
        STATUS,
        &crate::registry::crd::CRD,
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition
    ),
    // scheduling.k8s.io/v1
    res!(
        "scheduling.k8s.io",
        "v1",
        "PriorityClass",
        "priorityclasses",
        "priorityclass",
        &["pc"],
        NONE,
        false,
        &[],
        &kinds::PRIORITYCLASS,
        k::scheduling::v1::PriorityClass
    ),
    // policy/v1 (pods/eviction honours these budgets)
    res!(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        &["pdb"],
        NONE,
        true,
        STATUS,
        &kinds::PDB,
        k::policy::v1::PodDisruptionBudget
    ),
];

/// Resources served from CustomResourceDefinitions (kept by [`crate::crds`]).
static CUSTOM: std::sync::RwLock<Vec<&'static ResourceDef>> = std::sync::RwLock::new(Vec::new());

/// Replace the set of custom resources.
pub fn set_custom(defs: Vec<&'static ResourceDef>) {
    if let Ok(mut c) = CUSTOM.write() {
        *c = defs;
    }
}

/// Every served resource: the built-in table, then custom resources.
pub fn all() -> Vec<&'static ResourceDef> {
    let mut v: Vec<&'static ResourceDef> = RESOURCES.iter().collect();
    if let Ok(c) = CUSTOM.read() {
        v.extend(c.iter().copied());
    }
    v
}

/// Look up a resource by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    all().into_iter().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Look up the storage (preferred) definition of a resource by plural and group.
pub fn find_by_plural(group: &str, plural: &str) -> Option<&'static ResourceDef> {
    all().into_iter().find(|r| r.group == group && r.plural == plural)
}

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

// ------------------------------------------------------------------ discovery documents

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
                Sub::Finalize => (r.kind, vec!["update"], None),
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
    fn table_is_consistent() {
        let mut seen = std::collections::HashSet::new();
        for r in RESOURCES {
            assert!(seen.insert((r.group, r.version, r.plural)), "duplicate {r:?}");
            assert!(!r.kind.is_empty() && !r.singular.is_empty());
        }
        assert!(find("", "v1", "pods").is_some());
        assert!(find("apps", "v1", "deployments").is_some());
        assert!(find("apps", "v1", "pods").is_none());
    }

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

    #[test]
    fn normalize_detects_wrong_shapes() {
        let ok = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "i"}]}, "bogus": 1});
        let out = (find("", "v1", "pods").unwrap().normalize)(ok).unwrap();
        assert!(out.get("bogus").is_none());
        let bad = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": "nope"}});
        let err = (find("", "v1", "pods").unwrap().normalize)(bad).unwrap_err();
        assert!(err.contains("spec.containers"), "{err}");
    }
}
