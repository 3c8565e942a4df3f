//! NVIDIA GPUs as `nvidia.com/gpu`: found with `nvidia-smi -L`, one device per GPU named by its
//! UUID (as NVIDIA's own plugin names them). A GPU that disappears from `nvidia-smi -L`, or an
//! `nvidia-smi` that fails, makes devices unhealthy until they are back. A container given
//! GPUs gets them as CDI names `nvidia.com/gpu=<uuid>`, which the kubelet hands Docker as a
//! `DeviceRequest` for the `nvidia` driver (the NVIDIA container toolkit's `--gpus`), and an
//! annotation naming them.
//!
//! Not covered: MIG devices (listed by `nvidia-smi -L` under their GPU; only whole GPUs are
//! offered) and NVML's XID error events (health is whether the GPU still answers).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use crate::plugin::Devices;
use crate::v1beta1::{CdiDevice, ContainerAllocateResponse, Device};
use crate::{HEALTHY, UNHEALTHY};

pub const RESOURCE: &str = "nvidia.com/gpu";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub name: String,
    pub uuid: String,
}

/// The GPUs in `nvidia-smi -L`'s output: `GPU <i>: <name> (UUID: <uuid>)` lines (the
/// indented MIG lines under a GPU are skipped).
pub fn parse_list(out: &str) -> Vec<Gpu> {
    out.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("GPU ")?;
            let (index, rest) = rest.split_once(": ")?;
            let (name, uuid) = rest.rsplit_once(" (UUID: ")?;
            Some(Gpu {
                index: index.trim().parse().ok()?,
                name: name.trim().to_string(),
                uuid: uuid.trim().strip_suffix(')')?.to_string(),
            })
        })
        .collect()
}

/// The CDI name of a GPU: `nvidia.com/gpu=<uuid>`.
pub fn cdi_name(uuid: &str) -> String {
    format!("{RESOURCE}={uuid}")
}

pub struct Nvidia {
    smi: PathBuf,
    interval: Duration,
    /// Every GPU seen since the start, in order: one that vanishes stays, unhealthy.
    known: Mutex<Vec<Gpu>>,
}

impl Nvidia {
    /// Discover the GPUs now; an error if `nvidia-smi` cannot run or lists none.
    pub fn discover(smi: PathBuf, interval: Duration) -> anyhow::Result<Nvidia> {
        let gpus = run_list(&smi)?;
        if gpus.is_empty() {
            anyhow::bail!("{} -L lists no GPU", smi.display());
        }
        for g in &gpus {
            tracing::info!(index = g.index, name = %g.name, uuid = %g.uuid, "found a GPU");
        }
        Ok(Nvidia { smi, interval, known: Mutex::new(gpus) })
    }
}

fn run_list(smi: &PathBuf) -> anyhow::Result<Vec<Gpu>> {
    let out = std::process::Command::new(smi)
        .arg("-L")
        .output()
        .map_err(|e| anyhow::anyhow!("running {} -L: {e}", smi.display()))?;
    if !out.status.success() {
        anyhow::bail!("{} -L: {}: {}", smi.display(), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(parse_list(&String::from_utf8_lossy(&out.stdout)))
}

/// The devices: every known GPU, healthy when `now` (the latest listing, `None` when it
/// failed) still has it.
pub fn devices(known: &[Gpu], now: Option<&[Gpu]>) -> Vec<Device> {
    known
        .iter()
        .map(|g| {
            let present = now.is_some_and(|n| n.iter().any(|x| x.uuid == g.uuid));
            Device { id: g.uuid.clone(), health: if present { HEALTHY } else { UNHEALTHY }.into(), topology: None }
        })
        .collect()
}

impl Devices for Nvidia {
    fn resource_name(&self) -> String {
        RESOURCE.into()
    }

    fn list(&self) -> Vec<Device> {
        let now = match run_list(&self.smi) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "GPU health check failed");
                None
            }
        };
        let Ok(mut known) = self.known.lock() else { return vec![] };
        for g in now.iter().flatten() {
            if !known.iter().any(|k| k.uuid == g.uuid) {
                known.push(g.clone());
            }
        }
        devices(&known, now.as_deref())
    }

    fn knows(&self, id: &str) -> bool {
        self.known.lock().is_ok_and(|k| k.iter().any(|g| g.uuid == id))
    }

    fn allocate(&self, ids: &[String]) -> ContainerAllocateResponse {
        ContainerAllocateResponse {
            cdi_devices: ids.iter().map(|id| CdiDevice { name: cdi_name(id) }).collect(),
            annotations: [(RESOURCE.to_string(), ids.join(","))].into(),
            ..Default::default()
        }
    }

    fn poll_every(&self) -> Duration {
        self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_recorded_h200() {
        // `nvidia-smi -L` on a machine with one H200 (driver 580.159.04).
        let gpus = parse_list(include_str!("../testdata/nvidia-smi-L-h200.txt"));
        assert_eq!(
            gpus,
            [Gpu { index: 0, name: "NVIDIA H200".into(), uuid: "GPU-e953baca-0a92-4ed5-9e3f-7362da89242f".into() }]
        );
    }

    #[test]
    fn mig_lines_are_not_gpus() {
        let gpus = parse_list(include_str!("../testdata/nvidia-smi-L-mig.txt"));
        assert_eq!(gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(gpus[1].uuid, "GPU-a07a5be2-0a12-ad8b-1f4b-2bd5e1d7b7d1");
        assert!(parse_list("No devices were found\n").is_empty());
    }

    #[test]
    fn a_vanished_gpu_is_unhealthy() {
        let a = Gpu { index: 0, name: "x".into(), uuid: "GPU-a".into() };
        let b = Gpu { index: 1, name: "x".into(), uuid: "GPU-b".into() };
        let known = [a.clone(), b];
        let health = |now: Option<&[Gpu]>| devices(&known, now).into_iter().map(|d| d.health).collect::<Vec<_>>();
        assert_eq!(health(Some(std::slice::from_ref(&a))), [HEALTHY, UNHEALTHY]);
        assert_eq!(health(None), [UNHEALTHY, UNHEALTHY]);
    }

    #[test]
    fn allocation_names_cdi_devices() {
        let n = Nvidia { smi: "nvidia-smi".into(), interval: Duration::from_secs(1), known: Mutex::new(vec![]) };
        let r = n.allocate(&["GPU-a".into(), "GPU-b".into()]);
        assert_eq!(
            r.cdi_devices.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]
        );
        assert_eq!(r.annotations[RESOURCE], "GPU-a,GPU-b");
        assert!(r.envs.is_empty());
    }
}
