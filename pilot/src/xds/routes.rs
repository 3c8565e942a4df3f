//! RDS: the route configuration `"<port>"` of the outbound HTTP listener on that port: a
//! virtual host per Service with an HTTP port there, its VirtualService's `http` routes in
//! order, then a default route to the Service; and `allow_any` to `PassthroughCluster`.
//! Only the short names in `domains` depend on the proxy's namespace.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier, query_parameter_matcher::QueryParameterMatchSpecifier, route::Action,
    route_action::ClusterSpecifier, route_match::PathSpecifier, weighted_cluster::ClusterWeight, HeaderMatcher,
    QueryParameterMatcher, RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
    WeightedCluster,
};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{fault_delay::FaultDelaySecifier, FaultDelay};
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{fault_abort::ErrorType, FaultAbort, HttpFault};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    string_matcher::MatchPattern, RegexMatchAndSubstitute, RegexMatcher, StringMatcher,
};
use envoy_types::pb::envoy::r#type::v3::{fractional_percent::DenominatorType, FractionalPercent};

use super::listeners::FAULT;
use super::{any, duration, outbound_cluster, u32v, Mesh};
use crate::model::{
    parse_duration, resolve_host, Destination, HttpMatch, HttpRoute, Match, Percent, RouteDestination, ServiceInfo,
    StringMatch, VirtualService,
};

/// Istio's retry policy when a route has none.
pub const DEFAULT_RETRY_ON: &str = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";
pub const DEFAULT_RETRIES: u32 = 2;

/// One upstream of a route and its weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub cluster: String,
    pub weight: u32,
}

/// The cluster a VirtualService destination names, seen from a listener on `port`: the
/// destination's port, else the Service's only port, else the listener's port.
pub fn cluster_of(mesh: &Mesh, dest: &Destination, vs_namespace: &str, port: u32) -> Option<String> {
    let fqdn = resolve_host(&dest.host, vs_namespace, &mesh.services.domain);
    let svc = mesh.services.get(&fqdn)?;
    let number = match &dest.port {
        Some(p) => p.number,
        None if svc.ports.len() == 1 => svc.ports[0].port,
        None if svc.port(port).is_some() => port,
        None => svc.ports.first()?.port,
    };
    Some(outbound_cluster(number, dest.subset.as_deref().unwrap_or(""), &fqdn))
}

fn targets(mesh: &Mesh, route: &[RouteDestination], ns: &str, port: u32) -> Vec<Target> {
    let all: Vec<Target> = route
        .iter()
        .filter_map(|d| {
            let weight = if route.len() == 1 { 100 } else { u32::try_from(d.weight.unwrap_or(0)).unwrap_or(0) };
            Some(Target { cluster: cluster_of(mesh, &d.destination, ns, port)?, weight })
        })
        .collect();
    let nonzero: Vec<Target> = all.iter().filter(|t| t.weight > 0).cloned().collect();
    if nonzero.is_empty() {
        all
    } else {
        nonzero
    }
}

/// The weighted upstreams of a VirtualService `tcp` route for a TCP Service port, if one
/// applies.
pub fn tcp_targets(mesh: &Mesh, svc: &ServiceInfo, port: u32) -> Option<Vec<Target>> {
    let vs = mesh.config.virtual_service_for(&svc.fqdn)?;
    let route = vs
        .spec
        .tcp
        .iter()
        .find(|r| r.matches.is_empty() || r.matches.iter().any(|m| m.port.is_none_or(|p| p == port)))?;
    let t = targets(mesh, &route.route, &vs.namespace, port);
    (!t.is_empty()).then_some(t)
}

/// The matches of an `http` entry that apply on `port` (`None`: the entry does not).
fn matches_on(r: &HttpRoute, port: u32) -> Option<Vec<Option<&HttpMatch>>> {
    if r.matches.is_empty() {
        return Some(vec![None]);
    }
    let m: Vec<Option<&HttpMatch>> = r.matches.iter().filter(|m| m.port.is_none_or(|p| p == port)).map(Some).collect();
    (!m.is_empty()).then_some(m)
}

/// Whether a route configuration of `port` has a fault (its listener then runs the fault
/// filter).
pub fn has_fault(mesh: &Mesh, port: u32) -> bool {
    mesh.services.by_fqdn.values().filter(|s| s.port(port).is_some_and(|p| p.protocol.is_http())).any(|s| {
        mesh.config
            .virtual_service_for(&s.fqdn)
            .is_some_and(|vs| vs.spec.http.iter().any(|r| r.fault.is_some() && matches_on(r, port).is_some()))
    })
}

fn string_matcher(m: &StringMatch) -> Option<StringMatcher> {
    let pattern = match m.get().ok()? {
        Match::Exact(s) => MatchPattern::Exact(s),
        Match::Prefix(s) => MatchPattern::Prefix(s),
        Match::Regex(s) => MatchPattern::SafeRegex(RegexMatcher { regex: s, ..Default::default() }),
    };
    Some(StringMatcher { match_pattern: Some(pattern), ignore_case: false })
}

fn header(name: &str, m: &StringMatch) -> Option<HeaderMatcher> {
    Some(HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(string_matcher(m)?)),
        ..Default::default()
    })
}

fn route_match(m: Option<&HttpMatch>) -> RouteMatch {
    let path = match m.and_then(|m| m.uri.as_ref()).and_then(|u| u.get().ok()) {
        Some(Match::Exact(p)) => PathSpecifier::Path(p),
        Some(Match::Prefix(p)) => PathSpecifier::Prefix(p),
        Some(Match::Regex(r)) => PathSpecifier::SafeRegex(RegexMatcher { regex: r, ..Default::default() }),
        None => PathSpecifier::Prefix("/".into()),
    };
    let mut headers: Vec<HeaderMatcher> = Vec::new();
    let mut query_parameters = Vec::new();
    if let Some(m) = m {
        headers.extend(m.method.as_ref().and_then(|x| header(":method", x)));
        headers.extend(m.headers.iter().filter_map(|(k, v)| header(k, v)));
        query_parameters = m
            .query_params
            .iter()
            .filter_map(|(k, v)| {
                Some(QueryParameterMatcher {
                    name: k.clone(),
                    query_parameter_match_specifier: Some(QueryParameterMatchSpecifier::StringMatch(string_matcher(
                        v,
                    )?)),
                })
            })
            .collect();
    }
    RouteMatch { path_specifier: Some(path), headers, query_parameters, ..Default::default() }
}

fn percent(p: Option<&Percent>) -> FractionalPercent {
    let v = p.map(|p| p.value).unwrap_or(100.0).clamp(0.0, 100.0);
    if v.fract() == 0.0 {
        FractionalPercent { numerator: v as u32, denominator: DenominatorType::Hundred as i32 }
    } else {
        FractionalPercent { numerator: (v * 10_000.0).round() as u32, denominator: DenominatorType::Million as i32 }
    }
}

fn fault(r: &HttpRoute) -> Option<HttpFault> {
    let f = r.fault.as_ref()?;
    let delay = f.delay.as_ref().and_then(|d| {
        let fixed = parse_duration(d.fixed_delay.as_deref()?).ok()?;
        Some(FaultDelay {
            fault_delay_secifier: Some(FaultDelaySecifier::FixedDelay(duration(fixed))),
            percentage: Some(percent(d.percentage.as_ref())),
        })
    });
    let abort = f.abort.as_ref().and_then(|a| {
        Some(FaultAbort {
            error_type: Some(ErrorType::HttpStatus(u32::try_from(a.http_status?).ok()?)),
            percentage: Some(percent(a.percentage.as_ref())),
            ..Default::default()
        })
    });
    Some(HttpFault { delay, abort, ..Default::default() })
}

fn retry_policy(r: &HttpRoute) -> Option<RetryPolicy> {
    let retries = r.retries.as_ref();
    let attempts = match retries.and_then(|r| r.attempts) {
        Some(n) => u32::try_from(n).unwrap_or(0),
        None => DEFAULT_RETRIES,
    };
    if attempts == 0 {
        return None;
    }
    let retry_on = retries.and_then(|r| r.retry_on.clone()).unwrap_or_else(|| DEFAULT_RETRY_ON.to_string());
    Some(RetryPolicy {
        retriable_status_codes: if retry_on.contains("retriable-status-codes") { vec![503] } else { vec![] },
        retry_on,
        num_retries: Some(u32v(attempts)),
        per_try_timeout: retries
            .and_then(|r| r.per_try_timeout.as_deref())
            .and_then(|t| parse_duration(t).ok())
            .map(duration),
        ..Default::default()
    })
}

fn action(mesh: &Mesh, vs: &VirtualService, r: &HttpRoute, m: Option<&HttpMatch>, port: u32) -> Option<RouteAction> {
    let t = targets(mesh, &r.route, &vs.namespace, port);
    let cluster_specifier = match t.as_slice() {
        [] => return None,
        [one] => ClusterSpecifier::Cluster(one.cluster.clone()),
        many => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: many
                .iter()
                .map(|t| ClusterWeight { name: t.cluster.clone(), weight: Some(u32v(t.weight)), ..Default::default() })
                .collect(),
            ..Default::default()
        }),
    };
    let mut a = RouteAction {
        cluster_specifier: Some(cluster_specifier),
        timeout: Some(duration(r.timeout.as_deref().and_then(|t| parse_duration(t).ok()).unwrap_or_default())),
        retry_policy: retry_policy(r),
        ..Default::default()
    };
    if let Some(uri) = r.rewrite.as_ref().and_then(|w| w.uri.clone()) {
        match m.and_then(|m| m.uri.as_ref()).and_then(|u| u.get().ok()) {
            Some(Match::Exact(p)) => {
                a.regex_rewrite = Some(RegexMatchAndSubstitute {
                    pattern: Some(RegexMatcher { regex: format!("^{}$", regex::escape(&p)), ..Default::default() }),
                    substitution: uri,
                })
            }
            Some(Match::Regex(re)) => {
                a.regex_rewrite = Some(RegexMatchAndSubstitute {
                    pattern: Some(RegexMatcher { regex: re, ..Default::default() }),
                    substitution: uri,
                })
            }
            _ => a.prefix_rewrite = uri,
        }
    }
    Some(a)
}

/// The routes of a VirtualService for a listener on `port`, in order.
pub fn http_routes(mesh: &Mesh, vs: &VirtualService, port: u32) -> Vec<Route> {
    let mut out = Vec::new();
    for r in &vs.spec.http {
        let Some(matches) = matches_on(r, port) else { continue };
        let per_filter: HashMap<String, envoy_types::pb::google::protobuf::Any> =
            fault(r).map(|f| (FAULT.to_string(), any(&f))).into_iter().collect();
        for m in matches {
            let Some(a) = action(mesh, vs, r, m, port) else { continue };
            out.push(Route {
                name: r.name.clone().unwrap_or_default(),
                r#match: Some(route_match(m)),
                action: Some(Action::Route(a)),
                typed_per_filter_config: per_filter.clone(),
                ..Default::default()
            });
        }
    }
    out
}

fn default_route(cluster: String) -> Route {
    Route {
        name: "default".into(),
        r#match: Some(RouteMatch { path_specifier: Some(PathSpecifier::Prefix("/".into())), ..Default::default() }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster)),
            timeout: Some(duration(std::time::Duration::ZERO)),
            retry_policy: retry_policy(&HttpRoute::default()),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn allow_any() -> VirtualHost {
    VirtualHost {
        name: "allow_any".into(),
        domains: vec!["*".into()],
        routes: vec![Route {
            name: "allow_any".into(),
            r#match: Some(RouteMatch { path_specifier: Some(PathSpecifier::Prefix("/".into())), ..Default::default() }),
            action: Some(Action::Route(RouteAction {
                cluster_specifier: Some(ClusterSpecifier::Cluster(super::PASSTHROUGH.into())),
                timeout: Some(duration(std::time::Duration::ZERO)),
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Every name a client in `namespace` may use for a Service on `port`, bare and with the
/// port.
pub fn domains(svc: &ServiceInfo, namespace: &str, port: u32) -> Vec<String> {
    let mut names = vec![
        svc.fqdn.clone(),
        format!("{}.{}.svc", svc.name, svc.namespace),
        format!("{}.{}", svc.name, svc.namespace),
    ];
    if svc.namespace == namespace {
        names.push(svc.name.clone());
    }
    if let Some(ip) = &svc.cluster_ip {
        names.push(ip.clone());
    }
    names.into_iter().flat_map(|n| [format!("{n}:{port}"), n]).collect()
}

/// The route configuration a listener on `port` names, for proxies in `namespace`.
pub fn route_configuration(mesh: &Mesh, namespace: &str, port: u32) -> RouteConfiguration {
    let mut virtual_hosts = Vec::new();
    for svc in mesh.services.by_fqdn.values() {
        if !svc.port(port).is_some_and(|p| p.protocol.is_http()) {
            continue;
        }
        let mut routes =
            mesh.config.virtual_service_for(&svc.fqdn).map(|vs| http_routes(mesh, vs, port)).unwrap_or_default();
        routes.push(default_route(outbound_cluster(port, "", &svc.fqdn)));
        virtual_hosts.push(VirtualHost {
            name: format!("{}:{port}", svc.fqdn),
            domains: domains(svc, namespace, port),
            routes,
            ..Default::default()
        });
    }
    virtual_hosts.push(allow_any());
    RouteConfiguration {
        name: port.to_string(),
        virtual_hosts,
        validate_clusters: Some(envoy_types::pb::google::protobuf::BoolValue { value: false }),
        ..Default::default()
    }
}

/// A route configuration pilot has nothing for: everything passes through.
pub fn empty(name: &str) -> RouteConfiguration {
    RouteConfiguration { name: name.to_string(), virtual_hosts: vec![allow_any()], ..Default::default() }
}

/// Every route configuration of proxies in `namespace`.
pub fn all(mesh: &Mesh, namespace: &str) -> Vec<RouteConfiguration> {
    super::listeners::http_ports(mesh).into_iter().map(|p| route_configuration(mesh, namespace, p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::testutil::*;
    use prost::Message;
    use serde_json::json;

    const REVIEWS: &str = "outbound|9080||reviews.default.svc.cluster.local";

    fn reviews_routes(vs: serde_json::Value, policy: serde_json::Value) -> Vec<Route> {
        let (svcs, slices, pods) = bookinfo();
        let mesh = mesh_full(&svcs, &slices, &pods, &[config("reviews", vs)], &[reviews_rule(policy)]);
        let rc = route_configuration(&mesh, "default", 9080);
        assert_eq!(rc.name, "9080");
        assert_eq!(rc.virtual_hosts.len(), 2);
        assert_eq!(rc.virtual_hosts[1].name, "allow_any");
        rc.virtual_hosts[0].routes.clone()
    }

    fn route_action(r: &Route) -> &RouteAction {
        match &r.action {
            Some(Action::Route(a)) => a,
            other => panic!("not a route action: {other:?}"),
        }
    }

    #[test]
    fn virtual_hosts_and_domains() {
        let (svcs, slices, pods) = bookinfo();
        let mesh = mesh_with(&svcs, &slices, &pods);
        let rc = route_configuration(&mesh, "default", 9080);
        let vh = &rc.virtual_hosts[0];
        assert_eq!(vh.name, "reviews.default.svc.cluster.local:9080");
        assert_eq!(
            vh.domains,
            vec![
                "reviews.default.svc.cluster.local:9080",
                "reviews.default.svc.cluster.local",
                "reviews.default.svc:9080",
                "reviews.default.svc",
                "reviews.default:9080",
                "reviews.default",
                "reviews:9080",
                "reviews",
                "10.96.0.10:9080",
                "10.96.0.10",
            ]
        );
        assert_eq!(vh.routes.len(), 1);
        let a = route_action(&vh.routes[0]);
        assert_eq!(a.cluster_specifier, Some(ClusterSpecifier::Cluster(REVIEWS.into())));
        assert_eq!(a.timeout, Some(duration(std::time::Duration::ZERO)));
        let retry = a.retry_policy.as_ref().unwrap();
        assert_eq!(retry.num_retries, Some(u32v(2)));
        assert_eq!(retry.retry_on, DEFAULT_RETRY_ON);
        let any = &rc.virtual_hosts[1];
        assert_eq!(any.domains, vec!["*"]);
        assert_eq!(
            route_action(&any.routes[0]).cluster_specifier,
            Some(ClusterSpecifier::Cluster("PassthroughCluster".into()))
        );
        // Another namespace does not get the short name.
        let other = route_configuration(&mesh, "prod", 9080);
        assert!(!other.virtual_hosts[0].domains.contains(&"reviews".to_string()));
        assert!(other.virtual_hosts[0].domains.contains(&"reviews.default".to_string()));
    }

    #[test]
    fn weighted_routes() {
        let routes = reviews_routes(
            json!({"hosts": ["reviews"], "http": [{"name": "split", "route": [
                {"destination": {"host": "reviews", "subset": "v1"}, "weight": 75},
                {"destination": {"host": "reviews", "subset": "v2"}, "weight": 25}]}]}),
            json!(null),
        );
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[0].name, "split");
        let Some(ClusterSpecifier::WeightedClusters(w)) = &route_action(&routes[0]).cluster_specifier else { panic!() };
        let got: Vec<(&str, u32)> =
            w.clusters.iter().map(|c| (c.name.as_str(), c.weight.as_ref().unwrap().value)).collect();
        assert_eq!(
            got,
            vec![
                ("outbound|9080|v1|reviews.default.svc.cluster.local", 75),
                ("outbound|9080|v2|reviews.default.svc.cluster.local", 25)
            ]
        );
        // The default route comes last.
        assert_eq!(route_action(&routes[1]).cluster_specifier, Some(ClusterSpecifier::Cluster(REVIEWS.into())));
    }

    #[test]
    fn uri_header_method_and_query_matches() {
        let routes = reviews_routes(
            json!({"hosts": ["reviews"], "http": [
                {"match": [{"uri": {"exact": "/login"}}, {"uri": {"regex": "/api/v[0-9]+/.*"}, "method": {"exact": "GET"},
                            "headers": {"end-user": {"prefix": "jas"}}, "queryParams": {"debug": {"exact": "1"}}}],
                 "route": [{"destination": {"host": "reviews", "subset": "v2"}}]},
                {"match": [{"uri": {"prefix": "/static"}}], "route": [{"destination": {"host": "reviews", "subset": "v1"}}]}]}),
            json!(null),
        );
        assert_eq!(routes.len(), 4);
        let m0 = routes[0].r#match.as_ref().unwrap();
        assert_eq!(m0.path_specifier, Some(PathSpecifier::Path("/login".into())));
        let m1 = routes[1].r#match.as_ref().unwrap();
        assert_eq!(
            m1.path_specifier,
            Some(PathSpecifier::SafeRegex(RegexMatcher { regex: "/api/v[0-9]+/.*".into(), ..Default::default() }))
        );
        let h: Vec<(&str, &Option<HeaderMatchSpecifier>)> =
            m1.headers.iter().map(|h| (h.name.as_str(), &h.header_match_specifier)).collect();
        assert_eq!(
            h,
            vec![
                (
                    ":method",
                    &Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
                        match_pattern: Some(MatchPattern::Exact("GET".into())),
                        ignore_case: false
                    }))
                ),
                (
                    "end-user",
                    &Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
                        match_pattern: Some(MatchPattern::Prefix("jas".into())),
                        ignore_case: false
                    }))
                ),
            ]
        );
        assert_eq!(m1.query_parameters[0].name, "debug");
        assert_eq!(routes[2].r#match.as_ref().unwrap().path_specifier, Some(PathSpecifier::Prefix("/static".into())));
        assert_eq!(
            route_action(&routes[2]).cluster_specifier,
            Some(ClusterSpecifier::Cluster("outbound|9080|v1|reviews.default.svc.cluster.local".into()))
        );
    }

    #[test]
    fn retries_timeout_and_rewrite() {
        let routes = reviews_routes(
            json!({"hosts": ["reviews"], "http": [
                {"match": [{"uri": {"prefix": "/old"}}], "rewrite": {"uri": "/new"}, "timeout": "1.5s",
                 "retries": {"attempts": 5, "perTryTimeout": "500ms", "retryOn": "5xx"},
                 "route": [{"destination": {"host": "reviews"}}]},
                {"match": [{"uri": {"exact": "/a"}}], "rewrite": {"uri": "/b"}, "retries": {"attempts": 0},
                 "route": [{"destination": {"host": "reviews"}}]}]}),
            json!(null),
        );
        let a = route_action(&routes[0]);
        assert_eq!(a.prefix_rewrite, "/new");
        assert_eq!(a.timeout, Some(duration(std::time::Duration::from_millis(1500))));
        let r = a.retry_policy.as_ref().unwrap();
        assert_eq!((r.retry_on.as_str(), r.num_retries), ("5xx", Some(u32v(5))));
        assert_eq!(r.per_try_timeout, Some(duration(std::time::Duration::from_millis(500))));
        let b = route_action(&routes[1]);
        assert_eq!(b.prefix_rewrite, "");
        let rr = b.regex_rewrite.as_ref().unwrap();
        assert_eq!(rr.pattern.as_ref().unwrap().regex, "^/a$");
        assert_eq!(rr.substitution, "/b");
        assert!(b.retry_policy.is_none());
    }

    #[test]
    fn faults_are_per_route_filter_config() {
        let routes = reviews_routes(
            json!({"hosts": ["reviews"], "http": [{"fault": {
                "delay": {"fixedDelay": "7s", "percentage": {"value": 50}},
                "abort": {"httpStatus": 503, "percentage": {"value": 0.5}}},
                "route": [{"destination": {"host": "reviews"}}]}]}),
            json!(null),
        );
        let cfg = &routes[0].typed_per_filter_config[FAULT];
        assert_eq!(cfg.type_url, "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault");
        let f = HttpFault::decode(cfg.value.as_slice()).unwrap();
        let d = f.delay.unwrap();
        assert_eq!(
            d.fault_delay_secifier,
            Some(FaultDelaySecifier::FixedDelay(duration(std::time::Duration::from_secs(7))))
        );
        assert_eq!(
            d.percentage,
            Some(FractionalPercent { numerator: 50, denominator: DenominatorType::Hundred as i32 })
        );
        let a = f.abort.unwrap();
        assert_eq!(a.error_type, Some(ErrorType::HttpStatus(503)));
        assert_eq!(
            a.percentage,
            Some(FractionalPercent { numerator: 5000, denominator: DenominatorType::Million as i32 })
        );
        assert!(routes[1].typed_per_filter_config.is_empty());
    }

    #[test]
    fn matches_for_other_ports_are_left_out() {
        let routes = reviews_routes(
            json!({"hosts": ["reviews"], "http": [
                {"match": [{"port": 8080, "uri": {"prefix": "/x"}}], "route": [{"destination": {"host": "reviews"}}]}]}),
            json!(null),
        );
        assert_eq!(routes.len(), 1);
        assert_eq!(routes[0].name, "default");
    }
}
