//! What `build.rs` and the apiserver must agree on about the committed documents
//! (`build.rs` includes this file): where they are and how an ETag is computed.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// The entity tag of a document.
pub fn etag(bytes: &[u8]) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    let mut h2 = std::collections::hash_map::DefaultHasher::new();
    (bytes.len(), &bytes[bytes.len() / 2..]).hash(&mut h2);
    format!("{:016X}{:016X}", h.finish(), h2.finish())
}

/// The `.json` files under `dir`, recursively, sorted.
#[cfg_attr(not(test), allow(dead_code))] // build.rs and the generator (a test) list them
pub fn json_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "json") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, &mut out)?;
    out.sort();
    Ok(out)
}
