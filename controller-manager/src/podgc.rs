//! The pod garbage collector (`pkg/controller/podgc`): every [`GC_CHECK_PERIOD`], once the
//! pod and node informers have synced, it force-deletes (grace 0)
//!
//! - orphaned pods: bound to a node that no longer exists. A node missing from the cache is
//!   quarantined first (`--pod-gc-orphan-quarantine`, upstream's 40 s constant) and then
//!   confirmed absent by a live read (404), so a node that was only late to reach the cache
//!   never loses its pods;
//! - unscheduled pods being deleted (no kubelet will ever finish them);
//! - terminated pods (Succeeded / Failed) above `--terminated-pod-gc-threshold` (12500; 0
//!   disables), oldest first.
//!
//! [`plan`] is the decision (pure); [`run`] reads the caches, confirms the quarantined
//! nodes, and deletes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Preconditions};

use crate::informer::Informer;
use crate::util::{creation, is_deleting, pod_phase};

/// How often the collector runs (upstream's `gcCheckPeriod`).
pub const GC_CHECK_PERIOD: Duration = Duration::from_secs(20);

/// The collector's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct PodGcArgs {
    /// Terminated pods that may exist before the collector deletes the oldest ones
    /// (0 disables deleting terminated pods).
    #[arg(long, default_value_t = 12500)]
    pub terminated_pod_gc_threshold: i64,
    /// How long a node must be missing before its pods count as orphaned (upstream's
    /// `quarantineTime`, a constant there).
    #[arg(long, default_value = "40s", value_parser = crate::parse_duration)]
    pub pod_gc_orphan_quarantine: Duration,
}

/// A pod to delete: namespace, name, uid (the delete's precondition).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodRef {
    fn of(p: &Pod) -> PodRef {
        PodRef {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            uid: p.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

/// What one pass does.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Terminated pods over the threshold and unscheduled terminating pods: delete now.
    pub delete: Vec<(PodRef, &'static str)>,
    /// Nodes missing past their quarantine, with their pods: delete those once a live read
    /// confirms the node is gone.
    pub orphans: BTreeMap<String, Vec<PodRef>>,
    /// When to run again: the check period, or sooner when a quarantine ends sooner.
    pub requeue: Duration,
}

fn node_of(p: &Pod) -> &str {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("")
}

fn terminated(p: &Pod) -> bool {
    matches!(pod_phase(p), "Succeeded" | "Failed")
}

/// One pass at `now`. `missing_since` is the collector's memory of when each missing node was
/// first seen missing: nodes that are back (or have no pods left) are forgotten, new ones
/// recorded.
pub fn plan<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    nodes: &BTreeSet<String>,
    missing_since: &mut BTreeMap<String, Timestamp>,
    args: &PodGcArgs,
    now: Timestamp,
) -> Plan {
    let pods: Vec<&Pod> = pods.into_iter().collect();
    let mut plan = Plan { requeue: GC_CHECK_PERIOD, ..Default::default() };
    let mut chosen = BTreeSet::new();

    // Terminated pods over the threshold, oldest first (name breaks ties).
    if args.terminated_pod_gc_threshold > 0 {
        let mut done: Vec<&Pod> = pods.iter().copied().filter(|p| terminated(p)).collect();
        let excess = done.len() as i64 - args.terminated_pod_gc_threshold;
        if excess > 0 {
            done.sort_by(|a, b| {
                (creation(&a.metadata), &a.metadata.name).cmp(&(creation(&b.metadata), &b.metadata.name))
            });
            for p in done.into_iter().take(excess as usize) {
                let r = PodRef::of(p);
                if chosen.insert(r.clone()) {
                    plan.delete.push((r, "terminated pod over the threshold"));
                }
            }
        }
    }

    // Orphans: grouped by their missing node; a node's quarantine starts when first seen.
    let mut by_missing: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for p in &pods {
        let node = node_of(p);
        if !node.is_empty() && !nodes.contains(node) {
            by_missing.entry(node).or_default().push(p);
        }
    }
    missing_since.retain(|n, _| by_missing.contains_key(n.as_str()));
    let quarantine = SignedDuration::try_from(args.pod_gc_orphan_quarantine).unwrap_or(SignedDuration::from_secs(40));
    for (node, ps) in by_missing {
        let since = *missing_since.entry(node.to_string()).or_insert(now);
        let ends = since.checked_add(quarantine).unwrap_or(since);
        if ends <= now {
            let refs: Vec<PodRef> = ps.iter().map(|p| PodRef::of(p)).filter(|r| !chosen.contains(r)).collect();
            if !refs.is_empty() {
                plan.orphans.insert(node.to_string(), refs);
            }
        } else {
            let left = Duration::try_from(now.duration_until(ends)).unwrap_or(GC_CHECK_PERIOD);
            plan.requeue = plan.requeue.min(left);
        }
    }

    // Unscheduled pods being deleted: no kubelet finishes them.
    for p in &pods {
        if node_of(p).is_empty() && is_deleting(&p.metadata) {
            let r = PodRef::of(p);
            if chosen.insert(r.clone()) {
                plan.delete.push((r, "unscheduled terminating pod"));
            }
        }
    }
    plan
}

/// Force-delete one pod (grace 0, only this uid); a pod already gone is fine.
async fn force_delete(client: &kube::Client, r: &PodRef, why: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &r.namespace);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: Some(r.uid.clone()), resource_version: None }),
        ..Default::default()
    };
    match api.delete(&r.name, &dp).await {
        Ok(_) => tracing::info!(pod = %format!("{}/{}", r.namespace, r.name), reason = why, "pod garbage collected"),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => tracing::warn!(pod = %format!("{}/{}", r.namespace, r.name), error = %e, "pod gc delete failed"),
    }
}

/// The collector's loop.
pub async fn run(client: kube::Client, pods: Informer<Pod>, args: PodGcArgs) {
    let nodes = Informer::start(Api::<Node>::all(client.clone()));
    pods.synced().await;
    nodes.synced().await;
    let nodes_api: Api<Node> = Api::all(client.clone());
    let mut missing_since = BTreeMap::new();
    loop {
        let names: BTreeSet<String> = nodes.state().iter().filter_map(|n| n.metadata.name.clone()).collect();
        let all = pods.state();
        let p = plan(all.iter().map(|p| p.as_ref()), &names, &mut missing_since, &args, Timestamp::now());
        for (r, why) in &p.delete {
            force_delete(&client, r, why).await;
        }
        for (node, refs) in &p.orphans {
            match nodes_api.get_opt(node).await {
                Ok(None) => {
                    for r in refs {
                        force_delete(&client, r, "orphaned pod: its node is gone").await;
                    }
                }
                // The cache is behind: the node exists after all.
                Ok(Some(_)) => {
                    missing_since.remove(node);
                }
                Err(e) => tracing::warn!(%node, error = %e, "pod gc: cannot read node"),
            }
        }
        tokio::time::sleep(p.requeue.max(Duration::from_millis(100))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{at, make_running, now, pod, set_phase};
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn args(threshold: i64, quarantine: u64) -> PodGcArgs {
        PodGcArgs { terminated_pod_gc_threshold: threshold, pod_gc_orphan_quarantine: Duration::from_secs(quarantine) }
    }

    fn on(name: &str, node: &str) -> Pod {
        let mut p = pod::<ReplicaSet>(name, &[], None);
        make_running(&mut p, node, true, 10);
        p
    }

    fn nodes(n: &[&str]) -> BTreeSet<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.delete.iter().map(|(r, _)| r.name.as_str()).collect()
    }

    #[test]
    fn orphans_wait_for_the_quarantine_then_are_named_with_their_node() {
        let pods = [on("a", "n1"), on("b", "gone"), on("c", "gone")];
        let mut missing = BTreeMap::new();
        let p = plan(&pods, &nodes(&["n1"]), &mut missing, &args(0, 40), now());
        assert!(p.orphans.is_empty() && p.delete.is_empty());
        assert_eq!(missing.get("gone"), Some(&now()));
        assert_eq!(p.requeue, GC_CHECK_PERIOD, "40 s left: the regular period comes first");

        let later = at(1030);
        let p = plan(&pods, &nodes(&["n1"]), &mut missing, &args(0, 40), later);
        assert!(p.orphans.is_empty());
        assert_eq!(p.requeue, Duration::from_secs(10), "woken when the quarantine ends");

        let p = plan(&pods, &nodes(&["n1"]), &mut missing, &args(0, 40), at(1040));
        let refs: Vec<&str> = p.orphans["gone"].iter().map(|r| r.name.as_str()).collect();
        assert_eq!(refs, ["b", "c"]);
        assert_eq!(p.orphans["gone"][0].uid, "uid-b");
    }

    #[test]
    fn a_node_that_comes_back_is_forgotten() {
        let pods = [on("b", "late")];
        let mut missing = BTreeMap::new();
        plan(&pods, &nodes(&[]), &mut missing, &args(0, 40), now());
        plan(&pods, &nodes(&["late"]), &mut missing, &args(0, 40), at(1020));
        assert!(missing.is_empty());
        let p = plan(&pods, &nodes(&[]), &mut missing, &args(0, 40), at(1050));
        assert!(p.orphans.is_empty(), "the quarantine starts again");
    }

    #[test]
    fn unscheduled_pods_are_never_orphans_but_go_when_terminating() {
        let waiting = pod::<ReplicaSet>("waiting", &[], None);
        let mut dying = pod::<ReplicaSet>("dying", &[], None);
        dying.metadata.deletion_timestamp = Some(Time(at(500)));
        let mut missing = BTreeMap::new();
        let p = plan(&[waiting, dying], &nodes(&[]), &mut missing, &args(0, 0), now());
        assert!(p.orphans.is_empty() && missing.is_empty());
        assert_eq!(names(&p), ["dying"]);
    }

    #[test]
    fn terminated_pods_over_the_threshold_go_oldest_first() {
        let mut pods = Vec::new();
        for (i, phase) in ["Succeeded", "Failed", "Running", "Succeeded", "Failed"].iter().enumerate() {
            let mut p = on(&format!("p{i}"), "n1");
            set_phase(&mut p, phase);
            p.metadata.creation_timestamp = Some(Time(at(100 - i as i64)));
            pods.push(p);
        }
        let mut missing = BTreeMap::new();
        let n = nodes(&["n1"]);
        // Four terminated, threshold 2: the two oldest (p4, p3) go; the running p2 never.
        assert_eq!(names(&plan(&pods, &n, &mut missing, &args(2, 40), now())), ["p4", "p3"]);
        assert!(plan(&pods, &n, &mut missing, &args(4, 40), now()).delete.is_empty());
        assert!(plan(&pods, &n, &mut missing, &args(0, 40), now()).delete.is_empty(), "0 disables");
    }

    #[test]
    fn a_pod_is_deleted_once_even_when_terminated_and_orphaned() {
        let mut p = on("x", "gone");
        set_phase(&mut p, "Failed");
        let mut missing = BTreeMap::new();
        let plan = plan(&[p], &nodes(&[]), &mut missing, &args(1, 0), now());
        assert!(plan.delete.is_empty(), "one terminated pod is under a threshold of 1");
        assert_eq!(plan.orphans["gone"].len(), 1);

        let mut q = on("y", "gone");
        set_phase(&mut q, "Failed");
        let mut r = on("z", "gone");
        set_phase(&mut r, "Failed");
        r.metadata.creation_timestamp = Some(Time(at(5)));
        let mut missing = BTreeMap::new();
        let p2 = super::plan(&[q, r], &nodes(&[]), &mut missing, &args(1, 0), now());
        assert_eq!(names(&p2), ["z"]);
        let orphans: Vec<&str> = p2.orphans["gone"].iter().map(|r| r.name.as_str()).collect();
        assert_eq!(orphans, ["y"]);
    }
}
