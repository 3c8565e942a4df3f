//! The reference Koupleless base: speaks the base side of the tunnels and hosts modules.
//! - [`host`]: module hosting (real child processes, or simulated states);
//! - [`agent`]: the MQTT side (heartbeats, health, module list, operations, baseline);
//! - [`arklet`]: the HTTP side (arklet-style API, heartbeats POSTed to the controller).

pub mod agent;
pub mod arklet;
pub mod host;
