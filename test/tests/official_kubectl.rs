//! The official kubectl against the real apiserver, on the shared manifests.
//!
//! kubectl runs with its default flags, so manifests are validated (`--validate=strict`:
//! the server's `fieldValidation=Strict`, found through /openapi/v3).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::{kubectl_bin, manifests_dir, ApiServer};
use serde_json::Value;

fn manifest(name: &str) -> String {
    manifests_dir().join(name).to_string_lossy().into_owned()
}

fn kubectl_available() -> bool {
    let ok = kubectl_bin().exists() && manifests_dir().exists();
    if !ok && std::env::var("CI").as_deref() == Ok("true") {
        panic!("kubectl ({}) or the manifests ({}) are missing", kubectl_bin().display(), manifests_dir().display());
    }
    ok
}

#[test]
fn kubectl_create_get_label_annotate_scale_replace_delete() -> Result<()> {
    if !kubectl_available() {
        eprintln!("skipping: no kubectl or manifests");
        return Ok(());
    }
    let server = ApiServer::start()?;
    let k = |args: &[&str]| server.kubectl(args);
    let mut files: Vec<String> = std::fs::read_dir(manifests_dir())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    ensure!(files.len() >= 10, "{files:?}");
    for f in &files {
        let out = k(&["create", "-f", &manifest(f)])?;
        ensure!(out.ok, "create -f {f}: {}", out.stderr);
    }
    // get -o yaml / json / name
    let out = k(&["get", "pod", "shared-pod", "-o", "yaml"])?;
    ensure!(out.ok && out.stdout.contains("name: shared-pod") && out.stdout.contains("resourceVersion:"), "{out:?}");
    let out = k(&["get", "deployment", "web", "-o", "json"])?;
    let d: Value = serde_json::from_str(&out.stdout).context("get -o json")?;
    ensure!(d["spec"]["replicas"] == 3 && d["metadata"]["generation"] == 1, "{d}");
    let out = k(&["get", "pods", "-A", "-o", "name"])?;
    for p in ["pod/shared-pod", "pod/pvc-pod", "pod/reader", "pod/test-single-module-biz1"] {
        ensure!(out.stdout.lines().any(|l| l == p), "{p} missing in {}", out.stdout);
    }
    let out = k(&["get", "all"])?;
    ensure!(out.ok && out.stdout.contains("service/web") && out.stdout.contains("deployment.apps/web"), "{out:?}");
    let out = k(&["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort} {.spec.clusterIP}"])?;
    ensure!(out.stdout.starts_with("30080 10."), "{out:?}");
    let out = k(&["get", "secret", "-n", "demo", "creds", "-o", "jsonpath={.data.password}"])?;
    ensure!(out.stdout == "czNjcjN0", "stringData not folded: {out:?}");
    // label / annotate (merge patches), scale (scale subresource)
    ensure!(k(&["label", "pod", "shared-pod", "tier=frontend"])?.ok);
    ensure!(k(&["annotate", "deployment", "web", "example.com/note=hello"])?.ok);
    let out = k(&["scale", "deployment", "web", "--replicas=5"])?;
    ensure!(out.ok, "{out:?}");
    let out = k(&["scale", "replicaset", "web-rs", "--replicas=1"])?;
    ensure!(out.ok, "{out:?}");
    let out = k(&[
        "get",
        "deploy",
        "web",
        "-o",
        "jsonpath={.spec.replicas} {.metadata.generation} {.metadata.annotations.example\\.com/note}",
    ])?;
    ensure!(out.stdout == "5 2 hello", "{out:?}");
    let out = k(&["get", "deploy", "web", "--subresource=scale"])?;
    let rows: Vec<Vec<&str>> = out.stdout.lines().map(|l| l.split_whitespace().collect()).collect();
    ensure!(rows.len() == 2 && rows[0] == ["NAME", "DESIRED", "AVAILABLE", "AGE"], "{out:?}");
    ensure!(rows[1][..3] == ["web", "5", "0"], "{out:?}");
    let out = k(&["get", "pods", "-l", "tier=frontend", "-o", "name"])?;
    ensure!(out.stdout.trim() == "pod/shared-pod", "{out:?}");
    // label --overwrite / removal
    ensure!(k(&["label", "pod", "shared-pod", "tier-"])?.ok);
    let out = k(&["get", "pods", "-l", "tier", "-o", "name"])?;
    ensure!(out.stdout.trim().is_empty(), "{out:?}");
    // replace keeps the allocated cluster IP and node port
    let before = k(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"])?.stdout;
    let out = k(&["replace", "-f", &manifest("04-service.yaml")])?;
    ensure!(out.ok, "{out:?}");
    let after = k(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"])?.stdout;
    ensure!(before == after && !before.is_empty(), "{before} vs {after}");
    // delete, and delete --wait on something with nothing holding it
    let out = k(&["delete", "-f", &manifest("03-deployment.yaml")])?;
    ensure!(out.ok && out.stdout.contains("deleted"), "{out:?}");
    let out = k(&["delete", "configmap", "settings", "-n", "demo", "--wait=true", "--timeout=20s"])?;
    ensure!(out.ok, "{out:?}");
    let out = k(&["get", "deployment", "web"])?;
    ensure!(!out.ok && out.stderr.contains("NotFound"), "{out:?}");
    // Errors come back as kubectl-readable Status objects.
    let out = k(&["get", "pod", "nope"])?;
    ensure!(!out.ok && out.stderr.contains("pods \"nope\" not found"), "{out:?}");
    let out = k(&["create", "-f", &manifest("01-pod.yaml")])?;
    ensure!(!out.ok && out.stderr.contains("AlreadyExists"), "{out:?}");
    Ok(())
}

#[test]
fn kubectl_get_watch_streams_changes() -> Result<()> {
    if !kubectl_available() {
        eprintln!("skipping: no kubectl or manifests");
        return Ok(());
    }
    let server = ApiServer::start()?;
    // (`kubectl create configmap` sends a protobuf body.)
    let cm = |n: &str| -> Result<()> {
        let out = server.kubectl(&["create", "configmap", n, "--from-literal=k=v"])?;
        ensure!(out.ok, "{out:?}");
        Ok(())
    };
    cm("w0")?;
    let mut child = Command::new(kubectl_bin())
        .args(["--server", &server.url(), "get", "configmaps", "-w", "--request-timeout=10s"])
        .env("KUBECONFIG", "/dev/null")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(1500));
    cm("w1")?;
    cm("w2")?;
    std::thread::sleep(Duration::from_millis(1500));
    let _ = child.kill();
    let mut out = String::new();
    if let Some(mut so) = child.stdout.take() {
        so.read_to_string(&mut out)?;
    }
    let _ = child.wait();
    for n in ["w0", "w1", "w2"] {
        ensure!(out.lines().any(|l| l.starts_with(n)), "{n} not in kubectl get -w output:\n{out}");
    }
    Ok(())
}

#[test]
fn old_kubectl_versions_work_too() -> Result<()> {
    let versions: Vec<_> = (27..=33)
        .map(|v| std::path::PathBuf::from(format!("/usr/lib/google-cloud-sdk/bin/kubectl.1.{v}")))
        .filter(|p| p.exists())
        .collect();
    if versions.is_empty() || !manifests_dir().exists() {
        eprintln!("skipping: no versioned kubectl builds");
        return Ok(());
    }
    let server = ApiServer::start()?;
    for (i, bin) in versions.iter().enumerate() {
        let ns = format!("v{i}");
        let run = |args: &[&str]| -> Result<std::process::Output> {
            Ok(Command::new(bin)
                .arg("--server")
                .arg(server.url())
                .args(args)
                .env("KUBECONFIG", "/dev/null")
                .output()?)
        };
        // (`kubectl create namespace` sends a protobuf body from 1.31 on.)
        let out = run(&["create", "namespace", &ns])?;
        ensure!(out.status.success(), "{}: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
        let out = run(&["create", "-f", &manifest("03-deployment.yaml")])?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(out.status.success() || (i > 0 && err.contains("AlreadyExists")), "{}: {err}", bin.display());
        let out = run(&["label", "deployment", "web", &format!("seen-by-{ns}=yes")])?;
        ensure!(out.status.success(), "{}: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
        let out = run(&["get", "deployments", "-A"])?;
        ensure!(out.status.success(), "{}: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
        let out = run(&["scale", "deployment", "web", "-n", "default", "--replicas=2"])?;
        ensure!(out.status.success(), "{}: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
