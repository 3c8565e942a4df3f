//! `kubeproxy`: the MiniK8s node proxy. Programs Service virtual IPs and node ports
//! (iptables, nftables or IPVS mode) from Services and EndpointSlices, and optionally
//! serves cluster DNS and runs an nginx Ingress controller.

use kubeproxy::{backend, dns, dnsservice, healthcheck, ingress, iptables, model, netpol, proxier, sysctl};

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

/// Command-line flags (Kubernetes' kube-proxy names where they exist).
#[derive(Parser, Debug)]
#[command(name = "kubeproxy", about = "MiniK8s node proxy: Service virtual IPs, node ports, cluster DNS, Ingress")]
struct Args {
    /// Path to a kubeconfig file.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The apiserver address (overrides the kubeconfig's).
    #[arg(long, alias = "server")]
    master: Option<String>,
    /// The node name to use instead of the hostname.
    #[arg(long)]
    hostname_override: Option<String>,
    /// Which proxy mode to use: nftables, iptables or ipvs. Default: nftables where the
    /// kernel has nf_tables and `nft` is installed (`nft list tables` works), else iptables.
    #[arg(long, value_parser = ["iptables", "nftables", "ipvs"])]
    proxy_mode: Option<String>,
    /// The CIDR range of the pods in the cluster; traffic from outside it to a cluster IP is masqueraded.
    #[arg(long)]
    cluster_cidr: Option<String>,
    /// Comma-separated CIDRs of the node addresses that node ports answer on (default: all local addresses).
    #[arg(long, value_delimiter = ',')]
    nodeport_addresses: Vec<String>,
    /// SNAT all traffic sent via Service cluster IPs.
    #[arg(long)]
    masquerade_all: bool,
    /// Remove every rule this program may have created, then exit.
    #[arg(long)]
    cleanup: bool,
    /// The minimum interval between rule syncs (debounce).
    #[arg(long, alias = "nftables-min-sync-period", default_value = "1s", value_parser = parse_duration)]
    iptables_min_sync_period: Duration,
    /// The maximum interval between rule syncs.
    #[arg(long, alias = "nftables-sync-period", default_value = "30s", value_parser = parse_duration)]
    iptables_sync_period: Duration,
    /// The IPVS scheduler.
    #[arg(long, default_value = "rr")]
    ipvs_scheduler: String,
    /// Where /metrics (and a plain /healthz) are served.
    #[arg(long, default_value = "127.0.0.1:10249")]
    metrics_bind_address: SocketAddr,
    /// Where the proxy's health is served: /healthz (with the node's eligibility for load
    /// balancer traffic) and /livez, as kube-proxy's JSON; also /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:10256")]
    healthz_bind_address: SocketAddr,
    /// Serve cluster DNS on this address (e.g. 0.0.0.0:53); off when absent.
    #[arg(long)]
    dns_bind_address: Option<SocketAddr>,
    /// The cluster domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Upstream DNS server for other names (default: the first nameserver of /etc/resolv.conf).
    #[arg(long)]
    dns_upstream: Option<SocketAddr>,
    /// The Service pods reach the cluster DNS through (`NAMESPACE/NAME`): with --node-ip, this
    /// node's DNS server is published as one of its endpoints (an EndpointSlice `<name>-<node>`).
    #[arg(long, default_value = "kube-system/kube-dns", value_parser = dnsservice::parse_service)]
    dns_service: (String, String),
    /// Create the --dns-service with this cluster IP when it does not exist (the kubelets'
    /// --cluster-dns, e.g. 10.96.0.10).
    #[arg(long)]
    dns_service_ip: Option<Ipv4Addr>,
    /// Run the nginx Ingress controller with its files in this directory; off when absent.
    #[arg(long)]
    ingress_dir: Option<PathBuf>,
    /// The IngressClass this controller serves (also Ingresses without a class, when it is the default).
    #[arg(long, default_value = "nginx")]
    ingress_class: String,
    /// Also serve Ingresses that name no IngressClass (ingress-nginx's flag).
    #[arg(long)]
    watch_ingress_without_class: bool,
    /// The port nginx listens on.
    #[arg(long, default_value_t = 80)]
    ingress_http_port: u16,
    /// This node's address: Ingress hosts resolve to it, it is written to Ingress status, and
    /// loadBalancerSourceRanges that hold it let the node reach the load balancer IPs
    /// (default for the last: the Node's InternalIP).
    #[arg(long)]
    node_ip: Option<Ipv4Addr>,
    /// Enforce the cluster's NetworkPolicies on the pod traffic this node forwards (an
    /// nftables table of its own, `ip minik8s-netpol`; needs `nft`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    network_policy: bool,
    /// Log level filter (RUST_LOG overrides).
    #[arg(long, default_value = "info")]
    log_level: String,
}

/// The DNS endpoint this process published (withdrawn on a graceful stop).
static PUBLISHED: std::sync::OnceLock<(kube::Client, dnsservice::Publish)> = std::sync::OnceLock::new();

fn parse_duration(s: &str) -> Result<Duration, String> {
    apimachinery::duration::parse_seconds_or_go_duration(s)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_lowercase()).unwrap_or_default()
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    common::init_tracing(&args.log_level);
    let _trimmer = common::memory::spawn_trimmer(common::memory::TRIM_INTERVAL);
    // One kubeproxy per network namespace: two would rewrite each other's rules (and
    // stop each other's nginx). Taken before anything that the exit path undoes.
    let _lock = if args.cleanup {
        None
    } else {
        let ns = common::lock::netns_id().map(|i| i.to_string()).unwrap_or_else(|| "unknown".into());
        match common::lock::acquire(
            &common::lock::runtime_dir().join(format!("kubeproxy-netns-{ns}.lock")),
            "a kubeproxy in this network namespace",
        ) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::error!("{e}");
                eprintln!("kubeproxy: {e}");
                std::process::exit(1);
            }
        }
    };
    let ingress_dir = args.ingress_dir.clone();
    let result = tokio::select! {
        r = run(args) => r,
        s = shutdown_signal() => {
            tracing::info!(signal = s, "stopping; the Service rules stay in place (--cleanup removes them)");
            Ok(())
        }
    };
    if let Some((client, p)) = PUBLISHED.get() {
        dnsservice::unpublish(client.clone(), p).await;
    }
    // nginx must not outlive us: stop it (it stops its workers) before its handle is dropped.
    if let Some(dir) = ingress_dir {
        ingress::stop_nginx(&dir).await;
    }
    if let Err(e) = result {
        tracing::error!("{e:#}");
        eprintln!("kubeproxy: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    if args.cleanup {
        // Like kube-proxy --cleanup: remove the rules of every mode.
        // A mode whose tool is not installed has nothing to clean up.
        let mut failed = Vec::new();
        if which("iptables-restore").is_ok() {
            if let Err(e) = backend::Iptables::cleanup() {
                failed.push(format!("iptables: {e:#}"));
            }
        }
        if which("ip").is_ok() {
            if let Err(e) = backend::Ipvs::cleanup() {
                failed.push(format!("ipvs: {e:#}"));
            }
        }
        if which("nft").is_ok() {
            if let Err(e) = backend::Nftables::cleanup() {
                failed.push(format!("nftables: {e:#}"));
            }
            if let Err(e) = netpol::cleanup() {
                failed.push(format!("network policies: {e:#}"));
            }
        }
        if !failed.is_empty() {
            anyhow::bail!("cleanup failed: {}", failed.join("; "));
        }
        tracing::info!("removed all kube-proxy rules");
        return Ok(());
    }

    let node_name = args.hostname_override.clone().unwrap_or_else(hostname);

    // Node-port addresses: local addresses inside the given CIDRs; none given = all.
    let locals = backend::local_addresses().unwrap_or_default();
    let nodeport_addresses: Vec<Ipv4Addr> =
        if args.nodeport_addresses.is_empty() || args.nodeport_addresses.iter().any(|c| c == "0.0.0.0/0") {
            Vec::new()
        } else {
            let v: Vec<Ipv4Addr> = locals
                .iter()
                .copied()
                .filter(|ip| args.nodeport_addresses.iter().any(|c| backend::cidr_contains(c, *ip)))
                .collect();
            if v.is_empty() {
                anyhow::bail!("--nodeport-addresses {:?} matches no local address", args.nodeport_addresses);
            }
            v
        };
    let cfg = iptables::Config {
        cluster_cidr: args.cluster_cidr.clone(),
        nodeport_addresses: nodeport_addresses.clone(),
        masquerade_all: args.masquerade_all,
    };
    let proxy_mode = match &args.proxy_mode {
        Some(mode) => mode.clone(),
        None => {
            let nft_works =
                std::process::Command::new("nft").args(["list", "tables"]).output().is_ok_and(|o| o.status.success());
            let mode = default_mode(nft_works);
            tracing::info!(mode, nft_works, "no --proxy-mode: chose the default");
            mode.to_string()
        }
    };
    let backend: Box<dyn backend::Backend> = match proxy_mode.as_str() {
        "ipvs" => {
            // The node's addresses for node ports: not the Service addresses a previous run
            // left on kube-ipvs0 (as kube-proxy, which leaves that device's addresses out).
            let on_dummy = kubeproxy::ipvs_dummy::addresses().unwrap_or_default();
            let node_ips = if nodeport_addresses.is_empty() { &locals } else { &nodeport_addresses };
            let node_ips = node_ips.iter().copied().filter(|ip| !on_dummy.contains(ip)).collect();
            Box::new(backend::Ipvs::new(node_ips, args.ipvs_scheduler.clone(), cfg)?)
        }
        "nftables" => {
            which("nft")?;
            Box::new(backend::Nftables::new(cfg))
        }
        _ => {
            which("iptables-restore")?;
            Box::new(backend::Iptables::new(cfg))
        }
    };

    for (s, outcome) in sysctl::apply(std::path::Path::new("/proc/sys"), &sysctl::wanted(&proxy_mode))? {
        match outcome {
            sysctl::Outcome::Changed { from } => {
                tracing::info!(sysctl = s.name, from = %from, to = s.value, "changed sysctl")
            }
            sysctl::Outcome::Unchanged => tracing::info!(sysctl = s.name, value = s.value, "sysctl already set"),
            sysctl::Outcome::Absent => {
                tracing::info!(sysctl = s.name, "sysctl not present (module not loaded); skipped")
            }
        }
    }

    let client = common::client(args.kubeconfig.as_deref(), args.master.as_deref()).await?;
    let node = model::NodeInfo { name: node_name.clone(), ip: node_ip(&client, &node_name, args.node_ip).await };
    let registry = prometheus::Registry::new();
    let metrics = proxier::Metrics::new(&registry)?;
    let ready = common::Ready::default();
    // kube-proxy's health timeout: twice the sync period.
    let proxy_health = healthcheck::ProxyHealth::new(args.iptables_sync_period * 2);
    let router =
        healthcheck::proxy_health_router(proxy_health.clone(), common::health_router(registry.clone(), ready.clone()));
    let bound = healthcheck::serve(args.healthz_bind_address, router).await?;
    tracing::info!(address = %bound, "serving /healthz and /livez");
    if args.metrics_bind_address != args.healthz_bind_address {
        let bound = common::serve_health(args.metrics_bind_address, registry.clone(), ready.clone()).await?;
        tracing::info!(address = %bound, "serving /metrics");
    }
    tokio::spawn(healthcheck::watch_node(client.clone(), node_name.clone(), proxy_health.clone()));
    let service_health = healthcheck::ServiceHealthServer::new(
        nodeport_addresses.iter().map(|ip| std::net::IpAddr::V4(*ip)).collect(),
        proxy_health.clone(),
    );

    if let Some(addr) = args.dns_bind_address {
        let upstream = match args.dns_upstream {
            Some(u) => Some(u),
            None => dns::upstream_from_resolv_conf(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default()),
        };
        // An unspecified address means every local address, each bound on its own.
        let addrs: Vec<SocketAddr> = if addr.ip().is_unspecified() && !locals.is_empty() {
            locals.iter().map(|ip| SocketAddr::new((*ip).into(), addr.port())).collect()
        } else {
            vec![addr]
        };
        let bound = dns::Server::start(
            client.clone(),
            &addrs,
            dns::Config { domain: args.cluster_domain.clone(), upstream, ingress_ip: args.node_ip },
        )
        .await?;
        tracing::info!(addresses = ?bound, upstream = ?upstream, "serving cluster DNS");
        match args.node_ip {
            Some(node_ip) => {
                let (namespace, name) = args.dns_service.clone();
                let p = dnsservice::Publish {
                    namespace,
                    name,
                    cluster_ip: args.dns_service_ip,
                    node: node_name.clone(),
                    node_ip,
                    port: bound.first().map(|a| a.port()).unwrap_or(addr.port()),
                };
                let _ = PUBLISHED.set((client.clone(), p.clone()));
                tokio::spawn(dnsservice::run(client.clone(), p, Duration::from_secs(30)));
            }
            None => tracing::info!("no --node-ip: this DNS server is not published as a cluster DNS endpoint"),
        }
    }
    if let Some(dir) = args.ingress_dir.clone() {
        let ic = ingress::ControllerConfig {
            dir,
            class: args.ingress_class.clone(),
            without_class: args.watch_ingress_without_class,
            http_port: args.ingress_http_port,
            node_ip: args.node_ip,
        };
        let client = client.clone();
        tokio::spawn(async move {
            if let Err(e) = ingress::run(client, ic).await {
                tracing::error!(error = %format!("{e:#}"), "ingress controller stopped");
            }
        });
    }

    if args.network_policy {
        match which("nft") {
            Ok(()) => {
                let (client, metrics) = (client.clone(), netpol::Metrics::new(&registry)?);
                tokio::spawn(async move {
                    if let Err(e) = netpol::run(client, metrics).await {
                        tracing::error!(error = %format!("{e:#}"), "NetworkPolicy enforcement stopped");
                    }
                });
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "NetworkPolicies are not enforced on this node"),
        }
    }

    proxier::run(
        client,
        backend,
        node,
        proxier::LoopConfig { min_sync_period: args.iptables_min_sync_period, sync_period: args.iptables_sync_period },
        metrics,
        ready,
        proxier::Health { proxy: proxy_health, services: service_health },
    )
    .await
}

/// This node's IP for the proxy rules: `--node-ip`, else its Node's primary address.
async fn node_ip(client: &kube::Client, node: &str, flag: Option<Ipv4Addr>) -> Option<Ipv4Addr> {
    if flag.is_some() {
        return flag;
    }
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    match api.get_opt(node).await {
        Ok(found) => {
            let ip = found.as_ref().and_then(model::node_primary_ip);
            if ip.is_none() {
                tracing::info!(node, "no IPv4 address known for this node (no --node-ip, none on its Node)");
            }
            ip
        }
        Err(e) => {
            tracing::warn!(node, error = %e, "cannot read this node's address");
            None
        }
    }
}

/// SIGTERM or SIGINT.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        _ => std::future::pending().await,
    }
}

/// The proxy mode without `--proxy-mode`: nftables where it works, else iptables.
fn default_mode(nft_works: bool) -> &'static str {
    if nft_works {
        "nftables"
    } else {
        "iptables"
    }
}

fn which(program: &str) -> anyhow::Result<()> {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .with_context(|| format!("{program} not found: it is needed for this proxy mode"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_kubernetes() {
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn flags_parse() {
        let a = Args::try_parse_from([
            "kubeproxy",
            "--proxy-mode",
            "nftables",
            "--nodeport-addresses",
            "10.0.0.0/8,127.0.0.0/8",
        ])
        .unwrap();
        assert_eq!(a.proxy_mode.as_deref(), Some("nftables"));
        assert_eq!(Args::try_parse_from(["kubeproxy"]).unwrap().proxy_mode, None);
        assert_eq!((default_mode(true), default_mode(false)), ("nftables", "iptables"));
        assert_eq!(a.nodeport_addresses.len(), 2);
        assert!(Args::try_parse_from(["kubeproxy", "--proxy-mode", "userspace"]).is_err());
        assert!(Args::try_parse_from(["kubeproxy"]).unwrap().network_policy);
        assert!(!Args::try_parse_from(["kubeproxy", "--network-policy=false"]).unwrap().network_policy);
    }
}
