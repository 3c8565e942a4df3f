//! The request path: who the caller is, what it addresses, the same request upstream (as the
//! proxy, or impersonating the caller), and the answer converted back. The decisions are
//! `request`, `convert`, `discovery` and `openapi`'s pure functions; this is their shell.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use http::{header, HeaderMap, HeaderValue, Method};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::answer::{json_response, not_found, status};
use crate::convert::Converter;
use crate::discovery::Discovery;
use crate::request::{self, ResourcePath, Target};
use crate::resources::{access, Access, Resource};
use crate::tenant::{Caller, Tenant};
use crate::tenants::Tenants;
use crate::upstream::{read, send};

/// The largest request body (kube-apiserver's limit is 3 MiB).
const MAX_BODY: usize = 3 << 20;

/// What the TLS listener made of the connection's client certificate.
#[derive(Clone, Debug)]
pub struct Authn(pub Result<Caller, String>);

/// The listener's reading of a verified client certificate.
pub fn authn_of_certificate(der: &[u8]) -> Option<Authn> {
    let info = common::pki::inspect(der).ok()?;
    Some(Authn(Caller::from_subject(&info.common_name, &info.organizations)))
}

pub struct Proxy {
    pub client: kube::Client,
    pub upstream: crate::upstream::Upstream,
    pub discovery: Arc<Discovery>,
    pub tenants: Arc<Tenants>,
    pub metrics: crate::metrics::Metrics,
}

/// Every request of a tenant.
pub async fn handle(State(proxy): State<Arc<Proxy>>, req: Request) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let response = serve(&proxy, req).await;
    proxy.metrics.observe(method.as_str(), response.status().as_u16(), started.elapsed());
    response
}

async fn serve(proxy: &Proxy, req: Request) -> Response {
    let caller = match req.extensions().get::<Authn>() {
        None => return status(401, "Unauthorized", "Unauthorized: the tenant proxy needs a client certificate", None),
        Some(Authn(Err(message))) => return status(403, "Forbidden", message, None),
        Some(Authn(Ok(c))) => c.clone(),
    };
    if let Err(message) = proxy.tenants.admit(&proxy.client, &caller.tenant).await {
        return status(403, "Forbidden", &message, None);
    }
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    match request::parse(&path) {
        Target::NotFound => not_found(),
        Target::Public => forward_plain(proxy, &caller, req, &path, &query).await,
        Target::CoreDiscovery => forward_plain(proxy, &caller, req, &path, "").await,
        Target::Groups => {
            discovery_doc(proxy, &caller, "/apis", |t, v| {
                crate::discovery::groups_down(t, v);
                true
            })
            .await
        }
        Target::Group(g) => {
            let up = format!("/apis/{}", caller.tenant.group_up(&g));
            discovery_doc(proxy, &caller, &up, crate::discovery::group_down).await
        }
        Target::GroupVersion(g, v) => {
            let up = format!("/apis/{}/{v}", caller.tenant.group_up(&g));
            discovery_doc(proxy, &caller, &up, |t, v| {
                crate::discovery::resource_list_down(t, v);
                true
            })
            .await
        }
        Target::OpenApiV2 => crate::openapi_serve::v2(&proxy.upstream, &caller, req.headers()).await,
        Target::OpenApiV3Root => crate::openapi_serve::v3_root(&proxy.upstream, &caller).await,
        Target::OpenApiV3(gv) => crate::openapi_serve::v3(&proxy.upstream, &caller, &gv, &query).await,
        Target::Resource(p) => resource(proxy, &caller, req, p, &query).await,
    }
}

/// Health and version, and the core group's discovery: the same for every tenant.
async fn forward_plain(proxy: &Proxy, caller: &Caller, req: Request, path: &str, query: &str) -> Response {
    let pq = if query.is_empty() { path.to_string() } else { format!("{path}?{query}") };
    let headers = vec![(header::ACCEPT, "application/json".to_string())];
    let resp = match send(&proxy.upstream, caller, req.method().clone(), &pq, headers, Vec::new()).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    passthrough(resp)
}

fn passthrough(resp: crate::upstream::Response) -> Response {
    let (parts, body) = resp.into_parts();
    let mut out = Response::new(Body::new(body));
    *out.status_mut() = parts.status;
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        out.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
    }
    out
}

async fn discovery_doc(
    proxy: &Proxy,
    caller: &Caller,
    upstream: &str,
    down: impl FnOnce(&Tenant, &mut Value) -> bool,
) -> Response {
    let headers = vec![(header::ACCEPT, "application/json".to_string())];
    let resp = match send(&proxy.upstream, caller, Method::GET, upstream, headers, Vec::new()).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let (parts, bytes) = match read(resp).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
        return (parts.status, bytes).into_response();
    };
    if !parts.status.is_success() {
        Converter::new(&caller.tenant, &proxy.discovery.tables()).status_down(&mut v);
        return json_response(parts.status, &v);
    }
    if !down(&caller.tenant, &mut v) {
        return not_found();
    }
    json_response(parts.status, &v)
}

/// The verb of a resource request, as RBAC names it.
fn is_read(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn wants_watch(path: &ResourcePath, query: &str) -> bool {
    path.watch || url::form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "watch" && (v == "true" || v == "1"))
}

/// The Accept header upstream: JSON (the conversion reads JSON), as a Table when the
/// client asked for one. Protobuf-capable clients all accept JSON as well.
fn accept_up(headers: &HeaderMap) -> String {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if accept.contains("as=Table") {
        let v = if accept.contains("v=v1beta1") { "v1beta1" } else { "v1" };
        format!("application/json;as=Table;v={v};g=meta.k8s.io,application/json")
    } else if accept.contains("as=PartialObjectMetadata") {
        let kind = if accept.contains("as=PartialObjectMetadataList") {
            "PartialObjectMetadataList"
        } else {
            "PartialObjectMetadata"
        };
        format!("application/json;as={kind};v=v1;g=meta.k8s.io,application/json")
    } else {
        "application/json".to_string()
    }
}

async fn resource(proxy: &Proxy, caller: &Caller, req: Request, path: ResourcePath, query: &str) -> Response {
    let tenant = &caller.tenant;
    let upstream_group = tenant.group_up(&path.group);
    let Some(res) = proxy.discovery.find(&upstream_group, &path.version, &path.plural).await else {
        return not_found();
    };
    if path.namespace.is_some() && !res.namespaced {
        return not_found();
    }
    let method = req.method().clone();
    match access(&res.group, &res.plural) {
        Access::Forbidden => {
            let what = if res.group.is_empty() { res.plural.clone() } else { format!("{}.{}", res.plural, res.group) };
            return status(
                403,
                "Forbidden",
                &format!("{what} is forbidden: it is the cluster administrator's, not a tenant's"),
                Some(json!({"group": res.group, "kind": res.plural})),
            );
        }
        Access::SharedReadOnly if !is_read(&method) => {
            let what = if res.group.is_empty() { res.plural.clone() } else { format!("{}.{}", res.plural, res.group) };
            return status(
                403,
                "Forbidden",
                &format!("{what} is forbidden: they are shared by every tenant and read-only to them"),
                Some(json!({"group": res.group, "kind": res.plural})),
            );
        }
        _ => {}
    }
    if let Some(resp) = check_namespace_length(tenant, &path) {
        return resp;
    }
    let up_query = request::upstream_query(tenant, &res, &path, query);
    let mut pq = path.upstream(tenant, &res);
    if !up_query.is_empty() {
        pq = format!("{pq}?{up_query}");
    }
    // One snapshot of the resource tables for the request, taken after `find` read any new ones.
    let tables = proxy.discovery.tables();
    let conv = Converter::new(tenant, &tables);
    if crate::connect::is_upgrade(req.headers()) {
        return crate::connect::splice(&proxy.upstream, &conv, caller, req, &pq).await;
    }
    let (parts, body) = req.into_parts();
    let content_type =
        parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return status(413, "RequestEntityTooLarge", "the request body is larger than 3 MiB", None),
    };
    let body = match body_up(&conv, &res, &content_type, &body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut headers = vec![(header::ACCEPT, accept_up(&parts.headers))];
    if content_type.starts_with(apiserver::protobuf::MEDIA_TYPE) {
        headers.push((header::CONTENT_TYPE, "application/json".to_string()));
    } else if !content_type.is_empty() {
        headers.push((header::CONTENT_TYPE, content_type.clone()));
    }
    if let Some(ua) = parts.headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()) {
        headers.push((header::USER_AGENT, ua.to_string()));
    }
    let watch = is_read(&method) && wants_watch(&path, query);
    let resp = match send(&proxy.upstream, caller, method.clone(), &pq, headers, body).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if !json {
        return passthrough(resp); // logs, proxied answers
    }
    if watch && resp.status().is_success() {
        return watch_down(proxy, tenant.clone(), res, resp);
    }
    let (parts, bytes) = match read(resp).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Ok(mut v) = serde_json::from_slice::<Value>(&bytes) else {
        return (parts.status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response();
    };
    if !conv.body_down(&mut v, Some(&res)) {
        // One object that is not the tenant's: as if it did not exist.
        let name = path.name.clone().unwrap_or_default();
        let what = if res.group.is_empty() { res.plural.clone() } else { format!("{}.{}", res.plural, path.group) };
        return status(
            404,
            "NotFound",
            &format!("{what} \"{name}\" not found"),
            Some(json!({"name": name, "group": path.group, "kind": res.plural})),
        );
    }
    json_response(parts.status, &v)
}

/// A name whose stored form is longer than Kubernetes allows: the tenant's limit, in
/// Kubernetes' words, before anything is sent.
fn check_namespace_length(tenant: &Tenant, path: &ResourcePath) -> Option<Response> {
    let ns_room = 63 - tenant.prefix().len();
    if let Some(ns) = &path.namespace {
        if ns.len() > ns_room {
            return Some(status(
                422,
                "Invalid",
                &format!("namespace {ns:?} is invalid: must be no more than {ns_room} characters in this cluster (a tenant's)"),
                None,
            ));
        }
    }
    None
}

/// The limit on a stored name of this resource: namespaces are DNS labels (63), other
/// cluster-scoped names DNS subdomains (253).
fn name_room(tenant: &Tenant, res: &Resource) -> Option<usize> {
    if res.namespaced
        || access(&res.group, &res.plural) != Access::Own
        || crate::resources::is_crd(&res.group, &res.plural)
    {
        return None;
    }
    let limit = if res.group.is_empty() && res.plural == "namespaces" { 63 } else { 253 };
    Some(limit - tenant.prefix().len())
}

/// A request body as stored: JSON objects and merge, strategic and apply patches converted
/// as objects; JSON patches as they are (their paths name fields, not objects). A protobuf
/// body (kubectl's typed clients send them) goes on as JSON.
fn body_up(conv: &Converter<'_>, res: &Resource, content_type: &str, body: &[u8]) -> Result<Vec<u8>, Response> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(body.to_vec());
    }
    let media = content_type.split(';').next().unwrap_or_default().trim();
    let mut v: Value = match media {
        "application/json" | "application/merge-patch+json" | "application/strategic-merge-patch+json" | "" => {
            serde_json::from_slice(body)
                .map_err(|e| status(400, "BadRequest", &format!("the request body is not JSON: {e}"), None))?
        }
        "application/apply-patch+yaml" | "application/yaml" => serde_yaml::from_slice(body)
            .map_err(|e| status(400, "BadRequest", &format!("the request body is not YAML: {e}"), None))?,
        "application/json-patch+json" => return Ok(body.to_vec()),
        apiserver::protobuf::MEDIA_TYPE => apiserver::protobuf::decode(body).map_err(|e| {
            status(400, "BadRequest", &format!("the protobuf request body could not be decoded: {e}"), None)
        })?,
        other => {
            return Err(status(
                415,
                "UnsupportedMediaType",
                &format!("the tenant proxy reads JSON and YAML request bodies, not {other:?}"),
                None,
            ))
        }
    };
    if let Some(room) = name_room(conv.tenant, res) {
        if let Some(name) = v.pointer("/metadata/name").and_then(Value::as_str) {
            if name.len() > room {
                let kind = v["kind"].as_str().unwrap_or(&res.kind).to_string();
                return Err(status(
                    422,
                    "Invalid",
                    &format!("{kind} {name:?} is invalid: metadata.name: Invalid value: {name:?}: must be no more than {room} characters in this cluster (a tenant's)"),
                    Some(json!({"name": name, "kind": res.plural, "causes": [{"reason": "FieldValueInvalid", "message": format!("must be no more than {room} characters"), "field": "metadata.name"}]})),
                ));
            }
        }
    }
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        for item in items {
            conv.up(item, Some(res));
        }
    } else {
        conv.up(&mut v, Some(res));
    }
    Ok(serde_json::to_vec(&v).unwrap_or_default())
}

/// A watch's events converted one by one; another tenant's never pass.
fn watch_down(proxy: &Proxy, tenant: Tenant, res: Resource, resp: crate::upstream::Response) -> Response {
    let (parts, body) = resp.into_parts();
    let discovery = proxy.discovery.clone();
    let mut pending: Vec<u8> = Vec::new();
    let stream = body.into_data_stream().flat_map(move |chunk| {
        let mut out: Vec<Result<Bytes, std::io::Error>> = Vec::new();
        match chunk {
            Err(e) => out.push(Err(std::io::Error::other(e.to_string()))),
            Ok(bytes) => {
                pending.extend_from_slice(&bytes);
                let tables = discovery.tables();
                let conv = Converter::new(&tenant, &tables);
                while let Some(i) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=i).collect();
                    let Ok(mut event) = serde_json::from_slice::<Value>(&line) else { continue };
                    if conv.event_down(&mut event, Some(&res)) {
                        let mut bytes = serde_json::to_vec(&event).unwrap_or_default();
                        bytes.push(b'\n');
                        out.push(Ok(Bytes::from(bytes)));
                    }
                }
            }
        }
        futures::stream::iter(out)
    });
    let mut out = Response::new(Body::from_stream(stream));
    *out.status_mut() = parts.status;
    out.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    out
}
