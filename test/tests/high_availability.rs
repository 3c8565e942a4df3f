//! Several apiservers over one etcd behave as one (the stacked control plane's first half):
//! a write through one is seen by a watch on the other, in order, with the resourceVersion
//! the writer was told; Service cluster IPs and node ports handed out concurrently through
//! both never collide; and the `kubernetes` Service's endpoints list every live apiserver
//! (each renews a lease) — one that shuts down takes itself out at once, one that is killed
//! drops out when its lease expires.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::ApiServer;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Service};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use storage::etcd_test_server::EtcdServer;

/// An apiserver on the shared etcd, listening on every address (so it has an endpoint).
fn apiserver(etcd: &EtcdServer) -> Result<ApiServer> {
    ApiServer::start_with(&["--etcd-servers", &etcd.endpoint(), "--bind-address", "0.0.0.0"])
}

/// The `kubernetes` Endpoints' ports, as one apiserver serves them.
async fn endpoint_ports(server: &ApiServer) -> Result<BTreeSet<u16>> {
    let eps: Api<Endpoints> = Api::namespaced(server.client()?, "default");
    let Some(ep) = eps.get_opt("kubernetes").await? else { return Ok(BTreeSet::new()) };
    Ok(ep
        .subsets
        .unwrap_or_default()
        .iter()
        .flat_map(|s| s.ports.clone().unwrap_or_default())
        .map(|p| p.port as u16)
        .collect())
}

async fn wait_ports(server: &ApiServer, want: &[u16], within: Duration) -> Result<Duration> {
    let want: BTreeSet<u16> = want.iter().copied().collect();
    let started = Instant::now();
    loop {
        let got = endpoint_ports(server).await?;
        if got == want {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            bail!("kubernetes endpoints' ports {got:?}, want {want:?} within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_apiservers_on_one_etcd_behave_as_one() -> Result<()> {
    let etcd = EtcdServer::start_async().await.context("etcd (Debian package etcd-server)")?;
    let a = apiserver(&etcd)?;
    let b = apiserver(&etcd)?;
    // Both are in the kubernetes Service's endpoints (one subset per port: same host).
    wait_ports(&a, &[a.port, b.port], Duration::from_secs(15)).await?;
    wait_ports(&b, &[a.port, b.port], Duration::from_secs(15)).await?;

    // Writes through A (creates, then an update of each), watched through B.
    let (ca, cb) = (a.client()?, b.client()?);
    let via_a: Api<ConfigMap> = Api::namespaced(ca.clone(), "default");
    let via_b: Api<ConfigMap> = Api::namespaced(cb.clone(), "default");
    let start = via_b.list_metadata(&Default::default()).await?.metadata.resource_version.unwrap_or_default();
    let mut watch = via_b.watch(&WatchParams::default(), &start).await?.boxed();
    let mut written = Vec::new();
    for i in 0..40 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}, "data": {"v": "1"}}))?;
        let made = via_a.create(&PostParams::default(), &cm).await?;
        written.push(("ADDED", format!("cm-{i}"), made.metadata.resource_version.unwrap_or_default()));
    }
    for i in 0..40 {
        let name = format!("cm-{i}");
        let patch = kube::api::Patch::Merge(json!({"data": {"v": "2"}}));
        let changed = via_a.patch(&name, &Default::default(), &patch).await?;
        written.push(("MODIFIED", name, changed.metadata.resource_version.unwrap_or_default()));
    }
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < written.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, watch.try_next())
            .await
            .with_context(|| format!("B's watch saw {} of {} events", seen.len(), written.len()))??
            .context("B's watch ended")?;
        match ev {
            WatchEvent::Added(cm) => seen.push(("ADDED", cm)),
            WatchEvent::Modified(cm) => seen.push(("MODIFIED", cm)),
            WatchEvent::Bookmark(_) => {}
            other => bail!("unexpected event on B: {other:?}"),
        }
    }
    let seen: Vec<(&str, String, String)> = seen
        .into_iter()
        .map(|(t, cm)| (t, cm.metadata.name.unwrap_or_default(), cm.metadata.resource_version.unwrap_or_default()))
        .collect();
    ensure!(seen == written, "B's watch differs from A's writes:\nseen    {seen:?}\nwritten {written:?}");

    // 30 Services through each, at once: no cluster IP or node port twice.
    let create = |client: kube::Client, tag: &'static str| async move {
        let svcs: Api<Service> = Api::namespaced(client, "default");
        let mut out = Vec::new();
        for i in 0..30 {
            let svc: Service = serde_json::from_value(json!({
                "metadata": {"name": format!("{tag}-{i}")},
                "spec": {"type": "NodePort", "ports": [{"port": 80}], "selector": {"app": "x"}},
            }))?;
            out.push(svcs.create(&PostParams::default(), &svc).await?);
        }
        anyhow::Ok(out)
    };
    let (from_a, from_b) = tokio::join!(create(ca.clone(), "a"), create(cb.clone(), "b"));
    let all: Vec<Service> = from_a?.into_iter().chain(from_b?).collect();
    let ips: BTreeSet<String> = all.iter().filter_map(|s| s.spec.as_ref()?.cluster_ip.clone()).collect();
    let ports: BTreeSet<i32> = all.iter().filter_map(|s| s.spec.as_ref()?.ports.as_ref()?.first()?.node_port).collect();
    ensure!(
        ips.len() == 60 && ports.len() == 60,
        "{} distinct IPs and {} node ports for 60 Services",
        ips.len(),
        ports.len()
    );

    // A shuts down (SIGTERM): it takes itself out of the endpoints before it exits.
    let (mut a, mut b) = (a, b);
    a.terminate();
    let took = wait_ports(&b, &[b.port], Duration::from_secs(3)).await?;
    println!("a stopped apiserver left the kubernetes endpoints after {took:?}");
    // A comes back; then B is killed (SIGKILL): its lease expires (15 s) and A drops it at
    // its next renewal (every 10 s).
    a.restart()?;
    wait_ports(&a, &[a.port, b.port], Duration::from_secs(3)).await?;
    b.stop();
    let took = wait_ports(&a, &[a.port], Duration::from_secs(40)).await?;
    println!("a killed apiserver left the kubernetes endpoints after {took:?}");
    Ok(())
}
