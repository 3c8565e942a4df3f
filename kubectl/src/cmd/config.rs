//! `kubectl config view|current-context|get-contexts|use-context|set-context --current`.

use std::path::PathBuf;

use kube::config::Kubeconfig;

use crate::client::{load_kubeconfig, GlobalOpts};
use crate::error::{KubectlError, Result};
use crate::print::table::align;

/// Modify kubeconfig files.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: ConfigCmd,
}

#[derive(Debug, clap::Subcommand)]
pub enum ConfigCmd {
    /// Display merged kubeconfig settings or a specified kubeconfig file.
    View {
        /// Reduce information to values relevant to current-context.
        #[arg(long)]
        minify: bool,
        /// Display raw byte data and sensitive data.
        #[arg(long)]
        raw: bool,
        /// Output format: yaml or json.
        #[arg(short = 'o', long)]
        output: Option<String>,
    },
    /// Display the current-context.
    CurrentContext,
    /// Describe one or many contexts.
    GetContexts {
        /// Output format: name.
        #[arg(short = 'o', long)]
        output: Option<String>,
    },
    /// Set the current-context in a kubeconfig file.
    UseContext { name: String },
    /// Set a context entry in kubeconfig (only `--current` / NAME with `--namespace=NS`).
    SetContext {
        name: Option<String>,
        #[arg(long)]
        current: bool,
    },
}

/// The file `use-context` writes: `--kubeconfig`, else the first `$KUBECONFIG` entry, else ~/.kube/config.
fn config_file(g: &GlobalOpts) -> PathBuf {
    if let Some(p) = &g.kubeconfig {
        return p.clone();
    }
    if let Some(first) =
        std::env::var("KUBECONFIG").ok().and_then(|v| v.split(':').find(|s| !s.is_empty()).map(PathBuf::from))
    {
        return first;
    }
    PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".kube/config")
}

/// `get-contexts` rows. Pure.
pub fn context_rows(kc: &Kubeconfig) -> Vec<Vec<String>> {
    let mut rows =
        vec![vec!["CURRENT".to_string(), "NAME".into(), "CLUSTER".into(), "AUTHINFO".into(), "NAMESPACE".into()]];
    let current = kc.current_context.clone().unwrap_or_default();
    let mut contexts: Vec<_> = kc.contexts.iter().collect();
    contexts.sort_by(|a, b| a.name.cmp(&b.name));
    for c in contexts {
        let ctx = c.context.clone().unwrap_or_default();
        rows.push(vec![
            if c.name == current { "*".into() } else { String::new() },
            c.name.clone(),
            ctx.cluster,
            ctx.user.unwrap_or_default(),
            ctx.namespace.unwrap_or_default(),
        ]);
    }
    rows
}

fn redact(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k.ends_with("-data") || k == "token" || k == "password" {
                    *x = serde_json::Value::String("DATA+OMITTED".into());
                    if k == "token" || k == "password" {
                        *x = serde_json::Value::String("REDACTED".into());
                    }
                } else {
                    redact(x);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(redact),
        _ => {}
    }
}

pub fn run(g: &GlobalOpts, a: &Args) -> Result<()> {
    let kc = load_kubeconfig(g.kubeconfig.as_ref())?;
    match &a.cmd {
        ConfigCmd::View { minify, raw, output } => {
            let mut kc = kc.unwrap_or_default();
            if *minify {
                let cur = g.context.clone().or(kc.current_context.clone()).unwrap_or_default();
                kc.contexts.retain(|c| c.name == cur);
                let cluster =
                    kc.contexts.first().and_then(|c| c.context.as_ref()).map(|c| c.cluster.clone()).unwrap_or_default();
                let user = kc
                    .contexts
                    .first()
                    .and_then(|c| c.context.as_ref())
                    .and_then(|c| c.user.clone())
                    .unwrap_or_default();
                kc.clusters.retain(|c| c.name == cluster);
                kc.auth_infos.retain(|u| u.name == user);
            }
            let mut v = serde_json::to_value(&kc).map_err(|e| KubectlError::msg(e.to_string()))?;
            if !raw {
                redact(&mut v);
            }
            if v.get("apiVersion").is_none() {
                v["apiVersion"] = "v1".into();
                v["kind"] = "Config".into();
            }
            if output.as_deref() == Some("json") {
                print!("{}", crate::print::to_json(&v));
            } else {
                print!("{}", crate::print::to_yaml(&v));
            }
            Ok(())
        }
        ConfigCmd::CurrentContext => match kc.and_then(|k| k.current_context) {
            Some(c) if !c.is_empty() => {
                println!("{c}");
                Ok(())
            }
            _ => Err(KubectlError::msg("current-context is not set")),
        },
        ConfigCmd::GetContexts { output } => {
            let kc = kc.unwrap_or_default();
            if output.as_deref() == Some("name") {
                kc.contexts.iter().for_each(|c| println!("{}", c.name));
            } else {
                print!("{}", align(&context_rows(&kc)));
            }
            Ok(())
        }
        ConfigCmd::UseContext { name } => {
            let path = config_file(g);
            let mut kc =
                Kubeconfig::read_from(&path).map_err(|e| KubectlError::msg(format!("{}: {e}", path.display())))?;
            if !kc.contexts.iter().any(|c| c.name == *name) {
                return Err(KubectlError::msg(format!("no context exists with the name: \"{name}\"")));
            }
            kc.current_context = Some(name.clone());
            write(&path, &kc)?;
            println!("Switched to context \"{name}\".");
            Ok(())
        }
        ConfigCmd::SetContext { name, current } => {
            let ns = &g.namespace;
            let path = config_file(g);
            let mut kc =
                Kubeconfig::read_from(&path).map_err(|e| KubectlError::msg(format!("{}: {e}", path.display())))?;
            let target = if *current {
                kc.current_context.clone().unwrap_or_default()
            } else {
                name.clone().unwrap_or_default()
            };
            let Some(c) = kc.contexts.iter_mut().find(|c| c.name == target) else {
                return Err(KubectlError::msg(format!("no context exists with the name: \"{target}\"")));
            };
            if let (Some(ns), Some(ctx)) = (ns, c.context.as_mut()) {
                ctx.namespace = Some(ns.clone());
            }
            write(&path, &kc)?;
            println!("Context \"{target}\" modified.");
            Ok(())
        }
    }
}

fn write(path: &PathBuf, kc: &Kubeconfig) -> Result<()> {
    let text = serde_yaml::to_string(kc).map_err(|e| KubectlError::msg(e.to_string()))?;
    std::fs::write(path, text).map_err(|e| KubectlError::msg(format!("writing {}: {e}", path.display())))
}
