//! Connection pools to a cluster's endpoints: hyper's pooled clients (HTTP/1.1 and h2c),
//! keyed by endpoint address, over a connector that honours the cluster's connect timeout
//! and counts open connections for the circuit breakers.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A request body: buffered (so that it can be retried) or streamed from the downstream.
pub type ReqBody = Either<Full<Bytes>, Incoming>;

pub struct Pools {
    pub http1: Client<Connector, ReqBody>,
    pub http2: Client<Connector, ReqBody>,
}

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pools")
    }
}

impl Pools {
    pub fn new(connections: Arc<AtomicU32>, connect_timeout: Duration) -> Pools {
        let connector = Connector { connections, connect_timeout };
        let mut b = Client::builder(TokioExecutor::new());
        b.pool_idle_timeout(Duration::from_secs(60)).pool_max_idle_per_host(256).pool_timer(TokioTimer::new());
        let http1 = b.build(connector.clone());
        b.http2_only(true).timer(TokioTimer::new());
        let http2 = b.build(connector);
        Pools { http1, http2 }
    }
}

/// Connects to the endpoint the request URI names (`http://<ip>:<port>`).
#[derive(Clone)]
pub struct Connector {
    connections: Arc<AtomicU32>,
    connect_timeout: Duration,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Counted>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<Counted>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connections = self.connections.clone();
        let timeout = self.connect_timeout;
        Box::pin(async move {
            let authority = uri.authority().ok_or_else(|| io::Error::other("upstream URI without an address"))?;
            let addr: std::net::SocketAddr =
                authority.as_str().parse().map_err(|_| io::Error::other("upstream address is not ip:port"))?;
            let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timeout"))??;
            stream.set_nodelay(true)?;
            connections.fetch_add(1, Ordering::Relaxed);
            Ok(TokioIo::new(Counted { stream, connections }))
        })
    }
}

/// A TCP stream counted in its cluster's open connections while it lives.
pub struct Counted {
    stream: TcpStream,
    connections: Arc<AtomicU32>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connection for Counted {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
