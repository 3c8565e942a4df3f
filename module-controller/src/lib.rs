//! MiniK8s' `module-controller`: a virtual kubelet for Koupleless. Bases (long-running
//! processes hosting modules) are discovered through a [`tunnel::Tunnel`] (MQTT or HTTP)
//! and appear as virtual Nodes; module pods bound to them are installed into the base and
//! their module states reported back as container statuses.
//!
//! - [`protocol`]: the Koupleless wire protocol (topics, JSON);
//! - [`tunnel`]: the seed's `Tunnel` interface and its data model;
//! - [`mapping`]: pure mappings base ⇄ Node, modules ⇄ pod status;
//! - [`restart`]: modules restarted per `restartPolicy` with the kubelet's back-off (pure);
//! - [`mqtt`], [`http_tunnel`]: the two tunnels;
//! - [`controller`]: the node and pod providers (one actor), [`modulepod`] the compact
//!   module pods it keeps, [`kubeio`] its API calls, [`writer`] coalesced background writes;
//! - [`kubelet_api`]: the vnodes' kubelet API (module logs through the bases' arklets);
//! - [`base`]: the reference base program (real module hosting and `--simulate N`).

pub mod base;
pub mod controller;
pub mod http_tunnel;
pub mod kubeio;
pub mod kubelet_api;
pub mod mapping;
pub mod metrics;
pub mod modulepod;
pub mod mqtt;
pub mod protocol;
pub mod restart;
pub mod tunnel;
pub mod writer;
