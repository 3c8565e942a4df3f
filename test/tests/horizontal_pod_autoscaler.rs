//! The HorizontalPodAutoscaler controller on a real cluster (apiserver, scheduler,
//! controller-manager, a kubelet on Docker), driven with the official kubectl as a user
//! would: `kubectl autoscale`, a CPU load started and stopped with `kubectl exec`, memory
//! filled the same way; the Deployment's replica count, the HPA's status, conditions and
//! events are what a user checks. The sync period and the scale-down window are shortened
//! by flags; the time each scaling took is printed (run with `--nocapture`), not asserted.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::controller_manager::ControllerManager;
use e2e::kubectl::{our_kubectl, run};
use e2e::kubelet::{require_docker, Kubelet};
use e2e::scheduler::Scheduler;
use e2e::{official_kubectl, ApiServer};
use serde_json::Value;

struct Cluster {
    kubelet: Kubelet,
    cm: ControllerManager,
    _sched: Scheduler,
    api: ApiServer,
}

const HPA_FLAGS: &[&str] = &[
    "--controllers=replicaset,deployment,horizontalpodautoscaling",
    "--horizontal-pod-autoscaler-sync-period=3s",
    "--horizontal-pod-autoscaler-downscale-stabilization=20s",
];

fn cluster(prefix: &str) -> Result<Option<Cluster>> {
    if !require_docker() {
        return Ok(None);
    }
    let api = ApiServer::start()?;
    let sched = Scheduler::start(&api, &[])?;
    let cm = ControllerManager::start(&api, HPA_FLAGS)?;
    let kubelet = Kubelet::start(&api.url(), prefix)?;
    Ok(Some(Cluster { kubelet, cm, _sched: sched, api }))
}

impl Cluster {
    fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = self.api.kubectl(args)?;
        if !out.ok {
            bail!(
                "kubectl {}: {}{}\ncontroller-manager log:\n{}",
                args.join(" "),
                out.stdout,
                out.stderr,
                self.cm.log()
            );
        }
        Ok(out.stdout)
    }

    fn apply(&self, name: &str, text: &str) -> Result<String> {
        let path = self.api.data_dir.join(name);
        std::fs::write(&path, text)?;
        self.kubectl(&["apply", "-f", path.to_str().context("non-UTF-8 temp path")?])
    }

    fn json(&self, args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl(&all)?)?)
    }

    /// Poll until `f` holds for the object `kubectl get <what> -o json` prints.
    async fn wait_for(&self, what: &[&str], secs: u64, why: &str, f: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut last = Value::Null;
        while Instant::now() < deadline {
            if let Ok(v) = self.json(what) {
                if f(&v) {
                    return Ok(v);
                }
                last = v;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bail!(
            "{why}: not reached within {secs}s; last {}:\n{}\ncontroller-manager log tail:\n{}",
            what.join(" "),
            serde_json::to_string_pretty(&last).unwrap_or_default(),
            tail(&self.cm.log(), 30)
        )
    }

    fn first_pod(&self, app: &str) -> Result<String> {
        let name =
            self.kubectl(&["get", "pods", "-l", &format!("app={app}"), "-o", "jsonpath={.items[0].metadata.name}"])?;
        ensure!(!name.trim().is_empty(), "no pod of {app}");
        Ok(name.trim().to_string())
    }

    fn events(&self, reason: &str) -> Result<Vec<String>> {
        let v = self.json(&["get", "events", "--field-selector", &format!("reason={reason}")])?;
        Ok(v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["message"].as_str().map(String::from))
            .collect())
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn condition<'a>(hpa: &'a Value, type_: &str) -> Option<&'a Value> {
    hpa.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == type_)
}

fn condition_is(hpa: &Value, type_: &str, status: &str, reason: &str) -> bool {
    condition(hpa, type_).is_some_and(|c| c["status"] == status && c["reason"] == reason)
}

fn replicas(d: &Value) -> i64 {
    d.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(-1)
}

/// A Deployment of busybox pods that spin a CPU while `/tmp/burn` exists.
fn deployment(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: 1\n  selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: app\n        image: busybox\n        imagePullPolicy: IfNotPresent\n        command: [sh, -c, 'while true; do if [ -f /tmp/burn ]; then :; else sleep 1; fi; done']\n{resources}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_load_scales_a_deployment_up_to_max_and_back_down() -> Result<()> {
    let Some(c) = cluster("hpa-cpu")? else { return Ok(()) };
    c.apply("web.yaml", &deployment("web", "        resources:\n          requests:\n            cpu: 100m\n"))?;
    c.kubectl(&["rollout", "status", "deployment/web", "--timeout=120s"])?;

    // `kubectl autoscale`: the official 1.33 and ours generate the same object.
    let official = official_kubectl("1.33");
    let args = ["autoscale", "deployment", "web", "--cpu-percent=50", "--min=1", "--max=3"];
    if official.exists() {
        let mut dry = args.to_vec();
        dry.extend(["--dry-run=client", "-o", "json"]);
        let theirs = run(&official, &c.api.url(), &dry, None)?;
        let ours = run(&our_kubectl(), &c.api.url(), &dry, None)?;
        ensure!(theirs.code == 0 && ours.code == 0, "{theirs:?}\n{ours:?}");
        let (t, o): (Value, Value) = (serde_json::from_str(&theirs.stdout)?, serde_json::from_str(&ours.stdout)?);
        ensure!(t == o, "kubectl autoscale objects differ:\nofficial 1.33: {t}\nours: {o}");
    } else {
        ensure!(std::env::var("CI").as_deref() != Ok("true"), "kubectl 1.33 missing");
    }
    let out = run(&our_kubectl(), &c.api.url(), &args, None)?;
    ensure!(out.code == 0 && out.stdout.trim() == "horizontalpodautoscaler.autoscaling/web autoscaled", "{out:?}");

    // Idle: the HPA reads the pods' CPU and keeps one replica.
    c.wait_for(&["get", "hpa", "web"], 90, "idle HPA with a cpu reading", |h| {
        h.pointer("/status/currentMetrics/0/resource/current/averageUtilization").is_some()
            && condition_is(h, "ScalingActive", "True", "ValidMetricFound")
    })
    .await?;
    let row = c.kubectl(&["get", "hpa", "web", "--no-headers"])?;
    let cols: Vec<&str> = row.split_whitespace().collect();
    ensure!(cols.len() >= 7 && cols[1] == "Deployment/web" && cols[2] == "cpu:" && cols[3].ends_with("%/50%"), "{row}");

    // Load: the pod burns a core against a 100m request.
    let pod = c.first_pod("web")?;
    c.kubectl(&["exec", &pod, "--", "touch", "/tmp/burn"])?;
    let t0 = Instant::now();
    let d = c.wait_for(&["get", "deployment", "web"], 90, "scale-up under load", |d| replicas(d) == 3).await?;
    println!("scale-up 1 → {}: {:.1}s after the load started", replicas(&d), t0.elapsed().as_secs_f64());
    let rescales = c.events("SuccessfulRescale")?;
    ensure!(
        rescales.iter().any(|m| m.starts_with("New size: ")
            && m.ends_with("; reason: cpu resource utilization (percentage of request) above target")),
        "{rescales:?}"
    );
    // maxReplicas holds while the load stays: the HPA wants more and says it is limited.
    let h = c
        .wait_for(&["get", "hpa", "web"], 30, "ScalingLimited at maxReplicas", |h| {
            condition_is(h, "ScalingLimited", "True", "TooManyReplicas")
        })
        .await?;
    ensure!(h["status"]["desiredReplicas"] == 3, "{h}");
    ensure!(replicas(&c.json(&["get", "deployment", "web"])?) == 3, "maxReplicas exceeded");
    let described = c.kubectl(&["describe", "hpa", "web"])?;
    ensure!(described.contains("SuccessfulRescale") && described.contains("ScalingLimited"), "{described}");
    // Ours prints what the official kubectl prints, up to the events (whose ages move). The
    // status changes every sync, so the two are taken back to back, a few times if needed.
    let upto = |t: &str| t.split("\nEvents:").next().unwrap_or_default().to_string();
    let mut same = false;
    let (mut ours, mut theirs) = (String::new(), String::new());
    for _ in 0..5 {
        ours = run(&our_kubectl(), &c.api.url(), &["describe", "hpa", "web"], None)?.stdout;
        theirs = c.kubectl(&["describe", "hpa", "web"])?;
        if upto(&ours) == upto(&theirs) {
            same = true;
            break;
        }
    }
    ensure!(same, "describe hpa differs:\nofficial:\n{theirs}\nours:\n{ours}");
    ensure!(ours.contains("SuccessfulRescale"), "{ours}");

    // Load removed: back to one replica once the (shortened) stabilization window passed.
    c.kubectl(&["exec", &pod, "--", "rm", "-f", "/tmp/burn"])?;
    let t1 = Instant::now();
    c.wait_for(&["get", "deployment", "web"], 120, "scale-down after the load", |d| replicas(d) == 1).await?;
    println!("scale-down 3 → 1: {:.1}s after the load stopped (stabilization window 20s)", t1.elapsed().as_secs_f64());
    ensure!(c.events("SuccessfulRescale")?.iter().any(|m| m.ends_with("; reason: All metrics below target")));
    ensure!(!c.cm.log().contains("panicked"), "{}", c.cm.log());
    drop(c.kubelet);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_hpa_scales_and_bad_hpas_get_conditions_not_crashes() -> Result<()> {
    let Some(c) = cluster("hpa-mem")? else { return Ok(()) };
    // Bad input first, so the controller has to keep going past it.
    let path = c.api.data_dir.join("minmax.yaml");
    std::fs::write(
        &path,
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: minmax\nspec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: x}\n  minReplicas: 5\n  maxReplicas: 2\n",
    )?;
    let out = c.api.kubectl(&["apply", "-f", path.to_str().context("path")?])?;
    ensure!(
        !out.ok
            && out
                .stderr
                .contains("spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`"),
        "{out:?}"
    );
    c.apply(
        "ghost.yaml",
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: ghost\nspec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: ghost}\n  maxReplicas: 3\n",
    )?;
    c.apply(
        "nokind.yaml",
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: nokind\nspec:\n  scaleTargetRef: {apiVersion: example.com/v1, kind: Nothing, name: x}\n  maxReplicas: 3\n",
    )?;
    c.apply("noreq.yaml", &deployment("noreq", ""))?;
    c.kubectl(&["autoscale", "deployment", "noreq", "--cpu-percent=50", "--max=3"])?;

    // Memory: 48 MiB in a pod that requests 32 MiB, against a 50% target.
    c.apply("mem.yaml", &deployment("mem", "        resources:\n          requests:\n            memory: 32Mi\n"))?;
    c.apply(
        "mem-hpa.yaml",
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: mem\nspec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: mem}\n  minReplicas: 1\n  maxReplicas: 2\n  metrics:\n  - type: Resource\n    resource:\n      name: memory\n      target: {type: Utilization, averageUtilization: 50}\n",
    )?;
    c.kubectl(&["rollout", "status", "deployment/mem", "--timeout=120s"])?;
    c.wait_for(&["get", "hpa", "mem"], 90, "memory HPA reading", |h| {
        h.pointer("/status/currentMetrics/0/resource/current/averageUtilization").is_some()
    })
    .await?;
    let pod = c.first_pod("mem")?;
    c.kubectl(&["exec", &pod, "--", "sh", "-c", "head -c 50331648 /dev/zero > /dev/shm/fill"])?;
    let t0 = Instant::now();
    c.wait_for(&["get", "deployment", "mem"], 90, "memory scale-up", |d| replicas(d) == 2).await?;
    println!("memory scale-up 1 → 2: {:.1}s after filling", t0.elapsed().as_secs_f64());
    let rescales = c.events("SuccessfulRescale")?;
    ensure!(
        rescales
            .iter()
            .any(|m| m == "New size: 2; reason: memory resource utilization (percentage of request) above target"),
        "{rescales:?}"
    );

    // The bad ones: conditions and events, no scaling.
    let h = c
        .wait_for(&["get", "hpa", "noreq"], 60, "FailedGetResourceMetric", |h| {
            condition_is(h, "ScalingActive", "False", "FailedGetResourceMetric")
        })
        .await?;
    let msg = condition(&h, "ScalingActive").and_then(|c| c["message"].as_str()).unwrap_or_default();
    ensure!(msg.contains("missing request for cpu in container app of Pod noreq-"), "{msg}");
    ensure!(!c.events("FailedGetResourceMetric")?.is_empty());
    ensure!(replicas(&c.json(&["get", "deployment", "noreq"])?) == 1);
    for name in ["ghost", "nokind"] {
        c.wait_for(&["get", "hpa", name], 60, "FailedGetScale", |h| {
            condition_is(h, "AbleToScale", "False", "FailedGetScale")
        })
        .await?;
    }
    let scale_errors = c.events("FailedGetScale")?;
    ensure!(
        scale_errors.iter().any(|m| m.contains("\"ghost\" not found"))
            && scale_errors.iter().any(|m| m == "no matches for kind \"Nothing\" in group \"example.com\""),
        "{scale_errors:?}"
    );
    ensure!(!c.cm.log().contains("panicked"), "{}", c.cm.log());
    drop(c.kubelet);
    Ok(())
}
