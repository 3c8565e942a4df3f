//! The pod lifecycle event generator: relists Docker every second (sooner when Docker's
//! event stream says something happened), compares with the previous relist and tells the
//! pod workers what changed. The comparison is the pure [`diff`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;

use crate::runtime::{ContainerRecord, Runtime, State};

/// Kubernetes' PLEG event names.
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    ContainerChanged,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    pub pod_uid: String,
    pub container_id: String,
    pub kind: EventType,
}

/// What the last relist saw of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub pod_uid: String,
    pub state: State,
}

pub fn snapshot(records: &[ContainerRecord]) -> HashMap<String, Seen> {
    records.iter().map(|r| (r.id.clone(), Seen { pod_uid: r.pod_uid.clone(), state: r.state })).collect()
}

/// The events that turn `old` into `new`.
pub fn diff(old: &HashMap<String, Seen>, new: &HashMap<String, Seen>) -> Vec<PodLifecycleEvent> {
    let mut out = Vec::new();
    for (id, n) in new {
        let before = old.get(id).map(|o| o.state);
        let kind = match (before, n.state) {
            (Some(a), b) if a == b => continue,
            (_, State::Running) => EventType::ContainerStarted,
            (Some(State::Running), State::Exited) | (None, State::Exited) => EventType::ContainerDied,
            _ => EventType::ContainerChanged,
        };
        out.push(PodLifecycleEvent { pod_uid: n.pod_uid.clone(), container_id: id.clone(), kind });
    }
    for (id, o) in old {
        if !new.contains_key(id) {
            if o.state == State::Running {
                out.push(PodLifecycleEvent {
                    pod_uid: o.pod_uid.clone(),
                    container_id: id.clone(),
                    kind: EventType::ContainerDied,
                });
            }
            out.push(PodLifecycleEvent {
                pod_uid: o.pod_uid.clone(),
                container_id: id.clone(),
                kind: EventType::ContainerRemoved,
            });
        }
    }
    out.sort_by(|a, b| (&a.pod_uid, &a.container_id).cmp(&(&b.pod_uid, &b.container_id)));
    out
}

/// Run forever: relist, diff, hand each event to `sink`. `relisted` gets every full list
/// (the kubelet uses it to find pods that have containers but no API object).
pub async fn run(
    rt: Arc<Runtime>,
    sink: impl Fn(PodLifecycleEvent) + Send + Sync + 'static,
    relisted: impl Fn(&[ContainerRecord]) + Send + Sync + 'static,
) {
    let wake = Arc::new(Notify::new());
    {
        let (rt, wake) = (rt.clone(), wake.clone());
        tokio::spawn(async move { watch_docker_events(rt, wake).await });
    }
    let mut old: HashMap<String, Seen> = HashMap::new();
    loop {
        match rt.list(None).await {
            Ok(records) => {
                let new = snapshot(&records);
                for ev in diff(&old, &new) {
                    tracing::debug!(pod = %ev.pod_uid, container = %ev.container_id, kind = ?ev.kind, "PLEG event");
                    sink(ev);
                }
                old = new;
                relisted(&records);
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "PLEG relist failed"),
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), wake.notified()).await;
    }
}

/// Wake the relist whenever Docker reports a container event of this node.
async fn watch_docker_events(rt: Arc<Runtime>, wake: Arc<Notify>) {
    loop {
        let mut events = std::pin::pin!(rt.container_events());
        while let Some(ev) = events.next().await {
            match ev {
                Ok(action) => {
                    if matches!(action.as_str(), "start" | "die" | "destroy" | "create") {
                        wake.notify_one();
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "docker event stream error");
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pod: &str, state: State) -> Seen {
        Seen { pod_uid: pod.into(), state }
    }

    #[test]
    fn started_died_removed() {
        let old =
            HashMap::from([("a".to_string(), seen("p", State::Running)), ("b".to_string(), seen("p", State::Running))]);
        let new =
            HashMap::from([("a".to_string(), seen("p", State::Exited)), ("c".to_string(), seen("q", State::Running))]);
        let ev = diff(&old, &new);
        let kinds: Vec<(&str, EventType)> = ev.iter().map(|e| (e.container_id.as_str(), e.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                ("a", EventType::ContainerDied),
                ("b", EventType::ContainerDied),
                ("b", EventType::ContainerRemoved),
                ("c", EventType::ContainerStarted)
            ]
        );
        assert_eq!(ev[3].pod_uid, "q");
    }

    #[test]
    fn nothing_changed_nothing_emitted() {
        let s = HashMap::from([("a".to_string(), seen("p", State::Running))]);
        assert!(diff(&s, &s).is_empty());
    }

    #[test]
    fn exited_container_removed_only_once() {
        let old = HashMap::from([("a".to_string(), seen("p", State::Exited))]);
        let ev = diff(&old, &HashMap::new());
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].kind, EventType::ContainerRemoved);
    }
}
