//! API aggregation (kube-aggregator in kube-apiserver): an `apiregistration.k8s.io/v1`
//! APIService that names a Service hands its group-version to another API server.
//!
//! - Routing: every request under `/apis/<group>/<version>` of such an APIService is proxied
//!   ([`Aggregator::serving`], [`Aggregator::handle`]), after this apiserver's own
//!   authentication and authorization, to a ready endpoint of the Service (endpoint routing,
//!   `endpoints.rs`) over HTTPS (`proxy.rs`), with who asked in `X-Remote-User` /
//!   `X-Remote-Group`; while the APIService is not `Available` the answer is kube-aggregator's
//!   `503 service unavailable`.
//! - Availability: a controller re-checks each such APIService when it, its Service or the
//!   Service's EndpointSlices/Endpoints change, and every resync interval (30 s by default;
//!   a failed discovery check sooner, backing off): the decision is `availability.rs` (pure),
//!   the status is written through the registry's status update only when it changes.
//! - Discovery: `/apis` and `/apis/<group>` list the aggregated groups and versions by their
//!   priorities; `/apis/<group>/<version>` is the backend's own document, as the last
//!   successful discovery check fetched it (refreshed on every check), else proxied.
//!
//! The routing table is a snapshot of the stored APIServices, kept by a list + watch.

pub mod availability;
pub mod endpoints;
pub mod proxy;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures::StreamExt;
use http::StatusCode;
use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult};
use crate::registry::generic::{prefix_of, Intent, ListOptions, Registry, UpdateKind, WriteOptions};
use crate::registry::ResourceDef;
use crate::resources;
use availability::{decide, is_available, with_condition, Condition, Lookup, Verdict};
use endpoints::{resolve, slices_of_endpoints, ServiceRef, SERVICE_NAME_LABEL};

pub const GROUP: &str = "apiregistration.k8s.io";
/// kube-aggregator's resync of every APIService.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(30);
/// How long one discovery check may take, and how many run at once.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const PROBE_ATTEMPTS: usize = 5;

/// One APIService that names a Service, as the routing table holds it.
pub struct Entry {
    pub name: String,
    pub group: String,
    pub version: String,
    pub group_priority_minimum: i64,
    pub version_priority: i64,
    pub service: ServiceRef,
    pub available: bool,
    /// The TLS client configuration towards the backend, or why it cannot be built (500).
    tls: Result<Arc<rustls::ClientConfig>, String>,
    /// The stored spec, to tell a change.
    spec: Value,
}

impl Entry {
    fn of(obj: &Value, identity: Option<&proxy::Identity>, previous: Option<&Entry>) -> Option<Entry> {
        let service = ServiceRef::of(obj)?;
        let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
        let s = |k: &str| spec.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let i = |k: &str| spec.get(k).and_then(Value::as_i64).unwrap_or(0);
        let tls = match previous.filter(|p| p.spec == spec) {
            Some(p) => p.tls.clone(),
            None => {
                use base64::Engine;
                let ca = spec.get("caBundle").and_then(Value::as_str).unwrap_or_default();
                base64::engine::general_purpose::STANDARD.decode(ca).map_err(|e| format!("caBundle: {e}")).and_then(
                    |ca| {
                        let insecure = spec.get("insecureSkipTLSVerify").and_then(Value::as_bool).unwrap_or(false);
                        proxy::client_config(&ca, insecure, identity)
                    },
                )
            }
        };
        Some(Entry {
            name: obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string(),
            group: s("group"),
            version: s("version"),
            group_priority_minimum: i("groupPriorityMinimum"),
            version_priority: i("versionPriority"),
            service,
            available: is_available(obj),
            tls,
            spec,
        })
    }

    fn key(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// The discovery document's path (`/api/v1` for the legacy group's APIService `v1.`).
    fn discovery_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

/// The routing table: aggregated APIServices by `<group>/<version>`.
#[derive(Default)]
struct Snapshot {
    by_gv: HashMap<String, Arc<Entry>>,
}

pub struct Aggregator {
    registry: Arc<Registry>,
    identity: Option<proxy::Identity>,
    snapshot: RwLock<Arc<Snapshot>>,
    /// The backends' discovery documents (`APIResourceList`) by APIService name, as the last
    /// successful check fetched them.
    discovery: RwLock<HashMap<String, Value>>,
    queue: Mutex<BTreeSet<String>>,
    wake: tokio::sync::Notify,
    /// Consecutive failed discovery checks by APIService name (the backoff of re-checks).
    failures: Mutex<HashMap<String, u32>>,
    resync: Duration,
    probe_tls: Arc<rustls::ClientConfig>,
}

/// `<group>/<version>` of a path under `/apis/<group>/<version>`, without allocating.
pub fn gv_of_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/apis/")?;
    let slash = rest.find('/')?;
    let end = rest[slash + 1..].find('/').map(|i| slash + 1 + i).unwrap_or(rest.len());
    (slash > 0 && end > slash + 1).then(|| &rest[..end])
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

/// A resource of the built-in table.
fn def(group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
    resources::find(group, version, plural)
}

fn no_resource() -> ApiError {
    ApiError::internal("a built-in resource is missing from the resource table")
}

impl Aggregator {
    /// `identity`: the client certificate presented to backends; `resync`: how often every
    /// APIService is checked again.
    pub fn new(
        registry: Arc<Registry>,
        identity: Option<proxy::Identity>,
        resync: Duration,
    ) -> Result<Arc<Self>, String> {
        let probe_tls = proxy::client_config(b"", true, identity.as_ref())?;
        Ok(Arc::new(Aggregator {
            registry,
            identity,
            snapshot: RwLock::new(Arc::new(Snapshot::default())),
            discovery: RwLock::new(HashMap::new()),
            queue: Mutex::new(BTreeSet::new()),
            wake: tokio::sync::Notify::new(),
            failures: Mutex::new(HashMap::new()),
            resync,
            probe_tls,
        }))
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The aggregated APIService serving `path`, if any: the request is then proxied.
    pub fn serving(&self, path: &str) -> Option<Arc<Entry>> {
        let snapshot = self.snapshot.read().unwrap_or_else(|p| p.into_inner());
        if snapshot.by_gv.is_empty() {
            return None;
        }
        snapshot.by_gv.get(gv_of_path(path)?).cloned()
    }

    /// Answer a request of an aggregated group-version: proxied to its Service, or the cached
    /// discovery document for `GET /apis/<group>/<version>`.
    pub async fn handle(&self, entry: Arc<Entry>, parts: &mut http::request::Parts, body: Body) -> Response {
        if !entry.available {
            return proxy::text_error(StatusCode::SERVICE_UNAVAILABLE, "service unavailable");
        }
        let tls = match &entry.tls {
            Ok(tls) => tls.clone(),
            Err(e) => return proxy::text_error(StatusCode::INTERNAL_SERVER_ERROR, e),
        };
        if parts.method == http::Method::GET && parts.uri.path().trim_end_matches('/') == entry.discovery_path() {
            let cached = self.discovery.read().unwrap_or_else(|p| p.into_inner()).get(&entry.name).cloned();
            if let Some(doc) = cached {
                let mut r = Response::new(Body::from(serde_json::to_vec(&doc).unwrap_or_default()));
                r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
                return r;
            }
        }
        let (service, slices) = self.lookups(&entry.service).await;
        let addrs = match (&service, &slices) {
            (Lookup::Found(svc), Lookup::Found(slices)) => resolve(svc, slices, entry.service.port),
            (Lookup::NotFound, _) => Err(format!("service {:?} not found", entry.service.name)),
            (Lookup::Failed(e), _) | (_, Lookup::Failed(e)) => Err(e.clone()),
            (_, Lookup::NotFound) => Err("no endpoints".into()),
        };
        let (host, port) = match addrs {
            Ok(a) => a[rand::random::<u32>() as usize % a.len()].clone(),
            Err(e) => {
                tracing::warn!(apiservice = entry.name, error = e, "error resolving the aggregated API's service");
                return proxy::text_error(StatusCode::SERVICE_UNAVAILABLE, "service unavailable");
            }
        };
        let requester = {
            let user = crate::authz::User::of(parts.extensions.get::<crate::authn::UserInfo>());
            proxy::Requester { name: user.name, groups: user.groups }
        };
        let headers = proxy::request_headers(&parts.headers, &requester, proxy::is_upgrade(&parts.headers));
        let server_name = entry.service.server_name();
        match proxy::exchange(&host, port, &server_name, tls, parts, headers, body).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(apiservice = entry.name, error = e, "proxying to the aggregated API failed");
                proxy::text_error(StatusCode::SERVICE_UNAVAILABLE, &e)
            }
        }
    }

    /// The Service an APIService names and its EndpointSlices (its Endpoints read as slices
    /// when it has none), read through the registry.
    async fn lookups(&self, svc: &ServiceRef) -> (Lookup<Value>, Lookup<Vec<Value>>) {
        let read = async {
            let service = match self
                .registry
                .get(def("", "v1", "services").ok_or_else(no_resource)?, &svc.namespace, &svc.name)
                .await
            {
                Ok(s) => Lookup::Found(s),
                Err(e) if e.code == 404 => Lookup::NotFound,
                Err(e) => Lookup::Failed(e.message),
            };
            let slices_res = def("discovery.k8s.io", "v1", "endpointslices").ok_or_else(no_resource)?;
            let slices = match self.registry.list(slices_res, Some(&svc.namespace), &ListOptions::default()).await {
                Err(e) => Lookup::Failed(e.message),
                Ok(list) => {
                    let mine: Vec<Value> = list["items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|s| {
                            s.pointer(&format!("/metadata/labels/{}", SERVICE_NAME_LABEL.replace('/', "~1")))
                                .and_then(Value::as_str)
                                == Some(svc.name.as_str())
                        })
                        .cloned()
                        .collect();
                    if mine.is_empty() {
                        match self
                            .registry
                            .get(def("", "v1", "endpoints").ok_or_else(no_resource)?, &svc.namespace, &svc.name)
                            .await
                        {
                            Ok(eps) => Lookup::Found(slices_of_endpoints(&eps)),
                            Err(e) if e.code == 404 => Lookup::Found(vec![]),
                            Err(e) => Lookup::Failed(e.message),
                        }
                    } else {
                        Lookup::Found(mine)
                    }
                }
            };
            Ok::<_, ApiError>((service, slices))
        };
        read.await.unwrap_or_else(|e: ApiError| (Lookup::Failed(e.message.clone()), Lookup::Failed(e.message)))
    }

    // ------------------------------------------------------------------ discovery

    /// The aggregated group-versions, ordered as kube-aggregator orders them.
    fn group_versions(&self) -> Vec<GroupVersion> {
        let snapshot = self.snapshot();
        snapshot
            .by_gv
            .values()
            .filter(|e| !e.group.is_empty())
            .map(|e| GroupVersion {
                name: e.name.clone(),
                group: e.group.clone(),
                version: e.version.clone(),
                group_priority: e.group_priority_minimum,
                version_priority: e.version_priority,
            })
            .collect()
    }

    /// `/apis` (an APIGroupList) with the aggregated groups and versions added.
    pub fn add_groups(&self, list: &mut Value) {
        let gvs = self.group_versions();
        if gvs.is_empty() {
            return;
        }
        if let Some(groups) = list.get_mut("groups").and_then(Value::as_array_mut) {
            merge_groups(groups, gvs);
        }
    }

    /// `/apis/<group>` (an APIGroup): the local one with the aggregated versions added, or
    /// the aggregated group alone.
    pub fn group(&self, group: &str, local: Option<Value>) -> Option<Value> {
        let gvs: Vec<GroupVersion> = self.group_versions().into_iter().filter(|gv| gv.group == group).collect();
        if gvs.is_empty() {
            return local;
        }
        let mut groups: Vec<Value> = local.into_iter().collect();
        merge_groups(&mut groups, gvs);
        let mut doc = groups.into_iter().next()?;
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        Some(doc)
    }

    // ------------------------------------------------------------------ the controller

    /// List the APIServices once (so that routing is in place before the apiserver serves),
    /// then keep the table current and the aggregated APIServices' availability checked.
    pub async fn start(self: &Arc<Self>) -> ApiResult<()> {
        let revision = self.relist().await?;
        tokio::spawn(self.clone().feed(revision));
        tokio::spawn(self.clone().follow_services());
        tokio::spawn(self.clone().work());
        Ok(())
    }

    fn enqueue(&self, name: &str) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string());
        self.wake.notify_one();
    }

    /// List the APIServices into a new table; queue those new or changed. Returns the list's
    /// revision.
    async fn relist(&self) -> ApiResult<storage::Revision> {
        let res = def(GROUP, "v1", "apiservices").ok_or_else(no_resource)?;
        let list = self.registry.list(res, None, &ListOptions::default()).await?;
        let old = self.snapshot();
        let old_by_name: HashMap<&str, &Arc<Entry>> = old.by_gv.values().map(|e| (e.name.as_str(), e)).collect();
        let mut by_gv = HashMap::new();
        for obj in list["items"].as_array().into_iter().flatten() {
            let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            let previous = old_by_name.get(name).map(|e| e.as_ref());
            let Some(entry) = Entry::of(obj, self.identity.as_ref(), previous) else { continue };
            if previous.is_none_or(|p| p.spec != entry.spec) {
                self.enqueue(name);
            }
            by_gv.insert(entry.key(), Arc::new(entry));
        }
        let names: BTreeSet<&str> = by_gv.values().map(|e| e.name.as_str()).collect();
        self.discovery.write().unwrap_or_else(|p| p.into_inner()).retain(|n, _| names.contains(n.as_str()));
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Snapshot { by_gv });
        Ok(list.pointer("/metadata/resourceVersion").and_then(Value::as_str).and_then(|s| s.parse().ok()).unwrap_or(0))
    }

    /// Re-list after any change of an APIService (they are few).
    async fn feed(self: Arc<Self>, mut revision: storage::Revision) {
        let Some(res) = def(GROUP, "v1", "apiservices") else { return };
        let prefix = prefix_of(res, None);
        loop {
            match self.registry.store.watch(&prefix, revision).await {
                Ok(mut events) => {
                    let _ = events.next().await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "APIService watch failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            match self.relist().await {
                Ok(r) => revision = r,
                Err(e) => {
                    tracing::debug!(error = %e, "APIService list failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Queue the APIServices whose Service, EndpointSlices or Endpoints change.
    async fn follow_services(self: Arc<Self>) {
        let prefixes: Vec<String> = [("", "services"), ("discovery.k8s.io", "endpointslices"), ("", "endpoints")]
            .iter()
            .filter_map(|(g, p)| resources::find(g, "v1", p).map(|r| prefix_of(r, None)))
            .collect();
        loop {
            let Ok(revision) = self.registry.store.current_revision().await else {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            };
            let mut streams = Vec::new();
            for prefix in &prefixes {
                match self.registry.store.watch(prefix, revision).await {
                    Ok(s) => streams.push(s),
                    Err(e) => tracing::debug!(prefix, error = %e, "aggregator: watch failed"),
                }
            }
            let mut events = futures::stream::select_all(streams);
            while let Some(Ok(ev)) = events.next().await {
                let obj = if ev.kv.value.is_empty() { ev.prev.as_ref().map(|p| &p.value) } else { Some(&ev.kv.value) };
                let Some(obj) = obj.and_then(|v| serde_json::from_slice::<Value>(v).ok()) else { continue };
                let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
                let service = match obj.get("kind").and_then(Value::as_str) {
                    Some("EndpointSlice") => obj
                        .pointer(&format!("/metadata/labels/{}", SERVICE_NAME_LABEL.replace('/', "~1")))
                        .and_then(Value::as_str),
                    _ => obj.pointer("/metadata/name").and_then(Value::as_str),
                };
                let Some(service) = service else { continue };
                for e in self.snapshot().by_gv.values() {
                    if e.service.namespace == ns && e.service.name == service {
                        self.enqueue(&e.name);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Check what is queued, and everything every resync interval.
    async fn work(self: Arc<Self>) {
        let mut resync = tokio::time::interval(self.resync);
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = resync.tick() => {
                    for e in self.snapshot().by_gv.values() {
                        self.queue.lock().unwrap_or_else(|p| p.into_inner()).insert(e.name.clone());
                    }
                }
            }
            let names: Vec<String> =
                std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner())).into_iter().collect();
            let checks = names.iter().map(|n| self.check(n));
            for (name, result) in names.iter().zip(futures::future::join_all(checks).await) {
                match result {
                    Ok(failed) => self.backoff(name, failed),
                    Err(e) => {
                        tracing::warn!(apiservice = name, error = %e, "APIService availability check failed");
                        self.backoff(name, true);
                    }
                }
            }
        }
    }

    /// After a failed discovery check, check again after 1 s, 2 s, 4 s … up to the resync
    /// interval (kube-aggregator requeues failures with a backoff too).
    fn backoff(self: &Arc<Self>, name: &str, failed: bool) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if !failed {
            failures.remove(name);
            return;
        }
        let n = failures.entry(name.to_string()).or_insert(0);
        *n = (*n + 1).min(16);
        let delay = Duration::from_secs(1u64 << (*n - 1).min(10)).min(self.resync);
        let (me, name) = (self.clone(), name.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            me.enqueue(&name);
        });
    }

    /// Check one APIService and record its availability. `Ok(true)`: its discovery check
    /// failed (check again soon).
    async fn check(&self, name: &str) -> ApiResult<bool> {
        let res = def(GROUP, "v1", "apiservices").ok_or_else(no_resource)?;
        let obj = match self.registry.get(res, "", name).await {
            Ok(o) => o,
            Err(e) if e.code == 404 => return Ok(false),
            Err(e) => return Err(e),
        };
        let Some(svc) = ServiceRef::of(&obj) else { return Ok(false) };
        let (service, slices) = self.lookups(&svc).await;
        let mut verdict = decide(&svc, &service, &slices, None);
        if verdict == Verdict::Probe {
            let (group, version) = (str_at(&obj, "/spec/group"), str_at(&obj, "/spec/version"));
            let path = if group.is_empty() { format!("/api/{version}") } else { format!("/apis/{group}/{version}") };
            let results = self.probe(&svc, &service, &slices, &path).await;
            if let Some(doc) = results.iter().find_map(|r| r.as_ref().ok()) {
                let mut cache = self.discovery.write().unwrap_or_else(|p| p.into_inner());
                match serde_json::from_slice::<Value>(doc).ok().filter(|d| d["kind"] == "APIResourceList") {
                    Some(doc) => cache.insert(name.to_string(), doc),
                    None => cache.remove(name),
                };
            }
            let outcomes: Vec<Result<(), String>> = results.into_iter().map(|r| r.map(|_| ())).collect();
            verdict = decide(&svc, &service, &slices, Some(&outcomes));
        }
        let Verdict::Condition(condition) = verdict else { return Ok(false) };
        let failed = condition.reason == "FailedDiscoveryCheck";
        self.record(res, name, &obj, &condition).await?;
        Ok(failed)
    }

    /// Five discovery GETs at once, each to a ready endpoint picked at random.
    async fn probe(
        &self,
        svc: &ServiceRef,
        service: &Lookup<Value>,
        slices: &Lookup<Vec<Value>>,
        path: &str,
    ) -> Vec<Result<bytes::Bytes, String>> {
        let addrs = match (service, slices) {
            (Lookup::Found(s), Lookup::Found(slices)) => resolve(s, slices, svc.port),
            (Lookup::Found(s), _) => resolve(s, &[], svc.port),
            _ => Err(format!("service {:?} not found", svc.name)),
        };
        let attempts = (0..PROBE_ATTEMPTS).map(|_| {
            let addrs = addrs.clone();
            let tls = self.probe_tls.clone();
            async move {
                let addrs = addrs?;
                let (host, port) = &addrs[rand::random::<u32>() as usize % addrs.len()];
                proxy::probe(host, *port, path, tls, PROBE_TIMEOUT).await
            }
        });
        futures::future::join_all(attempts).await
    }

    /// Write the Available condition through the status subresource when it changed.
    async fn record(&self, res: &ResourceDef, name: &str, obj: &Value, c: &Condition) -> ApiResult<()> {
        let now = crate::registry::generic::now_rfc3339();
        if obj.get("status") == Some(&with_condition(obj.get("status"), c, &now)) {
            return Ok(());
        }
        let was = obj
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|x| x["type"] == "Available"))
            .and_then(|x| x["status"].as_str())
            .unwrap_or("Unknown")
            .to_string();
        if was != c.status {
            tracing::info!(
                apiservice = name,
                old = was,
                new = c.status,
                reason = c.reason,
                message = c.message,
                "changing APIService availability"
            );
        }
        // The signature guaranteed_update takes.
        #[allow(clippy::result_large_err)]
        let update = |current: Option<&Value>| -> ApiResult<Option<Intent>> {
            Ok(current.map(|cur| {
                let mut object = cur.clone();
                object["status"] = with_condition(cur.get("status"), c, &now);
                Intent { object, precondition: None }
            }))
        };
        match self.registry.guaranteed_update(res, "", name, UpdateKind::Status, &WriteOptions::default(), update).await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// One aggregated group-version as discovery lists it.
#[derive(Clone, Debug)]
pub struct GroupVersion {
    pub name: String,
    pub group: String,
    pub version: String,
    pub group_priority: i64,
    pub version_priority: i64,
}

/// Kubernetes' version order (`CompareKubeAwareVersionStrings`), highest first: GA before
/// beta before alpha, higher numbers first, anything else after them by name.
pub fn kube_version_key(v: &str) -> (u8, i64, i64, String) {
    let parse = || -> Option<(u8, i64, i64)> {
        let rest = v.strip_prefix('v')?;
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let major: i64 = rest[..digits].parse().ok()?;
        let tail = &rest[digits..];
        if tail.is_empty() {
            return Some((0, -major, 0));
        }
        for (rank, word) in [(1u8, "beta"), (2u8, "alpha")] {
            if let Some(n) = tail.strip_prefix(word) {
                return Some((rank, -major, -n.parse::<i64>().ok()?));
            }
        }
        None
    };
    match parse() {
        Some((rank, major, minor)) => (rank, major, minor, String::new()),
        None => (3, 0, 0, v.to_string()),
    }
}

/// Add aggregated group-versions to discovery's groups (each `{name, versions,
/// preferredVersion}`): a group this apiserver serves gets the versions it lacks; a new group
/// is appended, groups by `groupPriorityMinimum` (highest first, then by name), versions by
/// `versionPriority` then Kubernetes' version order, the first preferred — as kube-aggregator
/// sorts them.
pub fn merge_groups(groups: &mut Vec<Value>, mut gvs: Vec<GroupVersion>) {
    gvs.sort_by(|a, b| b.group_priority.cmp(&a.group_priority).then_with(|| a.name.cmp(&b.name)));
    let mut order: Vec<String> = Vec::new();
    for gv in &gvs {
        if !order.contains(&gv.group) {
            order.push(gv.group.clone());
        }
    }
    for group in order {
        let mut versions: Vec<&GroupVersion> = gvs.iter().filter(|gv| gv.group == group).collect();
        versions.sort_by(|a, b| {
            b.version_priority
                .cmp(&a.version_priority)
                .then_with(|| kube_version_key(&a.version).cmp(&kube_version_key(&b.version)))
        });
        let entry =
            |gv: &GroupVersion| json!({"groupVersion": format!("{}/{}", gv.group, gv.version), "version": gv.version});
        match groups.iter_mut().find(|g| g["name"] == group.as_str()) {
            Some(existing) => {
                if let Some(vs) = existing.get_mut("versions").and_then(Value::as_array_mut) {
                    for gv in versions {
                        if !vs.iter().any(|v| v["version"] == gv.version.as_str()) {
                            vs.push(entry(gv));
                        }
                    }
                }
            }
            None => {
                let vs: Vec<Value> = versions.iter().map(|gv| entry(gv)).collect();
                groups.push(json!({"name": group, "versions": vs, "preferredVersion": vs[0].clone()}));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_group_version() {
        assert_eq!(gv_of_path("/apis/wardle.example.com/v1alpha1"), Some("wardle.example.com/v1alpha1"));
        assert_eq!(gv_of_path("/apis/wardle.example.com/v1alpha1/"), Some("wardle.example.com/v1alpha1"));
        assert_eq!(
            gv_of_path("/apis/wardle.example.com/v1alpha1/namespaces/default/flunders"),
            Some("wardle.example.com/v1alpha1")
        );
        assert_eq!(gv_of_path("/apis/wardle.example.com"), None);
        assert_eq!(gv_of_path("/apis/wardle.example.com/"), None);
        assert_eq!(gv_of_path("/api/v1/pods"), None);
        assert_eq!(gv_of_path("/apis"), None);
    }

    fn gv(name: &str, gp: i64, vp: i64) -> GroupVersion {
        let (version, group) = name.split_once('.').unwrap();
        GroupVersion {
            name: name.into(),
            group: group.into(),
            version: version.into(),
            group_priority: gp,
            version_priority: vp,
        }
    }

    #[test]
    fn aggregated_groups_are_listed_by_priority() {
        let mut groups = vec![json!({"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}})];
        merge_groups(
            &mut groups,
            vec![
                gv("v1alpha1.wardle.example.com", 1000, 15),
                gv("v1beta1.wardle.example.com", 1000, 15),
                gv("v1beta1.metrics.example.com", 2000, 100),
                gv("v2.apps", 17800, 15),
            ],
        );
        let names: Vec<&str> = groups.iter().map(|g| g["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["apps", "metrics.example.com", "wardle.example.com"]);
        assert_eq!(groups[0]["versions"].as_array().unwrap().len(), 2, "apps gets v2");
        assert_eq!(groups[2]["preferredVersion"]["version"], "v1beta1");
        assert_eq!(groups[2]["versions"][1]["groupVersion"], "wardle.example.com/v1alpha1");
    }

    #[test]
    fn kubernetes_version_order() {
        let mut vs = vec!["v1alpha1", "foo", "v2", "v1beta2", "v1", "v1beta1", "v10alpha1"];
        vs.sort_by_key(|v| kube_version_key(v));
        assert_eq!(vs, ["v2", "v1", "v1beta2", "v1beta1", "v10alpha1", "v1alpha1", "foo"]);
    }
}
