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

use std::future::Future;
use std::pin::Pin;
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
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tower::ServiceExt;

/// How long a keep-alive connection may wait for its next request (kube-apiserver: 90 s).
/// Also bounds how long a client may take to send a request's headers.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Serve `app` on `listener` until `shutdown` completes; then stop accepting, let requests
/// in flight finish, and return once every connection has closed.
pub async fn serve(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()>, idle_timeout: Duration) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(idle_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::error!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(app.clone().map_request(|req: Request<Incoming>| req.map(Body::new)));
        let stream = FirstByteTimeout::new(stream, idle_timeout);
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// A connection that fails with `TimedOut` if its first byte does not arrive in time.
struct FirstByteTimeout {
    inner: TcpStream,
    /// Until the first byte.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl FirstByteTimeout {
    fn new(inner: TcpStream, limit: Duration) -> Self {
        FirstByteTimeout { inner, deadline: Some(Box::pin(tokio::time::sleep(limit))) }
    }
}

impl AsyncRead for FirstByteTimeout {
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

impl AsyncWrite for FirstByteTimeout {
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
