//! A container's CPU and memory counters read straight from its cgroup, as cAdvisor
//! does: the cgroup comes from `/proc/<pid>/cgroup` of the container's main process, so
//! it works with either Docker cgroup driver and with cgroup v1 or v2. Reading three small
//! files is far cheaper than Docker's stats call (which samples for a second per container).
//!
//! The parsing is pure; [`read`] does the file I/O.

use std::path::{Path, PathBuf};

/// Where a process's counters live.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Paths {
    /// The v2 (unified) path, from the `0::/…` line.
    pub unified: Option<String>,
    /// The v1 `cpuacct` hierarchy's path (mounted as `cpu,cpuacct` or `cpuacct`).
    pub cpuacct: Option<String>,
    /// The v1 `memory` hierarchy's path.
    pub memory: Option<String>,
}

/// Parse `/proc/<pid>/cgroup`.
pub fn parse_proc_cgroup(text: &str) -> Paths {
    let mut p = Paths::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if controllers.is_empty() {
            p.unified = Some(path.to_string());
        }
        for c in controllers.split(',') {
            match c {
                "cpuacct" => p.cpuacct = Some(path.to_string()),
                "memory" => p.memory = Some(path.to_string()),
                _ => {}
            }
        }
    }
    p
}

/// One reading of a cgroup's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    /// Cumulative CPU time, nanoseconds.
    pub cpu_ns: u64,
    /// Cumulative CPU time in user and in kernel mode, nanoseconds.
    pub cpu_user_ns: u64,
    pub cpu_system_ns: u64,
    pub usage_bytes: u64,
    /// Usage minus inactive file pages (what Kubernetes reports and evicts on).
    pub working_set_bytes: u64,
    /// Anonymous memory (v1 `total_rss`, v2 `anon`) and page cache (`total_cache`, `file`).
    pub rss_bytes: u64,
    pub cache_bytes: u64,
    /// The memory limit; 0 when there is none (cAdvisor's convention).
    pub limit_bytes: u64,
}

/// The kernel's clock ticks per second, the unit of v1's `cpuacct.stat` (`USER_HZ`,
/// 100 on every Linux architecture Docker runs on).
const USER_HZ: u64 = 100;

/// A memory limit file's value as a limit: `max` (v2) and the v1 "unlimited" value (the
/// largest page-aligned 63-bit number) are no limit.
pub fn limit(text: &str) -> u64 {
    match text.trim().parse::<u64>() {
        Ok(v) if v < (1 << 62) => v,
        _ => 0,
    }
}

/// The parts of a reading that come from `memory.stat`.
fn memory_parts(usage: u64, stat: &str) -> (u64, u64, u64) {
    let rss = stat_field(stat, "total_rss").or_else(|| stat_field(stat, "anon")).unwrap_or(0);
    let cache = stat_field(stat, "total_cache").or_else(|| stat_field(stat, "file")).unwrap_or(0);
    (working_set(usage, stat), rss, cache)
}

/// A `key value` line of `memory.stat` / `cpu.stat`.
pub fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The working set from usage and `memory.stat` (v1: `total_inactive_file`, v2: `inactive_file`).
pub fn working_set(usage: u64, memory_stat: &str) -> u64 {
    let inactive = stat_field(memory_stat, "total_inactive_file").or_else(|| stat_field(memory_stat, "inactive_file"));
    usage.saturating_sub(inactive.unwrap_or(0))
}

fn read_u64(path: PathBuf) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn under(root: &Path, rel: &str) -> PathBuf {
    root.join(rel.trim_start_matches('/'))
}

/// Read the counters of process `pid` under the cgroup filesystem at `root`
/// (`/sys/fs/cgroup`): v1 hierarchies when they hold the process, else v2.
pub fn read(root: &Path, pid: i64) -> Option<Reading> {
    if pid <= 0 {
        return None;
    }
    let paths = parse_proc_cgroup(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?);
    if let (Some(cpu), Some(mem)) = (&paths.cpuacct, &paths.memory) {
        let cpu_dir = ["cpu,cpuacct", "cpuacct,cpu", "cpuacct"]
            .iter()
            .map(|h| under(&root.join(h), cpu))
            .find(|d| d.join("cpuacct.usage").exists());
        if let Some(cpu_dir) = cpu_dir {
            let mem_dir = under(&root.join("memory"), mem);
            let usage = read_u64(mem_dir.join("memory.usage_in_bytes"))?;
            let stat = std::fs::read_to_string(mem_dir.join("memory.stat")).unwrap_or_default();
            let (working_set_bytes, rss_bytes, cache_bytes) = memory_parts(usage, &stat);
            let ticks = std::fs::read_to_string(cpu_dir.join("cpuacct.stat")).unwrap_or_default();
            let to_ns = |key| stat_field(&ticks, key).unwrap_or(0) * (1_000_000_000 / USER_HZ);
            return Some(Reading {
                cpu_ns: read_u64(cpu_dir.join("cpuacct.usage"))?,
                cpu_user_ns: to_ns("user"),
                cpu_system_ns: to_ns("system"),
                usage_bytes: usage,
                working_set_bytes,
                rss_bytes,
                cache_bytes,
                limit_bytes: std::fs::read_to_string(mem_dir.join("memory.limit_in_bytes")).map_or(0, |t| limit(&t)),
            });
        }
    }
    let dir = under(root, paths.unified.as_deref()?);
    let cpu = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
    let usage = read_u64(dir.join("memory.current"))?;
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let (working_set_bytes, rss_bytes, cache_bytes) = memory_parts(usage, &stat);
    Some(Reading {
        cpu_ns: stat_field(&cpu, "usage_usec")? * 1000,
        cpu_user_ns: stat_field(&cpu, "user_usec").unwrap_or(0) * 1000,
        cpu_system_ns: stat_field(&cpu, "system_usec").unwrap_or(0) * 1000,
        usage_bytes: usage,
        working_set_bytes,
        rss_bytes,
        cache_bytes,
        limit_bytes: std::fs::read_to_string(dir.join("memory.max")).map_or(0, |t| limit(&t)),
    })
}

/// The cgroup a process's counters are read from, as cAdvisor names containers (its `id`
/// label): the v1 memory hierarchy's path, else the v2 path.
pub fn name_of(pid: i64) -> Option<String> {
    let paths = parse_proc_cgroup(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?);
    paths.memory.or(paths.unified)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_cgroup_v1_and_v2() {
        let v1 = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/system.slice/docker.service\n";
        let p = parse_proc_cgroup(v1);
        assert_eq!(p.cpuacct.as_deref(), Some("/docker/abc"));
        assert_eq!(p.memory.as_deref(), Some("/docker/abc"));
        let p = parse_proc_cgroup("0::/system.slice/docker-abc.scope\n");
        assert_eq!(p, Paths { unified: Some("/system.slice/docker-abc.scope".into()), ..Default::default() });
    }

    #[test]
    fn working_set_subtracts_inactive_files() {
        assert_eq!(working_set(1000, "cache 10\ntotal_inactive_file 300\n"), 700);
        assert_eq!(working_set(1000, "anon 5\ninactive_file 400\n"), 600);
        assert_eq!(working_set(100, "inactive_file 400\n"), 0);
        assert_eq!(stat_field("usage_usec 1234\nuser_usec 1000\n", "usage_usec"), Some(1234));
    }

    #[test]
    fn memory_limits_and_parts() {
        assert_eq!(limit("max\n"), 0);
        assert_eq!(limit("9223372036854771712\n"), 0);
        assert_eq!(limit("134217728\n"), 134_217_728);
        // v1 reports the hierarchy's totals, v2 the cgroup's own counters.
        assert_eq!(
            memory_parts(1000, "rss 1\ncache 2\ntotal_rss 600\ntotal_cache 300\ntotal_inactive_file 100\n"),
            (900, 600, 300)
        );
        assert_eq!(memory_parts(1000, "anon 500\nfile 400\ninactive_file 200\n"), (800, 500, 400));
    }
}
