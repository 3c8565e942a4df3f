//! `kubectl apply -f`: client-side apply. Creates what is missing (recording the
//! last-applied-configuration annotation), patches what exists with the three-way merge of
//! `merge.rs`, and prints `<kind>[.<group>]/<name> created|configured|unchanged`.
//! `--server-side` sends an apply patch; `--dry-run=client|server`.

use http::Method;
use serde_json::Value;

use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};
use crate::manifest::{self, Manifest};
use crate::merge::{self, Dialect};
use crate::resources::ApiRes;

/// Apply a configuration to a resource by file name or stdin.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The files that contain the configurations to apply.
    #[arg(short = 'f', long = "filename")]
    pub filenames: Vec<String>,
    /// Process the directory used in -f, --filename recursively.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Process a kustomization directory. This flag can't be used together with -f or -R.
    #[arg(short = 'k', long = "kustomize", conflicts_with_all = ["filenames", "recursive"])]
    pub kustomize: Option<String>,
    /// Must be "none", "server", or "client".
    #[arg(long, default_value = "none", num_args = 0..=1, default_missing_value = "client")]
    pub dry_run: String,
    /// If true, apply runs in the server instead of the client.
    #[arg(long)]
    pub server_side: bool,
    /// If true, server-side apply will force the changes against conflicts.
    #[arg(long)]
    pub force_conflicts: bool,
    /// Name of the manager used to track field ownership.
    #[arg(long, default_value = "kubectl-client-side-apply")]
    pub field_manager: String,
    /// Output format: only `name` is supported.
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Schema validation (accepted for compatibility; the server validates).
    #[arg(long, num_args = 0..=1, default_missing_value = "strict")]
    pub validate: Option<String>,
    /// Automatically resolve conflicts between the modified and live configuration (accepted).
    #[arg(long, default_value_t = true)]
    pub overwrite: bool,
}

/// `--dry-run` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DryRun {
    None,
    Client,
    Server,
}

impl DryRun {
    pub fn parse(s: &str) -> Result<DryRun> {
        match s {
            "none" | "false" => Ok(DryRun::None),
            "client" | "true" => Ok(DryRun::Client),
            "server" => Ok(DryRun::Server),
            other => Err(KubectlError::msg(format!(
                "Invalid dry-run value ({other}). Must be \"none\", \"server\", or \"client\"."
            ))),
        }
    }

    /// The suffix kubectl adds to result lines.
    pub fn suffix(self) -> &'static str {
        match self {
            DryRun::None => "",
            DryRun::Client => " (dry run)",
            DryRun::Server => " (server dry run)",
        }
    }

    pub fn query(self) -> String {
        if self == DryRun::Server {
            "All".into()
        } else {
            String::new()
        }
    }
}

/// The namespace an object from a manifest goes to; errors like kubectl when `-n` disagrees.
pub fn target_namespace(m: &Manifest, res: &ApiRes, ctx: &Ctx) -> Result<Option<String>> {
    if !res.namespaced {
        return Ok(None);
    }
    match m.namespace() {
        Some(ns) if ctx.namespace_flag && ns != ctx.namespace => Err(KubectlError::msg(format!(
            "the namespace from the provided object \"{ns}\" does not match the namespace \"{}\". You must pass '--namespace={ns}' to perform this operation.",
            ctx.namespace
        ))),
        Some(ns) => Ok(Some(ns.to_string())),
        None => Ok(Some(ctx.namespace.clone())),
    }
}

/// Resolve a manifest's type or say so like kubectl.
pub async fn manifest_resource(ctx: &Ctx, m: &Manifest) -> Result<ApiRes> {
    ctx.resolve_kind(m.api_version(), m.kind()).await?.ok_or_else(|| {
        KubectlError::msg(format!(
            "resource mapping not found for name: \"{}\" namespace: \"{}\" from \"{}\": no matches for kind \"{}\" in version \"{}\"\nensure CRDs are installed first",
            m.name(),
            m.namespace().unwrap_or_default(),
            m.source,
            m.kind(),
            m.api_version()
        ))
    })
}

/// With the namespace the object will get set in its metadata.
pub fn with_namespace(obj: &Value, ns: Option<&str>) -> Value {
    let mut o = obj.clone();
    if let (Some(ns), Some(meta)) = (ns, o.get_mut("metadata").and_then(Value::as_object_mut)) {
        meta.insert("namespace".into(), Value::String(ns.to_string()));
    }
    o
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let dry = DryRun::parse(&a.dry_run)?;
    let (manifests, read_err) = match &a.kustomize {
        Some(dir) => match crate::kustomize::read(dir) {
            Ok(m) => (m, None),
            Err(e) => (vec![], Some(e)),
        },
        None => manifest::read_stream(&a.filenames, a.recursive),
    };
    if manifests.is_empty() {
        return Err(read_err.unwrap_or_else(|| KubectlError::msg("no objects passed to apply")));
    }
    let mut errors = Vec::new();
    for m in &manifests {
        match apply_one(ctx, a, dry, m).await {
            Ok(line) => {
                if a.output.as_deref() == Some("name") {
                    println!("{}", line.split(' ').next().unwrap_or_default());
                } else {
                    println!("{line}");
                }
            }
            Err(e) => errors.push(e),
        }
    }
    errors.extend(read_err);
    for e in &errors {
        eprintln!("{e}");
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(KubectlError::Reported)
    }
}

async fn apply_one(ctx: &Ctx, a: &Args, dry: DryRun, m: &Manifest) -> Result<String> {
    let res = manifest_resource(ctx, m).await?;
    let ns = target_namespace(m, &res, ctx)?;
    let name = m.name();
    if name.is_empty() {
        return Err(KubectlError::msg(format!("error when retrieving current configuration of:\nResource: \"{}\", GroupVersionKind: \"{}, Kind={}\"\nName: \"\", Namespace: \"{}\"\nfrom server for: \"{}\": resource name may not be empty", res.plural_group(), res.api_version(), res.kind, ns.clone().unwrap_or_default(), m.source)));
    }
    let id = format!("{}/{name}", res.kind_group());
    let obj = with_namespace(&m.obj, ns.as_deref());
    let path = res.object_path(ns.as_deref(), name);
    if a.server_side {
        let q = with_query(
            &path,
            &[
                (
                    "fieldManager",
                    if a.field_manager == "kubectl-client-side-apply" {
                        "kubectl".into()
                    } else {
                        a.field_manager.clone()
                    },
                ),
                ("force", if a.force_conflicts { "true".into() } else { String::new() }),
                ("dryRun", dry.query()),
            ],
        );
        if dry != DryRun::Client {
            let body = serde_json::to_vec(&obj).unwrap_or_default();
            ctx.json(Method::PATCH, &q, Some(("application/apply-patch+yaml", body)))
                .await
                .map_err(|e| e.with_context(&format!("error when applying \"{}\": ", m.source)))?;
        }
        return Ok(format!("{id} serverside-applied{}", dry.suffix()));
    }
    let (modified, _) = merge::with_last_applied(&obj);
    for attempt in 0..3 {
        let current = match ctx.get(&path).await {
            Ok(c) => Some(c),
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                return Err(e.with_context(&format!(
                    "error when retrieving current configuration of:\nResource: \"{}/{}, Resource={}\", GroupVersionKind: \"{}/{}, Kind={}\"\nName: \"{name}\", Namespace: \"{}\"\nfrom server for: \"{}\": ",
                    res.group, res.version, res.plural, res.group, res.version, res.kind, ns.clone().unwrap_or_default(), m.source
                )))
            }
        };
        let Some(current) = current else {
            if dry != DryRun::Client {
                let body = serde_json::to_vec(&modified).unwrap_or_default();
                let q = with_query(
                    &res.collection_path(ns.as_deref()),
                    &[("fieldManager", a.field_manager.clone()), ("dryRun", dry.query())],
                );
                ctx.json(Method::POST, &q, Some(("application/json", body)))
                    .await
                    .map_err(|e| e.with_context(&format!("error when creating \"{}\": ", m.source)))?;
            }
            return Ok(format!("{id} created{}", dry.suffix()));
        };
        let original = merge::last_applied(&current);
        let dialect = if res.is_builtin() { Dialect::Strategic } else { Dialect::Merge };
        let patch = merge::three_way(original.as_ref(), &modified, &current, dialect);
        if patch.as_object().is_some_and(|p| p.is_empty()) {
            return Ok(format!("{id} unchanged{}", dry.suffix()));
        }
        if dry == DryRun::Client {
            return Ok(format!("{id} configured{}", dry.suffix()));
        }
        let ct = match dialect {
            Dialect::Strategic => "application/strategic-merge-patch+json",
            Dialect::Merge => "application/merge-patch+json",
        };
        let q = with_query(&path, &[("fieldManager", a.field_manager.clone()), ("dryRun", dry.query())]);
        match ctx.json(Method::PATCH, &q, Some((ct, serde_json::to_vec(&patch).unwrap_or_default()))).await {
            Ok(_) => return Ok(format!("{id} configured{}", dry.suffix())),
            Err(e) if e.is_conflict() && attempt < 2 => continue,
            Err(e) => {
                return Err(e.with_context(&format!(
                    "error when applying patch:\n{}\n\nto:\nResource: \"{}/{}, Resource={}\", GroupVersionKind: \"{}/{}, Kind={}\"\nName: \"{name}\", Namespace: \"{}\"\nfor: \"{}\": ",
                    serde_json::to_string(&patch).unwrap_or_default(),
                    res.group, res.version, res.plural, res.group, res.version, res.kind, ns.clone().unwrap_or_default(), m.source
                )))
            }
        }
    }
    Err(KubectlError::msg(format!("{id}: too many conflicts")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dry_run_values() {
        assert_eq!(DryRun::parse("client").unwrap(), DryRun::Client);
        assert_eq!(DryRun::parse("server").unwrap().suffix(), " (server dry run)");
        assert_eq!(DryRun::parse("none").unwrap().query(), "");
        assert!(DryRun::parse("maybe").is_err());
    }
}
