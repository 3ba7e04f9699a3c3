//! `/healthz`, `/readyz` and `/metrics`.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::Admin;
use crate::metrics::CONTENT_TYPE;
use crate::state::AppState;

/// `GET /healthz`: 200 while the process lives.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz`: 200 once a verified bundle is loaded and the stores are open, else 503.
pub async fn readyz(State(state): State<AppState>) -> Response {
    match state.services() {
        Ok(s) => {
            Json(json!({"status": "ready", "bundle_version": s.bundle_version()})).into_response()
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "starting"})),
        )
            .into_response(),
    }
}

/// `GET /metrics` (admin): Prometheus text.
pub async fn metrics(State(state): State<AppState>, _admin: Admin) -> Response {
    if let Ok(s) = state.services() {
        state.metrics().refresh_engines(&s);
    }
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        state.metrics().encode(),
    )
        .into_response()
}
