//! `module-controller`: Koupleless bases as virtual Nodes, module pods installed into them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use module_controller::controller::{Controller, Settings};
use module_controller::http_tunnel::HttpTunnel;
use module_controller::kubelet_api;
use module_controller::metrics::METRICS;
use module_controller::mqtt::MqttTunnel;
use module_controller::tunnel::Tunnel;

#[derive(Parser, Debug)]
#[command(
    name = "module-controller",
    about = "Virtual kubelet for Koupleless bases and modules",
    args_override_self = true
)]
struct Args {
    /// Path to a kubeconfig.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The apiserver URL (overrides the kubeconfig's).
    #[arg(long, alias = "master")]
    server: Option<String>,
    /// The Koupleless environment (topic prefix `koupleless_{env}`, vnode suffix).
    #[arg(long, default_value = "dev")]
    env: String,
    /// This replica's identity (holder of the vnode Leases); random by default.
    #[arg(long)]
    client_id: Option<String>,
    #[command(flatten)]
    mqtt: module_controller::mqtt::MqttArgs,
    /// Port of the HTTP tunnel (bases POST heartbeats); 0 disables it.
    #[arg(long, default_value_t = 7777)]
    http_tunnel_port: u16,
    /// Port of the vnodes' kubelet API (HTTPS: `kubectl logs` of module pods), which every
    /// vnode publishes as its kubelet endpoint; 0 picks a free one.
    #[arg(long, default_value_t = 10250)]
    port: u16,
    /// Address the kubelet API listens on.
    #[arg(long, default_value = "0.0.0.0")]
    address: std::net::IpAddr,
    /// The address the apiserver reaches the kubelet API at: every vnode's InternalIP
    /// (default: this host's primary address).
    #[arg(long = "node-ip")]
    node_ip: Option<String>,
    /// The kubelet API's serving certificate (with its chain); without it a self-signed one
    /// is made at start.
    #[arg(long = "tls-cert-file", requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The key of --tls-cert-file.
    #[arg(long = "tls-private-key-file", requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    #[command(flatten)]
    auth: common::kubelet_auth::AuthArgs,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:9090")]
    health_bind_address: SocketAddr,
    /// Vnode Lease duration, seconds.
    #[arg(long, default_value_t = 40.0)]
    node_lease_duration: f64,
    /// Seconds without heartbeat before a vnode turns Ready=Unknown.
    #[arg(long, default_value_t = 25.0)]
    base_unreachable_after: f64,
    /// Health poll period, seconds.
    #[arg(long, default_value_t = 10.0)]
    health_interval: f64,
    /// Module query period, seconds.
    #[arg(long, default_value_t = 15.0)]
    query_interval: f64,
    /// Seconds a vnode status whose only change is capacity/allocatable (the base's
    /// metaspace, which moves with each module) waits after the last write; conditions are
    /// written at once.
    #[arg(long, default_value_t = 30.0)]
    node_resources_update_interval: f64,
    /// Log filter.
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.05))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::init_tracing(&args.log_level);
    let _trimmer = common::memory::spawn_trimmer(common::memory::TRIM_INTERVAL);
    let client_id = args.client_id.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "module-controller".into());
        format!("{host}-{}-{:x}", std::process::id(), module_controller::protocol::now_ms())
    });
    let client = common::client(args.kubeconfig.as_deref(), args.server.as_deref()).await?;
    let ready = common::Ready::default();
    let addr = common::serve_health(args.health_bind_address, METRICS.registry.clone(), ready.clone()).await?;
    tracing::info!(%addr, %client_id, env = %args.env, "module-controller starting");

    let mut settings = Settings::new(&args.env, &client_id);
    settings.lease_duration = secs(args.node_lease_duration);
    settings.unreachable_after = secs(args.base_unreachable_after);
    settings.health_interval = secs(args.health_interval);
    settings.query_interval = secs(args.query_interval);
    settings.resources_interval = secs(args.node_resources_update_interval);

    // The vnodes' kubelet API first: its port is what the vnodes publish.
    let node_ip = args
        .node_ip
        .clone()
        .unwrap_or_else(|| common::default_host_ip().map(|ip| ip.to_string()).unwrap_or_else(|| "127.0.0.1".into()));
    let tls = kubelet_api::tls_config(
        args.tls_cert_file.as_deref().zip(args.tls_private_key_file.as_deref()),
        &[node_ip.clone(), "localhost".into()],
        args.auth.client_ca_file.as_deref(),
    )?;
    let auth = common::kubelet_auth::Auth::new(args.auth.settings(), client.clone());

    let mut tunnels: Vec<Arc<dyn Tunnel>> = Vec::new();
    if let Some(broker) = &args.mqtt.mqtt_broker {
        let cfg = args.mqtt.config(broker)?;
        tunnels.push(Arc::new(MqttTunnel::new(cfg)));
    }
    if args.http_tunnel_port != 0 {
        tunnels.push(Arc::new(HttpTunnel::new(args.http_tunnel_port)));
    }
    if tunnels.is_empty() {
        anyhow::bail!("no tunnel: give --mqtt-broker and/or --http-tunnel-port");
    }
    let listener = std::net::SocketAddr::new(args.address, args.port);
    let arklets = module_controller::controller::Arklets::default();
    let app = kubelet_api::router(client.clone(), auth, arklets.clone());
    let bound =
        common::kubelet_auth::serve(listener, app, tls).await.context("the vnodes' kubelet API (--address, --port)")?;
    tracing::info!(%bound, node_ip, client_ca = ?args.auth.client_ca_file, authorization = ?args.auth.authorization_mode,
        "serving the vnodes' kubelet API over HTTPS");
    settings.kubelet = module_controller::mapping::KubeletEndpoint { ip: node_ip, port: bound.port() };
    let (controller, rx) = Controller::new(client.clone(), tunnels.clone(), settings.clone(), arklets);
    for tunnel in &tunnels {
        tunnel.start(&client_id, &args.env).await.with_context(|| format!("starting tunnel {}", tunnel.key()))?;
        tracing::info!(tunnel = %tunnel.key(), "tunnel started");
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; exiting"),
        _ = controller.run(rx, ready.clone()) => tracing::error!("controller stopped"),
    }
    Ok(())
}
