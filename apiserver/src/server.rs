//! The HTTP layer: one router for discovery and every resource path, a thin shell over the
//! registry and the watch cache.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};

use crate::admission;
use crate::error::{ApiError, ApiResult};
use crate::metrics::{GaugeGuard, Metrics};
use crate::patch::PatchType;
use crate::query::{delete_options, list_options, q_bool, write_options};
use crate::registry::generic::{
    key_of, prefix_of, Deleted, FieldValidation, ListOptions, Registry, UpdateKind, WriteOptions,
};
use crate::registry::pod;
use crate::registry::scale::ScaleWrite;
use crate::requestinfo::{self, ResourcePath, Target};
use crate::resources::{self, ResourceDef, Sub};
use crate::watch::{self, Filter, WatchCaches, WatchTiming};

/// Kubernetes' request body limit.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

pub struct AppState {
    pub registry: Arc<Registry>,
    pub caches: Arc<WatchCaches>,
    pub metrics: Arc<Metrics>,
    pub readonly: Arc<Semaphore>,
    pub mutating: Arc<Semaphore>,
    pub server_address: String,
    pub timing: WatchTiming,
    /// The token authenticators (the request path's and TokenReview's).
    pub authenticators: Arc<crate::authn::Authenticators>,
    /// The ServiceAccount token issuer, if one is configured.
    pub service_account_issuer: Option<Arc<crate::serviceaccount::Issuer>>,
    /// The configured authorizers (`--authorization-mode`): the authorization layer, the
    /// access reviews and escalation prevention ask them.
    pub authz: Arc<crate::authz::Authorizer>,
    /// The admission webhooks' configurations.
    pub webhooks: Arc<crate::webhook::Webhooks>,
    /// Whether the store is etcd (ComponentStatus names it `etcd-0`).
    pub etcd: bool,
    /// API aggregation: the APIServices served by other API servers.
    pub aggregator: Arc<crate::aggregator::Aggregator>,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .route("/readyz", get(healthz))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .route("/.well-known/openid-configuration", get(openid_configuration))
        .route("/openid/v1/jwks", get(openid_jwks))
        .route("/openapi/v2", get(openapi_v2))
        .route("/openapi/v3", get(openapi_v3_root))
        .route("/openapi/v3/{*gv}", get(openapi_v3))
        .fallback(dispatch)
        .with_state(state)
}

async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    match state.registry.store.current_revision().await {
        Ok(_) => (StatusCode::OK, "ok").into_response(),
        Err(e) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("[-]storage failed: {e}\nhealthz check failed")).into_response()
        }
    }
}

async fn livez() -> &'static str {
    "ok"
}

/// OIDC discovery of the ServiceAccount token issuer (404 without one).
async fn openid_configuration(State(state): State<Arc<AppState>>) -> Response {
    match &state.service_account_issuer {
        Some(i) => json_response(StatusCode::OK, &crate::serviceaccount::discovery(i), &[]),
        None => ApiError::not_found_message("the server could not find the requested resource").into_response(),
    }
}

async fn openid_jwks(State(state): State<Arc<AppState>>) -> Response {
    match &state.service_account_issuer {
        Some(i) => {
            let body = serde_json::to_vec(&i.keys.jwks()).unwrap_or_default();
            ([(header::CONTENT_TYPE, "application/jwk-set+json")], body).into_response()
        }
        None => ApiError::not_found_message("the server could not find the requested resource").into_response(),
    }
}

async fn version() -> Response {
    json_response(StatusCode::OK, &version_info(), &[])
}

pub fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "gitVersion": "v1.37.0-minik8s",
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": concat!("rust (minik8s ", env!("CARGO_PKG_VERSION"), ")"),
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, match std::env::consts::ARCH { "x86_64" => "amd64", "aarch64" => "arm64", a => a }),
    })
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut r = state.metrics.render().into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    r
}

// ------------------------------------------------------------------ openapi

/// Serve a prebuilt document; `If-None-Match` with its ETag answers 304.
fn serve_doc(headers: &HeaderMap, doc: &crate::openapi::Doc, immutable: bool) -> Response {
    let etag = format!("\"{}\"", doc.etag);
    let cache = if immutable { "public, immutable" } else { "no-cache, private" };
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut r = if matches {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = (StatusCode::OK, doc.bytes.clone()).into_response();
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    };
    if let Ok(v) = HeaderValue::from_str(&etag) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    r
}

/// Whether the client accepts JSON.
fn accepts_json(headers: &HeaderMap) -> bool {
    match headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(a) => a.split(',').any(|t| {
            let t = t.split(';').next().unwrap_or_default().trim();
            t.is_empty() || t == "*/*" || t == "application/*" || t == "application/json"
        }),
    }
}

async fn openapi_v2(headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if accept.contains("application/com.github.proto-openapi.spec.v2") {
        let mut r = serve_doc(&headers, crate::openapi::v2_proto(), false);
        if r.status() == StatusCode::OK {
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(apimachinery::openapiproto::MEDIA_TYPE));
        }
        return r;
    }
    if !accepts_json(&headers) {
        return ApiError::new(406, "NotAcceptable", "only application/json is supported for /openapi/v2")
            .into_response();
    }
    serve_doc(&headers, crate::openapi::v2(), false)
}

async fn openapi_v3_root(headers: HeaderMap) -> Response {
    serve_doc(&headers, &crate::openapi::v3_root(), false)
}

async fn openapi_v3(
    headers: HeaderMap,
    axum::extract::Path(gv): axum::extract::Path<String>,
    uri: axum::http::Uri,
) -> Response {
    let gv = gv.trim_matches('/');
    match crate::openapi::v3(gv) {
        Some(doc) => serve_doc(&headers, doc, uri.query().is_some_and(|q| q.contains("hash="))),
        None => match crate::openapi::custom_gv_doc(gv) {
            Some(doc) => serve_doc(&headers, &doc, false),
            None => not_found_path().into_response(),
        },
    }
}

fn json_response(code: StatusCode, v: &Value, warnings: &[String]) -> Response {
    json_bytes_response(code, serde_json::to_vec(v).unwrap_or_default(), warnings)
}

/// A JSON body already serialized.
fn json_bytes_response(code: StatusCode, body: Vec<u8>, warnings: &[String]) -> Response {
    let mut r = (code, body).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for w in warnings {
        let text = format!("299 - {}", serde_json::to_string(w).unwrap_or_default());
        if let Ok(h) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, h);
        }
    }
    r
}

/// A core/v1 resource of the table (always there).
fn core_resource(plural: &str) -> ApiResult<&'static ResourceDef> {
    resources::find("", "v1", plural).ok_or_else(|| ApiError::internal(format!("no {plural} resource")))
}

fn not_found_path() -> ApiError {
    ApiError::not_found_message("the server could not find the requested resource")
}

/// Labels for metrics: (verb, group, resource, subresource).
fn metric_labels(
    method: &Method,
    target: &Option<Target>,
    query: &HashMap<String, String>,
) -> (String, String, String, String) {
    match target {
        Some(Target::Resource(rp)) => {
            let watch = query.get("watch").is_some_and(|v| v == "true" || v == "1");
            (
                requestinfo::verb(method, rp, watch).to_uppercase(),
                rp.group.clone(),
                rp.resource.clone(),
                rp.subresource.clone().unwrap_or_default(),
            )
        }
        Some(_) => (method.as_str().to_string(), String::new(), "discovery".into(), String::new()),
        None => (method.as_str().to_string(), String::new(), String::new(), String::new()),
    }
}

async fn dispatch(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let start = Instant::now();
    let (mut parts, body) = req.into_parts();
    let query: HashMap<String, String> = parts.uri.query().map(requestinfo::form_urlencoded_pairs).unwrap_or_default();
    let target = requestinfo::parse(parts.uri.path());
    let (verb, group, resource, sub) = metric_labels(&parts.method, &target, &query);
    let aggregated = state.aggregator.serving(parts.uri.path());
    let result = match (&target, aggregated) {
        // A group-version of an aggregated API server: proxied to it.
        (_, Some(entry)) => Ok(state.aggregator.handle(entry, &mut parts, body).await),
        // pods/exec, attach, portforward: long-running upgrades proxied to the kubelet.
        (Some(Target::Resource(rp)), None) if pod::proxy::is_stream_subresource(rp) => {
            let rp = rp.clone();
            match (core_resource("pods"), core_resource("nodes")) {
                (Ok(pods), Ok(nodes)) => pod::proxy::stream(&state.registry, pods, nodes, &mut parts, &rp).await,
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        }
        // Access and identity reviews: answered, never stored.
        (Some(Target::Resource(rp)), None) if crate::reviews::serves(&rp.group) => {
            let user = parts.extensions.get::<crate::authn::UserInfo>();
            review(&state, &parts.method, &parts.headers, rp, user, body).await
        }
        (_, None) => {
            let user = parts.extensions.get::<crate::authn::UserInfo>();
            route(&state, &parts.method, &parts.headers, &query, target, user, body).await
        }
    };
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            if e.code >= 500 {
                tracing::warn!(method = %parts.method, path = parts.uri.path(), code = e.code, message = e.message, "request failed");
            } else {
                tracing::debug!(method = %parts.method, path = parts.uri.path(), code = e.code, message = e.message, "request rejected");
            }
            e.into_response()
        }
    };
    let code = resp.status().as_u16().to_string();
    state.metrics.requests.with_label_values(&[&verb, &group, &resource, &sub, &code]).inc();
    state.metrics.latency.with_label_values(&[&verb, &group, &resource, &sub]).observe(start.elapsed().as_secs_f64());
    resp
}

async fn route(
    state: &Arc<AppState>,
    method: &Method,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    target: Option<Target>,
    user: Option<&crate::authn::UserInfo>,
    body: Body,
) -> ApiResult<Response> {
    let is_get = *method == Method::GET || *method == Method::HEAD;
    let discovery = |v: Option<Value>| -> ApiResult<Response> {
        if !is_get {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
        v.map(|v| json_response(StatusCode::OK, &v, &[])).ok_or_else(not_found_path)
    };
    match target {
        None => Err(not_found_path()),
        Some(Target::CoreVersions) => discovery(Some(crate::discovery::api_versions(&state.server_address))),
        Some(Target::Groups) => {
            let mut list = crate::discovery::api_group_list();
            state.aggregator.add_groups(&mut list);
            discovery(Some(list))
        }
        Some(Target::Group(g)) => discovery(state.aggregator.group(&g, crate::discovery::api_group(&g))),
        Some(Target::ResourceList { group, version }) => {
            discovery(crate::discovery::api_resource_list(&group, &version))
        }
        Some(Target::Resource(rp)) if rp.group == crate::metricsapi::GROUP => {
            if !is_get {
                return Err(ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                ));
            }
            let watch = q_bool(query, "watch")?.unwrap_or(false);
            let v = crate::metricsapi::serve(&state.registry, &rp, watch, list_options(query)?).await?;
            Ok(json_response(StatusCode::OK, &v, &[]))
        }
        Some(Target::Resource(rp))
            if rp.group.is_empty() && rp.resource == "componentstatuses" && rp.subresource.is_none() =>
        {
            if !is_get || q_bool(query, "watch")?.unwrap_or(false) {
                return Err(ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                ));
            }
            let v = crate::componentstatus::serve(&state.registry, state.etcd, rp.name.as_deref()).await?;
            let warnings = [crate::componentstatus::DEPRECATION.to_string()];
            if wants_table(headers) {
                let list = if v["kind"] == "ComponentStatusList" { v } else { crate::componentstatus::list(vec![v]) };
                let t = crate::table::component_status_table(&list, query);
                return Ok(json_response(StatusCode::OK, &t, &warnings));
            }
            Ok(json_response(StatusCode::OK, &v, &warnings))
        }
        Some(Target::Resource(rp)) => resource_request(state, method, headers, query, rp, user, body).await,
    }
}

/// Which part of the stored object a PUT/PATCH of `sub` may change.
fn update_kind(sub: Option<Sub>) -> UpdateKind {
    match sub {
        Some(Sub::Status) => UpdateKind::Status,
        Some(s @ (Sub::Finalize | Sub::EphemeralContainers | Sub::Approval)) => UpdateKind::Subresource(s),
        _ => UpdateKind::Main,
    }
}

/// `POST` of a review (see [`crate::reviews`]).
async fn review(
    state: &AppState,
    method: &Method,
    headers: &HeaderMap,
    rp: &ResourcePath,
    user: Option<&crate::authn::UserInfo>,
    body: Body,
) -> ApiResult<Response> {
    let kind = crate::reviews::Kind::find(&rp.group, &rp.resource)
        .filter(|k| rp.version == crate::reviews::VERSION && k.namespaced() == rp.namespace.is_some())
        .filter(|_| rp.name.is_none() && rp.subresource.is_none())
        .ok_or_else(not_found_path)?;
    if *method != Method::POST {
        return Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"));
    }
    let bytes = read_body(headers, body).await?;
    let obj = decode_object(headers, &bytes)?;
    let requester = crate::reviews::requester(user);
    // A TokenReview's token is looked up here (it may need storage); the review decides the rest.
    let reviewed = match (kind, obj.pointer("/spec/token").and_then(Value::as_str)) {
        (crate::reviews::Kind::TokenReview, Some(token)) => {
            let audiences: Option<Vec<String>> = obj
                .pointer("/spec/audiences")
                .and_then(Value::as_array)
                .filter(|a| !a.is_empty())
                .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect());
            state.authenticators.token(token, audiences.as_deref()).await
        }
        _ => None,
    };
    let out = crate::reviews::review(kind, rp.namespace.as_deref(), obj, &requester, reviewed, &state.authz)?;
    Ok(json_response(StatusCode::CREATED, &out, &[]))
}

/// Read a request body, refusing more than [`MAX_BODY_BYTES`].
async fn read_body(headers: &HeaderMap, body: Body) -> ApiResult<Bytes> {
    if let Some(len) =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok())
    {
        if len > MAX_BODY_BYTES {
            return Err(ApiError::too_large(MAX_BODY_BYTES));
        }
    }
    axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|e| {
        let msg = e.to_string();
        if msg.contains("length limit") || msg.contains("too large") {
            ApiError::too_large(MAX_BODY_BYTES)
        } else {
            ApiError::bad_request(format!("error reading the request body: {msg}"))
        }
    })
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// Decode a create/update body (JSON or YAML).
fn decode_object(headers: &HeaderMap, bytes: &[u8]) -> ApiResult<Value> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::bad_request("the request body is empty; an object is required"));
    }
    match content_type(headers).as_str() {
        "" | "application/json" | "*/*" => serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("the body of the request could not be decoded as JSON: {e}"))),
        crate::protobuf::MEDIA_TYPE => crate::protobuf::decode(bytes)
            .map_err(|e| ApiError::bad_request(format!("the body of the request could not be decoded as protobuf: {e}"))),
        "application/yaml" | "application/x-yaml" | "text/yaml" => {
            let v: Value = serde_yaml::from_slice(bytes)
                .map_err(|e| ApiError::bad_request(format!("the body of the request could not be decoded as YAML: {e}")))?;
            Ok(v)
        }
        other => Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format ({other}) - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf"
        ))),
    }
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.split(',').next().is_some_and(|first| first.contains("as=Table")))
}

// ------------------------------------------------------------------ resources

/// How the version a client addresses relates to what is stored. Most resources are stored
/// as they are served; a converted view (events.k8s.io/v1 over core/v1 Events,
/// autoscaling/v1 over autoscaling/v2 HPAs: `views.rs`) is stored as another version and
/// converted on the way in and out. Everything else about a request is the same, so there
/// is one request path and this is its decode/encode step.
#[derive(Clone, Copy)]
struct Codec {
    /// What the URL addresses.
    served: &'static ResourceDef,
    /// Where it is stored (tables are rendered from the stored form).
    stored: &'static ResourceDef,
    view: Option<&'static crate::views::View>,
}

impl Codec {
    fn of(served: &'static ResourceDef) -> ApiResult<Self> {
        let Some(view) = crate::views::of(served) else { return Ok(Codec { served, stored: served, view: None }) };
        let (g, v, p) = view.storage;
        let stored = resources::find(g, v, p).ok_or_else(|| ApiError::internal("no storage resource for the view"))?;
        Ok(Codec { served, stored, view: Some(view) })
    }

    /// A stored object as the client's version.
    fn out(&self, obj: Value) -> Value {
        match self.view {
            Some(v) => (v.to_view)(&obj),
            None => obj,
        }
    }

    fn out_list(&self, mut list: Value) -> Value {
        let Some(v) = self.view else { return list };
        if let Some(items) = list.get_mut("items").and_then(Value::as_array_mut) {
            for i in items.iter_mut() {
                *i = (v.to_view)(i);
            }
        }
        list["apiVersion"] = json!(v.api_version());
        list["kind"] = json!(format!("{}List", v.kind));
        list
    }

    /// A body in the client's version, as the stored version: typed check (unknown fields
    /// as warnings) as the served version, then converted. A stored resource's body goes to
    /// the store as it came (the store checks it).
    fn incoming(
        &self,
        reg: &Registry,
        ns: Option<&str>,
        obj: Value,
        fv: FieldValidation,
    ) -> ApiResult<(Value, Vec<String>)> {
        let Some(v) = self.view else { return Ok((obj, vec![])) };
        let (obj, warnings) = reg.decode_body(self.served, ns, obj, fv)?;
        let stored = (v.from_view)(&obj).map_err(|e| {
            ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: {e}",
                v.kind, v.version, v.kind
            ))
        })?;
        Ok((stored, warnings))
    }

    /// List options with field-selector fields named as stored.
    fn list_options(&self, query: &HashMap<String, String>) -> ApiResult<ListOptions> {
        let mut opts = list_options(query)?;
        if let Some(v) = self.view {
            for r in opts.field_selector.requirements.iter_mut() {
                r.field = (v.field)(&r.field);
            }
        }
        Ok(opts)
    }

    /// The answer for one object: a one-row Table (from the stored form), or the object in
    /// the client's version.
    fn respond(
        &self,
        code: StatusCode,
        obj: Value,
        table: bool,
        query: &HashMap<String, String>,
        warnings: &[String],
    ) -> Response {
        if table {
            return respond_object(code, self.stored, obj, true, query, warnings);
        }
        json_response(code, &self.out(obj), warnings)
    }
}

/// The service account a new pod runs as, as the ServiceAccount admission plugin reads it:
/// `default` may be a moment behind its namespace (the controller-manager creates it), so it
/// is looked for ten times over about 1.5 s; a missing one refuses the pod (403).
async fn service_account(reg: &Registry, ns: &str, name: &str, pod: &str) -> ApiResult<Value> {
    let res = core_resource("serviceaccounts")?;
    let attempts = if name == "default" { 10 } else { 1 };
    for attempt in 0..attempts {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(100 + rand::random::<u64>() % 100)).await;
        }
        match reg.get(res, ns, name).await {
            Ok(sa) => return Ok(sa),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::new(
        403,
        "Forbidden",
        format!("pods \"{pod}\" is forbidden: error looking up service account {ns}/{name}: serviceaccount \"{name}\" not found"),
    ))
}

/// RuntimeClass admission of a new pod: the class it names read, the pure rule applied.
async fn runtime_class_admission(reg: &Registry, pod: &mut Value) -> ApiResult<()> {
    let class = match admission::runtime_class_name(pod) {
        Some(name) => {
            let res = resources::find("node.k8s.io", "v1", "runtimeclasses").ok_or_else(not_found_path)?;
            match reg.get(res, "", name).await {
                Ok(c) => Some(c),
                Err(e) if e.code == 404 => None,
                Err(e) => return Err(e),
            }
        }
        None => None,
    };
    admission::admit_runtime_class(pod, class.as_ref()).map_err(|why| {
        let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        ApiError::new(403, "Forbidden", format!("pods {name:?} is forbidden: {why}"))
    })
}

/// Who a write is recorded as in managedFields: the `fieldManager` parameter, else the
/// User-Agent's part before its first `/` (`kubectl-edit/v1.33.0 (linux/amd64) …` is
/// `kubectl-edit`), as Kubernetes names the managers of updates.
fn field_manager(query: &HashMap<String, String>, headers: &HeaderMap) -> String {
    match query.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) => m.clone(),
        None => {
            let ua = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default();
            ua.split('/').next().unwrap_or_default().chars().take(128).collect()
        }
    }
}

/// The default StorageClass's name (DefaultStorageClass admission of a new claim).
async fn default_storage_class(reg: &crate::registry::generic::Registry) -> ApiResult<Option<String>> {
    let Some(classes) = resources::find("storage.k8s.io", "v1", "storageclasses") else { return Ok(None) };
    let list = reg.list(classes, None, &Default::default()).await?;
    Ok(admission::default_storage_class(list["items"].as_array().map(Vec::as_slice).unwrap_or_default()))
}

async fn resource_request(
    state: &Arc<AppState>,
    method: &Method,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    rp: ResourcePath,
    user: Option<&crate::authn::UserInfo>,
    body: Body,
) -> ApiResult<Response> {
    let Some(served) = resources::find(&rp.group, &rp.version, &rp.resource) else {
        return Err(not_found_path());
    };
    if (!served.namespaced && rp.namespace.is_some())
        || (served.namespaced && rp.namespace.is_none() && rp.name.is_some())
    {
        return Err(not_found_path());
    }
    let codec = Codec::of(served)?;
    let res = codec.stored;
    let sub = match &rp.subresource {
        Some(s) => Some(served.has_sub(s).ok_or_else(not_found_path)?),
        None => None,
    };
    let watch_param = q_bool(query, "watch")?.unwrap_or(false);
    let verb = requestinfo::verb(method, &rp, watch_param);
    let not_allowed =
        || ApiError::method_not_allowed("the server does not allow this method on the requested resource");

    // Bound in-flight requests (watches are long-running and not counted).
    let _permit = if verb == "watch" {
        None
    } else {
        let (sem, kind) =
            if matches!(verb, "get" | "list") { (&state.readonly, "readOnly") } else { (&state.mutating, "mutating") };
        let permit = sem.clone().try_acquire_owned().map_err(|_| ApiError::too_many_requests())?;
        Some((permit, GaugeGuard::new(state.metrics.inflight.with_label_values(&[kind]))))
    };

    let ns = rp.namespace.clone().unwrap_or_default();
    let name = rp.name.clone().unwrap_or_default();
    let reg = &state.registry;
    let table = wants_table(headers);
    // Admission that depends on who asks: escalation prevention, NodeRestriction.
    let admit = crate::authz::write_admission(&state.authz, user, &rp);
    let webhooks = || -> Option<Arc<dyn crate::registry::generic::AdmissionWebhooks>> {
        if state.webhooks.none_configured() {
            return None;
        }
        Some(Arc::new(crate::webhook::Caller {
            webhooks: state.webhooks.clone(),
            user: crate::webhook::user_info(user),
        }))
    };
    let write_options = |query: &HashMap<String, String>| -> ApiResult<WriteOptions> {
        let manager = Some(field_manager(query, headers));
        Ok(WriteOptions { admit: admit.clone(), webhooks: webhooks(), manager, ..write_options(query)? })
    };
    let delete_options =
        |query: &HashMap<String, String>, body: &[u8]| -> ApiResult<crate::registry::generic::DeleteOptions> {
            Ok(crate::registry::generic::DeleteOptions { webhooks: webhooks(), ..delete_options(query, body)? })
        };
    // Stored as served and no table asked for: the stored bytes answer as they are.
    let raw_ok = codec.view.is_none() && !table;

    match (verb, sub) {
        // ---- main resource
        ("get", None) => {
            if raw_ok {
                // The stored JSON with its resourceVersion spliced in: no decode/encode.
                return Ok(json_bytes_response(StatusCode::OK, reg.get_json(res, &ns, &name).await?, &[]));
            }
            Ok(codec.respond(StatusCode::OK, reg.get(res, &ns, &name).await?, table, query, &[]))
        }
        ("list", None) => {
            let opts = codec.list_options(query)?;
            if raw_ok {
                let list = reg.list_json(res, rp.namespace.as_deref(), &opts).await?;
                return Ok(json_bytes_response(StatusCode::OK, list, &[]));
            }
            let list = reg.list(res, rp.namespace.as_deref(), &opts).await?;
            if table {
                return Ok(json_response(StatusCode::OK, &crate::table::to_table(res, &list, query), &[]));
            }
            Ok(json_response(StatusCode::OK, &codec.out_list(list), &[]))
        }
        ("watch", None) => {
            let mut opts = codec.list_options(query)?;
            if rp.name.is_some() {
                opts.field_selector.requirements.push(crate::selectors::FieldRequirement {
                    field: "metadata.name".into(),
                    value: name.clone(),
                    negate: false,
                });
            }
            let enc = WatchEncoder::new(codec.view.map(|v| v.to_view), headers, res, query);
            serve_watch(state, res, rp.namespace.clone(), opts, query, enc).await
        }
        ("create", None) => {
            if rp.name.is_some() || (res.namespaced && rp.namespace.is_none()) {
                return Err(not_allowed());
            }
            let bytes = read_body(headers, body).await?;
            let opts = write_options(query)?;
            let (mut obj, w) =
                codec.incoming(reg, rp.namespace.as_deref(), decode_object(headers, &bytes)?, opts.field_validation)?;
            if res.group.is_empty() && res.plural == "persistentvolumeclaims" && admission::wants_default_class(&obj) {
                admission::admit_claim(&mut obj, default_storage_class(reg).await?.as_deref());
            }
            if res.group.is_empty()
                && res.plural == "pods"
                && state.service_account_issuer.is_some()
                && !admission::is_mirror_pod(&obj)
                && !opts.dry_run
            {
                let pod = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
                let account = service_account(reg, &ns, &admission::service_account_name(&obj), &pod).await?;
                admission::mount_service_account_token(&mut obj, &account, &apimachinery::names::random_suffix());
            }
            if res.group.is_empty() && res.plural == "pods" {
                runtime_class_admission(reg, &mut obj).await?;
            }
            if res.group == "certificates.k8s.io" && res.plural == "certificatesigningrequests" {
                crate::registry::csr::set_requester(&mut obj, user);
            }
            let mut out = reg.create(res, &ns, obj, &opts).await?;
            out.warnings.splice(0..0, w);
            match out.json {
                Some(json) if raw_ok => Ok(json_bytes_response(StatusCode::CREATED, json, &out.warnings)),
                _ => Ok(codec.respond(StatusCode::CREATED, out.object, table, query, &out.warnings)),
            }
        }
        ("update", None)
        | ("update", Some(Sub::Status))
        | ("update", Some(Sub::Finalize))
        | ("update", Some(Sub::EphemeralContainers))
        | ("update", Some(Sub::Approval)) => {
            if rp.name.is_none() {
                return Err(not_allowed());
            }
            let bytes = read_body(headers, body).await?;
            let opts = write_options(query)?;
            let (obj, w) =
                codec.incoming(reg, rp.namespace.as_deref(), decode_object(headers, &bytes)?, opts.field_validation)?;
            let (mut out, created) = reg.update(res, &ns, &name, obj, update_kind(sub), &opts).await?;
            out.warnings.splice(0..0, w);
            let code = if created { StatusCode::CREATED } else { StatusCode::OK };
            Ok(codec.respond(code, out.object, table, query, &out.warnings))
        }
        ("patch", None)
        | ("patch", Some(Sub::Status))
        | ("patch", Some(Sub::EphemeralContainers))
        | ("patch", Some(Sub::Approval)) => {
            if rp.name.is_none() {
                return Err(not_allowed());
            }
            let ptype = patch_type(headers)?;
            let bytes = read_body(headers, body).await?;
            let opts = write_options(query)?;
            if ptype == PatchType::Apply {
                if sub.is_some() {
                    return Err(ApiError::unsupported_media_type(
                        "server-side apply of a subresource is not supported - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json",
                    ));
                }
                // A view's configuration is applied converted to the stored version (the
                // managedFields entries name the stored version).
                let config = crate::registry::apply::parse_config(served, &name, &bytes)?;
                let config = match codec.view {
                    Some(v) => (v.from_view)(&config).map_err(ApiError::bad_request)?,
                    None => config,
                };
                let apply_opts = crate::registry::apply::ApplyOptions {
                    field_manager: query.get("fieldManager").map(String::as_str).unwrap_or_default(),
                    force: q_bool(query, "force")?.unwrap_or(false),
                    write: opts,
                };
                let (out, created) = reg.apply(res, &ns, &name, config, &apply_opts).await?;
                let code = if created { StatusCode::CREATED } else { StatusCode::OK };
                return Ok(codec.respond(code, out.object, table, query, &out.warnings));
            }
            let target = crate::registry::generic::PatchTarget { served, view: codec.view };
            let out = reg.patch(res, &ns, &name, ptype, &bytes, update_kind(sub), &opts, target).await?;
            Ok(codec.respond(StatusCode::OK, out.object, table, query, &out.warnings))
        }
        ("delete", None) => {
            let bytes = read_body(headers, body).await?;
            let opts = delete_options(query, &bytes)?;
            match reg.delete(res, &ns, &name, &opts).await? {
                Deleted::Now(obj) if !res.strategy.return_deleted_object() => {
                    let uid = obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
                    Ok(json_response(StatusCode::OK, &success_status(served, &name, uid), &[]))
                }
                Deleted::Now(obj) | Deleted::Marked(obj) => {
                    let code =
                        if opts.orphan_dependents == Some(false) { StatusCode::ACCEPTED } else { StatusCode::OK };
                    Ok(json_response(code, &codec.out(obj), &[]))
                }
            }
        }
        ("deletecollection", None) => {
            let bytes = read_body(headers, body).await?;
            let opts = delete_options(query, &bytes)?;
            let list = reg.delete_collection(res, rp.namespace.as_deref(), &codec.list_options(query)?, &opts).await?;
            Ok(json_response(StatusCode::OK, &codec.out_list(list), &[]))
        }
        // ---- status
        ("get", Some(Sub::Status)) | ("get", Some(Sub::EphemeralContainers)) | ("get", Some(Sub::Approval)) => {
            Ok(codec.respond(StatusCode::OK, reg.get(res, &ns, &name).await?, table, query, &[]))
        }
        // ---- scale
        ("get", Some(Sub::Scale)) => {
            let obj = reg.get(res, &ns, &name).await?;
            let scale = crate::registry::scale::scale_of(res, &obj)?;
            let body = if table { crate::table::scale_table(&scale, query) } else { scale };
            Ok(json_response(StatusCode::OK, &body, &[]))
        }
        ("update", Some(Sub::Scale)) | ("patch", Some(Sub::Scale)) => {
            let bytes = read_body(headers, body).await?;
            let write = if verb == "patch" {
                ScaleWrite::Patch(patch_type(headers)?, &bytes)
            } else {
                ScaleWrite::Replace(decode_object(headers, &bytes)?)
            };
            let scale = crate::registry::scale::update(reg, res, &ns, &name, write, &write_options(query)?).await?;
            Ok(json_response(StatusCode::OK, &scale, &[]))
        }
        // ---- pods/binding
        ("create", Some(Sub::Binding)) => {
            let bytes = read_body(headers, body).await?;
            let binding = decode_object(headers, &bytes)?;
            pod::binding::bind(reg, res, &ns, &name, &binding, &write_options(query)?).await?;
            Ok(json_response(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                &[],
            ))
        }
        // ---- serviceaccounts/token
        ("create", Some(Sub::Token)) => {
            let Some(issuer) = &state.service_account_issuer else {
                return Err(ApiError::not_found_message("the server could not find the requested resource"));
            };
            let bytes = read_body(headers, body).await?;
            let request = decode_object(headers, &bytes)?;
            let account = reg.get(res, &ns, &name).await?;
            let bound = match request.pointer("/spec/boundObjectRef/kind").and_then(Value::as_str) {
                Some(kind @ ("Pod" | "Secret" | "Node")) => {
                    let bound_res = core_resource(&format!("{}s", kind.to_lowercase()))?;
                    let bound_ns = if bound_res.namespaced { ns.as_str() } else { "" };
                    let bound_name =
                        request.pointer("/spec/boundObjectRef/name").and_then(Value::as_str).unwrap_or_default();
                    match reg.get(bound_res, bound_ns, bound_name).await {
                        Ok(obj) => Some(obj),
                        Err(e) if e.code == 404 => None,
                        Err(e) => return Err(e),
                    }
                }
                _ => None,
            };
            let now = jiff::Timestamp::now().as_second();
            let out = crate::serviceaccount::token_request(issuer, &account, &request, bound.as_ref(), now)?;
            Ok(json_response(StatusCode::CREATED, &out, &[]))
        }
        // ---- pods/eviction
        ("create", Some(Sub::Eviction)) => {
            let bytes = read_body(headers, body).await?;
            let eviction = decode_object(headers, &bytes)?;
            let del = eviction.get("deleteOptions").cloned().unwrap_or(json!({}));
            // The eviction is what is admitted, not the pod's deletion it makes.
            let opts = crate::query::delete_options(query, &serde_json::to_vec(&del).unwrap_or_default())?;
            let pdbs = resources::find("policy", "v1", "poddisruptionbudgets")
                .ok_or_else(|| ApiError::internal("no poddisruptionbudgets resource"))?;
            pod::eviction::evict(reg, res, pdbs, &ns, &name, &eviction, &opts).await?;
            Ok(json_response(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                &[],
            ))
        }
        // ---- pods/log: proxied to the node's kubelet
        ("get", Some(Sub::NotYetServed("log", _))) if res.plural == "pods" => {
            pod::proxy::logs(reg, res, core_resource("nodes")?, &ns, &name, query).await
        }
        // ---- nodes/proxy: GET proxied to the node's kubelet
        ("get", Some(Sub::NotYetServed("proxy", _))) if res.plural == "nodes" => {
            let node = reg.get(res, "", &name).await?;
            let (host, port) = crate::kubeletclient::kubelet_address(&node)?;
            let mut q: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            q.sort();
            let q = if q.is_empty() { String::new() } else { format!("?{}", q.join("&").replace([' ', '#'], "")) };
            crate::kubeletclient::proxy_get(&host, port, &format!("/{}{q}", rp.subpath)).await
        }
        (_, Some(Sub::NotYetServed(what, needs))) => {
            Err(ApiError::not_found_message(format!("{}/{what} is not served yet (it needs {needs})", res.plural)))
        }
        _ => Err(not_allowed()),
    }
}

fn patch_type(headers: &HeaderMap) -> ApiResult<PatchType> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    match PatchType::from_content_type(ct) {
        Some(p) => Ok(p),
        None => Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format ({ct}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
        ))),
    }
}

fn success_status(res: &ResourceDef, name: &str, uid: Value) -> Value {
    let mut details = json!({"name": name, "kind": res.plural, "uid": uid});
    if !res.group.is_empty() {
        details["group"] = json!(res.group);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

fn respond_object(
    code: StatusCode,
    res: &ResourceDef,
    obj: Value,
    table: bool,
    query: &HashMap<String, String>,
    warnings: &[String],
) -> Response {
    if table {
        let list = json!({"metadata": {"resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)}, "items": [obj]});
        return json_response(code, &crate::table::to_table(res, &list, query), warnings);
    }
    json_response(code, &obj, warnings)
}

// ------------------------------------------------------------------ watch

/// A converted view of the stored objects (events.k8s.io/v1 over core/v1 Events).
type View = &'static (dyn Fn(&Value) -> Value + Send + Sync);

/// How a watch stream carries its objects: as stored, through a converted view, or as
/// one-row `meta.k8s.io/v1` Tables (`as=Table`, what `kubectl get -w` asks for). As in
/// Kubernetes, only the first Table event carries the column definitions.
struct WatchEncoder {
    view: Option<View>,
    table: Option<(&'static ResourceDef, HashMap<String, String>)>,
    sent_columns: bool,
}

impl WatchEncoder {
    fn new(
        view: Option<View>,
        headers: &HeaderMap,
        table_res: &'static ResourceDef,
        query: &HashMap<String, String>,
    ) -> Self {
        let table = wants_table(headers).then(|| (table_res, query.clone()));
        WatchEncoder { view, table, sent_columns: false }
    }

    /// One event line for `obj` (`raw`: its stored JSON, when at hand).
    fn line(&mut self, t: &str, obj: &Value, raw: Option<&[u8]>) -> Bytes {
        if let Some((res, query)) = &self.table {
            let rv = obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null);
            let list = json!({"metadata": {"resourceVersion": rv}, "items": [obj]});
            let mut table = crate::table::to_table(res, &list, query);
            if self.sent_columns {
                table["columnDefinitions"] = Value::Null;
            }
            self.sent_columns = true;
            return watch::event_line(t, &serde_json::to_vec(&table).unwrap_or_default());
        }
        match (self.view, raw) {
            (Some(f), _) => watch::event_line(t, &serde_json::to_vec(&f(obj)).unwrap_or_default()),
            (None, Some(raw)) => watch::event_line(t, raw),
            (None, None) => watch::event_line(t, &serde_json::to_vec(obj).unwrap_or_default()),
        }
    }
}

async fn serve_watch(
    state: &Arc<AppState>,
    res: &'static ResourceDef,
    ns: Option<String>,
    opts: ListOptions,
    query: &HashMap<String, String>,
    mut enc: WatchEncoder,
) -> ApiResult<Response> {
    Registry::check_field_selector(res, &opts.field_selector)?;
    let watch::WatchParams { bookmarks, send_initial, timeout } =
        watch::WatchParams::parse(query, opts.resource_version_match.as_deref())?;
    let rv = opts.resource_version.clone().unwrap_or_default();
    let key_prefix = crate::registry::generic::list_prefix(res, ns.as_deref(), &opts);
    let cache = state.caches.get(&prefix_of(res, None)).await?;

    // Where the stream starts, and the initial events.
    let rv_num = crate::resourceversion::parse(&rv)?.filter(|n| *n != 0);
    let wants_initial = match send_initial {
        Some(b) => b,
        None => rv_num.is_none(),
    };
    let mut initial: Vec<Bytes> = Vec::new();
    let after = if wants_initial {
        if let Some(n) = rv_num {
            let current = state.registry.store.current_revision().await?;
            if n > current {
                return Err(crate::resourceversion::too_large(n, current));
            }
        }
        let list = state
            .registry
            .list(
                res,
                ns.as_deref(),
                &ListOptions {
                    limit: 0,
                    continue_token: None,
                    resource_version: None,
                    resource_version_match: None,
                    ..opts.clone()
                },
            )
            .await?;
        for item in list["items"].as_array().into_iter().flatten() {
            initial.push(enc.line("ADDED", item, None));
        }
        list.pointer("/metadata/resourceVersion").and_then(Value::as_str).and_then(|s| s.parse().ok()).unwrap_or(0)
    } else {
        match rv_num {
            Some(n) => n,
            None => state.registry.store.current_revision().await?,
        }
    };
    let end_bookmark = send_initial == Some(true);

    let label = opts.label_selector.clone();
    let field = opts.field_selector.clone();
    let filter = Filter {
        key_prefix: key_prefix.clone(),
        matches: Box::new(move |o: &Value| Registry::matches(res, o, &label, &field)),
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(256);
    let guard = GaugeGuard::new(state.metrics.watchers.with_label_values(&[res.group, res.plural]));
    let store = state.registry.store.clone();
    let timing = state.timing;
    let api_version = res.api_version();
    tokio::spawn(async move {
        let _guard = guard;
        let deadline = tokio::time::Instant::now() + timeout;
        let send = |b: Bytes| {
            let tx = tx.clone();
            async move { tx.send(Ok(b)).await.is_ok() }
        };
        for line in initial {
            if !send(line).await {
                return;
            }
        }
        if end_bookmark && !send(watch::bookmark_line(&api_version, res.kind, after, true)).await {
            return;
        }
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + timing.bookmark_interval, timing.bookmark_interval);
        let mut events = watch::WatcherEvents::new(cache, store, filter.key_prefix.clone(), after);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = tx.closed() => return,
                _ = ticker.tick(), if bookmarks => {
                    let rv = events.last_revision();
                    if !send(watch::bookmark_line(&api_version, res.kind, rv, false)).await { return; }
                }
                ev = events.next() => match ev {
                    Some(Ok(ev)) => {
                        if let Some(t) = watch::event_type(&ev, &filter) {
                            if !send(enc.line(t, &ev.object, Some(&ev.object_json))).await { return; }
                        }
                    }
                    Some(Err(e)) => {
                        let _ = send(watch::error_line(&e)).await;
                        return;
                    }
                    // The cache was reset: the client re-watches from its last resourceVersion.
                    None => return,
                }
            }
        }
        if bookmarks {
            let _ = send(watch::bookmark_line(&api_version, res.kind, events.last_revision(), false)).await;
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    Ok(resp)
}

/// Key of an object, exposed for the bootstrap.
pub fn object_key(res: &ResourceDef, ns: &str, name: &str) -> String {
    key_of(res, ns, name)
}
