//! Writes the bootstrap policy at start ([`super::policy`] decides what changes): missing
//! ClusterRoles and ClusterRoleBindings are created, stored ones get what they lack, and
//! nothing users added is removed. Every apiserver of a cluster does it; a create that
//! another one made first is fine.

use std::collections::HashMap;

use futures::future::join_all;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::policy::{self, BindingChange};
use super::rbac::GROUP;
use crate::error::{ApiError, ApiResult};
use crate::registry::generic::{DeleteOptions, ListOptions, Registry, UpdateKind, WriteOptions};
use crate::resources::{self, ResourceDef};

fn resource(plural: &str) -> ApiResult<&'static ResourceDef> {
    resources::find(GROUP, "v1", plural).ok_or_else(|| ApiError::internal(format!("no {plural} resource")))
}

async fn stored<T: DeserializeOwned>(reg: &Registry, res: &ResourceDef) -> ApiResult<HashMap<String, T>> {
    let list = reg.list(res, None, &ListOptions::default()).await?;
    let mut out = HashMap::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let name = item.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        match serde_json::from_value(item.clone()) {
            Ok(v) => {
                out.insert(name, v);
            }
            Err(e) => tracing::warn!(name, error = %e, "stored {} undecodable; left alone", res.kind),
        }
    }
    Ok(out)
}

fn body<T: serde::Serialize>(obj: &T, kind: &str) -> Value {
    let mut v = serde_json::to_value(obj).unwrap_or_default();
    v["apiVersion"] = format!("{GROUP}/v1").into();
    v["kind"] = kind.into();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    v
}

async fn write(reg: &Registry, res: &ResourceDef, name: &str, obj: Value, create: bool) -> ApiResult<()> {
    let opts = WriteOptions::default();
    let out = if create {
        reg.create(res, "", obj, &opts).await.map(|_| ())
    } else {
        reg.update(res, "", name, obj, UpdateKind::Main, &opts).await.map(|_| ())
    };
    match out {
        Ok(()) => {
            tracing::debug!(kind = res.kind, name, created = create, "reconciled bootstrap RBAC policy");
            Ok(())
        }
        Err(e) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Reconcile every bootstrap ClusterRole and ClusterRoleBinding.
pub async fn reconcile(reg: &Registry) -> ApiResult<()> {
    let roles_res = resource("clusterroles")?;
    let bindings_res = resource("clusterrolebindings")?;
    let roles: HashMap<String, ClusterRole> = stored(reg, roles_res).await?;
    let mut writes = Vec::new();
    for expected in policy::cluster_roles() {
        let name = expected.metadata.name.clone().unwrap_or_default();
        let existing = roles.get(&name);
        if let Some(obj) = policy::reconcile_role(&expected, existing) {
            let create = existing.is_none();
            writes.push(async move { write(reg, roles_res, &name, body(&obj, "ClusterRole"), create).await });
        }
    }
    let writes = join_all(writes).await;
    let bindings: HashMap<String, ClusterRoleBinding> = stored(reg, bindings_res).await?;
    let mut binding_writes = Vec::new();
    for expected in policy::cluster_role_bindings() {
        let name = expected.metadata.name.clone().unwrap_or_default();
        match policy::reconcile_binding(&expected, bindings.get(&name)) {
            None => {}
            Some(BindingChange::Create(b)) => binding_writes.push((name, body(&b, "ClusterRoleBinding"), true, false)),
            Some(BindingChange::Update(b)) => binding_writes.push((name, body(&b, "ClusterRoleBinding"), false, false)),
            Some(BindingChange::Recreate(b)) => binding_writes.push((name, body(&b, "ClusterRoleBinding"), true, true)),
        }
    }
    let results = join_all(binding_writes.into_iter().map(|(name, obj, create, delete_first)| async move {
        if delete_first {
            match reg.delete(bindings_res, "", &name, &DeleteOptions::default()).await {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        write(reg, bindings_res, &name, obj, create).await
    }))
    .await;
    let written = writes.into_iter().chain(results).collect::<ApiResult<Vec<()>>>()?.len();
    if written > 0 {
        tracing::info!(objects = written, "bootstrap RBAC policy reconciled");
    }
    Ok(())
}
