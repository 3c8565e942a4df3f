//! `kubectl get -w` with server-side tables: watch events whose objects are one-row Tables
//! (column definitions on the first event only), for built-in kinds and a CRD's printer
//! columns — read by the official kubectl 1.33 and by ours.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use e2e::kubectl::our_kubectl;
use e2e::{official_kubectls, ApiServer};
use serde_json::Value;

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: watched
spec:
  containers:
  - name: c
    image: busybox:latest
";

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: crontabs.stable.example.com
spec:
  group: stable.example.com
  scope: Namespaced
  names: {plural: crontabs, singular: crontab, kind: CronTab}
  versions:
  - name: v1
    served: true
    storage: true
    additionalPrinterColumns:
    - {name: Spec, type: string, jsonPath: .spec.cronSpec}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {cronSpec: {type: string}}}
"#;

/// A running `kubectl get -w`, its stdout lines collected by a thread.
struct Watcher {
    child: Child,
    rx: mpsc::Receiver<String>,
    lines: Vec<String>,
}

impl Watcher {
    fn start(bin: &Path, server: &ApiServer, args: &[&str]) -> Result<Self> {
        let mut child = Command::new(bin)
            .arg("--server")
            .arg(server.url())
            .args(args)
            .env("KUBECONFIG", "/dev/null")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("running {}", bin.display()))?;
        let out = child.stdout.take().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Watcher { child, rx, lines: Vec::new() })
    }

    /// Wait (up to 30 s) until the lines seen so far satisfy `done`.
    fn until(&mut self, what: &str, done: impl Fn(&[Vec<String>]) -> bool) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let split: Vec<Vec<String>> =
                self.lines.iter().map(|l| l.split_whitespace().map(String::from).collect()).collect();
            if done(&split) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("{what}: not seen; lines so far: {:#?}", self.lines);
            }
            if let Ok(l) = self.rx.recv_timeout(left.min(Duration::from_millis(200))) {
                self.lines.push(l);
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn row_is(l: &[String], cells: &[&str]) -> bool {
    l.len() >= cells.len() && l.iter().zip(cells).all(|(a, b)| a == b)
}

/// The pod scenario with one kubectl: header once, then a row per change.
fn pods_watch(bin: &Path, server: &ApiServer, label: &str) -> Result<Vec<String>> {
    // Changes are made with the same kubectl that watches.
    let k = |args: &[&str], stdin: Option<&str>| e2e::kubectl::run(bin, &server.url(), args, stdin);
    let mut w = Watcher::start(bin, server, &["get", "pods", "-w"])?;
    // Give the watch time to be established before the first change (it may also see the
    // pod in its initial listing; either way the rows below must appear).
    std::thread::sleep(Duration::from_millis(1500));
    let out = k(&["create", "-f", "-"], Some(POD))?;
    ensure!(out.code == 0, "{label}: create: {out:?}");
    w.until(&format!("{label}: header and ADDED row"), |ls| {
        ls.first().is_some_and(|h| h == &["NAME", "READY", "STATUS", "RESTARTS", "AGE"])
            && ls.iter().any(|l| row_is(l, &["watched", "0/1", "Pending", "0"]))
    })?;
    let out = k(&["label", "pod", "watched", "tier=web"], None)?;
    ensure!(out.code == 0, "{label}: label: {out:?}");
    w.until(&format!("{label}: MODIFIED row"), |ls| ls.iter().filter(|l| row_is(l, &["watched", "0/1"])).count() >= 2)?;
    let headers = w.lines.iter().filter(|l| l.starts_with("NAME")).count();
    ensure!(headers == 1, "{label}: the header is printed once: {:#?}", w.lines);
    Ok(w.lines.clone())
}

/// A whole (time-limited) watch as Tables, through the `kube` client.
fn table_watch(url: &str, path: &str) -> Result<String> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let client = kube::Client::try_from(kube::Config::new(url.parse()?))?;
        let req = http::Request::get(path)
            .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
            .body(Vec::new())?;
        anyhow::Ok(client.request_text(req).await?)
    })
}

#[test]
fn kubectl_get_watch_prints_server_tables() -> Result<()> {
    let official = official_kubectls(&["1.33"]);
    let Some((_, k133)) = official.first() else {
        eprintln!("skipping: no official kubectl 1.33");
        return Ok(());
    };
    let server = ApiServer::start()?;

    // The wire: one-row Tables, column definitions on the first event only.
    let created = e2e::kubectl::run(k133, &server.url(), &["create", "-f", "-"], Some(POD))?;
    ensure!(created.code == 0, "{created:?}");
    let text =
        table_watch(&server.url(), "/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=1&includeObject=Object")?;
    let events: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    ensure!(events.len() == 1, "{text}");
    let t = &events[0]["object"];
    ensure!(t["kind"] == "Table" && t["apiVersion"] == "meta.k8s.io/v1", "{t}");
    ensure!(t["columnDefinitions"].as_array().is_some_and(|c| c.len() >= 5), "{t}");
    ensure!(t["rows"][0]["cells"][0] == "watched" && t["rows"][0]["object"]["kind"] == "Pod", "{t}");
    // Later events reuse the columns.
    let rv = t["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_string();
    let url = server.url();
    let watch = std::thread::spawn(move || {
        table_watch(&url, &format!("/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=3&resourceVersion={rv}"))
    });
    std::thread::sleep(Duration::from_millis(500));
    for l in ["a=1", "b=2"] {
        let out = e2e::kubectl::run(k133, &server.url(), &["label", "pod", "watched", l], None)?;
        ensure!(out.code == 0, "{out:?}");
    }
    let text = watch.join().map_err(|_| anyhow::anyhow!("watch thread panicked"))??;
    let events: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    ensure!(events.len() == 2 && events.iter().all(|e| e["type"] == "MODIFIED"), "{text}");
    ensure!(events[0]["object"]["columnDefinitions"].as_array().is_some(), "{text}");
    ensure!(events[1]["object"]["columnDefinitions"].is_null(), "{text}");
    ensure!(events[1]["object"]["rows"][0]["object"]["kind"] == "PartialObjectMetadata", "{text}");
    let out = e2e::kubectl::run(k133, &server.url(), &["delete", "pod", "watched", "--wait=false"], None)?;
    ensure!(out.code == 0, "{out:?}");

    // Both kubectls print the same watch.
    let theirs = pods_watch(k133, &server, "kubectl 1.33")?;
    let out = e2e::kubectl::run(k133, &server.url(), &["delete", "pod", "watched", "--wait=false"], None)?;
    ensure!(out.code == 0, "{out:?}");
    let ours = pods_watch(&our_kubectl(), &server, "our kubectl")?;
    ensure!(theirs[0].split_whitespace().eq(ours[0].split_whitespace()), "{theirs:?} vs {ours:?}");

    // A CRD's printer columns on watch.
    let out = e2e::kubectl::run(k133, &server.url(), &["create", "-f", "-"], Some(CRD))?;
    ensure!(out.code == 0, "{out:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while e2e::kubectl::run(k133, &server.url(), &["get", "crontabs"], None)?.code != 0 {
        ensure!(Instant::now() < deadline, "CRD not served");
        std::thread::sleep(Duration::from_millis(200));
    }
    for (bin, label) in [(k133.clone(), "kubectl 1.33"), (our_kubectl(), "our kubectl")] {
        let mut w = Watcher::start(&bin, &server, &["get", "crontabs", "-w"])?;
        std::thread::sleep(Duration::from_millis(1500));
        let name = format!("ct-{}", label.len());
        let ct = format!(
            "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata:\n  name: {name}\nspec:\n  cronSpec: '*/5 * * * *'\n"
        );
        let out = e2e::kubectl::run(&bin, &server.url(), &["create", "-f", "-"], Some(&ct))?;
        ensure!(out.code == 0, "{label}: {out:?}");
        w.until(&format!("{label}: CRD row"), |ls| {
            ls.first().is_some_and(|h| h == &["NAME", "SPEC", "AGE"])
                && ls.iter().any(|l| row_is(l, &[name.as_str(), "*/5", "*", "*", "*", "*"]))
        })?;
    }
    Ok(())
}
