//! `module-controller`: Koupleless bases as virtual Nodes, module pods installed into them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use module_controller::controller::{Controller, Settings};
use module_controller::http_tunnel::HttpTunnel;
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
    /// Log filter.
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.05))
}

#[tokio::main]
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
    let (controller, rx) = Controller::new(client.clone(), tunnels.clone(), settings.clone());
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
