//! `pilot`: the mesh's control plane. At start it installs the `networking.istio.io` CRDs
//! and the sidecar injector's `MutatingWebhookConfiguration`, then serves:
//! - ADS (Envoy xDS v3, plaintext HTTP/2) on `--grpc-port` (15010);
//! - the injection webhook (HTTPS) on `--webhook-port` (15017);
//! - `/metrics`, `/healthz`, `/ready` on `--monitoring-port` (15014).
//!
//! See the library's modules for the pieces; this file only wires them.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::StatusCode;
use axum::routing::get;
use clap::Parser;
use tokio::sync::{mpsc, watch};

use pilot::{ads, crds, inject, metrics, watch as watches, webhook};

#[derive(Parser, Debug)]
#[command(name = "pilot", about = "MiniK8s mesh control plane: xDS for the sidecars and the sidecar injector")]
struct Args {
    /// Path to a kubeconfig file.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The address of the apiserver (overrides the kubeconfig's).
    #[arg(long)]
    server: Option<String>,
    /// Port of the xDS (ADS) gRPC server, plaintext HTTP/2.
    #[arg(long, default_value_t = 15010)]
    grpc_port: u16,
    /// Port of the sidecar injection webhook (HTTPS).
    #[arg(long, default_value_t = 15017)]
    webhook_port: u16,
    /// Port of /metrics, /healthz and /ready.
    #[arg(long, default_value_t = 15014)]
    monitoring_port: u16,
    /// The address the apiserver and the sidecars reach pilot at (default: the host's
    /// default-route address).
    #[arg(long)]
    advertise_address: Option<IpAddr>,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// The sidecar image injected into pods.
    #[arg(long, default_value = "minik8s/envoy:latest")]
    proxy_image: String,
    /// Where the webhook's CA and serving certificate are kept (made at first start).
    #[arg(long, default_value = "/var/lib/minik8s/pilot")]
    cert_dir: PathBuf,
    /// Log verbosity: 0-1 info, 2-4 debug, 5 and more trace.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    verbosity: u8,
    /// Log filter (`info`, `info,kube=debug`); overrides -v. RUST_LOG overrides both.
    #[arg(long)]
    log_level: Option<String>,
}

impl Args {
    fn log_filter(&self) -> String {
        common::log_filter(self.log_level.as_deref(), self.verbosity)
    }
}

/// Retry `f` until it succeeds (the apiserver may still be starting).
async fn retry<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut delay = Duration::from_millis(500);
    loop {
        match f().await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "{what} failed; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::init_tracing(&args.log_filter());
    let _ = rustls::crypto::ring::default_provider().install_default();

    let advertise = args.advertise_address.or_else(common::default_host_ip).unwrap_or(IpAddr::from([127, 0, 0, 1]));
    let client = common::client(args.kubeconfig.as_deref(), args.server.as_deref()).await?;

    let certs = webhook::load_or_create(&args.cert_dir, &webhook::sans(&advertise.to_string()))?;
    let metrics = metrics::Metrics::new();
    let ready = common::Ready::default();

    // Monitoring first, so /healthz answers while the rest starts.
    let r = ready.clone();
    let monitoring = common::health_router(metrics.registry.clone(), ready.clone()).route(
        "/ready",
        get(move || {
            let ok = r.get();
            async move {
                if ok {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }
        }),
    );
    let addr = SocketAddr::from(([0, 0, 0, 0], args.monitoring_port));
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, monitoring).await {
            tracing::error!(error = %e, "monitoring server stopped");
        }
    });

    // The webhook serves before it is registered, so no pod creation fails for want of it.
    let injection = Arc::new(inject::Injection {
        image: args.proxy_image.clone(),
        discovery_address: SocketAddr::new(advertise, args.grpc_port).to_string(),
        cluster_domain: args.cluster_domain.clone(),
    });
    let tls = webhook::tls_config(&certs)?;
    let addr = SocketAddr::from(([0, 0, 0, 0], args.webhook_port));
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let app = webhook::router(injection);
    let webhook_server = tokio::spawn(common::serve::serve_tls::<common::serve::NoUser>(
        listener,
        app,
        tls,
        |_| None,
        shutdown_signal(),
        common::serve::IDLE_TIMEOUT,
    ));

    retry("installing the CRDs", || crds::ensure(&client)).await;
    let url = format!("https://{}/inject", SocketAddr::new(advertise, args.webhook_port));
    retry("installing the webhook configuration", || webhook::ensure_configuration(&client, &url, &certs.ca_cert))
        .await;

    let (triggers_tx, triggers_rx) = mpsc::channel(1024);
    let stores = watches::start(&client, triggers_tx, &metrics);
    let (publish, feed) = watch::channel(None);
    tokio::spawn(watches::run(
        client.clone(),
        stores,
        triggers_rx,
        publish,
        args.cluster_domain.clone(),
        metrics.clone(),
        ready.clone(),
    ));

    let addr = SocketAddr::from(([0, 0, 0, 0], args.grpc_port));
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    tracing::info!(%addr, advertise = %advertise, "serving xDS");
    ads::serve(listener, ads::Ads::new(feed, metrics), shutdown_signal()).await.context("the xDS server")?;
    let _ = webhook_server.await;
    tracing::info!("stopped");
    Ok(())
}
