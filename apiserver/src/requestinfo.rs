//! Parse a request path into what it addresses (Kubernetes' RequestInfo). Pure.

use std::collections::HashMap;

/// What an API path addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/<group>`
    Group(String),
    /// `/api/v1` or `/apis/<group>/<version>`
    ResourceList { group: String, version: String },
    /// A resource request.
    Resource(ResourcePath),
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The legacy `/watch/` path prefix was used.
    pub legacy_watch: bool,
    /// What follows the subresource (`nodes/<n>/proxy/<subpath>`), without a leading slash.
    pub subpath: String,
}

/// Parse `path` (no query). None when it is not an API path.
pub fn parse(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').filter(|p| !p.is_empty()).collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api"] => return Some(Target::CoreVersions),
        ["apis"] => return Some(Target::Groups),
        ["apis", g] => return Some(Target::Group(g.to_string())),
        ["api", v] => return Some(Target::ResourceList { group: String::new(), version: v.to_string() }),
        ["apis", g, v] => return Some(Target::ResourceList { group: g.to_string(), version: v.to_string() }),
        ["api", v, rest @ ..] => (String::new(), v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (g.to_string(), v.to_string(), rest),
        _ => return None,
    };
    let mut rest: Vec<&str> = rest.to_vec();
    let mut legacy_watch = false;
    if rest.first() == Some(&"watch") {
        legacy_watch = true;
        rest.remove(0);
    }
    let mut rp = ResourcePath { group, version, legacy_watch, ..Default::default() };
    // /namespaces/<ns>/<resource>/... — except the namespace's own subresources
    // (status, finalize), which address the namespaces resource.
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        rp.namespace = Some(rest[1].to_string());
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest.drain(0..2);
        } else {
            rp.namespace = None;
        }
    }
    match rest.as_slice() {
        [] => return None,
        [r] => rp.resource = r.to_string(),
        [r, n] => {
            rp.resource = r.to_string();
            rp.name = Some(n.to_string());
        }
        [r, n, s, tail @ ..] => {
            rp.resource = r.to_string();
            rp.name = Some(n.to_string());
            rp.subresource = Some(s.to_string());
            rp.subpath = tail.join("/");
        }
    }
    Some(Target::Resource(rp))
}

/// The Kubernetes verb for a method on a resource path.
pub fn verb(method: &http::Method, rp: &ResourcePath, watch_param: bool) -> &'static str {
    use http::Method;
    let named = rp.name.is_some();
    match *method {
        Method::GET | Method::HEAD => {
            if rp.legacy_watch || watch_param {
                "watch"
            } else if named {
                "get"
            } else {
                "list"
            }
        }
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => {
            if named {
                "delete"
            } else {
                "deletecollection"
            }
        }
        _ => "unknown",
    }
}

/// The pairs of a query string, percent-decoded (`+` is a space).
pub fn form_urlencoded_pairs(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_subpaths() {
        let r = res("/api/v1/nodes/n1/proxy/stats/summary");
        assert_eq!(
            (r.resource.as_str(), r.subresource.as_deref(), r.subpath.as_str()),
            ("nodes", Some("proxy"), "stats/summary")
        );
        assert_eq!(res("/api/v1/nodes/n1/proxy").subpath, "");
    }

    fn res(path: &str) -> ResourcePath {
        match parse(path) {
            Some(Target::Resource(r)) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn discovery_paths() {
        assert_eq!(parse("/api"), Some(Target::CoreVersions));
        assert_eq!(parse("/apis/"), Some(Target::Groups));
        assert_eq!(parse("/apis/apps"), Some(Target::Group("apps".into())));
        assert_eq!(parse("/api/v1"), Some(Target::ResourceList { group: "".into(), version: "v1".into() }));
        assert_eq!(parse("/apis/apps/v1"), Some(Target::ResourceList { group: "apps".into(), version: "v1".into() }));
        assert_eq!(parse("/healthz"), None);
    }

    #[test]
    fn resource_paths() {
        let r = res("/api/v1/pods");
        assert_eq!((r.resource.as_str(), r.namespace, r.name), ("pods", None, None));
        let r = res("/api/v1/namespaces/default/pods/web/status");
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(r.name.as_deref(), Some("web"));
        assert_eq!(r.subresource.as_deref(), Some("status"));
        let r = res("/api/v1/namespaces/demo");
        assert_eq!((r.resource.as_str(), r.name.as_deref(), r.namespace), ("namespaces", Some("demo"), None));
        let r = res("/api/v1/namespaces/demo/finalize");
        assert_eq!(
            (r.resource.as_str(), r.name.as_deref(), r.subresource.as_deref()),
            ("namespaces", Some("demo"), Some("finalize"))
        );
        let r = res("/api/v1/namespaces");
        assert_eq!((r.resource.as_str(), r.name), ("namespaces", None));
        let r = res("/apis/apps/v1/namespaces/default/deployments/web/scale");
        assert_eq!((r.group.as_str(), r.subresource.as_deref()), ("apps", Some("scale")));
        let r = res("/api/v1/watch/namespaces/default/pods");
        assert!(r.legacy_watch);
        assert_eq!(r.resource, "pods");
        let r = res("/api/v1/nodes/n1");
        assert_eq!((r.resource.as_str(), r.name.as_deref()), ("nodes", Some("n1")));
    }

    #[test]
    fn verbs() {
        let list = res("/api/v1/pods");
        let one = res("/api/v1/namespaces/d/pods/x");
        assert_eq!(verb(&http::Method::GET, &list, false), "list");
        assert_eq!(verb(&http::Method::GET, &list, true), "watch");
        assert_eq!(verb(&http::Method::GET, &one, false), "get");
        assert_eq!(verb(&http::Method::DELETE, &list, false), "deletecollection");
        assert_eq!(verb(&http::Method::DELETE, &one, false), "delete");
        assert_eq!(verb(&http::Method::PATCH, &one, false), "patch");
    }
}
