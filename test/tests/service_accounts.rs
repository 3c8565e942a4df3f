//! ServiceAccount tokens end to end, with a signing key made the way a user makes one
//! (`openssl genpkey`, ECDSA P-256): the official kubectl's `create token` gets a JWT for the
//! account (too short a duration is refused with Kubernetes' message); the OIDC discovery
//! document and JWKS name the key that signed it; on Docker (apiserver, scheduler,
//! controller-manager, a kubelet) a pod reads its own token, the cluster CA bundle and its
//! namespace at `/var/run/secrets/kubernetes.io/serviceaccount` and its environment names the
//! apiserver; `automountServiceAccountToken: false` leaves the volume out; a pod naming a
//! missing service account is refused with a 403.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use base64::Engine;
use e2e::kubelet::{require_docker, Cluster, Kubelet};
use e2e::{official_kubectl, raw, ApiServer};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};

/// A JWT's payload.
fn claims(jwt: &str) -> Result<Value> {
    let payload = jwt.split('.').nth(1).context("not a JWT")?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload)?;
    Ok(serde_json::from_slice(&bytes)?)
}

fn header(jwt: &str) -> Result<Value> {
    let h = jwt.split('.').next().context("not a JWT")?;
    Ok(serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(h)?)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_for_kubectl_and_for_pods() -> Result<()> {
    if !require_docker() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("sa.key");
    let st = Command::new("openssl")
        .args(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"])
        .arg(&key)
        .status()
        .context("running openssl (Debian package openssl)")?;
    ensure!(st.success(), "openssl genpkey failed");
    let key = key.to_string_lossy().to_string();
    let api = ApiServer::start_with(&["--service-account-signing-key-file", &key])?;
    let sched = e2e::scheduler::Scheduler::start(&api, &[])?;
    let cm = e2e::controller_manager::ControllerManager::start(&api, &[])?;
    let nodes = vec![Kubelet::start(&api.url(), "satok")?];
    let c = Cluster { nodes, cm, sched, api };
    let kubectl = |args: &[&str]| c.api.kubectl_bin(&official_kubectl("1.33"), args);

    // kubectl create token.
    let out = kubectl(&["create", "serviceaccount", "builder"])?;
    ensure!(out.ok, "create serviceaccount: {out:?}");
    let out = kubectl(&["create", "token", "builder", "--duration=15m"])?;
    ensure!(out.ok, "create token: {out:?}");
    let jwt = out.stdout.trim().to_string();
    let cl = claims(&jwt)?;
    ensure!(cl["sub"] == "system:serviceaccount:default:builder", "{cl}");
    ensure!(cl["exp"].as_i64().unwrap_or(0) - cl["iat"].as_i64().unwrap_or(0) == 900, "{cl}");
    ensure!(cl["kubernetes.io"]["serviceaccount"]["name"] == "builder", "{cl}");
    let out = kubectl(&["create", "token", "builder", "--duration=5m"])?;
    ensure!(
        !out.ok && out.stderr.contains("may not specify a duration less than 10 minutes"),
        "a 5-minute token: {out:?}"
    );
    let out = kubectl(&["create", "token", "nobody"])?;
    ensure!(!out.ok && out.stderr.contains("serviceaccounts \"nobody\" not found"), "{out:?}");

    // OIDC discovery names the key that signed it.
    let disc = raw(c.api.port, "GET", "/.well-known/openid-configuration", None, b"")?.json();
    ensure!(disc["issuer"] == cl["iss"], "{disc} vs {cl}");
    ensure!(disc["jwks_uri"].as_str().is_some_and(|u| u.ends_with("/openid/v1/jwks")), "{disc}");
    let jwks = raw(c.api.port, "GET", "/openid/v1/jwks", None, b"")?.json();
    let kid = header(&jwt)?["kid"].clone();
    ensure!(
        jwks["keys"].as_array().is_some_and(|ks| ks.iter().any(|k| k["kid"] == kid && k["alg"] == "ES256")),
        "{jwks}"
    );

    // A pod reads its token, CA bundle and namespace.
    let client = c.api.client()?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let script = format!(
        "echo TOKEN=$(cat {dir}/token); echo NS=$(cat {dir}/namespace); test -f {dir}/ca.crt && echo CA-OK; \
         echo API=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; sleep 600"
    );
    let pod = |name: &str, extra: Value| -> Result<Pod> {
        let mut spec = json!({"serviceAccountName": "builder", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "Never", "command": ["sh", "-c", script]}]});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        Ok(serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?)
    };
    let created = pods.create(&PostParams::default(), &pod("reader", json!({}))?).await?;
    let volume = created.spec.as_ref().and_then(|s| s.volumes.as_ref()).and_then(|v| v.first()).cloned();
    ensure!(
        volume.as_ref().and_then(|v| v.name.strip_prefix("kube-api-access-")).is_some_and(|s| s.len() == 5),
        "the admission adds the token volume: {volume:?}"
    );
    let node = c.nodes[0].node.clone();
    let deadline = Instant::now() + Duration::from_secs(120);
    let logs = loop {
        let (_, body) = c.nodes[0].get("/containerLogs/default/reader/c")?;
        if body.contains("API=") {
            break body;
        }
        ensure!(Instant::now() < deadline, "no output from reader on {node}: {body:?}\n{}", c.log_tail());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let token = logs.lines().find_map(|l| l.strip_prefix("TOKEN=")).unwrap_or_default();
    let pc = claims(token).with_context(|| format!("the pod's token: {logs}"))?;
    let uid = pods.get("reader").await?.metadata.uid.unwrap_or_default();
    ensure!(pc["sub"] == "system:serviceaccount:default:builder", "{pc}");
    ensure!(pc["kubernetes.io"]["pod"] == json!({"name": "reader", "uid": uid}), "bound to the pod: {pc}");
    ensure!(logs.contains("NS=default") && logs.contains("CA-OK"), "{logs}");
    let master =
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "default").get("kubernetes").await?;
    let ip = master.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
    ensure!(logs.contains(&format!("API={ip}:443")), "{logs}");

    // Opting out, and a missing account.
    let quiet =
        pods.create(&PostParams::default(), &pod("quiet", json!({"automountServiceAccountToken": false}))?).await?;
    ensure!(quiet.spec.as_ref().and_then(|s| s.volumes.as_ref()).is_none_or(|v| v.is_empty()), "{quiet:?}");
    let err =
        pods.create(&PostParams::default(), &pod("lost", json!({"serviceAccountName": "ghost"}))?).await.unwrap_err();
    let msg = err.to_string();
    ensure!(
        msg.contains("pods \"lost\" is forbidden: error looking up service account default/ghost: serviceaccount \"ghost\" not found"),
        "{msg}"
    );
    Ok(())
}
