//! The TCP proxy (a `tcp_proxy` filter chain, or plain passthrough): connect to an endpoint
//! of the chosen cluster, or to the original destination, and copy bytes both ways.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::TcpStream;

use crate::config::{ClusterKind, Snapshot, Target, TcpProxy, INBOUND_PASSTHROUGH, PASSTHROUGH};
use crate::ctx::{Ctx, Direction};
use crate::metrics::{self, Peers};
use crate::upstream::{self, Gauge};

/// Where a TCP connection goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Upstream {
    Addr(SocketAddr, Option<String>),
    /// The named cluster has no usable endpoint (or does not exist): close the connection.
    None(&'static str),
}

/// Decide where a connection to `dst` goes under `proxy` (`None` = passthrough).
/// `draw` is a random number for weights and load balancing.
pub fn upstream_for(snap: &Snapshot, proxy: Option<&TcpProxy>, dst: SocketAddr, draw: u64, now_ms: u64) -> Upstream {
    let Some(proxy) = proxy else { return Upstream::Addr(dst, None) };
    let name = match &proxy.target {
        Target::Cluster(c) => c.as_str(),
        Target::Weighted(clusters, total) => {
            upstream::pick_weighted(clusters, (draw % u64::from((*total).max(1))) as u32).unwrap_or_default()
        }
    };
    let Some(cluster) = snap.clusters.get(name) else {
        if name == PASSTHROUGH || name == INBOUND_PASSTHROUGH {
            return Upstream::Addr(dst, None);
        }
        return Upstream::None("NC");
    };
    match cluster.kind {
        ClusterKind::OriginalDst => Upstream::Addr(dst, Some(name.to_string())),
        ClusterKind::Endpoints => match upstream::pick(cluster, now_ms, None, draw.rotate_left(17)) {
            Some(e) => Upstream::Addr(e.addr, Some(name.to_string())),
            None => Upstream::None("UH"),
        },
    }
}

pub async fn proxy(
    mut down: TcpStream,
    dst: SocketAddr,
    direction: Direction,
    proxy: Option<&Arc<TcpProxy>>,
    ctx: &Ctx,
) {
    let snap = ctx.shared.snapshot.load_full();
    let target = upstream_for(&snap, proxy.map(|p| p.as_ref()), dst, rand::random(), upstream::now_ms());
    let service = match &target {
        Upstream::Addr(_, Some(c)) => metrics::cluster_service(c).map_or_else(|| dst.to_string(), str::to_string),
        _ => dst.to_string(),
    };
    let peers = match direction {
        Direction::Outbound => Peers {
            reporter: "source",
            source_workload: &ctx.identity.workload,
            source_namespace: &ctx.identity.namespace,
            destination_workload: "unknown",
            destination_namespace: "unknown",
            destination_service: &service,
        },
        Direction::Inbound => Peers {
            reporter: "destination",
            source_workload: "unknown",
            source_namespace: "unknown",
            destination_workload: &ctx.identity.workload,
            destination_namespace: &ctx.identity.namespace,
            destination_service: &service,
        },
    };
    let m = metrics::get();
    let (addr, cluster) = match target {
        Upstream::Addr(a, c) => (a, c.and_then(|c| snap.clusters.get(&c).cloned())),
        Upstream::None(flag) => {
            m.tcp_open(&peers);
            m.tcp(&peers, flag, 0, 0);
            return;
        }
    };
    drop(snap);
    // Circuit breaker: the cluster's connection limit.
    let _conn = match &cluster {
        Some(c) => {
            if !upstream::admit_connection(&c.limits, c.state.active_connections.load(Ordering::Relaxed)) {
                m.overflow.with_label_values(&[&c.name]).inc();
                m.tcp_open(&peers);
                m.tcp(&peers, "UO", 0, 0);
                return;
            }
            Some(Gauge::inc(&c.state.active_connections))
        }
        None => None,
    };
    m.tcp_open(&peers);
    let timeout = cluster.as_ref().map_or(std::time::Duration::from_secs(10), |c| c.connect_timeout);
    let up = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        _ => {
            record(cluster.as_deref(), addr, true);
            m.tcp(&peers, "UF", 0, 0);
            return;
        }
    };
    record(cluster.as_deref(), addr, false);
    let _ = up.set_nodelay(true);
    let mut up = up;
    let (received, sent) = match tokio::io::copy_bidirectional(&mut down, &mut up).await {
        Ok(x) => x,
        Err(e) => {
            tracing::debug!(error = %e, %addr, "tcp proxy ended with an error");
            (0, 0)
        }
    };
    m.tcp(&peers, "-", sent, received);
}

/// Outlier detection counts connect failures of TCP proxies too.
fn record(cluster: Option<&crate::config::Cluster>, addr: SocketAddr, failed: bool) {
    let Some(c) = cluster else { return };
    if let Some(e) = c.endpoints.iter().find(|e| e.addr == addr) {
        if upstream::record(c, e, failed, upstream::now_ms()) {
            metrics::get().ejections.with_label_values(&[&c.name]).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{cla, eds_cluster};
    use crate::config::{build, Resources};
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;

    fn snap() -> Snapshot {
        let mut r = Resources::default();
        r.clusters.insert("db".into(), eds_cluster("db"));
        r.endpoints.insert("db".into(), cla("db", &[("10.0.0.9", 5432, HealthStatus::Healthy)]));
        r.clusters.insert("empty".into(), eds_cluster("empty"));
        build(&r, None).unwrap()
    }

    fn tp(target: Target) -> TcpProxy {
        TcpProxy { target }
    }

    #[test]
    fn chooses_where_to_connect() {
        let s = snap();
        let dst: SocketAddr = "10.96.0.3:5432".parse().unwrap();
        assert_eq!(upstream_for(&s, None, dst, 0, 1), Upstream::Addr(dst, None));
        assert_eq!(
            upstream_for(&s, Some(&tp(Target::Cluster("db".into()))), dst, 0, 1),
            Upstream::Addr("10.0.0.9:5432".parse().unwrap(), Some("db".into()))
        );
        assert_eq!(
            upstream_for(&s, Some(&tp(Target::Cluster("PassthroughCluster".into()))), dst, 0, 1),
            Upstream::Addr(dst, Some("PassthroughCluster".into())),
            "built in when the control plane does not define it"
        );
        assert_eq!(upstream_for(&s, Some(&tp(Target::Cluster("empty".into()))), dst, 0, 1), Upstream::None("UH"));
        assert_eq!(upstream_for(&s, Some(&tp(Target::Cluster("nope".into()))), dst, 0, 1), Upstream::None("NC"));
        let w = tp(Target::Weighted(vec![("db".into(), 1), ("empty".into(), 1)], 2));
        assert!(matches!(upstream_for(&s, Some(&w), dst, 0, 1), Upstream::Addr(..)));
        assert_eq!(upstream_for(&s, Some(&w), dst, 1, 1), Upstream::None("UH"));
    }
}
