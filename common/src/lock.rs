//! Process locks: a file lock (`flock`) held for the life of a process, so that two copies
//! of something that must be unique on a host — two kubelets for one node, two kubeproxies
//! in one network namespace, two supervisors of one cluster — cannot run at once. The
//! kernel drops the lock when the process dies, however it dies, so a stale lock cannot
//! block a restart (unlike a pid file); the holder's pid is written into the file for the
//! error message.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long [`acquire`] waits for a lock that is held before calling its holder a second
/// copy: longer than anyone merely checking the lock holds it, even on a loaded machine.
pub const MOMENTARY_HOLD: Duration = Duration::from_secs(2);

/// A held lock; dropping it (or exiting) releases it.
#[derive(Debug)]
pub struct ProcessLock {
    _file: File,
    pub path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{what} already runs (pid {pid}; lock {path})")]
    Held { what: String, pid: String, path: PathBuf },
    #[error("cannot open lock file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// Where per-host locks live: `/run/minik8s` for root, else a directory of the user's
/// under the temporary directory.
pub fn runtime_dir() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 && Path::new("/run").is_dir() {
        PathBuf::from("/run/minik8s")
    } else {
        std::env::temp_dir().join(format!("minik8s-{uid}"))
    }
}

/// Take the lock at `path` (creating the file and its directory), or say who holds it.
/// `what` names the holder in the error ("a kubelet for node node-1").
pub fn acquire(path: &Path, what: &str) -> Result<ProcessLock, LockError> {
    let io = |source| LockError::Io { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io)?;
    // A lock held only for a moment is someone checking whether it is held (`flock -n FILE
    // true`, as scripts/cluster does to find a running supervisor), not a second copy: wait
    // that out before refusing.
    let deadline = Instant::now() + MOMENTARY_HOLD;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                return Err(LockError::Held {
                    what: what.to_string(),
                    pid: pid.trim().to_string(),
                    path: path.to_path_buf(),
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
    }
    file.set_len(0).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    Ok(ProcessLock { _file: file, path: path.to_path_buf() })
}

/// A file-name-safe form of `s` (node names may hold dots; anything else odd becomes `_`).
pub fn file_name_part(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect()
}

/// The inode of this process's network namespace: one kubeproxy per namespace.
pub fn netns_id() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_s_pid_and_the_lock_dies_with_its_holder() {
        let dir = tempfile_dir();
        let path = dir.join("x.lock");
        let first = acquire(&path, "a test holder").unwrap();
        match acquire(&path, "a test holder") {
            Err(LockError::Held { pid, what, .. }) => {
                assert_eq!(pid, std::process::id().to_string());
                assert_eq!(what, "a test holder");
            }
            other => panic!("second lock: {other:?}"),
        }
        drop(first);
        assert!(acquire(&path, "a test holder").is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_lock_held_only_for_a_moment_is_waited_for() {
        // What `flock -n FILE true` does while a process starts: holds it briefly. The start
        // must not take that for a running copy.
        let dir = std::env::temp_dir().join(format!("minik8s-lock-test-momentary-{}", std::process::id()));
        let path = dir.join("y.lock");
        let peek = acquire(&path, "a checker").unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(peek);
        });
        let started = Instant::now();
        let held = acquire(&path, "a test holder");
        assert!(held.is_ok(), "{held:?}");
        assert!(started.elapsed() >= Duration::from_millis(250), "it did wait");
        release.join().unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn names_are_made_file_safe() {
        assert_eq!(file_name_part("node-1.example"), "node-1.example");
        assert_eq!(file_name_part("a/b c"), "a_b_c");
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("minik8s-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
