//! Tenants are `tenancy.minik8s.io/v1alpha1` `Tenant` objects (cluster-scoped) in the cluster:
//! the proxy installs their CRD, serves only the tenants that exist, and gives each, the
//! first time it is used, what a new cluster has: the namespaces `default`, `kube-system`,
//! `kube-public` and `kube-node-lease`, the ClusterRoles `cluster-admin`, `admin`, `edit` and
//! `view` (aggregated as the cluster's are, from Kubernetes' roles and the tenant's own labelled
//! for them), and `cluster-admin` bound to its `system:masters`.

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
    let mut req = http::Request::builder().method(method).uri(path).header(header::ACCEPT, "application/json");
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
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
        let (code, _) =
            call(client, Method::GET, &format!("/apis/{GROUP}/{VERSION}/tenants/{}", tenant.name()), None).await?;
        if code == StatusCode::NOT_FOUND {
            return Err(format!(
                "tenant {:?} does not exist in this cluster (its administrator adds it)",
                tenant.name()
            ));
        }
        if !code.is_success() {
            return Err(format!("looking up tenant {:?}: the apiserver answered {code}", tenant.name()));
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
