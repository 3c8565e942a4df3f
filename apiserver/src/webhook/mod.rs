//! Dynamic admission control: `admissionregistration.k8s.io/v1` Mutating- and
//! ValidatingWebhookConfigurations. A write that meets a webhook's rules and selectors is
//! sent to it as an `admission.k8s.io/v1` AdmissionReview over HTTPS: mutating webhooks one
//! after another (configurations by name, webhooks in order; their JSON patches applied,
//! `reinvocationPolicy: IfNeeded` honoured once), after the built-in mutating admission;
//! validating webhooks all at once, after the object passed validation, just before it is
//! stored. A webhook that cannot be called (down, too slow, a malformed answer) fails the
//! request under `failurePolicy: Fail` (500) and is skipped under `Ignore`.
//!
//! - `rules.rs` — matching (pure): rules, namespace and object selectors.
//! - `review.rs` — the AdmissionReview request and the reading of the answer (pure).
//! - `call.rs` — the HTTPS POST.
//! - this module — the configurations, kept from storage by a list + watch, and the two
//!   entry points the generic store calls (`Caller` implements its `AdmissionWebhooks`).
//!
//! With no configuration stored, a write pays one atomic load.

pub mod call;
pub mod review;
pub mod rules;

use std::collections::BTreeMap;
use std::sync::{Arc, Once, RwLock};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use storage::{Range, Store};

use crate::error::{ApiError, ApiResult};
use crate::registry::generic::{key_of, prefix_of, AdmissionWebhooks, WebhookWrite as Write};
use crate::resources;
use rules::{Attributes, FailurePolicy, Hook, SideEffects};

pub const GROUP: &str = "admissionregistration.k8s.io";
const KINDS: [(&str, bool); 2] = [("mutatingwebhookconfigurations", true), ("validatingwebhookconfigurations", false)];

/// The compiled webhooks, in the order they are called.
#[derive(Default)]
struct Configured {
    mutating: Vec<Hook>,
    validating: Vec<Hook>,
    /// False until the first list: callers read storage themselves meanwhile.
    synced: bool,
}

/// The stored configurations, kept current.
pub struct Webhooks {
    store: Arc<dyn Store>,
    configured: RwLock<Arc<Configured>>,
    start: Once,
}

/// A request's admission context: who asks (the AdmissionReview's `userInfo`).
pub struct Caller {
    pub webhooks: Arc<Webhooks>,
    pub user: Value,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller").field("user", &self.user).finish()
    }
}

impl Webhooks {
    pub fn new(store: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Webhooks { store, configured: RwLock::new(Arc::new(Configured::default())), start: Once::new() })
    }

    /// Known to have no configuration at all (the feed has listed and found none): the
    /// request path then hands the store no webhooks, and a write costs nothing more.
    pub fn none_configured(&self) -> bool {
        let c = self.configured.read().unwrap_or_else(|p| p.into_inner());
        c.synced && c.mutating.is_empty() && c.validating.is_empty()
    }

    async fn current(self: &Arc<Self>) -> ApiResult<Arc<Configured>> {
        self.start.call_once(|| {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(feed(self.clone()));
            }
        });
        let c = self.configured.read().unwrap_or_else(|p| p.into_inner()).clone();
        if c.synced {
            return Ok(c);
        }
        Ok(Arc::new(list(&self.store).await?.0))
    }

    /// The labels of namespace `ns` (empty when it does not exist).
    async fn namespace_labels(&self, ns: &str) -> ApiResult<BTreeMap<String, String>> {
        let kv = self.store.get(&format!("{}{ns}", crate::nscache::PREFIX)).await?.1;
        let obj = kv.and_then(|kv| serde_json::from_slice::<Value>(&kv.value).ok());
        Ok(rules::labels_of(obj.as_ref()))
    }

    /// Where a webhook is reached: its URL, or its Service resolved to a ready endpoint
    /// (the certificate must then name `<service>.<namespace>.svc`).
    async fn target(&self, hook: &Hook) -> Result<call::Target, String> {
        let (namespace, name, path, port) = match &hook.endpoint {
            rules::Endpoint::Url(url) => return call::parse_url(url),
            rules::Endpoint::Service { namespace, name, path, port } => (namespace, name, path, *port),
        };
        let read = |plural: &'static str| async move {
            let res = resources::find("", "v1", plural).ok_or("no such resource")?;
            let kv = self.store.get(&key_of(res, namespace, name)).await.map_err(|e| e.to_string())?.1;
            let kv = kv.ok_or_else(|| format!("{plural} \"{name}\" not found"))?;
            serde_json::from_slice::<Value>(&kv.value).map_err(|e| e.to_string())
        };
        let url = format!("https://{name}.{namespace}.svc:{port}{path}");
        let fail = |why: String| format!("failed to call webhook: Post \"{url}\": {why}");
        let svc = read("services").await.map_err(fail)?;
        let endpoints = read("endpoints").await.map_err(fail)?;
        let (ip, target_port) = service_endpoint(&svc, &endpoints, port)
            .ok_or_else(|| fail(format!("service \"{namespace}/{name}\" has no ready endpoint for port {port}")))?;
        Ok(call::Target {
            url,
            connect: (ip, target_port),
            server_name: format!("{name}.{namespace}.svc"),
            path: path.to_string(),
        })
    }

    /// Call one webhook: `Ok(None)` when a failure is ignored by its policy.
    async fn call(
        &self,
        hook: &Hook,
        r: &review::Request<'_>,
        obj: Option<&Value>,
        old: Option<&Value>,
        mutating: bool,
    ) -> ApiResult<Option<review::Verdict>> {
        if r.dry_run && hook.side_effects == SideEffects::Unsafe {
            return Err(ApiError::bad_request(format!("admission webhook \"{}\" does not support dry run", hook.name)));
        }
        let body = serde_json::to_vec(&review::request(r, obj, old)).map_err(|e| ApiError::internal(e.to_string()))?;
        let answer = match self.target(hook).await {
            Ok(target) => call::post(&target, &hook.ca_bundle, body, hook.timeout).await,
            Err(e) => Err(e),
        };
        let verdict = answer.and_then(|bytes| {
            review::verdict(&bytes, r.uid, mutating, &hook.name, r.group, r.resource, r.name)
                .map_err(|e| format!("received invalid webhook response: {e}"))
        });
        match verdict {
            Ok(v) => Ok(Some(v)),
            Err(why) if hook.failure_policy == FailurePolicy::Ignore => {
                tracing::warn!(webhook = hook.name, error = why, "failed calling webhook, failing open");
                Ok(None)
            }
            Err(why) => {
                tracing::warn!(webhook = hook.name, error = why, "failed calling webhook, failing closed");
                Err(review::call_failed(&hook.name, &why))
            }
        }
    }
}

/// The address of a ready endpoint behind a Service port (`port` as the Service exposes it),
/// resolved as the aggregator resolves its backends.
fn service_endpoint(svc: &Value, endpoints: &Value, port: u16) -> Option<(String, u16)> {
    use crate::aggregator::endpoints::{resolve, slices_of_endpoints};
    resolve(svc, &slices_of_endpoints(endpoints), port).ok()?.into_iter().next()
}

/// The attributes rules match a write by.
fn attributes<'a>(w: &'a Write<'a>) -> Attributes<'a> {
    Attributes {
        operation: w.operation,
        group: w.res.group,
        version: w.res.version,
        resource: w.res.plural,
        subresource: w.subresource,
        namespaced: w.res.namespaced,
    }
}

/// The hooks of `hooks` this write meets.
async fn matching<'h>(
    webhooks: &Webhooks,
    hooks: &'h [Hook],
    w: &Write<'_>,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> ApiResult<Vec<&'h Hook>> {
    let a = attributes(w);
    let candidates: Vec<&Hook> = hooks.iter().filter(|h| h.matches(&a, obj, old)).collect();
    if candidates.iter().all(|h| !h.needs_namespace(&a)) {
        return Ok(candidates);
    }
    let labels = if a.group.is_empty() && a.resource == "namespaces" {
        rules::labels_of(obj.or(old))
    } else {
        webhooks.namespace_labels(w.namespace).await?
    };
    Ok(candidates.into_iter().filter(|h| h.namespace_matches(&a, &labels)).collect())
}

impl Caller {
    fn request<'a>(&'a self, w: &'a Write<'a>, uid: &'a str) -> review::Request<'a> {
        review::Request {
            uid,
            group: w.res.group,
            version: w.res.version,
            kind: w.res.kind,
            resource: w.res.plural,
            subresource: w.subresource,
            name: w.name,
            namespace: w.namespace,
            operation: w.operation,
            user: &self.user,
            dry_run: w.dry_run,
        }
    }

    /// Run the mutating webhooks `obj` meets, applying their patches to it. Returns whether
    /// it changed and the webhooks' warnings.
    async fn run_mutating(
        &self,
        w: &Write<'_>,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> ApiResult<(bool, Vec<String>)> {
        let configured = self.webhooks.current().await?;
        if configured.mutating.is_empty() {
            return Ok((false, vec![]));
        }
        let hooks = matching(&self.webhooks, &configured.mutating, w, Some(obj), old).await?;
        let (mut changed, mut warnings) = (false, Vec::new());
        // Each webhook once; then, if a later one changed the object, those asking for it
        // (`IfNeeded`) once more.
        let mut last_change: Option<usize> = None;
        let mut order: Vec<usize> = (0..hooks.len()).collect();
        let mut pass = 0;
        while pass < 2 {
            for &i in &order {
                let hook = hooks[i];
                let uid = uuid::Builder::from_random_bytes(rand::random()).into_uuid().to_string();
                let r = self.request(w, &uid);
                let Some(verdict) = self.webhooks.call(hook, &r, Some(obj), old, true).await? else { continue };
                match verdict {
                    review::Verdict::Denied { error, warnings: w } => {
                        warnings.extend(w);
                        return Err(error);
                    }
                    review::Verdict::Allowed { patch, warnings: w } => {
                        warnings.extend(w);
                        let Some(patch) = patch else { continue };
                        let mut patched = obj.clone();
                        if let Err(e) = json_patch::patch(&mut patched, &patch) {
                            let why = format!("the patch did not apply: {e}");
                            if hook.failure_policy == FailurePolicy::Ignore {
                                tracing::warn!(
                                    webhook = hook.name,
                                    error = why,
                                    "failed calling webhook, failing open"
                                );
                                continue;
                            }
                            return Err(review::call_failed(&hook.name, &why));
                        }
                        if patched != *obj {
                            *obj = patched;
                            changed = true;
                            last_change = Some(i);
                        }
                    }
                }
            }
            pass += 1;
            let Some(last) = last_change.take() else { break };
            order = (0..hooks.len()).filter(|&i| hooks[i].reinvoke && i < last).collect();
            if order.is_empty() {
                break;
            }
        }
        Ok((changed, warnings))
    }

    /// Run the validating webhooks the write meets, all at once; the first denial or
    /// failure (in the configurations' order) refuses it.
    async fn run_validating(&self, w: &Write<'_>, obj: Option<&Value>, old: Option<&Value>) -> ApiResult<Vec<String>> {
        let configured = self.webhooks.current().await?;
        if configured.validating.is_empty() {
            return Ok(vec![]);
        }
        let hooks = matching(&self.webhooks, &configured.validating, w, obj, old).await?;
        let uids: Vec<String> =
            hooks.iter().map(|_| uuid::Builder::from_random_bytes(rand::random()).into_uuid().to_string()).collect();
        let calls = hooks.iter().zip(&uids).map(|(hook, uid)| {
            let r = self.request(w, uid);
            async move { self.webhooks.call(hook, &r, obj, old, false).await }
        });
        let mut warnings = Vec::new();
        for result in futures::future::join_all(calls).await {
            match result? {
                None => {}
                Some(review::Verdict::Allowed { warnings: w, .. }) => warnings.extend(w),
                Some(review::Verdict::Denied { error, .. }) => return Err(error),
            }
        }
        Ok(warnings)
    }
}

#[async_trait::async_trait]
impl AdmissionWebhooks for Caller {
    async fn mutate(&self, w: &Write<'_>, obj: &mut Value, old: Option<&Value>) -> ApiResult<(bool, Vec<String>)> {
        self.run_mutating(w, obj, old).await
    }
    async fn validate(&self, w: &Write<'_>, obj: Option<&Value>, old: Option<&Value>) -> ApiResult<Vec<String>> {
        self.run_validating(w, obj, old).await
    }
}

/// The userInfo an AdmissionReview carries for `user`.
pub fn user_info(user: Option<&crate::authn::UserInfo>) -> Value {
    match user {
        Some(u) => {
            let mut v = json!({"username": u.name, "groups": u.groups});
            if !u.uid.is_empty() {
                v["uid"] = json!(u.uid);
            }
            v
        }
        None => json!({"username": "system:unsecured", "groups": ["system:masters", "system:authenticated"]}),
    }
}

/// Every stored configuration, compiled, and the revision of the list.
async fn list(store: &Arc<dyn Store>) -> storage::Result<(Configured, Vec<(String, bool, storage::Revision)>)> {
    let mut configured = Configured { synced: true, ..Default::default() };
    let mut prefixes = Vec::new();
    for (plural, mutating) in KINDS {
        let Some(res) = resources::find(GROUP, "v1", plural) else { continue };
        let prefix = prefix_of(res, None);
        let list = store.range(Range::prefix(&prefix)).await?;
        // Stored keys sort by name: the configurations' order.
        for kv in &list.kvs {
            let Ok(obj) = serde_json::from_slice::<Value>(&kv.value) else {
                tracing::warn!(key = kv.key, "undecodable webhook configuration ignored");
                continue;
            };
            let hooks = rules::compile(&obj, mutating);
            if mutating {
                configured.mutating.extend(hooks);
            } else {
                configured.validating.extend(hooks);
            }
        }
        prefixes.push((prefix, mutating, list.revision));
    }
    Ok((configured, prefixes))
}

/// List, then re-list after any change to either kind (configurations are few and change
/// rarely); on an error start over.
async fn feed(webhooks: Arc<Webhooks>) {
    loop {
        match list(&webhooks.store).await {
            Ok((configured, prefixes)) => {
                *webhooks.configured.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(configured);
                let watches = prefixes.into_iter().map(|(prefix, _, revision)| {
                    let store = webhooks.store.clone();
                    async move {
                        match store.watch(&prefix, revision).await {
                            Ok(mut s) => {
                                let _ = s.next().await;
                            }
                            Err(e) => tracing::debug!(prefix, error = %e, "webhook configuration watch failed"),
                        }
                    }
                });
                // Whichever kind changes first: list both again.
                let watches: Vec<_> = watches.map(Box::pin).collect();
                if watches.is_empty() {
                    return;
                }
                let _ = futures::future::select_all(watches).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, "webhook configurations: list failed");
                *webhooks.configured.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Configured::default());
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_port_resolves_to_a_ready_endpoint_by_port_name() {
        let svc = json!({"spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}, {"name": "m", "port": 9090}]}});
        let eps = json!({"subsets": [{"addresses": [{"ip": "10.1.0.7"}], "ports": [{"name": "m", "port": 9090}, {"name": "https", "port": 8443}]}]});
        assert_eq!(service_endpoint(&svc, &eps, 443), Some(("10.1.0.7".into(), 8443)));
        assert_eq!(service_endpoint(&svc, &eps, 80), None);
        assert_eq!(service_endpoint(&svc, &json!({}), 443), None);
    }
}
