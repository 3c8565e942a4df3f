//! The service controller: every Service of `type: LoadBalancer` (of a class the provider
//! serves) gets a load balancer and `status.loadBalancer.ingress`; one that stops being
//! one, or is deleted, gets its load balancer deleted and then loses the finalizer.
//!
//! - [`plan`] (pure) decides from the Service alone: nothing, up to date (the hash in
//!   [`HASH_ANNOTATION`] matches, the finalizer and an address are there: no provider
//!   call), ensure, or clean up.
//! - [`apply`] runs the model's [`diff`] against the provider: listener, backend and
//!   health-check calls each run even when another fails, and their errors come back as
//!   one [`Aggregate`].
//! - `reconcile` is the I/O around them: the finalizer before the provider is called, the
//!   status and hash after, Kubernetes' events (`EnsuringLoadBalancer`,
//!   `EnsuredLoadBalancer`, `SyncLoadBalancerFailed`, `DeletingLoadBalancer`,
//!   `DeletedLoadBalancer`), and retries with backoff (5 s doubling to 5 min, as upstream).
//!   Every Service is reconciled again when the set of backend nodes changes and when an
//!   address is released (a Service waiting for a free address gets it at once).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use common::events::{Recorder, NORMAL, WARNING};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use serde_json::json;

use crate::model::{self, diff, local_model, spec_hash, LoadBalancer, Op, Remote, FINALIZER, HASH_ANNOTATION};
use crate::provider::{CloudError, LoadBalancers};

/// What to do with a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Not a load balancer of ours.
    Ignore,
    /// Applied as it is: no provider call.
    UpToDate,
    Ensure {
        model: LoadBalancer,
        hash: String,
        add_finalizer: bool,
    },
    /// Delete the load balancer, clear the status, drop the finalizer.
    Cleanup,
}

pub fn has_finalizer(svc: &Service) -> bool {
    svc.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

fn ingress_ips(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .map(|i| i.iter().filter_map(|x| x.ip.clone()).collect())
        .unwrap_or_default()
}

/// Decide what a Service needs. `serves` says whether the provider serves a class;
/// `applied` is the hash this controller last applied for the Service, if it remembers one
/// (the watch may still show the Service as it was before that apply wrote its status and
/// hash: that echo is no reason to apply again).
pub fn plan(
    svc: &Service,
    backends: &BTreeSet<String>,
    serves: impl Fn(Option<&str>) -> bool,
    applied: Option<&str>,
) -> Result<Plan, model::ModelError> {
    let class = svc.spec.as_ref().and_then(|s| s.load_balancer_class.as_deref()).filter(|c| !c.is_empty());
    let want = model::wants_load_balancer(svc) && svc.metadata.deletion_timestamp.is_none() && serves(class);
    let finalizer = has_finalizer(svc);
    if !want {
        return Ok(if finalizer { Plan::Cleanup } else { Plan::Ignore });
    }
    let hash = spec_hash(svc, backends);
    let annotated = svc.metadata.annotations.as_ref().and_then(|a| a.get(HASH_ANNOTATION));
    if finalizer && ((annotated == Some(&hash) && !ingress_ips(svc).is_empty()) || applied == Some(hash.as_str())) {
        return Ok(Plan::UpToDate);
    }
    Ok(Plan::Ensure { model: local_model(svc, backends)?, hash, add_finalizer: !finalizer })
}

/// Several errors as one: `[a, b]`, or the single error's message (Kubernetes' aggregate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate(pub Vec<String>);

impl fmt::Display for Aggregate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => f.write_str(one),
            many => write!(f, "[{}]", many.join(", ")),
        }
    }
}

impl std::error::Error for Aggregate {}

/// What [`apply`] did: the balancer's address (once it exists) and the calls that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub address: Option<Ipv4Addr>,
    pub errors: Option<Aggregate>,
}

/// Make the provider's load balancer what `model` describes. A failed create or delete
/// stops there (nothing else can be applied); every other call runs, and their errors are
/// aggregated.
pub async fn apply(p: &dyn LoadBalancers, model: &LoadBalancer) -> Result<Applied, Aggregate> {
    let remote = p.get(&model.name).await.map_err(|e| Aggregate(vec![e.to_string()]))?;
    let mut address = remote.as_ref().map(|r| r.address);
    let mut errors = Vec::new();
    for op in diff(model, remote.as_ref()) {
        let name = &model.name;
        let r: Result<(), CloudError> = match &op {
            Op::Delete => match p.delete(name).await {
                Ok(()) => {
                    address = None;
                    Ok(())
                }
                Err(e) => return Err(Aggregate(vec![e.to_string()])),
            },
            Op::Create => match p.create(model).await {
                Ok(r) => {
                    address = Some(r.address);
                    Ok(())
                }
                Err(e) => return Err(Aggregate(vec![e.to_string()])),
            },
            Op::AddListener(l) => p.add_listener(name, l).await.map_err(|e| listener_error(l, e)),
            Op::UpdateListener(l) => p.update_listener(name, l).await.map_err(|e| listener_error(l, e)),
            Op::DeleteListener(l) => p.delete_listener(name, l).await.map_err(|e| listener_error(l, e)),
            Op::SetBackends(b) => p.set_backends(name, b).await,
            Op::SetHealthCheck(port) => p.set_health_check(name, *port).await,
        };
        if let Err(e) = r {
            errors.push(e.to_string());
        }
    }
    Ok(Applied { address, errors: (!errors.is_empty()).then_some(Aggregate(errors)) })
}

fn listener_error(l: &model::Listener, e: CloudError) -> CloudError {
    CloudError::Failed(format!("listener {l}: {e}"))
}

/// The retry delay after `failures` failures in a row: 5 s doubling to 5 min.
pub fn backoff(failures: u32) -> Duration {
    let secs = 5u64.saturating_mul(1u64 << failures.saturating_sub(1).min(16));
    Duration::from_secs(secs.min(300))
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("failed to ensure load balancer: {0}")]
    Ensure(Aggregate),
    #[error("failed to delete load balancer: {0}")]
    Delete(CloudError),
    #[error(transparent)]
    Model(#[from] model::ModelError),
}

pub struct Ctx {
    pub client: kube::Client,
    pub provider: Arc<dyn LoadBalancers>,
    pub recorder: Recorder,
    /// The backend nodes now.
    pub backends: Arc<RwLock<BTreeSet<String>>>,
    failures: Mutex<HashMap<String, u32>>,
    /// The hash last applied, by Service UID.
    applied: Mutex<HashMap<String, String>>,
    /// Reconcile every Service (an address was released).
    released: tokio::sync::mpsc::UnboundedSender<()>,
}

fn patch_params() -> PatchParams {
    PatchParams::default()
}

async fn reconcile(svc: Arc<Service>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let backends = ctx.backends.read().unwrap_or_else(|e| e.into_inner()).clone();
    let serves = |c: Option<&str>| ctx.provider.serves_class(c);
    let ns = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = svc.metadata.uid.clone().unwrap_or_default();
    let applied = ctx.applied.lock().unwrap_or_else(|e| e.into_inner()).get(&uid).cloned();
    let result = match plan(&svc, &backends, serves, applied.as_deref()) {
        Ok(Plan::Ignore) | Ok(Plan::UpToDate) => Ok(()),
        Ok(Plan::Ensure { model, hash, add_finalizer }) => {
            let r = ensure(&svc, &api, &ctx, model, hash.clone(), add_finalizer).await;
            let mut applied = ctx.applied.lock().unwrap_or_else(|e| e.into_inner());
            match &r {
                Ok(()) => applied.insert(uid, hash),
                Err(_) => applied.remove(&uid),
            };
            r
        }
        Ok(Plan::Cleanup) => {
            ctx.applied.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid);
            cleanup(&svc, &api, &ctx).await
        }
        Err(e) => {
            ctx.recorder.event(
                svc.as_ref(),
                WARNING,
                "SyncLoadBalancerFailed",
                format!("Error syncing load balancer: {e}"),
            );
            Err(e.into())
        }
    };
    let key = format!("{ns}/{name}");
    match result {
        Ok(()) => {
            ctx.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            Ok(Action::await_change())
        }
        Err(e) => Err(e),
    }
}

async fn ensure(
    svc: &Service,
    api: &Api<Service>,
    ctx: &Ctx,
    model: LoadBalancer,
    hash: String,
    add_finalizer: bool,
) -> Result<(), Error> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    if add_finalizer {
        let mut finalizers = svc.metadata.finalizers.clone().unwrap_or_default();
        finalizers.push(FINALIZER.to_string());
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": svc.metadata.resource_version}});
        api.patch(&name, &patch_params(), &Patch::Merge(&patch)).await?;
    }
    ctx.recorder.event(svc, NORMAL, "EnsuringLoadBalancer", "Ensuring load balancer");
    let applied = match apply(ctx.provider.as_ref(), &model).await {
        Ok(a) => a,
        Err(agg) => {
            let e = Error::Ensure(agg);
            ctx.recorder.event(svc, WARNING, "SyncLoadBalancerFailed", format!("Error syncing load balancer: {e}"));
            return Err(e);
        }
    };
    // The address is shown even when some listeners failed: the others work.
    if let Some(ip) = applied.address {
        if ingress_ips(svc) != [ip.to_string()] {
            let patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": ip.to_string(), "ipMode": "VIP"}]}}});
            api.patch_status(&name, &patch_params(), &Patch::Merge(&patch)).await?;
        }
    }
    if let Some(agg) = applied.errors {
        let e = Error::Ensure(agg);
        ctx.recorder.event(svc, WARNING, "SyncLoadBalancerFailed", format!("Error syncing load balancer: {e}"));
        return Err(e);
    }
    let patch = json!({"metadata": {"annotations": {HASH_ANNOTATION: hash}}});
    api.patch(&name, &patch_params(), &Patch::Merge(&patch)).await?;
    ctx.recorder.event(svc, NORMAL, "EnsuredLoadBalancer", "Ensured load balancer");
    Ok(())
}

async fn cleanup(svc: &Service, api: &Api<Service>, ctx: &Ctx) -> Result<(), Error> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let uid = svc.metadata.uid.clone().unwrap_or_default();
    ctx.recorder.event(svc, NORMAL, "DeletingLoadBalancer", "Deleting load balancer");
    if let Err(e) = ctx.provider.delete(&model::load_balancer_name(&uid)).await {
        let e = Error::Delete(e);
        ctx.recorder.event(svc, WARNING, "SyncLoadBalancerFailed", format!("Error syncing load balancer: {e}"));
        return Err(e);
    }
    let _ = ctx.released.send(());
    if !ingress_ips(svc).is_empty() {
        api.patch_status(
            &name,
            &patch_params(),
            &Patch::Merge(&json!({"status": {"loadBalancer": {"ingress": null}}})),
        )
        .await?;
    }
    let finalizers: Vec<String> =
        svc.metadata.finalizers.clone().unwrap_or_default().into_iter().filter(|f| f != FINALIZER).collect();
    let patch = json!({"metadata": {
        "finalizers": if finalizers.is_empty() { serde_json::Value::Null } else { json!(finalizers) },
        "annotations": {HASH_ANNOTATION: null},
    }});
    api.patch(&name, &patch_params(), &Patch::Merge(&patch)).await?;
    ctx.recorder.event(svc, NORMAL, "DeletedLoadBalancer", "Deleted load balancer");
    Ok(())
}

/// The provider's load balancers that no Service holds with the finalizer (one whose
/// finalizer was removed by hand, or that was deleted while a create was under way).
pub fn orphans<'a>(remote: &'a [Remote], services: &[Service]) -> Vec<&'a Remote> {
    let held: BTreeSet<String> = services
        .iter()
        .filter(|s| has_finalizer(s))
        .filter_map(|s| s.metadata.uid.as_deref().map(model::load_balancer_name))
        .collect();
    remote.iter().filter(|r| !held.contains(&r.name)).collect()
}

/// Delete the orphans, once, before the controller starts (so no create is under way).
async fn collect_orphans(client: &kube::Client, provider: &dyn LoadBalancers) {
    let services = match Api::<Service>::all(client.clone()).list(&Default::default()).await {
        Ok(l) => l.items,
        Err(e) => return tracing::warn!(error = %e, "listing services to find orphaned load balancers"),
    };
    let remote = match provider.list().await {
        Ok(r) => r,
        Err(e) => return tracing::warn!(error = %e, "listing the provider's load balancers"),
    };
    for r in orphans(&remote, &services) {
        match provider.delete(&r.name).await {
            Ok(()) => {
                tracing::info!(name = %r.name, service = %r.service, address = %r.address, "deleted orphaned load balancer")
            }
            Err(e) => tracing::warn!(name = %r.name, error = %e, "deleting orphaned load balancer"),
        }
    }
}

fn error_policy(svc: Arc<Service>, e: &Error, ctx: Arc<Ctx>) -> Action {
    let key = model::key(&svc);
    let n = {
        let mut f = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = f.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    let delay = backoff(n);
    tracing::warn!(service = %key, error = %e, retry_in = ?delay, "load balancer sync failed");
    Action::requeue(delay)
}

/// Run the service controller with `concurrency` syncs at a time.
pub async fn run(client: kube::Client, provider: Arc<dyn LoadBalancers>, recorder: Recorder, concurrency: u16) {
    let backends = Arc::new(RwLock::new(BTreeSet::new()));
    let (trigger, triggers) = tokio::sync::mpsc::unbounded_channel::<()>();
    // The backend nodes: the Services are reconciled again whenever the set changes. Every
    // watch event counts (a deletion too), and the set is read from the reflector's store.
    let (store, writer) = reflector::store::<Node>();
    let nodes = reflector::reflector(writer, watcher(Api::<Node>::all(client.clone()), watcher::Config::default()))
        .default_backoff();
    let eligible = |s: &reflector::Store<Node>| model::eligible_nodes(s.state().iter().map(|n| n.as_ref()));
    let (b, t, s) = (backends.clone(), trigger.clone(), store.clone());
    tokio::spawn(async move {
        futures::pin_mut!(nodes);
        while let Some(ev) = nodes.next().await {
            if let Err(e) = ev {
                tracing::warn!(error = %e, "watching nodes");
                continue;
            }
            let now = eligible(&s);
            let changed = std::mem::replace(&mut *b.write().unwrap_or_else(|e| e.into_inner()), now.clone()) != now;
            if changed {
                let _ = t.send(());
            }
        }
    });
    if store.wait_until_ready().await.is_err() {
        tracing::error!("the node watch ended before it listed the nodes");
        return;
    }
    *backends.write().unwrap_or_else(|e| e.into_inner()) = eligible(&store);
    collect_orphans(&client, provider.as_ref()).await;
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        provider,
        recorder,
        backends,
        failures: Mutex::default(),
        applied: Mutex::default(),
        released: trigger,
    });
    Controller::new(Api::<Service>::all(client), watcher::Config::default())
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .reconcile_all_on(tokio_stream::wrappers::UnboundedReceiverStream::new(triggers))
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move { crate::metrics::sync("service", r.is_ok()) })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::mock::{Failure, Mock};
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn web() -> Service {
        svc(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "11111111-2222-3333-4444-555555555555"},
            "spec": {"type": "LoadBalancer", "ports": [
                {"name": "a", "port": 80, "protocol": "TCP", "nodePort": 30080},
                {"name": "b", "port": 443, "protocol": "TCP", "nodePort": 30443},
                {"name": "c", "port": 8080, "protocol": "TCP", "nodePort": 30880}]}
        }))
    }

    fn nodes() -> BTreeSet<String> {
        ["n1".to_string()].into()
    }

    fn classless(c: Option<&str>) -> bool {
        c.is_none()
    }

    #[test]
    fn plans() {
        let s = web();
        let Plan::Ensure { hash, add_finalizer: true, .. } = plan(&s, &nodes(), classless, None).unwrap() else {
            panic!("a new LoadBalancer Service is ensured, finalizer first")
        };
        let mut applied = s.clone();
        applied.metadata.finalizers = Some(vec![FINALIZER.into()]);
        applied.metadata.annotations = Some([(HASH_ANNOTATION.to_string(), hash.clone())].into());
        assert!(
            matches!(plan(&applied, &nodes(), classless, None).unwrap(), Plan::Ensure { add_finalizer: false, .. }),
            "no address yet"
        );
        applied.status =
            Some(serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "10.255.0.1"}]}})).unwrap());
        assert_eq!(plan(&applied, &nodes(), classless, None).unwrap(), Plan::UpToDate);
        // The watch's echo of this controller's own finalizer write, before it shows the
        // status and hash that apply wrote: remembered as applied, so nothing to do.
        let mut echo = s.clone();
        echo.metadata.finalizers = Some(vec![FINALIZER.into()]);
        assert!(matches!(plan(&echo, &nodes(), classless, None).unwrap(), Plan::Ensure { .. }));
        assert_eq!(plan(&echo, &nodes(), classless, Some(&hash)).unwrap(), Plan::UpToDate);
        assert!(matches!(plan(&echo, &nodes(), classless, Some("older")).unwrap(), Plan::Ensure { .. }));
        let more: BTreeSet<String> = ["n1".to_string(), "n2".to_string()].into();
        assert!(matches!(plan(&applied, &more, classless, None).unwrap(), Plan::Ensure { .. }), "new backends");

        let mut to_cluster_ip = applied.clone();
        to_cluster_ip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert_eq!(plan(&to_cluster_ip, &nodes(), classless, None).unwrap(), Plan::Cleanup);
        let mut deleted = applied.clone();
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(plan(&deleted, &nodes(), classless, None).unwrap(), Plan::Cleanup);
        let mut other_class = s.clone();
        other_class.spec.as_mut().unwrap().load_balancer_class = Some("example.com/other".into());
        assert_eq!(plan(&other_class, &nodes(), classless, None).unwrap(), Plan::Ignore, "someone else's class");
        let mut plain = s.clone();
        plain.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert_eq!(plan(&plain, &nodes(), classless, None).unwrap(), Plan::Ignore);
    }

    fn model_of(s: &Service) -> LoadBalancer {
        local_model(s, &nodes()).unwrap()
    }

    #[tokio::test]
    async fn an_applied_balancer_costs_one_read_and_nothing_else() {
        let mock = Mock::new();
        let m = model_of(&web());
        let a = apply(&mock, &m).await.unwrap();
        assert!(a.address.is_some() && a.errors.is_none());
        // get + create + 3 listeners + backends
        assert_eq!(mock.total_calls(), 6, "{:?}", mock.calls());
        apply(&mock, &m).await.unwrap();
        assert_eq!(mock.total_calls(), 7, "only the read: {:?}", mock.calls());
    }

    #[tokio::test]
    async fn one_failed_listener_of_three_is_one_error_and_the_others_are_applied() {
        let mock = Mock::new();
        mock.fail(Failure { request: "add_listener", port: Some(443), times: Some(1) });
        let m = model_of(&web());
        let a = apply(&mock, &m).await.unwrap();
        let err = a.errors.expect("an error");
        assert_eq!(err.0.len(), 1);
        assert_eq!(err.to_string(), "listener 443/TCP: mock: add_listener failed on port 443");
        let lb = &mock.load_balancers_now()[&m.name];
        let ports: Vec<i32> = lb.listeners.iter().map(|l| l.port).collect();
        assert_eq!(ports, [80, 8080], "the other listeners are applied");
        assert_eq!(lb.backends, nodes());
        // The retry applies only the missing listener.
        let before = mock.calls();
        let again = apply(&mock, &m).await.unwrap();
        assert!(again.errors.is_none());
        let after = mock.calls();
        assert_eq!(after["add_listener"] - before["add_listener"], 1);
        assert_eq!(after.get("create"), before.get("create"));
        assert_eq!(mock.load_balancers_now()[&m.name].listeners.len(), 3);

        // Two failures read as Kubernetes' aggregate.
        let mock = Mock::new();
        mock.fail(Failure { request: "add_listener", port: Some(80), times: None });
        mock.fail(Failure { request: "add_listener", port: Some(8080), times: None });
        let e = apply(&mock, &m).await.unwrap().errors.unwrap();
        assert_eq!(
            e.to_string(),
            "[listener 80/TCP: mock: add_listener failed on port 80, listener 8080/TCP: mock: add_listener failed on port 8080]"
        );
    }

    #[tokio::test]
    async fn a_failed_create_stops_and_a_restart_mid_apply_reuses_the_balancer() {
        let mock = Mock::new();
        mock.fail(Failure { request: "create", port: None, times: Some(1) });
        let m = model_of(&web());
        assert_eq!(apply(&mock, &m).await.unwrap_err().to_string(), "mock: create failed");
        assert!(mock.load_balancers_now().is_empty());
        // A controller that created the balancer and died before writing the status: the
        // next one (a fresh apply, same provider) finds it by name and keeps its address.
        mock.fail(Failure { request: "add_listener", port: None, times: Some(3) });
        let first = apply(&mock, &m).await.unwrap();
        let again = apply(&mock, &m).await.unwrap();
        assert_eq!(again.address, first.address);
        assert_eq!(mock.load_balancers_now().len(), 1, "no second balancer, no leaked address");
        assert_eq!(mock.calls()["create"], 2, "one failed, one made");
    }

    #[test]
    fn orphans_are_the_balancers_no_service_holds() {
        let held = {
            let mut s = web();
            s.metadata.finalizers = Some(vec![FINALIZER.into()]);
            s
        };
        let mut released = web();
        released.metadata.uid = Some("99999999-2222-3333-4444-555555555555".into());
        let remote = |uid: &str| Remote {
            name: model::load_balancer_name(uid),
            service: "default/x".into(),
            class: None,
            address: "10.255.0.1".parse().unwrap(),
            listeners: Default::default(),
            backends: Default::default(),
            health_check_node_port: None,
        };
        let all = [
            remote("11111111-2222-3333-4444-555555555555"),
            remote("99999999-2222-3333-4444-555555555555"),
            remote("gone"),
        ];
        let o: Vec<&str> = orphans(&all, &[held, released]).iter().map(|r| r.name.as_str()).collect();
        assert_eq!(o, [all[1].name.as_str(), all[2].name.as_str()], "a Service without the finalizer holds nothing");
    }

    #[test]
    fn backoff_doubles_from_five_seconds_to_five_minutes() {
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(backoff(1000).as_secs(), 300);
    }
}
