//! `controller-manager`: MiniK8s' kube-controller-manager. One binary runs the
//! controllers selected by `--controllers` (Kubernetes' syntax: `*` for all, `foo` to
//! enable, `-foo` to disable), optionally behind leader election on a Lease in
//! `kube-system`, with `/healthz` and `/metrics`.
//!
//! Each controller is a module whose decisions are pure functions (unit-tested) and
//! whose reconcile function is a thin I/O shell over them.

mod certificates;
mod clusterroleaggregation;
mod credentials;
mod cronjob;
mod daemonset;
mod deployment;
mod discovery;
mod disruption;
mod endpoints;
mod garbagecollector;
mod history;
mod informer;
mod job;
mod metrics;
mod namespace;
mod nodeipam;
mod nodelifecycle;
mod pernamespace;
mod podautoscaler;
mod podgc;
mod replicaset;
mod rootcacertpublisher;
mod runner;
mod serviceaccount;
mod statefulset;
mod triggertime;
mod util;
mod volume;

#[cfg(test)]
mod testutil;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

/// Errors of a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Other(String),
}

/// Every controller this binary has, and whether `*` enables it (Kubernetes' names).
pub const CONTROLLERS: &[(&str, bool)] = &[
    ("replicaset", true),
    ("deployment", true),
    ("endpointslice", true),
    ("endpoints", true),
    ("garbagecollector", true),
    ("namespace", true),
    ("nodeipam", true),
    ("nodelifecycle", true),
    ("job", true),
    ("cronjob", true),
    ("serviceaccount", true),
    ("root-ca-cert-publisher", true),
    ("disruption", true),
    ("horizontalpodautoscaling", true),
    ("persistentvolume-binder", true),
    ("pvc-protection", true),
    ("pv-protection", true),
    ("statefulset", true),
    ("daemonset", true),
    ("podgc", true),
    ("clusterrole-aggregation", true),
    ("csrapproving", true),
    ("csrsigning", true),
    // Ours, off by default: Kubernetes approves no kubelet serving certificate by itself.
    ("kubelet-serving-csr-approving", false),
];

/// Parse `--controllers` (`*,-foo,bar`) into the enabled set (`cmd/kube-controller-manager`'s
/// `IsControllerEnabled`): an explicit name wins over `*`, `-name` disables.
pub fn enabled_controllers(spec: &str) -> Result<Vec<&'static str>, String> {
    let items: Vec<&str> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    for it in &items {
        let n = it.trim_start_matches('-');
        if n != "*" && !CONTROLLERS.iter().any(|(c, _)| *c == n) {
            return Err(format!("{n:?} is not in the list of known controllers"));
        }
    }
    Ok(CONTROLLERS
        .iter()
        .filter(|(name, default_on)| {
            if items.iter().any(|i| *i == format!("-{name}")) {
                false
            } else if items.iter().any(|i| i == name) {
                true
            } else {
                items.contains(&"*") && *default_on
            }
        })
        .map(|(n, _)| *n)
        .collect())
}

#[derive(Parser, Debug)]
#[command(name = "controller-manager", about = "MiniK8s controller manager")]
#[command(mut_arg(common::leader::RESOURCE_NAME, common::leader::default_name("kube-controller-manager")))]
// The controller-manager's durations keep its own syntax (`parse_duration`), the leader
// election's three too.
#[command(mut_arg("leader_elect_lease_duration", |a| a.value_parser(parse_duration)))]
#[command(mut_arg("leader_elect_renew_deadline", |a| a.value_parser(parse_duration)))]
#[command(mut_arg("leader_elect_retry_period", |a| a.value_parser(parse_duration)))]
struct Args {
    /// Path to a kubeconfig file.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The address of the apiserver (overrides the kubeconfig's).
    #[arg(long, alias = "server")]
    master: Option<String>,
    /// Controllers to enable: `*` enables all on-by-default ones, `foo` enables foo,
    /// `-foo` disables foo.
    #[arg(long, default_value = "*")]
    controllers: String,
    #[command(flatten)]
    leader: common::leader::Args,
    #[command(flatten)]
    volumes: volume::VolumeArgs,
    #[command(flatten)]
    podgc: podgc::PodGcArgs,
    /// Run each controller as its own ServiceAccount in kube-system (Kubernetes' names and
    /// bootstrap roles) instead of this process's identity; needs the apiserver's token
    /// issuer (--service-account-signing-key-file).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    use_service_account_credentials: bool,
    /// The CA bundle that verifies the apiserver, published in every namespace as the
    /// `kube-root-ca.crt` ConfigMap (empty without it: a plain-HTTP cluster).
    #[arg(long)]
    root_ca_file: Option<PathBuf>,
    /// CA certificate (PEM) that signs the certificates of approved requests of the built-in
    /// signers (csrsigning); without it and --cluster-signing-key-file nothing is signed.
    #[arg(long)]
    cluster_signing_cert_file: Option<PathBuf>,
    /// Key of --cluster-signing-cert-file.
    #[arg(long)]
    cluster_signing_key_file: Option<PathBuf>,
    /// The longest a signed certificate is valid (a request may ask for less).
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    cluster_signing_duration: Duration,
    /// CIDR range for pods in the cluster (node IPAM).
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: String,
    /// Mask size of each node's pod CIDR.
    #[arg(long, default_value_t = 24)]
    node_cidr_mask_size: u8,
    /// How long a Node may go without a heartbeat before it is marked unhealthy.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    node_monitor_grace_period: Duration,
    /// How often Node health is checked.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    node_monitor_period: Duration,
    /// Toleration seconds for the not-ready/unreachable NoExecute taints of pods that do
    /// not declare one (the DefaultTolerationSeconds admission default).
    #[arg(long, default_value_t = 300)]
    default_unreachable_toleration_seconds: i64,
    /// Concurrent ReplicaSet syncs.
    #[arg(long, default_value_t = 5)]
    concurrent_replicaset_syncs: u16,
    /// Concurrent Deployment syncs.
    #[arg(long, default_value_t = 5)]
    concurrent_deployment_syncs: u16,
    /// How often every HorizontalPodAutoscaler is synced.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    horizontal_pod_autoscaler_sync_period: Duration,
    /// How long a scale-down waits: the highest recommendation of this window wins.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    horizontal_pod_autoscaler_downscale_stabilization: Duration,
    /// The usage ratio's distance from 1.0 under which no scaling happens.
    #[arg(long, default_value_t = 0.1)]
    horizontal_pod_autoscaler_tolerance: f64,
    /// After a pod starts, how long its CPU samples are trusted only once it is Ready.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    horizontal_pod_autoscaler_cpu_initialization_period: Duration,
    /// After a pod starts, how long it may take to become Ready before it counts as unready.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    horizontal_pod_autoscaler_initial_readiness_delay: Duration,
    /// Address to serve /healthz and /metrics on.
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: String,
    /// Port for /healthz and /metrics (0 = pick a free one, -1... disabled is not supported).
    #[arg(long, alias = "port", default_value_t = 10257)]
    secure_port: u16,
    /// Log level (or RUST_LOG).
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    apimachinery::duration::parse_seconds_or_go_duration(s)
}

fn to_signed(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}

/// The discovery catalog, started by the first controller that needs it.
async fn shared_catalog(
    slot: &mut Option<tokio::sync::watch::Receiver<std::sync::Arc<discovery::Catalog>>>,
    client: &kube::Client,
) -> tokio::sync::watch::Receiver<std::sync::Arc<discovery::Catalog>> {
    match slot {
        Some(c) => c.clone(),
        None => slot.insert(discovery::spawn(client.clone()).await).clone(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::init_tracing(&args.log_level);
    let _trimmer = common::memory::spawn_trimmer(common::memory::TRIM_INTERVAL);
    let enabled = enabled_controllers(&args.controllers).map_err(|e| anyhow::anyhow!("--controllers: {e}"))?;
    let config = common::config(args.kubeconfig.as_deref(), args.master.as_deref()).await?;
    let client = kube::Client::try_from(config.clone())?;
    let ready = common::Ready::default();
    let addr: SocketAddr = format!("{}:{}", args.bind_address, args.secure_port).parse()?;
    let bound = common::serve_health(addr, prometheus::Registry::new(), ready.clone()).await?;
    tracing::info!(%bound, "serving /healthz and /metrics");

    let leading = common::leader::elect(&client, &args.leader).await?;
    ready.set(true);
    tracing::info!(controllers = ?enabled, "starting controllers");

    let pods = informer::Informer::start(Api::<Pod>::all(client.clone()));
    let events = common::events::Recorder::new(client.clone(), "kube-controller-manager");
    let recorder = |c: &str| events.for_component(c);
    // ControllerRevisions: one watch for the StatefulSet and DaemonSet controllers.
    let revisions = enabled
        .iter()
        .any(|c| matches!(*c, "statefulset" | "daemonset"))
        .then(|| informer::Informer::start(Api::<ControllerRevision>::all(client.clone())));
    let mut tasks = tokio::task::JoinSet::new();
    // One discovery catalog for the controllers that follow every served kind.
    let mut catalog = None;
    let mut credentials = if args.use_service_account_credentials {
        Some(credentials::Credentials::new(config, client.clone())?)
    } else {
        None
    };
    for c in &enabled {
        // The client this controller writes with: its own account's, or this process's.
        let own = client.clone();
        let client = match &mut credentials {
            Some(creds) => creds.client(credentials::service_account(c)).await?,
            None => own.clone(),
        };
        match *c {
            "replicaset" => {
                tasks.spawn(replicaset::run(
                    client.clone(),
                    pods.clone(),
                    recorder("replicaset-controller"),
                    args.concurrent_replicaset_syncs,
                ));
            }
            "deployment" => {
                tasks.spawn(deployment::run(
                    client.clone(),
                    pods.clone(),
                    recorder("deployment-controller"),
                    args.concurrent_deployment_syncs,
                ));
            }
            "endpointslice" => {
                tasks.spawn(endpoints::run_slices(client.clone(), pods.clone()));
            }
            "endpoints" => {
                tasks.spawn(endpoints::run_endpoints(client.clone(), pods.clone()));
            }
            "garbagecollector" => {
                let catalog = shared_catalog(&mut catalog, &own).await;
                tasks.spawn(garbagecollector::run(client.clone(), catalog, recorder("garbage-collector-controller")));
            }
            "namespace" => {
                tasks.spawn(namespace::run(client.clone()));
            }
            "nodeipam" => {
                let cidr = args.cluster_cidr.clone();
                let mask = args.node_cidr_mask_size;
                tasks.spawn(nodeipam::run(client.clone(), cidr, mask, recorder("node-controller")));
            }
            "nodelifecycle" => {
                let settings = nodelifecycle::Settings {
                    grace: args.node_monitor_grace_period,
                    monitor_period: args.node_monitor_period,
                    default_toleration_seconds: args.default_unreachable_toleration_seconds,
                };
                tasks.spawn(nodelifecycle::run(client.clone(), pods.clone(), settings, recorder("node-controller")));
            }
            "cronjob" => {
                tasks.spawn(cronjob::run(client.clone(), recorder("cronjob-controller")));
            }
            "job" => {
                tasks.spawn(job::run(client.clone(), pods.clone(), recorder("job-controller")));
            }
            "serviceaccount" => {
                tasks.spawn(serviceaccount::run(client.clone()));
            }
            "root-ca-cert-publisher" => {
                let ca = match &args.root_ca_file {
                    Some(path) => std::fs::read_to_string(path)
                        .map_err(|e| anyhow::anyhow!("cannot read --root-ca-file {}: {e}", path.display()))?,
                    None => String::new(),
                };
                tasks.spawn(rootcacertpublisher::run(client.clone(), ca));
            }
            "csrapproving" => {
                tasks.spawn(certificates::approver::run(client.clone()));
            }
            "kubelet-serving-csr-approving" => {
                tasks.spawn(certificates::serving::run(client.clone()));
            }
            "csrsigning" => match (&args.cluster_signing_cert_file, &args.cluster_signing_key_file) {
                (Some(cert), Some(key)) => {
                    let read = |p: &PathBuf, flag: &str| {
                        std::fs::read_to_string(p)
                            .map_err(|e| anyhow::anyhow!("cannot read {flag} {}: {e}", p.display()))
                    };
                    let ca = common::pki::Ca {
                        cert_pem: read(cert, "--cluster-signing-cert-file")?,
                        key_pem: read(key, "--cluster-signing-key-file")?,
                    };
                    tasks.spawn(certificates::signer::run(client.clone(), ca, args.cluster_signing_duration));
                }
                _ => tracing::warn!(
                    "skipping the CSR signer: no --cluster-signing-cert-file and --cluster-signing-key-file"
                ),
            },
            "clusterrole-aggregation" => {
                tasks.spawn(clusterroleaggregation::run(client.clone()));
            }
            "disruption" => {
                tasks.spawn(disruption::run(client.clone(), pods.clone()));
            }
            "horizontalpodautoscaling" => {
                let catalog = shared_catalog(&mut catalog, &own).await;
                let cfg = podautoscaler::Config {
                    sync_period: args.horizontal_pod_autoscaler_sync_period,
                    downscale_stabilization: args.horizontal_pod_autoscaler_downscale_stabilization,
                    calc: podautoscaler::replicas::Settings {
                        tolerance: args.horizontal_pod_autoscaler_tolerance,
                        cpu_initialization_period: to_signed(args.horizontal_pod_autoscaler_cpu_initialization_period),
                        initial_readiness_delay: to_signed(args.horizontal_pod_autoscaler_initial_readiness_delay),
                    },
                };
                tasks.spawn(podautoscaler::run(
                    client.clone(),
                    pods.clone(),
                    catalog,
                    recorder("horizontal-pod-autoscaler"),
                    cfg,
                ));
            }
            c if volume::CONTROLLERS.contains(&c) => {
                tasks.spawn(volume::run(c, client.clone(), pods.clone(), events.clone(), args.volumes.clone()));
            }
            "statefulset" => {
                if let Some(revs) = &revisions {
                    let r = recorder("statefulset-controller");
                    tasks.spawn(statefulset::run(client.clone(), pods.clone(), revs.clone(), r));
                }
            }
            "daemonset" => {
                if let Some(revs) = &revisions {
                    let r = recorder("daemonset-controller");
                    tasks.spawn(daemonset::run(client.clone(), pods.clone(), revs.clone(), r));
                }
            }
            "podgc" => {
                tasks.spawn(podgc::run(client.clone(), pods.clone(), args.podgc.clone()));
            }
            _ => {}
        }
    }
    common::leader::run_controllers(leading, tasks).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_selection() {
        // `*` is every controller on by default; the others only by name.
        assert_eq!(enabled_controllers("*").unwrap().len(), CONTROLLERS.len() - 1);
        assert!(!enabled_controllers("*").unwrap().contains(&"kubelet-serving-csr-approving"));
        assert!(enabled_controllers("*,kubelet-serving-csr-approving")
            .unwrap()
            .contains(&"kubelet-serving-csr-approving"));
        let e = enabled_controllers("*,-job").unwrap();
        assert!(!e.contains(&"job") && e.contains(&"replicaset"));
        assert_eq!(enabled_controllers("replicaset,deployment").unwrap(), vec!["replicaset", "deployment"]);
        assert!(enabled_controllers("*,nope").is_err());
    }

    #[test]
    fn leader_election_flags() {
        let a = Args::try_parse_from(["controller-manager"]).unwrap();
        assert!(a.leader.leader_elect);
        let c = a.leader.config("me");
        assert_eq!((c.namespace.as_str(), c.name.as_str()), ("kube-system", "kube-controller-manager"));
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (Duration::from_secs(15), Duration::from_secs(10), Duration::from_secs(2))
        );
        // This binary's duration syntax: a bare number is seconds.
        let a = Args::try_parse_from([
            "controller-manager",
            "--leader-elect=false",
            "--leader-elect-lease-duration=4",
            "--leader-elect-renew-deadline=3s",
            "--leader-elect-retry-period=500ms",
        ])
        .unwrap();
        assert!(!a.leader.leader_elect);
        let c = a.leader.config("me");
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (Duration::from_secs(4), Duration::from_secs(3), Duration::from_millis(500))
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("40s").unwrap(), Duration::from_secs(40));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    }
}
