//! `cloud-controller-manager`: MiniK8s' cloud controller manager. It runs the controllers
//! that talk to the infrastructure, in three layers:
//! - `provider/`: what the infrastructure can do (load balancers, instances, routes), one
//!   trait each, with the `local` provider (address pools announced on this host) and a
//!   `mock` one;
//! - `model.rs`: a load balancer as a Service wants it and as the provider has it, the
//!   calls between them, and the hash of the Service fields that matter;
//! - the controllers: `service.rs` (LoadBalancer Services), `node.rs` (initializing nodes
//!   of `--cloud-provider=external` kubelets), `route.rs` (pod-network routes).
//!
//! Kubernetes' flags: `--cloud-provider`, `--cloud-config`, `--controllers`,
//! `--cluster-name`, `--leader-elect*`, `--concurrent-service-syncs`,
//! `--configure-cloud-routes`, `--route-reconciliation-period`, `--secure-port` (10258).

mod metrics;
mod model;
mod node;
mod provider;
mod route;
mod service;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use crate::provider::Cloud;

/// Every controller this binary has (Kubernetes' names); `*` enables them all.
pub const CONTROLLERS: &[&str] = &["cloud-node", "service", "route"];

/// Parse `--controllers` (`*`, `foo`, `-foo`), as kube-controller-manager does.
pub fn enabled_controllers(spec: &str) -> Result<Vec<&'static str>, String> {
    let items: Vec<&str> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    for it in &items {
        let n = it.trim_start_matches('-');
        if n != "*" && !CONTROLLERS.contains(&n) {
            return Err(format!("{n:?} is not in the list of known controllers"));
        }
    }
    Ok(CONTROLLERS
        .iter()
        .copied()
        .filter(|name| {
            if items.iter().any(|i| *i == format!("-{name}")) {
                false
            } else {
                items.contains(name) || items.contains(&"*")
            }
        })
        .collect())
}

#[derive(Parser, Debug)]
#[command(name = "cloud-controller-manager", about = "MiniK8s cloud controller manager")]
#[command(mut_arg(common::leader::RESOURCE_NAME, common::leader::default_name("cloud-controller-manager")))]
struct Args {
    /// Path to a kubeconfig file.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The address of the apiserver (overrides the kubeconfig's).
    #[arg(long, alias = "server")]
    master: Option<String>,
    /// The provider: `local` (address pools on this host's LANs) or `mock` (in memory, for tests).
    #[arg(long, default_value = "local")]
    cloud_provider: String,
    /// The provider's configuration file (YAML; for `local`: its address pools, interface and state file).
    #[arg(long)]
    cloud_config: Option<PathBuf>,
    /// Controllers to enable: `*` for all, `foo` to enable, `-foo` to disable.
    #[arg(long, default_value = "*")]
    controllers: String,
    /// The cluster's name: the provider's routes are kept per cluster.
    #[arg(long, default_value = "kubernetes")]
    cluster_name: String,
    /// How many Services are synced at once.
    #[arg(long, default_value_t = 1)]
    concurrent_service_syncs: u16,
    /// Whether routes for the nodes' pod CIDRs are made on the provider (if it has routes).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    configure_cloud_routes: bool,
    /// How often the routes are reconciled.
    #[arg(long, default_value = "10s", value_parser = common::leader::parse_duration)]
    route_reconciliation_period: Duration,
    #[command(flatten)]
    leader: common::leader::Args,
    /// Address to serve /healthz and /metrics on.
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: String,
    /// Port for /healthz and /metrics (0 = pick a free one).
    #[arg(long, default_value_t = 10258)]
    secure_port: u16,
    /// Log level (or RUST_LOG).
    #[arg(long, default_value = "info")]
    log_level: String,
}

/// The provider `--cloud-provider` names, configured by `--cloud-config`.
async fn cloud(args: &Args) -> anyhow::Result<Arc<dyn Cloud>> {
    let config = match &args.cloud_config {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read --cloud-config {}: {e}", path.display()))?,
        ),
        None => None,
    };
    match args.cloud_provider.as_str() {
        "local" => {
            let cfg: provider::local::Config = match &config {
                Some(text) => serde_yaml::from_str(text).map_err(|e| anyhow::anyhow!("--cloud-config: {e}"))?,
                None => provider::local::Config::default(),
            };
            if cfg.pools.is_empty() {
                tracing::warn!("no address pools in --cloud-config: LoadBalancer Services stay pending");
            }
            Ok(Arc::new(provider::local::LocalCloud(provider::local::Local::start(cfg).await?)))
        }
        "mock" => Ok(Arc::new(provider::mock::Mock::new())),
        other => anyhow::bail!("--cloud-provider {other:?} is not known (local, mock)"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::init_tracing(&args.log_level);
    let enabled = enabled_controllers(&args.controllers).map_err(|e| anyhow::anyhow!("--controllers: {e}"))?;
    let client = common::client(args.kubeconfig.as_deref(), args.master.as_deref()).await?;
    let ready = common::Ready::default();
    let addr: SocketAddr = format!("{}:{}", args.bind_address, args.secure_port).parse()?;
    let bound = common::serve_health(addr, prometheus::Registry::new(), ready.clone()).await?;
    tracing::info!(%bound, "serving /healthz and /metrics");

    let leading = common::leader::elect(&client, &args.leader).await?;
    // The provider starts once this process leads: the local one announces addresses.
    let cloud = cloud(&args).await?;
    ready.set(true);
    tracing::info!(provider = cloud.name(), controllers = ?enabled, "starting controllers");
    let events = common::events::Recorder::new(client.clone(), "service-controller");
    let mut tasks = tokio::task::JoinSet::new();
    for c in &enabled {
        match *c {
            "service" => match cloud.load_balancers() {
                Some(lbs) => {
                    let lbs = provider::Counted::wrap(cloud.name(), lbs);
                    tasks.spawn(service::run(client.clone(), lbs, events.clone(), args.concurrent_service_syncs.max(1)));
                }
                None => tracing::warn!("the provider has no load balancers; the service controller does not run"),
            },
            "cloud-node" => match cloud.instances() {
                Some(i) => {
                    tasks.spawn(node::run(client.clone(), i));
                }
                None => tracing::warn!("the provider has no instances; the cloud node controller does not run"),
            },
            "route" => match cloud.routes() {
                Some(r) if args.configure_cloud_routes => {
                    let (cluster, period) = (args.cluster_name.clone(), args.route_reconciliation_period);
                    tasks.spawn(route::run(client.clone(), r, cluster, period));
                }
                Some(_) => tracing::info!("--configure-cloud-routes=false; the route controller does not run"),
                None => tracing::info!(
                    "the {} provider has no route table (kubelets program host routes); the route controller does not run",
                    cloud.name()
                ),
            },
            _ => {}
        }
    }
    common::leader::run_controllers(leading, tasks).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_selection_and_flags() {
        assert_eq!(enabled_controllers("*").unwrap(), CONTROLLERS);
        assert_eq!(enabled_controllers("*,-route").unwrap(), ["cloud-node", "service"]);
        assert_eq!(enabled_controllers("service").unwrap(), ["service"]);
        assert!(enabled_controllers("nodeipam").unwrap_err().contains("not in the list"));
        let a = Args::try_parse_from(["cloud-controller-manager"]).unwrap();
        assert_eq!((a.cloud_provider.as_str(), a.secure_port, a.concurrent_service_syncs), ("local", 10258, 1));
        let c = a.leader.config("me");
        assert_eq!((c.namespace.as_str(), c.name.as_str()), ("kube-system", "cloud-controller-manager"));
        assert_eq!(a.route_reconciliation_period, Duration::from_secs(10));
    }
}
