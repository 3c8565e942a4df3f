//! `minik8s-supervisor apiserver-lb`: the local address every component of an HA cluster
//! talks to, in front of several apiservers (what k3s runs inside each agent).
//!
//! A TCP proxy: TLS passes through untouched, so clients verify the apiservers' own
//! certificates and present their client certificates to them. Each new connection goes to
//! the next healthy backend in turn; one that refuses the connection is marked down and the
//! next is tried, so a client never waits on a dead apiserver. A checker dials every
//! backend each [`CHECK_INTERVAL`] and marks it up or down. Connections to an apiserver that
//! dies break with it; clients (kube's watchers, the kubelet) reconnect and land on a live
//! one. kubeadm's way is the same with nginx's `stream` module or HAProxy in front.
//!
//! With `--discover-kubeconfig` (a joined node's own kubeconfig, which names this balancer)
//! the backends follow the `kubernetes` Service's endpoints, which list every live apiserver:
//! a node joined through one control-plane machine goes on through the others when that
//! one dies, as k3s' agents do. The endpoints are read from the apiservers directly (not
//! through the balancer, whose backends may all be dead), every second until the first
//! answer and every `--discover-interval` after; with `--discover-state` what was learnt is
//! kept in a file, so a restarted balancer starts from it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};

/// How often every backend is dialled.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How long a dial may take before the backend counts as down.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(clap::Args, Debug)]
pub struct LbArgs {
    /// Address to listen on (the address the components' kubeconfigs name).
    #[arg(long)]
    pub listen: SocketAddr,
    /// An apiserver (`host:port`); repeat for each.
    #[arg(long = "backend", required = true)]
    pub backends: Vec<SocketAddr>,
    /// A kubeconfig (naming this balancer) with which to follow the `kubernetes` Service's
    /// endpoints: the backends become the apiservers it lists. Read again at every round,
    /// so it may appear later (a joining kubelet writes it once it has its certificate).
    #[arg(long)]
    pub discover_kubeconfig: Option<PathBuf>,
    /// How often the endpoints are read.
    #[arg(long, default_value = "10s", value_parser = common::leader::parse_duration)]
    pub discover_interval: Duration,
    /// Where the apiservers learnt are kept (one `host:port` a line): read at start, written
    /// after every change.
    #[arg(long)]
    pub discover_state: Option<PathBuf>,
}

/// The backends and what the proxy knows of them: (address, up).
pub struct Backends {
    state: Mutex<Vec<(SocketAddr, bool)>>,
    next: AtomicUsize,
}

impl Backends {
    pub fn new(addrs: Vec<SocketAddr>) -> Backends {
        Backends { state: Mutex::new(addrs.into_iter().map(|a| (a, true)).collect()), next: AtomicUsize::new(0) }
    }

    fn snapshot(&self) -> Vec<(SocketAddr, bool)> {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Mark `addr` (if still a backend); logs a change.
    fn mark(&self, addr: SocketAddr, up: bool) {
        let Ok(mut state) = self.state.lock() else { return };
        if let Some(entry) = state.iter_mut().find(|(a, _)| *a == addr) {
            if entry.1 != up {
                entry.1 = up;
                if up {
                    tracing::info!(backend = %addr, "apiserver is up");
                } else {
                    tracing::warn!(backend = %addr, "apiserver is down");
                }
            }
        }
    }

    /// Balance over `addrs` from now on (what is known of those kept stays); none: no change.
    /// Whether anything changed.
    fn replace(&self, addrs: Vec<SocketAddr>) -> bool {
        let Ok(mut state) = self.state.lock() else { return false };
        let current: Vec<SocketAddr> = state.iter().map(|(a, _)| *a).collect();
        if addrs.is_empty() || addrs == current {
            return false;
        }
        tracing::info!(from = ?current, to = ?addrs, "the apiservers changed");
        *state =
            addrs.into_iter().map(|a| (a, state.iter().find(|(b, _)| *b == a).is_none_or(|(_, up)| *up))).collect();
        true
    }
}

/// The apiservers the `kubernetes` Endpoints list: every address with every port, sorted.
pub fn apiservers(endpoints: &k8s_openapi::api::core::v1::Endpoints) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for subset in endpoints.subsets.iter().flatten() {
        for address in subset.addresses.iter().flatten() {
            let Ok(ip) = address.ip.parse::<std::net::IpAddr>() else { continue };
            for port in subset.ports.iter().flatten() {
                if let Ok(port) = u16::try_from(port.port) {
                    out.push(SocketAddr::new(ip, port));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The apiservers the `kubernetes` endpoints list, asked of the apiserver at `addr` directly
/// with the kubeconfig at `path` (its credentials and CA; the apiservers' certificates name
/// their addresses).
async fn list_apiservers(path: &std::path::Path, addr: SocketAddr) -> anyhow::Result<Vec<SocketAddr>> {
    use k8s_openapi::api::core::v1::Endpoints;
    let mut config = common::config(Some(path), None).await?;
    config.cluster_url = format!("https://{addr}").parse()?;
    config.connect_timeout = Some(DIAL_TIMEOUT);
    config.read_timeout = Some(Duration::from_secs(5));
    let api: kube::Api<Endpoints> = kube::Api::namespaced(kube::Client::try_from(config)?, "default");
    // (A list: node identities may list endpoints, as kube-proxy does, not get them.)
    let list = api.list(&kube::api::ListParams::default().fields("metadata.name=kubernetes")).await?;
    Ok(list.items.first().map(apiservers).unwrap_or_default())
}

/// Follow the `kubernetes` endpoints with the kubeconfig at `path` (see the module docs).
async fn discover(backends: Arc<Backends>, path: PathBuf, interval: Duration, state: Option<PathBuf>) {
    let mut learnt = false;
    loop {
        if path.exists() {
            let snapshot = backends.snapshot();
            let health: Vec<bool> = snapshot.iter().map(|(_, up)| *up).collect();
            for i in attempt_order(&health, 0) {
                match list_apiservers(&path, snapshot[i].0).await {
                    Ok(addrs) if !addrs.is_empty() => {
                        learnt = true;
                        if backends.replace(addrs.clone()) {
                            if let Some(file) = &state {
                                let text: String = addrs.iter().map(|a| format!("{a}\n")).collect();
                                if let Err(e) = common::write_private(file, text.as_bytes()) {
                                    tracing::warn!(error = %e, file = %file.display(), "keeping the apiservers failed");
                                }
                            }
                        }
                        break;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(backend = %snapshot[i].0, error = %e, "reading the kubernetes endpoints failed")
                    }
                }
            }
        }
        tokio::time::sleep(if learnt { interval } else { Duration::from_secs(1) }).await;
    }
}

/// The apiservers a `--discover-state` file lists (none when it is missing or unreadable).
fn read_state(file: &std::path::Path) -> Vec<SocketAddr> {
    std::fs::read_to_string(file).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// The order in which to try the backends for a connection: healthy ones first, round robin
/// from `turn`, then the ones marked down (all may be down only by the last check; better a
/// try than a refusal).
pub fn attempt_order(health: &[bool], turn: usize) -> Vec<usize> {
    let n = health.len();
    let rotated = (0..n).map(|k| (turn + k) % n);
    let (mut up, down): (Vec<usize>, Vec<usize>) = rotated.partition(|&i| health[i]);
    up.extend(down);
    up
}

async fn dial(addr: SocketAddr) -> std::io::Result<TcpStream> {
    match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "dial timed out")),
    }
}

/// The first backend that takes the connection, in [`attempt_order`].
async fn connect(backends: &Backends) -> Option<TcpStream> {
    let turn = backends.next.fetch_add(1, Ordering::Relaxed);
    let snapshot = backends.snapshot();
    let health: Vec<bool> = snapshot.iter().map(|(_, up)| *up).collect();
    for i in attempt_order(&health, turn) {
        let addr = snapshot[i].0;
        match dial(addr).await {
            Ok(s) => {
                backends.mark(addr, true);
                let _ = s.set_nodelay(true);
                return Some(s);
            }
            Err(e) => {
                tracing::debug!(backend = %addr, error = %e, "dial failed");
                backends.mark(addr, false);
            }
        }
    }
    None
}

async fn check(backends: Arc<Backends>) {
    loop {
        for (addr, _) in backends.snapshot() {
            backends.mark(addr, dial(addr).await.is_ok());
        }
        tokio::time::sleep(CHECK_INTERVAL).await;
    }
}

pub async fn run(args: LbArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let mut addrs = args.backends;
    if let Some(file) = &args.discover_state {
        for a in read_state(file) {
            if !addrs.contains(&a) {
                addrs.push(a);
            }
        }
    }
    let backends = Arc::new(Backends::new(addrs));
    tracing::info!(listen = %args.listen, backends = ?backends.snapshot(), "balancing apiserver connections");
    tokio::spawn(check(backends.clone()));
    if let Some(path) = args.discover_kubeconfig {
        tokio::spawn(discover(backends.clone(), path, args.discover_interval, args.discover_state));
    }
    loop {
        let (mut client, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        let backends = backends.clone();
        tokio::spawn(async move {
            let Some(mut server) = connect(&backends).await else {
                tracing::warn!(%peer, "no apiserver takes connections; closing");
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn healthy_backends_first_in_turn() {
        assert_eq!(attempt_order(&[true, true, true], 0), vec![0, 1, 2]);
        assert_eq!(attempt_order(&[true, true, true], 4), vec![1, 2, 0]);
        assert_eq!(attempt_order(&[true, false, true], 1), vec![2, 0, 1]);
        assert_eq!(attempt_order(&[false, false], 1), vec![1, 0]);
        assert!(attempt_order(&[], 3).is_empty());
    }

    /// A backend that answers its name to every connection.
    async fn named(name: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let _ = s.write_all(name.as_bytes()).await;
            }
        });
        (addr, task)
    }

    async fn ask(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    #[test]
    fn the_kubernetes_endpoints_name_the_apiservers_and_a_new_list_keeps_what_is_known() {
        let ep: k8s_openapi::api::core::v1::Endpoints = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes"},
            "subsets": [
                {"addresses": [{"ip": "192.0.2.9"}, {"ip": "192.0.2.8"}], "ports": [{"name": "https", "port": 6443}]},
                {"addresses": [{"ip": "192.0.2.8"}], "ports": [{"name": "https", "port": 7443}]},
                {"addresses": [{"ip": "not-an-ip"}], "ports": [{"port": 1}]}
            ]
        }))
        .unwrap();
        let want: Vec<SocketAddr> =
            ["192.0.2.8:6443", "192.0.2.8:7443", "192.0.2.9:6443"].iter().map(|a| a.parse().unwrap()).collect();
        assert_eq!(apiservers(&ep), want);
        assert!(apiservers(&Default::default()).is_empty());

        let b = Backends::new(want[..2].to_vec());
        b.mark(want[0], false);
        assert!(b.replace(vec![want[0], want[2]]));
        assert_eq!(b.snapshot(), [(want[0], false), (want[2], true)], "known down stays down; new ones start up");
        assert!(!b.replace(vec![want[0], want[2]]), "no change");
        assert!(!b.replace(vec![]));
        assert_eq!(b.snapshot().len(), 2, "an empty list changes nothing");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("apiservers");
        assert!(read_state(&file).is_empty());
        std::fs::write(&file, "192.0.2.8:6443\ngarbage\n192.0.2.9:6443\n").unwrap();
        assert_eq!(read_state(&file), [want[0], want[2]]);
    }

    #[tokio::test]
    async fn connections_go_round_and_skip_a_dead_backend() {
        let (a, _ta) = named("a").await;
        let (b, tb) = named("b").await;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listen = l.local_addr().unwrap();
        drop(l);
        tokio::spawn(run(LbArgs {
            listen,
            backends: vec![a, b],
            discover_kubeconfig: None,
            discover_interval: Duration::from_secs(10),
            discover_state: None,
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut seen = vec![ask(listen).await, ask(listen).await];
        seen.sort();
        assert_eq!(seen, ["a", "b"]);
        // b goes: every connection reaches a, at once (no wait for the checker).
        tb.abort();
        tokio::time::sleep(Duration::from_millis(50)).await;
        for _ in 0..4 {
            assert_eq!(ask(listen).await, "a");
        }
    }
}
