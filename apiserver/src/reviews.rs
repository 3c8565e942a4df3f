//! The review APIs, what `kubectl auth can-i` and `kubectl auth whoami` call:
//! `authorization.k8s.io/v1` (SelfSubjectAccessReview, SubjectAccessReview,
//! LocalSubjectAccessReview, SelfSubjectRulesReview) and `authentication.k8s.io/v1`
//! (SelfSubjectReview, TokenReview).
//!
//! Nothing is stored. A create answers 201 with the request and its `status` filled in, as
//! Kubernetes does; every other verb is 405.
//!
//! Access reviews are answered by the configured authorizers ([`crate::authz`]): allowed,
//! denied (an authorizer said no, as AlwaysDeny does) and the reason; a rules review lists
//! what the requester may do in a namespace as each authorizer can tell (everything under
//! AlwaysAllow, the user's RBAC rules, `incomplete` where the Node authorizer cannot
//! enumerate). The requester is the authenticated (or impersonated) user, with the group
//! `system:authenticated` Kubernetes adds to every authenticated user; without credentials
//! it is `system:anonymous`, in `system:unauthenticated`.
//!
//! Deciding is pure ([`review`]); the server only reads the body and finds the requester.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use k8s_openapi::api::authentication::v1 as authn;
use k8s_openapi::api::authorization::v1 as authz;

use crate::authn::UserInfo;
use crate::authz::{Attributes, Authorizer, Decision, User};
use crate::error::{ApiError, ApiResult, FieldError};

pub const AUTHORIZATION: &str = "authorization.k8s.io";
pub const AUTHENTICATION: &str = "authentication.k8s.io";
pub const VERSION: &str = "v1";

/// One kind of review: its group, plural, kind and scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    SelfSubjectAccessReview,
    SubjectAccessReview,
    LocalSubjectAccessReview,
    SelfSubjectRulesReview,
    SelfSubjectReview,
    TokenReview,
}

pub const KINDS: &[Kind] = &[
    Kind::LocalSubjectAccessReview,
    Kind::SelfSubjectAccessReview,
    Kind::SelfSubjectRulesReview,
    Kind::SubjectAccessReview,
    Kind::SelfSubjectReview,
    Kind::TokenReview,
];

/// (group, kind, plural) as k8s-openapi knows the type.
fn names<T: k8s_openapi::Resource>() -> (&'static str, &'static str, &'static str) {
    (T::GROUP, T::KIND, T::URL_PATH_SEGMENT)
}

impl Kind {
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Kind::SelfSubjectAccessReview => names::<authz::SelfSubjectAccessReview>(),
            Kind::SubjectAccessReview => names::<authz::SubjectAccessReview>(),
            Kind::LocalSubjectAccessReview => names::<authz::LocalSubjectAccessReview>(),
            Kind::SelfSubjectRulesReview => names::<authz::SelfSubjectRulesReview>(),
            Kind::SelfSubjectReview => names::<authn::SelfSubjectReview>(),
            Kind::TokenReview => names::<authn::TokenReview>(),
        }
    }
    pub fn group(self) -> &'static str {
        self.names().0
    }
    pub fn name(self) -> &'static str {
        self.names().1
    }
    pub fn plural(self) -> &'static str {
        self.names().2
    }
    pub fn namespaced(self) -> bool {
        self == Kind::LocalSubjectAccessReview
    }
    /// The review served at `group`/`plural`, if any.
    pub fn find(group: &str, plural: &str) -> Option<Kind> {
        KINDS.iter().copied().find(|k| k.group() == group && k.plural() == plural)
    }
}

/// Whether `group` is one of the review groups (served here, not from storage).
pub fn serves(group: &str) -> bool {
    group == AUTHORIZATION || group == AUTHENTICATION
}

/// `GET /apis/<group>/v1` for a review group.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    if !serves(group) || version != VERSION {
        return None;
    }
    let resources: Vec<Value> = KINDS
        .iter()
        .filter(|k| k.group() == group)
        .map(|k| {
            json!({
                "name": k.plural(),
                "singularName": k.name().to_ascii_lowercase(),
                "namespaced": k.namespaced(),
                "kind": k.name(),
                "verbs": ["create"],
            })
        })
        .collect();
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{group}/{VERSION}"),
        "resources": resources,
    }))
}

/// Who made the request: the authenticated user, or the anonymous user without
/// credentials (the groups Kubernetes adds included).
pub fn requester(user: Option<&UserInfo>) -> authn::UserInfo {
    user_info(&User::of(user))
}

/// A token file's user as Kubernetes reports it: with `system:authenticated` added.
fn authenticated(u: &UserInfo) -> authn::UserInfo {
    user_info(&User::of(Some(u)))
}

fn user_info(u: &User) -> authn::UserInfo {
    authn::UserInfo {
        username: Some(u.name.clone()),
        uid: (!u.uid.is_empty()).then(|| u.uid.clone()),
        groups: Some(u.groups.clone()),
        extra: None,
    }
}

/// The user a review's requester is, for the authorizers.
fn as_user(r: &authn::UserInfo) -> User {
    User {
        name: r.username.clone().unwrap_or_default(),
        uid: r.uid.clone().unwrap_or_default(),
        groups: r.groups.clone().unwrap_or_default(),
    }
}

/// The attributes an access review asks about.
fn review_attributes(
    user: User,
    resource: Option<&authz::ResourceAttributes>,
    non_resource: Option<&authz::NonResourceAttributes>,
) -> Attributes {
    let s = |v: &Option<String>| v.clone().unwrap_or_default();
    match (resource, non_resource) {
        (Some(r), _) => Attributes {
            user,
            verb: s(&r.verb),
            resource_request: true,
            namespace: s(&r.namespace),
            api_group: s(&r.group),
            api_version: s(&r.version),
            resource: s(&r.resource),
            subresource: s(&r.subresource),
            name: s(&r.name),
            path: String::new(),
        },
        (None, Some(n)) => Attributes { user, verb: s(&n.verb), path: s(&n.path), ..Default::default() },
        (None, None) => Attributes { user, ..Default::default() },
    }
}

/// The authorizers' answer as a review status.
fn decide(authz: &Authorizer, a: &Attributes) -> authz::SubjectAccessReviewStatus {
    let v = authz.authorize(a);
    authz::SubjectAccessReviewStatus {
        allowed: v.decision == Decision::Allow,
        denied: (v.decision == Decision::Deny).then_some(true),
        reason: (!v.reason.is_empty()).then_some(v.reason),
        evaluation_error: None,
    }
}

/// The user a SubjectAccessReview names.
fn subject(user: &Option<String>, uid: &Option<String>, groups: &Option<Vec<String>>) -> User {
    User {
        name: user.clone().unwrap_or_default(),
        uid: uid.clone().unwrap_or_default(),
        groups: groups.clone().unwrap_or_default(),
    }
}

fn rule_list(v: Option<Vec<String>>) -> Option<Vec<String>> {
    v.filter(|v| !v.is_empty())
}

/// Answer a review: the request with its status filled in.
pub fn review(
    kind: Kind,
    url_namespace: Option<&str>,
    body: Value,
    requester: &authn::UserInfo,
    token_user: Option<(UserInfo, Vec<String>)>,
    authorizer: &Authorizer,
) -> ApiResult<Value> {
    match kind {
        Kind::SelfSubjectAccessReview => {
            let mut r: authz::SelfSubjectAccessReview = decode(kind, body)?;
            check_attributes(kind, r.spec.resource_attributes.is_some(), r.spec.non_resource_attributes.is_some())?;
            let a = review_attributes(
                as_user(requester),
                r.spec.resource_attributes.as_ref(),
                r.spec.non_resource_attributes.as_ref(),
            );
            r.status = Some(decide(authorizer, &a));
            encode(&r)
        }
        Kind::SubjectAccessReview => {
            let mut r: authz::SubjectAccessReview = decode(kind, body)?;
            let mut errs =
                attribute_errors(r.spec.resource_attributes.is_some(), r.spec.non_resource_attributes.is_some());
            errs.extend(subject_errors(&r.spec.user, &r.spec.groups));
            reject(kind, &r.metadata.name, errs)?;
            let who = subject(&r.spec.user, &r.spec.uid, &r.spec.groups);
            let a =
                review_attributes(who, r.spec.resource_attributes.as_ref(), r.spec.non_resource_attributes.as_ref());
            r.status = Some(decide(authorizer, &a));
            encode(&r)
        }
        Kind::LocalSubjectAccessReview => {
            let mut r: authz::LocalSubjectAccessReview = decode(kind, body)?;
            let url_ns = url_namespace.unwrap_or_default();
            match r.metadata.namespace.as_deref() {
                None | Some("") => r.metadata.namespace = Some(url_ns.to_string()),
                Some(ns) if ns != url_ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ))
                }
                Some(_) => {}
            }
            let mut errs = Vec::new();
            if r.spec.non_resource_attributes.is_some() {
                errs.push(FieldError::forbidden("spec.nonResourceAttributes", "disallowed on this kind of request"));
            }
            match &r.spec.resource_attributes {
                None => errs.push(FieldError::required("spec.resourceAttributes", "")),
                Some(a) if a.namespace.as_deref().unwrap_or_default() != url_ns => errs.push(FieldError::invalid(
                    "spec.resourceAttributes.namespace",
                    &json!(a.namespace.as_deref().unwrap_or_default()),
                    "must match metadata.namespace",
                )),
                Some(_) => {}
            }
            errs.extend(subject_errors(&r.spec.user, &r.spec.groups));
            reject(kind, &r.metadata.name, errs)?;
            let who = subject(&r.spec.user, &r.spec.uid, &r.spec.groups);
            let a = review_attributes(who, r.spec.resource_attributes.as_ref(), None);
            r.status = Some(decide(authorizer, &a));
            encode(&r)
        }
        Kind::SelfSubjectRulesReview => {
            let mut r: authz::SelfSubjectRulesReview = decode(kind, body)?;
            let ns = r.spec.namespace.clone().unwrap_or_default();
            if ns.is_empty() {
                return Err(ApiError::bad_request("no namespace on request"));
            }
            let rules = authorizer.rules_for(&as_user(requester), &ns);
            let errors = match rules.evaluation_errors.as_slice() {
                [] => None,
                [one] => Some(one.clone()),
                many => Some(format!("[{}]", many.join(", "))),
            };
            r.status = Some(authz::SubjectRulesReviewStatus {
                resource_rules: rules
                    .resource_rules
                    .into_iter()
                    .map(|p| authz::ResourceRule {
                        verbs: p.verbs,
                        api_groups: rule_list(p.api_groups),
                        resources: rule_list(p.resources),
                        resource_names: rule_list(p.resource_names),
                    })
                    .collect(),
                non_resource_rules: rules
                    .non_resource_rules
                    .into_iter()
                    .map(|p| authz::NonResourceRule {
                        verbs: p.verbs,
                        non_resource_urls: rule_list(p.non_resource_urls),
                    })
                    .collect(),
                incomplete: rules.incomplete,
                evaluation_error: errors,
            });
            encode(&r)
        }
        Kind::SelfSubjectReview => {
            let mut r: authn::SelfSubjectReview = decode(kind, body)?;
            r.status = Some(authn::SelfSubjectReviewStatus { user_info: Some(requester.clone()) });
            encode(&r)
        }
        Kind::TokenReview => {
            let mut r: authn::TokenReview = decode(kind, body)?;
            let token = r.spec.token.as_str();
            if token.is_empty() {
                return Err(ApiError::bad_request("token is required for TokenReview in authentication"));
            }
            r.status = Some(match token_user {
                Some((user, audiences)) => authn::TokenReviewStatus {
                    authenticated: Some(true),
                    user: Some(authenticated(&user)),
                    audiences: (!audiences.is_empty()).then_some(audiences),
                    error: None,
                },
                None => {
                    authn::TokenReviewStatus { authenticated: Some(false), user: None, audiences: None, error: None }
                }
            });
            encode(&r)
        }
    }
}

/// A review about someone else names a user or a group.
fn subject_errors(user: &Option<String>, groups: &Option<Vec<String>>) -> Option<FieldError> {
    let user = user.as_deref().unwrap_or_default();
    (user.is_empty() && groups.as_ref().is_none_or(Vec::is_empty))
        .then(|| FieldError::invalid("spec.user", &json!(user), "at least one of user or group must be specified"))
}

/// Exactly one of resourceAttributes and nonResourceAttributes (Kubernetes' wording).
fn attribute_errors(resource: bool, non_resource: bool) -> Vec<FieldError> {
    match (resource, non_resource) {
        (true, true) => vec![FieldError::invalid(
            "spec.nonResourceAttributes",
            &json!("…"),
            "cannot be specified in combination with resourceAttributes",
        )],
        (false, false) => vec![FieldError::required(
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )],
        _ => vec![],
    }
}

fn check_attributes(kind: Kind, resource: bool, non_resource: bool) -> ApiResult<()> {
    reject(kind, &None, attribute_errors(resource, non_resource))
}

fn reject(kind: Kind, name: &Option<String>, errs: Vec<FieldError>) -> ApiResult<()> {
    if errs.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(kind.group(), kind.name(), name.as_deref().unwrap_or_default(), errs))
}

/// Check kind and apiVersion as the generic registry does, then decode the typed object.
fn decode<T: DeserializeOwned>(kind: Kind, mut body: Value) -> ApiResult<T> {
    let api_version = format!("{}/{VERSION}", kind.group());
    let Some(map) = body.as_object_mut() else {
        return Err(ApiError::bad_request(format!(
            "{k} in version \"{VERSION}\" cannot be handled as a {k}: the body must be a JSON object",
            k = kind.name()
        )));
    };
    crate::registry::generic::fill_type_meta(map, kind.name(), &api_version)?;
    serde_path_to_error::deserialize(&body).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let why = if path.is_empty() || path == "." { inner.to_string() } else { format!("{path}: {inner}") };
        ApiError::bad_request(format!(
            "{k} in version \"{VERSION}\" cannot be handled as a {k}: {why}",
            k = kind.name()
        ))
    })
}

fn encode<T: Serialize + k8s_openapi::Resource>(obj: &T) -> ApiResult<Value> {
    let mut v = serde_json::to_value(obj).map_err(|e| ApiError::internal(e.to_string()))?;
    if let Some(m) = v.as_object_mut() {
        m.insert("kind".into(), T::KIND.into());
        m.insert("apiVersion".into(), T::API_VERSION.into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow() -> Authorizer {
        Authorizer::new(vec![crate::authz::Mode::AlwaysAllow])
    }

    fn admin() -> UserInfo {
        UserInfo { name: "admin".into(), uid: "uid-1".into(), groups: vec!["system:masters".into()] }
    }

    fn ssar(spec: Value) -> Value {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": spec})
    }

    #[test]
    fn discovery_lists_each_group_and_only_create() {
        let authz = resource_list(AUTHORIZATION, "v1").unwrap();
        let names: Vec<&str> =
            authz["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "localsubjectaccessreviews",
                "selfsubjectaccessreviews",
                "selfsubjectrulesreviews",
                "subjectaccessreviews"
            ]
        );
        assert_eq!(authz["resources"][0]["namespaced"], true);
        assert_eq!(authz["resources"][1]["verbs"], json!(["create"]));
        let authn = resource_list(AUTHENTICATION, "v1").unwrap();
        assert_eq!(authn["resources"][0]["kind"], "SelfSubjectReview");
        assert_eq!(authn["resources"][1]["name"], "tokenreviews");
        assert!(resource_list(AUTHORIZATION, "v1beta1").is_none());
        assert!(resource_list("apps", "v1").is_none());
        assert_eq!(Kind::find(AUTHORIZATION, "selfsubjectaccessreviews"), Some(Kind::SelfSubjectAccessReview));
        assert_eq!(Kind::find(AUTHENTICATION, "selfsubjectaccessreviews"), None);
    }

    #[test]
    fn access_reviews_are_allowed_and_echo_the_request() {
        let me = requester(Some(&admin()));
        let body = ssar(json!({"resourceAttributes": {"namespace": "default", "verb": "create", "resource": "pods"}}));
        let out = review(Kind::SelfSubjectAccessReview, None, body, &me, None, &allow()).unwrap();
        assert_eq!(out["status"]["allowed"], true);
        assert_eq!(out["spec"]["resourceAttributes"]["resource"], "pods");
        assert_eq!(out["kind"], "SelfSubjectAccessReview");
        assert_eq!(out["apiVersion"], "authorization.k8s.io/v1");

        let body = json!({"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}, "user": "bob"}});
        let out = review(Kind::SubjectAccessReview, None, body, &me, None, &allow()).unwrap();
        assert_eq!(out["status"]["allowed"], true);
        assert_eq!(out["kind"], "SubjectAccessReview");
    }

    #[test]
    fn malformed_access_reviews_are_invalid_with_field_paths() {
        let me = requester(None);
        let e = review(Kind::SelfSubjectAccessReview, None, ssar(json!({})), &me, None, &allow()).unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert_eq!(e.details.unwrap().causes[0].field, "spec.resourceAttributes");

        let both =
            ssar(json!({"resourceAttributes": {"verb": "get"}, "nonResourceAttributes": {"path": "/", "verb": "get"}}));
        let e = review(Kind::SelfSubjectAccessReview, None, both, &me, None, &allow()).unwrap_err();
        assert_eq!(e.details.unwrap().causes[0].field, "spec.nonResourceAttributes");

        let e = review(
            Kind::SubjectAccessReview,
            None,
            json!({"spec": {"resourceAttributes": {"verb": "get"}}}),
            &me,
            None,
            &allow(),
        )
        .unwrap_err();
        assert_eq!(e.details.unwrap().causes[0].field, "spec.user");

        let e = review(Kind::SelfSubjectAccessReview, None, json!({"kind": "Pod"}), &me, None, &allow()).unwrap_err();
        assert_eq!(e.code, 400);
        let e =
            review(Kind::SelfSubjectAccessReview, None, ssar(json!({"resourceAttributes": 3})), &me, None, &allow())
                .unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e.message.contains("spec.resourceAttributes"), "{}", e.message);
    }

    #[test]
    fn local_reviews_are_bound_to_the_url_namespace() {
        let me = requester(None);
        let ok = json!({"spec": {"resourceAttributes": {"namespace": "team", "verb": "get"}, "groups": ["devs"]}});
        let out = review(Kind::LocalSubjectAccessReview, Some("team"), ok.clone(), &me, None, &allow()).unwrap();
        assert_eq!(out["metadata"]["namespace"], "team");
        assert_eq!(out["status"]["allowed"], true);

        let e = review(Kind::LocalSubjectAccessReview, Some("other"), ok, &me, None, &allow()).unwrap_err();
        assert_eq!(e.details.unwrap().causes[0].field, "spec.resourceAttributes.namespace");
        let moved = json!({"metadata": {"namespace": "team"}, "spec": {"resourceAttributes": {"namespace": "team"}, "user": "u"}});
        assert_eq!(
            review(Kind::LocalSubjectAccessReview, Some("other"), moved, &me, None, &allow()).unwrap_err().code,
            400
        );
        let non_resource = json!({"spec": {"nonResourceAttributes": {"path": "/"}, "user": "u"}});
        let e = review(Kind::LocalSubjectAccessReview, Some("team"), non_resource, &me, None, &allow()).unwrap_err();
        let fields: Vec<String> = e.details.unwrap().causes.into_iter().map(|c| c.field).collect();
        assert_eq!(fields, ["spec.nonResourceAttributes", "spec.resourceAttributes"]);
    }

    #[test]
    fn rules_reviews_list_everything() {
        let out = review(
            Kind::SelfSubjectRulesReview,
            None,
            json!({"spec": {"namespace": "default"}}),
            &requester(None),
            None,
            &allow(),
        )
        .unwrap();
        assert_eq!(out["status"]["resourceRules"], json!([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]));
        assert_eq!(out["status"]["nonResourceRules"], json!([{"verbs": ["*"], "nonResourceURLs": ["*"]}]));
        assert_eq!(out["status"]["incomplete"], false);
        let e = review(Kind::SelfSubjectRulesReview, None, json!({"spec": {}}), &requester(None), None, &allow());
        assert_eq!(e.unwrap_err().message, "no namespace on request");
    }

    fn rbac() -> Authorizer {
        let a = Authorizer::new(vec![crate::authz::Mode::Node, crate::authz::Mode::Rbac]);
        a.rbac.set(crate::authz::rbac::Index::build(&crate::authz::rbac::tests::objects()));
        a
    }

    fn jane() -> UserInfo {
        UserInfo { name: "jane".into(), uid: String::new(), groups: vec![] }
    }

    #[test]
    fn access_reviews_answer_from_the_authorizers() {
        let me = requester(Some(&jane()));
        let body = |verb: &str, ns: &str| {
            ssar(json!({"resourceAttributes": {"namespace": ns, "verb": verb, "resource": "pods"}}))
        };
        let out = review(Kind::SelfSubjectAccessReview, None, body("list", "team"), &me, None, &rbac()).unwrap();
        assert_eq!(out["status"]["allowed"], true);
        assert_eq!(
            out["status"]["reason"],
            r#"RBAC: allowed by RoleBinding "jane-view/team" of ClusterRole "view" to User "jane""#
        );
        let out = review(Kind::SelfSubjectAccessReview, None, body("create", "team"), &me, None, &rbac()).unwrap();
        assert_eq!(out["status"], json!({"allowed": false}));
        let deny = Authorizer::new(vec![crate::authz::Mode::AlwaysDeny]);
        let out = review(Kind::SelfSubjectAccessReview, None, body("list", "team"), &me, None, &deny).unwrap();
        assert_eq!(out["status"], json!({"allowed": false, "denied": true, "reason": "Everything is forbidden."}));
        // About someone else: their user and groups, not the requester's.
        let sar = json!({"spec": {"resourceAttributes": {"namespace": "other", "verb": "watch", "resource": "pods"},
                                  "user": "amy", "groups": ["auditors"]}});
        let out = review(Kind::SubjectAccessReview, None, sar, &me, None, &rbac()).unwrap();
        assert_eq!(out["status"]["allowed"], true);
        let local = json!({"spec": {"resourceAttributes": {"namespace": "team", "verb": "get", "resource": "pods"}, "user": "jane"}});
        let out = review(Kind::LocalSubjectAccessReview, Some("team"), local, &me, None, &rbac()).unwrap();
        assert_eq!(out["status"]["allowed"], true);
    }

    #[test]
    fn rules_reviews_list_the_requester_s_rules() {
        let body = json!({"spec": {"namespace": "team"}});
        let out =
            review(Kind::SelfSubjectRulesReview, None, body.clone(), &requester(Some(&jane())), None, &rbac()).unwrap();
        assert_eq!(
            out["status"]["resourceRules"],
            json!([{"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["pods", "pods/log"]}])
        );
        assert_eq!(out["status"]["incomplete"], false);
        assert!(out["status"].get("evaluationError").is_none());
        let dev = UserInfo { name: "dan".into(), uid: String::new(), groups: vec!["devs".into()] };
        let out =
            review(Kind::SelfSubjectRulesReview, None, body.clone(), &requester(Some(&dev)), None, &rbac()).unwrap();
        assert_eq!(out["status"]["evaluationError"], r#"clusterrole.rbac.authorization.k8s.io "gone" not found"#);
        assert_eq!(out["status"]["resourceRules"][0]["resourceNames"], json!(["web"]));
        let node = UserInfo { name: "system:node:n1".into(), uid: String::new(), groups: vec!["system:nodes".into()] };
        let out = review(Kind::SelfSubjectRulesReview, None, body, &requester(Some(&node)), None, &rbac()).unwrap();
        assert_eq!(out["status"]["incomplete"], true);
    }

    #[test]
    fn self_subject_review_names_the_requester() {
        let out = review(Kind::SelfSubjectReview, None, json!({}), &requester(Some(&admin())), None, &allow()).unwrap();
        assert_eq!(
            out["status"]["userInfo"],
            json!({"username": "admin", "uid": "uid-1", "groups": ["system:masters", "system:authenticated"]})
        );
        let out = review(Kind::SelfSubjectReview, None, json!({}), &requester(None), None, &allow()).unwrap();
        assert_eq!(
            out["status"]["userInfo"],
            json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]})
        );
    }

    #[test]
    fn token_reviews_report_the_token_s_user() {
        let admin = UserInfo { name: "admin".into(), uid: "uid-1".into(), groups: vec![] };
        let me = requester(None);
        let found = Some((admin, vec!["vault".to_string()]));
        let out = review(Kind::TokenReview, None, json!({"spec": {"token": "s3cr3t"}}), &me, found, &allow()).unwrap();
        assert_eq!(out["status"]["authenticated"], true);
        assert_eq!(out["status"]["user"]["username"], "admin");
        assert_eq!(out["status"]["user"]["groups"], json!(["system:authenticated"]));
        assert_eq!(out["status"]["audiences"], json!(["vault"]));
        let out = review(Kind::TokenReview, None, json!({"spec": {"token": "nope"}}), &me, None, &allow()).unwrap();
        assert_eq!(out["status"]["authenticated"], false);
        assert!(out["status"].get("user").is_none());
        let e = review(Kind::TokenReview, None, json!({"spec": {}}), &me, None, &allow()).unwrap_err();
        assert_eq!(e.code, 400);
    }
}
