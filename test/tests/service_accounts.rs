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

/// A signing key made as a user makes one: `openssl genpkey`, ECDSA P-256.
fn signing_key(dir: &std::path::Path) -> Result<String> {
    let key = dir.join("sa.key");
    let st = Command::new("openssl")
        .args(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"])
        .arg(&key)
        .status()
        .context("running openssl (Debian package openssl)")?;
    ensure!(st.success(), "openssl genpkey failed");
    Ok(key.to_string_lossy().to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_for_kubectl_and_for_pods() -> Result<()> {
    if !require_docker() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let key = signing_key(dir.path())?;
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

/// The official kubectl 1.33 with a kubeconfig.
fn kubectl_as(kubeconfig: &std::path::Path, args: &[&str]) -> Result<e2e::KubectlOutput> {
    let out = Command::new(official_kubectl("1.33"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .context("running kubectl")?;
    Ok(out.into())
}

/// A kubeconfig that presents `token` to the secure port, trusting the cluster CA.
fn token_kubeconfig(api: &ApiServer, token: &str) -> String {
    let ca = std::fs::read(api.identity("ca.crt")).unwrap_or_default();
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\n\
         users:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
        api.https_url()
    )
}

/// ServiceAccount tokens as credentials on the secure port with RBAC: a token of an account
/// bound to a reading Role in its namespace reads there (official kubectl and the kube crate), is
/// refused elsewhere and for writes with Kubernetes' 403, and `auth whoami` / TokenReview
/// name the account; a token stops working when its account or its pod is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn service_account_tokens_authenticate_and_rbac_limits_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // start_tls signs with the PKI's ServiceAccount key, as `scripts/cluster up` does.
    let api = ApiServer::start_tls(&[], &["--authorization-mode", "Node,RBAC"])?;
    let admin = api.identity("admin.conf");
    let as_admin = |args: &[&str]| -> Result<e2e::KubectlOutput> {
        let out = kubectl_as(&admin, args)?;
        ensure!(out.ok, "kubectl {args:?}: {out:?}");
        Ok(out)
    };
    as_admin(&["create", "namespace", "team"])?;
    as_admin(&["create", "serviceaccount", "reader", "-n", "team"])?;
    as_admin(&["create", "role", "reader", "-n", "team", "--verb=get,list,watch", "--resource=configmaps,pods"])?;
    as_admin(&["create", "rolebinding", "reader", "-n", "team", "--role=reader", "--serviceaccount=team:reader"])?;
    as_admin(&["create", "configmap", "settings", "-n", "team", "--from-literal=a=1"])?;
    let token = as_admin(&["create", "token", "reader", "-n", "team"])?.stdout.trim().to_string();
    let kc = dir.path().join("reader.kubeconfig");
    std::fs::write(&kc, token_kubeconfig(&api, &token))?;

    let who = kubectl_as(&kc, &["auth", "whoami", "-o", "json"])?;
    ensure!(who.ok, "{who:?}");
    let who: Value = serde_json::from_str(&who.stdout)?;
    let info = &who["status"]["userInfo"];
    ensure!(info["username"] == "system:serviceaccount:team:reader", "{who}");
    ensure!(
        info["groups"] == json!(["system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"]),
        "{who}"
    );
    let out = kubectl_as(&kc, &["get", "configmaps", "-n", "team", "-o", "name"])?;
    ensure!(out.ok && out.stdout.contains("configmap/settings"), "view in its namespace: {out:?}");
    let out = kubectl_as(&kc, &["get", "pods", "-n", "default"])?;
    ensure!(
        !out.ok
            && out.stderr.contains(
                "User \"system:serviceaccount:team:reader\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
            ),
        "elsewhere: {out:?}"
    );
    let out = kubectl_as(&kc, &["create", "configmap", "more", "-n", "team"])?;
    ensure!(!out.ok && out.stderr.contains("cannot create resource \"configmaps\""), "a write: {out:?}");
    let out = kubectl_as(&kc, &["auth", "can-i", "list", "pods", "-n", "team"])?;
    ensure!(out.stdout.trim() == "yes", "{out:?}");

    // The kube crate, from the same kubeconfig.
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kc)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::Client::try_from(config)?;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), "team");
    ensure!(cms.get("settings").await.is_ok(), "the kube crate reads in the namespace");
    let err = Api::<Pod>::namespaced(client, "default").list(&Default::default()).await.unwrap_err();
    ensure!(matches!(&err, kube::Error::Api(s) if s.code == 403), "{err:?}");

    // TokenReview as the admin: the account's user.
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}});
    let rf = dir.path().join("review.json");
    std::fs::write(&rf, review.to_string())?;
    let out = as_admin(&["create", "-f", rf.to_str().unwrap_or_default(), "-o", "json"])?;
    let r: Value = serde_json::from_str(&out.stdout)?;
    ensure!(r["status"]["authenticated"] == true, "{r}");
    ensure!(r["status"]["user"]["username"] == "system:serviceaccount:team:reader", "{r}");

    // A token bound to a pod dies with the pod; every token dies with its account.
    let overrides = r#"--overrides={"spec":{"serviceAccountName":"reader"}}"#;
    as_admin(&["run", "holder", "-n", "team", "--image=busybox", "--restart=Never", overrides])?;
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "holder"}}});
    let tf = dir.path().join("request.json");
    std::fs::write(&tf, request.to_string())?;
    let out = as_admin(&[
        "create",
        "--raw",
        "/api/v1/namespaces/team/serviceaccounts/reader/token",
        "-f",
        tf.to_str().unwrap_or_default(),
    ])?;
    let bound = serde_json::from_str::<Value>(&out.stdout)?["status"]["token"].as_str().unwrap_or_default().to_string();
    let bkc = dir.path().join("bound.kubeconfig");
    std::fs::write(&bkc, token_kubeconfig(&api, &bound))?;
    ensure!(kubectl_as(&bkc, &["get", "configmaps", "-n", "team"])?.ok, "the pod-bound token works");
    // Not scheduled anywhere: the pod goes at once.
    as_admin(&["delete", "pod", "holder", "-n", "team", "--wait=true"])?;
    let out = kubectl_as(&bkc, &["get", "configmaps", "-n", "team"])?;
    ensure!(!out.ok && out.stderr.contains("Unauthorized"), "its pod is gone: {out:?}");
    as_admin(&["delete", "serviceaccount", "reader", "-n", "team"])?;
    let out = kubectl_as(&kc, &["get", "configmaps", "-n", "team"])?;
    ensure!(!out.ok && out.stderr.contains("Unauthorized"), "its account is gone: {out:?}");
    Ok(())
}

/// One keep-alive HTTP/1.1 connection that sends GETs with a bearer token and returns each
/// answer's status code.
struct KeepAlive {
    stream: std::io::BufReader<std::net::TcpStream>,
    port: u16,
}

impl KeepAlive {
    fn connect(port: u16) -> Result<KeepAlive> {
        let s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(KeepAlive { stream: std::io::BufReader::new(s), port })
    }

    fn get(&mut self, path: &str, token: &[u8]) -> Result<u16> {
        use std::io::{BufRead, Read, Write};
        let mut req =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer ", self.port).into_bytes();
        req.extend_from_slice(token);
        req.extend_from_slice(b"\r\n\r\n");
        self.stream.get_mut().write_all(&req)?;
        let (mut status, mut length) = (0u16, 0usize);
        loop {
            let mut line = String::new();
            ensure!(self.stream.read_line(&mut line)? > 0, "the server closed the connection");
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(rest) = line.strip_prefix("HTTP/1.1 ") {
                status = rest.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
            } else if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse()?;
                }
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body)?;
        Ok(status)
    }
}

/// Bad input: 10,000 requests with tokens that are random, truncated, expired, signed by
/// another key, tampered with, of a deleted account, or not text at all are every one 401
/// (never 5xx), and the server keeps serving the good token afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_bad_tokens_are_all_refused() -> Result<()> {
    use apiserver::serviceaccount::{keys, token};
    // start_tls signs with the PKI's ServiceAccount key, as `scripts/cluster up` does.
    let api = ApiServer::start_tls(&[], &[])?;
    let key_file = api.identity("sa.key").display().to_string();
    let admin = api.identity("admin.conf");
    for args in [&["create", "serviceaccount", "good"][..], &["create", "serviceaccount", "gone"]] {
        ensure!(kubectl_as(&admin, args)?.ok, "kubectl {args:?}");
    }
    let good = kubectl_as(&admin, &["create", "token", "good"])?.stdout.trim().to_string();
    let gone = kubectl_as(&admin, &["create", "token", "gone"])?.stdout.trim().to_string();
    ensure!(kubectl_as(&admin, &["delete", "serviceaccount", "gone"])?.ok, "delete gone");
    let claims_of_good: token::Claims = serde_json::from_value(claims(&good)?)?;
    let ours = keys::Keys::load(std::path::Path::new(&key_file), &[] as &[&str]).map_err(|e| anyhow::anyhow!("{e}"))?;
    let other = keys::Keys::from_pem(&keys::generate_signing_key().map_err(anyhow::Error::msg)?, &[])
        .map_err(anyhow::Error::msg)?;
    let expired = ours
        .sign(&token::Claims {
            exp: claims_of_good.iat - 7200,
            nbf: claims_of_good.iat - 10800,
            ..claims_of_good.clone()
        })
        .map_err(anyhow::Error::msg)?;
    let foreign = other.sign(&claims_of_good).map_err(anyhow::Error::msg)?;
    let mut conn = KeepAlive::connect(api.port)?;
    ensure!(conn.get("/api/v1/namespaces/default/pods", good.as_bytes())? == 200, "the good token works");

    let mut seed: u64 = 0x9e3779b97f4a7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for i in 0..10_000usize {
        let r = next() as usize;
        let bad: Vec<u8> = match i % 7 {
            0 => (0..(r % 200 + 1))
                .map(|_| b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."[next() as usize % 65])
                .collect(),
            1 => good.as_bytes()[..r % good.len()].to_vec(),
            2 => expired.clone().into_bytes(),
            3 => foreign.clone().into_bytes(),
            4 => {
                let mut t = good.clone().into_bytes();
                let at = t.len() - 1 - r % 40;
                t[at] = if t[at] == b'A' { b'B' } else { b'A' };
                t
            }
            5 => gone.clone().into_bytes(),
            _ => (0..(r % 64 + 1)).map(|_| (next() % 94 + 33) as u8).chain([0xff, 0xfe]).collect(),
        };
        // A tampered byte may land where base64 ignores it: only a changed token counts.
        if bad == good.as_bytes() {
            continue;
        }
        let status = match conn.get("/api/v1/namespaces/default/pods", &bad) {
            Ok(s) => s,
            // A header that is not HTTP may close the connection (400): reconnect.
            Err(_) => {
                conn = KeepAlive::connect(api.port)?;
                400
            }
        };
        *statuses.entry(status).or_default() += 1;
    }
    println!("10,000 bad tokens: answers by status {statuses:?}");
    let not_401: Vec<_> = statuses.iter().filter(|(s, _)| **s != 401 && **s != 400).collect();
    ensure!(not_401.is_empty(), "bad tokens answered with {statuses:?}");
    ensure!(statuses.get(&401).copied().unwrap_or(0) >= 8_500, "most bad tokens got 401: {statuses:?}");
    let mut conn = KeepAlive::connect(api.port)?;
    ensure!(conn.get("/api/v1/namespaces/default/pods", good.as_bytes())? == 200, "still serving the good token");
    ensure!(!api.log().contains("panicked"), "the apiserver panicked");
    Ok(())
}

/// Bootstrap tokens (`--enable-bootstrap-token-auth`), made as kubeadm makes them: a
/// `bootstrap.kubernetes.io/token` Secret in kube-system. The official kubectl with the token
/// is `system:bootstrap:<id>` in `system:bootstrappers` and the extra group; an expired token,
/// a wrong secret and a token not for authentication are 401.
#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_tokens_authenticate_until_they_expire() -> Result<()> {
    let api = ApiServer::start_tls(&[], &["--enable-bootstrap-token-auth"])?;
    let admin = api.identity("admin.conf");
    let dir = tempfile::tempdir()?;
    let make = |id: &str, expiration: &str, usage: &str| -> Result<()> {
        let out = kubectl_as(
            &admin,
            &[
                "create",
                "secret",
                "generic",
                &format!("bootstrap-token-{id}"),
                "-n",
                "kube-system",
                "--type=bootstrap.kubernetes.io/token",
                &format!("--from-literal=token-id={id}"),
                "--from-literal=token-secret=0123456789abcdef",
                &format!("--from-literal=expiration={expiration}"),
                &format!("--from-literal=usage-bootstrap-authentication={usage}"),
                "--from-literal=auth-extra-groups=system:bootstrappers:kubeadm:default-node-token",
            ],
        )?;
        ensure!(out.ok, "create bootstrap token {id}: {out:?}");
        Ok(())
    };
    make("abcdef", "2999-01-01T00:00:00Z", "true")?;
    make("oldtok", "2000-01-01T00:00:00Z", "true")?;
    make("signin", "2999-01-01T00:00:00Z", "false")?;
    let whoami = |token: &str| -> Result<e2e::KubectlOutput> {
        let kc = dir.path().join("bootstrap.kubeconfig");
        std::fs::write(&kc, token_kubeconfig(&api, token))?;
        kubectl_as(&kc, &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username} {.status.userInfo.groups}"])
    };
    let out = whoami("abcdef.0123456789abcdef")?;
    ensure!(out.ok, "{out:?}");
    ensure!(out.stdout.starts_with("system:bootstrap:abcdef "), "{out:?}");
    ensure!(
        out.stdout.contains("system:bootstrappers")
            && out.stdout.contains("system:bootstrappers:kubeadm:default-node-token"),
        "{out:?}"
    );
    for (token, why) in [
        ("oldtok.0123456789abcdef", "expired"),
        ("abcdef.0123456789abcdeX", "wrong secret"),
        ("signin.0123456789abcdef", "not for authentication"),
        ("nosuch.0123456789abcdef", "no secret"),
    ] {
        let out = whoami(token)?;
        ensure!(!out.ok && out.stderr.contains("Unauthorized"), "{why}: {out:?}");
    }
    Ok(())
}
