//! The mock provider: load balancers, instances and routes in memory. Every call is counted
//! ([`Mock::calls`]); a [`Failure`] makes matching calls fail (a number of times or always);
//! `latency` delays every call. Addresses come from 10.255.0.0/16 in order.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;

use super::{Cloud, CloudError, InstanceMetadata, Instances, LoadBalancers, Route, Routes};
use crate::model::{Listener, LoadBalancer, Remote};

/// Makes calls fail: those of `request` (the [`super::Counted`] names: `create`,
/// `add_listener`, …), on `port` if given (listener calls), `times` times (None: always).
#[derive(Debug, Clone)]
pub struct Failure {
    pub request: &'static str,
    pub port: Option<i32>,
    pub times: Option<usize>,
}

#[derive(Default)]
struct State {
    lbs: BTreeMap<String, Remote>,
    routes: BTreeMap<String, BTreeSet<Route>>,
    next: u32,
    calls: BTreeMap<&'static str, usize>,
    failures: Vec<Failure>,
}

/// The mock provider (clone it to keep a handle on its state).
#[derive(Clone, Default)]
pub struct Mock {
    state: Arc<Mutex<State>>,
    pub latency: Duration,
}

// The handles on its state are for the tests (the binary's `--cloud-provider=mock` has none).
#[cfg_attr(not(test), allow(dead_code))]
impl Mock {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make matching calls fail.
    pub fn fail(&self, f: Failure) {
        self.state().failures.push(f);
    }

    /// Calls per request name so far.
    pub fn calls(&self) -> BTreeMap<&'static str, usize> {
        self.state().calls.clone()
    }

    /// Every call so far.
    pub fn total_calls(&self) -> usize {
        self.state().calls.values().sum()
    }

    /// The load balancers it has.
    pub fn load_balancers_now(&self) -> BTreeMap<String, Remote> {
        self.state().lbs.clone()
    }

    async fn call(&self, request: &'static str, port: Option<i32>) -> Result<(), CloudError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let mut s = self.state();
        *s.calls.entry(request).or_default() += 1;
        let hit = s.failures.iter().position(|f| f.request == request && (f.port.is_none() || f.port == port));
        if let Some(i) = hit {
            let f = &mut s.failures[i];
            if let Some(t) = f.times.as_mut() {
                *t -= 1;
                if *t == 0 {
                    s.failures.remove(i);
                }
            }
            return Err(CloudError::Failed(format!(
                "mock: {request} failed{}",
                port.map(|p| format!(" on port {p}")).unwrap_or_default()
            )));
        }
        Ok(())
    }

    fn with_lb<T>(&self, name: &str, f: impl FnOnce(&mut Remote) -> T) -> Result<T, CloudError> {
        self.state().lbs.get_mut(name).map(f).ok_or_else(|| CloudError::NotFound(name.to_string()))
    }
}

#[async_trait]
impl LoadBalancers for Mock {
    async fn get(&self, name: &str) -> Result<Option<Remote>, CloudError> {
        self.call("get", None).await?;
        Ok(self.state().lbs.get(name).cloned())
    }
    async fn list(&self) -> Result<Vec<Remote>, CloudError> {
        self.call("list", None).await?;
        Ok(self.state().lbs.values().cloned().collect())
    }
    async fn create(&self, lb: &LoadBalancer) -> Result<Remote, CloudError> {
        self.call("create", None).await?;
        let mut s = self.state();
        if let Some(ip) = lb.requested_ip {
            if let Some(other) = s.lbs.values().find(|r| r.address == ip && r.name != lb.name) {
                return Err(CloudError::AddressInUse { ip, by: other.service.clone() });
            }
        }
        let address = match lb.requested_ip {
            Some(ip) => ip,
            None => {
                s.next += 1;
                Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 255, 0, 0)) + s.next)
            }
        };
        let r = Remote::empty(lb, address);
        s.lbs.insert(lb.name.clone(), r.clone());
        Ok(r)
    }
    async fn add_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError> {
        self.call("add_listener", Some(l.port)).await?;
        self.with_lb(name, |r| {
            r.listeners.insert(l.clone());
        })
    }
    async fn update_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError> {
        self.call("update_listener", Some(l.port)).await?;
        self.with_lb(name, |r| {
            r.listeners.retain(|x| x.key() != l.key());
            r.listeners.insert(l.clone());
        })
    }
    async fn delete_listener(&self, name: &str, l: &Listener) -> Result<(), CloudError> {
        self.call("delete_listener", Some(l.port)).await?;
        self.with_lb(name, |r| {
            r.listeners.retain(|x| x.key() != l.key());
        })
    }
    async fn set_backends(&self, name: &str, backends: &BTreeSet<String>) -> Result<(), CloudError> {
        self.call("set_backends", None).await?;
        self.with_lb(name, |r| r.backends = backends.clone())
    }
    async fn set_health_check(&self, name: &str, node_port: Option<i32>) -> Result<(), CloudError> {
        self.call("set_health_check", node_port).await?;
        self.with_lb(name, |r| r.health_check_node_port = node_port)
    }
    async fn delete(&self, name: &str) -> Result<(), CloudError> {
        self.call("delete", None).await?;
        self.state().lbs.remove(name);
        Ok(())
    }
}

#[async_trait]
impl Instances for Mock {
    async fn metadata(&self, node: &Node) -> Result<InstanceMetadata, CloudError> {
        self.call("instance_metadata", None).await?;
        let name = node.metadata.name.clone().unwrap_or_default();
        Ok(InstanceMetadata {
            provider_id: format!("mock://{name}"),
            instance_type: Some("mock.small".into()),
            region: Some("mock-region".into()),
            zone: Some("mock-zone-a".into()),
            addresses: vec![],
        })
    }
}

#[async_trait]
impl Routes for Mock {
    async fn list(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        self.call("list_routes", None).await?;
        Ok(self.state().routes.get(cluster).map(|r| r.iter().cloned().collect()).unwrap_or_default())
    }
    async fn create(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        self.call("create_route", None).await?;
        self.state().routes.entry(cluster.to_string()).or_default().insert(route.clone());
        Ok(())
    }
    async fn delete(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        self.call("delete_route", None).await?;
        if let Some(r) = self.state().routes.get_mut(cluster) {
            r.remove(route);
        }
        Ok(())
    }
}

impl Cloud for Mock {
    fn name(&self) -> &str {
        "mock"
    }
    fn load_balancers(&self) -> Option<Arc<dyn LoadBalancers>> {
        Some(Arc::new(self.clone()))
    }
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        Some(Arc::new(self.clone()))
    }
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        Some(Arc::new(self.clone()))
    }
}
