//! Issue 9's scenario end to end, from the host and from inside pods: `scripts/cluster up
//! --nodes 2` (real kubelets on Docker, kubeproxy with cluster DNS and the nginx Ingress
//! controller, as the script sets them up), the official kubectl applying
//! `test/manifests/` 03 (Deployment web), 04 (NodePort Service web) and 06 (Ingress
//! myservice.com) plus `examples/other.yaml` (the Ingress' second backend), then:
//! - from the host and from a pod on each node: the cluster IP, the node port, the Service's
//!   DNS name (and the short name through the pods' search path) all answer;
//! - the pods' resolv.conf and hosts files are the kubelet's;
//! - 30 requests spread over all 3 replicas, also from a replica (hairpin);
//! - scaled down then up: once kubeproxy synced the smaller EndpointSlice, no request
//!   reaches a removed pod; after scaling up all replicas answer again;
//! - `http://myservice.com/web` and `/other` reach the two Services through nginx;
//! - kubeproxy killed: traffic keeps flowing; restarted: the rules are the same as before
//!   (no duplicates) and nginx is adopted, not started twice;
//! - stopped (SIGTERM): nginx stops and the node's DNS endpoint is withdrawn;
//!   `kubeproxy --cleanup` removes every rule; `down --purge` leaves nothing behind.
//!
//! The whole scenario runs in `iptables` mode, then in `nftables` mode. Pod commands run
//! through the official `kubectl exec`. One test function: the rules, the node
//! bridges and port 80 are host-global.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use e2e::cluster::{repo, sh_stdout as stdout};
use e2e::kubelet::{docker_bin, require_docker};
use e2e::kubeproxy::{kubeproxy_bin, prerequisites};
use e2e::{free_port, kubectl_bin, manifests_dir};

const WAIT: Duration = Duration::from_secs(120);
const DNS_IP: &str = "10.96.0.10";

fn sh(cmd: &str) -> (bool, String) {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

/// Poll `f` until it gives Some, or panic with `what` and the last value seen.
fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => panic!("{what}: not within {timeout:?}; last: {last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// A cluster from `scripts/cluster up`, torn down (`down --purge`) on drop.
struct Cluster {
    home: PathBuf,
    port: u16,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    fn script(&self, args: &[&str]) -> (bool, String) {
        e2e::cluster::script(&self.home, self.port, args)
    }

    fn up(mode: &str) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let c = Cluster { home: tmp.path().join("state"), port: free_port(), _tmp: tmp };
        let (ok, out) = c.script(&["up", "--nodes", "2", "--proxy-mode", mode]);
        assert!(ok, "cluster up ({mode}) failed:\n{out}");
        c
    }

    fn log(&self, component: &str) -> String {
        std::fs::read_to_string(self.home.join(format!("logs/{component}.log"))).unwrap_or_default()
    }

    /// kubectl's exit status and its output: stdout and stderr together.
    fn kubectl_in(&self, args: &[&str], input: Option<&str>) -> (bool, String) {
        let (ok, stdout, stderr) = self.kubectl_apart(args, input);
        (ok, format!("{stdout}{stderr}"))
    }

    /// kubectl's exit status, stdout and stderr apart.
    fn kubectl_apart(&self, args: &[&str], input: Option<&str>) -> (bool, String, String) {
        let mut child = Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(self.home.join("kubeconfig"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run kubectl: {e}"));
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input.unwrap_or_default().as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn kubectl(&self, args: &[&str]) -> (bool, String) {
        self.kubectl_in(args, None)
    }

    fn must(&self, args: &[&str]) -> String {
        let (ok, out) = self.kubectl(args);
        assert!(ok, "kubectl {args:?}:\n{out}");
        out
    }

    fn kubeproxy_pid(&self) -> u32 {
        e2e::cluster::component_pid(&self.home, "kubeproxy").unwrap_or_else(|| panic!("kubeproxy is not running"))
    }

    /// kubeproxy's command line (to restart it exactly as the script started it).
    fn kubeproxy_cmdline(&self) -> Vec<String> {
        let raw = std::fs::read(format!("/proc/{}/cmdline", self.kubeproxy_pid())).unwrap_or_default();
        raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
    }

    /// kubeproxy's last successful sync (its metric, whole seconds); 0 while the process is
    /// still being started (a freshly forked `nohup` shows its own command line for a moment).
    fn last_sync(&self) -> f64 {
        let args = self.kubeproxy_cmdline();
        let Some(addr) = args.iter().position(|a| a == "--metrics-bind-address").and_then(|i| args.get(i + 1)) else {
            return 0.0;
        };
        stdout(&format!("curl -s -m 5 http://{addr}/metrics"))
            .lines()
            .find(|l| l.starts_with("kubeproxy_sync_proxy_rules_last_timestamp_seconds "))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Wait until kubeproxy finished a sync at least `settle` seconds after `t` (seconds since
    /// the epoch). A sync that ends just after a change may have started before it: for an
    /// API change use a settle time above the 1 s minimum sync period.
    fn wait_synced_after(&self, t: f64, settle: f64) {
        wait_for("kubeproxy sync", WAIT, || {
            let s = self.last_sync();
            if s >= (t + settle).floor() && s > t.floor() {
                Ok(())
            } else {
                Err(format!("last sync {s}, want after {t}"))
            }
        });
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.script(&["down", "--purge"]);
    }
}

/// Run `cmd` in a pod's container through the official `kubectl exec`: (exit ok, output).
/// Run `cmd` in a pod's container: whether it succeeded, and what it printed (its stdout;
/// with kubectl's stderr too when it failed, to say why).
fn in_pod(c: &Cluster, pod: &str, name: &str, cmd: &str) -> (bool, String) {
    let (ok, stdout, stderr) = c.kubectl_apart(&["exec", pod, "-c", name, "--", "sh", "-c", cmd], None);
    if ok {
        (ok, stdout)
    } else {
        (ok, format!("{stdout}{stderr}"))
    }
}

/// GET `url` from a pod with busybox wget (`timeout` instead of -T, which this busybox
/// build mishandles).
fn pod_get(c: &Cluster, pod: &str, name: &str, url: &str) -> Result<String, String> {
    let (ok, out) = in_pod(c, pod, name, &format!("timeout 5 wget -qO- {url}"));
    if ok {
        Ok(out.trim().to_string())
    } else {
        Err(format!("wget {url} from {pod}: {out}"))
    }
}

fn host_get(url: &str, host: Option<&str>) -> Result<String, String> {
    let h = host.map(|h| format!("-H 'Host: {h}'")).unwrap_or_default();
    let (ok, out) = sh(&format!("curl -sS -f -m 5 {h} {url}"));
    if ok {
        Ok(out.trim().to_string())
    } else {
        Err(format!("curl {url}: {out}"))
    }
}

/// What the host's path to `ip` looked like when a request to it failed: the route, the
/// Service rules and conntrack entries naming it, the kubeproxies running, their last
/// syncs, and whether a second request a moment later answers (a transient gap in the
/// rules, or a lasting one).
fn host_path_diag(c: &Cluster, ip: &str) -> String {
    let retry = {
        std::thread::sleep(Duration::from_secs(1));
        host_get(&format!("http://{ip}/"), None)
    };
    let kubeproxy_log = c.log("kubeproxy");
    let tail: Vec<&str> = kubeproxy_log.lines().rev().take(15).collect();
    format!(
        "route: {}\nnat rules naming it and the hooks:\n{}\nnftables rules naming it:\n{}\n\
         conntrack entries to it:\n{}\nkubeproxies on this host:\n{}\nkubeproxy log (last lines, newest first):\n{}\n\
         the same request 1 s later: {retry:?}",
        sh(&format!("ip route get {ip}")).1.trim(),
        sh(&format!("iptables-save -t nat | grep -E -e '{ip}' -e '^-A (OUTPUT|PREROUTING) '")).1,
        sh(&format!("nft list table ip kube-proxy 2>/dev/null | grep -F '{ip}'")).1,
        sh(&format!("conntrack -L -d {ip} 2>&1")).1,
        stdout("pgrep -a kubeproxy"),
        tail.join("\n"),
    )
}

/// `n` GETs of `url` from a pod in one exec: how many answers each body got.
fn spread(c: &Cluster, pod: &str, name: &str, url: &str, n: usize) -> BTreeMap<String, usize> {
    let (_, out) =
        in_pod(c, pod, name, &format!("for i in $(seq {n}); do timeout 5 wget -qO- {url} || echo FAILED; done"));
    let mut seen = BTreeMap::new();
    for l in out.lines() {
        *seen.entry(l.trim().to_string()).or_default() += 1;
    }
    seen
}

/// The pods of `selector` that are Ready: name → (IP, node).
fn ready_pods(c: &Cluster, selector: &str) -> BTreeMap<String, (String, String)> {
    let (_, out) = c.kubectl(&[
        "get",
        "pods",
        "-l",
        selector,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.podIP} {.spec.nodeName} {.metadata.deletionTimestamp} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
    ]);
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() == 5 && f[3].is_empty() && f[4] == "True")
                .then(|| (f[0].to_string(), (f[1].to_string(), f[2].to_string())))
        })
        .collect()
}

/// The addresses of the ready endpoints in the EndpointSlices of Service `svc`.
fn ready_endpoints(c: &Cluster, svc: &str) -> BTreeSet<String> {
    let (_, out) = c.kubectl(&[
        "get",
        "endpointslices",
        "-l",
        &format!("kubernetes.io/service-name={svc}"),
        "-o",
        "jsonpath={range .items[*].endpoints[*]}{.addresses[0]} {.conditions.ready}{\"\\n\"}{end}",
    ]);
    out.lines().filter_map(|l| l.strip_suffix(" true")).map(str::to_string).collect()
}

/// The proxy rules as the kernel lists them, without counters and client state.
fn rules(mode: &str) -> Vec<String> {
    if mode == "nftables" {
        // One entry per chain, map or set (nft lists them in creation order, which a restart
        // changes), each prefixed with its name so a duplicated rule shows as a repeated line.
        let mut blocks: Vec<Vec<String>> = Vec::new();
        for l in stdout("nft list table ip kube-proxy").lines().filter(|l| !l.contains(" expires ")) {
            let top = l.starts_with("\tchain ") || l.starts_with("\tmap ") || l.starts_with("\tset ");
            if top || blocks.is_empty() {
                blocks.push(Vec::new());
            }
            if let Some(b) = blocks.last_mut() {
                let name = b.first().cloned().unwrap_or_else(|| l.trim().to_string());
                if b.is_empty() {
                    b.push(l.trim().to_string());
                } else {
                    // Map elements one a line, whatever order and line breaks nft chose.
                    let t = l.trim().trim_start_matches("elements = {").trim_end_matches(',').trim_end_matches(" }");
                    for e in t.split(", ").map(str::trim).filter(|e| !e.is_empty()) {
                        b.push(format!("{name}: {e}"));
                    }
                }
            }
        }
        for b in blocks.iter_mut() {
            b[1..].sort();
        }
        blocks.sort();
        blocks.into_iter().flatten().filter(|l| !l.ends_with(": }")).collect()
    } else {
        // Each line with its table, so that a chain of the same name in two tables is no duplicate.
        let mut table = String::new();
        let mut out = Vec::new();
        for l in stdout("iptables-save").lines() {
            if let Some(t) = l.strip_prefix('*') {
                table = t.to_string();
            } else if l.contains("KUBE-") {
                let l = match l.find(" [") {
                    Some(i) if l.starts_with(':') => &l[..i],
                    _ => l,
                };
                out.push(format!("{table}: {l}"));
            }
        }
        out
    }
}

fn client_pod(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  nodeName: {node}\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n  - name: client\n    image: busybox\n    \
         imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"100000\"]\n"
    )
}

/// Everything of the scenario that needs a running cluster.
fn scenario(mode: &str) {
    let c = Cluster::up(mode);
    let m = manifests_dir();
    let examples = repo().join("examples");
    let (ok, out) = c.kubectl(&["get", "svc", "-n", "kube-system", "kube-dns", "-o", "jsonpath={.spec.clusterIP}"]);
    assert!(ok && out == DNS_IP, "the cluster DNS Service kube-system/kube-dns has cluster IP {DNS_IP}: {out}");

    // examples/ingress.yaml is 06-ingress.yaml with ingress-nginx's rewrite-target: busybox
    // httpd serves only /, so the backends must see / instead of /web or /other.
    for f in [
        m.join("03-deployment.yaml"),
        m.join("04-service.yaml"),
        examples.join("ingress.yaml"),
        examples.join("other.yaml"),
    ] {
        c.must(&["apply", "-f", f.to_str().unwrap()]);
    }
    let clients = ["client-node-1", "client-node-2"];
    for (pod, node) in clients.iter().zip(["node-1", "node-2"]) {
        let (ok, out) = c.kubectl_in(&["apply", "-f", "-"], Some(&client_pod(pod, node)));
        assert!(ok, "client pod: {out}");
    }

    let web = wait_for("3 web replicas Ready", WAIT, || {
        let p = ready_pods(&c, "app=web");
        if p.len() == 3 {
            Ok(p)
        } else {
            Err(format!("{p:?}\n{}", c.kubectl(&["get", "pods", "-o", "wide"]).1))
        }
    });
    let nodes: BTreeSet<&String> = web.values().map(|(_, n)| n).collect();
    assert_eq!(nodes.len(), 2, "the replicas run on both nodes: {web:?}");
    wait_for("the other pod and the client pods Ready", WAIT, || {
        let o = ready_pods(&c, "app=other").len();
        let (_, phases) =
            c.kubectl(&["get", "pods", "client-node-1", "client-node-2", "-o", "jsonpath={.items[*].status.phase}"]);
        if o == 1 && phases == "Running Running" {
            Ok(())
        } else {
            Err(format!("other ready: {o}, clients: {phases}"))
        }
    });
    let ip = c.must(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let node_ip =
        c.must(&["get", "node", "node-1", "-o", "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}"]);
    let web_names: BTreeSet<String> = web.keys().map(|n| format!("v1 {n}")).collect();
    let is_web = |body: &str| web_names.contains(body);

    // The pods' resolver and hosts files are the kubelet's.
    for pod in clients {
        let (_, resolv) = in_pod(&c, pod, "client", "cat /etc/resolv.conf");
        assert!(
            resolv.starts_with(&format!(
                "nameserver {DNS_IP}\nsearch default.svc.cluster.local svc.cluster.local cluster.local"
            )) && resolv.ends_with("options ndots:5\n"),
            "{pod}'s resolv.conf:\n{resolv}"
        );
        let pod_ip = c.must(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"]);
        let (_, hosts) = in_pod(&c, pod, "client", "cat /etc/hosts");
        assert!(
            hosts.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"),
            "{pod}'s hosts:\n{hosts}"
        );
        assert!(hosts.contains(&format!("\n{pod_ip}\t{pod}\n")), "{pod}'s hosts has its IP and name:\n{hosts}");
    }

    // The first answer may wait for kubeproxy's first sync of the Service.
    wait_for("the Service answering from a pod by name", WAIT, || {
        pod_get(&c, clients[0], "client", "http://web.default.svc.cluster.local/")
    });

    // From the host: cluster IP, node port, the DNS (through its cluster IP), the Ingress.
    for url in [format!("http://{ip}/"), format!("http://{node_ip}:30080/"), "http://127.0.0.1:30080/".to_string()] {
        let body = host_get(&url, None).unwrap_or_else(|e| panic!("{e}\n{}", host_path_diag(&c, &ip)));
        assert!(is_web(&body), "{url} from the host answered {body:?}");
    }
    let (ok, out) = sh(&format!("busybox nslookup web.default.svc.cluster.local {DNS_IP}"));
    assert!(ok && out.contains(&format!("Address: {ip}\n")), "host: the cluster DNS answers the Service name:\n{out}");
    let (ok, out) = sh(&format!("busybox nslookup myservice.com {DNS_IP}"));
    assert!(
        ok && out.contains(&format!("Address: {node_ip}\n")),
        "host: the Ingress host resolves to the node:\n{out}"
    );
    // What a user waits for before using the Ingress: its ADDRESS (published once nginx
    // serves a configuration with it) and both backends answering on their cluster IPs
    // (nginx reaches them there, through the kubeproxy's rules).
    wait_for("the Ingress's ADDRESS", WAIT, || {
        let (_, addr) = c.kubectl(&["get", "ingress", "my-dns", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"]);
        if addr == node_ip {
            Ok(())
        } else {
            Err(format!("ADDRESS {addr:?}"))
        }
    });
    let other_ip = c.must(&["get", "svc", "other", "-o", "jsonpath={.spec.clusterIP}"]);
    wait_for("the other Service answering on its cluster IP", WAIT, || host_get(&format!("http://{other_ip}/"), None));
    // On failure: nginx's view, and the host's path to the Service nginx proxies to.
    let diag = || {
        format!(
            "nginx error.log:\n{}\nthe host's path to the other Service:\n{}",
            std::fs::read_to_string(c.home.join("ingress/error.log")).unwrap_or_default(),
            host_path_diag(&c, &other_ip)
        )
    };
    let body =
        host_get(&format!("http://{node_ip}/web"), Some("myservice.com")).unwrap_or_else(|e| panic!("{e}\n{}", diag()));
    assert!(is_web(&body), "host: myservice.com/web reaches web: {body:?}");
    let body = host_get(&format!("http://{node_ip}/other"), Some("myservice.com"))
        .unwrap_or_else(|e| panic!("{e}\n{}", diag()));
    assert!(body.starts_with("other other-"), "host: myservice.com/other reaches other: {body:?}");

    // From a pod on each node.
    for pod in clients {
        for url in [
            format!("http://{ip}/"),
            format!("http://{node_ip}:30080/"),
            "http://web.default.svc.cluster.local/".to_string(),
            "http://web/".to_string(),
            "http://web.default/".to_string(),
        ] {
            let body = pod_get(&c, pod, "client", &url).unwrap();
            assert!(is_web(&body), "{url} from {pod} answered {body:?}");
        }
        let body = pod_get(&c, pod, "client", "http://myservice.com/web").unwrap();
        assert!(is_web(&body), "myservice.com/web from {pod}: {body:?}");
        let body = pod_get(&c, pod, "client", "http://myservice.com/other").unwrap();
        assert!(body.starts_with("other other-"), "myservice.com/other from {pod}: {body:?}");
        let (_, out) = in_pod(&c, pod, "client", "nslookup myservice.com");
        assert!(out.contains(&format!("Address: {node_ip}\n")), "{pod}: myservice.com is the node:\n{out}");
        let (_, out) = in_pod(&c, pod, "client", "nslookup kubernetes");
        assert!(
            out.contains("Name:\tkubernetes.default.svc.cluster.local\nAddress: 10.96.0.1\n"),
            "{pod}: kubernetes through the search path:\n{out}"
        );
    }

    // 30 requests spread over all 3 replicas: from a client pod, and from a replica itself
    // (hairpin: it reaches itself through its own Service).
    let seen = spread(&c, clients[1], "client", "http://web/", 30);
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), web_names, "30 requests from {}: {seen:?}", clients[1]);
    let replica = web.keys().next().unwrap().clone();
    let seen = spread(&c, &replica, "web", &format!("http://{ip}/"), 30);
    assert_eq!(
        seen.keys().cloned().collect::<BTreeSet<_>>(),
        web_names,
        "30 requests from replica {replica}: {seen:?}"
    );

    // Scale down: once the EndpointSlice lists only the remaining pod and kubeproxy synced
    // it, no request reaches a removed pod.
    c.must(&["scale", "deployment", "web", "--replicas=1"]);
    let remaining = wait_for("one ready web endpoint", WAIT, || {
        let eps = ready_endpoints(&c, "web");
        let pods = ready_pods(&c, "app=web");
        if eps.len() == 1 && pods.len() == 1 {
            Ok((pods, now_secs()))
        } else {
            Err(format!("endpoints {eps:?}, ready pods {pods:?}"))
        }
    });
    let (pods, seen_at) = remaining;
    let (name, (pod_ip, _)) = pods.into_iter().next().unwrap();
    assert_eq!(ready_endpoints(&c, "web"), BTreeSet::from([pod_ip.clone()]));
    c.wait_synced_after(seen_at, 2.0);
    let only = BTreeMap::from([(format!("v1 {name}"), 20)]);
    assert_eq!(spread(&c, clients[0], "client", "http://web/", 20), only, "after scaling down, only {name} answers");
    let from_host: BTreeSet<String> = (0..10)
        .map(|_| {
            host_get(&format!("http://{ip}/"), None).unwrap_or_else(|e| panic!("{e}\n{}", host_path_diag(&c, &ip)))
        })
        .collect();
    assert_eq!(from_host, BTreeSet::from([format!("v1 {name}")]), "after scaling down, from the host");

    // Scale up: all three answer again.
    c.must(&["scale", "deployment", "web", "--replicas=3"]);
    let (web, seen_at) = wait_for("three ready web endpoints", WAIT, || {
        let eps = ready_endpoints(&c, "web");
        let pods = ready_pods(&c, "app=web");
        if eps.len() == 3 && pods.len() == 3 {
            Ok((pods, now_secs()))
        } else {
            Err(format!("endpoints {eps:?}, ready pods {pods:?}"))
        }
    });
    c.wait_synced_after(seen_at, 2.0);
    let web_names: BTreeSet<String> = web.keys().map(|n| format!("v1 {n}")).collect();
    // A new pod may get a removed pod's IP, and the host's neighbour entry for it can be
    // stale for a few seconds: wait (bounded) until 30 requests reach all three, no failure.
    wait_for("30 requests spread over the 3 replicas after scaling up", Duration::from_secs(60), || {
        let seen = spread(&c, clients[1], "client", "http://web/", 30);
        if seen.keys().cloned().collect::<BTreeSet<_>>() == web_names {
            Ok(())
        } else {
            Err(format!("{seen:?}, want {web_names:?}"))
        }
    });

    // kubeproxy killed (like a crash): the rules stay and traffic keeps flowing.
    let before = rules(mode);
    assert!(!before.is_empty(), "{mode} rules present");
    let cmdline = c.kubeproxy_cmdline();
    assert!(cmdline.iter().any(|a| a == "--metrics-bind-address"), "kubeproxy's command line: {cmdline:?}");
    let conf = c.home.join("ingress/nginx.conf");
    let nginx_masters = || {
        let out =
            Command::new("pgrep").args(["-f", "--", &format!("master process nginx -c {}", conf.display())]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).lines().count()).unwrap_or(0)
    };
    assert_eq!(nginx_masters(), 1, "one nginx runs for the Ingress");
    let killed = c.kubeproxy_pid();
    let restarted_at = now_secs();
    sh(&format!("kill -9 {killed}"));
    for pod in clients {
        let body = pod_get(&c, pod, "client", &format!("http://{ip}/")).unwrap();
        assert!(web_names.contains(&body), "{pod} reaches the cluster IP while kubeproxy is gone: {body:?}");
    }
    // The supervisor starts it again, exactly as the script started it: the same rules,
    // nothing duplicated, the running nginx adopted.
    wait_for("kubeproxy restarted by the supervisor", Duration::from_secs(30), || {
        match e2e::cluster::component_pid(&c.home, "kubeproxy") {
            Some(p) if p != killed => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    c.wait_synced_after(restarted_at, 0.0);
    let (found, out) = c.kubectl(&["get", "endpointslice", "-n", "kube-system", "kube-dns-node-1"]);
    assert!(found, "the DNS endpoint is published: {out}");
    let after = rules(mode);
    assert_eq!(after, before, "{mode} rules after a restart are the same as before");
    let mut unique = after.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), after.len(), "no duplicated rules after a restart:\n{}", after.join("\n"));
    let seen = spread(&c, clients[0], "client", "http://web/", 30);
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), web_names, "after the restart: {seen:?}");
    let body = pod_get(&c, clients[0], "client", "http://myservice.com/other").unwrap();
    assert!(body.starts_with("other other-"), "the Ingress after the restart: {body:?}");
    assert_eq!(nginx_masters(), 1, "the restarted kubeproxy adopted nginx:\n{}", c.log("kubeproxy"));

    // Stopped (SIGTERM, as the supervisor stops a component it no longer runs): nginx goes
    // with it; --cleanup removes every rule.
    let pid = c.kubeproxy_pid();
    std::fs::remove_file(c.home.join("supervisor/kubeproxy.json")).unwrap();
    let sup = std::fs::read_to_string(c.home.join("supervisor/supervisor.lock")).unwrap();
    sh(&format!("kill -HUP {}", sup.trim()));
    wait_for("kubeproxy stopped", Duration::from_secs(15), || {
        let (_, st) = sh(&format!("ps -o stat= -p {pid}"));
        if st.trim().is_empty() || st.starts_with('Z') {
            Ok(())
        } else {
            Err(st)
        }
    });
    assert_eq!(nginx_masters(), 0, "nginx stopped with kubeproxy:\n{}", c.log("kubeproxy"));
    let (found, out) = c.kubectl(&["get", "endpointslice", "-n", "kube-system", "kube-dns-node-1"]);
    assert!(!found && out.contains("NotFound"), "a stopped kubeproxy withdraws its DNS endpoint: {out}");
    let (ok, out) = sh(&format!("{} --cleanup", kubeproxy_bin().display()));
    assert!(ok, "kubeproxy --cleanup: {out}");
    assert!(!stdout("iptables-save").contains("KUBE-"), "iptables rules left after --cleanup");
    assert!(!sh("nft list table ip kube-proxy").0, "nftables table left after --cleanup");
}

#[test]
fn services_dns_and_ingress_from_pods_in_iptables_and_nftables_mode() {
    if !require_docker() || !prerequisites(&["ip", "curl", "busybox", "iptables-restore", "nft", "nginx"]) {
        return;
    }
    assert!(kubectl_bin().exists() || std::env::var("CI").as_deref() != Ok("true"), "the official kubectl is missing");
    // Rules, node bridges, port 80 and 10.96.0.10 belong to the whole host.
    let _host = e2e::host_cluster_lock();
    for mode in ["iptables", "nftables"] {
        scenario(mode);
        // down --purge (on drop) removed everything: nothing of the cluster is left.
        for node in ["node-1", "node-2"] {
            let left = stdout(&format!("{} ps -aq --filter label=minik8s.io/node={node}", docker_bin()));
            assert!(left.trim().is_empty(), "containers of {node} left behind after {mode}: {left}");
            let br = e2e::kubelet::bridge_name(node);
            assert!(!sh(&format!("ip link show {br}")).0, "bridge {br} left behind after {mode}");
        }
        assert!(!stdout("iptables-save").contains("KUBE-SVC-"), "Service rules left behind after {mode}");
    }
}
