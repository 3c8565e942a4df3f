//! Control-plane tenancy: `tenant-proxy` in front of a real apiserver (TLS, RBAC) and
//! controller-manager, driven by the official kubectl and by raw requests as two tenants.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::controller_manager::ControllerManager;
use e2e::tenancy::TenantProxy;
use e2e::{kubectl_at, ApiServer};
use serde_json::Value;

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: string}}}
"#;

/// What each tenant creates, with a marker only it uses.
fn objects(marker: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: prod}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default, labels: {{marker: {marker}}}}}
spec:
  ports: [{{port: 80}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: web, namespace: prod}}
data: {{marker: {marker}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: reader, labels: {{marker: {marker}}}}}
rules:
- apiGroups: [""]
  resources: [pods, services, configmaps]
  verbs: [get, list, watch]
"#
    )
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let (ok, out) = kubectl_at(kubeconfig, args, None);
    assert!(ok, "kubectl {args:?} failed: {out}");
    out
}

fn kubectl_fails(kubeconfig: &Path, args: &[&str]) -> String {
    let (ok, out) = kubectl_at(kubeconfig, args, None);
    assert!(!ok, "kubectl {args:?} should have failed: {out}");
    out
}

fn apply(kubeconfig: &Path, manifest: &str) {
    let (ok, out) = kubectl_at(kubeconfig, &["apply", "-f", "-"], Some(manifest));
    assert!(ok, "kubectl apply failed: {out}\n{manifest}");
}

fn names(kubeconfig: &Path, args: &[&str]) -> Vec<String> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}"]);
    let mut out: Vec<String> = kubectl(kubeconfig, &all).lines().map(str::to_string).collect();
    out.sort();
    out
}

/// Poll `f` until it is true (30 s).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

struct Lab {
    api: ApiServer,
    _cm: ControllerManager,
    proxy: TenantProxy,
}

fn lab() -> Result<Lab> {
    let api = ApiServer::start_tls(&[], &["--authorization-mode", "RBAC"])?;
    let cm = ControllerManager::start(&api, &["--use-service-account-credentials"])?;
    let proxy = TenantProxy::start(&api)?;
    for t in ["acme", "bob"] {
        proxy.add_tenant(t)?;
    }
    Ok(Lab { api, _cm: cm, proxy })
}

#[test]
fn two_tenants_each_get_a_cluster_of_their_own() -> Result<()> {
    let lab = lab()?;
    let admin = lab.api.identity("admin.conf");
    let acme = lab.proxy.kubeconfig("acme", "admin", "system:masters")?;
    let bob = lab.proxy.kubeconfig("bob", "admin", "system:masters")?;
    for (cfg, marker) in [(&acme, "acme-only"), (&bob, "bob-only")] {
        apply(cfg, &objects(marker));
        apply(cfg, CRD);
        kubectl(cfg, &["wait", "--for", "condition=Established", "crd/widgets.example.com", "--timeout=30s"]);
        apply(cfg, &format!("apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w1, namespace: prod}}\nspec: {{size: {marker}}}\n"));
    }

    // Each tenant sees its own cluster: the namespaces a new cluster has and its own.
    for (cfg, marker) in [(&acme, "acme-only"), (&bob, "bob-only")] {
        let other = if marker == "acme-only" { "bob" } else { "acme" };
        assert_eq!(names(cfg, &["namespaces"]), ["default", "kube-node-lease", "kube-public", "kube-system", "prod"]);
        let out =
            kubectl(cfg, &["get", "svc", "web", "-o", "jsonpath={.metadata.namespace}/{.metadata.labels.marker}"]);
        assert_eq!(out, format!("default/{marker}"));
        assert_eq!(names(cfg, &["clusterroles"]), ["admin", "cluster-admin", "edit", "reader", "view"]);
        assert_eq!(names(cfg, &["crd"]), ["widgets.example.com"]);
        let widgets = kubectl(
            cfg,
            &[
                "get",
                "widgets",
                "-A",
                "-o",
                "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}={.spec.size};{end}",
            ],
        );
        assert_eq!(widgets, format!("prod/w1={marker};"));
        let all = kubectl(cfg, &["get", "configmaps,services", "-A"]);
        assert!(!all.contains(other), "{all}");
        // The official kubectl's table for every namespace names them as the tenant does.
        assert!(all.contains("prod ") && all.contains("default "), "{all}");
        let resources = kubectl(cfg, &["api-resources", "--api-group", "example.com", "-o", "name"]);
        assert_eq!(resources.trim(), "widgets.example.com");
        let groups = kubectl(cfg, &["api-versions"]);
        assert!(groups.contains("example.com/v1") && !groups.contains("acme.") && !groups.contains("bob."), "{groups}");
        // kubectl explain reads the tenant's OpenAPI, which names no other tenant's CRDs.
        let explain = kubectl(cfg, &["explain", "widgets.spec"]);
        assert!(explain.contains("size"), "{explain}");
        let other_group = format!("{other}.example.com");
        for path in ["/openapi/v2", "/openapi/v3", "/openapi/v3/apis/example.com/v1", "/apis", "/apis/example.com/v1"] {
            let doc = kubectl(cfg, &["get", "--raw", path]);
            assert!(doc.contains("example.com") && !doc.contains(&other_group), "{path}: {doc:.300}");
        }
        // Label selectors on a namespace's own name select the tenant's namespace.
        let selected = names(cfg, &["namespaces", "-l", "kubernetes.io/metadata.name in (prod,kube-system)"]);
        assert_eq!(selected, ["kube-system", "prod"]);
        // Nodes are shown and read-only; the cluster administrator's kinds are not a tenant's.
        let out = kubectl_fails(cfg, &["label", "node", "nosuch", "x=y"]);
        assert!(out.contains("read-only") || out.contains("NotFound") || out.contains("not found"), "{out}");
        let out = kubectl_fails(cfg, &["get", "validatingwebhookconfigurations"]);
        assert!(out.contains("Forbidden") || out.contains("forbidden"), "{out}");
    }

    // Upstream, both tenants' objects are there under their prefixes.
    let upstream = names(&admin, &["namespaces"]);
    for ns in ["acme-default", "acme-prod", "bob-default", "bob-prod"] {
        assert!(upstream.contains(&ns.to_string()), "{upstream:?}");
    }
    let crds = names(&admin, &["crd"]);
    assert!(
        crds.contains(&"widgets.acme.example.com".into()) && crds.contains(&"widgets.bob.example.com".into()),
        "{crds:?}"
    );

    // Deleting everything of a kind deletes only the tenant's.
    kubectl(&bob, &["delete", "clusterroles", "--all"]);
    assert_eq!(names(&bob, &["clusterroles"]), Vec::<String>::new());
    assert_eq!(names(&acme, &["clusterroles"]), ["admin", "cluster-admin", "edit", "reader", "view"]);
    assert!(names(&admin, &["clusterroles"]).contains(&"cluster-admin".to_string()));

    // Garbage collection follows ownerReferences inside a tenant.
    let uid = kubectl(&acme, &["get", "configmap", "web", "-n", "prod", "-o", "jsonpath={.metadata.uid}"]);
    apply(
        &acme,
        &format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: owned\n  namespace: prod\n  ownerReferences:\n  - {{apiVersion: v1, kind: ConfigMap, name: web, uid: {uid}}}\nstringData: {{a: b}}\n"
        ),
    );
    kubectl(&acme, &["delete", "configmap", "web", "-n", "prod"]);
    eventually("the owned Secret is collected", || {
        !kubectl_at(&acme, &["get", "secret", "owned", "-n", "prod"], None).0
    });

    // A PersistentVolumeClaim binds to the tenant's PersistentVolume.
    apply(
        &acme,
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv1}\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: manual\n  hostPath: {path: /tmp/acme-pv1}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data, namespace: prod}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: manual\n  resources: {requests: {storage: 1Gi}}\n",
    );
    eventually("the claim binds", || {
        kubectl(&acme, &["get", "pvc", "data", "-n", "prod", "-o", "jsonpath={.status.phase}/{.spec.volumeName}"])
            == "Bound/pv1"
    });
    let claim =
        kubectl(&acme, &["get", "pv", "pv1", "-o", "jsonpath={.spec.claimRef.namespace}/{.spec.claimRef.name}"]);
    assert_eq!(claim, "prod/data");
    assert!(names(&bob, &["pv"]).is_empty());

    // Deleting a Tenant deletes everything it made; then it is gone, and so is its access.
    kubectl(&admin, &["delete", "tenant", "bob", "--wait=false"]);
    eventually("bob's objects and the Tenant are deleted", || {
        let left = |args: &[&str]| names(&admin, args).into_iter().filter(|n| n.starts_with("bob")).count();
        let crds = names(&admin, &["crd"]).into_iter().filter(|n| n.contains(".bob.")).count();
        left(&["namespaces"]) + left(&["clusterroles"]) + left(&["clusterrolebindings"]) + crds + left(&["tenants"])
            == 0
    });
    let out = kubectl_fails(&bob, &["get", "namespaces"]);
    assert!(out.contains(r#"tenant "bob" does not exist"#), "{out}");
    assert_eq!(names(&acme, &["crd"]), ["widgets.example.com"], "the other tenant keeps everything");
    Ok(())
}

#[test]
fn a_tenant_s_users_get_what_its_rbac_grants() -> Result<()> {
    let lab = lab()?;
    let admin = lab.proxy.kubeconfig("acme", "admin", "system:masters")?;
    let jane = lab.proxy.kubeconfig("acme", "jane", "")?;
    let out = kubectl_fails(&jane, &["get", "pods", "-n", "default"]);
    assert!(
        out.contains(r#"User "jane" cannot list resource "pods" in API group "" in the namespace "default""#),
        "{out}"
    );
    assert_eq!(kubectl_at(&jane, &["auth", "can-i", "list", "pods", "-n", "default"], None).1.trim(), "no");
    kubectl(
        &admin,
        &["create", "rolebinding", "jane-view", "--clusterrole", "view", "--user", "jane", "-n", "default"],
    );
    let binding = kubectl(
        &admin,
        &["get", "rolebinding", "jane-view", "-n", "default", "-o", "jsonpath={.roleRef.name}/{.subjects[0].name}"],
    );
    assert_eq!(binding, "view/jane");
    eventually("jane may list pods in default", || kubectl_at(&jane, &["get", "pods", "-n", "default"], None).0);
    assert_eq!(kubectl_at(&jane, &["auth", "can-i", "list", "pods", "-n", "default"], None).1.trim(), "yes");
    // Only there: not in another namespace, not another tenant's namespace of that name.
    kubectl_fails(&jane, &["get", "pods", "-n", "kube-system"]);
    let whoami = kubectl(&jane, &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]);
    assert_eq!(whoami, "jane");
    Ok(())
}

/// A raw request with a kubeconfig's identity: status and body.
async fn request(client: &kube::Client, method: &str, path: &str, body: Option<&str>) -> Result<(u16, Vec<u8>)> {
    let mut req = http::Request::builder().method(method).uri(path).header("accept", "application/json");
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req.body(body.unwrap_or_default().as_bytes().to_vec())?;
    let resp = client.send(req.map(kube::client::Body::from)).await?;
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await?.to_bytes();
    Ok((status, bytes.to_vec()))
}

async fn client_of(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_requests_naming_another_tenant_s_objects_see_nothing_of_them() -> Result<()> {
    let lab = tokio::task::spawn_blocking(lab).await??;
    let acme_cfg = lab.proxy.kubeconfig("acme", "admin", "system:masters")?;
    let bob_cfg = lab.proxy.kubeconfig("bob", "admin", "system:masters")?;
    let secret = "acme-secret-7f3a";
    let acme_cfg2 = acme_cfg.clone();
    tokio::task::spawn_blocking(move || {
        apply(&acme_cfg2, &objects(secret));
        apply(&acme_cfg2, CRD);
        kubectl(&acme_cfg2, &["wait", "--for", "condition=Established", "crd/widgets.example.com", "--timeout=30s"]);
        apply(&acme_cfg2, &format!("apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w1, namespace: prod}}\nspec: {{size: {secret}}}\n"));
        for i in 0..3 {
            apply(&acme_cfg2, &format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cm{i}, namespace: default}}\ndata: {{m: {secret}}}\n"));
        }
    })
    .await?;
    let acme = client_of(&acme_cfg).await?;
    let bob = client_of(&bob_cfg).await?;
    // What acme has: continue tokens and resourceVersions of its lists.
    let (_, body) = request(&acme, "GET", "/api/v1/configmaps?limit=1", None).await?;
    let list: Value = serde_json::from_slice(&body)?;
    let token = list["metadata"]["continue"].as_str().context("a continue token")?.to_string();
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_string();
    assert!(String::from_utf8_lossy(&body).contains(secret), "acme sees its own objects");
    // Every uid of acme's objects: none may reach bob either.
    let mut acme_uids = Vec::new();
    for path in [
        "/api/v1/configmaps",
        "/api/v1/services",
        "/api/v1/namespaces",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    ] {
        let (_, body) = request(&acme, "GET", path, None).await?;
        let list: Value = serde_json::from_slice(&body)?;
        for item in list["items"].as_array().into_iter().flatten() {
            acme_uids.extend(item["metadata"]["uid"].as_str().map(str::to_string));
        }
    }
    assert!(acme_uids.len() >= 10, "{acme_uids:?}");

    let namespaces = ["default", "prod", "acme-default", "acme-prod", "kube-system", "acme", ""];
    let names = [
        "web",
        "cm0",
        "cm1",
        "acme-web",
        "w1",
        "reader",
        "acme-reader",
        "widgets.example.com",
        "widgets.acme.example.com",
    ];
    let resources = [
        ("/api/v1", "configmaps"),
        ("/api/v1", "services"),
        ("/api/v1", "namespaces"),
        ("/apis/rbac.authorization.k8s.io/v1", "clusterroles"),
        ("/apis/example.com/v1", "widgets"),
        ("/apis/acme.example.com/v1", "widgets"),
        ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions"),
    ];
    let queries = [
        String::new(),
        format!("continue={token}"),
        format!("limit=1&continue={token}"),
        format!("resourceVersion={rv}"),
        "labelSelector=marker%3Dacme-secret-7f3a".into(),
        "fieldSelector=metadata.namespace%3Dacme-prod".into(),
        "fieldSelector=metadata.name%3Dacme-reader".into(),
        "tenantPrefix=acme-".into(),
        "watch=1&timeoutSeconds=1".into(),
    ];
    let mut rng_state: u64 = 0x9e3779b97f4a7c15;
    let mut next = move |n: usize| {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        (rng_state % n as u64) as usize
    };
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let total = 10_000;
    let mut watches = 0;
    for i in 0..total {
        let (prefix, plural) = resources[next(resources.len())];
        let ns = namespaces[next(namespaces.len())];
        let name = names[next(names.len())];
        let mut query = queries[next(queries.len())].clone();
        if query.starts_with("watch") {
            watches += 1;
            if watches > 40 {
                query.clear(); // watches take a second each: 40 are enough
            }
        }
        let base = if ns.is_empty()
            || plural == "namespaces"
            || plural == "clusterroles"
            || plural == "customresourcedefinitions"
        {
            format!("{prefix}/{plural}")
        } else {
            format!("{prefix}/namespaces/{ns}/{plural}")
        };
        let (method, path, body) = match i % 10 {
            0..=5 => ("GET", format!("{base}?{query}"), None),
            6 | 7 => ("GET", format!("{base}/{name}"), None),
            8 => ("DELETE", format!("{base}/{name}"), None),
            _ => ("PATCH", format!("{base}/{name}"), Some(r#"{"metadata":{"labels":{"touched":"by-bob"}}}"#)),
        };
        let (status, bytes) = if method == "PATCH" {
            let req = http::Request::builder()
                .method("PATCH")
                .uri(&path)
                .header("content-type", "application/merge-patch+json")
                .body(body.unwrap_or_default().as_bytes().to_vec())?;
            let resp = bob.send(req.map(kube::client::Body::from)).await?;
            let s = resp.status().as_u16();
            (s, http_body_util::BodyExt::collect(resp.into_body()).await?.to_bytes().to_vec())
        } else {
            request(&bob, method, &path, body).await?
        };
        *statuses.entry(status).or_default() += 1;
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(secret), "{method} {path} -> {status}: {text:.500}");
        for uid in &acme_uids {
            assert!(!text.contains(uid.as_str()), "{method} {path} -> {status}: {text:.500}");
        }
        assert!(status < 500, "{method} {path} -> {status}: {text:.500}");
        assert!(
            matches!(status, 200 | 201 | 400 | 403 | 404 | 405 | 410 | 422),
            "{method} {path} -> {status}: {text:.300}"
        );
    }
    eprintln!("{total} requests as bob naming acme's objects: {statuses:?}");
    // acme's objects are all still there, untouched.
    let (status, body) = request(&acme, "GET", "/api/v1/namespaces/default/configmaps", None).await?;
    assert_eq!(status, 200);
    let list: Value = serde_json::from_slice(&body)?;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(4), "cm0-2 and kube-root-ca.crt");
    assert!(!String::from_utf8_lossy(&body).contains("by-bob"));
    let (status, _) = request(&acme, "GET", "/apis/example.com/v1/namespaces/prod/widgets/w1", None).await?;
    assert_eq!(status, 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_credentials_and_names_get_a_clear_4xx_and_store_nothing() -> Result<()> {
    let lab = tokio::task::spawn_blocking(lab).await??;
    // No tenant in the certificate; a tenant that does not exist.
    let nobody = lab.proxy.kubeconfig("ghost", "x", "")?;
    let ghost = client_of(&nobody).await?;
    let (status, body) = request(&ghost, "GET", "/api/v1/namespaces", None).await?;
    assert_eq!(status, 403);
    assert!(
        String::from_utf8_lossy(&body).contains(r#"tenant \"ghost\" does not exist"#),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let acme = client_of(&lab.proxy.kubeconfig("acme", "admin", "system:masters")?).await?;
    // A namespace whose stored name would pass 63 characters.
    let long = "n".repeat(60);
    let (status, body) =
        request(&acme, "POST", "/api/v1/namespaces", Some(&format!(r#"{{"metadata":{{"name":"{long}"}}}}"#))).await?;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(status, 422, "{text}");
    assert!(text.contains("must be no more than 58 characters"), "{text}");
    let (status, _) = request(&acme, "GET", &format!("/api/v1/namespaces/{long}"), None).await?;
    assert_eq!(status, 404);
    let (status, body) = request(&acme, "POST", "/api/v1/namespaces/default/configmaps", Some("{not json")).await?;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let (status, _) = request(&acme, "GET", "/metrics", None).await?;
    assert_eq!(status, 404, "the apiserver's metrics are not a tenant's");
    // A certificate of the tenants' CA without a tenant; no certificate at all.
    let out = std::process::Command::new(e2e::tenancy::tenant_proxy_bin())
        .args(["kubeconfig", "--dir"])
        .arg(lab.proxy.dir.path())
        .args(["--tenant", "a-b", "--server", &lab.proxy.url()])
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("collide"));
    let no_cert =
        std::process::Command::new("curl").args(["-sk", &format!("{}/api/v1/namespaces", lab.proxy.url())]).output()?;
    let text = String::from_utf8_lossy(&no_cert.stdout);
    assert!(text.contains(r#""code":401"#), "{text}");
    Ok(())
}

/// The Python client's typed CRUD checks (`test/clients/typed_crud.py`) pass the same
/// way straight to the apiserver and as a tenant through the proxy.
#[test]
fn the_python_client_s_typed_crud_passes_as_a_tenant_as_it_does_directly() -> Result<()> {
    let Some(python) = e2e::python_clients() else { return Ok(()) };
    let lab = lab()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/typed_crud.py");
    let run = |kubeconfig: &Path| -> Result<Vec<String>> {
        let out = std::process::Command::new(&python).arg(&script).arg("--kubeconfig").arg(kubeconfig).output()?;
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        anyhow::ensure!(out.status.success(), "typed_crud.py failed:\n{stdout}\n{stderr}");
        Ok(stdout.lines().filter(|l| l.starts_with("ok ")).map(str::to_string).collect())
    };
    let direct = run(&lab.api.identity("admin.conf"))?;
    let tenant = run(&lab.proxy.kubeconfig("acme", "admin", "system:masters")?)?;
    eprintln!("typed_crud.py: {} checks pass directly, {} as a tenant", direct.len(), tenant.len());
    assert!(direct.len() >= 10, "{direct:?}");
    assert_eq!(tenant, direct);
    Ok(())
}

/// A tenant's pod runs on a real kubelet; `kubectl logs` and `kubectl exec` (an upgraded
/// connection, spliced by the proxy) reach it through the proxy.
#[test]
fn a_tenant_s_pod_runs_and_answers_logs_and_exec() -> Result<()> {
    if !e2e::kubelet::require_docker() {
        return Ok(());
    }
    // The kubelet as `scripts/cluster` runs it: its own identity, the Node authorizer.
    let node = e2e::kubelet::Kubelet::node_name("tenant");
    let api = ApiServer::start_tls(&[node.as_str()], &["--authorization-mode", "Node,RBAC"])?;
    let _cm = ControllerManager::start(&api, &["--use-service-account-credentials"])?;
    let kubeconfig = api.identity(&format!("kubelet-{node}.conf")).display().to_string();
    let _kubelet = e2e::kubelet::Kubelet::start_named(&api.https_url(), &node, &["--kubeconfig".into(), kubeconfig])?;
    let admin = api.identity("admin.conf");
    eventually("the node registers", || kubectl_at(&admin, &["get", "node", &node], None).0);
    let proxy = TenantProxy::start(&api)?;
    proxy.add_tenant("acme")?;
    let acme = proxy.kubeconfig("acme", "admin", "system:masters")?;
    let overrides = format!(r#"{{"spec":{{"nodeName":"{node}","terminationGracePeriodSeconds":1}}}}"#);
    eventually("the default ServiceAccount exists", || {
        kubectl_at(&acme, &["get", "serviceaccount", "default"], None).0
    });
    kubectl(
        &acme,
        &[
            "run",
            "hello",
            "--image=busybox",
            "--image-pull-policy=IfNotPresent",
            "--restart=Never",
            &format!("--overrides={overrides}"),
            "--command",
            "--",
            "sh",
            "-c",
            "echo hello from acme; sleep 3600",
        ],
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let (_, logs) = kubectl_at(&acme, &["logs", "hello"], None);
        if logs.contains("hello from acme") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the tenant's pod did not run: {logs}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, out) =
        kubectl_at(&acme, &["exec", "-i", "hello", "--", "sh", "-c", "read x; echo got-$x"], Some("ping\n"));
    assert!(ok && out.contains("got-ping"), "exec through the proxy (WebSocket): {out}");
    // kubectl 1.27 speaks SPDY: the same splice.
    for (version, bin) in e2e::official_kubectls(&["1.27"]) {
        let out = std::process::Command::new(bin)
            .arg("--kubeconfig")
            .arg(&acme)
            .args(["exec", "hello", "--", "echo", "spdy-ok"])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("spdy-ok"), "kubectl {version} exec: {text} {err}");
    }
    let (ok, out) = kubectl_at(&acme, &["exec", "nosuch", "--", "true"], None);
    assert!(!ok && out.contains(r#"pods "nosuch" not found"#), "{out}");
    Ok(())
}
