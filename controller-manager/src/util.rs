//! Helpers every controller shares: Service selectors, controller references, pod
//! readiness and availability, expectations, and the pod-from-template builder. All pure.
//! (Label selectors are `apimachinery::labels`.)

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Resource;

/// A map selector (`Service.spec.selector`): every pair must match; empty selects nothing.
pub fn map_selector_matches(sel: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

pub fn labels(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

/// The owner reference with `controller: true`, if any.
pub fn controller_ref(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references.iter().flatten().find(|r| r.controller == Some(true))
}

/// A controller reference to `owner` (controller and blockOwnerDeletion true).
pub fn owner_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

pub fn is_deleting(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

/// `controller.IsPodActive`: not Succeeded/Failed and not being deleted.
pub fn is_pod_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("");
    phase != "Succeeded" && phase != "Failed" && !is_deleting(&pod.metadata)
}

pub fn pod_phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// The pod's Ready condition: (is true, last transition time).
pub fn pod_ready(pod: &Pod) -> (bool, Option<Timestamp>) {
    let cond =
        pod.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match cond {
        Some(c) => (c.status == "True", c.last_transition_time.as_ref().map(|t| t.0)),
        None => (false, None),
    }
}

pub fn is_pod_ready(pod: &Pod) -> bool {
    pod_ready(pod).0
}

/// `podutil.IsPodAvailable`: ready for at least `min_ready_seconds`.
pub fn is_pod_available(pod: &Pod, min_ready_seconds: i32, now: Timestamp) -> bool {
    match pod_ready(pod) {
        (true, _) if min_ready_seconds <= 0 => true,
        (true, Some(since)) => {
            since.checked_add(SignedDuration::from_secs(min_ready_seconds as i64)).map(|t| t <= now).unwrap_or(false)
        }
        _ => false,
    }
}

/// When a pod that is ready but not yet available becomes available (for a requeue).
pub fn becomes_available_in(pod: &Pod, min_ready_seconds: i32, now: Timestamp) -> Option<Duration> {
    if min_ready_seconds <= 0 {
        return None;
    }
    match pod_ready(pod) {
        (true, Some(since)) => {
            let at = since.checked_add(SignedDuration::from_secs(min_ready_seconds as i64)).ok()?;
            let d = at.duration_since(now);
            (d.is_positive()).then(|| Duration::from_millis(d.as_millis() as u64 + 100))
        }
        _ => None,
    }
}

pub fn creation(meta: &ObjectMeta) -> Timestamp {
    meta.creation_timestamp.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A pod built from `template` for an owner (`controller.GetPodFromTemplate`).
pub fn pod_from_template(template: &PodTemplateSpec, namespace: &str, prefix: &str, owner: OwnerReference) -> Pod {
    let tmeta = template.metadata.clone().unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{prefix}-")),
            namespace: Some(namespace.to_string()),
            labels: tmeta.labels,
            annotations: tmeta.annotations,
            finalizers: tmeta.finalizers,
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// Controller expectations (`controller.ControllerExpectations`): the pods a controller
/// created or deleted and has not yet seen in its cache. While any are outstanding (and
/// younger than five minutes) the controller does not create or delete more, so a slow
/// watch never causes double creation.
#[derive(Default)]
pub struct Expectations {
    inner: Mutex<HashMap<String, Pending>>,
}

struct Pending {
    creates: HashSet<String>,
    deletes: HashSet<String>,
    since: Instant,
}

pub const EXPECTATIONS_TTL: Duration = Duration::from_secs(300);

impl Expectations {
    /// Record pod names created and pod UIDs deleted for `key`.
    pub fn expect(
        &self,
        key: &str,
        creates: impl IntoIterator<Item = String>,
        deletes: impl IntoIterator<Item = String>,
    ) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry(key.to_string()).or_insert_with(|| Pending {
            creates: HashSet::new(),
            deletes: HashSet::new(),
            since: Instant::now(),
        });
        e.creates.extend(creates);
        e.deletes.extend(deletes);
        e.since = Instant::now();
    }

    /// The cache saw `pod` (added, updated or deleted).
    pub fn observe(&self, key: &str, pod_name: &str, pod_uid: &str, gone_or_deleting: bool) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = m.get_mut(key) {
            e.creates.remove(pod_name);
            if gone_or_deleting {
                e.deletes.remove(pod_uid);
            }
            if e.creates.is_empty() && e.deletes.is_empty() {
                m.remove(key);
            }
        }
    }

    pub fn satisfied(&self, key: &str) -> bool {
        let m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match m.get(key) {
            None => true,
            Some(e) => e.since.elapsed() > EXPECTATIONS_TTL,
        }
    }

    /// A create or delete failed: forget that one expectation.
    pub fn lower(&self, key: &str, create: Option<&str>, delete: Option<&str>) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = m.get_mut(key) {
            if let Some(c) = create {
                e.creates.remove(c);
            }
            if let Some(d) = delete {
                e.deletes.remove(d);
            }
        }
    }
}

impl Expectations {
    /// Create `pod` for `key`, expecting to see it; the expectation is dropped again when
    /// the create fails.
    pub async fn create_pod(&self, api: &kube::Api<Pod>, key: &str, pod: &Pod) -> Result<(), kube::Error> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.expect(key, [name.clone()], []);
        let r = api.create(&Default::default(), pod).await;
        if r.is_err() {
            self.lower(key, Some(&name), None);
        }
        r.map(|_| ())
    }

    /// Delete the pod `name` with UID `uid` for `key`, expecting to see it go. `Ok(false)` when
    /// it is gone already or is another pod now (404, 409).
    pub async fn delete_pod(
        &self,
        api: &kube::Api<Pod>,
        key: &str,
        name: &str,
        uid: &str,
    ) -> Result<bool, kube::Error> {
        self.expect(key, [], [uid.to_string()]);
        let dp = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions { uid: Some(uid.to_string()), resource_version: None }),
            ..Default::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => Ok(true),
            Err(e) => {
                self.lower(key, None, Some(uid));
                match e {
                    kube::Error::Api(a) if a.code == 404 || a.code == 409 => Ok(false),
                    e => Err(e),
                }
            }
        }
    }
}

/// `intstr.GetScaledValueFromIntOrPercent`.
pub fn scaled_value(
    v: Option<&k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    total: i32,
    round_up: bool,
    default: &str,
) -> i32 {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let s = match v {
        Some(IntOrString::Int(i)) => return *i,
        Some(IntOrString::String(s)) => s.clone(),
        None => default.to_string(),
    };
    match s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
        Some(p) => {
            let x = p * total as i64;
            (if round_up { (x + 99).div_euclid(100) } else { x.div_euclid(100) }) as i32
        }
        None => s.parse().unwrap_or(0),
    }
}

/// `controller.ComputeHash` / `history.HashControllerRevision`: FNV-32a of `data` (and the
/// collision count, when there is one), encoded with `rand.SafeEncodeString`.
pub fn compute_hash(data: &[u8], collision_count: Option<i32>) -> String {
    let mut h: u32 = 0x811c9dc5;
    let mut feed = |b: &[u8]| {
        for x in b {
            h ^= *x as u32;
            h = h.wrapping_mul(0x01000193);
        }
    };
    feed(data);
    if let Some(c) = collision_count {
        feed(&(c as u32).to_le_bytes());
    }
    apimachinery::names::safe_encode_string(&h.to_string())
}

/// A write's result, with 404 (the object is gone already) as success.
pub fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Adopt `pod` (add `me` as its controller) or release it (remove `me`), guarded by its UID;
/// a failure is logged (the next sync decides again).
pub async fn set_controller(api: &kube::Api<Pod>, pod: &Pod, me: &OwnerReference, adopt: bool) {
    let mut refs: Vec<OwnerReference> = pod.metadata.owner_references.clone().unwrap_or_default();
    refs.retain(|r| r.uid != me.uid);
    if adopt {
        refs.push(me.clone());
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    let patch = serde_json::json!({"metadata": {"ownerReferences": refs, "uid": pod.metadata.uid}});
    if let Err(e) = api.patch(&name, &Default::default(), &kube::api::Patch::Merge(&patch)).await {
        tracing::warn!(pod = %name, error = %e, adopt, "changing the pod's controller");
    }
}

/// `namespace/name` of an object.
pub fn key(meta: &ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or(""), meta.name.as_deref().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn l(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn service_selectors() {
        assert!(map_selector_matches(&l(&[("app", "a")]), &l(&[("app", "a"), ("tier", "web")])));
        assert!(!map_selector_matches(&l(&[("app", "a")]), &l(&[("app", "b")])));
        assert!(!map_selector_matches(&BTreeMap::new(), &l(&[("app", "a")])));
    }

    #[test]
    fn percentages_round_like_kubernetes() {
        let p = IntOrString::String("25%".into());
        assert_eq!(scaled_value(Some(&p), 10, true, "25%"), 3);
        assert_eq!(scaled_value(Some(&p), 10, false, "25%"), 2);
        assert_eq!(scaled_value(Some(&IntOrString::Int(2)), 10, true, "25%"), 2);
        assert_eq!(scaled_value(None, 4, false, "25%"), 1);
    }

    #[test]
    fn expectations_block_until_observed() {
        let e = Expectations::default();
        e.expect("ns/rs", ["p1".to_string()], ["uid2".to_string()]);
        assert!(!e.satisfied("ns/rs"));
        e.observe("ns/rs", "p1", "uid1", false);
        assert!(!e.satisfied("ns/rs"));
        e.observe("ns/rs", "p2", "uid2", true);
        assert!(e.satisfied("ns/rs"));
    }
}
