//! The `kubernetes` Service's endpoints when several apiservers serve one store:
//! kube-apiserver's lease endpoint reconciler (`--endpoint-reconciler-type=lease`, its
//! default).
//!
//! Each apiserver holds a Lease in kube-system (`apiserver-endpoint-<ip>-<port>`, labelled
//! [`LEASE_LABEL`], `holderIdentity` its `ip:port`) and renews it every [`INTERVAL`]; a lease
//! not renewed for [`LEASE_TTL`] is dead. On each renewal an apiserver writes the Service's
//! Endpoints and EndpointSlices from the live leases, so every apiserver writes the same
//! thing and they converge; a dead one's lease is deleted by the first live apiserver that
//! sees it, and one that shuts down deletes its own and writes the endpoints without itself.
//! (Upstream keeps the leases as bare etcd keys with a TTL; here they are Lease objects, so
//! both stores have them and `kubectl get leases -n kube-system` shows them.)
//!
//! Apiservers normally share a port; when they do not (several on one machine), the
//! Endpoints get one subset per port and there is one EndpointSlice per port (`kubernetes`
//! for the lowest, `kubernetes-<port>` for the others), as a selector-less Service's
//! endpoints may.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::registry::generic::{DeleteOptions, ListOptions, Registry, UpdateKind, WriteOptions};
use crate::resources;
use crate::selectors::LabelSelector;

/// How long a lease lives without renewal (upstream's master lease TTL).
pub const LEASE_TTL: Duration = Duration::from_secs(15);
/// How often each apiserver renews its lease and rewrites the endpoints.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// The label of the endpoint leases.
pub const LEASE_LABEL: &str = "apiserver.minik8s.io/endpoint";
const NAMESPACE: &str = "kube-system";
const SERVICE: &str = "kubernetes";

/// The name of the lease of the apiserver at `addr`.
pub fn lease_name(addr: SocketAddr) -> String {
    let ip = addr.ip().to_string().replace(':', "-");
    format!("apiserver-endpoint-{ip}-{}", addr.port())
}

/// MicroTime, as Leases carry it.
fn micro_time(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The lease of the apiserver at `addr`, renewed `now`.
pub fn lease(addr: SocketAddr, now: jiff::Timestamp) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": lease_name(addr), "namespace": NAMESPACE, "labels": {LEASE_LABEL: "true"}},
        "spec": {"holderIdentity": addr.to_string(), "leaseDurationSeconds": LEASE_TTL.as_secs(),
                 "renewTime": micro_time(now)},
    })
}

/// A lease's apiserver, and whether it is alive at `now`.
fn of_lease(lease: &Value, now: jiff::Timestamp) -> Option<(SocketAddr, bool)> {
    let spec = lease.get("spec")?;
    let addr: SocketAddr = spec.get("holderIdentity")?.as_str()?.parse().ok()?;
    let renewed: jiff::Timestamp = spec.get("renewTime")?.as_str()?.parse().ok()?;
    let ttl = spec.get("leaseDurationSeconds").and_then(Value::as_i64).unwrap_or(LEASE_TTL.as_secs() as i64);
    let expires = renewed.checked_add(jiff::SignedDuration::from_secs(ttl)).ok()?;
    Some((addr, expires > now))
}

/// The apiservers whose leases are alive at `now` (sorted), and the names of the dead
/// leases (to delete).
pub fn live(leases: &[Value], now: jiff::Timestamp) -> (Vec<SocketAddr>, Vec<String>) {
    let (mut alive, mut dead) = (Vec::new(), Vec::new());
    for l in leases {
        match of_lease(l, now) {
            Some((addr, true)) => alive.push(addr),
            _ => {
                if let Some(name) = l.pointer("/metadata/name").and_then(Value::as_str) {
                    dead.push(name.to_string());
                }
            }
        }
    }
    alive.sort();
    alive.dedup();
    (alive, dead)
}

/// What the Service's endpoint objects are for these apiservers: `(group, plural, name,
/// body)` for the Endpoints and each EndpointSlice (none for no apiserver: the objects go).
pub fn objects(apiservers: &[SocketAddr]) -> Vec<(&'static str, &'static str, String, Value)> {
    let mut by_port: BTreeMap<u16, Vec<IpAddr>> = BTreeMap::new();
    for a in apiservers {
        by_port.entry(a.port()).or_default().push(a.ip());
    }
    if by_port.is_empty() {
        return vec![];
    }
    let ports = |port: u16| json!([{"name": "https", "port": port, "protocol": "TCP"}]);
    let subsets: Vec<Value> = by_port
        .iter()
        .map(|(port, ips)| {
            let addresses: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
            json!({"addresses": addresses, "ports": ports(*port)})
        })
        .collect();
    let mut out = vec![(
        "",
        "endpoints",
        SERVICE.to_string(),
        json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": SERVICE, "namespace": "default", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
            "subsets": subsets}),
    )];
    for (i, (port, ips)) in by_port.iter().enumerate() {
        let name = if i == 0 { SERVICE.to_string() } else { format!("{SERVICE}-{port}") };
        let family = if ips[0].is_ipv4() { "IPv4" } else { "IPv6" };
        let endpoints: Vec<Value> =
            ips.iter().map(|ip| json!({"addresses": [ip.to_string()], "conditions": {"ready": true}})).collect();
        out.push((
            "discovery.k8s.io",
            "endpointslices",
            name.clone(),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": SERVICE}},
                "addressType": family, "endpoints": endpoints, "ports": ports(*port)}),
        ));
    }
    out
}

fn res(group: &str, plural: &str) -> Result<&'static crate::registry::ResourceDef, ApiError> {
    resources::find_by_plural(group, plural).ok_or_else(|| ApiError::internal(format!("no {plural} resource")))
}

/// Create `body`, or replace the stored object when its content differs.
async fn upsert(reg: &Registry, group: &str, plural: &str, name: &str, body: Value) -> Result<(), ApiError> {
    let r = res(group, plural)?;
    match reg.create(r, "default", body.clone(), &WriteOptions::default()).await {
        Ok(_) => Ok(()),
        Err(e) if e.code == 409 => {
            let current = reg.get(r, "default", name).await?;
            let content = |v: &Value| ["subsets", "endpoints", "ports", "addressType"].map(|f| v.get(f).cloned());
            if content(&current) == content(&body) {
                return Ok(());
            }
            reg.update(r, "default", name, body, UpdateKind::Main, &WriteOptions::default()).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// A list of the objects `selector` selects.
fn labelled(selector: &str) -> Result<ListOptions, ApiError> {
    let label_selector =
        LabelSelector::parse(selector).map_err(|e| ApiError::internal(format!("{selector}: {e:?}")))?;
    Ok(ListOptions { label_selector, ..Default::default() })
}

async fn delete(reg: &Registry, group: &str, plural: &str, ns: &str, name: &str) -> Result<(), ApiError> {
    match reg.delete(res(group, plural)?, ns, name, &DeleteOptions::default()).await {
        Ok(_) => Ok(()),
        Err(e) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// One round for the apiserver at `me`: renew its lease (or, `leaving`, delete it), drop
/// dead leases, and write the endpoints of the live ones.
pub async fn reconcile(reg: &Registry, me: SocketAddr, leaving: bool) -> Result<Vec<SocketAddr>, ApiError> {
    let leases = res("coordination.k8s.io", "leases")?;
    let now = jiff::Timestamp::now();
    if leaving {
        delete(reg, "coordination.k8s.io", "leases", NAMESPACE, &lease_name(me)).await?;
    } else {
        let body = lease(me, now);
        match reg.create(leases, NAMESPACE, body.clone(), &WriteOptions::default()).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {
                reg.update(leases, NAMESPACE, &lease_name(me), body, UpdateKind::Main, &WriteOptions::default())
                    .await?;
            }
            Err(e) => return Err(e),
        }
    }
    let list = reg.list(leases, Some(NAMESPACE), &labelled(LEASE_LABEL)?).await?;
    let ours = list["items"].as_array().cloned().unwrap_or_default();
    let (mut alive, dead) = live(&ours, now);
    if leaving {
        alive.retain(|a| *a != me);
    }
    for name in dead {
        delete(reg, "coordination.k8s.io", "leases", NAMESPACE, &name).await?;
    }
    let wanted = objects(&alive);
    if wanted.is_empty() {
        delete(reg, "", "endpoints", "default", SERVICE).await?;
    }
    let wanted_slices: Vec<String> =
        wanted.iter().filter(|(_, p, _, _)| *p == "endpointslices").map(|(_, _, n, _)| n.clone()).collect();
    for (group, plural, name, body) in wanted {
        upsert(reg, group, plural, &name, body).await?;
    }
    // Slices of ports no apiserver uses any more.
    let slices = reg
        .list(
            res("discovery.k8s.io", "endpointslices")?,
            Some("default"),
            &labelled(&format!("kubernetes.io/service-name={SERVICE}"))?,
        )
        .await?;
    for s in slices["items"].as_array().into_iter().flatten() {
        let name = s.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
        let ours = name == SERVICE || name.strip_prefix("kubernetes-").is_some_and(|p| p.parse::<u16>().is_ok());
        if ours && !wanted_slices.iter().any(|w| w == name) {
            delete(reg, "discovery.k8s.io", "endpointslices", "default", name).await?;
        }
    }
    Ok(alive)
}

/// Renew `me`'s lease and the endpoints every [`INTERVAL`] until `stop` fires; then take
/// `me` out of them (best effort: a store that is gone leaves the lease to expire).
pub async fn run(reg: std::sync::Arc<Registry>, me: SocketAddr, stop: impl std::future::Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = &mut stop => break,
        }
        if let Err(e) = reconcile(&reg, me, false).await {
            tracing::warn!(error = %e, "renewing this apiserver's endpoint lease failed; retrying");
        }
    }
    match tokio::time::timeout(Duration::from_secs(2), reconcile(&reg, me, true)).await {
        Ok(Ok(left)) => tracing::info!(?left, "took this apiserver out of the kubernetes service's endpoints"),
        Ok(Err(e)) => tracing::warn!(error = %e, "removing this apiserver's endpoints failed; its lease will expire"),
        Err(_) => tracing::warn!("removing this apiserver's endpoints timed out; its lease will expire"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn leases_live_for_their_ttl() {
        let a: SocketAddr = "10.0.0.2:6443".parse().unwrap();
        let b: SocketAddr = "10.0.0.1:6443".parse().unwrap();
        let l = lease(a, at("2026-11-28T10:00:00Z"));
        assert_eq!(l["metadata"]["name"], "apiserver-endpoint-10.0.0.2-6443");
        assert_eq!(l["spec"]["renewTime"], "2026-11-28T10:00:00.000000Z");
        let leases =
            vec![l, lease(b, at("2026-11-28T10:00:10Z")), json!({"metadata": {"name": "garbage"}, "spec": {}})];
        let (alive, dead) = live(&leases, at("2026-11-28T10:00:14Z"));
        assert_eq!(alive, vec![b, a], "sorted");
        assert_eq!(dead, vec!["garbage".to_string()]);
        let (alive, dead) = live(&leases, at("2026-11-28T10:00:15Z"));
        assert_eq!(alive, vec![b]);
        assert_eq!(dead, vec!["apiserver-endpoint-10.0.0.2-6443".to_string(), "garbage".to_string()]);
        assert_eq!(lease_name("[fd00::1]:6443".parse().unwrap()), "apiserver-endpoint-fd00--1-6443");
    }

    #[test]
    fn endpoints_of_several_apiservers() {
        let addrs: Vec<SocketAddr> =
            ["10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.1:6444"].iter().map(|s| s.parse().unwrap()).collect();
        let objs = objects(&addrs);
        let names: Vec<(&str, String)> = objs.iter().map(|(_, p, n, _)| (*p, n.clone())).collect();
        assert_eq!(
            names,
            vec![
                ("endpoints", "kubernetes".to_string()),
                ("endpointslices", "kubernetes".to_string()),
                ("endpointslices", "kubernetes-6444".to_string())
            ]
        );
        assert_eq!(
            objs[0].3["subsets"],
            json!([
                {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]},
                {"addresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "https", "port": 6444, "protocol": "TCP"}]},
            ])
        );
        assert_eq!(objs[1].3["endpoints"].as_array().unwrap().len(), 2);
        assert_eq!(objs[2].3["ports"][0]["port"], 6444);
        assert!(objects(&[]).is_empty());
    }
}
