//! Helpers for the suites that drive `scripts/cluster` (cluster_script, cluster_join,
//! services_in_pods): run the script against a state directory, and shell one-liners.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (where `scripts/` is).
pub fn repo() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

/// `scripts/cluster ARGS` with `MINIK8S_HOME=home`, debug builds (of the whole workspace, as
/// the harness builds) and the apiserver on `port`:
/// whether it succeeded, and its stdout followed by its stderr.
pub fn script(home: &Path, port: u16, args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(repo().join("scripts/cluster"));
    crate::strip_test_env(&mut cmd);
    let out = cmd
        .args(args)
        .env("MINIK8S_HOME", home)
        .env("MINIK8S_PROFILE", "debug")
        // The harness's one build of every binary (`crate::workspace_bins`), not a second
        // variant of the components' dependencies.
        .env("MINIK8S_BUILD_WORKSPACE", "1")
        .env("MINIK8S_PORT", port.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/cluster: {e}"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// `scripts/cluster down --purge` of `(home, port)` when dropped: tears a suite's cluster
/// down even when an assertion fails.
pub struct Down<'a>(pub &'a Path, pub u16);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = script(self.0, self.1, &["down", "--purge"]);
    }
}

/// The stdout of `sh -c CMD` (whatever its exit status).
pub fn sh_stdout(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether this host holds kubeproxy's Service rules, in either mode: a `KUBE-SERVICES`
/// rule in iptables, or a Service in the `kube-proxy` nftables table's `service-ips` map.
pub fn host_has_service_rules() -> bool {
    sh_stdout("iptables-save").contains("-A KUBE-SERVICES")
        || sh_stdout("nft list map ip kube-proxy service-ips 2>/dev/null").contains(" : goto ")
}

/// Whether any per-Service rule is left on this host, in either mode (`KUBE-SVC-*` chains, or
/// the `kube-proxy` nftables table).
pub fn host_has_any_service_chain() -> bool {
    sh_stdout("iptables-save").contains("KUBE-SVC-")
        || sh_stdout("nft list tables 2>/dev/null").contains("ip kube-proxy")
}

/// The components `scripts/cluster` runs for the state directory `home` that are running
/// now, with their pids (the supervisor's `status.json`).
pub fn component_pids(home: &Path) -> Vec<(String, u32)> {
    let Ok(text) = std::fs::read_to_string(home.join("supervisor/status.json")) else { return vec![] };
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    doc["components"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["state"] == "running")
        .filter_map(|c| Some((c["name"].as_str()?.to_string(), u32::try_from(c["pid"].as_u64()?).ok()?)))
        .collect()
}

/// The pid of one running component of `home`.
pub fn component_pid(home: &Path, name: &str) -> Option<u32> {
    component_pids(home).into_iter().find(|(n, _)| n == name).map(|(_, p)| p)
}

/// The row of `scripts/cluster status` output for a component: its state column onwards.
pub fn status_row<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(name).filter(|r| r.starts_with(' ')).map(str::trim_start))
}
