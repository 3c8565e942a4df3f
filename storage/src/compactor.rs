//! Periodic compaction, the way the Kubernetes apiserver drives etcd's: every interval,
//! compact to the revision that was current one interval ago, so history is kept for at
//! least one interval (5 minutes by default) and the store does not grow without bound.

use std::sync::Arc;
use std::time::Duration;

use crate::{Revision, Store};

/// Start the compaction loop on the current tokio runtime. Returns its task handle;
/// aborting it stops compaction.
pub fn spawn_compactor(store: Arc<dyn Store>, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut previous: Option<Revision> = None;
        loop {
            ticker.tick().await;
            if let Some(target) = previous {
                match store.compact(target).await {
                    Ok(()) => tracing::debug!(revision = target, "compacted storage history"),
                    Err(e) => tracing::warn!(error = %e, revision = target, "compaction failed; will retry"),
                }
            }
            match store.current_revision().await {
                Ok(rev) => previous = Some(rev),
                Err(e) => tracing::warn!(error = %e, "cannot read the current revision for compaction"),
            }
        }
    })
}
