//! The real `envoy` binary in a network namespace with a pod's capture rules, configured by
//! a fake control plane over ADS, carrying traffic to real upstream servers.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use support::*;

const WEB_VIP: &str = "10.96.0.10";
const V1: &str = "outbound|80|v1|web.default.svc.cluster.local";
const V2: &str = "outbound|80|v2|web.default.svc.cluster.local";
const API: &str = "outbound|80||api.default.svc.cluster.local";

/// Poll `f` until it holds (10 s at most).
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

fn short(t: &str) -> &'static str {
    match t {
        CDS => "cds",
        EDS => "eds",
        LDS => "lds",
        RDS => "rds",
        _ => "?",
    }
}

#[test]
fn http_routing_weighted_split_prefix_and_header_match() {
    in_netns("routing", &["10.77.0.11", "10.77.0.12", "10.77.0.13"], || async {
        let v1 = http_upstream("10.77.0.11:8080", "v1", Mode::Ok).await;
        let v2 = http_upstream("10.77.0.12:8080", "v2", Mode::Ok).await;
        http_upstream("10.77.0.13:8080", "api", Mode::Ok).await;
        let (cp, addr, _server) = control_plane().await;
        cp.set(CDS, vec![named(V1, &eds_cluster(V1)), named(V2, &eds_cluster(V2)), named(API, &eds_cluster(API))]);
        cp.set(
            EDS,
            vec![
                named(V1, &cla(V1, &["10.77.0.11:8080"])),
                named(V2, &cla(V2, &["10.77.0.12:8080"])),
                named(API, &cla(API, &["10.77.0.13:8080"])),
            ],
        );
        cp.set(
            LDS,
            vec![named("virtualOutbound", &virtual_outbound()), named("0.0.0.0_80", &http_listener(80, false))],
        );
        let mut api_route = to_cluster(API);
        api_route.prefix_rewrite = "/".into();
        cp.set(
            RDS,
            vec![named(
                "80",
                &route_config(
                    "80",
                    vec![service_vhost(
                        "web",
                        WEB_VIP,
                        80,
                        vec![
                            route("jason", with_header(prefix("/"), "end-user", "jason"), to_cluster(V2)),
                            route("api", prefix("/api/"), api_route),
                            route("split", prefix("/"), weighted(&[(V1, 80), (V2, 20)])),
                        ],
                    )],
                ),
            )],
        );
        let envoy = Envoy::start(addr);
        assert_eq!(ready_status().await, 0, "nothing listens before start-up");
        wait_ready().await;

        // The subscriptions came in Envoy's order, and every response was ACKed.
        let reqs = cp.requests();
        let mut order: Vec<&str> = Vec::new();
        for r in &reqs {
            if !order.contains(&short(&r.type_url)) {
                order.push(short(&r.type_url));
            }
        }
        assert_eq!(order, ["cds", "eds", "lds", "rds"]);
        assert!(reqs.iter().all(|r| r.error_detail.is_none()), "no NACK expected");
        assert!(reqs.iter().any(|r| r.type_url == CDS && !r.response_nonce.is_empty()), "CDS ACKed");
        assert_eq!(reqs[0].node.as_ref().unwrap().id, Envoy::node_id());
        assert_eq!(reqs[0].node.as_ref().unwrap().cluster, "client");
        let eds = reqs.iter().find(|r| r.type_url == EDS).unwrap();
        assert_eq!(eds.resource_names.len(), 3);

        let client = client();
        // Weighted split: 1000 requests at 80/20 within ±5%.
        let url = format!("http://{WEB_VIP}/");
        let mut to_v1 = 0;
        for _ in 0..1000 {
            let r = get(&client, &url, &[]).await;
            assert_eq!(r.status, 200);
            if r.body == "v1" {
                to_v1 += 1;
            }
        }
        assert!((750..=850).contains(&to_v1), "v1 got {to_v1} of 1000");
        assert_eq!(v1.load(Ordering::SeqCst) + v2.load(Ordering::SeqCst), 1000);

        // Header match wins over the split.
        for _ in 0..20 {
            let r = get(&client, &url, &[("end-user", "jason")]).await;
            assert_eq!(r.body, "v2");
        }
        // URL prefix routing with a prefix rewrite, by the Service's short name too.
        let r = get(&client, &format!("http://{WEB_VIP}/api/items?x=1"), &[("host", "web")]).await;
        assert_eq!(r.body, "api");
        assert_eq!(r.headers["x-path"], "/items?x=1");
        // Metadata exchange: the upstream saw who called.
        assert_eq!(r.headers["x-peer-id"], Envoy::node_id().as_str());
        // No virtual host for an unknown Host: 404 (no route).
        let r = get(&client, &url, &[("host", "nobody.example")]).await;
        assert_eq!(r.status, 404);

        let m = metrics().await;
        let line = m
            .lines()
            .find(|l| {
                l.starts_with("istio_requests_total{")
                    && l.contains("reporter=\"source\"")
                    && l.contains("destination_service=\"web.default.svc.cluster.local\"")
                    && l.contains("destination_service_name=\"web\"")
                    && l.contains("response_code=\"200\"")
                    && l.contains("source_workload=\"client\"")
            })
            .unwrap_or_else(|| panic!("no istio_requests_total for web in\n{m}"));
        assert!(line.contains("response_flags=\"-\""), "{line}");
        assert!(m.contains("istio_request_duration_milliseconds_bucket"));
        assert!(m.contains("response_code=\"404\"") && m.contains("response_flags=\"NR\""));
        drop(envoy);
    });
}

#[test]
fn retries_outlier_ejection_timeouts_and_faults() {
    in_netns("resilience", &["10.77.0.21", "10.77.0.22", "10.77.0.23", "10.77.0.24"], || async {
        let flaky = http_upstream("10.77.0.21:8080", "flaky", Mode::FailEveryOther).await;
        let good = http_upstream("10.77.0.22:8080", "good", Mode::Ok).await;
        let bad = http_upstream("10.77.0.23:8080", "bad", Mode::Fail).await;
        http_upstream("10.77.0.24:8080", "slow", Mode::Slow(Duration::from_secs(3))).await;
        let flaky_c = "outbound|80||flaky.default.svc.cluster.local";
        let pool_c = "outbound|80||pool.default.svc.cluster.local";
        let slow_c = "outbound|80||slow.default.svc.cluster.local";
        let cb_c = "outbound|80||cb.default.svc.cluster.local";
        let (cp, addr, _server) = control_plane().await;
        cp.set(
            CDS,
            vec![
                named(flaky_c, &eds_cluster(flaky_c)),
                named(pool_c, &with_outlier(eds_cluster(pool_c), 3)),
                named(slow_c, &eds_cluster(slow_c)),
                named(cb_c, &with_max_requests(eds_cluster(cb_c), 1)),
            ],
        );
        cp.set(
            EDS,
            vec![
                named(flaky_c, &cla(flaky_c, &["10.77.0.21:8080"])),
                named(pool_c, &cla(pool_c, &["10.77.0.22:8080", "10.77.0.23:8080"])),
                named(slow_c, &cla(slow_c, &["10.77.0.24:8080"])),
                named(cb_c, &cla(cb_c, &["10.77.0.24:8080"])),
            ],
        );
        cp.set(LDS, vec![named("virtualOutbound", &virtual_outbound()), named("0.0.0.0_80", &http_listener(80, true))]);
        let abort = envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault {
            abort: Some(envoy_types::pb::envoy::extensions::filters::http::fault::v3::FaultAbort {
                percentage: Some(envoy_types::pb::envoy::r#type::v3::FractionalPercent {
                    numerator: 100,
                    denominator: 0,
                }),
                error_type: Some(
                    envoy_types::pb::envoy::extensions::filters::http::fault::v3::fault_abort::ErrorType::HttpStatus(
                        418,
                    ),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut fault_route = route("fault", prefix("/fault"), to_cluster(slow_c));
        fault_route.typed_per_filter_config.insert("envoy.filters.http.fault".into(), any(&abort));
        cp.set(
            RDS,
            vec![named(
                "80",
                &route_config(
                    "80",
                    vec![
                        service_vhost(
                            "flaky",
                            "10.96.0.20",
                            80,
                            vec![route("r", prefix("/"), retries(to_cluster(flaky_c), "5xx", 2))],
                        ),
                        service_vhost("pool", "10.96.0.21", 80, vec![route("r", prefix("/"), to_cluster(pool_c))]),
                        service_vhost(
                            "slow",
                            "10.96.0.22",
                            80,
                            vec![fault_route, route("r", prefix("/"), timeout(to_cluster(slow_c), 300))],
                        ),
                        service_vhost("cb", "10.96.0.23", 80, vec![route("r", prefix("/"), to_cluster(cb_c))]),
                    ],
                ),
            )],
        );
        let _envoy = Envoy::start(addr);
        wait_ready().await;
        let client = client();

        // Retries hide an upstream that fails every other request.
        for i in 0..20 {
            let r = get(&client, "http://10.96.0.20/", &[]).await;
            assert_eq!(r.status, 200, "request {i}: {}", r.body);
        }
        assert!(flaky.load(Ordering::SeqCst) >= 30, "the failures were retried");

        // Outlier detection: 3 consecutive 5xx eject the bad endpoint; then only good answers.
        let mut failures = 0;
        let mut last = Vec::new();
        for _ in 0..40 {
            let r = get(&client, "http://10.96.0.21/", &[]).await;
            if r.status != 200 {
                failures += 1;
            }
            last.push(r.status);
        }
        assert_eq!(failures, 3, "statuses: {last:?}");
        assert!(last[last.len() - 20..].iter().all(|s| *s == 200));
        assert_eq!(bad.load(Ordering::SeqCst), 3);
        assert!(good.load(Ordering::SeqCst) >= 37);
        let m = metrics().await;
        assert!(
            m.lines().any(|l| l.starts_with("envoy_cluster_outlier_detection_ejections_enforced_total")
                && l.contains(pool_c)
                && l.ends_with(" 1")),
            "{m}"
        );

        // Route timeout: 504 "upstream request timeout".
        let started = std::time::Instant::now();
        let r = get(&client, "http://10.96.0.22/", &[]).await;
        assert_eq!(r.status, 504);
        assert_eq!(r.body, "upstream request timeout");
        assert!(started.elapsed() < Duration::from_secs(2));

        // Circuit breaker: one request in flight at most; the second is refused at once.
        let in_flight = tokio::spawn({
            let client = client.clone();
            async move { get(&client, "http://10.96.0.23/", &[]).await.status }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = get(&client, "http://10.96.0.23/", &[]).await;
        assert_eq!(r.status, 503);
        assert_eq!(r.headers["x-envoy-overloaded"], "true");
        assert_eq!(in_flight.await.unwrap(), 200);

        // Fault injection: abort 100% with 418.
        let r = get(&client, "http://10.96.0.22/fault", &[]).await;
        assert_eq!(r.status, 418);
        assert!(metrics().await.contains("response_flags=\"FI\""));
    });
}

#[test]
fn nack_keeps_the_previous_configuration_and_control_plane_restarts_are_harmless() {
    in_netns("nack", &["10.77.0.41", "10.77.0.42"], || async {
        http_upstream("10.77.0.41:8080", "v1", Mode::Ok).await;
        http_upstream("10.77.0.42:8080", "v2", Mode::Ok).await;
        let (cp, addr, server) = control_plane().await;
        cp.set(CDS, vec![named(V1, &eds_cluster(V1)), named(V2, &eds_cluster(V2))]);
        cp.set(EDS, vec![named(V1, &cla(V1, &["10.77.0.41:8080"])), named(V2, &cla(V2, &["10.77.0.42:8080"]))]);
        cp.set(
            LDS,
            vec![named("virtualOutbound", &virtual_outbound()), named("0.0.0.0_80", &http_listener(80, false))],
        );
        let rds = |routes| vec![named("80", &route_config("80", vec![service_vhost("web", WEB_VIP, 80, routes)]))];
        let good_version = cp.set(RDS, rds(vec![route("all", prefix("/"), to_cluster(V1))]));
        let _envoy = Envoy::start(addr);
        wait_ready().await;
        let client = client();
        let url = format!("http://{WEB_VIP}/");
        assert_eq!(get(&client, &url, &[]).await.body, "v1");

        // An invalid regex: NACKed with the previous version and INVALID_ARGUMENT.
        let bad_version = cp.set(RDS, rds(vec![route("bad", regex("/(unclosed"), to_cluster(V2))]));
        eventually("a NACK for RDS", || async { cp.requests().iter().any(|r| r.error_detail.is_some()) }).await;
        let nack = cp.requests().into_iter().find(|r| r.error_detail.is_some()).unwrap();
        assert_eq!(nack.type_url, RDS);
        assert_eq!(nack.version_info, good_version);
        assert_ne!(nack.version_info, bad_version);
        let status = nack.error_detail.unwrap();
        assert_eq!(status.code, 3);
        assert!(status.message.contains("does not compile"), "{}", status.message);
        // The previous configuration is still in force.
        for _ in 0..10 {
            assert_eq!(get(&client, &url, &[]).await.body, "v1");
        }
        assert!(metrics().await.contains("envoy_xds_rejects_total{type=\"rds\"} 1"));

        // A valid update is taken.
        let v3 = cp.set(RDS, rds(vec![route("all", prefix("/"), to_cluster(V2))]));
        eventually("the new routes", || async { get(&client, &url, &[]).await.body == "v2" }).await;
        assert!(cp.requests().iter().any(|r| r.type_url == RDS && r.version_info == v3 && r.error_detail.is_none()));

        // The control plane goes away: traffic goes on with the configuration in force.
        cp.disconnect_all();
        server.abort();
        let _ = server.await;
        for _ in 0..10 {
            let r = get(&client, &url, &[]).await;
            assert_eq!((r.status, r.body.as_str()), (200, "v2"));
        }
        assert_eq!(ready_status().await, 200);
        // It comes back on the same port: the sidecar reconnects, announcing what it has.
        let before = cp.requests().len();
        let listener = loop {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let _server = cp.serve(listener);
        eventually("a reconnect", || async { cp.requests().len() > before }).await;
        let again = &cp.requests()[before];
        assert_eq!(again.type_url, CDS);
        assert!(!again.version_info.is_empty(), "the reconnect names the version in force");
        assert_eq!(get(&client, &url, &[]).await.body, "v2");
    });
}

#[test]
fn tcp_passthrough_tcp_proxy_and_inbound_http() {
    in_netns("tcp", &["10.77.0.31", "10.77.0.32"], || async {
        tcp_echo("10.77.0.31:9000", "direct:").await;
        tcp_echo("10.77.0.32:9000", "db:").await;
        // The pod's own application, reached through the inbound listener.
        http_upstream(&format!("{POD_IP}:{INBOUND_APP_PORT}"), "app", Mode::Ok).await;
        let db = "outbound|5432||db.default.svc.cluster.local";
        let inbound = format!("inbound|{INBOUND_APP_PORT}||");
        let (cp, addr, _server) = control_plane().await;
        cp.set(CDS, vec![named(db, &eds_cluster(db)), named(&inbound, &original_dst_cluster(&inbound))]);
        cp.set(EDS, vec![named(db, &cla(db, &["10.77.0.32:9000"]))]);
        cp.set(
            LDS,
            vec![
                named("virtualOutbound", &virtual_outbound()),
                named("virtualInbound", &virtual_inbound(INBOUND_APP_PORT as u32)),
                named("10.96.0.40_5432", &tcp_listener("10.96.0.40", 5432, db)),
            ],
        );
        let _envoy = Envoy::start(addr);
        wait_ready().await;

        // No listener for 10.77.0.31:9000: passthrough to the original destination.
        assert_eq!(tcp_roundtrip("10.77.0.31:9000", "hello").await, "direct:hello");
        // A TCP Service: tcp_proxy to its cluster's endpoint.
        assert_eq!(tcp_roundtrip("10.96.0.40:5432", "select 1").await, "db:select 1");

        // Inbound HTTP: the peer's metadata header is read and stripped.
        let client = client();
        let peer = "sidecar~10.77.0.99~caller-1.shop~shop.svc.cluster.local";
        let r = get(&client, &format!("http://{POD_IP}:{INBOUND_APP_PORT}/hi"), &[("x-envoy-peer-metadata-id", peer)])
            .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "app");
        assert_eq!(r.headers["x-peer-id"], "", "the application never sees the peer header");
        assert!(r.headers.contains_key("x-envoy-peer-metadata"), "the destination answers with its metadata");

        let m = metrics().await;
        assert!(
            m.lines().any(|l| l.starts_with("istio_requests_total{")
                && l.contains("reporter=\"destination\"")
                && l.contains("source_workload=\"caller-1\"")
                && l.contains("source_workload_namespace=\"shop\"")
                && l.contains("destination_workload=\"client\"")),
            "{m}"
        );
        assert!(
            m.lines().any(|l| l.starts_with("istio_tcp_connections_opened_total{")
                && l.contains("destination_service=\"db.default.svc.cluster.local\"")),
            "{m}"
        );
        assert!(m.contains("istio_tcp_received_bytes_total"));
    });
}

#[test]
fn h2c_end_to_end_and_draining() {
    in_netns("h2c", &["10.77.0.51"], || async {
        http_upstream("10.77.0.51:8080", "grpc-ish", Mode::Ok).await;
        let c = "outbound|80||h2.default.svc.cluster.local";
        let (cp, addr, _server) = control_plane().await;
        cp.set(CDS, vec![named(c, &with_http2(eds_cluster(c)))]);
        cp.set(EDS, vec![named(c, &cla(c, &["10.77.0.51:8080"]))]);
        cp.set(
            LDS,
            vec![named("virtualOutbound", &virtual_outbound()), named("0.0.0.0_80", &http_listener(80, false))],
        );
        cp.set(
            RDS,
            vec![named(
                "80",
                &route_config(
                    "80",
                    vec![service_vhost("h2", "10.96.0.50", 80, vec![route("r", prefix("/"), to_cluster(c))])],
                ),
            )],
        );
        let envoy = Envoy::start(addr);
        wait_ready().await;

        // h2c downstream (prior knowledge) and h2c upstream.
        let h2 = h2c_client();
        for _ in 0..5 {
            let r = get(&h2, "http://10.96.0.50/x", &[]).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.body, "grpc-ish");
            assert_eq!(r.headers["x-version"], "HTTP/2.0", "upstream spoke HTTP/2");
        }
        // HTTP/1.1 downstream to the same HTTP/2 upstream.
        let r = get(&client(), "http://10.96.0.50/y", &[]).await;
        assert_eq!(r.headers["x-version"], "HTTP/2.0");

        // SIGTERM: readiness fails at once, traffic is still served, the process exits after the drain.
        envoy.terminate();
        eventually("readiness to fail", || async { ready_status().await == 503 }).await;
        assert_eq!(get(&h2, "http://10.96.0.50/z", &[]).await.status, 200);
        let mut envoy = envoy;
        let mut exited = false;
        for _ in 0..60 {
            if envoy.child.try_wait().unwrap().is_some() {
                exited = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(exited, "envoy exits once drained");
    });
}
