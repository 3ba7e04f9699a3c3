//! `/v1/conversations`: the caller's threads, kept by the server (docs/API.md).
//!
//! - `GET /v1/conversations`: the caller's threads, most recent first.
//! - `POST /v1/conversations` `{"title"?}`: a new, empty thread (201).
//! - `GET /v1/conversations/{id}`: one thread with its turns. A turn whose provenance the caller
//!   can no longer read at the versions it saw (its sources and those of the earlier turns it
//!   was answered from: access revoked, document deleted, purged or changed) is returned
//!   redacted: `"redacted": true`, no question, answer or source of it
//!   ([`airlock_evidence::conversations::withheld`]).
//! - `DELETE /v1/conversations/{id}`: 204.
//!
//! A chat adds a turn to a thread when it names one (`airlock.conversation_id`); the thread's
//! readable turns, by the same rule, are then the conversation's history, and the new turn
//! records them as its parents. Another user's thread is the same 404
//! as a thread that never existed.

use airlock_evidence::conversations::{StoredTurn, Thread, Withheld};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::routes::acl::blocking;
use crate::state::AppState;

/// The 404 detail for a thread that is not the caller's.
pub const UNKNOWN_THREAD: &str = "no such conversation";
/// What a redacted turn says instead of its text (a document of its provenance is no longer
/// readable).
pub const REDACTED_NOTICE: &str = "a source of this answer is no longer available to you";
/// What a redacted turn says when every document of its provenance is readable but one has
/// changed since the turn saw it.
pub const CHANGED_NOTICE: &str =
    "a source of this answer has changed since; ask again for an answer from its current text";
/// Longest conversation id accepted in a path or a chat request.
pub const MAX_ID_BYTES: usize = 64;

/// Body of `POST /v1/conversations`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// A title (default: "New conversation"; a chat's first question replaces it).
    #[serde(default)]
    pub title: Option<String>,
}

/// `GET /v1/conversations`.
#[derive(Debug, Serialize)]
pub struct ListResponse {
    /// Most recent first.
    pub data: Vec<Thread>,
}

/// One source of a readable turn.
#[derive(Debug, Serialize)]
pub struct SourceView {
    /// Document id.
    pub doc_id: String,
    /// Whether the answer cited it.
    pub cited: bool,
}

/// One turn as read back.
#[derive(Debug, Serialize)]
pub struct TurnView {
    /// 1-based position.
    pub n: i64,
    /// When it was answered (RFC 3339).
    pub created_at: String,
    /// The completion id (feedback can still rate it).
    pub request_id: String,
    /// Whether the turn is withheld because a source is no longer readable.
    pub redacted: bool,
    /// The question (absent when redacted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// The answer (absent when redacted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// Its sources (empty when redacted).
    pub sources: Vec<SourceView>,
    /// Why it is redacted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notice: Option<&'static str>,
}

/// `GET /v1/conversations/{id}`.
#[derive(Debug, Serialize)]
pub struct ThreadResponse {
    /// The thread.
    #[serde(flatten)]
    pub thread: Thread,
    /// Its turns, oldest first.
    pub messages: Vec<TurnView>,
}

pub(crate) fn check_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(ApiError::NotFound(UNKNOWN_THREAD.into()));
    }
    Ok(())
}

/// The turns as `user_id` may see them now: a turn is readable only while every document of
/// its provenance is readable at the version it saw.
pub(crate) fn views(
    services: &crate::Services,
    user_id: &str,
    turns: Vec<StoredTurn>,
) -> Result<Vec<TurnView>, ApiError> {
    let withheld = airlock_serving::answer::withheld_now(services, user_id, &turns)?;
    Ok(turns
        .into_iter()
        .zip(withheld)
        .map(|(t, why)| {
            let created_at = airlock_evidence::feedback::rfc3339_us(t.created_us);
            if let Some(why) = why {
                return TurnView {
                    n: t.seq,
                    created_at,
                    request_id: t.request_id,
                    redacted: true,
                    question: None,
                    answer: None,
                    sources: Vec::new(),
                    notice: Some(match why {
                        Withheld::Unavailable => REDACTED_NOTICE,
                        Withheld::Changed => CHANGED_NOTICE,
                    }),
                };
            }
            let sources = t
                .sources
                .into_iter()
                .map(|s| SourceView {
                    doc_id: s.doc_id,
                    cited: s.cited,
                })
                .collect();
            TurnView {
                n: t.seq,
                created_at,
                request_id: t.request_id,
                redacted: false,
                question: Some(t.question),
                answer: Some(t.answer),
                sources,
                notice: None,
            }
        })
        .collect())
}

fn store(
    state: &AppState,
) -> Result<std::sync::Arc<airlock_evidence::feedback::FeedbackStore>, ApiError> {
    state
        .services()?
        .feedback
        .clone()
        .ok_or_else(|| ApiError::NotFound(UNKNOWN_THREAD.into()))
}

/// `GET /v1/conversations`.
pub async fn list(State(state): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    let store = store(&state)?;
    let retention = state.config().conversation_retention();
    let data = blocking(move || {
        // Retention: threads untouched for longer are removed before any listing.
        let cutoff = airlock_evidence::feedback::now_us()
            .saturating_sub(i64::try_from(retention.as_micros()).unwrap_or(i64::MAX));
        store.expire_threads(cutoff)?;
        Ok(store.threads(&caller.user_id)?)
    })
    .await?;
    Ok(Json(ListResponse { data }).into_response())
}

/// `POST /v1/conversations`.
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<CreateRequest>,
) -> Result<Response, ApiError> {
    let title = req
        .title
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| "New conversation".to_string());
    if title.len() > 4 * airlock_evidence::conversations::MAX_TITLE_BYTES {
        return Err(ApiError::InvalidRequest(format!(
            "`title` must be at most {} bytes",
            4 * airlock_evidence::conversations::MAX_TITLE_BYTES
        )));
    }
    let store = store(&state)?;
    let created = blocking(move || Ok(store.create_thread(&caller.user_id, &title)?)).await?;
    match created {
        Some(t) => Ok((StatusCode::CREATED, Json(t)).into_response()),
        None => Err(ApiError::InvalidRequest(format!(
            "you hold {} conversations, the most kept per user: delete one first",
            airlock_evidence::conversations::MAX_THREADS_PER_USER
        ))),
    }
}

/// `GET /v1/conversations/{id}`.
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    check_id(&id)?;
    let services = state.services()?;
    let store = store(&state)?;
    let body = blocking(move || {
        let Some((thread, turns)) = store.thread(&caller.user_id, &id)? else {
            return Err(ApiError::NotFound(UNKNOWN_THREAD.into()));
        };
        let messages = views(&services, &caller.user_id, turns)?;
        Ok(ThreadResponse { thread, messages })
    })
    .await?;
    Ok(Json(body).into_response())
}

/// `DELETE /v1/conversations/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    check_id(&id)?;
    let store = store(&state)?;
    let deleted = blocking(move || Ok(store.delete_thread(&caller.user_id, &id)?)).await?;
    if !deleted {
        return Err(ApiError::NotFound(UNKNOWN_THREAD.into()));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}
