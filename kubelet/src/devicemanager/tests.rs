//! The device plugin protocol for real, in one process: the manager's registration server and
//! the plugins of the `device-plugin` crate talk gRPC over unix sockets in a temporary
//! directory (no Docker, no apiserver).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deviceplugin::{nvidia, plugin, sample};

use super::*;

const W: &str = "example.com/widget";

async fn wait_for(dm: &DeviceManager, resource: &str, want: (usize, usize)) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = dm.node_resources().get(resource).copied();
        if now == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{resource}: wanted {want:?}, have {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn start_plugin<D: plugin::Devices>(
    devices: D,
    dir: &Path,
    socket: &str,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(plugin::run(Arc::new(devices), dir.to_path_buf(), socket.to_string(), async move {
        let _ = rx.await;
    }));
    (tx, task)
}

fn one(n: usize) -> Vec<(String, usize)> {
    vec![(W.to_string(), n)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_devices_register_allocate_fail_and_go() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("device-plugins");
    let dm = DeviceManager::start(&dir).await.unwrap();
    // A second kubelet on the same directory is refused.
    assert!(DeviceManager::start(&dir).await.is_err());

    let devices = sample::Sample::create(W, tmp.path().join("widgets"), 3).unwrap();
    let (stop, task) = start_plugin(devices, &dir, "widget.sock");
    wait_for(&dm, W, (3, 3)).await;

    // Three containers get distinct devices; a fourth gets none and Kubernetes' message.
    let mut held = HashSet::new();
    for pod in ["p1", "p2", "p3"] {
        let d = dm.allocate(pod, "c", &one(1), &[], None).await.unwrap();
        assert!(d.new);
        let ids = &d.held[W];
        assert_eq!(ids.len(), 1);
        assert!(held.insert(ids[0].clone()), "{ids:?} given twice");
        assert_eq!(d.envs["WIDGET_DEVICES"], ids[0]);
        assert_eq!(d.mounts[0].host_path, tmp.path().join("widgets").join(&ids[0]).display().to_string());
    }
    let err = dm.allocate("p4", "c", &one(1), &[], None).await.unwrap_err();
    assert_eq!(err, "requested number of devices unavailable for example.com/widget. Requested: 1, Available: 0");

    // A container started again gets what it held; resources no plugin serves are no devices.
    let again = dm.allocate("p1", "c", &one(1), &[], None).await.unwrap();
    assert!(!again.new);
    let p1_device = again.held[W][0].clone();
    let none = dm.allocate("p9", "c", &[("example.com/dongle".to_string(), 1)], &[], None).await.unwrap();
    assert!(none.held.is_empty());

    // The checkpoint names every holder.
    let saved = State::from_checkpoint(&std::fs::read(dir.join(CHECKPOINT)).unwrap(), Instant::now()).unwrap();
    let mut holders: Vec<&str> = saved.entries.iter().map(|e| e.pod_uid.as_str()).collect();
    holders.sort();
    assert_eq!(holders, ["p1", "p2", "p3"]);
    assert!(saved.entries.iter().all(|e| !e.response.is_empty()));

    // A pod that ends frees its device: the next one gets it.
    dm.release_pod("p2");
    assert_eq!(dm.allocate("p4", "c", &one(1), &[], None).await.unwrap().held[W].len(), 1);
    // Pods no longer active lose theirs when the next allocation looks.
    let active: HashSet<String> = ["p1", "p3", "p4", "p5"].map(String::from).into();
    let err = dm.allocate("p5", "c", &one(1), &[], Some(&active)).await.unwrap_err();
    assert!(err.contains("Available: 0"), "{err}");

    // A device marked unhealthy leaves allocatable; capacity stays.
    std::fs::write(tmp.path().join("widgets").join(format!("{p1_device}.unhealthy")), "").unwrap();
    wait_for(&dm, W, (3, 2)).await;
    std::fs::remove_file(tmp.path().join("widgets").join(format!("{p1_device}.unhealthy"))).unwrap();
    wait_for(&dm, W, (3, 3)).await;

    // The plugin goes: nothing is allocatable, and new allocations fail; held ones stay.
    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    wait_for(&dm, W, (3, 0)).await;
    assert!(!dir.join("widget.sock").exists());
    assert!(dm.allocate("p6", "c", &one(1), &[], None).await.is_err());
    assert!(!dm.allocate("p1", "c", &one(1), &[], None).await.unwrap().new);

    // It comes back and registers again.
    let devices = sample::Sample::create(W, tmp.path().join("widgets"), 3).unwrap();
    let (_stop, _task) = start_plugin(devices, &dir, "widget.sock");
    wait_for(&dm, W, (3, 3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_containers_device_goes_on_to_the_app_container() {
    let tmp = tempfile::tempdir().unwrap();
    let dm = DeviceManager::start(tmp.path()).await.unwrap();
    let devices = sample::Sample::create(W, tmp.path().join("widgets"), 1).unwrap();
    let (_stop, _task) = start_plugin(devices, tmp.path(), "widget.sock");
    wait_for(&dm, W, (1, 1)).await;
    let init = dm.allocate("p", "init", &one(1), &["init2".to_string()], None).await.unwrap();
    let app = dm.allocate("p", "app", &one(1), &["init".to_string()], None).await.unwrap();
    assert_eq!(init.held[W], app.held[W]);
    assert!(dm.allocate("q", "c", &one(1), &[], None).await.is_err(), "the pod's device went to another pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_registrations_are_refused_with_kubernetes_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let dm = DeviceManager::start(tmp.path()).await.unwrap();
    let err = plugin::register(tmp.path(), "cpu.sock", "cpu").await.unwrap_err();
    assert!(format!("{err:#}").contains("the ResourceName \"cpu\" is invalid"), "{err:#}");
    // Accepted, but nothing serves the socket: the resource never appears.
    plugin::register(tmp.path(), "nobody.sock", W).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(dm.node_resources().is_empty());
}

/// The GPU path on a machine with NVIDIA GPUs: the NVIDIA plugin finds them with the real
/// `nvidia-smi`, registers, and a container's allocation becomes the Docker request the NVIDIA
/// container toolkit carries out. Prints `ALLOCATED_GPU=<uuid>` for a script to use the GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA GPU and nvidia-smi: cargo test -p kubelet -- --ignored nvidia"]
async fn nvidia_gpus_of_this_machine() {
    let tmp = tempfile::tempdir().unwrap();
    let dm = DeviceManager::start(tmp.path()).await.unwrap();
    let smi = std::env::var("NVIDIA_SMI").unwrap_or_else(|_| "nvidia-smi".into());
    let listed = std::process::Command::new(&smi).arg("-L").output().unwrap();
    let gpus = nvidia::parse_list(&String::from_utf8_lossy(&listed.stdout));
    assert!(!gpus.is_empty(), "nvidia-smi -L lists no GPU");
    let found = nvidia::Nvidia::discover(smi.into(), Duration::from_secs(2)).unwrap();
    let (_stop, _task) = start_plugin(found, tmp.path(), "nvidia-gpu.sock");
    wait_for(&dm, nvidia::RESOURCE, (gpus.len(), gpus.len())).await;

    let d = dm.allocate("gpu-pod", "cuda", &[(nvidia::RESOURCE.to_string(), 1)], &[], None).await.unwrap();
    let uuid = d.held[nvidia::RESOURCE][0].clone();
    assert!(gpus.iter().any(|g| g.uuid == uuid), "{uuid} is not one of {gpus:?}");
    assert_eq!(d.cdi, [format!("nvidia.com/gpu={uuid}")]);
    let mut body = crate::runtime::ContainerCreateBody::default();
    crate::podconfig::add_devices(&mut body, &d);
    let req = &body.host_config.unwrap().device_requests.unwrap()[0];
    assert_eq!(req.driver.as_deref(), Some("nvidia"));
    assert_eq!(req.device_ids.as_deref(), Some(&[uuid.clone()][..]));
    let err =
        dm.allocate("gpu-pod-2", "cuda", &[(nvidia::RESOURCE.to_string(), gpus.len())], &[], None).await.unwrap_err();
    assert!(err.contains(&format!("Available: {}", gpus.len() - 1)), "{err}");
    println!("ALLOCATED_GPU={uuid}");
    println!("DOCKER_DEVICE_REQUEST={}", serde_json::to_string(req).unwrap());
}
