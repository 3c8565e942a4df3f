//! The service account controller (`pkg/controller/serviceaccount`): every active
//! Namespace has a ServiceAccount named `default`, which pods get when they name none
//! (the apiserver defaults `spec.serviceAccountName` to it). It is created with the
//! Namespace and again if it is deleted; a terminating Namespace gets none.
//!
//! [`missing`] is the decision (pure); [`reconcile`] creates what it names.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::controller::Action;

use crate::Error;

/// The service accounts every namespace has (Kubernetes' `DefaultServiceAccountsControllerOptions`).
pub const DEFAULT_SERVICE_ACCOUNTS: &[&str] = &["default"];

/// The service accounts to create in `ns`, given the names it already has. None while it
/// is being deleted: new objects would be refused, and would hold up the deletion.
pub fn missing<'a>(ns: &Namespace, existing: &[String], wanted: &[&'a str]) -> Vec<&'a str> {
    if crate::pernamespace::is_terminating(ns) {
        return Vec::new();
    }
    wanted.iter().copied().filter(|w| !existing.iter().any(|e| e == w)).collect()
}

struct Ctx {
    client: kube::Client,
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = ns.metadata.name.clone().unwrap_or_default();
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &name);
    let mut existing = Vec::new();
    for wanted in DEFAULT_SERVICE_ACCOUNTS {
        if api.get_opt(wanted).await?.is_some() {
            existing.push(wanted.to_string());
        }
    }
    for sa in missing(&ns, &existing, DEFAULT_SERVICE_ACCOUNTS) {
        let obj = ServiceAccount {
            metadata: ObjectMeta { name: Some(sa.into()), ..Default::default() },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => tracing::info!(namespace = %name, service_account = sa, "created service account"),
            // Created meanwhile, or the namespace began terminating / went away.
            Err(kube::Error::Api(e)) if matches!(e.code, 403 | 404 | 409) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}

/// Run until the watch streams end. A deleted default service account brings its
/// namespace back for a check.
pub async fn run(client: kube::Client) {
    let ctx = Arc::new(Ctx { client: client.clone() });
    crate::pernamespace::run::<ServiceAccount, _, _, _>(client, "default", reconcile, ctx, "service account").await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::namespace_in_phase as ns;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn an_active_namespace_gets_what_it_lacks() {
        assert_eq!(missing(&ns("Active"), &[], DEFAULT_SERVICE_ACCOUNTS), ["default"]);
        assert!(missing(&ns("Active"), &["default".into()], DEFAULT_SERVICE_ACCOUNTS).is_empty());
        assert_eq!(missing(&ns("Active"), &["default".into()], &["default", "builder"]), ["builder"]);
    }

    #[test]
    fn a_terminating_namespace_gets_nothing() {
        assert!(missing(&ns("Terminating"), &[], DEFAULT_SERVICE_ACCOUNTS).is_empty());
        let mut deleting = ns("Active");
        deleting.metadata.deletion_timestamp = Some(Time(crate::testutil::now()));
        assert!(missing(&deleting, &[], DEFAULT_SERVICE_ACCOUNTS).is_empty());
    }
}
