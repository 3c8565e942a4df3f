//! `kubectl logs`: the apiserver proxies `pods/log` to the kubelet of the pod's node (the
//! Node's InternalIP and `daemonEndpoints.kubeletEndpoint.Port`). The kubelet side here is a
//! small HTTPS server standing in for `/containerLogs` (the real kubelet needs Docker; its
//! own tests cover that endpoint); it records the path and query it was asked for.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use anyhow::{ensure, Result};
use e2e::{official_kubectls, ApiServer};

/// Serve `/containerLogs/...` over TLS (a self-signed certificate, as a kubelet's own) on
/// a free port; returns the port and the requested paths.
fn fake_kubelet() -> Result<(u16, Arc<Mutex<Vec<String>>>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()])?;
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![key.cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into()),
            )?,
    );
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let Ok(session) = rustls::ServerConnection::new(config.clone()) else { continue };
            let mut conn = rustls::StreamOwned::new(session, tcp);
            let mut reader = BufReader::new(&mut conn);
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let path = line.split_whitespace().nth(1).unwrap_or_default().to_string();
            if let Ok(mut s) = seen2.lock() {
                s.push(path.clone());
            }
            let resp = if path == "/healthz" {
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nok".to_string()
            } else if path.starts_with("/containerLogs/default/web/app") {
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nline one\nline two\n".to_string()
            } else {
                "HTTP/1.0 404 Not Found\r\n\r\ncontainer not found".to_string()
            };
            let _ = conn.write_all(resp.as_bytes());
            conn.conn.send_close_notify();
            let _ = conn.flush();
        }
    });
    Ok((port, seen))
}

#[test]
fn kubectl_logs_is_proxied_to_the_kubelet() -> Result<()> {
    let (port, seen) = fake_kubelet()?;
    let server = ApiServer::start()?;
    let node = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\nstatus:\n  addresses:\n  - type: InternalIP\n    address: 127.0.0.1\n  daemonEndpoints:\n    kubeletEndpoint:\n      Port: {port}\n"
    );
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  nodeName: n1\n  containers:\n  - name: app\n    image: busybox\n  - name: side\n    image: busybox\n";
    let unscheduled = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: pending\nspec:\n  containers:\n  - name: app\n    image: busybox\n";
    for (name, text) in [("node.yaml", node.as_str()), ("pod.yaml", pod), ("pending.yaml", unscheduled)] {
        let p = server.data_dir.join(name);
        std::fs::write(&p, text)?;
        let out = server.kubectl(&["create", "-f", &p.to_string_lossy()])?;
        ensure!(out.ok, "{name}: {}", out.stderr);
    }
    // The server asks for a container when the pod has several.
    let r = e2e::raw(server.port, "GET", "/api/v1/namespaces/default/pods/web/log", None, b"")?;
    ensure!(r.status == 400, "{} {}", r.status, r.text());
    ensure!(
        r.json()["message"] == "a container name must be specified for pod web, choose one of: [app side]",
        "{}",
        r.text()
    );
    // nodes/proxy reaches the kubelet too.
    let out = server.kubectl(&["get", "--raw", "/api/v1/nodes/n1/proxy/healthz"])?;
    ensure!(out.ok && out.stdout == "ok", "{out:?}");
    for (v, bin) in official_kubectls(&["1.33", "1.27"]) {
        let out = server.kubectl_bin(&bin, &["logs", "web", "-c", "app", "--tail=5", "--timestamps"])?;
        ensure!(out.ok, "kubectl {v} logs: {}", out.stderr);
        ensure!(out.stdout == "line one\nline two\n", "kubectl {v}: {:?}", out.stdout);
        let last = seen.lock().map(|s| s.last().cloned().unwrap_or_default()).unwrap_or_default();
        ensure!(last.starts_with("/containerLogs/default/web/app?"), "{last}");
        ensure!(last.contains("tailLines=5") && last.contains("timestamps=true"), "{last}");
        // Errors as Kubernetes words them.
        // kubectl picks the first container itself when there are several.
        let out = server.kubectl_bin(&bin, &["logs", "web"])?;
        ensure!(out.ok && out.stdout == "line one\nline two\n", "kubectl {v}: {out:?}");
        let out = server.kubectl_bin(&bin, &["logs", "pending"])?;
        ensure!(!out.ok && out.stderr.contains("does not have a host assigned"), "kubectl {v}: {out:?}");
        let out = server.kubectl_bin(&bin, &["logs", "web", "-c", "nope"])?;
        ensure!(!out.ok && out.stderr.contains("container nope is not valid for pod web"), "kubectl {v}: {out:?}");
    }
    Ok(())
}
