//! The I/O shell over the apiserver: one reflector store per watched kind (Services,
//! EndpointSlices, Pods, Namespaces, VirtualServices, DestinationRules), and the one place
//! where their events become a recompute and a push ([`run`]): events are debounced (100 ms
//! quiet, 1 s at most), then the configuration is validated ([`crate::validate`]), a new
//! [`Snapshot`] built and published to every ADS stream, and the VirtualServices' and
//! DestinationRules' status written ([`crate::status`]) with a Warning event for an
//! invalid one.
//!
//! Nothing is published before every store has listed once: a restarted pilot serves the
//! cluster's whole configuration or nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use crate::ads::Published;
use crate::metrics::Metrics;
use crate::model::ConfigObject;
use crate::validate::{Accepted, Kind, Verdict};
use crate::xds::{Inputs, Snapshot};

/// How long the cluster must be quiet before a push, and the longest a push waits.
pub const QUIET: Duration = Duration::from_millis(100);
pub const MAX_DELAY: Duration = Duration::from_secs(1);

pub fn api_resource(kind: Kind) -> ApiResource {
    let (k, plural) = match kind {
        Kind::VirtualService => ("VirtualService", "virtualservices"),
        Kind::DestinationRule => ("DestinationRule", "destinationrules"),
    };
    ApiResource {
        group: crate::crds::GROUP.into(),
        version: crate::crds::VERSIONS[0].into(),
        api_version: format!("{}/{}", crate::crds::GROUP, crate::crds::VERSIONS[0]),
        kind: k.into(),
        plural: plural.into(),
    }
}

/// The watched objects.
#[derive(Clone)]
pub struct Stores {
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub pods: Store<Pod>,
    pub namespaces: Store<Namespace>,
    pub virtual_services: Store<DynamicObject>,
    pub destination_rules: Store<DynamicObject>,
    synced: Vec<Arc<AtomicBool>>,
}

impl Stores {
    pub fn synced(&self) -> bool {
        self.synced.iter().all(|s| s.load(Ordering::Acquire))
    }
}

type Triggers = mpsc::Sender<&'static str>;

fn spawn<K>(api: Api<K>, writer: Writer<K>, kind: &'static str, triggers: Triggers, metrics: Metrics) -> Arc<AtomicBool>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let synced = Arc::new(AtomicBool::new(false));
    let flag = synced.clone();
    tokio::spawn(async move {
        let events = watcher(api, watcher::Config::default()).default_backoff().modify(|o: &mut K| {
            o.meta_mut().managed_fields = None;
        });
        reflector::reflector(writer, events)
            .for_each(|ev| {
                let fire = match ev {
                    Ok(watcher::Event::InitDone) => {
                        if !flag.swap(true, Ordering::AcqRel) {
                            tracing::info!(kind, "listed");
                        }
                        true
                    }
                    Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => true,
                    Ok(_) => false,
                    Err(e) => {
                        tracing::warn!(kind, error = %e, "watch failed; retrying");
                        false
                    }
                };
                if fire {
                    metrics.triggers.with_label_values(&[kind]).inc();
                    // A full queue already holds a pending recompute.
                    let _ = triggers.try_send(kind);
                }
                futures::future::ready(())
            })
            .await;
    });
    synced
}

/// Start the watches; their events go to `triggers`.
pub fn start(client: &kube::Client, triggers: Triggers, metrics: &Metrics) -> Stores {
    let c = client.clone();
    let (services, w) = reflector::store();
    let s1 = spawn(Api::<Service>::all(c.clone()), w, "service", triggers.clone(), metrics.clone());
    let (slices, w) = reflector::store();
    let s2 = spawn(Api::<EndpointSlice>::all(c.clone()), w, "endpoint", triggers.clone(), metrics.clone());
    let (pods, w) = reflector::store();
    let s3 = spawn(Api::<Pod>::all(c.clone()), w, "pod", triggers.clone(), metrics.clone());
    let (namespaces, w) = reflector::store();
    let s4 = spawn(Api::<Namespace>::all(c.clone()), w, "namespace", triggers.clone(), metrics.clone());
    let dynamic = |kind: Kind, label: &'static str| {
        let ar = api_resource(kind);
        let w = Writer::<DynamicObject>::new(ar.clone());
        let store = w.as_reader();
        let synced = spawn(Api::<DynamicObject>::all_with(c.clone(), &ar), w, label, triggers.clone(), metrics.clone());
        (store, synced)
    };
    let (virtual_services, s5) = dynamic(Kind::VirtualService, "virtualservice");
    let (destination_rules, s6) = dynamic(Kind::DestinationRule, "destinationrule");
    Stores {
        services,
        slices,
        pods,
        namespaces,
        virtual_services,
        destination_rules,
        synced: vec![s1, s2, s3, s4, s5, s6],
    }
}

/// Wait for the next batch of triggers: the first, then more until none comes for
/// `quiet` or `max` has passed since the first. What triggered it (kind → count) and when
/// it started; `None` once the senders are gone.
pub async fn next_batch(
    rx: &mut mpsc::Receiver<&'static str>,
    quiet: Duration,
    max: Duration,
) -> Option<(BTreeMap<&'static str, u64>, Instant)> {
    let first = rx.recv().await?;
    let since = Instant::now();
    let deadline = tokio::time::Instant::now() + max;
    let mut batch = BTreeMap::from([(first, 1)]);
    loop {
        let quiet_until = tokio::time::Instant::now() + quiet;
        match tokio::time::timeout_at(quiet_until.min(deadline), rx.recv()).await {
            Ok(Some(kind)) => *batch.entry(kind).or_insert(0) += 1,
            Ok(None) | Err(_) => break,
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    Some((batch, since))
}

pub fn config_object(o: &DynamicObject) -> ConfigObject {
    let m = &o.metadata;
    ConfigObject {
        namespace: m.namespace.clone().unwrap_or_else(|| "default".into()),
        name: m.name.clone().unwrap_or_default(),
        uid: m.uid.clone().unwrap_or_default(),
        generation: m.generation.unwrap_or(0),
        created: m.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
        spec: o.data.get("spec").cloned().unwrap_or(Value::Null),
    }
}

fn owned<K: Clone>(v: Vec<Arc<K>>) -> Vec<K> {
    v.into_iter().map(|o| (*o).clone()).collect()
}

/// The status writer: writes each object's status once per change, and a Warning event for
/// an invalid object.
struct StatusWriter {
    client: kube::Client,
    events: common::events::Recorder,
    written: HashMap<(Kind, String, String), Value>,
}

impl StatusWriter {
    async fn write(&mut self, verdicts: Vec<Verdict>, stores: &Stores, accepted: &Accepted) {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let now = k8s_openapi::jiff::Timestamp::from_second(now).unwrap_or_default().to_string();
        let mut seen = HashMap::new();
        for v in verdicts {
            let store = match v.kind {
                Kind::VirtualService => &stores.virtual_services,
                Kind::DestinationRule => &stores.destination_rules,
            };
            let key = (v.kind, v.namespace.clone(), v.name.clone());
            let obj = store.get(&reflector::ObjectRef::new_with(&v.name, api_resource(v.kind)).within(&v.namespace));
            let current = obj.as_ref().and_then(|o| o.data.get("status")).filter(|s| !s.is_null());
            let in_effect = accepted.in_effect(v.kind, &(v.namespace.clone(), v.name.clone()));
            let Some(status) = crate::status::desired(&v, current, in_effect, &now) else {
                seen.insert(key.clone(), ());
                continue;
            };
            seen.insert(key.clone(), ());
            if self.written.get(&key) == Some(&status) {
                continue;
            }
            let mut patch = status.clone();
            if patch.get("validationMessages").is_none() {
                patch["validationMessages"] = Value::Null;
            }
            // Through the version the object is stored in (an apiserver may keep the one it
            // was created with; every version has the same schema).
            let mut resource = api_resource(v.kind);
            let stored = obj.as_ref().and_then(|o| o.types.as_ref()).map(|t| t.api_version.as_str());
            if let Some(version) = stored
                .and_then(|av| av.strip_prefix(crate::crds::GROUP))
                .and_then(|v| v.strip_prefix('/'))
                .filter(|v| crate::crds::VERSIONS.contains(v))
            {
                resource.version = version.to_string();
                resource.api_version = format!("{}/{version}", crate::crds::GROUP);
            }
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &v.namespace, &resource);
            match api.patch_status(&v.name, &PatchParams::default(), &Patch::Merge(json!({"status": patch}))).await {
                Ok(_) => {
                    self.written.insert(key, status);
                }
                Err(e) => {
                    tracing::warn!(kind = v.kind.as_str(), namespace = v.namespace, name = v.name, error = %e, "writing status failed")
                }
            }
            if !v.valid() {
                let message: Vec<String> =
                    v.messages.iter().map(|m| format!("{} {}: {}", m.code, m.name, m.description)).collect();
                tracing::warn!(
                    kind = v.kind.as_str(),
                    namespace = v.namespace,
                    name = v.name,
                    problems = message.join("; "),
                    "invalid configuration"
                );
                let reference = ObjectReference {
                    api_version: Some(api_resource(v.kind).api_version),
                    kind: Some(v.kind.as_str().into()),
                    name: Some(v.name.clone()),
                    namespace: Some(v.namespace.clone()),
                    uid: Some(v.uid.clone()),
                    ..Default::default()
                };
                self.events.event_on(reference, common::events::WARNING, "InvalidConfiguration", message.join("; "));
            }
        }
        self.written.retain(|k, _| seen.contains_key(k));
    }
}

/// Recompute and publish on every batch of events, forever.
pub async fn run(
    client: kube::Client,
    stores: Stores,
    mut triggers: mpsc::Receiver<&'static str>,
    publish: watch::Sender<Option<Arc<Published>>>,
    domain: String,
    metrics: Metrics,
    ready: common::Ready,
) {
    let mut accepted = Accepted::default();
    let mut version = 0u64;
    let mut writer = StatusWriter {
        events: common::events::Recorder::new(client.clone(), "pilot"),
        client,
        written: HashMap::new(),
    };
    while let Some((batch, since)) = next_batch(&mut triggers, QUIET, MAX_DELAY).await {
        if !stores.synced() {
            tracing::debug!("waiting for every watch to list");
            continue;
        }
        let started = Instant::now();
        let inputs = Inputs {
            services: owned(stores.services.state()),
            slices: owned(stores.slices.state()),
            pods: owned(stores.pods.state()),
            virtual_services: stores.virtual_services.state().iter().map(|o| config_object(o)).collect(),
            destination_rules: stores.destination_rules.state().iter().map(|o| config_object(o)).collect(),
        };
        version += 1;
        let (snapshot, verdicts) = Snapshot::compute(version, &domain, &inputs, &mut accepted);
        let snapshot = Arc::new(snapshot);
        metrics.compute.observe(started.elapsed().as_secs_f64());
        tracing::debug!(version, ?batch, elapsed = ?started.elapsed(), "pushing");
        publish.send_replace(Some(Arc::new(Published { snapshot, since })));
        if !ready.get() {
            tracing::info!(version, "serving configuration");
            ready.set(true);
        }
        writer.write(verdicts, &stores, &accepted).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn batches_end_after_a_quiet_period() {
        let (tx, mut rx) = mpsc::channel(16);
        tx.send("pod").await.unwrap();
        tx.send("pod").await.unwrap();
        tx.send("service").await.unwrap();
        let started = Instant::now();
        let (batch, _) = next_batch(&mut rx, Duration::from_millis(30), Duration::from_secs(5)).await.unwrap();
        assert_eq!(batch, BTreeMap::from([("pod", 2), ("service", 1)]));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(30) && took < Duration::from_secs(2), "{took:?}");
    }

    #[tokio::test]
    async fn a_steady_stream_of_events_is_cut_at_the_maximum_delay() {
        let (tx, mut rx) = mpsc::channel(1024);
        let feeder = tokio::spawn(async move {
            for _ in 0..200 {
                if tx.send("endpoint").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let started = Instant::now();
        let (batch, _) = next_batch(&mut rx, Duration::from_millis(50), Duration::from_millis(200)).await.unwrap();
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(200) && took < Duration::from_millis(900), "{took:?}");
        assert!(batch["endpoint"] > 5);
        feeder.abort();
    }

    #[test]
    fn dynamic_objects_become_config_objects() {
        let o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "prod", "uid": "u1", "generation": 4,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"hosts": ["reviews"]}
        }))
        .unwrap();
        let c = config_object(&o);
        assert_eq!((c.namespace.as_str(), c.name.as_str(), c.generation), ("prod", "reviews", 4));
        assert_eq!(c.created, "2026-01-01T00:00:00Z");
        assert_eq!(c.spec, json!({"hosts": ["reviews"]}));
    }
}
