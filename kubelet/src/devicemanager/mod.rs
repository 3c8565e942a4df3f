//! The device manager: the kubelet's half of the device plugin API.
//!
//! Plugins register on `<dir>/kubelet.sock` ([`registration`]); for each, the manager opens the
//! plugin's `ListAndWatch` stream and keeps its devices and their health ([`state`]). The
//! Node's capacity counts a resource's devices and its allocatable the healthy ones (none
//! while the plugin is gone). Before a container that asks for an extended resource starts,
//! [`DeviceManager::allocate`] picks free healthy devices (the plugin's preferred ones
//! first), asks the plugin what the container needs (`Allocate`) and returns it for the
//! container's create body; the choice and the answer are checkpointed in
//! `<dir>/kubelet_internal_checkpoint`, so a restarted container or kubelet gets the same
//! devices, and no device goes to two containers. Devices are freed when their pod ends.

pub mod registration;
pub mod state;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse, ContainerPreferredAllocationRequest,
    DevicePluginOptions, DeviceSpec, Mount, PreStartContainerRequest, PreferredAllocationRequest,
};
use tokio::sync::watch;
use tonic::transport::Channel;

use state::{Entry, State};

pub const CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// A registered plugin's connection.
#[derive(Clone)]
struct Endpoint {
    client: DevicePluginClient<Channel>,
    options: DevicePluginOptions,
    /// Which registration this is: a plugin that registers again replaces the old one.
    generation: u64,
}

/// What a container gets from its devices' plugins, merged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerDevices {
    pub envs: BTreeMap<String, String>,
    pub mounts: Vec<Mount>,
    pub devices: Vec<DeviceSpec>,
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names.
    pub cdi: Vec<String>,
    /// Resource → the device ids held (for events and logs).
    pub held: BTreeMap<String, Vec<String>>,
    /// Devices chosen by this call (not held from before).
    pub new: bool,
}

impl ContainerDevices {
    fn add(&mut self, resource: &str, ids: &[String], r: ContainerAllocateResponse) {
        self.envs.extend(r.envs);
        self.mounts.extend(r.mounts);
        self.devices.extend(r.devices);
        self.annotations.extend(r.annotations);
        self.cdi.extend(r.cdi_devices.into_iter().map(|c| c.name));
        self.held.insert(resource.to_string(), ids.to_vec());
    }
}

pub struct DeviceManager {
    dir: PathBuf,
    state: Mutex<State>,
    endpoints: Mutex<HashMap<String, Endpoint>>,
    next_generation: std::sync::atomic::AtomicU64,
    /// Bumped whenever the node's device counts may have changed.
    changed: watch::Sender<u64>,
    /// The checkpoint as last written: an unchanged state is not written again.
    written: Mutex<Vec<u8>>,
}

impl DeviceManager {
    /// Take `dir` (its `kubelet.sock`; an error if another kubelet serves it), load the
    /// checkpoint and serve the registration service.
    pub async fn start(dir: &Path) -> Result<Arc<DeviceManager>> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let state = match std::fs::read(dir.join(CHECKPOINT)) {
            Ok(bytes) => State::from_checkpoint(&bytes, std::time::Instant::now()).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the device checkpoint is unreadable; starting without allocations");
                State::default()
            }),
            Err(_) => State::default(),
        };
        let incoming = deviceplugin::uds::listen(&dir.join(deviceplugin::KUBELET_SOCKET))
            .await
            .with_context(|| format!("serving {}", dir.join(deviceplugin::KUBELET_SOCKET).display()))?;
        let dm = Arc::new(DeviceManager {
            dir: dir.to_path_buf(),
            state: Mutex::new(state),
            endpoints: Mutex::new(HashMap::new()),
            next_generation: Default::default(),
            changed: watch::channel(0).0,
            written: Mutex::new(Vec::new()),
        });
        registration::serve(dm.clone(), incoming);
        tracing::info!(dir = %dir.display(), "device manager listening for device plugins");
        Ok(dm)
    }

    /// name → (capacity, allocatable) of every resource a plugin registered.
    pub fn node_resources(&self) -> BTreeMap<String, (usize, usize)> {
        self.state.lock().map(|s| s.node_resources(std::time::Instant::now())).unwrap_or_default()
    }

    /// Changes whenever [`node_resources`](Self::node_resources) may have.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Change the state and write the checkpoint if that changed it.
    fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let Ok(mut st) = self.state.lock() else { return f(&mut State::default()) };
        let out = f(&mut st);
        let bytes = st.checkpoint();
        let Ok(mut written) = self.written.lock() else { return out };
        if *written != bytes {
            match common::write_private(&self.dir.join(CHECKPOINT), &bytes) {
                Ok(()) => *written = bytes,
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "writing the device checkpoint failed"),
            }
        }
        out
    }

    /// Free the devices of a pod that is gone.
    pub fn release_pod(&self, pod: &str) {
        if self.update(|s| s.release_pod(pod)) {
            tracing::info!(pod, "freed the pod's devices");
        }
    }

    fn endpoint(&self, resource: &str) -> Option<Endpoint> {
        self.endpoints.lock().ok().and_then(|e| e.get(resource).cloned())
    }

    /// The devices `container` of `pod` needs for `requests` (resource → count; resources no
    /// plugin registered are not devices and are skipped). Devices it holds already are
    /// handed out again as before; new ones are chosen (the devices of the pod's `reusable`
    /// containers, its init containers, count as free) and the plugin asked. `active`, when
    /// known, lists the pods still running: devices of every other pod are freed first.
    pub async fn allocate(
        &self,
        pod: &str,
        container: &str,
        requests: &[(String, usize)],
        reusable: &[String],
        active: Option<&HashSet<String>>,
    ) -> Result<ContainerDevices, String> {
        if let Some(active) = active {
            if self.update(|s| s.retain_pods(active)) {
                tracing::info!("freed the devices of pods that ended");
            }
        }
        let mut out = ContainerDevices::default();
        for (resource, need) in requests.iter().filter(|(_, n)| *n > 0) {
            let (held, free) = {
                let Ok(st) = self.state.lock() else { return Err("device manager state is poisoned".into()) };
                if !st.is_registered(resource) {
                    continue;
                }
                let held = st.held(pod, container, resource).filter(|e| !e.response.is_empty()).cloned();
                (held, st.free_for(resource, pod, reusable))
            };
            let endpoint = self.endpoint(resource);
            if let Some(e) = held {
                if let Some(ep) = endpoint.as_ref().filter(|ep| ep.options.pre_start_required) {
                    pre_start(ep, &e.device_ids).await?;
                }
                out.add(resource, &e.device_ids, e.response());
                continue;
            }
            let Some(ep) = endpoint else {
                return Err(state::unavailable(resource, *need, 0));
            };
            let preferred = if ep.options.get_preferred_allocation_available && free.len() > *need {
                preferred(&ep, &free, *need).await
            } else {
                vec![]
            };
            // Choose and reserve under the lock: two containers never get the same device.
            let ids = self.update(|s| {
                let ids = state::choose(resource, *need, &s.free_for(resource, pod, reusable), &preferred)?;
                s.entries.push(Entry {
                    pod_uid: pod.into(),
                    container: container.into(),
                    resource: resource.clone(),
                    device_ids: ids.clone(),
                    response: String::new(),
                });
                Ok::<_, String>(ids)
            })?;
            let answer = ep
                .client
                .clone()
                .allocate(AllocateRequest {
                    container_requests: vec![ContainerAllocateRequest { devices_ids: ids.clone() }],
                })
                .await
                .map_err(|s| s.message().to_string())
                .and_then(|r| {
                    r.into_inner().container_responses.into_iter().next().ok_or_else(|| "an empty answer".to_string())
                });
            let response = match answer {
                Ok(r) => r,
                Err(msg) => {
                    self.update(|s| {
                        s.entries.retain(|e| !(e.pod_uid == pod && e.container == container && &e.resource == resource))
                    });
                    return Err(format!("the {resource} device plugin refused to allocate {ids:?}: {msg}"));
                }
            };
            self.update(|s| {
                if let Some(e) = s
                    .entries
                    .iter_mut()
                    .find(|e| e.pod_uid == pod && e.container == container && &e.resource == resource)
                {
                    e.set_response(&response);
                }
            });
            if ep.options.pre_start_required {
                pre_start(&ep, &ids).await?;
            }
            tracing::info!(pod, container, %resource, devices = ?ids, "allocated devices");
            out.add(resource, &ids, response);
            out.new = true;
        }
        Ok(out)
    }

    /// A plugin registered: follow its device list until its stream ends.
    async fn follow(self: Arc<Self>, resource: String, endpoint: String, options: DevicePluginOptions) {
        let generation = self.next_generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = self.dir.join(&endpoint);
        let channel = match deviceplugin::uds::connect(&path).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(%resource, socket = %path.display(), error = %e, "cannot reach the device plugin");
                return;
            }
        };
        let mut client = DevicePluginClient::new(channel);
        if let Ok(mut e) = self.endpoints.lock() {
            e.insert(resource.clone(), Endpoint { client: client.clone(), options, generation });
        }
        match client.list_and_watch(deviceplugin::v1beta1::Empty {}).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(list)) => {
                            let devices: BTreeMap<String, bool> =
                                list.devices.into_iter().map(|d| (d.id, d.health == deviceplugin::HEALTHY)).collect();
                            let healthy = devices.values().filter(|h| **h).count();
                            tracing::info!(%resource, devices = devices.len(), healthy, "device list");
                            self.update(|s| s.set_devices(&resource, devices));
                            self.bump();
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(%resource, error = %e.message(), "the device plugin's stream failed");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(%resource, error = %e.message(), "ListAndWatch failed"),
        }
        let current = self
            .endpoints
            .lock()
            .map(|mut e| {
                let mine = e.get(&resource).is_some_and(|ep| ep.generation == generation);
                if mine {
                    e.remove(&resource);
                }
                mine
            })
            .unwrap_or(false);
        if current {
            tracing::warn!(%resource, "device plugin gone: its devices are not allocatable");
            self.update(|s| s.plugin_gone(&resource, std::time::Instant::now()));
            self.bump();
        }
    }
}

async fn preferred(ep: &Endpoint, free: &[String], need: usize) -> Vec<String> {
    let req = PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: free.to_vec(),
            must_include_device_i_ds: vec![],
            allocation_size: need as i32,
        }],
    };
    match ep.client.clone().get_preferred_allocation(req).await {
        Ok(r) => r.into_inner().container_responses.into_iter().next().map(|c| c.device_i_ds).unwrap_or_default(),
        Err(e) => {
            tracing::debug!(error = %e.message(), "GetPreferredAllocation failed; choosing alone");
            vec![]
        }
    }
}

async fn pre_start(ep: &Endpoint, ids: &[String]) -> Result<(), String> {
    ep.client
        .clone()
        .pre_start_container(PreStartContainerRequest { devices_ids: ids.to_vec() })
        .await
        .map(|_| ())
        .map_err(|s| format!("PreStartContainer failed: {}", s.message()))
}

/// The extended resources a container asks for: resource → whole units (limits, which
/// requests must equal).
pub fn container_requests(c: &k8s_openapi::api::core::v1::Container) -> Vec<(String, usize)> {
    let res = c.resources.as_ref();
    let limits = res.and_then(|r| r.limits.as_ref());
    let requests = res.and_then(|r| r.requests.as_ref());
    let mut out: BTreeMap<String, usize> = BTreeMap::new();
    for (name, q) in requests.into_iter().flatten().chain(limits.into_iter().flatten()) {
        if apimachinery::resources::is_extended(name) {
            out.insert(name.clone(), apimachinery::quantity::value(&q.0).max(0) as usize);
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests;
