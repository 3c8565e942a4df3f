//! The thin API shell of the controller: Node create/patch, Lease acquire/renew (holder =
//! this replica's client id), pod status patch, final pod removal. Every function does one
//! request (or a get-then-write) and reports errors to the caller. Status patches do not
//! decode the object the apiserver answers with: the controller has no use for it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::Resource;
use serde_json::json;

use crate::metrics::METRICS;

pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// What a Lease attempt found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// This replica holds the Lease now.
    Held,
    /// Another replica holds a live Lease.
    HeldByOther,
    /// The attempt failed (network, server error).
    Failed,
}

/// Create `kube-node-lease` if missing.
pub async fn ensure_lease_namespace(client: &kube::Client) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta { name: Some(NODE_LEASE_NAMESPACE.into()), ..Default::default() },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => tracing::warn!(error = %e, "creating namespace kube-node-lease"),
    }
}

/// The vnode Lease as this replica last wrote it (without managedFields): the next renewal
/// writes it again with one request, a compare-and-swap on its resourceVersion, as the
/// kubelet renews its node Lease from its last copy; if the Lease changed since (409), the
/// renewal reads it and decides again.
pub type KnownLease = Box<Lease>;

fn known(mut lease: Lease) -> KnownLease {
    lease.metadata.managed_fields = None;
    Box::new(lease)
}

/// One acquire-or-renew of the vnode's Lease (name = node name), compare-and-swap on its
/// resourceVersion (the decision is `common::leader::decide`). From `last` (what this
/// replica wrote last) a renewal is one write; otherwise, or when the Lease changed since,
/// it is a read then a write. Returns the outcome and, when held, the Lease as written.
pub async fn acquire_or_renew_lease(
    client: &kube::Client,
    node_name: &str,
    identity: &str,
    duration: Duration,
    last: Option<KnownLease>,
) -> (LeaseOutcome, Option<KnownLease>) {
    let api: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    if let Some(mut lease) = last {
        let decision = common::leader::decide(lease.spec.as_ref(), identity, duration, Timestamp::now());
        if let common::leader::Decision::Update(spec) = decision {
            lease.spec = Some(spec);
            METRICS.api_writes.with_label_values(&["lease"]).inc();
            match api.replace(node_name, &PostParams::default(), &lease).await {
                Ok(written) => return (LeaseOutcome::Held, Some(known(written))),
                // Changed since this replica wrote it: read it and decide again.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(error = %e, lease = %node_name, "renewing vnode lease");
                    return (LeaseOutcome::Failed, None);
                }
            }
        }
    }
    let current = match api.get_opt(node_name).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, lease = %node_name, "reading vnode lease");
            return (LeaseOutcome::Failed, None);
        }
    };
    METRICS.api_writes.with_label_values(&["lease"]).inc();
    let decision =
        common::leader::decide(current.as_ref().and_then(|l| l.spec.as_ref()), identity, duration, Timestamp::now());
    let result = match decision {
        common::leader::Decision::Wait => return (LeaseOutcome::HeldByOther, None),
        common::leader::Decision::Create(spec) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(node_name.into()),
                    namespace: Some(NODE_LEASE_NAMESPACE.into()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            api.create(&PostParams::default(), &lease).await
        }
        common::leader::Decision::Update(spec) => {
            let mut lease = current.unwrap_or_default();
            lease.spec = Some(spec);
            api.replace(node_name, &PostParams::default(), &lease).await
        }
    };
    match result {
        Ok(written) => (LeaseOutcome::Held, Some(known(written))),
        Err(kube::Error::Api(e)) if e.code == 409 => (LeaseOutcome::HeldByOther, None),
        Err(e) => {
            tracing::warn!(error = %e, lease = %node_name, "writing vnode lease");
            (LeaseOutcome::Failed, None)
        }
    }
}

/// Create the vnode, or bring an existing one's labels and our taints up to date; then
/// write its status.
pub async fn ensure_node(client: &kube::Client, node: &Node) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let name = node.metadata.name.clone().unwrap_or_default();
    METRICS.api_writes.with_label_values(&["node"]).inc();
    match api.get_opt(&name).await? {
        None => match api.create(&PostParams::default(), node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        },
        Some(existing) => {
            let mut taints: Vec<Taint> = existing.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
            let before = taints.len();
            for t in node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default() {
                if !taints.iter().any(|x| x.key == t.key && x.effect == t.effect) {
                    taints.push(t);
                }
            }
            let mut patch = json!({"metadata": {"labels": node.metadata.labels}});
            if taints.len() != before {
                patch["spec"] = json!({"taints": taints});
            }
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await?;
        }
    }
    if let Some(status) = &node.status {
        patch_node_status(client, &name, &StatusPatch::new(status)?).await?;
    }
    Ok(())
}

pub async fn patch_node_status(client: &kube::Client, name: &str, patch: &StatusPatch) -> anyhow::Result<()> {
    METRICS.api_writes.with_label_values(&["node_status"]).inc();
    patch_status(client, Node::url_path(&(), None), name, patch).await?;
    Ok(())
}

/// A merge patch of `{url_path}/{name}/status`; the object answered is not decoded.
async fn patch_status(client: &kube::Client, url_path: String, name: &str, patch: &StatusPatch) -> kube::Result<()> {
    let req = kube::core::Request::new(url_path)
        .patch_subresource("status", name, &PatchParams::default(), &Patch::Merge(&patch.0))
        .map_err(kube::Error::BuildRequest)?;
    client.request_text(req).await.map(drop)
}

/// A merge patch `{"status": …}`, serialized when it is made: writes wait in the background
/// (one per object, thousands at scale), and the JSON text is a fraction of the structs.
pub struct StatusPatch(Box<serde_json::value::RawValue>);

impl StatusPatch {
    pub fn new<T: serde::Serialize>(status: &T) -> anyhow::Result<Self> {
        Ok(StatusPatch(serde_json::value::to_raw_value(&json!({ "status": status }))?))
    }
}

/// Patch a module pod's status; a pod already gone is fine.
pub async fn patch_pod_status(client: &kube::Client, ns: &str, name: &str, patch: &StatusPatch) -> anyhow::Result<()> {
    METRICS.api_writes.with_label_values(&["pod_status"]).inc();
    match patch_status(client, Pod::url_path(&(), Some(ns)), name, patch).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The pod's final removal (grace period 0, only this incarnation by UID).
pub async fn delete_pod(client: &kube::Client, ns: &str, name: &str, uid: Option<String>) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    METRICS.api_writes.with_label_values(&["pod_delete"]).inc();
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: uid.map(|uid| Preconditions { uid: Some(uid), resource_version: None }),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
