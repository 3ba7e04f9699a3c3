//! The HTTP surface: [`app`] builds the one router that production, tests and evals share.

use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use http_body_util::{BodyExt, Limited};
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::ResponseBodyTimeoutLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};

use crate::error::ApiError;
use crate::metrics::{RouteLabel, RouteStatus};
use crate::state::AppState;

pub use crate::extract::{MAX_REQUEST_ID_LEN, REQUEST_ID, valid_request_id};

pub mod acl;
pub mod admin;
pub mod audit;
pub mod auth;
pub mod chat;
pub mod connectors;
pub mod conversations;
pub mod documents;
pub mod feedback;
pub mod health;
pub mod models;
pub mod oidc;
pub mod priority;
pub mod receipts;
pub mod retrieve;
pub mod ui;

/// The degradation rung header on model-bound responses.
pub const RUNG_HEADER: HeaderName = HeaderName::from_static("x-airlock-rung");

/// The daemon's router with every endpoint of API.md and its middleware.
pub fn app(state: AppState) -> Router {
    let stream_idle = state.config().stream_idle_timeout();
    let api = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/v1/audit", get(audit::list))
        .route("/v1/receipts/{id}", get(receipts::get))
        .route("/v1/models", get(models::list))
        .route("/v1/info", get(models::info))
        .route("/v1/embeddings", post(models::embeddings))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/retrieve", post(retrieve::retrieve))
        .route("/v1/feedback", post(feedback::submit))
        .route(
            "/v1/conversations",
            get(conversations::list).post(conversations::create),
        )
        .route(
            "/v1/conversations/{id}",
            get(conversations::get).delete(conversations::delete),
        )
        .route(
            "/v1/documents/{doc_id}",
            put(documents::put)
                .get(documents::get)
                .delete(documents::delete),
        )
        .route("/v1/documents/{doc_id}/file", get(documents::file))
        .route("/v1/reconcile", post(documents::reconcile))
        .route("/v1/purge", post(documents::purge))
        .route(
            "/v1/acl/users/{user_id}",
            put(acl::put_user).delete(acl::remove_user),
        )
        .route(
            "/v1/acl/users/{user_id}/token",
            post(acl::issue_token).delete(acl::revoke_token),
        )
        .route(
            "/v1/acl/users/{user_id}/sessions",
            axum::routing::delete(acl::end_sessions),
        )
        .route("/v1/acl/approvals", post(acl::approve))
        .route("/v1/acl/documents/{doc_id}", put(acl::put_document))
        .route("/v1/acl/sync", post(acl::sync))
        .route("/v1/acl/sync/ldap", post(auth::sync))
        .route("/v1/connectors", get(connectors::list))
        .route("/v1/connectors/{alias}/sync", post(connectors::sync))
        .route("/v1/connectors/{alias}/verify", post(connectors::verify))
        .route("/v1/connectors/{alias}/holdings", get(connectors::holdings))
        .route("/v1/auth/methods", get(auth::methods))
        .route("/v1/auth/login", post(auth::login))
        .route("/v1/auth/logout", post(auth::logout))
        .route("/v1/auth/oidc/login", get(oidc::login))
        .route("/v1/auth/oidc/callback", get(oidc::callback))
        .route("/v1/admin/documents", get(admin::documents))
        .route("/v1/admin/documents/{doc_id}", get(admin::document))
        .route("/v1/admin/users", get(admin::users))
        .route("/v1/admin/groups", get(admin::groups))
        .route("/v1/admin/syncs", get(admin::syncs))
        .route("/v1/admin/capacity", get(admin::capacity))
        .route("/v1/admin/feedback", get(admin::feedback))
        .route("/v1/admin/evals", get(admin::evals))
        .route("/v1/admin/evals/{name}", get(admin::eval))
        .route("/v1/admin/audit", get(admin::audit))
        .merge(ui::routes())
        // Who may call what (crate::roles::ROUTES), before any handler and its body extractor.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::roles::enforce,
        ))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), deadline))
        .layer(middleware::from_fn_with_state(state.clone(), uri_limit))
        .layer(middleware::from_fn(problem_bodies))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ));

    api.layer(
        ServiceBuilder::new()
            .map_request(drop_invalid_request_id)
            .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(|req: &Request| {
                        let id = req
                            .headers()
                            .get(REQUEST_ID)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("");
                        // Method and path only: no query strings, bodies or tokens.
                        tracing::info_span!("http.request", http.request.method = %req.method(),
                            url.path = %req.uri().path(), request_id = %id)
                    })
                    // Server errors are logged once, at ERROR, where they arise (ApiError);
                    // shed and deadline answers under load at DEBUG. tower-http's own line for
                    // every 5xx would repeat them (and flood the log during an overload).
                    .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
            )
            .layer(PropagateRequestIdLayer::new(REQUEST_ID))
            .layer(ResponseBodyTimeoutLayer::new(stream_idle)),
    )
    .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed(method: Method) -> ApiError {
    ApiError::MethodNotAllowed(method.to_string())
}

/// Removes a client `X-Request-Id` that [`valid_request_id`] refuses (or that is sent more than
/// once), so that the request-id layer behind it sets a fresh UUID.
fn drop_invalid_request_id(mut req: Request) -> Request {
    let mut ids = req.headers().get_all(REQUEST_ID).iter();
    let keep = match (ids.next(), ids.next()) {
        (Some(id), None) => id.to_str().is_ok_and(valid_request_id),
        _ => false,
    };
    if !keep {
        req.headers_mut().remove(REQUEST_ID);
    }
    req
}

/// Turns every error response that is not already a problem (axum's own rejections, such as a
/// `Path` that is not UTF-8 after percent-decoding, answer in plain text) into one from the
/// error table. JSON bodies (`/readyz`'s 503) are left alone.
async fn problem_bodies(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.starts_with("application/problem+json") || ct.starts_with("application/json")
        });
    if json {
        return resp;
    }
    // Framework rejections are one short line; a longer body is cut, not buffered.
    let text = match Limited::new(resp.into_body(), 4096).collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_string(),
        Err(_) => String::new(),
    };
    ApiError::from_rejection(status, text).into_response()
}

/// Refuses a request target longer than `max_uri_bytes` (`414 uri-too-long`). The first request
/// of a connection is checked before the router already (`head.rs`); this covers later
/// requests on a kept-alive connection.
async fn uri_limit(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let limit = state.config().max_uri_bytes();
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > limit {
        return ApiError::UriTooLong { limit }.into_response();
    }
    next.run(req).await
}

/// Counts every response by route template and status and times it to its head, by route
/// template (never the raw path: ids stay out of labels).
async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let started = Instant::now();
    let resp = next.run(req).await;
    let m = state.metrics();
    m.request_duration
        .get_or_create(&RouteLabel {
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    m.requests
        .get_or_create(&RouteStatus {
            route,
            status: resp.status().as_u16(),
        })
        .inc();
    resp
}

/// Bounds the time to response headers; streams are bounded by the idle timeout of their body.
async fn deadline(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let limit = state.config().request_timeout();
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => {
            tracing::warn!(timeout_s = limit.as_secs(), "request timed out");
            ApiError::DeadlineExceeded.into_response()
        }
    }
}

/// Milliseconds since `t`, for `timings_ms` fields.
pub(crate) fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
