//! Module restarts, as the kubelet restarts containers: a module its base reports BROKEN,
//! or one gone from a live base after it ran (uninstalled behind the controller's back),
//! is installed again when the pod's `restartPolicy` says so — at once the first time, then
//! after the CrashLoopBackOff delays of [`common::backoff`] — and the pod's container status
//! counts the restarts (`restartCount`) and keeps how the previous instance ended
//! (`lastState`). Pure: the controller feeds it the base's reports and the time.

use std::time::Duration;

use common::backoff;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStateWaiting};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::tunnel::{ContainerState, ModuleReport};

/// How one instance of a module ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Ended {
    pub reason: String,
    pub message: String,
    /// BROKEN (a failure), not gone (an uninstall, as a container that exited 0).
    pub failed: bool,
    /// Epoch seconds.
    pub started: f64,
    pub finished: f64,
}

/// One module container's history in its pod. The base forgets a module's earlier
/// instances; the controller keeps what the kubelet keeps of exited containers. Every
/// module container has one: the ended instances are boxed, as most modules never end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    pub restart_count: i32,
    /// How the instance before the current one ended (`lastState`).
    pub last: Option<Box<Ended>>,
    /// When the current instance was seen running (epoch seconds).
    pub started: Option<f64>,
    /// An instance that ended and is not restarted yet.
    pub pending: Option<Box<Ended>>,
    /// Whether the back-off of `pending` was reported (one `BackOff` event per instance).
    pub backoff_reported: bool,
}

/// What a base's report changed.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    Nothing,
    /// The module runs (a new instance).
    Started,
    /// The instance ended.
    Ended(Ended),
}

/// What to do next.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Nothing (running, starting, never started, or not restarted under the policy).
    Keep,
    /// Install it again now.
    Restart,
    /// Install it again in `retry_in`; the container waits in CrashLoopBackOff for `delay`.
    BackOff { retry_in: Duration, delay: Duration },
}

/// Take in the base's report of the module (`None`: not on the base), at `now` (epoch seconds).
pub fn observe(h: &mut History, module: Option<&ModuleReport>, now: f64) -> Observed {
    let at = module.map(|m| m.change_time_ms as f64 / 1000.0).filter(|t| *t > 0.0).unwrap_or(now);
    match module {
        Some(m) if m.state == ContainerState::Activated => {
            if h.started.is_some() || h.pending.is_some() {
                return Observed::Nothing;
            }
            h.started = Some(at);
            Observed::Started
        }
        Some(m) if m.state == ContainerState::Broken => {
            // Already taken in: the same report again, or one from before the restart.
            let seen = h.last.iter().any(|e| e.failed && e.finished >= at);
            if seen || h.pending.is_some() {
                return Observed::Nothing;
            }
            let ended = Ended {
                reason: if m.reason.is_empty() { "Error".into() } else { m.reason.to_string() },
                message: m.message.to_string(),
                failed: true,
                started: h.started.take().unwrap_or(at).min(at),
                finished: at,
            };
            end(h, ended)
        }
        Some(m) if !matches!(m.state, ContainerState::Stopped | ContainerState::Deactivated) => Observed::Nothing,
        // Not on the base (or stopped): gone, if it ran.
        _ => match h.started {
            Some(started) if h.pending.is_none() => {
                h.started = None;
                end(
                    h,
                    Ended {
                        reason: "Uninstalled".into(),
                        message: "the module is no longer on its base".into(),
                        failed: false,
                        started,
                        finished: now,
                    },
                )
            }
            _ => Observed::Nothing,
        },
    }
}

fn end(h: &mut History, ended: Ended) -> Observed {
    h.pending = Some(Box::new(ended.clone()));
    h.backoff_reported = false;
    Observed::Ended(ended)
}

/// What to do about the module under `policy` (the pod's `restartPolicy`) at `now`.
pub fn decide(h: &History, policy: Option<&str>, now: f64) -> Next {
    let Some(e) = &h.pending else { return Next::Keep };
    if !backoff::restarts(policy, e.failed) {
        return Next::Keep;
    }
    match backoff::remaining(h.restart_count, e.started, e.finished, now) {
        None => Next::Restart,
        Some(retry_in) => Next::BackOff {
            retry_in,
            delay: backoff::delay(h.restart_count, Duration::from_secs_f64((e.finished - e.started).max(0.0))),
        },
    }
}

/// The module is being installed again.
pub fn restarted(h: &mut History) {
    if let Some(e) = h.pending.take() {
        h.restart_count += 1;
        h.last = Some(e);
    }
    h.started = None;
}

/// `lastState.terminated` of the container.
pub fn last_state(h: &History) -> Option<ContainerStateTerminated> {
    h.last.as_deref().map(terminated)
}

/// A container state for an ended instance.
pub fn terminated(e: &Ended) -> ContainerStateTerminated {
    let time = |s: f64| Time(Timestamp::from_millisecond((s * 1000.0) as i64).unwrap_or(Timestamp::UNIX_EPOCH));
    ContainerStateTerminated {
        exit_code: i32::from(e.failed),
        reason: Some(e.reason.clone()),
        message: (!e.message.is_empty()).then(|| e.message.clone()),
        started_at: Some(time(e.started)),
        finished_at: Some(time(e.finished)),
        ..Default::default()
    }
}

/// The waiting state while a back-off holds the restart.
pub fn crash_loop(delay: Duration, container: &str, pod: &str, namespace: &str, uid: &str) -> ContainerStateWaiting {
    ContainerStateWaiting {
        reason: Some("CrashLoopBackOff".into()),
        message: Some(backoff::message(delay, container, pod, namespace, uid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(state: ContainerState, at: f64, reason: &str) -> ModuleReport {
        ModuleReport { state, change_time_ms: (at * 1000.0) as i64, reason: reason.into(), message: "log tail".into() }
    }

    #[test]
    fn a_broken_module_restarts_at_once_then_after_growing_back_offs() {
        let mut h = History::default();
        assert_eq!(
            observe(&mut h, None, 100.0),
            Observed::Nothing,
            "never installed: the first install is not a restart"
        );
        assert_eq!(observe(&mut h, Some(&module(ContainerState::Resolved, 100.0, "")), 100.5), Observed::Nothing);
        assert_eq!(observe(&mut h, Some(&module(ContainerState::Activated, 101.0, "")), 101.0), Observed::Started);
        assert_eq!(decide(&h, None, 101.0), Next::Keep);

        // It breaks: restarted at once (restart 1).
        let broken = module(ContainerState::Broken, 150.0, "ModuleExited");
        let Observed::Ended(e) = observe(&mut h, Some(&broken), 151.0) else { panic!("not ended") };
        assert!(e.failed && e.started == 101.0 && e.finished == 150.0 && e.reason == "ModuleExited");
        assert_eq!(decide(&h, None, 151.0), Next::Restart);
        restarted(&mut h);
        assert_eq!((h.restart_count, last_state(&h).map(|t| t.exit_code)), (1, Some(1)));
        // The same BROKEN report again (before the reinstall is reported): nothing new.
        assert_eq!(observe(&mut h, Some(&broken), 152.0), Observed::Nothing);
        assert_eq!(decide(&h, None, 152.0), Next::Keep);

        // Runs again, breaks again 5 s later: 10 s back-off from its end.
        assert_eq!(observe(&mut h, Some(&module(ContainerState::Activated, 153.0, "")), 153.0), Observed::Started);
        assert!(matches!(
            observe(&mut h, Some(&module(ContainerState::Broken, 158.0, "X")), 158.0),
            Observed::Ended(_)
        ));
        let Next::BackOff { retry_in, delay } = decide(&h, None, 160.0) else { panic!("no back-off") };
        assert_eq!((retry_in.as_secs(), delay.as_secs()), (8, 10));
        assert_eq!(decide(&h, None, 168.0), Next::Restart);
        restarted(&mut h);
        assert_eq!(h.restart_count, 2);
        // The third failure waits 20 s.
        observe(&mut h, Some(&module(ContainerState::Activated, 170.0, "")), 170.0);
        observe(&mut h, Some(&module(ContainerState::Broken, 171.0, "X")), 171.0);
        assert!(matches!(decide(&h, None, 171.0), Next::BackOff { delay, .. } if delay.as_secs() == 20));
    }

    #[test]
    fn the_policy_decides_and_an_uninstall_behind_the_back_counts_as_an_exit() {
        let run = |h: &mut History| observe(h, Some(&module(ContainerState::Activated, 10.0, "")), 10.0);
        let mut h = History::default();
        run(&mut h);
        let Observed::Ended(e) = observe(&mut h, None, 20.0) else { panic!("gone after it ran") };
        assert!(!e.failed && e.reason == "Uninstalled");
        assert_eq!(decide(&h, Some("Always"), 20.0), Next::Restart);
        assert_eq!(decide(&h, Some("OnFailure"), 20.0), Next::Keep);
        assert_eq!(observe(&mut h, None, 21.0), Observed::Nothing, "reported once");

        let mut h = History::default();
        run(&mut h);
        observe(&mut h, Some(&module(ContainerState::Broken, 30.0, "")), 30.0);
        assert_eq!(decide(&h, Some("Never"), 30.0), Next::Keep);
        assert_eq!(decide(&h, Some("OnFailure"), 30.0), Next::Restart);
        assert_eq!(h.pending.as_ref().map(|e| e.reason.as_str()), Some("Error"));
    }

    #[test]
    fn waiting_and_terminated_states_read_as_the_kubelet_writes_them() {
        let w = crash_loop(Duration::from_secs(10), "biz1", "p", "default", "u");
        assert_eq!(w.reason.as_deref(), Some("CrashLoopBackOff"));
        assert_eq!(w.message.as_deref(), Some("back-off 10s restarting failed container=biz1 pod=p_default(u)"));
        let t = terminated(&Ended {
            reason: "R".into(),
            message: String::new(),
            failed: false,
            started: 1.0,
            finished: 2.5,
        });
        assert_eq!((t.exit_code, t.message), (0, None));
        assert_eq!(t.finished_at.map(|t| t.0.as_millisecond()), Some(2500));
    }
}
