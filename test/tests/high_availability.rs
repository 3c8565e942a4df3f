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

/// The chaos test: `scripts/cluster up --ha` (3 etcd members, 2 apiservers behind the load
/// balancer, 2 schedulers, 2 controller-managers, one node); three clients create and
/// update ConfigMaps and Services through the load balancer, a watch follows the
/// ConfigMaps, a Deployment is scaled from 2 to 4; meanwhile each apiserver, the etcd
/// leader, the scheduler leader and the controller-manager leader are killed with SIGKILL in
/// turn (the supervisor starts each again). Afterwards: every acknowledged write is there;
/// the watch never went back or repeated a resourceVersion and ends in the listed state;
/// the Deployment has exactly its 4 pods; no two Services share a cluster IP or node port.
mod chaos {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use e2e::cluster::{component_pid, script as cluster, Down};
    use e2e::{free_port, host_cluster_lock};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{ListParams, Patch, PatchParams};

    async fn client(kubeconfig: &Path) -> Result<kube::Client> {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        config.read_timeout = Some(Duration::from_secs(10));
        Ok(kube::Client::try_from(config)?)
    }

    fn kill9(home: &Path, name: &str) -> Result<u32> {
        let pid = component_pid(home, name).with_context(|| format!("{name} is not running"))?;
        std::process::Command::new("kill").args(["-9", &pid.to_string()]).status()?;
        Ok(pid)
    }

    /// Wait until the supervisor runs `name` again as a new process.
    async fn restarted(home: &Path, name: &str, old: u32) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while component_pid(home, name).is_none_or(|p| p == old) {
            ensure!(Instant::now() < deadline, "{name} was not restarted");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// The component (`scheduler` or `scheduler-2`, …) whose process holds the Lease `lease`:
    /// its log names the identity it campaigns as.
    async fn leader(client: &kube::Client, home: &Path, lease: &str, names: [&str; 2]) -> Result<String> {
        use k8s_openapi::api::coordination::v1::Lease;
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(l) = leases.get(lease).await {
                let holder = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                for n in names {
                    let log = std::fs::read_to_string(home.join(format!("logs/{n}.log"))).unwrap_or_default();
                    // The log of the process running now: its last campaign.
                    let last = log.lines().rev().find(|l| l.contains("attempting to acquire leader lease"));
                    if !holder.is_empty() && last.is_some_and(|l| l.contains(&holder)) {
                        return Ok(n.to_string());
                    }
                }
            }
            ensure!(Instant::now() < deadline, "no live holder of lease {lease}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The etcd member that leads now (`etcd-1` …), from `etcdctl endpoint status --cluster`
    /// (as `scripts/cluster etcdctl` runs it, with etcd's client certificate).
    fn etcd_leader(home: &Path, port: u16) -> Result<String> {
        let endpoints = std::fs::read_to_string(home.join("etcd-endpoints"))?;
        let (ok, out) = e2e::cluster::script(home, port, &["etcdctl", "endpoint", "status", "--cluster", "-w", "json"]);
        ensure!(ok, "etcdctl endpoint status: {out}");
        let v: serde_json::Value = serde_json::from_str(&out).with_context(|| format!("etcdctl said {out}"))?;
        for s in v.as_array().into_iter().flatten() {
            let status = &s["Status"];
            if status["leader"].as_u64().is_some() && status["leader"] == status["header"]["member_id"] {
                let url = s["Endpoint"].as_str().unwrap_or_default();
                if let Some(i) = endpoints.trim().split(',').position(|e| e == url) {
                    return Ok(format!("etcd-{}", i + 1));
                }
            }
        }
        bail!("no etcd member says it leads: {out}")
    }

    #[derive(Default)]
    struct Acked {
        /// ConfigMap name → the value of its last acknowledged write.
        configmaps: BTreeMap<String, String>,
        services: usize,
        failed: usize,
    }

    /// One client's load: create a ConfigMap, then update it; every 5th round a Service.
    async fn writer(
        client: kube::Client,
        id: usize,
        acked: Arc<Mutex<Acked>>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) {
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "chaos");
        let svcs: Api<Service> = Api::namespaced(client, "chaos");
        let mut i = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let name = format!("w{id}-{i}");
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "0"}})).expect("configmap");
            let record = |ok: bool, v: &str| {
                let mut a = acked.lock().unwrap_or_else(|e| e.into_inner());
                if ok {
                    a.configmaps.insert(name.clone(), v.to_string());
                } else {
                    a.failed += 1;
                }
            };
            let ok = cms.create(&PostParams::default(), &cm).await.is_ok();
            record(ok, "0");
            if ok {
                let patch = Patch::Merge(json!({"data": {"v": "1"}}));
                let ok = cms.patch(&name, &PatchParams::default(), &patch).await.is_ok();
                record(ok, "1");
            }
            if i % 5 == 0 {
                let svc: Service = serde_json::from_value(json!({"metadata": {"name": format!("s{id}-{i}")},
                    "spec": {"type": "NodePort", "ports": [{"port": 80}], "selector": {"app": "none"}}}))
                .expect("service");
                if svcs.create(&PostParams::default(), &svc).await.is_ok() {
                    acked.lock().unwrap_or_else(|e| e.into_inner()).services += 1;
                }
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the watch saw: (type, name, resourceVersion, value), in order.
    type Seen = Arc<Mutex<Vec<(String, String, u64, String)>>>;

    /// Every ConfigMap event of namespace chaos, resumed from the last one seen after any
    /// failure: (type, name, resourceVersion, value).
    async fn follow(client: kube::Client, seen: Seen, from: String) {
        let cms: Api<ConfigMap> = Api::namespaced(client, "chaos");
        let mut rv = from;
        loop {
            seen.lock().unwrap_or_else(|e| e.into_inner()).push((
                "ERROR".into(),
                format!("watch from {rv}"),
                0,
                String::new(),
            ));
            let Ok(stream) = cms.watch(&WatchParams::default().timeout(60), &rv).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let mut stream = stream.boxed();
            while let Ok(Some(ev)) = stream.try_next().await {
                let (t, cm) = match ev {
                    WatchEvent::Added(cm) => ("ADDED", cm),
                    WatchEvent::Modified(cm) => ("MODIFIED", cm),
                    WatchEvent::Deleted(cm) => ("DELETED", cm),
                    WatchEvent::Bookmark(b) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    WatchEvent::Error(e) => {
                        seen.lock().unwrap_or_else(|e| e.into_inner()).push((
                            "ERROR".into(),
                            e.message,
                            e.code as u64,
                            String::new(),
                        ));
                        break;
                    }
                };
                let v = cm.data.as_ref().and_then(|d| d.get("v")).cloned().unwrap_or_default();
                rv = cm.metadata.resource_version.clone().unwrap_or_default();
                let n = rv.parse().unwrap_or(0);
                seen.lock().unwrap_or_else(|e| e.into_inner()).push((
                    t.into(),
                    cm.metadata.name.unwrap_or_default(),
                    n,
                    v,
                ));
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn killing_any_control_plane_process_loses_nothing() -> Result<()> {
        let _host = host_cluster_lock();
        let tmp = tempfile::tempdir()?;
        let home = tmp.path().join("state");
        let port = free_port();
        let _down = Down(&home, port);
        let (ok, out) = cluster(&home, port, &["up", "--ha"]);
        ensure!(ok, "cluster up --ha failed:\n{out}");
        let kc = home.join("kubeconfig");
        let client = client(&kc).await?;
        let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        ns.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "chaos"}}))?).await?;
        let deploys: Api<Deployment> = Api::namespaced(client.clone(), "chaos");
        let deploy: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "app"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "app"}},
                "template": {"metadata": {"labels": {"app": "app"}}, "spec": {"terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                    "command": ["sleep", "3600"]}]}}},
        }))?;
        deploys.create(&PostParams::default(), &deploy).await?;

        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "chaos");
        // What is there before the watch starts (the controller-manager's kube-root-ca.crt,
        // if it came first): the watch's state starts from it.
        let listed = cms.list(&ListParams::default()).await?;
        let from = listed.metadata.resource_version.clone().unwrap_or_default();
        let initial: BTreeMap<String, String> = listed
            .items
            .into_iter()
            .map(|cm| {
                (cm.metadata.name.unwrap_or_default(), cm.data.and_then(|d| d.get("v").cloned()).unwrap_or_default())
            })
            .collect();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let watcher = tokio::spawn(follow(client.clone(), seen.clone(), from));
        let acked = Arc::new(Mutex::new(Acked::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut writers = Vec::new();
        for id in 0..3 {
            writers.push(tokio::spawn(writer(client.clone(), id, acked.clone(), stop.clone())));
        }

        let mut kills = Vec::new();
        for step in 0..6 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let victim = match step {
                0 => "apiserver".to_string(),
                1 => "apiserver-2".to_string(),
                2 => etcd_leader(&home, port)?,
                3 => leader(&client, &home, "kube-scheduler", ["scheduler", "scheduler-2"]).await?,
                4 => {
                    leader(&client, &home, "kube-controller-manager", ["controller-manager", "controller-manager-2"])
                        .await?
                }
                _ => {
                    // Scale while the last kill's replacement campaigns.
                    deploys
                        .patch_scale("app", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 4}})))
                        .await?;
                    continue;
                }
            };
            let pid = kill9(&home, &victim)?;
            let started = Instant::now();
            restarted(&home, &victim, pid).await?;
            kills.push(format!("{victim} (pid {pid}, back in {:?})", started.elapsed()));
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in writers {
            w.await?;
        }
        println!("killed: {kills:?}");

        // Every acknowledged write is there, with its last acknowledged value or a later one.
        let acked = std::mem::take(&mut *acked.lock().unwrap_or_else(|e| e.into_inner()));
        ensure!(acked.configmaps.len() > 50, "the load made only {} ConfigMaps", acked.configmaps.len());
        let stored: BTreeMap<String, String> = cms
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|cm| {
                (cm.metadata.name.unwrap_or_default(), cm.data.and_then(|d| d.get("v").cloned()).unwrap_or_default())
            })
            .collect();
        for (name, v) in &acked.configmaps {
            let got = stored.get(name).with_context(|| format!("acknowledged ConfigMap {name} is gone"))?;
            ensure!(got.as_str() >= v.as_str(), "{name}: acknowledged v={v}, stored v={got}");
        }
        println!(
            "{} ConfigMaps acknowledged ({} stored), {} Services, {} writes failed during the kills",
            acked.configmaps.len(),
            stored.len(),
            acked.services,
            acked.failed
        );

        // The watch: resourceVersions only go up, and its events end in the stored state (a
        // watch stuck on a dead connection would be renewed within the server's 60 s).
        let caught_up = Instant::now();
        let deadline = caught_up + Duration::from_secs(75);
        loop {
            let state: BTreeMap<String, String> = {
                let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                let mut state = initial.clone();
                for (t, name, _, v) in seen.iter() {
                    match t.as_str() {
                        "DELETED" => {
                            state.remove(name);
                        }
                        "ERROR" => {}
                        _ => {
                            state.insert(name.clone(), v.clone());
                        }
                    }
                }
                state
            };
            if state == stored {
                println!("the watch matched the list {:?} after the writes stopped", caught_up.elapsed());
                break;
            }
            if Instant::now() >= deadline {
                let missing: Vec<_> = stored.iter().filter(|(k, v)| state.get(*k) != Some(*v)).collect();
                let extra: Vec<_> = state.keys().filter(|k| !stored.contains_key(*k)).collect();
                let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                let errors: Vec<_> = seen.iter().filter(|(t, ..)| t == "ERROR").collect();
                let rvs: Vec<u64> = seen.iter().filter(|(t, ..)| t != "ERROR").map(|(_, _, rv, _)| *rv).collect();
                let gaps: Vec<_> = rvs.windows(2).filter(|w| w[1] > w[0] + 50).collect();
                bail!(
                    "the watch's state ({} objects) never matched the list ({}): differ {missing:?}, extra {extra:?}; \
                     watch errors {errors:?}; large resourceVersion gaps {gaps:?}",
                    state.len(),
                    stored.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        watcher.abort();
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let rvs: Vec<u64> = seen.iter().filter(|(t, ..)| t != "ERROR").map(|(_, _, rv, _)| *rv).collect();
        ensure!(rvs.windows(2).all(|w| w[0] < w[1]), "the watch's resourceVersions went back or repeated");
        let rewatches = seen.iter().filter(|(t, ..)| t == "ERROR").count();
        println!("the watch saw {} events and was started {rewatches} times", rvs.len());

        // Services: no cluster IP or node port twice.
        let svcs: Api<Service> = Api::namespaced(client.clone(), "chaos");
        let all = svcs.list(&ListParams::default()).await?.items;
        let ips: BTreeSet<String> = all.iter().filter_map(|s| s.spec.as_ref()?.cluster_ip.clone()).collect();
        let ports: BTreeSet<i32> =
            all.iter().filter_map(|s| s.spec.as_ref()?.ports.as_ref()?.first()?.node_port).collect();
        ensure!(
            ips.len() == all.len() && ports.len() == all.len(),
            "{} Services, {} IPs, {} node ports",
            all.len(),
            ips.len(),
            ports.len()
        );
        ensure!(all.len() >= acked.services, "{} Services stored, {} acknowledged", all.len(), acked.services);

        // The Deployment: exactly 4 pods, all running.
        let pods: Api<Pod> = Api::namespaced(client.clone(), "chaos");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let list = pods.list(&ListParams::default().labels("app=app")).await?.items;
            let live: Vec<&Pod> = list.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
            let running =
                live.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count();
            if live.len() == 4 && running == 4 {
                break;
            }
            ensure!(Instant::now() < deadline, "the Deployment has {} pods ({running} running), want 4", live.len());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }
}
