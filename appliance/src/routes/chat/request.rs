//! Validation of a chat request.

use airlock_inference::generate::SamplingParams;
use airlock_rag::Role;

use crate::error::ApiError;
use crate::openai::ChatRequest;

use super::{MAX_COMPLETION_TOKENS, MAX_MESSAGES};

/// The messages as a conversation for the answer path: not empty, at most [`MAX_MESSAGES`],
/// with a non-empty user message (chat and `/v1/retrieve` alike).
pub(crate) fn conversation_of(
    messages: &[crate::openai::ChatMessage],
) -> Result<Vec<(Role, String)>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::InvalidRequest(
            "`messages` must not be empty".into(),
        ));
    }
    if messages.len() > MAX_MESSAGES {
        return Err(ApiError::InvalidRequest(format!(
            "`messages` takes at most {MAX_MESSAGES} messages"
        )));
    }
    if !messages
        .iter()
        .any(|m| Role::from_openai(&m.role) == Role::User && !m.content.trim().is_empty())
    {
        return Err(ApiError::InvalidRequest(
            "`messages` needs a non-empty user message".into(),
        ));
    }
    Ok(messages
        .iter()
        .map(|m| (Role::from_openai(&m.role), m.content.clone()))
        .collect())
}

pub(crate) fn validate(req: &ChatRequest, default_max: u32) -> Result<SamplingParams, ApiError> {
    if let Some((param, why)) = req.unsupported.refused() {
        return Err(ApiError::UnsupportedParameter { param, why });
    }
    conversation_of(&req.messages)?;
    let max_tokens = req
        .max_completion_tokens
        .or(req.max_tokens)
        .unwrap_or(default_max);
    if !(1..=MAX_COMPLETION_TOKENS).contains(&max_tokens) {
        return Err(ApiError::InvalidRequest(format!(
            "`max_tokens` must be between 1 and {MAX_COMPLETION_TOKENS}"
        )));
    }
    let temperature = req.temperature.unwrap_or(0.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::InvalidRequest(
            "`temperature` must be between 0 and 2".into(),
        ));
    }
    let top_p = req.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::InvalidRequest("`top_p` must be in (0, 1]".into()));
    }
    let stop = req.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 || stop.iter().any(|s| s.is_empty() || s.len() > 64) {
        return Err(ApiError::InvalidRequest(
            "`stop` takes at most 4 non-empty strings of at most 64 bytes".into(),
        ));
    }
    Ok(SamplingParams {
        temperature,
        top_p,
        seed: req.seed,
        max_tokens: max_tokens as usize,
        stop_token_ids: Vec::new(),
        stop_strings: stop,
    })
}
