//! Escalation prevention (pure): a user may create or change a Role or ClusterRole only if
//! they already hold every permission it grants, and bind a role only if they hold all of
//! its permissions — unless they are allowed the `escalate` (roles) or `bind` (bindings)
//! verb, or are in `system:masters`. [`covers`] is Kubernetes' `Covers` (each requested rule
//! broken down to one verb, group, resource and name, each piece checked against the
//! owner's rules); [`not_held_message`] its error text with the missing rules compacted.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::PolicyRule;

use super::User;

fn list(v: &Option<Vec<String>>) -> &[String] {
    v.as_deref().unwrap_or_default()
}

fn has(v: &[String], s: &str) -> bool {
    v.iter().any(|x| x == s)
}

fn has_all(v: &[String], all: &[String]) -> bool {
    all.iter().all(|s| has(v, s))
}

fn one(s: &str) -> Option<Vec<String>> {
    Some(vec![s.to_string()])
}

/// A rule split into rules of one verb, group, resource (and name) each; non-resource URLs
/// combine with verbs only.
pub fn breakdown(rule: &PolicyRule) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    for group in list(&rule.api_groups) {
        for resource in list(&rule.resources) {
            for verb in &rule.verbs {
                let base = PolicyRule {
                    api_groups: one(group),
                    resources: one(resource),
                    verbs: vec![verb.clone()],
                    ..Default::default()
                };
                let names = list(&rule.resource_names);
                if names.is_empty() {
                    out.push(base);
                } else {
                    out.extend(names.iter().map(|n| PolicyRule { resource_names: one(n), ..base.clone() }));
                }
            }
        }
    }
    for url in list(&rule.non_resource_urls) {
        for verb in &rule.verbs {
            out.push(PolicyRule { non_resource_urls: one(url), verbs: vec![verb.clone()], ..Default::default() });
        }
    }
    out
}

fn resources_cover(owner: &[String], wanted: &[String]) -> bool {
    if has(owner, "*") || has_all(owner, wanted) {
        return true;
    }
    wanted.iter().all(|w| has(owner, w) || w.split_once('/').is_some_and(|(_, sub)| has(owner, &format!("*/{sub}"))))
}

fn url_covers(owner: &str, wanted: &str) -> bool {
    owner == wanted || owner.strip_suffix('*').is_some_and(|prefix| wanted.starts_with(prefix))
}

/// Whether `owner` grants everything `sub` (a broken-down rule) does.
pub fn rule_covers(owner: &PolicyRule, sub: &PolicyRule) -> bool {
    let verbs = has(&owner.verbs, "*") || has_all(&owner.verbs, &sub.verbs);
    let groups = has(list(&owner.api_groups), "*") || has_all(list(&owner.api_groups), list(&sub.api_groups));
    let resources = resources_cover(list(&owner.resources), list(&sub.resources));
    let urls =
        list(&sub.non_resource_urls).iter().all(|w| list(&owner.non_resource_urls).iter().any(|o| url_covers(o, w)));
    let owner_names = list(&owner.resource_names);
    let names = owner_names.is_empty()
        || (!list(&sub.resource_names).is_empty() && has_all(owner_names, list(&sub.resource_names)));
    verbs && groups && resources && names && urls
}

/// The pieces of `wanted` that `owner` does not grant (empty: covered).
pub fn uncovered(owner: &[PolicyRule], wanted: &[PolicyRule]) -> Vec<PolicyRule> {
    wanted.iter().flat_map(breakdown).filter(|sub| !owner.iter().any(|o| rule_covers(o, sub))).collect()
}

/// Rules of one group and resource (at most one name) that differ only by verb, merged.
pub fn compact(rules: Vec<PolicyRule>) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = Vec::new();
    // (group, resource, name) → the merged rule.
    type Simple = ((String, String, Option<String>), PolicyRule);
    let mut simple: Vec<Simple> = Vec::new();
    for r in rules {
        let groups = list(&r.api_groups);
        let resources = list(&r.resources);
        let names = list(&r.resource_names);
        let is_simple =
            groups.len() == 1 && resources.len() == 1 && names.len() <= 1 && list(&r.non_resource_urls).is_empty();
        if !is_simple {
            out.push(r);
            continue;
        }
        let key = (groups[0].clone(), resources[0].clone(), names.first().cloned());
        match simple.iter_mut().find(|(k, _)| *k == key) {
            Some((_, existing)) => existing.verbs.extend(r.verbs),
            None => simple.push((key, r)),
        }
    }
    out.extend(simple.into_iter().map(|(_, r)| r));
    out
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn quoted(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", items.join(" "))
}

/// A rule as the escalation error shows it (Kubernetes' `CompactString`).
pub fn compact_string(r: &PolicyRule) -> String {
    let mut parts = Vec::new();
    for (label, v) in [
        ("APIGroups", list(&r.api_groups)),
        ("Resources", list(&r.resources)),
        ("NonResourceURLs", list(&r.non_resource_urls)),
        ("ResourceNames", list(&r.resource_names)),
        ("Verbs", r.verbs.as_slice()),
    ] {
        if !v.is_empty() {
            parts.push(format!("{label}:{}", quoted(v)));
        }
    }
    format!("{{{}}}", parts.join(", "))
}

/// Kubernetes' refusal text for rules `user` does not hold.
pub fn not_held_message(user: &User, missing: Vec<PolicyRule>, resolution_errors: &[String]) -> String {
    let lines: BTreeSet<String> = compact(missing).iter().map(compact_string).collect();
    let mut msg = format!(
        "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        user.name,
        quoted(&user.groups),
        lines.into_iter().collect::<Vec<_>>().join("\n")
    );
    if !resolution_errors.is_empty() {
        let errs = if resolution_errors.len() == 1 {
            resolution_errors[0].clone()
        } else {
            format!("[{}]", resolution_errors.join(", "))
        };
        msg.push_str(&format!("; resolution errors: [{errs}]"));
    }
    msg
}

/// Everything: what it takes to set an aggregation rule on a ClusterRole.
pub fn full_authority() -> Vec<PolicyRule> {
    let all = || Some(vec!["*".to_string()]);
    vec![
        PolicyRule { verbs: vec!["*".into()], api_groups: all(), resources: all(), ..Default::default() },
        PolicyRule { verbs: vec!["*".into()], non_resource_urls: all(), ..Default::default() },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::rbac::tests::{rule, urls};

    #[test]
    fn owners_cover_what_they_hold() {
        let owner = vec![rule(&["get", "list"], &[""], &["pods", "*/status"]), urls(&["get"], &["/apis/*"])];
        assert!(uncovered(&owner, &[rule(&["get"], &[""], &["pods"])]).is_empty());
        assert!(uncovered(&owner, &[rule(&["list"], &[""], &["deployments/status"])]).is_empty());
        assert!(uncovered(&owner, &[urls(&["get"], &["/apis/apps"])]).is_empty());
        let missing = uncovered(&owner, &[rule(&["get", "create", "delete"], &["", "apps"], &["pods"])]);
        assert_eq!(missing.len(), 5, "{missing:?}");
        assert_eq!(uncovered(&owner, &[urls(&["get", "post"], &["/metrics"])]).len(), 2);
        // A rule limited to names does not cover all names; an unlimited one covers any.
        let named = vec![PolicyRule { resource_names: Some(vec!["a".into()]), ..rule(&["get"], &[""], &["pods"]) }];
        assert_eq!(uncovered(&named, &[rule(&["get"], &[""], &["pods"])]).len(), 1);
        let want_a =
            PolicyRule { resource_names: Some(vec!["a".into(), "b".into()]), ..rule(&["get"], &[""], &["pods"]) };
        assert_eq!(uncovered(&named, std::slice::from_ref(&want_a)).len(), 1);
        assert!(uncovered(&[rule(&["get"], &[""], &["pods"])], &[want_a]).is_empty());
        assert!(
            uncovered(&full_authority(), &[rule(&["escalate"], &["x"], &["y/z"]), urls(&["put"], &["/a"])]).is_empty()
        );
    }

    #[test]
    fn the_message_lists_compacted_missing_rules_in_order() {
        let jane = User { name: "jane".into(), uid: String::new(), groups: vec!["system:authenticated".into()] };
        let missing = uncovered(
            &[],
            &[rule(&["create", "delete"], &[""], &["pods"]), rule(&["get"], &["apps"], &["deployments"])],
        );
        assert_eq!(
            not_held_message(&jane, missing, &[]),
            "user \"jane\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n\
             {APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"create\" \"delete\"]}\n\
             {APIGroups:[\"apps\"], Resources:[\"deployments\"], Verbs:[\"get\"]}"
        );
        assert_eq!(compact_string(&urls(&["get"], &["/metrics"])), "{NonResourceURLs:[\"/metrics\"], Verbs:[\"get\"]}");
        let named = PolicyRule { resource_names: Some(vec!["a".into()]), ..rule(&["get"], &[""], &["pods"]) };
        assert_eq!(
            compact_string(&named),
            "{APIGroups:[\"\"], Resources:[\"pods\"], ResourceNames:[\"a\"], Verbs:[\"get\"]}"
        );
    }
}
