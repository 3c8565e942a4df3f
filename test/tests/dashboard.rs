//! The web dashboard as its users meet it: `scripts/cluster up` starts it and prints its
//! address; a person logs in with the admin's kubeconfig (a client certificate) or a
//! ServiceAccount token, and the dashboard calls the API as that person — RBAC refuses the
//! read-only user's scale, an expired token or one the cluster no longer accepts gets the
//! login page. The cluster runs Prometheus (`up --monitoring`), which the plots read.
//!
//! First over HTTP (curl, with the cluster's CA: the dashboard's certificate is the
//! cluster's), then in a real browser: Debian's Chromium driven by playwright-core
//! (test/clients/dashboard.mjs) logs in, watches a Deployment scale to 3 live, reads a log
//! line printed after the page opened, runs `echo hi` in the terminal, sees the Deployment's
//! CPU and memory plotted from Prometheus, sees a validation
//! error beside its YAML line, deletes an object it is looking at, checks a narrow window
//! and the keyboard, and times the pod list with 1,000 pods. Screenshots of every step are
//! kept under `target/dashboard-screenshots/`.

use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use e2e::cluster::{repo, script as cluster, Down};
use e2e::{free_port, host_cluster_lock, kubectl_bin};
use serde_json::Value;

fn host_lock() -> (MutexGuard<'static, ()>, std::fs::File) {
    static HOST: Mutex<()> = Mutex::new(());
    let turn = HOST.lock().unwrap_or_else(|e| e.into_inner());
    (turn, host_cluster_lock())
}

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, out) = e2e::kubectl_at(kubeconfig, args, stdin);
    assert!(ok, "kubectl {args:?}: {out}");
    out
}

/// A ServiceAccount token of namespace dash, as its users get one: `kubectl create token`
/// (the official kubectl's; a TokenRequest).
fn token(kubeconfig: &Path, account: &str) -> String {
    let out = Command::new(e2e::official_kubectl("1.33"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["create", "token", account, "-n", "dash"])
        .output()
        .unwrap_or_else(|e| panic!("kubectl create token: {e}"));
    assert!(out.status.success(), "kubectl create token: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A token the cluster issued, expired ten minutes ago: `token`'s claims with its lifetime moved
/// into the past, signed again with the cluster's ServiceAccount key (the apiserver's own
/// signer), so the apiserver refuses it for its expiry alone.
fn expired(token: &str, pki: &Path) -> String {
    use apiserver::serviceaccount::{keys::Keys, token::Claims};
    use base64::Engine;
    let payload = token.split('.').nth(1).expect("a JWT");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).expect("base64url");
    let mut claims: Claims = serde_json::from_slice(&bytes).expect("ServiceAccount token claims");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    // Ten minutes ago: beyond the minute of clock skew a token is allowed (as go-jose allows).
    (claims.iat, claims.nbf, claims.exp) = (now - 3600, now - 3600, now - 600);
    let keys = Keys::load(&pki.join("sa.key"), &[pki.join("sa.pub")]).expect("the cluster's ServiceAccount keys");
    keys.sign(&claims).expect("signing")
}

/// A curl against the dashboard: (HTTP code, body). `jar`: the cookie file of a session.
fn curl(ca: &Path, jar: &Path, method: &str, url: &str, headers: &[&str], body: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-m", "20", "--cacert"]).arg(ca).arg("-b").arg(jar).arg("-c").arg(jar);
    cmd.args(["-X", method, "-w", "\n%{http_code}"]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    if let Some(b) = body {
        cmd.args(["--data-binary", b]);
    }
    let out = cmd.arg(url).output().unwrap_or_else(|e| panic!("curl: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: dash}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: dash}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: busybox
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done"]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: doomed, namespace: dash}
data: {a: "1"}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: viewer, namespace: dash}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: gone, namespace: dash}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: viewer-view, namespace: dash}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{kind: ServiceAccount, name: viewer, namespace: dash}]
"#;

/// 1,000 pods held back by a scheduling gate: objects for the list to render (they stay
/// Pending; nothing schedules or collects them).
fn thousand_pods() -> String {
    let mut out = String::from(
        "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: many}}\n",
    );
    for i in 0..1000 {
        out.push_str(&format!(
            "- {{apiVersion: v1, kind: Pod, metadata: {{name: p-{i:04}, namespace: many, labels: {{app: many}}}}, \
             spec: {{schedulingGates: [{{name: example.com/dashboard-test}}], containers: [{{name: c, image: busybox}}]}}}}\n"
        ));
    }
    out
}

#[test]
fn the_dashboard_serves_each_person_as_themselves_in_a_real_browser() {
    let _host = host_lock();
    let browser = e2e::browser();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("state");
    let port = free_port();
    let _down = Down(&home, port);
    // With Prometheus (scraping every 2 s), which the dashboard's plots read.
    std::env::set_var("MINIK8S_SCRAPE_INTERVAL", "2s");
    let (ok, out) = cluster(&home, port, &["up", "--monitoring"]);
    assert!(ok, "cluster up failed:\n{out}");
    // up prints the address.
    let url = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Dashboard: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("up prints the dashboard's address:\n{out}"))
        .to_string();
    assert!(url.starts_with("https://") && url.ends_with('/'), "{url}");
    let url =
        url.replacen(url.split('/').nth(2).unwrap_or_default().split(':').next().unwrap_or_default(), "127.0.0.1", 1);
    let kc = home.join("kubeconfig");
    let ca = home.join("pki/ca.crt");
    kubectl(&kc, &["apply", "-f", "-"], Some(OBJECTS));
    let viewer = token(&kc, "viewer");
    let refused = token(&kc, "gone");
    kubectl(&kc, &["delete", "serviceaccount", "gone", "-n", "dash"], None);
    let expired = expired(&viewer, &home.join("pki"));

    // Over HTTP: the dashboard's certificate is the cluster CA's; no session, no API.
    let jar = tmp.path().join("admin.jar");
    let (code, body) = curl(&ca, &jar, "GET", &format!("{url}healthz"), &[], None);
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, body) = curl(&ca, &jar, "GET", &format!("{url}k8s/api/v1/namespaces"), &[], None);
    assert_eq!(code, 401, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["reason"], "Unauthorized", "{body}");
    let (code, body) = curl(&ca, &jar, "GET", &url, &[], None);
    assert!(code == 200 && body.contains("<html"), "the page: {code} {body}");

    // Login with the admin's kubeconfig (its client certificate): a change needs the page's
    // header; the cookie is HttpOnly, Secure and SameSite=Strict.
    let kubeconfig = std::fs::read_to_string(&kc).unwrap();
    let login = serde_json::json!({"kubeconfig": kubeconfig}).to_string();
    let ctype = "Content-Type: application/json";
    let (code, body) = curl(&ca, &jar, "POST", &format!("{url}login"), &[ctype], Some(&login));
    assert_eq!(code, 403, "login without the page's header: {body}");
    let (code, body) = curl(&ca, &jar, "POST", &format!("{url}login"), &[ctype, "X-Dashboard: 1"], Some(&login));
    assert_eq!(code, 200, "{body}");
    let who: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(who["user"], "kubernetes-admin", "{body}");
    let cookies = std::fs::read_to_string(&jar).unwrap();
    assert!(cookies.contains("#HttpOnly_") && cookies.contains("minik8s_dashboard"), "{cookies}");
    let (code, body) = curl(&ca, &jar, "GET", &format!("{url}k8s/api/v1/namespaces/dash/configmaps/doomed"), &[], None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["data"]["a"], "1");
    let (code, _) = curl(&ca, &jar, "GET", &format!("{url}k8s/metrics"), &[], None);
    assert_eq!(code, 404, "only the API is proxied");
    // YAML: as kubectl prints it; an invalid edit names the field's line.
    let (code, yaml) =
        curl(&ca, &jar, "GET", &format!("{url}yaml/apis/apps/v1/namespaces/dash/deployments/web"), &[], None);
    assert!(code == 200 && yaml.contains("  replicas: 1\n") && !yaml.contains("managedFields"), "{code} {yaml}");
    let bad = yaml.replacen("  replicas: 1\n", "  replicas: -1\n", 1);
    let line = bad.lines().position(|l| l == "  replicas: -1").unwrap() + 1;
    let (code, body) = curl(
        &ca,
        &jar,
        "PUT",
        &format!("{url}yaml/apis/apps/v1/namespaces/dash/deployments/web"),
        &["Content-Type: text/yaml", "X-Dashboard: 1"],
        Some(&bad),
    );
    assert_eq!(code, 422, "{body}");
    let st: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(st["reason"], "Invalid", "{body}");
    assert!(
        st["lines"].as_array().unwrap().iter().any(|l| l["line"] == line && l["field"] == "spec.replicas"),
        "line {line}: {body}"
    );

    // The read-only user: reads, and is refused a scale by RBAC (the apiserver's own 403).
    let vjar = tmp.path().join("viewer.jar");
    let login = serde_json::json!({"token": viewer}).to_string();
    let (code, body) = curl(&ca, &vjar, "POST", &format!("{url}login"), &[ctype, "X-Dashboard: 1"], Some(&login));
    assert_eq!(code, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["user"], "system:serviceaccount:dash:viewer");
    let scale = format!("{url}k8s/apis/apps/v1/namespaces/dash/deployments/web/scale");
    let patch = ["Content-Type: application/merge-patch+json", "X-Dashboard: 1"];
    let (code, body) = curl(&ca, &vjar, "PATCH", &scale, &patch, Some(r#"{"spec":{"replicas":2}}"#));
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("User \\\"system:serviceaccount:dash:viewer\\\" cannot patch resource \\\"deployments/scale\\\""),
        "{body}"
    );
    // A token the cluster no longer accepts (its ServiceAccount is gone).
    let login = serde_json::json!({"token": refused}).to_string();
    let (code, body) =
        curl(&ca, &tmp.path().join("r.jar"), "POST", &format!("{url}login"), &[ctype, "X-Dashboard: 1"], Some(&login));
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("the cluster refused these credentials"), "{body}");
    // An expired token: the same refusal.
    let login = serde_json::json!({"token": expired}).to_string();
    let (code, body) =
        curl(&ca, &tmp.path().join("e.jar"), "POST", &format!("{url}login"), &[ctype, "X-Dashboard: 1"], Some(&login));
    assert_eq!(code, 401, "{body}");
    // The plots' queries reach Prometheus, for a logged-in person only.
    let range = format!("{url}prometheus/api/v1/query_range?query=up&start=0&end=1&step=15");
    let (code, body) = curl(&ca, &tmp.path().join("none.jar"), "GET", &range, &[], None);
    assert_eq!(code, 401, "{body}");
    let (code, body) = curl(&ca, &vjar, "GET", &range, &[], None);
    assert!(code == 200 && body.contains("\"status\":\"success\""), "{code} {body}");
    // Logout ends the session.
    let (code, _) = curl(&ca, &vjar, "POST", &format!("{url}logout"), &["X-Dashboard: 1"], None);
    assert_eq!(code, 204);
    let (code, _) = curl(&ca, &vjar, "GET", &format!("{url}k8s/api/v1/namespaces/dash/pods"), &[], None);
    assert_eq!(code, 401);

    // The browser.
    let Some((modules, chromium)) = browser else { return };
    kubectl(&kc, &["apply", "-f", "-"], Some(&thousand_pods()));
    let shots = e2e::target_dir().join("dashboard-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    let script = modules.join(format!("dashboard-{}.mjs", std::process::id()));
    std::fs::copy(repo().join("test/clients/dashboard.mjs"), &script).unwrap();
    let out = Command::new("node")
        .arg(&script)
        .env("DASHBOARD_URL", &url)
        .env("KUBECONFIG_FILE", &kc)
        .env("VIEWER_TOKEN", &viewer)
        .env("EXPIRED_TOKEN", &expired)
        .env("SCREENSHOT_DIR", &shots)
        .env("NAMESPACE", "dash")
        .env("PODS_1000", "many")
        .env("CHROMIUM", &chromium)
        .env("KUBECTL", kubectl_bin())
        .output()
        .unwrap_or_else(|e| panic!("node: {e}"));
    let _ = std::fs::remove_file(&script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    let dashboard_log = std::fs::read_to_string(home.join("logs/dashboard.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "the browser test failed (screenshots in {}):\n{stdout}\n{stderr}\ndashboard log:\n{dashboard_log}",
        shots.display()
    );
    let steps: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    for want in [
        "login-error",
        "overview",
        "scale",
        "logs",
        "terminal",
        "plots",
        "yaml-error",
        "deleted",
        "forbidden",
        "narrow",
        "1000-pods",
    ] {
        assert!(
            steps.iter().any(|s| s["step"] == want && s["ok"] == true),
            "step {want} did not pass:\n{stdout}\n{stderr}"
        );
    }
    let plots = steps.iter().find(|s| s["step"] == "plots").cloned().unwrap_or_default();
    assert_eq!(plots["source"], "prometheus", "the plots read Prometheus: {plots}");
    for shot in
        ["overview.png", "deployment.png", "logs.png", "terminal.png", "metrics.png", "yaml-error.png", "narrow.png"]
    {
        assert!(shots.join(shot).exists(), "screenshot {shot} saved");
    }
}
