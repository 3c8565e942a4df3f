//! Client conformance: two third-party client libraries besides kubectl and the kube crate —
//! the Python client (`kubernetes`, test/requirements.txt) and the JavaScript client
//! (`@kubernetes/client-node`, test/clients/package.json) — each run the same script of
//! what their users do (test/clients/conformance.py and conformance.mjs): typed CRUD with
//! every verb's answer decoded as the library's type, pages, watch and resume,
//! multi-document creation with conflicts, error bodies byte for byte, a watch loop or
//! informer kept across an apiserver restart, and exec with stdin and its close, attach,
//! logs with follow and port-forward against a real pod on the Docker kubelet. (The kube
//! crate does the same throughout the other suites: streaming.rs, watch.rs, portforward.rs,
//! pod_logs.rs.)

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::kubelet::Node as Env;
use e2e::ApiServer;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;

/// A client library's script: the interpreter and the script's path.
struct Client {
    name: &'static str,
    program: PathBuf,
    script: PathBuf,
    /// A copy of the script next to the library's node_modules, removed on drop.
    copied: bool,
}

impl Drop for Client {
    fn drop(&mut self) {
        if self.copied {
            let _ = std::fs::remove_file(&self.script);
        }
    }
}

impl Client {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.program);
        c.arg(&self.script).args(args);
        c
    }
}

/// The clients installed here (under `CI=true` both must be: the helpers panic otherwise).
fn clients(section: &str) -> Result<Vec<Client>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients");
    let mut out = Vec::new();
    if let Some(python) = e2e::python_clients() {
        out.push(Client { name: "python", program: python, script: dir.join("conformance.py"), copied: false });
    }
    if let Some(modules) = e2e::node_clients() {
        // ES modules resolve imports from the script's own directory.
        let script = modules.join(format!("conformance-{}-{section}.mjs", std::process::id()));
        std::fs::copy(dir.join("conformance.mjs"), &script).context("copying conformance.mjs")?;
        out.push(Client { name: "javascript", program: PathBuf::from("node"), script, copied: true });
    }
    Ok(out)
}

/// Run one section to its end; every line must be `ok …` and the last `done`.
fn run_section(client: &Client, args: &[&str], wants: &[&str]) -> Result<String> {
    let out = client.command(args).output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "{} {args:?} failed:\n{stdout}\n{stderr}", client.name);
    ensure!(stdout.lines().last() == Some("done"), "{} {args:?} did not finish:\n{stdout}\n{stderr}", client.name);
    for want in wants {
        ensure!(stdout.lines().any(|l| l == format!("ok {want}")), "{}: {want:?} missing:\n{stdout}", client.name);
    }
    Ok(stdout)
}

#[test]
fn python_and_javascript_clients_use_the_api_as_their_users_do() -> Result<()> {
    let api = ApiServer::start()?;
    for client in clients("api")? {
        let wants: &[&str] = match client.name {
            "python" => &["pagination", "watch resumed", "create_from_yaml reports the conflict", "409 body bytes"],
            _ => &[
                "delete service answers the Service",
                "pagination",
                "watch resumed",
                "multi-document create",
                "409 body bytes",
            ],
        };
        run_section(&client, &["api", &api.url()], wants)?;
    }
    Ok(())
}

/// A running client whose stdout lines arrive on a channel.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(mut cmd: Command) -> Result<Running> {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn()?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Running { child, lines, seen: vec![] })
    }
    /// Wait for a line; false at the end of its output or after `timeout`.
    fn wait_for(&mut self, want: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l == want {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn python_and_javascript_clients_keep_watching_across_an_apiserver_restart() -> Result<()> {
    let mut api = ApiServer::start()?;
    let clients = clients("restart")?;
    let mut running = Vec::new();
    for client in &clients {
        let mut r = Running::start(client.command(&["restart", &api.url()]))?;
        ensure!(r.wait_for("ready", Duration::from_secs(30)), "{} never listed: {:?}", client.name, r.seen);
        running.push(r);
    }
    api.restart()?;
    let cms: Api<ConfigMap> = Api::namespaced(api.client()?, "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "after-restart"}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    for (client, r) in clients.iter().zip(running.iter_mut()) {
        r.child.stdin.as_mut().context("stdin")?.write_all(b"go\n")?;
        ensure!(r.wait_for("done", Duration::from_secs(40)), "{} after the restart: {:?}", client.name, r.seen);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn python_and_javascript_clients_exec_attach_log_and_forward() -> Result<()> {
    let Some(env) = Env::start("cc-pod")? else { return Ok(()) };
    let pods: Api<Pod> = Api::namespaced(env.api.client()?, "default");
    let script = "mkdir -p /www && echo pong > /www/index.html && httpd -p 8080 -h /www && \
                  while true; do echo tick $(date +%s); sleep 1; done";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "clients", "namespace": "default"},
        "spec": {"nodeName": env.kubelet.node, "terminationGracePeriodSeconds": 1, "containers": [
            {"name": "main", "image": "busybox", "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", script]}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let p = pods.get("clients").await?;
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            break;
        }
        if Instant::now() > deadline {
            bail!("pod not Running in 90s; kubelet log:\n{}", env.kubelet.log());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for client in clients("pod")? {
        let url = env.api.url();
        let wants = ["exec stdin echoed", "exec stdout/stderr/exit code", "attach", "logs follow", "port-forward"];
        tokio::task::block_in_place(|| run_section(&client, &["pod", &url, "clients"], &wants))?;
    }
    Ok(())
}
