//! The generic store: create/get/list/update/patch/delete/deletecollection for every kind,
//! over JSON objects stored at `/registry/<resource>/[<namespace>/]<name>`.
//!
//! `metadata.resourceVersion` is never stored: it is set on the way out from the key's
//! mod revision. Every write is a guarded transaction (compare on mod revision), so a stale
//! write is a 409 and nothing is half stored.

use std::sync::Arc;

use apimachinery::fieldmanager;
use apimachinery::names::random_suffix;
use apimachinery::strategicpatch::Schema;
use bytes::Bytes;
use serde_json::{json, Value};
use storage::{KeyValue, Op, Range, Revision, Store, Txn, TxnOutcome};

use super::{set_at, spec_part, ClusterConfig};
use crate::continuetoken::ContinueToken;
use crate::error::{ApiError, ApiResult, FieldError};
use crate::registry::{ResourceDef, Sub};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::validation::validate_object_meta;
use crate::webhook::rules::Operation;

/// How unknown fields in a body are treated (`fieldValidation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// managedFields a create starts with (server-side apply); client-sent ones are dropped.
    pub managed_fields: Option<Value>,
    /// Who writes, for the `Update` entry of managedFields that a create, update or patch
    /// gets (the request's fieldManager, else its User-Agent's first part). None: not
    /// recorded (server-side apply records its own; the apiserver's own writes).
    pub manager: Option<String>,
    /// Validating admission that depends on who asks (the request path builds it): sees
    /// the object about to be stored, valid, and the stored one on an update.
    pub admit: Option<Admit>,
    /// Admission webhooks (the request path sets it for client requests; writes the
    /// apiserver makes itself meet none).
    pub webhooks: Option<Arc<dyn AdmissionWebhooks>>,
}

/// Admission webhooks as the store calls them during a write (`crate::webhook` implements
/// them): mutating ones before the strategy's defaults and validation, validating ones
/// right before the transaction.
#[async_trait::async_trait]
pub trait AdmissionWebhooks: Send + Sync + std::fmt::Debug {
    /// Run the mutating webhooks `obj` meets; whether it changed, and their warnings.
    async fn mutate(
        &self,
        w: &WebhookWrite<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> ApiResult<(bool, Vec<String>)>;
    /// Run the validating webhooks the write meets; their warnings, or the refusal.
    async fn validate(&self, w: &WebhookWrite<'_>, obj: Option<&Value>, old: Option<&Value>) -> ApiResult<Vec<String>>;
}

/// What the store says about a write to the admission webhooks.
pub struct WebhookWrite<'a> {
    pub res: &'a ResourceDef,
    pub operation: Operation,
    /// Empty for the main resource.
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub dry_run: bool,
}

/// A request's validating admission check (see [`WriteOptions::admit`]).
#[derive(Clone)]
pub struct Admit(pub Arc<AdmitFn>);

/// (object to store, stored object on an update) → admitted or refused.
pub type AdmitFn = dyn Fn(&Value, Option<&Value>) -> ApiResult<()> + Send + Sync;

impl std::fmt::Debug for Admit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Admit")
    }
}

impl WriteOptions {
    fn admit(&self, new: &Value, old: Option<&Value>) -> ApiResult<()> {
        match &self.admit {
            Some(Admit(check)) => check(new, old),
            None => Ok(()),
        }
    }

    /// The webhook context of a write of `res`.
    fn webhook_write<'a>(
        &self,
        res: &'a ResourceDef,
        operation: crate::webhook::rules::Operation,
        subresource: &'a str,
        namespace: &'a str,
        name: &'a str,
    ) -> WebhookWrite<'a> {
        WebhookWrite { res, operation, subresource, namespace, name, dry_run: self.dry_run }
    }
}

/// A write's result.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub object: Value,
    pub warnings: Vec<String>,
    /// `object` already serialized, when the write had it at hand (create).
    pub json: Option<Vec<u8>>,
}

#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    pub label_selector: LabelSelector,
    pub field_selector: FieldSelector,
    pub limit: usize,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    /// MiniK8s' `tenantPrefix` extension (what `tenant-proxy` sends): a list or watch across
    /// all namespaces keeps to the namespaces whose names start with it, one of cluster-scoped
    /// objects to the names that do. A key range, so it costs what the matching objects cost.
    pub tenant_prefix: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub dry_run: bool,
    pub grace_period_seconds: Option<i64>,
    pub propagation_policy: Option<String>,
    pub orphan_dependents: Option<bool>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    /// Admission webhooks (DELETE), as [`WriteOptions::webhooks`].
    pub webhooks: Option<Arc<dyn AdmissionWebhooks>>,
}

/// What a guarded update does to the main object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateKind {
    /// PUT/PATCH of the resource: status is kept from the stored object.
    Main,
    /// PUT/PATCH of `/status`: only status changes.
    Status,
    /// PUT/PATCH of a kind's own subresource (`namespaces/<n>/finalize`,
    /// `pods/<n>/ephemeralcontainers`): what the strategy's `prepare_subresource_update`
    /// lets it change.
    Subresource(Sub),
    /// A server-side change built from the stored object (binding, scale).
    Internal,
}

/// What a PATCH addresses: the served resource, and the view it is served through when it
/// is not stored as itself.
#[derive(Clone, Copy)]
pub struct PatchTarget<'a> {
    pub served: &'a ResourceDef,
    pub view: Option<&'static crate::views::View>,
}

/// What `try_update` decided.
pub struct Intent {
    pub object: Value,
    /// The client's resourceVersion precondition, if any.
    pub precondition: Option<Revision>,
}

/// Why a delete returned what it did.
pub enum Deleted {
    /// Gone now; the last state.
    Now(Value),
    /// Marked (finalizers or graceful deletion pending); the updated object.
    Marked(Value),
}

pub const MAX_RETRIES: usize = 200;

pub struct Registry {
    pub store: Arc<dyn Store>,
    /// Cluster-wide settings the strategies' hooks get.
    pub config: ClusterConfig,
    /// Which namespaces exist: the create path's namespace check without a storage read.
    pub namespaces: Arc<crate::nscache::NamespaceCache>,
}

pub fn key_of(res: &ResourceDef, ns: &str, name: &str) -> String {
    if res.namespaced {
        format!("/registry/{}/{ns}/{name}", res.storage)
    } else {
        format!("/registry/{}/{name}", res.storage)
    }
}

/// The key prefix of a list: all namespaces when `ns` is None.
pub fn prefix_of(res: &ResourceDef, ns: Option<&str>) -> String {
    match ns {
        Some(ns) if res.namespaced => format!("/registry/{}/{ns}/", res.storage),
        _ => format!("/registry/{}/", res.storage),
    }
}

/// The key prefix of a list or watch with its options: [`prefix_of`], narrowed by
/// [`ListOptions::tenant_prefix`] when it spans namespaces or names.
pub fn list_prefix(res: &ResourceDef, ns: Option<&str>, opts: &ListOptions) -> String {
    let base = prefix_of(res, ns);
    match &opts.tenant_prefix {
        Some(p) if !(res.namespaced && ns.is_some()) => format!("{base}{p}"),
        _ => base,
    }
}

/// A stored object's JSON with `metadata.resourceVersion` set to `rv`, without decoding it:
/// the field is spliced in as the first member of the top-level `metadata` object. None if
/// there is no such object or the bytes mention `"resourceVersion"` anywhere ([`encode`]
/// drops it; anything else is left to the decoding path, so no key is ever duplicated).
pub fn with_resource_version(stored: &[u8], rv: Revision) -> Option<Vec<u8>> {
    let (at, mentions_rv) = metadata_body_offset(stored);
    Some(splice_resource_version(stored, at.filter(|_| !mentions_rv)?, rv))
}

/// `stored` (from [`encode_at`]) with `"resourceVersion":"<rv>"` inserted at `at`, the
/// start of its metadata members.
pub fn splice_resource_version(stored: &[u8], at: usize, rv: Revision) -> Vec<u8> {
    let field = format!("\"resourceVersion\":\"{rv}\"");
    let empty = stored[at..].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let mut out = Vec::with_capacity(stored.len() + field.len() + 1);
    out.extend_from_slice(&stored[..at]);
    out.extend_from_slice(field.as_bytes());
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(&stored[at..]);
    out
}

/// The offset just after the `{` of the top-level `"metadata"` member's object value, and
/// whether any string in the document is `resourceVersion`.
fn metadata_body_offset(json: &[u8]) -> (Option<usize>, bool) {
    let mut found = None;
    let mut mentions_rv = false;
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut string_start = 0;
    // Depth-1 key just read, awaiting its value.
    let mut pending_metadata = false;
    let mut expect_key = false;
    for (i, &b) in json.iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                mentions_rv |= &json[string_start..i] == b"resourceVersion";
                if depth == 1 && expect_key {
                    pending_metadata = &json[string_start..i] == b"metadata";
                    expect_key = false;
                }
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                string_start = i + 1;
            }
            b'{' => {
                depth += 1;
                if depth == 2 && pending_metadata && found.is_none() {
                    found = Some(i + 1);
                }
                expect_key = depth == 1;
                pending_metadata = false;
            }
            b'[' => {
                depth += 1;
                pending_metadata = false;
            }
            b'}' | b']' => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return (None, mentions_rv),
            },
            b',' => {
                expect_key = depth == 1;
                pending_metadata = false;
            }
            b':' => {}
            b if b.is_ascii_whitespace() => {}
            _ => pending_metadata = false,
        }
    }
    (found, mentions_rv)
}

/// Decode a stored object and stamp its resourceVersion.
pub fn decode(kv: &KeyValue) -> ApiResult<Value> {
    let mut v: Value = serde_json::from_slice(&kv.value)
        .map_err(|e| ApiError::internal(format!("stored object {} is corrupt: {e}", kv.key)))?;
    set_at(&mut v, "/metadata/resourceVersion", Value::String(kv.mod_revision.to_string()));
    Ok(v)
}

/// Record a create (`old` is `{}`) or update by `manager` in `new`'s managedFields, which
/// hold the entries to start from (the stored ones, or what the client sent).
fn record_update(res: &ResourceDef, old: &Value, new: &mut Value, manager: &str, subresource: Option<&str>) {
    let defs = &*crate::openapi::DEFINITIONS;
    let schema = defs.schema_of(res.group, res.version, res.kind).map_or_else(Schema::none, |r| Schema::new(defs, r));
    // Taken out rather than copied: the field manager never tracks managedFields itself.
    let managed = match new.get_mut("metadata").and_then(Value::as_object_mut).and_then(|m| m.remove("managedFields")) {
        Some(Value::Array(entries)) => entries,
        _ => Vec::new(),
    };
    let api_version = res.api_version();
    let now = now_rfc3339();
    let req = fieldmanager::UpdateRequest { manager, api_version: &api_version, subresource, now: &now };
    let entries = fieldmanager::update(old, new, &managed, schema, &req);
    if !entries.is_empty() {
        set_at(new, "/metadata/managedFields", Value::Array(entries));
    }
}

/// Encode for storage: without resourceVersion and selfLink (managedFields are kept: they
/// are server-side apply's ownership records).
pub fn encode(obj: &Value) -> Bytes {
    encode_at(obj).0
}

/// [`encode`], and where the members of the top-level `metadata` object start in the
/// result (for [`splice_resource_version`]).
pub fn encode_at(obj: &Value) -> (Bytes, Option<usize>) {
    let mut out = Vec::with_capacity(1024);
    let Value::Object(map) = obj else {
        let _ = serde_json::to_writer(&mut out, obj);
        return (Bytes::from(out), None);
    };
    // Serializing Values and strings into a Vec cannot fail.
    let mut at = None;
    out.push(b'{');
    for (i, (k, v)) in map.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, k);
        out.push(b':');
        match v {
            Value::Object(meta) if k == "metadata" => {
                out.push(b'{');
                at = Some(out.len());
                let mut first = true;
                for (mk, mv) in meta {
                    if mk == "resourceVersion" || mk == "selfLink" {
                        continue;
                    }
                    if !first {
                        out.push(b',');
                    }
                    first = false;
                    let _ = serde_json::to_writer(&mut out, mk);
                    out.push(b':');
                    let _ = serde_json::to_writer(&mut out, mv);
                }
                out.push(b'}');
            }
            _ => {
                let _ = serde_json::to_writer(&mut out, v);
            }
        }
    }
    out.push(b'}');
    (Bytes::from(out), at)
}

pub fn now_rfc3339() -> String {
    rfc3339(jiff::Timestamp::now())
}

/// `2006-01-02T15:04:05Z` (seconds, UTC) — what strftime("%Y-%m-%dT%H:%M:%SZ") gives, for a
/// fraction of its cost (it showed up in the create path's profile).
fn rfc3339(ts: jiff::Timestamp) -> String {
    let t = jiff::tz::Offset::UTC.to_datetime(ts);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", t.year(), t.month(), t.day(), t.hour(), t.minute(), t.second())
}

fn rfc3339_after(secs: i64) -> String {
    let ts = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(secs))
        .unwrap_or_else(|_| jiff::Timestamp::now());
    rfc3339(ts)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str).unwrap_or_default()
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// A resourceVersion that must be there.
fn parse_rv(s: &str) -> ApiResult<Revision> {
    crate::resourceversion::parse(s)?.ok_or_else(|| ApiError::bad_request("invalid resource version: \"\""))
}

/// Fields of `input` that `normalized` lost (unknown to the typed schema), as paths.
pub fn unknown_fields(input: &Value, normalized: &Value, path: &str, out: &mut Vec<String>) {
    let mut buf = path.to_string();
    unknown_fields_at(input, normalized, &mut buf, out);
}

/// [`unknown_fields`] with the path in one buffer (extended and truncated as it goes), so
/// known fields cost no allocation.
fn unknown_fields_at(input: &Value, normalized: &Value, path: &mut String, out: &mut Vec<String>) {
    let len = path.len();
    match (input, normalized) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                match b.get(k) {
                    None if !v.is_null() => out.push(path.clone()),
                    Some(nv) => unknown_fields_at(v, nv, path, out),
                    None => {}
                }
                path.truncate(len);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                use std::fmt::Write;
                let _ = write!(path, "[{i}]");
                unknown_fields_at(x, y, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

impl Registry {
    pub fn new(store: Arc<dyn Store>, config: ClusterConfig) -> Self {
        let namespaces = Arc::new(crate::nscache::NamespaceCache::new(store.clone()));
        Registry { store, config, namespaces }
    }

    /// Every write goes through here: namespace writes are noted for the namespace cache.
    async fn txn(&self, txn: Txn) -> storage::Result<TxnOutcome> {
        let namespace_write = txn.ops.iter().any(|op| op.key().starts_with(crate::nscache::PREFIX));
        let out = self.store.txn(txn).await?;
        if let (true, TxnOutcome::Committed { revision, .. }) = (namespace_write, &out) {
            self.namespaces.wrote(*revision);
        }
        Ok(out)
    }

    // ------------------------------------------------------------------ decoding bodies

    /// Check a request body against the URL (kind, apiVersion, namespace) and decode it
    /// through the typed schema. Returns the normalized object and warnings.
    pub fn decode_body(
        &self,
        res: &ResourceDef,
        url_ns: Option<&str>,
        mut body: Value,
        fv: FieldValidation,
    ) -> ApiResult<(Value, Vec<String>)> {
        let Some(map) = body.as_object_mut() else {
            return Err(ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: the body must be a JSON object",
                res.kind, res.version, res.kind
            )));
        };
        fill_type_meta(map, res.kind, &res.api_version())?;
        if let Some(ns) = url_ns.filter(|_| res.namespaced) {
            super::namespace_matches_url(
                super::at(&body, "/metadata/namespace").and_then(Value::as_str).unwrap_or_default(),
                ns,
            )?;
        }
        let normalized = (res.normalize)(res, &body).map_err(|e| {
            ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: {e}",
                res.kind, res.version, res.kind
            ))
        })?;
        let mut unknown = Vec::new();
        unknown_fields(&body, &normalized, "", &mut unknown);
        let mut warnings = Vec::new();
        match fv {
            FieldValidation::Strict if !unknown.is_empty() => {
                let list: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
                return Err(ApiError::bad_request(format!(
                    "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                    res.kind,
                    res.version,
                    res.kind,
                    list.join(", ")
                )));
            }
            FieldValidation::Warn => warnings.extend(unknown.iter().map(|f| format!("unknown field \"{f}\""))),
            _ => {}
        }
        Ok((normalized, warnings))
    }

    // ------------------------------------------------------------------ reads

    pub async fn get(&self, res: &ResourceDef, ns: &str, name: &str) -> ApiResult<Value> {
        let key = key_of(res, ns, name);
        match self.store.get(&key).await?.1 {
            Some(kv) => decode(&kv),
            None => Err(ApiError::not_found(res.group, res.plural, name)),
        }
    }

    /// [`Registry::get`] as the JSON it answers with, without decoding the stored object.
    pub async fn get_json(&self, res: &ResourceDef, ns: &str, name: &str) -> ApiResult<Vec<u8>> {
        let key = key_of(res, ns, name);
        match self.store.get(&key).await?.1 {
            Some(kv) => match with_resource_version(&kv.value, kv.mod_revision) {
                Some(json) => Ok(json),
                None => Ok(serde_json::to_vec(&decode(&kv)?).unwrap_or_default()),
            },
            None => Err(ApiError::not_found(res.group, res.plural, name)),
        }
    }

    async fn get_kv(&self, res: &ResourceDef, ns: &str, name: &str) -> ApiResult<Option<KeyValue>> {
        Ok(self.store.get(&key_of(res, ns, name)).await?.1)
    }

    /// Does `obj` match the selectors? Unsupported fields are rejected earlier by
    /// [`Registry::check_field_selector`].
    pub fn matches(res: &ResourceDef, obj: &Value, label: &LabelSelector, field: &FieldSelector) -> bool {
        label.matches_object(obj)
            && (field.is_empty()
                || field.matches(|f| super::common_field_value(obj, f).or_else(|| res.strategy.field_value(obj, f))))
    }

    pub fn check_field_selector(res: &ResourceDef, field: &FieldSelector) -> ApiResult<()> {
        let probe = json!({"metadata": {}});
        for r in &field.requirements {
            if super::common_field_value(&probe, &r.field).is_none()
                && res.strategy.field_value(&probe, &r.field).is_none()
            {
                return Err(ApiError::bad_request(format!("field label not supported: {}", r.field)));
            }
        }
        Ok(())
    }

    pub async fn list(&self, res: &ResourceDef, ns: Option<&str>, opts: &ListOptions) -> ApiResult<Value> {
        let (items, metadata) = self
            .list_items(res, ns, opts, |kv| {
                let obj = decode(kv)?;
                Ok(Self::matches(res, &obj, &opts.label_selector, &opts.field_selector).then_some(obj))
            })
            .await?;
        Ok(json!({
            "kind": res.list_kind(),
            "apiVersion": res.api_version(),
            "metadata": metadata,
            "items": items,
        }))
    }

    /// [`Registry::list`] as the JSON it answers with: items are the stored JSON with their
    /// resourceVersion spliced in, decoded only when a selector has to look at them. Ten
    /// thousand pods are not turned into ten thousand Value trees and back.
    pub async fn list_json(&self, res: &ResourceDef, ns: Option<&str>, opts: &ListOptions) -> ApiResult<Vec<u8>> {
        let selects = !opts.label_selector.is_empty() || !opts.field_selector.is_empty();
        let mut size = 0;
        let (items, metadata) = self
            .list_items(res, ns, opts, |kv| {
                if selects && !Self::matches(res, &decode(kv)?, &opts.label_selector, &opts.field_selector) {
                    return Ok(None);
                }
                let json = match with_resource_version(&kv.value, kv.mod_revision) {
                    Some(json) => json,
                    None => serde_json::to_vec(&decode(kv)?).map_err(|e| ApiError::internal(e.to_string()))?,
                };
                size += json.len() + 1;
                Ok(Some(json))
            })
            .await?;
        let head = json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": metadata});
        let mut out = Vec::with_capacity(size + 256);
        // {"apiVersion":…,"items":[…],"kind":…,"metadata":{…}}: keys in the order a Value has them.
        out.extend_from_slice(b"{\"apiVersion\":");
        let _ = serde_json::to_writer(&mut out, &head["apiVersion"]);
        out.extend_from_slice(b",\"items\":[");
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(item);
        }
        out.extend_from_slice(b"],\"kind\":");
        let _ = serde_json::to_writer(&mut out, &head["kind"]);
        out.extend_from_slice(b",\"metadata\":");
        let _ = serde_json::to_writer(&mut out, &head["metadata"]);
        out.push(b'}');
        Ok(out)
    }

    /// The list walk shared by [`Registry::list`] and [`Registry::list_json`]: `item` turns
    /// a stored key-value into an item, or None if the selectors reject it. Returns the
    /// items and the list's metadata (resourceVersion, continue).
    async fn list_items<T>(
        &self,
        res: &ResourceDef,
        ns: Option<&str>,
        opts: &ListOptions,
        mut item: impl FnMut(&KeyValue) -> ApiResult<Option<T>>,
    ) -> ApiResult<(Vec<T>, Value)> {
        Self::check_field_selector(res, &opts.field_selector)?;
        let prefix = list_prefix(res, ns, opts);
        let rv = opts.resource_version.as_deref().unwrap_or_default();
        let invalid = |msg: &str, field: &str| {
            ApiError::invalid("meta.k8s.io", "ListOptions", "", vec![FieldError::forbidden(field, msg)])
        };
        let (mut start, mut revision) = (None, 0);
        if let Some(token) = opts.continue_token.as_deref().filter(|t| !t.is_empty()) {
            if !rv.is_empty() && rv != "0" {
                return Err(invalid(
                    "specifying resource version is not allowed when using continue",
                    "resourceVersion",
                ));
            }
            let t = ContinueToken::decode(token).map_err(|m| {
                ApiError::invalid(
                    "meta.k8s.io",
                    "ListOptions",
                    "",
                    vec![FieldError::invalid("continue", &json!(token), &m)],
                )
            })?;
            start = Some(format!("{prefix}{}", t.start));
            revision = t.rv;
        } else {
            match opts.resource_version_match.as_deref().unwrap_or_default() {
                "" => {
                    if !rv.is_empty() && rv != "0" {
                        let n = parse_rv(rv)?;
                        if opts.limit > 0 {
                            revision = n; // legacy: RV with limit reads exactly at RV
                        } else {
                            self.not_older_than(n).await?;
                        }
                    }
                }
                "Exact" => {
                    if rv.is_empty() || rv == "0" {
                        return Err(invalid(
                            "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\" or unset",
                            "resourceVersionMatch",
                        ));
                    }
                    revision = parse_rv(rv)?;
                }
                "NotOlderThan" => {
                    if rv.is_empty() {
                        return Err(invalid(
                            "resourceVersionMatch is forbidden unless resourceVersion is provided",
                            "resourceVersionMatch",
                        ));
                    }
                    let n = parse_rv(rv)?;
                    self.not_older_than(n).await?;
                }
                other => {
                    return Err(ApiError::invalid(
                        "meta.k8s.io",
                        "ListOptions",
                        "",
                        vec![FieldError::not_supported(
                            "resourceVersionMatch",
                            &json!(other),
                            &["Exact", "NotOlderThan"],
                        )],
                    ))
                }
            }
        }
        let mut items = Vec::new();
        let mut next: Option<String> = None;
        let mut read_rev = revision;
        loop {
            let batch = if opts.limit > 0 { (opts.limit - items.len()).max(1) } else { 0 };
            let mut range = Range::prefix(prefix.clone()).at(read_rev).limit(batch);
            range.start = start.clone();
            let r = match self.store.range(range).await {
                Ok(r) => r,
                Err(storage::Error::Compacted { .. }) if opts.continue_token.is_some() => {
                    return Err(ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."));
                }
                Err(e) => return Err(e.into()),
            };
            if read_rev == 0 {
                read_rev = r.revision;
            }
            let n = r.kvs.len();
            for (i, kv) in r.kvs.iter().enumerate() {
                if let Some(obj) = item(kv)? {
                    items.push(obj);
                }
                if opts.limit > 0 && items.len() >= opts.limit {
                    if i + 1 < n || r.more {
                        next = Some(format!("{}\u{0}", kv.key));
                    }
                    break;
                }
            }
            if next.is_some() || !r.more || opts.limit == 0 || items.len() >= opts.limit {
                break;
            }
            // Filtered out too many: continue after the last key examined.
            match r.kvs.last() {
                Some(kv) => start = Some(format!("{}\u{0}", kv.key)),
                None => break,
            }
        }
        let mut metadata = json!({"resourceVersion": read_rev.to_string()});
        if let Some(next) = next {
            let rel = next.strip_prefix(&prefix).unwrap_or(&next).to_string();
            metadata["continue"] = ContinueToken::new(read_rev, rel).encode().into();
        }
        Ok((items, metadata))
    }

    /// Fail with 504 if `rv` is ahead of the store (as Kubernetes' "Too large resource version").
    async fn not_older_than(&self, rv: Revision) -> ApiResult<()> {
        let current = self.store.current_revision().await?;
        if rv > current {
            return Err(crate::resourceversion::too_large(rv, current));
        }
        Ok(())
    }

    // ------------------------------------------------------------------ create

    pub async fn create(&self, res: &ResourceDef, ns: &str, body: Value, opts: &WriteOptions) -> ApiResult<Outcome> {
        if res.custom.is_some_and(|c| c.terminating) {
            return Err(ApiError::method_not_allowed(
                "create not allowed while custom resource definition is terminating",
            ));
        }
        let (mut obj, mut warnings) = self.decode_body(res, Some(ns), body, opts.field_validation)?;
        let strategy = res.strategy;
        let name_given = !meta_str(&obj, "name").is_empty();
        let generate = meta_str(&obj, "generateName").to_string();
        if !name_given && generate.is_empty() {
            return Err(ApiError::invalid(
                res.group,
                res.kind,
                "",
                vec![FieldError::required("metadata.name", "name or generateName is required")],
            ));
        }
        // Server-set metadata.
        if res.namespaced {
            set_at(&mut obj, "/metadata/namespace", json!(ns));
        } else if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("namespace");
        }
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in ["resourceVersion", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"]
            {
                m.remove(f);
            }
        }
        if let Some(mf) = &opts.managed_fields {
            set_at(&mut obj, "/metadata/managedFields", mf.clone());
        }
        // A v4 uid from the thread-local RNG (`Uuid::new_v4` makes a getrandom syscall each).
        set_at(
            &mut obj,
            "/metadata/uid",
            json!(uuid::Builder::from_random_bytes(rand::random()).into_uuid().to_string()),
        );
        set_at(&mut obj, "/metadata/creationTimestamp", json!(now_rfc3339()));
        if strategy.tracks_generation() {
            set_at(&mut obj, "/metadata/generation", json!(1));
        } else if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("generation");
        }
        if res.has_status() && !strategy.keep_status_on_create() {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        if let Some(hooks) = &opts.webhooks {
            let name = meta_str(&obj, "name").to_string();
            let w = opts.webhook_write(res, Operation::Create, "", ns, &name);
            let (changed, w) = hooks.mutate(&w, &mut obj, None).await?;
            warnings.extend(w);
            if changed {
                obj = self.decode_body(res, Some(ns), obj, FieldValidation::Ignore)?.0;
            }
        }
        // Only a generated name or an address allocation can make an attempt fail and retry:
        // otherwise the one attempt takes the object instead of a copy.
        let retries = !name_given || !strategy.transaction_keys().is_empty();
        let mut template = Some(obj);
        for attempt in 0..MAX_RETRIES {
            let next = if retries { template.clone() } else { template.take() };
            let Some(mut obj) = next else { break };
            if !name_given {
                set_at(&mut obj, "/metadata/name", json!(format!("{generate}{}", random_suffix())));
            }
            let name = meta_str(&obj, "name").to_string();
            strategy.prepare_for_create(&mut obj);
            if let (Some(manager), None) = (&opts.manager, &opts.managed_fields) {
                record_update(res, &json!({}), &mut obj, manager, None);
            }
            let mut errs = validate_object_meta(&obj, strategy.name_rule(), res.namespaced);
            errs.extend(strategy.validate_create(&obj));
            if !errs.is_empty() {
                return Err(ApiError::invalid(res.group, res.kind, &name, errs));
            }
            opts.admit(&obj, None)?;
            if res.namespaced {
                self.namespaces.admit_create(res, ns, &name).await?;
            }
            if let Some(hooks) = &opts.webhooks {
                let w = opts.webhook_write(res, Operation::Create, "", ns, &name);
                warnings.extend(hooks.validate(&w, Some(&obj), None).await?);
            }
            let key = key_of(res, ns, &name);
            let (mut compares, mut ops) = (vec![(key.clone(), 0)], vec![]);
            let (c, o) = self.side_writes(res, None, Some(&mut obj)).await?;
            compares.extend(c);
            ops.extend(o);
            if opts.dry_run {
                if self.store.get(&key).await?.1.is_some() {
                    return Err(ApiError::already_exists(res.group, res.plural, &name));
                }
                return Ok(Outcome { object: obj, warnings, json: None });
            }
            // The object's write goes last: backends that give each op its own revision
            // then give the object the transaction's revision.
            let (stored, meta_at) = encode_at(&obj);
            ops.push(Op::Put { key: key.clone(), value: stored.clone() });
            match self.txn(Txn { compares, ops }).await? {
                TxnOutcome::Committed { revision, .. } => {
                    let json = meta_at.map(|at| splice_resource_version(&stored, at, revision));
                    set_at(&mut obj, "/metadata/resourceVersion", json!(revision.to_string()));
                    return Ok(Outcome { object: obj, warnings, json });
                }
                TxnOutcome::Failed { current, .. } => {
                    let exists = current.first().is_some_and(Option::is_some);
                    if exists && name_given {
                        return Err(ApiError::already_exists(res.group, res.plural, &name));
                    }
                    // A generated name collided, or an allocation bitmap moved: retry.
                    tracing::debug!(attempt, key, "create retry");
                }
            }
        }
        Err(ApiError::timeout("too many conflicts while creating the object; please retry"))
    }

    // ------------------------------------------------------------------ update

    /// PUT: replace the object (or its status / finalizers).
    pub async fn update(
        &self,
        res: &ResourceDef,
        ns: &str,
        name: &str,
        body: Value,
        kind: UpdateKind,
        opts: &WriteOptions,
    ) -> ApiResult<(Outcome, bool)> {
        let (obj, warnings) = self.decode_body(res, Some(ns), body, opts.field_validation)?;
        super::name_matches_url(meta_str(&obj, "name"), name)?;
        let precondition = match meta_str(&obj, "resourceVersion") {
            "" => None,
            rv => Some(parse_rv(rv).map_err(|_| {
                ApiError::invalid(
                    res.group,
                    res.kind,
                    name,
                    vec![FieldError::invalid("metadata.resourceVersion", &json!(rv), "must be a non-negative integer")],
                )
            })?),
        };
        let mut created = false;
        let out = self
            .guaranteed_update(res, ns, name, kind, opts, |current| match current {
                Some(_) => Ok(Some(Intent { object: obj.clone(), precondition })),
                None => Ok(None),
            })
            .await;
        let out = match out {
            Err(e)
                if e.code == 404
                    && kind == UpdateKind::Main
                    && res.strategy.allow_create_on_update()
                    && precondition.is_none() =>
            {
                created = true;
                let mut body = obj.clone();
                if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                self.create(res, ns, body, opts).await
            }
            other => other,
        }?;
        let mut out = out;
        out.warnings.splice(0..0, warnings);
        Ok((out, created))
    }

    /// Read-modify-write with optimistic concurrency. `try_update` sees the current object
    /// (with resourceVersion) and returns the desired one, or None when it does not exist
    /// (→ 404). Retries on conflicts unless the client gave a precondition.
    pub async fn guaranteed_update<F>(
        &self,
        res: &ResourceDef,
        ns: &str,
        name: &str,
        kind: UpdateKind,
        opts: &WriteOptions,
        mut try_update: F,
    ) -> ApiResult<Outcome>
    where
        F: FnMut(Option<&Value>) -> ApiResult<Option<Intent>>,
    {
        let strategy = res.strategy;
        let key = key_of(res, ns, name);
        for _ in 0..MAX_RETRIES {
            let kv = self.store.get(&key).await?.1;
            let current = match &kv {
                Some(kv) => Some(decode(kv)?),
                None => None,
            };
            let Some(intent) = try_update(current.as_ref())? else {
                return Err(ApiError::not_found(res.group, res.plural, name));
            };
            let (Some(kv), Some(old)) = (kv, current) else {
                return Err(ApiError::not_found(res.group, res.plural, name));
            };
            if let Some(p) = intent.precondition {
                if p != kv.mod_revision {
                    return Err(ApiError::stale(res.group, res.plural, name));
                }
            }
            let mut new = intent.object;
            match kind {
                UpdateKind::Main => {
                    if res.has_status() {
                        match old.get("status") {
                            Some(s) => new["status"] = s.clone(),
                            None => {
                                if let Some(m) = new.as_object_mut() {
                                    m.remove("status");
                                }
                            }
                        }
                    }
                    strategy.prepare_for_update(&mut new, &old);
                }
                UpdateKind::Status => {
                    let status = new.get("status").cloned();
                    new = old.clone();
                    match status {
                        Some(s) => new["status"] = s,
                        None => {
                            if let Some(m) = new.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                    strategy.prepare_status_update(&mut new, &old);
                }
                UpdateKind::Subresource(sub) => {
                    new = strategy.prepare_subresource_update(sub, &new, &old).ok_or_else(|| {
                        ApiError::not_found_message(format!("{}/{} is not served", res.plural, sub.name()))
                    })?
                }
                UpdateKind::Internal => {}
            }
            let mut hook_warnings = Vec::new();
            let sub_name = match kind {
                UpdateKind::Status => "status",
                UpdateKind::Subresource(sub) => sub.name(),
                UpdateKind::Main | UpdateKind::Internal => "",
            };
            let hooks = opts.webhooks.as_ref().filter(|_| kind != UpdateKind::Internal);
            if let Some(hooks) = hooks {
                let w = opts.webhook_write(res, Operation::Update, sub_name, ns, name);
                let (changed, w) = hooks.mutate(&w, &mut new, Some(&old)).await?;
                hook_warnings.extend(w);
                if changed {
                    new = self.decode_body(res, Some(ns), new, FieldValidation::Ignore)?.0;
                }
            }
            // Server-owned metadata comes from the stored object.
            for f in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old.get("metadata").and_then(|m| m.get(f)) {
                    Some(v) => set_at(&mut new, &format!("/metadata/{f}"), v.clone()),
                    None => {
                        if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                            m.remove(f);
                        }
                    }
                }
            }
            // An update that does not send managedFields keeps the stored ones.
            if new.pointer("/metadata/managedFields").is_none() {
                if let Some(mf) = old.pointer("/metadata/managedFields") {
                    set_at(&mut new, "/metadata/managedFields", mf.clone());
                }
            }
            new["kind"] = json!(res.kind);
            new["apiVersion"] = json!(res.api_version());
            if old.pointer("/metadata/deletionTimestamp").is_some() {
                let old_f = finalizers(&old);
                let added: Vec<String> = finalizers(&new).into_iter().filter(|f| !old_f.contains(f)).collect();
                if !added.is_empty() {
                    return Err(ApiError::invalid(
                        res.group,
                        res.kind,
                        name,
                        vec![FieldError::forbidden(
                            "metadata.finalizers",
                            &format!("no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"),
                        )],
                    ));
                }
            }
            if strategy.tracks_generation() && spec_part(&new) != spec_part(&old) {
                let g = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
                set_at(&mut new, "/metadata/generation", json!(g + 1));
            }
            if let Some(manager) = &opts.manager {
                match kind {
                    UpdateKind::Main => record_update(res, &old, &mut new, manager, None),
                    UpdateKind::Status => record_update(res, &old, &mut new, manager, Some("status")),
                    UpdateKind::Subresource(_) | UpdateKind::Internal => {}
                }
            }
            let mut errs = validate_object_meta(&new, strategy.name_rule(), res.namespaced);
            match kind {
                UpdateKind::Main => errs.extend(strategy.validate_update(&new, &old)),
                UpdateKind::Internal => errs.extend(strategy.validate(&new)),
                UpdateKind::Subresource(sub) => errs.extend(strategy.validate_subresource_update(sub, &new, &old)),
                UpdateKind::Status => errs.extend(strategy.validate_status_update(&new, &old)),
            }
            if !errs.is_empty() {
                return Err(ApiError::invalid(res.group, res.kind, name, errs));
            }
            opts.admit(&new, Some(&old))?;
            if let Some(hooks) = hooks {
                let w = opts.webhook_write(res, Operation::Update, sub_name, ns, name);
                hook_warnings.extend(hooks.validate(&w, Some(&new), Some(&old)).await?);
            }
            let (mut compares, mut ops) = (vec![(key.clone(), kv.mod_revision)], vec![]);
            if kind == UpdateKind::Main {
                let (c, o) = self.side_writes(res, Some(&old), Some(&mut new)).await?;
                compares.extend(c);
                ops.extend(o);
            }
            let new_bytes = encode(&new);
            if new_bytes == encode(&old) {
                // No-op: nothing written, the stored version answers.
                return Ok(Outcome { object: old, warnings: vec![], json: None });
            }
            let delete_now = new.pointer("/metadata/deletionTimestamp").is_some()
                && finalizers(&new).is_empty()
                && !strategy.deletion_blocked(&new)
                && new.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0) == 0;
            if opts.dry_run {
                return Ok(Outcome { object: new, warnings: hook_warnings, json: None });
            }
            if delete_now {
                let (c, o) = self.side_writes(res, Some(&old), None).await?;
                compares = vec![(key.clone(), kv.mod_revision)];
                compares.extend(c);
                ops = o;
                ops.push(Op::Delete { key: key.clone() });
            } else {
                ops.push(Op::Put { key: key.clone(), value: new_bytes });
            }
            match self.txn(Txn { compares, ops }).await? {
                TxnOutcome::Committed { revision, .. } => {
                    set_at(&mut new, "/metadata/resourceVersion", json!(revision.to_string()));
                    return Ok(Outcome { object: new, warnings: hook_warnings, json: None });
                }
                TxnOutcome::Failed { current, .. } => {
                    let obj_changed =
                        current.first().is_some_and(|c| c.as_ref().map(|kv| kv.mod_revision) != Some(kv.mod_revision));
                    if obj_changed && intent.precondition.is_some() {
                        return Err(ApiError::stale(res.group, res.plural, name));
                    }
                    tokio::task::yield_now().await;
                }
            }
        }
        Err(ApiError::conflict(res.group, res.plural, name, "too many concurrent updates; please retry"))
    }

    // ------------------------------------------------------------------ patch

    /// PATCH of `res` (stored) as `target` addresses it: the patch applies to the object in
    /// the addressed version (a converted view converts it there and back), a
    /// `resourceVersion` it sets is a precondition, and the result is checked as a body.
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        res: &ResourceDef,
        ns: &str,
        name: &str,
        ptype: crate::patch::PatchType,
        body: &[u8],
        kind: UpdateKind,
        opts: &WriteOptions,
        target: PatchTarget<'_>,
    ) -> ApiResult<Outcome> {
        let mut warnings = Vec::new();
        let gvk = match target.view {
            Some(v) => (v.group, v.version, v.kind),
            None => (res.group, res.version, res.kind),
        };
        let out = self
            .guaranteed_update(res, ns, name, kind, opts, |current| {
                let Some(current) = current else { return Ok(None) };
                let patched = match target.view {
                    Some(v) => crate::patch::apply(ptype, &(v.to_view)(current), body, gvk)?,
                    None => crate::patch::apply(ptype, current, body, gvk)?,
                };
                let cur_rv = meta_str(current, "resourceVersion").to_string();
                let new_rv = meta_str(&patched, "resourceVersion").to_string();
                // A patch that sets resourceVersion makes it a precondition.
                let precondition = if new_rv != cur_rv && !new_rv.is_empty() {
                    Some(parse_rv(&new_rv).map_err(|_| {
                        ApiError::invalid(
                            res.group,
                            res.kind,
                            name,
                            vec![FieldError::invalid(
                                "metadata.resourceVersion",
                                &json!(new_rv),
                                "must be a non-negative integer",
                            )],
                        )
                    })?)
                } else {
                    None
                };
                let (obj, w) = self.decode_body(target.served, Some(ns), patched, opts.field_validation)?;
                warnings = w;
                let obj = match target.view {
                    Some(v) => {
                        let stored = (v.from_view)(&obj).map_err(|e| {
                            ApiError::bad_request(format!(
                                "{} in version \"{}\" cannot be handled as a {}: {e}",
                                v.kind, v.version, v.kind
                            ))
                        })?;
                        self.decode_body(res, Some(ns), stored, opts.field_validation)?.0
                    }
                    None => obj,
                };
                super::name_matches_url(meta_str(&obj, "name"), name)?;
                Ok(Some(Intent { object: obj, precondition }))
            })
            .await?;
        warnings.extend(out.warnings);
        Ok(Outcome { object: out.object, warnings, json: None })
    }

    // ------------------------------------------------------------------ delete

    pub async fn delete(&self, res: &ResourceDef, ns: &str, name: &str, opts: &DeleteOptions) -> ApiResult<Deleted> {
        let strategy = res.strategy;
        let key = key_of(res, ns, name);
        for _ in 0..MAX_RETRIES {
            let Some(kv) = self.get_kv(res, ns, name).await? else {
                return Err(ApiError::not_found(res.group, res.plural, name));
            };
            let obj = decode(&kv)?;
            if let Some(uid) = &opts.precondition_uid {
                let actual = meta_str(&obj, "uid");
                if uid != actual {
                    return Err(ApiError::conflict(
                        res.group,
                        res.plural,
                        name,
                        &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"),
                    ));
                }
            }
            if let Some(rv) = &opts.precondition_rv {
                let actual = kv.mod_revision.to_string();
                if *rv != actual {
                    return Err(ApiError::conflict(
                        res.group,
                        res.plural,
                        name,
                        &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"),
                    ));
                }
            }
            if let Some(hooks) = &opts.webhooks {
                let w = WebhookWrite {
                    res,
                    operation: Operation::Delete,
                    subresource: "",
                    namespace: ns,
                    name,
                    dry_run: opts.dry_run,
                };
                hooks.validate(&w, None, Some(&obj)).await?;
            }
            let mut new = obj.clone();
            // Garbage-collection finalizers from the propagation policy.
            let policy = opts.propagation_policy.clone().or_else(|| match opts.orphan_dependents {
                Some(true) => Some("Orphan".into()),
                Some(false) => Some("Background".into()),
                None => None,
            });
            let mut fins = finalizers(&obj);
            let already_deleting = obj.pointer("/metadata/deletionTimestamp").is_some();
            if !already_deleting {
                match policy.as_deref() {
                    Some("Orphan") => {
                        fins.retain(|f| f != "foregroundDeletion");
                        if !fins.iter().any(|f| f == "orphan") {
                            fins.push("orphan".into());
                        }
                    }
                    Some("Foreground") => {
                        fins.retain(|f| f != "orphan");
                        if !fins.iter().any(|f| f == "foregroundDeletion") {
                            fins.push("foregroundDeletion".into());
                        }
                    }
                    Some("Background") => fins.retain(|f| f != "orphan" && f != "foregroundDeletion"),
                    Some(other) => {
                        return Err(ApiError::invalid(
                            "meta.k8s.io",
                            "DeleteOptions",
                            "",
                            vec![FieldError::not_supported(
                                "propagationPolicy",
                                &json!(other),
                                &["Foreground", "Background", "Orphan"],
                            )],
                        ))
                    }
                    None => {}
                }
                for f in strategy.deletion_finalizers() {
                    if !fins.iter().any(|x| x == f) {
                        fins.push(f.to_string());
                    }
                }
            }
            let grace = strategy.graceful_delete_seconds(&obj, opts.grace_period_seconds).unwrap_or(0);
            let blocked = strategy.deletion_blocked(&obj);
            let immediate = fins.is_empty() && !blocked && grace == 0;
            if !immediate {
                if already_deleting {
                    // Only a shorter grace period changes a pending deletion.
                    let cur = obj.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0);
                    if grace >= cur {
                        return Ok(Deleted::Marked(obj));
                    }
                    set_at(&mut new, "/metadata/deletionGracePeriodSeconds", json!(grace));
                    set_at(&mut new, "/metadata/deletionTimestamp", json!(rfc3339_after(grace)));
                } else {
                    set_at(&mut new, "/metadata/deletionTimestamp", json!(rfc3339_after(grace)));
                    set_at(&mut new, "/metadata/deletionGracePeriodSeconds", json!(grace));
                    if !fins.is_empty() {
                        set_at(&mut new, "/metadata/finalizers", json!(fins));
                    }
                    if strategy.tracks_generation() {
                        let g = obj.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
                        set_at(&mut new, "/metadata/generation", json!(g + 1));
                    }
                    strategy.on_deletion_marked(&mut new);
                }
                if opts.dry_run {
                    return Ok(Deleted::Marked(new));
                }
                let txn = Txn {
                    compares: vec![(key.clone(), kv.mod_revision)],
                    ops: vec![Op::Put { key: key.clone(), value: encode(&new) }],
                };
                match self.txn(txn).await? {
                    TxnOutcome::Committed { revision, .. } => {
                        set_at(&mut new, "/metadata/resourceVersion", json!(revision.to_string()));
                        return Ok(Deleted::Marked(new));
                    }
                    TxnOutcome::Failed { .. } => continue,
                }
            }
            // Immediate deletion.
            if opts.dry_run {
                return Ok(Deleted::Now(obj));
            }
            let (mut compares, mut ops) = (vec![(key.clone(), kv.mod_revision)], vec![]);
            let (c, o) = self.side_writes(res, Some(&obj), None).await?;
            compares.extend(c);
            ops.extend(o);
            ops.push(Op::Delete { key: key.clone() });
            match self.txn(Txn { compares, ops }).await? {
                TxnOutcome::Committed { .. } => return Ok(Deleted::Now(obj)),
                TxnOutcome::Failed { .. } => continue,
            }
        }
        Err(ApiError::conflict(res.group, res.plural, name, "too many concurrent updates; please retry"))
    }

    /// Delete everything a list with `list_opts` returns; answers the list of what was
    /// deleted or marked.
    pub async fn delete_collection(
        &self,
        res: &ResourceDef,
        ns: Option<&str>,
        list_opts: &ListOptions,
        opts: &DeleteOptions,
    ) -> ApiResult<Value> {
        let list = self.list(res, ns, &ListOptions { limit: 0, continue_token: None, ..list_opts.clone() }).await?;
        let mut deleted = Vec::new();
        for item in list["items"].as_array().into_iter().flatten() {
            let name = meta_str(item, "name");
            let ns = meta_str(item, "namespace");
            match self.delete(res, ns, name, opts).await {
                Ok(Deleted::Now(o)) | Ok(Deleted::Marked(o)) => deleted.push(o),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(json!({
            "kind": res.list_kind(),
            "apiVersion": res.api_version(),
            "metadata": {"resourceVersion": list["metadata"]["resourceVersion"].clone()},
            "items": deleted,
        }))
    }

    // ------------------------------------------------------------------ side writes

    /// The writes a kind makes beside its object in the same transaction (its strategy's
    /// `transaction_keys`), with a compare on each key written against the value read.
    async fn side_writes(
        &self,
        res: &ResourceDef,
        old: Option<&Value>,
        new: Option<&mut Value>,
    ) -> ApiResult<(Vec<(String, Revision)>, Vec<Op>)> {
        let keys = res.strategy.transaction_keys();
        if keys.is_empty() {
            return Ok((vec![], vec![]));
        }
        let mut reads = Vec::with_capacity(keys.len());
        for k in keys {
            reads.push(self.store.get(k).await?.1);
        }
        let ops = res.strategy.transaction_writes(&self.config, &reads, old, new)?;
        let compares = ops
            .iter()
            .filter_map(|op| {
                let i = keys.iter().position(|k| *k == op.key())?;
                Some((keys[i].to_string(), reads[i].as_ref().map_or(0, |kv| kv.mod_revision)))
            })
            .collect();
        Ok((compares, ops))
    }
}

/// Check a body's `kind` and `apiVersion` against the URL's, filling in the missing ones.
pub fn fill_type_meta(map: &mut serde_json::Map<String, Value>, kind: &str, api_version: &str) -> ApiResult<()> {
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), kind.into());
        }
        Some(k) if k != kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the body ({k}) does not match the kind of the resource at this URL ({kind})"
            )))
        }
        _ => {}
    }
    match map.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("apiVersion".into(), api_version.into());
        }
        Some(v) if v != api_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )))
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_version_spliced_into_stored_json() {
        let cases = [
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "labels": {"metadata": "{"}}, "spec": {}}),
            json!({"data": {"metadata": "\"metadata\":{", "x": [{"metadata": {}}]}, "metadata": {}}),
            json!({"a": [1, {"b": "}"}], "metadata": {"name": "x\\"}}),
        ];
        for obj in cases {
            let stored = encode(&obj);
            let out = with_resource_version(&stored, 42).expect("has metadata");
            let (again, at) = encode_at(&obj);
            assert_eq!(again, stored);
            assert_eq!(splice_resource_version(&again, at.expect("metadata"), 42), out);
            let got: Value = serde_json::from_slice(&out).expect("valid JSON");
            let mut want = obj.clone();
            set_at(&mut want, "/metadata/resourceVersion", json!("42"));
            assert_eq!(got, want);
        }
        assert_eq!(with_resource_version(br#"{"kind":"X"}"#, 1), None);
        assert_eq!(with_resource_version(br#"{"metadata":{"resourceVersion":"3"}}"#, 1), None);
        assert_eq!(with_resource_version(br#"{"metadata":"s"}"#, 1), None);
        assert_eq!(with_resource_version(br#"{"spec":{"metadata":{}}}"#, 1), None);
    }

    #[test]
    fn timestamps() {
        let ts: jiff::Timestamp = "2024-03-05T07:08:09.5Z".parse().unwrap();
        assert_eq!(rfc3339(ts), ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        assert_eq!(rfc3339(ts), "2024-03-05T07:08:09Z");
    }

    #[test]
    fn unknown_field_paths() {
        let input = json!({"spec": {"a": 1, "bogus": 2, "list": [{"x": 1, "y": 2}]}, "nullish": null});
        let norm = json!({"spec": {"a": 1, "list": [{"x": 1}]}});
        let mut out = Vec::new();
        unknown_fields(&input, &norm, "", &mut out);
        assert_eq!(out, vec!["spec.bogus", "spec.list[0].y"]);
    }

    #[test]
    fn keys() {
        let pods = crate::resources::find("", "v1", "pods").unwrap();
        let nss = crate::resources::find("", "v1", "namespaces").unwrap();
        assert_eq!(key_of(pods, "default", "x"), "/registry/pods/default/x");
        assert_eq!(key_of(nss, "", "default"), "/registry/namespaces/default");
        assert_eq!(prefix_of(pods, Some("default")), "/registry/pods/default/");
        assert_eq!(prefix_of(pods, None), "/registry/pods/");
        let tenant = ListOptions { tenant_prefix: Some("acme-".into()), ..Default::default() };
        assert_eq!(list_prefix(pods, None, &tenant), "/registry/pods/acme-");
        assert_eq!(list_prefix(pods, Some("acme-prod"), &tenant), "/registry/pods/acme-prod/");
        assert_eq!(list_prefix(nss, None, &tenant), "/registry/namespaces/acme-");
    }

    #[test]
    fn encode_strips_rv() {
        let b = encode(&json!({"metadata": {"name": "x", "resourceVersion": "5", "managedFields": []}}));
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v, json!({"metadata": {"name": "x", "managedFields": []}}));
        let b =
            encode(&json!({"kind": "X", "metadata": {"resourceVersion": "5", "selfLink": "/x"}, "spec": {"a": [1]}}));
        assert_eq!(&b[..], br#"{"kind":"X","metadata":{},"spec":{"a":[1]}}"#);
    }
}
