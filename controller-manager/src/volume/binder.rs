//! The persistent volume binder (`pv_controller.go`'s `syncClaim` / `syncVolume`).
//!
//! [`find_best_match`], [`sync_claim`] and [`sync_volume`] decide; [`reconcile_claim`] and
//! [`reconcile_volume`] apply. Binding writes the volume first (its `claimRef`, guarded by
//! its resourceVersion, so two claims never take one volume), then the claim's
//! `volumeName` and annotations, then both statuses; every step is idempotent and a sync
//! that fails half-way finishes on the next one.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::events::{Recorder, NORMAL, WARNING};
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;

use super::*;
use crate::informer::{trigger, Informer};
use crate::runner::{run_controller, Policy};
use crate::Error;

/// An event to record: (type, reason, message).
pub type Ev = (&'static str, &'static str, String);

fn modes(v: &Option<Vec<String>>) -> &[String] {
    v.as_deref().unwrap_or_default()
}

fn claim_mode(c: &PersistentVolumeClaim) -> &str {
    c.spec.as_ref().and_then(|s| s.volume_mode.as_deref()).unwrap_or("Filesystem")
}

fn volume_mode(v: &PersistentVolume) -> &str {
    v.spec.as_ref().and_then(|s| s.volume_mode.as_deref()).unwrap_or("Filesystem")
}

/// `IsVolumeBoundToClaim`: the volume's claimRef names this claim (and its UID, if set).
pub fn is_bound_to(v: &PersistentVolume, c: &PersistentVolumeClaim) -> bool {
    let Some(r) = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else { return false };
    r.namespace == c.metadata.namespace
        && r.name == c.metadata.name
        && r.uid.as_deref().is_none_or(|u| u.is_empty() || Some(u) == c.metadata.uid.as_deref())
}

/// Why `v` cannot serve `c` (`checkVolumeSatisfyClaim`), if it cannot.
pub fn unsatisfied(v: &PersistentVolume, c: &PersistentVolumeClaim) -> Option<String> {
    if capacity(v) < requested(c) {
        return Some("requested PV is too small".into());
    }
    if volume_class(v) != claim_class(c) {
        return Some("storageClassName does not match".into());
    }
    if claim_mode(c) != volume_mode(v) {
        return Some("incompatible volumeMode".into());
    }
    let have = modes(&v.spec.as_ref().and_then(|s| s.access_modes.clone())).to_vec();
    if !modes(&c.spec.as_ref().and_then(|s| s.access_modes.clone())).iter().all(|m| have.contains(m)) {
        return Some("incompatible accessMode".into());
    }
    None
}

/// Does the volume's required node affinity admit the node (no affinity: every node)?
pub fn node_fits(v: &PersistentVolume, node: &str, labels: &BTreeMap<String, String>) -> bool {
    match v.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref()) {
        Some(sel) => apimachinery::scheduling::node_selector_matches(sel, node, labels),
        None => true,
    }
}

/// `findMatchingVolume`: a volume pre-bound to the claim (if it is big enough and its node
/// affinity admits `node`), else the smallest Available, unclaimed, not deleted volume with
/// the claim's class, volume mode, access modes (volumes with fewer modes first, as the
/// access-mode index orders them), labels its selector selects, at least the requested
/// capacity and (with `node`) a node affinity that admits the node. With `delay_binding`
/// and no node only pre-bound volumes match: the scheduler chooses the node first.
pub fn find_best_match(
    c: &PersistentVolumeClaim,
    volumes: &[Arc<PersistentVolume>],
    node: Option<(&str, &BTreeMap<String, String>)>,
    delay_binding: bool,
) -> Option<Arc<PersistentVolume>> {
    let want = requested(c);
    let claim_modes = modes(&c.spec.as_ref().and_then(|s| s.access_modes.clone())).to_vec();
    let selector = c.spec.as_ref().and_then(|s| s.selector.as_ref());
    let mut best: Option<(usize, i64, Arc<PersistentVolume>)> = None;
    for v in volumes {
        let vmodes = modes(&v.spec.as_ref().and_then(|s| s.access_modes.clone())).to_vec();
        if capacity(v) < want || claim_mode(c) != volume_mode(v) || v.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if !claim_modes.iter().all(|m| vmodes.contains(m)) {
            continue;
        }
        let affinity_ok = node.is_none_or(|(n, l)| node_fits(v, n, l));
        if is_bound_to(v, c) {
            return affinity_ok.then(|| v.clone());
        }
        if node.is_none() && delay_binding {
            continue;
        }
        if volume_phase(v) != "Available" || v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some() {
            continue;
        }
        if selector
            .is_some_and(|s| !apimachinery::labels::selects(Some(s), &v.metadata.labels.clone().unwrap_or_default()))
        {
            continue;
        }
        if volume_class(v) != claim_class(c) || !affinity_ok {
            continue;
        }
        let key = (vmodes.len(), capacity(v));
        if best.as_ref().is_none_or(|(m, q, _)| key < (*m, *q)) {
            best = Some((key.0, key.1, v.clone()));
        }
    }
    best.map(|(_, _, v)| v)
}

/// What a claim's sync does.
#[derive(Debug, Default, PartialEq)]
pub struct ClaimPlan {
    /// Bind (or finish binding) the claim to this volume.
    pub bind: Option<String>,
    /// Set the claim's phase to this.
    pub phase: Option<&'static str>,
    pub event: Option<Ev>,
    /// Ask the class's provisioner for a volume: (provisioner, class, selected node).
    pub provision: Option<(String, String, Option<String>)>,
}

fn pending(event: Option<Ev>) -> ClaimPlan {
    ClaimPlan { phase: Some("Pending"), event, ..Default::default() }
}

fn lost(c: &PersistentVolumeClaim, reason: &'static str, message: &str) -> ClaimPlan {
    // The event once, when the claim becomes Lost.
    let event = (claim_phase(c) != "Lost").then(|| (WARNING, reason, message.to_string()));
    ClaimPlan { phase: Some("Lost"), event, ..Default::default() }
}

/// `syncClaim`: the decision for one claim, given every volume, every class and the labels
/// of the node the scheduler selected for it (when it has `volume.kubernetes.io/selected-node`).
pub fn sync_claim(
    c: &PersistentVolumeClaim,
    volumes: &[Arc<PersistentVolume>],
    classes: &[Arc<StorageClass>],
    selected_node: Option<&BTreeMap<String, String>>,
) -> ClaimPlan {
    let volume_name = claim_volume_name(c);
    let find = |name: &str| volumes.iter().find(|v| v.metadata.name.as_deref() == Some(name));
    if annotation(&c.metadata, ANN_BIND_COMPLETED).is_some() {
        // syncBoundClaim
        const LOST: &str = "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!";
        if volume_name.is_empty() {
            return lost(c, "ClaimLost", LOST);
        }
        return match find(volume_name) {
            None => lost(c, "ClaimLost", LOST),
            Some(v) if v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_none() || is_bound_to(v, c) => {
                ClaimPlan { bind: Some(volume_name.to_string()), ..Default::default() }
            }
            Some(_) => {
                lost(c, "ClaimMisbound", "Two claims are bound to the same volume, this one is bound incorrectly")
            }
        };
    }
    if !volume_name.is_empty() {
        // Pre-bound by the user to a named volume.
        return match find(volume_name) {
            None => pending(None),
            Some(v) if v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_none() => match unsatisfied(v, c) {
                None => ClaimPlan { bind: Some(volume_name.to_string()), ..Default::default() },
                Some(why) => pending(Some((
                    WARNING,
                    "FailedBinding",
                    format!("Cannot bind to requested volume \"{volume_name}\": {why}"),
                ))),
            },
            Some(v) if is_bound_to(v, c) => ClaimPlan { bind: Some(volume_name.to_string()), ..Default::default() },
            Some(_) => pending(Some((
                WARNING,
                "FailedBinding",
                format!("volume \"{volume_name}\" already bound to a different claim."),
            ))),
        };
    }
    let class_name = claim_class(c);
    let class = classes.iter().find(|k| k.metadata.name.as_deref() == Some(class_name));
    let delay = class.is_some_and(|k| k.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    let node_name = annotation(&c.metadata, ANN_SELECTED_NODE);
    let node = node_name.zip(selected_node);
    if let Some(v) = find_best_match(c, volumes, node, delay) {
        return ClaimPlan { bind: v.metadata.name.clone(), ..Default::default() };
    }
    if delay && node_name.is_none() {
        return pending(Some((
            NORMAL,
            "WaitForFirstConsumer",
            "waiting for first consumer to be created before binding".into(),
        )));
    }
    if class_name.is_empty() {
        return pending(Some((
            NORMAL,
            "FailedBinding",
            "no persistent volumes available for this claim and no storage class is set".into(),
        )));
    }
    let Some(class) = class else {
        return pending(Some((
            WARNING,
            "ProvisioningFailed",
            format!("storageclass.storage.k8s.io \"{class_name}\" not found"),
        )));
    };
    let provisioner = class.provisioner.clone();
    let event = (
        NORMAL,
        "ExternalProvisioning",
        format!(
            "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
        ),
    );
    ClaimPlan {
        phase: Some("Pending"),
        event: Some(event),
        provision: Some((provisioner, class_name.to_string(), node_name.map(str::to_string))),
        ..Default::default()
    }
}

/// What a released volume's reclaim policy asks for.
#[derive(Debug, PartialEq)]
pub enum Reclaim {
    /// Retain: the volume stays Released until an administrator deals with it.
    Retain,
    /// Delete a volume this controller's provisioner made: its data, then the object.
    DeleteProvisioned,
    /// The policy cannot be carried out: the volume becomes Failed with this event.
    Fail(&'static str, String),
}

/// What a volume's sync does.
#[derive(Debug, Default, PartialEq)]
pub struct VolumePlan {
    pub phase: Option<&'static str>,
    /// Clear a claimRef the binder set (the claim is bound to another volume).
    pub unbind: bool,
    pub reclaim: Option<Reclaim>,
}

/// `syncVolume`: the decision for one volume, given its claim (`claimRef`'s namespace/name,
/// whatever its UID) if that exists.
pub fn sync_volume(v: &PersistentVolume, claim: Option<&PersistentVolumeClaim>) -> VolumePlan {
    let phase = volume_phase(v);
    let to = |p: &'static str| VolumePlan { phase: (phase != p).then_some(p), ..Default::default() };
    let Some(r) = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else { return to("Available") };
    let uid = r.uid.as_deref().unwrap_or("");
    if uid.is_empty() {
        // Pre-bound by the user; waits for its claim.
        return to("Available");
    }
    match claim.filter(|c| c.metadata.uid.as_deref() == Some(uid)) {
        None => {
            // The claim is gone: Released, then the reclaim policy.
            if phase == "Failed" {
                return VolumePlan::default();
            }
            if v.metadata.deletion_timestamp.is_some() {
                // Being deleted: Released (so pv-protection lets it go), no reclaim of its own.
                return VolumePlan { phase: (phase != "Released").then_some("Released"), ..Default::default() };
            }
            let policy =
                v.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref()).unwrap_or("Retain");
            let reclaim = match policy {
                "Retain" => Reclaim::Retain,
                "Delete" if annotation(&v.metadata, ANN_PROVISIONED_BY) == Some(localpath::PROVISIONER) => {
                    Reclaim::DeleteProvisioned
                }
                "Delete" => Reclaim::Fail(
                    "VolumeFailedDelete",
                    format!(
                        "error getting deleter volume plugin for volume \"{}\": no deletable volume plugin matched",
                        v.metadata.name.as_deref().unwrap_or("")
                    ),
                ),
                other => Reclaim::Fail(
                    "VolumeUnknownReclaimPolicy",
                    format!("Volume has unrecognized PersistentVolumeReclaimPolicy {other:?}"),
                ),
            };
            VolumePlan { phase: (phase != "Released").then_some("Released"), unbind: false, reclaim: Some(reclaim) }
        }
        Some(c) => {
            let bound_to = claim_volume_name(c);
            if bound_to.is_empty() {
                // The claim's sync finishes the binding.
                VolumePlan::default()
            } else if Some(bound_to) == v.metadata.name.as_deref() {
                to("Bound")
            } else if annotation(&v.metadata, ANN_BOUND_BY_CONTROLLER).is_some() {
                VolumePlan { phase: (phase != "Available").then_some("Available"), unbind: true, reclaim: None }
            } else {
                VolumePlan::default()
            }
        }
    }
}

// ------------------------------------------------------------------------ the shell

pub struct Ctx {
    pub client: kube::Client,
    pub volumes: Informer<PersistentVolume>,
    pub classes: Informer<StorageClass>,
    pub recorder: Recorder,
    pub provisioner_recorder: Recorder,
    pub args: VolumeArgs,
    /// The last event recorded per object, so a waiting claim is not reported every sync.
    last_event: Mutex<HashMap<String, (String, String)>>,
}

impl Ctx {
    /// Record `ev` about `obj` unless it is the same as the last one about it.
    fn event<K: kube::Resource<DynamicType = ()>>(&self, obj: &K, ev: &Ev) {
        let key = format!(
            "{}/{}/{}",
            K::kind(&()),
            obj.meta().namespace.as_deref().unwrap_or(""),
            obj.meta().name.as_deref().unwrap_or("")
        );
        let mut last = self.last_event.lock().unwrap_or_else(|e| e.into_inner());
        let now = (ev.1.to_string(), ev.2.clone());
        if last.get(&key) != Some(&now) {
            last.insert(key, now);
            self.recorder.event(obj, ev.0, ev.1, ev.2.clone());
        }
    }
}

fn requeue(ctx: &Ctx) -> Action {
    Action::requeue(ctx.args.pvclaimbinder_sync_period)
}

pub async fn reconcile_claim(c: Arc<PersistentVolumeClaim>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = c.metadata.namespace.clone().unwrap_or_default();
    let name = c.metadata.name.clone().unwrap_or_default();
    // Read the claim fresh: the binder's own writes must not be undone from a stale copy.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(c) = claims.get_opt(&name).await? else { return Ok(Action::await_change()) };
    let volumes = ctx.volumes.state();
    let classes = ctx.classes.state();
    let mut node_labels = None;
    if let Some(n) = annotation(&c.metadata, ANN_SELECTED_NODE) {
        if let Some(node) = Api::<Node>::all(ctx.client.clone()).get_opt(n).await? {
            node_labels = Some(node.metadata.labels.unwrap_or_default());
        }
    }
    let plan = sync_claim(&c, &volumes, &classes, node_labels.as_ref());
    tracing::debug!(claim = %format!("{ns}/{name}"), ?plan, "claim sync");
    if let Some(ev) = &plan.event {
        ctx.event(&c, ev);
    }
    if let Some(v) = &plan.bind {
        let Some(volume) = volumes.iter().find(|x| x.metadata.name.as_deref() == Some(v)) else {
            return Ok(Action::requeue(Duration::from_secs(1)));
        };
        bind(&ctx, &c, volume).await?;
        return Ok(requeue(&ctx));
    }
    if let Some(phase) = plan.phase {
        set_claim_phase(&ctx, &c, phase).await?;
    }
    if let Some((provisioner, class, node)) = &plan.provision {
        // Annotate the claim with the provisioner asked (the external-provisioner contract).
        if annotation(&c.metadata, ANN_STORAGE_PROVISIONER) != Some(provisioner.as_str()) {
            let patch = json!({"metadata": {"annotations": {
                ANN_STORAGE_PROVISIONER: provisioner, ANN_BETA_STORAGE_PROVISIONER: provisioner}}});
            claims.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        if provisioner == localpath::PROVISIONER {
            let class = classes.iter().find(|k| k.metadata.name.as_deref() == Some(class.as_str()));
            if let Some(class) = class {
                localpath::provision(&ctx, &c, class, node.clone()).await?;
                return Ok(Action::requeue(Duration::from_secs(2)));
            }
        }
    }
    Ok(requeue(&ctx))
}

async fn set_claim_phase(ctx: &Ctx, c: &PersistentVolumeClaim, phase: &str) -> Result<(), Error> {
    if claim_phase(c) == phase && c.status.as_ref().and_then(|s| s.phase.as_deref()).is_some() {
        return Ok(());
    }
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), c.metadata.namespace.as_deref().unwrap_or(""));
    let patch = json!({"status": {"phase": phase}});
    api.patch_status(c.metadata.name.as_deref().unwrap_or(""), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

async fn set_volume_phase(ctx: &Ctx, v: &PersistentVolume, phase: &str, message: Option<&str>) -> Result<(), Error> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let patch = json!({"status": {"phase": phase, "message": message}});
    api.patch_status(v.metadata.name.as_deref().unwrap_or(""), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// `bind`: volume claimRef → volume Bound → claim volumeName and annotations → claim Bound.
async fn bind(ctx: &Ctx, c: &PersistentVolumeClaim, v: &PersistentVolume) -> Result<(), Error> {
    let vname = v.metadata.name.clone().unwrap_or_default();
    let ns = c.metadata.namespace.clone().unwrap_or_default();
    let cname = c.metadata.name.clone().unwrap_or_default();
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let current = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let complete = current
        .is_some_and(|r| r.namespace == c.metadata.namespace && r.name == c.metadata.name && r.uid == c.metadata.uid);
    let mut v = v.clone();
    if !complete {
        let by_controller = current.is_none();
        let spec = v.spec.get_or_insert_with(Default::default);
        spec.claim_ref = Some(ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            api_version: Some("v1".into()),
            namespace: Some(ns.clone()),
            name: Some(cname.clone()),
            uid: c.metadata.uid.clone(),
            resource_version: c.metadata.resource_version.clone(),
            ..Default::default()
        });
        if by_controller {
            set_annotation(&mut v.metadata, ANN_BOUND_BY_CONTROLLER, "yes");
        }
        // Guarded by the cached resourceVersion: a stale cache is a 409 and a retry.
        v = pvs.replace(&vname, &PostParams::default(), &v).await?;
    }
    if volume_phase(&v) != "Bound" {
        set_volume_phase(ctx, &v, "Bound", None).await?;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let mut c = c.clone();
    if claim_volume_name(&c) != vname || annotation(&c.metadata, ANN_BIND_COMPLETED).is_none() {
        let spec = c.spec.get_or_insert_with(Default::default);
        if spec.volume_name.as_deref() != Some(vname.as_str()) {
            spec.volume_name = Some(vname.clone());
            set_annotation(&mut c.metadata, ANN_BOUND_BY_CONTROLLER, "yes");
        }
        set_annotation(&mut c.metadata, ANN_BIND_COMPLETED, "yes");
        c = claims.replace(&cname, &PostParams::default(), &c).await?;
    }
    let vspec = v.spec.clone().unwrap_or_default();
    let st = c.status.clone().unwrap_or_default();
    if st.phase.as_deref() != Some("Bound") || st.capacity != vspec.capacity || st.access_modes != vspec.access_modes {
        let patch =
            json!({"status": {"phase": "Bound", "capacity": vspec.capacity, "accessModes": vspec.access_modes}});
        claims.patch_status(&cname, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        tracing::info!(claim = %format!("{ns}/{cname}"), volume = %vname, "bound");
    }
    Ok(())
}

pub async fn reconcile_volume(v: Arc<PersistentVolume>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = v.metadata.name.clone().unwrap_or_default();
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let Some(v) = pvs.get_opt(&name).await? else { return Ok(Action::await_change()) };
    let claim = match v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
        Some(r) if r.uid.as_deref().is_some_and(|u| !u.is_empty()) => {
            // A live read: the cache must not make a bound volume look released.
            let api: Api<PersistentVolumeClaim> =
                Api::namespaced(ctx.client.clone(), r.namespace.as_deref().unwrap_or("default"));
            api.get_opt(r.name.as_deref().unwrap_or("")).await?
        }
        _ => None,
    };
    let plan = sync_volume(&v, claim.as_ref());
    tracing::debug!(volume = %name, ?plan, "volume sync");
    if plan.unbind {
        let mut nv = v.clone();
        if let Some(s) = nv.spec.as_mut() {
            s.claim_ref = None;
        }
        if let Some(a) = nv.metadata.annotations.as_mut() {
            a.remove(ANN_BOUND_BY_CONTROLLER);
        }
        pvs.replace(&name, &PostParams::default(), &nv).await?;
    }
    if let Some(p) = plan.phase {
        set_volume_phase(&ctx, &v, p, None).await?;
    }
    match plan.reclaim {
        None | Some(Reclaim::Retain) => {}
        Some(Reclaim::Fail(reason, message)) => {
            ctx.event(&v, &(WARNING, reason, message.clone()));
            set_volume_phase(&ctx, &v, "Failed", Some(&message)).await?;
        }
        Some(Reclaim::DeleteProvisioned) => {
            return localpath::delete(&ctx, &v).await;
        }
    }
    Ok(requeue(&ctx))
}

/// Make the default StorageClass `local-path` unless some class is the default already.
async fn ensure_default_class(client: &kube::Client) -> Result<(), Error> {
    let api: Api<StorageClass> = Api::all(client.clone());
    let classes = api.list(&ListParams::default()).await?;
    if classes.items.iter().any(|k| annotation(&k.metadata, ANN_DEFAULT_CLASS) == Some("true")) {
        return Ok(());
    }
    match api.create(&PostParams::default(), &localpath::default_class()).await {
        Ok(_) => tracing::info!(class = localpath::DEFAULT_CLASS, "created the default StorageClass"),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

pub async fn run(client: kube::Client, recorder: Recorder, args: VolumeArgs) {
    if args.default_storage_class {
        loop {
            match ensure_default_class(&client).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "creating the default StorageClass");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    }
    let volumes = Informer::start(Api::<PersistentVolume>::all(client.clone()));
    let claims = Informer::start(Api::<PersistentVolumeClaim>::all(client.clone()));
    let classes = Informer::start(Api::<StorageClass>::all(client.clone()));
    let provisioner_recorder = recorder.for_component(&format!("{}_{}", localpath::PROVISIONER, hostname()));
    let recorder = recorder.for_component("persistentvolume-controller");
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        volumes: volumes.clone(),
        classes: classes.clone(),
        recorder,
        provisioner_recorder,
        args,
        last_event: Mutex::default(),
    });
    let (claim_tx, claim_triggers) = trigger::<PersistentVolumeClaim>();
    let (volume_tx, volume_triggers) = trigger::<PersistentVolume>();
    // A volume's change brings back its claim; a claim's change its volume(s).
    let tx = claim_tx.clone();
    volumes.add_handler(move |v, _deleted| {
        if let Some(r) = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
            if let (Some(ns), Some(n)) = (&r.namespace, &r.name) {
                let _ = tx.send(ObjectRef::new(n).within(ns));
            }
        }
    });
    let store = volumes.clone();
    let vtx = volume_tx.clone();
    claims.add_handler(move |c, _deleted| {
        for v in store.state() {
            let named = !claim_volume_name(c).is_empty() && v.metadata.name.as_deref() == Some(claim_volume_name(c));
            let refers = v
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .is_some_and(|r| r.namespace == c.metadata.namespace && r.name == c.metadata.name);
            if named || refers {
                let _ = vtx.send(ObjectRef::from_obj(v.as_ref()));
            }
        }
    });
    // A new or changed class may let waiting claims provision.
    let cstore = claims.clone();
    let ctx2 = claim_tx.clone();
    classes.add_handler(move |_k, _deleted| {
        for c in cstore.state().iter().filter(|c| claim_volume_name(c).is_empty()) {
            let _ = ctx2.send(ObjectRef::from_obj(c.as_ref()));
        }
    });
    volumes.synced().await;
    claims.synced().await;
    classes.synced().await;
    let claim_controller =
        Controller::new(Api::<PersistentVolumeClaim>::all(client.clone()), watcher::Config::default())
            .reconcile_on(claim_triggers);
    let volume_controller =
        Controller::new(Api::<PersistentVolume>::all(client), watcher::Config::default()).reconcile_on(volume_triggers);
    let claim_policy = Policy { metric: "persistentvolume-binder", what: "claim", retry: Duration::from_secs(1) };
    let volume_policy = Policy { metric: "persistentvolume-binder", what: "volume", retry: Duration::from_secs(1) };
    tokio::join!(
        run_controller(claim_controller, reconcile_claim, ctx.clone(), claim_policy),
        run_controller(volume_controller, reconcile_volume, ctx, volume_policy),
    );
}

fn hostname() -> String {
    std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(name: &str, size: &str, class: &str, modes: &[&str]) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"size": size}},
            "spec": {"capacity": {"storage": size}, "accessModes": modes, "storageClassName": class,
                     "volumeMode": "Filesystem", "hostPath": {"path": format!("/v/{name}")}},
            "status": {"phase": "Available"}
        }))
        .unwrap()
    }

    fn pvc(name: &str, size: &str, class: Option<&str>, modes: &[&str]) -> PersistentVolumeClaim {
        let mut c: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"accessModes": modes, "resources": {"requests": {"storage": size}}, "volumeMode": "Filesystem"},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        c.spec.as_mut().unwrap().storage_class_name = class.map(str::to_string);
        c
    }

    fn arcs(v: Vec<PersistentVolume>) -> Vec<Arc<PersistentVolume>> {
        v.into_iter().map(Arc::new).collect()
    }

    fn name(v: Option<Arc<PersistentVolume>>) -> Option<String> {
        v.and_then(|v| v.metadata.name.clone())
    }

    fn class(name: &str, provisioner: &str, mode: &str) -> Arc<StorageClass> {
        Arc::new(
            serde_json::from_value(
                json!({"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}),
            )
            .unwrap(),
        )
    }

    fn bound_to(mut v: PersistentVolume, c: &PersistentVolumeClaim, uid: bool) -> PersistentVolume {
        v.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            namespace: c.metadata.namespace.clone(),
            name: c.metadata.name.clone(),
            uid: if uid { c.metadata.uid.clone() } else { None },
            ..Default::default()
        });
        v
    }

    #[test]
    fn the_smallest_volume_that_fits_wins() {
        let rwo = ["ReadWriteOnce"];
        let vols = arcs(vec![pv("big", "10Gi", "", &rwo), pv("small", "1Gi", "", &rwo), pv("tiny", "100Mi", "", &rwo)]);
        let c = pvc("c", "500Mi", Some(""), &rwo);
        assert_eq!(name(find_best_match(&c, &vols, None, false)).as_deref(), Some("small"));
        let huge = pvc("c", "20Gi", Some(""), &rwo);
        assert_eq!(name(find_best_match(&huge, &vols, None, false)), None);
        // Exactly the requested size fits.
        let exact = pvc("c", "1Gi", Some(""), &rwo);
        assert_eq!(name(find_best_match(&exact, &vols, None, false)).as_deref(), Some("small"));
    }

    #[test]
    fn class_modes_volume_mode_phase_and_selector_must_match() {
        let rwo = ["ReadWriteOnce"];
        let mut block = pv("block", "1Gi", "fast", &rwo);
        block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let mut released = pv("released", "1Gi", "fast", &rwo);
        released.status.as_mut().unwrap().phase = Some("Released".into());
        let vols = arcs(vec![
            pv("slow", "1Gi", "slow", &rwo),
            pv("rox", "1Gi", "fast", &["ReadOnlyMany"]),
            block,
            released,
            pv("both", "2Gi", "fast", &["ReadWriteOnce", "ReadOnlyMany"]),
            pv("fast", "5Gi", "fast", &rwo),
        ]);
        let c = pvc("c", "1Gi", Some("fast"), &rwo);
        // `both` is smaller, but a volume with fewer access modes is preferred.
        assert_eq!(name(find_best_match(&c, &vols, None, false)).as_deref(), Some("fast"));
        let c2 = pvc("c", "1Gi", Some("fast"), &["ReadWriteOnce", "ReadOnlyMany"]);
        assert_eq!(name(find_best_match(&c2, &vols, None, false)).as_deref(), Some("both"));
        let mut sel = pvc("c", "1Gi", Some("fast"), &rwo);
        sel.spec.as_mut().unwrap().selector =
            Some(serde_json::from_value(json!({"matchLabels": {"size": "3Gi"}})).unwrap());
        assert_eq!(name(find_best_match(&sel, &vols, None, false)), None);
        let sel2 = {
            let mut s = sel.clone();
            s.spec.as_mut().unwrap().selector =
                Some(serde_json::from_value(json!({"matchLabels": {"size": "2Gi"}})).unwrap());
            s
        };
        assert_eq!(name(find_best_match(&sel2, &vols, None, false)).as_deref(), Some("both"));
        let block_claim = {
            let mut b = pvc("c", "1Gi", Some("fast"), &rwo);
            b.spec.as_mut().unwrap().volume_mode = Some("Block".into());
            b
        };
        assert_eq!(name(find_best_match(&block_claim, &vols, None, false)).as_deref(), Some("block"));
    }

    #[test]
    fn pre_bound_volumes_and_node_affinity() {
        let rwo = ["ReadWriteOnce"];
        let c = pvc("c", "1Gi", Some("x"), &rwo);
        let other = pvc("other", "1Gi", Some("x"), &rwo);
        // A volume pre-bound to the claim wins over a smaller free one, even of another class.
        let vols = arcs(vec![pv("free", "1Gi", "x", &rwo), bound_to(pv("mine", "5Gi", "y", &rwo), &c, false)]);
        assert_eq!(name(find_best_match(&c, &vols, None, false)).as_deref(), Some("mine"));
        // A volume pre-bound to another claim is never taken.
        let vols = arcs(vec![bound_to(pv("theirs", "1Gi", "x", &rwo), &other, true)]);
        assert_eq!(name(find_best_match(&c, &vols, None, false)), None);
        // Delayed binding: only with the selected node, whose labels the affinity must admit.
        let mut local = pv("local", "1Gi", "x", &rwo);
        local.spec.as_mut().unwrap().node_affinity = Some(
            serde_json::from_value(json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}))
            .unwrap(),
        );
        let vols = arcs(vec![local]);
        assert_eq!(name(find_best_match(&c, &vols, None, true)), None);
        let n1 = BTreeMap::from([("kubernetes.io/hostname".to_string(), "n1".to_string())]);
        let n2 = BTreeMap::from([("kubernetes.io/hostname".to_string(), "n2".to_string())]);
        assert_eq!(name(find_best_match(&c, &vols, Some(("n1", &n1)), true)).as_deref(), Some("local"));
        assert_eq!(name(find_best_match(&c, &vols, Some(("n2", &n2)), true)), None);
    }

    #[test]
    fn unbound_claims_wait_provision_or_report() {
        let rwo = ["ReadWriteOnce"];
        let classes = vec![
            class("wffc", localpath::PROVISIONER, "WaitForFirstConsumer"),
            class("now", localpath::PROVISIONER, "Immediate"),
            class("none", "kubernetes.io/no-provisioner", "Immediate"),
        ];
        let vols = arcs(vec![pv("small", "1Gi", "none", &rwo)]);
        let p = sync_claim(&pvc("c", "1Gi", Some("wffc"), &rwo), &vols, &classes, None);
        assert_eq!((p.phase, p.event.as_ref().map(|e| e.1)), (Some("Pending"), Some("WaitForFirstConsumer")));
        assert!(p.provision.is_none());
        let mut selected = pvc("c", "1Gi", Some("wffc"), &rwo);
        set_annotation(&mut selected.metadata, ANN_SELECTED_NODE, "n1");
        let p = sync_claim(&selected, &vols, &classes, Some(&BTreeMap::new()));
        assert_eq!(p.provision, Some((localpath::PROVISIONER.into(), "wffc".into(), Some("n1".into()))));
        let p = sync_claim(&pvc("c", "1Gi", Some("now"), &rwo), &vols, &classes, None);
        assert_eq!(p.provision, Some((localpath::PROVISIONER.into(), "now".into(), None)));
        // Bigger than any volume of a class without a provisioner: Pending, ExternalProvisioning.
        let p = sync_claim(&pvc("c", "5Gi", Some("none"), &rwo), &vols, &classes, None);
        assert_eq!((p.phase, p.event.as_ref().map(|e| e.1)), (Some("Pending"), Some("ExternalProvisioning")));
        let p = sync_claim(&pvc("c", "1Gi", Some("none"), &rwo), &vols, &classes, None);
        assert_eq!(p.bind.as_deref(), Some("small"));
        let p = sync_claim(&pvc("c", "1Gi", Some("missing"), &rwo), &vols, &classes, None);
        assert_eq!(p.event.as_ref().map(|e| e.1), Some("ProvisioningFailed"));
        let p = sync_claim(&pvc("c", "1Gi", Some(""), &rwo), &vols, &classes, None);
        assert_eq!(
            p.event.as_ref().map(|e| e.2.as_str()),
            Some("no persistent volumes available for this claim and no storage class is set")
        );
    }

    #[test]
    fn claims_pre_bound_by_name_and_bound_claims() {
        let rwo = ["ReadWriteOnce"];
        let mut c = pvc("c", "1Gi", Some("x"), &rwo);
        c.spec.as_mut().unwrap().volume_name = Some("v".into());
        assert_eq!(sync_claim(&c, &[], &[], None), pending(None));
        assert_eq!(sync_claim(&c, &arcs(vec![pv("v", "1Gi", "x", &rwo)]), &[], None).bind.as_deref(), Some("v"));
        let small = sync_claim(&c, &arcs(vec![pv("v", "100Mi", "x", &rwo)]), &[], None);
        assert_eq!(
            small.event.map(|e| e.2),
            Some("Cannot bind to requested volume \"v\": requested PV is too small".into())
        );
        let other = pvc("other", "1Gi", Some("x"), &rwo);
        let taken = sync_claim(&c, &arcs(vec![bound_to(pv("v", "1Gi", "x", &rwo), &other, true)]), &[], None);
        assert_eq!(taken.event.map(|e| e.1), Some("FailedBinding"));
        // Bound (bind-completed): the volume gone is Lost, once.
        set_annotation(&mut c.metadata, ANN_BIND_COMPLETED, "yes");
        let p = sync_claim(&c, &[], &[], None);
        assert_eq!((p.phase, p.event.as_ref().map(|e| e.1)), (Some("Lost"), Some("ClaimLost")));
        c.status.as_mut().unwrap().phase = Some("Lost".into());
        assert_eq!(sync_claim(&c, &[], &[], None).event, None);
        let misbound = sync_claim(&c, &arcs(vec![bound_to(pv("v", "1Gi", "x", &rwo), &other, true)]), &[], None);
        assert_eq!(misbound.phase, Some("Lost"));
        let ok = sync_claim(&c, &arcs(vec![bound_to(pv("v", "1Gi", "x", &rwo), &c, true)]), &[], None);
        assert_eq!(ok.bind.as_deref(), Some("v"));
    }

    #[test]
    fn volumes_follow_their_claims_and_reclaim_policy() {
        let rwo = ["ReadWriteOnce"];
        let mut c = pvc("c", "1Gi", Some("x"), &rwo);
        let free = pv("v", "1Gi", "x", &rwo);
        assert_eq!(sync_volume(&free, None), VolumePlan::default());
        let mut pending = free.clone();
        pending.status.as_mut().unwrap().phase = Some("Pending".into());
        assert_eq!(sync_volume(&pending, None).phase, Some("Available"));
        let v = bound_to(free.clone(), &c, true);
        // Claim not bound yet: the claim's sync finishes it.
        assert_eq!(sync_volume(&v, Some(&c)), VolumePlan::default());
        c.spec.as_mut().unwrap().volume_name = Some("v".into());
        assert_eq!(sync_volume(&v, Some(&c)).phase, Some("Bound"));
        // The claim went (or was recreated: another UID): Released, then the policy.
        let mut retain = v.clone();
        retain.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        let p = sync_volume(&retain, None);
        assert_eq!((p.phase, p.reclaim), (Some("Released"), Some(Reclaim::Retain)));
        let mut recreated = c.clone();
        recreated.metadata.uid = Some("new".into());
        assert_eq!(sync_volume(&retain, Some(&recreated)).phase, Some("Released"));
        // A volume deleted with its claim is Released (pv-protection then drops its finalizer)
        // and reclaims nothing itself.
        let mut deleting = retain.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(crate::testutil::now()));
        let p = sync_volume(&deleting, None);
        assert_eq!((p.phase, p.reclaim, p.unbind), (Some("Released"), None, false));
        let mut delete = v.clone();
        delete.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
        assert!(matches!(sync_volume(&delete, None).reclaim, Some(Reclaim::Fail("VolumeFailedDelete", _))));
        set_annotation(&mut delete.metadata, ANN_PROVISIONED_BY, localpath::PROVISIONER);
        assert_eq!(sync_volume(&delete, None).reclaim, Some(Reclaim::DeleteProvisioned));
        delete.status.as_mut().unwrap().phase = Some("Failed".into());
        assert_eq!(sync_volume(&delete, None), VolumePlan::default());
        // The claim is bound elsewhere: a controller-made binding is undone.
        let mut elsewhere = c.clone();
        elsewhere.spec.as_mut().unwrap().volume_name = Some("w".into());
        let mut by_ctrl = v.clone();
        set_annotation(&mut by_ctrl.metadata, ANN_BOUND_BY_CONTROLLER, "yes");
        assert!(sync_volume(&by_ctrl, Some(&elsewhere)).unbind);
        assert!(!sync_volume(&v, Some(&elsewhere)).unbind);
    }
}
