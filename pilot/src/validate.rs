//! What the CRD schema cannot say about a VirtualService or DestinationRule: weights that
//! sum to 100, regexes that compile, durations that parse, hosts that are Services, subsets
//! that a DestinationRule defines. Pure.
//!
//! [`Accepted`] remembers the last valid version of every object: an object whose current
//! version is invalid keeps its last valid version in effect (sidecars keep what they had),
//! and gets the messages of its [`Verdict`] in its status and a Warning event.
//!
//! Messages use Istio's analysis codes: `IST0101 ReferencedResourceNotFound` (a host that is
//! no Service, a subset no DestinationRule defines) and `IST0106 SchemaValidationError`
//! (everything else).

use std::collections::{BTreeSet, HashMap};

use crate::model::{
    parse_duration, resolve_host, ConfigObject, DestinationRule, DestinationRuleSpec, HttpRoute, Key, MeshConfig,
    RouteDestination, ServiceIndex, TrafficPolicy, VirtualService, VirtualServiceSpec,
};

/// One problem with an object (Istio's `validationMessages[]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Message {
    pub code: &'static str,
    pub name: &'static str,
    pub description: String,
}

impl Message {
    fn schema(description: impl Into<String>) -> Message {
        Message { code: "IST0106", name: "SchemaValidationError", description: description.into() }
    }
    fn not_found(description: impl Into<String>) -> Message {
        Message { code: "IST0101", name: "ReferencedResourceNotFound", description: description.into() }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    VirtualService,
    DestinationRule,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::VirtualService => "VirtualService",
            Kind::DestinationRule => "DestinationRule",
        }
    }
}

/// The outcome of validating one object's current version.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub generation: i64,
    /// Empty when the object is valid (and in effect).
    pub messages: Vec<Message>,
}

impl Verdict {
    pub fn valid(&self) -> bool {
        self.messages.is_empty()
    }
}

/// The last valid version of every VirtualService and DestinationRule.
#[derive(Clone, Debug, Default)]
pub struct Accepted {
    virtual_services: HashMap<Key, VirtualService>,
    destination_rules: HashMap<Key, DestinationRule>,
}

impl Accepted {
    /// Whether a version of this object is in effect.
    pub fn in_effect(&self, kind: Kind, key: &Key) -> bool {
        match kind {
            Kind::VirtualService => self.virtual_services.contains_key(key),
            Kind::DestinationRule => self.destination_rules.contains_key(key),
        }
    }

    /// Validate the current objects; keep the valid ones, keep the last valid version of
    /// the invalid ones, forget the deleted ones. The configuration in effect and a verdict
    /// per object.
    pub fn reconcile(
        &mut self,
        virtual_services: &[ConfigObject],
        destination_rules: &[ConfigObject],
        services: &ServiceIndex,
    ) -> (MeshConfig, Vec<Verdict>) {
        let domain = services.domain.as_str();
        let mut verdicts = Vec::new();

        let present: BTreeSet<Key> = destination_rules.iter().map(ConfigObject::key).collect();
        self.destination_rules.retain(|k, _| present.contains(k));
        for obj in destination_rules {
            let messages = match parse_destination_rule(obj, domain) {
                Ok(dr) => {
                    let m = validate_destination_rule(&dr.spec);
                    if m.is_empty() {
                        self.destination_rules.insert(obj.key(), dr);
                    }
                    m
                }
                Err(m) => vec![m],
            };
            verdicts.push(verdict(Kind::DestinationRule, obj, messages));
        }
        let mut rules: Vec<DestinationRule> = self.destination_rules.values().cloned().collect();
        rules.sort_by(|a, b| (&a.created, &a.namespace, &a.name).cmp(&(&b.created, &b.namespace, &b.name)));

        let present: BTreeSet<Key> = virtual_services.iter().map(ConfigObject::key).collect();
        self.virtual_services.retain(|k, _| present.contains(k));
        for obj in virtual_services {
            let messages = match parse_virtual_service(obj, domain) {
                Ok(vs) => {
                    let m = validate_virtual_service(&vs, services, &rules);
                    if m.is_empty() {
                        self.virtual_services.insert(obj.key(), vs);
                    }
                    m
                }
                Err(m) => vec![m],
            };
            verdicts.push(verdict(Kind::VirtualService, obj, messages));
        }
        let mut vss: Vec<VirtualService> = self.virtual_services.values().cloned().collect();
        vss.sort_by(|a, b| (&a.created, &a.namespace, &a.name).cmp(&(&b.created, &b.namespace, &b.name)));

        (MeshConfig { virtual_services: vss, destination_rules: rules }, verdicts)
    }
}

fn verdict(kind: Kind, obj: &ConfigObject, messages: Vec<Message>) -> Verdict {
    Verdict {
        kind,
        namespace: obj.namespace.clone(),
        name: obj.name.clone(),
        uid: obj.uid.clone(),
        generation: obj.generation,
        messages,
    }
}

pub fn parse_virtual_service(obj: &ConfigObject, domain: &str) -> Result<VirtualService, Message> {
    let spec: VirtualServiceSpec =
        serde_json::from_value(obj.spec.clone()).map_err(|e| Message::schema(format!("spec: {e}")))?;
    let hosts = spec.hosts.iter().map(|h| resolve_host(h, &obj.namespace, domain)).collect();
    Ok(VirtualService {
        namespace: obj.namespace.clone(),
        name: obj.name.clone(),
        created: obj.created.clone(),
        spec,
        hosts,
    })
}

pub fn parse_destination_rule(obj: &ConfigObject, domain: &str) -> Result<DestinationRule, Message> {
    let spec: DestinationRuleSpec =
        serde_json::from_value(obj.spec.clone()).map_err(|e| Message::schema(format!("spec: {e}")))?;
    let host = resolve_host(&spec.host, &obj.namespace, domain);
    Ok(DestinationRule {
        namespace: obj.namespace.clone(),
        name: obj.name.clone(),
        created: obj.created.clone(),
        spec,
        host,
    })
}

fn check_duration(out: &mut Vec<Message>, field: &str, value: Option<&String>) {
    if let Some(v) = value {
        if let Err(e) = parse_duration(v) {
            out.push(Message::schema(format!("{field}: {e}")));
        }
    }
}

/// A duration Envoy requires to be more than zero.
fn check_positive_duration(out: &mut Vec<Message>, field: &str, value: Option<&String>) {
    if let Some(v) = value {
        match parse_duration(v) {
            Err(e) => out.push(Message::schema(format!("{field}: {e}"))),
            Ok(d) if d < std::time::Duration::from_millis(1) => {
                out.push(Message::schema(format!("{field}: {v} is less than 1ms")))
            }
            Ok(_) => {}
        }
    }
}

fn check_non_negative(out: &mut Vec<Message>, field: &str, value: Option<i64>) {
    if let Some(v) = value {
        if !(0..=i64::from(u32::MAX)).contains(&v) {
            out.push(Message::schema(format!("{field}: {v} is out of range")));
        }
    }
}

/// The load balancer names Istio's `simple` takes.
pub const LOAD_BALANCERS: &[&str] =
    &["UNSPECIFIED", "LEAST_CONN", "RANDOM", "PASSTHROUGH", "ROUND_ROBIN", "LEAST_REQUEST"];

fn validate_policy(out: &mut Vec<Message>, at: &str, p: &TrafficPolicy) {
    if let Some(simple) = p.load_balancer.as_ref().and_then(|l| l.simple.as_deref()) {
        if !LOAD_BALANCERS.contains(&simple) {
            out.push(Message::schema(format!("{at}.loadBalancer.simple: unknown load balancer {simple:?}")));
        }
    }
    if let Some(pool) = &p.connection_pool {
        if let Some(tcp) = &pool.tcp {
            check_non_negative(out, &format!("{at}.connectionPool.tcp.maxConnections"), tcp.max_connections);
            check_positive_duration(
                out,
                &format!("{at}.connectionPool.tcp.connectTimeout"),
                tcp.connect_timeout.as_ref(),
            );
        }
        if let Some(http) = &pool.http {
            let f = |n: &str| format!("{at}.connectionPool.http.{n}");
            check_non_negative(out, &f("http1MaxPendingRequests"), http.http1_max_pending_requests);
            check_non_negative(out, &f("http2MaxRequests"), http.http2_max_requests);
            check_non_negative(out, &f("maxRetries"), http.max_retries);
        }
    }
    if let Some(o) = &p.outlier_detection {
        let f = |n: &str| format!("{at}.outlierDetection.{n}");
        check_non_negative(out, &f("consecutive5xxErrors"), o.consecutive_5xx_errors);
        check_positive_duration(out, &f("interval"), o.interval.as_ref());
        check_positive_duration(out, &f("baseEjectionTime"), o.base_ejection_time.as_ref());
        if let Some(p) = o.max_ejection_percent {
            if !(0..=100).contains(&p) {
                out.push(Message::schema(format!("{}: {p} is not a percentage", f("maxEjectionPercent"))));
            }
        }
    }
}

pub fn validate_destination_rule(spec: &DestinationRuleSpec) -> Vec<Message> {
    let mut out = Vec::new();
    if spec.host.is_empty() {
        out.push(Message::schema("host: required"));
    }
    if let Some(p) = &spec.traffic_policy {
        validate_policy(&mut out, "trafficPolicy", p);
    }
    let mut names = BTreeSet::new();
    for (i, s) in spec.subsets.iter().enumerate() {
        if s.name.is_empty() {
            out.push(Message::schema(format!("subsets[{i}].name: required")));
        } else if !names.insert(s.name.as_str()) {
            out.push(Message::schema(format!("subsets[{i}].name: duplicate subset {:?}", s.name)));
        }
        if let Some(p) = &s.traffic_policy {
            validate_policy(&mut out, &format!("subsets[{i}].trafficPolicy"), p);
        }
    }
    out
}

fn check_percent(out: &mut Vec<Message>, field: &str, value: Option<f64>) {
    if let Some(v) = value {
        if !(0.0..=100.0).contains(&v) {
            out.push(Message::schema(format!("{field}: {v} is not a percentage")));
        }
    }
}

fn validate_destinations(
    out: &mut Vec<Message>,
    at: &str,
    route: &[RouteDestination],
    vs: &VirtualService,
    services: &ServiceIndex,
    rules: &[DestinationRule],
) {
    if route.is_empty() {
        out.push(Message::schema(format!("{at}.route: at least one destination is required")));
    }
    if route.len() > 1 {
        let mut sum = 0i64;
        for (i, d) in route.iter().enumerate() {
            let w = d.weight.unwrap_or(0);
            if !(0..=100).contains(&w) {
                out.push(Message::schema(format!("{at}.route[{i}].weight: {w} is not between 0 and 100")));
            }
            sum += w;
        }
        if sum != 100 {
            out.push(Message::schema(format!("{at}.route: weights sum to {sum}, not 100")));
        }
    }
    for (i, d) in route.iter().enumerate() {
        let host = resolve_host(&d.destination.host, &vs.namespace, &services.domain);
        let Some(svc) = services.get(&host) else {
            out.push(Message::not_found(format!(
                "{at}.route[{i}].destination.host: referenced host not found: {:?}",
                d.destination.host
            )));
            continue;
        };
        if let Some(p) = &d.destination.port {
            if svc.port(p.number).is_none() {
                out.push(Message::not_found(format!(
                    "{at}.route[{i}].destination.port: service {host} has no port {}",
                    p.number
                )));
            }
        }
        if let Some(subset) = &d.destination.subset {
            let defined = rules.iter().find(|r| r.host == host).is_some_and(|r| r.subset(subset).is_some());
            if !defined {
                out.push(Message::not_found(format!(
                    "{at}.route[{i}].destination: referenced host+subset in destinationrule not found: \"{host}+{subset}\""
                )));
            }
        }
    }
}

fn validate_http(
    out: &mut Vec<Message>,
    i: usize,
    r: &HttpRoute,
    vs: &VirtualService,
    s: &ServiceIndex,
    rules: &[DestinationRule],
) {
    let at = format!("http[{i}]");
    for (j, m) in r.matches.iter().enumerate() {
        let mut matches = Vec::new();
        if let Some(u) = &m.uri {
            matches.push((format!("{at}.match[{j}].uri"), u));
        }
        if let Some(u) = &m.method {
            matches.push((format!("{at}.match[{j}].method"), u));
        }
        for (h, u) in &m.headers {
            matches.push((format!("{at}.match[{j}].headers.{h}"), u));
        }
        for (q, u) in &m.query_params {
            matches.push((format!("{at}.match[{j}].queryParams.{q}"), u));
        }
        for (field, sm) in matches {
            match sm.get() {
                Err(e) => out.push(Message::schema(format!("{field}: {e}"))),
                Ok(crate::model::Match::Regex(re)) => {
                    if let Err(e) = regex::Regex::new(&re) {
                        out.push(Message::schema(format!("{field}.regex: {e}")));
                    }
                }
                Ok(_) => {}
            }
        }
    }
    validate_destinations(out, &at, &r.route, vs, s, rules);
    check_duration(out, &format!("{at}.timeout"), r.timeout.as_ref());
    if let Some(retries) = &r.retries {
        check_non_negative(out, &format!("{at}.retries.attempts"), retries.attempts);
        check_duration(out, &format!("{at}.retries.perTryTimeout"), retries.per_try_timeout.as_ref());
    }
    if let Some(f) = &r.fault {
        if let Some(d) = &f.delay {
            match &d.fixed_delay {
                None => out.push(Message::schema(format!("{at}.fault.delay.fixedDelay: required"))),
                Some(v) => check_positive_duration(out, &format!("{at}.fault.delay.fixedDelay"), Some(v)),
            }
            check_percent(out, &format!("{at}.fault.delay.percentage.value"), d.percentage.as_ref().map(|p| p.value));
        }
        if let Some(a) = &f.abort {
            match a.http_status {
                Some(code) if (200..=599).contains(&code) => {}
                Some(code) => out.push(Message::schema(format!("{at}.fault.abort.httpStatus: invalid status {code}"))),
                None => out.push(Message::schema(format!("{at}.fault.abort.httpStatus: required"))),
            }
            check_percent(out, &format!("{at}.fault.abort.percentage.value"), a.percentage.as_ref().map(|p| p.value));
        }
    }
}

pub fn validate_virtual_service(
    vs: &VirtualService,
    services: &ServiceIndex,
    rules: &[DestinationRule],
) -> Vec<Message> {
    let mut out = Vec::new();
    if vs.spec.hosts.is_empty() {
        out.push(Message::schema("hosts: at least one host is required"));
    }
    for (i, r) in vs.spec.http.iter().enumerate() {
        validate_http(&mut out, i, r, vs, services, rules);
    }
    for (i, r) in vs.spec.tcp.iter().enumerate() {
        validate_destinations(&mut out, &format!("tcp[{i}]"), &r.route, vs, services, rules);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;

    fn services() -> ServiceIndex {
        let svc = |name: &str| -> Service {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"clusterIP": "10.96.0.10", "selector": {"app": name}, "ports": [{"name": "http", "port": 9080}]}
            }))
            .unwrap()
        };
        ServiceIndex::build(&[svc("reviews"), svc("ratings")], "cluster.local")
    }

    fn obj(name: &str, generation: i64, spec: serde_json::Value) -> ConfigObject {
        ConfigObject {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            generation,
            created: "2026-01-01T00:00:00Z".into(),
            spec,
        }
    }

    fn dr() -> ConfigObject {
        obj(
            "reviews",
            1,
            json!({"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]}),
        )
    }

    fn weighted(w1: i64, w2: i64) -> serde_json::Value {
        json!({"hosts": ["reviews"], "http": [{"route": [
            {"destination": {"host": "reviews", "subset": "v1"}, "weight": w1},
            {"destination": {"host": "reviews", "subset": "v2"}, "weight": w2}]}]})
    }

    #[test]
    fn a_valid_virtual_service_is_accepted() {
        let mut acc = Accepted::default();
        let (cfg, verdicts) = acc.reconcile(&[obj("reviews", 1, weighted(80, 20))], &[dr()], &services());
        assert!(verdicts.iter().all(Verdict::valid), "{verdicts:?}");
        assert_eq!(cfg.virtual_services.len(), 1);
        assert_eq!(cfg.virtual_services[0].hosts, vec!["reviews.default.svc.cluster.local"]);
        assert_eq!(cfg.destination_rules[0].host, "reviews.default.svc.cluster.local");
    }

    #[test]
    fn weights_must_sum_to_100() {
        let mut acc = Accepted::default();
        let (cfg, verdicts) = acc.reconcile(&[obj("reviews", 1, weighted(80, 30))], &[dr()], &services());
        assert!(cfg.virtual_services.is_empty());
        let vs = verdicts.iter().find(|v| v.kind == Kind::VirtualService).unwrap();
        assert_eq!(vs.messages.len(), 1);
        assert_eq!(vs.messages[0].code, "IST0106");
        assert!(vs.messages[0].description.contains("sum to 110"), "{:?}", vs.messages);
    }

    #[test]
    fn an_invalid_version_keeps_the_last_valid_one_in_effect() {
        let mut acc = Accepted::default();
        acc.reconcile(&[obj("reviews", 1, weighted(80, 20))], &[dr()], &services());
        let (cfg, verdicts) = acc.reconcile(&[obj("reviews", 2, weighted(50, 60))], &[dr()], &services());
        assert!(!verdicts.iter().find(|v| v.kind == Kind::VirtualService).unwrap().valid());
        assert_eq!(cfg.virtual_services.len(), 1);
        assert_eq!(cfg.virtual_services[0].spec.http[0].route[0].weight, Some(80));
        // Deleting the object forgets it.
        let (cfg, _) = acc.reconcile(&[], &[dr()], &services());
        assert!(cfg.virtual_services.is_empty());
    }

    #[test]
    fn unknown_subsets_and_hosts_are_not_found() {
        let mut acc = Accepted::default();
        let spec = json!({"hosts": ["reviews"], "http": [
            {"route": [{"destination": {"host": "reviews", "subset": "v3"}}]},
            {"route": [{"destination": {"host": "details"}}]}]});
        let (cfg, verdicts) = acc.reconcile(&[obj("reviews", 1, spec)], &[dr()], &services());
        assert!(cfg.virtual_services.is_empty());
        let vs = verdicts.iter().find(|v| v.kind == Kind::VirtualService).unwrap();
        let codes: Vec<&str> = vs.messages.iter().map(|m| m.code).collect();
        assert_eq!(codes, vec!["IST0101", "IST0101"]);
        assert!(vs.messages[0].description.contains("reviews.default.svc.cluster.local+v3"));
        assert!(vs.messages[1].description.contains("\"details\""));
    }

    #[test]
    fn regexes_must_compile_and_matches_have_one_kind() {
        let mut acc = Accepted::default();
        let spec = json!({"hosts": ["reviews"], "http": [
            {"match": [{"uri": {"regex": "/(unclosed"}}, {"headers": {"x": {"exact": "a", "prefix": "b"}}}],
             "route": [{"destination": {"host": "reviews"}}], "timeout": "soon"}]});
        let (_, verdicts) = acc.reconcile(&[obj("reviews", 1, spec)], &[], &services());
        let m = &verdicts[0].messages;
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(m[0].description.starts_with("http[0].match[0].uri.regex"));
        assert!(m[1].description.contains("only one of"));
        assert!(m[2].description.starts_with("http[0].timeout"));
    }

    #[test]
    fn destination_rules_are_validated() {
        let mut acc = Accepted::default();
        let bad = obj(
            "reviews",
            1,
            json!({"host": "reviews", "trafficPolicy": {"loadBalancer": {"simple": "FASTEST"},
                   "outlierDetection": {"interval": "often", "baseEjectionTime": "0s", "maxEjectionPercent": 150}},
                   "subsets": [{"name": "v1"}, {"name": "v1"}]}),
        );
        let (cfg, verdicts) = acc.reconcile(&[], &[bad], &services());
        assert!(cfg.destination_rules.is_empty());
        assert_eq!(verdicts[0].messages.len(), 5, "{:?}", verdicts[0].messages);
    }

    #[test]
    fn a_wrongly_typed_spec_is_a_schema_error() {
        let mut acc = Accepted::default();
        let (_, verdicts) = acc.reconcile(&[obj("x", 1, json!({"hosts": "reviews"}))], &[], &services());
        assert_eq!(verdicts[0].messages[0].code, "IST0106");
    }
}
