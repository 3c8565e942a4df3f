//! The EndpointSlice controller (`pkg/controller/endpointslice`) and the legacy
//! Endpoints controller (`pkg/controller/endpoint`): for every Service with a selector,
//! the pods it selects become endpoints — ready / serving / terminating in
//! `discovery.k8s.io/v1` EndpointSlices (at most 100 endpoints per slice, one slice set
//! per distinct resolved port list), and addresses / notReadyAddresses in the
//! Endpoints object of the same name. Named `targetPort`s resolve against each pod's
//! container ports. A pod event wakes the Services of its namespace at once.
//!
//! [`slices_of`] (over [`endpoint_pods`]) and [`desired_endpoints`] are the decisions (pure). A slice written
//! carries `endpoints.kubernetes.io/last-change-trigger-time` ([`crate::triggertime`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, Endpoints, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use crate::informer::{trigger, Informer};
use crate::runner::{run_controller, Policy};
use crate::triggertime::{self, TriggerTimes};
use crate::util::*;
use crate::Error;

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// The pods a Service selects that may be endpoints (have an IP, not finished), each with
/// its ports resolved: (pod, ready, serving, terminating, ports).
/// Resolved ports of one endpoint: (name, port, protocol).
type Ports = Vec<(Option<String>, i32, String)>;

/// A candidate endpoint: (pod, ready, serving, terminating, ports).
type Candidate<'a> = (&'a Pod, bool, bool, bool, Ports);

fn endpoint_pods<'a>(svc: &Service, pods: &'a [Arc<Pod>]) -> Vec<Candidate<'a>> {
    let spec = svc.spec.clone().unwrap_or_default();
    let Some(selector) = spec.selector.as_ref().filter(|s| !s.is_empty()) else { return Vec::new() };
    let ns = svc.metadata.namespace.as_deref();
    let publish = spec.publish_not_ready_addresses.unwrap_or(false);
    let mut out = Vec::new();
    for p in pods.iter().map(|p| p.as_ref()) {
        if p.metadata.namespace.as_deref() != ns || !map_selector_matches(selector, &labels(&p.metadata)) {
            continue;
        }
        let ip = p.status.as_ref().and_then(|s| s.pod_ip.as_deref()).unwrap_or("");
        if ip.is_empty() || matches!(pod_phase(p), "Succeeded" | "Failed") {
            continue;
        }
        let terminating = is_deleting(&p.metadata);
        let serving = is_pod_ready(p) || publish;
        let ready = serving && !terminating;
        let mut ports = Vec::new();
        for sp in spec.ports.iter().flatten() {
            let protocol = sp.protocol.clone().unwrap_or_else(|| "TCP".into());
            let port = match &sp.target_port {
                None => Some(sp.port),
                Some(IntOrString::Int(i)) => Some(*i),
                Some(IntOrString::String(name)) => match name.parse::<i32>() {
                    Ok(n) => Some(n),
                    Err(_) => p
                        .spec
                        .iter()
                        .flat_map(|s| s.containers.iter())
                        .flat_map(|c| c.ports.iter().flatten())
                        .find(|cp| {
                            cp.name.as_deref() == Some(name) && cp.protocol.as_deref().unwrap_or("TCP") == protocol
                        })
                        .map(|cp| cp.container_port),
                },
            };
            if let Some(port) = port {
                ports.push((sp.name.clone(), port, protocol));
            }
        }
        out.push((p, ready, serving, terminating, ports));
    }
    out
}

fn target_ref(p: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        name: p.metadata.name.clone(),
        namespace: p.metadata.namespace.clone(),
        uid: p.metadata.uid.clone(),
        ..Default::default()
    }
}

/// A pod's hostname as its endpoint's when the pod names this Service as its subdomain
/// (`ShouldSetHostname`): what makes `web-0.web.<ns>.svc.<domain>` resolve for a
/// StatefulSet's pods behind its headless Service.
fn endpoint_hostname(svc: &Service, p: &Pod) -> Option<String> {
    let spec = p.spec.as_ref()?;
    let host = spec.hostname.as_deref().filter(|h| !h.is_empty())?;
    (spec.subdomain.as_deref() == svc.metadata.name.as_deref() && p.metadata.namespace == svc.metadata.namespace)
        .then(|| host.to_string())
}

/// The EndpointSlices a Service should have (without names).
/// (The reconcile computes the endpoint pods once, for the slices and their trigger time.)
#[cfg(test)]
pub fn desired_slices(svc: &Service, pods: &[Arc<Pod>]) -> Vec<EndpointSlice> {
    slices_of(svc, endpoint_pods(svc, pods))
}

/// The EndpointSlices of `svc` whose endpoint pods are `eps` (from [`endpoint_pods`]).
fn slices_of(svc: &Service, mut eps: Vec<Candidate>) -> Vec<EndpointSlice> {
    if svc.spec.as_ref().and_then(|s| s.selector.as_ref()).is_none_or(|s| s.is_empty()) {
        return Vec::new();
    }
    let mut groups: BTreeMap<Ports, Vec<Endpoint>> = BTreeMap::new();
    eps.sort_by(|a, b| a.0.metadata.name.cmp(&b.0.metadata.name));
    for (p, ready, serving, terminating, ports) in eps {
        groups.entry(ports).or_default().push(Endpoint {
            addresses: vec![p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(serving),
                terminating: Some(terminating),
            }),
            node_name: p.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
            target_ref: Some(target_ref(p)),
            hostname: endpoint_hostname(svc, p),
            ..Default::default()
        });
    }
    let svc_name = svc.metadata.name.clone().unwrap_or_default();
    let meta = ObjectMeta {
        namespace: svc.metadata.namespace.clone(),
        labels: Some(BTreeMap::from([
            (SERVICE_NAME_LABEL.to_string(), svc_name.clone()),
            (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        ])),
        owner_references: Some(vec![owner_ref(svc)]),
        ..Default::default()
    };
    let slice = |ports: &[(Option<String>, i32, String)], endpoints: Vec<Endpoint>| EndpointSlice {
        metadata: meta.clone(),
        address_type: "IPv4".into(),
        endpoints: Some(endpoints),
        ports: Some(
            ports
                .iter()
                .map(|(n, p, proto)| EndpointPort {
                    name: n.clone().or(Some(String::new())),
                    port: Some(*p),
                    protocol: Some(proto.clone()),
                    app_protocol: None,
                })
                .collect(),
        ),
    };
    let mut out = Vec::new();
    for (ports, endpoints) in groups {
        for chunk in endpoints.chunks(MAX_ENDPOINTS_PER_SLICE) {
            out.push(slice(&ports, chunk.to_vec()));
        }
    }
    name_slices(&svc_name, &mut out);
    if out.is_empty() {
        // A Service with no endpoints still has one (empty) slice, as in Kubernetes.
        let ports: Vec<(Option<String>, i32, String)> = svc
            .spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .filter(|p| !matches!(&p.target_port, Some(IntOrString::String(s)) if s.parse::<i32>().is_err()))
            .map(|p| {
                let port = match &p.target_port {
                    Some(IntOrString::Int(i)) => *i,
                    Some(IntOrString::String(s)) => s.parse().unwrap_or(p.port),
                    None => p.port,
                };
                (p.name.clone(), port, p.protocol.clone().unwrap_or_else(|| "TCP".into()))
            })
            .collect();
        out.push(slice(&ports, Vec::new()));
        name_slices(&svc_name, &mut out);
    }
    out
}

/// Slices are named `<service>-<index>` rather than from `generateName`: a create that races
/// a cache which has not yet seen the previous one then fails with AlreadyExists instead of
/// making a duplicate (whose clean-up against a stale cache could delete the live slice).
fn name_slices(svc_name: &str, slices: &mut [EndpointSlice]) {
    for (i, s) in slices.iter_mut().enumerate() {
        s.metadata.name = Some(format!("{svc_name}-{i}"));
    }
}

/// The legacy Endpoints object of a Service (None when it has no selector).
pub fn desired_endpoints(svc: &Service, pods: &[Arc<Pod>]) -> Option<Endpoints> {
    if svc.spec.as_ref().and_then(|s| s.selector.as_ref()).is_none_or(|s| s.is_empty()) {
        return None;
    }
    let mut subsets: BTreeMap<Ports, (Vec<EndpointAddress>, Vec<EndpointAddress>)> = BTreeMap::new();
    let mut eps = endpoint_pods(svc, pods);
    eps.sort_by(|a, b| a.0.metadata.name.cmp(&b.0.metadata.name));
    for (p, ready, _serving, terminating, ports) in eps {
        if terminating {
            continue;
        }
        let addr = EndpointAddress {
            ip: p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
            node_name: p.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
            target_ref: Some(target_ref(p)),
            hostname: endpoint_hostname(svc, p),
        };
        let e = subsets.entry(ports).or_default();
        if ready {
            e.0.push(addr)
        } else {
            e.1.push(addr)
        }
    }
    let subsets: Vec<EndpointSubset> = subsets
        .into_iter()
        .filter(|(ports, _)| !ports.is_empty())
        .map(|(ports, (ready, not_ready))| EndpointSubset {
            addresses: (!ready.is_empty()).then_some(ready),
            not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
            ports: Some(
                ports
                    .into_iter()
                    .map(|(name, port, protocol)| k8s_openapi::api::core::v1::EndpointPort {
                        name,
                        port,
                        protocol: Some(protocol),
                        app_protocol: None,
                    })
                    .collect(),
            ),
        })
        .collect();
    Some(Endpoints {
        metadata: ObjectMeta {
            name: svc.metadata.name.clone(),
            namespace: svc.metadata.namespace.clone(),
            labels: svc.metadata.labels.clone(),
            ..Default::default()
        },
        subsets: (!subsets.is_empty()).then_some(subsets),
    })
}

struct Ctx {
    client: kube::Client,
    pods: Informer<Pod>,
    slices: Option<Informer<EndpointSlice>>,
    /// The trigger time of each slice update (EndpointSlice controller only).
    triggers: Mutex<TriggerTimes>,
    /// The Services, to forget the trigger times of deleted ones.
    services: Store<Service>,
}

/// This sync's trigger time for `svc` (see [`crate::triggertime`]); forgets deleted Services
/// once they are half of what is remembered.
fn trigger_time(ctx: &Ctx, svc: &Service, candidates: &[Candidate]) -> Option<String> {
    let mut triggers = ctx.triggers.lock().unwrap_or_else(|e| e.into_inner());
    let t = triggers.compute(svc, candidates.iter().map(|c| c.0));
    let services = ctx.services.state();
    if triggers.len() > 2 * services.len() + 16 {
        let live: std::collections::HashSet<(String, String)> = services
            .iter()
            .map(|s| (s.metadata.namespace.clone().unwrap_or_default(), s.metadata.name.clone().unwrap_or_default()))
            .collect();
        triggers.retain(|ns, name| live.contains(&(ns.to_string(), name.to_string())));
    }
    t.map(triggertime::format)
}

/// `slice` with the trigger-time annotation set to `t` (when there is one).
fn with_trigger_time(mut slice: EndpointSlice, t: &Option<String>) -> EndpointSlice {
    if let Some(t) = t {
        slice
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(triggertime::ANNOTATION.into(), t.clone());
    }
    slice
}

fn same_slice(a: &EndpointSlice, b: &EndpointSlice) -> bool {
    a.endpoints.clone().unwrap_or_default() == b.endpoints.clone().unwrap_or_default()
        && a.ports.clone().unwrap_or_default() == b.ports.clone().unwrap_or_default()
        && a.address_type == b.address_type
}

async fn reconcile_slices(svc: Arc<Service>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    if is_deleting(&svc.metadata) {
        return Ok(Action::await_change());
    }
    let Some(slices) = &ctx.slices else { return Ok(Action::await_change()) };
    let pods = ctx.pods.state();
    let candidates = endpoint_pods(&svc, &pods);
    let trigger = trigger_time(&ctx, &svc, &candidates);
    let desired = slices_of(&svc, candidates);
    let existing: Vec<Arc<EndpointSlice>> = slices
        .state()
        .into_iter()
        .filter(|s| {
            s.metadata.namespace.as_deref() == Some(&ns)
                && s.metadata.labels.as_ref().is_some_and(|l| {
                    l.get(SERVICE_NAME_LABEL) == Some(&name)
                        && l.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY)
                })
                && !is_deleting(&s.metadata)
        })
        .collect();
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    let has_selector = svc.spec.as_ref().and_then(|s| s.selector.as_ref()).is_some_and(|s| !s.is_empty());
    let mut lagging = false;
    for want in &desired {
        let want_name = want.metadata.name.as_deref().unwrap_or_default();
        match existing.iter().find(|e| e.metadata.name.as_deref() == Some(want_name)) {
            Some(have) if same_slice(have, want) => {}
            Some(have) => {
                let mut next = (**have).clone();
                next.endpoints = want.endpoints.clone();
                next.ports = want.ports.clone();
                api.replace(want_name, &PostParams::default(), &with_trigger_time(next, &trigger)).await?;
            }
            None => match api.create(&PostParams::default(), &with_trigger_time(want.clone(), &trigger)).await {
                Ok(_) => {}
                // Created earlier and not in the cache yet: look again once it is.
                Err(kube::Error::Api(e)) if e.code == 409 => lagging = true,
                Err(e) => return Err(e.into()),
            },
        }
    }
    if has_selector {
        let wanted: Vec<&str> = desired.iter().filter_map(|d| d.metadata.name.as_deref()).collect();
        for extra in existing.iter().filter(|e| !wanted.contains(&e.metadata.name.as_deref().unwrap_or_default())) {
            match api.delete(extra.metadata.name.as_deref().unwrap_or_default(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    if lagging {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

async fn reconcile_endpoints(svc: Arc<Service>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    if is_deleting(&svc.metadata) {
        return Ok(Action::await_change());
    }
    let Some(want) = desired_endpoints(&svc, &ctx.pods.state()) else { return Ok(Action::await_change()) };
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), &ns);
    match api.get_opt(&name).await? {
        None => {
            api.create(&PostParams::default(), &want).await?;
        }
        Some(have) if have.subsets.clone().unwrap_or_default() == want.subsets.clone().unwrap_or_default() => {}
        Some(mut have) => {
            have.subsets = want.subsets;
            api.replace(&name, &PostParams::default(), &have).await?;
        }
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

async fn run_with(client: kube::Client, pods: Informer<Pod>, slices: bool) {
    let slice_informer = slices.then(|| Informer::start(Api::<EndpointSlice>::all(client.clone())));
    let (tx, triggers) = trigger::<Service>();
    let controller =
        Controller::new(Api::<Service>::all(client.clone()), watcher::Config::default()).reconcile_on(triggers);
    let store = controller.store();
    let ctx = Arc::new(Ctx {
        client,
        pods: pods.clone(),
        slices: slice_informer.clone(),
        triggers: Mutex::new(TriggerTimes::default()),
        services: store.clone(),
    });
    pods.add_handler(move |p, _| {
        let ns = p.metadata.namespace.as_deref();
        for s in store.state() {
            if s.metadata.namespace.as_deref() == ns
                && s.spec.as_ref().and_then(|x| x.selector.as_ref()).is_some_and(|x| !x.is_empty())
            {
                let _ = tx.send(ObjectRef::from_obj(s.as_ref()));
            }
        }
    });
    pods.synced().await;
    if let Some(s) = &slice_informer {
        s.synced().await;
    }
    let retry = Duration::from_secs(1);
    if slices {
        let policy = Policy { metric: "endpointslice", what: "endpoints", retry };
        run_controller(controller, reconcile_slices, ctx, policy).await;
    } else {
        let policy = Policy { metric: "endpoints", what: "endpoints", retry };
        run_controller(controller, reconcile_endpoints, ctx, policy).await;
    }
}

pub async fn run_slices(client: kube::Client, pods: Informer<Pod>) {
    run_with(client, pods, true).await
}

pub async fn run_endpoints(client: kube::Client, pods: Informer<Pod>) {
    run_with(client, pods, false).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use k8s_openapi::api::core::v1::{ContainerPort, ServicePort, ServiceSpec};

    fn svc(target: IntOrString) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("uid-s".into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                selector: Some(lbl(&[("app", "web")])),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    target_port: Some(target),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn web_pod(name: &str, ready: bool, since: i64, port: i32) -> Pod {
        let mut p = pod::<Service>(name, &[("app", "web")], None);
        make_running(&mut p, "n1", ready, since);
        p.spec.as_mut().unwrap().containers = vec![k8s_openapi::api::core::v1::Container {
            name: "c".into(),
            ports: Some(vec![ContainerPort { name: Some("http".into()), container_port: port, ..Default::default() }]),
            ..Default::default()
        }];
        p
    }

    #[test]
    fn ready_serving_terminating_and_named_ports() {
        let s = svc(IntOrString::String("http".into()));
        let mut term = web_pod("c", true, 3, 8080);
        term.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
        let mut other = pod::<Service>("x", &[("app", "other")], None);
        make_running(&mut other, "n1", true, 4);
        let pods: Vec<Arc<Pod>> = [web_pod("a", true, 1, 8080), web_pod("b", false, 2, 8080), term, other]
            .into_iter()
            .map(Arc::new)
            .collect();
        let slices = desired_slices(&s, &pods);
        assert_eq!(slices.len(), 1);
        let sl = &slices[0];
        assert_eq!(sl.ports.as_ref().unwrap()[0].port, Some(8080));
        let eps = sl.endpoints.as_ref().unwrap();
        let conds: Vec<(bool, bool, bool)> = eps
            .iter()
            .map(|e| {
                e.conditions.as_ref().map(|c| (c.ready.unwrap(), c.serving.unwrap(), c.terminating.unwrap())).unwrap()
            })
            .collect();
        assert_eq!(conds, vec![(true, true, false), (false, false, false), (false, true, true)]);
        assert_eq!(sl.metadata.labels.as_ref().unwrap()[SERVICE_NAME_LABEL], "web");

        let ep = desired_endpoints(&s, &pods).unwrap();
        let sub = &ep.subsets.as_ref().unwrap()[0];
        assert_eq!(sub.addresses.as_ref().unwrap().len(), 1);
        assert_eq!(sub.not_ready_addresses.as_ref().unwrap().len(), 1);
        assert_eq!(sub.ports.as_ref().unwrap()[0].port, 8080);
    }

    #[test]
    fn pods_with_this_service_as_subdomain_publish_their_hostname() {
        let s = svc(IntOrString::Int(80));
        let mut a = web_pod("web-0", true, 1, 80);
        let spec = a.spec.as_mut().unwrap();
        spec.hostname = Some("web-0".into());
        spec.subdomain = Some("web".into());
        let mut b = web_pod("web-1", true, 2, 80);
        b.spec.as_mut().unwrap().hostname = Some("web-1".into());
        b.spec.as_mut().unwrap().subdomain = Some("other".into());
        let pods: Vec<Arc<Pod>> = [a, b].into_iter().map(Arc::new).collect();
        let hosts: Vec<Option<String>> =
            desired_slices(&s, &pods)[0].endpoints.iter().flatten().map(|e| e.hostname.clone()).collect();
        assert_eq!(hosts, [Some("web-0".to_string()), None]);
        let ep = desired_endpoints(&s, &pods).unwrap();
        let addrs = ep.subsets.unwrap()[0].addresses.clone().unwrap();
        assert_eq!(addrs[0].hostname.as_deref(), Some("web-0"));
    }

    #[test]
    fn pods_with_different_named_port_numbers_get_separate_slices() {
        let s = svc(IntOrString::String("http".into()));
        let pods: Vec<Arc<Pod>> =
            [web_pod("a", true, 1, 8080), web_pod("b", true, 2, 9090)].into_iter().map(Arc::new).collect();
        assert_eq!(desired_slices(&s, &pods).len(), 2);
    }

    #[test]
    fn large_services_are_split_at_100() {
        let s = svc(IntOrString::Int(8080));
        let pods: Vec<Arc<Pod>> = (0..250).map(|i| Arc::new(web_pod(&format!("p{i:03}"), true, i, 8080))).collect();
        let slices = desired_slices(&s, &pods);
        assert_eq!(slices.iter().map(|s| s.endpoints.as_ref().unwrap().len()).collect::<Vec<_>>(), vec![100, 100, 50]);
        let names: Vec<_> = slices.iter().map(|s| s.metadata.name.clone().unwrap_or_default()).collect();
        assert_eq!(names, ["web-0", "web-1", "web-2"], "deterministic names, so a racing create cannot duplicate");
        assert!(desired_slices(&s, &[])[0].metadata.name.as_deref() == Some("web-0"), "the empty slice too");
    }

    #[test]
    fn no_selector_no_endpoints() {
        let mut s = svc(IntOrString::Int(80));
        s.spec.as_mut().unwrap().selector = None;
        assert!(desired_slices(&s, &[]).is_empty());
        assert!(desired_endpoints(&s, &[]).is_none());
    }
}
