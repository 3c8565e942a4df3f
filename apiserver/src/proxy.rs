//! `pods/log`: the apiserver proxies to the kubelet of the pod's node, at the Node's
//! InternalIP and `status.daemonEndpoints.kubeletEndpoint.Port`, path
//! `/containerLogs/<namespace>/<pod>/<container>`, and streams the answer back.
//!
//! The decisions (which container, which address, which query) are pure functions; the I/O
//! is one HTTP/1.0 request over a TCP connection (the body is the rest of the stream).

use std::collections::HashMap;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::error::{ApiError, ApiResult};

/// Kubernetes' default kubelet port.
pub const DEFAULT_KUBELET_PORT: i64 = 10250;

/// The container a log request is for: the `container` parameter, or the pod's only container.
pub fn log_container(pod: &Value, requested: Option<&str>) -> ApiResult<String> {
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let names = |p: &str| -> Vec<String> {
        pod.pointer(p)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(String::from))
            .collect()
    };
    let app = names("/spec/containers");
    let init = names("/spec/initContainers");
    match requested.filter(|c| !c.is_empty()) {
        Some(c) if app.iter().chain(init.iter()).any(|x| x == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!("container {c} is not valid for pod {name}"))),
        None if app.len() == 1 => Ok(app[0].clone()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]{}",
            app.join(" "),
            if init.is_empty() {
                String::new()
            } else {
                format!(" or one of the init containers: [{}]", init.join(" "))
            }
        ))),
    }
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

/// The query passed on to the kubelet (the log options it understands).
pub fn log_query(query: &HashMap<String, String>) -> String {
    let mut parts = Vec::new();
    for k in ["follow", "previous", "timestamps", "tailLines", "sinceSeconds", "limitBytes", "sinceTime"] {
        if let Some(v) = query.get(k).filter(|v| !v.is_empty()) {
            parts.push(format!("{k}={}", v.replace(['&', ' ', '#'], "")));
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// GET `path` from the kubelet and stream the body back as `text/plain`.
pub async fn proxy_get(host: &str, port: u16, path: &str) -> ApiResult<Response> {
    let unavailable = |e: std::io::Error| {
        ApiError::new(503, "ServiceUnavailable", format!("error dialing the kubelet at {host}:{port}: {e}"))
    };
    let stream = tokio::net::TcpStream::connect((host, port)).await.map_err(unavailable)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn picks_the_container() {
        let one = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(log_container(&one, None).unwrap(), "a");
        let two = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let e = log_container(&two, None).unwrap_err();
        assert_eq!(e.message, "a container name must be specified for pod p, choose one of: [a b]");
        assert_eq!(log_container(&two, Some("b")).unwrap(), "b");
        assert_eq!(log_container(&two, Some("z")).unwrap_err().code, 400);
    }

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
    fn passes_log_options() {
        let q: HashMap<String, String> = [("follow", "true"), ("tailLines", "5"), ("container", "x")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let s = log_query(&q);
        assert!(
            s.starts_with('?') && s.contains("follow=true") && s.contains("tailLines=5") && !s.contains("container")
        );
    }
}
