//! CertificateSigningRequests: what a request asks for, and which of Kubernetes' built-in
//! signers' rules it meets. The two controllers that act on requests share these:
//! - [`approver`] (`csrapproving`): approves a kubelet's client certificate request when
//!   the requester may ask for one (a SubjectAccessReview for `certificatesigningrequests/
//!   nodeclient`, or `selfnodeclient` when a node renews its own);
//! - [`signer`] (`csrsigning`): issues approved requests of the built-in signers with the
//!   cluster's CA (`--cluster-signing-cert-file`/`--cluster-signing-key-file`);
//! - [`serving`] (`kubelet-serving-csr-approving`, off by default): approves a node's request
//!   for its own serving certificate when its names are the Node's addresses.

pub mod approver;
pub mod serving;
pub mod signer;

use std::sync::Arc;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::runtime::controller::Action;
use kube::runtime::{watcher, Controller};

/// What the approvers' reconcilers share.
pub struct Ctx {
    pub client: kube::Client,
}

/// Run `reconcile` over every CertificateSigningRequest until the watch stream ends.
pub async fn run_over_requests<Fut>(
    client: kube::Client,
    reconcile: impl FnMut(Arc<CertificateSigningRequest>, Arc<Ctx>) -> Fut,
    policy: crate::runner::Policy,
) where
    Fut: std::future::Future<Output = Result<Action, crate::Error>> + Send + 'static,
{
    let ctx = Arc::new(Ctx { client: client.clone() });
    let controller = Controller::new(kube::Api::<CertificateSigningRequest>::all(client), watcher::Config::default());
    crate::runner::run_controller(controller, reconcile, ctx, policy).await;
}

/// The signer of kubelets' client certificates.
pub const KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The signer of client certificates for the apiserver.
pub const APISERVER_CLIENT: &str = "kubernetes.io/kube-apiserver-client";
/// The signer of kubelets' serving certificates.
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
/// The signer of anything (kept for old clients).
pub const LEGACY_UNKNOWN: &str = "kubernetes.io/legacy-unknown";

/// Whether the request already has a condition of `ty` (status True).
pub fn has_condition(csr: &CertificateSigningRequest, ty: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == ty && c.status == "True"))
}

/// The parsed request of a CSR (its `spec.request` PEM).
pub fn request_of(csr: &CertificateSigningRequest) -> Result<common::pki::CsrInfo, String> {
    common::pki::parse_csr(&csr.spec.request.0)
}

fn usages(csr: &CertificateSigningRequest) -> Vec<&str> {
    csr.spec.usages.iter().flatten().map(String::as_str).collect()
}

/// Checks usages against a signer's rule: all `required`, nothing outside `allowed`.
fn usage_problems(got: &[&str], required: &[&str], allowed: &[&str]) -> Option<String> {
    if let Some(missing) = required.iter().find(|u| !got.contains(u)) {
        return Some(format!("missing required usages: {missing}"));
    }
    got.iter().find(|u| !allowed.contains(u)).map(|extra| format!("usage not allowed: {extra}"))
}

/// Why a request's subject is not a node's: `system:node:<name>` in exactly `system:nodes`.
fn node_subject_problems(req: &common::pki::CsrInfo) -> Option<String> {
    if req.organizations != ["system:nodes"] {
        return Some("subject organization is not system:nodes".into());
    }
    (!req.common_name.starts_with("system:node:"))
        .then(|| "subject common name does not begin with system:node:".into())
}

/// Why a request is not a kubelet's client certificate request (Kubernetes'
/// `ValidateKubeletClientCSR`): subject `system:node:<name>` in exactly `system:nodes`, no
/// alternative names, usages `digital signature` and `client auth` (and `key encipherment`).
pub fn kubelet_client_problems(csr: &CertificateSigningRequest, req: &common::pki::CsrInfo) -> Option<String> {
    if let Some(p) = node_subject_problems(req) {
        return Some(p);
    }
    if !req.dns_names.is_empty() {
        return Some("DNS subjectAltNames are not allowed".into());
    }
    if !req.emails.is_empty() {
        return Some("Email subjectAltNames are not allowed".into());
    }
    if !req.ip_addresses.is_empty() {
        return Some("IP subjectAltNames are not allowed".into());
    }
    if !req.uris.is_empty() {
        return Some("URI subjectAltNames are not allowed".into());
    }
    usage_problems(
        &usages(csr),
        &["digital signature", "client auth"],
        &["digital signature", "key encipherment", "client auth"],
    )
}

/// Why a request is not a kubelet's serving certificate request (`ValidateKubeletServingCSR`):
/// subject `system:node:<name>` in `system:nodes`, at least one DNS name or IP, no e-mail or
/// URI names, usages `digital signature` and `server auth` (and `key encipherment`).
pub fn kubelet_serving_problems(csr: &CertificateSigningRequest, req: &common::pki::CsrInfo) -> Option<String> {
    if let Some(p) = node_subject_problems(req) {
        return Some(p);
    }
    if req.dns_names.is_empty() && req.ip_addresses.is_empty() {
        return Some("DNS or IP subjectAltName is required".into());
    }
    if !req.emails.is_empty() || !req.uris.is_empty() {
        return Some("Email and URI subjectAltNames are not allowed".into());
    }
    usage_problems(
        &usages(csr),
        &["digital signature", "server auth"],
        &["digital signature", "key encipherment", "server auth"],
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec;
    use k8s_openapi::ByteString;

    /// A request of `signer` from `username` for a key of `cn` in `orgs`.
    pub fn csr(signer: &str, username: &str, cn: &str, orgs: &[&str], usages: &[&str]) -> CertificateSigningRequest {
        let (request, _) = common::pki::new_csr(cn, orgs).unwrap();
        CertificateSigningRequest {
            metadata: kube::api::ObjectMeta { name: Some("node-csr-x".into()), ..Default::default() },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.into_bytes()),
                signer_name: signer.into(),
                username: Some(username.into()),
                groups: Some(vec!["system:bootstrappers".into(), "system:authenticated".into()]),
                usages: Some(usages.iter().map(|u| u.to_string()).collect()),
                ..Default::default()
            },
            status: None,
        }
    }

    #[test]
    fn a_kubelet_client_request_has_kubernetes_shape() {
        let good = csr(KUBELET_CLIENT, "u", "system:node:n1", &["system:nodes"], &["digital signature", "client auth"]);
        assert_eq!(kubelet_client_problems(&good, &request_of(&good).unwrap()), None);
        let other_org = csr(KUBELET_CLIENT, "u", "system:node:n1", &["system:masters"], &["client auth"]);
        assert_eq!(
            kubelet_client_problems(&other_org, &request_of(&other_org).unwrap()).as_deref(),
            Some("subject organization is not system:nodes")
        );
        let not_node = csr(KUBELET_CLIENT, "u", "admin", &["system:nodes"], &["digital signature", "client auth"]);
        assert!(kubelet_client_problems(&not_node, &request_of(&not_node).unwrap()).unwrap().contains("system:node:"));
        let serving =
            csr(KUBELET_CLIENT, "u", "system:node:n1", &["system:nodes"], &["digital signature", "server auth"]);
        assert_eq!(
            kubelet_client_problems(&serving, &request_of(&serving).unwrap()).as_deref(),
            Some("missing required usages: client auth")
        );
        // A serving request needs names.
        let serving =
            csr(KUBELET_SERVING, "u", "system:node:n1", &["system:nodes"], &["digital signature", "server auth"]);
        assert_eq!(
            kubelet_serving_problems(&serving, &request_of(&serving).unwrap()).as_deref(),
            Some("DNS or IP subjectAltName is required")
        );
    }
}
