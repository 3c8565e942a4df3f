//! API errors and their wire form: a `meta/v1` `Status` object, as Kubernetes returns them.
//!
//! Every failure a handler can produce is an [`ApiError`]; it carries the HTTP code, the
//! `reason` Kubernetes uses for that code, a message and optional `details`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// One cause of an `Invalid` error: a field path and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Kubernetes' cause type: `FieldValueRequired`, `FieldValueInvalid`, ...
    pub reason: &'static str,
    /// The field path, e.g. `spec.containers[0].name`.
    pub field: String,
    /// Human-readable message, already including the offending value where useful.
    pub message: String,
}

impl FieldError {
    /// The message without the field path in front (Go's `field.Error.ErrorBody`): what a
    /// `Status` cause carries beside its `field`, since clients print `field: message`
    /// (the official kubectl does for every cause of an Invalid error).
    pub fn body(&self) -> &str {
        self.message
            .strip_prefix(self.field.as_str())
            .and_then(|rest| rest.strip_prefix(": "))
            .filter(|_| !self.field.is_empty())
            .unwrap_or(&self.message)
    }

    pub fn required(field: impl Into<String>, detail: &str) -> Self {
        let field = field.into();
        let message = if detail.is_empty() {
            format!("{field}: Required value")
        } else {
            format!("{field}: Required value: {detail}")
        };
        FieldError { reason: "FieldValueRequired", field, message }
    }
    pub fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        let field = field.into();
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        FieldError { reason: "FieldValueInvalid", message: format!("{field}: Invalid value: {shown}: {detail}"), field }
    }
    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        let field = field.into();
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        FieldError { reason: "FieldValueDuplicate", message: format!("{field}: Duplicate value: {shown}"), field }
    }
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        let field = field.into();
        FieldError { reason: "FieldValueForbidden", message: format!("{field}: Forbidden: {detail}"), field }
    }
    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let field = field.into();
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        FieldError {
            reason: "FieldValueNotSupported",
            message: format!("{field}: Unsupported value: {shown}: supported values: {}", list.join(", ")),
            field,
        }
    }
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        let field = field.into();
        FieldError {
            reason: "FieldValueTooLong",
            message: format!("{field}: Too long: may not be more than {max} bytes"),
            field,
        }
    }
}

/// An error answered as a `Status` object.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Details>,
    /// Seconds for a `Retry-After` header (429, 503).
    pub retry_after: Option<u32>,
}

/// `Status.details`.
#[derive(Clone, Debug, Default)]
pub struct Details {
    pub name: String,
    pub group: String,
    pub kind: String,
    pub causes: Vec<FieldError>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError { code, reason, message: message.into(), details: None, retry_after: None }
    }
    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.details =
            Some(Details { name: name.to_string(), group: group.to_string(), kind: kind.to_string(), causes: vec![] });
        self
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    /// `<resource>[.<group>] "<name>" not found`
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{name}\" not found", qualified(group, resource)))
            .with_details(group, resource, name)
    }
    /// A 404 that names no object (an unknown path or subresource). Its `details` is
    /// present but empty, as Kubernetes sends it: kubectl tells this "route not served"
    /// answer from a missing object by the empty name (and `kubectl debug` dereferences
    /// `details` without a nil check).
    pub fn not_found_message(message: impl Into<String>) -> Self {
        let mut e = Self::new(404, "NotFound", message);
        e.details = Some(Details::default());
        e
    }
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", qualified(group, resource)))
            .with_details(group, resource, name)
    }
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {} \"{name}\": {why}", qualified(group, resource)),
        )
        .with_details(group, resource, name)
    }
    /// The optimistic-concurrency conflict message Kubernetes uses.
    pub fn stale(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<FieldError>) -> Self {
        let msgs: Vec<&str> = causes.iter().map(|c| c.message.as_str()).collect();
        let summary = if msgs.len() == 1 { msgs[0].to_string() } else { format!("[{}]", msgs.join(", ")) };
        let mut e = Self::new(422, "Invalid", format!("{} \"{name}\" is invalid: {summary}", qualified(group, kind)))
            .with_details(group, kind, name);
        if let Some(d) = e.details.as_mut() {
            d.causes = causes;
        }
        e
    }
    pub fn forbidden(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(403, "Forbidden", format!("{} \"{name}\" is forbidden: {why}", qualified(group, resource)))
            .with_details(group, resource, name)
    }
    /// Kubernetes' `NewForbidden`: names the resource (and the object) when there is one.
    pub fn forbidden_error(group: &str, resource: &str, name: &str, err: &str) -> Self {
        let message = if group.is_empty() && resource.is_empty() {
            format!("forbidden: {err}")
        } else if name.is_empty() {
            format!("{} is forbidden: {err}", qualified(group, resource))
        } else {
            format!("{} \"{name}\" is forbidden: {err}", qualified(group, resource))
        };
        Self::new(403, "Forbidden", message).with_details(group, resource, name)
    }
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(413, "RequestEntityTooLarge", format!("Request entity too large: limit is {limit}"))
    }
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }
    pub fn too_many_requests() -> Self {
        let mut e = Self::new(429, "TooManyRequests", "Too many requests, please try again later.");
        e.retry_after = Some(1);
        e
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(503, "ServiceUnavailable", message);
        e.retry_after = Some(1);
        e
    }
    pub fn timeout(message: impl Into<String>) -> Self {
        let mut e = Self::new(504, "Timeout", message);
        e.retry_after = Some(1);
        e
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", format!("Internal error occurred: {}", message.into()))
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            let mut details = serde_json::Map::new();
            if !d.name.is_empty() {
                details.insert("name".into(), d.name.clone().into());
            }
            if !d.group.is_empty() {
                details.insert("group".into(), d.group.clone().into());
            }
            if !d.kind.is_empty() {
                details.insert("kind".into(), d.kind.clone().into());
            }
            if !d.causes.is_empty() {
                let causes: Vec<Value> = d
                    .causes
                    .iter()
                    .map(|c| {
                        let mut cause = json!({"reason": c.reason, "message": c.body()});
                        // Kubernetes leaves out an empty field (`omitempty`).
                        if !c.field.is_empty() {
                            cause["field"] = c.field.clone().into();
                        }
                        cause
                    })
                    .collect();
                details.insert("causes".into(), Value::Array(causes));
            }
            status["details"] = Value::Object(details);
        }
        if let Some(secs) = self.retry_after {
            let details = status.as_object_mut().map(|o| o.entry("details").or_insert_with(|| json!({})));
            if let Some(Value::Object(d)) = details {
                d.insert("retryAfterSeconds".into(), secs.into());
            }
        }
        status
    }
}

/// `metav1.Status` with its fields in the order Go declares them (clients print and compare
/// error bodies verbatim), empty ones omitted as Go's `omitempty` does.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct WireStatus<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: serde_json::Map<String, Value>,
    status: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<WireDetails<'a>>,
    code: u16,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct WireDetails<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    group: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    kind: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    causes: Vec<WireCause<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u32>,
}

#[derive(serde::Serialize)]
struct WireCause<'a> {
    reason: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    field: &'a str,
}

impl ApiError {
    /// The response body: the Status as kube-apiserver writes it (Go's field order, then a
    /// newline).
    pub fn status_body(&self) -> Vec<u8> {
        let details = match (&self.details, self.retry_after) {
            (None, None) => None,
            (d, retry_after_seconds) => {
                let d = d.as_ref();
                Some(WireDetails {
                    name: d.map(|d| d.name.as_str()).unwrap_or_default(),
                    group: d.map(|d| d.group.as_str()).unwrap_or_default(),
                    kind: d.map(|d| d.kind.as_str()).unwrap_or_default(),
                    causes: d
                        .into_iter()
                        .flat_map(|d| &d.causes)
                        .map(|c| WireCause { reason: c.reason, message: c.body(), field: &c.field })
                        .collect(),
                    retry_after_seconds,
                })
            }
        };
        let status = WireStatus {
            kind: "Status",
            api_version: "v1",
            metadata: serde_json::Map::new(),
            status: "Failure",
            message: &self.message,
            reason: self.reason,
            details,
            code: self.code,
        };
        let mut body = serde_json::to_vec(&status).unwrap_or_default();
        body.push(b'\n');
        body
    }
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl From<storage::Error> for ApiError {
    fn from(e: storage::Error) -> Self {
        use storage::Error as E;
        match e {
            E::Compacted { requested, compacted } => {
                ApiError::gone(format!("too old resource version: {requested} ({})", compacted + 1))
            }
            E::FutureRevision { requested, current } => {
                ApiError::timeout(format!("Too large resource version: {requested}, current: {current}"))
            }
            E::Unavailable(m) => ApiError::unavailable(format!("storage is unavailable: {m}")),
            E::InvalidRequest(m) => ApiError::bad_request(m),
            // The registry maps these with resource names before they get here; a stray one
            // is a server bug.
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (code, self.status_body()).into_response();
        resp.headers_mut().insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_kube_apiservers_byte_for_byte() {
        let e = ApiError::already_exists("", "services", "web");
        assert_eq!(
            String::from_utf8(e.status_body()).unwrap(),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"services \\\"web\\\" already exists\",\"reason\":\"AlreadyExists\",\"details\":{\"name\":\"web\",\"kind\":\"services\"},\"code\":409}\n"
        );
        // The Value form says the same.
        let v: Value = serde_json::from_slice(&e.status_body()).unwrap();
        assert_eq!(v, e.to_status());
    }

    #[test]
    fn not_found_status_shape() {
        let s = ApiError::not_found("apps", "deployments", "web").to_status();
        assert_eq!(s["kind"], "Status");
        assert_eq!(s["status"], "Failure");
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["message"], "deployments.apps \"web\" not found");
        assert_eq!(s["details"]["name"], "web");
        assert_eq!(s["details"]["group"], "apps");
    }

    #[test]
    fn invalid_has_causes() {
        let e = ApiError::invalid("", "Pod", "x", vec![FieldError::required("spec.containers", "")]);
        let s = e.to_status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["details"]["causes"][0]["field"], "spec.containers");
        assert_eq!(s["details"]["causes"][0]["reason"], "FieldValueRequired");
        assert_eq!(s["message"], "Pod \"x\" is invalid: spec.containers: Required value");
        // The cause's message is the body without its field, as Go's ErrorBody (clients
        // print `field: message`); the wire body says the same.
        assert_eq!(s["details"]["causes"][0]["message"], "Required value");
        let wire: Value = serde_json::from_slice(&e.status_body()).unwrap();
        assert_eq!(wire["details"]["causes"][0]["message"], "Required value");
        let e = ApiError::invalid("", "Pod", "x", vec![FieldError::invalid("spec.x", &json!(3), "too big")]);
        assert_eq!(e.to_status()["details"]["causes"][0]["message"], "Invalid value: 3: too big");
    }

    #[test]
    fn compacted_maps_to_expired() {
        let e: ApiError = storage::Error::Compacted { requested: 5, compacted: 9 }.into();
        assert_eq!(e.code, 410);
        assert_eq!(e.reason, "Expired");
        assert_eq!(e.message, "too old resource version: 5 (10)");
    }
}
