//! The answers the dashboard makes itself: Kubernetes `Status` objects, as the apiserver's
//! errors are, so the page reads one kind of error.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A Kubernetes `Status` answer.
pub fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": reason, "code": code.as_u16(),
    });
    (code, [(header::CONTENT_TYPE, "application/json")], format!("{body}\n")).into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_status_as_the_apiserver_writes_it() {
        let r = super::status(axum::http::StatusCode::NOT_FOUND, "NotFound", "no");
        assert_eq!(r.status(), 404);
        assert_eq!(r.headers()["content-type"], "application/json");
    }
}
