//! Errors as the real kubectl prints them: `Error from server (Reason): message` for API
//! failures, `error: message` for everything else; both exit with code 1.

use std::fmt;

/// A failure of one kubectl command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubectlError {
    /// The API answered with a `Status` failure.
    Api { code: u16, reason: String, message: String },
    /// A client-side error (`error: …`).
    Msg(String),
    /// Already reported on stderr; just exit 1.
    Reported,
}

pub type Result<T, E = KubectlError> = std::result::Result<T, E>;

impl KubectlError {
    pub fn msg(m: impl Into<String>) -> Self {
        KubectlError::Msg(m.into())
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, KubectlError::Api { code: 404, .. })
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, KubectlError::Api { code: 409, reason, .. } if reason == "Conflict")
    }

    /// The same error with `prefix` put before the server's message (`error when creating "f": `).
    pub fn with_context(self, prefix: &str) -> Self {
        match self {
            KubectlError::Api { code, reason, message } => {
                KubectlError::Api { code, reason, message: format!("{prefix}{message}") }
            }
            KubectlError::Msg(m) => KubectlError::Msg(format!("{prefix}{m}")),
            KubectlError::Reported => KubectlError::Reported,
        }
    }
}

impl fmt::Display for KubectlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // kubectl prints validation failures without the "Error from server" prefix.
            KubectlError::Api { reason, message, .. } if reason == "Invalid" && !message.starts_with("error when") => {
                write!(f, "The {message}")
            }
            KubectlError::Api { reason, message, .. } if reason.is_empty() || reason == "Unknown" => {
                write!(f, "Error from server: {message}")
            }
            KubectlError::Api { reason, message, .. } => write!(f, "Error from server ({reason}): {message}"),
            KubectlError::Msg(m) => write!(f, "error: {m}"),
            KubectlError::Reported => Ok(()),
        }
    }
}

impl std::error::Error for KubectlError {}

/// Convert a `kube` client error into what kubectl would say.
pub fn from_kube(err: kube::Error, server: &str) -> KubectlError {
    match err {
        kube::Error::Api(s) => {
            let reason = if s.reason.is_empty() { reason_for_code(s.code).to_string() } else { s.reason.clone() };
            KubectlError::Api { code: s.code, reason, message: s.message.clone() }
        }
        other => {
            let text = format!("{other:?}");
            if text.contains("ConnectionRefused") || text.contains("Connection refused") {
                let host = server.trim_start_matches("http://").trim_start_matches("https://").trim_end_matches('/');
                KubectlError::Msg(format!(
                    "The connection to the server {host} was refused - did you specify the right host or port?"
                ))
            } else {
                KubectlError::Msg(other.to_string())
            }
        }
    }
}

fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_kubectl() {
        let e = KubectlError::Api { code: 404, reason: "NotFound".into(), message: "pods \"x\" not found".into() };
        assert_eq!(e.to_string(), "Error from server (NotFound): pods \"x\" not found");
        let e = e.with_context("error when creating \"f.yaml\": ");
        assert_eq!(e.to_string(), "Error from server (NotFound): error when creating \"f.yaml\": pods \"x\" not found");
        assert_eq!(KubectlError::msg("boom").to_string(), "error: boom");
        let e = KubectlError::Api { code: 422, reason: "Invalid".into(), message: "Pod \"p\" is invalid: x".into() };
        assert_eq!(e.to_string(), "The Pod \"p\" is invalid: x");
    }
}
