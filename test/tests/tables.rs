//! `kubectl get` prints the columns a real cluster prints (server-side Tables), for the shared
//! manifests' kinds and the other everyday ones.

use anyhow::{ensure, Result};
use e2e::{manifests_dir, official_kubectls, ApiServer};

#[test]
fn kubectl_get_headers_match_a_real_cluster() -> Result<()> {
    if !manifests_dir().exists() {
        ensure!(std::env::var("CI").as_deref() != Ok("true"), "manifests missing");
        return Ok(());
    }
    for (v, bin) in official_kubectls(&["1.33"]) {
        let server = ApiServer::start()?;
        let k = |args: &[&str]| server.kubectl_bin(&bin, args);
        let out = k(&["apply", "-f", &manifests_dir().to_string_lossy()])?;
        ensure!(out.ok, "{out:?}");
        for args in [
            vec!["create", "cronjob", "cj", "--image=busybox", "--schedule=*/1 * * * *"],
            vec!["create", "role", "r", "--verb=get", "--resource=pods"],
            vec!["create", "rolebinding", "rb", "--role=r", "--user=u"],
            vec!["create", "serviceaccount", "sa1"],
        ] {
            let out = k(&args)?;
            ensure!(out.ok, "{args:?}: {out:?}");
        }
        let expected: &[(&str, &str)] = &[
            ("pods", "NAME READY STATUS RESTARTS AGE"),
            // kube-apiserver's pod columns of priority 1 (printers' podColumnDefinitions).
            ("pods -o wide", "NAME READY STATUS RESTARTS AGE IP NODE NOMINATED NODE READINESS GATES"),
            ("deployments", "NAME READY UP-TO-DATE AVAILABLE AGE"),
            ("replicasets", "NAME DESIRED CURRENT READY AGE"),
            ("services", "NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE"),
            ("jobs", "NAME STATUS COMPLETIONS DURATION AGE"),
            ("cronjobs", "NAME SCHEDULE TIMEZONE SUSPEND ACTIVE LAST SCHEDULE AGE"),
            ("hpa", "NAME REFERENCE TARGETS MINPODS MAXPODS REPLICAS AGE"),
            ("ingresses", "NAME CLASS HOSTS ADDRESS PORTS AGE"),
            (
                "pv",
                "NAME CAPACITY ACCESS MODES RECLAIM POLICY STATUS CLAIM STORAGECLASS VOLUMEATTRIBUTESCLASS REASON AGE",
            ),
            ("pvc", "NAME STATUS VOLUME CAPACITY ACCESS MODES STORAGECLASS VOLUMEATTRIBUTESCLASS AGE"),
            ("configmaps -n demo", "NAME DATA AGE"),
            ("secrets -n demo", "NAME TYPE DATA AGE"),
            ("namespaces", "NAME STATUS AGE"),
            ("roles", "NAME CREATED AT"),
            ("rolebindings", "NAME ROLE AGE"),
            ("serviceaccounts", "NAME SECRETS AGE"),
        ];
        for (what, header) in expected {
            let mut args = vec!["get"];
            args.extend(what.split_whitespace());
            let out = k(&args)?;
            ensure!(out.ok, "kubectl {v} get {what}: {out:?}");
            let got: Vec<&str> = out.stdout.lines().next().unwrap_or_default().split_whitespace().collect();
            let want: Vec<&str> = header.split_whitespace().collect();
            ensure!(got == want, "kubectl {v} get {what}: {:?} != {:?}", got, want);
        }
        let out = k(&["get", "hpa", "web", "--no-headers"])?;
        ensure!(out.stdout.contains("Deployment/web") && out.stdout.contains("cpu: <unknown>/50%"), "{out:?}");
        let out = k(&["get", "pv", "test-pv", "--no-headers"])?;
        ensure!(out.stdout.contains("RWO") && out.stdout.contains("Retain"), "{out:?}");
    }
    Ok(())
}
