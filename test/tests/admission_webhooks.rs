//! Admission webhooks with the official kubectl: a ValidatingWebhookConfiguration that
//! refuses pods without a `team` label (on create and on update, only in namespaces its
//! selector picks), a MutatingWebhookConfiguration whose JSON patch lands in the stored pod,
//! `failurePolicy: Fail` vs `Ignore` for a webhook that is down, a webhook slower than its
//! `timeoutSeconds`, server-side dry run, and a configuration the apiserver refuses. The
//! webhooks are a real HTTPS server in this test, behind a certificate of a CA of its own
//! that the configurations name in `caBundle`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use e2e::{ApiServer, KubectlOutput};
use serde_json::{json, Value};

/// The AdmissionReview answer for `review`.
fn answer(review: &Value, allowed: bool, message: &str, patch: Option<Value>) -> Json<Value> {
    let mut response = json!({"uid": review["request"]["uid"], "allowed": allowed});
    if !allowed {
        response["status"] = json!({"code": 403, "message": message});
    }
    if let Some(p) = patch {
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(p.to_string()));
    }
    Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
}

async fn validate(Json(review): Json<Value>) -> Json<Value> {
    let has_team = review.pointer("/request/object/metadata/labels/team").and_then(Value::as_str).is_some();
    answer(&review, has_team, "pods must carry a team label", None)
}

async fn mutate(Json(review): Json<Value>) -> Json<Value> {
    let has_labels = review.pointer("/request/object/metadata/labels").is_some_and(Value::is_object);
    let patch = if has_labels {
        json!([{"op": "add", "path": "/metadata/labels/admitted-by", "value": "webhook"}])
    } else {
        json!([{"op": "add", "path": "/metadata/labels", "value": {"admitted-by": "webhook"}}])
    };
    answer(&review, true, "", Some(patch))
}

async fn protect(Json(review): Json<Value>) -> Json<Value> {
    let deleting = review.pointer("/request/operation").and_then(Value::as_str) == Some("DELETE");
    let protected =
        review.pointer("/request/oldObject/metadata/labels/protected").and_then(Value::as_str) == Some("true");
    answer(&review, !(deleting && protected), "protected pods cannot be deleted", None)
}

async fn slow(Json(review): Json<Value>) -> Json<Value> {
    tokio::time::sleep(Duration::from_secs(4)).await;
    answer(&review, true, "", None)
}

/// Serve the webhooks over HTTPS on 127.0.0.1; returns the address and the CA (PEM).
fn start_webhooks(rt: &tokio::runtime::Runtime) -> Result<(SocketAddr, String)> {
    let now = common::pki::now();
    let ca = common::pki::Ca::generate_named("webhook-test-ca", now)?;
    let leaf = common::pki::Leaf {
        name: "webhook".into(),
        common_name: "webhook".into(),
        organizations: vec![],
        usage: common::pki::Usage::Server(vec!["127.0.0.1".into(), "localhost".into(), "hooks.default.svc".into()]),
        kubeconfig: false,
    };
    let (cert, key) = ca.issue(&leaf, now)?;
    use rustls::pki_types::pem::PemObject;
    let chain = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())?;
    let config = common::tls::build(chain, key, None)?;
    let app = Router::new()
        .route("/validate", post(validate))
        .route("/mutate", post(mutate))
        .route("/slow", post(slow))
        .route("/protect", post(protect));
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    rt.spawn(common::serve::serve_tls::<()>(
        listener,
        app,
        config,
        |_| None,
        std::future::pending(),
        Duration::from_secs(90),
    ));
    Ok((addr, ca.cert_pem))
}

fn kubectl(server: &ApiServer, args: &[&str]) -> Result<KubectlOutput> {
    server.kubectl(args)
}

fn apply(server: &ApiServer, yaml: &str) -> Result<KubectlOutput> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("manifest.yaml");
    std::fs::write(&path, yaml)?;
    kubectl(server, &["apply", "-f", &path.display().to_string()])
}

fn must(out: KubectlOutput, what: &str) -> Result<String> {
    ensure!(out.ok, "{what}: {}{}", out.stdout, out.stderr);
    Ok(out.stdout)
}

fn configuration(kind: &str, name: &str, webhook: &str, url: &str, ca: &str, extra: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: {kind}
metadata:
  name: {name}
webhooks:
- name: {webhook}
  clientConfig:
    url: {url}
    caBundle: {ca}
  rules:
  - operations: ["CREATE", "UPDATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["pods"]
  sideEffects: None
  admissionReviewVersions: ["v1"]
{extra}"#
    )
}

/// Run `create` until the webhook configuration is in force (the apiserver follows
/// configurations through a watch): until it fails, deleting what it created meanwhile.
fn until_refused(server: &ApiServer, ns: &str, pod: &str, create: &[&str]) -> Result<KubectlOutput> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = kubectl(server, create)?;
        if !out.ok {
            return Ok(out);
        }
        kubectl(server, &["-n", ns, "delete", "pod", pod, "--wait=false"])?;
        if Instant::now() > deadline {
            bail!("the webhook never refused {create:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn validating_and_mutating_webhooks_with_the_official_kubectl() -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let (addr, ca) = start_webhooks(&rt)?;
    let server = ApiServer::start()?;
    must(kubectl(&server, &["create", "namespace", "hooked"])?, "namespace")?;
    must(kubectl(&server, &["label", "namespace", "hooked", "webhooks=on"])?, "label")?;
    must(kubectl(&server, &["create", "namespace", "plain"])?, "namespace")?;
    let selector = "  namespaceSelector:\n    matchLabels: {webhooks: \"on\"}\n";
    must(
        apply(
            &server,
            &configuration(
                "ValidatingWebhookConfiguration",
                "require-team",
                "require-team.example.com",
                &format!("https://{addr}/validate"),
                &ca,
                selector,
            ),
        )?,
        "validating configuration",
    )?;
    must(
        apply(
            &server,
            &configuration(
                "MutatingWebhookConfiguration",
                "label-pods",
                "label.example.com",
                &format!("https://{addr}/mutate"),
                &ca,
                selector,
            ),
        )?,
        "mutating configuration",
    )?;
    // The stored configuration carries Kubernetes' defaults.
    let stored: Value = serde_json::from_str(&must(
        kubectl(&server, &["get", "validatingwebhookconfiguration", "require-team", "-o", "json"])?,
        "get",
    )?)?;
    assert_eq!(stored["webhooks"][0]["failurePolicy"], "Fail");
    assert_eq!(stored["webhooks"][0]["timeoutSeconds"], 10);

    // kubectl lists them with upstream's columns.
    let listed = must(kubectl(&server, &["get", "validatingwebhookconfigurations"])?, "list")?;
    let header: Vec<&str> = listed.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "WEBHOOKS", "AGE"], "{listed}");
    assert!(listed.lines().any(|l| l.split_whitespace().take(2).eq(["require-team", "1"])), "{listed}");

    // Refused, with the webhook's message as kubectl shows it.
    let refused = until_refused(&server, "hooked", "nolabel", &["-n", "hooked", "run", "nolabel", "--image=busybox"])?;
    assert!(
        refused.stderr.contains(
            "pods \"nolabel\" is forbidden: admission webhook \"require-team.example.com\" denied the request: pods must carry a team label"
        ),
        "{}",
        refused.stderr
    );
    // Server-side dry run calls webhooks without side effects too.
    let dry = kubectl(&server, &["-n", "hooked", "run", "dry", "--image=busybox", "--dry-run=server"])?;
    assert!(!dry.ok && dry.stderr.contains("denied the request"), "{dry:?}");
    // Admitted, and mutated: the patch is in the stored pod.
    must(kubectl(&server, &["-n", "hooked", "run", "ok", "--image=busybox", "--labels=team=a"])?, "run ok")?;
    let label = must(
        kubectl(&server, &["-n", "hooked", "get", "pod", "ok", "-o", "jsonpath={.metadata.labels.admitted-by}"])?,
        "get ok",
    )?;
    assert_eq!(label, "webhook");
    // Updates go through the webhooks too: removing the label is refused.
    let unlabel = kubectl(&server, &["-n", "hooked", "label", "pod", "ok", "team-"])?;
    assert!(!unlabel.ok && unlabel.stderr.contains("pods must carry a team label"), "{unlabel:?}");
    // Other namespaces are not selected.
    must(kubectl(&server, &["-n", "plain", "run", "free", "--image=busybox"])?, "run free")?;
    let free = must(
        kubectl(&server, &["-n", "plain", "get", "pod", "free", "-o", "jsonpath={.metadata.labels}"])?,
        "get free",
    )?;
    assert!(!free.contains("admitted-by"), "{free}");

    // A webhook that is down: Fail refuses, Ignore lets the request through.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let down = |policy: &str| {
        configuration(
            "ValidatingWebhookConfiguration",
            "down",
            "down.example.com",
            &format!("https://{closed}/validate"),
            &ca,
            &format!("  failurePolicy: {policy}\n  objectSelector:\n    matchLabels: {{probe: down}}\n"),
        )
    };
    must(apply(&server, &down("Fail"))?, "down/Fail")?;
    let failed = until_refused(
        &server,
        "plain",
        "probe1",
        &["-n", "plain", "run", "probe1", "--image=busybox", "--labels=probe=down"],
    )?;
    assert!(
        failed.stderr.contains("Internal error occurred: failed calling webhook \"down.example.com\""),
        "{}",
        failed.stderr
    );
    must(apply(&server, &down("Ignore"))?, "down/Ignore")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !kubectl(&server, &["-n", "plain", "run", "probe1", "--image=busybox", "--labels=probe=down"])?.ok {
        ensure!(Instant::now() < deadline, "failurePolicy Ignore never let the pod through");
        std::thread::sleep(Duration::from_millis(100));
    }

    // A webhook slower than its timeout fails the call in about the timeout.
    must(
        apply(
            &server,
            &configuration(
                "ValidatingWebhookConfiguration",
                "slow",
                "slow.example.com",
                &format!("https://{addr}/slow"),
                &ca,
                "  timeoutSeconds: 1\n  objectSelector:\n    matchLabels: {probe: slow}\n",
            ),
        )?,
        "slow",
    )?;
    let started = Instant::now();
    let timed_out = until_refused(
        &server,
        "plain",
        "probe2",
        &["-n", "plain", "run", "probe2", "--image=busybox", "--labels=probe=slow"],
    )?;
    let took = started.elapsed();
    assert!(timed_out.stderr.contains("failed calling webhook \"slow.example.com\""), "{}", timed_out.stderr);
    assert!(timed_out.stderr.contains("context deadline exceeded"), "{}", timed_out.stderr);
    assert!(took < Duration::from_secs(4), "the 1 s timeout took {took:?}");

    // DELETE: the webhook sees the stored object as oldObject.
    must(
        apply(
            &server,
            &configuration(
                "ValidatingWebhookConfiguration",
                "protect",
                "protect.example.com",
                &format!("https://{addr}/protect"),
                &ca,
                "",
            )
            .replace(r#"["CREATE", "UPDATE"]"#, r#"["DELETE"]"#),
        )?,
        "protect",
    )?;
    must(kubectl(&server, &["-n", "plain", "run", "keep", "--image=busybox", "--labels=protected=true"])?, "keep")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let kept = loop {
        let out = kubectl(&server, &["-n", "plain", "delete", "pod", "keep", "--wait=false"])?;
        if !out.ok {
            break out;
        }
        ensure!(Instant::now() < deadline, "the DELETE webhook never refused");
        must(kubectl(&server, &["-n", "plain", "run", "keep", "--image=busybox", "--labels=protected=true"])?, "keep")?;
    };
    assert!(kept.stderr.contains("protected pods cannot be deleted"), "{}", kept.stderr);
    must(kubectl(&server, &["-n", "plain", "get", "pod", "keep"])?, "still there")?;

    // A configuration the dispatcher could not use is refused with the field named.
    let bad = apply(
        &server,
        &configuration("ValidatingWebhookConfiguration", "bad", "short", "http://127.0.0.1:1/x", &ca, ""),
    )?;
    assert!(!bad.ok, "{bad:?}");
    assert!(bad.stderr.contains("should be a domain with at least three segments"), "{}", bad.stderr);
    assert!(bad.stderr.contains("'https' is the only allowed URL scheme"), "{}", bad.stderr);
    Ok(())
}

#[test]
fn a_webhook_behind_a_service_is_reached_through_its_endpoints() -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let (addr, ca) = start_webhooks(&rt)?;
    let server = ApiServer::start()?;
    // A selector-less Service whose Endpoints point at the webhook server, whose
    // certificate names `hooks.default.svc`: the name the service form implies.
    let manifest = format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: hooks, namespace: default}}
spec:
  ports: [{{name: https, port: 443, targetPort: {port}}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: hooks, namespace: default}}
subsets:
- addresses: [{{ip: 127.0.0.1}}]
  ports: [{{name: https, port: {port}}}]
"#,
        port = addr.port()
    );
    must(apply(&server, &manifest)?, "service")?;
    let cfg = configuration("ValidatingWebhookConfiguration", "svc", "svc.example.com", "https://x/", &ca, "")
        .replace("    url: https://x/\n", "    service: {namespace: default, name: hooks, path: /validate}\n");
    must(apply(&server, &cfg)?, "configuration")?;
    let out = until_refused(&server, "default", "p", &["run", "p", "--image=busybox"])?;
    assert!(
        out.stderr.contains("admission webhook \"svc.example.com\" denied the request: pods must carry a team label"),
        "{}",
        out.stderr
    );
    must(kubectl(&server, &["run", "q", "--image=busybox", "--labels=team=b"])?, "run q")?;
    Ok(())
}
