//! Namespace lifecycle for the create path (Kubernetes' NamespaceLifecycle admission): an
//! object may be created only in an existing, non-terminating namespace
//! ([`NamespaceCache::admit_create`]). A cache answers it without a storage read (the
//! admission plugin reads an informer the same way): one storage list + watch of
//! `/registry/namespaces/` keeps a map of which namespaces exist and which are terminating.
//!
//! The cache only ever says "active, go ahead". Anything else — a namespace it does not
//! know, one it knows as terminating, a cache not yet synced, or one older than the last
//! namespace write this apiserver made — sends the caller to storage, so a 404 or 403 is
//! always decided on current data and a namespace change made through this apiserver is
//! seen by the next request (read-your-writes).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use storage::{EventKind, Range, Revision, Store};

use crate::error::{ApiError, ApiResult, FieldError};
use crate::registry::ResourceDef;

pub const PREFIX: &str = "/registry/namespaces/";

#[derive(Default)]
struct State {
    /// Namespace name → terminating.
    namespaces: HashMap<String, bool>,
    /// The cache reflects storage as of this revision (0 = not synced).
    revision: Revision,
}

pub struct NamespaceCache {
    store: Arc<dyn Store>,
    state: Mutex<State>,
    /// The newest revision of a namespace write made through this apiserver.
    written: AtomicI64,
    start: Once,
}

/// Whether a stored Namespace is terminating (marked for deletion or in phase Terminating).
pub fn terminating(ns: &Value) -> bool {
    ns.get("metadata").and_then(|m| m.get("deletionTimestamp")).is_some_and(|d| !d.is_null())
        || ns.get("status").and_then(|s| s.get("phase")).and_then(Value::as_str) == Some("Terminating")
}

impl NamespaceCache {
    /// An object named `name` of `res` may be created in namespace `ns`: it exists and is
    /// not terminating (404 / 403 `NamespaceTerminating` otherwise, as Kubernetes answers).
    pub async fn admit_create(self: &Arc<Self>, res: &ResourceDef, ns: &str, name: &str) -> ApiResult<()> {
        if self.known_active(ns) {
            return Ok(());
        }
        let Some(kv) = self.store.get(&format!("{PREFIX}{ns}")).await?.1 else {
            return Err(ApiError::not_found("", "namespaces", ns));
        };
        let stored: Value = serde_json::from_slice(&kv.value)
            .map_err(|e| ApiError::internal(format!("stored namespace {ns} is corrupt: {e}")))?;
        if terminating(&stored) {
            let mut e = ApiError::forbidden(
                res.group,
                res.plural,
                name,
                &format!("unable to create new content in namespace {ns} because it is being terminated"),
            );
            if let Some(d) = e.details.as_mut() {
                d.causes.push(FieldError {
                    reason: "NamespaceTerminating",
                    field: "metadata.namespace".into(),
                    message: format!("namespace {ns} is being terminated"),
                });
            }
            return Err(e);
        }
        Ok(())
    }

    pub fn new(store: Arc<dyn Store>) -> Self {
        NamespaceCache { store, state: Mutex::new(State::default()), written: AtomicI64::new(0), start: Once::new() }
    }

    /// Record a committed namespace write (its revision).
    pub fn wrote(&self, revision: Revision) {
        self.written.fetch_max(revision, Ordering::SeqCst);
    }

    /// True only if the cache is synced, not older than this apiserver's last namespace
    /// write, and knows `ns` as an active namespace. False means "ask storage".
    pub fn known_active(self: &Arc<Self>, ns: &str) -> bool {
        self.start.call_once(|| {
            // Outside a runtime (unit tests) there is no cache: every check goes to storage.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(feed(self.clone()));
            }
        });
        let written = self.written.load(Ordering::SeqCst);
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.revision > 0 && state.revision >= written && state.namespaces.get(ns) == Some(&false)
    }

    fn set(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// List, then follow the watch; on any error forget everything and start over.
async fn feed(cache: Arc<NamespaceCache>) {
    loop {
        if let Err(e) = sync_and_follow(&cache).await {
            tracing::debug!(error = %e, "namespace cache resyncing");
        }
        cache.set(|s| *s = State::default());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn sync_and_follow(cache: &NamespaceCache) -> storage::Result<()> {
    let list = cache.store.range(Range::prefix(PREFIX)).await?;
    let mut namespaces = HashMap::new();
    for kv in &list.kvs {
        if let Ok(v) = serde_json::from_slice::<Value>(&kv.value) {
            namespaces.insert(kv.key[PREFIX.len()..].to_string(), terminating(&v));
        }
    }
    let mut stream = cache.store.watch(PREFIX, list.revision).await?;
    cache.set(|s| {
        s.namespaces = namespaces;
        s.revision = list.revision;
    });
    while let Some(ev) = stream.next().await {
        let ev = ev?;
        let revision = ev.revision();
        let name = ev.kv.key.strip_prefix(PREFIX).unwrap_or(&ev.kv.key).to_string();
        let state = match ev.kind {
            EventKind::Put => Some(serde_json::from_slice::<Value>(&ev.kv.value).map_or(true, |v| terminating(&v))),
            EventKind::Delete => None,
        };
        cache.set(|s| {
            match state {
                Some(t) => {
                    s.namespaces.insert(name, t);
                }
                None => {
                    s.namespaces.remove(&name);
                }
            }
            s.revision = s.revision.max(revision);
        });
    }
    Err(storage::Error::Unavailable("namespace watch ended".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn terminating_namespaces() {
        assert!(!terminating(&json!({"metadata": {"name": "a"}, "status": {"phase": "Active"}})));
        assert!(terminating(&json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}})));
        assert!(terminating(&json!({"metadata": {}, "status": {"phase": "Terminating"}})));
    }
}
