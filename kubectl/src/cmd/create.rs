//! `kubectl create -f` (POST each object) and `kubectl replace -f` (PUT each object;
//! `--force` deletes and re-creates). Also `create namespace NAME`.

use http::Method;
use serde_json::Value;

use super::apply::{manifest_resource, target_namespace, with_namespace, DryRun};
use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};
use crate::manifest;
use crate::merge;

/// Create a resource from a file or from stdin.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// A generator and its NAME: `deployment NAME --image=I`, `service clusterip|nodeport NAME
    /// --tcp=P[:T]`, `configmap NAME`, `secret generic NAME`, `job NAME --image=I -- CMD`,
    /// `serviceaccount NAME`, `namespace NAME`.
    pub args: Vec<String>,
    /// Image(s) for `deployment` (several allowed) and `job`.
    #[arg(long)]
    pub image: Vec<String>,
    /// Number of replicas for `deployment`.
    #[arg(short = 'r', long)]
    pub replicas: Option<i64>,
    /// The containerPort of `deployment`'s first container.
    #[arg(long)]
    pub port: Option<i64>,
    /// Port pairs `port[:targetPort]` for `service`.
    #[arg(long)]
    pub tcp: Vec<String>,
    /// The nodePort of `service nodeport`.
    #[arg(long)]
    pub node_port: Option<i64>,
    /// The clusterIP of `service clusterip` (`None` for a headless service).
    #[arg(long)]
    pub clusterip: Option<String>,
    /// `key=value` for `configmap` and `secret generic`.
    #[arg(long)]
    pub from_literal: Vec<String>,
    /// `[key=]path` for `configmap` and `secret generic`.
    #[arg(long)]
    pub from_file: Vec<String>,
    /// The Secret's type for `secret generic`.
    #[arg(long = "type")]
    pub secret_type: Option<String>,
    /// The command after `--` (`job`, `deployment`).
    #[arg(last = true)]
    pub command: Vec<String>,
    /// Filename, directory, or URL to files to use to create the resource.
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
    /// Record the configuration in the last-applied annotation (for later apply).
    #[arg(long)]
    pub save_config: bool,
    /// Output format: only `name` is supported.
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Schema validation (accepted for compatibility; the server validates).
    #[arg(long, num_args = 0..=1, default_missing_value = "strict")]
    pub validate: Option<String>,
}

/// Replace a resource by file name or stdin.
#[derive(Debug, clap::Args)]
pub struct ReplaceArgs {
    /// The files that contain the configurations to replace.
    #[arg(short = 'f', long = "filename")]
    pub filenames: Vec<String>,
    /// Process the directory used in -f, --filename recursively.
    #[arg(short = 'R', long)]
    pub recursive: bool,
    /// Delete and re-create the resource.
    #[arg(long)]
    pub force: bool,
    /// Must be "none", "server", or "client".
    #[arg(long, default_value = "none", num_args = 0..=1, default_missing_value = "client")]
    pub dry_run: String,
    /// Output format: only `name` is supported.
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Schema validation (accepted for compatibility; the server validates).
    #[arg(long, num_args = 0..=1, default_missing_value = "strict")]
    pub validate: Option<String>,
}

fn report(lines: Vec<Result<String>>, output: Option<&str>) -> Result<()> {
    let mut failed = false;
    let mut errs = Vec::new();
    for l in lines {
        match l {
            Ok(s) if output == Some("name") => println!("{}", s.split(' ').next().unwrap_or_default()),
            Ok(s) => println!("{s}"),
            Err(e) => {
                failed = true;
                errs.push(e);
            }
        }
    }
    for e in errs {
        eprintln!("{e}");
    }
    if failed {
        Err(KubectlError::Reported)
    } else {
        Ok(())
    }
}

pub async fn create(ctx: &Ctx, a: &CreateArgs) -> Result<()> {
    let dry = DryRun::parse(&a.dry_run)?;
    if a.filenames.is_empty() && a.kustomize.is_none() {
        return create_generated(ctx, a, dry).await;
    }
    let manifests = match &a.kustomize {
        Some(dir) => crate::kustomize::read(dir)?,
        None => manifest::read_all(&a.filenames, a.recursive)?,
    };
    let mut lines = Vec::new();
    for m in manifests {
        let r = async {
            let res = manifest_resource(ctx, &m).await?;
            let ns = target_namespace(&m, &res, ctx)?;
            let mut obj = with_namespace(&m.obj, ns.as_deref());
            if a.save_config {
                obj = merge::with_last_applied(&obj).0;
            }
            if dry != DryRun::Client {
                let q = with_query(
                    &res.collection_path(ns.as_deref()),
                    &[("fieldManager", "kubectl-create".into()), ("dryRun", dry.query())],
                );
                ctx.json(Method::POST, &q, Some(("application/json", serde_json::to_vec(&obj).unwrap_or_default())))
                    .await
                    .map_err(|e| e.with_context(&format!("error when creating \"{}\": ", m.source)))?;
            }
            Ok(format!("{}/{} created{}", res.kind_group(), m.name(), dry.suffix()))
        }
        .await;
        lines.push(r);
    }
    report(lines, a.output.as_deref())
}

/// `kubectl create <generator> NAME …`: the generated object, created (or, with
/// `--dry-run=client`, only printed).
async fn create_generated(ctx: &Ctx, a: &CreateArgs, dry: DryRun) -> Result<()> {
    use super::generate::{for_server, generate, target, GenFlags};
    let flags = GenFlags {
        image: a.image.clone(),
        replicas: a.replicas,
        port: a.port,
        tcp: a.tcp.clone(),
        node_port: a.node_port,
        clusterip: a.clusterip.clone(),
        from_literal: a.from_literal.clone(),
        from_file: a.from_file.clone(),
        secret_type: a.secret_type.clone(),
        command: a.command.clone(),
    };
    let obj = generate(&a.args, &flags)?;
    let (prefix, plural, namespaced) = target(&obj);
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default().to_lowercase();
    let kind_group = match prefix.strip_prefix("/apis/").and_then(|g| g.split('/').next()) {
        Some(group) => format!("{kind}.{group}"),
        None => kind,
    };
    let printed = if dry == DryRun::Client {
        obj
    } else {
        let path = if namespaced {
            format!("{prefix}/namespaces/{}/{plural}", ctx.namespace)
        } else {
            format!("{prefix}/{plural}")
        };
        let q = with_query(&path, &[("fieldManager", "kubectl-create".into()), ("dryRun", dry.query())]);
        let body = serde_json::to_vec(&for_server(&obj)).unwrap_or_default();
        ctx.json(Method::POST, &q, Some(("application/json", body))).await?
    };
    match a.output.as_deref() {
        Some("yaml") => print!("{}", crate::print::to_yaml(&crate::print::omit_managed_fields(&printed))),
        Some("json") => print!("{}", crate::print::to_json(&crate::print::omit_managed_fields(&printed))),
        Some("name") => println!("{kind_group}/{name}"),
        None | Some("") => println!("{kind_group}/{name} created{}", dry.suffix()),
        Some(other) => {
            return Err(KubectlError::msg(format!(
                "unable to match a printer suitable for the output format \"{other}\""
            )));
        }
    }
    Ok(())
}

pub async fn replace(ctx: &Ctx, a: &ReplaceArgs) -> Result<()> {
    let dry = DryRun::parse(&a.dry_run)?;
    let mut lines = Vec::new();
    for m in manifest::read_all(&a.filenames, a.recursive)? {
        let r = async {
            let res = manifest_resource(ctx, &m).await?;
            let ns = target_namespace(&m, &res, ctx)?;
            let mut obj = with_namespace(&m.obj, ns.as_deref());
            let path = res.object_path(ns.as_deref(), m.name());
            let ctx_err = |e: KubectlError| e.with_context(&format!("error when replacing \"{}\": ", m.source));
            if a.force {
                if dry != DryRun::Client {
                    match ctx.json(Method::DELETE, &path, None).await {
                        Ok(_) => println!("{}/{} deleted", res.kind_group(), m.name()),
                        Err(e) if e.is_not_found() => {}
                        Err(e) => return Err(ctx_err(e)),
                    }
                    super::delete::wait_gone(ctx, &path, None).await?;
                    let q = with_query(&res.collection_path(ns.as_deref()), &[("dryRun", dry.query())]);
                    ctx.json(
                        Method::POST,
                        &q,
                        Some(("application/json", serde_json::to_vec(&obj).unwrap_or_default())),
                    )
                    .await
                    .map_err(ctx_err)?;
                }
                return Ok(format!("{}/{} replaced{}", res.kind_group(), m.name(), dry.suffix()));
            }
            // Keep the last-applied annotation in step if the object has one.
            let current = ctx.get(&path).await.map_err(ctx_err)?;
            if merge::last_applied(&current).is_some() {
                obj = merge::with_last_applied(&obj).0;
            }
            if obj.pointer("/metadata/resourceVersion").is_none() {
                if let (Some(rv), Some(meta)) = (
                    current.pointer("/metadata/resourceVersion").cloned(),
                    obj.get_mut("metadata").and_then(Value::as_object_mut),
                ) {
                    meta.insert("resourceVersion".into(), rv);
                }
            }
            if dry != DryRun::Client {
                let q = with_query(&path, &[("fieldManager", "kubectl-replace".into()), ("dryRun", dry.query())]);
                ctx.json(Method::PUT, &q, Some(("application/json", serde_json::to_vec(&obj).unwrap_or_default())))
                    .await
                    .map_err(ctx_err)?;
            }
            Ok(format!("{}/{} replaced{}", res.kind_group(), m.name(), dry.suffix()))
        }
        .await;
        lines.push(r);
    }
    report(lines, a.output.as_deref())
}
