//! `tenant-proxy`: many teams on one cluster, each with what looks like a cluster of its own.
//!
//! A tenant's kubectl talks to this proxy (HTTPS, a client certificate with `O=tenant:<name>`
//! from the tenants' CA); the proxy sends the same request, converted, to the apiserver with
//! its own identity, and converts the answer back. Tenant `acme`'s namespace `prod` is
//! `acme-prod` upstream; its cluster-scoped objects' names are prefixed the same way, its CRDs'
//! groups get `acme.` in front; nothing of another tenant's ever comes back.
//!
//! - `tenant.rs` — tenant names and the stored forms of names, groups and users; the caller
//!   of a certificate;
//! - `resources.rs` — the upstream resources' scopes and what a tenant may do with each;
//! - `request.rs` — a request path and query, and the same request upstream;
//! - `convert.rs` — objects, lists, Tables, watch events and Status bodies both ways;
//! - `discovery.rs`, `openapi.rs` — the resource tables, and each tenant's discovery and
//!   OpenAPI documents;
//! - `tenants.rs` — the `Tenant` CRD and each tenant's starting objects;
//! - `proxy.rs`, `openapi_serve.rs` — the request path; `upstream.rs` its connection to the
//!   apiserver (the discovery and tenant lookups use a `kube::Client`); `connect.rs` exec,
//!   attach and port-forward (upgraded connections, spliced); `answer.rs` the proxy's own
//!   `Status` answers.
//!
//! Subcommands make the tenants' PKI: `tenant-proxy pki --dir D` (the tenants' CA and the
//! proxy's serving certificate) and `tenant-proxy kubeconfig --dir D --tenant NAME` (a ready
//! kubeconfig for one of a tenant's users).

// The request path returns its early answers (`Result<_, Response>`) as they will be sent.
#![allow(clippy::result_large_err)]

mod answer;
mod connect;
mod convert;
mod discovery;
mod metrics;
mod openapi;
mod openapi_serve;
mod proxy;
mod request;
mod resources;
mod tenant;
mod tenants;
mod upstream;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "tenant-proxy", about = "Kubernetes API for many tenants in front of one apiserver")]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// The proxy's kubeconfig towards the apiserver (a cluster administrator: it impersonates
    /// tenants' users and acts for their administrators).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The apiserver's address (overrides the kubeconfig's).
    #[arg(long)]
    server: Option<String>,
    /// The address tenants connect to.
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: String,
    /// The HTTPS port tenants connect to.
    #[arg(long, default_value_t = 6444)]
    secure_port: u16,
    /// The proxy's serving certificate (PEM).
    #[arg(long)]
    tls_cert_file: Option<PathBuf>,
    /// Its key (PEM).
    #[arg(long)]
    tls_private_key_file: Option<PathBuf>,
    /// The tenants' CA: client certificates it signed name a tenant (`O=tenant:<name>`), a
    /// user (CN) and a group (a second O). Not the cluster's CA.
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
    /// `/healthz`, `/readyz` and `/metrics` (plain HTTP; never the tenants' port).
    #[arg(long, default_value = "127.0.0.1:10262")]
    healthz_bind_address: String,
    /// Log verbosity: 0-1 info, 2-4 debug, 5 and more trace.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    verbosity: u8,
    /// Log filter (`info`, `info,kube=debug`); overrides -v. RUST_LOG overrides both.
    #[arg(long)]
    log_level: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Make the tenants' CA (kept if it exists) and the proxy's serving certificate in DIR.
    Pki {
        #[arg(long)]
        dir: PathBuf,
        /// More DNS names or IP addresses for the serving certificate.
        #[arg(long = "san")]
        sans: Vec<String>,
    },
    /// Print a kubeconfig for a tenant's user, signed by the tenants' CA in DIR.
    Kubeconfig {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        tenant: String,
        /// The user (CN).
        #[arg(long, default_value = "admin")]
        user: String,
        /// The user's group inside the tenant (`system:masters`: the tenant's administrators).
        #[arg(long, default_value = "system:masters")]
        group: String,
        /// The proxy's URL.
        #[arg(long)]
        server: String,
    },
}

const CA_CERT: &str = "tenants-ca.crt";
const CA_KEY: &str = "tenants-ca.key";
const SERVING_CERT: &str = "tenant-proxy.crt";
const SERVING_KEY: &str = "tenant-proxy.key";

fn read(dir: &Path, name: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(dir.join(name)).with_context(|| format!("reading {}", dir.join(name).display()))
}

fn pki(dir: &Path, sans: &[String]) -> anyhow::Result<()> {
    use common::pki::{Ca, Leaf, Usage};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let now = common::pki::now();
    let ca = match (read(dir, CA_CERT), read(dir, CA_KEY)) {
        (Ok(cert_pem), Ok(key_pem)) => Ca { cert_pem, key_pem },
        _ => {
            let ca = Ca::generate_named("minik8s-tenants", now)?;
            std::fs::write(dir.join(CA_CERT), &ca.cert_pem)?;
            common::write_private(&dir.join(CA_KEY), ca.key_pem.as_bytes())?;
            ca
        }
    };
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "tenant-proxy".to_string()];
    names.extend(sans.iter().filter(|s| !s.is_empty()).cloned());
    let leaf = Leaf {
        name: "tenant-proxy".into(),
        common_name: "tenant-proxy".into(),
        organizations: vec![],
        usage: Usage::Server(names),
        kubeconfig: false,
    };
    let (cert, key) = ca.issue(&leaf, now)?;
    std::fs::write(dir.join(SERVING_CERT), cert)?;
    common::write_private(&dir.join(SERVING_KEY), key.as_bytes())?;
    println!("{}", dir.join(CA_CERT).display());
    Ok(())
}

fn kubeconfig(dir: &Path, tenant: &str, user: &str, group: &str, server: &str) -> anyhow::Result<String> {
    tenant::Tenant::new(tenant).map_err(anyhow::Error::msg)?;
    let ca = common::pki::Ca { cert_pem: read(dir, CA_CERT)?, key_pem: read(dir, CA_KEY)? };
    let mut groups = vec![format!("{}{tenant}", tenant::ORG_PREFIX)];
    if !group.is_empty() {
        groups.push(group.to_string());
    }
    let text = common::pki::user_kubeconfig(&ca, server, user, &groups, common::pki::now())?;
    // The context names the tenant, so two tenants' kubeconfigs merge side by side.
    Ok(text.replace(&format!("{user}@{}", common::pki::CLUSTER_NAME), &format!("{user}@{tenant}")))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::init_tracing(&common::log_filter(args.log_level.as_deref(), args.verbosity));
    match &args.command {
        Some(Command::Pki { dir, sans }) => return pki(dir, sans),
        Some(Command::Kubeconfig { dir, tenant, user, group, server }) => {
            print!("{}", kubeconfig(dir, tenant, user, group, server)?);
            return Ok(());
        }
        None => {}
    }
    let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert_file, &args.tls_private_key_file, &args.client_ca_file)
    else {
        anyhow::bail!(
            "--tls-cert-file, --tls-private-key-file and --client-ca-file are required (tenant-proxy pki makes them)"
        );
    };
    let tls = common::tls::server_config(&common::tls::TlsFiles { cert, key, client_ca: Some(ca) })?;
    let config = common::config(args.kubeconfig.as_deref(), args.server.as_deref()).await?;
    let upstream = upstream::Upstream::new(&config)?;
    let client = kube::Client::try_from(config).context("building the API client")?;

    let registry = prometheus::Registry::new();
    let metrics = metrics::Metrics::new(&registry)?;
    let ready = common::Ready::default();
    let health: SocketAddr = args.healthz_bind_address.parse().context("--healthz-bind-address")?;
    common::serve_health(health, registry, ready.clone()).await?;

    tenants::install_crd(&client).await.context("installing the Tenant CRD")?;
    let discovery = discovery::Discovery::new(client.clone());
    discovery.refresh().await.context("reading the apiserver's discovery")?;
    tokio::spawn(discovery.clone().run());
    let tenants = Arc::new(tenants::Tenants::default());
    let forget = tenants.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            forget.forget_all();
        }
    });
    tokio::spawn(tenants.clone().run_cleanup(client.clone(), discovery.clone()));
    let proxy = Arc::new(proxy::Proxy { client, upstream, discovery, tenants, metrics });
    let app = Router::new().fallback(proxy::handle).with_state(proxy);

    let addr: SocketAddr = format!("{}:{}", args.bind_address, args.secure_port)
        .parse()
        .with_context(|| format!("invalid --bind-address {:?}", args.bind_address))?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    tracing::info!(addr = %listener.local_addr()?, "serving tenants");
    ready.set(true);
    let user_of: common::serve::PeerUser<proxy::Authn> = proxy::authn_of_certificate;
    common::serve::serve_tls(listener, app, tls, user_of, shutdown(), common::serve::IDLE_TIMEOUT).await;
    Ok(())
}

async fn shutdown() {
    let _ = tokio::signal::ctrl_c().await;
}
