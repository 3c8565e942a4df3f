//! One module per kind, each a pure function from that kind's objects to its metric
//! families, and the list of kinds `--resources` chooses from.

pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod horizontalpodautoscaler;
pub mod job;
pub mod namespace;
pub mod node;
pub mod persistentvolumeclaim;
pub mod pod;
pub mod replicaset;
pub mod service;
pub mod statefulset;

/// Every resource this exporter can export, by the upstream `--resources` names, in the
/// order their families are written.
pub const RESOURCES: &[&str] = &[
    "cronjobs",
    "daemonsets",
    "deployments",
    "horizontalpodautoscalers",
    "jobs",
    "namespaces",
    "nodes",
    "persistentvolumeclaims",
    "pods",
    "replicasets",
    "services",
    "statefulsets",
];

/// The resources a `--resources` value names (comma-separated; empty means all), in
/// [`RESOURCES`] order, without duplicates.
pub fn parse_resources(spec: &str) -> Result<Vec<&'static str>, String> {
    let wanted: Vec<&str> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if wanted.is_empty() {
        return Ok(RESOURCES.to_vec());
    }
    if let Some(unknown) = wanted.iter().find(|w| !RESOURCES.contains(w)) {
        return Err(format!("resource {unknown:?} is not known (known: {})", RESOURCES.join(", ")));
    }
    Ok(RESOURCES.iter().copied().filter(|r| wanted.contains(r)).collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::render::{write, Family};

    /// The families as text.
    pub fn render_text(families: &[Family]) -> String {
        let mut out = String::new();
        write(&mut out, families);
        out
    }

    /// The text's lines.
    pub fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn resources_flag() {
        assert_eq!(parse_resources("").unwrap(), RESOURCES);
        assert_eq!(parse_resources("pods, nodes,pods").unwrap(), ["nodes", "pods"]);
        assert!(parse_resources("pods,secrets").unwrap_err().contains("\"secrets\" is not known"));
    }
}
