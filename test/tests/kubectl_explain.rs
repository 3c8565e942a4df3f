//! `kubectl explain` with our kubectl beside the official one (both read the server's
//! `/openapi/v3`): the same text, byte for byte, for kinds, nested fields, lists, maps,
//! primitives, other groups and autoscaling/v1.

use anyhow::{ensure, Result};
use e2e::kubectl::{official_kubectl, our_kubectl, run};
use e2e::ApiServer;

#[test]
fn explain_prints_what_the_official_kubectl_prints() -> Result<()> {
    let Some(official) = official_kubectl() else {
        eprintln!("skipping: no official kubectl");
        return Ok(());
    };
    let ours = our_kubectl();
    let server = ApiServer::start()?;
    let url = server.url();
    let cases: &[&[&str]] = &[
        &["explain", "pod.spec.containers"],
        &["explain", "pod"],
        &["explain", "pods.spec.restartPolicy"],
        &["explain", "po.metadata.labels"],
        &["explain", "deploy.spec.strategy"],
        &["explain", "svc.spec.ports.targetPort"],
        &["explain", "pod.spec.containers.resources.limits"],
        &["explain", "ingress.spec.rules"],
        &["explain", "hpa.spec"],
        &["explain", "hpa.spec", "--api-version=autoscaling/v1"],
        &["explain", "node.status"],
        &["explain", "pod.spec.containers", "--recursive"],
        &["explain", "deploy.spec", "--recursive"],
    ];
    for args in cases {
        let a = run(&ours, &url, args, None)?;
        let b = run(&official, &url, args, None)?;
        ensure!(b.code == 0, "official {args:?}: {b:?}");
        ensure!(a == b, "{args:?}:\nours:\n{}{}\nofficial:\n{}{}", a.stdout, a.stderr, b.stdout, b.stderr);
    }
    // A field that does not exist fails (exit 1) on both.
    let a = run(&ours, &url, &["explain", "pod.spec.nope"], None)?;
    let b = run(&official, &url, &["explain", "pod.spec.nope"], None)?;
    ensure!(a.code == 1 && b.code == 1, "{a:?} {b:?}");
    ensure!(a.stderr.contains("nope") && b.stderr.contains("nope"), "{a:?} {b:?}");
    Ok(())
}
