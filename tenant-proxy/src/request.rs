//! What a tenant's request addresses, and the same request upstream; pure.

use crate::resources::{is_crd, Resource};
use crate::tenant::Tenant;

/// What a request path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `/api`, `/api/v1`: the core group's discovery (the same for every tenant).
    CoreDiscovery,
    /// `/apis`: the groups.
    Groups,
    /// `/apis/<group>` (the tenant's group name).
    Group(String),
    /// `/apis/<group>/<version>`.
    GroupVersion(String, String),
    /// A resource, collection or subresource.
    Resource(ResourcePath),
    OpenApiV2,
    OpenApiV3Root,
    /// `/openapi/v3/<api|apis/group>/<version>`.
    OpenApiV3(String),
    /// `/healthz`, `/livez`, `/readyz` (and their checks), `/version`: forwarded.
    Public,
    /// Anything else (`/metrics`, `/logs`, …): not for tenants.
    NotFound,
}

/// A resource path as the tenant wrote it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub plural: String,
    pub name: Option<String>,
    /// The subresource and anything after it (`status`, `log`, `proxy/x/y`).
    pub sub: Vec<String>,
    /// The legacy `/watch/` form.
    pub watch: bool,
}

/// What `path` addresses: Kubernetes' request info (the apiserver's own parser) for API
/// paths, and the few others a tenant may reach.
pub fn parse(path: &str) -> Target {
    use apiserver::requestinfo::Target as Api;
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["openapi", "v2"] => return Target::OpenApiV2,
        ["openapi", "v3"] => return Target::OpenApiV3Root,
        ["openapi", "v3", rest @ ..] => return Target::OpenApiV3(rest.join("/")),
        ["healthz" | "livez" | "readyz", ..] | ["version"] => return Target::Public,
        _ => {}
    }
    match apiserver::requestinfo::parse(path) {
        Some(Api::CoreVersions) => Target::CoreDiscovery,
        Some(Api::ResourceList { group, .. }) if group.is_empty() => Target::CoreDiscovery,
        Some(Api::Groups) => Target::Groups,
        Some(Api::Group(g)) => Target::Group(g),
        Some(Api::ResourceList { group, version }) => Target::GroupVersion(group, version),
        Some(Api::Resource(rp)) => {
            let mut sub: Vec<String> = rp.subresource.into_iter().collect();
            sub.extend(rp.subpath.split('/').filter(|s| !s.is_empty()).map(str::to_string));
            Target::Resource(ResourcePath {
                group: rp.group,
                version: rp.version,
                namespace: rp.namespace,
                plural: rp.resource,
                name: rp.name,
                sub,
                watch: rp.legacy_watch,
            })
        }
        None => Target::NotFound,
    }
}

impl ResourcePath {
    /// A read of many objects (list or watch), which may span namespaces or names.
    pub fn is_collection(&self) -> bool {
        self.name.is_none()
    }

    /// The same path upstream, for upstream resource `res`.
    pub fn upstream(&self, tenant: &Tenant, res: &Resource) -> String {
        let mut out = if res.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", res.group, self.version)
        };
        if self.watch {
            out.push_str("/watch");
        }
        if let Some(ns) = &self.namespace {
            out.push_str(&format!("/namespaces/{}", tenant.up(ns)));
        }
        out.push('/');
        out.push_str(&self.plural);
        if let Some(name) = &self.name {
            out.push('/');
            out.push_str(&stored_name(tenant, res, name));
        }
        for s in &self.sub {
            out.push('/');
            out.push_str(s);
        }
        out
    }
}

/// A name in a request as stored: a namespaced object's as is, a cluster-scoped one's
/// converted (Nodes and the other shared kinds as they are).
pub fn stored_name(tenant: &Tenant, res: &Resource, name: &str) -> String {
    if res.namespaced {
        return name.to_string();
    }
    if is_crd(&res.group, &res.plural) {
        return tenant.crd_name_up(name);
    }
    match crate::resources::access(&res.group, &res.plural) {
        crate::resources::Access::Own => tenant.up(name),
        _ => name.to_string(),
    }
}

/// The query of a request, upstream: field selectors naming namespaces or cluster-scoped
/// names converted, and — for a list, watch or deletecollection across the tenant's
/// namespaces or cluster-scoped names — the apiserver's `tenantPrefix`, so the answer holds
/// the tenant's objects only and costs what they cost. A `tenantPrefix` of the tenant's own
/// is dropped.
pub fn upstream_query(tenant: &Tenant, res: &Resource, path: &ResourcePath, query: &str) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "tenantPrefix" => {}
            "fieldSelector" => {
                out.append_pair("fieldSelector", &field_selector_up(tenant, res, &v));
            }
            "labelSelector" if res.group.is_empty() && res.plural == "namespaces" => {
                out.append_pair("labelSelector", &namespace_label_selector_up(tenant, &v));
            }
            _ => {
                out.append_pair(&k, &v);
            }
        }
    }
    let spans = path.is_collection() && (if res.namespaced { path.namespace.is_none() } else { owns_by_prefix(res) });
    if spans {
        out.append_pair("tenantPrefix", &tenant.prefix());
    }
    out.finish()
}

/// Whether a cluster-scoped resource's tenant objects are those whose names have the prefix.
fn owns_by_prefix(res: &Resource) -> bool {
    !res.namespaced
        && !is_crd(&res.group, &res.plural)
        && crate::resources::access(&res.group, &res.plural) == crate::resources::Access::Own
}

/// `metadata.namespace=prod,status.phase!=Running` with the tenant's names stored.
pub fn field_selector_up(tenant: &Tenant, res: &Resource, selector: &str) -> String {
    selector
        .split(',')
        .map(|term| {
            let (key, op, value) = match term.find("!=").or_else(|| term.find('=')) {
                Some(i) => {
                    let op_len = if term[i..].starts_with("!=") || term[i..].starts_with("==") { 2 } else { 1 };
                    (term[..i].trim(), &term[i..i + op_len], &term[i + op_len..])
                }
                None => return term.to_string(),
            };
            let converted = match key {
                "metadata.namespace"
                | "involvedObject.namespace"
                | "regarding.namespace"
                | "spec.claimRef.namespace" => tenant.up(value),
                "metadata.name" if !res.namespaced => stored_name(tenant, res, value),
                _ => value.to_string(),
            };
            format!("{key}{op}{converted}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The label every namespace carries with its own name (Kubernetes sets it).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A label selector over namespaces with the values of `kubernetes.io/metadata.name` (which
/// is the stored name) converted: `kubernetes.io/metadata.name in (prod,dev)`.
pub fn namespace_label_selector_up(tenant: &Tenant, selector: &str) -> String {
    // Terms are separated by commas outside parentheses.
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms
        .into_iter()
        .map(|term| {
            let t = term.trim();
            let Some(rest) = t.strip_prefix(NAMESPACE_NAME_LABEL) else { return term.to_string() };
            let rest = rest.trim_start();
            for op in ["==", "!=", "="] {
                if let Some(v) = rest.strip_prefix(op) {
                    return format!("{NAMESPACE_NAME_LABEL}{op}{}", tenant.up(v.trim()));
                }
            }
            for op in ["notin", "in"] {
                if let Some(list) =
                    rest.strip_prefix(op).map(str::trim).and_then(|l| l.strip_prefix('(')?.strip_suffix(')'))
                {
                    let values: Vec<String> = list.split(',').map(|v| tenant.up(v.trim())).collect();
                    return format!("{NAMESPACE_NAME_LABEL} {op} ({})", values.join(","));
                }
            }
            term.to_string()
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(group: &str, plural: &str, namespaced: bool) -> Resource {
        Resource { group: group.into(), version: "v1".into(), plural: plural.into(), kind: String::new(), namespaced }
    }

    #[test]
    fn paths() {
        assert_eq!(parse("/api"), Target::CoreDiscovery);
        assert_eq!(parse("/apis/apps"), Target::Group("apps".into()));
        assert_eq!(parse("/metrics"), Target::NotFound);
        assert_eq!(parse("/readyz/ping"), Target::Public);
        let Target::Resource(p) = parse("/api/v1/namespaces/prod/pods/web/log") else { panic!() };
        assert_eq!(
            (p.namespace.as_deref(), p.plural.as_str(), p.name.as_deref(), p.sub.clone()),
            (Some("prod"), "pods", Some("web"), vec!["log".to_string()])
        );
        let t = Tenant::new("acme").unwrap();
        assert_eq!(p.upstream(&t, &res("", "pods", true)), "/api/v1/namespaces/acme-prod/pods/web/log");
        let Target::Resource(ns) = parse("/api/v1/namespaces/prod/finalize") else { panic!() };
        assert_eq!((ns.plural.as_str(), ns.name.as_deref()), ("namespaces", Some("prod")));
        assert_eq!(ns.upstream(&t, &res("", "namespaces", false)), "/api/v1/namespaces/acme-prod/finalize");
        let Target::Resource(crd) = parse("/apis/example.com/v1/namespaces/prod/widgets") else { panic!() };
        assert_eq!(
            crd.upstream(&t, &res("acme.example.com", "widgets", true)),
            "/apis/acme.example.com/v1/namespaces/acme-prod/widgets"
        );
        let Target::Resource(node) = parse("/api/v1/nodes/node-1") else { panic!() };
        assert_eq!(node.upstream(&t, &res("", "nodes", false)), "/api/v1/nodes/node-1");
        assert_eq!(parse("/logs/x"), Target::NotFound);
    }

    #[test]
    fn queries_keep_to_the_tenant() {
        let t = Tenant::new("acme").unwrap();
        let pods = res("", "pods", true);
        let Target::Resource(all) = parse("/api/v1/pods") else { panic!() };
        assert_eq!(
            upstream_query(&t, &pods, &all, "fieldSelector=metadata.namespace%3Dprod&tenantPrefix=bob-&watch=1"),
            "fieldSelector=metadata.namespace%3Dacme-prod&watch=1&tenantPrefix=acme-"
        );
        let Target::Resource(one_ns) = parse("/api/v1/namespaces/prod/pods") else { panic!() };
        assert_eq!(upstream_query(&t, &pods, &one_ns, "limit=5"), "limit=5");
        let roles = res("rbac.authorization.k8s.io", "clusterroles", false);
        let Target::Resource(cr) = parse("/apis/rbac.authorization.k8s.io/v1/clusterroles") else { panic!() };
        assert_eq!(
            upstream_query(&t, &roles, &cr, "fieldSelector=metadata.name!%3Dreader"),
            "fieldSelector=metadata.name%21%3Dacme-reader&tenantPrefix=acme-"
        );
        let namespaces = res("", "namespaces", false);
        assert_eq!(
            namespace_label_selector_up(
                &t,
                "kubernetes.io/metadata.name in (prod, dev),team=a,kubernetes.io/metadata.name!=x"
            ),
            "kubernetes.io/metadata.name in (acme-prod,acme-dev),team=a,kubernetes.io/metadata.name!=acme-x"
        );
        let Target::Resource(nsl) = parse("/api/v1/namespaces") else { panic!() };
        assert_eq!(
            upstream_query(&t, &namespaces, &nsl, "labelSelector=kubernetes.io%2Fmetadata.name%3Dprod"),
            "labelSelector=kubernetes.io%2Fmetadata.name%3Dacme-prod&tenantPrefix=acme-"
        );
        let nodes = res("", "nodes", false);
        let Target::Resource(n) = parse("/api/v1/nodes") else { panic!() };
        assert_eq!(upstream_query(&t, &nodes, &n, ""), "");
    }
}
