//! Push benchmark: N simulated sidecars (in-process ADS clients over real gRPC streams)
//! connected to a real pilot ADS server fed a synthetic mesh (100 Services, each with a
//! DestinationRule of two subsets and three endpoints; a VirtualService splitting traffic
//! of every Service). One VirtualService weight changes; the benchmark prints how long
//! until every sidecar got and ACKed the new RDS (p50, max), how long computing the push's
//! snapshot took, pilot's own share of the push (every stream's diff, build and encoding on
//! one thread, without the network and the clients), and a baseline: the time to encode one
//! proxy's complete configuration (its CDS, EDS, LDS and RDS responses) once, with the
//! ratio of the push to it.
//!
//! `cargo run -p pilot --release --example push_bench [-- 100 1000]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, Cluster};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::listener::v3::{filter, Listener};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, HttpConnectionManager,
};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use pilot::ads::{Ads, Published};
use pilot::metrics::Metrics;
use pilot::model::ConfigObject;
use pilot::validate::Accepted;
use pilot::xds::{Inputs, Proxy, Snapshot, TypeUrl};
use prost::Message;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

const SERVICES: usize = 100;
const NAMESPACE: &str = "bench";
/// Streams per HTTP/2 connection.
const STREAMS_PER_CONNECTION: usize = 50;

fn object<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    match serde_json::from_value(v) {
        Ok(o) => o,
        Err(e) => panic!("a synthetic object: {e}"),
    }
}

fn config(name: &str, spec: serde_json::Value) -> ConfigObject {
    ConfigObject {
        namespace: NAMESPACE.into(),
        name: name.into(),
        uid: name.into(),
        generation: 1,
        created: "2026-01-01T00:00:00Z".into(),
        spec,
    }
}

/// The synthetic cluster: Services `svc-<i>` on port 80 with pods v1, v2, v2.
fn world(first_weight: i64) -> Inputs {
    let (mut services, mut slices, mut pods, mut vss, mut drs) = (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..SERVICES {
        let name = format!("svc-{i}");
        services.push(object(json!({
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"clusterIP": format!("10.96.{}.{}", i / 250, i % 250 + 1), "selector": {"app": name},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
        })));
        let mut eps = vec![];
        for j in 0..3 {
            let pod = format!("{name}-{j}");
            let ip = format!("10.1.{i}.{}", j + 1);
            let version = if j == 0 { "v1" } else { "v2" };
            pods.push(object(json!({
                "metadata": {"name": pod, "namespace": NAMESPACE, "labels": {"app": name, "version": version}},
                "spec": {"containers": [{"name": "app", "image": "app", "ports": [{"containerPort": 8080, "name": "http"}]}]},
                "status": {"podIP": ip}
            })));
            eps.push(json!({"addresses": [ip], "conditions": {"ready": true},
                            "targetRef": {"kind": "Pod", "name": pod, "namespace": NAMESPACE}}));
        }
        slices.push(object(json!({
            "metadata": {"name": format!("{name}-x"), "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": eps
        })));
        drs.push(config(
            &name,
            json!({"host": name, "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]}),
        ));
        let w = if i == 0 { first_weight } else { 90 };
        vss.push(config(
            &name,
            json!({"hosts": [name], "http": [{"route": [
                {"destination": {"host": name, "subset": "v1"}, "weight": w},
                {"destination": {"host": name, "subset": "v2"}, "weight": 100 - w}]}]}),
        ));
    }
    Inputs { services, slices, pods, virtual_services: vss, destination_rules: drs }
}

/// What pilot does on a push: validate the configuration, index the mesh, build the
/// shared configuration.
fn snapshot_of(version: u64, inputs: &Inputs) -> Snapshot {
    let (snapshot, verdicts) = Snapshot::compute(version, "cluster.local", inputs, &mut Accepted::default());
    assert!(verdicts.iter().all(|v| v.valid()));
    snapshot
}

fn snapshot(version: u64, first_weight: i64) -> Snapshot {
    snapshot_of(version, &world(first_weight))
}

fn node(i: usize) -> Node {
    let pod = format!("svc-{}-{}", i % SERVICES, (i / SERVICES) % 3);
    let ip = format!("10.1.{}.{}", i % SERVICES, (i / SERVICES) % 3 + 1);
    Node {
        id: format!("sidecar~{ip}~{pod}.{NAMESPACE}~{NAMESPACE}.svc.cluster.local"),
        cluster: pod,
        ..Default::default()
    }
}

/// The EDS cluster names in a CDS response.
fn eds_names(r: &DiscoveryResponse) -> Vec<String> {
    r.resources
        .iter()
        .filter_map(|a| Cluster::decode(a.value.as_slice()).ok())
        .filter(|c| c.cluster_discovery_type == Some(ClusterDiscoveryType::Type(3)))
        .map(|c| c.name)
        .collect()
}

/// The route configuration names the listeners of an LDS response use.
fn route_names(r: &DiscoveryResponse) -> Vec<String> {
    let mut out = vec![];
    for a in &r.resources {
        let Ok(l) = Listener::decode(a.value.as_slice()) else { continue };
        for f in l.filter_chains.iter().flat_map(|c| &c.filters) {
            if let Some(filter::ConfigType::TypedConfig(t)) = &f.config_type {
                if let Ok(h) = HttpConnectionManager::decode(t.value.as_slice()) {
                    if let Some(RouteSpecifier::Rds(rds)) = h.route_specifier {
                        out.push(rds.route_config_name);
                    }
                }
            }
        }
    }
    out
}

/// One sidecar: subscribe in CDS, EDS, LDS, RDS order, ACK everything, report every ACKed
/// RDS version.
async fn sidecar(
    mut client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
    i: usize,
    acked: mpsc::UnboundedSender<(usize, u64, Instant)>,
) -> Result<(), tonic::Status> {
    let (tx, rx) = mpsc::channel(16);
    let req = |t: TypeUrl, names: Vec<String>, ack: Option<&DiscoveryResponse>| DiscoveryRequest {
        node: Some(node(i)),
        type_url: t.url().into(),
        resource_names: names,
        version_info: ack.map(|r| r.version_info.clone()).unwrap_or_default(),
        response_nonce: ack.map(|r| r.nonce.clone()).unwrap_or_default(),
        ..Default::default()
    };
    let send = |r: DiscoveryRequest| {
        let tx = tx.clone();
        async move { tx.send(r).await.map_err(|_| tonic::Status::cancelled("closed")) }
    };
    send(req(TypeUrl::Cluster, vec![], None)).await?;
    let mut stream = client.stream_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
    let (mut eds, mut rds) = (vec![], vec![]);
    let (mut lds_asked, mut rds_asked) = (false, false);
    while let Some(r) = stream.message().await? {
        match TypeUrl::parse(&r.type_url) {
            Some(TypeUrl::Cluster) => {
                send(req(TypeUrl::Cluster, vec![], Some(&r))).await?;
                eds = eds_names(&r);
                send(req(TypeUrl::Endpoint, eds.clone(), None)).await?;
            }
            Some(TypeUrl::Endpoint) => {
                send(req(TypeUrl::Endpoint, eds.clone(), Some(&r))).await?;
                if !lds_asked {
                    lds_asked = true;
                    send(req(TypeUrl::Listener, vec![], None)).await?;
                }
            }
            Some(TypeUrl::Listener) => {
                send(req(TypeUrl::Listener, vec![], Some(&r))).await?;
                rds = route_names(&r);
                if !rds_asked {
                    rds_asked = true;
                    send(req(TypeUrl::Route, rds.clone(), None)).await?;
                }
            }
            Some(TypeUrl::Route) => {
                send(req(TypeUrl::Route, rds.clone(), Some(&r))).await?;
                let version = r.version_info.parse().unwrap_or(0);
                let _ = acked.send((i, version, Instant::now()));
            }
            None => {}
        }
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn run(n: usize) -> anyhow::Result<()> {
    let (publish, feed) = watch::channel(None);
    let first = Arc::new(snapshot(1, 90));
    publish.send_replace(Some(Arc::new(Published { snapshot: first.clone(), since: Instant::now() })));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let metrics = Metrics::new();
    tokio::spawn(pilot::ads::serve(listener, Ads::new(feed, metrics.clone()), std::future::pending()));

    let (acked_tx, mut acked_rx) = mpsc::unbounded_channel();
    let mut channels = vec![];
    for _ in 0..n.div_ceil(STREAMS_PER_CONNECTION) {
        channels.push(tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect().await?);
    }
    let started = Instant::now();
    for i in 0..n {
        let client = AggregatedDiscoveryServiceClient::new(channels[i / STREAMS_PER_CONNECTION].clone())
            .max_decoding_message_size(64 << 20);
        let tx = acked_tx.clone();
        tokio::spawn(async move {
            if let Err(e) = sidecar(client, i, tx).await {
                eprintln!("sidecar {i}: {e}");
            }
        });
    }
    let mut initial = 0;
    while initial < n {
        let Some((_, v, _)) = acked_rx.recv().await else { anyhow::bail!("sidecars stopped") };
        if v == 1 {
            initial += 1;
        }
    }
    let connect = started.elapsed();

    // The push: compute the new snapshot, publish it, wait for every RDS ACK.
    let changed = world(50);
    let t0 = Instant::now();
    let next = Arc::new(snapshot_of(2, &changed));
    let compute = t0.elapsed();
    let proxy = Proxy::from_node(&node(0), &next.mesh).map_err(|e| anyhow::anyhow!("{e}"))?;
    let t1 = Instant::now();
    let _ = next.resources(&proxy, TypeUrl::Route, &next.route_names());
    let routes = t1.elapsed();
    let pushed = Instant::now();
    publish.send_replace(Some(Arc::new(Published { snapshot: next.clone(), since: pushed })));
    let mut latencies = Vec::with_capacity(n);
    while latencies.len() < n {
        let Some((_, v, at)) = acked_rx.recv().await else { anyhow::bail!("sidecars stopped") };
        if v == 2 {
            latencies.push(at.saturating_duration_since(pushed));
        }
    }
    latencies.sort();
    let all = *latencies.last().unwrap_or(&Duration::ZERO);

    // Baseline: encode one proxy's whole configuration once.
    let t2 = Instant::now();
    let mut bytes = 0;
    for t in TypeUrl::ALL {
        let names = match t {
            TypeUrl::Endpoint => next.eds_cluster_names(),
            TypeUrl::Route => next.route_names(),
            _ => vec![],
        };
        let res = next.resources(&proxy, t, &names);
        let resp = DiscoveryResponse {
            version_info: "2".into(),
            type_url: t.url().into(),
            resources: res.items.into_iter().map(|r| r.any).collect(),
            nonce: "1".into(),
            ..Default::default()
        };
        bytes += resp.encode_to_vec().len();
    }
    let baseline = t2.elapsed();

    // Pilot's own share of the push, without the network and the clients: N stream
    // states, subscribed to everything at version 1, handed version 2 on one thread.
    let old = Published { snapshot: first.clone(), since: Instant::now() };
    let nonces = Arc::new(pilot::ads::Nonces::default());
    let mut conns: Vec<pilot::ads::Connection> = (0..n)
        .map(|i| {
            let mut c = pilot::ads::Connection::new(nonces.clone());
            for t in TypeUrl::ALL {
                let names = match t {
                    TypeUrl::Endpoint => first.eds_cluster_names(),
                    TypeUrl::Route => first.route_names(),
                    _ => vec![],
                };
                let req = DiscoveryRequest {
                    node: Some(node(i)),
                    type_url: t.url().into(),
                    resource_names: names,
                    ..Default::default()
                };
                let _ = c.on_request(req, Some(&old), Instant::now());
            }
            c
        })
        .collect();
    let new = Published { snapshot: next.clone(), since: Instant::now() };
    let t3 = Instant::now();
    let mut sent = 0;
    for c in &mut conns {
        for r in c.on_snapshot(&new) {
            sent += r.encode_to_vec().len();
        }
    }
    let server_side = t3.elapsed();

    println!("sidecars: {n}  (services: {SERVICES}, connected and synced in {connect:?})");
    println!(
        "  pilot's share (every stream's diff + build + encode of the push, one thread): {server_side:?}, {sent} bytes"
    );
    println!("  snapshot compute (full push, shared part): {compute:?}; route configs of a namespace: {routes:?}");
    println!("  new RDS got and ACKed by all: p50 {:?}, max {all:?}", percentile(&latencies, 0.5));
    println!("  baseline: encoding one proxy's full configuration ({bytes} bytes) once: {baseline:?}");
    println!(
        "  ratio: push to all / baseline = {:.1}; per sidecar = {:.3}",
        all.as_secs_f64() / baseline.as_secs_f64().max(1e-9),
        all.as_secs_f64() / n as f64 / baseline.as_secs_f64().max(1e-9)
    );
    println!(
        "  pushes: rds {}, rejects {}",
        metrics.pushes.with_label_values(&["rds"]).get(),
        metrics.rejects.with_label_values(&["rds"]).get()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![100, 1000] } else { sizes };
    println!("push_bench ({} build)", if cfg!(debug_assertions) { "debug" } else { "release" });
    for n in sizes {
        run(n).await?;
    }
    Ok(())
}
