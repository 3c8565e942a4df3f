//! Node IPAM (`pkg/controller/nodeipam`, range allocator): every Node gets
//! `spec.podCIDR` (and `podCIDRs`), the next free `/--node-cidr-mask-size` block of
//! `--cluster-cidr` (default 10.244.0.0/16, /24 per node). A deleted Node's block is
//! free again since allocation is computed from the Nodes that exist.
//!
//! [`allocate`] is the decision (pure).

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::events::{Recorder, WARNING};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;

use crate::runner::{run_controller, Policy};
use crate::Error;

/// Parse `a.b.c.d/n`.
pub fn parse_cidr(s: &str) -> Option<(u32, u8)> {
    let (ip, len) = s.split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Some((u32::from(ip) & mask, len))
}

/// The first block of size `/mask` in `cluster` not in `used`.
pub fn allocate(cluster: &str, mask: u8, used: &HashSet<String>) -> Option<String> {
    let (base, len) = parse_cidr(cluster)?;
    if mask < len || mask > 32 {
        return None;
    }
    let used: HashSet<(u32, u8)> = used.iter().filter_map(|c| parse_cidr(c)).collect();
    let count: u64 = 1u64 << (mask - len);
    let step: u64 = 1u64 << (32 - mask);
    (0..count)
        .map(|i| (base as u64 + i * step) as u32)
        .find(|b| !used.contains(&(*b, mask)))
        .map(|b| format!("{}/{mask}", Ipv4Addr::from(b)))
}

struct Ctx {
    client: kube::Client,
    cidr: String,
    mask: u8,
    store: kube::runtime::reflector::Store<Node>,
    /// Allocated but maybe not yet in the cache.
    pending: Mutex<HashSet<String>>,
    recorder: Recorder,
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()).is_some_and(|c| !c.is_empty())
        || node.metadata.deletion_timestamp.is_some()
    {
        return Ok(Action::await_change());
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    let cidr = {
        let mut pending = ctx.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut used: HashSet<String> =
            ctx.store.state().iter().filter_map(|n| n.spec.as_ref().and_then(|s| s.pod_cidr.clone())).collect();
        used.extend(pending.iter().cloned());
        let c = allocate(&ctx.cidr, ctx.mask, &used);
        if let Some(c) = &c {
            pending.insert(c.clone());
        }
        c
    };
    let Some(cidr) = cidr else {
        ctx.recorder.event(
            node.as_ref(),
            WARNING,
            "CIDRNotAvailable",
            format!("Node {name} status is now: CIDRNotAvailable"),
        );
        return Ok(Action::requeue(Duration::from_secs(30)));
    };
    let api: Api<Node> = Api::all(ctx.client.clone());
    let patch = json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    tracing::info!(node = %name, %cidr, "allocated pod CIDR");
    Ok(Action::await_change())
}

pub async fn run(client: kube::Client, cidr: String, mask: u8, recorder: Recorder) {
    if parse_cidr(&cidr).is_none() {
        tracing::error!(%cidr, "--cluster-cidr is not an IPv4 CIDR; node IPAM disabled");
        return futures::future::pending::<()>().await;
    }
    let controller = Controller::new(Api::<Node>::all(client.clone()), watcher::Config::default())
        .with_config(kube::runtime::controller::Config::default().concurrency(1));
    let ctx = Arc::new(Ctx { client, cidr, mask, store: controller.store(), pending: Mutex::default(), recorder });
    // Forget pending allocations once the cache has them.
    let c = ctx.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let seen: HashSet<String> =
                c.store.state().iter().filter_map(|n| n.spec.as_ref().and_then(|s| s.pod_cidr.clone())).collect();
            c.pending.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| !seen.contains(p));
        }
    });
    run_controller(
        controller,
        reconcile,
        ctx,
        Policy { metric: "nodeipam", what: "node ipam", retry: Duration::from_secs(2) },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_first_free_block() {
        let mut used = HashSet::new();
        assert_eq!(allocate("10.244.0.0/16", 24, &used).as_deref(), Some("10.244.0.0/24"));
        used.insert("10.244.0.0/24".to_string());
        used.insert("10.244.2.0/24".to_string());
        assert_eq!(allocate("10.244.0.0/16", 24, &used).as_deref(), Some("10.244.1.0/24"));
        let full: HashSet<String> = (0..4).map(|i| format!("10.0.0.{}/26", i * 64)).collect();
        assert_eq!(allocate("10.0.0.0/24", 26, &full), None);
        assert_eq!(parse_cidr("10.244.7.9/16"), Some((u32::from(Ipv4Addr::new(10, 244, 0, 0)), 16)));
    }
}
