//! `scripts/cluster` after a crash, as a user whose machine had a bad moment meets it: a
//! component killed with `kill -9` comes back by itself (the supervisor), `up` never starts
//! a second copy of anything, pods keep running through it all (the same containers), a
//! component that cannot start is retried with growing back-off and reported, and
//! `down --purge` leaves no process, container, bridge or rule behind.
//!
//! The cluster runs on the host, so the test takes turns with every other test that runs
//! `scripts/cluster` (`host_cluster_lock`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::cluster::{component_pid, component_pids, script as cluster, sh_stdout as sh, status_row, Down};
use e2e::kubelet::{bridge_name, masq_chain};
use e2e::{free_port, host_cluster_lock, kubectl_bin};

const COMPONENTS: [&str; 6] =
    ["apiserver", "scheduler", "controller-manager", "cloud-controller-manager", "kubelet-node-1", "kubeproxy"];

fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(kubectl_bin())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn wait(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<(), String>) -> Duration {
    let start = Instant::now();
    loop {
        match f() {
            Ok(()) => return start.elapsed(),
            Err(e) if start.elapsed() > timeout => panic!("{what}: not within {timeout:?}; last: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Processes of ours on this host whose command line names `home` (what `down` must
/// leave none of), by program name.
fn processes_of(home: &Path) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let needle = format!("{}/", home.display());
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z'));
        let ours = [
            "apiserver",
            "scheduler",
            "controller-manager",
            "controller-mana",
            "cloud-controlle",
            "kubelet",
            "kubeproxy",
        ]
        .contains(&comm.as_str())
            || comm.starts_with("minik8s-supervi")
            || comm == "nginx";
        if ours && !zombie && cmd.contains(&needle) {
            out.entry(comm).or_default().push(pid);
        }
    }
    out
}

/// Exactly one process of each component, and it is the one the supervisor reports.
fn exactly_one_each(home: &Path) -> Result<(), String> {
    let procs = processes_of(home);
    for (comm, n) in [
        ("apiserver", 1),
        ("scheduler", 1),
        ("controller-mana", 1),
        ("cloud-controlle", 1),
        ("kubelet", 1),
        ("kubeproxy", 1),
    ] {
        let got = procs.get(comm).map(Vec::len).unwrap_or(0);
        if got != n {
            return Err(format!("{got} {comm} processes: {procs:?}"));
        }
    }
    for c in COMPONENTS {
        let pid = component_pid(home, c).ok_or(format!("{c} not running per the supervisor"))?;
        if !procs.values().flatten().any(|p| *p == pid) {
            return Err(format!("the supervisor's {c} (pid {pid}) is not the running one: {procs:?}"));
        }
    }
    Ok(())
}

/// A component's restarts, from the supervisor's status.
fn restarts_of(home: &Path, name: &str) -> u64 {
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(home.join("supervisor/status.json")).unwrap_or_default())
            .unwrap_or_default();
    doc["components"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .and_then(|c| c["restarts"].as_u64())
        .unwrap_or(0)
}

fn pod_containers(kc: &Path) -> String {
    let (_, out) = kubectl(kc, &["get", "pods", "-o", "jsonpath={.items[*].status.containerStatuses[*].containerID}"]);
    out
}

fn ready_replicas(kc: &Path, name: &str) -> i64 {
    let (_, out) = kubectl(kc, &["get", "deploy", name, "-o", "jsonpath={.status.readyReplicas}"]);
    out.trim().parse().unwrap_or(0)
}

#[test]
fn components_come_back_by_themselves_and_up_never_duplicates_one() {
    let _host = host_cluster_lock();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("state");
    let port = free_port();
    let down = Down(&home, port);
    let (ok, out) = cluster(&home, port, &["up"]);
    assert!(ok, "cluster up failed:\n{out}");
    let kc = home.join("kubeconfig");
    let (ok, out) =
        kubectl(&kc, &["create", "deployment", "web", "--image=busybox", "--replicas=2", "--", "sleep", "100000"]);
    assert!(ok, "{out}");
    wait("2 replicas ready", Duration::from_secs(120), || {
        let r = ready_replicas(&kc, "web");
        if r == 2 {
            Ok(())
        } else {
            Err(format!("{r} ready"))
        }
    });
    let containers = pod_containers(&kc);
    exactly_one_each(&home).unwrap();

    // 1. The control plane and the kubelet killed, kubeproxy left running; `up` 2 s later.
    let kubeproxy = component_pid(&home, "kubeproxy").unwrap();
    for c in ["apiserver", "kubelet-node-1", "controller-manager", "scheduler"] {
        sh(&format!("kill -9 {}", component_pid(&home, c).unwrap()));
    }
    std::thread::sleep(Duration::from_secs(2));
    let (ok, out) = cluster(&home, port, &["up"]);
    assert!(ok && out.contains("already up"), "up while the supervisor restarts them:\n{out}");
    wait("one of each after the kill", Duration::from_secs(60), || exactly_one_each(&home));
    assert_eq!(component_pid(&home, "kubeproxy"), Some(kubeproxy), "the running kubeproxy was left alone");
    wait("node Ready again", Duration::from_secs(60), || {
        let (ok, out) = kubectl(
            &kc,
            &["get", "node", "node-1", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"],
        );
        if ok && out == "True" {
            Ok(())
        } else {
            Err(out)
        }
    });

    // 2. apiserver and kubelet killed, `up` at once (before the processes are even reaped).
    for c in ["apiserver", "kubelet-node-1"] {
        sh(&format!("kill -9 {}", component_pid(&home, c).unwrap()));
    }
    let (ok, out) = cluster(&home, port, &["up"]);
    assert!(ok, "{out}");
    wait("one of each after the second kill", Duration::from_secs(60), || exactly_one_each(&home));
    let (ok, out) = cluster(&home, port, &["status"]);
    let row = status_row(&out, "apiserver").unwrap_or_default().to_string();
    assert!(
        ok && row.starts_with("running") && row.contains("signal 9 (SIGKILL)"),
        "status says why it restarted:\n{out}"
    );
    assert_eq!(restarts_of(&home, "apiserver"), 2, "the apiserver was restarted twice:\n{out}");

    // 3. A second kubelet for the node, or a second kubeproxy in this network namespace,
    //    refuses to start (the binaries' own locks), naming the one that runs.
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(home.join("supervisor/kubelet-node-1.json")).unwrap()).unwrap();
    let argv: Vec<String> = spec["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    let second = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && err.contains("a kubelet for node node-1 already runs"),
        "second kubelet: {err}"
    );
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(home.join("supervisor/kubeproxy.json")).unwrap()).unwrap();
    let argv: Vec<String> = spec["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    let second = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success() && err.contains("a kubeproxy in this network namespace already runs"), "{err}");
    exactly_one_each(&home).unwrap();

    // 4. The supervisor itself killed: its components go with it (no orphan), and `up`
    //    starts the same components again from their specs.
    let sup: u32 = std::fs::read_to_string(home.join("supervisor/supervisor.lock")).unwrap().trim().parse().unwrap();
    sh(&format!("kill -9 {sup}"));
    wait("every component gone with the supervisor", Duration::from_secs(10), || {
        let left: Vec<_> = processes_of(&home).into_iter().filter(|(c, _)| c != "nginx").collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    });
    let (ok, out) = cluster(&home, port, &["status"]);
    assert!(ok && out.contains("supervisor: not running"), "status after the supervisor died:\n{out}");
    let (ok, out) = cluster(&home, port, &["up"]);
    assert!(ok && out.contains("restarting the cluster's components"), "up after the supervisor died:\n{out}");
    wait("one of each after the supervisor's death", Duration::from_secs(60), || exactly_one_each(&home));

    // The pods were never restarted: the same containers throughout.
    wait("2 replicas ready after everything", Duration::from_secs(60), || {
        let r = ready_replicas(&kc, "web");
        if r == 2 {
            Ok(())
        } else {
            Err(format!("{r} ready"))
        }
    });
    assert_eq!(pod_containers(&kc), containers, "the pods' containers changed");

    // 5. Each component killed in turn while the Deployment scales: how long until the
    //    cluster has converged (printed; the figures go in the notes, not in assertions).
    let mut replicas = 2;
    for c in COMPONENTS {
        replicas = if replicas == 2 { 3 } else { 2 };
        let pid = component_pid(&home, c).unwrap();
        sh(&format!("kill -9 {pid}"));
        let t = Instant::now();
        // The scale goes to whichever apiserver answers (retried while it restarts).
        wait("scale accepted", Duration::from_secs(60), || {
            let (ok, out) = kubectl(&kc, &["scale", "deploy", "web", &format!("--replicas={replicas}")]);
            if ok {
                Ok(())
            } else {
                Err(out)
            }
        });
        wait(&format!("{replicas} replicas ready after killing {c}"), Duration::from_secs(120), || {
            let (ok, out) =
                kubectl(&kc, &["get", "deploy", "web", "-o", "jsonpath={.status.readyReplicas}/{.status.replicas}"]);
            if ok && out == format!("{replicas}/{replicas}") {
                Ok(())
            } else {
                Err(out)
            }
        });
        eprintln!("converged {:.1}s after kill -9 of {c}", t.elapsed().as_secs_f64());
        wait(&format!("one of each after killing {c}"), Duration::from_secs(60), || exactly_one_each(&home));
    }

    // 6. A component that cannot start: retried with growing back-off, reported, no spinning.
    std::fs::write(
        home.join("supervisor/crasher.json"),
        serde_json::json!({"name": "crasher", "argv": ["false"], "log": home.join("logs/crasher.log"), "order": 99})
            .to_string(),
    )
    .unwrap();
    sh(&format!("kill -HUP {}", std::fs::read_to_string(home.join("supervisor/supervisor.lock")).unwrap().trim()));
    let cpu = |pid: &str| -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let f: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
        (f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0))
            / 100.0
    };
    let sup = std::fs::read_to_string(home.join("supervisor/supervisor.lock")).unwrap().trim().to_string();
    let cpu_before = cpu(&sup);
    std::thread::sleep(Duration::from_secs(12));
    let (_, out) = cluster(&home, port, &["status"]);
    let row = status_row(&out, "crasher").unwrap_or_default().to_string();
    let restarts = restarts_of(&home, "crasher");
    // 1 + 2 + 4 s of back-off fit in 12 s, 1 + 2 + 4 + 8 do not: 3 or 4 restarts.
    assert!((2..=4).contains(&restarts) && row.contains("exit code 1"), "crasher backs off:\n{out}");
    assert!(row.starts_with("restarting in") || row.starts_with("running"), "crasher's state:\n{out}");
    let spent = cpu(&sup) - cpu_before;
    eprintln!("supervisor CPU over 12 s of a crash loop: {spent:.2} s");
    assert!(spent < 3.0, "the supervisor spins: {spent} s of CPU in 12 s");

    // 7. down --purge: nothing of the cluster is left.
    let pids: Vec<u32> = component_pids(&home).into_iter().map(|(_, p)| p).collect();
    drop(down);
    assert!(processes_of(&home).is_empty(), "processes left: {:?}", processes_of(&home));
    for p in pids {
        assert!(!Path::new(&format!("/proc/{p}")).exists() || sh(&format!("ps -o stat= -p {p}")).starts_with('Z'));
    }
    assert!(sh("docker ps -aq --filter label=minik8s.io/node=node-1").trim().is_empty(), "containers left");
    assert!(!sh("ip -o link show").contains(&bridge_name("node-1")), "bridge left");
    assert!(!e2e::cluster::host_has_any_service_chain(), "Service rules left");
    // This cluster's node's chain: other suites' kubelets (other node names) may run meanwhile.
    assert!(!sh("iptables-save").contains(&masq_chain("node-1")), "masquerade chain left");
}
