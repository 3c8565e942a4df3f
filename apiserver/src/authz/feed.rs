//! Keeps the authorizers' state current from the apiserver's own store, so no decision reads
//! storage: one list + watch per RBAC kind feeds the stored objects, and a rebuilder swaps in
//! a fresh [`Index`](super::rbac::Index) after each burst of changes; with the Node
//! authorizer on, one list + watch of pods feeds its graph. A watch that fails (compaction,
//! storage restart) lists again and carries on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use storage::{EventKind, Range, Store};
use tokio::sync::Notify;

use super::rbac::{Index, Objects, GROUP};
use super::{Authorizer, Mode};
use crate::registry::generic::prefix_of;
use crate::resources;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Role,
    ClusterRole,
    RoleBinding,
    ClusterRoleBinding,
}

const KINDS: [(Kind, &str); 4] = [
    (Kind::Role, "roles"),
    (Kind::ClusterRole, "clusterroles"),
    (Kind::RoleBinding, "rolebindings"),
    (Kind::ClusterRoleBinding, "clusterrolebindings"),
];

/// `<ns>/<name>` or `<name>` after the prefix.
fn key_parts(rest: &str) -> (String, String) {
    match rest.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name.to_string()),
        None => (String::new(), rest.to_string()),
    }
}

/// Put (Some) or remove (None) one stored object.
fn apply(objs: &mut Objects, kind: Kind, rest: &str, value: Option<&[u8]>) {
    let (ns, name) = key_parts(rest);
    macro_rules! set {
        ($map:expr, $key:expr) => {
            match value.map(serde_json::from_slice) {
                Some(Ok(v)) => {
                    $map.insert($key, v);
                }
                Some(Err(e)) => tracing::warn!(key = rest, error = %e, "undecodable RBAC object ignored"),
                None => {
                    $map.remove(&$key);
                }
            }
        };
    }
    match kind {
        Kind::Role => set!(objs.roles, (ns, name)),
        Kind::ClusterRole => set!(objs.cluster_roles, name),
        Kind::RoleBinding => set!(objs.role_bindings, (ns, name)),
        Kind::ClusterRoleBinding => set!(objs.cluster_role_bindings, name),
    }
}

/// List everything once (the index is complete when this returns), then follow the
/// watches in the background.
pub async fn start(authz: Arc<Authorizer>, store: Arc<dyn Store>) -> storage::Result<()> {
    let objects = Arc::new(Mutex::new(Objects::default()));
    let changed = Arc::new(Notify::new());
    let mut revisions = Vec::new();
    for (kind, plural) in KINDS {
        let Some(res) = resources::find(GROUP, "v1", plural) else { continue };
        let prefix = prefix_of(res, None);
        let list = store.range(Range::prefix(&prefix)).await?;
        {
            let mut objs = objects.lock().unwrap_or_else(|p| p.into_inner());
            for kv in &list.kvs {
                apply(&mut objs, kind, &kv.key[prefix.len()..], Some(&kv.value));
            }
        }
        revisions.push((kind, prefix, list.revision));
    }
    authz.rbac.set(Index::build(&objects.lock().unwrap_or_else(|p| p.into_inner())));
    for (kind, prefix, revision) in revisions {
        tokio::spawn(follow(store.clone(), kind, prefix, revision, objects.clone(), changed.clone()));
    }
    let rbac = authz.rbac.clone();
    tokio::spawn(async move {
        loop {
            changed.notified().await;
            let index = Index::build(&objects.lock().unwrap_or_else(|p| p.into_inner()));
            rbac.set(index);
        }
    });
    if authz.uses(Mode::Node) {
        if let Some(pods) = resources::find("", "v1", "pods") {
            let prefix = prefix_of(pods, None);
            let list = store.range(Range::prefix(&prefix)).await?;
            for kv in &list.kvs {
                set_pod(&authz, &kv.key[prefix.len()..], Some(&kv.value));
            }
            tokio::spawn(follow_pods(authz.clone(), store, prefix, list.revision));
        }
    }
    Ok(())
}

async fn follow(
    store: Arc<dyn Store>,
    kind: Kind,
    prefix: String,
    mut revision: storage::Revision,
    objects: Arc<Mutex<Objects>>,
    changed: Arc<Notify>,
) {
    loop {
        match store.watch(&prefix, revision).await {
            Ok(mut stream) => {
                while let Some(ev) = stream.next().await {
                    let ev = match ev {
                        Ok(ev) => ev,
                        Err(e) => {
                            tracing::debug!(prefix, error = %e, "RBAC watch ended");
                            break;
                        }
                    };
                    revision = revision.max(ev.revision());
                    let rest = &ev.kv.key[prefix.len().min(ev.kv.key.len())..];
                    let value = (ev.kind == EventKind::Put).then_some(&ev.kv.value[..]);
                    apply(&mut objects.lock().unwrap_or_else(|p| p.into_inner()), kind, rest, value);
                    changed.notify_one();
                }
            }
            Err(e) => tracing::debug!(prefix, error = %e, "RBAC watch failed"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Start over from a fresh list: the watch may have missed compacted history.
        match store.range(Range::prefix(&prefix)).await {
            Ok(list) => {
                let mut objs = objects.lock().unwrap_or_else(|p| p.into_inner());
                let mut fresh = Objects::default();
                for kv in &list.kvs {
                    apply(&mut fresh, kind, &kv.key[prefix.len()..], Some(&kv.value));
                }
                match kind {
                    Kind::Role => objs.roles = fresh.roles,
                    Kind::ClusterRole => objs.cluster_roles = fresh.cluster_roles,
                    Kind::RoleBinding => objs.role_bindings = fresh.role_bindings,
                    Kind::ClusterRoleBinding => objs.cluster_role_bindings = fresh.cluster_role_bindings,
                }
                revision = list.revision;
                changed.notify_one();
            }
            Err(e) => tracing::debug!(prefix, error = %e, "RBAC relist failed"),
        }
    }
}

fn set_pod(authz: &Authorizer, rest: &str, value: Option<&[u8]>) {
    let (ns, name) = key_parts(rest);
    let pod: Option<Value> = value.and_then(|v| serde_json::from_slice(v).ok());
    authz.node.set_pod(&ns, &name, pod.as_ref());
}

async fn follow_pods(authz: Arc<Authorizer>, store: Arc<dyn Store>, prefix: String, mut revision: storage::Revision) {
    loop {
        if let Ok(mut stream) = store.watch(&prefix, revision).await {
            while let Some(Ok(ev)) = stream.next().await {
                revision = revision.max(ev.revision());
                let rest = &ev.kv.key[prefix.len().min(ev.kv.key.len())..];
                set_pod(&authz, rest, (ev.kind == EventKind::Put).then_some(&ev.kv.value[..]));
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(list) = store.range(Range::prefix(&prefix)).await {
            authz.node.clear();
            for kv in &list.kvs {
                set_pod(&authz, &kv.key[prefix.len()..], Some(&kv.value));
            }
            revision = list.revision;
        }
    }
}
