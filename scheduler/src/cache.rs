//! The scheduler cache: the [`Snapshot`] of nodes and the pods on them, kept current from
//! the pod and node watches, plus *assumed* pods — pods the scheduler has placed but whose
//! binding the watch has not confirmed yet — so two pods are never given the last free
//! slot. Assumed pods whose binding finished but never showed up expire.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::framework::{NodeData, PodInfo, Snapshot};

/// How long an assumed pod whose binding succeeded may wait for the watch to confirm it.
pub const ASSUMED_POD_TTL: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct PodState {
    node: String,
    assumed: bool,
    /// When binding finished, for the TTL of an assumed pod.
    bound_at: Option<Instant>,
}

/// Snapshot + per-pod bookkeeping.
#[derive(Debug, Default)]
pub struct Cache {
    pub snapshot: Snapshot,
    pods: HashMap<String, PodState>,
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

impl Cache {
    pub fn is_assumed(&self, k: &str) -> bool {
        self.pods.get(k).is_some_and(|p| p.assumed)
    }
    /// Is the pod known (assumed or confirmed) on some node?
    pub fn contains(&self, k: &str) -> bool {
        self.pods.contains_key(k)
    }
    pub fn num_pods(&self) -> usize {
        self.pods.len()
    }

    /// Record a scheduling decision before binding.
    pub fn assume(&mut self, pod: Arc<PodInfo>, node: &str) {
        let k = pod.key();
        self.remove(&k);
        let mut p = (*pod).clone();
        p.node_name = node.to_string();
        self.snapshot.add_pod(node, Arc::new(p));
        self.pods.insert(k, PodState { node: node.to_string(), assumed: true, bound_at: None });
    }
    /// The binding call succeeded; the watch should confirm it soon.
    pub fn finish_binding(&mut self, k: &str) {
        if let Some(p) = self.pods.get_mut(k) {
            if p.assumed {
                p.bound_at = Some(Instant::now());
            }
        }
    }
    /// The binding failed: undo the assumption.
    pub fn forget(&mut self, k: &str) {
        if self.is_assumed(k) {
            self.remove(k);
        }
    }
    /// A pod from the watch. Assigned, non-terminal pods count on their node; anything
    /// else is dropped from the cache (unless it is still assumed). Returns true when the
    /// pod newly appeared on a node (not confirming an assumption).
    pub fn upsert_pod(&mut self, pod: Arc<PodInfo>) -> bool {
        let k = pod.key();
        if pod.node_name.is_empty() {
            if !self.is_assumed(&k) {
                self.remove(&k);
            }
            return false;
        }
        if pod.terminal {
            self.remove(&k);
            return false;
        }
        let newly = !self.pods.contains_key(&k);
        if let Some(st) = self.pods.get(&k) {
            let node = st.node.clone();
            self.snapshot.remove_pod(&node, &pod.namespace, &pod.name);
        }
        self.snapshot.add_pod(&pod.node_name, pod.clone());
        self.pods.insert(k, PodState { node: pod.node_name.clone(), assumed: false, bound_at: None });
        newly
    }
    /// The pod is gone. Returns true if it occupied a node.
    pub fn delete_pod(&mut self, namespace: &str, name: &str) -> bool {
        self.remove(&key(namespace, name))
    }
    fn remove(&mut self, k: &str) -> bool {
        let Some(st) = self.pods.remove(k) else { return false };
        let (ns, name) = k.split_once('/').unwrap_or(("", k));
        self.snapshot.remove_pod(&st.node, ns, name);
        true
    }
    /// Add or update a node; true if it is new or changed in a way that could make an
    /// unschedulable pod fit.
    pub fn upsert_node(&mut self, node: NodeData) -> bool {
        let relevant = match self.snapshot.get(&node.name).and_then(|ni| ni.node.as_ref()) {
            None => true,
            Some(old) => old.scheduling_relevant_change(&node),
        };
        self.snapshot.set_node(node);
        relevant
    }
    pub fn delete_node(&mut self, name: &str) {
        self.snapshot.remove_node(name);
    }
    /// Drop assumed pods whose binding finished more than `ttl` ago without confirmation.
    pub fn cleanup_expired(&mut self, now: Instant, ttl: Duration) -> usize {
        let expired: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, p)| p.assumed && p.bound_at.is_some_and(|t| now.duration_since(t) > ttl))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &expired {
            self.remove(k);
        }
        expired.len()
    }
    /// Keys of every pod in the cache (for watch relists).
    pub fn confirmed_keys(&self) -> Vec<String> {
        self.pods.iter().filter(|(_, p)| !p.assumed).map(|(k, _)| k.clone()).collect()
    }
    pub fn node_names(&self) -> Vec<String> {
        self.snapshot.nodes.iter().filter(|n| n.node.is_some()).map(|n| n.name().to_string()).collect()
    }
    pub fn remove_key(&mut self, k: &str) {
        self.remove(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::types::testutil::*;
    use serde_json::json;

    #[test]
    fn assumed_pods_take_resources_until_forgotten_or_confirmed() {
        let mut c = Cache::default();
        c.upsert_node(node_l("a", json!({})));
        let p = pod_req("p", "3", "1Gi");
        c.assume(p.clone(), "a");
        assert!(c.is_assumed("default/p"));
        assert_eq!(c.snapshot.get("a").unwrap().requested.milli_cpu, 3000);
        c.forget("default/p");
        assert_eq!(c.snapshot.get("a").unwrap().requested.milli_cpu, 0);

        c.assume(p.clone(), "a");
        c.finish_binding("default/p");
        let mut bound = (*p).clone();
        bound.node_name = "a".into();
        assert!(!c.upsert_pod(Arc::new(bound)), "confirmation is not a new pod");
        assert!(!c.is_assumed("default/p"));
        assert_eq!(c.snapshot.get("a").unwrap().pods.len(), 1);
        assert!(c.delete_pod("default", "p"));
        assert_eq!(c.snapshot.get("a").unwrap().pods.len(), 0);
    }

    #[test]
    fn expired_assumptions_are_dropped() {
        let mut c = Cache::default();
        c.upsert_node(node_l("a", json!({})));
        c.assume(pod_req("p", "1", "1Gi"), "a");
        assert_eq!(
            c.cleanup_expired(Instant::now() + Duration::from_secs(60), ASSUMED_POD_TTL),
            0,
            "binding not finished"
        );
        c.finish_binding("default/p");
        assert_eq!(c.cleanup_expired(Instant::now() + Duration::from_secs(60), ASSUMED_POD_TTL), 1);
        assert_eq!(c.snapshot.get("a").unwrap().pods.len(), 0);
    }

    #[test]
    fn node_changes_are_classified() {
        let mut c = Cache::default();
        assert!(c.upsert_node(node_l("a", json!({}))));
        assert!(!c.upsert_node(node_l("a", json!({}))));
        assert!(c.upsert_node(node_l("a", json!({"zone": "z"}))));
    }

    #[test]
    fn terminal_pods_free_their_node() {
        let mut c = Cache::default();
        c.upsert_node(node_l("a", json!({})));
        c.upsert_pod(pod(json!({"metadata": {"name": "p"}, "spec": {"nodeName": "a"}})));
        assert_eq!(c.snapshot.get("a").unwrap().pods.len(), 1);
        c.upsert_pod(pod(
            json!({"metadata": {"name": "p"}, "spec": {"nodeName": "a"}, "status": {"phase": "Succeeded"}}),
        ));
        assert_eq!(c.snapshot.get("a").unwrap().pods.len(), 0);
    }
}
