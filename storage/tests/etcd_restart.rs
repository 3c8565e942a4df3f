//! The etcd backend across an etcd crash and restart on the same data directory: calls fail
//! with `Error::Unavailable` while etcd is down (promptly, no hang), succeed again after it
//! is back, and watches resume with neither a gap nor a duplicate. Over a 3-member cluster,
//! a member that dies for good costs only the requests in flight to it: every later one is
//! served by the others, and a watch goes on without a gap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use storage::etcd::{EtcdOptions, EtcdStore};
use storage::etcd_test_server::EtcdServer;
use storage::*;

const PREFIX: &str = "/registry/restart/";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

fn key(i: usize) -> String {
    format!("{PREFIX}k{i:02}")
}

/// Create `key`, retrying while etcd is unavailable (up to 30 s). Returns its revision.
async fn create_retrying(store: &EtcdStore, key: &str) -> Revision {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match store.create(key, Bytes::from(key.to_string())).await {
            Ok(rev) => return rev,
            // An earlier attempt whose outcome was unknown did get applied.
            Err(Error::AlreadyExists { .. }) => {
                return store.get(key).await.unwrap().1.expect("key exists").mod_revision;
            }
            Err(Error::Unavailable(msg)) if Instant::now() < deadline => {
                eprintln!("create {key}: still unavailable: {msg}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("create {key}: {e:?}"),
        }
    }
}

/// Assert `result` is `Unavailable` and came back within the request timeout (plus slack).
fn assert_prompt_unavailable<T: std::fmt::Debug>(what: &str, started: Instant, result: Result<T>) {
    let took = started.elapsed();
    match result {
        Err(Error::Unavailable(msg)) => {
            eprintln!("{what} while etcd is down: {msg} (after {took:?})")
        }
        other => panic!("{what} while etcd is down: expected Unavailable, got {other:?}"),
    }
    assert!(took < REQUEST_TIMEOUT + Duration::from_millis(1500), "{what} took {took:?} to fail");
}

/// Read `n` events from `stream`, failing after 60 s.
async fn take_events(stream: &mut WatchStream, n: usize) -> Vec<Event> {
    let mut events = Vec::new();
    while events.len() < n {
        let item = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} events after 60s: {events:?}", events.len()))
            .expect("watch stream ended");
        events.push(item.expect("watch error"));
    }
    events
}

fn assert_consecutive(events: &[Event], first_rev: Revision, keys: &[String]) {
    let revs: Vec<Revision> = events.iter().map(Event::revision).collect();
    let expected: Vec<Revision> = (0..keys.len() as i64).map(|i| first_rev + i).collect();
    assert_eq!(revs, expected, "revisions must be consecutive: no gap, no duplicate");
    let got_keys: Vec<&str> = events.iter().map(|e| e.kv.key.as_str()).collect();
    let want_keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(got_keys, want_keys);
    for e in events {
        assert_eq!(e.kind, EventKind::Put);
        assert_eq!(e.kv.value, Bytes::from(e.kv.key.clone()));
        assert_eq!(e.prev, None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_etcd_restart() {
    let mut etcd = EtcdServer::start_async().await.expect("start etcd");
    let opts =
        EtcdOptions { request_timeout: REQUEST_TIMEOUT, connect_timeout: Duration::from_secs(1), ..Default::default() };
    let store = Arc::new(EtcdStore::connect_with(&etcd.endpoints(), opts).await.expect("connect"));

    let r0 = store.current_revision().await.unwrap();
    let keys: Vec<String> = (0..10).map(key).collect();
    for k in &keys[..5] {
        create_retrying(&store, k).await;
    }

    // A watch consumed continuously by a task, one polled only after the restart, and one
    // that has delivered some events before the crash.
    let mut active = store.watch(PREFIX, r0).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let collector = tokio::spawn(async move {
        while let Some(item) = active.next().await {
            let stop = item.is_err();
            if tx.send(item).is_err() || stop {
                break;
            }
        }
    });
    let mut idle = store.watch(PREFIX, r0).await.unwrap();
    let mut partial = store.watch(PREFIX, r0).await.unwrap();
    let first_two = take_events(&mut partial, 2).await;
    let mut before = Vec::new();
    for _ in 0..5 {
        let item = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
        before.push(item.unwrap());
    }
    assert_consecutive(&before, r0 + 1, &keys[..5]);

    // Crash etcd.
    etcd.stop().expect("kill etcd");
    let t = Instant::now();
    assert_prompt_unavailable("create", t, store.create(&key(99), Bytes::from_static(b"x")).await);
    let t = Instant::now();
    assert_prompt_unavailable("range", t, store.range(Range::prefix(PREFIX)).await);
    let t = Instant::now();
    assert_prompt_unavailable("current_revision", t, store.current_revision().await);
    let t = Instant::now();
    assert_prompt_unavailable("compacted_revision", t, store.compacted_revision().await);
    let t = Instant::now();
    assert_prompt_unavailable("watch", t, store.watch(PREFIX, r0).await.map(|_| ()));
    // Let the watches notice and start retrying.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Back on the same data directory and ports.
    etcd.restart_async().await.expect("restart etcd");
    let restarted = Instant::now();
    for k in &keys[5..] {
        create_retrying(&store, k).await;
    }
    eprintln!("writes succeeded again {:?} after the restart", restarted.elapsed());
    assert_eq!(store.current_revision().await.unwrap(), r0 + 10);
    let listed = store.range(Range::prefix(PREFIX)).await.unwrap();
    assert_eq!(listed.kvs.len(), 10);

    let mut after = Vec::new();
    for _ in 0..5 {
        let item = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("event within 60s of the restart")
            .expect("collector ended");
        after.push(item.expect("watch error"));
    }
    let all: Vec<Event> = before.into_iter().chain(after).collect();
    assert_consecutive(&all, r0 + 1, &keys);

    let idle_events = take_events(&mut idle, 10).await;
    assert_consecutive(&idle_events, r0 + 1, &keys);
    let rest = take_events(&mut partial, 8).await;
    let partial_events: Vec<Event> = first_two.into_iter().chain(rest).collect();
    assert_consecutive(&partial_events, r0 + 1, &keys);

    // Nothing more is pending on any watch: the next write is the next event everywhere.
    let r11 = create_retrying(&store, &key(10)).await;
    assert_eq!(r11, r0 + 11);
    let next = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap().unwrap();
    assert_eq!(next.revision(), r11);
    assert_eq!(take_events(&mut idle, 1).await[0].revision(), r11);
    assert_eq!(take_events(&mut partial, 1).await[0].revision(), r11);

    collector.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_fails_while_down_and_works_after_restart() {
    let mut etcd = EtcdServer::start_async().await.expect("start etcd");
    etcd.stop().expect("kill etcd");
    let opts =
        EtcdOptions { request_timeout: REQUEST_TIMEOUT, connect_timeout: Duration::from_secs(1), ..Default::default() };
    let t = Instant::now();
    assert_prompt_unavailable("connect", t, EtcdStore::connect_with(&etcd.endpoints(), opts.clone()).await);
    etcd.restart_async().await.expect("restart etcd");
    let store = EtcdStore::connect_with(&etcd.endpoints(), opts).await.expect("connect after restart");
    create_retrying(&store, &key(0)).await;
}

/// A frozen etcd (SIGSTOP: sockets open, no answers) must not hang callers: every call fails
/// with `Unavailable` within the request timeout, and everything works again once it resumes,
/// including a watch that was open the whole time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_etcd_times_out_then_recovers() {
    let mut etcd = EtcdServer::start_async().await.expect("start etcd");
    let opts =
        EtcdOptions { request_timeout: REQUEST_TIMEOUT, connect_timeout: Duration::from_secs(1), ..Default::default() };
    let store = EtcdStore::connect_with(&etcd.endpoints(), opts).await.expect("connect");
    let r0 = store.current_revision().await.unwrap();
    let mut watch = store.watch(PREFIX, r0).await.unwrap();
    let keys: Vec<String> = (0..4).map(key).collect();
    create_retrying(&store, &keys[0]).await;
    let mut events = take_events(&mut watch, 1).await;

    etcd.pause().expect("SIGSTOP etcd");
    let t = Instant::now();
    assert_prompt_unavailable("create", t, store.create(&keys[1], Bytes::from(keys[1].clone())).await);
    let t = Instant::now();
    assert_prompt_unavailable("range", t, store.range(Range::prefix(PREFIX)).await);
    let t = Instant::now();
    assert_prompt_unavailable("watch", t, store.watch(PREFIX, r0).await.map(|_| ()));
    etcd.resume().expect("SIGCONT etcd");

    // The create that timed out may or may not have been applied: create_retrying copes.
    for k in &keys[1..] {
        create_retrying(&store, k).await;
    }
    events.extend(take_events(&mut watch, 3).await);
    assert_consecutive(&events, r0 + 1, &keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_of_three_stops_costing_requests() {
    let mut members = tokio::task::spawn_blocking(|| EtcdServer::start_cluster(3))
        .await
        .unwrap()
        .expect("a 3-member etcd (Debian package etcd-server)");
    let endpoints: Vec<String> = members.iter().map(|m| m.endpoint()).collect();
    let opts = EtcdOptions { request_timeout: REQUEST_TIMEOUT, connect_timeout: REQUEST_TIMEOUT, ..Default::default() };
    // The first endpoint is the one requests go to first: it is the one that dies.
    let store = Arc::new(EtcdStore::connect_with(&endpoints, opts).await.expect("connect"));
    let first = create_retrying(&store, &key(0)).await;
    let mut watch = store.watch(PREFIX, first).await.expect("watch");

    members[0].stop().expect("kill member 1");
    // Until the survivors have a leader (when member 1 led), writes may fail.
    let keys: Vec<String> = (1..=40).map(key).collect();
    let revision = create_retrying(&store, &keys[0]).await;
    // From then on nothing fails: the dead member gets no more requests.
    for k in &keys[1..] {
        store
            .create(k, Bytes::from(k.clone()))
            .await
            .unwrap_or_else(|e| panic!("create {k} after the failover: {e:?}"));
    }
    for _ in 0..100 {
        store.get(&keys[0]).await.expect("read after the failover");
    }
    // The watch went on from the survivors: every write after the first, once, in order.
    let events = take_events(&mut watch, keys.len()).await;
    assert_consecutive(&events, revision, &keys);
}
