//! Issue 42 H4: one writer per data directory. While `airlock serve` holds a data directory,
//! every CLI command that writes what the daemon holds (users, tokens, sessions, grants,
//! documents, indexes, conversations) is refused at once, exit 1, naming the HTTP route that
//! does it through the daemon, and changes nothing; a second daemon does not start; once the
//! daemon is gone the commands work again. The routes the refusals name for tokens and sessions
//! exist and act at once (`DELETE /v1/acl/users/{id}/token`, `/sessions`, `DELETE
//! /v1/acl/users/{id}`), audited.

use std::path::Path;
use std::time::Duration;

use airlock_acl::{AuditKind, AuditQuery};
use axum::http::{Method, header};
use serde_json::{Value, json};

use crate::backup::{Daemon, installed};
use crate::support::{TestApp, airlock_cli as airlock};

/// One request to a served daemon: (status, JSON body).
fn call(method: &str, url: &str, token: &str, body: Option<Value>) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into();
    let auth = format!("Bearer {token}");
    let resp = match (method, body) {
        ("GET", _) => agent.get(url).header("Authorization", &auth).call(),
        ("DELETE", _) => agent.delete(url).header("Authorization", &auth).call(),
        ("PUT", Some(b)) => agent.put(url).header("Authorization", &auth).send_json(b),
        ("POST", Some(b)) => agent.post(url).header("Authorization", &auth).send_json(b),
        ("POST", None) => agent.post(url).header("Authorization", &auth).send_empty(),
        (m, _) => panic!("{m}"),
    };
    let mut resp = resp.unwrap();
    let status = resp.status().as_u16();
    let json = resp.body_mut().read_json::<Value>().unwrap_or(Value::Null);
    (status, json)
}

/// Every CLI writer against `data`: (name, arguments, what the refusal must name).
fn writers(data: &str, dir: &Path) -> Vec<(&'static str, Vec<String>, &'static str)> {
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let snapshot = file(
        "iam.jsonl",
        "{\"user\": \"victim\", \"groups\": [\"hr\"]}\n",
    );
    let corpus = file("corpus.txt", "Salaries are paid on the 25th.");
    let ids = file("ids.txt", "nothing-else\n");
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    vec![
        (
            "user tokens revoke",
            s(&["user", "tokens", "revoke", "victim", "--data", data]),
            "`DELETE /v1/acl/users/{user_id}/token`",
        ),
        (
            "user remove",
            s(&["user", "remove", "victim", "--data", data]),
            "`DELETE /v1/acl/users/{user_id}`",
        ),
        (
            "user add",
            s(&["user", "add", "newbie", "--groups", "hr", "--data", data]),
            "`PUT /v1/acl/users/{user_id}`",
        ),
        (
            "user token",
            s(&["user", "token", "victim", "--data", data]),
            "`POST /v1/acl/users/{user_id}/token`",
        ),
        (
            "acl sync FILE",
            s(&["acl", "sync", &snapshot, "--data", data]),
            "`POST /v1/acl/sync`",
        ),
        (
            "acl sync --ldap",
            s(&[
                "acl",
                "sync",
                "--ldap",
                "--config",
                &file("ldap.toml", "[ldap]\n"),
                "--data",
                data,
            ]),
            "`POST /v1/acl/sync/ldap`",
        ),
        (
            "ingest",
            s(&["ingest", &corpus, "--data", data]),
            "`PUT /v1/documents/{doc_id}`",
        ),
        (
            "delete",
            s(&["delete", "d1", "--data", data]),
            "`DELETE /v1/documents/{doc_id}`",
        ),
        (
            "reconcile",
            s(&["reconcile", "--source-ids", &ids, "--data", data]),
            "`POST /v1/reconcile`",
        ),
        ("purge", s(&["purge", "--data", data]), "`POST /v1/purge`"),
        (
            "reindex",
            s(&["reindex", "--data", data]),
            "stop the daemon first",
        ),
        (
            "restore",
            s(&[
                "restore",
                "--from",
                &file("backup.tar", ""),
                "--data",
                data,
                "--force",
            ]),
            "stop the daemon first",
        ),
        (
            "demo",
            s(&["demo", "--data", data, "--setup-only", "--no-sample-data"]),
            "stop the daemon first",
        ),
    ]
}

/// What the refused commands must not have changed, read from the files by commands that only
/// read (and may run while the daemon serves).
fn on_disk(data: &str) -> (String, usize) {
    let out = airlock(&["user", "tokens", "list", "--data", data]);
    assert!(out.status.success());
    // Users and tokens, without the last-use times the daemon writes back by itself.
    let tokens = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("last_used_at");
            v.to_string() + "\n"
        })
        .collect::<String>();
    let out = airlock(&["audit", "--data", data, "--limit", "100000"]);
    assert!(out.status.success());
    let cli_entries = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"actor\":\"cli\""))
        .count();
    (tokens, cli_entries)
}

#[test]
fn while_the_daemon_serves_every_cli_writer_is_refused_naming_its_route() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, admin) = installed(tmp.path());
    let data_s = data.to_str().unwrap().to_owned();
    let mut daemon = Daemon::start(&data, &[]);
    daemon.wait_ready();
    let base = daemon.base.clone();
    // A user with a token and a document, as the refused commands would have changed them.
    let (s, b) = call(
        "PUT",
        &format!("{base}/v1/acl/users/victim"),
        &admin,
        Some(json!({"groups": []})),
    );
    assert_eq!(s, 201, "{b}");
    let (s, b) = call(
        "POST",
        &format!("{base}/v1/acl/users/victim/token"),
        &admin,
        None,
    );
    assert_eq!(s, 201, "{b}");
    let victim = b["token"].as_str().unwrap().to_owned();
    let (s, b) = call(
        "PUT",
        &format!("{base}/v1/documents/d1"),
        &admin,
        Some(json!({"title": "Pay", "text": "Salaries are paid monthly.",
                    "acl": {"users": ["victim"], "groups": []}})),
    );
    assert_eq!(s, 201, "{b}");
    let before = on_disk(&data_s);
    assert!(before.0.contains("\"user_id\":\"victim\""), "{}", before.0);

    let pid = format!("the daemon (pid {}) is serving", daemon.pid());
    for (what, args, route) in writers(&data_s, tmp.path()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = airlock(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what} must be refused: {err}");
        assert!(err.contains(&pid) && err.contains(route), "{what}: {err}");
    }
    // Nothing changed on disk, and the daemon still honours the token (no divergence).
    assert_eq!(on_disk(&data_s), before);
    let (s, b) = call("GET", &format!("{base}/v1/info"), &victim, None);
    assert_eq!((s, b["user"].as_str()), (200, Some("victim")));
    let (s, b) = call("GET", &format!("{base}/v1/documents/d1"), &admin, None);
    assert_eq!(s, 200, "{b}");
    assert!(b["deleted_at"].is_null(), "{b}");

    // A second daemon on the same directory does not start.
    let out = airlock(&["serve", "--data", &data_s, "--port", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("refusing to start") && err.contains("airlock.lock"),
        "{err}"
    );

    // Through the daemon instead: the revocation is at once, in the daemon and on disk.
    let (s, b) = call(
        "DELETE",
        &format!("{base}/v1/acl/users/victim/token"),
        &admin,
        None,
    );
    assert_eq!(
        (s, &b),
        (200, &json!({"user_id": "victim", "had_token": true}))
    );
    let (s, _) = call("GET", &format!("{base}/v1/info"), &victim, None);
    assert_eq!(s, 401);
    daemon.stop();

    // With the daemon gone, the CLI writes again (the lock went with the process).
    let out = airlock(&["user", "remove", "victim", "--data", &data_s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (tokens, cli_entries) = on_disk(&data_s);
    assert!(!tokens.contains("victim"), "{tokens}");
    assert_eq!(cli_entries, before.1 + 1);
}

/// The routes the refusals name: revoke a token, end a user's sessions, remove a user; each at
/// once and audited with the calling admin and the request id.
#[tokio::test]
async fn tokens_sessions_and_users_end_through_the_api_at_once_and_audited() {
    let t = TestApp::new();
    let bob = t.user("bob", &["g"]);
    let carol = t.user("carol", &[]);
    let acl = t.state.services().unwrap().acl.clone();
    let s1 = acl.create_session("bob", Duration::from_secs(600)).unwrap();
    let s2 = acl.create_session("bob", Duration::from_secs(600)).unwrap();
    let carols = acl
        .create_session("carol", Duration::from_secs(600))
        .unwrap();
    let with_cookie = |secret: &str| {
        axum::http::Request::get("/v1/info")
            .header(header::COOKIE, format!("airlock_session={secret}"))
            .body(axum::body::Body::empty())
            .unwrap()
    };
    for s in [&s1.token, &s2.token] {
        assert_eq!(t.send(with_cookie(s)).await.status, 200);
    }

    // Sessions: both of bob's end; his token and carol's session stay.
    let r = t
        .call(
            Method::DELETE,
            "/v1/acl/users/bob/sessions",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json, json!({"user_id": "bob", "sessions_ended": 2}));
    for s in [&s1.token, &s2.token] {
        assert_eq!(t.send(with_cookie(s)).await.status, 401);
    }
    assert_eq!(t.send(with_cookie(&carols.token)).await.status, 200);
    let r = t.call(Method::GET, "/v1/info", Some(&bob), None).await;
    assert_eq!(r.status, 200);

    // Token: revoked at once.
    let r = t
        .call(
            Method::DELETE,
            "/v1/acl/users/bob/token",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(
        r.json,
        json!({"user_id": "bob", "had_token": true}),
        "{}",
        r.text
    );
    let r = t.call(Method::GET, "/v1/info", Some(&bob), None).await;
    assert_eq!(r.status, 401);
    let r = t
        .call(
            Method::DELETE,
            "/v1/acl/users/bob/token",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(
        r.json,
        json!({"user_id": "bob", "had_token": false}),
        "{}",
        r.text
    );

    // User: removed with token, sessions and conversations.
    let r = t
        .call(
            Method::POST,
            "/v1/conversations",
            Some(&carol),
            Some(json!({"title": "c"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = t
        .call(Method::DELETE, "/v1/acl/users/carol", Some(&t.admin), None)
        .await;
    assert_eq!(
        r.json,
        json!({"user_id": "carol", "removed": true}),
        "{}",
        r.text
    );
    assert_eq!(
        t.call(Method::GET, "/v1/info", Some(&carol), None)
            .await
            .status,
        401
    );
    assert_eq!(t.send(with_cookie(&carols.token)).await.status, 401);
    let store = t.state.services().unwrap().feedback.clone().unwrap();
    assert!(store.threads("carol").unwrap().is_empty());

    // Unknown users are 404; the last admin stays (409); none of it is for a non-admin.
    for path in [
        "/v1/acl/users/nobody",
        "/v1/acl/users/nobody/token",
        "/v1/acl/users/nobody/sessions",
    ] {
        let r = t.call(Method::DELETE, path, Some(&t.admin), None).await;
        assert_eq!(r.status, 404, "{path}: {}", r.text);
    }
    let r = t
        .call(Method::DELETE, "/v1/acl/users/admin", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, 409, "{}", r.text);
    let user = t.user("dave", &[]);
    let r = t
        .call(
            Method::DELETE,
            "/v1/acl/users/admin/token",
            Some(&user),
            None,
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);

    // Audited: who, which request, what.
    let entries = acl
        .audit_query(&AuditQuery {
            user: None,
            since: None,
            until: None,
            kind: None,
            limit: Some(1000),
        })
        .unwrap();
    let find = |kind: AuditKind, user: &str, key: &str, value: &str| {
        entries
            .iter()
            .find(|e| {
                e.kind == kind && e.user_id.as_deref() == Some(user) && e.detail[key] == value
            })
            .unwrap_or_else(|| panic!("no {key}={value} entry for {user}"))
    };
    for (kind, user, key, value) in [
        (AuditKind::SignIn, "bob", "ended_by", "sessions_end"),
        (AuditKind::Admin, "bob", "action", "token_revoke"),
        (AuditKind::Admin, "carol", "action", "user_remove"),
    ] {
        let e = find(kind, user, key, value);
        assert_eq!(e.actor.as_deref(), Some("admin"), "{e:?}");
        assert!(e.request_id.is_some(), "{e:?}");
    }
}
