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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
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
}

/// The backends and what the proxy knows of them.
pub struct Backends {
    addrs: Vec<SocketAddr>,
    up: Vec<AtomicBool>,
    next: AtomicUsize,
}

impl Backends {
    pub fn new(addrs: Vec<SocketAddr>) -> Backends {
        let up = addrs.iter().map(|_| AtomicBool::new(true)).collect();
        Backends { addrs, up, next: AtomicUsize::new(0) }
    }

    fn health(&self) -> Vec<bool> {
        self.up.iter().map(|u| u.load(Ordering::Relaxed)).collect()
    }

    /// Mark backend `i`; logs a change.
    fn mark(&self, i: usize, up: bool) {
        if self.up[i].swap(up, Ordering::Relaxed) != up {
            if up {
                tracing::info!(backend = %self.addrs[i], "apiserver is up");
            } else {
                tracing::warn!(backend = %self.addrs[i], "apiserver is down");
            }
        }
    }
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
    for i in attempt_order(&backends.health(), turn) {
        match dial(backends.addrs[i]).await {
            Ok(s) => {
                backends.mark(i, true);
                let _ = s.set_nodelay(true);
                return Some(s);
            }
            Err(e) => {
                tracing::debug!(backend = %backends.addrs[i], error = %e, "dial failed");
                backends.mark(i, false);
            }
        }
    }
    None
}

async fn check(backends: Arc<Backends>) {
    loop {
        for (i, addr) in backends.addrs.iter().enumerate() {
            backends.mark(i, dial(*addr).await.is_ok());
        }
        tokio::time::sleep(CHECK_INTERVAL).await;
    }
}

pub async fn run(args: LbArgs) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    let backends = Arc::new(Backends::new(args.backends));
    tracing::info!(listen = %args.listen, backends = ?backends.addrs, "balancing apiserver connections");
    tokio::spawn(check(backends.clone()));
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

    #[tokio::test]
    async fn connections_go_round_and_skip_a_dead_backend() {
        let (a, _ta) = named("a").await;
        let (b, tb) = named("b").await;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listen = l.local_addr().unwrap();
        drop(l);
        tokio::spawn(run(LbArgs { listen, backends: vec![a, b] }));
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
