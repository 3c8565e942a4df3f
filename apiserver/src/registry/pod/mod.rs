//! The Pod's one home, as Kubernetes keeps `pkg/registry/core/pod/`: pod-spec defaults and
//! validation (shared with every pod template), the Pod strategy with its
//! `ephemeralcontainers` subresource (here), and the Pod's other subresources —
//! [`binding`] (the scheduler's placement), [`eviction`] (deletion within disruption
//! budgets), [`proxy`] (`log`, `exec`, `attach`, `portforward` through the node's kubelet).

pub mod binding;
pub mod eviction;
pub mod proxy;

use std::collections::HashSet;

use serde_json::{json, Value};

use super::{common_field_value, default_at, str_at, Strategy};
use crate::error::FieldError;
use crate::registry::Sub;
use crate::validation::{dns1123_label_errors, dns1123_subdomain_errors};

/// Kubernetes' defaults for a PodSpec (pkg/apis/core/v1/defaults.go), in place.
pub fn default_pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    default_at(spec, "/restartPolicy", json!("Always"));
    default_at(spec, "/dnsPolicy", json!("ClusterFirst"));
    default_at(spec, "/schedulerName", json!("default-scheduler"));
    default_at(spec, "/terminationGracePeriodSeconds", json!(30));
    default_at(spec, "/securityContext", json!({}));
    default_at(spec, "/enableServiceLinks", json!(true));
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                default_container(c);
            }
        }
    }
    if let Some(vols) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        for v in vols {
            if let Some(s) = v.get_mut("secret").filter(|s| s.is_object()) {
                default_at(s, "/defaultMode", json!(420));
            }
            if let Some(s) = v.get_mut("configMap").filter(|s| s.is_object()) {
                default_at(s, "/defaultMode", json!(420));
            }
            if let Some(s) = v.get_mut("hostPath").filter(|s| s.is_object()) {
                default_at(s, "/type", json!(""));
            }
        }
    }
}

/// The object a PUT/PATCH of `pods/<name>/ephemeralcontainers` stores: the stored pod with
/// the request's ephemeral containers, defaulted.
pub fn with_ephemeral_containers(old: &Value, new: &Value) -> Value {
    let mut ephemeral = new.pointer("/spec/ephemeralContainers").cloned().unwrap_or(json!([]));
    if let Some(cs) = ephemeral.as_array_mut() {
        cs.iter_mut().for_each(default_container);
    }
    let mut out = old.clone();
    super::set_at(&mut out, "/spec/ephemeralContainers", ephemeral);
    out
}

fn default_container(c: &mut Value) {
    if !c.is_object() {
        return;
    }
    let image = str_at(c, "/image").unwrap_or_default().to_string();
    let policy = if image_tag_is_latest(&image) { "Always" } else { "IfNotPresent" };
    default_at(c, "/imagePullPolicy", json!(policy));
    default_at(c, "/terminationMessagePath", json!("/dev/termination-log"));
    default_at(c, "/terminationMessagePolicy", json!("File"));
    default_at(c, "/resources", json!({}));
    if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            default_at(p, "/protocol", json!("TCP"));
        }
    }
    // Requests default to limits when only limits are given.
    if let Some(limits) = super::at(c, "/resources/limits").cloned().and_then(|l| l.as_object().cloned()) {
        for (k, v) in limits {
            // Resource names like `nvidia.com/gpu` contain '/': escape it for the pointer.
            let key = k.replace('~', "~0").replace('/', "~1");
            default_at(c, &format!("/resources/requests/{key}"), v);
        }
    }
}

/// `image` without a tag or with `:latest` (and no digest) is pulled Always.
pub fn image_tag_is_latest(image: &str) -> bool {
    if image.contains('@') {
        return false;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, tag)) => tag == "latest",
        None => true,
    }
}

/// Validate a PodSpec at `path` (e.g. `spec` or `spec.template.spec`).
pub fn validate_pod_spec(spec: Option<&Value>, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(spec) = spec.filter(|s| s.is_object()) else {
        errs.push(FieldError::required(format!("{path}.containers"), ""));
        return errs;
    };
    let mut names = HashSet::new();
    let containers = spec.get("containers").and_then(Value::as_array);
    if containers.is_none_or(|c| c.is_empty()) {
        errs.push(FieldError::required(format!("{path}.containers"), ""));
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for (i, c) in spec.get(list).and_then(Value::as_array).into_iter().flatten().enumerate() {
            let cpath = format!("{path}.{list}[{i}]");
            if list == "ephemeralContainers" {
                errs.extend(ephemeral_container_errors(spec, c, &cpath));
            }
            let name = str_at(c, "/name").unwrap_or_default();
            if name.is_empty() {
                errs.push(FieldError::required(format!("{cpath}.name"), ""));
            } else if let Some(m) = dns1123_label_errors(name) {
                errs.push(FieldError::invalid(format!("{cpath}.name"), &json!(name), &m));
            } else if !names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(format!("{cpath}.name"), &json!(name)));
            }
            if str_at(c, "/image").unwrap_or_default().trim().is_empty() {
                errs.push(FieldError::required(format!("{cpath}.image"), ""));
            }
            let mut port_names = HashSet::new();
            for (j, p) in c.get("ports").and_then(Value::as_array).into_iter().flatten().enumerate() {
                let pp = format!("{cpath}.ports[{j}]");
                match p.get("containerPort").and_then(Value::as_i64) {
                    Some(n) if (1..=65535).contains(&n) => {}
                    Some(n) => errs.push(FieldError::invalid(
                        format!("{pp}.containerPort"),
                        &json!(n),
                        "must be between 1 and 65535, inclusive",
                    )),
                    None => errs.push(FieldError::required(format!("{pp}.containerPort"), "")),
                }
                if let Some(proto) = str_at(p, "/protocol") {
                    if !["TCP", "UDP", "SCTP"].contains(&proto) {
                        errs.push(FieldError::not_supported(
                            format!("{pp}.protocol"),
                            &json!(proto),
                            &["SCTP", "TCP", "UDP"],
                        ));
                    }
                }
                if let Some(pn) = str_at(p, "/name") {
                    if !pn.is_empty() && !port_names.insert(pn.to_string()) {
                        errs.push(FieldError::duplicate(format!("{pp}.name"), &json!(pn)));
                    }
                }
            }
            if list != "ephemeralContainers" {
                errs.extend(resource_requirements_errors(c.get("resources"), &format!("{cpath}.resources")));
            }
            if let Some(policy) = str_at(c, "/imagePullPolicy") {
                if !["Always", "IfNotPresent", "Never"].contains(&policy) {
                    errs.push(FieldError::not_supported(
                        format!("{cpath}.imagePullPolicy"),
                        &json!(policy),
                        &["Always", "IfNotPresent", "Never"],
                    ));
                }
            }
        }
    }
    let mut vol_names = HashSet::new();
    for (i, v) in spec.get("volumes").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let name = str_at(v, "/name").unwrap_or_default();
        let vp = format!("{path}.volumes[{i}].name");
        if name.is_empty() {
            errs.push(FieldError::required(vp, ""));
        } else if let Some(m) = dns1123_label_errors(name) {
            errs.push(FieldError::invalid(vp, &json!(name), &m));
        } else if !vol_names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(vp, &json!(name)));
        }
    }
    // Every volumeMount must name a volume.
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for (i, c) in spec.get(list).and_then(Value::as_array).into_iter().flatten().enumerate() {
            for (j, m) in c.get("volumeMounts").and_then(Value::as_array).into_iter().flatten().enumerate() {
                let n = str_at(m, "/name").unwrap_or_default();
                if !vol_names.contains(n) {
                    errs.push(FieldError {
                        reason: "FieldValueNotFound",
                        field: format!("{path}.{list}[{i}].volumeMounts[{j}].name"),
                        message: format!("{path}.{list}[{i}].volumeMounts[{j}].name: Not found: {n:?}"),
                    });
                }
                if str_at(m, "/mountPath").unwrap_or_default().is_empty() {
                    errs.push(FieldError::required(format!("{path}.{list}[{i}].volumeMounts[{j}].mountPath"), ""));
                }
            }
        }
    }
    if let Some(rp) = str_at(spec, "/restartPolicy") {
        if !["Always", "OnFailure", "Never"].contains(&rp) {
            errs.push(FieldError::not_supported(
                format!("{path}.restartPolicy"),
                &json!(rp),
                &["Always", "OnFailure", "Never"],
            ));
        }
    }
    if let Some(dp) = str_at(spec, "/dnsPolicy") {
        if !["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"].contains(&dp) {
            errs.push(FieldError::not_supported(
                format!("{path}.dnsPolicy"),
                &json!(dp),
                &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
            ));
        }
    }
    if let Some(node) = str_at(spec, "/nodeName").filter(|n| !n.is_empty()) {
        if let Some(m) = dns1123_subdomain_errors(node) {
            errs.push(FieldError::invalid(format!("{path}.nodeName"), &json!(node), &m));
        }
    }
    if let Some(g) = spec.get("terminationGracePeriodSeconds").and_then(Value::as_i64) {
        if g < 0 {
            errs.push(FieldError::invalid(
                format!("{path}.terminationGracePeriodSeconds"),
                &json!(g),
                "must be greater than or equal to 0",
            ));
        }
    }
    errs
}

/// A container's `resources` (Kubernetes' `ValidateResourceRequirements`): quantities are
/// non-negative, extended resources (`example.com/widget`) whole numbers; a request is at most
/// its limit, and for resources that cannot be overcommitted (extended ones, hugepages) equal
/// to it, which also means a limit must be set.
pub fn resource_requirements_errors(resources: Option<&Value>, path: &str) -> Vec<FieldError> {
    use apimachinery::{quantity, resources};
    let mut errs = Vec::new();
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let map = |key: &str| resources.and_then(|r| r.get(key)).and_then(Value::as_object);
    let (requests, limits) = (map("requests"), map("limits"));
    for (key, m) in [("limits", limits), ("requests", requests)] {
        for (name, v) in m.into_iter().flatten() {
            let field = format!("{path}.{key}[{name}]");
            let Some(q) = quantity::parse(&text(v)) else { continue };
            if q < 0.0 {
                errs.push(FieldError::invalid(&field, &json!(text(v)), "must be greater than or equal to 0"));
            } else if resources::is_integer(name) && (q * 1000.0).round() % 1000.0 != 0.0 {
                errs.push(FieldError::invalid(&field, &json!(text(v)), "must be an integer"));
            }
        }
    }
    for (name, v) in requests.into_iter().flatten() {
        let field = format!("{path}.requests[{name}]");
        let req = quantity::parse(&text(v));
        match limits.and_then(|l| l.get(name)) {
            Some(l) => {
                let lim = quantity::parse(&text(l));
                let (Some(req), Some(lim)) = (req, lim) else { continue };
                if (req - lim).abs() > f64::EPSILON * lim.abs().max(1.0) && !resources::is_overcommit_allowed(name) {
                    errs.push(FieldError::invalid(
                        &field,
                        &json!(text(v)),
                        &format!("must be equal to {name} limit of {}", text(l)),
                    ));
                } else if req > lim {
                    errs.push(FieldError::invalid(
                        &field,
                        &json!(text(v)),
                        &format!("must be less than or equal to {name} limit of {}", text(l)),
                    ));
                }
            }
            None if !resources::is_overcommit_allowed(name) => errs.push(FieldError::required(
                format!("{path}.limits[{name}]"),
                "Limit must be set for non overcommitable resources",
            )),
            None => {}
        }
    }
    errs
}

/// What an ephemeral container may not have (Kubernetes' `validateEphemeralContainers`): no
/// ports, probes, lifecycle hooks, resources or restart policy; a target that is one of the
/// pod's containers.
fn ephemeral_container_errors(spec: &Value, c: &Value, cpath: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for field in ["ports", "livenessProbe", "readinessProbe", "startupProbe", "lifecycle", "restartPolicy"] {
        if c.get(field).is_some_and(|v| !v.is_null()) {
            errs.push(FieldError::forbidden(format!("{cpath}.{field}"), "cannot be set for an Ephemeral Container"));
        }
    }
    let resources = c.get("resources").and_then(Value::as_object);
    if resources.is_some_and(|r| r.values().any(|v| v.as_object().is_some_and(|m| !m.is_empty()))) {
        errs.push(FieldError::forbidden(format!("{cpath}.resources"), "cannot be set for an Ephemeral Container"));
    }
    if let Some(target) = str_at(c, "/targetContainerName").filter(|t| !t.is_empty()) {
        let known = ["containers", "initContainers"]
            .iter()
            .flat_map(|l| spec.get(*l).and_then(Value::as_array).into_iter().flatten())
            .any(|x| str_at(x, "/name") == Some(target));
        if !known {
            errs.push(FieldError {
                reason: "FieldValueNotFound",
                field: format!("{cpath}.targetContainerName"),
                message: format!("{cpath}.targetContainerName: Not found: {target:?}"),
            });
        }
    }
    errs
}

/// An update through `pods/<name>/ephemeralcontainers` (`ValidatePodEphemeralContainersUpdate`):
/// ephemeral containers may be added, never changed or removed; the new ones are validated
/// with the rest of the spec.
pub fn validate_ephemeral_containers_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = validate_pod_spec(new.get("spec"), "spec");
    let list =
        |v: &Value| v.pointer("/spec/ephemeralContainers").and_then(Value::as_array).cloned().unwrap_or_default();
    let (new_list, old_list) = (list(new), list(old));
    for old_c in &old_list {
        let name = str_at(old_c, "/name").unwrap_or_default();
        match new_list.iter().position(|c| str_at(c, "/name") == Some(name)) {
            None => errs.push(FieldError::forbidden(
                "spec.ephemeralContainers",
                &format!("existing ephemeral containers {name:?} may not be removed"),
            )),
            Some(i) if &new_list[i] != old_c => errs.push(FieldError::forbidden(
                format!("spec.ephemeralContainers[{i}]"),
                &format!("existing ephemeral containers {name:?} may not be changed"),
            )),
            Some(_) => {}
        }
    }
    errs
}

/// Pod template (`spec.template`) validation: metadata labels and the pod spec.
pub fn validate_pod_template(template: Option<&Value>, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(t) = template else {
        errs.push(FieldError::required(path, ""));
        return errs;
    };
    if let Some(labels) = t.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if let Some(m) = crate::validation::qualified_name_errors(k) {
                errs.push(FieldError::invalid(format!("{path}.metadata.labels"), &json!(k), &m));
            }
            if let Some(m) = v.as_str().and_then(crate::validation::label_value_errors) {
                errs.push(FieldError::invalid(format!("{path}.metadata.labels"), v, &m));
            }
        }
    }
    errs.extend(validate_pod_spec(t.get("spec"), &format!("{path}.spec")));
    if t.pointer("/spec/ephemeralContainers").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
        errs.push(FieldError::forbidden(
            format!("{path}.spec.ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
    errs
}

/// Kubernetes' QoS class of a pod spec.
pub fn qos_class(spec: &Value) -> &'static str {
    let mut all_guaranteed = true;
    let mut any_set = false;
    for list in ["initContainers", "containers"] {
        for c in spec.get(list).and_then(Value::as_array).into_iter().flatten() {
            let req = c.pointer("/resources/requests").and_then(Value::as_object);
            let lim = c.pointer("/resources/limits").and_then(Value::as_object);
            if req.is_some_and(|r| !r.is_empty()) || lim.is_some_and(|l| !l.is_empty()) {
                any_set = true;
            }
            for res in ["cpu", "memory"] {
                let r = req.and_then(|r| r.get(res));
                let l = lim.and_then(|l| l.get(res));
                match (r, l) {
                    (Some(r), Some(l)) if r == l => {}
                    (None, Some(_)) => {}
                    _ => all_guaranteed = false,
                }
            }
        }
    }
    if !any_set {
        "BestEffort"
    } else if all_guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

pub struct PodStrategy;

const POD_MUTABLE_SPEC: &[&str] =
    &["activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates"];

impl Strategy for PodStrategy {
    fn prepare_subresource_update(&self, sub: Sub, new: &Value, old: &Value) -> Option<Value> {
        (sub == Sub::EphemeralContainers).then(|| with_ephemeral_containers(old, new))
    }
    fn validate_subresource_update(&self, _sub: Sub, new: &Value, old: &Value) -> Vec<FieldError> {
        validate_ephemeral_containers_update(new, old)
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        if let Some(spec) = obj.get_mut("spec") {
            default_pod_spec(spec);
        }
        default_at(obj, "/spec/serviceAccountName", json!("default"));
        default_at(obj, "/spec/serviceAccount", json!("default"));
        default_at(obj, "/spec/priority", json!(0));
        let qos = obj.get("spec").map(qos_class).unwrap_or("BestEffort");
        obj["status"] = json!({"phase": "Pending", "qosClass": qos});
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_pod_spec(obj.get("spec"), "spec")
    }
    fn validate_create(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(obj);
        if obj.pointer("/spec/ephemeralContainers").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
            errs.push(FieldError::forbidden("spec.ephemeralContainers", "cannot be set on create"));
        }
        errs
    }
    /// Ephemeral containers change only through their subresource: a main update keeps the
    /// stored ones.
    fn prepare_for_update(&self, new: &mut Value, old: &Value) {
        let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) else { return };
        match old.pointer("/spec/ephemeralContainers") {
            Some(ec) => {
                spec.insert("ephemeralContainers".into(), ec.clone());
            }
            None => {
                spec.remove("ephemeralContainers");
            }
        }
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        // Only images, activeDeadlineSeconds, tolerations (and a few more) may change.
        let mask = |v: &Value| {
            let mut s = v.get("spec").cloned().unwrap_or(Value::Null);
            if let Some(m) = s.as_object_mut() {
                for k in POD_MUTABLE_SPEC {
                    m.remove(*k);
                }
                for list in ["containers", "initContainers"] {
                    if let Some(cs) = m.get_mut(list).and_then(Value::as_array_mut) {
                        for c in cs {
                            if let Some(c) = c.as_object_mut() {
                                c.remove("image");
                            }
                        }
                    }
                }
            }
            s
        };
        if mask(new) != mask(old) {
            errs.push(FieldError::forbidden(
                "spec",
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            ));
        }
        errs
    }
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        let s = |p: &str| Some(str_at(obj, p).unwrap_or_default().to_string());
        match field {
            "spec.nodeName" => s("/spec/nodeName"),
            "spec.restartPolicy" => s("/spec/restartPolicy"),
            "spec.schedulerName" => s("/spec/schedulerName"),
            "spec.serviceAccountName" => s("/spec/serviceAccountName"),
            "spec.hostNetwork" => {
                Some(obj.pointer("/spec/hostNetwork").and_then(Value::as_bool).unwrap_or(false).to_string())
            }
            "status.phase" => s("/status/phase"),
            "status.podIP" => s("/status/podIP"),
            "status.nominatedNodeName" => s("/status/nominatedNodeName"),
            _ => common_field_value(obj, field),
        }
    }
    fn tracks_generation(&self) -> bool {
        true
    }
    fn graceful_delete_seconds(&self, obj: &Value, requested: Option<i64>) -> Option<i64> {
        // Unscheduled pods and finished pods go at once (as in Kubernetes).
        if str_at(obj, "/spec/nodeName").unwrap_or_default().is_empty() {
            return Some(0);
        }
        let phase = str_at(obj, "/status/phase").unwrap_or_default();
        if phase == "Succeeded" || phase == "Failed" {
            return Some(0);
        }
        let grace = requested
            .or_else(|| obj.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64))
            .unwrap_or(30);
        Some(grace.max(0))
    }
    fn return_deleted_object(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resources_are_whole_and_requested_as_limited() {
        let errs = |r: Value| -> Vec<String> {
            resource_requirements_errors(Some(&r), "spec.containers[0].resources")
                .into_iter()
                .map(|e| e.message)
                .collect()
        };
        assert!(errs(json!({"requests": {"example.com/widget": "2", "cpu": "100m"},
            "limits": {"example.com/widget": 2, "cpu": "1"}}))
        .is_empty());
        assert_eq!(
            errs(json!({"requests": {"example.com/widget": "1"}})),
            ["spec.containers[0].resources.limits[example.com/widget]: Required value: Limit must be set for non overcommitable resources"]
        );
        assert_eq!(
            errs(json!({"requests": {"example.com/widget": "1"}, "limits": {"example.com/widget": "2"}})),
            ["spec.containers[0].resources.requests[example.com/widget]: Invalid value: \"1\": must be equal to example.com/widget limit of 2"]
        );
        assert_eq!(
            errs(json!({"requests": {"example.com/widget": "500m"}, "limits": {"example.com/widget": "500m"}})),
            [
                "spec.containers[0].resources.limits[example.com/widget]: Invalid value: \"500m\": must be an integer",
                "spec.containers[0].resources.requests[example.com/widget]: Invalid value: \"500m\": must be an integer",
            ]
        );
        assert_eq!(
            errs(json!({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}})),
            ["spec.containers[0].resources.requests[cpu]: Invalid value: \"2\": must be less than or equal to cpu limit of 1"]
        );
        assert_eq!(
            errs(json!({"limits": {"memory": "-1"}})),
            ["spec.containers[0].resources.limits[memory]: Invalid value: \"-1\": must be greater than or equal to 0"]
        );
    }

    #[test]
    fn requests_default_to_limits_including_extended_resources() {
        let mut c = json!({"name": "a", "image": "x", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": 2}}});
        default_container(&mut c);
        assert_eq!(c.pointer("/resources/requests"), Some(&json!({"cpu": "1", "nvidia.com/gpu": 2})));
    }

    #[test]
    fn image_latest() {
        assert!(image_tag_is_latest("busybox"));
        assert!(image_tag_is_latest("busybox:latest"));
        assert!(!image_tag_is_latest("busybox:1.36"));
        assert!(image_tag_is_latest("localhost:5000/busybox"));
        assert!(!image_tag_is_latest("busybox@sha256:abc"));
    }

    #[test]
    fn pod_validation() {
        let errs = validate_pod_spec(Some(&json!({"containers": []})), "spec");
        assert_eq!(errs[0].field, "spec.containers");
        let errs = validate_pod_spec(
            Some(&json!({"containers": [{"name": "a", "image": "x"}, {"name": "a", "image": "y"}]})),
            "spec",
        );
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].reason, "FieldValueDuplicate");
        assert_eq!(errs[0].field, "spec.containers[1].name");
        let errs = validate_pod_spec(
            Some(
                &json!({"containers": [{"name": "a", "image": "x", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}),
            ),
            "spec",
        );
        assert_eq!(errs[0].field, "spec.containers[0].volumeMounts[0].name");
        assert!(validate_pod_spec(None, "spec.template.spec")[0].field == "spec.template.spec.containers");
    }

    #[test]
    fn defaults_and_qos() {
        let mut spec = json!({"containers": [{"name": "a", "image": "busybox", "ports": [{"containerPort": 80}],
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]});
        default_pod_spec(&mut spec);
        assert_eq!(spec["restartPolicy"], "Always");
        assert_eq!(spec["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(spec["containers"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(spec["containers"][0]["resources"]["requests"]["cpu"], "1");
        assert_eq!(qos_class(&spec), "Guaranteed");
        assert_eq!(qos_class(&json!({"containers": [{"name": "a"}]})), "BestEffort");
        assert_eq!(
            qos_class(&json!({"containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]})),
            "Burstable"
        );
    }

    #[test]
    fn pod_update_immutability() {
        let old = json!({"spec": {"containers": [{"name": "a", "image": "x"}]}});
        let ok = json!({"spec": {"containers": [{"name": "a", "image": "y"}], "activeDeadlineSeconds": 5}});
        assert!(PodStrategy.validate_update(&ok, &old).is_empty());
        let bad = json!({"spec": {"containers": [{"name": "a", "image": "y", "command": ["sh"]}]}});
        assert_eq!(PodStrategy.validate_update(&bad, &old)[0].reason, "FieldValueForbidden");
    }

    fn fields(errs: Vec<FieldError>) -> Vec<String> {
        errs.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn ephemeral_containers_are_added_through_their_subresource_only() {
        let debugger = json!({"name": "debugger", "image": "busybox", "targetContainerName": "a", "stdin": true});
        let old = json!({"spec": {"containers": [{"name": "a", "image": "x"}]}});
        let mut new = old.clone();
        new["spec"]["ephemeralContainers"] = json!([debugger]);
        assert!(validate_ephemeral_containers_update(&new, &old).is_empty());
        // Not on create, not in templates, and a main update keeps the stored ones.
        assert_eq!(fields(PodStrategy.validate_create(&new)), ["spec.ephemeralContainers"]);
        let template = json!({"metadata": {"labels": {"a": "b"}}, "spec": new["spec"].clone()});
        assert_eq!(
            fields(validate_pod_template(Some(&template), "spec.template")),
            ["spec.template.spec.ephemeralContainers"]
        );
        let mut main = new.clone();
        PodStrategy.prepare_for_update(&mut main, &old);
        assert!(main.pointer("/spec/ephemeralContainers").is_none());
        PodStrategy.prepare_for_update(&mut main, &new);
        assert_eq!(main.pointer("/spec/ephemeralContainers/0/name"), Some(&json!("debugger")));
        // Existing ones may be neither changed nor removed.
        let mut changed = new.clone();
        changed["spec"]["ephemeralContainers"][0]["image"] = json!("alpine");
        assert_eq!(fields(validate_ephemeral_containers_update(&changed, &new)), ["spec.ephemeralContainers[0]"]);
        assert_eq!(fields(validate_ephemeral_containers_update(&old, &new)), ["spec.ephemeralContainers"]);
    }

    #[test]
    fn ephemeral_container_fields_are_checked() {
        let old = json!({"spec": {"containers": [{"name": "a", "image": "x"}]}});
        let with = |c: Value| {
            let mut p = old.clone();
            p["spec"]["ephemeralContainers"] = json!([c]);
            fields(validate_ephemeral_containers_update(&p, &old))
        };
        assert_eq!(with(json!({"name": "a", "image": "busybox"})), ["spec.ephemeralContainers[0].name"]);
        assert_eq!(with(json!({"name": "d"})), ["spec.ephemeralContainers[0].image"]);
        assert_eq!(
            with(json!({"name": "d", "image": "b", "ports": [{"containerPort": 80}], "readinessProbe": {}})),
            ["spec.ephemeralContainers[0].ports", "spec.ephemeralContainers[0].readinessProbe"]
        );
        assert_eq!(
            with(json!({"name": "d", "image": "b", "resources": {"limits": {"cpu": "1"}}})),
            ["spec.ephemeralContainers[0].resources"]
        );
        assert!(with(json!({"name": "d", "image": "b", "resources": {}})).is_empty());
        assert_eq!(
            with(json!({"name": "d", "image": "b", "targetContainerName": "nope"})),
            ["spec.ephemeralContainers[0].targetContainerName"]
        );
    }
}
