//! MiniK8s' kube-scheduler: a filter-and-score scheduler over informer caches, with a
//! scheduling queue, an assumed-pod cache, concurrent binding through `pods/binding`,
//! and simple placement policies (round-robin, random, node-affinity-first) as extra
//! profiles.
//!
//! - [`framework`]: the pure scheduling decision and its plugins;
//! - [`cache`]: the snapshot kept current from the pod and node watches, plus assumed pods;
//! - [`queue`]: active / backoff / unschedulable queues;
//! - [`config`]: flags' and `--config`'s profiles;
//! - [`scheduler`]: the I/O shell that ties them to the API.

pub mod cache;
pub mod config;
pub mod framework;
pub mod queue;
pub mod scheduler;
