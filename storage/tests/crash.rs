//! Crash test for the embedded backend: a writer process is killed with SIGKILL while it
//! streams acknowledged writes; after reopening, every acknowledged write is there.
//!
//! The same executable plays both parts: run with `MINIK8S_CRASH_WRITER_DB=<path>` it is
//! the writer, printing `ack <key> <value> <revision>` after each acknowledged write.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use storage::embedded::SqliteStore;
use storage::Store;

const WRITER_ENV: &str = "MINIK8S_CRASH_WRITER_DB";

fn main() {
    match std::env::var(WRITER_ENV) {
        Ok(path) => writer(&path),
        Err(_) => {
            acknowledged_writes_survive_kill_9();
            println!("test acknowledged_writes_survive_kill_9 ... ok");
        }
    }
}

/// Write forever from several tasks: creates of fresh keys and compare-and-swap updates
/// of one counter per task.
fn writer(path: &str) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let store = Arc::new(SqliteStore::open(path).expect("open store"));
        let round = std::process::id();
        let mut tasks = Vec::new();
        for t in 0..4 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let counter = format!("/crash/counter/{t}");
                for i in 0u64.. {
                    let key = format!("/crash/keys/{round}-{t}-{i}");
                    let value = format!("v{i}");
                    let rev = store.create(&key, value.clone().into()).await.expect("create");
                    println!("ack {key} {value} {rev}");
                    let (_, cur) = store.get(&counter).await.expect("get");
                    let n: u64 = cur.as_ref().map_or(0, |kv| String::from_utf8_lossy(&kv.value).parse().unwrap_or(0));
                    let next = (n + 1).to_string();
                    let rev = match cur {
                        Some(kv) => store.update(&counter, next.clone().into(), kv.mod_revision).await.expect("update"),
                        None => store.create(&counter, next.clone().into()).await.expect("create counter"),
                    };
                    println!("ack {counter} {next} {rev}");
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
}

fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("state.db");
    let exe = std::env::current_exe().expect("current exe");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut total = 0;
    // Three crash-and-recover rounds on the same file.
    for round in 0..3 {
        let mut child = Command::new(&exe)
            .env(WRITER_ENV, &db)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn writer");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut acks = Vec::new();
        let started = Instant::now();
        // Kill after a few thousand acknowledged writes (or a time bound).
        while acks.len() < 3000 + round * 1000 && started.elapsed() < Duration::from_secs(60) {
            match lines.next() {
                Some(Ok(line)) => acks.push(line),
                _ => break,
            }
        }
        child.kill().expect("SIGKILL the writer");
        // Lines printed before the kill are acknowledged writes too.
        acks.extend(lines.map_while(Result::ok));
        child.wait().expect("reap writer");
        assert!(acks.len() >= 3000, "writer produced only {} acks", acks.len());
        total += acks.len();

        rt.block_on(async {
            let store = SqliteStore::open(&db).expect("reopen after kill -9");
            let current = store.current_revision().await.unwrap();
            let mut last_counter = std::collections::HashMap::new();
            for ack in &acks {
                let mut parts = ack.split(' ');
                let (_, key, value, rev) =
                    (parts.next(), parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
                let rev: i64 = rev.parse().unwrap();
                assert!(rev <= current, "acknowledged revision {rev} is beyond the recovered revision {current}");
                if key.starts_with("/crash/counter/") {
                    last_counter.insert(key.to_string(), value.parse::<u64>().unwrap());
                    continue;
                }
                let kv = store.get(key).await.unwrap().1.unwrap_or_else(|| panic!("acknowledged write {key} lost"));
                assert_eq!((kv.value.as_ref(), kv.mod_revision), (value.as_bytes(), rev), "{key}");
            }
            for (key, acked) in last_counter {
                let kv = store.get(&key).await.unwrap().1.expect("counter present");
                let stored: u64 = String::from_utf8_lossy(&kv.value).parse().unwrap();
                assert!(stored >= acked, "{key}: acknowledged {acked}, recovered {stored}");
            }
        });
    }
    eprintln!("crash test: {total} acknowledged writes over 3 kill -9 rounds, none lost");
}
