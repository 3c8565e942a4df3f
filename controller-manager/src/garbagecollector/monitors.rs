//! The collector's monitors (Kubernetes' `GraphBuilder` monitors): one watch-fed cache per
//! served resource that can be listed, watched, deleted and patched, started and stopped
//! as the discovery catalog changes (a CRD created or deleted while the collector runs).
//! Caches keep metadata only. Every watched deletion records the object's uid in a
//! bounded set: a uid is never reused, so an owner whose deletion was seen is verifiably
//! absent without a read — even after its kind stops being served.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use tokio::sync::Notify;

use super::graph::Node;
use crate::discovery::{Catalog, GC_VERBS};

/// Uids whose deletion a monitor saw, oldest forgotten first.
#[derive(Default)]
pub struct DeletedUids {
    set: HashSet<String>,
    order: VecDeque<String>,
}

impl DeletedUids {
    /// How many are remembered; an older one costs a live read instead.
    pub const CAPACITY: usize = 100_000;

    pub fn insert(&mut self, uid: String) {
        if self.set.insert(uid.clone()) {
            self.order.push_back(uid);
            while self.order.len() > Self::CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.set.contains(uid)
    }
}

pub struct Monitor {
    pub ar: ApiResource,
    pub namespaced: bool,
    store: Store<DynamicObject>,
    synced: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every monitor, keyed by `apiVersion/plural`.
pub struct Monitors {
    client: kube::Client,
    notify: Arc<Notify>,
    pub deleted: Arc<Mutex<DeletedUids>>,
    pub list: Vec<Monitor>,
}

impl Monitors {
    pub fn new(client: kube::Client, notify: Arc<Notify>) -> Self {
        Monitors { client, notify, deleted: Default::default(), list: Vec::new() }
    }

    /// Start monitors for resources the catalog newly serves, stop those it no longer
    /// serves. Answers (started, stopped).
    pub fn sync(&mut self, catalog: &Catalog) -> (usize, usize) {
        let wanted: HashMap<String, (ApiResource, bool)> = catalog
            .preferred_with(GC_VERBS)
            .filter(|s| s.ar.plural != "events") // events own nothing and are many
            .map(|s| (format!("{}/{}", s.ar.api_version, s.ar.plural), (s.ar.clone(), s.namespaced())))
            .collect();
        let before = self.list.len();
        self.list.retain(|m| wanted.contains_key(&format!("{}/{}", m.ar.api_version, m.ar.plural)));
        let stopped = before - self.list.len();
        let have: HashSet<String> = self.list.iter().map(|m| format!("{}/{}", m.ar.api_version, m.ar.plural)).collect();
        let mut started = 0;
        for (key, (ar, namespaced)) in wanted {
            if !have.contains(&key) {
                self.list.push(self.start(ar, namespaced));
                started += 1;
            }
        }
        if started + stopped > 0 {
            self.notify.notify_one();
        }
        (started, stopped)
    }

    fn start(&self, ar: ApiResource, namespaced: bool) -> Monitor {
        let writer = reflector::store::Writer::new(ar.clone());
        let store = writer.as_reader();
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let synced = Arc::new(AtomicBool::new(false));
        let (notify, deleted, flag) = (self.notify.clone(), self.deleted.clone(), synced.clone());
        let task = tokio::spawn(async move {
            let events = watcher(api, watcher::Config::default()).default_backoff().modify(|o| {
                // Only metadata is looked at; the rest would only cost memory.
                o.data = serde_json::Value::Null;
            });
            reflector::reflector(writer, events)
                .for_each(|ev| {
                    match &ev {
                        Ok(watcher::Event::Delete(o)) => {
                            if let (Some(uid), Ok(mut d)) = (o.metadata.uid.clone(), deleted.lock()) {
                                d.insert(uid);
                            }
                        }
                        Ok(watcher::Event::InitDone) => flag.store(true, Ordering::Release),
                        _ => {}
                    }
                    notify.notify_one();
                    async {}
                })
                .await;
        });
        Monitor { ar, namespaced, store, synced, task }
    }

    /// Whether every monitor has listed its resource once.
    pub fn all_synced(&self) -> bool {
        self.list.iter().all(|m| m.synced.load(Ordering::Acquire))
    }

    /// The graph's nodes: every object of every monitor.
    pub fn snapshot(&self) -> Vec<Node> {
        let mut nodes = Vec::new();
        for (i, m) in self.list.iter().enumerate() {
            for o in m.store.state() {
                nodes.push(Node {
                    resource: i,
                    api_version: m.ar.api_version.clone(),
                    kind: m.ar.kind.clone(),
                    namespace: o.metadata.namespace.clone(),
                    name: o.metadata.name.clone().unwrap_or_default(),
                    uid: o.metadata.uid.clone().unwrap_or_default(),
                    resource_version: o.metadata.resource_version.clone(),
                    owners: o.metadata.owner_references.clone().unwrap_or_default(),
                    deleting: o.metadata.deletion_timestamp.is_some(),
                    finalizers: o.metadata.finalizers.clone().unwrap_or_default(),
                });
            }
        }
        nodes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleted_uids_forget_the_oldest_beyond_capacity() {
        let mut d = DeletedUids::default();
        for i in 0..DeletedUids::CAPACITY + 2 {
            d.insert(i.to_string());
        }
        d.insert("5".into()); // already there: no duplicate in the order
        assert!(!d.contains("0") && !d.contains("1"));
        assert!(d.contains("2") && d.contains(&(DeletedUids::CAPACITY + 1).to_string()));
        assert_eq!(d.order.len(), DeletedUids::CAPACITY);
    }
}
