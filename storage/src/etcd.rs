//! The etcd backend: [`Store`] over a real etcd cluster through `etcd-client`.
//!
//! # Mapping onto etcd
//!
//! - `range` is one linearizable etcd Range over `[start or prefix, prefix_end(prefix))`.
//! - `get` (one key) is a Range of that key, coalesced ([`crate::coalesce`]): while two reads
//!   are out, reads that arrive queue and leave together as one read-only Txn of Ranges, which
//!   etcd serves as it serves a Range. A queued read can wait for an out one, so its bound is
//!   up to twice the request timeout.
//! - `txn` is one etcd Txn: `ModRevision(key) == r` per compare (`CreateRevision(key) == 0`
//!   for r = 0, i.e. "absent"); the success branch runs the Put/Delete ops with `prev_kv`, the
//!   failure branch Gets every compared key, so both outcomes take a single round trip.
//! - `watch` is an etcd watch on the prefix from `after_revision + 1` with `prev_kv`. If the
//!   gRPC stream breaks (etcd restarted, connection reset, keep-alive timeout) the stream
//!   re-creates the watch from the revision after the last event it delivered, retrying with
//!   backoff (100 ms doubling to 2 s) for as long as it takes, so the consumer sees neither a
//!   gap nor a duplicate. Only a compaction ([`Error::Compacted`], `requested` = the first
//!   revision the watch still needed) or an unexpected cancel by etcd ends the stream, with
//!   that error as its last item. Delete events carry etcd's tombstone: empty value,
//!   `mod_revision` = the delete's revision, `create_revision` taken from `prev_kv` (etcd
//!   itself reports 0).
//! - `watch_with_progress` is the same watch with `progress_notify` set: etcd then sends,
//!   on a quiet watch, an empty response whose header revision promises that every earlier
//!   event was sent, every `--experimental-watch-progress-notify-interval` (10 minutes by
//!   default; `--watch-progress-notify-interval` from etcd 3.6). Those travel with the
//!   watch's events, so they are ordered. On etcd 3.4.31+ / 3.5.13+ (the versions Kubernetes
//!   trusts, see etcd#15220 and etcd#17557) the stream also asks for progress
//!   (`RequestProgress`) after [`EtcdOptions::progress_interval`] without a response, so a
//!   quiet watch learns the current revision within about that interval. Older versions
//!   answer such requests out of band, possibly ahead of events still to come, so they only
//!   get the periodic notifications. Each progress becomes [`WatchItem::Progress`] and the
//!   revision a broken watch is re-created from.
//! - Every unary call is bounded by a request timeout; while etcd is unreachable calls fail
//!   with [`Error::Unavailable`]. The gRPC transport ([`crate::etcd_channel`]: one HTTP/2
//!   connection per member, a unary call in one write) redials by itself.
//! - Several endpoints (the members of one cluster) get a connection each, and requests go
//!   to one of them, the pinned member, as etcd's own Go client pins an endpoint. A request
//!   that finds it unreachable, without a leader or not answering moves the pin to the next
//!   member; one that was never sent (no connection could be made) is retried there at
//!   once, so a dead member costs one failed dial and not a share of all requests (a
//!   balancer over all members would go on sending it some). Watches re-created after a
//!   break follow the pin. Requests carry etcd's require-leader flag, so a member cut off
//!   from the others says so instead of waiting.
//!
//! # Compaction and `compacted_revision`
//!
//! `compact(r)` is etcd's `Compact(r)` (not physical): history before `r` is dropped, `r`
//! itself stays readable, and the compacted revision is `r` — the oldest revision that
//! reads and watches can still start from. Reads at a revision below it fail with
//! [`Error::Compacted`], and so does a watch that would need an event before it (a watch
//! after `r - 1`, i.e. starting at `r`, still works, as in etcd). Compacting at or below the
//! current compacted revision is a no-op; beyond the current revision, `FutureRevision`.
//!
//! etcd has no API that returns its compacted revision. This backend keeps the highest
//! compacted revision it knows of in memory (shared with its watch streams) and learns
//! about compactions done by others (another apiserver, `etcdctl compact`, a restart of this
//! process):
//! - `compacted_revision()` checks the cached value `c` with one count-only Range at
//!   revision `max(c, 1)`; only if etcd says that revision is compacted does it
//!   binary-search the oldest readable revision with count-only Ranges (about
//!   log2(current revision) round trips);
//! - a Range failing with "required revision has been compacted" runs the same discovery to
//!   fill in [`Error::Compacted::compacted`];
//! - a watch cancelled for compaction carries etcd's compact revision, which is recorded;
//! - `connect` runs the discovery once, so a restarted apiserver knows it immediately.
//!
//! An etcd that was never compacted reports 0 (compacting at revision 1 is indistinguishable
//! from that, and drops nothing).
//!
//! Nothing is written to etcd for this bookkeeping, so compaction never bumps the revision.
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

use etcd_client::proto::{PbKeyValue, PbTxnOpResponse};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KvClient, PutOptions, TxnOp, WatchClient,
    WatchOptions,
};
use futures::StreamExt;

use crate::coalesce::Coalescer;
use crate::etcd_channel;
use crate::*;

/// Default bound on one etcd request (and on establishing a connection).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Responses can hold many 1.5 MiB values (a range, or a watch batch with previous values):
/// accept anything etcd is willing to send (its own limit is `math.MaxInt32`).
const MAX_DECODING_MESSAGE_SIZE: usize = i32::MAX as usize;

/// Single-key reads coalesced into one request: at most this many keys, and this many such
/// requests in flight at once.
const MAX_READ_BATCH: usize = 128;
const READS_IN_FLIGHT: usize = 2;

/// A key nobody uses, for cheap count-only probes (`current_revision`, compaction discovery).
const PROBE_KEY: &[u8] = b"\0minik8s-probe";

/// Watch re-establishment backoff.
const WATCH_BACKOFF_MIN: Duration = Duration::from_millis(100);
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Tunables for [`EtcdStore::connect_with`].
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// Upper bound on every unary request (range, txn, compact, ...) and on opening a watch.
    pub request_timeout: Duration,
    /// Upper bound on establishing a TCP/HTTP2 connection to an endpoint.
    pub connect_timeout: Duration,
    /// HTTP/2 keep-alive ping interval while watches are open: a watch whose connection died
    /// silently (no reset, e.g. a partition or a frozen etcd) is re-established after about
    /// `keep_alive_interval + request_timeout`. Keep it at or above etcd's
    /// `--grpc-keepalive-min-time` (5 s by default).
    pub keep_alive_interval: Duration,
    /// How long a watch with progress may go without a response before it asks etcd for
    /// progress (when that is trusted, see `request_progress`).
    pub progress_interval: Duration,
    /// Whether watches with progress send etcd `RequestProgress`; None decides from the
    /// etcd version (3.4.31+, 3.5.13+, 3.6+). Older versions may answer ahead of events.
    pub request_progress: Option<bool>,
    /// TLS towards etcd (`https://` endpoints): the CA that signed etcd's certificate and the
    /// client certificate to present (kube-apiserver's `--etcd-cafile`, `--etcd-certfile`,
    /// `--etcd-keyfile`).
    pub tls: Option<EtcdTls>,
}

/// TLS settings of the etcd client (PEM contents).
#[derive(Clone, Default)]
pub struct EtcdTls {
    pub ca: Option<Vec<u8>>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// Says which parts are set, never their contents: the key must not reach a log.
impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca", &self.ca.as_ref().map(|_| "<PEM>"))
            .field("identity", &self.identity.as_ref().map(|_| "<certificate and key>"))
            .finish()
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_REQUEST_TIMEOUT,
            keep_alive_interval: Duration::from_secs(10),
            progress_interval: Duration::from_secs(1),
            request_progress: None,
            tls: None,
        }
    }
}

/// [`Store`] over etcd v3.
pub struct EtcdStore {
    members: Arc<Members>,
    opts: EtcdOptions,
    /// Highest compacted revision known (etcd's: the oldest readable revision; 0 = never).
    compacted: Arc<AtomicI64>,
    /// Whether watches with progress ask etcd for it (see the module docs).
    request_progress: bool,
    /// Single-key reads, coalesced: those that arrive while others are in flight share one
    /// read-only Txn (see `read_keys`).
    reads: Coalescer<String, Result<(Revision, Option<KeyValue>)>>,
}

/// One connection per etcd endpoint, and the pinned one requests go to (see the module docs).
struct Members {
    members: Vec<Member>,
    pinned: AtomicUsize,
}

struct Member {
    endpoint: String,
    kv: KvClient,
    watch: WatchClient,
    /// The member's client: its channel, which the clones above share, and the maintenance
    /// API (`status` at connect).
    client: Client,
}

impl Members {
    /// The pinned member and its index.
    fn pinned(&self) -> (usize, &Member) {
        let i = self.pinned.load(Ordering::Relaxed) % self.members.len();
        (i, &self.members[i])
    }

    /// Member `i` did not serve a request: pin the next one, unless another request already
    /// moved the pin.
    fn unreachable(&self, i: usize, why: &str) {
        let n = self.members.len();
        if n > 1 && self.pinned.compare_exchange(i, (i + 1) % n, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            tracing::warn!(
                from = %self.members[i].endpoint,
                to = %self.members[(i + 1) % n].endpoint,
                %why,
                "etcd member did not serve a request; using the next one"
            );
        }
    }

    /// Run `op` on the pinned member under `timeout`, moving the pin (and retrying a request
    /// that was never sent, once per other member) when the member does not serve it.
    async fn call<T, F, Fut>(&self, timeout: Duration, what: &str, op: F) -> Result<T, Failure>
    where
        F: Fn(&Member) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut tries = 0;
        loop {
            let (i, member) = self.pinned();
            let result = call(timeout, what, op(member)).await;
            if let Err(Failure::Other(Error::Unavailable(msg))) = &result {
                self.unreachable(i, msg);
                tries += 1;
                if never_sent(msg) && tries < self.members.len() {
                    continue;
                }
            }
            return result;
        }
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("opts", &self.opts)
            .field("compacted", &self.compacted.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

/// An etcd failure, with the two mvcc errors that need context singled out.
#[derive(Debug)]
enum Failure {
    /// "mvcc: required revision has been compacted"
    Compacted,
    /// "mvcc: required revision is a future revision"
    FutureRevision,
    Other(Error),
}

impl Failure {
    /// For calls where the mvcc errors are not expected.
    fn into_error(self, what: &str) -> Error {
        match self {
            Failure::Compacted => Error::Internal(format!("etcd {what}: unexpected compacted-revision error")),
            Failure::FutureRevision => Error::Internal(format!("etcd {what}: unexpected future-revision error")),
            Failure::Other(e) => e,
        }
    }
}

/// Map an etcd-client error onto the storage errors.
fn classify(what: &str, e: etcd_client::Error) -> Failure {
    use etcd_client::Error as E;
    use grpc_code::*;
    match e {
        E::GRpcStatus(status) => {
            let msg = status.message();
            if msg.contains("required revision has been compacted") {
                return Failure::Compacted;
            }
            if msg.contains("required revision is a future revision") {
                return Failure::FutureRevision;
            }
            let text = format!("etcd {what}: {:?}: {msg}", status.code());
            let too_large = msg.contains("request is too large") || msg.contains("received message larger than max");
            let err = match status.code() as i32 {
                _ if too_large => Error::InvalidRequest(text),
                UNAVAILABLE | DEADLINE_EXCEEDED | CANCELLED | UNKNOWN => Error::Unavailable(text),
                // "etcdserver: too many requests", "etcdserver: request timed out" and friends.
                RESOURCE_EXHAUSTED | ABORTED => Error::Unavailable(text),
                INVALID_ARGUMENT => Error::InvalidRequest(text),
                _ if msg.contains("no leader") || msg.contains("leader changed") || msg.contains("timed out") => {
                    Error::Unavailable(text)
                }
                _ => Error::Internal(text),
            };
            Failure::Other(err)
        }
        E::TransportError(e) => Failure::Other(Error::Unavailable(format!("etcd {what}: transport error: {e}"))),
        E::IoError(e) => Failure::Other(Error::Unavailable(format!("etcd {what}: io error: {e}"))),
        E::InvalidArgs(m) => Failure::Other(Error::InvalidRequest(format!("etcd {what}: {m}"))),
        E::InvalidUri(e) => Failure::Other(Error::InvalidRequest(format!("etcd {what}: invalid uri: {e}"))),
        E::WatchError(m) => Failure::Other(Error::Unavailable(format!("etcd {what}: watch error: {m}"))),
        other => Failure::Other(Error::Internal(format!("etcd {what}: {other}"))),
    }
}

/// gRPC status codes (numeric: the codes etcd-client's errors carry).
mod grpc_code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const ABORTED: i32 = 10;
    pub const UNAVAILABLE: i32 = 14;
}

/// Whether an unavailability error says the request never left this process (no connection
/// could be made), as opposed to an outcome we cannot know (timeout, connection lost).
fn never_sent(msg: &str) -> bool {
    msg.contains("tcp connect error") || msg.contains("Connection refused")
}

fn kv_from_pb(kv: PbKeyValue) -> Result<KeyValue> {
    let key = String::from_utf8(kv.key)
        .map_err(|e| Error::Internal(format!("etcd returned a key that is not UTF-8: {:?}", e.as_bytes())))?;
    Ok(KeyValue {
        key,
        value: Bytes::from(kv.value),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
    })
}

fn header_revision(header: Option<&etcd_client::proto::PbResponseHeader>, what: &str) -> Result<Revision> {
    header.map(|h| h.revision).ok_or_else(|| Error::Internal(format!("etcd {what}: response without header")))
}

/// Whether an etcd of this version answers `RequestProgress` in order with the events:
/// 3.4.31+, 3.5.13+ and 3.6+ (etcd#15220, etcd#17557).
fn progress_requests_trusted(version: &str) -> bool {
    let mut parts = version.trim_start_matches('v').split(['.', '-', '+']).map(|p| p.parse::<u64>().ok());
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m >= 6,
        (m, _) => m > 3,
    }
}

/// Read `keys` (exact keys, latest revision): one Range for a lone key, else one read-only
/// Txn of a Range per key, which etcd serves as it serves a Range (linearizable, no Raft
/// proposal). An answer per key, in order.
async fn read_keys(
    members: &Members,
    timeout: Duration,
    keys: Vec<String>,
) -> Vec<Result<(Revision, Option<KeyValue>)>> {
    let n = keys.len();
    let answers = async {
        if let [key] = keys.as_slice() {
            let resp = members
                .call(timeout, "range", |m| {
                    let (mut kv, key) = (m.kv.clone(), key.clone());
                    async move { kv.get(key, None).await }
                })
                .await
                .map_err(|f| f.into_error("range"))?
                .0;
            let revision = header_revision(resp.header.as_ref(), "range")?;
            let kv = resp.kvs.into_iter().next().map(kv_from_pb).transpose()?;
            return Ok(vec![Ok((revision, kv))]);
        }
        let request =
            etcd_client::Txn::new().and_then(keys.iter().map(|k| TxnOp::get(k.as_str(), None)).collect::<Vec<_>>());
        let resp = members
            .call(timeout, "range", |m| {
                let (mut kv, request) = (m.kv.clone(), request.clone());
                async move { kv.txn(request).await }
            })
            .await
            .map_err(|f| f.into_error("range"))?
            .0;
        let revision = header_revision(resp.header.as_ref(), "range")?;
        let mut out = Vec::with_capacity(n);
        for (key, r) in keys.iter().zip(resp.responses) {
            match r.response {
                Some(PbTxnOpResponse::ResponseRange(r)) => {
                    let kv = r.kvs.into_iter().find(|kv| kv.key == key.as_bytes()).map(kv_from_pb).transpose();
                    out.push(kv.map(|kv| (revision, kv)));
                }
                other => {
                    out.push(Err(Error::Internal(format!("etcd range: unexpected response {other:?} for {key:?}"))))
                }
            }
        }
        Ok::<_, Error>(out)
    };
    match answers.await {
        Ok(out) if out.len() == n => out,
        Ok(out) => vec![Err(Error::Internal(format!("etcd range: {} answers for {n} keys", out.len()))); n],
        Err(e) => vec![Err(e); n],
    }
}

/// Run one etcd call under the request timeout.
async fn call<T>(
    timeout: Duration,
    what: &str,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(classify(what, e)),
        Err(_) => Err(Failure::Other(Error::Unavailable(format!("etcd {what}: no answer within {timeout:?}")))),
    }
}

impl EtcdStore {
    /// Connect to etcd (`http://host:port` or `host:port` endpoints) with default options and
    /// check that it answers. Fails with [`Error::Unavailable`] if it does not.
    pub async fn connect(endpoints: &[String]) -> Result<Self> {
        Self::connect_with(endpoints, EtcdOptions::default()).await
    }

    /// [`EtcdStore::connect`] with explicit options.
    pub async fn connect_with(endpoints: &[String], opts: EtcdOptions) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(Error::InvalidRequest("no etcd endpoints given".into()));
        }
        let options = ConnectOptions::new().with_require_leader(true);
        let tls = match &opts.tls {
            None => None,
            Some(tls) => Some(
                etcd_channel::tls_connector(
                    tls.ca.as_deref(),
                    tls.identity.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice())),
                )
                .map_err(Error::InvalidRequest)?,
            ),
        };
        // Connections are made lazily: a member that is down now is only dialled when pinned.
        let mut members = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let (scheme, authority) =
                etcd_channel::Target::parse(endpoint, tls.clone()).map_err(Error::InvalidRequest)?;
            let channel = etcd_channel::H2Channel::new(etcd_channel::Target {
                scheme,
                authority,
                tls: tls.clone(),
                connect_timeout: opts.connect_timeout,
                keep_alive: opts.keep_alive_interval,
                ping_timeout: opts.request_timeout,
            });
            let channel = etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(channel));
            let client = call(opts.request_timeout, "connect", Client::from_channel(channel, Some(options.clone())))
                .await
                .map_err(|f| f.into_error("connect"))?;
            members.push(Member {
                endpoint: endpoint.clone(),
                kv: client.kv_client().max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE),
                watch: client.watch_client().max_decoding_message_size(MAX_DECODING_MESSAGE_SIZE),
                client,
            });
        }
        let members = Arc::new(Members { members, pinned: AtomicUsize::new(0) });
        let request_progress = match opts.request_progress {
            Some(r) => r,
            None => {
                let status = members
                    .call(opts.request_timeout, "status", |m| {
                        let mut maintenance = m.client.maintenance_client();
                        async move { maintenance.status().await }
                    })
                    .await
                    .map_err(|f| f.into_error("status"))?;
                let trusted = progress_requests_trusted(status.version());
                if !trusted {
                    tracing::info!(
                        version = status.version(),
                        "etcd before 3.4.31/3.5.13 may answer progress requests ahead of events: quiet watches \
                         rely on its periodic progress notifications (--experimental-watch-progress-notify-interval)"
                    );
                }
                trusted
            }
        };
        let reads = {
            let (members, timeout) = (members.clone(), opts.request_timeout);
            Coalescer::new(MAX_READ_BATCH, READS_IN_FLIGHT, move |keys| {
                let members = members.clone();
                async move { read_keys(&members, timeout, keys).await }
            })
        };
        let store = EtcdStore { members, opts, compacted: Arc::new(AtomicI64::new(0)), request_progress, reads };
        // Check that etcd answers, and learn how far it has been compacted.
        let compacted = store.refresh_compacted().await?;
        tracing::info!(?endpoints, compacted, request_progress, "connected to etcd");
        Ok(store)
    }

    fn timeout(&self) -> Duration {
        self.opts.request_timeout
    }

    fn known_compacted(&self) -> Revision {
        self.compacted.load(Ordering::SeqCst)
    }

    fn note_compacted(&self, rev: Revision) -> Revision {
        let prev = self.compacted.fetch_max(rev, Ordering::SeqCst);
        prev.max(rev)
    }

    /// Count-only read at `revision` of a key nobody uses.
    async fn probe_at(&self, revision: Revision) -> Result<Revision, Failure> {
        let opts = GetOptions::new().with_count_only().with_revision(revision);
        let resp = self
            .members
            .call(self.timeout(), "range", |m| {
                let (mut kv, opts) = (m.kv.clone(), opts.clone());
                async move { kv.get(PROBE_KEY, Some(opts)).await }
            })
            .await?;
        header_revision(resp.0.header.as_ref(), "range").map_err(Failure::Other)
    }

    /// Bring the cached compacted revision up to date with etcd. See the module docs.
    async fn refresh_compacted(&self) -> Result<Revision> {
        let cached = self.known_compacted();
        match self.probe_at(cached.max(1)).await {
            Ok(_) | Err(Failure::FutureRevision) => return Ok(self.known_compacted()),
            Err(Failure::Compacted) => {}
            Err(Failure::Other(e)) => return Err(e),
        }
        // Someone compacted beyond what we know: find etcd's oldest readable revision in
        // [cached + 1, current] (the current revision is always readable).
        let current = self.probe_at(0).await.map_err(|f| f.into_error("range"))?;
        let (mut lo, mut hi) = (cached.max(1) + 1, current.max(cached.max(1) + 1));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.probe_at(mid).await {
                Ok(_) | Err(Failure::FutureRevision) => hi = mid,
                Err(Failure::Compacted) => lo = mid + 1,
                Err(Failure::Other(e)) => return Err(e),
            }
        }
        let compacted = self.note_compacted(lo);
        tracing::debug!(compacted, "discovered etcd compaction");
        Ok(compacted)
    }

    /// Open a watch (see the module docs); `progress` for a watch with progress.
    async fn start_watch(
        &self,
        prefix: &str,
        after_revision: Revision,
        progress: Option<ProgressMode>,
    ) -> Result<WatchState> {
        if after_revision < 0 {
            return Err(Error::InvalidRequest(format!("negative revision {after_revision}")));
        }
        let compacted = self.known_compacted();
        if after_revision.saturating_add(1) < compacted {
            return Err(Error::Compacted { requested: after_revision.saturating_add(1), compacted });
        }
        let mut state = WatchState {
            members: self.members.clone(),
            prefix: prefix.to_string(),
            after: after_revision,
            stream: None,
            pending: VecDeque::new(),
            deferred_error: None,
            done: false,
            compacted: self.compacted.clone(),
            timeout: self.timeout(),
            backoff: WATCH_BACKOFF_MIN,
            progress,
        };
        // Open the first watch here so that an unreachable etcd is reported to the caller.
        state.stream = Some(state.open().await?);
        tracing::debug!(prefix, after_revision, "etcd watch started");
        Ok(state)
    }

    /// Turn a range failure at `requested` into the storage error.
    async fn read_failure(&self, f: Failure, requested: Revision) -> Error {
        match f {
            Failure::Compacted => match self.refresh_compacted().await {
                Ok(compacted) => Error::Compacted { requested, compacted: compacted.max(requested + 1) },
                Err(e) => e,
            },
            Failure::FutureRevision => match self.probe_at(0).await {
                Ok(current) => Error::FutureRevision { requested, current },
                Err(f) => f.into_error("range"),
            },
            Failure::Other(e) => e,
        }
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<(Revision, Option<KeyValue>)> {
        if key.is_empty() {
            return Err(Error::InvalidRequest("empty key".into()));
        }
        self.reads
            .call(key.to_string())
            .await
            .unwrap_or_else(|| Err(Error::Unavailable("etcd reads: shutting down".into())))
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.probe_at(0).await.map_err(|f| f.into_error("range"))
    }

    async fn range(&self, range: Range) -> Result<RangeResult> {
        if range.revision < 0 {
            return Err(Error::InvalidRequest(format!("negative revision {}", range.revision)));
        }
        if let Some(start) = &range.start {
            if !start.starts_with(&range.prefix) {
                return Err(Error::InvalidRequest(format!(
                    "start key {start:?} is not under prefix {:?}",
                    range.prefix
                )));
            }
        }
        if range.revision > 0 {
            let compacted = self.known_compacted();
            if range.revision < compacted {
                return Err(Error::Compacted { requested: range.revision, compacted });
            }
        }
        let mut key = range.start.as_deref().unwrap_or(&range.prefix).as_bytes().to_vec();
        if key.is_empty() {
            key = vec![0];
        }
        let mut opts = GetOptions::new().with_range(prefix_end(&range.prefix)).with_revision(range.revision);
        if range.limit > 0 {
            opts = opts.with_limit(i64::try_from(range.limit).unwrap_or(i64::MAX));
        }
        let resp = match self
            .members
            .call(self.timeout(), "range", |m| {
                let (mut kv, key, opts) = (m.kv.clone(), key.clone(), opts.clone());
                async move { kv.get(key, Some(opts)).await }
            })
            .await
        {
            Ok(resp) => resp.0,
            Err(f) => return Err(self.read_failure(f, range.revision).await),
        };
        let current = header_revision(resp.header.as_ref(), "range")?;
        let kvs = resp.kvs.into_iter().map(kv_from_pb).collect::<Result<Vec<_>>>()?;
        Ok(RangeResult { kvs, revision: if range.revision > 0 { range.revision } else { current }, more: resp.more })
    }

    async fn txn(&self, txn: Txn) -> Result<TxnOutcome> {
        for (key, rev) in &txn.compares {
            if *rev < 0 {
                return Err(Error::InvalidRequest(format!("negative revision {rev} for key {key:?}")));
            }
        }
        if let Some(op) =
            txn.compares.iter().map(|(k, _)| k.as_str()).chain(txn.ops.iter().map(Op::key)).find(|k| k.is_empty())
        {
            return Err(Error::InvalidRequest(format!("empty key {op:?} in transaction")));
        }
        let compares: Vec<Compare> = txn
            .compares
            .iter()
            .map(|(key, rev)| {
                if *rev == 0 {
                    Compare::create_revision(key.as_str(), CompareOp::Equal, 0)
                } else {
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, *rev)
                }
            })
            .collect();
        let ops: Vec<TxnOp> = txn
            .ops
            .iter()
            .map(|op| match op {
                Op::Put { key, value } => {
                    TxnOp::put(key.as_str(), value.to_vec(), Some(PutOptions::new().with_prev_key()))
                }
                Op::Delete { key } => TxnOp::delete(key.as_str(), Some(DeleteOptions::new().with_prev_key())),
            })
            .collect();
        let reads: Vec<TxnOp> = txn.compares.iter().map(|(key, _)| TxnOp::get(key.as_str(), None)).collect();
        let request = etcd_client::Txn::new().when(compares).and_then(ops).or_else(reads);

        let resp = match self
            .members
            .call(self.timeout(), "txn", |m| {
                let (mut kv, request) = (m.kv.clone(), request.clone());
                async move { kv.txn(request).await }
            })
            .await
        {
            Ok(resp) => resp.0,
            Err(Failure::Other(Error::Unavailable(msg))) => {
                let outcome = if never_sent(&msg) {
                    "nothing was written"
                } else {
                    "the transaction may or may not have been applied"
                };
                return Err(Error::Unavailable(format!("{msg} ({outcome})")));
            }
            Err(f) => return Err(f.into_error("txn")),
        };
        let revision = header_revision(resp.header.as_ref(), "txn")?;
        let mut responses = resp.responses.into_iter().map(|r| r.response);
        if resp.succeeded {
            let mut prev = Vec::with_capacity(txn.ops.len());
            for op in &txn.ops {
                let kv = match (op, responses.next().flatten()) {
                    (Op::Put { .. }, Some(PbTxnOpResponse::ResponsePut(put))) => put.prev_kv,
                    (Op::Delete { key }, Some(PbTxnOpResponse::ResponseDeleteRange(del))) => {
                        del.prev_kvs.into_iter().find(|kv| kv.key == key.as_bytes())
                    }
                    (_, other) => {
                        return Err(Error::Internal(format!(
                            "etcd txn: unexpected response {other:?} for op on {:?}",
                            op.key()
                        )))
                    }
                };
                prev.push(kv.map(kv_from_pb).transpose()?);
            }
            Ok(TxnOutcome::Committed { revision, prev })
        } else {
            let mut current = Vec::with_capacity(txn.compares.len());
            for (key, _) in &txn.compares {
                let kv = match responses.next().flatten() {
                    Some(PbTxnOpResponse::ResponseRange(r)) => r.kvs.into_iter().find(|kv| kv.key == key.as_bytes()),
                    other => {
                        return Err(Error::Internal(format!("etcd txn: unexpected response {other:?} for get {key:?}")))
                    }
                };
                current.push(kv.map(kv_from_pb).transpose()?);
            }
            Ok(TxnOutcome::Failed { revision, current })
        }
    }

    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream> {
        let state = self.start_watch(prefix, after_revision, None).await?;
        Ok(futures::stream::unfold(state, |mut state| async move {
            loop {
                match state.next_item().await? {
                    Ok(WatchItem::Event(e)) => return Some((Ok(e), state)),
                    Ok(WatchItem::Progress(_)) => continue,
                    Err(e) => return Some((Err(e), state)),
                }
            }
        })
        .boxed())
    }

    async fn watch_with_progress(&self, prefix: &str, after_revision: Revision) -> Result<ProgressWatchStream> {
        let progress = ProgressMode { request_after: self.request_progress.then_some(self.opts.progress_interval) };
        let state = self.start_watch(prefix, after_revision, Some(progress)).await?;
        Ok(futures::stream::unfold(state, |mut state| async move {
            let item = state.next_item().await?;
            Some((item, state))
        })
        .boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        if revision <= 0 || revision <= self.known_compacted() {
            return Ok(());
        }
        let current = self.current_revision().await?;
        if revision > current {
            return Err(Error::FutureRevision { requested: revision, current });
        }
        match self
            .members
            .call(self.timeout(), "compact", |m| {
                let mut kv = m.kv.clone();
                async move { kv.compact(revision, None).await }
            })
            .await
        {
            Ok(_) => {}
            // Already compacted at or beyond `revision` (by another client).
            Err(Failure::Compacted) => {
                self.refresh_compacted().await?;
            }
            Err(Failure::FutureRevision) => {
                return Err(Error::FutureRevision { requested: revision, current });
            }
            Err(Failure::Other(Error::Unavailable(msg))) if !never_sent(&msg) => {
                return Err(Error::Unavailable(format!("{msg} (the compaction may or may not have happened)")))
            }
            Err(Failure::Other(e)) => return Err(e),
        }
        let compacted = self.note_compacted(revision);
        tracing::debug!(revision, compacted, "compacted etcd");
        Ok(())
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        self.refresh_compacted().await
    }
}

/// The state behind one [`WatchStream`].
struct WatchState {
    members: Arc<Members>,
    prefix: String,
    /// Every event up to and including this revision has been delivered (or queued).
    after: Revision,
    stream: Option<etcd_client::WatchStream>,
    /// Items of the last etcd response not yet handed out.
    pending: VecDeque<WatchItem>,
    /// An error to hand out once `pending` is drained; the stream ends after it.
    deferred_error: Option<Error>,
    done: bool,
    compacted: Arc<AtomicI64>,
    timeout: Duration,
    backoff: Duration,
    /// Set for a watch with progress.
    progress: Option<ProgressMode>,
}

/// How a watch with progress learns it.
#[derive(Clone, Copy, Debug)]
struct ProgressMode {
    /// Ask etcd for progress after this long without a response (None: only etcd's
    /// periodic notifications).
    request_after: Option<Duration>,
}

impl WatchState {
    /// Create the etcd watch from `after + 1`.
    async fn open(&self) -> Result<etcd_client::WatchStream> {
        let mut key = self.prefix.as_bytes().to_vec();
        if key.is_empty() {
            key = vec![0];
        }
        let mut opts = WatchOptions::new()
            .with_range(prefix_end(&self.prefix))
            .with_start_revision(self.after.saturating_add(1))
            .with_prev_key();
        if self.progress.is_some() {
            opts = opts.with_progress_notify();
        }
        self.members
            .call(self.timeout, "watch", |m| {
                let (mut watch, key, opts) = (m.watch.clone(), key.clone(), opts.clone());
                async move { watch.watch(key, Some(opts)).await }
            })
            .await
            .map_err(|f| f.into_error("watch"))
    }

    async fn next_item(&mut self) -> Option<Result<WatchItem>> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(Ok(item));
            }
            if let Some(e) = self.deferred_error.take() {
                return Some(Err(e));
            }
            if self.done {
                return None;
            }
            let Some(stream) = self.stream.as_mut() else {
                match self.open().await {
                    Ok(stream) => {
                        tracing::info!(prefix = %self.prefix, after = self.after, "etcd watch re-established");
                        self.stream = Some(stream);
                    }
                    Err(Error::Unavailable(msg)) => {
                        tracing::debug!(prefix = %self.prefix, %msg, "etcd watch: cannot re-establish yet");
                        self.sleep_backoff().await;
                    }
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                continue;
            };
            let request_after = self.progress.and_then(|p| p.request_after);
            let message = match request_after {
                None => stream.message().await,
                Some(after) => match tokio::time::timeout(after, stream.message()).await {
                    Ok(message) => message,
                    Err(_) => {
                        // Quiet for a while: ask where the watch stands. A failure to send
                        // means the stream broke; reading it will say so.
                        if let Err(e) = stream.request_progress().await {
                            tracing::debug!(prefix = %self.prefix, error = %e, "etcd watch: progress request failed");
                        }
                        continue;
                    }
                },
            };
            match message {
                Ok(Some(resp)) => {
                    if let Err(e) = self.handle(resp.0) {
                        // Deliver what was queued before the error, then the error, then end.
                        self.done = true;
                        self.stream = None;
                        self.deferred_error = Some(e);
                    }
                }
                Ok(None) => {
                    tracing::warn!(prefix = %self.prefix, after = self.after, "etcd watch stream ended; re-watching");
                    self.stream = None;
                    self.sleep_backoff().await;
                }
                Err(e) => {
                    tracing::warn!(prefix = %self.prefix, after = self.after, error = %e, "etcd watch stream broke; re-watching");
                    self.stream = None;
                    self.sleep_backoff().await;
                }
            }
        }
    }

    async fn sleep_backoff(&mut self) {
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(WATCH_BACKOFF_MAX);
    }

    /// Queue the events (or the progress) of one etcd response.
    fn handle(&mut self, resp: etcd_client::proto::PbWatchResponse) -> Result<()> {
        if resp.compact_revision != 0 {
            let compacted = resp.compact_revision;
            let compacted = self.compacted.fetch_max(compacted, Ordering::SeqCst).max(compacted);
            return Err(Error::Compacted { requested: self.after.saturating_add(1), compacted });
        }
        if resp.canceled {
            return Err(Error::Unavailable(format!("etcd cancelled the watch: {}", resp.cancel_reason)));
        }
        self.backoff = WATCH_BACKOFF_MIN;
        if resp.events.is_empty() {
            // The creation response only says when the watch was created; later empty
            // responses are progress: every event up to the header revision was sent.
            if self.progress.is_some() && !resp.created {
                let revision = header_revision(resp.header.as_ref(), "watch")?;
                if revision > self.after {
                    self.after = revision;
                    self.pending.push_back(WatchItem::Progress(revision));
                }
            }
            return Ok(());
        }
        let mut newest = None;
        for ev in resp.events {
            let kind = match ev.r#type {
                0 => EventKind::Put,
                1 => EventKind::Delete,
                other => return Err(Error::Internal(format!("etcd watch: unknown event type {other}"))),
            };
            let Some(kv) = ev.kv else {
                return Err(Error::Internal("etcd watch: event without kv".into()));
            };
            let mut kv = kv_from_pb(kv)?;
            if kv.mod_revision <= self.after {
                // Already delivered before a re-watch; never expected from etcd.
                tracing::warn!(key = %kv.key, revision = kv.mod_revision, "etcd watch: skipping duplicate event");
                continue;
            }
            let prev = ev.prev_kv.map(kv_from_pb).transpose()?;
            if kind == EventKind::Delete {
                // etcd's tombstone says 0; the trait promises the deleted incarnation's.
                kv.create_revision = prev.as_ref().map_or(0, |p| p.create_revision);
            }
            newest = Some(kv.mod_revision);
            self.pending.push_back(WatchItem::Event(Event { kind, kv, prev }));
        }
        // Only now: the events of one transaction share its revision.
        if let Some(newest) = newest {
            self.after = newest;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{progress_requests_trusted, EtcdTls};

    #[test]
    fn tls_settings_never_print_the_key() {
        let tls = EtcdTls { ca: Some(b"CA-PEM".to_vec()), identity: Some((b"CERT".to_vec(), b"SECRET-KEY".to_vec())) };
        let text = format!("{tls:?}");
        assert!(
            !text.contains("SECRET") && !text.contains("67, 65") && text.contains("<certificate and key>"),
            "{text}"
        );
    }

    #[test]
    fn progress_requests_are_trusted_from_the_fixed_versions() {
        for v in ["3.4.31", "3.4.35", "3.5.13", "3.5.21", "3.6.0", "v3.6.4", "3.7.0-alpha.0", "4.0.0"] {
            assert!(progress_requests_trusted(v), "{v}");
        }
        for v in ["3.4.23", "3.4.30", "3.5.0", "3.5.12", "3.3.27", "", "garbage", "3.5"] {
            assert!(!progress_requests_trusted(v), "{v}");
        }
    }
}
