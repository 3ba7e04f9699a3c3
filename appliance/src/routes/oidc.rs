//! OIDC sign-in: `GET /v1/auth/oidc/login` sends the browser to the identity provider,
//! `GET /v1/auth/oidc/callback` takes it back and opens the same session as a directory sign-in
//! (`crate::routes::auth::login`): the user's groups from the ID token become their
//! memberships (a one-user directory sync), then `airlock_session` and a CSRF token. See
//! `crate::oidc` for the checks.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::extract::RequestId;
use crate::oidc::{CallbackParams, OidcError, PRE_LOGIN_COOKIE, PRE_LOGIN_TTL};
use crate::routes::acl::blocking;
use crate::session;
use crate::state::AppState;

/// The audit actor of OIDC sign-ins (the membership change, as `ldap-login` for the directory).
pub const LOGIN_ACTOR: &str = "oidc-login";

fn pre_login_cookie(secret: &str) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{PRE_LOGIN_COOKIE}={secret}; HttpOnly; Secure; SameSite=Lax; Path=/v1/auth/oidc; \
         Max-Age={}",
        PRE_LOGIN_TTL.as_secs()
    ))
    .expect("base64url secrets")
}

fn clear_pre_login_cookie() -> HeaderValue {
    HeaderValue::from_static(
        "airlock_oidc=; HttpOnly; Secure; SameSite=Lax; Path=/v1/auth/oidc; Max-Age=0",
    )
}

/// The pre-login cookie of a request.
fn pre_login(headers: &HeaderMap) -> Option<&str> {
    crate::session::cookie_named(headers, PRE_LOGIN_COOKIE)
}

fn api_error(e: OidcError) -> ApiError {
    match e {
        OidcError::Refused(why) => ApiError::OidcRefused(why),
        OidcError::Unavailable(cause) => ApiError::IdpUnavailable(cause),
        OidcError::Busy => ApiError::CapacityUnavailable {
            retry_after: std::time::Duration::from_secs(5),
        },
    }
}

fn provider(state: &AppState) -> Result<std::sync::Arc<crate::oidc::Oidc>, ApiError> {
    if state.config().oidc.is_none() {
        return Err(ApiError::NotFound(
            "OIDC sign-in is not configured ([oidc])".into(),
        ));
    }
    state
        .oidc()
        .cloned()
        .ok_or_else(|| ApiError::IdpUnavailable("the OIDC provider has not been discovered".into()))
}

/// `GET /v1/auth/oidc/login` → 302 to the provider's authorization endpoint, with the
/// pre-login cookie naming the server-side state, nonce and PKCE verifier.
pub async fn login(State(state): State<AppState>) -> Result<Response, ApiError> {
    let oidc = provider(&state)?;
    let (secret, url) = oidc.begin().map_err(api_error)?;
    let location = HeaderValue::from_str(&url)
        .map_err(|e| ApiError::internal(format!("authorization URL: {e}")))?;
    let mut resp = StatusCode::FOUND.into_response();
    let h = resp.headers_mut();
    h.insert(header::LOCATION, location);
    h.insert(header::SET_COOKIE, pre_login_cookie(&secret));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// `GET /v1/auth/oidc/callback?code&state` → 302 to `/#csrf_token=…` with the session cookie;
/// every refusal is a problem and creates no session.
pub async fn callback(
    State(state): State<AppState>,
    RequestId(request_id): RequestId,
    headers: HeaderMap,
    Query(params): Query<CallbackParams>,
) -> Response {
    let mut resp = match signed_in(&state, &request_id, &headers, &params).await {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(request_id = %request_id, error = %e, "OIDC sign-in refused");
            e.into_response()
        }
    };
    let h = resp.headers_mut();
    // The pre-login entry is used up either way.
    h.append(header::SET_COOKIE, clear_pre_login_cookie());
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

async fn signed_in(
    state: &AppState,
    request_id: &str,
    headers: &HeaderMap,
    params: &CallbackParams,
) -> Result<Response, ApiError> {
    let oidc = provider(state)?;
    let services = state.services()?;
    let user = oidc
        .finish(pre_login(headers), params)
        .await
        .map_err(api_error)?;
    let absolute = state.config().sessions().absolute();
    let acl = services.acl.clone();
    let request_id = request_id.to_owned();
    let (uid, groups) = (user.user_id.clone(), user.groups.clone());
    let s = blocking(move || {
        acl.sync_directory_user(
            airlock_acl::Actor {
                user_id: LOGIN_ACTOR,
                request_id: Some(&request_id),
            },
            &uid,
            &groups,
        )?;
        Ok(acl.create_session(&uid, absolute)?)
    })
    .await?;
    tracing::info!(user = %user.user_id, groups = user.groups.len(), "OIDC sign-in");
    let location = HeaderValue::from_str(&format!("/#csrf_token={}", s.csrf))
        .map_err(|e| ApiError::internal(format!("redirect: {e}")))?;
    let mut resp = StatusCode::FOUND.into_response();
    let h = resp.headers_mut();
    h.insert(header::LOCATION, location);
    h.append(header::SET_COOKIE, session::set_cookie(&s.token));
    Ok(resp)
}
