//! The service mesh as a user runs it: `scripts/cluster up --mesh`, then the example
//! application of `examples/mesh/` applied with the official kubectl. Pods of the labelled
//! namespace get the sidecar from pilot's injection webhook and their traffic captured by
//! the kubelet; Istio's VirtualServices and DestinationRules, turned into Envoy xDS by pilot,
//! decide where requests go. Checked from inside a meshed pod with real HTTP clients:
//! 3,000 requests through an 80/20 split land within ±3% of the weights, `/v2/` URLs and a
//! tester's header reach v2 only, retries hide a backend failing every other request, an
//! outlier is ejected, plain TCP passes, a pod outside the mesh still calls a meshed
//! service, a canary moving 100/0 → 90/10 → 50/50 → 0/100 loses no request, routing
//! objects pilot refuses leave traffic on the last good configuration, and the sidecars
//! count requests with Istio's metric names.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::cluster::{repo, script as cluster, Down};
use e2e::kubelet::require_docker;
use e2e::{free_port, host_cluster_lock};

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    e2e::kubectl_at(kubeconfig, args, stdin)
}

struct Mesh {
    home: PathBuf,
    kubeconfig: PathBuf,
    port: u16,
}

impl Mesh {
    fn k(&self, args: &[&str]) -> String {
        let (ok, out) = kubectl(&self.kubeconfig, args, None);
        assert!(ok, "kubectl {args:?}: {out}\n{}", self.logs());
        out
    }

    fn apply_file(&self, name: &str) {
        let path = repo().join("examples/mesh").join(name);
        self.k(&["apply", "-f", &path.display().to_string()]);
    }

    fn apply(&self, yaml: &str) -> (bool, String) {
        kubectl(&self.kubeconfig, &["apply", "-f", "-"], Some(yaml))
    }

    /// `sh -c SCRIPT` in the `sleep` container of a meshed (or `ns`'s) caller.
    fn sh_in(&self, ns: &str, script: &str) -> String {
        let (ok, out) = kubectl(
            &self.kubeconfig,
            &["-n", ns, "exec", "deploy/sleep", "-c", "sleep", "--", "sh", "-c", script],
            None,
        );
        assert!(ok, "exec {script:?}: {out}");
        out
    }

    fn sh(&self, script: &str) -> String {
        self.sh_in("bookshop", script)
    }

    fn logs(&self) -> String {
        let (_, pilot) = cluster(&self.home, self.port, &["logs", "pilot"]);
        let tail: Vec<&str> = pilot.lines().rev().take(30).collect();
        format!("pilot log (last lines, newest first):\n{}", tail.join("\n"))
    }

    fn wait_for(&self, what: &str, secs: u64, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !f() {
            assert!(Instant::now() < deadline, "{what}: not within {secs}s\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// `n` requests with busybox wget; the bodies (or `FAIL`), one per line.
fn calls(n: usize, args: &str, url: &str) -> String {
    // (busybox's `wget -T` crashes; `timeout` bounds each request instead.)
    format!("i=0; while [ $i -lt {n} ]; do timeout 5 wget -qO- {args} {url} 2>/dev/null || echo FAIL; i=$((i+1)); done")
}

fn count(out: &str, needle: &str) -> usize {
    out.lines().filter(|l| l.trim() == needle).count()
}

/// A caller in a namespace without injection.
const OUTSIDE: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: outside}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: sleep, namespace: outside}
spec:
  selector: {matchLabels: {app: sleep}}
  template:
    metadata: {labels: {app: sleep}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {name: sleep, image: busybox, imagePullPolicy: IfNotPresent, command: [sleep, "1000000"]}
"#;

const CANARY: &str = r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookshop}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews, subset: v1}
      weight: V1
    - destination: {host: reviews, subset: v2}
      weight: V2
"#;

#[test]
fn mesh_routing_resilience_and_canary_with_the_official_kubectl() {
    let _lock = host_cluster_lock();
    if !require_docker() {
        return;
    }
    let home = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let (ok, out) = cluster(home.path(), port, &["up", "--mesh"]);
    let _down = Down(home.path(), port);
    assert!(ok, "up --mesh: {out}");
    assert!(out.contains("Mesh: pilot at"), "{out}");
    let m = Mesh { home: home.path().to_path_buf(), kubeconfig: home.path().join("kubeconfig"), port };

    // Istio's CRDs are served once pilot runs; the injector is registered.
    m.wait_for("Istio's CRDs", 60, || {
        kubectl(&m.kubeconfig, &["get", "crd", "virtualservices.networking.istio.io"], None).0
    });
    let hooks = m.k(&["get", "mutatingwebhookconfigurations", "-o", "name"]);
    assert!(hooks.contains("istio-sidecar-injector"), "{hooks}");

    m.apply_file("app.yaml");
    m.apply_file("destination-rules.yaml");
    m.k(&["-n", "bookshop", "wait", "--for=condition=Available", "deployment", "--all", "--timeout=240s"]);

    // Every pod of the namespace got the sidecar, as a second container, with the mark the
    // kubelet captured its traffic by.
    let pods = m.k(&[
        "-n",
        "bookshop",
        "get",
        "pods",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.spec.containers[*].name} {.metadata.annotations.sidecar\.istio\.io/status}{"\n"}{end}"#,
    ]);
    for line in pods.lines().filter(|l| !l.trim().is_empty()) {
        assert!(line.contains("istio-proxy") && line.contains("containers"), "not injected: {line}");
    }

    m.apply_file("reviews-routes.yaml");
    m.apply_file("resilience.yaml");
    // The routes are in force once /v2/ URLs keep reaching v2.
    m.wait_for("the reviews routes", 90, || {
        let out = m.sh(&calls(10, "", "http://reviews:9080/v2/"));
        count(&out, "reviews v2") == 10
    });

    // URL and header routes.
    let v2_urls = m.sh(&calls(30, "", "http://reviews:9080/v2/"));
    assert_eq!(count(&v2_urls, "reviews v2"), 30, "{v2_urls}");
    let testers = m.sh(&calls(30, "--header 'end-user: tester'", "http://reviews:9080/"));
    assert_eq!(count(&testers, "reviews v2"), 30, "{testers}");

    // The 80/20 split, over 3,000 requests.
    let split = m.sh(&calls(3000, "", "http://reviews:9080/"));
    let (v1, v2, fail) = (count(&split, "reviews v1"), count(&split, "reviews v2"), count(&split, "FAIL"));
    assert_eq!(fail, 0, "failed requests in the split");
    let share = v2 as f64 / (v1 + v2) as f64;
    assert!((0.17..=0.23).contains(&share), "v2 got {v2} of {} ({share:.3}), want 0.20 ± 0.03", v1 + v2);

    // Retries hide a backend that fails every other request.
    let flaky = m.sh(&calls(40, "", "http://flaky/cgi-bin/call"));
    assert_eq!(count(&flaky, "flaky ok"), 40, "retries did not hide the failures:\n{flaky}");

    // The broken backend of `outlier` is ejected after its first 5xx (no retries there).
    m.sh(&calls(6, "", "http://outlier/cgi-bin/call"));
    let outlier = m.sh(&calls(40, "", "http://outlier/cgi-bin/call"));
    assert_eq!(count(&outlier, "good"), 40, "the outlier was not ejected:\n{outlier}");

    // Plain TCP passes through both sidecars.
    let tcp = m.sh("timeout 5 wget -qO- http://ratings:9090/");
    assert_eq!(tcp.trim(), "ratings 5 stars");

    // A pod outside the mesh calls a meshed service (the server's sidecar takes it inbound).
    let (ok, out) = m.apply(OUTSIDE);
    assert!(ok, "{out}");
    m.k(&["-n", "outside", "wait", "--for=condition=Available", "deployment/sleep", "--timeout=120s"]);
    let outside_pods = m.k(&["-n", "outside", "get", "pods", "-o", "jsonpath={.items[*].spec.containers[*].name}"]);
    assert!(!outside_pods.contains("istio-proxy"), "{outside_pods}");
    let from_outside = m.sh_in("outside", &calls(10, "", "http://reviews.bookshop:9080/"));
    assert_eq!(count(&from_outside, "FAIL"), 0, "{from_outside}");
    assert_eq!(count(&from_outside, "reviews v1") + count(&from_outside, "reviews v2"), 10, "{from_outside}");

    // The sidecars count what they carried, with Istio's names.
    let stats = m.sh("wget -qO- http://127.0.0.1:15090/stats/prometheus");
    assert!(
        stats.lines().any(|l| l.starts_with("istio_requests_total")
            && l.contains("response_code=\"200\"")
            && l.contains("destination_service=\"reviews.bookshop.svc.cluster.local\"")
            && l.contains("reporter=\"source\"")),
        "no istio_requests_total for reviews in the caller's sidecar:\n{stats}"
    );

    // A canary: weights move 100/0 → 90/10 → 50/50 → 0/100 while a caller keeps calling;
    // no request fails.
    let canary = |v1: u32, v2: u32| CANARY.replace("V1", &v1.to_string()).replace("V2", &v2.to_string());
    let (ok, out) = m.apply(&canary(100, 0));
    assert!(ok, "{out}");
    m.wait_for("100/0", 60, || count(&m.sh(&calls(20, "", "http://reviews:9080/")), "reviews v1") == 20);
    m.sh("rm -f /tmp/stop /tmp/canary; (while [ ! -f /tmp/stop ]; do timeout 5 wget -qO- http://reviews:9080/ 2>/dev/null || echo FAIL; done >/tmp/canary 2>&1 &) ; true");
    for (v1, v2) in [(90, 10), (50, 50), (0, 100)] {
        let (ok, out) = m.apply(&canary(v1, v2));
        assert!(ok, "{out}");
        std::thread::sleep(Duration::from_secs(4));
    }
    m.wait_for("0/100", 60, || count(&m.sh(&calls(20, "", "http://reviews:9080/")), "reviews v2") == 20);
    m.sh("touch /tmp/stop; sleep 2");
    let during = m.sh("cat /tmp/canary");
    assert_eq!(count(&during, "FAIL"), 0, "requests failed during the canary");
    assert!(count(&during, "reviews v1") > 0 && count(&during, "reviews v2") > 0, "{during}");

    // A rolling update of the serving version: requests never reach a pod that is going
    // away (its endpoint leaves the sidecars' configuration; the default retry policy
    // covers a connection refused meanwhile).
    m.sh("rm -f /tmp/stop /tmp/rollout; (while [ ! -f /tmp/stop ]; do timeout 5 wget -qO- http://reviews:9080/ 2>/dev/null || echo FAIL; done >/tmp/rollout 2>&1 &) ; true");
    m.k(&["-n", "bookshop", "rollout", "restart", "deployment/reviews-v2"]);
    m.k(&["-n", "bookshop", "rollout", "status", "deployment/reviews-v2", "--timeout=180s"]);
    std::thread::sleep(Duration::from_secs(5));
    m.sh("touch /tmp/stop; sleep 2");
    let during = m.sh("cat /tmp/rollout");
    assert_eq!(count(&during, "FAIL"), 0, "requests failed during the rolling update");
    assert!(count(&during, "reviews v2") > 10, "{during}");

    // Bad input: weights that do not sum to 100 and a regex that does not compile are refused
    // (by the schema or by pilot, with a condition on the object); traffic stays on 0/100.
    let bad_weights = canary(70, 20);
    let (applied, out) = m.apply(&bad_weights);
    if applied {
        m.wait_for("a condition on the VirtualService with bad weights", 30, || {
            let status = m.k(&["-n", "bookshop", "get", "virtualservice", "reviews", "-o", "jsonpath={.status}"]);
            status.contains("100") || status.contains("weight")
        });
    } else {
        assert!(out.contains("weight"), "{out}");
    }
    let bad_regex = r#"apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: broken-regex, namespace: bookshop}
spec:
  hosts: [ratings]
  http:
  - match: [{uri: {regex: "(unclosed"}}]
    route: [{destination: {host: ratings}}]
"#;
    let (applied, out) = m.apply(bad_regex);
    if applied {
        m.wait_for("a condition on the VirtualService with a bad regex", 30, || {
            let status = m.k(&["-n", "bookshop", "get", "virtualservice", "broken-regex", "-o", "jsonpath={.status}"]);
            status.contains("regex")
        });
    } else {
        assert!(out.contains("regex"), "{out}");
    }
    std::thread::sleep(Duration::from_secs(2));
    let after = m.sh(&calls(20, "", "http://reviews:9080/"));
    assert_eq!(count(&after, "reviews v2"), 20, "traffic left the last good configuration:\n{after}");
    let tcp = m.sh("timeout 5 wget -qO- http://ratings:9090/");
    assert_eq!(tcp.trim(), "ratings 5 stars");
}
