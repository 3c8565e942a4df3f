//! Client-side `kubectl apply` (the default) with default flags — validation on, strategic
//! merge patches computed by kubectl from our OpenAPI — over every shared manifest, with the
//! official kubectl 1.33 and 1.27. Debian's kubectl 1.20 has its own suite (`kubectl_120.rs`).

use anyhow::{ensure, Result};
use e2e::{manifests_dir, official_kubectls, ApiServer};

fn manifests() -> Result<Vec<(String, String)>> {
    let dir = manifests_dir();
    if !dir.exists() {
        ensure!(std::env::var("CI").as_deref() != Ok("true"), "manifests missing: {}", dir.display());
        return Ok(vec![]);
    }
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| (p.file_name().unwrap_or_default().to_string_lossy().into_owned(), p.to_string_lossy().into_owned()))
        .collect();
    files.sort();
    Ok(files)
}

/// Objects whose manifest carries write-only fields (a Secret's `stringData` is folded into
/// `data`), which kubectl re-sends on every apply against a real cluster too.
fn always_configured(line: &str) -> bool {
    line.starts_with("secret/creds ")
}

#[test]
fn apply_twice_is_unchanged_for_every_manifest() -> Result<()> {
    let files = manifests()?;
    for (v, bin) in official_kubectls(&["1.33", "1.27"]) {
        let server = ApiServer::start()?;
        for (name, path) in &files {
            let out = server.kubectl_bin(&bin, &["apply", "-f", path])?;
            ensure!(out.ok, "kubectl {v} apply -f {name}: {}", out.stderr);
            ensure!(out.stderr.trim().is_empty() || !out.stderr.contains("rror"), "kubectl {v} {name}: {}", out.stderr);
            for line in out.stdout.lines() {
                ensure!(line.ends_with(" created"), "kubectl {v} first apply of {name}: {line}");
            }
        }
        for (name, path) in &files {
            let out = server.kubectl_bin(&bin, &["apply", "-f", path])?;
            ensure!(out.ok, "kubectl {v} apply -f {name} again: {}", out.stderr);
            for line in out.stdout.lines() {
                ensure!(
                    line.ends_with(" unchanged") || always_configured(line),
                    "kubectl {v} second apply of {name}: {line}"
                );
            }
        }
        // get/delete with the same kubectl.
        let out = server.kubectl_bin(&bin, &["get", "deployments,pods,services", "-A"])?;
        ensure!(out.ok && out.stdout.contains("web"), "kubectl {v} get: {out:?}");
        for (name, path) in files.iter().rev() {
            let out = server.kubectl_bin(&bin, &["delete", "--wait=false", "-f", path])?;
            ensure!(out.ok, "kubectl {v} delete -f {name}: {}", out.stderr);
        }
    }
    Ok(())
}

#[test]
fn apply_changes_are_configured_and_removed_fields_disappear() -> Result<()> {
    if manifests()?.is_empty() {
        return Ok(());
    }
    let original = std::fs::read_to_string(manifests_dir().join("03-deployment.yaml"))?;
    let module = std::fs::read_to_string(manifests_dir().join("11-module-deployment.yaml"))?;
    for (v, bin) in official_kubectls(&["1.33", "1.27"]) {
        let server = ApiServer::start()?;
        let file = server.data_dir.join("web.yaml");
        let apply = |text: &str| -> Result<String> {
            std::fs::write(&file, text)?;
            let out = server.kubectl_bin(&bin, &["apply", "-f", &file.to_string_lossy()])?;
            ensure!(out.ok, "kubectl {v} apply: {}", out.stderr);
            Ok(out.stdout.trim().to_string())
        };
        let env = || -> Result<String> {
            let out = server.kubectl_bin(
                &bin,
                &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].env}"],
            )?;
            Ok(out.stdout)
        };
        ensure!(apply(&original)? == "deployment.apps/web created");
        // Change a field.
        let changed = original.replace("replicas: 3", "replicas: 4").replace("value: \"v1\"", "value: \"v2\"");
        ensure!(changed != original, "the manifest changed shape; update the test");
        ensure!(apply(&changed)? == "deployment.apps/web configured");
        ensure!(env()? == r#"4 [{"name":"VERSION","value":"v2"}]"#, "kubectl {v}: {}", env()?);
        ensure!(apply(&changed)? == "deployment.apps/web unchanged");
        // Add an env var, then remove the first one: it disappears (strategic merge by name).
        let two = changed.replace(
            "            - name: VERSION\n              value: \"v2\"\n",
            "            - name: VERSION\n              value: \"v2\"\n            - name: EXTRA\n              value: \"x\"\n",
        );
        ensure!(two != changed, "the manifest changed shape; update the test");
        ensure!(apply(&two)? == "deployment.apps/web configured");
        let only_extra = two.replace("            - name: VERSION\n              value: \"v2\"\n", "");
        ensure!(apply(&only_extra)? == "deployment.apps/web configured");
        ensure!(env()? == r#"4 [{"name":"EXTRA","value":"x"}]"#, "kubectl {v}: {}", env()?);
        // Fields the server defaulted (not in the manifest) survive the applies.
        let out =
            server.kubectl_bin(&bin, &["get", "deploy", "web", "-o", "jsonpath={.spec.progressDeadlineSeconds}"])?;
        ensure!(out.stdout == "600", "kubectl {v}: {out:?}");
        // Removing the whole env list removes the field.
        let module_file = server.data_dir.join("module.yaml");
        std::fs::write(&module_file, &module)?;
        let out = server.kubectl_bin(&bin, &["apply", "-f", &module_file.to_string_lossy()])?;
        ensure!(out.ok, "{out:?}");
        let no_env =
            module.replace("          env:\n            - name: BIZ_VERSION\n              value: 0.0.1\n", "");
        ensure!(no_env != module, "the manifest changed shape; update the test");
        std::fs::write(&module_file, &no_env)?;
        let out = server.kubectl_bin(&bin, &["apply", "-f", &module_file.to_string_lossy()])?;
        ensure!(out.ok && out.stdout.contains("configured"), "{out:?}");
        let out = server
            .kubectl_bin(&bin, &["get", "deploy", "biz2", "-o", "jsonpath={.spec.template.spec.containers[0]}"])?;
        ensure!(out.ok && !out.stdout.contains("env") && out.stdout.contains("image"), "kubectl {v}: {out:?}");
        // kubectl diff shows a pending change, and nothing once applied.
        let out = server.kubectl_bin(&bin, &["diff", "-f", &file.to_string_lossy()])?;
        ensure!(out.ok && out.stdout.is_empty(), "kubectl {v} diff of an applied file: {out:?}");
        std::fs::write(&file, only_extra.replace("replicas: 4", "replicas: 5"))?;
        let out = server.kubectl_bin(&bin, &["diff", "-f", &file.to_string_lossy()])?;
        ensure!(
            out.stdout.contains("+  replicas: 5") && out.stdout.contains("-  replicas: 4"),
            "kubectl {v} diff: {out:?}"
        );
    }
    Ok(())
}

#[test]
fn server_side_apply_creates_updates_and_reports_conflicts() -> Result<()> {
    let files = manifests()?;
    if files.is_empty() {
        return Ok(());
    }
    let original = std::fs::read_to_string(manifests_dir().join("03-deployment.yaml"))?;
    for (v, bin) in official_kubectls(&["1.33", "1.27"]) {
        let server = ApiServer::start()?;
        for (name, path) in &files {
            for round in 0..2 {
                let out = server.kubectl_bin(&bin, &["apply", "--server-side", "-f", path])?;
                ensure!(out.ok, "kubectl {v} apply --server-side -f {name} (round {round}): {}", out.stderr);
                for line in out.stdout.lines() {
                    ensure!(line.ends_with(" serverside-applied"), "kubectl {v} {name}: {line}");
                }
            }
        }
        let file = server.data_dir.join("web.yaml");
        let apply = |text: &str, extra: &[&str]| -> Result<e2e::KubectlOutput> {
            std::fs::write(&file, text)?;
            let path = file.to_string_lossy().into_owned();
            let mut args = vec!["apply", "--server-side", "-f", path.as_str()];
            args.extend_from_slice(extra);
            server.kubectl_bin(&bin, &args)
        };
        let replicas = || -> Result<String> {
            Ok(server.kubectl_bin(&bin, &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"])?.stdout)
        };
        // The owner changes its own field.
        let four = original.replace("replicas: 3", "replicas: 4");
        ensure!(apply(&four, &[])?.ok && replicas()? == "4", "kubectl {v}: update by the owner");
        // A second manager (with a partial configuration) setting it differently conflicts…
        let partial = |n: u32| {
            format!("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: default\nspec:\n  replicas: {n}\n")
        };
        let five = partial(5);
        let out = apply(&five, &["--field-manager=other"])?;
        ensure!(!out.ok, "kubectl {v}: no conflict reported: {out:?}");
        ensure!(
            out.stderr.contains("Apply failed with 1 conflict: conflict with \"kubectl\": .spec.replicas"),
            "kubectl {v}: {}",
            out.stderr
        );
        ensure!(replicas()? == "4", "kubectl {v}: a conflicting apply changed the object");
        // …agreeing with the current value is shared ownership…
        let out = apply(&partial(4), &["--field-manager=other"])?;
        ensure!(out.ok, "kubectl {v}: co-owning apply: {out:?}");
        // …and --force-conflicts takes the field over.
        let out = apply(&five, &["--field-manager=other", "--force-conflicts"])?;
        ensure!(out.ok && replicas()? == "5", "kubectl {v}: forced apply: {out:?}");
        let out = server.kubectl_bin(
            &bin,
            &["get", "deploy", "web", "--show-managed-fields", "-o", "jsonpath={.metadata.managedFields[*].manager}"],
        )?;
        ensure!(out.stdout.contains("kubectl") && out.stdout.contains("other"), "kubectl {v}: {out:?}");
        // The first manager dropping a field it alone owns removes it.
        let no_env = original
            .replace("replicas: 3", "replicas: 5")
            .replace("          env:\n            - name: VERSION\n              value: \"v1\"\n", "");
        ensure!(apply(&no_env, &[])?.ok, "kubectl {v}: apply without env");
        let out = server
            .kubectl_bin(&bin, &["get", "deploy", "web", "-o", "jsonpath={.spec.template.spec.containers[0]}"])?;
        ensure!(!out.stdout.contains("\"env\"") && out.stdout.contains("busybox"), "kubectl {v}: {out:?}");
    }
    Ok(())
}

/// Every write is recorded in managedFields as Kubernetes records it, not only applies:
/// `kubectl create`, `label` and `set image` each leave an `Update` entry owning what they
/// wrote (taking it from whoever owned it before), a status patch an entry for the status
/// subresource, and a server-side apply then conflicts with the update that set a field to
/// another value — the same message a real cluster gives — until forced.
#[test]
fn every_write_records_its_manager_and_apply_meets_them() -> Result<()> {
    for (v, bin) in official_kubectls(&["1.33"]) {
        let server = ApiServer::start()?;
        let k = |args: &[&str]| server.kubectl_bin(&bin, args);
        ensure!(k(&["create", "deployment", "web", "--image=nginx"])?.ok);
        ensure!(k(&["label", "deployment", "web", "tier=front"])?.ok);
        ensure!(k(&["set", "image", "deployment/web", "nginx=nginx:2"])?.ok);
        let out = k(&[
            "patch",
            "deployment",
            "web",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":0}}"#,
        ])?;
        ensure!(out.ok, "kubectl {v}: {out:?}");
        let managers = || -> Result<Vec<(String, String, String, String)>> {
            let out = k(&["get", "deployment", "web", "-o", "json", "--show-managed-fields"])?;
            let d: serde_json::Value = serde_json::from_str(&out.stdout)?;
            Ok(d["metadata"]["managedFields"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|e| {
                    let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                    (
                        s("manager"),
                        s("operation"),
                        s("subresource"),
                        serde_json::to_string(&e["fieldsV1"]).unwrap_or_default(),
                    )
                })
                .collect())
        };
        let m = managers()?;
        let names: Vec<(&str, &str, &str)> =
            m.iter().map(|(a, b, c, _)| (a.as_str(), b.as_str(), c.as_str())).collect();
        ensure!(
            names
                == [
                    ("kubectl-create", "Update", ""),
                    ("kubectl-label", "Update", ""),
                    ("kubectl-set", "Update", ""),
                    ("kubectl-patch", "Update", "status"),
                ],
            "kubectl {v}: {m:?}"
        );
        let image = r#""f:image":{}"#;
        ensure!(!m[0].3.contains(image) && m[2].3.contains(image), "kubectl {v}: set image took the image: {m:?}");
        ensure!(
            m[0].3.contains(r#""f:replicas":{}"#) && m[0].3.contains(r#""f:dnsPolicy":{}"#),
            "defaults are the creator's: {m:?}"
        );
        ensure!(m[1].3 == r#"{"f:metadata":{"f:labels":{"f:tier":{}}}}"#, "kubectl {v}: {m:?}");
        ensure!(m[3].3 == r#"{"f:status":{"f:replicas":{}}}"#, "kubectl {v}: {m:?}");
        // Plain output hides them, as kubectl does.
        let out = k(&["get", "deployment", "web", "-o", "yaml"])?;
        ensure!(!out.stdout.contains("managedFields"), "kubectl {v}: {}", out.stdout);

        let config = server.data_dir.join("web.yaml");
        std::fs::write(
            &config,
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  \
             template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers: [{name: nginx, image: 'nginx:3'}]\n",
        )?;
        let path = config.to_string_lossy().into_owned();
        let out = k(&["apply", "--server-side", "-f", &path])?;
        ensure!(
            !out.ok
                && out.stderr.contains(
                    r#"conflict with "kubectl-set" using apps/v1: .spec.template.spec.containers[name="nginx"].image"#
                ),
            "kubectl {v}: {out:?}"
        );
        let out = k(&["apply", "--server-side", "--force-conflicts", "-f", &path])?;
        ensure!(out.ok, "kubectl {v}: {out:?}");
        let m = managers()?;
        ensure!(
            !m.iter().any(|e| e.0 == "kubectl-set"),
            "kubectl {v}: the forced apply took kubectl-set's only field: {m:?}"
        );
        ensure!(m.iter().any(|e| e.0 == "kubectl" && e.1 == "Apply" && e.3.contains(image)), "kubectl {v}: {m:?}");
    }
    Ok(())
}
