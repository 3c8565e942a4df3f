//! Services: `kube_service_*`, each series labelled `namespace`, `service`, `uid` first.

use k8s_openapi::api::core::v1::Service;

use crate::render::{self, alpha, gauge, Family, Gen, Series};

/// The services' families, in the upstream exporter's order.
pub fn families(services: &[&Service]) -> Vec<Family> {
    render::families(services, &generators(), |s| {
        vec![
            ("namespace", render::namespace_of(&s.metadata)),
            ("service", render::name_of(&s.metadata)),
            ("uid", s.metadata.uid.clone().unwrap_or_default()),
        ]
    })
}

fn generators() -> Vec<Gen<Service>> {
    vec![
        gauge("kube_service_info", "Information about service.", |s| {
            let spec = s.spec.as_ref();
            let field = |f: fn(&k8s_openapi::api::core::v1::ServiceSpec) -> Option<&String>| {
                spec.and_then(f).map(String::as_str).unwrap_or_default()
            };
            vec![Series::with(
                &[
                    ("cluster_ip", field(|s| s.cluster_ip.as_ref())),
                    ("external_name", field(|s| s.external_name.as_ref())),
                    ("load_balancer_ip", field(|s| s.load_balancer_ip.as_ref())),
                    ("external_traffic_policy", field(|s| s.external_traffic_policy.as_ref())),
                ],
                1.0,
            )]
        }),
        gauge("kube_service_created", "Unix creation timestamp", |s| {
            render::timestamp(s.metadata.creation_timestamp.as_ref())
        }),
        gauge("kube_service_spec_type", "Type about service.", |s| {
            let t = s.spec.as_ref().and_then(|s| s.type_.as_deref()).unwrap_or_default();
            vec![Series::with(&[("type", t)], 1.0)]
        }),
        gauge("kube_service_spec_external_ip", "Service external ips. One series for each ip", |s| {
            let ips = s.spec.as_ref().and_then(|s| s.external_ips.as_deref()).unwrap_or_default();
            ips.iter().map(|ip| Series::with(&[("external_ip", ip)], 1.0)).collect()
        }),
        gauge("kube_service_status_load_balancer_ingress", "Service load balancer ingress status", |s| {
            let ingress = s
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_deref())
                .unwrap_or_default();
            ingress
                .iter()
                .map(|i| {
                    Series::with(
                        &[
                            ("ip", i.ip.as_deref().unwrap_or_default()),
                            ("hostname", i.hostname.as_deref().unwrap_or_default()),
                        ],
                        1.0,
                    )
                })
                .collect()
        }),
        alpha("kube_service_deletion_timestamp", "Unix deletion timestamp", |s| {
            render::timestamp(s.metadata.deletion_timestamp.as_ref())
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{lines, render_text};
    use serde_json::json;

    #[test]
    fn load_balancer() {
        let s: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "s1"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "externalTrafficPolicy": "Local", "externalIPs": ["1.2.3.4"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.168.1.240"}]}}
        }))
        .unwrap();
        let text = render_text(&families(&[&s]));
        let got = lines(&text);
        for w in [
            r#"kube_service_info{namespace="default",service="web",uid="s1",cluster_ip="10.96.0.10",external_name="",load_balancer_ip="",external_traffic_policy="Local"} 1"#,
            r#"kube_service_spec_type{namespace="default",service="web",uid="s1",type="LoadBalancer"} 1"#,
            r#"kube_service_spec_external_ip{namespace="default",service="web",uid="s1",external_ip="1.2.3.4"} 1"#,
            r#"kube_service_status_load_balancer_ingress{namespace="default",service="web",uid="s1",ip="192.168.1.240",hostname=""} 1"#,
        ] {
            assert!(got.contains(&w), "missing {w}\n{text}");
        }
    }
}
