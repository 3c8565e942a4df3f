//! `kubectl label` and `kubectl annotate`: `key=value` sets, `key-` removes, `--overwrite`
//! to change an existing value; sent as a JSON merge patch on metadata.

use http::Method;
use serde_json::{json, Map, Value};

use super::get::parse_args;
use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};

/// Update the labels (or annotations) on a resource.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE NAME… KEY=VAL… KEY-…  or TYPE/NAME… KEY=VAL…
    pub args: Vec<String>,
    /// If true, allow labels to be overwritten.
    #[arg(long)]
    pub overwrite: bool,
    /// Selector (label query) to filter on.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Select all resources in the namespace of the specified resource types.
    #[arg(long)]
    pub all: bool,
    /// If true, only print the changes, without sending them (accepted: `--dry-run=client`).
    #[arg(long, default_value = "none", num_args = 0..=1, default_missing_value = "client")]
    pub dry_run: String,
    /// Display the current labels instead of changing them.
    #[arg(long)]
    pub list: bool,
}

/// Split arguments into resource arguments and `k=v` / `k-` changes. Pure.
pub fn split_changes(args: &[String]) -> (Vec<String>, Vec<(String, Option<String>)>) {
    let mut res = Vec::new();
    let mut changes = Vec::new();
    for a in args {
        if let Some((k, v)) = a.split_once('=') {
            changes.push((k.to_string(), Some(v.to_string())));
        } else if let Some(k) = a.strip_suffix('-').filter(|_| !res.is_empty()) {
            changes.push((k.to_string(), None));
        } else {
            res.push(a.clone());
        }
    }
    (res, changes)
}

/// The metadata merge patch for `changes` against `current` labels; errors like kubectl on
/// an existing key without `--overwrite`. Pure.
pub fn label_patch(
    field: &str,
    current: Option<&Map<String, Value>>,
    changes: &[(String, Option<String>)],
    overwrite: bool,
) -> Result<Value> {
    let mut m = Map::new();
    for (k, v) in changes {
        match v {
            Some(v) => {
                if let Some(old) = current.and_then(|c| c.get(k)).and_then(Value::as_str) {
                    if old != v && !overwrite {
                        return Err(KubectlError::msg(format!(
                            "'{k}' already has a value ({old}), and --overwrite is false"
                        )));
                    }
                }
                m.insert(k.clone(), Value::String(v.clone()));
            }
            None => {
                m.insert(k.clone(), Value::Null);
            }
        }
    }
    Ok(json!({"metadata": {field: m}}))
}

pub async fn run(ctx: &Ctx, a: &Args, field: &str, verb: &str) -> Result<()> {
    let (res_args, changes) = split_changes(&a.args);
    if changes.is_empty() && !a.list {
        return Err(KubectlError::msg(format!(
            "at least one {} update is required",
            if field == "labels" { "label" } else { "annotation" }
        )));
    }
    let mut targets = Vec::new();
    for r in parse_args(&res_args)? {
        let res = ctx.resolve(&r.type_arg).await?;
        let ns = res.namespaced.then_some(ctx.namespace.as_str());
        if r.names.is_empty() {
            if !a.all && a.selector.is_none() {
                return Err(KubectlError::msg("resource(s) were provided, but no name was specified"));
            }
            let list = ctx
                .get(&with_query(
                    &res.collection_path(ns),
                    &[("labelSelector", a.selector.clone().unwrap_or_default())],
                ))
                .await?;
            for o in list.get("items").and_then(Value::as_array).into_iter().flatten() {
                let n = o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
                targets.push((res.clone(), n));
            }
        } else {
            targets.extend(r.names.into_iter().map(|n| (res.clone(), n)));
        }
    }
    for (res, name) in targets {
        let path = res.object_path(res.namespaced.then_some(ctx.namespace.as_str()), &name);
        let cur = ctx.get(&path).await?;
        let current = cur.pointer(&format!("/metadata/{field}")).and_then(Value::as_object);
        if a.list {
            for (k, v) in current.into_iter().flatten() {
                println!("{k}={}", v.as_str().unwrap_or_default());
            }
            continue;
        }
        let patch = label_patch(field, current, &changes, a.overwrite)?;
        for (k, v) in &changes {
            if v.is_none() && current.is_none_or(|c| !c.contains_key(k)) {
                println!("{} \"{k}\" not found.", if field == "labels" { "label" } else { "annotation" });
            }
        }
        let unchanged =
            changes.iter().all(|(k, v)| current.and_then(|c| c.get(k)).and_then(Value::as_str) == v.as_deref());
        if unchanged {
            println!("{}/{name} not {verb}", res.kind_group());
            continue;
        }
        if a.dry_run != "client" {
            ctx.json(Method::PATCH, &path, Some(("application/merge-patch+json", patch.to_string().into_bytes())))
                .await?;
        }
        // kubectl says "unlabeled" when labels only went away (not for annotations).
        let removed_only = field == "labels" && !a.overwrite && changes.iter().all(|(_, v)| v.is_none());
        println!("{}/{name} {}{verb}", res.kind_group(), if removed_only { "un" } else { "" });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_patches() {
        let args: Vec<String> = ["pod", "p", "a=1", "b-"].iter().map(|s| s.to_string()).collect();
        let (r, c) = split_changes(&args);
        assert_eq!(r, vec!["pod", "p"]);
        assert_eq!(c, vec![("a".to_string(), Some("1".to_string())), ("b".to_string(), None)]);
        let cur = json!({"a": "0"});
        assert!(label_patch("labels", cur.as_object(), &c, false).is_err());
        let p = label_patch("labels", cur.as_object(), &c, true).unwrap();
        assert_eq!(p, json!({"metadata": {"labels": {"a": "1", "b": null}}}));
    }
}
