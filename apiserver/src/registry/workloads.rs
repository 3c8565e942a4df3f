//! Workload controllers' kinds: Deployment, ReplicaSet, StatefulSet, DaemonSet,
//! ReplicationController, Job, CronJob.

use serde_json::{json, Value};

use super::pod::{default_pod_spec, validate_pod_template};
use super::{common_field_value, default_at, str_at, Strategy};
use crate::error::FieldError;
use crate::selectors::{labels_of, LabelSelector};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Deployment,
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    ReplicationController,
    Job,
    CronJob,
}

pub struct WorkloadStrategy(pub Workload);

fn default_template(obj: &mut Value, pointer: &str) {
    if let Some(spec) = obj.pointer_mut(pointer) {
        default_pod_spec(spec);
    }
}

/// `spec.selector` must be non-empty, valid, and match the template's labels.
fn validate_selector(obj: &Value, errs: &mut Vec<FieldError>) {
    let Some(sel) = obj.pointer("/spec/selector") else {
        errs.push(FieldError::required("spec.selector", ""));
        return;
    };
    match LabelSelector::from_label_selector_json(sel) {
        Err(e) => errs.push(FieldError::invalid("spec.selector", sel, &e.0)),
        Ok(s) if s.is_empty() => {
            errs.push(FieldError::invalid("spec.selector", sel, "empty selector is invalid for deployment"))
        }
        Ok(s) => {
            let labels = obj.pointer("/spec/template/metadata/labels").cloned().unwrap_or(json!({}));
            if !s.matches(&labels_of(&json!({"metadata": {"labels": labels}}))) {
                errs.push(FieldError::invalid(
                    "spec.template.metadata.labels",
                    &labels,
                    "`selector` does not match template `labels`",
                ));
            }
        }
    }
}

fn validate_replicas(obj: &Value, errs: &mut Vec<FieldError>) {
    if let Some(r) = obj.pointer("/spec/replicas").and_then(Value::as_i64) {
        if r < 0 {
            errs.push(FieldError::invalid("spec.replicas", &json!(r), "must be greater than or equal to 0"));
        }
    }
}

/// A string field that, when present, must be one of `allowed` (`Unsupported value`).
fn validate_one_of(obj: &Value, pointer: &str, path: &str, allowed: &[&str], errs: &mut Vec<FieldError>) {
    if let Some(rp) = str_at(obj, pointer) {
        if !allowed.contains(&rp) {
            errs.push(FieldError::not_supported(path, &json!(rp), allowed));
        }
    }
}

/// A cron schedule: five fields (or a `@macro`), each made of digits, `*`, `/`, `,`, `-`,
/// `?` or names. This is a shape check; the CronJob controller parses it fully.
pub fn cron_schedule_errors(s: &str) -> Option<String> {
    let s = s.trim();
    let s = match s.strip_prefix("TZ=").or_else(|| s.strip_prefix("CRON_TZ=")) {
        Some(rest) => return Some(format!("CRON_TZ or TZ used in schedule {rest:?} is not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details")),
        None => s,
    };
    if s.starts_with('@') {
        return match s {
            "@yearly" | "@annually" | "@monthly" | "@weekly" | "@daily" | "@midnight" | "@hourly" => None,
            _ if s.starts_with("@every ") => None,
            _ => Some(format!("unrecognized descriptor: {s}")),
        };
    }
    let fields: Vec<&str> = s.split_whitespace().collect();
    if fields.len() != 5 {
        return Some(format!("expected exactly 5 fields, found {}: {s}", fields.len()));
    }
    for f in fields {
        if !f.chars().all(|c| c.is_ascii_alphanumeric() || "*/,-?".contains(c)) {
            return Some(format!("failed to parse {f:?}"));
        }
    }
    None
}

impl Strategy for WorkloadStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        use Workload::*;
        match self.0 {
            Deployment => {
                default_at(obj, "/spec/replicas", json!(1));
                default_at(obj, "/spec/strategy/type", json!("RollingUpdate"));
                if str_at(obj, "/spec/strategy/type") == Some("RollingUpdate") {
                    default_at(obj, "/spec/strategy/rollingUpdate/maxUnavailable", json!("25%"));
                    default_at(obj, "/spec/strategy/rollingUpdate/maxSurge", json!("25%"));
                }
                default_at(obj, "/spec/revisionHistoryLimit", json!(10));
                default_at(obj, "/spec/progressDeadlineSeconds", json!(600));
                default_template(obj, "/spec/template/spec");
            }
            ReplicaSet => {
                default_at(obj, "/spec/replicas", json!(1));
                default_template(obj, "/spec/template/spec");
            }
            ReplicationController => {
                default_at(obj, "/spec/replicas", json!(1));
                // The selector defaults to the template's labels.
                if obj.pointer("/spec/selector").is_none_or(|s| s.as_object().is_none_or(|m| m.is_empty())) {
                    if let Some(labels) = obj.pointer("/spec/template/metadata/labels").cloned() {
                        super::set_at(obj, "/spec/selector", labels);
                    }
                }
                default_template(obj, "/spec/template/spec");
            }
            StatefulSet => {
                default_at(obj, "/spec/replicas", json!(1));
                default_at(obj, "/spec/podManagementPolicy", json!("OrderedReady"));
                default_at(obj, "/spec/updateStrategy/type", json!("RollingUpdate"));
                if str_at(obj, "/spec/updateStrategy/type") == Some("RollingUpdate") {
                    default_at(obj, "/spec/updateStrategy/rollingUpdate/partition", json!(0));
                }
                default_at(obj, "/spec/revisionHistoryLimit", json!(10));
                default_at(
                    obj,
                    "/spec/persistentVolumeClaimRetentionPolicy",
                    json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
                );
                default_template(obj, "/spec/template/spec");
            }
            DaemonSet => {
                default_at(obj, "/spec/updateStrategy/type", json!("RollingUpdate"));
                if str_at(obj, "/spec/updateStrategy/type") == Some("RollingUpdate") {
                    default_at(obj, "/spec/updateStrategy/rollingUpdate/maxUnavailable", json!(1));
                    default_at(obj, "/spec/updateStrategy/rollingUpdate/maxSurge", json!(0));
                }
                default_at(obj, "/spec/revisionHistoryLimit", json!(10));
                default_template(obj, "/spec/template/spec");
            }
            Job => {
                default_job_spec(obj, "/spec");
            }
            CronJob => {
                default_at(obj, "/spec/concurrencyPolicy", json!("Allow"));
                default_at(obj, "/spec/suspend", json!(false));
                default_at(obj, "/spec/successfulJobsHistoryLimit", json!(3));
                default_at(obj, "/spec/failedJobsHistoryLimit", json!(1));
                // The job template's selector is generated per Job, so only pod defaults here.
                let jt = "/spec/jobTemplate/spec";
                default_at(obj, &format!("{jt}/backoffLimit"), json!(6));
                default_at(obj, &format!("{jt}/completionMode"), json!("NonIndexed"));
                default_at(obj, &format!("{jt}/suspend"), json!(false));
                default_template(obj, "/spec/jobTemplate/spec/template/spec");
            }
        }
        if self.0 == Job {
            add_job_selector(obj);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        use Workload::*;
        let mut errs = Vec::new();
        match self.0 {
            Deployment | ReplicaSet | StatefulSet | DaemonSet => {
                validate_selector(obj, &mut errs);
                validate_replicas(obj, &mut errs);
                let template = match self.0 {
                    StatefulSet => statefulset_template_with_claims(obj),
                    _ => obj.pointer("/spec/template").cloned(),
                };
                errs.extend(validate_pod_template(template.as_ref(), "spec.template"));
                validate_one_of(
                    obj,
                    "/spec/template/spec/restartPolicy",
                    "spec.template.spec.restartPolicy",
                    &["Always"],
                    &mut errs,
                );
                if self.0 == StatefulSet {
                    let policies = ["OrderedReady", "Parallel"];
                    validate_one_of(obj, "/spec/podManagementPolicy", "spec.podManagementPolicy", &policies, &mut errs);
                    let types = ["OnDelete", "RollingUpdate"];
                    validate_one_of(obj, "/spec/updateStrategy/type", "spec.updateStrategy.type", &types, &mut errs);
                    let partition = obj.pointer("/spec/updateStrategy/rollingUpdate/partition").and_then(Value::as_i64);
                    if let Some(p) = partition.filter(|p| *p < 0) {
                        errs.push(FieldError::invalid(
                            "spec.updateStrategy.rollingUpdate.partition",
                            &json!(p),
                            "must be greater than or equal to 0",
                        ));
                    }
                }
                if self.0 == DaemonSet {
                    let types = ["OnDelete", "RollingUpdate"];
                    validate_one_of(obj, "/spec/updateStrategy/type", "spec.updateStrategy.type", &types, &mut errs);
                }
                if self.0 == Deployment {
                    if let Some(t) = str_at(obj, "/spec/strategy/type") {
                        if !["RollingUpdate", "Recreate"].contains(&t) {
                            errs.push(FieldError::not_supported(
                                "spec.strategy.type",
                                &json!(t),
                                &["Recreate", "RollingUpdate"],
                            ));
                        }
                        if t == "Recreate" && obj.pointer("/spec/strategy/rollingUpdate").is_some() {
                            errs.push(FieldError::forbidden(
                                "spec.strategy.rollingUpdate",
                                "may not be specified when strategy `type` is 'Recreate'",
                            ));
                        }
                    }
                }
            }
            ReplicationController => {
                validate_replicas(obj, &mut errs);
                let sel = obj.pointer("/spec/selector").and_then(Value::as_object);
                if sel.is_none_or(|s| s.is_empty()) {
                    errs.push(FieldError::required("spec.selector", ""));
                } else if let Some(sel) = sel {
                    let labels = labels_of(
                        &json!({"metadata": {"labels": obj.pointer("/spec/template/metadata/labels").cloned().unwrap_or(json!({}))}}),
                    );
                    if sel.iter().any(|(k, v)| labels.get(k).map(String::as_str) != v.as_str()) {
                        errs.push(FieldError::invalid(
                            "spec.template.metadata.labels",
                            &json!(labels),
                            "`selector` does not match template `labels`",
                        ));
                    }
                }
                errs.extend(validate_pod_template(obj.pointer("/spec/template"), "spec.template"));
            }
            Job => errs.extend(validate_job_spec(obj.get("spec"), "spec", true)),
            CronJob => {
                match str_at(obj, "/spec/schedule") {
                    None | Some("") => errs.push(FieldError::required("spec.schedule", "")),
                    Some(s) => {
                        if let Some(m) = cron_schedule_errors(s) {
                            errs.push(FieldError::invalid("spec.schedule", &json!(s), &m));
                        }
                    }
                }
                if let Some(p) = str_at(obj, "/spec/concurrencyPolicy") {
                    if !["Allow", "Forbid", "Replace"].contains(&p) {
                        errs.push(FieldError::not_supported(
                            "spec.concurrencyPolicy",
                            &json!(p),
                            &["Allow", "Forbid", "Replace"],
                        ));
                    }
                }
                let name = str_at(obj, "/metadata/name").unwrap_or_default();
                if name.len() > 52 {
                    errs.push(FieldError::invalid("metadata.name", &json!(name), "must be no more than 52 characters"));
                }
                errs.extend(validate_job_spec(obj.pointer("/spec/jobTemplate/spec"), "spec.jobTemplate.spec", false));
            }
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        let immutable: &[(&str, &str)] = match self.0 {
            Workload::Deployment | Workload::ReplicaSet | Workload::DaemonSet => &[("/spec/selector", "spec.selector")],
            Workload::StatefulSet => &[("/spec/selector", "spec.selector")],
            Workload::Job => &[("/spec/selector", "spec.selector"), ("/spec/completions", "spec.completions")],
            _ => &[],
        };
        for (p, f) in immutable {
            if new.pointer(p) != old.pointer(p) {
                errs.push(FieldError::invalid(*f, new.pointer(p).unwrap_or(&Value::Null), "field is immutable"));
            }
        }
        if self.0 == Workload::Job {
            // The pod template of a Job is immutable (Kubernetes allows a few scheduling
            // directives on suspended jobs; not yet here).
            if new.pointer("/spec/template") != old.pointer("/spec/template") {
                errs.push(FieldError::invalid(
                    "spec.template",
                    new.pointer("/spec/template").unwrap_or(&Value::Null),
                    "field is immutable",
                ));
            }
        }
        if self.0 == Workload::StatefulSet {
            // Only replicas, ordinals, template, updateStrategy, persistentVolumeClaimRetentionPolicy,
            // minReadySeconds may change.
            let mask = |v: &Value| {
                let mut s = v.get("spec").cloned().unwrap_or(Value::Null);
                if let Some(m) = s.as_object_mut() {
                    for k in [
                        "replicas",
                        "ordinals",
                        "template",
                        "updateStrategy",
                        "persistentVolumeClaimRetentionPolicy",
                        "minReadySeconds",
                        "revisionHistoryLimit",
                    ] {
                        m.remove(k);
                    }
                }
                s
            };
            if mask(new) != mask(old) {
                errs.push(FieldError::forbidden("spec", "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"));
            }
        }
        errs
    }

    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        match (self.0, field) {
            (Workload::ReplicaSet | Workload::ReplicationController, "status.replicas") => {
                Some(obj.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0).to_string())
            }
            (Workload::Job, "status.successful") => {
                Some(obj.pointer("/status/succeeded").and_then(Value::as_i64).unwrap_or(0).to_string())
            }
            _ => common_field_value(obj, field),
        }
    }

    fn scale_info(&self, obj: &Value) -> Option<super::ScaleInfo> {
        match self.0 {
            Workload::ReplicationController => {
                let selector = obj
                    .pointer("/spec/selector")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default();
                Some(super::ScaleInfo {
                    spec_replicas: obj.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1),
                    status_replicas: obj.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
                    selector,
                })
            }
            Workload::Deployment | Workload::ReplicaSet | Workload::StatefulSet => {
                let selector = obj
                    .pointer("/spec/selector")
                    .and_then(|s| LabelSelector::from_label_selector_json(s).ok())
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                Some(super::ScaleInfo {
                    spec_replicas: obj.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1),
                    status_replicas: obj.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
                    selector,
                })
            }
            _ => None,
        }
    }
}

fn default_job_spec(obj: &mut Value, spec: &str) {
    let completions_set = obj.pointer(&format!("{spec}/completions")).is_some_and(|v| !v.is_null());
    let parallelism_set = obj.pointer(&format!("{spec}/parallelism")).is_some_and(|v| !v.is_null());
    if !completions_set && !parallelism_set {
        default_at(obj, &format!("{spec}/completions"), json!(1));
    }
    default_at(obj, &format!("{spec}/parallelism"), json!(1));
    default_at(obj, &format!("{spec}/backoffLimit"), json!(6));
    default_at(obj, &format!("{spec}/completionMode"), json!("NonIndexed"));
    default_at(obj, &format!("{spec}/suspend"), json!(false));
    default_at(obj, &format!("{spec}/podReplacementPolicy"), json!("TerminatingOrFailed"));
    default_template(obj, &format!("{spec}/template/spec"));
}

/// Kubernetes generates a Job's selector from its uid unless `manualSelector` is true.
fn add_job_selector(obj: &mut Value) {
    if obj.pointer("/spec/manualSelector").and_then(Value::as_bool) == Some(true) {
        return;
    }
    let uid = str_at(obj, "/metadata/uid").unwrap_or_default().to_string();
    let name = str_at(obj, "/metadata/name").unwrap_or_default().to_string();
    super::set_at(obj, "/spec/selector", json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}));
    for (k, v) in [
        ("batch.kubernetes.io/controller-uid", &uid),
        ("batch.kubernetes.io/job-name", &name),
        ("controller-uid", &uid),
        ("job-name", &name),
    ] {
        super::set_at(obj, &format!("/spec/template/metadata/labels/{}", k.replace('/', "~1")), json!(v));
    }
}

fn validate_job_spec(spec: Option<&Value>, path: &str, needs_selector: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(spec) = spec else {
        errs.push(FieldError::required(path, ""));
        return errs;
    };
    for f in ["parallelism", "completions", "backoffLimit", "activeDeadlineSeconds"] {
        if let Some(n) = spec.get(f).and_then(Value::as_i64) {
            if n < 0 || (f == "activeDeadlineSeconds" && n == 0) {
                errs.push(FieldError::invalid(format!("{path}.{f}"), &json!(n), "must be greater than or equal to 0"));
            }
        }
    }
    if needs_selector && spec.get("selector").is_none() {
        errs.push(FieldError::required(format!("{path}.selector"), ""));
    }
    errs.extend(validate_pod_template(spec.get("template"), &format!("{path}.template")));
    match spec.pointer("/template/spec/restartPolicy").and_then(Value::as_str) {
        Some("OnFailure") | Some("Never") => {}
        other => errs.push(FieldError::not_supported(
            format!("{path}.template.spec.restartPolicy"),
            &json!(other.unwrap_or("Always")),
            &["OnFailure", "Never"],
        )),
    }
    errs
}

/// A StatefulSet's pod template as its pods will have it: each `volumeClaimTemplates` entry
/// is a volume of that name (the controller adds it as a `persistentVolumeClaim`), so a
/// mount may name one (upstream leaves the template's pod spec unvalidated for this reason;
/// we validate the union its TODO asks for). A template volume of the same name wins, as in
/// the controller.
fn statefulset_template_with_claims(obj: &Value) -> Option<Value> {
    let mut t = obj.pointer("/spec/template").cloned()?;
    let claims: Vec<String> = obj
        .pointer("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| str_at(c, "/metadata/name").map(str::to_string))
        .filter(|n| !n.is_empty())
        .collect();
    if claims.is_empty() {
        return Some(t);
    }
    let Some(spec) = t.get_mut("spec").and_then(Value::as_object_mut) else { return Some(t) };
    let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
    if let Some(list) = volumes.as_array_mut() {
        for name in claims {
            if !list.iter().any(|v| str_at(v, "/name") == Some(name.as_str())) {
                list.push(json!({"name": name, "persistentVolumeClaim": {"claimName": name}}));
            }
        }
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment() -> Value {
        json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
    }

    #[test]
    fn deployment_defaults_and_validation() {
        let mut d = deployment();
        let s = WorkloadStrategy(Workload::Deployment);
        s.prepare_for_create(&mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
        assert!(s.validate(&d).is_empty(), "{:?}", s.validate(&d));
        let mut bad = d.clone();
        bad["spec"]["template"]["metadata"]["labels"]["app"] = json!("other");
        assert_eq!(s.validate(&bad)[0].field, "spec.template.metadata.labels");
        let mut changed = d.clone();
        changed["spec"]["selector"]["matchLabels"]["x"] = json!("y");
        changed["spec"]["template"]["metadata"]["labels"]["x"] = json!("y");
        assert!(s.validate_update(&changed, &d).iter().any(|e| e.message.contains("immutable")));
    }

    #[test]
    fn statefulset_and_daemonset_enums() {
        let s = WorkloadStrategy(Workload::StatefulSet);
        let mut set = deployment();
        s.prepare_for_create(&mut set);
        assert_eq!(set["spec"]["podManagementPolicy"], "OrderedReady");
        assert!(s.validate(&set).is_empty(), "{:?}", s.validate(&set));
        set["spec"]["podManagementPolicy"] = json!("Sometimes");
        set["spec"]["updateStrategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"partition": -1}});
        let fields: Vec<String> = s.validate(&set).into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["spec.podManagementPolicy", "spec.updateStrategy.rollingUpdate.partition"]);
        // A mount may name a claim template; one naming neither a volume nor a template is refused.
        let mut set = deployment();
        s.prepare_for_create(&mut set);
        set["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "data", "mountPath": "/data"}]);
        assert_eq!(s.validate(&set)[0].field, "spec.template.spec.containers[0].volumeMounts[0].name");
        set["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "data"}, "spec": {}}]);
        assert!(s.validate(&set).is_empty(), "{:?}", s.validate(&set));
        assert!(set["spec"]["template"]["spec"].get("volumes").is_none(), "the stored template is unchanged");
        let d = WorkloadStrategy(Workload::DaemonSet);
        let mut ds = deployment();
        ds["spec"]["updateStrategy"] = json!({"type": "Recreate"});
        assert_eq!(d.validate(&ds)[0].field, "spec.updateStrategy.type");
    }

    #[test]
    fn job_selector_generated() {
        let mut j = json!({"metadata": {"name": "sum", "uid": "u1"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}});
        let s = WorkloadStrategy(Workload::Job);
        s.prepare_for_create(&mut j);
        assert_eq!(j["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"], "u1");
        assert_eq!(j["spec"]["template"]["metadata"]["labels"]["job-name"], "sum");
        assert_eq!(j["spec"]["completions"], 1);
        assert!(s.validate(&j).is_empty(), "{:?}", s.validate(&j));
        j["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
        assert_eq!(s.validate(&j)[0].field, "spec.template.spec.restartPolicy");
    }

    #[test]
    fn cron() {
        assert!(cron_schedule_errors("*/5 * * * *").is_none());
        assert!(cron_schedule_errors("@hourly").is_none());
        assert!(cron_schedule_errors("* * *").is_some());
        assert!(cron_schedule_errors("@bogus").is_some());
    }
}
