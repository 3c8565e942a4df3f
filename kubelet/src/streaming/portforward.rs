//! `/portForward/{namespace}/{pod}[/{uid}]`: the kubelet's port forwarding, over the three
//! transports clients use.
//!
//! - SPDY/3.1 (`Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version: portforward.k8s.io`), the
//!   protocol of kubectl and client-go: per forwarded connection the client opens an error
//!   stream and a data stream carrying `streamType`, `port` and `requestID` headers.
//! - The same SPDY tunnelled through a WebSocket (subprotocol `SPDY/3.1+portforward.k8s.io`,
//!   kubectl ≥ 1.31): SPDY's bytes travel in binary messages, boundaries meaningless.
//! - WebSocket channels (`v4.channel.k8s.io`, kube-rs): `port=`/`ports=` in the query; per port
//!   a data channel 2i and an error channel 2i+1; each message is `channel byte + payload`,
//!   and the server's first message on each channel is the port, 2 bytes little-endian.
//!
//! Every data stream is one TCP connection to `localhost:port` made from inside the pod's
//! network namespace (the pause container's), so servers bound to 127.0.0.1 in the pod are
//! reachable; for hostNetwork pods that namespace is the host's. A failed dial is reported on
//! the error stream as the kubelet words it; the connection stays usable.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::spdy;

/// The SPDY sub-protocol of port forwarding.
pub const PROTOCOL_V1: &str = "portforward.k8s.io";
/// The WebSocket subprotocol of SPDY tunnelled through a WebSocket.
pub const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// WebSocket channel protocols (kube-rs uses the binary v4 one; "" is the legacy default).
pub const WS_BINARY_PROTOCOL: &str = "v4.channel.k8s.io";
pub const WS_BASE64_PROTOCOL: &str = "v4.base64.channel.k8s.io";

/// How long the second stream of a pair may lag behind the first (kubelet's default).
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the pod's side of a forwarded connection may keep sending after the client's
/// side ended (its answer to what the client sent last).
const LINGER: Duration = Duration::from_secs(1);
/// How long the client's side may keep sending after the pod closed its socket.
const LINGER_AFTER_POD_CLOSE: Duration = Duration::from_millis(100);

/// Where to forward: the pod's sandbox.
#[derive(Debug, Clone)]
pub struct Target {
    /// The pause container's id (kubelet error messages name the sandbox).
    pub sandbox_id: String,
    pub pod_uid: String,
    /// A process in the pod's network namespace.
    pub pid: i64,
}

// ---------------------------------------------------------------------------------------------
// Dialing inside the pod's network namespace.

/// Connect to `localhost:port` inside the network namespace of process `pid`. The socket is
/// created by a short-lived thread that joined the namespace; it stays in that namespace.
pub async fn dial(target: &Target, port: u16) -> Result<TcpStream, String> {
    let path = format!("/proc/{}/ns/net", target.pid);
    let ns =
        std::fs::File::open(&path).map_err(|e| format!("failed to open the pod's network namespace {path}: {e}"))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sandbox = target.sandbox_id.clone();
    std::thread::Builder::new()
        .name("portforward-dial".into())
        .spawn(move || {
            // SAFETY: setns on this thread only, with a namespace fd that outlives the call; the
            // thread ends right after dialing, so nothing else ever runs in the namespace.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            let res = if rc != 0 {
                Err(format!(
                    "failed to enter the network namespace of sandbox {sandbox}: {}",
                    std::io::Error::last_os_error()
                ))
            } else {
                connect_localhost(port, &sandbox)
            };
            let _ = tx.send(res);
        })
        .map_err(|e| format!("cannot start the dialing thread: {e}"))?;
    let std_stream = rx.await.map_err(|_| "the dialing thread died".to_string())??;
    std_stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    TcpStream::from_std(std_stream).map_err(|e| e.to_string())
}

/// `localhost:port`, IPv4 first then IPv6, with containerd's wording on failure.
fn connect_localhost(port: u16, sandbox: &str) -> Result<std::net::TcpStream, String> {
    let timeout = Duration::from_secs(10);
    let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let e4 = match std::net::TcpStream::connect_timeout(&v4, timeout) {
        Ok(s) => return Ok(s),
        Err(e) => e,
    };
    let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
    let e6 = match std::net::TcpStream::connect_timeout(&v6, timeout) {
        Ok(s) => return Ok(s),
        Err(e) => e,
    };
    Err(format!(
        "failed to connect to localhost:{port} inside namespace \"{sandbox}\", IPv4: dial tcp4 {v4}: connect: {} IPv6 dial tcp6 {v6}: connect: {}",
        io_words(&e4),
        io_words(&e6)
    ))
}

/// Go's lower-case wording of socket errors ("connection refused").
fn io_words(e: &std::io::Error) -> String {
    let s = e.to_string();
    let s = s.split(" (os error").next().unwrap_or_default();
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

/// The message the kubelet writes on the error stream.
pub fn forward_error(port: u16, target: &Target, err: &str) -> String {
    format!("error forwarding port {port} to pod {}, uid {}: {err}", target.sandbox_id, target.pod_uid)
}

// ---------------------------------------------------------------------------------------------
// SPDY stream bookkeeping (pure).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Error,
    Data,
}

/// What a SPDY stream's headers say it is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    pub kind: StreamKind,
    pub port: u16,
    pub request_id: String,
}

/// Read a stream's headers. Clients without `requestID` (before Kubernetes 1.6) pair the
/// error stream N with data stream N+2, so both get request id "N" for the error stream's N.
pub fn stream_info(stream_id: u32, headers: &spdy::Headers) -> Result<StreamInfo, String> {
    let kind = match spdy::header(headers, "streamType") {
        Some("error") => StreamKind::Error,
        Some("data") => StreamKind::Data,
        Some(other) => return Err(format!("invalid stream type {other:?}")),
        None => return Err("streamType header is missing".into()),
    };
    let port = spdy::header(headers, "port").ok_or("port header is missing")?;
    let port: u16 = match port.parse() {
        Ok(p) if p > 0 => p,
        _ => return Err(format!("unable to parse {port:?} as a port: invalid port")),
    };
    let request_id = match spdy::header(headers, "requestID") {
        Some(r) => r.to_string(),
        None => match kind {
            StreamKind::Error => stream_id.to_string(),
            StreamKind::Data => stream_id.saturating_sub(2).to_string(),
        },
    };
    Ok(StreamInfo { kind, port, request_id })
}

/// Error and data streams waiting for their partner, by request id.
pub struct Pairs<S> {
    pending: HashMap<String, Pending<S>>,
}

struct Pending<S> {
    since: Instant,
    port: u16,
    error: Option<S>,
    data: Option<S>,
}

/// A complete request: both streams for one forwarded connection.
#[derive(Debug)]
pub struct Pair<S> {
    pub request_id: String,
    pub port: u16,
    pub error: S,
    pub data: S,
}

impl<S> Default for Pairs<S> {
    fn default() -> Self {
        Pairs { pending: HashMap::new() }
    }
}

impl<S> Pairs<S> {
    /// Add a stream; returns the pair once both streams of its request are there. A second
    /// stream of the same kind for a pending request is refused (returned back as `Err`).
    pub fn add(&mut self, info: StreamInfo, stream: S, now: Instant) -> Result<Option<Pair<S>>, S> {
        let p = self.pending.entry(info.request_id.clone()).or_insert(Pending {
            since: now,
            port: info.port,
            error: None,
            data: None,
        });
        let slot = match info.kind {
            StreamKind::Error => &mut p.error,
            StreamKind::Data => &mut p.data,
        };
        if slot.is_some() {
            return Err(stream);
        }
        *slot = Some(stream);
        if p.error.is_none() || p.data.is_none() {
            return Ok(None);
        }
        match self.pending.remove(&info.request_id) {
            Some(Pending { port, error: Some(error), data: Some(data), .. }) => {
                Ok(Some(Pair { request_id: info.request_id, port, error, data }))
            }
            _ => Ok(None),
        }
    }

    /// Remove and return the streams of requests whose partner did not arrive in time.
    pub fn expire(&mut self, now: Instant, timeout: Duration) -> Vec<(String, Vec<S>)> {
        let old: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.since) >= timeout)
            .map(|(k, _)| k.clone())
            .collect();
        old.into_iter()
            .filter_map(|k| self.pending.remove(&k).map(|p| (k, p.error.into_iter().chain(p.data).collect())))
            .collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pending.len()
    }
}

// ---------------------------------------------------------------------------------------------
// SPDY.

/// Serve port forwarding on an established SPDY connection (plain or tunnelled).
pub async fn serve_spdy<T>(io: T, target: Target)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (mut streams, _conn) = spdy::serve(io);
    let mut pairs: Pairs<spdy::Stream> = Pairs::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            s = streams.recv() => {
                let Some(stream) = s else { break };
                let info = match stream_info(stream.id, &stream.headers) {
                    Ok(i) => i,
                    Err(e) => {
                        tracing::debug!(error = %e, "port-forward: bad stream");
                        let _ = stream.writer.reset().await;
                        continue;
                    }
                };
                match pairs.add(info, stream, Instant::now()) {
                    Ok(Some(pair)) => {
                        tokio::spawn(forward_pair(pair, target.clone()));
                    }
                    Ok(None) => {}
                    Err(dup) => {
                        let _ = dup.writer.reset().await;
                    }
                }
            }
            _ = tick.tick() => {
                for (id, streams) in pairs.expire(Instant::now(), STREAM_CREATION_TIMEOUT) {
                    tracing::debug!(request_id = %id, "port-forward: timed out waiting for the partner stream");
                    for s in streams {
                        let _ = s.writer.reset().await;
                    }
                }
            }
        }
    }
}

/// One forwarded connection: dial, then copy both ways; errors go on the error stream.
async fn forward_pair(pair: Pair<spdy::Stream>, target: Target) {
    let Pair { port, error, mut data, request_id } = pair;
    tracing::debug!(port, %request_id, pod_uid = %target.pod_uid, "port-forward connection");
    match dial(&target, port).await {
        Err(e) => {
            let msg = forward_error(port, &target, &e);
            tracing::info!(port, error = %msg, "port-forward failed");
            let _ = error.writer.write(msg.as_bytes()).await;
        }
        Ok(tcp) => {
            let (mut rd, mut wr) = tcp.into_split();
            let to_pod = async {
                while let Some(b) = data.data.recv().await {
                    if wr.write_all(&b).await.is_err() {
                        break;
                    }
                }
                let _ = wr.shutdown().await;
            };
            let writer = data.writer.clone();
            let from_pod = async move {
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    match rd.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if writer.write(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = writer.close().await;
            };
            // As containerd (and socat before it) does: once either direction ends, give the
            // other a moment, then close everything. Older kubectl closes its local connection
            // only when the error stream ends, and half-closes its side only then: a pod that
            // closed its socket has said all it will, so that case lingers only briefly.
            tokio::pin!(to_pod, from_pod);
            tokio::select! {
                _ = &mut to_pod => { let _ = tokio::time::timeout(LINGER, &mut from_pod).await; }
                _ = &mut from_pod => { let _ = tokio::time::timeout(LINGER_AFTER_POD_CLOSE, &mut to_pod).await; }
            }
        }
    }
    let _ = data.writer.close().await;
    let _ = error.writer.close().await;
}

// ---------------------------------------------------------------------------------------------
// WebSocket channels (v4.channel.k8s.io).

/// The ports of a WebSocket request: every `port`/`ports` query value, comma-separated lists
/// allowed (the apiserver sends `port=`, clients of the apiserver `ports=`).
pub fn query_ports(query: &str) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for (k, v) in query.split('&').filter_map(|kv| kv.split_once('=')) {
        if k != "port" && k != "ports" {
            continue;
        }
        if v.is_empty() {
            return Err(format!("query parameter {k:?} cannot be empty"));
        }
        for p in v.split("%2C").flat_map(|s| s.split(',')) {
            match p.parse::<u16>() {
                Ok(n) if n > 0 => ports.push(n),
                Ok(_) => return Err(format!("port {p:?} must be > 0")),
                Err(_) => return Err(format!("unable to parse {p:?} as a port")),
            }
        }
    }
    if ports.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    Ok(ports)
}

/// A message on channel `ch` (binary, or the base64 protocol's text form).
fn channel_message(ch: u8, payload: &[u8], base64: bool) -> Message {
    if base64 {
        use base64::Engine;
        let mut s = String::with_capacity(1 + payload.len() * 4 / 3 + 4);
        s.push((b'0' + ch) as char);
        s.push_str(&base64::engine::general_purpose::STANDARD.encode(payload));
        Message::Text(s.into())
    } else {
        let mut v = Vec::with_capacity(payload.len() + 1);
        v.push(ch);
        v.extend_from_slice(payload);
        Message::Binary(v.into())
    }
}

/// Split a client message into (channel, payload).
fn parse_channel_message(m: Message, base64: bool) -> Option<(u8, Vec<u8>)> {
    match m {
        Message::Binary(b) if !b.is_empty() && !base64 => Some((b[0], b[1..].to_vec())),
        Message::Text(t) if base64 && !t.is_empty() => {
            use base64::Engine;
            let b = t.as_bytes();
            let ch = b[0].checked_sub(b'0')?;
            let data = base64::engine::general_purpose::STANDARD.decode(&b[1..]).ok()?;
            Some((ch, data))
        }
        _ => None,
    }
}

/// Serve the channel protocol on an accepted WebSocket.
pub async fn serve_websocket(ws: WebSocket, ports: Vec<u16>, base64: bool, target: Target) {
    let (mut sink, mut source) = ws.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(64);
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = sink.close().await;
    });

    // Announce each channel's port.
    for (i, p) in ports.iter().enumerate() {
        let le = p.to_le_bytes();
        let _ = out_tx.send(channel_message(2 * i as u8, &le, base64)).await;
        let _ = out_tx.send(channel_message(2 * i as u8 + 1, &le, base64)).await;
    }

    // One task per port; `to_pod[i]` feeds its TCP connection.
    let mut to_pod: Vec<Option<mpsc::Sender<Vec<u8>>>> = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, &port) in ports.iter().enumerate() {
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
        to_pod.push(Some(tx));
        let out = out_tx.clone();
        let target = target.clone();
        let (data_ch, err_ch) = (2 * i as u8, 2 * i as u8 + 1);
        tasks.spawn(async move {
            match dial(&target, port).await {
                Err(e) => {
                    let msg = forward_error(port, &target, &e);
                    tracing::info!(port, error = %msg, "port-forward failed");
                    let _ = out.send(channel_message(err_ch, msg.as_bytes(), base64)).await;
                }
                Ok(tcp) => {
                    let (mut rd, mut wr) = tcp.into_split();
                    let feed = async move {
                        while let Some(b) = rx.recv().await {
                            if wr.write_all(&b).await.is_err() {
                                break;
                            }
                        }
                        let _ = wr.shutdown().await;
                    };
                    // Ends with the pod's side; the feed ends with the client's.
                    let feed = tokio::spawn(feed);
                    let mut buf = vec![0u8; 32 * 1024];
                    loop {
                        match rd.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if out.send(channel_message(data_ch, &buf[..n], base64)).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    feed.abort();
                }
            }
        });
    }

    loop {
        tokio::select! {
            m = source.next() => {
                let m = match m {
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(m)) => m,
                };
                if let Some((ch, data)) = parse_channel_message(m, base64) {
                    let idx = (ch / 2) as usize;
                    if ch % 2 == 0 && !data.is_empty() {
                        if let Some(Some(tx)) = to_pod.get(idx) {
                            if tx.send(data).await.is_err() {
                                to_pod[idx] = None;
                            }
                        }
                    }
                }
            }
            done = tasks.join_next() => {
                // Every port finished (pod side closed or dial failed): close the socket.
                if done.is_none() {
                    break;
                }
            }
        }
    }
    tasks.abort_all();
    let _ = out_tx.send(Message::Close(None)).await;
    drop(out_tx);
    let _ = writer.await;
}

// ---------------------------------------------------------------------------------------------
// SPDY through a WebSocket.

/// The byte stream carried by a WebSocket's binary messages, as an `AsyncRead + AsyncWrite`.
pub fn websocket_bytes(ws: WebSocket) -> tokio::io::DuplexStream {
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (mut rd, mut wr) = tokio::io::split(theirs);
    let (mut sink, mut source) = ws.split();
    tokio::spawn(async move {
        // WebSocket → bytes.
        let inbound = async {
            while let Some(Ok(m)) = source.next().await {
                match m {
                    Message::Binary(b) if wr.write_all(&b).await.is_err() => break,
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            let _ = wr.shutdown().await;
        };
        // bytes → WebSocket.
        let outbound = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if sink.send(Message::Binary(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = sink.send(Message::Close(None)).await;
            let _ = sink.close().await;
        };
        tokio::select! {
            _ = inbound => {}
            _ = outbound => {}
        }
    });
    ours
}

// ---------------------------------------------------------------------------------------------
// The HTTP endpoint.

/// The running sandbox of pod `namespace/name` (and `uid`, when given) on this node.
pub async fn find_target(
    k: &crate::kubelet::Kubelet,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<Target, String> {
    let records = k.rt.list(None).await.map_err(|e| format!("{e:#}"))?;
    records
        .into_iter()
        .filter(|r| r.kind == crate::labels::Kind::Sandbox && r.pod_namespace == namespace && r.pod_name == name)
        .filter(|r| uid.is_none_or(|u| u == r.pod_uid))
        .filter(|r| r.state == crate::runtime::State::Running && r.pid > 0)
        .max_by_key(|r| r.created)
        .map(|r| Target { sandbox_id: r.id, pod_uid: r.pod_uid, pid: r.pid })
        .ok_or_else(|| "pod not found".to_string())
}

/// `GET|POST /portForward/{namespace}/{pod}[/{uid}]`.
pub async fn handler(
    axum::extract::State(k): axum::extract::State<std::sync::Arc<crate::kubelet::Kubelet>>,
    axum::extract::Path(params): axum::extract::Path<HashMap<String, String>>,
    req: axum::extract::Request,
) -> axum::response::Response {
    use axum::extract::FromRequestParts;
    let bad = |code: http::StatusCode, msg: String| {
        let reason = if code == http::StatusCode::NOT_FOUND { "NotFound" } else { "BadRequest" };
        super::status_response(code, reason, &msg)
    };
    let (ns, pod) = (params.get("ns").cloned().unwrap_or_default(), params.get("pod").cloned().unwrap_or_default());
    let target = match find_target(&k, &ns, &pod, params.get("uid").map(String::as_str)).await {
        Ok(t) => t,
        Err(e) => return bad(http::StatusCode::NOT_FOUND, e),
    };
    if spdy::is_spdy_upgrade(req.headers()) {
        tracing::debug!(%ns, %pod, transport = %"SPDY", "port-forward");
        return spdy::upgrade(req, &[PROTOCOL_V1], move |io, _| serve_spdy(io, target));
    }
    let query = req.uri().query().unwrap_or_default().to_string();
    let (mut parts, _body) = req.into_parts();
    let ws = match axum::extract::ws::WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(ws) => ws,
        Err(_) => return bad(http::StatusCode::BAD_REQUEST, "Upgrade request required".into()),
    };
    let ws = ws.protocols([TUNNEL_PROTOCOL, WS_BINARY_PROTOCOL, WS_BASE64_PROTOCOL]);
    let protocol = ws.selected_protocol().and_then(|p| p.to_str().ok()).unwrap_or_default().to_string();
    tracing::debug!(%ns, %pod, transport = %format!("WebSocket {protocol}"), "port-forward");
    if protocol == TUNNEL_PROTOCOL {
        return ws.on_upgrade(move |socket| serve_spdy(websocket_bytes(socket), target));
    }
    let ports = match query_ports(&query) {
        Ok(p) => p,
        Err(e) => return bad(http::StatusCode::BAD_REQUEST, e),
    };
    let base64 = protocol == WS_BASE64_PROTOCOL;
    ws.on_upgrade(move |socket| serve_websocket(socket, ports, base64, target))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hs(pairs: &[(&str, &str)]) -> spdy::Headers {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn stream_headers() {
        let i = stream_info(1, &hs(&[("streamtype", "error"), ("port", "80"), ("requestid", "7")])).unwrap();
        assert_eq!(i, StreamInfo { kind: StreamKind::Error, port: 80, request_id: "7".into() });
        // Case does not matter (Go canonicalises header names).
        let i = stream_info(3, &hs(&[("StreamType", "data"), ("Port", "8080"), ("RequestID", "7")])).unwrap();
        assert_eq!(i.kind, StreamKind::Data);
        // Old clients: data stream N+2 pairs with error stream N.
        let e = stream_info(5, &hs(&[("streamtype", "error"), ("port", "1")])).unwrap();
        let d = stream_info(7, &hs(&[("streamtype", "data"), ("port", "1")])).unwrap();
        assert_eq!(e.request_id, d.request_id);
        assert!(stream_info(1, &hs(&[("streamtype", "stdin"), ("port", "80")])).is_err());
        assert!(stream_info(1, &hs(&[("streamtype", "data")])).unwrap_err().contains("port"));
        assert!(stream_info(1, &hs(&[("streamtype", "data"), ("port", "0")])).is_err());
        assert!(stream_info(1, &hs(&[("streamtype", "data"), ("port", "70000")])).is_err());
    }

    fn info(kind: StreamKind, port: u16, id: &str) -> StreamInfo {
        StreamInfo { kind, port, request_id: id.into() }
    }

    #[test]
    fn pairs_complete_in_either_order_and_per_request() {
        let t0 = Instant::now();
        let mut p: Pairs<&str> = Pairs::default();
        assert!(p.add(info(StreamKind::Error, 80, "0"), "e0", t0).unwrap().is_none());
        assert!(p.add(info(StreamKind::Data, 81, "1"), "d1", t0).unwrap().is_none());
        assert_eq!(p.len(), 2);
        let pair = p.add(info(StreamKind::Data, 80, "0"), "d0", t0).unwrap().unwrap();
        assert_eq!((pair.request_id.as_str(), pair.port, pair.error, pair.data), ("0", 80, "e0", "d0"));
        let pair = p.add(info(StreamKind::Error, 81, "1"), "e1", t0).unwrap().unwrap();
        assert_eq!((pair.error, pair.data), ("e1", "d1"));
        assert_eq!(p.len(), 0);
        // A request id can be reused once complete.
        assert!(p.add(info(StreamKind::Error, 80, "0"), "e0'", t0).unwrap().is_none());
    }

    #[test]
    fn duplicate_streams_are_refused() {
        let t0 = Instant::now();
        let mut p: Pairs<&str> = Pairs::default();
        p.add(info(StreamKind::Data, 80, "0"), "d0", t0).unwrap();
        assert_eq!(p.add(info(StreamKind::Data, 80, "0"), "again", t0).unwrap_err(), "again");
    }

    #[test]
    fn lonely_streams_expire() {
        let t0 = Instant::now();
        let mut p: Pairs<&str> = Pairs::default();
        p.add(info(StreamKind::Error, 80, "0"), "e0", t0).unwrap();
        p.add(info(StreamKind::Data, 80, "1"), "d1", t0 + Duration::from_secs(20)).unwrap();
        assert!(p.expire(t0 + Duration::from_secs(29), STREAM_CREATION_TIMEOUT).is_empty());
        let gone = p.expire(t0 + Duration::from_secs(30), STREAM_CREATION_TIMEOUT);
        assert_eq!(gone, vec![("0".to_string(), vec!["e0"])]);
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn ports_from_the_query() {
        assert_eq!(query_ports("ports=80").unwrap(), vec![80]);
        assert_eq!(query_ports("port=80&port=8080").unwrap(), vec![80, 8080]);
        assert_eq!(query_ports("ports=80,81&x=1").unwrap(), vec![80, 81]);
        assert_eq!(query_ports("ports=80%2C81").unwrap(), vec![80, 81]);
        assert!(query_ports("").unwrap_err().contains("required"));
        assert!(query_ports("ports=").is_err());
        assert!(query_ports("ports=0").is_err());
        assert!(query_ports("ports=http").is_err());
    }

    #[test]
    fn channel_messages() {
        let m = channel_message(3, &[0x50, 0], false);
        assert_eq!(m, Message::Binary(vec![3, 0x50, 0].into()));
        assert_eq!(parse_channel_message(m, false), Some((3, vec![0x50, 0])));
        let t = channel_message(1, b"hi", true);
        assert_eq!(t, Message::Text("1aGk=".into()));
        assert_eq!(parse_channel_message(t, true), Some((1, b"hi".to_vec())));
        assert_eq!(parse_channel_message(Message::Binary(Bytes::new()), false), None);
    }

    #[test]
    fn error_message_names_port_and_sandbox() {
        let t = Target { sandbox_id: "abc".into(), pod_uid: "u-1".into(), pid: 1 };
        assert_eq!(forward_error(81, &t, "boom"), "error forwarding port 81 to pod abc, uid u-1: boom");
    }

    #[tokio::test]
    async fn dial_reaches_localhost_and_reports_refusal() {
        // Our own namespace stands in for the pod's.
        let me = Target { sandbox_id: "self".into(), pod_uid: String::new(), pid: std::process::id() as i64 };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (c, s) = tokio::join!(dial(&me, port), l.accept());
        assert!(c.is_ok() && s.is_ok());
        drop(l);
        let err = dial(&me, port).await.unwrap_err();
        assert!(err.contains("connection refused"), "{err}");
    }
}
