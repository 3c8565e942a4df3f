//! `/stats/summary`: CPU and memory per container from Docker's stats, in the shape of the
//! kubelet's Summary API (`stats/v1alpha1`), which metrics pipelines read.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::kubelet::Kubelet;
use crate::labels::Kind;
use crate::runtime::{ContainerStats, State};

/// CPU in nanocores between Docker's two samples, and cumulative core-nanoseconds.
pub fn cpu(s: &ContainerStats) -> (u64, u64) {
    let cur = s.cpu_stats.clone().unwrap_or_default();
    let pre = s.precpu_stats.clone().unwrap_or_default();
    let total = cur.cpu_usage.as_ref().and_then(|u| u.total_usage).unwrap_or(0);
    let pre_total = pre.cpu_usage.as_ref().and_then(|u| u.total_usage).unwrap_or(0);
    let sys = cur.system_cpu_usage.unwrap_or(0).saturating_sub(pre.system_cpu_usage.unwrap_or(0));
    let online = cur.online_cpus.unwrap_or(1).max(1) as u128;
    let nano = if sys == 0 || pre_total == 0 {
        0
    } else {
        (total.saturating_sub(pre_total) as u128 * 1_000_000_000 * online / sys as u128) as u64
    };
    (nano, total)
}

/// (usage, working set) bytes: working set = usage − inactive file pages.
pub fn memory(s: &ContainerStats) -> (u64, u64) {
    let m = s.memory_stats.clone().unwrap_or_default();
    let usage = m.usage.unwrap_or(0);
    let inactive = m
        .stats
        .as_ref()
        .and_then(|st| st.get("inactive_file").or_else(|| st.get("total_inactive_file")).copied())
        .unwrap_or(0);
    (usage, usage.saturating_sub(inactive))
}

pub async fn summary(k: &Kubelet) -> anyhow::Result<Value> {
    let records = k.rt.list(None).await?;
    let running: Vec<_> = records.into_iter().filter(|r| r.state == State::Running && r.kind == Kind::App).collect();
    let samples = futures::future::join_all(running.iter().map(|r| k.rt.stats(&r.id))).await;
    let now = jiff::Timestamp::now().to_string();
    let mut pods: BTreeMap<(String, String, String), Vec<Value>> = BTreeMap::new();
    for (r, s) in running.iter().zip(samples) {
        let Some(s) = s else { continue };
        let (nano, total) = cpu(&s);
        let (usage, ws) = memory(&s);
        pods.entry((r.pod_namespace.clone(), r.pod_name.clone(), r.pod_uid.clone())).or_default().push(json!({
            "name": r.name,
            "startTime": r.started_at,
            "cpu": {"time": now, "usageNanoCores": nano, "usageCoreNanoSeconds": total},
            "memory": {"time": now, "usageBytes": usage, "workingSetBytes": ws},
        }));
    }
    let pods: Vec<Value> = pods
        .into_iter()
        .map(|((ns, name, uid), containers)| {
            let nano: u64 = containers.iter().filter_map(|c| c["cpu"]["usageNanoCores"].as_u64()).sum();
            let ws: u64 = containers.iter().filter_map(|c| c["memory"]["workingSetBytes"].as_u64()).sum();
            json!({
                "podRef": {"name": name, "namespace": ns, "uid": uid},
                "containers": containers,
                "cpu": {"time": now, "usageNanoCores": nano},
                "memory": {"time": now, "workingSetBytes": ws},
            })
        })
        .collect();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let (total, avail) = (field("MemTotal:"), field("MemAvailable:"));
    Ok(json!({
        "node": {
            "nodeName": k.node,
            "memory": {"time": now, "availableBytes": avail, "usageBytes": total - avail.min(total), "workingSetBytes": total - avail.min(total)},
        },
        "pods": pods,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cpu_and_memory_from_docker_stats() {
        let s: ContainerStats = serde_json::from_value(json!({
            "cpu_stats": {"cpu_usage": {"total_usage": 3_000_000_000u64}, "system_cpu_usage": 20_000_000_000u64, "online_cpus": 2},
            "precpu_stats": {"cpu_usage": {"total_usage": 2_500_000_000u64}, "system_cpu_usage": 18_000_000_000u64},
            "memory_stats": {"usage": 1000, "stats": {"inactive_file": 300}}
        }))
        .unwrap();
        // 0.5 s of CPU over 1 s of wall time (2 s of system time on 2 CPUs): half a core.
        assert_eq!(cpu(&s), (500_000_000, 3_000_000_000));
        assert_eq!(memory(&s), (1000, 700));
    }
}
