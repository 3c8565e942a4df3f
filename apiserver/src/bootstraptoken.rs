//! Bootstrap tokens (`--enable-bootstrap-token-auth`): `<id>.<secret>` tokens backed by
//! `bootstrap.kubernetes.io/token` Secrets named `bootstrap-token-<id>` in `kube-system`, as
//! kubeadm makes them for joining nodes. A token authenticates as `system:bootstrap:<id>` in
//! `system:bootstrappers` (plus the Secret's `auth-extra-groups`) while its Secret is of that
//! type, not being deleted, not expired, allows authentication
//! (`usage-bootstrap-authentication: "true"`) and holds the same secret.
//!
//! [`validate`] decides from the Secret (pure); [`BootstrapTokenAuthenticator`] reads it.

use std::sync::Arc;

use base64::Engine;
use serde_json::Value;
use subtle::ConstantTimeEq;

use crate::authn::{TokenFuture, TokenUser, UserInfo};
use crate::registry::generic::Registry;

pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub const GROUP: &str = "system:bootstrappers";

/// The id and secret of a token of the form `[a-z0-9]{6}.[a-z0-9]{16}`.
pub fn parse(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// A data field of a stored Secret, decoded.
fn field(secret: &Value, key: &str) -> Option<String> {
    let text = secret.pointer(&format!("/data/{key}"))?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).ok()?;
    String::from_utf8(bytes).ok()
}

/// The user of token `id.secret` given its Secret as stored (`None`: not found), at `now`
/// (Unix seconds); the reason it is refused otherwise.
pub fn validate(id: &str, token_secret: &str, secret: Option<&Value>, now: i64) -> Result<UserInfo, String> {
    let secret = secret.ok_or_else(|| format!("no bootstrap token with id {id}"))?;
    if secret.get("type").and_then(Value::as_str) != Some(SECRET_TYPE) {
        return Err(format!("secret bootstrap-token-{id} is not of type {SECRET_TYPE}"));
    }
    if secret.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
        return Err(format!("bootstrap token {id} is being deleted"));
    }
    let stored = field(secret, "token-secret").unwrap_or_default();
    if !bool::from(stored.as_bytes().ct_eq(token_secret.as_bytes())) || stored.is_empty() {
        return Err(format!("bootstrap token {id} does not match its secret"));
    }
    if field(secret, "token-id").as_deref() != Some(id) {
        return Err(format!("secret bootstrap-token-{id} names another token id"));
    }
    if let Some(exp) = field(secret, "expiration") {
        match exp.parse::<jiff::Timestamp>() {
            Ok(t) if t.as_second() > now => {}
            Ok(_) => return Err(format!("bootstrap token {id} expired at {exp}")),
            Err(_) => return Err(format!("bootstrap token {id} has an unreadable expiration {exp:?}")),
        }
    }
    if field(secret, "usage-bootstrap-authentication").as_deref() != Some("true") {
        return Err(format!("bootstrap token {id} is not for authentication"));
    }
    let mut groups = vec![GROUP.to_string()];
    for g in field(secret, "auth-extra-groups").unwrap_or_default().split(',').map(str::trim).filter(|g| !g.is_empty())
    {
        if !g.starts_with("system:bootstrappers:") {
            return Err(format!("bootstrap token {id} has an extra group {g:?} outside system:bootstrappers:"));
        }
        groups.push(g.to_string());
    }
    Ok(UserInfo { name: format!("system:bootstrap:{id}"), uid: String::new(), groups })
}

/// Reads a token's Secret from the registry and asks [`validate`].
pub struct BootstrapTokenAuthenticator {
    pub registry: Arc<Registry>,
}

impl TokenUser for BootstrapTokenAuthenticator {
    fn user<'a>(&'a self, token: &'a str, audiences: Option<&'a [String]>) -> TokenFuture<'a> {
        Box::pin(async move {
            let (id, token_secret) = parse(token)?;
            let res = crate::resources::find("", "v1", "secrets")?;
            let secret = match self.registry.get(res, "kube-system", &format!("bootstrap-token-{id}")).await {
                Ok(s) => Some(s),
                Err(e) if e.code == 404 => None,
                Err(e) => {
                    tracing::warn!(error = %e.message, "reading a bootstrap token's secret");
                    return None;
                }
            };
            match validate(id, token_secret, secret.as_ref(), jiff::Timestamp::now().as_second()) {
                Ok(user) => Some((user, audiences.map(<[String]>::to_vec).unwrap_or_default())),
                Err(why) => {
                    tracing::debug!(%why, "bootstrap token refused");
                    None
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn secret(extra: &[(&str, &str)]) -> Value {
        let mut data = serde_json::Map::new();
        for (k, v) in
            [("token-id", "abcdef"), ("token-secret", "0123456789abcdef"), ("usage-bootstrap-authentication", "true")]
                .iter()
                .chain(extra)
        {
            data.insert(k.to_string(), json!(b64(v)));
        }
        json!({"type": SECRET_TYPE, "metadata": {"name": "bootstrap-token-abcdef"}, "data": data})
    }

    #[test]
    fn the_token_format() {
        assert_eq!(parse("abcdef.0123456789abcdef"), Some(("abcdef", "0123456789abcdef")));
        for bad in
            ["", "abcdef", "abcde.0123456789abcdef", "ABCDEF.0123456789abcdef", "abcdef.0123456789abcde!", "a.b.c"]
        {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_valid_token_is_its_bootstrap_user() {
        let s = secret(&[("auth-extra-groups", "system:bootstrappers:kubeadm:default-node-token")]);
        let user = validate("abcdef", "0123456789abcdef", Some(&s), 0).unwrap();
        assert_eq!(user.name, "system:bootstrap:abcdef");
        assert_eq!(user.groups, vec!["system:bootstrappers", "system:bootstrappers:kubeadm:default-node-token"]);
    }

    #[test]
    fn wrong_expired_unusable_or_foreign_tokens_are_refused() {
        let refused =
            |secret: Option<&Value>, token_secret: &str| validate("abcdef", token_secret, secret, 1_000).is_err();
        assert!(refused(None, "0123456789abcdef"), "no secret");
        assert!(refused(Some(&secret(&[])), "0123456789abcdeX"), "another secret");
        assert!(refused(Some(&secret(&[("expiration", "1970-01-01T00:10:00Z")])), "0123456789abcdef"), "expired");
        assert!(!refused(Some(&secret(&[("expiration", "1970-01-01T01:00:00Z")])), "0123456789abcdef"), "not yet");
        assert!(refused(Some(&secret(&[("expiration", "soon")])), "0123456789abcdef"));
        let mut no_auth = secret(&[]);
        no_auth["data"]["usage-bootstrap-authentication"] = json!(b64("false"));
        assert!(refused(Some(&no_auth), "0123456789abcdef"), "not for authentication");
        let mut opaque = secret(&[]);
        opaque["type"] = json!("Opaque");
        assert!(refused(Some(&opaque), "0123456789abcdef"), "wrong type");
        assert!(refused(Some(&secret(&[("auth-extra-groups", "system:masters")])), "0123456789abcdef"), "escalation");
        let mut deleting = secret(&[]);
        deleting["metadata"]["deletionTimestamp"] = json!("1970-01-01T00:00:01Z");
        assert!(refused(Some(&deleting), "0123456789abcdef"));
    }
}
