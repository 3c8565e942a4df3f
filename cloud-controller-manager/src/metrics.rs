//! Prometheus metrics, served on `/metrics` (the default registry):
//! `cloud_controller_manager_syncs_total{controller, result}` counts syncs and
//! `cloudprovider_api_requests_total{provider, request, result}` counts provider calls (what
//! the hash in the service controller saves).

use std::sync::OnceLock;

use prometheus::{IntCounterVec, Opts};

fn counter(name: &str, help: &str, labels: &[&str]) -> Option<IntCounterVec> {
    let v = IntCounterVec::new(Opts::new(name, help), labels).ok()?;
    prometheus::register(Box::new(v.clone())).ok()?;
    Some(v)
}

/// Count one sync of `controller`.
pub fn sync(controller: &str, ok: bool) {
    static SYNCS: OnceLock<Option<IntCounterVec>> = OnceLock::new();
    let v = SYNCS.get_or_init(|| {
        counter("cloud_controller_manager_syncs_total", "Syncs per controller and result", &["controller", "result"])
    });
    if let Some(v) = v {
        v.with_label_values(&[controller, if ok { "success" } else { "error" }]).inc();
    }
}

/// Count one call of the provider.
pub fn provider_call(provider: &str, request: &str, ok: bool) {
    static CALLS: OnceLock<Option<IntCounterVec>> = OnceLock::new();
    let v = CALLS.get_or_init(|| {
        counter(
            "cloudprovider_api_requests_total",
            "Calls of the cloud provider per request and result",
            &["provider", "request", "result"],
        )
    });
    if let Some(v) = v {
        v.with_label_values(&[provider, request, if ok { "success" } else { "error" }]).inc();
    }
}
