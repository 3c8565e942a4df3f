//! Server-side apply (`application/apply-patch+yaml`): the I/O shell around
//! `apimachinery::fieldmanager`. Creates the object when it does not exist, otherwise merges
//! the configuration under optimistic concurrency; conflicts are 409 `Conflict` with
//! `FieldManagerConflict` causes, as Kubernetes reports them.

use apimachinery::fieldmanager::{self, ApplyRequest};
use apimachinery::strategicpatch::Schema;
use serde_json::{json, Value};

use super::generic::{now_rfc3339, Intent, Outcome, Registry, UpdateKind, WriteOptions, MAX_RETRIES};
use crate::error::{ApiError, ApiResult, FieldError};
use crate::registry::ResourceDef;

/// What the client asked for.
pub struct ApplyOptions<'a> {
    pub field_manager: &'a str,
    pub force: bool,
    pub write: WriteOptions,
}

fn conflict_error(conflicts: &[fieldmanager::Conflict]) -> ApiError {
    let mut e = ApiError::new(409, "Conflict", fieldmanager::conflicts_message(conflicts));
    e.details = Some(crate::error::Details {
        causes: conflicts
            .iter()
            .map(|c| FieldError { reason: "FieldManagerConflict", field: c.path.clone(), message: c.message() })
            .collect(),
        ..Default::default()
    });
    e
}

/// Parse the apply body (YAML or JSON) and check it addresses this object.
pub fn parse_config(res: &ResourceDef, name: &str, body: &[u8]) -> ApiResult<Value> {
    let config: Value =
        serde_yaml::from_slice(body).map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !config.is_object() {
        return Err(ApiError::bad_request("error decoding YAML: the apply configuration must be an object"));
    }
    let kind = config.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = config.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    if kind.is_empty() || api_version.is_empty() {
        return Err(ApiError::bad_request("apiVersion and kind must be set in an apply configuration"));
    }
    if kind != res.kind || api_version != res.api_version() {
        return Err(ApiError::bad_request(format!(
            "the kind in the body ({api_version}, Kind={kind}) does not match the URL ({}, Kind={})",
            res.api_version(),
            res.kind
        )));
    }
    let body_name = config.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(name);
    super::name_matches_url(body_name, name)?;
    Ok(config)
}

impl Registry {
    /// Apply `config` as `opts.field_manager`. Returns the object and whether it was created.
    pub async fn apply(
        &self,
        res: &ResourceDef,
        ns: &str,
        name: &str,
        config: Value,
        opts: &ApplyOptions<'_>,
    ) -> ApiResult<(Outcome, bool)> {
        if opts.field_manager.is_empty() {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                vec![FieldError::required("fieldManager", "is required for apply patch")],
            ));
        }
        let defs = &*crate::openapi::DEFINITIONS;
        let schema =
            defs.schema_of(res.group, res.version, res.kind).map_or_else(Schema::none, |r| Schema::new(defs, r));
        let api_version = res.api_version();
        let now = now_rfc3339();
        let req = ApplyRequest { manager: opts.field_manager, api_version: &api_version, force: opts.force, now: &now };
        // The apply records its own managedFields entry, not an update's.
        let opts = &ApplyOptions {
            write: WriteOptions { manager: None, ..opts.write.clone() },
            field_manager: opts.field_manager,
            force: opts.force,
        };
        // Partial configurations are fine: the typed check (and fieldValidation) runs on the
        // merged object.
        let mut warnings = Vec::new();
        for _ in 0..MAX_RETRIES {
            match self.get(res, ns, name).await {
                Err(e) if e.code == 404 => {
                    let mut obj =
                        fieldmanager::apply(&json!({}), &config, schema, &req).map_err(|c| conflict_error(&c))?;
                    obj["apiVersion"] = json!(api_version);
                    obj["kind"] = json!(res.kind);
                    crate::registry::set_at(&mut obj, "/metadata/name", json!(name));
                    let mut write = opts.write.clone();
                    write.managed_fields = obj.pointer("/metadata/managedFields").cloned();
                    match self.create(res, ns, obj, &write).await {
                        Err(e) if e.code == 409 && e.reason == "AlreadyExists" => continue,
                        r => return r.map(|o| (o, true)),
                    }
                }
                Err(e) => return Err(e),
                Ok(_) => {}
            }
            let result = self
                .guaranteed_update(res, ns, name, UpdateKind::Main, &opts.write, |current| {
                    let Some(current) = current else { return Ok(None) };
                    let obj = fieldmanager::apply(current, &config, schema, &req).map_err(|c| conflict_error(&c))?;
                    let (obj, w) = self.decode_body(res, Some(ns), obj, opts.write.field_validation)?;
                    warnings.extend(w);
                    Ok(Some(Intent { object: obj, precondition: None }))
                })
                .await;
            match result {
                Err(e) if e.code == 404 => continue,
                r => return r.map(|o| (Outcome { object: o.object, warnings: warnings.clone(), json: None }, false)),
            }
        }
        Err(ApiError::new(409, "Conflict", "too many concurrent changes; try again"))
    }
}
