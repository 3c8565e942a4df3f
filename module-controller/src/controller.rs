//! The module-controller's core: one actor task owns all state (bases, module pods) and
//! handles one event at a time: tunnel callbacks, the ONE module-pod watch (dispatched by
//! `spec.nodeName` to the vnode serving it) and a 1 s tick. Decisions are made here;
//! tunnel commands and API writes go out in the background ([`Writer`] coalesces them per
//! object), their results come back as events.
//!
//! Per base (vnode):
//! - heartbeat → Lease in `kube-node-lease` (holder = client id) acquired or renewed; only
//!   the holder talks to the base; a replica that cannot renew stops talking;
//! - no heartbeat for `unreachable_after` → Node `Ready=Unknown` (not deleted), so the node
//!   lifecycle controller evicts its pods; a returning base is reconciled;
//! - health → node capacity; module report → pod statuses; modules no pod owns → uninstalled.
//!
//! Per module pod: bound to an owned vnode → install; deleting → uninstall, then final
//! removal (grace 0) once the base confirms; spec change → uninstall old, install new.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use common::events::{Recorder, NORMAL, WARNING};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, EnvVar, NodeStatus, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::watcher;
use kube::ResourceExt;
use tokio::sync::mpsc;

use crate::kubeio::{self, LeaseOutcome};
use crate::mapping::{self, Liveness};
use crate::metrics::METRICS;
use crate::restart;
use crate::tunnel::{
    ContainerOperationResponse, ContainerState, ContainerStatusData, NodeInfo, NodeState, NodeStatusData,
    OperationResult, QueryBaselineRequest, Tunnel, TunnelCallbacks,
};
use crate::writer::Writer;

/// Pod watch events waiting for the controller, at most.
const POD_EVENTS: usize = 256;

/// Timers and identity.
#[derive(Clone, Debug)]
pub struct Settings {
    pub env: String,
    pub client_id: String,
    /// Vnode Lease duration (kubelet's default 40 s).
    pub lease_duration: Duration,
    /// No heartbeat for this long → Ready=Unknown (upstream: 25 s).
    pub unreachable_after: Duration,
    /// Health poll (upstream: 10 s).
    pub health_interval: Duration,
    /// Module query (upstream: 15 s).
    pub query_interval: Duration,
    /// A module still missing this long after its install was sent is installed again.
    pub install_retry: Duration,
    /// Where the vnodes say their kubelet API is (this controller's).
    pub kubelet: mapping::KubeletEndpoint,
}

impl Settings {
    pub fn new(env: &str, client_id: &str) -> Self {
        Settings {
            env: env.into(),
            client_id: client_id.into(),
            lease_duration: Duration::from_secs(40),
            unreachable_after: Duration::from_secs(25),
            health_interval: Duration::from_secs(10),
            query_interval: Duration::from_secs(15),
            install_retry: Duration::from_secs(30),
            kubelet: mapping::KubeletEndpoint::default(),
        }
    }
}

/// Everything the actor reacts to.
#[derive(Debug)]
pub enum Event {
    /// A heartbeat through tunnel number `.2`.
    NodeDiscovered(String, NodeInfo, usize),
    NodeStatus(String, NodeStatusData),
    Containers(String, Vec<ContainerStatusData>),
    StartResponse(String, ContainerOperationResponse),
    ShutdownResponse(String, ContainerOperationResponse),
    BaselineSent(String, Vec<String>),
    Lease(String, LeaseOutcome),
    NodeWritten(String, Box<NodeStatus>),
    PodApplied(Box<Pod>),
    PodDeleted(Box<Pod>),
    PodsRelist,
    PodsSynced,
    /// Writing this pod's status failed: write it again at its next refresh.
    StatusWriteFailed(String),
    Tick,
}

/// Tunnel callbacks that feed the actor.
struct Callbacks(mpsc::UnboundedSender<Event>, usize);

impl TunnelCallbacks for Callbacks {
    fn on_node_discovered(&self, id: &str, info: NodeInfo) {
        let _ = self.0.send(Event::NodeDiscovered(id.into(), info, self.1));
    }
    fn on_node_status(&self, id: &str, data: NodeStatusData) {
        let _ = self.0.send(Event::NodeStatus(id.into(), data));
    }
    fn on_all_container_status(&self, id: &str, data: Vec<ContainerStatusData>) {
        let _ = self.0.send(Event::Containers(id.into(), data));
    }
    fn on_start_container_response(&self, id: &str, resp: ContainerOperationResponse) {
        let _ = self.0.send(Event::StartResponse(id.into(), resp));
    }
    fn on_shutdown_container_response(&self, id: &str, resp: ContainerOperationResponse) {
        let _ = self.0.send(Event::ShutdownResponse(id.into(), resp));
    }
    fn on_baseline_sent(&self, id: &str, keys: Vec<String>) {
        let _ = self.0.send(Event::BaselineSent(id.into(), keys));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ownership {
    /// Not ours (or unknown); next acquire attempt not before `.0`.
    NotOwned(Instant),
    /// An acquire is in flight.
    Acquiring,
    /// Ours; Lease last renewed at `.0`.
    Owned(Instant),
}

struct Module {
    data: ContainerStatusData,
    updated: Instant,
}

struct Base {
    /// Index of the tunnel the base talks through (its latest heartbeat's).
    tunnel: usize,
    info: NodeInfo,
    status: Option<NodeStatusData>,
    last_heartbeat: Instant,
    liveness: Liveness,
    ownership: Ownership,
    renewing: bool,
    node_status: Option<NodeStatus>,
    modules: HashMap<String, Module>,
    modules_reported: bool,
    installs: HashMap<String, Instant>,
    uninstalls: HashMap<String, Instant>,
    next_health: Instant,
    last_query: Instant,
}

impl Base {
    fn owned(&self) -> bool {
        matches!(self.ownership, Ownership::Owned(_))
    }
    fn active(&self) -> bool {
        self.owned() && self.liveness == Liveness::Alive
    }
}

struct PodEntry {
    pod: Pod,
    base: String,
    /// Keys this pod's containers had when last seen (to detect updates).
    keys: Modules,
    delete_sent: bool,
    /// Each module container's restarts, by key.
    history: HashMap<String, restart::History>,
    /// The digest of the last status written ([`mapping::pod_status_digest`]; 0: none, or
    /// its write failed): a watch event that still shows an older status does not make the
    /// controller write the same status again.
    sent: u64,
    /// The digest of the status the pod shows (or was last written); `None` while it shows no
    /// container statuses. The stored pod's status keeps no container statuses: what is
    /// compared is this digest, and the rest of the status is what the next one builds on.
    current: Option<u64>,
}

impl PodEntry {
    fn deleting(&self) -> bool {
        self.pod.metadata.deletion_timestamp.is_some()
    }
}

/// The shared read-only view the baseline query uses.
type Baselines = Arc<RwLock<HashMap<String, Vec<Arc<Container>>>>>;

/// Module containers by key (`name:version`): what a base's pods want.
type Desired = BTreeMap<String, Arc<Container>>;

/// A pod's module containers in its spec's order, with their keys. Kept here only (the
/// stored pod's spec has none) and shared, not copied, with [`Desired`] and the baselines:
/// a `Container` is over a kilobyte, and copies of them (in B-tree nodes that hold room for
/// eleven) were most of the controller's memory at 10,000 pods.
#[derive(Clone, Default)]
struct Modules(Vec<(String, Arc<Container>)>);

impl Modules {
    fn of(containers: Vec<Container>) -> Self {
        Modules(containers.into_iter().map(|c| (mapping::container_key(&c), Arc::new(c))).collect())
    }
    fn get(&self, key: &str) -> Option<&Arc<Container>> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, c)| c)
    }
    fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
    fn iter(&self) -> impl Iterator<Item = (&String, &Arc<Container>)> {
        self.0.iter().map(|(k, c)| (k, c))
    }
}

/// Each vnode's arklet (`host:port` of its base's HTTP API, where a module's logs are),
/// by node name: what the kubelet API ([`crate::kubelet_api`]) reads.
pub type Arklets = Arc<RwLock<HashMap<String, String>>>;

pub struct Controller {
    client: kube::Client,
    tunnels: Vec<Arc<dyn Tunnel>>,
    settings: Settings,
    writer: Writer,
    tx: mpsc::UnboundedSender<Event>,
    bases: HashMap<String, Base>,
    /// Boxed: the table stays small as it grows (a `Pod` is large inline).
    pods: HashMap<String, Box<PodEntry>>,
    pods_by_base: HashMap<String, HashSet<String>>,
    seen_in_relist: Option<HashSet<String>>,
    synced: bool,
    baselines: Baselines,
    arklets: Arklets,
    events: Recorder,
    /// Pods with a module waiting for its restart's back-off.
    backing_off: HashSet<String>,
}

/// Seconds since the epoch.
fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// (name, namespace, uid) of a pod, as the back-off message names it.
fn pod_names(p: &Pod) -> (String, String, String) {
    (p.name_any(), p.namespace().unwrap_or_default(), p.metadata.uid.clone().unwrap_or_default())
}

/// A pod as the controller keeps it: only what it reads (names, UID, resourceVersion,
/// deletion; the containers, node and restart policy; the status), as informers that hold
/// many objects drop the rest (managedFields alone is often most of a pod's metadata).
fn kept(p: Pod) -> Pod {
    let m = p.metadata;
    Pod {
        metadata: ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            deletion_timestamp: m.deletion_timestamp,
            ..Default::default()
        },
        spec: p.spec.map(|s| PodSpec {
            containers: s.containers,
            node_name: s.node_name,
            restart_policy: s.restart_policy,
            ..Default::default()
        }),
        status: p.status,
    }
}

fn pod_key(p: &Pod) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

fn container_of(key: &str, name: &str) -> Container {
    let version = key.rsplit_once(':').map(|(_, v)| v.to_string()).unwrap_or_default();
    Container {
        name: name.to_string(),
        env: Some(vec![EnvVar { name: mapping::ENV_BIZ_VERSION.into(), value: Some(version), ..Default::default() }]),
        ..Default::default()
    }
}

impl Controller {
    /// Wire the tunnel's callbacks and the baseline query to a new controller, which keeps
    /// `arklets` current from the bases' heartbeats.
    pub fn new(
        client: kube::Client,
        tunnels: Vec<Arc<dyn Tunnel>>,
        settings: Settings,
        arklets: Arklets,
    ) -> (Self, mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let baselines: Baselines = Arc::new(RwLock::new(HashMap::new()));
        let client_for_events = client.clone();
        for (i, tunnel) in tunnels.iter().enumerate() {
            tunnel.register_callbacks(Arc::new(Callbacks(tx.clone(), i)));
            let b = baselines.clone();
            tunnel.register_query(Arc::new(move |req: QueryBaselineRequest| {
                let b = b.read().unwrap_or_else(|e| e.into_inner());
                b.get(&req.identity).map(|v| v.iter().map(|c| Container::clone(c)).collect()).unwrap_or_default()
            }));
        }
        let c = Controller {
            client,
            tunnels,
            settings,
            writer: Writer::new(64),
            tx,
            bases: HashMap::new(),
            pods: HashMap::new(),
            pods_by_base: HashMap::new(),
            seen_in_relist: None,
            synced: false,
            baselines,
            arklets,
            events: Recorder::new(client_for_events, "module-controller"),
            backing_off: HashSet::new(),
        };
        (c, rx)
    }

    /// Start the pod watch and the tick, then handle events until the channel closes.
    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Event>, ready: common::Ready) {
        kubeio::ensure_lease_namespace(&self.client).await;
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut t = tokio::time::interval(Duration::from_secs(1));
            loop {
                t.tick().await;
                if tx.send(Event::Tick).is_err() {
                    break;
                }
            }
        });
        // The pod watch's events come through a bounded channel: when pods arrive faster
        // than the controller takes them in, the watch waits (and the apiserver holds the
        // events) instead of this process queueing decoded pods without limit.
        let (pods_tx, mut pods_rx) = mpsc::channel(POD_EVENTS);
        self.spawn_pod_watch(pods_tx);
        loop {
            let ev = tokio::select! {
                Some(ev) = rx.recv() => ev,
                Some(ev) = pods_rx.recv() => ev,
                else => break,
            };
            if matches!(ev, Event::PodsSynced) {
                ready.set(true);
            }
            self.handle(ev);
        }
    }

    fn spawn_pod_watch(&self, tx: mpsc::Sender<Event>) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let cfg = watcher::Config::default().labels(&mapping::module_pod_selector());
        tokio::spawn(async move {
            let mut stream = watcher::watcher(api, cfg).boxed();
            while let Some(ev) = stream.next().await {
                let ev = match ev {
                    Ok(watcher::Event::Init) => Event::PodsRelist,
                    Ok(watcher::Event::InitApply(p)) | Ok(watcher::Event::Apply(p)) => {
                        Event::PodApplied(Box::new(kept(p)))
                    }
                    Ok(watcher::Event::InitDone) => Event::PodsSynced,
                    Ok(watcher::Event::Delete(p)) => Event::PodDeleted(Box::new(kept(p))),
                    Err(e) => {
                        tracing::warn!(error = %e, "module pod watch error");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                if tx.send(ev).await.is_err() {
                    break;
                }
            }
        });
    }

    /// Handle one event.
    pub fn handle(&mut self, ev: Event) {
        match ev {
            Event::NodeDiscovered(id, info, t) => self.on_heartbeat(id, info, t),
            Event::NodeStatus(id, data) => {
                if let Some(b) = self.bases.get_mut(&id).filter(|b| b.owned()) {
                    b.status = Some(data);
                    self.update_node_status(&id);
                }
            }
            Event::Containers(id, list) => self.on_containers(&id, list),
            Event::StartResponse(id, resp) => self.on_start_response(&id, resp),
            Event::ShutdownResponse(id, resp) => self.on_shutdown_response(&id, resp),
            Event::Lease(id, outcome) => self.on_lease(&id, outcome),
            Event::BaselineSent(id, keys) => {
                if let Some(b) = self.bases.get_mut(&id) {
                    let now = Instant::now();
                    for k in keys {
                        b.installs.insert(k, now);
                    }
                }
            }
            Event::NodeWritten(id, status) => {
                if let Some(b) = self.bases.get_mut(&id) {
                    b.node_status = Some(*status);
                }
            }
            Event::PodApplied(p) => self.on_pod(*p),
            Event::PodDeleted(p) => self.on_pod_deleted(&p),
            Event::PodsRelist => self.seen_in_relist = Some(HashSet::new()),
            Event::PodsSynced => {
                if let Some(seen) = self.seen_in_relist.take() {
                    let gone: Vec<Pod> =
                        self.pods.iter().filter(|(k, _)| !seen.contains(*k)).map(|(_, e)| e.pod.clone()).collect();
                    for p in gone {
                        self.on_pod_deleted(&p);
                    }
                }
                self.synced = true;
                let ids: Vec<String> = self.bases.keys().cloned().collect();
                for id in ids {
                    self.reconcile_base(&id);
                }
            }
            Event::StatusWriteFailed(key) => {
                if let Some(e) = self.pods.get_mut(&key) {
                    e.sent = 0;
                }
            }
            Event::Tick => self.on_tick(),
        }
    }

    // ---------- bases ----------

    /// The tunnel a base talks through.
    fn tunnel_of(&self, id: &str) -> Arc<dyn Tunnel> {
        let i = self.bases.get(id).map(|b| b.tunnel).unwrap_or(0);
        self.tunnels
            .get(i)
            .or_else(|| self.tunnels.first())
            .cloned()
            .unwrap_or_else(|| Arc::new(crate::tunnel::NoTunnel))
    }

    /// Keep [`Arklets`] current with a base's heartbeat (a lock taken to write only on change).
    fn publish_arklet(&self, id: &str, info: &NodeInfo) {
        let node = mapping::node_name(id, &self.settings.env);
        let address = (info.network.arklet_port > 0 && info.metadata.status != NodeState::Deactivated).then(|| {
            match info.network.node_ip.contains(':') {
                true => format!("[{}]:{}", info.network.node_ip, info.network.arklet_port),
                false => format!("{}:{}", info.network.node_ip, info.network.arklet_port),
            }
        });
        let current = self.arklets.read().unwrap_or_else(|e| e.into_inner()).get(&node).cloned();
        if current != address {
            let mut arklets = self.arklets.write().unwrap_or_else(|e| e.into_inner());
            match address {
                Some(a) => arklets.insert(node, a),
                None => arklets.remove(&node),
            };
        }
    }

    fn on_heartbeat(&mut self, id: String, info: NodeInfo, tunnel: usize) {
        let now = Instant::now();
        let settings = self.settings.clone();
        self.publish_arklet(&id, &info);
        let base = self.bases.entry(id.clone()).or_insert_with(|| Base {
            tunnel,
            info: info.clone(),
            status: None,
            last_heartbeat: now,
            liveness: Liveness::Alive,
            ownership: Ownership::NotOwned(now),
            renewing: false,
            node_status: None,
            modules: HashMap::new(),
            modules_reported: false,
            installs: HashMap::new(),
            uninstalls: HashMap::new(),
            next_health: now,
            last_query: now,
        });
        if info.metadata.status == NodeState::Deactivated {
            tracing::info!(base = %id, "base reports DEACTIVATED");
            if base.liveness == Liveness::Alive && base.owned() {
                base.liveness = Liveness::Silent;
                self.update_node_status(&id);
            }
            return;
        }
        let info_changed = base.info != info || base.tunnel != tunnel;
        base.tunnel = tunnel;
        base.info = info;
        base.last_heartbeat = now;
        let returning = base.liveness == Liveness::Silent;
        base.liveness = Liveness::Alive;
        match base.ownership {
            Ownership::Owned(renewed) => {
                let age = renewed.elapsed();
                if age >= settings.lease_duration {
                    // Our Lease may have been taken over while the base was silent: re-acquire
                    // before talking to it again.
                    base.ownership = Ownership::Acquiring;
                    self.spawn_lease(&id);
                } else {
                    if age >= settings.lease_duration / 4 && !base.renewing {
                        base.renewing = true;
                        self.spawn_lease(&id);
                    }
                    if returning {
                        tracing::info!(base = %id, "base is back; reconciling");
                        self.start_serving(&id);
                    } else if info_changed {
                        self.write_node(&id);
                    }
                }
            }
            Ownership::NotOwned(not_before) if now >= not_before => {
                base.ownership = Ownership::Acquiring;
                self.spawn_lease(&id);
            }
            _ => {}
        }
    }

    fn spawn_lease(&self, id: &str) {
        let client = self.client.clone();
        let name = mapping::node_name(id, &self.settings.env);
        let identity = self.settings.client_id.clone();
        let duration = self.settings.lease_duration;
        let tx = self.tx.clone();
        let id = id.to_string();
        self.writer.submit(format!("lease/{id}"), async move {
            let outcome = kubeio::acquire_or_renew_lease(&client, &name, &identity, duration).await;
            let _ = tx.send(Event::Lease(id, outcome));
        });
    }

    fn on_lease(&mut self, id: &str, outcome: LeaseOutcome) {
        let Some(base) = self.bases.get_mut(id) else { return };
        base.renewing = false;
        let was_owned = base.owned();
        let now = Instant::now();
        match outcome {
            LeaseOutcome::Held => {
                base.ownership = Ownership::Owned(now);
                if !was_owned {
                    tracing::info!(base = %id, node = %mapping::node_name(id, &self.settings.env), "serving vnode");
                    METRICS.owned_vnodes.inc();
                    self.start_serving(id);
                }
            }
            LeaseOutcome::HeldByOther => {
                base.ownership = Ownership::NotOwned(now + Duration::from_secs(2));
                if was_owned {
                    tracing::warn!(base = %id, "vnode lease taken by another replica; stopping");
                    METRICS.owned_vnodes.dec();
                    let tunnel = self.tunnel_of(id);
                    let id = id.to_string();
                    tokio::spawn(async move { tunnel.on_node_stop(&id).await });
                }
            }
            LeaseOutcome::Failed => {
                if !was_owned {
                    base.ownership = Ownership::NotOwned(now + Duration::from_secs(1));
                }
            }
        }
    }

    /// Begin (or resume) serving a base: subscribe, write the Node, ask for health and
    /// modules; installs are re-sent for whatever the next module report lacks.
    fn start_serving(&mut self, id: &str) {
        let Some(base) = self.bases.get_mut(id) else { return };
        // Installs sent moments ago (e.g. the base's own baseline) are not repeated.
        base.installs.retain(|_, t| t.elapsed() < Duration::from_secs(5));
        base.uninstalls.clear();
        base.modules_reported = false;
        base.next_health = Instant::now() + self.settings.health_interval;
        base.last_query = Instant::now();
        let tunnel = self.tunnel_of(id);
        let id_s = id.to_string();
        tokio::spawn(async move {
            tunnel.on_node_start(&id_s).await;
            let _ = tunnel.fetch_health_data(&id_s).await;
            let _ = tunnel.query_all_container_status(&id_s).await;
        });
        self.write_node(id);
    }

    fn write_node(&mut self, id: &str) {
        let Some(base) = self.bases.get(id) else { return };
        let node = mapping::build_node(
            id,
            &self.settings.env,
            self.tunnel_of(id).key(),
            &base.info,
            &self.settings.kubelet,
            base.status.as_ref(),
            base.liveness,
            Timestamp::now(),
        );
        let client = self.client.clone();
        let tx = self.tx.clone();
        let id_s = id.to_string();
        self.writer.submit(format!("node/{id}"), async move {
            match kubeio::ensure_node(&client, &node).await {
                Ok(()) => {
                    if let Some(s) = node.status {
                        let _ = tx.send(Event::NodeWritten(id_s, Box::new(s)));
                    }
                }
                Err(e) => tracing::warn!(error = %e, base = %id_s, "writing vnode"),
            }
        });
    }

    /// Patch the vnode's status if it changed.
    fn update_node_status(&mut self, id: &str) {
        let Some(base) = self.bases.get(id) else { return };
        if !base.owned() {
            return;
        }
        let status = mapping::node_status(
            &base.info,
            &self.settings.kubelet,
            base.status.as_ref(),
            base.liveness,
            base.node_status.as_ref(),
            Timestamp::now(),
        );
        if let Some(prev) = &base.node_status {
            if !mapping::node_status_changed(prev, &status) {
                return;
            }
        }
        let client = self.client.clone();
        let name = mapping::node_name(id, &self.settings.env);
        let tx = self.tx.clone();
        let id_s = id.to_string();
        self.writer.submit(format!("node/{id}"), async move {
            let patch = match kubeio::StatusPatch::new(&status) {
                Ok(p) => p,
                Err(e) => return tracing::warn!(error = %e, node = %name, "serializing a vnode's status"),
            };
            match kubeio::patch_node_status(&client, &name, &patch).await {
                Ok(()) => {
                    let _ = tx.send(Event::NodeWritten(id_s, Box::new(status)));
                }
                Err(e) => tracing::warn!(error = %e, node = %name, "patching vnode status"),
            }
        });
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        let ids: Vec<String> = self.bases.keys().cloned().collect();
        for id in ids {
            let tunnel = self.tunnel_of(&id);
            let Some(base) = self.bases.get_mut(&id) else { continue };
            if !base.owned() {
                continue;
            }
            if base.liveness == Liveness::Alive && base.last_heartbeat.elapsed() >= self.settings.unreachable_after {
                tracing::warn!(base = %id, "no heartbeat from base; marking its vnode Ready=Unknown");
                base.liveness = Liveness::Silent;
                self.update_node_status(&id);
                self.finish_deletions(&id);
                self.refresh_pods(&id);
                continue;
            }
            if base.liveness != Liveness::Alive {
                continue;
            }
            if now >= base.next_health {
                base.next_health = now + self.settings.health_interval;
                let (t, i) = (tunnel.clone(), id.clone());
                tokio::spawn(async move { t.fetch_health_data(&i).await });
            }
            if base.last_query.elapsed() >= self.settings.query_interval {
                base.last_query = now;
                let i = id.clone();
                tokio::spawn(async move { tunnel.query_all_container_status(&i).await });
            }
        }
        // Modules whose restart back-off may be over.
        let waiting: BTreeSet<String> =
            self.backing_off.iter().filter_map(|k| self.pods.get(k)).map(|e| e.base.clone()).collect();
        for id in waiting {
            self.restart_modules(&id);
            self.refresh_pods(&id);
        }
        // Deleting pods whose base nobody can reach are removed without waiting.
        let stuck: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, e)| e.deleting() && !e.delete_sent && !self.base_active_anywhere(&e.base))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stuck {
            self.delete_pod(&k);
        }
    }

    /// Whether some replica (this one, as far as it knows) is serving the base.
    fn base_active_anywhere(&self, id: &str) -> bool {
        match self.bases.get(id) {
            None => false,
            Some(b) => b.liveness == Liveness::Alive,
        }
    }

    // ---------- modules ----------

    fn on_containers(&mut self, id: &str, list: Vec<ContainerStatusData>) {
        let Some(base) = self.bases.get_mut(id).filter(|b| b.owned()) else { return };
        let now = Instant::now();
        // A module in the state already known keeps the time it was first seen in it (the
        // install's answer came first): its container's startedAt does not move.
        let mut fresh: HashMap<String, Module> = list
            .into_iter()
            .map(|mut d| {
                if let Some(known) = base.modules.get(&d.key).filter(|m| m.data.state == d.state) {
                    d.change_time_ms = known.data.change_time_ms;
                }
                (d.key.clone(), Module { data: d, updated: now })
            })
            .collect();
        // Keep what operation results told us after this report was asked for.
        let asked = base.last_query;
        for (k, m) in base.modules.drain() {
            if m.updated > asked && !fresh.contains_key(&k) {
                fresh.insert(k, m);
            }
        }
        base.modules = fresh;
        base.modules_reported = true;
        self.reconcile_base(id);
    }

    fn on_start_response(&mut self, id: &str, resp: ContainerOperationResponse) {
        let Some(base) = self.bases.get_mut(id).filter(|b| b.owned()) else { return };
        let name = resp.container_key.split(':').next().unwrap_or_default().to_string();
        let data = match resp.result {
            OperationResult::Success => ContainerStatusData {
                key: resp.container_key.clone(),
                name,
                pod_key: crate::tunnel::POD_KEY_ALL.into(),
                state: ContainerState::Activated,
                change_time_ms: crate::protocol::now_ms(),
                reason: String::new(),
                message: String::new(),
            },
            OperationResult::Failure => {
                tracing::warn!(base = %id, module = %resp.container_key, reason = %resp.reason, message = %resp.message, "module install failed");
                ContainerStatusData {
                    key: resp.container_key.clone(),
                    name,
                    pod_key: crate::tunnel::POD_KEY_ALL.into(),
                    state: ContainerState::Broken,
                    change_time_ms: crate::protocol::now_ms(),
                    reason: if resp.reason.is_empty() { "InstallFailed".into() } else { resp.reason.clone() },
                    message: resp.message.clone(),
                }
            }
        };
        let keep_time =
            base.modules.get(&resp.container_key).filter(|m| m.data.state == data.state).map(|m| m.data.change_time_ms);
        let mut data = data;
        if let Some(t) = keep_time {
            data.change_time_ms = t;
        }
        base.modules.insert(resp.container_key.clone(), Module { data, updated: Instant::now() });
        self.refresh_pods(id);
    }

    fn on_shutdown_response(&mut self, id: &str, resp: ContainerOperationResponse) {
        let Some(base) = self.bases.get_mut(id).filter(|b| b.owned()) else { return };
        if resp.result == OperationResult::Success {
            base.modules.remove(&resp.container_key);
            base.uninstalls.remove(&resp.container_key);
            base.installs.remove(&resp.container_key);
        } else {
            tracing::warn!(base = %id, module = %resp.container_key, message = %resp.message, "module uninstall failed");
        }
        self.finish_deletions(id);
        self.refresh_pods(id);
    }

    /// The modules the live pods on a base want, by key.
    fn desired(&self, id: &str) -> Desired {
        let mut out = BTreeMap::new();
        for k in self.pods_by_base.get(id).into_iter().flatten() {
            if let Some(e) = self.pods.get(k).filter(|e| !e.deleting()) {
                out.extend(e.keys.iter().map(|(k, c)| (k.clone(), c.clone())));
            }
        }
        out
    }

    fn install(&mut self, id: &str, key: &str, c: &Container, pod: &str) {
        let retry = self.settings.install_retry;
        let Some(base) = self.bases.get_mut(id).filter(|b| b.active()) else { return };
        if base.installs.get(key).is_some_and(|t| t.elapsed() < retry) {
            return;
        }
        base.installs.insert(key.to_string(), Instant::now());
        base.uninstalls.remove(key);
        tracing::info!(base = %id, module = %key, %pod, "installing module");
        if let Some(e) = self.pods.get(pod) {
            self.events.event(&e.pod, NORMAL, "Installing", format!("Installing module {key} into base {id}"));
        }
        let (tunnel, id, pod, c) = (self.tunnel_of(id), id.to_string(), pod.to_string(), c.clone());
        tokio::spawn(async move {
            if let Err(e) = tunnel.start_container(&id, &pod, &c).await {
                tracing::warn!(error = %e, base = %id, "sending installBiz");
            }
        });
    }

    fn uninstall(&mut self, id: &str, key: &str, c: &Container, pod: &str) {
        let retry = self.settings.install_retry;
        let Some(base) = self.bases.get_mut(id).filter(|b| b.active()) else { return };
        if base.uninstalls.get(key).is_some_and(|t| t.elapsed() < retry) {
            return;
        }
        base.uninstalls.insert(key.to_string(), Instant::now());
        base.installs.remove(key);
        tracing::info!(base = %id, module = %key, %pod, "uninstalling module");
        if let Some(e) = self.pods.get(pod) {
            self.events.event(&e.pod, NORMAL, "Killing", format!("Uninstalling module {key} from base {id}"));
        }
        let (tunnel, id, pod, c) = (self.tunnel_of(id), id.to_string(), pod.to_string(), c.clone());
        tokio::spawn(async move {
            if let Err(e) = tunnel.shutdown_container(&id, &pod, &c).await {
                tracing::warn!(error = %e, base = %id, "sending uninstallBiz");
            }
        });
    }

    /// Make the base's modules match its pods: install what is missing, uninstall what no
    /// pod owns (once the pod list is synced), finish pending deletions, refresh statuses.
    fn reconcile_base(&mut self, id: &str) {
        if !self.bases.get(id).is_some_and(|b| b.active() && b.modules_reported) {
            return;
        }
        let held = self.restart_modules(id);
        let Some(base) = self.bases.get(id) else { return };
        let desired = self.desired(id);
        let missing: Vec<(String, Arc<Container>)> = desired
            .iter()
            .filter(|(k, _)| !held.contains(*k))
            .filter(|(k, _)| match base.modules.get(*k) {
                None => true,
                Some(m) => matches!(m.data.state, ContainerState::Deactivated | ContainerState::Stopped),
            })
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect();
        let unowned: Vec<(String, Arc<Container>)> = if self.synced {
            base.modules
                .iter()
                .filter(|(k, _)| !desired.contains_key(*k))
                .map(|(k, m)| (k.clone(), Arc::new(container_of(k, &m.data.name))))
                .collect()
        } else {
            vec![]
        };
        for (k, c) in missing {
            self.install(id, &k, &c, "reconcile");
        }
        for (k, c) in unowned {
            self.uninstall(id, &k, &c, "none");
        }
        self.finish_deletions(id);
        self.refresh_pods(id);
    }

    /// Take in the base's reports of the modules of its pods and restart those that ended,
    /// as their pods' `restartPolicy` and back-off say (Events `Started`, `Failed`, `BackOff`).
    /// Returns the keys of ended modules not to be installed now (held by a back-off or the
    /// policy).
    fn restart_modules(&mut self, id: &str) -> HashSet<String> {
        let mut held = HashSet::new();
        let Some(base) = self.bases.get(id).filter(|b| b.active() && b.modules_reported) else { return held };
        let now = unix_now();
        let mut restarts = Vec::new();
        for pk in self.pods_by_base.get(id).into_iter().flatten() {
            let Some(e) = self.pods.get_mut(pk).filter(|e| !e.deleting()) else { continue };
            let policy = e.pod.spec.as_ref().and_then(|s| s.restart_policy.clone());
            let mut waits = false;
            for (key, c) in e.keys.iter() {
                let h = e.history.entry(key.clone()).or_default();
                match restart::observe(h, base.modules.get(key).map(|m| &m.data), now) {
                    restart::Observed::Started => {
                        self.events.event(&e.pod, NORMAL, "Started", format!("Started module {key} on base {id}"))
                    }
                    restart::Observed::Ended(end) if end.failed => self.events.event(
                        &e.pod,
                        WARNING,
                        "Failed",
                        format!("Module {key} failed on base {id}: {}: {}", end.reason, end.message),
                    ),
                    restart::Observed::Ended(_) => self.events.event(
                        &e.pod,
                        NORMAL,
                        "Uninstalled",
                        format!("Module {key} is no longer on base {id}"),
                    ),
                    restart::Observed::Nothing => {}
                }
                match restart::decide(h, policy.as_deref(), now) {
                    restart::Next::Keep => {
                        if h.pending.is_some() {
                            held.insert(key.clone());
                        }
                    }
                    restart::Next::Restart => {
                        restart::restarted(h);
                        restarts.push((key.clone(), c.clone(), pk.clone()));
                    }
                    restart::Next::BackOff { delay, .. } => {
                        held.insert(key.clone());
                        waits = true;
                        if !h.backoff_reported {
                            h.backoff_reported = true;
                            let (name, ns, uid) = pod_names(&e.pod);
                            let message = common::backoff::message(delay, &c.name, &name, &ns, &uid);
                            self.events.event(&e.pod, WARNING, "BackOff", message);
                        }
                    }
                }
            }
            if waits {
                self.backing_off.insert(pk.clone());
            } else {
                self.backing_off.remove(pk);
            }
        }
        for (key, c, pk) in restarts {
            tracing::info!(base = %id, module = %key, pod = %pk, "restarting module");
            if let Some(b) = self.bases.get_mut(id) {
                b.installs.remove(&key);
            }
            self.install(id, &key, &c, &pk);
        }
        held
    }

    /// Remove deleting pods whose modules are gone from the base (or whose base is not
    /// served any more).
    fn finish_deletions(&mut self, id: &str) {
        let active = self.bases.get(id).is_some_and(|b| b.active());
        let keys: Vec<String> = self.pods_by_base.get(id).into_iter().flatten().cloned().collect();
        let desired = self.desired(id);
        for k in keys {
            let Some(e) = self.pods.get(&k) else { continue };
            if !e.deleting() || e.delete_sent {
                continue;
            }
            let remaining: Vec<(String, Arc<Container>)> = match self.bases.get(id) {
                Some(b) if active => e
                    .keys
                    .iter()
                    .filter(|(key, _)| !desired.contains_key(*key))
                    .filter(|(key, _)| b.modules.contains_key(*key) || b.installs.contains_key(*key))
                    .map(|(key, c)| (key.clone(), c.clone()))
                    .collect(),
                _ => vec![],
            };
            if remaining.is_empty() {
                self.delete_pod(&k);
            } else {
                for (key, c) in remaining {
                    self.uninstall(id, &key, &c, &k);
                }
            }
        }
    }

    fn delete_pod(&mut self, key: &str) {
        let Some(e) = self.pods.get_mut(key) else { return };
        e.delete_sent = true;
        let ns = e.pod.namespace().unwrap_or_default();
        let name = e.pod.name_any();
        let uid = e.pod.metadata.uid.clone();
        let client = self.client.clone();
        tracing::info!(pod = %key, "modules uninstalled; removing pod");
        self.writer.submit(format!("delete/{key}"), async move {
            if let Err(e) = kubeio::delete_pod(&client, &ns, &name, uid).await {
                tracing::warn!(error = %e, pod = %name, "final pod removal");
            }
        });
    }

    /// Patch the status of every pod on the base whose status changed.
    fn refresh_pods(&mut self, id: &str) {
        let keys: Vec<String> = self.pods_by_base.get(id).into_iter().flatten().cloned().collect();
        for k in keys {
            self.refresh_pod(&k);
        }
    }

    fn refresh_pod(&mut self, key: &str) {
        let Some(e) = self.pods.get(key) else { return };
        if e.deleting() {
            return;
        }
        let Some(base) = self.bases.get(&e.base).filter(|b| b.owned()) else { return };
        let modules = |k: &str| base.modules.get(k).map(|m| m.data.clone());
        let alive = base.liveness == Liveness::Alive;
        let now = unix_now();
        let policy = e.pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
        let restarts = |k: &str| {
            let h = e.history.get(k)?;
            let waiting = match restart::decide(h, policy, now) {
                restart::Next::BackOff { delay, .. } => {
                    let (name, ns, uid) = pod_names(&e.pod);
                    let container = e.keys.get(k).map(|c| c.name.clone()).unwrap_or_default();
                    Some(restart::crash_loop(delay, &container, &name, &ns, &uid))
                }
                _ => None,
            };
            Some(mapping::Restarts { count: h.restart_count, last: restart::last_state(h), waiting })
        };
        let containers: Vec<&Container> = e.keys.iter().map(|(_, c)| &**c).collect();
        let status = mapping::pod_status(
            &e.pod,
            &containers,
            &modules,
            &restarts,
            &base.info.network.node_ip,
            alive,
            Timestamp::now(),
        );
        let any_reported = status.container_statuses.iter().flatten().any(|s| s.state.is_some());
        if !any_reported && e.current.is_none() {
            return;
        }
        let digest = mapping::pod_status_digest(&status);
        if e.current == Some(digest) || e.sent == digest {
            return;
        }
        let client = self.client.clone();
        let ns = e.pod.namespace().unwrap_or_default();
        let name = e.pod.name_any();
        let patch = match kubeio::StatusPatch::new(&status) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, pod = %name, "serializing a module pod's status");
                return;
            }
        };
        // Remember what we sent so the same status is not sent again before the watch shows it.
        if let Some(e) = self.pods.get_mut(key) {
            e.pod.status = Some(PodStatus { container_statuses: None, ..status });
            e.sent = digest;
            e.current = Some(digest);
        }
        let (tx, key) = (self.tx.clone(), key.to_string());
        self.writer.submit(format!("status/{key}"), async move {
            if let Err(e) = kubeio::patch_pod_status(&client, &ns, &name, &patch).await {
                tracing::warn!(error = %e, pod = %name, "patching module pod status");
                let _ = tx.send(Event::StatusWriteFailed(key));
            }
        });
    }

    // ---------- pods ----------

    fn on_pod(&mut self, pod: Pod) {
        let key = pod_key(&pod);
        if let Some(seen) = self.seen_in_relist.as_mut() {
            seen.insert(key.clone());
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let Some(base_id) = mapping::base_id_of(&node, &self.settings.env).map(|s| s.to_string()) else {
            // Not (yet) bound to a vnode of this env.
            if let Some(old) = self.pods.get(&key).map(|e| e.pod.clone()) {
                self.on_pod_deleted(&old);
            }
            return;
        };
        let mut pod = pod;
        let keys = Modules::of(pod.spec.as_mut().map(|s| std::mem::take(&mut s.containers)).unwrap_or_default());
        let previous = self.pods.remove(&key);
        let (old_keys, delete_sent) = match &previous {
            Some(p) => (p.keys.clone(), p.delete_sent),
            None => (Modules::default(), false),
        };
        // The restarts and the last status written of the same pod (not of an earlier one of
        // the same name).
        let same = previous.as_ref().filter(|p| p.pod.metadata.uid == pod.metadata.uid);
        let history = same.map(|p| p.history.clone()).unwrap_or_default();
        let sent = same.map_or(0, |p| p.sent);
        let mut current =
            pod.status.as_ref().filter(|s| s.container_statuses.is_some()).map(mapping::pod_status_digest);
        // Keep our last sent status if the watch has not caught up with it yet.
        if let Some(prev) = &previous {
            if pod.metadata.resource_version == prev.pod.metadata.resource_version {
                pod.status = prev.pod.status.clone();
                current = prev.current;
            }
        }
        if let Some(s) = pod.status.as_mut() {
            s.container_statuses = None;
        }
        let entry = PodEntry { pod, base: base_id.clone(), keys: keys.clone(), delete_sent, history, sent, current };
        let deleting = entry.deleting();
        self.pods.insert(key.clone(), Box::new(entry));
        self.pods_by_base.entry(base_id.clone()).or_default().insert(key.clone());
        self.update_baseline(&base_id);
        let active = self.bases.get(&base_id).is_some_and(|b| b.active());
        if deleting {
            self.finish_deletions(&base_id);
            return;
        }
        if !active {
            return;
        }
        // Update: modules removed from the pod are uninstalled before the new ones go in.
        let desired = self.desired(&base_id);
        for (k, c) in old_keys.iter().filter(|(k, _)| !keys.contains_key(k) && !desired.contains_key(*k)) {
            self.uninstall(&base_id, k, c, &key);
        }
        let reported = self.bases.get(&base_id).is_some_and(|b| b.modules_reported);
        let held = self.restart_modules(&base_id);
        for (k, c) in keys.iter().filter(|(k, _)| !held.contains(*k)) {
            let present = self.bases.get(&base_id).is_some_and(|b| b.modules.contains_key(k));
            if reported && !present {
                self.install(&base_id, k, c, &key);
            }
        }
        self.refresh_pod(&key);
    }

    fn on_pod_deleted(&mut self, pod: &Pod) {
        let key = pod_key(pod);
        let Some(entry) = self.pods.remove(&key) else { return };
        self.backing_off.remove(&key);
        if let Some(set) = self.pods_by_base.get_mut(&entry.base) {
            set.remove(&key);
        }
        self.update_baseline(&entry.base);
        // Deleted without passing through graceful deletion: uninstall what no one else needs.
        let desired = self.desired(&entry.base);
        for (k, c) in entry.keys.iter().filter(|(k, _)| !desired.contains_key(*k)) {
            let present =
                self.bases.get(&entry.base).is_some_and(|b| b.modules.contains_key(k) || b.installs.contains_key(k));
            if present {
                self.uninstall(&entry.base, k, c, &key);
            }
        }
    }

    fn update_baseline(&self, id: &str) {
        let containers: Vec<Arc<Container>> = self.desired(id).into_values().collect();
        if let Ok(mut b) = self.baselines.write() {
            b.insert(id.to_string(), containers);
        }
    }

    /// (bases known, bases owned, pods tracked) for tests and logs.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.bases.len(), self.bases.values().filter(|b| b.owned()).count(), self.pods.len())
    }
}
