//! Connections the apiserver upgrades — `exec`, `attach`, `portforward` (SPDY or
//! WebSocket): the tenant's upgrade request goes upstream like any other (its path
//! converted, the caller impersonated), and once both sides have switched protocols the two
//! connections are spliced byte for byte. Nothing in the stream names stored objects.

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::convert::Converter;
use crate::tenant::Caller;
use crate::upstream::{read, send, Upstream};

/// Whether a request asks to switch protocols.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
}

/// Forward an upgrade request to `pq` upstream and splice the connections.
pub async fn splice(
    upstream: &Upstream,
    conv: &Converter<'_>,
    caller: &Caller,
    mut req: Request,
    pq: &str,
) -> Response {
    let from_client = hyper::upgrade::on(&mut req);
    let headers = req
        .headers()
        .iter()
        .filter(|(k, _)| {
            let k = k.as_str();
            !matches!(k, "host" | "authorization" | "content-length") && !k.starts_with("impersonate-")
        })
        .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.clone(), v.to_string())))
        .collect();
    let resp = match send(upstream, caller, req.method().clone(), pq, headers, Vec::new()).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Refused (403, 404, 400): the apiserver's Status, in the tenant's names.
        let (parts, bytes) = match read(resp).await {
            Ok(x) => x,
            Err(r) => return r,
        };
        return match serde_json::from_slice::<Value>(&bytes) {
            Ok(mut status) => {
                conv.status_down(&mut status);
                crate::answer::json_response(parts.status, &status)
            }
            Err(_) => (parts.status, bytes).into_response(),
        };
    }
    let mut out = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in resp.headers() {
        out = out.header(k, v);
    }
    let from_upstream = hyper::upgrade::on(resp);
    tokio::spawn(async move {
        match (from_client.await, from_upstream.await) {
            (Ok(client), Ok(server)) => {
                let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
                if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut server).await {
                    tracing::debug!(error = %e, "an upgraded connection ended");
                }
            }
            (c, s) => tracing::warn!(client = ?c.err(), apiserver = ?s.err(), "an upgrade did not complete"),
        }
    });
    out.body(Body::empty()).unwrap_or_else(|e| crate::answer::status(500, "InternalError", &e.to_string(), None))
}
