//! `scheduler`: MiniK8s' kube-scheduler. Flags follow kube-scheduler's; `--profile`
//! selects the algorithm `default-scheduler` uses (`default-scheduler`, `round-robin`,
//! `random`, `node-affinity-first`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{ArgAction, Parser};

#[derive(Parser, Debug)]
#[command(name = "scheduler", about = "Assigns pending pods to nodes (kube-scheduler)")]
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
    /// Start a leader election client and gain leadership before scheduling.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    leader_elect_lease_duration: Duration,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    leader_elect_renew_deadline: Duration,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    leader_elect_retry_period: Duration,
    #[arg(long, default_value = "kube-scheduler")]
    leader_elect_resource_name: String,
    #[arg(long, default_value = "kube-system")]
    leader_elect_resource_namespace: String,
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

/// `15s`, `1m30s`, `500ms`, `2h`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let n_end =
            rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or(format!("missing unit in duration {s:?}"))?;
        let n: f64 = rest[..n_end].parse().map_err(|_| format!("invalid duration {s:?}"))?;
        rest = &rest[n_end..];
        let u_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let mult = match &rest[..u_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            u => return Err(format!("unknown unit {u:?} in duration {s:?}")),
        };
        total += Duration::from_secs_f64(n * mult);
        rest = &rest[u_end..];
    }
    Ok(total)
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
        .unwrap_or(flags.leader_elect);
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
        let mut lc = common::leader::Config::new(
            &flags.leader_elect_resource_namespace,
            &flags.leader_elect_resource_name,
            &identity,
        );
        lc.lease_duration = flags.leader_elect_lease_duration;
        lc.renew_deadline = flags.leader_elect_renew_deadline;
        lc.retry_period = flags.leader_elect_retry_period;
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

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("5").is_err());
    }

    #[test]
    fn leader_elect_flag_takes_a_value() {
        let f = Flags::try_parse_from(["scheduler", "--leader-elect=false"]).unwrap();
        assert!(!f.leader_elect);
        let f = Flags::try_parse_from(["scheduler"]).unwrap();
        assert!(f.leader_elect);
    }
}
