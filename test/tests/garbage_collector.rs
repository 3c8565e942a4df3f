//! End to end: the garbage collector never deletes a dependent whose owner exists — above
//! all the children operators create for custom resources whose CRD appeared after the
//! controller-manager started — and still collects every dependent of a gone owner.
//! Driven with the official kubectl where a user would type it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::controller_manager::{kubectl_ok, namespace, ControllerManager, Fixture};
use e2e::{eventually, ApiServer};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

fn crd(group: &str, kind: &str, plural: &str) -> String {
    format!(
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.{group}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: {plural}, singular: {singular}, kind: {kind}}}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#,
        singular = kind.to_lowercase()
    )
}

fn greeting_ar() -> ApiResource {
    ApiResource {
        group: "demo.example.com".into(),
        version: "v1".into(),
        api_version: "demo.example.com/v1".into(),
        kind: "Greeting".into(),
        plural: "greetings".into(),
    }
}

/// `kubectl apply -f` of a manifest (written to a file, as a user has it).
async fn apply(api: &ApiServer, ns: &str, yaml: &str) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("manifest.yaml");
    std::fs::write(&path, yaml)?;
    kubectl_ok(api, &["-n", ns, "apply", "-f", path.to_str().context("path")?]).await
}

/// A ConfigMap owned by `owner` (as an operator writes it: controller, blocking).
fn child(name: &str, api_version: &str, kind: &str, owner: &str, uid: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {name}
  labels: {{gc-test: "yes"}}
  ownerReferences:
  - apiVersion: {api_version}
    kind: {kind}
    name: {owner}
    uid: "{uid}"
    controller: true
    blockOwnerDeletion: true
data: {{greeting: hello}}
"#
    )
}

async fn uid_of(api: &Api<DynamicObject>, name: &str) -> Result<String> {
    api.get(name).await?.metadata.uid.context("uid")
}

/// Every ConfigMap deletion the watch sees, by namespace/name.
fn record_deletions(client: kube::Client) -> Arc<Mutex<BTreeSet<String>>> {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let out = seen.clone();
    tokio::spawn(async move {
        let api: Api<ConfigMap> = Api::all(client);
        let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(ev) = s.next().await {
            if let Ok(watcher::Event::Delete(cm)) = ev {
                let key =
                    format!("{}/{}", cm.metadata.namespace.unwrap_or_default(), cm.metadata.name.unwrap_or_default());
                out.lock().expect("lock").insert(key);
            }
        }
    });
    seen
}

async fn exists(cms: &Api<ConfigMap>, name: &str) -> bool {
    matches!(cms.get_opt(name).await, Ok(Some(_)))
}

/// Create a ConfigMap whose owner (of `kind`, named g2) has the wrong uid and wait until
/// the collector removes it: proof that the collector has passed over every dependent
/// (and resolved that kind) since, without sleeping for a guessed time.
async fn collector_pass(t: &Fixture, ns: &str, tag: &str, api_version: &str, kind: &str) -> Result<()> {
    apply(&t.api, ns, &child(&format!("canary-{tag}"), api_version, kind, "g2", "wrong-uid")).await?;
    let cms: Api<ConfigMap> = Api::namespaced(t.client.clone(), ns);
    eventually(WAIT, || async { !exists(&cms, &format!("canary-{tag}")).await })
        .await
        .with_context(|| format!("the canary {tag} (owner with a wrong uid) was not collected"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn children_of_custom_resources_created_after_start_are_kept_until_their_owner_goes() -> Result<()> {
    let ns = "gc-crd";
    let mut t = Fixture::start(ns).await?;
    let deletions = record_deletions(t.client.clone());
    let cms: Api<ConfigMap> = t.api();
    let greetings: Api<DynamicObject> = Api::namespaced_with(t.client.clone(), ns, &greeting_ar());

    // The issue's reproduction: CRD and custom resource created after the collector started.
    apply(&t.api, ns, &crd("demo.example.com", "Greeting", "greetings")).await?;
    kubectl_ok(&t.api, &["wait", "--for=condition=Established", "crd/greetings.demo.example.com"]).await?;
    let g2 = "apiVersion: demo.example.com/v1\nkind: Greeting\nmetadata:\n  name: g2\nspec:\n  text: hi\n";
    eventually(WAIT, || async { apply(&t.api, ns, g2).await.is_ok() }).await.context("greeting g2")?;
    let uid = uid_of(&greetings, "g2").await?;
    apply(&t.api, ns, &child("child", "demo.example.com/v1", "Greeting", "g2", &uid)).await?;
    // A dependent of a kind nobody serves, and one of a live built-in owner.
    apply(&t.api, ns, &child("unresolvable", "nothere.example.com/v1", "Thing", "x", "123")).await?;
    apply(&t.api, ns, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: parent\n").await?;
    let parent_uid = cms.get("parent").await?.metadata.uid.context("uid")?;
    apply(&t.api, ns, &child("cm-child", "v1", "ConfigMap", "parent", &parent_uid)).await?;

    collector_pass(&t, ns, "1", "demo.example.com/v1", "Greeting").await?;
    for name in ["child", "unresolvable", "cm-child"] {
        ensure!(exists(&cms, name).await, "{name} was deleted although its owner exists or cannot be verified");
    }
    let metrics = e2e::metrics_text(t.cm.port).await?;
    ensure!(
        metrics.lines().any(|l| l.starts_with("garbagecollector_unresolved_owner_references ") && !l.ends_with(" 0")),
        "the unresolvable owner is counted:\n{metrics}"
    );

    // After a controller-manager restart, too.
    t.cm.stop();
    t.cm = ControllerManager::start(&t.api, &[])?;
    collector_pass(&t, ns, "2", "demo.example.com/v1", "Greeting").await?;
    ensure!(exists(&cms, "child").await, "child deleted after a controller-manager restart");
    ensure!(exists(&cms, "unresolvable").await, "unresolvable deleted after a restart");

    // Deleting the owner (kubectl's default, background) collects the child.
    kubectl_ok(&t.api, &["-n", ns, "delete", "greeting", "g2"]).await?;
    eventually(WAIT, || async { !exists(&cms, "child").await }).await.context("child of deleted g2")?;

    // Foreground: the owner waits for its blocking child.
    let g3 = "apiVersion: demo.example.com/v1\nkind: Greeting\nmetadata:\n  name: g3\n";
    apply(&t.api, ns, g3).await?;
    let uid3 = uid_of(&greetings, "g3").await?;
    apply(&t.api, ns, &child("child3", "demo.example.com/v1", "Greeting", "g3", &uid3)).await?;
    kubectl_ok(&t.api, &["-n", ns, "delete", "greeting", "g3", "--cascade=foreground", "--wait=false"]).await?;
    eventually(WAIT, || async { !exists(&cms, "child3").await && matches!(greetings.get_opt("g3").await, Ok(None)) })
        .await
        .context("foreground deletion of g3")?;

    // An owner reference with a wrong uid: the child is collected (canary above), and
    // the object that has the name is left alone.
    ensure!(exists(&cms, "parent").await, "the ConfigMap named by a wrong-uid reference is untouched");

    let gone = deletions.lock().expect("lock").clone();
    for name in ["unresolvable", "cm-child", "parent"] {
        ensure!(!gone.contains(&format!("{ns}/{name}")), "{name} was deleted at some point: {gone:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_crd_collects_its_objects_children_once_the_objects_are_gone() -> Result<()> {
    let ns = "gc-crd-del";
    let t = Fixture::start(ns).await?;
    let cms: Api<ConfigMap> = t.api();
    let greetings: Api<DynamicObject> = Api::namespaced_with(t.client.clone(), ns, &greeting_ar());
    apply(&t.api, ns, &crd("demo.example.com", "Greeting", "greetings")).await?;
    kubectl_ok(&t.api, &["wait", "--for=condition=Established", "crd/greetings.demo.example.com"]).await?;
    // The owner carries a finalizer of its own, as an operator's objects do.
    let g = "apiVersion: demo.example.com/v1\nkind: Greeting\nmetadata:\n  name: g4\n  finalizers: [demo.example.com/cleanup]\n";
    eventually(WAIT, || async { apply(&t.api, ns, g).await.is_ok() }).await.context("greeting g4")?;
    let uid = uid_of(&greetings, "g4").await?;
    apply(&t.api, ns, &child("child4", "demo.example.com/v1", "Greeting", "g4", &uid)).await?;

    kubectl_ok(&t.api, &["delete", "crd", "greetings.demo.example.com", "--wait=false"]).await?;
    // The CRD waits for its objects; the object waits for its finalizer; the child waits.
    eventually(WAIT, || async {
        greetings.get_opt("g4").await.ok().flatten().is_some_and(|o| o.metadata.deletion_timestamp.is_some())
    })
    .await
    .context("g4 marked for deletion by the CRD's deletion")?;
    let crd = kubectl_ok(&t.api, &["get", "crd", "greetings.demo.example.com", "-o", "json"]).await?;
    let crd: Value = serde_json::from_str(&crd)?;
    ensure!(
        crd["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Terminating" && c["status"] == "True"),
        "the CRD reports Terminating: {crd}"
    );
    // No new objects while the CRD is terminating (Kubernetes' 405).
    let new: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "demo.example.com/v1", "kind": "Greeting", "metadata": {"name": "late"}}),
    )?;
    match greetings.create(&PostParams::default(), &new).await {
        Err(kube::Error::Api(s)) => ensure!(
            s.code == 405 && s.message.contains("not allowed while custom resource definition is terminating"),
            "create while terminating: {s:?}"
        ),
        other => anyhow::bail!("create while the CRD is terminating: {other:?}"),
    }
    collector_pass(&t, ns, "1", "v1", "ConfigMap").await?;
    ensure!(exists(&cms, "child4").await, "child4 collected while its owner still exists");

    // The operator finishes: the object goes, then the child, then the CRD.
    greetings.patch("g4", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await?;
    eventually(WAIT, || async { !exists(&cms, "child4").await }).await.context("child4 collected")?;
    eventually(WAIT, || async { kubectl_ok(&t.api, &["get", "crd", "greetings.demo.example.com"]).await.is_err() })
        .await
        .context("CRD gone")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_in_another_namespace_is_reported_and_never_confused_with_the_other_object() -> Result<()> {
    let t = Fixture::start("gc-a").await?;
    namespace(&t.client, "gc-b").await?;
    let b: Api<ConfigMap> = Api::namespaced(t.client.clone(), "gc-b");
    let a: Api<ConfigMap> = Api::namespaced(t.client.clone(), "gc-a");
    apply(&t.api, "gc-b", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owner\n").await?;
    let uid = b.get("owner").await?.metadata.uid.context("uid")?;
    apply(&t.api, "gc-a", &child("cross", "v1", "ConfigMap", "owner", &uid)).await?;
    // Kubernetes: the reference does not resolve in the dependent's namespace, so the
    // dependent is collected, with a warning event; the other namespace's object stays.
    eventually(WAIT, || async { !exists(&a, "cross").await }).await.context("cross-namespace dependent")?;
    let events: Api<Event> = Api::namespaced(t.client.clone(), "gc-a");
    eventually(WAIT, || async {
        events.list(&ListParams::default()).await.is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some("OwnerRefInvalidNamespace")
                    && e.involved_object.name.as_deref() == Some("cross")
                    && e.message.as_deref().is_some_and(|m| m.contains("does not exist in namespace \"gc-a\""))
            })
        })
    })
    .await
    .context("OwnerRefInvalidNamespace event")?;
    ensure!(exists(&b, "owner").await, "the object in the other namespace was touched");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_deletion_removes_custom_resources_and_finishes() -> Result<()> {
    let t = Fixture::start("gc-ns-keep").await?;
    apply(&t.api, "default", &crd("demo.example.com", "Greeting", "greetings")).await?;
    kubectl_ok(&t.api, &["wait", "--for=condition=Established", "crd/greetings.demo.example.com"]).await?;
    namespace(&t.client, "doomed-cr").await?;
    let g = "apiVersion: demo.example.com/v1\nkind: Greeting\nmetadata:\n  name: g\n";
    eventually(WAIT, || async { apply(&t.api, "doomed-cr", g).await.is_ok() }).await.context("greeting")?;
    kubectl_ok(&t.api, &["delete", "namespace", "doomed-cr", "--timeout=60s"]).await?;
    let nss: Api<Namespace> = Api::all(t.client.clone());
    eventually(WAIT, || async { matches!(nss.get_opt("doomed-cr").await, Ok(None)) }).await.context("ns gone")?;
    let all: Api<DynamicObject> = Api::all_with(t.client.clone(), &greeting_ar());
    ensure!(all.list(&ListParams::default()).await?.items.is_empty(), "the greeting outlived its namespace");
    Ok(())
}

/// A small deterministic generator (xorshift), seeded from the clock and printed, so a
/// failing run can be replayed with `GC_SEED=<n>`.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomized_owners_and_crds_never_lose_a_live_owner_s_dependent() -> Result<()> {
    let seed = std::env::var("GC_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
    });
    eprintln!("GC_SEED={seed}");
    let mut rng = Rng(seed);
    let ns = "gc-rand";
    let t = Fixture::start(ns).await?;
    let deletions = record_deletions(t.client.clone());
    let client = t.client.clone();

    // Owner kinds: three built-in, four custom whose CRDs appear at random moments.
    let builtin = [
        ("v1", "ConfigMap", "configmaps", ""),
        ("v1", "Secret", "secrets", ""),
        ("v1", "ServiceAccount", "serviceaccounts", ""),
    ];
    let custom: Vec<(String, String, String)> =
        (0..4).map(|i| (format!("kind{i}.example.com"), format!("Thing{i}"), format!("things{i}"))).collect();
    let mut crd_created = [false; 4];
    let post = PostParams::default();

    // (dependent name, must survive)
    let mut expect: BTreeMap<String, bool> = BTreeMap::new();
    let mut owners: Vec<(Api<DynamicObject>, String)> = Vec::new();
    let deps: Api<ConfigMap> = t.api();
    for i in 0..200 {
        // Now and then a CRD appears, before its first owner needs it.
        let c = rng.below(4) as usize;
        if !crd_created[c] && (rng.below(10) == 0 || i > 150) {
            let (g, k, p) = &custom[c];
            apply(&t.api, ns, &crd(g, k, p)).await?;
            crd_created[c] = true;
        }
        let (ar, kind_name) = if rng.below(2) == 0 || !crd_created.iter().any(|&x| x) {
            let (v, k, p, _) = builtin[rng.below(3) as usize];
            (
                ApiResource {
                    group: String::new(),
                    version: v.into(),
                    api_version: v.into(),
                    kind: k.into(),
                    plural: p.into(),
                },
                k.to_string(),
            )
        } else {
            let made: Vec<usize> = (0..4).filter(|&x| crd_created[x]).collect();
            let (g, k, p) = &custom[made[rng.below(made.len() as u64) as usize]];
            (
                ApiResource {
                    group: g.clone(),
                    version: "v1".into(),
                    api_version: format!("{g}/v1"),
                    kind: k.clone(),
                    plural: p.clone(),
                },
                k.clone(),
            )
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        let name = format!("owner-{i}");
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": ar.api_version, "kind": kind_name, "metadata": {"name": name}
        }))?;
        // A CRD just created is served a moment later.
        let mut created = None;
        for _ in 0..100 {
            match api.create(&post, &obj).await {
                Ok(o) => {
                    created = Some(o);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let owner = created.with_context(|| format!("creating {name} ({kind_name})"))?;
        let uid = owner.metadata.uid.clone().context("uid")?;
        for d in 0..=rng.below(2) {
            let good = rng.below(4) != 0;
            let dep_name = format!("dep-{i}-{d}");
            let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": dep_name, "ownerReferences": [{
                "apiVersion": ar.api_version, "kind": kind_name, "name": name,
                "uid": if good { uid.clone() } else { format!("{uid}-wrong") },
                "controller": true, "blockOwnerDeletion": rng.below(2) == 0}]}}))?;
            deps.create(&post, &cm).await?;
            expect.insert(dep_name, good);
        }
        owners.push((api, name));
    }
    // A quarter of the owners go (background): their dependents must follow.
    for (i, (api, name)) in owners.iter().enumerate() {
        if rng.below(4) == 0 {
            api.delete(name, &DeleteParams::background()).await?;
            for d in 0..2 {
                if let Some(v) = expect.get_mut(&format!("dep-{i}-{d}")) {
                    *v = false;
                }
            }
        }
    }
    let doomed: Vec<String> = expect.iter().filter(|(_, keep)| !**keep).map(|(n, _)| n.clone()).collect();
    eventually(Duration::from_secs(120), || async {
        let l = deps.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let present: BTreeSet<String> = l.into_iter().filter_map(|c| c.metadata.name).collect();
        doomed.iter().all(|d| !present.contains(d))
    })
    .await
    .with_context(|| format!("every dependent of a gone owner is collected (GC_SEED={seed})"))?;
    let gone = deletions.lock().expect("lock").clone();
    let lost: Vec<&String> =
        expect.iter().filter(|(n, keep)| **keep && gone.contains(&format!("{ns}/{n}"))).map(|(n, _)| n).collect();
    ensure!(lost.is_empty(), "dependents of live owners were deleted: {lost:?} (GC_SEED={seed})");
    let kept = expect.values().filter(|k| **k).count();
    eprintln!("{} dependents kept, {} collected", kept, doomed.len());
    Ok(())
}
