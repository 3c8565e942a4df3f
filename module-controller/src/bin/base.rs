//! `base`: the reference Koupleless base. Hosts modules (artifacts by URL, run as supervised
//! child processes) and speaks the base side of the MQTT tunnel; `--simulate N` runs N
//! lightweight simulated bases (states only) over one connection for scale tests.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use module_controller::base::agent::{run_mqtt, AgentStats, BaseEntry, BaseIdentity};
use module_controller::base::arklet::{run_http, serve};
use module_controller::base::host::{Host, ProcessHost, SimHost};

#[derive(Parser, Debug)]
#[command(
    name = "base",
    about = "Reference Koupleless base (module host) and base simulator",
    args_override_self = true
)]
struct Args {
    /// The base's identity (default: this machine's IPv4 address).
    #[arg(long)]
    id: Option<String>,
    #[arg(long, default_value = "base")]
    name: String,
    #[arg(long, default_value = "1.0.0")]
    version: String,
    #[arg(long, default_value = "dev")]
    env: String,
    #[arg(long, default_value = "default")]
    cluster_name: String,
    #[command(flatten)]
    mqtt: module_controller::mqtt::MqttArgs,
    /// The controller's HTTP tunnel, e.g. http://127.0.0.1:7777 (instead of MQTT).
    #[arg(long)]
    http_tunnel: Option<String>,
    /// Port of the base's arklet-style HTTP API (0: any free port).
    #[arg(long, default_value_t = 1238)]
    arklet_port: u16,
    /// The address the controller reaches this base's arklet API at (default: this machine's IPv4).
    #[arg(long)]
    local_ip: Option<String>,
    /// Heartbeat period, seconds.
    #[arg(long, default_value_t = 10.0)]
    heartbeat_interval: f64,
    /// Where modules are unpacked and their logs kept (default: a directory under /tmp).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Resolve `file://` module URLs under this directory (like a container's root).
    #[arg(long)]
    artifact_root: Option<PathBuf>,
    /// Memory reported as "java max metaspace" (bytes).
    #[arg(long, default_value_t = 4 << 30)]
    memory: u64,
    /// Run N simulated bases (ids `{id}-0` … `{id}-{N-1}`, default id `sim`).
    #[arg(long)]
    simulate: Option<usize>,
    #[arg(long, default_value = "info")]
    log_level: String,
}

/// This machine's IPv4 address as routing would pick it (UDP connect sends nothing).
fn local_ipv4() -> String {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("10.254.254.254:1").map(|_| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "127.0.0.1".into())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::init_tracing(&args.log_level);
    let ip = args.local_ip.clone().unwrap_or_else(local_ipv4);
    let identity = |id: String| BaseIdentity {
        id,
        name: args.name.clone(),
        version: args.version.clone(),
        cluster_name: args.cluster_name.clone(),
        local_ip: ip.clone(),
        host_name: host_name(),
        arklet_port: args.arklet_port,
    };
    let stats = Arc::new(AgentStats::default());
    let bases: Vec<BaseEntry> = match args.simulate {
        Some(n) => {
            let prefix = args.id.clone().unwrap_or_else(|| "sim".into());
            (0..n)
                .map(|i| BaseEntry {
                    identity: identity(format!("{prefix}-{i}")),
                    host: Arc::new(SimHost::default()) as Arc<dyn Host>,
                })
                .collect()
        }
        None => {
            let id = args.id.clone().unwrap_or_else(|| ip.clone());
            let work =
                args.work_dir.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("koupleless-base-{id}")));
            std::fs::create_dir_all(&work)?;
            vec![BaseEntry {
                identity: identity(id),
                host: Arc::new(ProcessHost::new(work, args.artifact_root.clone(), args.memory)),
            }]
        }
    };
    tracing::info!(bases = bases.len(), env = %args.env, "base starting");
    let interval = Duration::from_secs_f64(args.heartbeat_interval.max(0.05));
    if args.simulate.is_some() {
        let s = stats.clone();
        tokio::spawn(async move {
            let mut last = (0u64, 0u64);
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let now = (s.received.load(Ordering::Relaxed), s.sent.load(Ordering::Relaxed));
                tracing::info!(
                    received_per_s = (now.0 - last.0) / 10,
                    sent_per_s = (now.1 - last.1) / 10,
                    "simulator traffic"
                );
                last = now;
            }
        });
    }
    // A real base serves the arklet API (and module logs for `kubectl logs`); port 0 picks
    // a free one, which the heartbeats then report.
    let mut bases = bases;
    if args.simulate.is_none() {
        let listener = tokio::net::TcpListener::bind(("0.0.0.0", args.arklet_port)).await?;
        let port = listener.local_addr()?.port();
        let first = &mut bases[0];
        first.identity.arklet_port = port;
        let shared = Arc::new(BaseEntry { identity: first.identity.clone(), host: first.host.clone() });
        serve(shared.clone(), listener);
        if let Some(tunnel) = &args.http_tunnel {
            return tokio::select! {
                r = run_http(shared, tunnel, interval) => r,
                _ = tokio::signal::ctrl_c() => Ok(()),
            };
        }
    } else if args.http_tunnel.is_some() {
        anyhow::bail!("--http-tunnel serves one real base (no --simulate)");
    }
    let Some(broker) = &args.mqtt.mqtt_broker else {
        anyhow::bail!("give --mqtt-broker host:port or --http-tunnel URL");
    };
    let cfg = args.mqtt.config(broker)?;
    let client_id = match args.simulate {
        Some(_) => format!("base-sim-{}-{}", args.id.clone().unwrap_or_else(|| "sim".into()), std::process::id()),
        None => format!("base-{}", bases[0].identity.id),
    };
    tokio::select! {
        r = run_mqtt(cfg, &client_id, &args.env, bases, interval, stats) => r,
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}
