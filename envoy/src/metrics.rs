//! The sidecar's metrics: Istio's standard request and TCP metrics plus a few of Envoy's own
//! counters, served on `:15090/stats/prometheus`.

use std::sync::OnceLock;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// Istio's buckets for `istio_request_duration_milliseconds`.
const DURATION_BUCKETS: &[f64] = &[
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0, 300000.0,
    600000.0, 1800000.0, 3600000.0,
];

const PEER_LABELS: &[&str] = &[
    "reporter",
    "source_workload",
    "source_workload_namespace",
    "destination_workload",
    "destination_workload_namespace",
    "destination_service",
    "destination_service_name",
    "destination_service_namespace",
];

pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub duration: HistogramVec,
    pub tcp_opened: IntCounterVec,
    pub tcp_closed: IntCounterVec,
    pub tcp_sent: IntCounterVec,
    pub tcp_received: IntCounterVec,
    pub retries: IntCounterVec,
    pub ejections: IntCounterVec,
    pub overflow: IntCounterVec,
    pub xds_rejects: IntCounterVec,
    pub xds_updates: IntCounterVec,
}

/// Who talked to whom, as Istio labels a request or a connection.
#[derive(Debug, Clone, Default)]
pub struct Peers<'a> {
    pub reporter: &'static str,
    pub source_workload: &'a str,
    pub source_namespace: &'a str,
    pub destination_workload: &'a str,
    pub destination_namespace: &'a str,
    /// The destination service's host name (`name.namespace.svc.<domain>`) or `unknown`.
    pub destination_service: &'a str,
}

impl Peers<'_> {
    fn values(&self) -> [&str; 8] {
        let (name, ns) = service_parts(self.destination_service);
        [
            self.reporter,
            self.source_workload,
            self.source_namespace,
            self.destination_workload,
            self.destination_namespace,
            self.destination_service,
            name,
            ns,
        ]
    }
}

/// `name.namespace.svc…` → (`name`, `namespace`); anything else → (itself, `unknown`).
pub fn service_parts(host: &str) -> (&str, &str) {
    let mut parts = host.splitn(3, '.');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(n), Some(ns), Some(rest)) if rest.starts_with("svc") => (n, ns),
        _ => (host, "unknown"),
    }
}

/// The FQDN in an Istio cluster name (`outbound|80|v1|a.ns.svc.cluster.local`).
pub fn cluster_service(cluster: &str) -> Option<&str> {
    let mut parts = cluster.split('|');
    let (dir, _, _, host) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    (dir == "outbound" && !host.is_empty()).then_some(host)
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry.register(Box::new(c.clone())).unwrap_or_else(|e| panic!("registering {name}: {e}"));
    c
}

impl Metrics {
    fn new() -> Metrics {
        let registry = Registry::new();
        let mut request_labels = PEER_LABELS.to_vec();
        request_labels.extend(["response_code", "request_protocol", "response_flags"]);
        let mut tcp_labels = PEER_LABELS.to_vec();
        tcp_labels.push("response_flags");
        let duration = HistogramVec::new(
            HistogramOpts::new("istio_request_duration_milliseconds", "Duration of requests, in milliseconds.")
                .buckets(DURATION_BUCKETS.to_vec()),
            &request_labels,
        )
        .unwrap_or_else(|e| panic!("duration histogram: {e}"));
        registry.register(Box::new(duration.clone())).unwrap_or_else(|e| panic!("registering duration: {e}"));
        Metrics {
            requests: counter(&registry, "istio_requests_total", "Requests handled.", &request_labels),
            duration,
            tcp_opened: counter(
                &registry,
                "istio_tcp_connections_opened_total",
                "TCP connections opened.",
                &tcp_labels,
            ),
            tcp_closed: counter(
                &registry,
                "istio_tcp_connections_closed_total",
                "TCP connections closed.",
                &tcp_labels,
            ),
            tcp_sent: counter(&registry, "istio_tcp_sent_bytes_total", "Bytes sent to the downstream.", &tcp_labels),
            tcp_received: counter(
                &registry,
                "istio_tcp_received_bytes_total",
                "Bytes received from the downstream.",
                &tcp_labels,
            ),
            retries: counter(&registry, "envoy_cluster_upstream_rq_retry", "Request retries.", &["cluster_name"]),
            ejections: counter(
                &registry,
                "envoy_cluster_outlier_detection_ejections_enforced_total",
                "Endpoints ejected by outlier detection.",
                &["cluster_name"],
            ),
            overflow: counter(
                &registry,
                "envoy_cluster_upstream_rq_pending_overflow",
                "Requests and connections refused by the circuit breakers.",
                &["cluster_name"],
            ),
            xds_rejects: counter(&registry, "envoy_xds_rejects_total", "xDS updates rejected (NACKed).", &["type"]),
            xds_updates: counter(&registry, "envoy_xds_updates_total", "xDS updates accepted (ACKed).", &["type"]),
            registry,
        }
    }

    pub fn request(&self, peers: &Peers<'_>, code: u16, protocol: &str, flags: &str, millis: f64) {
        let p = peers.values();
        let code_buf = itoa_u16(code);
        let code = code_buf.as_str();
        let labels = [p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], code, protocol, flags];
        self.requests.with_label_values(&labels).inc();
        self.duration.with_label_values(&labels).observe(millis);
    }

    /// TCP metrics for one closed connection.
    pub fn tcp(&self, peers: &Peers<'_>, flags: &str, sent: u64, received: u64) {
        let p = peers.values();
        let labels = [p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], flags];
        self.tcp_closed.with_label_values(&labels).inc();
        self.tcp_sent.with_label_values(&labels).inc_by(sent);
        self.tcp_received.with_label_values(&labels).inc_by(received);
    }

    pub fn tcp_open(&self, peers: &Peers<'_>) {
        let p = peers.values();
        let labels = [p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], "-"];
        self.tcp_opened.with_label_values(&labels).inc();
    }
}

/// A status code as text without a heap allocation.
struct Code([u8; 3], usize);

impl Code {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0[..self.1]).unwrap_or("0")
    }
}

fn itoa_u16(code: u16) -> Code {
    let code = code.min(999);
    if code >= 100 {
        Code([b'0' + (code / 100) as u8, b'0' + (code / 10 % 10) as u8, b'0' + (code % 10) as u8], 3)
    } else {
        Code([b'0', 0, 0], 1)
    }
}

pub fn get() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_hosts_and_clusters() {
        assert_eq!(service_parts("reviews.shop.svc.cluster.local"), ("reviews", "shop"));
        assert_eq!(service_parts("10.0.0.1:80"), ("10.0.0.1:80", "unknown"));
        assert_eq!(cluster_service("outbound|80|v1|r.shop.svc.cluster.local"), Some("r.shop.svc.cluster.local"));
        assert_eq!(cluster_service("inbound|80||"), None);
        assert_eq!(itoa_u16(503).as_str(), "503");
        assert_eq!(itoa_u16(0).as_str(), "0");
    }

    #[test]
    fn records_istio_series() {
        let m = get();
        let peers = Peers {
            reporter: "source",
            source_workload: "a",
            source_namespace: "ns",
            destination_workload: "b",
            destination_namespace: "ns",
            destination_service: "b.ns.svc.cluster.local",
        };
        m.request(&peers, 200, "http", "-", 1.5);
        let text = {
            use prometheus::Encoder;
            let mut out = Vec::new();
            prometheus::TextEncoder::new().encode(&m.registry.gather(), &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert!(text.contains("destination_service_name=\"b\""), "{text}");
        assert!(text.contains("istio_request_duration_milliseconds_bucket"));
    }
}
