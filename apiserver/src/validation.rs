//! Kubernetes' name and metadata validation rules, as pure functions.
//!
//! Each `*_errors` function returns `None` when the value is valid, otherwise the message
//! Kubernetes gives (without the field path, which the caller adds).

use serde_json::Value;

use crate::error::FieldError;

pub use apimachinery::validation::{
    dns1035_label_errors, dns1123_label_errors, dns1123_subdomain_errors, label_value_errors, qualified_name_errors,
    DNS1123_LABEL_MAX, DNS1123_SUBDOMAIN_MAX,
};

/// Names that are valid path segments (RBAC objects, HPAs): not `.`/`..`, no `/` or `%`.
pub fn path_segment_errors(s: &str) -> Option<String> {
    if s == "." || s == ".." {
        return Some(format!("may not be '{s}'"));
    }
    for bad in ["/", "%"] {
        if s.contains(bad) {
            return Some(format!("may not contain '{bad}'"));
        }
    }
    None
}

/// Whether `s` is a CIDR as Kubernetes reads one (Go's `net.ParseCIDR`): an IPv4 or IPv6
/// address, `/`, and a prefix length that fits the address.
pub fn is_cidr(s: &str) -> bool {
    let Some((addr, len)) = s.split_once('/') else { return false };
    if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let Ok(len) = len.parse::<u8>() else { return false };
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => len <= 32,
        Ok(std::net::IpAddr::V6(_)) => len <= 128,
        Err(_) => false,
    }
}

/// A CIDR's network address (the address with the host bits cleared) and prefix length,
/// when `s` is a CIDR ([`is_cidr`]).
pub fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u8)> {
    if !is_cidr(s) {
        return None;
    }
    let (addr, len) = s.split_once('/')?;
    let len: u8 = len.parse().ok()?;
    Some((mask(addr.parse().ok()?, len), len))
}

/// `ip` with all but its first `len` bits cleared.
fn mask(ip: std::net::IpAddr, len: u8) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match ip {
        IpAddr::V4(a) => {
            let m = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len.min(32))) };
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len.min(128))) };
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

/// Whether CIDR `inner` lies within CIDR `outer` and is smaller (Kubernetes' ipBlock rule
/// for `except`): false when either is not a CIDR or they are of different families.
pub fn is_strict_subset(inner: &str, outer: &str) -> bool {
    let (Some((inner_net, inner_len)), Some((outer_net, outer_len))) = (parse_cidr(inner), parse_cidr(outer)) else {
        return false;
    };
    inner_net.is_ipv4() == outer_net.is_ipv4() && outer_len < inner_len && mask(inner_net, outer_len) == outer_net
}

/// What is wrong with a port name (Kubernetes' `IsValidPortName`, an IANA service name):
/// none for a valid one.
pub fn port_name_errors(name: &str) -> Vec<&'static str> {
    let mut errs = Vec::new();
    if name.len() > 15 {
        errs.push("must be no more than 15 characters");
    }
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)");
    } else if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)");
    }
    if name.contains("--") {
        errs.push("must not contain consecutive hyphens");
    }
    if name.starts_with('-') || name.ends_with('-') {
        errs.push("must not begin or end with a hyphen");
    }
    errs
}

/// How a kind's object names are validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    Dns1123Subdomain,
    Dns1123Label,
    Dns1035Label,
    PathSegment,
}

impl NameRule {
    pub fn check(self, name: &str) -> Option<String> {
        match self {
            NameRule::Dns1123Subdomain => dns1123_subdomain_errors(name),
            NameRule::Dns1123Label => dns1123_label_errors(name),
            NameRule::Dns1035Label => dns1035_label_errors(name),
            NameRule::PathSegment => path_segment_errors(name),
        }
    }
}

const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// Validate `metadata` of an object about to be stored (name already resolved from
/// generateName).
pub fn validate_object_meta(obj: &Value, rule: NameRule, namespaced: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = obj.get("metadata").unwrap_or(&Value::Null);
    let name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        errs.push(FieldError::required("metadata.name", "name or generateName is required"));
    } else if let Some(m) = rule.check(name) {
        errs.push(FieldError::invalid("metadata.name", &Value::String(name.into()), &m));
    }
    if let Some(gn) = meta.get("generateName").and_then(Value::as_str) {
        // generateName is a prefix: it is valid when prefix+"a" would be.
        if !gn.is_empty() {
            let probe = format!("{}a", gn);
            if let Some(m) = rule.check(&probe) {
                errs.push(FieldError::invalid("metadata.generateName", &Value::String(gn.into()), &m));
            }
        }
    }
    let ns = meta.get("namespace").and_then(Value::as_str).unwrap_or_default();
    if namespaced {
        if ns.is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        } else if let Some(m) = dns1123_label_errors(ns) {
            errs.push(FieldError::invalid("metadata.namespace", &Value::String(ns.into()), &m));
        }
    } else if !ns.is_empty() {
        errs.push(FieldError::forbidden("metadata.namespace", "not allowed on this type"));
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if let Some(m) = qualified_name_errors(k) {
                errs.push(FieldError::invalid("metadata.labels", &Value::String(k.clone()), &m));
            }
            match v.as_str() {
                Some(s) => {
                    if let Some(m) = label_value_errors(s) {
                        errs.push(FieldError::invalid("metadata.labels", v, &m));
                    }
                }
                None => errs.push(FieldError::invalid("metadata.labels", v, "label values must be strings")),
            }
        }
    }
    if let Some(ann) = meta.get("annotations").and_then(Value::as_object) {
        let mut total = 0usize;
        for (k, v) in ann {
            if let Some(m) = qualified_name_errors(&k.to_lowercase()) {
                errs.push(FieldError::invalid("metadata.annotations", &Value::String(k.clone()), &m));
            }
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        if total > TOTAL_ANNOTATION_SIZE_LIMIT {
            errs.push(FieldError::too_long("metadata.annotations", TOTAL_ANNOTATION_SIZE_LIMIT));
        }
    }
    if let Some(fins) = meta.get("finalizers").and_then(Value::as_array) {
        let mut seen = std::collections::HashSet::new();
        for (i, f) in fins.iter().enumerate() {
            let s = f.as_str().unwrap_or_default();
            if let Some(m) = qualified_name_errors(s) {
                errs.push(FieldError::invalid(format!("metadata.finalizers[{i}]"), f, &m));
            } else if !s.contains('/') && !["kubernetes", "orphan", "foregroundDeletion"].contains(&s) {
                errs.push(FieldError::invalid(
                    format!("metadata.finalizers[{i}]"),
                    f,
                    "name is neither a standard finalizer name nor is it fully qualified",
                ));
            }
            if !seen.insert(s.to_string()) {
                errs.push(FieldError::duplicate(format!("metadata.finalizers[{i}]"), f));
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subdomains() {
        assert!(dns1123_subdomain_errors("nginx").is_none());
        assert!(dns1123_subdomain_errors("a.b-c.d").is_none());
        assert!(dns1123_subdomain_errors("Nginx").is_some());
        assert!(dns1123_subdomain_errors("-a").is_some());
        assert!(dns1123_subdomain_errors("a..b").is_some());
        assert!(dns1123_subdomain_errors(&"a".repeat(254)).is_some());
        assert!(dns1123_subdomain_errors(&"a".repeat(253)).is_none()); // Kubernetes does not bound label length inside a subdomain
    }

    #[test]
    fn labels_and_1035() {
        assert!(dns1123_label_errors("kube-system").is_none());
        assert!(dns1123_label_errors("a.b").is_some());
        assert!(dns1123_label_errors(&"a".repeat(64)).is_some());
        assert!(dns1035_label_errors("web").is_none());
        assert!(dns1035_label_errors("1web").is_some());
    }

    #[test]
    fn qualified_names() {
        assert!(qualified_name_errors("app").is_none());
        assert!(qualified_name_errors("app.kubernetes.io/name").is_none());
        assert!(qualified_name_errors("/name").is_some());
        assert!(qualified_name_errors("a/").is_some());
        assert!(qualified_name_errors("Bad_Prefix/x").is_some());
        assert!(qualified_name_errors("-x").is_some());
        assert!(label_value_errors("").is_none());
        assert!(label_value_errors("v1.2_3").is_none());
        assert!(label_value_errors("a b").is_some());
    }

    #[test]
    fn cidrs() {
        for ok in ["10.0.0.0/8", "192.0.2.7/32", "0.0.0.0/0", "2001:db8::/64", "::/0"] {
            assert!(is_cidr(ok), "{ok}");
        }
        for bad in ["10.0.0.0", "10.0.0.0/33", "10.0.0/8", "2001:db8::/129", "10.0.0.0/-1", "10.0.0.0/", "x/8"] {
            assert!(!is_cidr(bad), "{bad}");
        }
    }

    #[test]
    fn cidr_subsets_and_port_names() {
        assert_eq!(parse_cidr("10.1.2.3/16"), Some(("10.1.0.0".parse().unwrap(), 16)));
        assert!(is_strict_subset("10.1.2.0/24", "10.1.0.0/16"));
        assert!(!is_strict_subset("10.1.0.0/16", "10.1.0.0/16"), "equal is not a strict subset");
        assert!(!is_strict_subset("10.2.0.0/24", "10.1.0.0/16"));
        assert!(!is_strict_subset("10.0.0.0/8", "10.1.0.0/16"));
        assert!(!is_strict_subset("2001:db8::/64", "10.0.0.0/8"));
        assert!(is_strict_subset("2001:db8:0:1::/64", "2001:db8::/32"));
        assert!(is_strict_subset("0.0.0.0/1", "0.0.0.0/0"));
        assert!(port_name_errors("http").is_empty() && port_name_errors("dns-tcp").is_empty());
        assert_eq!(port_name_errors("8080"), ["must contain at least one letter (a-z)"]);
        assert_eq!(port_name_errors("Web"), ["must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"]);
        assert_eq!(port_name_errors("a--b"), ["must not contain consecutive hyphens"]);
        assert_eq!(port_name_errors("-a"), ["must not begin or end with a hyphen"]);
        assert_eq!(port_name_errors("abcdefghijklmnop"), ["must be no more than 15 characters"]);
    }

    #[test]
    fn object_meta() {
        let ok = json!({"metadata": {"name": "x", "namespace": "default", "labels": {"a": "b"}}});
        assert!(validate_object_meta(&ok, NameRule::Dns1123Subdomain, true).is_empty());
        let bad = json!({"metadata": {"name": "X_Y", "labels": {"a b": "c"}}});
        let errs = validate_object_meta(&bad, NameRule::Dns1123Subdomain, true);
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, vec!["metadata.name", "metadata.namespace", "metadata.labels"]);
        let cluster = json!({"metadata": {"name": "n", "namespace": "x"}});
        assert_eq!(validate_object_meta(&cluster, NameRule::Dns1123Label, false).len(), 1);
        let fin = json!({"metadata": {"name": "n", "finalizers": ["example.com/x", "bogus"]}});
        assert_eq!(validate_object_meta(&fin, NameRule::Dns1123Label, false).len(), 1);
    }
}
