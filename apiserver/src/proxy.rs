//! `pods/log`: the apiserver proxies to the kubelet of the pod's node, at the Node's
//! InternalIP and `status.daemonEndpoints.kubeletEndpoint.Port`, path
//! `/containerLogs/<namespace>/<pod>/<container>`, and streams the answer back.
//!
//! `pods/exec`, `pods/attach` and `pods/portforward`: an upgrade-aware proxy ([`stream`]).
//! The request (method, query, `Connection`/`Upgrade`/`Sec-WebSocket-*`/
//! `X-Stream-Protocol-Version` headers) goes to the kubelet's `/exec`, `/attach` or
//! `/portForward` path; when the kubelet answers `101 Switching Protocols` the client gets the
//! same 101 and the two upgraded connections are spliced byte for byte, so WebSocket
//! (`v5.channel.k8s.io`, kubectl ≥ 1.30, the `kube` crate) and SPDY/3.1 (older kubectl, and
//! `kubectl port-forward`, which uses this same path) pass through unchanged. Any other answer
//! is returned as is.
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
    let ephemeral = names("/spec/ephemeralContainers");
    match requested.filter(|c| !c.is_empty()) {
        Some(c) if app.iter().chain(&init).chain(&ephemeral).any(|x| x == c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::bad_request(format!("container {c} is not valid for pod {name}"))),
        None if app.len() == 1 => Ok(app[0].clone()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]{}{}",
            app.join(" "),
            if init.is_empty() {
                String::new()
            } else {
                format!(" or one of the init containers: [{}]", init.join(" "))
            },
            if ephemeral.is_empty() {
                String::new()
            } else {
                format!(" or one of the ephemeral containers: [{}]", ephemeral.join(" "))
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

/// The streaming subresources proxied through an upgrade ([`stream`]).
pub fn is_stream_subresource(rp: &crate::requestinfo::ResourcePath) -> bool {
    rp.group.is_empty()
        && rp.resource == "pods"
        && matches!(rp.subresource.as_deref(), Some("exec" | "attach" | "portforward"))
}

/// The container an exec/attach request is for: the `container` parameter, else the
/// `kubectl.kubernetes.io/default-container` annotation (when it names a container), else
/// the pod's only container (Kubernetes' `validateContainer` rules and messages).
pub fn stream_container(pod: &Value, requested: Option<&str>) -> ApiResult<String> {
    let requested = requested.filter(|c| !c.is_empty());
    if requested.is_none() {
        if let Some(d) =
            pod.pointer("/metadata/annotations/kubectl.kubernetes.io~1default-container").and_then(Value::as_str)
        {
            if let Ok(c) = log_container(pod, Some(d)) {
                return Ok(c);
            }
        }
        let none = pod.pointer("/spec/containers").and_then(Value::as_array).is_none_or(|a| a.is_empty());
        if none {
            let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            return Err(ApiError::bad_request(format!("a container name must be specified for pod {name}")));
        }
    }
    log_container(pod, requested)
}

/// The values of `key` in a raw query string, in order (`command=` repeats).
pub fn query_values(raw: &str, key: &str) -> Vec<String> {
    raw.split('&')
        .filter_map(|p| p.split_once('=').or(Some((p, ""))))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| crate::server::percent_decode(v))
        .collect()
}

/// The kubelet path a streaming request goes to (`raw_query` passed through).
pub fn kubelet_stream_path(sub: &str, ns: &str, pod: &str, container: &str, raw_query: &str) -> String {
    let q = if raw_query.is_empty() { String::new() } else { format!("?{raw_query}") };
    match sub {
        "portforward" => format!("/portForward/{ns}/{pod}{q}"),
        _ => format!("/{sub}/{ns}/{pod}/{container}{q}"),
    }
}

/// Whether a client header is passed on to the kubelet: everything but the ones naming this
/// hop (Host, credentials, body framing — the proxied request has no body).
pub fn forwarded_header(name: &str) -> bool {
    !matches!(
        name.to_ascii_lowercase().as_str(),
        "host" | "authorization" | "proxy-authorization" | "content-length" | "transfer-encoding" | "cookie"
    )
}

/// `pods/{exec,attach,portforward}`: resolve the pod's kubelet and proxy the upgrade
/// (`kubectl port-forward` goes through here too, to the kubelet's `/portForward`).
pub async fn stream(
    state: &crate::server::AppState,
    parts: &mut http::request::Parts,
    rp: &crate::requestinfo::ResourcePath,
) -> ApiResult<Response> {
    use http::Method;
    let sub = rp.subresource.as_deref().unwrap_or_default();
    if parts.method != Method::GET && parts.method != Method::POST {
        return Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"));
    }
    let (Some(ns), Some(name)) = (rp.namespace.as_deref(), rp.name.as_deref()) else {
        return Err(ApiError::not_found_message("the server could not find the requested resource"));
    };
    let pods = crate::resources::find("", "v1", "pods").ok_or_else(|| ApiError::internal("no pods resource"))?;
    let pod = state.registry.get(pods, ns, name).await?;
    let raw_query = parts.uri.query().unwrap_or_default().to_string();
    let container = if sub == "portforward" {
        String::new()
    } else {
        let requested = query_values(&raw_query, "container").into_iter().next();
        stream_container(&pod, requested.as_deref())?
    };
    let node_name = pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default();
    if node_name.is_empty() {
        return Err(ApiError::bad_request(format!("pod {name} does not have a host assigned")));
    }
    let nodes = crate::resources::find("", "v1", "nodes").ok_or_else(|| ApiError::internal("no nodes resource"))?;
    let node = state.registry.get(nodes, "", node_name).await?;
    let (host, port) = kubelet_address(&node)?;
    let path = kubelet_stream_path(sub, ns, name, &container, &raw_query);
    proxy_upgrade(&host, port, &path, parts).await
}

/// Send the request to the kubelet; on 101 splice the two upgraded connections.
async fn proxy_upgrade(host: &str, port: u16, path: &str, parts: &mut http::request::Parts) -> ApiResult<Response> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::TokioIo;
    let unavailable = |e: &dyn std::fmt::Display| {
        ApiError::new(503, "ServiceUnavailable", format!("error dialing the kubelet at {host}:{port}: {e}"))
    };
    let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| unavailable(&e))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.map_err(|e| unavailable(&e))?;
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

    #[test]
    fn stream_container_rules() {
        let two = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        assert_eq!(stream_container(&two, Some("b")).unwrap(), "b");
        let e = stream_container(&two, None).unwrap_err();
        assert_eq!(e.message, "a container name must be specified for pod p, choose one of: [a b]");
        assert_eq!(stream_container(&two, Some("z")).unwrap_err().message, "container z is not valid for pod p");
        let mut debugged = two.clone();
        debugged["spec"]["ephemeralContainers"] = json!([{"name": "debugger"}]);
        assert_eq!(stream_container(&debugged, Some("debugger")).unwrap(), "debugger");
        assert!(stream_container(&debugged, None)
            .unwrap_err()
            .message
            .ends_with(" or one of the ephemeral containers: [debugger]"));
        let mut annotated = two.clone();
        annotated["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/default-container": "b"});
        assert_eq!(stream_container(&annotated, None).unwrap(), "b");
        annotated["metadata"]["annotations"] = json!({"kubectl.kubernetes.io/default-container": "gone"});
        assert_eq!(stream_container(&annotated, None).unwrap_err().code, 400);
        let empty = json!({"metadata": {"name": "p"}, "spec": {"containers": []}});
        assert_eq!(stream_container(&empty, None).unwrap_err().message, "a container name must be specified for pod p");
    }

    #[test]
    fn stream_paths_and_query() {
        let q = "command=sh&command=-c&command=echo%20hi%26&container=c&stdout=true";
        assert_eq!(query_values(q, "command"), vec!["sh", "-c", "echo hi&"]);
        assert_eq!(query_values(q, "container"), vec!["c"]);
        assert_eq!(kubelet_stream_path("exec", "ns", "p", "c", q), format!("/exec/ns/p/c?{q}"));
        assert_eq!(kubelet_stream_path("attach", "ns", "p", "c", ""), "/attach/ns/p/c");
        assert_eq!(kubelet_stream_path("portforward", "ns", "p", "", "ports=80"), "/portForward/ns/p?ports=80");
        assert!(forwarded_header("Sec-WebSocket-Protocol") && forwarded_header("X-Stream-Protocol-Version"));
        assert!(forwarded_header("Upgrade") && forwarded_header("Connection"));
        assert!(!forwarded_header("Authorization") && !forwarded_header("host"));
    }
}
