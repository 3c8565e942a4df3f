//! `--event-ttl`: Events expire an hour (by default) after they last happened. Kubernetes
//! attaches an etcd lease to each Event; here one sweeper deletes expired Events
//! periodically, which works the same on both storage backends.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::registry::generic::{DeleteOptions, ListOptions, Registry};

/// When an Event last happened: `lastTimestamp`, `eventTime`, `series.lastObservedTime` or
/// its creation, whichever is latest (seconds since the epoch).
pub fn last_seen(event: &Value) -> Option<i64> {
    ["/lastTimestamp", "/eventTime", "/series/lastObservedTime", "/metadata/creationTimestamp"]
        .iter()
        .filter_map(|p| event.pointer(p).and_then(Value::as_str))
        .filter_map(|t| t.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_second())
        .max()
}

/// Whether the Event has outlived the TTL at `now`.
pub fn expired(event: &Value, now: i64, ttl: Duration) -> bool {
    last_seen(event).is_some_and(|t| now - t >= ttl.as_secs() as i64)
}

/// How often the sweeper runs for a TTL.
pub fn sweep_interval(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Start the sweeper (a zero TTL disables it).
pub fn spawn(registry: Arc<Registry>, ttl: Duration) -> Option<tokio::task::JoinHandle<()>> {
    if ttl.is_zero() {
        return None;
    }
    Some(tokio::spawn(async move {
        loop {
            tokio::time::sleep(sweep_interval(ttl)).await;
            if let Err(e) = sweep(&registry, ttl).await {
                tracing::debug!(error = %e.message, "event TTL sweep failed");
            }
        }
    }))
}

async fn sweep(registry: &Registry, ttl: Duration) -> Result<(), crate::error::ApiError> {
    let Some(res) = crate::resources::find("", "v1", "events") else { return Ok(()) };
    let list = registry.list(res, None, &ListOptions::default()).await?;
    let now = jiff::Timestamp::now().as_second();
    for ev in list["items"].as_array().into_iter().flatten().filter(|e| expired(e, now, ttl)) {
        let ns = ev.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        let name = ev.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        match registry.delete(res, ns, name, &DeleteOptions::default()).await {
            Ok(_) => {}
            Err(e) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn expiry_counts_from_the_last_occurrence() {
        let ev =
            json!({"metadata": {"creationTimestamp": "2024-01-01T00:00:00Z"}, "lastTimestamp": "2024-01-01T00:30:00Z"});
        let t0 = "2024-01-01T00:00:00Z".parse::<jiff::Timestamp>().unwrap().as_second();
        let hour = Duration::from_secs(3600);
        assert!(!expired(&ev, t0 + 3600, hour));
        assert!(expired(&ev, t0 + 5400, hour));
        assert!(!expired(&json!({}), t0, hour));
        assert_eq!(sweep_interval(hour), Duration::from_secs(60));
        assert_eq!(sweep_interval(Duration::from_secs(2)), Duration::from_secs(1));
    }
}
