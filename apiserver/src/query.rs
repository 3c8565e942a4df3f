//! A request's URL query → typed options (pure): the booleans and integers Kubernetes'
//! query parameters take, and the options of writes, lists and deletes. The options of a
//! watch are checked in [`crate::watch::WatchParams`].

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult, FieldError};
use crate::registry::generic::{DeleteOptions, FieldValidation, ListOptions, WriteOptions};
use crate::selectors::{FieldSelector, LabelSelector};

pub fn q_bool(query: &HashMap<String, String>, k: &str) -> ApiResult<Option<bool>> {
    match query.get(k).map(String::as_str) {
        None | Some("") => Ok(None),
        Some("true") | Some("1") => Ok(Some(true)),
        Some("false") | Some("0") => Ok(Some(false)),
        Some(other) => Err(ApiError::bad_request(format!("invalid value for {k}: {other:?}"))),
    }
}

pub fn q_i64(query: &HashMap<String, String>, k: &str) -> ApiResult<Option<i64>> {
    match query.get(k).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<i64>()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid value for {k}: {v:?}: must be an integer"))),
    }
}

pub fn write_options(query: &HashMap<String, String>) -> ApiResult<WriteOptions> {
    let dry_run = match query.get("dryRun").map(String::as_str) {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "CreateOptions",
                "",
                vec![FieldError::not_supported("dryRun", &json!(other), &["All"])],
            ))
        }
    };
    let field_validation = match query.get("fieldValidation").map(String::as_str) {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Ignore") => FieldValidation::Ignore,
        Some("Strict") => FieldValidation::Strict,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other:?}, must be one of Ignore, Warn, Strict"
            )))
        }
    };
    Ok(WriteOptions { dry_run, field_validation, ..Default::default() })
}

pub fn list_options(query: &HashMap<String, String>) -> ApiResult<ListOptions> {
    let label_selector = LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or_default())
        .map_err(|e| {
            ApiError::bad_request(format!(
                "unable to parse requirement: {}",
                e.0.trim_start_matches("unable to parse requirement: ")
            ))
        })?;
    let field_selector = FieldSelector::parse(query.get("fieldSelector").map(String::as_str).unwrap_or_default())
        .map_err(|e| ApiError::bad_request(e.0))?;
    let limit = match q_i64(query, "limit")? {
        Some(n) if n > 0 => n as usize,
        _ => 0,
    };
    // Names and namespaces are DNS names; the prefix is one with its separator (`acme-`).
    let tenant_prefix = query.get("tenantPrefix").filter(|p| !p.is_empty()).cloned();
    if let Some(p) = &tenant_prefix {
        let valid = p.len() <= 63 && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid {
            return Err(ApiError::bad_request(format!(
                "tenantPrefix {p:?} is not the start of a DNS name (lowercase letters, digits and '-')"
            )));
        }
    }
    Ok(ListOptions {
        tenant_prefix,
        label_selector,
        field_selector,
        limit,
        continue_token: query.get("continue").filter(|c| !c.is_empty()).cloned(),
        resource_version: query.get("resourceVersion").cloned(),
        resource_version_match: query.get("resourceVersionMatch").filter(|c| !c.is_empty()).cloned(),
    })
}

pub fn delete_options(query: &HashMap<String, String>, body: &[u8]) -> ApiResult<DeleteOptions> {
    let mut opts = DeleteOptions {
        dry_run: matches!(query.get("dryRun").map(String::as_str), Some("All")),
        grace_period_seconds: q_i64(query, "gracePeriodSeconds")?,
        propagation_policy: query.get("propagationPolicy").filter(|s| !s.is_empty()).cloned(),
        orphan_dependents: q_bool(query, "orphanDependents")?,
        ..Default::default()
    };
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v: Value = if body.starts_with(b"k8s\0") {
            crate::protobuf::decode(body)
                .map_err(|e| ApiError::bad_request(format!("the DeleteOptions body could not be decoded: {e}")))?
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("the DeleteOptions body could not be decoded: {e}")))?
        };
        if let Some(g) = v.get("gracePeriodSeconds").and_then(Value::as_i64) {
            opts.grace_period_seconds = Some(g);
        }
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            opts.propagation_policy = Some(p.to_string());
        }
        if let Some(o) = v.get("orphanDependents").and_then(Value::as_bool) {
            opts.orphan_dependents = Some(o);
        }
        if let Some(uid) = v.pointer("/preconditions/uid").and_then(Value::as_str) {
            opts.precondition_uid = Some(uid.to_string());
        }
        if let Some(rv) = v.pointer("/preconditions/resourceVersion").and_then(Value::as_str) {
            opts.precondition_rv = Some(rv.to_string());
        }
        if let Some(dr) = v.get("dryRun").and_then(Value::as_array) {
            opts.dry_run = dr.iter().any(|x| x == "All");
        }
    }
    if opts.grace_period_seconds.is_some_and(|g| g < 0) {
        opts.grace_period_seconds = Some(0);
    }
    Ok(opts)
}
