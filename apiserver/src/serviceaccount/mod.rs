//! ServiceAccount tokens: the TokenRequest API (`serviceaccounts/<name>/token`, what
//! `kubectl create token` and the kubelet call), the OIDC discovery documents
//! (`/.well-known/openid-configuration`, `/openid/v1/jwks`) and the check of a presented
//! token, all from the keys and issuer of the `--service-account-*` flags. Without a signing
//! key the API answers 404 and pods get no token volume, as on a cluster without token
//! issuance.
//!
//! Deciding is pure ([`token_request`], [`discovery`]); the request path reads the service
//! account and the bound object and hands them in.

pub mod authenticator;
pub mod keys;
pub mod token;

use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult, FieldError};
use keys::Keys;
use token::{Bound, Ref};

/// Kubernetes' bounds on a requested lifetime.
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// The token issuer's configuration.
pub struct Issuer {
    pub keys: Keys,
    /// `--service-account-issuer` (repeatable): the first issues, all are accepted.
    pub issuers: Vec<String>,
    /// `--api-audiences`; the first issuer when none is given.
    pub audiences: Vec<String>,
    /// `--service-account-max-token-expiration` (seconds), if any.
    pub max_expiration: Option<i64>,
    /// `--service-account-jwks-uri`, or the issuer's `/openid/v1/jwks`.
    pub jwks_uri: String,
}

impl Issuer {
    pub fn new(
        keys: Keys,
        issuers: Vec<String>,
        audiences: Vec<String>,
        max_expiration: Option<i64>,
        jwks_uri: Option<String>,
    ) -> Issuer {
        let first = issuers.first().cloned().unwrap_or_default();
        let audiences = if audiences.is_empty() { vec![first.clone()] } else { audiences };
        let jwks_uri = jwks_uri.unwrap_or_else(|| format!("{}/openid/v1/jwks", first.trim_end_matches('/')));
        Issuer { keys, issuers, audiences, max_expiration, jwks_uri }
    }

    /// The claims of a token this issuer's keys signed, for this apiserver's issuers and
    /// audiences, valid at `now`.
    pub fn verify(&self, jwt: &str, now: i64) -> Result<token::Claims, token::TokenError> {
        token::verify(&self.keys, jwt, &self.issuers, &self.audiences, now)
    }
}

fn str_at<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or_default()
}

/// A TokenRequest's answer: `request` with `spec` defaulted and `status` filled in, for the
/// service account `account` (as stored) and the object its `boundObjectRef` names, looked
/// up by the caller (`None`: it names none, or it was not found).
pub fn token_request(
    issuer: &Issuer,
    account: &Value,
    request: &Value,
    bound: Option<&Value>,
    now: i64,
) -> ApiResult<Value> {
    let ns = str_at(account, "/metadata/namespace");
    let name = str_at(account, "/metadata/name");
    let invalid = |causes: Vec<FieldError>| ApiError::invalid("authentication.k8s.io", "TokenRequest", name, causes);
    let kind = str_at(request, "/kind");
    if !kind.is_empty() && kind != "TokenRequest" {
        return Err(ApiError::bad_request(format!(
            "the kind in the body ({kind}) does not match the expected kind (TokenRequest)"
        )));
    }
    let spec = request.get("spec").cloned().unwrap_or(json!({}));
    let requested = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(v) => v
            .as_i64()
            .ok_or_else(|| invalid(vec![FieldError::invalid("spec.expirationSeconds", v, "must be an integer")]))?,
    };
    if requested < MIN_EXPIRATION_SECONDS {
        return Err(invalid(vec![FieldError::invalid(
            "spec.expirationSeconds",
            &json!(requested),
            "may not specify a duration less than 10 minutes",
        )]));
    }
    if requested > 1 << 32 {
        return Err(invalid(vec![FieldError::invalid(
            "spec.expirationSeconds",
            &json!(requested),
            "may not specify a duration larger than 2^32 seconds",
        )]));
    }
    let lifetime = issuer.max_expiration.map_or(requested, |max| requested.min(max));
    let audiences: Vec<String> = match spec.get("audiences").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => a.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        _ => issuer.audiences.clone(),
    };
    let bound = match spec.get("boundObjectRef").filter(|b| !b.is_null()) {
        None => None,
        Some(r) => {
            let (kind, bname, buid) = (str_at(r, "/kind"), str_at(r, "/name"), str_at(r, "/uid"));
            let api_version = str_at(r, "/apiVersion");
            if !matches!((kind, api_version), ("Pod" | "Secret" | "Node", "v1" | "")) {
                return Err(invalid(vec![FieldError::not_supported(
                    "spec.boundObjectRef.kind",
                    &json!(kind),
                    &["v1, Kind=Pod", "v1, Kind=Secret", "v1, Kind=Node"],
                )]));
            }
            let plural = format!("{}s", kind.to_lowercase());
            let Some(obj) = bound else {
                return Err(ApiError::not_found("", &plural, bname));
            };
            let uid = str_at(obj, "/metadata/uid");
            if !buid.is_empty() && buid != uid {
                return Err(ApiError::conflict(
                    "",
                    &plural,
                    bname,
                    &format!("the UID in the bound object reference ({buid}) does not match the UID in record. The object might have been deleted and then recreated"),
                ));
            }
            let r = Ref { name: bname.to_string(), uid: uid.to_string() };
            Some(match kind {
                "Pod" => Bound::Pod(r),
                "Secret" => Bound::Secret(r),
                _ => Bound::Node(r),
            })
        }
    };
    let account_ref = Ref { name: name.to_string(), uid: str_at(account, "/metadata/uid").to_string() };
    let first = issuer.issuers.first().map(String::as_str).unwrap_or_default();
    let claims = token::claims(first, audiences.clone(), ns, account_ref, bound, now, lifetime);
    let jwt = issuer.keys.sign(&claims).map_err(|e| ApiError::internal(format!("signing the token: {e}")))?;
    let expires = jiff::Timestamp::from_second(claims.exp).map(|t| t.to_string()).unwrap_or_default();
    let created = jiff::Timestamp::from_second(now).map(|t| t.to_string()).unwrap_or_default();
    let mut spec = spec;
    spec["audiences"] = json!(audiences);
    spec["expirationSeconds"] = json!(lifetime);
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
        "spec": spec,
        "status": {"token": jwt, "expirationTimestamp": expires},
    }))
}

/// `/.well-known/openid-configuration`.
pub fn discovery(issuer: &Issuer) -> Value {
    json!({
        "issuer": issuer.issuers.first(),
        "jwks_uri": issuer.jwks_uri,
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["ES256"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer() -> Issuer {
        let keys = Keys::from_pem(&keys::generate_signing_key().unwrap(), &[]).unwrap();
        Issuer::new(keys, vec!["https://kubernetes.default.svc".into()], vec![], Some(7200), None)
    }

    fn account() -> Value {
        json!({"metadata": {"name": "builder", "namespace": "ci", "uid": "sa-1"}})
    }

    #[test]
    fn a_request_gets_a_token_for_its_account_and_bound_pod() {
        let iss = issuer();
        let pod = json!({"metadata": {"name": "web", "namespace": "ci", "uid": "pod-1"}});
        let req = json!({"spec": {"expirationSeconds": 100000, "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web", "uid": "pod-1"}}});
        let out = token_request(&iss, &account(), &req, Some(&pod), 1_000).unwrap();
        assert_eq!(out["spec"]["expirationSeconds"], 7200, "capped by the maximum");
        assert_eq!(out["spec"]["audiences"], json!(["https://kubernetes.default.svc"]));
        assert_eq!(out["status"]["expirationTimestamp"], "1970-01-01T02:16:40Z");
        let claims = iss.verify(out["status"]["token"].as_str().unwrap(), 1_500).unwrap();
        assert_eq!(claims.sub, "system:serviceaccount:ci:builder");
        assert_eq!(claims.kubernetes.serviceaccount.uid, "sa-1");
        assert_eq!(claims.kubernetes.pod, Some(Ref { name: "web".into(), uid: "pod-1".into() }));
        assert_eq!(iss.jwks_uri, "https://kubernetes.default.svc/openid/v1/jwks");
        assert_eq!(discovery(&iss)["issuer"], "https://kubernetes.default.svc");
    }

    #[test]
    fn bad_requests_are_refused_as_kubernetes_refuses_them() {
        let iss = issuer();
        let err = |req: Value, bound: Option<&Value>| token_request(&iss, &account(), &req, bound, 0).unwrap_err();
        let e = err(json!({"spec": {"expirationSeconds": 60}}), None);
        assert_eq!(e.code, 422);
        assert!(e.message.contains("may not specify a duration less than 10 minutes"), "{}", e.message);
        let e = err(json!({"spec": {"boundObjectRef": {"kind": "ConfigMap", "name": "x"}}}), None);
        assert_eq!(e.code, 422);
        let e = err(json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "gone"}}}), None);
        assert_eq!(e.code, 404);
        let pod = json!({"metadata": {"name": "web", "uid": "new"}});
        let e = err(json!({"spec": {"boundObjectRef": {"kind": "Pod", "name": "web", "uid": "old"}}}), Some(&pod));
        assert_eq!(e.code, 409);
        assert!(e.message.contains("might have been deleted and then recreated"), "{}", e.message);
        let e = err(json!({"kind": "Scale"}), None);
        assert_eq!(e.code, 400);
    }
}
