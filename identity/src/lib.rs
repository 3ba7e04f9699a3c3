//! `airlock-identity`: who is asking and what they may call. It holds the [`caller::Caller`]
//! every handler works with, the route-by-role table as data ([`roles`]: method and path
//! template strings → [`roles::Access`], and why a caller is refused), the sign-in sessions'
//! `[sessions]` section and failed-sign-in limits ([`session`]), and the directory ([`ldap`]:
//! the `[ldap]` section, sign-in and membership sync against LDAP / Active Directory) and the
//! OIDC sign-in ([`oidc`]: the `[oidc]` section, discovery and JWKS through the platform's
//! egress client, the pre-login state, the code exchange) with its ID-token checks ([`jwt`]: JWS
//! signatures with `ring`, the JWKS, the claims).
//!
//! It must not know HTTP (no axum, no hyper: routes are strings, the extractors and the route
//! layer that apply this are the server's), the root `Config` (each section here is its own
//! struct with its own `validate`), documents, models or the appliance database beyond the
//! ACL's API. It returns its own errors.
#![warn(missing_docs)]

pub mod caller;
pub mod jwt;
pub mod ldap;
pub mod oidc;
pub mod roles;
pub mod session;
