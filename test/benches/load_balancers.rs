//! Benchmark: LoadBalancer Services through the cloud-controller-manager (local provider,
//! nothing announced, so the host is untouched). Prints p50 / p99 of create → EXTERNAL-IP
//! (seen on a watch) for 1,000 Services and the provider calls it took, against create →
//! watched for as many ClusterIP Services in the same run (the API's floor); then a
//! restart of the controller over the 1,000 unchanged Services: provider calls (the hash
//! makes them 0 apart from one list of the provider's balancers) and the controller's CPU.
//!
//!     cargo bench -p e2e --bench load_balancers   # MINIK8S_BENCH_SERVICES, MINIK8S_BENCH_SYNCS
//!
//! Set MINIK8S_APISERVER_BIN / MINIK8S_CCM_BIN to release binaries for release figures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use e2e::bench::{create_all, follow, percentiles, Shared};
use e2e::cloud_controller_manager::CloudControllerManager;
use e2e::controller_manager::namespace;
use e2e::{free_port, ApiServer};
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use serde_json::json;

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?.block_on(bench())
}

/// Service `s<i>`: a LoadBalancer or a plain ClusterIP one.
fn service(i: usize, lb: bool) -> Result<Service> {
    let spec =
        if lb { json!({"type": "LoadBalancer", "ports": [{"port": 80}]}) } else { json!({"ports": [{"port": 80}]}) };
    Ok(serde_json::from_value(json!({"metadata": {"name": format!("s{i}")}, "spec": spec}))?)
}

async fn bench() -> Result<()> {
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let n = env("MINIK8S_BENCH_SERVICES", 1000);
    let syncs = env("MINIK8S_BENCH_SYNCS", 10);
    // Node ports for 1,000 Services: a wider range than the default 2,768.
    let api = ApiServer::start_with(&["--service-node-port-range", "20000-32767"])?;
    let client = api.client()?;
    namespace(&client, "base").await?;
    namespace(&client, "lb").await?;

    let base: Shared = Arc::default();
    let plain: Api<Service> = Api::namespaced(client.clone(), "base");
    follow(plain.clone(), base.clone(), |_| true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    create_all(&plain, n, &base, |i| service(i, false)).await?;
    let (b50, b99) = percentiles(&base, n, "ClusterIP services").await?;

    let dir = tempfile::tempdir()?;
    let config = dir.path().join("cloud.yaml");
    std::fs::write(
        &config,
        format!(
            "pools:\n- name: bench\n  addresses: [10.200.0.0/20]\ninterface: \"\"\nstateFile: {}\n",
            dir.path().join("lbs.json").display()
        ),
    )?;
    let log = dir.path().join("ccm.log");
    let port = free_port();
    let args = [
        "--master",
        &api.url(),
        "--cloud-config",
        config.to_str().context("path")?,
        "--concurrent-service-syncs",
        &syncs.to_string(),
    ];
    let args: Vec<&str> = args.to_vec();
    let mut ccm = CloudControllerManager::start(None, port, &log, &args)?;
    let lbs: Api<Service> = Api::namespaced(client.clone(), "lb");
    let assigned: Shared = Arc::default();
    follow(lbs.clone(), assigned.clone(), |s| {
        s.status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_some_and(|i| !i.is_empty())
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    create_all(&lbs, n, &assigned, |i| service(i, true)).await?;
    let (p50, p99) = percentiles(&assigned, n, "load balancers").await.with_context(|| ccm.log())?;
    let all = t0.elapsed().as_secs_f64();
    let calls = ccm.metric_sum("cloudprovider_api_requests_total", &[]);
    let cpu = ccm.cpu_seconds().unwrap_or(f64::NAN);
    if std::env::var("MINIK8S_BENCH_LOG").is_ok() {
        eprintln!("{}", ccm.log());
    }
    println!(
        "BENCH load_balancers {n} LoadBalancer Services create -> EXTERNAL-IP (--concurrent-service-syncs={syncs}): \
         p50 {p50:.0} ms, p99 {p99:.0} ms, all after {all:.1}s, {calls} provider calls ({:.1} per Service), \
         controller CPU {cpu:.1}s; \
         baseline {n} ClusterIP Services create -> watched: p50 {b50:.0} ms, p99 {b99:.0} ms; ratio p50 {:.1}x, p99 {:.1}x",
        calls / n as f64,
        p50 / b50.max(0.001),
        p99 / b99.max(0.001),
    );

    // A restart: every Service is reconciled again (the Kubernetes default Service too).
    ccm.kill();
    let ccm = CloudControllerManager::start(None, port, &log, &args)?;
    let t1 = Instant::now();
    let deadline = t1 + Duration::from_secs(300);
    while ccm.metric_sum("cloud_controller_manager_syncs_total", &["controller=\"service\""]) < (2 * n) as f64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the restarted controller did not sync every Service:\n{}",
            ccm.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resync = t1.elapsed().as_secs_f64();
    let cpu = ccm.cpu_seconds().unwrap_or(f64::NAN);
    let calls = ccm.metric_sum("cloudprovider_api_requests_total", &[]);
    let lists = ccm.metric_sum("cloudprovider_api_requests_total", &["request=\"list\""]);
    println!(
        "BENCH load_balancers restart over {n} unchanged LoadBalancer + {n} ClusterIP Services: all synced after {resync:.1}s, \
         {calls} provider calls ({lists} of them the start's one list), controller CPU {cpu:.2}s since start"
    );
    Ok(())
}
