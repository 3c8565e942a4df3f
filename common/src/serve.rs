//! Accepting connections: what `axum::serve` does, plus kube-apiserver's limit on idle
//! keep-alive connections.
//!
//! HTTP/1.1 clients keep a pool of connections and may never close the idle ones (the
//! `kube` crate's pool has no timer, so after a burst of concurrent requests a controller
//! holds every connection it opened). Each costs the server tens of KB of buffers, so
//! like kube-apiserver (Go's `http.Server.IdleTimeout`, 90 s) a connection that sends no
//! new request for [`IDLE_TIMEOUT`] is closed; clients open a new one when they need it.
//! A watch or a long response is not idle: the timer runs only while waiting for a request.
//! A connection that sends nothing at all gets the same limit for its first byte (hyper's
//! timer only starts once it knows the connection is HTTP/1, from those bytes).
//!
//! [`serve_tls`] is a TLS port (the apiserver's secure port, the kubelet's): each
//! connection's TLS handshake runs in its own task (bounded by the same limit), a plain-HTTP
//! request gets Go's 400 answer ([`crate::tls::HTTP_ON_HTTPS_PORT`]), and what the server
//! makes of a verified client certificate (its user) goes with every request of the
//! connection as a request extension.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tower::ServiceExt;

/// How long a keep-alive connection may wait for its next request (kube-apiserver: 90 s).
/// Also bounds how long a client may take to send a request's headers.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Serve `app` on `listener` until `shutdown` completes; then stop accepting, let requests
/// in flight finish, and return once every connection has closed.
pub async fn serve(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()>, idle_timeout: Duration) {
    serve_with::<NoUser>(listener, app, None, shutdown, idle_timeout).await
}

/// What a server makes of a verified client certificate (DER): the request extension every
/// request of the connection carries, or `None` for none.
pub type PeerUser<U> = fn(&[u8]) -> Option<U>;

/// No extension from client certificates (plain HTTP, or a server that ignores them).
pub type NoUser = ();

/// [`serve`] over TLS with `config`; `user_of` turns a verified client certificate into the
/// extension its connection's requests carry.
pub async fn serve_tls<U: Clone + Send + Sync + 'static>(
    listener: TcpListener,
    app: Router,
    config: Arc<rustls::ServerConfig>,
    user_of: PeerUser<U>,
    shutdown: impl Future<Output = ()>,
    idle_timeout: Duration,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    serve_with(listener, app, Some((acceptor, user_of)), shutdown, idle_timeout).await
}

async fn serve_with<U: Clone + Send + Sync + 'static>(
    listener: TcpListener,
    app: Router,
    tls: Option<(tokio_rustls::TlsAcceptor, PeerUser<U>)>,
    shutdown: impl Future<Output = ()>,
    idle_timeout: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(idle_timeout);
    let builder = Arc::new(builder);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // As Go's servers (Kubernetes'): no Nagle delay, so a watch event written
                    // in pieces (a TLS record, a chunk's framing) is not held back until the
                    // client acknowledges the previous piece (up to its 40-200 ms delayed ACK).
                    let _ = stream.set_nodelay(true);
                    stream
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::error!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let (app, builder, watcher) = (app.clone(), builder.clone(), graceful.watcher());
        match &tls {
            None => {
                let conn =
                    serve_connection::<_, NoUser>(&builder, FirstByteTimeout::new(stream, idle_timeout), app, None);
                tokio::spawn(async move {
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            Some((acceptor, user_of)) => {
                let (acceptor, user_of) = (acceptor.clone(), *user_of);
                tokio::spawn(async move {
                    let Some((stream, user)) = handshake(acceptor, stream, user_of, idle_timeout).await else {
                        return;
                    };
                    let conn = serve_connection(&builder, FirstByteTimeout::new(stream, idle_timeout), app, user);
                    if let Err(e) = watcher.watch(conn).await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

/// One connection's HTTP, each request carrying the connection's certificate user.
fn serve_connection<S: AsyncRead + AsyncWrite + Unpin + Send + 'static, U: Clone + Send + Sync + 'static>(
    builder: &auto::Builder<TokioExecutor>,
    stream: S,
    app: Router,
    user: Option<U>,
) -> impl hyper_util::server::graceful::GracefulConnection<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>>
{
    let service = TowerToHyperService::new(app.map_request(move |req: Request<Incoming>| {
        let mut req = req.map(Body::new);
        if let Some(user) = &user {
            req.extensions_mut().insert(user.clone());
        }
        req
    }));
    builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned()
}

/// The TLS handshake of a new connection, within `limit`: the stream and the user of a
/// verified client certificate. `None` when the connection is not TLS or the handshake
/// fails (answered as Go answers plain HTTP, else closed).
async fn handshake<U>(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    user_of: PeerUser<U>,
    limit: Duration,
) -> Option<(tokio_rustls::server::TlsStream<TcpStream>, Option<U>)> {
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(limit, stream.peek(&mut first)).await;
    if !matches!(peeked, Ok(Ok(1))) {
        return None;
    }
    if crate::tls::looks_like_http(&first) {
        let mut stream = stream;
        let _ = tokio::time::timeout(limit, stream.write_all(crate::tls::HTTP_ON_HTTPS_PORT)).await;
        let _ = stream.shutdown().await;
        return None;
    }
    let tls = match tokio::time::timeout(limit, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            return None;
        }
        Err(_) => return None,
    };
    let user = tls.get_ref().1.peer_certificates().and_then(|chain| chain.first()).and_then(|leaf| user_of(leaf));
    Some((tls, user))
}

/// A connection that fails with `TimedOut` if its first byte does not arrive in time.
struct FirstByteTimeout<S> {
    inner: S,
    /// Until the first byte.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<S> FirstByteTimeout<S> {
    fn new(inner: S, limit: Duration) -> Self {
        FirstByteTimeout { inner, deadline: Some(Box::pin(tokio::time::sleep(limit))) }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FirstByteTimeout<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.deadline = None;
                }
                Poll::Ready(r)
            }
            Poll::Pending => match self.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no request on a new connection in time",
                ))),
                _ => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FirstByteTimeout<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn server(idle: Duration) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", get(|| async { "ok" }));
        tokio::spawn(serve(listener, app, std::future::pending(), idle));
        addr
    }

    async fn get_once(conn: &mut tokio::net::TcpStream) -> String {
        conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
        let mut buf = vec![0u8; 1024];
        let n = conn.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed_and_a_busy_one_is_not() {
        let addr = server(Duration::from_millis(300)).await;
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        // Requests closer together than the timeout keep the connection.
        for _ in 0..4 {
            assert!(get_once(&mut conn).await.starts_with("HTTP/1.1 200"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Then silence: the server closes it (EOF), well before the test's own bound.
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0))), "the idle connection was not closed: {read:?}");
    }

    #[tokio::test]
    async fn a_connection_that_never_speaks_is_closed_and_a_slow_first_request_is_served() {
        let addr = server(Duration::from_millis(300)).await;
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the silent connection was not closed: {read:?}");
        // A request that starts within the limit is answered, however long the connection waits after.
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(get_once(&mut slow).await.starts_with("HTTP/1.1 200"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(get_once(&mut slow).await.starts_with("HTTP/1.1 200"));
    }
}
