//! Objects for the generation tests.

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, Struct, Value as PbValue};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

use crate::model::{ConfigObject, ServiceIndex};
use crate::validate::Accepted;
use crate::xds::Mesh;

/// A Service in `default` selecting `app=<name>` with ports (name, port, targetPort).
pub fn service(name: &str, ip: &str, ports: &[(&str, u32, u32)]) -> Service {
    let ports: Vec<_> =
        ports.iter().map(|(n, p, t)| json!({"name": n, "port": p, "targetPort": t, "protocol": "TCP"})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": ip, "selector": {"app": name}, "ports": ports}
    }))
    .unwrap()
}

/// An EndpointSlice of Service `svc`: endpoints (ip, pod, ready, terminating) on ports
/// (name, port).
pub fn slice(svc: &str, ports: &[(&str, u32)], eps: &[(&str, &str, bool, bool)]) -> EndpointSlice {
    let ports: Vec<_> = ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect();
    let eps: Vec<_> = eps
        .iter()
        .map(|(ip, pod, ready, term)| {
            json!({"addresses": [ip], "conditions": {"ready": ready, "serving": *ready || *term, "terminating": term},
                   "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{svc}-abcde"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "ports": ports, "endpoints": eps
    }))
    .unwrap()
}

pub fn pod(name: &str, ip: &str, labels: &[(&str, &str)], ports: &[(u32, &str)]) -> Pod {
    let labels: serde_json::Map<String, serde_json::Value> =
        labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    let ports: Vec<_> = ports.iter().map(|(p, n)| json!({"containerPort": p, "name": n})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "app", "ports": ports},
                                {"name": "istio-proxy", "image": "envoy", "ports": [{"containerPort": 15090, "name": "http-envoy-prom"}]}]},
        "status": {"podIP": ip}
    }))
    .unwrap()
}

pub fn config(name: &str, spec: serde_json::Value) -> ConfigObject {
    ConfigObject {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        generation: 1,
        created: "2026-01-01T00:00:00Z".into(),
        spec,
    }
}

pub fn mesh_with(services: &[Service], slices: &[EndpointSlice], pods: &[Pod]) -> Mesh {
    mesh_full(services, slices, pods, &[], &[])
}

pub fn mesh_full(
    services: &[Service],
    slices: &[EndpointSlice],
    pods: &[Pod],
    vss: &[ConfigObject],
    drs: &[ConfigObject],
) -> Mesh {
    let index = ServiceIndex::build(services, "cluster.local");
    let (config, verdicts) = Accepted::default().reconcile(vss, drs, &index);
    for v in verdicts {
        assert!(v.valid(), "{v:?}");
    }
    Mesh::build(index, config, slices, pods)
}

pub fn node(ip: &str, pod: &str, ns: &str) -> Node {
    let s = |v: &str| PbValue { kind: Some(ValueKind::StringValue(v.to_string())) };
    let labels = Struct { fields: [("app".to_string(), s(pod))].into_iter().collect() };
    Node {
        id: format!("sidecar~{ip}~{pod}.{ns}~{ns}.svc.cluster.local"),
        cluster: pod.to_string(),
        metadata: Some(Struct {
            fields: [
                ("NAMESPACE".to_string(), s(ns)),
                ("POD_NAME".to_string(), s(pod)),
                ("INSTANCE_IPS".to_string(), s(ip)),
                ("LABELS".to_string(), PbValue { kind: Some(ValueKind::StructValue(labels)) }),
            ]
            .into_iter()
            .collect(),
        }),
        ..Default::default()
    }
}

/// The bookinfo-like mesh most tests use: `reviews` (http 9080, pods v1 and v2, one of
/// them terminating), `ratings` (grpc 50051), `db` (tcp 5432).
pub fn bookinfo() -> (Vec<Service>, Vec<EndpointSlice>, Vec<Pod>) {
    let services = vec![
        service("reviews", "10.96.0.10", &[("http", 9080, 9080)]),
        service("ratings", "10.96.0.11", &[("grpc", 50051, 50051)]),
        service("db", "10.96.0.12", &[("tcp-postgres", 5432, 5432)]),
    ];
    let slices = vec![
        slice(
            "reviews",
            &[("http", 9080)],
            &[
                ("10.1.0.1", "reviews-v1", true, false),
                ("10.1.0.2", "reviews-v2", true, false),
                ("10.1.0.3", "reviews-v2-old", false, true),
                ("10.1.0.4", "reviews-v2-starting", false, false),
            ],
        ),
        slice("ratings", &[("grpc", 50051)], &[("10.1.1.1", "ratings-1", true, false)]),
        slice("db", &[("tcp-postgres", 5432)], &[("10.1.2.1", "db-1", true, false)]),
    ];
    let pods = vec![
        pod("reviews-v1", "10.1.0.1", &[("app", "reviews"), ("version", "v1")], &[(9080, "http")]),
        pod("reviews-v2", "10.1.0.2", &[("app", "reviews"), ("version", "v2")], &[(9080, "http")]),
        pod("reviews-v2-old", "10.1.0.3", &[("app", "reviews"), ("version", "v2")], &[(9080, "http")]),
        pod("ratings-1", "10.1.1.1", &[("app", "ratings")], &[(50051, "grpc")]),
        pod("db-1", "10.1.2.1", &[("app", "db")], &[(5432, "tcp-postgres")]),
        pod("productpage", "10.1.3.1", &[("app", "productpage")], &[(9080, "http"), (9999, "admin")]),
    ];
    (services, slices, pods)
}

/// The DestinationRule of `reviews` with subsets v1 and v2.
pub fn reviews_rule(policy: serde_json::Value) -> ConfigObject {
    config(
        "reviews",
        json!({"host": "reviews", "trafficPolicy": policy, "subsets": [
            {"name": "v1", "labels": {"version": "v1"}},
            {"name": "v2", "labels": {"version": "v2"}, "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}]}),
    )
}
