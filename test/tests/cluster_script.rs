//! The README's first command: `scripts/cluster up --nodes 2` gives a cluster the official
//! kubectl can use; a Deployment and a NodePort Service from `test/manifests/` run on
//! both nodes and answer through the Service's cluster IP and node port; a pod lists pods
//! in its namespace with its ServiceAccount token and is refused elsewhere (RBAC); a second
//! `up` is a no-op that says so; `status` and `logs` work; `down --purge` leaves no process, container,
//! node bridge, Service rule or state behind. `up --etcd` does the same over a real etcd
//! (Debian's etcd-server) that holds the objects. `up --modules` with two `base add`s runs the
//! README's Koupleless tour. `backup` and `restore` bring a cluster back in a new state
//! directory, on both stores.
//!
//! The clusters run on the host (one Service proxy, node names `node-N`), so the tests here
//! take turns, also with other tests that run `scripts/cluster` (`host_cluster_lock`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use e2e::cluster::{repo, script as cluster, sh_stdout as sh, Down};
use e2e::{free_port, host_cluster_lock, kubectl_bin, manifests_dir};

fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(kubectl_bin())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// One cluster on the host at a time: the tests of this file take turns (the mutex), and
/// with every other test that runs `scripts/cluster` (the file lock).
fn host_lock() -> (MutexGuard<'static, ()>, std::fs::File) {
    static HOST: Mutex<()> = Mutex::new(());
    let turn = HOST.lock().unwrap_or_else(|e| e.into_inner());
    (turn, host_cluster_lock())
}

#[test]
fn cluster_up_two_nodes_runs_a_service_and_down_leaves_nothing() {
    let _host = host_lock();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("state");
    let port = free_port();
    let down = Down(&home, port);

    let (ok, out) = cluster(&home, port, &["up", "--nodes", "2", "--device-plugin", "sample"]);
    assert!(ok, "cluster up failed:\n{out}");
    assert!(out.contains("2 node(s) Ready") && out.contains("export KUBECONFIG="), "up says what it did:\n{out}");
    let kc = home.join("kubeconfig");

    let (ok, out) = kubectl(&kc, &["get", "nodes", "-o", "name"]);
    assert!(ok && out.contains("node/node-1") && out.contains("node/node-2"), "nodes:\n{out}");
    // The control plane's health as `kubectl get cs` shows it: every component Healthy.
    let (ok, out) = kubectl(
        &kc,
        &["get", "componentstatuses", "-o", "jsonpath={range .items[*]}{.metadata.name}={.conditions[0].status} {end}"],
    );
    assert!(ok && out.contains("scheduler=True controller-manager=True storage=True"), "componentstatuses:\n{out}");

    // --device-plugin sample: the first node (the host's device-plugin directory) advertises
    // the sample plugin's three widgets, the second none.
    let widgets = |node: &str| {
        let path = "jsonpath={.status.allocatable.example\\.com/widget}";
        kubectl(&kc, &["get", "node", node, "-o", path]).1.trim().to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while widgets("node-1") != "3" {
        assert!(
            Instant::now() < deadline,
            "node-1 has {:?} widgets\n{}",
            widgets("node-1"),
            cluster(&home, port, &["logs", "device-plugin"]).1
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(widgets("node-2"), "", "node-2 has no device plugin");

    let m = manifests_dir();
    let (ok, out) = kubectl(
        &kc,
        &[
            "apply",
            "-f",
            m.join("03-deployment.yaml").to_str().unwrap(),
            "-f",
            m.join("04-service.yaml").to_str().unwrap(),
        ],
    );
    assert!(ok, "apply:\n{out}");

    // All three replicas Running, spread over both nodes (the scheduler balances them).
    let deadline = Instant::now() + Duration::from_secs(120);
    let nodes = loop {
        let (_, out) = kubectl(
            &kc,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.status.phase} {.spec.nodeName}{\"\\n\"}{end}",
            ],
        );
        let running: Vec<&str> = out.lines().filter(|l| l.starts_with("Running ")).collect();
        if running.len() == 3 {
            break running.iter().filter_map(|l| l.split(' ').nth(1)).map(String::from).collect::<BTreeSet<_>>();
        }
        assert!(
            Instant::now() < deadline,
            "pods not Running:\n{out}\n{}",
            cluster(&home, port, &["logs", "kubelet"]).1
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(nodes.len(), 2, "replicas run on both nodes: {nodes:?}");

    // The Service answers through its cluster IP (every replica in turn) and node port.
    let (_, ip) = kubectl(&kc, &["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = BTreeSet::new();
    while seen.len() < 3 {
        let body = sh(&format!("curl -s -m 2 http://{ip}/"));
        if body.starts_with("v1 web-") {
            seen.insert(body.trim().to_string());
        }
        assert!(Instant::now() < deadline, "cluster IP {ip} reached only {seen:?}");
    }
    let body = sh("curl -s -m 2 http://127.0.0.1:30080/");
    assert!(body.starts_with("v1 web-"), "node port answers: {body:?}");

    // The README's LoadBalancer: the cloud-controller-manager gives it the default pool's
    // first address, held on the host's lo, and kubeproxy takes its traffic to the pods.
    let (ok, out) = kubectl(
        &kc,
        &["expose", "deployment", "web", "--name", "web-lb", "--type=LoadBalancer", "--port=80", "--target-port=8080"],
    );
    assert!(ok, "expose --type=LoadBalancer:\n{out}");
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(60);
    loop {
        let (_, ip) = kubectl(&kc, &["get", "svc", "web-lb", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"]);
        if ip.trim() == "10.254.254.1" {
            eprintln!("web-lb got EXTERNAL-IP {} {:?} after kubectl expose", ip.trim(), t0.elapsed());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "web-lb has no EXTERNAL-IP ({ip:?}):\n{}",
            cluster(&home, port, &["logs", "cloud-controller-manager"]).1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(sh("ip -4 -o addr show dev lo").contains("10.254.254.1/32"), "held on lo");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body = sh("curl -s -m 2 http://10.254.254.1/");
        if body.starts_with("v1 web-") {
            break;
        }
        assert!(Instant::now() < deadline, "the EXTERNAL-IP does not reach the pods: {body:?}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // A pod's identity: its ServiceAccount, bound to a Role that reads pods in its namespace,
    // lists them from inside with the mounted token and CA (curl through the kubernetes
    // Service) and is refused in another namespace (RBAC is on).
    e2e::kubelet::host_programs_image("minik8s-test/curl:latest", &["/usr/bin/curl"]).unwrap();
    for args in [
        &["create", "namespace", "team"][..],
        &["create", "serviceaccount", "reader", "-n", "team"],
        &["create", "role", "reader", "-n", "team", "--verb=get,list", "--resource=pods"],
        &["create", "rolebinding", "reader", "-n", "team", "--role=reader", "--serviceaccount=team:reader"],
    ] {
        let (ok, out) = kubectl(&kc, args);
        assert!(ok, "kubectl {args:?}:\n{out}");
    }
    let script = "D=/var/run/secrets/kubernetes.io/serviceaccount; for ns in team default; do \
        echo $ns=$(curl -s -o /dev/null -w %{http_code} --cacert $D/ca.crt -H \"Authorization: Bearer $(cat $D/token)\" \
        https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/$ns/pods); done; sleep 3600";
    let (ok, out) = kubectl(
        &kc,
        &[
            "run",
            "incluster",
            "-n",
            "team",
            "--image=minik8s-test/curl:latest",
            "--image-pull-policy=Never",
            "--restart=Never",
            r#"--overrides={"spec":{"serviceAccountName":"reader","terminationGracePeriodSeconds":1}}"#,
            "--command",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    assert!(ok, "run incluster:\n{out}");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, logs) = kubectl(&kc, &["logs", "incluster", "-n", "team"]);
        if logs.contains("default=") {
            assert!(logs.contains("team=200") && logs.contains("default=403"), "from inside the pod:\n{logs}");
            break;
        }
        assert!(Instant::now() < deadline, "no answer from inside the pod:\n{logs}");
        std::thread::sleep(Duration::from_millis(500));
    }

    // A tenant: a cluster of its own through tenant-proxy, its pod on the cluster's nodes
    // (stored in acme-default), its logs through the proxy.
    let (ok, out) = cluster(&home, port, &["tenant", "add", "a-b"]);
    assert!(!ok && out.contains("collide"), "a tenant name with '-' is refused:\n{out}");
    let (ok, out) = cluster(&home, port, &["tenant", "add", "acme"]);
    assert!(ok, "tenant add:\n{out}");
    let tkc = out.lines().find_map(|l| l.trim().strip_prefix("export KUBECONFIG=")).map(std::path::PathBuf::from);
    let tkc = tkc.unwrap_or_else(|| panic!("tenant add prints a kubeconfig:\n{out}"));
    let (ok, out) = kubectl(&tkc, &["get", "namespaces", "-o", "name"]);
    assert!(
        ok && out.contains("namespace/default") && !out.contains("namespace/team"),
        "the tenant's namespaces:\n{out}"
    );
    let (ok, out) = kubectl(
        &tkc,
        &[
            "run",
            "hello",
            "--image=minik8s-test/curl:latest",
            "--image-pull-policy=Never",
            "--restart=Never",
            "--command",
            "--",
            "sh",
            "-c",
            "echo hello from acme; sleep 3600",
        ],
    );
    assert!(ok, "tenant run:\n{out}");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, logs) = kubectl(&tkc, &["logs", "hello"]);
        if logs.contains("hello from acme") {
            break;
        }
        assert!(Instant::now() < deadline, "the tenant's pod did not run:\n{logs}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, out) = kubectl(&kc, &["get", "pod", "hello", "-n", "acme-default", "-o", "name"]);
    assert!(ok && out.contains("pod/hello"), "stored in acme-default:\n{out}");
    // exec through the proxy (an upgraded connection, spliced), with stdin.
    let (ok, out) =
        e2e::kubectl_at(&tkc, &["exec", "-i", "hello", "--", "sh", "-c", "read x; echo got-$x"], Some("ping\n"));
    assert!(ok && out.contains("got-ping"), "tenant exec:\n{out}");
    let (ok, out) = cluster(&home, port, &["tenant", "delete", "acme"]);
    assert!(ok, "tenant delete:\n{out}");
    let deadline = Instant::now() + Duration::from_secs(90);
    while kubectl(&kc, &["get", "namespace", "acme-default"]).0 {
        assert!(Instant::now() < deadline, "the deleted tenant's namespace stays");
        std::thread::sleep(Duration::from_millis(500));
    }

    let (ok, out) = cluster(&home, port, &["up"]);
    assert!(ok && out.contains("already up"), "a second up is a no-op that says so:\n{out}");
    let (ok, out) = cluster(&home, port, &["status"]);
    let running = |name: &str| e2e::cluster::status_row(&out, name).is_some_and(|r| r.starts_with("running"));
    assert!(ok && running("apiserver") && running("kubelet-node-2"), "status:\n{out}");
    assert!(out.contains("ready nodes: node-1 node-2"), "status:\n{out}");
    let (ok, _) = cluster(&home, port, &["logs", "scheduler"]);
    assert!(ok, "logs scheduler");

    drop(down);
    assert!(!home.exists(), "down --purge removes the state directory");
    for node in ["node-1", "node-2"] {
        let left = sh(&format!("docker ps -aq --filter label=minik8s.io/node={node}"));
        assert!(left.trim().is_empty(), "containers of {node} left behind: {left}");
    }
    assert!(!e2e::cluster::host_has_any_service_chain(), "Service rules left behind");
    assert!(!sh("ip -4 -o addr show dev lo").contains("10.254.254."), "LoadBalancer addresses left on lo");
    let gone = Command::new(kubectl_bin())
        .args(["--server", &format!("http://127.0.0.1:{port}"), "get", "nodes", "--request-timeout=2s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&gone.stderr);
    assert!(!gone.status.success() && err.contains("refused"), "the apiserver is gone after down: {err}");
}

#[test]
fn cluster_up_etcd_runs_a_deployment_stored_in_etcd() {
    let _host = host_lock();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("state");
    let port = free_port();
    let down = Down(&home, port);

    let (ok, out) = cluster(&home, port, &["up", "--etcd"]);
    assert!(ok, "cluster up --etcd failed:\n{out}");
    assert!(out.contains("1 node(s) Ready"), "up says what it did:\n{out}");
    let (ok, out) = cluster(&home, port, &["status"]);
    let etcd_row = e2e::cluster::status_row(&out, "etcd").unwrap_or_default();
    assert!(ok && etcd_row.starts_with("running") && out.contains("ready nodes: node-1"), "status:\n{out}");
    let etcd_pid = e2e::cluster::component_pid(&home, "etcd").expect("etcd's pid");
    // The apiserver opened the etcd backend, over TLS; its endpoint is in the log.
    let log = cluster(&home, port, &["logs", "apiserver"]).1;
    let endpoint = log
        .lines()
        .find(|l| l.contains("opening storage") && l.contains("Etcd"))
        .and_then(|l| l.split('"').find(|w| w.starts_with("https://")))
        .unwrap_or_else(|| panic!("the apiserver did not open etcd over TLS:\n{log}"))
        .to_string();
    // Without a client certificate of etcd's CA, etcdctl is turned away.
    let anonymous = Command::new("etcdctl")
        .args(["--endpoints", &endpoint, "--insecure-skip-tls-verify", "--command-timeout=3s", "get", "/registry/x"])
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap_or_else(|e| panic!("etcdctl (Debian's etcd-client, installed by scripts/test) is required: {e}"));
    assert!(!anonymous.status.success(), "etcd answered a client without a certificate");

    let kc = home.join("kubeconfig");
    let deployment = repo().join("examples/deployment.yaml");
    let (ok, out) = kubectl(&kc, &["apply", "-f", deployment.to_str().unwrap()]);
    assert!(ok, "apply:\n{out}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, out) = kubectl(
            &kc,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.status.phase} {.spec.nodeName}{\"\\n\"}{end}",
            ],
        );
        if out.lines().filter(|l| *l == "Running node-1").count() == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pods not Running:\n{out}\n{}",
            cluster(&home, port, &["logs", "kubelet"]).1
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, out) = kubectl(&kc, &["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert!(ok, "rollout status:\n{out}");

    // The objects live in that etcd.
    let (ok, keys) = cluster(&home, port, &["etcdctl", "get", "--prefix", "--keys-only", "/registry/"]);
    assert!(ok, "scripts/cluster etcdctl:\n{keys}");
    assert!(keys.lines().any(|k| k == "/registry/deployments/default/web"), "deployment in etcd:\n{keys}");
    assert_eq!(
        keys.lines().filter(|k| k.starts_with("/registry/pods/default/web-")).count(),
        3,
        "pods in etcd:\n{keys}"
    );

    drop(down);
    assert!(!home.exists(), "down --purge removes the state directory");
    assert!(!Path::new(&format!("/proc/{etcd_pid}")).exists(), "etcd (pid {etcd_pid}) still runs after down");
    let left = sh("docker ps -aq --filter label=minik8s.io/node=node-1");
    assert!(left.trim().is_empty(), "containers of node-1 left behind: {left}");
}

/// `up --modules` and `base add`, as the README's Koupleless tour runs them: two reference
/// bases join through the cluster's password-protected broker as virtual nodes with
/// Koupleless' labels, `examples/modules/hello.yaml` applied with the official kubectl runs a
/// module in each, and the module answers; a base without the password never joins.
#[test]
fn cluster_up_modules_runs_a_module_deployment_in_two_bases() {
    let _host = host_lock();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("state");
    let port = free_port();
    let _down = Down(&home, port);

    let (ok, out) = cluster(&home, port, &["base", "add", "b1"]);
    assert!(!ok && out.contains("scripts/cluster up --modules first"), "base add without modules:\n{out}");
    let (ok, out) = cluster(&home, port, &["up", "--modules"]);
    assert!(ok, "cluster up --modules failed:\n{out}");
    assert!(out.contains("Modules: broker 127.0.0.1:"), "up says where the broker is:\n{out}");
    for id in ["b1", "b2"] {
        let (ok, out) = cluster(&home, port, &["base", "add", id]);
        assert!(ok && out.contains(&format!("base {id} joined: node vnode.{id}.dev")), "base add {id}:\n{out}");
    }
    let (ok, out) = cluster(&home, port, &["base", "add", "b1"]);
    assert!(!ok && out.contains("base b1 already runs"), "a second base b1:\n{out}");
    let (ok, out) = cluster(&home, port, &["base", "add", "Bad_Id"]);
    assert!(!ok && out.contains("a base ID is lowercase letters"), "a bad ID:\n{out}");

    let kc = home.join("kubeconfig");
    let (ok, out) = kubectl(
        &kc,
        &[
            "get",
            "nodes",
            "-l",
            "virtual-kubelet.koupleless.io/component=vnode",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.vnode\\.koupleless\\.io/name} {.metadata.labels.vnode\\.koupleless\\.io/version}{\"\\n\"}{end}",
        ],
    );
    assert!(ok && out.contains("vnode.b1.dev base 1.0.0") && out.contains("vnode.b2.dev base 1.0.0"), "vnodes:\n{out}");

    // The tour's module Deployment, its URL pointing into this checkout.
    let manifest = std::fs::read_to_string(repo().join("examples/modules/hello.yaml")).unwrap();
    let applied = tmp.path().join("hello.yaml");
    let checkout = repo().canonicalize().unwrap();
    std::fs::write(&applied, manifest.replace("@REPO@", checkout.to_str().unwrap())).unwrap();
    let (ok, out) = kubectl(&kc, &["apply", "-f", applied.to_str().unwrap()]);
    assert!(ok, "apply:\n{out}");
    let (ok, out) = kubectl(&kc, &["rollout", "status", "deployment/hello", "--timeout=120s"]);
    let logs = || cluster(&home, port, &["logs", "module-controller"]).1;
    assert!(ok, "rollout:\n{out}\n{}", logs());
    let (_, out) = kubectl(
        &kc,
        &["get", "pods", "-l", "module=hello", "-o", "jsonpath={range .items[*]}{.spec.nodeName}{\"\\n\"}{end}"],
    );
    let nodes: BTreeSet<&str> = out.lines().collect();
    assert_eq!(nodes, BTreeSet::from(["vnode.b1.dev", "vnode.b2.dev"]), "one hello per base");
    for id in ["b1", "b2"] {
        let url_file = home.join(format!("modules/bases/{id}/modules/hello-1.0.0/url"));
        let url = std::fs::read_to_string(&url_file).unwrap_or_default();
        let answer = sh(&format!("curl -sS -m 5 {}", url.trim()));
        assert_eq!(answer, format!("hello from module hello 1.0.0 in base {id}\n"), "{url_file:?}: {url}");
    }

    // kubectl logs of a module pod: the apiserver asks the vnode's kubelet API (the module
    // controller's, over TLS with the cluster CA's certificate, which it verifies), which asks
    // the base's arklet. The module's start line and the access log of the request above.
    let (ok, out) = kubectl(
        &kc,
        &["get", "pods", "-l", "module=hello", "--field-selector", "spec.nodeName=vnode.b1.dev", "-o", "name"],
    );
    assert!(ok && out.trim().starts_with("pod/"), "the hello pod on b1:\n{out}");
    let (ok, log) = kubectl(&kc, &["logs", out.trim()]);
    assert!(ok, "kubectl logs of a module pod:\n{log}\n{}", logs());
    assert!(log.contains("module hello 1.0.0 serving http://127.0.0.1:"), "kubectl logs:\n{log}");
    assert!(log.contains("\"GET / HTTP/1.1\" 200"), "the module's access log in kubectl logs:\n{log}");
    let (ok, log) = kubectl(&kc, &["logs", "deployment/hello"]);
    assert!(ok && log.contains("module hello 1.0.0 serving"), "kubectl logs deployment/hello (the README's):\n{log}");
    // That port serves nobody anonymous (as the cluster's kubelets).
    let (_, endpoint) = kubectl(
        &kc,
        &[
            "get",
            "node",
            "vnode.b1.dev",
            "-o",
            "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}:{.status.daemonEndpoints.kubeletEndpoint.Port}",
        ],
    );
    let anonymous =
        sh(&format!("curl -sk -m 5 -w ' %{{http_code}}' https://{}/containerLogs/default/x/hello", endpoint.trim()));
    assert_eq!(anonymous, "Unauthorized 401", "an anonymous caller of the vnodes' kubelet API at {endpoint}");

    // A base that does not know the password is refused by the broker: no node.
    let broker = std::fs::read_to_string(home.join("modules/broker")).unwrap();
    let mut anon = Command::new(e2e::target_dir().join("debug/base"))
        .args(["--id", "anon", "--mqtt-broker", broker.trim(), "--heartbeat-interval", "1", "--arklet-port", "0"])
        .args(["--work-dir", tmp.path().join("anon").to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(8));
    let _ = anon.kill();
    let _ = anon.wait();
    let (_, out) = kubectl(&kc, &["get", "nodes", "-o", "name"]);
    assert!(!out.contains("vnode.anon"), "a base without the password joined:\n{out}");

    // base delete: the base stops and its node goes.
    let (ok, out) = cluster(&home, port, &["base", "delete", "b2"]);
    assert!(ok && out.contains("base b2 stopped"), "base delete:\n{out}");
    let (_, out) = kubectl(&kc, &["get", "nodes", "-o", "name"]);
    assert!(!out.contains("vnode.b2.dev"), "vnode.b2.dev after base delete:\n{out}");
}

/// `backup` of a running cluster and `restore` into a new state directory, on the embedded
/// store and on etcd: after `up`, every object is back with its UID and the Deployment's pods
/// run again on the node; `restore` refuses a state directory that runs a cluster and a file
/// that is no backup, `backup` refuses to overwrite a file.
#[test]
fn backup_and_restore_into_a_new_state_directory() {
    let _host = host_lock();
    let tmp = tempfile::tempdir().unwrap();
    for (store, up) in [("embedded", vec!["up"]), ("etcd", vec!["up", "--etcd"])] {
        let (old, new) = (tmp.path().join(format!("{store}-old")), tmp.path().join(format!("{store}-new")));
        let port = free_port();
        let objects = |home: &Path| {
            let (ok, out) = kubectl(
                &home.join("kubeconfig"),
                &[
                    "get",
                    "-n",
                    "team",
                    "configmap/settings",
                    "deployment/web",
                    "-o",
                    "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.uid} {end}",
                ],
            );
            assert!(ok, "{store}: objects:\n{out}");
            out
        };
        // Pods of the Deployment, by name, once all run.
        let running_pods = |home: &Path| {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let (_, out) = kubectl(
                    &home.join("kubeconfig"),
                    &[
                        "get",
                        "pods",
                        "-n",
                        "team",
                        "-o",
                        "jsonpath={range .items[*]}{.metadata.name}={.metadata.uid}={.status.phase} {end}",
                    ],
                );
                let pods: Vec<&str> = out.split_whitespace().collect();
                if pods.len() == 2 && pods.iter().all(|p| p.ends_with("=Running")) {
                    return out;
                }
                assert!(Instant::now() < deadline, "{store}: pods not running:\n{out}");
                std::thread::sleep(Duration::from_millis(500));
            }
        };
        let file = tmp.path().join(format!("{store}.tar.gz"));
        let (before, pods_before) = {
            let _down = Down(&old, port);
            let (ok, out) = cluster(&old, port, &up);
            assert!(ok, "{store}: up:\n{out}");
            let kc = old.join("kubeconfig");
            for args in [
                vec!["create", "namespace", "team"],
                vec!["create", "configmap", "settings", "-n", "team", "--from-literal=mode=fast"],
                vec![
                    "create",
                    "deployment",
                    "web",
                    "-n",
                    "team",
                    "--image=busybox",
                    "--replicas=2",
                    "--",
                    "sleep",
                    "3600",
                ],
            ] {
                let (ok, out) = kubectl(&kc, &args);
                assert!(ok, "{store}: kubectl {args:?}:\n{out}");
            }
            let pods = running_pods(&old);
            let (ok, out) = cluster(&old, port, &["backup", file.to_str().unwrap()]);
            assert!(ok && out.contains("backed up"), "{store}: backup:\n{out}");
            let (ok, out) = cluster(&old, port, &["backup", file.to_str().unwrap()]);
            assert!(!ok && out.contains("exists already"), "{store}: a second backup to the same file:\n{out}");
            let (ok, out) = cluster(&old, port, &["restore", file.to_str().unwrap()]);
            assert!(!ok && out.contains("down' first"), "{store}: restore over a running cluster:\n{out}");
            (objects(&old), pods)
        }; // down --purge: the old cluster and its containers are gone

        let garbage = tmp.path().join("garbage.tar.gz");
        std::fs::write(&garbage, "not a backup").unwrap();
        let (ok, out) = cluster(&new, port, &["restore", garbage.to_str().unwrap()]);
        assert!(!ok && out.contains("is not a backup"), "{store}: restore of garbage:\n{out}");
        let (ok, out) = cluster(&new, port, &["restore", file.to_str().unwrap()]);
        assert!(ok && out.contains("restored"), "{store}: restore:\n{out}");
        let _down = Down(&new, port);
        let (ok, out) = cluster(&new, port, &up);
        assert!(ok, "{store}: up of the restored cluster:\n{out}");
        assert_eq!(objects(&new), before, "{store}: the restored objects");
        let pods_after = running_pods(&new);
        let names =
            |s: &str| s.split_whitespace().map(|p| p.rsplit_once('=').map(|(n, _)| n.to_string())).collect::<Vec<_>>();
        assert_eq!(names(&pods_after), names(&pods_before), "{store}: the same pods (names and UIDs) run again");
    }
}

/// Flags the script can judge before starting anything are refused with what to do, and
/// nothing is left behind: an unknown network backend (up and join), and IPVS on a kernel
/// without `ip_vs`.
#[test]
fn up_and_join_refuse_what_cannot_work_before_starting_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("state");
    let port = free_port();
    let (ok, out) = cluster(&home, port, &["up", "--network-backend", "flannel"]);
    assert!(!ok && out.contains("--network-backend is host-gw or vxlan, not 'flannel'"), "{out}");
    let hash = format!("sha256:{}", "0".repeat(64));
    let (ok, out) = cluster(
        &home,
        port,
        &[
            "join",
            "--server",
            "https://192.0.2.1:6443",
            "--token",
            "abcdef.0123456789abcdef",
            "--ca-cert-hash",
            &hash,
            "--network-backend",
            "weave",
        ],
    );
    assert!(!ok && out.contains("--network-backend is host-gw or vxlan, not 'weave'"), "{out}");
    let ip_vs_loadable = Command::new("modprobe").args(["-n", "ip_vs"]).output().is_ok_and(|o| o.status.success());
    if !Path::new("/proc/net/ip_vs").exists() && !ip_vs_loadable {
        let (ok, out) = cluster(&home, port, &["up", "--proxy-mode", "ipvs"]);
        assert!(!ok && out.contains("needs the kernel module ip_vs"), "{out}");
    }
    assert!(!home.exists(), "a refused command leaves no state directory behind");
}
