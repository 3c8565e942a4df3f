//! The secure port against plain HTTP, measured in the same run on the same apiserver:
//!
//!     cargo bench -p e2e --bench tls
//!     BENCH_SECONDS=5 cargo bench -p e2e --bench tls
//!     BENCH_APISERVER_BIN=target/debug/apiserver cargo bench -p e2e --bench tls   # another build
//!
//! One apiserver serves both: HTTPS with the admin's client certificate (the kube crate
//! from `admin.conf`) and its plain-HTTP port with a token-file user, so both sides
//! authenticate every request. Figures: ConfigMap creates/s and gets/s from 1 and 16
//! concurrent requests over keep-alive connections, then new connections per second
//! (a full TLS 1.3 handshake with a client certificate, no resumption, plus one request;
//! against a new TCP connection plus one request). The ratio is HTTPS / HTTP.

use std::sync::Arc;
use std::time::Duration;

use e2e::ApiServer;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn seconds() -> Duration {
    Duration::from_secs_f64(std::env::var("BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3.0))
}

/// Run `op(n)` from `concurrency` tasks for the bench duration: operations per second.
async fn rate<F, Fut>(concurrency: usize, op: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    e2e::load(concurrency, seconds(), op).await.0
}

fn configmap(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"k": "v"}})).expect("literal")
}

async fn client_from(kubeconfig_yaml: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig_yaml).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("config");
    kube::Client::try_from(config).expect("client")
}

async fn creates(client: kube::Client, concurrency: usize, prefix: &'static str) -> f64 {
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    rate(concurrency, move |n| {
        let api = api.clone();
        async move {
            api.create(&PostParams::default(), &configmap(&format!("{prefix}-{concurrency}-{n}")))
                .await
                .expect("create");
        }
    })
    .await
}

async fn gets(client: kube::Client, concurrency: usize, name: &'static str) -> f64 {
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    rate(concurrency, move |_| {
        let api = api.clone();
        async move {
            api.get(name).await.expect("get");
        }
    })
    .await
}

/// New connections per second, each with one `GET /healthz` (`Connection: close`): over TLS
/// with a full handshake when `tls` is given, else plain TCP.
async fn connections(port: u16, tls: Option<Arc<rustls::ClientConfig>>, concurrency: usize) -> f64 {
    rate(concurrency, move |_| {
        let tls = tls.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
            tcp.set_nodelay(true).expect("nodelay");
            let req = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
            let mut buf = Vec::new();
            match tls {
                Some(config) => {
                    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
                    let mut s = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.expect("handshake");
                    s.write_all(req).await.expect("write");
                    let _ = s.read_to_end(&mut buf).await;
                }
                None => {
                    let mut s = tcp;
                    s.write_all(req).await.expect("write");
                    let _ = s.read_to_end(&mut buf).await;
                }
            }
            assert!(buf.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf));
        }
    })
    .await
}

/// The admin's identity as a rustls client configuration, without session resumption.
fn full_handshake_config(pki: &std::path::Path) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let kc = kube::config::Kubeconfig::read_from(pki.join("admin.conf")).expect("admin.conf");
    let doc = serde_json::to_value(&kc).expect("kubeconfig as JSON");
    let b64 = |field: &str| {
        use base64::Engine;
        let text = doc.pointer(&format!("/users/0/user/{field}")).and_then(|v| v.as_str()).expect(field);
        base64::engine::general_purpose::STANDARD.decode(text).expect("base64")
    };
    let (cert, key) = (b64("client-certificate-data"), b64("client-key-data"));
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pki.join("ca.crt")).expect("ca.crt") {
        roots.add(c.expect("ca")).expect("root");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(
            CertificateDer::pem_slice_iter(&cert).map(|c| c.expect("cert")).collect(),
            PrivateKeyDer::from_pem_slice(&key).expect("key"),
        )
        .expect("client auth");
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

fn main() {
    e2e::use_release_apiserver();
    let tmp = tempfile::tempdir().expect("temp dir");
    let tokens = tmp.path().join("tokens.csv");
    std::fs::write(&tokens, "bench-token,bench,uid-bench,\"system:masters\"\n").expect("tokens.csv");
    let server =
        ApiServer::start_tls(&[], &["--token-auth-file", tokens.to_str().expect("path")]).expect("start apiserver");
    let tls = server.tls.clone().expect("tls");
    let https_kc = std::fs::read_to_string(tls.pki.join("admin.conf")).expect("admin.conf");
    let http_kc = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{}\"}}}}]\n\
         users: [{{name: u, user: {{token: bench-token}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n\
         current-context: c\n",
        server.url()
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    println!("TLS benchmark: {:?} per figure; one apiserver, HTTPS (client certificate) vs HTTP (token)", seconds());
    println!("  {:<44} {:>12} {:>12} {:>8}", "measure", "HTTPS /s", "HTTP /s", "ratio");
    let row = |what: &str, https: f64, http: f64| {
        println!("  {what:<44} {https:>12.0} {http:>12.0} {:>7.2}x", https / http);
    };
    rt.block_on(async {
        let (https, http) = (client_from(&https_kc).await, client_from(&http_kc).await);
        Api::<ConfigMap>::namespaced(https.clone(), "default")
            .create(&PostParams::default(), &configmap("bench-get"))
            .await
            .expect("seed");
        // Warm both paths (connections, caches) before measuring.
        gets(https.clone(), 4, "bench-get").await;
        gets(http.clone(), 4, "bench-get").await;
        for concurrency in [1, 16] {
            let (a, b) =
                (creates(https.clone(), concurrency, "s").await, creates(http.clone(), concurrency, "p").await);
            row(&format!("ConfigMap creates, {concurrency} keep-alive client(s)"), a, b);
            let (a, b) = (
                gets(https.clone(), concurrency, "bench-get").await,
                gets(http.clone(), concurrency, "bench-get").await,
            );
            row(&format!("ConfigMap gets, {concurrency} keep-alive client(s)"), a, b);
        }
        let config = full_handshake_config(&tls.pki);
        for concurrency in [1, 16] {
            let a = connections(tls.secure_port, Some(config.clone()), concurrency).await;
            let b = connections(server.port, None, concurrency).await;
            row(&format!("new connection + GET /healthz, {concurrency} at once"), a, b);
        }
    });
    println!("  (target: HTTPS creates at least 0.80x of HTTP's)");
}
