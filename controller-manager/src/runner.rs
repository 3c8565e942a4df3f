//! The loop every controller ends in: run the `kube::runtime::Controller` until its watches
//! end, count each reconcile in `controller_manager_syncs_total`, and retry a failed one
//! after a fixed delay, logged as `<what> sync failed`.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryFuture};
use kube::runtime::controller::{Action, Controller};
use kube::Resource;
use serde::de::DeserializeOwned;

/// How a controller is named in metrics and logs, and how soon a failed sync is retried.
pub struct Policy {
    /// The `controller` label of `controller_manager_syncs_total`.
    pub metric: &'static str,
    /// What the warning about a failed sync calls the controller.
    pub what: &'static str,
    pub retry: Duration,
}

/// Run `controller` with `reconcile` over `ctx` until its watches end.
pub async fn run_controller<K, Ctx, Fut>(
    controller: Controller<K>,
    reconcile: impl FnMut(Arc<K>, Arc<Ctx>) -> Fut,
    ctx: Arc<Ctx>,
    policy: Policy,
) where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Unpin,
    Fut: TryFuture<Ok = Action> + Send + 'static,
    Fut::Error: std::error::Error + Send + 'static,
{
    let Policy { metric, what, retry } = policy;
    controller
        .run(
            reconcile,
            move |_obj, e, _ctx| {
                tracing::warn!(error = %e, "{what} sync failed");
                Action::requeue(retry)
            },
            ctx,
        )
        .for_each(|r| async move { crate::metrics::sync(metric, r.is_ok()) })
        .await;
}
