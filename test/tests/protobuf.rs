//! `application/vnd.kubernetes.protobuf` request bodies: kubectl ≥ 1.31 sends them for the
//! built-in kinds in `create namespace|configmap|secret|deployment`, `run` and `expose`.

use anyhow::{ensure, Context, Result};
use e2e::{official_kubectls, ApiServer};
use serde_json::Value;

#[test]
fn kubectl_create_commands_send_protobuf_and_store_the_objects() -> Result<()> {
    let server = ApiServer::start()?;
    for (v, bin) in official_kubectls(&["1.33"]) {
        let k = |args: &[&str]| server.kubectl_bin(&bin, args);
        let out = k(&["create", "namespace", "pb", "-v=8"])?;
        ensure!(out.ok, "kubectl {v}: {}", out.stderr);
        ensure!(
            out.stderr.contains("Content-Type: application/vnd.kubernetes.protobuf"),
            "kubectl {v} did not send protobuf; the test proves nothing"
        );
        for args in [
            vec!["create", "configmap", "cm", "-n", "pb", "--from-literal=greeting=hello", "--from-literal=empty="],
            vec!["create", "secret", "generic", "s", "-n", "pb", "--from-literal=password=s3cr3t"],
            vec!["create", "deployment", "web", "-n", "pb", "--image=busybox", "--replicas=2", "--port=8080"],
            vec!["run", "p", "-n", "pb", "--image=busybox", "--labels=app=p", "--env=A=1", "--", "sleep", "3600"],
            vec!["expose", "deployment", "web", "-n", "pb", "--port=80", "--target-port=8080"],
        ] {
            let out = k(&args)?;
            ensure!(out.ok, "kubectl {v} {args:?}: {}", out.stderr);
        }
        let get = |what: &[&str]| -> Result<Value> {
            let mut args = vec!["get", "-n", "pb", "-o", "json"];
            args.extend_from_slice(what);
            let out = k(&args)?;
            ensure!(out.ok, "{out:?}");
            serde_json::from_str(&out.stdout).context("kubectl get -o json")
        };
        let ns = get(&["namespace", "pb"])?;
        ensure!(ns["status"]["phase"] == "Active", "{ns}");
        let cm = get(&["configmap", "cm"])?;
        ensure!(cm["data"]["greeting"] == "hello" && cm["data"]["empty"] == "", "{cm}");
        let s = get(&["secret", "s"])?;
        ensure!(s["data"]["password"] == "czNjcjN0" && s["type"] == "Opaque", "{s}");
        let d = get(&["deployment", "web"])?;
        ensure!(d["spec"]["replicas"] == 2, "{d}");
        ensure!(d["spec"]["selector"]["matchLabels"]["app"] == "web", "{d}");
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        ensure!(c["image"] == "busybox" && c["ports"][0]["containerPort"] == 8080, "{c}");
        ensure!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == "25%", "{d}");
        ensure!(d["metadata"]["creationTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{d}");
        let p = get(&["pod", "p"])?;
        let c = &p["spec"]["containers"][0];
        ensure!(c["args"] == serde_json::json!(["sleep", "3600"]), "{c}");
        ensure!(c["env"] == serde_json::json!([{"name": "A", "value": "1"}]), "{c}");
        ensure!(p["metadata"]["labels"]["app"] == "p", "{p}");
        let svc = get(&["service", "web"])?;
        ensure!(svc["spec"]["ports"][0]["port"] == 80 && svc["spec"]["ports"][0]["targetPort"] == 8080, "{svc}");
        ensure!(svc["spec"]["selector"]["app"] == "web", "{svc}");
        // Deleting with kubectl (DeleteOptions) works too.
        let out = k(&["delete", "namespace", "pb", "--wait=false"])?;
        ensure!(out.ok, "{out:?}");
    }
    Ok(())
}

#[test]
fn malformed_protobuf_is_a_400() -> Result<()> {
    let server = ApiServer::start()?;
    for body in [&b"k8s\0\x0a\xff\xff"[..], b"{}", b"k8s\0"] {
        let r = e2e::raw(
            server.port,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            Some("application/vnd.kubernetes.protobuf"),
            body,
        )?;
        ensure!(r.status == 400, "{body:?}: {} {}", r.status, r.text());
        ensure!(r.json()["kind"] == "Status", "{}", r.text());
    }
    Ok(())
}
