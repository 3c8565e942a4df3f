//! Kubernetes events about pods (core/v1 Events, which `kubectl describe` shows), with the
//! kubelet's reasons: Created, Started, Killing, BackOff, Failed, Unhealthy,
//! FailedCreatePodSandBox. Repeats within a minute are dropped; publishing never blocks a
//! pod worker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};

/// (pod UID, reason, message) → when it was last published.
type Recent = Arc<Mutex<HashMap<(String, String, String), Instant>>>;

#[derive(Clone)]
pub struct Events {
    client: kube::Client,
    node: String,
    recent: Recent,
}

const REPEAT_WINDOW: Duration = Duration::from_secs(60);

impl Events {
    pub fn new(client: kube::Client, node: &str) -> Events {
        Events { client, node: node.to_string(), recent: Arc::default() }
    }

    fn publish(&self, pod: &Pod, warning: bool, reason: &str, note: String) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Ok(mut recent) = self.recent.lock() {
            let now = Instant::now();
            recent.retain(|_, t| now.duration_since(*t) < REPEAT_WINDOW);
            if recent.insert((uid.clone(), reason.to_string(), note.clone()), now).is_some() {
                return;
            }
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let now = jiff::Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name),
                namespace: Some(ns.clone()),
                uid: Some(uid),
                ..Default::default()
            },
            reason: Some(reason.to_string()),
            message: Some(note.chars().take(1000).collect()),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            source: Some(EventSource { component: Some("kubelet".into()), host: Some(self.node.clone()) }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            count: Some(1),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(self.node.clone()),
            action: Some(reason.to_string()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        tokio::spawn(async move {
            if let Err(e) = api.create(&PostParams::default(), &ev).await {
                tracing::debug!(error = %e, "publishing an event failed");
            }
        });
    }

    pub fn normal(&self, pod: &Pod, reason: &str, note: String) {
        self.publish(pod, false, reason, note)
    }

    pub fn warning(&self, pod: &Pod, reason: &str, note: String) {
        self.publish(pod, true, reason, note)
    }
}
