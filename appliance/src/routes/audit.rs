//! `GET /v1/audit`: the audit log for the `auditor` (and `admin`) role: who was shown which
//! documents, syncs, admin changes and sign-ins. Entries name document ids, never document content.

use axum::Json;
use axum::extract::{Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Admin;
use crate::error::ApiError;
use crate::routes::acl::blocking;
use crate::state::AppState;

/// Most entries one request returns.
pub const MAX_AUDIT_ENTRIES: usize = 10_000;

/// The query string of `GET /v1/audit`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    /// Entries about or by this user.
    pub user: Option<String>,
    /// Entries at or after this instant (RFC 3339).
    pub since: Option<String>,
    /// Entries before this instant (RFC 3339).
    pub until: Option<String>,
    /// Only this kind: `shown`, `recheck_drop`, `sync`, `admin`, `sign_in` or `receipt`.
    pub kind: Option<String>,
    /// At most this many entries, oldest first [default 1000, at most 10000].
    pub limit: Option<usize>,
}

/// Parses an optional RFC 3339 query parameter `field` (the audit routes and the console's
/// audit search).
pub(crate) fn instant(
    field: &str,
    v: Option<&str>,
) -> Result<Option<time::OffsetDateTime>, ApiError> {
    v.map(|s| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
            .map_err(|_| ApiError::InvalidRequest(format!("`{field}` is not an RFC 3339 instant")))
    })
    .transpose()
}

/// The audit kind a `kind` query parameter names.
pub(crate) fn kind(k: &str) -> Result<airlock_acl::AuditKind, ApiError> {
    airlock_acl::audit::ALL_KINDS
        .into_iter()
        .find(|x| x.as_str() == k)
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "`kind` {k:?} is not shown, recheck_drop, sync, admin, sign_in or receipt"
            ))
        })
}

/// `GET /v1/audit?user=&since=&until=&kind=&limit=` → `{"entries": [...]}`, oldest first.
pub async fn list(
    State(state): State<AppState>,
    Admin(_): Admin,
    Query(p): Query<AuditParams>,
) -> Result<Json<Value>, ApiError> {
    let kind = p.kind.as_deref().map(kind).transpose()?;
    if p.limit.is_some_and(|l| l == 0 || l > MAX_AUDIT_ENTRIES) {
        return Err(ApiError::InvalidRequest(format!(
            "`limit` must be between 1 and {MAX_AUDIT_ENTRIES}"
        )));
    }
    let q = airlock_acl::AuditQuery {
        user: p.user,
        since: instant("since", p.since.as_deref())?,
        until: instant("until", p.until.as_deref())?,
        kind,
        limit: p.limit,
    };
    let services = state.services()?;
    let entries = blocking(move || Ok(services.acl.audit_query(&q)?)).await?;
    Ok(Json(json!({ "entries": entries })))
}
