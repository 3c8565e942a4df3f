//! The dashboard's HTTP routes: the page's files, login and logout, and the three ways the
//! page reaches the cluster as the logged-in person — `/k8s/…` (the Kubernetes API,
//! streamed both ways, WebSocket exec relayed), `/yaml/…` (an object as YAML, and an edited
//! one stored, with the lines of its field errors) and `/prometheus/…` (range queries for
//! the plots, when the cluster runs Prometheus).
//!
//! Every answer the dashboard makes itself is a Kubernetes `Status`, as the apiserver's are,
//! so the page handles one kind of error.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::session::{self, Cluster, Session, Sessions};
use crate::status::status;
use crate::{assets, metrics, relay, yaml};

/// The most a request body may carry (the apiserver's own limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// What every route shares.
pub struct App {
    pub cluster: Cluster,
    pub sessions: Sessions,
    /// `--prometheus-url`: where the plots' range queries go.
    pub prometheus: Option<String>,
    /// Whether the dashboard serves HTTPS (its cookie is then `Secure`).
    pub secure: bool,
    pub assets: assets::Assets,
    /// Plain HTTP client for Prometheus.
    pub http: hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>,
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/session", get(session_info))
        .route("/login", post(login))
        .route("/logout", post(logout))
        .route("/k8s/{*path}", any(k8s))
        .route("/yaml/{*path}", any(yaml_object))
        .route("/prometheus/api/v1/{query}", get(prometheus))
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(|| async { common::metrics_response(&prometheus::gather()) }))
        .route("/", get(index))
        .route("/{file}", get(file))
        .layer(axum::middleware::from_fn(metrics::count))
        .with_state(app)
}

fn unauthorized(message: &str) -> Response {
    status(StatusCode::UNAUTHORIZED, "Unauthorized", message)
}

/// The session the request's cookie names.
fn session_of(app: &App, headers: &HeaderMap) -> Result<(String, Arc<Session>), Response> {
    let id = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(session::cookie_value)
        .map(str::to_string);
    let Some(id) = id else { return Err(unauthorized("not logged in")) };
    match app.sessions.get(&id) {
        Some(s) => Ok((id, s)),
        None => Err(unauthorized("the session has ended (logged out, or idle too long): log in again")),
    }
}

/// A change (any method but GET and HEAD) must come from the dashboard's own page: it sends
/// `X-Dashboard: 1`, which another site's form or script cannot make a browser send here.
fn from_the_page(method: &Method, headers: &HeaderMap) -> Result<(), Response> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) || headers.contains_key("x-dashboard") {
        return Ok(());
    }
    Err(status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        "a change must come from the dashboard's page (the X-Dashboard header is missing)",
    ))
}

fn user_json(app: &App, user: &session::User) -> Value {
    json!({"user": user.username, "groups": user.groups, "prometheus": app.prometheus.is_some()})
}

async fn session_info(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    match session_of(&app, &headers) {
        Ok((_, s)) => axum::Json(user_json(&app, &s.user)).into_response(),
        Err(r) => r,
    }
}

/// Who the apiserver says the credential is: a SelfSubjectReview, which every
/// authenticated user may create.
async fn review(client: &kube::Client) -> Result<session::User, Response> {
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let req = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
        .map_err(|e| status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()))?;
    match client.request::<Value>(req).await {
        Ok(v) => Ok(serde_json::from_value(v["status"]["userInfo"].clone()).unwrap_or_default()),
        Err(kube::Error::Api(s)) if s.code == 401 => {
            Err(unauthorized(&format!("the cluster refused these credentials: {}", s.message)))
        }
        Err(kube::Error::Api(s)) => {
            let code = StatusCode::from_u16(s.code).unwrap_or(StatusCode::BAD_GATEWAY);
            Err(status(code, &s.reason, format!("the cluster refused the login: {}", s.message)))
        }
        Err(e) => Err(status(StatusCode::BAD_GATEWAY, "ServiceUnavailable", format!("cannot reach the cluster: {e}"))),
    }
}

async fn login(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(r) = from_the_page(&Method::POST, &headers) {
        return r;
    }
    let req: session::LoginRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", format!("the login request is not JSON: {e}")),
    };
    let credential = match session::credential(&req) {
        Ok(c) => c,
        Err(e) => {
            metrics::login("invalid");
            return status(StatusCode::BAD_REQUEST, "BadRequest", e.0);
        }
    };
    let client = match kube::Client::try_from(session::config(&app.cluster, &credential)) {
        Ok(c) => c,
        Err(e) => {
            metrics::login("invalid");
            return status(StatusCode::BAD_REQUEST, "BadRequest", format!("unusable credentials: {e}"));
        }
    };
    let user = match review(&client).await {
        Ok(u) => u,
        Err(r) => {
            metrics::login("refused");
            return r;
        }
    };
    metrics::login("ok");
    tracing::info!(user = %user.username, "logged in");
    let body = user_json(&app, &user);
    let id = app.sessions.open(client, user);
    let cookie = session::set_cookie(&id, app.secure);
    (StatusCode::OK, [(header::SET_COOKIE, cookie)], axum::Json(body)).into_response()
}

async fn logout(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Ok((id, _)) = session_of(&app, &headers) {
        app.sessions.close(&id);
    }
    (StatusCode::NO_CONTENT, [(header::SET_COOKIE, session::set_cookie("", app.secure))]).into_response()
}

/// The apiserver path of `/k8s/<path>?<query>`; only the API's own paths.
fn api_path(path: &str, query: Option<&str>) -> Result<String, Response> {
    let first = path.split('/').next().unwrap_or_default();
    if !matches!(first, "api" | "apis" | "version" | "openapi") || path.split('/').any(|s| s == "..") {
        return Err(status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the dashboard proxies the API only, not /{path}"),
        ));
    }
    Ok(match query {
        Some(q) => format!("/{path}?{q}"),
        None => format!("/{path}"),
    })
}

/// The request headers worth passing on: what the body is and what answer is wanted. The
/// browser's cookies and any Authorization stay here.
const PASSED_REQUEST_HEADERS: [header::HeaderName; 2] = [header::CONTENT_TYPE, header::ACCEPT];
const PASSED_RESPONSE_HEADERS: [&str; 4] = ["content-type", "warning", "audit-id", "cache-control"];

async fn k8s(State(app): State<Arc<App>>, Path(path): Path<String>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let (id, session) = match session_of(&app, &parts.headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let target = match api_path(&path, parts.uri.query()) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if parts.headers.get(header::UPGRADE).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket")) {
        if let Err(r) = relay::same_origin(&parts.headers) {
            return r;
        }
        let ws = match axum::extract::ws::WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(ws) => ws,
            Err(e) => return e.into_response(),
        };
        return relay::exec(ws, session.client.clone(), target).await;
    }
    if let Err(r) = from_the_page(&parts.method, &parts.headers) {
        return r;
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return status(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge", e.to_string()),
    };
    let mut upstream = http::Request::builder().method(parts.method.clone()).uri(&target);
    for name in PASSED_REQUEST_HEADERS {
        if let Some(v) = parts.headers.get(&name) {
            upstream = upstream.header(name, v);
        }
    }
    let resp = match forward(&app, &id, &session, upstream.body(kube::client::Body::from(body))).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let (rparts, rbody) = resp.into_parts();
    let mut out = Response::builder().status(rparts.status);
    for name in PASSED_RESPONSE_HEADERS {
        if let Some(v) = rparts.headers.get(name) {
            out = out.header(name, v);
        }
    }
    // Watches and followed logs: each chunk goes to the page as it comes.
    out = out.header("x-accel-buffering", "no");
    out.body(Body::new(rbody.map_err(axum::Error::new)))
        .unwrap_or_else(|e| status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()))
}

/// Send a request to the apiserver as the session's person. A 401 ends the session: the
/// credential no longer works (an expired token).
async fn forward(
    app: &App,
    id: &str,
    session: &Session,
    req: http::Result<http::Request<kube::client::Body>>,
) -> Result<http::Response<kube::client::Body>, Response> {
    let req = req.map_err(|e| status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()))?;
    let resp =
        session.client.send(req).await.map_err(|e| {
            status(StatusCode::BAD_GATEWAY, "ServiceUnavailable", format!("cannot reach the cluster: {e}"))
        })?;
    if resp.status() == StatusCode::UNAUTHORIZED {
        app.sessions.close(id);
    }
    Ok(resp)
}

/// `GET /yaml/<path>`: the object as YAML. `PUT /yaml/<path>`: store the edited YAML; a
/// refusal is the apiserver's Status plus `lines`, where in the text each cause's field is.
async fn yaml_object(State(app): State<Arc<App>>, Path(path): Path<String>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let (id, session) = match session_of(&app, &parts.headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let target = match api_path(&path, None) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if let Err(r) = from_the_page(&parts.method, &parts.headers) {
        return r;
    }
    let (method, text, json_body) = match parts.method {
        Method::GET => (Method::GET, String::new(), Vec::new()),
        Method::PUT => {
            let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
                Ok(b) => b,
                Err(e) => return status(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge", e.to_string()),
            };
            let text = String::from_utf8_lossy(&bytes).into_owned();
            match yaml::parse(&text) {
                Ok(v) => (Method::PUT, text, v.to_string().into_bytes()),
                Err(e) => {
                    let s = json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": format!("the YAML does not parse: {}", e.message), "reason": "BadRequest",
                        "details": {}, "code": 400, "lines": [{"line": e.line, "message": e.message}],
                    });
                    return (StatusCode::BAD_REQUEST, axum::Json(s)).into_response();
                }
            }
        }
        _ => return status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "GET or PUT"),
    };
    let req = http::Request::builder()
        .method(method)
        .uri(&target)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(kube::client::Body::from(json_body));
    let resp = match forward(&app, &id, &session, req).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let code = resp.status();
    let bytes = match resp.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return status(StatusCode::BAD_GATEWAY, "ServiceUnavailable", format!("reading the answer: {e}")),
    };
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if code.is_success() {
        let yaml = yaml::to_yaml(value);
        return (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static("text/yaml; charset=utf-8"))], yaml)
            .into_response();
    }
    let mut st = if value.get("kind").and_then(Value::as_str) == Some("Status") {
        value
    } else {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": String::from_utf8_lossy(&bytes), "code": code.as_u16()})
    };
    st["lines"] = json!(error_lines(&text, &st));
    (code, axum::Json(st)).into_response()
}

/// Where the Status' field causes are in `text`: `[{line, field, message}]`.
fn error_lines(text: &str, st: &Value) -> Vec<Value> {
    let causes = st.pointer("/details/causes").and_then(Value::as_array).cloned().unwrap_or_default();
    let fields: Vec<&str> = causes.iter().map(|c| c["field"].as_str().unwrap_or_default()).collect();
    let lines = yaml::field_lines(text, &fields);
    causes
        .iter()
        .zip(lines)
        .filter_map(|(c, line)| {
            let line = line?;
            Some(json!({"line": line, "field": c["field"], "message": c["message"]}))
        })
        .collect()
}

/// `GET /prometheus/api/v1/query|query_range`: the plots' queries, to the cluster's
/// Prometheus. Only for a logged-in person, though Prometheus itself asks nobody.
async fn prometheus(State(app): State<Arc<App>>, Path(query): Path<String>, req: Request) -> Response {
    if let Err(r) = session_of(&app, req.headers()) {
        return r;
    }
    let Some(base) = app.prometheus.as_deref() else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the cluster runs no Prometheus (scripts/cluster up --monitoring)",
        );
    };
    if query != "query" && query != "query_range" {
        return status(StatusCode::NOT_FOUND, "NotFound", "only query and query_range");
    }
    let uri = format!(
        "{}/api/v1/{query}{}",
        base.trim_end_matches('/'),
        req.uri().query().map(|q| format!("?{q}")).unwrap_or_default()
    );
    let upstream = match http::Request::get(&uri).body(Body::empty()) {
        Ok(r) => r,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    match app.http.request(upstream).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            let mut out = Response::builder().status(parts.status);
            if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
                out = out.header(header::CONTENT_TYPE, ct);
            }
            out.body(Body::new(body.map_err(axum::Error::new)))
                .unwrap_or_else(|e| status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()))
        }
        Err(e) => status(StatusCode::BAD_GATEWAY, "ServiceUnavailable", format!("cannot reach Prometheus: {e}")),
    }
}

async fn index(State(app): State<Arc<App>>) -> Response {
    app.assets.get("index.html")
}

async fn file(State(app): State<Arc<App>>, Path(name): Path<String>) -> Response {
    app.assets.get(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_api_is_proxied() {
        assert_eq!(api_path("api/v1/pods", Some("watch=1")).unwrap(), "/api/v1/pods?watch=1");
        assert_eq!(api_path("apis/apps/v1/deployments", None).unwrap(), "/apis/apps/v1/deployments");
        assert_eq!(api_path("version", None).unwrap(), "/version");
        for bad in ["metrics", "healthz", "api/../metrics", "", "logs/x"] {
            assert_eq!(api_path(bad, None).unwrap_err().status(), StatusCode::NOT_FOUND, "{bad}");
        }
    }

    #[test]
    fn changes_need_the_page_header() {
        let mut h = HeaderMap::new();
        assert!(from_the_page(&Method::GET, &h).is_ok());
        assert_eq!(from_the_page(&Method::DELETE, &h).unwrap_err().status(), StatusCode::FORBIDDEN);
        h.insert("x-dashboard", HeaderValue::from_static("1"));
        assert!(from_the_page(&Method::PATCH, &h).is_ok());
    }

    #[test]
    fn error_lines_point_at_the_fields() {
        let st = json!({"kind": "Status", "details": {"causes": [
            {"field": "spec.replicas", "message": "must be greater than or equal to 0", "reason": "FieldValueInvalid"},
            {"field": "nowhere", "message": "x"},
        ]}});
        let lines = error_lines("kind: Deployment\nspec:\n  replicas: -1\n", &st);
        assert_eq!(
            lines,
            vec![json!({"line": 3, "field": "spec.replicas", "message": "must be greater than or equal to 0"})]
        );
    }
}
