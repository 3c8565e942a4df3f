//! Controllers that keep one named object in every namespace (the `default` ServiceAccount,
//! the `kube-root-ca.crt` ConfigMap): one reconcile per Namespace, run again when that
//! namespace's object of the name changes or goes. A terminating namespace gets nothing
//! (new objects would be refused and hold up its deletion).

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::NamespaceResourceScope;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use crate::Error;

/// Is the namespace being deleted?
pub fn is_terminating(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_some()
        || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating")
}

/// Run `reconcile` for every Namespace, and again for one whose `K` named `name` changes,
/// until the watch streams end; `what` names the controller in its logs.
pub async fn run<K, C, F, Fut>(client: kube::Client, name: &str, reconcile: F, ctx: Arc<C>, what: &'static str)
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
    C: Send + Sync + 'static,
    F: FnMut(Arc<Namespace>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action, Error>> + Send + 'static,
{
    let children = watcher::Config::default().fields(&format!("metadata.name={name}"));
    Controller::new(Api::<Namespace>::all(client.clone()), watcher::Config::default())
        .watches(Api::<K>::all(client), children, |o| o.meta().namespace.as_deref().map(ObjectRef::<Namespace>::new))
        .run(
            reconcile,
            move |_n, e, _| {
                tracing::warn!(error = %e, "{what} sync failed");
                Action::requeue(Duration::from_secs(2))
            },
            ctx,
        )
        .for_each(|_| async {})
        .await;
}
