//! Extended resources and device plugins on a real cluster (apiserver, scheduler,
//! controller-manager, a kubelet on Docker) with the sample device plugin as its own process:
//! the node advertises `example.com/widget: 3`; of four pods asking for one each, three run
//! with distinct devices (the device's file mounted, its character device, its environment
//! variable) and the fourth stays Pending with `Insufficient example.com/widget`; requests
//! that are not whole or lack an equal limit are refused with 422; `kubectl describe node`
//! (ours and the official one) shows what is allocated; a kubelet restart keeps every
//! assignment (the pod that starts after one is deleted gets exactly the freed device); a
//! device marked unhealthy leaves allocatable; a plugin that dies takes allocatable to 0 while
//! the pods using its devices keep running.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use e2e::eventually;
use e2e::kubelet::Cluster;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const W: &str = "example.com/widget";
const WAIT: Duration = Duration::from_secs(90);

/// The sample device plugin process; killed on drop.
struct Plugin(Child);

impl Plugin {
    fn start(kubelet_dir: &Path, state: &Path, log: &Path) -> Result<Plugin> {
        let log = std::fs::File::create(log)?;
        let child = Command::new(e2e::device_plugin_bin())
            .arg("--device-plugin-path")
            .arg(kubelet_dir)
            .args(["sample", "--resource-name", W, "--count", "3", "--state-dir"])
            .arg(state)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting device-plugin sample")?;
        Ok(Plugin(child))
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The node's (capacity, allocatable) of the widget resource.
async fn widgets(nodes: &Api<Node>, node: &str) -> Option<(String, String)> {
    let n = nodes.get(node).await.ok()?;
    let s = n.status?;
    Some((s.capacity?.get(W)?.0.clone(), s.allocatable?.get(W)?.0.clone()))
}

async fn wait_widgets(nodes: &Api<Node>, node: &str, cap: &str, alloc: &str) -> Result<()> {
    let want = Some((cap.to_string(), alloc.to_string()));
    eventually(WAIT, || async { widgets(nodes, node).await == want })
        .await
        .with_context(|| format!("node {node} {W}: want (capacity, allocatable) {want:?}"))
}

fn widget_pod(name: &str, resources: serde_json::Value) -> Result<Pod> {
    // Prints the device it got three ways, then waits (and exits at once on SIGTERM).
    let script = "echo \"env=$WIDGET_DEVICES\"; cat /devices/*; test -c \"/dev/$WIDGET_DEVICES\" && echo chardev; \
                  trap 'exit 0' TERM; sleep 3600 & wait";
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [{
            "name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", script], "resources": resources}]}
    }))?)
}

/// Poll `f` until it returns a value, or fail after `timeout`.
async fn until<T, F, Fut>(timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if std::time::Instant::now() > deadline {
            bail!("condition not met within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

fn kubectl(c: &Cluster, args: &[&str]) -> Result<String> {
    let out = c.api.kubectl(args)?;
    ensure!(out.ok, "kubectl {}: {}{}", args.join(" "), out.stdout, out.stderr);
    Ok(out.stdout)
}

/// The device a pod's log says it got (`env=<id>`), once the log shows all three proofs.
fn device_of(c: &Cluster, pod: &str) -> Result<String> {
    let log = kubectl(c, &["logs", pod])?;
    let id = log.lines().find_map(|l| l.strip_prefix("env=")).unwrap_or_default().to_string();
    ensure!(!id.is_empty(), "{pod}: no device in its log: {log:?}");
    ensure!(log.lines().any(|l| l == id), "{pod}: the file of {id} is not mounted: {log:?}");
    ensure!(log.lines().any(|l| l == "chardev"), "{pod}: /dev/{id} is not a character device: {log:?}");
    Ok(id)
}

/// describe node's "Non-terminated Pods" and "Allocated resources" sections, words only and
/// without the pods' ages.
fn pods_sections(describe: &str) -> Vec<String> {
    let from = describe.find("Non-terminated Pods:").unwrap_or(describe.len());
    let to = describe.find("Events:").unwrap_or(describe.len());
    describe[from..to.max(from)]
        .lines()
        .map(|l| {
            let mut w: Vec<&str> = l.split_whitespace().collect();
            if l.starts_with("  default ") {
                w.pop();
            }
            w.join(" ")
        })
        .collect()
}

/// `example.com/widget  <requests>  <limits>` in describe's "Allocated resources".
fn allocated_widgets(describe: &str) -> Option<(String, String)> {
    let section = describe.split("Allocated resources:").nth(1)?;
    let line = section.lines().find(|l| l.trim_start().starts_with(W))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    Some((f.get(1)?.to_string(), f.get(2)?.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sample_devices_schedule_allocate_survive_restarts_and_fail() -> Result<()> {
    let t0 = std::time::Instant::now();
    let stage = |what: &str| eprintln!("[{:>6.1}s] {what}", t0.elapsed().as_secs_f64());
    let Some(mut c) = Cluster::start("dev", 1)? else { return Ok(()) };
    let client = c.api.client()?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let node = c.nodes[0].node.clone();
    let tmp = tempfile::tempdir()?;
    let state = tmp.path().join("widgets");
    let mut plugin = Plugin::start(&c.nodes[0].device_plugin_dir(), &state, &tmp.path().join("plugin.log"))?;
    wait_widgets(&nodes, &node, "3", "3").await.with_context(|| c.log_tail())?;

    stage("node advertises 3");
    // Bad input: refused with the apiserver's 422 and nothing stored.
    for (name, resources, want) in [
        (
            "no-limit",
            json!({"requests": {W: "1"}}),
            "spec.containers[0].resources.limits[example.com/widget]: Required value: Limit must be set for non overcommitable resources",
        ),
        (
            "half",
            json!({"limits": {W: "500m"}}),
            "spec.containers[0].resources.limits[example.com/widget]: Invalid value: \"500m\": must be an integer",
        ),
        (
            "unequal",
            json!({"requests": {W: "1"}, "limits": {W: "2"}}),
            "spec.containers[0].resources.requests[example.com/widget]: Invalid value: \"1\": must be equal to example.com/widget limit of 2",
        ),
    ] {
        match pods.create(&PostParams::default(), &widget_pod(name, resources)?).await {
            Err(kube::Error::Api(e)) => {
                ensure!(e.code == 422, "{name}: {} {}", e.code, e.message);
                ensure!(e.message.contains(want), "{name}: {}", e.message);
            }
            other => bail!("{name}: want 422, got {other:?}"),
        }
        ensure!(pods.get_opt(name).await?.is_none(), "{name} was stored");
    }

    stage("bad input refused");
    // Four pods, three devices.
    for i in 1..=4 {
        pods.create(&PostParams::default(), &widget_pod(&format!("w{i}"), json!({"limits": {W: "1"}}))?).await?;
    }
    let (mut running, pending) = until(WAIT, || async {
        let list = pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let running: Vec<String> =
            list.iter().filter(|p| phase(p) == "Running").filter_map(|p| p.metadata.name.clone()).collect();
        let unschedulable: Vec<String> = list
            .iter()
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.message.as_deref().unwrap_or_default().contains("Insufficient example.com/widget")
                    })
                })
            })
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        (running.len() == 3 && unschedulable.len() == 1).then(|| (running, unschedulable[0].clone()))
    })
    .await
    .with_context(|| format!("want 3 Running and 1 Pending with Insufficient {W}\n{}", c.log_tail()))?;
    stage("3 running, 1 pending");
    running.sort();
    let mut held = std::collections::BTreeMap::new();
    for p in &running {
        let id = until(WAIT, || async { device_of(&c, p).ok() })
            .await
            .with_context(|| format!("{p}: {:?}", device_of(&c, p).err()))?;
        held.insert(p.clone(), id);
    }
    let distinct: BTreeSet<&String> = held.values().collect();
    ensure!(distinct.len() == 3, "devices given twice: {held:?}");

    stage("devices distinct");
    // describe node, ours and the official kubectl's: three requested, three limited, and the
    // pods' sections alike (ages aside).
    let ours =
        e2e::kubectl::run(&e2e::kubectl::our_kubectl(), &c.api.url(), &["describe", "node", &node], None)?.stdout;
    let official = kubectl(&c, &["describe", "node", &node])?;
    for (who, text) in [("ours", &ours), ("official", &official)] {
        ensure!(allocated_widgets(text) == Some(("3".into(), "3".into())), "{who} describe:\n{text}");
    }
    ensure!(
        pods_sections(&ours) == pods_sections(&official),
        "describe node differs:\nours:\n{ours}\nofficial:\n{official}"
    );
    stage("describe checked");
    // A kubelet restart keeps the assignments: the running pods keep their containers, and
    // the pod that starts once one is deleted gets exactly the freed device.
    c.nodes[0].restart()?;
    wait_widgets(&nodes, &node, "3", "3").await.with_context(|| c.log_tail())?;
    stage("kubelet restarted");
    let (gone, freed) = held.iter().next().map(|(p, d)| (p.clone(), d.clone())).context("no pod")?;
    pods.delete(&gone, &DeleteParams::default()).await?;
    eventually(WAIT, || async { pods.get_opt(&pending).await.ok().flatten().is_some_and(|p| phase(&p) == "Running") })
        .await
        .with_context(|| format!("{pending} did not start after {gone} went\n{}", c.log_tail()))?;
    let got = until(WAIT, || async { device_of(&c, &pending).ok() })
        .await
        .with_context(|| format!("{pending}: {:?}", device_of(&c, &pending).err()))?;
    ensure!(got == freed, "{pending} got {got}, but {gone} freed {freed} (held: {held:?})");
    for p in running.iter().filter(|p| **p != gone) {
        let pod = pods.get(p).await?;
        let restarts: i32 =
            pod.status.and_then(|s| s.container_statuses).into_iter().flatten().map(|s| s.restart_count).sum();
        ensure!(restarts == 0, "{p} restarted across the kubelet restart");
    }

    stage("freed device reused");
    // A device marked unhealthy leaves allocatable; capacity stays.
    std::fs::write(state.join(format!("{}.unhealthy", held[&running[1]])), "")?;
    wait_widgets(&nodes, &node, "3", "2").await.with_context(|| c.log_tail())?;

    stage("unhealthy counted");
    // The plugin dies: nothing is allocatable, and the pods using its devices keep running.
    let _ = plugin.0.kill();
    let _ = plugin.0.wait();
    wait_widgets(&nodes, &node, "3", "0").await.with_context(|| c.log_tail())?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for p in running.iter().filter(|p| **p != gone).chain([&pending]) {
        let pod = pods.get(p).await?;
        ensure!(phase(&pod) == "Running", "{p} is {} after the plugin died", phase(&pod));
    }
    Ok(())
}
