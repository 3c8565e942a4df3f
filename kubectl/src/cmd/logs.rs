//! `kubectl logs POD|TYPE/NAME [-c C] [-f] [--tail N] [--previous]` over `pods/log`.

use futures::AsyncReadExt;
use serde_json::Value;

use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};

/// Print the logs for a container in a pod.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// POD or TYPE/NAME, then an optional container name.
    pub args: Vec<String>,
    /// Print the logs of this container.
    #[arg(short = 'c', long)]
    pub container: Option<String>,
    /// Specify if the logs should be streamed.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Lines of recent log file to display (-1: all).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub tail: i64,
    /// Print the logs for the previous instance of the container.
    #[arg(short = 'p', long)]
    pub previous: bool,
    /// Include timestamps on each line.
    #[arg(long)]
    pub timestamps: bool,
    /// Only return logs newer than a relative duration like 5s, 2m, or 3h.
    #[arg(long)]
    pub since: Option<String>,
    /// Get all containers' logs in the pod(s).
    #[arg(long)]
    pub all_containers: bool,
    /// Maximum bytes of logs to return. Defaults to no limit.
    #[arg(long, default_value_t = 0)]
    pub limit_bytes: i64,
}

/// The label selector that finds the pods of a workload object. Pure.
pub fn pod_selector(obj: &Value) -> Option<String> {
    let labels = obj
        .pointer("/spec/selector/matchLabels")
        .or_else(|| obj.pointer("/spec/selector"))
        .and_then(Value::as_object)?;
    let mut kv: Vec<String> = labels.iter().filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}"))).collect();
    kv.sort();
    (!kv.is_empty()).then(|| kv.join(","))
}

/// The pod of a workload that `logs`, `exec`, `attach` and `port-forward` use, as kubectl
/// chooses it (the first of its pods sorted by `ActivePods`, most active first): scheduled
/// before unscheduled, Running before Unknown before Pending (and the rest), ready before
/// not ready, ready the longest, fewest restarts, oldest. Pure.
pub fn pick_pod(pods: &[Value]) -> Option<&Value> {
    fn ready_since(p: &Value) -> Option<&str> {
        p.pointer("/status/conditions")
            .and_then(Value::as_array)?
            .iter()
            .find(|c| c["type"] == "Ready" && c["status"] == "True")
            .map(|c| c.get("lastTransitionTime").and_then(Value::as_str).unwrap_or_default())
    }
    let restarts = |p: &Value| {
        ["/status/containerStatuses", "/status/initContainerStatuses"]
            .iter()
            .flat_map(|f| p.pointer(f).and_then(Value::as_array).into_iter().flatten())
            .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
            .max()
            .unwrap_or(0)
    };
    // Greater is more active. RFC 3339 times of one format compare as text; an empty
    // time counts as the newest.
    let rank = |p: &Value| {
        let scheduled = p.pointer("/spec/nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
        let phase = match p.pointer("/status/phase").and_then(Value::as_str) {
            Some("Running") => 2,
            Some("Unknown") => 1,
            _ => 0,
        };
        let ready = ready_since(p);
        let older =
            |t: &str| if t.is_empty() { std::cmp::Reverse("~".to_string()) } else { std::cmp::Reverse(t.to_string()) };
        let created = p.pointer("/metadata/creationTimestamp").and_then(Value::as_str).unwrap_or_default();
        (
            scheduled,
            phase,
            ready.is_some(),
            older(ready.unwrap_or_default()),
            std::cmp::Reverse(restarts(p)),
            older(created),
        )
    };
    // The first of the most active (a stable choice among equals, as kubectl's sort).
    pods.iter().rev().max_by(|a, b| rank(a).cmp(&rank(b)))
}

/// kubectl's client-side check that a pod has the named (init, ephemeral) container. Pure.
pub fn check_container(pod: &Value, pod_name: &str, container: &str) -> Result<()> {
    let found = ["/spec/containers", "/spec/initContainers", "/spec/ephemeralContainers"].iter().any(|p| {
        pod.pointer(p)
            .and_then(Value::as_array)
            .is_some_and(|cs| cs.iter().any(|c| c.get("name").and_then(Value::as_str) == Some(container)))
    });
    if found {
        Ok(())
    } else {
        Err(KubectlError::msg(format!("container {container} is not valid for pod {pod_name}")))
    }
}

/// The log query for the flags. Pure.
pub fn log_path(ns: &str, pod: &str, container: Option<&str>, a: &Args) -> Result<String> {
    let since = match &a.since {
        Some(s) => super::delete::parse_duration(s)?.as_secs().to_string(),
        None => String::new(),
    };
    Ok(with_query(
        &format!("/api/v1/namespaces/{ns}/pods/{pod}/log"),
        &[
            ("container", container.unwrap_or_default().to_string()),
            ("follow", if a.follow { "true".into() } else { String::new() }),
            ("tailLines", if a.tail >= 0 { a.tail.to_string() } else { String::new() }),
            ("previous", if a.previous { "true".into() } else { String::new() }),
            ("timestamps", if a.timestamps { "true".into() } else { String::new() }),
            ("sinceSeconds", since),
            ("limitBytes", if a.limit_bytes > 0 { a.limit_bytes.to_string() } else { String::new() }),
        ],
    ))
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let Some(target) = a.args.first() else {
        return Err(KubectlError::msg("expected POD or TYPE/NAME is a required argument for the logs command"));
    };
    let ns = ctx.namespace.clone();
    let pod = match target.split_once('/') {
        None => target.clone(),
        Some((t, n)) => {
            let res = ctx.resolve(t).await?;
            if res.plural == "pods" {
                n.to_string()
            } else {
                let obj = ctx.get(&res.object_path(Some(&ns), n)).await?;
                let sel =
                    pod_selector(&obj).ok_or_else(|| KubectlError::msg(format!("cannot find the pods of {t}/{n}")))?;
                let pods =
                    ctx.get(&with_query(&format!("/api/v1/namespaces/{ns}/pods"), &[("labelSelector", sel)])).await?;
                let items = pods.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
                pick_pod(&items)
                    .and_then(|p| p.pointer("/metadata/name"))
                    .and_then(Value::as_str)
                    .map(String::from)
                    .ok_or_else(|| KubectlError::msg(format!("no pods found for {t}/{n}")))?
            }
        }
    };
    let container = a.container.clone().or_else(|| a.args.get(1).cloned());
    // As kubectl: the pod is read first (its words for a missing pod), and a named
    // container is checked against it before asking for logs.
    let p = ctx.get(&format!("/api/v1/namespaces/{ns}/pods/{pod}")).await.map_err(|e| {
        if e.is_not_found() {
            KubectlError::msg(format!("error from server (NotFound): pods \"{pod}\" not found in namespace \"{ns}\""))
        } else {
            e
        }
    })?;
    if let Some(c) = &container {
        check_container(&p, &pod, c)?;
    }
    let containers: Vec<Option<String>> = if a.all_containers {
        let p = ctx.get(&format!("/api/v1/namespaces/{ns}/pods/{pod}")).await?;
        p.pointer("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(|s| Some(s.to_string())))
            .collect()
    } else {
        vec![container]
    };
    for c in containers {
        let path = log_path(&ns, &pod, c.as_deref(), a)?;
        let mut stream = ctx.stream(&path).await?;
        let mut buf = vec![0u8; 8192];
        use std::io::Write;
        let mut out = std::io::stdout();
        loop {
            let n = stream.read(&mut buf).await.map_err(|e| KubectlError::msg(format!("reading logs: {e}")))?;
            if n == 0 {
                break;
            }
            let _ = out.write_all(&buf[..n]);
            let _ = out.flush();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_active_pod_is_chosen_as_kubectl_chooses_it() {
        let p = |name: &str, node: &str, phase: &str, ready: Option<&str>, restarts: i64, created: &str| {
            let conditions = match ready {
                Some(t) => json!([{"type": "Ready", "status": "True", "lastTransitionTime": t}]),
                None => json!([{"type": "Ready", "status": "False"}]),
            };
            json!({"metadata": {"name": name, "creationTimestamp": created}, "spec": {"nodeName": node},
                   "status": {"phase": phase, "conditions": conditions, "containerStatuses": [{"restartCount": restarts}]}})
        };
        let t = |d: u8| format!("2024-01-0{d}T00:00:00Z");
        let pick =
            |pods: &[Value]| pick_pod(pods).map(|p| p["metadata"]["name"].as_str().unwrap_or_default().to_string());
        let pending = p("pending", "n1", "Pending", None, 0, &t(1));
        let running = p("running", "n1", "Running", None, 0, &t(1));
        let ready_new = p("ready-new", "n1", "Running", Some(&t(5)), 0, &t(1));
        let ready_old = p("ready-old", "n1", "Running", Some(&t(3)), 0, &t(2));
        let restarted = p("restarted", "n1", "Running", Some(&t(3)), 4, &t(1));
        let unscheduled = p("unscheduled", "", "Running", Some(&t(1)), 0, &t(1));
        assert_eq!(pick(&[pending.clone(), running.clone()]).as_deref(), Some("running"));
        assert_eq!(pick(&[running.clone(), ready_new.clone()]).as_deref(), Some("ready-new"));
        assert_eq!(pick(&[ready_new.clone(), ready_old.clone()]).as_deref(), Some("ready-old"), "ready the longest");
        assert_eq!(pick(&[restarted, ready_old.clone()]).as_deref(), Some("ready-old"), "fewer restarts");
        assert_eq!(pick(&[unscheduled, pending]).as_deref(), Some("pending"), "scheduled first");
        let twin = p("twin", "n1", "Running", Some(&t(3)), 0, &t(2));
        assert_eq!(pick(&[ready_old, twin]).as_deref(), Some("ready-old"), "the first of equals");
        assert!(pick_pod(&[]).is_none());
    }
    use serde_json::json;

    #[test]
    fn unknown_containers_are_refused() {
        let p = json!({"spec": {"containers": [{"name": "a"}], "initContainers": [{"name": "i"}]}});
        assert!(check_container(&p, "p", "a").is_ok() && check_container(&p, "p", "i").is_ok());
        assert_eq!(check_container(&p, "p", "x").unwrap_err().to_string(), "error: container x is not valid for pod p");
    }

    #[test]
    fn selectors_and_paths() {
        let d = json!({"spec": {"selector": {"matchLabels": {"b": "2", "a": "1"}}}});
        assert_eq!(pod_selector(&d).as_deref(), Some("a=1,b=2"));
        let a = Args {
            args: vec![],
            container: None,
            follow: true,
            tail: 10,
            previous: false,
            timestamps: false,
            since: None,
            all_containers: false,
            limit_bytes: 0,
        };
        assert_eq!(
            log_path("ns", "p", Some("c"), &a).unwrap(),
            "/api/v1/namespaces/ns/pods/p/log?container=c&follow=true&tailLines=10"
        );
    }
}
