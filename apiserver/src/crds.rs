//! Keeps the served custom resources in step with the stored CustomResourceDefinitions: a
//! loop that lists CRDs a few times a second (so every apiserver over a shared etcd
//! converges), swaps the set of custom resources, and deletes the objects of CRDs that went
//! away.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::registry::generic::{prefix_of, ListOptions, Registry};
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
        let terminating = crd.pointer("/metadata/deletionTimestamp").is_some();
        let defs = if terminating { vec![] } else { crate::registry::crd::resource_defs(crd) };
        served.insert(uid, (rv, defs));
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
