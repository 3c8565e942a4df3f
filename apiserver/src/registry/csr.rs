//! CertificateSigningRequest (`certificates.k8s.io/v1`): a request for a certificate that a
//! signer (`spec.signerName`) issues once it is approved.
//!
//! - Create: the apiserver records who asked (`spec.username`, `uid`, `groups`, `extra`:
//!   [`set_requester`], from the authenticated user, whatever the body says); status starts
//!   empty. `spec.request` must be a `CERTIFICATE REQUEST` PEM block whose signature holds,
//!   the signer a qualified name (`example.com/name`), the usages known, unique and at least
//!   one, `expirationSeconds` at least 600.
//! - The spec never changes after create (a main-resource update keeps the stored spec).
//! - `/approval` changes only `status.conditions`: `Approved` or `Denied` (never both, never
//!   removed once set), each with status `True`.
//! - `/status` is the signer's: `status.certificate` (PEM certificates; set once, never
//!   changed after) and conditions other than `Approved`/`Denied`, which stay as stored.

use serde_json::{json, Value};

use super::{set_at, Strategy, Sub};
use crate::error::FieldError;

pub static CSR: CsrStrategy = CsrStrategy;

/// Kubernetes' key usage names (`certificates.k8s.io/v1` `KeyUsage`).
pub const USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// Conditions only `/approval` sets.
const DECISIONS: &[&str] = &["Approved", "Denied"];

/// Record the requesting user in the spec (create).
pub fn set_requester(obj: &mut Value, user: Option<&crate::authn::UserInfo>) {
    let (name, uid, groups) = match user {
        Some(u) => (u.name.clone(), u.uid.clone(), u.groups.clone()),
        None => (crate::authz::ANONYMOUS.to_string(), String::new(), vec!["system:unauthenticated".to_string()]),
    };
    set_at(obj, "/spec/username", json!(name));
    set_at(obj, "/spec/groups", json!(groups));
    if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("extra");
        spec.remove("uid");
        if !uid.is_empty() {
            spec.insert("uid".into(), json!(uid));
        }
    }
}

fn conditions(obj: &Value) -> Vec<&Value> {
    obj.pointer("/status/conditions").and_then(Value::as_array).map(|c| c.iter().collect()).unwrap_or_default()
}

fn condition_type(c: &Value) -> &str {
    c.get("type").and_then(Value::as_str).unwrap_or_default()
}

/// Whether `obj` has a condition of `ty` with status True.
pub fn has_condition(obj: &Value, ty: &str) -> bool {
    conditions(obj).iter().any(|c| condition_type(c) == ty && c.get("status").and_then(Value::as_str) == Some("True"))
}

/// Whether a signer name is qualified: `<DNS subdomain with a dot>/<path>`.
fn is_qualified_signer_name(name: &str) -> bool {
    let Some((domain, path)) = name.split_once('/') else { return false };
    domain.contains('.')
        && crate::validation::dns1123_subdomain_errors(domain).is_none()
        && !path.is_empty()
        && path.len() <= 253
        && !path.contains(char::is_whitespace)
}

fn validate_spec(obj: &Value, errs: &mut Vec<FieldError>) {
    match obj.pointer("/spec/request").and_then(Value::as_str).filter(|r| !r.is_empty()) {
        None => errs.push(FieldError::required("spec.request", "")),
        Some(b64) => {
            use base64::Engine;
            let pem = base64::engine::general_purpose::STANDARD.decode(b64);
            match pem.map_err(|e| e.to_string()).and_then(|pem| common::pki::parse_csr(&pem)) {
                Ok(_) => {}
                Err(e) => errs.push(FieldError::invalid("spec.request", &json!("<certificate request data>"), &e)),
            }
        }
    }
    match obj.pointer("/spec/signerName").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        None => errs.push(FieldError::required("spec.signerName", "")),
        Some(name) if !is_qualified_signer_name(name) => errs.push(FieldError::invalid(
            "spec.signerName",
            &json!(name),
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        )),
        Some(_) => {}
    }
    let usages: Vec<&Value> =
        obj.pointer("/spec/usages").and_then(Value::as_array).map(|u| u.iter().collect()).unwrap_or_default();
    if usages.is_empty() {
        errs.push(FieldError::required("spec.usages", ""));
    }
    let mut seen = Vec::new();
    for (i, u) in usages.iter().enumerate() {
        let text = u.as_str().unwrap_or_default();
        if !USAGES.contains(&text) {
            errs.push(FieldError::not_supported(format!("spec.usages[{i}]"), u, USAGES));
        } else if seen.contains(&text) {
            errs.push(FieldError::duplicate(format!("spec.usages[{i}]"), u));
        }
        seen.push(text);
    }
    if let Some(secs) = obj.pointer("/spec/expirationSeconds").filter(|v| !v.is_null()) {
        if secs.as_i64().is_none_or(|s| s < 600) {
            errs.push(FieldError::invalid(
                "spec.expirationSeconds",
                secs,
                "may not specify a duration less than 600 seconds (10 minutes)",
            ));
        }
    }
}

fn validate_status(obj: &Value, errs: &mut Vec<FieldError>) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, c) in conditions(obj).iter().enumerate() {
        let ty = condition_type(c);
        let status = c.get("status").and_then(Value::as_str).unwrap_or_default();
        if ty.is_empty() {
            errs.push(FieldError::required(format!("status.conditions[{i}].type"), ""));
        } else if seen.contains(&ty) && ["Approved", "Denied", "Failed"].contains(&ty) {
            errs.push(FieldError::duplicate(format!("status.conditions[{i}].type"), &json!(ty)));
        }
        if DECISIONS.contains(&ty) && status != "True" {
            errs.push(FieldError::not_supported(format!("status.conditions[{i}].status"), &json!(status), &["True"]));
        } else if !["True", "False", "Unknown"].contains(&status) {
            errs.push(FieldError::not_supported(
                format!("status.conditions[{i}].status"),
                &json!(status),
                &["False", "True", "Unknown"],
            ));
        }
        seen.push(ty);
    }
    if seen.contains(&"Approved") && seen.contains(&"Denied") {
        errs.push(FieldError::invalid(
            "status.conditions",
            &json!(seen),
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
    if let Some(cert) = obj.pointer("/status/certificate").and_then(Value::as_str).filter(|c| !c.is_empty()) {
        use base64::Engine;
        let pem = base64::engine::general_purpose::STANDARD.decode(cert).unwrap_or_default();
        let ok =
            common::pki::pem_to_der(&String::from_utf8_lossy(&pem)).is_some_and(|d| common::pki::inspect(&d).is_ok());
        if !ok {
            errs.push(FieldError::invalid(
                "status.certificate",
                &json!("<certificate data>"),
                "must contain at least one CERTIFICATE PEM block",
            ));
        }
    }
}

/// A decision once made stays: `Approved`/`Denied` may be added but never removed.
fn validate_decisions_kept(new: &Value, old: &Value, errs: &mut Vec<FieldError>) {
    for ty in DECISIONS {
        if has_condition(old, ty) && !has_condition(new, ty) {
            errs.push(FieldError::forbidden(
                "status.conditions",
                &format!("updates may not remove a condition of type \"{ty}\""),
            ));
        }
    }
}

pub struct CsrStrategy;

impl Strategy for CsrStrategy {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        validate_spec(obj, &mut errs);
        validate_status(obj, &mut errs);
        errs
    }
    fn prepare_for_update(&self, new: &mut Value, old: &Value) {
        match old.get("spec") {
            Some(spec) => new["spec"] = spec.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("spec");
                }
            }
        }
    }
    fn prepare_status_update(&self, new: &mut Value, old: &Value) {
        // The signer's subresource: decisions stay as stored.
        let mut kept: Vec<Value> =
            conditions(old).into_iter().filter(|c| DECISIONS.contains(&condition_type(c))).cloned().collect();
        kept.extend(conditions(new).into_iter().filter(|c| !DECISIONS.contains(&condition_type(c))).cloned());
        set_at(new, "/status/conditions", json!(kept));
    }
    fn validate_status_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        validate_status(new, &mut errs);
        let (was, now) = (old.pointer("/status/certificate"), new.pointer("/status/certificate"));
        let set = |v: Option<&Value>| v.and_then(Value::as_str).is_some_and(|s| !s.is_empty());
        if set(was) && was != now {
            errs.push(FieldError::forbidden(
                "status.certificate",
                "updates may not modify existing certificate content",
            ));
        }
        errs
    }
    fn prepare_subresource_update(&self, sub: Sub, new: &Value, old: &Value) -> Option<Value> {
        (sub == Sub::Approval).then(|| {
            let mut out = old.clone();
            set_at(&mut out, "/status/conditions", new.pointer("/status/conditions").cloned().unwrap_or(json!([])));
            out
        })
    }
    fn validate_subresource_update(&self, _sub: Sub, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        validate_status(new, &mut errs);
        validate_decisions_kept(new, old, &mut errs);
        errs
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        (field == "spec.signerName")
            .then(|| obj.pointer("/spec/signerName").and_then(Value::as_str).unwrap_or("").into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn csr() -> Value {
        let (request, _) = common::pki::new_csr("system:node:n1", &["system:nodes"]).unwrap();
        json!({"metadata": {"name": "node-csr-1"}, "spec": {
            "request": b64(&request), "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
            "usages": ["digital signature", "client auth"]}})
    }

    fn messages(errs: Vec<FieldError>) -> Vec<String> {
        errs.into_iter().map(|e| e.message).collect()
    }

    #[test]
    fn a_good_request_passes_and_bad_ones_say_why() {
        assert!(CSR.validate(&csr()).is_empty(), "{:?}", messages(CSR.validate(&csr())));
        let mut bad = csr();
        bad["spec"]["request"] = json!(b64("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"));
        bad["spec"]["signerName"] = json!("no-slash");
        bad["spec"]["usages"] = json!(["client auth", "client auth", "flying"]);
        bad["spec"]["expirationSeconds"] = json!(599);
        let got = messages(CSR.validate(&bad));
        assert!(got.iter().any(|m| m.contains("PEM block type must be CERTIFICATE REQUEST")), "{got:?}");
        assert!(
            got.iter()
                .any(|m| m.contains("spec.signerName: Invalid value: \"no-slash\": must be a fully qualified domain")),
            "{got:?}"
        );
        assert!(got.iter().any(|m| m.starts_with("spec.usages[1]: Duplicate value")), "{got:?}");
        assert!(got.iter().any(|m| m.starts_with("spec.usages[2]: Unsupported value: \"flying\"")), "{got:?}");
        assert!(got.iter().any(|m| m.contains("may not specify a duration less than 600 seconds")), "{got:?}");
        let empty = messages(CSR.validate(&json!({"spec": {}})));
        for f in ["spec.request", "spec.signerName", "spec.usages"] {
            assert!(empty.contains(&format!("{f}: Required value")), "{empty:?}");
        }
    }

    #[test]
    fn the_requester_comes_from_the_request_not_the_body() {
        let mut obj = csr();
        obj["spec"]["username"] = json!("admin");
        obj["spec"]["extra"] = json!({"x": ["y"]});
        let user = crate::authn::UserInfo {
            name: "system:bootstrap:abcdef".into(),
            uid: String::new(),
            groups: vec!["system:bootstrappers".into()],
        };
        set_requester(&mut obj, Some(&user));
        assert_eq!(obj["spec"]["username"], "system:bootstrap:abcdef");
        assert_eq!(obj["spec"]["groups"], json!(["system:bootstrappers"]));
        assert!(obj["spec"].get("extra").is_none() && obj["spec"].get("uid").is_none());
    }

    #[test]
    fn decisions_are_exclusive_and_final_and_the_certificate_is_set_once() {
        let old = csr();
        let approved = |c: &Value| {
            let mut v = c.clone();
            v["status"] = json!({"conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved"}]});
            v
        };
        let new = CSR.prepare_subresource_update(Sub::Approval, &approved(&old), &old).unwrap();
        assert!(CSR.validate_subresource_update(Sub::Approval, &new, &old).is_empty());
        assert!(has_condition(&new, "Approved"));
        // Both decisions: refused; removing one: refused.
        let mut both = new.clone();
        both["status"]["conditions"].as_array_mut().unwrap().push(json!({"type": "Denied", "status": "True"}));
        let got = messages(CSR.validate_subresource_update(Sub::Approval, &both, &new));
        assert!(got.iter().any(|m| m.contains("Approved and Denied conditions are mutually exclusive")), "{got:?}");
        let mut removed = new.clone();
        removed["status"]["conditions"] = json!([]);
        let got = messages(CSR.validate_subresource_update(Sub::Approval, &removed, &new));
        assert_eq!(got, vec!["status.conditions: Forbidden: updates may not remove a condition of type \"Approved\""]);
        // /status keeps the decisions whatever it sends, takes the certificate once.
        let ca = common::pki::Ca::generate(time::OffsetDateTime::now_utc()).unwrap();
        let mut signed = new.clone();
        signed["status"] =
            json!({"certificate": b64(&ca.cert_pem), "conditions": [{"type": "Failed", "status": "False"}]});
        CSR.prepare_status_update(&mut signed, &new);
        let types: Vec<&str> = conditions(&signed).into_iter().map(condition_type).collect();
        assert_eq!(types, vec!["Approved", "Failed"]);
        assert!(CSR.validate_status_update(&signed, &new).is_empty());
        let mut again = signed.clone();
        again["status"]["certificate"] =
            json!(b64(&common::pki::Ca::generate(time::OffsetDateTime::now_utc()).unwrap().cert_pem));
        let got = messages(CSR.validate_status_update(&again, &signed));
        assert_eq!(got, vec!["status.certificate: Forbidden: updates may not modify existing certificate content"]);
        let mut junk = new.clone();
        junk["status"]["certificate"] = json!(b64("not a certificate"));
        assert!(!CSR.validate_status_update(&junk, &new).is_empty());
        // The spec never changes after create.
        let mut edited = old.clone();
        edited["spec"]["signerName"] = json!("example.com/other");
        CSR.prepare_for_update(&mut edited, &old);
        assert_eq!(edited["spec"], old["spec"]);
    }
}
