//! The one HTTP error table: every failure the API can report, its problem type slug and status,
//! and the RFC 9457 `application/problem+json` body.
//!
//! [`ApiError::slug_status`] is the single `match` (no `_` arm) from error to (slug, status).
//! 5xx bodies carry a fixed title and detail only; the cause goes to the log with the request id.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Prefix of every problem `type` URI.
pub const PROBLEM_BASE: &str = "https://airlock.local/problems/";

/// Every error the HTTP API reports.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON, missing or wrong-typed fields, bad UTF-8, out-of-range values.
    #[error("{0}")]
    InvalidRequest(String),
    /// An OpenAI request field the daemon does not implement (`tools`, `n` > 1, …): refused
    /// rather than silently ignored.
    #[error("`{param}` is not supported by this server{why}")]
    UnsupportedParameter {
        /// The field.
        param: &'static str,
        /// What is supported instead (empty, or starting with "; ").
        why: &'static str,
    },
    /// Prompt plus `max_tokens` exceeds the model context.
    #[error(
        "the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the context of {context} tokens"
    )]
    ContextTooLong {
        /// Tokens in the rendered prompt.
        prompt_tokens: usize,
        /// Requested completion tokens.
        max_tokens: usize,
        /// The model's context length.
        context: usize,
    },
    /// No token, an unknown token, or a token of a removed user.
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// Authenticated, but the endpoint or option needs the admin role.
    #[error("{0}")]
    Forbidden(&'static str),
    /// Unknown route, model or document; also documents the caller may not read.
    #[error("{0}")]
    NotFound(String),
    /// The change conflicts with the current state (e.g. removing the last admin); nothing changed.
    #[error("{0}")]
    Conflict(String),
    /// A body of a media type the route does not take (`PUT /v1/documents/{id}`: JSON or a
    /// file of a format the extractors read).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A well-formed request for content the server will not process: an uploaded file the
    /// extractor refused (scan, encryption, a limit, malformed, MSG, ...); the detail says why.
    #[error("{0}")]
    Unprocessable(String),
    /// Known route, wrong method.
    #[error("method {0} is not allowed on this route")]
    MethodNotAllowed(String),
    /// Body over the configured limit.
    #[error("the request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The limit that applied.
        limit: usize,
    },
    /// The request head or body did not arrive in time (slow or stalled client).
    #[error("the request {what} did not arrive within {limit_secs} s")]
    RequestTimeout {
        /// `head` or `body`.
        what: &'static str,
        /// The limit that applied, in seconds.
        limit_secs: u64,
    },
    /// Request target (path and query) over the configured limit.
    #[error("the request target exceeds the limit of {limit} bytes")]
    UriTooLong {
        /// The limit that applied.
        limit: usize,
    },
    /// Request head over the configured size, or too many header fields.
    #[error("{0}")]
    HeadersTooLarge(String),
    /// Per-user budget exhausted.
    #[error("request budget exhausted; retry later")]
    RateLimited {
        /// When to retry.
        retry_after: Duration,
    },
    /// The admission ladder shed the request.
    #[error("the appliance is at capacity; retry later")]
    CapacityUnavailable {
        /// When to retry.
        retry_after: Duration,
    },
    /// The daemon holds as many client connections as it allows (in all or from this address).
    #[error("too many open connections; retry later")]
    TooManyConnections,
    /// Queued past its deadline before the first token.
    #[error("the request waited past its deadline before generation started")]
    DeadlineExceeded,
    /// The daemon is starting or stopping: no verified bundle or index is loaded.
    #[error("the appliance is not ready")]
    NotReady,
    /// A remote generator (the inference rack) failed or broke off a generation. The cause is
    /// logged, never sent.
    #[error("the inference upstream failed: {0}")]
    UpstreamFailed(String),
    /// Anything that is our fault. The message is logged, never sent.
    #[error("internal error: {0}")]
    Internal(String),
    /// Directory sign-in: unknown user or wrong password (one answer for both).
    #[error("the username or password is wrong")]
    InvalidCredentials,
    /// Directory sign-in: the password is right but the account is disabled or locked.
    #[error("the account is disabled in the directory")]
    AccountDisabled,
    /// The directory cannot be reached (or refused the service account); the cause is logged.
    #[error("the directory is unavailable: {0}")]
    DirectoryUnavailable(String),
    /// Too many failed sign-ins for this username or from this address.
    #[error("too many failed sign-ins; retry later")]
    LoginRateLimited {
        /// When to retry.
        retry_after: Duration,
    },
    /// A state-changing request authenticated by a browser credential (the session cookie or
    /// the SSO proxy's header) without its CSRF token.
    #[error(
        "a state-changing request signed in by a session cookie or the SSO proxy needs its \
         X-Airlock-CSRF header (from the sign-in response or GET /v1/info)"
    )]
    CsrfRequired,
    /// A state-changing request a browser sent from another site (`Sec-Fetch-Site`, `Origin`).
    #[error("{0}")]
    CrossSite(&'static str),
    /// An access change that lets the caller read more, without a second person's approval or
    /// break-glass (crate::approvals); nothing changed.
    #[error("{0}")]
    ApprovalRequired(String),
    /// OIDC sign-in: a check of the callback failed (state, code, ID token); nothing changed.
    #[error("the OIDC sign-in was refused: {0}")]
    OidcRefused(String),
    /// OIDC sign-in: the identity provider cannot be reached or failed; the cause is logged.
    #[error("the identity provider is unavailable: {0}")]
    IdpUnavailable(String),
    /// A chat answer's receipt could not be written to the audit log: the answer is refused
    /// (no answer is served without its receipt). The cause is logged.
    #[error("the answer's receipt could not be recorded: {0}")]
    ReceiptUnrecorded(String),
}

impl ApiError {
    /// The problem type slug and HTTP status: THE error table.
    pub fn slug_status(&self) -> (&'static str, StatusCode) {
        match self {
            ApiError::InvalidRequest(_) => ("invalid-request", StatusCode::BAD_REQUEST),
            ApiError::UnsupportedParameter { .. } => {
                ("unsupported-parameter", StatusCode::BAD_REQUEST)
            }
            ApiError::ContextTooLong { .. } => ("context-too-long", StatusCode::BAD_REQUEST),
            ApiError::Unauthorized => ("unauthorized", StatusCode::UNAUTHORIZED),
            ApiError::Forbidden(_) => ("forbidden", StatusCode::FORBIDDEN),
            ApiError::NotFound(_) => ("not-found", StatusCode::NOT_FOUND),
            ApiError::Conflict(_) => ("conflict", StatusCode::CONFLICT),
            ApiError::MethodNotAllowed(_) => ("method-not-allowed", StatusCode::METHOD_NOT_ALLOWED),
            ApiError::UnsupportedMediaType(_) => {
                ("unsupported-media-type", StatusCode::UNSUPPORTED_MEDIA_TYPE)
            }
            ApiError::Unprocessable(_) => ("not-extracted", StatusCode::UNPROCESSABLE_ENTITY),
            ApiError::PayloadTooLarge { .. } => {
                ("payload-too-large", StatusCode::PAYLOAD_TOO_LARGE)
            }
            ApiError::RequestTimeout { .. } => ("request-timeout", StatusCode::REQUEST_TIMEOUT),
            ApiError::UriTooLong { .. } => ("uri-too-long", StatusCode::URI_TOO_LONG),
            ApiError::HeadersTooLarge(_) => (
                "headers-too-large",
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ),
            ApiError::RateLimited { .. } => ("rate-limited", StatusCode::TOO_MANY_REQUESTS),
            ApiError::CapacityUnavailable { .. } => {
                ("capacity-unavailable", StatusCode::SERVICE_UNAVAILABLE)
            }
            ApiError::TooManyConnections => {
                ("too-many-connections", StatusCode::SERVICE_UNAVAILABLE)
            }
            ApiError::DeadlineExceeded => ("deadline-exceeded", StatusCode::GATEWAY_TIMEOUT),
            ApiError::NotReady => ("not-ready", StatusCode::SERVICE_UNAVAILABLE),
            ApiError::UpstreamFailed(_) => ("upstream-failed", StatusCode::BAD_GATEWAY),
            ApiError::Internal(_) => ("internal", StatusCode::INTERNAL_SERVER_ERROR),
            ApiError::InvalidCredentials => ("invalid-credentials", StatusCode::UNAUTHORIZED),
            ApiError::AccountDisabled => ("account-disabled", StatusCode::FORBIDDEN),
            ApiError::DirectoryUnavailable(_) => {
                ("directory-unavailable", StatusCode::SERVICE_UNAVAILABLE)
            }
            ApiError::LoginRateLimited { .. } => {
                ("login-rate-limited", StatusCode::TOO_MANY_REQUESTS)
            }
            ApiError::CsrfRequired => ("csrf-failed", StatusCode::FORBIDDEN),
            ApiError::CrossSite(_) => ("cross-site", StatusCode::FORBIDDEN),
            ApiError::ApprovalRequired(_) => ("approval-required", StatusCode::FORBIDDEN),
            ApiError::OidcRefused(_) => ("oidc-refused", StatusCode::UNAUTHORIZED),
            ApiError::IdpUnavailable(_) => ("idp-unavailable", StatusCode::SERVICE_UNAVAILABLE),
            ApiError::ReceiptUnrecorded(_) => {
                ("receipt-unrecorded", StatusCode::SERVICE_UNAVAILABLE)
            }
        }
    }

    /// Shorthand for an internal fault with its cause (logged, not sent).
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        ApiError::Internal(cause.to_string())
    }

    /// A rejection by the framework (an axum extractor such as `Path`, whose body is plain
    /// text) in the table's terms: a server error is internal, anything else is
    /// `invalid-request` with the framework's explanation (`problem_bodies` in routes/mod.rs).
    pub fn from_rejection(status: StatusCode, text: String) -> Self {
        if status.is_server_error() {
            ApiError::Internal(format!("framework rejection {status}: {text}"))
        } else {
            ApiError::InvalidRequest(text)
        }
    }

    /// The `Retry-After` seconds, for the errors that carry one.
    pub(crate) fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::RateLimited { retry_after }
            | ApiError::LoginRateLimited { retry_after }
            | ApiError::CapacityUnavailable { retry_after } => Some(retry_after.as_secs().max(1)),
            ApiError::NotReady | ApiError::TooManyConnections => Some(1),
            _ => None,
        }
    }

    /// The RFC 9457 body.
    pub fn problem(&self) -> Problem {
        let (slug, status) = self.slug_status();
        let title = status.canonical_reason().unwrap_or("Error");
        let detail = if status.is_server_error() {
            match self {
                // Fixed texts: no internals in 5xx bodies.
                ApiError::CapacityUnavailable { .. }
                | ApiError::DeadlineExceeded
                | ApiError::NotReady
                | ApiError::TooManyConnections => self.to_string(),
                ApiError::DirectoryUnavailable(_) => {
                    "the directory is unavailable; retry later".to_string()
                }
                ApiError::IdpUnavailable(_) => {
                    "the identity provider is unavailable; retry later".to_string()
                }
                ApiError::ReceiptUnrecorded(_) => {
                    "the answer's receipt could not be recorded, so no answer is served; retry later"
                        .to_string()
                }
                _ => "the request could not be completed; the cause is logged under its request id"
                    .to_string(),
            }
        } else {
            self.to_string()
        };
        let error = Some(OpenAiError {
            message: detail.clone(),
            r#type: openai_type(status).to_string(),
            code: slug.replace('-', "_"),
            param: match self {
                ApiError::UnsupportedParameter { param, .. } => Some((*param).to_string()),
                _ => None,
            },
        });
        Problem {
            r#type: format!("{PROBLEM_BASE}{slug}"),
            title: title.to_string(),
            status: status.as_u16(),
            detail,
            error,
        }
    }
}

/// An RFC 9457 problem details object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Problem {
    /// `https://airlock.local/problems/<slug>`.
    pub r#type: String,
    /// The status's reason phrase.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// A human-readable explanation specific to this occurrence.
    pub detail: String,
    /// The same error in OpenAI's shape (`{"message", "type", "code", "param"}`), so the
    /// official SDKs print a useful message. An RFC 9457 extension member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<OpenAiError>,
}

/// The `error` member of a problem: what OpenAI clients read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct OpenAiError {
    /// The problem's `detail`.
    pub message: String,
    /// OpenAI's error class (`invalid_request_error`, `authentication_error`, …).
    pub r#type: String,
    /// The problem slug with underscores (`unsupported_parameter`).
    pub code: String,
    /// The request field at fault, when there is one.
    #[serde(default)]
    pub param: Option<String>,
}

/// OpenAI's error class for a status.
fn openai_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (_, status) = self.slug_status();
        match &self {
            // Overload answers are the ladder working as designed: counted in /metrics
            // (`airlock_shed_total`, requests by status), not errors of the appliance; at
            // ERROR they would flood the log exactly when an operator reads it.
            ApiError::CapacityUnavailable { .. }
            | ApiError::DeadlineExceeded
            | ApiError::TooManyConnections => {
                tracing::debug!(error = %self, "request not served (overload)");
            }
            _ if status.is_server_error() => tracing::error!(error = %self, "request failed"),
            _ => {}
        }
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut resp = (status, body).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after() {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

impl ApiError {
    /// The problem as a complete HTTP/1.1 response that closes the connection, for answers
    /// written on the socket before (or instead of) the router: a refused connection and a
    /// malformed or stalled first request head (`server.rs`, `head.rs`).
    pub fn http1_bytes(&self, request_id: &str) -> Vec<u8> {
        let (_, status) = self.slug_status();
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\n\
             x-request-id: {request_id}\r\nconnection: close\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or("Error"),
            body.len()
        );
        if let Some(secs) = self.retry_after() {
            out.push_str(&format!("retry-after: {secs}\r\n"));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&body);
        bytes
    }
}

impl From<airlock_acl::Error> for ApiError {
    fn from(e: airlock_acl::Error) -> Self {
        use airlock_acl::Error as E;
        match e {
            E::UnknownUser { .. } => ApiError::NotFound(e.to_string()),
            E::LastAdmin { .. } => ApiError::Conflict(e.to_string()),
            E::LocalAccount { .. } => ApiError::Forbidden(
                "this identity has the id of a local account: a directory or OIDC sign-in cannot \
                 use it",
            ),
            E::InvalidId { .. }
            | E::UserExists { .. }
            | E::UnknownRole { .. }
            | E::Snapshot { .. }
            | E::EmptySnapshot => ApiError::InvalidRequest(e.to_string()),
            E::SnapshotRead { .. }
            | E::Open { .. }
            | E::Database { .. }
            | E::SchemaTooNew { .. }
            | E::Joined { .. }
            | E::Corrupt { .. } => ApiError::internal(error_chain(&e)),
        }
    }
}

impl From<airlock_retrieval::Error> for ApiError {
    fn from(e: airlock_retrieval::Error) -> Self {
        use airlock_retrieval::Error as E;
        match e {
            E::DocumentTooLarge { limit, .. } => ApiError::PayloadTooLarge { limit },
            E::InvalidUtf8 { .. }
            | E::EmptyDocument { .. }
            | E::InvalidDocumentId { .. }
            | E::InvalidJsonl { .. }
            | E::UnsupportedFormat { .. }
            | E::Extraction { .. }
            | E::InvalidRequest(_)
            | E::VectorUnavailable(_) => ApiError::InvalidRequest(e.to_string()),
            E::Store { .. }
            | E::SchemaTooNew { .. }
            | E::Bm25 { .. }
            | E::Vector(_)
            | E::Model(_)
            | E::Io { .. }
            | E::Corrupt(_) => ApiError::internal(error_chain(&e)),
        }
    }
}

impl From<airlock_rag::Error> for ApiError {
    fn from(e: airlock_rag::Error) -> Self {
        match e {
            airlock_rag::Error::Retrieval(e) => e.into(),
            airlock_rag::Error::Acl(e) => e.into(),
        }
    }
}

impl From<airlock_evidence::feedback::FeedbackError> for ApiError {
    fn from(e: airlock_evidence::feedback::FeedbackError) -> Self {
        ApiError::internal(error_chain(&e))
    }
}

/// The error and its sources on one line, for logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl From<airlock_serving::generator::PromptError> for ApiError {
    fn from(e: airlock_serving::generator::PromptError) -> Self {
        ApiError::Internal(e.0)
    }
}

/// Maps an engine refusal to the error table.
pub fn submit_error(e: airlock_inference::generate::SubmitError) -> ApiError {
    match e {
        airlock_inference::generate::SubmitError::QueueFull { .. } => {
            ApiError::CapacityUnavailable {
                retry_after: std::time::Duration::from_secs(2),
            }
        }
        airlock_inference::generate::SubmitError::ContextTooLong {
            prompt_tokens,
            max_tokens,
            n_ctx,
        } => ApiError::ContextTooLong {
            prompt_tokens,
            max_tokens,
            context: n_ctx,
        },
        airlock_inference::generate::SubmitError::OverBudget { .. } => {
            ApiError::CapacityUnavailable {
                retry_after: std::time::Duration::from_secs(2),
            }
        }
        airlock_inference::generate::SubmitError::Invalid(m) => ApiError::InvalidRequest(m),
        airlock_inference::generate::SubmitError::Stopped => ApiError::NotReady,
    }
}

impl From<airlock_serving::admission::AdmissionError> for ApiError {
    fn from(e: airlock_serving::admission::AdmissionError) -> Self {
        use airlock_serving::admission::AdmissionError as E;
        match e {
            E::Shed { retry_after } => ApiError::CapacityUnavailable { retry_after },
            E::RateLimited { retry_after } => ApiError::RateLimited { retry_after },
            E::Invalid(m) => ApiError::InvalidRequest(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_hundreds_hide_internals() {
        let p =
            ApiError::internal("sqlite: disk I/O error at /var/lib/airlock/airlock.db").problem();
        assert_eq!(p.status, 500);
        assert!(!p.detail.contains("sqlite"), "{}", p.detail);
        assert!(p.r#type.ends_with("/internal"));
    }

    #[test]
    fn four_hundreds_explain() {
        let p = ApiError::InvalidRequest("missing field `query`".into()).problem();
        assert_eq!(p.status, 400);
        assert_eq!(p.detail, "missing field `query`");
        assert_eq!(p.title, "Bad Request");
    }
}
