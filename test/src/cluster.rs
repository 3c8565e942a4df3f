//! Helpers for the suites that drive `scripts/cluster` (cluster_script, cluster_join,
//! services_in_pods): run the script against a state directory, and shell one-liners.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (where `scripts/` is).
pub fn repo() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// `scripts/cluster ARGS` with `MINIK8S_HOME=home`, debug builds and the apiserver on `port`:
/// whether it succeeded, and its stdout followed by its stderr.
pub fn script(home: &Path, port: u16, args: &[&str]) -> (bool, String) {
    let out = Command::new(repo().join("scripts/cluster"))
        .args(args)
        .env("MINIK8S_HOME", home)
        .env("MINIK8S_PROFILE", "debug")
        .env("MINIK8S_PORT", port.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/cluster: {e}"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The stdout of `sh -c CMD` (whatever its exit status).
pub fn sh_stdout(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
