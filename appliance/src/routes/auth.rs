//! Directory sign-in: `POST /v1/auth/login` (LDAP / Active Directory) opens a session cookie,
//! `POST /v1/auth/logout` ends it; `POST /v1/acl/sync/ldap` (admin) applies the directory's
//! memberships now. See `airlock_identity::ldap` for the directory side and `crate::session` for the cookie,
//! the CSRF header and the failure limits.

use std::net::SocketAddr;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::auth::{Admin, Caller};
use crate::error::ApiError;
use crate::extract::{ApiJson, RequestId};
use crate::routes::acl::{actor_of, blocking};
use crate::session;
use crate::state::AppState;
use airlock_identity::ldap::{Credentials, Directory, DirectoryError, DirectoryUser};

/// The audit actor of directory sign-ins.
pub const LOGIN_ACTOR: &str = "ldap-login";

/// The OIDC entry of `GET /v1/auth/methods`: what the web UI's "Sign in with …" button shows and
/// where it goes.
#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
pub struct OidcMethod {
    /// The identity provider's name for the button ("Sign in with <display_name>").
    pub display_name: String,
    /// The route that starts the authorization-code flow.
    pub login_url: String,
}

/// The configured OIDC sign-in, if any (`[oidc]`, discovered at start).
pub fn oidc_method(state: &AppState) -> Option<OidcMethod> {
    state.oidc().map(|o| OidcMethod {
        display_name: o.display_name().to_string(),
        login_url: o.login_url().to_string(),
    })
}

/// `GET /v1/auth/methods` (no authentication) → which sign-ins the web UI offers:
/// `{"ldap": bool, "oidc": null | {"display_name", "login_url"}, "trusted_header": bool,
/// "token": true}`. Names only: no URL of the directory, no secret, no user.
pub async fn methods(State(state): State<AppState>) -> Response {
    let cfg = state.config();
    let mut resp = Json(json!({
        "ldap": cfg.ldap.is_some(),
        "oidc": oidc_method(&state),
        "trusted_header": cfg.trusted_header.is_some() && cfg.trusted_header_secret.is_some(),
        "token": true,
    }))
    .into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Body of `POST /v1/auth/login`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginBody {
    /// The directory username (`user_filter`'s `{username}`).
    pub username: String,
    /// The directory password.
    pub password: String,
}

impl std::fmt::Debug for LoginBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginBody")
            .field("username", &self.username)
            .field("password", &"[redacted]")
            .finish()
    }
}

fn check_login(b: &LoginBody) -> Result<(), ApiError> {
    let bad = |m: &str| Err(ApiError::InvalidRequest(m.into()));
    if b.username.trim().is_empty() {
        return bad("`username` must not be empty");
    }
    if b.username.len() > 256 || b.username.chars().any(char::is_control) {
        return bad("`username` must be at most 256 bytes without control characters");
    }
    if b.username
        .chars()
        .any(airlock_identity::ldap::is_ignorable_in_usernames)
    {
        // The directory would ignore them and match another spelling's account.
        return bad(
            "`username` must not contain invisible characters (soft hyphens, zero-width or \
             format characters, variation selectors)",
        );
    }
    if b.password.is_empty() {
        // An empty password is an anonymous bind to many directories: never sent.
        return bad("`password` must not be empty");
    }
    if b.password.len() > 1024 {
        return bad("`password` must be at most 1024 bytes");
    }
    Ok(())
}

/// Writes a sign-in audit entry (actor `ldap-login`); a failure is logged, not answered (the
/// refusal it records stands either way).
async fn audit(acl: &std::sync::Arc<airlock_acl::Acl>, request_id: &str, event: Owned) -> bool {
    audit_as(acl, LOGIN_ACTOR, request_id, event).await
}

/// [`audit`] with another actor (`oidc-login` for OIDC sign-ins).
pub(crate) async fn audit_as(
    acl: &std::sync::Arc<airlock_acl::Acl>,
    actor: &'static str,
    request_id: &str,
    event: Owned,
) -> bool {
    let acl = acl.clone();
    let request_id = request_id.to_owned();
    let done = blocking(move || {
        Ok(acl.audit_sign_in(
            airlock_acl::Actor {
                user_id: actor,
                request_id: Some(&request_id),
            },
            &event.borrowed(),
        )?)
    })
    .await;
    match done {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = ?e, "writing a sign-in audit entry failed");
            false
        }
    }
}

/// An owned [`airlock_acl::SignIn`] (it crosses into a blocking task).
pub(crate) struct Owned {
    pub(crate) method: &'static str,
    pub(crate) outcome: &'static str,
    pub(crate) user_id: Option<String>,
    pub(crate) username: Option<String>,
    pub(crate) client: String,
}

/// Gives an external identity (directory or OIDC) its memberships and a session, as `actor`.
/// `Ok(Err(_))`: the identity is refused (a local account's id), nothing was changed.
pub(crate) async fn open_external_session(
    acl: &std::sync::Arc<airlock_acl::Acl>,
    actor: &'static str,
    request_id: &str,
    user_id: &str,
    groups: &[String],
    absolute: std::time::Duration,
) -> Result<Result<airlock_acl::NewSession, airlock_acl::Error>, ApiError> {
    let acl = acl.clone();
    let (uid, groups, rid) = (user_id.to_owned(), groups.to_vec(), request_id.to_owned());
    blocking(move || {
        let synced = acl.sync_directory_user(
            airlock_acl::Actor {
                user_id: actor,
                request_id: Some(&rid),
            },
            &uid,
            &groups,
        );
        match synced {
            Ok(_) => Ok(Ok(acl.create_session(&uid, absolute)?)),
            Err(e @ airlock_acl::Error::LocalAccount { .. }) => Ok(Err(e)),
            Err(e) => Err(e.into()),
        }
    })
    .await
}

impl Owned {
    fn borrowed(&self) -> airlock_acl::SignIn<'_> {
        airlock_acl::SignIn {
            method: self.method,
            outcome: self.outcome,
            user_id: self.user_id.as_deref(),
            username: self.username.as_deref(),
            client: Some(&self.client),
        }
    }
}

/// `POST /v1/auth/login` `{"username", "password"}` → 200 `{"user", "groups", "expires_at",
/// "csrf_token"}` with the session cookie. Every attempt that reaches the limits (a success and
/// each refusal: rate limit, wrong password, unknown user, disabled, directory unavailable) is
/// audited (`sign_in`); nothing else changes for a refusal.
pub async fn login(
    State(state): State<AppState>,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    RequestId(request_id): RequestId,
    ApiJson(body): ApiJson<LoginBody>,
) -> Result<Response, ApiError> {
    let Some(cfg) = state.config().ldap.clone() else {
        return Err(ApiError::NotFound(
            "directory sign-in is not configured ([ldap])".into(),
        ));
    };
    let services = state.services()?;
    check_login(&body)?;
    // One name per account for the limits and the directory: `bob`, ` bob`, `BOB` and `ｂｏｂ`
    // are the same attempt (the directory would match them all to bob).
    let username = airlock_identity::ldap::canonical_username(&body.username);
    if username.is_empty() {
        return Err(ApiError::InvalidRequest(
            "`username` must not be empty".into(),
        ));
    }
    let address = peer.map_or_else(|| "unknown".to_string(), |c| c.0.0.ip().to_string());
    let event = |outcome, user_id: Option<String>| Owned {
        method: "ldap",
        outcome,
        username: user_id.is_none().then(|| username.clone()),
        user_id,
        client: address.clone(),
    };
    let limits = (cfg.max_failures_per_user, cfg.max_failures_per_address);
    let window = std::time::Duration::from_secs(cfg.failure_window_secs);
    let limiter = state.logins();
    if let Err(r) = limiter.check(&username, &address, limits, window) {
        audit(&services.acl, &request_id, event("rate_limited", None)).await;
        return Err(ApiError::LoginRateLimited {
            retry_after: r.retry_after,
        });
    }
    let outcome = Directory::new(cfg).login(&username, &body.password).await;
    let user = match outcome {
        Ok(u) => u,
        Err(e) => {
            if matches!(
                e,
                DirectoryError::InvalidCredentials(_) | DirectoryError::Disabled(_)
            ) {
                limiter.failed(&username, &address);
            }
            tracing::info!(request_id = %request_id, error = %e, "directory sign-in refused");
            let (what, err) = directory_refusal(e, &event);
            audit(&services.acl, &request_id, what).await;
            return Err(err);
        }
    };
    let absolute = state.config().sessions().absolute();
    let s = match open_external_session(
        &services.acl,
        LOGIN_ACTOR,
        &request_id,
        &user.user_id,
        &user.groups,
        absolute,
    )
    .await?
    {
        Ok(s) => s,
        Err(e) => {
            let what = event("local_account", Some(user.user_id.clone()));
            audit(&services.acl, &request_id, what).await;
            return Err(e.into());
        }
    };
    // A sign-in the audit log does not show is not handed out.
    if !audit(
        &services.acl,
        &request_id,
        event("success", Some(user.user_id.clone())),
    )
    .await
    {
        let acl = services.acl.clone();
        let secret = s.token.clone();
        blocking(move || Ok(acl.end_session(&secret)?)).await?;
        return Err(ApiError::internal("the sign-in could not be audited"));
    }
    Ok(session_response(&user, &s))
}

/// The audit event and the error of a refused directory sign-in. Unknown user and wrong
/// password differ only in the event (the same audit write for both: the client sees the same
/// body after the same work).
fn directory_refusal(
    e: DirectoryError,
    event: &impl Fn(&'static str, Option<String>) -> Owned,
) -> (Owned, ApiError) {
    match e {
        DirectoryError::InvalidCredentials(c) => {
            let uid = match &c {
                Credentials::WrongPassword(uid) => uid.clone(),
                _ => None,
            };
            (event(c.outcome(), uid), ApiError::InvalidCredentials)
        }
        DirectoryError::Disabled(uid) => (event("disabled", uid), ApiError::AccountDisabled),
        DirectoryError::Unavailable(cause) => (
            event("directory_unavailable", None),
            ApiError::DirectoryUnavailable(cause),
        ),
        // The account's own entry is unusable (no user id, or several): refused.
        DirectoryError::BadEntry(_) => (
            event("bad_entry", None),
            ApiError::Forbidden(
                "the directory entry of this account does not have exactly one user id",
            ),
        ),
    }
}

/// The signed-in session's body, with its cookie set.
fn session_response(user: &DirectoryUser, s: &airlock_acl::NewSession) -> Response {
    let mut resp = Json(json!({
        "user": user.user_id,
        "groups": user.groups,
        "expires_at": s.expires_at,
        "csrf_token": s.csrf,
    }))
    .into_response();
    let h = resp.headers_mut();
    h.insert(header::SET_COOKIE, session::set_cookie(&s.token));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// `POST /v1/auth/logout` → 204: ends the request's session (cookie) and clears the cookie.
/// A cookie-authenticated logout needs the CSRF header like every state-changing request.
/// Ending a session is audited (`sign_in`, outcome `logout`).
pub async fn logout(
    State(state): State<AppState>,
    caller: Caller,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    RequestId(request_id): RequestId,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let services = state.services()?;
    if let Some(secret) = session::cookie(&headers).map(str::to_owned) {
        let acl = services.acl.clone();
        let ended = blocking(move || Ok(acl.end_session(&secret)?)).await?;
        if ended {
            let client = peer.map_or_else(|| "unknown".to_string(), |c| c.0.0.ip().to_string());
            let event = Owned {
                method: "session",
                outcome: "logout",
                user_id: Some(caller.user_id.clone()),
                username: None,
                client,
            };
            audit(&services.acl, &request_id, event).await;
        }
    }
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut()
        .insert(header::SET_COOKIE, session::clear_cookie());
    Ok(resp)
}

/// `POST /v1/acl/sync/ldap` (admin) → 200 with the sync counts: the memberships of every
/// enabled directory user now (what `airlock acl sync --ldap` and the serve schedule do).
pub async fn sync(
    State(state): State<AppState>,
    Admin(actor): Admin,
    RequestId(request_id): RequestId,
) -> Result<Response, ApiError> {
    let Some(cfg) = state.config().ldap.clone() else {
        return Err(ApiError::NotFound(
            "directory sync is not configured ([ldap])".into(),
        ));
    };
    let services = state.services()?;
    // A failed run is recorded for the console's sync history (routes/admin.rs).
    let (acl, who, rid) = (services.acl.clone(), actor.clone(), request_id.clone());
    let failed = move |e: ApiError| {
        crate::routes::admin::record_sync_failure(&acl, actor_of(&who, &rid), "directory", &e);
        e
    };
    let users = match Directory::new(cfg).all_users().await {
        Ok(u) => u,
        Err(e) => {
            let e = match e {
                DirectoryError::Unavailable(c) => ApiError::DirectoryUnavailable(c),
                other => ApiError::internal(other),
            };
            return Err(blocking(move || Ok(failed(e))).await?);
        }
    };
    let acl = services.acl.clone();
    let counts = blocking(move || {
        let list = airlock_identity::ldap::membership_list(users);
        acl.sync_directory(actor_of(&actor, &request_id), &list)
            .map_err(|e| failed(ApiError::from(e)))
    })
    .await?;
    state.metrics().iam_synced_now();
    Ok(Json(counts).into_response())
}

/// `[ldap] sync_interval_secs`: applies the directory's memberships on that schedule for the
/// daemon's life (a failed round is logged and retried at the next tick; nothing is changed).
pub async fn sync_schedule(state: AppState) {
    let Some(cfg) = state.config().ldap.clone() else {
        return;
    };
    let Some(every) = cfg.sync_interval_secs else {
        return;
    };
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(every));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Ok(services) = state.services() else {
            return;
        };
        let users = match Directory::new(cfg.clone()).all_users().await {
            Ok(u) => u,
            Err(e) => {
                record_scheduled_failure(&services.acl, e.to_string()).await;
                continue;
            }
        };
        let acl = services.acl.clone();
        let done = blocking(move || {
            let list = airlock_identity::ldap::membership_list(users);
            Ok(acl.sync_directory("ldap-schedule", &list)?)
        })
        .await;
        if done.is_ok() {
            state.metrics().iam_synced_now();
        }
        match done {
            Ok(c) => tracing::info!(
                users_added = c.users_added,
                users_removed = c.users_removed,
                memberships_changed = c.memberships_changed,
                users_access_changed = c.users_access_changed,
                "scheduled directory sync applied"
            ),
            Err(e) => {
                record_scheduled_failure(&services.acl, e.to_string()).await;
            }
        }
    }
}

/// Logs a failed scheduled directory sync and records it in the audit log (the console's sync
/// history).
async fn record_scheduled_failure(acl: &std::sync::Arc<airlock_acl::Acl>, error: String) {
    tracing::warn!(error = %error, "scheduled directory sync failed");
    let acl = acl.clone();
    let _ = blocking(move || {
        crate::routes::admin::record_sync_failure(
            &acl,
            "ldap-schedule".into(),
            "directory",
            &error,
        );
        Ok(())
    })
    .await;
}
