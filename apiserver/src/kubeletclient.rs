//! Talking to kubelets: the address of a Node's kubelet (its `InternalIP` and
//! `status.daemonEndpoints.kubeletEndpoint.Port`), a streamed GET (logs, `/stats/summary`,
//! `nodes/<n>/proxy`), and an upgrade-aware proxy for exec, attach and port-forward: the
//! request (method, query, `Connection`/`Upgrade`/`Sec-WebSocket-*`/
//! `X-Stream-Protocol-Version` headers) goes to the kubelet; when it answers `101 Switching
//! Protocols` the client gets the same 101 and the two upgraded connections are spliced byte
//! for byte, so WebSocket (`v5.channel.k8s.io`, kubectl ≥ 1.30, the `kube` crate) and
//! SPDY/3.1 (older kubectl, and `kubectl port-forward`) pass through unchanged. Any other
//! answer is returned as is.
//!
//! Kubelets serve HTTPS ([`connect`]). The apiserver presents `--kubelet-client-certificate`
//! (the kubelet authenticates it and asks for nothing more) and verifies the kubelet's
//! certificate only against `--kubelet-certificate-authority`; without one, as
//! kube-apiserver, it accepts whatever certificate a kubelet shows (kubelets sign their
//! own). Without a CA, an endpoint that answers the TLS handshake in plain HTTP is then
//! spoken to in plain HTTP: the Koupleless bases' arklets that stand in for the kubelets of
//! virtual nodes serve their logs that way, and nothing is lost — without a CA the
//! kubelet's identity is not checked either way.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::Value;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::error::{ApiError, ApiResult};
use crate::registry::generic::Registry;
use crate::registry::ResourceDef;

/// How the apiserver speaks to kubelets.
pub struct KubeletTls {
    config: Arc<rustls::ClientConfig>,
    /// Whether kubelets' certificates are verified (`--kubelet-certificate-authority`).
    verifies: bool,
}

static TLS: OnceLock<KubeletTls> = OnceLock::new();

/// Configure the kubelet client from kube-apiserver's flags (once, at start; later calls
/// are ignored): `--kubelet-client-certificate`/`--kubelet-client-key` and
/// `--kubelet-certificate-authority`.
pub fn configure(identity: Option<(&Path, &Path)>, ca: Option<&Path>) -> Result<(), common::tls::TlsError> {
    let identity = identity
        .map(|(cert, key)| {
            Ok::<_, common::tls::TlsError>((
                common::tls::read_certificates("--kubelet-client-certificate", cert)?,
                common::tls::read_private_key("--kubelet-client-key", key)?,
            ))
        })
        .transpose()?;
    let roots = ca.map(|p| common::tls::read_roots("--kubelet-certificate-authority", p)).transpose()?;
    let verifies = roots.is_some();
    let config = common::tls::client_config(roots, identity)?;
    let _ = TLS.set(KubeletTls { config, verifies });
    Ok(())
}

fn tls() -> Result<&'static KubeletTls, common::tls::TlsError> {
    if let Some(t) = TLS.get() {
        return Ok(t);
    }
    let config = common::tls::client_config(None, None)?;
    Ok(TLS.get_or_init(|| KubeletTls { config, verifies: false }))
}

/// A connection to a kubelet.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Whether a failed handshake means the peer speaks plain HTTP (its answer is no TLS record).
fn not_tls(e: &std::io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::InvalidMessage(_)))
}

/// Connect to the kubelet at `host:port` over TLS (see the module's notes on plain HTTP).
pub async fn connect(host: &str, port: u16) -> ApiResult<Box<dyn Io>> {
    let unavailable = |e: &dyn std::fmt::Display| {
        ApiError::new(503, "ServiceUnavailable", format!("error dialing the kubelet at {host}:{port}: {e}"))
    };
    let tls = tls().map_err(|e| ApiError::internal(e.to_string()))?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| unavailable(&e))?;
    let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| unavailable(&e))?;
    match tokio_rustls::TlsConnector::from(tls.config.clone()).connect(name, tcp).await {
        Ok(stream) => Ok(Box::new(stream)),
        Err(e) if !tls.verifies && not_tls(&e) => {
            tracing::debug!(host, port, "the kubelet endpoint speaks plain HTTP");
            let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| unavailable(&e))?;
            Ok(Box::new(tcp))
        }
        Err(e) => Err(unavailable(&format!("TLS handshake: {e}"))),
    }
}

/// Kubernetes' default kubelet port.
pub const DEFAULT_KUBELET_PORT: i64 = 10250;

/// The kubelet address of the Node named `node_name` (`nodes` is the Node resource).
pub async fn address_of(reg: &Registry, nodes: &ResourceDef, node_name: &str) -> ApiResult<(String, u16)> {
    kubelet_address(&reg.get(nodes, "", node_name).await?)
}

/// The kubelet address of a Node: `InternalIP` (else the first address) and the kubelet port.
pub fn kubelet_address(node: &Value) -> ApiResult<(String, u16)> {
    let name = node.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let addrs: Vec<(&str, &str)> = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| Some((a.get("type")?.as_str()?, a.get("address")?.as_str()?)))
        .collect();
    let ip = ["InternalIP", "ExternalIP", "Hostname"]
        .iter()
        .find_map(|t| addrs.iter().find(|(ty, _)| ty == t).map(|(_, a)| *a))
        .ok_or_else(|| {
            ApiError::new(503, "ServiceUnavailable", format!("no preferred addresses found for node {name}"))
        })?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_i64)
        .filter(|p| *p > 0 && *p < 65536)
        .unwrap_or(DEFAULT_KUBELET_PORT);
    Ok((ip.to_string(), port as u16))
}

/// GET `path` from the kubelet and stream the body back as `text/plain`.
pub async fn proxy_get(host: &str, port: u16, path: &str) -> ApiResult<Response> {
    let unavailable = |e: std::io::Error| {
        ApiError::new(503, "ServiceUnavailable", format!("error dialing the kubelet at {host}:{port}: {e}"))
    };
    let stream = connect(host, port).await?;
    let mut reader = BufReader::new(stream);
    let req = format!("GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: minik8s-apiserver\r\n\r\n");
    reader.get_mut().write_all(req.as_bytes()).await.map_err(unavailable)?;
    let mut status_line = String::new();
    reader.read_line(&mut status_line).await.map_err(unavailable)?;
    let code: u16 = status_line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(502);
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).await.map_err(unavailable)?;
        if n == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    if code != 200 {
        let mut body = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut body).await;
        let msg = String::from_utf8_lossy(&body).trim().to_string();
        return Err(match code {
            // The kubelet refused the apiserver itself (no or a wrong kubelet client certificate).
            401 => ApiError::new(401, "Unauthorized", msg),
            403 => ApiError::new(403, "Forbidden", msg),
            404 => ApiError::bad_request(msg),
            400..=499 => ApiError::bad_request(msg),
            _ => ApiError::internal(msg),
        });
    }
    let body = Body::from_stream(tokio_util_stream(reader));
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(resp)
}

/// The rest of a reader as a byte stream.
fn tokio_util_stream<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
    mut r: R,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send {
    futures::stream::poll_fn(move |cx| {
        let mut buf = [0u8; 8192];
        let mut rb = tokio::io::ReadBuf::new(&mut buf);
        match std::pin::Pin::new(&mut r).poll_read(cx, &mut rb) {
            std::task::Poll::Ready(Ok(())) if rb.filled().is_empty() => std::task::Poll::Ready(None),
            std::task::Poll::Ready(Ok(())) => {
                std::task::Poll::Ready(Some(Ok(bytes::Bytes::copy_from_slice(rb.filled()))))
            }
            std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Some(Err(e))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    })
}

/// Whether a client header is passed on to the kubelet: everything but the ones naming this
/// hop (Host, credentials, body framing — the proxied request has no body).
pub fn forwarded_header(name: &str) -> bool {
    !matches!(
        name.to_ascii_lowercase().as_str(),
        "host" | "authorization" | "proxy-authorization" | "content-length" | "transfer-encoding" | "cookie"
    )
}

/// Send the request to the kubelet; on 101 splice the two upgraded connections.
pub async fn proxy_upgrade(host: &str, port: u16, path: &str, parts: &mut http::request::Parts) -> ApiResult<Response> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::TokioIo;
    let unavailable = |e: &dyn std::fmt::Display| {
        ApiError::new(503, "ServiceUnavailable", format!("error dialing the kubelet at {host}:{port}: {e}"))
    };
    let stream = connect(host, port).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| unavailable(&e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "kubelet stream connection ended");
        }
    });
    let mut req = http::Request::builder().method(parts.method.clone()).uri(path);
    for (k, v) in parts.headers.iter().filter(|(k, _)| forwarded_header(k.as_str())) {
        req = req.header(k, v);
    }
    let req = req
        .header(header::HOST, format!("{host}:{port}"))
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut resp = sender.send_request(req).await.map_err(|e| unavailable(&e))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let mut out = Response::new(Body::from(body));
        *out.status_mut() = status;
        for k in [header::CONTENT_TYPE] {
            if let Some(v) = headers.get(&k) {
                out.headers_mut().insert(k, v.clone());
            }
        }
        return Ok(out);
    }
    let Some(client_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
        return Err(ApiError::bad_request("the request could not be upgraded (no Connection: Upgrade)"));
    };
    let kubelet_upgrade = hyper::upgrade::on(&mut resp);
    let mut out = Response::new(Body::empty());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    for (k, v) in resp.headers() {
        out.headers_mut().append(k, v.clone());
    }
    tokio::spawn(async move {
        let (client, kubelet) = match tokio::try_join!(client_upgrade, kubelet_upgrade) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "stream upgrade failed");
                return;
            }
        };
        let (mut a, mut b) = (TokioIo::new(client), TokioIo::new(kubelet));
        match tokio::io::copy_bidirectional(&mut a, &mut b).await {
            Ok((up, down)) => tracing::debug!(up, down, "stream closed"),
            Err(e) => tracing::debug!(error = %e, "stream ended"),
        }
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_kubelet() {
        let node = json!({"metadata": {"name": "n"}, "status": {
            "addresses": [{"type": "Hostname", "address": "n"}, {"type": "InternalIP", "address": "10.0.0.5"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10555}}}});
        assert_eq!(kubelet_address(&node).unwrap(), ("10.0.0.5".to_string(), 10555));
        let bare =
            json!({"metadata": {"name": "n"}, "status": {"addresses": [{"type": "InternalIP", "address": "1.2.3.4"}]}});
        assert_eq!(kubelet_address(&bare).unwrap().1, 10250);
        assert_eq!(kubelet_address(&json!({})).unwrap_err().code, 503);
    }

    #[test]
    fn passes_the_stream_headers_but_not_this_hop_s() {
        assert!(forwarded_header("Sec-WebSocket-Protocol") && forwarded_header("X-Stream-Protocol-Version"));
        assert!(forwarded_header("Upgrade") && forwarded_header("Connection"));
        assert!(!forwarded_header("Authorization") && !forwarded_header("host"));
    }
}
