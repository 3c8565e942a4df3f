//! What a pod worker does next, decided by pure functions: [`compute_pod_actions`] for a pod
//! the API knows, [`compute_gone_pod_actions`] for one it no longer has. They look at the pod,
//! at what of it exists in Docker, at the time and at the worker's back-offs, and answer with
//! actions; `worker.rs` gathers those inputs, carries the actions out and reports the status.
//! After a step that changes what runs (a kill, a new sandbox) the worker lists the pod's
//! containers again and asks anew.
//!
//! The rules for a known pod, in the order they are tried:
//! 1. Being deleted: stop everything (preStop hooks first) within the grace period; the
//!    worker then deletes the object for good.
//! 2. Succeeded or Failed: stop whatever still runs.
//! 3. A liveness or startup probe failed: stop that container (the next decision restarts it
//!    per the restart policy).
//! 4. No running sandbox: with restartPolicy Never and every app container exited there is
//!    nothing left to run; otherwise stop what runs, remove the dead sandboxes and create a
//!    new one (once the back-off of a failed creation allows).
//! 5. The sandbox runs: init containers one at a time, in order, up to the first that has
//!    not succeeded (all skipped once an app container ever ran); then every app container
//!    per the restart policy; then the ephemeral containers, each started once, never again.
//!
//! Starts wait for two back-offs: CrashLoopBackOff (`backoff.rs`, counted from the previous
//! instance's start and finish) before a restart, and the worker's own after a failed create
//! or start.
//!
//! What the kubelet does not do (and these functions therefore never ask for): kill a running
//! container because its spec changed (a new image applies from its next restart), or kill a
//! container whose name the spec no longer has.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use crate::labels::{self, Kind};
use crate::podconfig;
use crate::runtime::{ContainerRecord, State};
use crate::status::{instances, named};
use common::backoff;

/// What the worker sees of the pod in Docker when it decides.
pub struct Observed<'a> {
    /// Every container of the pod (sandboxes included), in any state.
    pub records: &'a [ContainerRecord],
    /// Container id → the message of a liveness or startup probe that wants it killed.
    pub probe_kills: &'a HashMap<String, String>,
}

/// The time of the decision on both clocks: the worker's back-offs count on the monotonic
/// one, the crash-loop back-off on the wall clock (Docker's start and finish times).
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub instant: Instant,
    /// Seconds since the epoch.
    pub unix: f64,
}

impl Now {
    /// The time now.
    pub fn current() -> Now {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        Now { instant: Instant::now(), unix }
    }
}

/// A back-off after a failure: no new attempt before `until`; `delay` is the wait that was
/// chosen, doubled after the next failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub until: Instant,
    pub delay: Duration,
}

/// The worker's back-offs that hold an action.
pub struct BackOffs<'a> {
    /// After a failed sandbox creation.
    pub sandbox: Option<Retry>,
    /// Container name → after a failed create or start of it.
    pub start: &'a HashMap<String, Retry>,
}

/// A container a failed probe condemned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    pub id: String,
    pub name: String,
    /// Why (the probe's words), for the log and the `Unhealthy` event.
    pub message: String,
}

/// The next step for a pod the API knows.
#[derive(Debug, Clone, PartialEq)]
pub enum PodActions {
    /// The pod is being deleted: stop and remove all of it (preStop hooks first) within
    /// `grace`, then delete the object for good.
    KillPod { grace: Duration },
    /// The pod Succeeded or Failed: stop these containers, which still run.
    StopTerminal { stop: Vec<String>, grace: Duration },
    /// Liveness or startup probes failed: stop these containers.
    KillUnhealthy { kills: Vec<Kill>, grace: Duration },
    /// No sandbox, and restartPolicy Never with every app container exited: nothing is left
    /// to run, only the status to report.
    Finished,
    /// No running sandbox: stop the containers `stop` (2 s of grace), remove the dead
    /// sandboxes `remove` (giving their IPs back), then create sandbox number `attempt` —
    /// unless a failed creation's back-off still holds it for `wait`.
    CreateSandbox { stop: Vec<String>, remove: Vec<ContainerRecord>, attempt: i32, wait: Option<Duration> },
    /// The sandbox runs: prepare the volumes, then carry out `steps` in order.
    SyncContainers { sandbox: Box<ContainerRecord>, steps: Vec<ContainerAction> },
}

/// One step for one container of a pod whose sandbox runs.
#[derive(Debug, Clone, PartialEq)]
pub enum ContainerAction {
    /// It runs: forget why it waited and its failed-start back-off; make sure its probes run.
    KeepRunning { container: Container, record: ContainerRecord },
    /// It needs nothing (an init container that succeeded, an app container done for good
    /// under its restart policy, an ephemeral container that was started): forget why it waited.
    Forget { name: String },
    /// Remove an instance that never ran (created, or in an unknown state): a fresh one follows.
    Remove { id: String },
    /// Start a new instance.
    Start(StartContainer),
    /// CrashLoopBackOff holds the restart for `retry_in` (the container waits with `message`).
    CrashLoopBackOff { name: String, message: String, retry_in: Duration },
    /// A failed create or start holds the next attempt for `retry_in` (the container keeps
    /// the waiting reason that failure gave it).
    StartBackOff { retry_in: Duration },
    /// An ephemeral container waits for its target container to run.
    WaitForTarget { name: String, message: String, retry_in: Duration },
}

/// A container to start.
#[derive(Debug, Clone, PartialEq)]
pub struct StartContainer {
    pub container: Container,
    pub kind: Kind,
    /// The instance it replaces: the new one's restart count is one more.
    pub previous: Option<ContainerRecord>,
    /// The Docker id of the container whose process namespace it joins (an ephemeral
    /// container's target).
    pub pid_target: Option<String>,
}

/// The next step for a pod the API no longer has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoneActions {
    /// The first full list of pods has not arrived: the pod may only be unlisted yet.
    WaitForPodList,
    /// Nothing of the pod is left: the worker may stop.
    Done,
    /// Containers of the pod remain (deleted while the kubelet was down, or force-deleted):
    /// stop and remove them all with `grace` (at most 2 s).
    RemoveContainers { grace: Duration },
}

/// The decision for a pod whose object is gone from the API (`pods_synced`: the first full
/// list of pods arrived).
pub fn compute_gone_pod_actions(pods_synced: bool, records: &[ContainerRecord]) -> GoneActions {
    if !pods_synced {
        return GoneActions::WaitForPodList;
    }
    if records.is_empty() {
        return GoneActions::Done;
    }
    // The pod's own grace period is on its sandbox; the pod is gone, so no more than 2 s.
    let grace = records
        .iter()
        .find_map(|r| r.labels.get(labels::GRACE_PERIOD).and_then(|g| g.parse::<u64>().ok()))
        .unwrap_or(30)
        .min(2);
    GoneActions::RemoveContainers { grace: Duration::from_secs(grace) }
}

/// The decision for a pod the API knows: see the module's documentation for the rules.
pub fn compute_pod_actions(pod: &Pod, observed: &Observed, now: Now, backoffs: &BackOffs) -> PodActions {
    let records = observed.records;
    let spec = pod.spec.clone().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        let grace =
            pod.metadata.deletion_grace_period_seconds.or(spec.termination_grace_period_seconds).unwrap_or(30).max(0)
                as u64;
        return PodActions::KillPod { grace: Duration::from_secs(grace) };
    }
    let grace = Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).max(0) as u64);
    let running = || records.iter().filter(|r| r.state == State::Running);

    // A terminal pod keeps nothing running.
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
    if phase == "Succeeded" || phase == "Failed" {
        return PodActions::StopTerminal { stop: running().map(|r| r.id.clone()).collect(), grace };
    }

    // Containers whose liveness or startup probe failed.
    let kills: Vec<Kill> = running()
        .filter(|r| r.kind == Kind::App)
        .filter_map(|r| {
            let message = observed.probe_kills.get(&r.id)?;
            Some(Kill { id: r.id.clone(), name: r.name.clone(), message: message.clone() })
        })
        .collect();
    if !kills.is_empty() {
        return PodActions::KillUnhealthy { kills, grace };
    }

    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let Some(sandbox) = running_sandbox(records) else {
        let all_exited = !spec.containers.is_empty()
            && spec
                .containers
                .iter()
                .all(|c| matches!(instances(records, &c.name, Kind::App).0, Some(r) if r.state == State::Exited));
        if all_exited && policy == "Never" {
            return PodActions::Finished;
        }
        let sandboxes = records.iter().filter(|r| r.kind == Kind::Sandbox);
        return PodActions::CreateSandbox {
            stop: running().map(|r| r.id.clone()).collect(),
            remove: sandboxes.clone().cloned().collect(),
            attempt: sandboxes.map(|r| r.restart_count + 1).max().unwrap_or(0),
            wait: backoffs.sandbox.filter(|b| now.instant < b.until).map(|b| b.until - now.instant),
        };
    };
    PodActions::SyncContainers {
        sandbox: Box::new(sandbox.clone()),
        steps: container_actions(pod, &spec, policy, records, now, backoffs),
    }
}

/// The pod's newest running sandbox (pause container).
pub fn running_sandbox(records: &[ContainerRecord]) -> Option<&ContainerRecord> {
    records.iter().filter(|r| r.kind == Kind::Sandbox && r.state == State::Running).max_by_key(|r| r.created)
}

/// Init containers, app containers, ephemeral containers (rule 5 of the module's documentation).
fn container_actions(
    pod: &Pod,
    spec: &PodSpec,
    policy: &str,
    records: &[ContainerRecord],
    now: Now,
    backoffs: &BackOffs,
) -> Vec<ContainerAction> {
    let mut out = Vec::new();
    let start = |c: &Container, kind: Kind, previous: Option<&ContainerRecord>, pid_target: Option<String>| {
        start_or_back_off(pod, c, kind, previous, pid_target, now, backoffs)
    };

    // Init containers, one at a time, unless the app containers already ran.
    let apps_started = spec.containers.iter().any(|c| instances(records, &c.name, Kind::App).0.is_some());
    let mut init_pending = false;
    if !apps_started {
        for c in spec.init_containers.iter().flatten() {
            match instances(records, &c.name, Kind::Init).0 {
                Some(r) if r.state == State::Exited && r.exit_code == 0 => {
                    out.push(ContainerAction::Forget { name: c.name.clone() });
                    continue;
                }
                // Running: wait for it to finish.
                Some(r) if r.state == State::Running => {}
                // Failed: retried unless restartPolicy is Never (then the pod has failed).
                Some(r) if r.state == State::Exited => {
                    if policy != "Never" {
                        out.push(start(c, Kind::Init, Some(r), None));
                    }
                }
                Some(r) => {
                    out.push(ContainerAction::Remove { id: r.id.clone() });
                    out.push(start(c, Kind::Init, None, None));
                }
                None => out.push(start(c, Kind::Init, None, None)),
            }
            init_pending = true;
            break;
        }
    }

    if !init_pending {
        for c in &spec.containers {
            match instances(records, &c.name, Kind::App).0 {
                Some(r) if r.state == State::Running => {
                    out.push(ContainerAction::KeepRunning { container: c.clone(), record: r.clone() })
                }
                Some(r) if r.state == State::Exited => {
                    let restart = backoff::restarts(Some(policy), r.exit_code != 0);
                    if restart {
                        out.push(start(c, Kind::App, Some(r), None));
                    } else {
                        out.push(ContainerAction::Forget { name: c.name.clone() });
                    }
                }
                Some(r) => {
                    out.push(ContainerAction::Remove { id: r.id.clone() });
                    out.push(start(c, Kind::App, None, None));
                }
                None => out.push(start(c, Kind::App, None, None)),
            }
        }
    }

    // Ephemeral containers (`kubectl debug`): each started once, even before the pod is
    // initialized, and never restarted. One that targets a container joins its process
    // namespace, so it waits for that container to run.
    for e in spec.ephemeral_containers.iter().flatten() {
        if instances(records, &e.name, Kind::Ephemeral).0.is_some() {
            out.push(ContainerAction::Forget { name: e.name.clone() });
            continue;
        }
        let mut pid_target = None;
        if let Some(target) = e.target_container_name.as_deref().filter(|t| !t.is_empty()) {
            match named(records, target).0.filter(|r| r.state == State::Running) {
                Some(r) => pid_target = Some(r.id.clone()),
                None => {
                    out.push(ContainerAction::WaitForTarget {
                        name: e.name.clone(),
                        message: format!("waiting for the target container {target:?} to run"),
                        retry_in: Duration::from_secs(1),
                    });
                    continue;
                }
            }
        }
        out.push(start(&podconfig::ephemeral_as_container(e), Kind::Ephemeral, None, pid_target));
    }
    out
}

/// Start `c`, unless a back-off holds it: CrashLoopBackOff after `previous` (the instance it
/// replaces), then the back-off of a failed create or start.
fn start_or_back_off(
    pod: &Pod,
    c: &Container,
    kind: Kind,
    previous: Option<&ContainerRecord>,
    pid_target: Option<String>,
    now: Now,
    backoffs: &BackOffs,
) -> ContainerAction {
    if let Some(p) = previous {
        if let Some(left) = backoff::remaining(p.restart_count, secs(&p.started_at), secs(&p.finished_at), now.unix) {
            let d = backoff::delay(p.restart_count, Duration::ZERO);
            let pr = podconfig::pod_ref(pod);
            let message = backoff::message(d, &c.name, &pr.name, &pr.namespace, &pr.uid);
            return ContainerAction::CrashLoopBackOff { name: c.name.clone(), message, retry_in: left };
        }
    }
    if let Some(b) = backoffs.start.get(&c.name) {
        if now.instant < b.until {
            return ContainerAction::StartBackOff { retry_in: b.until - now.instant };
        }
    }
    ContainerAction::Start(StartContainer { container: c.clone(), kind, previous: previous.cloned(), pid_target })
}

/// An RFC 3339 time as seconds since the epoch (0 when absent or unreadable).
fn secs(t: &Option<String>) -> f64 {
    t.as_ref()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_millisecond() as f64 / 1000.0)
        .unwrap_or_default()
}

/// The containers that wait with `CreateContainerConfigError` while the pod's volumes cannot
/// be prepared: every init and app container without a running app instance of that name
/// (init containers are looked up among the app instances too, so they always wait).
pub fn held_by_volumes(spec: &PodSpec, records: &[ContainerRecord]) -> Vec<String> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter(|c| !matches!(instances(records, &c.name, Kind::App).0, Some(r) if r.state == State::Running))
        .map(|c| c.name.clone())
        .collect()
}

/// The instances to remove: of every container, the newest two that no longer run are kept
/// (the current and the previous one, for status and `logs --previous`).
pub fn old_instances(records: &[ContainerRecord]) -> Vec<String> {
    let mut by_name: HashMap<(&str, Kind), Vec<&ContainerRecord>> = HashMap::new();
    for r in records.iter().filter(|r| r.state != State::Running && r.kind != Kind::Sandbox) {
        by_name.entry((r.name.as_str(), r.kind)).or_default().push(r);
    }
    let mut out = Vec::new();
    for (_, mut v) in by_name {
        v.sort_by_key(|r| std::cmp::Reverse((r.restart_count, r.created)));
        out.extend(v.iter().skip(2).map(|r| r.id.clone()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// 2026-01-01T00:00:00Z: every test instance started then; exited ones finished 5 s later.
    const T0: f64 = 1_767_225_600.0;

    fn pod(policy: &str, spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["restartPolicy"] = json!(policy);
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": spec,
        }))
        .unwrap()
    }

    /// A pod with app containers `web` and `side` and the init containers `inits`.
    fn web_pod(policy: &str, inits: &[&str]) -> Pod {
        let inits: Vec<_> = inits.iter().map(|n| json!({"name": n, "image": "busybox"})).collect();
        pod(
            policy,
            json!({"initContainers": inits, "containers": [
                {"name": "web", "image": "busybox"}, {"name": "side", "image": "busybox"}]}),
        )
    }

    use crate::status::tests::rec;

    fn sandbox(id: &str, state: State, attempt: i32) -> ContainerRecord {
        rec(id, labels::SANDBOX_NAME, Kind::Sandbox, state, 0, attempt)
    }

    /// `secs` after every test instance started.
    fn at(secs: f64) -> Now {
        Now { instant: Instant::now(), unix: T0 + secs }
    }

    fn decide_at(pod: &Pod, records: &[ContainerRecord], now: Now, start: &HashMap<String, Retry>) -> PodActions {
        let kills = HashMap::new();
        compute_pod_actions(pod, &Observed { records, probe_kills: &kills }, now, &BackOffs { sandbox: None, start })
    }

    fn decide(pod: &Pod, records: &[ContainerRecord]) -> PodActions {
        decide_at(pod, records, at(3600.0), &HashMap::new())
    }

    /// The steps of a pod whose sandbox runs.
    fn steps(actions: PodActions) -> Vec<ContainerAction> {
        match actions {
            PodActions::SyncContainers { steps, .. } => steps,
            other => panic!("expected container steps, got {other:?}"),
        }
    }

    /// Steps in short: `start web`, `start web after 3`, `forget web`, `remove x`, `keep web`, …
    fn short(steps: &[ContainerAction]) -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                ContainerAction::KeepRunning { container, .. } => format!("keep {}", container.name),
                ContainerAction::Forget { name } => format!("forget {name}"),
                ContainerAction::Remove { id } => format!("remove {id}"),
                ContainerAction::Start(StartContainer { container, kind, previous: None, .. }) => {
                    format!("start {} {}", kind.as_str(), container.name)
                }
                ContainerAction::Start(StartContainer { container, kind, previous: Some(p), .. }) => {
                    format!("start {} {} after {}", kind.as_str(), container.name, p.id)
                }
                ContainerAction::CrashLoopBackOff { name, .. } => format!("crashloop {name}"),
                ContainerAction::StartBackOff { .. } => "start-backoff".into(),
                ContainerAction::WaitForTarget { name, .. } => format!("wait-target {name}"),
            })
            .collect()
    }

    #[test]
    fn fresh_pod_creates_its_sandbox() {
        let p = web_pod("Always", &[]);
        assert_eq!(decide(&p, &[]), PodActions::CreateSandbox { stop: vec![], remove: vec![], attempt: 0, wait: None });
    }

    #[test]
    fn dead_sandbox_is_recreated_after_stopping_what_runs() {
        let p = web_pod("Always", &[]);
        let dead = sandbox("s1", State::Exited, 0);
        let records = vec![dead.clone(), rec("w1", "web", Kind::App, State::Running, 0, 0)];
        assert_eq!(
            decide(&p, &records),
            PodActions::CreateSandbox { stop: vec!["w1".into()], remove: vec![dead], attempt: 1, wait: None }
        );
    }

    #[test]
    fn sandbox_creation_waits_for_the_back_off_of_a_failed_one() {
        let p = web_pod("Always", &[]);
        let now = at(0.0);
        let kills = HashMap::new();
        let observed = Observed { records: &[], probe_kills: &kills };
        let start = HashMap::new();
        let held = Retry { until: now.instant + Duration::from_secs(3), delay: Duration::from_secs(2) };
        let backoffs = BackOffs { sandbox: Some(held), start: &start };
        let PodActions::CreateSandbox { wait, .. } = compute_pod_actions(&p, &observed, now, &backoffs) else {
            panic!("expected a sandbox creation")
        };
        assert_eq!(wait, Some(Duration::from_secs(3)));
        let over = Now { instant: now.instant + Duration::from_secs(4), ..now };
        let PodActions::CreateSandbox { wait, .. } = compute_pod_actions(&p, &observed, over, &backoffs) else {
            panic!("expected a sandbox creation")
        };
        assert_eq!(wait, None);
    }

    #[test]
    fn never_restarted_pod_whose_containers_all_exited_needs_no_sandbox() {
        let records =
            vec![rec("w1", "web", Kind::App, State::Exited, 0, 0), rec("s1", "side", Kind::App, State::Exited, 1, 0)];
        assert_eq!(decide(&web_pod("Never", &[]), &records), PodActions::Finished);
        // Under another policy they would run again: a new sandbox first.
        assert!(matches!(decide(&web_pod("OnFailure", &[]), &records), PodActions::CreateSandbox { .. }));
    }

    #[test]
    fn init_containers_run_one_at_a_time_in_order() {
        let p = web_pod("Always", &["a", "b"]);
        let sb = sandbox("sb", State::Running, 0);
        assert_eq!(short(&steps(decide(&p, std::slice::from_ref(&sb)))), ["start init a"]);
        let a_runs = vec![sb.clone(), rec("a1", "a", Kind::Init, State::Running, 0, 0)];
        assert_eq!(short(&steps(decide(&p, &a_runs))), Vec::<String>::new());
        let a_done = vec![sb.clone(), rec("a1", "a", Kind::Init, State::Exited, 0, 0)];
        assert_eq!(short(&steps(decide(&p, &a_done))), ["forget a", "start init b"]);
        let both_done =
            vec![sb, rec("a1", "a", Kind::Init, State::Exited, 0, 0), rec("b1", "b", Kind::Init, State::Exited, 0, 0)];
        assert_eq!(short(&steps(decide(&p, &both_done))), ["forget a", "forget b", "start app web", "start app side"]);
    }

    #[test]
    fn failed_init_container_per_restart_policy() {
        let records = vec![sandbox("sb", State::Running, 0), rec("a1", "a", Kind::Init, State::Exited, 1, 0)];
        // Never: the pod has failed; nothing runs again, the app containers never start.
        assert_eq!(short(&steps(decide(&web_pod("Never", &["a"]), &records))), Vec::<String>::new());
        // OnFailure and Always: the init container again (its first restart is immediate).
        assert_eq!(short(&steps(decide(&web_pod("OnFailure", &["a"]), &records))), ["start init a after a1"]);
        assert_eq!(short(&steps(decide(&web_pod("Always", &["a"]), &records))), ["start init a after a1"]);
        // A second failure backs off.
        let again = vec![records[0].clone(), rec("a2", "a", Kind::Init, State::Exited, 1, 1)];
        assert_eq!(
            short(&steps(decide_at(&web_pod("Always", &["a"]), &again, at(6.0), &HashMap::new()))),
            ["crashloop a"]
        );
    }

    #[test]
    fn init_containers_are_skipped_once_an_app_container_ran() {
        let p = web_pod("Always", &["a"]);
        let records = vec![sandbox("sb", State::Running, 0), rec("w1", "web", Kind::App, State::Exited, 0, 0)];
        assert_eq!(short(&steps(decide(&p, &records))), ["start app web after w1", "start app side"]);
    }

    #[test]
    fn exited_app_container_per_restart_policy() {
        for (policy, exit, want) in [
            ("Always", 0, "start app web after w1"),
            ("Always", 1, "start app web after w1"),
            ("OnFailure", 0, "forget web"),
            ("OnFailure", 1, "start app web after w1"),
            ("Never", 0, "forget web"),
            ("Never", 1, "forget web"),
        ] {
            let records = vec![
                sandbox("sb", State::Running, 0),
                rec("w1", "web", Kind::App, State::Exited, exit, 0),
                rec("s1", "side", Kind::App, State::Running, 0, 0),
            ];
            assert_eq!(short(&steps(decide(&web_pod(policy, &[]), &records))), [want, "keep side"], "{policy} {exit}");
        }
    }

    #[test]
    fn crash_loop_back_off_holds_a_restart_until_it_expires() {
        let p = web_pod("Always", &[]);
        // The second instance (restart count 1) ran 5 s and exited: 10 s before the next.
        let records = vec![sandbox("sb", State::Running, 0), rec("w2", "web", Kind::App, State::Exited, 1, 1)];
        let soon = decide_at(&p, &records, at(10.0), &HashMap::new());
        let ContainerAction::CrashLoopBackOff { name, message, retry_in } = &steps(soon)[0] else {
            panic!("expected a back-off")
        };
        assert_eq!(name, "web");
        assert_eq!(message, "back-off 10s restarting failed container=web pod=p_ns(u)");
        assert!((retry_in.as_secs_f64() - 5.0).abs() < 1e-6, "{retry_in:?}");
        let later = decide_at(&p, &records, at(16.0), &HashMap::new());
        let ContainerAction::Start(StartContainer { previous, kind, .. }) = &steps(later)[0] else {
            panic!("expected a start")
        };
        assert_eq!((previous.as_ref().map(|r| r.id.as_str()), *kind), (Some("w2"), Kind::App));
    }

    #[test]
    fn failed_start_back_off_holds_the_next_attempt() {
        let p = web_pod("Always", &[]);
        let records = vec![sandbox("sb", State::Running, 0)];
        let now = at(0.0);
        let start = HashMap::from([(
            "web".to_string(),
            Retry { until: now.instant + Duration::from_secs(4), delay: Duration::from_secs(10) },
        )]);
        let held = steps(decide_at(&p, &records, now, &start));
        assert_eq!(held[0], ContainerAction::StartBackOff { retry_in: Duration::from_secs(4) });
        assert_eq!(short(&held), ["start-backoff", "start app side"]);
        let later = Now { instant: now.instant + Duration::from_secs(5), ..now };
        assert_eq!(short(&steps(decide_at(&p, &records, later, &start))), ["start app web", "start app side"]);
    }

    #[test]
    fn running_containers_are_kept_and_never_created_ones_replaced() {
        let p = web_pod("Always", &[]);
        let web = rec("w1", "web", Kind::App, State::Running, 0, 0);
        let records =
            vec![sandbox("sb", State::Running, 0), web.clone(), rec("s0", "side", Kind::App, State::Created, 0, 0)];
        let s = steps(decide(&p, &records));
        assert_eq!(short(&s), ["keep web", "remove s0", "start app side"]);
        let ContainerAction::KeepRunning { record, .. } = &s[0] else { panic!() };
        assert_eq!(record, &web);
    }

    #[test]
    fn failed_probes_kill_their_running_app_containers() {
        let p = web_pod("Always", &[]);
        let records = vec![
            sandbox("sb", State::Running, 0),
            rec("w1", "web", Kind::App, State::Running, 0, 0),
            rec("s1", "side", Kind::App, State::Exited, 0, 0),
        ];
        let kills = HashMap::from([
            ("w1".to_string(), "Container web failed liveness probe, will be restarted".to_string()),
            // Not running any more: nothing to kill.
            ("s1".to_string(), "Container side failed liveness probe, will be restarted".to_string()),
        ]);
        let start = HashMap::new();
        let got = compute_pod_actions(
            &p,
            &Observed { records: &records, probe_kills: &kills },
            at(60.0),
            &BackOffs { sandbox: None, start: &start },
        );
        assert_eq!(
            got,
            PodActions::KillUnhealthy {
                kills: vec![Kill {
                    id: "w1".into(),
                    name: "web".into(),
                    message: "Container web failed liveness probe, will be restarted".into()
                }],
                grace: Duration::from_secs(30),
            }
        );
    }

    #[test]
    fn changed_spec_and_unknown_containers_are_left_running() {
        // The kubelet kills no container for a spec change: a new image applies from the
        // container's next start. A container whose name the spec lacks is left alone too.
        let mut p = web_pod("Always", &[]);
        p.spec.as_mut().unwrap().containers[0].image = Some("busybox:2".into());
        let records = vec![
            sandbox("sb", State::Running, 0),
            rec("w1", "web", Kind::App, State::Running, 0, 0),
            rec("s1", "side", Kind::App, State::Running, 0, 0),
            rec("o1", "old", Kind::App, State::Running, 0, 0),
        ];
        assert_eq!(short(&steps(decide(&p, &records))), ["keep web", "keep side"]);
    }

    #[test]
    fn ephemeral_containers_start_once_and_never_again() {
        let mut p = web_pod("Always", &["a"]);
        p.spec.as_mut().unwrap().ephemeral_containers = serde_json::from_value(json!([
            {"name": "dbg", "image": "busybox"},
            {"name": "tgt", "image": "busybox", "targetContainerName": "web"}
        ]))
        .unwrap();
        let sb = sandbox("sb", State::Running, 0);
        // Started even while the init container runs; the targeted one waits for `web`.
        let records = vec![sb.clone(), rec("a1", "a", Kind::Init, State::Running, 0, 0)];
        let s = steps(decide(&p, &records));
        assert_eq!(short(&s), ["start ephemeral dbg", "wait-target tgt"]);
        assert_eq!(
            s[1],
            ContainerAction::WaitForTarget {
                name: "tgt".into(),
                message: "waiting for the target container \"web\" to run".into(),
                retry_in: Duration::from_secs(1),
            }
        );
        // Once `web` runs, the targeted one joins its process namespace.
        let records = vec![
            sb.clone(),
            rec("a1", "a", Kind::Init, State::Exited, 0, 0),
            rec("w1", "web", Kind::App, State::Running, 0, 0),
            rec("s1", "side", Kind::App, State::Running, 0, 0),
            rec("d1", "dbg", Kind::Ephemeral, State::Exited, 1, 0),
        ];
        let s = steps(decide(&p, &records));
        assert_eq!(short(&s), ["keep web", "keep side", "forget dbg", "start ephemeral tgt"]);
        let ContainerAction::Start(StartContainer { pid_target, .. }) = &s[3] else { panic!() };
        assert_eq!(pid_target.as_deref(), Some("w1"));
        // An exited ephemeral container stays exited, whatever the restart policy.
        let records = vec![sb, rec("d1", "dbg", Kind::Ephemeral, State::Exited, 1, 0)];
        p.spec.as_mut().unwrap().ephemeral_containers.as_mut().unwrap().truncate(1);
        p.spec.as_mut().unwrap().init_containers = None;
        assert_eq!(short(&steps(decide(&p, &records))), ["start app web", "start app side", "forget dbg"]);
    }

    #[test]
    fn deleted_pod_is_killed_with_its_grace_period() {
        let mut p = web_pod("Always", &[]);
        p.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-01-01T00:00:00Z".parse().unwrap()));
        let records = vec![sandbox("sb", State::Running, 0), rec("w1", "web", Kind::App, State::Running, 0, 0)];
        assert_eq!(decide(&p, &records), PodActions::KillPod { grace: Duration::from_secs(30) });
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(7);
        assert_eq!(decide(&p, &records), PodActions::KillPod { grace: Duration::from_secs(7) });
        p.metadata.deletion_grace_period_seconds = Some(0);
        assert_eq!(decide(&p, &[]), PodActions::KillPod { grace: Duration::ZERO });
    }

    #[test]
    fn gone_pod_waits_for_the_pod_list_then_removes_what_is_left() {
        let mut sb = sandbox("sb", State::Running, 0);
        assert_eq!(compute_gone_pod_actions(false, &[sb.clone()]), GoneActions::WaitForPodList);
        assert_eq!(compute_gone_pod_actions(true, &[]), GoneActions::Done);
        sb.labels.insert(labels::GRACE_PERIOD.into(), "30".into());
        assert_eq!(
            compute_gone_pod_actions(true, &[sb.clone()]),
            GoneActions::RemoveContainers { grace: Duration::from_secs(2) }
        );
        sb.labels.insert(labels::GRACE_PERIOD.into(), "1".into());
        assert_eq!(
            compute_gone_pod_actions(true, &[sb]),
            GoneActions::RemoveContainers { grace: Duration::from_secs(1) }
        );
    }

    #[test]
    fn finished_pod_stops_what_still_runs() {
        let mut p = web_pod("Always", &[]);
        p.status = Some(k8s_openapi::api::core::v1::PodStatus { phase: Some("Failed".into()), ..Default::default() });
        let records = vec![
            sandbox("sb", State::Running, 0),
            rec("w1", "web", Kind::App, State::Running, 0, 0),
            rec("s1", "side", Kind::App, State::Exited, 1, 0),
        ];
        assert_eq!(
            decide(&p, &records),
            PodActions::StopTerminal { stop: vec!["sb".into(), "w1".into()], grace: Duration::from_secs(30) }
        );
    }

    #[test]
    fn two_newest_stopped_instances_of_each_container_are_kept() {
        let records = vec![
            rec("w0", "web", Kind::App, State::Exited, 1, 0),
            rec("w1", "web", Kind::App, State::Exited, 1, 1),
            rec("w2", "web", Kind::App, State::Exited, 1, 2),
            rec("w3", "web", Kind::App, State::Running, 0, 3),
            rec("a0", "a", Kind::Init, State::Exited, 0, 0),
            sandbox("x0", State::Exited, 0),
            sandbox("x1", State::Exited, 1),
            sandbox("x2", State::Exited, 2),
        ];
        assert_eq!(old_instances(&records), ["w0"]);
    }
}
