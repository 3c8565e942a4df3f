//! The secure port with the PKI of `minik8s-supervisor certs init`: the official kubectl
//! (1.33 and 1.27), our kubectl, the kube crate and the Python client with the admin's
//! certificate kubeconfig; certificates of another CA and expired ones refused; a token
//! user over HTTPS; health open and everything else 401 without credentials; plain HTTP on
//! the TLS port answered as Go does; thousands of broken handshakes survived; and a
//! scheduler, controller-manager and kubelet, each with its own identity, running a pod.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use e2e::kubectl::our_kubectl;
use e2e::{kubectl_bin, official_kubectls, raw, ApiServer};

fn run(bin: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin).args(args).env("KUBECONFIG", "/dev/null").output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn kc_arg(path: &Path) -> String {
    format!("--kubeconfig={}", path.display())
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The CA of a server's PKI, to issue certificates of one's own.
fn ca_of(api: &ApiServer) -> common::pki::Ca {
    let pki = &api.tls.as_ref().unwrap().pki;
    common::pki::Ca { cert_pem: read(pki.join("ca.crt")), key_pem: read(pki.join("ca.key")) }
}

/// A kubeconfig for `user` issued by `ca` as of `issued_at`, trusting the server's CA.
fn kubeconfig_from(api: &ApiServer, ca: &common::pki::Ca, user: &str, issued_at: time::OffsetDateTime) -> String {
    let leaf = common::pki::Leaf::client("x", user, &["system:masters"]);
    let (cert, key) = ca.issue(&leaf, issued_at).unwrap();
    common::pki::kubeconfig(&api.https_url(), &ca_of(api).cert_pem, user, &cert, &key)
}

#[test]
fn kubectls_and_clients_work_with_the_admin_certificate() {
    let api = ApiServer::start_tls(&[], &[]).unwrap();
    let admin = api.identity("admin.conf");
    let admin_arg = kc_arg(&admin);
    let mut kubectls = vec![("1.33".to_string(), kubectl_bin())];
    kubectls.extend(official_kubectls(&["1.27"]));
    kubectls.push(("ours".to_string(), our_kubectl()));
    for (version, bin) in &kubectls {
        let name = format!("cm-{}", version.replace('.', "-"));
        let (ok, out) = run(bin, &[&admin_arg, "create", "configmap", &name, "--from-literal=k=v"]);
        assert!(ok && out.contains(&format!("configmap/{name} created")), "kubectl {version} create:\n{out}");
        let (ok, out) = run(bin, &[&admin_arg, "get", "configmap", &name, "-o", "jsonpath={.data.k}"]);
        assert!(ok && out == "v", "kubectl {version} get:\n{out}");
        let (ok, out) = run(bin, &[&admin_arg, "delete", "configmap", &name]);
        assert!(ok && out.contains("deleted"), "kubectl {version} delete:\n{out}");
    }
    // The certificate's subject is the user: CN the name, O the groups.
    let (ok, out) = run(&kubectl_bin(), &[&admin_arg, "auth", "whoami", "-o", "json"]);
    assert!(ok, "whoami:\n{out}");
    let review: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(review["status"]["userInfo"]["username"], "kubernetes-admin");
    assert_eq!(review["status"]["userInfo"]["groups"], serde_json::json!(["system:masters", "system:authenticated"]));

    // The kube crate, from the same kubeconfig.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::{Api, DeleteParams, PostParams};
        let kc = kube::config::Kubeconfig::read_from(&admin).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let cms: Api<ConfigMap> = Api::namespaced(client, "default");
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "from-kube"}, "data": {"a": "b"}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
        assert_eq!(cms.get("from-kube").await.unwrap().data.unwrap()["a"], "b");
        cms.delete("from-kube", &DeleteParams::default()).await.unwrap();
    });

    // The Python client, as its users load a kubeconfig.
    if let Some(python) = e2e::python_clients() {
        let script = "import sys\nfrom kubernetes import client, config\n\
                      config.load_kube_config(config_file=sys.argv[1])\n\
                      v1 = client.CoreV1Api()\n\
                      v1.create_namespaced_config_map('default', {'metadata': {'name': 'from-python'}, 'data': {'x': 'y'}})\n\
                      print(v1.read_namespaced_config_map('from-python', 'default').data['x'])\n\
                      v1.delete_namespaced_config_map('from-python', 'default')\n";
        let out = Command::new(python).args(["-c", script]).arg(&admin).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.trim() == "y", "python client:\n{text}");
    }
}

#[test]
fn bad_certificates_no_credentials_and_plain_http_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let tokens = tmp.path().join("tokens.csv");
    std::fs::write(&tokens, "t0ken-of-jane,jane,uid-jane,\"devs\"\n").unwrap();
    let api = ApiServer::start_tls(&[], &["--token-auth-file", tokens.to_str().unwrap()]).unwrap();
    let kubectl = kubectl_bin();
    let now = time::OffsetDateTime::now_utc();

    // A client certificate of another CA (same CA name, other key): the handshake fails.
    let foreign_ca = common::pki::Ca::generate(now).unwrap();
    let foreign = tmp.path().join("foreign.conf");
    std::fs::write(&foreign, kubeconfig_from(&api, &foreign_ca, "intruder", now)).unwrap();
    let (ok, out) = run(&kubectl, &[&kc_arg(&foreign), "get", "namespaces"]);
    assert!(!ok && out.contains("tls:"), "a certificate of another CA:\n{out}");
    // One of the right CA that expired: refused as well.
    let expired = tmp.path().join("expired.conf");
    std::fs::write(&expired, kubeconfig_from(&api, &ca_of(&api), "late", now - time::Duration::days(400))).unwrap();
    let (ok, out) = run(&kubectl, &[&kc_arg(&expired), "get", "namespaces"]);
    assert!(!ok && out.contains("tls:"), "an expired certificate:\n{out}");
    // Our kubectl says so too, and a kubeconfig whose certificate file is missing is an error.
    let (ok, out) = run(&our_kubectl(), &[&kc_arg(&foreign), "get", "namespaces"]);
    assert!(!ok && !out.contains("NAME"), "our kubectl, another CA:\n{out}");

    // A token user over HTTPS, trusting the CA by file (`certificate-authority`).
    let token_kc = tmp.path().join("token.conf");
    std::fs::write(
        &token_kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{}\", certificate-authority: \"{}\"}}}}]\n\
             users: [{{name: jane, user: {{token: t0ken-of-jane}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: jane}}}}]\ncurrent-context: c\n",
            api.https_url(),
            api.tls.as_ref().unwrap().pki.join("ca.crt").display()
        ),
    )
    .unwrap();
    let (ok, out) =
        run(&kubectl, &[&kc_arg(&token_kc), "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]);
    assert!(ok && out == "jane", "the token user over HTTPS:\n{out}");
    let (ok, out) = run(&our_kubectl(), &[&kc_arg(&token_kc), "get", "namespaces", "-o", "name"]);
    assert!(ok && out.contains("namespace/default"), "our kubectl with a token over HTTPS:\n{out}");
    let missing = tmp.path().join("missing.conf");
    std::fs::write(&missing, read(token_kc.clone()).replace("ca.crt", "no-such-ca.crt")).unwrap();
    let (ok, out) = run(&our_kubectl(), &[&kc_arg(&missing), "get", "namespaces"]);
    assert!(!ok && out.contains("no-such-ca.crt"), "our kubectl with a missing CA file:\n{out}");

    // Without a client certificate: health is open, the API is Kubernetes' 401.
    let ca = api.tls.as_ref().unwrap().pki.join("ca.crt");
    let curl = |path: &str| {
        let out = Command::new("curl")
            .args(["-sS", "--cacert", ca.to_str().unwrap(), "-w", "\n%{http_code}"])
            .arg(format!("{}{path}", api.https_url()))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(curl("/healthz"), "ok\n200");
    let out = curl("/api");
    let (body, code) = out.rsplit_once('\n').unwrap();
    assert_eq!(code, "401", "{out}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(body).unwrap(),
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
    );

    // Plain HTTP on the TLS port: Go's answer.
    let resp = raw(api.tls.as_ref().unwrap().secure_port, "GET", "/api", None, b"").unwrap();
    assert_eq!((resp.status, resp.text()), (400, "Client sent an HTTP request to an HTTPS server.\n".to_string()));
    // kubectl shows that 400 as it does with a real kube-apiserver.
    let http_url = format!("http://127.0.0.1:{}", api.tls.as_ref().unwrap().secure_port);
    let (ok, out) = run(&kubectl, &["--server", &http_url, "get", "ns"]);
    assert!(!ok && out.contains("Error from server (BadRequest)"), "kubectl over http://:\n{out}");
}

/// A rustls client trusting the server's CA, with a client certificate if given.
fn client_config(ca_pem: &str, identity: Option<(String, String)>) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes()).map(Result::unwrap).collect(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    })
}

/// A TLS connection to the secure port that sends `GET /api`: the status line, if any.
fn tls_get(port: u16, config: Arc<rustls::ClientConfig>) -> Option<String> {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(config, name).ok()?;
    let mut sock = TcpStream::connect(("127.0.0.1", port)).ok()?;
    sock.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    tls.write_all(b"GET /api HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = Vec::new();
    let _ = tls.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    text.lines().next().filter(|l| l.starts_with("HTTP/")).map(str::to_string)
}

/// The bytes of a real ClientHello.
fn client_hello(config: Arc<rustls::ClientConfig>) -> Vec<u8> {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(config, name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

#[test]
fn garbage_truncated_hellos_and_bad_certificates_leave_the_server_serving() {
    let api = ApiServer::start_tls(&[], &[]).unwrap();
    let port = api.tls.as_ref().unwrap().secure_port;
    let ca_pem = read(api.tls.as_ref().unwrap().pki.join("ca.crt"));
    let hello = client_hello(client_config(&ca_pem, None));
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // Garbage, and ClientHellos cut anywhere (the server waits for the rest, then gives up
    // when the client goes away) or with a flipped byte.
    for i in 0..3000 {
        let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let bytes: Vec<u8> = match i % 3 {
            0 => (0..(next() % 600) as usize).map(|_| next() as u8).collect(),
            1 => hello[..(next() as usize % hello.len())].to_vec(),
            _ => {
                let mut h = hello.clone();
                let at = next() as usize % h.len();
                h[at] ^= 1 << (next() % 8);
                h
            }
        };
        let _ = sock.write_all(&bytes);
        if i % 3 == 2 {
            // A corrupted hello is answered (an alert, or a handshake that then fails): read what comes.
            sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf);
        }
    }
    // Full handshakes with certificates of another CA and expired ones: never an answer.
    let now = time::OffsetDateTime::now_utc();
    let leaf = common::pki::Leaf::client("x", "mallory", &["system:masters"]);
    let foreign = common::pki::Ca::generate(now).unwrap().issue(&leaf, now).unwrap();
    let expired = ca_of(&api).issue(&leaf, now - time::Duration::days(400)).unwrap();
    let (foreign, expired) = (client_config(&ca_pem, Some(foreign)), client_config(&ca_pem, Some(expired)));
    for _ in 0..200 {
        assert_eq!(tls_get(port, foreign.clone()), None, "a certificate of another CA got an answer");
        assert_eq!(tls_get(port, expired.clone()), None, "an expired certificate got an answer");
    }
    // Still serving: with no certificate (401) and with the admin's.
    assert_eq!(tls_get(port, client_config(&ca_pem, None)).as_deref(), Some("HTTP/1.1 401 Unauthorized"));
    let (ok, out) = run(&kubectl_bin(), &[&kc_arg(&api.identity("admin.conf")), "get", "ns", "-o", "name"]);
    assert!(ok && out.contains("namespace/default"), "after the abuse:\n{out}");
    assert!(!api.log().contains("panicked"), "the apiserver panicked:\n{}", api.log());
}

#[test]
fn components_with_their_own_identities_run_a_pod() {
    if !e2e::kubelet::require_docker() {
        return;
    }
    let node = e2e::kubelet::Kubelet::node_name("tls");
    // As `scripts/cluster up` runs them: RBAC and the Node authorizer, ServiceAccount tokens
    // signed with the PKI's key, each controller as its own account.
    let api = ApiServer::start_tls(&[&node], &["--authorization-mode=Node,RBAC"]).unwrap();
    let _sched = e2e::scheduler::Scheduler::start(&api, &[]).unwrap();
    let cm = e2e::controller_manager::ControllerManager::start(&api, &["--use-service-account-credentials"]).unwrap();
    let kubelet = e2e::kubelet::Kubelet::start_named(
        &api.https_url(),
        &node,
        &["--kubeconfig".to_string(), api.identity(&format!("kubelet-{node}.conf")).display().to_string()],
    )
    .unwrap();
    let admin = kc_arg(&api.identity("admin.conf"));
    let kubectl = kubectl_bin();
    let (ok, out) =
        run(&kubectl, &[&admin, "create", "deployment", "web", "--image=busybox:latest", "--", "sleep", "3600"]);
    assert!(ok, "create deployment:\n{out}");
    let (ok, out) = run(
        &kubectl,
        &[
            &admin,
            "patch",
            "deployment",
            "web",
            "-p",
            r#"{"spec":{"template":{"spec":{"terminationGracePeriodSeconds":1,"containers":[{"name":"busybox","imagePullPolicy":"IfNotPresent"}]}}}}"#,
        ],
    );
    assert!(ok, "patch:\n{out}");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (_, out) = run(
            &kubectl,
            &[
                &admin,
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.status.phase} {.spec.nodeName}{end}",
            ],
        );
        if out == format!("Running {node}") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no Running pod on {node}: {out:?}\nkubelet:\n{}\ncontroller-manager:\n{}",
            kubelet.log(),
            cm.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The kubelet registered its Node with its own identity (unauthenticated requests get 401).
    let (ok, out) = run(&kubectl, &[&admin, "get", "node", &node, "-o", "name"]);
    assert!(ok && out.trim() == format!("node/{node}"), "{out}");
    let (_, out) = run(&kubectl, &[&admin, "delete", "deployment", "web", "--wait=false"]);
    assert!(out.contains("deleted"), "{out}");
    // The garbage collector removes its ReplicaSets and pods as generic-garbage-collector.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, out) = run(&kubectl, &[&admin, "get", "replicasets,pods", "-l", "app=web", "-o", "name"]);
        if out.trim().is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "left after the deployment went: {out}\n{}", cm.log());
        std::thread::sleep(Duration::from_millis(500));
    }
    // Every controller had the rights it needed (its role as its own account).
    let log = cm.log();
    let denied: Vec<String> =
        log.lines().filter(|l| l.contains("is forbidden")).map(|l| l.chars().take(300).collect()).collect();
    assert!(denied.is_empty(), "the controller-manager was refused:\n{}", denied.join("\n"));
}
