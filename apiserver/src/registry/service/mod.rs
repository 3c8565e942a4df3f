//! Services: defaults, validation, and cluster IP / node port allocation ([`allocation`],
//! written in the same transaction as the Service through the strategy's transaction hook).

pub mod allocation;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use serde_json::{json, Value};

use storage::{KeyValue, Op};

use super::{common_field_value, default_at, str_at, ClusterConfig, Strategy};
use crate::error::{ApiResult, FieldError};
use crate::validation::NameRule;

pub struct ServiceStrategy;

const TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];

pub fn service_type(obj: &Value) -> &str {
    str_at(obj, "/spec/type").unwrap_or("ClusterIP")
}

fn uses_node_ports(obj: &Value) -> bool {
    matches!(service_type(obj), "NodePort" | "LoadBalancer")
}

/// Whether a Service needs a health check node port (Kubernetes' `NeedsHealthCheck`): a
/// LoadBalancer whose external traffic stays on the node that receives it, so the load
/// balancer must ask each node whether it has endpoints.
pub fn needs_health_check(obj: &Value) -> bool {
    service_type(obj) == "LoadBalancer" && str_at(obj, "/spec/externalTrafficPolicy") == Some("Local")
}

/// `spec.healthCheckNodePort` as a number, 0 when unset (the API's "none").
fn health_check_node_port(obj: &Value) -> i64 {
    obj.pointer("/spec/healthCheckNodePort").and_then(Value::as_i64).unwrap_or(0)
}

/// The health check node port a Service holds in the node port range: set and needed.
pub fn held_health_check_node_port(obj: &Value) -> Option<i64> {
    Some(health_check_node_port(obj)).filter(|p| *p != 0 && needs_health_check(obj))
}

/// Whether a Service needs a health check node port allocated: it needs one and names none.
pub fn wants_health_check_node_port(obj: &Value) -> bool {
    needs_health_check(obj) && health_check_node_port(obj) == 0
}

const EXTERNAL_TRAFFIC_POLICIES: &[&str] = &["Cluster", "Local"];

impl Strategy for ServiceStrategy {
    /// Kubernetes answers a delete with the deleted Service.
    fn return_deleted_object(&self) -> bool {
        true
    }
    fn name_rule(&self) -> NameRule {
        NameRule::Dns1035Label
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        default_at(obj, "/spec/type", json!("ClusterIP"));
        default_at(obj, "/spec/sessionAffinity", json!("None"));
        if service_type(obj) != "ExternalName" {
            default_at(obj, "/spec/ipFamilies", json!(["IPv4"]));
            default_at(obj, "/spec/ipFamilyPolicy", json!("SingleStack"));
            default_at(obj, "/spec/internalTrafficPolicy", json!("Cluster"));
        }
        if uses_node_ports(obj) {
            default_at(obj, "/spec/externalTrafficPolicy", json!("Cluster"));
        }
        if let Some(ports) = obj.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
            for p in ports {
                default_at(p, "/protocol", json!("TCP"));
                if p.get("targetPort").is_none_or(Value::is_null) {
                    if let Some(port) = p.get("port").cloned() {
                        p["targetPort"] = port;
                    }
                }
            }
        }
        // clusterIPs mirrors clusterIP.
        if let Some(ip) = str_at(obj, "/spec/clusterIP").map(String::from).filter(|s| !s.is_empty()) {
            default_at(obj, "/spec/clusterIPs", json!([ip]));
        } else if let Some(first) = obj.pointer("/spec/clusterIPs/0").and_then(Value::as_str).map(String::from) {
            super::set_at(obj, "/spec/clusterIP", json!(first));
        }
        obj["status"] = json!({"loadBalancer": {}});
    }

    fn prepare_for_update(&self, new: &mut Value, old: &Value) {
        // Allocated values carry over when the client leaves them empty (kubectl replace).
        if service_type(new) != "ExternalName" && service_type(old) != "ExternalName" {
            for f in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy", "internalTrafficPolicy"] {
                let empty =
                    new.pointer(&format!("/spec/{f}")).is_none_or(|v| v.is_null() || v == "" || v == &json!([]));
                if empty {
                    if let Some(v) = old.pointer(&format!("/spec/{f}")).cloned() {
                        super::set_at(new, &format!("/spec/{f}"), v);
                    }
                }
            }
        }
        let old_ports: Vec<Value> = old.pointer("/spec/ports").and_then(Value::as_array).cloned().unwrap_or_default();
        let keep_node_ports = uses_node_ports(new);
        let type_changed_away = uses_node_ports(old) && !uses_node_ports(new);
        if let Some(ports) = new.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
            for p in ports.iter_mut() {
                default_at(p, "/protocol", json!("TCP"));
                if p.get("targetPort").is_none_or(Value::is_null) {
                    if let Some(port) = p.get("port").cloned() {
                        p["targetPort"] = port;
                    }
                }
                let same =
                    old_ports.iter().find(|o| o.get("port") == p.get("port") && o.get("protocol") == p.get("protocol"));
                if keep_node_ports && p.get("nodePort").is_none_or(Value::is_null) {
                    if let Some(np) = same.and_then(|o| o.get("nodePort")).cloned() {
                        p["nodePort"] = np;
                    }
                }
                // Changing type away from NodePort/LoadBalancer drops the old node ports.
                if type_changed_away
                    && p.get("nodePort").is_some()
                    && p.get("nodePort") == same.and_then(|o| o.get("nodePort"))
                {
                    if let Some(m) = p.as_object_mut() {
                        m.remove("nodePort");
                    }
                }
            }
        }
        if uses_node_ports(new) {
            default_at(new, "/spec/externalTrafficPolicy", json!("Cluster"));
        }
        default_at(new, "/spec/sessionAffinity", json!("None"));
        // The health check node port stays while it is needed and the client left it
        // empty; it goes with the need when the client left it as it was (it is freed by
        // the allocation). A changed value is the client's, and validation judges it.
        let (needed, needs) = (needs_health_check(old), needs_health_check(new));
        if needed && needs && health_check_node_port(new) == 0 {
            if let Some(port) = old.pointer("/spec/healthCheckNodePort").cloned() {
                super::set_at(new, "/spec/healthCheckNodePort", port);
            }
        }
        if needed && !needs && health_check_node_port(new) == health_check_node_port(old) {
            if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove("healthCheckNodePort");
            }
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let ty = service_type(obj);
        if !TYPES.contains(&ty) {
            errs.push(FieldError::not_supported("spec.type", &json!(ty), TYPES));
            return errs;
        }
        let cluster_ip = str_at(obj, "/spec/clusterIP").unwrap_or_default();
        let headless = cluster_ip == "None";
        let ports = obj.pointer("/spec/ports").and_then(Value::as_array).cloned().unwrap_or_default();
        if ty == "ExternalName" {
            let en = str_at(obj, "/spec/externalName").unwrap_or_default();
            if en.is_empty() {
                errs.push(FieldError::required("spec.externalName", ""));
            }
        } else if ports.is_empty() && !headless {
            errs.push(FieldError::required("spec.ports", ""));
        }
        if !cluster_ip.is_empty() && !headless && cluster_ip.parse::<Ipv4Addr>().is_err() {
            errs.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                &json!(cluster_ip),
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            ));
        }
        if headless && uses_node_ports(obj) {
            errs.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                &json!("None"),
                "may not be set to 'None' for LoadBalancer or NodePort services",
            ));
        }
        let mut names = BTreeSet::new();
        let mut seen = BTreeSet::new();
        for (i, p) in ports.iter().enumerate() {
            let path = format!("spec.ports[{i}]");
            let name = str_at(p, "/name").unwrap_or_default();
            if ports.len() > 1 && name.is_empty() {
                errs.push(FieldError::required(format!("{path}.name"), ""));
            }
            if !name.is_empty() {
                if let Some(m) = crate::validation::dns1123_label_errors(name) {
                    errs.push(FieldError::invalid(format!("{path}.name"), &json!(name), &m));
                }
                if !names.insert(name.to_string()) {
                    errs.push(FieldError::duplicate(format!("{path}.name"), &json!(name)));
                }
            }
            let port = p.get("port").and_then(Value::as_i64);
            match port {
                Some(n) if (1..=65535).contains(&n) => {}
                Some(n) => errs.push(FieldError::invalid(
                    format!("{path}.port"),
                    &json!(n),
                    "must be between 1 and 65535, inclusive",
                )),
                None => errs.push(FieldError::required(format!("{path}.port"), "")),
            }
            let proto = str_at(p, "/protocol").unwrap_or("TCP");
            if !["TCP", "UDP", "SCTP"].contains(&proto) {
                errs.push(FieldError::not_supported(
                    format!("{path}.protocol"),
                    &json!(proto),
                    &["SCTP", "TCP", "UDP"],
                ));
            }
            if !seen.insert((port, proto.to_string())) {
                errs.push(FieldError::duplicate(format!("{path}"), &json!({"port": port, "protocol": proto})));
            }
            if let Some(np) = p.get("nodePort").and_then(Value::as_i64) {
                if !uses_node_ports(obj) {
                    errs.push(FieldError::forbidden(
                        format!("{path}.nodePort"),
                        &format!("may not be used when `type` is '{ty}'"),
                    ));
                } else if !(1..=65535).contains(&np) {
                    errs.push(FieldError::invalid(
                        format!("{path}.nodePort"),
                        &json!(np),
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            }
            match p.get("targetPort") {
                Some(Value::Number(n)) if !(1..=65535).contains(&n.as_i64().unwrap_or(0)) => {
                    errs.push(FieldError::invalid(
                        format!("{path}.targetPort"),
                        &Value::Number(n.clone()),
                        "must be between 1 and 65535, inclusive",
                    ))
                }
                Some(Value::String(s)) if crate::validation::dns1123_label_errors(s).is_some() || s.len() > 15 => errs
                    .push(FieldError::invalid(
                        format!("{path}.targetPort"),
                        &json!(s),
                        "must contain at most 15 characters and be a valid IANA service name",
                    )),
                _ => {}
            }
        }
        if let Some(policy) = str_at(obj, "/spec/externalTrafficPolicy") {
            if !EXTERNAL_TRAFFIC_POLICIES.contains(&policy) {
                errs.push(FieldError::not_supported(
                    "spec.externalTrafficPolicy",
                    &json!(policy),
                    EXTERNAL_TRAFFIC_POLICIES,
                ));
            }
        }
        // Only the allowed combination is checked here: a port that is needed is checked
        // against the node port range when it is allocated, as Kubernetes does.
        let hc_port = health_check_node_port(obj);
        if hc_port != 0 && !needs_health_check(obj) {
            errs.push(FieldError::invalid(
                "spec.healthCheckNodePort",
                &json!(hc_port),
                "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
            ));
        }
        errs.extend(source_range_errors(obj, ty));
        if let Some(sa) = str_at(obj, "/spec/sessionAffinity") {
            if !["None", "ClientIP"].contains(&sa) {
                errs.push(FieldError::not_supported("spec.sessionAffinity", &json!(sa), &["ClientIP", "None"]));
            }
        }
        if let Some(sel) = obj.pointer("/spec/selector").and_then(Value::as_object) {
            for (k, v) in sel {
                if let Some(m) = crate::validation::qualified_name_errors(k) {
                    errs.push(FieldError::invalid("spec.selector", &json!(k), &m));
                }
                if let Some(m) = v.as_str().and_then(crate::validation::label_value_errors) {
                    errs.push(FieldError::invalid("spec.selector", v, &m));
                }
            }
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        let external = service_type(new) == "ExternalName" || service_type(old) == "ExternalName";
        if !external && new.pointer("/spec/clusterIP") != old.pointer("/spec/clusterIP") {
            errs.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                new.pointer("/spec/clusterIP").unwrap_or(&Value::Null),
                "may not change once set",
            ));
        }
        if needs_health_check(old)
            && needs_health_check(new)
            && health_check_node_port(new) != health_check_node_port(old)
        {
            errs.push(FieldError::forbidden("spec.healthCheckNodePort", "field is immutable"));
        }
        errs
    }

    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        match field {
            "spec.clusterIP" => Some(str_at(obj, "/spec/clusterIP").unwrap_or_default().to_string()),
            "spec.type" => Some(service_type(obj).to_string()),
            _ => common_field_value(obj, field),
        }
    }

    fn tracks_generation(&self) -> bool {
        true
    }
    fn allow_create_on_update(&self) -> bool {
        true
    }
    fn transaction_keys(&self) -> &'static [&'static str] {
        allocation::KEYS
    }
    fn transaction_writes(
        &self,
        cfg: &ClusterConfig,
        reads: &[Option<KeyValue>],
        old: Option<&Value>,
        new: Option<&mut Value>,
    ) -> ApiResult<Vec<Op>> {
        allocation::writes(cfg, reads, old, new)
    }
}

/// `spec.loadBalancerSourceRanges`: only for LoadBalancers, each a CIDR (surrounding spaces
/// allowed, a leftover of the annotation it replaced). Kubernetes names the field with a
/// capital L in these errors.
fn source_range_errors(obj: &Value, ty: &str) -> Vec<FieldError> {
    let ranges = obj.pointer("/spec/loadBalancerSourceRanges").and_then(Value::as_array);
    let Some(ranges) = ranges.filter(|r| !r.is_empty()) else { return Vec::new() };
    let path = "spec.LoadBalancerSourceRanges";
    let mut errs = Vec::new();
    if ty != "LoadBalancer" {
        errs.push(FieldError::forbidden(path, "may only be used when `type` is 'LoadBalancer'"));
    }
    for (i, range) in ranges.iter().enumerate() {
        let text = range.as_str().unwrap_or_default().trim();
        if !crate::validation::is_cidr(text) {
            errs.push(FieldError::invalid(
                format!("{path}[{i}]"),
                &json!(text),
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            ));
        }
    }
    errs
}

/// The cluster IP a Service holds (None for headless / ExternalName / unset).
pub fn held_ip(obj: &Value) -> Option<Ipv4Addr> {
    if service_type(obj) == "ExternalName" {
        return None;
    }
    str_at(obj, "/spec/clusterIP").and_then(|s| s.parse().ok())
}

/// Whether the Service wants an IP allocated (clusterIP empty, not headless).
pub fn wants_ip(obj: &Value) -> bool {
    service_type(obj) != "ExternalName" && str_at(obj, "/spec/clusterIP").unwrap_or_default().is_empty()
}

/// The port entries of a Service that uses node ports, with their indexes (none otherwise).
fn node_port_entries(obj: &Value) -> impl Iterator<Item = (usize, &Value)> {
    let ports = if uses_node_ports(obj) { obj.pointer("/spec/ports").and_then(Value::as_array) } else { None };
    ports.into_iter().flatten().enumerate()
}

/// The node ports a Service holds, with the index of the port entry.
pub fn held_node_ports(obj: &Value) -> Vec<(usize, i64)> {
    node_port_entries(obj).filter_map(|(i, p)| p.get("nodePort").and_then(Value::as_i64).map(|n| (i, n))).collect()
}

/// Indexes of port entries that need a node port allocated.
pub fn ports_needing_node_port(obj: &Value) -> Vec<usize> {
    node_port_entries(obj).filter(|(_, p)| p.get("nodePort").is_none_or(Value::is_null)).map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ty: &str) -> Value {
        json!({"metadata": {"name": "web"}, "spec": {"type": ty, "selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}})
    }

    #[test]
    fn defaults() {
        let mut s = json!({"spec": {"ports": [{"port": 80}]}});
        ServiceStrategy.prepare_for_create(&mut s);
        assert_eq!(s["spec"]["type"], "ClusterIP");
        assert_eq!(s["spec"]["ports"][0]["targetPort"], 80);
        assert_eq!(s["spec"]["ports"][0]["protocol"], "TCP");
        assert_eq!(s["spec"]["sessionAffinity"], "None");
        assert!(wants_ip(&s));
    }

    #[test]
    fn validation() {
        assert!(ServiceStrategy.validate(&svc("NodePort")).is_empty());
        let e = ServiceStrategy.validate(&svc("ClusterIP"));
        assert_eq!(e[0].field, "spec.ports[0].nodePort");
        let e = ServiceStrategy.validate(&svc("Bogus"));
        assert_eq!(e[0].reason, "FieldValueNotSupported");
        let e = ServiceStrategy.validate(&json!({"spec": {"type": "ClusterIP"}}));
        assert_eq!(e[0].field, "spec.ports");
        assert_eq!(ServiceStrategy.name_rule().check("1abc").is_some(), true);
    }

    #[test]
    fn update_keeps_allocations() {
        let mut old = svc("NodePort");
        old["spec"]["clusterIP"] = json!("10.96.0.5");
        old["spec"]["ports"][0]["protocol"] = json!("TCP");
        let mut new = svc("NodePort");
        new["spec"]["ports"][0].as_object_mut().unwrap().remove("nodePort");
        ServiceStrategy.prepare_for_update(&mut new, &old);
        assert_eq!(new["spec"]["clusterIP"], "10.96.0.5");
        assert_eq!(new["spec"]["ports"][0]["nodePort"], 30080);
        let mut to_cluster = old.clone();
        to_cluster["spec"]["type"] = json!("ClusterIP");
        ServiceStrategy.prepare_for_update(&mut to_cluster, &old);
        assert!(to_cluster["spec"]["ports"][0].get("nodePort").is_none());
        assert_eq!(held_node_ports(&old), vec![(0, 30080)]);
    }

    fn lb_local() -> Value {
        json!({"metadata": {"name": "web"}, "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 30500, "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}})
    }

    #[test]
    fn a_health_check_node_port_is_only_for_local_load_balancers() {
        assert!(ServiceStrategy.validate(&lb_local()).is_empty());
        for (ty, policy) in [("NodePort", "Local"), ("LoadBalancer", "Cluster")] {
            let mut s = lb_local();
            s["spec"]["type"] = json!(ty);
            s["spec"]["externalTrafficPolicy"] = json!(policy);
            let e = ServiceStrategy.validate(&s);
            assert_eq!(e.len(), 1, "{e:?}");
            assert_eq!(e[0].field, "spec.healthCheckNodePort");
            assert_eq!(
                e[0].message,
                "spec.healthCheckNodePort: Invalid value: 30500: may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"
            );
        }
        let mut s = lb_local();
        s["spec"]["externalTrafficPolicy"] = json!("local");
        assert_eq!(ServiceStrategy.validate(&s)[0].reason, "FieldValueNotSupported");
    }

    #[test]
    fn the_health_check_node_port_is_immutable_while_needed_and_dropped_with_the_need() {
        let old = lb_local();
        // Left empty: kept.
        let mut new = lb_local();
        new["spec"].as_object_mut().unwrap().remove("healthCheckNodePort");
        ServiceStrategy.prepare_for_update(&mut new, &old);
        assert_eq!(new["spec"]["healthCheckNodePort"], 30500);
        assert!(ServiceStrategy.validate_update(&new, &old).is_empty());
        // Changed: refused.
        let mut new = lb_local();
        new["spec"]["healthCheckNodePort"] = json!(30501);
        ServiceStrategy.prepare_for_update(&mut new, &old);
        let e = ServiceStrategy.validate_update(&new, &old);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].message, "spec.healthCheckNodePort: Forbidden: field is immutable");
        // Policy Cluster with the port as it was: the port goes.
        let mut new = lb_local();
        new["spec"]["externalTrafficPolicy"] = json!("Cluster");
        ServiceStrategy.prepare_for_update(&mut new, &old);
        assert!(new["spec"].get("healthCheckNodePort").is_none());
        assert!(ServiceStrategy.validate_update(&new, &old).is_empty());
        // Type NodePort with another port: the client's value stays, and is refused.
        let mut new = lb_local();
        new["spec"]["type"] = json!("NodePort");
        new["spec"]["healthCheckNodePort"] = json!(30501);
        ServiceStrategy.prepare_for_update(&mut new, &old);
        assert_eq!(ServiceStrategy.validate_update(&new, &old)[0].field, "spec.healthCheckNodePort");
    }

    #[test]
    fn source_ranges_are_cidrs_of_load_balancers() {
        let mut s = lb_local();
        s["spec"]["loadBalancerSourceRanges"] = json!(["10.0.0.0/8", " 192.0.2.0/24 "]);
        assert!(ServiceStrategy.validate(&s).is_empty());
        s["spec"]["loadBalancerSourceRanges"] = json!(["10.0.0.0/8", "10.0.0.1"]);
        let e = ServiceStrategy.validate(&s);
        assert_eq!(e.len(), 1);
        assert_eq!(
            e[0].message,
            "spec.LoadBalancerSourceRanges[1]: Invalid value: \"10.0.0.1\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
        );
        let mut np = svc("NodePort");
        np["spec"]["loadBalancerSourceRanges"] = json!(["10.0.0.0/8"]);
        let e = ServiceStrategy.validate(&np);
        assert_eq!(
            e[0].message,
            "spec.LoadBalancerSourceRanges: Forbidden: may only be used when `type` is 'LoadBalancer'"
        );
    }
}
