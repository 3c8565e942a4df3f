//! Giving freed heap memory back to the system, for every long-running binary.
//!
//! glibc's malloc returns memory to the kernel only from the top of a heap. Serving or
//! watching a cluster frees memory all over the heap (a list's decoded objects, the
//! buffers of a burst of requests), and those pages stay in the process's resident set
//! although nothing uses them. Measured on a one-node cluster after three 100-pod rollouts: 30 MB
//! anonymous memory of which 9 MB in use; `malloc_trim(0)` brought it to 13 MB. glibc's
//! tunables (fewer arenas, a fixed mmap threshold) only got it to 21 MB, and mimalloc
//! started at 26 MB where glibc starts at 6. So every component trims now and then.

use std::time::{Duration, Instant};

/// How often freed memory is returned. A trim of a 30 MB heap takes about a millisecond.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(10);

/// Trim every `interval` on the blocking pool, for as long as the runtime runs.
pub fn spawn_trimmer(interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if let Ok(took) = tokio::task::spawn_blocking(trim).await {
                tracing::trace!(?took, "returned free heap memory");
            }
        }
    })
}

/// Return the free pages of every malloc arena to the kernel; how long it took.
pub fn trim() -> Duration {
    let start = Instant::now();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and releases malloc's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
    start.elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident anonymous memory of this process, in KiB.
    fn anon_kib() -> u64 {
        let s = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
        s.lines()
            .find(|l| l.starts_with("Anonymous:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap()
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn trim_returns_memory_freed_in_the_middle_of_the_heap() {
        // 64 MiB in small blocks (below the mmap threshold), then free all but every
        // 64th: the heap's top stays in use, so only trimming can give the rest back.
        let mut blocks: Vec<Vec<u8>> = (0..64 * 1024).map(|_| vec![1u8; 1024]).collect();
        let keep: Vec<Vec<u8>> = blocks.iter_mut().step_by(64).map(std::mem::take).collect();
        drop(blocks);
        let before = anon_kib();
        trim();
        let after = anon_kib();
        assert!(before - after > 32 * 1024, "trim returned {} KiB of ~63 MiB freed", before.saturating_sub(after));
        drop(keep);
    }
}
