//! Storage with etcd v3 semantics, used by the apiserver and nothing else.
//!
//! Two backends implement [`Store`]:
//! - [`embedded::SqliteStore`]: one SQLite file in WAL mode (the default; nothing to install),
//! - [`etcd::EtcdStore`]: a real etcd cluster through `etcd-client`.
//!
//! The model is etcd's:
//! - one global revision that every successful write increases;
//! - every key carries `create_revision` and `mod_revision`; writes are guarded by
//!   compare-and-swap on `mod_revision` (0 means "the key does not exist");
//! - reads can be served at a past revision until it is compacted;
//! - watches deliver every change after a revision, in order, with the previous value;
//!   a watch with progress ([`Store::watch_with_progress`]) also says, now and then, up to
//!   which revision it has delivered everything (etcd's progress notifications), so a
//!   watcher of a quiet prefix still learns how far the store has moved;
//! - compaction at revision `r` drops the history that reads at `r` and later no longer
//!   need; reading at a revision below `r`, or watching for changes after one, fails with
//!   [`Error::Compacted`]. `r` itself stays readable, as in etcd.
//!
//! Values are opaque bytes; keys are UTF-8 strings such as `/registry/pods/default/nginx`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

mod coalesce;
pub mod compactor;
pub mod embedded;
pub mod etcd;
mod etcd_channel;
/// A real etcd started in a temporary directory, for tests and benchmarks.
#[cfg(feature = "test-support")]
pub mod etcd_test_server;
/// The conformance checks every backend runs (`conformance_tests!`).
#[cfg(feature = "test-support")]
pub mod testsuite;

pub use compactor::spawn_compactor;

/// A storage revision. Strictly increasing; the apiserver exposes it as `resourceVersion`.
pub type Revision = i64;

/// One stored key with its revisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    /// Revision of the write that created this incarnation of the key.
    pub create_revision: Revision,
    /// Revision of the last write to the key.
    pub mod_revision: Revision,
}

/// Result of a range read.
#[derive(Clone, Debug, Default)]
pub struct RangeResult {
    /// Matching keys in key order.
    pub kvs: Vec<KeyValue>,
    /// The revision the read was served at.
    pub revision: Revision,
    /// True when `limit` cut the result short.
    pub more: bool,
}

/// What a range read asks for: keys under `prefix`, starting at `start` (inclusive, must
/// itself be under the prefix), at `revision` (0 = latest), at most `limit` keys (0 = all).
#[derive(Clone, Debug, Default)]
pub struct Range {
    pub prefix: String,
    pub start: Option<String>,
    pub revision: Revision,
    pub limit: usize,
}

impl Range {
    pub fn prefix(prefix: impl Into<String>) -> Self {
        Range { prefix: prefix.into(), ..Default::default() }
    }
    pub fn start(mut self, key: impl Into<String>) -> Self {
        self.start = Some(key.into());
        self
    }
    pub fn at(mut self, revision: Revision) -> Self {
        self.revision = revision;
        self
    }
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

/// One write inside a transaction.
#[derive(Clone, Debug)]
pub enum Op {
    Put { key: String, value: Bytes },
    Delete { key: String },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Put { key, .. } | Op::Delete { key } => key,
        }
    }
}

/// A guarded multi-key write: when every `compares` entry holds (the key's current
/// `mod_revision` equals the given one; 0 = the key is absent), all `ops` are applied
/// atomically. Otherwise nothing is written.
#[derive(Clone, Debug, Default)]
pub struct Txn {
    pub compares: Vec<(String, Revision)>,
    pub ops: Vec<Op>,
}

/// What a transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOutcome {
    /// All ops were applied; `revision` is the store revision after the last of them and
    /// `prev` holds, per op, the value the key had before (None if absent).
    Committed { revision: Revision, prev: Vec<Option<KeyValue>> },
    /// A compare failed; nothing was written. `current` holds, per compare, the key's
    /// current value (None if absent).
    Failed { revision: Revision, current: Vec<Option<KeyValue>> },
}

/// The kind of change a watch event reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// The key after the change. For deletes `value` is empty, `mod_revision` is the
    /// revision of the delete and `create_revision` that of the deleted incarnation.
    pub kv: KeyValue,
    /// The value before the change (always present for deletes unless compacted away;
    /// None for a create).
    pub prev: Option<KeyValue>,
}

impl Event {
    pub fn revision(&self) -> Revision {
        self.kv.mod_revision
    }
}

pub type WatchStream = Pin<Box<dyn Stream<Item = Result<Event>> + Send>>;

/// One item of a [`ProgressWatchStream`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchItem {
    Event(Event),
    /// Every event under the watched prefix with a revision at or below this one has been
    /// delivered: the watcher may resume from here. Strictly greater than the revision of
    /// every item before it; the next event, if any, is newer.
    Progress(Revision),
}

pub type ProgressWatchStream = Pin<Box<dyn Stream<Item = Result<WatchItem>> + Send>>;

/// Errors every backend maps its failures onto.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("required revision {requested} has been compacted (oldest available revision is {compacted})")]
    Compacted { requested: Revision, compacted: Revision },
    #[error("required revision {requested} is a future revision (current revision is {current})")]
    FutureRevision { requested: Revision, current: Revision },
    #[error("key {key:?} already exists")]
    AlreadyExists { key: String },
    #[error("key {key:?} not found")]
    NotFound { key: String },
    /// A compare-and-swap failed: the key's mod revision is not the expected one.
    #[error("conflict on key {key:?}: expected mod revision {expected}, found {}", current.as_ref().map_or(0, |kv| kv.mod_revision))]
    Conflict { key: String, expected: Revision, current: Option<KeyValue> },
    /// The backend cannot be reached (etcd down, disk gone). Retrying later may succeed;
    /// nothing was written, or the write's outcome is reported as unknown in the message.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    #[error("invalid storage request: {0}")]
    InvalidRequest(String),
    #[error("storage error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// etcd v3 semantics. See the crate documentation.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The current store revision.
    async fn current_revision(&self) -> Result<Revision>;

    /// Range read. An `Range::revision` older than the compacted revision fails with
    /// [`Error::Compacted`], a future one with [`Error::FutureRevision`].
    async fn range(&self, range: Range) -> Result<RangeResult>;

    /// Apply a guarded transaction. See [`Txn`].
    async fn txn(&self, txn: Txn) -> Result<TxnOutcome>;

    /// Watch every change to keys under `prefix` with a revision greater than
    /// `after_revision`, in revision order, none lost or duplicated. If `after_revision`
    /// is below the compacted revision, either this call or the stream's first item is
    /// [`Error::Compacted`] (etcd also serves `compacted - 1`; do not rely on it). If the stream ends or yields an error, the watcher should
    /// re-watch from the last revision it saw.
    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream>;

    /// [`Store::watch`] with progress notifications between the events: while the prefix is
    /// quiet and the store moves on, the stream yields [`WatchItem::Progress`] with a newer
    /// revision now and then (each backend documents how often), and eventually one at
    /// least as new as the last write. The default implementation yields no progress.
    async fn watch_with_progress(&self, prefix: &str, after_revision: Revision) -> Result<ProgressWatchStream> {
        use futures::StreamExt;
        Ok(self.watch(prefix, after_revision).await?.map(|item| item.map(WatchItem::Event)).boxed())
    }

    /// Drop the history older than `revision`: afterwards reads at `revision` and later
    /// work, reads below it fail with [`Error::Compacted`]. Every key's value as of
    /// `revision` is kept. Compacting to an older revision than before is a no-op.
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// The oldest revision reads can still be served at (0 if never compacted).
    async fn compacted_revision(&self) -> Result<Revision>;

    // ----- conveniences built on the primitives above -----

    /// Read one key at the latest revision.
    async fn get(&self, key: &str) -> Result<(Revision, Option<KeyValue>)> {
        let r = self.range(Range { prefix: key.to_string(), limit: 1, ..Default::default() }).await?;
        let kv = r.kvs.into_iter().find(|kv| kv.key == key);
        Ok((r.revision, kv))
    }

    /// Create `key` if it does not exist. Returns the new revision.
    async fn create(&self, key: &str, value: Bytes) -> Result<Revision> {
        let txn = Txn { compares: vec![(key.to_string(), 0)], ops: vec![Op::Put { key: key.to_string(), value }] };
        match self.txn(txn).await? {
            TxnOutcome::Committed { revision, .. } => Ok(revision),
            TxnOutcome::Failed { .. } => Err(Error::AlreadyExists { key: key.to_string() }),
        }
    }

    /// Replace `key` if its mod revision is `expected`. Returns the new revision.
    async fn update(&self, key: &str, value: Bytes, expected: Revision) -> Result<Revision> {
        let txn =
            Txn { compares: vec![(key.to_string(), expected)], ops: vec![Op::Put { key: key.to_string(), value }] };
        match self.txn(txn).await? {
            TxnOutcome::Committed { revision, .. } => Ok(revision),
            TxnOutcome::Failed { mut current, .. } => {
                let current = current.pop().flatten();
                Err(Error::Conflict { key: key.to_string(), expected, current })
            }
        }
    }

    /// Delete `key`, if `expected` is given only when its mod revision matches. Returns the
    /// revision of the delete and the deleted value.
    async fn delete(&self, key: &str, expected: Option<Revision>) -> Result<(Revision, KeyValue)> {
        let expected = match expected {
            Some(rev) => rev,
            None => match self.get(key).await?.1 {
                Some(kv) => kv.mod_revision,
                None => return Err(Error::NotFound { key: key.to_string() }),
            },
        };
        let txn = Txn { compares: vec![(key.to_string(), expected)], ops: vec![Op::Delete { key: key.to_string() }] };
        match self.txn(txn).await? {
            TxnOutcome::Committed { revision, mut prev } => match prev.pop().flatten() {
                Some(kv) => Ok((revision, kv)),
                None => Err(Error::NotFound { key: key.to_string() }),
            },
            TxnOutcome::Failed { mut current, .. } => match current.pop().flatten() {
                None => Err(Error::NotFound { key: key.to_string() }),
                Some(kv) => Err(Error::Conflict { key: key.to_string(), expected, current: Some(kv) }),
            },
        }
    }
}

/// Which backend to open, from the apiserver's flags.
#[derive(Clone, Debug)]
pub enum Backend {
    /// SQLite file at this path.
    Embedded { path: std::path::PathBuf },
    /// etcd endpoints such as `http://127.0.0.1:2379` (`https://` with `tls`).
    Etcd { endpoints: Vec<String>, tls: Option<etcd::EtcdTls> },
}

/// Open a backend.
pub async fn open(backend: &Backend) -> Result<Arc<dyn Store>> {
    Ok(match backend {
        Backend::Embedded { path } => Arc::new(embedded::SqliteStore::open(path)?),
        Backend::Etcd { endpoints, tls } => Arc::new(
            etcd::EtcdStore::connect_with(endpoints, etcd::EtcdOptions { tls: tls.clone(), ..Default::default() })
                .await?,
        ),
    })
}

/// The retention window Kubernetes keeps: history older than this is compacted.
pub const DEFAULT_COMPACTION_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// The end of a prefix range: the smallest string greater than every key with `prefix`.
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // the whole key space (etcd's convention for "no end")
}
