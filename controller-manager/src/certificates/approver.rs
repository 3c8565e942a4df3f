//! `csrapproving`: approves the client certificate requests of kubelets that may ask for
//! one. A request of the kubelet client signer with a kubelet's shape
//! ([`super::kubelet_client_problems`]) is approved when a SubjectAccessReview says its
//! requester may `create` `certificatesigningrequests/selfnodeclient` (a node renewing its
//! own certificate: the requester is the certificate's subject) or `.../nodeclient` (a new
//! node, e.g. with a bootstrap token); otherwise it stays pending for a person to decide.
//!
//! [`decide`] is the decision (pure); [`reconcile`] asks the reviews and writes `/approval`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;

use super::{has_condition, kubelet_client_problems, request_of, Ctx, KUBELET_CLIENT};
use crate::Error;

/// What a request needs before it is approved.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Decided already, not a kubelet client request, or unreadable: left alone.
    Skip,
    /// Approve if the requester may create this subresource of certificatesigningrequests;
    /// the message of the approval.
    Review { subresource: &'static str, message: &'static str },
}

/// What to do with `csr`.
pub fn decide(csr: &CertificateSigningRequest) -> Decision {
    if has_condition(csr, "Approved") || has_condition(csr, "Denied") || csr.spec.signer_name != KUBELET_CLIENT {
        return Decision::Skip;
    }
    let Ok(req) = request_of(csr) else { return Decision::Skip };
    if kubelet_client_problems(csr, &req).is_some() {
        return Decision::Skip;
    }
    if csr.spec.username.as_deref() == Some(req.common_name.as_str()) {
        Decision::Review {
            subresource: "selfnodeclient",
            message: "Auto approving self kubelet client certificate after SubjectAccessReview.",
        }
    } else {
        Decision::Review {
            subresource: "nodeclient",
            message: "Auto approving kubelet client certificate after SubjectAccessReview.",
        }
    }
}

/// The review asking whether the requester of `csr` may create `subresource`.
pub fn review(csr: &CertificateSigningRequest, subresource: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: csr.spec.username.clone(),
            uid: csr.spec.uid.clone(),
            groups: csr.spec.groups.clone(),
            extra: csr.spec.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                group: Some("certificates.k8s.io".into()),
                resource: Some("certificatesigningrequests".into()),
                subresource: Some(subresource.into()),
                verb: Some("create".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// `csr` with the Approved condition added.
pub fn approved(csr: &CertificateSigningRequest, message: &str, now: Time) -> CertificateSigningRequest {
    let mut out = csr.clone();
    let status = out.status.get_or_insert_with(Default::default);
    status.conditions.get_or_insert_with(Vec::new).push(CertificateSigningRequestCondition {
        type_: "Approved".into(),
        status: "True".into(),
        reason: Some("AutoApproved".into()),
        message: Some(message.into()),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    });
    out
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let Decision::Review { subresource, message } = decide(&csr) else { return Ok(Action::await_change()) };
    let reviews: Api<SubjectAccessReview> = Api::all(ctx.client.clone());
    let answer = reviews.create(&PostParams::default(), &review(&csr, subresource)).await?;
    let name = csr.metadata.name.clone().unwrap_or_default();
    if !answer.status.is_some_and(|s| s.allowed) {
        tracing::info!(csr = %name, requester = ?csr.spec.username, subresource,
            "not approving: the requester may not ask for this certificate");
        return Ok(Action::await_change());
    }
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let body = approved(&csr, message, Time(k8s_openapi::jiff::Timestamp::now()));
    match api.replace_subresource("approval", &name, &PostParams::default(), &body).await {
        Ok(_) => tracing::info!(csr = %name, requester = ?csr.spec.username, "approved a kubelet client certificate"),
        // Changed or gone meanwhile: the watch brings the new version.
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

/// Run until the watch stream ends.
pub async fn run(client: kube::Client) {
    let policy =
        crate::runner::Policy { metric: "csrapproving", what: "certificate approval", retry: Duration::from_secs(2) };
    super::run_over_requests(client, reconcile, policy).await;
}

#[cfg(test)]
mod tests {
    use super::super::tests::csr;
    use super::*;

    const KUBELET_USAGES: &[&str] = &["digital signature", "client auth"];

    #[test]
    fn new_nodes_and_renewing_nodes_are_reviewed_and_others_left_alone() {
        let bootstrap =
            csr(KUBELET_CLIENT, "system:bootstrap:abcdef", "system:node:n1", &["system:nodes"], KUBELET_USAGES);
        assert!(matches!(decide(&bootstrap), Decision::Review { subresource: "nodeclient", .. }));
        let renewal = csr(KUBELET_CLIENT, "system:node:n1", "system:node:n1", &["system:nodes"], KUBELET_USAGES);
        assert!(matches!(decide(&renewal), Decision::Review { subresource: "selfnodeclient", .. }));
        // Another signer, another shape, or decided already: left alone.
        let other = csr("example.com/x", "u", "system:node:n1", &["system:nodes"], KUBELET_USAGES);
        assert_eq!(decide(&other), Decision::Skip);
        let admin = csr(KUBELET_CLIENT, "u", "system:node:n1", &["system:masters"], KUBELET_USAGES);
        assert_eq!(decide(&admin), Decision::Skip);
        let done = approved(&bootstrap, "ok", Time(k8s_openapi::jiff::Timestamp::now()));
        assert_eq!(decide(&done), Decision::Skip);
        // The review asks for the requester, not for the controller.
        let sar = review(&bootstrap, "nodeclient");
        assert_eq!(sar.spec.user.as_deref(), Some("system:bootstrap:abcdef"));
        assert_eq!(sar.spec.groups.as_ref().unwrap()[0], "system:bootstrappers");
        let attrs = sar.spec.resource_attributes.unwrap();
        assert_eq!((attrs.verb.unwrap(), attrs.subresource.unwrap()), ("create".into(), "nodeclient".into()));
        let cond = &done.status.unwrap().conditions.unwrap()[0];
        assert_eq!((cond.type_.as_str(), cond.reason.as_deref()), ("Approved", Some("AutoApproved")));
    }
}
