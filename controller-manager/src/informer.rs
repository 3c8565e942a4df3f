//! A shared informer, as client-go has them: one watch per kind feeding a cache
//! (`reflector::Store`) and event handlers that map each changed object to the
//! controllers that care (usually by sending an `ObjectRef` into a controller's
//! `reconcile_on` stream). Handlers run after the cache holds the change, so a
//! reconcile triggered by an event always reads at least that state. Unlike kube's
//! shared streams, deletions reach the handlers too.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::UnboundedSender;

/// Called with (object, deleted).
pub type Handler<K> = Box<dyn Fn(&K, bool) + Send + Sync>;

pub struct Informer<K: Resource<DynamicType = ()> + 'static> {
    pub store: Store<K>,
    handlers: Arc<Mutex<Vec<Handler<K>>>>,
    /// Turns true once the first list is in the store. (kube's `Store::wait_until_ready`
    /// wakes only one of several concurrent waiters.)
    synced: tokio::sync::watch::Receiver<bool>,
}

impl<K> Clone for Informer<K>
where
    K: Resource<DynamicType = ()> + 'static,
{
    fn clone(&self) -> Self {
        Informer { store: self.store.clone(), handlers: self.handlers.clone(), synced: self.synced.clone() }
    }
}

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Start watching `api` (in a background task).
    pub fn start(api: Api<K>) -> Self {
        let (store, mut writer) = reflector::store();
        let store_reader = store.clone();
        let handlers: Arc<Mutex<Vec<Handler<K>>>> = Arc::default();
        let hs = handlers.clone();
        let (synced_tx, synced) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
            while let Some(ev) = events.next().await {
                let ev = match ev {
                    Ok(ev) => ev,
                    Err(e) => {
                        tracing::warn!(kind = %K::kind(&()), error = %e, "watch error");
                        continue;
                    }
                };
                writer.apply_watcher_event(&ev);
                let hs = hs.lock().unwrap_or_else(|e| e.into_inner());
                match &ev {
                    watcher::Event::Apply(o) => hs.iter().for_each(|h| h(o, false)),
                    watcher::Event::Delete(o) => hs.iter().for_each(|h| h(o, true)),
                    watcher::Event::InitDone => {
                        // A (re)list: everything in the store may have changed.
                        for o in store_reader.state() {
                            hs.iter().for_each(|h| h(&o, false));
                        }
                        let _ = synced_tx.send(true);
                    }
                    _ => {}
                }
            }
        });
        Informer { store, handlers, synced }
    }

    pub fn add_handler(&self, h: impl Fn(&K, bool) + Send + Sync + 'static) {
        self.handlers.lock().unwrap_or_else(|e| e.into_inner()).push(Box::new(h));
    }

    pub fn state(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// Wait until the first list is in the cache (`WaitForCacheSync`).
    pub async fn synced(&self) {
        let mut rx = self.synced.clone();
        if rx.wait_for(|s| *s).await.is_err() {
            tracing::error!(kind = %K::kind(&()), "informer stopped before syncing");
        }
        tracing::debug!(kind = %K::kind(&()), "caches synced");
    }
}

/// The objects a pod controller's orphans are matched against, and how to read one's selector.
pub type SelectorStore<K> = (Store<K>, fn(&K) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector);

/// Route pod events to the controllers of `kind` (the pod controllers' `addPod` / `updatePod` /
/// `deletePod`): a pod's controller of that kind first learns it was seen (its expectations,
/// reached through `expectations(ctx)`; a pod being deleted counts as deleted) and is synced;
/// an orphan's creation or change syncs every object of `store` in its namespace whose
/// `selector` matches it, which may adopt it (no `selector`: orphans are left alone).
pub fn route_pods<K, C>(
    pods: &Informer<k8s_openapi::api::core::v1::Pod>,
    kind: &'static str,
    ctx: std::sync::Arc<C>,
    expectations: fn(&C) -> &crate::util::Expectations,
    store: Option<SelectorStore<K>>,
    tx: UnboundedSender<ObjectRef<K>>,
) where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    C: Send + Sync + 'static,
{
    use crate::util::{controller_ref, is_deleting, labels};
    pods.add_handler(move |pod, deleted| {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        match controller_ref(&pod.metadata) {
            Some(r) if r.kind == kind => {
                expectations(&ctx).observe(
                    &format!("{ns}/{}", r.name),
                    pod.metadata.name.as_deref().unwrap_or(""),
                    pod.metadata.uid.as_deref().unwrap_or(""),
                    deleted || is_deleting(&pod.metadata),
                );
                let _ = tx.send(ObjectRef::new(&r.name).within(&ns));
            }
            None if !deleted => {
                let Some((store, selector)) = &store else { return };
                let lbls = labels(&pod.metadata);
                for o in store.state() {
                    if o.meta().namespace.as_deref() == Some(&ns)
                        && apimachinery::labels::selects(Some(selector(&o)), &lbls)
                    {
                        let _ = tx.send(ObjectRef::from_obj(o.as_ref()));
                    }
                }
            }
            _ => {}
        }
    });
}

/// A trigger channel for a controller of `T`: handlers send into it; pass the
/// receiver's stream to `Controller::reconcile_on`.
pub fn trigger<T: Resource<DynamicType = ()>>(
) -> (UnboundedSender<ObjectRef<T>>, tokio_stream::wrappers::UnboundedReceiverStream<ObjectRef<T>>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (tx, tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
}
