//! NetworkPolicies enforced on real pods: `scripts/cluster up --nodes 2 --network-backend
//! vxlan` (real kubelets on Docker, kubeproxy in its default nftables mode), pods in two namespaces on both nodes, the
//! official kubectl applying the policies and running every request from inside a pod with
//! `kubectl exec … wget`. The scenarios are those of Kubernetes' NetworkPolicy e2e suite,
//! in our own words:
//! - no policy: every pod reaches every pod;
//! - default deny ingress: nobody reaches the namespace's pods, by pod IP or through their
//!   Service, while their readiness probes (from the node) keep passing;
//! - allow from a namespace (namespaceSelector), on top of the deny: policies add up;
//! - allow from some pods to a named port: the port, and no other; the policy updated to
//!   another named port follows;
//! - ipBlock with an except;
//! - deleting the policies restores the traffic;
//! - egress deny with DNS allowed: names resolve, nothing else leaves; then egress to a named
//!   port of the peer pods, through their Service too.
//!
//! How long a change takes to show is printed (apply → first request that sees it, a
//! `kubectl exec` included), not asserted. One test function: the host's nftables and node
//! bridges belong to the whole host.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use e2e::cluster::{script, sh_stdout, Down};
use e2e::kubelet::require_docker;
use e2e::kubeproxy::prerequisites;
use e2e::{free_port, kubectl_at, kubectl_bin};

const WAIT: Duration = Duration::from_secs(120);

struct Cluster {
    home: PathBuf,
}

impl Cluster {
    fn kubectl(&self, args: &[&str], input: Option<&str>) -> (bool, String) {
        kubectl_at(&self.home.join("kubeconfig"), args, input)
    }

    fn must(&self, args: &[&str]) -> String {
        let (ok, out) = self.kubectl(args, None);
        assert!(ok, "kubectl {args:?}:\n{out}");
        out
    }

    fn apply(&self, yaml: &str) {
        let (ok, out) = self.kubectl(&["apply", "-f", "-"], Some(yaml));
        assert!(ok, "kubectl apply:\n{out}\n{yaml}");
    }

    /// Whether `ns/pod` gets an answer from `url`: within 2 s when it is expected to, within
    /// 1 s when it is not (a pod on this host answers in milliseconds; a dropped connection
    /// only ever times out, so waiting longer would prove nothing more).
    fn reaches(&self, from: (&str, &str), url: &str, expected: bool) -> bool {
        let cmd = format!("timeout {} wget -qO- {url}", if expected { 2 } else { 1 });
        self.kubectl(&["exec", "-n", from.0, from.1, "--", "sh", "-c", &cmd], None).0
    }

    /// Wait until `ns/pod` reaching `url` is `want`; how long that took.
    fn until(&self, from: (&str, &str), url: &str, want: bool) -> Duration {
        let start = Instant::now();
        loop {
            if self.reaches(from, url, want) == want {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < WAIT,
                "{}/{} {} {url} within {WAIT:?}\nkubeproxy log tail:\n{}\nnft:\n{}",
                from.0,
                from.1,
                if want { "never reached" } else { "kept reaching" },
                self.log_tail("kubeproxy"),
                sh_stdout("nft list table ip minik8s-netpol 2>&1")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Assert that `ns/pod` reaching `url` is `want`, now and stably (twice).
    fn expect(&self, from: (&str, &str), url: &str, want: bool) {
        for _ in 0..2 {
            assert_eq!(
                self.reaches(from, url, want),
                want,
                "{}/{} → {url}\nnft:\n{}",
                from.0,
                from.1,
                sh_stdout("nft list table ip minik8s-netpol 2>&1")
            );
        }
    }

    fn log_tail(&self, component: &str) -> String {
        let log = std::fs::read_to_string(self.home.join(format!("logs/{component}.log"))).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn pod_ip(&self, ns: &str, pod: &str) -> String {
        self.must(&["get", "pod", "-n", ns, pod, "-o", "jsonpath={.status.podIP}"]).trim().to_string()
    }
}

const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: np-a, labels: {team: a}}
---
apiVersion: v1
kind: Namespace
metadata: {name: np-b, labels: {team: b}}
---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: np-a}
spec:
  selector: {app: server}
  ports: [{port: 80, targetPort: http}]
"#;

fn server(name: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: np-a, labels: {{app: server}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: server
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www && hostname > /www/index.html && httpd -p 9090 -h /www && exec httpd -f -p 8080 -h /www"]
    ports:
    - {{name: http, containerPort: 8080}}
    - {{name: metrics, containerPort: 9090}}
    readinessProbe:
      httpGet: {{port: http}}
      periodSeconds: 1
      failureThreshold: 2
"#
    )
}

fn client(ns: &str, name: &str, app: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {{app: {app}}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sleep", "100000"]
"#
    )
}

const DENY_INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny-ingress, namespace: np-a}
spec:
  podSelector: {}
  policyTypes: [Ingress]
"#;

const FROM_TEAM_B: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-team-b, namespace: np-a}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: b}}}]
"#;

fn clients_to(port: &str) -> String {
    format!(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: clients-to-port, namespace: np-a}}
spec:
  podSelector: {{matchLabels: {{app: server}}}}
  ingress:
  - from: [{{podSelector: {{matchLabels: {{app: client}}}}}}]
    ports: [{{port: {port}}}]
"#
    )
}

fn from_block(cidr: &str, except: &str) -> String {
    format!(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: from-block, namespace: np-a}}
spec:
  podSelector: {{}}
  ingress:
  - from: [{{ipBlock: {{cidr: "{cidr}", except: ["{except}"]}}}}]
"#
    )
}

/// Egress to DNS only: port 53 — and the cluster DNS server's own port, where
/// `scripts/cluster` found 53 taken on this host (the filter sees the port after the DNAT).
fn egress_dns_only(dns_port: &str) -> String {
    format!(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: dns-only, namespace: np-b}}
spec:
  podSelector: {{}}
  policyTypes: [Egress]
  egress:
  - ports: [{{protocol: UDP, port: 53}}, {{protocol: TCP, port: 53}}, {{protocol: UDP, port: {dns_port}}}, {{protocol: TCP, port: {dns_port}}}]
"#
    )
}

const EGRESS_TO_SERVERS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: to-servers, namespace: np-b}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchLabels: {team: a}}, podSelector: {matchLabels: {app: server}}}]
    ports: [{port: http}]
"#;

fn scenario(c: &Cluster) {
    let mut yaml = PODS.to_string();
    for doc in [
        server("server-1", "node-1"),
        server("server-2", "node-2"),
        client("np-a", "client", "client", "node-1"),
        client("np-a", "other", "other", "node-2"),
        client("np-b", "client", "client", "node-2"),
    ] {
        yaml.push_str("---\n");
        yaml.push_str(&doc);
    }
    c.apply(&yaml);
    let (ok, out) = c.kubectl(&["wait", "--for=condition=Ready", "pod", "--all", "-n", "np-a", "--timeout=120s"], None);
    assert!(ok, "np-a pods Ready: {out}");
    let (ok, out) = c.kubectl(&["wait", "--for=condition=Ready", "pod", "--all", "-n", "np-b", "--timeout=120s"], None);
    assert!(ok, "np-b pods Ready: {out}");
    let s1 = format!("http://{}:8080/", c.pod_ip("np-a", "server-1"));
    let s2 = format!("http://{}:8080/", c.pod_ip("np-a", "server-2"));
    let s1_metrics = format!("http://{}:9090/", c.pod_ip("np-a", "server-1"));
    let svc = "http://server.np-a.svc.cluster.local/";
    let (a_client, a_other, b_client) = (("np-a", "client"), ("np-a", "other"), ("np-b", "client"));
    let mut timings: Vec<(&str, Duration)> = Vec::new();

    // No policy: everyone reaches everyone (the Service too; also waits for the rules).
    for from in [a_client, a_other, b_client] {
        c.until(from, &s1, true);
        c.until(from, &s2, true);
    }
    c.until(b_client, svc, true);
    c.expect(a_client, &s1_metrics, true);

    // Default deny ingress in np-a.
    c.apply(DENY_INGRESS);
    timings.push(("default deny", c.until(b_client, &s1, false)));
    c.expect(b_client, &s2, false);
    c.expect(a_client, &s1, false);
    c.expect(a_other, &s2, false);
    c.expect(b_client, svc, false);
    // The node's own probes are not policed: the servers stay Ready.
    std::thread::sleep(Duration::from_secs(4));
    let ready = c.must(&[
        "get",
        "pods",
        "-n",
        "np-a",
        "-l",
        "app=server",
        "-o",
        "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
    ]);
    assert_eq!(ready.trim(), "True True", "servers stay Ready under a default deny");

    // Allow from namespace np-b (by its labels), on top of the deny.
    c.apply(FROM_TEAM_B);
    timings.push(("allow from a namespace", c.until(b_client, &s1, true)));
    c.expect(b_client, &s2, true);
    c.expect(b_client, svc, true);
    c.expect(a_client, &s1, false);
    c.expect(a_other, &s1, false);

    // Allow pods labelled app=client (of np-a: a podSelector alone is the policy's
    // namespace) to the named port http only.
    c.kubectl(&["delete", "networkpolicy", "-n", "np-a", "from-team-b"], None);
    c.apply(&clients_to("http"));
    timings.push(("allow from pods to a named port", c.until(a_client, &s1, true)));
    c.expect(a_client, &s2, true);
    c.expect(a_client, &s1_metrics, false);
    c.expect(a_other, &s1, false);
    c.expect(b_client, &s1, false);
    // The same policy updated to the other named port.
    c.apply(&clients_to("metrics"));
    timings.push(("policy updated", c.until(a_client, &s1_metrics, true)));
    c.expect(a_client, &s1, false);

    // ipBlock: the pod network less one pod.
    c.kubectl(&["delete", "networkpolicy", "-n", "np-a", "clients-to-port"], None);
    let other_ip = c.pod_ip("np-a", "other");
    let octets: Vec<&str> = other_ip.split('.').collect();
    let block = format!("{}.{}.0.0/16", octets[0], octets[1]);
    c.apply(&from_block(&block, &format!("{other_ip}/32")));
    timings.push(("ipBlock except", c.until(a_client, &s1, true)));
    c.expect(b_client, &s2, true);
    c.expect(a_other, &s1, false);

    // Deleting the policies restores the traffic.
    c.must(&["delete", "networkpolicy", "-n", "np-a", "--all"]);
    timings.push(("policies deleted", c.until(a_other, &s1, true)));
    c.expect(a_other, &s2, true);

    // Egress deny in np-b with DNS allowed: names resolve, nothing else leaves.
    let dns_port = c.must(&[
        "get",
        "endpointslices",
        "-n",
        "kube-system",
        "-l",
        "kubernetes.io/service-name=kube-dns",
        "-o",
        "jsonpath={.items[0].ports[0].port}",
    ]);
    c.apply(&egress_dns_only(dns_port.trim()));
    timings.push(("egress deny", c.until(b_client, &s1, false)));
    let (ok, out) = c.kubectl(
        &["exec", "-n", "np-b", "client", "--", "sh", "-c", "timeout 5 nslookup server.np-a.svc.cluster.local"],
        None,
    );
    assert!(ok, "DNS is allowed: {out}");
    c.expect(b_client, svc, false);
    c.expect(a_client, &s1, true);
    // Egress to the servers' named port http, through their Service too.
    c.apply(EGRESS_TO_SERVERS);
    timings.push(("egress to a named port", c.until(b_client, &s1, true)));
    c.expect(b_client, svc, true);
    c.expect(b_client, &s1_metrics, false);
    c.must(&["delete", "networkpolicy", "-n", "np-b", "--all"]);
    timings.push(("egress policies deleted", c.until(b_client, &s1_metrics, true)));

    for (what, took) in &timings {
        println!("network policy change → first request that shows it: {what}: {took:?}");
    }
}

#[test]
fn network_policies_isolate_pods_as_kubernetes_specifies() {
    if !require_docker() || !prerequisites(&["ip", "busybox", "nft"]) {
        return;
    }
    assert!(kubectl_bin().exists() || std::env::var("CI").as_deref() != Ok("true"), "the official kubectl is missing");
    let _host = e2e::host_cluster_lock();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("state");
    let port = free_port();
    // The VXLAN backend: its device and pod MTU on real Docker pods (the overlay's traffic
    // between machines is the overlay suite's).
    let (ok, out) = script(&home, port, &["up", "--nodes", "2", "--network-backend", "vxlan"]);
    let down = Down(&home, port);
    assert!(ok, "cluster up failed:\n{out}");
    let c = Cluster { home: home.clone() };
    let device = sh_stdout("ip -d link show mk8s.vxlan");
    assert!(device.contains("vxlan id 1") && device.contains("dstport 8472"), "the VXLAN device: {device}");
    let mtu = |s: &str| s.split_whitespace().skip_while(|w| *w != "mtu").nth(1).and_then(|m| m.parse::<u32>().ok());
    let device_mtu = mtu(&device).expect("the device's MTU");
    scenario(&c);
    let (ok, pod_link) = c.kubectl(&["exec", "-n", "np-a", "client", "--", "ip", "link", "show", "eth0"], None);
    assert!(ok, "{pod_link}");
    assert_eq!(mtu(&pod_link), Some(device_mtu), "pods get the overlay's MTU: {pod_link}");
    drop(down);
    let left = sh_stdout("nft list tables");
    assert!(!left.contains("minik8s-netpol"), "down --purge leaves the policy table behind: {left}");
}
