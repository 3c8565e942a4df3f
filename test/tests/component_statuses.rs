//! `kubectl get componentstatuses` (`cs`): the apiserver probes the scheduler's and the
//! controller-manager's `/healthz` on their default ports on its machine, as kube-apiserver
//! does, and reports its storage; the answer is the official kubectl's table with
//! Kubernetes' deprecation warning, and follows the components going up and down.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use e2e::ApiServer;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines().map(|l| l.split_whitespace().map(str::to_string).collect()).collect()
}

fn status_of<'a>(table: &'a [Vec<String>], name: &str) -> Option<&'a str> {
    table.iter().find(|r| r.first().map(String::as_str) == Some(name)).and_then(|r| r.get(1)).map(String::as_str)
}

#[test]
fn kubectl_get_componentstatuses_follows_the_control_plane() -> Result<()> {
    // The default ports are the host's: no scripts/cluster test may hold them meanwhile.
    let _host = e2e::host_cluster_lock();
    for port in [10259, 10257] {
        ensure!(TcpListener::bind(("127.0.0.1", port)).is_ok(), "something else listens on 127.0.0.1:{port}");
    }
    let api = ApiServer::start()?;
    let out = api.kubectl(&["get", "componentstatuses"])?;
    ensure!(out.ok, "{out:?}");
    ensure!(out.stderr.contains("Warning: v1 ComponentStatus is deprecated in v1.19+"), "{out:?}");
    let table = rows(&out.stdout);
    ensure!(table[0] == ["NAME", "STATUS", "MESSAGE", "ERROR"], "{}", out.stdout);
    ensure!(status_of(&table, "scheduler") == Some("Unhealthy"), "{}", out.stdout);
    ensure!(status_of(&table, "controller-manager") == Some("Unhealthy"), "{}", out.stdout);
    ensure!(
        out.stdout.contains("127.0.0.1:10259/healthz") && out.stdout.contains("onnection refused"),
        "{}",
        out.stdout
    );
    let storage = if std::env::var("MINIK8S_E2E_BACKEND").as_deref() == Ok("etcd") { "etcd-0" } else { "storage" };
    ensure!(table.iter().any(|r| r[..] == [storage, "Healthy", "ok"]), "{}", out.stdout);

    let spawn = |bin: std::path::PathBuf, conf: &str, port: &str| -> Result<Killed> {
        let child = Command::new(bin)
            .args(api.connect_args(conf))
            .args(["--bind-address", "127.0.0.1", "--secure-port", port, "--leader-elect=false"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Killed(child))
    };
    let scheduler = spawn(e2e::scheduler::scheduler_bin(), "scheduler.conf", "10259")?;
    let _cm = spawn(e2e::controller_manager::controller_manager_bin(), "controller-manager.conf", "10257")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = api.kubectl(&["get", "cs"])?;
        let table = rows(&out.stdout);
        if status_of(&table, "scheduler") == Some("Healthy")
            && status_of(&table, "controller-manager") == Some("Healthy")
        {
            ensure!(table.iter().all(|r| r.len() == 3 || r[0] == "NAME"), "healthy rows have no error: {}", out.stdout);
            break;
        }
        if Instant::now() > deadline {
            bail!("the components never became Healthy: {out:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let out =
        api.kubectl(&["get", "cs", "scheduler", "-o", "jsonpath={.conditions[0].type}={.conditions[0].status}"])?;
    ensure!(out.stdout == "Healthy=True", "{out:?}");
    drop(scheduler);
    let out =
        api.kubectl(&["get", "cs", "scheduler", "-o", "jsonpath={.conditions[0].status} {.conditions[0].error}"])?;
    ensure!(out.stdout.starts_with("False Get \"http://127.0.0.1:10259/healthz\""), "{out:?}");
    let out = api.kubectl(&["get", "cs", "nope"])?;
    ensure!(!out.ok && out.stderr.contains("componentstatuses \"nope\" not found"), "{out:?}");
    Ok(())
}
