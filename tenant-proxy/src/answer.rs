//! The proxy's own answers: Kubernetes `Status` bodies and JSON, as the apiserver writes
//! them (a trailing newline, as Go's encoder).

use axum::response::{IntoResponse, Response};
use http::{header, StatusCode};
use serde_json::{json, Value};

/// A Kubernetes `Status` answer.
pub fn status(code: u16, reason: &str, message: &str, details: Option<Value>) -> Response {
    let mut body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason});
    if let Some(d) = details {
        body["details"] = d;
    }
    body["code"] = json!(code);
    let mut bytes = serde_json::to_vec(&body).unwrap_or_default();
    bytes.push(b'\n');
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

pub fn not_found() -> Response {
    status(404, "NotFound", "the server could not find the requested resource", Some(json!({})))
}
/// A JSON answer (the body with Go's trailing newline).
pub fn json_response(code: StatusCode, body: &Value) -> Response {
    let mut bytes = serde_json::to_vec(body).unwrap_or_default();
    bytes.push(b'\n');
    (code, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}
