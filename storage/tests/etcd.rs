//! The etcd backend against a real etcd: one fresh etcd per test (see
//! `storage::etcd_test_server`). Needs the `etcd` binary; fails (never skips) without it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use storage::etcd::{EtcdOptions, EtcdStore};
use storage::etcd_test_server::EtcdServer;
use storage::testsuite::Fixture;
use storage::*;

/// A fresh etcd per conformance check; the guard kills it and removes its directory.
async fn fixture() -> Fixture {
    let etcd = EtcdServer::start_async().await.expect("start etcd");
    let store = EtcdStore::connect(&etcd.endpoints()).await.expect("connect to etcd");
    Fixture { store: Arc::new(store), guard: Box::new(etcd) }
}

storage::conformance_tests!(fixture);

/// etcd-specific checks beyond the conformance suite.
mod etcd_specific {
    use super::*;

    async fn setup() -> (EtcdServer, EtcdStore) {
        let etcd = EtcdServer::start_async().await.expect("start etcd");
        let store = EtcdStore::connect(&etcd.endpoints()).await.expect("connect to etcd");
        (etcd, store)
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    async fn put(store: &EtcdStore, key: &str, value: &str) -> Revision {
        let txn = Txn { compares: vec![], ops: vec![Op::Put { key: key.into(), value: b(value) }] };
        match store.txn(txn).await.expect("put") {
            TxnOutcome::Committed { revision, .. } => revision,
            other => panic!("unguarded put failed: {other:?}"),
        }
    }

    /// Next item of a watch, failing the test after 10 s.
    async fn next_event(stream: &mut WatchStream) -> Result<Event> {
        tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("watch event within 10s")
            .expect("watch stream ended")
    }

    #[tokio::test]
    async fn crud_and_cas() {
        let (_etcd, store) = setup().await;
        let r0 = store.current_revision().await.unwrap();

        let r1 = store.create("/registry/pods/default/a", b("one")).await.unwrap();
        assert_eq!(r1, r0 + 1);
        assert_eq!(store.current_revision().await.unwrap(), r1);
        let (rev, kv) = store.get("/registry/pods/default/a").await.unwrap();
        assert_eq!(rev, r1);
        let kv = kv.expect("created key");
        assert_eq!(kv.value, b("one"));
        assert_eq!((kv.create_revision, kv.mod_revision), (r1, r1));
        // get does not return a key that merely has the name as a prefix
        store.create("/registry/pods/default/ab", b("x")).await.unwrap();
        assert!(store.get("/registry/pods/default/").await.unwrap().1.is_none());

        match store.create("/registry/pods/default/a", b("again")).await {
            Err(Error::AlreadyExists { key }) => assert_eq!(key, "/registry/pods/default/a"),
            other => panic!("expected AlreadyExists, got {other:?}"),
        }

        let r2 = store.update("/registry/pods/default/a", b("two"), r1).await.unwrap();
        assert!(r2 > r1);
        match store.update("/registry/pods/default/a", b("stale"), r1).await {
            Err(Error::Conflict { key, expected, current }) => {
                assert_eq!(key, "/registry/pods/default/a");
                assert_eq!(expected, r1);
                let current = current.expect("current value");
                assert_eq!((current.value.clone(), current.mod_revision, current.create_revision), (b("two"), r2, r1));
            }
            other => panic!("expected Conflict, got {other:?}"),
        }
        // update of an absent key conflicts with current None
        match store.update("/registry/pods/default/nope", b("x"), 5).await {
            Err(Error::Conflict { current: None, .. }) => {}
            other => panic!("expected Conflict with no current value, got {other:?}"),
        }

        match store.delete("/registry/pods/default/a", Some(r1)).await {
            Err(Error::Conflict { current: Some(kv), .. }) => assert_eq!(kv.mod_revision, r2),
            other => panic!("expected Conflict, got {other:?}"),
        }
        let (r3, deleted) = store.delete("/registry/pods/default/a", Some(r2)).await.unwrap();
        assert!(r3 > r2);
        assert_eq!(deleted.value, b("two"));
        assert_eq!(deleted.mod_revision, r2);
        assert!(store.get("/registry/pods/default/a").await.unwrap().1.is_none());
        match store.delete("/registry/pods/default/a", None).await {
            Err(Error::NotFound { .. }) => {}
            other => panic!("expected NotFound, got {other:?}"),
        }
        match store.delete("/registry/pods/default/a", Some(r2)).await {
            Err(Error::NotFound { .. }) => {}
            other => panic!("expected NotFound, got {other:?}"),
        }
        // re-create: a new incarnation
        let r4 = store.create("/registry/pods/default/a", b("three")).await.unwrap();
        let kv = store.get("/registry/pods/default/a").await.unwrap().1.unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision), (r4, r4));
        let (_, deleted) = store.delete("/registry/pods/default/a", None).await.unwrap();
        assert_eq!(deleted.value, b("three"));
    }

    #[tokio::test]
    async fn multi_key_txn() {
        let (_etcd, store) = setup().await;
        let ra = store.create("/t/a", b("a1")).await.unwrap();
        let rb = store.create("/t/b", b("b1")).await.unwrap();

        // Committed: every compare holds; prev per op.
        let txn = Txn {
            compares: vec![("/t/a".into(), ra), ("/t/b".into(), rb), ("/t/c".into(), 0)],
            ops: vec![
                Op::Put { key: "/t/a".into(), value: b("a2") },
                Op::Delete { key: "/t/b".into() },
                Op::Put { key: "/t/c".into(), value: b("c1") },
            ],
        };
        let (rev, prev) = match store.txn(txn).await.unwrap() {
            TxnOutcome::Committed { revision, prev } => (revision, prev),
            other => panic!("expected commit, got {other:?}"),
        };
        assert_eq!(rev, rb + 1, "one txn is one revision");
        assert_eq!(prev.len(), 3);
        assert_eq!(prev[0].as_ref().map(|kv| kv.value.clone()), Some(b("a1")));
        assert_eq!(prev[1].as_ref().map(|kv| (kv.key.clone(), kv.mod_revision)), Some(("/t/b".to_string(), rb)));
        assert_eq!(prev[2], None);
        assert_eq!(store.current_revision().await.unwrap(), rev);

        // Failed: one stale compare; nothing written; current per compare.
        let txn = Txn {
            compares: vec![("/t/a".into(), rev), ("/t/b".into(), rb), ("/t/c".into(), rev)],
            ops: vec![Op::Put { key: "/t/a".into(), value: b("never") }],
        };
        match store.txn(txn).await.unwrap() {
            TxnOutcome::Failed { revision, current } => {
                assert_eq!(revision, rev);
                assert_eq!(current.len(), 3);
                assert_eq!(current[0].as_ref().map(|kv| kv.value.clone()), Some(b("a2")));
                assert_eq!(current[1], None);
                assert_eq!(current[2].as_ref().map(|kv| kv.value.clone()), Some(b("c1")));
            }
            other => panic!("expected failure, got {other:?}"),
        }
        assert_eq!(store.get("/t/a").await.unwrap().1.unwrap().value, b("a2"));
        assert_eq!(store.current_revision().await.unwrap(), rev);

        // Deleting an absent key without a guard commits with prev None.
        match store.txn(Txn { compares: vec![], ops: vec![Op::Delete { key: "/t/zzz".into() }] }).await.unwrap() {
            TxnOutcome::Committed { prev, .. } => assert_eq!(prev, vec![None]),
            other => panic!("expected commit, got {other:?}"),
        }
        // Invalid requests are reported as such.
        let dup = Txn {
            compares: vec![],
            ops: vec![Op::Put { key: "/t/a".into(), value: b("1") }, Op::Put { key: "/t/a".into(), value: b("2") }],
        };
        assert!(matches!(store.txn(dup).await, Err(Error::InvalidRequest(_))), "duplicate key in txn");
    }

    #[tokio::test]
    async fn range_past_revision_limit_and_more() {
        let (_etcd, store) = setup().await;
        let mut revs = Vec::new();
        for i in 0..10 {
            revs.push(put(&store, &format!("/r/k{i:02}"), &format!("v{i}")).await);
        }
        put(&store, "/rx", "outside").await; // shares the byte prefix "/r" but not "/r/"
        put(&store, "/q/k", "outside").await;
        let latest = put(&store, "/r/k00", "v0-updated").await;

        // all
        let all = store.range(Range::prefix("/r/")).await.unwrap();
        assert_eq!(all.revision, latest);
        assert!(!all.more);
        let keys: Vec<_> = all.kvs.iter().map(|kv| kv.key.as_str()).collect();
        let expected: Vec<String> = (0..10).map(|i| format!("/r/k{i:02}")).collect();
        assert_eq!(keys, expected);
        assert_eq!(all.kvs[0].value, b("v0-updated"));

        // at a past revision: only what existed then, with the old values
        let past = store.range(Range::prefix("/r/").at(revs[4])).await.unwrap();
        assert_eq!(past.revision, revs[4]);
        assert_eq!(past.kvs.len(), 5);
        assert_eq!(past.kvs[0].value, b("v0"));
        assert_eq!(past.kvs[4].mod_revision, revs[4]);

        // limit + more + start: paginate
        let mut seen = Vec::new();
        let mut start: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut r = Range::prefix("/r/").limit(3).at(latest);
            if let Some(s) = &start {
                r = r.start(s.clone());
            }
            let page = store.range(r).await.unwrap();
            pages += 1;
            assert_eq!(page.revision, latest);
            seen.extend(page.kvs.iter().map(|kv| kv.key.clone()));
            if !page.more {
                break;
            }
            assert_eq!(page.kvs.len(), 3);
            start = Some(format!("{}\0", page.kvs.last().unwrap().key));
        }
        assert_eq!(pages, 4);
        assert_eq!(seen, expected);
        let exact = store.range(Range::prefix("/r/").limit(10)).await.unwrap();
        assert_eq!((exact.kvs.len(), exact.more), (10, false));

        // future revision
        match store.range(Range::prefix("/r/").at(latest + 100)).await {
            Err(Error::FutureRevision { requested, current }) => {
                assert_eq!((requested, current), (latest + 100, latest))
            }
            other => panic!("expected FutureRevision, got {other:?}"),
        }
        // start outside the prefix
        assert!(matches!(store.range(Range::prefix("/r/").start("/q/")).await, Err(Error::InvalidRequest(_))));
        // the empty prefix is the whole key space
        let everything = store.range(Range::prefix("")).await.unwrap();
        assert_eq!(everything.kvs.len(), 12);
    }

    /// With progress requests on (as for etcd 3.4.31+/3.5.13+; the test etcd is older, so
    /// only a synced watch is asked here), a quiet watch keeps working and reports progress.
    #[tokio::test]
    async fn requested_progress_keeps_the_watch_working() {
        let etcd = EtcdServer::start_async().await.expect("start etcd");
        let opts = EtcdOptions {
            progress_interval: Duration::from_millis(50),
            request_progress: Some(true),
            ..Default::default()
        };
        let store = EtcdStore::connect_with(&etcd.endpoints(), opts).await.expect("connect to etcd");
        let start = put(&store, "/other/0", "x").await;
        let mut w = store.watch_with_progress("/quiet/", start).await.unwrap();
        let mut newest = start;
        for i in 1..5 {
            newest = put(&store, &format!("/other/{i}"), "x").await;
        }
        let mut seen = start;
        while seen < newest {
            match tokio::time::timeout(Duration::from_secs(10), w.next()).await.expect("item within 10s") {
                Some(Ok(WatchItem::Progress(r))) => {
                    assert!(r > seen && r <= newest, "progress {r} after {seen}, newest {newest}");
                    seen = r;
                }
                other => panic!("expected progress, got {other:?}"),
            }
        }
        let r = put(&store, "/quiet/a", "1").await;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), w.next()).await.expect("item within 10s") {
                Some(Ok(WatchItem::Progress(p))) => assert!(p > seen && p < r),
                Some(Ok(WatchItem::Event(e))) => {
                    assert_eq!(e.revision(), r);
                    break;
                }
                other => panic!("expected the event, got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn watch_orders_events_with_prev_values() {
        let (_etcd, store) = setup().await;
        let r0 = put(&store, "/w/before", "b0").await;
        let mut live = store.watch("/w/", r0).await.unwrap();

        let r1 = store.create("/w/a", b("a1")).await.unwrap();
        put(&store, "/other/x", "ignored").await;
        let r2 = store.update("/w/a", b("a2"), r1).await.unwrap();
        let (r3, _) = store.delete("/w/before", None).await.unwrap();
        let txn = Txn {
            compares: vec![],
            ops: vec![Op::Put { key: "/w/b".into(), value: b("b1") }, Op::Put { key: "/w/c".into(), value: b("c1") }],
        };
        let r4 = match store.txn(txn).await.unwrap() {
            TxnOutcome::Committed { revision, .. } => revision,
            other => panic!("{other:?}"),
        };

        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(next_event(&mut live).await.unwrap());
        }
        let summary: Vec<_> = got.iter().map(|e| (e.kind, e.kv.key.as_str(), e.revision())).collect();
        assert_eq!(
            summary,
            vec![
                (EventKind::Put, "/w/a", r1),
                (EventKind::Put, "/w/a", r2),
                (EventKind::Delete, "/w/before", r3),
                (EventKind::Put, "/w/b", r4),
                (EventKind::Put, "/w/c", r4),
            ]
        );
        assert_eq!(got[0].prev, None);
        assert_eq!(got[0].kv.create_revision, r1);
        assert_eq!(got[1].kv.value, b("a2"));
        assert_eq!(got[1].prev.as_ref().map(|kv| (kv.value.clone(), kv.mod_revision)), Some((b("a1"), r1)));
        assert!(got[2].kv.value.is_empty());
        assert_eq!(got[2].prev.as_ref().map(|kv| (kv.value.clone(), kv.mod_revision)), Some((b("b0"), r0)));

        // a watch from a past revision replays the same history
        let mut replay = store.watch("/w/", r0).await.unwrap();
        for want in &got {
            assert_eq!(&next_event(&mut replay).await.unwrap(), want);
        }
        // and one from the middle starts right after it
        let mut middle = store.watch("/w/", r2).await.unwrap();
        assert_eq!(next_event(&mut middle).await.unwrap(), got[2]);
        // a watch from the current revision sees only new events
        let mut fresh = store.watch("/w/", r4).await.unwrap();
        let r5 = put(&store, "/w/d", "d1").await;
        let e = next_event(&mut fresh).await.unwrap();
        assert_eq!((e.kv.key.as_str(), e.revision()), ("/w/d", r5));
        assert_eq!(next_event(&mut live).await.unwrap().revision(), r5);
    }

    #[tokio::test]
    async fn compaction_is_etcds_and_discovered_by_other_clients() {
        let (etcd, store) = setup().await;
        let r1 = store.create("/c/a", b("1")).await.unwrap();
        let r2 = store.update("/c/a", b("2"), r1).await.unwrap();
        let r3 = store.update("/c/a", b("3"), r2).await.unwrap();
        let r4 = store.create("/c/b", b("b")).await.unwrap();
        assert_eq!(store.compacted_revision().await.unwrap(), 0);

        store.compact(r2).await.unwrap();
        assert_eq!(store.compacted_revision().await.unwrap(), r2);
        assert_eq!(store.current_revision().await.unwrap(), r4, "compaction does not write");
        match store.range(Range::prefix("/c/").at(r1)).await {
            Err(Error::Compacted { requested, compacted }) => assert_eq!((requested, compacted), (r1, r2)),
            other => panic!("expected Compacted at {r1}, got {other:?}"),
        }
        // the compaction revision itself stays readable, as in etcd
        assert_eq!(store.range(Range::prefix("/c/").at(r2)).await.unwrap().kvs[0].value, b("2"));
        assert_eq!(store.range(Range::prefix("/c/").at(r3)).await.unwrap().kvs[0].value, b("3"));
        assert_eq!(store.range(Range::prefix("/c/")).await.unwrap().kvs.len(), 2);

        // a watch that needs an event before r2 fails; one starting at r2 works
        match store.watch("/c/", r1 - 1).await {
            Err(Error::Compacted { requested, compacted }) => assert_eq!((requested, compacted), (r1, r2)),
            other => panic!("expected Compacted, got {:?}", other.map(|_| ())),
        }
        let mut w = store.watch("/c/", r1).await.unwrap();
        assert_eq!(next_event(&mut w).await.unwrap().revision(), r2);
        assert_eq!(next_event(&mut w).await.unwrap().revision(), r3);

        // A second client learns about the compaction from etcd (binary search on connect).
        let other = EtcdStore::connect(&etcd.endpoints()).await.unwrap();
        assert_eq!(other.compacted_revision().await.unwrap(), r2);
        // ... and about later ones from a compacted read or watch, or by asking.
        let third = EtcdStore::connect(&etcd.endpoints()).await.unwrap();
        store.compact(r3).await.unwrap();
        match third.range(Range::prefix("/c/").at(r2)).await {
            Err(Error::Compacted { requested, compacted }) => assert_eq!((requested, compacted), (r2, r3)),
            other => panic!("expected Compacted, got {other:?}"),
        }
        // `other` still believes r2: the watch is refused by etcd, as the stream's first item
        match other.watch("/c/", r1).await {
            Ok(mut s) => match next_event(&mut s).await {
                Err(Error::Compacted { requested, compacted }) => assert_eq!((requested, compacted), (r2, r3)),
                other => panic!("expected Compacted, got {other:?}"),
            },
            Err(e) => panic!("expected a stream failing with Compacted, got {e:?}"),
        }
        assert_eq!(other.compacted_revision().await.unwrap(), r3);
        let fourth = EtcdStore::connect(&etcd.endpoints()).await.unwrap();
        assert_eq!(fourth.compacted_revision().await.unwrap(), r3);

        // compacting again at or below is a no-op; past the current revision is an error
        store.compact(r1).await.unwrap();
        other.compact(r3).await.unwrap();
        assert_eq!(store.compacted_revision().await.unwrap(), r3);
        assert!(matches!(store.compact(r4 + 10).await, Err(Error::FutureRevision { .. })));
        // compacting at the current revision
        store.compact(r4).await.unwrap();
        assert_eq!(store.compacted_revision().await.unwrap(), r4);
        assert!(matches!(store.range(Range::prefix("/c/").at(r3)).await, Err(Error::Compacted { .. })));
        assert_eq!(store.range(Range::prefix("/c/").at(r4)).await.unwrap().kvs.len(), 2);
        let mut w = store.watch("/c/", r4).await.unwrap();
        let r5 = put(&store, "/c/a", "5").await;
        let e = next_event(&mut w).await.unwrap();
        assert_eq!(e.revision(), r5);
        assert_eq!(e.prev.map(|kv| kv.value), Some(b("3")), "prev values survive compaction");
    }

    #[tokio::test]
    async fn large_values_and_responses_over_4_mib() {
        let (_etcd, store) = setup().await;
        let big = |fill: u8| Bytes::from(vec![fill; 1536 * 1024]);
        let r0 = store.current_revision().await.unwrap();
        let mut watch = store.watch("/big/", r0).await.unwrap();
        let r1 = store.create("/big/a", big(b'a')).await.unwrap();
        let r2 = store.create("/big/b", big(b'b')).await.unwrap();
        let r3 = store.update("/big/a", big(b'c'), r1).await.unwrap();
        let r4 = store.update("/big/b", big(b'd'), r2).await.unwrap();

        // a 6 MiB range response
        let all = store.range(Range::prefix("/big/")).await.unwrap();
        assert_eq!(all.kvs.len(), 2);
        assert_eq!(all.kvs[0].value, big(b'c'));
        assert_eq!(all.kvs[1].value, big(b'd'));
        let past = store.range(Range::prefix("/big/").at(r2)).await.unwrap();
        assert_eq!(past.kvs[0].value, big(b'a'));

        // watch events carry both values (replayed in one large response, too)
        for (rev, value, prev) in [(r1, b'a', None), (r2, b'b', None), (r3, b'c', Some(b'a')), (r4, b'd', Some(b'b'))] {
            let e = next_event(&mut watch).await.unwrap();
            assert_eq!(e.revision(), rev);
            assert_eq!(e.kv.value, big(value));
            assert_eq!(e.prev.map(|kv| kv.value), prev.map(big));
        }
        let mut replay = store.watch("/big/", r0).await.unwrap();
        for rev in [r1, r2, r3, r4] {
            assert_eq!(next_event(&mut replay).await.unwrap().revision(), rev);
        }
        // a value above etcd's request limit is an invalid request, not a hang or a panic
        let huge = Bytes::from(vec![0u8; 4 * 1024 * 1024]);
        match store.create("/big/huge", huge).await {
            Err(Error::InvalidRequest(_)) => {}
            other => panic!("expected InvalidRequest, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn unreachable_etcd_is_unavailable() {
        // Nothing listens on this port once the listener is dropped.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let opts = EtcdOptions {
            request_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            ..Default::default()
        };
        let started = std::time::Instant::now();
        match EtcdStore::connect_with(&[format!("http://127.0.0.1:{port}")], opts).await {
            Err(Error::Unavailable(msg)) => assert!(!msg.is_empty()),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    }
}
