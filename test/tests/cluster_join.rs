//! A cluster across machines, on one host: `scripts/cluster up --role server` serves the API
//! over HTTPS on every address (client certificates, plus bootstrap tokens) and prints a
//! join command carrying a bootstrap token and the CA's hash; that command (with a token
//! from `token create`), run from a second state directory with this host's non-loopback
//! address, pins the CA, has the kubelet ask for its own certificate (a
//! CertificateSigningRequest the controller-manager approves and signs), adds a node that
//! becomes Ready (InternalIP = that address) as `system:node:<name>` and runs a scheduled
//! pod whose log comes back through the apiserver. The token itself authenticates but may
//! do nothing but ask for certificates. The admin kubeconfig works from the host's address
//! with the official kubectl; without credentials, or with a wrong token, it gets
//! Kubernetes' 401 `Status`; the health endpoints stay open; a wrong CA hash is refused
//! before the token is sent, a wrong, malformed or expired token with a clear message.
//! `leave` on the node (which says the administrator must delete its Node, as a node may not)
//! and `down` on the server leave no process, container, bridge or Service rule behind.
//!
//! A second test builds a stacked highly available control plane the same way, with
//! `join --control-plane` (see its doc).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::cluster::{script as cluster, sh_stdout as sh};
use e2e::kubectl::our_kubectl;
use e2e::kubelet::bridge_name;
use e2e::{free_port, host_cluster_lock, kubectl_bin};

fn kubectl(args: &[&str]) -> (bool, String) {
    run(&kubectl_bin(), args)
}

fn run(bin: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin).args(args).output().unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The pids a state directory's components run as.
fn pids(home: &Path) -> Vec<(String, u32)> {
    e2e::cluster::component_pids(home)
}

/// Tears a state directory down even when an assertion fails.
struct Down(PathBuf, u16);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = cluster(&self.0, self.1, &["down", "--purge"]);
    }
}

fn hostname() -> String {
    sh("hostname").trim().to_string()
}

#[test]
fn server_and_joined_node_with_token_authentication() {
    let _host = host_cluster_lock();
    let tmp = tempfile::tempdir().unwrap();
    let server_home = tmp.path().join("server");
    let agent_home = tmp.path().join("agent");
    let port = free_port();
    // Declared first so it is dropped last: the server outlives the joined node.
    let server_down = Down(server_home.clone(), port);
    let server_node = hostname();

    let (ok, out) = cluster(&server_home, port, &["up", "--role", "server"]);
    assert!(ok, "up --role server failed:\n{out}");
    // The printed join command carries this host's address and the token.
    let join_line = out
        .lines()
        .find(|l| l.trim_start().starts_with("scripts/cluster join "))
        .unwrap_or_else(|| panic!("no join command printed:\n{out}"));
    let words: Vec<&str> = join_line.split_whitespace().collect();
    let arg = |flag: &str| {
        let i = words.iter().position(|w| *w == flag).unwrap_or_else(|| panic!("{flag} missing in {join_line:?}"));
        words.get(i + 1).copied().unwrap_or_else(|| panic!("{flag} has no value in {join_line:?}")).to_string()
    };
    let (server, token, ca_hash) = (arg("--server"), arg("--token"), arg("--ca-cert-hash"));
    let host_ip = server
        .strip_prefix("https://")
        .and_then(|h| h.rsplit_once(':'))
        .map(|(h, p)| {
            assert_eq!(p, port.to_string(), "the join URL has the apiserver's port");
            h.to_string()
        })
        .unwrap_or_else(|| panic!("join --server {server:?} is not https://IP:PORT"));
    assert!(host_ip.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| !ip.is_loopback()), "non-loopback: {host_ip}");
    let (id, secret) = token.split_once('.').unwrap_or_default();
    assert!(
        id.len() == 6
            && secret.len() == 16
            && token.chars().all(|c| c == '.' || c.is_ascii_lowercase() || c.is_ascii_digit()),
        "a bootstrap token ID.SECRET: {token:?}"
    );
    let pki = server_home.join("pki");
    let expected_hash = std::process::Command::new(e2e::supervisor_bin())
        .args(["certs", "ca-hash", "--dir"])
        .arg(&pki)
        .output()
        .unwrap();
    assert_eq!(ca_hash, String::from_utf8_lossy(&expected_hash.stdout).trim(), "the join command pins the CA");
    let (ok, out) = cluster(&server_home, port, &["up", "--role", "server"]);
    assert!(ok && out.contains("already up") && out.contains(join_line.trim()), "a second up repeats the join:\n{out}");
    let tokens = std::fs::read_to_string(server_home.join("join-token")).unwrap();
    assert!(tokens.starts_with(&format!("{token} ")), "the state keeps the current token: {tokens:?}");

    // The admin kubeconfig (a client certificate) names the host's address: the official
    // kubectl works with it as from another machine.
    let kc = server_home.join("kubeconfig");
    let kc_text = std::fs::read_to_string(&kc).unwrap();
    assert!(kc_text.contains(&format!("server: {server}")), "admin kubeconfig:\n{kc_text}");
    let kc_arg = format!("--kubeconfig={}", kc.display());
    let (ok, out) = kubectl(&[&kc_arg, "get", "nodes", "-o", "name"]);
    assert!(ok && out.contains(&format!("node/{server_node}")), "the server's node is named after the host:\n{out}");
    let (ok, out) = kubectl(&[&kc_arg, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]);
    assert!(ok && out == "kubernetes-admin", "the admin's identity:\n{out}");
    // The join token over HTTPS: our kubectl and the official one are let in as the token's
    // bootstrap user, who may ask for certificates and nothing else.
    let ca = pki.join("ca.crt");
    let ca_arg = format!("--certificate-authority={}", ca.display());
    let empty = tmp.path().join("empty-kubeconfig");
    std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").unwrap();
    let empty_arg = format!("--kubeconfig={}", empty.display());
    let with_token = [empty_arg.as_str(), "--server", server.as_str(), ca_arg.as_str(), "--token", token.as_str()];
    let (ok, out) =
        kubectl(&[&with_token[..], &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]].concat());
    assert!(ok && out == format!("system:bootstrap:{id}"), "official kubectl with the token:\n{out}");
    let (ok, out) = kubectl(&[&with_token[..], &["get", "nodes", "-o", "name"]].concat());
    assert!(
        !ok && out.contains(&format!(
            "nodes is forbidden: User \"system:bootstrap:{id}\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        )),
        "the token may not list nodes:\n{out}"
    );
    let (ok, out) = kubectl(&[&with_token[..], &["auth", "can-i", "create", "certificatesigningrequests"]].concat());
    // (kubectl adds a warning that the resource is cluster-scoped.)
    assert!(ok && out.starts_with("yes\n"), "the token may ask for certificates:\n{out}");
    let token_kc = tmp.path().join("token.kubeconfig");
    std::fs::write(
        &token_kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{server}\", certificate-authority: \"{}\"}}}}]\n\
             users: [{{name: u, user: {{token: {token}}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n",
            ca.display()
        ),
    )
    .unwrap();
    // Before any join, the only requests are the server's kubelets' serving certificates.
    let (ok, out) = run(&our_kubectl(), &[&format!("--kubeconfig={}", token_kc.display()), "get", "csr"]);
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert!(
        ok && out.starts_with("NAME")
            && !rows.is_empty()
            && rows.iter().all(|r| r.contains("kubernetes.io/kubelet-serving") && r.ends_with("Approved,Issued")),
        "our kubectl with the token:\n{out}"
    );
    let wrong = tmp.path().join("wrong.kubeconfig");
    std::fs::write(&wrong, std::fs::read_to_string(&token_kc).unwrap().replace(&token, "not-the-token")).unwrap();
    let (ok, out) = run(&our_kubectl(), &[&format!("--kubeconfig={}", wrong.display()), "get", "nodes"]);
    assert!(!ok && out.contains("Unauthorized"), "our kubectl with a wrong token:\n{out}");

    // A wrong token: the official kubectl is told it is not logged in; it decodes the answer
    // as Kubernetes' Status (client-go prints its message, `Unauthorized`). No credentials at
    // all: over HTTPS kubectl asks for a user name before it sends anything, as with any
    // kube-apiserver, and without a terminal gives up.
    let mut args = vec![empty_arg.as_str(), "--server", server.as_str(), ca_arg.as_str(), "--token", "not-the-token"];
    for (what, want) in [
        (&["get", "--raw", "/api/v1/namespaces"][..], "error: You must be logged in to the server (Unauthorized)"),
        (&["get", "pods"][..], "error: You must be logged in to the server"),
    ] {
        let (ok, out) = kubectl(&[&args[..], what].concat());
        assert!(!ok && out.contains(want), "kubectl with a wrong token {what:?}:\n{out}");
    }
    args.truncate(args.len() - 2);
    let (ok, out) = kubectl(&[&args[..], &["get", "pods"][..]].concat());
    assert!(!ok && out.contains("Please enter Username"), "kubectl without credentials:\n{out}");
    // Sent without credentials, a request is system:anonymous's, which RBAC refuses with
    // Kubernetes' 403 Status, as a kubeadm cluster does; health stays open.
    let curl = |path: &str| {
        let out = sh(&format!("curl -sS --cacert {} -w '\\n%{{http_code}}' {server}{path}", ca.display()));
        let (body, code) = out.rsplit_once('\n').map(|(b, c)| (b.to_string(), c.to_string())).unwrap_or_default();
        (code, body)
    };
    let (code, body) = curl("/api/v1/namespaces");
    assert_eq!(code, "403", "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": "namespaces is forbidden: User \"system:anonymous\" cannot list resource \"namespaces\" in API group \"\" at the cluster scope",
                           "reason": "Forbidden", "details": {"kind": "namespaces"}, "code": 403})
    );
    // Discovery is for authenticated users only (system:discovery).
    assert_eq!(curl("/api").0, "403", "discovery without credentials");
    for path in ["/readyz", "/livez", "/healthz", "/version"] {
        assert_eq!(curl(path).0, "200", "{path} without credentials");
    }

    // Join a second node from another state directory, exactly as printed (plus a name and
    // no second Service proxy on a host that already has one).
    let agent_down = Down(agent_home.clone(), port);
    let joined = format!("joined-{port}");
    let bad_join = |token: &str, hash: &str| {
        cluster(
            &agent_home,
            port,
            &["join", "--server", &server, "--token", token, "--ca-cert-hash", hash, "--node-name", &joined],
        )
    };
    let (ok, out) = bad_join("bad", &ca_hash);
    assert!(!ok && out.contains("join needs --token ID.SECRET"), "join with a malformed token:\n{out}");
    let (ok, out) = bad_join("abcdef.0123456789abcdef", &ca_hash);
    assert!(!ok && out.contains("refused the token (401 Unauthorized)"), "join with a wrong token:\n{out}");
    // An expired bootstrap token (kubeadm's Secret, its expiration past) is refused as well.
    let expired = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "bootstrap-token-expird", "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {"token-id": "expird", "token-secret": "0123456789abcdef", "expiration": "2020-01-01T00:00:00Z",
                       "usage-bootstrap-authentication": "true",
                       "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token"}});
    let expired_file = tmp.path().join("expired.json");
    std::fs::write(&expired_file, expired.to_string()).unwrap();
    let (ok, out) = kubectl(&[&kc_arg, "create", "-f", &expired_file.display().to_string()]);
    assert!(ok, "{out}");
    let (ok, out) = bad_join("expird.0123456789abcdef", &ca_hash);
    assert!(!ok && out.contains("refused the token (401 Unauthorized)"), "join with an expired token:\n{out}");
    let other_hash = format!("sha256:{}", "0".repeat(64));
    let (ok, out) = bad_join(&token, &other_hash);
    assert!(!ok && out.contains("presented no CA certificate with hash"), "join with a wrong CA hash:\n{out}");
    // A new token (kubeadm's `token create --print-join-command`) joins as well.
    let (ok, out) = cluster(&server_home, port, &["token", "create"]);
    let new_line = out.lines().find(|l| l.starts_with("scripts/cluster join ")).unwrap_or_default().to_string();
    assert!(ok && !new_line.contains(&token) && new_line.contains(&ca_hash), "token create:\n{out}");
    let new_words: Vec<&str> = new_line.split_whitespace().collect();
    let new_id =
        new_words[new_words.iter().position(|w| *w == "--token").unwrap() + 1].split('.').next().unwrap().to_string();
    let mut join: Vec<&str> = new_words[1..].to_vec();
    join.extend_from_slice(&["--node-name", &joined, "--no-kubeproxy"]);
    let (ok, out) = cluster(&agent_home, port, &join);
    assert!(ok, "join failed:\n{out}");
    assert!(out.contains(&format!("node {joined} joined {server} and is Ready")), "join says so:\n{out}");
    // The kubelet asked for its certificate with the token; it was approved and issued.
    let (ok, out) = kubectl(&[&kc_arg, "get", "csr"]);
    let row = out.lines().find(|l| l.contains(&format!("system:bootstrap:{new_id}"))).unwrap_or_default();
    assert!(
        ok && out.starts_with("NAME")
            && row.contains("kubernetes.io/kube-apiserver-client-kubelet")
            && row.ends_with("Approved,Issued"),
        "the joined node's certificate request:\n{out}"
    );
    // Its kubelet then asked, as itself, for its serving certificate, which the server's
    // controller-manager approved (the names are the Node's addresses): the apiserver,
    // which verifies kubelets against the cluster CA, reads its logs below.
    let serving = out
        .lines()
        .find(|l| l.contains("kubernetes.io/kubelet-serving") && l.contains(&format!("system:node:{joined}")));
    assert!(serving.is_some_and(|r| r.ends_with("Approved,Issued")), "the joined node's serving certificate:\n{out}");
    // The joined node is system:node:<name>: its own Node is its to change, another's is not.
    let agent_kc = format!("--kubeconfig={}", agent_home.join("kubeconfig").display());
    let (ok, out) = kubectl(&[&agent_kc, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]);
    assert!(ok && out == format!("system:node:{joined}"), "the joined node's identity:\n{out}");
    let (ok, out) = kubectl(&[&agent_kc, "label", "node", &server_node, "stolen=yes"]);
    assert!(!ok && out.contains("forbidden"), "a node changed another node:\n{out}");
    let (ok, out) = cluster(&agent_home, port, &join);
    assert!(ok && out.contains("already runs node"), "a second join is a no-op:\n{out}");
    let (ok, out) = cluster(&agent_home, port, &["status"]);
    let row = e2e::cluster::status_row(&out, &format!("kubelet-{joined}")).unwrap_or_default();
    assert!(ok && row.starts_with("running"), "status:\n{out}");

    let (_, out) = kubectl(&[
        &kc_arg,
        "get",
        "node",
        &joined,
        "-o",
        "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
    ]);
    assert_eq!(out.trim(), host_ip, "the joined node's InternalIP is the --node-ip");

    // A pod scheduled onto the joined node runs, and its log comes back through the
    // apiserver (which reaches the kubelet at the node's address).
    let pod = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"on-joined"}},
           "spec":{{"nodeSelector":{{"kubernetes.io/hostname":"{joined}"}},"terminationGracePeriodSeconds":1,
           "containers":[{{"name":"c","image":"busybox:latest","imagePullPolicy":"IfNotPresent",
           "command":["sh","-c","echo hello from $(hostname); exec sleep 3600"]}}]}}}}"#
    );
    let manifest = tmp.path().join("pod.json");
    std::fs::write(&manifest, pod).unwrap();
    let (ok, out) = kubectl(&[&kc_arg, "apply", "-f", manifest.to_str().unwrap()]);
    assert!(ok, "apply:\n{out}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, out) =
            kubectl(&[&kc_arg, "get", "pod", "on-joined", "-o", "jsonpath={.status.phase} {.spec.nodeName}"]);
        if out.trim() == format!("Running {joined}") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pod not Running on {joined}: {out}\n{}",
            cluster(&agent_home, port, &["logs", "kubelet"]).1
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out) = kubectl(&[&kc_arg, "logs", "on-joined"]);
        if ok && out.contains("hello from on-joined") {
            break;
        }
        assert!(Instant::now() < deadline, "logs through the apiserver:\n{out}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let containers = sh(&format!("docker ps -q --filter label=minik8s.io/node={joined}"));
    assert!(!containers.trim().is_empty(), "the pod runs in Docker under the joined node");

    // The joined node goes away cleanly and leaves the server's Service rules alone.
    let agent_pids = pids(&agent_home);
    assert!(agent_pids.iter().any(|(n, _)| n == &format!("kubelet-{joined}")), "{agent_pids:?}");
    assert!(!agent_pids.iter().any(|(n, _)| n == "kubeproxy"), "--no-kubeproxy: {agent_pids:?}");
    // The server's kubeproxy keeps the host's Service rules (re-synced within its 30 s period).
    let deadline = Instant::now() + Duration::from_secs(40);
    while !e2e::cluster::host_has_service_rules() {
        assert!(Instant::now() < deadline, "the server's kubeproxy wrote no Service rules");
        std::thread::sleep(Duration::from_millis(500));
    }
    // The node leaves: it may not delete its own Node (as in Kubernetes), says so, and stops
    // everything; the administrator deletes the Node.
    let (ok, out) = cluster(&agent_home, port, &["leave"]);
    assert!(
        ok && out.contains(&format!("could not delete node {joined}: delete it from a control-plane machine"))
            && out.contains("left the cluster"),
        "leave on a joined node:\n{out}"
    );
    let (ok, out) = kubectl(&[&kc_arg, "delete", "node", &joined]);
    assert!(ok, "{out}");
    drop(agent_down);
    assert!(!agent_home.exists(), "leave removes the joined node's state");
    for (name, pid) in &agent_pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "{name} (pid {pid}) still runs after down");
    }
    let left = sh(&format!("docker ps -aq --filter label=minik8s.io/node={joined}"));
    assert!(left.trim().is_empty(), "containers of {joined} left behind: {left}");
    assert!(!sh("ip -o link show").contains(&bridge_name(&joined)), "the joined node's bridge is removed");
    assert!(e2e::cluster::host_has_service_rules(), "the joined node's down leaves the server's Service rules");
    let (ok, out) = kubectl(&[&kc_arg, "get", "nodes", "-o", "name"]);
    assert!(ok && out.contains(&server_node), "the server keeps running:\n{out}");

    let server_pids = pids(&server_home);
    for c in ["apiserver", "scheduler", "controller-manager", "kubeproxy"] {
        assert!(server_pids.iter().any(|(n, _)| n == c), "{c} ran on the server: {server_pids:?}");
    }
    drop(server_down);
    assert!(!server_home.exists(), "down --purge removes the server's state");
    for (name, pid) in &server_pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "{name} (pid {pid}) still runs after down");
    }
    let left = sh(&format!("docker ps -aq --filter label=minik8s.io/node={server_node}"));
    assert!(left.trim().is_empty(), "containers of {server_node} left behind: {left}");
    assert!(!sh("ip -o link show").contains(&bridge_name(&server_node)), "the server node's bridge is removed");
    assert!(!e2e::cluster::host_has_any_service_chain(), "Service rules left behind");
    // (The CA went with the state directory; a token keeps kubectl from asking for a user.)
    let gone = [&empty_arg, "--server", &server, "--insecure-skip-tls-verify", "--token", "x"];
    let (ok, out) = kubectl(&[&gone[..], &["get", "nodes", "--request-timeout=2s"][..]].concat());
    assert!(!ok && out.contains("refused"), "the apiserver is gone after down: {out}");
}

/// The etcd members a state directory's cluster lists: (name, is learner).
fn etcd_members(home: &Path, port: u16) -> Vec<(String, bool)> {
    let (ok, out) = cluster(home, port, &["etcdctl", "member", "list", "-w", "json"]);
    assert!(ok, "etcdctl member list:\n{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let mut members: Vec<(String, bool)> = v["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| (m["name"].as_str().unwrap_or_default().to_string(), m["isLearner"].as_bool().unwrap_or(false)))
        .collect();
    members.sort();
    members
}

/// Retries `f` until it returns `Some`, for up to `secs` seconds.
fn eventually<T>(secs: u64, what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => panic!("{what} not within {secs}s: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// A stacked highly available control plane across "machines" (state directories of this
/// host on its non-loopback address), as kubeadm builds one: `up --role server --etcd`
/// prints a control-plane join command whose certificate key opens the cluster's CAs (sealed
/// in a Secret only bootstrap tokens may read); two machines join with it, each adding an
/// etcd member (TLS, etcd's own CA; a learner until promoted), an apiserver, a scheduler, a
/// controller-manager and a node. The first machine then dies (every process SIGKILLed): the
/// other two keep the API, its data, and leader election (a pod is scheduled and run);
/// back up, it rejoins as it was. `leave` on the third removes its etcd member, its node and
/// its apiserver endpoint. A wrong certificate key, or one without --control-plane, is
/// refused with a message that says why.
#[test]
fn control_plane_machines_join_survive_the_loss_of_one_and_leave() {
    let _host = host_cluster_lock();
    let tmp = tempfile::tempdir().unwrap();
    let homes: Vec<PathBuf> = ["cp-1", "cp-2", "cp-3", "bad", "worker"].iter().map(|n| tmp.path().join(n)).collect();
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect();
    // Declared first so they are dropped last, the first machine after the others.
    let _down: Vec<Down> = homes.iter().zip(&ports).map(|(h, p)| Down(h.clone(), *p)).collect();
    let first_node = hostname();

    let (ok, out) = cluster(&homes[0], ports[0], &["up", "--role", "server", "--etcd"]);
    assert!(ok, "up --role server --etcd failed:\n{out}");
    let join_line = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("scripts/cluster join ") && l.contains("--control-plane"))
        .unwrap_or_else(|| panic!("no control-plane join command printed:\n{out}"))
        .to_string();
    let words: Vec<&str> = join_line.split_whitespace().skip(1).collect();
    let key_at = words.iter().position(|w| *w == "--certificate-key").expect("--certificate-key") + 1;
    assert!(words[key_at].len() == 64 && words[key_at].chars().all(|c| c.is_ascii_hexdigit()), "{join_line}");
    // The apiserver's log names no key of its etcd client certificate.
    let log = std::fs::read_to_string(homes[0].join("logs/apiserver.log")).unwrap();
    assert!(log.contains("opening storage") && !log.contains("45, 45, 45, 45, 45"), "a PEM in the apiserver's log");
    // etcd speaks TLS only to clients with a certificate of its CA.
    let endpoint = std::fs::read_to_string(homes[0].join("etcd-endpoints")).unwrap();
    let url = endpoint.trim().split(',').next().unwrap().to_string();
    assert!(url.starts_with("https://"), "{endpoint}");
    let ca = homes[0].join("pki/etcd-ca.crt");
    let plain = sh(&format!("curl -sS -m 5 --cacert {} {url}/health 2>&1", ca.display()));
    assert!(!plain.contains("\"health\":\"true\""), "etcd answered a client without a certificate: {plain}");
    let admin = homes[0].join("pki/admin.pem");
    let cluster_ca_client =
        sh(&format!("curl -sS -m 5 --cacert {} --cert {} {url}/health 2>&1", ca.display(), admin.display()));
    assert!(
        !cluster_ca_client.contains("\"health\":\"true\""),
        "etcd admitted the cluster CA's admin: {cluster_ca_client}"
    );

    // Bad input, from a fourth state directory: nothing is joined.
    let mut wrong_key = words.clone();
    let other_key = "0".repeat(64);
    wrong_key[key_at] = &other_key;
    let (ok, out) = cluster(&homes[3], ports[3], &[&wrong_key[..], &["--node-name", "bad"]].concat());
    assert!(!ok && out.contains("the control-plane certificates do not open"), "a wrong certificate key:\n{out}");
    let no_flag: Vec<&str> = words.iter().copied().filter(|w| *w != "--control-plane").collect();
    let (ok, out) = cluster(&homes[3], ports[3], &no_flag);
    assert!(!ok && out.contains("--certificate-key goes with --control-plane"), "a key without the flag:\n{out}");
    assert_eq!(etcd_members(&homes[0], ports[0]), [(first_node.clone(), false)]);

    for i in [1, 2] {
        let name = format!("cp-{}", i + 1);
        let (ok, out) = cluster(&homes[i], ports[i], &[&words[..], &["--node-name", &name, "--no-kubeproxy"]].concat());
        assert!(ok, "join --control-plane as {name} failed:\n{out}");
    }
    let mut want = vec![(first_node.clone(), false), ("cp-2".to_string(), false), ("cp-3".to_string(), false)];
    want.sort();
    assert_eq!(etcd_members(&homes[1], ports[1]), want, "three voting members");
    // A worker node joins through the first machine, with the plain join command.
    let worker_join: Vec<&str> = words[..key_at - 2].to_vec();
    assert!(!worker_join.contains(&"--control-plane"), "{worker_join:?}");
    let (ok, out) =
        cluster(&homes[4], ports[4], &[&worker_join[..], &["--node-name", "worker", "--no-kubeproxy"]].concat());
    assert!(ok && out.contains("==> the node reaches the apiservers at"), "join of a worker failed:\n{out}");
    // Its balancer has learnt every apiserver (from the kubernetes endpoints).
    eventually(30, "the worker's balancer knowing the three apiservers", || {
        let known = std::fs::read_to_string(homes[4].join("apiservers")).unwrap_or_default();
        let n = ports[..3].iter().filter(|p| known.lines().any(|l| l.ends_with(&format!(":{p}")))).count();
        if n == 3 {
            Ok(())
        } else {
            Err(known)
        }
    });
    let kc = |i: usize| format!("--kubeconfig={}", homes[i].join("kubeconfig").display());
    // Every apiserver is an endpoint of the kubernetes Service.
    eventually(30, "three apiserver endpoints", || {
        let (_, out) =
            kubectl(&[&kc(2), "get", "endpoints", "kubernetes", "-o", "jsonpath={.subsets[*].ports[*].port}"]);
        let mut got: Vec<u16> = out.split_whitespace().filter_map(|p| p.parse().ok()).collect();
        got.sort();
        let mut want = ports[..3].to_vec();
        want.sort();
        if got == want {
            Ok(())
        } else {
            Err(out)
        }
    });
    let (ok, out) = kubectl(&[&kc(0), "get", "nodes", "-o", "name"]);
    assert!(ok && out.contains("node/cp-2") && out.contains("node/cp-3"), "{out}");
    let (ok, out) = kubectl(&[&kc(0), "create", "configmap", "before", "--from-literal=k=v"]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&[&kc(2), "get", "configmap", "before", "-o", "jsonpath={.data.k}"]);
    assert!(ok && out == "v", "written through the first, read through the third: {out}");

    // The first machine dies: every process of it, SIGKILLed at once.
    let sup = std::fs::read_to_string(homes[0].join("supervisor/supervisor.lock")).unwrap_or_default();
    let mut victims: Vec<String> = e2e::cluster::component_pids(&homes[0]).iter().map(|(_, p)| p.to_string()).collect();
    assert!(victims.len() > 8 && !sup.trim().is_empty(), "the first machine's processes: {victims:?}, {sup:?}");
    victims.push(sup.trim().to_string());
    sh(&format!("kill -9 {}", victims.join(" ")));
    let started = Instant::now();
    eventually(60, "a write through the second apiserver", || {
        let (ok, out) =
            kubectl(&[&kc(1), "create", "configmap", "after", "--from-literal=k=w", "--request-timeout=5s"]);
        if ok || out.contains("AlreadyExists") {
            Ok(())
        } else {
            Err(out)
        }
    });
    eprintln!("writes served again {:?} after the first machine died", started.elapsed());
    let (ok, out) = kubectl(&[&kc(2), "get", "configmap", "before", "after", "-o", "name"]);
    assert!(ok && out.contains("configmap/before") && out.contains("configmap/after"), "{out}");
    // The surviving schedulers and controller-managers take over: a Deployment's pod runs.
    let (ok, out) =
        kubectl(&[&kc(1), "create", "deployment", "survivor", "--image=busybox:latest", "--", "sleep", "3600"]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&[
        &kc(1),
        "patch",
        "deployment",
        "survivor",
        "-p",
        r#"{"spec":{"template":{"spec":{"nodeSelector":{"kubernetes.io/hostname":"cp-2"},"terminationGracePeriodSeconds":1}}}}"#,
    ]);
    assert!(ok, "{out}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, out) = kubectl(&[
            &kc(2),
            "get",
            "pods",
            "-l",
            "app=survivor",
            "-o",
            "jsonpath={range .items[*]}{.status.phase} {.spec.nodeName}{\"\\n\"}{end}",
        ]);
        if out.lines().any(|l| l == "Running cp-2") {
            break;
        }
        if Instant::now() > deadline {
            let (_, objects) = kubectl(&[&kc(2), "get", "deploy,rs,pods,leases", "-A", "-o", "wide"]);
            let (_, events) = kubectl(&[&kc(2), "get", "events", "--sort-by=.lastTimestamp"]);
            let logs: String = [1, 2]
                .iter()
                .flat_map(|&i| ["controller-manager", "scheduler"].map(move |c| (i, c)))
                .map(|(i, c)| {
                    let log = std::fs::read_to_string(homes[i].join(format!("logs/{c}.log"))).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(15).collect();
                    format!("--- cp-{} {c}:\n{}\n", i + 1, tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
                })
                .collect();
            panic!("the Deployment's pod not Running on cp-2 within 120s: {out}\n{objects}\n{events}\n{logs}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    // The worker, joined through the first machine, stays Ready through the others (its
    // balancer follows the kubernetes endpoints); the first machine's node does not.
    while started.elapsed() < Duration::from_secs(50) {
        std::thread::sleep(Duration::from_millis(500));
    }
    let ready = |node: &str| {
        kubectl(&[&kc(1), "get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]).1
    };
    assert_eq!(ready("worker"), "True", "the worker 50 s after its server died");
    assert_ne!(ready(&first_node), "True", "the dead machine's node");

    // The first machine comes back as it was (its supervisor starts the same components).
    let (ok, out) = cluster(&homes[0], ports[0], &["up", "--role", "server", "--etcd"]);
    assert!(ok, "the first machine's up after its crash:\n{out}");
    let (ok, out) = kubectl(&[&kc(0), "get", "configmap", "after", "-o", "jsonpath={.data.k}"]);
    assert!(ok && out == "w", "the write made while it was down, read through it: {out}");
    let (ok, out) = cluster(&homes[0], ports[0], &["etcdctl", "endpoint", "health", "--cluster"]);
    assert!(ok && out.matches("is healthy").count() == 3, "{out}");

    // The third machine leaves.
    let third = e2e::cluster::component_pids(&homes[2]);
    let (ok, out) = cluster(&homes[2], ports[2], &["leave"]);
    assert!(ok && out.contains("removed etcd member cp-3") && out.contains("deleted node cp-3"), "leave:\n{out}");
    assert!(!homes[2].exists(), "leave removes the state directory");
    for (name, pid) in &third {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "{name} (pid {pid}) still runs after leave");
    }
    let mut want = vec![(first_node.clone(), false), ("cp-2".to_string(), false)];
    want.sort();
    assert_eq!(etcd_members(&homes[0], ports[0]), want);
    let (ok, out) = kubectl(&[&kc(0), "get", "nodes", "-o", "name"]);
    assert!(ok && !out.contains("cp-3"), "node cp-3 deleted: {out}");
    let (_, out) = kubectl(&[&kc(0), "get", "endpoints", "kubernetes", "-o", "jsonpath={.subsets[*].ports[*].port}"]);
    assert!(!out.split_whitespace().any(|p| p == ports[2].to_string()), "the third apiserver's endpoint stays: {out}");
    // The last but one may leave; the last one may not (that would end the cluster).
    let (ok, out) = cluster(&homes[1], ports[1], &["leave"]);
    assert!(ok, "leave of cp-2:\n{out}");
    let (ok, out) = cluster(&homes[0], ports[0], &["leave"]);
    assert!(!ok && out.contains("the cluster's only etcd member"), "the last member's leave:\n{out}");
    let (ok, out) = kubectl(&[&kc(0), "get", "configmap", "before", "-o", "name"]);
    assert!(ok, "the cluster goes on with one member: {out}");
}
