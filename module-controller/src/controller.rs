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

use std::borrow::{Borrow, Cow};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use common::events::{Recorder, NORMAL, WARNING};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::mpsc;

use crate::kubeio::{self, KnownLease, LeaseOutcome};
use crate::mapping::{self, Liveness, ModuleSpec, NodeStatusChange, NodeStatusMemo, PriorStatus};
use crate::metrics::METRICS;
use crate::modulepod::{self, ModulePod, PodUpdate};
use crate::restart;
use crate::tunnel::{
    ContainerOperationResponse, ContainerState, ContainerStatusData, ModuleReport, NodeInfo, NodeState, NodeStatusData,
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
    /// A vnode status whose only change is capacity/allocatable waits this long after the
    /// last write (conditions are written at once).
    pub resources_interval: Duration,
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
            resources_interval: Duration::from_secs(30),
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
    Lease(String, LeaseOutcome, Option<KnownLease>),
    /// A vnode's status was written: what the next one is compared with.
    NodeWritten(String, Box<NodeStatusMemo>),
    PodApplied(Box<PodUpdate>),
    /// The pod (`namespace/name`) is gone.
    PodDeleted(String),
    PodsRelist,
    PodsSynced,
    /// Writing this pod's status failed: write it again at its next refresh.
    StatusWriteFailed(String),
    Tick,
}

/// What the tick asks a base for.
enum Poll {
    Health,
    Modules,
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

/// A base's module as its reports (and operation results) tell it.
struct Module {
    report: ModuleReport,
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
    /// The vnode Lease as this replica last wrote it (renewals are one write from it).
    lease: Option<KnownLease>,
    /// What the vnode's status last written leaves to compare with, and when it was written.
    node_status: Option<NodeStatusMemo>,
    node_written: Option<Instant>,
    /// By key (`name:version`).
    modules: HashMap<Box<str>, Module>,
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

/// One module container of a pod: its module (shared with the base's [`Desired`] and its
/// baseline) and its restarts.
struct PodModule {
    spec: Arc<ModuleSpec>,
    history: restart::History,
}

/// A module pod as the controller keeps it: only what it reads, in compact form (a few
/// hundred bytes where a `Pod` with one container is 5 KB before its strings).
struct PodEntry {
    /// `namespace/name`, shared with the indexes.
    key: Arc<str>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    deleting: bool,
    /// The vnode's base, shared with the other pods of the base.
    base: Arc<str>,
    restart_policy: Option<Cow<'static, str>>,
    /// Its module containers, in the spec's order.
    modules: Box<[PodModule]>,
    /// What its next status builds on: the status it shows, or the one last written.
    prior: PriorStatus,
    delete_sent: bool,
    /// The digest of the last status written ([`mapping::pod_status_digest`]; 0: none, or
    /// its write failed): a watch event that still shows an older status does not make the
    /// controller write the same status again.
    sent: u64,
    /// The digest of the status the pod shows (or was last written); `None` while it shows no
    /// container statuses.
    current: Option<u64>,
}

impl PodEntry {
    fn deleting(&self) -> bool {
        self.deleting
    }

    /// (namespace, name).
    fn names(&self) -> (&str, &str) {
        self.key.split_once('/').unwrap_or(("", &self.key))
    }

    fn module(&self, key: &str) -> Option<&PodModule> {
        self.modules.iter().find(|m| m.spec.key() == key)
    }

    /// The pod as an event's `involvedObject`.
    fn reference(&self) -> ObjectReference {
        pod_reference(&self.key, self.uid.as_deref(), self.resource_version.as_deref())
    }
}

/// The pod `namespace/name` as an event's `involvedObject`.
fn pod_reference(key: &str, uid: Option<&str>, resource_version: Option<&str>) -> ObjectReference {
    let (namespace, name) = key.split_once('/').unwrap_or(("", key));
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        uid: uid.map(Into::into),
        resource_version: resource_version.map(Into::into),
        ..Default::default()
    }
}

/// The shared read-only view the baseline query uses.
type Baselines = Arc<RwLock<HashMap<String, Vec<Arc<ModuleSpec>>>>>;

/// A module ordered and found by its key.
#[derive(Clone)]
struct Keyed(Arc<ModuleSpec>);

impl Borrow<str> for Keyed {
    fn borrow(&self) -> &str {
        self.0.key()
    }
}

impl PartialEq for Keyed {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}

impl Eq for Keyed {}

impl PartialOrd for Keyed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Keyed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.key().cmp(other.0.key())
    }
}

/// The modules a base's pods want, by key.
type Desired = BTreeSet<Keyed>;

/// Each vnode's arklet (`host:port` of its base's HTTP API, where a module's logs are),
/// by node name: what the kubelet API ([`crate::kubelet_api`]) reads.
pub type Arklets = Arc<RwLock<HashMap<String, String>>>;

pub struct Controller {
    client: kube::Client,
    tunnels: Vec<Arc<dyn Tunnel>>,
    settings: Settings,
    /// Pod writes (statuses, final removals).
    writer: Writer,
    /// Vnode writes (Leases, Nodes): apart, so that renewals never wait behind pod statuses.
    base_writer: Writer,
    tx: mpsc::UnboundedSender<Event>,
    /// Boxed: the table stays small as it grows.
    bases: HashMap<String, Box<Base>>,
    /// Boxed: the table stays small as it grows.
    pods: HashMap<Arc<str>, Box<PodEntry>>,
    pods_by_base: HashMap<Arc<str>, HashSet<Arc<str>>>,
    seen_in_relist: Option<HashSet<String>>,
    synced: bool,
    baselines: Baselines,
    arklets: Arklets,
    events: Recorder,
    /// Pods with a module waiting for its restart's back-off.
    backing_off: HashSet<Arc<str>>,
}

/// Seconds since the epoch.
fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// (name, namespace, uid) of a pod, as the back-off message names it.
fn pod_names(e: &PodEntry) -> (String, String, String) {
    let (namespace, name) = e.names();
    (name.into(), namespace.into(), e.uid.as_deref().unwrap_or_default().into())
}

/// The module of a key a base reports (`name:version`) that no pod has: enough to uninstall it.
fn unowned_module(key: &str) -> ModuleSpec {
    let (name, version) = key.split_once(':').unwrap_or((key, ""));
    ModuleSpec::new(name, version, None)
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
                b.get(&req.identity).map(|v| v.iter().map(|c| c.container()).collect()).unwrap_or_default()
            }));
        }
        let c = Controller {
            client,
            tunnels,
            settings,
            writer: Writer::new(64),
            base_writer: Writer::new(32),
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
        let api: Api<ModulePod> = Api::all(self.client.clone());
        let cfg = watcher::Config::default().labels(&mapping::module_pod_selector());
        tokio::spawn(async move {
            let mut stream = watcher::watcher(api, cfg).boxed();
            while let Some(ev) = stream.next().await {
                let ev = match ev {
                    Ok(watcher::Event::Init) => Event::PodsRelist,
                    Ok(watcher::Event::InitApply(p)) | Ok(watcher::Event::Apply(p)) => {
                        Event::PodApplied(Box::new(PodUpdate::from(p)))
                    }
                    Ok(watcher::Event::InitDone) => Event::PodsSynced,
                    Ok(watcher::Event::Delete(p)) => {
                        let m = &p.metadata;
                        Event::PodDeleted(modulepod::pod_key(
                            m.namespace.as_deref().unwrap_or_default(),
                            m.name.as_deref().unwrap_or_default(),
                        ))
                    }
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
            Event::Lease(id, outcome, lease) => self.on_lease(&id, outcome, lease),
            Event::BaselineSent(id, keys) => {
                if let Some(b) = self.bases.get_mut(&id) {
                    let now = Instant::now();
                    for k in keys {
                        b.installs.insert(k, now);
                    }
                }
            }
            Event::NodeWritten(id, memo) => {
                if let Some(b) = self.bases.get_mut(&id) {
                    b.node_status = Some(*memo);
                    b.node_written = Some(Instant::now());
                }
            }
            Event::PodApplied(p) => self.on_pod(*p),
            Event::PodDeleted(key) => self.on_pod_deleted(&key),
            Event::PodsRelist => self.seen_in_relist = Some(HashSet::new()),
            Event::PodsSynced => {
                if let Some(seen) = self.seen_in_relist.take() {
                    let gone: Vec<Arc<str>> = self.pods.keys().filter(|k| !seen.contains(&***k)).cloned().collect();
                    for k in gone {
                        self.on_pod_deleted(&k);
                    }
                }
                self.synced = true;
                let ids: Vec<String> = self.bases.keys().cloned().collect();
                for id in ids {
                    self.reconcile_base(&id);
                }
            }
            Event::StatusWriteFailed(key) => {
                if let Some(e) = self.pods.get_mut(key.as_str()) {
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
        let unchanged =
            self.arklets.read().unwrap_or_else(|e| e.into_inner()).get(&node).map(String::as_str) == address.as_deref();
        if !unchanged {
            let mut arklets = self.arklets.write().unwrap_or_else(|e| e.into_inner());
            match address {
                Some(a) => arklets.insert(node, a),
                None => arklets.remove(&node),
            };
        }
    }

    fn on_heartbeat(&mut self, id: String, info: NodeInfo, tunnel: usize) {
        let now = Instant::now();
        let lease_duration = self.settings.lease_duration;
        self.publish_arklet(&id, &info);
        let base = self.bases.entry(id.clone()).or_insert_with(|| {
            Box::new(Base {
                tunnel,
                info: info.clone(),
                status: None,
                last_heartbeat: now,
                liveness: Liveness::Alive,
                ownership: Ownership::NotOwned(now),
                renewing: false,
                lease: None,
                node_status: None,
                node_written: None,
                modules: HashMap::new(),
                modules_reported: false,
                installs: HashMap::new(),
                uninstalls: HashMap::new(),
                next_health: now,
                last_query: now,
            })
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
                if age >= lease_duration {
                    // Our Lease may have been taken over while the base was silent: re-acquire
                    // before talking to it again.
                    base.ownership = Ownership::Acquiring;
                    self.spawn_lease(&id);
                } else {
                    if age >= lease_duration / 4 && !base.renewing {
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

    fn spawn_lease(&mut self, id: &str) {
        let client = self.client.clone();
        let name = mapping::node_name(id, &self.settings.env);
        let identity = self.settings.client_id.clone();
        let duration = self.settings.lease_duration;
        let tx = self.tx.clone();
        // The Lease last written goes with the attempt and comes back with its outcome.
        let last = self.bases.get_mut(id).and_then(|b| b.lease.take());
        let id = id.to_string();
        self.base_writer.submit(format!("lease/{id}"), move || async move {
            let (outcome, lease) = kubeio::acquire_or_renew_lease(&client, &name, &identity, duration, last).await;
            let _ = tx.send(Event::Lease(id, outcome, lease));
        });
    }

    fn on_lease(&mut self, id: &str, outcome: LeaseOutcome, lease: Option<KnownLease>) {
        let Some(base) = self.bases.get_mut(id) else { return };
        base.renewing = false;
        base.lease = lease;
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
        self.base_writer.submit(format!("node/{id}"), move || async move {
            match kubeio::ensure_node(&client, &node).await {
                Ok(()) => {
                    if let Some(s) = &node.status {
                        let _ = tx.send(Event::NodeWritten(id_s, Box::new(NodeStatusMemo::of(s))));
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
        let change = base.node_status.as_ref().map_or(NodeStatusChange::Other, |prev| prev.change(&status));
        let since_write = base.node_written.map_or(Duration::MAX, |t| t.elapsed());
        if !mapping::node_status_due(change, since_write, self.settings.resources_interval) {
            return;
        }
        let client = self.client.clone();
        let name = mapping::node_name(id, &self.settings.env);
        let tx = self.tx.clone();
        let id_s = id.to_string();
        let patch = match kubeio::StatusPatch::new(&status) {
            Ok(p) => p,
            Err(e) => return tracing::warn!(error = %e, node = %name, "serializing a vnode's status"),
        };
        let memo = Box::new(NodeStatusMemo::of(&status));
        self.base_writer.submit(format!("node/{id}"), move || async move {
            match kubeio::patch_node_status(&client, &name, &patch).await {
                Ok(()) => {
                    let _ = tx.send(Event::NodeWritten(id_s, memo));
                }
                Err(e) => tracing::warn!(error = %e, node = %name, "patching vnode status"),
            }
        });
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        let mut polls: Vec<(Arc<dyn Tunnel>, String, Poll)> = Vec::new();
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
                polls.push((tunnel.clone(), id.clone(), Poll::Health));
            }
            if base.last_query.elapsed() >= self.settings.query_interval {
                base.last_query = now;
                polls.push((tunnel, id, Poll::Modules));
            }
        }
        // The tick's polls go out from one task, not one task per base.
        if !polls.is_empty() {
            tokio::spawn(futures::future::join_all(polls.into_iter().map(|(tunnel, id, poll)| async move {
                let sent = match poll {
                    Poll::Health => tunnel.fetch_health_data(&id).await,
                    Poll::Modules => tunnel.query_all_container_status(&id).await,
                };
                if let Err(e) = sent {
                    tracing::debug!(error = %e, base = %id, "polling base");
                }
            })));
        }
        // Modules whose restart back-off may be over.
        let waiting: BTreeSet<Arc<str>> =
            self.backing_off.iter().filter_map(|k| self.pods.get(k)).map(|e| e.base.clone()).collect();
        for id in waiting {
            self.restart_modules(&id);
            self.refresh_pods(&id);
        }
        // Deleting pods whose base nobody can reach are removed without waiting.
        let stuck: Vec<Arc<str>> = self
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
        let mut fresh: HashMap<Box<str>, Module> = list
            .into_iter()
            .map(|d| {
                let key: Box<str> = d.key.as_str().into();
                let mut report = ModuleReport::from(d);
                if let Some(known) = base.modules.get(&key).filter(|m| m.report.state == report.state) {
                    report.change_time_ms = known.report.change_time_ms;
                }
                (key, Module { report, updated: now })
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
        let mut report = match resp.result {
            OperationResult::Success => ModuleReport {
                state: ContainerState::Activated,
                change_time_ms: crate::protocol::now_ms(),
                reason: "".into(),
                message: "".into(),
            },
            OperationResult::Failure => {
                tracing::warn!(base = %id, module = %resp.container_key, reason = %resp.reason, message = %resp.message, "module install failed");
                ModuleReport {
                    state: ContainerState::Broken,
                    change_time_ms: crate::protocol::now_ms(),
                    reason: if resp.reason.is_empty() { "InstallFailed".into() } else { resp.reason.as_str().into() },
                    message: resp.message.as_str().into(),
                }
            }
        };
        let key = resp.container_key.as_str();
        if let Some(known) = base.modules.get(key).filter(|m| m.report.state == report.state) {
            report.change_time_ms = known.report.change_time_ms;
        }
        base.modules.insert(key.into(), Module { report, updated: Instant::now() });
        // Only the statuses of the pods with this module can change.
        self.refresh_pods_with(id, &resp.container_key);
    }

    fn on_shutdown_response(&mut self, id: &str, resp: ContainerOperationResponse) {
        let Some(base) = self.bases.get_mut(id).filter(|b| b.owned()) else { return };
        if resp.result == OperationResult::Success {
            base.modules.remove(resp.container_key.as_str());
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
        let mut out = BTreeSet::new();
        for k in self.pods_by_base.get(id).into_iter().flatten() {
            if let Some(e) = self.pods.get(k).filter(|e| !e.deleting()) {
                out.extend(e.modules.iter().map(|m| Keyed(m.spec.clone())));
            }
        }
        out
    }

    fn install(&mut self, id: &str, c: &ModuleSpec, pod: &str) {
        let retry = self.settings.install_retry;
        let key = c.key();
        let Some(base) = self.bases.get_mut(id).filter(|b| b.active()) else { return };
        if base.installs.get(key).is_some_and(|t| t.elapsed() < retry) {
            return;
        }
        base.installs.insert(key.to_string(), Instant::now());
        base.uninstalls.remove(key);
        tracing::info!(base = %id, module = %key, %pod, "installing module");
        if let Some(e) = self.pods.get(pod) {
            self.events.event_on(
                e.reference(),
                NORMAL,
                "Installing",
                format!("Installing module {key} into base {id}"),
            );
        }
        let (tunnel, id, pod, c) = (self.tunnel_of(id), id.to_string(), pod.to_string(), c.container());
        tokio::spawn(async move {
            if let Err(e) = tunnel.start_container(&id, &pod, &c).await {
                tracing::warn!(error = %e, base = %id, "sending installBiz");
            }
        });
    }

    fn uninstall(&mut self, id: &str, c: &ModuleSpec, pod: &str) {
        let retry = self.settings.install_retry;
        let key = c.key();
        let Some(base) = self.bases.get_mut(id).filter(|b| b.active()) else { return };
        if base.uninstalls.get(key).is_some_and(|t| t.elapsed() < retry) {
            return;
        }
        base.uninstalls.insert(key.to_string(), Instant::now());
        base.installs.remove(key);
        tracing::info!(base = %id, module = %key, %pod, "uninstalling module");
        if let Some(e) = self.pods.get(pod) {
            self.events.event_on(e.reference(), NORMAL, "Killing", format!("Uninstalling module {key} from base {id}"));
        }
        let (tunnel, id, pod, c) = (self.tunnel_of(id), id.to_string(), pod.to_string(), c.container());
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
        let missing: Vec<Arc<ModuleSpec>> = desired
            .iter()
            .filter(|m| !held.contains(m.0.key()))
            .filter(|m| match base.modules.get(m.0.key()) {
                None => true,
                Some(m) => matches!(m.report.state, ContainerState::Deactivated | ContainerState::Stopped),
            })
            .map(|m| m.0.clone())
            .collect();
        let unowned: Vec<ModuleSpec> = if self.synced {
            base.modules.iter().filter(|(k, _)| !desired.contains(&***k)).map(|(k, _)| unowned_module(k)).collect()
        } else {
            vec![]
        };
        for c in missing {
            self.install(id, &c, "reconcile");
        }
        for c in unowned {
            self.uninstall(id, &c, "none");
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
            let e: &mut PodEntry = e;
            let mut waits = false;
            for m in e.modules.iter_mut() {
                let (key, h) = (m.spec.key(), &mut m.history);
                // `e` is borrowed for its module: the event names the pod from its other fields.
                let event = |type_: &str, reason: &str, message: String| {
                    let involved = pod_reference(&e.key, e.uid.as_deref(), e.resource_version.as_deref());
                    self.events.event_on(involved, type_, reason, message);
                };
                match restart::observe(h, base.modules.get(key).map(|m| &m.report), now) {
                    restart::Observed::Started => {
                        event(NORMAL, "Started", format!("Started module {key} on base {id}"))
                    }
                    restart::Observed::Ended(end) if end.failed => event(
                        WARNING,
                        "Failed",
                        format!("Module {key} failed on base {id}: {}: {}", end.reason, end.message),
                    ),
                    restart::Observed::Ended(_) => {
                        event(NORMAL, "Uninstalled", format!("Module {key} is no longer on base {id}"))
                    }
                    restart::Observed::Nothing => {}
                }
                match restart::decide(h, e.restart_policy.as_deref(), now) {
                    restart::Next::Keep => {
                        if h.pending.is_some() {
                            held.insert(key.to_string());
                        }
                    }
                    restart::Next::Restart => {
                        restart::restarted(h);
                        restarts.push((m.spec.clone(), pk.clone()));
                    }
                    restart::Next::BackOff { delay, .. } => {
                        held.insert(key.to_string());
                        waits = true;
                        if !h.backoff_reported {
                            h.backoff_reported = true;
                            let (namespace, name) = e.key.split_once('/').unwrap_or(("", &e.key));
                            let uid = e.uid.as_deref().unwrap_or_default();
                            let message = common::backoff::message(delay, m.spec.name(), name, namespace, uid);
                            event(WARNING, "BackOff", message);
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
        for (c, pk) in restarts {
            tracing::info!(base = %id, module = %c.key(), pod = %pk, "restarting module");
            if let Some(b) = self.bases.get_mut(id) {
                b.installs.remove(c.key());
            }
            self.install(id, &c, &pk);
        }
        held
    }

    /// Remove deleting pods whose modules are gone from the base (or whose base is not
    /// served any more).
    fn finish_deletions(&mut self, id: &str) {
        let active = self.bases.get(id).is_some_and(|b| b.active());
        let keys: Vec<Arc<str>> = self.pods_by_base.get(id).into_iter().flatten().cloned().collect();
        let desired = self.desired(id);
        for k in keys {
            let Some(e) = self.pods.get(&k) else { continue };
            if !e.deleting() || e.delete_sent {
                continue;
            }
            let remaining: Vec<Arc<ModuleSpec>> = match self.bases.get(id) {
                Some(b) if active => e
                    .modules
                    .iter()
                    .map(|m| &m.spec)
                    .filter(|c| !desired.contains(c.key()))
                    .filter(|c| b.modules.contains_key(c.key()) || b.installs.contains_key(c.key()))
                    .cloned()
                    .collect(),
                _ => vec![],
            };
            if remaining.is_empty() {
                self.delete_pod(&k);
            } else {
                for c in remaining {
                    self.uninstall(id, &c, &k);
                }
            }
        }
    }

    fn delete_pod(&mut self, key: &str) {
        let Some(e) = self.pods.get_mut(key) else { return };
        e.delete_sent = true;
        let (ns, name) = e.names();
        let (ns, name) = (ns.to_string(), name.to_string());
        let uid = e.uid.as_deref().map(String::from);
        let client = self.client.clone();
        tracing::info!(pod = %key, "modules uninstalled; removing pod");
        self.writer.submit(format!("delete/{key}"), move || async move {
            if let Err(e) = kubeio::delete_pod(&client, &ns, &name, uid).await {
                tracing::warn!(error = %e, pod = %name, "final pod removal");
            }
        });
    }

    /// Patch the status of every pod on the base whose status changed.
    fn refresh_pods(&mut self, id: &str) {
        let keys: Vec<Arc<str>> = self.pods_by_base.get(id).into_iter().flatten().cloned().collect();
        for k in keys {
            self.refresh_pod(&k);
        }
    }

    /// Patch the status of the pods on the base that have the module `module` (a key).
    fn refresh_pods_with(&mut self, id: &str, module: &str) {
        let keys: Vec<Arc<str>> = self
            .pods_by_base
            .get(id)
            .into_iter()
            .flatten()
            .filter(|k| self.pods.get(*k).is_some_and(|e| e.module(module).is_some()))
            .cloned()
            .collect();
        for k in keys {
            self.refresh_pod(&k);
        }
    }

    fn refresh_pod(&mut self, key: &str) {
        let Some(e) = self.pods.get(key) else { return };
        if e.deleting() {
            return;
        }
        let Some(base) = self.bases.get(&*e.base).filter(|b| b.owned()) else { return };
        let modules = |k: &str| base.modules.get(k).map(|m| &m.report);
        let alive = base.liveness == Liveness::Alive;
        let now = unix_now();
        let policy = e.restart_policy.as_deref();
        let restarts = |k: &str| {
            let m = e.module(k)?;
            let h = &m.history;
            let waiting = match restart::decide(h, policy, now) {
                restart::Next::BackOff { delay, .. } => {
                    let (name, ns, uid) = pod_names(e);
                    Some(restart::crash_loop(delay, m.spec.name(), &name, &ns, &uid))
                }
                _ => None,
            };
            Some(mapping::Restarts { count: h.restart_count, last: restart::last_state(h), waiting })
        };
        let containers: Vec<&ModuleSpec> = e.modules.iter().map(|m| &*m.spec).collect();
        let status = mapping::pod_status(
            &e.prior,
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
        let (ns, name) = e.names();
        let (ns, name) = (ns.to_string(), name.to_string());
        let patch = match kubeio::StatusPatch::new(&status) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, pod = %name, "serializing a module pod's status");
                return;
            }
        };
        // Remember what we sent so the same status is not sent again before the watch shows it.
        if let Some(e) = self.pods.get_mut(key) {
            e.prior = PriorStatus::of(Some(&status));
            e.sent = digest;
            e.current = Some(digest);
        }
        let (tx, key) = (self.tx.clone(), key.to_string());
        self.writer.submit(format!("status/{key}"), move || async move {
            if let Err(e) = kubeio::patch_pod_status(&client, &ns, &name, &patch).await {
                tracing::warn!(error = %e, pod = %name, "patching module pod status");
                let _ = tx.send(Event::StatusWriteFailed(key));
            }
        });
    }

    // ---------- pods ----------

    /// The base id shared by the pods of the base (the index's key when it has one).
    fn shared_base_id(&self, id: &str) -> Arc<str> {
        self.pods_by_base.get_key_value(id).map(|(k, _)| k.clone()).unwrap_or_else(|| id.into())
    }

    fn on_pod(&mut self, pod: PodUpdate) {
        let PodUpdate { key, uid, resource_version, deleting, node_name, restart_policy, modules, prior, digest } = pod;
        if let Some(seen) = self.seen_in_relist.as_mut() {
            seen.insert(key.clone());
        }
        let node = node_name.unwrap_or_default();
        let Some(base_id) = mapping::base_id_of(&node, &self.settings.env) else {
            // Not (yet) bound to a vnode of this env.
            if self.pods.contains_key(key.as_str()) {
                self.on_pod_deleted(&key);
            }
            return;
        };
        let base_id = self.shared_base_id(base_id);
        let previous = self.pods.remove(key.as_str());
        let key: Arc<str> = previous.as_ref().map(|p| p.key.clone()).unwrap_or_else(|| key.into());
        let delete_sent = previous.as_ref().is_some_and(|p| p.delete_sent);
        let old_modules: Vec<Arc<ModuleSpec>> =
            previous.iter().flat_map(|p| p.modules.iter()).map(|m| m.spec.clone()).collect();
        // The restarts and the last status written of the same pod (not of an earlier one of
        // the same name).
        let same = previous.as_ref().filter(|p| p.uid == uid);
        let modules: Box<[PodModule]> = modules
            .into_iter()
            .map(|spec| {
                // An unchanged module stays shared (with the base's desired modules and baseline).
                let spec = match old_modules.iter().find(|m| ***m == spec) {
                    Some(m) => m.clone(),
                    None => Arc::new(spec),
                };
                let history = same.and_then(|p| p.module(spec.key())).map(|m| m.history.clone()).unwrap_or_default();
                PodModule { spec, history }
            })
            .collect();
        let sent = same.map_or(0, |p| p.sent);
        // What the base's baseline is made of: whether the pod wants the same modules as before.
        let wants_same = previous.as_ref().is_some_and(|p| {
            p.deleting == deleting
                && p.base == base_id
                && p.modules.len() == modules.len()
                && p.modules.iter().zip(modules.iter()).all(|(a, b)| Arc::ptr_eq(&a.spec, &b.spec))
        });
        let (mut prior, mut current) = (prior, digest);
        // Keep our last sent status if the watch has not caught up with it yet.
        if let Some(prev) = previous {
            if resource_version == prev.resource_version {
                prior = prev.prior;
                current = prev.current;
            }
        }
        let entry = PodEntry {
            key: key.clone(),
            uid,
            resource_version,
            deleting,
            base: base_id.clone(),
            restart_policy,
            modules,
            prior,
            delete_sent,
            sent,
            current,
        };
        let new_keys: Vec<Arc<ModuleSpec>> = entry.modules.iter().map(|m| m.spec.clone()).collect();
        self.pods.insert(key.clone(), Box::new(entry));
        self.pods_by_base.entry(base_id.clone()).or_default().insert(key.clone());
        if !wants_same {
            self.update_baseline(&base_id);
        }
        let active = self.bases.get(&*base_id).is_some_and(|b| b.active());
        if deleting {
            self.finish_deletions(&base_id);
            return;
        }
        if !active {
            return;
        }
        // Update: modules removed from the pod are uninstalled before the new ones go in.
        let desired = self.desired(&base_id);
        for c in old_modules.iter().filter(|c| !new_keys.iter().any(|n| n.key() == c.key())) {
            if !desired.contains(c.key()) {
                self.uninstall(&base_id, c, &key);
            }
        }
        let reported = self.bases.get(&*base_id).is_some_and(|b| b.modules_reported);
        let held = self.restart_modules(&base_id);
        for c in new_keys.iter().filter(|c| !held.contains(c.key())) {
            let present = self.bases.get(&*base_id).is_some_and(|b| b.modules.contains_key(c.key()));
            if reported && !present {
                self.install(&base_id, c, &key);
            }
        }
        self.refresh_pod(&key);
    }

    fn on_pod_deleted(&mut self, key: &str) {
        let Some(entry) = self.pods.remove(key) else { return };
        self.backing_off.remove(key);
        if let Some(set) = self.pods_by_base.get_mut(&entry.base) {
            set.remove(key);
            if set.is_empty() {
                self.pods_by_base.remove(&entry.base);
            }
        }
        self.update_baseline(&entry.base);
        // Deleted without passing through graceful deletion: uninstall what no one else needs.
        let desired = self.desired(&entry.base);
        for c in entry.modules.iter().map(|m| &m.spec).filter(|c| !desired.contains(c.key())) {
            let present = self
                .bases
                .get(&*entry.base)
                .is_some_and(|b| b.modules.contains_key(c.key()) || b.installs.contains_key(c.key()));
            if present {
                self.uninstall(&entry.base, c, key);
            }
        }
    }

    fn update_baseline(&self, id: &str) {
        let modules: Vec<Arc<ModuleSpec>> = self.desired(id).into_iter().map(|m| m.0).collect();
        if let Ok(mut b) = self.baselines.write() {
            if modules.is_empty() {
                b.remove(id);
            } else {
                b.insert(id.to_string(), modules);
            }
        }
    }

    /// (bases known, bases owned, pods tracked) for tests and logs.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.bases.len(), self.bases.values().filter(|b| b.owned()).count(), self.pods.len())
    }
}
