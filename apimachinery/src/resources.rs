//! Resource names as Kubernetes classifies them (`v1helper`): native resources (`cpu`,
//! `memory`, anything under a `kubernetes.io` domain), hugepages, and extended resources
//! (`vendor.com/widget`: counted in whole units, never overcommitted, so a container's
//! request must equal its limit). The apiserver's validation, the scheduler and the
//! kubelet's device manager share these rules.

use crate::validation::qualified_name_errors;

/// No domain, or a domain that is or ends in `kubernetes.io`.
pub fn is_native(name: &str) -> bool {
    !name.contains('/') || name.contains("kubernetes.io/")
}

pub fn is_hugepages(name: &str) -> bool {
    name.starts_with("hugepages-")
}

/// A domain-qualified name outside `kubernetes.io` that can also be quota'd as
/// `requests.<name>`.
pub fn is_extended(name: &str) -> bool {
    !is_native(name) && !name.starts_with("requests.") && qualified_name_errors(&format!("requests.{name}")).is_none()
}

/// Whether a request may be below the limit (native resources except hugepages).
pub fn is_overcommit_allowed(name: &str) -> bool {
    is_native(name) && !is_hugepages(name)
}

/// Whether quantities of the resource must be whole numbers.
pub fn is_integer(name: &str) -> bool {
    is_extended(name) || name == "pods"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        for n in ["cpu", "memory", "ephemeral-storage", "example.kubernetes.io/x", "kubernetes.io/x"] {
            assert!(is_native(n), "{n}");
            assert!(!is_extended(n), "{n}");
        }
        for n in ["nvidia.com/gpu", "example.com/widget"] {
            assert!(is_extended(n), "{n}");
            assert!(!is_overcommit_allowed(n), "{n}");
            assert!(is_integer(n), "{n}");
        }
        assert!(!is_extended("requests.example.com/x"));
        assert!(!is_extended("bad domain/x"));
        assert!(is_hugepages("hugepages-2Mi") && !is_overcommit_allowed("hugepages-2Mi"));
        assert!(is_overcommit_allowed("cpu"));
    }
}
