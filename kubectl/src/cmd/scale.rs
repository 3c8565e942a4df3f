//! `kubectl scale TYPE NAME --replicas=N` through the `scale` subresource.

use http::Method;
use serde_json::json;

use super::{ns_for, resolve_targets};
use crate::client::Ctx;
use crate::error::{KubectlError, Result};

/// Set a new size for a deployment, replica set, replication controller, or stateful set.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE NAME or TYPE/NAME
    pub args: Vec<String>,
    /// The new desired number of replicas. Required.
    #[arg(long)]
    pub replicas: i64,
    /// Precondition for current size (-1: none).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub current_replicas: i64,
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    if a.replicas < 0 {
        return Err(KubectlError::msg(
            "The --replicas=COUNT flag is required, and COUNT must be greater than or equal to 0",
        ));
    }
    for (res, name) in resolve_targets(ctx, &a.args).await? {
        let path = format!("{}/scale", res.object_path(ns_for(ctx, &res), &name));
        if let Err(e) = ctx.get(&res.object_path(ns_for(ctx, &res), &name)).await {
            return Err(match e {
                KubectlError::Api { code: 404, message, .. } => {
                    KubectlError::msg(format!("no objects passed to scale {message}"))
                }
                other => other,
            });
        }
        if a.current_replicas >= 0 {
            let cur = ctx.get(&path).await?;
            let have = cur.pointer("/spec/replicas").and_then(serde_json::Value::as_i64).unwrap_or(0);
            if have != a.current_replicas {
                return Err(KubectlError::msg(format!("Expected replicas to be {}, was {have}", a.current_replicas)));
            }
        }
        let body = json!({"spec": {"replicas": a.replicas}});
        ctx.json(Method::PATCH, &path, Some(("application/merge-patch+json", body.to_string().into_bytes()))).await?;
        println!("{}/{name} scaled", res.kind_group());
    }
    Ok(())
}
