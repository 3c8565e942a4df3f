//! Several apiservers over one etcd behave as one (the stacked control plane's first half):
//! a write through one is seen by a watch on the other, in order, with the resourceVersion
//! the writer was told; Service cluster IPs and node ports handed out concurrently through
//! both never collide; and the `kubernetes` Service's endpoints list every live apiserver
//! (each renews a lease) — one that shuts down takes itself out at once, one that is killed
//! drops out when its lease expires. Reads, writes and compare-and-sets through both, with
//! apiservers killed and etcd stopped meanwhile, form a linearizable history.

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

/// Reads, writes and compare-and-sets of one ConfigMap's value by four clients, each
/// operation through either of two apiservers on one etcd, while one apiserver is killed
/// and restarted, etcd stops answering for a second, and then the other apiserver is
/// killed: the history is linearizable (`e2e::linearizability`, a Knossos-style checker).
/// A write is a merge patch of a value never written before; a CAS is an update carrying the
/// resourceVersion the client last read (409 when another write came first); an operation
/// without an answer may or may not have happened.
/// Whether a request failed before it was sent: its server refused the connection (a killed
/// apiserver). Such an operation did not happen; any other failure may have come after the
/// server acted.
fn never_sent(e: &kube::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused) {
            return true;
        }
        source = err.source();
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_writes_and_cas_through_two_apiservers_are_linearizable() -> Result<()> {
    use e2e::linearizability::{check, Kind, Op};
    use std::sync::{Arc, Mutex};
    let etcd = EtcdServer::start_async().await.context("etcd (Debian package etcd-server)")?;
    let a = ApiServer::start_with(&["--etcd-servers", &etcd.endpoint()])?;
    let b = ApiServer::start_with(&["--etcd-servers", &etcd.endpoint()])?;
    let cms: Api<ConfigMap> = Api::namespaced(a.client()?, "default");
    let reg: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "register"}, "data": {"v": "init"}}))?;
    cms.create(&PostParams::default(), &reg).await?;

    let epoch = Instant::now();
    let now = move || epoch.elapsed().as_nanos() as u64;
    let history: Arc<Mutex<Vec<Op>>> = Arc::default();
    let servers = [a.client()?, b.client()?];
    let run_for = Duration::from_secs(9);
    let mut clients = Vec::new();
    for id in 0..4usize {
        let (servers, history) = (servers.clone(), history.clone());
        clients.push(tokio::spawn(async move {
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (id as u64 + 1);
            let mut rand = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            let mut last: Option<(String, String)> = None; // (value, resourceVersion) last read
            let mut n = 0;
            while epoch.elapsed() < run_for {
                let api: Api<ConfigMap> = Api::namespaced(servers[(rand() % 2) as usize].clone(), "default");
                let pick = rand() % 10;
                let call = now();
                let limit = Duration::from_secs(2);
                let op = if pick < 4 || (pick >= 7 && last.is_none()) {
                    match tokio::time::timeout(limit, api.get("register")).await {
                        Ok(Ok(cm)) => {
                            let v = cm.data.and_then(|d| d.get("v").cloned()).unwrap_or_default();
                            last = Some((v.clone(), cm.metadata.resource_version.unwrap_or_default()));
                            Some(Op { client: id, call, ret: Some(now()), kind: Kind::Read(v) })
                        }
                        _ => None, // a read without an answer changed nothing
                    }
                } else if pick < 7 {
                    n += 1;
                    let v = format!("w{id}-{n}");
                    let patch = kube::api::Patch::Merge(json!({"data": {"v": v}}));
                    match tokio::time::timeout(limit, api.patch("register", &Default::default(), &patch)).await {
                        Ok(Ok(_)) => Some(Op { client: id, call, ret: Some(now()), kind: Kind::Write(v) }),
                        Ok(Err(e)) if never_sent(&e) => None,
                        _ => Some(Op { client: id, call, ret: None, kind: Kind::Write(v) }),
                    }
                } else {
                    n += 1;
                    let (old, rv) = last.take().unwrap_or_default();
                    let new = format!("c{id}-{n}");
                    let body: ConfigMap = serde_json::from_value(json!({
                        "metadata": {"name": "register", "resourceVersion": rv}, "data": {"v": new}}))
                    .unwrap_or_default();
                    let cas = |ret, ok| {
                        Some(Op { client: id, call, ret, kind: Kind::Cas { old: old.clone(), new: new.clone(), ok } })
                    };
                    match tokio::time::timeout(limit, api.replace("register", &PostParams::default(), &body)).await {
                        Ok(Ok(_)) => cas(Some(now()), true),
                        Ok(Err(kube::Error::Api(s))) if s.code == 409 => cas(Some(now()), false),
                        Ok(Err(e)) if never_sent(&e) => None,
                        _ => cas(None, false),
                    }
                };
                let failed = op.as_ref().is_none_or(|o| o.ret.is_none());
                if let Some(op) = op {
                    history.lock().unwrap_or_else(|e| e.into_inner()).push(op);
                }
                if failed {
                    // The server is down or slow: do not spin on it.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }
    // The faults, in turn.
    let faults = tokio::task::spawn_blocking(move || -> Result<Vec<String>> {
        let (mut a, mut b, mut etcd) = (a, b, etcd);
        let at = |secs: f64| std::thread::sleep(Duration::from_secs_f64(secs).saturating_sub(epoch.elapsed()));
        let mut log = Vec::new();
        at(1.5);
        a.stop();
        log.push(format!("{:?} killed A", epoch.elapsed()));
        at(3.0);
        a.restart()?;
        log.push(format!("{:?} A back", epoch.elapsed()));
        at(4.5);
        etcd.pause()?;
        log.push(format!("{:?} etcd stopped", epoch.elapsed()));
        at(5.5);
        etcd.resume()?;
        log.push(format!("{:?} etcd continues", epoch.elapsed()));
        at(6.5);
        b.stop();
        log.push(format!("{:?} killed B", epoch.elapsed()));
        at(7.5);
        b.restart()?;
        log.push(format!("{:?} B back", epoch.elapsed()));
        // Keep the servers and etcd until the clients are done.
        at(run_for.as_secs_f64() + 2.5);
        drop((a, b, etcd));
        Ok(log)
    });
    for c in clients {
        c.await?;
    }
    let history = std::mem::take(&mut *history.lock().unwrap_or_else(|e| e.into_inner()));
    let unanswered = history.iter().filter(|o| o.ret.is_none()).count();
    let (reads, writes) = (
        history.iter().filter(|o| matches!(o.kind, Kind::Read(_))).count(),
        history.iter().filter(|o| matches!(o.kind, Kind::Write(_))).count(),
    );
    let cas_ok = history.iter().filter(|o| matches!(o.kind, Kind::Cas { ok: true, .. }) && o.ret.is_some()).count();
    println!(
        "{} operations: {reads} reads, {writes} writes, {} CAS ({cas_ok} won), {unanswered} without an answer",
        history.len(),
        history.len() - reads - writes
    );
    ensure!(history.len() > 200 && cas_ok > 0 && unanswered > 0, "too little happened to check");
    let started = Instant::now();
    check("init", &history).map_err(anyhow::Error::msg)?;
    println!("linearizable (checked in {:?}); faults: {:?}", started.elapsed(), faults.await??);
    Ok(())
}

