//! ServiceAccount tokens as Kubernetes issues them: JWTs whose subject is
//! `system:serviceaccount:<namespace>:<name>`, with the service account (and the pod or
//! secret the token is bound to) under the private claim `kubernetes.io`. Issuing and
//! checking a token's signature, issuer, audience and lifetime are pure; whether the bound
//! objects still exist is the authenticator's question (it reads storage).

use serde::{Deserialize, Serialize};

use super::keys::Keys;

/// A reference to an object in the private claims.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

/// The `kubernetes.io` claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Private {
    pub namespace: String,
    pub serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Ref>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub nbf: i64,
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: Private,
}

/// The object a token is bound to (`boundObjectRef`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    Pod(Ref),
    Secret(Ref),
    Node(Ref),
}

/// `system:serviceaccount:<namespace>:<name>`.
pub fn user_name(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The claims of a new token.
pub fn claims(
    issuer: &str,
    audiences: Vec<String>,
    namespace: &str,
    account: Ref,
    bound: Option<Bound>,
    now: i64,
    lifetime_seconds: i64,
) -> Claims {
    let (mut pod, mut secret, mut node) = (None, None, None);
    match bound {
        Some(Bound::Pod(r)) => pod = Some(r),
        Some(Bound::Secret(r)) => secret = Some(r),
        Some(Bound::Node(r)) => node = Some(r),
        None => {}
    }
    Claims {
        iss: issuer.to_string(),
        sub: user_name(namespace, &account.name),
        aud: audiences,
        exp: now + lifetime_seconds,
        iat: now,
        nbf: now,
        jti: uuid::Uuid::new_v4().to_string(),
        kubernetes: Private { namespace: namespace.to_string(), serviceaccount: account, pod, secret, node },
    }
}

/// Why a token is refused (the request gets a plain 401; the reason is logged).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a JWT")]
    Malformed,
    #[error("the token's signature matches no service account key")]
    Signature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token's issuer is not one of this apiserver's")]
    Issuer,
    #[error("the token's audience is not one of this apiserver's")]
    Audience,
    #[error("the token's subject does not match its service account claim")]
    Subject,
    /// An object the token names is gone, recreated or being deleted.
    #[error("the token has been invalidated: {0}")]
    Invalidated(String),
}

/// Check a token: its signature against `keys`, its issuer, audience and lifetime at `now`
/// (a minute of leeway for clock skew, as Kubernetes allows), its subject against its
/// claims.
pub fn verify(
    keys: &Keys,
    token: &str,
    issuers: &[String],
    audiences: &[String],
    now: i64,
) -> Result<Claims, TokenError> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
    if header.alg != jsonwebtoken::Algorithm::ES256 {
        return Err(TokenError::Signature);
    }
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    // Lifetime, issuer and audience are checked below with Kubernetes' messages.
    validation.validate_exp = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let claims = keys
        .candidates(header.kid.as_deref())
        .find_map(|key| jsonwebtoken::decode::<Claims>(token, key, &validation).ok())
        .ok_or(TokenError::Signature)?
        .claims;
    const LEEWAY: i64 = 60;
    if now > claims.exp + LEEWAY {
        return Err(TokenError::Expired);
    }
    if now + LEEWAY < claims.nbf {
        return Err(TokenError::NotYetValid);
    }
    if !issuers.contains(&claims.iss) {
        return Err(TokenError::Issuer);
    }
    if !claims.aud.iter().any(|a| audiences.contains(a)) {
        return Err(TokenError::Audience);
    }
    if claims.sub != user_name(&claims.kubernetes.namespace, &claims.kubernetes.serviceaccount.name) {
        return Err(TokenError::Subject);
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::super::keys::generate_signing_key;
    use super::*;

    const ISS: &str = "https://kubernetes.default.svc.cluster.local";

    fn account() -> Ref {
        Ref { name: "builder".into(), uid: "sa-uid".into() }
    }

    #[test]
    fn a_token_verifies_with_its_claims_and_nothing_else_does() {
        let keys = Keys::from_pem(&generate_signing_key().unwrap(), &[]).unwrap();
        let pod = Bound::Pod(Ref { name: "web-1".into(), uid: "pod-uid".into() });
        let c = claims(ISS, vec![ISS.into()], "ci", account(), Some(pod), 1_000, 3600);
        assert_eq!(c.sub, "system:serviceaccount:ci:builder");
        let token = keys.sign(&c).unwrap();
        let iss = vec![ISS.to_string()];
        assert_eq!(verify(&keys, &token, &iss, &iss, 1_100), Ok(c.clone()));
        assert_eq!(verify(&keys, &token, &iss, &iss, 1_000 + 3600 + 61), Err(TokenError::Expired));
        assert_eq!(verify(&keys, &token, &iss, &iss, 1_000 - 61), Err(TokenError::NotYetValid));
        assert_eq!(verify(&keys, &token, &["other".into()], &iss, 1_100), Err(TokenError::Issuer));
        assert_eq!(verify(&keys, &token, &iss, &["vault".into()], 1_100), Err(TokenError::Audience));

        let other = Keys::from_pem(&generate_signing_key().unwrap(), &[]).unwrap();
        assert_eq!(verify(&other, &token, &iss, &iss, 1_100), Err(TokenError::Signature));
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged = keys.sign(&Claims { sub: "system:serviceaccount:ci:admin".into(), ..c.clone() }).unwrap();
        parts[1] = forged.split('.').nth(1).unwrap();
        assert_eq!(verify(&keys, &parts.join("."), &iss, &iss, 1_100), Err(TokenError::Signature));
        assert_eq!(verify(&keys, &forged, &iss, &iss, 1_100), Err(TokenError::Subject));
        for junk in ["", "a.b.c", "not a token", "eyJhbGciOiJub25lIn0.e30."] {
            assert!(verify(&keys, junk, &iss, &iss, 1_100).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn a_token_of_a_previous_key_verifies_while_that_key_is_listed() {
        let old = generate_signing_key().unwrap();
        let old_keys = Keys::from_pem(&old, &[]).unwrap();
        let token = old_keys.sign(&claims(ISS, vec![ISS.into()], "ci", account(), None, 0, 600)).unwrap();
        let old_public = rcgen::KeyPair::from_pem(&old).unwrap().public_key_pem();
        let new = generate_signing_key().unwrap();
        let iss = vec![ISS.to_string()];
        let rotated = Keys::from_pem(&new, &[&old_public]).unwrap();
        assert!(verify(&rotated, &token, &iss, &iss, 10).is_ok());
        let forgotten = Keys::from_pem(&new, &[]).unwrap();
        assert_eq!(verify(&forgotten, &token, &iss, &iss, 10), Err(TokenError::Signature));
    }
}
