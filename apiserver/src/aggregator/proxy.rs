//! The HTTPS leg to an aggregated API server: its TLS client configuration (the server's
//! certificate verified against the APIService's `caBundle` for `<service>.<namespace>.svc`,
//! or not at all with `insecureSkipTLSVerify`; `--proxy-client-cert-file` presented), the
//! request headers as kube-aggregator sends them (the requestheader convention: who asked in
//! `X-Remote-User`/`X-Remote-Group`, their own credentials and any `X-Remote-*` or
//! `Impersonate-*` they sent removed), and one proxied exchange — the answer streamed back as
//! it comes (watches), upgrades (`101 Switching Protocols`) spliced byte for byte.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::endpoints::authority;

/// The proxy's client certificate (`--proxy-client-cert-file`, `--proxy-client-key-file`).
pub type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// The TLS client configuration towards one APIService's backend.
pub fn client_config(
    ca_bundle: &[u8],
    insecure: bool,
    identity: Option<&Identity>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let roots = if insecure {
        None
    } else {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_bundle) {
            let cert = cert.map_err(|e| format!("unable to load root certificates: {e}"))?;
            roots.add(cert).map_err(|e| format!("unable to load root certificates: {e}"))?;
        }
        if !ca_bundle.is_empty() && roots.is_empty() {
            return Err("unable to load root certificates: no certificate found in caBundle".into());
        }
        Some(roots)
    };
    let identity = identity.map(|(chain, key)| (chain.clone(), key.clone_key()));
    common::tls::client_config(roots, identity).map_err(|e| e.to_string())
}

/// Hop-by-hop headers (RFC 9110 7.6.1), never forwarded either way.
fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Who the backend is told asked: the requestheader headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requester {
    pub name: String,
    pub groups: Vec<String>,
}

/// The headers the backend gets: the client's, less this hop's own, its credentials, its
/// impersonation (already applied here) and any identity headers it sent; plus who asked.
/// `upgrade`: the request's `Connection`/`Upgrade` pass (a WebSocket or SPDY stream).
pub fn request_headers(incoming: &HeaderMap, requester: &Requester, upgrade: bool) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (k, v) in incoming {
        let name = k.as_str();
        let keep_upgrade = upgrade && (name == "connection" || name == "upgrade");
        if (hop_by_hop(name) && !keep_upgrade)
            || name == "host"
            || name == "authorization"
            || name.starts_with("x-remote-")
            || name.starts_with("impersonate-")
        {
            continue;
        }
        out.append(k.clone(), v.clone());
    }
    if let Ok(v) = HeaderValue::from_str(&requester.name) {
        out.insert(HeaderName::from_static("x-remote-user"), v);
    }
    for g in &requester.groups {
        if let Ok(v) = HeaderValue::from_str(g) {
            out.append(HeaderName::from_static("x-remote-group"), v);
        }
    }
    out
}

/// Whether a request asks to switch protocols.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
}

/// A plain-text answer, as Go's `http.Error` writes one (kube-aggregator's errors are).
pub fn text_error(code: StatusCode, message: &str) -> Response {
    let mut r = Response::new(Body::from(format!("{message}\n")));
    *r.status_mut() = code;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert(HeaderName::from_static("x-content-type-options"), HeaderValue::from_static("nosniff"));
    r
}

/// An I/O error worded as Go's net package words a failed dial.
fn dial_error(host: &str, port: u16, e: &std::io::Error) -> String {
    let why = match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_string(),
        std::io::ErrorKind::TimedOut => "i/o timeout".to_string(),
        _ => e.to_string(),
    };
    format!("dial tcp {}: {why}", authority(host, port))
}

/// A TLS connection to `host:port` whose certificate must name `server_name`.
pub async fn connect(
    host: &str,
    port: u16,
    server_name: &str,
    config: Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| e.to_string())?;
    let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| dial_error(host, port, &e))?;
    let _ = tcp.set_nodelay(true);
    tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.map_err(|e| format!("tls: {e}"))
}

/// Proxy one request to `host:port`: the answer streams back as the backend sends it. `Err`
/// is why the backend could not be reached (the caller answers 503 with it).
pub async fn exchange(
    host: &str,
    port: u16,
    server_name: &str,
    config: Arc<rustls::ClientConfig>,
    parts: &mut http::request::Parts,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, String> {
    let upgrade = is_upgrade(&parts.headers);
    let stream = connect(host, port, server_name, config).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "aggregated API connection ended");
        }
    });
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut req = http::Request::builder().method(parts.method.clone()).uri(path);
    if let Some(h) = req.headers_mut() {
        *h = headers;
        if let Ok(v) = HeaderValue::from_str(&authority(host, port)) {
            h.insert(header::HOST, v);
        }
    }
    let req = req.body(if upgrade { Body::empty() } else { body }).map_err(|e| e.to_string())?;
    let mut resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            return Err("the request could not be upgraded".into());
        };
        let backend_upgrade = hyper::upgrade::on(&mut resp);
        let mut out = Response::new(Body::empty());
        *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *out.headers_mut() = resp.headers().clone();
        tokio::spawn(async move {
            let (client, backend) = match tokio::try_join!(client_upgrade, backend_upgrade) {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::debug!(error = %e, "aggregated API upgrade failed");
                    return;
                }
            };
            let (mut a, mut b) = (TokioIo::new(client), TokioIo::new(backend));
            let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
        });
        return Ok(out);
    }
    let (rp, incoming) = resp.into_parts();
    let mut out = Response::new(Body::new(incoming));
    *out.status_mut() = rp.status;
    for (k, v) in &rp.headers {
        if !hop_by_hop(k.as_str()) {
            out.headers_mut().append(k.clone(), v.clone());
        }
    }
    Ok(out)
}

/// One discovery check: `GET path` answered 2xx within `timeout`, as kube-aggregator's
/// availability check does it (any certificate accepted; identity
/// `system:kube-aggregator` in `system:masters`). `Ok`: the body; `Err`: why, worded as
/// upstream (`failing or missing response from <url>: …`).
pub async fn probe(
    host: &str,
    port: u16,
    path: &str,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<bytes::Bytes, String> {
    use http_body_util::BodyExt;
    let url = format!("https://{}{path}", authority(host, port));
    let get = async {
        let stream = connect(host, port, host, config).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, http_body_util::Empty<bytes::Bytes>>(TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = http::Request::get(path)
            .header(header::HOST, authority(host, port))
            .header(header::ACCEPT, "application/json, */*")
            .header("X-Remote-User", "system:kube-aggregator")
            .header("X-Remote-Group", "system:masters")
            .body(http_body_util::Empty::new())
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        Ok::<_, String>((status, body))
    };
    match tokio::time::timeout(timeout, get).await {
        Ok(Ok((status, body))) if status.is_success() => Ok(body),
        Ok(Ok((status, _))) => {
            Err(format!("failing or missing response from {url}: bad status from {url}: {}", status.as_u16()))
        }
        Ok(Err(why)) => Err(format!("failing or missing response from {url}: Get {url:?}: {why}")),
        Err(_) => Err(format!(
            "failing or missing response from {url}: Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_learns_who_asked_and_nothing_more() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer secret"),
            ("x-remote-user", "mallory"),
            ("X-Remote-Group", "system:masters"),
            ("x-remote-extra-scopes", "all"),
            ("impersonate-user", "root"),
            ("host", "apiserver:6443"),
            ("connection", "keep-alive"),
            ("accept", "application/json"),
            ("user-agent", "kubectl/v1.33"),
        ] {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_static(v));
        }
        let who = Requester { name: "alice".into(), groups: vec!["devs".into(), "system:authenticated".into()] };
        let out = request_headers(&h, &who, false);
        assert_eq!(out.get("x-remote-user").unwrap(), "alice");
        let groups: Vec<&str> = out.get_all("x-remote-group").iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(groups, ["devs", "system:authenticated"]);
        for gone in ["authorization", "x-remote-extra-scopes", "impersonate-user", "host", "connection"] {
            assert!(!out.contains_key(gone), "{gone} passed");
        }
        assert_eq!(out.get("accept").unwrap(), "application/json");
        assert_eq!(out.get("user-agent").unwrap(), "kubectl/v1.33");
    }

    #[test]
    fn upgrades_keep_their_connection_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(is_upgrade(&h));
        let who = Requester { name: "a".into(), groups: vec![] };
        let out = request_headers(&h, &who, true);
        assert_eq!(out.get(header::UPGRADE).unwrap(), "websocket");
        assert!(!request_headers(&h, &who, false).contains_key(header::UPGRADE));
        assert!(!is_upgrade(&HeaderMap::new()));
    }

    #[test]
    fn ca_bundles_are_checked() {
        assert!(client_config(b"not a certificate", false, None).is_err());
        assert!(client_config(b"", true, None).is_ok());
    }
}
