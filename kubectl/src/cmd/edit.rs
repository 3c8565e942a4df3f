//! `kubectl edit TYPE NAME`: the object as YAML in `$KUBE_EDITOR`/`$EDITOR` (else `vi`),
//! then an update with what was saved.

use http::Method;
use serde_json::Value;

use super::{ns_for, resolve_targets};
use crate::client::Ctx;
use crate::error::{KubectlError, Result};

/// Edit a resource on the server.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE NAME or TYPE/NAME
    pub args: Vec<String>,
    /// Output format for the editor: yaml or json.
    #[arg(short = 'o', long, default_value = "yaml")]
    pub output: String,
}

/// The editor command: `$KUBE_EDITOR`, else `$EDITOR`, else `vi`.
pub fn editor() -> String {
    std::env::var("KUBE_EDITOR")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("EDITOR").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "vi".into())
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    for (res, name) in resolve_targets(ctx, &a.args).await? {
        let path = res.object_path(ns_for(ctx, &res), &name);
        let obj = crate::cmd::get::with_type_meta(ctx.get(&path).await?, &res);
        let obj = crate::print::omit_managed_fields(&obj);
        let json = a.output == "json";
        let text = if json { crate::print::to_json(&obj) } else { crate::print::to_yaml(&obj) };
        let dir = std::env::temp_dir();
        let file =
            dir.join(format!("kubectl-edit-{}-{name}.{}", std::process::id(), if json { "json" } else { "yaml" }));
        std::fs::write(&file, &text).map_err(|e| KubectlError::msg(format!("writing {}: {e}", file.display())))?;
        let ed = editor();
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{ed} \"$1\""))
            .arg("sh")
            .arg(&file)
            .status()
            .map_err(|e| KubectlError::msg(format!("running editor {ed:?}: {e}")))?;
        let edited = std::fs::read_to_string(&file).unwrap_or_default();
        let _ = std::fs::remove_file(&file);
        if !status.success() {
            return Err(KubectlError::msg(format!("there was a problem with the editor {ed:?}")));
        }
        if edited == text {
            println!("Edit cancelled, no changes made.");
            continue;
        }
        let new: Value = serde_yaml::from_str(&edited)
            .map_err(|e| KubectlError::msg(format!("the edited file had a syntax error: {e}")))?;
        ctx.json(Method::PUT, &path, Some(("application/json", serde_json::to_vec(&new).unwrap_or_default()))).await?;
        println!("{}/{name} edited", res.kind_group());
    }
    Ok(())
}
