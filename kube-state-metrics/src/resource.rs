//! Resource quantities as series: which `unit` a resource is counted in and its value, by
//! the upstream exporter's rules. `cpu` is in cores (a float), `memory`, `storage`,
//! `ephemeral-storage`, `hugepages-*` and `attachable-volumes-*` in bytes, `pods` (nodes
//! only) and extended resources (`example.com/gpu`) as integers; any other resource name
//! is left out. The `resource` label is the name with every character outside
//! `[a-zA-Z0-9_]` replaced by `_`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::render::Series;

/// Which kind of object the resource list belongs to: a node counts `pods`, and counts
/// bytes in thousandths like everything else; a container does not count `pods`, and
/// counts bytes in whole (rounded-up) units.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Container,
    Node,
}

/// `[^a-zA-Z0-9_]` → `_`.
pub fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// A quantity's value in base units with millesimal precision (what the upstream exporter
/// does for cores): whole units when the thousandths would overflow.
pub fn milli_float(q: &Quantity) -> f64 {
    let v = apimachinery::quantity::parse(&q.0).unwrap_or(0.0);
    if v.abs() * 1000.0 > i64::MAX as f64 {
        apimachinery::quantity::value(&q.0) as f64
    } else {
        apimachinery::quantity::milli_value(&q.0) as f64 / 1000.0
    }
}

/// Whole base units, rounded up.
pub fn whole(q: &Quantity) -> f64 {
    apimachinery::quantity::value(&q.0) as f64
}

/// The series of a resource list: `resource` and `unit` labels after `before`.
pub fn series(list: Option<&BTreeMap<String, Quantity>>, owner: Owner, before: &[(&'static str, &str)]) -> Vec<Series> {
    let Some(list) = list else { return Vec::new() };
    let mut out = Vec::new();
    for (name, q) in list {
        let bytes = || if owner == Owner::Node { milli_float(q) } else { whole(q) };
        let mut found: Vec<(&'static str, f64)> = Vec::new();
        match name.as_str() {
            "cpu" => found.push(("core", milli_float(q))),
            "memory" | "storage" | "ephemeral-storage" => found.push(("byte", bytes())),
            "pods" if owner == Owner::Node => found.push(("integer", milli_float(q))),
            _ => {
                if name.starts_with("hugepages-") {
                    found.push(("byte", bytes()));
                }
                if name.starts_with("attachable-volumes-") {
                    found.push(("byte", bytes()));
                }
                if is_extended(name) {
                    found.push(("integer", bytes()));
                }
            }
        }
        let resource = sanitize(name);
        for (unit, value) in found {
            let mut labels: Vec<(&'static str, &str)> = before.to_vec();
            labels.push(("resource", &resource));
            labels.push(("unit", unit));
            out.push(Series::with(&labels, value));
        }
    }
    out
}

/// An extended resource: a domain-prefixed name outside `kubernetes.io/`, not a quota's
/// `requests.` name, and a qualified name once `requests.` is put before it.
pub fn is_extended(name: &str) -> bool {
    let native = !name.contains('/') || name.contains("kubernetes.io/");
    if native || name.starts_with("requests.") {
        return false;
    }
    is_qualified_name(&format!("requests.{name}"))
}

/// `prefix/name` with a DNS-subdomain prefix (at most 253) and a name of at most 63
/// alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    name_ok && prefix_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        items.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect()
    }

    fn flat(s: &[Series]) -> Vec<(String, f64)> {
        s.iter()
            .map(|s| (s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","), s.value))
            .collect()
    }

    #[test]
    fn units_and_values() {
        let l = list(&[
            ("cpu", "250m"),
            ("memory", "128Mi"),
            ("ephemeral-storage", "1Gi"),
            ("hugepages-2Mi", "4Mi"),
            ("nvidia.com/gpu", "2"),
            ("kubernetes.io/foo", "1"),
            ("pods", "110"),
        ]);
        let c = flat(&series(Some(&l), Owner::Container, &[("container", "app")]));
        assert_eq!(
            c,
            [
                ("container=app,resource=cpu,unit=core".to_string(), 0.25),
                ("container=app,resource=ephemeral_storage,unit=byte".to_string(), 1073741824.0),
                ("container=app,resource=hugepages_2Mi,unit=byte".to_string(), 4194304.0),
                ("container=app,resource=memory,unit=byte".to_string(), 134217728.0),
                ("container=app,resource=nvidia_com_gpu,unit=integer".to_string(), 2.0),
            ]
        );
        let n = flat(&series(Some(&l), Owner::Node, &[]));
        assert!(n.contains(&("resource=pods,unit=integer".to_string(), 110.0)));
        assert!(series(None, Owner::Node, &[]).is_empty());
    }

    #[test]
    fn extended_names() {
        assert!(is_extended("example.com/dongle"));
        assert!(!is_extended("cpu"));
        assert!(!is_extended("kubernetes.io/thing"));
        assert!(!is_extended("requests.example.com/x"));
        assert!(!is_extended("Bad_Domain/x"));
        assert_eq!(sanitize("a.b/c-d"), "a_b_c_d");
    }
}
