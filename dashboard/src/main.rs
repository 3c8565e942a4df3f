//! `dashboard`: MiniK8s' web dashboard. One binary serves the page (plain HTML, CSS and
//! JavaScript modules from `web/`, embedded) and the page's way to the cluster, which is
//! always as the person logged in — the dashboard holds no identity of its own:
//! - `session.rs`: login with a token or a kubeconfig's user, sessions named by a cookie;
//! - `server.rs`: the routes (`/k8s/…` the API proxy, `/yaml/…`, `/prometheus/…`, files);
//! - `relay.rs`: the terminal's exec WebSocket, relayed to the apiserver's;
//! - `yaml.rs`: objects as YAML and where a field error is in edited YAML (pure);
//! - `assets.rs`: the embedded files; `metrics.rs`: the dashboard's own `/metrics`;
//!   `status.rs`: the `Status` answers the dashboard makes itself.
//!
//! Flags follow Kubernetes Dashboard's: `--apiserver-host`, `--bind-address`, `--port`
//! (8443), `--tls-cert-file`, `--tls-key-file` (without them a self-signed certificate,
//! as its `--auto-generate-certificates`), `--token-ttl` (900 s idle), plus
//! `--certificate-authority` (the CA that verifies the apiserver) and `--prometheus-url`.

// The routes' helpers return the answer to give as their error (a `Status` response).
#![allow(clippy::result_large_err)]

mod assets;
mod metrics;
mod relay;
mod server;
mod session;
mod status;
mod yaml;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "dashboard", about = "MiniK8s web dashboard")]
struct Args {
    /// The apiserver's URL (every session talks to it).
    #[arg(long)]
    apiserver_host: String,
    /// The CA certificate file (PEM) that verifies the apiserver's certificate.
    #[arg(long)]
    certificate_authority: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: String,
    /// Port of the dashboard's HTTPS (0 = pick a free one).
    #[arg(long, default_value_t = 8443)]
    port: u16,
    /// Serving certificate (PEM). Without it and --tls-key-file, a self-signed one.
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The serving certificate's key (PEM).
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// Serve plain HTTP instead of HTTPS (only behind a proxy that terminates TLS: the
    /// login sends credentials).
    #[arg(long, default_value_t = false)]
    insecure: bool,
    /// Seconds a session lives without a request (0 = until logout or restart).
    #[arg(long, default_value_t = 900)]
    token_ttl: u64,
    /// The cluster's Prometheus (http://HOST:PORT), for the CPU and memory plots; without
    /// it the page samples the metrics API while it is open.
    #[arg(long)]
    prometheus_url: Option<String>,
    /// Serve the page's files from this directory instead of the embedded ones (working on
    /// the page without rebuilding).
    #[arg(long)]
    web_root: Option<PathBuf>,
    /// Log verbosity: 0-1 info, 2-4 debug, 5 and more trace.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    verbosity: u8,
}

fn cluster(args: &Args) -> anyhow::Result<session::Cluster> {
    let url: http::Uri =
        args.apiserver_host.parse().with_context(|| format!("--apiserver-host {}", args.apiserver_host))?;
    anyhow::ensure!(url.scheme_str() == Some("https"), "--apiserver-host must be an https:// URL");
    let roots = common::tls::read_certificates("--certificate-authority", &args.certificate_authority)?;
    Ok(session::Cluster { url, roots: roots.into_iter().map(|c| c.to_vec()).collect() })
}

/// The serving configuration, offering HTTP/2 first: a page holds a watch or a log stream
/// per open list, and over HTTP/1.1 a browser allows only six connections to one server.
/// (Its WebSockets still go over HTTP/1.1 connections of their own.)
fn tls_config(args: &Args) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let config = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => common::tls::server_config(&common::tls::TlsFiles { cert, key, client_ca: None })?,
        _ => {
            let names = vec![args.bind_address.clone(), "localhost".into(), "127.0.0.1".into()];
            let (cert, key) = common::pki::self_signed_serving("minik8s-dashboard", &names, common::pki::now())?;
            use rustls::pki_types::pem::PemObject;
            use rustls::pki_types::{CertificateDer, PrivateKeyDer};
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>()?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes())?;
            tracing::warn!("no --tls-cert-file: serving a self-signed certificate (browsers will warn)");
            common::tls::build(chain, key, None)?
        }
    };
    let mut config = (*config).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::init_tracing(&common::log_filter(None, args.verbosity));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cluster = cluster(&args)?;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let app = Arc::new(server::App {
        cluster,
        sessions: session::Sessions::new(Duration::from_secs(args.token_ttl)),
        prometheus: args.prometheus_url.clone(),
        secure: !args.insecure,
        assets: match &args.web_root {
            Some(dir) => assets::Assets::Dir(dir.clone()),
            None => assets::Assets::Embedded,
        },
        http,
    });
    let addr: SocketAddr = format!("{}:{}", args.bind_address, args.port).parse().context("--bind-address/--port")?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    let router = server::router(app);
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if args.insecure {
        tracing::info!(%bound, "serving the dashboard (plain HTTP)");
        common::serve::serve(listener, router, shutdown, common::serve::IDLE_TIMEOUT).await;
    } else {
        let tls = tls_config(&args)?;
        tracing::info!(%bound, "serving the dashboard");
        common::serve::serve_tls::<common::serve::NoUser>(
            listener,
            router,
            tls,
            |_| None,
            shutdown,
            common::serve::IDLE_TIMEOUT,
        )
        .await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let a = Args::try_parse_from([
            "dashboard",
            "--apiserver-host",
            "https://127.0.0.1:6443",
            "--certificate-authority",
            "/ca.crt",
        ])
        .unwrap();
        assert_eq!((a.bind_address.as_str(), a.port, a.token_ttl, a.insecure), ("127.0.0.1", 8443, 900, false));
        let e = Args::try_parse_from([
            "dashboard",
            "--apiserver-host",
            "x",
            "--certificate-authority",
            "c",
            "--tls-cert-file",
            "a",
        ])
        .unwrap_err();
        assert!(e.to_string().contains("--tls-key-file"), "{e}");
    }
}
