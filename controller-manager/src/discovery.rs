//! What the apiserver serves, kept current while the controller-manager runs: client-go's
//! discovery plus RESTMapper, as the garbage collector uses them. A [`Catalog`] is one
//! discovery pass (every served group/version/resource, with its scope and verbs);
//! [`spawn`] re-reads it whenever a CustomResourceDefinition changes and every 30 s, and
//! publishes each new catalog on a `watch` channel.
//!
//! A CRD is served a moment after its object is written, so after a CRD event the
//! catalog is re-read until it lists every served version the CRDs declare (and none
//! they no longer declare), with a short back-off, instead of once.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::discovery::{verbs, ApiCapabilities, ApiResource, Discovery, Scope};
use kube::runtime::{watcher, WatchStreamExt};
use tokio::sync::watch;

/// How often the catalog is re-read even without CRD events (kube-controller-manager's
/// garbage collector re-reads discovery every 30 s).
pub const RESYNC: Duration = Duration::from_secs(30);

/// One served resource (one group/version/plural).
#[derive(Clone, Debug)]
pub struct Served {
    pub ar: ApiResource,
    pub caps: ApiCapabilities,
    /// Whether this is the group's preferred version of the resource.
    pub preferred: bool,
}

impl Served {
    pub fn namespaced(&self) -> bool {
        self.caps.scope == Scope::Namespaced
    }
    pub fn supports(&self, verb: &str) -> bool {
        self.caps.supports_operation(verb)
    }
}

/// One discovery pass.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub resources: Vec<Served>,
}

/// The group of an `apiVersion` (`apps/v1` → `apps`, `v1` → ``).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("")
}

impl Catalog {
    /// The served resource of a kind at an `apiVersion` (the RESTMapper's question). A kind
    /// that is not served at that version is unknown, even if another version serves it.
    pub fn resolve(&self, api_version: &str, kind: &str) -> Option<&Served> {
        self.resources.iter().find(|s| s.ar.api_version == api_version && s.ar.kind == kind)
    }

    /// The preferred version of every resource that supports all of `needed`.
    pub fn preferred_with<'a>(&'a self, needed: &'a [&'a str]) -> impl Iterator<Item = &'a Served> + 'a {
        self.resources.iter().filter(move |s| s.preferred && needed.iter().all(|v| s.supports(v)))
    }

    /// `group/version/plural` of everything served.
    fn keys(&self) -> BTreeSet<String> {
        self.resources.iter().map(|s| format!("{}/{}", s.ar.api_version, s.ar.plural)).collect()
    }

    /// Whether this catalog serves exactly the custom resources `crds` declare as served
    /// (ignoring CRDs being deleted, which may or may not be served yet).
    pub fn matches_crds(&self, crds: &[CustomResourceDefinition]) -> bool {
        let have = self.keys();
        crds.iter().filter(|c| c.metadata.deletion_timestamp.is_none()).all(|c| {
            c.spec
                .versions
                .iter()
                .filter(|v| v.served)
                .all(|v| have.contains(&format!("{}/{}/{}", c.spec.group, v.name, c.spec.names.plural)))
        })
    }
}

/// Read the catalog once.
pub async fn read(client: &kube::Client) -> Result<Catalog, kube::Error> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut resources = Vec::new();
    for group in discovery.groups() {
        let preferred = group.preferred_version_or_latest().to_string();
        for version in group.versions() {
            for (ar, caps) in group.versioned_resources(version) {
                if ar.plural.contains('/') {
                    continue; // subresources
                }
                resources.push(Served { ar, caps, preferred: version == preferred });
            }
        }
    }
    Ok(Catalog { resources })
}

/// Keep a catalog current: the first one is read (retrying) before this returns.
pub async fn spawn(client: kube::Client) -> watch::Receiver<Arc<Catalog>> {
    let first = loop {
        match read(&client).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, "discovery failed; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let (tx, rx) = watch::channel(Arc::new(first));
    tokio::spawn(refresh(client, tx));
    rx
}

async fn refresh(client: kube::Client, tx: watch::Sender<Arc<Catalog>>) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let writer = kube::runtime::reflector::store::Writer::default();
    let store = writer.as_reader();
    let mut events =
        std::pin::pin!(kube::runtime::reflector(writer, watcher(crds, watcher::Config::default()).default_backoff()));
    let mut tick = tokio::time::interval(RESYNC);
    tick.tick().await;
    loop {
        tokio::select! {
            ev = events.next() => {
                if ev.is_none() {
                    return;
                }
                // A burst of CRD events (kubectl apply of several) makes one re-read.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while let Some(Some(_)) = futures::FutureExt::now_or_never(events.next()) {}
            }
            _ = tick.tick() => {}
        }
        // Re-read until the catalog shows what the CRDs declare (a CRD is served a moment
        // after it is stored), for at most ~10 s; the periodic resync covers the rest.
        let mut delay = Duration::from_millis(100);
        for _ in 0..8 {
            match read(&client).await {
                Ok(c) => {
                    let declared: Vec<CustomResourceDefinition> = store.state().iter().map(|c| (**c).clone()).collect();
                    let done = c.matches_crds(&declared);
                    if tx.borrow().keys() != c.keys() {
                        tracing::info!(resources = c.resources.len(), "served resources changed");
                        tx.send_replace(Arc::new(c));
                    }
                    if done {
                        break;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "discovery failed"),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(3));
        }
    }
}

/// The verbs the garbage collector needs of a resource it monitors.
pub const GC_VERBS: &[&str] = &[verbs::LIST, verbs::WATCH, verbs::DELETE, verbs::PATCH];

#[cfg(test)]
mod tests {
    use super::*;
    use kube::discovery::ApiCapabilities;

    fn served(api_version: &str, kind: &str, plural: &str, preferred: bool) -> Served {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        Served {
            ar: ApiResource {
                group: group.into(),
                version: version.into(),
                api_version: api_version.into(),
                kind: kind.into(),
                plural: plural.into(),
            },
            caps: ApiCapabilities {
                scope: Scope::Namespaced,
                subresources: vec![],
                operations: GC_VERBS.iter().map(|v| v.to_string()).collect(),
            },
            preferred,
        }
    }

    fn crd(group: &str, plural: &str, versions: &[(&str, bool)]) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": plural, "kind": "X"},
                     "versions": versions.iter().map(|(v, s)| serde_json::json!({"name": v, "served": s, "storage": true})).collect::<Vec<_>>()}
        }))
        .unwrap()
    }

    #[test]
    fn resolves_kinds_at_their_exact_version() {
        let c = Catalog {
            resources: vec![served("apps/v1", "Deployment", "deployments", true), served("v1", "Pod", "pods", true)],
        };
        assert_eq!(c.resolve("apps/v1", "Deployment").map(|s| s.ar.plural.as_str()), Some("deployments"));
        assert!(c.resolve("apps/v1beta1", "Deployment").is_none());
        assert!(c.resolve("v1", "Deployment").is_none());
        assert_eq!(group_of("apps/v1"), "apps");
        assert_eq!(group_of("v1"), "");
    }

    #[test]
    fn matches_crds_waits_for_every_served_version() {
        let c = Catalog { resources: vec![served("demo.example.com/v1", "Greeting", "greetings", true)] };
        assert!(c.matches_crds(&[crd("demo.example.com", "greetings", &[("v1", true), ("v2", false)])]));
        assert!(!c.matches_crds(&[crd("demo.example.com", "greetings", &[("v1", true), ("v2", true)])]));
        let mut deleting = crd("other.example.com", "things", &[("v1", true)]);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(c.matches_crds(&[deleting]));
    }
}
