//! The `admission.k8s.io/v1` AdmissionReview exchanged with a webhook (pure): the request
//! the apiserver sends, and what the answer means — allowed (with a JSON patch from a
//! mutating webhook, and warnings) or denied with a `Status` — in Kubernetes' words.

use serde_json::{json, Value};

use super::rules::Operation;
use crate::error::ApiError;

/// What the AdmissionReview describes, besides the objects.
pub struct Request<'a> {
    pub uid: &'a str,
    pub group: &'a str,
    pub version: &'a str,
    pub kind: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub operation: Operation,
    /// `authentication.k8s.io/v1` UserInfo of the requester.
    pub user: &'a Value,
    pub dry_run: bool,
}

/// The AdmissionReview the webhook is sent.
pub fn request(r: &Request<'_>, object: Option<&Value>, old: Option<&Value>) -> Value {
    let mut req = json!({
        "uid": r.uid,
        "kind": {"group": r.group, "version": r.version, "kind": r.kind},
        "resource": {"group": r.group, "version": r.version, "resource": r.resource},
        "requestKind": {"group": r.group, "version": r.version, "kind": r.kind},
        "requestResource": {"group": r.group, "version": r.version, "resource": r.resource},
        "operation": r.operation.as_str(),
        "userInfo": r.user,
        "object": object.cloned().unwrap_or(Value::Null),
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": r.dry_run,
        "options": {"kind": r.operation.options_kind(), "apiVersion": "meta.k8s.io/v1"},
    });
    if !r.subresource.is_empty() {
        req["subResource"] = json!(r.subresource);
        req["requestSubResource"] = json!(r.subresource);
    }
    if !r.name.is_empty() {
        req["name"] = json!(r.name);
    }
    if !r.namespace.is_empty() {
        req["namespace"] = json!(r.namespace);
    }
    json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": req})
}

/// A webhook's verdict.
#[derive(Debug)]
pub enum Verdict {
    /// Allowed; a mutating webhook's JSON patch (RFC 6902) if it sent one.
    Allowed { patch: Option<json_patch::Patch>, warnings: Vec<String> },
    /// Denied: the `Status` the client gets.
    Denied { error: ApiError, warnings: Vec<String> },
}

/// Read a webhook's answer. `Err` is a failure to call it (a malformed answer), which its
/// failure policy decides; the message says what is wrong.
pub fn verdict(
    body: &[u8],
    uid: &str,
    mutating: bool,
    webhook: &str,
    group: &str,
    resource: &str,
    name: &str,
) -> Result<Verdict, String> {
    let review: Value = serde_json::from_slice(body).map_err(|e| format!("cannot decode the AdmissionReview: {e}"))?;
    if review.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
        || review.get("apiVersion").and_then(Value::as_str) != Some("admission.k8s.io/v1")
    {
        return Err(format!(
            "expected response.kind AdmissionReview and apiVersion admission.k8s.io/v1, got {:?} {:?}",
            review.get("kind").and_then(Value::as_str).unwrap_or_default(),
            review.get("apiVersion").and_then(Value::as_str).unwrap_or_default()
        ));
    }
    let Some(resp) = review.get("response") else {
        return Err("webhook response was absent".into());
    };
    let got_uid = resp.get("uid").and_then(Value::as_str).unwrap_or_default();
    if got_uid != uid {
        return Err(format!("expected response.uid=\"{uid}\", got \"{got_uid}\""));
    }
    let warnings: Vec<String> = resp
        .get("warnings")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let allowed = resp.get("allowed").and_then(Value::as_bool).unwrap_or(false);
    if !allowed {
        return Ok(Verdict::Denied { error: denial(webhook, resp.get("status"), group, resource, name), warnings });
    }
    let patch = match (resp.get("patch").and_then(Value::as_str), resp.get("patchType").and_then(Value::as_str)) {
        (None, _) => None,
        (Some(_), _) if !mutating => return Err("validating webhook may not return a patch".into()),
        (Some(_), None) => return Err("webhook returned a patch without patchType".into()),
        (Some(p), Some("JSONPatch")) => {
            use base64::Engine;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(p)
                .map_err(|e| format!("the patch is not base64: {e}"))?;
            Some(serde_json::from_slice(&bytes).map_err(|e| format!("the patch is not a JSON patch: {e}"))?)
        }
        (Some(_), Some(other)) => return Err(format!("unsupported patch type {other:?}")),
    };
    Ok(Verdict::Allowed { patch, warnings })
}

/// Kubernetes' status reasons a webhook may put in its answer (anything else reads
/// `Forbidden`, or `InternalError` with code 500).
const REASONS: &[&str] = &[
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "Gone",
    "Invalid",
    "ServerTimeout",
    "Timeout",
    "TooManyRequests",
    "BadRequest",
    "MethodNotAllowed",
    "NotAcceptable",
    "RequestEntityTooLarge",
    "UnsupportedMediaType",
    "InternalError",
    "Expired",
    "ServiceUnavailable",
];

/// The error a denial becomes: `<resource>[.<group>] "<name>" is forbidden: admission webhook
/// "<webhook>" denied the request: <message>`, code 403 unless the webhook chose one.
pub fn denial(webhook: &str, status: Option<&Value>, group: &str, resource: &str, name: &str) -> ApiError {
    let field = |f: &str| status.and_then(|s| s.get(f)).and_then(Value::as_str).unwrap_or_default().to_string();
    let code = status
        .and_then(|s| s.get("code"))
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c != 0)
        .unwrap_or(403);
    let (message, reason) = (field("message"), field("reason"));
    let denied_by = format!("admission webhook \"{webhook}\" denied the request");
    let text = if !message.is_empty() {
        format!("{denied_by}: {message}")
    } else if !reason.is_empty() {
        format!("{denied_by}: {reason}")
    } else {
        format!("{denied_by} without explanation")
    };
    let name = if name.is_empty() { "Unknown" } else { name };
    let gr = if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") };
    let reason = REASONS.iter().find(|r| **r == reason).copied().unwrap_or(if code == 500 {
        "InternalError"
    } else {
        "Forbidden"
    });
    if code == 500 {
        return ApiError::new(500, reason, format!("Internal error occurred: {text}"));
    }
    let mut e = ApiError::new(code, reason, format!("{gr} \"{name}\" is forbidden: {text}"));
    e.details = Some(crate::error::Details {
        name: name.to_string(),
        group: group.to_string(),
        kind: resource.to_string(),
        causes: vec![],
    });
    e
}

/// A webhook that could not be called (refused connection, timeout, bad answer) under
/// `failurePolicy: Fail`.
pub fn call_failed(webhook: &str, why: &str) -> ApiError {
    ApiError::new(500, "InternalError", format!("Internal error occurred: failed calling webhook \"{webhook}\": {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn answer(resp: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "response": resp}))
            .unwrap()
    }

    #[test]
    fn a_denial_reads_as_kubernetes_writes_it() {
        let body = answer(json!({"uid": "u1", "allowed": false, "status": {"message": "pods need a team label"}}));
        let Ok(Verdict::Denied { error, .. }) =
            verdict(&body, "u1", false, "require-team.example.com", "", "pods", "p")
        else {
            panic!("not denied")
        };
        assert_eq!(error.code, 403);
        assert_eq!(error.reason, "Forbidden");
        assert_eq!(
            error.message,
            "pods \"p\" is forbidden: admission webhook \"require-team.example.com\" denied the request: pods need a team label"
        );
        let silent = answer(json!({"uid": "u1", "allowed": false, "status": {"code": 422, "reason": "Invalid"}}));
        let Ok(Verdict::Denied { error, .. }) = verdict(&silent, "u1", false, "w.x.y", "apps", "deployments", "")
        else {
            panic!("not denied")
        };
        assert_eq!((error.code, error.reason), (422, "Invalid"));
        assert_eq!(
            error.message,
            "deployments.apps \"Unknown\" is forbidden: admission webhook \"w.x.y\" denied the request: Invalid"
        );
    }

    #[test]
    fn a_patch_is_decoded_and_a_wrong_answer_is_a_call_failure() {
        let patch = base64::engine::general_purpose::STANDARD
            .encode(br#"[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]"#);
        let body = answer(
            json!({"uid": "u", "allowed": true, "patchType": "JSONPatch", "patch": patch, "warnings": ["careful"]}),
        );
        match verdict(&body, "u", true, "m.x.y", "", "pods", "p") {
            Ok(Verdict::Allowed { patch: Some(p), warnings }) => {
                assert_eq!(p.0.len(), 1);
                assert_eq!(warnings, vec!["careful".to_string()]);
            }
            other => panic!("{other:?}"),
        }
        let validating = verdict(&body, "u", false, "v.x.y", "", "pods", "p").unwrap_err();
        assert!(validating.contains("may not return a patch"), "{validating}");
        let wrong_uid = verdict(&body, "other", true, "m.x.y", "", "pods", "p").unwrap_err();
        assert!(wrong_uid.contains("expected response.uid=\"other\""), "{wrong_uid}");
        assert!(verdict(b"not json", "u", true, "m", "", "pods", "p").is_err());
    }

    #[test]
    fn the_request_names_the_operation_the_objects_and_the_user() {
        let user = json!({"username": "alice", "groups": ["dev"]});
        let r = Request {
            uid: "u",
            group: "",
            version: "v1",
            kind: "Pod",
            resource: "pods",
            subresource: "",
            name: "",
            namespace: "shop",
            operation: Operation::Create,
            user: &user,
            dry_run: false,
        };
        let review = request(&r, Some(&json!({"kind": "Pod"})), None);
        assert_eq!(review["request"]["operation"], "CREATE");
        assert_eq!(review["request"]["namespace"], "shop");
        assert!(review["request"].get("name").is_none(), "a generated name is not known yet");
        assert_eq!(review["request"]["userInfo"]["username"], "alice");
        assert_eq!(review["request"]["oldObject"], Value::Null);
        assert_eq!(review["request"]["options"]["kind"], "CreateOptions");
    }
}
