//! Watch: streaming, resume from a resourceVersion (also across an apiserver restart),
//! 410 Expired for compacted history, selectors, bookmarks, sendInitialEvents, and the kube
//! runtime watcher recovering from a 410, and bookmarks that follow writes to other resources.

use std::time::Duration;

use anyhow::{ensure, Result};
use e2e::{raw, ApiServer};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::{json, Value};

fn cm(name: &str, labels: Value) -> Result<ConfigMap> {
    Ok(serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "data": {"v": "0"}}))?)
}

fn types(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            format!(
                "{} {}",
                l["type"].as_str().unwrap_or_default(),
                l["object"]["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

fn rvs(lines: &[Value]) -> Vec<i64> {
    lines
        .iter()
        .filter_map(|l| l["object"]["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()))
        .collect()
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version_in_order() -> Result<()> {
    let server = ApiServer::start()?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "default");
    let a = cms.create(&PostParams::default(), &cm("a", json!({}))?).await?;
    let rv = a.resource_version().unwrap_or_default();
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "1"}}))).await?;
    cms.create(&PostParams::default(), &cm("b", json!({}))?).await?;
    cms.delete("a", &DeleteParams::default()).await?;
    let path = format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=1");
    let port = server.port;
    let r = tokio::task::spawn_blocking(move || raw(port, "GET", &path, None, b"")).await??;
    ensure!(r.status == 200, "{}", r.text());
    ensure!(r.header("transfer-encoding") == Some("chunked"), "{:?}", r.headers);
    let lines = r.lines();
    ensure!(types(&lines) == ["MODIFIED a", "ADDED b", "DELETED a"], "{:?}", types(&lines));
    let v = rvs(&lines);
    ensure!(v.windows(2).all(|w| w[0] < w[1]), "revisions not increasing: {v:?}");
    ensure!(v[0] > rv.parse::<i64>()?);
    // Watching everything from "now" (no resourceVersion) starts with the current state.
    let port = server.port;
    let r =
        tokio::task::spawn_blocking(move || raw(port, "GET", "/api/v1/configmaps?watch=1&timeoutSeconds=1", None, b""))
            .await??;
    ensure!(types(&r.lines()) == ["ADDED b"], "{:?}", types(&r.lines()));
    Ok(())
}

#[tokio::test]
async fn watch_resume_after_apiserver_restart_has_no_gap() -> Result<()> {
    let mut server = ApiServer::start()?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "default");
    let a = cms.create(&PostParams::default(), &cm("a", json!({}))?).await?;
    let rv = a.resource_version().unwrap_or_default();
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "1"}}))).await?;
    server.restart()?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "default");
    cms.create(&PostParams::default(), &cm("b", json!({}))?).await?;
    let port = server.port;
    let path = format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=1");
    let r = tokio::task::spawn_blocking(move || raw(port, "GET", &path, None, b"")).await??;
    let lines = r.lines();
    ensure!(types(&lines) == ["MODIFIED a", "ADDED b"], "{:?}", types(&lines));
    Ok(())
}

#[tokio::test]
async fn compacted_resource_version_is_a_410_error_event() -> Result<()> {
    let server = ApiServer::start_with(&["--etcd-compaction-interval", "500ms"])?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "default");
    let a = cms.create(&PostParams::default(), &cm("a", json!({}))?).await?;
    let old_rv: i64 = a.resource_version().unwrap_or_default().parse()?;
    for i in 0..5 {
        cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": i.to_string()}}))).await?;
    }
    tokio::time::sleep(Duration::from_millis(1600)).await;
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "x"}}))).await?;
    let port = server.port;
    let path = format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={old_rv}&timeoutSeconds=2");
    let r = tokio::task::spawn_blocking(move || raw(port, "GET", &path, None, b"")).await??;
    ensure!(r.status == 200, "{}", r.text());
    let lines = r.lines();
    ensure!(lines.len() == 1 && lines[0]["type"] == "ERROR", "{lines:?}");
    let st = &lines[0]["object"];
    ensure!(st["kind"] == "Status" && st["code"] == 410 && st["reason"] == "Expired", "{st}");
    ensure!(
        st["message"].as_str().unwrap_or_default().starts_with(&format!("too old resource version: {old_rv} (")),
        "{st}"
    );
    Ok(())
}

#[tokio::test]
async fn kube_runtime_watcher_recovers_from_410() -> Result<()> {
    let mut server = ApiServer::start_with(&["--etcd-compaction-interval", "500ms"])?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "default");
    for n in ["w1", "w2", "w3"] {
        cms.create(&PostParams::default(), &cm(n, json!({}))?).await?;
    }
    let (reader, writer) = kube::runtime::reflector::store::<ConfigMap>();
    // No backoff: this test decides when the stream is polled.
    let mut stream = Box::pin(kube::runtime::reflector(writer, watcher(cms.clone(), watcher::Config::default())));
    let names = |r: &kube::runtime::reflector::Store<ConfigMap>| {
        let mut v: Vec<String> = r.state().iter().map(|o| o.name_any()).collect();
        v.sort();
        v
    };
    while names(&reader) != ["w1", "w2", "w3"] {
        tokio::time::timeout(Duration::from_secs(10), stream.next()).await?;
    }
    // While the watcher is not polled, the apiserver restarts, history moves on and is
    // compacted past the watcher's resourceVersion.
    server.restart()?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "default");
    cms.create(&PostParams::default(), &cm("w4", json!({}))?).await?;
    cms.delete("w1", &DeleteParams::default()).await?;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    cms.create(&PostParams::default(), &cm("w5", json!({}))?).await?;
    let mut saw_410 = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while names(&reader) != ["w2", "w3", "w4", "w5"] {
        ensure!(tokio::time::Instant::now() < deadline, "watcher state {:?}", names(&reader));
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await? {
            Some(Err(e)) => {
                let text = format!("{e:?}");
                if text.contains("410") || text.contains("Expired") {
                    saw_410 = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(Ok(_)) => {}
            None => anyhow::bail!("watcher stream ended"),
        }
    }
    ensure!(saw_410, "the watcher never saw a 410 (state {:?})", names(&reader));
    Ok(())
}

#[tokio::test]
async fn selector_watch_sees_objects_leave_as_deleted() -> Result<()> {
    let server = ApiServer::start()?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "default");
    let a = cms.create(&PostParams::default(), &cm("a", json!({"app": "web"}))?).await?;
    let rv = a.resource_version().unwrap_or_default();
    cms.create(&PostParams::default(), &cm("other", json!({"app": "db"}))?).await?;
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}}))).await?;
    cms.patch("other", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}}))).await?;
    let port = server.port;
    let path = format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&labelSelector=app%3Dweb&timeoutSeconds=1");
    let r = tokio::task::spawn_blocking(move || raw(port, "GET", &path, None, b"")).await??;
    ensure!(types(&r.lines()) == ["DELETED a", "ADDED other"], "{:?}", types(&r.lines()));
    let path = format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}&fieldSelector=metadata.name%3Dother&timeoutSeconds=1");
    let r = tokio::task::spawn_blocking(move || raw(port, "GET", &path, None, b"")).await??;
    ensure!(types(&r.lines()) == ["ADDED other", "MODIFIED other"], "{:?}", types(&r.lines()));
    Ok(())
}

#[tokio::test]
async fn bookmarks_and_send_initial_events() -> Result<()> {
    let server = ApiServer::start()?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "default");
    cms.create(&PostParams::default(), &cm("a", json!({}))?).await?;
    cms.create(&PostParams::default(), &cm("b", json!({}))?).await?;
    let port = server.port;
    let path = "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1";
    let r = tokio::task::spawn_blocking(move || raw(port, "GET", path, None, b"")).await??;
    let lines = r.lines();
    ensure!(types(&lines)[..3] == ["ADDED a", "ADDED b", "BOOKMARK "], "{:?}", types(&lines));
    let bm = &lines[2]["object"];
    ensure!(bm["kind"] == "ConfigMap" && bm["apiVersion"] == "v1", "{bm}");
    ensure!(bm["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true", "{bm}");
    ensure!(bm["metadata"]["resourceVersion"].as_str().is_some());
    // The stream ends (timeout) with a bookmark carrying progress.
    ensure!(lines.last().map(|l| l["type"] == "BOOKMARK") == Some(true));
    // sendInitialEvents without bookmarks, or resourceVersionMatch without it, is refused.
    let r = tokio::task::spawn_blocking(move || {
        raw(
            port,
            "GET",
            "/api/v1/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
            None,
            b"",
        )
    })
    .await??;
    ensure!(r.status == 422 && r.json()["reason"] == "Invalid", "{}", r.text());
    let r = tokio::task::spawn_blocking(move || {
        raw(port, "GET", "/api/v1/configmaps?watch=true&resourceVersionMatch=Exact&resourceVersion=1", None, b"")
    })
    .await??;
    ensure!(r.status == 422, "{}", r.text());
    Ok(())
}

#[tokio::test]
async fn kube_watcher_with_streaming_lists() -> Result<()> {
    let server = ApiServer::start()?;
    let cms: Api<ConfigMap> = Api::namespaced(server.client()?, "default");
    cms.create(&PostParams::default(), &cm("s1", json!({}))?).await?;
    let mut stream = Box::pin(watcher(cms.clone(), watcher::Config::default().streaming_lists()));
    let mut seen_init_done = false;
    let mut names = Vec::new();
    while !seen_init_done {
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await? {
            Some(Ok(watcher::Event::InitApply(o))) => names.push(o.name_any()),
            Some(Ok(watcher::Event::InitDone)) => seen_init_done = true,
            Some(Ok(_)) => {}
            Some(Err(e)) => anyhow::bail!("streaming list failed: {e}"),
            None => anyhow::bail!("stream ended"),
        }
    }
    ensure!(names == ["s1"], "{names:?}");
    cms.create(&PostParams::default(), &cm("s2", json!({}))?).await?;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await? {
            Some(Ok(watcher::Event::Apply(o))) if o.name_any() == "s2" => break,
            Some(Ok(_)) => {}
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    Ok(())
}

/// A watch of a resource nobody writes still gets bookmarks with a fresh resourceVersion:
/// storage reports progress when other resources are written, as etcd's progress
/// notifications do for Kubernetes' watch cache. So a client resuming from its last bookmark
/// starts from a recent revision rather than one that may have been compacted.
#[tokio::test]
async fn bookmarks_follow_writes_to_other_resources() -> Result<()> {
    let server = ApiServer::start_with(&["--watch-bookmark-interval", "200ms"])?;
    let client = server.client()?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let wp = WatchParams { bookmarks: true, ..Default::default() }.timeout(60);
    // From "now": served by the pods' watch cache. From revision 1: older than the cache,
    // served by a storage watch of its own.
    let from_cache = pods.watch(&wp, "0").await?.boxed();
    let from_storage = pods.watch(&wp, "1").await?.boxed();
    let mut last_write = 0;
    for i in 0..5 {
        let c = cms.create(&PostParams::default(), &cm(&format!("bm{i}"), json!({}))?).await?;
        last_write = c.resource_version().unwrap_or_default().parse()?;
    }
    for (name, mut stream) in [("watch cache", from_cache), ("storage watch", from_storage)] {
        let mut seen = Vec::new();
        loop {
            let item = tokio::time::timeout(Duration::from_secs(30), stream.next()).await;
            let event = match item {
                Ok(Some(event)) => event?,
                Ok(None) => anyhow::bail!("{name}: the pod watch ended; bookmarks seen: {seen:?}"),
                Err(_) => anyhow::bail!(
                    "{name}: no bookmark at or after revision {last_write} within 30s; bookmarks seen: {seen:?}"
                ),
            };
            match event {
                WatchEvent::Bookmark(b) => {
                    let rv: i64 = b.metadata.resource_version.parse()?;
                    ensure!(seen.last().is_none_or(|&prev| prev <= rv), "{name}: bookmark went back: {seen:?}, {rv}");
                    seen.push(rv);
                    if rv >= last_write {
                        break;
                    }
                }
                other => anyhow::bail!("{name}: only bookmarks expected on a pod watch, got {other:?}"),
            }
        }
    }
    Ok(())
}
