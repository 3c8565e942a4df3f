//! Kubernetes events (core/v1 `Event`, what `kubectl describe` shows under "Events"), one
//! recorder for every component. A component names itself (`source.component`,
//! `reportingComponent`) and, when it runs per node, its host (`source.host`,
//! `reportingInstance`); each event is about one object (`involvedObject`).
//!
//! Events are written in the background, a few at a time, from a bounded queue: a slow
//! or failing event write never slows the caller, and a burst beyond the queue is dropped
//! (events are best-effort, as client-go's broadcaster makes them).
//!
//! ```no_run
//! # async fn f(client: kube::Client, pod: k8s_openapi::api::core::v1::Pod) {
//! let recorder = common::events::Recorder::new(client, "replicaset-controller");
//! recorder.event(&pod, common::events::NORMAL, "SuccessfulCreate", "Created pod: web-x2k4f");
//! # }
//! ```

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Resource;
use tokio::sync::{mpsc, Semaphore};

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// Events waiting to be written; more are dropped.
const QUEUE: usize = 1000;
/// Event writes in flight at once.
const WRITERS: usize = 4;

/// Records events as one component (and host). Clones, and recorders made with
/// [`Recorder::for_component`], share one writer.
#[derive(Clone)]
pub struct Recorder {
    queue: mpsc::Sender<Event>,
    component: Arc<str>,
    host: Option<Arc<str>>,
}

impl Recorder {
    /// A recorder writing through `client`; starts its writer task (call it inside the
    /// Tokio runtime).
    pub fn new(client: kube::Client, component: &str) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write_events(client, rx));
        Recorder { queue, component: component.into(), host: None }
    }

    /// The same recorder for a component that runs on `host` (a kubelet: its node name).
    pub fn with_host(mut self, host: &str) -> Self {
        self.host = Some(host.into());
        self
    }

    /// A recorder for another component, sharing this one's writer.
    pub fn for_component(&self, component: &str) -> Self {
        Recorder { queue: self.queue.clone(), component: component.into(), host: self.host.clone() }
    }

    /// Record an event about `obj`.
    pub fn event<K: Resource<DynamicType = ()>>(&self, obj: &K, type_: &str, reason: &str, message: impl Into<String>) {
        self.event_on(reference(obj), type_, reason, message);
    }

    /// Record an event about the object `involved` refers to (any kind).
    pub fn event_on(&self, involved: ObjectReference, type_: &str, reason: &str, message: impl Into<String>) {
        self.record(involved, type_, reason, None, message);
    }

    /// [`Recorder::event_on`] with the event's `action` (what was done or failed).
    pub fn record(
        &self,
        involved: ObjectReference,
        type_: &str,
        reason: &str,
        action: Option<&str>,
        message: impl Into<String>,
    ) {
        let ev = build(
            &self.component,
            self.host.as_deref(),
            involved,
            type_,
            reason,
            action,
            message.into(),
            Timestamp::now(),
        );
        tracing::debug!(reason, message = ev.message.as_deref().unwrap_or(""), "event");
        if self.queue.try_send(ev).is_err() {
            tracing::debug!("event queue full; dropping event");
        }
    }
}

/// A reference to `obj` as an event's `involvedObject`.
pub fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    let meta = obj.meta();
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        ..Default::default()
    }
}

/// The Event a recorder writes, at `now`. It lives in the involved object's namespace
/// (`default` for cluster-scoped objects) and is named `<object>.<nanoseconds in hex>`;
/// `reportingInstance` is the host, or the component when there is none.
#[allow(clippy::too_many_arguments)]
pub fn build(
    component: &str,
    host: Option<&str>,
    involved: ObjectReference,
    type_: &str,
    reason: &str,
    action: Option<&str>,
    message: String,
    now: Timestamp,
) -> Event {
    let name = involved.name.clone().unwrap_or_else(|| "object".into());
    let namespace = involved.namespace.clone().unwrap_or_else(|| "default".into());
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: Some(namespace),
            ..Default::default()
        },
        involved_object: involved,
        reason: Some(reason.into()),
        message: Some(message),
        type_: Some(type_.into()),
        source: Some(EventSource { component: Some(component.into()), host: host.map(String::from) }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        count: Some(1),
        action: action.map(String::from),
        reporting_component: Some(component.into()),
        reporting_instance: Some(host.unwrap_or(component).into()),
        ..Default::default()
    }
}

/// Write queued events, [`WRITERS`] at a time.
async fn write_events(client: kube::Client, mut rx: mpsc::Receiver<Event>) {
    let writers = Arc::new(Semaphore::new(WRITERS));
    while let Some(ev) = rx.recv().await {
        let Ok(permit) = writers.clone().acquire_owned().await else { return };
        let api: Api<Event> = Api::namespaced(client.clone(), ev.metadata.namespace.as_deref().unwrap_or("default"));
        tokio::spawn(async move {
            if let Err(e) = api.create(&PostParams::default(), &ev).await {
                tracing::debug!(error = %e, "could not write event");
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_controllers_event() {
        let now = Timestamp::from_second(1_000).unwrap();
        let e =
            build("replicaset-controller", None, reference(&pod()), NORMAL, "SuccessfulCreate", None, "m".into(), now);
        assert_eq!(e.metadata.name.as_deref(), Some(format!("web.{:x}", now.as_nanosecond()).as_str()));
        assert_eq!(e.metadata.namespace.as_deref(), Some("ns"));
        let o = &e.involved_object;
        assert_eq!(
            (o.api_version.as_deref(), o.kind.as_deref(), o.name.as_deref(), o.namespace.as_deref()),
            (Some("v1"), Some("Pod"), Some("web"), Some("ns"))
        );
        assert_eq!((o.uid.as_deref(), o.resource_version.as_deref()), (Some("u1"), Some("7")));
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(e.reason.as_deref(), Some("SuccessfulCreate"));
        assert_eq!(e.message.as_deref(), Some("m"));
        let src = e.source.unwrap();
        assert_eq!((src.component.as_deref(), src.host), (Some("replicaset-controller"), None));
        assert_eq!(e.reporting_component.as_deref(), Some("replicaset-controller"));
        assert_eq!(e.reporting_instance.as_deref(), Some("replicaset-controller"));
        assert_eq!(e.action, None);
        assert_eq!(e.count, Some(1));
        assert_eq!(e.first_timestamp, Some(Time(now)));
        assert_eq!(e.last_timestamp, Some(Time(now)));
        assert_eq!(e.event_time, Some(MicroTime(now)));
    }

    #[test]
    fn a_node_components_event() {
        let now = Timestamp::from_second(1_000).unwrap();
        let e =
            build("kubelet", Some("node-1"), reference(&pod()), WARNING, "BackOff", Some("BackOff"), "m".into(), now);
        let src = e.source.unwrap();
        assert_eq!((src.component.as_deref(), src.host.as_deref()), (Some("kubelet"), Some("node-1")));
        assert_eq!(e.reporting_component.as_deref(), Some("kubelet"));
        assert_eq!(e.reporting_instance.as_deref(), Some("node-1"));
        assert_eq!(e.action.as_deref(), Some("BackOff"));
    }

    #[test]
    fn cluster_scoped_and_nameless_objects() {
        let now = Timestamp::from_second(1).unwrap();
        let node = ObjectReference { kind: Some("Node".into()), name: Some("n1".into()), ..Default::default() };
        let e = build("node-controller", None, node, NORMAL, "NodeNotReady", None, "m".into(), now);
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert!(e.metadata.name.unwrap().starts_with("n1."));
        let e = build("c", None, ObjectReference::default(), NORMAL, "R", None, "m".into(), now);
        assert!(e.metadata.name.unwrap().starts_with("object."));
    }
}
