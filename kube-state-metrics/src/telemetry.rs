//! The exporter's own metrics, served on the telemetry port (the default registry):
//! `kube_state_metrics_list_total{resource,result}` and
//! `kube_state_metrics_watch_total{resource,result}` count lists and watches per resource,
//! `http_request_duration_seconds{handler="metrics",method}` times the main port's scrapes.

use std::sync::OnceLock;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};

fn counter(name: &str, help: &str) -> Option<IntCounterVec> {
    let v = IntCounterVec::new(Opts::new(name, help), &["result", "resource"]).ok()?;
    prometheus::register(Box::new(v.clone())).ok()?;
    Some(v)
}

fn result(ok: bool) -> &'static str {
    if ok {
        "success"
    } else {
        "error"
    }
}

/// Count a list of `resource` (its Go type name, `*v1.Pod`, as upstream labels it).
pub fn list(resource: &str, ok: bool) {
    static LISTS: OnceLock<Option<IntCounterVec>> = OnceLock::new();
    let v = LISTS.get_or_init(|| {
        counter("kube_state_metrics_list_total", "Number of total resource list calls in kube-state-metrics")
    });
    if let Some(v) = v {
        v.with_label_values(&[result(ok), resource]).inc();
    }
}

/// Count a watch of `resource`.
pub fn watch(resource: &str, ok: bool) {
    static WATCHES: OnceLock<Option<IntCounterVec>> = OnceLock::new();
    let v = WATCHES.get_or_init(|| {
        counter("kube_state_metrics_watch_total", "Number of total resource watch calls in kube-state-metrics")
    });
    if let Some(v) = v {
        v.with_label_values(&[result(ok), resource]).inc();
    }
}

/// Time one scrape of the main port's `/metrics`.
pub fn scrape(seconds: f64) {
    static SCRAPES: OnceLock<Option<HistogramVec>> = OnceLock::new();
    let v = SCRAPES.get_or_init(|| {
        let opts = HistogramOpts::new(
            "http_request_duration_seconds",
            "A histogram of requests for kube-state-metrics metrics handler.",
        )
        .const_label("handler", "metrics");
        let v = HistogramVec::new(opts, &["method"]).ok()?;
        prometheus::register(Box::new(v.clone())).ok()?;
        Some(v)
    });
    if let Some(v) = v {
        v.with_label_values(&["get"]).observe(seconds);
    }
}
