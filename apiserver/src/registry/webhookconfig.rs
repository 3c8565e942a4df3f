//! MutatingWebhookConfiguration and ValidatingWebhookConfiguration
//! (`admissionregistration.k8s.io/v1`): Kubernetes' defaults (failurePolicy `Fail`,
//! matchPolicy `Equivalent`, empty selectors, timeoutSeconds 10, rule scope `*`, service
//! port 443, reinvocationPolicy `Never`) and the validation that keeps a configuration the
//! webhook dispatcher cannot use out of storage.

use serde_json::{json, Value};

use super::{default_at, Strategy};
use crate::error::FieldError;

pub struct WebhookConfigurationStrategy {
    pub mutating: bool,
}

pub static MUTATING: WebhookConfigurationStrategy = WebhookConfigurationStrategy { mutating: true };
pub static VALIDATING: WebhookConfigurationStrategy = WebhookConfigurationStrategy { mutating: false };

const OPERATIONS: &[&str] = &["*", "CREATE", "UPDATE", "DELETE", "CONNECT"];

impl WebhookConfigurationStrategy {
    fn defaults(&self, obj: &mut Value) {
        let Some(hooks) = obj.get_mut("webhooks").and_then(Value::as_array_mut) else { return };
        for w in hooks {
            default_at(w, "/failurePolicy", json!("Fail"));
            default_at(w, "/matchPolicy", json!("Equivalent"));
            default_at(w, "/namespaceSelector", json!({}));
            default_at(w, "/objectSelector", json!({}));
            default_at(w, "/timeoutSeconds", json!(10));
            if self.mutating {
                default_at(w, "/reinvocationPolicy", json!("Never"));
            }
            if w.pointer("/clientConfig/service").is_some_and(|s| !s.is_null()) {
                default_at(w, "/clientConfig/service/port", json!(443));
            }
            for r in w.get_mut("rules").and_then(Value::as_array_mut).into_iter().flatten() {
                default_at(r, "/scope", json!("*"));
            }
        }
    }
}

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

/// A webhook name is a fully qualified domain name of at least three segments.
fn qualified(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() >= 3
        && name.len() <= 253
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 63
                && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        })
}

fn validate_client_config(cc: Option<&Value>, path: &str, errs: &mut Vec<FieldError>) {
    let url = cc.and_then(|c| c.get("url")).filter(|v| !v.is_null());
    let service = cc.and_then(|c| c.get("service")).filter(|v| !v.is_null());
    match (url, service) {
        (Some(_), Some(_)) => {
            errs.push(FieldError::required(format!("{path}.clientConfig"), "exactly one of url or service is required"))
        }
        (None, None) => {
            errs.push(FieldError::required(format!("{path}.clientConfig"), "exactly one of url or service is required"))
        }
        (Some(u), None) => {
            let s = u.as_str().unwrap_or_default();
            if !s.starts_with("https://") {
                errs.push(FieldError::invalid(
                    format!("{path}.clientConfig.url"),
                    u,
                    "'https' is the only allowed URL scheme",
                ));
            } else if crate::webhook::call::parse_url(s).is_err() {
                errs.push(FieldError::invalid(format!("{path}.clientConfig.url"), u, "host must be specified"));
            }
        }
        (None, Some(s)) => {
            for f in ["namespace", "name"] {
                if s.get(f).and_then(Value::as_str).unwrap_or_default().is_empty() {
                    errs.push(FieldError::required(
                        format!("{path}.clientConfig.service.{f}"),
                        "service {f} is required",
                    ));
                }
            }
            if let Some(p) = s.get("port").and_then(Value::as_i64) {
                if !(1..=65535).contains(&p) {
                    errs.push(FieldError::invalid(
                        format!("{path}.clientConfig.service.port"),
                        &json!(p),
                        "port is not valid: must be between 1 and 65535, inclusive",
                    ));
                }
            }
            if let Some(p) = s.get("path").and_then(Value::as_str) {
                if !p.starts_with('/') {
                    errs.push(FieldError::invalid(
                        format!("{path}.clientConfig.service.path"),
                        &json!(p),
                        "must start with a '/'",
                    ));
                }
            }
        }
    }
}

impl Strategy for WebhookConfigurationStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        self.defaults(obj);
    }
    fn prepare_for_update(&self, new: &mut Value, _old: &Value) {
        self.defaults(new);
    }
    fn tracks_generation(&self) -> bool {
        true
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, w) in obj.get("webhooks").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let path = format!("webhooks[{i}]");
            let name = w.get("name").and_then(Value::as_str).unwrap_or_default();
            if name.is_empty() {
                errs.push(FieldError::required(format!("{path}.name"), ""));
            } else if !qualified(name) {
                errs.push(FieldError::invalid(
                    format!("{path}.name"),
                    &json!(name),
                    "should be a domain with at least three segments separated by dots",
                ));
            } else if !seen.insert(name) {
                errs.push(FieldError::duplicate(format!("{path}.name"), &json!(name)));
            }
            validate_client_config(w.get("clientConfig"), &path, &mut errs);
            match w.get("sideEffects").and_then(Value::as_str) {
                Some("None") | Some("NoneOnDryRun") => {}
                None => errs.push(FieldError::required(
                    format!("{path}.sideEffects"),
                    "must specify one of None, NoneOnDryRun",
                )),
                Some(other) => errs.push(FieldError::not_supported(
                    format!("{path}.sideEffects"),
                    &json!(other),
                    &["None", "NoneOnDryRun"],
                )),
            }
            let versions = strs(w.get("admissionReviewVersions"));
            if versions.is_empty() {
                errs.push(FieldError::required(
                    format!("{path}.admissionReviewVersions"),
                    "must specify one of v1, v1beta1",
                ));
            } else if !versions.iter().any(|v| *v == "v1" || *v == "v1beta1") {
                errs.push(FieldError::invalid(
                    format!("{path}.admissionReviewVersions"),
                    &json!(versions),
                    "must include at least one of v1, v1beta1",
                ));
            }
            if let Some(p) = w.get("failurePolicy").and_then(Value::as_str) {
                if !["Fail", "Ignore"].contains(&p) {
                    errs.push(FieldError::not_supported(
                        format!("{path}.failurePolicy"),
                        &json!(p),
                        &["Fail", "Ignore"],
                    ));
                }
            }
            if let Some(t) = w.get("timeoutSeconds").and_then(Value::as_i64) {
                if !(1..=30).contains(&t) {
                    errs.push(FieldError::invalid(
                        format!("{path}.timeoutSeconds"),
                        &json!(t),
                        "the timeout value must be between 1 and 30 seconds",
                    ));
                }
            }
            for field in ["namespaceSelector", "objectSelector"] {
                if let Err(e) = crate::webhook::rules::selector(w.get(field)) {
                    errs.push(FieldError::invalid(format!("{path}.{field}"), w.get(field).unwrap_or(&Value::Null), &e));
                }
            }
            for (j, r) in w.get("rules").and_then(Value::as_array).into_iter().flatten().enumerate() {
                let rp = format!("{path}.rules[{j}]");
                for op in strs(r.get("operations")) {
                    if !OPERATIONS.contains(&op) {
                        errs.push(FieldError::not_supported(format!("{rp}.operations"), &json!(op), OPERATIONS));
                    }
                }
                for (f, what) in
                    [("apiGroups", "resource group"), ("apiVersions", "resource version"), ("resources", "resource")]
                {
                    if strs(r.get(f)).is_empty() {
                        errs.push(FieldError::required(format!("{rp}.{f}"), &format!("{what} must be specified")));
                    }
                }
                if let Some(scope) = r.get("scope").and_then(Value::as_str) {
                    if !["*", "Cluster", "Namespaced"].contains(&scope) {
                        errs.push(FieldError::not_supported(
                            format!("{rp}.scope"),
                            &json!(scope),
                            &["*", "Cluster", "Namespaced"],
                        ));
                    }
                }
            }
            if w.get("matchConditions").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
                errs.push(FieldError::forbidden(
                    format!("{path}.matchConditions"),
                    "CEL match conditions are not supported by this apiserver",
                ));
            }
        }
        errs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(webhook: Value) -> Value {
        json!({"metadata": {"name": "c"}, "webhooks": [webhook]})
    }

    #[test]
    fn defaults_are_kubernetes_defaults() {
        let mut obj = config(json!({"name": "a.b.c", "clientConfig": {"service": {"namespace": "x", "name": "y"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}));
        MUTATING.prepare_for_create(&mut obj);
        let w = &obj["webhooks"][0];
        assert_eq!(w["failurePolicy"], "Fail");
        assert_eq!(w["matchPolicy"], "Equivalent");
        assert_eq!(w["timeoutSeconds"], 10);
        assert_eq!(w["reinvocationPolicy"], "Never");
        assert_eq!(w["namespaceSelector"], json!({}));
        assert_eq!(w["clientConfig"]["service"]["port"], 443);
        assert_eq!(w["rules"][0]["scope"], "*");
        let mut v = obj.clone();
        VALIDATING.prepare_for_create(&mut v);
        assert!(VALIDATING.validate(&config(json!({"name": "a.b.c"})))[0].message.contains("clientConfig"));
    }

    #[test]
    fn what_the_dispatcher_cannot_use_is_refused() {
        let good =
            config(json!({"name": "pods.policy.example.com", "clientConfig": {"url": "https://10.0.0.1:8443/v"},
            "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}));
        assert_eq!(VALIDATING.validate(&good), vec![]);
        let mut bad = good.clone();
        bad["webhooks"][0]["name"] = json!("short.name");
        bad["webhooks"][0]["clientConfig"]["url"] = json!("http://10.0.0.1/");
        bad["webhooks"][0]["sideEffects"] = json!("Some");
        bad["webhooks"][0]["timeoutSeconds"] = json!(31);
        let msgs: Vec<String> = VALIDATING.validate(&bad).into_iter().map(|e| e.message).collect();
        assert!(msgs.iter().any(|m| m.contains("at least three segments")), "{msgs:?}");
        assert!(msgs.iter().any(|m| m.contains("'https' is the only allowed URL scheme")), "{msgs:?}");
        assert!(msgs.iter().any(|m| m.contains("sideEffects: Unsupported value")), "{msgs:?}");
        assert!(msgs.iter().any(|m| m.contains("between 1 and 30 seconds")), "{msgs:?}");
    }
}
