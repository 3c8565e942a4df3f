//! The README's first command: `scripts/cluster up` gives a cluster the official kubectl
//! can use, a second `up` is a no-op that says so, `status` and `logs` work, and `down
//! --purge` stops everything and removes the state.

use std::path::Path;
use std::process::Command;

use e2e::{free_port, kubectl_bin};

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn cluster(home: &Path, port: u16, args: &[&str]) -> (bool, String) {
    let out = Command::new(repo().join("scripts/cluster"))
        .args(args)
        .env("MINIK8S_HOME", home)
        .env("MINIK8S_PROFILE", "debug")
        .env("MINIK8S_PORT", port.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/cluster: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn cluster_up_status_logs_down() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("state");
    let port = free_port();

    let (ok, out) = cluster(&home, port, &["up"]);
    assert!(ok, "cluster up failed:\n{out}");
    assert!(out.contains("export KUBECONFIG="), "up prints how to use the cluster:\n{out}");
    let kubeconfig = home.join("kubeconfig");
    assert!(kubeconfig.exists(), "up writes a kubeconfig");

    let get = Command::new(kubectl_bin())
        .args(["--kubeconfig", kubeconfig.to_str().unwrap(), "get", "namespaces", "-o", "name"])
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&get.stdout);
    let down_after = || cluster(&home, port, &["down", "--purge"]);
    if !get.status.success() || !names.contains("namespace/default") {
        let logs = cluster(&home, port, &["logs", "apiserver"]).1;
        down_after();
        panic!("official kubectl against the new cluster: {names}\n{}\n{logs}", String::from_utf8_lossy(&get.stderr));
    }

    let (ok, out) = cluster(&home, port, &["up"]);
    assert!(ok && out.contains("already up"), "a second up is a no-op that says so:\n{out}");
    let (ok, out) = cluster(&home, port, &["status"]);
    assert!(ok && out.contains("apiserver: running"), "status:\n{out}");
    let (ok, _) = cluster(&home, port, &["logs", "apiserver"]);
    assert!(ok, "logs apiserver");

    let (ok, out) = down_after();
    assert!(ok, "down failed:\n{out}");
    assert!(!home.exists(), "down --purge removes the state directory");
    let refused = Command::new(kubectl_bin())
        .args(["--server", &format!("http://127.0.0.1:{port}"), "get", "namespaces", "--request-timeout=2s"])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "the apiserver is gone after down");
}
