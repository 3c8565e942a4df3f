//! The route controller, for providers with a route table ([`Routes`]): every
//! `--route-reconciliation-period` each Node with a `spec.podCIDR` and an `InternalIP` gets a
//! route for that CIDR to that address, routes to Nodes that are gone (or whose CIDR or
//! address changed) are deleted, and a Node whose route exists gets the condition
//! `NetworkUnavailable=False` (`RouteCreated`), as upstream's controller writes it.
//!
//! [`plan`] is the decision (pure). The local provider has no route table (each kubelet
//! programs its own host's routes), so this controller does not run with it.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::provider::{Route, Routes};

/// The route each Node should have.
pub fn wanted(nodes: &[Node]) -> BTreeSet<Route> {
    nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.clone()?;
            let cidr = n.spec.as_ref()?.pod_cidr.clone().filter(|c| !c.is_empty())?;
            let ip: Ipv4Addr = n
                .status
                .as_ref()?
                .addresses
                .as_ref()?
                .iter()
                .find(|a| a.type_ == "InternalIP")
                .and_then(|a| a.address.parse().ok())?;
            Some(Route { node: name, destination: cidr, target: ip })
        })
        .collect()
}

/// The routes to create and to delete.
pub fn plan(wanted: &BTreeSet<Route>, have: &[Route]) -> (Vec<Route>, Vec<Route>) {
    let have: BTreeSet<Route> = have.iter().cloned().collect();
    (wanted.difference(&have).cloned().collect(), have.difference(wanted).cloned().collect())
}

async fn sync(client: &kube::Client, routes: &dyn Routes, cluster: &str) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let nodes = api.list(&ListParams::default()).await?.items;
    let want = wanted(&nodes);
    let have = routes.list(cluster).await?;
    let (create, delete) = plan(&want, &have);
    for r in &delete {
        routes.delete(cluster, r).await?;
        tracing::info!(node = %r.node, destination = %r.destination, "deleted route");
    }
    let (mut failed, mut errors) = (BTreeSet::new(), Vec::new());
    for r in &create {
        match routes.create(cluster, r).await {
            Ok(()) => tracing::info!(node = %r.node, destination = %r.destination, target = %r.target, "created route"),
            Err(e) => {
                errors.push(format!("route to {} for {}: {e}", r.destination, r.node));
                failed.insert(r.node.clone());
            }
        }
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    for r in want.iter().filter(|r| !failed.contains(&r.node)) {
        let node = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(&r.node));
        let done = node
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "NetworkUnavailable" && c.status == "False"));
        if !done {
            let patch = json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False",
                "reason": "RouteCreated", "message": "RouteController created a route",
                "lastTransitionTime": now, "lastHeartbeatTime": now}]}});
            api.patch_status(&r.node, &PatchParams::default(), &Patch::Strategic(&patch)).await?;
        }
    }
    if !errors.is_empty() {
        anyhow::bail!("[{}]", errors.join(", "));
    }
    Ok(())
}

pub async fn run(client: kube::Client, routes: Arc<dyn Routes>, cluster: String, period: Duration) {
    loop {
        let r = sync(&client, routes.as_ref(), &cluster).await;
        if let Err(e) = &r {
            tracing::warn!(error = %format!("{e:#}"), "route sync failed");
        }
        crate::metrics::sync("route", r.is_ok());
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, cidr: Option<&str>, ip: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"podCIDR": cidr},
            "status": {"addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}]}
        }))
        .unwrap()
    }

    fn route(node: &str, dst: &str, ip: &str) -> Route {
        Route { node: node.into(), destination: dst.into(), target: ip.parse().unwrap() }
    }

    #[test]
    fn every_node_with_a_cidr_gets_a_route_and_stale_ones_go() {
        let nodes = [
            node("a", Some("10.244.0.0/24"), "192.168.1.10"),
            node("b", Some("10.244.1.0/24"), "192.168.1.11"),
            node("c", None, "192.168.1.12"),
        ];
        let want = wanted(&nodes);
        assert_eq!(want.len(), 2, "no CIDR, no route");
        let have = vec![
            route("a", "10.244.0.0/24", "192.168.1.10"),
            route("b", "10.244.1.0/24", "192.168.1.99"), // b moved
            route("gone", "10.244.7.0/24", "192.168.1.50"),
        ];
        let (create, delete) = plan(&want, &have);
        assert_eq!(create, vec![route("b", "10.244.1.0/24", "192.168.1.11")]);
        assert_eq!(
            delete,
            vec![route("b", "10.244.1.0/24", "192.168.1.99"), route("gone", "10.244.7.0/24", "192.168.1.50")]
        );
        let (create, delete) = plan(&want, &want.iter().cloned().collect::<Vec<_>>());
        assert!(create.is_empty() && delete.is_empty());
    }

    #[tokio::test]
    async fn the_mock_route_table_converges() {
        use crate::provider::mock::Mock;
        let mock = Mock::new();
        let want = wanted(&[node("a", Some("10.244.0.0/24"), "192.168.1.10")]);
        let (create, _) = plan(&want, &mock.list("c1").await.unwrap());
        for r in &create {
            mock.create("c1", r).await.unwrap();
        }
        assert_eq!(mock.list("c1").await.unwrap(), want.iter().cloned().collect::<Vec<_>>());
        assert!(mock.list("c2").await.unwrap().is_empty(), "routes are per cluster");
    }
}
