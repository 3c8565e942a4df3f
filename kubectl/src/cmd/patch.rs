//! `kubectl patch TYPE NAME -p PATCH --type strategic|merge|json`.

use http::Method;
use serde_json::Value;

use super::{ns_for, resolve_targets};
use crate::client::Ctx;
use crate::error::{KubectlError, Result};

/// Update fields of a resource using strategic merge patch, a JSON merge patch, or a JSON patch.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE NAME or TYPE/NAME
    pub args: Vec<String>,
    /// The patch to be applied to the resource JSON file (JSON or YAML).
    #[arg(short = 'p', long)]
    pub patch: Option<String>,
    /// A file containing a patch to be applied to the resource.
    #[arg(long)]
    pub patch_file: Option<String>,
    /// The type of patch being provided; one of [json merge strategic].
    #[arg(long = "type", default_value = "strategic")]
    pub patch_type: String,
    /// The subresource to patch (status, scale).
    #[arg(long)]
    pub subresource: Option<String>,
}

/// The content type for `--type`. Pure.
pub fn content_type(t: &str) -> Result<&'static str> {
    match t {
        "strategic" => Ok("application/strategic-merge-patch+json"),
        "merge" => Ok("application/merge-patch+json"),
        "json" => Ok("application/json-patch+json"),
        other => Err(KubectlError::msg(format!("--type must be one of [json merge strategic], not \"{other}\""))),
    }
}

/// An object without the fields every write changes.
fn comparable(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
        m.remove("generation");
    }
    v
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let ct = content_type(&a.patch_type)?;
    let text = match (&a.patch, &a.patch_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).map_err(|e| KubectlError::msg(format!("unable to read patch file: {e}")))?
        }
        (None, None) => return Err(KubectlError::msg("must specify -p to patch")),
    };
    let patch: Value =
        serde_yaml::from_str(&text).map_err(|e| KubectlError::msg(format!("unable to parse \"{text}\": {e}")))?;
    for (res, name) in resolve_targets(ctx, &a.args).await? {
        let mut path = res.object_path(ns_for(ctx, &res), &name);
        if let Some(s) = &a.subresource {
            path = format!("{path}/{s}");
        }
        let before = ctx.get(&path).await?;
        let after = ctx.json(Method::PATCH, &path, Some((ct, patch.to_string().into_bytes()))).await?;
        let suffix = if comparable(&before) == comparable(&after) { " (no change)" } else { "" };
        println!("{}/{name} patched{suffix}", res.kind_group());
    }
    Ok(())
}
