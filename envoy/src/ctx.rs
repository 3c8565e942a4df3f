//! What every connection handler shares: the configuration in force, the sidecar's
//! identity and the headers it sends to peers, whether it is draining; and which way a
//! connection goes.

use std::sync::atomic::AtomicBool;

use http::HeaderValue;

use crate::node::Identity;
use crate::xds::Shared;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Outbound,
    Inbound,
}

/// What every connection handler shares.
pub struct Ctx {
    pub shared: Shared,
    pub identity: Identity,
    /// Header values sent to peers (computed once).
    pub node_id: HeaderValue,
    pub peer_metadata: HeaderValue,
    pub draining: AtomicBool,
}
