//! Registry: one generic store for every kind ([`generic`]) plus one small strategy per kind
//! ([`kinds`]) saying only what is special about it — Kubernetes' registry/strategy idea.

use serde_json::{Map, Value};
use storage::{KeyValue, Op};

use crate::error::{ApiError, ApiResult, FieldError};
use crate::ipalloc::{IpRange, PortRange};
use crate::validation::NameRule;

pub mod apply;
pub mod crd;
pub mod crd_schema;
pub mod csr;
pub mod generic;
pub mod kinds;
pub mod pod;
pub mod scale;
pub mod service;
pub mod webhookconfig;
pub mod workloads;

// ------------------------------------------------------------------ resource definitions

/// Decode into the k8s-openapi type and re-encode: rejects wrong shapes (with a field
/// path) and drops unknown fields, as Kubernetes' typed decoding does.
pub type NormalizeFn = fn(&ResourceDef, &Value) -> Result<Value, String>;

/// The OpenAPI schema of the kind: a `$ref` into the generator's definitions (only the
/// generator of the committed OpenAPI documents, a test, calls it).
#[cfg(test)]
pub type SchemaFn = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

pub fn normalize_as<T>(_res: &ResourceDef, v: &Value) -> Result<Value, String>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    // Fast path without path tracking; only a failure is decoded again for its path.
    let typed: T = match T::deserialize(v) {
        Ok(t) => t,
        Err(_) => serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path.is_empty() || path == "." {
                inner.to_string()
            } else {
                format!("{path}: {inner}")
            }
        })?,
    };
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// What a CustomResourceDefinition adds to a served resource.
#[derive(Debug)]
pub struct CustomInfo {
    /// additionalPrinterColumns: (name, type, jsonPath, priority).
    pub printer_columns: Vec<(String, String, String, i64)>,
    /// The version's openAPIV3Schema.
    pub schema: Value,
    /// The CRD is being deleted: its objects are served for reads, updates and deletes
    /// while they are removed, but no new ones are created.
    pub terminating: bool,
    /// The CRD's storage version when it is served and is not this one: this version is
    /// then served as a view of it (`views.rs`).
    pub storage_version: Option<&'static str>,
}

/// A subresource of a resource, e.g. `pods/status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sub {
    Status,
    Scale,
    Binding,
    Eviction,
    Finalize,
    /// `pods/ephemeralcontainers`: only `spec.ephemeralContainers` changes (`kubectl debug`).
    EphemeralContainers,
    /// `serviceaccounts/token`: the TokenRequest API (create only; nothing is stored).
    Token,
    /// `certificatesigningrequests/approval`: only the Approved/Denied conditions change.
    Approval,
    /// Listed in discovery, served by a later part of the system (log, exec, proxy …).
    NotYetServed(&'static str, &'static str),
}

impl Sub {
    pub fn name(&self) -> &'static str {
        match self {
            Sub::Status => "status",
            Sub::Scale => "scale",
            Sub::Binding => "binding",
            Sub::Eviction => "eviction",
            Sub::Finalize => "finalize",
            Sub::EphemeralContainers => "ephemeralcontainers",
            Sub::Token => "token",
            Sub::Approval => "approval",
            Sub::NotYetServed(n, _) => n,
        }
    }
}

pub const VERBS_ALL: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/// One served resource at one group/version.
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub namespaced: bool,
    pub subresources: &'static [Sub],
    /// The storage prefix segment (`/registry/<storage>/...`). Two versions of one
    /// resource share it.
    pub storage: &'static str,
    pub strategy: &'static dyn Strategy,
    pub normalize: NormalizeFn,
    #[cfg(test)]
    pub schema: SchemaFn,
    /// Set for resources served from a CustomResourceDefinition.
    pub custom: Option<&'static CustomInfo>,
}

impl std::fmt::Debug for ResourceDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} {}", self.group, self.version, self.plural)
    }
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    pub fn has_sub(&self, s: &str) -> Option<Sub> {
        self.subresources.iter().copied().find(|x| x.name() == s)
    }
    pub fn has_status(&self) -> bool {
        self.subresources.contains(&Sub::Status)
    }
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

// ------------------------------------------------------------------ strategies

/// What is special about one kind. Every method is pure; the generic store does the I/O.
pub trait Strategy: Send + Sync + 'static {
    /// How `metadata.name` is validated.
    fn name_rule(&self) -> NameRule {
        NameRule::Dns1123Subdomain
    }
    /// Defaults and server-set fields on create (after uid/timestamps are set). Status is
    /// already cleared for kinds with a status subresource unless `keep_status_on_create`.
    fn prepare_for_create(&self, _obj: &mut Value) {}
    /// Called on a main-resource update. `new.status` has already been reset to the old one
    /// for kinds with a status subresource.
    fn prepare_for_update(&self, _new: &mut Value, _old: &Value) {}
    /// Kind-specific validation of a whole object (metadata is validated generically).
    fn validate(&self, _obj: &Value) -> Vec<FieldError> {
        vec![]
    }
    /// Kind-specific validation of a create: by default `validate(obj)`.
    fn validate_create(&self, obj: &Value) -> Vec<FieldError> {
        self.validate(obj)
    }
    /// Kind-specific validation of an update: by default `validate(new)`.
    fn validate_update(&self, new: &Value, _old: &Value) -> Vec<FieldError> {
        self.validate(new)
    }
    /// Field-selector value of a kind-specific field; None = not supported.
    fn field_value(&self, _obj: &Value, _field: &str) -> Option<String> {
        None
    }
    /// Keep a client-provided status on create (Nodes, Events …).
    fn keep_status_on_create(&self) -> bool {
        false
    }
    /// Whether `metadata.generation` is maintained (bumped on spec changes).
    fn tracks_generation(&self) -> bool {
        true
    }
    /// PUT of a missing object creates it.
    fn allow_create_on_update(&self) -> bool {
        false
    }
    /// Graceful deletion: Some(seconds > 0) to mark the object and let its owner (the
    /// kubelet) finish the delete; None or Some(0) deletes at once.
    fn graceful_delete_seconds(&self, _obj: &Value, _requested: Option<i64>) -> Option<i64> {
        None
    }
    /// Delete answers the deleted object instead of a Status.
    fn return_deleted_object(&self) -> bool {
        false
    }
    /// Something besides `metadata.finalizers` keeps the object from going away at once
    /// (Namespace: `spec.finalizers`).
    fn deletion_blocked(&self, _obj: &Value) -> bool {
        false
    }
    /// Finalizers the kind itself adds when an object's deletion begins, so that its
    /// clean-up runs before the object goes (CustomResourceDefinition:
    /// `customresourcecleanup.apiextensions.k8s.io`, its custom resources deleted first).
    fn deletion_finalizers(&self) -> &'static [&'static str] {
        &[]
    }
    /// Called when the object is marked for deletion (deletionTimestamp set).
    fn on_deletion_marked(&self, _obj: &mut Value) {}
    /// A write to one of the kind's own subresources other than `status` and `scale` (which
    /// the store handles alike for every kind): the stored object `old` with what `new` may
    /// change through `sub` (Namespace `finalize`: `spec.finalizers`; Pod
    /// `ephemeralcontainers`). None: the kind has no such subresource.
    fn prepare_subresource_update(&self, _sub: Sub, _new: &Value, _old: &Value) -> Option<Value> {
        None
    }
    /// Called on a `status` write after the stored object took the new status (the kind
    /// may keep parts of the stored status: CertificateSigningRequest's decisions).
    fn prepare_status_update(&self, _new: &mut Value, _old: &Value) {}
    /// Validation of a `status` write.
    fn validate_status_update(&self, _new: &Value, _old: &Value) -> Vec<FieldError> {
        vec![]
    }
    /// Validation of a subresource write prepared by `prepare_subresource_update`.
    fn validate_subresource_update(&self, _sub: Sub, _new: &Value, _old: &Value) -> Vec<FieldError> {
        vec![]
    }
    /// Storage keys the kind's writes change in the same transaction as the object itself
    /// (Service: the cluster-IP and node-port allocation bitmaps).
    fn transaction_keys(&self) -> &'static [&'static str] {
        &[]
    }
    /// The writes of those keys for a create (`old` None), an update, or a delete (`new`
    /// None), given their current values (`reads[i]` is `transaction_keys()[i]`); may fill
    /// what it allocated into `new`. The store compares every written key against the value
    /// read, so a concurrent change makes the whole write retry.
    fn transaction_writes(
        &self,
        _cfg: &ClusterConfig,
        _reads: &[Option<KeyValue>],
        _old: Option<&Value>,
        _new: Option<&mut Value>,
    ) -> ApiResult<Vec<Op>> {
        Ok(vec![])
    }
    /// The scale subresource: (spec.replicas, status.replicas, label selector string).
    fn scale_info(&self, _obj: &Value) -> Option<ScaleInfo> {
        None
    }
}

/// The cluster-wide settings strategies may need (kube-apiserver's flags of the same names).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub service_cluster_ip_range: IpRange,
    pub service_node_port_range: PortRange,
}

#[derive(Clone, Debug)]
pub struct ScaleInfo {
    pub spec_replicas: i64,
    pub status_replicas: i64,
    pub selector: String,
}

// ----------------------------------------------------------------- small JSON helpers

/// The one check of an object's name in a body against the name in the URL (update,
/// patch, apply, scale): Kubernetes answers 400 with this message.
pub fn name_matches_url(body_name: &str, url_name: &str) -> ApiResult<()> {
    if body_name == url_name {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "the name of the object ({body_name}) does not match the name on the URL ({url_name})"
    )))
}

/// The one check of an object's namespace in a body against the namespace in the URL; an
/// object without one takes the URL's.
pub fn namespace_matches_url(body_ns: &str, url_ns: &str) -> ApiResult<()> {
    if body_ns.is_empty() || body_ns == url_ns {
        return Ok(());
    }
    Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"))
}

pub fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    at(obj, pointer).and_then(Value::as_str)
}

/// `Value::pointer` without its two allocations per token (it unescapes every token with
/// `str::replace`); tokens are unescaped only when they contain `~`. Same semantics.
pub fn at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a Value> {
    if pointer.is_empty() {
        return Some(obj);
    }
    let mut cur = obj;
    for token in pointer.strip_prefix('/')?.split('/') {
        cur = match cur {
            Value::Object(m) => m.get(unescape_token(token).as_ref())?,
            Value::Array(a) => a.get(array_index(token)?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// The mutable form of [`at`] (`Value::pointer_mut`).
pub fn at_mut<'a>(obj: &'a mut Value, pointer: &str) -> Option<&'a mut Value> {
    if pointer.is_empty() {
        return Some(obj);
    }
    let mut cur = obj;
    for token in pointer.strip_prefix('/')?.split('/') {
        cur = match cur {
            Value::Object(m) => m.get_mut(unescape_token(token).as_ref())?,
            Value::Array(a) => a.get_mut(array_index(token)?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// An array index token as `Value::pointer` reads it (no sign, no leading zeros).
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

/// Set `pointer` to `value` if absent or null, creating intermediate objects.
pub fn default_at(obj: &mut Value, pointer: &str, value: Value) {
    if at(obj, pointer).is_some_and(|v| !v.is_null()) {
        return;
    }
    set_at(obj, pointer, value);
}

/// Set `pointer` to `value`, creating intermediate objects (replacing scalars). Numeric
/// tokens index into existing arrays.
pub fn set_at(obj: &mut Value, pointer: &str, value: Value) {
    let mut parts = pointer.trim_start_matches('/').split('/').peekable();
    let mut cur = obj;
    while let Some(p) = parts.next() {
        let last = parts.peek().is_none();
        if let Value::Array(arr) = cur {
            let Some(slot) = p.parse::<usize>().ok().and_then(|idx| arr.get_mut(idx)) else { return };
            if last {
                *slot = value;
                return;
            }
            cur = slot;
            continue;
        }
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Some(map) = cur.as_object_mut() else { return };
        let p = unescape_token(p);
        if last {
            map.insert(p.into_owned(), value);
            return;
        }
        if !map.contains_key(p.as_ref()) {
            map.insert(p.to_string(), Value::Object(Map::new()));
        }
        let Some(next) = map.get_mut(p.as_ref()) else { return };
        cur = next;
    }
}

pub fn remove_at(obj: &mut Value, pointer: &str) -> Option<Value> {
    let (parent, last) = pointer.rsplit_once('/')?;
    let parent = if parent.is_empty() { Some(obj) } else { at_mut(obj, parent) };
    parent.and_then(Value::as_object_mut).and_then(|m| m.remove(unescape_token(last).as_ref()))
}

/// JSON-pointer token unescaping (`~1` is `/`, `~0` is `~`); borrows when there is none.
fn unescape_token(t: &str) -> std::borrow::Cow<'_, str> {
    if t.contains('~') {
        std::borrow::Cow::Owned(t.replace("~1", "/").replace("~0", "~"))
    } else {
        std::borrow::Cow::Borrowed(t)
    }
}

/// JSON-pointer token escaping.
pub fn escape_token(t: &str) -> String {
    t.replace('~', "~0").replace('/', "~1")
}

/// The object without metadata, status, apiVersion and kind: what a generation tracks.
pub fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        for k in ["metadata", "status", "apiVersion", "kind"] {
            m.remove(k);
        }
    }
    v
}

/// The common field-selector fields.
pub fn common_field_value(obj: &Value, field: &str) -> Option<String> {
    match field {
        "metadata.name" => Some(str_at(obj, "/metadata/name").unwrap_or_default().to_string()),
        "metadata.namespace" => Some(str_at(obj, "/metadata/namespace").unwrap_or_default().to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointers() {
        let mut v = json!({});
        default_at(&mut v, "/spec/replicas", json!(1));
        assert_eq!(v, json!({"spec": {"replicas": 1}}));
        default_at(&mut v, "/spec/replicas", json!(3));
        assert_eq!(v["spec"]["replicas"], 1);
        set_at(&mut v, "/spec/replicas", json!(3));
        assert_eq!(v["spec"]["replicas"], 3);
        assert_eq!(remove_at(&mut v, "/spec/replicas"), Some(json!(3)));
        let mut p = json!({"spec": {"ports": [{"port": 80}]}});
        set_at(&mut p, "/spec/ports/0/nodePort", json!(30001));
        assert_eq!(p, json!({"spec": {"ports": [{"port": 80, "nodePort": 30001}]}}));
        set_at(&mut p, "/metadata/labels/a~1b", json!("x"));
        assert_eq!(p["metadata"]["labels"]["a/b"], "x");
        // `at` reads as `Value::pointer` does.
        let doc = json!({"a/b": {"c~d": [1, {"e": 2}]}, "": 3});
        for ptr in [
            "",
            "/",
            "/a~1b",
            "/a~1b/c~0d",
            "/a~1b/c~0d/1/e",
            "/a~1b/c~0d/01",
            "/a~1b/c~0d/+1",
            "/x",
            "x",
            "/a~1b/c~0d/9",
        ] {
            assert_eq!(at(&doc, ptr), doc.pointer(ptr), "{ptr}");
        }
        let mut m = doc.clone();
        *at_mut(&mut m, "/a~1b/c~0d/0").unwrap() = json!(5);
        assert_eq!(m["a/b"]["c~d"][0], 5);
        assert_eq!(
            spec_part(&json!({"kind": "X", "metadata": {}, "spec": {"a": 1}, "status": {}})),
            json!({"spec": {"a": 1}})
        );
    }
}
