//! The status pilot writes on a VirtualService or DestinationRule, in Istio's `IstioStatus`
//! shape: `validationMessages[]` (`level`, `type {code, name}`, `description`, as
//! `istioctl analyze` reports them), one `Reconciled` condition (`True`: the object is in
//! effect; `False`: its current version is not, the last valid one, if any, still is) and
//! `observedGeneration`. Pure.

use serde_json::{json, Value};

use crate::validate::Verdict;

pub const CONDITION: &str = "Reconciled";

/// The status an object should have after `verdict`, keeping the condition's
/// `lastTransitionTime` from `current` when its status did not change; `None` when
/// `current` already says it (nothing to write).
pub fn desired(verdict: &Verdict, current: Option<&Value>, had_valid_version: bool, now: &str) -> Option<Value> {
    let (status, reason, message) = if verdict.valid() {
        ("True", "Accepted", "the configuration is in effect".to_string())
    } else if had_valid_version {
        ("False", "Invalid", "the configuration is invalid; its last valid version stays in effect".to_string())
    } else {
        ("False", "Invalid", "the configuration is invalid and not in effect".to_string())
    };
    let old_condition = current
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == CONDITION));
    let transition = match old_condition {
        Some(c) if c["status"] == status => c["lastTransitionTime"].as_str().unwrap_or(now).to_string(),
        _ => now.to_string(),
    };
    let messages: Vec<Value> = verdict
        .messages
        .iter()
        .map(|m| json!({"level": "ERROR", "type": {"code": m.code, "name": m.name}, "description": m.description}))
        .collect();
    let mut want = json!({
        "conditions": [{"type": CONDITION, "status": status, "reason": reason, "message": message,
                        "lastTransitionTime": transition}],
        "observedGeneration": verdict.generation,
    });
    if !messages.is_empty() {
        want["validationMessages"] = Value::Array(messages);
    }
    if current == Some(&want) {
        None
    } else {
        Some(want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{Kind, Message};

    fn verdict(messages: Vec<Message>) -> Verdict {
        Verdict {
            kind: Kind::VirtualService,
            namespace: "default".into(),
            name: "reviews".into(),
            uid: "u".into(),
            generation: 3,
            messages,
        }
    }

    #[test]
    fn valid_objects_are_reconciled() {
        let s = desired(&verdict(vec![]), None, false, "2026-01-01T00:00:00Z").unwrap();
        assert_eq!(s["conditions"][0]["type"], "Reconciled");
        assert_eq!(s["conditions"][0]["status"], "True");
        assert_eq!(s["observedGeneration"], 3);
        assert!(s.get("validationMessages").is_none());
        // Written once: the same verdict later changes nothing.
        assert_eq!(desired(&verdict(vec![]), Some(&s), false, "2026-01-02T00:00:00Z"), None);
    }

    #[test]
    fn invalid_objects_get_validation_messages() {
        let m = Message { code: "IST0101", name: "ReferencedResourceNotFound", description: "no such host".into() };
        let valid = desired(&verdict(vec![]), None, false, "2026-01-01T00:00:00Z").unwrap();
        let s = desired(&verdict(vec![m]), Some(&valid), true, "2026-01-02T00:00:00Z").unwrap();
        assert_eq!(s["conditions"][0]["status"], "False");
        assert_eq!(s["conditions"][0]["lastTransitionTime"], "2026-01-02T00:00:00Z");
        assert!(s["conditions"][0]["message"].as_str().unwrap().contains("last valid version"));
        assert_eq!(
            s["validationMessages"][0],
            json!({"level": "ERROR", "type": {"code": "IST0101", "name": "ReferencedResourceNotFound"}, "description": "no such host"})
        );
    }
}
