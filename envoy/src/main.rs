//! `envoy`: MiniK8s' sidecar proxy. It is configured by the mesh's control plane over
//! Envoy's xDS v3 (one ADS stream, state of the world) and carries a meshed pod's traffic,
//! which the pod's iptables rules redirect to it: outbound on 15001, inbound on 15006.
//! `MESH-CONTRACT.md` beside this crate is the contract with the control plane.
//!
//! Modules, one concept each:
//! - `node`: who this sidecar is (node id, metadata, peer metadata headers);
//! - `xds`: the ADS protocol state (pure) and the stream that feeds it;
//! - `config`: xDS resources → an immutable snapshot (pure), rejected as a whole on error;
//! - `route`: virtual host and route matching, path rewrites (pure);
//! - `upstream`: load balancing, outlier detection, circuit breakers (pure, atomics);
//! - `retry`: which attempt outcomes a retry policy retries (pure);
//! - `listener`: the capture listeners and filter-chain selection;
//! - `sockopt`: `SO_ORIGINAL_DST`;
//! - `http`: the HTTP proxy; `tcp`: the TCP proxy; `pool`: upstream connection pools;
//! - `metrics`: Istio's standard metrics; `admin`: `/stats/prometheus`, `/healthz/ready`.

mod admin;
mod config;
mod ctx;
mod http;
mod listener;
mod metrics;
mod node;
mod pool;
mod retry;
mod route;
mod sockopt;
mod state;
mod tcp;
mod upstream;
mod xds;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use clap::{Parser, Subcommand};

use crate::ctx::{Ctx, Direction};

#[derive(Parser, Debug)]
#[command(name = "envoy", about = "MiniK8s sidecar proxy (xDS v3 data plane)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log verbosity: 0-1 info, 2-4 debug, 5 and more trace.
    #[arg(short = 'v', long = "v", default_value_t = 0, global = true)]
    verbosity: u8,
    /// Log filter (`info`, `info,envoy=debug`); overrides -v. RUST_LOG overrides both.
    #[arg(long, global = true)]
    log_level: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a proxy.
    Proxy {
        #[command(subcommand)]
        kind: ProxyKind,
    },
}

#[derive(Subcommand, Debug)]
enum ProxyKind {
    /// The sidecar of a meshed pod.
    Sidecar(SidecarArgs),
}

#[derive(clap::Args, Debug)]
struct SidecarArgs {
    /// The control plane's ADS address, `host:port` (plaintext gRPC).
    #[arg(long)]
    discovery_address: String,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// How long to keep serving after SIGTERM (readiness fails meanwhile).
    #[arg(long, default_value = "5s", value_parser = common::leader::parse_duration)]
    drain_duration: Duration,
    #[arg(long, default_value_t = 15001)]
    outbound_port: u16,
    #[arg(long, default_value_t = 15006)]
    inbound_port: u16,
    #[arg(long, default_value_t = 15090)]
    metrics_port: u16,
    #[arg(long, default_value_t = 15021)]
    readiness_port: u16,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// The pod's name (downward API).
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// The pod's namespace (downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pod_namespace: String,
    /// The pod's IP (downward API); default: the host's primary address.
    #[arg(long, env = "INSTANCE_IP")]
    instance_ip: Option<String>,
    /// The workload (Deployment or pod) name; default: the pod name.
    #[arg(long, env = "ISTIO_META_WORKLOAD_NAME")]
    workload_name: Option<String>,
    /// A downward-API file of the pod's labels (`key="value"` lines), read if present.
    #[arg(long, env = "POD_LABELS_FILE", default_value = "/etc/istio/pod/labels")]
    pod_labels_file: PathBuf,
}

impl Cli {
    fn log_filter(&self) -> String {
        common::log_filter(self.log_level.as_deref(), self.verbosity)
    }
}

fn identity(a: &SidecarArgs) -> node::Identity {
    let pod_name = a
        .pod_name
        .clone()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
        .unwrap_or_else(|| "unknown".into());
    let ip = a
        .instance_ip
        .clone()
        .or_else(|| common::default_host_ip().map(|ip| ip.to_string()))
        .unwrap_or_else(|| "127.0.0.1".into());
    let labels = std::fs::read_to_string(&a.pod_labels_file).map(|t| node::parse_labels(&t)).unwrap_or_default();
    node::Identity {
        workload: a.workload_name.clone().unwrap_or_else(|| pod_name.clone()),
        pod_name,
        namespace: a.pod_namespace.clone(),
        ip,
        labels,
        cluster_domain: a.cluster_domain.clone(),
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    common::init_tracing(&cli.log_filter());
    let Command::Proxy { kind: ProxyKind::Sidecar(args) } = cli.command;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.concurrency.max(1))
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(sidecar(args))
}

async fn bind(port: u16) -> anyhow::Result<tokio::net::TcpListener> {
    let addr = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
    tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))
}

async fn sidecar(args: SidecarArgs) -> anyhow::Result<()> {
    let identity = identity(&args);
    let node = identity.node();
    tracing::info!(node = %node.id, workload = %identity.workload, discovery = %args.discovery_address, "starting sidecar");
    let shared = xds::Shared {
        snapshot: Arc::new(ArcSwap::from_pointee(Default::default())),
        ready: Arc::new(AtomicBool::new(false)),
    };
    let ctx = Arc::new(Ctx {
        shared: shared.clone(),
        node_id: ::http::HeaderValue::from_str(&node.id).context("node id is not a header value")?,
        peer_metadata: ::http::HeaderValue::from_str(&identity.peer_metadata())
            .context("peer metadata is not a header value")?,
        identity,
        draining: AtomicBool::new(false),
    });
    let outbound = bind(args.outbound_port).await?;
    let inbound = bind(args.inbound_port).await?;
    let metrics_listener = bind(args.metrics_port).await?;
    let readiness_listener =
        if args.readiness_port != args.metrics_port { Some(bind(args.readiness_port).await?) } else { None };

    tokio::spawn(xds::run(args.discovery_address.clone(), node, shared));
    tokio::spawn(listener::serve(outbound, Direction::Outbound, ctx.clone()));
    tokio::spawn(listener::serve(inbound, Direction::Inbound, ctx.clone()));
    let app = admin::router(ctx.clone());
    for l in std::iter::once(metrics_listener).chain(readiness_listener) {
        let app = app.clone();
        tokio::spawn(async move {
            if let Err(e) = axum::serve(l, app).await {
                tracing::error!(error = %e, "admin server stopped");
            }
        });
    }
    common::memory::spawn_trimmer(Duration::from_secs(30));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    ctx.draining.store(true, Ordering::SeqCst);
    tracing::info!(drain = ?args.drain_duration, "draining: readiness fails, traffic still served");
    tokio::select! {
        _ = tokio::time::sleep(args.drain_duration) => {}
        _ = term.recv() => {}
    }
    tracing::info!("drained; exiting");
    Ok(())
}
