//! Cluster IPs, node ports and health check node ports of Services, allocated in the same storage transaction as the
//! Service itself: two bitmaps in storage (`ipalloc`), read by the generic store and handed
//! to [`writes`], which decides what a create, update or delete takes and frees. A
//! concurrent change of a bitmap makes the whole write retry, so two Services never get one
//! address. Pure: given the bitmaps, the answer is the new bitmaps.

use rand::Rng;
use serde_json::{json, Value};
use storage::{KeyValue, Op};

use super::{
    held_health_check_node_port, held_ip, held_node_ports, ports_needing_node_port, wants_health_check_node_port,
    wants_ip,
};
use crate::error::{ApiError, ApiResult, FieldError};
use crate::ipalloc::{Bitmap, NODE_PORTS_KEY, SERVICE_IPS_KEY};
use crate::registry::{set_at, str_at, ClusterConfig};

/// The keys [`writes`] reads, in this order.
pub const KEYS: &[&str] = &[SERVICE_IPS_KEY, NODE_PORTS_KEY];

fn bitmap(kv: Option<&KeyValue>, range: &str, size: usize) -> ApiResult<Bitmap> {
    match kv {
        Some(kv) => Bitmap::decode(&kv.value, range, size).map_err(ApiError::internal),
        None => Ok(Bitmap::new(size)),
    }
}

/// The bitmap writes of a Service create (`old` None), update, or delete (`new` None),
/// filling what was allocated into `new`. `reads` holds the current bitmaps ([`KEYS`]).
pub fn writes(
    cfg: &ClusterConfig,
    reads: &[Option<KeyValue>],
    old: Option<&Value>,
    mut new: Option<&mut Value>,
) -> ApiResult<Vec<Op>> {
    let name = new.as_deref().or(old).and_then(|o| str_at(o, "/metadata/name")).unwrap_or_default().to_string();
    let invalid = |field: String, value: Value, msg: String| {
        ApiError::invalid("", "Service", &name, vec![FieldError::invalid(field, &value, &msg)])
    };
    let mut ops = Vec::new();

    // ---- cluster IP
    let old_ip = old.and_then(held_ip);
    let need_random = new.as_deref().is_some_and(wants_ip);
    let requested_ip = new.as_deref().and_then(held_ip);
    if need_random || requested_ip != old_ip {
        let range = &cfg.service_cluster_ip_range;
        let mut bm = bitmap(reads.first().and_then(Option::as_ref), &range.text, range.size())?;
        if let Some(ip) = old_ip {
            if let Some(off) = range.offset(ip) {
                bm.set(off, false);
            }
        }
        if let Some(ip) = requested_ip {
            let shown = json!([ip.to_string()]);
            let Some(off) = range.offset(ip) else {
                return Err(invalid(
                    "spec.clusterIPs".into(),
                    shown,
                    format!(
                        "failed to allocate IP {ip}: the provided IP ({ip}) is not in the valid range. The range of valid IPs is {}",
                        range.text
                    ),
                ));
            };
            if bm.get(off) {
                return Err(invalid(
                    "spec.clusterIPs".into(),
                    shown,
                    format!("failed to allocate IP {ip}: provided IP is already allocated"),
                ));
            }
            bm.set(off, true);
        } else if need_random {
            // Dynamic allocations prefer the upper part of the range, leaving the lower band
            // for static IPs (as Kubernetes does).
            let size = range.size();
            let lower = (size / 16).clamp(16, 256).min(size / 2);
            let start = rand::rng().random_range(lower.max(1)..size - 1);
            let off = bm.find_free(lower.max(1), size - 1, start).or_else(|| bm.find_free(1, size - 1, 1)).ok_or_else(
                || ApiError::internal(format!("failed to allocate a serviceIP: range {} is full", range.text)),
            )?;
            bm.set(off, true);
            let ip = range.ip_at(off).to_string();
            if let Some(n) = new.as_deref_mut() {
                set_at(n, "/spec/clusterIP", json!(ip));
                set_at(n, "/spec/clusterIPs", json!([ip]));
            }
        }
        ops.push(Op::Put { key: SERVICE_IPS_KEY.into(), value: bm.encode(&range.text) });
    }
    if let Some(n) = new.as_deref_mut() {
        if let Some(ip) = str_at(n, "/spec/clusterIP").map(String::from) {
            if n.pointer("/spec/clusterIPs").is_none() && !ip.is_empty() {
                set_at(n, "/spec/clusterIPs", json!([ip]));
            }
        }
    }

    // ---- node ports, and the health check node port from the same range
    let old_ports: Vec<i64> = old.map(held_node_ports).unwrap_or_default().into_iter().map(|(_, p)| p).collect();
    let new_held: Vec<(usize, i64)> = new.as_deref().map(held_node_ports).unwrap_or_default();
    let needing = new.as_deref().map(ports_needing_node_port).unwrap_or_default();
    let new_ports: Vec<i64> = new_held.iter().map(|(_, p)| *p).collect();
    let claims: Vec<(usize, i64)> = new_held.iter().copied().filter(|(_, p)| !old_ports.contains(p)).collect();
    let mut releases: Vec<i64> = old_ports.iter().copied().filter(|p| !new_ports.contains(p)).collect();
    let old_hc = old.and_then(held_health_check_node_port);
    let new_hc = new.as_deref().and_then(held_health_check_node_port);
    let hc_claim = new_hc.filter(|p| Some(*p) != old_hc);
    let hc_wanted = new.as_deref().is_some_and(wants_health_check_node_port);
    releases.extend(old_hc.filter(|p| Some(*p) != new_hc));
    if !claims.is_empty() || !releases.is_empty() || !needing.is_empty() || hc_claim.is_some() || hc_wanted {
        let range = &cfg.service_node_port_range;
        let text = range.text();
        let mut bm = bitmap(reads.get(1).and_then(Option::as_ref), &text, range.size())?;
        for p in releases {
            if let Some(off) = range.offset(p) {
                bm.set(off, false);
            }
        }
        // Take a requested port: outside the range or taken is a 422 on its field.
        let take = |bm: &mut Bitmap, field: String, p: i64| -> ApiResult<()> {
            let Some(off) = range.offset(p) else {
                return Err(invalid(
                    field,
                    json!(p),
                    format!("provided port is not in the valid range. The range of valid ports is {text}"),
                ));
            };
            if bm.get(off) {
                return Err(invalid(field, json!(p), "provided port is already allocated".into()));
            }
            bm.set(off, true);
            Ok(())
        };
        for (i, p) in claims {
            take(&mut bm, format!("spec.ports[{i}].nodePort"), p)?;
        }
        for i in needing {
            let start = rand::rng().random_range(0..range.size());
            let off = bm.find_free(0, range.size(), start).ok_or_else(|| {
                invalid(format!("spec.ports[{i}].nodePort"), Value::Null, format!("range {text} is full"))
            })?;
            bm.set(off, true);
            if let Some(n) = new.as_deref_mut() {
                set_at(n, &format!("/spec/ports/{i}/nodePort"), json!(range.base as i64 + off as i64));
            }
        }
        // A requested health check port that is taken or outside the range is the client's
        // error: a 422 on the field, worded as for node ports (Kubernetes answers it with a
        // 500, which tells the user nothing they can fix).
        if let Some(p) = hc_claim {
            take(&mut bm, "spec.healthCheckNodePort".into(), p)?;
        } else if hc_wanted {
            let start = rand::rng().random_range(0..range.size());
            let off = bm.find_free(0, range.size(), start).ok_or_else(|| {
                invalid("spec.healthCheckNodePort".into(), Value::Null, format!("range {text} is full"))
            })?;
            bm.set(off, true);
            if let Some(n) = new.as_deref_mut() {
                set_at(n, "/spec/healthCheckNodePort", json!(range.base as i64 + off as i64));
            }
        }
        ops.push(Op::Put { key: NODE_PORTS_KEY.into(), value: bm.encode(&text) });
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipalloc::{IpRange, PortRange};

    fn cfg() -> ClusterConfig {
        ClusterConfig {
            service_cluster_ip_range: IpRange::parse("10.96.0.0/28").unwrap(),
            service_node_port_range: PortRange::parse("30000-30003").unwrap(),
        }
    }

    fn stored(op: &Op) -> Option<KeyValue> {
        match op {
            Op::Put { key, value } => {
                Some(KeyValue { key: key.clone(), value: value.clone(), create_revision: 1, mod_revision: 1 })
            }
            _ => None,
        }
    }

    #[test]
    fn a_create_takes_an_ip_and_node_ports_that_a_second_cannot_take_and_a_delete_frees_them() {
        let cfg = cfg();
        let mut svc = json!({"metadata": {"name": "a"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        let ops = writes(&cfg, &[None, None], None, Some(&mut svc)).unwrap();
        assert_eq!(ops.len(), 2);
        let ip = svc["spec"]["clusterIP"].as_str().unwrap().to_string();
        assert_eq!(svc["spec"]["clusterIPs"], json!([ip]));
        let port = svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
        assert!((30000..=30003).contains(&port));
        let reads: Vec<Option<KeyValue>> = ops.iter().map(stored).collect();

        let mut same = json!({"metadata": {"name": "b"}, "spec": {"type": "NodePort", "clusterIP": ip, "ports": [{"port": 80, "nodePort": port}]}});
        let err = writes(&cfg, &reads, None, Some(&mut same)).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(err.message.contains("provided IP is already allocated"), "{}", err.message);

        let freed = writes(&cfg, &reads, Some(&svc), None).unwrap();
        let reads: Vec<Option<KeyValue>> = freed.iter().map(stored).collect();
        assert!(writes(&cfg, &reads, None, Some(&mut same)).is_ok(), "freed by the delete");
    }

    #[test]
    fn an_update_that_keeps_its_addresses_writes_nothing() {
        let svc = json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.96.0.5", "ports": [{"port": 80}]}});
        let mut new = svc.clone();
        assert!(writes(&cfg(), &[None, None], Some(&svc), Some(&mut new)).unwrap().is_empty());
    }

    #[test]
    fn an_address_outside_the_range_is_refused_with_the_range() {
        let mut svc = json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}});
        let err = writes(&cfg(), &[None, None], None, Some(&mut svc)).unwrap_err();
        assert!(err.message.contains("The range of valid IPs is 10.96.0.0/28"), "{}", err.message);
    }

    /// The bitmaps after `ops`, in [`KEYS`] order.
    fn after(reads: &[Option<KeyValue>], ops: &[Op]) -> Vec<Option<KeyValue>> {
        KEYS.iter()
            .enumerate()
            .map(|(i, k)| {
                ops.iter().filter(|op| op.key() == *k).find_map(stored).or_else(|| reads.get(i).cloned().flatten())
            })
            .collect()
    }

    fn lb_local(name: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "ports": [{"port": 80}]}})
    }

    #[test]
    fn a_local_load_balancer_gets_a_health_check_node_port_beside_its_node_port_until_deleted() {
        let cfg = cfg();
        let mut svc = lb_local("a");
        let ops = writes(&cfg, &[None, None], None, Some(&mut svc)).unwrap();
        let hc = svc["spec"]["healthCheckNodePort"].as_i64().unwrap();
        assert!((30000..=30003).contains(&hc));
        assert_ne!(Some(hc), svc["spec"]["ports"][0]["nodePort"].as_i64(), "two ports of one range");
        let reads: Vec<Option<KeyValue>> = ops.iter().map(stored).collect();

        // A second Service asking for the same port: a 422 on the field.
        let mut same = lb_local("b");
        same["spec"]["healthCheckNodePort"] = json!(hc);
        let err = writes(&cfg, &reads, None, Some(&mut same)).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(
            err.message.ends_with(&format!(
                "spec.healthCheckNodePort: Invalid value: {hc}: provided port is already allocated"
            )),
            "{}",
            err.message
        );
        let mut outside = lb_local("c");
        outside["spec"]["healthCheckNodePort"] = json!(31999);
        let err = writes(&cfg, &reads, None, Some(&mut outside)).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(
            err.message.ends_with(
                "spec.healthCheckNodePort: Invalid value: 31999: provided port is not in the valid range. The range of valid ports is 30000-30003"
            ),
            "{}",
            err.message
        );

        let freed = writes(&cfg, &reads, Some(&svc), None).unwrap();
        let reads: Vec<Option<KeyValue>> = freed.iter().map(stored).collect();
        // Its node port named too: a random one could be the health check port (node ports come first).
        same["spec"]["ports"][0]["nodePort"] = svc["spec"]["ports"][0]["nodePort"].clone();
        assert!(writes(&cfg, &reads, None, Some(&mut same)).is_ok(), "freed by the delete");
        assert_eq!(same["spec"]["healthCheckNodePort"], json!(hc), "the requested port is honoured");
    }

    #[test]
    fn the_health_check_node_port_follows_the_need_for_it() {
        let cfg = cfg();
        // Node ports named: a random one could take the health check port (node ports come first).
        let mut svc = lb_local("a");
        svc["spec"]["healthCheckNodePort"] = json!(30002);
        svc["spec"]["ports"][0]["nodePort"] = json!(30000);
        let reads = after(&[None, None], &writes(&cfg, &[None, None], None, Some(&mut svc)).unwrap());

        // Unchanged: nothing to write.
        let mut same = svc.clone();
        assert!(writes(&cfg, &reads, Some(&svc), Some(&mut same)).unwrap().is_empty());

        // Policy Cluster: the port (which the update's preparation removed) is freed.
        let mut cluster = svc.clone();
        cluster["spec"]["externalTrafficPolicy"] = json!("Cluster");
        cluster["spec"].as_object_mut().unwrap().remove("healthCheckNodePort");
        let reads = after(&reads, &writes(&cfg, &reads, Some(&svc), Some(&mut cluster)).unwrap());
        let mut other = lb_local("b");
        other["spec"]["healthCheckNodePort"] = json!(30002);
        other["spec"]["ports"][0]["nodePort"] = json!(30001);
        assert!(writes(&cfg, &reads, None, Some(&mut other.clone())).is_ok(), "30002 is free again");

        // Back to Local: a port is allocated again.
        let mut local = cluster.clone();
        local["spec"]["externalTrafficPolicy"] = json!("Local");
        writes(&cfg, &reads, Some(&cluster), Some(&mut local)).unwrap();
        assert!(local["spec"]["healthCheckNodePort"].as_i64().is_some());
    }
}
