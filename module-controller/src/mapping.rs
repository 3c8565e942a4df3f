//! Pure mappings between the Koupleless world and Kubernetes objects:
//! - a base's heartbeat → [`NodeInfo`]; its health → [`NodeStatusData`] (memory from the
//!   metaspace figures, pods 65535); both → the vnode (`Node`: name, labels, taints,
//!   addresses, capacity, conditions);
//! - the modules a base reports → [`ContainerStatusData`]; those → container states and the
//!   module pod's phase and conditions;
//! - a module pod's container → the `installBiz` body and the module key `name:version`, and
//!   the compact [`ModuleSpec`] the controller keeps of it;
//! - what a pod's and a vnode's next status build on and are compared with, kept instead of
//!   the statuses themselves ([`PriorStatus`], [`NodeStatusMemo`]), and when a vnode's status
//!   is due ([`node_status_due`]).
//!
//! No I/O here: everything takes "now" as an argument so it is unit-testable.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as K8sContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, DaemonEndpoint, EnvVar, Node, NodeAddress, NodeCondition,
    NodeDaemonEndpoints, NodeSpec, NodeStatus, NodeSystemInfo, PodCondition, PodIP, PodStatus, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use crate::protocol::{BizModel, BizOperationResponse, HealthResponse, HeartbeatData, SimpleBizInfo, CODE_SUCCESS};
pub use crate::tunnel::{biz_version, container_key, ENV_BIZ_VERSION};
use crate::tunnel::{
    ContainerOperationResponse, ContainerState, ContainerStatusData, ModuleReport, NetworkInfo, NodeInfo, NodeMetadata,
    NodeResource, NodeState, NodeStatusData, OperationResult,
};

pub const LABEL_COMPONENT: &str = "virtual-kubelet.koupleless.io/component";
pub const LABEL_ENV: &str = "virtual-kubelet.koupleless.io/env";
pub const COMPONENT_VNODE: &str = "vnode";
pub const COMPONENT_MODULE: &str = "module";
/// The base's name and version as Koupleless' module controller labels its vnodes, which
/// module pods select in Koupleless' documentation.
pub const LABEL_VNODE_NAME: &str = "vnode.koupleless.io/name";
pub const LABEL_VNODE_VERSION: &str = "vnode.koupleless.io/version";
/// The same under the `base.` prefix, which module pods written for earlier module
/// controllers select (the project's module pod example among them).
pub const LABEL_BASE_NAME: &str = "base.koupleless.io/name";
pub const LABEL_BASE_VERSION: &str = "base.koupleless.io/version";
pub const LABEL_BASE_CLUSTER: &str = "base.koupleless.io/cluster-name";
pub const LABEL_BASE_HOST: &str = "base.koupleless.io/host-name";
pub const LABEL_BASE_TUNNEL_PORT: &str = "base.koupleless.io/tunnel-port";
pub const LABEL_BASE_STACK: &str = "base.koupleless.io/stack";
pub const LABEL_VNODE_TUNNEL: &str = "vnode.koupleless.io/tunnel";
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
pub const TAINT_VIRTUAL_NODE: &str = "schedule.koupleless.io/virtual-node";
pub const TAINT_NODE_ENV: &str = "schedule.koupleless.io/node-env";
/// The env var carrying a module's version.
/// Module pods per vnode.
pub const MAX_PODS: &str = "65535";
/// The label selector of the one module-pod watch.
pub fn module_pod_selector() -> String {
    format!("{LABEL_COMPONENT}={COMPONENT_MODULE}")
}

/// `vnode.{identity}.{env}`.
pub fn node_name(base_id: &str, env: &str) -> String {
    format!("vnode.{base_id}.{env}")
}

/// The base id of a vnode name of `env` (ids may contain dots, e.g. IPv4 addresses).
pub fn base_id_of<'a>(node_name: &'a str, env: &str) -> Option<&'a str> {
    let id = node_name.strip_prefix("vnode.")?.strip_suffix(env)?.strip_suffix('.')?;
    (!id.is_empty()).then_some(id)
}

/// A label value Kubernetes accepts (≤ 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends).
pub fn label_value(s: &str) -> String {
    let mapped: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).take(63).collect();
    mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

/// A heartbeat → the base's info. `None` when it names no identity.
pub fn heartbeat_to_node_info(hb: &HeartbeatData) -> Option<NodeInfo> {
    if hb.base_metadata.identity.is_empty() {
        return None;
    }
    Some(NodeInfo {
        metadata: NodeMetadata {
            name: hb.base_metadata.name.clone(),
            version: hb.base_metadata.version.clone(),
            cluster_name: hb.base_metadata.cluster_name.clone(),
            status: if hb.state == "DEACTIVATED" { NodeState::Deactivated } else { NodeState::Activated },
        },
        network: NetworkInfo {
            node_ip: hb.local_ip.clone(),
            host_name: hb.local_host_name.clone(),
            arklet_port: hb.port,
        },
    })
}

/// A health report → node status data: memory capacity = max metaspace, allocatable =
/// max − committed; cpu = the CPU count. `None` unless the code is SUCCESS.
pub fn health_to_status(h: &HealthResponse) -> Option<NodeStatusData> {
    if h.code != CODE_SUCCESS {
        return None;
    }
    let jvm = &h.data.health_data.jvm;
    let mut data = NodeStatusData::default();
    if jvm.max_metaspace > 0.0 {
        let max = jvm.max_metaspace.max(0.0) as i64;
        let free = (jvm.max_metaspace - jvm.committed_metaspace).max(0.0) as i64;
        data.resources.insert(
            "memory".into(),
            NodeResource { capacity: Quantity(max.to_string()), allocatable: Quantity(free.to_string()) },
        );
    }
    let cpus = h.data.health_data.cpu.count;
    if cpus > 0 {
        data.resources.insert(
            "cpu".into(),
            NodeResource { capacity: Quantity(cpus.to_string()), allocatable: Quantity(cpus.to_string()) },
        );
    }
    Some(data)
}

/// The modules a base reports → container status data, keyed `name:version`.
pub fn simple_biz_to_statuses(bizs: &[SimpleBizInfo]) -> Vec<ContainerStatusData> {
    bizs.iter()
        .filter(|b| !b.name.is_empty())
        .map(|b| {
            let rec = b.latest_state_record.clone().unwrap_or_default();
            let state = if b.state.is_empty() { rec.state.clone() } else { b.state.clone() };
            ContainerStatusData {
                key: crate::protocol::biz_key(&b.name, &b.version),
                name: b.name.clone(),
                pod_key: crate::tunnel::POD_KEY_ALL.into(),
                state: ContainerState::parse(&state),
                change_time_ms: rec.change_time,
                reason: rec.reason,
                message: rec.message,
            }
        })
        .collect()
}

/// A biz operation reply → the operation response (key `name:version`).
pub fn op_response(op: &BizOperationResponse) -> ContainerOperationResponse {
    let r = &op.response;
    let ok = r.code == CODE_SUCCESS && (r.data.code.is_empty() || r.data.code == CODE_SUCCESS);
    let mut parts: Vec<&str> = vec![];
    for m in [r.message.as_str(), r.data.message.as_str()] {
        if !m.is_empty() && !parts.contains(&m) {
            parts.push(m);
        }
    }
    let message = parts.join(": ");
    ContainerOperationResponse {
        container_key: crate::protocol::biz_key(&op.biz_name, &op.biz_version),
        result: if ok { OperationResult::Success } else { OperationResult::Failure },
        reason: if r.data.code.is_empty() { r.code.clone() } else { r.data.code.clone() },
        message,
    }
}

/// The `installBiz`/`uninstallBiz` body of a container (image = artifact URL).
pub fn biz_model(c: &Container) -> BizModel {
    BizModel { biz_name: c.name.clone(), biz_version: biz_version(c), biz_url: c.image.clone().unwrap_or_default() }
}

/// A module pod's container as the controller keeps it: its key (`name:version`, the name
/// being the first `name_len` bytes) and its image (the module's URL) — what installs,
/// statuses and baselines read of it. A `Container` is over 2 KB before any of its strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleSpec {
    key: Box<str>,
    name_len: usize,
    image: Option<Box<str>>,
}

impl ModuleSpec {
    pub fn new(name: &str, version: &str, image: Option<&str>) -> Self {
        ModuleSpec {
            key: crate::protocol::biz_key(name, version).into(),
            name_len: name.len(),
            image: image.map(Into::into),
        }
    }

    /// The module of a container: its name, `BIZ_VERSION` and image.
    pub fn of(c: &Container) -> Self {
        Self::new(&c.name, &biz_version(c), c.image.as_deref())
    }

    /// `name:version`, as bases report the module ([`container_key`] of its container).
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn name(&self) -> &str {
        self.key.get(..self.name_len).unwrap_or_default()
    }

    pub fn version(&self) -> &str {
        self.key.get(self.name_len + 1..).unwrap_or_default()
    }

    pub fn image(&self) -> Option<&str> {
        self.image.as_deref()
    }

    /// The container the tunnels take (name, image, `BIZ_VERSION`), made when a command is sent.
    pub fn container(&self) -> Container {
        Container {
            name: self.name().into(),
            image: self.image.as_deref().map(Into::into),
            env: Some(vec![EnvVar {
                name: ENV_BIZ_VERSION.into(),
                value: Some(self.version().into()),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }
}

/// `s` as a `'static` string when it is one of `known` (no copy kept), else owned.
pub fn interned(s: String, known: &[&'static str]) -> Cow<'static, str> {
    match known.iter().find(|k| **k == s) {
        Some(k) => Cow::Borrowed(k),
        None => Cow::Owned(s),
    }
}

/// The vnode's labels.
pub fn node_labels(base_id: &str, env: &str, tunnel: &str, info: &NodeInfo) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(LABEL_COMPONENT.into(), COMPONENT_VNODE.into());
    l.insert(LABEL_ENV.into(), label_value(env));
    l.insert(LABEL_VNODE_NAME.into(), label_value(&info.metadata.name));
    l.insert(LABEL_VNODE_VERSION.into(), label_value(&info.metadata.version));
    l.insert(LABEL_BASE_NAME.into(), label_value(&info.metadata.name));
    l.insert(LABEL_BASE_VERSION.into(), label_value(&info.metadata.version));
    l.insert(LABEL_BASE_CLUSTER.into(), label_value(&info.metadata.cluster_name));
    l.insert(LABEL_BASE_HOST.into(), label_value(&info.network.host_name));
    l.insert(LABEL_BASE_STACK.into(), "java".into());
    l.insert(LABEL_VNODE_TUNNEL.into(), label_value(tunnel));
    l.insert(LABEL_HOSTNAME.into(), label_value(&node_name(base_id, env)));
    if info.network.arklet_port > 0 {
        l.insert(LABEL_BASE_TUNNEL_PORT.into(), info.network.arklet_port.to_string());
    }
    l
}

/// The vnode's taints.
pub fn node_taints(env: &str) -> Vec<Taint> {
    vec![
        Taint {
            key: TAINT_VIRTUAL_NODE.into(),
            value: Some("True".into()),
            effect: "NoExecute".into(),
            ..Default::default()
        },
        Taint { key: TAINT_NODE_ENV.into(), value: Some(env.into()), effect: "NoExecute".into(), ..Default::default() },
    ]
}

/// Whether the base is heard from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Heartbeats arrive.
    Alive,
    /// No heartbeat for longer than the grace period.
    Silent,
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, now: &Time) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// Where the apiserver finds a vnode's kubelet API (`kubectl logs`): the module controller
/// that serves it, as a virtual kubelet does — every vnode's `InternalIP` and
/// `daemonEndpoints.kubeletEndpoint.port`. The base's own address is its pods' `hostIP` and
/// `podIP` (where their modules answer).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeletEndpoint {
    /// The controller's address (`--node-ip`); empty: none is published.
    pub ip: String,
    /// The controller's kubelet port (`--port`); 0: none is published.
    pub port: u16,
}

/// The vnode's status. Condition transition times are kept from `previous` when a
/// condition's status did not change.
pub fn node_status(
    info: &NodeInfo,
    kubelet: &KubeletEndpoint,
    data: Option<&NodeStatusData>,
    liveness: Liveness,
    previous: Option<&NodeStatusMemo>,
    now: Timestamp,
) -> NodeStatus {
    let t = Time(now);
    let mut capacity = BTreeMap::new();
    let mut allocatable = BTreeMap::new();
    capacity.insert("pods".to_string(), Quantity(MAX_PODS.into()));
    allocatable.insert("pods".to_string(), Quantity(MAX_PODS.into()));
    if let Some(d) = data {
        for (name, r) in &d.resources {
            capacity.insert(name.clone(), r.capacity.clone());
            allocatable.insert(name.clone(), r.allocatable.clone());
        }
    }
    let mut conditions = match liveness {
        Liveness::Alive => vec![
            condition("Ready", "True", "KubeletReady", "base is ready", &t),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "base has sufficient memory", &t),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "base has no disk pressure", &t),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "base has sufficient PID available", &t),
            condition("NetworkUnavailable", "False", "RouteCreated", "base network is available", &t),
        ],
        Liveness::Silent => ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"]
            .iter()
            .map(|c| condition(c, "Unknown", "NodeStatusUnknown", "Base stopped posting heartbeats.", &t))
            .chain(std::iter::once(condition(
                "NetworkUnavailable",
                "Unknown",
                "NodeStatusUnknown",
                "Base stopped posting heartbeats.",
                &t,
            )))
            .collect(),
    };
    if let Some(d) = data {
        for c in &d.custom_conditions {
            conditions.retain(|x| x.type_ != c.type_);
            conditions.push(c.clone());
        }
    }
    if let Some(prev) = previous {
        for c in conditions.iter_mut() {
            if let Some(t) = prev.transitions.iter().find(|t| t.type_ == c.type_ && t.status == c.status) {
                c.last_transition_time = read_time(t.at);
            }
        }
    }
    let mut addresses = vec![];
    if !kubelet.ip.is_empty() {
        addresses.push(NodeAddress { type_: "InternalIP".into(), address: kubelet.ip.clone() });
    }
    if !info.network.host_name.is_empty() {
        addresses.push(NodeAddress { type_: "Hostname".into(), address: info.network.host_name.clone() });
    }
    let daemon_endpoints = (kubelet.port > 0)
        .then_some(NodeDaemonEndpoints { kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(kubelet.port) }) });
    NodeStatus {
        daemon_endpoints,
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        conditions: Some(conditions),
        addresses: Some(addresses),
        node_info: Some(NodeSystemInfo {
            architecture: std::env::consts::ARCH.into(),
            operating_system: "linux".into(),
            kubelet_version: info.metadata.version.clone(),
            kube_proxy_version: String::new(),
            container_runtime_version: "koupleless://".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A node status without what changes at every write (heartbeat and transition times,
/// node info), conditions by type: what [`node_status_changed`] compares.
fn comparable(s: &NodeStatus) -> NodeStatus {
    let mut s = s.clone();
    if let Some(cs) = s.conditions.as_mut() {
        for c in cs.iter_mut() {
            c.last_heartbeat_time = None;
            c.last_transition_time = None;
        }
        cs.sort_by(|x, y| x.type_.cmp(&y.type_));
    }
    s.node_info = None;
    s
}

/// Whether two node statuses differ in anything but heartbeat times.
pub fn node_status_changed(a: &NodeStatus, b: &NodeStatus) -> bool {
    comparable(a) != comparable(b)
}

fn digest_of<T: serde::Serialize>(v: &T) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(v).unwrap_or_default().hash(&mut h);
    h.finish()
}

/// What a vnode's next status is compared with and builds on, kept per base instead of the
/// status last written (kilobytes with its conditions, maps and node info): digests of what
/// [`node_status_changed`] compares — capacity and allocatable apart from the rest — and the
/// conditions' transition times.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeStatusMemo {
    /// Of everything compared but capacity and allocatable.
    digest: u64,
    /// Of capacity and allocatable.
    resources: u64,
    /// Of each condition.
    transitions: Box<[Transition]>,
}

/// A vnode condition's type and status, and when it took that status (as [`kept_time`]).
#[derive(Clone, Debug, PartialEq)]
struct Transition {
    type_: Cow<'static, str>,
    status: Cow<'static, str>,
    at: i64,
}

/// What writing a vnode's status would change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeStatusChange {
    None,
    /// Only capacity or allocatable (the base's metaspace figures, which move with every
    /// module it installs).
    Resources,
    /// Conditions, addresses, endpoints (and maybe resources).
    Other,
}

/// The figures of capacity and allocatable, and the rest of what [`node_status_changed`]
/// compares — with the names of the resources: one that appears (the base's first health
/// report) or goes is no mere change of figures.
fn split_resources(s: &NodeStatus) -> (NodeStatus, NodeStatus) {
    let mut rest = comparable(s);
    let resources =
        NodeStatus { capacity: rest.capacity.clone(), allocatable: rest.allocatable.clone(), ..Default::default() };
    let names = |m: &mut Option<BTreeMap<String, Quantity>>| {
        for q in m.iter_mut().flat_map(|m| m.values_mut()) {
            q.0.clear();
        }
    };
    names(&mut rest.capacity);
    names(&mut rest.allocatable);
    (rest, resources)
}

/// Whether a vnode's status is to be written now: at once when its conditions, addresses or
/// endpoints changed (or none was written yet); when only capacity or allocatable did, once
/// `resources_interval` has passed since the last write (`since_write`), so that a base whose
/// figures move at every health report does not make a write each time. Until then the next
/// health report asks again.
pub fn node_status_due(change: NodeStatusChange, since_write: Duration, resources_interval: Duration) -> bool {
    match change {
        NodeStatusChange::None => false,
        NodeStatusChange::Resources => since_write >= resources_interval,
        NodeStatusChange::Other => true,
    }
}

impl NodeStatusMemo {
    pub fn of(s: &NodeStatus) -> Self {
        const TYPES: [&str; 5] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"];
        const STATUSES: [&str; 3] = ["True", "False", "Unknown"];
        let (rest, resources) = split_resources(s);
        NodeStatusMemo {
            digest: digest_of(&rest),
            resources: digest_of(&resources),
            transitions: s
                .conditions
                .iter()
                .flatten()
                .map(|c| Transition {
                    type_: interned(c.type_.clone(), &TYPES),
                    status: interned(c.status.clone(), &STATUSES),
                    at: kept_time(c.last_transition_time.as_ref()),
                })
                .collect(),
        }
    }

    /// Whether `s` differs from the status remembered, as [`node_status_changed`] tells.
    pub fn changed(&self, s: &NodeStatus) -> bool {
        self.change(s) != NodeStatusChange::None
    }

    /// What `s` changes of the status remembered.
    pub fn change(&self, s: &NodeStatus) -> NodeStatusChange {
        let (rest, resources) = split_resources(s);
        if digest_of(&rest) != self.digest {
            NodeStatusChange::Other
        } else if digest_of(&resources) != self.resources {
            NodeStatusChange::Resources
        } else {
            NodeStatusChange::None
        }
    }
}

/// The whole vnode object (metadata, spec, status).
// The vnode is made of all of these: bundling them would only rename the list.
#[allow(clippy::too_many_arguments)]
pub fn build_node(
    base_id: &str,
    env: &str,
    tunnel: &str,
    info: &NodeInfo,
    kubelet: &KubeletEndpoint,
    data: Option<&NodeStatusData>,
    liveness: Liveness,
    now: Timestamp,
) -> Node {
    let mut labels = node_labels(base_id, env, tunnel, info);
    let mut annotations = BTreeMap::new();
    let mut taints = node_taints(env);
    if let Some(d) = data {
        labels.extend(d.custom_labels.clone());
        annotations.extend(d.custom_annotations.clone());
        taints.extend(d.custom_taints.clone());
    }
    Node {
        metadata: ObjectMeta {
            name: Some(node_name(base_id, env)),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        },
        spec: Some(NodeSpec { taints: Some(taints), ..Default::default() }),
        status: Some(node_status(info, kubelet, data, liveness, None, now)),
    }
}

fn time_ms(ms: i64, fallback: Timestamp) -> Time {
    Time(if ms > 0 { Timestamp::from_millisecond(ms).unwrap_or(fallback) } else { fallback })
}

/// What the controller remembers of a module container beyond the base's report: its
/// restarts, how the previous instance ended, and the back-off it waits in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Restarts {
    pub count: i32,
    pub last: Option<ContainerStateTerminated>,
    pub waiting: Option<ContainerStateWaiting>,
}

/// One container's status from the base's report of its module (`None` = not reported).
pub fn container_status(
    c: &ModuleSpec,
    data: Option<&ModuleReport>,
    restarts: Option<&Restarts>,
    now: Timestamp,
) -> ContainerStatus {
    let key = c.key();
    let (state, ready) = match data {
        None => (None, false),
        Some(d) => match d.state {
            ContainerState::Activated => (
                Some(K8sContainerState {
                    running: Some(ContainerStateRunning { started_at: Some(time_ms(d.change_time_ms, now)) }),
                    ..Default::default()
                }),
                true,
            ),
            ContainerState::Stopped => (
                Some(K8sContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 0,
                        reason: Some(if d.reason.is_empty() { "Stopped".into() } else { d.reason.to_string() }),
                        message: (!d.message.is_empty()).then(|| d.message.to_string()),
                        finished_at: Some(time_ms(d.change_time_ms, now)),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                false,
            ),
            _ => (
                Some(K8sContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(if d.reason.is_empty() {
                            d.state.as_str().to_string()
                        } else {
                            d.reason.to_string()
                        }),
                        message: Some(if d.message.is_empty() {
                            format!("module {} is {}", key, d.state.as_str())
                        } else {
                            format!("{}: {}", d.state.as_str(), d.message)
                        }),
                    }),
                    ..Default::default()
                }),
                false,
            ),
        },
    };
    let (state, ready) = match restarts.and_then(|r| r.waiting.clone()) {
        Some(w) => (Some(K8sContainerState { waiting: Some(w), ..Default::default() }), false),
        None => (state, ready),
    };
    ContainerStatus {
        name: c.name().into(),
        image: c.image().unwrap_or_default().into(),
        image_id: String::new(),
        container_id: data.map(|_| format!("koupleless://{key}")),
        ready,
        started: Some(ready),
        restart_count: restarts.map_or(0, |r| r.count),
        state,
        last_state: restarts
            .and_then(|r| r.last.clone())
            .map(|t| K8sContainerState { terminated: Some(t), ..Default::default() }),
        ..Default::default()
    }
}

const OWNED_CONDITIONS: [&str; 4] = ["PodScheduled", "Initialized", "ContainersReady", "Ready"];

/// A time as epoch seconds, what a `Time` shows (it is written to the second).
fn seconds(t: &Time) -> i64 {
    t.0.as_second()
}

fn from_seconds(s: i64) -> Option<Time> {
    Timestamp::from_second(s).ok().map(Time)
}

/// A time kept in [`PriorStatus`]: epoch seconds, [`NO_TIME`] for none (half the room of
/// an `Option<i64>`, in a record kept per pod).
const NO_TIME: i64 = i64::MIN;

fn kept_time(t: Option<&Time>) -> i64 {
    t.map_or(NO_TIME, seconds)
}

fn read_time(s: i64) -> Option<Time> {
    (s != NO_TIME).then(|| from_seconds(s)).flatten()
}

/// What a module pod's next status builds on, kept per pod instead of its last status (over
/// 2 KB with its conditions): the transition times of the conditions this controller owns,
/// the pod's other conditions, `startTime` and `qosClass`.
#[derive(Clone, Debug, PartialEq)]
pub struct PriorStatus {
    /// `lastTransitionTime` (as [`kept_time`]) of the first condition of each type of
    /// [`OWNED_CONDITIONS`] with status False (`[i][0]`) and True (`[i][1]`).
    transitions: [[i64; 2]; 4],
    /// Conditions of other types, kept as they are.
    others: Box<[PodCondition]>,
    start_time: i64,
    qos_class: Option<Cow<'static, str>>,
}

impl Default for PriorStatus {
    fn default() -> Self {
        PriorStatus::of(None)
    }
}

impl PriorStatus {
    /// What `status` (the pod's, or the one last written) leaves for the next one.
    pub fn of(status: Option<&PodStatus>) -> Self {
        let Some(s) = status else {
            return PriorStatus {
                transitions: [[NO_TIME; 2]; 4],
                others: Box::default(),
                start_time: NO_TIME,
                qos_class: None,
            };
        };
        // Some(NO_TIME): found without a time, which reads as not found.
        let mut transitions: [[Option<i64>; 2]; 4] = [[None; 2]; 4];
        let mut others = Vec::new();
        for c in s.conditions.iter().flatten() {
            let Some(i) = OWNED_CONDITIONS.iter().position(|t| *t == c.type_) else {
                others.push(c.clone());
                continue;
            };
            let j = match c.status.as_str() {
                "False" => 0,
                "True" => 1,
                _ => continue,
            };
            // The first condition of the type and status counts, as a search finds it.
            if let Some(slot) = transitions.get_mut(i).and_then(|t| t.get_mut(j)) {
                if slot.is_none() {
                    *slot = Some(kept_time(c.last_transition_time.as_ref()));
                }
            }
        }
        PriorStatus {
            transitions: transitions.map(|t| t.map(|s| s.unwrap_or(NO_TIME))),
            others: others.into_boxed_slice(),
            start_time: kept_time(s.start_time.as_ref()),
            qos_class: s.qos_class.clone().map(|q| interned(q, &["BestEffort", "Burstable", "Guaranteed"])),
        }
    }

    /// The transition time of the owned condition `type_` with status True (`ok`) or False.
    fn transition(&self, type_: &str, ok: bool) -> Option<Time> {
        let i = OWNED_CONDITIONS.iter().position(|t| *t == type_)?;
        read_time(*self.transitions.get(i)?.get(usize::from(ok))?)
    }
}

/// The module pod's status from the modules its base reports (keyed `name:version`):
/// all containers ready → Running/Ready; some started → Running, not ready; none → Pending.
/// While the base is silent (`base_alive` false) the pod is not Ready (`NodeNotReady`), as
/// Kubernetes' node lifecycle controller marks pods of a NotReady node.
/// Transition times and `startTime` are kept from the pod's current status (`prior`) when
/// unchanged. `containers` are the pod's modules, in its spec's order.
#[allow(clippy::too_many_arguments)]
pub fn pod_status<'m>(
    prior: &PriorStatus,
    containers: &[&ModuleSpec],
    modules: &dyn Fn(&str) -> Option<&'m ModuleReport>,
    restarts: &dyn Fn(&str) -> Option<Restarts>,
    host_ip: &str,
    base_alive: bool,
    now: Timestamp,
) -> PodStatus {
    let mut statuses: Vec<ContainerStatus> =
        containers.iter().map(|c| container_status(c, modules(c.key()), restarts(c.key()).as_ref(), now)).collect();
    if !base_alive {
        for s in statuses.iter_mut() {
            s.ready = false;
        }
    }
    let all_ready = !statuses.is_empty() && statuses.iter().all(|s| s.ready);
    let any_started = statuses.iter().any(|s| s.state.is_some());
    let phase = if any_started { "Running" } else { "Pending" };
    let t = Time(now);
    let cond = |type_: &str, ok: bool, reason: Option<&str>| PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.map(|r| r.to_string()),
        last_transition_time: Some(prior.transition(type_, ok).unwrap_or_else(|| t.clone())),
        ..Default::default()
    };
    let not_ready = match (all_ready, base_alive) {
        (true, _) => None,
        (false, false) => Some("NodeNotReady"),
        (false, true) => Some("ContainersNotReady"),
    };
    let mut conditions: Vec<PodCondition> = prior.others.to_vec();
    conditions.push(cond("PodScheduled", true, None));
    conditions.push(cond("Initialized", true, None));
    conditions.push(cond("ContainersReady", all_ready, not_ready));
    conditions.push(cond("Ready", all_ready, not_ready));
    let ip = (!host_ip.is_empty()).then(|| host_ip.to_string());
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        container_statuses: Some(statuses),
        host_ip: ip.clone(),
        pod_ip: ip.clone(),
        pod_ips: ip.map(|ip| vec![PodIP { ip }]),
        start_time: read_time(prior.start_time).or(Some(t)),
        qos_class: prior.qos_class.as_ref().map(|q| q.to_string()),
        ..Default::default()
    }
}

/// What this controller owns of a pod's status (transition times aside).
fn owned(s: &PodStatus) -> impl PartialEq + serde::Serialize + '_ {
    let mut conds: Vec<(&str, &str, Option<&str>)> = s
        .conditions
        .iter()
        .flatten()
        .filter(|c| OWNED_CONDITIONS.contains(&c.type_.as_str()))
        .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()))
        .collect();
    conds.sort();
    (s.phase.as_deref(), conds, s.container_statuses.as_ref(), s.host_ip.as_deref(), s.pod_ip.as_deref())
}

/// A digest of what this controller owns of a status (transition times aside): what the
/// controller remembers of a status it sent or a pod shows, so that an unchanged status is
/// not written again.
pub fn pod_status_digest(s: &PodStatus) -> u64 {
    digest_of(&owned(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::*;
    use k8s_openapi::api::core::v1::{EnvVar, Pod, PodSpec};

    /// The status of `p` with its spec's containers, the modules `modules` reports, no restarts.
    fn status_of(
        p: &Pod,
        modules: &dyn Fn(&str) -> Option<ContainerStatusData>,
        ip: &str,
        alive: bool,
        at: Timestamp,
    ) -> PodStatus {
        let specs: Vec<ModuleSpec> = p.spec.iter().flat_map(|s| s.containers.iter()).map(ModuleSpec::of).collect();
        let reports: Vec<(String, ModuleReport)> =
            specs.iter().filter_map(|c| modules(c.key())).map(|d| (d.key.clone(), ModuleReport::from(d))).collect();
        let containers: Vec<&ModuleSpec> = specs.iter().collect();
        let prior = PriorStatus::of(p.status.as_ref());
        pod_status(&prior, &containers, &|k| reports.iter().find(|r| r.0 == k).map(|r| &r.1), &|_| None, ip, alive, at)
    }

    /// The controller's kubelet endpoint the vnodes publish.
    fn kubelet() -> KubeletEndpoint {
        KubeletEndpoint { ip: "192.0.2.9".into(), port: 10250 }
    }

    fn hb() -> HeartbeatData {
        HeartbeatData {
            base_metadata: BaseMetadata {
                identity: "10.0.0.5".into(),
                version: "1.0.0".into(),
                cluster_name: "c1".into(),
                name: "base".into(),
            },
            local_ip: "10.0.0.5".into(),
            local_host_name: "host-a".into(),
            port: 1238,
            state: "ACTIVATED".into(),
        }
    }

    fn module(name: &str, version: &str) -> Container {
        Container {
            name: name.into(),
            image: Some(format!("file:///m/{name}.jar")),
            env: Some(vec![EnvVar { name: "BIZ_VERSION".into(), value: Some(version.into()), ..Default::default() }]),
            ..Default::default()
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_000).unwrap()
    }

    #[test]
    fn node_names_round_trip_with_dotted_ids() {
        assert_eq!(node_name("10.0.0.5", "dev"), "vnode.10.0.0.5.dev");
        assert_eq!(base_id_of("vnode.10.0.0.5.dev", "dev"), Some("10.0.0.5"));
        assert_eq!(base_id_of("vnode.10.0.0.5.test", "dev"), None);
        assert_eq!(base_id_of("node-1", "dev"), None);
        assert_eq!(base_id_of("vnode..dev", "dev"), None);
    }

    #[test]
    fn vnode_has_koupleless_labels_taints_and_addresses() {
        let info = heartbeat_to_node_info(&hb()).unwrap();
        let node =
            build_node("10.0.0.5", "dev", "mqtt_tunnel_provider", &info, &kubelet(), None, Liveness::Alive, now());
        let labels = node.metadata.labels.unwrap();
        assert_eq!(node.metadata.name.as_deref(), Some("vnode.10.0.0.5.dev"));
        assert_eq!(labels[LABEL_BASE_NAME], "base");
        assert_eq!(labels[LABEL_BASE_VERSION], "1.0.0");
        assert_eq!(labels[LABEL_VNODE_NAME], "base");
        assert_eq!(labels[LABEL_VNODE_VERSION], "1.0.0");
        assert_eq!(labels[LABEL_BASE_CLUSTER], "c1");
        assert_eq!(labels[LABEL_BASE_HOST], "host-a");
        assert_eq!(labels[LABEL_COMPONENT], "vnode");
        assert_eq!(labels[LABEL_ENV], "dev");
        assert_eq!(labels[LABEL_HOSTNAME], "vnode.10.0.0.5.dev");
        assert_eq!(labels[LABEL_BASE_TUNNEL_PORT], "1238");
        let taints = node.spec.unwrap().taints.unwrap();
        assert_eq!(taints.len(), 2);
        assert!(taints.iter().any(|t| t.key == TAINT_VIRTUAL_NODE && t.value.as_deref() == Some("True")));
        assert!(taints.iter().any(|t| t.key == TAINT_NODE_ENV && t.value.as_deref() == Some("dev")));
        assert!(taints.iter().all(|t| t.effect == "NoExecute"));
        let status = node.status.unwrap();
        assert_eq!(status.capacity.as_ref().unwrap()["pods"].0, "65535");
        let addrs = status.addresses.unwrap();
        assert_eq!(addrs[0].type_, "InternalIP");
        assert_eq!(addrs[0].address, "192.0.2.9", "the apiserver reaches the vnode's kubelet API at the controller");
        assert_eq!(addrs[1].type_, "Hostname");
        assert_eq!(addrs[1].address, "host-a");
        let endpoint = status.daemon_endpoints.unwrap().kubelet_endpoint.unwrap();
        assert_eq!(endpoint.port, 10250);
        let ready = status.conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "True");
    }

    #[test]
    fn heartbeat_without_identity_is_refused() {
        let mut h = hb();
        h.base_metadata.identity.clear();
        assert!(heartbeat_to_node_info(&h).is_none());
    }

    #[test]
    fn memory_comes_from_metaspace() {
        let mut h = HealthResponse { code: "SUCCESS".into(), ..Default::default() };
        h.data.health_data.jvm.max_metaspace = 1000.0;
        h.data.health_data.jvm.committed_metaspace = 300.0;
        h.data.health_data.cpu.count = 2;
        let d = health_to_status(&h).unwrap();
        assert_eq!(d.resources["memory"].capacity.0, "1000");
        assert_eq!(d.resources["memory"].allocatable.0, "700");
        assert_eq!(d.resources["cpu"].capacity.0, "2");
        let info = heartbeat_to_node_info(&hb()).unwrap();
        let s = node_status(&info, &kubelet(), Some(&d), Liveness::Alive, None, now());
        assert_eq!(s.allocatable.unwrap()["memory"].0, "700");
        h.code = "FAILED".into();
        assert!(health_to_status(&h).is_none());
    }

    #[test]
    fn silent_base_is_ready_unknown_and_only_real_changes_count() {
        let info = heartbeat_to_node_info(&hb()).unwrap();
        let alive = node_status(&info, &kubelet(), None, Liveness::Alive, None, now());
        let memo = NodeStatusMemo::of(&alive);
        let later = node_status(
            &info,
            &kubelet(),
            None,
            Liveness::Alive,
            Some(&memo),
            now().checked_add(k8s_openapi::jiff::SignedDuration::from_secs(30)).unwrap(),
        );
        assert!(!node_status_changed(&alive, &later));
        assert!(!memo.changed(&later));
        // Transition times are kept from the status remembered.
        for (a, l) in alive.conditions.iter().flatten().zip(later.conditions.iter().flatten()) {
            assert_eq!((&a.type_, &a.last_transition_time), (&l.type_, &l.last_transition_time));
        }
        let silent = node_status(&info, &kubelet(), None, Liveness::Silent, Some(&memo), now());
        assert!(node_status_changed(&alive, &silent));
        assert_eq!(memo.change(&silent), NodeStatusChange::Other);
        // The base's metaspace moved: a change of resources only.
        let mut h = HealthResponse { code: "SUCCESS".into(), ..Default::default() };
        h.data.health_data.jvm.max_metaspace = 1000.0;
        h.data.health_data.jvm.committed_metaspace = 300.0;
        let data = health_to_status(&h).unwrap();
        let with_memory = node_status(&info, &kubelet(), Some(&data), Liveness::Alive, Some(&memo), now());
        assert_eq!(memo.change(&with_memory), NodeStatusChange::Other, "memory appears");
        let memo = NodeStatusMemo::of(&with_memory);
        h.data.health_data.jvm.committed_metaspace = 400.0;
        let data = health_to_status(&h).unwrap();
        let less_memory = node_status(&info, &kubelet(), Some(&data), Liveness::Alive, Some(&memo), now());
        assert_eq!(memo.change(&less_memory), NodeStatusChange::Resources);
        assert!(memo.changed(&less_memory));
        assert_eq!(memo.change(&with_memory), NodeStatusChange::None);
        let ready = silent.conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "Unknown");
        assert_eq!(ready.reason.as_deref(), Some("NodeStatusUnknown"));
    }

    #[test]
    fn a_change_of_resources_alone_waits_for_its_interval() {
        let (second, half_minute) = (Duration::from_secs(1), Duration::from_secs(30));
        assert!(!node_status_due(NodeStatusChange::None, half_minute, half_minute));
        assert!(node_status_due(NodeStatusChange::Other, second, half_minute));
        assert!(!node_status_due(NodeStatusChange::Resources, second, half_minute));
        assert!(node_status_due(NodeStatusChange::Resources, half_minute, half_minute));
    }

    #[test]
    fn module_key_and_install_body_come_from_the_container() {
        let c = module("biz1", "0.0.1");
        assert_eq!(container_key(&c), "biz1:0.0.1");
        let m = biz_model(&c);
        assert_eq!(m.biz_url, "file:///m/biz1.jar");
        assert_eq!(m.key(), "biz1:0.0.1");
    }

    fn report(key: &str, state: ContainerState, reason: &str) -> ModuleReport {
        ModuleReport::from(csd(key, state, reason))
    }

    fn csd(key: &str, state: ContainerState, reason: &str) -> ContainerStatusData {
        ContainerStatusData {
            key: key.into(),
            name: key.split(':').next().unwrap().into(),
            pod_key: "all".into(),
            state,
            change_time_ms: 1_700_000_000_000,
            reason: reason.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn module_states_map_to_container_states() {
        let c = ModuleSpec::of(&module("biz1", "0.0.1"));
        let s = container_status(&c, Some(&report("biz1:0.0.1", ContainerState::Activated, "")), None, now());
        assert!(s.ready && s.state.as_ref().unwrap().running.is_some());
        let s =
            container_status(&c, Some(&report("biz1:0.0.1", ContainerState::Broken, "DownloadFailed")), None, now());
        assert!(!s.ready);
        let w = s.state.unwrap().waiting.unwrap();
        assert_eq!(w.reason.as_deref(), Some("DownloadFailed"));
        assert_eq!(w.message.as_deref(), Some("BROKEN: m"));
        for st in [ContainerState::Resolved, ContainerState::Deactivated] {
            let s = container_status(&c, Some(&report("biz1:0.0.1", st, "")), None, now());
            assert!(s.state.unwrap().waiting.is_some());
        }
        let s = container_status(&c, Some(&report("biz1:0.0.1", ContainerState::Stopped, "")), None, now());
        assert!(s.state.unwrap().terminated.is_some());
        let s = container_status(&c, None, None, now());
        assert!(s.state.is_none() && !s.ready);

        // Restarted twice, waiting in its back-off: the waiting state wins over the base's report.
        let r = Restarts {
            count: 2,
            last: Some(ContainerStateTerminated {
                exit_code: 1,
                reason: Some("ModuleExited".into()),
                ..Default::default()
            }),
            waiting: Some(ContainerStateWaiting { reason: Some("CrashLoopBackOff".into()), message: None }),
        };
        let s =
            container_status(&c, Some(&report("biz1:0.0.1", ContainerState::Broken, "ModuleExited")), Some(&r), now());
        assert_eq!(s.restart_count, 2);
        assert!(!s.ready);
        assert_eq!(s.state.unwrap().waiting.unwrap().reason.as_deref(), Some("CrashLoopBackOff"));
        assert_eq!(s.last_state.unwrap().terminated.unwrap().reason.as_deref(), Some("ModuleExited"));
        // Running again: the count and the last state stay.
        let r = Restarts { waiting: None, ..r };
        let s = container_status(&c, Some(&report("biz1:0.0.1", ContainerState::Activated, "")), Some(&r), now());
        assert!(s.ready && s.restart_count == 2 && s.last_state.is_some());
    }

    fn pod(containers: Vec<Container>) -> Pod {
        Pod { spec: Some(PodSpec { containers, ..Default::default() }), ..Default::default() }
    }

    fn ready_of(s: &PodStatus) -> String {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == "Ready").unwrap().status.clone()
    }

    #[test]
    fn pod_phase_follows_modules() {
        let p = pod(vec![module("a", "1"), module("b", "1")]);
        let none = status_of(&p, &|_| None, "10.0.0.5", true, now());
        assert_eq!(none.phase.as_deref(), Some("Pending"));
        let some =
            status_of(&p, &|k| (k == "a:1").then(|| csd(k, ContainerState::Activated, "")), "10.0.0.5", true, now());
        assert_eq!(some.phase.as_deref(), Some("Running"));
        assert_eq!(ready_of(&some), "False");
        let all = status_of(&p, &|k| Some(csd(k, ContainerState::Activated, "")), "10.0.0.5", true, now());
        assert_eq!(all.phase.as_deref(), Some("Running"));
        assert_eq!(ready_of(&all), "True");
        assert_eq!(all.host_ip.as_deref(), Some("10.0.0.5"));
        let silent = status_of(&p, &|k| Some(csd(k, ContainerState::Activated, "")), "10.0.0.5", false, now());
        assert_eq!(ready_of(&silent), "False");
        let reason = silent.conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap().reason;
        assert_eq!(reason.as_deref(), Some("NodeNotReady"));
    }

    #[test]
    fn unchanged_status_is_not_patched_again() {
        let mut p = pod(vec![module("a", "1")]);
        let s1 = status_of(&p, &|k| Some(csd(k, ContainerState::Activated, "")), "ip", true, now());
        p.status = Some(s1.clone());
        let later = now().checked_add(k8s_openapi::jiff::SignedDuration::from_secs(60)).unwrap();
        let s2 = status_of(&p, &|k| Some(csd(k, ContainerState::Activated, "")), "ip", true, later);
        assert_eq!(s1, s2);
        assert_eq!(pod_status_digest(&s1), pod_status_digest(&s2));
        let s3 = status_of(&p, &|k| Some(csd(k, ContainerState::Broken, "x")), "ip", true, later);
        assert_ne!(pod_status_digest(&s1), pod_status_digest(&s3));
        // The digest tells the same apart from a change, transition times aside.
        let mut s2_later = s2.clone();
        for c in s2_later.conditions.iter_mut().flatten() {
            c.last_transition_time = None;
        }
        assert_eq!(pod_status_digest(&s1), pod_status_digest(&s2_later));
        assert_ne!(pod_status_digest(&s1), pod_status_digest(&s3));
    }

    #[test]
    fn what_a_status_leaves_for_the_next_one() {
        let at = |s: i64| Some(Time(Timestamp::from_second(s).unwrap()));
        let cond = |type_: &str, status: &str, t: Option<Time>| PodCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: t,
            ..Default::default()
        };
        let mut p = pod(vec![module("a", "1")]);
        p.status = Some(PodStatus {
            conditions: Some(vec![
                cond("DisruptionTarget", "True", at(5)),
                // The first of a type and status counts; one without a time reads as none.
                cond("Ready", "False", at(10)),
                cond("Ready", "False", at(20)),
                cond("ContainersReady", "False", None),
                cond("Initialized", "Unknown", at(30)),
            ]),
            start_time: at(1),
            qos_class: Some("BestEffort".into()),
            ..Default::default()
        });
        let s = status_of(&p, &|_| None, "ip", true, now());
        let time_of =
            |t: &str| s.conditions.iter().flatten().find(|c| c.type_ == t).and_then(|c| c.last_transition_time.clone());
        assert_eq!(s.conditions.as_ref().unwrap()[0], cond("DisruptionTarget", "True", at(5)));
        assert_eq!(time_of("Ready"), at(10));
        assert_eq!(time_of("ContainersReady"), Some(Time(now())));
        assert_eq!(time_of("Initialized"), Some(Time(now())));
        assert_eq!((s.start_time, s.qos_class.as_deref()), (at(1), Some("BestEffort")));
        // No status: everything starts now.
        assert_eq!(PriorStatus::of(None), PriorStatus::default());
        p.status = None;
        assert_eq!(status_of(&p, &|_| None, "ip", true, now()).start_time, Some(Time(now())));
    }

    #[test]
    fn simple_biz_and_operations_map() {
        let v = simple_biz_to_statuses(&[SimpleBizInfo {
            name: "biz1".into(),
            version: "0.0.1".into(),
            state: "BROKEN".into(),
            latest_state_record: Some(StateRecord {
                change_time: 5,
                state: "BROKEN".into(),
                reason: "DownloadFailed".into(),
                message: "404".into(),
            }),
        }]);
        assert_eq!(v[0].key, "biz1:0.0.1");
        assert_eq!(v[0].state, ContainerState::Broken);
        assert_eq!(v[0].reason, "DownloadFailed");
        let op = BizOperationResponse {
            command: "installBiz".into(),
            biz_name: "biz1".into(),
            biz_version: "0.0.1".into(),
            response: ArkResponse { code: "SUCCESS".into(), ..Default::default() },
        };
        assert_eq!(op_response(&op).result, OperationResult::Success);
        let mut bad = op.clone();
        bad.response.code = "FAILED".into();
        bad.response.message = "download failed".into();
        let r = op_response(&bad);
        assert_eq!(r.result, OperationResult::Failure);
        assert_eq!(r.message, "download failed");
    }

    #[test]
    fn label_values_are_sanitized() {
        assert_eq!(label_value("my host!"), "my_host");
        assert_eq!(label_value("-x-"), "x");
        assert_eq!(label_value(&"a".repeat(80)).len(), 63);
    }
}
