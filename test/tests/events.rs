//! Events for `kubectl describe`: listed by `involvedObject.*` field selectors, and expired
//! after `--event-ttl`.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use e2e::ApiServer;

fn event(name: &str, pod: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Event\nmetadata:\n  name: {name}\n  namespace: default\ninvolvedObject:\n  kind: Pod\n  name: {pod}\n  namespace: default\nreason: Scheduled\nmessage: hello {pod}\ntype: Normal\nsource:\n  component: test\n"
    )
}

#[test]
fn events_are_selected_by_involved_object_and_expire() -> Result<()> {
    let server = ApiServer::start_with(&["--event-ttl=3s"])?;
    for (n, p) in [("e1", "a"), ("e2", "b")] {
        let path = server.data_dir.join(format!("{n}.yaml"));
        std::fs::write(&path, event(n, p))?;
        let out = server.kubectl(&["create", "-f", &path.to_string_lossy()])?;
        ensure!(out.ok, "{out:?}");
    }
    let out = server.kubectl(&["get", "events", "--field-selector=involvedObject.name=a", "-o", "name"])?;
    ensure!(out.ok && out.stdout.trim() == "event/e1", "{out:?}");
    let out = server.kubectl(&[
        "get",
        "events",
        "--field-selector=involvedObject.kind=Pod,involvedObject.name!=a",
        "-o",
        "name",
    ])?;
    ensure!(out.ok && out.stdout.trim() == "event/e2", "{out:?}");
    // Expired after the TTL (the sweeper runs every second at this TTL).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = server.kubectl(&["get", "events", "-o", "name"])?;
        if out.ok && out.stdout.trim().is_empty() {
            break;
        }
        ensure!(Instant::now() < deadline, "events outlived --event-ttl=3s: {out:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}

#[test]
fn events_k8s_io_v1_is_a_view_of_core_events() -> Result<()> {
    let server = ApiServer::start()?;
    let body = br#"{"apiVersion":"events.k8s.io/v1","kind":"Event","metadata":{"name":"e1"},
        "eventTime":"2024-01-01T00:00:00.000000Z","reportingController":"test","reportingInstance":"i1",
        "action":"Started","reason":"Started","regarding":{"kind":"Pod","name":"p","namespace":"default"},
        "note":"hello","type":"Normal"}"#;
    let r = e2e::raw(
        server.port,
        "POST",
        "/apis/events.k8s.io/v1/namespaces/default/events",
        Some("application/json"),
        body,
    )?;
    ensure!(r.status == 201 && r.json()["note"] == "hello", "{} {}", r.status, r.text());
    // The core/v1 view of the same object.
    let core = e2e::raw(server.port, "GET", "/api/v1/namespaces/default/events/e1", None, b"")?.json();
    ensure!(core["message"] == "hello" && core["involvedObject"]["name"] == "p", "{core}");
    ensure!(core["reportingComponent"] == "test", "{core}");
    // Field selectors in the events.k8s.io vocabulary.
    let list =
        e2e::raw(server.port, "GET", "/apis/events.k8s.io/v1/events?fieldSelector=regarding.name%3Dp", None, b"")?;
    let list = list.json();
    ensure!(list["kind"] == "EventList" && list["items"][0]["regarding"]["name"] == "p", "{list}");
    let none =
        e2e::raw(server.port, "GET", "/apis/events.k8s.io/v1/events?fieldSelector=regarding.name%3Dq", None, b"")?
            .json();
    ensure!(none["items"].as_array().is_some_and(|a| a.is_empty()), "{none}");
    // A merge patch through the view lands in the stored Event.
    let r = e2e::raw(
        server.port,
        "PATCH",
        "/apis/events.k8s.io/v1/namespaces/default/events/e1",
        Some("application/merge-patch+json"),
        br#"{"note":"patched"}"#,
    )?;
    ensure!(r.status == 200 && r.json()["note"] == "patched", "{}", r.text());
    let core = e2e::raw(server.port, "GET", "/api/v1/namespaces/default/events/e1", None, b"")?.json();
    ensure!(core["message"] == "patched", "{core}");
    // kubectl prints the columns a real cluster prints.
    let out = server.kubectl(&["get", "events"])?;
    let header: Vec<&str> = out.stdout.lines().next().unwrap_or_default().split_whitespace().collect();
    ensure!(header == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], "{out:?}");
    ensure!(out.stdout.contains("pod/p") && out.stdout.contains("patched"), "{out:?}");
    let r = e2e::raw(server.port, "DELETE", "/apis/events.k8s.io/v1/namespaces/default/events/e1", None, b"")?;
    ensure!(r.status == 200, "{}", r.text());
    let gone = e2e::raw(server.port, "GET", "/api/v1/namespaces/default/events/e1", None, b"")?;
    ensure!(gone.status == 404, "{}", gone.status);
    Ok(())
}
