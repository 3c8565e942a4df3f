//! `kubelet-serving-csr-approving` (off by default): approves a kubelet's request for its
//! serving certificate (`kubernetes.io/kubelet-serving`) when the node asks for itself — the
//! requester is the subject `system:node:<name>` — and every name it asks for is one of that
//! Node's addresses. Kubernetes approves no such request by itself: a node writes its own
//! addresses, so this check trusts each node to report them honestly (what kubeadm's
//! documentation leaves to a person or to a third-party approver that checks the same);
//! `scripts/cluster` turns it on so that the apiserver can verify kubelets.
//!
//! [`decide`] is the decision (pure); [`reconcile`] reads the Node and writes `/approval`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;

use super::{has_condition, kubelet_serving_problems, request_of, Ctx, KUBELET_SERVING};
use crate::Error;

/// The message of the approval.
pub const MESSAGE: &str =
    "Auto approving kubelet serving certificate: the node asked for itself and every name is one of its addresses.";

/// What a request needs before it is approved.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Decided already, not a node's own serving request, or unreadable: left alone.
    Skip,
    /// Approve if the Node `node` has every one of `names` among its addresses.
    CheckNode { node: String, names: Vec<String> },
}

/// What to do with `csr`.
pub fn decide(csr: &CertificateSigningRequest) -> Decision {
    if has_condition(csr, "Approved") || has_condition(csr, "Denied") || csr.spec.signer_name != KUBELET_SERVING {
        return Decision::Skip;
    }
    let Ok(req) = request_of(csr) else { return Decision::Skip };
    if kubelet_serving_problems(csr, &req).is_some() || csr.spec.username.as_deref() != Some(&req.common_name) {
        return Decision::Skip;
    }
    let Some(node) = req.common_name.strip_prefix("system:node:").filter(|n| !n.is_empty()) else {
        return Decision::Skip;
    };
    let names = req.dns_names.iter().chain(&req.ip_addresses).cloned().collect();
    Decision::CheckNode { node: node.to_string(), names }
}

/// The names `node` has that are not its addresses (empty: all are).
pub fn foreign_names<'a>(node: &Node, names: &'a [String]) -> Vec<&'a str> {
    let addresses: Vec<&str> = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.iter().map(|a| a.address.as_str()).collect())
        .unwrap_or_default();
    names.iter().map(String::as_str).filter(|n| !addresses.contains(n)).collect()
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let Decision::CheckNode { node, names } = decide(&csr) else { return Ok(Action::await_change()) };
    let name = csr.metadata.name.clone().unwrap_or_default();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let Some(n) = nodes.get_opt(&node).await? else {
        // A kubelet asks before its Node is registered: look again shortly.
        return Ok(Action::requeue(Duration::from_secs(2)));
    };
    let foreign = foreign_names(&n, &names);
    if !foreign.is_empty() {
        tracing::info!(csr = %name, node, ?foreign, "not approving a serving certificate: names the Node does not have");
        // The Node may not have reported the address yet.
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let body = super::approver::approved(&csr, MESSAGE, Time(k8s_openapi::jiff::Timestamp::now()));
    match api.replace_subresource("approval", &name, &PostParams::default(), &body).await {
        Ok(_) => tracing::info!(csr = %name, node, "approved a kubelet serving certificate"),
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

/// Run until the watch stream ends.
pub async fn run(client: kube::Client) {
    let policy = crate::runner::Policy {
        metric: "kubelet-serving-csr-approving",
        what: "serving certificate approval",
        retry: Duration::from_secs(2),
    };
    super::run_over_requests(client, reconcile, policy).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    fn serving(username: &str, cn: &str, names: &[&str]) -> CertificateSigningRequest {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let (request, _) = common::pki::new_csr_with_names(cn, &["system:nodes"], &names).unwrap();
        let mut csr = super::super::tests::csr(
            KUBELET_SERVING,
            username,
            cn,
            &["system:nodes"],
            &["digital signature", "server auth"],
        );
        csr.spec.request = k8s_openapi::ByteString(request.into_bytes());
        csr
    }

    #[test]
    fn a_node_s_own_request_for_its_addresses_is_approved() {
        let own = serving("system:node:n1", "system:node:n1", &["n1", "10.0.0.5"]);
        let Decision::CheckNode { node, names } = decide(&own) else { panic!("{:?}", decide(&own)) };
        assert_eq!((node.as_str(), names.clone()), ("n1", vec!["n1".to_string(), "10.0.0.5".to_string()]));
        let n1 = Node {
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress { type_: "InternalIP".into(), address: "10.0.0.5".into() },
                    NodeAddress { type_: "Hostname".into(), address: "n1".into() },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(foreign_names(&n1, &names).is_empty());
        let more = vec!["10.0.0.5".to_string(), "10.0.0.6".to_string(), "api.example.com".to_string()];
        assert_eq!(foreign_names(&n1, &more), ["10.0.0.6", "api.example.com"]);
        // Another node's request, a bootstrap identity's, another signer's, a decided one.
        assert_eq!(decide(&serving("system:node:n2", "system:node:n1", &["n1"])), Decision::Skip);
        assert_eq!(decide(&serving("system:bootstrap:abc", "system:node:n1", &["n1"])), Decision::Skip);
        let mut other = own.clone();
        other.spec.signer_name = "example.com/x".into();
        assert_eq!(decide(&other), Decision::Skip);
        let done = super::super::approver::approved(&own, "ok", Time(k8s_openapi::jiff::Timestamp::now()));
        assert_eq!(decide(&done), Decision::Skip);
        // No names at all is not a serving request.
        assert_eq!(decide(&serving("system:node:n1", "system:node:n1", &[])), Decision::Skip);
    }
}
