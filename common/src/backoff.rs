//! Kubernetes' container restart back-off (CrashLoopBackOff), as a pure function of the
//! restart count and when the last instance finished: the first restart is immediate,
//! then 10 s, 20 s, 40 s … capped at 300 s. A container that ran for 10 minutes resets it.
//! The kubelet restarts containers by it, the module controller modules.

use std::time::Duration;

pub const INITIAL: Duration = Duration::from_secs(10);
pub const MAX: Duration = Duration::from_secs(300);
/// A container that ran this long before exiting starts its back-off afresh.
pub const RESET_AFTER: Duration = Duration::from_secs(600);

/// The back-off before restart number `restart_count + 1`.
pub fn delay(restart_count: i32, ran_for: Duration) -> Duration {
    if restart_count <= 0 || ran_for >= RESET_AFTER {
        return Duration::ZERO;
    }
    let exp = (restart_count - 1).min(16) as u32;
    INITIAL.saturating_mul(1 << exp).min(MAX)
}

/// How long to wait still (None: restart now), given the last instance's start and
/// finish times and `now`, all as seconds since the epoch (fractional).
pub fn remaining(restart_count: i32, started: f64, finished: f64, now: f64) -> Option<Duration> {
    let ran_for = Duration::from_secs_f64((finished - started).max(0.0));
    let d = delay(restart_count, ran_for).as_secs_f64();
    let left = finished + d - now;
    (left > 0.0).then(|| Duration::from_secs_f64(left))
}

/// Whether a container that ended (`failed`: a non-zero exit, or a module that broke) is
/// started again under the pod's `restartPolicy` (unset: `Always`).
pub fn restarts(policy: Option<&str>, failed: bool) -> bool {
    match policy.unwrap_or("Always") {
        "Never" => false,
        "OnFailure" => failed,
        _ => true,
    }
}

/// The waiting container's message (and the `BackOff` event's), as the kubelet words it.
pub fn message(delay: Duration, container: &str, pod: &str, namespace: &str, uid: &str) -> String {
    format!("back-off {}s restarting failed container={container} pod={pod}_{namespace}({uid})", delay.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps() {
        let s = Duration::from_secs(1);
        assert_eq!(delay(0, s), Duration::ZERO);
        assert_eq!(delay(1, s), Duration::from_secs(10));
        assert_eq!(delay(2, s), Duration::from_secs(20));
        assert_eq!(delay(3, s), Duration::from_secs(40));
        assert_eq!(delay(6, s), Duration::from_secs(300));
        assert_eq!(delay(100, s), Duration::from_secs(300));
    }

    #[test]
    fn policies() {
        assert!(restarts(None, false) && restarts(Some("Always"), false));
        assert!(restarts(Some("OnFailure"), true) && !restarts(Some("OnFailure"), false));
        assert!(!restarts(Some("Never"), true));
        assert_eq!(
            message(Duration::from_secs(20), "biz1", "p", "default", "u-1"),
            "back-off 20s restarting failed container=biz1 pod=p_default(u-1)"
        );
    }

    #[test]
    fn long_run_resets() {
        assert_eq!(delay(5, Duration::from_secs(601)), Duration::ZERO);
    }

    #[test]
    fn remaining_counts_from_finish() {
        assert_eq!(remaining(0, 0.0, 1.0, 1.0), None);
        let r = remaining(1, 0.0, 1.0, 5.0).unwrap();
        assert!((r.as_secs_f64() - 6.0).abs() < 1e-6);
        assert_eq!(remaining(1, 0.0, 1.0, 12.0), None);
    }
}
