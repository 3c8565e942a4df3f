//! `/stats/summary`: CPU and memory per container in the shape of the kubelet's Summary
//! API (`stats/v1alpha1`), which metrics pipelines read.
//!
//! The numbers come from each container's cgroup ([`crate::cgroups`]), sampled every
//! `--housekeeping-interval` into a [`Cache`], so a summary costs no Docker call: CPU is the
//! rate between the last two samples, memory the working set. A container that has no
//! sample yet is read at once (CPU as its lifetime average), and one whose cgroup cannot
//! be read falls back to Docker's stats.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{json, Value};

use crate::cgroups::{self, Reading};
use crate::fsusage;
use crate::labels::Kind;
use crate::netstats::{self, Interface};
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

/// How often a container's writable layer is measured (a directory walk, not a counter).
const FS_INTERVAL: Duration = Duration::from_secs(60);

/// The filesystem usage of one container's writable layer.
#[derive(Clone, Debug, PartialEq)]
pub struct FsUsage {
    pub device: String,
    pub bytes: u64,
    pub at: Timestamp,
}

/// A pod's network counters, read through its sandbox.
#[derive(Clone, Debug, PartialEq)]
pub struct Network {
    pub interfaces: Vec<Interface>,
    pub at: Timestamp,
}

/// The samples of this node's running containers, by container ID.
#[derive(Default)]
pub struct Cache {
    entries: Mutex<HashMap<String, Entry>>,
    /// By container ID: the cgroup name (cAdvisor's `id` label), read once.
    cgroups: Mutex<HashMap<String, String>>,
    fs: Mutex<HashMap<String, FsUsage>>,
    /// By sandbox container ID.
    network: Mutex<HashMap<String, Network>>,
    /// The running containers and sandboxes housekeeping last listed: the Prometheus
    /// endpoints render these, so a scrape makes no Docker call.
    running: Mutex<Option<Arc<Vec<ContainerRecord>>>>,
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

    /// Sample what only the Prometheus endpoints report: the running sandboxes' network
    /// counters, each running container's cgroup name (once) and, at most every
    /// [`FS_INTERVAL`], its writable layer's size.
    pub fn refresh_extra(&self, running: &[&ContainerRecord], sandboxes: &[&ContainerRecord], now: Timestamp) {
        let network: HashMap<String, Network> =
            sandboxes.iter().map(|r| (r.id.clone(), Network { interfaces: netstats::read(r.pid), at: now })).collect();
        if let Ok(mut n) = self.network.lock() {
            *n = network;
        }
        if let Ok(mut names) = self.cgroups.lock() {
            let live: HashSet<&str> = running.iter().chain(sandboxes).map(|r| r.id.as_str()).collect();
            names.retain(|id, _| live.contains(id.as_str()));
            for r in running.iter().chain(sandboxes) {
                if !names.contains_key(&r.id) {
                    if let Some(name) = cgroups::name_of(r.pid) {
                        names.insert(r.id.clone(), name);
                    }
                }
            }
        }
        let due: Vec<&ContainerRecord> = {
            let Ok(mut fs) = self.fs.lock() else { return };
            let live: HashSet<&str> = running.iter().map(|r| r.id.as_str()).collect();
            fs.retain(|id, _| live.contains(id.as_str()));
            running
                .iter()
                .filter(|r| r.upper_dir.is_some())
                .filter(|r| {
                    fs.get(&r.id).is_none_or(|u| now.duration_since(u.at).as_secs_f64() >= FS_INTERVAL.as_secs_f64())
                })
                .copied()
                .collect()
        };
        if due.is_empty() {
            return;
        }
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let measured: Vec<(String, FsUsage)> = due
            .iter()
            .filter_map(|r| {
                let dir = r.upper_dir.as_deref()?;
                let device = fsusage::device_of(&mounts, dir).unwrap_or_default();
                Some((r.id.clone(), FsUsage { device, bytes: fsusage::disk_usage(Path::new(dir)), at: now }))
            })
            .collect();
        if let Ok(mut fs) = self.fs.lock() {
            fs.extend(measured);
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

    pub fn cgroup(&self, id: &str) -> Option<String> {
        self.cgroups.lock().ok().and_then(|e| e.get(id).cloned())
    }

    pub fn fs(&self, id: &str) -> Option<FsUsage> {
        self.fs.lock().ok().and_then(|e| e.get(id).cloned())
    }

    pub fn network(&self, sandbox_id: &str) -> Option<Network> {
        self.network.lock().ok().and_then(|e| e.get(sandbox_id).cloned())
    }
}

fn running_apps(records: &[ContainerRecord]) -> Vec<&ContainerRecord> {
    records.iter().filter(|r| r.state == State::Running && r.kind == Kind::App).collect()
}

fn running_sandboxes(records: &[ContainerRecord]) -> Vec<&ContainerRecord> {
    records.iter().filter(|r| r.state == State::Running && r.kind == Kind::Sandbox).collect()
}

/// Sample every running container each `interval` (cAdvisor's housekeeping). The file
/// reads run on the blocking pool.
pub async fn housekeeping(rt: Arc<Runtime>, cache: Arc<Cache>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match rt.list(None).await {
            Ok(records) => {
                let cache = cache.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    let now = Timestamp::now();
                    let (apps, sandboxes) = (running_apps(&records), running_sandboxes(&records));
                    cache.refresh(&apps, now);
                    cache.refresh_extra(&apps, &sandboxes, now);
                    let running: Vec<ContainerRecord> =
                        records.iter().filter(|r| r.state == State::Running).cloned().collect();
                    if let Ok(mut r) = cache.running.lock() {
                        *r = Some(Arc::new(running));
                    }
                })
                .await;
            }
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
    let n = node_reading();
    Ok(json!({
        "node": {
            "nodeName": node,
            "memory": {"time": now, "availableBytes": n.memory_available, "usageBytes": n.working_set_bytes(), "workingSetBytes": n.working_set_bytes()},
        },
        "pods": pods,
    }))
}

/// The node's own CPU and memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeReading {
    /// CPU time every process of the machine used (not idle, not waiting), nanoseconds.
    pub cpu_ns: u64,
    pub memory_total: u64,
    pub memory_available: u64,
    pub at: Timestamp,
}

impl NodeReading {
    /// Memory in use: what is not available (the summary's and `kubectl top node`'s number).
    pub fn working_set_bytes(&self) -> u64 {
        self.memory_total.saturating_sub(self.memory_available)
    }
}

/// The busy CPU time of the first line of `/proc/stat` (user, nice, system, irq, softirq,
/// steal; in `USER_HZ` ticks), in nanoseconds.
pub fn proc_stat_busy_ns(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    Some((at(0) + at(1) + at(2) + at(5) + at(6) + at(7)) * 10_000_000)
}

/// A `/proc/meminfo` field in bytes.
pub fn meminfo_bytes(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.split(':').next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

pub fn node_reading() -> NodeReading {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    NodeReading {
        cpu_ns: proc_stat_busy_ns(&stat).unwrap_or(0),
        memory_total: meminfo_bytes(&meminfo, "MemTotal"),
        memory_available: meminfo_bytes(&meminfo, "MemAvailable"),
        at: Timestamp::now(),
    }
}

/// One running container as the Prometheus endpoints report it.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerSample {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub image: String,
    /// Docker's name of the container.
    pub name: String,
    /// The cgroup name.
    pub id: String,
    pub reading: Reading,
    pub at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub fs: Option<FsUsage>,
}

/// One running pod's sandbox and its network counters.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSample {
    pub namespace: String,
    pub pod: String,
    pub image: String,
    pub name: String,
    pub id: String,
    pub network: Network,
}

/// The running containers and pods of this node with their latest samples, sorted by
/// namespace, pod and container: those housekeeping last listed (before its first pass,
/// Docker's list now). A container whose cgroup cannot be read is left out.
pub async fn samples(rt: &Runtime, cache: &Cache) -> anyhow::Result<(Vec<ContainerSample>, Vec<PodSample>)> {
    let listed = cache.running.lock().ok().and_then(|r| r.clone());
    let records = match listed {
        Some(r) => r,
        None => Arc::new(rt.list(None).await?),
    };
    let mut containers: Vec<ContainerSample> = running_apps(&records)
        .into_iter()
        .filter_map(|r| {
            let e = cache.get(&r.id).or_else(|| {
                cache.refresh_one(r);
                cache.get(&r.id)
            })?;
            Some(ContainerSample {
                namespace: r.pod_namespace.clone(),
                pod: r.pod_name.clone(),
                container: r.name.clone(),
                image: r.image.clone(),
                name: r.docker_name.clone(),
                id: cache.cgroup(&r.id).or_else(|| cgroups::name_of(r.pid)).unwrap_or_default(),
                reading: e.reading,
                at: e.at,
                started_at: started(r),
                fs: cache.fs(&r.id),
            })
        })
        .collect();
    containers.sort_by(|a, b| (&a.namespace, &a.pod, &a.container).cmp(&(&b.namespace, &b.pod, &b.container)));
    let mut pods: Vec<PodSample> = running_sandboxes(&records)
        .into_iter()
        .map(|r| PodSample {
            namespace: r.pod_namespace.clone(),
            pod: r.pod_name.clone(),
            image: r.image.clone(),
            name: r.docker_name.clone(),
            id: cache.cgroup(&r.id).or_else(|| cgroups::name_of(r.pid)).unwrap_or_default(),
            network: cache
                .network(&r.id)
                .unwrap_or_else(|| Network { interfaces: netstats::read(r.pid), at: Timestamp::now() }),
        })
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    Ok((containers, pods))
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
    fn node_cpu_and_memory_from_proc() {
        let stat = "cpu  100 5 50 1000 7 3 2 1 0 0\ncpu0 50 2 25 500 3 1 1 0 0 0\n";
        // (100 + 5 + 50 + 3 + 2 + 1) ticks of 10 ms.
        assert_eq!(proc_stat_busy_ns(stat), Some(1_610_000_000));
        assert_eq!(proc_stat_busy_ns("intr 1 2\n"), None);
        let meminfo = "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "MemTotal"), 24_000_000 * 1024);
        assert_eq!(meminfo_bytes(meminfo, "MemAvailable"), 20_000_000 * 1024);
        assert_eq!(meminfo_bytes(meminfo, "Mem"), 0);
        let n = node_reading();
        assert!(n.cpu_ns > 0 && n.memory_total > n.working_set_bytes());
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
