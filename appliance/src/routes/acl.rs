//! Access-control administration: users, tokens, document grants and the IAM snapshot sync.
//! All admin-only. ACL writes do blocking SQLite I/O and run on the blocking pool.

use std::io::Cursor;

use airlock_acl::{Actor, DocGrants, SyncCounts, SyncOptions, UserSpec};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::Admin;
use crate::error::ApiError;
use crate::extract::{ApiJson, NdjsonText, RequestId};
use crate::state::AppState;

/// The audit actor of an admin request: the caller and the request id.
pub(crate) fn actor_of<'a>(caller: &'a crate::auth::Caller, request_id: &'a str) -> Actor<'a> {
    Actor {
        user_id: &caller.user_id,
        request_id: Some(request_id),
    }
}

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
    RequestId(request_id): RequestId,
    Path(user_id): Path<String>,
    ApiJson(spec): ApiJson<UserSpec>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let (outcome, info) = blocking(move || {
        let outcome = acl.put_user(actor_of(&actor, &request_id), &user_id, &spec)?;
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
    RequestId(request_id): RequestId,
    Path(user_id): Path<String>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let token =
        blocking(move || Ok(acl.issue_token(actor_of(&actor, &request_id), &user_id)?)).await?;
    Ok((StatusCode::CREATED, Json(json!({ "token": token }))).into_response())
}

/// `DELETE /v1/acl/users/{user_id}/token` → 200 `{"user_id", "had_token"}`: revokes the user's
/// bearer token and ends their sign-in sessions, both at once (`airlock user tokens revoke`
/// while the daemon serves). Audited (`token_revoke`). 404 for an unknown user.
pub async fn revoke_token(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(user_id): Path<String>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let id = user_id.clone();
    let had = blocking(move || Ok(acl.revoke_token(actor_of(&actor, &request_id), &id)?)).await?;
    Ok(Json(json!({"user_id": user_id, "had_token": had})).into_response())
}

/// `DELETE /v1/acl/users/{user_id}/sessions` → 200 `{"user_id", "sessions_ended"}`: ends every
/// sign-in session of the user at once (their token, if any, stays). Audited (`sign_in`,
/// `sessions_ended`, `ended_by: sessions_end`). 404 for an unknown user.
pub async fn end_sessions(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(user_id): Path<String>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let id = user_id.clone();
    let n =
        blocking(move || Ok(acl.end_user_sessions(actor_of(&actor, &request_id), &id)?)).await?;
    Ok(Json(json!({"user_id": user_id, "sessions_ended": n})).into_response())
}

/// `DELETE /v1/acl/users/{user_id}` → 200 `{"user_id", "removed": true}`: removes the user with
/// their memberships, roles, token and sessions, and their server-kept conversations
/// (`airlock user remove` while the daemon serves). Audited (`user_remove`). 404 for an unknown
/// user; 409 for the last user with the admin role.
pub async fn remove_user(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(user_id): Path<String>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let conversations = services.feedback.clone();
    let id = user_id.clone();
    blocking(move || {
        acl.remove_user(actor_of(&actor, &request_id), &id)?;
        if let Some(store) = conversations {
            store.prune_users(|u| acl.user(u).is_some())?;
        }
        Ok(())
    })
    .await?;
    Ok(Json(json!({"user_id": user_id, "removed": true})).into_response())
}

/// `PUT /v1/acl/documents/{doc_id}` `{"users": [...], "groups": [...]}` → 200.
pub async fn put_document(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(doc_id): Path<String>,
    ApiJson(grants): ApiJson<DocGrants>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let id = doc_id.clone();
    let outcome = blocking(move || {
        Ok(acl.set_document_grants(actor_of(&actor, &request_id), &id, &grants)?)
    })
    .await?;
    Ok(Json(json!({
        "doc_id": doc_id,
        "changed": outcome.changed,
        "users_access_changed": outcome.users_access_changed,
    }))
    .into_response())
}

/// `POST /v1/acl/sync[?allow_empty=true]` (JSON Lines IAM snapshot) → 200 with the diff counts,
/// sent after the new state is swapped in. An empty snapshot is refused without
/// `allow_empty=true`.
pub async fn sync(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    RawQuery(query): RawQuery,
    NdjsonText(body): NdjsonText,
) -> Result<Json<SyncCounts>, ApiError> {
    let options = SyncOptions {
        allow_empty: allow_empty(query.as_deref())?,
    };
    let services = state.services()?;
    let acl = services.acl.clone();
    let conversations = services.feedback.clone();
    let counts = blocking(move || {
        let actor = actor_of(&actor, &request_id);
        let counts = acl
            .sync_snapshot_with(actor, Cursor::new(body), options)
            .map_err(|e| {
                let e = ApiError::from(e);
                // A server-side failure is a failed run of the sync history (routes/admin.rs);
                // a refused snapshot (4xx) changes nothing, the audit log included.
                if e.slug_status().1.is_server_error() {
                    crate::routes::admin::record_sync_failure(&acl, actor, "snapshot", &e);
                }
                e
            })?;
        // Users the snapshot removed lose their server-kept conversations.
        if counts.users_removed > 0
            && let Some(store) = conversations
        {
            store.prune_users(|u| acl.user(u).is_some())?;
        }
        Ok(counts)
    })
    .await?;
    state.metrics().iam_synced_now();
    Ok(Json(counts))
}

/// The query string of the two writes that can empty everything (`POST /v1/acl/sync`,
/// `POST /v1/reconcile`): nothing, or `allow_empty=true|false`. Anything else is refused.
pub(crate) fn allow_empty(query: Option<&str>) -> Result<bool, ApiError> {
    let mut allow = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        allow = match pair {
            "allow_empty=true" => true,
            "allow_empty=false" => false,
            _ => {
                return Err(ApiError::InvalidRequest(
                    "the only query parameter accepted here is `allow_empty=true|false`".into(),
                ));
            }
        };
    }
    Ok(allow)
}
