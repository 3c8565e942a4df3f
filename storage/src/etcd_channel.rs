//! The etcd backend's gRPC transport: one HTTP/2 connection per etcd member, written with
//! the `h2` crate and handed to `etcd-client` as its channel.
//!
//! Why not tonic's own channel: on a unary call it writes the request in three TCP
//! segments (HEADERS, then DATA from a body task it spawns when the stream has no send
//! window yet, then an empty END_STREAM DATA) and passes each request through a buffer
//! task and a dispatch task first. Over loopback every segment wakes etcd's reader and
//! costs a syscall on both sides; measured under the apiserver benchmark that was 5.3
//! `writev` per pod create and a third of the apiserver's CPU in the HTTP/2 client. Here a
//! request whose body is complete when it is sent (every unary call) leaves in one write:
//! HEADERS and DATA with END_STREAM are queued together before the connection task flushes.
//! A streaming body (a watch's requests) sends what it has at once and the rest from a
//! task as it comes.
//!
//! What tonic's channel did that this one keeps:
//! - the connection is dialled on first use and again after it breaks; a dial that fails
//!   says "tcp connect error" (the backend tells a request that never left from one whose
//!   outcome is unknown by that);
//! - TLS with the given CA and client certificate, ALPN `h2`;
//! - HTTP/2 keep-alive pings while streams are open (a watch on a connection that died
//!   silently fails after `keep_alive + timeout`, and is re-created by the watch stream),
//!   never on an idle connection (etcd answers those with GOAWAY `too_many_pings`);
//! - a bound on dialling. Each call's own bound is the backend's request timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri};
use http_body::Frame;
use http_body_util::BodyExt;
use tonic::body::Body;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where and how to connect.
#[derive(Clone)]
pub struct Target {
    pub scheme: Scheme,
    pub authority: Authority,
    /// Present for `https` endpoints.
    pub tls: Option<tokio_rustls::TlsConnector>,
    pub connect_timeout: Duration,
    pub keep_alive: Duration,
    pub ping_timeout: Duration,
}

impl Target {
    /// `http://host:port`, `https://host:port` or `host:port` (https when `tls` is given).
    pub fn parse(endpoint: &str, tls: Option<tokio_rustls::TlsConnector>) -> Result<(Scheme, Authority), String> {
        let with_scheme = if endpoint.contains("://") {
            endpoint.to_string()
        } else if tls.is_some() {
            format!("https://{endpoint}")
        } else {
            format!("http://{endpoint}")
        };
        let uri: Uri = with_scheme.parse().map_err(|e| format!("invalid etcd endpoint {endpoint:?}: {e}"))?;
        let scheme = uri.scheme().cloned().unwrap_or(Scheme::HTTP);
        if scheme == Scheme::HTTPS && tls.is_none() {
            return Err(format!("etcd endpoint {endpoint:?} is https but no TLS settings were given"));
        }
        if scheme == Scheme::HTTP && tls.is_some() {
            return Err("TLS options are only supported with https endpoints".into());
        }
        let authority = uri.authority().cloned().ok_or_else(|| format!("etcd endpoint {endpoint:?} has no host"))?;
        Ok((scheme, authority))
    }
}

/// A rustls client configuration for etcd: `ca` (PEM) as the only roots (none when None:
/// etcd's certificate must then be signed by a given CA), `identity` (certificate and key,
/// PEM) presented when given, ALPN h2.
pub fn tls_connector(
    ca: Option<&[u8]>,
    identity: Option<(&[u8], &[u8])>,
) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        for cert in CertificateDer::pem_slice_iter(ca) {
            let cert = cert.map_err(|e| format!("etcd CA: {e}"))?;
            roots.add(cert).map_err(|e| format!("etcd CA: {e}"))?;
        }
        if roots.is_empty() {
            return Err("etcd CA: no certificate in the PEM".into());
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("etcd TLS: {e}"))?
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("etcd client certificate: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("etcd client key: {e}"))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("etcd client certificate: {e}"))?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The channel: cheap to clone, one connection shared by every clone.
#[derive(Clone)]
pub struct H2Channel {
    shared: Arc<Shared>,
}

struct Shared {
    target: Target,
    conn: tokio::sync::Mutex<Option<Conn>>,
}

/// One live HTTP/2 connection.
#[derive(Clone)]
struct Conn {
    send: h2::client::SendRequest<Bytes>,
    /// Streams open on it (for keep-alive: ping only while some are).
    streams: Arc<AtomicUsize>,
    dead: Arc<AtomicBool>,
}

impl H2Channel {
    pub fn new(target: Target) -> Self {
        H2Channel { shared: Arc::new(Shared { target, conn: tokio::sync::Mutex::new(None) }) }
    }

    /// The live connection, dialling one if there is none or it broke.
    async fn conn(&self) -> Result<Conn, BoxError> {
        let mut slot = self.shared.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.dead.load(Ordering::Acquire)) {
            return Ok(c.clone());
        }
        let c = dial(&self.shared.target).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn call(self, req: Request<Body>) -> Result<Response<Body>, BoxError> {
        let mut conn = self.conn().await?;
        let mut send = match conn.send.clone().ready().await {
            Ok(s) => s,
            Err(e) => {
                // The connection broke before this request went out: a fresh one is safe.
                tracing::debug!(error = %e, "etcd connection broken; dialling again");
                conn.dead.store(true, Ordering::Release);
                conn = self.conn().await?;
                conn.send.clone().ready().await?
            }
        };
        let target = &self.shared.target;
        let (mut parts, mut body) = req.into_parts();
        let path = parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.uri = Uri::builder()
            .scheme(target.scheme.clone())
            .authority(target.authority.clone())
            .path_and_query(path)
            .build()?;
        let head = Request::from_parts(parts, ());

        // What the body has ready now: all of it for a unary call.
        let mut data = BytesMut::new();
        let mut end = None;
        loop {
            match body.frame().now_or_never() {
                Some(Some(frame)) => match frame?.into_data() {
                    Ok(chunk) => data.extend_from_slice(&chunk),
                    Err(frame) => {
                        end = Some(frame.into_trailers().ok());
                        break;
                    }
                },
                Some(None) => {
                    end = Some(None);
                    break;
                }
                None => break,
            }
        }
        let guard = StreamGuard::new(conn.streams.clone());
        let (response, mut stream) = match (&end, data.is_empty()) {
            (Some(None), true) => send.send_request(head, true)?,
            _ => send.send_request(head, false)?,
        };
        match end {
            Some(None) if !data.is_empty() => stream.send_data(data.freeze(), true)?,
            Some(None) => {}
            Some(Some(trailers)) => {
                if !data.is_empty() {
                    stream.send_data(data.freeze(), false)?;
                }
                stream.send_trailers(trailers)?;
            }
            None => {
                if !data.is_empty() {
                    stream.send_data(data.freeze(), false)?;
                }
                tokio::spawn(pump(body, stream));
            }
        }
        let response = response.await?;
        Ok(response.map(|recv| Body::new(RecvBody { recv, trailers: false, _guard: guard })))
    }
}

impl tower::Service<Request<Body>> for H2Channel {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness (HTTP/2 stream concurrency) is awaited inside each call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        Box::pin(self.clone().call(req))
    }
}

/// Dial `target`: TCP (and TLS), the HTTP/2 handshake, and the connection's tasks.
async fn dial(target: &Target) -> Result<Conn, BoxError> {
    let addr = target.authority.as_str().to_string();
    let tcp = tokio::time::timeout(target.connect_timeout, tokio::net::TcpStream::connect(&addr))
        .await
        .map_err(|_| format!("tcp connect error: connecting to {addr} timed out"))?
        .map_err(|e| format!("tcp connect error: {addr}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    match &target.tls {
        None => handshake(tcp, target).await,
        Some(tls) => {
            let host = target.authority.host().trim_start_matches('[').trim_end_matches(']').to_string();
            let name = rustls::pki_types::ServerName::try_from(host)
                .map_err(|e| format!("etcd endpoint {addr}: not a TLS server name: {e}"))?;
            let stream = tokio::time::timeout(target.connect_timeout, tls.connect(name, tcp))
                .await
                .map_err(|_| format!("etcd TLS handshake with {addr} timed out"))?
                .map_err(|e| format!("etcd TLS handshake with {addr}: {e}"))?;
            handshake(stream, target).await
        }
    }
}

async fn handshake<T>(io: T, target: &Target) -> Result<Conn, BoxError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, mut connection) = tokio::time::timeout(
        target.connect_timeout,
        h2::client::Builder::new()
            // As grpc-go's defaults: room for large ranges and watch batches.
            .initial_window_size(1 << 20)
            .initial_connection_window_size(1 << 22)
            .max_frame_size(1 << 20)
            .handshake::<_, Bytes>(io),
    )
    .await
    .map_err(|_| "etcd HTTP/2 handshake timed out")??;
    let dead = Arc::new(AtomicBool::new(false));
    let streams = Arc::new(AtomicUsize::new(0));
    let ping = connection.ping_pong();
    let driver = {
        let dead = dead.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "etcd connection ended");
            }
            dead.store(true, Ordering::Release);
        })
    };
    if let Some(ping) = ping {
        tokio::spawn(keep_alive(ping, driver, dead.clone(), streams.clone(), target.keep_alive, target.ping_timeout));
    }
    Ok(Conn { send, streams, dead })
}

/// Ping every `interval` while streams are open; a ping unanswered within `timeout` closes
/// the connection, failing its streams (a watch then re-creates itself on a new one).
async fn keep_alive(
    mut ping: h2::PingPong,
    driver: tokio::task::JoinHandle<()>,
    dead: Arc<AtomicBool>,
    streams: Arc<AtomicUsize>,
    interval: Duration,
    timeout: Duration,
) {
    loop {
        tokio::time::sleep(interval).await;
        if dead.load(Ordering::Acquire) {
            return;
        }
        if streams.load(Ordering::Relaxed) == 0 {
            continue;
        }
        match tokio::time::timeout(timeout, ping.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "etcd keep-alive ping failed");
                break;
            }
            Err(_) => {
                tracing::warn!(?timeout, "etcd did not answer a keep-alive ping; closing the connection");
                break;
            }
        }
    }
    dead.store(true, Ordering::Release);
    driver.abort();
}

/// The rest of a streaming request body, sent as it comes.
async fn pump(mut body: Body, mut stream: h2::SendStream<Bytes>) {
    loop {
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(chunk) => {
                    if stream.send_data(chunk, false).is_err() {
                        return;
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        let _ = stream.send_trailers(trailers);
                    }
                    return;
                }
            },
            Some(Err(e)) => {
                tracing::debug!(error = %e, "etcd request body failed");
                stream.send_reset(h2::Reason::CANCEL);
                return;
            }
            None => {
                let _ = stream.send_data(Bytes::new(), true);
                return;
            }
        }
    }
}

/// Counts a stream as open while its response body lives.
struct StreamGuard(Arc<AtomicUsize>);

impl StreamGuard {
    fn new(streams: Arc<AtomicUsize>) -> Self {
        streams.fetch_add(1, Ordering::Relaxed);
        StreamGuard(streams)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body: DATA frames (their flow-control window given back as they are read),
/// then the trailers (gRPC's status).
struct RecvBody {
    recv: h2::RecvStream,
    trailers: bool,
    _guard: StreamGuard,
}

impl http_body::Body for RecvBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if !self.trailers {
            match self.recv.poll_data(cx) {
                Poll::Ready(Some(Ok(chunk))) => {
                    let _ = self.recv.flow_control().release_capacity(chunk.len());
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => self.trailers = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        match self.recv.poll_trailers(cx) {
            Poll::Ready(Ok(Some(t))) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let (s, a) = Target::parse("127.0.0.1:2379", None).unwrap();
        assert_eq!((s.as_str(), a.as_str()), ("http", "127.0.0.1:2379"));
        let (s, a) = Target::parse("http://etcd-0:2379", None).unwrap();
        assert_eq!((s.as_str(), a.as_str()), ("http", "etcd-0:2379"));
        assert!(Target::parse("https://etcd-0:2379", None).unwrap_err().contains("no TLS settings"));
        assert!(Target::parse("http://", None).is_err());
        let tls = tls_connector(None, None).unwrap();
        let (s, _) = Target::parse("etcd-0:2379", Some(tls.clone())).unwrap();
        assert_eq!(s.as_str(), "https");
        assert!(Target::parse("http://etcd-0:2379", Some(tls)).unwrap_err().contains("only supported with https"));
    }

    #[test]
    fn bad_tls_material_is_refused_with_what_is_wrong() {
        assert!(tls_connector(Some(b"not pem"), None).err().unwrap().contains("etcd CA"));
    }
}
