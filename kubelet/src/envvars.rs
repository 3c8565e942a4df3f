//! The Service environment variables of a container, as the kubelet sets them: for every
//! Service of the pod's namespace with a cluster IP (when the pod's `enableServiceLinks` is
//! not false) and always for the `kubernetes` Service of the `default` namespace, the
//! Docker-links-style variables `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT`,
//! `<NAME>_SERVICE_PORT_<PORT NAME>`, `<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>` and its
//! `_PROTO`, `_PORT`, `_ADDR`. In-cluster clients find the apiserver through
//! `KUBERNETES_SERVICE_HOST` / `KUBERNETES_SERVICE_PORT`. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

/// The namespace and names of the Services every pod gets variables for.
const MASTER_NAMESPACE: &str = "default";
const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// `my-svc` → `MY_SVC`.
fn var_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

fn cluster_ip(s: &Service) -> Option<&str> {
    s.spec.as_ref()?.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None")
}

/// The Services whose variables a pod of `namespace` gets: its namespace's (with service
/// links on) by name, the master Services unless one of the namespace's has that name.
pub fn visible<'a>(services: &'a [Service], namespace: &str, service_links: bool) -> Vec<&'a Service> {
    let mut by_name: BTreeMap<&str, &Service> = BTreeMap::new();
    for s in services.iter().filter(|s| cluster_ip(s).is_some()) {
        let name = s.metadata.name.as_deref().unwrap_or_default();
        let ns = s.metadata.namespace.as_deref().unwrap_or_default();
        if ns == namespace && service_links {
            by_name.insert(name, s);
        } else if ns == MASTER_NAMESPACE && MASTER_SERVICES.contains(&name) {
            by_name.entry(name).or_insert(s);
        }
    }
    by_name.into_values().collect()
}

/// The variables of `services` (already filtered by [`visible`]).
pub fn from_services(services: &[&Service]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in services {
        let Some(ip) = cluster_ip(s) else { continue };
        let prefix = var_name(s.metadata.name.as_deref().unwrap_or_default());
        let ports = s.spec.as_ref().and_then(|sp| sp.ports.as_deref()).unwrap_or_default();
        out.push((format!("{prefix}_SERVICE_HOST"), ip.to_string()));
        if let Some(first) = ports.first() {
            out.push((format!("{prefix}_SERVICE_PORT"), first.port.to_string()));
        }
        for p in ports {
            if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((format!("{prefix}_SERVICE_PORT_{}", var_name(name)), p.port.to_string()));
            }
        }
        let host_port = |port: i32| if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let url = format!("{}://{}", proto.to_lowercase(), host_port(p.port));
            if i == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            out.push((port_prefix.clone(), url));
            out.push((format!("{port_prefix}_PROTO"), proto.to_lowercase()));
            out.push((format!("{port_prefix}_PORT"), p.port.to_string()));
            out.push((format!("{port_prefix}_ADDR"), ip.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": ports},
        }))
        .unwrap()
    }

    #[test]
    fn docker_links_style_variables() {
        let s = svc("app", "redis-primary", "10.96.0.7", json!([{"name": "redis", "port": 6379, "protocol": "TCP"}]));
        let env: BTreeMap<String, String> = from_services(&[&s]).into_iter().collect();
        let want: BTreeMap<String, String> = [
            ("REDIS_PRIMARY_SERVICE_HOST", "10.96.0.7"),
            ("REDIS_PRIMARY_SERVICE_PORT", "6379"),
            ("REDIS_PRIMARY_SERVICE_PORT_REDIS", "6379"),
            ("REDIS_PRIMARY_PORT", "tcp://10.96.0.7:6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP", "tcp://10.96.0.7:6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP_PROTO", "tcp"),
            ("REDIS_PRIMARY_PORT_6379_TCP_PORT", "6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP_ADDR", "10.96.0.7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(env, want);
        let v6 = svc("app", "dns", "fd00::a", json!([{"port": 53, "protocol": "UDP"}]));
        let env: BTreeMap<String, String> = from_services(&[&v6]).into_iter().collect();
        assert_eq!(env["DNS_PORT"], "udp://[fd00::a]:53");
        assert!(!env.contains_key("DNS_SERVICE_PORT_"), "unnamed ports have no named variable");
    }

    #[test]
    fn which_services_a_pod_sees() {
        let all = vec![
            svc("default", "kubernetes", "10.96.0.1", json!([{"name": "https", "port": 443}])),
            svc("default", "other", "10.96.0.9", json!([{"port": 80}])),
            svc("app", "web", "10.96.0.2", json!([{"port": 80}])),
            svc("app", "headless", "None", json!([{"port": 80}])),
            svc("app", "external", "", json!([])),
            svc("team", "kubernetes", "10.96.0.3", json!([{"port": 1}])),
        ];
        let names = |v: Vec<&Service>| {
            v.iter()
                .map(|s| {
                    format!("{}/{}", s.metadata.namespace.as_deref().unwrap(), s.metadata.name.as_deref().unwrap())
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(names(visible(&all, "app", true)), ["default/kubernetes", "app/web"]);
        assert_eq!(names(visible(&all, "app", false)), ["default/kubernetes"], "links off: the master service only");
        assert_eq!(names(visible(&all, "team", true)), ["team/kubernetes"], "the namespace's own wins");
        assert_eq!(names(visible(&all, "default", true)), ["default/kubernetes", "default/other"]);
    }
}
