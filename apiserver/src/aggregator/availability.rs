//! Whether an aggregated APIService is available (pure): kube-aggregator's remote
//! availability controller's decision, step by step with its reasons and messages — the
//! Service exists (`ServiceNotFound`), a ClusterIP Service has the port (`ServicePortError`)
//! and EndpointSlices (`EndpointsNotFound`) with a ready address on it (`MissingEndpoints`),
//! and one of five discovery GETs of `/apis/<group>/<version>` answered 2xx within 5 s
//! (`FailedDiscoveryCheck`); then `Passed`. The I/O (reads, the GETs, the status write) is
//! the controller's, in `mod.rs`.

use serde_json::{json, Value};

use super::endpoints::{has_available_endpoint, service_port_name, service_type, ServiceRef};

/// The `Available` condition's status, reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    pub reason: String,
    pub message: String,
}

impl Condition {
    fn new(status: &'static str, reason: &str, message: String) -> Self {
        Condition { status, reason: reason.into(), message }
    }
}

/// The outcome of a read.
#[derive(Clone, Debug)]
pub enum Lookup<T> {
    Found(T),
    NotFound,
    Failed(String),
}

/// What the controller does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The condition to record.
    Condition(Condition),
    /// The Service checks passed: GET the discovery document, then decide again with the
    /// attempts' outcomes.
    Probe,
}

/// Decide from the Service, its EndpointSlices (read only for a ClusterIP Service) and, once
/// probed, the discovery attempts (`Err`: why one failed, worded as upstream's
/// `failing or missing response from <url>: …`).
pub fn decide(
    svc: &ServiceRef,
    service: &Lookup<Value>,
    slices: &Lookup<Vec<Value>>,
    probes: Option<&[Result<(), String>]>,
) -> Verdict {
    let (name, ns) = (&svc.name, &svc.namespace);
    let false_ = |reason: &str, message: String| Verdict::Condition(Condition::new("False", reason, message));
    let service = match service {
        Lookup::Found(s) => s,
        Lookup::NotFound => return false_("ServiceNotFound", format!("service/{name} in {ns:?} is not present")),
        Lookup::Failed(e) => {
            return Verdict::Condition(Condition::new(
                "Unknown",
                "ServiceAccessError",
                format!("service/{name} in {ns:?} cannot be checked due to: {e}"),
            ))
        }
    };
    if service_type(service) == "ClusterIP" {
        let Ok(port_name) = service_port_name(service, svc.port) else {
            return false_(
                "ServicePortError",
                format!("service/{name} in {ns:?} is not listening on port {}", svc.port),
            );
        };
        match slices {
            Lookup::Failed(e) => {
                return Verdict::Condition(Condition::new(
                    "Unknown",
                    "EndpointsAccessError",
                    format!("service/{name} in {ns:?} cannot be checked due to: {e}"),
                ))
            }
            Lookup::NotFound => {
                return false_("EndpointsNotFound", format!("cannot find endpointslices for service/{name} in {ns:?}"))
            }
            Lookup::Found(s) if s.is_empty() => {
                return false_("EndpointsNotFound", format!("cannot find endpointslices for service/{name} in {ns:?}"))
            }
            Lookup::Found(s) if !has_available_endpoint(s, port_name) => {
                return false_(
                    "MissingEndpoints",
                    format!(
                        "endpointslices for service/{name} in {ns:?} have no addresses with port name {port_name:?}"
                    ),
                )
            }
            Lookup::Found(_) => {}
        }
    }
    let Some(probes) = probes else { return Verdict::Probe };
    match probes.iter().find(|p| p.is_ok()) {
        Some(_) => Verdict::Condition(Condition::new("True", "Passed", "all checks passed".into())),
        None => {
            let last = probes.iter().rev().find_map(|p| p.as_ref().err()).cloned().unwrap_or_default();
            false_("FailedDiscoveryCheck", last)
        }
    }
}

/// `status` with the `Available` condition set to `c` (kube-aggregator's
/// `SetAPIServiceCondition`): the transition time changes only with the status; other
/// conditions are kept.
pub fn with_condition(status: Option<&Value>, c: &Condition, now: &str) -> Value {
    let mut status = status.filter(|s| s.is_object()).cloned().unwrap_or_else(|| json!({}));
    let mut conditions: Vec<Value> = status.get("conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    match conditions.iter_mut().find(|x| x.get("type").and_then(Value::as_str) == Some("Available")) {
        Some(existing) => {
            if existing.get("status").and_then(Value::as_str) != Some(c.status) {
                existing["status"] = json!(c.status);
                existing["lastTransitionTime"] = json!(now);
            }
            existing["reason"] = json!(c.reason);
            existing["message"] = json!(c.message);
        }
        None => conditions.push(json!({"type": "Available", "status": c.status, "lastTransitionTime": now,
            "reason": c.reason, "message": c.message})),
    }
    status["conditions"] = json!(conditions);
    status
}

/// Whether an APIService's status says it is available.
pub fn is_available(apiservice: &Value) -> bool {
    apiservice
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c.get("type").and_then(Value::as_str) == Some("Available") && c.get("status") == Some(&json!("True")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc_ref() -> ServiceRef {
        ServiceRef { namespace: "wardle".into(), name: "api".into(), port: 443 }
    }

    fn service(ty: &str) -> Lookup<Value> {
        Lookup::Found(
            json!({"metadata": {"name": "api"}, "spec": {"type": ty, "ports": [{"name": "https", "port": 443}]}}),
        )
    }

    fn slices(ready: bool, port_name: &str) -> Lookup<Vec<Value>> {
        Lookup::Found(vec![json!({"endpoints": [{"addresses": ["10.0.0.9"], "conditions": {"ready": ready}}],
            "ports": [{"name": port_name, "port": 8443}]})])
    }

    fn reason(v: Verdict) -> (String, String, String) {
        match v {
            Verdict::Condition(c) => (c.status.to_string(), c.reason, c.message),
            Verdict::Probe => ("probe".into(), String::new(), String::new()),
        }
    }

    #[test]
    fn each_failed_check_has_upstream_s_reason_and_message() {
        let s = svc_ref();
        assert_eq!(
            reason(decide(&s, &Lookup::NotFound, &Lookup::NotFound, None)),
            ("False".into(), "ServiceNotFound".into(), "service/api in \"wardle\" is not present".into())
        );
        assert_eq!(reason(decide(&s, &Lookup::Failed("boom".into()), &Lookup::NotFound, None)).1, "ServiceAccessError");
        let other_port = ServiceRef { port: 8080, ..svc_ref() };
        assert_eq!(
            reason(decide(&other_port, &service("ClusterIP"), &slices(true, "https"), None)),
            (
                "False".into(),
                "ServicePortError".into(),
                "service/api in \"wardle\" is not listening on port 8080".into()
            )
        );
        assert_eq!(
            reason(decide(&s, &service("ClusterIP"), &Lookup::Found(vec![]), None)),
            (
                "False".into(),
                "EndpointsNotFound".into(),
                "cannot find endpointslices for service/api in \"wardle\"".into()
            )
        );
        assert_eq!(
            reason(decide(&s, &service("ClusterIP"), &slices(false, "https"), None)),
            (
                "False".into(),
                "MissingEndpoints".into(),
                "endpointslices for service/api in \"wardle\" have no addresses with port name \"https\"".into()
            )
        );
        assert_eq!(reason(decide(&s, &service("ClusterIP"), &slices(true, "web"), None)).1, "MissingEndpoints");
        assert_eq!(
            reason(decide(&s, &service("ClusterIP"), &Lookup::Failed("x".into()), None)).1,
            "EndpointsAccessError"
        );
    }

    #[test]
    fn discovery_decides_once_the_service_checks_pass() {
        let s = svc_ref();
        assert_eq!(decide(&s, &service("ClusterIP"), &slices(true, "https"), None), Verdict::Probe);
        // Only a ClusterIP Service has its ports and endpoints checked first.
        assert_eq!(decide(&s, &service("ExternalName"), &Lookup::NotFound, None), Verdict::Probe);
        let failed: Vec<Result<(), String>> = vec![Err("a".into()), Err("b".into())];
        assert_eq!(
            reason(decide(&s, &service("ClusterIP"), &slices(true, "https"), Some(&failed))),
            ("False".into(), "FailedDiscoveryCheck".into(), "b".into())
        );
        let one_ok = vec![Err("a".into()), Ok(())];
        assert_eq!(
            reason(decide(&s, &service("ClusterIP"), &slices(true, "https"), Some(&one_ok))),
            ("True".into(), "Passed".into(), "all checks passed".into())
        );
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let passed = Condition::new("True", "Passed", "all checks passed".into());
        let s1 = with_condition(None, &passed, "t1");
        assert_eq!(
            s1,
            json!({"conditions": [{"type": "Available", "status": "True", "lastTransitionTime": "t1", "reason": "Passed", "message": "all checks passed"}]})
        );
        assert!(is_available(&json!({ "status": s1 })));
        assert_eq!(with_condition(Some(&s1), &passed, "t2"), s1, "unchanged: nothing to write");
        let failed = Condition::new("False", "FailedDiscoveryCheck", "x".into());
        let s2 = with_condition(Some(&s1), &failed, "t3");
        assert_eq!(s2["conditions"][0]["lastTransitionTime"], "t3");
        assert!(!is_available(&json!({ "status": s2 })));
        let other = json!({"conditions": [{"type": "Other", "status": "True"}]});
        assert_eq!(with_condition(Some(&other), &failed, "t4")["conditions"].as_array().unwrap().len(), 2);
    }
}
