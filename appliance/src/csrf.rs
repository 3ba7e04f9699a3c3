//! Cross-site request forgery defences, one set for every way a browser can be signed in
//! (docs/operations/sso-proxy.md and directory-sign-in.md):
//!
//! - A state-changing request (any method but `GET`, `HEAD`, `OPTIONS`) that the browser marks
//!   as sent from another site is refused before authentication, whatever it carries
//!   ([`refuse_cross_site`], `403 cross-site`): `Sec-Fetch-Site` other than `same-origin` or
//!   `none`; without that header, an `Origin` that is `null` or names another host or port than
//!   the request's `Host` (or a proxy's `X-Forwarded-Host`).
//! - A request signed in by a credential the browser attaches by itself — the session cookie
//!   (directory or OIDC sign-in) or the SSO proxy's user header — also needs `X-Airlock-CSRF`
//!   (`403 csrf-failed`): the session's token (from the sign-in), or for the proxy's users
//!   [`proxy_token`], derived from the proxy secret and the user id and served by
//!   `GET /v1/info`. A bearer token needs none: no browser sends one on its own.
//! - JSON routes take JSON bodies only with a JSON `Content-Type` (`crate::extract`, `415`): the
//!   types a page can send to another site without a CORS preflight are refused.

use axum::http::header::{HOST, ORIGIN};
use axum::http::{HeaderMap, HeaderName, Method};

use crate::error::ApiError;

/// `Sec-Fetch-Site`, set by browsers on every request (not settable by a page).
pub const SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");
/// `X-Forwarded-Host`: the host a reverse proxy received the request for.
pub const FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Prefix of the CSRF tokens of the SSO proxy's users.
const PROXY_TOKEN_PREFIX: &str = "alp_";

/// Whether a method changes nothing (no CSRF defence applies).
pub fn is_safe(m: &Method) -> bool {
    *m == Method::GET || *m == Method::HEAD || *m == Method::OPTIONS
}

/// Refuses a state-changing request a browser sent from another site (see the module docs).
pub fn refuse_cross_site(method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    if is_safe(method) {
        return Ok(());
    }
    if let Some(site) = headers.get(SEC_FETCH_SITE) {
        let site = site.to_str().unwrap_or("").trim().to_ascii_lowercase();
        return match site.as_str() {
            "same-origin" | "none" => Ok(()),
            _ => Err(ApiError::CrossSite(
                "a state-changing request sent from another site (Sec-Fetch-Site) is refused",
            )),
        };
    }
    let Some(origin) = headers.get(ORIGIN) else {
        // Not a browser's cross-origin request (scripts, curl, SDKs send no Origin).
        return Ok(());
    };
    let same = parse_origin(origin.to_str().unwrap_or("")).is_some_and(|(host, port)| {
        headers
            .get_all(HOST)
            .iter()
            .chain(headers.get_all(FORWARDED_HOST).iter())
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|a| parse_authority(a.trim(), port))
            .any(|(h, p)| h == host && p == port)
    });
    if same {
        Ok(())
    } else {
        Err(ApiError::CrossSite(
            "a state-changing request from another origin (Origin) is refused",
        ))
    }
}

/// `scheme://host[:port]` → (lowercase host, port with the scheme's default); `None` for
/// `null`, another scheme or anything malformed.
fn parse_origin(origin: &str) -> Option<(String, u16)> {
    let (scheme, rest) = origin.split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    if rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    parse_authority(rest, default)
}

/// `host[:port]` (IPv6 in brackets) → (lowercase host, port or `default`).
fn parse_authority(a: &str, default: u16) -> Option<(String, u16)> {
    if a.is_empty() {
        return None;
    }
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return None,
        };
        (format!("[{h}]"), port)
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (a.to_owned(), None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default,
    };
    (!host.is_empty()).then(|| (host.to_ascii_lowercase(), port))
}

/// The CSRF token of `user_id` signed in by the SSO proxy: HMAC-SHA256 keyed by the proxy
/// secret over the user id. Stable while the secret is (restarts keep it), different for every
/// user, and unknown to anyone without the secret; a page on another site cannot read it
/// (`GET /v1/info` answers no cross-origin reader).
pub fn proxy_token(secret: &str, user_id: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let mut msg = b"airlock-proxy-csrf-v1\0".to_vec();
    msg.extend_from_slice(user_id.as_bytes());
    let tag = ring::hmac::sign(&key, &msg);
    format!("{PROXY_TOKEN_PREFIX}{}", hex::encode(tag.as_ref()))
}

/// The CSRF token of a request signed in by the SSO proxy, kept in the request's extensions for
/// `GET /v1/info`.
#[derive(Debug, Clone)]
pub struct ProxyCsrf(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn cross_site_requests_are_refused_and_same_origin_ones_pass() {
        let post = Method::POST;
        let ok = |h: &[(&str, &str)]| refuse_cross_site(&post, &headers(h)).is_ok();
        // Scripts and SDKs send neither header.
        assert!(ok(&[("host", "a:8080")]));
        assert!(ok(&[("sec-fetch-site", "same-origin")]));
        assert!(ok(&[("sec-fetch-site", "none")]));
        for site in ["cross-site", "same-site", "", "bogus"] {
            assert!(
                !ok(&[
                    ("sec-fetch-site", site),
                    ("origin", "http://a:8080"),
                    ("host", "a:8080")
                ]),
                "{site}"
            );
        }
        assert!(ok(&[("origin", "http://a:8080"), ("host", "a:8080")]));
        assert!(ok(&[
            ("origin", "https://A.example"),
            ("host", "a.example:443")
        ]));
        assert!(ok(&[("origin", "http://[::1]:9"), ("host", "[::1]:9")]));
        assert!(ok(&[
            ("origin", "https://airlock.bank"),
            ("host", "127.0.0.1:8080"),
            ("x-forwarded-host", "airlock.bank")
        ]));
        for origin in [
            "null",
            "http://evil.example",
            "http://a:8081",
            "https://a",
            "http://a:8080/",
            "http://user@a:8080",
            "file://a:8080",
            "",
        ] {
            assert!(!ok(&[("origin", origin), ("host", "a:8080")]), "{origin}");
        }
        assert!(!ok(&[("origin", "http://a:8080")]), "no Host to compare");
        // Safe methods are never refused here.
        assert!(
            refuse_cross_site(&Method::GET, &headers(&[("sec-fetch-site", "cross-site")])).is_ok()
        );
    }

    #[test]
    fn proxy_tokens_differ_per_user_and_secret() {
        let a = proxy_token("secret-0123456789", "alice");
        assert!(a.starts_with("alp_") && a.len() == 4 + 64, "{a}");
        assert_eq!(a, proxy_token("secret-0123456789", "alice"));
        assert_ne!(a, proxy_token("secret-0123456789", "bob"));
        assert_ne!(a, proxy_token("secret-0123456780", "alice"));
    }
}
