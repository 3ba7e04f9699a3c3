//! Authentication: `Authorization: Bearer <token>` → user through the ACL's token table
//! (SHA-256 lookups), the `airlock_session` cookie of a directory or OIDC sign-in, or, when
//! configured, a user id set by a trusted SSO proxy that proves itself with a shared secret.
//! State-changing requests signed in by the cookie or the proxy also need their
//! `X-Airlock-CSRF` header (`crate::csrf`). Extractors run on the request head, before any body
//! is read.

use axum::extract::FromRequestParts;
use axum::http::HeaderName;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::state::AppState;

/// Header the SSO proxy uses to prove itself in trusted-header mode.
pub const PROXY_SECRET_HEADER: HeaderName = HeaderName::from_static("x-airlock-proxy-secret");

pub use airlock_identity::caller::Caller;

/// An authenticated caller that [`crate::roles::enforce`] let through to a role-gated route (its
/// role, and its client certificate when `tls.client_ca` is set, were checked there). Refuses
/// (403) when that layer did not run: a route outside the role table is never served.
#[derive(Debug, Clone)]
pub struct Admin(pub Caller);

/// The token of an `Authorization: Bearer` header, if well-formed.
pub fn bearer(parts: &Parts) -> Option<&str> {
    let v = parts.headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// Constant-time equality of two secrets (compares their SHA-256 digests).
pub fn secrets_equal(a: &str, b: &str) -> bool {
    let da = Sha256::digest(a.as_bytes());
    let db = Sha256::digest(b.as_bytes());
    da.iter()
        .zip(db.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if let Some(c) = parts.extensions.get::<Caller>() {
            return Ok(c.clone());
        }
        let services = state.services()?;
        let caller = if let Some(token) = bearer(parts) {
            services.authenticate(token)
        } else if let Some(secret) = crate::session::cookie(&parts.headers) {
            session_caller(parts, state, &services, secret)?
        } else if let (Some(header), Some(secret)) = (
            state.config().trusted_header.as_deref(),
            state.config().trusted_header_secret.as_deref(),
        ) {
            let proof = parts
                .headers
                .get(PROXY_SECRET_HEADER)
                .and_then(|v| v.to_str().ok());
            let user = parts.headers.get(header).and_then(|v| v.to_str().ok());
            match (proof, user) {
                (Some(p), Some(u)) if secrets_equal(p, secret) => {
                    let caller = services.principal(u.trim());
                    if let Some(c) = &caller {
                        let token = crate::csrf::proxy_token(secret, &c.user_id);
                        if !crate::csrf::is_safe(&parts.method) {
                            let presented = parts
                                .headers
                                .get(crate::session::CSRF_HEADER)
                                .and_then(|v| v.to_str().ok());
                            if !presented.is_some_and(|p| secrets_equal(p, &token)) {
                                return Err(ApiError::CsrfRequired);
                            }
                        }
                        parts.extensions.insert(crate::csrf::ProxyCsrf(token));
                    }
                    caller
                }
                _ => None,
            }
        } else {
            None
        };
        let caller = caller.ok_or(ApiError::Unauthorized)?;
        parts.extensions.insert(caller.clone());
        Ok(caller)
    }
}

/// The caller of a session cookie; `None` (→ 401) for an unknown, ended or expired session.
fn session_caller(
    parts: &Parts,
    state: &AppState,
    services: &std::sync::Arc<airlock_serving::services::Services>,
    secret: &str,
) -> Result<Option<Caller>, ApiError> {
    let idle = state.config().sessions().idle();
    let Some(s) = services.acl.session(secret, idle) else {
        return Ok(None);
    };
    if !crate::csrf::is_safe(&parts.method) {
        let presented = parts
            .headers
            .get(crate::session::CSRF_HEADER)
            .and_then(|v| v.to_str().ok());
        if !presented.is_some_and(|p| s.csrf_matches(p)) {
            return Err(ApiError::CsrfRequired);
        }
    }
    if s.persist_due {
        let acl = services.acl.clone();
        let secret = secret.to_owned();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = acl.persist_session_seen(&secret) {
                tracing::warn!(error = %e, "recording a session's use failed");
            }
        });
    }
    Ok(Some(Caller::new(s.principal.user_id, s.principal.roles)))
}

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, state).await?;
        if crate::roles::authorized(parts) {
            Ok(Admin(caller))
        } else {
            Err(ApiError::Forbidden(
                "this endpoint is not in the role table",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    fn parts(auth: &str) -> Parts {
        Request::builder()
            .header(AUTHORIZATION, auth)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(&parts("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&parts("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(&parts("Basic abc")), None);
        assert_eq!(bearer(&parts("Bearer ")), None);
    }

    #[test]
    fn secret_compare() {
        assert!(secrets_equal("same-secret", "same-secret"));
        assert!(!secrets_equal("same-secret", "same-secres"));
        assert!(!secrets_equal("a", "ab"));
    }
}
