//! The pod worker: one task per pod UID that reconciles the pod's desired state (its spec,
//! or its deletion) with what runs in Docker, then reports the pod's status.
//!
//! A sync lists the pod's containers, asks `podactions.rs` what to do and does it: the
//! decisions (which sandbox, which container to start, kill or leave, which back-off holds
//! what) are pure functions there; this module only carries them out. Order of a sync:
//! sandbox (pause container + network) → volumes → init containers one by one → app
//! containers (with restart policy, back-off, probe kills) → ephemeral containers →
//! garbage collection of old instances → status patch when it changed. Deletion: preStop
//! hooks, SIGTERM, SIGKILL after the grace period, removal, then the grace-period-0 delete
//! of the object.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, PodStatus, Secret,
};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tokio::sync::mpsc;

use crate::kubelet::Kubelet;
use crate::labels::{self, Kind};
use crate::podactions::{
    self, compute_gone_pod_actions, compute_pod_actions, BackOffs, ContainerAction, GoneActions, Now, Observed,
    PodActions, Retry, StartContainer,
};
use crate::podconfig::{self, ContainerContext, Lookups};
use crate::runtime::{ContainerRecord, State};
use crate::status::{self, ProbeView};
use crate::volumes;
use common::backoff;

/// Per-pod memory of a worker.
#[derive(Default)]
struct Worker {
    /// Container name → (reason, message) while it waits.
    waiting: HashMap<String, (String, String)>,
    /// Image → when to try pulling it again.
    image_backoff: HashMap<String, Retry>,
    /// Container name → when to try again after a failed create/start.
    start_backoff: HashMap<String, Retry>,
    /// Container id → its probe tasks.
    probes: HashMap<String, Vec<tokio::task::JoinHandle<()>>>,
    /// When to try again after a failed sandbox creation.
    sandbox_backoff: Option<Retry>,
    last_status: Option<PodStatus>,
    deleted_object: bool,
    started_at: Option<Instant>,
    /// The last `FailedMount` reported, so a waiting pod is not reported every sync.
    last_mount_error: Option<String>,
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
                    if let Some(dm) = k.devices.as_ref() {
                        dm.release_pod(&uid);
                    }
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
    let Some(pod) = k.pod(uid) else {
        return match compute_gone_pod_actions(k.synced(), &records) {
            GoneActions::WaitForPodList => Ok(Outcome::Again(Duration::from_secs(1))),
            GoneActions::Done => Ok(Outcome::Done),
            GoneActions::RemoveContainers { grace } => {
                tracing::info!(pod = %uid, "pod is gone from the API: removing its containers");
                kill_pod(k, uid, &records, None, grace, w).await;
                Ok(Outcome::Done)
            }
        };
    };
    run_pod(k, uid, pod, records, w).await
}

/// The final delete of a pod whose containers are all gone: with grace period 0, for this
/// UID only (a new pod of the same name is left alone).
async fn delete_object(k: &Kubelet, uid: &str, pod: &Pod, w: &mut Worker) -> Result<()> {
    if w.deleted_object {
        return Ok(());
    }
    let api: Api<Pod> = Api::namespaced(k.client.clone(), pod.metadata.namespace.as_deref().unwrap_or("default"));
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
    Ok(())
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
    k.net.publish_host_ports(uid, Vec::new()).await;
    k.net.detach(uid).await;
    volumes::remove_pod_dir(&k.root_dir, uid);
    k.tokens.forget_pod(uid);
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
        if let Some(b) = self.image_backoff.get(&image) {
            if Instant::now() < b.until {
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
                let prev = self.image_backoff.get(&image).map(|b| b.delay);
                let d = next_delay(prev);
                self.image_backoff.insert(image.clone(), Retry { until: Instant::now() + d, delay: d });
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
    /// The handler of the pod's RuntimeClass (Docker's `--runtime`), if it names one.
    runtime: Option<String>,
}

/// The handler of the pod's RuntimeClass (`spec.runtimeClassName`), if it names one: the
/// Docker runtime its sandbox and containers run with. A class that does not exist is an
/// error, as it is for Kubernetes' kubelet (the pod waits, with an event saying why).
async fn runtime_handler(k: &Kubelet, pod: &Pod) -> Result<Option<String>> {
    let Some(name) = pod.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref()) else { return Ok(None) };
    let api: Api<RuntimeClass> = Api::all(k.client.clone());
    match api.get_opt(name).await.with_context(|| format!("getting RuntimeClass {name:?}"))? {
        Some(rc) => Ok(Some(rc.handler)),
        None => Err(anyhow!("RuntimeClass {name:?} not found")),
    }
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
    let account = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into());
    for (audience, expiration_seconds) in crate::tokens::sources(pod) {
        let key = crate::tokens::Key {
            namespace: ns.clone(),
            service_account: account.clone(),
            pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
            audience: audience.clone(),
            expiration_seconds,
        };
        let token = k.tokens.get(&k.client, pod, &key).await?;
        l.tokens.insert((audience, expiration_seconds), token);
    }
    // The Services' environment variables (envvars.rs), from the kubelet's Service cache (as
    // upstream, pods wait for it to be filled once): the namespace's and `default`'s, which
    // `envvars::visible` narrows to what the pod sees.
    k.services.wait_until_ready().await.context("the Service cache")?;
    l.services = k
        .services
        .state()
        .iter()
        .filter(|s| matches!(s.metadata.namespace.as_deref(), Some(n) if n == ns || n == "default"))
        .map(|s| s.as_ref().clone())
        .collect();
    Ok(l)
}

/// The sources of the pod's claims; the inner error is why the pod must wait for them.
async fn claim_sources(
    k: &Kubelet,
    pod: &Pod,
) -> Result<std::result::Result<HashMap<String, volumes::ClaimSource>, String>> {
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let mut out = HashMap::new();
    for v in pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default() {
        let Some(c) = v.persistent_volume_claim else { continue };
        let pvc = Api::<PersistentVolumeClaim>::namespaced(k.client.clone(), &ns).get_opt(&c.claim_name).await?;
        let volume = pvc.as_ref().and_then(|p| p.spec.as_ref()).and_then(|s| s.volume_name.clone()).unwrap_or_default();
        let pv = if volume.is_empty() {
            None
        } else {
            Api::<PersistentVolume>::all(k.client.clone()).get_opt(&volume).await?
        };
        match volumes::claim_source(&ns, &c.claim_name, pvc.as_ref(), pv.as_ref()) {
            Ok(src) => out.insert(c.claim_name, src),
            Err(why) => return Ok(Err(why)),
        };
    }
    Ok(Ok(out))
}

/// Kill requests of failed liveness or startup probes for the pod's running app containers
/// (container id → message). They stay in the shared results until acted on.
fn probe_kills(k: &Kubelet, records: &[ContainerRecord]) -> HashMap<String, String> {
    let Ok(results) = k.probe_results.lock() else { return HashMap::new() };
    records
        .iter()
        .filter(|r| r.state == State::Running && r.kind == Kind::App)
        .filter_map(|r| Some((r.id.clone(), results.get(&r.id)?.kill.clone()?)))
        .collect()
}

/// Sync a pod the API knows: decide (`podactions.rs`), act, and after an act that changes
/// what runs (a kill, a new sandbox) list the containers again and decide anew, until the
/// sandbox runs; then the containers.
async fn run_pod(
    k: &Arc<Kubelet>,
    uid: &str,
    pod: Pod,
    mut records: Vec<ContainerRecord>,
    w: &mut Worker,
) -> Result<Outcome> {
    let mut kills = probe_kills(k, &records);
    let (sandbox, steps) = loop {
        let observed = Observed { records: &records, probe_kills: &kills };
        let backoffs = BackOffs { sandbox: w.sandbox_backoff, start: &w.start_backoff };
        match compute_pod_actions(&pod, &observed, Now::current(), &backoffs) {
            PodActions::KillPod { grace } => {
                kill_pod(k, uid, &records, Some(&pod), grace, w).await;
                delete_object(k, uid, &pod, w).await?;
                return Ok(Outcome::Again(Duration::from_secs(1)));
            }
            PodActions::StopTerminal { stop, grace } => {
                for id in &stop {
                    k.rt.stop(id, grace).await?;
                }
                let records = k.rt.list(Some(uid)).await?;
                report(k, &pod, &records, None, w).await?;
                return Ok(Outcome::Again(RESYNC));
            }
            PodActions::KillUnhealthy { kills: condemned, grace } => {
                for kill in condemned {
                    // Acted on now: the request is used up.
                    if let Ok(mut m) = k.probe_results.lock() {
                        if let Some(r) = m.get_mut(&kill.id) {
                            r.kill = None;
                        }
                    }
                    tracing::info!(pod = %pod.metadata.name.clone().unwrap_or_default(), container = %kill.name, "{}", kill.message);
                    k.events.warning(&pod, "Unhealthy", kill.message.clone());
                    k.events.normal(&pod, "Killing", format!("Stopping container {}", kill.name));
                    k.rt.stop(&kill.id, grace).await?;
                }
                kills.clear();
                records = k.rt.list(Some(uid)).await?;
            }
            PodActions::Finished => {
                report(k, &pod, &records, None, w).await?;
                return Ok(Outcome::Again(RESYNC));
            }
            PodActions::CreateSandbox { stop, remove, attempt, wait } => {
                for id in &stop {
                    k.rt.stop(id, Duration::from_secs(2)).await?;
                }
                for r in &remove {
                    k.rt.remove(&r.id).await?;
                }
                k.net.release_ips(&remove).await;
                if let Some(wait) = wait {
                    return Ok(Outcome::Again(wait));
                }
                let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
                if let Err(e) = create_sandbox(k, &pod, attempt, host_network).await {
                    tracing::warn!(pod = %pod.metadata.name.clone().unwrap_or_default(), error = %format!("{e:#}"), "FailedCreatePodSandBox");
                    k.events.warning(&pod, "FailedCreatePodSandBox", format!("Failed to create pod sandbox: {e:#}"));
                    let d = (w.sandbox_backoff.map(|b| b.delay * 2).unwrap_or(Duration::from_secs(1)))
                        .min(Duration::from_secs(30));
                    w.sandbox_backoff = Some(Retry { until: Instant::now() + d, delay: d });
                    let records = k.rt.list(Some(uid)).await?;
                    report(k, &pod, &records, None, w).await?;
                    return Ok(Outcome::Again(d));
                }
                w.sandbox_backoff = None;
                records = k.rt.list(Some(uid)).await?;
                if podactions::running_sandbox(&records).is_none() {
                    return Err(anyhow!("the pause container is not running"));
                }
            }
            PodActions::SyncContainers { sandbox, steps } => break (sandbox, steps),
        }
    };
    sync_containers(k, uid, &pod, &records, &sandbox, steps, w).await
}

/// The sandbox runs: prepare the volumes and the pod's DNS files, carry out the container
/// steps, then clean up (probes of stopped containers, old instances) and report.
async fn sync_containers(
    k: &Arc<Kubelet>,
    uid: &str,
    pod: &Pod,
    records: &[ContainerRecord],
    sandbox: &ContainerRecord,
    steps: Vec<ContainerAction>,
    w: &mut Worker,
) -> Result<Outcome> {
    let spec = pod.spec.clone().unwrap_or_default();
    let host_network = spec.host_network == Some(true);
    let pod_ip = if host_network { k.node_ip.clone() } else { sandbox.pod_ip().unwrap_or_default().to_string() };
    if let Ok(ip) = pod_ip.parse() {
        k.net.publish_host_ports(uid, crate::hostport::of_pod(pod, ip)).await;
    }

    // Volumes and referenced objects.
    let lookups = fetch_lookups(k, pod).await?;
    let sources = claim_sources(k, pod).await?;
    let root = k.root_dir.clone();
    let mounted = match sources {
        Ok(s) if s.is_empty() => Ok(HashMap::new()),
        Ok(s) => {
            let p = pod.clone();
            tokio::task::spawn_blocking(move || volumes::mount_claims(&root, &p, &s, volumes::NfsSupport::probe()))
                .await
                .unwrap_or_else(|e| Err(format!("mounting the pod's volumes: {e}")))
        }
        Err(why) => Err(why),
    };
    let claims = match mounted {
        Ok(c) => {
            w.last_mount_error = None;
            c
        }
        Err(why) => {
            // Kubernetes' kubelet waits for the volumes before any container: they stay
            // ContainerCreating, and the reason is an event.
            if w.last_mount_error.as_deref() != Some(why.as_str()) {
                tracing::info!(pod = pod.metadata.name.as_deref().unwrap_or(""), reason = %why, "volumes not ready");
                k.events.warning(pod, "FailedMount", why.clone());
                w.last_mount_error = Some(why);
            }
            for name in podactions::held_by_volumes(&spec, records) {
                w.waiting.insert(name, ("ContainerCreating".into(), String::new()));
            }
            report(k, pod, records, Some(&pod_ip), w).await?;
            return Ok(Outcome::Again(Duration::from_secs(3)));
        }
    };
    let volume_paths = match volumes::prepare(&k.root_dir, pod, &lookups, &claims, &pod_ip, &k.node_ip) {
        Ok(p) => p,
        Err(e) => {
            for name in podactions::held_by_volumes(&spec, records) {
                w.waiting.insert(name, ("CreateContainerConfigError".into(), e.0.clone()));
            }
            report(k, pod, records, Some(&pod_ip), w).await?;
            return Ok(Outcome::Again(Duration::from_secs(5)));
        }
    };
    // The pod's /etc/hosts and /etc/resolv.conf, mounted into each of its containers.
    let dns_binds = crate::dns::write_files(pod, &pod_ip, &k.dns, &volumes::pod_dir(&k.root_dir, uid))
        .context("writing the pod's /etc/hosts and /etc/resolv.conf")?;
    // The RuntimeClass is read only when a container is about to start.
    let starts = steps.iter().any(|s| matches!(s, ContainerAction::Start(_)));
    let runtime = if starts { runtime_handler(k, pod).await? } else { None };
    let cx = PodContext {
        runtime,
        sandbox_id: sandbox.id.clone(),
        pod_ip: pod_ip.clone(),
        lookups,
        volume_paths,
        host_network,
        dns_binds,
    };

    let mut next = RESYNC;
    for step in steps {
        match step {
            ContainerAction::KeepRunning { container, record } => {
                w.waiting.remove(&container.name);
                w.start_backoff.remove(&container.name);
                ensure_probes(k, uid, pod, &container, &record, &pod_ip, w);
            }
            ContainerAction::Forget { name } => {
                w.waiting.remove(&name);
            }
            ContainerAction::Remove { id } => k.rt.remove(&id).await?,
            ContainerAction::Start(start) => {
                if let Some(d) = start_container(k, pod, &start, &cx, w).await? {
                    next = next.min(d);
                }
            }
            ContainerAction::CrashLoopBackOff { name, message, retry_in } => {
                w.waiting.insert(name, ("CrashLoopBackOff".into(), message));
                next = next.min(retry_in);
            }
            ContainerAction::StartBackOff { retry_in } => next = next.min(retry_in),
            ContainerAction::WaitForTarget { name, message, retry_in } => {
                w.waiting.insert(name, ("ContainerCreating".into(), message));
                next = next.min(retry_in);
            }
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
    for id in podactions::old_instances(&records) {
        k.rt.remove(&id).await?;
    }

    report(k, pod, &records, Some(&pod_ip), w).await?;
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
    let recorder = crate::probes::Recorder {
        total: k.metrics.probe_total.clone(),
        seconds: k.metrics.probe_seconds.clone(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
    };
    let hs = crate::probes::start(k.rt.clone(), k.probe_results.clone(), r.id.clone(), c.clone(), ip, wake, recorder);
    w.probes.insert(r.id.clone(), hs);
}

/// Start a new instance of a container (the decision's back-offs are passed already);
/// returns when to look again if it has to wait (image pull, configuration, failed start).
async fn start_container(
    k: &Arc<Kubelet>,
    pod: &Pod,
    start: &StartContainer,
    cx: &PodContext,
    w: &mut Worker,
) -> Result<Option<Duration>> {
    let c = &start.container;
    let pr = podconfig::pod_ref(pod);
    let restart_count = start.previous.as_ref().map(|p| p.restart_count + 1).unwrap_or(0);
    if let Err((reason, msg)) = w.ensure_image(k, c).await {
        w.waiting.insert(c.name.clone(), (reason, msg));
        let until = w.image_backoff.get(c.image.as_deref().unwrap_or_default()).map(|b| b.until);
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
        kind: start.kind,
        restart_count,
        sandbox_id: &cx.sandbox_id,
        env,
        volume_paths: &cx.volume_paths,
        host_network: cx.host_network,
        pid_mode: start.pid_target.as_ref().map(|id| format!("container:{id}")),
        runtime: cx.runtime.clone(),
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
        let prev = w.start_backoff.get(&c.name).map(|b| b.delay);
        let d = next_delay(prev);
        w.start_backoff.insert(c.name.clone(), Retry { until: Instant::now() + d, delay: d });
        w.waiting.insert(c.name.clone(), (reason.to_string(), msg));
        Ok(Some(d))
    };
    if let Some(dm) = k.devices.as_ref() {
        let requests = crate::devicemanager::container_requests(c);
        if !requests.is_empty() {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let active = k.synced().then(|| k.active_pods());
            // An init container's devices go on to the containers after it (it is done).
            let reusable: Vec<String> = pod
                .spec
                .as_ref()
                .and_then(|s| s.init_containers.as_ref())
                .into_iter()
                .flatten()
                .map(|i| i.name.clone())
                .filter(|n| *n != c.name)
                .collect();
            match dm.allocate(&uid, &c.name, &requests, &reusable, active.as_ref()).await {
                Ok(d) => {
                    if d.new {
                        let held: Vec<String> =
                            d.held.iter().map(|(r, ids)| format!("{r} {}", ids.join(","))).collect();
                        k.events.normal(
                            pod,
                            "AllocatedDevices",
                            format!("Allocated {} to container {}", held.join("; "), c.name),
                        );
                    }
                    podconfig::add_devices(&mut body, &d);
                }
                Err(msg) => {
                    return fail(
                        w,
                        "UnexpectedAdmissionError",
                        format!("Allocate failed due to {msg}, which is unexpected"),
                    )
                }
            }
        }
    }
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
    let runtime = runtime_handler(k, pod).await?;
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
    if let Some(h) = body.host_config.as_mut() {
        h.runtime = runtime;
    }
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
        // A pod with the mesh's sidecar gets its traffic capture with its network.
        let empty = Default::default();
        let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
        let capture = match common::mesh::capture_for(annotations) {
            Ok(c) => Ok(c.map(|c| common::mesh::iptables_restore(&c))),
            Err(e) => Err(anyhow!("sidecar traffic capture: {e}")),
        };
        let attached = match capture {
            Ok(capture) => k.net.attach(&pr.uid, &id, pod_ip, &cidr, capture).await,
            Err(e) => Err(e),
        };
        if let Err(e) = attached {
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
