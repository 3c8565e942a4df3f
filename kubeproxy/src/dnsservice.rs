//! How pods reach the cluster DNS, the Kubernetes way: a `kube-dns` Service in `kube-system`
//! with a fixed cluster IP (the kubelets' `--cluster-dns`, conventionally 10.96.0.10) and
//! ports `dns` 53/UDP and `dns-tcp` 53/TCP. It has no selector: its endpoints are the DNS
//! servers of the kubeproxies, each publishing one EndpointSlice (`<service>-<node>`) with
//! its `--node-ip` and the port its DNS server listens on. The Service routing rules then
//! DNAT `10.96.0.10:53` to a node's DNS server like any other Service.
//!
//! [`service`] and [`endpoint_slice`] are pure; [`run`] keeps them in the API.

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::model::LABEL_SERVICE_NAME;

/// The manager label of the slices kubeproxy publishes (the EndpointSlice controller leaves them alone).
pub const MANAGED_BY: &str = "kubeproxy.minik8s.io";

/// What to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publish {
    pub namespace: String,
    pub name: String,
    /// Create the Service with this cluster IP when it does not exist.
    pub cluster_ip: Option<Ipv4Addr>,
    pub node: String,
    pub node_ip: Ipv4Addr,
    /// The port the DNS server listens on (UDP and TCP).
    pub port: u16,
}

/// Parse `NAMESPACE/NAME`.
pub fn parse_service(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
    }
}

/// The selector-less DNS Service (kubeadm's `kube-dns`).
pub fn service(p: &Publish, cluster_ip: Ipv4Addr) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": p.name, "namespace": p.namespace,
            "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "kube-dns", "kubernetes.io/cluster-service": "true"}},
        "spec": {"clusterIP": cluster_ip.to_string(), "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": p.port},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": p.port}]}
    }))
    .unwrap_or_default()
}

/// The name of this node's slice.
pub fn slice_name(p: &Publish) -> String {
    let mut n = format!("{}-{}", p.name, p.node);
    n.truncate(253);
    n
}

/// This node's EndpointSlice of the DNS Service.
pub fn endpoint_slice(p: &Publish) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": slice_name(p), "namespace": p.namespace,
            "labels": {LABEL_SERVICE_NAME: p.name, "endpointslice.kubernetes.io/managed-by": MANAGED_BY}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [p.node_ip.to_string()], "nodeName": p.node,
            "conditions": {"ready": true, "serving": true, "terminating": false}}],
        "ports": [{"name": "dns", "port": p.port, "protocol": "UDP"},
                  {"name": "dns-tcp", "port": p.port, "protocol": "TCP"}]
    }))
    .unwrap_or_default()
}

/// Keep the Service (when asked to create it) and this node's slice in the API; checks again
/// every `period` (a deleted slice comes back).
pub async fn run(client: kube::Client, p: Publish, period: Duration) {
    let services: Api<Service> = Api::namespaced(client.clone(), &p.namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client, &p.namespace);
    let pp = PatchParams::apply("kubeproxy").force();
    let mut published = false;
    loop {
        let result: anyhow::Result<()> = async {
            if let Some(ip) = p.cluster_ip {
                if services.get_opt(&p.name).await?.is_none() {
                    match services.create(&PostParams::default(), &service(&p, ip)).await {
                        Ok(_) => tracing::info!(service = %format!("{}/{}", p.namespace, p.name), cluster_ip = %ip, "created the cluster DNS Service"),
                        Err(kube::Error::Api(e)) if e.code == 409 => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            slices.patch(&slice_name(&p), &pp, &Patch::Apply(&endpoint_slice(&p))).await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) if !published => {
                published = true;
                tracing::info!(slice = %slice_name(&p), endpoint = %format!("{}:{}", p.node_ip, p.port), "published this node's DNS server as an endpoint of the cluster DNS Service");
            }
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "publishing the DNS endpoint failed; retrying"),
        }
        tokio::time::sleep(if published { period } else { Duration::from_secs(2) }).await;
    }
}

/// Remove this node's slice (on a graceful stop), so other nodes stop sending queries to a
/// DNS server that is gone. At most 3 s.
pub async fn unpublish(client: kube::Client, p: &Publish) {
    let slices: Api<EndpointSlice> = Api::namespaced(client, &p.namespace);
    let name = slice_name(p);
    match tokio::time::timeout(Duration::from_secs(3), slices.delete(&name, &Default::default())).await {
        Ok(Ok(_)) => tracing::info!(slice = %name, "withdrew this node's DNS endpoint"),
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => {}
        Ok(Err(e)) => tracing::warn!(slice = %name, error = %e, "cannot withdraw this node's DNS endpoint"),
        Err(_) => tracing::warn!(slice = %name, "withdrawing this node's DNS endpoint timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{service_ports, NodeInfo};

    fn publish() -> Publish {
        Publish {
            namespace: "kube-system".into(),
            name: "kube-dns".into(),
            cluster_ip: Some("10.96.0.10".parse().unwrap()),
            node: "node-1".into(),
            node_ip: "192.0.2.2".parse().unwrap(),
            port: 10053,
        }
    }

    #[test]
    fn service_and_slice_route_the_dns_ip_to_this_node() {
        let p = publish();
        let svc = service(&p, "10.96.0.10".parse().unwrap());
        let spec = svc.spec.as_ref().unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.10"));
        assert!(spec.selector.is_none(), "selector-less: the EndpointSlice controller does not manage it");
        let slice = endpoint_slice(&p);
        assert_eq!(slice.metadata.name.as_deref(), Some("kube-dns-node-1"));
        // The proxy model turns them into 10.96.0.10:53 → 192.0.2.2:10053, UDP and TCP.
        let ports = service_ports(&[svc], &[slice], &NodeInfo::named("node-1"));
        assert_eq!(ports.len(), 2);
        for sp in &ports {
            assert_eq!(sp.port, 53);
            let eps: Vec<String> = sp.all_endpoints.iter().map(|e| format!("{}:{}", e.ip, e.port)).collect();
            assert_eq!(eps, ["192.0.2.2:10053"]);
        }
    }

    #[test]
    fn service_names_parse() {
        assert_eq!(parse_service("kube-system/kube-dns").unwrap(), ("kube-system".into(), "kube-dns".into()));
        assert!(parse_service("kube-dns").is_err());
        assert!(parse_service("/x").is_err());
        assert!(parse_service("a/b/c").is_err());
    }
}
