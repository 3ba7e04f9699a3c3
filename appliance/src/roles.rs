//! Roles and separation of duties on the HTTP side: [`enforce`] (a route layer of
//! [`crate::app`]) applies the route table before any handler runs, so a refused request
//! changes nothing. The table itself ([`ROUTES`]: who may call each route, as method and path
//! strings) and why a caller is refused ([`refusal`]) are `airlock_identity::roles`,
//! re-exported here.
//!
//! | role | duty |
//! |---|---|
//! | `admin` | configuration and users: users, roles, tokens |
//! | `operator` | content operations: ingest, grants, IAM syncs, reconcile, purge, evals |
//! | `auditor` | oversight: the audit log and the metrics; never document content |
//! | `metrics` | a scrape token: `/metrics` only |
//! | (none) | `user`: answers, retrieval, conversations over the documents their grants allow |
//!
//! A principal holding `auditor` or `metrics` never reaches document content (chat, retrieval,
//! embeddings, conversations, feedback), whatever else it holds; a `metrics` principal reaches
//! `/metrics` only. With `tls.client_ca` set, every role-gated route also needs a verified client
//! certificate (mTLS). Routes missing from the table are refused (`403`).
//!
//! The operator console's pages (`/v1/admin/...`): documents and feedback `operator`; users and
//! groups, IAM syncs and capacity `admin`, `operator` or `auditor`; eval reports `operator` or
//! `auditor`; the audit search `admin` or `auditor` (as `/v1/audit`).

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::Method;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;
use crate::tls::client_cert_verified;
use airlock_identity::caller::Caller;

pub use airlock_identity::roles::{Access, ROUTES, refusal};

/// The access of `method` on `route` (a path template); HEAD is GET's. `None`: no entry.
pub fn access(method: &Method, route: &str) -> Option<Access> {
    airlock_identity::roles::access(method.as_str(), route)
}

/// Marks a request that passed [`enforce`] for a role-gated route.
#[derive(Debug, Clone, Copy)]
pub struct Authorized;

/// The route layer: refuses cross-site state changes (403, `crate::csrf`), authenticates (401)
/// and applies [`ROUTES`] (403) before the handler.
pub async fn enforce(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(route) = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
    else {
        return next.run(req).await;
    };
    // A browser's state-changing request from another site is refused before anything else,
    // whatever credential it carries (crate::csrf).
    if let Err(e) = crate::csrf::refuse_cross_site(req.method(), req.headers()) {
        return e.into_response();
    }
    let access = match access(req.method(), &route) {
        Some(a) => a,
        // The route has other methods: the router answers 405 and runs nothing.
        None if ROUTES.iter().any(|(_, r, _)| *r == route) => return next.run(req).await,
        None => {
            tracing::error!(route, "route missing from the role table: refused");
            return ApiError::Forbidden("this route has no entry in the role table")
                .into_response();
        }
    };
    if access == Access::Public {
        return next.run(req).await;
    }
    let (mut parts, body) = req.into_parts();
    let caller = match Caller::from_request_parts(&mut parts, &state).await {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let mtls_ok = state.config().tls.client_ca.is_none() || client_cert_verified(&parts);
    if let Some(why) = refusal(access, &caller, mtls_ok) {
        return ApiError::Forbidden(why).into_response();
    }
    if matches!(access, Access::Roles(_)) {
        parts.extensions.insert(Authorized);
    }
    next.run(Request::from_parts(parts, body)).await
}

/// Whether [`enforce`] passed this request for a role-gated route.
pub fn authorized(parts: &Parts) -> bool {
    parts.extensions.get::<Authorized>().is_some()
}
