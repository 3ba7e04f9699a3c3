//! OIDC sign-in: `GET /v1/auth/oidc/login` sends the browser to the identity provider,
//! `GET /v1/auth/oidc/callback` takes it back and opens the same session as a directory sign-in
//! (`crate::routes::auth::login`): the user's groups from the ID token become their
//! memberships (a one-user directory sync), then `airlock_session` and a CSRF token. See
//! `airlock_identity::oidc` for the checks.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::extract::RequestId;
use crate::routes::auth::{Owned, audit_as, open_external_session};
use crate::session;
use crate::state::AppState;
use airlock_identity::oidc::{CallbackParams, OidcError, PRE_LOGIN_COOKIE, PRE_LOGIN_TTL};

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
    }
}

fn provider(state: &AppState) -> Result<std::sync::Arc<airlock_identity::oidc::Oidc>, ApiError> {
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

fn client_of(peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>) -> Option<std::net::IpAddr> {
    peer.map(|c| c.0.0.ip())
}

/// `GET /v1/auth/oidc/login` → 302 to the provider's authorization endpoint, with the
/// pre-login cookie naming the server-side state, nonce and PKCE verifier. Sign-ins in
/// progress are bounded per client address (`airlock_identity::oidc::MAX_PENDING_PER_CLIENT`,
/// the oldest of that address forgotten first) and in all.
pub async fn login(
    State(state): State<AppState>,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
) -> Result<Response, ApiError> {
    let oidc = provider(&state)?;
    let (secret, url) = oidc.begin(client_of(peer)).map_err(api_error)?;
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
/// every refusal is a problem and creates no session. Every callback is audited (`sign_in`,
/// method `oidc`, the same fields as a directory sign-in).
pub async fn callback(
    State(state): State<AppState>,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    RequestId(request_id): RequestId,
    headers: HeaderMap,
    Query(params): Query<CallbackParams>,
) -> Response {
    let client = client_of(peer).map_or_else(|| "unknown".to_string(), |ip| ip.to_string());
    let mut resp = match signed_in(&state, &request_id, &headers, &params, client).await {
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

/// The audit outcome of a refused callback.
fn outcome_of(e: &OidcError) -> &'static str {
    match e {
        OidcError::Refused(_) => "refused",
        OidcError::Unavailable(_) => "idp_unavailable",
    }
}

async fn signed_in(
    state: &AppState,
    request_id: &str,
    headers: &HeaderMap,
    params: &CallbackParams,
    client: String,
) -> Result<Response, ApiError> {
    let oidc = provider(state)?;
    let services = state.services()?;
    let event = |outcome, user_id: Option<String>| Owned {
        method: "oidc",
        outcome,
        user_id,
        username: None,
        client: client.clone(),
    };
    let user = match oidc.finish(pre_login(headers), params).await {
        Ok(u) => u,
        Err(e) => {
            audit_as(
                &services.acl,
                LOGIN_ACTOR,
                request_id,
                event(outcome_of(&e), None),
            )
            .await;
            return Err(api_error(e));
        }
    };
    let absolute = state.config().sessions().absolute();
    let s = match open_external_session(
        &services.acl,
        LOGIN_ACTOR,
        request_id,
        &user.user_id,
        &user.groups,
        absolute,
    )
    .await?
    {
        Ok(s) => s,
        Err(e) => {
            let what = event("local_account", Some(user.user_id.clone()));
            audit_as(&services.acl, LOGIN_ACTOR, request_id, what).await;
            return Err(e.into());
        }
    };
    // A sign-in the audit log does not show is not handed out.
    let what = event("success", Some(user.user_id.clone()));
    if !audit_as(&services.acl, LOGIN_ACTOR, request_id, what).await {
        let acl = services.acl.clone();
        let secret = s.token.clone();
        crate::routes::acl::blocking(move || Ok(acl.end_session(&secret)?)).await?;
        return Err(ApiError::internal("the sign-in could not be audited"));
    }
    tracing::info!(user = %user.user_id, groups = user.groups.len(), "OIDC sign-in");
    let location = HeaderValue::from_str(&format!("/#csrf_token={}", s.csrf))
        .map_err(|e| ApiError::internal(format!("redirect: {e}")))?;
    let mut resp = StatusCode::FOUND.into_response();
    let h = resp.headers_mut();
    h.insert(header::LOCATION, location);
    h.append(header::SET_COOKIE, session::set_cookie(&s.token));
    Ok(resp)
}
