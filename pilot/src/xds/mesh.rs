//! The inputs of generation, indexed once per recompute: Services, their endpoints (from
//! EndpointSlices, with the labels of the pods behind them), pods, and the accepted
//! configuration; and a proxy's identity from its xDS `Node`.

use std::collections::{BTreeMap, HashMap};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, Struct};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::model::{Key, MeshConfig, Protocol, ServiceIndex, ServiceInfo, TargetPort};

/// An endpoint's state, as EDS reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Draining,
}

/// One address behind a Service.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointInfo {
    pub ip: String,
    /// The EndpointSlice's ports: name → port number.
    pub ports: BTreeMap<String, u32>,
    pub health: Health,
    /// The pod behind it (none for selector-less Services).
    pub pod: Option<Key>,
}

/// A pod, as far as the mesh cares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub ip: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// The application's container ports (the sidecar's own are left out): number, name.
    pub ports: Vec<(u32, Option<String>)>,
}

impl PodInfo {
    pub fn from_pod(pod: &Pod) -> Option<PodInfo> {
        let name = pod.metadata.name.clone()?;
        let ports = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .filter(|c| c.name != crate::inject::PROXY_CONTAINER)
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
            .filter_map(|p| Some((u32::try_from(p.container_port).ok()?, p.name.clone())))
            .collect();
        Some(PodInfo {
            namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name,
            ip: pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ports,
        })
    }
}

/// Everything generation reads.
#[derive(Clone, Debug, Default)]
pub struct Mesh {
    pub services: ServiceIndex,
    pub config: MeshConfig,
    /// A Service's endpoints, by the Service's namespace and name.
    pub endpoints: HashMap<Key, Vec<EndpointInfo>>,
    pub pods: HashMap<Key, PodInfo>,
}

impl Mesh {
    pub fn build(services: ServiceIndex, config: MeshConfig, slices: &[EndpointSlice], pods: &[Pod]) -> Mesh {
        let pods: HashMap<Key, PodInfo> =
            pods.iter().filter_map(PodInfo::from_pod).map(|p| ((p.namespace.clone(), p.name.clone()), p)).collect();
        let mut endpoints: HashMap<Key, Vec<EndpointInfo>> = HashMap::new();
        for slice in slices {
            if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
                continue;
            }
            let Some(service) = slice.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")) else {
                continue;
            };
            let namespace = slice.metadata.namespace.clone().unwrap_or_else(|| "default".into());
            let ports: BTreeMap<String, u32> = slice
                .ports
                .iter()
                .flatten()
                .filter_map(|p| Some((p.name.clone().unwrap_or_default(), u32::try_from(p.port?).ok()?)))
                .collect();
            let list = endpoints.entry((namespace.clone(), service.clone())).or_default();
            for ep in slice.endpoints.iter().flatten() {
                let c = ep.conditions.as_ref();
                let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
                let ready = c.and_then(|c| c.ready).unwrap_or(true);
                let health = if terminating {
                    Health::Draining
                } else if ready {
                    Health::Healthy
                } else {
                    continue;
                };
                let pod =
                    ep.target_ref.as_ref().filter(|r| r.kind.as_deref() == Some("Pod")).and_then(|r| {
                        Some((r.namespace.clone().unwrap_or_else(|| namespace.clone()), r.name.clone()?))
                    });
                for ip in &ep.addresses {
                    list.push(EndpointInfo { ip: ip.clone(), ports: ports.clone(), health, pod: pod.clone() });
                }
            }
        }
        for list in endpoints.values_mut() {
            list.sort_by(|a, b| a.ip.cmp(&b.ip));
            list.dedup_by(|a, b| a.ip == b.ip && a.ports == b.ports);
        }
        Mesh { services, config, endpoints, pods }
    }

    /// The labels of an endpoint's pod (none without a pod).
    pub fn pod_labels(&self, ep: &EndpointInfo) -> Option<&BTreeMap<String, String>> {
        ep.pod.as_ref().and_then(|k| self.pods.get(k)).map(|p| &p.labels)
    }

    /// The Services that select a pod with these labels in `namespace`.
    pub fn services_of<'a>(
        &'a self,
        namespace: &'a str,
        labels: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a ServiceInfo> + 'a {
        self.services.by_fqdn.values().filter(move |s| {
            s.namespace == namespace
                && s.selector
                    .as_ref()
                    .is_some_and(|sel| !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
        })
    }

    /// The protocol of a pod's container port: the protocol of a Service port targeting it,
    /// or the port's own name's.
    pub fn inbound_protocol(&self, proxy: &Proxy, port: u32, name: Option<&str>) -> Protocol {
        for svc in self.services_of(&proxy.namespace, &proxy.labels) {
            for p in &svc.ports {
                let targets = match &p.target {
                    TargetPort::Number(n) => *n == port,
                    TargetPort::Name(n) => Some(n.as_str()) == name,
                };
                if targets {
                    return p.protocol;
                }
            }
        }
        Protocol::of(name, None)
    }
}

/// A connected sidecar: who it is and, from its pod, what it serves.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proxy {
    /// The node id it sent.
    pub id: String,
    pub namespace: String,
    pub pod_name: String,
    pub ip: String,
    pub labels: BTreeMap<String, String>,
    /// Container ports (number, name): from the pod in the API.
    pub ports: Vec<(u32, Option<String>)>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("node id {0:?} is not sidecar~<pod IP>~<pod>.<namespace>~<namespace>.svc.<domain>")]
pub struct BadNodeId(pub String);

fn meta_str<'a>(meta: Option<&'a Struct>, key: &str) -> Option<&'a str> {
    match meta?.fields.get(key)?.kind.as_ref()? {
        ValueKind::StringValue(s) => Some(s.as_str()),
        _ => None,
    }
}

impl Proxy {
    /// The proxy a node id names (Istio's `sidecar~<ip>~<pod>.<ns>~<ns>.svc.<domain>`), its
    /// labels and ports from the pod when known, else from the node's metadata.
    pub fn from_node(node: &Node, mesh: &Mesh) -> Result<Proxy, BadNodeId> {
        let bad = || BadNodeId(node.id.clone());
        let parts: Vec<&str> = node.id.split('~').collect();
        let [kind, ip, pod, _domain] = parts.as_slice() else { return Err(bad()) };
        if *kind != "sidecar" {
            return Err(bad());
        }
        let (pod_name, namespace) = pod.rsplit_once('.').ok_or_else(bad)?;
        if pod_name.is_empty() || namespace.is_empty() {
            return Err(bad());
        }
        let meta = node.metadata.as_ref();
        let mut proxy = Proxy {
            id: node.id.clone(),
            namespace: meta_str(meta, "NAMESPACE").unwrap_or(namespace).to_string(),
            pod_name: meta_str(meta, "POD_NAME").unwrap_or(pod_name).to_string(),
            ip: ip.to_string(),
            ..Default::default()
        };
        proxy.refresh(mesh, meta);
        Ok(proxy)
    }

    /// Take the pod's current labels and ports (pods change; the node does not).
    pub fn refresh(&mut self, mesh: &Mesh, meta: Option<&Struct>) {
        if let Some(pod) = mesh.pods.get(&(self.namespace.clone(), self.pod_name.clone())) {
            self.labels = pod.labels.clone();
            self.ports = pod.ports.clone();
            if let Some(ip) = &pod.ip {
                self.ip = ip.clone();
            }
        } else if let Some(ValueKind::StructValue(s)) =
            meta.and_then(|m| m.fields.get("LABELS")).and_then(|v| v.kind.as_ref())
        {
            self.labels = s
                .fields
                .iter()
                .filter_map(|(k, v)| match &v.kind {
                    Some(ValueKind::StringValue(s)) => Some((k.clone(), s.clone())),
                    _ => None,
                })
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::testutil::*;

    #[test]
    fn node_ids_name_the_pod() {
        let mesh = mesh_with(&[], &[], &[pod("reviews-v1-abc", "10.1.0.5", &[("app", "reviews")], &[(9080, "http")])]);
        let p = Proxy::from_node(&node("10.1.0.5", "reviews-v1-abc", "default"), &mesh).unwrap();
        assert_eq!(p.namespace, "default");
        assert_eq!(p.pod_name, "reviews-v1-abc");
        assert_eq!(p.labels.get("app").map(String::as_str), Some("reviews"));
        assert_eq!(p.ports, vec![(9080, Some("http".to_string()))]);
        let mut bad = node("10.1.0.5", "x", "default");
        bad.id = "router~1.2.3.4~x.default~default.svc.cluster.local".into();
        assert!(Proxy::from_node(&bad, &mesh).is_err());
        bad.id = "sidecar~1.2.3.4~nonamespace~default.svc.cluster.local".into();
        assert!(Proxy::from_node(&bad, &mesh).is_err());
    }

    #[test]
    fn unknown_pods_take_labels_from_the_node_metadata() {
        let mesh = Mesh::default();
        let p = Proxy::from_node(&node("10.1.0.9", "ghost", "prod"), &mesh).unwrap();
        assert_eq!(p.labels.get("app").map(String::as_str), Some("ghost"));
        assert!(p.ports.is_empty());
    }
}
