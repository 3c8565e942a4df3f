//! RBAC as a pure decision: Kubernetes' rule matching (`RuleAllows`), subject matching, and
//! an [`Index`] of the four RBAC kinds built for fast lookups — bindings by the user name or
//! group they name, each with its role's rules already resolved — so a request costs a few
//! hash lookups and the rules of the bindings that apply, never a storage read.
//! [`Rbac`] holds the current index; `feed.rs` replaces it as the stored objects change.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};

use super::{Attributes, Decision, User, Verdict};

pub const GROUP: &str = "rbac.authorization.k8s.io";

fn list(v: &Option<Vec<String>>) -> &[String] {
    v.as_deref().unwrap_or_default()
}

fn has(v: &[String], s: &str) -> bool {
    v.iter().any(|x| x == s)
}

pub fn verb_matches(rule: &PolicyRule, verb: &str) -> bool {
    rule.verbs.iter().any(|v| v == "*" || v == verb)
}

pub fn api_group_matches(rule: &PolicyRule, group: &str) -> bool {
    list(&rule.api_groups).iter().any(|g| g == "*" || g == group)
}

/// `resources` holds `*`, the resource (`pods`), `resource/subresource` or `*/subresource`.
pub fn resource_matches(rule: &PolicyRule, resource: &str, subresource: &str) -> bool {
    list(&rule.resources).iter().any(|r| {
        if r == "*" {
            return true;
        }
        if subresource.is_empty() {
            return r == resource;
        }
        match r.split_once('/') {
            Some((res, sub)) => sub == subresource && (res == "*" || res == resource),
            None => false,
        }
    })
}

pub fn resource_name_matches(rule: &PolicyRule, name: &str) -> bool {
    let names = list(&rule.resource_names);
    names.is_empty() || has(names, name)
}

/// `nonResourceURLs`: `*`, an exact path, or a prefix ending in `*`.
pub fn non_resource_url_matches(rule: &PolicyRule, path: &str) -> bool {
    list(&rule.non_resource_urls)
        .iter()
        .any(|u| u == "*" || u == path || u.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix)))
}

/// Whether `rule` allows the request (Kubernetes' `RuleAllows`).
pub fn rule_allows(a: &Attributes, rule: &PolicyRule) -> bool {
    if !verb_matches(rule, &a.verb) {
        return false;
    }
    if a.resource_request {
        api_group_matches(rule, &a.api_group)
            && resource_matches(rule, &a.resource, &a.subresource)
            && resource_name_matches(rule, &a.name)
    } else {
        non_resource_url_matches(rule, &a.path)
    }
}

/// The user name of a service account.
pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The groups every service account of `namespace` is in.
pub fn service_account_groups(namespace: &str) -> Vec<String> {
    vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{namespace}")]
}

/// A subject as a lookup key: the user name or group it matches. A ServiceAccount is the
/// user `system:serviceaccount:<ns>:<name>`, its namespace defaulting to the binding's; one
/// without a namespace in a ClusterRoleBinding matches nobody.
fn subject_key(s: &Subject, binding_namespace: &str) -> Option<Key> {
    match s.kind.as_str() {
        "User" => Some(Key::User(s.name.clone())),
        "Group" => Some(Key::Group(s.name.clone())),
        "ServiceAccount" => {
            let ns = s.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or(binding_namespace);
            (!ns.is_empty()).then(|| Key::User(service_account_username(ns, &s.name)))
        }
        _ => None,
    }
}

/// Whether a binding's subject applies to `user` (Kubernetes' `appliesToUser`).
pub fn applies_to(user: &User, s: &Subject, binding_namespace: &str) -> bool {
    match subject_key(s, binding_namespace) {
        Some(Key::User(n)) => n == user.name,
        Some(Key::Group(g)) => has(&user.groups, &g),
        None => false,
    }
}

enum Key {
    User(String),
    Group(String),
}

/// How a subject is described in an "allowed by" reason.
fn describe_subject(s: &Subject, binding_namespace: &str) -> String {
    match s.kind.as_str() {
        "ServiceAccount" => {
            let ns = s.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or(binding_namespace);
            format!("{} {:?}", s.kind, format!("{}/{ns}", s.name))
        }
        _ => format!("{} {:?}", s.kind, s.name),
    }
}

/// The stored RBAC objects, by key.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub roles: BTreeMap<(String, String), Role>,
    pub cluster_roles: BTreeMap<String, ClusterRole>,
    pub role_bindings: BTreeMap<(String, String), RoleBinding>,
    pub cluster_role_bindings: BTreeMap<String, ClusterRoleBinding>,
}

/// One binding's grant to one subject: the role's rules (or why they cannot be had) and
/// the reason an allow names.
#[derive(Debug)]
struct Grant {
    rules: Result<Arc<[PolicyRule]>, Arc<str>>,
    source: Arc<str>,
}

#[derive(Debug, Default)]
struct Grants {
    users: HashMap<String, Vec<Arc<Grant>>>,
    groups: HashMap<String, Vec<Arc<Grant>>>,
}

impl Grants {
    fn add(&mut self, key: Key, grant: Arc<Grant>) {
        let (map, k) = match key {
            Key::User(u) => (&mut self.users, u),
            Key::Group(g) => (&mut self.groups, g),
        };
        map.entry(k).or_default().push(grant);
    }

    /// The grants that apply to `user`, in a stable order (user, then each group).
    fn for_user<'a>(&'a self, user: &'a User) -> impl Iterator<Item = &'a Arc<Grant>> + 'a {
        let by_name = self.users.get(&user.name).into_iter().flatten();
        let by_group = user.groups.iter().filter_map(|g| self.groups.get(g)).flatten();
        by_name.chain(by_group)
    }
}

/// The RBAC index: ClusterRoleBindings and each namespace's RoleBindings by subject.
#[derive(Debug, Default)]
pub struct Index {
    cluster: Grants,
    namespaces: HashMap<String, Grants>,
    /// Each role's rules by (namespace, name); a ClusterRole's namespace is empty.
    roles: HashMap<(String, String), Arc<[PolicyRule]>>,
}

/// Why a role reference cannot be resolved (Kubernetes' lister error).
fn not_found(r: &RoleRef) -> Arc<str> {
    format!("{}.{GROUP} {:?} not found", r.kind.to_ascii_lowercase(), r.name).into()
}

impl Index {
    pub fn build(objs: &Objects) -> Index {
        let mut index = Index::default();
        for ((ns, name), r) in &objs.roles {
            index.roles.insert((ns.clone(), name.clone()), r.rules.clone().unwrap_or_default().into());
        }
        for (name, r) in &objs.cluster_roles {
            index.roles.insert((String::new(), name.clone()), r.rules.clone().unwrap_or_default().into());
        }
        for (name, b) in &objs.cluster_role_bindings {
            let rules = index.role_rules("", &b.role_ref);
            for s in b.subjects.iter().flatten() {
                let Some(key) = subject_key(s, "") else { continue };
                let source = format!(
                    "RBAC: allowed by ClusterRoleBinding {name:?} of {} {:?} to {}",
                    b.role_ref.kind,
                    b.role_ref.name,
                    describe_subject(s, "")
                );
                index.cluster.add(key, Arc::new(Grant { rules: rules.clone(), source: source.into() }));
            }
        }
        for ((ns, name), b) in &objs.role_bindings {
            let rules = index.role_rules(ns, &b.role_ref);
            let grants = index.namespaces.entry(ns.clone()).or_default();
            for s in b.subjects.iter().flatten() {
                let Some(key) = subject_key(s, ns) else { continue };
                let source = format!(
                    "RBAC: allowed by RoleBinding {:?} of {} {:?} to {}",
                    format!("{name}/{ns}"),
                    b.role_ref.kind,
                    b.role_ref.name,
                    describe_subject(s, ns)
                );
                grants.add(key, Arc::new(Grant { rules: rules.clone(), source: source.into() }));
            }
        }
        index
    }

    /// The rules a binding in `namespace` (empty for a ClusterRoleBinding) grants through
    /// `r`, or Kubernetes' not-found error.
    pub fn role_rules(&self, namespace: &str, r: &RoleRef) -> Result<Arc<[PolicyRule]>, Arc<str>> {
        let ns = match r.kind.as_str() {
            "ClusterRole" => "",
            "Role" => namespace,
            other => return Err(format!("unsupported role reference kind: {other:?}").into()),
        };
        self.roles.get(&(ns.to_string(), r.name.clone())).cloned().ok_or_else(|| not_found(r))
    }

    fn grants<'a>(&'a self, user: &'a User, namespace: &'a str) -> impl Iterator<Item = &'a Arc<Grant>> + 'a {
        let local = (!namespace.is_empty()).then(|| self.namespaces.get(namespace)).flatten();
        self.cluster.for_user(user).chain(local.into_iter().flat_map(|g| g.for_user(user)))
    }

    /// Kubernetes' RBAC decision: allow with the first grant whose rules allow, otherwise
    /// no opinion, with the resolution errors met on the way as the reason.
    pub fn authorize(&self, a: &Attributes) -> Verdict {
        let mut errors: Vec<&str> = Vec::new();
        for g in self.grants(&a.user, &a.namespace) {
            match &g.rules {
                Ok(rules) => {
                    if rules.iter().any(|r| rule_allows(a, r)) {
                        return Verdict { decision: Decision::Allow, reason: g.source.to_string() };
                    }
                }
                Err(e) => {
                    if !errors.contains(&&**e) {
                        errors.push(e)
                    }
                }
            }
        }
        let reason = match errors.as_slice() {
            [] => String::new(),
            [one] => format!("RBAC: {one}"),
            many => format!("RBAC: [{}]", many.join(", ")),
        };
        Verdict { decision: Decision::NoOpinion, reason }
    }

    /// Every rule that applies to `user` in `namespace` (cluster-wide ones included), and
    /// the errors met resolving its bindings.
    pub fn rules_for(&self, user: &User, namespace: &str) -> (Vec<PolicyRule>, Vec<String>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        for g in self.grants(user, namespace) {
            match &g.rules {
                Ok(r) => rules.extend(r.iter().cloned()),
                Err(e) => {
                    if !errors.iter().any(|x: &String| x == &**e) {
                        errors.push(e.to_string())
                    }
                }
            }
        }
        (rules, errors)
    }
}

/// The RBAC authorizer: the current index, swapped whole when the objects change.
#[derive(Debug, Default)]
pub struct Rbac {
    index: RwLock<Arc<Index>>,
}

impl Rbac {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&self, index: Index) {
        *self.index.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(index);
    }

    pub fn index(&self) -> Arc<Index> {
        self.index.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn authorize(&self, a: &Attributes) -> Verdict {
        self.index().authorize(a)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    pub fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        PolicyRule { verbs: v(verbs), api_groups: Some(v(groups)), resources: Some(v(resources)), ..Default::default() }
    }

    pub fn urls(verbs: &[&str], urls: &[&str]) -> PolicyRule {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        PolicyRule { verbs: v(verbs), non_resource_urls: Some(v(urls)), ..Default::default() }
    }

    fn user(name: &str, groups: &[&str]) -> User {
        User { name: name.into(), uid: String::new(), groups: groups.iter().map(|g| g.to_string()).collect() }
    }

    fn res(u: &User, verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            user: u.clone(),
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    fn subject(kind: &str, name: &str, ns: Option<&str>) -> Subject {
        Subject { kind: kind.into(), name: name.into(), namespace: ns.map(Into::into), ..Default::default() }
    }

    fn role_ref(kind: &str, name: &str) -> RoleRef {
        RoleRef { api_group: Some(GROUP.into()), kind: kind.into(), name: name.into() }
    }

    pub fn objects() -> Objects {
        let mut o = Objects::default();
        o.cluster_roles.insert(
            "view".into(),
            ClusterRole {
                metadata: ObjectMeta { name: Some("view".into()), ..Default::default() },
                rules: Some(vec![rule(&["get", "list", "watch"], &[""], &["pods", "pods/log"])]),
                ..Default::default()
            },
        );
        o.roles.insert(
            ("team".into(), "scaler".into()),
            Role {
                metadata: ObjectMeta {
                    name: Some("scaler".into()),
                    namespace: Some("team".into()),
                    ..Default::default()
                },
                rules: Some(vec![PolicyRule {
                    resource_names: Some(vec!["web".into()]),
                    ..rule(&["update"], &["apps"], &["*/scale"])
                }]),
            },
        );
        o.role_bindings.insert(
            ("team".into(), "jane-view".into()),
            RoleBinding {
                metadata: ObjectMeta {
                    name: Some("jane-view".into()),
                    namespace: Some("team".into()),
                    ..Default::default()
                },
                role_ref: role_ref("ClusterRole", "view"),
                subjects: Some(vec![subject("User", "jane", None), subject("ServiceAccount", "robot", None)]),
            },
        );
        o.role_bindings.insert(
            ("team".into(), "devs-scale".into()),
            RoleBinding {
                metadata: ObjectMeta { name: Some("devs-scale".into()), ..Default::default() },
                role_ref: role_ref("Role", "scaler"),
                subjects: Some(vec![subject("Group", "devs", None)]),
            },
        );
        o.role_bindings.insert(
            ("team".into(), "dangling".into()),
            RoleBinding {
                metadata: ObjectMeta { name: Some("dangling".into()), ..Default::default() },
                role_ref: role_ref("ClusterRole", "gone"),
                subjects: Some(vec![subject("Group", "devs", None)]),
            },
        );
        o.cluster_role_bindings.insert(
            "readers".into(),
            ClusterRoleBinding {
                metadata: ObjectMeta { name: Some("readers".into()), ..Default::default() },
                role_ref: role_ref("ClusterRole", "view"),
                subjects: Some(vec![
                    subject("Group", "auditors", None),
                    // No namespace in a cluster binding: nobody.
                    subject("ServiceAccount", "nowhere", None),
                ]),
            },
        );
        o
    }

    #[test]
    fn resource_rules_match_verbs_groups_resources_and_names() {
        let r = rule(&["get"], &[""], &["pods"]);
        let u = user("u", &[]);
        assert!(rule_allows(&res(&u, "get", "", "pods", "", "ns", "p"), &r));
        assert!(!rule_allows(&res(&u, "list", "", "pods", "", "ns", ""), &r));
        assert!(!rule_allows(&res(&u, "get", "apps", "pods", "", "ns", "p"), &r));
        assert!(!rule_allows(&res(&u, "get", "", "pods", "log", "ns", "p"), &r));
        let all = rule(&["*"], &["*"], &["*"]);
        assert!(rule_allows(&res(&u, "deletecollection", "apps", "deployments", "scale", "", ""), &all));
        let sub = rule(&["get"], &[""], &["pods/log"]);
        assert!(rule_allows(&res(&u, "get", "", "pods", "log", "ns", "p"), &sub));
        assert!(!rule_allows(&res(&u, "get", "", "pods", "", "ns", "p"), &sub));
        let any_scale = rule(&["update"], &["apps"], &["*/scale"]);
        assert!(rule_allows(&res(&u, "update", "apps", "deployments", "scale", "ns", "d"), &any_scale));
        assert!(!rule_allows(&res(&u, "update", "apps", "deployments", "status", "ns", "d"), &any_scale));
        assert!(!rule_allows(&res(&u, "update", "apps", "deployments", "", "ns", "d"), &any_scale));
        let named = PolicyRule { resource_names: Some(vec!["a".into()]), ..rule(&["get"], &[""], &["pods"]) };
        assert!(rule_allows(&res(&u, "get", "", "pods", "", "ns", "a"), &named));
        assert!(!rule_allows(&res(&u, "get", "", "pods", "", "ns", "b"), &named));
        assert!(!rule_allows(&res(&u, "list", "", "pods", "", "ns", ""), &named));
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_star_prefix() {
        let r = urls(&["get"], &["/healthz", "/apis/*"]);
        let at = |verb: &str, path: &str| Attributes {
            verb: verb.into(),
            path: path.into(),
            resource_request: false,
            ..Default::default()
        };
        assert!(rule_allows(&at("get", "/healthz"), &r));
        assert!(!rule_allows(&at("get", "/healthz/etcd"), &r));
        assert!(rule_allows(&at("get", "/apis/apps/v1"), &r));
        assert!(rule_allows(&at("get", "/apis/"), &r));
        assert!(!rule_allows(&at("get", "/apis"), &r));
        assert!(!rule_allows(&at("post", "/healthz"), &r));
        assert!(rule_allows(&at("put", "/anything"), &urls(&["*"], &["*"])));
        // A resource rule never allows a path, nor a path rule a resource.
        assert!(!rule_allows(&at("get", "/healthz"), &rule(&["*"], &["*"], &["*"])));
        let u = user("u", &[]);
        assert!(!rule_allows(&res(&u, "get", "", "pods", "", "", ""), &urls(&["*"], &["*"])));
    }

    #[test]
    fn subjects_users_groups_and_service_accounts() {
        let jane = user("jane", &["system:authenticated"]);
        assert!(applies_to(&jane, &subject("User", "jane", None), "ns"));
        assert!(applies_to(&jane, &subject("Group", "system:authenticated", None), ""));
        assert!(!applies_to(&jane, &subject("Group", "jane", None), ""));
        let sa = user(
            "system:serviceaccount:team:robot",
            &service_account_groups("team").iter().map(String::as_str).collect::<Vec<_>>(),
        );
        assert!(applies_to(&sa, &subject("ServiceAccount", "robot", None), "team"));
        assert!(applies_to(&sa, &subject("ServiceAccount", "robot", Some("team")), "other"));
        assert!(!applies_to(&sa, &subject("ServiceAccount", "robot", None), "other"));
        assert!(!applies_to(&sa, &subject("ServiceAccount", "robot", None), ""));
        assert!(applies_to(&sa, &subject("Group", "system:serviceaccounts:team", None), ""));
    }

    #[test]
    fn role_bindings_grant_in_their_namespace_only() {
        let index = Index::build(&objects());
        let jane = user("jane", &["system:authenticated"]);
        let v = index.authorize(&res(&jane, "list", "", "pods", "", "team", ""));
        assert_eq!(v.decision, Decision::Allow);
        assert_eq!(v.reason, r#"RBAC: allowed by RoleBinding "jane-view/team" of ClusterRole "view" to User "jane""#);
        assert_eq!(index.authorize(&res(&jane, "list", "", "pods", "", "other", "")).decision, Decision::NoOpinion);
        assert_eq!(index.authorize(&res(&jane, "list", "", "pods", "", "", "")).decision, Decision::NoOpinion);
        assert_eq!(index.authorize(&res(&jane, "create", "", "pods", "", "team", "")).decision, Decision::NoOpinion);
        let robot = user("system:serviceaccount:team:robot", &[]);
        let v = index.authorize(&res(&robot, "get", "", "pods", "log", "team", "p"));
        assert_eq!(
            v.reason,
            r#"RBAC: allowed by RoleBinding "jane-view/team" of ClusterRole "view" to ServiceAccount "robot/team""#
        );
    }

    #[test]
    fn cluster_bindings_grant_everywhere() {
        let index = Index::build(&objects());
        let auditor = user("amy", &["auditors"]);
        for ns in ["", "team", "other"] {
            let v = index.authorize(&res(&auditor, "watch", "", "pods", "", ns, ""));
            assert_eq!(v.decision, Decision::Allow, "{ns}");
            assert_eq!(
                v.reason,
                r#"RBAC: allowed by ClusterRoleBinding "readers" of ClusterRole "view" to Group "auditors""#
            );
        }
        let nowhere = user("system:serviceaccount:default:nowhere", &[]);
        assert_eq!(
            index.authorize(&res(&nowhere, "get", "", "pods", "", "default", "p")).decision,
            Decision::NoOpinion
        );
    }

    #[test]
    fn missing_roles_are_the_reason_of_a_denial() {
        let index = Index::build(&objects());
        let dev = user("dan", &["devs"]);
        let v = index.authorize(&res(&dev, "update", "apps", "deployments", "scale", "team", "web"));
        assert_eq!(v.decision, Decision::Allow);
        let v = index.authorize(&res(&dev, "update", "apps", "deployments", "scale", "team", "api"));
        assert_eq!(v.decision, Decision::NoOpinion);
        assert_eq!(v.reason, r#"RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found"#);
        let (rules, errors) = index.rules_for(&dev, "team");
        assert_eq!(rules.len(), 1);
        assert_eq!(errors, [r#"clusterrole.rbac.authorization.k8s.io "gone" not found"#]);
    }

    #[test]
    fn rules_for_lists_cluster_then_namespace_rules() {
        let index = Index::build(&objects());
        let both = user("jane", &["auditors"]);
        let (rules, errors) = index.rules_for(&both, "team");
        assert_eq!(rules.len(), 2);
        assert!(errors.is_empty());
        assert_eq!(index.rules_for(&both, "other").0.len(), 1);
        assert!(index.rules_for(&user("nobody", &[]), "team").0.is_empty());
    }
}
