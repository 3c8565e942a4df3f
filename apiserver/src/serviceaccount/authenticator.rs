//! ServiceAccount tokens as credentials: the authenticator after client certificates and the
//! token file, as in kube-apiserver. A token authenticates when its signature, issuer,
//! audience and lifetime check out ([`super::Issuer::verify`]) and the objects it names still
//! exist with the same uid: its ServiceAccount and the pod, secret or node it is bound to. A
//! deleted pod's token stops working a minute after the deletion started (Kubernetes' grace
//! for clock skew); one of a pod deleted and recreated under the same name never works again.
//!
//! [`validate`] decides from the objects (pure); [`ServiceAccountAuthenticator`] reads them.

use std::sync::Arc;

use serde_json::Value;

use super::token::{self, Claims, TokenError};
use super::Issuer;
use crate::authn::{TokenFuture, TokenUser, UserInfo};
use crate::registry::generic::Registry;

/// Deleted objects' tokens keep working this long after the deletion started.
const DELETION_GRACE_SECONDS: i64 = 60;

/// The groups of every ServiceAccount's user, and of those of one namespace.
pub const ALL_SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

pub fn namespace_group(namespace: &str) -> String {
    format!("{ALL_SERVICE_ACCOUNTS_GROUP}:{namespace}")
}

/// Why an object a token names makes it invalid, or `None` when it is still the one the
/// token was issued for.
fn check_object(kind: &str, name: &str, uid: &str, obj: Option<&Value>, now: i64) -> Option<String> {
    let Some(obj) = obj else {
        return Some(format!("{kind} {name} has been deleted"));
    };
    let actual = obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
    if actual != uid {
        return Some(format!("{kind} UID ({actual}) does not match claim ({uid})"));
    }
    let deleted = obj
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_second());
    match deleted {
        Some(at) if at + DELETION_GRACE_SECONDS < now => Some(format!("{kind} {name} is being deleted")),
        _ => None,
    }
}

/// The user a verified token's claims make, given the ServiceAccount and the bound object as
/// stored now (`None`: not found): `system:serviceaccount:<ns>:<name>` with the account's uid,
/// in `system:serviceaccounts` and `system:serviceaccounts:<ns>`.
pub fn validate(
    claims: &Claims,
    account: Option<&Value>,
    bound: Option<&Value>,
    now: i64,
) -> Result<UserInfo, TokenError> {
    let k = &claims.kubernetes;
    let invalid = |why: String| Err(TokenError::Invalidated(why));
    if let Some(why) = check_object("ServiceAccount", &k.serviceaccount.name, &k.serviceaccount.uid, account, now) {
        return invalid(why);
    }
    if let Some((kind, _, r)) = bound_of(claims) {
        if let Some(why) = check_object(kind, &r.name, &r.uid, bound, now) {
            return invalid(why);
        }
    }
    Ok(UserInfo {
        name: token::user_name(&k.namespace, &k.serviceaccount.name),
        uid: k.serviceaccount.uid.clone(),
        groups: vec![ALL_SERVICE_ACCOUNTS_GROUP.to_string(), namespace_group(&k.namespace)],
    })
}

/// The object a token is bound to: its kind, its resource and the reference.
fn bound_of(claims: &Claims) -> Option<(&'static str, &'static str, &token::Ref)> {
    let k = &claims.kubernetes;
    [("Pod", "pods", &k.pod), ("Secret", "secrets", &k.secret), ("Node", "nodes", &k.node)]
        .into_iter()
        .find_map(|(kind, plural, r)| r.as_ref().map(|r| (kind, plural, r)))
}

/// Reads what a token names from the registry and asks [`validate`].
pub struct ServiceAccountAuthenticator {
    pub issuer: Arc<Issuer>,
    pub registry: Arc<Registry>,
}

impl ServiceAccountAuthenticator {
    async fn read(&self, plural: &str, ns: &str, name: &str) -> Result<Option<Value>, TokenError> {
        let res = crate::resources::find("", "v1", plural)
            .ok_or_else(|| TokenError::Invalidated(format!("no {plural} resource")))?;
        match self.registry.get(res, ns, name).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code == 404 => Ok(None),
            // Storage trouble is not the token's fault, but it cannot be trusted either.
            Err(e) => Err(TokenError::Invalidated(format!("reading {plural} {name}: {}", e.message))),
        }
    }

    async fn check(&self, jwt: &str, audiences: Option<&[String]>) -> Result<(UserInfo, Vec<String>), TokenError> {
        let now = jiff::Timestamp::now().as_second();
        let claims = match audiences {
            Some(a) => token::verify(&self.issuer.keys, jwt, &self.issuer.issuers, a, now)?,
            None => self.issuer.verify(jwt, now)?,
        };
        let k = &claims.kubernetes;
        let account = self.read("serviceaccounts", &k.namespace, &k.serviceaccount.name).await?;
        let bound = match bound_of(&claims) {
            // Nodes are cluster-scoped.
            Some((kind, plural, r)) => {
                self.read(plural, if kind == "Node" { "" } else { &k.namespace }, &r.name).await?
            }
            None => None,
        };
        let user = validate(&claims, account.as_ref(), bound.as_ref(), now)?;
        let wanted = audiences.unwrap_or(&self.issuer.audiences);
        let matched = claims.aud.iter().filter(|a| wanted.contains(a)).cloned().collect();
        Ok((user, matched))
    }
}

impl TokenUser for ServiceAccountAuthenticator {
    fn user<'a>(&'a self, token: &'a str, audiences: Option<&'a [String]>) -> TokenFuture<'a> {
        Box::pin(async move {
            // Only a JWT can be one of ours; other tokens are not worth a signature check.
            if token.split('.').count() != 3 {
                return None;
            }
            match self.check(token, audiences).await {
                Ok(found) => Some(found),
                Err(e) => {
                    tracing::debug!(error = %e, "ServiceAccount token refused");
                    None
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::token::{claims, Bound, Ref};
    use super::*;
    use serde_json::json;

    fn obj(uid: &str, deleted: Option<&str>) -> Value {
        let mut v = json!({"metadata": {"name": "x", "uid": uid}});
        if let Some(t) = deleted {
            v["metadata"]["deletionTimestamp"] = json!(t);
        }
        v
    }

    fn token_of_pod() -> Claims {
        let pod = Bound::Pod(Ref { name: "web-1".into(), uid: "pod-uid".into() });
        claims(
            "iss",
            vec!["iss".into()],
            "ci",
            Ref { name: "builder".into(), uid: "sa-uid".into() },
            Some(pod),
            0,
            3600,
        )
    }

    #[test]
    fn a_live_account_and_pod_make_the_service_account_user() {
        let c = token_of_pod();
        let user = validate(&c, Some(&obj("sa-uid", None)), Some(&obj("pod-uid", None)), 100).unwrap();
        assert_eq!(user.name, "system:serviceaccount:ci:builder");
        assert_eq!(user.uid, "sa-uid");
        assert_eq!(user.groups, vec!["system:serviceaccounts", "system:serviceaccounts:ci"]);
    }

    #[test]
    fn gone_recreated_or_long_deleted_objects_invalidate_the_token() {
        let c = token_of_pod();
        let (sa, pod) = (obj("sa-uid", None), obj("pod-uid", None));
        let refused = |account: Option<&Value>, bound: Option<&Value>| validate(&c, account, bound, 1_000).is_err();
        assert!(refused(None, Some(&pod)), "account deleted");
        assert!(refused(Some(&obj("other", None)), Some(&pod)), "account recreated");
        assert!(refused(Some(&sa), None), "pod deleted");
        assert!(refused(Some(&sa), Some(&obj("other", None))), "pod recreated");
        // 1970-01-01T00:15:00Z is 900 s: deleting for 100 s at 1,000.
        assert!(refused(Some(&sa), Some(&obj("pod-uid", Some("1970-01-01T00:15:00Z")))));
        // Deleting for 10 s: still within the grace.
        assert!(!refused(Some(&sa), Some(&obj("pod-uid", Some("1970-01-01T00:16:30Z")))));
    }

    #[test]
    fn an_unbound_token_needs_only_its_account() {
        let c = claims("iss", vec!["iss".into()], "ci", Ref { name: "b".into(), uid: "u".into() }, None, 0, 600);
        assert!(validate(&c, Some(&obj("u", None)), None, 1).is_ok());
        assert!(bound_of(&c).is_none());
        assert!(matches!(bound_of(&token_of_pod()), Some(("Pod", "pods", r)) if r.name == "web-1"));
    }
}
