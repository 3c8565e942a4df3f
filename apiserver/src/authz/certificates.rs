//! Admission of CertificateSigningRequest writes by who makes them (Kubernetes'
//! `CertificateApproval`, `CertificateSigning` and `CertificateSubjectRestriction` plugins):
//!
//! - any write of `/approval` needs the `approve` verb on `signers` (group
//!   `certificates.k8s.io`) named after the request's signer, or after its domain as
//!   `<domain>/*`;
//! - a `/status` write that sets or changes `status.certificate` needs `sign` the same way;
//! - nobody may ask the `kubernetes.io/kube-apiserver-client` signer for a certificate in
//!   `system:masters` (it would make its holder a superuser whatever RBAC says).
//!
//! [`needed`] and [`subject_problem`] are the decisions (pure); the authorizer answers the
//! question [`needed`] asks (`authz::write_admission`).

use base64::Engine;
use serde_json::Value;

pub const GROUP: &str = "certificates.k8s.io";
pub const RESOURCE: &str = "certificatesigningrequests";
/// The signer whose certificates authenticate to the apiserver.
pub const APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";

/// A permission a write needs: `verb` on one of `signers` (the exact name first, then the
/// domain's wildcard).
#[derive(Debug, PartialEq, Eq)]
pub struct SignerPermission {
    pub verb: &'static str,
    pub signer: String,
}

impl SignerPermission {
    /// The `signers` names that grant it: `example.com/name`, then `example.com/*`.
    pub fn names(&self) -> Vec<String> {
        let mut names = vec![self.signer.clone()];
        if let Some((domain, _)) = self.signer.split_once('/') {
            names.push(format!("{domain}/*"));
        }
        names
    }

    /// Kubernetes' refusal (`NewForbidden`'s detail).
    pub fn refusal(&self) -> String {
        format!("user not permitted to {} requests with signerName {:?}", self.verb, self.signer)
    }
}

fn signer(obj: &Value) -> String {
    obj.pointer("/spec/signerName").and_then(Value::as_str).unwrap_or_default().to_string()
}

/// What a write of `subresource` (empty: the object itself) needs beyond RBAC on the
/// request itself: `approve` for `/approval`, `sign` for a `/status` write that changes the
/// certificate.
pub fn needed(subresource: &str, new: &Value, old: Option<&Value>) -> Option<SignerPermission> {
    match subresource {
        "approval" => Some(SignerPermission { verb: "approve", signer: signer(new) }),
        "status" => {
            let certificate =
                |v: Option<&Value>| v.and_then(|v| v.pointer("/status/certificate")).cloned().filter(|c| !c.is_null());
            (certificate(Some(new)) != certificate(old)).then(|| SignerPermission { verb: "sign", signer: signer(new) })
        }
        _ => None,
    }
}

/// Why a new request may not be made: a `kube-apiserver-client` certificate in
/// `system:masters`. Requests that cannot be read are left to validation.
pub fn subject_problem(new: &Value) -> Option<String> {
    if signer(new) != APISERVER_CLIENT {
        return None;
    }
    let b64 = new.pointer("/spec/request").and_then(Value::as_str)?;
    let pem = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let info = common::pki::parse_csr(&pem).ok()?;
    info.organizations
        .iter()
        .any(|o| o == super::PRIVILEGED_GROUP)
        .then(|| format!("use of {APISERVER_CLIENT} signer with system:masters group is not allowed"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn csr(signer: &str, orgs: &[&str]) -> Value {
        let (request, _) = common::pki::new_csr("someone", orgs).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD.encode(request);
        json!({"spec": {"signerName": signer, "request": b64}})
    }

    #[test]
    fn approving_needs_approve_and_issuing_needs_sign_on_the_signer() {
        let new = csr("example.com/x", &[]);
        let approve = needed("approval", &new, Some(&new)).unwrap();
        assert_eq!(approve, SignerPermission { verb: "approve", signer: "example.com/x".into() });
        assert_eq!(approve.names(), ["example.com/x", "example.com/*"]);
        assert_eq!(approve.refusal(), r#"user not permitted to approve requests with signerName "example.com/x""#);
        // A status write that leaves the certificate alone (conditions only) needs nothing.
        assert_eq!(needed("status", &new, Some(&new)), None);
        let mut issued = new.clone();
        issued["status"] = json!({"certificate": "Y2VydA=="});
        assert_eq!(needed("status", &issued, Some(&new)).unwrap().verb, "sign");
        assert_eq!(needed("status", &issued, Some(&issued)), None);
        assert_eq!(needed("", &issued, Some(&new)), None, "the main resource cannot change the status");
    }

    #[test]
    fn nobody_asks_the_apiserver_client_signer_for_system_masters() {
        let masters = csr(APISERVER_CLIENT, &["devs", "system:masters"]);
        assert_eq!(
            subject_problem(&masters).as_deref(),
            Some("use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed")
        );
        assert_eq!(subject_problem(&csr(APISERVER_CLIENT, &["devs"])), None);
        assert_eq!(subject_problem(&csr("example.com/x", &["system:masters"])), None, "another signer's business");
        assert_eq!(subject_problem(&json!({"spec": {"signerName": APISERVER_CLIENT, "request": "!!"}})), None);
    }
}
