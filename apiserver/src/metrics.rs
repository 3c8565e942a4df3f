//! Prometheus metrics: requests by verb/resource/code with latency, watchers, in-flight
//! requests, and storage latency (through [`MeteredStore`]).

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};
use storage::{Range, RangeResult, Revision, Store, Txn, TxnOutcome, WatchStream};

pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub latency: HistogramVec,
    pub watchers: IntGaugeVec,
    pub inflight: IntGaugeVec,
    pub storage_latency: HistogramVec,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("apiserver_request_total", "Requests by verb, resource, subresource and HTTP code."),
            &["verb", "group", "resource", "subresource", "code"],
        )
        .unwrap_or_else(|e| panic!("static metric definition: {e}"));
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "apiserver_request_duration_seconds",
                "Request latency (for watches: until the stream starts).",
            )
            .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            &["verb", "group", "resource", "subresource"],
        )
        .unwrap_or_else(|e| panic!("static metric definition: {e}"));
        let watchers = IntGaugeVec::new(
            Opts::new("apiserver_registered_watchers", "Open watch streams by resource."),
            &["group", "resource"],
        )
        .unwrap_or_else(|e| panic!("static metric definition: {e}"));
        let inflight = IntGaugeVec::new(
            Opts::new("apiserver_current_inflight_requests", "Requests being served, by kind (readOnly, mutating)."),
            &["request_kind"],
        )
        .unwrap_or_else(|e| panic!("static metric definition: {e}"));
        let storage_latency = HistogramVec::new(
            HistogramOpts::new("apiserver_storage_request_duration_seconds", "Storage call latency by operation.")
                .buckets(vec![0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0]),
            &["operation", "outcome"],
        )
        .unwrap_or_else(|e| panic!("static metric definition: {e}"));
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(latency.clone()),
            Box::new(watchers.clone()),
            Box::new(inflight.clone()),
            Box::new(storage_latency.clone()),
        ] {
            if let Err(e) = registry.register(c) {
                tracing::error!(error = %e, "metric registration failed");
            }
        }
        Arc::new(Metrics { registry, requests, latency, watchers, inflight, storage_latency })
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// A guard that keeps a gauge incremented while alive.
pub struct GaugeGuard(prometheus::IntGauge);

impl GaugeGuard {
    pub fn new(g: prometheus::IntGauge) -> Self {
        g.inc();
        GaugeGuard(g)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A [`Store`] that records the latency of every call.
pub struct MeteredStore {
    inner: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    pub fn new(inner: Arc<dyn Store>, metrics: Arc<Metrics>) -> Self {
        MeteredStore { inner, metrics }
    }
    fn observe<T>(&self, op: &str, start: Instant, r: &storage::Result<T>) {
        let outcome = if r.is_ok() { "ok" } else { "error" };
        self.metrics.storage_latency.with_label_values(&[op, outcome]).observe(start.elapsed().as_secs_f64());
    }
}

#[async_trait]
impl Store for MeteredStore {
    async fn current_revision(&self) -> storage::Result<Revision> {
        let t = Instant::now();
        let r = self.inner.current_revision().await;
        self.observe("current_revision", t, &r);
        r
    }
    async fn range(&self, range: Range) -> storage::Result<RangeResult> {
        let t = Instant::now();
        let r = self.inner.range(range).await;
        self.observe("range", t, &r);
        r
    }
    /// Forwarded, not left to the trait's default (a range over the key as a prefix): a
    /// backend's own `get` reads only the newest revision, where the range reads every
    /// revision still kept (a Service update reads the allocation bitmaps this way, and each
    /// Service created adds a revision of them).
    async fn get(&self, key: &str) -> storage::Result<(Revision, Option<storage::KeyValue>)> {
        let t = Instant::now();
        let r = self.inner.get(key).await;
        self.observe("get", t, &r);
        r
    }
    async fn txn(&self, txn: Txn) -> storage::Result<TxnOutcome> {
        let t = Instant::now();
        let r = self.inner.txn(txn).await;
        self.observe("txn", t, &r);
        r
    }
    async fn watch(&self, prefix: &str, after_revision: Revision) -> storage::Result<WatchStream> {
        let t = Instant::now();
        let r = self.inner.watch(prefix, after_revision).await;
        self.observe("watch", t, &r);
        r
    }
    async fn watch_with_progress(
        &self,
        prefix: &str,
        after_revision: Revision,
    ) -> storage::Result<storage::ProgressWatchStream> {
        let t = Instant::now();
        let r = self.inner.watch_with_progress(prefix, after_revision).await;
        self.observe("watch", t, &r);
        r
    }
    async fn compact(&self, revision: Revision) -> storage::Result<()> {
        let t = Instant::now();
        let r = self.inner.compact(revision).await;
        self.observe("compact", t, &r);
        r
    }
    async fn compacted_revision(&self) -> storage::Result<Revision> {
        let t = Instant::now();
        let r = self.inner.compacted_revision().await;
        self.observe("compacted_revision", t, &r);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A store that counts its range reads.
    struct Counting(Arc<dyn Store>, AtomicUsize);

    #[async_trait]
    impl Store for Counting {
        async fn current_revision(&self) -> storage::Result<Revision> {
            self.0.current_revision().await
        }
        async fn range(&self, range: Range) -> storage::Result<RangeResult> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.range(range).await
        }
        async fn get(&self, key: &str) -> storage::Result<(Revision, Option<storage::KeyValue>)> {
            self.0.get(key).await
        }
        async fn txn(&self, txn: Txn) -> storage::Result<TxnOutcome> {
            self.0.txn(txn).await
        }
        async fn watch(&self, prefix: &str, after_revision: Revision) -> storage::Result<storage::WatchStream> {
            self.0.watch(prefix, after_revision).await
        }
        async fn compact(&self, revision: Revision) -> storage::Result<()> {
            self.0.compact(revision).await
        }
        async fn compacted_revision(&self) -> storage::Result<Revision> {
            self.0.compacted_revision().await
        }
    }

    #[tokio::test]
    async fn get_goes_to_the_backend_s_own_get_not_a_range() {
        let dir = tempfile::tempdir().unwrap();
        let sqlite: Arc<dyn Store> = Arc::new(storage::embedded::SqliteStore::open(dir.path().join("db")).unwrap());
        let counting = Arc::new(Counting(sqlite, AtomicUsize::new(0)));
        let metered = MeteredStore::new(counting.clone(), Metrics::new());
        metered.create("/k", bytes::Bytes::from_static(b"v")).await.unwrap();
        let (_, kv) = metered.get("/k").await.unwrap();
        assert_eq!(kv.unwrap().value.as_ref(), b"v");
        assert_eq!(counting.1.load(Ordering::SeqCst), 0, "no range read for a get");
    }
}
