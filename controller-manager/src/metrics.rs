//! Prometheus metrics of the controllers, served on `/metrics` (the default registry):
//! `controller_manager_syncs_total{controller, result}` counts reconciles;
//! `horizontal_pod_autoscaler_sync_duration_seconds` is how long the last periodic pass
//! over every HPA took.

use std::sync::OnceLock;

use prometheus::{Gauge, IntCounterVec, Opts};

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

fn hpa_pass() -> Option<&'static Gauge> {
    static G: OnceLock<Option<Gauge>> = OnceLock::new();
    G.get_or_init(|| {
        let g = Gauge::new(
            "horizontal_pod_autoscaler_sync_duration_seconds",
            "Seconds the last periodic pass over every HorizontalPodAutoscaler took",
        )
        .ok()?;
        prometheus::register(Box::new(g.clone())).ok()?;
        Some(g)
    })
    .as_ref()
}

/// Record how long a pass over all HPAs took.
pub fn hpa_pass_seconds(secs: f64) {
    if let Some(g) = hpa_pass() {
        g.set(secs);
    }
}
