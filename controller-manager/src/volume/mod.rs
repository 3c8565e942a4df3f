//! Persistent volumes (`pkg/controller/volume/persistentvolume`, `pvprotection`,
//! `pvcprotection`) and the local-path dynamic provisioner:
//!
//! - `persistentvolume-binder` ([`binder`]): binds each claim to the smallest Available
//!   volume that satisfies it, honours pre-binding (`spec.volumeName`, a volume's
//!   `claimRef`), keeps the phases (claims Pending/Bound/Lost, volumes
//!   Available/Bound/Released/Failed), asks the class's provisioner for a volume when none
//!   matches, and reclaims released volumes (Retain keeps them Released; Delete removes the
//!   provisioned data and the volume).
//! - the local-path provisioner ([`localpath`], `rancher.io/local-path`): a directory per
//!   volume under `--local-path-dir` on the chosen node (the scheduler's
//!   `volume.kubernetes.io/selected-node` for WaitForFirstConsumer classes), published as a
//!   hostPath volume (`DirectoryOrCreate`: the kubelet creates the directory when it mounts
//!   it) with a required node affinity to that node. The directory is removed by a
//!   short-lived helper pod on that node, as rancher's local-path-provisioner does. The
//!   default StorageClass `local-path` is created at start when no class is the default.
//! - `pvc-protection` / `pv-protection` ([`protection`]): the apiserver adds the
//!   `kubernetes.io/pvc-protection` and `kubernetes.io/pv-protection` finalizers on create;
//!   these remove them once a deleted claim is used by no pod that may still run, and once
//!   a deleted volume is no longer Bound.
//!
//! Each decision is a pure function over the objects; the reconcile functions apply it.

pub mod binder;
pub mod localpath;
pub mod protection;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The claim's binding is complete (set on the claim by the binder).
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// The binder, not the user, set the claim's `volumeName` / the volume's `claimRef`.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// The node the scheduler chose for a WaitForFirstConsumer claim's first pod.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The provisioner asked to provision a claim (GA and beta keys, both set).
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// The provisioner that created a volume (`AnnDynamicallyProvisioned`).
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Marks the default StorageClass.
pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

/// The controllers of this module (Kubernetes' names).
pub const CONTROLLERS: &[&str] = &["persistentvolume-binder", "pvc-protection", "pv-protection"];

/// The flags of the volume controllers.
#[derive(clap::Args, Debug, Clone)]
pub struct VolumeArgs {
    /// The directory under which the local-path provisioner creates volumes on a node.
    #[arg(long, default_value = "/var/lib/minik8s/local-path")]
    pub local_path_dir: String,
    /// Image of the helper pod that removes a deleted local-path volume's directory.
    #[arg(long, default_value = "busybox")]
    pub local_path_helper_image: String,
    /// Create the default StorageClass `local-path` at start when no class is the default.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub default_storage_class: bool,
    /// How often every claim and volume is synced again.
    #[arg(long, default_value = "15s", value_parser = crate::parse_duration)]
    pub pvclaimbinder_sync_period: Duration,
}

pub fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

pub fn set_annotation(meta: &mut ObjectMeta, key: &str, value: &str) {
    meta.annotations.get_or_insert_with(BTreeMap::new).insert(key.to_string(), value.to_string());
}

/// The claim's class ("" = none asked for).
pub fn claim_class(c: &PersistentVolumeClaim) -> &str {
    c.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).unwrap_or("")
}

pub fn volume_class(v: &PersistentVolume) -> &str {
    v.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).unwrap_or("")
}

/// The storage a claim requests, in bytes.
pub fn requested(c: &PersistentVolumeClaim) -> i64 {
    c.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| apimachinery::quantity::value(&q.0))
        .unwrap_or(0)
}

/// A volume's storage capacity, in bytes.
pub fn capacity(v: &PersistentVolume) -> i64 {
    v.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map(|q| apimachinery::quantity::value(&q.0))
        .unwrap_or(0)
}

pub fn claim_phase(c: &PersistentVolumeClaim) -> &str {
    c.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

pub fn volume_phase(v: &PersistentVolume) -> &str {
    v.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

pub fn claim_volume_name(c: &PersistentVolumeClaim) -> &str {
    c.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or("")
}

/// Run one of [`CONTROLLERS`].
pub async fn run(
    which: &str,
    client: kube::Client,
    pods: crate::informer::Informer<k8s_openapi::api::core::v1::Pod>,
    recorder: common::events::Recorder,
    args: VolumeArgs,
) {
    match which {
        "persistentvolume-binder" => binder::run(client, recorder, args).await,
        "pvc-protection" => protection::run_claims(client, pods).await,
        "pv-protection" => protection::run_volumes(client).await,
        _ => tracing::error!(controller = which, "not a volume controller"),
    }
}

/// `r`, with an API error of status `code` (409 AlreadyExists, 404 NotFound) counted as done.
pub fn allow<T>(r: Result<T, kube::Error>, code: u16) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == code => Ok(()),
        Err(e) => Err(e),
    }
}
