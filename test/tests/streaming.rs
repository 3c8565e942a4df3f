//! `kubectl exec` / `attach` end to end: the official kubectl (1.33 and 1.32 speak WebSocket
//! `v5.channel.k8s.io`, 1.29 and 1.27 SPDY/3.1), the `kube` crate's `Api::<Pod>::exec`/`attach`,
//! and our kubectl, through the real apiserver's upgrade proxy to the real kubelet on Docker.
//! Every test removes its node's containers on drop, also on failure.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use e2e::kubectl::{our_kubectl, run, Run};
use e2e::kubelet::Node as Env;
use e2e::official_kubectls;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, PostParams};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Create a pod of long-running busybox containers on the node and wait until it runs.
async fn running_pod(env: &Env, name: &str, containers: &[&str], annotations: Value) -> Result<()> {
    let containers: Vec<Value> = containers
        .iter()
        .map(|c| {
            json!({"name": c, "image": "busybox", "imagePullPolicy": "IfNotPresent",
                   "command": ["sh", "-c", format!("echo started {c}; while true; do sleep 1; done")]})
        })
        .collect();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations, "labels": {"app": name}},
        "spec": {"nodeName": env.kubelet.node, "terminationGracePeriodSeconds": 1, "containers": containers},
    }))?;
    let api: Api<Pod> = Api::namespaced(env.api.client()?, "default");
    api.create(&PostParams::default(), &pod).await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        let p = api.get(name).await?;
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("pod {name} not Running in 90s; kubelet log:\n{}", env.kubelet.log())
}

fn kubectl(env: &Env, bin: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Result<Run> {
    run(bin, &env.api.url(), args, stdin)
}

/// The official kubectl — 1.33 and 1.32 over WebSocket, 1.29 and 1.27 over SPDY (the kubelet's
/// `spdy_exec.rs`, same session) — output, stdin, exit codes, containers, errors.
#[tokio::test(flavor = "multi_thread")]
async fn official_kubectl_exec() -> Result<()> {
    let Some(env) = Env::start("st-exec")? else { return Ok(()) };
    running_pod(&env, "box", &["main"], json!({})).await?;
    running_pod(&env, "duo", &["first", "second"], json!({"kubectl.kubernetes.io/default-container": "second"}))
        .await?;
    for (v, bin) in official_kubectls(&["1.33", "1.32", "1.29", "1.27"]) {
        // stdout, with the pod's hostname
        let r = kubectl(&env, &bin, &["exec", "box", "--", "cat", "/etc/hostname"], None)?;
        ensure!(r.code == 0 && r.stdout == "box\n", "kubectl {v} exec cat: {r:?}");
        // stdout and stderr apart
        let r = kubectl(&env, &bin, &["exec", "box", "--", "sh", "-c", "echo out; echo err >&2"], None)?;
        ensure!(r.code == 0 && r.stdout == "out\n" && r.stderr == "err\n", "kubectl {v} stderr: {r:?}");
        // stdin
        let r = kubectl(&env, &bin, &["exec", "-i", "box", "--", "cat"], Some("hi\nthere\n"))?;
        ensure!(r.code == 0 && r.stdout == "hi\nthere\n", "kubectl {v} exec -i: {r:?}");
        let big: String = (0..20000).map(|i| format!("line {i}\n")).collect();
        let r = kubectl(&env, &bin, &["exec", "-i", "box", "--", "wc", "-l"], Some(&big))?;
        ensure!(r.code == 0 && r.stdout.trim() == "20000", "kubectl {v} exec -i (big): {:?}", r.stdout);
        // exit codes
        let r = kubectl(&env, &bin, &["exec", "box", "--", "sh", "-c", "echo partial; exit 3"], None)?;
        ensure!(r.code == 3, "kubectl {v} exit 3: {r:?}");
        ensure!(r.stdout == "partial\n", "kubectl {v}: {r:?}");
        ensure!(r.stderr.contains("command terminated with exit code 3"), "kubectl {v}: {r:?}");
        // containers: -c, the default-container annotation, a missing one
        let r = kubectl(&env, &bin, &["exec", "duo", "-c", "first", "--", "sh", "-c", "cat /proc/1/cmdline"], None)?;
        ensure!(r.code == 0 && r.stdout.contains("started first"), "kubectl {v} -c first: {r:?}");
        let r = kubectl(&env, &bin, &["exec", "duo", "--", "sh", "-c", "cat /proc/1/cmdline"], None)?;
        ensure!(r.code == 0 && r.stdout.contains("started second"), "kubectl {v} default container: {r:?}");
        let r = kubectl(&env, &bin, &["exec", "duo", "-c", "nope", "--", "true"], None)?;
        ensure!(r.code == 1 && r.stderr.contains("container nope is not valid for pod duo"), "kubectl {v}: {r:?}");
        let r = kubectl(&env, &bin, &["exec", "ghost", "--", "true"], None)?;
        ensure!(r.code == 1 && r.stderr.contains("pods \"ghost\" not found"), "kubectl {v}: {r:?}");
        // a command that does not exist
        // (Docker's runtime reports it on the output and exits 126, as with cri-dockerd.)
        let r = kubectl(&env, &bin, &["exec", "box", "--", "no-such-command"], None)?;
        ensure!(r.code == 126, "kubectl {v} missing command: {r:?}");
        ensure!(r.stdout.contains("executable file not found"), "kubectl {v} missing command: {r:?}");
        ensure!(r.stderr.contains("command terminated with exit code 126"), "kubectl {v} missing command: {r:?}");
    }
    Ok(())
}

/// The kubelet's debug line for Docker accepting the 77x22 terminal size.
const RESIZED: &str = "resized the exec tty width=77 height=22";

/// How often the kubelet's log (colours removed) records [`RESIZED`].
fn resizes(env: &Env) -> usize {
    let log = env.kubelet.log();
    let mut plain = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain.matches(RESIZED).count()
}

/// Run `kubectl … exec -it …` on a pseudo-terminal of 22 rows and 77 columns (`script`).
fn on_terminal(env: &Env, bin: &std::path::Path, exec_args: &str) -> Result<(i32, String)> {
    let cmd = format!("stty cols 77 rows 22; {} --server {} exec -it {exec_args}", bin.display(), env.api.url());
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("KUBECONFIG", "/dev/null")
        .stdin(std::process::Stdio::null())
        .output()?;
    Ok((out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// `-it` on a terminal: the container gets a tty of the terminal's size, output comes back
/// through it (CRLF), and the exit code still propagates — official kubectl and ours.
#[tokio::test(flavor = "multi_thread")]
async fn exec_with_a_terminal() -> Result<()> {
    let Some(env) = Env::start("st-tty")? else { return Ok(()) };
    let script_ok = std::process::Command::new("script").arg("--version").output().is_ok_and(|o| o.status.success());
    if !script_ok {
        ensure!(std::env::var("CI").as_deref() != Ok("true"), "CI=true but `script` (util-linux) is missing");
        eprintln!("SKIPPED: no `script` (util-linux) for a pseudo-terminal");
        return Ok(());
    }
    running_pod(&env, "tbox", &["main"], json!({})).await?;
    let mut bins: Vec<(String, std::path::PathBuf)> = official_kubectls(&["1.33", "1.32"]);
    bins.push(("ours".into(), our_kubectl()));
    for (v, bin) in bins {
        let before = resizes(&env);
        let (code, out) = on_terminal(&env, &bin, "tbox -- sh -c 'sleep 1; tty; echo done'")?;
        ensure!(code == 0, "kubectl {v}: exit {code}: {out:?}");
        ensure!(out.contains("/dev/pts/"), "kubectl {v}: no tty in the container: {out:?}");
        // A tty turns the container's \n into \r\n.
        ensure!(out.contains("done\r\n"), "kubectl {v}: {out:?}");
        // The terminal's size reached Docker's exec resize. (This engine's busybox `stty size`
        // cannot read a tty size back, so the kubelet's record of Docker's answer is the proof.)
        let after = resizes(&env);
        ensure!(after > before, "kubectl {v}: terminal size 77x22 not passed on to Docker:\n{}", env.kubelet.log());
        let (code, out) = on_terminal(&env, &bin, "tbox -- sh -c 'exit 5'")?;
        ensure!(code == 5 && out.contains("command terminated with exit code 5"), "kubectl {v}: {code} {out:?}");
    }
    Ok(())
}

/// The `kube` crate's `Api::<Pod>::exec` (WebSocket, v5 then v4): stdout capture, stdin, and
/// the exit status.
#[tokio::test(flavor = "multi_thread")]
async fn kube_crate_exec() -> Result<()> {
    let Some(env) = Env::start("st-kube")? else { return Ok(()) };
    running_pod(&env, "kbox", &["main"], json!({})).await?;
    let api: Api<Pod> = Api::namespaced(env.api.client()?, "default");

    let mut p = api.exec("kbox", ["sh", "-c", "echo one; echo two"], &AttachParams::default().stderr(false)).await?;
    let mut out = String::new();
    if let Some(mut s) = p.stdout() {
        s.read_to_string(&mut out).await?;
    }
    let status = p.take_status().ok_or_else(|| anyhow::anyhow!("no status"))?.await;
    p.join().await?;
    ensure!(out == "one\ntwo\n", "{out:?}");
    ensure!(status.as_ref().and_then(|s| s.status.as_deref()) == Some("Success"), "{status:?}");

    let mut p = api.exec("kbox", ["cat"], &AttachParams::default().stdin(true).stderr(false)).await?;
    let mut stdin = p.stdin().ok_or_else(|| anyhow::anyhow!("no stdin"))?;
    let mut stdout = p.stdout().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    stdin.write_all(b"from kube\n").await?;
    stdin.shutdown().await?;
    drop(stdin);
    let mut out = String::new();
    stdout.read_to_string(&mut out).await?;
    p.join().await?;
    ensure!(out == "from kube\n", "{out:?}");

    let mut p = api.exec("kbox", ["sh", "-c", "exit 7"], &AttachParams::default().stderr(false)).await?;
    let status = p.take_status().ok_or_else(|| anyhow::anyhow!("no status"))?.await;
    p.join().await?;
    let s = status.ok_or_else(|| anyhow::anyhow!("no status object"))?;
    ensure!(s.status.as_deref() == Some("Failure") && s.reason.as_deref() == Some("NonZeroExitCode"), "{s:?}");
    let code =
        s.details.and_then(|d| d.causes).and_then(|c| c.into_iter().find(|c| c.reason.as_deref() == Some("ExitCode")));
    ensure!(code.and_then(|c| c.message).as_deref() == Some("7"), "exit code cause missing");
    Ok(())
}

/// Our kubectl beside the official one: same stdout, stderr and exit code.
#[tokio::test(flavor = "multi_thread")]
async fn our_kubectl_exec_matches_official() -> Result<()> {
    let Some(env) = Env::start("st-ours")? else { return Ok(()) };
    running_pod(&env, "obox", &["main"], json!({})).await?;
    running_pod(&env, "oduo", &["first", "second"], json!({})).await?;
    let ours = our_kubectl();
    let cases: Vec<(Vec<&str>, Option<&str>)> = vec![
        (vec!["exec", "obox", "--", "cat", "/etc/hostname"], None),
        (vec!["exec", "obox", "--", "sh", "-c", "echo out; echo err >&2; exit 3"], None),
        (vec!["exec", "-i", "obox", "--", "cat"], Some("piped\nin\n")),
        (vec!["exec", "oduo", "-c", "second", "--", "sh", "-c", "cat /proc/1/cmdline"], None),
        (vec!["exec", "oduo", "-c", "nope", "--", "true"], None),
        (vec!["exec", "ghost", "--", "true"], None),
        // TYPE/NAME: a pod of the Service's selector.
        (vec!["exec", "svc/osvc", "--", "cat", "/etc/hostname"], None),
    ];
    let svc = env.api.data_dir.join("svc.yaml");
    std::fs::write(
        &svc,
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: osvc\nspec:\n  selector:\n    app: obox\n  ports:\n  - port: 80\n",
    )?;
    let out = env.api.kubectl(&["create", "-f", &svc.to_string_lossy()])?;
    ensure!(out.ok, "creating the Service: {}", out.stderr);
    for (v, bin) in official_kubectls(&["1.33"]) {
        for (args, stdin) in &cases {
            let want = kubectl(&env, &bin, args, *stdin)?;
            let got = kubectl(&env, &ours, args, *stdin)?;
            eprintln!("kubectl {v} {args:?}: {want:?}");
            ensure!(
                got.code == want.code,
                "{args:?}: exit {} vs kubectl {v}'s {}: {got:?} {want:?}",
                got.code,
                want.code
            );
            ensure!(got.stdout == want.stdout, "{args:?}: stdout {:?} vs kubectl {v}'s {:?}", got.stdout, want.stdout);
            ensure!(want.code != 0 || !want.stdout.is_empty(), "{args:?}: kubectl {v} printed nothing: {want:?}");
            // client-go ≤ 1.33 may read the server's first message (the empty "ready" one,
            // which Kubernetes sends at once too) before it registered its streams, and logs
            // `Unknown stream id 1, discarding message`; later client-go waits for its streams.
            let race =
                |s: &str| s.lines().filter(|l| !l.contains("] Unknown stream id ")).collect::<Vec<_>>().join("\n");
            let (g, w) = (race(got.stderr.trim()), race(want.stderr.trim()));
            ensure!(g == w, "{args:?}: stderr {g:?} vs kubectl {v}'s {w:?}");
        }
        // Two containers and no -c: kubectl picks the first and says so.
        let want = kubectl(&env, &bin, &["exec", "oduo", "--", "cat", "/etc/hostname"], None)?;
        let got = kubectl(&env, &ours, &["exec", "oduo", "--", "cat", "/etc/hostname"], None)?;
        ensure!((got.code, &got.stdout) == (want.code, &want.stdout), "{got:?} vs {want:?}");
        ensure!(got.stderr.contains("Defaulted container \"first\""), "{got:?} vs {want:?}");
    }
    Ok(())
}

/// Create a pod whose one container runs `script` once (restartPolicy Never).
async fn one_shot(env: &Env, api: &Api<Pod>, name: &str, script: &str, stdin: bool) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": env.kubelet.node, "terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "imagePullPolicy": "IfNotPresent", "stdin": stdin,
                            "command": ["sh", "-c", script]}]},
    }))?;
    api.create(&PostParams::default(), &pod).await?;
    Ok(())
}

async fn wait_running(env: &Env, api: &Api<Pod>, names: &[&str]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    for name in names {
        while api.get(name).await?.status.and_then(|s| s.phase) != Some("Running".into()) {
            ensure!(Instant::now() < deadline, "{name} not running: {}", env.kubelet.log());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// `attach` reads the main process's output and feeds its stdin (the kube crate, the official
/// kubectl, ours); the kubelet refuses bad requests with a Status.
#[tokio::test(flavor = "multi_thread")]
async fn attach_and_kubelet_errors() -> Result<()> {
    let Some(env) = Env::start("st-attach")? else { return Ok(()) };
    let api: Api<Pod> = Api::namespaced(env.api.client()?, "default");
    // Each talker waits before it talks, so that the attach is there to hear it.
    let talk = "sleep 4; for i in 1 2 3; do echo tick $i; done";
    let listen = "read line; echo got $line";
    let officials = official_kubectls(&["1.33"]);
    let mut clients: Vec<(String, std::path::PathBuf)> = officials.clone();
    clients.push(("ours".into(), our_kubectl()));
    one_shot(&env, &api, "talker", talk, false).await?;
    one_shot(&env, &api, "sleeper", "sleep 3600", false).await?;
    for (i, _) in clients.iter().enumerate() {
        one_shot(&env, &api, &format!("talker-{i}"), talk, false).await?;
        one_shot(&env, &api, &format!("listener-{i}"), listen, true).await?;
    }
    let mut names = vec!["talker".to_string(), "sleeper".to_string()];
    names.extend((0..clients.len()).flat_map(|i| [format!("talker-{i}"), format!("listener-{i}")]));
    wait_running(&env, &api, &names.iter().map(String::as_str).collect::<Vec<_>>()).await?;

    // kubectl attach (official and ours) at the same time as the kube crate's.
    let url = env.api.url();
    let threads: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, (v, bin))| {
            let (v, bin, url) = (v.clone(), bin.clone(), url.clone());
            std::thread::spawn(move || -> Result<(String, Run, Run)> {
                let talked = run(&bin, &url, &["attach", &format!("talker-{i}")], None)?;
                let listened = run(&bin, &url, &["attach", "-i", &format!("listener-{i}")], Some("hello\n"))?;
                Ok((v, talked, listened))
            })
        })
        .collect();
    let mut p = api.attach("talker", &AttachParams::default().stderr(false)).await?;
    let mut out = String::new();
    if let Some(mut s) = p.stdout() {
        s.read_to_string(&mut out).await?;
    }
    p.join().await?;
    ensure!(out == "tick 1\ntick 2\ntick 3\n", "kube crate attach output: {out:?}");
    for t in threads {
        let (v, talked, listened) = t.join().map_err(|_| anyhow::anyhow!("attach thread panicked"))??;
        ensure!(talked.code == 0 && talked.stdout == "tick 1\ntick 2\ntick 3\n", "kubectl {v} attach: {talked:?}");
        ensure!(listened.code == 0 && listened.stdout == "got hello\n", "kubectl {v} attach -i: {listened:?}");
        ensure!(
            listened.stderr == "If you don't see a command prompt, try pressing enter.\n",
            "kubectl {v} attach -i: {listened:?}"
        );
    }

    // The apiserver returns the kubelet's refusals as they are, once the talker has exited.
    let deadline = Instant::now() + Duration::from_secs(60);
    while api.get("talker").await?.status.and_then(|s| s.phase) != Some("Succeeded".into()) {
        ensure!(Instant::now() < deadline, "talker did not succeed: {}", env.kubelet.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = e2e::raw(
        env.api.port,
        "GET",
        "/api/v1/namespaces/default/pods/talker/exec?command=true&stdout=true",
        None,
        b"",
    )?;
    ensure!(
        r.status == 400 && r.json()["message"] == "container \"main\" in pod \"talker\" is not running",
        "{}",
        r.text()
    );
    // … and a running container without an upgrade.
    let r = e2e::raw(env.api.port, "GET", "/api/v1/namespaces/default/pods/sleeper/attach?stdout=true", None, b"")?;
    ensure!(
        r.status == 400 && r.json()["message"].as_str().is_some_and(|m| m.starts_with("Upgrade request required")),
        "{}",
        r.text()
    );
    let r = e2e::raw(env.api.port, "PUT", "/api/v1/namespaces/default/pods/talker/exec?command=true", None, b"")?;
    ensure!(r.status == 405, "{} {}", r.status, r.text());

    // Straight at the kubelet: its errors are Status objects with the right codes.
    let (code, body) = env.kubelet.get("/exec/default/talker/nope?command=true&stdout=1")?;
    ensure!(code == 404 && body.contains("\"kind\":\"Status\"") && body.contains("nope"), "{code} {body}");
    let (code, body) = env.kubelet.get("/exec/default/ghost/main?command=true&stdout=1")?;
    ensure!(code == 404 && body.contains("pod does not exist"), "{code} {body}");
    let (code, body) = env.kubelet.get("/exec/default/talker/main?command=true")?;
    ensure!(code == 400 && body.contains("at least 1 of stdin, stdout, stderr"), "{code} {body}");
    Ok(())
}

/// `kubectl debug`: an ephemeral container added through `pods/ephemeralcontainers`, started
/// by the kubelet in the pod (sharing the target's process namespace), attached with `-i`,
/// reported in `ephemeralContainerStatuses`, and never changed or restarted afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_debug_runs_an_ephemeral_container() -> Result<()> {
    let Some(env) = Env::start("st-debug")? else { return Ok(()) };
    running_pod(&env, "dbg", &["main"], json!({})).await?;
    let api: Api<Pod> = Api::namespaced(env.api.client()?, "default");
    for (i, (v, bin)) in official_kubectls(&["1.33", "1.27"]).into_iter().enumerate() {
        // Interactive, in the target's process namespace: it sees main's shell loop.
        let name = format!("shell-{i}");
        let args = ["debug", "dbg", "-i", "--image=busybox", "--target=main", "-c", &name, "--", "sh"];
        let r = kubectl(&env, &bin, &args, Some("ps -o args; echo bye; exit\n"))?;
        ensure!(r.code == 0, "kubectl {v} debug -i: {r:?}\nkubelet log:\n{}", env.kubelet.log());
        ensure!(r.stdout.contains("while true; do sleep 1; done") && r.stdout.contains("bye"), "kubectl {v}: {r:?}");
        // Detached: runs once; its output is in the logs.
        let name = format!("once-{i}");
        let r = kubectl(&env, &bin, &["debug", "dbg", "--image=busybox", "-c", &name, "--", "echo", "hi"], None)?;
        ensure!(r.code == 0, "kubectl {v} debug: {r:?}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let p = api.get("dbg").await?;
            let statuses = p.status.and_then(|s| s.ephemeral_container_statuses).unwrap_or_default();
            let done = statuses.iter().find(|s| s.name == name).and_then(|s| s.state.clone()?.terminated);
            if let Some(t) = done {
                ensure!(t.exit_code == 0 && t.reason.as_deref() == Some("Completed"), "{t:?}");
                break;
            }
            ensure!(Instant::now() < deadline, "{name} did not finish: {statuses:?}\n{}", env.kubelet.log());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let r = kubectl(&env, &bin, &["logs", "dbg", "-c", &name], None)?;
        ensure!(r.code == 0 && r.stdout == "hi\n", "kubectl {v} logs of an ephemeral container: {r:?}");
    }
    // The pod itself is untouched: still running, main never restarted, and an ephemeral
    // container may not be changed.
    let p = api.get("dbg").await?;
    let status = p.status.clone().unwrap_or_default();
    ensure!(status.phase.as_deref() == Some("Running"), "{status:?}");
    ensure!(status.container_statuses.unwrap_or_default()[0].restart_count == 0);
    ensure!(p.spec.and_then(|s| s.ephemeral_containers).map(|e| e.len()) == Some(4));
    let patch = json!([{"op": "replace", "path": "/spec/ephemeralContainers/0/image", "value": "alpine"}]);
    let r = e2e::raw(
        env.api.port,
        "PATCH",
        "/api/v1/namespaces/default/pods/dbg/ephemeralcontainers",
        Some("application/json-patch+json"),
        patch.to_string().as_bytes(),
    )?;
    ensure!(r.status == 422, "{} {}", r.status, r.text());
    ensure!(r.json()["details"]["causes"][0]["field"] == "spec.ephemeralContainers[0]", "{}", r.text());
    Ok(())
}
