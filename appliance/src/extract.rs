//! Body extractors that enforce the configured size limits and turn every rejection into a
//! problem from the error table (axum's own rejections answer in plain text).
//!
//! Handlers take the caller (auth, from the request head) before the body, so authentication
//! is always checked before a byte of the body is read.

use axum::body::Body;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderName, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// Whether a client's `X-Request-Id` is kept: 1 to 64 characters of `[A-Za-z0-9._-]`. Any
/// other id is replaced by a fresh UUID, so ids in logs, audit rows, completion ids and
/// feedback keys are short and printable whatever a client sends.
pub fn valid_request_id(id: &str) -> bool {
    (1..=MAX_REQUEST_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The longest client request id kept (longer ones are replaced).
pub const MAX_REQUEST_ID_LEN: usize = 64;

/// The request id header, set on every request that lacks a valid one and echoed on every
/// response.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Which limit applies to a body.
#[derive(Debug, Clone, Copy)]
enum Limit {
    /// `body_limit` (1 MiB by default).
    Ordinary,
    /// `upload_limit` (32 MiB by default): documents and IAM syncs.
    Upload,
}

async fn read_body(req: Request, state: &AppState, which: Limit) -> Result<Bytes, ApiError> {
    let limit = match which {
        Limit::Ordinary => state.config().body_limit(),
        Limit::Upload => state.config().upload_limit(),
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let body: Body = req.into_body();
    // One deadline for the whole body: a client trickling a byte at a time cannot hold the
    // handler (and its connection) longer than this.
    let timeout = state.config().body_read_timeout();
    let read = tokio::time::timeout(timeout, Limited::new(body, limit).collect());
    let Ok(read) = read.await else {
        return Err(ApiError::RequestTimeout {
            what: "body",
            limit_secs: timeout.as_secs(),
        });
    };
    match read {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::PayloadTooLarge { limit })
        }
        Err(e) => Err(ApiError::InvalidRequest(format!(
            "could not read the request body: {e}"
        ))),
    }
}

/// The body's media type must be one of `accepted` (or a `+json` type): a missing or other
/// `Content-Type` is `415 unsupported-media-type` before the body is read. Strict on purpose:
/// `text/plain` and form types are what a page on another site can send without a CORS
/// preflight, so a JSON route that took them would be open to cross-site requests.
fn check_content_type(req: &Request, accepted: &[&str]) -> Result<(), ApiError> {
    let refused = |what: String| {
        ApiError::UnsupportedMediaType(format!(
            "{what}; this route takes {} (Content-Type)",
            accepted.join(" or ")
        ))
    };
    let Some(ct) = req.headers().get(header::CONTENT_TYPE) else {
        return Err(refused("the request has no Content-Type".into()));
    };
    let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
    let essence = ct.split(';').next().unwrap_or("").trim();
    if accepted.contains(&essence) || essence.ends_with("+json") {
        Ok(())
    } else {
        Err(refused(format!(
            "unsupported content type `{essence:.100}`"
        )))
    }
}

/// Parses a JSON body; the message names the line, column and reason of the first error.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::InvalidRequest(format!("invalid JSON body: {e}")))
}

/// A JSON body under the ordinary limit.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        check_content_type(&req, &["application/json"])?;
        let bytes = read_body(req, state, Limit::Ordinary).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// A JSON body under the upload limit (documents).
#[derive(Debug)]
pub struct UploadJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for UploadJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        check_content_type(&req, &["application/json"])?;
        let bytes = read_body(req, state, Limit::Upload).await?;
        parse_json(&bytes).map(UploadJson)
    }
}

/// A document upload (`PUT /v1/documents/{id}`) under the upload limit: a JSON body
/// (`application/json` or `+json`), or the raw file with its media type as `Content-Type` (any
/// type [`airlock_retrieval::SourceFormat::from_media_type`] knows). A missing or any other type
/// is refused with 415 before the body is read.
#[derive(Debug)]
pub enum JsonOrFile<T> {
    /// The JSON body.
    Json(T),
    /// A raw file.
    File {
        /// The `Content-Type` essence, lowercase (`application/pdf`).
        media_type: String,
        /// Its format.
        format: airlock_retrieval::SourceFormat,
        /// The file.
        bytes: Bytes,
    },
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonOrFile<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let essence = req.headers().get(header::CONTENT_TYPE).map(|ct| {
            ct.to_str()
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
        match essence {
            None => {
                return Err(ApiError::UnsupportedMediaType(
                    "the request has no Content-Type; send JSON (application/json) or a file \
                     with its media type"
                        .into(),
                ));
            }
            Some(e) if e == "application/json" || e.ends_with("+json") => {}
            Some(media_type) => {
                let Some(format) = airlock_retrieval::SourceFormat::from_media_type(&media_type)
                else {
                    return Err(ApiError::UnsupportedMediaType(format!(
                        "unsupported content type `{:.100}`; send JSON or a file as \
                         application/pdf, an Office Open XML type (.docx, .xlsx, .pptx), \
                         message/rfc822, text/csv, text/plain, text/markdown or text/html",
                        media_type
                    )));
                };
                let bytes = read_body(req, state, Limit::Upload).await?;
                return Ok(JsonOrFile::File {
                    media_type,
                    format,
                    bytes,
                });
            }
        }
        let bytes = read_body(req, state, Limit::Upload).await?;
        parse_json(&bytes).map(JsonOrFile::Json)
    }
}

/// A JSON Lines body under the upload limit (IAM syncs), as raw UTF-8 text.
#[derive(Debug)]
pub struct NdjsonText(pub String);

impl FromRequest<AppState> for NdjsonText {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        check_content_type(
            &req,
            &[
                "application/x-ndjson",
                "application/jsonl",
                "application/json",
            ],
        )?;
        let bytes = read_body(req, state, Limit::Upload).await?;
        String::from_utf8(bytes.to_vec())
            .map(NdjsonText)
            .map_err(|e| ApiError::InvalidRequest(format!("body is not UTF-8: {e}")))
    }
}

/// The request id (`x-request-id`: the client's if [`valid_request_id`] keeps
/// it, else the fresh UUID the request-id layer set).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for RequestId {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let id = parts
            .headers
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|v| valid_request_id(v))
            .map(str::to_owned)
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        Ok(RequestId(id))
    }
}
