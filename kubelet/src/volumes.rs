//! Pod volumes on the node's disk, under `<root-dir>/pods/<uid>/volumes/<name>`:
//! emptyDir (a directory), hostPath (the host's path), configMap / secret / downwardAPI /
//! projected (files computed by the pure [`volume_files`] and rewritten on every sync),
//! persistentVolumeClaim (the bound PV's hostPath or local path, created when missing —
//! provisioned local-path volumes are `DirectoryOrCreate` — or its NFS export mounted with
//! `mount -t nfs` under the pod's directory: [`claim_source`] and [`nfs_mount_args`] decide,
//! [`mount_claims`] acts; a claim that is not usable yet keeps the pod's containers
//! `ContainerCreating` with a `FailedMount` event); an emptyDir with
//! `medium: Memory` is a tmpfs mounted there (`size=` its `sizeLimit`), unmounted by
//! [`remove_pod_dir`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::podconfig::{field_value, ConfigError, Lookups};

/// Files of a projected-style volume: relative path → (content, mode).
pub type Files = Vec<(String, Vec<u8>)>;

fn items(
    data: Vec<(String, Vec<u8>)>,
    items: &Option<Vec<KeyToPath>>,
    what: &str,
    optional: bool,
) -> Result<Files, ConfigError> {
    match items {
        None => Ok(data),
        Some(items) => {
            let mut out = Vec::new();
            for it in items {
                match data.iter().find(|(k, _)| *k == it.key) {
                    Some((_, v)) => out.push((it.path.clone(), v.clone())),
                    None if optional => {}
                    None => {
                        return Err(ConfigError(format!(
                            "configmap references non-existent config key: {} ({what})",
                            it.key
                        )));
                    }
                }
            }
            Ok(out)
        }
    }
}

fn cm_files(name: &str, its: &Option<Vec<KeyToPath>>, optional: bool, l: &Lookups) -> Result<Files, ConfigError> {
    match l.config_maps.get(name).and_then(Option::as_ref) {
        Some(cm) => {
            let mut data: Vec<(String, Vec<u8>)> =
                cm.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone().into_bytes())).collect();
            data.extend(cm.binary_data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())));
            items(data, its, name, optional)
        }
        None if optional => Ok(vec![]),
        None => Err(ConfigError(format!("configmap \"{name}\" not found"))),
    }
}

fn secret_files(name: &str, its: &Option<Vec<KeyToPath>>, optional: bool, l: &Lookups) -> Result<Files, ConfigError> {
    match l.secrets.get(name).and_then(Option::as_ref) {
        Some(s) => {
            let mut data: Vec<(String, Vec<u8>)> =
                s.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect();
            data.extend(s.string_data.iter().flatten().map(|(k, v)| (k.clone(), v.clone().into_bytes())));
            items(data, its, name, optional)
        }
        None if optional => Ok(vec![]),
        None => Err(ConfigError(format!("secret \"{name}\" not found"))),
    }
}

/// The files of a configMap, secret, downwardAPI or projected volume (None: another kind).
pub fn volume_files(
    pod: &Pod,
    v: &Volume,
    l: &Lookups,
    pod_ip: &str,
    host_ip: &str,
) -> Result<Option<Files>, ConfigError> {
    let downward = |items: &Vec<k8s_openapi::api::core::v1::DownwardAPIVolumeFile>| -> Result<Files, ConfigError> {
        let mut out = Vec::new();
        for f in items {
            if let Some(r) = &f.field_ref {
                out.push((f.path.clone(), field_value(pod, &r.field_path, pod_ip, host_ip)?.into_bytes()));
            }
        }
        Ok(out)
    };
    if let Some(c) = &v.config_map {
        return cm_files(&c.name, &c.items, c.optional == Some(true), l).map(Some);
    }
    if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        return secret_files(&name, &s.items, s.optional == Some(true), l).map(Some);
    }
    if let Some(d) = &v.downward_api {
        return downward(d.items.as_ref().unwrap_or(&vec![])).map(Some);
    }
    if let Some(p) = &v.projected {
        let mut out = Vec::new();
        for s in p.sources.iter().flatten() {
            if let Some(c) = &s.config_map {
                out.extend(cm_files(&c.name, &c.items, c.optional == Some(true), l)?);
            }
            if let Some(c) = &s.secret {
                out.extend(secret_files(&c.name, &c.items, c.optional == Some(true), l)?);
            }
            if let Some(d) = &s.downward_api {
                out.extend(downward(d.items.as_ref().unwrap_or(&vec![]))?);
            }
            if let Some(t) = &s.service_account_token {
                let key = (t.audience.clone().unwrap_or_default(), t.expiration_seconds.unwrap_or(3600));
                let token = l
                    .tokens
                    .get(&key)
                    .ok_or_else(|| ConfigError(format!("no service account token for audience {:?} yet", key.0)))?;
                out.push((t.path.clone(), token.clone().into_bytes()));
            }
        }
        return Ok(Some(out));
    }
    Ok(None)
}

pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid)
}

/// Host path of a bound claim's volume, looked up by the caller.
pub type ClaimPaths = HashMap<String, String>;

/// Make every volume of the pod exist on disk; volume name → host path.
pub fn prepare(
    root: &Path,
    pod: &Pod,
    l: &Lookups,
    claims: &ClaimPaths,
    pod_ip: &str,
    host_ip: &str,
) -> Result<HashMap<String, String>, ConfigError> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let base = pod_dir(root, &uid).join("volumes");
    let io = |e: std::io::Error, what: &Path| ConfigError(format!("{}: {e}", what.display()));
    let mut out = HashMap::new();
    for v in pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default() {
        let dir = base.join(&v.name);
        if let Some(h) = &v.host_path {
            let p = Path::new(&h.path);
            match h.type_.as_deref().unwrap_or("") {
                "DirectoryOrCreate" => std::fs::create_dir_all(p).map_err(|e| io(e, p))?,
                "FileOrCreate" if !p.exists() => {
                    if let Some(parent) = p.parent() {
                        std::fs::create_dir_all(parent).map_err(|e| io(e, parent))?;
                    }
                    std::fs::write(p, b"").map_err(|e| io(e, p))?;
                }
                "Directory" | "File" | "Socket" | "CharDevice" | "BlockDevice" if !p.exists() => {
                    return Err(ConfigError(format!("hostPath type check failed: {} does not exist", h.path)));
                }
                _ => {}
            }
            out.insert(v.name.clone(), h.path.clone());
            continue;
        }
        if let Some(c) = &v.persistent_volume_claim {
            match claims.get(&c.claim_name) {
                Some(p) => {
                    std::fs::create_dir_all(p).map_err(|e| io(e, Path::new(p)))?;
                    out.insert(v.name.clone(), p.clone());
                }
                None => {
                    return Err(ConfigError(format!(
                        "persistentvolumeclaim \"{}\" is not bound to a volume with a host path",
                        c.claim_name
                    )));
                }
            }
            continue;
        }
        std::fs::create_dir_all(&dir).map_err(|e| io(e, &dir))?;
        if let Some(files) = volume_files(pod, &v, l, pod_ip, host_ip)? {
            for (rel, data) in files {
                if rel.split('/').any(|p| p == "..") || rel.starts_with('/') {
                    return Err(ConfigError(format!("invalid path {rel:?} in volume {}", v.name)));
                }
                let f = dir.join(&rel);
                if let Some(parent) = f.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| io(e, parent))?;
                }
                if std::fs::read(&f).ok().as_deref() != Some(&data[..]) {
                    let tmp = f.with_extension("minik8s-tmp");
                    std::fs::write(&tmp, &data).map_err(|e| io(e, &tmp))?;
                    std::fs::rename(&tmp, &f).map_err(|e| io(e, &f))?;
                }
            }
        } else if let Some(ed) = v.empty_dir.as_ref().filter(|e| e.medium.as_deref() == Some("Memory")) {
            // A tmpfs mounted on the host at the volume's directory, then bind-mounted into
            // every container like any emptyDir: the pod's containers share it (Docker's
            // per-container `--tmpfs` could not be shared).
            if !is_tmpfs(&dir) {
                mount_tmpfs(&dir, &tmpfs_options(ed.size_limit.as_ref()))
                    .map_err(|e| ConfigError(format!("mounting a tmpfs for emptyDir {}: {e}", v.name)))?;
            }
        }
        out.insert(v.name.clone(), dir.to_string_lossy().into_owned());
    }
    Ok(out)
}

/// Where a bound claim's volume comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ClaimSource {
    /// A directory on this node (hostPath or local).
    HostPath(String),
    /// An NFS export: (volume name, `server:path`, read-only).
    Nfs(String, String, bool),
}

/// The source of claim `name` of namespace `ns`, given the claim and its volume as read; an
/// error is why the pod waits (Kubernetes' kubelet messages).
pub fn claim_source(
    ns: &str,
    name: &str,
    pvc: Option<&PersistentVolumeClaim>,
    pv: Option<&PersistentVolume>,
) -> Result<ClaimSource, String> {
    let Some(pvc) = pvc else { return Err(format!("persistentvolumeclaim \"{name}\" not found")) };
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(format!("can't start pod because PVC {ns}/{name} is being deleted"));
    }
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("");
    let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or("");
    if phase != "Bound" || volume.is_empty() {
        return Err(format!(
            "PVC {ns}/{name} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({volume:?})"
        ));
    }
    let Some(spec) = pv.and_then(|v| v.spec.as_ref()) else {
        return Err(format!("persistentvolume \"{volume}\" not found"));
    };
    if let Some(p) =
        spec.host_path.as_ref().map(|h| h.path.clone()).or_else(|| spec.local.as_ref().map(|l| l.path.clone()))
    {
        return Ok(ClaimSource::HostPath(p));
    }
    if let Some(n) = &spec.nfs {
        let export = format!("{}:{}", n.server, n.path);
        return Ok(ClaimSource::Nfs(volume.to_string(), export, n.read_only == Some(true)));
    }
    Err(format!("persistentvolume \"{volume}\" has no hostPath, local or nfs source this kubelet can mount"))
}

/// What this node offers for NFS mounts.
#[derive(Clone, Copy, Debug, Default)]
pub struct NfsSupport {
    /// `nfs` (or `nfs4`) is in `/proc/filesystems`.
    pub kernel: bool,
    /// An nfs module for the running kernel is installed (mount loads it).
    pub module: bool,
    /// `mount.nfs` (nfs-common) is installed.
    pub helper: bool,
}

impl NfsSupport {
    pub fn probe() -> Self {
        let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        NfsSupport {
            kernel: nfs_in_filesystems(&fs),
            module: !release.trim().is_empty()
                && Path::new(&format!("/lib/modules/{}/kernel/fs/nfs", release.trim())).exists(),
            helper: ["/sbin/mount.nfs", "/usr/sbin/mount.nfs"].iter().any(|p| Path::new(p).exists()),
        }
    }
}

/// Does `/proc/filesystems` list an NFS client?
pub fn nfs_in_filesystems(text: &str) -> bool {
    text.lines().any(|l| matches!(l.split_whitespace().last(), Some("nfs" | "nfs4")))
}

/// The `mount` arguments for an NFS volume at `target`, or why this node cannot mount it.
pub fn nfs_mount_args(
    volume: &str,
    export: &str,
    read_only: bool,
    target: &Path,
    support: NfsSupport,
) -> Result<Vec<String>, String> {
    let failed = |why: &str| format!("MountVolume.SetUp failed for volume \"{volume}\" : mount failed: {why}");
    if !support.kernel && !support.module {
        return Err(failed(
            "this node's kernel has no NFS client support (no nfs in /proc/filesystems and no nfs module installed); \
             NFS volumes need a node whose kernel has NFS and the nfs-common package",
        ));
    }
    if !support.helper {
        return Err(failed("mount.nfs not found: install nfs-common on the node"));
    }
    let mut args = vec!["-t".to_string(), "nfs".to_string()];
    if read_only {
        args.extend(["-o".to_string(), "ro".to_string()]);
    }
    args.extend([export.to_string(), target.to_string_lossy().into_owned()]);
    Ok(args)
}

/// Make each claim's volume usable on this node: claim name → host path (NFS exports are
/// mounted under the pod's directory, once).
pub fn mount_claims(
    root: &Path,
    pod: &Pod,
    sources: &HashMap<String, ClaimSource>,
    support: NfsSupport,
) -> Result<ClaimPaths, String> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut out = ClaimPaths::new();
    for (claim, src) in sources {
        match src {
            ClaimSource::HostPath(p) => {
                out.insert(claim.clone(), p.clone());
            }
            ClaimSource::Nfs(volume, export, ro) => {
                let target = pod_dir(root, &uid).join("volumes").join("kubernetes.io~nfs").join(claim);
                let mounted = mountinfo().lines().any(|l| l.split(' ').nth(4) == Some(&*target.to_string_lossy()));
                if !mounted {
                    let args = nfs_mount_args(volume, export, *ro, &target, support)?;
                    std::fs::create_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;
                    let out = std::process::Command::new("timeout")
                        .arg("30")
                        .arg("mount")
                        .args(&args)
                        .output()
                        .map_err(|e| format!("running mount: {e}"))?;
                    if !out.status.success() {
                        return Err(format!(
                            "MountVolume.SetUp failed for volume \"{volume}\" : mount failed: {}",
                            String::from_utf8_lossy(&out.stderr).trim()
                        ));
                    }
                }
                out.insert(claim.clone(), target.to_string_lossy().into_owned());
            }
        }
    }
    Ok(out)
}

/// The tmpfs options of a memory-backed emptyDir: world-writable like every emptyDir, and
/// `size=` the `sizeLimit` in bytes (without one, the kernel's default: half the RAM).
pub fn tmpfs_options(size_limit: Option<&Quantity>) -> String {
    match size_limit.map(|q| apimachinery::quantity::value(&q.0)).filter(|b| *b > 0) {
        Some(b) => format!("mode=1777,size={b}"),
        None => "mode=1777".to_string(),
    }
}

fn cstr(p: &Path) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other)
}

/// Whether `dir` is the root of a tmpfs.
fn is_tmpfs(dir: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let Ok(c) = cstr(dir) else { return false };
    // SAFETY: a valid NUL-terminated path and a zeroed statfs buffer the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0
        && st.f_type as i64 == TMPFS_MAGIC
        && mounts_under(&mountinfo(), dir.parent().unwrap_or(dir)).contains(&dir.to_path_buf())
}

fn mount_tmpfs(dir: &Path, options: &str) -> std::io::Result<()> {
    let target = cstr(dir)?;
    let opts = std::ffi::CString::new(options).map_err(std::io::Error::other)?;
    // SAFETY: valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn mountinfo() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()
}

/// The mount points strictly below `dir` in `/proc/self/mountinfo` text, deepest first
/// (the fifth field, with the kernel's octal escapes for space, tab, newline, backslash).
pub fn mounts_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let unescape =
        |s: &str| s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\");
    let mut out: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape(m)))
        .filter(|m| m.starts_with(dir) && m != dir)
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// Remove a pod's directory, unmounting its memory-backed emptyDirs first.
pub fn remove_pod_dir(root: &Path, uid: &str) {
    let dir = pod_dir(root, uid);
    for m in mounts_under(&mountinfo(), &dir) {
        let Ok(c) = cstr(&m) else { continue };
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            tracing::warn!(path = %m.display(), error = %std::io::Error::last_os_error(), "cannot unmount");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    #[test]
    fn config_map_and_downward_files() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"a": "b"}},
            "spec": {"containers": [], "volumes": [
                {"name": "c", "configMap": {"name": "cm", "items": [{"key": "k", "path": "sub/file"}]}},
                {"name": "d", "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                {"name": "m", "configMap": {"name": "missing"}},
                {"name": "e", "emptyDir": {}}
            ]}
        }))
        .unwrap();
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"k": "v", "other": "x"}})).unwrap();
        let l = Lookups { config_maps: HashMap::from([("cm".to_string(), Some(cm))]), ..Default::default() };
        let vols = pod.spec.as_ref().unwrap().volumes.clone().unwrap();
        assert_eq!(
            volume_files(&pod, &vols[0], &l, "", "").unwrap(),
            Some(vec![("sub/file".to_string(), b"v".to_vec())])
        );
        assert_eq!(volume_files(&pod, &vols[1], &l, "", "").unwrap(), Some(vec![("name".to_string(), b"p".to_vec())]));
        assert_eq!(volume_files(&pod, &vols[2], &l, "", "").unwrap_err().0, "configmap \"missing\" not found");
        assert_eq!(volume_files(&pod, &vols[3], &l, "", "").unwrap(), None);

        let root = tempfile::tempdir().unwrap();
        let mut ok = pod.clone();
        ok.spec.as_mut().unwrap().volumes.as_mut().unwrap().remove(2);
        let paths = prepare(root.path(), &ok, &l, &HashMap::new(), "", "").unwrap();
        assert_eq!(std::fs::read_to_string(format!("{}/sub/file", paths["c"])).unwrap(), "v");
        assert!(Path::new(&paths["e"]).is_dir());
    }

    #[test]
    fn claims_resolve_to_host_paths_or_nfs_exports_once_bound() {
        let pvc = |phase: &str, volume: &str| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {"volumeName": volume},
                "status": {"phase": phase}}))
            .unwrap()
        };
        let pv = |src: serde_json::Value| -> PersistentVolume { serde_json::from_value(json!({"spec": src})).unwrap() };
        assert_eq!(claim_source("ns", "c", None, None).unwrap_err(), "persistentvolumeclaim \"c\" not found");
        assert!(claim_source("ns", "c", Some(&pvc("Pending", "")), None).unwrap_err().contains("non-bound phase"));
        let host = pv(json!({"hostPath": {"path": "/data/v"}}));
        assert_eq!(
            claim_source("ns", "c", Some(&pvc("Bound", "v")), Some(&host)),
            Ok(ClaimSource::HostPath("/data/v".into()))
        );
        let local = pv(json!({"local": {"path": "/mnt/disk"}}));
        assert_eq!(
            claim_source("ns", "c", Some(&pvc("Bound", "v")), Some(&local)),
            Ok(ClaimSource::HostPath("/mnt/disk".into()))
        );
        let nfs = pv(json!({"nfs": {"server": "10.0.0.5", "path": "/exports", "readOnly": true}}));
        assert_eq!(
            claim_source("ns", "c", Some(&pvc("Bound", "v")), Some(&nfs)),
            Ok(ClaimSource::Nfs("v".into(), "10.0.0.5:/exports".into(), true))
        );
        assert!(claim_source("ns", "c", Some(&pvc("Bound", "v")), None).unwrap_err().contains("not found"));
        let mut deleting = pvc("Bound", "v");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(claim_source("ns", "c", Some(&deleting), Some(&host)).unwrap_err().contains("is being deleted"));
    }

    #[test]
    fn nfs_mounts_need_kernel_support_and_nfs_common() {
        let t = Path::new("/var/lib/kubelet/pods/u/volumes/kubernetes.io~nfs/data");
        let none = NfsSupport::default();
        let e = nfs_mount_args("v", "srv:/x", false, t, none).unwrap_err();
        assert!(e.contains("no NFS client support") && e.contains("nfs-common") && e.contains("\"v\""), "{e}");
        let no_helper = NfsSupport { kernel: true, module: false, helper: false };
        assert!(nfs_mount_args("v", "srv:/x", false, t, no_helper).unwrap_err().contains("mount.nfs not found"));
        let ok = NfsSupport { kernel: false, module: true, helper: true };
        assert_eq!(
            nfs_mount_args("v", "srv:/x", true, t, ok).unwrap(),
            ["-t", "nfs", "-o", "ro", "srv:/x", "/var/lib/kubelet/pods/u/volumes/kubernetes.io~nfs/data"]
        );
        assert!(nfs_in_filesystems("nodev\tsysfs\n\text4\nnodev\tnfs4\n"));
        assert!(!nfs_in_filesystems("nodev\tsysfs\n\text4\nnodev\tnfsd\n"));
    }

    #[test]
    fn tmpfs_options_follow_the_size_limit() {
        assert_eq!(tmpfs_options(Some(&Quantity("64Mi".into()))), "mode=1777,size=67108864");
        assert_eq!(tmpfs_options(Some(&Quantity("1G".into()))), "mode=1777,size=1000000000");
        assert_eq!(tmpfs_options(None), "mode=1777");
        assert_eq!(tmpfs_options(Some(&Quantity("0".into()))), "mode=1777");
    }

    #[test]
    fn mounts_below_a_directory_deepest_first() {
        let info = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
90 22 0:50 / /var/lib/kubelet/pods/u1/volumes/cache rw - tmpfs tmpfs rw,size=1024k
91 90 0:51 / /var/lib/kubelet/pods/u1/volumes/cache/inner rw - tmpfs tmpfs rw
92 22 0:52 / /var/lib/kubelet/pods/u1/volumes/with\\040space rw - tmpfs tmpfs rw
93 22 0:53 / /var/lib/kubelet/pods/u10/volumes/x rw - tmpfs tmpfs rw
";
        let got = mounts_under(info, Path::new("/var/lib/kubelet/pods/u1"));
        assert_eq!(
            got,
            vec![
                PathBuf::from("/var/lib/kubelet/pods/u1/volumes/cache/inner"),
                PathBuf::from("/var/lib/kubelet/pods/u1/volumes/cache"),
                PathBuf::from("/var/lib/kubelet/pods/u1/volumes/with space"),
            ]
        );
    }
}
