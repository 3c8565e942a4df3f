//! The container runtime: Docker through `bollard`, seen as [`ContainerRecord`]s.
//!
//! This is the only module that talks to Docker: listing, creating, stopping and removing
//! containers, images, logs, stats, the event stream, exec and attach. The rest of the
//! kubelet asks [`Runtime`] and never holds the Docker client itself.
//!
//! Only containers labelled with this kubelet's node name are ever listed. Inspect results
//! are cached by (id, Docker's status line) so that a relist costs one list call plus an
//! inspect only for containers that changed.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerInspectResponse, ContainerStateStatusEnum};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, CreateImageOptions, EventsOptions, InspectContainerOptions,
    KillContainerOptions, ListContainersOptions, LogsOptions, RemoveContainerOptions, ResizeContainerTTYOptions,
    ResizeExecOptions, StatsOptions, StopContainerOptions,
};
use bollard::Docker;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::io::AsyncWrite;

use crate::labels::{self, Kind};

// Docker's own types that other modules handle as plain data: the description of a
// container to create (built by `podconfig.rs`) and a statistics sample (read by `stats.rs`).
pub use bollard::models::{
    ContainerCreateBody, ContainerStatsResponse as ContainerStats, DeviceMapping, DeviceRequest, HostConfig,
};

/// What the kubelet knows of one Docker container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerRecord {
    pub id: String,
    pub pod_uid: String,
    pub pod_namespace: String,
    pub pod_name: String,
    /// The pod's container name, or [`labels::SANDBOX_NAME`].
    pub name: String,
    pub kind: Kind,
    pub restart_count: i32,
    pub state: State,
    pub exit_code: i64,
    pub oom_killed: bool,
    pub error: String,
    /// RFC 3339; None when never started.
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Seconds since the epoch.
    pub created: i64,
    pub image: String,
    pub image_id: String,
    pub pid: i64,
    pub labels: HashMap<String, String>,
    /// Docker's name of the container (cAdvisor's `name` label).
    pub docker_name: String,
    /// The container's writable layer (overlay's upper directory), whose size is its
    /// filesystem usage.
    pub upper_dir: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    Created,
    Running,
    Exited,
    Unknown,
}

impl ContainerRecord {
    pub fn pod_ip(&self) -> Option<&str> {
        self.labels.get(labels::POD_IP).map(String::as_str).filter(|s| !s.is_empty())
    }
}

/// Docker's zero time means "never".
fn docker_time(t: Option<String>) -> Option<String> {
    t.filter(|s| !s.is_empty() && !s.starts_with("0001-"))
}

/// Turn an inspect answer into a record; None for containers without our labels.
pub fn record_from_inspect(c: &ContainerInspectResponse) -> Option<ContainerRecord> {
    let labels = c.config.as_ref()?.labels.clone().unwrap_or_default();
    let kind = Kind::parse(labels.get(labels::CONTAINER_KIND)?)?;
    let st = c.state.clone().unwrap_or_default();
    let state = match st.status {
        Some(ContainerStateStatusEnum::RUNNING) | Some(ContainerStateStatusEnum::PAUSED) => State::Running,
        Some(ContainerStateStatusEnum::RESTARTING) => State::Running,
        Some(ContainerStateStatusEnum::CREATED) => State::Created,
        Some(ContainerStateStatusEnum::EXITED) | Some(ContainerStateStatusEnum::DEAD) => State::Exited,
        _ => State::Unknown,
    };
    let created = c
        .created
        .as_ref()
        .and_then(|d| d.to_string().parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_second())
        .unwrap_or_default();
    Some(ContainerRecord {
        id: c.id.clone()?,
        pod_uid: labels.get(labels::POD_UID)?.clone(),
        pod_namespace: labels.get(labels::POD_NAMESPACE).cloned().unwrap_or_default(),
        pod_name: labels.get(labels::POD_NAME).cloned().unwrap_or_default(),
        name: labels.get(labels::CONTAINER_NAME)?.clone(),
        kind,
        restart_count: labels.get(labels::RESTART_COUNT).and_then(|s| s.parse().ok()).unwrap_or_default(),
        state,
        exit_code: st.exit_code.unwrap_or_default(),
        oom_killed: st.oom_killed.unwrap_or_default(),
        error: st.error.unwrap_or_default(),
        started_at: docker_time(st.started_at),
        finished_at: docker_time(st.finished_at),
        created,
        image: c.config.as_ref().and_then(|c| c.image.clone()).unwrap_or_default(),
        image_id: c.image.clone().unwrap_or_default(),
        pid: st.pid.unwrap_or_default(),
        labels,
        docker_name: c.name.as_deref().unwrap_or_default().trim_start_matches('/').to_string(),
        upper_dir: c.graph_driver.as_ref().and_then(|g| g.data.get("UpperDir").cloned()),
    })
}

/// Docker, restricted to one node's containers.
pub struct Runtime {
    docker: Docker,
    node: String,
    cache: Mutex<HashMap<String, (String, ContainerRecord)>>,
}

fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(e, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. })
}

/// A failed Docker call in Docker's own words: the message of an API error (what the
/// `docker` command would print), otherwise the client's description of what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DockerError(pub String);

impl From<bollard::errors::Error> for DockerError {
    fn from(e: bollard::errors::Error) -> DockerError {
        match e {
            bollard::errors::Error::DockerResponseServerError { message, .. } => DockerError(message),
            other => DockerError(other.to_string()),
        }
    }
}

/// What a command run in a container (or a container's attached stdio) writes. A terminal's
/// output counts as stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// The output side of an exec or attach session, until the process closes it.
pub type OutputStream = Pin<Box<dyn Stream<Item = Result<Output, DockerError>> + Send>>;
/// The input side of an exec or attach session (the process's stdin).
pub type InputSink = Pin<Box<dyn AsyncWrite + Send>>;

/// The stdio streams of an exec or attach, as Docker gives them.
pub struct Attached {
    pub output: OutputStream,
    pub input: InputSink,
}

/// A command to run in a container (`docker exec`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecConfig {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// A started exec: its id (for resizes and the exit code) and its streams.
pub struct Exec {
    pub id: String,
    pub streams: Attached,
}

/// What Docker says of an exec: whether its process still runs, and its exit code once known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecState {
    pub running: bool,
    pub exit_code: Option<i64>,
}

/// What `/containerLogs` asks of a container's log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Keep streaming what the container writes next.
    pub follow: bool,
    /// Prefix each line with its RFC 3339 time.
    pub timestamps: bool,
    /// Only the last lines (None: all of them).
    pub tail_lines: Option<i64>,
    /// Only lines written at or after this time, in seconds since the epoch (0: all).
    pub since: i32,
}

fn output_stream(s: impl Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send + 'static) -> OutputStream {
    Box::pin(s.filter_map(|item| {
        futures::future::ready(match item {
            Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => Some(Ok(Output::Stdout(message))),
            Ok(LogOutput::StdErr { message }) => Some(Ok(Output::Stderr(message))),
            // An echo of the input is nothing the client asked for.
            Ok(LogOutput::StdIn { .. }) => None,
            Err(e) => Some(Err(DockerError::from(e))),
        })
    }))
}

impl Runtime {
    pub async fn connect(node: &str) -> Result<Runtime> {
        let docker = Docker::connect_with_local_defaults().context("connecting to Docker")?;
        let docker = docker.negotiate_version().await.context("negotiating the Docker API version")?;
        Ok(Runtime { docker, node: node.to_string(), cache: Mutex::new(HashMap::new()) })
    }

    pub async fn version(&self) -> Result<String> {
        let v = self.docker.version().await.context("docker version")?;
        Ok(v.version.unwrap_or_default())
    }

    /// Every container of this node (running or not), optionally of one pod.
    pub async fn list(&self, pod_uid: Option<&str>) -> Result<Vec<ContainerRecord>> {
        let mut label = vec![format!("{}={}", labels::NODE, self.node)];
        if let Some(uid) = pod_uid {
            label.push(format!("{}={uid}", labels::POD_UID));
        }
        let opts = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_string(), label)])),
            ..Default::default()
        };
        let summaries = self.docker.list_containers(Some(opts)).await.context("listing containers")?;
        let mut out = Vec::with_capacity(summaries.len());
        for s in summaries {
            let Some(id) = s.id.clone() else { continue };
            // Docker's status line carries the uptime; the state alone says whether what
            // inspect told us can have changed (a container never restarts in place).
            let key = format!("{:?}", s.state);
            let cached =
                self.cache.lock().ok().and_then(|c| c.get(&id).filter(|(k, _)| *k == key).map(|(_, r)| r.clone()));
            let rec = match cached {
                Some(r) => r,
                None => match self.docker.inspect_container(&id, None::<InspectContainerOptions>).await {
                    Ok(c) => match record_from_inspect(&c) {
                        Some(r) => {
                            if let Ok(mut cache) = self.cache.lock() {
                                cache.insert(id.clone(), (key, r.clone()));
                            }
                            r
                        }
                        None => continue,
                    },
                    Err(e) if is_not_found(&e) => continue,
                    Err(e) => return Err(e).context("inspecting a container"),
                },
            };
            out.push(rec);
        }
        if pod_uid.is_none() {
            if let Ok(mut cache) = self.cache.lock() {
                let live: std::collections::HashSet<&str> = out.iter().map(|r| r.id.as_str()).collect();
                cache.retain(|id, _| live.contains(id.as_str()));
            }
        }
        Ok(out)
    }

    /// Create a container; returns its id. [`Runtime::start`] starts it.
    pub async fn create(&self, name: &str, body: ContainerCreateBody) -> Result<String, DockerError> {
        let opts = CreateContainerOptions { name: Some(name.to_string()), ..Default::default() };
        match self.docker.create_container(Some(opts.clone()), body.clone()).await {
            Ok(r) => Ok(r.id),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => {
                // A leftover of an earlier attempt with the same name: replace it.
                self.remove(name).await.ok();
                Ok(self.docker.create_container(Some(opts), body).await?.id)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Start a created container. A failed start leaves the container created (the caller
    /// removes it).
    pub async fn start(&self, id: &str) -> Result<(), DockerError> {
        Ok(self.docker.start_container(id, None).await?)
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(&self, id: &str, grace: Duration) -> Result<()> {
        let t = grace.as_secs().min(i32::MAX as u64) as i32;
        match self.docker.stop_container(id, Some(StopContainerOptions { t: Some(t), signal: None })).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 304 | 404, .. }) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("stopping container {id}")),
        }
    }

    pub async fn kill(&self, id: &str) -> Result<()> {
        match self.docker.kill_container(id, Some(KillContainerOptions { signal: "KILL".into() })).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404 | 409, .. }) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("killing container {id}")),
        }
    }

    pub async fn remove(&self, id: &str) -> Result<()> {
        let opts = RemoveContainerOptions { force: true, v: true, ..Default::default() };
        match self.docker.remove_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing container {id}")),
        }
    }

    pub async fn image_present(&self, image: &str) -> Result<Option<String>> {
        match self.docker.inspect_image(image).await {
            Ok(i) => Ok(i.id),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e).context("inspecting an image"),
        }
    }

    /// Pull an image, giving up after `timeout`.
    pub async fn pull(&self, image: &str, timeout: Duration) -> Result<()> {
        let (repo, tag) = split_image(image);
        let opts = CreateImageOptions { from_image: Some(repo), tag: Some(tag), ..Default::default() };
        let pull = async {
            let mut s = self.docker.create_image(Some(opts), None, None);
            while let Some(item) = s.next().await {
                let item = item.map_err(|e| anyhow!("{e}"))?;
                if let Some(err) = item.error_detail.and_then(|d| d.message) {
                    return Err(anyhow!(err));
                }
            }
            Ok(())
        };
        match tokio::time::timeout(timeout, pull).await {
            Ok(r) => r,
            Err(_) => Err(anyhow!("pull timed out after {}s", timeout.as_secs())),
        }
    }

    /// The host PID of a container's main process; None when it runs none (not started, or
    /// exited).
    pub async fn pid(&self, id: &str) -> Result<Option<i64>> {
        let info = self.docker.inspect_container(id, None::<InspectContainerOptions>).await?;
        Ok(info.state.and_then(|s| s.pid).filter(|p| *p > 0))
    }

    /// Whether the container was created `stdinOnce` (its stdin closes when the first
    /// attached client ends its input).
    pub async fn stdin_once(&self, id: &str) -> Result<bool, DockerError> {
        let c = self.docker.inspect_container(id, None::<InspectContainerOptions>).await?;
        Ok(c.config.and_then(|c| c.stdin_once).unwrap_or(false))
    }

    /// Image names and sizes for the node status.
    pub async fn images(&self) -> Result<Vec<(Vec<String>, i64)>> {
        let list = self.docker.list_images(None::<bollard::query_parameters::ListImagesOptions>).await?;
        Ok(list
            .into_iter()
            .filter(|i| !i.repo_tags.is_empty() && i.repo_tags.iter().all(|t| t != "<none>:<none>"))
            .map(|i| (i.repo_tags, i.size))
            .collect())
    }

    /// A container's log as a byte stream (stdout and stderr interleaved as written).
    pub fn logs(&self, id: &str, o: &LogOptions) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static {
        let opts = LogsOptions {
            follow: o.follow,
            stdout: true,
            stderr: true,
            timestamps: o.timestamps,
            tail: o.tail_lines.map(|n| n.to_string()).unwrap_or_else(|| "all".into()),
            since: o.since,
            ..Default::default()
        };
        self.docker.logs(id, Some(opts)).map(|item| item.map(|o| o.into_bytes()).map_err(std::io::Error::other))
    }

    /// One sample of a container's CPU and memory statistics; None when Docker has none.
    pub async fn stats(&self, id: &str) -> Option<ContainerStats> {
        let mut s = self.docker.stats(id, Some(StatsOptions { stream: false, one_shot: false }));
        s.next().await.and_then(Result::ok)
    }

    /// The actions (`create`, `start`, `die`, `destroy`, …) of Docker's events about this
    /// node's containers, as they happen. The stream ends (after an error) when Docker's does.
    pub fn container_events(&self) -> impl Stream<Item = Result<String, DockerError>> + Send + 'static {
        let filters = HashMap::from([
            ("type".to_string(), vec!["container".to_string()]),
            ("label".to_string(), vec![format!("{}={}", labels::NODE, self.node)]),
        ]);
        self.docker
            .events(Some(EventsOptions { filters: Some(filters), ..Default::default() }))
            .map(|ev| ev.map(|e| e.action.unwrap_or_default()).map_err(DockerError::from))
    }

    /// Start a command in a running container (`docker exec`), attached to the streams
    /// `config` asks for. Every exec of the kubelet goes through here: probes, lifecycle
    /// hooks ([`Runtime::run_command`]) and `kubectl exec`.
    pub async fn exec(&self, container_id: &str, config: &ExecConfig) -> Result<Exec, DockerError> {
        let create = CreateExecOptions::<String> {
            cmd: Some(config.command.clone()),
            attach_stdin: Some(config.stdin),
            attach_stdout: Some(config.stdout),
            attach_stderr: Some(config.stderr),
            tty: Some(config.tty),
            ..Default::default()
        };
        let id = self.docker.create_exec(container_id, create).await?.id;
        let start = StartExecOptions { detach: false, tty: config.tty, output_capacity: None };
        match self.docker.start_exec(&id, Some(start)).await? {
            StartExecResults::Attached { output, input } => {
                Ok(Exec { id, streams: Attached { output: output_stream(output), input } })
            }
            StartExecResults::Detached => Err(DockerError("the exec started detached".into())),
        }
    }

    /// Whether an exec's process still runs, and its exit code.
    pub async fn exec_state(&self, exec_id: &str) -> Result<ExecState, DockerError> {
        let i = self.docker.inspect_exec(exec_id).await?;
        Ok(ExecState { running: i.running == Some(true), exit_code: i.exit_code })
    }

    /// Run `command` in a container to its end, its output discarded; returns its exit code
    /// (None when Docker has not recorded one). What exec probes and exec hooks do.
    pub async fn run_command(&self, container_id: &str, command: Vec<String>) -> Result<Option<i64>> {
        let config = ExecConfig { command, stdout: true, stderr: true, ..Default::default() };
        let mut exec = self.exec(container_id, &config).await.context("creating the exec")?;
        while exec.streams.output.next().await.is_some() {}
        Ok(self.exec_state(&exec.id).await?.exit_code)
    }

    /// Resize the terminal of an exec started with `tty`.
    pub async fn resize_exec(&self, exec_id: &str, width: u16, height: u16) -> Result<(), DockerError> {
        Ok(self.docker.resize_exec(exec_id, ResizeExecOptions { h: height.into(), w: width.into() }).await?)
    }

    /// Attach to the stdio of a container's main process (`docker attach`).
    pub async fn attach(&self, id: &str, stdin: bool, stdout: bool, stderr: bool) -> Result<Attached, DockerError> {
        let options = AttachContainerOptions { stdin, stdout, stderr, stream: true, logs: false, ..Default::default() };
        let a = self.docker.attach_container(id, Some(options)).await?;
        Ok(Attached { output: output_stream(a.output), input: a.input })
    }

    /// Resize the terminal of a container created with `tty`.
    pub async fn resize_tty(&self, id: &str, width: u16, height: u16) -> Result<(), DockerError> {
        Ok(self
            .docker
            .resize_container_tty(id, ResizeContainerTTYOptions { h: height.into(), w: width.into() })
            .await?)
    }
}

/// `repo[:tag]` (a registry port is not a tag) → (repo, tag), tag defaulting to `latest`.
pub fn split_image(image: &str) -> (String, String) {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => (image[..i].to_string(), image[i + 1..].to_string()),
        _ => (image.to_string(), "latest".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names() {
        assert_eq!(split_image("busybox"), ("busybox".into(), "latest".into()));
        assert_eq!(split_image("busybox:1.36"), ("busybox".into(), "1.36".into()));
        assert_eq!(split_image("reg:5000/a/b"), ("reg:5000/a/b".into(), "latest".into()));
        assert_eq!(split_image("reg:5000/a/b:v1"), ("reg:5000/a/b".into(), "v1".into()));
    }
}
