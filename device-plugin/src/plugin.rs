//! A device plugin's life, whatever its devices: serve `DevicePlugin` on a socket in the
//! device-plugin directory, register it with the kubelet, stream the device list whenever it
//! changes, answer Allocate, and register again when the kubelet comes back (a kubelet
//! restart makes a new `kubelet.sock`; a kubelet that cleared the directory also removed our
//! socket, so then the server starts over on a new one).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::v1beta1::registration_client::RegistrationClient;
use crate::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use crate::{uds, HEALTHY, KUBELET_SOCKET, VERSION};

/// The devices of one extended resource.
pub trait Devices: Send + Sync + 'static {
    /// `vendor.com/name`.
    fn resource_name(&self) -> String;
    /// Every device with its current health (may block: it runs on a blocking thread).
    fn list(&self) -> Vec<Device>;
    /// Whether `id` is one of this plugin's devices (healthy or not; must not block).
    fn knows(&self, id: &str) -> bool;
    /// What a container needs to use `ids` (all known to this plugin).
    fn allocate(&self, ids: &[String]) -> ContainerAllocateResponse;
    /// How often `list` is asked again.
    fn poll_every(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// The devices a plugin would hand out first: those that must be included, then the other
/// available ones in order, `size` in all (fewer if there are not enough).
pub fn preferred(available: &[String], must_include: &[String], size: usize) -> Vec<String> {
    let mut out: Vec<String> = must_include.iter().take(size).cloned().collect();
    for id in available {
        if out.len() >= size {
            break;
        }
        if !out.contains(id) {
            out.push(id.clone());
        }
    }
    out
}

struct Server<D> {
    devices: Arc<D>,
    /// Becomes true when this server stops: its ListAndWatch streams end then.
    stop: tokio::sync::watch::Receiver<bool>,
    /// Told when the kubelet hangs up a ListAndWatch stream (it stopped or restarted).
    hangup: Arc<tokio::sync::Notify>,
}

async fn list<D: Devices>(devices: &Arc<D>) -> Vec<Device> {
    let d = devices.clone();
    tokio::task::spawn_blocking(move || d.list()).await.unwrap_or_default()
}

#[tonic::async_trait]
impl<D: Devices> DevicePlugin for Server<D> {
    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let devices = self.devices.clone();
        let mut stop = self.stop.clone();
        let hangup = self.hangup.clone();
        tokio::spawn(async move {
            let mut last: Option<Vec<Device>> = None;
            loop {
                let now = list(&devices).await;
                if last.as_ref() != Some(&now) {
                    let healthy = now.iter().filter(|d| d.health == HEALTHY).count();
                    tracing::info!(devices = now.len(), healthy, "sending the device list");
                    if tx.send(Ok(ListAndWatchResponse { devices: now.clone() })).await.is_err() {
                        hangup.notify_one();
                        return;
                    }
                    last = Some(now);
                }
                tokio::select! {
                    _ = tokio::time::sleep(devices.poll_every()) => {}
                    _ = tx.closed() => {
                        hangup.notify_one();
                        return;
                    }
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: preferred(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    c.allocation_size.max(0) as usize,
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(&self, req: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for c in req.into_inner().container_requests {
            if let Some(bad) = c.devices_ids.iter().find(|id| !self.devices.knows(id)) {
                return Err(Status::invalid_argument(format!("unknown device {bad:?}")));
            }
            tracing::info!(devices = ?c.devices_ids, "allocating");
            container_responses.push(self.devices.allocate(&c.devices_ids));
        }
        Ok(Response::new(AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// Register `socket` (a file name in `dir`) for `resource` with the kubelet in `dir`.
pub async fn register(dir: &Path, socket: &str, resource: &str) -> Result<()> {
    let channel = uds::connect(&dir.join(KUBELET_SOCKET)).await.context("connecting to the kubelet")?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: VERSION.into(),
            endpoint: socket.into(),
            resource_name: resource.into(),
            options: Some(DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }),
        })
        .await
        .map_err(|s| anyhow::anyhow!("the kubelet refused the registration: {}", s.message()))?;
    Ok(())
}

/// Which kubelet socket this is (device, inode and change time: a new socket may reuse the
/// old one's inode), `None` while there is none.
fn identity(path: &Path) -> Option<(u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Serve `devices` on `dir/socket` and keep them registered with the kubelet until
/// `shutdown` resolves; the socket file is removed on the way out.
pub async fn run<D: Devices>(
    devices: Arc<D>,
    dir: PathBuf,
    socket: String,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let resource = devices.resource_name();
    let path = dir.join(&socket);
    let kubelet = dir.join(KUBELET_SOCKET);
    tokio::pin!(shutdown);
    loop {
        let incoming = uds::listen(&path).await.with_context(|| format!("listening on {}", path.display()))?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let hangup = Arc::new(tokio::sync::Notify::new());
        let service =
            DevicePluginServer::new(Server { devices: devices.clone(), stop: stopped.clone(), hangup: hangup.clone() });
        let mut until = stopped;
        let server =
            tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(
                incoming,
                async move {
                    let _ = until.wait_for(|s| *s).await;
                },
            ));
        tracing::info!(socket = %path.display(), %resource, "serving the device plugin");
        let mut registered = None;
        let restart = loop {
            let now = identity(&kubelet);
            if now.is_some() && now != registered {
                match register(&dir, &socket, &resource).await {
                    Ok(()) => {
                        tracing::info!(kubelet = %kubelet.display(), "registered with the kubelet");
                        registered = now;
                    }
                    Err(e) => tracing::warn!(error = %format!("{e:#}"), "registration failed; retrying"),
                }
            }
            tokio::select! {
                _ = &mut shutdown => break false,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = hangup.notified() => {
                    // The kubelet went away: register again as soon as it answers.
                    tracing::info!("the kubelet hung up");
                    registered = None;
                }
            }
            if server.is_finished() || !path.exists() {
                tracing::warn!(socket = %path.display(), "the plugin's socket is gone: serving again");
                break true;
            }
        };
        // End the streams, let the server finish its answers, then make sure it is gone.
        let _ = stop.send(true);
        let mut server = server;
        if tokio::time::timeout(Duration::from_secs(2), &mut server).await.is_err() {
            server.abort();
        }
        if !restart {
            let _ = std::fs::remove_file(&path);
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferred_takes_the_required_devices_first() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(preferred(&ids(&["a", "b", "c"]), &ids(&["c"]), 2), ids(&["c", "a"]));
        assert_eq!(preferred(&ids(&["a", "b"]), &[], 3), ids(&["a", "b"]));
        assert_eq!(preferred(&ids(&["a"]), &[], 0), Vec::<String>::new());
    }
}
