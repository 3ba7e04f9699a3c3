//! `POST /v1/feedback`: a thumbs up/down and an optional comment on a chat completion the
//! caller received (its `id`, which is also its `X-Request-Id`). 201 for the first feedback of
//! this user on this completion, 200 when it replaces an earlier one.
//!
//! The completion must have been served to the caller: an id served to someone else is the
//! same 404, with the same body and the same statements, as an id never served. Only the
//! rating, the user's own comment and timestamps are stored; the comment never reaches logs or
//! metrics (`airlock_feedback_total{rating}` counts by rating only).

use airlock_evidence::feedback::{Feedback, PutOutcome, Rating, rfc3339_us};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::routes::acl::blocking;
use crate::state::AppState;

/// Longest comment, in Unicode scalar values.
pub const MAX_COMMENT_CHARS: usize = 2000;
/// Longest request id, in Unicode scalar values.
pub const MAX_REQUEST_ID_CHARS: usize = 200;
/// The 404 detail, the same whether the id is unknown or was served to another user.
pub const UNKNOWN_REQUEST: &str = "no chat completion with this request_id was served to you";

/// Body of `POST /v1/feedback` (unknown fields rejected).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    /// The `id` of a chat completion the caller received.
    pub request_id: String,
    /// `up` or `down`.
    pub rating: Rating,
    /// Optional free text; empty (or blank) means no comment.
    #[serde(default)]
    pub comment: Option<String>,
}

/// Response of `POST /v1/feedback`: the feedback as stored.
#[derive(Debug, Serialize)]
pub struct FeedbackResponse {
    /// The completion id.
    pub request_id: String,
    /// `up` or `down`.
    pub rating: Rating,
    /// The stored comment, or `null`.
    pub comment: Option<String>,
    /// When this user first rated this completion (RFC 3339).
    pub created_at: String,
}

impl From<Feedback> for FeedbackResponse {
    fn from(f: Feedback) -> Self {
        FeedbackResponse {
            request_id: f.request_id,
            rating: f.rating,
            comment: f.comment,
            created_at: rfc3339_us(f.created_us),
        }
    }
}

impl FeedbackRequest {
    /// Checks the limits; returns the comment to store (`None` when absent or blank).
    fn validate(&self) -> Result<Option<&str>, ApiError> {
        let id_chars = self.request_id.chars().count();
        if !(1..=MAX_REQUEST_ID_CHARS).contains(&id_chars) {
            return Err(ApiError::InvalidRequest(format!(
                "`request_id` must be 1 to {MAX_REQUEST_ID_CHARS} characters"
            )));
        }
        let comment = self.comment.as_deref().filter(|c| !c.trim().is_empty());
        if comment.is_some_and(|c| c.chars().count() > MAX_COMMENT_CHARS) {
            return Err(ApiError::InvalidRequest(format!(
                "`comment` must be at most {MAX_COMMENT_CHARS} characters"
            )));
        }
        Ok(comment)
    }
}

/// `POST /v1/feedback`.
pub async fn submit(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<FeedbackRequest>,
) -> Result<Response, ApiError> {
    let comment = req.validate()?.map(str::to_owned);
    let services = state.services()?;
    // The caller's request budget, shared with every other endpoint.
    state
        .admission()
        .quotas()
        .take_request(&caller.user_id, caller.admin, std::time::Instant::now())
        .map_err(|retry_after| {
            state.metrics().rate_limited("requests");
            ApiError::RateLimited { retry_after }
        })?;
    let Some(store) = services.feedback.clone() else {
        return Err(ApiError::NotFound(UNKNOWN_REQUEST.into()));
    };
    let rating = req.rating;
    let outcome = blocking(move || {
        Ok(store.put_feedback(&caller.user_id, &req.request_id, rating, comment.as_deref())?)
    })
    .await?;
    let (status, stored) = match outcome {
        PutOutcome::Created(f) => (StatusCode::CREATED, f),
        PutOutcome::Replaced(f) => (StatusCode::OK, f),
        PutOutcome::UnknownRequest => return Err(ApiError::NotFound(UNKNOWN_REQUEST.into())),
    };
    state.metrics().feedback(rating.as_str());
    tracing::info!(
        airlock.feedback.rating = rating.as_str(),
        airlock.feedback.replaced = status == StatusCode::OK,
        airlock.feedback.has_comment = stored.comment.is_some(),
        "feedback stored"
    );
    Ok((status, Json(FeedbackResponse::from(stored))).into_response())
}
