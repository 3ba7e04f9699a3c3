//! Sign-in sessions on the HTTP side: the `airlock_session` cookie and the `X-Airlock-CSRF`
//! header. The `[sessions]` lifetimes and the in-memory limits on failed sign-ins are
//! `airlock_identity::session` (re-exported here); the sessions themselves (hashed, in SQLite)
//! belong to the ACL (`airlock_acl::session`).

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

pub use airlock_identity::session::{COOKIE, LoginLimiter, Refused, SessionConfig};

/// The header carrying the session's CSRF token on state-changing requests.
pub const CSRF_HEADER: HeaderName = HeaderName::from_static("x-airlock-csrf");

/// The session secret of a request's `Cookie` headers, if any.
pub fn cookie(headers: &HeaderMap) -> Option<&str> {
    cookie_named(headers, COOKIE)
}

/// The non-empty value of the cookie `name` in a request's `Cookie` headers, if any.
pub fn cookie_named<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// `Set-Cookie` for a new session.
pub fn set_cookie(secret: &str) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{COOKIE}={secret}; HttpOnly; Secure; SameSite=Strict; Path=/"
    ))
    .expect("session secrets are hex")
}

/// `Set-Cookie` that removes the session cookie.
pub fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static(
        "airlock_session=; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age=0",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_parsed() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            "a=b; airlock_session=als_x".parse().unwrap(),
        );
        assert_eq!(cookie(&h), Some("als_x"));
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, "xairlock_session=1".parse().unwrap());
        assert_eq!(cookie(&h), None);
    }
}
