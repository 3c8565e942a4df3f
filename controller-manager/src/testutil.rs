//! Object builders for the unit tests.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodSpec, PodStatus, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use crate::util::owner_ref;

pub fn at(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

/// "Now" in the tests: t = 1000 s.
pub fn now() -> Timestamp {
    at(1000)
}

pub fn lbl(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

pub fn template(pairs: &[(&str, &str)], image: &str) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some(lbl(pairs)), ..Default::default() }),
        spec: Some(PodSpec {
            containers: vec![Container { name: "c".into(), image: Some(image.into()), ..Default::default() }],
            ..Default::default()
        }),
    }
}

pub fn rs(name: &str, replicas: i32, sel: &[(&str, &str)]) -> ReplicaSet {
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            generation: Some(1),
            creation_timestamp: Some(Time(at(10))),
            ..Default::default()
        },
        spec: ReplicaSetSpec {
            replicas: Some(replicas),
            selector: LabelSelector { match_labels: Some(lbl(sel)), match_expressions: None },
            template: Some(template(sel, "nginx")),
            min_ready_seconds: None,
        },
        status: None,
    }
}

pub fn pod<K: Resource<DynamicType = ()>>(name: &str, labels: &[(&str, &str)], owner: Option<&K>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            labels: Some(lbl(labels)),
            owner_references: owner.map(|o| vec![owner_ref(o)]),
            creation_timestamp: Some(Time(at(20))),
            ..Default::default()
        },
        spec: Some(PodSpec::default()),
        status: Some(PodStatus { phase: Some("Pending".into()), ..Default::default() }),
    }
}

pub fn set_phase(p: &mut Pod, phase: &str) {
    p.status.get_or_insert_with(Default::default).phase = Some(phase.into());
}

/// Scheduled on `node`, Running, with Ready = `ready` since t = `since`.
pub fn make_running(p: &mut Pod, node: &str, ready: bool, since: i64) {
    p.spec.get_or_insert_with(Default::default).node_name = Some(node.into());
    p.metadata.creation_timestamp = Some(Time(at(since)));
    let st = p.status.get_or_insert_with(Default::default);
    st.phase = Some("Running".into());
    st.pod_ip = Some(format!("10.244.0.{}", since % 250 + 2));
    st.conditions = Some(vec![PodCondition {
        type_: "Ready".into(),
        status: if ready { "True" } else { "False" }.into(),
        last_transition_time: Some(Time(at(since))),
        ..Default::default()
    }]);
}

/// A Namespace `team` in `phase` (`Active`, `Terminating`).
pub fn namespace_in_phase(phase: &str) -> k8s_openapi::api::core::v1::Namespace {
    k8s_openapi::api::core::v1::Namespace {
        metadata: kube::api::ObjectMeta { name: Some("team".into()), ..Default::default() },
        status: Some(k8s_openapi::api::core::v1::NamespaceStatus { phase: Some(phase.into()), ..Default::default() }),
        ..Default::default()
    }
}
