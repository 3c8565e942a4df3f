//! The kubelet's shared state and the pod manager: the watch on this node's pods, one
//! worker task per pod UID, and the dispatch of watch changes, PLEG events and probe
//! results to those workers.
//!
//! What a worker does is not this module's business: the task is [`PodWorker`], given by
//! `main.rs` (`worker.rs`'s `run`), so the workers may use this shared state without the
//! two modules depending on each other.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::{reflector, watcher};
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::network::PodNetwork;
use crate::probes::ResultMap;
use crate::runtime::{ContainerRecord, Runtime};

/// The task that runs the pod of one UID: it is woken through the channel (a message means
/// "look again") and ends once [`Kubelet::worker_done`] lets it.
pub type PodWorker = fn(Arc<Kubelet>, String, mpsc::UnboundedReceiver<()>) -> BoxFuture<'static, ()>;

pub struct Kubelet {
    pub client: kube::Client,
    pub rt: Arc<Runtime>,
    pub node: String,
    pub node_ip: String,
    pub root_dir: PathBuf,
    pub pause_image: String,
    /// The pod network: podCIDR, pod IPs, bridge, veths.
    pub net: Arc<PodNetwork>,
    /// This node's pods by UID, as the watch last saw them.
    pub pods: Mutex<HashMap<String, Pod>>,
    /// The first full list of pods arrived: a pod absent from `pods` is really gone.
    pub pods_synced: AtomicBool,
    workers: Mutex<HashMap<String, mpsc::UnboundedSender<()>>>,
    /// What each of those workers runs.
    pod_worker: PodWorker,
    pub probe_results: ResultMap,
    pub metrics: Metrics,
    pub events: crate::events::Events,
    /// `--cluster-dns`, `--cluster-domain`, the host's resolver files: the pods' resolv.conf and hosts.
    pub dns: crate::dns::Settings,
    /// The running containers' CPU and memory samples (`/stats/summary`).
    pub stats: Arc<crate::stats::Cache>,
    /// ServiceAccount tokens of the pods' projected volumes.
    pub tokens: crate::tokens::Manager,
    /// Every Service, from one watch: their environment variables (`envvars.rs`) cost no
    /// request per pod sync.
    pub services: reflector::Store<Service>,
    /// Device plugins and the devices containers hold (`None`: another kubelet on this host
    /// serves the device-plugin directory).
    pub devices: Option<Arc<crate::devicemanager::DeviceManager>>,
}

impl Kubelet {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: kube::Client,
        rt: Arc<Runtime>,
        node: String,
        node_ip: String,
        root_dir: PathBuf,
        pause_image: String,
        net: Arc<PodNetwork>,
        metrics: Metrics,
        dns: crate::dns::Settings,
        devices: Option<Arc<crate::devicemanager::DeviceManager>>,
        pod_worker: PodWorker,
    ) -> Arc<Kubelet> {
        let events = crate::events::Events::new(client.clone(), &node);
        let (services, writer) = reflector::store();
        let stream = watcher(Api::<Service>::all(client.clone()), watcher::Config::default()).default_backoff();
        tokio::spawn(reflector(writer, stream).for_each(|_| async {}));
        Arc::new(Kubelet {
            events,
            client,
            rt,
            node,
            node_ip,
            root_dir,
            pause_image,
            net,
            pods: Mutex::new(HashMap::new()),
            pods_synced: AtomicBool::new(false),
            workers: Mutex::new(HashMap::new()),
            pod_worker,
            probe_results: Default::default(),
            metrics,
            dns,
            stats: Default::default(),
            tokens: Default::default(),
            services,
            devices,
        })
    }

    pub fn pod(&self, uid: &str) -> Option<Pod> {
        self.pods.lock().ok().and_then(|p| p.get(uid).cloned())
    }

    /// The UIDs of this node's pods that may still run containers (not Succeeded or Failed):
    /// the pods whose devices stay held.
    pub fn active_pods(&self) -> HashSet<String> {
        let Ok(pods) = self.pods.lock() else { return HashSet::new() };
        pods.iter()
            .filter(|(_, p)| {
                !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"))
            })
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    pub fn synced(&self) -> bool {
        self.pods_synced.load(Ordering::SeqCst)
    }

    /// Wake the worker of `uid`, starting one if there is none.
    pub fn notify(self: &Arc<Self>, uid: &str) {
        let Ok(mut workers) = self.workers.lock() else { return };
        if let Some(tx) = workers.get(uid) {
            if tx.send(()).is_ok() {
                return;
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(());
        workers.insert(uid.to_string(), tx);
        let k = self.clone();
        let uid = uid.to_string();
        tokio::spawn((self.pod_worker)(k, uid, rx));
    }

    /// Called by a worker that has nothing left to do: true if it may exit (no pod object and
    /// no pending message). Decided under the workers lock so no notification is lost.
    pub fn worker_done(&self, uid: &str, rx: &mut mpsc::UnboundedReceiver<()>) -> bool {
        let Ok(mut workers) = self.workers.lock() else { return false };
        if self.pod(uid).is_some() || !rx.is_empty() {
            return false;
        }
        workers.remove(uid);
        true
    }

    /// Containers exist for these pods: make sure each has a worker (adoption after a
    /// restart, and cleanup of pods deleted while the kubelet was down).
    pub fn relisted(self: &Arc<Self>, records: &[ContainerRecord]) {
        if !self.synced() {
            return;
        }
        let uids: HashSet<&str> = records.iter().map(|r| r.pod_uid.as_str()).collect();
        let missing: Vec<String> = {
            let Ok(workers) = self.workers.lock() else { return };
            uids.into_iter().filter(|u| !workers.contains_key(*u)).map(str::to_string).collect()
        };
        for uid in missing {
            self.notify(&uid);
        }
    }

    /// Watch this node's pods forever, keeping `pods` current and waking workers.
    pub async fn watch_pods(self: Arc<Self>) {
        let api: Api<Pod> = Api::all(self.client.clone());
        let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node));
        let mut stream = watcher(api, cfg).default_backoff().boxed();
        let mut init: Option<HashMap<String, Pod>> = None;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(p)) => self.apply(p),
                Ok(watcher::Event::Delete(p)) => {
                    if let Some(uid) = p.metadata.uid.clone() {
                        if let Ok(mut pods) = self.pods.lock() {
                            pods.remove(&uid);
                        }
                        self.notify(&uid);
                    }
                }
                Ok(watcher::Event::Init) => init = Some(HashMap::new()),
                Ok(watcher::Event::InitApply(p)) => {
                    if let (Some(m), Some(uid)) = (init.as_mut(), p.metadata.uid.clone()) {
                        m.insert(uid, p);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    let new = init.take().unwrap_or_default();
                    let mut touched: HashSet<String> = new.keys().cloned().collect();
                    if let Ok(mut pods) = self.pods.lock() {
                        touched.extend(pods.keys().cloned());
                        *pods = new;
                    }
                    self.pods_synced.store(true, Ordering::SeqCst);
                    for uid in touched {
                        self.notify(&uid);
                    }
                    // Pods with containers but no object are cleaned up by their workers.
                    if let Ok(records) = self.rt.list(None).await {
                        self.relisted(&records);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "pod watch error"),
            }
        }
    }

    fn apply(self: &Arc<Self>, p: Pod) {
        let Some(uid) = p.metadata.uid.clone() else { return };
        if let Ok(mut pods) = self.pods.lock() {
            pods.insert(uid.clone(), p);
        }
        self.notify(&uid);
    }
}
