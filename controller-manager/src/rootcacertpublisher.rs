//! The root CA certificate publisher (`root-ca-cert-publisher`): every active Namespace has
//! a ConfigMap `kube-root-ca.crt` whose `ca.crt` is the CA bundle that verifies the
//! apiserver (`--root-ca-file`), which the token volume of every pod projects next to its
//! ServiceAccount token. It is created with the Namespace, put back when deleted or changed;
//! a terminating Namespace gets none. Without `--root-ca-file` (a plain-HTTP cluster) the
//! bundle is empty, so pods still start.
//!
//! [`desired`] is the decision (pure); [`reconcile`] writes what it names.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::controller::Action;

use crate::Error;

pub const NAME: &str = "kube-root-ca.crt";
pub const KEY: &str = "ca.crt";
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

/// What to do in a namespace.
#[derive(Debug, PartialEq)]
pub enum Step {
    Nothing,
    Create(ConfigMap),
    /// Replace the data (and description) of the existing ConfigMap.
    Update(ConfigMap),
}

/// The step that makes `existing` (the namespace's `kube-root-ca.crt`, if any) hold `ca`.
pub fn desired(ns: &Namespace, existing: Option<&ConfigMap>, ca: &str) -> Step {
    if crate::pernamespace::is_terminating(ns) {
        return Step::Nothing;
    }
    let data = BTreeMap::from([(KEY.to_string(), ca.to_string())]);
    let description = || BTreeMap::from([("kubernetes.io/description".to_string(), DESCRIPTION.to_string())]);
    match existing {
        None => Step::Create(ConfigMap {
            metadata: ObjectMeta {
                name: Some(NAME.into()),
                namespace: ns.metadata.name.clone(),
                annotations: Some(description()),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        }),
        Some(cm) if cm.data.as_ref() == Some(&data) && cm.binary_data.is_none() => Step::Nothing,
        Some(cm) => {
            let mut cm = cm.clone();
            cm.data = Some(data);
            cm.binary_data = None;
            cm.metadata.annotations.get_or_insert_with(BTreeMap::new).extend(description());
            Step::Update(cm)
        }
    }
}

struct Ctx {
    client: kube::Client,
    ca: String,
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = ns.metadata.name.clone().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &name);
    let result = match desired(&ns, api.get_opt(NAME).await?.as_ref(), &ctx.ca) {
        Step::Nothing => return Ok(Action::await_change()),
        Step::Create(cm) => api.create(&PostParams::default(), &cm).await.map(|_| "created"),
        Step::Update(cm) => api.replace(NAME, &PostParams::default(), &cm).await.map(|_| "updated"),
    };
    match result {
        Ok(what) => tracing::info!(namespace = %name, configmap = NAME, "{what} the root CA ConfigMap"),
        // Written meanwhile (the watch brings it back), or the namespace is going away.
        Err(kube::Error::Api(e)) if matches!(e.code, 403 | 404 | 409) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

/// Run until the watch streams end; `ca` is the bundle to publish.
pub async fn run(client: kube::Client, ca: String) {
    let ctx = Arc::new(Ctx { client: client.clone(), ca });
    crate::pernamespace::run::<ConfigMap, _, _, _>(client, NAME, reconcile, ctx, "root CA ConfigMap").await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::namespace_in_phase as ns;

    #[test]
    fn every_active_namespace_holds_the_bundle() {
        let Step::Create(cm) = desired(&ns("Active"), None, "PEM") else { panic!("no create") };
        assert_eq!(cm.metadata.name.as_deref(), Some("kube-root-ca.crt"));
        assert_eq!(cm.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(cm.data.as_ref().unwrap()["ca.crt"], "PEM");
        assert_eq!(desired(&ns("Active"), Some(&cm), "PEM"), Step::Nothing);
        let Step::Update(updated) = desired(&ns("Active"), Some(&cm), "NEW") else { panic!("no update") };
        assert_eq!(updated.data.as_ref().unwrap()["ca.crt"], "NEW");
        assert_eq!(desired(&ns("Terminating"), None, "PEM"), Step::Nothing);
    }
}
