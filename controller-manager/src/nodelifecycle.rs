//! The node lifecycle controller (`pkg/controller/nodelifecycle`) with its taint-based
//! eviction: a Node whose heartbeat (its Lease in `kube-node-lease`, or the Ready
//! condition's `lastHeartbeatTime`) is older than `--node-monitor-grace-period` (40 s)
//! gets Ready (and the pressure conditions) `Unknown` with reason `NodeStatusUnknown`,
//! and the `node.kubernetes.io/unreachable` NoSchedule + NoExecute taints (a Node
//! reporting Ready=False gets `node.kubernetes.io/not-ready`); a Node that is Ready
//! again is untainted. Pods on a NoExecute-tainted Node are deleted once their
//! toleration seconds for the taint have passed (300 s by default, as the
//! DefaultTolerationSeconds admission plugin would give them), so their controllers
//! recreate them elsewhere.
//!
//! [`decide`] is the decision (pure); the controller checks every Node every
//! `--node-monitor-period` (5 s).

use std::sync::Arc;
use std::time::Duration;

use common::events::{Recorder, NORMAL};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;

use crate::informer::Informer;
use crate::runner::{run_controller, Policy};
use crate::Error;

pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";

#[derive(Clone, Debug)]
pub struct Settings {
    pub grace: Duration,
    pub monitor_period: Duration,
    pub default_toleration_seconds: i64,
}

#[derive(Debug, Default, PartialEq)]
pub struct Decision {
    /// New status conditions (Ready etc. → Unknown), if they change.
    pub conditions: Option<Vec<NodeCondition>>,
    /// New taints, if they change.
    pub taints: Option<Vec<Taint>>,
    /// Pods to evict (namespace, name, uid).
    pub evict: Vec<(String, String, String)>,
    /// Check again after this long.
    pub requeue: Duration,
}

fn last_heartbeat(node: &Node, lease: Option<&Lease>) -> Timestamp {
    let lease_t = lease.and_then(|l| l.spec.as_ref()).and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
    let cond_t = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_heartbeat_time.as_ref())
        .map(|t| t.0);
    let created = node.metadata.creation_timestamp.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH);
    [lease_t, cond_t, Some(created)].into_iter().flatten().max().unwrap_or(created)
}

/// Toleration seconds of `pod` for a NoExecute taint `key` (None = forever).
fn toleration_seconds(pod: &Pod, key: &str, default: i64) -> Option<i64> {
    let tols = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    let matching: Vec<_> = tols
        .into_iter()
        .flatten()
        .filter(|t| {
            let key_ok = match t.operator.as_deref() {
                Some("Exists") => t.key.as_deref().is_none_or(|k| k.is_empty() || k == key),
                _ => t.key.as_deref() == Some(key),
            };
            key_ok && t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "NoExecute")
        })
        .collect();
    if matching.is_empty() {
        return Some(default);
    }
    if matching.iter().any(|t| t.toleration_seconds.is_none()) {
        return None;
    }
    matching.iter().filter_map(|t| t.toleration_seconds).min()
}

/// The decision for one Node at `now`.
pub fn decide(node: &Node, lease: Option<&Lease>, pods: &[Arc<Pod>], s: &Settings, now: Timestamp) -> Decision {
    let mut d = Decision { requeue: s.monitor_period, ..Default::default() };
    let name = node.metadata.name.clone().unwrap_or_default();
    let grace = SignedDuration::try_from(s.grace).unwrap_or(SignedDuration::from_secs(40));
    let stale = last_heartbeat(node, lease).checked_add(grace).map(|t| t <= now).unwrap_or(false);
    let mut conds = node.status.as_ref().and_then(|st| st.conditions.clone()).unwrap_or_default();
    let ready_status = conds.iter().find(|c| c.type_ == "Ready").map(|c| c.status.clone());
    let mut effective_ready = ready_status.clone().unwrap_or_else(|| "Unknown".into());
    if stale && ready_status.as_deref() != Some("Unknown") {
        let mut types: Vec<String> = conds.iter().map(|c| c.type_.clone()).collect();
        if !types.iter().any(|t| t == "Ready") {
            types.push("Ready".into());
        }
        let mut new = Vec::new();
        for t in types {
            let old = conds.iter().find(|c| c.type_ == t).cloned();
            new.push(NodeCondition {
                type_: t,
                status: "Unknown".into(),
                reason: Some("NodeStatusUnknown".into()),
                message: Some("Kubelet stopped posting node status.".into()),
                last_heartbeat_time: old.as_ref().and_then(|o| o.last_heartbeat_time.clone()),
                last_transition_time: Some(Time(now)),
            });
        }
        conds = new.clone();
        d.conditions = Some(new);
        effective_ready = "Unknown".into();
    }
    let _ = conds;
    // Taints.
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    let want_key = match effective_ready.as_str() {
        "True" => None,
        "False" => Some(NOT_READY),
        _ => Some(UNREACHABLE),
    };
    let mut next: Vec<Taint> = taints
        .iter()
        .filter(|t| t.key != UNREACHABLE && t.key != NOT_READY || Some(t.key.as_str()) == want_key)
        .cloned()
        .collect();
    if let Some(k) = want_key {
        for effect in ["NoSchedule", "NoExecute"] {
            if !next.iter().any(|t| t.key == k && t.effect == effect) {
                next.push(Taint { key: k.into(), effect: effect.into(), value: None, time_added: Some(Time(now)) });
            }
        }
    }
    if next != taints {
        d.taints = Some(next.clone());
    }
    // Evictions under NoExecute taints.
    for t in next.iter().filter(|t| t.effect == "NoExecute" && (t.key == UNREACHABLE || t.key == NOT_READY)) {
        let added = t.time_added.as_ref().map(|x| x.0).unwrap_or(now);
        for p in pods.iter().filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&name)
                && p.metadata.deletion_timestamp.is_none()
        }) {
            let Some(secs) = toleration_seconds(p, &t.key, s.default_toleration_seconds) else { continue };
            let at = added.checked_add(SignedDuration::from_secs(secs.max(0))).unwrap_or(now);
            if at <= now {
                let e = (
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default(),
                    p.metadata.uid.clone().unwrap_or_default(),
                );
                if !d.evict.contains(&e) {
                    d.evict.push(e);
                }
            } else {
                let wait = Duration::from_millis(at.duration_since(now).as_millis().max(0) as u64 + 50);
                d.requeue = d.requeue.min(wait);
            }
        }
    }
    d
}

struct Ctx {
    client: kube::Client,
    leases: Informer<Lease>,
    pods: Informer<Pod>,
    settings: Settings,
    recorder: Recorder,
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let lease = ctx.leases.store.get(&ObjectRef::new(&name).within("kube-node-lease"));
    let d = decide(&node, lease.as_deref(), &ctx.pods.state(), &ctx.settings, Timestamp::now());
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    if let Some(c) = &d.conditions {
        nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": {"conditions": c}}))).await?;
        ctx.recorder.event(node.as_ref(), NORMAL, "NodeNotReady", format!("Node {name} status is now: NodeNotReady"));
    }
    if let Some(t) = &d.taints {
        nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"spec": {"taints": t}, "metadata": {"resourceVersion": node.metadata.resource_version}}),
                ),
            )
            .await?;
    }
    for (ns, pod, uid) in &d.evict {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions { uid: Some(uid.clone()), resource_version: None }),
            ..Default::default()
        };
        match api.delete(pod, &dp).await {
            Ok(_) => {
                tracing::info!(node = %name, pod = %format!("{ns}/{pod}"), "evicting pod from unreachable node (taint-based eviction)")
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::requeue(d.requeue))
}

pub async fn run(client: kube::Client, pods: Informer<Pod>, settings: Settings, recorder: Recorder) {
    let leases = Informer::start(Api::<Lease>::namespaced(client.clone(), "kube-node-lease"));
    let ctx = Arc::new(Ctx { client: client.clone(), leases: leases.clone(), pods: pods.clone(), settings, recorder });
    pods.synced().await;
    leases.synced().await;
    run_controller(
        Controller::new(Api::<Node>::all(client), watcher::Config::default()),
        reconcile,
        ctx,
        Policy { metric: "nodelifecycle", what: "node lifecycle", retry: Duration::from_secs(2) },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, Toleration};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn settings() -> Settings {
        Settings {
            grace: Duration::from_secs(40),
            monitor_period: Duration::from_secs(5),
            default_toleration_seconds: 300,
        }
    }

    fn node(ready: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                creation_timestamp: Some(Time(at(0))),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    last_heartbeat_time: Some(Time(at(100))),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn lease(renewed: i64) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec { renew_time: Some(MicroTime(at(renewed))), ..Default::default() }),
        }
    }

    #[test]
    fn fresh_lease_keeps_the_node_ready() {
        let d = decide(&node("True"), Some(&lease(990)), &[], &settings(), now());
        assert_eq!(d.conditions, None);
        assert_eq!(d.taints, None);
    }

    #[test]
    fn stale_lease_marks_unknown_and_taints_unreachable() {
        let d = decide(&node("True"), Some(&lease(950)), &[], &settings(), now());
        let c = d.conditions.unwrap();
        assert_eq!((c[0].status.as_str(), c[0].reason.as_deref()), ("Unknown", Some("NodeStatusUnknown")));
        let t = d.taints.unwrap();
        assert!(t.iter().any(|t| t.key == UNREACHABLE && t.effect == "NoExecute"));
        assert!(t.iter().any(|t| t.key == UNREACHABLE && t.effect == "NoSchedule"));
    }

    #[test]
    fn pods_are_evicted_after_their_toleration_seconds_and_returning_nodes_untainted() {
        let mut n = node("Unknown");
        n.spec.as_mut().unwrap().taints = Some(vec![
            Taint {
                key: UNREACHABLE.into(),
                effect: "NoSchedule".into(),
                value: None,
                time_added: Some(Time(at(900))),
            },
            Taint { key: UNREACHABLE.into(), effect: "NoExecute".into(), value: None, time_added: Some(Time(at(900))) },
        ]);
        let mut short = pod::<Node>("short", &[], None);
        make_running(&mut short, "n1", true, 1);
        short.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some(UNREACHABLE.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(60),
            value: None,
        }]);
        let mut default = pod::<Node>("default", &[], None);
        make_running(&mut default, "n1", true, 2);
        let mut forever = pod::<Node>("forever", &[], None);
        make_running(&mut forever, "n1", true, 3);
        forever.spec.as_mut().unwrap().tolerations =
            Some(vec![Toleration { operator: Some("Exists".into()), ..Default::default() }]);
        let pods: Vec<Arc<Pod>> = [short, default, forever].into_iter().map(Arc::new).collect();
        let d = decide(&n, Some(&lease(800)), &pods, &settings(), now());
        assert_eq!(d.evict.iter().map(|e| e.1.as_str()).collect::<Vec<_>>(), vec!["short"]);
        assert!(d.requeue <= Duration::from_secs(5));
        // The node comes back: taints removed.
        let mut back = n.clone();
        back.status = node("True").status;
        let d = decide(&back, Some(&lease(999)), &pods, &settings(), now());
        assert_eq!(d.taints, Some(vec![]));
        assert!(d.evict.is_empty());
    }
}
