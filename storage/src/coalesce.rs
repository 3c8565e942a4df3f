//! Requests that arrive while others are in flight leave together: a [`Coalescer`] sends a
//! request at once, from the caller's task, while fewer than `max_in_flight` batches are
//! out; otherwise it queues, and the next slot to free sends everything queued as one batch.
//! A lone client pays nothing for it; sixteen concurrent ones share round trips.
//!
//! The etcd backend batches its single-key reads this way (one read-only Txn of Range ops,
//! which etcd serves like a Range: linearizable, no Raft proposal). Every request in a
//! batch arrived before the batch was sent, so each read still sees every write that
//! completed before it was issued.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

type Run<Q, A> = Box<dyn Fn(Vec<Q>) -> Pin<Box<dyn Future<Output = Vec<A>> + Send>> + Send + Sync>;

pub struct Coalescer<Q, A> {
    inner: Arc<Inner<Q, A>>,
}

struct Inner<Q, A> {
    run: Run<Q, A>,
    max_batch: usize,
    max_in_flight: usize,
    state: Mutex<State<Q, A>>,
}

/// Requests queue only while `max_in_flight` batches are out: a non-empty queue means every
/// slot is taken, and a slot that frees takes the queue.
struct State<Q, A> {
    in_flight: usize,
    queue: VecDeque<(Q, oneshot::Sender<A>)>,
}

impl<Q: Send + 'static, A: Send + 'static> Coalescer<Q, A> {
    /// `run` answers one batch, an answer per request in order.
    pub fn new<F, Fut>(max_batch: usize, max_in_flight: usize, run: F) -> Self
    where
        F: Fn(Vec<Q>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<A>> + Send + 'static,
    {
        let run: Run<Q, A> = Box::new(move |qs| Box::pin(run(qs)));
        let state = Mutex::new(State { in_flight: 0, queue: VecDeque::new() });
        Coalescer {
            inner: Arc::new(Inner { run, max_batch: max_batch.max(1), max_in_flight: max_in_flight.max(1), state }),
        }
    }

    /// The answer to `request`: sent at once from the caller's task when a slot is free (no
    /// hand-off to another task: a lone client pays nothing for the batching), else queued
    /// for the next batch. None when `run` answered fewer requests than it was given.
    pub async fn call(&self, request: Q) -> Option<A> {
        let mut request = Some(request);
        let queued = {
            let mut st = self.inner.lock();
            if st.in_flight < self.inner.max_in_flight {
                st.in_flight += 1;
                None
            } else {
                let (reply, answer) = oneshot::channel();
                st.queue.extend(request.take().map(|r| (r, reply)));
                Some(answer)
            }
        };
        match (queued, request) {
            (Some(answer), _) => answer.await.ok(),
            (None, Some(request)) => {
                // Frees the slot (and starts what queued meanwhile) even if this future is
                // dropped half-way.
                let _slot = Slot(self.inner.clone());
                (self.inner.run)(vec![request]).await.into_iter().next()
            }
            (None, None) => None,
        }
    }
}

impl<Q: Send + 'static, A: Send + 'static> Inner<Q, A> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<Q, A>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A batch is done: its slot goes to what queued meanwhile, sent from a task of its own.
    fn finished(self: &Arc<Self>) {
        let mut st = self.lock();
        if st.queue.is_empty() {
            st.in_flight -= 1;
            return;
        }
        let n = st.queue.len().min(self.max_batch);
        let (requests, replies): (Vec<Q>, Vec<oneshot::Sender<A>>) = st.queue.drain(..n).unzip();
        drop(st);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime left to send them: the waiters get None.
            return;
        };
        let inner = self.clone();
        runtime.spawn(async move {
            let _slot = Slot(inner.clone());
            let answers = (inner.run)(requests).await;
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(answer);
            }
        });
    }
}

/// A taken slot; dropping it frees the slot.
struct Slot<Q: Send + 'static, A: Send + 'static>(Arc<Inner<Q, A>>);

impl<Q: Send + 'static, A: Send + 'static> Drop for Slot<Q, A> {
    fn drop(&mut self) {
        self.0.finished();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    #[tokio::test]
    async fn a_lone_request_goes_alone_and_concurrent_ones_share_batches() {
        let batches = Arc::new(Mutex::new(Vec::<usize>::new()));
        let seen = batches.clone();
        let c = Arc::new(Coalescer::new(64, 1, move |qs: Vec<u32>| {
            seen.lock().unwrap().push(qs.len());
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                qs.into_iter().map(|q| q * 10).collect::<Vec<_>>()
            }
        }));
        assert_eq!(c.call(1).await, Some(10));
        assert_eq!(*batches.lock().unwrap(), vec![1]);
        let calls: Vec<_> = (0..20)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move { c.call(i).await })
            })
            .collect();
        for (i, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.unwrap(), Some(i as u32 * 10), "each request gets its own answer");
        }
        let sizes = batches.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 21);
        // The first of the twenty went alone; the rest queued behind it and went together.
        assert!(sizes.len() <= 4, "twenty concurrent requests took {} batches: {sizes:?}", sizes.len() - 1);
    }

    #[tokio::test]
    async fn batches_are_capped() {
        let batches = Arc::new(Mutex::new(Vec::<usize>::new()));
        let seen = batches.clone();
        let c = Arc::new(Coalescer::new(4, 1, move |qs: Vec<u32>| {
            seen.lock().unwrap().push(qs.len());
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                qs
            }
        }));
        let calls: Vec<_> = (0..10)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move { c.call(i).await })
            })
            .collect();
        for call in calls {
            assert!(call.await.unwrap().is_some());
        }
        assert!(batches.lock().unwrap().iter().all(|&n| n <= 4));
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_frees_its_slot() {
        let c = Coalescer::new(8, 1, |qs: Vec<u64>| async move {
            tokio::time::sleep(Duration::from_millis(qs[0])).await;
            qs
        });
        assert!(tokio::time::timeout(Duration::from_millis(10), c.call(10_000)).await.is_err());
        let answer = tokio::time::timeout(Duration::from_secs(5), c.call(1)).await;
        assert_eq!(answer.expect("the slot was freed"), Some(1));
    }

    #[tokio::test]
    async fn a_short_answer_is_none_not_a_hang() {
        let c = Coalescer::new(8, 1, |_: Vec<u32>| async { Vec::<u32>::new() });
        assert_eq!(c.call(1).await, None);
    }
}
