//! Access-control administration: users, tokens, document grants and the IAM snapshot sync.
//! All admin-only. ACL writes do blocking SQLite I/O and run on the blocking pool.

use std::io::Cursor;

use airlock_acl::{DocGrants, SyncCounts, UserSpec};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::Admin;
use crate::error::ApiError;
use crate::extract::{ApiJson, NdjsonText};
use crate::state::AppState;

/// Runs blocking work (SQLite, models) off the async runtime.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("blocking task failed: {e}")))?
}

/// `PUT /v1/acl/users/{user_id}` `{"groups": [...], "roles": ["admin"]?}` → 201 created / 200
/// updated, with the user as stored.
pub async fn put_user(
    State(state): State<AppState>,
    Admin(actor): Admin,
    Path(user_id): Path<String>,
    ApiJson(spec): ApiJson<UserSpec>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let (outcome, info) = blocking(move || {
        let outcome = acl.put_user(&actor.user_id, &user_id, &spec)?;
        let info = acl.user(&user_id);
        Ok((outcome, info))
    })
    .await?;
    let status = if outcome.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(json!({
            "user": info,
            "created": outcome.created,
            "access_changed": outcome.access_changed,
        })),
    )
        .into_response())
}

/// `POST /v1/acl/users/{user_id}/token` → 201 `{"token": "..."}` (rotates; the user must exist).
pub async fn issue_token(
    State(state): State<AppState>,
    Admin(actor): Admin,
    Path(user_id): Path<String>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let token = blocking(move || Ok(acl.issue_token(&actor.user_id, &user_id)?)).await?;
    Ok((StatusCode::CREATED, Json(json!({ "token": token }))).into_response())
}

/// `PUT /v1/acl/documents/{doc_id}` `{"users": [...], "groups": [...]}` → 200.
pub async fn put_document(
    State(state): State<AppState>,
    Admin(actor): Admin,
    Path(doc_id): Path<String>,
    ApiJson(grants): ApiJson<DocGrants>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let id = doc_id.clone();
    let outcome =
        blocking(move || Ok(acl.set_document_grants(&actor.user_id, &id, &grants)?)).await?;
    Ok(Json(json!({
        "doc_id": doc_id,
        "changed": outcome.changed,
        "users_access_changed": outcome.users_access_changed,
    }))
    .into_response())
}

/// `POST /v1/acl/sync` (JSON Lines IAM snapshot) → 200 with the diff counts, sent after the
/// new state is swapped in.
pub async fn sync(
    State(state): State<AppState>,
    Admin(actor): Admin,
    NdjsonText(body): NdjsonText,
) -> Result<Json<SyncCounts>, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let counts =
        blocking(move || Ok(acl.sync_snapshot(&actor.user_id, Cursor::new(body))?)).await?;
    Ok(Json(counts))
}
