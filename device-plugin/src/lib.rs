//! The kubelet's device plugin API, `deviceplugin/v1beta1`, and the pieces a plugin is made of.
//!
//! - [`v1beta1`] — the messages, clients and servers generated from `proto/api.proto` (the
//!   wire format is Kubernetes' own: a real kubelet takes our plugins, ours takes theirs).
//! - [`uds`] — gRPC over unix sockets: a client channel to a socket path, a listener that
//!   replaces a stale socket file.
//! - [`plugin`] — a plugin's life, for any [`plugin::Devices`]: serve `DevicePlugin` on its
//!   socket, register with the kubelet, stream the device list, register again when the
//!   kubelet restarts.
//! - [`sample`] — N fake devices backed by files (Kubernetes' sample device plugin's role):
//!   tests schedule, allocate, fail and free devices on any machine.
//! - [`nvidia`] — NVIDIA GPUs found with `nvidia-smi -L`, handed to containers as CDI names
//!   that the kubelet turns into Docker `DeviceRequest`s for the NVIDIA container toolkit.

pub mod nvidia;
pub mod plugin;
pub mod sample;
pub mod uds;

/// The generated v1beta1 API.
#[allow(clippy::all, missing_docs)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The API version plugins register with.
pub const VERSION: &str = "v1beta1";
/// The kubelet's registration socket inside the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Where kubelets and plugins meet unless told otherwise (Kubernetes' fixed path).
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
