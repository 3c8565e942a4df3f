//! The conformance suite every [`Store`] backend must pass, run by each backend's
//! integration tests through [`conformance_tests!`](crate::conformance_tests).
//!
//! Each check takes a fresh, empty store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use crate::{
    Error, Event, EventKind, Op, ProgressWatchStream, Range, Revision, Store, Txn, TxnOutcome, WatchItem, WatchStream,
};

/// A store under test plus whatever keeps it alive (temp dir, etcd process).
pub struct Fixture {
    pub store: Arc<dyn Store>,
    pub guard: Box<dyn Send>,
}

/// Generate one `#[tokio::test]` per conformance check. `$fixture` is an async function
/// returning a [`Fixture`] with an empty store.
#[macro_export]
macro_rules! conformance_tests {
    ($fixture:path) => {
        $crate::conformance_tests!(@each $fixture;
            crud_and_revisions, range_prefix_limit_start, range_at_past_revision, txn_is_all_or_nothing,
            watch_delivers_changes_with_prev, watch_resumes_from_every_revision, compaction,
            large_values, ten_thousand_keys, concurrent_writers_lose_nothing, slow_watcher_loses_nothing,
            watch_progress_on_quiet_prefix, watch_progress_is_ordered, concurrent_reads_see_completed_writes);
    };
    (@each $fixture:path; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let fixture = $fixture().await;
                $crate::testsuite::$name(fixture.store.clone()).await;
                drop(fixture);
            }
        )*
    };
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Collect `n` events from a watch, failing after a generous deadline.
pub async fn take_events(stream: &mut WatchStream, n: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(20), stream.next()).await {
            Ok(Some(Ok(e))) => out.push(e),
            Ok(Some(Err(e))) => panic!("watch failed after {} of {n} events: {e}", out.len()),
            Ok(None) => panic!("watch ended after {} of {n} events", out.len()),
            Err(_) => panic!("timed out waiting for watch events: got {} of {n}", out.len()),
        }
    }
    out
}

/// Assert that no further event arrives within a short while.
async fn assert_quiet(stream: &mut WatchStream) {
    if let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(300), stream.next()).await {
        panic!("unexpected extra watch item: {item:?}");
    }
}

/// A watch from a compacted revision must fail, from the call or as the first item.
async fn expect_watch_compacted(store: &dyn Store, prefix: &str, after: Revision) {
    match store.watch(prefix, after).await {
        Err(Error::Compacted { .. }) => {}
        Err(e) => panic!("watch from compacted revision {after}: wrong error {e}"),
        Ok(mut stream) => match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            Ok(Some(Err(Error::Compacted { .. }))) => {}
            other => panic!("watch from compacted revision {after}: expected Compacted, got {other:?}"),
        },
    }
}

pub async fn crud_and_revisions(store: Arc<dyn Store>) {
    let r0 = store.current_revision().await.unwrap();
    let r1 = store.create("/t/a", b("1")).await.unwrap();
    assert!(r1 > r0, "create must raise the revision");
    assert!(matches!(store.create("/t/a", b("x")).await, Err(Error::AlreadyExists { .. })));

    let (rev, kv) = store.get("/t/a").await.unwrap();
    let kv = kv.expect("created key is readable");
    assert!(rev >= r1);
    assert_eq!((kv.value.as_ref(), kv.create_revision, kv.mod_revision), (&b"1"[..], r1, r1));

    let r2 = store.update("/t/a", b("2"), r1).await.unwrap();
    assert!(r2 > r1);
    match store.update("/t/a", b("stale"), r1).await {
        Err(Error::Conflict { current: Some(cur), expected, .. }) => {
            assert_eq!((cur.mod_revision, cur.value.as_ref(), expected), (r2, &b"2"[..], r1));
        }
        other => panic!("stale update must conflict with the current value, got {other:?}"),
    }
    let kv = store.get("/t/a").await.unwrap().1.unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.value.as_ref()), (r1, r2, &b"2"[..]));

    assert!(matches!(store.delete("/t/a", Some(r1)).await, Err(Error::Conflict { .. })));
    let (r3, deleted) = store.delete("/t/a", Some(r2)).await.unwrap();
    assert!(r3 > r2);
    assert_eq!(deleted.value.as_ref(), b"2");
    assert_eq!(store.get("/t/a").await.unwrap().1, None);
    assert!(matches!(store.delete("/t/a", None).await, Err(Error::NotFound { .. })));
    assert!(matches!(store.update("/t/a", b("3"), r2).await, Err(Error::Conflict { current: None, .. })));

    let r4 = store.create("/t/a", b("again")).await.unwrap();
    let kv = store.get("/t/a").await.unwrap().1.unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision), (r4, r4), "a re-created key starts a new incarnation");
    assert_eq!(store.current_revision().await.unwrap(), r4);
}

pub async fn range_prefix_limit_start(store: Arc<dyn Store>) {
    for k in ["/r/b/2", "/r/a/1", "/r/a/3", "/r/a/2", "/r/ab", "/s/a/1"] {
        store.create(k, b(k)).await.unwrap();
    }
    let all = store.range(Range::prefix("/r/a/")).await.unwrap();
    let keys: Vec<_> = all.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/r/a/1", "/r/a/2", "/r/a/3"]);
    assert!(!all.more);
    assert_eq!(all.revision, store.current_revision().await.unwrap());

    let page = store.range(Range::prefix("/r/").limit(2)).await.unwrap();
    assert_eq!(page.kvs.iter().map(|kv| kv.key.as_str()).collect::<Vec<_>>(), ["/r/a/1", "/r/a/2"]);
    assert!(page.more);
    let rest = store.range(Range::prefix("/r/").start("/r/a/3").at(page.revision).limit(10)).await.unwrap();
    assert_eq!(rest.kvs.iter().map(|kv| kv.key.as_str()).collect::<Vec<_>>(), ["/r/a/3", "/r/ab", "/r/b/2"]);
    assert!(!rest.more);
    let exact = store.range(Range::prefix("/r/").limit(5)).await.unwrap();
    assert!(!exact.more, "limit equal to the number of keys has no more");
    assert!(store.range(Range::prefix("/nothing/")).await.unwrap().kvs.is_empty());
}

pub async fn range_at_past_revision(store: Arc<dyn Store>) {
    let r1 = store.create("/p/x", b("v1")).await.unwrap();
    let r2 = store.update("/p/x", b("v2"), r1).await.unwrap();
    let r3 = store.create("/p/y", b("y")).await.unwrap();
    let (r4, _) = store.delete("/p/x", None).await.unwrap();

    let at = |rev| {
        let store = store.clone();
        async move {
            let r = store.range(Range::prefix("/p/").at(rev)).await.unwrap();
            assert_eq!(r.revision, rev);
            r.kvs.into_iter().map(|kv| (kv.key, String::from_utf8(kv.value.to_vec()).unwrap())).collect::<Vec<_>>()
        }
    };
    assert_eq!(at(r1).await, [("/p/x".into(), "v1".into())]);
    assert_eq!(at(r2).await, [("/p/x".into(), "v2".into())]);
    assert_eq!(at(r3).await, [("/p/x".into(), "v2".into()), ("/p/y".into(), "y".into())]);
    assert_eq!(at(r4).await, [("/p/y".into(), "y".into())]);
    match store.range(Range::prefix("/p/").at(r4 + 100)).await {
        Err(Error::FutureRevision { requested, .. }) => assert_eq!(requested, r4 + 100),
        other => panic!("a future revision must be refused, got {other:?}"),
    }
}

pub async fn txn_is_all_or_nothing(store: Arc<dyn Store>) {
    let ra = store.create("/x/a", b("a")).await.unwrap();
    // One compare fails (b is expected present): nothing is written.
    let outcome = store
        .txn(Txn {
            compares: vec![("/x/a".into(), ra), ("/x/b".into(), 12345)],
            ops: vec![Op::Put { key: "/x/a".into(), value: b("a2") }, Op::Put { key: "/x/c".into(), value: b("c") }],
        })
        .await
        .unwrap();
    match outcome {
        TxnOutcome::Failed { current, .. } => {
            assert_eq!(current.len(), 2);
            assert_eq!(current[0].as_ref().map(|kv| kv.mod_revision), Some(ra));
            assert_eq!(current[1], None);
        }
        other => panic!("expected a failed txn, got {other:?}"),
    }
    assert_eq!(store.get("/x/a").await.unwrap().1.unwrap().value.as_ref(), b"a");
    assert_eq!(store.get("/x/c").await.unwrap().1, None);

    // Both compares hold: every op applies.
    let outcome = store
        .txn(Txn {
            compares: vec![("/x/a".into(), ra), ("/x/b".into(), 0)],
            ops: vec![Op::Put { key: "/x/b".into(), value: b("b") }, Op::Delete { key: "/x/a".into() }],
        })
        .await
        .unwrap();
    match outcome {
        TxnOutcome::Committed { revision, prev } => {
            assert!(revision > ra);
            assert_eq!(prev[0], None);
            assert_eq!(prev[1].as_ref().map(|kv| kv.value.as_ref()), Some(&b"a"[..]));
            assert_eq!(store.current_revision().await.unwrap(), revision);
        }
        other => panic!("expected a committed txn, got {other:?}"),
    }
    assert_eq!(store.get("/x/a").await.unwrap().1, None);
    assert_eq!(store.get("/x/b").await.unwrap().1.unwrap().value.as_ref(), b"b");
}

pub async fn watch_delivers_changes_with_prev(store: Arc<dyn Store>) {
    store.create("/other/k", b("noise")).await.unwrap();
    let start = store.current_revision().await.unwrap();
    let mut w = store.watch("/w/", start).await.unwrap();
    let r1 = store.create("/w/a", b("1")).await.unwrap();
    store.create("/other/k2", b("noise")).await.unwrap();
    let r2 = store.update("/w/a", b("2"), r1).await.unwrap();
    let (r3, _) = store.delete("/w/a", Some(r2)).await.unwrap();

    let ev = take_events(&mut w, 3).await;
    assert_eq!(ev[0].kind, EventKind::Put);
    assert_eq!((ev[0].kv.mod_revision, ev[0].kv.create_revision, ev[0].prev.clone()), (r1, r1, None));
    assert_eq!(ev[1].kind, EventKind::Put);
    assert_eq!(ev[1].kv.value.as_ref(), b"2");
    assert_eq!(ev[1].prev.as_ref().map(|p| (p.mod_revision, p.value.as_ref())), Some((r1, &b"1"[..])));
    assert_eq!(ev[2].kind, EventKind::Delete);
    assert_eq!(ev[2].kv.mod_revision, r3);
    assert_eq!((ev[2].kv.key.as_str(), ev[2].kv.create_revision), ("/w/a", r1));
    assert_eq!(ev[2].prev.as_ref().map(|p| (p.mod_revision, p.value.as_ref())), Some((r2, &b"2"[..])));
    assert_quiet(&mut w).await;
}

pub async fn watch_resumes_from_every_revision(store: Arc<dyn Store>) {
    let base = store.current_revision().await.unwrap();
    // A mix of creates, updates and deletes over a few keys, interleaved with other keys.
    let mut expected: Vec<(Revision, EventKind, String)> = Vec::new();
    let mut mods: BTreeMap<String, Revision> = BTreeMap::new();
    for i in 0..60 {
        let key = format!("/res/{}", i % 7);
        let rev = match mods.get(&key) {
            Some(&m) if i % 5 == 0 => {
                let (rev, _) = store.delete(&key, Some(m)).await.unwrap();
                mods.remove(&key);
                expected.push((rev, EventKind::Delete, key));
                continue;
            }
            Some(&m) => store.update(&key, b(&i.to_string()), m).await.unwrap(),
            None => store.create(&key, b(&i.to_string())).await.unwrap(),
        };
        mods.insert(key.clone(), rev);
        expected.push((rev, EventKind::Put, key));
        store.create(&format!("/resx/{i}"), b("noise")).await.unwrap();
    }
    let end = store.current_revision().await.unwrap();
    for from in base..=end {
        let want: Vec<_> = expected.iter().filter(|(r, _, _)| *r > from).cloned().collect();
        let mut w = store.watch("/res/", from).await.unwrap();
        let got: Vec<_> =
            take_events(&mut w, want.len()).await.into_iter().map(|e| (e.kv.mod_revision, e.kind, e.kv.key)).collect();
        assert_eq!(got, want, "watch from revision {from}");
        assert_quiet(&mut w).await;
    }
}

pub async fn compaction(store: Arc<dyn Store>) {
    let r1 = store.create("/c/a", b("a1")).await.unwrap();
    let r2 = store.update("/c/a", b("a2"), r1).await.unwrap();
    let rb = store.create("/c/b", b("b1")).await.unwrap();
    let (rd, _) = store.delete("/c/b", None).await.unwrap();
    let r3 = store.update("/c/a", b("a3"), r2).await.unwrap();
    let rk = store.create("/c/keep", b("k")).await.unwrap();

    store.compact(r3).await.unwrap();
    assert_eq!(store.compacted_revision().await.unwrap(), r3);
    store.compact(r1).await.unwrap(); // compacting to an older revision is a no-op

    // Reads before the compaction revision fail; at and after it they work.
    for rev in [r1, r2, rb, rd] {
        match store.range(Range::prefix("/c/").at(rev)).await {
            Err(Error::Compacted { .. }) => {}
            other => panic!("range at compacted revision {rev}: expected Compacted, got {other:?}"),
        }
    }
    let at = store.range(Range::prefix("/c/").at(r3)).await.unwrap();
    assert_eq!(at.kvs.iter().map(|kv| kv.key.as_str()).collect::<Vec<_>>(), ["/c/a"]);
    let now = store.range(Range::prefix("/c/")).await.unwrap();
    assert_eq!(now.kvs.iter().map(|kv| kv.value.as_ref()).collect::<Vec<_>>(), [&b"a3"[..], &b"k"[..]]);
    assert_eq!(now.kvs[0].create_revision, r1, "compaction keeps create revisions");

    expect_watch_compacted(store.as_ref(), "/c/", r1).await;

    // A watch from the compaction revision works, and later events keep their prev values.
    let mut w = store.watch("/c/", r3).await.unwrap();
    let (rdel, _) = store.delete("/c/a", Some(r3)).await.unwrap();
    let ev = take_events(&mut w, 2).await;
    assert_eq!(ev[0].kv.mod_revision, rk);
    assert_eq!((ev[1].kind, ev[1].kv.mod_revision), (EventKind::Delete, rdel));
    assert_eq!(ev[1].prev.as_ref().map(|p| p.value.as_ref()), Some(&b"a3"[..]));

    // Revisions keep rising after compaction.
    let r5 = store.create("/c/new", b("n")).await.unwrap();
    assert!(r5 > rdel);
    assert!(matches!(store.compact(r5 + 10).await, Err(Error::FutureRevision { .. })));
}

pub async fn large_values(store: Arc<dyn Store>) {
    let big: Vec<u8> = (0..(3 * 1024 * 1024 / 2)).map(|i| (i % 251) as u8).collect();
    let start = store.current_revision().await.unwrap();
    let mut w = store.watch("/big/", start).await.unwrap();
    let r = store.create("/big/one", Bytes::from(big.clone())).await.unwrap();
    let kv = store.get("/big/one").await.unwrap().1.unwrap();
    assert_eq!(kv.value.len(), big.len());
    assert!(kv.value.as_ref() == big.as_slice());
    let ev = take_events(&mut w, 1).await;
    assert_eq!(ev[0].kv.mod_revision, r);
    assert!(ev[0].kv.value.as_ref() == big.as_slice());
}

pub async fn ten_thousand_keys(store: Arc<dyn Store>) {
    // Write through concurrent tasks, as the apiserver does.
    let mut tasks = Vec::new();
    for t in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in (t..10_000).step_by(8) {
                store.create(&format!("/many/{i:05}"), b(&format!("value-{i}"))).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let all = store.range(Range::prefix("/many/")).await.unwrap();
    assert_eq!(all.kvs.len(), 10_000);
    assert!(all.kvs.windows(2).all(|w| w[0].key < w[1].key), "keys come back in order");

    // Paginate at one revision while writes continue: a consistent snapshot.
    let snapshot = all.revision;
    store.create("/many/zzzz", b("late")).await.unwrap();
    let mut seen = 0;
    let mut next: Option<String> = None;
    loop {
        let mut req = Range::prefix("/many/").at(snapshot).limit(1000);
        if let Some(k) = next.take() {
            req = req.start(k);
        }
        let page = store.range(req).await.unwrap();
        assert_eq!(page.revision, snapshot);
        seen += page.kvs.len();
        match (page.more, page.kvs.last()) {
            (true, Some(last)) => next = Some(format!("{}\0", last.key)),
            _ => break,
        }
    }
    assert_eq!(seen, 10_000, "pages at a fixed revision do not see later writes");
}

pub async fn concurrent_writers_lose_nothing(store: Arc<dyn Store>) {
    store.create("/cnt", b("0")).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            for _ in 0..25 {
                loop {
                    let kv = store.get("/cnt").await.unwrap().1.unwrap();
                    let n: u64 = std::str::from_utf8(&kv.value).unwrap().parse().unwrap();
                    match store.update("/cnt", b(&(n + 1).to_string()), kv.mod_revision).await {
                        Ok(rev) => {
                            revisions.push(rev);
                            break;
                        }
                        Err(Error::Conflict { .. }) => continue,
                        Err(e) => panic!("update failed: {e}"),
                    }
                }
            }
            revisions
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let kv = store.get("/cnt").await.unwrap().1.unwrap();
    assert_eq!(kv.value.as_ref(), b"400");
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 400, "every successful write has its own revision");
}

/// Many concurrent single-key reads (which a backend may coalesce into one request) each
/// see every write completed before they were issued, and only their own key: `/r/a1`
/// is not an answer for `/r/a`.
pub async fn concurrent_reads_see_completed_writes(store: Arc<dyn Store>) {
    store.create("/r/a1", b("a1")).await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..16 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..20 {
                let key = format!("/r/t{t}/{i}");
                let created = store.create(&key, b(&key)).await.unwrap();
                let (read_at, kv) = store.get(&key).await.unwrap();
                let kv = kv.unwrap_or_else(|| panic!("{key} created at {created} but not read back"));
                assert_eq!(
                    (kv.key.as_str(), kv.value.as_ref(), kv.mod_revision),
                    (key.as_str(), key.as_bytes(), created)
                );
                assert!(read_at >= created, "read of {key} at revision {read_at}, before its write {created}");
                let updated = store.update(&key, b("second"), created).await.unwrap();
                assert_eq!(store.get(&key).await.unwrap().1.unwrap().mod_revision, updated);
                let (_, absent) = store.get("/r/a").await.unwrap();
                assert!(absent.is_none(), "/r/a does not exist; got {absent:?}");
                store.delete(&key, Some(updated)).await.unwrap();
                assert!(store.get(&key).await.unwrap().1.is_none(), "{key} read back after its delete");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

pub async fn slow_watcher_loses_nothing(store: Arc<dyn Store>) {
    let start = store.current_revision().await.unwrap();
    let mut w = store.watch("/slow/", start).await.unwrap();
    // Write far more than any buffer holds without reading the watch.
    let mut tasks = Vec::new();
    for t in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..1500 {
                store.create(&format!("/slow/{t}-{i}"), b("v")).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let events = take_events(&mut w, 6000).await;
    assert!(events.windows(2).all(|p| p[0].revision() < p[1].revision()), "events in strictly increasing order");
    assert_quiet(&mut w).await;
}

/// The next item of a watch with progress, failing after a generous deadline.
async fn next_item(stream: &mut ProgressWatchStream) -> WatchItem {
    match tokio::time::timeout(Duration::from_secs(20), stream.next()).await {
        Ok(Some(Ok(item))) => item,
        Ok(Some(Err(e))) => panic!("watch failed: {e}"),
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("no watch item within 20s"),
    }
}

fn item_revision(item: &WatchItem) -> Revision {
    match item {
        WatchItem::Event(e) => e.revision(),
        WatchItem::Progress(r) => *r,
    }
}

pub async fn watch_progress_on_quiet_prefix(store: Arc<dyn Store>) {
    let start = store.current_revision().await.unwrap();
    let mut w = store.watch_with_progress("/quiet/", start).await.unwrap();
    let mut newest = start;
    for i in 0..5 {
        newest = store.create(&format!("/busy/{i}"), b("x")).await.unwrap();
    }
    // Only other prefixes were written: the watch reports progress up to the last write.
    let mut seen = start;
    while seen < newest {
        match next_item(&mut w).await {
            WatchItem::Progress(r) => {
                assert!(r > seen, "progress {r} after {seen} does not advance");
                assert!(r <= newest, "progress {r} beyond the store's revision {newest}");
                seen = r;
            }
            WatchItem::Event(e) => panic!("no event expected on a quiet prefix: {e:?}"),
        }
    }
    // A later write to the prefix still arrives, after the progress.
    let r = store.create("/quiet/a", b("1")).await.unwrap();
    loop {
        match next_item(&mut w).await {
            WatchItem::Progress(p) => assert!(p > seen && p < r, "progress {p} between {seen} and the event at {r}"),
            WatchItem::Event(e) => {
                assert_eq!((e.kv.key.as_str(), e.revision()), ("/quiet/a", r));
                break;
            }
        }
    }

    // A watch resumed from an older revision of the quiet prefix catches up to the newest.
    let mut w = store.watch_with_progress("/busy-and-quiet/", start).await.unwrap();
    let mut seen = start;
    while seen < r {
        let item = next_item(&mut w).await;
        assert!(matches!(item, WatchItem::Progress(_)), "no event expected: {item:?}");
        assert!(item_revision(&item) > seen);
        seen = item_revision(&item);
    }
}

pub async fn watch_progress_is_ordered(store: Arc<dyn Store>) {
    let start = store.current_revision().await.unwrap();
    let mut w = store.watch_with_progress("/ord/", start).await.unwrap();
    // Rounds of concurrent writes inside and outside the prefix, each followed by a pause
    // with writes outside only, so that progress falls between events.
    let mut expected: Vec<Revision> = Vec::new();
    let mut newest = start;
    for round in 0..4 {
        let mut tasks = Vec::new();
        for t in 0..4 {
            let store = store.clone();
            let prefix = if t % 2 == 0 { "/ord/" } else { "/noise/" };
            tasks.push(tokio::spawn(async move {
                let mut revs = Vec::new();
                for i in 0..40 {
                    revs.push((prefix, store.create(&format!("{prefix}{round}-{t}-{i}"), b("v")).await.unwrap()));
                }
                revs
            }));
        }
        for t in tasks {
            for (prefix, rev) in t.await.unwrap() {
                if prefix == "/ord/" {
                    expected.push(rev);
                }
                newest = newest.max(rev);
            }
        }
        for i in 0..3 {
            newest = store.create(&format!("/noise/pause-{round}-{i}"), b("v")).await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    expected.sort();
    // Every item is newer than the one before: a progress never claims a revision that an
    // event still to come has, or is older than.
    let mut events = Vec::new();
    let mut progress = 0;
    let mut prev = start;
    while events.len() < expected.len() || prev < newest {
        let item = next_item(&mut w).await;
        let rev = item_revision(&item);
        assert!(rev > prev, "{item:?} after revision {prev}");
        assert!(rev <= newest, "{item:?} beyond the last write {newest}");
        prev = rev;
        match item {
            WatchItem::Event(e) => {
                assert!(e.kv.key.starts_with("/ord/"), "{e:?}");
                events.push(rev);
            }
            WatchItem::Progress(_) => progress += 1,
        }
    }
    assert_eq!(events, expected, "every event of the prefix, in order");
    assert!(progress > 0, "the quiet pauses were reported as progress");
}
