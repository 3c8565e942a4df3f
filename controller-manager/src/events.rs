//! Events as Kubernetes controllers emit them: core/v1 `Event`s (which `kubectl
//! describe` shows) with Kubernetes' reasons and messages, written in the background so
//! a slow event write never slows a controller.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Resource;

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    component: String,
}

impl Recorder {
    pub fn new(client: kube::Client, component: &str) -> Self {
        Recorder { client, component: component.into() }
    }

    /// Record an event about `obj`.
    pub fn event<K: Resource<DynamicType = ()>>(&self, obj: &K, type_: &str, reason: &str, message: String) {
        let meta = obj.meta();
        let involved = ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            ..Default::default()
        };
        self.event_on(involved, type_, reason, message);
    }

    /// Record an event about the object `involved` refers to (any kind).
    pub fn event_on(&self, involved: ObjectReference, type_: &str, reason: &str, message: String) {
        let name = involved.name.clone().unwrap_or_else(|| "object".into());
        let ns = involved.namespace.clone().unwrap_or_else(|| "default".into());
        let now = Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: involved,
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some(type_.into()),
            source: Some(EventSource { component: Some(self.component.clone()), host: None }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.component.clone()),
            count: Some(1),
            ..Default::default()
        };
        tracing::debug!(reason, message = ev.message.as_deref().unwrap_or(""), "event");
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        tokio::spawn(async move {
            if let Err(e) = api.create(&PostParams::default(), &ev).await {
                tracing::debug!(error = %e, "could not write event");
            }
        });
    }
}
