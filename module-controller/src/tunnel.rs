//! The `Tunnel` abstraction of Koupleless' multi-tenant virtual kubelet: how the
//! controller discovers bases and operates modules, independent of the transport. The
//! controller injects [`TunnelCallbacks`] (node discovered, node status, all container
//! statuses, start/shutdown responses) and a baseline query; a tunnel calls them when data
//! arrives. [`crate::mqtt::MqttTunnel`] and [`crate::http_tunnel::HttpTunnel`] implement it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// `ACTIVATED` starts (or keeps) a vnode; `DEACTIVATED` shuts it down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    Activated,
    Deactivated,
}

/// Metadata of a base, turned into the vnode's labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeMetadata {
    pub name: String,
    pub version: String,
    pub cluster_name: String,
    pub status: NodeState,
}

/// Network of a base, turned into the vnode's addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkInfo {
    pub node_ip: String,
    pub host_name: String,
    /// The base's arklet port (HTTP tunnel), 0 when unknown.
    pub arklet_port: i32,
}

/// What a tunnel knows of a base when it discovers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub metadata: NodeMetadata,
    pub network: NetworkInfo,
}

/// Capacity and allocatable of one resource.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeResource {
    pub capacity: Quantity,
    pub allocatable: Quantity,
}

/// A base's health, turned into the vnode's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeStatusData {
    pub resources: BTreeMap<String, NodeResource>,
    pub custom_labels: BTreeMap<String, String>,
    pub custom_annotations: BTreeMap<String, String>,
    pub custom_taints: Vec<Taint>,
    pub custom_conditions: Vec<NodeCondition>,
}

/// A module's state as the base reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContainerState {
    Activated,
    Resolved,
    Deactivated,
    Broken,
    Stopped,
    Other(String),
}

impl ContainerState {
    pub fn parse(s: &str) -> Self {
        match s {
            "ACTIVATED" => ContainerState::Activated,
            "RESOLVED" => ContainerState::Resolved,
            "DEACTIVATED" => ContainerState::Deactivated,
            "BROKEN" => ContainerState::Broken,
            "STOPPED" => ContainerState::Stopped,
            other => ContainerState::Other(other.to_string()),
        }
    }
    pub fn as_str(&self) -> &str {
        match self {
            ContainerState::Activated => "ACTIVATED",
            ContainerState::Resolved => "RESOLVED",
            ContainerState::Deactivated => "DEACTIVATED",
            ContainerState::Broken => "BROKEN",
            ContainerState::Stopped => "STOPPED",
            ContainerState::Other(s) => s,
        }
    }
}

/// `podKey` meaning "shared by every pod of the node".
pub const POD_KEY_ALL: &str = "all";

/// The status of one container (module).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerStatusData {
    /// Same as [`Tunnel::container_unique_key`] of the container.
    pub key: String,
    pub name: String,
    pub pod_key: String,
    pub state: ContainerState,
    /// Milliseconds since the epoch.
    pub change_time_ms: i64,
    pub reason: String,
    pub message: String,
}

/// What the controller keeps of a base's report of one module: its state and when it
/// entered it, and why (the module's key, under which it is kept, names it). A few words
/// where a [`ContainerStatusData`] is six strings; one per module of every base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleReport {
    pub state: ContainerState,
    /// Milliseconds since the epoch.
    pub change_time_ms: i64,
    pub reason: Box<str>,
    pub message: Box<str>,
}

impl From<ContainerStatusData> for ModuleReport {
    fn from(d: ContainerStatusData) -> Self {
        ModuleReport {
            state: d.state,
            change_time_ms: d.change_time_ms,
            reason: d.reason.into(),
            message: d.message.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationResult {
    Success,
    Failure,
}

/// The response to a start or shutdown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerOperationResponse {
    pub container_key: String,
    pub result: OperationResult,
    pub reason: String,
    pub message: String,
}

/// Parameters of a baseline query (which modules a freshly started base should install).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryBaselineRequest {
    pub identity: String,
    pub name: String,
    pub version: String,
    pub cluster_name: String,
}

/// The callbacks the controller injects into a tunnel (Koupleless' `RegisterCallback`).
/// The first argument is always the base's id (node id).
pub trait TunnelCallbacks: Send + Sync {
    fn on_node_discovered(&self, node_id: &str, info: NodeInfo);
    fn on_node_status(&self, node_id: &str, data: NodeStatusData);
    fn on_all_container_status(&self, node_id: &str, data: Vec<ContainerStatusData>);
    fn on_start_container_response(&self, node_id: &str, resp: ContainerOperationResponse);
    fn on_shutdown_container_response(&self, node_id: &str, resp: ContainerOperationResponse);
    /// The tunnel answered a base's baseline query with these module keys (the base
    /// installs them itself): lets the controller avoid sending the same installs again.
    fn on_baseline_sent(&self, node_id: &str, keys: Vec<String>) {
        let _ = (node_id, keys);
    }
}

/// Seed 000's `QueryContainersBaseline`: the containers a base should run.
pub type QueryBaseline = Arc<dyn Fn(QueryBaselineRequest) -> Vec<Container> + Send + Sync>;

/// The transport between the controller and its bases.
#[async_trait::async_trait]
pub trait Tunnel: Send + Sync {
    /// The tunnel's identity (set as the vnode's `vnode.koupleless.io/tunnel` label).
    fn key(&self) -> &str;
    /// Connect and start delivering callbacks.
    async fn start(&self, client_id: &str, env: &str) -> anyhow::Result<()>;
    /// True once started and connected.
    fn ready(&self) -> bool;
    fn register_callbacks(&self, callbacks: Arc<dyn TunnelCallbacks>);
    fn register_query(&self, query: QueryBaseline);
    /// Called when this controller starts serving the vnode of `node_id`.
    async fn on_node_start(&self, node_id: &str);
    /// Called when this controller stops serving it.
    async fn on_node_stop(&self, node_id: &str);
    /// Ask for health; the answer arrives through `on_node_status`.
    async fn fetch_health_data(&self, node_id: &str) -> anyhow::Result<()>;
    /// Ask for all modules; the answer arrives through `on_all_container_status`.
    async fn query_all_container_status(&self, node_id: &str) -> anyhow::Result<()>;
    /// Install a module; the answer arrives through `on_start_container_response`.
    async fn start_container(&self, node_id: &str, pod_key: &str, container: &Container) -> anyhow::Result<()>;
    /// Uninstall a module; the answer arrives through `on_shutdown_container_response`.
    async fn shutdown_container(&self, node_id: &str, pod_key: &str, container: &Container) -> anyhow::Result<()>;
    /// The key under which the base reports this container: `bizName:bizVersion`.
    fn container_unique_key(&self, pod_key: &str, container: &Container) -> String {
        let _ = pod_key;
        container_key(container)
    }
}

/// The env variable that carries a module's version (Koupleless' convention).
pub const ENV_BIZ_VERSION: &str = "BIZ_VERSION";

/// A module's version: the container's `BIZ_VERSION` env value.
pub fn biz_version(c: &Container) -> String {
    c.env
        .as_ref()
        .and_then(|env| env.iter().find(|e| e.name == ENV_BIZ_VERSION))
        .and_then(|e| e.value.clone())
        .unwrap_or_default()
}

/// A module's key, under which bases report it: `name:BIZ_VERSION`.
pub fn container_key(c: &Container) -> String {
    crate::protocol::biz_key(&c.name, &biz_version(c))
}

/// A tunnel that reaches no base (a placeholder when none is configured).
pub struct NoTunnel;

#[async_trait::async_trait]
impl Tunnel for NoTunnel {
    fn key(&self) -> &str {
        "none"
    }
    async fn start(&self, _client_id: &str, _env: &str) -> anyhow::Result<()> {
        Ok(())
    }
    fn ready(&self) -> bool {
        false
    }
    fn register_callbacks(&self, _callbacks: Arc<dyn TunnelCallbacks>) {}
    fn register_query(&self, _query: QueryBaseline) {}
    async fn on_node_start(&self, _node_id: &str) {}
    async fn on_node_stop(&self, _node_id: &str) {}
    async fn fetch_health_data(&self, _node_id: &str) -> anyhow::Result<()> {
        anyhow::bail!("no tunnel")
    }
    async fn query_all_container_status(&self, _node_id: &str) -> anyhow::Result<()> {
        anyhow::bail!("no tunnel")
    }
    async fn start_container(&self, _node_id: &str, _pod_key: &str, _container: &Container) -> anyhow::Result<()> {
        anyhow::bail!("no tunnel")
    }
    async fn shutdown_container(&self, _node_id: &str, _pod_key: &str, _container: &Container) -> anyhow::Result<()> {
        anyhow::bail!("no tunnel")
    }
}
