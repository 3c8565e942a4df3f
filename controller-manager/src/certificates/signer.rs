//! `csrsigning`: issues the approved requests of Kubernetes' built-in signers with the
//! cluster CA (`--cluster-signing-cert-file`, `--cluster-signing-key-file`), for
//! `--cluster-signing-duration` or the request's shorter `expirationSeconds`. A request that
//! breaks its signer's rules gets a `Failed` condition (`SignerValidationFailure`) instead.
//!
//! [`plan`] is the decision (pure); [`reconcile`] signs and writes `/status`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::{watcher, Controller};

use super::{
    has_condition, kubelet_client_problems, kubelet_serving_problems, request_of, APISERVER_CLIENT, KUBELET_CLIENT,
    KUBELET_SERVING, LEGACY_UNKNOWN,
};
use crate::Error;

/// The shortest certificate a request may ask for (`expirationSeconds`).
pub const MIN_SECONDS: i64 = 600;

/// What to do with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Not approved, issued, failed, or not a signer of ours.
    Skip,
    /// Sign for these usages, valid this many seconds.
    Sign { usages: Vec<String>, seconds: i64 },
    /// Mark it Failed with this message.
    Fail(String),
}

/// What to do with `csr`, signing for at most `max_seconds`.
pub fn plan(csr: &CertificateSigningRequest, max_seconds: i64) -> Plan {
    let issued = csr.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some_and(|c| !c.0.is_empty());
    if !has_condition(csr, "Approved") || has_condition(csr, "Failed") || issued {
        return Plan::Skip;
    }
    let signer = csr.spec.signer_name.as_str();
    if ![KUBELET_CLIENT, APISERVER_CLIENT, KUBELET_SERVING, LEGACY_UNKNOWN].contains(&signer) {
        return Plan::Skip;
    }
    let req = match request_of(csr) {
        Ok(r) => r,
        Err(e) => return Plan::Fail(format!("unable to parse csr: {e}")),
    };
    let usages: Vec<String> = csr.spec.usages.clone().unwrap_or_default();
    let problem = match signer {
        KUBELET_CLIENT => kubelet_client_problems(csr, &req),
        KUBELET_SERVING => kubelet_serving_problems(csr, &req),
        APISERVER_CLIENT => {
            let allowed = ["digital signature", "key encipherment", "client auth"];
            usages.iter().find(|u| !allowed.contains(&u.as_str())).map(|u| format!("usage not allowed: {u}"))
        }
        _ => None,
    };
    if let Some(p) = problem {
        return Plan::Fail(format!("invalid x509 certificate request: {p}"));
    }
    let seconds = match csr.spec.expiration_seconds.map(i64::from) {
        Some(asked) => asked.clamp(MIN_SECONDS, max_seconds.max(MIN_SECONDS)),
        None => max_seconds,
    };
    Plan::Sign { usages, seconds }
}

fn condition(ty: &str, reason: &str, message: &str, now: &Time) -> CertificateSigningRequestCondition {
    CertificateSigningRequestCondition {
        type_: ty.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

struct Ctx {
    client: kube::Client,
    ca: common::pki::Ca,
    max_seconds: i64,
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    let mut out = (*csr).clone();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    match plan(&csr, ctx.max_seconds) {
        Plan::Skip => return Ok(Action::await_change()),
        Plan::Fail(message) => {
            tracing::warn!(csr = %name, %message, "not signing");
            let status = out.status.get_or_insert_with(Default::default);
            status.conditions.get_or_insert_with(Vec::new).push(condition(
                "Failed",
                "SignerValidationFailure",
                &message,
                &now,
            ));
        }
        Plan::Sign { usages, seconds } => {
            let pem = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
            let cert = ctx
                .ca
                .sign_request(&pem, &usages, common::pki::seconds(seconds), common::pki::now())
                .map_err(|e| Error::Other(format!("signing {name}: {e}")))?;
            out.status.get_or_insert_with(Default::default).certificate = Some(ByteString(cert.into_bytes()));
            tracing::info!(csr = %name, signer = %csr.spec.signer_name, seconds, "signed a certificate");
        }
    }
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    match api.replace_status(&name, &PostParams::default(), &out).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

/// Run until the watch stream ends, signing with `ca` for at most `max`.
pub async fn run(client: kube::Client, ca: common::pki::Ca, max: Duration) {
    let ctx = Arc::new(Ctx { client: client.clone(), ca, max_seconds: max.as_secs() as i64 });
    let controller = Controller::new(Api::<CertificateSigningRequest>::all(client), watcher::Config::default());
    crate::runner::run_controller(
        controller,
        reconcile,
        ctx,
        crate::runner::Policy { metric: "csrsigning", what: "certificate signing", retry: Duration::from_secs(2) },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::super::approver::approved;
    use super::super::tests::csr;
    use super::*;

    const YEAR: i64 = 365 * 24 * 3600;

    #[test]
    fn approved_requests_are_signed_for_the_shorter_duration_and_bad_ones_fail() {
        let now = || Time(k8s_openapi::jiff::Timestamp::now());
        let usages = &["digital signature", "client auth"];
        let pending = csr(KUBELET_CLIENT, "u", "system:node:n1", &["system:nodes"], usages);
        assert_eq!(plan(&pending, YEAR), Plan::Skip, "not approved");
        let ok = approved(&pending, "ok", now());
        assert_eq!(
            plan(&ok, YEAR),
            Plan::Sign { usages: vec!["digital signature".into(), "client auth".into()], seconds: YEAR }
        );
        let mut short = ok.clone();
        short.spec.expiration_seconds = Some(3600);
        assert!(matches!(plan(&short, YEAR), Plan::Sign { seconds: 3600, .. }));
        let mut issued = ok.clone();
        issued.status.as_mut().unwrap().certificate = Some(ByteString(b"x".to_vec()));
        assert_eq!(plan(&issued, YEAR), Plan::Skip);
        // A kubelet client request for a non-node subject fails, naming why.
        let admin = approved(&csr(KUBELET_CLIENT, "u", "admin", &["system:masters"], usages), "ok", now());
        assert_eq!(
            plan(&admin, YEAR),
            Plan::Fail("invalid x509 certificate request: subject organization is not system:nodes".into())
        );
        // Other signers are somebody else's.
        assert_eq!(plan(&approved(&csr("example.com/x", "u", "a", &[], usages), "ok", now()), YEAR), Plan::Skip);
        let client = approved(&csr(APISERVER_CLIENT, "u", "alice", &["devs"], usages), "ok", now());
        assert!(matches!(plan(&client, YEAR), Plan::Sign { .. }));
    }
}
