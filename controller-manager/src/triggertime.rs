//! The `endpoints.kubernetes.io/last-change-trigger-time` annotation of EndpointSlices
//! (Kubernetes' `TriggerTimeTracker`): when the change that an endpoints update carries
//! happened — the earliest of the changes seen since the Service's previous sync, where a
//! pod's change is its Ready condition's last transition and the Service's is its creation.
//! A Service seen for the first time reports its creation. kube-proxy measures
//! `network_programming_duration_seconds` from it to the moment its rules carry the change.
//!
//! Pure: [`TriggerTimes::compute`] takes the objects and keeps what it needs for next time.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::jiff::Timestamp;

use crate::util::{creation, pod_ready};

pub const ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

#[derive(Default)]
struct State {
    service: Option<Timestamp>,
    pods: HashMap<String, Timestamp>,
}

/// What each Service's last sync saw, by namespace/name.
#[derive(Default)]
pub struct TriggerTimes {
    services: HashMap<(String, String), State>,
}

impl TriggerTimes {
    /// The trigger time of a sync of `svc` whose selected pods are `pods`; None when
    /// nothing that triggers changed (the annotation is then left as it is).
    pub fn compute<'a>(&mut self, svc: &Service, pods: impl IntoIterator<Item = &'a Pod>) -> Option<Timestamp> {
        let key = (svc.metadata.namespace.clone().unwrap_or_default(), svc.metadata.name.clone().unwrap_or_default());
        let known = self.services.contains_key(&key);
        let state = self.services.entry(key).or_default();
        let mut earliest: Option<Timestamp> = None;
        let mut seen = HashMap::new();
        for pod in pods {
            let (_, Some(t)) = pod_ready(pod) else { continue };
            let name = pod.metadata.name.clone().unwrap_or_default();
            if state.pods.get(&name).is_none_or(|before| t > *before) {
                earliest = Some(earliest.map_or(t, |e| e.min(t)));
            }
            seen.insert(name, t);
        }
        let service = creation(&svc.metadata);
        if state.service.is_none_or(|before| service > before) {
            earliest = Some(earliest.map_or(service, |e| e.min(service)));
        }
        state.pods = seen;
        state.service = Some(service);
        if known {
            earliest
        } else {
            Some(service)
        }
    }

    /// Forget Services for which `keep` says no (deleted ones).
    pub fn retain(&mut self, keep: impl Fn(&str, &str) -> bool) {
        self.services.retain(|(ns, name), _| keep(ns, name));
    }

    pub fn len(&self) -> usize {
        self.services.len()
    }
}

/// The annotation's value: RFC 3339 with nanoseconds, as Go's `time.RFC3339Nano`.
pub fn format(t: Timestamp) -> String {
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(created: &str) -> Service {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns", "creationTimestamp": created}}))
            .unwrap()
    }
    fn pod(name: &str, ready_at: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ready_at}]}}))
        .unwrap()
    }
    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_earliest_change_since_the_last_sync() {
        let mut tt = TriggerTimes::default();
        let s = svc("2026-01-01T00:00:00Z");
        let a = pod("a", "2026-01-01T00:01:00Z");
        // First sight of the Service: its creation.
        assert_eq!(tt.compute(&s, [&a]), Some(t("2026-01-01T00:00:00Z")));
        // Nothing changed: no trigger.
        assert_eq!(tt.compute(&s, [&a]), None);
        // Two pods became ready: the earlier of the two.
        let b = pod("b", "2026-01-01T00:03:00Z");
        let a2 = pod("a", "2026-01-01T00:02:00Z");
        assert_eq!(tt.compute(&s, [&a2, &b]), Some(t("2026-01-01T00:02:00Z")));
        // A pod gone is not a trigger time of its own (the sync happens, with no time).
        assert_eq!(tt.compute(&s, [&b]), None);
        // A Service recreated under the same name: its new creation.
        let s2 = svc("2026-01-02T00:00:00Z");
        assert_eq!(tt.compute(&s2, [&b]), Some(t("2026-01-02T00:00:00Z")));
        tt.retain(|_, _| false);
        assert_eq!(tt.len(), 0);
        assert_eq!(format(t("2026-01-01T00:00:00.5Z")), "2026-01-01T00:00:00.5Z");
    }
}
