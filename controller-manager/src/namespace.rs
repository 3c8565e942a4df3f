//! The namespace controller (`pkg/controller/namespace`): when a Namespace is being
//! deleted, delete everything in it (every namespaced resource discovery lists that
//! supports list and delete), report progress in the Namespace's status conditions
//! (`NamespaceDeletionDiscoveryFailure`, `NamespaceDeletionContentFailure`,
//! `NamespaceContentRemaining`, `NamespaceFinalizersRemaining`), and once nothing is
//! left remove the `kubernetes` finalizer through the `finalize` subresource, which
//! lets the apiserver delete the Namespace.
//!
//! [`conditions`] and [`finalized`] are the decisions (pure).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::{verbs, ApiResource, Discovery, Scope};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;

use crate::runner::{run_controller, Policy};
use crate::Error;

pub const FINALIZER: &str = "kubernetes";

/// What the deletion pass found.
#[derive(Debug, Default)]
pub struct Progress {
    /// resource → instances still present.
    pub remaining: BTreeMap<String, usize>,
    /// finalizer → instances carrying it.
    pub finalizers: BTreeMap<String, usize>,
    pub failures: Vec<String>,
    pub discovery_failure: Option<String>,
}

/// The Namespace's deletion conditions for a pass (`updateNamespaceStatusFunc`'s
/// conditions, with Kubernetes' reasons and messages).
pub fn conditions(p: &Progress, now: Timestamp) -> Vec<NamespaceCondition> {
    let cond = |type_: &str, ok: bool, reason_ok: &str, reason_bad: &str, msg: String| NamespaceCondition {
        type_: type_.into(),
        status: if ok { "False" } else { "True" }.into(),
        reason: Some(if ok { reason_ok } else { reason_bad }.into()),
        message: Some(if ok { "All resources successfully discovered".to_string() } else { msg }),
        last_transition_time: Some(Time(now)),
    };
    let mut out = vec![cond(
        "NamespaceDeletionDiscoveryFailure",
        p.discovery_failure.is_none(),
        "ResourcesDiscovered",
        "DiscoveryFailed",
        format!("Discovery failed for some groups: {}", p.discovery_failure.clone().unwrap_or_default()),
    )];
    let mut content_failure = cond(
        "NamespaceDeletionContentFailure",
        p.failures.is_empty(),
        "ContentDeleted",
        "ContentDeletionFailed",
        format!("Failed to delete all resource types, {} remaining: {}", p.failures.len(), p.failures.join(", ")),
    );
    if p.failures.is_empty() {
        content_failure.message = Some("All content successfully deleted, may be waiting on finalization".into());
    }
    out.push(content_failure);
    let remaining: Vec<String> = p.remaining.iter().map(|(r, n)| format!("{r} has {n} resource instances")).collect();
    let mut c = cond(
        "NamespaceContentRemaining",
        remaining.is_empty(),
        "ContentRemoved",
        "SomeResourcesRemain",
        format!("Some resources are remaining: {}", remaining.join(", ")),
    );
    if remaining.is_empty() {
        c.message = Some("All content successfully removed".into());
    }
    out.push(c);
    let fins: Vec<String> = p.finalizers.iter().map(|(f, n)| format!("{f} in {n} resource instances")).collect();
    let mut c = cond(
        "NamespaceFinalizersRemaining",
        fins.is_empty(),
        "ContentHasNoFinalizers",
        "SomeFinalizersRemain",
        format!("Some content in the namespace has finalizers remaining: {}", fins.join(", ")),
    );
    if fins.is_empty() {
        c.message = Some("All content-preserving finalizers finished".into());
    }
    out.push(c);
    out
}

/// The Namespace's `spec.finalizers` without ours.
pub fn finalized(ns: &Namespace) -> Vec<String> {
    ns.spec
        .as_ref()
        .and_then(|s| s.finalizers.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != FINALIZER)
        .collect()
}

struct Ctx {
    client: kube::Client,
}

async fn namespaced_resources(client: &kube::Client) -> Result<Vec<ApiResource>, String> {
    let discovery = Discovery::new(client.clone()).run().await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            if caps.scope == Scope::Namespaced
                && caps.supports_operation(verbs::LIST)
                && caps.supports_operation(verbs::DELETE)
                && !ar.plural.contains('/')
            {
                out.push(ar);
            }
        }
    }
    Ok(out)
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = ns.metadata.name.clone().unwrap_or_default();
    let has_ours =
        ns.spec.as_ref().and_then(|s| s.finalizers.as_ref()).is_some_and(|f| f.iter().any(|x| x == FINALIZER));
    if ns.metadata.deletion_timestamp.is_none() || !has_ours {
        return Ok(Action::await_change());
    }
    let mut progress = Progress::default();
    match namespaced_resources(&ctx.client).await {
        Err(e) => progress.discovery_failure = Some(e),
        Ok(resources) => {
            for ar in resources {
                let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &name, &ar);
                let list = match api.list(&ListParams::default()).await {
                    Ok(l) => l,
                    Err(e) => {
                        progress.failures.push(format!("{}: {e}", ar.plural));
                        continue;
                    }
                };
                if list.items.is_empty() {
                    continue;
                }
                for o in &list.items {
                    for f in o.metadata.finalizers.iter().flatten() {
                        *progress.finalizers.entry(f.clone()).or_default() += 1;
                    }
                    if o.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let n = o.metadata.name.clone().unwrap_or_default();
                    match api.delete(&n, &DeleteParams::background()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(e) => progress.failures.push(format!("{}: {e}", ar.plural)),
                    }
                }
                let left = api.list(&ListParams::default()).await.map(|l| l.items.len()).unwrap_or(list.items.len());
                if left > 0 {
                    let key =
                        if ar.group.is_empty() { ar.plural.clone() } else { format!("{}.{}", ar.plural, ar.group) };
                    progress.remaining.insert(key, left);
                }
            }
        }
    }
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let done = progress.remaining.is_empty() && progress.failures.is_empty() && progress.discovery_failure.is_none();
    if !done {
        let patch = json!({"status": {"conditions": conditions(&progress, Timestamp::now())}});
        let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let mut next = (*ns).clone();
    next.spec.get_or_insert_with(Default::default).finalizers = Some(finalized(&ns));
    match api.replace_subresource("finalize", &name, &PostParams::default(), &next).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    tracing::info!(namespace = %name, "namespace content deleted; finalized");
    Ok(Action::await_change())
}

pub async fn run(client: kube::Client) {
    let ctx = Arc::new(Ctx { client: client.clone() });
    run_controller(
        Controller::new(Api::<Namespace>::all(client), watcher::Config::default()),
        reconcile,
        ctx,
        Policy { metric: "namespace", what: "namespace", retry: Duration::from_secs(2) },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NamespaceSpec;

    #[test]
    fn conditions_report_what_remains() {
        let mut p = Progress::default();
        p.remaining.insert("pods".into(), 2);
        p.finalizers.insert("example.com/keep".into(), 1);
        let c = conditions(&p, Timestamp::UNIX_EPOCH);
        let remaining = c.iter().find(|c| c.type_ == "NamespaceContentRemaining").unwrap();
        assert_eq!(remaining.status, "True");
        assert_eq!(remaining.reason.as_deref(), Some("SomeResourcesRemain"));
        assert_eq!(remaining.message.as_deref(), Some("Some resources are remaining: pods has 2 resource instances"));
        let fins = c.iter().find(|c| c.type_ == "NamespaceFinalizersRemaining").unwrap();
        assert_eq!(fins.status, "True");
        let ok = conditions(&Progress::default(), Timestamp::UNIX_EPOCH);
        assert!(ok.iter().all(|c| c.status == "False"));
    }

    #[test]
    fn finalize_removes_only_kubernetes() {
        let ns = Namespace {
            spec: Some(NamespaceSpec { finalizers: Some(vec!["kubernetes".into(), "other".into()]) }),
            ..Default::default()
        };
        assert_eq!(finalized(&ns), vec!["other".to_string()]);
    }
}
