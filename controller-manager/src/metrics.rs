//! Prometheus metrics of the controllers, served on `/metrics` (the default registry):
//! `controller_manager_syncs_total{controller, result}` counts reconciles.

use std::sync::OnceLock;

use prometheus::{IntCounterVec, Opts};

fn syncs() -> Option<&'static IntCounterVec> {
    static SYNCS: OnceLock<Option<IntCounterVec>> = OnceLock::new();
    SYNCS
        .get_or_init(|| {
            let v = IntCounterVec::new(
                Opts::new("controller_manager_syncs_total", "Reconciles per controller and result"),
                &["controller", "result"],
            )
            .ok()?;
            prometheus::register(Box::new(v.clone())).ok()?;
            Some(v)
        })
        .as_ref()
}

/// Count one reconcile of `controller`.
pub fn sync(controller: &str, ok: bool) {
    if let Some(v) = syncs() {
        v.with_label_values(&[controller, if ok { "success" } else { "error" }]).inc();
    }
}
