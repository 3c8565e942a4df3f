//! Where an aggregated API's Service is reached (pure): kube-apiserver's endpoint routing
//! (`--enable-aggregator-routing`, `proxy.ResolveEndpoint`): the Service port the APIService
//! names, then the ready addresses of the Service's EndpointSlices carrying that port's name.
//! The apiserver does not rely on a route to cluster IPs.

use serde_json::{json, Value};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// `spec.service` of an APIService (port defaulted to 443).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
    pub port: u16,
}

impl ServiceRef {
    /// `spec.service` of an APIService, None for a Local one.
    pub fn of(apiservice: &Value) -> Option<ServiceRef> {
        let svc = apiservice.pointer("/spec/service").filter(|v| v.is_object())?;
        let s = |k: &str| svc.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let port = svc.get("port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()).unwrap_or(443);
        Some(ServiceRef { namespace: s("namespace"), name: s("name"), port })
    }

    /// The name a serving certificate must carry (`<service>.<namespace>.svc`).
    pub fn server_name(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }
}

/// The name of the Service port numbered `port`, or Kubernetes' error.
pub fn service_port_name(svc: &Value, port: u16) -> Result<&str, String> {
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p.get("port").and_then(Value::as_u64) == Some(u64::from(port)))
        .map(|p| p.get("name").and_then(Value::as_str).unwrap_or_default())
        .ok_or_else(|| format!("no service port {port} found for service {:?}", name_of(svc)))
}

fn name_of(obj: &Value) -> &str {
    obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default()
}

/// The Service's type (`ClusterIP` when unset).
pub fn service_type(svc: &Value) -> &str {
    svc.pointer("/spec/type").and_then(Value::as_str).filter(|t| !t.is_empty()).unwrap_or("ClusterIP")
}

/// Whether an EndpointSlice endpoint is ready (`conditions.ready` unset counts as ready).
fn ready(endpoint: &Value) -> bool {
    endpoint.pointer("/conditions/ready").and_then(Value::as_bool).unwrap_or(true)
}

/// The slice's port number for the Service port named `port_name`.
fn slice_port(slice: &Value, port_name: &str) -> Option<u16> {
    slice
        .get("ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p.get("name").and_then(Value::as_str).unwrap_or_default() == port_name)
        .and_then(|p| p.get("port").and_then(Value::as_u64))
        .and_then(|p| u16::try_from(p).ok())
}

/// Whether some slice has a ready endpoint and a port named `port_name` (the availability
/// check's `MissingEndpoints` test).
pub fn has_available_endpoint(slices: &[Value], port_name: &str) -> bool {
    slices.iter().any(|s| {
        s.get("endpoints").and_then(Value::as_array).into_iter().flatten().any(ready)
            && slice_port(s, port_name).is_some()
    })
}

/// Every ready `(address, port)` behind the Service port `port`, in the slices' order.
pub fn resolve(svc: &Value, slices: &[Value], port: u16) -> Result<Vec<(String, u16)>, String> {
    let port_name = service_port_name(svc, port)?;
    match service_type(svc) {
        "ClusterIP" | "NodePort" | "LoadBalancer" => {}
        other => return Err(format!("unsupported service type {other:?}")),
    }
    let mut out = Vec::new();
    for slice in slices {
        let Some(p) = slice_port(slice, port_name) else { continue };
        for ep in slice.get("endpoints").and_then(Value::as_array).into_iter().flatten().filter(|e| ready(e)) {
            for addr in ep.get("addresses").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
                out.push((addr.to_string(), p));
            }
        }
    }
    if out.is_empty() {
        return Err(format!("no endpoints available for service {:?}", name_of(svc)));
    }
    Ok(out)
}

/// A core/v1 Endpoints object in the shape of EndpointSlices (one per subset), for a
/// Service whose endpoints are kept only as Endpoints.
pub fn slices_of_endpoints(endpoints: &Value) -> Vec<Value> {
    endpoints
        .get("subsets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|subset| {
            let addresses = |key: &str, ready: bool| -> Vec<Value> {
                subset
                    .get(key)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.get("ip").and_then(Value::as_str))
                    .map(|ip| json!({"addresses": [ip], "conditions": {"ready": ready}}))
                    .collect()
            };
            let mut endpoints = addresses("addresses", true);
            endpoints.extend(addresses("notReadyAddresses", false));
            json!({"endpoints": endpoints, "ports": subset.get("ports").cloned().unwrap_or(json!([]))})
        })
        .collect()
}

/// `host:port` as a URL authority (IPv6 addresses in brackets).
pub fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ty: &str) -> Value {
        json!({"metadata": {"name": "api"}, "spec": {"type": ty, "ports": [{"name": "https", "port": 443, "targetPort": 8443}]}})
    }

    fn slice(ready: Option<bool>, port_name: &str) -> Value {
        let mut ep = json!({"addresses": ["10.0.0.7"]});
        if let Some(r) = ready {
            ep["conditions"] = json!({"ready": r});
        }
        json!({"endpoints": [ep], "ports": [{"name": port_name, "port": 8443}]})
    }

    #[test]
    fn apiservice_service_reference_defaults_port_443() {
        let a = json!({"spec": {"service": {"namespace": "ns", "name": "api"}}});
        assert_eq!(ServiceRef::of(&a), Some(ServiceRef { namespace: "ns".into(), name: "api".into(), port: 443 }));
        assert_eq!(ServiceRef::of(&a).unwrap().server_name(), "api.ns.svc");
        assert_eq!(ServiceRef::of(&json!({"spec": {"service": null}})), None);
        let p = json!({"spec": {"service": {"namespace": "ns", "name": "api", "port": 8443}}});
        assert_eq!(ServiceRef::of(&p).unwrap().port, 8443);
    }

    #[test]
    fn resolves_ready_addresses_of_the_named_port() {
        assert_eq!(resolve(&svc("ClusterIP"), &[slice(None, "https")], 443), Ok(vec![("10.0.0.7".into(), 8443)]));
        assert_eq!(resolve(&svc("NodePort"), &[slice(Some(true), "https")], 443).unwrap().len(), 1);
        assert_eq!(
            resolve(&svc("ClusterIP"), &[slice(Some(false), "https")], 443),
            Err("no endpoints available for service \"api\"".into())
        );
        assert!(resolve(&svc("ClusterIP"), &[slice(None, "other")], 443).is_err());
        assert_eq!(
            resolve(&svc("ClusterIP"), &[slice(None, "https")], 80),
            Err("no service port 80 found for service \"api\"".into())
        );
        assert_eq!(
            resolve(&svc("ExternalName"), &[slice(None, "https")], 443),
            Err("unsupported service type \"ExternalName\"".into())
        );
        assert!(has_available_endpoint(&[slice(None, "https")], "https"));
        assert!(!has_available_endpoint(&[slice(Some(false), "https")], "https"));
        assert!(!has_available_endpoint(&[slice(None, "metrics")], "https"));
    }

    #[test]
    fn endpoints_read_as_slices() {
        let eps = json!({"subsets": [{"addresses": [{"ip": "10.1.0.2"}], "notReadyAddresses": [{"ip": "10.1.0.3"}],
            "ports": [{"name": "https", "port": 9443}]}]});
        let slices = slices_of_endpoints(&eps);
        assert_eq!(resolve(&svc("ClusterIP"), &slices, 443), Ok(vec![("10.1.0.2".into(), 9443)]));
        assert_eq!(authority("::1", 443), "[::1]:443");
        assert_eq!(authority("10.0.0.1", 443), "10.0.0.1:443");
    }
}
