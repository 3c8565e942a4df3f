//! `kubelet`: the MiniK8s node agent. Registers its Node, renews its Lease, watches the pods
//! bound to it and runs them in Docker (pause container + app containers, PLEG, probes),
//! and serves logs, health and metrics on `--port`.

mod bootstrap;
mod cadvisor;
mod certificate;
mod cgroups;
mod cidr;
mod devicemanager;
mod dns;
mod envvars;
mod events;
mod fsusage;
mod hostport;
mod hosttools;
mod kubelet;
mod labels;
mod metrics;
mod netlink;
mod netstats;
mod network;
mod node;
mod overlay;
mod pleg;
mod podactions;
mod podconfig;
mod probes;
mod runtime;
mod server;
mod stats;
mod status;
mod streaming;
mod tokens;
mod volumes;
mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;

/// Kubernetes' kubelet flags (the subset MiniK8s implements).
#[derive(Debug, Parser)]
#[command(name = "kubelet", version, about = "MiniK8s node agent: runs this node's pods in Docker")]
struct Flags {
    /// Path to a kubeconfig file for the apiserver connection.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// A kubeconfig with a bootstrap identity (a bootstrap token): when --kubeconfig is
    /// missing or its certificate has expired, the kubelet asks with it for a client
    /// certificate (a CertificateSigningRequest) and writes --kubeconfig.
    #[arg(long = "bootstrap-kubeconfig", requires = "kubeconfig")]
    bootstrap_kubeconfig: Option<PathBuf>,
    /// The apiserver URL (overrides the kubeconfig's server).
    #[arg(long)]
    server: Option<String>,
    /// The node's name instead of the hostname.
    #[arg(long = "hostname-override")]
    hostname_override: Option<String>,
    /// The node's IP address (InternalIP); default: the first non-loopback IPv4 address.
    #[arg(long = "node-ip")]
    node_ip: Option<String>,
    /// Labels to add when registering the node, `key=value,…`.
    #[arg(long = "node-labels", default_value = "")]
    node_labels: String,
    /// Taints to register the node with, `key=value:Effect,…`.
    #[arg(long = "register-with-taints", default_value = "")]
    register_with_taints: String,
    /// `external`: a cloud controller manager initializes this node (it registers tainted
    /// `node.cloudprovider.kubernetes.io/uninitialized` until then); empty: no cloud provider.
    #[arg(long = "cloud-provider", default_value = "")]
    cloud_provider: String,
    /// Directory for the kubelet's files (pod volumes).
    #[arg(long = "root-dir", default_value = "/var/lib/minik8s/kubelet")]
    root_dir: PathBuf,
    /// The CIDR for pod IPs on this node (otherwise the Node's spec.podCIDR from node IPAM).
    #[arg(long = "pod-cidr")]
    pod_cidr: Option<String>,
    /// Port of the kubelet's HTTPS server (logs, exec, port-forward, stats, metrics).
    #[arg(long, default_value_t = 10250)]
    port: u16,
    /// Address the server binds.
    #[arg(long, default_value = "0.0.0.0")]
    address: String,
    /// The serving certificate of --port (with its chain); without it the kubelet makes a
    /// self-signed one in --cert-dir.
    #[arg(long = "tls-cert-file", requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The key of --tls-cert-file.
    #[arg(long = "tls-private-key-file", requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// Where the self-signed or rotated serving certificate is kept (default: <root-dir>/pki).
    #[arg(long = "cert-dir")]
    cert_dir: Option<PathBuf>,
    /// Renew the kubeconfig's client certificate from the cluster's signer before it
    /// expires (a CertificateSigningRequest at 70–90% of its lifetime).
    #[arg(long = "rotate-certificates", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    rotate_certificates: bool,
    /// Ask the cluster's kubelet-serving signer for the serving certificate (and renew it),
    /// instead of a self-signed one; the port serves no handshake until one is issued.
    #[arg(long = "rotate-server-certificates", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    rotate_server_certificates: bool,
    #[command(flatten)]
    auth: common::kubelet_auth::AuthArgs,
    /// Port of the plain-HTTP /healthz (0 disables it).
    #[arg(long = "healthz-port", default_value_t = 10248)]
    healthz_port: u16,
    /// Address of the plain-HTTP /healthz.
    #[arg(long = "healthz-bind-address", default_value = "127.0.0.1")]
    healthz_bind_address: String,
    /// The pause image of pod sandboxes.
    #[arg(long = "pod-infra-container-image", default_value = "minik8s/pause:latest")]
    pod_infra_container_image: String,
    /// Comma-separated IPs of the cluster DNS servers: the nameservers of `ClusterFirst` pods.
    #[arg(long = "cluster-dns", value_delimiter = ',')]
    cluster_dns: Vec<std::net::IpAddr>,
    /// The cluster's DNS domain: pods search `<ns>.svc.<domain> svc.<domain> <domain>`.
    #[arg(long = "cluster-domain", default_value = "cluster.local")]
    cluster_domain: String,
    /// The resolver configuration of `Default` pods (and the search domains pods inherit).
    #[arg(long = "resolv-conf", default_value = "/etc/resolv.conf")]
    resolv_conf: PathBuf,
    /// How often the running containers' CPU and memory are sampled (`/stats/summary`'s resolution).
    #[arg(long = "housekeeping-interval", default_value = "10s", value_parser = parse_seconds)]
    housekeeping_interval: std::time::Duration,
    /// The directory where device plugins register (`kubelet.sock`) and serve their sockets.
    /// A directory another kubelet serves leaves this one without device plugins.
    #[arg(long = "device-plugin-path", default_value = deviceplugin::DEFAULT_DIR)]
    device_plugin_path: PathBuf,
    /// How pod traffic reaches nodes on other hosts: `host-gw` (routes `podCIDR via
    /// InternalIP`; the hosts must share a link) or `vxlan` (an overlay over UDP 8472, as
    /// flannel's vxlan backend; the pods' MTU is the underlay's less 50). Every node of a
    /// cluster runs the same backend.
    #[arg(long = "network-backend", value_enum, default_value = "host-gw")]
    network_backend: network::Backend,
    /// Run only the node's pod network (bridge, egress masquerade, the backend's routes or
    /// overlay), without Docker, the Node registration or the kubelet API: for tests of the
    /// network, whose Nodes the test writes.
    #[arg(long = "network-only", hide = true)]
    network_only: bool,
    /// With --network-only: plug the network namespace of process PID into the bridge as a
    /// pod with address IP (as a pause container's), `PID=IP`; repeatable.
    #[arg(long = "network-only-pod", hide = true, requires = "network_only", value_parser = parse_pid_ip)]
    network_only_pod: Vec<(i64, std::net::Ipv4Addr)>,
    /// Log level (`info`, `debug`, or a tracing filter); RUST_LOG overrides it.
    #[arg(long = "log-level", default_value = "info")]
    log_level: String,
}

/// `10s`, `500ms` or plain seconds.
fn parse_seconds(s: &str) -> Result<std::time::Duration, String> {
    let (n, scale) = match s.strip_suffix("ms") {
        Some(n) => (n, 0.001),
        None => (s.strip_suffix('s').unwrap_or(s), 1.0),
    };
    let v: f64 = n.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    if v.is_nan() || v <= 0.0 {
        return Err(format!("{s:?} must be positive"));
    }
    Ok(std::time::Duration::from_secs_f64(v * scale))
}

/// `PID=IP`.
fn parse_pid_ip(s: &str) -> Result<(i64, std::net::Ipv4Addr), String> {
    let (pid, ip) = s.split_once('=').ok_or_else(|| format!("{s:?}: want PID=IP"))?;
    Ok((pid.parse().map_err(|_| format!("{s:?}: bad PID"))?, ip.parse().map_err(|_| format!("{s:?}: bad IP"))?))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".into())
}

/// The host's primary address, else loopback.
fn default_node_ip() -> String {
    common::default_host_ip().map(|ip| ip.to_string()).unwrap_or_else(|| "127.0.0.1".into())
}

#[tokio::main]
async fn main() -> Result<()> {
    let flags = Flags::parse();
    common::init_tracing(&flags.log_level);
    let _trimmer = common::memory::spawn_trimmer(common::memory::TRIM_INTERVAL);
    let node_name = flags.hostname_override.clone().unwrap_or_else(hostname);
    // One kubelet per node on a host: two would fight over the node's containers.
    let _lock = common::lock::acquire(
        &common::lock::runtime_dir().join(format!("kubelet-{}.lock", common::lock::file_name_part(&node_name))),
        &format!("a kubelet for node {node_name}"),
    )?;
    let node_ip = flags.node_ip.clone().unwrap_or_else(default_node_ip);
    let pod_cidr: Option<cidr::Cidr> = flags.pod_cidr.as_deref().map(str::parse).transpose()?;
    let labels = node::parse_labels(&flags.node_labels)?;
    let taints = node::registration_taints(&flags.register_with_taints, &flags.cloud_provider)?;
    std::fs::create_dir_all(&flags.root_dir)
        .with_context(|| format!("creating --root-dir {}", flags.root_dir.display()))?;

    if let (Some(kubeconfig), Some(boot)) = (&flags.kubeconfig, &flags.bootstrap_kubeconfig) {
        bootstrap::bootstrap(kubeconfig, boot, &node_name, flags.server.as_deref()).await?;
    }
    let config = common::config(flags.kubeconfig.as_deref(), flags.server.as_deref()).await?;
    let client_identity = match certificate::identity_of(&config.auth_info) {
        Some((cert, key)) if flags.rotate_certificates => Some(common::identity::Identity::from_pem(&cert, &key)?),
        _ => None,
    };
    let client = match &client_identity {
        Some(identity) => common::identity::client(config, identity.clone())?,
        None => {
            if flags.rotate_certificates {
                tracing::warn!("--rotate-certificates: the kubeconfig holds no client certificate; nothing to rotate");
            }
            kube::Client::try_from(config).context("building the API client")?
        }
    };
    if let (Some(identity), Some(kubeconfig)) = (&client_identity, &flags.kubeconfig) {
        tokio::spawn(certificate::rotate(
            client.clone(),
            identity.clone(),
            certificate::Wanted::client(&node_name),
            certificate::Store::Kubeconfig(kubeconfig.clone()),
        ));
    }
    let node_ipv4: std::net::Ipv4Addr = match node_ip.parse() {
        Ok(ip) => ip,
        Err(_) if flags.network_backend == network::Backend::HostGw => std::net::Ipv4Addr::UNSPECIFIED,
        Err(_) => anyhow::bail!("--network-backend vxlan needs an IPv4 node address, not {node_ip:?}"),
    };
    if flags.network_only {
        return run_network_only(&flags, client, &node_name, node_ipv4, pod_cidr).await;
    }
    let rt = Arc::new(runtime::Runtime::connect(&node_name).await?);
    let docker_version = rt.version().await?;
    let metrics = metrics::Metrics::new()?;
    let dns = dns::Settings {
        cluster_dns: flags.cluster_dns.clone(),
        cluster_domain: flags.cluster_domain.clone(),
        // An empty --resolv-conf (or a missing file) means no host resolver settings.
        host_resolv_conf: std::fs::read_to_string(&flags.resolv_conf).unwrap_or_default(),
        host_hosts: std::fs::read_to_string("/etc/hosts").unwrap_or_default(),
    };
    let net =
        Arc::new(network::PodNetwork::new(&node_name, node_ipv4, flags.network_backend, Some(rt.clone()), pod_cidr));
    let devices = match devicemanager::DeviceManager::start(&flags.device_plugin_path).await {
        Ok(dm) => Some(dm),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "device plugins disabled");
            None
        }
    };
    let k = kubelet::Kubelet::new(
        client,
        rt.clone(),
        node_name.clone(),
        node_ip.clone(),
        flags.root_dir.clone(),
        flags.pod_infra_container_image.clone(),
        net,
        metrics,
        dns,
        devices,
        |k, uid, rx| Box::pin(worker::run(k, uid, rx)),
    );
    tracing::info!(node = %node_name, node_ip, docker = %docker_version, pod_cidr = ?pod_cidr, backend = ?flags.network_backend,
        cluster_dns = ?flags.cluster_dns, cluster_domain = %flags.cluster_domain, "kubelet starting");

    let addr: SocketAddr = format!("{}:{}", flags.address, flags.port).parse().context("--address/--port")?;
    let cert_dir = flags.cert_dir.clone().unwrap_or_else(|| flags.root_dir.join("pki"));
    let serving_names = [node_name.clone(), node_ip.clone()];
    let tls = if flags.rotate_server_certificates {
        let (tls, identity, store) =
            server::rotating_serving_certificate(&cert_dir, flags.auth.client_ca_file.as_deref())?;
        let wanted = certificate::Wanted::serving(&node_name, &serving_names);
        tokio::spawn(certificate::rotate(k.client.clone(), identity, wanted, store));
        tls
    } else {
        server::serving_certificate(
            flags.tls_cert_file.as_deref().zip(flags.tls_private_key_file.as_deref()),
            &cert_dir,
            &serving_names,
            flags.auth.client_ca_file.as_deref(),
        )?
    };
    let auth = common::kubelet_auth::Auth::new(flags.auth.settings(), k.client.clone());
    let bound = server::serve(addr, k.clone(), tls, auth, &node_name).await?;
    tracing::info!(%bound, client_ca = ?flags.auth.client_ca_file, anonymous = flags.auth.anonymous_auth,
        authorization = ?flags.auth.authorization_mode, "serving the kubelet API over HTTPS");
    if flags.healthz_port != 0 {
        let addr = format!("{}:{}", flags.healthz_bind_address, flags.healthz_port);
        match addr.parse().context("--healthz-bind-address/--healthz-port") {
            Ok(addr) => match server::serve_healthz(addr).await {
                Ok(bound) => tracing::info!(%bound, "serving /healthz over plain HTTP"),
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "no plain-HTTP /healthz"),
            },
            Err(e) => return Err(e),
        }
    }

    let reg = node::Registration { labels, taints, port: bound.port(), pod_cidr };
    // The apiserver may not be up yet: keep trying.
    loop {
        match node::register(&k, &reg, &docker_version).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "node registration failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        }
    }
    if let Err(e) = node::renew_lease(&k).await {
        tracing::warn!(error = %format!("{e:#}"), "creating the node lease failed");
    }
    tokio::spawn(node::heartbeat(k.clone(), bound.port(), docker_version));

    {
        let k1 = k.clone();
        let k2 = k.clone();
        tokio::spawn(pleg::run(rt, move |ev| k1.notify(&ev.pod_uid), move |records| k2.relisted(records)));
    }
    tokio::spawn(k.clone().watch_pods());
    tokio::spawn(stats::housekeeping(k.rt.clone(), k.stats.clone(), flags.housekeeping_interval));
    tokio::spawn(k.net.clone().run_node_network(k.client.clone(), k.events.clone()));

    wait_for_signal().await?;
    tracing::info!("kubelet stopping; pods keep running");
    Ok(())
}

async fn wait_for_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}

/// `--network-only`: the same `PodNetwork` and node network loop as a full kubelet, with
/// no container runtime: the namespaces of `--network-only-pod` processes are plugged into
/// the bridge as pause containers' are.
async fn run_network_only(
    flags: &Flags,
    client: kube::Client,
    node: &str,
    node_ip: std::net::Ipv4Addr,
    pod_cidr: Option<cidr::Cidr>,
) -> Result<()> {
    let cidr = pod_cidr.context("--network-only needs --pod-cidr")?;
    let net = Arc::new(network::PodNetwork::new(node, node_ip, flags.network_backend, None, Some(cidr)));
    for (pid, ip) in &flags.network_only_pod {
        net.attach_pid(&format!("pid-{pid}"), *pid, *ip, &cidr, None)
            .await
            .with_context(|| format!("plugging process {pid}'s namespace in as {ip}"))?;
        tracing::info!(pid, %ip, "pod namespace attached");
    }
    let events = events::Events::new(client.clone(), node);
    tracing::info!(node, %node_ip, pod_cidr = %cidr, backend = ?flags.network_backend, "running the pod network only");
    tokio::spawn(net.run_node_network(client, events));
    wait_for_signal().await?;
    tracing::info!("network-only kubelet stopping");
    Ok(())
}
