//! The sidecar injection webhook: its certificates (a CA and a serving certificate pilot
//! makes at first start and keeps in `--cert-dir`), the HTTPS endpoint `POST /inject`
//! ([`crate::inject::review`]) and the `MutatingWebhookConfiguration`
//! `istio-sidecar-injector` that sends pod creations to it, with Istio's two webhooks:
//! - `namespace.sidecar-injector.istio.io`: namespaces labelled `istio-injection=enabled`,
//!   pods not labelled `sidecar.istio.io/inject=false`;
//! - `object.sidecar-injector.istio.io`: namespaces without `istio-injection`, pods
//!   labelled `sidecar.istio.io/inject=true`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use common::pki::{Ca, Leaf, Usage};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

use crate::inject::Injection;

pub const CONFIGURATION_NAME: &str = "istio-sidecar-injector";
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const CERT: &str = "tls.crt";
pub const KEY: &str = "tls.key";

/// A serving certificate expiring sooner than this is replaced at start.
const RENEW_BEFORE_SECONDS: i64 = 30 * 24 * 3600;

/// The webhook's PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Certificates {
    pub ca_cert: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
}

/// The names the serving certificate is valid for.
pub fn sans(advertise: &str) -> Vec<String> {
    let mut out = vec![
        advertise.to_string(),
        "pilot.istio-system.svc".to_string(),
        "istiod.istio-system.svc".to_string(),
        "localhost".to_string(),
        "127.0.0.1".to_string(),
    ];
    out.dedup();
    out
}

/// What the certificates should be, given what `--cert-dir` holds: the CA is kept (the
/// apiserver's `caBundle` stays valid); the serving certificate is kept unless it is
/// missing, not the CA's, short of a name or close to expiry.
pub fn plan(
    existing: Option<Certificates>,
    names: &[String],
    now: time::OffsetDateTime,
) -> Result<(Certificates, bool), common::pki::PkiError> {
    let (ca, old) = match existing {
        Some(c) if !c.ca_cert.is_empty() && !c.ca_key.is_empty() => {
            (Ca { cert_pem: c.ca_cert.clone(), key_pem: c.ca_key.clone() }, Some(c))
        }
        _ => (Ca::generate_named("pilot-webhook-ca", now)?, None),
    };
    if let Some(old) = &old {
        if serving_cert_ok(old, names, now.unix_timestamp()) {
            return Ok((old.clone(), false));
        }
    }
    let leaf = Leaf {
        name: "pilot-webhook".into(),
        common_name: "pilot.istio-system.svc".into(),
        organizations: vec![],
        usage: Usage::Server(names.to_vec()),
        kubeconfig: false,
    };
    let (cert, key) = ca.issue(&leaf, now)?;
    Ok((Certificates { ca_cert: ca.cert_pem, ca_key: ca.key_pem, cert, key }, true))
}

fn serving_cert_ok(c: &Certificates, names: &[String], now: i64) -> bool {
    let (Some(der), Some(ca_der)) = (common::pki::pem_to_der(&c.cert), common::pki::pem_to_der(&c.ca_cert)) else {
        return false;
    };
    let Ok(info) = common::pki::inspect(&der) else { return false };
    !c.key.is_empty()
        && common::pki::signed_by(&der, &ca_der)
        && names.iter().all(|n| info.sans.contains(n))
        && info.not_after - now > RENEW_BEFORE_SECONDS
}

/// Read the certificates in `dir`, make what is missing, write it back (owner-only).
pub fn load_or_create(dir: &Path, names: &[String]) -> anyhow::Result<Certificates> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let existing = Certificates { ca_cert: read(CA_CERT), ca_key: read(CA_KEY), cert: read(CERT), key: read(KEY) };
    let (certs, changed) = plan(Some(existing), names, time::OffsetDateTime::now_utc())?;
    if changed {
        for (file, pem) in [(CA_CERT, &certs.ca_cert), (CA_KEY, &certs.ca_key), (CERT, &certs.cert), (KEY, &certs.key)]
        {
            common::write_private(&dir.join(file), pem.as_bytes())?;
        }
        tracing::info!(dir = %dir.display(), "wrote the webhook's certificates");
    }
    Ok(certs)
}

/// The rustls configuration of the webhook port.
pub fn tls_config(certs: &Certificates) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(certs.cert.as_bytes())
        .collect::<Result<_, _>>()
        .context("the webhook certificate")?;
    let key = PrivateKeyDer::from_pem_slice(certs.key.as_bytes()).context("the webhook key")?;
    Ok(common::tls::build(chain, key, None)?)
}

fn webhook(name: &str, url: &str, ca: &str, namespace_selector: Value, object_selector: Value) -> Value {
    json!({
        "name": name,
        "clientConfig": {"url": url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca)},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Fail",
        "reinvocationPolicy": "Never",
        "timeoutSeconds": 10,
        "namespaceSelector": namespace_selector,
        "objectSelector": object_selector,
    })
}

/// The `MutatingWebhookConfiguration` sending pod creations to `url`, trusting `ca_pem`.
pub fn configuration(url: &str, ca_pem: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME, "labels": {"app": "sidecar-injector"}},
        "webhooks": [
            webhook(
                "namespace.sidecar-injector.istio.io", url, ca_pem,
                json!({"matchLabels": {"istio-injection": "enabled"}}),
                json!({"matchExpressions": [{"key": "sidecar.istio.io/inject", "operator": "NotIn", "values": ["false"]}]}),
            ),
            webhook(
                "object.sidecar-injector.istio.io", url, ca_pem,
                json!({"matchExpressions": [{"key": "istio-injection", "operator": "DoesNotExist"}]}),
                json!({"matchExpressions": [{"key": "sidecar.istio.io/inject", "operator": "In", "values": ["true"]}]}),
            ),
        ],
    })
}

/// Create the webhook configuration, or replace an existing one with it.
pub async fn ensure_configuration(client: &kube::Client, url: &str, ca_pem: &str) -> anyhow::Result<()> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut obj: MutatingWebhookConfiguration =
        serde_json::from_value(configuration(url, ca_pem)).context("the webhook configuration")?;
    match api.get_opt(CONFIGURATION_NAME).await.context("reading the webhook configuration")? {
        Some(current) => {
            obj.metadata.resource_version = current.metadata.resource_version;
            api.replace(CONFIGURATION_NAME, &PostParams::default(), &obj)
                .await
                .context("updating the webhook configuration")?;
        }
        None => {
            api.create(&PostParams::default(), &obj).await.context("creating the webhook configuration")?;
        }
    }
    tracing::info!(name = CONFIGURATION_NAME, url, "webhook configuration in place");
    Ok(())
}

/// `POST /inject`.
pub fn router(injection: Arc<Injection>) -> Router {
    Router::new().route(
        "/inject",
        post(move |body: axum::body::Bytes| {
            let injection = injection.clone();
            async move {
                let review: Value = match serde_json::from_slice(&body) {
                    Ok(v) => v,
                    Err(e) => return (StatusCode::BAD_REQUEST, format!("not JSON: {e}")).into_response(),
                };
                match crate::inject::review(&review, &injection) {
                    Ok(answer) => Json(answer).into_response(),
                    Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
                }
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_has_istios_two_webhooks() {
        let v = configuration("https://192.168.1.10:15017/inject", "-----BEGIN CERTIFICATE-----\n");
        let obj: MutatingWebhookConfiguration = serde_json::from_value(v).unwrap();
        assert_eq!(obj.metadata.name.as_deref(), Some("istio-sidecar-injector"));
        let hooks = obj.webhooks.unwrap();
        let names: Vec<&str> = hooks.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, vec!["namespace.sidecar-injector.istio.io", "object.sidecar-injector.istio.io"]);
        for w in &hooks {
            assert_eq!(w.client_config.url.as_deref(), Some("https://192.168.1.10:15017/inject"));
            assert!(w.client_config.ca_bundle.is_some());
            assert_eq!(w.side_effects, "None");
            assert_eq!(w.admission_review_versions, vec!["v1"]);
            assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
            let r = &w.rules.as_ref().unwrap()[0];
            assert_eq!(r.operations, Some(vec!["CREATE".to_string()]));
            assert_eq!(r.resources, Some(vec!["pods".to_string()]));
        }
        let ns = hooks[0].namespace_selector.as_ref().unwrap();
        assert_eq!(ns.match_labels.as_ref().unwrap()["istio-injection"], "enabled");
        let os = &hooks[0].object_selector.as_ref().unwrap().match_expressions.as_ref().unwrap()[0];
        assert_eq!((os.key.as_str(), os.operator.as_str()), ("sidecar.istio.io/inject", "NotIn"));
        let ns = &hooks[1].namespace_selector.as_ref().unwrap().match_expressions.as_ref().unwrap()[0];
        assert_eq!((ns.key.as_str(), ns.operator.as_str()), ("istio-injection", "DoesNotExist"));
        let os = &hooks[1].object_selector.as_ref().unwrap().match_expressions.as_ref().unwrap()[0];
        assert_eq!((os.operator.as_str(), os.values.as_deref()), ("In", Some(&["true".to_string()][..])));
    }

    #[test]
    fn certificates_are_made_once_and_kept() {
        let now = time::OffsetDateTime::now_utc();
        let names = sans("192.168.1.10");
        let (first, made) = plan(None, &names, now).unwrap();
        assert!(made);
        let info = common::pki::inspect(&common::pki::pem_to_der(&first.cert).unwrap()).unwrap();
        for n in ["192.168.1.10", "pilot.istio-system.svc", "localhost"] {
            assert!(info.sans.contains(&n.to_string()), "{n} not in {:?}", info.sans);
        }
        let (again, made) = plan(Some(first.clone()), &names, now).unwrap();
        assert!(!made);
        assert_eq!(again, first);
        // A new advertise address: a new serving certificate from the same CA.
        let (moved, made) = plan(Some(first.clone()), &sans("10.0.0.7"), now).unwrap();
        assert!(made);
        assert_eq!(moved.ca_cert, first.ca_cert);
        assert_ne!(moved.cert, first.cert);
        assert!(tls_config(&moved).is_ok());
    }

    #[test]
    fn files_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let certs = load_or_create(&dir.path().join("certs"), &sans("127.0.0.1")).unwrap();
        for f in [CA_CERT, CA_KEY, CERT, KEY] {
            let mode = std::fs::metadata(dir.path().join("certs").join(f)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{f}");
        }
        assert_eq!(load_or_create(&dir.path().join("certs"), &sans("127.0.0.1")).unwrap(), certs);
    }

    /// The HTTPS endpoint, verified with the CA pilot made, answers an AdmissionReview.
    #[tokio::test]
    async fn inject_over_https() {
        let dir = tempfile::tempdir().unwrap();
        let certs = load_or_create(dir.path(), &sans("127.0.0.1")).unwrap();
        std::fs::write(dir.path().join("review.json"), serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "abc", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                        "namespace": "default",
                        "object": {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
        })).unwrap()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let injection = Arc::new(Injection {
            image: "minik8s/envoy:latest".into(),
            discovery_address: "127.0.0.1:15010".into(),
            cluster_domain: "cluster.local".into(),
        });
        tokio::spawn(common::serve::serve_tls::<common::serve::NoUser>(
            listener,
            router(injection),
            tls_config(&certs).unwrap(),
            |_| None,
            std::future::pending(),
            common::serve::IDLE_TIMEOUT,
        ));
        let out = tokio::process::Command::new("curl")
            .args(["-sS", "--cacert", &dir.path().join(CA_CERT).display().to_string()])
            .args(["-H", "Content-Type: application/json", "--data-binary"])
            .arg(format!("@{}", dir.path().join("review.json").display()))
            .arg(format!("https://localhost:{port}/inject"))
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(answer["response"]["uid"], "abc");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
    }
}
