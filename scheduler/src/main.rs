//! `scheduler`: MiniK8s' kube-scheduler. Flags follow kube-scheduler's; `--profile`
//! selects the algorithm `default-scheduler` uses (`default-scheduler`, `round-robin`,
//! `random`, `node-affinity-first`).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "scheduler", about = "Assigns pending pods to nodes (kube-scheduler)")]
#[command(mut_arg(common::leader::RESOURCE_NAME, common::leader::default_name("kube-scheduler")))]
struct Flags {
    /// Path to a kubeconfig file.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The address of the apiserver (overrides the kubeconfig's server).
    #[arg(long, alias = "server")]
    master: Option<String>,
    /// A KubeSchedulerConfiguration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The algorithm of the `default-scheduler` profile.
    #[arg(long, value_parser = ["default-scheduler", "round-robin", "random", "node-affinity-first"])]
    profile: Option<String>,
    #[command(flatten)]
    leader: common::leader::Args,
    /// Address to serve /healthz, /readyz and /metrics on.
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: String,
    /// Port for /healthz and /metrics (kube-scheduler's 10259, here over plain HTTP; 0 = any).
    #[arg(long, default_value_t = 10259)]
    secure_port: u16,
    /// Log level (tracing filter); RUST_LOG overrides.
    #[arg(long, default_value = "info")]
    log_level: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    common::init_tracing(&flags.log_level);
    let _trimmer = common::memory::spawn_trimmer(common::memory::TRIM_INTERVAL);
    let cfg = match &flags.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading --config {}", path.display()))?;
            Some(scheduler::config::parse(&text)?)
        }
        None => None,
    };
    let profiles = scheduler::config::build(cfg.as_ref(), flags.profile.as_deref())?;
    let leader_elect = cfg
        .as_ref()
        .and_then(|c| c.leader_election.as_ref())
        .and_then(|l| l.leader_elect)
        .unwrap_or(flags.leader.leader_elect);
    let client = common::client(flags.kubeconfig.as_deref(), flags.master.as_deref()).await?;

    let registry = prometheus::Registry::new();
    let metrics = scheduler::scheduler::Metrics::new(&registry)?;
    let ready = common::Ready::default();
    let addr: SocketAddr =
        format!("{}:{}", flags.bind_address, flags.secure_port).parse().context("--bind-address/--secure-port")?;
    let bound = common::serve_health(addr, registry, ready.clone()).await?;
    tracing::info!(%bound, profiles = ?profiles.by_name.keys().collect::<Vec<_>>(), "serving /healthz and /metrics");

    let mut leading = None;
    if leader_elect {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "scheduler".into());
        let identity = format!("{}_{}", host.trim(), uuid_like());
        let lc = flags.leader.config(&identity);
        tracing::info!(lease = %format!("{}/{}", lc.namespace, lc.name), %identity, "attempting to acquire leader lease");
        leading = Some(common::leader::LeaderElector::new(client.clone(), lc).run().await?);
    }

    let sched = scheduler::scheduler::Scheduler::new(client, profiles, metrics);
    let run = sched.run(ready);
    match leading {
        None => run.await,
        Some(mut rx) => tokio::select! {
            r = run => r,
            _ = rx.wait_for(|l| !*l) => anyhow::bail!("leaderelection lost"),
        },
    }
}

/// A random identity suffix (client-go uses a UUID).
fn uuid_like() -> String {
    use rand::Rng;
    let mut r = rand::rng();
    format!("{:016x}", r.random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn leader_elect_flag_takes_a_value() {
        let f = Flags::try_parse_from(["scheduler", "--leader-elect=false"]).unwrap();
        assert!(!f.leader.leader_elect);
        let f = Flags::try_parse_from(["scheduler"]).unwrap();
        assert!(f.leader.leader_elect);
    }

    #[test]
    fn leader_election_defaults() {
        let c = Flags::try_parse_from(["scheduler"]).unwrap().leader.config("me");
        assert_eq!((c.namespace.as_str(), c.name.as_str()), ("kube-system", "kube-scheduler"));
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (Duration::from_secs(15), Duration::from_secs(10), Duration::from_secs(2))
        );
        // Go's duration syntax: compound values, and a unit is required.
        let f = Flags::try_parse_from(["scheduler", "--leader-elect-lease-duration=1m30s"]).unwrap();
        assert_eq!(f.leader.config("me").lease_duration, Duration::from_secs(90));
        assert!(Flags::try_parse_from(["scheduler", "--leader-elect-lease-duration=5"]).is_err());
    }
}
