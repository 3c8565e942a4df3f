//! Our `kubectl` beside the official one, against the real apiserver: the same commands must
//! give the same exit codes and the same output (ages and IPs masked where two servers or two
//! moments are compared). Covers every manifest in `test/manifests/`, the everyday
//! commands, and one test per bad input.

use std::path::{Path, PathBuf};

use anyhow::Result;
use e2e::kubectl::{normalize, official_kubectl, our_kubectl, run, Run};
use e2e::{manifests_dir, ApiServer};

/// Both binaries, or `None` (and a message) where the official one is missing outside CI.
fn binaries() -> Option<(PathBuf, PathBuf)> {
    let ours = our_kubectl();
    match official_kubectl() {
        Some(off) => Some((ours, off)),
        None => {
            eprintln!("skipping: no official kubectl on PATH");
            None
        }
    }
}

/// The official kubectl needs `--validate=false` on writes until the apiserver serves OpenAPI.
fn official_args<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = args.to_vec();
    if matches!(args.first(), Some(&"apply") | Some(&"create") | Some(&"replace")) && args.contains(&"-f") {
        v.push("--validate=false");
    }
    v
}

struct Pair {
    ours: PathBuf,
    official: PathBuf,
}

impl Pair {
    fn ours(&self, server: &str, args: &[&str]) -> Result<Run> {
        run(&self.ours, server, args, None)
    }
    fn official(&self, server: &str, args: &[&str]) -> Result<Run> {
        run(&self.official, server, &official_args(args), None)
    }

    /// Run on each binary's own server; exact comparison.
    fn same_exact(&self, a: &str, b: &str, args: &[&str]) -> Result<Run> {
        let x = self.ours(a, args)?;
        let y = self.official(b, args)?;
        assert_eq!(x, y, "kubectl {args:?}: ours (left) vs official (right)");
        Ok(x)
    }

    /// Run both (on the given servers); comparison with ages and IPs masked.
    fn same(&self, a: &str, b: &str, args: &[&str]) -> Result<Run> {
        let x = self.ours(a, args)?;
        let y = self.official(b, args)?;
        assert_eq!(x.code, y.code, "kubectl {args:?}: exit codes differ\nours: {x:?}\nofficial: {y:?}");
        assert_eq!(normalize(&x.stdout), normalize(&y.stdout), "kubectl {args:?}: stdout differs (ours left)");
        assert_eq!(normalize(&x.stderr), normalize(&y.stderr), "kubectl {args:?}: stderr differs (ours left)");
        Ok(x)
    }
}

fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(manifests_dir())
        .unwrap_or_else(|e| panic!("manifests dir {}: {e}", manifests_dir().display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no manifests in {}", manifests_dir().display());
    v
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn every_manifest_applies_like_the_official_kubectl() -> Result<()> {
    let Some((ours, official)) = binaries() else { return Ok(()) };
    let k = Pair { ours, official };
    let (a, b) = (ApiServer::start()?, ApiServer::start()?);
    let (ua, ub) = (a.url(), b.url());
    for m in manifests() {
        let f = s(&m);
        let first = k.same_exact(&ua, &ub, &["apply", "-f", &f])?;
        assert_eq!(first.code, 0, "apply {f}: {first:?}");
        assert!(first.stdout.lines().all(|l| l.ends_with(" created")), "{f}: {}", first.stdout);
        let again = k.same_exact(&ua, &ub, &["apply", "-f", &f])?;
        assert!(again.stdout.contains(" unchanged"), "{f}: {}", again.stdout);
    }
    // The whole directory at once, and each side's objects re-applied by the other tool:
    // the last-applied annotations are interchangeable.
    let dir = s(&manifests_dir());
    let all = k.same_exact(&ua, &ub, &["apply", "-f", &dir])?;
    assert!(all.stdout.contains("deployment.apps/web unchanged"), "{}", all.stdout);
    let cross_ours = k.ours(&ub, &["apply", "-f", &dir])?;
    let cross_official = k.official(&ua, &["apply", "-f", &dir])?;
    assert_eq!(cross_ours, all, "ours over objects the official kubectl applied");
    assert_eq!(cross_official, all, "official over objects ours applied");
    Ok(())
}

#[test]
fn apply_changes_removals_dry_runs_and_stdin_like_the_official_kubectl() -> Result<()> {
    let Some((ours, official)) = binaries() else { return Ok(()) };
    let k = Pair { ours, official };
    let (a, b) = (ApiServer::start()?, ApiServer::start()?);
    let (ua, ub) = (a.url(), b.url());
    let dir = tempfile::tempdir()?;
    let f = dir.path().join("web.yaml");
    let fs = s(&f);
    let deploy = |env: &str, extra_label: bool| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  labels:\n    app: web\n{}spec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: web}}\n  template:\n    metadata:\n      labels: {{app: web}}\n    spec:\n      containers:\n      - name: web\n        image: busybox\n        env:\n        - {{name: VERSION, value: \"{env}\"}}\n{}",
            if extra_label { "    tier: front\n" } else { "" },
            if extra_label { "        - {name: EXTRA, value: \"x\"}\n" } else { "" },
        )
    };
    std::fs::write(&f, deploy("v1", true))?;
    for dry in ["--dry-run=client", "--dry-run=server"] {
        let r = k.same_exact(&ua, &ub, &["apply", "-f", &fs, dry])?;
        assert!(r.stdout.contains("(dry run)") || r.stdout.contains("(server dry run)"), "{r:?}");
    }
    k.same(&ua, &ub, &["get", "deploy"])?;
    assert_eq!(k.same_exact(&ua, &ub, &["apply", "-f", &fs])?.stdout, "deployment.apps/web created\n");
    // A change, then removals of a label and a list element: configured, and really gone.
    std::fs::write(&f, deploy("v2", false))?;
    assert_eq!(k.same_exact(&ua, &ub, &["apply", "-f", &fs])?.stdout, "deployment.apps/web configured\n");
    assert_eq!(k.same_exact(&ua, &ub, &["apply", "-f", &fs])?.stdout, "deployment.apps/web unchanged\n");
    let q = ["get", "deploy", "web", "-o", "jsonpath={.metadata.labels} {.spec.template.spec.containers[0].env}"];
    let got = k.same_exact(&ua, &ub, &q)?;
    assert_eq!(got.stdout, r#"{"app":"web"} [{"name":"VERSION","value":"v2"}]"#);
    // Standard input and recursive directories.
    let stdin_doc = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-stdin\ndata:\n  a: b\n";
    let x = run(&k.ours, &ua, &["apply", "-f", "-"], Some(stdin_doc))?;
    let y = run(&k.official, &ub, &["apply", "--validate=false", "-f", "-"], Some(stdin_doc))?;
    assert_eq!(x, y);
    assert_eq!(x.stdout, "configmap/from-stdin created\n");
    let sub = dir.path().join("nested/deeper");
    std::fs::create_dir_all(&sub)?;
    std::fs::write(sub.join("cm.yaml"), "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: nested\n")?;
    let nested = s(&dir.path().join("nested"));
    k.same_exact(&ua, &ub, &["apply", "-R", "-f", &nested])?;
    k.same(&ua, &ub, &["get", "cm"])?;
    Ok(())
}

#[test]
fn get_and_describe_print_like_the_official_kubectl() -> Result<()> {
    let Some((ours, official)) = binaries() else { return Ok(()) };
    let k = Pair { ours, official };
    let srv = ApiServer::start()?;
    let u = srv.url();
    // Empty namespace first.
    let empty = k.same(&u, &u, &["get", "pods"])?;
    assert_eq!(empty.stderr, "No resources found in default namespace.\n");
    for m in manifests() {
        k.ours(&u, &["apply", "-f", &s(&m)])?;
    }
    let cmds: &[&[&str]] = &[
        &["get", "pods"],
        &["get", "po", "-o", "wide"],
        &["get", "pods", "-A", "--show-labels"],
        &["get", "deploy,rs,svc"],
        &["get", "all"],
        &["get", "all", "-A"],
        &["get", "ns"],
        &["get", "no"],
        &["get", "cm", "-A"],
        &["get", "ev"],
        &["get", "ing"],
        &["get", "pv"],
        &["get", "pvc"],
        &["get", "hpa"],
        &["get", "jobs"],
        &["get", "sa"],
        &["get", "secrets", "-n", "demo"],
        &["get", "cm", "-n", "demo", "--no-headers"],
        &["get", "deployments.apps"],
        &["get", "deployment", "web"],
        &["get", "pods", "-l", "app=shared-pod"],
        &["get", "pods", "--field-selector", "metadata.name=shared-pod"],
        &["get", "pod", "shared-pod", "-o", "name"],
        &["get", "pods", "-o", "name"],
        &["get", "svc/web", "pod/shared-pod"],
        &["get", "pod", "nope", "shared-pod"],
        &["get", "pods", "-o", "jsonpath={.items[*].metadata.name}"],
        &[
            "get",
            "pods",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\t\"}{.spec.containers[0].image}{\"\\n\"}{end}",
        ],
        &[
            "get",
            "pods",
            "-o",
            "custom-columns=NAME:.metadata.name,IMAGES:.spec.containers[*].image,NODE:.spec.nodeName",
        ],
        &["get", "pod", "shared-pod", "-o", "yaml"],
        &["get", "pod", "shared-pod", "-o", "json"],
        &["get", "rs", "-o", "yaml"],
        &["get", "deploy", "-o", "json"],
        &["get", "secret", "creds", "-n", "demo", "-o", "yaml"],
        &["get", "pods", "-n", "nons"],
        &["describe", "pod", "shared-pod"],
        &["describe", "pods"],
        &["describe", "deploy", "web"],
        &["describe", "rs", "web-rs"],
        &["describe", "svc", "web"],
        &["describe", "ns", "demo"],
        &["describe", "node"],
        &["describe", "pod", "nope"],
        &["api-resources"],
        &["rollout", "history", "deploy/web"],
    ];
    for c in cmds {
        k.same(&u, &u, c)?;
    }
    Ok(())
}

#[test]
fn everyday_write_commands_like_the_official_kubectl() -> Result<()> {
    let Some((ours, official)) = binaries() else { return Ok(()) };
    let k = Pair { ours, official };
    let (a, b) = (ApiServer::start()?, ApiServer::start()?);
    let (ua, ub) = (a.url(), b.url());
    let dir = manifests_dir();
    let m = |n: &str| s(&dir.join(n));
    let steps: Vec<Vec<String>> = vec![
        vec!["create".into(), "-f".into(), m("01-pod.yaml")],
        vec!["apply".into(), "-f".into(), m("03-deployment.yaml")],
        vec!["apply".into(), "-f".into(), m("02-replicaset.yaml")],
        vec!["label".into(), "pod".into(), "shared-pod".into(), "tier=web".into()],
        vec!["label".into(), "pod".into(), "shared-pod".into(), "tier=db".into()],
        vec!["label".into(), "pod".into(), "shared-pod".into(), "tier=db".into(), "--overwrite".into()],
        vec!["label".into(), "pod".into(), "shared-pod".into(), "tier-".into()],
        vec!["annotate".into(), "deploy".into(), "web".into(), "note=hi".into()],
        vec!["scale".into(), "deploy".into(), "web".into(), "--replicas=5".into()],
        vec!["scale".into(), "rs/web-rs".into(), "--replicas=1".into()],
        vec!["get".into(), "deploy".into(), "web".into(), "-o".into(), "jsonpath={.spec.replicas}".into()],
        vec!["patch".into(), "deploy".into(), "web".into(), "-p".into(), r#"{"spec":{"replicas":2}}"#.into()],
        vec![
            "patch".into(),
            "deploy".into(),
            "web".into(),
            "--type".into(),
            "merge".into(),
            "-p".into(),
            r#"{"spec":{"replicas":2}}"#.into(),
        ],
        vec![
            "patch".into(),
            "deploy".into(),
            "web".into(),
            "--type".into(),
            "json".into(),
            "-p".into(),
            r#"[{"op":"replace","path":"/spec/replicas","value":4}]"#.into(),
        ],
        vec!["get".into(), "deploy".into(), "web".into(), "-o".into(), "jsonpath={.spec.replicas}".into()],
        vec!["replace".into(), "-f".into(), m("03-deployment.yaml")],
        vec!["get".into(), "deploy".into()],
        vec!["delete".into(), "-f".into(), m("02-replicaset.yaml")],
        // Foreground deletion waits for the garbage collector, which this test does not run.
        vec!["delete".into(), "pod".into(), "shared-pod".into(), "--cascade=foreground".into(), "--wait=false".into()],
        vec![
            "delete".into(),
            "deploy".into(),
            "web".into(),
            "--grace-period=0".into(),
            "--cascade=orphan".into(),
            "--wait=false".into(),
        ],
        vec!["delete".into(), "pod".into(), "nope".into()],
        vec!["get".into(), "pods".into()],
        vec!["apply".into(), "-f".into(), m("09-namespace-config.yaml")],
        vec!["delete".into(), "cm".into(), "-n".into(), "demo".into(), "--all".into()],
        vec!["delete".into(), "pods".into(), "-n".into(), "demo".into(), "-l".into(), "nothing=here".into()],
        vec!["delete".into(), "secret".into(), "creds".into(), "-n".into(), "demo".into(), "--grace-period=1".into()],
        vec!["get".into(), "all".into(), "-n".into(), "demo".into()],
    ];
    for st in &steps {
        let args: Vec<&str> = st.iter().map(String::as_str).collect();
        k.same(&ua, &ub, &args)?;
    }
    Ok(())
}

#[test]
fn bad_inputs_fail_like_the_official_kubectl() -> Result<()> {
    let Some((ours, official)) = binaries() else { return Ok(()) };
    let k = Pair { ours, official };
    let srv = ApiServer::start()?;
    let u = srv.url();
    let dir = tempfile::tempdir()?;
    let file = |name: &str, text: &str| -> Result<String> {
        let p = dir.path().join(name);
        std::fs::write(&p, text)?;
        Ok(s(&p))
    };
    // A missing file.
    for verb in ["apply", "create", "delete", "replace"] {
        let r = k.same_exact(&u, &u, &[verb, "-f", "no-such-file.yaml"])?;
        assert_eq!((r.code, r.stderr.as_str()), (1, "error: the path \"no-such-file.yaml\" does not exist\n"));
    }
    // YAML syntax errors name the file and the line.
    let bad = file("bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n  bad: [\n")?;
    let r = k.same_exact(&u, &u, &["apply", "-f", &bad])?;
    assert_eq!(r.stderr, format!("error: error parsing {bad}: error converting YAML to JSON: yaml: line 5: did not find expected node content\n"));
    let bad2 = file("bad2.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n data: 1\n")?;
    k.same_exact(&u, &u, &["apply", "-f", &bad2])?;
    k.same_exact(&u, &u, &["create", "-f", &bad2])?;
    // Unknown kinds: as a type argument and in a manifest.
    let r = k.same_exact(&u, &u, &["get", "foo"])?;
    assert_eq!((r.code, r.stderr.as_str()), (1, "error: the server doesn't have a resource type \"foo\"\n"));
    k.same_exact(&u, &u, &["delete", "foo", "x"])?;
    let foo = file("foo.yaml", "apiVersion: v1\nkind: Foo\nmetadata:\n  name: x\n")?;
    let r = k.same_exact(&u, &u, &["apply", "-f", &foo])?;
    assert!(r.stderr.contains("no matches for kind \"Foo\" in version \"v1\""), "{r:?}");
    // A missing namespace.
    let cm = file("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  namespace: nons\n")?;
    let r = k.same_exact(&u, &u, &["apply", "-f", &cm])?;
    assert_eq!(
        r.stderr,
        format!("Error from server (NotFound): error when creating \"{cm}\": namespaces \"nons\" not found\n")
    );
    k.same_exact(&u, &u, &["create", "-f", &cm])?;
    let r = k.same_exact(&u, &u, &["get", "pods", "-n", "nons"])?;
    assert_eq!((r.code, r.stderr.as_str()), (0, "No resources found in nons namespace.\n"));
    // Not found.
    let r = k.same_exact(&u, &u, &["get", "pod", "x"])?;
    assert_eq!(r.stderr, "Error from server (NotFound): pods \"x\" not found\n");
    k.same_exact(&u, &u, &["delete", "pod", "x"])?;
    k.same_exact(&u, &u, &["describe", "pod", "x"])?;
    k.same_exact(&u, &u, &["scale", "deploy", "x", "--replicas=1"])?;
    // Conflicts: creating what exists, replacing with a stale resourceVersion.
    let ok = file("ok.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: b\n")?;
    assert_eq!(k.ours(&u, &["create", "-f", &ok])?.code, 0);
    let r = k.same_exact(&u, &u, &["create", "-f", &ok])?;
    assert_eq!(
        r.stderr,
        format!("Error from server (AlreadyExists): error when creating \"{ok}\": configmaps \"c\" already exists\n")
    );
    k.ours(&u, &["label", "cm", "c", "x=1"])?;
    let stale = file(
        "stale.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  resourceVersion: \"1\"\ndata:\n  a: c\n",
    )?;
    let r = k.same_exact(&u, &u, &["replace", "-f", &stale])?;
    assert!(r.stderr.starts_with("Error from server (Conflict): "), "{r:?}");
    // Flag errors.
    k.same(&u, &u, &["get", "pods", "-o", "bogus"])?;
    Ok(())
}

#[test]
fn completion_version_and_config() -> Result<()> {
    let ours = our_kubectl();
    let srv = ApiServer::start()?;
    let u = srv.url();
    for sh in ["bash", "zsh"] {
        let r = run(&ours, &u, &["completion", sh], None)?;
        assert_eq!(r.code, 0, "{r:?}");
        assert!(r.stdout.contains("kubectl"), "{sh} completion");
    }
    let r = run(&ours, &u, &["version"], None)?;
    assert!(r.stdout.starts_with("Client Version: ") && r.stdout.contains("\nServer Version: "), "{r:?}");
    let r = run(&ours, &u, &["cluster-info"], None)?;
    assert!(r.stdout.starts_with(&format!("Kubernetes control plane is running at {u}")), "{r:?}");
    // A kubeconfig with two contexts: --context, use-context, current-context, get-contexts.
    let dir = tempfile::tempdir()?;
    let kc = dir.path().join("config");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: mini\n  cluster:\n    server: {u}\n- name: dead\n  cluster:\n    server: http://127.0.0.1:1\ncontexts:\n- name: good\n  context:\n    cluster: mini\n    user: me\n    namespace: kube-system\n- name: bad\n  context:\n    cluster: dead\n    user: me\ncurrent-context: bad\nusers:\n- name: me\n  user: {{}}\n"
        ),
    )?;
    let kcs = s(&kc);
    let plain = |args: &[&str]| -> Result<Run> {
        let out = std::process::Command::new(&ours).args(args).env("KUBECONFIG", &kcs).output()?;
        Ok(Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into(),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        })
    };
    assert_eq!(plain(&["config", "current-context"])?.stdout, "bad\n");
    let r = plain(&["get", "pods"])?;
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("127.0.0.1:1 was refused"), "{r:?}");
    let r = plain(&["--context", "good", "get", "pods"])?;
    assert_eq!((r.code, r.stderr.as_str()), (0, "No resources found in kube-system namespace.\n"));
    assert_eq!(plain(&["config", "use-context", "good"])?.stdout, "Switched to context \"good\".\n");
    let r = plain(&["config", "get-contexts"])?;
    assert_eq!(r.stdout, "CURRENT   NAME   CLUSTER   AUTHINFO   NAMESPACE\n          bad    dead      me         \n*         good   mini      me         kube-system\n");
    let r = plain(&["--kubeconfig", &kcs, "get", "ns", "-o", "name"])?;
    assert!(r.stdout.contains("namespace/default"), "{r:?}");
    Ok(())
}

/// Startup cost side by side (no timed assertion; prints the ratio): `get pods` on an empty
/// namespace, alternating the two binaries.
#[test]
fn startup_time_side_by_side() -> Result<()> {
    let Some((ours, official)) = binaries() else { return Ok(()) };
    let srv = ApiServer::start()?;
    let u = srv.url();
    // Warm both (the official one fills its discovery cache on the first run).
    run(&ours, &u, &["get", "pods"], None)?;
    run(&official, &u, &["get", "pods"], None)?;
    let n = 20;
    let (mut t_ours, mut t_off) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    for _ in 0..n {
        let t = std::time::Instant::now();
        assert_eq!(run(&ours, &u, &["get", "pods"], None)?.code, 0);
        t_ours += t.elapsed();
        let t = std::time::Instant::now();
        assert_eq!(run(&official, &u, &["get", "pods"], None)?.code, 0);
        t_off += t.elapsed();
    }
    println!(
        "kubectl get pods (empty namespace), mean of {n}: ours {:?}, official {:?}, ratio ours/official {:.2}",
        t_ours / n,
        t_off / n,
        t_ours.as_secs_f64() / t_off.as_secs_f64()
    );
    Ok(())
}

/// `get -w` prints the current rows, then a row per change.
#[test]
fn get_watch_streams_changes() -> Result<()> {
    use std::io::BufRead;
    let ours = our_kubectl();
    let srv = ApiServer::start()?;
    let u = srv.url();
    let dir = tempfile::tempdir()?;
    let cm = |n: &str| -> Result<String> {
        let p = dir.path().join(format!("{n}.yaml"));
        std::fs::write(&p, format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {n}\ndata:\n  a: b\n"))?;
        Ok(s(&p))
    };
    assert_eq!(run(&ours, &u, &["apply", "-f", &cm("before")?], None)?.code, 0);
    let mut child = std::process::Command::new(&ours)
        .args(["--server", &u, "get", "cm", "-w"])
        .env("KUBECONFIG", "/dev/null")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = |what: &str| -> Result<String> {
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .map_err(|_| anyhow::anyhow!("no line from get -w while waiting for {what}"))
    };
    assert!(next("header")?.starts_with("NAME"));
    // The initial listing (kube-root-ca.crt may or may not exist, so look for ours).
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.starts_with("before ")) {
        seen.push(next("the initial row")?);
    }
    assert_eq!(run(&ours, &u, &["apply", "-f", &cm("after")?], None)?.code, 0);
    loop {
        let l = next("the new object's row")?;
        if l.starts_with("after ") {
            assert!(l.split_whitespace().nth(1) == Some("1"), "{l}");
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(())
}

/// `wait --for=…`, `rollout status` against objects whose status the test sets itself.
#[test]
fn wait_and_rollout_status() -> Result<()> {
    let ours = our_kubectl();
    let srv = ApiServer::start()?;
    let u = srv.url();
    let deploy = s(&manifests_dir().join("03-deployment.yaml"));
    assert_eq!(run(&ours, &u, &["apply", "-f", &deploy], None)?.code, 0);
    let r = run(&ours, &u, &["rollout", "status", "deploy/web", "--watch=false"], None)?;
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.starts_with("Waiting for deployment "), "{r:?}");
    let r = run(&ours, &u, &["wait", "--for=condition=Available", "deploy/web", "--timeout=1s"], None)?;
    assert_eq!((r.code, r.stderr.as_str()), (1, "error: timed out waiting for the condition on deployments/web\n"));
    // Mark the deployment rolled out through the status subresource.
    let status = r#"{"status":{"observedGeneration":1,"replicas":3,"updatedReplicas":3,"readyReplicas":3,"availableReplicas":3,"conditions":[{"type":"Available","status":"True","reason":"MinimumReplicasAvailable"}]}}"#;
    let r =
        run(&ours, &u, &["patch", "deploy", "web", "--subresource", "status", "--type", "merge", "-p", status], None)?;
    assert_eq!(r.code, 0, "{r:?}");
    let r = run(&ours, &u, &["rollout", "status", "deploy/web"], None)?;
    assert_eq!(r.stdout, "deployment \"web\" successfully rolled out\n", "{r:?}");
    let r = run(&ours, &u, &["wait", "--for=condition=Available", "deploy/web"], None)?;
    assert_eq!(r.stdout, "deployment.apps/web condition met\n", "{r:?}");
    let r = run(&ours, &u, &["wait", "--for=jsonpath={.status.replicas}=3", "deploy/web"], None)?;
    assert_eq!(r.stdout, "deployment.apps/web condition met\n", "{r:?}");
    assert_eq!(run(&ours, &u, &["delete", "deploy", "web"], None)?.stdout, "deployment.apps \"web\" deleted\n");
    let r = run(&ours, &u, &["wait", "--for=delete", "deploy/web", "--timeout=5s"], None)?;
    assert_eq!((r.code, r.stdout.as_str()), (0, ""), "{r:?}");
    Ok(())
}
