//! Kubernetes events about pods (core/v1 Events, which `kubectl describe` shows), with the
//! kubelet's reasons: Created, Started, Killing, BackOff, Failed, Unhealthy,
//! FailedCreatePodSandBox; and about other Nodes the pod network leaves out (InvalidVtep).
//! Written by `common::events` as component `kubelet` on this node;
//! repeats within a minute are dropped; publishing never blocks a pod worker.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::events::{Recorder, NORMAL, WARNING};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};

/// (pod UID, reason, message) → when it was last published.
type Recent = Arc<Mutex<HashMap<(String, String, String), Instant>>>;

#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    recent: Recent,
}

const REPEAT_WINDOW: Duration = Duration::from_secs(60);

/// The longest message an event carries.
const MAX_MESSAGE_CHARS: usize = 1000;

impl Events {
    pub fn new(client: kube::Client, node: &str) -> Events {
        Events { recorder: Recorder::new(client, "kubelet").with_host(node), recent: Arc::default() }
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
        let message: String = note.chars().take(MAX_MESSAGE_CHARS).collect();
        let type_ = if warning { WARNING } else { NORMAL };
        self.recorder.record(pod_reference(pod, uid), type_, reason, Some(reason), message);
    }

    pub fn normal(&self, pod: &Pod, reason: &str, note: String) {
        self.publish(pod, false, reason, note)
    }

    pub fn warning(&self, pod: &Pod, reason: &str, note: String) {
        self.publish(pod, true, reason, note)
    }

    /// A warning about Node `name` (another node: the VXLAN backend leaving it out).
    pub fn node_warning(&self, name: &str, uid: Option<String>, reason: &str, note: String) {
        if let Ok(mut recent) = self.recent.lock() {
            let now = Instant::now();
            recent.retain(|_, t| now.duration_since(*t) < REPEAT_WINDOW);
            if recent.insert((format!("node/{name}"), reason.to_string(), note.clone()), now).is_some() {
                return;
            }
        }
        let message: String = note.chars().take(MAX_MESSAGE_CHARS).collect();
        self.recorder.record(node_reference(name, uid), WARNING, reason, Some(reason), message);
    }
}

/// A Node as an event's `involvedObject` (cluster-scoped: the event goes to `default`).
fn node_reference(name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        uid,
        ..Default::default()
    }
}

/// The kubelet's `involvedObject`: the pod by name, namespace and UID.
fn pod_reference(pod: &Pod, uid: String) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.metadata.name.clone().unwrap_or_default()),
        namespace: Some(pod.metadata.namespace.clone().unwrap_or_else(|| "default".into())),
        uid: Some(uid),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn events_look_like_the_kubelets() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                uid: Some("u1".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let now = Timestamp::from_second(1).unwrap();
        let e = common::events::build(
            "kubelet",
            Some("node-1"),
            pod_reference(&pod, "u1".into()),
            WARNING,
            "BackOff",
            Some("BackOff"),
            "m".into(),
            now,
        );
        // The namespace defaults; the pod's resourceVersion is not part of the reference.
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.involved_object.namespace.as_deref(), Some("default"));
        assert_eq!(e.involved_object.resource_version, None);
        assert_eq!(e.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(e.source.and_then(|s| s.host).as_deref(), Some("node-1"));
        assert_eq!(e.reporting_instance.as_deref(), Some("node-1"));
        assert_eq!(e.action.as_deref(), Some("BackOff"));

        let e = common::events::build(
            "kubelet",
            Some("node-1"),
            node_reference("node-2", Some("u2".into())),
            WARNING,
            "InvalidVtep",
            Some("InvalidVtep"),
            "m".into(),
            now,
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
        assert_eq!(e.involved_object.namespace, None);
        assert_eq!(e.involved_object.name.as_deref(), Some("node-2"));
    }
}
