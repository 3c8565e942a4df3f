//! `/stats/summary`: CPU and memory per container in the shape of the kubelet's Summary
//! API (`stats/v1alpha1`), which metrics pipelines read.
//!
//! The numbers come from each container's cgroup ([`crate::cgroups`]), sampled every
//! `--housekeeping-interval` into a [`Cache`], so a summary costs no Docker call: CPU is the
//! rate between the last two samples, memory the working set. A container that has no
//! sample yet is read at once (CPU as its lifetime average), and one whose cgroup cannot
//! be read falls back to Docker's stats.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{json, Value};

use crate::cgroups::{self, Reading};
use crate::labels::Kind;
use crate::runtime::{ContainerRecord, ContainerStats, Runtime, State};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

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

/// One container's latest sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entry {
    pub reading: Reading,
    pub at: Timestamp,
    /// CPU rate over the last interval.
    pub nanocores: u64,
}

/// The CPU rate between two readings, or the lifetime average when there is no earlier one.
pub fn cpu_rate(prev: Option<&Entry>, cur_ns: u64, now: Timestamp, started: Option<Timestamp>) -> u64 {
    let (from_ns, since) = match prev {
        Some(p) if p.reading.cpu_ns <= cur_ns && p.at < now => (p.reading.cpu_ns, p.at),
        _ => match started {
            Some(t) if t < now => (0, t),
            _ => return 0,
        },
    };
    let elapsed = now.duration_since(since).as_nanos().max(1) as u128;
    ((cur_ns - from_ns) as u128 * 1_000_000_000 / elapsed) as u64
}

/// The samples of this node's running containers, by container ID.
#[derive(Default)]
pub struct Cache {
    entries: Mutex<HashMap<String, Entry>>,
}

fn started(r: &ContainerRecord) -> Option<Timestamp> {
    r.started_at.as_deref().and_then(|t| t.parse().ok())
}

impl Cache {
    /// Sample `running` now; containers no longer running are forgotten.
    pub fn refresh(&self, running: &[&ContainerRecord], now: Timestamp) {
        let readings: Vec<(String, Option<Reading>, Option<Timestamp>)> =
            running.iter().map(|r| (r.id.clone(), cgroups::read(Path::new(CGROUP_ROOT), r.pid), started(r))).collect();
        let Ok(mut entries) = self.entries.lock() else { return };
        entries.retain(|id, _| running.iter().any(|r| &r.id == id));
        for (id, reading, started) in readings {
            match reading {
                Some(reading) => {
                    let nanocores = cpu_rate(entries.get(&id), reading.cpu_ns, now, started);
                    entries.insert(id, Entry { reading, at: now, nanocores });
                }
                None => {
                    entries.remove(&id);
                }
            }
        }
    }

    /// Add one container that has no sample yet.
    fn refresh_one(&self, r: &ContainerRecord) {
        let Some(reading) = cgroups::read(Path::new(CGROUP_ROOT), r.pid) else { return };
        let now = Timestamp::now();
        let nanocores = cpu_rate(None, reading.cpu_ns, now, started(r));
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(r.id.clone(), Entry { reading, at: now, nanocores });
        }
    }

    pub fn get(&self, id: &str) -> Option<Entry> {
        self.entries.lock().ok().and_then(|e| e.get(id).copied())
    }
}

fn running_apps(records: &[ContainerRecord]) -> Vec<&ContainerRecord> {
    records.iter().filter(|r| r.state == State::Running && r.kind == Kind::App).collect()
}

/// Sample every running container each `interval` (cAdvisor's housekeeping).
pub async fn housekeeping(rt: Arc<Runtime>, cache: Arc<Cache>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match rt.list(None).await {
            Ok(records) => cache.refresh(&running_apps(&records), Timestamp::now()),
            Err(e) => tracing::debug!(error = %format!("{e:#}"), "housekeeping: listing containers failed"),
        }
    }
}

/// A container's (time, nanocores, cumulative ns, usage, working set): from the cache,
/// from a reading now, or from Docker.
async fn container_numbers(
    rt: &Runtime,
    cache: &Cache,
    r: &ContainerRecord,
) -> Option<(Timestamp, u64, u64, u64, u64)> {
    let cached = cache.get(&r.id).or_else(|| {
        cache.refresh_one(r);
        cache.get(&r.id)
    });
    if let Some(e) = cached {
        return Some((e.at, e.nanocores, e.reading.cpu_ns, e.reading.usage_bytes, e.reading.working_set_bytes));
    }
    let s = rt.stats(&r.id).await?;
    let (nano, total) = cpu(&s);
    let (usage, ws) = memory(&s);
    Some((Timestamp::now(), nano, total, usage, ws))
}

/// The Summary API document of node `node`.
pub async fn summary(rt: &Runtime, cache: &Cache, node: &str) -> anyhow::Result<Value> {
    let records = rt.list(None).await?;
    let running = running_apps(&records);
    let samples = futures::future::join_all(running.iter().map(|r| container_numbers(rt, cache, r))).await;
    let now = Timestamp::now().to_string();
    let mut pods: BTreeMap<(String, String, String), Vec<Value>> = BTreeMap::new();
    for (r, s) in running.iter().zip(samples) {
        let Some((at, nano, total, usage, ws)) = s else { continue };
        let at = at.to_string();
        pods.entry((r.pod_namespace.clone(), r.pod_name.clone(), r.pod_uid.clone())).or_default().push(json!({
            "name": r.name,
            "startTime": r.started_at,
            "cpu": {"time": at, "usageNanoCores": nano, "usageCoreNanoSeconds": total},
            "memory": {"time": at, "usageBytes": usage, "workingSetBytes": ws},
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
            "nodeName": node,
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

    #[test]
    fn cpu_rate_between_samples_or_over_the_lifetime() {
        let t = |s: i64| Timestamp::from_second(1_700_000_000 + s).unwrap();
        let prev = Entry { reading: Reading { cpu_ns: 1_000_000_000, ..Default::default() }, at: t(0), nanocores: 0 };
        // 5 s of CPU in 10 s: half a core.
        assert_eq!(cpu_rate(Some(&prev), 6_000_000_000, t(10), Some(t(-100))), 500_000_000);
        // No earlier sample: 2 s of CPU over a 4 s life.
        assert_eq!(cpu_rate(None, 2_000_000_000, t(4), Some(t(0))), 500_000_000);
        // A counter that went backwards (a restarted container with the same ID) falls back too.
        assert_eq!(cpu_rate(Some(&prev), 500_000_000, t(10), Some(t(9))), 500_000_000);
        assert_eq!(cpu_rate(None, 1, t(4), None), 0);
    }
}
