//! The static table of served resources. It drives discovery and routing; each entry
//! points at the strategy (what is special about the kind) and at the typed decoder used
//! to check an object's shape.

use crate::registry::kinds;

use crate::registry::normalize_as;
#[cfg(test)]
pub use crate::registry::SchemaFn;
pub use crate::registry::{CustomInfo, NormalizeFn, ResourceDef, Sub, VERBS_ALL};

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
        &[Sub::Token],
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
    // (crate::hpaview, served through server.rs's Codec)
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
    // apiregistration.k8s.io/v1
    res!(
        "apiregistration.k8s.io",
        "v1",
        "APIService",
        "apiservices",
        "apiservice",
        NONE,
        &["api-extensions"],
        false,
        STATUS,
        &kinds::APISERVICE,
        k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService
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
    res!(
        "storage.k8s.io",
        "v1",
        "CSIDriver",
        "csidrivers",
        "csidriver",
        NONE,
        NONE,
        false,
        &[],
        &kinds::CSIDRIVER,
        k::storage::v1::CSIDriver
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "CSINode",
        "csinodes",
        "csinode",
        NONE,
        NONE,
        false,
        &[],
        &kinds::CSINODE,
        k::storage::v1::CSINode
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "VolumeAttachment",
        "volumeattachments",
        "volumeattachment",
        NONE,
        NONE,
        false,
        STATUS,
        &kinds::VOLUMEATTACHMENT,
        k::storage::v1::VolumeAttachment
    ),
    // node.k8s.io/v1
    res!(
        "node.k8s.io",
        "v1",
        "RuntimeClass",
        "runtimeclasses",
        "runtimeclass",
        NONE,
        NONE,
        false,
        &[],
        &kinds::RUNTIMECLASS,
        k::node::v1::RuntimeClass
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
    // certificates.k8s.io/v1
    res!(
        "certificates.k8s.io",
        "v1",
        "CertificateSigningRequest",
        "certificatesigningrequests",
        "certificatesigningrequest",
        &["csr"],
        NONE,
        false,
        &[Sub::Status, Sub::Approval],
        &crate::registry::csr::CSR,
        k::certificates::v1::CertificateSigningRequest
    ),
    // admissionregistration.k8s.io/v1
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        NONE,
        &["api-extensions"],
        false,
        &[],
        &crate::registry::webhookconfig::MUTATING,
        k::admissionregistration::v1::MutatingWebhookConfiguration
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        NONE,
        &["api-extensions"],
        false,
        &[],
        &crate::registry::webhookconfig::VALIDATING,
        k::admissionregistration::v1::ValidatingWebhookConfiguration
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

/// The first resource, built-in then custom (the order of [`all`]), that `pred` accepts,
/// without collecting them: lookups run on every request.
fn first(pred: impl Fn(&ResourceDef) -> bool) -> Option<&'static ResourceDef> {
    RESOURCES.iter().find(|r| pred(r)).or_else(|| CUSTOM.read().ok()?.iter().copied().find(|r| pred(r)))
}

/// Look up a resource by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    first(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Look up the storage (preferred) definition of a resource by plural and group.
pub fn find_by_plural(group: &str, plural: &str) -> Option<&'static ResourceDef> {
    first(|r| r.group == group && r.plural == plural)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn normalize_detects_wrong_shapes() {
        let ok = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "i"}]}, "bogus": 1});
        let pods = find("", "v1", "pods").unwrap();
        let out = (pods.normalize)(pods, &ok).unwrap();
        assert!(out.get("bogus").is_none());
        let bad = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": "nope"}});
        let err = (pods.normalize)(pods, &bad).unwrap_err();
        assert!(err.contains("spec.containers"), "{err}");
    }
}
