//! The terminal: the page's exec WebSocket relayed to the apiserver's, as the person.
//!
//! The dashboard first opens the apiserver's WebSocket (with the person's credential; the
//! apiserver picks `v5.channel.k8s.io` or `v4.channel.k8s.io`), then accepts the page's with
//! the same protocol, so the frames (a channel byte, then data) pass through unchanged in
//! both directions. When the apiserver refuses (403, 404, a container that is not running),
//! the page's WebSocket is accepted anyway and gets the refusal as Kubernetes sends a failed
//! command's: a Status on the error channel (3), then a close — browsers do not show a
//! refused handshake's body to the page.

use axum::extract::ws::{Message as PageMessage, WebSocket, WebSocketUpgrade};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message as ApiMessage;

use crate::status::status;

/// The channel Kubernetes sends a command's end (or failure) on.
const ERROR_CHANNEL: u8 = 3;

/// A WebSocket must be opened by the dashboard's own page: browsers send the page's origin
/// with the handshake, and it must be this server's (cookies alone would let another site's
/// page open a terminal here).
pub fn same_origin(headers: &HeaderMap) -> Result<(), Response> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let origin_host = origin.split_once("://").map_or("", |(_, h)| h);
    if !host.is_empty() && origin_host == host {
        return Ok(());
    }
    Err(status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        format!("a terminal opens only from the dashboard's page, not from {origin:?}"),
    ))
}

pub async fn exec(ws: WebSocketUpgrade, client: kube::Client, target: String) -> Response {
    let request = match http::Request::get(&target).body(Vec::new()) {
        Ok(r) => r,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    match client.connect(request).await {
        Ok(conn) => {
            let protocol = if conn.supports_stream_close() { "v5.channel.k8s.io" } else { "v4.channel.k8s.io" };
            let upstream = conn.into_stream();
            ws.protocols([protocol]).on_upgrade(move |page| pipe(page, upstream))
        }
        Err(e) => {
            let st = match e {
                kube::Error::Api(s) => serde_json::to_value(&*s).unwrap_or_default(),
                other => json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("cannot open the terminal: {other}"), "reason": "ServiceUnavailable", "code": 503}),
            };
            ws.protocols(["v5.channel.k8s.io", "v4.channel.k8s.io"]).on_upgrade(move |mut page| async move {
                let mut frame = vec![ERROR_CHANNEL];
                frame.extend_from_slice(st.to_string().as_bytes());
                let _ = page.send(PageMessage::Binary(frame.into())).await;
                let _ = page.send(PageMessage::Close(None)).await;
            })
        }
    }
}

type Upstream = tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// Frames both ways until either side closes.
async fn pipe(page: WebSocket, upstream: Upstream) {
    let (mut page_tx, mut page_rx) = page.split();
    let (mut api_tx, mut api_rx) = upstream.split();
    let to_api = async {
        while let Some(Ok(m)) = page_rx.next().await {
            let m = match m {
                PageMessage::Binary(b) => ApiMessage::Binary(b),
                PageMessage::Text(t) => ApiMessage::Text(t.as_str().into()),
                PageMessage::Ping(b) => ApiMessage::Ping(b),
                PageMessage::Pong(b) => ApiMessage::Pong(b),
                PageMessage::Close(_) => break,
            };
            if api_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = api_tx.send(ApiMessage::Close(None)).await;
    };
    let to_page = async {
        while let Some(Ok(m)) = api_rx.next().await {
            let m = match m {
                ApiMessage::Binary(b) => PageMessage::Binary(b),
                ApiMessage::Text(t) => PageMessage::Text(t.as_str().into()),
                ApiMessage::Ping(b) => PageMessage::Ping(b),
                ApiMessage::Pong(b) => PageMessage::Pong(b),
                ApiMessage::Close(_) | ApiMessage::Frame(_) => break,
            };
            if page_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = page_tx.send(PageMessage::Close(None)).await;
    };
    // When the command ends, the apiserver closes: the page learns it at once. When the page
    // goes, the command's stdin closes.
    tokio::select! {
        _ = to_api => {}
        _ = to_page => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminals_open_from_the_page_only() {
        let h = |origin: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, "127.0.0.1:8443".parse().unwrap());
            if !origin.is_empty() {
                h.insert(header::ORIGIN, origin.parse().unwrap());
            }
            h
        };
        assert!(same_origin(&h("https://127.0.0.1:8443")).is_ok());
        assert!(same_origin(&h("https://evil.example")).is_err());
        assert!(same_origin(&h("")).is_err());
    }
}
