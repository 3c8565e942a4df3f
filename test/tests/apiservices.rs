//! `apiregistration.k8s.io/v1` APIServices: every built-in group-version is a `Local`,
//! available APIService (as kube-apiserver registers them), the official kubectl lists them
//! with its columns, an aggregated API's APIService can be created (a chart that installs one
//! no longer fails) and says it is not available (its Service does not exist: the aggregator's
//! `ServiceNotFound`), and a name that is not `<version>.<group>` is refused.

use anyhow::{ensure, Result};
use e2e::ApiServer;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::Api;

const AGGREGATED: &str = "apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.custom.metrics.k8s.io
spec:
  group: custom.metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  insecureSkipTLSVerify: true
  service:
    name: custom-metrics-apiserver
    namespace: custom-metrics
";

fn words(l: &str) -> Vec<&str> {
    l.split_whitespace().collect()
}

#[tokio::test]
async fn built_in_apis_are_local_and_aggregated_ones_are_stored() -> Result<()> {
    let api = ApiServer::start()?;

    let out = api.kubectl(&["get", "apiservices"])?;
    ensure!(out.ok, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    ensure!(words(lines[0]) == ["NAME", "SERVICE", "AVAILABLE", "AGE"], "{}", out.stdout);
    for name in
        ["v1.", "v1.apps", "v1.batch", "v2.autoscaling", "v1.rbac.authorization.k8s.io", "v1beta1.metrics.k8s.io"]
    {
        ensure!(
            lines.iter().any(|l| words(l)[..3] == [name, "Local", "True"]),
            "{name} is not a Local, available APIService:\n{}",
            out.stdout
        );
    }

    let typed: Api<APIService> = Api::all(api.client()?);
    let apps = typed.get("v1.apps").await?;
    ensure!(apps.spec.as_ref().is_some_and(|s| s.group.as_deref() == Some("apps") && s.service.is_none()));

    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), AGGREGATED)?;
    let out = api.kubectl(&["apply", "-f", &file.path().to_string_lossy()])?;
    ensure!(
        out.ok && out.stdout.contains("apiservice.apiregistration.k8s.io/v1beta1.custom.metrics.k8s.io created"),
        "{out:?}"
    );
    // The availability controller records why it is not available, a moment after the create.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let out = api.kubectl(&["get", "apiservice", "v1beta1.custom.metrics.k8s.io", "--no-headers"])?;
        let want =
            ["v1beta1.custom.metrics.k8s.io", "custom-metrics/custom-metrics-apiserver", "False", "(ServiceNotFound)"];
        if words(&out.stdout).get(..4) == Some(&want[..]) {
            break;
        }
        ensure!(std::time::Instant::now() < deadline, "{out:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    let bad = AGGREGATED.replace("name: v1beta1.custom.metrics.k8s.io", "name: custom-metrics");
    std::fs::write(file.path(), bad)?;
    let out = api.kubectl(&["apply", "-f", &file.path().to_string_lossy()])?;
    ensure!(
        !out.ok
            && out
                .stderr
                .contains("metadata.name: Invalid value: \"custom-metrics\": must be `spec.version+\".\"+spec.group`"),
        "{out:?}"
    );
    Ok(())
}
