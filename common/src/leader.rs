//! Leader election over a `coordination.k8s.io/v1` Lease, the way client-go's
//! `leaderelection` package does it: the holder renews `spec.renewTime` every retry
//! period; another candidate takes the Lease over only once `renewTime +
//! leaseDurationSeconds` has passed. Every write is a compare-and-swap on the Lease's
//! `resourceVersion`, so two candidates can never both win.
//!
//! ```no_run
//! # async fn f(client: kube::Client) -> anyhow::Result<()> {
//! let elector = common::leader::LeaderElector::new(client, common::leader::Config::new("kube-system", "kube-scheduler", "me"));
//! let mut leading = elector.run().await?; // returns once this process leads
//! // ... do the work; when `leading` turns false, stop (Kubernetes components exit).
//! leading.changed().await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};

/// Leader-election settings; the defaults are Kubernetes' (`--leader-elect-lease-duration`
/// 15s, `--leader-elect-renew-deadline` 10s, `--leader-elect-retry-period` 2s).
#[derive(Clone, Debug)]
pub struct Config {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Config {
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Config {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

// The `--leader-elect*` flags kube-controller-manager and kube-scheduler share; a binary
// flattens them into its own (`#[command(flatten)]`) and gives `--leader-elect-resource-name`
// its default with `default_name`. (Plain comments: clap would print a doc comment here
// as the binary's description.)
#[derive(clap::Args, Clone, Debug)]
#[group(id = "leader-election")]
pub struct Args {
    /// Start a leader election client and gain leadership before doing any work.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// How long after the leader's last renewal another candidate may take the Lease over.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leading.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How long a candidate waits between attempts to acquire or renew.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// The name of the Lease.
    #[arg(long)]
    pub leader_elect_resource_name: String,
    /// The namespace of the Lease.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
}

/// The argument id of `--leader-elect-resource-name`, for `mut_arg`.
pub const RESOURCE_NAME: &str = "leader_elect_resource_name";

/// What a binary does to `--leader-elect-resource-name` (its Lease's name) to make `name` its
/// default; [`Args`] flattened into its flags:
///
/// ```
/// #[derive(clap::Parser)]
/// #[command(mut_arg(common::leader::RESOURCE_NAME, common::leader::default_name("kube-scheduler")))]
/// struct Flags {
///     #[command(flatten)]
///     leader: common::leader::Args,
/// }
/// # use clap::Parser;
/// let flags = Flags::parse_from(["scheduler", "--leader-elect-lease-duration=1m30s"]);
/// let config = flags.leader.config("me");
/// assert_eq!((config.namespace.as_str(), config.name.as_str()), ("kube-system", "kube-scheduler"));
/// assert_eq!(config.lease_duration, std::time::Duration::from_secs(90));
/// ```
pub fn default_name(name: &'static str) -> impl FnOnce(clap::Arg) -> clap::Arg {
    move |a| a.default_value(name).required(false)
}

impl Args {
    /// The election these flags ask for, as candidate `identity`.
    pub fn config(&self, identity: &str) -> Config {
        Config {
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
            ..Config::new(&self.leader_elect_resource_namespace, &self.leader_elect_resource_name, identity)
        }
    }
}

/// A duration in Go's syntax, as Kubernetes' flags take them (`15s`, `1m30s`, `500ms`).
pub use apimachinery::duration::parse_go_duration as parse_duration;

/// What a candidate should write given the Lease it read (None = absent) at `now`.
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// Create the Lease holding it.
    Create(LeaseSpec),
    /// Replace the Lease's spec (acquire or renew).
    Update(LeaseSpec),
    /// Someone else holds a live Lease.
    Wait,
}

/// The pure decision of one acquire-or-renew attempt.
pub fn decide(current: Option<&LeaseSpec>, identity: &str, duration: Duration, now: Timestamp) -> Decision {
    let secs = duration.as_secs().max(1) as i32;
    let fresh = |transitions: i32, acquire: Option<MicroTime>| LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(secs),
        acquire_time: Some(acquire.unwrap_or(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    };
    let Some(spec) = current else {
        return Decision::Create(fresh(0, None));
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    let transitions = spec.lease_transitions.unwrap_or(0);
    if holder == identity {
        return Decision::Update(fresh(transitions, spec.acquire_time.clone()));
    }
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(MicroTime(renewed)), Some(d)) => {
            renewed.checked_add(SignedDuration::from_secs(d as i64)).map(|end| end <= now).unwrap_or(true)
        }
        _ => true,
    };
    if holder.is_empty() || expired {
        Decision::Update(fresh(transitions + 1, None))
    } else {
        Decision::Wait
    }
}

/// A candidate for one Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    config: Config,
}

impl LeaderElector {
    pub fn new(client: kube::Client, config: Config) -> Self {
        LeaderElector { api: Api::namespaced(client, &config.namespace), config }
    }

    /// One acquire-or-renew attempt; Ok(true) when this candidate holds the Lease after it.
    pub async fn try_acquire_or_renew(&self) -> anyhow::Result<bool> {
        let current = self.api.get_opt(&self.config.name).await?;
        let decision = decide(
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &self.config.identity,
            self.config.lease_duration,
            Timestamp::now(),
        );
        let result = match decision {
            Decision::Wait => return Ok(false),
            Decision::Create(spec) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await.map(|_| ())
            }
            Decision::Update(spec) => {
                let mut lease = current.unwrap_or_default();
                lease.spec = Some(spec);
                self.api.replace(&self.config.name, &PostParams::default(), &lease).await.map(|_| ())
            }
        };
        match result {
            Ok(()) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Block until this candidate leads, then keep renewing in the background. The
    /// returned receiver turns false (for good) when renewal failed for longer than the
    /// renew deadline: the caller must then stop acting.
    pub async fn run(self) -> anyhow::Result<tokio::sync::watch::Receiver<bool>> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, lease = %self.config.name, "error acquiring the leader lease"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
        tracing::info!(lease = %format!("{}/{}", self.config.namespace, self.config.name), identity = %self.config.identity, "successfully acquired lease");
        let (tx, rx) = tokio::sync::watch::channel(true);
        tokio::spawn(async move {
            let mut last_renew = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(self.config.retry_period).await;
                match self.try_acquire_or_renew().await {
                    Ok(true) => last_renew = tokio::time::Instant::now(),
                    Ok(false) => {
                        tracing::error!(lease = %self.config.name, "leader lease taken by another candidate");
                        break;
                    }
                    Err(e) => tracing::warn!(error = %e, "error renewing the leader lease"),
                }
                if last_renew.elapsed() > self.config.renew_deadline {
                    tracing::error!(lease = %self.config.name, "failed to renew the leader lease within the renew deadline");
                    break;
                }
            }
            let _ = tx.send(false);
        });
        Ok(rx)
    }
}

/// Run the election `args` ask for as `<hostname>_<random>` (Kubernetes' candidates add a
/// UUID): wait until this process leads and return the receiver that turns false when it
/// stops leading; None when `--leader-elect=false`.
pub async fn elect(client: &kube::Client, args: &Args) -> anyhow::Result<Option<tokio::sync::watch::Receiver<bool>>> {
    if !args.leader_elect {
        return Ok(None);
    }
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
    let identity = format!("{host}_{:016x}", rand::random::<u64>());
    let cfg = args.config(&identity);
    tracing::info!(%identity, "attempting to acquire leader lease {}/{}", cfg.namespace, cfg.name);
    Ok(Some(LeaderElector::new(client.clone(), cfg).run().await?))
}

/// Resolves when leadership is lost (never without an election).
pub async fn lost(leading: Option<&mut tokio::sync::watch::Receiver<bool>>) {
    match leading {
        Some(rx) => {
            let _ = rx.wait_for(|l| !*l).await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// Wait on a controller manager's controllers: return when one stops (its panic as the
/// error) or on Ctrl-C; exit the process when leadership is lost, as Kubernetes' managers do.
pub async fn run_controllers(
    mut leading: Option<tokio::sync::watch::Receiver<bool>>,
    mut tasks: tokio::task::JoinSet<()>,
) -> anyhow::Result<()> {
    tokio::select! {
        _ = lost(leading.as_mut()) => {
            tracing::error!("leaderelection lost");
            std::process::exit(1);
        }
        _ = tokio::signal::ctrl_c() => {}
        Some(r) = tasks.join_next() => {
            if let Err(e) = r {
                anyhow::bail!("a controller stopped: {e}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[derive(Parser, Debug)]
    #[command(mut_arg(RESOURCE_NAME, default_name("kube-test")))]
    struct Flags {
        #[command(flatten)]
        leader: Args,
    }

    #[test]
    fn flags_and_their_defaults() {
        let f = Flags::try_parse_from(["test"]).unwrap();
        assert!(f.leader.leader_elect);
        let c = f.leader.config("me");
        assert_eq!((c.namespace.as_str(), c.name.as_str(), c.identity.as_str()), ("kube-system", "kube-test", "me"));
        let d = Config::new("kube-system", "kube-test", "me");
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (d.lease_duration, d.renew_deadline, d.retry_period)
        );

        let f = Flags::try_parse_from([
            "test",
            "--leader-elect=false",
            "--leader-elect-lease-duration=4s",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=500ms",
            "--leader-elect-resource-name=other",
            "--leader-elect-resource-namespace=ns",
        ])
        .unwrap();
        assert!(!f.leader.leader_elect);
        let c = f.leader.config("me");
        assert_eq!((c.namespace.as_str(), c.name.as_str()), ("ns", "other"));
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (Duration::from_secs(4), Duration::from_secs(3), Duration::from_millis(500))
        );
        // `--leader-elect` alone means true.
        assert!(Flags::try_parse_from(["test", "--leader-elect"]).unwrap().leader.leader_elect);
        assert!(Flags::try_parse_from(["test", "--leader-elect-lease-duration=15"]).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        for bad in ["5", "", "5x", "s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn absent_lease_is_created() {
        assert!(
            matches!(decide(None, "a", Duration::from_secs(15), at(100)), Decision::Create(s) if s.holder_identity.as_deref() == Some("a"))
        );
    }

    #[test]
    fn live_lease_of_another_is_respected_until_expired() {
        let spec = LeaseSpec {
            holder_identity: Some("b".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(at(100))),
            lease_transitions: Some(3),
            ..Default::default()
        };
        assert_eq!(decide(Some(&spec), "a", Duration::from_secs(15), at(110)), Decision::Wait);
        match decide(Some(&spec), "a", Duration::from_secs(15), at(116)) {
            Decision::Update(s) => {
                assert_eq!(s.holder_identity.as_deref(), Some("a"));
                assert_eq!(s.lease_transitions, Some(4));
            }
            d => panic!("unexpected {d:?}"),
        }
    }

    #[test]
    fn holder_renews_keeping_acquire_time() {
        let spec = LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(at(50))),
            renew_time: Some(MicroTime(at(100))),
            lease_transitions: Some(1),
            ..Default::default()
        };
        match decide(Some(&spec), "a", Duration::from_secs(15), at(102)) {
            Decision::Update(s) => {
                assert_eq!(s.acquire_time, Some(MicroTime(at(50))));
                assert_eq!(s.renew_time, Some(MicroTime(at(102))));
                assert_eq!(s.lease_transitions, Some(1));
            }
            d => panic!("unexpected {d:?}"),
        }
    }
}
