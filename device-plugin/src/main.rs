//! `device-plugin`: MiniK8s' device plugins. `device-plugin sample` offers fake file-backed
//! devices of any extended resource (for tests and demos on machines without special
//! hardware); `device-plugin nvidia` offers this machine's NVIDIA GPUs as `nvidia.com/gpu`.
//! Either registers with the kubelet through `<--device-plugin-path>/kubelet.sock`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use deviceplugin::{nvidia, plugin, sample};

#[derive(Debug, Parser)]
#[command(name = "device-plugin", version, about = "MiniK8s device plugins: sample devices and NVIDIA GPUs")]
struct Flags {
    /// The directory shared with the kubelet (its `kubelet.sock` and the plugins' sockets).
    #[arg(long = "device-plugin-path", default_value = deviceplugin::DEFAULT_DIR, global = true)]
    device_plugin_path: PathBuf,
    /// Where `/metrics` and `/healthz` are served (port 0: any free port, logged).
    #[arg(long = "metrics-bind-address", default_value = "127.0.0.1:0", global = true)]
    metrics_bind_address: SocketAddr,
    /// Log level (`info`, `debug`, or a tracing filter); RUST_LOG overrides it.
    #[arg(long = "log-level", default_value = "info", global = true)]
    log_level: String,
    #[command(subcommand)]
    plugin: Plugin,
}

#[derive(Debug, Subcommand)]
enum Plugin {
    /// Fake devices backed by files in --state-dir (`touch <id>.unhealthy` breaks one).
    Sample {
        /// The extended resource offered, `vendor.com/name`.
        #[arg(long = "resource-name", default_value = "example.com/widget")]
        resource_name: String,
        /// How many devices.
        #[arg(long, default_value_t = 3)]
        count: usize,
        /// Where the devices' files live.
        #[arg(long = "state-dir", default_value = "/var/lib/minik8s/sample-devices")]
        state_dir: PathBuf,
    },
    /// This machine's NVIDIA GPUs as `nvidia.com/gpu`.
    Nvidia {
        /// The `nvidia-smi` program.
        #[arg(long = "nvidia-smi", default_value = "nvidia-smi")]
        nvidia_smi: PathBuf,
        /// How often GPU health is checked, in seconds.
        #[arg(long = "health-interval", default_value_t = 10)]
        health_interval: u64,
    },
}

/// The socket file name for a resource: `example.com/widget` → `example.com_widget.sock`.
fn socket_name(resource: &str) -> String {
    format!("{}.sock", resource.replace('/', "_"))
}

async fn shutdown() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let flags = Flags::parse();
    common::init_tracing(&flags.log_level);
    let ready = common::Ready::default();
    let bound = common::serve_health(flags.metrics_bind_address, prometheus::Registry::new(), ready.clone()).await?;
    tracing::info!(%bound, "serving healthz and metrics");
    let dir = flags.device_plugin_path.clone();
    match flags.plugin {
        Plugin::Sample { resource_name, count, state_dir } => {
            if !apimachinery::resources::is_extended(&resource_name) {
                anyhow::bail!("--resource-name {resource_name:?} is not an extended resource name (vendor.com/name)");
            }
            let devices = sample::Sample::create(&resource_name, state_dir.clone(), count)
                .with_context(|| format!("creating the devices in {}", state_dir.display()))?;
            ready.set(true);
            plugin::run(Arc::new(devices), dir, socket_name(&resource_name), shutdown()).await
        }
        Plugin::Nvidia { nvidia_smi, health_interval } => {
            let gpus = nvidia::Nvidia::discover(nvidia_smi, Duration::from_secs(health_interval.max(1)))?;
            ready.set(true);
            plugin::run(Arc::new(gpus), dir, socket_name(nvidia::RESOURCE), shutdown()).await
        }
    }
}
