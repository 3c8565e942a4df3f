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
    pub usage_bytes: u64,
    /// Usage minus inactive file pages (what Kubernetes reports and evicts on).
    pub working_set_bytes: u64,
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
            return Some(Reading {
                cpu_ns: read_u64(cpu_dir.join("cpuacct.usage"))?,
                usage_bytes: usage,
                working_set_bytes: working_set(usage, &stat),
            });
        }
    }
    let dir = under(root, paths.unified.as_deref()?);
    let cpu = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
    let usage = read_u64(dir.join("memory.current"))?;
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    Some(Reading {
        cpu_ns: stat_field(&cpu, "usage_usec")? * 1000,
        usage_bytes: usage,
        working_set_bytes: working_set(usage, &stat),
    })
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
}
