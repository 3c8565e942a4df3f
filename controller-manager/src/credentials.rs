//! `--use-service-account-credentials`: each controller talks to the apiserver as its own
//! ServiceAccount in `kube-system` (`replicaset-controller`, `generic-garbage-collector`, …),
//! so RBAC gives it only its bootstrap role (`system:controller:<name>`), as kube-controller-
//! manager does. The controller-manager's own identity creates the accounts and asks the
//! TokenRequest API for their tokens.
//!
//! Reads of whole collections (lists, watches, discovery) go out as the controller-manager
//! itself, whose role lists and watches everything — upstream's controllers read through
//! informers shared under that identity — and everything else (gets of one object, writes)
//! as the controller's account ([`is_collection_read`] decides, [`ByRequest`] routes).
//!
//! A controller's client reads its token from a file the refresher rewrites before the token
//! expires (the kube crate reloads a token file every minute). [`service_account`] and
//! [`refresh_in`] are the decisions; [`Credentials`] is the I/O.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};

/// Where the controllers' accounts live.
pub const NAMESPACE: &str = "kube-system";

/// How long a requested token lasts.
pub const TOKEN_SECONDS: i64 = 3600;

/// The ServiceAccount a controller (by its `--controllers` name) runs as: Kubernetes' names,
/// which its bootstrap roles and bindings use.
pub fn service_account(controller: &str) -> &'static str {
    match controller {
        "replicaset" => "replicaset-controller",
        "deployment" => "deployment-controller",
        "endpointslice" => "endpointslice-controller",
        "endpoints" => "endpoint-controller",
        "garbagecollector" => "generic-garbage-collector",
        "namespace" => "namespace-controller",
        "nodeipam" | "nodelifecycle" => "node-controller",
        "cronjob" => "cronjob-controller",
        "job" => "job-controller",
        "serviceaccount" => "service-account-controller",
        "root-ca-cert-publisher" => "root-ca-cert-publisher",
        "clusterrole-aggregation" => "clusterrole-aggregation-controller",
        "disruption" => "disruption-controller",
        "horizontalpodautoscaling" => "horizontal-pod-autoscaler",
        "persistentvolume-binder" => "persistent-volume-binder",
        "pvc-protection" => "pvc-protection-controller",
        "pv-protection" => "pv-protection-controller",
        "statefulset" => "statefulset-controller",
        "daemonset" => "daemon-set-controller",
        "podgc" => "pod-garbage-collector",
        "csrapproving" | "csrsigning" => "certificate-controller",
        "kubelet-serving-csr-approving" => "kubelet-serving-approver",
        _ => "",
    }
}

/// When to ask for the next token: at four fifths of the lifetime granted (the apiserver may
/// shorten what was asked), at least a minute from now.
pub fn refresh_in(granted_seconds: i64) -> Duration {
    Duration::from_secs((granted_seconds * 4 / 5).max(60) as u64)
}

/// Makes the controllers' clients.
pub struct Credentials {
    /// The controller-manager's own configuration: the server and the CA to trust.
    base: kube::Config,
    /// Its own client, which creates the accounts and their tokens.
    own: kube::Client,
    /// Private directory of the token files.
    dir: tempfile::TempDir,
    /// One client (one token, one refresher) per account: two controllers may share one
    /// (`node-controller`).
    made: std::collections::HashMap<String, kube::Client>,
}

impl Credentials {
    pub fn new(base: kube::Config, own: kube::Client) -> anyhow::Result<Credentials> {
        let dir = tempfile::Builder::new().prefix("controller-tokens").tempdir().context("a directory for tokens")?;
        Ok(Credentials { base, own, dir, made: Default::default() })
    }

    /// A client that authenticates as `account` (in [`NAMESPACE`]), with a refresher that
    /// keeps its token current for as long as the process runs.
    pub async fn client(&mut self, account: &str) -> anyhow::Result<kube::Client> {
        if let Some(client) = self.made.get(account) {
            return Ok(client.clone());
        }
        let accounts: Api<ServiceAccount> = Api::namespaced(self.own.clone(), NAMESPACE);
        let mut sa = ServiceAccount::default();
        sa.metadata.name = Some(account.to_string());
        match accounts.create(&PostParams::default(), &sa).await {
            Ok(_) => tracing::info!(account, "created the controller's ServiceAccount"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).with_context(|| format!("creating ServiceAccount {NAMESPACE}/{account}")),
        }
        let path = self.dir.path().join(account);
        let granted = request_token(&accounts, account, &path).await?;
        tokio::spawn(refresh(accounts, account.to_string(), path.clone(), granted));
        let mut config = self.base.clone();
        config.auth_info =
            kube::config::AuthInfo { token_file: Some(path.display().to_string()), ..Default::default() };
        let default_ns = config.default_namespace.clone();
        let writes = kube::Client::try_from(config).with_context(|| format!("a client for {account}"))?;
        let client = kube::Client::new(ByRequest { reads: self.own.clone(), writes }, default_ns);
        self.made.insert(account.to_string(), client.clone());
        Ok(client)
    }
}

/// Whether a request reads a collection or the API's discovery documents: a GET whose path
/// names no object (Kubernetes' request-info rules: `/api/v1/pods`,
/// `/apis/apps/v1/namespaces/ns/deployments`, `/apis/apps/v1`, but not
/// `/api/v1/namespaces/ns` or `/api/v1/nodes/n1/status`).
pub fn is_collection_read(method: &http::Method, path: &str) -> bool {
    if method != http::Method::GET {
        return false;
    }
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    // After the prefix and group/version: `/api/v1/…` or `/apis/<group>/<version>/…`.
    let rest = match segs.first() {
        Some(&"api") => segs.get(2..),
        Some(&"apis") => segs.get(3..),
        _ => return true, // /version, /openapi/…: no objects
    };
    let Some(mut rest) = rest else { return true };
    if rest.len() >= 3 && rest[0] == "namespaces" {
        rest = &rest[2..];
    }
    rest.len() <= 1
}

/// A client's transport that sends collection reads with one client and the rest with
/// another.
#[derive(Clone)]
struct ByRequest {
    reads: kube::Client,
    writes: kube::Client,
}

impl tower::Service<http::Request<kube::client::Body>> for ByRequest {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, kube::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), kube::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let client = if is_collection_read(req.method(), req.uri().path()) { &self.reads } else { &self.writes };
        let client = client.clone();
        Box::pin(async move { client.send(req).await })
    }
}

/// Ask for a token of `account` and write it to `path` (0600, through a rename): the
/// lifetime granted, in seconds.
async fn request_token(accounts: &Api<ServiceAccount>, account: &str, path: &Path) -> anyhow::Result<i64> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(TOKEN_SECONDS), ..Default::default() }),
        ..Default::default()
    };
    let answer: TokenRequest =
        accounts.create_subresource("token", account, &PostParams::default(), &request).await.with_context(|| {
            format!(
                "requesting a token for {NAMESPACE}/{account} (--use-service-account-credentials needs the \
                 apiserver's --service-account-signing-key-file)"
            )
        })?;
    let token = answer.status.and_then(|s| s.token).unwrap_or_default();
    anyhow::ensure!(!token.is_empty(), "the TokenRequest for {account} returned no token");
    common::write_private(path, token.as_bytes())?;
    Ok(answer.spec.and_then(|s| s.expiration_seconds).unwrap_or(TOKEN_SECONDS))
}

async fn refresh(accounts: Api<ServiceAccount>, account: String, path: PathBuf, mut granted: i64) {
    loop {
        tokio::time::sleep(refresh_in(granted)).await;
        match request_token(&accounts, &account, &path).await {
            Ok(g) => granted = g,
            Err(e) => {
                tracing::warn!(account, error = %format!("{e:#}"), "refreshing the controller's token failed; retrying");
                granted = 75; // a minute from now
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_controller_has_kubernetes_account_name() {
        for (c, _) in crate::CONTROLLERS {
            assert!(!service_account(c).is_empty(), "{c} has no ServiceAccount");
        }
        assert_eq!(service_account("garbagecollector"), "generic-garbage-collector");
        assert_eq!(service_account("nodelifecycle"), service_account("nodeipam"));
    }

    #[test]
    fn collection_reads_are_told_from_object_requests() {
        let get = http::Method::GET;
        for p in [
            "/api/v1/pods",
            "/api/v1/namespaces",
            "/api/v1/namespaces/ns/pods",
            "/apis/apps/v1/namespaces/ns/deployments",
            "/apis/apps/v1",
            "/apis",
            "/api",
            "/version",
        ] {
            assert!(is_collection_read(&get, p), "{p}");
        }
        for p in [
            "/api/v1/namespaces/ns",
            "/api/v1/nodes/n1",
            "/api/v1/nodes/n1/status",
            "/api/v1/namespaces/ns/pods/web",
            "/apis/apps/v1/namespaces/ns/deployments/web/scale",
        ] {
            assert!(!is_collection_read(&get, p), "{p}");
        }
        assert!(!is_collection_read(&http::Method::POST, "/api/v1/namespaces/ns/pods"));
        assert!(!is_collection_read(&http::Method::DELETE, "/api/v1/namespaces/ns/pods"), "a collection delete");
    }

    #[test]
    fn tokens_are_refreshed_well_before_they_expire() {
        assert_eq!(refresh_in(3600), Duration::from_secs(2880));
        assert_eq!(refresh_in(10), Duration::from_secs(60), "never busier than once a minute");
    }
}
