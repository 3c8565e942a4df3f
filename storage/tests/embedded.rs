//! The conformance suite against the embedded SQLite backend.

use std::sync::Arc;

use storage::embedded::SqliteStore;
use storage::testsuite::Fixture;

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("state.db")).expect("open store");
    Fixture { store: Arc::new(store), guard: Box::new(dir) }
}

storage::conformance_tests!(fixture);

#[tokio::test]
async fn reopen_keeps_data_and_revision() {
    use storage::Store;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let (rev, compact) = {
        let store = SqliteStore::open(&path).unwrap();
        let r1 = store.create("/k/a", "1".into()).await.unwrap();
        store.update("/k/a", "2".into(), r1).await.unwrap();
        let (rev, _) = store.delete("/k/a", None).await.unwrap();
        store.compact(rev).await.unwrap();
        (rev, store.compacted_revision().await.unwrap())
    };
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        store.current_revision().await.unwrap(),
        rev,
        "the revision survives a restart even after compacting a tombstone"
    );
    assert_eq!(store.compacted_revision().await.unwrap(), compact);
    let r = store.create("/k/a", "3".into()).await.unwrap();
    assert_eq!(r, rev + 1);
}

#[tokio::test]
async fn fresh_store_starts_at_revision_one() {
    use storage::Store;
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("state.db")).unwrap();
    assert_eq!(store.current_revision().await.unwrap(), 1);
    assert_eq!(store.create("/a", "x".into()).await.unwrap(), 2);
}

#[tokio::test]
async fn unwritable_location_is_unavailable_not_a_panic() {
    let err = SqliteStore::open("/proc/definitely/not/here/state.db").err().expect("must fail");
    assert!(matches!(err, storage::Error::Unavailable(_)), "{err}");
}

#[tokio::test]
async fn a_snapshot_taken_while_the_store_is_open_reopens_as_the_same_store() {
    use storage::embedded::{snapshot, snapshot_info, SnapshotInfo};
    use storage::Store;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = SqliteStore::open(&path).unwrap();
    store.create("/k/a", "1".into()).await.unwrap();
    let r = store.create("/k/b", "2".into()).await.unwrap();
    store.update("/k/b", "3".into(), r).await.unwrap();
    let (rev, _) = store.delete("/k/a", None).await.unwrap();
    let copy = dir.path().join("copy.db");
    // Taken with the store open (the apiserver running), as `scripts/cluster backup` does.
    assert_eq!(snapshot(&path, &copy).unwrap(), SnapshotInfo { revision: rev, keys: 1 });
    assert!(snapshot(&path, &copy).is_err(), "an existing file is not overwritten");
    let later = store.create("/k/c", "4".into()).await.unwrap();
    assert!(later > rev);
    assert_eq!(snapshot_info(&copy).unwrap().revision, rev, "the copy does not follow later writes");
    let restored = SqliteStore::open(&copy).unwrap();
    assert_eq!(restored.current_revision().await.unwrap(), rev);
    assert_eq!(restored.get("/k/b").await.unwrap().1.map(|kv| kv.value), Some("3".into()));
    assert!(restored.get("/k/a").await.unwrap().1.is_none());
    assert!(snapshot(&dir.path().join("none.db"), &dir.path().join("x.db")).is_err());
}
