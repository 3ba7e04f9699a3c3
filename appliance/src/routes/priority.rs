//! The `X-Airlock-Priority` header (`airlock_serving::admission::PRIORITY_HEADER`) as an
//! extractor: an unknown value is 400 `invalid-request`.

use airlock_serving::admission::{PRIORITY_HEADER, Priority};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::error::ApiError;

/// A request's [`Priority`], read from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityHeader(pub Priority);

impl<S: Send + Sync> FromRequestParts<S> for PriorityHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let value = parts.headers.get(PRIORITY_HEADER).map(|v| v.as_bytes());
        Ok(PriorityHeader(Priority::from_header(value)?))
    }
}
