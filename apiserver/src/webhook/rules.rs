//! Which webhooks a request meets: the configurations compiled once when they change, and
//! the pure matching of a request's attributes against a webhook's `rules`,
//! `namespaceSelector` and `objectSelector` (Kubernetes' webhook matching rules).

use std::collections::BTreeMap;
use std::time::Duration;

use apimachinery::labels::Selector;
use serde_json::Value;

/// A request's operation, as admission names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
    /// The `options` object kind the AdmissionReview carries for this operation.
    pub fn options_kind(self) -> &'static str {
        match self {
            Operation::Create => "CreateOptions",
            Operation::Update => "UpdateOptions",
            Operation::Delete => "DeleteOptions",
        }
    }
}

/// What a webhook's rules are matched against.
#[derive(Clone, Copy, Debug)]
pub struct Attributes<'a> {
    pub operation: Operation,
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    /// Empty for the main resource.
    pub subresource: &'a str,
    pub namespaced: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    Fail,
    Ignore,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SideEffects {
    /// `None` or `NoneOnDryRun`: may be called for a dry run.
    DryRunSafe,
    /// `Some`, `Unknown`: a dry run that meets it is refused.
    Unsafe,
}

/// Where the webhook is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Url(String),
    Service { namespace: String, name: String, path: String, port: u16 },
}

/// One rule (`operations` × `apiGroups` × `apiVersions` × `resources`, `scope`).
#[derive(Clone, Debug, Default)]
pub struct Rule {
    operations: Vec<String>,
    groups: Vec<String>,
    versions: Vec<String>,
    resources: Vec<String>,
    scope: String,
}

/// One webhook of a configuration, ready to be matched and called.
#[derive(Clone, Debug)]
pub struct Hook {
    /// The webhook's name (what a denial names).
    pub name: String,
    /// The configuration it belongs to.
    pub configuration: String,
    pub endpoint: Endpoint,
    /// PEM bundle the webhook's serving certificate must chain to (empty: none given).
    pub ca_bundle: Vec<u8>,
    pub rules: Vec<Rule>,
    pub namespace_selector: Selector,
    pub object_selector: Selector,
    pub failure_policy: FailurePolicy,
    pub side_effects: SideEffects,
    pub timeout: Duration,
    /// Mutating only: `reinvocationPolicy: IfNeeded`.
    pub reinvoke: bool,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

fn one_of(list: &[String], value: &str) -> bool {
    list.iter().any(|x| x == "*" || x == value)
}

impl Rule {
    pub fn from_json(v: &Value) -> Rule {
        Rule {
            operations: strings(v.get("operations")),
            groups: strings(v.get("apiGroups")),
            versions: strings(v.get("apiVersions")),
            resources: strings(v.get("resources")),
            scope: v.get("scope").and_then(Value::as_str).unwrap_or("*").to_string(),
        }
    }

    /// Kubernetes' rule matching: `resources` entries are `<resource>` (no subresource),
    /// `<resource>/<sub>`, `*` (every resource, no subresources), `*/*` (everything),
    /// `<resource>/*` and `*/<sub>`.
    pub fn matches(&self, a: &Attributes<'_>) -> bool {
        let scope_ok = match self.scope.as_str() {
            "Cluster" => !a.namespaced,
            "Namespaced" => a.namespaced,
            _ => true,
        };
        scope_ok
            && one_of(&self.operations, a.operation.as_str())
            && one_of(&self.groups, a.group)
            && one_of(&self.versions, a.version)
            && self.resources.iter().any(|r| resource_matches(r, a.resource, a.subresource))
    }
}

fn resource_matches(pattern: &str, resource: &str, sub: &str) -> bool {
    let (res_pat, sub_pat) = match pattern.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (pattern, None),
    };
    let res_ok = res_pat == "*" || res_pat == resource;
    let sub_ok = match sub_pat {
        None => sub.is_empty(),
        Some("*") => true,
        Some(s) => s == sub,
    };
    res_ok && sub_ok
}

/// A configuration field that could not be compiled into a [`Hook`]; the webhook is then
/// treated as failing to call (its failure policy decides).
pub fn selector(v: Option<&Value>) -> Result<Selector, String> {
    match v {
        None | Some(Value::Null) => Ok(Selector::everything()),
        Some(v) => Selector::from_label_selector_json(v).map_err(|e| e.0),
    }
}

/// Compile every webhook of a Mutating- or ValidatingWebhookConfiguration. A webhook whose
/// selectors do not parse is kept with a selector that matches nothing and logged (the
/// strategy refuses such objects at write time, so this only meets corrupt storage).
pub fn compile(config: &Value, mutating: bool) -> Vec<Hook> {
    let configuration = config.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let mut out = Vec::new();
    for w in config.get("webhooks").and_then(Value::as_array).into_iter().flatten() {
        let name = w.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let cc = w.get("clientConfig").cloned().unwrap_or(Value::Null);
        let endpoint = match (cc.get("url").and_then(Value::as_str), cc.get("service")) {
            (Some(url), _) => Endpoint::Url(url.to_string()),
            (None, Some(s)) => Endpoint::Service {
                namespace: s.get("namespace").and_then(Value::as_str).unwrap_or_default().to_string(),
                name: s.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                path: s.get("path").and_then(Value::as_str).unwrap_or("/").to_string(),
                port: s.get("port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()).unwrap_or(443),
            },
            (None, None) => Endpoint::Url(String::new()),
        };
        let ca_bundle = cc
            .get("caBundle")
            .and_then(Value::as_str)
            .and_then(|b| {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.decode(b).ok()
            })
            .unwrap_or_default();
        let sel = |field: &str| {
            selector(w.get(field)).unwrap_or_else(|e| {
                tracing::warn!(webhook = name, field, error = e, "webhook selector does not parse; it matches nothing");
                Selector::nothing()
            })
        };
        out.push(Hook {
            endpoint,
            ca_bundle,
            rules: w.get("rules").and_then(Value::as_array).into_iter().flatten().map(Rule::from_json).collect(),
            namespace_selector: sel("namespaceSelector"),
            object_selector: sel("objectSelector"),
            failure_policy: match w.get("failurePolicy").and_then(Value::as_str) {
                Some("Ignore") => FailurePolicy::Ignore,
                _ => FailurePolicy::Fail,
            },
            side_effects: match w.get("sideEffects").and_then(Value::as_str) {
                Some("None") | Some("NoneOnDryRun") => SideEffects::DryRunSafe,
                _ => SideEffects::Unsafe,
            },
            timeout: Duration::from_secs(w.get("timeoutSeconds").and_then(Value::as_u64).unwrap_or(10).clamp(1, 30)),
            reinvoke: mutating && w.get("reinvocationPolicy").and_then(Value::as_str) == Some("IfNeeded"),
            configuration: configuration.clone(),
            name,
        });
    }
    out
}

/// The labels of an object (`metadata.labels`).
pub fn labels_of(obj: Option<&Value>) -> BTreeMap<String, String> {
    obj.and_then(|o| o.pointer("/metadata/labels"))
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

impl Hook {
    /// The rules and the object selector (the namespace selector needs the namespace's
    /// labels: [`Hook::namespace_matches`]). The object selector matches if either the new
    /// or the old object matches it.
    pub fn matches(&self, a: &Attributes<'_>, new: Option<&Value>, old: Option<&Value>) -> bool {
        if !self.rules.iter().any(|r| r.matches(a)) {
            return false;
        }
        if self.object_selector.is_empty() {
            return true;
        }
        [new, old].into_iter().flatten().any(|o| self.object_selector.matches(&labels_of(Some(o))))
    }

    /// Whether the namespace selector needs the namespace's labels to decide.
    pub fn needs_namespace(&self, a: &Attributes<'_>) -> bool {
        !self.namespace_selector.is_empty() && (a.namespaced || (a.group.is_empty() && a.resource == "namespaces"))
    }

    /// A cluster-scoped object is not in a namespace and matches any namespace selector,
    /// except a Namespace, which is matched by its own labels (`ns_labels`).
    pub fn namespace_matches(&self, a: &Attributes<'_>, ns_labels: &BTreeMap<String, String>) -> bool {
        !self.needs_namespace(a) || self.namespace_selector.matches(ns_labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs<'a>(op: Operation, resource: &'a str, sub: &'a str) -> Attributes<'a> {
        Attributes { operation: op, group: "", version: "v1", resource, subresource: sub, namespaced: true }
    }

    #[test]
    fn resources_subresources_and_wildcards_match_as_kubernetes_matches_them() {
        let rule = |res: &str| {
            Rule::from_json(
                &json!({"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": [res]}),
            )
        };
        let pod = attrs(Operation::Create, "pods", "");
        let status = attrs(Operation::Create, "pods", "status");
        assert!(rule("pods").matches(&pod));
        assert!(!rule("pods").matches(&status));
        assert!(rule("pods/status").matches(&status));
        assert!(rule("*").matches(&pod) && !rule("*").matches(&status));
        assert!(rule("*/*").matches(&status));
        assert!(rule("pods/*").matches(&pod) && rule("pods/*").matches(&status));
        assert!(rule("*/status").matches(&status) && !rule("*/status").matches(&pod));
        assert!(!rule("services").matches(&pod));
        assert!(!rule("pods").matches(&attrs(Operation::Update, "pods", "")));
        let any = Rule::from_json(
            &json!({"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["pods"], "scope": "Cluster"}),
        );
        assert!(!any.matches(&pod), "a Cluster-scoped rule does not meet a namespaced resource");
    }

    #[test]
    fn object_selector_matches_the_new_or_the_old_object() {
        let config = json!({"metadata": {"name": "c"}, "webhooks": [{
            "name": "a.b.c", "clientConfig": {"url": "https://x/"}, "sideEffects": "None",
            "rules": [{"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "objectSelector": {"matchLabels": {"inject": "true"}},
            "namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]},
        }]});
        let hook = &compile(&config, true)[0];
        let a = attrs(Operation::Update, "pods", "");
        let with = json!({"metadata": {"labels": {"inject": "true"}}});
        let without = json!({"metadata": {}});
        assert!(hook.matches(&a, Some(&without), Some(&with)));
        assert!(hook.matches(&a, Some(&with), None));
        assert!(!hook.matches(&a, Some(&without), Some(&without)));
        assert!(hook.needs_namespace(&a));
        let prod = BTreeMap::from([("env".to_string(), "prod".to_string())]);
        assert!(hook.namespace_matches(&a, &prod));
        assert!(!hook.namespace_matches(&a, &BTreeMap::new()));
        assert_eq!(hook.failure_policy, FailurePolicy::Fail);
        assert_eq!(hook.timeout, Duration::from_secs(10));
    }
}
