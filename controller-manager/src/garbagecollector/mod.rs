//! The garbage collector (`pkg/controller/garbagecollector`): watches every served
//! resource that can be listed, watched and deleted (found through discovery), keeps
//! the ownerReferences graph, and
//! - deletes dependents whose owners are all gone (background cascading deletion; an
//!   owner's absence is confirmed with a live GET first, as Kubernetes does);
//! - for an owner being deleted with the `foregroundDeletion` finalizer, deletes its
//!   dependents and removes the finalizer once no dependent with
//!   `blockOwnerDeletion: true` remains;
//! - for an owner being deleted with the `orphan` finalizer, removes the owner's
//!   reference from every dependent, then the finalizer;
//! - drops references to gone owners from dependents that still have live owners.
//!
//! The apiserver sets those finalizers from `DeleteOptions.propagationPolicy` (what
//! `kubectl delete --cascade=foreground|orphan` sends). [`plan`] is the decision over a
//! snapshot of the graph (pure); [`run`] watches and applies it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::discovery::{verbs, ApiResource, Discovery, Scope};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;

/// One object in the graph.
#[derive(Debug, Clone)]
pub struct Node {
    /// Index of its resource (into the caller's table).
    pub resource: usize,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub resource_version: Option<String>,
    pub owners: Vec<OwnerReference>,
    pub deleting: bool,
    pub finalizers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum GcAction {
    /// Delete `uid` (resource, namespace, name) with a propagation policy; when
    /// `confirm_absent` is non-empty, only after a live read confirms those owners are gone.
    Delete { node: usize, policy: &'static str, confirm_absent: Vec<OwnerReference> },
    /// Remove the references to these owner uids from the node.
    RemoveOwnerRefs { node: usize, owner_uids: Vec<String> },
    /// Remove a finalizer from the node.
    RemoveFinalizer { node: usize, finalizer: &'static str },
}

pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";

/// The decision over a snapshot of all objects.
pub fn plan(nodes: &[Node]) -> Vec<GcAction> {
    let by_uid: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.uid.as_str(), i)).collect();
    let mut dependents: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in &n.owners {
            dependents.entry(o.uid.as_str()).or_default().push(i);
        }
    }
    let mut actions = Vec::new();
    let mut deleting_now: HashSet<usize> = HashSet::new();
    let has_fin = |n: &Node, f: &str| n.finalizers.iter().any(|x| x == f);

    // Owners being deleted.
    for (i, n) in nodes.iter().enumerate() {
        if !n.deleting {
            continue;
        }
        let deps = dependents.get(n.uid.as_str()).cloned().unwrap_or_default();
        if has_fin(n, ORPHAN) {
            for &d in &deps {
                actions.push(GcAction::RemoveOwnerRefs { node: d, owner_uids: vec![n.uid.clone()] });
            }
            actions.push(GcAction::RemoveFinalizer { node: i, finalizer: ORPHAN });
        } else if has_fin(n, FOREGROUND) {
            let mut blocking = 0;
            for &d in &deps {
                let dep = &nodes[d];
                let blocks = dep.owners.iter().any(|o| o.uid == n.uid && o.block_owner_deletion == Some(true));
                if blocks {
                    blocking += 1;
                }
                if !dep.deleting && deleting_now.insert(d) {
                    let policy = if dependents.get(dep.uid.as_str()).is_some_and(|v| !v.is_empty()) {
                        "Foreground"
                    } else {
                        "Background"
                    };
                    actions.push(GcAction::Delete { node: d, policy, confirm_absent: Vec::new() });
                }
            }
            if blocking == 0 {
                actions.push(GcAction::RemoveFinalizer { node: i, finalizer: FOREGROUND });
            }
        }
    }

    // Dependents with gone owners.
    for (i, n) in nodes.iter().enumerate() {
        if n.owners.is_empty() || n.deleting || deleting_now.contains(&i) {
            continue;
        }
        let mut solid = Vec::new();
        let mut dangling = Vec::new();
        let mut waiting = Vec::new();
        for o in &n.owners {
            match by_uid.get(o.uid.as_str()).map(|&j| &nodes[j]) {
                None => dangling.push(o.clone()),
                Some(owner) if owner.deleting && has_fin(owner, FOREGROUND) => waiting.push(o.clone()),
                Some(_) => solid.push(o.clone()),
            }
        }
        if !solid.is_empty() {
            if !dangling.is_empty() {
                actions.push(GcAction::RemoveOwnerRefs {
                    node: i,
                    owner_uids: dangling.iter().map(|o| o.uid.clone()).collect(),
                });
            }
            continue;
        }
        if !waiting.is_empty() {
            // Handled by the owner's foreground pass above.
            continue;
        }
        let policy = if has_fin(n, ORPHAN) {
            "Orphan"
        } else if has_fin(n, FOREGROUND) {
            "Foreground"
        } else {
            "Background"
        };
        actions.push(GcAction::Delete { node: i, policy, confirm_absent: dangling });
    }
    actions
}

struct Monitor {
    ar: ApiResource,
    namespaced: bool,
    store: Store<DynamicObject>,
}

fn snapshot(monitors: &[Monitor]) -> Vec<Node> {
    let mut nodes = Vec::new();
    for (i, m) in monitors.iter().enumerate() {
        for o in m.store.state() {
            nodes.push(Node {
                resource: i,
                namespace: o.metadata.namespace.clone(),
                name: o.metadata.name.clone().unwrap_or_default(),
                uid: o.metadata.uid.clone().unwrap_or_default(),
                resource_version: o.metadata.resource_version.clone(),
                owners: o.metadata.owner_references.clone().unwrap_or_default(),
                deleting: o.metadata.deletion_timestamp.is_some(),
                finalizers: o.metadata.finalizers.clone().unwrap_or_default(),
            });
        }
    }
    nodes
}

fn api_for(client: &kube::Client, m: &Monitor, ns: Option<&str>) -> Api<DynamicObject> {
    match (m.namespaced, ns) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &m.ar),
        _ => Api::all_with(client.clone(), &m.ar),
    }
}

/// Is the owner really gone (live read: 404, or another object under that name)?
async fn owner_absent(client: &kube::Client, monitors: &[Monitor], ns: Option<&str>, o: &OwnerReference) -> bool {
    let Some(m) = monitors.iter().find(|m| m.ar.api_version == o.api_version && m.ar.kind == o.kind) else {
        // An owner kind nobody serves: it cannot exist.
        return true;
    };
    match api_for(client, m, ns).get_opt(&o.name).await {
        Ok(None) => true,
        Ok(Some(obj)) => obj.metadata.uid.as_deref() != Some(&o.uid),
        Err(_) => false,
    }
}

async fn apply(
    client: &kube::Client,
    monitors: &[Monitor],
    nodes: &[Node],
    action: &GcAction,
) -> Result<(), kube::Error> {
    let pp = PatchParams::default();
    match action {
        GcAction::Delete { node, policy, confirm_absent } => {
            let n = &nodes[*node];
            for o in confirm_absent {
                if !owner_absent(client, monitors, n.namespace.as_deref(), o).await {
                    return Ok(());
                }
            }
            let dp = DeleteParams {
                propagation_policy: Some(match *policy {
                    "Foreground" => PropagationPolicy::Foreground,
                    "Orphan" => PropagationPolicy::Orphan,
                    _ => PropagationPolicy::Background,
                }),
                preconditions: Some(Preconditions { uid: Some(n.uid.clone()), resource_version: None }),
                ..Default::default()
            };
            tracing::info!(kind = %monitors[n.resource].ar.kind, name = %n.name, namespace = ?n.namespace, policy, "garbage collecting");
            api_for(client, &monitors[n.resource], n.namespace.as_deref()).delete(&n.name, &dp).await.map(|_| ())
        }
        GcAction::RemoveOwnerRefs { node, owner_uids } => {
            let n = &nodes[*node];
            let refs: Vec<&OwnerReference> = n.owners.iter().filter(|o| !owner_uids.contains(&o.uid)).collect();
            let patch =
                json!({"metadata": {"ownerReferences": refs, "resourceVersion": n.resource_version, "uid": n.uid}});
            api_for(client, &monitors[n.resource], n.namespace.as_deref())
                .patch(&n.name, &pp, &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
        GcAction::RemoveFinalizer { node, finalizer } => {
            let n = &nodes[*node];
            let fins: Vec<&String> = n.finalizers.iter().filter(|f| f != finalizer).collect();
            let patch = json!({"metadata": {"finalizers": fins, "resourceVersion": n.resource_version, "uid": n.uid}});
            api_for(client, &monitors[n.resource], n.namespace.as_deref())
                .patch(&n.name, &pp, &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
    }
}

/// The resources the collector monitors: everything served that supports list, watch,
/// delete and patch (except events, which never own anything and are many).
async fn discover(client: &kube::Client) -> anyhow::Result<Vec<(ApiResource, bool)>> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut out = Vec::new();
    for group in discovery.groups() {
        for (ar, caps) in group.recommended_resources() {
            let ok =
                [verbs::LIST, verbs::WATCH, verbs::DELETE, verbs::PATCH].iter().all(|v| caps.supports_operation(v));
            if ok && ar.plural != "events" && !ar.plural.contains('/') {
                out.push((ar, caps.scope == Scope::Namespaced));
            }
        }
    }
    Ok(out)
}

pub async fn run(client: kube::Client) {
    let resources = loop {
        match discover(&client).await {
            Ok(r) => break r,
            Err(e) => {
                tracing::warn!(error = %e, "garbage collector discovery failed; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let notify = Arc::new(tokio::sync::Notify::new());
    let mut monitors = Vec::new();
    for (ar, namespaced) in resources {
        let writer = reflector::store::Writer::new(ar.clone());
        let store = writer.as_reader();
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let n = notify.clone();
        tokio::spawn(async move {
            let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
            stream
                .for_each(|_| {
                    n.notify_one();
                    async {}
                })
                .await;
        });
        monitors.push(Monitor { ar, namespaced, store });
    }
    for m in &monitors {
        let _ = m.store.wait_until_ready().await;
    }
    tracing::info!(resources = monitors.len(), "garbage collector synced");
    loop {
        let _ = tokio::time::timeout(Duration::from_secs(10), notify.notified()).await;
        // Let a burst of events settle.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let nodes = snapshot(&monitors);
        let actions = plan(&nodes);
        let mut results = Vec::new();
        for a in &actions {
            results.push(apply(&client, &monitors, &nodes, a).await);
        }
        for r in results {
            crate::metrics::sync("garbagecollector", r.is_ok());
            match r {
                Ok(()) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => tracing::warn!(error = %e, "garbage collector action failed"),
            }
        }
        if !actions.is_empty() {
            // Progress was made; look again soon even without events.
            notify.notify_one();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(uid: &str, owners: &[(&str, bool)]) -> Node {
        Node {
            resource: 0,
            namespace: Some("default".into()),
            name: uid.into(),
            uid: uid.into(),
            resource_version: Some("1".into()),
            owners: owners
                .iter()
                .map(|(o, block)| OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "ReplicaSet".into(),
                    name: o.to_string(),
                    uid: o.to_string(),
                    controller: Some(true),
                    block_owner_deletion: Some(*block),
                })
                .collect(),
            deleting: false,
            finalizers: vec![],
        }
    }

    #[test]
    fn dependents_of_gone_owners_are_deleted_in_background() {
        let nodes = vec![node("pod", &[("rs", true)])];
        assert_eq!(
            plan(&nodes),
            vec![GcAction::Delete { node: 0, policy: "Background", confirm_absent: nodes[0].owners.clone() }]
        );
        let with_owner = vec![node("pod", &[("rs", true)]), node("rs", &[])];
        assert!(plan(&with_owner).is_empty());
    }

    #[test]
    fn orphan_finalizer_releases_dependents_then_goes() {
        let mut rs = node("rs", &[]);
        rs.deleting = true;
        rs.finalizers = vec![ORPHAN.into()];
        let nodes = vec![node("pod", &[("rs", true)]), rs];
        assert_eq!(
            plan(&nodes),
            vec![
                GcAction::RemoveOwnerRefs { node: 0, owner_uids: vec!["rs".into()] },
                GcAction::RemoveFinalizer { node: 1, finalizer: ORPHAN }
            ]
        );
    }

    #[test]
    fn foreground_deletes_dependents_and_waits_for_blocking_ones() {
        let mut d = node("deploy", &[]);
        d.deleting = true;
        d.finalizers = vec![FOREGROUND.into()];
        let rs = node("rs", &[("deploy", true)]);
        let pod = node("pod", &[("rs", true)]);
        let nodes = vec![d.clone(), rs, pod];
        // The ReplicaSet has dependents: deleted in the foreground too; owner waits.
        assert_eq!(plan(&nodes), vec![GcAction::Delete { node: 1, policy: "Foreground", confirm_absent: vec![] }]);
        // Once the blocking dependent is gone the finalizer is removed.
        assert_eq!(plan(&[d.clone()]), vec![GcAction::RemoveFinalizer { node: 0, finalizer: FOREGROUND }]);
        // A non-blocking dependent does not hold the owner.
        let loose = node("cm", &[("deploy", false)]);
        let acts = plan(&[d, loose]);
        assert!(acts.contains(&GcAction::RemoveFinalizer { node: 0, finalizer: FOREGROUND }));
        assert!(acts.contains(&GcAction::Delete { node: 1, policy: "Background", confirm_absent: vec![] }));
    }

    #[test]
    fn dangling_refs_are_dropped_when_another_owner_lives() {
        let nodes = vec![node("pod", &[("gone", false), ("rs", true)]), node("rs", &[])];
        assert_eq!(plan(&nodes), vec![GcAction::RemoveOwnerRefs { node: 0, owner_uids: vec!["gone".into()] }]);
    }
}
