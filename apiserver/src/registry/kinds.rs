//! One small strategy per kind. Larger ones live in their own modules (pod, service,
//! workloads); this file holds the rest and the statics the resource table points at.

use base64::Engine;
use serde_json::{json, Value};

use super::pod::PodStrategy;
use super::service::ServiceStrategy;
use super::workloads::{Workload, WorkloadStrategy};
use super::{common_field_value, default_at, str_at, Strategy};
use crate::error::FieldError;
use crate::registry::Sub;
use crate::validation::{dns1123_subdomain_errors, NameRule};

pub static POD: PodStrategy = PodStrategy;
pub static SERVICE: ServiceStrategy = ServiceStrategy;
pub static DEPLOYMENT: WorkloadStrategy = WorkloadStrategy(Workload::Deployment);
pub static REPLICASET: WorkloadStrategy = WorkloadStrategy(Workload::ReplicaSet);
pub static STATEFULSET: WorkloadStrategy = WorkloadStrategy(Workload::StatefulSet);
pub static DAEMONSET: WorkloadStrategy = WorkloadStrategy(Workload::DaemonSet);
pub static REPLICATIONCONTROLLER: WorkloadStrategy = WorkloadStrategy(Workload::ReplicationController);
pub static JOB: WorkloadStrategy = WorkloadStrategy(Workload::Job);
pub static CRONJOB: WorkloadStrategy = WorkloadStrategy(Workload::CronJob);

pub static NAMESPACE: NamespaceStrategy = NamespaceStrategy;
pub static NODE: NodeStrategy = NodeStrategy;
pub static ENDPOINTS: Plain = Plain { create_on_update: true, ..Plain::DEFAULT };
pub static CONFIGMAP: DataStrategy = DataStrategy { secret: false };
pub static SECRET: DataStrategy = DataStrategy { secret: true };
pub static SERVICEACCOUNT: Plain = Plain { return_deleted: true, ..Plain::DEFAULT };
pub static EVENT: EventStrategy = EventStrategy;
pub static PV: VolumeStrategy = VolumeStrategy { claim: false };
pub static PVC: VolumeStrategy = VolumeStrategy { claim: true };
pub static RESOURCEQUOTA: Plain = Plain { generation: true, return_deleted: true, ..Plain::DEFAULT };
pub static LIMITRANGE: Plain = Plain::DEFAULT;
pub static HPA: HpaStrategy = HpaStrategy;
pub static ENDPOINTSLICE: EndpointSliceStrategy = EndpointSliceStrategy;
pub static LEASE: Plain = Plain::DEFAULT;
pub static STORAGECLASS: StorageClassStrategy = StorageClassStrategy;
pub static RUNTIMECLASS: RuntimeClassStrategy = RuntimeClassStrategy;
pub static CSIDRIVER: CsiDriverStrategy = CsiDriverStrategy;
pub static INGRESS: IngressStrategy = IngressStrategy;
pub static INGRESSCLASS: RequiredFields = RequiredFields {
    fields: &[("/spec/controller", "spec.controller")],
    immutable: &[("/spec/controller", "spec.controller")],
};
pub static NETWORKPOLICY: NetworkPolicyStrategy = NetworkPolicyStrategy;
pub static RBAC: Plain = Plain { name_rule: NameRule::PathSegment, ..Plain::DEFAULT };
pub static RBAC_BINDING: RoleBindingStrategy = RoleBindingStrategy;
pub static PRIORITYCLASS: PriorityClassStrategy = PriorityClassStrategy;
pub static PDB: PdbStrategy = PdbStrategy;
pub static PODTEMPLATE: PodTemplateStrategy = PodTemplateStrategy;
pub static APISERVICE: ApiServiceStrategy = ApiServiceStrategy;
pub static CONTROLLERREVISION: RequiredFields =
    RequiredFields { fields: &[("/revision", "revision")], immutable: &[("/data", "data")] };

/// Kinds with nothing special beyond a name rule and a couple of flags.
pub struct Plain {
    pub name_rule: NameRule,
    pub generation: bool,
    pub create_on_update: bool,
    /// Delete answers the deleted object (Kubernetes' `ReturnDeletedObject`).
    pub return_deleted: bool,
}

impl Plain {
    pub const DEFAULT: Plain = Plain {
        name_rule: NameRule::Dns1123Subdomain,
        generation: false,
        create_on_update: false,
        return_deleted: false,
    };
}

impl Strategy for Plain {
    fn name_rule(&self) -> NameRule {
        self.name_rule
    }
    fn tracks_generation(&self) -> bool {
        self.generation
    }
    fn allow_create_on_update(&self) -> bool {
        self.create_on_update
    }
    fn return_deleted_object(&self) -> bool {
        self.return_deleted
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        common_field_value(obj, field)
    }
}

/// Kinds whose only rule is some required (and optionally immutable) fields.
pub struct RequiredFields {
    pub fields: &'static [(&'static str, &'static str)],
    pub immutable: &'static [(&'static str, &'static str)],
}

impl Strategy for RequiredFields {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        self.fields
            .iter()
            .filter(|(p, _)| obj.pointer(p).is_none_or(|v| v.is_null() || v == ""))
            .map(|(_, f)| FieldError::required(*f, ""))
            .collect()
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        immutable(new, old, self.immutable, &mut errs);
        errs
    }
    fn tracks_generation(&self) -> bool {
        false
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        common_field_value(obj, field)
    }
}

fn immutable(new: &Value, old: &Value, fields: &[(&str, &str)], errs: &mut Vec<FieldError>) {
    for (p, f) in fields {
        if new.pointer(p) != old.pointer(p) {
            errs.push(FieldError::invalid(*f, new.pointer(p).unwrap_or(&Value::Null), "field is immutable"));
        }
    }
}

// ------------------------------------------------------------------------- Namespace

pub struct NamespaceStrategy;

impl Strategy for NamespaceStrategy {
    fn name_rule(&self) -> NameRule {
        NameRule::Dns1123Label
    }
    /// `namespaces/<n>/finalize` changes only `spec.finalizers` (the namespace controller
    /// removes `kubernetes` once the namespace is empty).
    fn prepare_subresource_update(&self, sub: Sub, new: &Value, old: &Value) -> Option<Value> {
        (sub == Sub::Finalize).then(|| {
            let mut out = old.clone();
            super::set_at(&mut out, "/spec/finalizers", new.pointer("/spec/finalizers").cloned().unwrap_or(json!([])));
            out
        })
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        default_at(obj, "/spec/finalizers", json!(["kubernetes"]));
        obj["status"] = json!({"phase": "Active"});
        let name = str_at(obj, "/metadata/name").unwrap_or_default().to_string();
        super::set_at(obj, "/metadata/labels/kubernetes.io~1metadata.name", json!(name));
    }
    fn prepare_for_update(&self, new: &mut Value, old: &Value) {
        // spec.finalizers changes only through the finalize subresource.
        match old.pointer("/spec/finalizers") {
            Some(f) => super::set_at(new, "/spec/finalizers", f.clone()),
            None => {
                super::remove_at(new, "/spec/finalizers");
            }
        }
        let name = str_at(old, "/metadata/name").unwrap_or_default().to_string();
        super::set_at(new, "/metadata/labels/kubernetes.io~1metadata.name", json!(name));
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        for (i, f) in obj.pointer("/spec/finalizers").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let s = f.as_str().unwrap_or_default();
            if let Some(m) = crate::validation::qualified_name_errors(s) {
                errs.push(FieldError::invalid(format!("spec.finalizers[{i}]"), f, &m));
            }
        }
        errs
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        match field {
            "status.phase" => Some(str_at(obj, "/status/phase").unwrap_or_default().to_string()),
            _ => common_field_value(obj, field),
        }
    }
    fn tracks_generation(&self) -> bool {
        false
    }
    fn deletion_blocked(&self, obj: &Value) -> bool {
        obj.pointer("/spec/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty())
    }
    fn on_deletion_marked(&self, obj: &mut Value) {
        super::set_at(obj, "/status/phase", json!("Terminating"));
    }
}

// ------------------------------------------------------------------------- Node

pub struct NodeStrategy;

impl Strategy for NodeStrategy {
    fn keep_status_on_create(&self) -> bool {
        true
    }
    fn tracks_generation(&self) -> bool {
        false
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        for (i, t) in obj.pointer("/spec/taints").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let eff = str_at(t, "/effect").unwrap_or_default();
            if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&eff) {
                errs.push(FieldError::not_supported(
                    format!("spec.taints[{i}].effect"),
                    &json!(eff),
                    &["NoExecute", "NoSchedule", "PreferNoSchedule"],
                ));
            }
            if str_at(t, "/key").unwrap_or_default().is_empty() {
                errs.push(FieldError::required(format!("spec.taints[{i}].key"), ""));
            }
        }
        errs
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        // podCIDR may be set once.
        let old_cidr = str_at(old, "/spec/podCIDR").unwrap_or_default();
        if !old_cidr.is_empty() && str_at(new, "/spec/podCIDR").unwrap_or_default() != old_cidr {
            errs.push(FieldError::forbidden(
                "spec.podCIDRs",
                "node updates may not change podCIDR except from \"\" to valid",
            ));
        }
        errs
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        match field {
            "spec.unschedulable" => {
                Some(obj.pointer("/spec/unschedulable").and_then(Value::as_bool).unwrap_or(false).to_string())
            }
            _ => common_field_value(obj, field),
        }
    }
}

// ------------------------------------------------------------------------- ConfigMap / Secret

pub struct DataStrategy {
    pub secret: bool,
}

const MAX_DATA_SIZE: usize = 1024 * 1024;

fn config_key_errors(k: &str) -> Option<String> {
    if k.is_empty() || k.len() > 253 {
        return Some("a valid config key must be between 1 and 253 characters".into());
    }
    if k == "." || k == ".." || !k.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)) {
        return Some("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".into());
    }
    None
}

impl Strategy for DataStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        if self.secret {
            fold_string_data(obj);
            default_at(obj, "/type", json!("Opaque"));
        }
    }
    fn prepare_for_update(&self, new: &mut Value, _old: &Value) {
        if self.secret {
            fold_string_data(new);
            default_at(new, "/type", json!("Opaque"));
        }
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let mut total = 0usize;
        let mut keys = std::collections::HashSet::new();
        for field in ["data", "binaryData"] {
            for (k, v) in obj.get(field).and_then(Value::as_object).into_iter().flatten() {
                if let Some(m) = config_key_errors(k) {
                    errs.push(FieldError::invalid(format!("{field}[{k}]"), &json!(k), &m));
                }
                if !keys.insert(k.clone()) {
                    errs.push(FieldError::invalid(
                        format!("{field}[{k}]"),
                        &json!(k),
                        "duplicate of key present in data",
                    ));
                }
                total += v.as_str().map_or(0, str::len);
            }
        }
        if total > MAX_DATA_SIZE {
            errs.push(FieldError::too_long(if self.secret { "data" } else { "[]" }, MAX_DATA_SIZE));
        }
        if self.secret {
            let data = obj.get("data").and_then(Value::as_object);
            let has = |k: &str| data.is_some_and(|d| d.contains_key(k));
            match str_at(obj, "/type").unwrap_or("Opaque") {
                "kubernetes.io/tls" => {
                    for k in ["tls.crt", "tls.key"] {
                        if !has(k) {
                            errs.push(FieldError::required(format!("data[{k}]"), ""));
                        }
                    }
                }
                "kubernetes.io/dockerconfigjson" => {
                    if !has(".dockerconfigjson") {
                        errs.push(FieldError::required("data[.dockerconfigjson]", ""));
                    }
                }
                "kubernetes.io/service-account-token" => {
                    if str_at(obj, "/metadata/annotations/kubernetes.io~1service-account.name")
                        .unwrap_or_default()
                        .is_empty()
                    {
                        errs.push(FieldError::required("metadata.annotations[kubernetes.io/service-account.name]", ""));
                    }
                }
                "kubernetes.io/basic-auth"
                | "kubernetes.io/ssh-auth"
                | "Opaque"
                | "bootstrap.kubernetes.io/token"
                | "kubernetes.io/dockercfg" => {}
                _ => {}
            }
        }
        errs
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        if old.get("immutable").and_then(Value::as_bool) == Some(true) {
            if new.get("immutable").and_then(Value::as_bool) != Some(true) {
                errs.push(FieldError::forbidden("immutable", "field is immutable when `immutable` is set"));
            }
            for f in ["data", "binaryData"] {
                if new.get(f) != old.get(f) {
                    errs.push(FieldError::forbidden(f, "field is immutable when `immutable` is set"));
                }
            }
        }
        if self.secret && str_at(new, "/type").unwrap_or("Opaque") != str_at(old, "/type").unwrap_or("Opaque") {
            errs.push(FieldError::invalid("type", new.get("type").unwrap_or(&Value::Null), "field is immutable"));
        }
        errs
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        match field {
            "type" if self.secret => Some(str_at(obj, "/type").unwrap_or_default().to_string()),
            _ => common_field_value(obj, field),
        }
    }
    fn tracks_generation(&self) -> bool {
        false
    }
}

/// `stringData` is write-only: merged into `data` (base64) and dropped, `stringData`
/// winning on conflicts, as Kubernetes' conversion does.
pub fn fold_string_data(obj: &mut Value) {
    let Some(sd) = obj.as_object_mut().and_then(|m| m.remove("stringData")) else { return };
    let Some(sd) = sd.as_object() else { return };
    for (k, v) in sd {
        let raw = v.as_str().unwrap_or_default();
        let enc = base64::engine::general_purpose::STANDARD.encode(raw.as_bytes());
        super::set_at(obj, &format!("/data/{}", k.replace('~', "~0").replace('/', "~1")), json!(enc));
    }
}

// ------------------------------------------------------------------------- Event

pub struct EventStrategy;

impl Strategy for EventStrategy {
    fn keep_status_on_create(&self) -> bool {
        true
    }
    fn tracks_generation(&self) -> bool {
        false
    }
    fn allow_create_on_update(&self) -> bool {
        true
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let ns = str_at(obj, "/metadata/namespace").unwrap_or_default();
        let io_ns = str_at(obj, "/involvedObject/namespace").unwrap_or_default();
        if !io_ns.is_empty() && io_ns != ns {
            errs.push(FieldError::invalid("involvedObject.namespace", &json!(io_ns), "does not match event.namespace"));
        }
        errs
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        let s = |p: &str| Some(str_at(obj, p).unwrap_or_default().to_string());
        match field {
            "involvedObject.kind" => s("/involvedObject/kind"),
            "involvedObject.namespace" => s("/involvedObject/namespace"),
            "involvedObject.name" => s("/involvedObject/name"),
            "involvedObject.uid" => s("/involvedObject/uid"),
            "involvedObject.apiVersion" => s("/involvedObject/apiVersion"),
            "involvedObject.resourceVersion" => s("/involvedObject/resourceVersion"),
            "involvedObject.fieldPath" => s("/involvedObject/fieldPath"),
            "reason" => s("/reason"),
            "reportingComponent" => s("/reportingComponent"),
            "source" => s("/source/component"),
            "type" => s("/type"),
            _ => common_field_value(obj, field),
        }
    }
}

// ------------------------------------------------------------------------- PV / PVC

pub struct VolumeStrategy {
    pub claim: bool,
}

const ACCESS_MODES: &[&str] = &["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"];
const PV_SOURCES: &[&str] = &[
    "hostPath",
    "local",
    "nfs",
    "csi",
    "iscsi",
    "fc",
    "rbd",
    "cephfs",
    "cinder",
    "flexVolume",
    "glusterfs",
    "awsElasticBlockStore",
    "gcePersistentDisk",
    "azureDisk",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "flocker",
];

impl Strategy for VolumeStrategy {
    /// Kubernetes answers a delete with the deleted object.
    fn return_deleted_object(&self) -> bool {
        true
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        if !self.claim {
            default_at(obj, "/spec/persistentVolumeReclaimPolicy", json!("Retain"));
        }
        default_at(obj, "/spec/volumeMode", json!("Filesystem"));
        obj["status"] = json!({"phase": "Pending"});
        // StorageObjectInUseProtection: the pvc-protection / pv-protection controllers
        // remove these once deleting the object can lose nothing.
        let finalizer = if self.claim { "kubernetes.io/pvc-protection" } else { "kubernetes.io/pv-protection" };
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            let fins = meta.entry("finalizers").or_insert_with(|| json!([]));
            if let Some(list) = fins.as_array_mut() {
                if !list.iter().any(|f| f == finalizer) {
                    list.push(json!(finalizer));
                }
            }
        }
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let modes = obj.pointer("/spec/accessModes").and_then(Value::as_array);
        if modes.is_none_or(|m| m.is_empty()) {
            errs.push(FieldError::required("spec.accessModes", ""));
        }
        for (i, m) in modes.into_iter().flatten().enumerate() {
            let s = m.as_str().unwrap_or_default();
            if !ACCESS_MODES.contains(&s) {
                errs.push(FieldError::not_supported(format!("spec.accessModes[{i}]"), m, ACCESS_MODES));
            }
        }
        if self.claim {
            if obj.pointer("/spec/resources/requests/storage").is_none() {
                errs.push(FieldError::required("spec.resources[storage]", ""));
            }
        } else {
            if obj.pointer("/spec/capacity/storage").is_none() {
                errs.push(FieldError::required("spec.capacity", ""));
            }
            let spec = obj.get("spec").and_then(Value::as_object);
            let n = PV_SOURCES.iter().filter(|s| spec.is_some_and(|m| m.contains_key(**s))).count();
            if n == 0 {
                errs.push(FieldError::required("spec", "must specify a volume type"));
            } else if n > 1 {
                errs.push(FieldError::forbidden("spec", "may not specify more than 1 volume type"));
            }
        }
        errs
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        if self.claim {
            // Only the storage request (expansion) and the binding (volumeName set once) change.
            let mask = |v: &Value| {
                let mut s = v.get("spec").cloned().unwrap_or(Value::Null);
                if let Some(m) = s.as_object_mut() {
                    m.remove("resources");
                    if old.pointer("/spec/volumeName").is_none_or(|v| v == "") {
                        m.remove("volumeName");
                    }
                }
                s
            };
            if mask(new) != mask(old) {
                errs.push(FieldError::forbidden("spec", "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"));
            }
        }
        errs
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        common_field_value(obj, field)
    }
    fn tracks_generation(&self) -> bool {
        false
    }
}

// ------------------------------------------------------------------------- HPA

pub struct HpaStrategy;

impl Strategy for HpaStrategy {
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        default_at(obj, "/spec/minReplicas", json!(1));
        obj["status"] = json!({"currentReplicas": 0, "desiredReplicas": 0});
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        for f in ["kind", "name"] {
            if str_at(obj, &format!("/spec/scaleTargetRef/{f}")).unwrap_or_default().is_empty() {
                errs.push(FieldError::required(format!("spec.scaleTargetRef.{f}"), ""));
            }
        }
        let max = obj.pointer("/spec/maxReplicas").and_then(Value::as_i64).unwrap_or(0);
        let min = obj.pointer("/spec/minReplicas").and_then(Value::as_i64).unwrap_or(1);
        if max < 1 {
            errs.push(FieldError::invalid("spec.maxReplicas", &json!(max), "must be greater than or equal to 1"));
        }
        if min < 1 {
            errs.push(FieldError::invalid("spec.minReplicas", &json!(min), "must be greater than or equal to 1"));
        } else if max >= 1 && min > max {
            errs.push(FieldError::invalid(
                "spec.maxReplicas",
                &json!(max),
                "must be greater than or equal to `minReplicas`",
            ));
        }
        for (i, m) in obj.pointer("/spec/metrics").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let t = str_at(m, "/type").unwrap_or_default();
            let types = ["ContainerResource", "External", "Object", "Pods", "Resource"];
            if !types.contains(&t) {
                errs.push(FieldError::not_supported(format!("spec.metrics[{i}].type"), &json!(t), &types));
            }
        }
        errs
    }
}

// ------------------------------------------------------------------------- EndpointSlice

pub struct EndpointSliceStrategy;

impl Strategy for EndpointSliceStrategy {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let at = str_at(obj, "/addressType").unwrap_or_default();
        if !["IPv4", "IPv6", "FQDN"].contains(&at) {
            errs.push(FieldError::not_supported("addressType", &json!(at), &["FQDN", "IPv4", "IPv6"]));
        }
        for (i, e) in obj.get("endpoints").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let addrs = e.get("addresses").and_then(Value::as_array);
            if addrs.is_none_or(|a| a.is_empty()) {
                errs.push(FieldError::required(format!("endpoints[{i}].addresses"), "must contain at least 1 address"));
            }
        }
        errs
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        immutable(new, old, &[("/addressType", "addressType")], &mut errs);
        errs
    }
    fn tracks_generation(&self) -> bool {
        false
    }
}

// ------------------------------------------------------------------------- APIService

/// `apiregistration.k8s.io/v1` APIService: which apiserver serves a group-version. The
/// built-in ones are `Local` (no `spec.service`) and always available. One naming a Service
/// is an aggregated API: its `spec.service.port` defaults to 443 and its `Available`
/// condition is the aggregator's availability controller's (`crate::aggregator`), written
/// through the status subresource; a create starts without it, an update keeps it.
pub struct ApiServiceStrategy;

impl ApiServiceStrategy {
    fn is_local(obj: &Value) -> bool {
        obj.pointer("/spec/service").is_none_or(Value::is_null)
    }

    fn prepare(obj: &mut Value) {
        if Self::is_local(obj) {
            let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
            obj["status"] = json!({"conditions": [{"type": "Available", "status": "True", "reason": "Local",
                "message": "Local APIServices are always available", "lastTransitionTime": now}]});
            return;
        }
        default_at(obj, "/spec/service/port", json!(443));
        // A Local APIService turned aggregated is not known to be available yet.
        let was_local = obj
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| cs.iter().any(|c| c.get("reason").and_then(Value::as_str) == Some("Local")));
        if was_local {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
    }
}

impl Strategy for ApiServiceStrategy {
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        Self::prepare(obj);
    }
    fn prepare_for_update(&self, new: &mut Value, _old: &Value) {
        Self::prepare(new);
    }
    /// Kubernetes' `ValidateAPIService`.
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let group = str_at(obj, "/spec/group").unwrap_or_default();
        let version = str_at(obj, "/spec/version").unwrap_or_default();
        let name = str_at(obj, "/metadata/name").unwrap_or_default();
        if version.is_empty() {
            errs.push(FieldError::required("spec.version", ""));
        }
        if name != format!("{version}.{group}") {
            errs.push(FieldError::invalid("metadata.name", &json!(name), "must be `spec.version+\".\"+spec.group`"));
        }
        let int = |p: &str| obj.pointer(p).and_then(Value::as_i64).unwrap_or(0);
        let gpm = int("/spec/groupPriorityMinimum");
        if !(1..=20000).contains(&gpm) {
            errs.push(FieldError::invalid(
                "spec.groupPriorityMinimum",
                &json!(gpm),
                "must be positive and less than 20000",
            ));
        }
        let vp = int("/spec/versionPriority");
        if !(1..=1000).contains(&vp) {
            errs.push(FieldError::invalid("spec.versionPriority", &json!(vp), "must be positive and less than 1000"));
        }
        let ca = str_at(obj, "/spec/caBundle").unwrap_or_default();
        let insecure = obj.pointer("/spec/insecureSkipTLSVerify").and_then(Value::as_bool).unwrap_or(false);
        if Self::is_local(obj) {
            if !ca.is_empty() {
                let bytes = ca.len() / 4 * 3;
                errs.push(FieldError::invalid(
                    "spec.caBundle",
                    &json!(format!("{bytes} bytes")),
                    "local APIServices may not have a caBundle",
                ));
            }
            if insecure {
                errs.push(FieldError::invalid(
                    "spec.insecureSkipTLSVerify",
                    &json!(true),
                    "local APIServices may not have insecureSkipTLSVerify",
                ));
            }
            return errs;
        }
        for (field, path) in
            [("spec.service.namespace", "/spec/service/namespace"), ("spec.service.name", "/spec/service/name")]
        {
            if str_at(obj, path).unwrap_or_default().is_empty() {
                errs.push(FieldError::required(field, ""));
            }
        }
        let port = obj.pointer("/spec/service/port").and_then(Value::as_i64).unwrap_or(443);
        if !(1..=65535).contains(&port) {
            errs.push(FieldError::invalid(
                "spec.service.port",
                &json!(port),
                "port is not valid: must be between 1 and 65535, inclusive",
            ));
        }
        if insecure && !ca.is_empty() {
            errs.push(FieldError::invalid(
                "spec.insecureSkipTLSVerify",
                &json!(true),
                "may not be true if caBundle is present",
            ));
        }
        errs
    }
}

// ------------------------------------------------------------------------- StorageClass

pub struct StorageClassStrategy;

impl Strategy for StorageClassStrategy {
    /// Kubernetes answers a delete with the deleted object.
    fn return_deleted_object(&self) -> bool {
        true
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        default_at(obj, "/reclaimPolicy", json!("Delete"));
        default_at(obj, "/volumeBindingMode", json!("Immediate"));
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let p = str_at(obj, "/provisioner").unwrap_or_default();
        if p.is_empty() {
            errs.push(FieldError::required("provisioner", ""));
        } else if let Some(m) = crate::validation::qualified_name_errors(p) {
            errs.push(FieldError::invalid("provisioner", &json!(p), &m));
        }
        if let Some(r) = str_at(obj, "/reclaimPolicy") {
            if !["Delete", "Retain"].contains(&r) {
                errs.push(FieldError::not_supported("reclaimPolicy", &json!(r), &["Delete", "Retain"]));
            }
        }
        if let Some(m) = str_at(obj, "/volumeBindingMode") {
            if !["Immediate", "WaitForFirstConsumer"].contains(&m) {
                errs.push(FieldError::not_supported(
                    "volumeBindingMode",
                    &json!(m),
                    &["Immediate", "WaitForFirstConsumer"],
                ));
            }
        }
        errs
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        immutable(
            new,
            old,
            &[
                ("/provisioner", "provisioner"),
                ("/parameters", "parameters"),
                ("/reclaimPolicy", "reclaimPolicy"),
                ("/volumeBindingMode", "volumeBindingMode"),
            ],
            &mut errs,
        );
        errs
    }
    fn tracks_generation(&self) -> bool {
        false
    }
}

// ------------------------------------------------------------------------- RuntimeClass

/// `node.k8s.io/v1` RuntimeClass: a handler name (a DNS label) the kubelet's runtime knows,
/// fixed once created.
pub struct RuntimeClassStrategy;

impl Strategy for RuntimeClassStrategy {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        match str_at(obj, "/handler").unwrap_or_default() {
            "" => vec![FieldError::required("handler", "")],
            h => crate::validation::dns1123_label_errors(h)
                .map(|m| FieldError::invalid("handler", &json!(h), &m))
                .into_iter()
                .collect(),
        }
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        immutable(new, old, &[("/handler", "handler")], &mut errs);
        errs
    }
    fn tracks_generation(&self) -> bool {
        false
    }
}

// ------------------------------------------------------------------------- CSIDriver

/// `storage.k8s.io/v1` CSIDriver: the spec defaulted as Kubernetes defaults it; whether the
/// driver attaches and its lifecycle modes are fixed once created.
pub struct CsiDriverStrategy;

impl Strategy for CsiDriverStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        default_at(obj, "/spec", json!({}));
        default_at(obj, "/spec/attachRequired", json!(true));
        default_at(obj, "/spec/podInfoOnMount", json!(false));
        default_at(obj, "/spec/storageCapacity", json!(false));
        default_at(obj, "/spec/fsGroupPolicy", json!("ReadWriteOnceWithFSType"));
        default_at(obj, "/spec/requiresRepublish", json!(false));
        default_at(obj, "/spec/volumeLifecycleModes", json!(["Persistent"]));
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let policies = ["File", "None", "ReadWriteOnceWithFSType"];
        if let Some(p) = str_at(obj, "/spec/fsGroupPolicy").filter(|p| !policies.contains(p)) {
            errs.push(FieldError::not_supported("spec.fsGroupPolicy", &json!(p), &policies));
        }
        let modes = obj.pointer("/spec/volumeLifecycleModes").and_then(Value::as_array);
        for (i, m) in modes.into_iter().flatten().enumerate() {
            if !["Persistent", "Ephemeral"].contains(&m.as_str().unwrap_or_default()) {
                let f = format!("spec.volumeLifecycleModes[{i}]");
                errs.push(FieldError::not_supported(f, m, &["Ephemeral", "Persistent"]));
            }
        }
        errs
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        let fixed = [
            ("/spec/attachRequired", "spec.attachRequired"),
            ("/spec/volumeLifecycleModes", "spec.volumeLifecycleModes"),
        ];
        immutable(new, old, &fixed, &mut errs);
        errs
    }
    fn tracks_generation(&self) -> bool {
        false
    }
}

/// `storage.k8s.io/v1` CSINode: the CSI drivers a node runs (named as the node).
pub static CSINODE: RequiredFields = RequiredFields { fields: &[], immutable: &[] };

/// `storage.k8s.io/v1` VolumeAttachment: an attacher's request to attach a volume to a node;
/// its spec is fixed, its status the attacher's.
pub static VOLUMEATTACHMENT: RequiredFields = RequiredFields {
    fields: &[("/spec/attacher", "spec.attacher"), ("/spec/nodeName", "spec.nodeName")],
    immutable: &[("/spec", "spec")],
};

// ------------------------------------------------------------------------- Ingress

pub struct IngressStrategy;

impl Strategy for IngressStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        obj["status"] = json!({"loadBalancer": {}});
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let rules = obj.pointer("/spec/rules").and_then(Value::as_array);
        if obj.pointer("/spec/defaultBackend").is_none() && rules.is_none_or(|r| r.is_empty()) {
            errs.push(FieldError::invalid(
                "spec.rules",
                &json!([]),
                "either `defaultBackend` or `rules` must be specified",
            ));
        }
        for (i, r) in rules.into_iter().flatten().enumerate() {
            if let Some(h) = str_at(r, "/host") {
                let probe = h.strip_prefix("*.").unwrap_or(h);
                if let Some(m) = dns1123_subdomain_errors(probe) {
                    errs.push(FieldError::invalid(format!("spec.rules[{i}].host"), &json!(h), &m));
                }
            }
            for (j, p) in r.pointer("/http/paths").and_then(Value::as_array).into_iter().flatten().enumerate() {
                let path = format!("spec.rules[{i}].http.paths[{j}]");
                match str_at(p, "/pathType") {
                    None => errs.push(FieldError::required(format!("{path}.pathType"), "pathType must be specified")),
                    Some(t) if !["Exact", "Prefix", "ImplementationSpecific"].contains(&t) => {
                        errs.push(FieldError::not_supported(
                            format!("{path}.pathType"),
                            &json!(t),
                            &["Exact", "ImplementationSpecific", "Prefix"],
                        ))
                    }
                    Some(t) => {
                        let pth = str_at(p, "/path").unwrap_or_default();
                        if t != "ImplementationSpecific" && !pth.starts_with('/') {
                            errs.push(FieldError::invalid(
                                format!("{path}.path"),
                                &json!(pth),
                                "must be an absolute path",
                            ));
                        }
                    }
                }
                let svc = p.pointer("/backend/service");
                let res = p.pointer("/backend/resource");
                match (svc, res) {
                    (None, None) => errs.push(FieldError::invalid(
                        format!("{path}.backend"),
                        &json!({}),
                        "one backend must be specified",
                    )),
                    (Some(_), Some(_)) => errs.push(FieldError::invalid(
                        format!("{path}.backend"),
                        &json!({}),
                        "cannot set both resource and service backends",
                    )),
                    (Some(s), None) => {
                        if str_at(s, "/name").unwrap_or_default().is_empty() {
                            errs.push(FieldError::required(format!("{path}.backend.service.name"), ""));
                        }
                        let has_num = s.pointer("/port/number").is_some();
                        let has_name = s.pointer("/port/name").is_some();
                        if has_num == has_name {
                            errs.push(FieldError::required(
                                format!("{path}.backend.service.port"),
                                "port name or number is required",
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
        errs
    }
}

// ------------------------------------------------------------------------- NetworkPolicy

pub struct NetworkPolicyStrategy;

impl Strategy for NetworkPolicyStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        // policyTypes defaults to Ingress, plus Egress when egress rules are present.
        if obj.pointer("/spec/policyTypes").is_none() {
            let mut types = vec![json!("Ingress")];
            if obj.pointer("/spec/egress").is_some() {
                types.push(json!("Egress"));
            }
            super::set_at(obj, "/spec/policyTypes", Value::Array(types));
        }
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        match obj.pointer("/spec/podSelector") {
            None => errs.push(FieldError::required("spec.podSelector", "")),
            Some(sel) => selector_errors("spec.podSelector", sel, &mut errs),
        }
        for (i, t) in obj.pointer("/spec/policyTypes").and_then(Value::as_array).into_iter().flatten().enumerate() {
            if !["Ingress", "Egress"].contains(&t.as_str().unwrap_or_default()) {
                errs.push(FieldError::not_supported(format!("spec.policyTypes[{i}]"), t, &["Egress", "Ingress"]));
            }
        }
        for (rules, peers) in [("ingress", "from"), ("egress", "to")] {
            for (i, rule) in
                obj.pointer(&format!("/spec/{rules}")).and_then(Value::as_array).into_iter().flatten().enumerate()
            {
                let path = format!("spec.{rules}[{i}]");
                for (j, port) in rule.get("ports").and_then(Value::as_array).into_iter().flatten().enumerate() {
                    network_policy_port(&format!("{path}.ports[{j}]"), port, &mut errs);
                }
                for (j, peer) in rule.get(peers).and_then(Value::as_array).into_iter().flatten().enumerate() {
                    network_policy_peer(&format!("{path}.{peers}[{j}]"), peer, &mut errs);
                }
            }
        }
        errs
    }
}

/// A label selector that does not parse.
fn selector_errors(path: &str, sel: &Value, errs: &mut Vec<FieldError>) {
    if let Err(e) = crate::selectors::LabelSelector::from_label_selector_json(sel) {
        errs.push(FieldError::invalid(path, sel, &e.0));
    }
}

/// A NetworkPolicy port, as Kubernetes' `ValidateNetworkPolicyPort`: a known protocol, a
/// port number or name, and an `endPort` only after a numbered port and not below it.
fn network_policy_port(path: &str, port: &Value, errs: &mut Vec<FieldError>) {
    const RANGE: &str = "must be between 1 and 65535, inclusive";
    if let Some(proto) = port.get("protocol").and_then(Value::as_str) {
        if !["TCP", "UDP", "SCTP"].contains(&proto) {
            errs.push(FieldError::not_supported(format!("{path}.protocol"), &json!(proto), &["TCP", "UDP", "SCTP"]));
        }
    }
    let end = port.get("endPort").filter(|v| !v.is_null());
    match port.get("port").filter(|v| !v.is_null()) {
        Some(Value::Number(n)) => {
            let n = n.as_i64().unwrap_or(0);
            if !(1..=65535).contains(&n) {
                errs.push(FieldError::invalid(format!("{path}.port"), &json!(n), RANGE));
            }
            if let Some(end) = end {
                let e = end.as_i64().unwrap_or(0);
                if e < n {
                    errs.push(FieldError::invalid(
                        format!("{path}.endPort"),
                        &json!(n),
                        "must be greater than or equal to `port`",
                    ));
                }
                if !(1..=65535).contains(&e) {
                    errs.push(FieldError::invalid(format!("{path}.endPort"), end, RANGE));
                }
            }
        }
        Some(Value::String(name)) => {
            if let Some(end) = end {
                errs.push(FieldError::invalid(
                    format!("{path}.endPort"),
                    end,
                    "may not be specified when `port` is non-numeric",
                ));
            }
            for msg in crate::validation::port_name_errors(name) {
                errs.push(FieldError::invalid(format!("{path}.port"), &json!(name), msg));
            }
        }
        Some(other) => errs.push(FieldError::invalid(format!("{path}.port"), other, "must be a port number or name")),
        None => {
            if let Some(end) = end {
                errs.push(FieldError::invalid(
                    format!("{path}.endPort"),
                    end,
                    "may not be specified when `port` is not specified",
                ));
            }
        }
    }
}

/// A NetworkPolicy peer, as Kubernetes' `ValidateNetworkPolicyPeer`: at least one of the
/// selectors or an ipBlock, the ipBlock alone, its CIDR valid and each `except` inside it.
fn network_policy_peer(path: &str, peer: &Value, errs: &mut Vec<FieldError>) {
    let has = |k: &str| peer.get(k).is_some_and(|v| !v.is_null());
    let count = ["podSelector", "namespaceSelector", "ipBlock"].iter().filter(|k| has(k)).count();
    if count == 0 {
        errs.push(FieldError::required(path, "must specify a peer"));
    } else if count > 1 && has("ipBlock") {
        errs.push(FieldError::forbidden(path, "may not specify both ipBlock and another peer"));
    }
    for k in ["podSelector", "namespaceSelector"] {
        if let Some(sel) = peer.get(k).filter(|v| !v.is_null()) {
            selector_errors(&format!("{path}.{k}"), sel, errs);
        }
    }
    let Some(block) = peer.get("ipBlock").filter(|v| !v.is_null()) else { return };
    const CIDR: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";
    let cidr = block.get("cidr").and_then(Value::as_str).unwrap_or_default();
    if cidr.is_empty() {
        errs.push(FieldError::required(format!("{path}.ipBlock.cidr"), ""));
        return;
    }
    if !crate::validation::is_cidr(cidr) {
        errs.push(FieldError::invalid(format!("{path}.ipBlock.cidr"), &json!(cidr), CIDR));
        return;
    }
    for (k, except) in block.get("except").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let epath = format!("{path}.ipBlock.except[{k}]");
        let e = except.as_str().unwrap_or_default();
        if !crate::validation::is_cidr(e) {
            errs.push(FieldError::invalid(epath, except, CIDR));
        } else if !crate::validation::is_strict_subset(e, cidr) {
            errs.push(FieldError::invalid(epath, except, "must be a strict subset of `cidr`"));
        }
    }
}

// ------------------------------------------------------------------------- RBAC bindings

pub struct RoleBindingStrategy;

impl Strategy for RoleBindingStrategy {
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }
    fn tracks_generation(&self) -> bool {
        false
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let kind = str_at(obj, "/roleRef/kind").unwrap_or_default();
        if !["Role", "ClusterRole"].contains(&kind) {
            errs.push(FieldError::not_supported("roleRef.kind", &json!(kind), &["ClusterRole", "Role"]));
        }
        if str_at(obj, "/roleRef/name").unwrap_or_default().is_empty() {
            errs.push(FieldError::required("roleRef.name", ""));
        }
        for (i, s) in obj.get("subjects").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let k = str_at(s, "/kind").unwrap_or_default();
            if !["ServiceAccount", "User", "Group"].contains(&k) {
                errs.push(FieldError::not_supported(
                    format!("subjects[{i}].kind"),
                    &json!(k),
                    &["Group", "ServiceAccount", "User"],
                ));
            }
            if str_at(s, "/name").unwrap_or_default().is_empty() {
                errs.push(FieldError::required(format!("subjects[{i}].name"), ""));
            }
        }
        errs
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        if new.get("roleRef") != old.get("roleRef") {
            errs.push(FieldError::invalid(
                "roleRef",
                new.get("roleRef").unwrap_or(&Value::Null),
                "cannot change roleRef",
            ));
        }
        errs
    }
}

// ------------------------------------------------------------------------- PriorityClass

pub struct PriorityClassStrategy;

impl Strategy for PriorityClassStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        default_at(obj, "/preemptionPolicy", json!("PreemptLowerPriority"));
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let name = str_at(obj, "/metadata/name").unwrap_or_default();
        if name.starts_with("system-") && !["system-node-critical", "system-cluster-critical"].contains(&name) {
            errs.push(FieldError::forbidden(
                "metadata.name",
                "priority class names with 'system-' prefix are reserved",
            ));
        }
        match obj.get("value").and_then(Value::as_i64) {
            None => errs.push(FieldError::required("value", "")),
            Some(v) if v > 1_000_000_000 && !name.starts_with("system-") => {
                errs.push(FieldError::invalid("value", &json!(v), "must be less than or equal to 1000000000"))
            }
            _ => {}
        }
        errs
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        immutable(new, old, &[("/value", "value"), ("/preemptionPolicy", "preemptionPolicy")], &mut errs);
        errs
    }
    fn tracks_generation(&self) -> bool {
        false
    }
}

// ------------------------------------------------------------------------- PodTemplate

pub struct PodTemplateStrategy;

impl Strategy for PodTemplateStrategy {
    /// Kubernetes answers a delete with the deleted object.
    fn return_deleted_object(&self) -> bool {
        true
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        if let Some(spec) = obj.pointer_mut("/template/spec") {
            super::pod::default_pod_spec(spec);
        }
    }
    fn prepare_for_update(&self, new: &mut Value, _old: &Value) {
        self.prepare_for_create(new);
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        super::pod::validate_pod_template(obj.get("template"), "template")
    }
    fn tracks_generation(&self) -> bool {
        false
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        common_field_value(obj, field)
    }
}

// ------------------------------------------------------------------------- PodDisruptionBudget

/// policy/v1 PodDisruptionBudget: the disruption controller (controller-manager) keeps its
/// status, `pods/eviction` consumes it (`crate::eviction`).
pub struct PdbStrategy;

/// An `IntOrString` budget: a non-negative integer or a percentage 0–100% (Kubernetes'
/// `ValidatePodDisruptionBudgetSpec` → `ValidatePositiveIntOrPercent` + `IsNotMoreThan100Percent`).
fn int_or_percent_errors(v: &Value, field: &str) -> Option<FieldError> {
    match v {
        Value::Number(n) if n.as_i64().is_some_and(|i| i >= 0) => None,
        Value::Number(_) => Some(FieldError::invalid(field, v, "must be greater than or equal to 0")),
        Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            Some(p) if (0..=100).contains(&p) => None,
            Some(_) => Some(FieldError::invalid(field, v, "must not be greater than 100%")),
            None => Some(FieldError::invalid(
                field,
                v,
                "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
            )),
        },
        _ => Some(FieldError::invalid(field, v, "must be an integer or percentage (e.g '5%')")),
    }
}

impl Strategy for PdbStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        // The controller has not looked at it yet.
        obj["status"] = json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0});
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let min = obj.pointer("/spec/minAvailable").filter(|v| !v.is_null());
        let max = obj.pointer("/spec/maxUnavailable").filter(|v| !v.is_null());
        if let (Some(_), Some(m)) = (min, max) {
            errs.push(FieldError::invalid("spec", m, "minAvailable and maxUnavailable cannot be both set"));
        }
        errs.extend(min.and_then(|v| int_or_percent_errors(v, "spec.minAvailable")));
        errs.extend(max.and_then(|v| int_or_percent_errors(v, "spec.maxUnavailable")));
        if let Some(p) = str_at(obj, "/spec/unhealthyPodEvictionPolicy") {
            if !["IfHealthyBudget", "AlwaysAllow"].contains(&p) {
                errs.push(FieldError::not_supported(
                    "spec.unhealthyPodEvictionPolicy",
                    &json!(p),
                    &["AlwaysAllow", "IfHealthyBudget"],
                ));
            }
        }
        if let Some(sel) = obj.pointer("/spec/selector").filter(|s| !s.is_null()) {
            selector_errors("spec.selector", sel, &mut errs);
        }
        errs
    }
    fn tracks_generation(&self) -> bool {
        true
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        common_field_value(obj, field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregated_apiservices_are_defaulted_and_validated() {
        let svc = |extra: Value| {
            let mut spec = json!({"group": "wardle.example.com", "version": "v1alpha1", "groupPriorityMinimum": 1000,
                "versionPriority": 15, "service": {"namespace": "wardle", "name": "api"}});
            spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            json!({"metadata": {"name": "v1alpha1.wardle.example.com"}, "spec": spec})
        };
        let errors = |o: &Value| APISERVICE.validate(o).into_iter().map(|e| e.message).collect::<Vec<_>>();
        let mut created = svc(json!({}));
        APISERVICE.prepare_for_create(&mut created);
        assert_eq!(created["spec"]["service"]["port"], 443);
        assert!(created.get("status").is_none(), "the availability controller sets it");
        assert!(errors(&created).is_empty(), "{:?}", errors(&created));
        assert_eq!(
            errors(&svc(json!({"insecureSkipTLSVerify": true, "caBundle": "Y2E="}))),
            ["spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present"]
        );
        assert_eq!(errors(&svc(json!({"service": {"namespace": "", "name": "api", "port": 0}}))).len(), 2);
        let mut local = json!({"metadata": {"name": "v1.apps"}, "spec": {"group": "apps", "version": "v1",
            "groupPriorityMinimum": 17800, "versionPriority": 15, "caBundle": "Y2E="}});
        assert_eq!(
            errors(&local),
            ["spec.caBundle: Invalid value: \"3 bytes\": local APIServices may not have a caBundle"]
        );
        local["spec"].as_object_mut().unwrap().remove("caBundle");
        APISERVICE.prepare_for_create(&mut local);
        assert_eq!(local["status"]["conditions"][0]["reason"], "Local");
        // A Local APIService turned aggregated is not known to be available any more.
        let mut turned = svc(json!({}));
        turned["status"] = local["status"].clone();
        APISERVICE.prepare_for_update(&mut turned, &local);
        assert!(turned.get("status").is_none());
    }

    #[test]
    fn network_policies_are_validated() {
        let np = |spec: Value| json!({"metadata": {"name": "np"}, "spec": spec});
        let errors = |spec: Value| NETWORKPOLICY.validate(&np(spec)).into_iter().map(|e| e.message).collect::<Vec<_>>();
        let good = json!({"podSelector": {}, "ingress": [{
            "from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {"matchLabels": {"app": "x"}}},
                     {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
            "ports": [{"port": 80}, {"protocol": "UDP", "port": 53}, {"port": "http"}, {"port": 32000, "endPort": 32768}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]});
        assert!(errors(good).is_empty());
        let ingress = |rule: Value| errors(json!({"podSelector": {}, "ingress": [rule]}));
        assert_eq!(
            ingress(json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/33"}}]})),
            ["spec.ingress[0].from[0].ipBlock.cidr: Invalid value: \"10.0.0.0/33\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"]
        );
        assert_eq!(
            ingress(json!({"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.0/16", "192.168.0.0/24"]}}]})),
            [
                "spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"10.0.0.0/16\": must be a strict subset of `cidr`",
                "spec.ingress[0].from[0].ipBlock.except[1]: Invalid value: \"192.168.0.0/24\": must be a strict subset of `cidr`"
            ]
        );
        assert_eq!(
            ingress(json!({"from": [{}, {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]})),
            [
                "spec.ingress[0].from[0]: Required value: must specify a peer",
                "spec.ingress[0].from[1]: Forbidden: may not specify both ipBlock and another peer"
            ]
        );
        assert_eq!(
            ingress(json!({"ports": [{"port": 0}, {"port": 100, "endPort": 90}, {"port": "http", "endPort": 90}, {"protocol": "ICMP"}]})),
            [
                "spec.ingress[0].ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
                "spec.ingress[0].ports[1].endPort: Invalid value: 100: must be greater than or equal to `port`",
                "spec.ingress[0].ports[2].endPort: Invalid value: 90: may not be specified when `port` is non-numeric",
                "spec.ingress[0].ports[3].protocol: Unsupported value: \"ICMP\": supported values: \"TCP\", \"UDP\", \"SCTP\""
            ]
        );
        assert_eq!(
            errors(json!({"podSelector": {}, "egress": [{"ports": [{"port": "Web--1"}]}]})),
            [
                "spec.egress[0].ports[0].port: Invalid value: \"Web--1\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
                "spec.egress[0].ports[0].port: Invalid value: \"Web--1\": must not contain consecutive hyphens"
            ]
        );
        assert_eq!(
            NETWORKPOLICY.validate(&np(json!({"podSelector": {"matchLabels": {"bad key": "x"}}})))[0].field,
            "spec.podSelector"
        );
    }

    #[test]
    fn disruption_budgets_are_validated() {
        let pdb = |spec: Value| json!({"metadata": {"name": "web"}, "spec": spec});
        let fields = |spec: Value| PDB.validate(&pdb(spec)).into_iter().map(|e| e.field).collect::<Vec<_>>();
        assert!(fields(json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}})).is_empty());
        assert!(fields(json!({"maxUnavailable": "25%"})).is_empty());
        assert_eq!(fields(json!({"minAvailable": 1, "maxUnavailable": 1})), ["spec"]);
        assert_eq!(fields(json!({"minAvailable": -1})), ["spec.minAvailable"]);
        assert_eq!(fields(json!({"maxUnavailable": "150%"})), ["spec.maxUnavailable"]);
        assert_eq!(fields(json!({"maxUnavailable": "half"})), ["spec.maxUnavailable"]);
        assert_eq!(fields(json!({"unhealthyPodEvictionPolicy": "Never"})), ["spec.unhealthyPodEvictionPolicy"]);
        assert_eq!(fields(json!({"selector": {"matchLabels": {"bad key": "x"}}})), ["spec.selector"]);
        let mut created = pdb(json!({"minAvailable": 1}));
        PDB.prepare_for_create(&mut created);
        assert_eq!(created["status"]["disruptionsAllowed"], 0);
    }

    #[test]
    fn controller_revision_data_is_immutable_and_pod_templates_validated() {
        let old = json!({"metadata": {"name": "r1"}, "revision": 1, "data": {"spec": 1}});
        let mut new = old.clone();
        new["data"] = json!({"spec": 2});
        assert_eq!(CONTROLLERREVISION.validate_update(&new, &old)[0].field, "data");
        assert_eq!(CONTROLLERREVISION.validate(&json!({"data": {}}))[0].field, "revision");
        let mut t = json!({"metadata": {"name": "t"}, "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}});
        PODTEMPLATE.prepare_for_create(&mut t);
        assert_eq!(t["template"]["spec"]["restartPolicy"], "Always");
        assert!(PODTEMPLATE.validate(&t).is_empty());
        assert_eq!(PODTEMPLATE.validate(&json!({"template": {"spec": {}}}))[0].field, "template.spec.containers");
    }

    #[test]
    fn secret_string_data_folds() {
        let mut s = json!({"metadata": {"name": "creds"}, "stringData": {"password": "s3cr3t"}, "data": {"a": "YQ=="}});
        SECRET.prepare_for_create(&mut s);
        assert!(s.get("stringData").is_none());
        assert_eq!(s["data"]["password"], "czNjcjN0");
        assert_eq!(s["data"]["a"], "YQ==");
        assert_eq!(s["type"], "Opaque");
    }

    #[test]
    fn configmap_keys() {
        let cm = json!({"data": {"ok.key": "v", "bad/key": "v"}});
        let errs = CONFIGMAP.validate(&cm);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "data[bad/key]");
    }

    #[test]
    fn namespace_defaults() {
        let mut ns = json!({"metadata": {"name": "demo"}});
        NAMESPACE.prepare_for_create(&mut ns);
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(ns["status"]["phase"], "Active");
        assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "demo");
        assert!(NAMESPACE.deletion_blocked(&ns));
    }

    #[test]
    fn pv_and_pvc() {
        let pv = json!({"spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/x"}}});
        assert!(PV.validate(&pv).is_empty());
        let bad = json!({"spec": {"accessModes": ["Bogus"]}});
        assert_eq!(PV.validate(&bad).len(), 3);
        let pvc = json!({"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
        assert!(PVC.validate(&pvc).is_empty());
    }

    #[test]
    fn ingress_rules() {
        let ing = json!({"spec": {"rules": [{"host": "myservice.com", "http": {"paths": [
            {"path": "/web", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}});
        assert!(INGRESS.validate(&ing).is_empty());
        let bad = json!({"spec": {"rules": [{"http": {"paths": [{"path": "/web", "backend": {}}]}}]}});
        assert_eq!(INGRESS.validate(&bad).len(), 2);
    }
}
