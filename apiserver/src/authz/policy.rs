//! The bootstrap policy: the ClusterRoles and ClusterRoleBindings Kubernetes creates at
//! start, limited to the resources served here, and what reconciling them with what is
//! stored changes ([`reconcile_role`], [`reconcile_binding`]: pure). Reconciliation adds
//! missing objects, rules, selectors and subjects and never removes what users added; an
//! object annotated `rbac.authorization.kubernetes.io/autoupdate: "false"` is left alone.
//!
//! `admin`, `edit` and `view` are aggregated (their rules are the union of the ClusterRoles
//! labelled `rbac.authorization.k8s.io/aggregate-to-<name>`, which the controller-manager's
//! `clusterrole-aggregation` controller writes into them), as upstream.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::escalation;
use super::rbac::GROUP;

pub const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";
pub const BOOTSTRAPPING_LABEL: (&str, &str) = ("kubernetes.io/bootstrapping", "rbac-defaults");

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];
const READ_WRITE: &[&str] = &["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];
const READ_UPDATE: &[&str] = &["get", "list", "watch", "update", "patch"];

const CORE: &str = "";
const APPS: &str = "apps";
const AUTHENTICATION: &str = "authentication.k8s.io";
const AUTHORIZATION: &str = "authorization.k8s.io";
const AUTOSCALING: &str = "autoscaling";
const BATCH: &str = "batch";
const CERTIFICATES: &str = "certificates.k8s.io";
const COORDINATION: &str = "coordination.k8s.io";
const DISCOVERY: &str = "discovery.k8s.io";
const EVENTS: &str = "events.k8s.io";
const EXTENSIONS: &str = "extensions";
const NETWORKING: &str = "networking.k8s.io";
const NODE: &str = "node.k8s.io";
const POLICY: &str = "policy";
const STORAGE: &str = "storage.k8s.io";
const METRICS: &str = "metrics.k8s.io";
const CUSTOM_METRICS: &str = "custom.metrics.k8s.io";

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A resource rule.
fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: strings(verbs),
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        ..Default::default()
    }
}

/// A resource rule limited to names.
fn named(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> PolicyRule {
    PolicyRule { resource_names: Some(strings(names)), ..rule(verbs, groups, resources) }
}

/// A non-resource rule.
fn urls(verbs: &[&str], urls: &[&str]) -> PolicyRule {
    PolicyRule { verbs: strings(verbs), non_resource_urls: Some(strings(urls)), ..Default::default() }
}

fn events_rule() -> PolicyRule {
    rule(&["create", "update", "patch"], &[CORE, EVENTS], &["events"])
}

fn role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        rules: Some(rules),
        ..Default::default()
    }
}

fn labelled(mut r: ClusterRole, key: &str) -> ClusterRole {
    r.metadata.labels.get_or_insert_with(BTreeMap::new).insert(key.into(), "true".into());
    r
}

fn aggregated(name: &str, label: &str) -> ClusterRole {
    let selector = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            format!("rbac.authorization.k8s.io/aggregate-to-{label}"),
            "true".into(),
        )])),
        ..Default::default()
    };
    ClusterRole {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        aggregation_rule: Some(AggregationRule { cluster_role_selectors: Some(vec![selector]) }),
        rules: None,
    }
}

/// What a kubelet needs (Kubernetes' `NodeRules`, for the resources served here).
pub fn node_rules() -> Vec<PolicyRule> {
    vec![
        rule(&["create"], &[AUTHENTICATION], &["tokenreviews"]),
        rule(&["create"], &[AUTHORIZATION], &["subjectaccessreviews", "localsubjectaccessreviews"]),
        // Its client certificate, renewed through a CertificateSigningRequest.
        rule(&["create", "get", "list", "watch"], &[CERTIFICATES], &["certificatesigningrequests"]),
        rule(READ, &[CORE], &["services"]),
        rule(&["create", "get", "list", "watch"], &[CORE], &["nodes"]),
        rule(&["update", "patch"], &[CORE], &["nodes/status"]),
        rule(&["update", "patch"], &[CORE], &["nodes"]),
        rule(&["create", "update", "patch"], &[CORE], &["events"]),
        rule(READ, &[CORE], &["pods"]),
        rule(&["create", "delete"], &[CORE], &["pods"]),
        rule(&["update", "patch"], &[CORE], &["pods/status"]),
        rule(&["create"], &[CORE], &["pods/eviction"]),
        rule(&["get", "list", "watch"], &[CORE], &["secrets", "configmaps"]),
        rule(&["get"], &[CORE], &["persistentvolumeclaims", "persistentvolumes"]),
        rule(&["get"], &[CORE], &["endpoints"]),
        rule(&["get", "create", "update", "patch", "delete"], &[COORDINATION], &["leases"]),
        rule(&["create"], &[CORE], &["serviceaccounts/token"]),
        rule(&["get", "update", "patch"], &[CORE], &["persistentvolumeclaims/status"]),
        // The handler of a pod's RuntimeClass, and the CSI objects a node reads and keeps.
        rule(READ, &[NODE], &["runtimeclasses"]),
        rule(&["get"], &[STORAGE], &["volumeattachments"]),
        rule(&["get", "create", "update", "patch", "delete"], &[STORAGE], &["csinodes"]),
        rule(READ, &[STORAGE], &["csidrivers"]),
    ]
}

/// The controller-manager's controllers, each with the ClusterRole
/// `system:controller:<name>` bound to the service account `kube-system/<name>`.
fn controller_roles() -> Vec<(&'static str, Vec<PolicyRule>)> {
    vec![
        (
            "certificate-controller",
            vec![
                rule(&["get", "list", "watch", "delete"], &[CERTIFICATES], &["certificatesigningrequests"]),
                rule(
                    &["update"],
                    &[CERTIFICATES],
                    &["certificatesigningrequests/status", "certificatesigningrequests/approval"],
                ),
                named(
                    &["approve"],
                    &[CERTIFICATES],
                    &["signers"],
                    &["kubernetes.io/kube-apiserver-client-kubelet", "kubernetes.io/legacy-unknown"],
                ),
                named(
                    &["sign"],
                    &[CERTIFICATES],
                    &["signers"],
                    &[
                        "kubernetes.io/kube-apiserver-client",
                        "kubernetes.io/kube-apiserver-client-kubelet",
                        "kubernetes.io/kubelet-serving",
                        "kubernetes.io/legacy-unknown",
                    ],
                ),
                rule(&["create"], &[AUTHORIZATION], &["subjectaccessreviews"]),
                events_rule(),
            ],
        ),
        (
            "clusterrole-aggregation-controller",
            vec![rule(&["escalate", "get", "list", "watch", "update", "patch"], &[GROUP], &["clusterroles"])],
        ),
        (
            "cronjob-controller",
            vec![
                rule(&["get", "list", "watch", "update"], &[BATCH], &["cronjobs"]),
                rule(&["get", "list", "watch", "create", "update", "delete", "patch"], &[BATCH], &["jobs"]),
                rule(&["update"], &[BATCH], &["cronjobs/status"]),
                rule(&["update"], &[BATCH], &["cronjobs/finalizers"]),
                rule(&["list", "delete"], &[CORE], &["pods"]),
                rule(&["patch"], &[BATCH], &["cronjobs/status"]), // ours: patches its status
                events_rule(),
            ],
        ),
        (
            "daemon-set-controller",
            vec![
                rule(READ, &[EXTENSIONS, APPS], &["daemonsets"]),
                rule(&["update"], &[EXTENSIONS, APPS], &["daemonsets/status"]),
                rule(&["update"], &[EXTENSIONS, APPS], &["daemonsets/finalizers"]),
                rule(&["list", "watch"], &[CORE], &["nodes"]),
                rule(&["list", "watch", "create", "delete", "patch"], &[CORE], &["pods"]),
                rule(&["create"], &[CORE], &["pods/binding"]),
                rule(
                    &["get", "list", "watch", "create", "delete", "update", "patch"],
                    &[APPS],
                    &["controllerrevisions"],
                ),
                rule(&["patch"], &[APPS], &["daemonsets/status"]), // ours: patches its status (and collisionCount)
                events_rule(),
            ],
        ),
        (
            "deployment-controller",
            vec![
                rule(&["get", "list", "watch", "update"], &[EXTENSIONS, APPS], &["deployments"]),
                rule(&["update"], &[EXTENSIONS, APPS], &["deployments/status"]),
                rule(&["update"], &[EXTENSIONS, APPS], &["deployments/finalizers"]),
                rule(
                    &["get", "list", "watch", "create", "update", "patch", "delete"],
                    &[APPS, EXTENSIONS],
                    &["replicasets"],
                ),
                rule(&["get", "list", "watch", "update"], &[CORE], &["pods"]),
                rule(&["patch"], &[APPS], &["deployments"]), // ours: patches the revision annotation
                rule(&["patch"], &[APPS], &["deployments/status"]), // ours: patches its status (and collisionCount)
                events_rule(),
            ],
        ),
        (
            "disruption-controller",
            vec![
                rule(READ, &[EXTENSIONS, APPS], &["deployments"]),
                rule(READ, &[APPS, EXTENSIONS], &["replicasets"]),
                rule(READ, &[CORE], &["replicationcontrollers"]),
                rule(READ, &[POLICY], &["poddisruptionbudgets"]),
                rule(READ, &[APPS], &["statefulsets"]),
                rule(&["update"], &[POLICY], &["poddisruptionbudgets/status"]),
                rule(&["get"], &["*"], &["*/scale"]),
                events_rule(),
            ],
        ),
        (
            "endpoint-controller",
            vec![
                rule(READ, &[CORE], &["services", "pods"]),
                rule(&["get", "list", "create", "update", "delete"], &[CORE], &["endpoints"]),
                rule(&["create"], &[CORE], &["endpoints/restricted"]),
                events_rule(),
            ],
        ),
        (
            "endpointslice-controller",
            vec![
                rule(READ, &[CORE], &["services", "pods", "nodes"]),
                rule(&["update"], &[CORE], &["services/finalizers"]),
                rule(&["get", "list", "create", "update", "delete"], &[DISCOVERY], &["endpointslices"]),
                events_rule(),
            ],
        ),
        (
            "generic-garbage-collector",
            vec![rule(&["get", "list", "watch", "patch", "update", "delete"], &["*"], &["*"]), events_rule()],
        ),
        (
            "horizontal-pod-autoscaler",
            vec![
                rule(&["get", "list", "watch"], &[AUTOSCALING], &["horizontalpodautoscalers"]),
                rule(&["update"], &[AUTOSCALING], &["horizontalpodautoscalers/status"]),
                rule(&["get", "update"], &["*"], &["*/scale"]),
                rule(&["list"], &[CORE], &["pods"]),
                rule(&["list"], &[METRICS], &["pods"]),
                rule(&["get", "list", "watch"], &[CUSTOM_METRICS], &["*"]),
                rule(&["patch"], &["*"], &["*/scale"]), // ours: patches the scale
                rule(&["patch"], &[AUTOSCALING], &["horizontalpodautoscalers/status"]), // ours: patches its status
                events_rule(),
            ],
        ),
        (
            "job-controller",
            vec![
                rule(&["get", "list", "watch", "update", "patch"], &[BATCH], &["jobs"]),
                rule(&["update"], &[BATCH], &["jobs/status"]),
                rule(&["update"], &[BATCH], &["jobs/finalizers"]),
                rule(&["list", "watch", "create", "delete", "patch"], &[CORE], &["pods"]),
                rule(&["patch"], &[BATCH], &["jobs/status"]), // ours: patches its status
                rule(&["delete"], &[BATCH], &["jobs"]), // ours: ttlSecondsAfterFinished (upstream: ttl-after-finished)
                events_rule(),
            ],
        ),
        (
            "namespace-controller",
            vec![
                rule(&["get", "list", "watch", "delete"], &[CORE], &["namespaces"]),
                rule(&["update"], &[CORE], &["namespaces/finalize", "namespaces/status"]),
                rule(&["get", "list", "delete", "deletecollection"], &["*"], &["*"]),
                rule(&["patch"], &[CORE], &["namespaces/status"]), // ours: patches the deletion conditions
            ],
        ),
        (
            // Ours: the controller-manager's opt-in approver of kubelets' serving certificates.
            "kubelet-serving-approver",
            vec![
                rule(&["get", "list", "watch"], &[CERTIFICATES], &["certificatesigningrequests"]),
                rule(&["update"], &[CERTIFICATES], &["certificatesigningrequests/approval"]),
                named(&["approve"], &[CERTIFICATES], &["signers"], &["kubernetes.io/kubelet-serving"]),
                rule(&["get"], &[CORE], &["nodes"]),
                events_rule(),
            ],
        ),
        (
            "node-controller",
            vec![
                rule(&["get", "list", "update", "delete", "patch"], &[CORE], &["nodes"]),
                rule(&["patch", "update"], &[CORE], &["nodes/status"]),
                rule(&["update"], &[CORE], &["pods/status"]),
                rule(&["list", "delete"], &[CORE], &["pods"]),
                events_rule(),
            ],
        ),
        (
            "persistent-volume-binder",
            vec![
                rule(&["get", "list", "watch", "update", "create", "delete"], &[CORE], &["persistentvolumes"]),
                rule(&["update"], &[CORE], &["persistentvolumes/status"]),
                rule(&["get", "list", "watch", "update"], &[CORE], &["persistentvolumeclaims"]),
                rule(&["update"], &[CORE], &["persistentvolumeclaims/status"]),
                rule(&["list", "watch", "get", "create", "delete"], &[CORE], &["pods"]),
                rule(&["watch", "get", "list"], &[STORAGE], &["storageclasses"]),
                // ours: patches the provisioner annotations and the phases
                rule(&["patch"], &[CORE], &["persistentvolumeclaims", "persistentvolumeclaims/status"]),
                rule(&["patch"], &[CORE], &["persistentvolumes/status"]),
                rule(&["create"], &[STORAGE], &["storageclasses"]), // ours: the default StorageClass
                rule(&["get"], &[CORE], &["nodes"]),                // ours: the selected node's labels
                rule(&["create"], &[CORE], &["namespaces"]),        // ours: the local-path helper pod's namespace
                events_rule(),
            ],
        ),
        (
            "pod-garbage-collector",
            vec![
                rule(&["list", "watch", "delete"], &[CORE], &["pods"]),
                rule(&["get", "list", "watch"], &[CORE], &["nodes"]),
                rule(&["patch"], &[CORE], &["pods/status"]),
            ],
        ),
        (
            "pv-protection-controller",
            vec![
                rule(&["get", "list", "watch", "update"], &[CORE], &["persistentvolumes"]),
                rule(&["patch"], &[CORE], &["persistentvolumes"]), // ours: patches the finalizer away
                events_rule(),
            ],
        ),
        (
            "pvc-protection-controller",
            vec![
                rule(&["get", "list", "watch", "update"], &[CORE], &["persistentvolumeclaims"]),
                rule(&["list", "watch", "get"], &[CORE], &["pods"]),
                rule(&["patch"], &[CORE], &["persistentvolumeclaims"]), // ours: patches the finalizer away
                events_rule(),
            ],
        ),
        (
            "replicaset-controller",
            vec![
                rule(&["get", "list", "watch", "update"], &[APPS, EXTENSIONS], &["replicasets"]),
                rule(&["update"], &[APPS, EXTENSIONS], &["replicasets/status"]),
                rule(&["update"], &[APPS, EXTENSIONS], &["replicasets/finalizers"]),
                rule(&["list", "watch", "patch", "create", "delete"], &[CORE], &["pods"]),
                rule(&["patch"], &[APPS], &["replicasets/status"]), // ours: patches its status
                events_rule(),
            ],
        ),
        (
            "root-ca-cert-publisher",
            vec![
                rule(&["create", "update"], &[CORE], &["configmaps"]),
                rule(&["get"], &[CORE], &["configmaps"]), // ours: gets before it writes
                events_rule(),
            ],
        ),
        (
            "service-account-controller",
            vec![
                rule(&["create"], &[CORE], &["serviceaccounts"]),
                rule(&["get"], &[CORE], &["serviceaccounts"]), // ours: gets before it writes
                events_rule(),
            ],
        ),
        (
            "statefulset-controller",
            vec![
                rule(&["list", "watch"], &[CORE], &["pods"]),
                rule(&["get", "list", "watch"], &[APPS], &["statefulsets"]),
                rule(&["update"], &[APPS], &["statefulsets/status"]),
                rule(&["update"], &[APPS], &["statefulsets/finalizers"]),
                rule(&["get", "create", "delete", "update", "patch"], &[CORE], &["pods"]),
                rule(
                    &["get", "create", "delete", "update", "patch", "list", "watch"],
                    &[APPS],
                    &["controllerrevisions"],
                ),
                rule(&["get", "create"], &[CORE], &["persistentvolumeclaims"]),
                rule(&["update", "delete"], &[CORE], &["persistentvolumeclaims"]),
                rule(&["patch"], &[APPS], &["statefulsets/status"]), // ours: patches its status (and collisionCount)
                rule(&["patch"], &[CORE], &["persistentvolumeclaims"]), // ours: patches claims' ownerReferences
                events_rule(),
            ],
        ),
    ]
}

/// The bootstrap ClusterRoles (with the bootstrapping label and the autoupdate annotation).
pub fn cluster_roles() -> Vec<ClusterRole> {
    let mut roles = vec![
        role("cluster-admin", vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])]),
        role(
            "system:discovery",
            vec![urls(
                &["get"],
                &[
                    "/livez",
                    "/readyz",
                    "/healthz",
                    "/version",
                    "/version/",
                    "/openapi",
                    "/openapi/*",
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                ],
            )],
        ),
        role(
            "system:monitoring",
            vec![urls(
                &["get"],
                &["/metrics", "/metrics/slis", "/livez", "/readyz", "/healthz", "/livez/*", "/readyz/*", "/healthz/*"],
            )],
        ),
        role(
            "system:basic-user",
            vec![
                rule(&["create"], &[AUTHORIZATION], &["selfsubjectaccessreviews", "selfsubjectrulesreviews"]),
                rule(&["create"], &[AUTHENTICATION], &["selfsubjectreviews"]),
            ],
        ),
        role(
            "system:public-info-viewer",
            vec![urls(&["get"], &["/livez", "/readyz", "/healthz", "/version", "/version/"])],
        ),
        aggregated("admin", "admin"),
        labelled(aggregated("edit", "edit"), "rbac.authorization.k8s.io/aggregate-to-admin"),
        labelled(aggregated("view", "view"), "rbac.authorization.k8s.io/aggregate-to-edit"),
        labelled(
            role(
                "system:aggregate-to-admin",
                vec![
                    rule(&["create"], &[AUTHORIZATION], &["localsubjectaccessreviews"]),
                    rule(READ_WRITE, &[GROUP], &["roles", "rolebindings"]),
                ],
            ),
            "rbac.authorization.k8s.io/aggregate-to-admin",
        ),
        labelled(
            role(
                "system:aggregate-to-edit",
                vec![
                    rule(
                        READ,
                        &[CORE],
                        &["pods/attach", "pods/proxy", "pods/exec", "pods/portforward", "secrets", "services/proxy"],
                    ),
                    rule(&["impersonate"], &[CORE], &["serviceaccounts"]),
                    rule(WRITE, &[CORE], &["pods", "pods/attach", "pods/proxy", "pods/exec", "pods/portforward"]),
                    rule(&["create"], &[CORE], &["pods/eviction"]),
                    rule(
                        WRITE,
                        &[CORE],
                        &[
                            "replicationcontrollers",
                            "replicationcontrollers/scale",
                            "serviceaccounts",
                            "services",
                            "services/proxy",
                            "persistentvolumeclaims",
                            "configmaps",
                            "secrets",
                            "events",
                        ],
                    ),
                    rule(&["create"], &[CORE], &["serviceaccounts/token"]),
                    rule(
                        WRITE,
                        &[APPS],
                        &[
                            "statefulsets",
                            "statefulsets/scale",
                            "daemonsets",
                            "deployments",
                            "deployments/scale",
                            "deployments/rollback",
                            "replicasets",
                            "replicasets/scale",
                        ],
                    ),
                    rule(WRITE, &[AUTOSCALING], &["horizontalpodautoscalers"]),
                    rule(WRITE, &[BATCH], &["jobs", "cronjobs"]),
                    rule(
                        WRITE,
                        &[EXTENSIONS],
                        &[
                            "daemonsets",
                            "deployments",
                            "deployments/scale",
                            "deployments/rollback",
                            "ingresses",
                            "replicasets",
                            "replicasets/scale",
                            "replicationcontrollers/scale",
                            "networkpolicies",
                        ],
                    ),
                    rule(WRITE, &[POLICY], &["poddisruptionbudgets"]),
                    rule(WRITE, &[NETWORKING], &["networkpolicies", "ingresses"]),
                    rule(READ_WRITE, &[COORDINATION], &["leases"]),
                ],
            ),
            "rbac.authorization.k8s.io/aggregate-to-edit",
        ),
        labelled(
            role(
                "system:aggregate-to-view",
                vec![
                    rule(
                        READ,
                        &[CORE],
                        &[
                            "pods",
                            "replicationcontrollers",
                            "replicationcontrollers/scale",
                            "serviceaccounts",
                            "services",
                            "services/status",
                            "endpoints",
                            "persistentvolumeclaims",
                            "persistentvolumeclaims/status",
                            "configmaps",
                        ],
                    ),
                    rule(
                        READ,
                        &[CORE],
                        &[
                            "limitranges",
                            "resourcequotas",
                            "bindings",
                            "events",
                            "pods/status",
                            "resourcequotas/status",
                            "namespaces/status",
                            "replicationcontrollers/status",
                            "pods/log",
                        ],
                    ),
                    rule(READ, &[CORE], &["namespaces"]),
                    rule(READ, &[DISCOVERY], &["endpointslices"]),
                    rule(
                        READ,
                        &[APPS],
                        &[
                            "controllerrevisions",
                            "statefulsets",
                            "statefulsets/status",
                            "statefulsets/scale",
                            "daemonsets",
                            "daemonsets/status",
                            "deployments",
                            "deployments/status",
                            "deployments/scale",
                            "replicasets",
                            "replicasets/status",
                            "replicasets/scale",
                        ],
                    ),
                    rule(READ, &[AUTOSCALING], &["horizontalpodautoscalers", "horizontalpodautoscalers/status"]),
                    rule(READ, &[BATCH], &["jobs", "cronjobs", "cronjobs/status", "jobs/status"]),
                    rule(
                        READ,
                        &[EXTENSIONS],
                        &[
                            "daemonsets",
                            "daemonsets/status",
                            "deployments",
                            "deployments/scale",
                            "deployments/status",
                            "ingresses",
                            "ingresses/status",
                            "replicasets",
                            "replicasets/scale",
                            "replicasets/status",
                            "replicationcontrollers/scale",
                            "networkpolicies",
                        ],
                    ),
                    rule(READ, &[POLICY], &["poddisruptionbudgets", "poddisruptionbudgets/status"]),
                    rule(READ, &[NETWORKING], &["networkpolicies", "ingresses", "ingresses/status"]),
                ],
            ),
            "rbac.authorization.k8s.io/aggregate-to-view",
        ),
        role("system:node", node_rules()),
        // MiniK8s' kubeproxy also serves the cluster DNS and the Ingresses (what CoreDNS's and
        // an ingress controller's roles grant), publishes the DNS Service and its slices, and
        // enforces NetworkPolicies (what a network policy agent's role grants).
        role(
            "system:minik8s:kubeproxy",
            vec![
                rule(&["list", "watch"], &[NETWORKING], &["ingresses", "ingressclasses", "networkpolicies"]),
                rule(&["list", "watch"], &[CORE], &["pods", "namespaces"]),
                rule(&["update", "patch"], &[NETWORKING], &["ingresses/status"]),
                rule(&["get", "create"], &[CORE], &["services"]),
                rule(&["get", "create", "patch", "update", "delete"], &[DISCOVERY], &["endpointslices"]),
            ],
        ),
        // Joining nodes (bootstrap tokens) ask for their certificates.
        role(
            "system:node-bootstrapper",
            vec![rule(&["create", "get", "list", "watch"], &[CERTIFICATES], &["certificatesigningrequests"])],
        ),
        // Whom csrapproving approves a kubelet client certificate for: a requester allowed
        // `create` on `nodeclient` (a new node), or on `selfnodeclient` (a node renewing its own).
        role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            vec![rule(&["create"], &[CERTIFICATES], &["certificatesigningrequests/nodeclient"])],
        ),
        role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            vec![rule(&["create"], &[CERTIFICATES], &["certificatesigningrequests/selfnodeclient"])],
        ),
        role(
            "system:certificates.k8s.io:kube-apiserver-client-approver",
            vec![named(&["approve"], &[CERTIFICATES], &["signers"], &["kubernetes.io/kube-apiserver-client"])],
        ),
        role(
            "system:certificates.k8s.io:kube-apiserver-client-kubelet-approver",
            vec![named(&["approve"], &[CERTIFICATES], &["signers"], &["kubernetes.io/kube-apiserver-client-kubelet"])],
        ),
        role(
            "system:certificates.k8s.io:kubelet-serving-approver",
            vec![named(&["approve"], &[CERTIFICATES], &["signers"], &["kubernetes.io/kubelet-serving"])],
        ),
        // What the apiserver's kubelet client identity needs on kubelets (Kubernetes binds
        // it to that user; ours is in system:masters as kubeadm's was).
        role(
            "system:kubelet-api-admin",
            vec![
                rule(&["get", "list", "watch"], &[CORE], &["nodes"]),
                rule(&["proxy"], &[CORE], &["nodes"]),
                rule(&["*"], &[CORE], &["nodes/proxy", "nodes/log", "nodes/stats", "nodes/metrics"]),
            ],
        ),
        role(
            "system:node-proxier",
            vec![
                rule(&["list", "watch"], &[CORE], &["services", "endpoints"]),
                rule(&["get", "list", "watch"], &[CORE], &["nodes"]),
                events_rule(),
                rule(&["list", "watch"], &[DISCOVERY], &["endpointslices"]),
            ],
        ),
        role(
            "system:kube-controller-manager",
            vec![
                events_rule(),
                rule(&["create"], &[COORDINATION], &["leases"]),
                named(&["get", "update"], &[COORDINATION], &["leases"], &["kube-controller-manager"]),
                rule(&["create"], &[CORE], &["secrets", "serviceaccounts"]),
                rule(&["delete"], &[CORE], &["secrets"]),
                rule(&["get"], &[CORE], &["namespaces", "secrets", "serviceaccounts", "configmaps"]),
                rule(&["update"], &[CORE], &["secrets", "serviceaccounts"]),
                rule(&["create"], &[AUTHENTICATION], &["tokenreviews"]),
                rule(&["create"], &[AUTHORIZATION], &["subjectaccessreviews"]),
                rule(&["list", "watch"], &["*"], &["*"]),
                rule(&["create"], &[CORE], &["serviceaccounts/token"]),
            ],
        ),
        // The cloud-controller-manager's identity (the role cloud providers ship beside
        // their controller; ours ships with the cluster): Services and their status for
        // load balancers, Nodes for initialization and routes, its Lease, events.
        role(
            "system:cloud-controller-manager",
            vec![
                events_rule(),
                rule(&["create"], &[COORDINATION], &["leases"]),
                named(&["get", "update"], &[COORDINATION], &["leases"], &["cloud-controller-manager"]),
                rule(&["get", "list", "watch", "patch", "update"], &[CORE], &["services", "nodes"]),
                rule(&["patch", "update"], &[CORE], &["services/status", "nodes/status"]),
                rule(&["list", "watch"], &[DISCOVERY], &["endpointslices"]),
            ],
        ),
        role("system:kube-dns", vec![rule(&["list", "watch"], &[CORE], &["endpoints", "services"])]),
        role(
            "system:kube-scheduler",
            vec![
                events_rule(),
                rule(&["create"], &[COORDINATION], &["leases"]),
                named(&["get", "update", "list", "watch"], &[COORDINATION], &["leases"], &["kube-scheduler"]),
                rule(READ, &[CORE], &["nodes"]),
                rule(&["get", "list", "watch", "delete"], &[CORE], &["pods"]),
                rule(&["create"], &[CORE], &["pods/binding", "bindings"]),
                rule(&["patch", "update"], &[CORE], &["pods/status"]),
                rule(READ, &[CORE], &["services", "replicationcontrollers"]),
                rule(READ, &[APPS, EXTENSIONS], &["replicasets"]),
                rule(READ, &[APPS], &["statefulsets"]),
                rule(READ, &[POLICY], &["poddisruptionbudgets"]),
                rule(READ, &[CORE], &["persistentvolumeclaims", "persistentvolumes"]),
                rule(&["create"], &[AUTHENTICATION], &["tokenreviews"]),
                rule(&["create"], &[AUTHORIZATION], &["subjectaccessreviews"]),
                rule(READ, &[CORE], &["namespaces"]),
            ],
        ),
        role(
            "system:volume-scheduler",
            vec![
                rule(READ_UPDATE, &[CORE], &["persistentvolumes"]),
                rule(READ, &[STORAGE], &["storageclasses"]),
                rule(READ_UPDATE, &[CORE], &["persistentvolumeclaims"]),
            ],
        ),
        role(
            "system:auth-delegator",
            vec![
                rule(&["create"], &[AUTHENTICATION], &["tokenreviews"]),
                rule(&["create"], &[AUTHORIZATION], &["subjectaccessreviews"]),
            ],
        ),
    ];
    for (name, rules) in controller_roles() {
        roles.push(role(&format!("system:controller:{name}"), rules));
    }
    for r in &mut roles {
        add_default_metadata(&mut r.metadata);
    }
    roles
}

fn add_default_metadata(m: &mut ObjectMeta) {
    m.labels.get_or_insert_with(BTreeMap::new).insert(BOOTSTRAPPING_LABEL.0.into(), BOOTSTRAPPING_LABEL.1.into());
    m.annotations.get_or_insert_with(BTreeMap::new).insert(AUTOUPDATE.into(), "true".into());
}

fn subject(kind: &str, name: &str, namespace: Option<&str>) -> Subject {
    Subject {
        kind: kind.into(),
        name: name.into(),
        namespace: namespace.map(Into::into),
        api_group: (kind != "ServiceAccount").then(|| GROUP.into()),
    }
}

fn binding(role: &str, subjects: Vec<Subject>) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: ObjectMeta { name: Some(role.into()), ..Default::default() },
        role_ref: RoleRef { api_group: Some(GROUP.into()), kind: "ClusterRole".into(), name: role.into() },
        subjects: Some(subjects),
    }
}

fn groups(names: &[&str]) -> Vec<Subject> {
    names.iter().map(|g| subject("Group", g, None)).collect()
}

/// The bootstrap ClusterRoleBindings.
pub fn cluster_role_bindings() -> Vec<ClusterRoleBinding> {
    let mut out = vec![
        binding("cluster-admin", groups(&["system:masters"])),
        binding("system:monitoring", groups(&["system:monitoring"])),
        binding("system:discovery", groups(&["system:authenticated"])),
        binding("system:basic-user", groups(&["system:authenticated"])),
        binding("system:public-info-viewer", groups(&["system:authenticated", "system:unauthenticated"])),
        binding("system:node-proxier", vec![subject("User", "system:kube-proxy", None)]),
        binding("system:minik8s:kubeproxy", vec![subject("User", "system:kube-proxy", None)]),
        binding("system:kube-controller-manager", vec![subject("User", "system:kube-controller-manager", None)]),
        binding("system:cloud-controller-manager", vec![subject("User", "system:cloud-controller-manager", None)]),
        binding("system:kube-dns", vec![subject("ServiceAccount", "kube-dns", Some("kube-system"))]),
        binding("system:kube-scheduler", vec![subject("User", "system:kube-scheduler", None)]),
        binding("system:volume-scheduler", vec![subject("User", "system:kube-scheduler", None)]),
        // Kept without subjects: nodes are authorized by the Node authorizer.
        binding("system:node", vec![]),
    ];
    for (name, _) in controller_roles() {
        let mut b =
            binding(&format!("system:controller:{name}"), vec![subject("ServiceAccount", name, Some("kube-system"))]);
        b.metadata.name = Some(format!("system:controller:{name}"));
        out.push(b);
    }
    for b in &mut out {
        add_default_metadata(&mut b.metadata);
    }
    out
}

fn autoupdate(m: &ObjectMeta) -> bool {
    m.annotations.as_ref().and_then(|a| a.get(AUTOUPDATE)).is_none_or(|v| v != "false")
}

/// Existing labels and annotations win; expected ones are added.
fn merge_meta(existing: &ObjectMeta, expected: &ObjectMeta) -> ObjectMeta {
    let merge = |a: &Option<BTreeMap<String, String>>, b: &Option<BTreeMap<String, String>>| {
        let mut m = b.clone().unwrap_or_default();
        m.extend(a.clone().unwrap_or_default());
        (!m.is_empty()).then_some(m)
    };
    ObjectMeta {
        labels: merge(&existing.labels, &expected.labels),
        annotations: merge(&existing.annotations, &expected.annotations),
        ..existing.clone()
    }
}

/// What a ClusterRole should become: None when the stored one is fine (or must not be
/// touched), else the object to create (`existing` None) or to update.
pub fn reconcile_role(expected: &ClusterRole, existing: Option<&ClusterRole>) -> Option<ClusterRole> {
    let Some(existing) = existing else { return Some(expected.clone()) };
    if !autoupdate(&existing.metadata) {
        return None;
    }
    let mut out = existing.clone();
    out.metadata = merge_meta(&existing.metadata, &expected.metadata);
    let have = existing.rules.clone().unwrap_or_default();
    let missing = escalation::uncovered(&have, expected.rules.as_deref().unwrap_or_default());
    if !missing.is_empty() {
        out.rules = Some(have.into_iter().chain(missing).collect());
    }
    if let Some(want) = &expected.aggregation_rule {
        let mut selectors =
            existing.aggregation_rule.as_ref().and_then(|a| a.cluster_role_selectors.clone()).unwrap_or_default();
        for s in want.cluster_role_selectors.iter().flatten() {
            if !selectors.contains(s) {
                selectors.push(s.clone());
            }
        }
        out.aggregation_rule = Some(AggregationRule { cluster_role_selectors: Some(selectors) });
    }
    (out != *existing).then_some(out)
}

/// What reconciling a ClusterRoleBinding does.
#[derive(Debug, PartialEq)]
pub enum BindingChange {
    Create(ClusterRoleBinding),
    Update(ClusterRoleBinding),
    /// The role reference differs (it cannot change in place): delete, then create.
    Recreate(ClusterRoleBinding),
}

pub fn reconcile_binding(
    expected: &ClusterRoleBinding,
    existing: Option<&ClusterRoleBinding>,
) -> Option<BindingChange> {
    let Some(existing) = existing else { return Some(BindingChange::Create(expected.clone())) };
    if !autoupdate(&existing.metadata) {
        return None;
    }
    let mut out = existing.clone();
    out.metadata = merge_meta(&existing.metadata, &expected.metadata);
    let mut subjects = existing.subjects.clone().unwrap_or_default();
    for s in expected.subjects.iter().flatten() {
        if !subjects.iter().any(|e| e.kind == s.kind && e.name == s.name && e.namespace == s.namespace) {
            subjects.push(s.clone());
        }
    }
    out.subjects = (!subjects.is_empty()).then_some(subjects).or(existing.subjects.clone());
    if existing.role_ref != expected.role_ref {
        out.role_ref = expected.role_ref.clone();
        return Some(BindingChange::Recreate(out));
    }
    (out != *existing).then_some(BindingChange::Update(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(roles: &'a [ClusterRole], name: &str) -> &'a ClusterRole {
        roles.iter().find(|r| r.metadata.name.as_deref() == Some(name)).unwrap()
    }

    #[test]
    fn every_binding_names_a_bootstrap_role_and_names_are_unique() {
        let roles = cluster_roles();
        let mut names: Vec<&str> = roles.iter().filter_map(|r| r.metadata.name.as_deref()).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len());
        for b in cluster_role_bindings() {
            assert!(names.contains(&b.role_ref.name.as_str()), "{}", b.role_ref.name);
            let m = &b.metadata;
            assert_eq!(m.annotations.as_ref().unwrap()[AUTOUPDATE], "true");
        }
        let view = find(&roles, "view");
        assert!(view.rules.is_none() && view.aggregation_rule.is_some());
        assert_eq!(view.metadata.labels.as_ref().unwrap()["rbac.authorization.k8s.io/aggregate-to-edit"], "true");
        assert_eq!(
            find(&roles, "system:aggregate-to-view").metadata.labels.as_ref().unwrap()[BOOTSTRAPPING_LABEL.0],
            "rbac-defaults"
        );
    }

    /// What each controller of the controller-manager does under its own account with
    /// `--use-service-account-credentials` (everything but collection reads and events):
    /// (account, verb, group, resource, subresource).
    const CONTROLLER_CALLS: &[(&str, &str, &str, &str, &str)] = &[
        ("clusterrole-aggregation-controller", "patch", GROUP, "clusterroles", ""),
        ("cronjob-controller", "create", BATCH, "jobs", ""),
        ("cronjob-controller", "delete", BATCH, "jobs", ""),
        ("cronjob-controller", "patch", BATCH, "cronjobs", "status"),
        ("daemon-set-controller", "create", CORE, "pods", ""),
        ("daemon-set-controller", "delete", CORE, "pods", ""),
        ("daemon-set-controller", "patch", CORE, "pods", ""),
        ("daemon-set-controller", "create", APPS, "controllerrevisions", ""),
        ("daemon-set-controller", "get", APPS, "controllerrevisions", ""),
        ("daemon-set-controller", "patch", APPS, "controllerrevisions", ""),
        ("daemon-set-controller", "delete", APPS, "controllerrevisions", ""),
        ("daemon-set-controller", "patch", APPS, "daemonsets", "status"),
        ("deployment-controller", "create", APPS, "replicasets", ""),
        ("deployment-controller", "get", APPS, "replicasets", ""),
        ("deployment-controller", "patch", APPS, "replicasets", ""),
        ("deployment-controller", "delete", APPS, "replicasets", ""),
        ("deployment-controller", "patch", APPS, "deployments", ""),
        ("deployment-controller", "patch", APPS, "deployments", "status"),
        ("disruption-controller", "get", APPS, "replicasets", ""),
        ("disruption-controller", "get", APPS, "deployments", ""),
        ("disruption-controller", "get", APPS, "statefulsets", ""),
        ("disruption-controller", "get", CORE, "replicationcontrollers", ""),
        ("disruption-controller", "update", POLICY, "poddisruptionbudgets", "status"),
        ("endpoint-controller", "get", CORE, "endpoints", ""),
        ("endpoint-controller", "create", CORE, "endpoints", ""),
        ("endpoint-controller", "update", CORE, "endpoints", ""),
        ("endpointslice-controller", "create", DISCOVERY, "endpointslices", ""),
        ("endpointslice-controller", "update", DISCOVERY, "endpointslices", ""),
        ("endpointslice-controller", "delete", DISCOVERY, "endpointslices", ""),
        ("generic-garbage-collector", "get", "example.com", "widgets", ""),
        ("generic-garbage-collector", "patch", APPS, "deployments", ""),
        ("generic-garbage-collector", "delete", CORE, "pods", ""),
        ("horizontal-pod-autoscaler", "get", APPS, "deployments", "scale"),
        ("horizontal-pod-autoscaler", "patch", APPS, "deployments", "scale"),
        ("horizontal-pod-autoscaler", "patch", AUTOSCALING, "horizontalpodautoscalers", "status"),
        ("horizontal-pod-autoscaler", "get", CUSTOM_METRICS, "pods", "requests_per_second"),
        ("job-controller", "create", CORE, "pods", ""),
        ("job-controller", "delete", CORE, "pods", ""),
        ("job-controller", "delete", BATCH, "jobs", ""),
        ("job-controller", "patch", BATCH, "jobs", "status"),
        ("namespace-controller", "delete", "example.com", "widgets", ""),
        ("namespace-controller", "patch", CORE, "namespaces", "status"),
        ("namespace-controller", "update", CORE, "namespaces", "finalize"),
        ("node-controller", "patch", CORE, "nodes", ""),
        ("node-controller", "patch", CORE, "nodes", "status"),
        ("node-controller", "delete", CORE, "pods", ""),
        ("persistent-volume-binder", "get", CORE, "persistentvolumeclaims", ""),
        ("persistent-volume-binder", "patch", CORE, "persistentvolumeclaims", ""),
        ("persistent-volume-binder", "update", CORE, "persistentvolumeclaims", ""),
        ("persistent-volume-binder", "patch", CORE, "persistentvolumeclaims", "status"),
        ("persistent-volume-binder", "get", CORE, "persistentvolumes", ""),
        ("persistent-volume-binder", "create", CORE, "persistentvolumes", ""),
        ("persistent-volume-binder", "update", CORE, "persistentvolumes", ""),
        ("persistent-volume-binder", "delete", CORE, "persistentvolumes", ""),
        ("persistent-volume-binder", "patch", CORE, "persistentvolumes", "status"),
        ("persistent-volume-binder", "create", STORAGE, "storageclasses", ""),
        ("persistent-volume-binder", "get", CORE, "nodes", ""),
        ("persistent-volume-binder", "create", CORE, "namespaces", ""),
        ("persistent-volume-binder", "get", CORE, "pods", ""),
        ("certificate-controller", "create", AUTHORIZATION, "subjectaccessreviews", ""),
        ("certificate-controller", "update", CERTIFICATES, "certificatesigningrequests", "approval"),
        ("certificate-controller", "update", CERTIFICATES, "certificatesigningrequests", "status"),
        ("kubelet-serving-approver", "watch", CERTIFICATES, "certificatesigningrequests", ""),
        ("kubelet-serving-approver", "update", CERTIFICATES, "certificatesigningrequests", "approval"),
        ("kubelet-serving-approver", "approve", CERTIFICATES, "signers", ""),
        ("kubelet-serving-approver", "get", CORE, "nodes", ""),
        ("persistent-volume-binder", "create", CORE, "pods", ""),
        ("persistent-volume-binder", "delete", CORE, "pods", ""),
        ("pod-garbage-collector", "delete", CORE, "pods", ""),
        ("pod-garbage-collector", "get", CORE, "nodes", ""),
        ("pv-protection-controller", "patch", CORE, "persistentvolumes", ""),
        ("pvc-protection-controller", "patch", CORE, "persistentvolumeclaims", ""),
        ("replicaset-controller", "create", CORE, "pods", ""),
        ("replicaset-controller", "patch", CORE, "pods", ""),
        ("replicaset-controller", "delete", CORE, "pods", ""),
        ("replicaset-controller", "patch", APPS, "replicasets", "status"),
        ("root-ca-cert-publisher", "get", CORE, "configmaps", ""),
        ("root-ca-cert-publisher", "create", CORE, "configmaps", ""),
        ("root-ca-cert-publisher", "update", CORE, "configmaps", ""),
        ("service-account-controller", "get", CORE, "serviceaccounts", ""),
        ("service-account-controller", "create", CORE, "serviceaccounts", ""),
        ("statefulset-controller", "create", CORE, "pods", ""),
        ("statefulset-controller", "patch", CORE, "pods", ""),
        ("statefulset-controller", "delete", CORE, "pods", ""),
        ("statefulset-controller", "create", CORE, "persistentvolumeclaims", ""),
        ("statefulset-controller", "patch", CORE, "persistentvolumeclaims", ""),
        ("statefulset-controller", "create", APPS, "controllerrevisions", ""),
        ("statefulset-controller", "get", APPS, "controllerrevisions", ""),
        ("statefulset-controller", "patch", APPS, "controllerrevisions", ""),
        ("statefulset-controller", "delete", APPS, "controllerrevisions", ""),
        ("statefulset-controller", "patch", APPS, "statefulsets", "status"),
    ];

    #[test]
    fn every_controller_account_may_do_what_its_controller_does() {
        use super::super::rbac::{api_group_matches, resource_matches, verb_matches};
        let roles: BTreeMap<&str, Vec<PolicyRule>> = controller_roles().into_iter().collect();
        for (account, verb, group, resource, sub) in CONTROLLER_CALLS {
            let rules = roles.get(account).unwrap_or_else(|| panic!("no role for {account}"));
            assert!(
                rules.iter().any(|r| verb_matches(r, verb)
                    && api_group_matches(r, group)
                    && resource_matches(r, resource, sub)),
                "{account} cannot {verb} {group}/{resource}/{sub}"
            );
        }
        // Every account `credentials::service_account` (controller-manager) names.
        let mut accounts: Vec<&str> = CONTROLLER_CALLS.iter().map(|c| c.0).collect();
        accounts.sort();
        accounts.dedup();
        let mut have: Vec<&str> = roles.keys().copied().collect();
        have.sort();
        assert_eq!(accounts, have);
    }

    #[test]
    fn reconciling_adds_what_is_missing_and_keeps_what_users_added() {
        let expected = find(&cluster_roles(), "system:basic-user").clone();
        assert_eq!(reconcile_role(&expected, None), Some(expected.clone()));
        assert_eq!(reconcile_role(&expected, Some(&expected)), None);
        let mut trimmed = expected.clone();
        let user_rule = rule(&["get"], &[""], &["pods"]);
        trimmed.rules = Some(vec![user_rule.clone()]);
        trimmed.metadata.labels.get_or_insert_with(BTreeMap::new).insert("mine".into(), "x".into());
        let out = reconcile_role(&expected, Some(&trimmed)).unwrap();
        let rules = out.rules.unwrap();
        assert_eq!(rules[0], user_rule);
        assert_eq!(rules.len(), 4, "the user's rule and the three broken-down missing ones: {rules:?}");
        assert_eq!(out.metadata.labels.unwrap()["mine"], "x");
        let mut frozen = trimmed.clone();
        frozen.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(AUTOUPDATE.into(), "false".into());
        assert_eq!(reconcile_role(&expected, Some(&frozen)), None);
    }

    #[test]
    fn reconciling_bindings_adds_subjects_and_recreates_on_a_new_role() {
        let expected = cluster_role_bindings()
            .into_iter()
            .find(|b| b.metadata.name.as_deref() == Some("system:public-info-viewer"))
            .unwrap();
        let mut existing = expected.clone();
        existing.subjects = Some(vec![subject("User", "extra", None), subject("Group", "system:authenticated", None)]);
        match reconcile_binding(&expected, Some(&existing)) {
            Some(BindingChange::Update(b)) => {
                let names: Vec<&str> = b.subjects.iter().flatten().map(|s| s.name.as_str()).collect();
                assert_eq!(names, ["extra", "system:authenticated", "system:unauthenticated"]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(reconcile_binding(&expected, Some(&expected)), None);
        let mut moved = expected.clone();
        moved.role_ref.name = "other".into();
        assert!(matches!(reconcile_binding(&expected, Some(&moved)), Some(BindingChange::Recreate(_))));
    }
}
