//! The Node object of this kubelet: registration (capacity and allocatable from the host,
//! addresses, nodeInfo, labels, taints), status updates with Kubernetes' condition reasons,
//! and the Lease in `kube-node-lease` renewed every 10 seconds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ContainerImage, Namespace, Node, NodeAddress, NodeCondition, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cidr::Cidr;
use crate::kubelet::Kubelet;

/// Host facts for the Node's status.
#[derive(Debug, Clone, Default)]
pub struct Host {
    pub cpus: usize,
    pub memory_bytes: u64,
    pub ephemeral_bytes: u64,
    pub kernel: String,
    pub os_image: String,
    pub machine_id: String,
    pub boot_id: String,
}

fn read(p: &str) -> String {
    std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default()
}

pub fn host_facts(root: &std::path::Path) -> Host {
    let ephemeral = statvfs_bytes(root).unwrap_or(0);
    let os_image = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|s| s.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into());
    Host {
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        memory_bytes: crate::stats::meminfo_bytes(&read("/proc/meminfo"), "MemTotal"),
        ephemeral_bytes: ephemeral,
        kernel: read("/proc/sys/kernel/osrelease"),
        os_image,
        machine_id: read("/etc/machine-id"),
        boot_id: read("/proc/sys/kernel/random/boot_id"),
    }
}

fn statvfs_bytes(p: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path and s a properly sized out-parameter.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    (rc == 0).then(|| s.f_blocks as u64 * s.f_frsize as u64)
}

pub fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Parse `k=v,k2=v2`.
pub fn parse_labels(s: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for kv in s.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').with_context(|| format!("--node-labels: {kv:?} is not key=value"))?;
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// Parse `key=value:Effect,key:Effect`.
pub fn parse_taints(s: &str) -> Result<Vec<Taint>> {
    let mut out = Vec::new();
    for t in s.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (kv, effect) =
            t.rsplit_once(':').with_context(|| format!("--register-with-taints: {t:?} lacks :Effect"))?;
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            anyhow::bail!("--register-with-taints: unknown effect {effect:?}");
        }
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (kv.to_string(), None),
        };
        out.push(Taint { key, value, effect: effect.to_string(), time_added: None });
    }
    Ok(out)
}

/// Kubernetes' taint of a node a cloud controller manager has not initialized yet.
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// The taints a node registers with: `--register-with-taints`, and with
/// `--cloud-provider=external` the uninitialized taint the cloud controller manager removes
/// (Kubernetes' kubelet accepts only `external` or nothing since in-tree providers went).
pub fn registration_taints(flag: &str, cloud_provider: &str) -> Result<Vec<Taint>> {
    let mut taints = parse_taints(flag)?;
    match cloud_provider {
        "" => {}
        "external" => {
            if !taints.iter().any(|t| t.key == UNINITIALIZED_TAINT) {
                taints.push(Taint {
                    key: UNINITIALIZED_TAINT.into(),
                    value: Some("true".into()),
                    effect: "NoSchedule".into(),
                    time_added: None,
                });
            }
        }
        other => anyhow::bail!("--cloud-provider {other:?}: only \"external\" (or nothing) is supported"),
    }
    Ok(taints)
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: &Time,
    old: Option<&NodeStatus>,
) -> NodeCondition {
    let prev = old.and_then(|s| s.conditions.as_ref()).and_then(|cs| cs.iter().find(|c| c.type_ == type_));
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: match prev {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Some(now.clone()),
        },
    }
}

/// The Node's status (pure, given the host facts, the images and the device plugins'
/// resources: name → (capacity, allocatable)).
#[allow(clippy::too_many_arguments)]
pub fn node_status(
    host: &Host,
    devices: &BTreeMap<String, (usize, usize)>,
    node_ip: &str,
    hostname: &str,
    docker_version: &str,
    port: u16,
    images: &[(Vec<String>, i64)],
    old: Option<&NodeStatus>,
    now: Time,
) -> NodeStatus {
    let q = |s: String| Quantity(s);
    let capacity = BTreeMap::from([
        ("cpu".to_string(), q(host.cpus.to_string())),
        ("memory".to_string(), q(format!("{}Ki", host.memory_bytes / 1024))),
        ("pods".to_string(), q("110".into())),
        ("ephemeral-storage".to_string(), q(format!("{}Ki", host.ephemeral_bytes / 1024))),
    ]);
    let mut allocatable = capacity.clone();
    // Kubernetes' default eviction threshold: memory.available<100Mi.
    allocatable.insert("memory".into(), q(format!("{}Ki", host.memory_bytes.saturating_sub(100 << 20) / 1024)));
    allocatable.insert("ephemeral-storage".into(), q(format!("{}", host.ephemeral_bytes / 10 * 9)));
    let mut capacity = capacity;
    for (name, (cap, alloc)) in devices {
        capacity.insert(name.clone(), q(cap.to_string()));
        allocatable.insert(name.clone(), q(alloc.to_string()));
    }
    NodeStatus {
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        addresses: Some(vec![
            NodeAddress { type_: "InternalIP".into(), address: node_ip.into() },
            NodeAddress { type_: "Hostname".into(), address: hostname.into() },
        ]),
        conditions: Some(vec![
            condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
                &now,
                old,
            ),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure", &now, old),
            condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
                &now,
                old,
            ),
            condition("Ready", "True", "KubeletReady", "kubelet is posting ready status", &now, old),
        ]),
        daemon_endpoints: Some(k8s_openapi::api::core::v1::NodeDaemonEndpoints {
            kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint { port: port as i32 }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: arch().into(),
            boot_id: host.boot_id.clone(),
            container_runtime_version: format!("docker://{docker_version}"),
            kernel_version: host.kernel.clone(),
            kube_proxy_version: String::new(),
            kubelet_version: concat!("v1.37.0-minik8s.", env!("CARGO_PKG_VERSION")).into(),
            machine_id: host.machine_id.clone(),
            operating_system: std::env::consts::OS.into(),
            os_image: host.os_image.clone(),
            system_uuid: host.machine_id.clone(),
            ..Default::default()
        }),
        images: Some(
            images
                .iter()
                .take(50)
                .map(|(names, size)| ContainerImage { names: Some(names.clone()), size_bytes: Some(*size) })
                .collect(),
        ),
        ..Default::default()
    }
}

pub struct Registration {
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub port: u16,
    pub pod_cidr: Option<Cidr>,
}

/// Create or update the Node; returns its podCIDR (flag first, then spec.podCIDR).
pub async fn register(k: &Arc<Kubelet>, reg: &Registration, docker_version: &str) -> Result<()> {
    let api: Api<Node> = Api::all(k.client.clone());
    let mut labels = reg.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), k.node.clone());
    labels.insert("kubernetes.io/os".into(), std::env::consts::OS.into());
    labels.insert("kubernetes.io/arch".into(), arch().into());
    labels.insert("beta.kubernetes.io/os".into(), std::env::consts::OS.into());
    labels.insert("beta.kubernetes.io/arch".into(), arch().into());
    let existing = api.get_opt(&k.node).await.context("getting the Node")?;
    if existing.is_none() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": k.node, "labels": labels},
            "spec": {
                "podCIDR": reg.pod_cidr.map(|c| c.to_string()),
                "podCIDRs": reg.pod_cidr.map(|c| vec![c.to_string()]),
                "taints": if reg.taints.is_empty() { None } else { Some(&reg.taints) },
            }
        }))?;
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => tracing::info!(node = %k.node, "registered node"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).context("creating the Node"),
        }
    } else {
        let mut patch = json!({"metadata": {"labels": labels}});
        if let (Some(c), Some(n)) = (reg.pod_cidr, existing.as_ref()) {
            if n.spec.as_ref().and_then(|s| s.pod_cidr.clone()).is_none() {
                patch["spec"] = json!({"podCIDR": c.to_string(), "podCIDRs": [c.to_string()]});
            }
        }
        api.patch(&k.node, &PatchParams::default(), &Patch::Merge(&patch)).await.context("updating the Node")?;
    }
    update_status(k, reg.port, docker_version).await?;
    Ok(())
}

/// Patch the Node's status; also picks up spec.podCIDR from node IPAM.
pub async fn update_status(k: &Arc<Kubelet>, port: u16, docker_version: &str) -> Result<()> {
    let api: Api<Node> = Api::all(k.client.clone());
    let node = api.get(&k.node).await.context("getting the Node")?;
    if k.net.cidr().is_none() {
        if let Some(c) = node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()).and_then(|c| c.parse().ok()) {
            tracing::info!(pod_cidr = %c, "podCIDR from the Node");
            k.net.set_cidr(c);
        }
    }
    let host = host_facts(&k.root_dir);
    let images = k.rt.images().await.unwrap_or_default();
    let devices = k.devices.as_ref().map(|d| d.node_resources()).unwrap_or_default();
    let status = node_status(
        &host,
        &devices,
        &k.node_ip,
        &k.node,
        docker_version,
        port,
        &images,
        node.status.as_ref(),
        Time(jiff::Timestamp::now()),
    );
    api.patch_status(&k.node, &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
        .await
        .context("patching the Node status")?;
    Ok(())
}

/// Renew the node's Lease every 10 s and its status every `status_every`, forever.
pub async fn heartbeat(k: Arc<Kubelet>, port: u16, docker_version: String) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    let mut n: u64 = 0;
    let mut devices = k.devices.as_ref().map(|d| d.subscribe());
    loop {
        let device_change = async {
            match devices.as_mut() {
                Some(rx) => rx.changed().await.is_ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tick.tick() => {}
            changed = device_change => {
                // A device plugin's devices changed: report them now, not at the next minute.
                if !changed {
                    devices = None;
                }
                if let Err(e) = update_status(&k, port, &docker_version).await {
                    tracing::warn!(error = %format!("{e:#}"), "updating the node status failed");
                }
                continue;
            }
        }
        if let Err(e) = renew_lease(&k).await {
            tracing::warn!(error = %format!("{e:#}"), "renewing the node lease failed");
        }
        // Node status every 10 s until the podCIDR is known, then every minute.
        if n.is_multiple_of(6) || k.net.cidr().is_none() {
            if let Err(e) = update_status(&k, port, &docker_version).await {
                tracing::warn!(error = %format!("{e:#}"), "updating the node status failed");
            }
        }
        n += 1;
    }
}

pub async fn renew_lease(k: &Kubelet) -> Result<()> {
    let api: Api<Lease> = Api::namespaced(k.client.clone(), "kube-node-lease");
    let now = MicroTime(jiff::Timestamp::now());
    match api.get_opt(&k.node).await? {
        Some(_) => {
            let patch = json!({"spec": {"holderIdentity": k.node, "leaseDurationSeconds": 40, "renewTime": now}});
            api.patch(&k.node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        None => {
            let node = Api::<Node>::all(k.client.clone()).get_opt(&k.node).await?;
            let owner = node.and_then(|n| n.metadata.uid).map(|uid| OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: k.node.clone(),
                uid,
                ..Default::default()
            });
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {"name": k.node, "namespace": "kube-node-lease", "ownerReferences": owner.map(|o| vec![o])},
                "spec": {"holderIdentity": k.node, "leaseDurationSeconds": 40, "renewTime": now}
            }))?;
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    // The namespace does not exist yet.
                    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "kube-node-lease"}}))?;
                    let _ = Api::<Namespace>::all(k.client.clone()).create(&PostParams::default(), &ns).await;
                    api.create(&PostParams::default(), &lease).await?;
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse() {
        let l = parse_labels("a=b, zone=z1").unwrap();
        assert_eq!(l["zone"], "z1");
        assert!(parse_labels("nokey").is_err());
        let t = parse_taints("dedicated=gpu:NoSchedule,spot:PreferNoSchedule").unwrap();
        assert_eq!(t[0].key, "dedicated");
        assert_eq!(t[0].value.as_deref(), Some("gpu"));
        assert_eq!(t[1].effect, "PreferNoSchedule");
        assert!(parse_taints("x:Bogus").is_err());
    }

    #[test]
    fn an_external_cloud_provider_registers_the_node_uninitialized() {
        assert!(registration_taints("", "").unwrap().is_empty());
        let t = registration_taints("dedicated=gpu:NoSchedule", "external").unwrap();
        let keys: Vec<(&str, &str)> = t.iter().map(|t| (t.key.as_str(), t.effect.as_str())).collect();
        assert_eq!(keys, [("dedicated", "NoSchedule"), (UNINITIALIZED_TAINT, "NoSchedule")]);
        assert_eq!(
            registration_taints(&format!("{UNINITIALIZED_TAINT}=true:NoSchedule"), "external").unwrap().len(),
            1
        );
        assert!(registration_taints("", "aws").unwrap_err().to_string().contains("only \"external\""));
    }

    #[test]
    fn status_has_capacity_and_ready() {
        let host = Host { cpus: 2, memory_bytes: 4 << 30, ephemeral_bytes: 10 << 30, ..Default::default() };
        let devices = BTreeMap::from([("example.com/widget".to_string(), (3, 2))]);
        let s =
            node_status(&host, &devices, "10.0.0.1", "n1", "20.10.24", 10250, &[], None, Time(jiff::Timestamp::now()));
        assert_eq!(s.allocatable.as_ref().unwrap()["example.com/widget"].0, "2");
        let cap = s.capacity.unwrap();
        assert_eq!(cap["example.com/widget"].0, "3");
        assert_eq!(cap["cpu"].0, "2");
        assert_eq!(cap["pods"].0, "110");
        assert_eq!(s.node_info.unwrap().container_runtime_version, "docker://20.10.24");
        let ready = s.conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "True");
        assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
    }
}
