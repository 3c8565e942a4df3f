//! A certificate and key that may be replaced while a process runs: what the kubelet's
//! certificate rotation swaps. One [`Identity`] is both the client certificate a
//! [`kube::Client`] presents ([`client`]) and the serving certificate of a TLS listener
//! ([`crate::tls::server_config_with`]); each new TLS handshake takes the certificate of the
//! moment, so after [`Identity::set`] new connections use the new one while open ones run
//! on (their peer checked the old one when they began).
//!
//! An identity may start empty (a kubelet waiting for its first serving certificate): a
//! server then fails the handshake and a client presents no certificate.

use std::sync::{Arc, RwLock};

use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;

use crate::pki::CertInfo;

/// The current certificate chain and key, and what the leaf says.
#[derive(Default)]
pub struct Identity {
    current: RwLock<Option<(Arc<CertifiedKey>, CertInfo)>>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("certificate", &self.certificate()).finish()
    }
}

/// Why a certificate and key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("no certificate in the PEM text")]
    NoCertificate,
    #[error("the certificate: {0}")]
    Certificate(String),
    #[error("the private key: {0}")]
    Key(String),
}

impl Identity {
    /// An identity with no certificate yet.
    pub fn empty() -> Arc<Identity> {
        Arc::new(Identity::default())
    }

    /// An identity holding `cert_pem` (the leaf first, then its chain) and `key_pem`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Arc<Identity>, IdentityError> {
        let id = Identity::empty();
        id.set(cert_pem, key_pem)?;
        Ok(id)
    }

    /// Replace the certificate and key (checked first: a bad pair changes nothing).
    pub fn set(&self, cert_pem: &str, key_pem: &str) -> Result<(), IdentityError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| IdentityError::Certificate(e.to_string()))?;
        let leaf = chain.first().ok_or(IdentityError::NoCertificate)?;
        let info = crate::pki::inspect(leaf).map_err(IdentityError::Certificate)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| IdentityError::Key(e.to_string()))?;
        let signer =
            rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| IdentityError::Key(e.to_string()))?;
        let certified = Arc::new(CertifiedKey::new(chain, signer));
        certified.keys_match().map_err(|e| IdentityError::Key(e.to_string()))?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some((certified, info));
        Ok(())
    }

    /// What the current leaf certificate says (subject, validity), if there is one.
    pub fn certificate(&self) -> Option<CertInfo> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(_, info)| info.clone())
    }

    fn key(&self) -> Option<Arc<CertifiedKey>> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(k, _)| k.clone())
    }
}

impl ResolvesClientCert for Identity {
    fn resolve(&self, _root_hint_subjects: &[&[u8]], _sigschemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.key()
    }

    fn has_certs(&self) -> bool {
        self.current.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl ResolvesServerCert for Identity {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.key()
    }
}

/// A client of the API server `config` names that presents `identity`'s certificate of the
/// moment instead of the one in `config` (the rest of `config` as [`kube::Client`] uses it:
/// server, CA, TLS server name, bearer credentials, default namespace).
pub fn client(config: kube::Config, identity: Arc<Identity>) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    use kube::client::ConfigExt;
    let mut tls = config.rustls_client_config().context("the client's TLS configuration")?;
    tls.client_auth_cert_resolver = identity;
    // A resumed session would carry the identity the server checked when it began: every
    // connection makes a full handshake, as client-go's transport does.
    tls.resumption = rustls::client::Resumption::disabled();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone()).context("tls-server-name")?;
        builder = builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = builder.enable_http1().wrap_connector(http);
    let http_client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().context("the client's credentials")?)
        .map_err(tower::BoxError::from)
        .service(http_client);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_pair_changes_nothing_and_a_good_one_replaces_the_certificate() {
        let now = crate::pki::now();
        let ca = crate::pki::Ca::generate(now).unwrap();
        let (c1, k1) = ca.issue(&crate::pki::Leaf::client("a", "system:node:a", &["system:nodes"]), now).unwrap();
        let (c2, k2) = ca.issue(&crate::pki::Leaf::client("b", "system:node:b", &["system:nodes"]), now).unwrap();
        let id = Identity::empty();
        assert!(id.certificate().is_none() && !id.has_certs());
        id.set(&c1, &k1).unwrap();
        assert_eq!(id.certificate().unwrap().common_name, "system:node:a");
        assert!(id.set(&c2, &k1).is_err(), "a key of another certificate");
        assert!(id.set("junk", &k2).is_err());
        assert_eq!(id.certificate().unwrap().common_name, "system:node:a", "unchanged by bad input");
        id.set(&c2, &k2).unwrap();
        assert_eq!(id.certificate().unwrap().common_name, "system:node:b");
    }

    /// A server that asks for client certificates and a client and server that each rotate:
    /// after `set`, a new connection presents (and is served) the new certificate.
    #[tokio::test]
    async fn new_connections_use_the_certificate_of_the_moment() {
        #[derive(Clone)]
        struct Cn(String);
        let now = crate::pki::now();
        let ca = crate::pki::Ca::generate(now).unwrap();
        let client_cert = |cn: &str| ca.issue(&crate::pki::Leaf::client(cn, cn, &[]), now).unwrap();
        let serving = |cn: &str| {
            let leaf = crate::pki::Leaf {
                name: cn.into(),
                common_name: cn.into(),
                organizations: vec![],
                usage: crate::pki::Usage::Server(vec!["127.0.0.1".into()]),
                kubeconfig: false,
            };
            ca.issue(&leaf, now).unwrap()
        };
        let roots = {
            let mut r = rustls::RootCertStore::empty();
            r.add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap()).unwrap();
            r
        };
        let server_id = Identity::empty();
        let config = crate::tls::server_config_with(server_id.clone(), Some(roots)).unwrap();
        // Each answer closes its connection, so that every request makes a new one.
        let app = axum::Router::new().route(
            "/version",
            axum::routing::get(|cn: Option<axum::Extension<Cn>>| async move {
                let who = cn.map(|c| c.0 .0).unwrap_or_default();
                ([(axum::http::header::CONNECTION, "close")], axum::Json(serde_json::json!({"major": who})))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let user_of: crate::serve::PeerUser<Cn> = |der| crate::pki::inspect(der).ok().map(|i| Cn(i.common_name));
        tokio::spawn(crate::serve::serve_tls(
            listener,
            app,
            config,
            user_of,
            std::future::pending(),
            std::time::Duration::from_secs(30),
        ));

        let mut kc = kube::Config::new(format!("https://127.0.0.1:{port}").parse().unwrap());
        kc.root_cert = Some(vec![CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap().to_vec()]);
        let (c1, k1) = client_cert("first");
        let client_id = Identity::from_pem(&c1, &k1).unwrap();
        let client = client(kc, client_id.clone()).unwrap();
        let who = || async { client.apiserver_version().await.map(|v| v.major) };
        assert!(who().await.is_err(), "no serving certificate yet: no handshake");
        let (s1, sk1) = serving("server-one");
        server_id.set(&s1, &sk1).unwrap();
        assert_eq!(who().await.unwrap(), "first");
        let (c2, k2) = client_cert("second");
        client_id.set(&c2, &k2).unwrap();
        let (s2, sk2) = serving("server-two");
        server_id.set(&s2, &sk2).unwrap();
        assert_eq!(who().await.unwrap(), "second");
    }
}
