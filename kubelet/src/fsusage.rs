//! A container's filesystem usage: the disk space its writable layer takes (what `du`
//! says of overlay's upper directory), and the device that holds it, as cAdvisor reports
//! `container_fs_usage_bytes{device}`. Walking a directory costs more than reading a
//! counter, so the kubelet does it in housekeeping at most once a minute per container.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Bytes allocated to the files under `dir` (512-byte blocks, as `du` counts), without
/// following symbolic links or crossing into other filesystems. An entry that vanishes
/// during the walk is skipped.
pub fn disk_usage(dir: &Path) -> u64 {
    let Ok(top) = std::fs::symlink_metadata(dir) else { return 0 };
    let dev = top.dev();
    let mut total = top.blocks() * 512;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// The device of the mount holding `path`, from the text of `/proc/self/mounts` (the mount
/// with the longest mount point that is a prefix of `path`).
pub fn device_of(mounts: &str, path: &str) -> Option<String> {
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (dev, at) = (f.next()?, f.next()?);
            let inside = path == at || at == "/" || path.strip_prefix(at).is_some_and(|rest| rest.starts_with('/'));
            inside.then_some((at.len(), dev))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, dev)| dev.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_allocated_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let empty = disk_usage(dir.path());
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/data"), vec![1u8; 256 * 1024]).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("link")).unwrap();
        let used = disk_usage(dir.path()) - empty;
        assert!((256 * 1024..512 * 1024).contains(&used), "{used}");
        assert_eq!(disk_usage(Path::new("/nonexistent/dir")), 0);
    }

    #[test]
    fn device_is_the_longest_mount_prefix() {
        let mounts =
            "overlay / overlay rw 0 0\n/dev/vda /var/lib/docker ext4 rw 0 0\n/dev/vdb /var/lib/dockerx ext4 rw 0 0\n";
        assert_eq!(device_of(mounts, "/var/lib/docker/overlay2/abc/diff").as_deref(), Some("/dev/vda"));
        assert_eq!(device_of(mounts, "/var/lib/dockerx/y").as_deref(), Some("/dev/vdb"));
        assert_eq!(device_of(mounts, "/srv").as_deref(), Some("overlay"));
        assert_eq!(device_of("", "/srv"), None);
    }
}
