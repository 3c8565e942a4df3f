//! The I/O shell over the apiserver: one `kube` reflector store per exported resource,
//! kept up to date by a list-then-watch, and read whole on every scrape.
//!
//! Before watching, a resource is listed once with `limit=1`: an apiserver that does not
//! serve it answers 404, and the resource is then skipped (logged once) instead of being
//! retried forever. Every other failure is retried by the watcher with backoff.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Node, PersistentVolumeClaim, Pod, Service};
use kube::api::{Api, ListParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::Resource;

use crate::discovery::{self, TargetGroup};
use crate::render::Family;
use crate::store;
use crate::telemetry;

/// The annotation `kubectl apply` keeps a whole copy of the object in: never read here,
/// so not kept either.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// One watched resource.
pub struct Source {
    /// The `--resources` name (`pods`).
    pub resource: &'static str,
    synced: Arc<AtomicBool>,
    collect: Box<dyn Fn() -> Vec<Family> + Send + Sync>,
}

impl Source {
    /// Whether the resource has been listed once (or found not to be served).
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// The families of the objects in the store now.
    pub fn families(&self) -> Vec<Family> {
        (self.collect)()
    }
}

/// A watched resource's store, and whether it has listed once.
pub struct Watched<K: Resource<DynamicType = ()> + 'static> {
    pub reader: reflector::Store<K>,
    synced: Arc<AtomicBool>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Clone for Watched<K> {
    fn clone(&self) -> Self {
        Watched { reader: self.reader.clone(), synced: self.synced.clone() }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Watched<K> {
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// The objects in the store now.
    pub fn objects(&self) -> Vec<Arc<K>> {
        self.reader.state()
    }
}

/// The stores the exported resources and the service discovery share (one watch each).
#[derive(Default)]
pub struct Shared {
    pub nodes: Option<Watched<Node>>,
    pub pods: Option<Watched<Pod>>,
    pub services: Option<Watched<Service>>,
}

/// What the service discovery reads.
pub struct Discovery {
    pub nodes: Watched<Node>,
    pub pods: Watched<Pod>,
    pub services: Watched<Service>,
    pub endpoints: Watched<Endpoints>,
}

impl Discovery {
    /// Reuse the stores of `shared`, watch what it lacks.
    pub fn start(client: &kube::Client, shared: Shared) -> Discovery {
        let c = client.clone();
        Discovery {
            nodes: shared.nodes.unwrap_or_else(|| watched(c.clone(), "nodes", "*v1.Node")),
            pods: shared.pods.unwrap_or_else(|| watched(c.clone(), "pods", "*v1.Pod")),
            services: shared.services.unwrap_or_else(|| watched(c.clone(), "services", "*v1.Service")),
            endpoints: watched(c, "endpoints", "*v1.Endpoints"),
        }
    }

    /// The target groups of a role, or None for a role not served; Err while the stores
    /// it reads have not listed yet.
    pub fn targets(&self, role: &str) -> Option<Result<Vec<TargetGroup>, &'static str>> {
        Some(match role {
            "node" => self.nodes.synced().then(|| discovery::nodes(&refs(&self.nodes.objects()))).ok_or("nodes"),
            "pod" => self.pods.synced().then(|| discovery::pods(&refs(&self.pods.objects()))).ok_or("pods"),
            "service" => {
                self.services.synced().then(|| discovery::services(&refs(&self.services.objects()))).ok_or("services")
            }
            "endpoints" => {
                if !(self.endpoints.synced() && self.services.synced() && self.pods.synced()) {
                    Err("endpoints, services, pods")
                } else {
                    let (e, s, p) = (self.endpoints.objects(), self.services.objects(), self.pods.objects());
                    Ok(discovery::endpoints(&refs(&e), &refs(&s), &refs(&p)))
                }
            }
            _ => return None,
        })
    }
}

fn refs<K>(v: &[Arc<K>]) -> Vec<&K> {
    v.iter().map(|o| o.as_ref()).collect()
}

/// Start watching `resource` (one of [`store::RESOURCES`]); the node, pod and service
/// stores are also handed to `shared`.
pub fn start(client: &kube::Client, resource: &'static str, shared: &mut Shared) -> Option<Source> {
    let c = client.clone();
    Some(match resource {
        "cronjobs" => spawn::<CronJob>(c, resource, "*v1.CronJob", store::cronjob::families),
        "daemonsets" => spawn::<DaemonSet>(c, resource, "*v1.DaemonSet", store::daemonset::families),
        "deployments" => spawn::<Deployment>(c, resource, "*v1.Deployment", store::deployment::families),
        "horizontalpodautoscalers" => spawn::<HorizontalPodAutoscaler>(
            c,
            resource,
            "*v2.HorizontalPodAutoscaler",
            store::horizontalpodautoscaler::families,
        ),
        "jobs" => spawn::<Job>(c, resource, "*v1.Job", store::job::families),
        "namespaces" => spawn::<Namespace>(c, resource, "*v1.Namespace", store::namespace::families),
        "nodes" => {
            let w = watched::<Node>(c, resource, "*v1.Node");
            shared.nodes = Some(w.clone());
            source(resource, w, store::node::families)
        }
        "persistentvolumeclaims" => spawn::<PersistentVolumeClaim>(
            c,
            resource,
            "*v1.PersistentVolumeClaim",
            store::persistentvolumeclaim::families,
        ),
        "pods" => {
            let w = watched::<Pod>(c, resource, "*v1.Pod");
            shared.pods = Some(w.clone());
            source(resource, w, store::pod::families)
        }
        "replicasets" => spawn::<ReplicaSet>(c, resource, "*v1.ReplicaSet", store::replicaset::families),
        "services" => {
            let w = watched::<Service>(c, resource, "*v1.Service");
            shared.services = Some(w.clone());
            source(resource, w, store::service::families)
        }
        "statefulsets" => spawn::<StatefulSet>(c, resource, "*v1.StatefulSet", store::statefulset::families),
        _ => return None,
    })
}

fn spawn<K>(
    client: kube::Client,
    resource: &'static str,
    type_name: &'static str,
    render: fn(&[&K]) -> Vec<Family>,
) -> Source
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    source(resource, watched(client, resource, type_name), render)
}

/// The exported families of a watched resource.
fn source<K>(resource: &'static str, w: Watched<K>, render: fn(&[&K]) -> Vec<Family>) -> Source
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let synced = w.synced.clone();
    let collect = move || {
        let objects = w.objects();
        let refs: Vec<&K> = objects.iter().map(|o| o.as_ref()).collect();
        render(&refs)
    };
    Source { resource, synced, collect: Box::new(collect) }
}

/// Watch `resource` into a store.
fn watched<K>(client: kube::Client, resource: &'static str, type_name: &'static str) -> Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let synced = Arc::new(AtomicBool::new(false));
    let flag = synced.clone();
    tokio::spawn(async move {
        let api = Api::<K>::all(client);
        match api.list(&ListParams::default().limit(1)).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {
                telemetry::list(type_name, false);
                tracing::warn!(resource, "the apiserver does not serve this resource; it is not exported");
                flag.store(true, Ordering::Release);
                return;
            }
            // Anything else is the watcher's to retry.
            _ => {}
        }
        let events = watcher(api, watcher::Config::default()).default_backoff().modify(|o: &mut K| {
            let meta = o.meta_mut();
            meta.managed_fields = None;
            if let Some(a) = meta.annotations.as_mut() {
                a.remove(LAST_APPLIED);
            }
        });
        reflector::reflector(writer, events)
            .for_each(|ev| {
                match ev {
                    Ok(watcher::Event::InitDone) => {
                        if !flag.swap(true, Ordering::AcqRel) {
                            tracing::info!(resource, "listed");
                        }
                        telemetry::list(type_name, true);
                        // A watch follows every completed list.
                        telemetry::watch(type_name, true);
                    }
                    Ok(_) => {}
                    Err(watcher::Error::InitialListFailed(e)) => {
                        telemetry::list(type_name, false);
                        tracing::warn!(resource, error = %e, "list failed");
                    }
                    Err(e) => {
                        telemetry::watch(type_name, false);
                        tracing::debug!(resource, error = %e, "watch failed");
                    }
                }
                futures::future::ready(())
            })
            .await;
    });
    Watched { reader, synced }
}

#[cfg(test)]
impl Source {
    /// A source with fixed families, for tests of what serves them.
    pub fn fixed(resource: &'static str, synced: bool, families: Vec<Family>) -> Source {
        Source { resource, synced: Arc::new(AtomicBool::new(synced)), collect: Box::new(move || families.clone()) }
    }
}
