//! One HTTPS POST of an AdmissionReview to a webhook: the server's certificate verified
//! against the configuration's `caBundle`, the whole exchange bounded by the webhook's
//! `timeoutSeconds`. Errors are worded as Kubernetes words a failed call
//! (`failed to call webhook: Post "<url>": <why>`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::RootCertStore;

/// Where to connect and what the certificate must name.
pub struct Target {
    /// `https://…` as the error messages show it.
    pub url: String,
    pub connect: (String, u16),
    /// The name the certificate must carry (a DNS name or an IP address).
    pub server_name: String,
    /// Path and query of the request.
    pub path: String,
}

/// Parse `https://host[:port][/path][?query]`.
pub fn parse_url(url: &str) -> Result<Target, String> {
    let rest = url.strip_prefix("https://").ok_or_else(|| format!("webhook URL {url:?} is not https"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => match rest.find('?') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        },
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or_else(|| format!("bad host in {url:?}"))?;
        let port = after.strip_prefix(':').map(str::parse::<u16>).transpose().map_err(|e| e.to_string())?;
        (h.to_string(), port.unwrap_or(443))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse::<u16>().map_err(|e| format!("bad port in {url:?}: {e}"))?),
            None => (authority.to_string(), 443),
        }
    };
    if host.is_empty() {
        return Err(format!("webhook URL {url:?} has no host"));
    }
    let path = if path.starts_with('?') { format!("/{path}") } else { path.to_string() };
    Ok(Target { url: url.to_string(), connect: (host.clone(), port), server_name: host, path })
}

/// POST `body` and return the answer's body; `Err` is the reason the call failed.
pub async fn post(target: &Target, ca_bundle: &[u8], body: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, String> {
    let fail = |why: String| format!("failed to call webhook: Post \"{}\": {why}", target.url);
    match tokio::time::timeout(timeout, exchange(target, ca_bundle, body)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(why)) => Err(fail(why)),
        Err(_) => Err(fail("context deadline exceeded".into())),
    }
}

fn roots(ca_bundle: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for cert in CertificateDer::pem_slice_iter(ca_bundle) {
        let cert = cert.map_err(|e| format!("caBundle: {e}"))?;
        roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
    }
    Ok(roots)
}

async fn exchange(target: &Target, ca_bundle: &[u8], body: Vec<u8>) -> Result<Vec<u8>, String> {
    let config = common::tls::client_config(Some(roots(ca_bundle)?), None).map_err(|e| e.to_string())?;
    let name = ServerName::try_from(target.server_name.clone()).map_err(|e| e.to_string())?;
    let (host, port) = (&target.connect.0, target.connect.1);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("dial tcp {host}:{port}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls: failed to verify certificate: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::post(target.path.as_str())
        .header(http::header::HOST, format!("{}:{}", target.server_name, port))
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json, */*")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    if !status.is_success() {
        let text = String::from_utf8_lossy(&bytes);
        return Err(format!(
            "the server responded with the status code {} but did not return more information: {}",
            status.as_u16(),
            text.trim()
        ));
    }
    Ok(bytes.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_host_port_and_path() {
        let t = parse_url("https://10.0.0.5:15017/inject?timeout=10s").unwrap();
        assert_eq!(t.connect, ("10.0.0.5".to_string(), 15017));
        assert_eq!(t.path, "/inject?timeout=10s");
        let t = parse_url("https://hooks.example.com").unwrap();
        assert_eq!((t.connect.1, t.path.as_str()), (443, "/"));
        let t = parse_url("https://[::1]:8443/v").unwrap();
        assert_eq!(t.connect, ("::1".to_string(), 8443));
        assert!(parse_url("http://x/").is_err());
    }
}
