//! The sample plugin: `count` fake devices of one resource, each a file `<dir>/<id>` that holds
//! its id. A device is unhealthy while `<dir>/<id>.unhealthy` exists (or its file is gone),
//! so a test breaks and repairs devices with `touch` and `rm`. A container given devices sees
//! each one's file at `/devices/<id>`, a character device `/dev/<id>` (the host's
//! `/dev/null`: the device-node path, exercised), `<NAME>_DEVICES=<ids>` in its environment
//! and an annotation `<resource>=<ids>` for the runtime.

use std::path::PathBuf;

use crate::plugin::Devices;
use crate::v1beta1::{ContainerAllocateResponse, Device, DeviceSpec, Mount};
use crate::{HEALTHY, UNHEALTHY};

pub struct Sample {
    resource: String,
    dir: PathBuf,
    ids: Vec<String>,
}

/// The part of `vendor.com/name` after the slash.
fn short_name(resource: &str) -> &str {
    resource.rsplit('/').next().unwrap_or(resource)
}

/// `widget` → `WIDGET_DEVICES`: an environment variable name from a resource's short name.
pub fn env_name(resource: &str) -> String {
    let s: String = short_name(resource)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' })
        .collect();
    format!("{s}_DEVICES")
}

impl Sample {
    /// Make the device files `<dir>/<short name>-<i>` (kept if they exist: a restarted plugin
    /// keeps its devices' health markers).
    pub fn create(resource: &str, dir: PathBuf, count: usize) -> std::io::Result<Sample> {
        std::fs::create_dir_all(&dir)?;
        let ids: Vec<String> = (0..count).map(|i| format!("{}-{i}", short_name(resource))).collect();
        for id in &ids {
            let f = dir.join(id);
            if !f.exists() {
                std::fs::write(&f, format!("{id}\n"))?;
            }
        }
        Ok(Sample { resource: resource.to_string(), dir, ids })
    }
}

impl Devices for Sample {
    fn resource_name(&self) -> String {
        self.resource.clone()
    }

    fn list(&self) -> Vec<Device> {
        self.ids
            .iter()
            .map(|id| {
                let broken = self.dir.join(format!("{id}.unhealthy")).exists() || !self.dir.join(id).exists();
                Device { id: id.clone(), health: if broken { UNHEALTHY } else { HEALTHY }.into(), topology: None }
            })
            .collect()
    }

    fn knows(&self, id: &str) -> bool {
        self.ids.iter().any(|i| i == id)
    }

    fn allocate(&self, ids: &[String]) -> ContainerAllocateResponse {
        let joined = ids.join(",");
        ContainerAllocateResponse {
            envs: [(env_name(&self.resource), joined.clone())].into(),
            mounts: ids
                .iter()
                .map(|id| Mount {
                    container_path: format!("/devices/{id}"),
                    host_path: self.dir.join(id).display().to_string(),
                    read_only: true,
                })
                .collect(),
            devices: ids
                .iter()
                .map(|id| DeviceSpec {
                    container_path: format!("/dev/{id}"),
                    host_path: "/dev/null".into(),
                    permissions: "rw".into(),
                })
                .collect(),
            annotations: [(self.resource.clone(), joined)].into(),
            cdi_devices: vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_devices_and_markers_break_them() {
        let dir = tempfile::tempdir().unwrap();
        let s = Sample::create("example.com/widget", dir.path().join("w"), 3).unwrap();
        let health = |s: &Sample| s.list().into_iter().map(|d| (d.id, d.health)).collect::<Vec<_>>();
        assert_eq!(
            health(&s),
            [("widget-0", HEALTHY), ("widget-1", HEALTHY), ("widget-2", HEALTHY)]
                .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        std::fs::write(dir.path().join("w/widget-1.unhealthy"), "").unwrap();
        assert_eq!(health(&s)[1].1, UNHEALTHY);
        assert_eq!(std::fs::read_to_string(dir.path().join("w/widget-2")).unwrap(), "widget-2\n");

        let r = s.allocate(&["widget-0".into(), "widget-2".into()]);
        assert_eq!(r.envs["WIDGET_DEVICES"], "widget-0,widget-2");
        assert_eq!(r.mounts[1].container_path, "/devices/widget-2");
        assert!(r.mounts[1].read_only);
        assert_eq!(r.devices[0].container_path, "/dev/widget-0");
        assert_eq!(r.annotations["example.com/widget"], "widget-0,widget-2");
    }
}
