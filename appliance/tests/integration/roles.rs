//! Roles (issue 22 point 7): every route × every role → the expected status, refusals change
//! nothing, `/metrics` with a metrics-role token, the last admin over HTTP and the CLI.

use std::process::Command;

use airlock::roles::{Access, ROUTES};
use airlock_acl::{AuditQuery, Role};
use axum::http::Method;
use serde_json::{Value, json};

use crate::support::TestApp;

const BIN: &str = env!("CARGO_BIN_EXE_airlock");

/// Who calls, in the column order of [`MATRIX`].
const WHO: [&str; 6] = [
    "anonymous",
    "user",
    "admin",
    "operator",
    "auditor",
    "metrics",
];

/// Expected outcome per principal: `o` served (neither 401 nor 403), `u` 401, `f` 403. Written
/// out by hand (not derived from the role table) so that a change of the table must change
/// this test too.
const MATRIX: &[(&str, &str, &str)] = &[
    ("GET", "/healthz", "oooooo"),
    ("GET", "/readyz", "oooooo"),
    ("GET", "/", "oooooo"),
    ("GET", "/index.html", "oooooo"),
    ("GET", "/app.css", "oooooo"),
    ("GET", "/js/{file}", "oooooo"),
    ("GET", "/metrics", "ufofoo"),
    ("GET", "/v1/audit", "ufofof"),
    ("GET", "/v1/receipts/{id}", "ufofof"),
    ("GET", "/v1/models", "uoooof"),
    ("GET", "/v1/info", "uoooof"),
    ("POST", "/v1/embeddings", "uooosf"),
    ("POST", "/v1/chat/completions", "uooosf"),
    ("POST", "/v1/retrieve", "uooosf"),
    ("POST", "/v1/feedback", "uooosf"),
    ("GET", "/v1/conversations", "uooosf"),
    ("POST", "/v1/conversations", "uooosf"),
    ("GET", "/v1/conversations/{id}", "uooosf"),
    ("DELETE", "/v1/conversations/{id}", "uooosf"),
    ("PUT", "/v1/documents/{doc_id}", "uffoff"),
    ("GET", "/v1/documents/{doc_id}", "uffoff"),
    ("DELETE", "/v1/documents/{doc_id}", "uffoff"),
    ("GET", "/v1/documents/{doc_id}/file", "uooosf"),
    ("POST", "/v1/reconcile", "uffoff"),
    ("POST", "/v1/purge", "uffoff"),
    ("PUT", "/v1/acl/documents/{doc_id}", "uffoff"),
    ("POST", "/v1/acl/sync", "uffoff"),
    ("POST", "/v1/acl/sync/ldap", "uffoff"),
    ("GET", "/v1/connectors", "uffoff"),
    ("POST", "/v1/connectors/{alias}/sync", "uffoff"),
    ("POST", "/v1/connectors/{alias}/verify", "uffoff"),
    ("GET", "/v1/connectors/{alias}/holdings", "uffoff"),
    ("GET", "/v1/auth/methods", "oooooo"),
    ("POST", "/v1/auth/login", "oooooo"),
    ("POST", "/v1/auth/logout", "uoooof"),
    ("GET", "/v1/auth/oidc/login", "oooooo"),
    ("GET", "/v1/auth/oidc/callback", "oooooo"),
    ("PUT", "/v1/acl/users/{user_id}", "ufofff"),
    ("POST", "/v1/acl/users/{user_id}/token", "ufofff"),
    ("DELETE", "/v1/acl/users/{user_id}", "ufofff"),
    ("DELETE", "/v1/acl/users/{user_id}/token", "ufofff"),
    ("DELETE", "/v1/acl/users/{user_id}/sessions", "ufofff"),
    ("POST", "/v1/acl/approvals", "ufooff"),
    ("GET", "/admin", "oooooo"),
    ("GET", "/admin.css", "oooooo"),
    ("GET", "/v1/admin/documents", "uffoff"),
    ("GET", "/v1/admin/documents/{doc_id}", "uffoff"),
    ("GET", "/v1/admin/users", "ufooof"),
    ("GET", "/v1/admin/groups", "ufooof"),
    ("GET", "/v1/admin/syncs", "ufooof"),
    ("GET", "/v1/admin/capacity", "ufooof"),
    ("GET", "/v1/admin/feedback", "uffoff"),
    ("GET", "/v1/admin/evals", "uffoof"),
    ("GET", "/v1/admin/evals/{name}", "uffoof"),
    ("GET", "/v1/admin/audit", "ufofof"),
];

/// A concrete request for a route: a path and a body that would change state if accepted.
fn request(method: &str, route: &str) -> (String, Option<Value>) {
    match (method, route) {
        ("GET", "/js/{file}") => ("/js/app.js".into(), None),
        ("POST", "/v1/embeddings") => ("/v1/embeddings".into(), Some(json!({"input": "hi"}))),
        // Invalid on purpose (400 once authorised): a generation would take minutes here.
        ("POST", "/v1/chat/completions") => {
            (route.into(), Some(json!({"messages": [], "max_tokens": 1})))
        }
        ("POST", "/v1/retrieve") => (route.into(), Some(json!({"query": "cheques", "top_k": 1}))),
        ("POST", "/v1/feedback") => (route.into(), Some(json!({}))),
        ("POST", "/v1/conversations") => (route.into(), Some(json!({"title": "t"}))),
        (_, "/v1/conversations/{id}") => ("/v1/conversations/nope".into(), None),
        // Granted to a group the operator is not in (a grant to itself needs approval).
        ("PUT", "/v1/documents/{doc_id}") => (
            "/v1/documents/new-doc".into(),
            Some(
                json!({"title": "New", "text": "New text.", "acl": {"users": [], "groups": ["g2"]}}),
            ),
        ),
        (_, "/v1/documents/{doc_id}") => ("/v1/documents/doc1".into(), None),
        (_, "/v1/admin/documents/{doc_id}") => ("/v1/admin/documents/doc1".into(), None),
        (_, "/v1/admin/evals/{name}") => ("/v1/admin/evals/report-1".into(), None),
        ("GET", "/v1/documents/{doc_id}/file") => ("/v1/documents/doc1/file".into(), None),
        ("POST", "/v1/reconcile") => (route.into(), Some(json!({"source_ids": ["other"]}))),
        ("POST", "/v1/purge") => (route.into(), Some(json!({}))),
        ("PUT", "/v1/acl/documents/{doc_id}") => (
            "/v1/acl/documents/doc1".into(),
            Some(json!({"users": ["mallory"], "groups": []})),
        ),
        ("POST", "/v1/acl/sync") => (
            route.into(),
            Some(json!({"user": "mallory", "groups": ["g1"]})),
        ),
        // Without groups or roles: a token for a user with access needs approval.
        ("PUT", "/v1/acl/users/{user_id}") => {
            ("/v1/acl/users/mallory".into(), Some(json!({"groups": []})))
        }
        // Unknown users (404 once authorised): removing mallory would undo the PUT above.
        ("DELETE", "/v1/acl/users/{user_id}") => ("/v1/acl/users/nobody".into(), None),
        ("DELETE", "/v1/acl/users/{user_id}/token") => ("/v1/acl/users/nobody/token".into(), None),
        ("DELETE", "/v1/acl/users/{user_id}/sessions") => {
            ("/v1/acl/users/nobody/sessions".into(), None)
        }
        ("POST", "/v1/acl/approvals") => (
            route.into(),
            Some(json!({"action": "token_issue", "user_id": "mallory"})),
        ),
        // Another user's token: rotating u1's would end u1's later requests.
        ("POST", "/v1/acl/users/{user_id}/token") => ("/v1/acl/users/mallory/token".into(), None),
        // No connector is configured here: 404 once authorised.
        ("POST", "/v1/connectors/{alias}/sync") => ("/v1/connectors/nope/sync".into(), None),
        ("POST", "/v1/connectors/{alias}/verify") => ("/v1/connectors/nope/verify".into(), None),
        ("GET", "/v1/connectors/{alias}/holdings") => ("/v1/connectors/nope/holdings".into(), None),
        ("POST", _) | ("PUT", _) => (route.into(), Some(json!({}))),
        _ => (route.into(), None),
    }
}

/// A local user (an IAM sync keeps it) with `roles`; returns the token.
fn local(app: &TestApp, id: &str, groups: &[&str], roles: &[Role]) -> String {
    let new = airlock_acl::NewUser {
        groups: groups.iter().map(|g| g.to_string()).collect(),
        roles: roles.to_vec(),
        local: true,
    };
    let acl = &app.state.services().unwrap().acl;
    acl.add_user("test", id, &new).unwrap()
}

/// What a refusal must not change.
fn state_of(app: &TestApp) -> Value {
    let s = app.state.services().unwrap();
    let audit = s
        .acl
        .audit_query(&AuditQuery {
            user: None,
            since: None,
            until: None,
            kind: None,
            limit: Some(100_000),
        })
        .unwrap()
        .len();
    json!({
        "audit": audit,
        "mallory": s.acl.user("mallory").is_some(),
        "u1": s.acl.user("u1"),
        "doc1": s.acl.document_grants("doc1").unwrap(),
        "new-doc": s.acl.ordinal("new-doc").unwrap(),
        "doc1-deleted": s.retrieval.document("doc1").unwrap().map(|d| d.deleted_at_ms),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_every_role_as_the_matrix_says_and_refusals_change_nothing() {
    let app = TestApp::new();
    let tokens: Vec<Option<String>> = vec![
        None,
        Some(local(&app, "u1", &["g1"], &[])),
        Some(local(&app, "adm", &[], &[Role::Admin])),
        Some(local(&app, "ops", &["g1"], &[Role::Operator])),
        Some(local(&app, "aud", &["g1"], &[Role::Auditor])),
        Some(local(&app, "prom", &[], &[Role::Metrics])),
    ];
    let put = app
        .call(
            Method::PUT,
            "/v1/documents/doc1",
            Some(&app.admin),
            Some(
                json!({"title": "Cheques", "text": "Cheques clear in two days.",
                        "acl": {"users": [], "groups": ["g1"]}}),
            ),
        )
        .await;
    assert!(put.status.is_success(), "{}", put.text);

    // Every route of the table is in the matrix and the other way round.
    let mut table: Vec<(&str, &str)> = ROUTES.iter().map(|(m, r, _)| (*m, *r)).collect();
    let mut matrix: Vec<(&str, &str)> = MATRIX.iter().map(|(m, r, _)| (*m, *r)).collect();
    table.sort();
    matrix.sort();
    assert_eq!(
        table, matrix,
        "the role table and this matrix list different routes"
    );

    // Pass 1: every refusal; then nothing has changed.
    let before = state_of(&app);
    let mut checked = 0;
    for refusals in [true, false] {
        for (method, route, expect) in MATRIX {
            for (who, (token, want)) in WHO.iter().zip(tokens.iter().zip(expect.chars())) {
                let refused = matches!(want, 'u' | 'f' | 's');
                if refused != refusals {
                    continue;
                }
                let (path, body) = request(method, route);
                let m = Method::from_bytes(method.as_bytes()).unwrap();
                let r = app.call(m, &path, token.as_deref(), body).await;
                let status = r.status.as_u16();
                // An operator passes the table for approvals but may approve only grants and
                // syncs: the handler's own 403 says so.
                let handler_403 = *route == "/v1/acl/approvals"
                    && r.text.contains("approving a change of users or tokens");
                let ok = match want {
                    'u' => status == 401,
                    'f' | 's' => status == 403 && !handler_403,
                    _ => status != 401 && (status != 403 || handler_403),
                };
                assert!(ok, "{method} {path} as {who}: {status} {}", r.text);
                if want == 's' {
                    assert!(r.text.contains("document content"), "{}", r.text);
                }
                checked += 1;
            }
        }
        if refusals {
            assert_eq!(
                state_of(&app),
                before,
                "a refused request changed the state"
            );
        }
    }
    assert_eq!(checked, MATRIX.len() * WHO.len());
    // The allowed pass did change things (so the refusal check above could have failed).
    let s = app.state.services().unwrap();
    assert!(s.acl.user("mallory").is_some());
    assert!(s.acl.ordinal("new-doc").unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_token_scrapes_metrics_and_nothing_else() {
    let app = TestApp::new();
    let prom = app.add_user("prometheus", &[], vec![Role::Metrics]);
    let r = app.call(Method::GET, "/metrics", Some(&prom), None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.contains("airlock_"), "{}", r.text);
    for (m, path) in [
        (Method::GET, "/v1/info"),
        (Method::GET, "/v1/audit"),
        (Method::GET, "/v1/conversations"),
        (Method::GET, "/v1/documents/x"),
    ] {
        let r = app.call(m, path, Some(&prom), None).await;
        assert_eq!(r.status, 403, "{path}: {}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auditor_reads_the_audit_log_and_the_last_admin_stays() {
    let app = TestApp::new();
    let aud = app.add_user("aud", &[], vec![Role::Auditor]);
    let adm = app.add_user("adm", &[], vec![Role::Admin]);
    let r = app
        .call(Method::GET, "/v1/audit?user=aud&limit=10", Some(&aud), None)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let entries = r.json["entries"].as_array().unwrap();
    assert!(!entries.is_empty(), "{}", r.text);
    assert!(
        entries
            .iter()
            .all(|e| e["user_id"] == "aud" || e["actor"] == "aud")
    );
    let bad = app
        .call(Method::GET, "/v1/audit?kind=everything", Some(&aud), None)
        .await;
    assert_eq!(bad.status, 400, "{}", bad.text);

    // Two admins: the test's admin may be demoted; then the last one may not demote itself.
    // (No role is added: taking on a new duty oneself would need a second admin's approval.)
    let demote = |who: &str| {
        (
            format!("/v1/acl/users/{who}"),
            json!({"groups": [], "roles": []}),
        )
    };
    let (path, body) = demote("admin");
    let r = app.call(Method::PUT, &path, Some(&adm), Some(body)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (path, body) = demote("adm");
    let r = app.call(Method::PUT, &path, Some(&adm), Some(body)).await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(r.json["type"], "https://airlock.local/problems/conflict");
    assert!(
        app.state.services().unwrap().acl.user("adm").unwrap().roles == [Role::Admin],
        "the refused demotion changed nothing"
    );
}

#[test]
fn the_cli_adds_role_users_and_keeps_the_last_admin() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .env_remove("AIRLOCK_DATA")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), err)
    };
    assert!(run(&["user", "add", "root", "--data", data, "--role", "admin"]).0);
    assert!(run(&["user", "add", "prom", "--data", data, "--role", "metrics"]).0);
    let (ok, err) = run(&["user", "add", "x", "--data", data, "--role", "root"]);
    assert!(!ok && err.contains("unknown role"), "{err}");
    let (ok, err) = run(&["user", "remove", "root", "--data", data]);
    assert!(
        !ok && err.contains("last user with the admin role"),
        "{err}"
    );
    // The metrics user is local (an IAM sync keeps it) and holds only its role.
    let acl = airlock_acl::Acl::open(dir.path().join("airlock.db")).unwrap();
    let prom = acl.user("prom").unwrap();
    assert_eq!(prom.roles, [Role::Metrics]);
    assert!(prom.local);
    assert!(acl.user("root").is_some());
}

/// The principals of the role table's columns: (heading, roles; `None` = anonymous).
const COLUMNS: [(&str, Option<&[Role]>); 6] = [
    ("anonymous", None),
    ("user", Some(&[])),
    ("admin", Some(&[Role::Admin])),
    ("operator", Some(&[Role::Operator])),
    ("auditor", Some(&[Role::Auditor])),
    ("metrics", Some(&[Role::Metrics])),
];

/// What the role table lets a principal with `roles` (`None`: anonymous) do on a route of
/// `access`: `✓`, `401` or `403` (client certificates aside).
fn cell(access: Access, roles: Option<&[Role]>) -> &'static str {
    match roles {
        None if access == Access::Public => "✓",
        None => "401",
        Some(r) => {
            let caller = airlock_identity::caller::Caller::new(String::new(), r.to_vec());
            if airlock::roles::refusal(access, &caller, true).is_none() {
                "✓"
            } else {
                "403"
            }
        }
    }
}

/// The API's role table (docs/api/sign-in-and-roles.md) from `ROUTES`: one row per access level, in the table's order.
fn role_table_markdown() -> String {
    let mut groups: Vec<(Access, Vec<String>)> = Vec::new();
    for (m, r, a) in ROUTES {
        let route = format!("`{m} {r}`");
        match groups.iter_mut().find(|(g, _)| g == a) {
            Some((_, routes)) => routes.push(route),
            None => groups.push((*a, vec![route])),
        }
    }
    let mut out = String::from("| Route |");
    for (name, _) in COLUMNS {
        out.push_str(&format!(" {name} |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(COLUMNS.len()));
    out.push('\n');
    for (access, routes) in groups {
        out.push_str(&format!("| {} |", routes.join(", ")));
        for (_, roles) in COLUMNS {
            out.push_str(&format!(" {} |", cell(access, roles)));
        }
        out.push('\n');
    }
    out
}

/// Issue 42 L2: the API's role table (docs/api/sign-in-and-roles.md) is the one in code. The
/// table between the markers is generated from `ROUTES` ([`role_table_markdown`]), and every
/// route named with its roles anywhere in the contract (docs/API.md, docs/api/*.md) ("`POST /v1/acl/sync/ldap` (operator)") names exactly the roles
/// the table lets through. `AIRLOCK_BLESS=1` rewrites the table in the document.
#[test]
fn api_md_role_table_is_the_route_table() {
    const BEGIN: &str = "<!-- role table: generated from identity/src/roles.rs ROUTES; \
                         test roles::api_md_role_table_is_the_route_table -->\n";
    const END: &str = "<!-- end of the generated role table -->";
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let path = docs.join("api/sign-in-and-roles.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let want = role_table_markdown();
    let (Some(start), Some(end)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!(
            "docs/api/sign-in-and-roles.md has no generated role table; put this between\n{BEGIN}and\n{END}\n\n{want}"
        );
    };
    let have = &doc[start + BEGIN.len()..end];
    if have != want {
        if std::env::var("AIRLOCK_BLESS").as_deref() == Ok("1") {
            let mut new = doc.clone();
            new.replace_range(start + BEGIN.len()..end, &want);
            std::fs::write(&path, new).unwrap();
        }
        panic!(
            "docs/api/sign-in-and-roles.md's role table differs from ROUTES (AIRLOCK_BLESS=1 rewrites it):\n{want}"
        );
    }

    // Inline mentions: "`METHOD /path[?query]` (role, role)".
    let roles = ["admin", "operator", "auditor", "metrics", "user"];
    let normal = |p: &str| -> String {
        let p = p.split('?').next().unwrap();
        let mut out = String::new();
        let mut depth = 0;
        for c in p.chars() {
            match c {
                '{' => {
                    depth += 1;
                    out.push_str("{}");
                }
                '}' => depth -= 1,
                _ if depth == 0 => out.push(c),
                _ => {}
            }
        }
        out
    };
    // The contract's pages: docs/API.md and docs/api/*.md.
    let mut pages = vec![docs.join("API.md")];
    for entry in std::fs::read_dir(docs.join("api")).unwrap() {
        pages.push(entry.unwrap().path());
    }
    let text: String = pages
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let mut checked = 0;
    for line in text.lines() {
        let mut rest = line;
        while let Some(i) = rest.find('`') {
            let after = &rest[i + 1..];
            let Some(j) = after.find('`') else { break };
            let span = &after[..j];
            rest = &after[j + 1..];
            let Some((method, route)) = span.split_once(' ') else {
                continue;
            };
            if !["GET", "POST", "PUT", "DELETE"].contains(&method) || !route.starts_with('/') {
                continue;
            }
            let Some(paren) = rest.strip_prefix(" (") else {
                continue;
            };
            let Some(close) = paren.find(')') else {
                continue;
            };
            let named: Vec<&str> = paren[..close].split(", ").collect();
            if !named.iter().all(|n| roles.contains(n)) {
                continue;
            }
            let access = ROUTES
                .iter()
                .find(|(m, r, _)| *m == method && normal(r) == normal(route))
                .map(|(_, _, a)| *a)
                .unwrap_or_else(|| panic!("API.md names `{span}`, which is not in ROUTES"));
            let open: Vec<&str> = COLUMNS
                .iter()
                .filter(|(_, r)| r.is_some())
                .filter(|(_, r)| cell(access, *r) == "✓")
                .map(|(n, _)| *n)
                .collect();
            let mut named_sorted = named.clone();
            named_sorted.sort_unstable();
            let mut open_sorted = open.clone();
            open_sorted.sort_unstable();
            assert_eq!(
                named_sorted,
                open_sorted,
                "API.md: `{span}` ({}) but the role table lets {open:?} through",
                named.join(", ")
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} inline role mentions found");
}
