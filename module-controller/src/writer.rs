//! Keyed, coalescing background writes: at most one write per key is in flight; while one
//! runs, newer writes for the same key replace each other and only the latest runs next.
//! Status patches of one object therefore never race or pile up, while writes to different
//! objects run concurrently (bounded by a semaphore).
//!
//! A write waits as the closure that makes its request, not as the request's future: an API
//! call's future holds room for every state of the client's stack (kilobytes), and at scale
//! thousands of writes wait for the semaphore.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> + Send + 'static>;

#[derive(Clone)]
pub struct Writer {
    pending: Arc<Mutex<HashMap<String, Option<Job>>>>,
    permits: Arc<Semaphore>,
}

impl Writer {
    pub fn new(concurrency: usize) -> Self {
        Writer { pending: Arc::new(Mutex::new(HashMap::new())), permits: Arc::new(Semaphore::new(concurrency.max(1))) }
    }

    /// Run the write `job` makes for `key` after the key's in-flight write (if any); a job
    /// still waiting for the same key is replaced.
    pub fn submit<J, F>(&self, key: String, job: J)
    where
        J: FnOnce() -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let job: Job = Box::new(move || Box::pin(job()));
        {
            let Ok(mut pending) = self.pending.lock() else { return };
            if let Some(slot) = pending.get_mut(&key) {
                *slot = Some(job);
                return;
            }
            pending.insert(key.clone(), None);
        }
        let pending = self.pending.clone();
        let permits = self.permits.clone();
        tokio::spawn(async move {
            let mut next = Some(job);
            while let Some(job) = next.take() {
                let permit = permits.acquire().await;
                job().await;
                drop(permit);
                let Ok(mut p) = pending.lock() else { return };
                match p.get_mut(&key).and_then(|slot| slot.take()) {
                    Some(j) => next = Some(j),
                    None => {
                        p.remove(&key);
                    }
                }
            }
        });
    }

    /// Keys with a write in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.lock().map(|p| p.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn same_key_coalesces_and_keeps_the_latest() {
        let w = Writer::new(4);
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(tokio::sync::Notify::new());
        let (l, g) = (log.clone(), gate.clone());
        w.submit("k".into(), move || async move {
            g.notified().await;
            l.lock().unwrap().push(1);
        });
        for i in 2..=4 {
            let l = log.clone();
            w.submit("k".into(), move || async move { l.lock().unwrap().push(i) });
        }
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        w.submit("other".into(), move || async move {
            c.fetch_add(1, Ordering::SeqCst);
        });
        gate.notify_one();
        while w.in_flight() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(*log.lock().unwrap(), vec![1, 4]);
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}
