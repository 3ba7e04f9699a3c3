//! The answer core's failures in the HTTP error table: the one place an [`AnswerError`]
//! becomes an [`ApiError`] (a problem type and status), and the rung header on the refusals
//! the ladder explains (a shed rack, rung 4's deadline).

use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::routes::conversations::UNKNOWN_THREAD;
use airlock_serving::answer::AnswerError;

use super::stream::with_rung;

impl From<AnswerError> for ApiError {
    fn from(e: AnswerError) -> Self {
        match e {
            AnswerError::UnknownThread => ApiError::NotFound(UNKNOWN_THREAD.into()),
            AnswerError::UnknownModel(m) => ApiError::NotFound(format!("no model `{m}`")),
            AnswerError::NotAChatModel(m) => {
                ApiError::InvalidRequest(format!("model `{m}` is not a chat model"))
            }
            AnswerError::NoGenerator => ApiError::internal("no generator is loaded"),
            AnswerError::Prompt(m) | AnswerError::Internal(m) => ApiError::Internal(m),
            AnswerError::Submit(e) => crate::error::submit_error(e),
            AnswerError::OverQuota { retry_after } => ApiError::RateLimited { retry_after },
            AnswerError::RackShed { retry_after, .. } => {
                ApiError::CapacityUnavailable { retry_after }
            }
            AnswerError::QueueDeadline { .. } => ApiError::DeadlineExceeded,
            AnswerError::Cancelled => ApiError::NotReady,
            AnswerError::Upstream(m) => ApiError::UpstreamFailed(m),
            AnswerError::ReceiptUnrecorded(m) => ApiError::ReceiptUnrecorded(m),
            AnswerError::Rag(e) => e.into(),
            AnswerError::Retrieval(e) => e.into(),
            AnswerError::Feedback(e) => e.into(),
        }
    }
}

/// The response refusing an answer: the problem, with `X-Airlock-Rung` where the refusal is
/// the ladder's (also on shed and deadline problems, so clients see why).
pub(super) fn refused(e: AnswerError) -> Response {
    let rung = match &e {
        AnswerError::RackShed { rung, .. } | AnswerError::QueueDeadline { rung } => Some(*rung),
        _ => None,
    };
    let resp = ApiError::from(e).into_response();
    match rung {
        Some(rung) => with_rung(resp, rung),
        None => resp,
    }
}
