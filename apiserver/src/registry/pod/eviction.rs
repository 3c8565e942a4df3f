//! `pods/eviction` against PodDisruptionBudgets, as Kubernetes' eviction REST decides it. [`decide`] is pure: given the pod
//! and its namespace's budgets, evict without a budget, consume one (its new status), or
//! refuse with the Status Kubernetes sends — 429 for a budget that allows no disruption now
//! (`kubectl drain` retries those), 500 for a pod under several budgets.
//!
//! Consuming means what Kubernetes does: `disruptionsAllowed` goes down by one and the pod is
//! recorded in `disruptedPods` (the disruption controller stops counting it as healthy and
//! forgets it once it is gone), then the pod is deleted.

use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult, FieldError};
use crate::registry::generic::{now_rfc3339, DeleteOptions, Intent, ListOptions, Registry, UpdateKind, WriteOptions};
use crate::registry::ResourceDef;
use crate::selectors::{labels_of, LabelSelector};

/// `DisruptedPods` entries beyond this refuse further evictions (Kubernetes' `MaxDisruptedPodSize`).
pub const MAX_DISRUPTED_PODS: usize = 2000;

/// What an eviction does.
#[derive(Debug)]
pub enum Verdict {
    /// Delete the pod; no budget is involved or consumed.
    Delete,
    /// Write this status to the named budget, whose `resource_version` it was decided on
    /// (the write's precondition), then delete.
    Consume {
        budget: String,
        resource_version: String,
        status: Value,
    },
    Refuse(ApiError),
}

fn i(v: &Value, p: &str) -> i64 {
    v.pointer(p).and_then(Value::as_i64).unwrap_or(0)
}

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c.get("type") == Some(&json!("Ready")) && c.get("status") == Some(&json!("True")))
}

/// Whether a budget's selector picks the pod (policy/v1: an empty selector picks every pod
/// of the namespace, an absent one none).
fn selects(pdb: &Value, pod: &Value) -> bool {
    let Some(sel) = pdb.pointer("/spec/selector").filter(|s| !s.is_null()) else { return false };
    LabelSelector::from_label_selector_json(sel).is_ok_and(|s| s.matches(&labels_of(pod)))
}

/// The refusal while a budget does not allow a disruption (Kubernetes' wording).
fn too_many_requests(cause: String, retry_after: u32) -> ApiError {
    let mut e =
        ApiError::new(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.");
    e.details = Some(crate::error::Details {
        causes: vec![FieldError { reason: "DisruptionBudget", field: String::new(), message: cause }],
        ..Default::default()
    });
    e.retry_after = (retry_after > 0).then_some(retry_after);
    e
}

/// Decide an eviction of `pod` given every budget of its namespace, at time `now` (RFC 3339).
/// `dry_run` consumes nothing.
pub fn decide(pod: &Value, pdbs: &[Value], now: &str, dry_run: bool) -> Verdict {
    // A pod that is not running, or already going, disrupts nothing (`canIgnorePDB`).
    let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or_default();
    if matches!(phase, "Succeeded" | "Failed" | "Pending") || pod.pointer("/metadata/deletionTimestamp").is_some() {
        return Verdict::Delete;
    }
    let matching: Vec<&Value> = pdbs.iter().filter(|p| selects(p, pod)).collect();
    let pdb = match matching.as_slice() {
        [] => return Verdict::Delete,
        [one] => *one,
        _ => {
            return Verdict::Refuse(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ))
        }
    };
    let name = pdb.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let (current, desired) = (i(pdb, "/status/currentHealthy"), i(pdb, "/status/desiredHealthy"));
    // An unready pod does not count as healthy: evicting it costs the budget nothing when
    // the budget allows it (`unhealthyPodEvictionPolicy`).
    if !pod_ready(pod) {
        let policy = pdb.pointer("/spec/unhealthyPodEvictionPolicy").and_then(Value::as_str);
        if policy == Some("AlwaysAllow") || (current >= desired && desired > 0) {
            return Verdict::Delete;
        }
    }
    if i(pdb, "/status/observedGeneration") < i(pdb, "/metadata/generation") {
        return Verdict::Refuse(too_many_requests(
            format!("The disruption budget {name} is still being processed by the server."),
            10,
        ));
    }
    let allowed = i(pdb, "/status/disruptionsAllowed");
    if allowed < 0 {
        return Verdict::Refuse(ApiError::forbidden(
            "policy",
            "poddisruptionbudgets",
            &name,
            "pdb disruptions allowed is negative",
        ));
    }
    let disrupted = pdb.pointer("/status/disruptedPods").and_then(Value::as_object).map_or(0, |m| m.len());
    if disrupted > MAX_DISRUPTED_PODS {
        return Verdict::Refuse(ApiError::forbidden(
            "policy",
            "poddisruptionbudgets",
            &name,
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if allowed == 0 {
        return Verdict::Refuse(too_many_requests(
            format!("The disruption budget {name} needs {desired} healthy pods and has {current} currently"),
            0,
        ));
    }
    if dry_run {
        return Verdict::Delete;
    }
    let mut status = pdb.get("status").cloned().unwrap_or_else(|| json!({}));
    status["disruptionsAllowed"] = json!(allowed - 1);
    if allowed == 1 {
        let mut conditions: Vec<Value> =
            status.get("conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        conditions.retain(|c| c.get("type") != Some(&json!("DisruptionAllowed")));
        conditions.push(json!({
            "type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods", "message": "",
            "lastTransitionTime": now, "observedGeneration": i(pdb, "/metadata/generation"),
        }));
        status["conditions"] = json!(conditions);
    }
    let pod_name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    if !status.get("disruptedPods").is_some_and(Value::is_object) {
        status["disruptedPods"] = json!({});
    }
    status["disruptedPods"][pod_name] = json!(now);
    let resource_version =
        pdb.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string();
    Verdict::Consume { budget: name, resource_version, status }
}

/// POST `pods/<name>/eviction`: check the Eviction body, consume the pod's
/// PodDisruptionBudget or refuse ([`decide`]), then delete the pod with the Eviction's
/// delete options. The budget's status is written with its resourceVersion as the
/// precondition, so two evictions never spend the same disruption; a lost race decides again.
pub async fn evict(
    reg: &Registry,
    pods: &ResourceDef,
    pdbs: &ResourceDef,
    ns: &str,
    name: &str,
    eviction: &Value,
    opts: &DeleteOptions,
) -> ApiResult<()> {
    let body_name = eviction.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request("name in URL does not match name in Eviction object"));
    }
    consume_budget(reg, pods, pdbs, ns, name, opts.dry_run).await?;
    reg.delete(pods, ns, name, opts).await?;
    Ok(())
}

async fn consume_budget(
    reg: &Registry,
    pods: &ResourceDef,
    pdbs: &ResourceDef,
    ns: &str,
    name: &str,
    dry_run: bool,
) -> ApiResult<()> {
    for _ in 0..5 {
        let pod = reg.get(pods, ns, name).await?;
        let list = reg.list(pdbs, Some(ns), &ListOptions::default()).await?;
        let items = list.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
        let (budget, read, status) = match decide(&pod, &items, &now_rfc3339(), dry_run) {
            Verdict::Delete => return Ok(()),
            Verdict::Refuse(e) => return Err(e),
            Verdict::Consume { budget, resource_version, status } => (budget, resource_version.parse().ok(), status),
        };
        let outcome = reg
            .guaranteed_update(pdbs, ns, &budget, UpdateKind::Status, &WriteOptions::default(), |current| {
                let Some(current) = current else { return Ok(None) };
                let mut new = current.clone();
                new["status"] = status.clone();
                Ok(Some(Intent { object: new, precondition: read }))
            })
            .await;
        match outcome {
            Ok(_) => return Ok(()),
            Err(e) if e.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::new(429, "TooManyRequests", "too many concurrent evictions; please retry"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-11-21T10:00:00Z";

    fn pod(phase: &str, ready: bool) -> Value {
        json!({"metadata": {"name": "web-1", "labels": {"app": "web"}},
               "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    fn pdb(name: &str, allowed: i64, current: i64, desired: i64) -> Value {
        json!({"metadata": {"name": name, "generation": 1},
               "spec": {"selector": {"matchLabels": {"app": "web"}}, "minAvailable": desired},
               "status": {"observedGeneration": 1, "disruptionsAllowed": allowed, "currentHealthy": current,
                          "desiredHealthy": desired, "expectedPods": current}})
    }

    fn refused(v: Verdict) -> ApiError {
        match v {
            Verdict::Refuse(e) => e,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_budget_with_room_is_consumed() {
        let Verdict::Consume { budget, status, .. } = decide(&pod("Running", true), &[pdb("web", 1, 3, 2)], NOW, false)
        else {
            panic!("not consumed")
        };
        assert_eq!(budget, "web");
        assert_eq!(status["disruptionsAllowed"], 0);
        assert_eq!(status["disruptedPods"], json!({"web-1": NOW}));
        assert_eq!(status["conditions"][0]["reason"], "InsufficientPods");
        // A dry run consumes nothing.
        assert!(matches!(decide(&pod("Running", true), &[pdb("web", 1, 3, 2)], NOW, true), Verdict::Delete));
    }

    #[test]
    fn a_spent_budget_refuses_with_429_and_kubernetes_words() {
        let e = refused(decide(&pod("Running", true), &[pdb("web", 0, 2, 2)], NOW, false));
        assert_eq!((e.code, e.reason), (429, "TooManyRequests"));
        assert_eq!(e.message, "Cannot evict pod as it would violate the pod's disruption budget.");
        let cause = &e.details.unwrap().causes[0];
        assert_eq!(cause.reason, "DisruptionBudget");
        assert_eq!(cause.message, "The disruption budget web needs 2 healthy pods and has 2 currently");
        // Not yet processed by the controller: retry later.
        let mut fresh = pdb("web", 5, 5, 0);
        fresh["metadata"]["generation"] = json!(2);
        let e = refused(decide(&pod("Running", true), &[fresh], NOW, false));
        assert_eq!((e.code, e.retry_after), (429, Some(10)));
        assert!(e.details.unwrap().causes[0].message.ends_with("is still being processed by the server."));
    }

    #[test]
    fn pods_outside_budgets_or_not_running_go_freely() {
        assert!(matches!(decide(&pod("Running", true), &[], NOW, false), Verdict::Delete));
        let mut other = pdb("db", 0, 1, 1);
        other["spec"]["selector"] = json!({"matchLabels": {"app": "db"}});
        assert!(matches!(decide(&pod("Running", true), &[other], NOW, false), Verdict::Delete));
        for phase in ["Pending", "Succeeded", "Failed"] {
            assert!(matches!(decide(&pod(phase, false), &[pdb("web", 0, 2, 2)], NOW, false), Verdict::Delete));
        }
        // No selector: nothing; an empty one: everything in the namespace.
        let mut none = pdb("web", 0, 2, 2);
        none["spec"].as_object_mut().unwrap().remove("selector");
        assert!(matches!(decide(&pod("Running", true), &[none], NOW, false), Verdict::Delete));
        let mut all = pdb("web", 0, 2, 2);
        all["spec"]["selector"] = json!({});
        assert_eq!(refused(decide(&pod("Running", true), &[all], NOW, false)).code, 429);
    }

    #[test]
    fn unready_pods_and_several_budgets() {
        // Unready pod, budget satisfied: free. Budget short: the budget decides (none left).
        assert!(matches!(decide(&pod("Running", false), &[pdb("web", 0, 2, 2)], NOW, false), Verdict::Delete));
        assert_eq!(refused(decide(&pod("Running", false), &[pdb("web", 0, 1, 2)], NOW, false)).code, 429);
        let mut always = pdb("web", 0, 1, 2);
        always["spec"]["unhealthyPodEvictionPolicy"] = json!("AlwaysAllow");
        assert!(matches!(decide(&pod("Running", false), &[always], NOW, false), Verdict::Delete));
        let e = refused(decide(&pod("Running", true), &[pdb("a", 1, 3, 2), pdb("b", 1, 3, 2)], NOW, false));
        assert_eq!(e.code, 500);
    }
}
