//! Access-control administration: users, tokens, sessions, document grants, the IAM snapshot
//! sync and approvals of access changes. Role-gated (crate::roles); a change that lets the
//! caller read more needs a second person's approval or break-glass (crate::approvals). ACL
//! writes do blocking SQLite I/O and run on the blocking pool.

use std::io::Cursor;

use airlock_acl::{Actor, DocGrants, SyncCounts, SyncOptions, UserSpec};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::approvals::{self, Change};
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
/// updated, with the user as stored. A change of the caller's own groups or roles, or one that
/// adds a group or a role to a user holding a token, needs approval (crate::approvals).
pub async fn put_user(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(user_id): Path<String>,
    headers: HeaderMap,
    ApiJson(spec): ApiJson<UserSpec>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    spec.validate(&user_id)?;
    let acl = services.acl.clone();
    let _serial = state.approvals().serial().lock().await;
    let current = acl.user(&user_id);
    let adds = match &current {
        None => !spec.groups.is_empty() || spec.roles.as_ref().is_some_and(|r| !r.is_empty()),
        Some(u) => {
            spec.groups.iter().any(|g| !u.groups.contains(g))
                || spec
                    .roles
                    .as_ref()
                    .is_some_and(|r| r.iter().any(|x| !u.roles.contains(x)))
        }
    };
    let holds_token = current.as_ref().is_some_and(|u| u.has_token);
    let needed = adds && (holds_token || user_id == actor.user_id);
    let change = Change::UserPut {
        user_id: user_id.clone(),
        groups: spec.groups.clone(),
        roles: spec.roles.clone(),
    };
    let (change, how) = approvals::authorise(
        state.approvals(),
        &acl,
        &headers,
        &actor.user_id,
        change,
        needed,
    )?;
    let metrics = state.metrics().clone();
    let (outcome, info) = blocking(move || {
        let who = actor_of(&actor, &request_id);
        approvals::record(&acl, &metrics, who, &change, &how)?;
        let outcome = acl.put_user(who, &user_id, &spec)?;
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
/// A token for another user who has groups, roles or direct grants needs approval
/// (crate::approvals): its holder reads what that user reads.
pub async fn issue_token(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(user_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let acl = services.acl.clone();
    let _serial = state.approvals().serial().lock().await;
    let needed = user_id != actor.user_id
        && acl.user(&user_id).is_some_and(|u| {
            !u.groups.is_empty() || !u.roles.is_empty() || u.readable_documents > 0
        });
    let change = Change::TokenIssue {
        user_id: user_id.clone(),
    };
    let (change, how) = approvals::authorise(
        state.approvals(),
        &acl,
        &headers,
        &actor.user_id,
        change,
        needed,
    )?;
    let metrics = state.metrics().clone();
    let token = blocking(move || {
        let who = actor_of(&actor, &request_id);
        approvals::record(&acl, &metrics, who, &change, &how)?;
        Ok(acl.issue_token(who, &user_id)?)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(json!({ "token": token }))).into_response())
}

/// `POST /v1/acl/approvals` with a [`Change`] → 201 `{"approval": "apv_…", "id",
/// "expires_in_secs", "change"}`: a one-time approval of exactly that change by the caller, for
/// another principal to apply (`X-Airlock-Approval`). The caller must hold the change's role
/// and may not be the user it is about. Audited (`approval_issue`, with the id, never the
/// secret).
pub async fn approve(
    State(state): State<AppState>,
    Admin(approver): Admin,
    RequestId(request_id): RequestId,
    ApiJson(change): ApiJson<Change>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    let issued = state
        .approvals()
        .issue(&approver, change, std::time::Instant::now())?;
    let acl = services.acl.clone();
    let (id, change) = (issued.id.clone(), issued.change.clone());
    blocking(move || {
        Ok(acl.audit_admin(
            actor_of(&approver, &request_id),
            json!({"action": "approval_issue", "approval": id, "change": change}),
        )?)
    })
    .await?;
    let mut resp = (StatusCode::CREATED, Json(issued)).into_response();
    resp.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    Ok(resp)
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

/// `PUT /v1/acl/documents/{doc_id}` `{"users": [...], "groups": [...]}` → 200. A grant that
/// lets the caller read the document needs approval (crate::approvals).
pub async fn put_document(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    Path(doc_id): Path<String>,
    headers: HeaderMap,
    ApiJson(grants): ApiJson<DocGrants>,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    grants.validate(&doc_id)?;
    let acl = services.acl.clone();
    let _serial = state.approvals().serial().lock().await;
    let needed =
        approvals::grant_gives(&acl, &actor.user_id, &doc_id, &grants.users, &grants.groups);
    let change = Change::DocumentGrants {
        doc_id: doc_id.clone(),
        users: grants.users.clone(),
        groups: grants.groups.clone(),
    };
    let (change, how) = approvals::authorise(
        state.approvals(),
        &acl,
        &headers,
        &actor.user_id,
        change,
        needed,
    )?;
    let metrics = state.metrics().clone();
    let id = doc_id.clone();
    let outcome = blocking(move || {
        let who = actor_of(&actor, &request_id);
        approvals::record(&acl, &metrics, who, &change, &how)?;
        Ok(acl.set_document_grants(who, &id, &grants)?)
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
/// `allow_empty=true`. A snapshot that lists the caller or lets it read a document it cannot
/// read now needs approval (crate::approvals).
pub async fn sync(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    NdjsonText(body): NdjsonText,
) -> Result<Json<SyncCounts>, ApiError> {
    let options = SyncOptions {
        allow_empty: allow_empty(query.as_deref())?,
    };
    let services = state.services()?;
    let acl = services.acl.clone();
    let _serial = state.approvals().serial().lock().await;
    let needed = approvals::snapshot_gives(&acl, &actor.user_id, &body);
    let change = Change::AclSync {
        sha256: approvals::body_sha256(&body),
    };
    let (change, how) = approvals::authorise(
        state.approvals(),
        &acl,
        &headers,
        &actor.user_id,
        change,
        needed,
    )?;
    let metrics = state.metrics().clone();
    let conversations = services.feedback.clone();
    let counts = blocking(move || {
        let actor = actor_of(&actor, &request_id);
        approvals::record(&acl, &metrics, actor, &change, &how)?;
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
