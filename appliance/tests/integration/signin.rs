//! Sign-in audit and egress (issue 22 points 2 and 8) against a real slapd (`slapd.rs`):
//!
//! 1. Every directory sign-in writes one `sign_in` audit entry: a success, each refusal kind
//!    (wrong password, unknown user, disabled, rate limited, directory unavailable), a logout, and
//!    the sessions a directory sync ends. A refused sign-in changes nothing but the audit log
//!    (every other table compared, as `refusals.rs` does), and no entry holds a password, cookie
//!    or CSRF token.
//! 2. `GET /v1/auth/methods` says which sign-ins the web UI offers, and nothing secret.
//! 3. The real binary under strace with `require_sandbox` and `[ldap]`: a sign-in works under the
//!    lockdown, and every IPv4/IPv6 connect goes to the directory's port.

use airlock::Config;
use airlock::session::SessionConfig;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::ldap::{app, bad_credentials, cookie_of, ldap_config, ldap_toml, login, login_from};
use crate::refusals;
use crate::slapd::{BASE, Slapd, user_dn};
use crate::support::{TestApp, test_config};

/// The state a refusal must not change ([`refusals::state_digest`]: every table but the audit
/// log), without the audit log's AUTOINCREMENT counter in `sqlite_sequence` either: appending an
/// audit entry for a refused sign-in is the one intended change.
fn state_digest(t: &TestApp) -> String {
    let counter = format!("{:?}|", rusqlite::types::ValueRef::Text(b"acl_audit"));
    refusals::state_digest(t)
        .lines()
        .filter(|l| !l.starts_with(&counter))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `sign_in` entries of the audit log after `seq`, through the auditor's route.
async fn sign_ins_after(t: &TestApp, seq: i64) -> Vec<Value> {
    let r = t
        .call(
            Method::GET,
            "/v1/audit?kind=sign_in&limit=10000",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["seq"].as_i64().unwrap() > seq)
        .cloned()
        .collect()
}

/// The last audit sequence number (any kind).
async fn last_seq(t: &TestApp) -> i64 {
    let r = t
        .call(Method::GET, "/v1/audit?limit=10000", Some(&t.admin), None)
        .await;
    r.json["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["seq"].as_i64())
        .max()
        .unwrap_or(0)
}

/// (outcome, user_id, username, client) of a sign-in entry.
fn shape(e: &Value) -> (String, Value, Value, Value) {
    assert_eq!(e["kind"], "sign_in", "{e}");
    let d = &e["detail"];
    (
        d["outcome"].as_str().unwrap().to_string(),
        e["user_id"].clone(),
        d["username"].clone(),
        d["client"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_ins_are_audited_and_a_refused_sign_in_changes_nothing_else() {
    let Some(s) = Slapd::start() else { return };
    let extra = "max_failures_per_user = 2\nfailure_window_secs = 600\n";
    let t = app(&s, false, extra, SessionConfig::default());

    // A success: the user id, no username, the client address; the method is ldap.
    let seq0 = last_seq(&t).await;
    let ok = login_from(&t, "alice", "alice-pw", "10.0.0.4").await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    let alice_cookie = cookie_of(&ok);
    let alice_csrf = ok.json["csrf_token"].as_str().unwrap().to_string();
    let e = sign_ins_after(&t, seq0).await;
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(
        shape(&e[0]),
        (
            "success".into(),
            json!("alice"),
            Value::Null,
            json!("10.0.0.4")
        )
    );
    assert_eq!(e[0]["detail"]["method"], "ldap");
    assert_eq!(e[0]["actor"], "ldap-login");
    assert!(e[0]["request_id"].is_string());

    // Every refusal kind: each answers as before, writes one entry, and changes nothing else.
    let before = state_digest(&t);
    let seq1 = last_seq(&t).await;
    let wrong = login_from(&t, "bob", "not-bobs-password", "10.0.0.5").await;
    let unknown = login_from(&t, "nobody-here", "not-bobs-password", "10.0.0.5").await;
    // The client cannot tell them apart (the audit log can).
    assert_eq!((wrong.status, &wrong.json), (unknown.status, &unknown.json));
    assert_eq!(wrong.json, bad_credentials());
    let injected = login_from(&t, "*)(uid=*", "alice-pw", "10.0.0.5").await;
    assert_eq!(injected.json, bad_credentials());
    assert_eq!(
        login_from(&t, "bob", "still-not-it", "10.0.0.6").await.json,
        bad_credentials()
    );
    // bob has two failures: his next attempt is refused before the directory.
    login_from(&t, "bob", "bob-pw", "10.0.0.7")
        .await
        .assert_problem(
            429,
            "login-rate-limited",
            "too many failed sign-ins; retry later",
        );
    login_from(&t, "dave", "dave-pw", "10.0.0.8")
        .await
        .assert_problem(
            403,
            "account-disabled",
            "the account is disabled in the directory",
        );
    assert_eq!(
        state_digest(&t),
        before,
        "a refused sign-in changed more than the audit log"
    );
    let e = sign_ins_after(&t, seq1).await;
    let got: Vec<_> = e.iter().map(shape).collect();
    let n = Value::Null;
    assert_eq!(
        got,
        [
            (
                "wrong_password".into(),
                json!("bob"),
                n.clone(),
                json!("10.0.0.5")
            ),
            (
                "unknown_user".into(),
                n.clone(),
                json!("nobody-here"),
                json!("10.0.0.5")
            ),
            (
                "unknown_user".into(),
                n.clone(),
                json!("*)(uid=*"),
                json!("10.0.0.5")
            ),
            (
                "wrong_password".into(),
                json!("bob"),
                n.clone(),
                json!("10.0.0.6")
            ),
            (
                "rate_limited".into(),
                n.clone(),
                json!("bob"),
                json!("10.0.0.7")
            ),
            (
                "disabled".into(),
                json!("dave"),
                n.clone(),
                json!("10.0.0.8")
            ),
        ]
    );
    // Only sign-in entries were added (no sync, no admin row for a refusal).
    assert_eq!(
        last_seq(&t).await,
        e.last().unwrap()["seq"].as_i64().unwrap()
    );

    // Logout: one entry for the session's user.
    let seq2 = last_seq(&t).await;
    let r = crate::ldap::with_cookie(
        &t,
        Method::POST,
        "/v1/auth/logout",
        &alice_cookie,
        Some(&alice_csrf),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let e = sign_ins_after(&t, seq2).await;
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0]["detail"]["method"], "session");
    assert_eq!(shape(&e[0]).0, "logout");
    assert_eq!(e[0]["user_id"], "alice");

    // A directory sync that removes a signed-in user ends their sessions: one entry for them.
    let c1 = login(&t, "carol", "carol-pw").await;
    let c2 = login(&t, "carol", "carol-pw").await;
    assert!(c1.status.is_success() && c2.status.is_success());
    s.modify(&format!(
        "dn: {}\nchangetype: modify\nadd: employeeType\nemployeeType: disabled\n",
        user_dn("carol")
    ));
    let seq3 = last_seq(&t).await;
    let r = t
        .call(Method::POST, "/v1/acl/sync/ldap", Some(&t.admin), None)
        .await;
    assert_eq!(r.json["users_removed"], 1, "{}", r.text);
    let e = sign_ins_after(&t, seq3).await;
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0]["user_id"], "carol");
    assert_eq!(
        e[0]["detail"],
        json!({"method": "session", "outcome": "sessions_ended", "ended_by": "directory_sync",
               "sessions": 2})
    );
    // The sync's own entry and this one share the request id.
    let sync = t
        .call(Method::GET, "/v1/audit?kind=sync", Some(&t.admin), None)
        .await;
    let sync_entry = sync.json["entries"].as_array().unwrap().last().unwrap();
    assert_eq!(sync_entry["request_id"], e[0]["request_id"]);

    // No entry holds a secret: passwords, session cookies, CSRF tokens.
    let all = t
        .call(Method::GET, "/v1/audit?limit=10000", Some(&t.admin), None)
        .await
        .text;
    for secret in [
        "alice-pw",
        "bob-pw",
        "dave-pw",
        "carol-pw",
        "not-bobs-password",
        "still-not-it",
        "als_",
        &alice_csrf,
        &cookie_of(&c1),
    ] {
        assert!(!all.contains(secret), "the audit log holds {secret:?}");
    }
    // The directory is unreachable: 503, audited, nothing else changed.
    let mut cfg = ldap_config(&s, true, "");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    cfg.url = format!("ldaps://127.0.0.1:{port}");
    let down = TestApp::with_config(Config {
        ldap: Some(cfg),
        ..test_config()
    });
    let before = state_digest(&down);
    let seq4 = last_seq(&down).await;
    login(&down, "bob", "bob-pw").await.assert_problem(
        503,
        "directory-unavailable",
        "the directory is unavailable; retry later",
    );
    assert_eq!(state_digest(&down), before);
    let e = sign_ins_after(&down, seq4).await;
    assert_eq!(
        e.iter().map(shape).collect::<Vec<_>>(),
        [(
            "directory_unavailable".into(),
            Value::Null,
            json!("bob"),
            json!("127.0.0.1")
        )]
    );
    // The kind filter names the new kind.
    let r = t
        .call(Method::GET, "/v1/audit?kind=nope", Some(&t.admin), None)
        .await;
    assert!(r.text.contains("sign_in"), "{}", r.text);
}

#[tokio::test]
async fn auth_methods_name_the_sign_ins_and_nothing_secret() {
    // No [ldap], no trusted header: tokens only.
    let t = TestApp::with_config(test_config());
    let r = t.call(Method::GET, "/v1/auth/methods", None, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"ldap": false, "oidc": null, "trusted_header": false, "token": true})
    );
    assert_eq!(r.headers.get("cache-control").unwrap(), "no-store");
    // Trusted header configured (with its secret): said, the secret and header name are not.
    let t = TestApp::with_config(Config {
        trusted_header: Some("X-Remote-User".into()),
        trusted_header_secret: Some("proxy-secret-0123456789".into()),
        ..test_config()
    });
    let r = t.call(Method::GET, "/v1/auth/methods", None, None).await;
    assert_eq!(r.json["trusted_header"], true, "{}", r.text);
    assert!(!r.text.contains("proxy-secret") && !r.text.contains("X-Remote-User"));
    // [ldap]: true, with neither the directory's address nor its service account.
    let Some(s) = Slapd::start() else { return };
    let t = app(&s, true, "", SessionConfig::default());
    let r = t.call(Method::GET, "/v1/auth/methods", None, None).await;
    assert_eq!(
        r.json,
        json!({"ldap": true, "oidc": null, "trusted_header": false, "token": true})
    );
    for secret in ["127.0.0.1", BASE, "airlock,ou=services", "bind.secret"] {
        assert!(!r.text.contains(secret), "{secret}: {}", r.text);
    }
}

/// `airlock demo` (which execs `airlock serve`) under strace, lockdown required, with `[ldap]`
/// pointing at slapd's ldaps:// port: sign-ins answer from the directory (200 and 401, not the
/// 503 a denied connect gives), and every IPv4/IPv6 connect goes to that port.
#[test]
fn the_daemon_connects_only_to_the_directory_under_the_lockdown() {
    use crate::sandbox::{STRACE, inet_connects, stop_traced};
    if !std::path::Path::new(STRACE).exists() {
        eprintln!("SKIPPED: {STRACE} is not installed (.ci/run must install strace)");
        return;
    }
    let Some(s) = Slapd::start() else { return };
    let ldaps_port: u16 = s.ldaps_url.rsplit_once(':').unwrap().1.parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    crate::support::small_staging(&staging);
    let data = dir.path().join("data");
    let toml_path = dir.path().join("ldap.toml");
    std::fs::write(&toml_path, ldap_toml(&s, true, "")).unwrap();
    let log = dir.path().join("strace.txt");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (mut strace, logs) =
        crate::sandbox::traced_demo_ready(&log, &data, &staging, &toml_path, port);
    let base = format!("http://127.0.0.1:{port}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let login = |user: &str, pw: &str| {
        let mut r = agent
            .post(&format!("{base}/v1/auth/login"))
            .send_json(json!({"username": user, "password": pw}))
            .unwrap();
        let status = r.status().as_u16();
        (status, r.body_mut().read_to_string().unwrap_or_default())
    };
    let ok = login("alice", "alice-pw");
    let wrong = login("bob", "wrong");
    stop_traced(&mut strace);
    let logs = logs.join().unwrap();
    assert_eq!(ok.0, 200, "{}\n{logs}", ok.1);
    assert_eq!(wrong.0, 401, "{}", wrong.1);
    assert!(
        logs.lines().any(|l| l.contains("egress lockdown active")
            && l.contains("tcp_connect_allowed_ports")
            && l.contains(&ldaps_port.to_string())),
        "the daemon must log its lockdown with the directory's port:\n{logs}"
    );
    let trace = std::fs::read_to_string(&log).unwrap();
    let inet = inet_connects(&trace);
    let directory = format!("sin_port=htons({ldaps_port})");
    assert!(inet.len() >= 2, "expected the two sign-ins:\n{trace}");
    for l in &inet {
        assert!(
            l.contains(&directory) && l.contains("127.0.0.1"),
            "a connect outside the directory:\n{l}"
        );
    }
    eprintln!(
        "{} connects, all to 127.0.0.1:{ldaps_port} (the directory)",
        inet.len()
    );
}
