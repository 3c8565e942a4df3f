//! The dashboard's own metrics (`/metrics`): requests by route and code, logins by
//! result, open sessions.

use std::sync::LazyLock;
use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{
    register_histogram_vec, register_int_counter_vec, register_int_gauge, HistogramVec, IntCounterVec, IntGauge,
};

static REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "dashboard_http_requests_total",
        "HTTP requests by route and status code.",
        &["route", "code"]
    )
    .expect("registering dashboard_http_requests_total")
});
static DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "dashboard_http_request_duration_seconds",
        "Time to the response's headers, by route (a watch's stream is not counted).",
        &["route"]
    )
    .expect("registering dashboard_http_request_duration_seconds")
});
static LOGINS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "dashboard_logins_total",
        "Logins by result: ok, refused (by the cluster), invalid.",
        &["result"]
    )
    .expect("registering dashboard_logins_total")
});
static SESSIONS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!("dashboard_sessions", "Sessions open now.").expect("registering dashboard_sessions")
});

/// The route label: the first path segment (`k8s`, `yaml`, `login`, a file for the rest).
pub fn route(path: &str) -> &'static str {
    match path.trim_start_matches('/').split('/').next().unwrap_or_default() {
        "k8s" => "k8s",
        "yaml" => "yaml",
        "prometheus" => "prometheus",
        "login" => "login",
        "logout" => "logout",
        "session" => "session",
        "metrics" => "metrics",
        "healthz" => "healthz",
        _ => "file",
    }
}

pub async fn count(req: Request, next: Next) -> Response {
    let route = route(req.uri().path());
    let started = Instant::now();
    let resp = next.run(req).await;
    DURATION.with_label_values(&[route]).observe(started.elapsed().as_secs_f64());
    REQUESTS.with_label_values(&[route, resp.status().as_str()]).inc();
    resp
}

pub fn login(result: &str) {
    LOGINS.with_label_values(&[result]).inc();
}

pub fn sessions(n: usize) {
    SESSIONS.set(n as i64);
}

#[cfg(test)]
mod tests {
    #[test]
    fn routes() {
        assert_eq!(super::route("/k8s/api/v1/pods"), "k8s");
        assert_eq!(super::route("/app.js"), "file");
        assert_eq!(super::route("/"), "file");
    }
}
