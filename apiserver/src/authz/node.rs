//! The Node authorizer and NodeRestriction admission (pure over a graph of pods).
//!
//! A kubelet authenticates as `system:node:<name>` in `system:nodes`. It may read the
//! secrets, configmaps and persistentvolumeclaims (and ask tokens for the service accounts)
//! that pods bound to its node reference, and nothing else of those kinds; everything else
//! it needs is Kubernetes' static node rules ([`node_rules`]). NodeRestriction then limits
//! the writes those rules allow: a node changes only its own Node object and only the
//! status of pods bound to it ([`restrict`]). Persistent volumes are not in the graph (a
//! claim's volume is not followed), so a node's read of a PersistentVolume is left to RBAC.

use std::collections::HashMap;
use std::sync::RwLock;

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::Value;

use super::{rbac, Attributes, Decision, User, Verdict};

pub const NODES_GROUP: &str = "system:nodes";

/// The node a user is, if it is one.
pub fn node_name(user: &User) -> Option<&str> {
    let name = user.name.strip_prefix("system:node:")?;
    (!name.is_empty() && user.in_group(NODES_GROUP)).then_some(name)
}

/// Kinds a pod references.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Secret,
    ConfigMap,
    Claim,
    ServiceAccount,
}

type Ref = (Kind, String, String);

/// The node a pod is bound to and every object it references (namespace, name).
pub fn pod_refs(pod: &Value) -> (Option<String>, Vec<Ref>) {
    let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default().to_string();
    let pod_name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let node = pod.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()).map(str::to_string);
    let spec = pod.get("spec").cloned().unwrap_or_default();
    let mut refs: Vec<Ref> = Vec::new();
    let mut add = |k: Kind, v: Option<&Value>| {
        if let Some(n) = v.and_then(Value::as_str).filter(|n| !n.is_empty()) {
            let r = (k, ns.clone(), n.to_string());
            if !refs.contains(&r) {
                refs.push(r);
            }
        }
    };
    add(Kind::ServiceAccount, spec.get("serviceAccountName"));
    for s in spec.get("imagePullSecrets").and_then(Value::as_array).into_iter().flatten() {
        add(Kind::Secret, s.get("name"));
    }
    for v in spec.get("volumes").and_then(Value::as_array).into_iter().flatten() {
        add(Kind::Secret, v.pointer("/secret/secretName"));
        add(Kind::ConfigMap, v.pointer("/configMap/name"));
        add(Kind::Claim, v.pointer("/persistentVolumeClaim/claimName"));
        if v.get("ephemeral").is_some() {
            let claim = format!("{pod_name}-{}", v.get("name").and_then(Value::as_str).unwrap_or_default());
            add(Kind::Claim, Some(&Value::String(claim)));
        }
        for s in v.pointer("/projected/sources").and_then(Value::as_array).into_iter().flatten() {
            add(Kind::Secret, s.pointer("/secret/name"));
            add(Kind::ConfigMap, s.pointer("/configMap/name"));
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in spec.get(list).and_then(Value::as_array).into_iter().flatten() {
            for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
                add(Kind::Secret, e.pointer("/valueFrom/secretKeyRef/name"));
                add(Kind::ConfigMap, e.pointer("/valueFrom/configMapKeyRef/name"));
            }
            for e in c.get("envFrom").and_then(Value::as_array).into_iter().flatten() {
                add(Kind::Secret, e.pointer("/secretRef/name"));
                add(Kind::ConfigMap, e.pointer("/configMapRef/name"));
            }
        }
    }
    (node, refs)
}

/// Which node references what, through which pods.
#[derive(Debug, Default)]
struct Graph {
    pods: HashMap<(String, String), (String, Vec<Ref>)>,
    /// (object, node) → how many of the node's pods reference it.
    edges: HashMap<(Ref, String), usize>,
}

impl Graph {
    fn set_pod(&mut self, ns: &str, name: &str, pod: Option<&Value>) {
        let key = (ns.to_string(), name.to_string());
        if let Some((node, refs)) = self.pods.remove(&key) {
            for r in refs {
                let k = (r, node.clone());
                if let Some(n) = self.edges.get_mut(&k) {
                    *n -= 1;
                    if *n == 0 {
                        self.edges.remove(&k);
                    }
                }
            }
        }
        let Some((Some(node), refs)) = pod.map(pod_refs) else { return };
        for r in &refs {
            *self.edges.entry((r.clone(), node.clone())).or_default() += 1;
        }
        self.pods.insert(key, (node, refs));
    }
}

/// Kubernetes' node rules for the resources served here.
pub fn node_rules() -> Vec<PolicyRule> {
    super::policy::node_rules()
}

/// The Node authorizer.
#[derive(Debug)]
pub struct NodeAuthorizer {
    graph: RwLock<Graph>,
    rules: Vec<PolicyRule>,
}

impl Default for NodeAuthorizer {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeAuthorizer {
    pub fn new() -> Self {
        NodeAuthorizer { graph: RwLock::new(Graph::default()), rules: node_rules() }
    }

    /// A pod was written (`Some`) or deleted (`None`).
    pub fn set_pod(&self, ns: &str, name: &str, pod: Option<&Value>) {
        self.graph.write().unwrap_or_else(|p| p.into_inner()).set_pod(ns, name, pod)
    }

    /// Forget every pod (before a fresh list).
    pub fn clear(&self) {
        *self.graph.write().unwrap_or_else(|p| p.into_inner()) = Graph::default();
    }

    fn related(&self, node: &str, kind: Kind, a: &Attributes) -> Verdict {
        if a.name.is_empty() {
            return no("No Object name found");
        }
        let key = ((kind, a.namespace.clone(), a.name.clone()), node.to_string());
        if self.graph.read().unwrap_or_else(|p| p.into_inner()).edges.contains_key(&key) {
            return Verdict { decision: Decision::Allow, reason: String::new() };
        }
        no(&format!("no relationship found between node '{node}' and this object"))
    }

    pub fn authorize(&self, a: &Attributes, _rbac: &rbac::Rbac) -> Verdict {
        let Some(node) = node_name(&a.user) else { return no("") };
        if a.resource_request && a.api_group.is_empty() {
            let read = matches!(a.verb.as_str(), "get" | "list" | "watch");
            match (a.resource.as_str(), a.subresource.as_str()) {
                ("secrets" | "configmaps", sub) => {
                    let kind = if a.resource == "secrets" { Kind::Secret } else { Kind::ConfigMap };
                    return if !read {
                        no("can only read resources of this type")
                    } else if !sub.is_empty() {
                        no("cannot read subresource")
                    } else if a.namespace.is_empty() {
                        no("can only read namespaced object of this type")
                    } else {
                        self.related(node, kind, a)
                    };
                }
                ("persistentvolumeclaims", "status") => {
                    return if matches!(a.verb.as_str(), "get" | "update" | "patch") {
                        self.related(node, Kind::Claim, a)
                    } else {
                        no("can only get, update or patch status of this type")
                    };
                }
                ("persistentvolumeclaims", sub) => {
                    return if a.verb != "get" {
                        no("can only get individual resources of this type")
                    } else if !sub.is_empty() {
                        no("cannot get subresource")
                    } else {
                        self.related(node, Kind::Claim, a)
                    };
                }
                ("serviceaccounts", "token") => {
                    return if a.verb != "create" {
                        no("can only create tokens for individual service accounts")
                    } else {
                        self.related(node, Kind::ServiceAccount, a)
                    };
                }
                _ => {}
            }
        }
        if self.rules.iter().any(|r| rbac::rule_allows(a, r)) {
            return Verdict { decision: Decision::Allow, reason: String::new() };
        }
        no("")
    }
}

fn no(reason: &str) -> Verdict {
    Verdict { decision: Decision::NoOpinion, reason: reason.into() }
}

/// NodeRestriction: what a node may write of Nodes and Pods (`resource`/`subresource`,
/// `new` the object to store, `old` the stored one on updates). Err is the reason.
pub fn restrict(
    user: &User,
    resource: &str,
    subresource: &str,
    new: &Value,
    old: Option<&Value>,
) -> Result<(), String> {
    let Some(node) = node_name(user) else { return Ok(()) };
    let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    match (resource, subresource) {
        ("nodes", _) => {
            if name != node {
                return Err(format!("node {node:?} is not allowed to modify node {name:?}"));
            }
            Ok(())
        }
        ("pods", "status") => {
            let bound = old.unwrap_or(new).pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default();
            if bound != node {
                return Err(format!(
                    "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
                ));
            }
            Ok(())
        }
        ("pods", "") => {
            let mirror = new.pointer("/metadata/annotations/kubernetes.io~1config.mirror").is_some();
            if old.is_none() && !mirror {
                return Err(format!(
                    "pod does not have \"kubernetes.io/config.mirror\" annotation, node {node:?} can only create mirror pods"
                ));
            }
            let bound = new.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default();
            if bound != node {
                return Err(format!("node {node:?} can only create pods with spec.nodeName set to itself"));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str) -> User {
        User { name: format!("system:node:{name}"), uid: String::new(), groups: vec![NODES_GROUP.into()] }
    }

    fn get(u: &User, resource: &str, ns: &str, name: &str) -> Attributes {
        Attributes::resource(u, "get", "", resource, ns, name)
    }

    fn pod(node: &str) -> Value {
        json!({"metadata": {"namespace": "team", "name": "web"}, "spec": {"nodeName": node,
            "serviceAccountName": "robot",
            "volumes": [{"name": "s", "secret": {"secretName": "tls"}}, {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                        {"name": "p", "projected": {"sources": [{"configMap": {"name": "cfg"}}]}}],
            "containers": [{"name": "c", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}}],
                            "envFrom": [{"configMapRef": {"name": "env-cm"}}]}]}})
    }

    #[test]
    fn a_pod_references_its_secrets_configmaps_claims_and_account() {
        let (n, refs) = pod_refs(&pod("n1"));
        assert_eq!(n.as_deref(), Some("n1"));
        let names: Vec<&str> = refs.iter().map(|r| r.2.as_str()).collect();
        assert_eq!(names, ["robot", "tls", "data", "cfg", "env-secret", "env-cm"]);
    }

    #[test]
    fn nodes_read_only_what_their_pods_use() {
        let authz = NodeAuthorizer::new();
        let rbac = rbac::Rbac::new();
        authz.set_pod("team", "web", Some(&pod("n1")));
        let n1 = node("n1");
        assert_eq!(authz.authorize(&get(&n1, "secrets", "team", "tls"), &rbac).decision, Decision::Allow);
        assert_eq!(authz.authorize(&get(&n1, "configmaps", "team", "env-cm"), &rbac).decision, Decision::Allow);
        assert_eq!(
            authz.authorize(&get(&n1, "persistentvolumeclaims", "team", "data"), &rbac).decision,
            Decision::Allow
        );
        let v = authz.authorize(&get(&node("n2"), "secrets", "team", "tls"), &rbac);
        assert_eq!(v, no("no relationship found between node 'n2' and this object"));
        let v = authz.authorize(&Attributes::resource(&n1, "update", "", "secrets", "team", "tls"), &rbac);
        assert_eq!(v, no("can only read resources of this type"));
        // The pod moves away, and with it the access.
        authz.set_pod("team", "web", Some(&pod("n2")));
        assert_eq!(authz.authorize(&get(&n1, "secrets", "team", "tls"), &rbac).decision, Decision::NoOpinion);
        authz.set_pod("team", "web", None);
        assert_eq!(authz.authorize(&get(&node("n2"), "secrets", "team", "tls"), &rbac).decision, Decision::NoOpinion);
        // The static rules: nodes, pods, leases; not users.
        assert_eq!(authz.authorize(&get(&n1, "nodes", "", "n2"), &rbac).decision, Decision::Allow);
        let lease = Attributes::resource(&n1, "update", "coordination.k8s.io", "leases", "kube-node-lease", "n1");
        assert_eq!(authz.authorize(&lease, &rbac).decision, Decision::Allow);
        let jane = User { name: "jane".into(), ..Default::default() };
        assert_eq!(authz.authorize(&get(&jane, "secrets", "team", "tls"), &rbac), no(""));
        let not_in_group = User { name: "system:node:n1".into(), ..Default::default() };
        assert_eq!(node_name(&not_in_group), None);
    }

    #[test]
    fn node_restriction_keeps_nodes_to_their_own_objects() {
        let n1 = node("n1");
        assert!(restrict(&n1, "nodes", "", &json!({"metadata": {"name": "n1"}}), None).is_ok());
        assert_eq!(
            restrict(&n1, "nodes", "status", &json!({"metadata": {"name": "n2"}}), None).unwrap_err(),
            r#"node "n1" is not allowed to modify node "n2""#
        );
        assert!(restrict(&n1, "pods", "status", &pod("n1"), Some(&pod("n1"))).is_ok());
        assert_eq!(
            restrict(&n1, "pods", "status", &pod("n1"), Some(&pod("n2"))).unwrap_err(),
            r#"node "n1" can only update pod status for pods with spec.nodeName set to itself"#
        );
        assert!(restrict(&n1, "pods", "", &pod("n1"), None).unwrap_err().contains("can only create mirror pods"));
        let jane = User { name: "jane".into(), ..Default::default() };
        assert!(restrict(&jane, "nodes", "", &json!({"metadata": {"name": "n2"}}), None).is_ok());
    }
}
