//! `kubectl delete`: by file (`-f`), by `TYPE NAME…` / `TYPE/NAME`, by `-l` or `--all`;
//! `--cascade=background|foreground|orphan`, `--grace-period`, `--now`, `--force`, and
//! `--wait` (default true) until the objects are gone, bounded by `--timeout`.

use std::time::{Duration, Instant};

use http::Method;
use serde_json::{json, Value};

use super::apply::{manifest_resource, target_namespace};
use super::get::parse_args;
use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};
use crate::manifest;

/// Delete resources by file names, stdin, resources and names, or by resources and label selector.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE NAME… or TYPE/NAME…
    pub args: Vec<String>,
    /// Filename, directory, or URL to files containing the resource to delete.
    #[arg(short = 'f', long = "filename")]
    pub filenames: Vec<String>,
    /// Process the directory used in -f, --filename recursively.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Process a kustomization directory. This flag can't be used together with -f or -R.
    #[arg(short = 'k', long = "kustomize", conflicts_with_all = ["filenames", "recursive"])]
    pub kustomize: Option<String>,
    /// Selector (label query) to filter on.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Selector (field query) to filter on.
    #[arg(long)]
    pub field_selector: Option<String>,
    /// Delete all resources, in the namespace of the specified resource types.
    #[arg(long)]
    pub all: bool,
    /// If present, list the requested object(s) across all namespaces.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Must be "background", "orphan", or "foreground".
    #[arg(long, default_value = "background", num_args = 0..=1, default_missing_value = "background")]
    pub cascade: String,
    /// Period of time in seconds given to the resource to terminate gracefully (-1: the default).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub grace_period: i64,
    /// If true, resources are signaled for immediate shutdown (same as --grace-period=1).
    #[arg(long)]
    pub now: bool,
    /// If true, immediately remove resources from API and bypass graceful deletion.
    #[arg(long)]
    pub force: bool,
    /// If true, wait for resources to be gone before returning.
    #[arg(long, default_value = "true", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub wait: bool,
    /// The length of time to wait before giving up on a delete (0: no limit).
    #[arg(long, default_value = "0s")]
    pub timeout: String,
    /// Treat "resource not found" as a successful delete.
    #[arg(long)]
    pub ignore_not_found: bool,
    /// Must be "none", "server", or "client".
    #[arg(long, default_value = "none", num_args = 0..=1, default_missing_value = "client")]
    pub dry_run: String,
    /// Output mode: only `name` is supported.
    #[arg(short = 'o', long)]
    pub output: Option<String>,
}

/// The DeleteOptions body for the flags. Pure.
pub fn delete_options(cascade: &str, grace_period: i64, now: bool, force: bool) -> Result<Value> {
    let policy = match cascade {
        "background" | "true" => "Background",
        "foreground" => "Foreground",
        "orphan" | "false" => "Orphan",
        other => {
            return Err(KubectlError::msg(format!(
                "invalid cascade value ({other}). Must be \"background\", \"foreground\", or \"orphan\""
            )))
        }
    };
    let mut body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": policy});
    let grace = if now {
        1
    } else if force && grace_period < 0 {
        0
    } else {
        grace_period
    };
    if grace >= 0 {
        body["gracePeriodSeconds"] = json!(grace);
    }
    Ok(body)
}

/// Parse a Go-style duration (`30s`, `2m`, `1h`, `500ms`, plain seconds). Pure.
pub fn parse_duration(s: &str) -> Result<Duration> {
    apimachinery::duration::parse_seconds_or_go_duration(s)
        .map_err(|_| KubectlError::msg(format!("invalid duration {s:?}")))
}

/// Poll until `path` is gone (404), or the timeout (if any) passes.
pub async fn wait_gone(ctx: &Ctx, path: &str, timeout: Option<Duration>) -> Result<()> {
    let start = Instant::now();
    loop {
        match ctx.get(path).await {
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        if timeout.is_some_and(|t| start.elapsed() >= t) {
            return Err(KubectlError::msg(format!("timed out waiting for the condition on {path}")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let dry = super::apply::DryRun::parse(&a.dry_run)?;
    let opts = delete_options(&a.cascade, a.grace_period, a.now, a.force)?;
    let timeout = parse_duration(&a.timeout)?;
    let timeout = (!timeout.is_zero()).then_some(timeout);
    // (display id, object path, source file)
    let mut targets: Vec<(String, String, Option<String>)> = Vec::new();
    let mut errors: Vec<KubectlError> = Vec::new();
    if !a.filenames.is_empty() || a.kustomize.is_some() {
        let manifests = match &a.kustomize {
            Some(dir) => crate::kustomize::read(dir)?,
            None => manifest::read_all(&a.filenames, a.recursive)?,
        };
        for m in manifests {
            match manifest_resource(ctx, &m).await.and_then(|res| Ok((target_namespace(&m, &res, ctx)?, res))) {
                Ok((ns, res)) => targets.push((
                    format!("{} \"{}\"", res.kind_group(), m.name()),
                    res.object_path(ns.as_deref(), m.name()),
                    Some(m.source.clone()),
                )),
                Err(e) => errors.push(e),
            }
        }
    } else {
        if a.args.is_empty() {
            return Err(KubectlError::msg(
                "You must provide one or more resources by argument or filename.\nExample resource specifications include:\n   '-f rsrc.yaml'\n   '--filename=rsrc.json'\n   '<resource> <name>'\n   '<resource>'",
            ));
        }
        let by_selector = a.all || a.selector.is_some() || a.field_selector.is_some();
        let ns = if a.all_namespaces { None } else { Some(ctx.namespace.as_str()) };
        for r in parse_args(&a.args)? {
            let res = ctx.resolve(&r.type_arg).await?;
            if r.names.is_empty() {
                if !by_selector {
                    return Err(KubectlError::msg(format!("resource(s) were provided, but no name was specified")));
                }
                let list = ctx
                    .get(&with_query(
                        &res.collection_path(ns),
                        &[
                            ("labelSelector", a.selector.clone().unwrap_or_default()),
                            ("fieldSelector", a.field_selector.clone().unwrap_or_default()),
                        ],
                    ))
                    .await?;
                let items = list.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
                if items.is_empty() {
                    // kubectl delete says this on stdout, without the namespace.
                    println!("No resources found");
                }
                for o in items {
                    let name = o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                    let ons = o.pointer("/metadata/namespace").and_then(Value::as_str);
                    targets.push((format!("{} \"{name}\"", res.kind_group()), res.object_path(ons, name), None));
                }
            } else {
                for n in &r.names {
                    targets.push((format!("{} \"{n}\"", res.kind_group()), res.object_path(ns, n), None));
                }
            }
        }
    }
    let mut deleted = Vec::new();
    for (id, path, source) in &targets {
        if dry == super::apply::DryRun::Client {
            println!("{id} deleted (dry run)");
            continue;
        }
        let q = with_query(path, &[("dryRun", dry.query())]);
        match ctx
            .json(Method::DELETE, &q, Some(("application/json", serde_json::to_vec(&opts).unwrap_or_default())))
            .await
        {
            Ok(_) => {
                if a.output.as_deref() == Some("name") {
                    println!("{}", id.replace(" \"", "/").trim_end_matches('"'));
                } else {
                    println!("{id} deleted{}", dry.suffix());
                }
                deleted.push(path.clone());
            }
            Err(e) if e.is_not_found() && a.ignore_not_found => {}
            Err(e) => errors.push(match source {
                Some(s) => e.with_context(&format!("error when deleting \"{s}\": ")),
                None => e,
            }),
        }
    }
    if a.wait && dry == super::apply::DryRun::None && a.cascade != "orphan" {
        for p in &deleted {
            if let Err(e) = wait_gone(ctx, p, timeout).await {
                errors.push(e);
            }
        }
    }
    for e in &errors {
        eprintln!("{e}");
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(KubectlError::Reported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let o = delete_options("foreground", -1, false, false).unwrap();
        assert_eq!(o["propagationPolicy"], "Foreground");
        assert!(o.get("gracePeriodSeconds").is_none());
        assert_eq!(delete_options("background", 5, false, false).unwrap()["gracePeriodSeconds"], 5);
        assert_eq!(delete_options("orphan", -1, true, false).unwrap()["gracePeriodSeconds"], 1);
        assert_eq!(delete_options("background", -1, false, true).unwrap()["gracePeriodSeconds"], 0);
        assert!(delete_options("sideways", -1, false, false).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert!(parse_duration("5x").is_err());
    }
}
