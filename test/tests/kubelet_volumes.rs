//! emptyDir `medium: Memory` with the real kubelet on the real Docker engine: the volume is
//! a tmpfs (seen as such by `/proc/mounts` and `df` in the container) of the `sizeLimit`'s
//! size, shared by the pod's containers, and unmounted from the host when the pod goes.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use e2e::kubelet::{node_containers, require_docker, Kubelet};
use e2e::ApiServer;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn host_mounts_under(dir: &std::path::Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let d = dir.to_string_lossy().into_owned();
    info.lines().filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&d))).map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_empty_dir_is_a_shared_sized_tmpfs() -> Result<()> {
    if !require_docker() {
        return Ok(());
    }
    let api = ApiServer::start()?;
    let kubelet = Kubelet::start(&api.url(), "kl-tmpfs")?;
    let pods: Api<Pod> = Api::namespaced(api.client()?, "default");
    let writer = "grep ' /cache ' /proc/mounts; df -k /cache | tail -1; echo shared > /cache/hello; \
                  dd if=/dev/zero of=/cache/big bs=1048576 count=16 2>/dev/null; echo dd=$?; \
                  echo used=$(du -k /cache/big | cut -f1); sleep 600";
    let reader = "until [ -f /cache/hello ]; do sleep 0.2; done; echo reader-sees=$(cat /cache/hello); sleep 600";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "tmpfs"},
        "spec": {
            "nodeName": kubelet.node, "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}],
            "containers": [
                {"name": "writer", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                 "command": ["sh", "-c", writer], "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
                {"name": "reader", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                 "command": ["sh", "-c", reader], "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}
            ]
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;

    let deadline = Instant::now() + Duration::from_secs(90);
    let (w, r) = loop {
        let w = api.kubectl(&["logs", "tmpfs", "-c", "writer"])?;
        let r = api.kubectl(&["logs", "tmpfs", "-c", "reader"])?;
        if w.ok && r.ok && w.stdout.contains("used=") && r.stdout.contains("reader-sees=") {
            break (w.stdout, r.stdout);
        }
        if Instant::now() > deadline {
            bail!("logs: writer {w:?} reader {r:?}\nkubelet log:\n{}", kubelet.log());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let lines: Vec<&str> = w.lines().collect();
    // /proc/mounts: `tmpfs /cache tmpfs rw,nosuid,nodev,…,size=8192k,mode=1777 0 0`
    ensure!(lines.len() == 4, "writer output: {w:?}");
    let m: Vec<&str> = lines[0].split_whitespace().collect();
    ensure!(m.len() >= 4 && m[1] == "/cache" && m[2] == "tmpfs", "/proc/mounts: {:?}", lines[0]);
    ensure!(m[3].split(',').any(|o| o == "size=8192k"), "tmpfs options {:?}", m[3]);
    // df: `tmpfs 8192 … /cache`
    let df: Vec<&str> = lines[1].split_whitespace().collect();
    ensure!(df.first() == Some(&"tmpfs") && df.get(1) == Some(&"8192"), "df: {:?}", lines[1]);
    // Writing 16 MiB into 8 MiB fails, and at most 8 MiB landed.
    ensure!(lines[2] != "dd=0", "dd into an 8Mi tmpfs succeeded: {w:?}");
    let used: u64 = lines[3].trim_start_matches("used=").parse().unwrap_or(u64::MAX);
    ensure!(used <= 8192, "{used} KiB written into an 8Mi volume");
    ensure!(r.trim() == "reader-sees=shared", "reader: {r:?}");

    // On the host: one tmpfs under the kubelet's pod directory.
    let root = kubelet.root_dir();
    let mounts = host_mounts_under(&root);
    ensure!(mounts.len() == 1 && mounts[0].contains(" - tmpfs "), "host mounts under {}: {mounts:?}", root.display());

    pods.delete("tmpfs", &DeleteParams::default()).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while pods.get_opt("tmpfs").await?.is_some() || !node_containers(&kubelet.node).is_empty() {
        ensure!(Instant::now() < deadline, "pod not gone\nkubelet log:\n{}", kubelet.log());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let left = host_mounts_under(&root);
    ensure!(left.is_empty(), "tmpfs left mounted after the pod was deleted: {left:?}");
    Ok(())
}
