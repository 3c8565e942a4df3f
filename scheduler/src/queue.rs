//! The scheduling queue (kube-scheduler's `PriorityQueue`): an active queue ordered by
//! priority then arrival, a backoff queue (1 s doubling to 10 s per failed attempt) and an
//! unschedulable set that waits for a cluster event that could make its pods fit — or
//! for five minutes. The state machine is [`QueueState`] (pure, clock passed in);
//! [`SchedulingQueue`] wraps it with a lock and a wake-up for the scheduling loop.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::framework::PodInfo;

pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// `podMaxInUnschedulablePodsDuration`.
pub const MAX_UNSCHEDULABLE: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    Active,
    Backoff,
    Unschedulable,
    InFlight,
}

#[derive(Debug)]
struct Queued {
    info: Arc<PodInfo>,
    attempts: u32,
    at: Where,
    generation: u64,
    backoff_until: Option<Instant>,
    unschedulable_since: Option<Instant>,
    plugins: Vec<&'static str>,
    /// Move requests seen when this pod was popped (kube's `moveRequestCycle`).
    popped_at_move: u64,
}

#[derive(Debug, PartialEq, Eq)]
struct ActiveEntry {
    priority: i32,
    seq: u64,
    key: String,
    generation: u64,
}

impl Ord for ActiveEntry {
    fn cmp(&self, o: &Self) -> Ordering {
        self.priority.cmp(&o.priority).then_with(|| o.seq.cmp(&self.seq))
    }
}
impl PartialOrd for ActiveEntry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// A pod handed to the scheduling loop.
#[derive(Debug, Clone)]
pub struct Popped {
    pub info: Arc<PodInfo>,
    pub attempts: u32,
}

/// The queue's state machine.
#[derive(Debug, Default)]
pub struct QueueState {
    pods: HashMap<String, Queued>,
    active: BinaryHeap<ActiveEntry>,
    backoff: BinaryHeap<Reverse<(Instant, u64, String)>>,
    seq: u64,
    moves: u64,
}

pub fn backoff_for(attempts: u32) -> Duration {
    let exp = attempts.saturating_sub(1).min(10);
    (INITIAL_BACKOFF * 2u32.pow(exp)).min(MAX_BACKOFF)
}

impl QueueState {
    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
    fn push_active(&mut self, key: &str) {
        let seq = self.next();
        if let Some(q) = self.pods.get_mut(key) {
            q.at = Where::Active;
            q.generation = seq;
            self.active.push(ActiveEntry { priority: q.info.priority, seq, key: key.to_string(), generation: seq });
        }
    }
    fn push_backoff(&mut self, key: &str, until: Instant) {
        let seq = self.next();
        if let Some(q) = self.pods.get_mut(key) {
            q.at = Where::Backoff;
            q.generation = seq;
            q.backoff_until = Some(until);
            self.backoff.push(Reverse((until, seq, key.to_string())));
        }
    }

    /// A new or updated pending pod from the watch.
    pub fn add(&mut self, info: Arc<PodInfo>) {
        let key = info.key();
        match self.pods.get_mut(&key) {
            Some(q) => {
                let changed = q.info.pod.spec != info.pod.spec || q.info.labels != info.labels;
                q.info = info;
                // An update to an unschedulable pod may make it fit (kube: isPodUpdated).
                if changed && q.at == Where::Unschedulable {
                    self.push_active(&key);
                }
            }
            None => {
                self.pods.insert(
                    key.clone(),
                    Queued {
                        info,
                        attempts: 0,
                        at: Where::Active,
                        generation: 0,
                        backoff_until: None,
                        unschedulable_since: None,
                        plugins: Vec::new(),
                        popped_at_move: 0,
                    },
                );
                self.push_active(&key);
            }
        }
    }

    /// The pod is gone or no longer pending.
    pub fn delete(&mut self, key: &str) {
        self.pods.remove(key);
    }

    /// Move backoff pods whose time has come to active.
    pub fn flush_backoff(&mut self, now: Instant) {
        while let Some(Reverse((until, gen, _))) = self.backoff.peek() {
            if *until > now {
                break;
            }
            let (gen, key) = (*gen, self.backoff.pop().map(|Reverse((_, _, k))| k).unwrap_or_default());
            if self.pods.get(&key).is_some_and(|q| q.at == Where::Backoff && q.generation == gen) {
                self.push_active(&key);
            }
        }
    }

    /// Pods unschedulable for longer than [`MAX_UNSCHEDULABLE`] get another try.
    pub fn flush_unschedulable(&mut self, now: Instant) {
        let old: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, q)| {
                q.at == Where::Unschedulable
                    && q.unschedulable_since.is_some_and(|t| now.duration_since(t) >= MAX_UNSCHEDULABLE)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in old {
            self.requeue(&k, now);
        }
    }

    fn requeue(&mut self, key: &str, now: Instant) {
        let Some(q) = self.pods.get(key) else { return };
        match q.backoff_until {
            Some(until) if until > now => self.push_backoff(key, until),
            _ => self.push_active(key),
        }
    }

    /// Take the next active pod, if any.
    pub fn pop(&mut self, now: Instant) -> Option<Popped> {
        self.flush_backoff(now);
        while let Some(e) = self.active.pop() {
            let moves = self.moves;
            let Some(q) = self.pods.get_mut(&e.key) else { continue };
            if q.at != Where::Active || q.generation != e.generation {
                continue;
            }
            q.at = Where::InFlight;
            q.attempts += 1;
            q.popped_at_move = moves;
            return Some(Popped { info: q.info.clone(), attempts: q.attempts });
        }
        None
    }

    /// When the earliest backoff ends (for the loop to sleep until).
    pub fn next_backoff(&self) -> Option<Instant> {
        self.backoff.peek().map(|Reverse((t, _, _))| *t)
    }

    /// The pod was placed (assumed): the queue forgets it.
    pub fn done(&mut self, key: &str) {
        self.pods.remove(key);
    }

    /// The pod fits nowhere. `plugins` are the filters that rejected nodes. If a move
    /// request arrived while it was being scheduled it backs off instead of waiting.
    pub fn unschedulable(&mut self, key: &str, plugins: Vec<&'static str>, now: Instant) {
        let moves = self.moves;
        let Some(q) = self.pods.get_mut(key) else { return };
        let until = now + backoff_for(q.attempts);
        q.backoff_until = Some(until);
        q.plugins = plugins;
        if q.popped_at_move != moves {
            self.push_backoff(key, until);
        } else {
            q.at = Where::Unschedulable;
            q.unschedulable_since = Some(now);
        }
    }

    /// An error (binding failed, API error): retry after backoff.
    pub fn error(&mut self, info: Arc<PodInfo>, now: Instant) {
        let key = info.key();
        let attempts = self.pods.get(&key).map(|q| q.attempts).unwrap_or(1);
        self.pods.insert(
            key.clone(),
            Queued {
                info,
                attempts,
                at: Where::Backoff,
                generation: 0,
                backoff_until: None,
                unschedulable_since: None,
                plugins: Vec::new(),
                popped_at_move: 0,
            },
        );
        self.push_backoff(&key, now + backoff_for(attempts));
    }

    /// A cluster event: move the unschedulable pods `relevant` says could now fit
    /// (given the plugins that rejected them) to active, or to backoff if still backing off.
    pub fn move_all(&mut self, now: Instant, relevant: impl Fn(&[&'static str]) -> bool) {
        self.moves += 1;
        let keys: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, q)| q.at == Where::Unschedulable && relevant(&q.plugins))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.requeue(&k, now);
        }
    }

    pub fn position(&self, key: &str) -> Option<Where> {
        self.pods.get(key).map(|q| q.at)
    }

    /// (active, backoff, unschedulable) sizes.
    pub fn lens(&self) -> (usize, usize, usize) {
        let mut l = (0, 0, 0);
        for q in self.pods.values() {
            match q.at {
                Where::Active => l.0 += 1,
                Where::Backoff => l.1 += 1,
                Where::Unschedulable => l.2 += 1,
                Where::InFlight => {}
            }
        }
        l
    }
}

/// [`QueueState`] shared between the watch handlers and the scheduling loop.
#[derive(Default)]
pub struct SchedulingQueue {
    pub state: Mutex<QueueState>,
    notify: tokio::sync::Notify,
}

impl SchedulingQueue {
    pub fn with<R>(&self, f: impl FnOnce(&mut QueueState) -> R) -> R {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut g);
        drop(g);
        self.notify.notify_one();
        r
    }
    /// Wait for the next pod to schedule.
    pub async fn pop(&self) -> Popped {
        loop {
            let notified = self.notify.notified();
            let (popped, wake) = {
                let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
                (g.pop(Instant::now()), g.next_backoff())
            };
            if let Some(p) = popped {
                return p;
            }
            let sleep = wake.map(|t| t.saturating_duration_since(Instant::now())).unwrap_or(Duration::from_secs(1));
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(sleep.max(Duration::from_millis(5))) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::types::testutil::*;
    use serde_json::json;

    fn p(name: &str, prio: i32) -> Arc<PodInfo> {
        pod(json!({"metadata": {"name": name}, "spec": {"priority": prio}}))
    }

    #[test]
    fn priority_then_fifo() {
        let mut q = QueueState::default();
        let now = Instant::now();
        q.add(p("a", 0));
        q.add(p("b", 10));
        q.add(p("c", 0));
        let order: Vec<String> = std::iter::from_fn(|| q.pop(now)).map(|x| x.info.name.clone()).collect();
        assert_eq!(order, vec!["b", "a", "c"]);
    }

    #[test]
    fn unschedulable_waits_for_an_event_then_backs_off() {
        let mut q = QueueState::default();
        let t0 = Instant::now();
        q.add(p("a", 0));
        let x = q.pop(t0).unwrap();
        assert_eq!(x.attempts, 1);
        q.unschedulable("default/a", vec!["NodeResourcesFit"], t0);
        assert_eq!(q.position("default/a"), Some(Where::Unschedulable));
        assert!(q.pop(t0 + Duration::from_secs(60)).is_none());
        // an irrelevant event leaves it alone
        q.move_all(t0, |pl| pl.contains(&"InterPodAffinity"));
        assert_eq!(q.position("default/a"), Some(Where::Unschedulable));
        // a node event moves it; it is still in its 1 s backoff
        q.move_all(t0, |_| true);
        assert_eq!(q.position("default/a"), Some(Where::Backoff));
        assert!(q.pop(t0 + Duration::from_millis(500)).is_none());
        let again = q.pop(t0 + Duration::from_millis(1001)).unwrap();
        assert_eq!(again.attempts, 2);
    }

    #[test]
    fn event_during_scheduling_sends_pod_to_backoff() {
        let mut q = QueueState::default();
        let t0 = Instant::now();
        q.add(p("a", 0));
        q.pop(t0).unwrap();
        q.move_all(t0, |_| true);
        q.unschedulable("default/a", vec!["NodeResourcesFit"], t0);
        assert_eq!(q.position("default/a"), Some(Where::Backoff));
    }

    #[test]
    fn long_unschedulable_pods_retry_and_deleted_pods_vanish() {
        let mut q = QueueState::default();
        let t0 = Instant::now();
        q.add(p("a", 0));
        q.add(p("b", 0));
        q.pop(t0).unwrap();
        q.unschedulable("default/a", vec![], t0);
        q.flush_unschedulable(t0 + MAX_UNSCHEDULABLE);
        assert_eq!(q.position("default/a"), Some(Where::Active));
        q.delete("default/b");
        let got: Vec<_> = std::iter::from_fn(|| q.pop(t0 + MAX_UNSCHEDULABLE)).map(|x| x.info.name.clone()).collect();
        assert_eq!(got, vec!["a"]);
        assert_eq!(q.lens(), (0, 0, 0));
    }

    #[test]
    fn backoff_doubles_to_ten_seconds() {
        assert_eq!(backoff_for(1), Duration::from_secs(1));
        assert_eq!(backoff_for(3), Duration::from_secs(4));
        assert_eq!(backoff_for(9), MAX_BACKOFF);
    }
}
