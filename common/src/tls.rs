//! TLS for the project's HTTPS ports: `--tls-cert-file`, `--tls-private-key-file` and
//! `--client-ca-file` (the same flags on kube-apiserver and the kubelet) as a rustls server
//! configuration (ring; TLS 1.2 and 1.3; HTTP/1.1 by ALPN). With a client CA, client
//! certificates are requested but optional: one that is presented must chain to that CA and
//! be valid for client authentication, or the handshake fails (a bad certificate is never
//! treated as anonymous); a verified one authenticates its connection (the server decides
//! how: [`crate::serve::serve_tls`]'s `user_of`).
//!
//! A plain-HTTP request on the TLS port is answered as Go's server answers it:
//! `HTTP/1.0 400 Bad Request` with "Client sent an HTTP request to an HTTPS server."
//! ([`looks_like_http`] decides it from the first bytes; [`HTTP_ON_HTTPS_PORT`]).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// What Go's `net/http` answers to plain HTTP on a TLS port, byte for byte.
pub const HTTP_ON_HTTPS_PORT: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {flag} {path}: {source}")]
    Read { flag: &'static str, path: String, source: std::io::Error },
    #[error("{flag} {path}: {reason}")]
    Invalid { flag: &'static str, path: String, reason: String },
    #[error("the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The files of the secure port.
#[derive(Clone, Debug)]
pub struct TlsFiles<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    pub client_ca: Option<&'a Path>,
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { flag, path: path.display().to_string(), source })
}

/// The server configuration of these files (PEM); errors name the flag and the path.
pub fn server_config(files: &TlsFiles<'_>) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = read_certificates("--tls-cert-file", files.cert)?;
    let key = read_private_key("--tls-private-key-file", files.key)?;
    let roots = files.client_ca.map(|p| read_roots("--client-ca-file", p)).transpose()?;
    build(chain, key, roots)
}

/// The configuration from parsed parts (what the tests call).
pub fn build(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_roots: Option<RootCertStore>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = builder(client_roots)?.with_single_cert(chain, key)?;
    // The server speaks HTTP/1.1 only (upgrades for exec and port-forward need it anyway).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A server configuration whose certificate is `identity`'s of the moment (one that
/// rotates); with an empty identity handshakes fail until it gets one.
pub fn server_config_with(
    identity: Arc<crate::identity::Identity>,
    client_roots: Option<RootCertStore>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = builder(client_roots)?.with_cert_resolver(identity);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn builder(
    client_roots: Option<RootCertStore>,
) -> Result<rustls::ConfigBuilder<ServerConfig, rustls::server::WantsServerCert>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match client_roots {
        Some(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Config(rustls::Error::General(e.to_string())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Ok(builder)
}

/// A client configuration (ring; TLS 1.2 and 1.3; HTTP/1.1): server certificates are
/// verified against `server_roots`, or — with `None` — accepted whatever they are (what
/// kube-apiserver does towards kubelets without `--kubelet-certificate-authority`, and what
/// the kubelet's prober does); `identity` is the client certificate chain and key to present.
pub fn client_config(
    server_roots: Option<RootCertStore>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match server_roots {
        Some(roots) => builder.with_root_certificates(roots),
        None => builder.dangerous().with_custom_certificate_verifier(Arc::new(SkipVerify(provider))),
    };
    let mut config = match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The certificates of a PEM file (`flag` names it in errors); at least one.
pub fn read_certificates(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(flag, path)?;
    let invalid = |reason: String| TlsError::Invalid { flag, path: path.display().to_string(), reason };
    let certs: Vec<_> =
        CertificateDer::pem_slice_iter(&pem).collect::<Result<_, _>>().map_err(|e| invalid(e.to_string()))?;
    if certs.is_empty() {
        return Err(invalid("no certificate found".into()));
    }
    Ok(certs)
}

/// The private key of a PEM file (`flag` names it in errors).
pub fn read_private_key(flag: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(flag, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Invalid {
        flag,
        path: path.display().to_string(),
        reason: format!("no private key: {e}"),
    })
}

/// A root store of the certificates of a PEM file (`flag` names it in errors).
pub fn read_roots(flag: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in read_certificates(flag, path)? {
        roots.add(c).map_err(|e| TlsError::Invalid {
            flag,
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// Accepts any server certificate (but still checks the handshake's signatures).
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Whether the first bytes of a connection are a plain-HTTP request rather than a TLS
/// record (a TLS handshake record starts with 0x16; a request line with a method name).
pub fn looks_like_http(first: &[u8]) -> bool {
    first.first().is_some_and(|b| b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_told_apart_from_a_client_hello() {
        for http in [&b"GET /api HTTP/1.1"[..], b"POST", b"OPTIONS * HTTP/1.1", b"H"] {
            assert!(looks_like_http(http), "{:?}", String::from_utf8_lossy(http));
        }
        for other in [&[0x16u8, 0x03, 0x01][..], b"", b"\x00\x01", b"get /", b"\x80\x2e\x01"] {
            assert!(!looks_like_http(other), "{other:?}");
        }
        assert!(HTTP_ON_HTTPS_PORT.starts_with(b"HTTP/1.0 400 Bad Request\r\n\r\n"));
    }

    #[test]
    fn bad_files_are_errors_that_name_the_flag() {
        let tmp = tempfile::tempdir().unwrap();
        let files = crate::pki::plan(
            &Default::default(),
            &crate::pki::Spec {
                nodes: vec![],
                sans: vec![],
                service_cluster_ip_range: "10.96.0.0/12".into(),
                server: "https://127.0.0.1:6443".into(),
            },
            crate::pki::Mode::Init,
            time_now(),
        )
        .unwrap();
        for (name, text) in &files {
            std::fs::write(tmp.path().join(name), text).unwrap();
        }
        let p = |n: &str| tmp.path().join(n);
        let (cert, key, ca, junk) = (p("apiserver.crt"), p("apiserver.key"), p("ca.crt"), p("junk"));
        std::fs::write(&junk, "not pem").unwrap();
        assert!(server_config(&TlsFiles { cert: &cert, key: &key, client_ca: Some(&ca) }).is_ok());
        assert!(server_config(&TlsFiles { cert: &cert, key: &key, client_ca: None }).is_ok());
        let e = server_config(&TlsFiles { cert: &junk, key: &key, client_ca: None }).unwrap_err();
        assert!(e.to_string().starts_with("--tls-cert-file"), "{e}");
        let e = server_config(&TlsFiles { cert: &cert, key: &junk, client_ca: None }).unwrap_err();
        assert!(e.to_string().starts_with("--tls-private-key-file"), "{e}");
        let e = server_config(&TlsFiles { cert: &cert, key: &key, client_ca: Some(&junk) }).unwrap_err();
        assert!(e.to_string().starts_with("--client-ca-file"), "{e}");
        let e = server_config(&TlsFiles { cert: &p("missing"), key: &key, client_ca: None }).unwrap_err();
        assert!(e.to_string().starts_with("cannot read --tls-cert-file"), "{e}");
        // A key that is not the certificate's.
        let e = server_config(&TlsFiles { cert: &cert, key: &p("ca.key"), client_ca: None }).unwrap_err();
        assert!(matches!(e, TlsError::Config(_)), "{e}");
    }

    fn time_now() -> time::OffsetDateTime {
        time::OffsetDateTime::now_utc()
    }
}
