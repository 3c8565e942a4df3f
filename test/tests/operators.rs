//! End to end with a real third-party operator: a kopf (Python) operator creates a child
//! ConfigMap for each custom resource, adopted by it, on a cluster whose CRD appeared after
//! the controller-manager started. The child must live as long as its owner and go with
//! it — the garbage collector once deleted such children three seconds after creation.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::controller_manager::{kubectl_ok, Fixture};
use e2e::{eventually, python_clients};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ApiResource, DynamicObject};

const WAIT: Duration = Duration::from_secs(60);

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: greetings.demo.example.com}
spec:
  group: demo.example.com
  scope: Namespaced
  names: {plural: greetings, singular: greeting, kind: Greeting}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

/// The operator process; killed on drop, its log printed (shown when the test fails).
struct Operator {
    child: Child,
    log: std::path::PathBuf,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprintln!("--- kopf log ---\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kopf_operator_s_children_live_and_die_with_their_custom_resources() -> Result<()> {
    let Some(python) = python_clients() else { return Ok(()) };
    let ns = "kopf";
    let t = Fixture::start(ns).await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    t.api.write_kubeconfig(&kubeconfig)?;
    let file = |name: &str, body: &str| -> Result<String> {
        let p = dir.path().join(name);
        std::fs::write(&p, body)?;
        Ok(p.to_string_lossy().into_owned())
    };
    kubectl_ok(&t.api, &["apply", "-f", &file("crd.yaml", CRD)?]).await?;
    kubectl_ok(&t.api, &["wait", "--for=condition=Established", "crd/greetings.demo.example.com"]).await?;

    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("operators/greeting_operator.py");
    let log = dir.path().join("kopf.log");
    let out = std::fs::File::create(&log)?;
    let child = Command::new(&python)
        .args(["-m", "kopf", "run", "--standalone", "--all-namespaces"])
        .arg(&script)
        .env("KUBECONFIG", &kubeconfig)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("starting kopf")?;
    let _op = Operator { child, log };

    let cms: Api<ConfigMap> = t.api();
    let greetings: Api<DynamicObject> = Api::namespaced_with(
        t.client.clone(),
        ns,
        &ApiResource {
            group: "demo.example.com".into(),
            version: "v1".into(),
            api_version: "demo.example.com/v1".into(),
            kind: "Greeting".into(),
            plural: "greetings".into(),
        },
    );
    let g =
        file("g.yaml", "apiVersion: demo.example.com/v1\nkind: Greeting\nmetadata: {name: g1}\nspec: {text: hi}\n")?;
    kubectl_ok(&t.api, &["-n", ns, "apply", "-f", &g]).await?;
    eventually(WAIT, || async {
        greetings.get("g1").await.is_ok_and(|o| o.data["status"]["create_child"]["child"] == "g1-child")
    })
    .await
    .context("kopf handled g1 and recorded its child")?;
    let child = cms.get("g1-child").await.context("the operator's child")?;
    let owner = &child.metadata.owner_references.clone().unwrap_or_default()[0];
    ensure!(owner.kind == "Greeting" && owner.controller == Some(true) && owner.block_owner_deletion == Some(true));

    // A dependent of a Greeting that does not exist (a wrong uid) is collected: once it is
    // gone, the collector has looked at Greetings' dependents, and g1-child must remain.
    let canary = file(
        "canary.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: canary\n  ownerReferences:\n  - {apiVersion: demo.example.com/v1, kind: Greeting, name: g1, uid: not-g1}\n",
    )?;
    kubectl_ok(&t.api, &["-n", ns, "apply", "-f", &canary]).await?;
    eventually(WAIT, || async { matches!(cms.get_opt("canary").await, Ok(None)) }).await.context("canary")?;
    ensure!(cms.get_opt("g1-child").await?.is_some(), "the operator's child was garbage collected");

    kubectl_ok(&t.api, &["-n", ns, "delete", "greeting", "g1"]).await?;
    eventually(WAIT, || async { matches!(cms.get_opt("g1-child").await, Ok(None)) })
        .await
        .context("the child goes with its owner")?;
    Ok(())
}
