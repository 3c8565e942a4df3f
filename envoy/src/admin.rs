//! The sidecar's own endpoints: Prometheus metrics (`/stats/prometheus`, on the metrics
//! port) and readiness (`/healthz/ready`, on the readiness port). Both ports serve both.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::ctx::Ctx;

/// Ready: CDS and LDS were accepted once, and the sidecar is not draining.
pub fn ready(ctx: &Ctx) -> bool {
    ctx.shared.ready.load(Ordering::SeqCst) && !ctx.draining.load(Ordering::SeqCst)
}

pub fn router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route(
            "/stats/prometheus",
            get(|| async { common::metrics_response(&crate::metrics::get().registry.gather()) }),
        )
        .route(
            "/healthz/ready",
            get(move || {
                let ok = ready(&ctx);
                async move {
                    if ok {
                        (StatusCode::OK, "ok\n").into_response()
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
                    }
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(|| async {
            Response::builder().status(StatusCode::NOT_FOUND).body(axum::body::Body::empty()).unwrap_or_default()
        })
}
