//! The I/O shell: one watch on pods and one on nodes feed the [`Cache`] and the
//! [`SchedulingQueue`]; the scheduling loop pops a pod, runs the pure decision
//! [`framework::schedule`] on the cache's snapshot, assumes the pod and binds it through
//! `pods/binding` concurrently (binding is I/O), or records why it fits nowhere
//! (`PodScheduled=False` and a `FailedScheduling` event).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::events::{Recorder, NORMAL, WARNING};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Binding, Node, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, PodCondition,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use rand::SeedableRng;
use tokio::sync::Semaphore;

use crate::cache::{Cache, ASSUMED_POD_TTL};
use crate::config::Profiles;
use crate::framework::{self, NodeData, PodInfo, ProfileState};
use crate::queue::SchedulingQueue;

/// The scheduler's Prometheus metrics (kube-scheduler's names).
#[derive(Clone)]
pub struct Metrics {
    pub attempts: IntCounterVec,
    pub attempt_duration: HistogramVec,
    pub pending: IntGaugeVec,
    pub binds: IntCounterVec,
}

impl Metrics {
    pub fn new(registry: &Registry) -> anyhow::Result<Self> {
        let attempts = IntCounterVec::new(
            Opts::new("scheduler_schedule_attempts_total", "Number of attempts to schedule pods, by the result."),
            &["result", "profile"],
        )?;
        let attempt_duration = HistogramVec::new(
            HistogramOpts::new(
                "scheduler_scheduling_attempt_duration_seconds",
                "Scheduling attempt latency in seconds (scheduling algorithm + binding)",
            )
            .buckets(prometheus::exponential_buckets(0.0001, 2.0, 16)?),
            &["result", "profile"],
        )?;
        let pending = IntGaugeVec::new(
            Opts::new("scheduler_pending_pods", "Number of pending pods, by the queue type."),
            &["queue"],
        )?;
        let binds = IntCounterVec::new(
            Opts::new("scheduler_bindings_total", "Bindings sent to the apiserver, by result."),
            &["result"],
        )?;
        registry.register(Box::new(attempts.clone()))?;
        registry.register(Box::new(attempt_duration.clone()))?;
        registry.register(Box::new(pending.clone()))?;
        registry.register(Box::new(binds.clone()))?;
        Ok(Metrics { attempts, attempt_duration, pending, binds })
    }
}

/// State shared by the watch handlers, the scheduling loop and the binders.
pub struct Scheduler {
    client: kube::Client,
    pub cache: Mutex<Cache>,
    pub queue: SchedulingQueue,
    profiles: Profiles,
    states: Mutex<HashMap<String, ProfileState>>,
    metrics: Metrics,
    events: Recorder,
    binds: Arc<Semaphore>,
    synced: (tokio::sync::watch::Sender<bool>, tokio::sync::watch::Sender<bool>),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which unschedulable pods an assigned pod appearing could help: those rejected by
/// pod (anti-)affinity or topology spread (kube's `AssignedPodAdd` queueing hints).
fn helped_by_new_pod(plugins: &[&'static str]) -> bool {
    plugins.iter().any(|p| *p == "InterPodAffinity" || *p == "PodTopologySpread")
}

impl Scheduler {
    pub fn new(client: kube::Client, profiles: Profiles, metrics: Metrics) -> Arc<Self> {
        Arc::new(Scheduler {
            events: Recorder::new(client.clone(), "default-scheduler"),
            client,
            cache: Mutex::new(Cache::default()),
            queue: SchedulingQueue::default(),
            binds: Arc::new(Semaphore::new(profiles.parallelism)),
            profiles,
            states: Mutex::new(HashMap::new()),
            metrics,
            synced: (tokio::sync::watch::channel(false).0, tokio::sync::watch::channel(false).0),
        })
    }

    /// Run the watches and the scheduling loop until an error ends a task. `ready` flips
    /// once both caches have synced.
    pub async fn run(self: Arc<Self>, ready: common::Ready) -> anyhow::Result<()> {
        let pods = tokio::spawn(self.clone().watch_pods());
        let nodes = tokio::spawn(self.clone().watch_nodes());
        let housekeeping = tokio::spawn(self.clone().housekeeping());
        let mut a = self.synced.0.subscribe();
        let mut b = self.synced.1.subscribe();
        a.wait_for(|v| *v).await?;
        b.wait_for(|v| *v).await?;
        tracing::info!("caches synced; scheduling");
        ready.set(true);
        let sched = tokio::spawn(self.clone().schedule_loop());
        tokio::select! {
            r = pods => r?,
            r = nodes => r?,
            r = housekeeping => r?,
            r = sched => r?,
        }
    }

    fn responsible(&self, pod: &PodInfo) -> bool {
        self.profiles.get(&pod.scheduler_name).is_some()
    }

    /// Apply one pod from the watch to cache and queue.
    pub fn on_pod(&self, pod: Pod) {
        let info = Arc::new(PodInfo::new(Arc::new(pod)));
        let key = info.key();
        if !info.node_name.is_empty() {
            self.queue.with(|q| q.delete(&key));
            let newly = lock(&self.cache).upsert_pod(info.clone());
            if newly || info.terminal {
                let now = Instant::now();
                if info.terminal {
                    self.queue.with(|q| q.move_all(now, |_| true));
                } else {
                    self.queue.with(|q| q.move_all(now, helped_by_new_pod));
                }
            }
            return;
        }
        if lock(&self.cache).is_assumed(&key) {
            return; // bound by us; the watch will show the binding
        }
        if info.terminating || info.terminal || info.gated || !self.responsible(&info) {
            self.queue.with(|q| q.delete(&key));
            return;
        }
        self.queue.with(|q| q.add(info));
    }

    pub fn on_pod_deleted(&self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        self.queue.with(|q| q.delete(&key));
        if lock(&self.cache).delete_pod(namespace, name) {
            self.queue.with(|q| q.move_all(Instant::now(), |_| true));
        }
    }

    pub fn on_node(&self, node: &Node) {
        let data = NodeData::new(node);
        if lock(&self.cache).upsert_node(data) {
            self.queue.with(|q| q.move_all(Instant::now(), |_| true));
        }
    }

    async fn watch_pods(self: Arc<Self>) -> anyhow::Result<()> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        let mut seen: Option<HashSet<String>> = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(p)) => self.on_pod(p),
                Ok(watcher::Event::Delete(p)) => self.on_pod_deleted(
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                    p.metadata.name.as_deref().unwrap_or_default(),
                ),
                Ok(watcher::Event::Init) => seen = Some(HashSet::new()),
                Ok(watcher::Event::InitApply(p)) => {
                    if let Some(s) = seen.as_mut() {
                        s.insert(format!(
                            "{}/{}",
                            p.metadata.namespace.as_deref().unwrap_or("default"),
                            p.metadata.name.as_deref().unwrap_or_default()
                        ));
                    }
                    self.on_pod(p)
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(s) = seen.take() {
                        let gone: Vec<String> =
                            lock(&self.cache).confirmed_keys().into_iter().filter(|k| !s.contains(k)).collect();
                        for k in gone {
                            let (ns, n) = k.split_once('/').unwrap_or(("", &k));
                            self.on_pod_deleted(ns, n);
                        }
                    }
                    self.synced.0.send_replace(true);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pod watch error; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        anyhow::bail!("pod watch ended")
    }

    async fn watch_nodes(self: Arc<Self>) -> anyhow::Result<()> {
        let api: Api<Node> = Api::all(self.client.clone());
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        let mut seen: Option<HashSet<String>> = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(n)) => self.on_node(&n),
                Ok(watcher::Event::Delete(n)) => {
                    lock(&self.cache).delete_node(n.metadata.name.as_deref().unwrap_or_default())
                }
                Ok(watcher::Event::Init) => seen = Some(HashSet::new()),
                Ok(watcher::Event::InitApply(n)) => {
                    if let Some(s) = seen.as_mut() {
                        s.insert(n.metadata.name.clone().unwrap_or_default());
                    }
                    self.on_node(&n)
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(s) = seen.take() {
                        let mut c = lock(&self.cache);
                        for n in c.node_names().into_iter().filter(|n| !s.contains(n)) {
                            c.delete_node(&n);
                        }
                    }
                    self.synced.1.send_replace(true);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "node watch error; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        anyhow::bail!("node watch ended")
    }

    /// Periodic work: expire unconfirmed assumptions, retry long-unschedulable pods,
    /// publish queue sizes.
    async fn housekeeping(self: Arc<Self>) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut n = 0u64;
        loop {
            tick.tick().await;
            n += 1;
            let now = Instant::now();
            let expired = lock(&self.cache).cleanup_expired(now, ASSUMED_POD_TTL);
            if expired > 0 {
                tracing::warn!(expired, "assumed pods expired without confirmation");
            }
            if n.is_multiple_of(30) {
                self.queue.with(|q| q.flush_unschedulable(now));
            }
            let (a, b, u) = self.queue.with(|q| q.lens());
            self.metrics.pending.with_label_values(&["active"]).set(a as i64);
            self.metrics.pending.with_label_values(&["backoff"]).set(b as i64);
            self.metrics.pending.with_label_values(&["unschedulable"]).set(u as i64);
        }
    }

    async fn schedule_loop(self: Arc<Self>) -> anyhow::Result<()> {
        let mut rng = rand::rngs::StdRng::from_os_rng();
        loop {
            let popped = self.queue.pop().await;
            let info = popped.info;
            let key = info.key();
            let Some(profile) = self.profiles.get(&info.scheduler_name) else {
                self.queue.with(|q| q.delete(&key));
                continue;
            };
            let start = Instant::now();
            // VolumeBinding reads the pod's claims, the volumes and the classes first.
            let info = if info.claims.is_empty() {
                info
            } else {
                match self.read_volumes(&info).await {
                    Ok(v) => Arc::new(PodInfo { volumes: Some(Arc::new(v)), ..(*info).clone() }),
                    Err(e) => {
                        tracing::warn!(pod = %key, error = %e, "reading the pod's volumes");
                        self.queue.with(|q| q.error(info.clone(), Instant::now()));
                        continue;
                    }
                }
            };
            let result = {
                let cache = lock(&self.cache);
                let mut states = lock(&self.states);
                let state = states.entry(profile.scheduler_name.clone()).or_default();
                framework::schedule(&info, &cache.snapshot, profile, state, &mut rng)
            };
            match result {
                Ok(node) => {
                    lock(&self.cache).assume(info.clone(), &node);
                    self.queue.with(|q| q.done(&key));
                    let permit = self.binds.clone().acquire_owned().await?;
                    let me = self.clone();
                    let profile_name = profile.scheduler_name.clone();
                    tokio::spawn(async move {
                        me.bind(info, node, profile_name, start).await;
                        drop(permit);
                    });
                }
                Err(fit) => {
                    let message = fit.to_string();
                    tracing::debug!(pod = %key, %message, "unable to schedule pod");
                    self.metrics.attempts.with_label_values(&["unschedulable", &profile.scheduler_name]).inc();
                    self.metrics
                        .attempt_duration
                        .with_label_values(&["unschedulable", &profile.scheduler_name])
                        .observe(start.elapsed().as_secs_f64());
                    if fit.plugins.contains(&"VolumeBinding") {
                        // Claims change without a pod or node event: retry with back-off.
                        self.queue.with(|q| q.error(info.clone(), Instant::now()));
                    } else {
                        self.queue.with(|q| q.unschedulable(&key, fit.plugins.clone(), Instant::now()));
                    }
                    let me = self.clone();
                    let profile_name = profile.scheduler_name.clone();
                    tokio::spawn(
                        async move { me.record_failure(&info, &profile_name, "Unschedulable", &message).await },
                    );
                }
            }
        }
    }

    /// The pod's claims, every volume and every class, digested for VolumeBinding.
    async fn read_volumes(&self, info: &PodInfo) -> Result<framework::volumebinding::PodVolumes, kube::Error> {
        let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &info.namespace);
        let mut claims = HashMap::new();
        for c in &info.claims {
            claims.insert(c.clone(), claims_api.get_opt(c).await?);
        }
        let volumes = Api::<PersistentVolume>::all(self.client.clone()).list(&ListParams::default()).await?.items;
        let classes = Api::<StorageClass>::all(self.client.clone()).list(&ListParams::default()).await?.items;
        Ok(framework::volumebinding::pod_volumes(&info.claims, &claims, &volumes, &classes))
    }

    /// Tell the provisioner where the pod goes: `volume.kubernetes.io/selected-node` on each
    /// unbound WaitForFirstConsumer claim.
    async fn select_node_for_claims(&self, info: &PodInfo, node: &str) -> Result<(), kube::Error> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &info.namespace);
        for d in info.volumes.iter().flat_map(|v| v.delayed.iter()) {
            let patch = serde_json::json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node}}});
            api.patch(&d.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        Ok(())
    }

    async fn bind(self: Arc<Self>, info: Arc<PodInfo>, node: String, profile: String, start: Instant) {
        let key = info.key();
        if let Err(e) = self.select_node_for_claims(&info, &node).await {
            lock(&self.cache).forget(&key);
            tracing::warn!(pod = %key, %node, error = %e, "setting the claims' selected node");
            self.queue.with(|q| q.error(info.clone(), Instant::now()));
            self.record_failure(
                &info,
                &profile,
                "SchedulerError",
                &format!("running PreBind plugin \"VolumeBinding\": {e}"),
            )
            .await;
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &info.namespace);
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(info.name.clone()),
                namespace: Some(info.namespace.clone()),
                uid: (!info.uid.is_empty()).then(|| info.uid.clone()),
                ..Default::default()
            },
            target: ObjectReference {
                kind: Some("Node".into()),
                api_version: Some("v1".into()),
                name: Some(node.clone()),
                ..Default::default()
            },
        };
        match api
            .create_subresource::<_, serde_json::Value>("binding", &info.name, &PostParams::default(), &binding)
            .await
        {
            Ok(_) => {
                lock(&self.cache).finish_binding(&key);
                self.metrics.binds.with_label_values(&["ok"]).inc();
                self.metrics.attempts.with_label_values(&["scheduled", &profile]).inc();
                self.metrics
                    .attempt_duration
                    .with_label_values(&["scheduled", &profile])
                    .observe(start.elapsed().as_secs_f64());
                tracing::debug!(pod = %key, %node, "bound");
                self.emit(&info, &profile, NORMAL, "Scheduled", format!("Successfully assigned {key} to {node}"));
            }
            Err(e) => {
                lock(&self.cache).forget(&key);
                self.metrics.binds.with_label_values(&["error"]).inc();
                self.metrics.attempts.with_label_values(&["error", &profile]).inc();
                let gone = matches!(&e, kube::Error::Api(s) if s.code == 404);
                let taken = matches!(&e, kube::Error::Api(s) if s.code == 409);
                tracing::warn!(pod = %key, %node, error = %e, "binding failed");
                if gone || taken {
                    return; // deleted, or bound by someone else: the watch says what happened
                }
                self.queue.with(|q| q.error(info.clone(), Instant::now()));
                self.record_failure(
                    &info,
                    &profile,
                    "SchedulerError",
                    &format!("running Bind plugin \"DefaultBinder\": {e}"),
                )
                .await;
            }
        }
    }

    /// `PodScheduled=False` (only when it changes) and a `FailedScheduling` event.
    async fn record_failure(&self, info: &PodInfo, profile: &str, reason: &str, message: &str) {
        self.emit(info, profile, WARNING, "FailedScheduling", message);
        let conditions = info.pod.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
        if let Some(patch) = pod_scheduled_false(&conditions, reason, message, Timestamp::now()) {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &info.namespace);
            if let Err(e) = api.patch_status(&info.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                tracing::warn!(pod = %info.key(), error = %e, "updating PodScheduled condition");
            }
        }
    }

    /// An event about a pod from `profile` (kubectl describe shows `From: default-scheduler`);
    /// like client-go's broadcaster, dropped rather than blocking scheduling.
    fn emit(&self, info: &PodInfo, profile: &str, type_: &str, reason: &str, message: impl Into<String>) {
        self.events.for_component(profile).record(pod_reference(info), type_, reason, Some(action(reason)), message);
    }
}

/// The status merge patch setting `PodScheduled=False` with `reason`/`message`, or `None`
/// when the pod already carries exactly that condition (kube updates only on change).
pub fn pod_scheduled_false(
    current: &[PodCondition],
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Option<serde_json::Value> {
    let existing = current.iter().find(|c| c.type_ == "PodScheduled");
    if existing.is_some_and(|c| {
        c.status == "False" && c.reason.as_deref() == Some(reason) && c.message.as_deref() == Some(message)
    }) {
        return None;
    }
    let transition = match existing {
        Some(c) if c.status == "False" => c.last_transition_time.clone(),
        _ => None,
    }
    .unwrap_or(Time(now));
    let cond = PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(transition),
        ..Default::default()
    };
    let mut conditions: Vec<PodCondition> = current.iter().filter(|c| c.type_ != "PodScheduled").cloned().collect();
    conditions.push(cond);
    Some(serde_json::json!({"status": {"conditions": conditions}}))
}

/// The scheduler's `involvedObject`: the pod as it was read.
pub fn pod_reference(info: &PodInfo) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(info.name.clone()),
        namespace: Some(info.namespace.clone()),
        uid: (!info.uid.is_empty()).then(|| info.uid.clone()),
        resource_version: info.pod.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// The event's action: binding for `Scheduled`, scheduling otherwise.
fn action(reason: &str) -> &'static str {
    if reason == "Scheduled" {
        "Binding"
    } else {
        "Scheduling"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_patch_only_on_change() {
        let now = Timestamp::from_second(1_000).unwrap();
        let p = pod_scheduled_false(&[], "Unschedulable", "0/1 nodes are available: 1 Insufficient cpu.", now).unwrap();
        assert_eq!(p["status"]["conditions"][0]["type"], "PodScheduled");
        assert_eq!(p["status"]["conditions"][0]["status"], "False");
        assert_eq!(p["status"]["conditions"][0]["reason"], "Unschedulable");
        let conds: Vec<PodCondition> = serde_json::from_value(p["status"]["conditions"].clone()).unwrap();
        assert!(
            pod_scheduled_false(&conds, "Unschedulable", "0/1 nodes are available: 1 Insufficient cpu.", now).is_none()
        );
        let later = Timestamp::from_second(2_000).unwrap();
        let p2 = pod_scheduled_false(&conds, "Unschedulable", "0/2 nodes are available: 2 Insufficient cpu.", later)
            .unwrap();
        // transition time kept while the status stays False
        assert_eq!(
            p2["status"]["conditions"][0]["lastTransitionTime"],
            p["status"]["conditions"][0]["lastTransitionTime"]
        );
    }

    #[test]
    fn events_look_like_kube_schedulers() {
        let info = crate::framework::types::testutil::pod(serde_json::json!({"metadata": {"name": "p", "uid": "u1"}}));
        let now = Timestamp::from_second(1).unwrap();
        let e = common::events::build(
            "default-scheduler",
            None,
            pod_reference(&info),
            WARNING,
            "FailedScheduling",
            Some(action("FailedScheduling")),
            "m".into(),
            now,
        );
        assert_eq!(e.involved_object.kind.as_deref(), Some("Pod"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(e.source.unwrap().component.as_deref(), Some("default-scheduler"));
        assert_eq!(e.reporting_instance.as_deref(), Some("default-scheduler"));
        assert_eq!(e.action.as_deref(), Some("Scheduling"));
        assert!(e.metadata.name.unwrap().starts_with("p."));
        assert_eq!(action("Scheduled"), "Binding");
        let nameless = crate::framework::types::testutil::pod(serde_json::json!({"metadata": {"name": "q"}}));
        assert_eq!(pod_reference(&nameless).uid, None);
    }
}
