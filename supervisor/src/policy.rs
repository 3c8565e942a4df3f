//! The supervisor's decisions, pure: what a component is, when a crashed one starts
//! again, and what a changed set of components means for the running ones.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One component: `<dir>/<name>.json`, written by `scripts/cluster`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub name: String,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Where stdout and stderr go (appended).
    pub log: PathBuf,
    /// Start order (lower first); stopped in reverse.
    #[serde(default)]
    pub order: i64,
}

/// The first restart waits this long; each crash in a row doubles it, up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A component that ran this long before exiting counts as healthy: its next restart waits
/// [`FIRST_BACKOFF`] again.
pub const HEALTHY_RUN: Duration = Duration::from_secs(30);

/// How long to wait before starting a component again, given how long its last run lasted
/// and how many short runs came before it (`crashes`, updated).
pub fn backoff(ran_for: Duration, crashes: &mut u32) -> Duration {
    if ran_for >= HEALTHY_RUN {
        *crashes = 0;
    }
    let delay = FIRST_BACKOFF.saturating_mul(1u32 << (*crashes).min(16)).min(MAX_BACKOFF);
    *crashes = crashes.saturating_add(1);
    delay
}

/// What to do when the set of specs changes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reload {
    /// New components.
    pub start: Vec<String>,
    /// Components no longer wanted.
    pub stop: Vec<String>,
    /// Components whose spec changed: stopped, then started with the new one.
    pub restart: Vec<String>,
}

pub fn reload(running: &BTreeMap<String, Spec>, wanted: &BTreeMap<String, Spec>) -> Reload {
    let mut r = Reload::default();
    for (name, spec) in wanted {
        match running.get(name) {
            None => r.start.push(name.clone()),
            Some(old) if old != spec => r.restart.push(name.clone()),
            Some(_) => {}
        }
    }
    r.stop = running.keys().filter(|n| !wanted.contains_key(*n)).cloned().collect();
    r
}

/// How an exit reads in `scripts/cluster status` and the log.
pub fn describe_exit(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s} ({})", signal_name(s)),
        _ => "unknown".into(),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        1 => "SIGHUP",
        2 => "SIGINT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        15 => "SIGTERM",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, arg: &str) -> Spec {
        Spec { name: name.into(), argv: vec![name.into(), arg.into()], log: "/l".into(), order: 0 }
    }

    #[test]
    fn crashes_in_a_row_back_off_exponentially_up_to_a_cap_and_a_healthy_run_resets() {
        let mut crashes = 0;
        let quick = Duration::from_millis(100);
        let delays: Vec<u64> = (0..8).map(|_| backoff(quick, &mut crashes).as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(backoff(HEALTHY_RUN, &mut crashes), FIRST_BACKOFF);
        assert_eq!(crashes, 1);
        // No overflow however long it crashes.
        crashes = u32::MAX;
        assert_eq!(backoff(quick, &mut crashes), MAX_BACKOFF);
    }

    #[test]
    fn a_reload_starts_new_stops_gone_and_restarts_changed_components() {
        let running: BTreeMap<String, Spec> =
            [("a", spec("a", "1")), ("b", spec("b", "1")), ("c", spec("c", "1"))].map(|(n, s)| (n.into(), s)).into();
        let wanted: BTreeMap<String, Spec> =
            [("a", spec("a", "1")), ("b", spec("b", "2")), ("d", spec("d", "1"))].map(|(n, s)| (n.into(), s)).into();
        assert_eq!(
            reload(&running, &wanted),
            Reload { start: vec!["d".into()], stop: vec!["c".into()], restart: vec!["b".into()] }
        );
        assert_eq!(reload(&wanted, &wanted), Reload::default());
    }

    #[test]
    fn exits_are_described_as_people_read_them() {
        assert_eq!(describe_exit(Some(1), None), "exit code 1");
        assert_eq!(describe_exit(None, Some(9)), "signal 9 (SIGKILL)");
    }
}
