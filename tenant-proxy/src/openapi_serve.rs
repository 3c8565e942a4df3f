//! The OpenAPI documents' shell: fetched upstream as JSON, cut to the tenant's view
//! (`openapi.rs`), and `/openapi/v2` encoded as protobuf when the client asks for it (kubectl
//! 1.27 and 1.28 do).

use axum::response::{IntoResponse, Response};
use http::{header, HeaderMap, Method, StatusCode};
use serde_json::Value;

use crate::answer::{json_response, status};
use crate::tenant::Caller;
use crate::upstream::{read, send, Upstream};

async fn fetch(upstream: &Upstream, caller: &Caller, path: &str) -> Result<(StatusCode, bytes::Bytes), Response> {
    let headers = vec![(header::ACCEPT, "application/json".to_string())];
    let resp = send(upstream, caller, Method::GET, path, headers, Vec::new()).await?;
    let (parts, bytes) = read(resp).await?;
    Ok((parts.status, bytes))
}

fn parse(bytes: &[u8]) -> Result<Value, Response> {
    serde_json::from_slice(bytes)
        .map_err(|e| status(503, "ServiceUnavailable", &format!("the apiserver's OpenAPI document: {e}"), None))
}

pub async fn v2(upstream: &Upstream, caller: &Caller, headers: &HeaderMap) -> Response {
    let (code, bytes) = match fetch(upstream, caller, "/openapi/v2").await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if !code.is_success() {
        return (code, bytes).into_response();
    }
    let doc = match parse(&bytes) {
        Ok(d) => crate::openapi::v2_down(&caller.tenant, d),
        Err(r) => return r,
    };
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if accept.contains("application/com.github.proto-openapi.spec.v2") {
        let body = apimachinery::openapiproto::encode(&doc);
        return (StatusCode::OK, [(header::CONTENT_TYPE, apimachinery::openapiproto::MEDIA_TYPE)], body)
            .into_response();
    }
    json_response(StatusCode::OK, &doc)
}

pub async fn v3_root(upstream: &Upstream, caller: &Caller) -> Response {
    let (code, bytes) = match fetch(upstream, caller, "/openapi/v3").await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if !code.is_success() {
        return (code, bytes).into_response();
    }
    match parse(&bytes) {
        Ok(d) => json_response(StatusCode::OK, &crate::openapi::v3_root_down(&caller.tenant, d)),
        Err(r) => r,
    }
}

pub async fn v3(upstream: &Upstream, caller: &Caller, gv: &str, query: &str) -> Response {
    let Some(up) = crate::openapi::v3_path_up(&caller.tenant, gv) else {
        return status(404, "NotFound", "the server could not find the requested resource", None);
    };
    let path = if query.is_empty() { up.clone() } else { format!("{up}?{query}") };
    let (code, bytes) = match fetch(upstream, caller, &path).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if !code.is_success() {
        return (code, bytes).into_response();
    }
    let group = up.strip_prefix("/openapi/v3/apis/").and_then(|r| r.split('/').next()).unwrap_or_default();
    let text = crate::openapi::v3_doc_down(&caller.tenant, group, String::from_utf8_lossy(&bytes).into_owned());
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], text).into_response()
}
