//! `kubectl create <generator>` with our kubectl beside the official one: the same objects
//! printed with `--dry-run=client -o yaml` (byte for byte), and the same objects stored
//! when created for real (read back with the official kubectl).

use anyhow::{ensure, Result};
use e2e::kubectl::{official_kubectl, our_kubectl, run};
use e2e::ApiServer;
use serde_json::Value;

/// Generators and their flags (`--` and the command last).
fn cases(dir: &str) -> Vec<Vec<String>> {
    let f = format!("{dir}/app.conf");
    let bin = format!("{dir}/blob.bin");
    [
        "deployment web --image=busybox:latest --port=80 --replicas=2".to_string(),
        "deployment multi --image=busybox --image=minik8s/pause:latest".to_string(),
        "service clusterip web --tcp=5678:8080 --tcp=443".to_string(),
        "service clusterip headless --clusterip=None".to_string(),
        "service nodeport np --tcp=80:8080 --node-port=30123".to_string(),
        format!("configmap cfg --from-file={f} --from-file=renamed={f} --from-literal=mode=fast --from-file={bin}"),
        format!("secret generic creds --from-literal=user=admin --from-file={f} --type=Opaque"),
        "secret generic plain --from-literal=a=b".to_string(),
        "job once --image=busybox -- echo hello".to_string(),
        "serviceaccount robot".to_string(),
        "namespace scratch".to_string(),
    ]
    .iter()
    .map(|c| std::iter::once("create").chain(c.split_whitespace()).map(String::from).collect())
    .collect()
}

/// `args` with extra flags inserted before a `--`.
fn with_flags(args: &[String], extra: &[&str]) -> Vec<String> {
    let at = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut v: Vec<String> = args[..at].to_vec();
    v.extend(extra.iter().map(|s| s.to_string()));
    v.extend(args[at..].iter().cloned());
    v
}

/// What a stored object must agree on: everything but server-assigned identity.
fn comparable(mut v: Value) -> Value {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["uid", "resourceVersion", "creationTimestamp", "managedFields", "namespace", "generation"] {
            m.remove(k);
        }
    }
    if let Some(s) = v.get_mut("spec").and_then(Value::as_object_mut) {
        for k in ["clusterIP", "clusterIPs"] {
            if s.get(k).is_some_and(|x| x != "None" && x.get(0).is_none_or(|y| y != "None")) {
                s.remove(k);
            }
        }
        if let Some(ports) = s.get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports {
                if let Some(p) = p.as_object_mut() {
                    // (each namespace's Service asks for its own nodePort)
                    p.remove("nodePort");
                }
            }
        }
    }
    if let Some(s) = v.get_mut("status").and_then(Value::as_object_mut) {
        s.clear();
    }
    v
}

#[test]
fn create_generators_build_what_the_official_kubectl_builds() -> Result<()> {
    let Some(official) = official_kubectl() else {
        eprintln!("skipping: no official kubectl");
        return Ok(());
    };
    let ours = our_kubectl();
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().to_string_lossy().into_owned();
    std::fs::write(tmp.path().join("app.conf"), "listen 80\n")?;
    std::fs::write(tmp.path().join("blob.bin"), [0xff, 0xfe, 0x00, 0x01])?;
    let server = ApiServer::start()?;
    let url = server.url();
    for ns in ["ours", "theirs"] {
        let out = run(&official, &url, &["create", "namespace", ns], None)?;
        ensure!(out.code == 0, "{out:?}");
    }
    for case in cases(&dir) {
        // The printed object, byte for byte.
        let args = with_flags(&case, &["--dry-run=client", "-o", "yaml"]);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let a = run(&ours, &url, &argv, None)?;
        let b = run(&official, &url, &argv, None)?;
        ensure!(a.code == 0 && b.code == 0, "{case:?}: ours {a:?}\nofficial {b:?}");
        ensure!(
            a.stdout == b.stdout,
            "{case:?} --dry-run=client -o yaml:\nours:\n{}\nofficial:\n{}",
            a.stdout,
            b.stdout
        );

        // Created for real, in two namespaces; the official kubectl reads both back.
        let cluster_scoped = case[1] == "namespace";
        let mut outputs = Vec::new();
        for (bin, ns) in [(&ours, "ours"), (&official, "theirs")] {
            let mut case = case.clone();
            if cluster_scoped {
                case[2] = format!("{}-{ns}", case[2]);
            }
            if ns == "theirs" {
                case = case.iter().map(|a| a.replace("--node-port=30123", "--node-port=30124")).collect();
            }
            let args = with_flags(&case, &["-n", ns]);
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = run(bin, &url, &argv, None)?;
            ensure!(out.code == 0, "{case:?} in {ns}: {out:?}");
            outputs.push(out.stdout.replace(&format!("-{ns}"), ""));
            let (kind, name) = if case[1] == "service" || case[1] == "secret" {
                (case[1].clone(), case[3].clone())
            } else {
                (case[1].clone(), case[2].clone())
            };
            let got = run(&official, &url, &["get", &kind, &name, "-n", ns, "-o", "json"], None)?;
            ensure!(got.code == 0, "{case:?}: {got:?}");
            let stored: Value = serde_json::from_str(&got.stdout)?;
            // The object's uid also appears in a Job's generated selector and labels.
            let uid = stored.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("-").to_string();
            let text = serde_json::to_string(&comparable(stored))?;
            outputs.push(text.replace(&uid, "UID").replace(&format!("-{ns}"), ""));
        }
        ensure!(outputs[0] == outputs[2], "{case:?}: result lines differ: {outputs:?}");
        ensure!(
            outputs[1] == outputs[3],
            "{case:?}: stored objects differ:\nours {}\nofficial {}",
            outputs[1],
            outputs[3]
        );
    }
    Ok(())
}
