//! ControllerRevisions (`pkg/controller/history`), the template history of StatefulSets and
//! DaemonSets: each revision's `data` is the patch `{"spec":{"template":{…,"$patch":"replace"}}}`
//! that `kubectl rollout undo` applies, its name `<parent>-<hash>`, its `revision` a number
//! that grows with every new template (a template seen before gets its old revision back
//! with the next number). Pure functions, and the three writes the controllers make of them
//! (create, renumber, delete).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Resource;
use serde_json::{json, Value};

use crate::util::{compute_hash, controller_ref, creation, ignore_not_found, owner_ref};

/// The label on pods (and DaemonSet revisions) naming the revision they were made from.
pub const REVISION_HASH_LABEL: &str = "controller-revision-hash";
/// The label on StatefulSet revisions carrying their hash (`history.ControllerRevisionHashLabel`).
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";

/// The revision data of a template (`getPatch`).
pub fn patch_of(template: &PodTemplateSpec) -> Value {
    let mut t = serde_json::to_value(template).unwrap_or_else(|_| json!({}));
    if let Some(o) = t.as_object_mut() {
        o.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

/// The template a revision holds (its data without the `$patch` directive).
pub fn template_of(rev: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut t = rev.data.0.pointer("/spec/template")?.clone();
    t.as_object_mut()?.remove("$patch");
    serde_json::from_value(t).ok()
}

/// The revisions `owner` controls, oldest (lowest revision number) first.
pub fn owned<K: Resource<DynamicType = ()>>(
    owner: &K,
    all: &[Arc<ControllerRevision>],
) -> Vec<Arc<ControllerRevision>> {
    let uid = owner.meta().uid.as_deref().unwrap_or_default();
    let ns = owner.meta().namespace.as_deref();
    let mut out: Vec<Arc<ControllerRevision>> = all
        .iter()
        .filter(|r| r.metadata.namespace.as_deref() == ns)
        .filter(|r| controller_ref(&r.metadata).is_some_and(|c| c.uid == uid))
        .cloned()
        .collect();
    out.sort_by_key(|r| (r.revision.unwrap_or(0), creation(&r.metadata), r.metadata.name.clone()));
    out
}

/// Where the revision of the current template comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// An owned revision has this data; bump its number to the given one if it is not the newest.
    Existing { name: String, renumber: Option<i64> },
    /// A new revision to create.
    New(Box<ControllerRevision>),
}

/// The revision for `data` among `owned` (sorted): an equal one, or a new one named
/// `<parent>-<hash>` with the next number. `extra_labels` are added to the template's
/// labels (the hash goes in under `hash_label` too).
pub fn update_revision<K: Resource<DynamicType = ()>>(
    owner: &K,
    owned: &[Arc<ControllerRevision>],
    template: &PodTemplateSpec,
    collision_count: Option<i32>,
    hash_label: &str,
) -> Update {
    let data = patch_of(template);
    let max = owned.iter().filter_map(|r| r.revision).max().unwrap_or(0);
    if let Some(i) = owned.iter().rposition(|r| r.data.0 == data) {
        let r = &owned[i];
        let newest = i == owned.len() - 1;
        return Update::Existing {
            name: r.metadata.name.clone().unwrap_or_default(),
            renumber: (!newest).then_some(max + 1),
        };
    }
    let hash = compute_hash(data.to_string().as_bytes(), collision_count);
    let mut labels: BTreeMap<String, String> =
        template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    labels.insert(hash_label.to_string(), hash.clone());
    let parent = owner.meta().name.clone().unwrap_or_default();
    let prefix: String = parent.chars().take(223).collect();
    Update::New(Box::new(ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{prefix}-{hash}")),
            namespace: owner.meta().namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![owner_ref(owner)]),
            ..Default::default()
        },
        data: RawExtension(data),
        revision: Some(max + 1),
    }))
}

/// The part of a revision name after `<parent>-` (the hash DaemonSet pods carry).
pub fn hash_of_name<'a>(parent: &str, revision_name: &'a str) -> &'a str {
    revision_name.strip_prefix(parent).and_then(|s| s.strip_prefix('-')).unwrap_or(revision_name)
}

/// The revisions to delete (`truncateHistory` / `cleanupHistory`): the oldest of those not
/// `live`, beyond `limit`.
pub fn to_truncate(owned: &[Arc<ControllerRevision>], live: &HashSet<String>, limit: Option<i32>) -> Vec<String> {
    let limit = limit.unwrap_or(10).max(0) as usize;
    let dead: Vec<&Arc<ControllerRevision>> = owned
        .iter()
        .filter(|r| !live.contains(r.metadata.name.as_deref().unwrap_or_default()))
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .collect();
    let n = dead.len().saturating_sub(limit);
    dead.iter().take(n).filter_map(|r| r.metadata.name.clone()).collect()
}

/// Create `rev` for `parent`. `Ok(false)` when another revision already holds its name (a
/// hash collision): the parent's `status.collisionCount` has been raised; sync again.
pub async fn create<K>(
    client: &kube::Client,
    parent: &K,
    rev: &ControllerRevision,
    collision_count: Option<i32>,
) -> Result<bool, kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let ns = parent.meta().namespace.clone().unwrap_or_default();
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    match api.create(&PostParams::default(), rev).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let existing = api.get_opt(rev.metadata.name.as_deref().unwrap_or_default()).await?;
            if existing.is_some_and(|x| x.data == rev.data) {
                return Ok(true);
            }
            let parents: Api<K> = Api::namespaced(client.clone(), &ns);
            let c = collision_count.unwrap_or(0) + 1;
            let patch = json!({"status": {"collisionCount": c}});
            let name = parent.meta().name.clone().unwrap_or_default();
            parents.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Give revision `name` the number `n`.
pub async fn renumber(client: &kube::Client, ns: &str, name: &str, n: i64) -> Result<(), kube::Error> {
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    ignore_not_found(api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"revision": n}))).await)
}

/// Delete revision `name` (gone already is fine).
pub async fn delete(client: &kube::Client, ns: &str, name: &str) -> Result<(), kube::Error> {
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    ignore_not_found(api.delete(name, &DeleteParams::default()).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn rev(owner: &k8s_openapi::api::apps::v1::ReplicaSet, t: &PodTemplateSpec, n: i64) -> Arc<ControllerRevision> {
        let Update::New(mut r) = update_revision(owner, &[], t, None, HASH_LABEL) else { panic!() };
        r.revision = Some(n);
        Arc::new(*r)
    }

    #[test]
    fn data_round_trips_and_names_carry_the_hash() {
        let owner = rs("web", 1, &[("app", "web")]);
        let t = template(&[("app", "web")], "nginx");
        let r = rev(&owner, &t, 1);
        assert_eq!(r.data.0.pointer("/spec/template/$patch"), Some(&json!("replace")));
        assert_eq!(template_of(&r), Some(t.clone()));
        let name = r.metadata.name.clone().unwrap();
        assert_eq!(r.metadata.labels.as_ref().unwrap()[HASH_LABEL], hash_of_name("web", &name));
        assert_eq!(controller_ref(&r.metadata).map(|o| o.kind.as_str()), Some("ReplicaSet"));
    }

    #[test]
    fn an_old_template_gets_its_revision_back_with_the_next_number() {
        let owner = rs("web", 1, &[("app", "web")]);
        let (a, b) = (template(&[("app", "web")], "nginx:1"), template(&[("app", "web")], "nginx:2"));
        let owned = vec![rev(&owner, &a, 1), rev(&owner, &b, 2)];
        let a_name = owned[0].metadata.name.clone().unwrap();
        assert_eq!(
            update_revision(&owner, &owned, &a, None, HASH_LABEL),
            Update::Existing { name: a_name, renumber: Some(3) }
        );
        assert!(matches!(
            update_revision(&owner, &owned, &b, None, HASH_LABEL),
            Update::Existing { renumber: None, .. }
        ));
        let Update::New(c) = update_revision(&owner, &owned, &template(&[("app", "web")], "nginx:3"), None, HASH_LABEL)
        else {
            panic!()
        };
        assert_eq!(c.revision, Some(3));
    }

    #[test]
    fn history_keeps_live_revisions_and_the_newest_dead_ones() {
        let owner = rs("web", 1, &[("app", "web")]);
        let owned: Vec<_> = (1..=5).map(|i| rev(&owner, &template(&[("app", "web")], &format!("i:{i}")), i)).collect();
        let name = |i: usize| owned[i].metadata.name.clone().unwrap();
        let live: HashSet<String> = [name(0), name(4)].into();
        assert_eq!(to_truncate(&owned, &live, Some(1)), vec![name(1), name(2)]);
        assert!(to_truncate(&owned, &live, Some(10)).is_empty());
    }
}
