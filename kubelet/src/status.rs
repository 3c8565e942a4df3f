//! The pod status as a pure function of the pod's spec, its previous status and what the
//! runtime and the probes say about its containers (Kubernetes' `generateAPIPodStatus` and
//! `getPhase`). The kubelet patches `pods/status` only when the result differs.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::labels::Kind;
use crate::runtime::{ContainerRecord, State};

/// What the probes say about a running container (by container id).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeView {
    /// Readiness probe result; None until the first result.
    pub ready: Option<bool>,
    /// Startup probe result; None until it succeeded once.
    pub started: Option<bool>,
}

pub struct Input<'a> {
    pub pod: &'a Pod,
    pub records: &'a [ContainerRecord],
    /// Container name → (reason, message) of a container that waits (back-off, pull, config).
    pub waiting: &'a HashMap<String, (String, String)>,
    pub probes: &'a HashMap<String, ProbeView>,
    pub pod_ip: Option<&'a str>,
    pub host_ip: &'a str,
    pub now: Time,
}

/// The newest instance of a container, and the one before it.
pub fn instances<'a>(
    records: &'a [ContainerRecord],
    name: &str,
    kind: Kind,
) -> (Option<&'a ContainerRecord>, Option<&'a ContainerRecord>) {
    let mut v: Vec<&ContainerRecord> = records.iter().filter(|r| r.name == name && r.kind == kind).collect();
    v.sort_by_key(|r| std::cmp::Reverse((r.restart_count, r.created)));
    (v.first().copied(), v.get(1).copied())
}

/// A container of any kind by name (app, then init, then ephemeral: names are unique
/// across the three), newest instance first — what logs, exec and attach address.
pub fn named<'a>(
    records: &'a [ContainerRecord],
    name: &str,
) -> (Option<&'a ContainerRecord>, Option<&'a ContainerRecord>) {
    [Kind::App, Kind::Init, Kind::Ephemeral]
        .into_iter()
        .map(|k| instances(records, name, k))
        .find(|(latest, _)| latest.is_some())
        .unwrap_or((None, None))
}

fn time(s: &Option<String>) -> Option<Time> {
    s.as_ref().and_then(|s| s.parse::<jiff::Timestamp>().ok()).map(Time)
}

pub fn terminated_reason(r: &ContainerRecord) -> &'static str {
    if r.oom_killed {
        "OOMKilled"
    } else if r.exit_code == 0 {
        "Completed"
    } else {
        "Error"
    }
}

fn terminated(r: &ContainerRecord) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: r.exit_code as i32,
            reason: Some(terminated_reason(r).to_string()),
            message: Some(r.error.clone()).filter(|m| !m.is_empty()),
            started_at: time(&r.started_at),
            finished_at: time(&r.finished_at),
            container_id: Some(format!("docker://{}", r.id)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn waiting(reason: &str, message: Option<&str>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: message.map(str::to_string).filter(|m| !m.is_empty()),
        }),
        ..Default::default()
    }
}

/// Whether a running container counts as ready.
pub fn container_ready(c: &Container, r: &ContainerRecord, probes: &HashMap<String, ProbeView>) -> bool {
    if r.state != State::Running {
        return false;
    }
    let view = probes.get(&r.id).copied().unwrap_or_default();
    if c.startup_probe.is_some() && view.started != Some(true) {
        return false;
    }
    match c.readiness_probe {
        None => true,
        Some(_) => view.ready == Some(true),
    }
}

fn container_status(c: &Container, kind: Kind, i: &Input, not_yet: &str) -> ContainerStatus {
    let (latest, previous) = instances(i.records, &c.name, kind);
    let mut st = ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: String::new(),
        ..Default::default()
    };
    if let Some(r) = latest {
        st.restart_count = r.restart_count;
        st.container_id = Some(format!("docker://{}", r.id));
        st.image_id = if r.image_id.is_empty() { String::new() } else { format!("docker://{}", r.image_id) };
    }
    let last_exited = |r: Option<&ContainerRecord>| r.filter(|r| r.state == State::Exited).map(terminated);
    if let Some((reason, message)) = i.waiting.get(&c.name) {
        st.state = Some(waiting(reason, Some(message)));
        st.last_state = last_exited(latest).or_else(|| last_exited(previous));
    } else {
        match latest {
            Some(r) if r.state == State::Running => {
                st.state = Some(ContainerState {
                    running: Some(ContainerStateRunning { started_at: time(&r.started_at) }),
                    ..Default::default()
                });
                st.ready = kind == Kind::App && container_ready(c, r, i.probes);
                st.started =
                    Some(c.startup_probe.is_none() || i.probes.get(&r.id).and_then(|v| v.started) == Some(true));
                st.last_state = last_exited(previous);
            }
            Some(r) if r.state == State::Exited => {
                st.state = Some(terminated(r));
                st.ready = kind == Kind::Init && r.exit_code == 0;
                st.started = Some(false);
                st.last_state = last_exited(previous);
            }
            _ => st.state = Some(waiting(not_yet, None)),
        }
    }
    if st.started.is_none() {
        st.started = Some(false);
    }
    if st.last_state.is_none() {
        st.last_state = Some(ContainerState::default());
    }
    st
}

/// Init containers all finished successfully.
pub fn initialized(pod: &Pod, records: &[ContainerRecord]) -> bool {
    let spec = pod.spec.clone().unwrap_or_default();
    spec.init_containers.iter().flatten().all(|c| {
        matches!(instances(records, &c.name, Kind::Init).0, Some(r) if r.state == State::Exited && r.exit_code == 0)
    }) || spec.containers.iter().any(|c| instances(records, &c.name, Kind::App).0.is_some())
}

fn condition(
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    old: &Option<PodStatus>,
    now: &Time,
) -> PodCondition {
    let status = if ok { "True" } else { "False" }.to_string();
    let prev = old.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|cs| cs.iter().find(|c| c.type_ == type_));
    let last_transition_time = match prev {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Some(now.clone()),
    };
    PodCondition {
        type_: type_.to_string(),
        status,
        reason: if ok { None } else { reason.map(str::to_string) },
        message: if ok { None } else { message },
        last_transition_time,
        ..Default::default()
    }
}

/// Kubernetes' QoS class of a pod.
pub fn qos_class(pod: &Pod) -> &'static str {
    let spec = pod.spec.clone().unwrap_or_default();
    let all: Vec<&Container> = spec.containers.iter().chain(spec.init_containers.iter().flatten()).collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &all {
        let r = c.resources.clone().unwrap_or_default();
        let limits = r.limits.unwrap_or_default();
        let requests = r.requests.unwrap_or_default();
        if !limits.is_empty() || !requests.is_empty() {
            any = true;
        }
        for res in ["cpu", "memory"] {
            match (limits.get(res), requests.get(res)) {
                (Some(l), Some(q)) if l != q => guaranteed = false,
                (None, _) => guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The pod's phase (Kubernetes' getPhase) from its container statuses.
pub fn phase(pod: &Pod, init: &[ContainerStatus], app: &[ContainerStatus]) -> &'static str {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let init_failed = init.iter().any(|s| {
        s.state.as_ref().and_then(|st| st.terminated.as_ref()).is_some_and(|t| t.exit_code != 0)
            || (s.state.as_ref().and_then(|st| st.waiting.as_ref()).is_some()
                && s.last_state.as_ref().and_then(|st| st.terminated.as_ref()).is_some_and(|t| t.exit_code != 0))
    });
    let init_done =
        init.iter().all(|s| s.state.as_ref().and_then(|st| st.terminated.as_ref()).is_some_and(|t| t.exit_code == 0));
    let app_started = app.iter().any(|s| s.container_id.is_some());
    if !init_done && !app_started {
        if init_failed && policy == "Never" {
            return "Failed";
        }
        return "Pending";
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in app {
        let st = s.state.clone().unwrap_or_default();
        if st.running.is_some() {
            running += 1;
        } else if let Some(t) = st.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if s.last_state.as_ref().and_then(|l| l.terminated.as_ref()).is_some() {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        if policy == "Always" {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if policy == "OnFailure" {
            return "Running";
        }
        return "Failed";
    }
    "Pending"
}

/// The status the pod should have.
pub fn compute(i: &Input) -> PodStatus {
    let pod = i.pod;
    let spec = pod.spec.clone().unwrap_or_default();
    let old = pod.status.clone();
    let init_done = initialized(pod, i.records);
    let init: Vec<ContainerStatus> =
        spec.init_containers.iter().flatten().map(|c| container_status(c, Kind::Init, i, "PodInitializing")).collect();
    let app_waiting = if init_done { "ContainerCreating" } else { "PodInitializing" };
    let app: Vec<ContainerStatus> =
        spec.containers.iter().map(|c| container_status(c, Kind::App, i, app_waiting)).collect();
    let ephemeral: Vec<ContainerStatus> = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|e| {
            container_status(&crate::podconfig::ephemeral_as_container(e), Kind::Ephemeral, i, "ContainerCreating")
        })
        .collect();

    let old_phase = old.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let phase = if old_phase == "Succeeded" || old_phase == "Failed" {
        old_phase.clone()
    } else {
        phase(pod, &init, &app).to_string()
    };
    let terminal = phase == "Succeeded" || phase == "Failed";

    let incomplete: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| !init.iter().any(|s| s.name == c.name && s.ready))
        .map(|c| c.name.as_str())
        .collect();
    let unready: Vec<&str> = app.iter().filter(|s| !s.ready).map(|s| s.name.as_str()).collect();
    let all_ready = unready.is_empty() && !terminal;
    let (ready_reason, ready_msg) = if terminal {
        ("PodCompleted", None)
    } else {
        ("ContainersNotReady", Some(format!("containers with unready status: [{}]", unready.join(" "))))
    };
    let now = &i.now;
    let sandbox_ready = i.pod_ip.is_some() && !terminal;
    let conditions = vec![
        condition("PodReadyToStartContainers", sandbox_ready, None, None, &old, now),
        condition(
            "Initialized",
            init_done || incomplete.is_empty(),
            Some("ContainersNotInitialized"),
            Some(format!("containers with incomplete status: [{}]", incomplete.join(" "))),
            &old,
            now,
        ),
        condition("Ready", all_ready, Some(ready_reason), ready_msg.clone(), &old, now),
        condition("ContainersReady", all_ready, Some(ready_reason), ready_msg, &old, now),
        condition("PodScheduled", true, None, None, &old, now),
    ];
    let pod_ip = i.pod_ip.map(str::to_string);
    PodStatus {
        phase: Some(phase),
        conditions: Some(conditions),
        host_ip: Some(i.host_ip.to_string()).filter(|s| !s.is_empty()),
        host_ips: Some(vec![HostIP { ip: i.host_ip.to_string() }]).filter(|_| !i.host_ip.is_empty()),
        pod_ip: pod_ip.clone(),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip }]),
        start_time: old.as_ref().and_then(|s| s.start_time.clone()).or_else(|| Some(now.clone())),
        init_container_statuses: if init.is_empty() { None } else { Some(init) },
        container_statuses: Some(app),
        ephemeral_container_statuses: if ephemeral.is_empty() { None } else { Some(ephemeral) },
        qos_class: old.as_ref().and_then(|s| s.qos_class.clone()).or_else(|| Some(qos_class(pod).to_string())),
        ..Default::default()
    }
}

/// Whether `new` says something `old` does not (field by field, as JSON).
pub fn changed(old: Option<&PodStatus>, new: &PodStatus) -> bool {
    let a = old.map(|o| serde_json::to_value(o).unwrap_or_default());
    let b = serde_json::to_value(new).unwrap_or_default();
    let strip = |v: &serde_json::Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("message");
            o.remove("reason");
            o.remove("nominatedNodeName");
        }
        v
    };
    a.map(|a| strip(&a)) != Some(strip(&b))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    fn pod(restart: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"restartPolicy": restart,
                "initContainers": [{"name": "init", "image": "busybox"}],
                "containers": [
                    {"name": "web", "image": "busybox", "readinessProbe": {"tcpSocket": {"port": 80}}},
                    {"name": "side", "image": "busybox"}
                ]}
        }))
        .unwrap()
    }

    /// A container record of pod `ns/p` (shared with the pod-action tests).
    pub(crate) fn rec(id: &str, name: &str, kind: Kind, state: State, exit: i64, restarts: i32) -> ContainerRecord {
        ContainerRecord {
            id: id.into(),
            pod_uid: "u".into(),
            pod_namespace: "ns".into(),
            pod_name: "p".into(),
            name: name.into(),
            kind,
            restart_count: restarts,
            state,
            exit_code: exit,
            oom_killed: false,
            error: String::new(),
            started_at: Some("2026-01-01T00:00:00Z".into()),
            finished_at: (state == State::Exited).then(|| "2026-01-01T00:00:05Z".to_string()),
            created: restarts as i64,
            image: "busybox".into(),
            image_id: "sha256:1".into(),
            pid: 1,
            labels: HashMap::new(),
            docker_name: format!("k8s_{name}_p_ns_u_{restarts}"),
            upper_dir: None,
        }
    }

    fn now() -> Time {
        Time("2026-01-01T00:01:00Z".parse().unwrap())
    }

    fn run(
        p: &Pod,
        records: &[ContainerRecord],
        probes: &HashMap<String, ProbeView>,
        waiting: &HashMap<String, (String, String)>,
    ) -> PodStatus {
        compute(&Input {
            pod: p,
            records,
            waiting,
            probes,
            pod_ip: Some("10.0.0.2"),
            host_ip: "192.168.0.1",
            now: now(),
        })
    }

    fn cond(s: &PodStatus, t: &str) -> String {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap().status.clone()
    }

    #[test]
    fn ephemeral_containers_are_reported_apart_and_never_ready() {
        let mut p = pod("Always");
        p.spec.as_mut().unwrap().ephemeral_containers =
            serde_json::from_value(json!([{"name": "dbg", "image": "busybox", "targetContainerName": "web"},
                                          {"name": "later", "image": "busybox"}]))
            .unwrap();
        let records = [
            rec("i", "init", Kind::Init, State::Exited, 0, 0),
            rec("w", "web", Kind::App, State::Running, 0, 0),
            rec("s", "side", Kind::App, State::Running, 0, 0),
            rec("d", "dbg", Kind::Ephemeral, State::Running, 0, 0),
        ];
        let probes = HashMap::from([("w".to_string(), ProbeView { ready: Some(true), ..Default::default() })]);
        let s = run(&p, &records, &probes, &HashMap::new());
        let eph = s.ephemeral_container_statuses.clone().unwrap();
        assert_eq!(eph.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["dbg", "later"]);
        assert!(eph[0].state.as_ref().unwrap().running.is_some() && !eph[0].ready);
        assert_eq!(
            eph[1].state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(),
            Some("ContainerCreating")
        );
        // The pod's own readiness and containers are unaffected.
        assert_eq!(cond(&s, "Ready"), "True");
        assert_eq!(s.container_statuses.unwrap().len(), 2);
        // Logs, exec and attach find a container of any kind by name.
        assert_eq!(named(&records, "dbg").0.map(|r| r.id.as_str()), Some("d"));
        assert_eq!(named(&records, "init").0.map(|r| r.id.as_str()), Some("i"));
        assert!(named(&records, "nope").0.is_none());
    }

    #[test]
    fn pending_while_init_runs() {
        let p = pod("Always");
        let s = run(&p, &[rec("i", "init", Kind::Init, State::Running, 0, 0)], &HashMap::new(), &HashMap::new());
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert_eq!(cond(&s, "Initialized"), "False");
        let web = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(web.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("PodInitializing"));
    }

    #[test]
    fn running_and_ready_follows_the_readiness_probe() {
        let p = pod("Always");
        let records = [
            rec("i", "init", Kind::Init, State::Exited, 0, 0),
            rec("w", "web", Kind::App, State::Running, 0, 0),
            rec("s", "side", Kind::App, State::Running, 0, 0),
        ];
        let mut probes = HashMap::new();
        let s = run(&p, &records, &probes, &HashMap::new());
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Initialized"), "True");
        assert_eq!(cond(&s, "Ready"), "False");
        probes.insert("w".to_string(), ProbeView { ready: Some(true), started: None });
        let s = run(&p, &records, &probes, &HashMap::new());
        assert_eq!(cond(&s, "Ready"), "True");
        assert_eq!(cond(&s, "ContainersReady"), "True");
        assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.2"));
        let web = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(web.container_id.as_deref(), Some("docker://w"));
        assert!(web.ready);
    }

    #[test]
    fn crash_loop_keeps_last_state_and_restart_count() {
        let p = pod("Always");
        let records = [
            rec("i", "init", Kind::Init, State::Exited, 0, 0),
            rec("w1", "web", Kind::App, State::Exited, 1, 2),
            rec("w0", "web", Kind::App, State::Exited, 1, 1),
            rec("s", "side", Kind::App, State::Running, 0, 0),
        ];
        let waiting =
            HashMap::from([("web".to_string(), ("CrashLoopBackOff".to_string(), "back-off 20s".to_string()))]);
        let s = run(&p, &records, &HashMap::new(), &waiting);
        let web = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(web.restart_count, 2);
        assert_eq!(web.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("CrashLoopBackOff"));
        assert_eq!(
            web.last_state.as_ref().unwrap().terminated.as_ref().unwrap().container_id.as_deref(),
            Some("docker://w1")
        );
        assert_eq!(s.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn never_policy_ends_in_succeeded_or_failed() {
        let p = pod("Never");
        let ok = [
            rec("i", "init", Kind::Init, State::Exited, 0, 0),
            rec("w", "web", Kind::App, State::Exited, 0, 0),
            rec("s", "side", Kind::App, State::Exited, 0, 0),
        ];
        let s = run(&p, &ok, &HashMap::new(), &HashMap::new());
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        assert_eq!(cond(&s, "Ready"), "False");
        let mut bad = ok.clone();
        bad[2].exit_code = 3;
        assert_eq!(run(&p, &bad, &HashMap::new(), &HashMap::new()).phase.as_deref(), Some("Failed"));
        let init_failed = [rec("i", "init", Kind::Init, State::Exited, 1, 0)];
        assert_eq!(run(&p, &init_failed, &HashMap::new(), &HashMap::new()).phase.as_deref(), Some("Failed"));
    }

    #[test]
    fn unchanged_status_is_not_patched_and_keeps_transition_times() {
        let mut p = pod("Always");
        let records =
            [rec("i", "init", Kind::Init, State::Exited, 0, 0), rec("w", "web", Kind::App, State::Running, 0, 0)];
        let s1 = run(&p, &records, &HashMap::new(), &HashMap::new());
        p.status = Some(s1.clone());
        let mut later = Input {
            pod: &p,
            records: &records,
            waiting: &HashMap::new(),
            probes: &HashMap::new(),
            pod_ip: Some("10.0.0.2"),
            host_ip: "192.168.0.1",
            now: Time("2026-01-01T00:09:00Z".parse().unwrap()),
        };
        let s2 = compute(&later);
        assert!(!changed(Some(&s1), &s2));
        later.pod_ip = None;
        assert!(changed(Some(&s1), &compute(&later)));
    }

    #[test]
    fn qos() {
        assert_eq!(qos_class(&pod("Always")), "BestEffort");
    }
}
