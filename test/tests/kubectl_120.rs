//! Debian's kubectl 1.20 (an old client: older discovery, OpenAPI v2 only, client-side
//! apply) with its default flags over the shared manifests 01–09: apply, apply again, get,
//! delete — compared line by line with the official kubectl 1.33 on the same server.

use std::path::Path;

use anyhow::{ensure, Result};
use e2e::controller_manager::ControllerManager;
use e2e::kubectl::run;
use e2e::{debian_kubectl, manifests_dir, official_kubectls, ApiServer};

fn manifests() -> Result<Vec<String>> {
    let mut files: Vec<String> = std::fs::read_dir(manifests_dir())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n.as_bytes().first() == Some(&b'0'))
        .collect();
    files.sort();
    Ok(files)
}

fn lines(s: &str) -> Vec<&str> {
    s.lines().filter(|l| !l.trim().is_empty()).collect()
}

#[test]
fn debian_kubectl_1_20_applies_gets_and_deletes_the_manifests() -> Result<()> {
    let Some(k120) = debian_kubectl() else {
        eprintln!("skipping: Debian's kubectl 1.20 is not unpacked (scripts/test does it)");
        return Ok(());
    };
    let official = official_kubectls(&["1.33"]);
    let Some((_, k133)) = official.first() else {
        eprintln!("skipping: no official kubectl 1.33");
        return Ok(());
    };
    if !manifests_dir().exists() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "manifests missing");
        return Ok(());
    }
    let server = ApiServer::start()?;
    // The namespace in 09 finishes deleting only with the namespace controller.
    let _cm = ControllerManager::start(&server, &[])?;
    let url = server.url();
    let k = |bin: &Path, args: &[&str]| run(bin, &url, args, None);
    let files = manifests()?;
    ensure!(files.len() == 9, "{files:?}");
    for f in &files {
        let path = manifests_dir().join(f).to_string_lossy().into_owned();
        // apply: every object created
        let out = k(&k120, &["apply", "-f", &path])?;
        ensure!(out.code == 0, "1.20 apply {f}: {out:?}");
        ensure!(
            !lines(&out.stdout).is_empty() && lines(&out.stdout).iter().all(|l| l.ends_with(" created")),
            "1.20 apply {f}: {out:?}"
        );
        // apply again: what 1.33 reports for the same manifest (`unchanged`; a Secret
        // written with stringData is `configured` every time, as on a real cluster)
        let again = k(&k120, &["apply", "-f", &path])?;
        let reference = k(k133, &["apply", "-f", &path])?;
        ensure!(again.code == 0 && reference.code == 0, "apply again {f}: {again:?} {reference:?}");
        ensure!(
            lines(&again.stdout) == lines(&reference.stdout),
            "apply again {f}: 1.20 {again:?}\n1.33 {reference:?}"
        );
        ensure!(lines(&again.stdout).iter().any(|l| l.ends_with(" unchanged")), "apply again {f}: {again:?}");
        // get -f: the server's tables, same headers as 1.33 prints
        let got = k(&k120, &["get", "-f", &path])?;
        let reference = k(k133, &["get", "-f", &path])?;
        ensure!(got.code == 0, "1.20 get -f {f}: {got:?}");
        let headers = |s: &str| -> Vec<String> {
            s.lines()
                .filter(|l| l.starts_with("NAME"))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect()
        };
        ensure!(!headers(&got.stdout).is_empty(), "1.20 get -f {f}: {got:?}");
        ensure!(headers(&got.stdout) == headers(&reference.stdout), "get -f {f}: 1.20 {got:?}\n1.33 {reference:?}");
        // -o yaml of a single object
        let out = k(&k120, &["get", "-f", &path, "-o", "name"])?;
        ensure!(
            out.code == 0 && lines(&out.stdout).len() == lines(&again.stdout).len(),
            "1.20 get -o name {f}: {out:?}"
        );
    }
    // delete -f in reverse order (the namespace last), with 1.20's default --wait
    for f in files.iter().rev() {
        let path = manifests_dir().join(f).to_string_lossy().into_owned();
        let out = k(&k120, &["delete", "-f", &path, "--timeout=60s"])?;
        ensure!(out.code == 0, "1.20 delete -f {f}: {out:?}");
        ensure!(lines(&out.stdout).iter().all(|l| l.ends_with(" deleted")), "1.20 delete -f {f}: {out:?}");
        let out = k(&k120, &["get", "-f", &path])?;
        ensure!(out.code != 0 && out.stderr.contains("NotFound"), "after delete {f}: {out:?}");
    }
    Ok(())
}
