//! Storage benchmark: each backend beside the raw engine beneath it, measured in the same
//! run so the ratios mean something on whatever machine runs it.
//!
//!     cargo bench -p storage                 # embedded and etcd
//!     cargo bench -p storage -- embedded     # only one backend
//!     BENCH_SECONDS=5 cargo bench -p storage # longer runs per figure
//!
//! Figures: puts/s at concurrency 1 and 16, gets/s, one range of 1,000 keys, and watch
//! delivery latency (write issued → event received) p50/p99.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rusqlite::{params, Connection};
use storage::embedded::SqliteStore;
use storage::etcd::EtcdStore;
use storage::etcd_test_server::EtcdServer;
use storage::{Range, Store};

const VALUE: &[u8] = &[b'x'; 1024];

fn seconds() -> Duration {
    let s = std::env::var("BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    Duration::from_secs_f64(s)
}

struct Row {
    what: String,
    ours: f64,
    raw: Option<f64>,
    unit: &'static str,
    higher_is_better: bool,
}

fn print(backend: &str, rows: &[Row]) {
    println!("\n{backend}");
    println!("  {:<26} {:>14} {:>14} {:>8}", "measure", "store", "raw engine", "ratio");
    for r in rows {
        let raw = r.raw.map_or("-".to_string(), |v| fmt(v, r.unit));
        let ratio = match r.raw {
            Some(raw) if raw > 0.0 && r.ours > 0.0 => {
                let ratio = if r.higher_is_better { r.ours / raw } else { raw / r.ours };
                format!("{:.0}%", ratio * 100.0)
            }
            _ => "-".into(),
        };
        println!("  {:<26} {:>14} {:>14} {:>8}", r.what, fmt(r.ours, r.unit), raw, ratio);
    }
}

fn fmt(v: f64, unit: &str) -> String {
    match unit {
        "/s" => format!("{:.0}/s", v),
        _ => format!("{:.2} ms", v),
    }
}

/// Run `op` from `concurrency` tasks for the bench duration; operations per second.
async fn rate<F, Fut>(concurrency: usize, op: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let counter = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (op, counter) = (op.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                op(n).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("bench task");
    }
    counter.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// The same for blocking operations on OS threads.
fn rate_threads<F>(concurrency: usize, op: F) -> f64
where
    F: Fn(usize, u64) + Send + Sync + 'static,
{
    let op = Arc::new(op);
    let counter = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let threads: Vec<_> = (0..concurrency)
        .map(|t| {
            let (op, counter) = (op.clone(), counter.clone());
            std::thread::spawn(move || {
                while Instant::now() < deadline {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    op(t, n);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("bench thread");
    }
    counter.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Store-level figures, the same for both backends.
async fn store_figures(store: Arc<dyn Store>) -> (f64, f64, f64, f64, (f64, f64)) {
    let s = store.clone();
    let put1 = rate(1, move |n| {
        let s = s.clone();
        async move {
            s.create(&format!("/bench/c1/{n:08}"), VALUE.into()).await.expect("create");
        }
    })
    .await;
    let s = store.clone();
    let put16 = rate(16, move |n| {
        let s = s.clone();
        async move {
            s.create(&format!("/bench/c16/{n:08}"), VALUE.into()).await.expect("create");
        }
    })
    .await;
    for i in 0..1000 {
        store.create(&format!("/bench/range/{i:04}"), VALUE.into()).await.expect("create");
    }
    let s = store.clone();
    let get = rate(1, move |n| {
        let s = s.clone();
        async move {
            let key = format!("/bench/range/{:04}", n % 1000);
            s.get(&key).await.expect("get").1.expect("present");
        }
    })
    .await;
    let started = Instant::now();
    let mut ranges = 0;
    while started.elapsed() < seconds() {
        let r = store.range(Range::prefix("/bench/range/")).await.expect("range");
        assert_eq!(r.kvs.len(), 1000);
        ranges += 1;
    }
    let range_ms = started.elapsed().as_secs_f64() * 1000.0 / ranges as f64;
    let watch = watch_latency(store).await;
    (put1, put16, get, range_ms, watch)
}

/// Write issued → event received, over sequential writes with one watcher.
async fn watch_latency(store: Arc<dyn Store>) -> (f64, f64) {
    let from = store.current_revision().await.expect("revision");
    let mut w = store.watch("/bench/watch/", from).await.expect("watch");
    let mut lat = Vec::new();
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < seconds() || lat.len() < 200 {
        let t = Instant::now();
        store.create(&format!("/bench/watch/{i:08}"), VALUE.into()).await.expect("create");
        match w.next().await {
            Some(Ok(_)) => lat.push(t.elapsed().as_secs_f64() * 1000.0),
            other => panic!("watch failed: {other:?}"),
        }
        i += 1;
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    (percentile(&lat, 0.5), percentile(&lat, 0.99))
}

fn raw_sqlite_conn(path: &std::path::Path) -> Connection {
    let c = Connection::open(path).expect("open");
    c.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 10000; \
         CREATE TABLE IF NOT EXISTS kv (id INTEGER PRIMARY KEY AUTOINCREMENT, name BLOB NOT NULL, \
         created INTEGER NOT NULL, deleted INTEGER NOT NULL, prev_revision INTEGER NOT NULL, value BLOB NOT NULL); \
         CREATE INDEX IF NOT EXISTS kv_name_id ON kv (name, id DESC);",
    )
    .expect("schema");
    c
}

/// Raw SQLite: the same table, one INSERT per transaction, no compare, no watch.
fn raw_sqlite(dir: &std::path::Path) -> (f64, f64, f64, f64) {
    let path = dir.join("raw.db");
    let conn = std::sync::Mutex::new(raw_sqlite_conn(&path));
    let insert = |c: &Connection, name: String| {
        c.prepare_cached("INSERT INTO kv (name, created, deleted, prev_revision, value) VALUES (?1, 0, 0, 0, ?2)")
            .expect("prepare")
            .execute(params![name.as_bytes(), VALUE])
            .expect("insert");
    };
    let conn = Arc::new(conn);
    let c1 = conn.clone();
    let put1 = rate_threads(1, move |_, n| insert(&c1.lock().expect("lock"), format!("/bench/c1/{n:08}")));
    let path16 = path.clone();
    let conns: Arc<Vec<std::sync::Mutex<Connection>>> =
        Arc::new((0..16).map(|_| std::sync::Mutex::new(raw_sqlite_conn(&path16))).collect());
    let cs = conns.clone();
    let put16 = rate_threads(16, move |t, n| {
        let c = cs[t].lock().expect("lock");
        c.execute_batch("BEGIN IMMEDIATE").expect("begin");
        insert(&c, format!("/bench/c16/{n:08}"));
        c.execute_batch("COMMIT").expect("commit");
    });
    {
        let c = conn.lock().expect("lock");
        for i in 0..1000 {
            insert(&c, format!("/bench/range/{i:04}"));
        }
    }
    let c2 = conn.clone();
    let get = rate_threads(1, move |_, n| {
        let c = c2.lock().expect("lock");
        let mut stmt =
            c.prepare_cached("SELECT id, value FROM kv WHERE name = ?1 ORDER BY id DESC LIMIT 1").expect("prepare");
        let _: (i64, Vec<u8>) = stmt
            .query_row([format!("/bench/range/{:04}", n % 1000).as_bytes()], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("get");
    });
    let c = conn.lock().expect("lock");
    let started = Instant::now();
    let mut ranges = 0;
    while started.elapsed() < seconds() {
        let mut stmt = c
            .prepare_cached("SELECT id, name, value FROM kv WHERE name >= ?1 AND name < ?2 ORDER BY name")
            .expect("prepare");
        let n = stmt
            .query_map(params![b"/bench/range/".as_slice(), b"/bench/range0".as_slice()], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, Vec<u8>>(2)?))
            })
            .expect("range")
            .count();
        assert_eq!(n, 1000);
        ranges += 1;
    }
    let range_ms = started.elapsed().as_secs_f64() * 1000.0 / ranges as f64;
    (put1, put16, get, range_ms)
}

/// Raw etcd compare-and-swap creates: the etcd transaction every guarded write needs
/// (compare create_revision = 0, then put), without our prev-value and failure reads.
async fn raw_etcd_cas(endpoint: &str, concurrency: usize) -> f64 {
    use etcd_client::{Compare, CompareOp, TxnOp};
    let client = etcd_client::Client::connect([endpoint], None).await.expect("connect etcd");
    rate(concurrency, move |n| {
        let mut c = client.clone();
        async move {
            let key = format!("/rawcas/c{concurrency}/{n:08}");
            let txn = etcd_client::Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.as_str(), VALUE, None)]);
            assert!(c.txn(txn).await.expect("txn").succeeded());
        }
    })
    .await
}

/// Raw etcd: direct etcd-client puts, gets and prefix gets; watch latency with a raw watch.
async fn raw_etcd(endpoint: &str) -> (f64, f64, f64, f64, (f64, f64)) {
    let client = etcd_client::Client::connect([endpoint], None).await.expect("connect etcd");
    let c = client.clone();
    let put1 = rate(1, move |n| {
        let mut c = c.clone();
        async move {
            c.put(format!("/raw/c1/{n:08}"), VALUE, None).await.expect("put");
        }
    })
    .await;
    let c = client.clone();
    let put16 = rate(16, move |n| {
        let mut c = c.clone();
        async move {
            c.put(format!("/raw/c16/{n:08}"), VALUE, None).await.expect("put");
        }
    })
    .await;
    let mut c = client.clone();
    for i in 0..1000 {
        c.put(format!("/raw/range/{i:04}"), VALUE, None).await.expect("put");
    }
    let c2 = client.clone();
    let get = rate(1, move |n| {
        let mut c = c2.clone();
        async move {
            c.get(format!("/raw/range/{:04}", n % 1000), None).await.expect("get");
        }
    })
    .await;
    let started = Instant::now();
    let mut ranges = 0;
    while started.elapsed() < seconds() {
        let r = c.get("/raw/range/", Some(etcd_client::GetOptions::new().with_prefix())).await.expect("range");
        assert_eq!(r.kvs().len(), 1000);
        ranges += 1;
    }
    let range_ms = started.elapsed().as_secs_f64() * 1000.0 / ranges as f64;

    let mut wc = client.clone();
    let mut stream =
        wc.watch("/raw/watch/", Some(etcd_client::WatchOptions::new().with_prefix())).await.expect("watch");
    let mut lat = Vec::new();
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < seconds() || lat.len() < 200 {
        let t = Instant::now();
        c.put(format!("/raw/watch/{i:08}"), VALUE, None).await.expect("put");
        loop {
            let resp = stream.message().await.expect("watch").expect("watch open");
            if !resp.events().is_empty() {
                break;
            }
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        i += 1;
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    (put1, put16, get, range_ms, (percentile(&lat, 0.5), percentile(&lat, 0.99)))
}

/// A range over keys with a long uncompacted history, beside the same range over keys
/// written once (the baseline, same store, same run): `keys` keys of 16 KiB values, each
/// rewritten `versions` times. A list must cost what the live keys weigh, not their history.
async fn history_range(store: Arc<dyn Store>, keys: usize, versions: usize) -> (f64, f64) {
    let value = vec![b'x'; 16 * 1024];
    for i in 0..keys {
        store.create(&format!("/bench/once/{i:04}"), value.clone().into()).await.expect("create");
        let key = format!("/bench/history/{i:04}");
        store.create(&key, value.clone().into()).await.expect("create");
        for _ in 1..versions {
            let (_, kv) = store.get(&key).await.expect("get");
            let rev = kv.expect("present").mod_revision;
            store.update(&key, value.clone().into(), rev).await.expect("update");
        }
    }
    let mut ms = |prefix: &'static str| {
        let store = store.clone();
        async move {
            let started = Instant::now();
            let mut n = 0;
            while started.elapsed() < seconds() {
                let r = store.range(Range::prefix(prefix)).await.expect("range");
                assert_eq!(r.kvs.len(), keys);
                n += 1;
            }
            started.elapsed().as_secs_f64() * 1000.0 / n as f64
        }
    };
    let once = ms("/bench/once/").await;
    let history = ms("/bench/history/").await;
    (history, once)
}

fn rows(ours: (f64, f64, f64, f64, (f64, f64)), raw: (f64, f64, f64, f64), raw_watch: Option<(f64, f64)>) -> Vec<Row> {
    let r = |what: &str, ours, raw, unit, hib| Row { what: what.into(), ours, raw, unit, higher_is_better: hib };
    vec![
        r("puts, concurrency 1", ours.0, Some(raw.0), "/s", true),
        r("puts, concurrency 16", ours.1, Some(raw.1), "/s", true),
        r("gets, concurrency 1", ours.2, Some(raw.2), "/s", true),
        r("range of 1,000 keys", ours.3, Some(raw.3), "ms", false),
        r("watch latency p50", ours.4 .0, raw_watch.map(|w| w.0), "ms", false),
        r("watch latency p99", ours.4 .1, raw_watch.map(|w| w.1), "ms", false),
    ]
}

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wants = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    println!("storage benchmark: {:?} per figure, 1 KiB values", seconds());

    if wants("embedded") {
        let dir = tempfile::tempdir().expect("temp dir");
        let raw = raw_sqlite(dir.path());
        let ours = rt.block_on(async {
            let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("store.db")).expect("open"));
            store_figures(store).await
        });
        print("embedded (SQLite WAL) vs raw SQLite transactions", &rows(ours, raw, None));
        let (history, once) = rt.block_on(async {
            let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("history.db")).expect("open"));
            history_range(store, 100, 50).await
        });
        let row = Row {
            what: "range of 100 keys x 50 revisions".into(),
            ours: history,
            raw: Some(once),
            unit: "ms",
            higher_is_better: false,
        };
        print("embedded: a range over uncompacted history vs the same keys written once (16 KiB values)", &[row]);
    }
    if wants("etcd") {
        let server = EtcdServer::start().expect("start etcd (install Debian's etcd-server)");
        let endpoint = server.endpoint();
        let (ours, raw, cas) = rt.block_on(async {
            let raw = raw_etcd(&endpoint).await;
            let cas = (raw_etcd_cas(&endpoint, 1).await, raw_etcd_cas(&endpoint, 16).await);
            let store: Arc<dyn Store> =
                Arc::new(EtcdStore::connect(std::slice::from_ref(&endpoint)).await.expect("connect"));
            (store_figures(store).await, raw, cas)
        });
        let mut table = rows(ours, (raw.0, raw.1, raw.2, raw.3), Some(raw.4));
        let r =
            |what: &str, ours, raw| Row { what: what.into(), ours, raw: Some(raw), unit: "/s", higher_is_better: true };
        table.insert(2, r("  vs raw CAS txn, conc. 1", ours.0, cas.0));
        table.insert(3, r("  vs raw CAS txn, conc. 16", ours.1, cas.1));
        print("etcd backend vs raw etcd-client (puts; and CAS txns as every guarded write needs)", &table);
        drop(server);
    }
}
