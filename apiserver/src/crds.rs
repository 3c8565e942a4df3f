//! Keeps the served custom resources in step with the stored CustomResourceDefinitions: a
//! loop that lists CRDs a few times a second (so every apiserver over a shared etcd
//! converges) and swaps the set of custom resources.
//!
//! It is also Kubernetes' CRD finalizer: deleting a CRD marks it (`Terminating`, finalizer
//! `customresourcecleanup.apiextensions.k8s.io`); while it is marked its objects stay
//! served — reads, updates, deletes, but no creates — and are deleted through the normal
//! delete path, so their own finalizers run and watchers (the garbage collector) see each
//! deletion. Once none is left the finalizer goes and the CRD with it. A CRD that vanished
//! without the finalizer (stored by an older version) has its objects removed directly.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::registry::crd::{set_condition, CLEANUP_FINALIZER};
use crate::registry::generic::{prefix_of, DeleteOptions, Intent, ListOptions, Registry, UpdateKind, WriteOptions};
use crate::resources::{self, ResourceDef};

/// How often the CRDs are re-read.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(200);

/// One CRD's served definitions, by uid, and the resourceVersion they were built from.
type Served = HashMap<String, (String, Vec<&'static ResourceDef>)>;

/// Start the loop.
pub fn spawn(registry: Arc<Registry>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut served: Served = HashMap::new();
        loop {
            if let Err(e) = sync_once(&registry, &mut served).await {
                tracing::debug!(error = %e.message, "CRD sync failed; retrying");
            }
            tokio::time::sleep(SYNC_INTERVAL).await;
        }
    })
}

/// One pass: read the CRDs, rebuild what changed, clean up what was removed.
pub async fn sync_once(registry: &Registry, served: &mut Served) -> Result<(), crate::error::ApiError> {
    let Some(crd_res) = resources::find("apiextensions.k8s.io", "v1", "customresourcedefinitions") else {
        return Ok(());
    };
    let list = registry.list(crd_res, None, &ListOptions::default()).await?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let mut changed = false;
    let mut seen = Vec::new();
    for crd in &items {
        let uid = crd.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_string();
        let rv = crd.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string();
        seen.push(uid.clone());
        if served.get(&uid).is_some_and(|(r, _)| *r == rv) {
            continue;
        }
        served.insert(uid, (rv, crate::registry::crd::resource_defs(crd)));
        changed = true;
    }
    let gone: Vec<String> = served.keys().filter(|u| !seen.contains(u)).cloned().collect();
    for uid in gone {
        if let Some((_, defs)) = served.remove(&uid) {
            changed = true;
            // Deleting a CRD deletes its objects (all versions share one storage prefix).
            if let Some(d) = defs.first() {
                delete_all(registry, d).await?;
            }
        }
    }
    if changed {
        let mut all: Vec<&'static ResourceDef> = served.values().flat_map(|(_, d)| d.iter().copied()).collect();
        all.sort_by_key(|d| (d.group, d.plural, d.version));
        resources::set_custom(all);
        tracing::info!(crds = served.len(), "custom resources updated");
    }
    // Clean-up of marked CRDs, once the served set says they are terminating.
    for crd in &items {
        let uid = crd.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
        if let Some((_, defs)) = served.get(uid) {
            if let Some(res) = defs.first() {
                finalize(registry, crd_res, crd, res).await?;
            }
        }
    }
    Ok(())
}

/// One step of a marked CRD's clean-up: delete its remaining objects, or, once none is
/// left, report it and remove the finalizer (which deletes the CRD).
async fn finalize(
    registry: &Registry,
    crd_res: &ResourceDef,
    crd: &Value,
    res: &ResourceDef,
) -> Result<(), crate::error::ApiError> {
    let fins = crd.pointer("/metadata/finalizers").and_then(Value::as_array);
    let marked = crd.pointer("/metadata/deletionTimestamp").is_some();
    if !marked || !fins.is_some_and(|f| f.iter().any(|x| x == CLEANUP_FINALIZER)) {
        return Ok(());
    }
    let name = crd.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let list = registry.list(res, None, &ListOptions::default()).await?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    for o in items.iter().filter(|o| o.pointer("/metadata/deletionTimestamp").is_none()) {
        let ns = o.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        let n = o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        match registry.delete(res, ns, n, &DeleteOptions::default()).await {
            Ok(_) => {}
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let done = items.is_empty();
    let (reason, message) = if done {
        ("InstanceDeletionCompleted", "removed all instances")
    } else {
        ("InstanceDeletionInProgress", "CustomResource deletion is in progress")
    };
    let outcome = registry
        .guaranteed_update(crd_res, "", name, UpdateKind::Internal, &WriteOptions::default(), |cur| {
            let Some(cur) = cur else { return Ok(None) };
            let mut next = cur.clone();
            if next.pointer("/metadata/uid") != crd.pointer("/metadata/uid") {
                return Ok(None);
            }
            set_condition(&mut next, "Terminating", if done { "False" } else { "True" }, reason, message);
            if done {
                if let Some(f) = next.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
                    f.retain(|x| x != CLEANUP_FINALIZER);
                }
            }
            Ok(Some(Intent { object: next, precondition: None }))
        })
        .await;
    match outcome {
        Ok(_) => {}
        Err(e) if e.code == 404 => {}
        Err(e) => return Err(e),
    }
    if done {
        tracing::info!(crd = name, "custom resources deleted; CRD finalized");
    }
    Ok(())
}

async fn delete_all(registry: &Registry, res: &ResourceDef) -> Result<(), crate::error::ApiError> {
    let prefix = prefix_of(res, None);
    let kvs = registry.store.range(storage::Range::prefix(prefix.clone())).await?.kvs;
    for kv in kvs {
        match registry.store.delete(&kv.key, None).await {
            Ok(_) | Err(storage::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    tracing::info!(prefix, "deleted the objects of a removed CRD");
    Ok(())
}
