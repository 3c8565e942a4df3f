//! `kubectl cordon|uncordon|drain NODE`.

use http::Method;
use serde_json::{json, Value};

use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};

/// Mark node as (un)schedulable.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Node names.
    pub nodes: Vec<String>,
    /// Must be "none", "server", or "client".
    #[arg(long, default_value = "none", num_args = 0..=1, default_missing_value = "client")]
    pub dry_run: String,
}

/// Drain node in preparation for maintenance.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// Node name.
    pub node: String,
    /// Ignore DaemonSet-managed pods.
    #[arg(long)]
    pub ignore_daemonsets: bool,
    /// Continue even if there are pods that do not declare a controller.
    #[arg(long)]
    pub force: bool,
    /// Continue even if there are pods using emptyDir (local data that will be deleted when the node is drained).
    #[arg(long)]
    pub delete_emptydir_data: bool,
    /// Period of time in seconds given to each pod to terminate gracefully (-1: the pod's).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub grace_period: i64,
    /// The length of time to wait before giving up (0: no limit).
    #[arg(long, default_value = "0s")]
    pub timeout: String,
    /// Label selector to filter pods on the node.
    #[arg(long)]
    pub pod_selector: Option<String>,
}

/// Set `spec.unschedulable`; prints `node/N cordoned` / `already cordoned` like kubectl.
pub async fn set_unschedulable(ctx: &Ctx, node: &str, on: bool, dry: bool) -> Result<()> {
    let path = format!("/api/v1/nodes/{node}");
    let cur = ctx.get(&path).await?;
    let verb = if on { "cordoned" } else { "uncordoned" };
    if cur.pointer("/spec/unschedulable").and_then(Value::as_bool).unwrap_or(false) == on {
        println!("node/{node} already {verb}");
        return Ok(());
    }
    if !dry {
        let body = json!({"spec": {"unschedulable": if on { json!(true) } else { Value::Null }}});
        ctx.json(Method::PATCH, &path, Some(("application/strategic-merge-patch+json", body.to_string().into_bytes())))
            .await?;
    }
    println!("node/{node} {verb}{}", if dry { " (dry run)" } else { "" });
    Ok(())
}

pub async fn cordon(ctx: &Ctx, a: &Args, on: bool) -> Result<()> {
    if a.nodes.is_empty() {
        return Err(KubectlError::msg("resource(s) were provided, but no name was specified"));
    }
    for n in &a.nodes {
        set_unschedulable(ctx, n, on, a.dry_run == "client").await?;
    }
    Ok(())
}

/// Why a pod blocks a drain (None: evict it; Some(Ok) skip it with a warning). Pure.
pub fn drain_filter(pod: &Value, a: &DrainArgs) -> Option<std::result::Result<String, String>> {
    let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let owners = pod.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default();
    let controller = owners.iter().find(|o| o.get("controller").and_then(Value::as_bool) == Some(true));
    if pod.pointer("/metadata/annotations/kubernetes.io~1config.mirror").is_some() {
        return Some(Ok(format!("{ns}/{name}")));
    }
    if controller.and_then(|c| c.get("kind")).and_then(Value::as_str) == Some("DaemonSet") {
        return Some(if a.ignore_daemonsets {
            Ok(format!("{ns}/{name}"))
        } else {
            Err(format!("cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore): {ns}/{name}"))
        });
    }
    if controller.is_none() && !a.force {
        return Some(Err(format!(
            "cannot delete Pods that declare no controller (use --force to override): {ns}/{name}"
        )));
    }
    let empty_dir = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|v| v.get("emptyDir").is_some());
    if empty_dir && !a.delete_emptydir_data {
        return Some(Err(format!(
            "cannot delete Pods with local storage (use --delete-emptydir-data to override): {ns}/{name}"
        )));
    }
    None
}

/// kubectl's aggregate of the pods a drain refuses: one `cannot delete <reason>: <pods>`
/// per reason (its reasons already start with "cannot delete", so the words repeat, as
/// kubectl prints them), several in brackets. Pure.
pub fn drain_errors(errors: &[String]) -> String {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for e in errors {
        let (reason, pod) = e.rsplit_once(": ").unwrap_or((e.as_str(), ""));
        match groups.iter_mut().find(|(r, _)| r == reason) {
            Some((_, pods)) => pods.push(pod.to_string()),
            None => groups.push((reason.to_string(), vec![pod.to_string()])),
        }
    }
    let msgs: Vec<String> = groups.iter().map(|(r, pods)| format!("cannot delete {r}: {}", pods.join(", "))).collect();
    if msgs.len() == 1 {
        msgs[0].clone()
    } else {
        format!("[{}]", msgs.join(", "))
    }
}

/// How long `drain` waits before evicting a pod again that a disruption budget protects.
const EVICTION_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

pub async fn drain(ctx: &Ctx, a: &DrainArgs) -> Result<()> {
    set_unschedulable(ctx, &a.node, true, false).await?;
    let pods = ctx
        .get(&with_query(
            "/api/v1/pods",
            &[
                ("fieldSelector", format!("spec.nodeName={}", a.node)),
                ("labelSelector", a.pod_selector.clone().unwrap_or_default()),
            ],
        ))
        .await?;
    let items = pods.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut errors = Vec::new();
    let mut ignored = Vec::new();
    let mut evict = Vec::new();
    for p in &items {
        match drain_filter(p, a) {
            None => evict.push(p.clone()),
            Some(Ok(s)) => ignored.push(s),
            Some(Err(e)) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        let agg = drain_errors(&errors);
        eprintln!("error: unable to drain node {:?} due to error: {agg}, continuing command...", a.node);
        eprintln!("There are pending nodes to be drained:\n {}", a.node);
        eprintln!("{agg}");
        return Err(KubectlError::Reported);
    }
    // With --force, kubectl names the pods without a controller it is about to delete.
    let unmanaged: Vec<String> = evict
        .iter()
        .filter(|p| {
            !p.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|os| os.iter().any(|o| o.get("controller").and_then(Value::as_bool) == Some(true)))
        })
        .map(|p| {
            format!(
                "{}/{}",
                p.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default(),
                p.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
            )
        })
        .collect();
    // One warning line, its parts joined by "; ", as kubectl prints it.
    let mut warnings = Vec::new();
    if !ignored.is_empty() {
        warnings.push(format!("ignoring DaemonSet-managed Pods: {}", ignored.join(", ")));
    }
    if !unmanaged.is_empty() {
        warnings.push(format!("deleting Pods that declare no controller: {}", unmanaged.join(", ")));
    }
    if !warnings.is_empty() {
        eprintln!("Warning: {}", warnings.join("; "));
    }
    let timeout = super::delete::parse_duration(&a.timeout)?;
    let timeout = (!timeout.is_zero()).then_some(timeout);
    for p in &evict {
        let ns = p.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
        let name = p.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        println!("evicting pod {ns}/{name}");
        let mut body =
            json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}});
        if a.grace_period >= 0 {
            body["deleteOptions"] = json!({"gracePeriodSeconds": a.grace_period});
        }
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
        // A disruption budget that allows nothing now answers 429: kubectl retries every 5 s
        // until --timeout, saying so each time.
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let eviction = body.to_string().into_bytes();
            match ctx.json(Method::POST, &format!("{path}/eviction"), Some(("application/json", eviction))).await {
                Ok(_) => break,
                Err(KubectlError::Api { code: 429, message, .. }) => {
                    eprintln!("error when evicting pods/{name:?} -n {ns:?} (will retry after 5s): {message}");
                    if deadline.is_some_and(|d| std::time::Instant::now() + EVICTION_RETRY > d) {
                        return Err(KubectlError::msg(format!(
                            "error when evicting pods/{name:?} -n {ns:?}: global timeout reached: {}",
                            a.timeout
                        )));
                    }
                    tokio::time::sleep(EVICTION_RETRY).await;
                }
                Err(e) => return Err(e),
            }
        }
        super::delete::wait_gone(ctx, &path, timeout).await?;
        println!("pod/{name} evicted");
    }
    println!("node/{} drained", a.node);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_errors_group_by_reason() {
        let one = "cannot delete Pods that declare no controller (use --force to override)";
        assert_eq!(
            drain_errors(&[format!("{one}: default/a"), format!("{one}: default/b")]),
            format!("cannot delete {one}: default/a, default/b")
        );
        let two = "cannot delete Pods with local storage (use --delete-emptydir-data to override)";
        assert_eq!(
            drain_errors(&[format!("{one}: default/a"), format!("{two}: default/c")]),
            format!("[cannot delete {one}: default/a, cannot delete {two}: default/c]")
        );
    }
}
