//! The embedded backend: one SQLite file in WAL mode, the way k3s' kine stores Kubernetes.
//!
//! Every write appends a row to the `kv` table; the row id *is* the revision, so the table
//! is both the current state (the newest row of each key) and the history that watches
//! replay. A delete appends a tombstone row. Compaction removes rows that a newer row at
//! or before the compaction revision supersedes, so the value a key had at any revision
//! after the compaction — including the previous value of every later event — survives.
//!
//! Writes are group-committed: a writer queues its request and, if nobody holds the write
//! connection, takes it and commits everything queued in one transaction, on its own
//! thread (no hop to a writer thread when uncontended). Whoever releases the connection
//! checks the queue again, so no request is left behind. A request is acknowledged only
//! after its transaction committed. With WAL and
//! `synchronous=NORMAL` a committed transaction survives the process being killed
//! (`kill -9`); `synchronous=FULL` ([`Options::fsync`]) also survives power loss.
//!
//! After each commit the writer publishes the batch's events on a broadcast channel.
//! A watch subscribes first, then replays history rows from the database, then follows
//! the channel, skipping what it already replayed: commit happens before publish, so an
//! event is always in one or the other. A watcher that falls behind the channel goes
//! back to the database.
//!
//! Progress ([`Store::watch_with_progress`]): batches are published in commit order, so once
//! a watcher has handled a batch it has delivered every event of its prefix up to that
//! batch's revision — a batch without events for the prefix becomes a progress item. So
//! does the revision of a replay's snapshot once the replay has caught up. Progress is sent
//! at most once per [`PROGRESS_INTERVAL`] per watch; a newer revision held back meanwhile is
//! sent when the interval is over (unless an event made it moot), so the last write is
//! always reported.
//!
//! Invariants:
//! - `kv.id` (the revision) is assigned by the write-connection holder as `current + 1`; the newest row is
//!   never compacted, so `MAX(id)` is the current revision after a restart (1 when empty,
//!   as in etcd).
//! - `meta.compact_rev` is raised in the same transaction as the first rows it removes,
//!   so a read at an older revision fails instead of seeing partial history.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::{broadcast, oneshot};

use futures::StreamExt;

use crate::{
    prefix_end, Error, Event, EventKind, KeyValue, Op, ProgressWatchStream, Range, RangeResult, Result, Revision,
    Store, Txn, TxnOutcome, WatchItem, WatchStream,
};

/// History rows a watch replays per database read.
const REPLAY_CHUNK: i64 = 1000;
/// Revisions removed per compaction transaction, so writes are not stalled for long.
const COMPACT_CHUNK: i64 = 10_000;
/// Committed batches kept for watchers that are momentarily slow.
const BROADCAST_CAPACITY: usize = 4096;
/// Idle read connections kept open.
const READ_POOL: usize = 8;
/// At most one progress item per watch this often.
pub const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS kv (
    id            INTEGER PRIMARY KEY,  -- the revision of this write
    name          BLOB    NOT NULL,     -- the key
    created       INTEGER NOT NULL,     -- create_revision of this incarnation of the key
    deleted       INTEGER NOT NULL,     -- 1 for a tombstone
    prev_revision INTEGER NOT NULL,     -- id of the row this one supersedes, 0 if none
    value         BLOB    NOT NULL
);
CREATE INDEX IF NOT EXISTS kv_name_id ON kv (name, id DESC);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
";

/// Tuning for [`SqliteStore::open_with`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `synchronous=FULL`: fsync on every commit, surviving power loss as well as a
    /// killed process. Off by default (a killed process loses nothing either way).
    pub fsync: bool,
}

/// [`Store`] over a single SQLite file.
pub struct SqliteStore {
    path: PathBuf,
    fsync: bool,
    /// Requests waiting for the write connection.
    queue: Arc<Mutex<Vec<Pending>>>,
    writer: Arc<Mutex<Writer>>,
    events: broadcast::Sender<Arc<Vec<Event>>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    revision: Arc<AtomicI64>,
}

type Pending = (Txn, oneshot::Sender<Result<TxnOutcome>>);

impl SqliteStore {
    /// Open (creating if needed) the store at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, Options::default())
    }

    pub fn open_with(path: impl AsRef<Path>, options: Options) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Unavailable(format!("cannot create data directory {}: {e}", dir.display())))?;
        }
        let conn = open_connection(&path, options.fsync)?;
        conn.execute_batch(SCHEMA).map_err(sql_err)?;
        let revision = max_revision(&conn)?;
        let revision = Arc::new(AtomicI64::new(revision));
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        let writer = Writer { conn, revision: revision.clone(), events: events.clone() };
        Ok(SqliteStore {
            path,
            fsync: options.fsync,
            queue: Arc::new(Mutex::new(Vec::new())),
            writer: Arc::new(Mutex::new(writer)),
            events,
            readers: Arc::new(Mutex::new(Vec::new())),
            revision,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Run `f` with a pooled read connection inside a read transaction. Small reads run
    /// right here (a point read costs microseconds, less than a thread hop); large ones on
    /// the blocking pool so they do not hold up the async runtime.
    async fn read<T, F>(&self, large: bool, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let source = self.source();
        if !large {
            return source.read(f);
        }
        tokio::task::spawn_blocking(move || source.read(f))
            .await
            .map_err(|e| Error::Internal(format!("read task failed: {e}")))?
    }

    fn source(&self) -> ReadSource {
        ReadSource { readers: self.readers.clone(), path: self.path.clone(), fsync: self.fsync }
    }

    /// Queue `txn` and make sure someone commits it; wait for the outcome.
    async fn write(&self, txn: Txn) -> Result<TxnOutcome> {
        let (tx, rx) = oneshot::channel();
        lock(&self.queue)?.push((txn, tx));
        if self.fsync {
            // Commits wait for the disk: keep them off the async worker threads.
            let (queue, writer) = (self.queue.clone(), self.writer.clone());
            tokio::task::spawn_blocking(move || drain(&queue, &writer))
                .await
                .map_err(|e| Error::Internal(format!("write task failed: {e}")))??;
        } else {
            drain(&self.queue, &self.writer)?;
        }
        rx.await.map_err(|_| writer_gone())?
    }

    /// A watch stream; with `progress`, progress items are interleaved (see the module docs).
    async fn start_watch(&self, prefix: &str, after_revision: Revision, progress: bool) -> Result<ProgressWatchStream> {
        let live = self.events.subscribe();
        let end = prefix_end(prefix);
        let prefix = prefix.as_bytes().to_vec();
        // Fail fast on a compacted revision; the stream re-checks on every replay.
        let compact = self.compacted_revision().await?;
        if after_revision < compact {
            return Err(Error::Compacted { requested: after_revision + 1, compacted: compact });
        }
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let store = self.source();
        let progress = progress.then(|| Progress::new(PROGRESS_INTERVAL));
        tokio::spawn(async move {
            tokio::select! {
                _ = follow(store, live, prefix, end, after_revision, progress, &tx) => {}
                _ = tx.closed() => {}
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// Commit queued requests while the write connection is free. Whoever holds the
/// connection checks the queue again after releasing it, and a request is queued before
/// its owner tries the connection, so every queued request is committed by someone.
fn drain(queue: &Mutex<Vec<Pending>>, writer: &Mutex<Writer>) -> Result<()> {
    loop {
        {
            let mut w = match writer.try_lock() {
                Ok(w) => w,
                Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
                Err(std::sync::TryLockError::Poisoned(_)) => return Err(writer_gone()),
            };
            let batch = std::mem::take(&mut *lock(queue)?);
            w.commit_batch(batch);
        }
        if lock(queue)?.is_empty() {
            return Ok(());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    m.lock().map_err(|_| writer_gone())
}

fn writer_gone() -> Error {
    Error::Unavailable("the storage writer failed earlier; restart the apiserver".into())
}

/// SQLite's page cache per connection, in KiB (SQLite's own default). The kernel's page
/// cache keeps the file's hot pages anyway; a larger cache only duplicates them in the
/// apiserver's resident set, and it fills with the append-only log's pages: at 32 MB per
/// connection, 15,000 pod status updates grew the apiserver by 21 MB and one list by 18 MB
/// more, against 2 MB and 3 MB with this size.
const CACHE_KIB: u32 = 2000;

fn open_connection(path: &Path, fsync: bool) -> Result<Connection> {
    let conn =
        Connection::open(path).map_err(|e| Error::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    let sync = if fsync { "FULL" } else { "NORMAL" };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA busy_timeout = 10000; \
         PRAGMA cache_size = -{CACHE_KIB}; PRAGMA temp_store = MEMORY;"
    ))
    .map_err(sql_err)?;
    // Plans do not depend on bound values (no LIKE/STAT4 tricks here). Without this, the
    // bundled SQLite (built with STAT4) marks `name = ?1` statements for re-preparation on
    // every new binding, so a cached statement was compiled again on each use.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(sql_err)?;
    Ok(conn)
}

fn sql_err(e: rusqlite::Error) -> Error {
    use rusqlite::ErrorCode::*;
    match e.sqlite_error_code() {
        Some(DiskFull | SystemIoFailure | CannotOpen | ReadOnly | DatabaseBusy | DatabaseLocked | PermissionDenied) => {
            Error::Unavailable(e.to_string())
        }
        _ => Error::Internal(e.to_string()),
    }
}

fn exec_cached(conn: &Connection, sql: &str) -> Result<()> {
    conn.prepare_cached(sql).and_then(|mut s| s.execute([])).map(|_| ()).map_err(sql_err)
}

/// What a snapshot holds: its revision and how many keys live at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub revision: Revision,
    pub keys: u64,
}

/// Write a consistent copy of the store file `db` to `to` (SQLite's `VACUUM INTO`, one read
/// transaction: safe while the apiserver writes), as `etcdctl snapshot save` does for etcd.
/// `to` must not exist yet.
pub fn snapshot(db: &Path, to: &Path) -> Result<SnapshotInfo> {
    if to.exists() {
        return Err(Error::Unavailable(format!("{} exists already", to.display())));
    }
    if !db.exists() {
        return Err(Error::Unavailable(format!("no store at {}", db.display())));
    }
    let conn = open_connection(db, false)?;
    conn.execute("VACUUM INTO ?1", [to.to_string_lossy()]).map_err(sql_err)?;
    snapshot_info(to)
}

/// The revision and live keys of a store file (a snapshot, or a stopped apiserver's store).
pub fn snapshot_info(file: &Path) -> Result<SnapshotInfo> {
    let conn = Connection::open_with_flags(file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| Error::Unavailable(format!("cannot open {}: {e}", file.display())))?;
    let revision = max_revision(&conn)?;
    // A key lives when its newest row is not a tombstone.
    let keys: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM kv AS k WHERE k.deleted = 0 AND k.id = (SELECT MAX(id) FROM kv WHERE name = k.name)",
            [],
            |r| r.get(0),
        )
        .map_err(sql_err)?;
    Ok(SnapshotInfo { revision, keys: u64::try_from(keys).unwrap_or(0) })
}

fn max_revision(conn: &Connection) -> Result<Revision> {
    let max: Option<i64> = conn
        .prepare_cached("SELECT MAX(id) FROM kv")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(sql_err)?;
    Ok(max.unwrap_or(1).max(1))
}

fn compacted(conn: &Connection) -> Result<Revision> {
    conn.prepare_cached("SELECT v FROM meta WHERE k = 'compact_rev'")
        .and_then(|mut s| s.query_row([], |r| r.get(0)).optional())
        .map_err(sql_err)
        .map(|v| v.unwrap_or(0))
}

/// The newest row of `key`, as the key's value (None if absent or deleted).
fn latest(conn: &Connection, key: &str) -> Result<Option<KeyValue>> {
    let mut stmt = conn
        .prepare_cached("SELECT id, created, deleted, value FROM kv WHERE name = ?1 ORDER BY id DESC LIMIT 1")
        .map_err(sql_err)?;
    let row = stmt
        .query_row([key.as_bytes()], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, Vec<u8>>(3)?))
        })
        .optional()
        .map_err(sql_err)?;
    Ok(match row {
        Some((id, created, 0, value)) => {
            Some(KeyValue { key: key.to_string(), value: value.into(), create_revision: created, mod_revision: id })
        }
        _ => None,
    })
}

/// The live keys in `[from, end)` as of revision `at`, in key order, at most `want`.
///
/// Two steps: the `(name, id DESC)` index alone says which row is each key's newest at or
/// before `at` (the first of its name; the index holds both columns, so the walk touches
/// no table page), then only those rows are read, by id. Reading rows during the walk
/// would load every kept revision's value (SQLite computes all result columns of a row it
/// returns, and large values live in overflow pages), so a list would cost as much as the
/// history the compactor has not removed yet.
fn newest_rows(conn: &Connection, from: &[u8], end: &[u8], at: Revision, want: usize) -> Result<Vec<KeyValue>> {
    let mut walk = conn
        .prepare_cached("SELECT name, id FROM kv WHERE name >= ?1 AND name < ?2 AND id <= ?3 ORDER BY name, id DESC")
        .map_err(sql_err)?;
    let mut read = conn.prepare_cached("SELECT created, deleted, value FROM kv WHERE id = ?1").map_err(sql_err)?;
    let mut rows = walk.query(params![from, end, at]).map_err(sql_err)?;
    let mut out = Vec::new();
    let mut last: Option<Vec<u8>> = None;
    while let Some(row) = rows.next().map_err(sql_err)? {
        let name = row.get_ref(0).and_then(|v| Ok(v.as_blob()?)).map_err(sql_err)?;
        if last.as_deref() == Some(name) {
            continue; // an older row of a key already decided
        }
        let last = last.insert(Vec::new());
        last.extend_from_slice(name);
        let id: i64 = row.get(1).map_err(sql_err)?;
        let (created, deleted, value): (i64, i64, Vec<u8>) =
            read.query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).map_err(sql_err)?;
        if deleted == 0 {
            out.push(KeyValue {
                key: key_string(last.clone())?,
                value: value.into(),
                create_revision: created,
                mod_revision: id,
            });
            if out.len() >= want {
                break;
            }
        }
    }
    Ok(out)
}

fn check_revision(requested: Revision, current: Revision, compacted: Revision) -> Result<()> {
    if requested > current {
        return Err(Error::FutureRevision { requested, current });
    }
    if requested > 0 && requested < compacted {
        return Err(Error::Compacted { requested, compacted });
    }
    Ok(())
}

fn key_string(bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| Error::Internal(format!("stored key is not UTF-8: {e}")))
}

struct Writer {
    conn: Connection,
    revision: Arc<AtomicI64>,
    events: broadcast::Sender<Arc<Vec<Event>>>,
}

impl Writer {
    fn commit_batch(&mut self, txns: Vec<Pending>) {
        if txns.is_empty() {
            return;
        }
        let start = self.revision.load(Ordering::SeqCst);
        let mut rev = start;
        let mut events = Vec::new();
        let result = (|| -> Result<Vec<TxnOutcome>> {
            // BEGIN / COMMIT through cached statements (rusqlite's `transaction()` parses
            // them anew for every batch).
            exec_cached(&self.conn, "BEGIN IMMEDIATE")?;
            let applied = (|| -> Result<Vec<TxnOutcome>> {
                let mut outcomes = Vec::with_capacity(txns.len());
                for (txn, _) in &txns {
                    outcomes.push(apply_txn(&self.conn, txn, &mut rev, &mut events)?);
                }
                exec_cached(&self.conn, "COMMIT")?;
                Ok(outcomes)
            })();
            if applied.is_err() && !self.conn.is_autocommit() {
                let _ = exec_cached(&self.conn, "ROLLBACK");
            }
            applied
        })();
        match result {
            Ok(outcomes) => {
                self.revision.store(rev, Ordering::SeqCst);
                if !events.is_empty() {
                    // No receivers is fine: nobody is watching.
                    let _ = self.events.send(Arc::new(events));
                }
                for ((_, reply), outcome) in txns.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "storage write batch failed; nothing from it was written");
                for (_, reply) in txns {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    fn compact(&mut self, target: Revision) -> Result<()> {
        let current = self.revision.load(Ordering::SeqCst);
        let already = compacted(&self.conn)?;
        if target <= already {
            return Ok(());
        }
        if target > current {
            return Err(Error::FutureRevision { requested: target, current });
        }
        let mut lo = already;
        let mut first = true;
        while lo < target {
            let hi = (lo + COMPACT_CHUNK).min(target);
            let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(sql_err)?;
            if first {
                tx.execute(
                    "INSERT INTO meta (k, v) VALUES ('compact_rev', ?1) ON CONFLICT(k) DO UPDATE SET v = ?1",
                    [target],
                )
                .map_err(sql_err)?;
                first = false;
            }
            // A row at or before the target goes if it is a tombstone or a newer row at or
            // before the target supersedes it. The newest row overall always stays.
            tx.execute(
                "DELETE FROM kv WHERE id > ?1 AND id <= ?2 AND id < ?4 AND (deleted = 1 OR EXISTS \
                 (SELECT 1 FROM kv AS newer WHERE newer.name = kv.name AND newer.id > kv.id AND newer.id <= ?3))",
                params![lo, hi, target, current],
            )
            .map_err(sql_err)?;
            tx.commit().map_err(sql_err)?;
            lo = hi;
        }
        Ok(())
    }
}

/// Check the compares of `txn` and, if they hold, append its ops. Runs inside the batch's
/// SQLite transaction, so it sees the writes of earlier txns of the same batch.
fn apply_txn(conn: &Connection, txn: &Txn, rev: &mut Revision, events: &mut Vec<Event>) -> Result<TxnOutcome> {
    // Each key is read once; later ops of the same txn see earlier ones through `seen`.
    let mut seen: Vec<(&str, Option<KeyValue>)> = Vec::new();
    let lookup = |seen: &[(&str, Option<KeyValue>)], key: &str| -> Result<Option<KeyValue>> {
        match seen.iter().find(|(k, _)| *k == key) {
            Some((_, kv)) => Ok(kv.clone()),
            None => latest(conn, key),
        }
    };
    let mut current = Vec::with_capacity(txn.compares.len());
    let mut ok = true;
    for (key, expected) in &txn.compares {
        let kv = lookup(&seen, key)?;
        ok &= kv.as_ref().map_or(0, |kv| kv.mod_revision) == *expected;
        seen.push((key, kv.clone()));
        current.push(kv);
    }
    if !ok {
        return Ok(TxnOutcome::Failed { revision: *rev, current });
    }
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO kv (id, name, created, deleted, prev_revision, value) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .map_err(sql_err)?;
    let mut prevs = Vec::with_capacity(txn.ops.len());
    for op in &txn.ops {
        let prev = lookup(&seen, op.key())?;
        let prev_rev = prev.as_ref().map_or(0, |p| p.mod_revision);
        match op {
            Op::Put { key, value } => {
                let id = *rev + 1;
                let created = prev.as_ref().map_or(id, |p| p.create_revision);
                insert.execute(params![id, key.as_bytes(), created, 0, prev_rev, value.as_ref()]).map_err(sql_err)?;
                *rev = id;
                let kv =
                    KeyValue { key: key.clone(), value: value.clone(), create_revision: created, mod_revision: id };
                seen.retain(|(k, _)| *k != key.as_str());
                seen.push((key, Some(kv.clone())));
                events.push(Event { kind: EventKind::Put, kv, prev: prev.clone() });
            }
            Op::Delete { key } => {
                // Deleting an absent key writes nothing, as in etcd.
                if let Some(p) = &prev {
                    let id = *rev + 1;
                    insert
                        .execute(params![id, key.as_bytes(), p.create_revision, 1, prev_rev, &[] as &[u8]])
                        .map_err(sql_err)?;
                    *rev = id;
                    let kv = KeyValue {
                        key: key.clone(),
                        value: Bytes::new(),
                        create_revision: p.create_revision,
                        mod_revision: id,
                    };
                    seen.retain(|(k, _)| *k != key.as_str());
                    seen.push((key, None));
                    events.push(Event { kind: EventKind::Delete, kv, prev: Some(p.clone()) });
                }
            }
        }
        prevs.push(prev);
    }
    Ok(TxnOutcome::Committed { revision: *rev, prev: prevs })
}

/// History rows with a revision after `after` under `prefix`, at most [`REPLAY_CHUNK`],
/// as watch events, and the revision of the snapshot they were read at. Fails with
/// `Compacted` if `after` is older than the compaction.
fn replay(conn: &Connection, prefix: &[u8], end: &[u8], after: Revision) -> Result<(Vec<Event>, Revision)> {
    let snapshot = max_revision(conn)?;
    let compact = compacted(conn)?;
    if after < compact {
        return Err(Error::Compacted { requested: after + 1, compacted: compact });
    }
    let mut stmt = conn
        .prepare_cached(
            "SELECT id, name, created, deleted, prev_revision, value FROM kv \
             WHERE id > ?1 AND name >= ?2 AND name < ?3 ORDER BY id LIMIT ?4",
        )
        .map_err(sql_err)?;
    let rows = stmt
        .query_map(params![after, prefix, end, REPLAY_CHUNK], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, Vec<u8>>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, Vec<u8>>(5)?,
            ))
        })
        .map_err(sql_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sql_err)?;
    let mut prev_stmt = conn.prepare_cached("SELECT created, deleted, value FROM kv WHERE id = ?1").map_err(sql_err)?;
    let mut events = Vec::with_capacity(rows.len());
    for (id, name, created, deleted, prev_rev, value) in rows {
        let key = key_string(name)?;
        let prev = if prev_rev == 0 {
            None
        } else {
            prev_stmt
                .query_row([prev_rev], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, Vec<u8>>(2)?)))
                .optional()
                .map_err(sql_err)?
                .filter(|(_, deleted, _)| *deleted == 0)
                .map(|(created, _, value)| KeyValue {
                    key: key.clone(),
                    value: value.into(),
                    create_revision: created,
                    mod_revision: prev_rev,
                })
        };
        let kind = if deleted == 1 { EventKind::Delete } else { EventKind::Put };
        let kv = KeyValue { key, value: value.into(), create_revision: created, mod_revision: id };
        events.push(Event { kind, kv, prev });
    }
    Ok((events, snapshot))
}

#[async_trait]
impl Store for SqliteStore {
    async fn current_revision(&self) -> Result<Revision> {
        Ok(self.revision.load(Ordering::SeqCst))
    }

    async fn range(&self, range: Range) -> Result<RangeResult> {
        if let Some(start) = &range.start {
            if !start.starts_with(&range.prefix) {
                return Err(Error::InvalidRequest(format!(
                    "start key {start:?} is not under prefix {:?}",
                    range.prefix
                )));
            }
        }
        let large = range.limit == 0 || range.limit > 500;
        self.read(large, move |tx| {
            let current = max_revision(tx)?;
            check_revision(range.revision, current, compacted(tx)?)?;
            let at = if range.revision == 0 { current } else { range.revision };
            let from = range.start.as_deref().unwrap_or(&range.prefix).as_bytes().to_vec();
            let end = prefix_end(&range.prefix);
            let want = if range.limit == 0 { usize::MAX } else { range.limit + 1 };
            let kvs = newest_rows(tx, &from, &end, at, want)?;
            let mut kvs = kvs;
            let more = range.limit > 0 && kvs.len() > range.limit;
            kvs.truncate(if more { range.limit } else { kvs.len() });
            Ok(RangeResult { kvs, revision: at, more })
        })
        .await
    }

    async fn get(&self, key: &str) -> Result<(Revision, Option<KeyValue>)> {
        // The revision read before the snapshot is at most the snapshot's, and the value is
        // current from its mod revision to the snapshot: the larger of the two is a
        // revision at which the answer is true, without a second query.
        let before = self.revision.load(Ordering::SeqCst);
        let key = key.to_string();
        let kv = self.read(false, move |tx| latest(tx, &key)).await?;
        Ok((kv.as_ref().map_or(before, |kv| kv.mod_revision.max(before)), kv))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        self.write(txn).await
    }

    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream> {
        let stream = self.start_watch(prefix, after_revision, false).await?;
        Ok(stream
            .filter_map(|item| async move {
                match item {
                    Ok(WatchItem::Event(e)) => Some(Ok(e)),
                    Ok(WatchItem::Progress(_)) => None,
                    Err(e) => Some(Err(e)),
                }
            })
            .boxed())
    }

    async fn watch_with_progress(&self, prefix: &str, after_revision: Revision) -> Result<ProgressWatchStream> {
        self.start_watch(prefix, after_revision, true).await
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let (queue, writer) = (self.queue.clone(), self.writer.clone());
        tokio::task::spawn_blocking(move || {
            let result = lock(&writer)?.compact(revision);
            // Writes queued meanwhile found the connection taken; commit them now.
            drain(&queue, &writer)?;
            result
        })
        .await
        .map_err(|e| Error::Internal(format!("compaction task failed: {e}")))?
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        self.read(false, compacted).await
    }
}

/// Read connections and how to open more.
#[derive(Clone)]
struct ReadSource {
    readers: Arc<Mutex<Vec<Connection>>>,
    path: PathBuf,
    fsync: bool,
}

impl ReadSource {
    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let taken = self.readers.lock().ok().and_then(|mut p| p.pop());
        let conn = match taken {
            Some(c) => c,
            None => open_connection(&self.path, self.fsync)?,
        };
        // BEGIN / ROLLBACK through cached statements: rusqlite's `transaction()` parses
        // them anew each time, which cost more than a point read itself.
        let result = exec_cached(&conn, "BEGIN DEFERRED").and_then(|()| {
            let r = f(&conn);
            let _ = exec_cached(&conn, "ROLLBACK");
            r
        });
        if let Ok(mut pool) = self.readers.lock() {
            if pool.len() < READ_POOL {
                pool.push(conn);
            }
        }
        result
    }

    async fn replay(&self, prefix: &[u8], end: &[u8], after: Revision) -> Result<(Vec<Event>, Revision)> {
        let source = self.clone();
        let (prefix, end) = (prefix.to_vec(), end.to_vec());
        tokio::task::spawn_blocking(move || source.read(|tx| replay(tx, &prefix, &end, after)))
            .await
            .map_err(|e| Error::Internal(format!("watch replay task failed: {e}")))?
    }
}

/// The progress a watch has to report, throttled to one item per `interval`.
struct Progress {
    interval: std::time::Duration,
    /// A revision to report once `next` has come (an event since makes it moot).
    pending: Option<Revision>,
    /// When the next progress item may be sent.
    next: tokio::time::Instant,
}

impl Progress {
    fn new(interval: std::time::Duration) -> Self {
        Progress { interval, pending: None, next: tokio::time::Instant::now() }
    }
}

type Out = tokio::sync::mpsc::Sender<Result<WatchItem>>;

/// Deliver every event under the prefix after `last` to `out`: replay from the database
/// until caught up, then follow the live channel; on lag, replay again. With `progress`,
/// also report how far delivery has got (see the module docs).
async fn follow(
    source: ReadSource,
    mut live: broadcast::Receiver<Arc<Vec<Event>>>,
    prefix: Vec<u8>,
    end: Vec<u8>,
    mut last: Revision,
    mut progress: Option<Progress>,
    out: &Out,
) {
    // `last` is the newest revision delivered, as an event or as progress: every event of
    // the prefix up to it has been sent.
    'replay: loop {
        loop {
            let (events, snapshot) = match source.replay(&prefix, &end, last).await {
                Ok(r) => r,
                Err(e) => {
                    let _ = out.send(Err(e)).await;
                    return;
                }
            };
            let caught_up = (events.len() as i64) < REPLAY_CHUNK;
            for event in events {
                if !send_event(out, &mut last, &mut progress, event).await {
                    return;
                }
            }
            if caught_up {
                // Every event of the prefix up to the snapshot has been sent.
                if !offer_progress(out, &mut last, &mut progress, snapshot).await {
                    return;
                }
                break;
            }
        }
        loop {
            let flush_at = progress.as_ref().and_then(|p| p.pending.map(|_| p.next));
            let received = tokio::select! {
                r = live.recv() => r,
                _ = sleep_until_some(flush_at) => {
                    if !flush_progress(out, &mut last, &mut progress).await {
                        return;
                    }
                    continue;
                }
            };
            match received {
                Ok(batch) => {
                    for event in batch.iter() {
                        let wanted = event.revision() > last && event.kv.key.as_bytes().starts_with(&prefix);
                        if wanted && !send_event(out, &mut last, &mut progress, event.clone()).await {
                            return;
                        }
                    }
                    // Batches come in commit order: everything up to this one is delivered.
                    let batch_rev = batch.last().map_or(0, Event::revision);
                    if !offer_progress(out, &mut last, &mut progress, batch_rev).await {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::debug!(skipped = n, "watcher fell behind; replaying from storage");
                    continue 'replay;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Send an event; it supersedes any pending progress. False when the receiver is gone.
async fn send_event(out: &Out, last: &mut Revision, progress: &mut Option<Progress>, event: Event) -> bool {
    *last = event.revision();
    if let Some(p) = progress.as_mut() {
        if p.pending.is_some_and(|r| r <= *last) {
            p.pending = None;
        }
    }
    out.send(Ok(WatchItem::Event(event))).await.is_ok()
}

/// Everything up to `rev` has been delivered: report it now if the interval allows, else
/// hold it back for [`flush_progress`]. False when the receiver is gone.
async fn offer_progress(out: &Out, last: &mut Revision, progress: &mut Option<Progress>, rev: Revision) -> bool {
    let Some(p) = progress.as_mut() else { return true };
    if rev <= *last || p.pending.is_some_and(|r| r >= rev) {
        return true;
    }
    p.pending = Some(rev);
    if tokio::time::Instant::now() < p.next {
        return true;
    }
    flush_progress(out, last, progress).await
}

/// Send the pending progress, if any. False when the receiver is gone.
async fn flush_progress(out: &Out, last: &mut Revision, progress: &mut Option<Progress>) -> bool {
    let Some(p) = progress.as_mut() else { return true };
    let Some(rev) = p.pending.take() else { return true };
    if rev <= *last {
        return true;
    }
    *last = rev;
    p.next = tokio::time::Instant::now() + p.interval;
    out.send(Ok(WatchItem::Progress(rev))).await.is_ok()
}
