//! autoscaling/v1 HorizontalPodAutoscalers beside autoscaling/v2: one storage, Kubernetes'
//! conversion between them, driven by the official kubectl.

use anyhow::{ensure, Context, Result};
use e2e::{kubectl_bin, manifests_dir, raw, ApiServer};
use serde_json::Value;

fn available() -> bool {
    let ok = kubectl_bin().exists() && manifests_dir().exists();
    if !ok && std::env::var("CI").as_deref() == Ok("true") {
        panic!("kubectl ({}) or the manifests ({}) are missing", kubectl_bin().display(), manifests_dir().display());
    }
    ok
}

const V1_HPA: &str = "apiVersion: autoscaling/v1
kind: HorizontalPodAutoscaler
metadata:
  name: api
  namespace: default
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: api
  minReplicas: 2
  maxReplicas: 4
  targetCPUUtilizationPercentage: 60
";

#[test]
fn hpa_v1_and_v2_share_one_storage() -> Result<()> {
    if !available() {
        eprintln!("skipping: no kubectl or manifests");
        return Ok(());
    }
    let server = ApiServer::start()?;
    let k = |args: &[&str]| server.kubectl(args);

    // Discovery: both versions, v2 preferred.
    let group = raw(server.port, "GET", "/apis/autoscaling", None, b"")?.json();
    ensure!(group["preferredVersion"]["version"] == "v2", "{group}");
    let versions: Vec<&str> =
        group["versions"].as_array().into_iter().flatten().filter_map(|v| v["version"].as_str()).collect();
    ensure!(versions == ["v2", "v1"], "{versions:?}");
    let v1 = raw(server.port, "GET", "/apis/autoscaling/v1", None, b"")?.json();
    let names: Vec<&str> =
        v1["resources"].as_array().into_iter().flatten().filter_map(|r| r["name"].as_str()).collect();
    ensure!(names.contains(&"horizontalpodautoscalers") && names.contains(&"horizontalpodautoscalers/status"), "{v1}");

    // The shared manifest (autoscaling/v2) applies with the official kubectl's defaults.
    let hpa = manifests_dir().join("05-hpa.yaml");
    let out = k(&["apply", "-f", &hpa.to_string_lossy()])?;
    ensure!(out.ok && out.stdout.contains("horizontalpodautoscaler.autoscaling/web created"), "{out:?}");
    let out = k(&["apply", "-f", &hpa.to_string_lossy()])?;
    ensure!(out.ok && out.stdout.contains("unchanged"), "{out:?}");

    // Read as v1: the cpu utilization target is the v1 field, the rest is in the annotation.
    let out = k(&["get", "horizontalpodautoscalers.v1.autoscaling", "web", "-o", "json"])?;
    ensure!(out.ok, "{out:?}");
    let v1: Value = serde_json::from_str(&out.stdout).context("v1 json")?;
    ensure!(v1["apiVersion"] == "autoscaling/v1", "{v1}");
    ensure!(v1["spec"]["targetCPUUtilizationPercentage"] == 50 && v1["spec"]["maxReplicas"] == 5, "{v1}");
    let others: Value = serde_json::from_str(
        v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/metrics"].as_str().unwrap_or("null"),
    )?;
    ensure!(
        others[0]["resource"]["name"] == "memory" && others[0]["resource"]["targetAverageValue"] == "100Mi",
        "{v1}"
    );
    ensure!(
        v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/behavior"]
            .as_str()
            .is_some_and(|b| b.contains("\"StabilizationWindowSeconds\":20")),
        "{v1}"
    );
    // Still v2 as stored: no round-trip annotations there.
    let out = k(&["get", "hpa", "web", "-o", "json"])?;
    let v2: Value = serde_json::from_str(&out.stdout).context("v2 json")?;
    ensure!(v2["apiVersion"] == "autoscaling/v2" && v2["spec"]["metrics"].as_array().map(Vec::len) == Some(2), "{v2}");
    ensure!(
        v2["metadata"].get("annotations").is_none_or(|a| a.get("autoscaling.alpha.kubernetes.io/metrics").is_none()),
        "{v2}"
    );

    // A v1 manifest: created, unchanged, configured — and visible as v2.
    let file = server.data_dir.join("hpa-v1.yaml");
    std::fs::write(&file, V1_HPA)?;
    let f = file.to_string_lossy().into_owned();
    let out = k(&["apply", "-f", &f])?;
    ensure!(out.ok && out.stdout.contains("horizontalpodautoscaler.autoscaling/api created"), "{out:?}");
    let out = k(&["apply", "-f", &f])?;
    ensure!(out.ok && out.stdout.contains("horizontalpodautoscaler.autoscaling/api unchanged"), "{out:?}");
    std::fs::write(&file, V1_HPA.replace("targetCPUUtilizationPercentage: 60", "targetCPUUtilizationPercentage: 75"))?;
    let out = k(&["apply", "-f", &f])?;
    ensure!(out.ok && out.stdout.contains("horizontalpodautoscaler.autoscaling/api configured"), "{out:?}");
    let out = k(&[
        "get",
        "hpa",
        "api",
        "-o",
        "jsonpath={.spec.metrics[0].resource.target.averageUtilization} {.spec.minReplicas}",
    ])?;
    ensure!(out.stdout == "75 2", "{out:?}");
    // Patching through v1 keeps the v2-only metrics (they travel in the annotation).
    let out = k(&[
        "patch",
        "horizontalpodautoscalers.v1.autoscaling",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"maxReplicas":7}}"#,
    ])?;
    ensure!(out.ok, "{out:?}");
    let out = k(&["get", "hpa", "web", "-o", "jsonpath={.spec.maxReplicas} {.spec.metrics[*].resource.name}"])?;
    ensure!(out.stdout == "7 memory cpu", "{out:?}");

    // Server-side apply of a v1 configuration (applied to the stored v2 object).
    let ssa = server.data_dir.join("hpa-ssa.yaml");
    let v1_ssa = V1_HPA.replace("name: api\n  namespace", "name: ssa\n  namespace");
    std::fs::write(&ssa, &v1_ssa)?;
    let sf = ssa.to_string_lossy().into_owned();
    let out = k(&["apply", "--server-side", "-f", &sf])?;
    ensure!(out.ok && out.stdout.contains("horizontalpodautoscaler.autoscaling/ssa serverside-applied"), "{out:?}");
    std::fs::write(&ssa, v1_ssa.replace("maxReplicas: 4", "maxReplicas: 9"))?;
    let out = k(&["apply", "--server-side", "-f", &sf])?;
    ensure!(out.ok, "{out:?}");
    let out = k(&[
        "get",
        "hpa",
        "ssa",
        "-o",
        "jsonpath={.spec.maxReplicas} {.spec.metrics[0].resource.target.averageUtilization}",
    ])?;
    ensure!(out.stdout == "9 60", "{out:?}");
    // Another manager changing the same field conflicts, as Kubernetes reports it.
    let out = k(&["apply", "--server-side", "--field-manager=other", "-f", &sf])?;
    ensure!(out.ok, "same value, no conflict: {out:?}");
    std::fs::write(&ssa, v1_ssa.replace("maxReplicas: 4", "maxReplicas: 3"))?;
    let out = k(&["apply", "--server-side", "--field-manager=other", "-f", &sf])?;
    ensure!(!out.ok && out.stderr.contains("conflict"), "{out:?}");
    let out = k(&["delete", "hpa", "ssa"])?;
    ensure!(out.ok, "{out:?}");

    // The table a real cluster prints (after the v1 round trip the cpu target comes last, as
    // in Kubernetes' conversion).
    let out = k(&["get", "hpa"])?;
    let lines: Vec<Vec<&str>> = out.stdout.lines().map(|l| l.split_whitespace().collect()).collect();
    ensure!(
        lines.first().is_some_and(|h| h == &["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"]),
        "{out:?}"
    );
    ensure!(
        out.stdout.lines().any(|l| l.starts_with("web")
            && l.contains("Deployment/web")
            && l.contains("memory: <unknown>/100Mi, cpu: <unknown>/50%")),
        "{out:?}"
    );
    ensure!(
        out.stdout.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()[..5]
            == ["api", "Deployment/api", "cpu:", "<unknown>/75%", "2"]),
        "{out:?}"
    );

    // explain reads the v1 schema from /openapi/v3.
    let out = k(&["explain", "hpa.spec.targetCPUUtilizationPercentage", "--api-version=autoscaling/v1"])?;
    ensure!(
        out.ok && out.stdout.contains("targetCPUUtilizationPercentage") && out.stdout.contains("integer"),
        "{out:?}"
    );

    // A v1 watch sees v1 objects.
    let w = raw(
        server.port,
        "GET",
        "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers?watch=true&timeoutSeconds=1",
        None,
        b"",
    )?;
    let events = w.lines();
    ensure!(events.len() == 2 && events.iter().all(|e| e["object"]["apiVersion"] == "autoscaling/v1"), "{events:?}");

    // Delete through v1; gone in v2 too.
    let out = k(&["delete", "horizontalpodautoscalers.v1.autoscaling", "api"])?;
    ensure!(out.ok && out.stdout.contains("deleted"), "{out:?}");
    let out = k(&["get", "hpa", "-o", "name"])?;
    ensure!(out.stdout.trim() == "horizontalpodautoscaler.autoscaling/web", "{out:?}");
    Ok(())
}
