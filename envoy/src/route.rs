//! Routing an HTTP request: the virtual host by Host/`:authority`, then the first route
//! whose path, headers and query parameters match, and the path rewrite of the chosen route.

use std::borrow::Cow;

use http::{HeaderMap, Method};

use crate::config::{Forward, PathMatch, Route, RouteTable, StrPattern, ValueMatch, VirtualHost};

/// The parts of a request that routing reads.
pub struct RequestView<'a> {
    pub host: &'a str,
    pub method: &'a Method,
    /// The path without the query string.
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub scheme: &'a str,
    pub headers: &'a HeaderMap,
}

/// The virtual host for `host` (Host or `:authority`): exact domain (as given, then without
/// its port), then the longest `*.suffix`, then the longest `prefix.*`, then `*`.
pub fn virtual_host<'t>(t: &'t RouteTable, host: &str) -> Option<&'t VirtualHost> {
    let lower: Cow<'_, str> = if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    };
    let host = lower.as_ref();
    let without_port = strip_port(host);
    let i = t
        .exact
        .get(host)
        .or_else(|| t.exact.get(without_port))
        .copied()
        .or_else(|| {
            t.suffixes
                .iter()
                .find(|(s, _)| host.ends_with(s.as_str()) || without_port.ends_with(s.as_str()))
                .map(|x| x.1)
        })
        .or_else(|| t.prefixes.iter().find(|(p, _)| host.starts_with(p.as_str())).map(|x| x.1))
        .or(t.any)?;
    t.virtual_hosts.get(i)
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_once(']').map_or(host, |(h, _)| &host[..h.len() + 1]);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// The first route of `vh` that matches `req`.
pub fn find<'v>(vh: &'v VirtualHost, req: &RequestView<'_>) -> Option<&'v Route> {
    vh.routes.iter().find(|r| matches(r, req))
}

pub fn matches(r: &Route, req: &RequestView<'_>) -> bool {
    let path_ok = if r.case_sensitive {
        path_matches(&r.path, req.path)
    } else {
        path_matches(&r.path, &req.path.to_ascii_lowercase())
    };
    path_ok && r.headers.iter().all(|h| header_matches(h, req)) && r.query.iter().all(|q| query_matches(q, req.query))
}

fn path_matches(m: &PathMatch, path: &str) -> bool {
    match m {
        PathMatch::Prefix(p) => path.starts_with(p.as_str()),
        PathMatch::Exact(p) => path == p,
        PathMatch::Regex(re) => re.is_match(path),
    }
}

fn header_matches(h: &crate::config::HeaderMatch, req: &RequestView<'_>) -> bool {
    let value: Option<Cow<'_, str>> = match h.name.as_str() {
        ":method" => Some(Cow::Borrowed(req.method.as_str())),
        ":authority" | "host" => Some(Cow::Borrowed(req.host)),
        ":path" => Some(match req.query {
            Some(q) => Cow::Owned(format!("{}?{q}", req.path)),
            None => Cow::Borrowed(req.path),
        }),
        ":scheme" => Some(Cow::Borrowed(req.scheme)),
        name => {
            let mut values = req.headers.get_all(name).iter().filter_map(|v| v.to_str().ok());
            match (values.next(), values.next()) {
                (None, _) => None,
                (Some(one), None) => Some(Cow::Borrowed(one)),
                // Envoy matches multiple values joined by commas.
                (Some(first), Some(second)) => {
                    let mut joined = format!("{first},{second}");
                    for v in values {
                        joined.push(',');
                        joined.push_str(v);
                    }
                    Some(Cow::Owned(joined))
                }
            }
        }
    };
    let value = match value {
        None if h.missing_as_empty => Some(Cow::Borrowed("")),
        v => v,
    };
    let result = match (&h.matcher, value) {
        (ValueMatch::Present(want), v) => v.is_some() == *want,
        (ValueMatch::Str { .. }, None) => return false,
        (m, Some(v)) => value_matches(m, &v),
    };
    result != h.invert
}

fn query_matches(q: &crate::config::QueryMatch, query: Option<&str>) -> bool {
    let value = query.and_then(|qs| {
        qs.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == q.name).then_some(v)
        })
    });
    match (&q.matcher, value) {
        (ValueMatch::Present(want), v) => v.is_some() == *want,
        (_, None) => false,
        (m, Some(v)) => value_matches(m, v),
    }
}

fn value_matches(m: &ValueMatch, v: &str) -> bool {
    let ValueMatch::Str { pattern, ignore_case } = m else { return true };
    let lowered;
    let v = if *ignore_case && !matches!(pattern, StrPattern::Regex(_)) {
        lowered = v.to_ascii_lowercase();
        lowered.as_str()
    } else {
        v
    };
    match pattern {
        StrPattern::Exact(p) => v == p,
        StrPattern::Prefix(p) => v.starts_with(p.as_str()),
        StrPattern::Suffix(p) => v.ends_with(p.as_str()),
        StrPattern::Contains(p) => v.contains(p.as_str()),
        StrPattern::Regex(re) => re.is_match(v),
    }
}

/// The path (with its query) to send upstream after the route's rewrites; `None` = unchanged.
pub fn rewrite(route: &Route, fwd: &Forward, path: &str, query: Option<&str>) -> Option<String> {
    let new_path = if let Some(prefix) = &fwd.prefix_rewrite {
        let matched = match &route.path {
            PathMatch::Prefix(p) | PathMatch::Exact(p) => p.len().min(path.len()),
            PathMatch::Regex(_) => return None,
        };
        let rest = &path[matched..];
        // "/" rewritten onto "/x" must not give "//x".
        if prefix.ends_with('/') && rest.starts_with('/') {
            format!("{prefix}{}", &rest[1..])
        } else {
            format!("{prefix}{rest}")
        }
    } else if let Some((re, sub)) = &fwd.regex_rewrite {
        re.replace_all(path, sub.as_str()).into_owned()
    } else {
        return None;
    };
    Some(match query {
        Some(q) => format!("{new_path}?{q}"),
        None => new_path,
    })
}

#[cfg(test)]
#[allow(deprecated)]
mod tests {
    use super::*;
    use crate::config::tests::{prefix, regex_path, route_config, route_to};
    use crate::config::{Action, Resources};
    use envoy_types::pb::envoy::config::route::v3 as rpb;
    use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;

    fn table(rc: rpb::RouteConfiguration) -> std::sync::Arc<RouteTable> {
        let mut r = Resources::default();
        r.routes.insert(rc.name.clone(), rc);
        crate::config::build(&r, None).unwrap().routes.into_values().next().unwrap()
    }

    fn req<'a>(host: &'a str, path: &'a str, query: Option<&'a str>, headers: &'a HeaderMap) -> RequestView<'a> {
        RequestView { host, method: &Method::GET, path, query, scheme: "http", headers }
    }

    fn header(name: &str, m: rpb::header_matcher::HeaderMatchSpecifier) -> rpb::HeaderMatcher {
        rpb::HeaderMatcher { name: name.into(), header_match_specifier: Some(m), ..Default::default() }
    }

    fn with_headers(mut m: rpb::RouteMatch, h: Vec<rpb::HeaderMatcher>) -> rpb::RouteMatch {
        m.headers = h;
        m
    }

    #[test]
    fn virtual_host_by_domain() {
        let t = table(route_config(
            "80",
            vec![
                ("a", vec!["a.ns.svc.cluster.local", "a.ns.svc.cluster.local:80", "a", "a:80"], vec![]),
                ("wild", vec!["*.example.com"], vec![]),
                ("any", vec!["*"], vec![]),
            ],
        ));
        assert_eq!(virtual_host(&t, "a").unwrap().name, "a");
        assert_eq!(virtual_host(&t, "A:80").unwrap().name, "a");
        assert_eq!(virtual_host(&t, "a:8080").unwrap().name, "a", "falls back to the host without its port");
        assert_eq!(virtual_host(&t, "x.example.com").unwrap().name, "wild");
        assert_eq!(virtual_host(&t, "other").unwrap().name, "any");
    }

    #[test]
    fn first_matching_route_wins() {
        use rpb::header_matcher::HeaderMatchSpecifier as H;
        let t = table(route_config(
            "80",
            vec![(
                "v",
                vec!["*"],
                vec![
                    route_to(
                        "jason",
                        with_headers(prefix("/"), vec![header("end-user", H::ExactMatch("jason".into()))]),
                        "v2",
                    ),
                    route_to("api", prefix("/api"), "api"),
                    route_to("re", regex_path("/items/[0-9]+"), "items"),
                    route_to(
                        "post",
                        with_headers(prefix("/"), vec![header(":method", H::ExactMatch("POST".into()))]),
                        "posts",
                    ),
                    route_to(
                        "q",
                        {
                            let mut m = prefix("/");
                            m.query_parameters = vec![rpb::QueryParameterMatcher {
                                name: "v".into(),
                                query_parameter_match_specifier: Some(
                                    rpb::query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(
                                        mpb::StringMatcher {
                                            match_pattern: Some(mpb::string_matcher::MatchPattern::Exact("2".into())),
                                            ignore_case: false,
                                        },
                                    ),
                                ),
                            }];
                            m
                        },
                        "query",
                    ),
                    route_to("default", prefix("/"), "v1"),
                ],
            )],
        ));
        let vh = virtual_host(&t, "svc").unwrap();
        let name = |r: &RequestView<'_>| find(vh, r).map(|r| r.name.clone()).unwrap_or_default();
        let none = HeaderMap::new();
        let mut jason = HeaderMap::new();
        jason.insert("end-user", "jason".parse().unwrap());
        assert_eq!(name(&req("svc", "/api/x", None, &jason)), "jason");
        assert_eq!(name(&req("svc", "/api/x", None, &none)), "api");
        assert_eq!(name(&req("svc", "/items/12", None, &none)), "re");
        assert_eq!(name(&req("svc", "/items/12a", None, &none)), "default", "regex matches the whole path");
        assert_eq!(name(&req("svc", "/x", Some("a=1&v=2"), &none)), "q");
        assert_eq!(name(&req("svc", "/x", Some("v=3"), &none)), "default");
        let post = RequestView { method: &Method::POST, ..req("svc", "/x", None, &none) };
        assert_eq!(name(&post), "post");
    }

    #[test]
    fn prefix_and_regex_rewrites() {
        let mut r = route_to("r", prefix("/old"), "c");
        if let Some(rpb::route::Action::Route(ra)) = &mut r.action {
            ra.prefix_rewrite = "/new".into();
        }
        let mut r2 = route_to("r2", prefix("/v1/"), "c");
        if let Some(rpb::route::Action::Route(ra)) = &mut r2.action {
            ra.regex_rewrite = Some(mpb::RegexMatchAndSubstitute {
                pattern: Some(mpb::RegexMatcher { regex: "^/v1/(.*)$".into(), ..Default::default() }),
                substitution: r"/v2/\1".into(),
            });
        }
        let mut r3 = route_to("r3", prefix("/strip/"), "c");
        if let Some(rpb::route::Action::Route(ra)) = &mut r3.action {
            ra.prefix_rewrite = "/".into();
        }
        let t = table(route_config("80", vec![("v", vec!["*"], vec![r, r2, r3])]));
        let routes = &t.virtual_hosts[0].routes;
        let fwd = |i: usize| match &routes[i].action {
            Action::Forward(f) => f,
            _ => panic!(),
        };
        assert_eq!(rewrite(&routes[0], fwd(0), "/old/x", Some("q=1")).as_deref(), Some("/new/x?q=1"));
        assert_eq!(rewrite(&routes[1], fwd(1), "/v1/a/b", None).as_deref(), Some("/v2/a/b"));
        assert_eq!(rewrite(&routes[2], fwd(2), "/strip/x", None).as_deref(), Some("/x"));
    }
}
