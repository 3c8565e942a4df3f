//! Authorization: who may do what. After authentication (the request's extensions hold an
//! [`authn::UserInfo`](crate::authn::UserInfo) when it authenticated), a thin axum layer
//! ([`layer`]) turns the request into [`Attributes`] — user, verb (Kubernetes' mapping of
//! the HTTP method: get/list/watch, create, update, patch, delete/deletecollection), and
//! the namespace, group, resource, subresource and name it addresses, or a non-resource
//! path — and asks the configured authorizers in `--authorization-mode` order. The first
//! to allow or deny decides; if none has an opinion the request is forbidden with
//! Kubernetes' 403 `Status` ([`forbidden`]). Members of `system:masters` are always
//! allowed. Impersonation headers are honoured here too (`impersonation.rs`), with the
//! `impersonate` verb checked for every identity asked for.
//!
//! Modules: `rbac` (rules, subjects, the index: pure), `escalation` (what a role or binding
//! write may grant: pure), `certificates` (what approving and signing certificate requests
//! needs: pure), `policy` (the bootstrap roles and bindings, and what reconciling
//! them changes: pure), `node` (the Node authorizer: pure over a graph of pods), `feed`
//! (the I/O keeping the RBAC index and the node graph current from storage), `bootstrap`
//! (the I/O writing the policy at start).

pub mod bootstrap;
pub mod certificates;
pub mod escalation;
pub mod feed;
pub mod impersonation;
pub mod node;
pub mod policy;
pub mod rbac;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::Method;
use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef};
use serde_json::Value;

use crate::authn::UserInfo;
use crate::error::{ApiError, ApiResult};
use crate::registry::generic::Admit;
use crate::requestinfo::{self, ResourcePath, Target};

/// Kubernetes' privileged group: always allowed.
pub const PRIVILEGED_GROUP: &str = "system:masters";
pub const AUTHENTICATED: &str = "system:authenticated";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
pub const ANONYMOUS: &str = "system:anonymous";

/// The user a decision is about: a name, a uid and groups (`system:authenticated` or
/// `system:unauthenticated` included).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl User {
    /// The requester: an authenticated user with `system:authenticated` added, or
    /// `system:anonymous` in `system:unauthenticated` without credentials.
    pub fn of(user: Option<&UserInfo>) -> User {
        match user {
            Some(u) => {
                let mut groups = u.groups.clone();
                if !groups.iter().any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED) {
                    groups.push(AUTHENTICATED.into());
                }
                User { name: u.name.clone(), uid: u.uid.clone(), groups }
            }
            None => User { name: ANONYMOUS.into(), uid: String::new(), groups: vec![UNAUTHENTICATED.into()] },
        }
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// What a request asks to do (Kubernetes' authorizer attributes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    pub user: User,
    pub verb: String,
    pub resource_request: bool,
    /// The path of a non-resource request.
    pub path: String,
    pub namespace: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

impl Attributes {
    /// A resource request made by `user`.
    pub fn resource(user: &User, verb: &str, group: &str, resource: &str, namespace: &str, name: &str) -> Self {
        Attributes {
            user: user.clone(),
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            api_version: "*".into(),
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        }
    }
}

/// The name an exact `metadata.name` requirement of a field selector asks for.
fn selected_name(selector: &str) -> Option<String> {
    selector.split(',').find_map(|req| {
        let (k, v) = req.split_once("==").or_else(|| req.split_once('='))?;
        (k.trim() == "metadata.name" && !k.ends_with('!') && !v.is_empty()).then(|| v.trim().to_string())
    })
}

/// A request's attributes (Kubernetes' RequestInfo): pure.
pub fn request_attributes(method: &Method, path: &str, query: &str, user: User) -> Attributes {
    let mut a = Attributes { user, path: path.to_string(), ..Default::default() };
    let Some(Target::Resource(rp)) = requestinfo::parse(path) else {
        a.verb = method.as_str().to_ascii_lowercase();
        return a;
    };
    let pairs = if query.is_empty() { Default::default() } else { requestinfo::form_urlencoded_pairs(query) };
    let watch = pairs.get("watch").is_some_and(|v| v == "true" || v == "1");
    a.verb = requestinfo::verb(method, &rp, watch).to_string();
    a.resource_request = true;
    a.api_group = rp.group;
    a.api_version = rp.version;
    a.resource = rp.resource;
    a.subresource = rp.subresource.unwrap_or_default();
    a.name = rp.name.unwrap_or_default();
    a.namespace = rp.namespace.unwrap_or_default();
    // A namespace's own path is in that namespace.
    if a.api_group.is_empty() && a.resource == "namespaces" && a.namespace.is_empty() {
        a.namespace = a.name.clone();
    }
    // A list or watch of one name (`fieldSelector=metadata.name=x`) is about that object.
    if a.name.is_empty() && (a.verb == "list" || a.verb == "watch") {
        if let Some(n) = pairs.get("fieldSelector").and_then(|s| selected_name(s)) {
            if !n.contains('/') && n != "." && n != ".." {
                a.name = n;
            }
        }
    }
    a
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
    NoOpinion,
}

/// A decision and its reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    pub reason: String,
}

impl Verdict {
    fn of(decision: Decision, reason: &str) -> Self {
        Verdict { decision, reason: reason.into() }
    }
}

/// An `--authorization-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    AlwaysAllow,
    AlwaysDeny,
    Rbac,
    Node,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::AlwaysAllow => "AlwaysAllow",
            Mode::AlwaysDeny => "AlwaysDeny",
            Mode::Rbac => "RBAC",
            Mode::Node => "Node",
        }
    }
}

/// Parse `--authorization-mode` (comma-separated; kube-apiserver's validation).
pub fn parse_modes(s: &str) -> Result<Vec<Mode>, String> {
    let mut modes = Vec::new();
    for item in s.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let mode = [Mode::AlwaysAllow, Mode::AlwaysDeny, Mode::Rbac, Mode::Node]
            .into_iter()
            .find(|m| m.name() == item)
            .ok_or_else(|| format!("authorization-mode {item:?} is not a valid mode"))?;
        if modes.contains(&mode) {
            return Err(format!("authorization-mode {item:?} has mode specified more than once"));
        }
        modes.push(mode);
    }
    if modes.is_empty() {
        return Err("at least one authorization-mode must be passed".into());
    }
    Ok(modes)
}

/// A user's rules as a SelfSubjectRulesReview reports them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rules {
    pub resource_rules: Vec<PolicyRule>,
    pub non_resource_rules: Vec<PolicyRule>,
    pub incomplete: bool,
    pub evaluation_errors: Vec<String>,
}

/// The configured authorizers, in order.
pub struct Authorizer {
    modes: Vec<Mode>,
    pub rbac: Arc<rbac::Rbac>,
    pub node: Arc<node::NodeAuthorizer>,
}

impl Authorizer {
    pub fn new(modes: Vec<Mode>) -> Self {
        Authorizer { modes, rbac: Arc::new(rbac::Rbac::new()), node: Arc::new(node::NodeAuthorizer::new()) }
    }

    pub fn modes(&self) -> &[Mode] {
        &self.modes
    }

    pub fn uses(&self, mode: Mode) -> bool {
        self.modes.contains(&mode)
    }

    /// Whether every request is allowed whatever it is (AlwaysAllow first): the request's
    /// attributes need not be worked out.
    pub fn allows_everything(&self) -> bool {
        self.modes.first() == Some(&Mode::AlwaysAllow)
    }

    /// Kubernetes' union of authorizers behind the privileged group.
    pub fn authorize(&self, a: &Attributes) -> Verdict {
        if a.user.in_group(PRIVILEGED_GROUP) {
            return Verdict::of(Decision::Allow, "");
        }
        let mut reasons: Vec<String> = Vec::new();
        for mode in &self.modes {
            let v = match mode {
                Mode::AlwaysAllow => Verdict::of(Decision::Allow, ""),
                Mode::AlwaysDeny => Verdict::of(Decision::Deny, "Everything is forbidden."),
                Mode::Rbac => self.rbac.authorize(a),
                Mode::Node => self.node.authorize(a, &self.rbac),
            };
            if v.decision != Decision::NoOpinion {
                return v;
            }
            if !v.reason.is_empty() {
                reasons.push(v.reason);
            }
        }
        Verdict { decision: Decision::NoOpinion, reason: reasons.join("\n") }
    }

    pub fn allows(&self, a: &Attributes) -> bool {
        self.authorize(a).decision == Decision::Allow
    }

    /// What `user` may do in `namespace`, as each authorizer can tell.
    pub fn rules_for(&self, user: &User, namespace: &str) -> Rules {
        let mut out = Rules::default();
        for mode in &self.modes {
            match mode {
                Mode::AlwaysAllow => {
                    out.resource_rules.push(PolicyRule {
                        verbs: vec!["*".into()],
                        api_groups: Some(vec!["*".into()]),
                        resources: Some(vec!["*".into()]),
                        ..Default::default()
                    });
                    out.non_resource_rules.push(PolicyRule {
                        verbs: vec!["*".into()],
                        non_resource_urls: Some(vec!["*".into()]),
                        ..Default::default()
                    });
                }
                Mode::AlwaysDeny => {}
                Mode::Rbac => {
                    let (rules, errors) = self.rbac.index().rules_for(user, namespace);
                    for r in rules {
                        if r.non_resource_urls.as_ref().is_some_and(|u| !u.is_empty()) {
                            out.non_resource_rules.push(r);
                        } else {
                            out.resource_rules.push(r);
                        }
                    }
                    out.evaluation_errors.extend(errors);
                }
                Mode::Node => {
                    if node::node_name(user).is_some() {
                        out.incomplete = true;
                        out.evaluation_errors.push("node authorizer does not support user rule resolution".into());
                    }
                }
            }
        }
        out
    }

    /// Escalation prevention for a write of a Role, ClusterRole, RoleBinding or
    /// ClusterRoleBinding (`plural`) in `namespace`: `new` is the object about to be stored,
    /// `old` the stored one on an update.
    pub fn admit_rbac_write(
        &self,
        user: &User,
        plural: &str,
        namespace: &str,
        new: &Value,
        old: Option<&Value>,
    ) -> ApiResult<()> {
        if user.in_group(PRIVILEGED_GROUP) || old.is_some_and(|old| only_gc_fields_differ(new, old)) {
            return Ok(());
        }
        let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let forbid = |why: &str| ApiError::forbidden(rbac::GROUP, plural, name, why);
        let index = self.rbac.index();
        match plural {
            "roles" | "clusterroles" => {
                let ns = if plural == "roles" { namespace } else { "" };
                if self.allows(&Attributes::resource(user, "escalate", rbac::GROUP, plural, ns, name)) {
                    return Ok(());
                }
                let rules: Vec<PolicyRule> = new
                    .get("rules")
                    .filter(|r| !r.is_null())
                    .map(|r| serde_json::from_value(r.clone()))
                    .transpose()
                    .map_err(|e| ApiError::bad_request(format!("rules: {e}")))?
                    .unwrap_or_default();
                let (owner, errors) = index.rules_for(user, ns);
                let missing = escalation::uncovered(&owner, &rules);
                if !missing.is_empty() {
                    return Err(forbid(&escalation::not_held_message(user, missing, &errors)));
                }
                let aggregates = new.get("aggregationRule").is_some_and(|a| !a.is_null());
                if aggregates && !escalation::uncovered(&owner, &escalation::full_authority()).is_empty() {
                    return Err(forbid("must have cluster-admin privileges to use the aggregationRule"));
                }
                Ok(())
            }
            "rolebindings" | "clusterrolebindings" => {
                let ns = if plural == "rolebindings" { namespace } else { "" };
                let role_ref: RoleRef = serde_json::from_value(new.get("roleRef").cloned().unwrap_or_default())
                    .map_err(|e| ApiError::bad_request(format!("roleRef: {e}")))?;
                let ref_plural = if role_ref.kind == "ClusterRole" { "clusterroles" } else { "roles" };
                let group = role_ref.api_group.as_deref().unwrap_or_default();
                let bind = Attributes::resource(user, "bind", group, ref_plural, ns, &role_ref.name);
                if self.allows(&bind) {
                    return Ok(());
                }
                let rules = index.role_rules(ns, &role_ref).map_err(|e| forbid(&e))?;
                let (owner, errors) = index.rules_for(user, ns);
                let missing = escalation::uncovered(&owner, &rules);
                if !missing.is_empty() {
                    return Err(forbid(&escalation::not_held_message(user, missing, &errors)));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// The admission a write to `rp` gets from who asks: escalation prevention for the RBAC
/// kinds; NodeRestriction for a node's writes of Nodes and Pods (with the Node mode on);
/// the signer permissions of certificate requests.
pub fn write_admission(authz: &Arc<Authorizer>, user: Option<&UserInfo>, rp: &ResourcePath) -> Option<Admit> {
    let user = User::of(user);
    let plural = rp.resource.clone();
    let sub = rp.subresource.clone().unwrap_or_default();
    let ns = rp.namespace.clone().unwrap_or_default();
    if rp.group == certificates::GROUP && plural == certificates::RESOURCE {
        let authz = authz.clone();
        return Some(Admit(Arc::new(move |new, old| {
            let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            let refuse = |why: &str| ApiError::forbidden(certificates::GROUP, certificates::RESOURCE, name, why);
            if old.is_none() {
                return certificates::subject_problem(new).map_or(Ok(()), |why| Err(refuse(&why)));
            }
            let Some(needed) = certificates::needed(&sub, new, old) else { return Ok(()) };
            let granted = needed.names().iter().any(|signer| {
                authz.allows(&Attributes::resource(&user, needed.verb, certificates::GROUP, "signers", "", signer))
            });
            if granted {
                Ok(())
            } else {
                Err(refuse(&needed.refusal()))
            }
        })));
    }
    let rbac_kind = matches!(plural.as_str(), "roles" | "clusterroles" | "rolebindings" | "clusterrolebindings");
    if rp.group == rbac::GROUP && rbac_kind && sub.is_empty() {
        let authz = authz.clone();
        return Some(Admit(Arc::new(move |new, old| authz.admit_rbac_write(&user, &plural, &ns, new, old))));
    }
    let node_kind = matches!(plural.as_str(), "nodes" | "pods");
    if rp.group.is_empty() && node_kind && authz.uses(Mode::Node) && node::node_name(&user).is_some() {
        return Some(Admit(Arc::new(move |new, old| {
            node::restrict(&user, &plural, &sub, new, old).map_err(|why| {
                let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                ApiError::forbidden("", &plural, name, &why)
            })
        })));
    }
    None
}

/// Whether an update changes only what the garbage collector changes (owner references
/// and finalizers), which needs no escalation check.
fn only_gc_fields_differ(new: &Value, old: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in ["ownerReferences", "finalizers", "resourceVersion", "managedFields", "generation"] {
                m.remove(f);
            }
        }
        v
    };
    strip(new) == strip(old)
}

/// `strings.NewReplacer` of Kubernetes' forbidden-message sanitizer.
fn sanitize(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Kubernetes' forbidden message for a request.
pub fn forbidden_message(a: &Attributes) -> String {
    if !a.resource_request {
        return format!("User {:?} cannot {} path {:?}", a.user.name, a.verb, a.path);
    }
    let resource =
        if a.subresource.is_empty() { a.resource.clone() } else { format!("{}/{}", a.resource, a.subresource) };
    if a.namespace.is_empty() {
        format!(
            "User {:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
            a.user.name, a.verb, a.api_group
        )
    } else {
        format!(
            "User {:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
            a.user.name, a.verb, a.api_group, a.namespace
        )
    }
}

/// Kubernetes' 403 for a request the authorizers did not allow.
pub fn forbidden(a: &Attributes, reason: &str) -> ApiError {
    let msg = sanitize(&forbidden_message(a));
    let err = if reason.is_empty() { msg } else { format!("{msg}: {reason}") };
    ApiError::forbidden_error(&a.api_group, &a.resource, &a.name, &err)
}

async fn authorize(State(authz): State<Arc<Authorizer>>, mut req: Request, next: Next) -> Response {
    let requester = User::of(req.extensions().get::<UserInfo>());
    let user = match impersonation::requested(req.headers()) {
        Err(e) => return e.into_response(),
        Ok(None) => requester,
        Ok(Some(asked)) => match impersonation::impersonate(&authz, &requester, &asked) {
            Err(e) => return e.into_response(),
            Ok(acting) => {
                let user = User::of(acting.as_ref());
                match acting {
                    Some(info) => req.extensions_mut().insert(info),
                    None => req.extensions_mut().remove::<UserInfo>(),
                };
                user
            }
        },
    };
    if authz.allows_everything() {
        return next.run(req).await;
    }
    let attrs = request_attributes(req.method(), req.uri().path(), req.uri().query().unwrap_or_default(), user);
    let verdict = authz.authorize(&attrs);
    if verdict.decision == Decision::Allow {
        return next.run(req).await;
    }
    tracing::debug!(user = attrs.user.name, verb = attrs.verb, path = attrs.path, reason = verdict.reason, "forbidden");
    forbidden(&attrs, &verdict.reason).into_response()
}

/// Put authorization in front of every route of `router`; authentication goes outside it.
pub fn layer(router: Router, authz: Arc<Authorizer>) -> Router {
    router.layer(middleware::from_fn_with_state(authz, authorize))
}

/// The `--insecure-port` listener's identity, as kube-apiserver had it: every request is
/// `system:unsecured` in `system:masters`, with no authorization.
pub fn insecure(router: Router) -> Router {
    router.layer(middleware::from_fn(|mut req: Request, next: Next| async move {
        let superuser = UserInfo {
            name: "system:unsecured".into(),
            uid: String::new(),
            groups: vec![PRIVILEGED_GROUP.into(), AUTHENTICATED.into()],
        };
        req.extensions_mut().insert(superuser);
        next.run(req).await
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jane() -> User {
        User { name: "jane".into(), uid: String::new(), groups: vec![AUTHENTICATED.into()] }
    }

    fn attrs(method: Method, path: &str, query: &str) -> Attributes {
        request_attributes(&method, path, query, jane())
    }

    #[test]
    fn verbs_follow_kubernetes_mapping() {
        let verb = |m: Method, p: &str, q: &str| attrs(m, p, q).verb;
        assert_eq!(verb(Method::GET, "/api/v1/namespaces/default/pods", ""), "list");
        assert_eq!(verb(Method::GET, "/api/v1/namespaces/default/pods", "watch=true"), "watch");
        assert_eq!(verb(Method::GET, "/api/v1/watch/namespaces/default/pods", ""), "watch");
        assert_eq!(verb(Method::GET, "/api/v1/namespaces/default/pods/p", ""), "get");
        assert_eq!(verb(Method::HEAD, "/api/v1/namespaces/default/pods/p", ""), "get");
        assert_eq!(verb(Method::POST, "/api/v1/namespaces/default/pods", ""), "create");
        assert_eq!(verb(Method::PUT, "/api/v1/namespaces/default/pods/p", ""), "update");
        assert_eq!(verb(Method::PATCH, "/api/v1/namespaces/default/pods/p/status", ""), "patch");
        assert_eq!(verb(Method::DELETE, "/api/v1/namespaces/default/pods/p", ""), "delete");
        assert_eq!(verb(Method::DELETE, "/api/v1/namespaces/default/pods", ""), "deletecollection");
        assert_eq!(verb(Method::GET, "/healthz", ""), "get");
        assert_eq!(verb(Method::POST, "/apis/apps/v1", ""), "post");
    }

    #[test]
    fn attributes_of_resource_and_non_resource_paths() {
        let a = attrs(Method::GET, "/apis/apps/v1/namespaces/team/deployments/web/scale", "");
        assert!(a.resource_request);
        assert_eq!(
            (a.api_group.as_str(), a.api_version.as_str(), a.resource.as_str(), a.subresource.as_str()),
            ("apps", "v1", "deployments", "scale")
        );
        assert_eq!((a.namespace.as_str(), a.name.as_str()), ("team", "web"));
        let a = attrs(Method::GET, "/api/v1/namespaces/team", "");
        assert_eq!((a.resource.as_str(), a.namespace.as_str(), a.name.as_str()), ("namespaces", "team", "team"));
        let a = attrs(Method::GET, "/api/v1/namespaces", "");
        assert_eq!((a.resource.as_str(), a.namespace.as_str(), a.verb.as_str()), ("namespaces", "", "list"));
        let a = attrs(Method::GET, "/api/v1/namespaces/team/pods", "fieldSelector=metadata.name%3Dweb&watch=1");
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "web"));
        let a = attrs(Method::GET, "/api/v1/pods", "fieldSelector=spec.nodeName%3Dn1");
        assert_eq!(a.name, "");
        for p in ["/api", "/api/v1", "/apis/apps", "/apis/apps/v1", "/version", "/openapi/v2"] {
            let a = attrs(Method::GET, p, "");
            assert!(!a.resource_request, "{p}");
            assert_eq!(a.path, p);
        }
    }

    #[test]
    fn forbidden_messages_are_kubernetes_own() {
        let e = forbidden(&attrs(Method::GET, "/api/v1/namespaces/default/pods", ""), "");
        assert_eq!(
            e.message,
            r#"pods is forbidden: User "jane" cannot list resource "pods" in API group "" in the namespace "default""#
        );
        assert_eq!((e.code, e.reason), (403, "Forbidden"));
        let d = e.to_status()["details"].clone();
        assert_eq!(d, serde_json::json!({"kind": "pods"}));
        let e = forbidden(&attrs(Method::GET, "/apis/apps/v1/deployments", ""), "");
        assert_eq!(
            e.message,
            r#"deployments.apps is forbidden: User "jane" cannot list resource "deployments" in API group "apps" at the cluster scope"#
        );
        let e = forbidden(&attrs(Method::GET, "/api/v1/namespaces/default/pods/web/log", ""), "");
        assert_eq!(
            e.message,
            r#"pods "web" is forbidden: User "jane" cannot get resource "pods/log" in API group "" in the namespace "default""#
        );
        assert_eq!(e.to_status()["details"], serde_json::json!({"kind": "pods", "name": "web"}));
        let e = forbidden(&attrs(Method::GET, "/metrics", ""), "");
        assert_eq!(e.message, r#"forbidden: User "jane" cannot get path "/metrics""#);
        assert_eq!(e.to_status()["details"], serde_json::json!({}));
        let e =
            forbidden(&attrs(Method::DELETE, "/apis/rbac.authorization.k8s.io/v1/clusterroles/x", ""), "RBAC: nope");
        assert_eq!(
            e.message,
            r#"clusterroles.rbac.authorization.k8s.io "x" is forbidden: User "jane" cannot delete resource "clusterroles" in API group "rbac.authorization.k8s.io" at the cluster scope: RBAC: nope"#
        );
        assert_eq!(
            e.to_status()["details"],
            serde_json::json!({"kind": "clusterroles", "name": "x", "group": "rbac.authorization.k8s.io"})
        );
        let e = forbidden(&attrs(Method::GET, "/<script>", ""), "");
        assert_eq!(e.message, r#"forbidden: User "jane" cannot get path "/&lt;script&gt;""#);
    }

    #[test]
    fn modes_parse_as_kube_apiserver_validates_them() {
        assert_eq!(parse_modes("Node,RBAC").unwrap(), [Mode::Node, Mode::Rbac]);
        assert_eq!(parse_modes("AlwaysAllow").unwrap(), [Mode::AlwaysAllow]);
        assert_eq!(parse_modes("rbac").unwrap_err(), r#"authorization-mode "rbac" is not a valid mode"#);
        assert!(parse_modes("RBAC,RBAC").unwrap_err().contains("more than once"));
        assert!(parse_modes("").is_err());
    }

    #[test]
    fn the_union_stops_at_the_first_opinion_and_masters_pass() {
        let deny = Authorizer::new(vec![Mode::Rbac, Mode::AlwaysDeny]);
        let a = attrs(Method::GET, "/api/v1/pods", "");
        assert_eq!(deny.authorize(&a), Verdict::of(Decision::Deny, "Everything is forbidden."));
        let mut admin = a.clone();
        admin.user.groups.push(PRIVILEGED_GROUP.into());
        assert_eq!(deny.authorize(&admin).decision, Decision::Allow);
        let rbac_only = Authorizer::new(vec![Mode::Rbac]);
        assert_eq!(rbac_only.authorize(&a).decision, Decision::NoOpinion);
        assert_eq!(Authorizer::new(vec![Mode::AlwaysAllow]).authorize(&a).decision, Decision::Allow);
    }

    #[test]
    fn users_get_the_authenticated_or_anonymous_groups() {
        let info = UserInfo { name: "jane".into(), uid: "1".into(), groups: vec!["devs".into()] };
        assert_eq!(User::of(Some(&info)).groups, ["devs", AUTHENTICATED]);
        let anon = User::of(None);
        assert_eq!((anon.name.as_str(), anon.groups.as_slice()), (ANONYMOUS, &[UNAUTHENTICATED.to_string()][..]));
    }

    #[test]
    fn escalation_is_refused_with_kubernetes_text() {
        let authz = Authorizer::new(vec![Mode::Rbac]);
        authz.rbac.set(rbac::Index::build(&rbac::tests::objects()));
        let role = serde_json::json!({"metadata": {"name": "r", "namespace": "team"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create"]}]});
        let e = authz.admit_rbac_write(&jane(), "roles", "team", &role, None).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "roles.rbac.authorization.k8s.io \"r\" is forbidden: user \"jane\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"create\"]}"
        );
        let fine = serde_json::json!({"metadata": {"name": "r"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]});
        assert!(authz.admit_rbac_write(&jane(), "roles", "team", &fine, None).is_ok());
        assert!(authz.admit_rbac_write(&jane(), "roles", "other", &fine, None).is_err());
        let binding = serde_json::json!({"metadata": {"name": "b"},
            "roleRef": {"apiGroup": rbac::GROUP, "kind": "ClusterRole", "name": "view"}, "subjects": []});
        assert!(authz.admit_rbac_write(&jane(), "rolebindings", "team", &binding, None).is_ok());
        assert!(authz.admit_rbac_write(&jane(), "clusterrolebindings", "", &binding, None).is_err());
        let dangling = serde_json::json!({"metadata": {"name": "b"},
            "roleRef": {"apiGroup": rbac::GROUP, "kind": "ClusterRole", "name": "gone"}});
        let e = authz.admit_rbac_write(&jane(), "rolebindings", "team", &dangling, None).unwrap_err();
        assert_eq!(
            e.message,
            r#"rolebindings.rbac.authorization.k8s.io "b" is forbidden: clusterrole.rbac.authorization.k8s.io "gone" not found"#
        );
        let mut admin = jane();
        admin.groups.push(PRIVILEGED_GROUP.into());
        assert!(authz.admit_rbac_write(&admin, "clusterrolebindings", "", &dangling, None).is_ok());
        // Only the garbage collector's fields changed: no check.
        let mut owned = role.clone();
        owned["metadata"]["ownerReferences"] = serde_json::json!([{"name": "x"}]);
        assert!(authz.admit_rbac_write(&jane(), "roles", "team", &owned, Some(&role)).is_ok());
    }
}
