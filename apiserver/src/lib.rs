//! MiniK8s apiserver: the Kubernetes REST API over the `storage` crate.
//!
//! Request path: HTTP ([`server`]) → decode + typed check ([`registry::generic`]) →
//! per-kind strategy ([`registry::kinds`] …) → storage (guarded transactions) → watch cache
//! ([`watch`]) → watchers. The static resource table ([`resources`]) drives discovery and
//! routing.

use std::sync::Arc;

use serde_json::{json, Value};
use storage::Store;

pub mod admission;
pub mod aggregator;
pub mod authn;
pub mod authz;
pub mod bootstraptoken;
pub mod componentstatus;
pub mod continuetoken;
pub mod crds;
pub mod discovery;
pub mod endpointreconciler;
pub mod error;
pub mod eventsview;
pub mod eventttl;
pub mod hpaview;
pub mod ipalloc;
pub mod kubeletclient;
pub mod metrics;
pub mod metricsapi;
pub mod nscache;
pub mod openapi;
pub mod patch;
pub mod protobuf;
pub mod query;
pub mod registry;
pub mod requestinfo;
pub mod resources;
pub mod resourceversion;
pub mod reviews;
pub mod selectors;
pub mod server;
pub mod serviceaccount;
pub mod table;
pub mod validation;
pub mod views;
pub mod watch;
pub mod webhook;

use registry::generic::{Registry, WriteOptions};

/// Everything the server needs besides the listener.
pub struct Options {
    pub service_cluster_ip_range: String,
    pub service_node_port_range: String,
    pub max_requests_inflight: usize,
    pub max_mutating_requests_inflight: usize,
    /// Events kept per resource in the watch cache.
    pub watch_cache_size: usize,
    /// `host:port` clients are told to use (discovery's serverAddressByClientCIDRs).
    pub advertise_address: String,
    pub port: u16,
    /// `--advertise-address`: the IP the `kubernetes` Service's endpoints name, so that pods
    /// reach this apiserver through the Service (none: the Service has no endpoints).
    pub endpoint_ip: Option<std::net::IpAddr>,
    /// How often a watch with allowWatchBookmarks gets a BOOKMARK.
    pub watch_bookmark_interval: std::time::Duration,
    /// `--token-auth-file`'s users.
    pub tokens: Option<Arc<authn::TokenAuthenticator>>,
    /// The ServiceAccount token issuer (`--service-account-signing-key-file` …), if any.
    pub service_account_issuer: Option<Arc<serviceaccount::Issuer>>,
    /// `--authorization-mode`, in order.
    pub authorization_modes: Vec<authz::Mode>,
    /// `--enable-bootstrap-token-auth`.
    pub enable_bootstrap_token_auth: bool,
    /// `--anonymous-auth` with the authorization modes: who a request without credentials is.
    pub anonymous: authn::Anonymous,
    /// Whether the store is etcd (`--etcd-servers`): how ComponentStatus names it.
    pub etcd: bool,
    /// `--endpoint-reconciler-type`: whether this apiserver keeps the `kubernetes` Service's
    /// endpoints (with a lease, beside any other apiserver of the store) or leaves them be.
    pub endpoint_reconciler: bool,
    /// `--proxy-client-cert-file` and `--proxy-client-key-file`: the client certificate
    /// presented to aggregated API servers.
    pub proxy_client: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// How often every aggregated APIService's availability is checked again.
    pub aggregator_resync: std::time::Duration,
}

impl Options {
    /// Where pods reach this apiserver (the `kubernetes` Service's endpoint it keeps), if it
    /// keeps one.
    pub fn endpoint(&self) -> Option<std::net::SocketAddr> {
        let ip = self.endpoint_ip.filter(|_| self.endpoint_reconciler)?;
        Some(std::net::SocketAddr::new(ip, self.port))
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            service_cluster_ip_range: "10.96.0.0/12".into(),
            service_node_port_range: "30000-32767".into(),
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            watch_cache_size: watch::DEFAULT_CACHE_SIZE,
            advertise_address: "127.0.0.1:6443".into(),
            port: 6443,
            endpoint_ip: None,
            watch_bookmark_interval: watch::WatchTiming::default().bookmark_interval,
            tokens: None,
            service_account_issuer: None,
            authorization_modes: vec![authz::Mode::AlwaysAllow],
            enable_bootstrap_token_auth: false,
            anonymous: authn::Anonymous::PublicPaths,
            etcd: false,
            endpoint_reconciler: true,
            proxy_client: None,
            aggregator_resync: aggregator::DEFAULT_RESYNC,
        }
    }
}

/// Build the application state over a store (already opened).
pub fn build_state(store: Arc<dyn Store>, opts: &Options) -> anyhow::Result<Arc<server::AppState>> {
    let metrics = metrics::Metrics::new();
    let store: Arc<dyn Store> = Arc::new(metrics::MeteredStore::new(store, metrics.clone()));
    let ip_range = ipalloc::IpRange::parse(&opts.service_cluster_ip_range).map_err(anyhow::Error::msg)?;
    let port_range = ipalloc::PortRange::parse(&opts.service_node_port_range).map_err(anyhow::Error::msg)?;
    let config = registry::ClusterConfig { service_cluster_ip_range: ip_range, service_node_port_range: port_range };
    let registry = Arc::new(Registry::new(store.clone(), config));
    let proxy_identity = match &opts.proxy_client {
        Some((cert, key)) => Some((
            common::tls::read_certificates("--proxy-client-cert-file", cert)?,
            common::tls::read_private_key("--proxy-client-key-file", key)?,
        )),
        None => None,
    };
    let aggregator = aggregator::Aggregator::new(registry.clone(), proxy_identity, opts.aggregator_resync)
        .map_err(anyhow::Error::msg)?;
    Ok(Arc::new(server::AppState {
        registry: registry.clone(),
        caches: Arc::new(watch::WatchCaches::new(store, opts.watch_cache_size)),
        metrics,
        readonly: Arc::new(tokio::sync::Semaphore::new(opts.max_requests_inflight.max(1))),
        mutating: Arc::new(tokio::sync::Semaphore::new(opts.max_mutating_requests_inflight.max(1))),
        server_address: opts.advertise_address.clone(),
        timing: watch::WatchTiming { bookmark_interval: opts.watch_bookmark_interval },
        authenticators: Arc::new(authn::Authenticators {
            tokens: opts.tokens.clone(),
            lookups: token_lookups(opts, &registry),
            anonymous: opts.anonymous,
        }),
        service_account_issuer: opts.service_account_issuer.clone(),
        authz: Arc::new(authz::Authorizer::new(opts.authorization_modes.clone())),
        webhooks: webhook::Webhooks::new(registry.store.clone()),
        etcd: opts.etcd,
        aggregator,
    }))
}

/// The authenticators that look a token up, in Kubernetes' order.
fn token_lookups(opts: &Options, registry: &Arc<Registry>) -> Vec<Arc<dyn authn::TokenUser>> {
    let mut out: Vec<Arc<dyn authn::TokenUser>> = Vec::new();
    if opts.enable_bootstrap_token_auth {
        out.push(Arc::new(bootstraptoken::BootstrapTokenAuthenticator { registry: registry.clone() }));
    }
    if let Some(issuer) = &opts.service_account_issuer {
        let registry = registry.clone();
        out.push(Arc::new(serviceaccount::authenticator::ServiceAccountAuthenticator {
            issuer: issuer.clone(),
            registry,
        }));
    }
    out
}

/// The namespaces every cluster has.
pub const SYSTEM_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Create the system namespaces and the `kubernetes` Service if missing. Idempotent.
pub async fn bootstrap(state: &server::AppState, opts: &Options) -> Result<(), error::ApiError> {
    let reg = &state.registry;
    let ns_res =
        resources::find("", "v1", "namespaces").ok_or_else(|| error::ApiError::internal("no namespaces resource"))?;
    for ns in SYSTEM_NAMESPACES {
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        match reg.create(ns_res, "", body, &WriteOptions::default()).await {
            Ok(_) => tracing::info!(namespace = ns, "created system namespace"),
            Err(e) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let svc_res =
        resources::find("", "v1", "services").ok_or_else(|| error::ApiError::internal("no services resource"))?;
    let ip = reg.config.service_cluster_ip_range.first().to_string();
    let body = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "sessionAffinity": "None",
                 "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": opts.port}]},
    });
    match reg.create(svc_res, "default", body, &WriteOptions::default()).await {
        Ok(_) => tracing::info!(ip, "created the kubernetes service"),
        Err(e) if e.code == 409 || e.code == 422 => {}
        Err(e) => return Err(e),
    }
    // The built-in group-versions as Local APIServices (kube-apiserver's autoregistration).
    let apiservices = resources::find_by_plural("apiregistration.k8s.io", "apiservices")
        .ok_or_else(|| error::ApiError::internal("no apiservices resource"))?;
    for body in local_apiservices() {
        match reg.create(apiservices, "", body, &WriteOptions::default()).await {
            Ok(_) | Err(error::ApiError { code: 409, .. }) => {}
            Err(e) => return Err(e),
        }
    }
    if let Some(me) = opts.endpoint() {
        let all = endpointreconciler::reconcile(reg, me, false).await?;
        tracing::info!(%me, apiservers = ?all, "the kubernetes service's endpoints name the live apiservers");
    }
    authz::bootstrap::reconcile(reg).await
}

/// An APIService for every group-version this apiserver serves itself, named
/// `<version>.<group>` (`v1.` for the core group), without a service: `Local`.
pub fn local_apiservices() -> Vec<Value> {
    let mut gvs: Vec<(&str, &str)> = vec![("", "v1")];
    for (group, versions) in discovery::groups() {
        gvs.extend(versions.into_iter().map(|v| (group, v)));
    }
    gvs.into_iter()
        .map(|(group, version)| {
            let priority = if group.is_empty() { 18000 } else { 17000 };
            let version_priority = if version.contains("beta") || version.contains("alpha") { 9 } else { 15 };
            json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {"name": format!("{version}.{group}"), "labels": {"kube-aggregator.kubernetes.io/automanaged": "onstart"}},
                "spec": {"group": group, "version": version, "groupPriorityMinimum": priority,
                         "versionPriority": version_priority}})
        })
        .collect()
}

/// Start API aggregation: the routing table of aggregated APIServices is in place when this
/// returns (run it before serving), their availability checked from then on.
pub async fn start_aggregation(state: &server::AppState) -> Result<(), error::ApiError> {
    state.aggregator.start().await
}

/// Start what the configured authorizers need (the RBAC index, the Node authorizer's
/// graph), complete when this returns: run it after [`bootstrap`], before serving.
pub async fn start_authorization(state: &server::AppState) -> Result<(), error::ApiError> {
    if state.authz.uses(authz::Mode::Rbac) || state.authz.uses(authz::Mode::Node) {
        authz::feed::start(state.authz.clone(), state.registry.store.clone()).await?;
    }
    Ok(())
}

pub use apimachinery::duration::parse_go_duration;
