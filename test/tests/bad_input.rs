//! Bad input gets the right Status, nothing is half stored, and the server keeps serving.

use anyhow::{ensure, Result};
use e2e::{raw, ApiServer, RawResponse};
use serde_json::json;

fn status(r: &RawResponse, code: u16, reason: &str) -> Result<()> {
    let s = r.json();
    ensure!(r.status == code, "expected {code}, got {}: {}", r.status, r.text());
    ensure!(s["kind"] == "Status" && s["apiVersion"] == "v1" && s["status"] == "Failure", "{s}");
    ensure!(s["code"] == code && s["reason"] == reason, "expected {reason}: {s}");
    ensure!(r.header("content-type").is_some_and(|c| c.starts_with("application/json")));
    Ok(())
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";
const JSON: Option<&str> = Some("application/json");

#[test]
fn bad_requests_get_the_right_status() -> Result<()> {
    let server = ApiServer::start()?;
    let p = server.port;
    // Malformed JSON and YAML → 400.
    status(&raw(p, "POST", CMS, JSON, b"{\"metadata\": {")?, 400, "BadRequest")?;
    status(&raw(p, "POST", CMS, Some("application/yaml"), b"metadata: [unclosed")?, 400, "BadRequest")?;
    status(&raw(p, "POST", CMS, JSON, b"")?, 400, "BadRequest")?;
    status(&raw(p, "POST", CMS, JSON, b"[1,2]")?, 400, "BadRequest")?;
    // A wrong shape (data must be a map of strings) → 400 with the field path.
    let r = raw(p, "POST", CMS, JSON, br#"{"metadata":{"name":"x"},"data":{"k":1}}"#)?;
    status(&r, 400, "BadRequest")?;
    ensure!(r.json()["message"].as_str().unwrap_or_default().contains("data"), "{}", r.text());
    // Kind or apiVersion not matching the URL → 400.
    status(
        &raw(p, "POST", CMS, JSON, br#"{"kind":"Secret","apiVersion":"v1","metadata":{"name":"x"}}"#)?,
        400,
        "BadRequest",
    )?;
    status(
        &raw(p, "POST", CMS, JSON, br#"{"kind":"ConfigMap","apiVersion":"apps/v1","metadata":{"name":"x"}}"#)?,
        400,
        "BadRequest",
    )?;
    // Namespace in the body differing from the URL → 400.
    status(&raw(p, "POST", CMS, JSON, br#"{"metadata":{"name":"x","namespace":"kube-system"}}"#)?, 400, "BadRequest")?;
    // Invalid and too long names → 422 with causes.
    let r = raw(p, "POST", CMS, JSON, br#"{"metadata":{"name":"Bad_Name"}}"#)?;
    status(&r, 422, "Invalid")?;
    ensure!(r.json()["details"]["causes"][0]["field"] == "metadata.name", "{}", r.text());
    let long = format!(r#"{{"metadata":{{"name":"{}"}}}}"#, "a".repeat(254));
    status(&raw(p, "POST", CMS, JSON, long.as_bytes())?, 422, "Invalid")?;
    let r = raw(
        p,
        "POST",
        "/api/v1/namespaces/default/services",
        JSON,
        br#"{"metadata":{"name":"1svc"},"spec":{"ports":[{"port":80}]}}"#,
    )?;
    status(&r, 422, "Invalid")?;
    let r = raw(
        p,
        "POST",
        "/api/v1/namespaces/default/pods",
        JSON,
        br#"{"metadata":{"name":"p"},"spec":{"containers":[]}}"#,
    )?;
    status(&r, 422, "Invalid")?;
    ensure!(r.json()["details"]["causes"][0]["field"] == "spec.containers", "{}", r.text());
    let r = raw(
        p,
        "POST",
        "/api/v1/namespaces/default/pods",
        JSON,
        br#"{"metadata":{"name":"p"},"spec":{"containers":[{"name":"a","image":"x"},{"name":"a","image":"y"}]}}"#,
    )?;
    status(&r, 422, "Invalid")?;
    ensure!(r.json()["details"]["causes"][0]["reason"] == "FieldValueDuplicate", "{}", r.text());
    // Unknown field: Strict → 400, default → accepted with a warning, the field dropped.
    let body = br#"{"metadata":{"name":"strict"},"bogus":1}"#;
    let r = raw(p, "POST", &format!("{CMS}?fieldValidation=Strict"), JSON, body)?;
    status(&r, 400, "BadRequest")?;
    ensure!(r.json()["message"].as_str().unwrap_or_default().contains("unknown field \"bogus\""), "{}", r.text());
    let r = raw(p, "POST", CMS, JSON, body)?;
    ensure!(r.status == 201, "{}", r.text());
    ensure!(r.header("warning").is_some_and(|w| w.contains("unknown field")), "{:?}", r.headers);
    ensure!(r.json().get("bogus").is_none());
    // Body over 3 MiB → 413.
    let big = format!(r#"{{"metadata":{{"name":"big"}},"data":{{"k":"{}"}}}}"#, "x".repeat(3 * 1024 * 1024 + 10));
    status(&raw(p, "POST", CMS, JSON, big.as_bytes())?, 413, "RequestEntityTooLarge")?;
    // Unsupported media types → 415.
    status(&raw(p, "POST", CMS, Some("text/plain"), br#"{"metadata":{"name":"t"}}"#)?, 415, "UnsupportedMediaType")?;
    status(&raw(p, "PATCH", &format!("{CMS}/strict"), Some("text/plain"), b"{}")?, 415, "UnsupportedMediaType")?;
    // Bad patches: undecodable → 400, not applicable → 422.
    status(
        &raw(p, "PATCH", &format!("{CMS}/strict"), Some("application/json-patch+json"), b"{nope")?,
        400,
        "BadRequest",
    )?;
    let r = raw(
        p,
        "PATCH",
        &format!("{CMS}/strict"),
        Some("application/json-patch+json"),
        br#"[{"op":"test","path":"/data/x","value":"y"}]"#,
    )?;
    ensure!(r.status == 422, "{}", r.text());
    // 404s: missing object, unknown resource, missing namespace, unknown path.
    status(&raw(p, "GET", &format!("{CMS}/nope"), None, b"")?, 404, "NotFound")?;
    status(&raw(p, "GET", "/api/v1/namespaces/default/widgets", None, b"")?, 404, "NotFound")?;
    status(&raw(p, "GET", "/apis/nope.example.com/v1", None, b"")?, 404, "NotFound")?;
    let r = raw(p, "POST", "/api/v1/namespaces/missing/configmaps", JSON, br#"{"metadata":{"name":"x"}}"#)?;
    status(&r, 404, "NotFound")?;
    ensure!(r.json()["message"] == "namespaces \"missing\" not found", "{}", r.text());
    // 405: a method a path does not take.
    status(
        &raw(p, "POST", &format!("{CMS}/strict"), JSON, br#"{"metadata":{"name":"strict"}}"#)?,
        405,
        "MethodNotAllowed",
    )?;
    status(&raw(p, "PUT", CMS, JSON, br#"{"metadata":{"name":"strict"}}"#)?, 405, "MethodNotAllowed")?;
    // 409: exists, stale update.
    status(&raw(p, "POST", CMS, JSON, br#"{"metadata":{"name":"strict"}}"#)?, 409, "AlreadyExists")?;
    status(
        &raw(p, "PUT", &format!("{CMS}/strict"), JSON, br#"{"metadata":{"name":"strict","resourceVersion":"1"}}"#)?,
        409,
        "Conflict",
    )?;
    // PUT whose name differs from the URL → 400.
    status(&raw(p, "PUT", &format!("{CMS}/strict"), JSON, br#"{"metadata":{"name":"other"}}"#)?, 400, "BadRequest")?;
    // Nothing that failed was stored: exactly one configmap (the accepted one) exists.
    let list = raw(p, "GET", CMS, None, b"")?.json();
    let names: Vec<&str> =
        list["items"].as_array().into_iter().flatten().filter_map(|i| i["metadata"]["name"].as_str()).collect();
    ensure!(names == ["strict"], "{names:?}");
    // Still serving.
    ensure!(raw(p, "GET", "/healthz", None, b"")?.status == 200);
    Ok(())
}

#[test]
fn dry_run_stores_nothing_and_generate_name_works() -> Result<()> {
    let server = ApiServer::start()?;
    let p = server.port;
    let r = raw(p, "POST", &format!("{CMS}?dryRun=All"), JSON, br#"{"metadata":{"name":"dry"}}"#)?;
    ensure!(r.status == 201 && r.json()["metadata"]["uid"].is_string(), "{}", r.text());
    ensure!(raw(p, "GET", &format!("{CMS}/dry"), None, b"")?.status == 404);
    let r = raw(p, "POST", CMS, JSON, br#"{"metadata":{"generateName":"gen-"}}"#)?;
    let name = r.json()["metadata"]["name"].as_str().unwrap_or_default().to_string();
    ensure!(r.status == 201 && name.starts_with("gen-") && name.len() == 9, "{}", r.text());
    // A delete with a wrong uid precondition is a 409 and deletes nothing.
    let body = serde_json::to_vec(&json!({"preconditions": {"uid": "not-it"}}))?;
    status(&raw(p, "DELETE", &format!("{CMS}/{name}"), JSON, &body)?, 409, "Conflict")?;
    ensure!(raw(p, "GET", &format!("{CMS}/{name}"), None, b"")?.status == 200);
    Ok(())
}

#[test]
fn discovery_health_version_and_metrics() -> Result<()> {
    let server = ApiServer::start()?;
    let p = server.port;
    let api = raw(p, "GET", "/api", None, b"")?.json();
    ensure!(api["kind"] == "APIVersions" && api["versions"] == json!(["v1"]), "{api}");
    let v1 = raw(p, "GET", "/api/v1", None, b"")?.json();
    let pods =
        v1["resources"].as_array().into_iter().flatten().find(|r| r["name"] == "pods").cloned().unwrap_or_default();
    ensure!(
        pods["namespaced"] == true && pods["shortNames"] == json!(["po"]) && pods["categories"] == json!(["all"]),
        "{pods}"
    );
    let groups = raw(p, "GET", "/apis", None, b"")?.json();
    for g in [
        "apps",
        "batch",
        "autoscaling",
        "networking.k8s.io",
        "rbac.authorization.k8s.io",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "storage.k8s.io",
        "scheduling.k8s.io",
    ] {
        ensure!(groups["groups"].as_array().into_iter().flatten().any(|x| x["name"] == g), "{g} missing");
    }
    let apps = raw(p, "GET", "/apis/apps/v1", None, b"")?.json();
    ensure!(apps["resources"].as_array().into_iter().flatten().any(|r| r["name"] == "deployments/scale"), "{apps}");
    for path in ["/healthz", "/livez", "/readyz"] {
        ensure!(raw(p, "GET", path, None, b"")?.status == 200, "{path}");
    }
    ensure!(raw(p, "GET", "/version", None, b"")?.json()["major"] == "1");
    raw(p, "GET", "/api/v1/namespaces/default/pods", None, b"")?;
    let m = raw(p, "GET", "/metrics", None, b"")?.text();
    ensure!(m.contains("apiserver_request_total{") && m.contains("resource=\"pods\""), "{m}");
    ensure!(m.contains("apiserver_request_duration_seconds_bucket"));
    ensure!(m.contains("apiserver_storage_request_duration_seconds"));
    Ok(())
}

#[test]
fn too_many_inflight_requests_is_429() -> Result<()> {
    // One mutating slot: concurrent writes beyond it are refused with 429 + Retry-After.
    let server = ApiServer::start_with(&["--max-mutating-requests-inflight", "1"])?;
    let p = server.port;
    let handles: Vec<_> = (0..32)
        .map(|i| {
            std::thread::spawn(move || {
                let body = format!(r#"{{"metadata":{{"name":"c{i}"}},"data":{{"k":"{}"}}}}"#, "x".repeat(200_000));
                raw(p, "POST", CMS, JSON, body.as_bytes())
            })
        })
        .collect();
    let mut codes = Vec::new();
    for h in handles {
        let r = h.join().map_err(|_| anyhow::anyhow!("thread panicked"))??;
        if r.status == 429 {
            status(&r, 429, "TooManyRequests")?;
            ensure!(r.header("retry-after").is_some());
        }
        codes.push(r.status);
    }
    ensure!(codes.iter().all(|c| *c == 201 || *c == 429), "{codes:?}");
    ensure!(codes.contains(&201));
    ensure!(codes.contains(&429), "no request was refused: {codes:?}");
    eprintln!("429s: {} of 32", codes.iter().filter(|c| **c == 429).count());
    Ok(())
}
