//! Pods: `kube_pod_*`, each series labelled `namespace`, `pod`, `uid` first.

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodCondition};

use crate::render::{self, alpha, counter, gauge, Family, Gen, Series};
use crate::resource::{self, Owner};

/// The pods' families, in the upstream exporter's order.
pub fn families(pods: &[&Pod]) -> Vec<Family> {
    render::families(pods, &generators(), |p| {
        vec![
            ("namespace", render::namespace_of(&p.metadata)),
            ("pod", render::name_of(&p.metadata)),
            ("uid", p.metadata.uid.clone().unwrap_or_default()),
        ]
    })
}

fn containers(p: &Pod) -> &[Container] {
    p.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default()
}

fn init_containers(p: &Pod) -> &[Container] {
    p.spec.as_ref().and_then(|s| s.init_containers.as_deref()).unwrap_or_default()
}

fn statuses(p: &Pod) -> &[ContainerStatus] {
    p.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or_default()
}

fn init_statuses(p: &Pod) -> &[ContainerStatus] {
    p.status.as_ref().and_then(|s| s.init_container_statuses.as_deref()).unwrap_or_default()
}

fn conditions(p: &Pod) -> &[PodCondition] {
    p.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default()
}

fn node_name(p: &Pod) -> &str {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default()
}

fn generators() -> Vec<Gen<Pod>> {
    vec![
        gauge("kube_pod_completion_time", "Completion time in unix timestamp for a pod.", completion_time),
        gauge("kube_pod_container_info", "Information about a container in a pod.", |p| {
            container_info(containers(p), statuses(p), false)
        }),
        gauge(
            "kube_pod_container_resource_limits",
            "The number of requested limit resource by a container. It is recommended to use the kube_pod_resource_limits metric exposed by kube-scheduler instead, as it is more precise.",
            |p| container_resources(p, containers(p), true),
        ),
        gauge(
            "kube_pod_container_resource_requests",
            "The number of requested request resource by a container. It is recommended to use the kube_pod_resource_requests metric exposed by kube-scheduler instead, as it is more precise.",
            |p| container_resources(p, containers(p), false),
        ),
        gauge("kube_pod_container_state_started", "Start time in unix timestamp for a pod container.", |p| {
            state_started(statuses(p))
        }),
        alpha(
            "kube_pod_container_status_last_terminated_reason",
            "Describes the last reason the container was in terminated state.",
            |p| last_terminated_reason(statuses(p)),
        ),
        alpha(
            "kube_pod_container_status_last_terminated_exitcode",
            "Describes the exit code for the last container in terminated state.",
            |p| last_terminated_exitcode(statuses(p)),
        ),
        alpha(
            "kube_pod_container_status_last_terminated_timestamp",
            "Last terminated time for a pod container in unix timestamp.",
            |p| last_terminated_timestamp(statuses(p)),
        ),
        gauge("kube_pod_container_status_ready", "Describes whether the containers readiness check succeeded.", |p| {
            per_status(statuses(p), |s| render::bool_value(s.ready))
        }),
        counter("kube_pod_container_status_restarts_total", "The number of container restarts per container.", |p| {
            per_status(statuses(p), |s| f64::from(s.restart_count))
        }),
        gauge("kube_pod_container_status_running", "Describes whether the container is currently in running state.", |p| {
            per_status(statuses(p), |s| render::bool_value(state(s).is_some_and(|st| st.running.is_some())))
        }),
        gauge(
            "kube_pod_container_status_terminated",
            "Describes whether the container is currently in terminated state.",
            |p| per_status(statuses(p), |s| render::bool_value(state(s).is_some_and(|st| st.terminated.is_some()))),
        ),
        alpha(
            "kube_pod_container_status_terminated_reason",
            "Describes the reason the container is currently in terminated state.",
            |p| terminated_reason(statuses(p)),
        ),
        gauge("kube_pod_container_status_waiting", "Describes whether the container is currently in waiting state.", |p| {
            per_status(statuses(p), |s| render::bool_value(state(s).is_some_and(|st| st.waiting.is_some())))
        }),
        gauge(
            "kube_pod_container_status_waiting_reason",
            "Describes the reason the container is currently in waiting state.",
            |p| waiting_reason(statuses(p)),
        ),
        gauge("kube_pod_created", "Unix creation timestamp", |p| render::timestamp(p.metadata.creation_timestamp.as_ref())),
        alpha("kube_pod_deletion_timestamp", "Unix deletion timestamp", |p| {
            render::timestamp(p.metadata.deletion_timestamp.as_ref())
        }),
        gauge("kube_pod_info", "Information about pod.", info),
        alpha("kube_pod_ips", "Pod IP addresses", ips),
        gauge("kube_pod_init_container_info", "Information about an init container in a pod.", |p| {
            container_info(init_containers(p), init_statuses(p), true)
        }),
        alpha("kube_pod_init_container_resource_limits", "The number of requested limit resource by an init container.", |p| {
            container_resources(p, init_containers(p), true)
        }),
        alpha(
            "kube_pod_init_container_resource_requests",
            "The number of requested request resource by an init container.",
            |p| container_resources(p, init_containers(p), false),
        ),
        alpha("kube_pod_init_container_state_started", "Start time in unix timestamp for a pod init container.", |p| {
            state_started(init_statuses(p))
        }),
        alpha(
            "kube_pod_init_container_status_last_terminated_reason",
            "Describes the last reason the init container was in terminated state.",
            |p| last_terminated_reason(init_statuses(p)),
        ),
        alpha(
            "kube_pod_init_container_status_last_terminated_exitcode",
            "Describes the exit code for the last init container in terminated state.",
            |p| last_terminated_exitcode(init_statuses(p)),
        ),
        alpha(
            "kube_pod_init_container_status_last_terminated_timestamp",
            "Last terminated time for a pod init container in unix timestamp.",
            |p| last_terminated_timestamp(init_statuses(p)),
        ),
        gauge(
            "kube_pod_init_container_status_ready",
            "Describes whether the init containers readiness check succeeded.",
            |p| per_status(init_statuses(p), |s| render::bool_value(s.ready)),
        ),
        counter("kube_pod_init_container_status_restarts_total", "The number of restarts for the init container.", |p| {
            per_status(init_statuses(p), |s| f64::from(s.restart_count))
        }),
        gauge(
            "kube_pod_init_container_status_running",
            "Describes whether the init container is currently in running state.",
            |p| per_status(init_statuses(p), |s| render::bool_value(state(s).is_some_and(|st| st.running.is_some()))),
        ),
        gauge(
            "kube_pod_init_container_status_terminated",
            "Describes whether the init container is currently in terminated state.",
            |p| per_status(init_statuses(p), |s| render::bool_value(state(s).is_some_and(|st| st.terminated.is_some()))),
        ),
        alpha(
            "kube_pod_init_container_status_terminated_reason",
            "Describes the reason the init container is currently in terminated state.",
            |p| terminated_reason(init_statuses(p)),
        ),
        gauge(
            "kube_pod_init_container_status_waiting",
            "Describes whether the init container is currently in waiting state.",
            |p| per_status(init_statuses(p), |s| render::bool_value(state(s).is_some_and(|st| st.waiting.is_some()))),
        ),
        alpha(
            "kube_pod_init_container_status_waiting_reason",
            "Describes the reason the init container is currently in waiting state.",
            |p| waiting_reason(init_statuses(p)),
        ),
        gauge("kube_pod_owner", "Information about the Pod's owner.", |p| {
            render::owner_series(p.metadata.owner_references.as_ref())
        }),
        gauge("kube_pod_restart_policy", "Describes the restart policy in use by this pod.", |p| {
            let policy = p.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or_default();
            vec![Series::with(&[("type", policy)], 1.0)]
        }),
        alpha("kube_pod_runtimeclass_name_info", "The runtimeclass associated with the pod.", |p| {
            match p.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref()) {
                Some(rc) => vec![Series::with(&[("runtimeclass_name", rc)], 1.0)],
                None => Vec::new(),
            }
        }),
        gauge("kube_pod_start_time", "Start time in unix timestamp for a pod.", |p| {
            render::timestamp(p.status.as_ref().and_then(|s| s.start_time.as_ref()))
        }),
        gauge("kube_pod_status_phase", "The pods current phase.", phase),
        alpha("kube_pod_status_qos_class", "The pods current qosClass.", qos_class),
        gauge("kube_pod_status_ready", "Describes whether the pod is ready to serve requests.", |p| {
            condition(p, "Ready")
        }),
        alpha("kube_pod_status_ready_time", "Readiness achieved time in unix timestamp for a pod.", |p| {
            condition_time(p, "Ready", "True")
        }),
        alpha("kube_pod_status_initialized_time", "Initialized time in unix timestamp for a pod.", |p| {
            condition_time(p, "Initialized", "True")
        }),
        alpha(
            "kube_pod_status_container_ready_time",
            "Readiness achieved time in unix timestamp for a pod containers.",
            |p| condition_time(p, "ContainersReady", "True"),
        ),
        gauge("kube_pod_status_scheduled", "Describes the status of the scheduling process for the pod.", |p| {
            condition(p, "PodScheduled")
        }),
        gauge("kube_pod_status_scheduled_time", "Unix timestamp when pod moved into scheduled status", |p| {
            condition_time(p, "PodScheduled", "True")
        }),
        gauge("kube_pod_status_unschedulable", "Describes the unschedulable status for the pod.", |p| {
            conditions(p)
                .iter()
                .filter(|c| c.type_ == "PodScheduled" && c.status == "False")
                .map(|_| Series::value(1.0))
                .collect()
        }),
        alpha("kube_pod_service_account", "The service account for a pod.", |p| {
            let sa = p.spec.as_ref().and_then(|s| s.service_account_name.as_deref()).unwrap_or_default();
            vec![Series::with(&[("service_account", sa)], 1.0)]
        }),
        alpha("kube_pod_scheduler", "The scheduler for a pod.", |p| {
            let name = p.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()).unwrap_or_default();
            vec![Series::with(&[("name", name)], 1.0)]
        }),
    ]
}

fn state(s: &ContainerStatus) -> Option<&k8s_openapi::api::core::v1::ContainerState> {
    s.state.as_ref()
}

/// One series per container status, labelled `container`.
fn per_status(statuses: &[ContainerStatus], value: fn(&ContainerStatus) -> f64) -> Vec<Series> {
    statuses.iter().map(|s| Series::with(&[("container", &s.name)], value(s))).collect()
}

/// The newest finish time of a terminated container.
fn completion_time(p: &Pod) -> Vec<Series> {
    let newest = statuses(p)
        .iter()
        .filter_map(|s| state(s)?.terminated.as_ref()?.finished_at.as_ref().map(render::unix))
        .fold(0.0_f64, f64::max);
    if newest > 0.0 {
        vec![Series::value(newest)]
    } else {
        Vec::new()
    }
}

/// A series per container that has a status: the spec's image beside the running one.
fn container_info(specs: &[Container], statuses: &[ContainerStatus], init: bool) -> Vec<Series> {
    let mut out = Vec::new();
    for c in specs {
        for s in statuses.iter().filter(|s| s.name == c.name) {
            let image_spec = c.image.as_deref().unwrap_or_default();
            let container_id = s.container_id.as_deref().unwrap_or_default();
            let mut labels = vec![
                ("container", s.name.as_str()),
                ("image_spec", image_spec),
                ("image", s.image.as_str()),
                ("image_id", s.image_id.as_str()),
                ("container_id", container_id),
            ];
            if init {
                labels.push(("restart_policy", c.restart_policy.as_deref().unwrap_or_default()));
            }
            out.push(Series::with(&labels, 1.0));
        }
    }
    out
}

fn container_resources(p: &Pod, specs: &[Container], limits: bool) -> Vec<Series> {
    let node = node_name(p);
    specs
        .iter()
        .flat_map(|c| {
            let r = c.resources.as_ref();
            let list = if limits { r.and_then(|r| r.limits.as_ref()) } else { r.and_then(|r| r.requests.as_ref()) };
            resource::series(list, Owner::Container, &[("container", &c.name), ("node", node)])
        })
        .collect()
}

fn state_started(statuses: &[ContainerStatus]) -> Vec<Series> {
    statuses
        .iter()
        .filter_map(|s| {
            let st = state(s)?;
            let started = match (&st.running, &st.terminated) {
                (Some(r), _) => r.started_at.as_ref(),
                (None, Some(t)) => t.started_at.as_ref(),
                (None, None) => return None,
            };
            Some(Series::with(&[("container", &s.name)], started.map(render::unix).unwrap_or(0.0)))
        })
        .collect()
}

fn last_terminated(s: &ContainerStatus) -> Option<&k8s_openapi::api::core::v1::ContainerStateTerminated> {
    s.last_state.as_ref()?.terminated.as_ref()
}

fn last_terminated_reason(statuses: &[ContainerStatus]) -> Vec<Series> {
    statuses
        .iter()
        .filter_map(|s| {
            let t = last_terminated(s)?;
            Some(Series::with(&[("container", &s.name), ("reason", t.reason.as_deref().unwrap_or_default())], 1.0))
        })
        .collect()
}

fn last_terminated_exitcode(statuses: &[ContainerStatus]) -> Vec<Series> {
    statuses
        .iter()
        .filter_map(|s| Some(Series::with(&[("container", &s.name)], f64::from(last_terminated(s)?.exit_code))))
        .collect()
}

fn last_terminated_timestamp(statuses: &[ContainerStatus]) -> Vec<Series> {
    statuses
        .iter()
        .filter_map(|s| {
            let t = last_terminated(s)?;
            Some(Series::with(&[("container", &s.name)], t.finished_at.as_ref().map(render::unix).unwrap_or(0.0)))
        })
        .collect()
}

fn terminated_reason(statuses: &[ContainerStatus]) -> Vec<Series> {
    statuses
        .iter()
        .filter_map(|s| {
            let t = state(s)?.terminated.as_ref()?;
            Some(Series::with(&[("container", &s.name), ("reason", t.reason.as_deref().unwrap_or_default())], 1.0))
        })
        .collect()
}

/// Only the reason a container is waiting for now: a series per waiting container.
fn waiting_reason(statuses: &[ContainerStatus]) -> Vec<Series> {
    statuses
        .iter()
        .filter_map(|s| {
            let w = state(s)?.waiting.as_ref()?;
            Some(Series::with(&[("container", &s.name), ("reason", w.reason.as_deref().unwrap_or_default())], 1.0))
        })
        .collect()
}

fn info(p: &Pod) -> Vec<Series> {
    let controller = p.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    let (kind, name) = controller.map(|o| (o.kind.as_str(), o.name.as_str())).unwrap_or_default();
    let status = p.status.as_ref();
    let spec = p.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    vec![Series::with(
        &[
            ("host_ip", status.and_then(|s| s.host_ip.as_deref()).unwrap_or_default()),
            ("pod_ip", status.and_then(|s| s.pod_ip.as_deref()).unwrap_or_default()),
            ("node", node_name(p)),
            ("created_by_kind", kind),
            ("created_by_name", name),
            ("priority_class", spec.and_then(|s| s.priority_class_name.as_deref()).unwrap_or_default()),
            ("host_network", if host_network { "true" } else { "false" }),
        ],
        1.0,
    )]
}

/// A series per pod IP that parses, with its family (`4` or `6`; a v4-mapped v6 is `4`).
fn ips(p: &Pod) -> Vec<Series> {
    let ips = p.status.as_ref().and_then(|s| s.pod_ips.as_deref()).unwrap_or_default();
    ips.iter()
        .filter_map(|ip| {
            let family = match ip.ip.parse::<std::net::IpAddr>().ok()?.to_canonical() {
                std::net::IpAddr::V4(_) => "4",
                std::net::IpAddr::V6(_) => "6",
            };
            Some(Series::with(&[("ip", &ip.ip), ("ip_family", family)], 1.0))
        })
        .collect()
}

/// Every phase, the current one 1; nothing while the pod has no phase.
fn phase(p: &Pod) -> Vec<Series> {
    let Some(current) = p.status.as_ref().and_then(|s| s.phase.as_deref()).filter(|s| !s.is_empty()) else {
        return Vec::new();
    };
    ["Pending", "Succeeded", "Failed", "Unknown", "Running"]
        .into_iter()
        .map(|ph| Series::with(&[("phase", ph)], render::bool_value(ph == current)))
        .collect()
}

fn qos_class(p: &Pod) -> Vec<Series> {
    let Some(current) = p.status.as_ref().and_then(|s| s.qos_class.as_deref()).filter(|s| !s.is_empty()) else {
        return Vec::new();
    };
    ["BestEffort", "Burstable", "Guaranteed"]
        .into_iter()
        .map(|c| Series::with(&[("qos_class", c)], render::bool_value(c == current)))
        .collect()
}

/// The condition `type_` as `condition="true|false|unknown"` series.
fn condition(p: &Pod, type_: &str) -> Vec<Series> {
    conditions(p)
        .iter()
        .filter(|c| c.type_ == type_)
        .flat_map(|c| render::condition_series(&[], "condition", &c.status))
        .collect()
}

/// When the condition `type_` last changed, while its status is `status`.
fn condition_time(p: &Pod, type_: &str, status: &str) -> Vec<Series> {
    conditions(p)
        .iter()
        .filter(|c| c.type_ == type_ && c.status == status)
        .map(|c| Series::value(c.last_transition_time.as_ref().map(render::unix).unwrap_or(0.0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    fn crashlooping() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web-1", "namespace": "default", "uid": "u1",
                "creationTimestamp": "2024-06-14T10:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "r1", "controller": true}]
            },
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "app", "image": "busybox", "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}}]
            },
            "status": {
                "phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.244.0.5",
                "podIPs": [{"ip": "10.244.0.5"}],
                "qosClass": "Burstable",
                "startTime": "2024-06-14T10:00:01Z",
                "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2024-06-14T10:00:00Z"}
                ],
                "containerStatuses": [{
                    "name": "app", "ready": false, "restartCount": 5, "image": "busybox:latest", "imageID": "sha256:abc",
                    "containerID": "docker://c1",
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2024-06-14T10:05:00Z"}}
                }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn crash_loop_back_off() {
        let p = crashlooping();
        let text = render_text(&families(&[&p]));
        let want = [
            r#"kube_pod_container_status_waiting{namespace="default",pod="web-1",uid="u1",container="app"} 1"#,
            r#"kube_pod_container_status_waiting_reason{namespace="default",pod="web-1",uid="u1",container="app",reason="CrashLoopBackOff"} 1"#,
            r#"kube_pod_container_status_restarts_total{namespace="default",pod="web-1",uid="u1",container="app"} 5"#,
            r#"kube_pod_container_status_running{namespace="default",pod="web-1",uid="u1",container="app"} 0"#,
            r#"kube_pod_container_status_terminated{namespace="default",pod="web-1",uid="u1",container="app"} 0"#,
            r#"kube_pod_container_status_ready{namespace="default",pod="web-1",uid="u1",container="app"} 0"#,
            r#"kube_pod_container_status_last_terminated_reason{namespace="default",pod="web-1",uid="u1",container="app",reason="Error"} 1"#,
            r#"kube_pod_container_status_last_terminated_exitcode{namespace="default",pod="web-1",uid="u1",container="app"} 1"#,
            r#"kube_pod_container_status_last_terminated_timestamp{namespace="default",pod="web-1",uid="u1",container="app"} 1.7183595e+09"#,
            r#"kube_pod_status_phase{namespace="default",pod="web-1",uid="u1",phase="Running"} 1"#,
            r#"kube_pod_status_phase{namespace="default",pod="web-1",uid="u1",phase="Pending"} 0"#,
            r#"kube_pod_status_ready{namespace="default",pod="web-1",uid="u1",condition="false"} 1"#,
            r#"kube_pod_status_ready{namespace="default",pod="web-1",uid="u1",condition="true"} 0"#,
            r#"kube_pod_status_scheduled{namespace="default",pod="web-1",uid="u1",condition="true"} 1"#,
            r#"kube_pod_status_scheduled_time{namespace="default",pod="web-1",uid="u1"} 1.7183592e+09"#,
            r#"kube_pod_info{namespace="default",pod="web-1",uid="u1",host_ip="10.0.0.1",pod_ip="10.244.0.5",node="n1",created_by_kind="ReplicaSet",created_by_name="web-abc",priority_class="",host_network="false"} 1"#,
            r#"kube_pod_owner{namespace="default",pod="web-1",uid="u1",owner_kind="ReplicaSet",owner_name="web-abc",owner_is_controller="true"} 1"#,
            r#"kube_pod_container_info{namespace="default",pod="web-1",uid="u1",container="app",image_spec="busybox",image="busybox:latest",image_id="sha256:abc",container_id="docker://c1"} 1"#,
            r#"kube_pod_container_resource_requests{namespace="default",pod="web-1",uid="u1",container="app",node="n1",resource="cpu",unit="core"} 0.25"#,
            r#"kube_pod_container_resource_requests{namespace="default",pod="web-1",uid="u1",container="app",node="n1",resource="memory",unit="byte"} 6.7108864e+07"#,
            r#"kube_pod_container_resource_limits{namespace="default",pod="web-1",uid="u1",container="app",node="n1",resource="memory",unit="byte"} 1.34217728e+08"#,
            r#"kube_pod_created{namespace="default",pod="web-1",uid="u1"} 1.7183592e+09"#,
            r#"kube_pod_start_time{namespace="default",pod="web-1",uid="u1"} 1.718359201e+09"#,
            r#"kube_pod_ips{namespace="default",pod="web-1",uid="u1",ip="10.244.0.5",ip_family="4"} 1"#,
            r#"kube_pod_status_qos_class{namespace="default",pod="web-1",uid="u1",qos_class="Burstable"} 1"#,
        ];
        let got = lines(&text);
        for w in want {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
        // The exact block of the waiting reason, HELP and TYPE included.
        assert!(text.contains(concat!(
            "# HELP kube_pod_container_status_waiting_reason [STABLE] Describes the reason the container is currently in waiting state.\n",
            "# TYPE kube_pod_container_status_waiting_reason gauge\n",
            "kube_pod_container_status_waiting_reason{namespace=\"default\",pod=\"web-1\",uid=\"u1\",container=\"app\",reason=\"CrashLoopBackOff\"} 1\n",
            "# HELP kube_pod_created",
        )));
        assert!(text.contains(concat!(
            "# HELP kube_pod_container_status_restarts_total [STABLE] The number of container restarts per container.\n",
            "# TYPE kube_pod_container_status_restarts_total counter\n",
            "kube_pod_container_status_restarts_total{namespace=\"default\",pod=\"web-1\",uid=\"u1\",container=\"app\"} 5\n",
        )));
        // No series where nothing is set: no deletion, no terminated reason, no completion.
        for absent in [
            "kube_pod_deletion_timestamp{",
            "kube_pod_container_status_terminated_reason{",
            "kube_pod_completion_time{",
            "kube_pod_status_unschedulable{",
        ] {
            assert!(!text.contains(absent), "{absent}");
        }
        // HELP and TYPE are there for every family all the same.
        assert!(text.contains("# TYPE kube_pod_deletion_timestamp gauge\n# HELP"));
    }

    #[test]
    fn objects_are_sorted_and_no_pods_means_no_text() {
        let mut a = crashlooping();
        a.metadata.name = Some("b".into());
        let mut b = crashlooping();
        b.metadata.name = Some("a".into());
        b.metadata.namespace = Some("kube-system".into());
        let mut c = crashlooping();
        c.metadata.name = Some("a".into());
        let text = render_text(&families(&[&a, &b, &c]));
        let pods: Vec<&str> = lines(&text)
            .into_iter()
            .filter(|l| l.starts_with("kube_pod_created{"))
            .map(|l| &l[l.find("pod=").unwrap_or(0)..l.find(",uid").unwrap_or(0)])
            .collect();
        assert_eq!(pods, ["pod=\"a\"", "pod=\"b\"", "pod=\"a\""]);
        assert!(text.contains("namespace=\"kube-system\",pod=\"a\""));
        assert!(families(&[]).is_empty());
    }

    #[test]
    fn terminated_and_deleting() {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "job-x", "namespace": "ns", "uid": "u2", "deletionTimestamp": "2024-06-14T10:10:00Z"},
            "spec": {"containers": [{"name": "c"}], "hostNetwork": true, "schedulerName": "default-scheduler", "serviceAccountName": "default"},
            "status": {
                "phase": "Succeeded",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
                "containerStatuses": [{"name": "c", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2024-06-14T10:00:00Z", "finishedAt": "2024-06-14T10:01:00Z"}}}]
            }
        }))
        .unwrap();
        let text = render_text(&families(&[&p]));
        let got = lines(&text);
        for w in [
            r#"kube_pod_deletion_timestamp{namespace="ns",pod="job-x",uid="u2"} 1.7183598e+09"#,
            r#"kube_pod_container_status_terminated_reason{namespace="ns",pod="job-x",uid="u2",container="c",reason="Completed"} 1"#,
            r#"kube_pod_completion_time{namespace="ns",pod="job-x",uid="u2"} 1.71835926e+09"#,
            r#"kube_pod_container_state_started{namespace="ns",pod="job-x",uid="u2",container="c"} 1.7183592e+09"#,
            r#"kube_pod_status_unschedulable{namespace="ns",pod="job-x",uid="u2"} 1"#,
            r#"kube_pod_owner{namespace="ns",pod="job-x",uid="u2",owner_kind="",owner_name="",owner_is_controller=""} 1"#,
            r#"kube_pod_scheduler{namespace="ns",pod="job-x",uid="u2",name="default-scheduler"} 1"#,
            r#"kube_pod_service_account{namespace="ns",pod="job-x",uid="u2",service_account="default"} 1"#,
        ] {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
        assert!(text.contains("host_network=\"true\""));
        assert!(!text.contains("kube_pod_container_status_waiting_reason{"));
    }
}
