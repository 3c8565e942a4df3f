//! The capture listeners: accept on the outbound (15001) and inbound (15006) ports, read
//! each connection's original destination and hand it to the filter chain that
//! [`select_outbound`] / [`select_inbound`] choose, or pass it through to where it was going.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

use crate::config::{ChainKind, Listener, Snapshot};
use crate::ctx::{Ctx, Direction};

/// The filter chain of `l` for a connection to `port`: the chain matching the port, then a
/// chain without a port condition, then the listener's default chain.
pub fn chain_for_port(l: &Listener, port: u16) -> Option<&ChainKind> {
    tracing::trace!(listener = %l.name, port, "dispatch");
    l.chains
        .iter()
        .find(|c| c.destination_port == Some(port))
        .or_else(|| l.chains.iter().find(|c| c.destination_port.is_none()))
        .or(l.default_chain.as_ref())
        .map(|c| &c.kind)
}

/// An outbound connection's chain: the listener at its exact original destination, then
/// the wildcard listener on its port, then the outbound listener's own chains.
/// `None`: pass the connection through.
pub fn select_outbound(snap: &Snapshot, dst: SocketAddr) -> Option<&ChainKind> {
    let wildcard = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), dst.port());
    if let Some(l) = snap.by_addr.get(&dst).or_else(|| snap.by_addr.get(&wildcard)) {
        return chain_for_port(l, dst.port());
    }
    snap.outbound.as_deref().and_then(|l| chain_for_port(l, dst.port()))
}

/// An inbound connection's chain, by destination port. `None`: pass it through.
pub fn select_inbound(snap: &Snapshot, dst: SocketAddr) -> Option<&ChainKind> {
    snap.inbound.as_deref().and_then(|l| chain_for_port(l, dst.port()))
}

/// Accept connections on `listener` for ever.
pub async fn serve(listener: TcpListener, direction: Direction, ctx: Arc<Ctx>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let ctx = ctx.clone();
        tokio::spawn(async move { handle(stream, peer, direction, ctx).await });
    }
}

async fn handle(stream: TcpStream, peer: SocketAddr, direction: Direction, ctx: Arc<Ctx>) {
    let _ = stream.set_nodelay(true);
    let Ok(local) = stream.local_addr() else { return };
    let dst = crate::sockopt::original_dst(&stream).unwrap_or(local);
    if dst == local {
        // Not redirected: a connection straight to our port would loop back to us.
        tracing::debug!(%peer, %local, "connection to the capture port itself; closing");
        return;
    }
    let snap = ctx.shared.snapshot.load_full();
    let chain = match direction {
        Direction::Outbound => select_outbound(&snap, dst),
        Direction::Inbound => select_inbound(&snap, dst),
    }
    .cloned();
    drop(snap);
    match chain {
        Some(ChainKind::Http(manager)) => {
            crate::http::serve(stream, crate::http::Conn { direction, original_dst: dst, manager }, ctx).await
        }
        Some(ChainKind::Tcp(proxy)) => crate::tcp::proxy(stream, dst, direction, Some(&proxy), &ctx).await,
        None => crate::tcp::proxy(stream, dst, direction, None, &ctx).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{any, http_listener, sock};
    use crate::config::{build, Resources, Target};
    use envoy_types::pb::envoy::config::listener::v3 as lpb;
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3 as tcppb;
    use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};

    fn tcp_chain(cluster: &str, port: Option<u32>) -> lpb::FilterChain {
        let tcp = tcppb::TcpProxy {
            stat_prefix: cluster.into(),
            cluster_specifier: Some(tcppb::tcp_proxy::ClusterSpecifier::Cluster(cluster.into())),
            ..Default::default()
        };
        lpb::FilterChain {
            filter_chain_match: port.map(|p| lpb::FilterChainMatch {
                destination_port: Some(UInt32Value { value: p }),
                ..Default::default()
            }),
            filters: vec![lpb::Filter {
                name: crate::config::TCP_PROXY.into(),
                config_type: Some(lpb::filter::ConfigType::TypedConfig(any(&tcp))),
            }],
            ..Default::default()
        }
    }

    fn snapshot() -> Snapshot {
        let mut r = Resources::default();
        r.listeners.insert(
            "virtualOutbound".into(),
            lpb::Listener {
                name: "virtualOutbound".into(),
                address: sock("0.0.0.0", 15001),
                use_original_dst: Some(BoolValue { value: true }),
                default_filter_chain: Some(tcp_chain("PassthroughCluster", None)),
                ..Default::default()
            },
        );
        r.listeners.insert(
            "virtualInbound".into(),
            lpb::Listener {
                name: "virtualInbound".into(),
                address: sock("0.0.0.0", 15006),
                use_original_dst: Some(BoolValue { value: true }),
                filter_chains: vec![tcp_chain("inbound|9000||", Some(9000))],
                default_filter_chain: Some(tcp_chain("InboundPassthroughClusterIpv4", None)),
                ..Default::default()
            },
        );
        r.listeners.insert("0.0.0.0_80".into(), http_listener("0.0.0.0_80", "0.0.0.0", 80, "80"));
        let mut db =
            lpb::Listener { name: "10.96.0.7_5432".into(), address: sock("10.96.0.7", 5432), ..Default::default() };
        db.filter_chains.push(tcp_chain("outbound|5432||db.default.svc.cluster.local", None));
        r.listeners.insert(db.name.clone(), db);
        build(&r, None).unwrap()
    }

    fn tcp_target(c: Option<&ChainKind>) -> Option<Target> {
        match c {
            Some(ChainKind::Tcp(t)) => Some(t.target.clone()),
            _ => None,
        }
    }

    #[test]
    fn outbound_dispatch() {
        let s = snapshot();
        assert!(matches!(select_outbound(&s, "10.96.0.1:80".parse().unwrap()), Some(ChainKind::Http(_))));
        assert_eq!(
            tcp_target(select_outbound(&s, "10.96.0.7:5432".parse().unwrap())),
            Some(Target::Cluster("outbound|5432||db.default.svc.cluster.local".into()))
        );
        assert_eq!(
            tcp_target(select_outbound(&s, "10.96.0.8:5432".parse().unwrap())),
            Some(Target::Cluster("PassthroughCluster".into())),
            "another address on the port goes to the default chain"
        );
        assert!(select_outbound(&Snapshot::default(), "1.2.3.4:80".parse().unwrap()).is_none());
    }

    #[test]
    fn inbound_dispatch_by_port() {
        let s = snapshot();
        assert_eq!(
            tcp_target(select_inbound(&s, "10.1.0.5:9000".parse().unwrap())),
            Some(Target::Cluster("inbound|9000||".into()))
        );
        assert_eq!(
            tcp_target(select_inbound(&s, "10.1.0.5:9001".parse().unwrap())),
            Some(Target::Cluster("InboundPassthroughClusterIpv4".into()))
        );
    }
}
