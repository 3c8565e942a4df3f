//! Node-side scheduling predicates the scheduler and the DaemonSet controller share: does a
//! toleration tolerate a taint (`v1.Toleration.ToleratesTaint`), and does a node (its name
//! and labels) satisfy a `NodeSelector` (`nodeaffinity.NodeSelector.Match`: terms ORed,
//! a term's `matchExpressions` on labels and `matchFields` on `metadata.name` ANDed, an
//! empty term matching nothing).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration};

/// Does `t` tolerate `taint` (`v1.Toleration.ToleratesTaint`)?
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
        _ => false,
    }
}

/// Does any of `tolerations` tolerate `taint`?
pub fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

/// Does one node-selector requirement hold for a value (a label's, or `metadata.name` for
/// matchFields)?
fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let vals = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| vals.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !vals.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(want)) =
                (value.and_then(|v| v.parse::<i64>().ok()), vals.first().and_then(|x| x.parse::<i64>().ok()))
            else {
                return false;
            };
            if r.operator == "Gt" {
                v > want
            } else {
                v < want
            }
        }
        _ => false,
    }
}

/// A `NodeSelectorTerm`: all expressions and fields hold. An empty term matches nothing.
pub fn node_selector_term_matches(term: &NodeSelectorTerm, name: &str, labels: &BTreeMap<String, String>) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs.iter().all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| r.key == "metadata.name" && requirement_matches(r, Some(name)))
}

/// A `NodeSelector`: any term matches.
pub fn node_selector_matches(sel: &NodeSelector, name: &str, labels: &BTreeMap<String, String>) -> bool {
    sel.node_selector_terms.iter().any(|t| node_selector_term_matches(t, name, labels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sel(v: serde_json::Value) -> NodeSelector {
        serde_json::from_value(json!({"nodeSelectorTerms": v})).unwrap()
    }

    #[test]
    fn match_fields_on_the_node_name() {
        let labels = BTreeMap::from([("zone".to_string(), "a".to_string())]);
        let by_name = sel(json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]));
        assert!(node_selector_matches(&by_name, "n1", &labels));
        assert!(!node_selector_matches(&by_name, "n2", &labels));
        let both = sel(json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}],
                               "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]));
        assert!(!node_selector_matches(&both, "n1", &labels));
        assert!(!node_selector_matches(&sel(json!([{}])), "n1", &labels));
    }

    #[test]
    fn tolerations() {
        let taint = Taint { key: "k".into(), value: Some("v".into()), effect: "NoSchedule".into(), time_added: None };
        let t = |v: serde_json::Value| -> Toleration { serde_json::from_value(v).unwrap() };
        assert!(tolerates(&t(json!({"key": "k", "operator": "Exists"})), &taint));
        assert!(tolerates(&t(json!({"key": "k", "value": "v"})), &taint));
        assert!(!tolerates(&t(json!({"key": "k", "value": "w"})), &taint));
        assert!(!tolerates(&t(json!({"key": "k", "operator": "Exists", "effect": "NoExecute"})), &taint));
        assert!(tolerates(&t(json!({"operator": "Exists"})), &taint));
    }
}
