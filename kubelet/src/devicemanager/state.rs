//! The device manager's bookkeeping, pure: which devices each registered resource has and
//! their health, which containers hold which devices (with what their plugin answered, so a
//! restarted container or kubelet gets the same devices the same way), the node's capacity
//! and allocatable counts, the choice of devices for a container, and the checkpoint file's
//! format.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use base64::Engine;
use deviceplugin::v1beta1::ContainerAllocateResponse;
use prost::Message;
use serde::{Deserialize, Serialize};

/// One registered resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resource {
    /// Device id → healthy.
    pub devices: BTreeMap<String, bool>,
    /// The plugin is connected (its ListAndWatch stream is open). A resource whose plugin is
    /// gone keeps its capacity with nothing allocatable for [`GONE_GRACE`], then has none.
    pub live: bool,
    /// When the plugin went (or the kubelet started with the resource only in its checkpoint).
    pub gone_at: Option<Instant>,
}

/// How long a resource whose plugin is gone keeps its capacity (Kubernetes' endpoint stop
/// grace period): a plugin restarting within it finds its devices as it left them.
pub const GONE_GRACE: Duration = Duration::from_secs(5 * 60);

/// Devices held by one container for one resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    #[serde(rename = "ContainerName")]
    pub container: String,
    #[serde(rename = "ResourceName")]
    pub resource: String,
    #[serde(rename = "DeviceIDs")]
    pub device_ids: Vec<String>,
    /// The plugin's Allocate answer, protobuf-encoded in base64 (empty while it is awaited).
    #[serde(rename = "AllocResp", default)]
    pub response: String,
}

impl Entry {
    pub fn response(&self) -> ContainerAllocateResponse {
        base64::engine::general_purpose::STANDARD
            .decode(&self.response)
            .ok()
            .and_then(|b| ContainerAllocateResponse::decode(b.as_slice()).ok())
            .unwrap_or_default()
    }

    pub fn set_response(&mut self, r: &ContainerAllocateResponse) {
        self.response = base64::engine::general_purpose::STANDARD.encode(r.encode_to_vec());
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    pub resources: BTreeMap<String, Resource>,
    pub entries: Vec<Entry>,
}

/// What the kubelet writes to `<device-plugin dir>/kubelet_internal_checkpoint`.
#[derive(Debug, Serialize, Deserialize)]
struct Checkpoint {
    #[serde(rename = "Data")]
    data: CheckpointData,
}

#[derive(Debug, Serialize, Deserialize)]
struct CheckpointData {
    #[serde(rename = "PodDeviceEntries", default)]
    entries: Vec<Entry>,
    #[serde(rename = "RegisteredDevices", default)]
    registered: BTreeMap<String, Vec<String>>,
}

/// Kubernetes' message when a container asks for more devices than are free.
pub fn unavailable(resource: &str, requested: usize, available: usize) -> String {
    format!("requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}")
}

/// Pick `need` of the `free` devices, the plugin's `preferred` ones first (those not free are
/// ignored); in the order given otherwise.
pub fn choose(resource: &str, need: usize, free: &[String], preferred: &[String]) -> Result<Vec<String>, String> {
    if need > free.len() {
        return Err(unavailable(resource, need, free.len()));
    }
    let mut out: Vec<String> = preferred.iter().filter(|p| free.contains(p)).take(need).cloned().collect();
    for id in free {
        if out.len() == need {
            break;
        }
        if !out.contains(id) {
            out.push(id.clone());
        }
    }
    Ok(out)
}

impl State {
    /// The resources for the Node's status at `now`: name → (capacity, allocatable).
    /// Capacity counts every device, allocatable the healthy ones of a connected plugin; a
    /// resource whose plugin has been gone for longer than [`GONE_GRACE`] has 0 of both.
    pub fn node_resources(&self, now: Instant) -> BTreeMap<String, (usize, usize)> {
        self.resources
            .iter()
            .map(|(name, r)| {
                let expired = !r.live && r.gone_at.is_some_and(|t| now.saturating_duration_since(t) >= GONE_GRACE);
                let healthy = if r.live { r.devices.values().filter(|h| **h).count() } else { 0 };
                (name.clone(), if expired { (0, 0) } else { (r.devices.len(), healthy) })
            })
            .collect()
    }

    /// A plugin's latest device list (its stream is open).
    pub fn set_devices(&mut self, resource: &str, devices: BTreeMap<String, bool>) {
        let r = self.resources.entry(resource.to_string()).or_default();
        r.devices = devices;
        r.live = true;
        r.gone_at = None;
    }

    /// The plugin's stream ended at `now`: its devices stay in capacity for a while, none is
    /// allocatable.
    pub fn plugin_gone(&mut self, resource: &str, now: Instant) {
        if let Some(r) = self.resources.get_mut(resource) {
            r.live = false;
            r.gone_at = Some(now);
        }
    }

    pub fn is_registered(&self, resource: &str) -> bool {
        self.resources.contains_key(resource)
    }

    /// The devices `pod`'s `container` holds of `resource`, if any.
    pub fn held(&self, pod: &str, container: &str, resource: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.pod_uid == pod && e.container == container && e.resource == resource)
    }

    /// Healthy devices of a connected plugin that no container holds, in id order.
    #[cfg(test)]
    pub fn free(&self, resource: &str) -> Vec<String> {
        self.free_for(resource, "", &[])
    }

    /// [`free`](Self::free) for a container of `pod`, to which the devices of the pod's
    /// `reusable` containers (its init containers, done before it starts) are free too.
    pub fn free_for(&self, resource: &str, pod: &str, reusable: &[String]) -> Vec<String> {
        let Some(r) = self.resources.get(resource).filter(|r| r.live) else { return vec![] };
        let used: HashSet<&str> = self
            .entries
            .iter()
            .filter(|e| e.resource == resource && !(e.pod_uid == pod && reusable.contains(&e.container)))
            .flat_map(|e| e.device_ids.iter().map(String::as_str))
            .collect();
        r.devices
            .iter()
            .filter(|(id, healthy)| **healthy && !used.contains(id.as_str()))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Free the devices of pods that are not in `active`; true if any were freed.
    pub fn retain_pods(&mut self, active: &HashSet<String>) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| active.contains(&e.pod_uid));
        self.entries.len() != before
    }

    /// Free the devices of one pod; true if it held any.
    pub fn release_pod(&mut self, pod: &str) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.pod_uid != pod);
        self.entries.len() != before
    }

    /// The checkpoint: the allocations and every registered resource's devices.
    pub fn checkpoint(&self) -> Vec<u8> {
        let registered = self.resources.iter().map(|(n, r)| (n.clone(), r.devices.keys().cloned().collect())).collect();
        let c = Checkpoint { data: CheckpointData { entries: self.entries.clone(), registered } };
        serde_json::to_vec_pretty(&c).unwrap_or_default()
    }

    /// The state a checkpoint describes, read at `now`: the allocations, and the resources with
    /// their devices known but not allocatable until their plugins register again (gone since
    /// `now`).
    pub fn from_checkpoint(bytes: &[u8], now: Instant) -> Result<State, serde_json::Error> {
        let c: Checkpoint = serde_json::from_slice(bytes)?;
        let resources = c
            .data
            .registered
            .into_iter()
            .map(|(name, ids)| {
                let devices = ids.into_iter().map(|id| (id, false)).collect();
                (name, Resource { devices, live: false, gone_at: Some(now) })
            })
            .collect();
        Ok(State { resources, entries: c.data.entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs(v: &[(&str, bool)]) -> BTreeMap<String, bool> {
        v.iter().map(|(id, h)| (id.to_string(), *h)).collect()
    }

    fn entry(pod: &str, ids: &[&str]) -> Entry {
        Entry {
            pod_uid: pod.into(),
            container: "c".into(),
            resource: "example.com/widget".into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
            response: String::new(),
        }
    }

    const W: &str = "example.com/widget";

    #[test]
    fn capacity_counts_devices_and_allocatable_the_healthy_ones_of_a_live_plugin() {
        let mut s = State::default();
        s.set_devices(W, devs(&[("a", true), ("b", false), ("c", true)]));
        let t0 = Instant::now();
        assert_eq!(s.node_resources(t0)[W], (3, 2));
        s.plugin_gone(W, t0);
        assert_eq!(s.node_resources(t0)[W], (3, 0));
        assert!(s.free(W).is_empty());
        // After the grace period the resource has no capacity; a plugin that returns brings it back.
        assert_eq!(s.node_resources(t0 + GONE_GRACE - Duration::from_secs(1))[W], (3, 0));
        assert_eq!(s.node_resources(t0 + GONE_GRACE)[W], (0, 0));
        s.set_devices(W, devs(&[("a", true)]));
        assert_eq!(s.node_resources(t0 + GONE_GRACE * 2)[W], (1, 1));
    }

    #[test]
    fn held_devices_are_not_free_until_their_pod_goes() {
        let mut s = State::default();
        s.set_devices(W, devs(&[("a", true), ("b", true), ("c", true)]));
        s.entries.push(entry("p1", &["b"]));
        assert_eq!(s.free(W), ["a", "c"]);
        assert!(!s.retain_pods(&HashSet::from(["p1".to_string()])));
        assert!(s.retain_pods(&HashSet::new()));
        assert_eq!(s.free(W), ["a", "b", "c"]);
        s.entries.push(entry("p2", &["a"]));
        assert!(s.release_pod("p2"));
        assert!(!s.release_pod("p2"));
    }

    #[test]
    fn an_init_containers_devices_go_on_to_the_pods_next_containers() {
        let mut s = State::default();
        s.set_devices(W, devs(&[("a", true), ("b", true)]));
        let mut init = entry("p1", &["a"]);
        init.container = "init".into();
        s.entries.push(init);
        s.entries.push(entry("p2", &["b"]));
        assert!(s.free(W).is_empty());
        assert_eq!(s.free_for(W, "p1", &["init".to_string()]), ["a"]);
        assert!(s.free_for(W, "p2", &["init".to_string()]).is_empty());
    }

    #[test]
    fn choice_prefers_the_plugins_pick_and_refuses_too_many() {
        let free: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        assert_eq!(choose(W, 2, &free, &[]).unwrap(), ["a", "b"]);
        assert_eq!(choose(W, 2, &free, &["c".into(), "x".into()]).unwrap(), ["c", "a"]);
        assert_eq!(
            choose(W, 4, &free, &[]).unwrap_err(),
            "requested number of devices unavailable for example.com/widget. Requested: 4, Available: 3"
        );
    }

    #[test]
    fn the_checkpoint_keeps_allocations_and_answers_across_a_restart() {
        let mut s = State::default();
        s.set_devices(W, devs(&[("a", true), ("b", true)]));
        let mut e = entry("p1", &["a"]);
        let resp =
            ContainerAllocateResponse { envs: [("K".to_string(), "v".to_string())].into(), ..Default::default() };
        e.set_response(&resp);
        s.entries.push(e);
        let now = Instant::now();
        let back = State::from_checkpoint(&s.checkpoint(), now).unwrap();
        assert_eq!(back.entries, s.entries);
        assert_eq!(back.entries[0].response(), resp);
        // Known but not allocatable until the plugin is back; its devices stay held.
        assert_eq!(back.node_resources(now)[W], (2, 0));
        assert_eq!(back.node_resources(now + GONE_GRACE)[W], (0, 0));
        let mut back = back;
        back.set_devices(W, devs(&[("a", true), ("b", true)]));
        assert_eq!(back.free(W), ["b"]);
        assert!(State::from_checkpoint(b"not json", now).is_err());
    }
}
