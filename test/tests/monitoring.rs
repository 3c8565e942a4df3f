//! Monitoring as a user gets it: `scripts/cluster up --nodes 2 --monitoring` runs Debian's
//! real Prometheus, which finds every target through our API (its client-go Kubernetes
//! discovery) and scrapes them with its own identity. Checked through Prometheus' HTTP API:
//! every component, kubelet and cAdvisor endpoint, kube-state-metrics and the pods that ask
//! for it are `up == 1`; a pod whose annotation names a port it does not serve is `up == 0`
//! and nothing else breaks; a deleted pod leaves the targets and a new node joins them; a
//! CPU-burning pod's `rate(container_cpu_usage_seconds_total)` agrees with `kubectl top`;
//! `kube_deployment_status_replicas_available` follows a scale; the crash-loop alert
//! fires for a pod that exits every few seconds. The shipped configuration and rules pass
//! `promtool`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::cluster::{repo, script as cluster, Down};
use e2e::kubelet::{require_docker, Kubelet};
use e2e::{free_port, host_cluster_lock};
use serde_json::Value;

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    e2e::kubectl_at(kubeconfig, args, stdin)
}

/// Prometheus' HTTP API: the `data` of a GET of `path` with query parameters.
fn prom(url: &str, path: &str, params: &[(&str, &str)]) -> Value {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-G"]);
    for (k, v) in params {
        cmd.arg("--data-urlencode").arg(format!("{k}={v}"));
    }
    let out = cmd.arg(format!("{url}{path}")).output().expect("curl");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    doc["data"].clone()
}

/// The value of an instant query that yields one series, if it yields one.
fn scalar(url: &str, query: &str) -> Option<f64> {
    let data = prom(url, "/api/v1/query", &[("query", query)]);
    let result = data["result"].as_array()?;
    if result.len() != 1 {
        return None;
    }
    result[0]["value"][1].as_str()?.parse().ok()
}

/// The active targets as (job, pod-or-node-or-instance, health).
fn targets(url: &str) -> BTreeSet<(String, String, String)> {
    let data = prom(url, "/api/v1/targets", &[("state", "active")]);
    data["activeTargets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let l = &t["labels"];
            let who = l["pod"].as_str().or(l["node"].as_str()).or(l["instance"].as_str()).unwrap_or_default();
            (
                l["job"].as_str().unwrap_or_default().to_string(),
                who.to_string(),
                t["health"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>, context: impl Fn() -> String) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("{what}: not within {secs}s\n{}", context());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: burn}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: spin, image: busybox, imagePullPolicy: IfNotPresent, command: [sh, -c, 'while true; do :; done']}
---
# Asks to be scraped by annotation, on a path of its own: a CGI script that counts its calls.
apiVersion: v1
kind: Pod
metadata:
  name: exporter
  annotations: {prometheus.io/scrape: "true", prometheus.io/port: "8080", prometheus.io/path: /cgi-bin/metrics}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: busybox
    imagePullPolicy: IfNotPresent
    command:
    - sh
    - -c
    - |
      mkdir -p /www/cgi-bin
      printf '#!/bin/sh\nn=$(cat /tmp/n 2>/dev/null || echo 0); n=$((n+1)); echo $n >/tmp/n\nprintf "Content-Type: text/plain; version=0.0.4\\r\\n\\r\\n# TYPE demo_scrapes_total counter\\ndemo_scrapes_total %%s\\n" $n\n' >/www/cgi-bin/metrics
      chmod +x /www/cgi-bin/metrics
      exec httpd -f -p 8080 -h /www
---
# Asks to be scraped by label (monitor=prometheus) on its declared port's /metrics.
apiVersion: v1
kind: Pod
metadata:
  name: labelled
  labels: {monitor: prometheus}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: busybox
    imagePullPolicy: IfNotPresent
    ports: [{containerPort: 9100}]
    readinessProbe: {httpGet: {path: /metrics, port: 9100}, periodSeconds: 2}
    command: [sh, -c, 'mkdir -p /www && echo "demo_up 1" >/www/metrics && exec httpd -f -p 9100 -h /www']
---
# Names a port nothing listens on.
apiVersion: v1
kind: Pod
metadata:
  name: wrong-port
  annotations: {prometheus.io/scrape: "true", prometheus.io/port: "9999"}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: sleep, image: busybox, imagePullPolicy: IfNotPresent, command: [sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: crasher}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: fail, image: busybox, imagePullPolicy: IfNotPresent, command: [sh, -c, 'sleep 1; exit 1']}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {name: sleep, image: busybox, imagePullPolicy: IfNotPresent, command: [sleep, "3600"]}
"#;

#[test]
fn prometheus_discovers_and_scrapes_the_cluster() {
    if !require_docker() {
        return;
    }
    let ci = std::env::var("CI").as_deref() == Ok("true");
    for tool in ["prometheus", "promtool"] {
        if Command::new(tool).arg("--version").output().is_err() {
            assert!(!ci, "{tool} missing (scripts/deps test installs it)");
            return;
        }
    }
    let _host = host_cluster_lock();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("state");
    let port = free_port();
    let _down = Down(&home, port);

    // The shipped rules are valid (the configuration is checked by scripts/monitoring/config).
    let out = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(repo().join("scripts/monitoring/rules.yml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "promtool check rules: {}", String::from_utf8_lossy(&out.stderr));

    std::env::set_var("MINIK8S_SCRAPE_INTERVAL", "2s");
    let (ok, out) = cluster(&home, port, &["up", "--nodes", "2", "--monitoring"]);
    assert!(ok, "cluster up --monitoring failed:\n{out}");
    let url = std::fs::read_to_string(home.join("monitoring/url")).unwrap().trim().replace("0.0.0.0", "127.0.0.1");
    assert!(out.contains(&format!("Prometheus: {url}")), "up prints Prometheus' address:\n{out}");
    let promtool =
        Command::new("promtool").arg("check").arg("config").arg(home.join("monitoring/prometheus.yml")).output();
    assert!(promtool.is_ok_and(|o| o.status.success()), "promtool check config");
    let kc = home.join("kubeconfig");
    let logs = |c: &str| std::fs::read_to_string(home.join(format!("logs/{c}.log"))).unwrap_or_default();
    let tail = |c: &str| {
        let l = logs(c);
        let lines: Vec<&str> = l.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };

    let (ok, out) = kubectl(&kc, &["apply", "-f", "-"], Some(PODS));
    assert!(ok, "{out}");
    let (ok, out) = kubectl(
        &kc,
        &["wait", "--for=condition=Ready", "pod/burn", "pod/exporter", "pod/labelled", "--timeout=90s"],
        None,
    );
    assert!(ok, "{out}");

    // Every target, found through the API, healthy; the wrong port is the one down.
    let want_up: Vec<(&str, &str)> = vec![
        ("apiserver", ""),
        ("kubelet", "node-1"),
        ("kubelet", "node-2"),
        ("cadvisor", "node-1"),
        ("cadvisor", "node-2"),
        ("probes", "node-2"),
        ("kube-scheduler", ""),
        ("kube-controller-manager", ""),
        ("cloud-controller-manager", ""),
        ("kube-proxy", ""),
        ("kube-state-metrics", ""),
        ("pods", "exporter"),
        ("pods", "labelled"),
    ];
    let started = Instant::now();
    let found = wait_for(
        "every target up",
        60,
        || {
            let t = targets(&url);
            let all = want_up
                .iter()
                .all(|(job, who)| t.iter().any(|(j, w, h)| j == job && (who.is_empty() || w == who) && h == "up"));
            let wrong_down = t.iter().any(|(j, w, h)| j == "pods" && w == "wrong-port" && h == "down");
            // A target Prometheus found but has not scraped yet reads "unknown"; wait for its
            // first scrape rather than judge it.
            let all_scraped = t.iter().all(|(_, _, h)| h != "unknown");
            (all && wrong_down && all_scraped).then_some(t)
        },
        || format!("targets: {:#?}\nprometheus log:\n{}", targets(&url), tail("prometheus")),
    );
    eprintln!("every target up {:?} after the pods were Ready: {found:#?}", started.elapsed());
    // Nothing else is down.
    let down: Vec<_> = found.iter().filter(|(_, w, h)| h != "up" && w != "wrong-port").collect();
    assert!(down.is_empty(), "{down:?}");
    // The annotated pod's own series, scraped on its path.
    wait_for(
        "the exporter's series",
        30,
        || scalar(&url, r#"demo_scrapes_total{pod="exporter"}"#).filter(|v| *v > 1.0),
        || tail("prometheus"),
    );
    assert_eq!(scalar(&url, r#"up{job="pods",pod="wrong-port"}"#), Some(0.0));

    // CPU: Prometheus' rate of the cAdvisor counter agrees with kubectl top (both from the
    // kubelet's cgroup readings) within 20%.
    let rate_q = r#"rate(container_cpu_usage_seconds_total{job="cadvisor",pod="burn",container="spin"}[30s])"#;
    wait_for("the burning pod's CPU rate", 90, || scalar(&url, rate_q).filter(|v| *v > 0.2), || tail("prometheus"));
    let top = |_: ()| -> Option<f64> {
        let (ok, out) = kubectl(&kc, &["top", "pod", "burn", "--no-headers"], None);
        let cores = out.split_whitespace().nth(1)?.strip_suffix('m')?.parse::<f64>().ok()? / 1000.0;
        ok.then_some(cores)
    };
    let agree = wait_for(
        "rate() and kubectl top agree within 20%",
        60,
        || {
            let (a, b, c) = (top(())?, scalar(&url, rate_q)?, top(())?);
            let t = (a + c) / 2.0;
            ((b - t).abs() <= 0.2 * t).then_some((t, b))
        },
        || format!("top {:?}, rate {:?}", top(()), scalar(&url, rate_q)),
    );
    eprintln!("burn: kubectl top {:.3} cores, Prometheus rate {:.3} cores", agree.0, agree.1);
    for q in [
        r#"container_memory_working_set_bytes{job="cadvisor",pod="burn",container="spin"}"#,
        r#"sum(container_network_receive_bytes_total{pod="exporter"})"#,
        r#"container_fs_usage_bytes{pod="exporter",container="httpd"}"#,
    ] {
        wait_for(q, 90, || scalar(&url, q), || tail("prometheus"));
    }
    // The kubelet's other endpoints, fetched as Prometheus would with its certificate.
    let kubelet_of = |pod: &str| {
        let (ok, node) = kubectl(&kc, &["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"], None);
        assert!(ok, "{node}");
        let (ok, port) = kubectl(
            &kc,
            &["get", "node", &node, "-o", "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}"],
            None,
        );
        assert!(ok, "{port}");
        format!("https://127.0.0.1:{port}")
    };
    let (cert, key) = (home.join("monitoring/prometheus.crt"), home.join("monitoring/prometheus.key"));
    let auth = ["--cert", cert.to_str().unwrap(), "--key", key.to_str().unwrap()];
    let (status, body) = e2e::kubelet::https_get(&format!("{}/metrics/resource", kubelet_of("burn")), &auth).unwrap();
    assert_eq!(status, 200, "{body}");
    for series in [
        "node_cpu_usage_seconds_total ",
        "node_memory_working_set_bytes ",
        "pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"burn\"}",
    ] {
        assert!(body.contains(series), "/metrics/resource lacks {series}:\n{body}");
    }
    let labelled = kubelet_of("labelled");
    let (status, body) = e2e::kubelet::https_get(&format!("{labelled}/metrics/probes"), &auth).unwrap();
    let probed = body.lines().any(|l| {
        l.starts_with("prober_probe_total{")
            && ["pod=\"labelled\"", "probe_type=\"Readiness\"", "result=\"successful\""].iter().all(|w| l.contains(w))
    });
    assert!(status == 200 && probed, "{status} {body}");
    let (status, _) = e2e::kubelet::https_get(&format!("{labelled}/metrics/cadvisor"), &[]).unwrap();
    assert_eq!(status, 401, "the kubelet's metrics need credentials");

    // Object state follows a scale.
    let available = r#"kube_deployment_status_replicas_available{namespace="default",deployment="web"}"#;
    wait_for(
        "1 available replica",
        60,
        || scalar(&url, available).filter(|v| *v == 1.0),
        || tail("kube-state-metrics"),
    );
    let (ok, out) = kubectl(&kc, &["scale", "deployment/web", "--replicas=3"], None);
    assert!(ok, "{out}");
    wait_for(
        "3 available replicas",
        90,
        || scalar(&url, available).filter(|v| *v == 3.0),
        || tail("kube-state-metrics"),
    );

    // The crash-loop alert: its condition holds for the crashing pod (pending for the
    // rule's 15 minutes, then firing).
    wait_for(
        "KubePodCrashLooping for crasher",
        120,
        || {
            let alerts = prom(&url, "/api/v1/alerts", &[]);
            alerts["alerts"].as_array()?.iter().find(|a| {
                a["labels"]["alertname"] == "KubePodCrashLooping"
                    && a["labels"]["pod"] == "crasher"
                    && matches!(a["state"].as_str(), Some("pending" | "firing"))
            })?;
            Some(())
        },
        || format!("{:#}", prom(&url, "/api/v1/alerts", &[])),
    );

    // A deleted pod leaves the targets.
    let (ok, out) = kubectl(&kc, &["delete", "pod", "exporter", "--wait=false"], None);
    assert!(ok, "{out}");
    wait_for(
        "the deleted pod's target gone",
        30,
        || (!targets(&url).iter().any(|(j, w, _)| j == "pods" && w == "exporter")).then_some(()),
        || format!("{:#?}", targets(&url)),
    );

    // A new node joins the targets (its own identity, as the cluster's kubelets run).
    let pki = home.join("pki");
    let node_conf = tmp.path().join("node-3.conf");
    let st = Command::new(e2e::supervisor_bin())
        .args(["certs", "kubeconfig", "--dir"])
        .arg(&pki)
        .args(["--user", "system:node:node-3", "--group", "system:nodes", "--out"])
        .arg(&node_conf)
        .status()
        .unwrap();
    assert!(st.success());
    let server = format!("https://127.0.0.1:{port}");
    let extra: Vec<String> = vec![
        "--kubeconfig".into(),
        node_conf.to_string_lossy().into_owned(),
        "--client-ca-file".into(),
        pki.join("ca.crt").to_string_lossy().into_owned(),
        "--anonymous-auth=false".into(),
        "--authentication-token-webhook".into(),
        "--authorization-mode".into(),
        "Webhook".into(),
    ];
    let node3 = Kubelet::start_named(&server, "node-3", &extra).unwrap();
    wait_for(
        "node-3's kubelet and cadvisor targets up",
        60,
        || {
            let t = targets(&url);
            ["kubelet", "cadvisor"]
                .iter()
                .all(|job| t.iter().any(|(j, w, h)| j == job && w == "node-3" && h == "up"))
                .then_some(())
        },
        || format!("{:#?}\nnode-3 log:\n{}", targets(&url), node3.log()),
    );
    drop(node3);
    let (ok, out) = kubectl(&kc, &["delete", "node", "node-3"], None);
    assert!(ok, "{out}");
    wait_for(
        "node-3's targets gone",
        30,
        || (!targets(&url).iter().any(|(_, w, _)| w == "node-3")).then_some(()),
        || format!("{:#?}", targets(&url)),
    );
}
