//! Roles and separation of duties: one table, [`ROUTES`], says who may call each route, and
//! the server's route layer applies it before any handler runs, so a refused request changes
//! nothing. Routes are data here (method and path template strings): this crate knows no HTTP.
//!
//! | role | duty |
//! |---|---|
//! | `admin` | configuration and users: users, roles, tokens |
//! | `operator` | content operations: ingest, grants, IAM syncs, reconcile, purge, evals |
//! | `auditor` | oversight: the audit log and the metrics; never document content |
//! | `metrics` | a scrape token: `/metrics` only |
//! | (none) | `user`: answers, retrieval, conversations over the documents their grants allow |
//!
//! A principal holding `auditor` or `metrics` never reaches document content (chat, retrieval,
//! embeddings, conversations, feedback), whatever else it holds; a `metrics` principal reaches
//! `/metrics` only. With `tls.client_ca` set, every role-gated route also needs a verified client
//! certificate (mTLS). Routes missing from the table are refused (`403`).
//!
//! The operator console's pages (`/v1/admin/...`): documents and feedback `operator`; users and
//! groups, IAM syncs and capacity `admin`, `operator` or `auditor`; eval reports `operator` or
//! `auditor`; the audit search `admin` or `auditor` (as `/v1/audit`).

use airlock_acl::Role;

use crate::caller::Caller;

/// The refusal of a role-gated route without a verified client certificate (`tls.client_ca`).
pub const CLIENT_CERT_REQUIRED: &str =
    "this endpoint needs a client certificate signed by the configured tls.client_ca";

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, unauthenticated (probes, the web UI's static files).
    Public,
    /// Any authenticated principal but a `metrics` one (`/v1/info`, `/v1/models`).
    Signed,
    /// Document content: any authenticated principal without the `auditor` or `metrics` role
    /// (what it sees is then decided by its grants).
    Content,
    /// A principal holding one of these roles (and, with `tls.client_ca`, a verified client
    /// certificate).
    Roles(&'static [Role]),
}

const ADMIN: Access = Access::Roles(&[Role::Admin]);
const OPERATOR: Access = Access::Roles(&[Role::Operator]);
const AUDIT: Access = Access::Roles(&[Role::Admin, Role::Auditor]);
const METRICS: Access = Access::Roles(&[Role::Admin, Role::Auditor, Role::Metrics]);
/// The operator console's pages without document content (users, syncs, capacity).
const CONSOLE: Access = Access::Roles(&[Role::Admin, Role::Operator, Role::Auditor]);
/// The console's eval reports (aggregates only).
const EVALS: Access = Access::Roles(&[Role::Operator, Role::Auditor]);
/// Approvals of access changes (the appliance's approvals; the handler checks the change's own
/// role).
const APPROVERS: Access = Access::Roles(&[Role::Admin, Role::Operator]);

/// Every route of the appliance's router: method, path template, access. The route-by-role test
/// walks it.
pub const ROUTES: &[(&str, &str, Access)] = &[
    ("GET", "/healthz", Access::Public),
    ("GET", "/readyz", Access::Public),
    ("GET", "/", Access::Public),
    ("GET", "/index.html", Access::Public),
    ("GET", "/app.css", Access::Public),
    ("GET", "/js/{file}", Access::Public),
    ("GET", "/metrics", METRICS),
    ("GET", "/v1/audit", AUDIT),
    ("GET", "/v1/receipts/{id}", AUDIT),
    ("GET", "/v1/models", Access::Signed),
    ("GET", "/v1/info", Access::Signed),
    ("POST", "/v1/embeddings", Access::Content),
    ("POST", "/v1/chat/completions", Access::Content),
    ("POST", "/v1/retrieve", Access::Content),
    ("POST", "/v1/feedback", Access::Content),
    ("GET", "/v1/conversations", Access::Content),
    ("POST", "/v1/conversations", Access::Content),
    ("GET", "/v1/conversations/{id}", Access::Content),
    ("DELETE", "/v1/conversations/{id}", Access::Content),
    ("PUT", "/v1/documents/{doc_id}", OPERATOR),
    ("GET", "/v1/documents/{doc_id}", OPERATOR),
    ("DELETE", "/v1/documents/{doc_id}", OPERATOR),
    ("GET", "/v1/documents/{doc_id}/file", Access::Content),
    ("POST", "/v1/reconcile", OPERATOR),
    ("POST", "/v1/purge", OPERATOR),
    ("PUT", "/v1/acl/documents/{doc_id}", OPERATOR),
    ("POST", "/v1/acl/sync", OPERATOR),
    ("POST", "/v1/acl/sync/ldap", OPERATOR),
    ("GET", "/v1/connectors", OPERATOR),
    ("POST", "/v1/connectors/{alias}/sync", OPERATOR),
    ("POST", "/v1/connectors/{alias}/verify", OPERATOR),
    ("GET", "/v1/connectors/{alias}/holdings", OPERATOR),
    ("GET", "/v1/auth/methods", Access::Public),
    ("POST", "/v1/auth/login", Access::Public),
    ("POST", "/v1/auth/logout", Access::Signed),
    ("GET", "/v1/auth/oidc/login", Access::Public),
    ("GET", "/v1/auth/oidc/callback", Access::Public),
    ("PUT", "/v1/acl/users/{user_id}", ADMIN),
    ("POST", "/v1/acl/users/{user_id}/token", ADMIN),
    ("DELETE", "/v1/acl/users/{user_id}", ADMIN),
    ("DELETE", "/v1/acl/users/{user_id}/token", ADMIN),
    ("DELETE", "/v1/acl/users/{user_id}/sessions", ADMIN),
    ("POST", "/v1/acl/approvals", APPROVERS),
    // The operator console (`/admin`, routes/admin.rs): read-only, per page.
    ("GET", "/admin", Access::Public),
    ("GET", "/admin.css", Access::Public),
    ("GET", "/v1/admin/documents", OPERATOR),
    ("GET", "/v1/admin/documents/{doc_id}", OPERATOR),
    ("GET", "/v1/admin/users", CONSOLE),
    ("GET", "/v1/admin/groups", CONSOLE),
    ("GET", "/v1/admin/syncs", CONSOLE),
    ("GET", "/v1/admin/capacity", CONSOLE),
    ("GET", "/v1/admin/feedback", OPERATOR),
    ("GET", "/v1/admin/evals", EVALS),
    ("GET", "/v1/admin/evals/{name}", EVALS),
    ("GET", "/v1/admin/audit", AUDIT),
];

/// The access of `method` on `route` (a path template); HEAD is GET's. `None`: no entry.
pub fn access(method: &str, route: &str) -> Option<Access> {
    let method = if method == "HEAD" { "GET" } else { method };
    ROUTES
        .iter()
        .find(|(m, r, _)| *m == method && *r == route)
        .map(|(_, _, a)| *a)
}

/// Why `caller` may not use a route of `access` (`None`: it may). `mtls_ok`: the client
/// certificate requirement is met (or there is none).
pub fn refusal(access: Access, caller: &Caller, mtls_ok: bool) -> Option<&'static str> {
    let metrics_only = caller.has(Role::Metrics);
    match access {
        Access::Public => None,
        Access::Signed if metrics_only => Some("a metrics-role principal may only read /metrics"),
        Access::Signed => None,
        Access::Content if metrics_only || caller.has(Role::Auditor) => Some(
            "the auditor and metrics roles have no access to document content (chat, retrieval, \
             conversations)",
        ),
        Access::Content => None,
        Access::Roles(roles) if !roles.iter().any(|r| caller.has(*r)) => Some(match roles {
            [Role::Admin] => "this endpoint needs the admin role",
            [Role::Operator] => "this endpoint needs the operator role",
            [Role::Admin, Role::Auditor] => "this endpoint needs the admin or auditor role",
            [Role::Admin, Role::Operator, Role::Auditor] => {
                "this endpoint needs the admin, operator or auditor role"
            }
            [Role::Operator, Role::Auditor] => "this endpoint needs the operator or auditor role",
            [Role::Admin, Role::Operator] => "this endpoint needs the admin or operator role",
            [Role::Admin, Role::Auditor, Role::Metrics] => {
                "this endpoint needs the admin, auditor or metrics role"
            }
            _ => "this endpoint needs a role the caller does not hold",
        }),
        Access::Roles(_) if !mtls_ok => Some(CLIENT_CERT_REQUIRED),
        Access::Roles(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(roles: &[Role]) -> Caller {
        Caller::new("x".into(), roles.to_vec())
    }

    #[test]
    fn the_table_has_one_entry_per_method_and_route() {
        for (i, (m, r, _)) in ROUTES.iter().enumerate() {
            assert!(
                !ROUTES[..i].iter().any(|(m2, r2, _)| m2 == m && r2 == r),
                "{m} {r} twice"
            );
        }
        assert_eq!(access("HEAD", "/metrics"), Some(METRICS));
        assert_eq!(access("PATCH", "/metrics"), None);
    }

    #[test]
    fn content_is_closed_to_auditors_and_scrapers_and_roles_need_mtls_when_configured() {
        let user = caller(&[]);
        let auditor = caller(&[Role::Auditor]);
        let scraper = caller(&[Role::Metrics]);
        let ops_auditor = caller(&[Role::Operator, Role::Auditor]);
        assert!(refusal(Access::Content, &user, false).is_none());
        assert!(refusal(Access::Content, &auditor, true).is_some());
        assert!(refusal(Access::Content, &ops_auditor, true).is_some());
        assert!(refusal(Access::Signed, &scraper, true).is_some());
        assert!(refusal(METRICS, &scraper, true).is_none());
        assert_eq!(
            refusal(METRICS, &scraper, false),
            Some(CLIENT_CERT_REQUIRED)
        );
        assert!(refusal(OPERATOR, &caller(&[Role::Admin]), true).is_some());
        assert!(refusal(ADMIN, &caller(&[Role::Operator]), true).is_some());
    }
}
