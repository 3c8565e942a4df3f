//! The garbage collector (`pkg/controller/garbagecollector`). It watches every served
//! resource that can be listed, watched, deleted and patched ([`monitors`], following
//! the discovery catalog as CRDs come and go), keeps the ownerReferences graph, and
//! - deletes dependents whose owners are all **verified** absent (background cascading
//!   deletion) — see [`graph`] for the rule that keeps data safe;
//! - for an owner being deleted with the `foregroundDeletion` finalizer, deletes its
//!   dependents and removes the finalizer once no dependent with
//!   `blockOwnerDeletion: true` remains;
//! - for an owner being deleted with the `orphan` finalizer, removes the owner's
//!   reference from every dependent, then the finalizer;
//! - drops references to verified-absent owners from dependents that still have live
//!   owners.
//!
//! The apiserver sets those finalizers from `DeleteOptions.propagationPolicy` (what
//! `kubectl delete --cascade=foreground|orphan` sends). This module is the I/O shell: it
//! reads the owners the graph does not hold ([`read_owner`]), applies the plan, and
//! reports invalid references as `OwnerRefInvalidNamespace` warning events.

pub mod graph;
pub mod monitors;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::events::{Recorder, WARNING};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy};
use serde_json::json;
use tokio::sync::{watch, Notify};

use crate::discovery::Catalog;
use graph::{GcAction, Graph, Node, OwnerKey, OwnerState};
use monitors::{DeletedUids, Monitors};

/// How long a live read that found an owner present is trusted (the owner's monitor
/// normally holds it long before).
const PRESENT_TTL: Duration = Duration::from_secs(30);

/// Owner references the last pass could not resolve (kind not served, or a read that
/// failed): their dependents wait. Exposed on `/metrics`.
fn unresolved_gauge() -> Option<&'static prometheus::IntGauge> {
    static G: OnceLock<Option<prometheus::IntGauge>> = OnceLock::new();
    G.get_or_init(|| {
        let g = prometheus::IntGauge::new(
            "garbagecollector_unresolved_owner_references",
            "Owner references the garbage collector could not resolve in its last pass; their dependents are kept",
        )
        .ok()?;
        prometheus::register(Box::new(g.clone())).ok()?;
        Some(g)
    })
    .as_ref()
}

/// What a live read of an owner answered, as a verdict. Only a 404 that names the object
/// is an absence: a 404 without a name means the path is not served (the kind went away
/// between discovery and the read), which says nothing about the owner.
pub fn verdict(key: &OwnerKey, read: Result<&DynamicObject, &kube::Error>) -> OwnerState {
    match read {
        Ok(o) if o.metadata.uid.as_deref() == Some(key.uid.as_str()) => OwnerState::Present,
        Ok(_) => OwnerState::Absent,
        Err(kube::Error::Api(s))
            if s.code == 404 && s.details.as_ref().is_some_and(|d| !d.name.is_empty() && d.name == key.name) =>
        {
            OwnerState::Absent
        }
        Err(_) => OwnerState::Unknown,
    }
}

/// What the collector remembers between passes.
#[derive(Default)]
struct Memory {
    /// Verified absences (never change: uids are not reused).
    absent: HashSet<OwnerKey>,
    /// Recent reads that found the owner.
    present: HashMap<OwnerKey, Instant>,
    /// Unresolvable references already logged, and invalid ones already reported.
    logged: HashSet<OwnerKey>,
    reported: HashSet<(String, String)>,
}

/// Read an owner the graph does not hold: resolve its kind through the catalog, then GET
/// it by name where the dependent may reference it.
async fn read_owner(client: &kube::Client, catalog: &Catalog, key: &OwnerKey) -> Result<OwnerState, String> {
    let Some(served) = catalog.resolve(&key.api_version, &key.kind) else {
        return Err(format!("kind {} of apiVersion {} is not served", key.kind, key.api_version));
    };
    let api: Api<DynamicObject> = match (served.namespaced(), key.namespace.as_deref()) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &served.ar),
        (true, None) => return Err("a cluster-scoped object cannot be owned by a namespaced object".into()),
        (false, _) => Api::all_with(client.clone(), &served.ar),
    };
    let read = api.get(&key.name).await;
    match verdict(key, read.as_ref()) {
        OwnerState::Unknown => Err(match read {
            Err(e) => e.to_string(),
            Ok(_) => "unexpected answer".into(),
        }),
        v => Ok(v),
    }
}

/// Verdicts on every owner the plan needs.
async fn resolve(
    client: &kube::Client,
    catalog: &Catalog,
    deleted: &std::sync::Mutex<DeletedUids>,
    memory: &mut Memory,
    keys: Vec<OwnerKey>,
) -> HashMap<OwnerKey, OwnerState> {
    let mut states = HashMap::new();
    let mut unresolved = 0;
    let now = Instant::now();
    memory.present.retain(|_, t| now.duration_since(*t) < PRESENT_TTL);
    for key in keys {
        let seen_deleted = deleted.lock().map(|d| d.contains(&key.uid)).unwrap_or(false);
        let state = if seen_deleted || memory.absent.contains(&key) {
            OwnerState::Absent
        } else if memory.present.contains_key(&key) {
            OwnerState::Present
        } else {
            match read_owner(client, catalog, &key).await {
                Ok(s) => s,
                Err(why) => {
                    unresolved += 1;
                    if memory.logged.insert(key.clone()) {
                        tracing::warn!(owner = ?key, reason = %why, "cannot verify an owner; its dependents are kept");
                    }
                    OwnerState::Unknown
                }
            }
        };
        match state {
            OwnerState::Absent => {
                memory.absent.insert(key.clone());
            }
            OwnerState::Present => {
                memory.present.entry(key.clone()).or_insert(now);
            }
            OwnerState::Unknown => {}
        }
        states.insert(key, state);
    }
    if let Some(g) = unresolved_gauge() {
        g.set(unresolved);
    }
    states
}

fn api_for(client: &kube::Client, monitors: &Monitors, n: &Node) -> Api<DynamicObject> {
    let m = &monitors.list[n.resource];
    match (m.namespaced, n.namespace.as_deref()) {
        (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &m.ar),
        _ => Api::all_with(client.clone(), &m.ar),
    }
}

async fn apply(
    client: &kube::Client,
    monitors: &Monitors,
    nodes: &[Node],
    action: &GcAction,
) -> Result<(), kube::Error> {
    let pp = PatchParams::default();
    match action {
        GcAction::Delete { node, policy } => {
            let n = &nodes[*node];
            let dp = DeleteParams {
                propagation_policy: Some(match *policy {
                    "Foreground" => PropagationPolicy::Foreground,
                    "Orphan" => PropagationPolicy::Orphan,
                    _ => PropagationPolicy::Background,
                }),
                preconditions: Some(Preconditions { uid: Some(n.uid.clone()), resource_version: None }),
                ..Default::default()
            };
            tracing::info!(kind = %n.kind, name = %n.name, namespace = ?n.namespace, policy, "garbage collecting");
            api_for(client, monitors, n).delete(&n.name, &dp).await.map(|_| ())
        }
        GcAction::RemoveOwnerRefs { node, owner_uids } => {
            let n = &nodes[*node];
            let refs: Vec<_> = n.owners.iter().filter(|o| !owner_uids.contains(&o.uid)).collect();
            let patch =
                json!({"metadata": {"ownerReferences": refs, "resourceVersion": n.resource_version, "uid": n.uid}});
            tracing::info!(kind = %n.kind, name = %n.name, namespace = ?n.namespace, owners = ?owner_uids, "removing owner references");
            api_for(client, monitors, n).patch(&n.name, &pp, &Patch::Merge(&patch)).await.map(|_| ())
        }
        GcAction::RemoveFinalizer { node, finalizer } => {
            let n = &nodes[*node];
            let fins: Vec<&String> = n.finalizers.iter().filter(|f| f != finalizer).collect();
            let patch = json!({"metadata": {"finalizers": fins, "resourceVersion": n.resource_version, "uid": n.uid}});
            api_for(client, monitors, n).patch(&n.name, &pp, &Patch::Merge(&patch)).await.map(|_| ())
        }
    }
}

/// Report references Kubernetes calls `OwnerRefInvalidNamespace`, once each.
fn report_invalid(recorder: &Recorder, memory: &mut Memory, nodes: &[Node], g: &Graph) {
    for r in g.invalid_refs() {
        let n = &nodes[r.node];
        if !memory.reported.insert((n.uid.clone(), r.owner.uid.clone())) {
            continue;
        }
        let ns = n.namespace.clone().unwrap_or_default();
        let message = format!(
            "ownerRef [{}/{}, namespace: {ns}, name: {}, uid: {}] does not exist in namespace {ns:?}",
            r.owner.api_version, r.owner.kind, r.owner.name, r.owner.uid
        );
        tracing::warn!(kind = %n.kind, name = %n.name, namespace = %ns, %message, "invalid owner reference");
        let involved = ObjectReference {
            api_version: Some(n.api_version.clone()),
            kind: Some(n.kind.clone()),
            name: Some(n.name.clone()),
            namespace: n.namespace.clone(),
            uid: Some(n.uid.clone()),
            ..Default::default()
        };
        recorder.event_on(involved, WARNING, "OwnerRefInvalidNamespace", message);
    }
}

/// Run the collector: monitors follow `catalog`; a pass runs after every burst of watch
/// events, and at least every 10 s.
pub async fn run(client: kube::Client, mut catalog: watch::Receiver<Arc<Catalog>>, recorder: Recorder) {
    let notify = Arc::new(Notify::new());
    let mut monitors = Monitors::new(client.clone(), notify.clone());
    let mut memory = Memory::default();
    let mut current = catalog.borrow_and_update().clone();
    monitors.sync(&current);
    // The first pass waits for every monitor's first list (at most a minute), so the
    // graph is whole before anything is decided.
    let start = Instant::now();
    while !monitors.all_synced() && start.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::info!(resources = monitors.list.len(), "garbage collector synced");
    loop {
        tokio::select! {
            _ = tokio::time::timeout(Duration::from_secs(10), notify.notified()) => {}
            changed = catalog.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let latest = catalog.borrow_and_update().clone();
        if !Arc::ptr_eq(&latest, &current) {
            let (started, stopped) = monitors.sync(&latest);
            tracing::info!(started, stopped, resources = monitors.list.len(), "garbage collector monitors changed");
            current = latest;
        }
        // Let a burst of events settle.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let nodes = monitors.snapshot();
        let g = Graph::new(&nodes);
        report_invalid(&recorder, &mut memory, &nodes, &g);
        let states = resolve(&client, &current, &monitors.deleted, &mut memory, g.lookups()).await;
        let actions = g.plan(&states, monitors.all_synced());
        let mut progressed = false;
        for a in &actions {
            let r = apply(&client, &monitors, &nodes, a).await;
            crate::metrics::sync("garbagecollector", r.is_ok());
            match r {
                Ok(()) => progressed = true,
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => tracing::warn!(error = %e, "garbage collector action failed"),
            }
        }
        if progressed {
            // Look again soon even without events.
            notify.notify_one();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::response::StatusDetails;
    use kube::core::Status;

    fn key() -> OwnerKey {
        OwnerKey {
            namespace: Some("default".into()),
            api_version: "demo.example.com/v1".into(),
            kind: "Greeting".into(),
            name: "g2".into(),
            uid: "u1".into(),
        }
    }

    fn not_found(name: &str) -> kube::Error {
        kube::Error::Api(
            Status::failure("not found", "NotFound")
                .with_code(404)
                .with_details(serde_json::from_value::<StatusDetails>(json!({"name": name})).expect("details"))
                .boxed(),
        )
    }

    #[test]
    fn only_a_404_naming_the_owner_or_another_uid_is_an_absence() {
        let mut o = DynamicObject::new(
            "g2",
            &kube::discovery::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        );
        o.metadata.uid = Some("u1".into());
        assert_eq!(verdict(&key(), Ok(&o)), OwnerState::Present);
        o.metadata.uid = Some("u2".into());
        assert_eq!(verdict(&key(), Ok(&o)), OwnerState::Absent, "replaced by another object");
        assert_eq!(verdict(&key(), Err(&not_found("g2"))), OwnerState::Absent);
        // The path is not served (a CRD went away): a 404 with empty details.
        assert_eq!(verdict(&key(), Err(&not_found(""))), OwnerState::Unknown);
        let unavailable = kube::Error::Api(Status::failure("down", "ServiceUnavailable").with_code(503).boxed());
        assert_eq!(verdict(&key(), Err(&unavailable)), OwnerState::Unknown);
    }
}
