//! Tenants are `tenancy.minik8s.io/v1alpha1` `Tenant` objects (cluster-scoped) in the cluster:
//! the proxy installs their CRD, serves only the tenants that exist, and gives each, the
//! first time it is used, what a new cluster has: the namespaces `default`, `kube-system`,
//! `kube-public` and `kube-node-lease`, the ClusterRoles `cluster-admin`, `admin`, `edit` and
//! `view` (aggregated as the cluster's are, from Kubernetes' roles and the tenant's own labelled
//! for them), and `cluster-admin` bound to its `system:masters`. Deleting a Tenant deletes
//! all of that and everything the tenant made (a finalizer keeps the Tenant until then).

use std::collections::HashSet;
use std::sync::Mutex;

use http::{header, Method, StatusCode};
use serde_json::{json, Value};

use crate::tenant::{Tenant, MASTERS};

pub const GROUP: &str = "tenancy.minik8s.io";
pub const VERSION: &str = "v1alpha1";
const CRD_NAME: &str = "tenants.tenancy.minik8s.io";

/// The Tenant CRD: a cluster-scoped kind; its name is the tenant's.
pub fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"plural": "tenants", "singular": "tenant", "kind": "Tenant", "listKind": "TenantList"},
            "versions": [{
                "name": VERSION, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "displayName": {"type": "string", "description": "What people call the tenant."}
                    }}
                }}}
            }]
        }
    })
}

/// The namespaces every tenant starts with.
pub const START_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// The tenants that exist, and those given their starting objects.
#[derive(Default)]
pub struct Tenants {
    ready: Mutex<HashSet<String>>,
    bootstrapping: tokio::sync::Mutex<()>,
}

async fn call(
    client: &kube::Client,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(StatusCode, Value), String> {
    // A PATCH here is always a merge patch.
    let content_type = if method == Method::PATCH { "application/merge-patch+json" } else { "application/json" };
    let mut req = http::Request::builder().method(method).uri(path).header(header::ACCEPT, "application/json");
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, content_type);
    }
    let req = req
        .body(body.map(|b| serde_json::to_vec(b).unwrap_or_default()).unwrap_or_default())
        .map_err(|e| e.to_string())?;
    let resp = client.send(req.map(kube::client::Body::from)).await.map_err(|e| e.to_string())?;
    let code = resp.status();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await.map_err(|e| e.to_string())?.to_bytes();
    Ok((code, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// Create unless it exists.
async fn ensure(client: &kube::Client, collection: &str, obj: &Value) -> Result<(), String> {
    let (code, body) = call(client, Method::POST, collection, Some(obj)).await?;
    if code.is_success() || code == StatusCode::CONFLICT {
        return Ok(());
    }
    Err(format!("creating {}: {}", obj["metadata"]["name"], body["message"].as_str().unwrap_or(code.as_str())))
}

/// Install the Tenant CRD (once; an existing one is left as it is).
pub async fn install_crd(client: &kube::Client) -> anyhow::Result<()> {
    ensure(client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", &crd()).await.map_err(anyhow::Error::msg)
}

impl Tenants {
    /// Whether `tenant` may be served: it exists (and then has its starting objects).
    pub async fn admit(&self, client: &kube::Client, tenant: &Tenant) -> Result<(), String> {
        if self.ready.lock().map(|r| r.contains(tenant.name())).unwrap_or(false) {
            return Ok(());
        }
        let _one = self.bootstrapping.lock().await;
        if self.ready.lock().map(|r| r.contains(tenant.name())).unwrap_or(false) {
            return Ok(());
        }
        let path = format!("/apis/{GROUP}/{VERSION}/tenants/{}", tenant.name());
        let (code, obj) = call(client, Method::GET, &path, None).await?;
        if code == StatusCode::NOT_FOUND {
            return Err(format!(
                "tenant {:?} does not exist in this cluster (its administrator adds it)",
                tenant.name()
            ));
        }
        if !code.is_success() {
            return Err(format!("looking up tenant {:?}: the apiserver answered {code}", tenant.name()));
        }
        if obj.pointer("/metadata/deletionTimestamp").is_some() {
            return Err(format!("tenant {:?} is being deleted", tenant.name()));
        }
        // Deleting the Tenant deletes its objects first (see `cleanup`).
        if !has_finalizer(&obj) {
            let patch = finalizer_patch(&obj, true);
            let (code, body) = call(client, Method::PATCH, &path, Some(&patch)).await?;
            if !code.is_success() {
                return Err(format!(
                    "tenant {:?}: {}",
                    tenant.name(),
                    body["message"].as_str().unwrap_or(code.as_str())
                ));
            }
        }
        bootstrap(client, tenant).await?;
        if let Ok(mut r) = self.ready.lock() {
            r.insert(tenant.name().to_string());
        }
        Ok(())
    }

    /// Forget tenants, so a deleted one is looked up again (the proxy asks every minute).
    pub fn forget_all(&self) {
        if let Ok(mut r) = self.ready.lock() {
            r.clear();
        }
    }

    fn forget(&self, name: &str) {
        if let Ok(mut r) = self.ready.lock() {
            r.remove(name);
        }
    }

    /// Every few seconds: a Tenant being deleted stops being served, its objects are
    /// deleted, and once none is left its finalizer goes (and with it the Tenant).
    pub async fn run_cleanup(
        self: std::sync::Arc<Self>,
        client: kube::Client,
        discovery: std::sync::Arc<crate::discovery::Discovery>,
    ) {
        loop {
            tokio::time::sleep(CLEANUP_INTERVAL).await;
            let list = match call(&client, Method::GET, &format!("/apis/{GROUP}/{VERSION}/tenants"), None).await {
                Ok((code, list)) if code.is_success() => list,
                _ => continue,
            };
            for t in list["items"].as_array().into_iter().flatten() {
                let deleting = t.pointer("/metadata/deletionTimestamp").is_some();
                let Some(name) = t["metadata"]["name"].as_str() else { continue };
                if !(deleting && has_finalizer(t)) {
                    continue;
                }
                self.forget(name);
                let Ok(tenant) = Tenant::new(name) else { continue };
                match cleanup(&client, &discovery.tables(), &tenant).await {
                    Ok(0) => {
                        let path = format!("/apis/{GROUP}/{VERSION}/tenants/{name}");
                        let patch = finalizer_patch(t, false);
                        match call(&client, Method::PATCH, &path, Some(&patch)).await {
                            Ok((code, _)) if code.is_success() => {
                                tracing::info!(tenant = name, "tenant deleted with its objects")
                            }
                            other => {
                                tracing::warn!(tenant = name, answer = ?other.map(|(c, _)| c), "removing the tenant's finalizer")
                            }
                        }
                    }
                    Ok(left) => tracing::info!(tenant = name, left, "deleting the tenant's objects"),
                    Err(e) => tracing::warn!(tenant = name, error = %e, "deleting the tenant's objects"),
                }
            }
        }
    }
}

/// How often the proxy looks for Tenants being deleted.
const CLEANUP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(3);

/// The finalizer that keeps a Tenant until its objects are gone.
pub const FINALIZER: &str = "tenancy.minik8s.io/objects";

fn has_finalizer(tenant: &Value) -> bool {
    tenant["metadata"]["finalizers"].as_array().is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

/// A merge patch adding (or removing) the proxy's finalizer, guarded by the Tenant's
/// resourceVersion (a merge patch replaces the whole list).
fn finalizer_patch(tenant: &Value, add: bool) -> Value {
    let mut finalizers: Vec<Value> = tenant["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| *x != FINALIZER)
        .cloned()
        .collect();
    if add {
        finalizers.push(json!(FINALIZER));
    }
    json!({"metadata": {"finalizers": finalizers, "resourceVersion": tenant["metadata"]["resourceVersion"]}})
}

/// The collections holding a tenant's cluster-scoped objects (its namespaces among them:
/// deleting those deletes everything in them), by name prefix; pure.
pub fn owned_collections(tables: &crate::resources::Resources) -> Vec<String> {
    let mut out: Vec<String> = tables
        .all()
        .filter(|r| !r.namespaced && !crate::resources::is_crd(&r.group, &r.plural))
        .filter(|r| crate::resources::access(&r.group, &r.plural) == crate::resources::Access::Own)
        .map(|r| {
            if r.group.is_empty() {
                format!("/api/{}/{}", r.version, r.plural)
            } else {
                format!("/apis/{}/{}/{}", r.group, r.version, r.plural)
            }
        })
        .collect();
    out.sort();
    out
}

/// Delete what is left of `tenant`: its cluster-scoped objects and namespaces, its CRDs.
/// Returns how many objects were still there (0: nothing left).
async fn cleanup(
    client: &kube::Client,
    tables: &crate::resources::Resources,
    tenant: &Tenant,
) -> Result<usize, String> {
    let mut left = 0;
    let mut targets: Vec<String> = Vec::new();
    for collection in owned_collections(tables) {
        let (code, list) =
            call(client, Method::GET, &format!("{collection}?tenantPrefix={}", tenant.prefix()), None).await?;
        if !code.is_success() {
            continue;
        }
        for item in list["items"].as_array().into_iter().flatten() {
            if let Some(name) = item["metadata"]["name"].as_str() {
                left += 1;
                if item.pointer("/metadata/deletionTimestamp").is_none() {
                    targets.push(format!("{collection}/{name}"));
                }
            }
        }
    }
    let crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    let (code, list) = call(client, Method::GET, crds, None).await?;
    if code.is_success() {
        for item in list["items"].as_array().into_iter().flatten() {
            let group = item["spec"]["group"].as_str().unwrap_or_default();
            let name = item["metadata"]["name"].as_str().unwrap_or_default();
            if !crate::tenant::is_builtin_group(group) && tenant.group_down(group).is_some() {
                left += 1;
                if item.pointer("/metadata/deletionTimestamp").is_none() {
                    targets.push(format!("{crds}/{name}"));
                }
            }
        }
    }
    for path in targets {
        let (code, body) = call(client, Method::DELETE, &path, None).await?;
        if !code.is_success() && code != StatusCode::NOT_FOUND {
            tracing::warn!(path, message = body["message"].as_str().unwrap_or_default(), "deleting a tenant's object");
        }
    }
    Ok(left)
}

/// A tenant's starting objects (idempotent).
async fn bootstrap(client: &kube::Client, tenant: &Tenant) -> Result<(), String> {
    for ns in START_NAMESPACES {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": tenant.up(ns)}});
        ensure(client, "/api/v1/namespaces", &obj).await?;
    }
    let roles = "/apis/rbac.authorization.k8s.io/v1/clusterroles";
    let everything =
        json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]);
    ensure(client, roles, &role(tenant, "cluster-admin", everything)).await?;
    for name in ["admin", "edit", "view"] {
        // Aggregated as the cluster's are: from the roles labelled for the cluster's
        // (Kubernetes' own) and from the tenant's own roles labelled for it.
        let mut r = role(tenant, name, json!([]));
        let label = |prefix: &str| json!({"matchLabels": {format!("{prefix}{name}"): "true"}});
        r["aggregationRule"] = json!({"clusterRoleSelectors": [
            label(crate::convert::AGGREGATE_PREFIX),
            label(&crate::convert::tenant_aggregate_prefix(tenant)),
        ]});
        ensure(client, roles, &r).await?;
    }
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": tenant.up("cluster-admin")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": tenant.up("cluster-admin")},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": tenant.subject_up(MASTERS)}],
    });
    ensure(client, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", &binding).await
}

fn role(tenant: &Tenant, name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": tenant.up(name)}, "rules": rules})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_s_objects_are_found_in_every_cluster_scoped_kind_it_owns() {
        let mut r = crate::resources::Resources::default();
        r.add_list(
            "",
            "v1",
            &json!({"resources": [
                {"name": "namespaces", "kind": "Namespace", "namespaced": false},
                {"name": "nodes", "kind": "Node", "namespaced": false},
                {"name": "pods", "kind": "Pod", "namespaced": true},
                {"name": "persistentvolumes", "kind": "PersistentVolume", "namespaced": false},
            ]}),
        );
        r.add_list(
            "apiextensions.k8s.io",
            "v1",
            &json!({"resources": [{"name": "customresourcedefinitions", "kind": "CustomResourceDefinition", "namespaced": false}]}),
        );
        r.add_list(
            "certificates.k8s.io",
            "v1",
            &json!({"resources": [{"name": "certificatesigningrequests", "kind": "CertificateSigningRequest", "namespaced": false}]}),
        );
        assert_eq!(owned_collections(&r), vec!["/api/v1/namespaces", "/api/v1/persistentvolumes"]);
    }

    #[test]
    fn the_finalizer_is_added_and_removed_keeping_the_others() {
        let t = json!({"metadata": {"finalizers": ["other"], "resourceVersion": "7"}});
        let added = finalizer_patch(&t, true);
        assert_eq!(added, json!({"metadata": {"finalizers": ["other", FINALIZER], "resourceVersion": "7"}}));
        assert!(has_finalizer(&added));
        assert_eq!(finalizer_patch(&added, false)["metadata"]["finalizers"], json!(["other"]));
    }
}
