//! API aggregation (kube-aggregator): an APIService for `wardle.example.com/v1alpha1` names
//! a Service whose EndpointSlice points at an HTTPS server in this test (a CA of its own, in
//! the APIService's `caBundle`) serving a `flunders` resource. The availability controller
//! finds it (`Available=True`, `Passed`); requests under the group-version are proxied with
//! the caller in `X-Remote-User`/`X-Remote-Group` and without their credentials, a watch
//! streams, discovery lists the group, and the official kubectl's `get flunders` and
//! `api-resources` show it. The backend going away makes the APIService
//! `FailedDiscoveryCheck` and its requests 503; an APIService naming a Service that does not
//! exist is `ServiceNotFound`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine;
use e2e::tls::TlsFront;
use e2e::{kubectl_bin, ApiServer, KubectlOutput};
use futures::StreamExt;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GV: &str = "wardle.example.com/v1alpha1";
const TOKENS: &str = "alice-token,alice,uid-alice,\"devs\"\n";

/// What the backend saw of each request: its path and headers.
type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

fn flunder(ns: &str, name: &str) -> Value {
    json!({"apiVersion": GV, "kind": "Flunder",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": "2024-01-01T00:00:00Z", "resourceVersion": "1"},
        "spec": {"reference": "cheese"}})
}

async fn resources(State(seen): State<Seen>, headers: HeaderMap) -> Json<Value> {
    seen.lock().unwrap().push(("/apis/wardle.example.com/v1alpha1".into(), headers));
    Json(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GV, "resources": [
        {"name": "flunders", "singularName": "flunder", "namespaced": true, "kind": "Flunder",
         "verbs": ["get", "list", "watch", "create", "delete"], "shortNames": ["fl"]}]}))
}

async fn flunders(
    State(seen): State<Seen>,
    UrlPath(ns): UrlPath<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    seen.lock().unwrap().push((format!("/namespaces/{ns}/flunders"), headers));
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        // One event, then the stream stays open: the apiserver must pass it on as it comes.
        let event = format!("{}\n", json!({"type": "ADDED", "object": flunder(&ns, "my-flunder")}));
        let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(bytes::Bytes::from(event)) })
            .chain(futures::stream::pending());
        return ([(axum::http::header::CONTENT_TYPE, "application/json")], axum::body::Body::from_stream(stream))
            .into_response();
    }
    Json(json!({"apiVersion": GV, "kind": "FlunderList", "metadata": {"resourceVersion": "1"},
        "items": [flunder(&ns, "my-flunder")]}))
    .into_response()
}

async fn one_flunder(
    State(seen): State<Seen>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    seen.lock().unwrap().push((format!("/namespaces/{ns}/flunders/{name}"), headers));
    if name != "my-flunder" {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
            "message": format!("flunders.wardle.example.com \"{name}\" not found")});
        return (axum::http::StatusCode::NOT_FOUND, Json(status)).into_response();
    }
    Json(flunder(&ns, &name)).into_response()
}

/// The aggregated API server: HTTPS on 127.0.0.1 with a certificate for
/// `wardle-api.default.svc` from a CA of its own. Returns its address, the CA (PEM) and the
/// server's task (abort it to stop the server).
fn start_backend(
    rt: &tokio::runtime::Runtime,
    seen: Seen,
) -> Result<(SocketAddr, String, tokio::task::JoinHandle<()>)> {
    let now = common::pki::now();
    let ca = common::pki::Ca::generate_named("wardle-test-ca", now)?;
    let leaf = common::pki::Leaf {
        name: "wardle".into(),
        common_name: "wardle-api".into(),
        organizations: vec![],
        usage: common::pki::Usage::Server(vec!["wardle-api.default.svc".into(), "127.0.0.1".into()]),
        kubeconfig: false,
    };
    let (cert, key) = ca.issue(&leaf, now)?;
    use rustls::pki_types::pem::PemObject;
    let chain = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())?;
    let config = common::tls::build(chain, key, None)?;
    let app = Router::new()
        .route("/apis/wardle.example.com/v1alpha1", get(resources))
        // Another group-version on the same server, for the APIService with a wrong caBundle.
        .route(
            "/apis/other.example.com/v1",
            get(|| async { Json(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "other.example.com/v1", "resources": []})) }),
        )
        .route("/apis/wardle.example.com/v1alpha1/namespaces/{ns}/flunders", get(flunders))
        .route("/apis/wardle.example.com/v1alpha1/namespaces/{ns}/flunders/{name}", get(one_flunder))
        .with_state(seen);
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let task = rt.spawn(common::serve::serve_tls::<()>(
        listener,
        app,
        config,
        |_| None,
        std::future::pending(),
        Duration::from_secs(90),
    ));
    Ok((addr, ca.cert_pem, task))
}

/// The official kubectl as alice (through a TLS front: kubectl sends tokens only over TLS).
struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn run(&self, args: &[&str]) -> Result<KubectlOutput> {
        let out = Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .context("running kubectl")?;
        Ok(out.into())
    }

    fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.run(args)?;
        ensure!(out.ok, "kubectl {args:?}: {}{}", out.stdout, out.stderr);
        Ok(out.stdout)
    }
}

fn apply(k: &Kubectl, dir: &Path, yaml: &str) -> Result<()> {
    let file = dir.join("manifest.yaml");
    std::fs::write(&file, yaml)?;
    k.ok(&["apply", "-f", &file.to_string_lossy()])?;
    Ok(())
}

/// The APIService's Available condition: (status, reason, message).
async fn available(api: &Api<APIService>, name: &str) -> Result<(String, String, String)> {
    let a = api.get(name).await?;
    let c = a.status.and_then(|s| s.conditions).and_then(|cs| cs.into_iter().find(|c| c.type_ == "Available"));
    Ok(c.map(|c| (c.status, c.reason.unwrap_or_default(), c.message.unwrap_or_default())).unwrap_or_default())
}

async fn wait_for(api: &Api<APIService>, name: &str, status: &str, reason: &str) -> Result<(String, String, String)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let c = available(api, name).await?;
        if c.0 == status && c.1 == reason {
            return Ok(c);
        }
        if std::time::Instant::now() > deadline {
            bail!("{name} never became {status} ({reason}): {c:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A raw request to the apiserver's plain port; returns the status line and what of the
/// body arrived within `wait` (the body of a watch never ends).
async fn raw_until(port: u16, path: &str, token: &str, want: &str, wait: Duration) -> Result<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(want) {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => break,
        }
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

#[test]
fn an_aggregated_api_is_proxied_discovered_and_watched_for_availability() -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let seen: Seen = Arc::default();
    let (backend, ca, backend_task) = start_backend(&rt, seen.clone())?;
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, TOKENS)?;
    let server =
        ApiServer::start_with(&["--token-auth-file", &tokens.to_string_lossy(), "--aggregator-resync-interval", "2s"])?;
    let front = TlsFront::start(server.port)?;
    let kubeconfig = dir.path().join("alice");
    front.write_kubeconfig(&kubeconfig, "alice-token")?;
    let k = Kubectl { kubeconfig, cache: dir.path().join("kubectl-cache") };
    let mut config = kube::Config::new(server.url().parse()?);
    config.auth_info.token = Some("alice-token".to_string().into());
    // kube retries a 503 for minutes by default; the 503 is what is tested here.
    config.default_retry = false;
    let _runtime = rt.enter();
    let client = kube::Client::try_from(config)?;
    let apiservices: Api<APIService> = Api::all(client.clone());

    // The Service and the EndpointSlice that point at the backend, and the APIService.
    apply(
        &k,
        dir.path(),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: wardle-api, namespace: default}}\n\
             spec: {{ports: [{{name: https, port: 443, targetPort: {port}}}]}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: wardle-api-1, namespace: default, labels: {{kubernetes.io/service-name: wardle-api}}}}\n\
             addressType: IPv4\nendpoints: [{{addresses: [\"127.0.0.1\"], conditions: {{ready: true}}}}]\n\
             ports: [{{name: https, port: {port}, protocol: TCP}}]\n",
            port = backend.port()
        ),
    )?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    apply(
        &k,
        dir.path(),
        &format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {{name: v1alpha1.wardle.example.com}}\n\
             spec: {{group: wardle.example.com, version: v1alpha1, groupPriorityMinimum: 1000, versionPriority: 15,\n\
             service: {{namespace: default, name: wardle-api}}, caBundle: {ca_bundle}}}\n"
        ),
    )?;

    rt.block_on(async {
        let (_, _, message) = wait_for(&apiservices, "v1alpha1.wardle.example.com", "True", "Passed").await?;
        ensure!(message == "all checks passed", "{message}");
        let stored = apiservices.get("v1alpha1.wardle.example.com").await?;
        ensure!(stored.spec.and_then(|s| s.service).and_then(|s| s.port) == Some(443), "port defaulted");

        // Proxied: the backend's list, and the backend saw alice without her token.
        seen.lock().unwrap().clear();
        let req = http::Request::get("/apis/wardle.example.com/v1alpha1/namespaces/default/flunders").body(vec![])?;
        let list: Value = client.request(req).await?;
        ensure!(list["kind"] == "FlunderList" && list["items"][0]["metadata"]["name"] == "my-flunder", "{list}");
        let (path, headers) = seen
            .lock()
            .unwrap()
            .iter()
            .find(|(p, _)| p.ends_with("/flunders"))
            .cloned()
            .context("the backend saw no list")?;
        ensure!(path == "/namespaces/default/flunders");
        ensure!(headers.get("x-remote-user").and_then(|v| v.to_str().ok()) == Some("alice"), "{headers:?}");
        let groups: Vec<&str> = headers.get_all("x-remote-group").iter().filter_map(|v| v.to_str().ok()).collect();
        ensure!(groups == ["devs", "system:authenticated"], "{groups:?}");
        ensure!(headers.get("authorization").is_none(), "the token reached the backend: {headers:?}");

        // A watch streams: its first event arrives while the backend keeps the stream open.
        let watch = raw_until(
            server.port,
            "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders?watch=true",
            "alice-token",
            "\"ADDED\"",
            Duration::from_secs(10),
        )
        .await?;
        ensure!(watch.starts_with("HTTP/1.1 200") && watch.contains("\"ADDED\""), "{watch}");

        // Discovery lists the group; the group document names its version.
        let groups: Value = client.request(http::Request::get("/apis").body(vec![])?).await?;
        let wardle = groups["groups"].as_array().unwrap().iter().find(|g| g["name"] == "wardle.example.com").cloned();
        ensure!(wardle.as_ref().is_some_and(|g| g["preferredVersion"]["groupVersion"] == GV), "/apis: {groups}");
        let group: Value = client.request(http::Request::get("/apis/wardle.example.com").body(vec![])?).await?;
        ensure!(group["kind"] == "APIGroup" && group["versions"][0]["version"] == "v1alpha1", "{group}");
        let resources: Value =
            client.request(http::Request::get("/apis/wardle.example.com/v1alpha1").body(vec![])?).await?;
        ensure!(resources["resources"][0]["name"] == "flunders", "{resources}");
        Ok::<_, anyhow::Error>(())
    })?;

    // The official kubectl finds and lists the aggregated resource.
    let listed = k.ok(&["get", "flunders", "-n", "default"])?;
    ensure!(listed.lines().any(|l| l.starts_with("my-flunder ")), "kubectl get flunders:\n{listed}");
    let short = k.ok(&["get", "fl", "my-flunder", "-n", "default", "-o", "jsonpath={.spec.reference}"])?;
    ensure!(short == "cheese", "{short}");
    let resources = k.ok(&["api-resources", "--api-group", "wardle.example.com"])?;
    ensure!(
        resources.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["flunders", "fl", "wardle.example.com/v1alpha1", "true", "Flunder"]),
        "kubectl api-resources:\n{resources}"
    );
    let all = k.ok(&["api-resources"])?;
    ensure!(all.contains("wardle.example.com/v1alpha1"), "{all}");
    let row = k.ok(&["get", "apiservice", "v1alpha1.wardle.example.com", "--no-headers"])?;
    ensure!(row.split_whitespace().take(3).eq(["v1alpha1.wardle.example.com", "default/wardle-api", "True"]), "{row}");

    // The backend's certificate is verified against the caBundle: with another CA's, the
    // APIService is available (the discovery check, as upstream's, does not verify) but
    // requests fail the handshake.
    let other_ca = common::pki::Ca::generate_named("another-ca", common::pki::now())?;
    let other_bundle = base64::engine::general_purpose::STANDARD.encode(&other_ca.cert_pem);
    apply(
        &k,
        dir.path(),
        &format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {{name: v1.other.example.com}}\n\
             spec: {{group: other.example.com, version: v1, groupPriorityMinimum: 1000, versionPriority: 15,\n\
             service: {{namespace: default, name: wardle-api}}, caBundle: {other_bundle}}}\n"
        ),
    )?;
    rt.block_on(async {
        wait_for(&apiservices, "v1.other.example.com", "True", "Passed").await?;
        let raw =
            raw_until(server.port, "/apis/other.example.com/v1/things", "alice-token", "\n\n", Duration::from_secs(10))
                .await?;
        ensure!(raw.starts_with("HTTP/1.1 503") && raw.contains("tls:"), "{raw}");
        Ok::<_, anyhow::Error>(())
    })?;

    // The backend goes away: FailedDiscoveryCheck, and requests are refused with 503.
    backend_task.abort();
    rt.block_on(async {
        let (_, _, message) =
            wait_for(&apiservices, "v1alpha1.wardle.example.com", "False", "FailedDiscoveryCheck").await?;
        ensure!(
            message.starts_with(&format!(
                "failing or missing response from https://127.0.0.1:{}/apis/wardle.example.com/v1alpha1:",
                backend.port()
            )),
            "{message}"
        );
        let req = http::Request::get("/apis/wardle.example.com/v1alpha1/namespaces/default/flunders").body(vec![])?;
        // kube-aggregator's answer: plain text, which clients read as ServiceUnavailable.
        let raw = raw_until(
            server.port,
            "/apis/wardle.example.com/v1alpha1/namespaces/default/flunders",
            "alice-token",
            "unavailable\n",
            Duration::from_secs(5),
        )
        .await?;
        ensure!(raw.starts_with("HTTP/1.1 503") && raw.ends_with("\r\n\r\nservice unavailable\n"), "{raw}");
        match client.request::<Value>(req).await {
            Err(kube::Error::Api(e)) if e.code == 503 => {}
            other => bail!("expected 503, got {other:?}"),
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let out = k.run(&["get", "flunders", "-n", "default"])?;
    ensure!(
        !out.ok
            && out.stderr.contains("ServiceUnavailable")
            && out.stderr.contains("the server is currently unable to handle the request"),
        "{out:?}"
    );
    let row = k.ok(&["get", "apiservice", "v1alpha1.wardle.example.com", "--no-headers"])?;
    ensure!(row.split_whitespace().nth(2) == Some("False"), "{row}");
    ensure!(row.contains("(FailedDiscoveryCheck)"), "{row}");

    // An APIService whose Service does not exist.
    rt.block_on(async {
        let missing: APIService = serde_json::from_value(json!({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1beta1.missing.example.com"},
            "spec": {"group": "missing.example.com", "version": "v1beta1", "groupPriorityMinimum": 100,
                     "versionPriority": 10, "insecureSkipTLSVerify": true,
                     "service": {"namespace": "default", "name": "nope"}}}))?;
        apiservices.create(&PostParams::default(), &missing).await?;
        let (_, _, message) = wait_for(&apiservices, "v1beta1.missing.example.com", "False", "ServiceNotFound").await?;
        ensure!(message == "service/nope in \"default\" is not present", "{message}");
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(())
}
