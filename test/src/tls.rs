//! A TLS front for a test apiserver: the official kubectl sends credentials (a bearer
//! token, impersonation headers) only over TLS, so the suites that test who may do what
//! reach the plain-HTTP apiserver through this terminator. It accepts TLS on a loopback
//! port with a self-signed certificate (clients skip verification) and splices each
//! connection's plain bytes to the apiserver.

use std::sync::Arc;

use anyhow::{Context, Result};

/// A running TLS terminator (on a thread of its own, for the test process's life).
pub struct TlsFront {
    pub port: u16,
}

impl TlsFront {
    /// Terminate TLS in front of `127.0.0.1:<backend>`.
    pub fn start(backend: u16) -> Result<Self> {
        let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])?;
        let cert = key.cert.der().clone();
        let pk = rustls::pki_types::PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into());
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert], pk)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("runtime")?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                loop {
                    let Ok((socket, _)) = listener.accept().await else { return };
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(socket).await else { return };
                        let Ok(mut plain) = tokio::net::TcpStream::connect(("127.0.0.1", backend)).await else {
                            return;
                        };
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    });
                }
            })
        });
        Ok(TlsFront { port })
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// A kubeconfig for this front that authenticates with `token`.
    pub fn write_kubeconfig(&self, path: &std::path::Path, token: &str) -> Result<()> {
        let kc = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{}\", insecure-skip-tls-verify: true}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n\
             users: [{{name: u, user: {{token: \"{token}\"}}}}]\ncurrent-context: c\n",
            self.url()
        );
        std::fs::write(path, kc).with_context(|| format!("writing {}", path.display()))
    }
}
