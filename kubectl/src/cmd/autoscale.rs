//! `kubectl autoscale TYPE NAME --max=N [--min=N] [--cpu-percent=N]`: create an
//! `autoscaling/v2` HorizontalPodAutoscaler for a scalable workload, as kubectl 1.33 does.

use http::Method;
use serde_json::{json, Value};

use super::apply::DryRun;
use super::{ns_for, resolve_targets};
use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};

/// Auto-scale a deployment, replica set, stateful set, or replication controller.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE NAME or TYPE/NAME
    pub args: Vec<String>,
    /// The upper limit for the number of pods that can be set by the autoscaler. Required.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub max: i64,
    /// The lower limit for the number of pods that can be set by the autoscaler (-1: the server's default).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub min: i64,
    /// The target average CPU utilization (percent of the requested CPU) over all pods (-1: none).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub cpu_percent: i64,
    /// The name for the newly created object (default: the target's name).
    #[arg(long, default_value = "")]
    pub name: String,
    /// Must be "none", "server", or "client".
    #[arg(long, default_value = "none", num_args = 0..=1, default_missing_value = "client")]
    pub dry_run: String,
    /// Output format: `yaml`, `json` or `name`.
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// The name of the manager used to track field ownership.
    #[arg(long, default_value = "kubectl-autoscale")]
    pub field_manager: String,
}

/// The kinds kubectl autoscales (`canBeAutoscaled`).
const SCALABLE: &[(&str, &str)] =
    &[("", "ReplicationController"), ("apps", "Deployment"), ("apps", "ReplicaSet"), ("apps", "StatefulSet")];

/// Check the flags (`AutoscaleOptions.Validate`).
pub fn validate(a: &Args) -> Result<()> {
    if a.max < 1 {
        return Err(KubectlError::msg(format!("--max=MAXPODS is required and must be at least 1, max: {}", a.max)));
    }
    if a.max < a.min {
        return Err(KubectlError::msg(format!(
            "--max=MAXPODS must be larger or equal to --min=MINPODS, max: {}, min: {}",
            a.max, a.min
        )));
    }
    Ok(())
}

/// The HPA kubectl 1.33 generates (`HPAGeneratorV2`).
pub fn generate(name: &str, api_version: &str, kind: &str, target: &str, a: &Args) -> Value {
    let mut spec = json!({
        "scaleTargetRef": {"apiVersion": api_version, "kind": kind, "name": target},
        "maxReplicas": a.max,
    });
    if a.min > 0 {
        spec["minReplicas"] = json!(a.min);
    }
    if a.cpu_percent >= 0 {
        spec["metrics"] = json!([{
            "type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": a.cpu_percent}},
        }]);
    }
    json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "creationTimestamp": null},
        "spec": spec,
        "status": {"currentMetrics": null, "desiredReplicas": 0},
    })
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    validate(a)?;
    let dry = DryRun::parse(&a.dry_run)?;
    for (res, target) in resolve_targets(ctx, &a.args).await? {
        if !SCALABLE.contains(&(res.group.as_str(), res.kind.as_str())) {
            let gk = if res.group.is_empty() { res.kind.clone() } else { format!("{}.{}", res.kind, res.group) };
            return Err(KubectlError::msg(format!("cannot autoscale a {gk}")));
        }
        // The target must exist (kubectl reads it first).
        let obj = ctx.get(&res.object_path(ns_for(ctx, &res), &target)).await?;
        let target = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(&target).to_string();
        let name = if a.name.is_empty() { target.clone() } else { a.name.clone() };
        let hpa = generate(&name, &res.api_version(), &res.kind, &target, a);
        let printed = if dry == DryRun::Client {
            hpa
        } else {
            let path = format!("/apis/autoscaling/v2/namespaces/{}/horizontalpodautoscalers", ctx.namespace);
            let q = with_query(&path, &[("fieldManager", a.field_manager.clone()), ("dryRun", dry.query())]);
            ctx.json(Method::POST, &q, Some(("application/json", serde_json::to_vec(&hpa).unwrap_or_default()))).await?
        };
        match a.output.as_deref() {
            Some("yaml") => print!("{}", crate::print::to_yaml(&crate::print::omit_managed_fields(&printed))),
            Some("json") => print!("{}", crate::print::to_json(&crate::print::omit_managed_fields(&printed))),
            Some("name") => println!("horizontalpodautoscaler.autoscaling/{name}"),
            None | Some("") => println!("horizontalpodautoscaler.autoscaling/{name} autoscaled{}", dry.suffix()),
            Some(other) => {
                return Err(KubectlError::msg(format!(
                    "unable to match a printer suitable for the output format \"{other}\""
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: Args,
    }

    fn args(v: &[&str]) -> Args {
        T::parse_from(std::iter::once("autoscale").chain(v.iter().copied())).a
    }

    #[test]
    fn generates_what_kubectl_1_33_does() {
        let a = args(&["deployment", "web", "--cpu-percent=50", "--min=1", "--max=5"]);
        let hpa = generate("web", "apps/v1", "Deployment", "web", &a);
        assert_eq!(hpa["apiVersion"], "autoscaling/v2");
        assert_eq!(hpa["spec"]["minReplicas"], 1);
        assert_eq!(hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 50);
        let bare = generate("web", "apps/v1", "Deployment", "web", &args(&["deployment", "web", "--max=3"]));
        assert!(bare["spec"].get("metrics").is_none() && bare["spec"].get("minReplicas").is_none());
    }

    #[test]
    fn flag_errors_read_like_kubectl() {
        assert_eq!(
            validate(&args(&["deployment", "web"])).unwrap_err().to_string(),
            "error: --max=MAXPODS is required and must be at least 1, max: -1"
        );
        assert_eq!(
            validate(&args(&["deployment", "web", "--min=5", "--max=3"])).unwrap_err().to_string(),
            "error: --max=MAXPODS must be larger or equal to --min=MINPODS, max: 3, min: 5"
        );
    }
}
