//! HTTPS as the server sees it: the HSTS header of every HTTPS response, what the TLS layer
//! learnt about a connection ([`Transport`], in every request's extensions) and the refusal of
//! a role-gated route ([`crate::roles`]) without a verified client certificate. The TLS
//! material itself (the `[tls]` section, certificates, the reloadable acceptor) is
//! `airlock_platform::tls`, re-exported here.

use axum::http::HeaderValue;

pub use airlock_platform::tls::*;

/// The `Strict-Transport-Security` value of every HTTPS response (one year).
pub const HSTS: HeaderValue = HeaderValue::from_static("max-age=31536000");

/// What the TLS layer learnt about one connection, put in every request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Transport {
    /// The connection is HTTPS.
    pub tls: bool,
    /// The client presented a certificate that chains to `client_ca` (verified in the
    /// handshake).
    pub client_cert: bool,
}

/// The refusal of a role-gated route without a verified client certificate (`tls.client_ca`).
pub use airlock_identity::roles::CLIENT_CERT_REQUIRED;

/// Whether the request came over HTTPS with a client certificate the handshake verified.
pub fn client_cert_verified(parts: &axum::http::request::Parts) -> bool {
    parts
        .extensions
        .get::<Transport>()
        .is_some_and(|t| t.tls && t.client_cert)
}
