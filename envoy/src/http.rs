//! The HTTP proxy (an `http_connection_manager` filter chain): serves HTTP/1.1 and h2c on a
//! downstream connection and, per request, routes it, applies faults, circuit breakers,
//! load balancing, retries and timeouts, and streams the upstream's answer back. The
//! decisions are the pure functions of `route`, `upstream` and `retry`; this module is the
//! I/O around them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONNECTION, HOST};
use http::{HeaderMap, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use crate::config::{
    Action, Cluster, ClusterKind, Fault, Forward, HttpManager, Percent, RouteSource, Snapshot, Target,
};
use crate::ctx::{Ctx, Direction};
use crate::metrics::{self, Peers};
use crate::node::{self, PEER_ID_HEADER, PEER_METADATA_HEADER};
use crate::pool::ReqBody;
use crate::retry::{self, Outcome};
use crate::route::{self, RequestView};
use crate::upstream::{self, Gauge};

pub type RespBody = Either<Incoming, Full<Bytes>>;

/// Bodies up to this size are buffered so that a failed attempt can be retried.
const RETRY_BUFFER: u64 = 64 * 1024;

/// One downstream connection's facts, shared by its requests.
pub struct Conn {
    pub direction: Direction,
    pub original_dst: SocketAddr,
    pub manager: Arc<HttpManager>,
}

/// Serve HTTP on `stream` until the downstream closes it.
pub async fn serve(stream: TcpStream, conn: Conn, ctx: Arc<Ctx>) {
    let conn = Arc::new(conn);
    let svc = hyper::service::service_fn(move |req| {
        let (conn, ctx) = (conn.clone(), ctx.clone());
        async move { Ok::<_, Infallible>(handle(req, &conn, &ctx).await) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // half_close: a client that shuts its write side after the request (nc, some
    // scripts) still gets the response, as Envoy gives it.
    builder.http1().keep_alive(true).half_close(true).timer(hyper_util::rt::TokioTimer::new());
    if let Err(e) = builder.serve_connection(TokioIo::new(stream), svc).await {
        tracing::debug!(error = %e, "downstream HTTP connection ended");
    }
}

/// Envoy's response flags for what went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flag {
    None,
    NoRoute,
    NoCluster,
    NoHealthy,
    Overflow,
    Timeout,
    ConnectFailure,
    Reset,
    FaultAbort,
    FaultDelay,
}

impl Flag {
    fn as_str(self) -> &'static str {
        match self {
            Flag::None => "-",
            Flag::NoRoute => "NR",
            Flag::NoCluster => "NC",
            Flag::NoHealthy => "UH",
            Flag::Overflow => "UO",
            Flag::Timeout => "UT",
            Flag::ConnectFailure => "UF",
            Flag::Reset => "UC",
            Flag::FaultAbort => "FI",
            Flag::FaultDelay => "DI",
        }
    }
}

fn local(status: StatusCode, body: &'static str) -> Response<RespBody> {
    let mut r = Response::new(Either::Right(Full::new(Bytes::from_static(body.as_bytes()))));
    *r.status_mut() = status;
    r.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

/// What the metrics of one request need once it is answered.
struct Report {
    peer_workload: Option<node::Peer>,
    flag: Flag,
}

async fn handle(req: Request<Incoming>, conn: &Conn, ctx: &Ctx) -> Response<RespBody> {
    let start = Instant::now();
    let (mut req, body) = req.into_parts();
    let grpc =
        req.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    // The peer's identity travels in headers that never reach the application.
    let source = match conn.direction {
        Direction::Inbound => {
            let h = &mut req.headers;
            let from_md =
                h.get(PEER_METADATA_HEADER).and_then(|v| v.to_str().ok()).and_then(node::decode_peer_metadata);
            let from_id = h.get(PEER_ID_HEADER).and_then(|v| v.to_str().ok()).and_then(node::peer_from_node_id);
            h.remove(PEER_METADATA_HEADER);
            h.remove(PEER_ID_HEADER);
            from_md.or(from_id)
        }
        Direction::Outbound => None,
    };
    let snap = ctx.shared.snapshot.load_full();
    let version = req.version;
    let inbound_service = match conn.direction {
        Direction::Inbound => {
            let host = host_of(&req);
            Some(host.rsplit_once(':').map_or(host, |(h, _)| h).to_string())
        }
        Direction::Outbound => None,
    };
    let mut report = Report { peer_workload: None, flag: Flag::None };
    let (resp, cluster) = route_and_forward(req, body, &snap, conn, ctx, &mut report).await;
    let mut resp = resp;
    // Metadata exchange on the way back: the destination tells the source who it is.
    match conn.direction {
        Direction::Inbound => {
            resp.headers_mut().insert(PEER_METADATA_HEADER, ctx.peer_metadata.clone());
        }
        Direction::Outbound => {
            let h = resp.headers_mut();
            report.peer_workload =
                h.get(PEER_METADATA_HEADER).and_then(|v| v.to_str().ok()).and_then(node::decode_peer_metadata);
            h.remove(PEER_METADATA_HEADER);
        }
    }
    if ctx.draining.load(Ordering::Relaxed) && version < Version::HTTP_2 {
        resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    }
    let service = match (cluster.as_deref().and_then(|c| metrics::cluster_service(&c.name)), &inbound_service) {
        (Some(s), _) => s,
        (None, Some(s)) => s.as_str(),
        (None, None) => "unknown",
    };
    let unknown = node::Peer { workload: "unknown".into(), namespace: "unknown".into() };
    let peers = match conn.direction {
        Direction::Outbound => {
            let dst = report.peer_workload.as_ref().unwrap_or(&unknown);
            Peers {
                reporter: "source",
                source_workload: &ctx.identity.workload,
                source_namespace: &ctx.identity.namespace,
                destination_workload: &dst.workload,
                destination_namespace: &dst.namespace,
                destination_service: service,
            }
        }
        Direction::Inbound => {
            let src = source.as_ref().unwrap_or(&unknown);
            Peers {
                reporter: "destination",
                source_workload: &src.workload,
                source_namespace: &src.namespace,
                destination_workload: &ctx.identity.workload,
                destination_namespace: &ctx.identity.namespace,
                destination_service: service,
            }
        }
    };
    let protocol = if grpc { "grpc" } else { "http" };
    let millis = start.elapsed().as_secs_f64() * 1000.0;
    metrics::get().request(&peers, resp.status().as_u16(), protocol, report.flag.as_str(), millis);
    resp
}

/// Route the request and carry it upstream; returns the response and the cluster used.
/// The request's Host (`:authority` in HTTP/2).
fn host_of(req: &http::request::Parts) -> &str {
    match req.uri.authority() {
        Some(a) => a.as_str(),
        None => req.headers.get(HOST).and_then(|h| h.to_str().ok()).unwrap_or_default(),
    }
}

async fn route_and_forward(
    mut req: http::request::Parts,
    body: Incoming,
    snap: &Snapshot,
    conn: &Conn,
    ctx: &Ctx,
    report: &mut Report,
) -> (Response<RespBody>, Option<Arc<Cluster>>) {
    let table = match &conn.manager.routes {
        RouteSource::Rds(name) => snap.routes.get(name),
        RouteSource::Inline(t) => Some(t),
    };
    let host = host_of(&req);
    let path = req.uri.path();
    let view =
        RequestView { host, method: &req.method, path, query: req.uri.query(), scheme: "http", headers: &req.headers };
    let found = table.and_then(|t| route::virtual_host(t, host)).and_then(|vh| Some((vh, route::find(vh, &view)?)));
    let Some((vh, r)) = found else {
        report.flag = Flag::NoRoute;
        return (local(StatusCode::NOT_FOUND, ""), None);
    };
    if let Some(listener_fault) = &conn.manager.fault_filter {
        let fault = r.fault.as_ref().or(vh.fault.as_ref()).or(listener_fault.as_ref());
        if let Some(f) = fault {
            if let Some(resp) = apply_fault(f, report).await {
                return (resp, None);
            }
        }
    }
    tracing::trace!(virtual_host = %vh.name, route = %r.name, "routed");
    let fwd = match &r.action {
        Action::Direct { status, body } => {
            let mut resp = local(StatusCode::OK, "");
            *resp.status_mut() = StatusCode::from_u16(*status).unwrap_or(StatusCode::OK);
            *resp.body_mut() = Either::Right(Full::new(Bytes::from(body.clone())));
            return (resp, None);
        }
        Action::Forward(f) => f,
    };
    let cluster_name = match &fwd.target {
        Target::Cluster(c) => c.as_str(),
        Target::Weighted(clusters, total) => {
            upstream::pick_weighted(clusters, rand::random::<u32>() % (*total).max(1)).unwrap_or_default()
        }
    };
    let new_path = route::rewrite(r, fwd, path, req.uri.query());
    let Some(cluster) = snap.clusters.get(cluster_name) else {
        report.flag = Flag::NoCluster;
        return (local(StatusCode::SERVICE_UNAVAILABLE, ""), None);
    };
    let resp = forward(&mut req, body, new_path, fwd, cluster, conn, ctx, report).await;
    (resp, Some(cluster.clone()))
}

async fn apply_fault(f: &Fault, report: &mut Report) -> Option<Response<RespBody>> {
    let draw = || rand::random::<u32>() % Percent::MILLION;
    if let Some((delay, pct)) = f.delay {
        if pct.hit(draw()) {
            report.flag = Flag::FaultDelay;
            tokio::time::sleep(delay).await;
        }
    }
    if let Some((status, pct)) = f.abort {
        if pct.hit(draw()) {
            report.flag = Flag::FaultAbort;
            let mut resp = local(StatusCode::OK, "fault filter abort");
            *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            return Some(resp);
        }
    }
    None
}

/// Hop-by-hop headers, which a proxy never forwards.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    if let Some(listed) = h.get(CONNECTION).and_then(|v| v.to_str().ok()).map(str::to_string) {
        for name in listed.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if let Ok(n) = HeaderName::from_bytes(name.as_bytes()) {
                h.remove(n);
            }
        }
    }
    for name in ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"] {
        h.remove(name);
    }
}

#[allow(clippy::too_many_arguments)]
async fn forward(
    req: &mut http::request::Parts,
    body: Incoming,
    new_path: Option<String>,
    fwd: &Forward,
    cluster: &Arc<Cluster>,
    conn: &Conn,
    ctx: &Ctx,
    report: &mut Report,
) -> Response<RespBody> {
    let state = &cluster.state;
    if !upstream::admit_request(&cluster.limits, state.active_requests.load(Ordering::Relaxed), cluster.http2) {
        report.flag = Flag::Overflow;
        metrics::get().overflow.with_label_values(&[&cluster.name]).inc();
        let mut resp = local(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream connect error or disconnect/reset before headers. reset reason: overflow",
        );
        resp.headers_mut().insert("x-envoy-overloaded", HeaderValue::from_static("true"));
        return resp;
    }
    let _active = Gauge::inc(&state.active_requests);

    // The request head every attempt sends.
    let path_and_query = match new_path {
        Some(p) => p,
        None => req.uri.path_and_query().map_or_else(|| "/".to_string(), |pq| pq.as_str().to_string()),
    };
    let mut headers = std::mem::take(&mut req.headers);
    strip_hop_by_hop(&mut headers);
    let host_value = match &fwd.host_rewrite {
        Some(h) => HeaderValue::from_str(h).ok(),
        None => match req.uri.authority() {
            Some(a) => HeaderValue::from_str(a.as_str()).ok(),
            None => headers.get(HOST).cloned(),
        },
    };
    if let Some(h) = host_value {
        headers.insert(HOST, h);
    }
    // Peers inside the mesh learn who calls; hosts outside it (passthrough) do not.
    if conn.direction == Direction::Outbound && cluster.kind == ClusterKind::Endpoints {
        headers.insert(PEER_ID_HEADER, ctx.node_id.clone());
        headers.insert(PEER_METADATA_HEADER, ctx.peer_metadata.clone());
    }
    let method = req.method.clone();

    // A small or empty body is buffered so that attempts can be repeated.
    let size = body.size_hint();
    let (buffered, mut streamed) = if body.is_end_stream() {
        (Some(Bytes::new()), None)
    } else if size.upper().is_some_and(|u| u <= RETRY_BUFFER) {
        match body.collect().await {
            Ok(c) => (Some(c.to_bytes()), None),
            Err(_) => {
                report.flag = Flag::Reset;
                return local(StatusCode::BAD_REQUEST, "downstream body read failed");
            }
        }
    } else {
        (None, Some(body))
    };

    let policy = fwd.retry.as_deref();
    let max_attempts = match (policy, &buffered) {
        (Some(p), Some(_)) => 1 + p.num_retries,
        _ => 1,
    };
    let pools = state.pools(cluster.connect_timeout);
    let client = if cluster.http2 { &pools.http2 } else { &pools.http1 };
    let version = if cluster.http2 { Version::HTTP_2 } else { Version::HTTP_11 };

    let attempts = async {
        let mut avoid = None;
        let mut last: Option<Outcome> = None;
        for attempt in 0..max_attempts {
            let now = upstream::now_ms();
            let (addr, endpoint) = match cluster.kind {
                ClusterKind::OriginalDst => (conn.original_dst, None),
                ClusterKind::Endpoints => match upstream::pick(cluster, now, avoid, rand::random()) {
                    Some(e) => (e.addr, Some(e)),
                    None => return Err((Flag::NoHealthy, last)),
                },
            };
            // A retry counts against the cluster's max_retries while it runs.
            let retrying = (attempt > 0).then(|| Gauge::inc(&state.active_retries));
            let uri = match Uri::builder()
                .scheme("http")
                .authority(addr.to_string())
                .path_and_query(path_and_query.as_str())
                .build()
            {
                Ok(u) => u,
                Err(_) => return Err((Flag::NoRoute, None)),
            };
            let body: ReqBody = match (&buffered, streamed.take()) {
                (Some(b), _) => Either::Left(Full::new(b.clone())),
                (None, Some(s)) => Either::Right(s),
                (None, None) => Either::Left(Full::new(Bytes::new())),
            };
            let mut up = Request::new(body);
            *up.method_mut() = method.clone();
            *up.uri_mut() = uri;
            *up.version_mut() = version;
            *up.headers_mut() = if attempt + 1 < max_attempts { headers.clone() } else { std::mem::take(&mut headers) };
            let _ep_active = endpoint.map(|e| Gauge::inc(&e.state.active_requests));
            let sent = client.request(up);
            let result = match policy.and_then(|p| p.per_try_timeout) {
                Some(t) => tokio::time::timeout(t, sent).await.map_err(|_| ()),
                None => Ok(sent.await),
            };
            let outcome = match &result {
                Err(()) => Outcome::PerTryTimeout,
                Ok(Ok(resp)) => Outcome::Status(resp.status().as_u16()),
                Ok(Err(e)) if e.is_connect() => Outcome::ConnectFailure,
                Ok(Err(_)) => Outcome::Reset,
            };
            if let Some(e) = endpoint {
                if upstream::record(cluster, e, outcome.is_5xx(), upstream::now_ms()) {
                    metrics::get().ejections.with_label_values(&[&cluster.name]).inc();
                    tracing::info!(cluster = %cluster.name, endpoint = %e.addr, "outlier ejected");
                }
            }
            drop(retrying);
            let mut again = attempt + 1 < max_attempts && policy.is_some_and(|p| retry::retriable(p, outcome));
            if again && state.active_retries.load(Ordering::Relaxed) >= cluster.limits.max_retries {
                metrics::get().overflow.with_label_values(&[&cluster.name]).inc();
                again = false;
            }
            if again {
                metrics::get().retries.with_label_values(&[&cluster.name]).inc();
            }
            if !again {
                if let Ok(Ok(resp)) = result {
                    return Ok(resp);
                }
                return Err((Flag::None, Some(outcome)));
            }
            avoid = Some(addr);
            last = Some(outcome);
        }
        Err((Flag::None, last))
    };
    let result = match fwd.timeout {
        Some(t) => match tokio::time::timeout(t, attempts).await {
            Ok(r) => r,
            Err(_) => Err((Flag::Timeout, None)),
        },
        None => attempts.await,
    };
    match result {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Either::Left(body))
        }
        Err((Flag::NoHealthy, _)) => {
            report.flag = Flag::NoHealthy;
            local(StatusCode::SERVICE_UNAVAILABLE, "no healthy upstream")
        }
        Err((Flag::Timeout, _)) | Err((_, Some(Outcome::PerTryTimeout))) => {
            report.flag = Flag::Timeout;
            local(StatusCode::GATEWAY_TIMEOUT, "upstream request timeout")
        }
        Err((_, Some(Outcome::ConnectFailure))) => {
            report.flag = Flag::ConnectFailure;
            local(
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream connect error or disconnect/reset before headers. reset reason: connection failure",
            )
        }
        Err(_) => {
            report.flag = Flag::Reset;
            local(
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream connect error or disconnect/reset before headers. reset reason: connection termination",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_not_forwarded() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("keep-alive, x-private"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn local_replies_as_envoy() {
        let r = local(StatusCode::SERVICE_UNAVAILABLE, "no healthy upstream");
        assert_eq!(r.status(), 503);
        assert_eq!(Flag::NoHealthy.as_str(), "UH");
        assert_eq!(Flag::Overflow.as_str(), "UO");
    }
}
