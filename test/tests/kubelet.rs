//! The real kubelet on the real Docker engine, driven through the real apiserver with the
//! `kube` crate and the official kubectl: the shared-pod manifest, restart policies and
//! back-off, probes, restart safety, bad specs, and pod-to-pod traffic across two nodes
//! sharing one host. Every test removes its node's containers on drop, also on failure.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Result};
use e2e::kubelet::{node_containers, Kubelet, Node as Env};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerStatus, Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{json, Value};

fn pod_json(name: &str, node: &str, spec: Value) -> Result<Pod> {
    let mut spec = spec;
    spec["nodeName"] = json!(node);
    if spec.get("terminationGracePeriodSeconds").is_none() {
        spec["terminationGracePeriodSeconds"] = json!(1);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }))?)
}

fn busybox(name: &str, script: &str) -> Value {
    json!({"name": name, "image": "busybox", "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", script]})
}

fn cs<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == name)
}

fn waiting_reason(pod: &Pod, name: &str) -> Option<String> {
    cs(pod, name)?.state.as_ref()?.waiting.as_ref()?.reason.clone()
}

fn condition(pod: &Pod, t: &str) -> Option<String> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == t).map(|c| c.status.clone())
}

fn phase(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default()
}

/// Poll the pod until `pred` holds; on timeout the error shows its status and the kubelet log.
async fn wait_pod(env: &Env, name: &str, secs: u64, what: &str, pred: impl Fn(&Pod) -> bool) -> Result<Pod> {
    let api: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(p) = api.get_opt(name).await? {
            if pred(&p) {
                return Ok(p);
            }
            last = Some(p);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let status = last.and_then(|p| p.status).map(|s| serde_json::to_string_pretty(&s).unwrap_or_default());
    let log = env.kubelet.log();
    let tail: String = log.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    bail!("pod {name}: {what} not reached in {secs}s; status: {status:?}\nkubelet log tail:\n{tail}")
}

async fn wait_gone(env: &Env, name: &str, secs: u64) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if api.get_opt(name).await?.is_none() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("pod {name} still exists after {secs}s; kubelet log:\n{}", env.kubelet.log())
}

fn running_ready(p: &Pod) -> bool {
    phase(p) == "Running" && condition(p, "Ready").as_deref() == Some("True")
}

/// The README manifest 01: init container, shared emptyDir, readiness probe, localhost
/// traffic between containers; then Node, Lease, logs and deletion.
#[tokio::test(flavor = "multi_thread")]
async fn shared_pod_manifest_runs_two_of_two_ready() -> Result<()> {
    let Some(env) = Env::start("kl-shared")? else { return Ok(()) };
    let manifest = std::fs::read_to_string(e2e::manifests_dir().join("01-pod.yaml"))?;
    let manifest = manifest.replacen("spec:\n", &format!("spec:\n  nodeName: {}\n", env.kubelet.node), 1);
    let path = env.api.data_dir.join("01-pod.yaml");
    std::fs::write(&path, manifest)?;
    let out = env.api.kubectl(&["apply", "--validate=false", "-f", path.to_str().unwrap_or_default()])?;
    ensure!(out.ok, "kubectl apply failed: {}", out.stderr);

    let pod = wait_pod(&env, "shared-pod", 90, "Running and Ready", running_ready).await?;
    let st = pod.status.clone().unwrap_or_default();
    ensure!(st.container_statuses.iter().flatten().filter(|c| c.ready).count() == 2, "not 2/2 ready: {st:?}");
    let ip = st.pod_ip.clone().ok_or_else(|| anyhow!("no podIP"))?;
    let cidr_prefix = env.kubelet.pod_cidr.rsplit_once('.').map(|(a, _)| a.to_string()).unwrap_or_default();
    ensure!(ip.starts_with(&cidr_prefix), "pod IP {ip} not from the node's podCIDR {}", env.kubelet.pod_cidr);
    ensure!(st.host_ip.as_deref() == Some("127.0.0.1"), "hostIP {:?}", st.host_ip);
    ensure!(st.start_time.is_some(), "no startTime");
    let init = &st.init_container_statuses.clone().unwrap_or_default()[0];
    ensure!(init.state.as_ref().and_then(|s| s.terminated.as_ref()).map(|t| t.exit_code) == Some(0), "init: {init:?}");
    for c in st.container_statuses.iter().flatten() {
        ensure!(c.container_id.as_deref().is_some_and(|id| id.starts_with("docker://")), "containerID of {}", c.name);
        ensure!(c.image_id.starts_with("docker://sha256:"), "imageID of {}: {}", c.name, c.image_id);
    }
    let out = env.api.kubectl(&["get", "pod", "shared-pod", "--no-headers"])?;
    ensure!(out.stdout.contains("2/2") && out.stdout.contains("Running"), "kubectl get: {}", out.stdout);

    // The probe container fetched index.html from `web` through localhost.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = env.kubelet.get("/containerLogs/default/shared-pod/probe?tailLines=5")?;
        if code == 200 && body.contains("hello-from-init") {
            break;
        }
        ensure!(Instant::now() < deadline, "probe container logs lack hello-from-init: {code} {body:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (code, body) = env.kubelet.get("/containerLogs/default/shared-pod/nope")?;
    ensure!(code == 404, "unknown container logs: {code} {body}");

    // The Node and its Lease.
    let node = Api::<Node>::all(env.client.clone()).get(&env.kubelet.node).await?;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    ensure!(labels.get("kubernetes.io/hostname") == Some(&env.kubelet.node), "labels {labels:?}");
    ensure!(labels.contains_key("kubernetes.io/os") && labels.contains_key("kubernetes.io/arch"), "labels {labels:?}");
    let ns = node.status.clone().unwrap_or_default();
    let cap = ns.capacity.clone().unwrap_or_default();
    for r in ["cpu", "memory", "pods", "ephemeral-storage"] {
        ensure!(cap.contains_key(r), "capacity lacks {r}: {cap:?}");
    }
    ensure!(cap["pods"].0 == "110", "pods capacity {:?}", cap["pods"]);
    let info = ns.node_info.clone().unwrap_or_default();
    ensure!(info.container_runtime_version.starts_with("docker://"), "runtime {}", info.container_runtime_version);
    let ready = ns.conditions.iter().flatten().find(|c| c.type_ == "Ready").map(|c| c.status.clone());
    ensure!(ready.as_deref() == Some("True"), "node not Ready: {:?}", ns.conditions);
    let lease = Api::<Lease>::namespaced(env.client.clone(), "kube-node-lease").get(&env.kubelet.node).await?;
    ensure!(lease.spec.and_then(|s| s.renew_time).is_some(), "lease without renewTime");
    let (code, metrics) = env.kubelet.get("/metrics")?;
    ensure!(code == 200 && metrics.contains("kubelet_started_containers_total"), "metrics: {code}");

    // Graceful deletion ends with the object gone and no containers left.
    let out = env.api.kubectl(&["delete", "pod", "shared-pod", "--grace-period=1", "--wait=false"])?;
    ensure!(out.ok, "kubectl delete: {}", out.stderr);
    wait_gone(&env, "shared-pod", 60).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !node_containers(&env.kubelet.node).is_empty() {
        ensure!(Instant::now() < deadline, "containers left: {:?}", node_containers(&env.kubelet.node));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Restart policies with back-off, liveness restarts, readiness gating.
#[tokio::test(flavor = "multi_thread")]
async fn restart_policy_backoff_and_probes() -> Result<()> {
    let Some(env) = Env::start("kl-restart")? else { return Ok(()) };
    let api: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let node = env.kubelet.node.clone();
    let pp = PostParams::default();
    api.create(&pp, &pod_json("crasher", &node, json!({"containers": [busybox("c", "echo crashing; exit 3")]}))?)
        .await?;
    api.create(
        &pp,
        &pod_json("once", &node, json!({"restartPolicy": "OnFailure", "containers": [busybox("c", "exit 0")]}))?,
    )
    .await?;
    api.create(
        &pp,
        &pod_json("never-fails", &node, json!({"restartPolicy": "Never", "containers": [busybox("c", "exit 2")]}))?,
    )
    .await?;
    let mut live = busybox("c", "touch /tmp/healthy; sleep 4; rm /tmp/healthy; sleep 600");
    live["livenessProbe"] =
        json!({"exec": {"command": ["cat", "/tmp/healthy"]}, "periodSeconds": 1, "failureThreshold": 2});
    api.create(&pp, &pod_json("liveness", &node, json!({"containers": [live]}))?).await?;
    let mut unready = busybox("c", "sleep 600");
    unready["readinessProbe"] = json!({"exec": {"command": ["false"]}, "periodSeconds": 1});
    let mut ready = busybox("ok", "sleep 600");
    ready["readinessProbe"] = json!({"tcpSocket": {"port": 8081}, "periodSeconds": 1});
    ready["command"] = json!(["httpd", "-f", "-p", "8081"]);
    api.create(&pp, &pod_json("unready", &node, json!({"containers": [unready, ready]}))?).await?;

    // OnFailure + exit 0 → Succeeded; Never + exit 2 → Failed.
    let p = wait_pod(&env, "once", 60, "Succeeded", |p| phase(p) == "Succeeded").await?;
    ensure!(cs(&p, "c").map(|c| c.restart_count) == Some(0), "restarted: {:?}", cs(&p, "c"));
    let p = wait_pod(&env, "never-fails", 60, "Failed", |p| phase(p) == "Failed").await?;
    let term = cs(&p, "c").and_then(|c| c.state.clone()).and_then(|s| s.terminated);
    ensure!(term.as_ref().map(|t| (t.exit_code, t.reason.clone())) == Some((2, Some("Error".into()))), "{term:?}");

    // Always + exit 3: restarted, then held in CrashLoopBackOff with a growing delay.
    let p = wait_pod(&env, "crasher", 60, "CrashLoopBackOff after a restart", |p| {
        cs(p, "c").is_some_and(|c| c.restart_count >= 1)
            && waiting_reason(p, "c").as_deref() == Some("CrashLoopBackOff")
    })
    .await?;
    let c = cs(&p, "c").cloned().ok_or_else(|| anyhow!("no status"))?;
    let last = c.last_state.and_then(|s| s.terminated).ok_or_else(|| anyhow!("no lastState.terminated"))?;
    ensure!(last.exit_code == 3, "lastState exit code {}", last.exit_code);
    let msg = c.state.and_then(|s| s.waiting).and_then(|w| w.message).unwrap_or_default();
    ensure!(msg.starts_with("back-off 10s restarting failed container=c pod=crasher_default"), "message {msg:?}");
    let p = wait_pod(&env, "crasher", 60, "second back-off", |p| {
        cs(p, "c").is_some_and(|c| c.restart_count >= 2)
            && waiting_reason(p, "c").as_deref() == Some("CrashLoopBackOff")
    })
    .await?;
    let msg =
        cs(&p, "c").and_then(|c| c.state.clone()).and_then(|s| s.waiting).and_then(|w| w.message).unwrap_or_default();
    ensure!(msg.starts_with("back-off 20s"), "the back-off did not grow: {msg:?}");
    let (code, body) = env.kubelet.get("/containerLogs/default/crasher/c?previous=true")?;
    ensure!(code == 200 && body.contains("crashing"), "previous logs: {code} {body:?}");

    // A failing liveness probe restarts the container.
    let p = wait_pod(&env, "liveness", 60, "a liveness restart", |p| cs(p, "c").is_some_and(|c| c.restart_count >= 1))
        .await?;
    ensure!(
        cs(&p, "c").is_some_and(|c| c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).is_some()),
        "no lastState"
    );

    // A failing readiness probe keeps the pod Running but not Ready.
    let p = wait_pod(&env, "unready", 60, "Running with ok ready", |p| {
        phase(p) == "Running" && cs(p, "ok").is_some_and(|c| c.ready)
    })
    .await?;
    ensure!(condition(&p, "Ready").as_deref() == Some("False"), "Ready should be False: {:?}", p.status);
    ensure!(cs(&p, "c").is_some_and(|c| !c.ready), "c must not be ready");
    ensure!(env.kubelet.get("/healthz")?.0 == 200, "kubelet unhealthy");
    Ok(())
}

/// A killed kubelet adopts its running containers (same IDs, no duplicates) and cleans up
/// pods deleted while it was down.
#[tokio::test(flavor = "multi_thread")]
async fn kubelet_restart_adopts_containers_and_cleans_up() -> Result<()> {
    let Some(mut env) = Env::start("kl-adopt")? else { return Ok(()) };
    let api: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let node = env.kubelet.node.clone();
    // `keep` has a slow readiness probe: its first result after a kubelet restart comes 5 s
    // late, so a Ready that survives the restart comes from the adopted state.
    let mut slow = busybox("c", "sleep 600");
    slow["readinessProbe"] = json!({"exec": {"command": ["true"]}, "initialDelaySeconds": 5, "periodSeconds": 30});
    api.create(&PostParams::default(), &pod_json("keep", &node, json!({"containers": [slow]}))?).await?;
    api.create(&PostParams::default(), &pod_json("drop", &node, json!({"containers": [busybox("c", "sleep 600")]}))?)
        .await?;
    let keep = wait_pod(&env, "keep", 60, "Running", running_ready).await?;
    wait_pod(&env, "drop", 60, "Running", running_ready).await?;
    let ids = |n: &str| {
        let mut v: Vec<(String, String)> = node_containers(n)
            .into_iter()
            .filter(|(_, name, _)| name.contains("_keep_"))
            .map(|(id, name, _)| (id, name))
            .collect();
        v.sort();
        v
    };
    let before = ids(&node);
    ensure!(before.len() == 2, "keep should have pause + c: {before:?}");

    env.kubelet.kill();
    api.delete("drop", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    wait_gone(&env, "drop", 10).await?;
    env.kubelet.restart()?;

    let deadline = Instant::now() + Duration::from_secs(30);
    while node_containers(&node).iter().any(|(_, name, _)| name.contains("_drop_")) {
        ensure!(Instant::now() < deadline, "containers of the deleted pod remain: {:?}", node_containers(&node));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The adopted pod stays Ready through the restart's first sync rounds.
    let p = wait_pod(&env, "keep", 30, "Running and Ready after restart", running_ready).await?;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let now = api.get("keep").await?;
        ensure!(running_ready(&now), "keep lost Ready after the kubelet restart: {:?}", now.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(ids(&node) == before, "containers changed across the restart: {before:?} -> {:?}", ids(&node));
    let c = cs(&p, "c").ok_or_else(|| anyhow!("no status"))?;
    ensure!(c.restart_count == 0, "restartCount {}", c.restart_count);
    ensure!(
        c.container_id == cs(&keep, "c").and_then(|c| c.container_id.clone()),
        "containerID changed: {:?}",
        c.container_id
    );
    ensure!(
        p.status.as_ref().and_then(|s| s.pod_ip.clone()) == keep.status.as_ref().and_then(|s| s.pod_ip.clone()),
        "pod IP changed"
    );
    Ok(())
}

/// Unknown images, missing ConfigMaps and invalid commands give Kubernetes' reasons and do
/// not take the kubelet down.
#[tokio::test(flavor = "multi_thread")]
async fn bad_specs_give_kubernetes_reasons() -> Result<()> {
    let Some(mut env) = Env::start("kl-bad")? else { return Ok(()) };
    let api: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let node = env.kubelet.node.clone();
    let pp = PostParams::default();
    let img = json!({"name": "c", "image": "minik8s-e2e-no-such-image:v1", "imagePullPolicy": "IfNotPresent"});
    api.create(&pp, &pod_json("badimage", &node, json!({"containers": [img]}))?).await?;
    let mut env_cm = busybox("c", "sleep 600");
    env_cm["env"] = json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "missing-cm", "key": "k"}}}]);
    api.create(&pp, &pod_json("badenv", &node, json!({"containers": [env_cm]}))?).await?;
    let mut vol = busybox("c", "sleep 600");
    vol["volumeMounts"] = json!([{"name": "cfg", "mountPath": "/cfg"}]);
    api.create(
        &pp,
        &pod_json(
            "badvolume",
            &node,
            json!({"containers": [vol], "volumes": [{"name": "cfg", "configMap": {"name": "missing-cm"}}]}),
        )?,
    )
    .await?;
    let cmd =
        json!({"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent", "command": ["/no/such/binary"]});
    api.create(&pp, &pod_json("badcommand", &node, json!({"containers": [cmd]}))?).await?;

    let p = wait_pod(&env, "badimage", 90, "ErrImagePull/ImagePullBackOff", |p| {
        matches!(waiting_reason(p, "c").as_deref(), Some("ErrImagePull" | "ImagePullBackOff"))
    })
    .await?;
    let msg =
        cs(&p, "c").and_then(|c| c.state.clone()).and_then(|s| s.waiting).and_then(|w| w.message).unwrap_or_default();
    ensure!(msg.contains("minik8s-e2e-no-such-image:v1"), "message does not name the image: {msg:?}");
    ensure!(phase(&p) == "Pending", "phase {}", phase(&p));
    let p = wait_pod(&env, "badenv", 60, "CreateContainerConfigError", |p| {
        waiting_reason(p, "c").as_deref() == Some("CreateContainerConfigError")
    })
    .await?;
    let msg =
        cs(&p, "c").and_then(|c| c.state.clone()).and_then(|s| s.waiting).and_then(|w| w.message).unwrap_or_default();
    ensure!(msg == "configmap \"missing-cm\" not found", "message {msg:?}");
    // kubectl describe shows it as a Warning event from the kubelet.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(env.client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = events.list(&Default::default()).await?;
        let found = list.items.iter().any(|e| {
            e.involved_object.name.as_deref() == Some("badenv")
                && e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("Failed")
                && e.message.as_deref().is_some_and(|m| m.contains("missing-cm"))
        });
        if found {
            break;
        }
        ensure!(Instant::now() < deadline, "no Warning/Failed event for badenv: {:?}", list.items);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    wait_pod(&env, "badvolume", 60, "CreateContainerConfigError", |p| {
        waiting_reason(p, "c").as_deref() == Some("CreateContainerConfigError")
    })
    .await?;
    wait_pod(&env, "badcommand", 60, "RunContainerError", |p| {
        waiting_reason(p, "c").as_deref() == Some("RunContainerError")
    })
    .await?;
    ensure!(env.kubelet.alive(), "kubelet died; log:\n{}", env.kubelet.log());

    // Creating the ConfigMap lets the pods start.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(env.client.clone(), "default");
    cms.create(&pp, &serde_json::from_value(json!({"metadata": {"name": "missing-cm"}, "data": {"k": "v"}}))?).await?;
    wait_pod(&env, "badenv", 60, "Running once the ConfigMap exists", running_ready).await?;
    wait_pod(&env, "badvolume", 60, "Running once the ConfigMap exists", running_ready).await?;
    Ok(())
}

/// Two kubelets (two nodes) share one Docker engine: each sees only its own containers, and
/// a pod on one node reaches a pod on the other by pod IP.
#[tokio::test(flavor = "multi_thread")]
async fn pods_on_two_nodes_reach_each_other() -> Result<()> {
    let Some(env) = Env::start("kl-net-a")? else { return Ok(()) };
    let other = Kubelet::start(&env.api.url(), "kl-net-b")?;
    let api: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let pp = PostParams::default();
    let mut web =
        busybox("web", "mkdir -p /www && echo pong-$(hostname) > /www/index.html && httpd -f -p 8080 -h /www");
    web["readinessProbe"] = json!({"httpGet": {"path": "/index.html", "port": 8080}, "periodSeconds": 1});
    api.create(&pp, &pod_json("server", &env.kubelet.node, json!({"containers": [web]}))?).await?;
    let server = wait_pod(&env, "server", 60, "Running and Ready", running_ready).await?;
    let ip = server.status.as_ref().and_then(|s| s.pod_ip.clone()).ok_or_else(|| anyhow!("no pod IP"))?;
    let script = format!("until wget -q -O - http://{ip}:8080/index.html; do sleep 1; done; sleep 600");
    api.create(&pp, &pod_json("client", &other.node, json!({"containers": [busybox("c", &script)]}))?).await?;
    let client = wait_pod(&env, "client", 60, "Running", running_ready).await?;
    let cip = client.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();
    ensure!(cip != ip, "both pods got {ip}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = other.get("/containerLogs/default/client/c")?;
        if body.contains("pong-server") {
            break;
        }
        ensure!(Instant::now() < deadline, "client on {} never reached {ip}: {code} {body:?}", other.node);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Each kubelet only ever touched its own pods.
    ensure!(
        node_containers(&env.kubelet.node).iter().all(|(_, n, _)| n.contains("_server_")),
        "node a has foreign containers"
    );
    ensure!(
        node_containers(&other.node).iter().all(|(_, n, _)| n.contains("_client_")),
        "node b has foreign containers"
    );
    ensure!(other.get("/containerLogs/default/server/web")?.0 == 404, "node b serves node a's logs");
    Ok(())
}

/// The apiserver going away does not stop running pods, and the kubelet reconnects.
#[tokio::test(flavor = "multi_thread")]
async fn apiserver_restart_keeps_pods_running() -> Result<()> {
    let Some(mut env) = Env::start("kl-apirestart")? else { return Ok(()) };
    let api: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    let node = env.kubelet.node.clone();
    api.create(&PostParams::default(), &pod_json("before", &node, json!({"containers": [busybox("c", "sleep 600")]}))?)
        .await?;
    wait_pod(&env, "before", 60, "Running", running_ready).await?;
    let running = |n: &str| {
        let mut v: Vec<String> =
            node_containers(n).into_iter().filter(|(_, _, st)| st == "running").map(|(id, _, _)| id).collect();
        v.sort();
        v
    };
    let ids = running(&node);
    ensure!(ids.len() == 2, "pause + c expected: {ids:?}");

    env.api.stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(running(&node) == ids, "containers changed while the apiserver was down");
    ensure!(env.kubelet.alive(), "kubelet died without the apiserver; log:\n{}", env.kubelet.log());
    env.api.restart()?;

    api.create(&PostParams::default(), &pod_json("after", &node, json!({"containers": [busybox("c", "sleep 600")]}))?)
        .await?;
    wait_pod(&env, "after", 90, "Running after the apiserver came back", running_ready).await?;
    ensure!(running(&node).iter().filter(|id| ids.contains(id)).count() == 2, "the first pod's containers changed");
    Ok(())
}

/// ConfigMap, Secret, downwardAPI, hostPath and emptyDir volumes; env from every source;
/// runAsUser; workingDir; hostNetwork.
#[tokio::test(flavor = "multi_thread")]
async fn volumes_env_and_security_context() -> Result<()> {
    let Some(env) = Env::start("kl-vol")? else { return Ok(()) };
    let client = env.client.clone();
    let pp = PostParams::default();
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&pp, &serde_json::from_value(json!({"metadata": {"name": "cm1"}, "data": {"greeting": "hello"}}))?)
        .await?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), "default");
    secrets
        .create(&pp, &serde_json::from_value(json!({"metadata": {"name": "s1"}, "data": {"pw": "c2VjcmV0"}}))?)
        .await?;
    // Services created before the pod are in its environment, the apiserver's own always.
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), "default");
    let web = services
        .create(
            &pp,
            &serde_json::from_value(
                json!({"metadata": {"name": "web-api"}, "spec": {"ports": [{"name": "http", "port": 8080}]}}),
            )?,
        )
        .await?;
    let web_ip = web.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
    let master = services.get("kubernetes").await?.spec.unwrap_or_default();
    let master_port = master.ports.unwrap_or_default().first().map(|p| p.port).unwrap_or_default();
    let want_svc =
        format!("SVC={}:{master_port}-{web_ip}:8080-tcp://{web_ip}:8080", master.cluster_ip.unwrap_or_default());
    let host_dir = tempfile::tempdir()?;
    std::fs::write(host_dir.path().join("marker"), "from-the-host")?;

    let script = "cat /cfg/greeting; echo; cat /sec/pw; echo; cat /info/name; echo; \
                  echo ENV=$GREETING-$PW-$POD_NAME-$CM_greeting; echo UID=$(id -u); echo PWD=$(pwd); \
                  echo SVC=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT-$WEB_API_SERVICE_HOST:$WEB_API_SERVICE_PORT_HTTP-$WEB_API_PORT; \
                  cat /host/marker; echo; echo x > /scratch/f && echo EMPTYDIR-OK; sleep 600";
    let mut c = busybox("c", script);
    c["workingDir"] = json!("/tmp");
    c["securityContext"] = json!({"runAsUser": 1000});
    c["env"] = json!([
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cm1", "key": "greeting"}}},
        {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "pw"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]);
    c["envFrom"] = json!([{"configMapRef": {"name": "cm1"}, "prefix": "CM_"}]);
    c["volumeMounts"] = json!([
        {"name": "cfg", "mountPath": "/cfg"}, {"name": "sec", "mountPath": "/sec"},
        {"name": "info", "mountPath": "/info"}, {"name": "host", "mountPath": "/host", "readOnly": true},
        {"name": "scratch", "mountPath": "/scratch"}
    ]);
    let spec = json!({
        "securityContext": {"fsGroup": 1000},
        "containers": [c],
        "volumes": [
            {"name": "cfg", "configMap": {"name": "cm1"}},
            {"name": "sec", "secret": {"secretName": "s1"}},
            {"name": "info", "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
            {"name": "host", "hostPath": {"path": host_dir.path().to_string_lossy()}},
            {"name": "scratch", "emptyDir": {}}
        ]
    });
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    api.create(&pp, &pod_json("vols", &env.kubelet.node, spec)?).await?;
    wait_pod(&env, "vols", 60, "Running", running_ready).await?;
    let want =
        ["hello", "secret", "vols", "ENV=hello-secret-vols-hello", "UID=1000", "PWD=/tmp", "from-the-host", &want_svc];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = env.kubelet.get("/containerLogs/default/vols/c")?;
        let lines: Vec<&str> = body.lines().collect();
        if want.iter().all(|w| lines.contains(w)) {
            break;
        }
        ensure!(Instant::now() < deadline, "logs lack {want:?}: {body:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // /stats/summary reports the pod's container with its memory.
    let (code, body) = env.kubelet.get("/stats/summary")?;
    ensure!(code == 200, "stats/summary: {code} {body}");
    let v: Value = serde_json::from_str(&body)?;
    let pod = v["pods"].as_array().and_then(|ps| ps.iter().find(|p| p["podRef"]["name"] == "vols")).cloned();
    let ws = pod.as_ref().and_then(|p| p["containers"][0]["memory"]["workingSetBytes"].as_u64());
    ensure!(ws.is_some_and(|b| b > 0), "no working set for vols: {body}");

    let hn = json!({"hostNetwork": true, "containers": [busybox("c", "sleep 600")]});
    api.create(&pp, &pod_json("hostnet", &env.kubelet.node, hn)?).await?;
    let p = wait_pod(&env, "hostnet", 60, "Running", running_ready).await?;
    let st = p.status.unwrap_or_default();
    ensure!(
        st.pod_ip.is_some() && st.pod_ip == st.host_ip,
        "hostNetwork podIP {:?} hostIP {:?}",
        st.pod_ip,
        st.host_ip
    );
    Ok(())
}

/// Deletion runs the preStop hook, sends SIGTERM, and ends with the object gone.
#[tokio::test(flavor = "multi_thread")]
async fn graceful_deletion_runs_prestop_hook() -> Result<()> {
    let Some(env) = Env::start("kl-prestop")? else { return Ok(()) };
    let host_dir = tempfile::tempdir()?;
    let mut c = busybox("c", "trap 'echo got-term > /hook/term; exit 0' TERM; while true; do sleep 1; done");
    c["lifecycle"] = json!({"preStop": {"exec": {"command": ["sh", "-c", "echo bye > /hook/prestop"]}}});
    c["volumeMounts"] = json!([{"name": "hook", "mountPath": "/hook"}]);
    let spec = json!({
        "terminationGracePeriodSeconds": 20,
        "containers": [c],
        "volumes": [{"name": "hook", "hostPath": {"path": host_dir.path().to_string_lossy()}}]
    });
    let api: Api<Pod> = Api::namespaced(env.client.clone(), "default");
    api.create(&PostParams::default(), &pod_json("graceful", &env.kubelet.node, spec)?).await?;
    wait_pod(&env, "graceful", 60, "Running", running_ready).await?;
    let out = env.api.kubectl(&["delete", "pod", "graceful", "--wait=false"])?;
    ensure!(out.ok, "kubectl delete: {}", out.stderr);
    wait_gone(&env, "graceful", 60).await?;
    let read = |f: &str| std::fs::read_to_string(host_dir.path().join(f)).unwrap_or_default();
    ensure!(read("prestop").trim() == "bye", "preStop hook did not run");
    ensure!(read("term").trim() == "got-term", "container did not get SIGTERM");
    ensure!(node_containers(&env.kubelet.node).is_empty(), "containers left: {:?}", node_containers(&env.kubelet.node));
    Ok(())
}
