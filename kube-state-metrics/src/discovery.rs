//! Prometheus service discovery of the cluster's targets, served as Prometheus' HTTP
//! service discovery (`GET /sd/<role>`: a JSON list of `{targets, labels}` groups) with the
//! targets and `__meta_kubernetes_*` labels that Prometheus' own Kubernetes discovery
//! gives for the roles `node`, `pod`, `endpoints` and `service`, so that the same
//! relabelling rules work with either.
//!
//! Why it exists: Debian builds Prometheus without its Kubernetes discovery (the client
//! library's dependencies are not packaged), so a Prometheus installed from Debian reaches
//! the API through this instead; an upstream Prometheus can use `kubernetes_sd_configs`
//! with the same relabelling. The exporter already holds the objects it needs.
//!
//! Everything here is pure: objects in, target groups out.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

/// One target and its labels (Prometheus' HTTP discovery format).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TargetGroup {
    pub targets: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// The roles served, by their `kubernetes_sd_configs` names.
pub const ROLES: &[&str] = &["node", "pod", "endpoints", "service"];

const META: &str = "__meta_kubernetes_";

/// A label name as Prometheus makes it from a Kubernetes key: every character other
/// than an ASCII letter, digit or underscore becomes `_`.
pub fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// `<prefix>label_<k>`, `<prefix>labelpresent_<k>`, and the same for annotations.
fn meta_maps(labels: &mut BTreeMap<String, String>, prefix: &str, meta: &ObjectMeta) {
    for (kind, map) in [("label", &meta.labels), ("annotation", &meta.annotations)] {
        for (k, v) in map.iter().flatten() {
            let k = sanitize(k);
            labels.insert(format!("{prefix}{kind}_{k}"), v.clone());
            labels.insert(format!("{prefix}{kind}present_{k}"), "true".into());
        }
    }
}

fn host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Role `node`: one target per Node, its first address of InternalIP, InternalDNS,
/// ExternalIP, ExternalDNS, Hostname (Prometheus' order) with the kubelet's port.
pub fn nodes(nodes: &[&Node]) -> Vec<TargetGroup> {
    let mut out = Vec::new();
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let status = n.status.clone().unwrap_or_default();
        let addresses = status.addresses.unwrap_or_default();
        let address = ["InternalIP", "InternalDNS", "ExternalIP", "ExternalDNS", "Hostname"]
            .iter()
            .find_map(|t| addresses.iter().find(|a| a.type_ == *t).map(|a| a.address.clone()));
        let Some(address) = address else { continue };
        let port = status.daemon_endpoints.and_then(|d| d.kubelet_endpoint).map_or(10250, |e| e.port);
        let mut labels = BTreeMap::new();
        labels.insert("instance".to_string(), name.clone());
        labels.insert(format!("{META}node_name"), name);
        labels.insert(
            format!("{META}node_provider_id"),
            n.spec.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default(),
        );
        meta_maps(&mut labels, &format!("{META}node_"), &n.metadata);
        for a in &addresses {
            labels.entry(format!("{META}node_address_{}", a.type_)).or_insert_with(|| a.address.clone());
        }
        out.push(TargetGroup { targets: vec![host_port(&address, port)], labels });
    }
    out
}

/// The labels every target of a pod carries.
fn pod_labels(p: &Pod) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    let status = p.status.clone().unwrap_or_default();
    let spec = p.spec.clone().unwrap_or_default();
    l.insert(format!("{META}namespace"), p.metadata.namespace.clone().unwrap_or_default());
    l.insert(format!("{META}pod_name"), p.metadata.name.clone().unwrap_or_default());
    l.insert(format!("{META}pod_ip"), status.pod_ip.clone().unwrap_or_default());
    l.insert(format!("{META}pod_node_name"), spec.node_name.clone().unwrap_or_default());
    l.insert(format!("{META}pod_host_ip"), status.host_ip.clone().unwrap_or_default());
    l.insert(format!("{META}pod_uid"), p.metadata.uid.clone().unwrap_or_default());
    l.insert(format!("{META}pod_phase"), status.phase.clone().unwrap_or_default());
    let ready = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map_or("unknown".to_string(), |c| c.status.to_lowercase());
    l.insert(format!("{META}pod_ready"), ready);
    if let Some(owner) = p.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true)) {
        l.insert(format!("{META}pod_controller_kind"), owner.kind.clone());
        l.insert(format!("{META}pod_controller_name"), owner.name.clone());
    }
    meta_maps(&mut l, &format!("{META}pod_"), &p.metadata);
    l
}

/// Role `pod`: one target per declared container port (`<pod IP>:<port>`), and one
/// without a port for each container that declares none. Pods without an IP have none.
pub fn pods(pods: &[&Pod]) -> Vec<TargetGroup> {
    let mut out = Vec::new();
    for p in pods {
        let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()).filter(|ip| !ip.is_empty()) else { continue };
        let base = pod_labels(p);
        let spec = p.spec.clone().unwrap_or_default();
        let containers =
            spec.init_containers.iter().flatten().map(|c| (c, true)).chain(spec.containers.iter().map(|c| (c, false)));
        for (c, init) in containers {
            let mut labels = base.clone();
            labels.insert(format!("{META}pod_container_name"), c.name.clone());
            labels.insert(format!("{META}pod_container_image"), c.image.clone().unwrap_or_default());
            labels.insert(format!("{META}pod_container_init"), init.to_string());
            let ports = c.ports.clone().unwrap_or_default();
            if ports.is_empty() {
                if !init {
                    out.push(TargetGroup { targets: vec![ip.clone()], labels });
                }
                continue;
            }
            for port in ports {
                let mut labels = labels.clone();
                labels.insert(format!("{META}pod_container_port_name"), port.name.clone().unwrap_or_default());
                labels.insert(format!("{META}pod_container_port_number"), port.container_port.to_string());
                labels.insert(
                    format!("{META}pod_container_port_protocol"),
                    port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                );
                out.push(TargetGroup { targets: vec![host_port(&ip, port.container_port)], labels });
            }
        }
    }
    out
}

fn service_labels(s: &Service) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(format!("{META}namespace"), s.metadata.namespace.clone().unwrap_or_default());
    l.insert(format!("{META}service_name"), s.metadata.name.clone().unwrap_or_default());
    meta_maps(&mut l, &format!("{META}service_"), &s.metadata);
    l
}

/// Role `service`: one target per Service port, `<name>.<namespace>.svc:<port>`.
pub fn services(services: &[&Service]) -> Vec<TargetGroup> {
    let mut out = Vec::new();
    for s in services {
        let (name, ns) =
            (s.metadata.name.clone().unwrap_or_default(), s.metadata.namespace.clone().unwrap_or_default());
        let spec = s.spec.clone().unwrap_or_default();
        for port in spec.ports.iter().flatten() {
            let mut labels = service_labels(s);
            labels.insert(format!("{META}service_port_name"), port.name.clone().unwrap_or_default());
            labels.insert(format!("{META}service_port_number"), port.port.to_string());
            labels
                .insert(format!("{META}service_port_protocol"), port.protocol.clone().unwrap_or_else(|| "TCP".into()));
            labels.insert(format!("{META}service_type"), spec.type_.clone().unwrap_or_else(|| "ClusterIP".into()));
            labels.insert(format!("{META}service_cluster_ip"), spec.cluster_ip.clone().unwrap_or_default());
            out.push(TargetGroup { targets: vec![format!("{name}.{ns}.svc:{}", port.port)], labels });
        }
    }
    out
}

/// Role `endpoints`: one target per address and port of each Endpoints object, with its
/// Service's labels and, for addresses of pods, the pod's.
pub fn endpoints(endpoints: &[&Endpoints], services: &[&Service], pods: &[&Pod]) -> Vec<TargetGroup> {
    let key = |m: &ObjectMeta| (m.namespace.clone().unwrap_or_default(), m.name.clone().unwrap_or_default());
    let services: HashMap<_, _> = services.iter().map(|s| (key(&s.metadata), *s)).collect();
    let pods: HashMap<_, _> = pods.iter().map(|p| (key(&p.metadata), *p)).collect();
    let mut out = Vec::new();
    for e in endpoints {
        let (ns, name) = key(&e.metadata);
        let mut base = BTreeMap::new();
        if let Some(s) = services.get(&(ns.clone(), name.clone())) {
            base = service_labels(s);
        }
        base.insert(format!("{META}namespace"), ns.clone());
        base.insert(format!("{META}endpoints_name"), name.clone());
        meta_maps(&mut base, &format!("{META}endpoints_"), &e.metadata);
        for subset in e.subsets.iter().flatten() {
            let ready = subset.addresses.iter().flatten().map(|a| (a, true));
            let not_ready = subset.not_ready_addresses.iter().flatten().map(|a| (a, false));
            for (addr, is_ready) in ready.chain(not_ready) {
                for port in subset.ports.iter().flatten() {
                    let mut labels = base.clone();
                    labels.insert(format!("{META}endpoint_port_name"), port.name.clone().unwrap_or_default());
                    labels.insert(
                        format!("{META}endpoint_port_protocol"),
                        port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    );
                    labels.insert(format!("{META}endpoint_ready"), is_ready.to_string());
                    if let Some(node) = &addr.node_name {
                        labels.insert(format!("{META}endpoint_node_name"), node.clone());
                    }
                    if let Some(host) = &addr.hostname {
                        labels.insert(format!("{META}endpoint_hostname"), host.clone());
                    }
                    if let Some(t) = &addr.target_ref {
                        let kind = t.kind.clone().unwrap_or_default();
                        let tname = t.name.clone().unwrap_or_default();
                        labels.insert(format!("{META}endpoint_address_target_kind"), kind.clone());
                        labels.insert(format!("{META}endpoint_address_target_name"), tname.clone());
                        if kind == "Pod" {
                            let pns = t.namespace.clone().unwrap_or_else(|| ns.clone());
                            if let Some(p) = pods.get(&(pns, tname)) {
                                labels.extend(pod_labels(p));
                            }
                        }
                    }
                    out.push(TargetGroup { targets: vec![host_port(&addr.ip, port.port)], labels });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn labels_of(g: &TargetGroup) -> &BTreeMap<String, String> {
        &g.labels
    }

    #[test]
    fn names_are_sanitized_as_prometheus_does() {
        assert_eq!(sanitize("prometheus.io/scrape"), "prometheus_io_scrape");
        assert_eq!(sanitize("app.kubernetes.io/name-x"), "app_kubernetes_io_name_x");
    }

    #[test]
    fn node_targets_are_the_kubelets() {
        let n: Node = obj(json!({
            "metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}},
            "spec": {"providerID": "local://node-1"},
            "status": {"addresses": [{"type": "Hostname", "address": "h1"}, {"type": "InternalIP", "address": "10.0.0.5"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": 12345}}}
        }));
        let g = nodes(&[&n]);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].targets, ["10.0.0.5:12345"]);
        let l = labels_of(&g[0]);
        assert_eq!(l["instance"], "node-1");
        assert_eq!(l["__meta_kubernetes_node_name"], "node-1");
        assert_eq!(l["__meta_kubernetes_node_label_kubernetes_io_hostname"], "node-1");
        assert_eq!(l["__meta_kubernetes_node_labelpresent_kubernetes_io_hostname"], "true");
        assert_eq!(l["__meta_kubernetes_node_address_InternalIP"], "10.0.0.5");
        assert_eq!(l["__meta_kubernetes_node_provider_id"], "local://node-1");
        let no_address: Node = obj(json!({"metadata": {"name": "x"}}));
        assert!(nodes(&[&no_address]).is_empty());
    }

    #[test]
    fn pod_targets_per_container_port() {
        let p: Pod = obj(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1",
                         "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8080"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "r", "controller": true}]},
            "spec": {"nodeName": "node-1", "containers": [
                {"name": "app", "image": "busybox", "ports": [{"containerPort": 8080, "name": "http"}, {"containerPort": 53, "protocol": "UDP"}]},
                {"name": "side", "image": "busybox"}]},
            "status": {"phase": "Running", "podIP": "10.244.1.7", "hostIP": "10.0.0.5",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }));
        let g = pods(&[&p]);
        let targets: Vec<&str> = g.iter().map(|g| g.targets[0].as_str()).collect();
        assert_eq!(targets, ["10.244.1.7:8080", "10.244.1.7:53", "10.244.1.7"]);
        let l = labels_of(&g[0]);
        assert_eq!(l["__meta_kubernetes_pod_annotation_prometheus_io_scrape"], "true");
        assert_eq!(l["__meta_kubernetes_pod_container_port_name"], "http");
        assert_eq!(l["__meta_kubernetes_pod_container_port_number"], "8080");
        assert_eq!(l["__meta_kubernetes_pod_container_port_protocol"], "TCP");
        assert_eq!(l["__meta_kubernetes_pod_phase"], "Running");
        assert_eq!(l["__meta_kubernetes_pod_ready"], "true");
        assert_eq!(l["__meta_kubernetes_pod_controller_kind"], "ReplicaSet");
        assert_eq!(l["__meta_kubernetes_pod_node_name"], "node-1");
        assert_eq!(labels_of(&g[1])["__meta_kubernetes_pod_container_port_protocol"], "UDP");
        assert_eq!(labels_of(&g[2])["__meta_kubernetes_pod_container_name"], "side");
        let pending: Pod = obj(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}}));
        assert!(pods(&[&pending]).is_empty(), "no IP, no target");
    }

    #[test]
    fn endpoint_targets_carry_service_and_pod_labels() {
        let s: Service = obj(json!({
            "metadata": {"name": "kube-scheduler", "namespace": "kube-system", "labels": {"minik8s.io/metrics": "true"}},
            "spec": {"clusterIP": "None", "ports": [{"name": "http-metrics", "port": 10259}]}
        }));
        let p: Pod = obj(json!({"metadata": {"name": "web-1", "namespace": "kube-system"},
                                "spec": {"containers": []}, "status": {"podIP": "10.244.0.9", "phase": "Running"}}));
        let e: Endpoints = obj(json!({
            "metadata": {"name": "kube-scheduler", "namespace": "kube-system"},
            "subsets": [{"addresses": [{"ip": "10.0.0.5"}, {"ip": "10.244.0.9", "targetRef": {"kind": "Pod", "name": "web-1"}}],
                         "notReadyAddresses": [{"ip": "10.0.0.6"}],
                         "ports": [{"name": "http-metrics", "port": 10259, "protocol": "TCP"}]}]
        }));
        let g = endpoints(&[&e], &[&s], &[&p]);
        let targets: Vec<&str> = g.iter().map(|g| g.targets[0].as_str()).collect();
        assert_eq!(targets, ["10.0.0.5:10259", "10.244.0.9:10259", "10.0.0.6:10259"]);
        let l = labels_of(&g[0]);
        assert_eq!(l["__meta_kubernetes_service_name"], "kube-scheduler");
        assert_eq!(l["__meta_kubernetes_service_label_minik8s_io_metrics"], "true");
        assert_eq!(l["__meta_kubernetes_endpoint_port_name"], "http-metrics");
        assert_eq!(l["__meta_kubernetes_endpoint_ready"], "true");
        assert_eq!(labels_of(&g[1])["__meta_kubernetes_pod_name"], "web-1");
        assert_eq!(labels_of(&g[2])["__meta_kubernetes_endpoint_ready"], "false");
        let svc = services(&[&s]);
        assert_eq!(svc[0].targets, ["kube-scheduler.kube-system.svc:10259"]);
        assert_eq!(
            serde_json::to_value(&svc[0]).unwrap()["labels"]["__meta_kubernetes_service_port_name"],
            "http-metrics"
        );
    }
}
