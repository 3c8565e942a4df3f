//! The provider layer: one trait per infrastructure capability, as Kubernetes' cloud
//! provider interface splits them — load balancers ([`LoadBalancers`]), instances
//! ([`Instances`]) and routes ([`Routes`]) — and a [`Cloud`] that says which ones it has.
//!
//! - [`local`]: addresses from configured pools, held on a dummy link of the host it runs
//!   on (so the host answers ARP for them on its LANs and its Service rules take the
//!   traffic), its state kept in a file; instances from the Node objects themselves; no
//!   routes (each kubelet programs its host's routes to the other nodes' pod networks).
//! - [`mock`]: in memory, counting every call, with injectable failures and latency, for
//!   the controllers' tests and benchmarks.
//!
//! [`Counted`] wraps any load-balancer provider to count its calls in
//! `cloudprovider_api_requests_total{provider, request}`.

pub mod local;
pub mod mock;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::model::{Listener, LoadBalancer, Remote};

/// What a provider call can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloudError {
    #[error("no address left in pool {pool:?} ({size} addresses, all in use)")]
    PoolExhausted { pool: String, size: u64 },
    #[error("no address pool serves load balancer class {0:?}")]
    NoPool(String),
    #[error("requested address {ip} is already in use by the load balancer of Service {by}")]
    AddressInUse { ip: Ipv4Addr, by: String },
    #[error("requested address {ip} is not in address pool {pool:?}")]
    NotInPool { ip: Ipv4Addr, pool: String },
    #[error("load balancer {0} not found")]
    NotFound(String),
    #[error("{0}")]
    Failed(String),
}

/// Load balancers: create one (allocating its address), change its listeners, backends
/// and health check, read it back, delete it (releasing its address).
#[async_trait]
pub trait LoadBalancers: Send + Sync {
    /// Whether it serves Services of this `loadBalancerClass` (None: Services without one).
    fn serves_class(&self, class: Option<&str>) -> bool {
        class.is_none()
    }
    /// The load balancer called `name`, if the provider has it.
    async fn get(&self, name: &str) -> Result<Option<Remote>, CloudError>;
    /// Every load balancer the provider has.
    async fn list(&self) -> Result<Vec<Remote>, CloudError>;
    /// Create an empty load balancer for `lb` (no listeners yet), with `lb.requested_ip` or
    /// an address of its class's pool.
    async fn create(&self, lb: &LoadBalancer) -> Result<Remote, CloudError>;
    async fn add_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError>;
    async fn update_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError>;
    async fn delete_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError>;
    async fn set_backends(&self, name: &str, backends: &BTreeSet<String>) -> Result<(), CloudError>;
    async fn set_health_check(&self, name: &str, node_port: Option<i32>) -> Result<(), CloudError>;
    /// Delete the load balancer and release its address (one already gone is fine).
    async fn delete(&self, name: &str) -> Result<(), CloudError>;
}

/// What the provider knows of a node's machine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceMetadata {
    /// `<provider>://<id>`, the node's `spec.providerID`.
    pub provider_id: String,
    pub instance_type: Option<String>,
    pub region: Option<String>,
    pub zone: Option<String>,
    /// The node's addresses; empty leaves the kubelet's own.
    pub addresses: Vec<NodeAddress>,
}

/// Instances: the machine behind a Node.
#[async_trait]
pub trait Instances: Send + Sync {
    async fn metadata(&self, node: &Node) -> Result<InstanceMetadata, CloudError>;
}

/// A route of the infrastructure's network: traffic for `destination` (a node's pod CIDR)
/// goes to `target` (that node's address).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Route {
    /// The node the route leads to.
    pub node: String,
    pub destination: String,
    pub target: Ipv4Addr,
}

/// Routes: the infrastructure's route table for pod networks.
#[async_trait]
pub trait Routes: Send + Sync {
    /// The routes of `cluster` (not other clusters').
    async fn list(&self, cluster: &str) -> Result<Vec<Route>, CloudError>;
    async fn create(&self, cluster: &str, route: &Route) -> Result<(), CloudError>;
    async fn delete(&self, cluster: &str, route: &Route) -> Result<(), CloudError>;
}

/// A provider: its name and the capabilities it has.
pub trait Cloud: Send + Sync {
    fn name(&self) -> &str;
    fn load_balancers(&self) -> Option<Arc<dyn LoadBalancers>>;
    fn instances(&self) -> Option<Arc<dyn Instances>>;
    fn routes(&self) -> Option<Arc<dyn Routes>>;
}

/// A load-balancer provider whose calls are counted (`cloudprovider_api_requests_total`).
pub struct Counted {
    provider: String,
    inner: Arc<dyn LoadBalancers>,
}

impl Counted {
    pub fn wrap(provider: &str, inner: Arc<dyn LoadBalancers>) -> Arc<dyn LoadBalancers> {
        Arc::new(Counted { provider: provider.to_string(), inner })
    }

    fn count(&self, request: &str, ok: bool) {
        crate::metrics::provider_call(&self.provider, request, ok);
    }
}

macro_rules! counted {
    ($self:ident, $name:literal, $call:expr) => {{
        let r = $call.await;
        $self.count($name, r.is_ok());
        r
    }};
}

#[async_trait]
impl LoadBalancers for Counted {
    fn serves_class(&self, class: Option<&str>) -> bool {
        self.inner.serves_class(class)
    }
    async fn get(&self, name: &str) -> Result<Option<Remote>, CloudError> {
        counted!(self, "get", self.inner.get(name))
    }
    async fn list(&self) -> Result<Vec<Remote>, CloudError> {
        counted!(self, "list", self.inner.list())
    }
    async fn create(&self, lb: &LoadBalancer) -> Result<Remote, CloudError> {
        counted!(self, "create", self.inner.create(lb))
    }
    async fn add_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError> {
        counted!(self, "add_listener", self.inner.add_listener(name, l))
    }
    async fn update_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError> {
        counted!(self, "update_listener", self.inner.update_listener(name, l))
    }
    async fn delete_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError> {
        counted!(self, "delete_listener", self.inner.delete_listener(name, l))
    }
    async fn set_backends(&self, name: &str, backends: &BTreeSet<String>) -> Result<(), CloudError> {
        counted!(self, "set_backends", self.inner.set_backends(name, backends))
    }
    async fn set_health_check(&self, name: &str, node_port: Option<i32>) -> Result<(), CloudError> {
        counted!(self, "set_health_check", self.inner.set_health_check(name, node_port))
    }
    async fn delete(&self, name: &str) -> Result<(), CloudError> {
        counted!(self, "delete", self.inner.delete(name))
    }
}
