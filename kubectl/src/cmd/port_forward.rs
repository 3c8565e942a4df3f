//! `kubectl port-forward TYPE/NAME [LOCAL_PORT:]REMOTE_PORT…` (`pod/`, `svc/`, `deploy/`, any
//! workload with a selector, or a bare pod name), `--address` (default `localhost`: 127.0.0.1
//! and ::1).
//!
//! Every accepted local connection opens one `pods/portforward` WebSocket (kube's
//! `v4.channel.k8s.io` client) for its port, so an error on one connection — say nothing
//! listens on the remote port — is reported and the forwarder keeps serving others.
//! Resolving the pod and the remote port (a Service's port → its target port, named container
//! ports) is pure and unit-tested.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::client::{with_query, Ctx};
use crate::error::{KubectlError, Result};

/// Forward one or more local ports to a pod.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// TYPE/NAME (or a pod name), then [LOCAL_PORT:]REMOTE_PORT pairs.
    pub args: Vec<String>,
    /// Addresses to listen on (comma separated). Only accepts IP addresses or localhost as a value.
    #[arg(long, value_delimiter = ',', default_value = "localhost")]
    pub address: Vec<String>,
    /// The length of time (like 5s, 2m, or 3h) to wait until at least one pod is running.
    #[arg(long = "pod-running-timeout", default_value = "1m")]
    pub pod_running_timeout: String,
}

/// One `[LOCAL:]REMOTE` argument; `remote` may be a port name until resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// None: the same as the (resolved) remote port. Some(0): any free port.
    pub local: Option<u16>,
    pub remote: String,
}

/// Parse `8080:80`, `:80`, `0:80`, `80`, `8080:http`.
pub fn parse_port_spec(s: &str) -> Result<PortSpec> {
    let bad = || KubectlError::msg(format!("Error parsing local port '{s}'"));
    let (local, remote) = match s.split_once(':') {
        Some(("", r)) => (Some(0), r),
        Some((l, r)) => (Some(l.parse::<u16>().map_err(|_| bad())?), r),
        None => (None, s),
    };
    if remote.is_empty() {
        return Err(KubectlError::msg(format!("Error parsing remote port '{s}'")));
    }
    if let Ok(n) = remote.parse::<u32>() {
        if n == 0 || n > 65535 {
            return Err(KubectlError::msg(format!("Error parsing remote port '{remote}': port must be 1-65535")));
        }
    }
    Ok(PortSpec { local, remote: remote.to_string() })
}

/// The addresses to listen on: `localhost` means 127.0.0.1 and ::1.
pub fn listen_addresses(addresses: &[String]) -> Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    for a in addresses.iter().map(|a| a.trim()).filter(|a| !a.is_empty()) {
        if a == "localhost" {
            out.extend([IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)]);
        } else {
            out.push(a.parse().map_err(|_| KubectlError::msg(format!("{a} is not a valid IP")))?);
        }
    }
    if out.is_empty() {
        return Err(KubectlError::msg("at least one address must be specified"));
    }
    out.dedup();
    Ok(out)
}

/// A container port of `pod` by name.
pub fn pod_named_port(pod: &Value, name: &str) -> Option<u16> {
    pod.pointer("/spec/containers")?.as_array()?.iter().find_map(|c| {
        c.get("ports")?.as_array()?.iter().find_map(|p| {
            (p.get("name")?.as_str()? == name).then(|| p.get("containerPort")?.as_u64()).flatten().map(|n| n as u16)
        })
    })
}

/// A remote port of a pod: a number, or a container port's name.
pub fn pod_port(pod: &Value, remote: &str) -> Result<u16> {
    if let Ok(n) = remote.parse::<u16>() {
        return Ok(n);
    }
    let pod_name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    pod_named_port(pod, remote)
        .ok_or_else(|| KubectlError::msg(format!("Pod '{pod_name}' does not have a named port '{remote}'")))
}

/// A Service port (number or name) → the pod port it targets (kubectl's
/// `translateServicePortToTargetPort`).
pub fn service_target_port(svc: &Value, pod: &Value, remote: &str) -> Result<u16> {
    let svc_name = svc.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let ports = svc.pointer("/spec/ports").and_then(Value::as_array).cloned().unwrap_or_default();
    let port = ports.iter().find(|p| {
        p.get("port").and_then(Value::as_u64).map(|n| n.to_string()).as_deref() == Some(remote)
            || p.get("name").and_then(Value::as_str) == Some(remote)
    });
    let Some(port) = port else {
        return Err(KubectlError::msg(format!("Service {svc_name} does not have a service port {remote}")));
    };
    match port.get("targetPort") {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as u16).ok_or_else(|| KubectlError::msg("invalid targetPort")),
        Some(Value::String(name)) => match name.parse::<u16>() {
            Ok(n) => Ok(n),
            Err(_) => pod_port(pod, name),
        },
        _ => {
            port.get("port").and_then(Value::as_u64).map(|n| n as u16).ok_or_else(|| KubectlError::msg("invalid port"))
        }
    }
}

/// How a forward line is printed: `127.0.0.1:8080`, `[::1]:8080`.
pub fn forwarding_line(addr: &SocketAddr, remote: u16) -> String {
    format!("Forwarding from {addr} -> {remote}")
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let Some(target) = a.args.first() else {
        return Err(KubectlError::msg("TYPE/NAME and list of ports are required for port-forward"));
    };
    let specs: Vec<PortSpec> = a.args[1..].iter().map(|s| parse_port_spec(s)).collect::<Result<_>>()?;
    if specs.is_empty() {
        return Err(KubectlError::msg("TYPE/NAME and list of ports are required for port-forward"));
    }
    let addresses = listen_addresses(&a.address)?;
    let timeout = super::delete::parse_duration(&a.pod_running_timeout)?;
    let ns = ctx.namespace.clone();

    // The pod, and how a requested remote port maps onto it.
    let (kind, name) = match target.split_once('/') {
        None => ("pods".to_string(), target.clone()),
        Some((t, n)) => (ctx.resolve(t).await?.plural, n.to_string()),
    };
    let deadline = Instant::now() + timeout;
    let (pod, svc) = loop {
        let (pod, svc) = find_pod(ctx, &ns, &kind, &name).await?;
        let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or("Unknown").to_string();
        if phase == "Running" {
            break (pod, svc);
        }
        if Instant::now() >= deadline || kind == "pods" {
            return Err(KubectlError::msg(format!(
                "unable to forward port because pod is not running. Current status={phase}"
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let pod_name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let mut ports = Vec::new();
    for s in &specs {
        let remote = match &svc {
            Some(svc) => service_target_port(svc, &pod, &s.remote)?,
            None => pod_port(&pod, &s.remote)?,
        };
        // A bare remote port listens on the same local number (the service's port for svc/).
        let local = s.local.unwrap_or_else(|| s.remote.parse().unwrap_or(remote));
        ports.push((local, remote));
    }

    let api: kube::Api<Pod> = kube::Api::namespaced(ctx.client.clone(), &ns);
    let mut listeners = Vec::new();
    for (local, remote) in ports {
        let mut local = local;
        let mut bound_any = false;
        let mut errors = Vec::new();
        for ip in &addresses {
            match TcpListener::bind(SocketAddr::new(*ip, local)).await {
                Ok(l) => {
                    let addr = match l.local_addr() {
                        Ok(a) => a,
                        Err(e) => return Err(KubectlError::msg(format!("unable to create listener: Error {e}"))),
                    };
                    // Port 0 becomes the port the first listener got, for every address.
                    local = addr.port();
                    println!("{}", forwarding_line(&addr, remote));
                    listeners.push((l, local, remote));
                    bound_any = true;
                }
                Err(e) => errors.push(format!("unable to create listener: Error listen tcp {ip}:{local}: {e}")),
            }
        }
        if !bound_any {
            return Err(KubectlError::msg(format!(
                "Listeners failed to create with the following errors: [{}]",
                errors.join(" ")
            )));
        }
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();

    let mut tasks = tokio::task::JoinSet::new();
    for (listener, local, remote) in listeners {
        let api = api.clone();
        let pod_name = pod_name.clone();
        tasks.spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else { break };
                println!("Handling connection for {local}");
                let _ = std::io::stdout().flush();
                let api = api.clone();
                let pod_name = pod_name.clone();
                tokio::spawn(async move {
                    if let Err(e) = forward_connection(&api, &pod_name, conn, remote).await {
                        eprintln!("error: an error occurred forwarding {local} -> {remote}: {e}");
                    }
                });
            }
        });
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { while tasks.join_next().await.is_some() {} } => {}
    }
    Ok(())
}

/// The pod to forward to, and the Service when the target is one.
async fn find_pod(ctx: &Ctx, ns: &str, kind: &str, name: &str) -> Result<(Value, Option<Value>)> {
    if kind == "pods" {
        return Ok((ctx.get(&format!("/api/v1/namespaces/{ns}/pods/{name}")).await?, None));
    }
    let res = ctx.resolve(kind).await?;
    let obj = ctx.get(&res.object_path(Some(ns), name)).await?;
    let sel = if kind == "services" {
        let m = obj.pointer("/spec/selector").and_then(Value::as_object);
        let mut kv: Vec<String> =
            m.into_iter().flatten().filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}"))).collect();
        kv.sort();
        (!kv.is_empty()).then(|| kv.join(","))
    } else {
        super::logs::pod_selector(&obj)
    };
    let Some(sel) = sel else {
        return Err(KubectlError::msg(format!("cannot attach to {kind}/{name}: selector is empty")));
    };
    let pods = ctx.get(&with_query(&format!("/api/v1/namespaces/{ns}/pods"), &[("labelSelector", sel)])).await?;
    let items = pods.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    let pod = super::logs::pick_pod(&items)
        .cloned()
        .ok_or_else(|| KubectlError::msg(format!("no pods found for {kind}/{name}")))?;
    Ok((pod, (kind == "services").then_some(obj)))
}

/// One local connection ↔ one port-forward WebSocket.
async fn forward_connection(
    api: &kube::Api<Pod>,
    pod: &str,
    mut conn: tokio::net::TcpStream,
    remote: u16,
) -> Result<()> {
    let mut pf = api.portforward(pod, &[remote]).await.map_err(|e| KubectlError::msg(e.to_string()))?;
    let mut upstream = pf.take_stream(remote).ok_or_else(|| KubectlError::msg("no stream for the port"))?;
    let error = pf.take_error(remote);
    let copy = tokio::io::copy_bidirectional(&mut conn, &mut upstream);
    let err = async {
        match error {
            Some(e) => e.await,
            None => std::future::pending().await,
        }
    };
    // Fused: the select below may see the error channel end without a message (the branch
    // is then disabled), and the later wait must not poll the finished future again.
    let mut err = std::pin::pin!(futures::FutureExt::fuse(err));
    let copied = tokio::select! {
        r = copy => r,
        Some(msg) = &mut err => return Err(KubectlError::msg(msg)),
    };
    drop(upstream);
    // The kubelet closes the data stream right after writing the error (a refused port), so
    // the copy can finish first: the error, if one comes, is what the user needs to see.
    if !futures::future::FusedFuture::is_terminated(&err) {
        if let Ok(Some(msg)) = tokio::time::timeout(std::time::Duration::from_secs(1), &mut err).await {
            return Err(KubectlError::msg(msg));
        }
    }
    copied.map_err(|e| KubectlError::msg(e.to_string()))?;
    let _ = pf.join().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn port_specs() {
        assert_eq!(parse_port_spec("8080:80").unwrap(), PortSpec { local: Some(8080), remote: "80".into() });
        assert_eq!(parse_port_spec(":80").unwrap(), PortSpec { local: Some(0), remote: "80".into() });
        assert_eq!(parse_port_spec("0:80").unwrap(), PortSpec { local: Some(0), remote: "80".into() });
        assert_eq!(parse_port_spec("80").unwrap(), PortSpec { local: None, remote: "80".into() });
        assert_eq!(parse_port_spec("8080:http").unwrap(), PortSpec { local: Some(8080), remote: "http".into() });
        assert!(parse_port_spec("x:80").unwrap_err().to_string().contains("local port"));
        assert!(parse_port_spec("80:").is_err());
        assert!(parse_port_spec("80:70000").is_err());
        assert!(parse_port_spec("0").is_err());
    }

    #[test]
    fn addresses() {
        assert_eq!(
            listen_addresses(&["localhost".into()]).unwrap(),
            vec![IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)]
        );
        assert_eq!(listen_addresses(&["0.0.0.0".into()]).unwrap(), vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)]);
        assert!(listen_addresses(&["nowhere".into()]).unwrap_err().to_string().contains("not a valid IP"));
    }

    fn pod() -> Value {
        json!({"metadata": {"name": "web"}, "spec": {"containers": [
            {"name": "a", "ports": [{"name": "http", "containerPort": 8080}]},
            {"name": "b", "ports": [{"name": "metrics", "containerPort": 9090}]}
        ]}})
    }

    #[test]
    fn named_pod_ports() {
        assert_eq!(pod_port(&pod(), "metrics").unwrap(), 9090);
        assert_eq!(pod_port(&pod(), "81").unwrap(), 81);
        assert_eq!(
            pod_port(&pod(), "nope").unwrap_err().to_string(),
            "error: Pod 'web' does not have a named port 'nope'"
        );
    }

    #[test]
    fn service_ports_translate_to_target_ports() {
        let svc = json!({"metadata": {"name": "s"}, "spec": {"ports": [
            {"name": "web", "port": 80, "targetPort": "http"},
            {"port": 81, "targetPort": 8181},
            {"port": 82}
        ]}});
        assert_eq!(service_target_port(&svc, &pod(), "80").unwrap(), 8080);
        assert_eq!(service_target_port(&svc, &pod(), "web").unwrap(), 8080);
        assert_eq!(service_target_port(&svc, &pod(), "81").unwrap(), 8181);
        assert_eq!(service_target_port(&svc, &pod(), "82").unwrap(), 82);
        assert_eq!(
            service_target_port(&svc, &pod(), "83").unwrap_err().to_string(),
            "error: Service s does not have a service port 83"
        );
    }

    #[test]
    fn forwarding_lines_match_kubectl() {
        assert_eq!(forwarding_line(&"127.0.0.1:8080".parse().unwrap(), 80), "Forwarding from 127.0.0.1:8080 -> 80");
        assert_eq!(forwarding_line(&"[::1]:8080".parse().unwrap(), 80), "Forwarding from [::1]:8080 -> 80");
    }
}
