//! The ClusterRole aggregation controller (`clusterrole-aggregation`): a ClusterRole with an
//! `aggregationRule` gets as its rules the union of the rules of every other ClusterRole
//! its `clusterRoleSelectors` select — selectors in order, the roles of each by name,
//! each rule once — so `admin`, `edit` and `view` grow when a role labelled
//! `rbac.authorization.k8s.io/aggregate-to-<name>: "true"` appears. Any ClusterRole change
//! re-checks every aggregated role.
//!
//! [`aggregate`] is the decision (pure); [`reconcile`] reads the ClusterRoles (a list, not
//! the cache: the change that triggered it may not have reached the cache yet) and writes
//! the rules when they differ.

use std::sync::Arc;
use std::time::Duration;

use apimachinery::labels::Selector;
use futures::StreamExt;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;

use crate::Error;

/// The rules `target` should have given every ClusterRole (None: it aggregates nothing, or
/// already has them). A selector that cannot be read is an error, as upstream's.
pub fn aggregate(target: &ClusterRole, all: &[Arc<ClusterRole>]) -> Result<Option<Vec<PolicyRule>>, String> {
    let Some(rule) = &target.aggregation_rule else { return Ok(None) };
    let name = target.metadata.name.as_deref().unwrap_or_default();
    let mut sorted: Vec<&ClusterRole> = all.iter().map(|r| &**r).collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut rules: Vec<PolicyRule> = Vec::new();
    for sel in rule.cluster_role_selectors.iter().flatten() {
        let selector = Selector::from_label_selector(sel).map_err(|e| e.0)?;
        for role in &sorted {
            if role.metadata.name.as_deref() == Some(name) {
                continue;
            }
            if !selector.matches(&role.metadata.labels.clone().unwrap_or_default()) {
                continue;
            }
            for r in role.rules.iter().flatten() {
                if !rules.contains(r) {
                    rules.push(r.clone());
                }
            }
        }
    }
    let current = target.rules.clone().unwrap_or_default();
    Ok((rules != current).then_some(rules))
}

struct Ctx {
    client: kube::Client,
}

async fn reconcile(role: Arc<ClusterRole>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if role.aggregation_rule.is_none() {
        return Ok(Action::await_change());
    }
    let api: Api<ClusterRole> = Api::all(ctx.client.clone());
    let all: Vec<Arc<ClusterRole>> = api.list(&Default::default()).await?.items.into_iter().map(Arc::new).collect();
    let name = role.metadata.name.clone().unwrap_or_default();
    let Some(current) = all.iter().find(|r| r.metadata.name.as_deref() == Some(&name)) else {
        return Ok(Action::await_change());
    };
    let Some(rules) = aggregate(current, &all).map_err(Error::Other)? else {
        return Ok(Action::await_change());
    };
    let patch = json!({"rules": rules});
    match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => tracing::info!(cluster_role = %name, rules = rules.len(), "aggregated cluster role rules"),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

/// Run until the watch streams end.
pub async fn run(client: kube::Client) {
    let api = Api::<ClusterRole>::all(client.clone());
    let controller = Controller::new(api.clone(), watcher::Config::default());
    let roles = controller.store();
    let ctx = Arc::new(Ctx { client });
    // Any ClusterRole change may change what an aggregated one selects.
    controller
        .watches(api, watcher::Config::default(), move |_changed| {
            roles
                .state()
                .iter()
                .filter(|r| r.aggregation_rule.is_some())
                .map(|r| ObjectRef::from_obj(&**r))
                .collect::<Vec<_>>()
        })
        .run(
            reconcile,
            |_r, e, _| {
                tracing::warn!(error = %e, "cluster role aggregation failed");
                Action::requeue(Duration::from_secs(2))
            },
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::AggregationRule;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
    use std::collections::BTreeMap;

    fn rule(verb: &str, resource: &str) -> PolicyRule {
        PolicyRule {
            verbs: vec![verb.into()],
            api_groups: Some(vec!["".into()]),
            resources: Some(vec![resource.into()]),
            ..Default::default()
        }
    }

    fn role(name: &str, labels: &[(&str, &str)], rules: Vec<PolicyRule>) -> Arc<ClusterRole> {
        let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Arc::new(ClusterRole {
            metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels), ..Default::default() },
            rules: Some(rules),
            aggregation_rule: None,
        })
    }

    fn aggregated(name: &str, selectors: Vec<LabelSelector>) -> ClusterRole {
        ClusterRole {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            rules: None,
            aggregation_rule: Some(AggregationRule { cluster_role_selectors: Some(selectors) }),
        }
    }

    fn labels(k: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([(k.to_string(), "true".to_string())])),
            ..Default::default()
        }
    }

    #[test]
    fn the_union_of_selected_roles_by_selector_then_name_each_rule_once() {
        let all = vec![
            role("b-extra", &[("to-view", "true")], vec![rule("get", "pods"), rule("list", "pods")]),
            role("a-base", &[("to-view", "true")], vec![rule("get", "pods")]),
            role("other", &[], vec![rule("delete", "pods")]),
            role("edit-more", &[("to-edit", "true")], vec![rule("create", "pods")]),
        ];
        let view = aggregated("view", vec![labels("to-view"), labels("to-edit")]);
        let rules = aggregate(&view, &all).unwrap().unwrap();
        assert_eq!(rules, [rule("get", "pods"), rule("list", "pods"), rule("create", "pods")]);
        let mut done = view.clone();
        done.rules = Some(rules);
        assert_eq!(aggregate(&done, &all).unwrap(), None, "nothing to write when up to date");
        assert_eq!(aggregate(&role("plain", &[], vec![]), &all).unwrap(), None);
    }

    #[test]
    fn a_role_never_aggregates_itself_and_selectors_can_be_expressions() {
        let selector = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["x".into()]),
            }]),
            ..Default::default()
        };
        let mut me = aggregated("me", vec![selector]);
        me.metadata.labels = Some(BTreeMap::from([("tier".into(), "x".into())]));
        let all = vec![Arc::new(me.clone()), role("r", &[("tier", "x")], vec![rule("get", "pods")])];
        assert_eq!(aggregate(&me, &all).unwrap().unwrap(), [rule("get", "pods")]);
        let bad = aggregated(
            "bad",
            vec![LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "k".into(),
                    operator: "Near".into(),
                    values: None,
                }]),
                ..Default::default()
            }],
        );
        assert!(aggregate(&bad, &all).is_err());
        // Selected roles gone: the aggregated role is emptied.
        let mut stale = aggregated("v", vec![labels("to-view")]);
        stale.rules = Some(vec![rule("get", "pods")]);
        assert_eq!(aggregate(&stale, &[]).unwrap(), Some(vec![]));
    }
}
