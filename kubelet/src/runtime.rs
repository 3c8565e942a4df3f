//! The container runtime: Docker through `bollard`, seen as [`ContainerRecord`]s.
//!
//! Only containers labelled with this kubelet's node name are ever listed. Inspect results
//! are cached by (id, Docker's status line) so that a relist costs one list call plus an
//! inspect only for containers that changed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use bollard::models::{ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, InspectContainerOptions, KillContainerOptions, ListContainersOptions,
    RemoveContainerOptions, StopContainerOptions,
};
use bollard::Docker;
use futures::StreamExt;

use crate::labels::{self, Kind};

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
    })
}

/// Docker, restricted to one node's containers.
pub struct Runtime {
    pub docker: Docker,
    pub node: String,
    cache: Mutex<HashMap<String, (String, ContainerRecord)>>,
}

pub fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(e, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. })
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

    /// Create and start a container; returns its id. A failed start leaves the
    /// container created (the caller removes it).
    pub async fn create(&self, name: &str, body: ContainerCreateBody) -> Result<String, bollard::errors::Error> {
        let opts = CreateContainerOptions { name: Some(name.to_string()), ..Default::default() };
        match self.docker.create_container(Some(opts.clone()), body.clone()).await {
            Ok(r) => Ok(r.id),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => {
                // A leftover of an earlier attempt with the same name: replace it.
                self.remove(name).await.ok();
                Ok(self.docker.create_container(Some(opts), body).await?.id)
            }
            Err(e) => Err(e),
        }
    }

    pub async fn start(&self, id: &str) -> Result<(), bollard::errors::Error> {
        self.docker.start_container(id, None).await
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

    /// Image names and sizes for the node status.
    pub async fn images(&self) -> Result<Vec<(Vec<String>, i64)>> {
        let list = self.docker.list_images(None::<bollard::query_parameters::ListImagesOptions>).await?;
        Ok(list
            .into_iter()
            .filter(|i| !i.repo_tags.is_empty() && i.repo_tags.iter().all(|t| t != "<none>:<none>"))
            .map(|i| (i.repo_tags, i.size))
            .collect())
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
