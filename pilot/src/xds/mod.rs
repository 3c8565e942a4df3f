//! Envoy xDS v3 generation: the mesh (Services, endpoints, pods, the accepted
//! VirtualServices and DestinationRules) to the clusters, endpoints, listeners and routes of
//! every sidecar, with the names and shapes of `envoy/MESH-CONTRACT.md`. Pure.
//!
//! What every proxy shares is computed once per [`Snapshot`]: the outbound clusters, their
//! `ClusterLoadAssignment`s and the outbound listeners; route configurations once per
//! namespace (only the short host names differ between namespaces), on first use. Per proxy
//! only the inbound side is computed: its `inbound|<port>||` clusters and its
//! `virtualInbound` listener, from its pod's container ports.
//!
//! - [`mesh`]: the inputs, indexed ([`Mesh`]), and a proxy's identity ([`Proxy`]);
//! - [`clusters`], [`endpoints`], [`listeners`], [`routes`]: one resource type each.

pub mod clusters;
pub mod endpoints;
pub mod listeners;
pub mod mesh;
pub mod routes;

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration, UInt32Value};
use prost::{Message, Name};

pub use mesh::{Mesh, Proxy};

/// The xDS resource types, in the order pilot pushes them (Envoy's make-before-break order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TypeUrl {
    Cluster,
    Endpoint,
    Listener,
    Route,
}

pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT_TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

impl TypeUrl {
    pub const ALL: [TypeUrl; 4] = [TypeUrl::Cluster, TypeUrl::Endpoint, TypeUrl::Listener, TypeUrl::Route];

    pub fn url(self) -> &'static str {
        match self {
            TypeUrl::Cluster => CLUSTER_TYPE,
            TypeUrl::Endpoint => ENDPOINT_TYPE,
            TypeUrl::Listener => LISTENER_TYPE,
            TypeUrl::Route => ROUTE_TYPE,
        }
    }

    pub fn parse(url: &str) -> Option<TypeUrl> {
        TypeUrl::ALL.into_iter().find(|t| t.url() == url)
    }

    /// The short name metrics use (`cds`, `eds`, `lds`, `rds`).
    pub fn short(self) -> &'static str {
        match self {
            TypeUrl::Cluster => "cds",
            TypeUrl::Endpoint => "eds",
            TypeUrl::Listener => "lds",
            TypeUrl::Route => "rds",
        }
    }

    /// Whether a response carries every resource (CDS, LDS) or the requested ones (EDS,
    /// RDS).
    pub fn wildcard(self) -> bool {
        matches!(self, TypeUrl::Cluster | TypeUrl::Listener)
    }
}

/// Pack a message into an `Any`.
pub fn any<M: Message + Name>(m: &M) -> Any {
    Any { type_url: M::type_url(), value: m.encode_to_vec() }
}

pub fn duration(d: std::time::Duration) -> PbDuration {
    PbDuration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

pub fn u32v(value: u32) -> UInt32Value {
    UInt32Value { value }
}

/// One generated resource: its name, the packed message and a hash of its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    pub name: String,
    pub any: Any,
    pub hash: u64,
}

impl Resource {
    pub fn new<M: Message + Name>(name: impl Into<String>, m: &M) -> Resource {
        let any = any(m);
        let mut h = DefaultHasher::new();
        any.value.hash(&mut h);
        Resource { name: name.into(), any, hash: h.finish() }
    }
}

/// A proxy's resources of one type, and the hash of that content (equal hashes: nothing to
/// push).
#[derive(Clone, Debug, Default)]
pub struct Resources {
    pub items: Vec<Resource>,
    pub hash: u64,
}

/// Everything pushed to proxies at one version of the mesh.
pub struct Snapshot {
    pub version: u64,
    pub mesh: Arc<Mesh>,
    clusters: Vec<Resource>,
    endpoints: BTreeMap<String, Resource>,
    listeners: Vec<Resource>,
    routes: Mutex<HashMap<String, Arc<BTreeMap<String, Resource>>>>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("version", &self.version)
            .field("clusters", &self.clusters.len())
            .field("endpoints", &self.endpoints.len())
            .field("listeners", &self.listeners.len())
            .finish()
    }
}

/// What a push is computed from: the watched objects.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    pub services: Vec<k8s_openapi::api::core::v1::Service>,
    pub slices: Vec<k8s_openapi::api::discovery::v1::EndpointSlice>,
    pub pods: Vec<k8s_openapi::api::core::v1::Pod>,
    pub virtual_services: Vec<crate::model::ConfigObject>,
    pub destination_rules: Vec<crate::model::ConfigObject>,
}

impl Snapshot {
    /// A push, from the objects: validate the configuration (`accepted` keeps the last
    /// valid version of each object), index the mesh, build the shared configuration. The
    /// snapshot and a verdict per VirtualService and DestinationRule.
    pub fn compute(
        version: u64,
        domain: &str,
        inputs: &Inputs,
        accepted: &mut crate::validate::Accepted,
    ) -> (Snapshot, Vec<crate::validate::Verdict>) {
        let index = crate::model::ServiceIndex::build(&inputs.services, domain);
        let (config, verdicts) = accepted.reconcile(&inputs.virtual_services, &inputs.destination_rules, &index);
        let mesh = Mesh::build(index, config, &inputs.slices, &inputs.pods);
        (Snapshot::build(version, Arc::new(mesh)), verdicts)
    }

    /// Compute the shared part of every proxy's configuration.
    pub fn build(version: u64, mesh: Arc<Mesh>) -> Snapshot {
        let clusters = clusters::shared(&mesh).into_iter().map(|c| Resource::new(c.name.clone(), &c)).collect();
        let endpoints = endpoints::all(&mesh)
            .into_iter()
            .map(|e| (e.cluster_name.clone(), Resource::new(e.cluster_name.clone(), &e)))
            .collect();
        let listeners = listeners::outbound(&mesh).into_iter().map(|l| Resource::new(l.name.clone(), &l)).collect();
        Snapshot { version, mesh, clusters, endpoints, listeners, routes: Mutex::new(HashMap::new()) }
    }

    /// The route configurations of proxies in `namespace`, computed on first use.
    fn routes_for(&self, namespace: &str) -> Arc<BTreeMap<String, Resource>> {
        let mut cache = match self.routes.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        cache
            .entry(namespace.to_string())
            .or_insert_with(|| {
                Arc::new(
                    routes::all(&self.mesh, namespace)
                        .into_iter()
                        .map(|r| (r.name.clone(), Resource::new(r.name.clone(), &r)))
                        .collect(),
                )
            })
            .clone()
    }

    /// What `proxy` gets of type `t`, `names` being what it asked for (EDS, RDS).
    pub fn resources(&self, proxy: &Proxy, t: TypeUrl, names: &[String]) -> Resources {
        let mut items = Vec::new();
        let hash = self.collect(proxy, t, names, &mut |r| items.push(r.clone()));
        Resources { items, hash }
    }

    /// The hash of [`Snapshot::resources`]' content, without copying it (what a stream
    /// compares with what it last sent).
    pub fn hash(&self, proxy: &Proxy, t: TypeUrl, names: &[String]) -> u64 {
        self.collect(proxy, t, names, &mut |_| {})
    }

    fn collect(&self, proxy: &Proxy, t: TypeUrl, names: &[String], out: &mut dyn FnMut(&Resource)) -> u64 {
        let mut h = DefaultHasher::new();
        let mut add = |r: &Resource| {
            r.name.hash(&mut h);
            r.hash.hash(&mut h);
            out(r);
        };
        match t {
            TypeUrl::Cluster => {
                self.clusters.iter().for_each(&mut add);
                for c in clusters::inbound(&self.mesh, proxy) {
                    add(&Resource::new(c.name.clone(), &c));
                }
            }
            TypeUrl::Listener => {
                self.listeners.iter().for_each(&mut add);
                let inbound = listeners::virtual_inbound(&self.mesh, proxy);
                add(&Resource::new(inbound.name.clone(), &inbound));
            }
            TypeUrl::Endpoint => {
                for n in sorted(names) {
                    match self.endpoints.get(n) {
                        Some(r) => add(r),
                        None => add(&Resource::new(n, &endpoints::empty(n))),
                    }
                }
            }
            TypeUrl::Route => {
                let routes = self.routes_for(&proxy.namespace);
                for n in sorted(names) {
                    match routes.get(n) {
                        Some(r) => add(r),
                        None => add(&Resource::new(n, &routes::empty(n))),
                    }
                }
            }
        }
        h.finish()
    }

    /// The names of the EDS clusters of the shared configuration (what a proxy asks EDS
    /// for once it has its clusters).
    pub fn eds_cluster_names(&self) -> Vec<String> {
        self.endpoints.keys().cloned().collect()
    }

    /// The route configuration names the outbound listeners use.
    pub fn route_names(&self) -> Vec<String> {
        listeners::http_ports(&self.mesh).into_iter().map(|p| p.to_string()).collect()
    }
}

fn sorted(names: &[String]) -> Vec<&str> {
    let mut v: Vec<&str> = names.iter().map(String::as_str).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Istio's cluster names.
pub fn outbound_cluster(port: u32, subset: &str, fqdn: &str) -> String {
    format!("outbound|{port}|{subset}|{fqdn}")
}

pub fn inbound_cluster(port: u32) -> String {
    format!("inbound|{port}||")
}

pub const PASSTHROUGH: &str = "PassthroughCluster";
pub const BLACKHOLE: &str = "BlackHoleCluster";
pub const INBOUND_PASSTHROUGH: &str = "InboundPassthroughClusterIpv4";

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;
    use serde_json::json;

    fn snapshot(version: u64, weight: i64) -> Snapshot {
        let (svcs, slices, pods) = bookinfo();
        let vs = config(
            "reviews",
            json!({"hosts": ["reviews"], "http": [{"fault": {"delay": {"fixedDelay": "1s"}}, "route": [
                {"destination": {"host": "reviews", "subset": "v1"}, "weight": weight},
                {"destination": {"host": "reviews", "subset": "v2"}, "weight": 100 - weight}]}]}),
        );
        let rule = reviews_rule(json!({"connectionPool": {"http": {"http2MaxRequests": 10}}}));
        Snapshot::build(version, Arc::new(mesh_full(&svcs, &slices, &pods, &[vs], &[rule])))
    }

    #[test]
    fn the_same_mesh_hashes_the_same() {
        let (a, b) = (snapshot(1, 80), snapshot(2, 80));
        let proxy = Proxy::from_node(&testutil::node("10.1.3.1", "productpage", "default"), &a.mesh).unwrap();
        for t in TypeUrl::ALL {
            let names = match t {
                TypeUrl::Endpoint => a.eds_cluster_names(),
                TypeUrl::Route => a.route_names(),
                _ => vec![],
            };
            let (ra, rb) = (a.resources(&proxy, t, &names), b.resources(&proxy, t, &names));
            assert_eq!(ra.hash, rb.hash, "{t:?}");
            assert_eq!(ra.hash, a.hash(&proxy, t, &names));
            assert_eq!(ra.items, rb.items);
        }
        // A weight change touches the routes only.
        let c = snapshot(3, 50);
        for t in TypeUrl::ALL {
            let names = match t {
                TypeUrl::Endpoint => a.eds_cluster_names(),
                TypeUrl::Route => a.route_names(),
                _ => vec![],
            };
            assert_eq!(a.hash(&proxy, t, &names) != c.hash(&proxy, t, &names), t == TypeUrl::Route, "{t:?}");
        }
    }

    #[test]
    fn proxies_get_the_shared_part_and_their_own_inbound_part() {
        let s = snapshot(1, 80);
        let proxy = Proxy::from_node(&testutil::node("10.1.0.1", "reviews-v1", "default"), &s.mesh).unwrap();
        let cds = s.resources(&proxy, TypeUrl::Cluster, &[]);
        let names: Vec<&str> = cds.items.iter().map(|r| r.name.as_str()).collect();
        assert!(names.contains(&"inbound|9080||"));
        assert!(names.contains(&"outbound|9080|v2|reviews.default.svc.cluster.local"));
        let lds = s.resources(&proxy, TypeUrl::Listener, &[]);
        let names: Vec<&str> = lds.items.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["virtualOutbound", "0.0.0.0_9080", "0.0.0.0_50051", "10.96.0.12_5432", "virtualInbound"]
        );
        assert!(lds.items.iter().all(|r| r.any.type_url == LISTENER_TYPE));
        // Unknown names are answered with empty resources, in name order.
        let eds = s.resources(
            &proxy,
            TypeUrl::Endpoint,
            &["zzz".into(), "outbound|5432||db.default.svc.cluster.local".into()],
        );
        let names: Vec<&str> = eds.items.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["outbound|5432||db.default.svc.cluster.local", "zzz"]);
        assert_eq!(s.route_names(), vec!["9080", "50051"]);
    }
}
