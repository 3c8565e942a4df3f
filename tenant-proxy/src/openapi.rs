//! Each tenant's view of `/openapi/v2` and `/openapi/v3`: Kubernetes' own definitions and
//! paths, and its CRDs' under the group names it gave them; no other tenant's, no
//! administrator's CRDs. Pure.

use serde_json::Value;

use crate::tenant::{is_builtin_group, Tenant};

/// The group of an API path (`/apis/<group>/…` or `apis/<group>/…`), if it names one.
fn path_group(path: &str) -> Option<&str> {
    path.trim_start_matches('/').strip_prefix("apis/")?.split('/').next()
}

/// The groups (upstream, tenant's view) a document names of this tenant's CRDs.
fn own_groups(tenant: &Tenant, groups: impl Iterator<Item = String>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = groups
        .filter(|g| !is_builtin_group(g))
        .filter_map(|g| tenant.group_down(&g).map(|d| (g.clone(), d.to_string())))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A serialized document with the tenant's stored group names (and their reversed forms in
/// definition names: `com.example.acme.v1.Widget`) as the tenant knows them.
fn rename(text: String, own: &[(String, String)]) -> String {
    let reversed = |g: &str| g.split('.').rev().collect::<Vec<_>>().join(".");
    own.iter().fold(text, |t, (up, down)| t.replace(up.as_str(), down).replace(&reversed(up), &reversed(down)))
}

fn visible(tenant: &Tenant, group: &str) -> bool {
    is_builtin_group(group) || tenant.group_down(group).is_some()
}

/// `/openapi/v2` (the Swagger document) as the tenant sees it.
pub fn v2_down(tenant: &Tenant, mut doc: Value) -> Value {
    let mut groups = Vec::new();
    if let Some(paths) = doc["paths"].as_object_mut() {
        paths.retain(|p, _| path_group(p).is_none_or(|g| visible(tenant, g)));
        groups.extend(paths.keys().filter_map(|p| path_group(p).map(str::to_string)));
    }
    if let Some(defs) = doc["definitions"].as_object_mut() {
        defs.retain(|_, d| {
            d["x-kubernetes-group-version-kind"]
                .as_array()
                .is_none_or(|gvks| gvks.iter().all(|gvk| visible(tenant, gvk["group"].as_str().unwrap_or_default())))
        });
    }
    let own = own_groups(tenant, groups.into_iter());
    if own.is_empty() {
        return doc;
    }
    let text = rename(serde_json::to_string(&doc).unwrap_or_default(), &own);
    serde_json::from_str(&text).unwrap_or(doc)
}

/// The `/openapi/v3` index as the tenant sees it.
pub fn v3_root_down(tenant: &Tenant, mut doc: Value) -> Value {
    let mut groups = Vec::new();
    if let Some(paths) = doc["paths"].as_object_mut() {
        paths.retain(|p, _| path_group(p).is_none_or(|g| visible(tenant, g)));
        groups.extend(paths.keys().filter_map(|p| path_group(p).map(str::to_string)));
    }
    let own = own_groups(tenant, groups.into_iter());
    if own.is_empty() {
        return doc;
    }
    let text = rename(serde_json::to_string(&doc).unwrap_or_default(), &own);
    serde_json::from_str(&text).unwrap_or(doc)
}

/// The upstream path of `/openapi/v3/<gv>`, or None if the tenant must not see it.
pub fn v3_path_up(tenant: &Tenant, gv: &str) -> Option<String> {
    match gv.strip_prefix("apis/") {
        Some(rest) => {
            let (group, version) = rest.split_once('/')?;
            Some(format!("/openapi/v3/apis/{}/{version}", tenant.group_up(group)))
        }
        None => Some(format!("/openapi/v3/{gv}")),
    }
}

/// One `/openapi/v3/<gv>` document as the tenant sees it.
pub fn v3_doc_down(tenant: &Tenant, upstream_group: &str, text: String) -> String {
    rename(text, &own_groups(tenant, std::iter::once(upstream_group.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documents_keep_builtins_and_the_tenant_s_crds() {
        let t = Tenant::new("acme").unwrap();
        let doc = json!({
            "paths": {"/api/v1/pods": {}, "/apis/acme.example.com/v1/widgets": {}, "/apis/bob.example.com/v1/widgets": {}},
            "definitions": {
                "io.k8s.api.core.v1.Pod": {"x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}]},
                "com.example.acme.v1.Widget": {"x-kubernetes-group-version-kind": [{"group": "acme.example.com", "kind": "Widget", "version": "v1"}]},
                "com.example.bob.v1.Widget": {"x-kubernetes-group-version-kind": [{"group": "bob.example.com", "kind": "Widget", "version": "v1"}]},
            }
        });
        let out = v2_down(&t, doc);
        let mut paths: Vec<&String> = out["paths"].as_object().unwrap().keys().collect();
        paths.sort();
        assert_eq!(paths, vec!["/api/v1/pods", "/apis/example.com/v1/widgets"]);
        let mut defs: Vec<&String> = out["definitions"].as_object().unwrap().keys().collect();
        defs.sort();
        assert_eq!(defs, vec!["com.example.v1.Widget", "io.k8s.api.core.v1.Pod"]);
        let root = json!({"paths": {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=1"},
            "apis/acme.example.com/v1": {"serverRelativeURL": "/openapi/v3/apis/acme.example.com/v1?hash=2"},
            "apis/bob.example.com/v1": {"serverRelativeURL": "/openapi/v3/apis/bob.example.com/v1?hash=3"}}});
        let root = v3_root_down(&t, root);
        assert_eq!(root["paths"]["apis/example.com/v1"]["serverRelativeURL"], "/openapi/v3/apis/example.com/v1?hash=2");
        assert_eq!(root["paths"].as_object().unwrap().len(), 2);
        assert_eq!(v3_path_up(&t, "apis/example.com/v1").as_deref(), Some("/openapi/v3/apis/acme.example.com/v1"));
        assert_eq!(v3_path_up(&t, "apis/apps/v1").as_deref(), Some("/openapi/v3/apis/apps/v1"));
    }
}
