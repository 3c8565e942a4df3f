//! A module pod as the controller's watch reads it and as the controller keeps it.
//!
//! The watch decodes [`ModulePod`], a pod with only the fields the controller reads (names,
//! UID, resourceVersion, deletion; each container's name, image and `BIZ_VERSION`; the node
//! and restart policy; the status): managedFields, labels, annotations and the rest of the
//! spec are skipped by the decoder, not built and dropped. In the watch task, before the
//! controller's actor sees it, a pod becomes a [`PodUpdate`]: its modules as
//! [`ModuleSpec`]s, its status as the [`PriorStatus`] the next one builds on plus a digest.
//! Pure: no I/O here.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PodStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Deserializer};

use crate::mapping::{self, ModuleSpec, PriorStatus};

/// A pod as the module-pod watch decodes it (`Api<ModulePod>` reads `/api/v1/pods`).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ModulePod {
    #[serde(default, deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<ModulePodSpec>,
    #[serde(default)]
    pub status: Option<PodStatus>,
}

/// What the controller reads of a pod's spec.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModulePodSpec {
    #[serde(default)]
    pub containers: Option<Vec<ModuleContainer>>,
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub restart_policy: Option<String>,
}

/// What the controller reads of a container: a module.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ModuleContainer {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub env: Option<Vec<ModuleEnv>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ModuleEnv {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: Option<String>,
}

impl ModuleContainer {
    /// The module: name, `BIZ_VERSION` (its first value, as [`mapping::biz_version`] reads it)
    /// and image.
    pub fn spec(&self) -> ModuleSpec {
        let version = self
            .env
            .iter()
            .flatten()
            .find(|e| e.name == mapping::ENV_BIZ_VERSION)
            .and_then(|e| e.value.as_deref())
            .unwrap_or_default();
        ModuleSpec::new(&self.name, version, self.image.as_deref())
    }
}

/// The metadata the controller reads; every other field is skipped while decoding.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = SlimMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        deletion_timestamp: m.deletion_timestamp,
        ..Default::default()
    })
}

impl kube::Resource for ModulePod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// `namespace/name`, the key the controller keeps a pod under.
pub fn pod_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A module pod as the watch hands it to the controller.
#[derive(Clone, Debug, PartialEq)]
pub struct PodUpdate {
    /// `namespace/name`.
    pub key: String,
    pub uid: Option<Box<str>>,
    pub resource_version: Option<Box<str>>,
    pub deleting: bool,
    pub node_name: Option<String>,
    pub restart_policy: Option<Cow<'static, str>>,
    /// Its module containers, in the spec's order.
    pub modules: Vec<ModuleSpec>,
    /// What its next status builds on.
    pub prior: PriorStatus,
    /// [`mapping::pod_status_digest`] of its status; `None` while it shows no container statuses.
    pub digest: Option<u64>,
}

impl From<ModulePod> for PodUpdate {
    fn from(p: ModulePod) -> Self {
        let m = p.metadata;
        let spec = p.spec.unwrap_or_default();
        PodUpdate {
            key: pod_key(m.namespace.as_deref().unwrap_or_default(), m.name.as_deref().unwrap_or_default()),
            uid: m.uid.map(Into::into),
            resource_version: m.resource_version.map(Into::into),
            deleting: m.deletion_timestamp.is_some(),
            node_name: spec.node_name,
            restart_policy: spec.restart_policy.map(|r| mapping::interned(r, &["Always", "OnFailure", "Never"])),
            modules: spec.containers.iter().flatten().map(ModuleContainer::spec).collect(),
            prior: PriorStatus::of(p.status.as_ref()),
            digest: p.status.as_ref().filter(|s| s.container_statuses.is_some()).map(mapping::pod_status_digest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
    use serde_json::json;

    fn pod_json() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "m1", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
                "labels": {"virtual-kubelet.koupleless.io/component": "module"},
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {
                "nodeName": "vnode.b1.dev",
                "restartPolicy": "OnFailure",
                "dnsPolicy": "ClusterFirst",
                "tolerations": [{"key": "schedule.koupleless.io/virtual-node", "operator": "Exists"}],
                "containers": [{
                    "name": "biz1", "image": "file:///biz1.jar",
                    "imagePullPolicy": "IfNotPresent",
                    "resources": {"limits": {"cpu": "1"}},
                    "env": [{"name": "OTHER", "value": "x"}, {"name": "BIZ_VERSION", "value": "0.0.1"}],
                }],
            },
            "status": {
                "phase": "Running",
                "qosClass": "BestEffort",
                "startTime": "2024-01-01T00:00:00Z",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-01T00:00:05Z"},
                    {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
                ],
                "containerStatuses": [{"name": "biz1", "image": "file:///biz1.jar", "imageID": "", "ready": true, "restartCount": 0}],
            },
        })
    }

    #[test]
    fn a_pod_decodes_to_what_the_controller_reads() {
        let full: Pod = serde_json::from_value(pod_json()).unwrap();
        let slim: ModulePod = serde_json::from_value(pod_json()).unwrap();
        assert!(slim.metadata.managed_fields.is_none() && slim.metadata.labels.is_none());
        let u = PodUpdate::from(slim);
        assert_eq!(u.key, "ns/m1");
        assert_eq!((u.uid.as_deref(), u.resource_version.as_deref()), (Some("u-1"), Some("42")));
        assert!(!u.deleting);
        assert_eq!(u.node_name.as_deref(), Some("vnode.b1.dev"));
        assert_eq!(u.restart_policy.as_deref(), Some("OnFailure"));
        // The module is what the full container says.
        let c: &Container = &full.spec.as_ref().unwrap().containers[0];
        assert_eq!(u.modules, vec![ModuleSpec::of(c)]);
        assert_eq!(u.modules[0].key(), "biz1:0.0.1");
        assert_eq!(u.modules[0].image(), Some("file:///biz1.jar"));
        // The status: the same prior and digest as from the full pod.
        assert_eq!(u.prior, PriorStatus::of(full.status.as_ref()));
        assert_eq!(u.digest, full.status.as_ref().map(mapping::pod_status_digest));
    }

    #[test]
    fn deletion_and_a_pod_without_statuses() {
        let mut v = pod_json();
        v["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:01:00Z");
        v["status"] = json!({"phase": "Pending"});
        let u = PodUpdate::from(serde_json::from_value::<ModulePod>(v).unwrap());
        assert!(u.deleting);
        assert_eq!(u.digest, None);
    }

    #[test]
    fn a_module_spec_makes_the_container_the_tunnels_send() {
        let c = Container {
            name: "biz1".into(),
            image: Some("file:///biz1.jar".into()),
            env: Some(vec![EnvVar { name: "BIZ_VERSION".into(), value: Some("0.0.1".into()), ..Default::default() }]),
            ..Default::default()
        };
        let spec = ModuleSpec::of(&c);
        assert_eq!((spec.name(), spec.version(), spec.key()), ("biz1", "0.0.1", "biz1:0.0.1"));
        assert_eq!(spec.container(), c);
        assert_eq!(mapping::biz_model(&spec.container()), mapping::biz_model(&c));
        let bare = ModuleSpec::new("m", "", None);
        assert_eq!((bare.key(), bare.version(), bare.image()), ("m:", "", None));
    }
}
