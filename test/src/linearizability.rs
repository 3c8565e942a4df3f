//! A linearizability checker for one register with read, write and compare-and-set, in the
//! manner of Knossos and Porcupine (the Wing & Gong search with Lowe's memoization): is
//! there one order of the operations, each taking effect at one instant between its call and
//! its return, in which every read sees the last write and every CAS succeeds exactly when
//! the register held its expected value?
//!
//! An operation whose answer never came (a timeout, a connection cut by a killed server)
//! may have taken effect at any instant after its call, or never: the checker may place it
//! anywhere after its call or leave it out. Values must be unique per write, so a read
//! names the write it saw.

use std::collections::HashSet;

/// What an operation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Read this value.
    Read(String),
    /// Wrote this value.
    Write(String),
    /// Compare-and-set from `old` to `new`; `ok`: whether it said it succeeded (ignored
    /// for an operation without an answer).
    Cas { old: String, new: String, ok: bool },
}

/// One operation: called at `call`, answered at `ret` (`None`: no answer), in any unit
/// that orders both (nanoseconds since the start, say).
#[derive(Clone, Debug)]
pub struct Op {
    pub client: usize,
    pub call: u64,
    pub ret: Option<u64>,
    pub kind: Kind,
}

/// The register after `op`, if `op` can take effect on `state` now.
fn step(state: &str, op: &Op) -> Option<String> {
    let answered = op.ret.is_some();
    match &op.kind {
        Kind::Read(v) => (v == state).then(|| state.to_string()),
        Kind::Write(v) => Some(v.clone()),
        Kind::Cas { old, new, ok } => {
            if !answered {
                // Its outcome is whatever the register made it.
                Some(if state == old { new.clone() } else { state.to_string() })
            } else if *ok {
                (state == old).then(|| new.clone())
            } else {
                (state != old).then(|| state.to_string())
            }
        }
    }
}

/// Whether the history is linearizable from the register holding `initial`; the error says
/// how far the longest linearized prefix got.
pub fn check(initial: &str, ops: &[Op]) -> Result<(), String> {
    let n = ops.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| ops[i].call);
    let words = n.div_ceil(64);
    let must = ops.iter().filter(|o| o.ret.is_some()).count();
    // Depth-first: (done set, register, how many answered ops are done).
    let mut stack: Vec<(Vec<u64>, String, usize)> = vec![(vec![0; words], initial.to_string(), 0)];
    let mut seen: HashSet<(Vec<u64>, String)> = HashSet::new();
    let mut best = 0usize;
    while let Some((done, state, answered)) = stack.pop() {
        if answered == must {
            return Ok(());
        }
        best = best.max(answered);
        let is_done = |i: usize| done[i / 64] & (1 << (i % 64)) != 0;
        // Every op not yet placed must take effect after the earliest answer among them:
        // only ops called before that answer can come next.
        let horizon = order.iter().filter(|&&i| !is_done(i)).filter_map(|&i| ops[i].ret).min().unwrap_or(u64::MAX);
        for &i in &order {
            if ops[i].call > horizon {
                break;
            }
            if is_done(i) {
                continue;
            }
            let Some(next) = step(&state, &ops[i]) else { continue };
            let mut d = done.clone();
            d[i / 64] |= 1 << (i % 64);
            if seen.insert((d.clone(), next.clone())) {
                stack.push((d, next, answered + usize::from(ops[i].ret.is_some())));
            }
        }
    }
    Err(format!("not linearizable: at most {best} of the {must} answered operations fit one order"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: usize, call: u64, ret: Option<u64>, kind: Kind) -> Op {
        Op { client, call, ret, kind }
    }
    fn r(v: &str) -> Kind {
        Kind::Read(v.into())
    }
    fn w(v: &str) -> Kind {
        Kind::Write(v.into())
    }
    fn cas(old: &str, new: &str, ok: bool) -> Kind {
        Kind::Cas { old: old.into(), new: new.into(), ok }
    }

    #[test]
    fn sequential_and_concurrent_histories() {
        // write a, then read a: fine; read b, never written: not.
        assert!(check("0", &[op(0, 0, Some(1), w("a")), op(1, 2, Some(3), r("a"))]).is_ok());
        assert!(check("0", &[op(0, 0, Some(1), w("a")), op(1, 2, Some(3), r("b"))]).is_err());
        // A stale read after a completed write is not linearizable.
        assert!(check("0", &[op(0, 0, Some(1), w("a")), op(1, 2, Some(3), r("0"))]).is_err());
        // Overlapping: the read may go either side of the write.
        assert!(check("0", &[op(0, 0, Some(10), w("a")), op(1, 2, Some(3), r("0"))]).is_ok());
        assert!(check("0", &[op(0, 0, Some(10), w("a")), op(1, 2, Some(3), r("a"))]).is_ok());
        // Reads that saw a, then the old value again: no single order.
        let h = [op(0, 0, Some(10), w("a")), op(1, 1, Some(2), r("a")), op(2, 3, Some(4), r("0"))];
        assert!(check("0", &h).is_err());
    }

    #[test]
    fn compare_and_set() {
        // Two CASes from 0 that both say they won: impossible.
        let h = [op(0, 0, Some(5), cas("0", "a", true)), op(1, 1, Some(6), cas("0", "b", true))];
        assert!(check("0", &h).is_err());
        // One wins, the other loses, a read sees the winner.
        let h = [
            op(0, 0, Some(5), cas("0", "a", true)),
            op(1, 1, Some(6), cas("0", "b", false)),
            op(2, 7, Some(8), r("a")),
        ];
        assert!(check("0", &h).is_ok());
        // A failed CAS while the register held its expected value all along: wrong.
        assert!(check("0", &[op(0, 0, Some(1), cas("0", "a", false)), op(1, 2, Some(3), r("0"))]).is_err());
    }

    #[test]
    fn unanswered_operations_may_or_may_not_have_happened() {
        // A write without an answer, seen later: it happened.
        assert!(check("0", &[op(0, 0, None, w("a")), op(1, 5, Some(6), r("a"))]).is_ok());
        // …or not seen: it never happened (or not yet).
        assert!(check("0", &[op(0, 0, None, w("a")), op(1, 5, Some(6), r("0"))]).is_ok());
        // But it cannot be seen before it was called.
        assert!(check("0", &[op(1, 0, Some(1), r("a")), op(0, 2, None, w("a"))]).is_err());
        // Seen, then unseen: no.
        let h = [op(0, 0, None, w("a")), op(1, 5, Some(6), r("a")), op(1, 7, Some(8), r("0"))];
        assert!(check("0", &h).is_err());
    }

    #[test]
    fn a_few_thousand_overlapping_operations() {
        // Each write overlaps a read that saw the write before it.
        let mut ops = Vec::new();
        let mut before = "0".to_string();
        for i in 0..1500u64 {
            let t = i * 10;
            let v = format!("v{i}");
            ops.push(op(0, t, Some(t + 3), w(&v)));
            ops.push(op(1, t + 1, Some(t + 5), r(&before)));
            before = v;
        }
        assert!(check("0", &ops).is_ok());
        // The last read made to see a value never written: found out.
        ops.last_mut().unwrap().kind = r("nope");
        assert!(check("0", &ops).is_err());
    }
}
