//! Cluster DNS (Kubernetes' DNS specification, the subset CoreDNS' `kubernetes` plugin
//! serves), built on `hickory-proto` messages:
//! - `<svc>.<ns>.svc.<domain>` A: the cluster IP; for headless services the ready endpoints;
//! - `_<port>._<proto>.<svc>.<ns>.svc.<domain>` SRV for named ports;
//! - `<a-b-c-d>.<ns>.pod.<domain>` A: the address written in the name ("pods insecure");
//! - the hosts of Ingress rules: the Ingress' load-balancer IPs, else this node's `--node-ip`;
//! - everything else is forwarded to the upstream resolver.
//!
//! [`Records`] is built by a pure function of the API objects; [`answer`] is pure too.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, CNAME, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Notify;

use crate::model::LABEL_SERVICE_NAME;

/// TTL of answers (CoreDNS' default).
pub const TTL: u32 = 5;

/// Settings of the server.
#[derive(Clone, Debug)]
pub struct Config {
    pub domain: String,
    pub upstream: Option<SocketAddr>,
    pub ingress_ip: Option<Ipv4Addr>,
}

/// An SRV answer: (port, target).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Srv {
    pub port: u16,
    pub target: String,
}

/// Every name the cluster domain answers, lower-case without the trailing dot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Records {
    pub a: BTreeMap<String, BTreeSet<Ipv4Addr>>,
    pub srv: BTreeMap<String, BTreeSet<Srv>>,
    /// ExternalName services: name → target.
    pub cname: BTreeMap<String, String>,
}

fn dashed(ip: Ipv4Addr) -> String {
    ip.to_string().replace('.', "-")
}

/// The records for these objects.
pub fn build_records(services: &[Service], slices: &[EndpointSlice], ingresses: &[Ingress], cfg: &Config) -> Records {
    let d = cfg.domain.trim_end_matches('.').to_lowercase();
    let mut r = Records::default();
    for svc in services {
        let (Some(name), Some(spec)) = (svc.metadata.name.as_deref(), svc.spec.as_ref()) else { continue };
        let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
        let fqdn = format!("{name}.{ns}.svc.{d}");
        let headless = spec.cluster_ip.as_deref() == Some("None");
        if spec.type_.as_deref() == Some("ExternalName") {
            if let Some(target) = spec.external_name.as_deref() {
                r.cname.insert(fqdn.clone(), target.trim_end_matches('.').to_lowercase());
            }
            continue;
        }
        if !headless {
            if let Some(ip) = spec.cluster_ip.as_deref().and_then(|i| i.parse().ok()) {
                r.a.entry(fqdn.clone()).or_default().insert(ip);
            }
            for p in spec.ports.iter().flatten() {
                let (Some(pn), Ok(port)) = (p.name.as_deref(), u16::try_from(p.port)) else { continue };
                let proto = p.protocol.as_deref().unwrap_or("TCP").to_lowercase();
                r.srv.entry(format!("_{pn}._{proto}.{fqdn}")).or_default().insert(Srv { port, target: fqdn.clone() });
            }
            continue;
        }
        // Headless: ready endpoints of its slices.
        for slice in slices {
            if slice.metadata.namespace.as_deref().unwrap_or("default") != ns
                || slice.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME)).map(String::as_str)
                    != Some(name)
            {
                continue;
            }
            for ep in slice.endpoints.iter().flatten() {
                if !ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true) {
                    continue;
                }
                for addr in &ep.addresses {
                    let Ok(ip) = addr.parse::<Ipv4Addr>() else { continue };
                    r.a.entry(fqdn.clone()).or_default().insert(ip);
                    let host = ep.hostname.clone().unwrap_or_else(|| dashed(ip));
                    let target = format!("{host}.{fqdn}");
                    r.a.entry(target.clone()).or_default().insert(ip);
                    for p in slice.ports.iter().flatten() {
                        let (Some(pn), Some(port)) = (p.name.as_deref(), p.port.and_then(|x| u16::try_from(x).ok()))
                        else {
                            continue;
                        };
                        let proto = p.protocol.as_deref().unwrap_or("TCP").to_lowercase();
                        r.srv
                            .entry(format!("_{pn}._{proto}.{fqdn}"))
                            .or_default()
                            .insert(Srv { port, target: target.clone() });
                    }
                }
            }
        }
    }
    for ing in ingresses {
        let mut ips: BTreeSet<Ipv4Addr> = ing
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.as_deref().and_then(|ip| ip.parse().ok()))
            .collect();
        if ips.is_empty() {
            ips.extend(cfg.ingress_ip);
        }
        if ips.is_empty() {
            continue;
        }
        for rule in ing.spec.as_ref().and_then(|s| s.rules.as_ref()).into_iter().flatten() {
            if let Some(host) = rule.host.as_deref() {
                if !host.starts_with('*') {
                    r.a.entry(host.trim_end_matches('.').to_lowercase()).or_default().extend(ips.iter().copied());
                }
            }
        }
    }
    r
}

/// The answer to `query` from `records`, or `None` when it must be forwarded upstream.
pub fn answer(records: &Records, domain: &str, query: &Message) -> Option<Message> {
    let q = query.queries().first()?;
    let name = q.name().to_ascii().trim_end_matches('.').to_lowercase();
    let d = domain.trim_end_matches('.').to_lowercase();
    let in_domain = name == d || name.ends_with(&format!(".{d}"));
    let known = records.a.contains_key(&name) || records.srv.contains_key(&name) || records.cname.contains_key(&name);
    let pod_ip = pod_address(&name, &d);
    if !in_domain && !known {
        return None;
    }
    let mut resp = Message::new();
    resp.set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(query.op_code())
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true);
    resp.add_query(q.clone());
    let qname = q.name().clone();
    let mut exists = known;
    if let Some(target) = records.cname.get(&name) {
        // ExternalName: the CNAME (the client resolves the target).
        if let Ok(t) = Name::from_ascii(format!("{target}.")) {
            resp.add_answer(Record::from_rdata(qname.clone(), TTL, RData::CNAME(CNAME(t))));
        }
        return Some(resp);
    }
    match q.query_type() {
        RecordType::A | RecordType::ANY => {
            let ips: Vec<Ipv4Addr> = match (records.a.get(&name), pod_ip) {
                (Some(ips), _) => ips.iter().copied().collect(),
                (None, Some(ip)) => vec![ip],
                _ => Vec::new(),
            };
            exists |= !ips.is_empty();
            for ip in ips {
                resp.add_answer(Record::from_rdata(qname.clone(), TTL, RData::A(A(ip))));
            }
        }
        RecordType::SRV => {
            for s in records.srv.get(&name).into_iter().flatten() {
                if let Ok(target) = Name::from_ascii(format!("{}.", s.target)) {
                    resp.add_answer(Record::from_rdata(
                        qname.clone(),
                        TTL,
                        RData::SRV(SRV::new(0, 100, s.port, target)),
                    ));
                }
                // Additional A records for the target.
                if let (Some(ips), Ok(target)) = (records.a.get(&s.target), Name::from_ascii(format!("{}.", s.target)))
                {
                    for ip in ips {
                        resp.add_additional(Record::from_rdata(target.clone(), TTL, RData::A(A(*ip))));
                    }
                }
            }
        }
        _ => {}
    }
    exists |= pod_ip.is_some() || records.a.keys().chain(records.srv.keys()).any(|k| k.ends_with(&format!(".{name}")));
    if !exists && name != d {
        resp.set_response_code(ResponseCode::NXDomain);
    }
    Some(resp)
}

/// `a-b-c-d.<ns>.pod.<domain>` → a.b.c.d.
fn pod_address(name: &str, domain: &str) -> Option<Ipv4Addr> {
    let rest = name.strip_suffix(&format!(".pod.{domain}"))?;
    let (ip, ns) = rest.split_once('.')?;
    if ns.is_empty() || ns.contains('.') {
        return None;
    }
    ip.replace('-', ".").parse().ok()
}

/// The first `nameserver` of a resolv.conf, port 53.
pub fn upstream_from_resolv_conf(text: &str) -> Option<SocketAddr> {
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("nameserver"))
            .then(|| w.next())
            .flatten()
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, 53))
    })
}

/// A running DNS server.
pub struct Server;

impl Server {
    /// Bind `addr` (UDP), keep the records current from the API, serve in the background.
    ///
    /// One socket per address in `addrs` (a UDP server bound to 0.0.0.0 would answer from
    /// the outgoing route's address, which breaks replies to DNATed queries — e.g. queries
    /// sent to a kube-dns cluster IP — so callers bind each local address).
    pub async fn start(client: kube::Client, addrs: &[SocketAddr], cfg: Config) -> anyhow::Result<Vec<SocketAddr>> {
        let mut sockets = Vec::new();
        let mut bound = Vec::new();
        for addr in addrs {
            let socket = UdpSocket::bind(addr).await.map_err(|e| anyhow::anyhow!("binding DNS {addr}: {e}"))?;
            bound.push(socket.local_addr()?);
            sockets.push(Arc::new(socket));
        }
        let records = Arc::new(RwLock::new(Records::default()));
        let notify = Arc::new(Notify::new());
        let services = crate::proxier::cache::<Service>(&client, notify.clone());
        let slices = crate::proxier::cache::<EndpointSlice>(&client, notify.clone());
        let ingresses = crate::proxier::cache::<Ingress>(&client, notify.clone());
        {
            let records = records.clone();
            let cfg = cfg.clone();
            tokio::spawn(async move {
                loop {
                    let s: Vec<Service> = services.state().iter().map(|x| (**x).clone()).collect();
                    let e: Vec<EndpointSlice> = slices.state().iter().map(|x| (**x).clone()).collect();
                    let i: Vec<Ingress> = ingresses.state().iter().map(|x| (**x).clone()).collect();
                    let r = build_records(&s, &e, &i, &cfg);
                    if let Ok(mut w) = records.write() {
                        *w = r;
                    }
                    notify.notified().await;
                }
            });
        }
        for socket in sockets {
            tokio::spawn(serve(socket, records.clone(), cfg.clone()));
        }
        for addr in &bound {
            let listener =
                TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("binding DNS (TCP) {addr}: {e}"))?;
            tokio::spawn(serve_tcp(listener, records.clone(), cfg.clone()));
        }
        Ok(bound)
    }
}

async fn serve(socket: Arc<UdpSocket>, records: Arc<RwLock<Records>>, cfg: Config) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "DNS receive failed");
                continue;
            }
        };
        let packet = buf[..n].to_vec();
        let Ok(query) = Message::from_vec(&packet) else { continue };
        let reply = records.read().ok().and_then(|r| answer(&r, &cfg.domain, &query));
        match reply {
            Some(mut resp) => {
                if let Some(bytes) = udp_bytes(&mut resp, &query) {
                    let _ = socket.send_to(&bytes, peer).await;
                }
            }
            None => {
                let socket = socket.clone();
                let upstream = cfg.upstream;
                tokio::spawn(async move {
                    let reply = match upstream {
                        Some(u) => forward(&packet, u).await,
                        None => None,
                    };
                    if let Some(b) = reply.or_else(|| servfail(&query)) {
                        let _ = socket.send_to(&b, peer).await;
                    }
                });
            }
        }
    }
}

fn servfail(query: &Message) -> Option<Vec<u8>> {
    let mut m = Message::new();
    m.set_id(query.id()).set_message_type(MessageType::Response).set_response_code(ResponseCode::ServFail);
    for q in query.queries() {
        m.add_query(q.clone());
    }
    m.to_vec().ok()
}

/// The UDP form of `resp`: truncated (TC set, no records) when larger than the client's
/// limit (512 bytes, or its EDNS payload size), so it retries over TCP.
pub fn udp_bytes(resp: &mut Message, query: &Message) -> Option<Vec<u8>> {
    let max = query.extensions().as_ref().map(|e| e.max_payload().max(512)).unwrap_or(512) as usize;
    let bytes = resp.to_vec().ok()?;
    if bytes.len() <= max {
        return Some(bytes);
    }
    resp.take_answers();
    resp.take_additionals();
    resp.set_truncated(true);
    resp.to_vec().ok()
}

/// DNS over TCP (RFC 7766 framing: a 2-byte length before each message).
async fn serve_tcp(listener: TcpListener, records: Arc<RwLock<Records>>, cfg: Config) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else { continue };
        let records = records.clone();
        let cfg = cfg.clone();
        tokio::spawn(async move {
            loop {
                let Ok(packet) = read_framed(&mut conn).await else { return };
                let Ok(query) = Message::from_vec(&packet) else { return };
                let local = records.read().ok().and_then(|r| answer(&r, &cfg.domain, &query));
                let bytes = match local {
                    Some(resp) => resp.to_vec().ok(),
                    None => match cfg.upstream {
                        Some(u) => forward_tcp(&packet, u).await,
                        None => None,
                    }
                    .or_else(|| servfail(&query)),
                };
                let Some(b) = bytes else { return };
                if write_framed(&mut conn, &b).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn read_framed(conn: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 2];
    tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut len)).await??;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    conn.read_exact(&mut buf).await?;
    Ok(buf)
}

async fn write_framed(conn: &mut TcpStream, b: &[u8]) -> std::io::Result<()> {
    let len = u16::try_from(b.len()).map_err(|_| std::io::Error::other("DNS message too long"))?;
    conn.write_all(&len.to_be_bytes()).await?;
    conn.write_all(b).await
}

async fn forward_tcp(packet: &[u8], upstream: SocketAddr) -> Option<Vec<u8>> {
    let mut s = tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(upstream)).await.ok()?.ok()?;
    write_framed(&mut s, packet).await.ok()?;
    read_framed(&mut s).await.ok()
}

async fn forward(packet: &[u8], upstream: SocketAddr) -> Option<Vec<u8>> {
    let bind: SocketAddr = if upstream.is_ipv4() { "0.0.0.0:0".parse().ok()? } else { "[::]:0".parse().ok()? };
    let s = UdpSocket::bind(bind).await.ok()?;
    s.send_to(packet, upstream).await.ok()?;
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(Duration::from_secs(3), s.recv_from(&mut buf)).await.ok()?.ok()?;
    buf.truncate(n);
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{simple_service, simple_slice, svc};
    use hickory_proto::op::Query;
    use serde_json::json;

    fn cfg() -> Config {
        Config { domain: "cluster.local".into(), upstream: None, ingress_ip: Some("192.168.1.10".parse().unwrap()) }
    }
    fn query(name: &str, t: RecordType) -> Message {
        let mut m = Message::new();
        m.set_id(42).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m
    }
    fn a_answers(m: &Message) -> Vec<String> {
        m.answers()
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) => Some(a.0.to_string()),
                _ => None,
            })
            .collect()
    }
    fn records() -> Records {
        let headless = svc(json!({"metadata": {"name": "db", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}}));
        let mut db_slice = simple_slice("db", &["10.244.1.5", "10.244.1.6"], 5432);
        db_slice.ports.as_mut().unwrap()[0].name = Some("pg".into());
        let ing: Ingress = serde_json::from_value(json!({"metadata": {"name": "i", "namespace": "default"},
            "spec": {"rules": [{"host": "myservice.com"}]}}))
        .unwrap();
        build_records(&[simple_service("web", "10.96.0.10", 80), headless], &[db_slice], &[ing], &cfg())
    }

    #[test]
    fn service_a_record_is_the_cluster_ip() {
        let r = answer(&records(), "cluster.local", &query("web.default.svc.cluster.local.", RecordType::A)).unwrap();
        assert_eq!(r.id(), 42);
        assert_eq!(r.response_code(), ResponseCode::NoError);
        assert_eq!(a_answers(&r), ["10.96.0.10"]);
        let r = answer(&records(), "cluster.local", &query("WEB.Default.svc.cluster.local.", RecordType::A)).unwrap();
        assert_eq!(a_answers(&r), ["10.96.0.10"], "case-insensitive");
    }

    #[test]
    fn headless_service_answers_pod_ips_and_srv() {
        let r = answer(&records(), "cluster.local", &query("db.default.svc.cluster.local.", RecordType::A)).unwrap();
        assert_eq!(a_answers(&r), ["10.244.1.5", "10.244.1.6"]);
        let r = answer(&records(), "cluster.local", &query("_pg._tcp.db.default.svc.cluster.local.", RecordType::SRV))
            .unwrap();
        assert_eq!(r.answers().len(), 2);
        assert!(
            matches!(r.answers()[0].data(), RData::SRV(s) if s.port() == 5432 && s.target().to_ascii() == "10-244-1-5.db.default.svc.cluster.local.")
        );
        assert_eq!(r.additionals().len(), 2);
    }

    #[test]
    fn srv_for_named_port_of_a_normal_service() {
        let r =
            answer(&records(), "cluster.local", &query("_http._tcp.web.default.svc.cluster.local.", RecordType::SRV))
                .unwrap();
        assert!(
            matches!(r.answers()[0].data(), RData::SRV(s) if s.port() == 80 && s.target().to_ascii() == "web.default.svc.cluster.local.")
        );
    }

    #[test]
    fn pod_names_and_nxdomain() {
        let r = answer(&records(), "cluster.local", &query("10-244-1-7.default.pod.cluster.local.", RecordType::A))
            .unwrap();
        assert_eq!(a_answers(&r), ["10.244.1.7"]);
        let r = answer(&records(), "cluster.local", &query("nope.default.svc.cluster.local.", RecordType::A)).unwrap();
        assert_eq!(r.response_code(), ResponseCode::NXDomain);
        // A name that exists without A records of that type: NOERROR, empty.
        let r =
            answer(&records(), "cluster.local", &query("web.default.svc.cluster.local.", RecordType::AAAA)).unwrap();
        assert_eq!(r.response_code(), ResponseCode::NoError);
        assert!(r.answers().is_empty());
    }

    #[test]
    fn ingress_hosts_resolve_to_the_ingress_node_and_others_are_forwarded() {
        let r = answer(&records(), "cluster.local", &query("myservice.com.", RecordType::A)).unwrap();
        assert_eq!(a_answers(&r), ["192.168.1.10"]);
        assert!(answer(&records(), "cluster.local", &query("example.org.", RecordType::A)).is_none());
    }

    #[test]
    fn large_udp_answers_are_truncated() {
        let ips: Vec<String> = (0..60).map(|i| format!("10.244.{}.{}", i / 200, i % 200 + 1)).collect();
        let ip_refs: Vec<&str> = ips.iter().map(String::as_str).collect();
        let headless = svc(json!({"metadata": {"name": "big", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}}));
        let r = build_records(&[headless], &[simple_slice("big", &ip_refs, 80)], &[], &cfg());
        let q = query("big.default.svc.cluster.local.", RecordType::A);
        let mut resp = answer(&r, "cluster.local", &q).unwrap();
        assert_eq!(resp.answers().len(), 60);
        let full = resp.to_vec().unwrap();
        assert!(full.len() > 512);
        let udp = udp_bytes(&mut resp, &q).unwrap();
        let m = Message::from_vec(&udp).unwrap();
        assert!(m.truncated() && m.answers().is_empty() && udp.len() <= 512);
        // A small answer is sent as is.
        let mut small =
            answer(&records(), "cluster.local", &query("web.default.svc.cluster.local.", RecordType::A)).unwrap();
        let b = udp_bytes(&mut small, &q).unwrap();
        assert!(!Message::from_vec(&b).unwrap().truncated());
    }

    #[test]
    fn external_name_is_a_cname() {
        let en = svc(json!({"metadata": {"name": "ext", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "example.com"}}));
        let r = build_records(&[en], &[], &[], &cfg());
        let resp = answer(&r, "cluster.local", &query("ext.default.svc.cluster.local.", RecordType::A)).unwrap();
        assert!(matches!(resp.answers()[0].data(), RData::CNAME(c) if c.0.to_ascii() == "example.com."));
    }

    #[test]
    fn resolv_conf_upstream() {
        assert_eq!(
            upstream_from_resolv_conf("# x\nsearch foo\nnameserver 10.0.0.2\nnameserver 8.8.8.8\n"),
            Some("10.0.0.2:53".parse().unwrap())
        );
        assert_eq!(upstream_from_resolv_conf("search x\n"), None);
    }
}
