//! `kubectl rollout status|history|undo|restart|pause|resume` for Deployments.

use std::time::{Duration, Instant};

use http::Method;
use serde_json::{json, Value};

use super::{ns_for, resolve_targets};
use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};
use crate::resources::ApiRes;

const REVISION: &str = "deployment.kubernetes.io/revision";

/// Manage the rollout of a resource.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: RolloutCmd,
}

#[derive(Debug, clap::Args)]
pub struct Target {
    /// TYPE NAME or TYPE/NAME
    pub args: Vec<String>,
}

#[derive(Debug, clap::Subcommand)]
pub enum RolloutCmd {
    /// Show the status of the rollout.
    Status {
        #[command(flatten)]
        t: Target,
        /// Watch the status of the rollout until it's done.
        #[arg(short = 'w', long, default_value = "true", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
        watch: bool,
        /// The length of time to wait before ending watch (0: never).
        #[arg(long, default_value = "0s")]
        timeout: String,
    },
    /// View rollout history.
    History {
        #[command(flatten)]
        t: Target,
        /// See the details, including podTemplate of the revision specified.
        #[arg(long, default_value_t = 0)]
        revision: i64,
    },
    /// Undo a previous rollout.
    Undo {
        #[command(flatten)]
        t: Target,
        /// The revision to rollback to (0: the previous one).
        #[arg(long, default_value_t = 0)]
        to_revision: i64,
    },
    /// Restart a resource.
    Restart {
        #[command(flatten)]
        t: Target,
    },
    /// Mark the provided resource as paused.
    Pause {
        #[command(flatten)]
        t: Target,
    },
    /// Resume a paused resource.
    Resume {
        #[command(flatten)]
        t: Target,
    },
}

/// kubectl's deployment status line and whether the rollout is done. Pure.
pub fn deployment_status(d: &Value) -> Result<(String, bool)> {
    let name = d.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let i = |p: &str| d.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    if i("/metadata/generation") > i("/status/observedGeneration") {
        return Ok(("Waiting for deployment spec update to be observed...".into(), false));
    }
    let timed_out = d.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten().any(|c| {
        c.get("type") == Some(&json!("Progressing")) && c.get("reason") == Some(&json!("ProgressDeadlineExceeded"))
    });
    if timed_out {
        return Err(KubectlError::msg(format!("deployment {name:?} exceeded its progress deadline")));
    }
    let (spec, updated, replicas, available) = (
        d.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1),
        i("/status/updatedReplicas"),
        i("/status/replicas"),
        i("/status/availableReplicas"),
    );
    if updated < spec {
        return Ok((format!("Waiting for deployment {name:?} rollout to finish: {updated} out of {spec} new replicas have been updated..."), false));
    }
    if replicas > updated {
        return Ok((
            format!(
                "Waiting for deployment {name:?} rollout to finish: {} old replicas are pending termination...",
                replicas - updated
            ),
            false,
        ));
    }
    if available < updated {
        return Ok((format!("Waiting for deployment {name:?} rollout to finish: {available} of {updated} updated replicas are available..."), false));
    }
    Ok((format!("deployment {name:?} successfully rolled out"), true))
}

fn deployment_only(res: &ApiRes) -> Result<()> {
    if res.plural != "deployments" {
        return Err(KubectlError::msg(format!("no status viewer has been implemented for {}", res.kind)));
    }
    Ok(())
}

/// The ReplicaSets a Deployment owns, with their revisions, oldest first.
async fn revisions(ctx: &Ctx, d: &Value, ns: &str) -> Result<Vec<(i64, Value)>> {
    let uid = d.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
    let sel = super::logs::pod_selector(d).unwrap_or_default();
    let list =
        ctx.get(&with_query(&format!("/apis/apps/v1/namespaces/{ns}/replicasets"), &[("labelSelector", sel)])).await?;
    let mut out: Vec<(i64, Value)> = list
        .get("items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|rs| {
            rs.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|o| o.get("uid") == Some(&uid))
        })
        .filter_map(|rs| {
            let rev = rs
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(REVISION))
                .and_then(Value::as_str)?
                .parse()
                .ok()?;
            Some((rev, rs.clone()))
        })
        .collect();
    out.sort_by_key(|(r, _)| *r);
    Ok(out)
}

/// The history table. Pure.
pub fn history_text(id: &str, revs: &[(i64, Value)]) -> String {
    let mut s = format!("{id} \nREVISION  CHANGE-CAUSE\n");
    for (r, rs) in revs {
        let cause =
            rs.pointer("/metadata/annotations/kubernetes.io~1change-cause").and_then(Value::as_str).unwrap_or("<none>");
        s.push_str(&format!("{:<10}{cause}\n", r));
    }
    s.push('\n');
    s
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let t = match &a.cmd {
        RolloutCmd::Status { t, .. }
        | RolloutCmd::History { t, .. }
        | RolloutCmd::Undo { t, .. }
        | RolloutCmd::Restart { t }
        | RolloutCmd::Pause { t }
        | RolloutCmd::Resume { t } => t,
    };
    for (res, name) in resolve_targets(ctx, &t.args).await? {
        let path = res.object_path(ns_for(ctx, &res), &name);
        let id = format!("{}/{name}", res.kind_group());
        match &a.cmd {
            RolloutCmd::Status { watch, timeout, .. } => {
                deployment_only(&res)?;
                let timeout = super::delete::parse_duration(timeout)?;
                let start = Instant::now();
                let mut last = String::new();
                loop {
                    let d = ctx.get(&path).await?;
                    let (msg, done) = deployment_status(&d)?;
                    if msg != last {
                        println!("{msg}");
                        last = msg;
                    }
                    if done || !watch {
                        break;
                    }
                    if !timeout.is_zero() && start.elapsed() >= timeout {
                        return Err(KubectlError::msg("timed out waiting for the condition"));
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            RolloutCmd::History { revision, .. } => {
                deployment_only(&res)?;
                let d = ctx.get(&path).await?;
                let revs = revisions(ctx, &d, &ctx.namespace).await?;
                if *revision > 0 {
                    let (_, rs) = revs
                        .iter()
                        .find(|(r, _)| r == revision)
                        .ok_or_else(|| KubectlError::msg(format!("unable to find the specified revision")))?;
                    println!("{id} with revision #{revision}");
                    print!("{}", crate::print::to_yaml(rs.pointer("/spec/template").unwrap_or(&Value::Null)));
                } else if revs.is_empty() {
                    println!("{id} \nNo rollout history found.");
                } else {
                    print!("{}", history_text(&id, &revs));
                }
            }
            RolloutCmd::Undo { to_revision, .. } => {
                deployment_only(&res)?;
                let d = ctx.get(&path).await?;
                let revs = revisions(ctx, &d, &ctx.namespace).await?;
                let target = if *to_revision > 0 {
                    revs.iter().find(|(r, _)| r == to_revision).ok_or_else(|| {
                        KubectlError::msg(format!("unable to find specified revision {to_revision} in history"))
                    })?
                } else {
                    if revs.len() < 2 {
                        return Err(KubectlError::msg(format!("no rollout history found for deployment {name:?}")));
                    }
                    &revs[revs.len() - 2]
                };
                let mut template = target.1.pointer("/spec/template").cloned().unwrap_or(json!({}));
                if let Some(l) = template.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) {
                    l.remove("pod-template-hash");
                }
                let patch = json!([{"op": "replace", "path": "/spec/template", "value": template}]);
                ctx.json(Method::PATCH, &path, Some(("application/json-patch+json", patch.to_string().into_bytes())))
                    .await?;
                println!("{id} rolled back");
            }
            RolloutCmd::Restart { .. } => {
                let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
                let patch = json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": now}}}}});
                ctx.json(
                    Method::PATCH,
                    &path,
                    Some(("application/strategic-merge-patch+json", patch.to_string().into_bytes())),
                )
                .await?;
                println!("{id} restarted");
            }
            RolloutCmd::Pause { .. } | RolloutCmd::Resume { .. } => {
                let pause = matches!(a.cmd, RolloutCmd::Pause { .. });
                let d = ctx.get(&path).await?;
                let verb = if pause { "paused" } else { "resumed" };
                if d.pointer("/spec/paused").and_then(Value::as_bool).unwrap_or(false) == pause {
                    return Err(KubectlError::msg(format!(
                        "{id} is {}",
                        if pause { "already paused" } else { "not paused" }
                    )));
                }
                let patch = json!({"spec": {"paused": if pause { json!(true) } else { Value::Null }}});
                ctx.json(Method::PATCH, &path, Some(("application/merge-patch+json", patch.to_string().into_bytes())))
                    .await?;
                println!("{id} {verb}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        let mut d = json!({"metadata": {"name": "web", "generation": 2}, "spec": {"replicas": 3}, "status": {"observedGeneration": 1}});
        assert_eq!(
            deployment_status(&d).unwrap(),
            ("Waiting for deployment spec update to be observed...".into(), false)
        );
        d["status"] = json!({"observedGeneration": 2, "updatedReplicas": 1, "replicas": 3, "availableReplicas": 1});
        assert_eq!(
            deployment_status(&d).unwrap().0,
            "Waiting for deployment \"web\" rollout to finish: 1 out of 3 new replicas have been updated..."
        );
        d["status"] = json!({"observedGeneration": 2, "updatedReplicas": 3, "replicas": 4, "availableReplicas": 3});
        assert_eq!(
            deployment_status(&d).unwrap().0,
            "Waiting for deployment \"web\" rollout to finish: 1 old replicas are pending termination..."
        );
        d["status"] = json!({"observedGeneration": 2, "updatedReplicas": 3, "replicas": 3, "availableReplicas": 2});
        assert_eq!(
            deployment_status(&d).unwrap().0,
            "Waiting for deployment \"web\" rollout to finish: 2 of 3 updated replicas are available..."
        );
        d["status"] = json!({"observedGeneration": 2, "updatedReplicas": 3, "replicas": 3, "availableReplicas": 3});
        assert_eq!(deployment_status(&d).unwrap(), ("deployment \"web\" successfully rolled out".into(), true));
    }

    #[test]
    fn history() {
        let revs = vec![(1, json!({})), (2, json!({"metadata": {"annotations": {"kubernetes.io/change-cause": "x"}}}))];
        assert_eq!(
            history_text("deployment.apps/web", &revs),
            "deployment.apps/web \nREVISION  CHANGE-CAUSE\n1         <none>\n2         x\n\n"
        );
    }
}
