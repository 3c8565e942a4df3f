//! The upstream API's discovery: the resource tables the conversion reads (fetched when a
//! request names a resource not seen yet, at most once a second, and every 30 s), and each
//! tenant's view of the discovery documents and OpenAPI: Kubernetes' own groups and the
//! tenant's CRD groups under the names it gave them; no other tenant's, no administrator's.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::resources::{Resource, Resources};
use crate::tenant::Tenant;

/// How often the tables are read again without being asked.
pub const REFRESH: Duration = Duration::from_secs(30);
/// How soon a miss may read them again.
const MISS_INTERVAL: Duration = Duration::from_secs(1);

pub struct Discovery {
    client: kube::Client,
    tables: RwLock<Arc<Resources>>,
    last: Mutex<Option<Instant>>,
    refreshing: tokio::sync::Mutex<()>,
}

impl Discovery {
    pub fn new(client: kube::Client) -> Arc<Discovery> {
        Arc::new(Discovery {
            client,
            tables: RwLock::new(Arc::new(Resources::default())),
            last: Mutex::new(None),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    pub fn tables(&self) -> Arc<Resources> {
        self.tables.read().map(|t| t.clone()).unwrap_or_default()
    }

    /// Read every group/version's resources again.
    pub async fn refresh(&self) -> anyhow::Result<()> {
        let _one = self.refreshing.lock().await;
        let mut tables = Resources::default();
        let core: Value = self.get("/api/v1").await?;
        tables.add_list("", "v1", &core);
        let groups: Value = self.get("/apis").await?;
        for g in groups["groups"].as_array().into_iter().flatten() {
            let name = g["name"].as_str().unwrap_or_default();
            for v in g["versions"].as_array().into_iter().flatten() {
                let (Some(gv), Some(version)) = (v["groupVersion"].as_str(), v["version"].as_str()) else { continue };
                match self.get(&format!("/apis/{gv}")).await {
                    Ok(list) => tables.add_list(name, version, &list),
                    Err(e) => tracing::debug!(group_version = gv, error = %e, "discovery"),
                }
            }
        }
        if let Ok(mut t) = self.tables.write() {
            *t = Arc::new(tables);
        }
        if let Ok(mut l) = self.last.lock() {
            *l = Some(Instant::now());
        }
        Ok(())
    }

    /// The upstream resource `plural` of upstream `group`; on a miss, that group/version's
    /// discovery is read (a CRD served a moment ago), and everything at most once a second.
    pub async fn find(&self, group: &str, version: &str, plural: &str) -> Option<Resource> {
        if let Some(r) = self.tables().find(group, plural) {
            return Some(r.clone());
        }
        let path = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
        if let Ok(list) = self.get(&path).await {
            if let Ok(mut t) = self.tables.write() {
                let mut tables = (**t).clone();
                tables.add_list(group, version, &list);
                *t = Arc::new(tables);
            }
        }
        if let Some(r) = self.tables().find(group, plural) {
            return Some(r.clone());
        }
        let due = self.last.lock().ok().and_then(|l| *l).is_none_or(|t| t.elapsed() >= MISS_INTERVAL);
        if due {
            if let Err(e) = self.refresh().await {
                tracing::warn!(error = %e, "reading the apiserver's discovery");
            }
        }
        self.tables().find(group, plural).cloned()
    }

    /// Keep the tables fresh.
    pub async fn run(self: Arc<Self>) {
        loop {
            if let Err(e) = self.refresh().await {
                tracing::warn!(error = %e, "reading the apiserver's discovery");
            }
            tokio::time::sleep(REFRESH).await;
        }
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let req = http::Request::get(path).header(http::header::ACCEPT, "application/json").body(Vec::new())?;
        Ok(self.client.request::<Value>(req).await?)
    }
}

/// `/apis` (an `APIGroupList`) as the tenant sees it.
pub fn groups_down(tenant: &Tenant, list: &mut Value) {
    if let Some(groups) = list["groups"].as_array_mut() {
        groups.retain_mut(|g| group_down(tenant, g));
    }
}

/// One `APIGroup` as the tenant sees it; false if it must not see it.
pub fn group_down(tenant: &Tenant, group: &mut Value) -> bool {
    let Some(name) = group["name"].as_str().and_then(|n| tenant.group_down(n)).map(str::to_string) else {
        return false;
    };
    group["name"] = Value::String(name.clone());
    for v in group["versions"].as_array_mut().into_iter().flatten() {
        rename_group_version(v, &name);
    }
    if let Some(p) = group.get_mut("preferredVersion") {
        rename_group_version(p, &name);
    }
    true
}

fn rename_group_version(v: &mut Value, group: &str) {
    if let Some(version) = v["version"].as_str().map(str::to_string) {
        v["groupVersion"] = Value::String(format!("{group}/{version}"));
    }
}

/// `/apis/<group>/<version>` (an `APIResourceList`) as the tenant sees it.
pub fn resource_list_down(tenant: &Tenant, list: &mut Value) {
    if let Some(gv) = list["groupVersion"].as_str().and_then(|gv| tenant.api_version_down(gv)) {
        list["groupVersion"] = Value::String(gv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_tenant_sees_its_own_groups() {
        let t = Tenant::new("acme").unwrap();
        let mut list = json!({"kind": "APIGroupList", "groups": [
            {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}], "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}},
            {"name": "acme.example.com", "versions": [{"groupVersion": "acme.example.com/v1", "version": "v1"}], "preferredVersion": {"groupVersion": "acme.example.com/v1", "version": "v1"}},
            {"name": "bob.example.com", "versions": [{"groupVersion": "bob.example.com/v1", "version": "v1"}]},
            {"name": "tenancy.minik8s.io", "versions": [{"groupVersion": "tenancy.minik8s.io/v1alpha1", "version": "v1alpha1"}]},
        ]});
        groups_down(&t, &mut list);
        let names: Vec<&str> = list["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["apps", "example.com"]);
        assert_eq!(list["groups"][1]["preferredVersion"]["groupVersion"], "example.com/v1");
        let mut rl = json!({"groupVersion": "acme.example.com/v1", "resources": []});
        resource_list_down(&t, &mut rl);
        assert_eq!(rl["groupVersion"], "example.com/v1");
    }
}
