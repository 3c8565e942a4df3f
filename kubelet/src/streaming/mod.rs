//! Streaming endpoints of the kubelet server: `/exec/{ns}/{pod}/{container}` and
//! `/attach/{ns}/{pod}/{container}` (GET and POST; query `command` repeated, `stdin`/`input`,
//! `stdout`/`output`, `stderr`, `tty`), reached through the apiserver's upgrade-aware proxy
//! (`apiserver/src/proxy.rs`).
//!
//! Layers:
//! - this module: options (pure), [`Streams`]/[`Outcome`] — the transport-independent shape of a
//!   session, the `Status` that ends it (pure) — and the HTTP handlers choosing a transport;
//! - `websocket.rs`: the `*.channel.k8s.io` WebSocket framing and its driver;
//! - `exec.rs`: the container side (exec and attach through the runtime), knowing nothing of transports.
//!
//! Another transport (SPDY/3.1, for kubectl ≤ 1.29) plugs in by building [`Streams`] and calling
//! [`exec::run`] with [`Session`]: see [`handle`]. Port-forwarding lives beside (add its route in
//! [`routes`]).

pub mod exec;
pub mod portforward;
pub mod spdy;
pub mod spdy_exec;
pub mod websocket;

use std::sync::Arc;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::kubelet::Kubelet;
use crate::runtime::State as CState;

/// A terminal size (a resize event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermSize {
    pub width: u16,
    pub height: u16,
}

/// The transport side of a session. A `None` stream was not requested; stdin ends when its
/// sender is dropped; a failed send on stdout/stderr means the client is gone.
pub struct Streams {
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    pub stdout: Option<mpsc::Sender<Bytes>>,
    pub stderr: Option<mpsc::Sender<Bytes>>,
    pub resize: mpsc::Receiver<TermSize>,
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The command exited with this code (attach: the stream ended, 0).
    Exited(i64),
    /// The session could not run (Docker refused, the container stopped, …).
    Error(String),
}

impl Outcome {
    /// The `meta/v1 Status` the error channel carries (what kubectl turns into
    /// `command terminated with exit code N` and its own exit code).
    pub fn status(&self) -> Value {
        match self {
            Outcome::Exited(0) => json!({"metadata": {}, "status": "Success"}),
            Outcome::Exited(code) => json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("command terminated with non-zero exit code: error executing command, exit code {code}"),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
            }),
            Outcome::Error(msg) => json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("Internal error occurred: {msg}"),
                "reason": "InternalError",
                "code": 500,
                "details": {"causes": [{"message": msg}]},
            }),
        }
    }
}

/// Exec or attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Session {
    Exec,
    Attach,
}

/// The options of an exec/attach request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamOptions {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

fn truthy(v: &str) -> bool {
    matches!(v, "1" | "true" | "True" | "TRUE" | "t" | "T")
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse the query of an exec/attach request (Kubernetes' `remotecommand.NewOptions` rules:
/// tty turns stderr off, at least one stream, exec needs a command).
pub fn parse_options(raw_query: &str, session: Session) -> Result<StreamOptions, String> {
    let mut o = StreamOptions::default();
    for pair in raw_query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match percent_decode(k).as_str() {
            "command" => o.command.push(v),
            "stdin" | "input" => o.stdin = truthy(&v),
            "stdout" | "output" => o.stdout = truthy(&v),
            "stderr" => o.stderr = truthy(&v),
            "tty" => o.tty = truthy(&v),
            _ => {}
        }
    }
    if o.tty {
        o.stderr = false;
    }
    if !o.stdin && !o.stdout && !o.stderr {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    if session == Session::Exec && o.command.is_empty() {
        return Err("you must specify at least one command for the container".into());
    }
    Ok(o)
}

/// A `meta/v1 Status` error response.
pub fn status_response(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// The routes of this module, merged into the kubelet server's router.
pub fn routes() -> Router<Arc<Kubelet>> {
    Router::new()
        .route("/exec/{ns}/{pod}/{container}", get(exec_handler).post(exec_handler))
        .route("/attach/{ns}/{pod}/{container}", get(attach_handler).post(attach_handler))
        .route("/portForward/{ns}/{pod}", get(portforward::handler).post(portforward::handler))
        .route("/portForward/{ns}/{pod}/{uid}", get(portforward::handler).post(portforward::handler))
}

async fn exec_handler(
    State(k): State<Arc<Kubelet>>,
    Path(p): Path<(String, String, String)>,
    req: Request,
) -> Response {
    handle(k, Session::Exec, p, req).await
}

async fn attach_handler(
    State(k): State<Arc<Kubelet>>,
    Path(p): Path<(String, String, String)>,
    req: Request,
) -> Response {
    handle(k, Session::Attach, p, req).await
}

/// The Docker id of a pod's running container (app containers first, then init containers),
/// or the error response.
pub async fn find_container(k: &Kubelet, ns: &str, pod: &str, container: &str) -> Result<String, Response> {
    let records =
        k.rt.list(None)
            .await
            .map_err(|e| status_response(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", &format!("{e:#}")))?;
    let mine: Vec<_> = records.into_iter().filter(|r| r.pod_namespace == ns && r.pod_name == pod).collect();
    if mine.is_empty() {
        return Err(status_response(StatusCode::NOT_FOUND, "NotFound", "pod does not exist"));
    }
    let Some(c) = crate::status::named(&mine, container).0 else {
        return Err(status_response(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("container \"{container}\" in pod \"{pod}\" not found"),
        ));
    };
    if c.state != CState::Running {
        return Err(status_response(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("container \"{container}\" in pod \"{pod}\" is not running"),
        ));
    }
    Ok(c.id.clone())
}

/// Whether a request asks for a WebSocket upgrade.
fn is_websocket(req: &Request) -> bool {
    req.headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case("websocket")))
}

/// Validate, find the container, then upgrade on the transport the client asked for.
async fn handle(
    k: Arc<Kubelet>,
    session: Session,
    (ns, pod, container): (String, String, String),
    req: Request,
) -> Response {
    let opts = match parse_options(req.uri().query().unwrap_or_default(), session) {
        Ok(o) => o,
        Err(m) => return status_response(StatusCode::BAD_REQUEST, "BadRequest", &m),
    };
    let id = match find_container(&k, &ns, &pod, &container).await {
        Ok(id) => id,
        Err(resp) => return resp,
    };
    if spdy::is_spdy_upgrade(req.headers()) {
        // kubectl ≤ 1.29: the same session over SPDY streams (`spdy_exec.rs`).
        tracing::debug!(%ns, %pod, %container, ?session, transport = %"SPDY", "stream session");
        let rt = k.rt.clone();
        return spdy::upgrade(req, &spdy_exec::PROTOCOLS, move |io, proto| async move {
            let o = opts.clone();
            spdy_exec::serve(
                io,
                proto,
                opts,
                move |streams| async move { exec::run(&rt, session, &id, &o, streams).await },
            )
            .await
        });
    }
    if !is_websocket(&req) {
        return status_response(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "Upgrade request required (the kubelet speaks the WebSocket *.channel.k8s.io protocols)",
        );
    }
    let (mut parts, _) = req.into_parts();
    let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(ws) => ws.protocols(websocket::PROTOCOLS),
        Err(rejection) => return rejection.into_response(),
    };
    let selected = ws.selected_protocol().and_then(|p| p.to_str().ok()).map(str::to_string);
    let offered = parts.headers.get(header::SEC_WEBSOCKET_PROTOCOL).is_some();
    let proto = match (selected.as_deref(), offered) {
        (Some(p), _) => websocket::Protocol::from_header(Some(p)),
        (None, false) => Some(websocket::Protocol::V1),
        (None, true) => None,
    };
    let Some(proto) = proto else {
        return status_response(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("none of the offered subprotocols is supported; supported: {}", websocket::PROTOCOLS.join(", ")),
        );
    };
    tracing::debug!(%ns, %pod, %container, ?session, ?proto, command = ?opts.command, "stream session");
    let rt = k.rt.clone();
    ws.on_upgrade(move |socket| async move {
        let (i, o, e) = (opts.stdin, opts.stdout, opts.stderr);
        websocket::serve(socket, proto, i, o, e, move |streams| async move {
            exec::run(&rt, session, &id, &opts, streams).await
        })
        .await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let o =
            parse_options("command=sh&command=-c&command=echo%20a%2Bb&stdin=true&stdout=1&stderr=true", Session::Exec)
                .unwrap();
        assert_eq!(o.command, vec!["sh", "-c", "echo a+b"]);
        assert!(o.stdin && o.stdout && o.stderr && !o.tty);
        let tty = parse_options("command=sh&input=1&output=1&stderr=1&tty=1", Session::Exec).unwrap();
        assert!(tty.stdin && tty.stdout && tty.tty && !tty.stderr, "tty turns stderr off");
        assert!(parse_options("command=ls", Session::Exec).unwrap_err().contains("at least 1 of"));
        assert!(parse_options("stdout=true", Session::Exec).unwrap_err().contains("at least one command"));
        assert!(parse_options("stdout=true", Session::Attach).is_ok());
    }

    #[test]
    fn statuses() {
        assert_eq!(Outcome::Exited(0).status(), json!({"metadata": {}, "status": "Success"}));
        let s = Outcome::Exited(3).status();
        assert_eq!(s["status"], "Failure");
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"], json!([{"reason": "ExitCode", "message": "3"}]));
        let e = Outcome::Error("boom".into()).status();
        assert_eq!((e["reason"].as_str(), e["code"].as_i64()), (Some("InternalError"), Some(500)));
        assert_eq!(e["message"], "Internal error occurred: boom");
    }
}
