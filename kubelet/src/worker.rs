//! The pod worker: one task per pod UID that reconciles the pod's desired state (its spec,
//! or its deletion) with what runs in Docker, then reports the pod's status.
//!
//! Order of a sync: sandbox (pause container + network) → volumes → init containers one by
//! one → app containers (with restart policy, back-off, probe kills) → garbage collection
//! of old instances → status patch when it changed. Deletion: preStop hooks, SIGTERM,
//! SIGKILL after the grace period, removal, then the grace-period-0 delete of the object.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, PodStatus, Secret,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tokio::sync::mpsc;

use crate::backoff;
use crate::kubelet::Kubelet;
use crate::labels::{self, Kind};
use crate::podconfig::{self, ContainerContext, Lookups};
use crate::runtime::{ContainerRecord, State};
use crate::status::{self, instances, ProbeView};
use crate::volumes;

/// Per-pod memory of a worker.
#[derive(Default)]
struct Worker {
    /// Container name → (reason, message) while it waits.
    waiting: HashMap<String, (String, String)>,
    /// Image → (retry not before, last delay).
    image_backoff: HashMap<String, (Instant, Duration)>,
    /// Container name → (retry not before, last delay) after a failed create/start.
    start_backoff: HashMap<String, (Instant, Duration)>,
    /// Container id → its probe tasks.
    probes: HashMap<String, Vec<tokio::task::JoinHandle<()>>>,
    /// Retry not before, last delay: after a failed sandbox creation.
    sandbox_backoff: Option<(Instant, Duration)>,
    last_status: Option<PodStatus>,
    deleted_object: bool,
    started_at: Option<Instant>,
}

enum Outcome {
    /// Sync again after this long at the latest.
    Again(Duration),
    /// Nothing left: the pod object and its containers are gone.
    Done,
}

const RESYNC: Duration = Duration::from_secs(10);

pub async fn run(k: Arc<Kubelet>, uid: String, mut rx: mpsc::UnboundedReceiver<()>) {
    let mut w = Worker { started_at: Some(Instant::now()), ..Default::default() };
    loop {
        while rx.try_recv().is_ok() {}
        let before = w.waiting.clone();
        let outcome = match sync(&k, &uid, &mut w).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(pod = %uid, error = %format!("{e:#}"), "pod sync failed");
                Outcome::Again(Duration::from_secs(2))
            }
        };
        k.metrics.pod_syncs.inc();
        if let Some(pod) = k.pod(&uid) {
            for (name, (reason, msg)) in &w.waiting {
                if before.get(name).map(|(r, _)| r) != Some(reason) {
                    let (ev, note) = match reason.as_str() {
                        "CrashLoopBackOff" => {
                            ("BackOff", format!("Back-off restarting failed container {name}: {msg}"))
                        }
                        "ImagePullBackOff" => ("BackOff", msg.clone()),
                        _ => ("Failed", format!("Error: {msg}")),
                    };
                    k.events.warning(&pod, ev, note);
                }
            }
        }
        match outcome {
            Outcome::Done => {
                if k.worker_done(&uid, &mut rx) {
                    for (_, hs) in w.probes.drain() {
                        hs.iter().for_each(|h| h.abort());
                    }
                    tracing::debug!(pod = %uid, "pod worker done");
                    return;
                }
            }
            Outcome::Again(d) => {
                let _ = tokio::time::timeout(d, rx.recv()).await;
            }
        }
    }
}

async fn sync(k: &Arc<Kubelet>, uid: &str, w: &mut Worker) -> Result<Outcome> {
    let records = k.rt.list(Some(uid)).await?;
    match k.pod(uid) {
        None => {
            if !k.synced() {
                return Ok(Outcome::Again(Duration::from_secs(1)));
            }
            if !records.is_empty() {
                tracing::info!(pod = %uid, "pod is gone from the API: removing its containers");
                let grace = records
                    .iter()
                    .find_map(|r| r.labels.get(labels::GRACE_PERIOD).and_then(|g| g.parse::<u64>().ok()))
                    .unwrap_or(30)
                    .min(2);
                kill_pod(k, uid, &records, None, Duration::from_secs(grace), w).await;
            }
            Ok(Outcome::Done)
        }
        Some(pod) if pod.metadata.deletion_timestamp.is_some() => {
            let grace = pod
                .metadata
                .deletion_grace_period_seconds
                .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
                .unwrap_or(30)
                .max(0) as u64;
            kill_pod(k, uid, &records, Some(&pod), Duration::from_secs(grace), w).await;
            if !w.deleted_object {
                let api: Api<Pod> =
                    Api::namespaced(k.client.clone(), pod.metadata.namespace.as_deref().unwrap_or("default"));
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions { uid: Some(uid.to_string()), resource_version: None }),
                    ..Default::default()
                };
                match api.delete(pod.metadata.name.as_deref().unwrap_or_default(), &dp).await {
                    Ok(_) => w.deleted_object = true,
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => w.deleted_object = true,
                    Err(e) => return Err(e).context("final delete of the pod"),
                }
                tracing::info!(pod = %pod.metadata.name.clone().unwrap_or_default(), "pod terminated and deleted");
            }
            Ok(Outcome::Again(Duration::from_secs(1)))
        }
        Some(pod) => run_pod(k, uid, pod, records, w).await,
    }
}

/// Stop and remove every container of the pod (preStop hooks first when the pod is known).
async fn kill_pod(
    k: &Arc<Kubelet>,
    uid: &str,
    records: &[ContainerRecord],
    pod: Option<&Pod>,
    grace: Duration,
    w: &mut Worker,
) {
    let spec = pod.and_then(|p| p.spec.clone()).unwrap_or_default();
    let running: Vec<&ContainerRecord> =
        records.iter().filter(|r| r.state == State::Running && r.kind != Kind::Sandbox).collect();
    let pod_ip = records
        .iter()
        .find(|r| r.kind == Kind::Sandbox && r.state == State::Running)
        .and_then(|r| r.pod_ip().map(str::to_string))
        .unwrap_or_else(|| "127.0.0.1".into());
    let stops = running.iter().map(|r| {
        let container = spec.containers.iter().find(|c| c.name == r.name).cloned();
        let hook = container.as_ref().and_then(|c| c.lifecycle.clone()).and_then(|l| l.pre_stop);
        let k = k.clone();
        let id = r.id.clone();
        let pod_ip = pod_ip.clone();
        async move {
            let started = Instant::now();
            if let (Some(h), Some(c)) = (hook, container) {
                if let Some(e) = h.exec {
                    let cmd = e.command.unwrap_or_default();
                    let _ = tokio::time::timeout(grace, k.rt.run_command(&id, cmd)).await;
                } else if let Some(get) = h.http_get {
                    let probe = k8s_openapi::api::core::v1::Probe { http_get: Some(get), ..Default::default() };
                    let _ = crate::probes::run_once(&k.rt, &id, &c, &probe, &pod_ip, grace).await;
                } else if let Some(sleep) = h.sleep {
                    tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64).min(grace)).await;
                }
            }
            let left = grace.saturating_sub(started.elapsed());
            if let Err(e) = k.rt.stop(&id, left).await {
                tracing::warn!(error = %format!("{e:#}"), "stop failed");
            }
        }
    });
    futures::future::join_all(stops).await;
    for r in records {
        if r.kind == Kind::Sandbox && r.state == State::Running {
            let _ = k.rt.kill(&r.id).await;
        }
    }
    for r in records {
        if let Err(e) = k.rt.remove(&r.id).await {
            tracing::warn!(error = %format!("{e:#}"), "remove failed");
        }
        if let Some(hs) = w.probes.remove(&r.id) {
            hs.iter().for_each(|h| h.abort());
        }
        if let Ok(mut m) = k.probe_results.lock() {
            m.remove(&r.id);
        }
    }
    k.net.release_ips(records).await;
    k.net.detach(uid).await;
    volumes::remove_pod_dir(&k.root_dir, uid);
}

fn default_pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        "IfNotPresent"
    } else if !last.contains(':') || last.ends_with(":latest") {
        "Always"
    } else {
        "IfNotPresent"
    }
}

fn next_delay(prev: Option<Duration>) -> Duration {
    prev.map(|d| (d * 2).min(backoff::MAX)).unwrap_or(backoff::INITIAL)
}

impl Worker {
    /// Make the container's image present; Err((reason, message)) when it cannot be.
    async fn ensure_image(&mut self, k: &Kubelet, c: &Container) -> Result<(), (String, String)> {
        let image = c.image.clone().unwrap_or_default();
        if image.is_empty() {
            return Err(("InvalidImageName".into(), "container has no image".into()));
        }
        let policy = c.image_pull_policy.clone().unwrap_or_else(|| default_pull_policy(&image).to_string());
        let present =
            k.rt.image_present(&image).await.map_err(|e| ("ErrImagePull".to_string(), format!("{e:#}")))?.is_some();
        if policy == "Never" {
            return if present {
                Ok(())
            } else {
                Err((
                    "ErrImageNeverPull".into(),
                    format!("Container image \"{image}\" is not present with pull policy of Never"),
                ))
            };
        }
        if present && policy != "Always" {
            return Ok(());
        }
        if let Some((until, _)) = self.image_backoff.get(&image) {
            if Instant::now() < *until {
                if present {
                    return Ok(());
                }
                return Err(("ImagePullBackOff".into(), format!("Back-off pulling image \"{image}\"")));
            }
        }
        match k.rt.pull(&image, Duration::from_secs(30)).await {
            Ok(()) => {
                self.image_backoff.remove(&image);
                Ok(())
            }
            Err(e) => {
                let prev = self.image_backoff.get(&image).map(|(_, d)| *d);
                let d = next_delay(prev);
                self.image_backoff.insert(image.clone(), (Instant::now() + d, d));
                if present {
                    // Always, but no registry is reachable: use the local copy.
                    tracing::debug!(image, error = %format!("{e:#}"), "pull failed; using the local image");
                    Ok(())
                } else {
                    Err(("ErrImagePull".into(), format!("Failed to pull image \"{image}\": {e:#}")))
                }
            }
        }
    }
}

/// Everything a container start needs that is the same for every container of the pod.
struct PodContext {
    sandbox_id: String,
    pod_ip: String,
    lookups: Lookups,
    volume_paths: HashMap<String, String>,
    host_network: bool,
    /// The pod's /etc/hosts and /etc/resolv.conf (`host:container` binds, see `dns.rs`).
    dns_binds: Vec<String>,
    /// Ephemeral container → the Docker id of its running target container.
    pid_targets: HashMap<String, String>,
}

async fn fetch_lookups(k: &Kubelet, pod: &Pod) -> Result<Lookups> {
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let (cms, secrets) = podconfig::referenced_objects(pod);
    let mut l = Lookups::default();
    let cm_api: Api<ConfigMap> = Api::namespaced(k.client.clone(), &ns);
    for n in cms {
        let v = cm_api.get_opt(&n).await.with_context(|| format!("getting configmap {ns}/{n}"))?;
        l.config_maps.insert(n, v);
    }
    let s_api: Api<Secret> = Api::namespaced(k.client.clone(), &ns);
    for n in secrets {
        let v = s_api.get_opt(&n).await.with_context(|| format!("getting secret {ns}/{n}"))?;
        l.secrets.insert(n, v);
    }
    Ok(l)
}

/// Host paths of the pod's bound claims (the PV's hostPath or local path).
async fn claim_paths(k: &Kubelet, pod: &Pod) -> Result<volumes::ClaimPaths> {
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let mut out = HashMap::new();
    for v in pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default() {
        let Some(c) = v.persistent_volume_claim else { continue };
        let pvc = Api::<PersistentVolumeClaim>::namespaced(k.client.clone(), &ns).get_opt(&c.claim_name).await?;
        let Some(pv_name) = pvc.and_then(|p| p.spec).and_then(|s| s.volume_name) else { continue };
        let Some(pv) = Api::<PersistentVolume>::all(k.client.clone()).get_opt(&pv_name).await? else { continue };
        let spec = pv.spec.unwrap_or_default();
        if let Some(p) = spec.host_path.map(|h| h.path).or_else(|| spec.local.map(|l| l.path)) {
            out.insert(c.claim_name, p);
        }
    }
    Ok(out)
}

async fn run_pod(
    k: &Arc<Kubelet>,
    uid: &str,
    pod: Pod,
    mut records: Vec<ContainerRecord>,
    w: &mut Worker,
) -> Result<Outcome> {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = spec.restart_policy.clone().unwrap_or_else(|| "Always".into());
    let host_network = spec.host_network == Some(true);
    let old_phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let mut next = RESYNC;

    // A terminal pod keeps nothing running.
    if old_phase == "Succeeded" || old_phase == "Failed" {
        for r in records.iter().filter(|r| r.state == State::Running) {
            k.rt.stop(&r.id, Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).max(0) as u64))
                .await?;
        }
        let records = k.rt.list(Some(uid)).await?;
        report(k, &pod, &records, None, w).await?;
        return Ok(Outcome::Again(RESYNC));
    }

    // Containers whose liveness or startup probe failed.
    let mut changed = false;
    for r in records.iter().filter(|r| r.state == State::Running && r.kind == Kind::App) {
        let kill = k.probe_results.lock().ok().and_then(|mut m| m.get_mut(&r.id).and_then(|x| x.kill.take()));
        if let Some(msg) = kill {
            tracing::info!(pod = %pod.metadata.name.clone().unwrap_or_default(), container = %r.name, "{msg}");
            let grace = spec.termination_grace_period_seconds.unwrap_or(30).max(0) as u64;
            k.events.warning(&pod, "Unhealthy", msg.clone());
            k.events.normal(&pod, "Killing", format!("Stopping container {}", r.name));
            k.rt.stop(&r.id, Duration::from_secs(grace)).await?;
            changed = true;
        }
    }
    if changed {
        records = k.rt.list(Some(uid)).await?;
    }

    // The sandbox.
    let sandbox = records
        .iter()
        .filter(|r| r.kind == Kind::Sandbox && r.state == State::Running)
        .max_by_key(|r| r.created)
        .cloned();
    let sandbox = match sandbox {
        Some(s) => s,
        None => {
            let all_done = !spec.containers.is_empty()
                && spec
                    .containers
                    .iter()
                    .all(|c| matches!(instances(&records, &c.name, Kind::App).0, Some(r) if r.state == State::Exited))
                && policy == "Never";
            if all_done {
                report(k, &pod, &records, None, w).await?;
                return Ok(Outcome::Again(RESYNC));
            }
            for r in records.iter().filter(|r| r.state == State::Running) {
                k.rt.stop(&r.id, Duration::from_secs(2)).await?;
            }
            for r in records.iter().filter(|r| r.kind == Kind::Sandbox) {
                k.rt.remove(&r.id).await?;
            }
            k.net.release_ips(&records).await;
            if let Some((until, _)) = w.sandbox_backoff {
                let now = Instant::now();
                if now < until {
                    return Ok(Outcome::Again(until - now));
                }
            }
            let attempt =
                records.iter().filter(|r| r.kind == Kind::Sandbox).map(|r| r.restart_count + 1).max().unwrap_or(0);
            if let Err(e) = create_sandbox(k, &pod, attempt, host_network).await {
                tracing::warn!(pod = %pod.metadata.name.clone().unwrap_or_default(), error = %format!("{e:#}"), "FailedCreatePodSandBox");
                k.events.warning(&pod, "FailedCreatePodSandBox", format!("Failed to create pod sandbox: {e:#}"));
                let d = (w.sandbox_backoff.map(|(_, d)| d * 2).unwrap_or(Duration::from_secs(1)))
                    .min(Duration::from_secs(30));
                w.sandbox_backoff = Some((Instant::now() + d, d));
                let records = k.rt.list(Some(uid)).await?;
                report(k, &pod, &records, None, w).await?;
                return Ok(Outcome::Again(d));
            }
            w.sandbox_backoff = None;
            records = k.rt.list(Some(uid)).await?;
            records
                .iter()
                .filter(|r| r.kind == Kind::Sandbox && r.state == State::Running)
                .max_by_key(|r| r.created)
                .cloned()
                .ok_or_else(|| anyhow!("the pause container is not running"))?
        }
    };
    let pod_ip = if host_network { k.node_ip.clone() } else { sandbox.pod_ip().unwrap_or_default().to_string() };

    // Volumes and referenced objects.
    let lookups = fetch_lookups(k, &pod).await?;
    let claims = claim_paths(k, &pod).await?;
    let volume_paths = match volumes::prepare(&k.root_dir, &pod, &lookups, &claims, &pod_ip, &k.node_ip) {
        Ok(p) => p,
        Err(e) => {
            for c in spec.init_containers.iter().flatten().chain(spec.containers.iter()) {
                let running = matches!(instances(&records, &c.name, Kind::App).0, Some(r) if r.state == State::Running);
                if !running {
                    w.waiting.insert(c.name.clone(), ("CreateContainerConfigError".into(), e.0.clone()));
                }
            }
            report(k, &pod, &records, Some(&pod_ip), w).await?;
            return Ok(Outcome::Again(Duration::from_secs(5)));
        }
    };
    // The pod's /etc/hosts and /etc/resolv.conf, mounted into each of its containers.
    let dns_binds = crate::dns::write_files(&pod, &pod_ip, &k.dns, &volumes::pod_dir(&k.root_dir, uid))
        .context("writing the pod's /etc/hosts and /etc/resolv.conf")?;
    let mut cx = PodContext {
        sandbox_id: sandbox.id.clone(),
        pod_ip: pod_ip.clone(),
        lookups,
        volume_paths,
        host_network,
        dns_binds,
        pid_targets: HashMap::new(),
    };

    // Init containers, one at a time, unless the app containers already ran.
    let apps_started = spec.containers.iter().any(|c| instances(&records, &c.name, Kind::App).0.is_some());
    let mut init_pending = false;
    if !apps_started {
        for c in spec.init_containers.iter().flatten() {
            let (latest, _) = instances(&records, &c.name, Kind::Init);
            match latest {
                Some(r) if r.state == State::Exited && r.exit_code == 0 => {
                    w.waiting.remove(&c.name);
                    continue;
                }
                Some(r) if r.state == State::Running => {}
                Some(r) if r.state == State::Exited => {
                    if policy != "Never" {
                        if let Some(d) = start_container(k, &pod, c, Kind::Init, Some(r), &cx, w).await? {
                            next = next.min(d);
                        }
                    }
                }
                Some(r) => {
                    let r = r.clone();
                    k.rt.remove(&r.id).await?;
                    if let Some(d) = start_container(k, &pod, c, Kind::Init, None, &cx, w).await? {
                        next = next.min(d);
                    }
                }
                None => {
                    if let Some(d) = start_container(k, &pod, c, Kind::Init, None, &cx, w).await? {
                        next = next.min(d);
                    }
                }
            }
            init_pending = true;
            break;
        }
    }

    if !init_pending {
        for c in &spec.containers {
            let (latest, _) = instances(&records, &c.name, Kind::App);
            let latest = latest.cloned();
            match latest {
                Some(r) if r.state == State::Running => {
                    w.waiting.remove(&c.name);
                    w.start_backoff.remove(&c.name);
                    ensure_probes(k, uid, &pod, c, &r, &pod_ip, w);
                }
                Some(r) if r.state == State::Exited => {
                    let restart = policy == "Always" || (policy == "OnFailure" && r.exit_code != 0);
                    if restart {
                        if let Some(d) = start_container(k, &pod, c, Kind::App, Some(&r), &cx, w).await? {
                            next = next.min(d);
                        }
                    } else {
                        w.waiting.remove(&c.name);
                    }
                }
                Some(r) => {
                    k.rt.remove(&r.id).await?;
                    if let Some(d) = start_container(k, &pod, c, Kind::App, None, &cx, w).await? {
                        next = next.min(d);
                    }
                }
                None => {
                    if let Some(d) = start_container(k, &pod, c, Kind::App, None, &cx, w).await? {
                        next = next.min(d);
                    }
                }
            }
        }
    }

    // Ephemeral containers (`kubectl debug`): each started once, even before the pod is
    // initialized, and never restarted. One that targets a container joins its process
    // namespace, so it waits for that container to run.
    for e in spec.ephemeral_containers.iter().flatten() {
        if instances(&records, &e.name, Kind::Ephemeral).0.is_some() {
            w.waiting.remove(&e.name);
            continue;
        }
        if let Some(target) = e.target_container_name.as_deref().filter(|t| !t.is_empty()) {
            match crate::status::named(&records, target).0.filter(|r| r.state == State::Running) {
                Some(r) => {
                    cx.pid_targets.insert(e.name.clone(), r.id.clone());
                }
                None => {
                    let msg = format!("waiting for the target container {target:?} to run");
                    w.waiting.insert(e.name.clone(), ("ContainerCreating".into(), msg));
                    next = next.min(Duration::from_secs(1));
                    continue;
                }
            }
        }
        let c = podconfig::ephemeral_as_container(e);
        if let Some(d) = start_container(k, &pod, &c, Kind::Ephemeral, None, &cx, w).await? {
            next = next.min(d);
        }
    }

    // Probe tasks of containers that are no longer running.
    let records = k.rt.list(Some(uid)).await?;
    let running: std::collections::HashSet<&str> =
        records.iter().filter(|r| r.state == State::Running).map(|r| r.id.as_str()).collect();
    let stale: Vec<String> = w.probes.keys().filter(|id| !running.contains(id.as_str())).cloned().collect();
    for id in stale {
        if let Some(hs) = w.probes.remove(&id) {
            hs.iter().for_each(|h| h.abort());
        }
        if let Ok(mut m) = k.probe_results.lock() {
            m.remove(&id);
        }
    }

    // Keep the newest two instances of each container (the current and the previous one).
    let mut by_name: HashMap<(String, Kind), Vec<&ContainerRecord>> = HashMap::new();
    for r in records.iter().filter(|r| r.state != State::Running && r.kind != Kind::Sandbox) {
        by_name.entry((r.name.clone(), r.kind)).or_default().push(r);
    }
    for (_, mut v) in by_name {
        v.sort_by_key(|r| std::cmp::Reverse((r.restart_count, r.created)));
        for r in v.iter().skip(2) {
            k.rt.remove(&r.id).await?;
        }
    }

    report(k, &pod, &records, Some(&pod_ip), w).await?;
    Ok(Outcome::Again(next))
}

/// What the pod's reported status already says about a running container (so that a
/// restarted kubelet does not flip a ready container to unready until its next probe).
pub fn reported_probe_view(pod: &Pod, container_id: &str) -> ProbeView {
    let id = format!("docker://{container_id}");
    let st = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.container_id.as_deref() == Some(id.as_str())));
    ProbeView {
        ready: st.filter(|c| c.ready).map(|_| true),
        started: st.filter(|c| c.started == Some(true)).map(|_| true),
    }
}

fn ensure_probes(
    k: &Arc<Kubelet>,
    uid: &str,
    pod: &Pod,
    c: &Container,
    r: &ContainerRecord,
    pod_ip: &str,
    w: &mut Worker,
) {
    if w.probes.contains_key(&r.id) {
        return;
    }
    let seed = reported_probe_view(pod, &r.id);
    if seed != ProbeView::default() {
        if let Ok(mut m) = k.probe_results.lock() {
            m.entry(r.id.clone()).or_default().view = seed;
        }
    }
    if c.liveness_probe.is_none() && c.readiness_probe.is_none() && c.startup_probe.is_none() {
        w.probes.insert(r.id.clone(), vec![]);
        return;
    }
    let kk = k.clone();
    let uid = uid.to_string();
    let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || kk.notify(&uid));
    let ip = if pod_ip.is_empty() { "127.0.0.1".to_string() } else { pod_ip.to_string() };
    let hs = crate::probes::start(k.rt.clone(), k.probe_results.clone(), r.id.clone(), c.clone(), ip, wake);
    w.probes.insert(r.id.clone(), hs);
}

fn now_secs() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

fn secs(t: &Option<String>) -> f64 {
    t.as_ref()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_millisecond() as f64 / 1000.0)
        .unwrap_or_default()
}

/// Start (a new instance of) a container unless a back-off holds it; returns when to look
/// again if it waits.
async fn start_container(
    k: &Arc<Kubelet>,
    pod: &Pod,
    c: &Container,
    kind: Kind,
    previous: Option<&ContainerRecord>,
    cx: &PodContext,
    w: &mut Worker,
) -> Result<Option<Duration>> {
    let pr = podconfig::pod_ref(pod);
    let restart_count = previous.map(|p| p.restart_count + 1).unwrap_or(0);
    if let Some(p) = previous {
        if let Some(left) = backoff::remaining(p.restart_count, secs(&p.started_at), secs(&p.finished_at), now_secs()) {
            let d = backoff::delay(p.restart_count, Duration::ZERO).as_secs();
            let msg = format!(
                "back-off {d}s restarting failed container={} pod={}_{}({})",
                c.name, pr.name, pr.namespace, pr.uid
            );
            w.waiting.insert(c.name.clone(), ("CrashLoopBackOff".into(), msg));
            return Ok(Some(left));
        }
    }
    if let Some((until, _)) = w.start_backoff.get(&c.name) {
        let now = Instant::now();
        if now < *until {
            return Ok(Some(*until - now));
        }
    }
    if let Err((reason, msg)) = w.ensure_image(k, c).await {
        w.waiting.insert(c.name.clone(), (reason, msg));
        let until = w.image_backoff.get(c.image.as_deref().unwrap_or_default()).map(|(u, _)| *u);
        return Ok(Some(
            until
                .map(|u| u.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(10))
                .max(Duration::from_millis(200)),
        ));
    }
    let config_err = |w: &mut Worker, msg: String| {
        w.waiting.insert(c.name.clone(), ("CreateContainerConfigError".into(), msg));
        Ok(Some(Duration::from_secs(5)))
    };
    let env = match podconfig::environment(pod, c, &cx.pod_ip, &k.node_ip, &cx.lookups) {
        Ok(e) => e,
        Err(e) => return config_err(w, e.0),
    };
    let ccx = ContainerContext {
        node: &k.node,
        kind,
        restart_count,
        sandbox_id: &cx.sandbox_id,
        env,
        volume_paths: &cx.volume_paths,
        host_network: cx.host_network,
        pid_mode: cx.pid_targets.get(&c.name).map(|id| format!("container:{id}")),
    };
    let mut body = match podconfig::container_body(pod, c, &ccx) {
        Ok(b) => b,
        Err(e) => return config_err(w, e.0),
    };
    if let Some(binds) = body.host_config.as_mut().map(|h| h.binds.get_or_insert_with(Vec::new)) {
        binds.extend(cx.dns_binds.iter().cloned());
    }
    let name = labels::docker_name(&pr, &c.name, restart_count);
    let fail = |w: &mut Worker, reason: &str, msg: String| {
        let prev = w.start_backoff.get(&c.name).map(|(_, d)| *d);
        let d = next_delay(prev);
        w.start_backoff.insert(c.name.clone(), (Instant::now() + d, d));
        w.waiting.insert(c.name.clone(), (reason.to_string(), msg));
        Ok(Some(d))
    };
    let id = match k.rt.create(&name, body).await {
        Ok(id) => id,
        Err(e) => return fail(w, "CreateContainerError", e.to_string()),
    };
    if let Err(e) = k.rt.start(&id).await {
        let _ = k.rt.remove(&id).await;
        return fail(w, "RunContainerError", e.to_string());
    }
    w.waiting.remove(&c.name);
    w.start_backoff.remove(&c.name);
    k.metrics.container_starts.inc();
    k.events.normal(pod, "Started", format!("Started container {}", c.name));
    tracing::info!(pod = %format!("{}/{}", pr.namespace, pr.name), container = %c.name, restart_count, "started container");
    Ok(None)
}

async fn create_sandbox(k: &Arc<Kubelet>, pod: &Pod, attempt: i32, host_network: bool) -> Result<()> {
    let pr = podconfig::pod_ref(pod);
    if k.rt.image_present(&k.pause_image).await?.is_none() {
        return Err(anyhow!("pause image {} is not present (build it with scripts/images)", k.pause_image));
    }
    // The pod's address: the node's own on the host network, otherwise one reserved from the
    // podCIDR (given back if the sandbox does not come up).
    let (ip, reserved) = if host_network {
        (k.node_ip.clone(), None)
    } else {
        let (ip, cidr) = k.net.allocate_ip().await?;
        (ip.to_string(), Some((ip, cidr)))
    };
    let mut body = podconfig::sandbox_body(pod, &k.node, &k.pause_image, &ip, host_network);
    if let Some(l) = body.labels.as_mut() {
        l.insert(labels::RESTART_COUNT.into(), attempt.to_string());
    }
    let name = labels::docker_name(&pr, labels::SANDBOX_NAME, attempt);
    let id = match k.rt.create(&name, body).await {
        Ok(id) => id,
        Err(e) => {
            if let Some((ip, _)) = reserved {
                k.net.release_ip(ip).await;
            }
            return Err(anyhow!(e));
        }
    };
    if let Err(e) = k.rt.start(&id).await {
        let _ = k.rt.remove(&id).await;
        if let Some((ip, _)) = reserved {
            k.net.release_ip(ip).await;
        }
        return Err(anyhow!("starting the pause container: {e}"));
    }
    if let Some((pod_ip, cidr)) = reserved {
        if let Err(e) = k.net.attach(&pr.uid, &id, pod_ip, &cidr).await {
            let _ = k.rt.remove(&id).await;
            k.net.release_ip(pod_ip).await;
            return Err(e.context("setting up the pod network"));
        }
    }
    tracing::info!(pod = %format!("{}/{}", pr.namespace, pr.name), ip, "sandbox ready");
    Ok(())
}

/// Compute the status and patch it when it changed.
async fn report(
    k: &Arc<Kubelet>,
    pod: &Pod,
    records: &[ContainerRecord],
    pod_ip: Option<&str>,
    w: &mut Worker,
) -> Result<()> {
    let probes: HashMap<String, ProbeView> =
        k.probe_results.lock().map(|m| m.iter().map(|(id, r)| (id.clone(), r.view)).collect()).unwrap_or_default();
    let pod_ip = pod_ip.filter(|s| !s.is_empty());
    let new = status::compute(&status::Input {
        pod,
        records,
        waiting: &w.waiting,
        probes: &probes,
        pod_ip,
        host_ip: &k.node_ip,
        now: Time(jiff::Timestamp::now()),
    });
    let current = pod.status.as_ref();
    if !status::changed(current, &new) {
        return Ok(());
    }
    if w.last_status.as_ref().is_some_and(|s| !status::changed(Some(s), &new)) && current.is_some() {
        // Already sent; the watch has not caught up yet.
        return Ok(());
    }
    let api: Api<Pod> = Api::namespaced(k.client.clone(), pod.metadata.namespace.as_deref().unwrap_or("default"));
    let body = serde_json::json!({ "status": new });
    api.patch_status(pod.metadata.name.as_deref().unwrap_or_default(), &PatchParams::default(), &Patch::Merge(&body))
        .await
        .context("patching pod status")?;
    if new.phase.as_deref() == Some("Running")
        && new.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
        && w.started_at.is_some()
    {
        if let Some(t) = w.started_at.take() {
            k.metrics.pod_start_seconds.observe(t.elapsed().as_secs_f64());
        }
    }
    w.last_status = Some(new);
    Ok(())
}
