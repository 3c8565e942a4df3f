//! pilot, the mesh's control plane (Istio's istiod for MiniK8s): it watches Services,
//! EndpointSlices, Pods and Istio's VirtualServices and DestinationRules through the API,
//! serves every sidecar its Envoy xDS v3 configuration over ADS, and injects sidecars into
//! pods with an admission webhook. `envoy/MESH-CONTRACT.md` is what it promises the
//! sidecars.
//!
//! Pure layers (no I/O, unit-tested):
//! - [`model`]: the Istio API subset as Rust types, and the Services they route to;
//! - [`validate`]: what the CRD schema cannot check, and the last valid version of each object;
//! - [`status`]: the status written on a VirtualService or DestinationRule;
//! - [`xds`]: the mesh to Envoy clusters, endpoints, listeners and routes;
//! - [`inject`]: the injection patch of a pod;
//! - [`crds`], [`webhook`]'s objects: the CRDs and the MutatingWebhookConfiguration.
//!
//! I/O shells:
//! - [`ads`]: the ADS gRPC server (versions, nonces, ACK/NACK, pushes);
//! - [`watch`]: the API watches, debounced into new snapshots, and config status;
//! - [`webhook`]: the HTTPS injection endpoint and its certificates;
//! - [`metrics`]: pilot's Prometheus metrics.

pub mod ads;
pub mod crds;
pub mod inject;
pub mod metrics;
pub mod model;
pub mod status;
pub mod validate;
pub mod watch;
pub mod webhook;
pub mod xds;
