//! Nodes: `kube_node_*`, each series labelled `node` first.

use k8s_openapi::api::core::v1::Node;

use crate::render::{self, alpha, gauge, Family, Gen, Series};
use crate::resource::{self, Owner};

/// The nodes' families, in the upstream exporter's order.
pub fn families(nodes: &[&Node]) -> Vec<Family> {
    render::families(nodes, &generators(), |n| vec![("node", render::name_of(&n.metadata))])
}

fn generators() -> Vec<Gen<Node>> {
    vec![
        gauge("kube_node_created", "Unix creation timestamp", |n| {
            render::timestamp(n.metadata.creation_timestamp.as_ref())
        }),
        alpha("kube_node_deletion_timestamp", "Unix deletion timestamp", |n| {
            render::timestamp(n.metadata.deletion_timestamp.as_ref())
        }),
        gauge("kube_node_info", "Information about a cluster node.", info),
        alpha("kube_node_role", "The role of a cluster node.", |n| {
            n.metadata
                .labels
                .iter()
                .flatten()
                .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
                .map(|role| Series::with(&[("role", role)], 1.0))
                .collect()
        }),
        alpha("kube_node_spec_pod_cidrs", "The pod CIDRs of a cluster node.", |n| {
            let cidrs = n.spec.as_ref().and_then(|s| s.pod_cidrs.as_deref()).unwrap_or_default();
            cidrs.iter().map(|c| Series::with(&[("pod_cidr", c)], 1.0)).collect()
        }),
        gauge("kube_node_spec_taint", "The taint of a cluster node.", |n| {
            let taints = n.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
            taints
                .iter()
                .map(|t| {
                    Series::with(
                        &[("key", &t.key), ("value", t.value.as_deref().unwrap_or_default()), ("effect", &t.effect)],
                        1.0,
                    )
                })
                .collect()
        }),
        gauge("kube_node_spec_unschedulable", "Whether a node can schedule new pods.", |n| {
            render::one(render::bool_value(n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)))
        }),
        gauge(
            "kube_node_status_allocatable",
            "The allocatable for different resources of a node that are available for scheduling.",
            |n| resource::series(n.status.as_ref().and_then(|s| s.allocatable.as_ref()), Owner::Node, &[]),
        ),
        gauge("kube_node_status_capacity", "The capacity for different resources of a node.", |n| {
            resource::series(n.status.as_ref().and_then(|s| s.capacity.as_ref()), Owner::Node, &[])
        }),
        gauge("kube_node_status_condition", "The condition of a cluster node.", |n| {
            let conditions = n.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
            conditions
                .iter()
                .flat_map(|c| render::condition_series(&[("condition", &c.type_)], "status", &c.status))
                .collect()
        }),
        alpha("kube_node_status_addresses", "Node address information.", |n| {
            let addresses = n.status.as_ref().and_then(|s| s.addresses.as_deref()).unwrap_or_default();
            addresses.iter().map(|a| Series::with(&[("type", &a.type_), ("address", &a.address)], 1.0)).collect()
        }),
    ]
}

fn info(n: &Node) -> Vec<Series> {
    let status = n.status.as_ref();
    let ni = status.and_then(|s| s.node_info.as_ref());
    let spec = n.spec.as_ref();
    // The last InternalIP, as upstream picks it.
    let internal_ip = status
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().rev().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.as_str())
        .unwrap_or_default();
    vec![Series::with(
        &[
            ("kernel_version", ni.map(|i| i.kernel_version.as_str()).unwrap_or_default()),
            ("os_image", ni.map(|i| i.os_image.as_str()).unwrap_or_default()),
            ("container_runtime_version", ni.map(|i| i.container_runtime_version.as_str()).unwrap_or_default()),
            ("kubelet_version", ni.map(|i| i.kubelet_version.as_str()).unwrap_or_default()),
            // Upstream keeps the label but no longer fills it.
            ("kubeproxy_version", "deprecated"),
            ("provider_id", spec.and_then(|s| s.provider_id.as_deref()).unwrap_or_default()),
            ("pod_cidr", spec.and_then(|s| s.pod_cidr.as_deref()).unwrap_or_default()),
            ("system_uuid", ni.map(|i| i.system_uuid.as_str()).unwrap_or_default()),
            ("internal_ip", internal_ip),
        ],
        1.0,
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    #[test]
    fn conditions_capacity_and_taints() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "creationTimestamp": "2024-06-14T10:00:00Z",
                         "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"], "unschedulable": true,
                     "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "MemoryPressure", "status": "False"}
                ],
                "addresses": [{"type": "InternalIP", "address": "192.168.1.10"}, {"type": "Hostname", "address": "n1"}],
                "capacity": {"cpu": "4", "memory": "8047556Ki", "pods": "110", "ephemeral-storage": "100Gi"},
                "allocatable": {"cpu": "3500m", "memory": "7Gi", "pods": "110"},
                "nodeInfo": {"kernelVersion": "6.1.0", "osImage": "Debian", "containerRuntimeVersion": "docker://24.0.7",
                             "kubeletVersion": "v1.37.0", "kubeProxyVersion": "", "systemUUID": "abc", "bootID": "",
                             "machineID": "", "operatingSystem": "linux", "architecture": "amd64"}
            }
        }))
        .unwrap();
        let text = render_text(&families(&[&n]));
        assert!(text.contains(concat!(
            "# HELP kube_node_status_condition [STABLE] The condition of a cluster node.\n",
            "# TYPE kube_node_status_condition gauge\n",
            "kube_node_status_condition{node=\"n1\",condition=\"Ready\",status=\"true\"} 1\n",
            "kube_node_status_condition{node=\"n1\",condition=\"Ready\",status=\"false\"} 0\n",
            "kube_node_status_condition{node=\"n1\",condition=\"Ready\",status=\"unknown\"} 0\n",
            "kube_node_status_condition{node=\"n1\",condition=\"MemoryPressure\",status=\"true\"} 0\n",
            "kube_node_status_condition{node=\"n1\",condition=\"MemoryPressure\",status=\"false\"} 1\n",
            "kube_node_status_condition{node=\"n1\",condition=\"MemoryPressure\",status=\"unknown\"} 0\n",
        )));
        assert!(text.contains(concat!(
            "kube_node_status_allocatable{node=\"n1\",resource=\"cpu\",unit=\"core\"} 3.5\n",
            "kube_node_status_allocatable{node=\"n1\",resource=\"memory\",unit=\"byte\"} 7.516192768e+09\n",
            "kube_node_status_allocatable{node=\"n1\",resource=\"pods\",unit=\"integer\"} 110\n",
        )));
        let got = lines(&text);
        for w in [
            r#"kube_node_status_capacity{node="n1",resource="cpu",unit="core"} 4"#,
            r#"kube_node_status_capacity{node="n1",resource="ephemeral_storage",unit="byte"} 1.073741824e+11"#,
            r#"kube_node_status_capacity{node="n1",resource="memory",unit="byte"} 8.240697344e+09"#,
            r#"kube_node_spec_unschedulable{node="n1"} 1"#,
            r#"kube_node_spec_taint{node="n1",key="node.kubernetes.io/unschedulable",value="",effect="NoSchedule"} 1"#,
            r#"kube_node_info{node="n1",kernel_version="6.1.0",os_image="Debian",container_runtime_version="docker://24.0.7",kubelet_version="v1.37.0",kubeproxy_version="deprecated",provider_id="",pod_cidr="10.244.0.0/24",system_uuid="abc",internal_ip="192.168.1.10"} 1"#,
            r#"kube_node_created{node="n1"} 1.7183592e+09"#,
            r#"kube_node_role{node="n1",role="control-plane"} 1"#,
            r#"kube_node_spec_pod_cidrs{node="n1",pod_cidr="10.244.0.0/24"} 1"#,
            r#"kube_node_status_addresses{node="n1",type="Hostname",address="n1"} 1"#,
        ] {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
    }
}
