//! `minik8s-supervisor`: keeps the components of one local cluster running, as systemd's
//! `Restart=always` or kind's container restart policies do, for machines where systemd is
//! not PID 1 (containers, CI). `scripts/cluster` starts one per state directory.
//!
//! - Each component is a spec file `<dir>/<name>.json` ([`policy::Spec`]); the supervisor
//!   starts them in order, and re-reads the directory on SIGHUP (new ones start, removed
//!   ones stop, changed ones restart).
//! - A component that exits is started again after a back-off that doubles with each quick
//!   crash in a row (1 s … 30 s) and resets after a healthy run; every exit and restart is
//!   logged with its reason and counted on `/metrics`.
//! - `<dir>/status.json` says, at every change, each component's pid, state, restarts and
//!   last exit: what `scripts/cluster status` prints.
//! - One supervisor per directory (a process lock), and its components cannot outlive it:
//!   each runs in its own process group with `PR_SET_PDEATHSIG`, so `kill -9` of the
//!   supervisor takes them along — never two copies, never an orphan.
//! - SIGTERM or SIGINT stops every component (reverse order: SIGTERM to the component,
//!   SIGKILL to its process group after `--stop-grace-seconds`), then the supervisor.
//!
//! `minik8s-supervisor certs init|renew|kubeconfig|ca-hash` is the cluster's PKI on disk
//! ([`certs`]): the supervisor is the one binary every machine of a cluster runs before its
//! components, so it is where certificates are made before they are needed.
//! `minik8s-supervisor store snapshot|info` copies the embedded store's file for backups
//! (the storage crate's `embedded::snapshot`), as `etcdctl snapshot save` does for etcd.
//! `minik8s-supervisor apiserver-lb` is the TCP load balancer in front of an HA cluster's
//! apiservers ([`lb`]).

mod certs;
mod lb;
mod policy;

use std::collections::BTreeMap;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use policy::Spec;
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};

#[derive(Parser, Debug)]
#[command(
    name = "minik8s-supervisor",
    about = "Keeps a local MiniK8s cluster's components running",
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true
)]
struct Args {
    /// The directory of component specs (`<name>.json`); the lock and `status.json` live
    /// there too.
    #[arg(long, required = true)]
    dir: Option<PathBuf>,
    /// Address for /healthz and /metrics (port 0: any free port, written to status.json).
    #[arg(long, default_value = "127.0.0.1:0")]
    metrics_bind_address: String,
    /// Seconds a component has to exit after SIGTERM before it is killed.
    #[arg(long, default_value_t = 10)]
    stop_grace_seconds: u64,
    /// Log level (or RUST_LOG).
    #[arg(long, default_value = "info")]
    log_level: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// The cluster's certificates and kubeconfigs (kubeadm-style).
    #[command(subcommand)]
    Certs(certs::Certs),
    /// The embedded store's file: snapshots for backups (`scripts/cluster backup`).
    #[command(subcommand)]
    Store(StoreCommand),
    /// A TCP load balancer in front of several apiservers (`scripts/cluster up --ha`): the
    /// one address the components' kubeconfigs name.
    ApiserverLb(lb::LbArgs),
}

#[derive(clap::Subcommand, Debug)]
enum StoreCommand {
    /// Write a consistent copy of the apiserver's embedded store (`<data-dir>/minik8s.db`)
    /// to FILE, safe while the apiserver runs; prints its revision and live keys.
    Snapshot {
        /// The apiserver's `--data-dir`.
        #[arg(long)]
        data_dir: PathBuf,
        /// The snapshot to write (must not exist).
        file: PathBuf,
    },
    /// Print the revision and live keys of a snapshot (or a stopped store's file).
    Info { file: PathBuf },
}

/// The store subcommands: one line `revision=R keys=K` on success.
fn store_command(cmd: StoreCommand) -> anyhow::Result<()> {
    let info = match cmd {
        StoreCommand::Snapshot { data_dir, file } => {
            storage::embedded::snapshot(&data_dir.join("minik8s.db"), &file)
                .with_context(|| format!("snapshot of {} to {}", data_dir.display(), file.display()))?
        }
        StoreCommand::Info { file } => {
            storage::embedded::snapshot_info(&file).with_context(|| format!("reading {}", file.display()))?
        }
    };
    println!("revision={} keys={}", info.revision, info.keys);
    Ok(())
}

/// One supervised component and what is known of it.
struct Component {
    spec: Spec,
    child: Option<tokio::process::Child>,
    started: Option<Instant>,
    started_at: Option<u64>,
    /// Start attempts so far; every one after the first is a restart.
    attempts: u32,
    crashes: u32,
    last_exit: Option<String>,
    last_exit_at: Option<u64>,
    next_start: Option<Instant>,
}

impl Component {
    fn new(spec: Spec) -> Self {
        Component {
            spec,
            child: None,
            started: None,
            started_at: None,
            attempts: 0,
            crashes: 0,
            last_exit: None,
            last_exit_at: None,
            next_start: Some(Instant::now()),
        }
    }

    fn status(&self, now: Instant) -> serde_json::Value {
        let pid = self.child.as_ref().and_then(|c| c.id());
        let state = match (pid, self.next_start) {
            (Some(_), _) => "running",
            (None, Some(_)) => "waiting",
            (None, None) => "stopped",
        };
        json!({
            "name": self.spec.name,
            "pid": pid,
            "state": state,
            "restarts": self.attempts.saturating_sub(1),
            "startedAt": self.started_at,
            "lastExit": self.last_exit,
            "lastExitAt": self.last_exit_at,
            "nextStartInSeconds": self.next_start.filter(|_| pid.is_none()).map(|t| t.saturating_duration_since(now).as_secs_f64()),
        })
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Every `<name>.json` spec of `dir` (a file that does not parse is logged and skipped).
fn read_specs(dir: &Path) -> anyhow::Result<BTreeMap<String, Spec>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") || path.file_name().is_some_and(|n| n == "status.json") {
            continue;
        }
        match std::fs::read(&path).map_err(anyhow::Error::from).and_then(|b| Ok(serde_json::from_slice::<Spec>(&b)?)) {
            Ok(spec) if !spec.argv.is_empty() => {
                out.insert(spec.name.clone(), spec);
            }
            Ok(_) => tracing::error!(spec = %path.display(), "spec has an empty argv; ignored"),
            Err(e) => tracing::error!(spec = %path.display(), error = %e, "unreadable spec; ignored"),
        }
    }
    Ok(out)
}

/// Start a component: its own process group, killed if the supervisor dies, output appended
/// to its log.
fn spawn(spec: &Spec) -> std::io::Result<tokio::process::Child> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&spec.log)?;
    let mut cmd = std::process::Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..]).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The supervisor died between fork and prctl: do not run orphaned.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("supervisor gone"));
            }
            Ok(())
        });
    }
    tokio::process::Command::from(cmd).spawn()
}

/// Signal a component's whole process group.
fn signal_group(child: &tokio::process::Child, sig: libc::c_int) {
    if let Some(pid) = child.id() {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(-(pid as libc::pid_t), sig);
        }
    }
}

/// Stop one component: SIGTERM to it alone (it stops what it started itself, as kubeproxy
/// stops its nginx), SIGKILL to its whole group after `grace`. Answers how it ended.
async fn stop(c: &mut Component, grace: Duration) -> Option<String> {
    let mut child = c.child.take()?;
    if let Some(pid) = child.id() {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            tracing::warn!(component = %c.spec.name, "did not stop within {grace:?}; killing it");
            signal_group(&child, libc::SIGKILL);
            child.wait().await.ok()
        }
    };
    // Whatever else its group started (nginx under kubeproxy) goes too.
    signal_group(&child, libc::SIGKILL);
    let how = status.map(|s| policy::describe_exit(s.code(), s.signal()));
    c.last_exit = how.clone();
    c.last_exit_at = Some(unix_now());
    c.next_start = None;
    how
}

struct Metrics {
    restarts: prometheus::IntCounterVec,
    up: prometheus::IntGaugeVec,
}

impl Metrics {
    fn new(registry: &prometheus::Registry) -> anyhow::Result<Self> {
        let restarts = prometheus::IntCounterVec::new(
            prometheus::Opts::new("minik8s_supervisor_restarts_total", "Restarts of each component after it exited"),
            &["component"],
        )?;
        let up = prometheus::IntGaugeVec::new(
            prometheus::Opts::new("minik8s_supervisor_component_up", "1 while the component runs"),
            &["component"],
        )?;
        registry.register(Box::new(restarts.clone()))?;
        registry.register(Box::new(up.clone()))?;
        Ok(Metrics { restarts, up })
    }
}

fn write_status(dir: &Path, comps: &BTreeMap<String, Component>, metrics_addr: &str) {
    let now = Instant::now();
    let mut list: Vec<&Component> = comps.values().collect();
    list.sort_by_key(|c| (c.spec.order, c.spec.name.clone()));
    let doc = json!({
        "supervisor": {"pid": std::process::id(), "metrics": metrics_addr},
        "components": list.iter().map(|c| c.status(now)).collect::<Vec<_>>(),
    });
    let tmp = dir.join(".status.json.tmp");
    let ok = std::fs::write(&tmp, format!("{doc:#}\n")).and_then(|_| std::fs::rename(&tmp, dir.join("status.json")));
    if let Err(e) = ok {
        tracing::warn!(error = %e, "cannot write status.json");
    }
}

// One thread: PR_SET_PDEATHSIG fires when the *thread* that forked a child exits, so every
// child is forked by the main thread, which lives as long as the process.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    common::init_tracing(&args.log_level);
    let dir = match (args.command, args.dir) {
        (Some(Command::Certs(cmd)), _) => return certs::run(cmd),
        (Some(Command::Store(cmd)), _) => return store_command(cmd),
        (Some(Command::ApiserverLb(a)), _) => return lb::run(a).await,
        (None, Some(dir)) => dir,
        (None, None) => anyhow::bail!("--dir is required"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _lock =
        common::lock::acquire(&dir.join("supervisor.lock"), &format!("a minik8s-supervisor for {}", dir.display()))?;
    let registry = prometheus::Registry::new();
    let metrics = Metrics::new(&registry)?;
    let ready = common::Ready::default();
    ready.set(true);
    let bound = common::serve_health(args.metrics_bind_address.parse()?, registry, ready).await?;
    let metrics_addr = bound.to_string();
    tracing::info!(dir = %dir.display(), %bound, "supervising");
    let grace = Duration::from_secs(args.stop_grace_seconds);

    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut comps: BTreeMap<String, Component> =
        read_specs(&dir)?.into_iter().map(|(n, s)| (n, Component::new(s))).collect();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut dirty = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = hup.recv() => {
                let wanted = match read_specs(&dir) {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot re-read the specs; keeping the current ones");
                        continue;
                    }
                };
                let running: BTreeMap<String, Spec> = comps.iter().map(|(n, c)| (n.clone(), c.spec.clone())).collect();
                let r = policy::reload(&running, &wanted);
                tracing::info!(start = ?r.start, stop = ?r.stop, restart = ?r.restart, "specs re-read");
                for n in r.stop.iter().chain(&r.restart) {
                    if let Some(mut c) = comps.remove(n) {
                        stop(&mut c, grace).await;
                        metrics.up.with_label_values(&[n.as_str()]).set(0);
                    }
                }
                for n in r.start.iter().chain(&r.restart) {
                    if let Some(spec) = wanted.get(n) {
                        comps.insert(n.clone(), Component::new(spec.clone()));
                    }
                }
                dirty = true;
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        let now = Instant::now();
        // Exits first, then the starts that are due, in order.
        for c in comps.values_mut() {
            let Some(child) = c.child.as_mut() else { continue };
            let Ok(Some(status)) = child.try_wait() else { continue };
            // Anything the component left in its group (none normally) goes with it.
            signal_group(child, libc::SIGKILL);
            c.child = None;
            let ran = c.started.map(|s| now.duration_since(s)).unwrap_or_default();
            let how = policy::describe_exit(status.code(), status.signal());
            let delay = policy::backoff(ran, &mut c.crashes);
            tracing::warn!(component = %c.spec.name, exit = %how, ran_for = ?ran, restart_in = ?delay, "component exited; restarting");
            c.last_exit = Some(how);
            c.last_exit_at = Some(unix_now());
            c.next_start = Some(now + delay);
            metrics.up.with_label_values(&[c.spec.name.as_str()]).set(0);
            dirty = true;
        }
        let mut due: Vec<&mut Component> =
            comps.values_mut().filter(|c| c.child.is_none() && c.next_start.is_some_and(|t| t <= now)).collect();
        due.sort_by_key(|c| (c.spec.order, c.spec.name.clone()));
        for c in due {
            c.attempts += 1;
            if c.attempts > 1 {
                metrics.restarts.with_label_values(&[c.spec.name.as_str()]).inc();
            }
            match spawn(&c.spec) {
                Ok(child) => {
                    tracing::info!(component = %c.spec.name, pid = ?child.id(), restarts = c.attempts - 1, "started");
                    c.child = Some(child);
                    c.started = Some(now);
                    c.started_at = Some(unix_now());
                    c.next_start = None;
                    metrics.up.with_label_values(&[c.spec.name.as_str()]).set(1);
                }
                Err(e) => {
                    let delay = policy::backoff(Duration::ZERO, &mut c.crashes);
                    tracing::error!(component = %c.spec.name, error = %e, retry_in = ?delay, "cannot start");
                    c.last_exit = Some(format!("cannot start: {e}"));
                    c.last_exit_at = Some(unix_now());
                    c.next_start = Some(now + delay);
                }
            }
            dirty = true;
        }
        if dirty {
            write_status(&dir, &comps, &metrics_addr);
            dirty = false;
        }
    }

    tracing::info!("stopping every component");
    let mut order: Vec<String> = comps.keys().cloned().collect();
    order.sort_by_key(|n| std::cmp::Reverse((comps[n].spec.order, n.clone())));
    for n in order {
        if let Some(c) = comps.get_mut(&n) {
            if let Some(how) = stop(c, grace).await {
                tracing::info!(component = %n, exit = %how, "stopped");
            }
        }
    }
    write_status(&dir, &comps, &metrics_addr);
    Ok(())
}
