//! The model layer: a load balancer as this controller wants it (the *local* model, built
//! from a Service and the nodes) and as the provider has it (the *remote* model, read back
//! from the provider), the provider calls that turn one into the other ([`diff`]), and the
//! hash of the Service fields the model depends on ([`spec_hash`]). All pure.

use std::collections::BTreeSet;
use std::fmt;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Node, Service};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The finalizer that keeps a Service until its load balancer is gone (Kubernetes' own).
pub const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// The annotation holding [`spec_hash`] of the Service as last applied.
pub const HASH_ANNOTATION: &str = "loadbalancer.minik8s.io/spec-hash";
/// Annotations with these prefixes are the provider's settings and part of the hash.
pub const PROVIDER_ANNOTATION_PREFIXES: &[&str] = &["loadbalancer.minik8s.io/", "service.beta.kubernetes.io/"];
/// Nodes with this label are never a load balancer's backends (Kubernetes' label).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// One listener: what the load balancer accepts (`port`/`protocol`) and where it sends it
/// on the backends (`node_port`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Listener {
    pub port: i32,
    pub protocol: String,
    #[serde(default, rename = "nodePort")]
    pub node_port: i32,
}

impl Listener {
    /// What identifies a listener on the provider: its port and protocol.
    pub fn key(&self) -> (i32, &str) {
        (self.port, &self.protocol)
    }
}

impl fmt::Display for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.port, self.protocol)
    }
}

/// The local model: the load balancer a Service asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBalancer {
    /// The provider's name for it: `a` and the Service's UID without dashes, at most 32
    /// characters (Kubernetes' `GetLoadBalancerName`), so a restarted controller finds it again.
    pub name: String,
    /// `namespace/name` of the Service, for the provider's descriptions and messages.
    pub service: String,
    pub class: Option<String>,
    pub requested_ip: Option<Ipv4Addr>,
    pub listeners: BTreeSet<Listener>,
    /// Names of the nodes that receive its traffic.
    pub backends: BTreeSet<String>,
    /// `spec.healthCheckNodePort` (`externalTrafficPolicy: Local`): the port on which each
    /// node says whether it has local endpoints.
    pub health_check_node_port: Option<i32>,
}

/// The remote model: a load balancer as the provider has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Remote {
    pub name: String,
    pub service: String,
    #[serde(default)]
    pub class: Option<String>,
    pub address: Ipv4Addr,
    #[serde(default)]
    pub listeners: BTreeSet<Listener>,
    #[serde(default)]
    pub backends: BTreeSet<String>,
    #[serde(default)]
    pub health_check_node_port: Option<i32>,
}

impl Remote {
    /// A new, empty load balancer for `lb` at `address`.
    pub fn empty(lb: &LoadBalancer, address: Ipv4Addr) -> Remote {
        Remote {
            name: lb.name.clone(),
            service: lb.service.clone(),
            class: lb.class.clone(),
            address,
            listeners: BTreeSet::new(),
            backends: BTreeSet::new(),
            health_check_node_port: None,
        }
    }
}

/// One provider call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Allocate the address and create an empty load balancer.
    Create,
    /// Delete the load balancer and release its address.
    Delete,
    AddListener(Listener),
    UpdateListener(Listener),
    DeleteListener(Listener),
    SetBackends(BTreeSet<String>),
    SetHealthCheck(Option<i32>),
}

/// The provider name of the load balancer of the Service with this UID.
pub fn load_balancer_name(uid: &str) -> String {
    let mut name: String = format!("a{}", uid.replace('-', ""));
    name.truncate(32);
    name
}

/// Whether a Service asks for a load balancer at all.
pub fn wants_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

/// The nodes that may be backends: not being deleted and not excluded by label.
pub fn eligible_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> BTreeSet<String> {
    nodes
        .into_iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .filter(|n| n.metadata.labels.as_ref().is_none_or(|l| !l.contains_key(EXCLUDE_LABEL)))
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

/// Why a Service cannot be modelled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("spec.loadBalancerIP {0:?} is not an IPv4 address")]
    BadRequestedIp(String),
    #[error("the Service has no UID yet")]
    NoUid,
}

/// The local model of a `type: LoadBalancer` Service over `backends`.
pub fn local_model(svc: &Service, backends: &BTreeSet<String>) -> Result<LoadBalancer, ModelError> {
    let uid = svc.metadata.uid.as_deref().filter(|u| !u.is_empty()).ok_or(ModelError::NoUid)?;
    let spec = svc.spec.clone().unwrap_or_default();
    let requested_ip = match spec.load_balancer_ip.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Some(s.parse().map_err(|_| ModelError::BadRequestedIp(s.to_string()))?),
        None => None,
    };
    let listeners = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| Listener {
            port: p.port,
            protocol: p.protocol.unwrap_or_else(|| "TCP".into()),
            node_port: p.node_port.unwrap_or(0),
        })
        .collect();
    let local = spec.external_traffic_policy.as_deref() == Some("Local");
    Ok(LoadBalancer {
        name: load_balancer_name(uid),
        service: key(svc),
        class: spec.load_balancer_class.filter(|c| !c.is_empty()),
        requested_ip,
        listeners,
        backends: backends.clone(),
        health_check_node_port: spec.health_check_node_port.filter(|p| local && *p > 0),
    })
}

/// `namespace/name`.
pub fn key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The provider calls that make `remote` what `local` describes, in order: a load balancer
/// whose address differs from the requested one is made again; listeners are keyed by port
/// and protocol (a changed node port is an update).
pub fn diff(local: &LoadBalancer, remote: Option<&Remote>) -> Vec<Op> {
    let mut ops = Vec::new();
    let remote = match remote {
        Some(r) if local.requested_ip.is_some_and(|ip| ip != r.address) => {
            ops.push(Op::Delete);
            ops.push(Op::Create);
            None
        }
        Some(r) => Some(r),
        None => {
            ops.push(Op::Create);
            None
        }
    };
    let empty = BTreeSet::new();
    let have = remote.map_or(&empty, |r| &r.listeners);
    for l in have {
        if !local.listeners.iter().any(|w| w.key() == l.key()) {
            ops.push(Op::DeleteListener(l.clone()));
        }
    }
    for l in &local.listeners {
        match have.iter().find(|h| h.key() == l.key()) {
            None => ops.push(Op::AddListener(l.clone())),
            Some(h) if h != l => ops.push(Op::UpdateListener(l.clone())),
            Some(_) => {}
        }
    }
    if remote.is_none_or(|r| r.backends != local.backends) {
        ops.push(Op::SetBackends(local.backends.clone()));
    }
    if remote
        .map_or(local.health_check_node_port.is_some(), |r| r.health_check_node_port != local.health_check_node_port)
    {
        ops.push(Op::SetHealthCheck(local.health_check_node_port));
    }
    ops
}

/// What the hash covers: the fields the load balancer depends on. Empty and zero values are
/// left out, so a field added later (absent on every existing Service) changes no hash.
#[derive(Serialize)]
struct Hashed<'a> {
    #[serde(rename = "type", skip_serializing_if = "str::is_empty")]
    type_: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ports: Vec<(String, String, i32, i32)>,
    #[serde(skip_serializing_if = "str::is_empty")]
    external_traffic_policy: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    health_check_node_port: i32,
    #[serde(skip_serializing_if = "str::is_empty")]
    load_balancer_class: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    load_balancer_ip: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    annotations: Vec<(&'a str, &'a str)>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    deleting: bool,
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    backends: &'a BTreeSet<String>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// A hash of what the load balancer depends on: type, ports, traffic policy, health check
/// port, class, requested address, the provider's annotations (never [`HASH_ANNOTATION`]
/// itself), deletion, and the backend nodes. Stable across releases (SHA-256 of JSON).
pub fn spec_hash(svc: &Service, backends: &BTreeSet<String>) -> String {
    let spec = svc.spec.clone().unwrap_or_default();
    let mut ports: Vec<(String, String, i32, i32)> = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            (p.name.unwrap_or_default(), p.protocol.unwrap_or_else(|| "TCP".into()), p.port, p.node_port.unwrap_or(0))
        })
        .collect();
    ports.sort();
    let empty = Default::default();
    let annotations: Vec<(&str, &str)> = svc
        .metadata
        .annotations
        .as_ref()
        .unwrap_or(&empty)
        .iter()
        .filter(|(k, v)| {
            k.as_str() != HASH_ANNOTATION
                && !v.is_empty()
                && PROVIDER_ANNOTATION_PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let hashed = Hashed {
        type_: spec.type_.as_deref().unwrap_or_default(),
        ports,
        external_traffic_policy: spec.external_traffic_policy.as_deref().unwrap_or_default(),
        health_check_node_port: spec.health_check_node_port.unwrap_or(0),
        load_balancer_class: spec.load_balancer_class.as_deref().unwrap_or_default(),
        load_balancer_ip: spec.load_balancer_ip.as_deref().unwrap_or_default(),
        annotations,
        deleting: svc.metadata.deletion_timestamp.is_some(),
        backends,
    };
    let json = serde_json::to_vec(&hashed).unwrap_or_default();
    let digest = Sha256::digest(&json);
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub fn service(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn web() -> Service {
        service(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "0b1c2d3e-1111-2222-3333-444455556666"},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Cluster",
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
                               {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]}
        }))
    }

    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_local_model_names_the_balancer_by_uid_and_lists_listeners_and_backends() {
        let lb = local_model(&web(), &nodes(&["n1", "n2"])).unwrap();
        assert_eq!(lb.name, "a0b1c2d3e111122223333444455556666"[..32].to_string());
        assert_eq!(lb.name.len(), 32);
        assert_eq!(lb.service, "default/web");
        let ls: Vec<String> = lb.listeners.iter().map(|l| format!("{l}->{}", l.node_port)).collect();
        assert_eq!(ls, ["53/UDP->30053", "80/TCP->30080"]);
        assert_eq!(lb.backends, nodes(&["n1", "n2"]));
        assert_eq!(lb.health_check_node_port, None);
        let mut bad = web();
        bad.spec.as_mut().unwrap().load_balancer_ip = Some("nope".into());
        assert_eq!(local_model(&bad, &nodes(&[])), Err(ModelError::BadRequestedIp("nope".into())));
    }

    #[test]
    fn the_health_check_port_counts_only_under_the_local_policy() {
        let mut s = web();
        s.spec.as_mut().unwrap().health_check_node_port = Some(31000);
        assert_eq!(local_model(&s, &nodes(&[])).unwrap().health_check_node_port, None);
        s.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
        assert_eq!(local_model(&s, &nodes(&[])).unwrap().health_check_node_port, Some(31000));
    }

    #[test]
    fn diff_creates_then_adds_every_listener_and_sets_backends() {
        let lb = local_model(&web(), &nodes(&["n1"])).unwrap();
        let ops = diff(&lb, None);
        assert_eq!(ops.len(), 4, "{ops:?}");
        assert_eq!(ops[0], Op::Create);
        assert!(matches!(&ops[1], Op::AddListener(l) if l.port == 53));
        assert!(matches!(&ops[2], Op::AddListener(l) if l.port == 80));
        assert_eq!(ops[3], Op::SetBackends(nodes(&["n1"])));
    }

    fn remote_of(lb: &LoadBalancer) -> Remote {
        Remote {
            name: lb.name.clone(),
            service: lb.service.clone(),
            class: lb.class.clone(),
            address: Ipv4Addr::new(203, 0, 113, 10),
            listeners: lb.listeners.clone(),
            backends: lb.backends.clone(),
            health_check_node_port: lb.health_check_node_port,
        }
    }

    #[test]
    fn diff_of_an_applied_balancer_is_empty_and_a_changed_one_names_exactly_the_calls() {
        let lb = local_model(&web(), &nodes(&["n1"])).unwrap();
        let remote = remote_of(&lb);
        assert_eq!(diff(&lb, Some(&remote)), vec![]);

        let mut s = web();
        let ports = s.spec.as_mut().unwrap().ports.as_mut().unwrap();
        ports[0].node_port = Some(30081); // 80/TCP moves to another node port
        ports.remove(1); // 53/UDP goes
        ports.push(serde_json::from_value(json!({"port": 443, "protocol": "TCP", "nodePort": 30443})).unwrap());
        let changed = local_model(&s, &nodes(&["n1", "n2"])).unwrap();
        let ops = diff(&changed, Some(&remote));
        assert_eq!(
            ops,
            vec![
                Op::DeleteListener(Listener { port: 53, protocol: "UDP".into(), node_port: 30053 }),
                Op::UpdateListener(Listener { port: 80, protocol: "TCP".into(), node_port: 30081 }),
                Op::AddListener(Listener { port: 443, protocol: "TCP".into(), node_port: 30443 }),
                Op::SetBackends(nodes(&["n1", "n2"])),
            ]
        );
    }

    #[test]
    fn a_new_requested_address_makes_the_balancer_again() {
        let lb = local_model(&web(), &nodes(&[])).unwrap();
        let remote = remote_of(&lb);
        let mut want = lb.clone();
        want.requested_ip = Some(Ipv4Addr::new(203, 0, 113, 10));
        assert_eq!(diff(&want, Some(&remote)), vec![], "the requested address is the one it has");
        want.requested_ip = Some(Ipv4Addr::new(203, 0, 113, 11));
        let ops = diff(&want, Some(&remote));
        assert_eq!(&ops[..2], &[Op::Delete, Op::Create]);
        assert_eq!(ops.iter().filter(|o| matches!(o, Op::AddListener(_))).count(), 2);
    }

    #[test]
    fn the_hash_follows_what_matters_and_ignores_itself_status_and_zero_values() {
        let n = nodes(&["n1"]);
        let base = spec_hash(&web(), &n);
        assert_eq!(base.len(), 32);
        assert_eq!(spec_hash(&web(), &n), base, "stable");

        let mut s = web();
        s.metadata.annotations = Some([(HASH_ANNOTATION.to_string(), base.clone())].into());
        s.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        s.metadata.resource_version = Some("42".into());
        s.status =
            Some(serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}})).unwrap());
        assert_eq!(spec_hash(&s, &n), base, "the hash annotation, labels, resourceVersion and status are not hashed");
        // Zero values: an explicit 0 or "" is the same as absent.
        s.spec.as_mut().unwrap().health_check_node_port = Some(0);
        s.spec.as_mut().unwrap().load_balancer_class = Some(String::new());
        assert_eq!(spec_hash(&s, &n), base, "zero values are not hashed");

        let changed = |f: &dyn Fn(&mut Service)| {
            let mut s = web();
            f(&mut s);
            spec_hash(&s, &n)
        };
        assert_ne!(changed(&|s| s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81), base);
        assert_ne!(changed(&|s| s.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into())), base);
        assert_ne!(changed(&|s| s.spec.as_mut().unwrap().load_balancer_ip = Some("203.0.113.9".into())), base);
        assert_ne!(changed(&|s| s.spec.as_mut().unwrap().type_ = Some("ClusterIP".into())), base);
        assert_ne!(
            changed(&|s| s.metadata.annotations =
                Some([("loadbalancer.minik8s.io/pool".to_string(), "lab".to_string())].into())),
            base
        );
        assert_ne!(
            changed(&|s| s.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))),
            base
        );
        assert_ne!(spec_hash(&web(), &nodes(&["n1", "n2"])), base, "the backends are hashed");
    }

    #[test]
    fn eligible_nodes_leave_out_excluded_and_deleted_ones() {
        let node = |v: serde_json::Value| -> Node { serde_json::from_value(v).unwrap() };
        let all = [
            node(json!({"metadata": {"name": "a"}})),
            node(json!({"metadata": {"name": "b", "labels": {EXCLUDE_LABEL: ""}}})),
            node(json!({"metadata": {"name": "c", "deletionTimestamp": "2026-01-01T00:00:00Z"}})),
        ];
        assert_eq!(eligible_nodes(&all), nodes(&["a"]));
    }
}
