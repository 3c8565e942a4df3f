//! The watch cache: one storage watch per resource feeds every HTTP watcher of that
//! resource through a ring buffer of recent events and a broadcast channel.
//!
//! Guarantees: a watcher that starts after revision R gets every event with revision > R
//! once, in order. Events older than the ring are served by a storage watch of the
//! watcher's own until it has caught up with the ring ([`WatcherEvents`]), so a resume after
//! an apiserver restart has no gap; history compacted away is a 410.
//!
//! The storage watch has progress ([`Store::watch_with_progress`]): when other resources are
//! written, the cache learns that it has every event of its own up to a newer revision,
//! raises `last_rev` and passes the progress on to live watchers in order with the events,
//! so their bookmarks carry a recent resourceVersion (as Kubernetes' watch cache does with
//! etcd's progress notifications) and a client resuming from one finds it in the cache.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{json, Value};
use storage::{EventKind, Revision, Store, WatchItem};
use tokio::sync::broadcast;

use crate::error::{ApiError, FieldError};
use crate::query::{q_bool, q_i64};
use crate::registry::generic::decode;

/// One change, decoded once and shared by every watcher.
#[derive(Debug)]
pub struct CachedEvent {
    pub revision: Revision,
    pub key: String,
    pub deleted: bool,
    /// The object after the change; for a delete, the last state with the delete's
    /// revision as its resourceVersion.
    pub object: Value,
    /// `object` serialized once.
    pub object_json: Bytes,
    /// The object before the change (None for a create or when unknown).
    pub prev: Option<Value>,
}

impl CachedEvent {
    pub fn from_storage(ev: &storage::Event) -> Result<Self, ApiError> {
        let revision = ev.revision();
        let prev = match &ev.prev {
            Some(p) => Some(decode(p)?),
            None => None,
        };
        let (deleted, object) = match ev.kind {
            EventKind::Put => (false, decode(&ev.kv)?),
            EventKind::Delete => {
                let mut last = prev.clone().unwrap_or_else(|| json!({"metadata": {}}));
                crate::registry::set_at(&mut last, "/metadata/resourceVersion", json!(revision.to_string()));
                (true, last)
            }
        };
        let object_json = Bytes::from(serde_json::to_vec(&object).unwrap_or_default());
        Ok(CachedEvent { revision, key: ev.kv.key.clone(), deleted, object, object_json, prev })
    }
}

struct Inner {
    /// Recent events as storage gave them (the stored JSON bytes, shared with storage's
    /// own buffers): a decoded event costs several times its JSON (a BTreeMap node per
    /// JSON object), and only a watcher resuming from an older revision needs these, so
    /// they are decoded again then. Live watchers get decoded events from `tx`.
    ring: VecDeque<storage::Event>,
    /// When each event of the ring arrived (same order).
    arrived: VecDeque<Instant>,
    /// How many events the ring keeps now: it follows the resource's write rate
    /// ([`resized`]).
    capacity: usize,
    /// The ring holds every event with revision > start_rev.
    start_rev: Revision,
    /// The cache has every event up to this revision (its start, events and progress).
    last_rev: Revision,
    tx: broadcast::Sender<CacheUpdate>,
}

/// What live watchers receive, in revision order.
#[derive(Clone, Debug)]
pub enum CacheUpdate {
    Event(Arc<CachedEvent>),
    /// Every event up to this revision has been sent before.
    Progress(Revision),
}

pub struct WatchCache {
    pub prefix: String,
    /// The ring's smallest and largest capacity.
    bounds: (usize, usize),
    inner: Mutex<Inner>,
}

/// How a watcher starting after some revision is fed.
pub enum Subscription {
    /// From the cache: these buffered events, then the channel (skip revisions already seen).
    /// Once the backlog is sent, the watcher has every event up to `complete` (at least the
    /// revision it started after).
    Cache { backlog: Vec<Arc<CachedEvent>>, complete: Revision, rx: broadcast::Receiver<CacheUpdate> },
    /// The revision is older than the ring: the caller watches storage directly.
    TooOld,
}

/// Updates a live watcher may fall behind before it catches up from the ring or storage
/// instead. tokio allocates every slot up front (~40 bytes each), per watched resource.
const CHANNEL_CAPACITY: usize = 256;

/// Events a cache's ring keeps at least (kube-apiserver's `--default-watch-cache-size`).
/// Each holds the object and its previous state: 10,000 pod events cost ~22 MB.
pub const DEFAULT_CACHE_SIZE: usize = 100;
/// The most events a ring grows to (kube-apiserver's upper bound, 100 × 1024).
pub const MAX_CACHE_SIZE: usize = 100 * 1024;
/// A ring grows while its oldest event is younger than this, and shrinks when even its
/// newest quarter is older (kube-apiserver's `eventFreshDuration`).
pub const EVENT_FRESH: Duration = Duration::from_secs(75);

/// Kubernetes' watch cache sizing, decided when an event arrives at a full ring of
/// `capacity`: double it (up to `bounds.1`) when the oldest event is younger than
/// [`EVENT_FRESH`] — a watcher that lost its connection a minute ago can still resume from
/// the ring at this write rate — and halve it (down to `bounds.0`) when the oldest event of
/// the newest quarter is older than that: the rate fell, the memory goes back. Between the
/// two it stays (no flapping).
pub fn resized(capacity: usize, bounds: (usize, usize), oldest_age: Duration, newest_quarter_age: Duration) -> usize {
    if oldest_age < EVENT_FRESH {
        (capacity * 2).min(bounds.1).max(capacity)
    } else if newest_quarter_age > EVENT_FRESH {
        (capacity / 2).max(bounds.0).min(capacity)
    } else {
        capacity
    }
}

impl WatchCache {
    /// A cache whose ring starts at `min_capacity` events and adapts up to
    /// [`MAX_CACHE_SIZE`] (0: no ring at all).
    fn new(prefix: String, min_capacity: usize, start_rev: Revision) -> Self {
        let (tx, _) = broadcast::channel(CHANNEL_CAPACITY);
        let bounds = if min_capacity == 0 { (0, 0) } else { (min_capacity, MAX_CACHE_SIZE.max(min_capacity)) };
        WatchCache {
            prefix,
            bounds,
            inner: Mutex::new(Inner {
                ring: VecDeque::new(),
                arrived: VecDeque::new(),
                capacity: bounds.0,
                start_rev,
                last_rev: start_rev,
                tx,
            }),
        }
    }

    /// How many events the ring keeps now.
    pub fn capacity(&self) -> usize {
        self.lock().capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn subscribe(&self, after: Revision) -> Subscription {
        let (raw, complete, rx) = {
            let inner = self.lock();
            if after < inner.start_rev {
                return Subscription::TooOld;
            }
            // The ring is in revision order: only its tail is newer than `after`.
            let newer = inner.ring.iter().rev().take_while(|e| e.revision() > after).count();
            let raw: Vec<storage::Event> = inner.ring.iter().skip(inner.ring.len() - newer).cloned().collect();
            (raw, inner.last_rev.max(after), inner.tx.subscribe())
        };
        // Decoded outside the lock; these decoded before, when they were pushed.
        let backlog = raw.iter().filter_map(|e| CachedEvent::from_storage(e).ok()).map(Arc::new).collect();
        Subscription::Cache { backlog, complete, rx }
    }

    pub fn last_revision(&self) -> Revision {
        self.lock().last_rev
    }

    /// Add a storage event (`ev` is its decoded form) and hand it to live watchers.
    fn push(&self, raw: storage::Event, ev: CachedEvent) {
        self.push_at(raw, ev, Instant::now())
    }

    fn push_at(&self, raw: storage::Event, ev: CachedEvent, now: Instant) {
        let ev = Arc::new(ev);
        let mut inner = self.lock();
        inner.last_rev = inner.last_rev.max(ev.revision);
        let len = inner.ring.len();
        if len > 0 && len >= inner.capacity {
            let age = |i: usize| inner.arrived.get(i).map_or(Duration::ZERO, |t| now.saturating_duration_since(*t));
            // The oldest event of the newest quarter (the oldest of all while a quarter is
            // less than one event, as kube-apiserver's ring index wraps).
            let quarter = (len - inner.capacity / 4) % len;
            let capacity = resized(inner.capacity, self.bounds, age(0), age(quarter));
            if capacity != inner.capacity {
                tracing::debug!(resource = %self.prefix, from = inner.capacity, to = capacity, "watch cache resized");
                inner.capacity = capacity;
            }
        }
        inner.ring.push_back(raw);
        inner.arrived.push_back(now);
        while inner.ring.len() > inner.capacity {
            inner.arrived.pop_front();
            if let Some(old) = inner.ring.pop_front() {
                inner.start_rev = old.revision();
            }
        }
        // No receivers is fine.
        let _ = inner.tx.send(CacheUpdate::Event(ev));
    }

    /// Storage says every event of this resource up to `rev` has been delivered.
    fn progress(&self, rev: Revision) {
        let mut inner = self.lock();
        if rev > inner.last_rev {
            inner.last_rev = rev;
            // The ring stays complete after `start_rev`: there was nothing to add to it.
            let _ = inner.tx.send(CacheUpdate::Progress(rev));
        }
    }

    /// Forget everything (history was compacted under us): current watchers are closed
    /// and must re-watch.
    fn reset(&self, rev: Revision) {
        let mut inner = self.lock();
        inner.ring.clear();
        inner.arrived.clear();
        inner.start_rev = rev;
        inner.last_rev = rev;
        let (tx, _) = broadcast::channel(CHANNEL_CAPACITY);
        inner.tx = tx;
    }
}

/// All watch caches, created on first use.
pub struct WatchCaches {
    store: Arc<dyn Store>,
    capacity: usize,
    caches: Mutex<HashMap<String, Arc<WatchCache>>>,
}

impl WatchCaches {
    pub fn new(store: Arc<dyn Store>, capacity: usize) -> Self {
        WatchCaches { store, capacity, caches: Mutex::new(HashMap::new()) }
    }

    pub fn count(&self) -> usize {
        self.caches.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// The cache for a resource prefix (`/registry/pods/`), started if needed.
    pub async fn get(&self, prefix: &str) -> Result<Arc<WatchCache>, ApiError> {
        if let Some(c) = self.caches.lock().ok().and_then(|m| m.get(prefix).cloned()) {
            return Ok(c);
        }
        let rev = self.store.current_revision().await?;
        let mut map = self.caches.lock().map_err(|_| ApiError::internal("watch cache lock poisoned"))?;
        if let Some(c) = map.get(prefix) {
            return Ok(c.clone());
        }
        let cache = Arc::new(WatchCache::new(prefix.to_string(), self.capacity, rev));
        map.insert(prefix.to_string(), cache.clone());
        tokio::spawn(feed(self.store.clone(), cache.clone(), rev));
        Ok(cache)
    }
}

/// How long a watcher following storage waits for an item before checking again whether
/// the cache can take over (an etcd without progress notifications may send nothing).
const HANDOVER_CHECK: Duration = Duration::from_secs(1);

/// The events one watcher receives after a revision, in order, each once.
///
/// They come from the cache when its ring reaches back far enough. Otherwise the watcher
/// follows a storage watch of its own only until it has caught up with the ring, then
/// hands over to the cache; a watcher too slow for the cache's channel goes back the same
/// way. So a watcher costs a storage watch only while it catches up, however small the
/// ring, and resuming from an old resourceVersion never has a gap.
pub struct WatcherEvents {
    cache: Arc<WatchCache>,
    store: Arc<dyn Store>,
    /// The storage key prefix this watcher needs (its namespace, if any).
    key_prefix: String,
    /// The resourceVersion the client asked for (410 messages name it).
    requested: Revision,
    /// Every event up to here has been handed out (or is not this watcher's).
    last: Revision,
    source: Source,
}

enum Source {
    /// Start (again) from `last`: from the cache if it can, else from storage. Also the
    /// state a cancelled restart leaves behind, so `next` is cancel-safe.
    Resume,
    Cache {
        backlog: VecDeque<Arc<CachedEvent>>,
        complete: Revision,
        rx: broadcast::Receiver<CacheUpdate>,
    },
    Storage(storage::ProgressWatchStream),
    Ended,
}

impl WatcherEvents {
    pub fn new(cache: Arc<WatchCache>, store: Arc<dyn Store>, key_prefix: String, after: Revision) -> Self {
        WatcherEvents { cache, store, key_prefix, requested: after, last: after, source: Source::Resume }
    }

    /// Every event up to this revision has been returned: what a BOOKMARK may say.
    pub fn last_revision(&self) -> Revision {
        self.last
    }

    /// Whether the next events come from the cache.
    #[cfg(test)]
    fn from_cache(&self) -> bool {
        matches!(self.source, Source::Cache { .. })
    }

    /// Switch to the cache if its ring has everything after `last`.
    fn try_cache(&mut self) -> bool {
        match self.cache.subscribe(self.last) {
            Subscription::Cache { backlog, complete, rx } => {
                self.source = Source::Cache { backlog: backlog.into(), complete, rx };
                true
            }
            Subscription::TooOld => false,
        }
    }

    fn end(&mut self, e: storage::Error) -> Option<Result<Arc<CachedEvent>, ApiError>> {
        self.source = Source::Ended;
        Some(Err(storage_watch_error(e, self.requested)))
    }

    /// The next event; `None` when the stream is over (the cache was reset after a
    /// compaction: the client re-watches and may get a 410). Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Arc<CachedEvent>, ApiError>> {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match &mut self.source {
                Source::Ended => return None,
                Source::Resume => {
                    if !self.try_cache() {
                        match self.store.watch_with_progress(&self.key_prefix, self.last).await {
                            Ok(s) => self.source = Source::Storage(s),
                            Err(e) => return self.end(e),
                        }
                    }
                }
                Source::Cache { backlog, complete, rx } => {
                    if let Some(ev) = backlog.pop_front() {
                        if ev.revision > self.last {
                            self.last = ev.revision;
                            return Some(Ok(ev));
                        }
                        continue;
                    }
                    self.last = self.last.max(*complete);
                    match rx.recv().await {
                        Ok(CacheUpdate::Event(ev)) if ev.revision > self.last => {
                            self.last = ev.revision;
                            return Some(Ok(ev));
                        }
                        Ok(CacheUpdate::Event(_)) => {}
                        Ok(CacheUpdate::Progress(rev)) => self.last = self.last.max(rev),
                        // Too slow for the channel: catch up from the ring or from storage.
                        Err(RecvError::Lagged(_)) => self.source = Source::Resume,
                        Err(RecvError::Closed) => {
                            self.source = Source::Ended;
                            return None;
                        }
                    }
                }
                Source::Storage(stream) => {
                    let item = tokio::select! {
                        // A ready item first: no timer for the catch-up's steady stream.
                        biased;
                        item = stream.next() => Some(item),
                        _ = tokio::time::sleep(HANDOVER_CHECK) => None,
                    };
                    let event = match item {
                        None => None,
                        Some(None) => {
                            self.source = Source::Ended;
                            return None;
                        }
                        Some(Some(Err(e))) => return self.end(e),
                        Some(Some(Ok(WatchItem::Progress(rev)))) => {
                            self.last = self.last.max(rev);
                            None
                        }
                        Some(Some(Ok(WatchItem::Event(sev)))) if sev.revision() > self.last => {
                            match CachedEvent::from_storage(&sev) {
                                Ok(ev) => Some(Arc::new(ev)),
                                Err(e) => {
                                    self.source = Source::Ended;
                                    return Some(Err(e));
                                }
                            }
                        }
                        Some(Some(Ok(WatchItem::Event(_)))) => None,
                    };
                    if let Some(ev) = &event {
                        self.last = ev.revision;
                    }
                    // Caught up with the ring? Then the cache takes over.
                    self.try_cache();
                    if let Some(ev) = event {
                        return Some(Ok(ev));
                    }
                }
            }
        }
    }
}

/// The error event for a failed storage watch; a compaction is reported with the
/// resourceVersion the client asked for, as Kubernetes does.
pub fn storage_watch_error(e: storage::Error, requested: Revision) -> ApiError {
    match e {
        storage::Error::Compacted { compacted, .. } => {
            ApiError::gone(format!("too old resource version: {requested} ({})", compacted + 1))
        }
        other => other.into(),
    }
}

/// The single storage watch behind a cache. Re-watches from the last revision on errors;
/// resets the cache if that revision was compacted.
async fn feed(store: Arc<dyn Store>, cache: Arc<WatchCache>, mut from: Revision) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match store.watch_with_progress(&cache.prefix, from).await {
            Ok(mut stream) => {
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(WatchItem::Progress(rev)) => {
                            backoff = Duration::from_millis(100);
                            from = from.max(rev);
                            cache.progress(rev);
                        }
                        Ok(WatchItem::Event(ev)) => {
                            backoff = Duration::from_millis(100);
                            from = from.max(ev.revision());
                            match CachedEvent::from_storage(&ev) {
                                Ok(ce) => cache.push(ev, ce),
                                Err(e) => tracing::error!(key = ev.kv.key, error = %e, "undecodable object in watch"),
                            }
                        }
                        Err(storage::Error::Compacted { .. }) => {
                            from = reset_to_current(&*store, &cache).await;
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(prefix = cache.prefix, error = %e, "storage watch failed; re-watching");
                            break;
                        }
                    }
                }
            }
            Err(storage::Error::Compacted { .. }) => {
                from = reset_to_current(&*store, &cache).await;
            }
            Err(e) => {
                tracing::warn!(prefix = cache.prefix, error = %e, "cannot start storage watch; retrying");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn reset_to_current(store: &dyn Store, cache: &WatchCache) -> Revision {
    loop {
        match store.current_revision().await {
            Ok(rev) => {
                tracing::warn!(prefix = cache.prefix, rev, "watch cache fell behind compaction; resetting");
                cache.reset(rev);
                return rev;
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// What a watcher wants to see.
pub struct Filter {
    /// Key prefix (namespace restriction included).
    pub key_prefix: String,
    pub matches: Box<dyn Fn(&Value) -> bool + Send + Sync>,
}

/// The watch event type a cached event means for a filtered watcher, if any:
/// entering the selection is ADDED, leaving it is DELETED.
pub fn event_type(ev: &CachedEvent, filter: &Filter) -> Option<&'static str> {
    if !ev.key.starts_with(&filter.key_prefix) {
        return None;
    }
    if ev.deleted {
        return (filter.matches)(&ev.object).then_some("DELETED");
    }
    let now = (filter.matches)(&ev.object);
    let before = ev.prev.as_ref().map(|p| (filter.matches)(p));
    match (before, now) {
        (None, true) => Some(if ev.prev.is_none() { "ADDED" } else { "MODIFIED" }),
        (Some(true), true) => Some("MODIFIED"),
        (Some(false), true) => Some("ADDED"),
        (Some(true), false) => Some("DELETED"),
        _ => None,
    }
}

/// One line of a watch stream.
pub fn event_line(kind: &str, object_json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(object_json.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object_json);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

pub fn bookmark_line(api_version: &str, kind: &str, rv: Revision, initial_events_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
    event_line("BOOKMARK", &serde_json::to_vec(&obj).unwrap_or_default())
}

pub fn error_line(err: &ApiError) -> Bytes {
    event_line("ERROR", &serde_json::to_vec(&err.to_status()).unwrap_or_default())
}

/// Watch tuning.
#[derive(Clone, Copy, Debug)]
pub struct WatchTiming {
    pub bookmark_interval: Duration,
}

impl Default for WatchTiming {
    fn default() -> Self {
        WatchTiming { bookmark_interval: Duration::from_secs(60) }
    }
}

/// A watch request's own options, checked as Kubernetes checks them: `sendInitialEvents`
/// needs `resourceVersionMatch=NotOlderThan` and `allowWatchBookmarks=true`, and
/// `resourceVersionMatch` is refused without it. Without `timeoutSeconds` a watch lasts a
/// random 30 to 60 minutes, so clients do not reconnect all at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchParams {
    pub bookmarks: bool,
    pub send_initial: Option<bool>,
    pub timeout: Duration,
}

impl WatchParams {
    pub fn parse(query: &HashMap<String, String>, resource_version_match: Option<&str>) -> Result<Self, ApiError> {
        let bookmarks = q_bool(query, "allowWatchBookmarks")?.unwrap_or(false);
        let send_initial = q_bool(query, "sendInitialEvents")?;
        let invalid = |f: FieldError| ApiError::invalid("meta.k8s.io", "ListOptions", "", vec![f]);
        match (send_initial, resource_version_match) {
            (Some(_), Some("NotOlderThan")) | (None, None) => {}
            (Some(_), _) => {
                return Err(invalid(FieldError::forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                )))
            }
            (None, Some(_)) => {
                return Err(invalid(FieldError::forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                )))
            }
        }
        if send_initial == Some(true) && !bookmarks {
            return Err(invalid(FieldError::required(
                "allowWatchBookmarks",
                "sendInitialEvents requires setting allowWatchBookmarks to true",
            )));
        }
        let timeout = match q_i64(query, "timeoutSeconds")? {
            Some(t) if t > 0 => Duration::from_secs(t as u64),
            _ => Duration::from_secs(1800 + rand::random::<u64>() % 1800),
        };
        Ok(WatchParams { bookmarks, send_initial, timeout })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(q: &[(&str, &str)], rvm: Option<&str>) -> Result<WatchParams, String> {
        let q: HashMap<String, String> = q.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        WatchParams::parse(&q, rvm).map_err(|e| e.message)
    }

    #[test]
    fn watch_params_are_checked_as_kubernetes_checks_them() {
        let p = params(&[("timeoutSeconds", "5"), ("allowWatchBookmarks", "true")], None).unwrap();
        assert_eq!((p.bookmarks, p.send_initial, p.timeout), (true, None, Duration::from_secs(5)));
        let p = params(&[], None).unwrap();
        assert!(p.timeout >= Duration::from_secs(1800) && p.timeout < Duration::from_secs(3600), "{p:?}");
        let p = params(&[("sendInitialEvents", "true"), ("allowWatchBookmarks", "true")], Some("NotOlderThan"));
        assert_eq!(p.unwrap().send_initial, Some(true));
        let e = params(&[("sendInitialEvents", "true")], Some("NotOlderThan")).unwrap_err();
        assert!(e.contains("sendInitialEvents requires setting allowWatchBookmarks to true"), "{e}");
        let e = params(&[("sendInitialEvents", "false")], Some("Exact")).unwrap_err();
        assert!(e.contains("requires setting resourceVersionMatch to NotOlderThan"), "{e}");
        let e = params(&[], Some("NotOlderThan")).unwrap_err();
        assert!(e.contains("resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"), "{e}");
        let e = params(&[("allowWatchBookmarks", "yes")], None).unwrap_err();
        assert!(e.contains("invalid value for allowWatchBookmarks"), "{e}");
    }

    fn ev(rev: Revision, obj: Value, prev: Option<Value>, deleted: bool) -> CachedEvent {
        CachedEvent {
            revision: rev,
            key: "/registry/pods/default/x".into(),
            deleted,
            object_json: Bytes::from(obj.to_string()),
            object: obj,
            prev,
        }
    }

    fn filter_app_web() -> Filter {
        Filter {
            key_prefix: "/registry/pods/default/".into(),
            matches: Box::new(|o: &Value| o.pointer("/metadata/labels/app") == Some(&json!("web"))),
        }
    }

    #[test]
    fn selector_transitions() {
        let web = json!({"metadata": {"labels": {"app": "web"}}});
        let db = json!({"metadata": {"labels": {"app": "db"}}});
        let f = filter_app_web();
        assert_eq!(event_type(&ev(1, web.clone(), None, false), &f), Some("ADDED"));
        assert_eq!(event_type(&ev(2, web.clone(), Some(web.clone()), false), &f), Some("MODIFIED"));
        assert_eq!(event_type(&ev(3, db.clone(), Some(web.clone()), false), &f), Some("DELETED"));
        assert_eq!(event_type(&ev(4, web.clone(), Some(db.clone()), false), &f), Some("ADDED"));
        assert_eq!(event_type(&ev(5, db.clone(), Some(db.clone()), false), &f), None);
        assert_eq!(event_type(&ev(6, web.clone(), Some(web.clone()), true), &f), Some("DELETED"));
        let other_ns = Filter { key_prefix: "/registry/pods/other/".into(), matches: Box::new(|_| true) };
        assert_eq!(event_type(&ev(7, web, None, false), &other_ns), None);
    }

    /// A stored create at `rev` and its decoded form.
    fn stored(rev: Revision) -> (storage::Event, CachedEvent) {
        let kv = storage::KeyValue {
            key: "/registry/pods/default/x".into(),
            value: Bytes::from(format!(r#"{{"metadata":{{"name":"x","uid":"{rev}"}}}}"#)),
            create_revision: rev,
            mod_revision: rev,
        };
        let raw = storage::Event { kind: EventKind::Put, kv, prev: None };
        let ce = CachedEvent::from_storage(&raw).unwrap();
        (raw, ce)
    }

    #[test]
    fn ring_and_subscribe() {
        let c = WatchCache::new("/registry/pods/".into(), 3, 10);
        // Events far enough apart that the ring keeps its smallest size.
        let start = Instant::now();
        for r in 11..=15 {
            let (raw, ce) = stored(r);
            c.push_at(raw, ce, start + EVENT_FRESH * 2 * r as u32);
        }
        assert_eq!(c.capacity(), 3);
        // Ring holds 13, 14, 15: complete after 12.
        assert!(matches!(c.subscribe(11), Subscription::TooOld));
        match c.subscribe(12) {
            Subscription::Cache { backlog, .. } => {
                assert_eq!(backlog.iter().map(|e| e.revision).collect::<Vec<_>>(), vec![13, 14, 15]);
                // Backlog events are decoded again from the stored bytes, same as live ones.
                let (_, live) = stored(14);
                assert_eq!(backlog[1].object, live.object);
                assert_eq!(backlog[1].object_json, live.object_json);
                assert_eq!(backlog[1].object["metadata"]["resourceVersion"], "14");
            }
            Subscription::TooOld => panic!("12 is servable"),
        }
        match c.subscribe(15) {
            Subscription::Cache { backlog, mut rx, .. } => {
                assert!(backlog.is_empty());
                let (raw, ce) = stored(16);
                c.push_at(raw, ce, start + EVENT_FRESH * 2 * 16);
                assert!(matches!(rx.try_recv(), Ok(CacheUpdate::Event(e)) if e.revision == 16));
            }
            Subscription::TooOld => panic!(),
        }
        assert_eq!(c.last_revision(), 16);
    }

    #[test]
    fn the_ring_follows_the_write_rate_as_kubernetes_sizes_it() {
        let (fresh, stale) = (Duration::from_secs(10), EVENT_FRESH + Duration::from_secs(1));
        let bounds = (100, MAX_CACHE_SIZE);
        // Full, oldest event fresh: double, up to the bound.
        assert_eq!(resized(100, bounds, fresh, fresh), 200);
        assert_eq!(resized(MAX_CACHE_SIZE, bounds, fresh, fresh), MAX_CACHE_SIZE);
        // Even the newest quarter is stale: halve, down to the bound.
        assert_eq!(resized(800, bounds, stale, stale), 400);
        assert_eq!(resized(100, bounds, stale, stale), 100);
        // Oldest stale, newest quarter fresh: stay.
        assert_eq!(resized(800, bounds, stale, fresh), 800);

        // 1,000 events within a minute: a watcher a thousand events behind resumes from the
        // ring (with 100 fixed it had to catch up from storage).
        let c = WatchCache::new("/registry/pods/".into(), 100, 10);
        let start = Instant::now();
        for r in 11..=1010u32 {
            let (raw, ce) = stored(r as i64);
            c.push_at(raw, ce, start + Duration::from_millis(50) * r);
        }
        assert_eq!(c.capacity(), 1600);
        assert!(matches!(c.subscribe(10), Subscription::Cache { ref backlog, .. } if backlog.len() == 1000));
        // Then one event every two minutes: once the ring is full again (600 more), its
        // newest quarter is stale and it halves at each event until it is back at its
        // smallest size, keeping the newest events.
        for (i, r) in (1011..=1614u32).enumerate() {
            let (raw, ce) = stored(r as i64);
            c.push_at(raw, ce, start + Duration::from_secs(60) + Duration::from_secs(120) * (i as u32 + 1));
            if r == 1610 {
                assert_eq!(c.capacity(), 1600, "not full yet: no resize");
            }
        }
        assert_eq!(c.capacity(), 100);
        assert!(matches!(c.subscribe(10), Subscription::TooOld));
        assert!(matches!(c.subscribe(1514), Subscription::Cache { ref backlog, .. } if backlog.len() == 100));
    }

    #[test]
    fn progress_raises_last_revision_in_order_with_events() {
        let c = WatchCache::new("/registry/pods/".into(), 3, 10);
        let mut rx = match c.subscribe(10) {
            Subscription::Cache { complete, rx, .. } => {
                assert_eq!(complete, 10);
                rx
            }
            Subscription::TooOld => panic!("10 is servable"),
        };
        let (raw, ce) = stored(11);
        c.push(raw, ce);
        c.progress(50);
        c.progress(40); // older than what the cache knows: nothing to say
        let (raw, ce) = stored(51);
        c.push(raw, ce);
        c.progress(60);
        let got: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|u| match u {
                CacheUpdate::Event(e) => format!("event {}", e.revision),
                CacheUpdate::Progress(r) => format!("progress {r}"),
            })
            .collect();
        assert_eq!(got, ["event 11", "progress 50", "event 51", "progress 60"]);
        assert_eq!(c.last_revision(), 60);

        // A watcher resuming from a progress revision is served from the cache: it gets the
        // events after it and knows it is complete up to the newest progress.
        match c.subscribe(50) {
            Subscription::Cache { backlog, complete, .. } => {
                assert_eq!(backlog.iter().map(|e| e.revision).collect::<Vec<_>>(), vec![51]);
                assert_eq!(complete, 60);
            }
            Subscription::TooOld => panic!("50 is a progress revision the cache covers"),
        }
        match c.subscribe(60) {
            Subscription::Cache { backlog, complete, .. } => {
                assert!(backlog.is_empty());
                assert_eq!(complete, 60);
            }
            Subscription::TooOld => panic!("60 is servable"),
        }
        // After the ring moved past it (events slow enough that it keeps 3), an old
        // revision is not.
        let start = Instant::now();
        for r in 61..=64 {
            let (raw, ce) = stored(r);
            c.push_at(raw, ce, start + EVENT_FRESH * 2 * r as u32);
        }
        assert!(matches!(c.subscribe(50), Subscription::TooOld));
    }

    /// A store whose watch with progress replays a script: `feed` turns it into the cache.
    struct Scripted(Vec<WatchItem>);

    #[async_trait::async_trait]
    impl Store for Scripted {
        async fn current_revision(&self) -> storage::Result<Revision> {
            Ok(10)
        }
        async fn range(&self, _: storage::Range) -> storage::Result<storage::RangeResult> {
            Err(storage::Error::Internal("unused".into()))
        }
        async fn txn(&self, _: storage::Txn) -> storage::Result<storage::TxnOutcome> {
            Err(storage::Error::Internal("unused".into()))
        }
        async fn watch(&self, _: &str, _: Revision) -> storage::Result<storage::WatchStream> {
            Err(storage::Error::Internal("the cache must watch with progress".into()))
        }
        async fn watch_with_progress(&self, _: &str, _: Revision) -> storage::Result<storage::ProgressWatchStream> {
            let items: Vec<storage::Result<WatchItem>> = self.0.iter().cloned().map(Ok).collect();
            // Then stay open, as a live watch does.
            Ok(futures::stream::iter(items).chain(futures::stream::pending()).boxed())
        }
        async fn compact(&self, _: Revision) -> storage::Result<()> {
            Ok(())
        }
        async fn compacted_revision(&self) -> storage::Result<Revision> {
            Ok(0)
        }
    }

    #[tokio::test]
    async fn feed_passes_storage_progress_on() {
        let (raw, _) = stored(12);
        let store = Arc::new(Scripted(vec![WatchItem::Progress(11), WatchItem::Event(raw), WatchItem::Progress(30)]));
        let caches = WatchCaches::new(store, 100);
        let cache = caches.get("/registry/pods/").await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while cache.last_revision() < 30 {
            assert!(tokio::time::Instant::now() < deadline, "the feed never reached the progress at 30");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        match cache.subscribe(10) {
            Subscription::Cache { backlog, complete, .. } => {
                assert_eq!(backlog.iter().map(|e| e.revision).collect::<Vec<_>>(), vec![12]);
                assert_eq!(complete, 30);
            }
            Subscription::TooOld => panic!("the cache started at 10"),
        }
    }

    /// An embedded store in a temp dir, with pods written at revisions 2..=n+1.
    async fn store_with_pods(dir: &tempfile::TempDir, n: usize) -> Arc<dyn Store> {
        let store: Arc<dyn Store> = Arc::new(storage::embedded::SqliteStore::open(dir.path().join("db")).unwrap());
        for i in 0..n {
            write_pod(&*store, i).await;
        }
        store
    }

    async fn write_pod(store: &dyn Store, i: usize) -> Revision {
        let value = format!(r#"{{"metadata":{{"name":"p{i}","namespace":"default"}}}}"#);
        store.create(&format!("/registry/pods/default/p{i}"), Bytes::from(value)).await.unwrap()
    }

    async fn next_revision(w: &mut WatcherEvents) -> Revision {
        match tokio::time::timeout(Duration::from_secs(10), w.next()).await {
            Ok(Some(Ok(ev))) => ev.revision,
            other => panic!("expected an event, got {:?}", other.map(|o| o.map(|r| r.map(|e| e.revision)))),
        }
    }

    /// Waits until the cache has seen `rev`.
    async fn cache_reaches(cache: &WatchCache, rev: Revision) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while cache.last_revision() < rev {
            assert!(tokio::time::Instant::now() < deadline, "the cache never reached {rev}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_watcher_older_than_the_ring_catches_up_from_storage_then_uses_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_pods(&dir, 5).await; // revisions 2..=6
        let caches = WatchCaches::new(store.clone(), 3);
        let cache = caches.get("/registry/pods/").await.unwrap();
        let mut last = 0;
        for i in 5..15 {
            last = write_pod(&*store, i).await; // 7..=16; the ring keeps 14..=16
        }
        cache_reaches(&cache, last).await;

        let mut w = WatcherEvents::new(cache.clone(), store.clone(), "/registry/pods/".into(), 3);
        let mut got = Vec::new();
        for _ in 0..13 {
            got.push(next_revision(&mut w).await);
        }
        assert_eq!(got, (4..=16).collect::<Vec<_>>(), "every event after 3, once, in order");
        assert!(w.from_cache(), "caught up: the storage watch handed over to the cache");
        let r = write_pod(&*store, 99).await;
        assert_eq!(next_revision(&mut w).await, r);
        assert_eq!(w.last_revision(), r);
    }

    #[tokio::test]
    async fn a_watcher_too_slow_for_the_channel_catches_up_without_a_gap() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_pods(&dir, 1).await; // revision 2
        let caches = WatchCaches::new(store.clone(), 3);
        let cache = caches.get("/registry/pods/").await.unwrap();
        let mut w = WatcherEvents::new(cache.clone(), store.clone(), "/registry/pods/".into(), 2);
        let first = write_pod(&*store, 1).await;
        assert_eq!(next_revision(&mut w).await, first);
        assert!(w.from_cache());
        // More than the channel holds while the watcher does not read.
        let mut last = first;
        for i in 2..(CHANNEL_CAPACITY + 50) {
            last = write_pod(&*store, i).await;
        }
        cache_reaches(&cache, last).await;
        for want in first + 1..=last {
            assert_eq!(next_revision(&mut w).await, want);
        }
        assert!(w.from_cache(), "back on the cache once caught up");
    }

    #[tokio::test]
    async fn a_compacted_revision_is_a_410_naming_the_requested_version() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_pods(&dir, 10).await; // revisions 2..=11
        store.compact(8).await.unwrap();
        let caches = WatchCaches::new(store.clone(), 3);
        let cache = caches.get("/registry/pods/").await.unwrap();
        let mut w = WatcherEvents::new(cache, store, "/registry/pods/".into(), 4);
        match w.next().await {
            Some(Err(e)) => {
                assert_eq!(e.code, 410);
                assert!(e.message.contains("too old resource version: 4"), "{}", e.message);
            }
            other => panic!("expected a 410, got {:?}", other.map(|o| o.map(|e| e.revision))),
        }
        assert!(w.next().await.is_none(), "the stream is over after the error");
    }

    #[test]
    fn lines() {
        let l = bookmark_line("v1", "Pod", 7, true);
        let v: Value = serde_json::from_slice(&l).unwrap();
        assert_eq!(v["type"], "BOOKMARK");
        assert_eq!(v["object"]["metadata"]["resourceVersion"], "7");
        assert_eq!(v["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
        let e = error_line(&ApiError::gone("too old resource version: 1 (5)"));
        let v: Value = serde_json::from_slice(&e).unwrap();
        assert_eq!(v["object"]["code"], 410);
        assert_eq!(v["object"]["reason"], "Expired");
    }
}
