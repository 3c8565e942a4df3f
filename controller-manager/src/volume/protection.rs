//! `pvc-protection` and `pv-protection` (`pkg/controller/volume/pvcprotection`,
//! `pvprotection`): the finalizers the apiserver puts on every claim and volume are
//! removed only when deleting the object can lose nothing — a claim once no pod that may
//! still run uses it (a deleting pod still counts until it is gone), a volume once it is
//! no longer Bound. [`claim_in_use`] and [`volume_releasable`] decide.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::Resource;
use serde_json::json;

use super::*;
use crate::informer::{trigger, Informer};
use crate::runner::{run_controller, Policy};
use crate::Error;

/// Does a pod that may still run use the claim `namespace/name`? (`podIsShutDown`: only
/// Succeeded and Failed pods are done with it.)
pub fn claim_in_use(namespace: &str, name: &str, pods: &[Arc<Pod>]) -> bool {
    pods.iter().filter(|p| p.metadata.namespace.as_deref() == Some(namespace)).any(|p| {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("");
        phase != "Succeeded"
            && phase != "Failed"
            && p.spec.as_ref().and_then(|s| s.volumes.as_ref()).is_some_and(|vs| {
                vs.iter().any(|v| v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == name))
            })
    })
}

/// Whether a deleted volume's finalizer may go: it is not Bound.
pub fn volume_releasable(v: &PersistentVolume) -> bool {
    volume_phase(v) != "Bound"
}

fn has_finalizer<K: Resource>(obj: &K, f: &str) -> bool {
    obj.meta().finalizers.as_ref().is_some_and(|fs| fs.iter().any(|x| x == f))
}

/// The merge patch that drops finalizer `f`, guarded by the object's resourceVersion.
fn without<K: Resource>(obj: &K, f: &str) -> serde_json::Value {
    let rest: Vec<&String> = obj.meta().finalizers.iter().flatten().filter(|x| *x != f).collect();
    json!({"metadata": {"finalizers": rest, "resourceVersion": obj.meta().resource_version}})
}

struct ClaimCtx {
    client: kube::Client,
}

async fn reconcile_claim(c: Arc<PersistentVolumeClaim>, ctx: Arc<ClaimCtx>) -> Result<Action, Error> {
    if c.metadata.deletion_timestamp.is_none() || !has_finalizer(c.as_ref(), PVC_PROTECTION) {
        return Ok(Action::await_change());
    }
    let ns = c.metadata.namespace.clone().unwrap_or_default();
    let name = c.metadata.name.clone().unwrap_or_default();
    // A live list: a pod the cache has not seen yet must keep the claim.
    let pods: Vec<Arc<Pod>> = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    if claim_in_use(&ns, &name, &pods) {
        tracing::debug!(claim = %format!("{ns}/{name}"), "claim in use; keeping its finalizer");
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    allow(api.patch(&name, &PatchParams::default(), &Patch::Merge(&without(c.as_ref(), PVC_PROTECTION))).await, 404)?;
    tracing::info!(claim = %format!("{ns}/{name}"), "removed the pvc-protection finalizer");
    Ok(Action::await_change())
}

pub async fn run_claims(client: kube::Client, pods: Informer<Pod>) {
    let ctx = Arc::new(ClaimCtx { client: client.clone() });
    let (tx, triggers) = trigger::<PersistentVolumeClaim>();
    // A pod that finishes or goes may free its claims.
    pods.add_handler(move |p, deleted| {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("");
        if deleted || phase == "Succeeded" || phase == "Failed" {
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            for v in p.spec.as_ref().and_then(|s| s.volumes.as_ref()).into_iter().flatten() {
                if let Some(c) = &v.persistent_volume_claim {
                    let _ = tx.send(ObjectRef::new(&c.claim_name).within(&ns));
                }
            }
        }
    });
    pods.synced().await;
    let controller =
        Controller::new(Api::<PersistentVolumeClaim>::all(client), watcher::Config::default()).reconcile_on(triggers);
    let policy = Policy { metric: "pvc-protection", what: "pvc-protection", retry: Duration::from_secs(1) };
    run_controller(controller, reconcile_claim, ctx, policy).await;
}

struct VolumeCtx {
    client: kube::Client,
}

async fn reconcile_volume(v: Arc<PersistentVolume>, ctx: Arc<VolumeCtx>) -> Result<Action, Error> {
    if v.metadata.deletion_timestamp.is_none() || !has_finalizer(v.as_ref(), PV_PROTECTION) {
        return Ok(Action::await_change());
    }
    if !volume_releasable(&v) {
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    let name = v.metadata.name.clone().unwrap_or_default();
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    allow(api.patch(&name, &PatchParams::default(), &Patch::Merge(&without(v.as_ref(), PV_PROTECTION))).await, 404)?;
    tracing::info!(volume = %name, "removed the pv-protection finalizer");
    Ok(Action::await_change())
}

pub async fn run_volumes(client: kube::Client) {
    let ctx = Arc::new(VolumeCtx { client: client.clone() });
    let controller = Controller::new(Api::<PersistentVolume>::all(client), watcher::Config::default());
    let policy = Policy { metric: "pv-protection", what: "pv-protection", retry: Duration::from_secs(1) };
    run_controller(controller, reconcile_volume, ctx, policy).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, claim: &str, phase: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": ns},
                "spec": {"containers": [], "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
                "status": {"phase": phase}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_claim_is_in_use_while_a_pod_may_run() {
        assert!(claim_in_use("ns", "data", &[pod("ns", "data", "Running")]));
        assert!(claim_in_use("ns", "data", &[pod("ns", "data", "Pending")]));
        assert!(!claim_in_use("ns", "data", &[pod("ns", "data", "Succeeded")]));
        assert!(!claim_in_use("ns", "data", &[pod("ns", "data", "Failed")]));
        assert!(!claim_in_use("ns", "data", &[pod("other", "data", "Running")]));
        assert!(!claim_in_use("ns", "data", &[pod("ns", "logs", "Running")]));
        // A deleting pod still holds it.
        let mut deleting = (*pod("ns", "data", "Running")).clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(crate::testutil::now()));
        assert!(claim_in_use("ns", "data", &[Arc::new(deleting)]));
    }

    #[test]
    fn a_volume_is_released_when_not_bound() {
        let v =
            |phase: &str| -> PersistentVolume { serde_json::from_value(json!({"status": {"phase": phase}})).unwrap() };
        assert!(!volume_releasable(&v("Bound")));
        assert!(volume_releasable(&v("Released")));
        assert!(volume_releasable(&v("Available")));
    }

    #[test]
    fn the_finalizer_patch_keeps_the_others() {
        let c: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "resourceVersion": "7", "finalizers": [PVC_PROTECTION, "example.com/x"]}}))
        .unwrap();
        assert!(has_finalizer(&c, PVC_PROTECTION));
        assert_eq!(
            without(&c, PVC_PROTECTION),
            json!({"metadata": {"finalizers": ["example.com/x"], "resourceVersion": "7"}})
        );
    }
}
