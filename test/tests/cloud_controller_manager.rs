//! The cloud-controller-manager end to end, with the `local` provider, inside the kubeproxy
//! lab (a "node" network namespace with busybox "pods"; the host's own addresses and rules
//! are never touched): the official kubectl makes LoadBalancer Services, the real
//! cloud-controller-manager gives them addresses held on the node's `lo`, the real
//! kubeproxy routes them, and the host — a machine on the node's LAN, reaching the pool by
//! ARP on the link between them — reaches the pods with curl.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use e2e::cloud_controller_manager::CloudControllerManager;
use e2e::kubeproxy::{prerequisites, sh, Lab};
use e2e::{eventually, free_port, ApiServer};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn kubectl(api: &ApiServer, args: &[&str]) -> Result<String> {
    let out = api.kubectl(args)?;
    if !out.ok {
        bail!("kubectl {args:?} failed: {}{}", out.stdout, out.stderr);
    }
    Ok(out.stdout)
}

fn apply(api: &ApiServer, dir: &std::path::Path, yaml: &str) -> Result<String> {
    let f = dir.join("manifest.yaml");
    std::fs::write(&f, yaml)?;
    kubectl(api, &["apply", "-f", f.to_str().context("path")?])
}

fn ingress_ip(api: &ApiServer, svc: &str) -> String {
    api.kubectl(&["get", "svc", svc, "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}"])
        .map(|o| o.stdout.trim().to_string())
        .unwrap_or_default()
}

async fn wait_ingress(api: &ApiServer, svc: &str, ccm: &CloudControllerManager) -> Result<String> {
    let mut ip = String::new();
    if eventually(WAIT, || {
        ip = ingress_ip(api, svc);
        let done = !ip.is_empty();
        async move { done }
    })
    .await
    .is_err()
    {
        bail!("{svc} got no EXTERNAL-IP; cloud-controller-manager log:\n{}", ccm.log());
    }
    Ok(ip)
}

/// The reasons and messages of the Events about a Service.
fn events(api: &ApiServer, svc: &str) -> String {
    api.kubectl(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={svc}"),
        "-o",
        "jsonpath={range .items[*]}{.type} {.reason} {.message}{\"\\n\"}{end}",
    ])
    .map(|o| o.stdout)
    .unwrap_or_default()
}

async fn wait_event(api: &ApiServer, svc: &str, needle: &str) -> Result<()> {
    if eventually(WAIT, || {
        let ok = events(api, svc).contains(needle);
        async move { ok }
    })
    .await
    .is_err()
    {
        bail!("no event {needle:?} about {svc}; events:\n{}", events(api, svc));
    }
    Ok(())
}

/// The addresses the provider holds on the node namespace's `lo` (its default link).
fn announced(lab: &Lab) -> String {
    String::from_utf8_lossy(&lab.node_sh("ip -4 -o addr show dev lo").stdout).into_owned()
}

/// The provider's state file.
fn state(path: &std::path::Path) -> serde_json::Value {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(json!({}))
}

fn listeners(state: &serde_json::Value) -> Vec<String> {
    let mut out: Vec<String> = state["loadBalancers"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .flat_map(|lb| lb["listeners"].as_array().cloned().unwrap_or_default())
        .map(|l| format!("{}/{}", l["port"], l["protocol"].as_str().unwrap_or_default()))
        .collect();
    out.sort();
    out
}

fn addresses(state: &serde_json::Value) -> Vec<String> {
    let mut out: Vec<String> = state["loadBalancers"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .filter_map(|lb| lb["address"].as_str().map(String::from))
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn load_balancer_services_get_pool_addresses_that_reach_their_pods() -> Result<()> {
    if !prerequisites(&["ip", "curl", "busybox", "iptables-restore"]) {
        return Ok(());
    }
    let api = ApiServer::start_with(&["--bind-address", "0.0.0.0"])?;
    let client = api.client()?;
    let mut lab = Lab::new(2)?;
    lab.start_kubeproxy(api.port, &["--proxy-mode", "iptables"])?;
    let dir = tempfile::tempdir()?;
    let state_file = dir.path().join("load-balancers.json");
    let config = dir.path().join("cloud.yaml");
    std::fs::write(
        &config,
        format!(
            "pools:\n- name: lab\n  addresses: [\"203.0.113.10-203.0.113.11\"]\nstateFile: {}\nregion: lab\n",
            state_file.display()
        ),
    )?;
    let log = dir.path().join("ccm.log");
    let port = free_port();
    let master = format!("http://{}:{}", lab.host_ip, api.port);
    let ccm_args = ["--master", &master, "--cloud-config", config.to_str().context("path")?];
    let mut ccm = CloudControllerManager::start(Some(&lab.node_ns), port, &log, &ccm_args)?;

    // A Service of two "pods" (their EndpointSlice made by hand: no kubelet here).
    let t0 = Instant::now();
    apply(
        &api,
        dir.path(),
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n\
         spec: {type: LoadBalancer, ports: [{name: http, port: 80, targetPort: 8080}]}\n",
    )?;
    let ip = wait_ingress(&api, "web", &ccm).await?;
    eprintln!("EXTERNAL-IP {ip} assigned {:?} after kubectl apply", t0.elapsed());
    assert_eq!(ip, "203.0.113.10", "the pool's first address");
    let get = kubectl(&api, &["get", "svc", "web"])?;
    let row = get.lines().nth(1).unwrap_or_default().split_whitespace().collect::<Vec<_>>();
    assert_eq!((row[1], row[3]), ("LoadBalancer", "203.0.113.10"), "TYPE and EXTERNAL-IP columns:\n{get}");
    let held = announced(&lab);
    assert!(held.contains("203.0.113.10/32") && held.contains("lo:lb"), "held on the node's lo, labelled: {held}");
    let finalizers = kubectl(&api, &["get", "svc", "web", "-o", "jsonpath={.metadata.finalizers}"])?;
    assert!(finalizers.contains("service.kubernetes.io/load-balancer-cleanup"), "{finalizers}");
    wait_event(&api, "web", "Normal EnsuringLoadBalancer Ensuring load balancer").await?;
    wait_event(&api, "web", "Normal EnsuredLoadBalancer Ensured load balancer").await?;

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let eps: Vec<_> = lab
        .pods
        .iter()
        .map(|p| json!({"addresses": [p.ip], "conditions": {"ready": true}, "nodeName": "node-a"}))
        .collect();
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-abc", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "endpoints": eps, "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]});
    slices.create(&PostParams::default(), &serde_json::from_value(slice)?).await?;

    // The host is a machine on the node's LAN: it reaches the pool on-link (by ARP), the
    // node answers for the address it holds, kubeproxy's rules take it to a pod.
    sh(&format!("ip route replace 203.0.113.8/29 dev kph{}", lab.id))?;
    let pods: Vec<String> = lab.pods.iter().map(|p| p.name.clone()).collect();
    let mut body = String::new();
    let reached = eventually(WAIT, || {
        body = sh("curl -s --max-time 3 http://203.0.113.10/").unwrap_or_default().trim().to_string();
        let ok = pods.contains(&body);
        async move { ok }
    })
    .await;
    assert!(
        reached.is_ok(),
        "curl http://203.0.113.10/ from the LAN: {body:?}; kubeproxy log:\n{}",
        lab.kubeproxy_log()
    );

    // A new port is a new listener; the address stays.
    kubectl(
        &api,
        &[
            "patch",
            "svc",
            "web",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/spec/ports/-","value":{"name":"alt","port":8081,"targetPort":8080}}]"#,
        ],
    )?;
    let mut seen = vec![];
    let updated = eventually(WAIT, || {
        seen = listeners(&state(&state_file));
        let ok = seen == ["80/TCP", "8081/TCP"];
        async move { ok }
    })
    .await;
    assert!(updated.is_ok(), "listeners {seen:?}; log:\n{}", ccm.log());
    assert_eq!(ingress_ip(&api, "web"), "203.0.113.10");

    // The same requested address twice: the second Service is told, and stays pending.
    apply(
        &api,
        dir.path(),
        "apiVersion: v1\nkind: Service\nmetadata: {name: copy, namespace: default}\n\
         spec: {type: LoadBalancer, loadBalancerIP: 203.0.113.10, ports: [{port: 80}]}\n",
    )?;
    wait_event(
        &api,
        "copy",
        "Warning SyncLoadBalancerFailed Error syncing load balancer: failed to ensure load balancer: requested address 203.0.113.10 is already in use by the load balancer of Service default/web",
    )
    .await?;
    assert_eq!(ingress_ip(&api, "copy"), "");
    kubectl(&api, &["delete", "svc", "copy"])?;

    // The pool runs out: the third Service waits, with an event, until an address is free.
    apply(&api, dir.path(), "apiVersion: v1\nkind: Service\nmetadata: {name: second, namespace: default}\nspec: {type: LoadBalancer, ports: [{port: 80}]}\n")?;
    assert_eq!(wait_ingress(&api, "second", &ccm).await?, "203.0.113.11");
    apply(&api, dir.path(), "apiVersion: v1\nkind: Service\nmetadata: {name: third, namespace: default}\nspec: {type: LoadBalancer, ports: [{port: 80}]}\n")?;
    wait_event(&api, "third", "no address left in pool \"lab\" (2 addresses, all in use)").await?;
    assert_eq!(ingress_ip(&api, "third"), "");
    let t_free = Instant::now();
    kubectl(&api, &["delete", "svc", "second"])?;
    // kubectl delete waited for the finalizer: the address was released before the
    // Service disappeared, so the waiting Service takes it.
    assert_eq!(wait_ingress(&api, "third", &ccm).await?, "203.0.113.11");
    eprintln!("the freed address went to the waiting Service {:?} after the delete", t_free.elapsed());
    wait_event(&api, "second", "Normal DeletedLoadBalancer Deleted load balancer").await?;

    // Back to ClusterIP: the address is released, the status and finalizer cleared.
    kubectl(&api, &["patch", "svc", "third", "-p", r#"{"spec":{"type":"ClusterIP"}}"#])?;
    let released = eventually(WAIT, || {
        let ok = ingress_ip(&api, "third").is_empty()
            && !announced(&lab).contains("203.0.113.11")
            && addresses(&state(&state_file)) == ["203.0.113.10"]
            && api
                .kubectl(&["get", "svc", "third", "-o", "jsonpath={.metadata.finalizers}"])
                .is_ok_and(|o| o.ok && o.stdout.trim().is_empty());
        async move { ok }
    })
    .await;
    assert!(released.is_ok(), "third still holds its address: {}; log:\n{}", announced(&lab), ccm.log());

    // A restart re-reads every Service: each is up to date by its hash, so the provider is
    // asked for nothing but the one list of its balancers.
    ccm.kill();
    let mut ccm = CloudControllerManager::start(Some(&lab.node_ns), port, &log, &ccm_args)?;
    let resynced = eventually(WAIT, || {
        let ok = ccm.metric_sum("cloud_controller_manager_syncs_total", &["controller=\"service\""]) >= 2.0;
        async move { ok }
    })
    .await;
    assert!(resynced.is_ok(), "no service sync after the restart:\n{}", ccm.metrics());
    let calls = ccm.metric_sum("cloudprovider_api_requests_total", &[]);
    let lists = ccm.metric_sum("cloudprovider_api_requests_total", &["request=\"list\""]);
    assert_eq!((calls, lists), (1.0, 1.0), "provider calls after a restart:\n{}", ccm.metrics());

    // Deleting while the controller is down: the finalizer keeps the Service (and its
    // address) until the controller is back and has released it.
    ccm.kill();
    kubectl(&api, &["delete", "svc", "web", "--wait=false"])?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ts = kubectl(&api, &["get", "svc", "web", "-o", "jsonpath={.metadata.deletionTimestamp}"])?;
    assert!(!ts.trim().is_empty(), "the Service waits on the finalizer");
    assert!(announced(&lab).contains("203.0.113.10/32"));
    let ccm = CloudControllerManager::start(Some(&lab.node_ns), port, &log, &ccm_args)?;
    let gone = eventually(WAIT, || {
        let ok = api.kubectl(&["get", "svc", "web"]).is_ok_and(|o| !o.ok && o.stderr.contains("NotFound"));
        async move { ok }
    })
    .await;
    assert!(gone.is_ok(), "web was not released; log:\n{}", ccm.log());
    assert!(!announced(&lab).contains("203.0.113."), "every address withdrawn: {}", announced(&lab));
    assert_eq!(addresses(&state(&state_file)), Vec::<String>::new());

    // Node initialization: a Node registered by a kubelet with --cloud-provider=external.
    apply(
        &api,
        dir.path(),
        "apiVersion: v1\nkind: Node\nmetadata: {name: lab-node}\n\
         spec: {taints: [{key: node.cloudprovider.kubernetes.io/uninitialized, value: \"true\", effect: NoSchedule}]}\n",
    )?;
    let mut node = json!({});
    let initialized = eventually(WAIT, || {
        node = api
            .kubectl(&["get", "node", "lab-node", "-o", "json"])
            .ok()
            .and_then(|o| serde_json::from_str(&o.stdout).ok())
            .unwrap_or(json!({}));
        let ok = node["spec"]["providerID"] == "local://lab-node" && node["spec"]["taints"].is_null();
        async move { ok }
    })
    .await;
    assert!(initialized.is_ok(), "node not initialized: {node}; log:\n{}", ccm.log());
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["node.kubernetes.io/instance-type"], "local");
    assert_eq!(labels["topology.kubernetes.io/region"], "lab");
    Ok(())
}
