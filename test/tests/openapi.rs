//! `/openapi/v2` and `/openapi/v3`: the documents kubectl downloads for validation, patch
//! computation and `kubectl explain`.

use anyhow::{ensure, Result};
use e2e::{official_kubectls, raw, ApiServer};

#[test]
fn v2_and_v3_documents_describe_every_served_kind() -> Result<()> {
    let server = ApiServer::start()?;
    let v2 = raw(server.port, "GET", "/openapi/v2", None, b"")?;
    ensure!(v2.status == 200 && v2.header("content-type") == Some("application/json"), "{:?}", v2.headers);
    let doc = v2.json();
    ensure!(doc["swagger"] == "2.0", "not swagger 2.0");
    let pod = &doc["definitions"]["io.k8s.api.core.v1.Pod"];
    ensure!(pod["x-kubernetes-group-version-kind"][0]["kind"] == "Pod", "{}", pod["x-kubernetes-group-version-kind"]);
    let containers = &doc["definitions"]["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
    ensure!(containers["x-kubernetes-patch-merge-key"] == "name", "{containers}");
    ensure!(containers["x-kubernetes-patch-strategy"] == "merge", "{containers}");
    let patch = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
    ensure!(patch["x-kubernetes-group-version-kind"]["kind"] == "Deployment", "{patch}");

    // The v3 discovery document points at one document per group/version.
    let root = raw(server.port, "GET", "/openapi/v3", None, b"")?.json();
    let url = root["paths"]["apis/apps/v1"]["serverRelativeURL"].as_str().unwrap_or_default().to_string();
    ensure!(url.starts_with("/openapi/v3/apis/apps/v1?hash="), "{root}");
    let gv = raw(server.port, "GET", &url, None, b"")?;
    ensure!(gv.status == 200, "{}", gv.status);
    let etag = gv.header("etag").unwrap_or_default().to_string();
    ensure!(!etag.is_empty(), "no ETag");
    let apps = gv.json();
    ensure!(apps["openapi"] == "3.0.0", "not OpenAPI 3");
    let patch = &apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
    let params: Vec<&str> =
        patch["parameters"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
    ensure!(params.contains(&"fieldValidation") && params.contains(&"fieldManager"), "{params:?}");
    ensure!(patch["requestBody"]["content"]["application/strategic-merge-patch+json"].is_object(), "{patch}");
    let schemas = apps["components"]["schemas"].as_object().cloned().unwrap_or_default();
    ensure!(schemas.contains_key("io.k8s.api.apps.v1.Deployment"), "no Deployment schema");
    ensure!(schemas.contains_key("io.k8s.api.core.v1.PodSpec"), "no PodSpec schema");
    for gv in ["api/v1", "apis/batch/v1", "apis/networking.k8s.io/v1", "apis/rbac.authorization.k8s.io/v1"] {
        ensure!(root["paths"][gv]["serverRelativeURL"].is_string(), "{gv} missing from /openapi/v3");
    }
    let missing = raw(server.port, "GET", "/openapi/v3/apis/nope/v1", None, b"")?;
    ensure!(missing.status == 404, "{}", missing.status);
    Ok(())
}

/// Enum-typed fields carry their values as kube-apiserver's documents do, and the official
/// kubectl shows them (`ENUM:` under the field, `enum:` in field lists).
#[test]
fn enum_typed_fields_reach_kubectl_explain() -> Result<()> {
    let server = ApiServer::start()?;
    let core = raw(server.port, "GET", "/openapi/v3/api/v1", None, b"")?.json();
    let restart = &core["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"]["restartPolicy"];
    ensure!(restart["enum"] == serde_json::json!(["Always", "Never", "OnFailure"]), "{restart}");
    let v2 = raw(server.port, "GET", "/openapi/v2", None, b"")?.json();
    let pull = &v2["definitions"]["io.k8s.api.core.v1.Container"]["properties"]["imagePullPolicy"];
    ensure!(pull["enum"] == serde_json::json!(["Always", "IfNotPresent", "Never"]), "{pull}");
    let out = server.kubectl(&["explain", "pod.spec.restartPolicy"])?;
    ensure!(out.ok, "{out:?}");
    ensure!(
        out.stdout.contains("FIELD: restartPolicy <string>\nENUM:\n    Always\n    Never\n    OnFailure\n"),
        "{}",
        out.stdout
    );
    ensure!(out.stdout.contains("Possible enum values:\n     - `\"Always\"`"), "{}", out.stdout);
    let out = server.kubectl(&["explain", "service.spec"])?;
    ensure!(
        out.stdout.contains("  type\t<string>\n  enum: ClusterIP, ExternalName, LoadBalancer, NodePort\n"),
        "{}",
        out.stdout
    );
    Ok(())
}

#[test]
fn documents_are_cached_by_etag() -> Result<()> {
    let server = ApiServer::start()?;
    let first = raw(server.port, "GET", "/openapi/v3/api/v1", None, b"")?;
    let etag = first.header("etag").unwrap_or_default().to_string();
    let again = e2e_get_if_none_match(server.port, "/openapi/v3/api/v1", &etag)?;
    ensure!(again == 304, "If-None-Match with the current ETag: {again}");
    let other = e2e_get_if_none_match(server.port, "/openapi/v3/api/v1", "\"stale\"")?;
    ensure!(other == 200, "{other}");
    Ok(())
}

fn e2e_get_if_none_match(port: u16, path: &str, etag: &str) -> Result<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nIf-None-Match: {etag}\r\n\r\n")?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let head = String::from_utf8_lossy(&buf[..buf.len().min(64)]).into_owned();
    Ok(head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0))
}

#[test]
fn v2_protobuf_form_is_served_to_client_go() -> Result<()> {
    use std::io::{Read, Write};
    let server = ApiServer::start()?;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port))?;
    write!(
        s,
        "GET /openapi/v2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAccept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    ensure!(text.starts_with("HTTP/1.1 200"), "{}", &text[..80.min(text.len())]);
    ensure!(
        text.to_ascii_lowercase().contains("content-type: application/com.github.proto-openapi.spec.v2.v1.0+protobuf"),
        "content type"
    );
    ensure!(text.contains("io.k8s.api.core.v1.Pod") && text.contains("x-kubernetes-group-version-kind"), "body");
    Ok(())
}

#[test]
fn kubectl_explain_works_with_every_version() -> Result<()> {
    let server = ApiServer::start()?;
    for (v, bin) in official_kubectls(&["1.27", "1.33"]) {
        let out = server.kubectl_bin(&bin, &["explain", "pod.spec.containers"])?;
        ensure!(out.ok, "kubectl {v} explain: {}", out.stderr);
        ensure!(out.stdout.contains("containers <[]Container>"), "kubectl {v}: {}", out.stdout);
        ensure!(out.stdout.contains("image") && out.stdout.contains("env"), "kubectl {v}: {}", out.stdout);
        let out = server.kubectl_bin(&bin, &["explain", "deployment.spec.strategy"])?;
        ensure!(out.ok && out.stdout.contains("rollingUpdate"), "kubectl {v}: {out:?}");
    }
    Ok(())
}

#[test]
fn kubectl_validation_is_strict_by_default() -> Result<()> {
    let server = ApiServer::start()?;
    let path = server.data_dir.join("bad.yaml");
    std::fs::write(&path, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bad\ndata:\n  a: b\nnotAField: 1\n")?;
    for (v, bin) in official_kubectls(&["1.27", "1.33"]) {
        let out = server.kubectl_bin(&bin, &["apply", "-f", &path.to_string_lossy()])?;
        ensure!(!out.ok, "kubectl {v} accepted an unknown field: {out:?}");
        ensure!(out.stderr.contains("notAField"), "kubectl {v}: {}", out.stderr);
    }
    Ok(())
}
