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
    // The kubelet as `scripts/cluster up` runs it: only callers with a certificate of the
    // cluster's CA or a token the apiserver vouches for, each only as RBAC allows.
    let kubelet = e2e::kubelet::Kubelet::start_named(
        &api.https_url(),
        &node,
        &[
            "--kubeconfig".to_string(),
            api.identity(&format!("kubelet-{node}.conf")).display().to_string(),
            "--client-ca-file".to_string(),
            api.identity("ca.crt").display().to_string(),
            "--anonymous-auth=false".to_string(),
            "--authentication-token-webhook".to_string(),
            "--authorization-mode=Webhook".to_string(),
        ],
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
    kubelet_checks_who_calls_it(&api, &kubelet, &kubectl, &admin);
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

/// The kubelet's HTTPS port answers only callers it can authenticate, and only for what the
/// apiserver authorizes; the apiserver reaches it with its kubelet-client certificate.
fn kubelet_checks_who_calls_it(api: &ApiServer, kubelet: &e2e::kubelet::Kubelet, kubectl: &Path, admin: &str) {
    // Through the apiserver (exec and logs go to the kubelet with the apiserver's certificate).
    let (ok, out) = run(kubectl, &[admin, "exec", "deploy/web", "--", "echo", "through-the-apiserver"]);
    assert!(ok && out.trim() == "through-the-apiserver", "kubectl exec:\n{out}\n{}", kubelet.log());
    let (ok, out) = run(kubectl, &[admin, "logs", "deploy/web"]);
    assert!(ok, "kubectl logs:\n{out}");
    let (ok, out) =
        run(kubectl, &[admin, "get", "--raw", &format!("/api/v1/nodes/{}/proxy/stats/summary", kubelet.node)]);
    assert!(ok && out.contains("\"podRef\""), "nodes/proxy:\n{out}");

    // Directly: nobody anonymous.
    let (code, body) = kubelet.get("/stats/summary").unwrap();
    assert_eq!((code, body.trim()), (401, "Unauthorized"));
    let (code, _) = kubelet.get_with("/healthz", &["-H", "Authorization: Bearer not-a-token"]).unwrap();
    assert_eq!(code, 401, "a token the apiserver does not know");
    // A ServiceAccount's token: authenticated, but allowed nothing on the node.
    for args in [
        vec!["create", "serviceaccount", "nobody"],
        vec!["create", "serviceaccount", "reader"],
        vec![
            "create",
            "clusterrolebinding",
            "reader-kubelet",
            "--clusterrole=system:kubelet-api-admin",
            "--serviceaccount=default:reader",
        ],
    ] {
        let mut all = vec![admin];
        all.extend(args.iter().copied());
        let (ok, out) = run(kubectl, &all);
        assert!(ok, "{args:?}: {out}");
    }
    let token = |sa: &str| {
        let (ok, out) = run(kubectl, &[admin, "create", "token", sa]);
        assert!(ok, "create token: {out}");
        format!("Authorization: Bearer {}", out.trim())
    };
    let nobody = token("nobody");
    let (code, body) = kubelet.get_with("/stats/summary", &["-H", &nobody]).unwrap();
    assert_eq!(
        (code, body.trim()),
        (403, "Forbidden (user=system:serviceaccount:default:nobody, verb=get, resource=nodes, subresource=stats)")
    );
    let (code, body) = kubelet.get_with("/containerLogs/default/x/y", &["-H", &nobody]).unwrap();
    assert!(code == 403 && body.contains("subresource=proxy"), "{code} {body}");
    // Bound to system:kubelet-api-admin: allowed.
    let reader = token("reader");
    let (code, body) = kubelet.get_with("/stats/summary", &["-H", &reader]).unwrap();
    assert!(code == 200 && body.contains("\"podRef\""), "{code} {body}");
    // A client certificate of the cluster's CA (the admin's, in system:masters).
    let now = time::OffsetDateTime::now_utc();
    let files = tempfile::tempdir().unwrap();
    let write_pair = |name: &str, ca: &common::pki::Ca| {
        let (c, k) = ca.issue(&common::pki::Leaf::client(name, "kubernetes-admin", &["system:masters"]), now).unwrap();
        let (cp, kp) = (files.path().join(format!("{name}.crt")), files.path().join(format!("{name}.key")));
        std::fs::write(&cp, c).unwrap();
        std::fs::write(&kp, k).unwrap();
        (cp.display().to_string(), kp.display().to_string())
    };
    let (cert, key) = write_pair("admin", &ca_of(api));
    let (code, body) = kubelet.get_with("/healthz", &["--cert", &cert, "--key", &key]).unwrap();
    assert_eq!((code, body.as_str()), (200, "ok"));
    // The same certificate from a CA the kubelet does not trust: no handshake.
    let (fc, fk) = write_pair("foreign", &common::pki::Ca::generate(now).unwrap());
    assert!(
        kubelet.get_with("/healthz", &["--cert", &fc, "--key", &fk]).is_err(),
        "a foreign CA's certificate was accepted"
    );
    // Plain HTTP on the kubelet's port: Go's answer.
    let r = e2e::raw(kubelet.port, "GET", "/healthz", None, b"").unwrap();
    assert_eq!(r.status, 400);
}

/// The apiserver stores in an etcd that speaks only TLS and wants client certificates
/// (`--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`, as kube-apiserver), and says why
/// when it cannot reach it.
#[test]
fn the_apiserver_reaches_etcd_over_tls() {
    if Command::new("etcd").arg("--version").output().is_err() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true but no etcd (Debian package etcd-server)");
        eprintln!("SKIPPED: no etcd binary");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let now = time::OffsetDateTime::now_utc();
    let ca = common::pki::Ca::generate(now).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let leaf = |name: &str, usage: common::pki::Usage| common::pki::Leaf {
        name: name.into(),
        common_name: name.into(),
        organizations: vec![],
        usage,
        kubeconfig: false,
    };
    let (server_crt, server_key) = ca
        .issue(&leaf("etcd-server", common::pki::Usage::Server(vec!["127.0.0.1".into(), "localhost".into()])), now)
        .unwrap();
    let (client_crt, client_key) =
        ca.issue(&leaf("kube-apiserver-etcd-client", common::pki::Usage::Client), now).unwrap();
    let ca_file = write("ca.crt", &ca.cert_pem);
    let (scrt, skey) = (write("server.crt", &server_crt), write("server.key", &server_key));
    let (ccrt, ckey) = (write("client.crt", &client_crt), write("client.key", &client_key));
    let (client_port, peer_port) = (e2e::free_port(), e2e::free_port());
    let url = format!("https://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
    let mut etcd = Command::new("etcd")
        .args(["--name", "tls", "--data-dir", &dir.path().join("data").display().to_string()])
        .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
        .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("tls={peer}")])
        .args(["--cert-file", &scrt, "--key-file", &skey, "--trusted-ca-file", &ca_file, "--client-cert-auth"])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _etcd = Kill(&mut etcd);
    // Until etcd answers over TLS (its start may take a while on a busy machine).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let health =
            e2e::kubelet::https_get(&format!("{url}/health"), &["--cacert", &ca_file, "--cert", &ccrt, "--key", &ckey]);
        if health.is_ok_and(|(code, body)| code == 200 && body.contains("true")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "etcd not healthy:\n{}", read(dir.path().join("etcd.log")));
        std::thread::sleep(Duration::from_millis(200));
    }
    let with_tls = ApiServer::start_with(&[
        "--etcd-servers",
        &url,
        "--etcd-cafile",
        &ca_file,
        "--etcd-certfile",
        &ccrt,
        "--etcd-keyfile",
        &ckey,
    ])
    .unwrap_or_else(|e| panic!("apiserver over TLS etcd: {e:#}\netcd log:\n{}", read(dir.path().join("etcd.log"))));
    let out = with_tls.kubectl(&["create", "configmap", "over-tls", "--from-literal=k=v"]).unwrap();
    assert!(out.stdout.contains("created"), "{out:?}");
    let out = with_tls.kubectl(&["get", "configmap", "over-tls", "-o", "jsonpath={.data.k}"]).unwrap();
    assert_eq!(out.stdout, "v");
    drop(with_tls);
    // Without a client certificate etcd refuses the connection: the apiserver does not start.
    let err = ApiServer::start_with(&["--etcd-servers", &url, "--etcd-cafile", &ca_file])
        .err()
        .expect("an apiserver without an etcd client certificate started");
    assert!(format!("{err:#}").contains("etcd"), "{err:#}");
}

/// The kubelet's certificates come from the cluster's signers and rotate: a one-minute client
/// certificate is renewed by the node itself (approved as `selfnodeclient`) before it
/// expires, the serving certificate is issued by the CA (approved because its names are the
/// Node's addresses), and the apiserver, which verifies kubelets against the CA, reaches the
/// kubelet with it. After the first client certificate expired, a restarted apiserver still
/// hears from the kubelet: new connections present the new certificate.
#[test]
fn kubelet_certificates_come_from_the_cluster_signers_and_rotate() {
    if !e2e::kubelet::require_docker() {
        return;
    }
    let node = e2e::kubelet::Kubelet::node_name("rotate");
    let mut api = ApiServer::start_tls(&[], &["--authorization-mode=Node,RBAC"]).unwrap();
    let ca_file = api.identity("ca.crt").display().to_string();
    api.extra_args.extend(["--kubelet-certificate-authority".to_string(), ca_file.clone()]);
    api.restart().unwrap();
    let admin = kc_arg(&api.identity("admin.conf"));
    let kubectl = kubectl_bin();
    let k = |args: &[&str]| run(&kubectl, &[&[admin.as_str()][..], args].concat());
    // kubeadm's binding: nodes may renew their own client certificates.
    let (ok, out) = k(&[
        "create",
        "clusterrolebinding",
        "kubeadm:node-autoapprove-certificate-rotation",
        "--clusterrole=system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        "--group=system:nodes",
    ]);
    assert!(ok, "{out}");
    let ca_key = api.identity("ca.key").display().to_string();
    let cm = e2e::controller_manager::ControllerManager::start(
        &api,
        &[
            "--use-service-account-credentials",
            "--controllers=csrapproving,csrsigning,kubelet-serving-csr-approving",
            "--cluster-signing-cert-file",
            &ca_file,
            "--cluster-signing-key-file",
            &ca_key,
            "--cluster-signing-duration=60s",
        ],
    )
    .unwrap();
    // The node's first client certificate: one minute from the cluster CA.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubelet.conf");
    let ca = ca_of(&api);
    let (request, key) = common::pki::new_csr(&format!("system:node:{node}"), &["system:nodes"]).unwrap();
    let usages = ["digital signature".to_string(), "client auth".to_string()];
    let first =
        ca.sign_request(&request, &usages, time::Duration::seconds(60), time::OffsetDateTime::now_utc()).unwrap();
    let first_expiry = common::pki::inspect(&common::pki::pem_to_der(&first).unwrap()).unwrap().not_after;
    let user = format!("system:node:{node}");
    std::fs::write(&kubeconfig, common::pki::kubeconfig(&api.https_url(), &ca.cert_pem, &user, &first, &key)).unwrap();
    let kubelet = e2e::kubelet::Kubelet::start_named(
        &api.https_url(),
        &node,
        &[
            "--kubeconfig".to_string(),
            kubeconfig.display().to_string(),
            "--client-ca-file".to_string(),
            ca_file.clone(),
            "--anonymous-auth=false".to_string(),
            "--authentication-token-webhook".to_string(),
            "--authorization-mode=Webhook".to_string(),
            "--rotate-certificates".to_string(),
            "--rotate-server-certificates".to_string(),
        ],
    )
    .unwrap();
    let logs = || format!("kubelet:\n{}\ncontroller-manager:\n{}", kubelet.log(), cm.log());
    let until = |what: &str, secs: u64, check: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "{what} within {secs}s\n{}", logs());
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    // Requests by requester, signer and condition, as `kubectl get csr` shows them.
    let csrs = || {
        k(&["get", "csr", "-o", "jsonpath={range .items[*]}{.spec.username} {.spec.signerName} {.status.conditions[0].type} {.status.certificate}{\"\\n\"}{end}"]).1
    };
    let issued = |signer: &str| {
        csrs()
            .lines()
            .filter(|l| {
                l.starts_with(&format!("{user} {signer} Approved "))
                    && l.split(' ').nth(3).is_some_and(|c| !c.is_empty())
            })
            .count()
    };
    // The serving certificate: asked for, approved, issued, in use.
    until("an issued serving certificate", 60, &|| issued("kubernetes.io/kubelet-serving") >= 1);
    let serving = kubelet.root_dir().join("pki/kubelet-server-current.pem");
    until("the serving certificate on disk", 30, &|| serving.exists());
    let proxied = || k(&["get", "--raw", &format!("/api/v1/nodes/{node}/proxy/healthz")]);
    until("the apiserver reaching the kubelet, verified", 30, &|| proxied().0);
    let served = read(serving.clone());
    let served_cert = common::pki::inspect(&common::pki::pem_to_der(&served).unwrap()).unwrap();
    assert!(common::pki::signed_by(
        &common::pki::pem_to_der(&served).unwrap(),
        &common::pki::pem_to_der(&ca.cert_pem).unwrap()
    ));
    assert_eq!(served_cert.common_name, user);
    assert!(served_cert.sans.contains(&node), "{:?}", served_cert.sans);
    // The client certificate: renewed by the node itself before the first one expires.
    until("a renewed client certificate", 90, &|| issued("kubernetes.io/kube-apiserver-client-kubelet") >= 1);
    until("the renewed certificate in the kubeconfig", 30, &|| !read(kubeconfig.clone()).contains(&base64_of(&first)));
    // Past the first certificate's end, every connection anew: the kubelet still reports.
    let wait = first_expiry + 3 - time::OffsetDateTime::now_utc().unix_timestamp();
    if wait > 0 {
        std::thread::sleep(Duration::from_secs(wait as u64));
    }
    api.restart().unwrap();
    let restarted = time::OffsetDateTime::now_utc();
    let renewed_after_restart = || {
        let (ok, out) = k(&["get", "lease", "-n", "kube-node-lease", &node, "-o", "jsonpath={.spec.renewTime}"]);
        ok && time::OffsetDateTime::parse(out.trim(), &time::format_description::well_known::Rfc3339)
            .is_ok_and(|t| t > restarted)
    };
    until("a lease renewal after the restart", 60, &renewed_after_restart);
    until("the apiserver reaching the kubelet after the restart", 30, &|| proxied().0);
    // A rotation that fell due while the apiserver was down failed to connect and was
    // retried (the renewal and the proxied healthz above); any other failure (a refused
    // or expired credential) is a bug.
    let log = kubelet.log();
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("certificate rotation failed"))
        .filter(|l| {
            !["Connection refused", "client error (Connect)", "client error (SendRequest)"]
                .iter()
                .any(|c| l.contains(c))
        })
        .collect();
    assert!(failed.is_empty(), "rotation failures other than the restart's:\n{}\n{}", failed.join("\n"), logs());
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}
