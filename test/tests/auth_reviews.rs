//! The review APIs (`kubectl auth can-i`, `kubectl auth whoami`, TokenReview) against the
//! real apiserver: with the official kubectl, and with the kube crate over a token file;
//! and CertificateSigningRequests as the official kubectl handles them (`get csr`,
//! `certificate approve`, `describe csr`).

use anyhow::{ensure, Result};
use e2e::{kubectl_bin, raw, ApiServer};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use serde_json::json;

fn kubectl_available() -> bool {
    let ok = kubectl_bin().exists();
    if !ok && std::env::var("CI").as_deref() == Ok("true") {
        panic!("the official kubectl ({}) is missing", kubectl_bin().display());
    }
    ok
}

#[test]
fn official_kubectl_auth_can_i_and_whoami() -> Result<()> {
    if !kubectl_available() {
        eprintln!("skipping: no kubectl");
        return Ok(());
    }
    let server = ApiServer::start()?;
    let k = |args: &[&str]| server.kubectl(args);
    for args in [
        &["auth", "can-i", "create", "pods"][..],
        &["auth", "can-i", "delete", "deployments.apps", "-n", "kube-system"],
        &["auth", "can-i", "get", "/healthz"],
    ] {
        let out = k(args)?;
        ensure!(out.ok && out.stdout.trim() == "yes", "{args:?}: {out:?}");
    }
    let out = k(&["auth", "can-i", "--list"])?;
    ensure!(out.ok, "{out:?}");
    let rules: Vec<Vec<&str>> = out.stdout.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    ensure!(rules.contains(&vec!["*.*", "[]", "[]", "[*]"]), "resource rule: {}", out.stdout);
    ensure!(rules.contains(&vec!["[*]", "[]", "[*]"]), "non-resource rule: {}", out.stdout);
    // Without a token file every request is anonymous.
    let out = k(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username} {.status.userInfo.groups}"])?;
    ensure!(out.ok && out.stdout == "system:anonymous [\"system:unauthenticated\"]", "{out:?}");
    // A review kubectl sends with a bad spec is refused with Kubernetes' field path.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("ssar.yaml");
    std::fs::write(&file, "apiVersion: authorization.k8s.io/v1\nkind: SelfSubjectAccessReview\nspec: {}\n")?;
    let out = k(&["create", "-f", &file.to_string_lossy(), "-o", "yaml"])?;
    ensure!(!out.ok && out.stderr.contains("spec.resourceAttributes"), "{out:?}");
    // Reviews are created, never read back: other verbs are 405.
    let r = raw(server.port, "GET", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", None, b"")?;
    ensure!(r.status == 405 && r.json()["reason"] == "MethodNotAllowed", "{} {}", r.status, r.text());
    // A local review is bound to its URL's namespace.
    let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": "other", "verb": "get", "resource": "pods"}, "user": "u"}});
    let path = "/apis/authorization.k8s.io/v1/namespaces/default/localsubjectaccessreviews";
    let r = raw(server.port, "POST", path, Some("application/json"), body.to_string().as_bytes())?;
    ensure!(r.status == 422, "{} {}", r.status, r.text());
    ensure!(r.json()["details"]["causes"][0]["field"] == "spec.resourceAttributes.namespace", "{}", r.text());
    // An unserved subresource is a 404 with empty details, which `kubectl debug` expects.
    let out = k(&["run", "p", "--image=busybox", "--", "sleep", "1"])?;
    ensure!(out.ok, "{out:?}");
    let r = raw(server.port, "GET", "/api/v1/namespaces/default/pods/p/nosuch", None, b"")?;
    ensure!(r.status == 404 && r.json()["details"] == json!({}), "{} {}", r.status, r.text());
    Ok(())
}

#[tokio::test]
async fn kube_client_self_subject_review_and_token_review_with_a_token_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "admin-token,admin,uid-1,\"system:masters\"\nbob-token,bob,uid-2\n")?;
    let server = ApiServer::start_with(&["--token-auth-file", &tokens.to_string_lossy()])?;
    let client_with = |token: &str| -> Result<kube::Client> {
        let mut config = kube::Config::new(server.url().parse()?);
        config.auth_info.token = Some(token.to_string().into());
        Ok(kube::Client::try_from(config)?)
    };
    let admin = client_with("admin-token")?;

    let reviews: Api<SelfSubjectReview> = Api::all(admin.clone());
    let me = reviews.create(&PostParams::default(), &SelfSubjectReview::default()).await?;
    let user = me.status.and_then(|s| s.user_info).unwrap_or_default();
    ensure!(user.username.as_deref() == Some("admin") && user.uid.as_deref() == Some("uid-1"), "{user:?}");
    ensure!(user.groups == Some(vec!["system:masters".into(), "system:authenticated".into()]), "{user:?}");

    let token_reviews: Api<TokenReview> = Api::all(admin);
    let review = |token: &str| TokenReview {
        spec: TokenReviewSpec { token: token.into(), ..Default::default() },
        ..Default::default()
    };
    let bob = token_reviews.create(&PostParams::default(), &review("bob-token")).await?.status.unwrap_or_default();
    ensure!(bob.authenticated == Some(true), "{bob:?}");
    ensure!(bob.user.and_then(|u| u.username).as_deref() == Some("bob"));
    let nobody = token_reviews.create(&PostParams::default(), &review("wrong")).await?.status.unwrap_or_default();
    ensure!(nobody.authenticated == Some(false) && nobody.user.is_none(), "{nobody:?}");
    let empty = token_reviews.create(&PostParams::default(), &review("")).await;
    ensure!(matches!(&empty, Err(kube::Error::Api(e)) if e.code == 400), "{empty:?}");

    // The reviews sit behind authentication like everything else.
    let anonymous = reviews_without_token(&server).await;
    ensure!(matches!(&anonymous, Err(kube::Error::Api(e)) if e.code == 401), "{anonymous:?}");
    Ok(())
}

async fn reviews_without_token(server: &ApiServer) -> kube::Result<SelfSubjectReview> {
    let reviews: Api<SelfSubjectReview> = Api::all(server.client().map_err(|e| kube::Error::Service(e.into()))?);
    reviews.create(&PostParams::default(), &SelfSubjectReview::default()).await
}

#[test]
fn official_kubectl_certificate_signing_requests() -> Result<()> {
    if !kubectl_available() {
        eprintln!("skipping: no kubectl");
        return Ok(());
    }
    use base64::Engine;
    let server = ApiServer::start()?;
    let (request, _key) = common::pki::new_csr("jane", &["devs"])?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(request);
    let manifest = |name: &str, request: &str, usages: &str| {
        format!(
            "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: {name}\nspec:\n  \
             request: {request}\n  signerName: kubernetes.io/kube-apiserver-client\n  expirationSeconds: 86400\n  usages: {usages}\n"
        )
    };
    let file = server.data_dir.join("csr.yaml");
    std::fs::write(&file, manifest("jane", &b64, "[client auth]"))?;
    let out = server.kubectl(&["create", "-f", &file.display().to_string()])?;
    ensure!(out.ok, "{out:?}");
    let out = server.kubectl(&["get", "csr"])?;
    let lines: Vec<&str> = out.stdout.lines().collect();
    ensure!(
        lines.first().is_some_and(|h| h.split_whitespace().collect::<Vec<_>>()
            == ["NAME", "AGE", "SIGNERNAME", "REQUESTOR", "REQUESTEDDURATION", "CONDITION"]),
        "{out:?}"
    );
    // The requester is who sent it (the plain-HTTP port's requests are anonymous).
    ensure!(
        lines.get(1).is_some_and(|r| r.contains("system:anonymous") && r.contains("24h") && r.ends_with("Pending")),
        "{out:?}"
    );
    let out = server.kubectl(&["certificate", "approve", "jane"])?;
    ensure!(out.ok && out.stdout.contains("approved"), "{out:?}");
    let out = server.kubectl(&["get", "csr", "jane", "-o", "jsonpath={.status.conditions[0].type}"])?;
    ensure!(out.stdout == "Approved", "{out:?}");
    let out = server.kubectl(&["describe", "csr", "jane"])?;
    ensure!(
        out.ok && out.stdout.contains("Common Name:    jane") && out.stdout.contains("Organization:   devs"),
        "{out:?}"
    );
    // A request that is not one, and an unknown usage: Kubernetes' 422 causes.
    std::fs::write(&file, manifest("bad", &base64::engine::general_purpose::STANDARD.encode("junk"), "[flying]"))?;
    let out = server.kubectl(&["create", "-f", &file.display().to_string()])?;
    ensure!(!out.ok && out.stderr.contains("PEM block type must be CERTIFICATE REQUEST"), "{out:?}");
    ensure!(out.stderr.contains("spec.usages[0]: Unsupported value: \"flying\""), "{out:?}");
    Ok(())
}
