//! User impersonation (`Impersonate-User`, `Impersonate-Group`, `Impersonate-Uid`,
//! `Impersonate-Extra-<key>`, what `kubectl --as` / `--as-group` send): the requester must
//! be allowed the `impersonate` verb on each identity asked for — `users`, `groups`,
//! `serviceaccounts` (for `system:serviceaccount:<ns>:<name>`), `uids` and `userextras`
//! — and the request then acts as that identity. A service account impersonated without
//! groups gets its fixed groups; everyone impersonated but `system:anonymous` is in
//! `system:authenticated`.

use http::HeaderMap;

use super::{forbidden, rbac, Attributes, Authorizer, User, ANONYMOUS};
use crate::authn::UserInfo;
use crate::error::{ApiError, ApiResult};

/// The identity a request asks to act as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    pub user: Option<String>,
    pub groups: Vec<String>,
    pub uid: Option<String>,
    pub extra: Vec<(String, String)>,
}

/// The impersonation headers of a request, if any.
pub fn requested(headers: &HeaderMap) -> ApiResult<Option<Asked>> {
    let mut asked = Asked::default();
    let mut any = false;
    for (name, value) in headers {
        let name = name.as_str();
        let is = |h: &str| name.eq_ignore_ascii_case(h);
        // Header names arrive lower-cased.
        let extra_key = name.strip_prefix("impersonate-extra-");
        let wanted = is("impersonate-user") || is("impersonate-group") || is("impersonate-uid") || extra_key.is_some();
        if !wanted {
            continue;
        }
        any = true;
        let value =
            value.to_str().map_err(|_| ApiError::bad_request(format!("invalid {name} header: not text")))?.to_string();
        if is("impersonate-user") {
            asked.user = Some(value);
        } else if is("impersonate-group") {
            asked.groups.push(value);
        } else if is("impersonate-uid") {
            asked.uid = Some(value);
        } else if let Some(key) = extra_key {
            asked.extra.push((crate::requestinfo::percent_decode(key), value));
        }
    }
    if !any {
        return Ok(None);
    }
    if asked.user.as_deref().unwrap_or_default().is_empty() {
        return Err(ApiError::bad_request(
            "requested impersonation of groups, uid or extra without impersonating a user",
        ));
    }
    Ok(Some(asked))
}

/// A service account's (namespace, name) from its user name.
pub fn service_account(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

/// Check that `requester` may act as `asked`; the identity to act as (None: anonymous).
pub fn impersonate(authz: &Authorizer, requester: &User, asked: &Asked) -> ApiResult<Option<UserInfo>> {
    let username = asked.user.clone().unwrap_or_default();
    let mut checks = Vec::new();
    let mut groups = asked.groups.clone();
    match service_account(&username) {
        Some((ns, name)) => {
            checks.push(Attributes::resource(requester, "impersonate", "", "serviceaccounts", ns, name));
            if groups.is_empty() {
                groups = rbac::service_account_groups(ns);
            }
        }
        None => checks.push(Attributes::resource(requester, "impersonate", "", "users", "", &username)),
    }
    for g in &asked.groups {
        checks.push(Attributes::resource(requester, "impersonate", "", "groups", "", g));
    }
    if let Some(uid) = &asked.uid {
        checks.push(Attributes::resource(requester, "impersonate", "authentication.k8s.io", "uids", "", uid));
    }
    for (k, v) in &asked.extra {
        let mut a = Attributes::resource(requester, "impersonate", "authentication.k8s.io", "userextras", "", v);
        a.subresource = k.clone();
        checks.push(a);
    }
    for a in checks {
        let verdict = authz.authorize(&a);
        if verdict.decision != super::Decision::Allow {
            return Err(forbidden(&a, &verdict.reason));
        }
    }
    if username == ANONYMOUS {
        return Ok(None);
    }
    Ok(Some(UserInfo { name: username, uid: asked.uid.clone().unwrap_or_default(), groups }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::Mode;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn headers_are_read_and_groups_need_a_user() {
        assert_eq!(requested(&headers(&[("accept", "x")])).unwrap(), None);
        let a = requested(&headers(&[
            ("impersonate-user", "jane"),
            ("impersonate-group", "devs"),
            ("impersonate-group", "ops"),
            ("impersonate-extra-scopes%2Fa", "s"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(a.user.as_deref(), Some("jane"));
        assert_eq!(a.groups, ["devs", "ops"]);
        assert_eq!(a.extra, [("scopes/a".to_string(), "s".to_string())]);
        let e = requested(&headers(&[("impersonate-group", "devs")])).unwrap_err();
        assert_eq!(e.code, 400);
    }

    #[test]
    fn the_impersonate_verb_is_checked_for_each_identity() {
        let authz = Authorizer::new(vec![Mode::Rbac]);
        let bob = User::of(Some(&UserInfo { name: "bob".into(), uid: String::new(), groups: vec![] }));
        let asked = Asked { user: Some("jane".into()), ..Default::default() };
        let e = impersonate(&authz, &bob, &asked).unwrap_err();
        assert_eq!(
            e.message,
            r#"users "jane" is forbidden: User "bob" cannot impersonate resource "users" in API group "" at the cluster scope"#
        );
        let admin = User { groups: vec!["system:masters".into()], ..bob.clone() };
        let acting = impersonate(&authz, &admin, &asked).unwrap().unwrap();
        assert_eq!((acting.name.as_str(), acting.groups.len()), ("jane", 0));
        assert_eq!(User::of(Some(&acting)).groups, ["system:authenticated"]);
        let sa = Asked { user: Some("system:serviceaccount:team:robot".into()), ..Default::default() };
        let e = impersonate(&authz, &bob, &sa).unwrap_err();
        assert!(e.message.starts_with(r#"serviceaccounts "robot" is forbidden"#), "{}", e.message);
        assert!(e.message.ends_with(r#"in the namespace "team""#), "{}", e.message);
        let acting = impersonate(&authz, &admin, &sa).unwrap().unwrap();
        assert_eq!(acting.groups, ["system:serviceaccounts", "system:serviceaccounts:team"]);
        let anon = Asked { user: Some(ANONYMOUS.into()), ..Default::default() };
        assert_eq!(impersonate(&authz, &admin, &anon).unwrap(), None);
    }
}
