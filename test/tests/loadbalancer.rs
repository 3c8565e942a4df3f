//! LoadBalancer Services end to end, driven with the official kubectl against the real
//! apiserver and a real kubeproxy in a network namespace lab (see `e2e::kubeproxy`):
//! `externalTrafficPolicy: Local` gets a `healthCheckNodePort`, which kubeproxy answers
//! with this node's ready endpoints (503 without, 200 with one); the load balancer IP (set
//! in the status by hand, there is no cloud controller) routes to the local endpoint;
//! `loadBalancerSourceRanges` lets only the listed sources reach it; the health check goes
//! away with the need for it. In iptables and in nftables mode.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use e2e::kubeproxy::{prerequisites, Lab};
use e2e::{eventually, ApiServer};

const WAIT: Duration = Duration::from_secs(60);
const LB_IP: &str = "192.0.2.50";

/// Run the official kubectl; its stdout, or an error with its stderr.
fn kubectl(api: &ApiServer, args: &[&str]) -> Result<String> {
    let out = api.kubectl(args)?;
    ensure!(out.ok, "kubectl {args:?} failed: {}{}", out.stdout, out.stderr);
    Ok(out.stdout)
}

/// `kubectl apply -f` of `manifest`, written beside the lab's other files.
fn apply(api: &ApiServer, lab: &Lab, file: &str, manifest: &str) -> Result<String> {
    let path = lab.dir.path().join(file);
    std::fs::write(&path, manifest)?;
    kubectl(api, &["apply", "-f", &path.display().to_string()])
}

/// One HTTP GET from the node namespace: (status code, headers and body), or curl's exit code.
fn get(lab: &Lab, url: &str) -> std::result::Result<(u16, String), i32> {
    let out = lab.node_sh(&format!("curl -s -i --max-time 5 {url}"));
    if !out.status.success() {
        return Err(out.status.code().unwrap_or(-1));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, text))
}

/// The JSON body of a `curl -i` answer.
fn body(answer: &str) -> Result<serde_json::Value> {
    let at = answer.find("\r\n\r\n").context("no body")?;
    Ok(serde_json::from_str(&answer[at + 4..])?)
}

fn slice_manifest(ready: bool) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: lb-here\n  namespace: default\n  \
         labels: {{kubernetes.io/service-name: lb}}\naddressType: IPv4\nendpoints:\n- addresses: [10.244.0.11]\n  \
         nodeName: node-a\n  conditions: {{ready: {ready}}}\nports:\n- name: http\n  port: 8080\n  protocol: TCP\n"
    )
}

async fn local_load_balancer(mode: &str) -> Result<()> {
    let tool = if mode == "nftables" { "nft" } else { "iptables-restore" };
    if !prerequisites(&["ip", "curl", "busybox", tool]) {
        return Ok(());
    }
    let api = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let mut lab = Lab::new(2)?;
    apply(
        &api,
        &lab,
        "lb.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: lb\n  namespace: default\nspec:\n  type: LoadBalancer\n  \
         externalTrafficPolicy: Local\n  ports:\n  - name: http\n    port: 80\n    targetPort: 8080\n",
    )?;
    let hc: u16 = kubectl(&api, &["get", "svc", "lb", "-o", "jsonpath={.spec.healthCheckNodePort}"])?
        .trim()
        .parse()
        .context("healthCheckNodePort is not allocated")?;
    ensure!((30000..=32767).contains(&hc), "healthCheckNodePort {hc} outside the node port range");
    let node_port = kubectl(&api, &["get", "svc", "lb", "-o", "jsonpath={.spec.ports[0].nodePort}"])?;
    ensure!(node_port.trim() != hc.to_string(), "the node port and the health check port are one");
    // No cloud controller here: the load balancer's address goes into the status by hand.
    kubectl(
        &api,
        &[
            "patch",
            "svc",
            "lb",
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!("{{\"status\":{{\"loadBalancer\":{{\"ingress\":[{{\"ip\":\"{LB_IP}\"}}]}}}}}}"),
        ],
    )?;

    lab.start_kubeproxy(api.port, &["--proxy-mode", mode, "--node-ip", "192.168.77.1"])?;
    let check = format!("http://{}:{hc}/", lab.node_ip);
    let mut answer = None;
    eventually(WAIT, || {
        answer = get(&lab, &check).ok();
        let ok = answer.is_some();
        async move { ok }
    })
    .await
    .with_context(|| format!("{mode}: the health check never answered; log:\n{}", lab.kubeproxy_log()))?;
    let (code, text) = answer.context("no answer")?;
    ensure!(code == 503, "{mode}: no endpoint here, yet {code}:\n{text}");
    ensure!(
        body(&text)?
            == serde_json::json!({"service": {"namespace": "default", "name": "lb"}, "localEndpoints": 0, "serviceProxyHealthy": true}),
        "{mode}: {text}"
    );
    let headers = text.to_ascii_lowercase();
    ensure!(headers.contains("content-type: application/json") && headers.contains("x-content-type-options: nosniff"));

    // A ready endpoint on this node: 200, one local endpoint, and the load balancer IP
    // reaches it. A not-ready one would not count.
    apply(&api, &lab, "slice.yaml", &slice_manifest(false))?;
    std::thread::sleep(Duration::from_secs(2));
    ensure!(get(&lab, &check).is_ok_and(|(c, _)| c == 503), "{mode}: a not-ready endpoint counted");
    apply(&api, &lab, "slice.yaml", &slice_manifest(true))?;
    eventually(WAIT, || {
        let ok = get(&lab, &check).is_ok_and(|(c, _)| c == 200);
        async move { ok }
    })
    .await
    .with_context(|| format!("{mode}: never 200 with a local endpoint; log:\n{}", lab.kubeproxy_log()))?;
    let (_, text) = get(&lab, &check).map_err(|c| anyhow::anyhow!("curl exit {c}"))?;
    ensure!(body(&text)?["localEndpoints"] == 1, "{mode}: {text}");
    let lb_url = format!("http://{LB_IP}/");
    eventually(WAIT, || {
        let ok = lab.curl(None, &lb_url).is_ok_and(|b| b == "pod0");
        async move { ok }
    })
    .await
    .with_context(|| format!("{mode}: the load balancer IP never reached the local endpoint"))?;

    // The proxy's own health, as kube-proxy's JSON.
    let healthz = String::from_utf8_lossy(&lab.node_sh("curl -s http://127.0.0.1:10256/healthz").stdout).into_owned();
    let healthz: serde_json::Value = serde_json::from_str(&healthz).with_context(|| format!("/healthz: {healthz}"))?;
    ensure!(healthz["nodeEligible"] == true && healthz["lastUpdated"].is_string(), "{healthz}");
    let livez = String::from_utf8_lossy(
        &lab.node_sh("curl -s -o /dev/null -w %{http_code} http://127.0.0.1:10256/livez").stdout,
    )
    .into_owned();
    ensure!(livez == "200", "/livez: {livez}");

    // Source ranges: only pod1 may reach the load balancer IP; pod0 and the node may not.
    kubectl(
        &api,
        &["patch", "svc", "lb", "--type=merge", "-p", r#"{"spec":{"loadBalancerSourceRanges":["10.244.0.12/32"]}}"#],
    )?;
    eventually(WAIT, || {
        let ok = lab.curl(None, &lb_url).is_err();
        async move { ok }
    })
    .await
    .with_context(|| format!("{mode}: the node still reaches the load balancer IP outside the ranges"))?;
    ensure!(lab.curl(Some(1), &lb_url) == Ok("pod0".into()), "{mode}: pod1 is in the range");
    ensure!(lab.curl(Some(0), &lb_url).is_err(), "{mode}: pod0 is outside the range");
    ensure!(
        lab.curl(None, &format!("http://{}:{}/", lab.node_ip, node_port.trim())) == Ok("pod0".into()),
        "{mode}: node ports are not subject to the ranges"
    );
    // A range holding the node's address lets the node in.
    kubectl(
        &api,
        &[
            "patch",
            "svc",
            "lb",
            "--type=merge",
            "-p",
            r#"{"spec":{"loadBalancerSourceRanges":["10.244.0.12/32","192.168.77.0/24"]}}"#,
        ],
    )?;
    eventually(WAIT, || {
        let ok = lab.curl(None, &lb_url).is_ok_and(|b| b == "pod0");
        async move { ok }
    })
    .await
    .with_context(|| format!("{mode}: the node never got in with its range"))?;

    // The health check port is taken: another Service cannot have it (a 422 on the field).
    let taken = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: other\n  namespace: default\nspec:\n  type: LoadBalancer\n  \
         externalTrafficPolicy: Local\n  healthCheckNodePort: {hc}\n  ports:\n  - port: 80\n"
    );
    std::fs::write(lab.dir.path().join("other.yaml"), &taken)?;
    let out = api.kubectl(&["create", "-f", &lab.dir.path().join("other.yaml").display().to_string()])?;
    ensure!(
        !out.ok
            && out.stderr.contains(&format!(
                "spec.healthCheckNodePort: Invalid value: {hc}: provided port is already allocated"
            )),
        "{mode}: {out:?}"
    );

    // Policy Cluster: no health check any more; the port is freed and closed.
    kubectl(&api, &["patch", "svc", "lb", "--type=merge", "-p", r#"{"spec":{"externalTrafficPolicy":"Cluster"}}"#])?;
    let left = kubectl(&api, &["get", "svc", "lb", "-o", "jsonpath={.spec.healthCheckNodePort}"])?;
    ensure!(left.trim().is_empty(), "{mode}: healthCheckNodePort left: {left}");
    eventually(WAIT, || {
        let ok = get(&lab, &check) == Err(7);
        async move { ok }
    })
    .await
    .with_context(|| format!("{mode}: the health check port stayed open"))?;
    kubectl(&api, &["create", "-f", &lab.dir.path().join("other.yaml").display().to_string()])
        .with_context(|| format!("{mode}: the freed port could not be taken"))?;
    let taken_now = kubectl(&api, &["get", "svc", "other", "-o", "jsonpath={.spec.healthCheckNodePort}"])?;
    if taken_now.trim() != hc.to_string() {
        bail!("{mode}: asked for {hc}, got {taken_now}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn local_load_balancer_health_check_and_source_ranges_iptables() -> Result<()> {
    local_load_balancer("iptables").await
}

#[tokio::test(flavor = "multi_thread")]
async fn local_load_balancer_health_check_and_source_ranges_nftables() -> Result<()> {
    local_load_balancer("nftables").await
}
