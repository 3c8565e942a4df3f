//! `kubectl wait --for=condition=C[=V] | --for=delete | --for=jsonpath=EXPR=V TYPE/NAME…`,
//! polling until every object meets the condition or `--timeout` (default 30s) passes.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::get::parse_args;
use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};
use crate::print::jsonpath;

/// Experimental: Wait for a specific condition on one or many resources.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE NAME… or TYPE/NAME…
    pub args: Vec<String>,
    /// The condition to wait on: delete | condition=NAME[=VALUE] | jsonpath=EXPR=VALUE.
    #[arg(long = "for")]
    pub for_: String,
    /// The length of time to wait before giving up (negative: a week).
    #[arg(long, default_value = "30s", allow_hyphen_values = true)]
    pub timeout: String,
    /// Selector (label query) to filter on.
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Select all resources in the namespace of the specified resource types.
    #[arg(long)]
    pub all: bool,
}

/// What to wait for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cond {
    Delete,
    Condition(String, String),
    JsonPath(String, Option<String>),
}

/// Parse `--for`. Pure.
pub fn parse_for(s: &str) -> Result<Cond> {
    if s == "delete" {
        return Ok(Cond::Delete);
    }
    if let Some(c) = s.strip_prefix("condition=") {
        let (name, val) = c.split_once('=').unwrap_or((c, "true"));
        return Ok(Cond::Condition(name.to_string(), val.to_string()));
    }
    if let Some(j) = s.strip_prefix("jsonpath=") {
        // EXPR=VALUE where EXPR is `{…}` or a relaxed `.a.b`.
        let (expr, val) = match j.find("}=") {
            Some(i) => (j[..=i].to_string(), Some(j[i + 2..].to_string())),
            None => match j.split_once('=') {
                Some((e, v)) => (e.to_string(), Some(v.to_string())),
                None => (j.to_string(), None),
            },
        };
        return Ok(Cond::JsonPath(expr, val));
    }
    Err(KubectlError::msg(format!("unrecognized condition: \"{s}\"")))
}

/// Whether `obj` meets the condition. Pure.
pub fn met(c: &Cond, obj: &Value) -> bool {
    match c {
        Cond::Delete => false,
        Cond::Condition(name, want) => {
            obj.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten().any(|x| {
                x.get("type").and_then(Value::as_str).is_some_and(|t| t.eq_ignore_ascii_case(name))
                    && x.get("status").and_then(Value::as_str).is_some_and(|s| s.eq_ignore_ascii_case(want))
            })
        }
        Cond::JsonPath(expr, want) => {
            let vals = jsonpath::select(expr, obj).unwrap_or_default();
            match want {
                Some(w) => vals.iter().any(|v| jsonpath::value_string(v) == *w),
                None => !vals.is_empty(),
            }
        }
    }
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let cond = parse_for(&a.for_)?;
    let timeout = if a.timeout.starts_with('-') {
        Duration::from_secs(7 * 86400)
    } else {
        super::delete::parse_duration(&a.timeout)?
    };
    let mut targets = Vec::new();
    for r in parse_args(&a.args)? {
        let res = ctx.resolve(&r.type_arg).await?;
        let ns = res.namespaced.then_some(ctx.namespace.as_str());
        if r.names.is_empty() {
            let list = ctx
                .get(&with_query(
                    &res.collection_path(ns),
                    &[("labelSelector", a.selector.clone().unwrap_or_default())],
                ))
                .await?;
            for o in list.get("items").and_then(Value::as_array).into_iter().flatten() {
                targets.push((
                    res.clone(),
                    o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string(),
                ));
            }
            if targets.is_empty() {
                return Err(KubectlError::msg("no matching resources found"));
            }
        } else {
            targets.extend(r.names.into_iter().map(|n| (res.clone(), n)));
        }
    }
    let start = Instant::now();
    for (res, name) in targets {
        let path = res.object_path(res.namespaced.then_some(ctx.namespace.as_str()), &name);
        let mut polls = 0;
        let mut already_gone = false;
        loop {
            match ctx.get(&path).await {
                // Gone before the wait began: nothing to report (as kubectl).
                Err(e) if e.is_not_found() && cond == Cond::Delete => {
                    already_gone = polls == 0;
                    break;
                }
                Err(e) => return Err(e),
                Ok(o) if met(&cond, &o) => break,
                Ok(_) => {}
            }
            polls += 1;
            if start.elapsed() >= timeout {
                return Err(KubectlError::msg(format!("timed out waiting for the condition on {}/{name}", res.plural)));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if !already_gone {
            println!("{}/{name} condition met", res.kind_group());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions() {
        let pod = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(met(&parse_for("condition=Ready").unwrap(), &pod));
        assert!(met(&parse_for("condition=ready=true").unwrap(), &pod));
        assert!(!met(&parse_for("condition=Ready=False").unwrap(), &pod));
        assert!(met(&parse_for("jsonpath={.status.phase}=Running").unwrap(), &pod));
        assert!(met(&parse_for("jsonpath=.status.phase=Running").unwrap(), &pod));
        assert!(!met(&parse_for("jsonpath={.status.phase}=Pending").unwrap(), &pod));
        assert_eq!(parse_for("delete").unwrap(), Cond::Delete);
        assert!(parse_for("sunrise").is_err());
    }
}
