//! `kubectl kustomize` and `-k`: our kubectl builds a kustomization (a base and an overlay
//! using resources, generators with merge, patches of both kinds, namespace, name prefix and
//! suffix, labels, annotations, images, replicas — `test/kustomize/`) into exactly what the
//! official kubectl's embedded kustomize prints, and applies and deletes it with `-k`.

use std::path::Path;

use anyhow::{ensure, Result};
use e2e::kubectl::{our_kubectl, run};
use e2e::{official_kubectls, ApiServer};

fn overlay() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("kustomize/prod").to_string_lossy().into_owned()
}

#[test]
fn our_kustomize_prints_what_the_official_kubectl_prints() -> Result<()> {
    let ours = our_kubectl();
    let dir = overlay();
    // Neither kubectl talks to a server for this.
    let mine = run(&ours, "http://127.0.0.1:1", &["kustomize", &dir], None)?;
    ensure!(mine.code == 0, "ours: {mine:?}");
    for (v, bin) in official_kubectls(&["1.33", "1.27"]) {
        let theirs = std::process::Command::new(&bin).args(["kustomize", &dir]).output()?;
        ensure!(theirs.status.success(), "kubectl {v}: {}", String::from_utf8_lossy(&theirs.stderr));
        let theirs = String::from_utf8_lossy(&theirs.stdout);
        ensure!(
            mine.stdout == theirs,
            "kubectl {v} kustomize differs:\n--- official\n{theirs}\n--- ours\n{}",
            mine.stdout
        );
    }
    ensure!(mine.stderr.contains("'commonLabels' is deprecated"), "{mine:?}");
    Ok(())
}

#[test]
fn apply_and_delete_with_k() -> Result<()> {
    let server = ApiServer::start()?;
    let ours = our_kubectl();
    let dir = overlay();
    let k = |args: &[&str]| run(&ours, &server.url(), args, None);
    let out = k(&["apply", "-k", &dir])?;
    ensure!(out.code == 0, "{out:?}");
    for want in ["namespace/shop created", "deployment.apps/prod-web-v2 created", "service/prod-web-v2 created"] {
        ensure!(out.stdout.contains(want), "{want:?} missing: {out:?}");
    }
    let out = k(&[
        "get",
        "deployment",
        "prod-web-v2",
        "-n",
        "shop",
        "-o",
        "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image}",
    ])?;
    ensure!(out.stdout == "3 registry.local/nginx:1.27", "{out:?}");
    let out = k(&["apply", "-k", &dir])?;
    ensure!(out.code == 0 && out.stdout.lines().all(|l| l.ends_with(" unchanged")), "second apply: {out:?}");
    let out = k(&["apply", "-k", &dir, "-f", "x.yaml"])?;
    ensure!(out.code != 0, "-k with -f must be refused: {out:?}");
    // The Namespace would wait for a namespace controller this test does not run.
    let out = k(&["delete", "-k", &dir, "--wait=false"])?;
    ensure!(out.code == 0 && out.stdout.contains("deployment.apps \"prod-web-v2\" deleted"), "{out:?}");
    Ok(())
}
