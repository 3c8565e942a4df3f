//! The disruption controller (`pkg/controller/disruption`): keeps each PodDisruptionBudget's
//! status — how many of its pods are healthy, how many must be, and so how many disruptions
//! (`pods/eviction`) it allows now.
//!
//! - `minAvailable` as a number: the pods it selects are the expected ones.
//! - `minAvailable` as a percentage, or `maxUnavailable`: the expected count is the scale of
//!   the pods' controllers (a ReplicaSet owned by a Deployment counts as the Deployment), so
//!   a pod missing from a scaled workload still counts; a selected pod with an unknown
//!   controller is a sync failure, one without a controller is left out.
//! - A pod recorded in `disruptedPods` by an eviction is not healthy for two minutes, or
//!   until it is gone; the record is then dropped.
//!
//! [`status`] is the decision (pure); the reconcile resolves controllers and writes the
//! status with the budget's resourceVersion, so it never undoes a concurrent eviction.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use apimachinery::labels::{selector_or_nothing, selects};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::informer::{trigger, Informer};
use crate::runner::{run_controller, Policy};
use crate::util::{controller_ref, is_deleting, is_pod_ready, labels};
use crate::Error;

/// How long an evicted pod stays out of the healthy count while it is not yet gone
/// (Kubernetes' `DeletionTimeout`).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// What the controller found out about the pods' controllers.
#[derive(Debug, Default)]
pub struct Scales {
    /// controller uid → desired replicas.
    pub by_controller: HashMap<String, i32>,
    /// A pod whose controller is none of the known kinds (Kubernetes' sync failure).
    pub error: Option<String>,
}

/// `IntOrString` scaled against `total`, rounding up (`GetScaledValueFromIntOrPercent(…, true)`).
fn scaled(v: &IntOrString, total: i32) -> Result<i32, String> {
    match v {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let pct: i64 = s.strip_suffix('%').and_then(|p| p.parse().ok()).ok_or_else(|| {
                format!("invalid value for IntOrString: invalid type: string is not a percentage {s:?}")
            })?;
            Ok(((pct * total as i64 + 99) / 100) as i32)
        }
    }
}

/// Whether a budget needs the controllers' scale (a percentage or maxUnavailable).
pub fn needs_scale(pdb: &PodDisruptionBudget) -> bool {
    let spec = pdb.spec.clone().unwrap_or_default();
    spec.max_unavailable.is_some() || matches!(spec.min_available, Some(IntOrString::String(_)))
}

fn condition(
    allowed: bool,
    reason: &str,
    message: String,
    old: Option<&PodDisruptionBudgetStatus>,
    gen: i64,
    now: Timestamp,
) -> Condition {
    let status = if allowed { "True" } else { "False" };
    let previous =
        old.and_then(|o| o.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "DisruptionAllowed"));
    let since = previous.filter(|p| p.status == status).map(|p| p.last_transition_time.clone()).unwrap_or(Time(now));
    Condition {
        type_: "DisruptionAllowed".into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: since,
        observed_generation: Some(gen),
    }
}

/// The status a budget should have, given the pods it selects (in its namespace) and the
/// scale of their controllers.
pub fn status(pdb: &PodDisruptionBudget, pods: &[&Pod], scales: &Scales, now: Timestamp) -> PodDisruptionBudgetStatus {
    let spec = pdb.spec.clone().unwrap_or_default();
    let old = pdb.status.as_ref();
    let gen = pdb.metadata.generation.unwrap_or(0);
    let fail = |msg: String| PodDisruptionBudgetStatus {
        disruptions_allowed: Some(0),
        observed_generation: Some(gen),
        conditions: Some(vec![condition(false, "SyncFailed", msg, old, gen, now)]),
        ..old.cloned().unwrap_or_default()
    };
    let expected_scale = || -> Result<i32, String> {
        match &scales.error {
            Some(e) => Err(e.clone()),
            None => Ok(scales.by_controller.values().sum()),
        }
    };
    let (expected, desired) = match (&spec.max_unavailable, &spec.min_available) {
        (Some(max), _) => match expected_scale().and_then(|e| Ok((e, (e - scaled(max, e)?).max(0)))) {
            Ok(v) => v,
            Err(e) => return fail(e),
        },
        (None, Some(IntOrString::Int(n))) => (pods.len() as i32, *n),
        (None, Some(min)) => match expected_scale().and_then(|e| Ok((e, scaled(min, e)?))) {
            Ok(v) => v,
            Err(e) => return fail(e),
        },
        (None, None) => (0, 0),
    };
    // Evictions recorded but not yet seen through: the pod is still there and not deleting.
    let live: HashMap<&str, &Pod> = pods.iter().map(|p| (p.metadata.name.as_deref().unwrap_or_default(), *p)).collect();
    let disrupted: BTreeMap<String, Time> = old
        .and_then(|o| o.disrupted_pods.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, t)| {
            let present = live.get(name.as_str()).is_some_and(|p| !is_deleting(&p.metadata));
            present
                && t.0
                    .checked_add(SignedDuration::try_from(DELETION_TIMEOUT).unwrap_or_default())
                    .is_ok_and(|end| end > now)
        })
        .collect();
    let healthy = pods
        .iter()
        .filter(|p| !is_deleting(&p.metadata))
        .filter(|p| !disrupted.contains_key(p.metadata.name.as_deref().unwrap_or_default()))
        .filter(|p| is_pod_ready(p))
        .count() as i32;
    let allowed = if expected <= 0 { 0 } else { (healthy - desired).max(0) };
    let (reason, ok) = if allowed > 0 { ("SufficientPods", true) } else { ("InsufficientPods", false) };
    PodDisruptionBudgetStatus {
        current_healthy: Some(healthy),
        desired_healthy: Some(desired),
        expected_pods: Some(expected),
        disruptions_allowed: Some(allowed),
        disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
        observed_generation: Some(gen),
        conditions: Some(vec![condition(ok, reason, String::new(), old, gen, now)]),
    }
}

/// When the oldest recorded eviction expires (a reason to look again then).
pub fn next_expiry(status: &PodDisruptionBudgetStatus, now: Timestamp) -> Option<Duration> {
    let timeout = SignedDuration::try_from(DELETION_TIMEOUT).ok()?;
    status
        .disrupted_pods
        .iter()
        .flatten()
        .filter_map(|(_, t)| t.0.checked_add(timeout).ok())
        .min()
        .map(|end| Duration::try_from(end.duration_since(now)).unwrap_or(Duration::ZERO) + Duration::from_secs(1))
}

struct Ctx {
    client: kube::Client,
    pods: Informer<Pod>,
}

fn selected<'a>(pdb: &PodDisruptionBudget, pods: &'a [Arc<Pod>]) -> Vec<&'a Pod> {
    let ns = pdb.metadata.namespace.as_deref();
    let Some(sel) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else { return vec![] };
    let sel = selector_or_nothing(Some(sel));
    pods.iter()
        .filter(|p| p.metadata.namespace.as_deref() == ns && sel.matches(&labels(&p.metadata)))
        .map(|p| p.as_ref())
        .collect()
}

/// The controllers of `pods` and their scale (Kubernetes' finders: ReplicaSet — as its
/// Deployment when it has one —, ReplicationController, StatefulSet).
async fn scales(client: &kube::Client, ns: &str, pods: &[&Pod]) -> Result<Scales, Error> {
    let mut out = Scales::default();
    for pod in pods {
        let Some(r) = controller_ref(&pod.metadata) else { continue };
        if out.by_controller.contains_key(&r.uid) {
            continue;
        }
        let group = r.api_version.split_once('/').map_or("", |(g, _)| g);
        let found = match (group, r.kind.as_str()) {
            ("apps", "ReplicaSet") => match Api::<ReplicaSet>::namespaced(client.clone(), ns).get_opt(&r.name).await? {
                Some(rs) => match controller_ref(&rs.metadata).filter(|o| o.kind == "Deployment") {
                    Some(d) => Api::<Deployment>::namespaced(client.clone(), ns)
                        .get_opt(&d.name)
                        .await?
                        .map(|d| (d.metadata.uid.unwrap_or_default(), d.spec.replicas.unwrap_or(1))),
                    None => Some((r.uid.clone(), rs.spec.replicas.unwrap_or(1))),
                },
                None => None,
            },
            ("", "ReplicationController") => Api::<ReplicationController>::namespaced(client.clone(), ns)
                .get_opt(&r.name)
                .await?
                .map(|rc| (r.uid.clone(), rc.spec.and_then(|s| s.replicas).unwrap_or(1))),
            ("apps", "StatefulSet") => Api::<StatefulSet>::namespaced(client.clone(), ns)
                .get_opt(&r.name)
                .await?
                .map(|s| (r.uid.clone(), s.spec.replicas.unwrap_or(1))),
            _ => None,
        };
        match found {
            Some((uid, replicas)) => {
                out.by_controller.insert(uid, replicas);
            }
            None => {
                out.error = Some(format!(
                    "found no controllers for pod {:?}",
                    pod.metadata.name.as_deref().unwrap_or_default()
                ));
                break;
            }
        }
    }
    Ok(out)
}

async fn reconcile(pdb: Arc<PodDisruptionBudget>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = pdb.metadata.namespace.clone().unwrap_or_default();
    let name = pdb.metadata.name.clone().unwrap_or_default();
    let all = ctx.pods.state();
    let pods = selected(&pdb, &all);
    let scales = if needs_scale(&pdb) { scales(&ctx.client, &ns, &pods).await? } else { Scales::default() };
    let now = Timestamp::now();
    let new = status(&pdb, &pods, &scales, now);
    let again = next_expiry(&new, now).map_or(Action::await_change(), Action::requeue);
    if pdb.status.as_ref() == Some(&new) {
        return Ok(again);
    }
    let mut obj = (*pdb).clone();
    obj.status = Some(new);
    obj.metadata.managed_fields = None;
    let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
    // A replace with the read resourceVersion: a concurrent eviction wins and we look again.
    match api.replace_status(&name, &PostParams::default(), &obj).await {
        Ok(_) => Ok(again),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(Action::requeue(Duration::from_millis(200))),
        Err(e) => Err(e.into()),
    }
}

/// Run until the watch streams end.
pub async fn run(client: kube::Client, pods: Informer<Pod>) {
    let ctx = Arc::new(Ctx { client: client.clone(), pods: pods.clone() });
    let (tx, triggers) = trigger::<PodDisruptionBudget>();
    let controller =
        Controller::new(Api::<PodDisruptionBudget>::all(client), watcher::Config::default()).reconcile_on(triggers);
    let store = controller.store();
    pods.add_handler(move |pod, _deleted| {
        let lbls = labels(&pod.metadata);
        for pdb in store.state() {
            let sel = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
            if pdb.metadata.namespace == pod.metadata.namespace && selects(sel, &lbls) {
                let _ = tx.send(ObjectRef::from_obj(pdb.as_ref()));
            }
        }
    });
    pods.synced().await;
    run_controller(
        controller,
        reconcile,
        ctx,
        Policy { metric: "disruption", what: "disruption budget", retry: Duration::from_secs(2) },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{at, make_running, pod};
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn pdb(min: Option<IntOrString>, max: Option<IntOrString>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: kube::api::ObjectMeta { name: Some("web".into()), generation: Some(3), ..Default::default() },
            spec: Some(PodDisruptionBudgetSpec {
                min_available: min,
                max_unavailable: max,
                selector: Some(LabelSelector {
                    match_labels: Some([("app".to_string(), "web".to_string())].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn pods(ready: usize, unready: usize) -> Vec<Pod> {
        (0..ready + unready)
            .map(|n| {
                let mut p = pod::<Pod>(&format!("web-{n}"), &[("app", "web")], None);
                make_running(&mut p, "node", n < ready, 0);
                p
            })
            .collect()
    }

    fn scale(n: i32) -> Scales {
        Scales { by_controller: [("rs-uid".to_string(), n)].into(), error: None }
    }

    #[test]
    fn min_available_counts_the_selected_pods() {
        let ps = pods(3, 1);
        let refs: Vec<&Pod> = ps.iter().collect();
        let s = status(&pdb(Some(IntOrString::Int(2)), None), &refs, &Scales::default(), at(100));
        assert_eq!(
            (s.expected_pods, s.desired_healthy, s.current_healthy, s.disruptions_allowed),
            (Some(4), Some(2), Some(3), Some(1))
        );
        assert_eq!(s.observed_generation, Some(3));
        let c = &s.conditions.unwrap()[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "SufficientPods"));
    }

    #[test]
    fn percentages_and_max_unavailable_use_the_controllers_scale() {
        // 5 desired replicas, 3 ready pods exist: 60% → 3 needed, nothing to spare.
        let ps = pods(3, 0);
        let refs: Vec<&Pod> = ps.iter().collect();
        let s = status(&pdb(Some(IntOrString::String("60%".into())), None), &refs, &scale(5), at(100));
        assert_eq!((s.expected_pods, s.desired_healthy, s.disruptions_allowed), (Some(5), Some(3), Some(0)));
        assert_eq!(s.conditions.unwrap()[0].reason, "InsufficientPods");
        // maxUnavailable 1 of 3 (rounded up for percentages: 34% of 3 is 2).
        let s = status(&pdb(None, Some(IntOrString::Int(1))), &refs, &scale(3), at(100));
        assert_eq!((s.desired_healthy, s.disruptions_allowed), (Some(2), Some(1)));
        let s = status(&pdb(None, Some(IntOrString::String("34%".into()))), &refs, &scale(3), at(100));
        assert_eq!((s.desired_healthy, s.disruptions_allowed), (Some(1), Some(2)));
        // An unknown controller: the budget allows nothing and says why.
        let broken = Scales { error: Some("found no controllers for pod \"web-0\"".into()), ..Default::default() };
        let s = status(&pdb(None, Some(IntOrString::Int(1))), &refs, &broken, at(100));
        assert_eq!(s.disruptions_allowed, Some(0));
        let c = &s.conditions.unwrap()[0];
        assert_eq!((c.reason.as_str(), c.message.as_str()), ("SyncFailed", "found no controllers for pod \"web-0\""));
    }

    #[test]
    fn evicted_pods_are_not_healthy_until_gone_or_expired() {
        let ps = pods(3, 0);
        let refs: Vec<&Pod> = ps.iter().collect();
        let mut budget = pdb(Some(IntOrString::Int(1)), None);
        budget.status = Some(PodDisruptionBudgetStatus {
            disrupted_pods: Some(
                [("web-0".to_string(), Time(at(100))), ("gone".to_string(), Time(at(100)))].into_iter().collect(),
            ),
            ..Default::default()
        });
        let s = status(&budget, &refs, &Scales::default(), at(110));
        assert_eq!((s.current_healthy, s.disruptions_allowed), (Some(2), Some(1)));
        assert_eq!(
            s.disrupted_pods.as_ref().map(|d| d.keys().cloned().collect::<Vec<_>>()),
            Some(vec!["web-0".into()])
        );
        assert_eq!(next_expiry(&s, at(110)), Some(Duration::from_secs(111)));
        // Two minutes later the record is dropped and the pod counts again.
        let s = status(&budget, &refs, &Scales::default(), at(221));
        assert_eq!((s.current_healthy, s.disrupted_pods), (Some(3), None));
    }
}
