//! Directory sign-in against a real OpenLDAP slapd (`slapd.rs`): login over StartTLS and
//! ldaps://, the session cookie and its CSRF header, logout, the refusals (wrong password and
//! unknown user alike, injection, disabled, unreachable, rate limits), lifetimes, token TTLs, and
//! the membership sync from the directory.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use airlock::Config;
use airlock::session::SessionConfig;
use airlock_identity::ldap::LdapConfig;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};

use crate::slapd::{BASE, SERVICE_DN, Slapd, user_dn};
use crate::support::{Resp, TestApp, problem_json, test_config};

const BIN: &str = env!("CARGO_BIN_EXE_airlock");

/// The `[ldap]` table as an operator writes it (the issue's shape, OpenLDAP flavour).
pub(crate) fn ldap_toml(s: &Slapd, ldaps: bool, extra: &str) -> String {
    let (url, start_tls) = if ldaps {
        (s.ldaps_url.as_str(), false)
    } else {
        (s.ldap_url.as_str(), true)
    };
    format!(
        "[ldap]\nurl = \"{url}\"\nstart_tls = {start_tls}\nca_file = \"{ca}\"\n\
         bind_dn = \"{SERVICE_DN}\"\nbind_password_file = \"{pw}\"\n\
         user_base = \"ou=people,{BASE}\"\nuser_filter = \"(uid={{username}})\"\n\
         user_id_attr = \"uid\"\ngroup_base = \"ou=groups,{BASE}\"\n\
         group_filter = \"(member={{user_dn}})\"\ngroup_name_attr = \"cn\"\n\
         nested_groups = true\ndisabled_filter = \"(employeeType=disabled)\"\n{extra}",
        ca = s.ca_file().display(),
        pw = s.bind_password_file().display(),
    )
}

pub(crate) fn ldap_config(s: &Slapd, ldaps: bool, extra: &str) -> LdapConfig {
    #[derive(serde::Deserialize)]
    struct T {
        ldap: LdapConfig,
    }
    toml::from_str::<T>(&ldap_toml(s, ldaps, extra))
        .unwrap()
        .ldap
}

pub(crate) fn app(s: &Slapd, ldaps: bool, extra: &str, sessions: SessionConfig) -> TestApp {
    TestApp::with_config(Config {
        ldap: Some(ldap_config(s, ldaps, extra)),
        sessions: Some(sessions),
        ..test_config()
    })
}

pub(crate) fn peer(ip: &str) -> SocketAddr {
    format!("{ip}:40000").parse().unwrap()
}

pub(crate) async fn login_from(t: &TestApp, user: &str, pw: &str, from: &str) -> Resp {
    let mut req = Request::post("/v1/auth/login")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            json!({"username": user, "password": pw}).to_string(),
        ))
        .unwrap();
    req.extensions_mut().insert(ConnectInfo(peer(from)));
    t.send(req).await
}

pub(crate) async fn login(t: &TestApp, user: &str, pw: &str) -> Resp {
    login_from(t, user, pw, "127.0.0.1").await
}

/// The session secret of a login's `Set-Cookie`.
pub(crate) fn cookie_of(r: &Resp) -> String {
    let c = r.headers.get(header::SET_COOKIE).unwrap().to_str().unwrap();
    let (kv, _) = c.split_once(';').unwrap();
    kv.strip_prefix("airlock_session=").unwrap().to_string()
}

/// A request authenticated by the cookie (and the CSRF header when given).
pub(crate) async fn with_cookie(
    t: &TestApp,
    method: Method,
    uri: &str,
    cookie: &str,
    csrf: Option<&str>,
    body: Option<Value>,
) -> Resp {
    let mut b = Request::builder().method(method).uri(uri).header(
        header::COOKIE,
        format!("theme=dark; airlock_session={cookie}"),
    );
    if let Some(c) = csrf {
        b = b.header("x-airlock-csrf", c);
    }
    let req = match body {
        Some(v) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(v.to_string()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    };
    t.send(req).await
}

pub(crate) fn bad_credentials() -> Value {
    problem_json(
        401,
        "invalid-credentials",
        "the username or password is wrong",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldap_login_session_csrf_logout_and_refusals() {
    let Some(s) = Slapd::start() else { return };
    let mut t = app(&s, false, "", SessionConfig::default());

    // Sign-in over StartTLS: the body, the cookie's attributes.
    let r = login(&t, "alice", "alice-pw").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["user"], "alice");
    assert_eq!(r.json["groups"], json!(["analysts"]));
    assert!(r.json["expires_at"].as_str().unwrap().contains('T'));
    let csrf = r.json["csrf_token"].as_str().unwrap().to_string();
    let set = r.headers.get(header::SET_COOKIE).unwrap().to_str().unwrap();
    assert!(set.starts_with("airlock_session=als_"), "{set}");
    assert!(
        set.ends_with("; HttpOnly; Secure; SameSite=Strict; Path=/"),
        "{set}"
    );
    assert_eq!(r.headers.get(header::CACHE_CONTROL).unwrap(), "no-store");
    let cookie = cookie_of(&r);

    // Nested groups: carol is in emea-analysts, which is a member of analysts.
    let r = login(&t, "carol", "carol-pw").await;
    assert_eq!(
        r.json["groups"],
        json!(["analysts", "emea-analysts"]),
        "{}",
        r.text
    );

    // The cookie authenticates like a bearer token; safe methods need no CSRF header.
    let r = with_cookie(&t, Method::GET, "/v1/conversations", &cookie, None, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // State-changing requests need the session's CSRF token: absent, wrong, another session's.
    let carol_csrf = login(&t, "carol", "carol-pw").await.json["csrf_token"]
        .as_str()
        .unwrap()
        .to_string();
    let body = json!({"title": "t"});
    for bad in [None, Some("alk_wrong"), Some(carol_csrf.as_str())] {
        let r = with_cookie(
            &t,
            Method::POST,
            "/v1/conversations",
            &cookie,
            bad,
            Some(body.clone()),
        )
        .await;
        r.assert_problem(
            403,
            "csrf-failed",
            "a state-changing request signed in by a session cookie or the SSO proxy needs its \
             X-Airlock-CSRF header (from the sign-in response or GET /v1/info)",
        );
    }
    let listed = with_cookie(&t, Method::GET, "/v1/conversations", &cookie, None, None).await;
    assert_eq!(
        listed.json["data"],
        json!([]),
        "refused requests created nothing"
    );
    let r = with_cookie(
        &t,
        Method::POST,
        "/v1/conversations",
        &cookie,
        Some(&csrf),
        Some(body.clone()),
    )
    .await;
    assert!(r.status.is_success(), "{}", r.text);

    // Wrong password and unknown user: the same body, comparable time (both bind once).
    let (mut wrong_t, mut unknown_t) = (Duration::MAX, Duration::MAX);
    for _ in 0..4 {
        let t0 = Instant::now();
        let wrong = login(&t, "bob", "not-bobs-password").await;
        wrong_t = wrong_t.min(t0.elapsed());
        let t0 = Instant::now();
        let unknown = login(&t, "nobody-here", "not-bobs-password").await;
        unknown_t = unknown_t.min(t0.elapsed());
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
        assert_eq!(wrong.json, bad_credentials());
        assert_eq!(unknown.json, bad_credentials());
    }
    let (lo, hi) = (wrong_t.min(unknown_t), wrong_t.max(unknown_t));
    assert!(
        hi < lo * 4 + Duration::from_millis(20),
        "wrong password {wrong_t:?} vs unknown user {unknown_t:?}"
    );

    // RFC 4515: filter metacharacters in the username are literals. Unescaped, `al*` would
    // find alice and her password would sign in.
    for injected in ["*)(uid=*", "al*", "*", "alice)(uid=*", "alice\\"] {
        let r = login(&t, injected, "alice-pw").await;
        assert_eq!(r.json, bad_credentials(), "{injected}: {}", r.text);
    }
    // An empty password is never sent (an anonymous bind to many directories).
    login(&t, "alice", "").await.assert_problem(
        400,
        "invalid-request",
        "`password` must not be empty",
    );

    // Disabled: 403 only with the right password; a wrong one is the usual 401.
    login(&t, "dave", "dave-pw").await.assert_problem(
        403,
        "account-disabled",
        "the account is disabled in the directory",
    );
    assert_eq!(login(&t, "dave", "wrong").await.json, bad_credentials());

    // Sessions survive a daemon restart (stored hashed in SQLite).
    t.restart();
    let r = with_cookie(&t, Method::GET, "/v1/conversations", &cookie, None, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);

    // Logout needs the CSRF header too, then the cookie no longer works.
    let r = with_cookie(&t, Method::POST, "/v1/auth/logout", &cookie, None, None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = with_cookie(
        &t,
        Method::POST,
        "/v1/auth/logout",
        &cookie,
        Some(&csrf),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    assert!(
        r.headers
            .get(header::SET_COOKIE)
            .unwrap()
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    with_cookie(&t, Method::GET, "/v1/conversations", &cookie, None, None)
        .await
        .assert_problem(401, "unauthorized", "a valid bearer token is required");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldap_login_attempts_are_limited_per_user_and_per_address() {
    let Some(s) = Slapd::start() else { return };
    let extra =
        "max_failures_per_user = 2\nmax_failures_per_address = 3\nfailure_window_secs = 600\n";
    let t = app(&s, true, extra, SessionConfig::default());
    let limited = |r: &Resp| {
        r.assert_problem(
            429,
            "login-rate-limited",
            "too many failed sign-ins; retry later",
        );
        assert!(r.headers.get(header::RETRY_AFTER).is_some());
    };
    // Per user: two failures for alice, then even her right password is refused, from any
    // address, without reaching the directory.
    for _ in 0..2 {
        assert_eq!(
            login_from(&t, "alice", "x", "10.0.0.1").await.json,
            bad_credentials()
        );
    }
    limited(&login_from(&t, "alice", "alice-pw", "10.0.0.1").await);
    limited(&login_from(&t, "ALICE", "alice-pw", "10.0.0.9").await);
    // Per address: one more failure from 10.0.0.1 (bob) makes three; bob's right password from
    // there is refused, from elsewhere it signs in.
    assert_eq!(
        login_from(&t, "bob", "x", "10.0.0.1").await.json,
        bad_credentials()
    );
    limited(&login_from(&t, "bob", "bob-pw", "10.0.0.1").await);
    limited(&login_from(&t, "carol", "carol-pw", "10.0.0.1").await);
    let r = login_from(&t, "bob", "bob-pw", "10.0.0.2").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Refused attempts were not counted: bob has one failure, so one more is still answered
    // by the directory (401), the next is limited.
    assert_eq!(
        login_from(&t, "bob", "x", "10.0.0.3").await.json,
        bad_credentials()
    );
    limited(&login_from(&t, "bob", "bob-pw", "10.0.0.4").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ldaps_works_and_an_unreachable_or_untrusted_directory_is_503() {
    let Some(s) = Slapd::start() else { return };
    let t = app(&s, true, "", SessionConfig::default());
    let r = login(&t, "bob", "bob-pw").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["groups"], json!(["risk"]));

    let unavailable = |r: Resp| {
        r.assert_problem(
            503,
            "directory-unavailable",
            "the directory is unavailable; retry later",
        )
    };
    // A directory whose certificate the configured CA did not sign.
    let mut cfg = ldap_config(&s, true, "");
    cfg.ca_file = s.other_ca_file();
    let untrusted = TestApp::with_config(Config {
        ldap: Some(cfg.clone()),
        ..test_config()
    });
    unavailable(login(&untrusted, "bob", "bob-pw").await);
    // Nothing listens.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    cfg.ca_file = s.ca_file();
    cfg.url = format!("ldaps://127.0.0.1:{port}");
    let down = TestApp::with_config(Config {
        ldap: Some(cfg),
        ..test_config()
    });
    unavailable(login(&down, "bob", "bob-pw").await);
    // Not configured: the route says so.
    let none = TestApp::with_config(test_config());
    none.call(
        Method::POST,
        "/v1/auth/login",
        None,
        Some(json!({"username": "bob", "password": "bob-pw"})),
    )
    .await
    .assert_problem(
        404,
        "not-found",
        "directory sign-in is not configured ([ldap])",
    );
}

#[test]
fn ldap_config_is_validated_at_startup() {
    let Some(s) = Slapd::start() else { return };
    let check = |toml: String| -> String {
        let path = s.dir.path().join("airlock.toml");
        std::fs::write(&path, toml).unwrap();
        Config {
            config_file: Some(path),
            ..Config::default()
        }
        .load()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    assert_eq!(check(ldap_toml(&s, false, "")), "");
    assert_eq!(
        check(ldap_toml(&s, false, "").replace("start_tls = true", "start_tls = false")),
        "invalid setting `ldap.url`: ldap:// sends passwords in clear text: use ldaps:// or set start_tls = true"
    );
    assert!(
        check(ldap_toml(&s, false, "").replace("(uid={username})", "(uid=alice)"))
            .contains("`ldap.user_filter`: must contain {username}")
    );
    assert!(check(ldap_toml(&s, false, "bogus = 1\n")).contains("unknown field `bogus`"));
    let loose = s.dir.path().join("loose.secret");
    std::fs::write(&loose, "pw\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = check(ldap_toml(&s, false, "").replace(
        &s.bind_password_file().display().to_string(),
        &loose.display().to_string(),
    ));
    assert!(e.contains("readable by group or others (mode 644)"), "{e}");
    let e = check(format!(
        "{}[sessions]\nidle_secs = 600\nabsolute_secs = 60\n",
        ldap_toml(&s, false, "")
    ));
    assert!(e.contains("sessions.absolute_secs"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_expire_when_idle_and_at_their_absolute_end_and_tokens_at_their_ttl() {
    let Some(s) = Slapd::start() else { return };
    let t = app(
        &s,
        false,
        "",
        SessionConfig {
            idle_secs: Some(1),
            absolute_secs: Some(3),
        },
    );
    let get = |c: String| {
        let t = &t;
        async move {
            with_cookie(t, Method::GET, "/v1/conversations", &c, None, None)
                .await
                .status
        }
    };
    // Idle: unused for longer than 1 s.
    let idle = cookie_of(&login(&t, "alice", "alice-pw").await);
    assert_eq!(get(idle.clone()).await, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(get(idle).await, StatusCode::UNAUTHORIZED);
    // Absolute: used every 0.5 s, still ended after 3 s.
    let busy = cookie_of(&login(&t, "alice", "alice-pw").await);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2600) {
        assert_eq!(get(busy.clone()).await, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(get(busy).await, StatusCode::UNAUTHORIZED);

    // A token with a TTL works until it expires.
    let acl = t.state.services().unwrap().acl.clone();
    let token = acl
        .issue_token_expiring("test", "alice", Some(Duration::from_secs(1)))
        .unwrap();
    let r = t
        .call(Method::GET, "/v1/conversations", Some(&token), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    t.call(Method::GET, "/v1/conversations", Some(&token), None)
        .await
        .assert_problem(401, "unauthorized", "a valid bearer token is required");
}

fn cli(data: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .arg("--data")
        .arg(data)
        .env_remove("AIRLOCK_DATA")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn user_tokens_cli_lists_ttl_and_last_use_and_revokes() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, token, e) = cli(dir.path(), &["user", "add", "u1", "--groups", "g"]);
    assert!(ok, "{e}");
    let token = token.trim().to_string();
    let (ok, _, e) = cli(dir.path(), &["user", "add", "u2"]);
    assert!(ok, "{e}");
    let (ok, t2, e) = cli(dir.path(), &["user", "token", "u2", "--ttl", "2h"]);
    assert!(ok, "{e}");
    {
        let acl = airlock_acl::Acl::open(dir.path().join("airlock.db")).unwrap();
        assert!(acl.authenticate(&token).is_some());
        assert!(acl.note_token_use("u1"));
        acl.persist_token_use("u1").unwrap();
        assert!(acl.authenticate(t2.trim()).is_some());
    }
    let (ok, out, e) = cli(dir.path(), &["user", "tokens", "list"]);
    assert!(ok, "{e}");
    let rows: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert_eq!(rows[0]["user_id"], "u1");
    assert!(rows[0]["last_used_at"].is_string() && rows[0]["expires_at"].is_null());
    assert!(rows[1]["last_used_at"].is_null() && rows[1]["expires_at"].is_string());
    assert!(!out.contains(&token[4..]), "no secret is listed");
    let (ok, _, e) = cli(dir.path(), &["user", "tokens", "revoke", "u1"]);
    assert!(ok, "{e}");
    let acl = airlock_acl::Acl::open(dir.path().join("airlock.db")).unwrap();
    assert!(acl.authenticate(&token).is_none());
    assert!(acl.authenticate(t2.trim()).is_some());
    let (ok, _, e) = cli(dir.path(), &["user", "token", "u2", "--ttl", "soon"]);
    assert!(!ok && e.contains("--ttl"), "{e}");
}

async fn retrieve_docs(t: &TestApp, cookie: &str, csrf: &str) -> Resp {
    with_cookie(
        t,
        Method::POST,
        "/v1/retrieve",
        cookie,
        Some(csrf),
        Some(json!({"query": "quarterly liquidity stress scenario"})),
    )
    .await
}

fn doc_ids(r: &Resp) -> Vec<String> {
    r.json["results"]
        .as_array()
        .unwrap_or(&vec![])
        .iter()
        .map(|h| h["doc_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_sync_changes_memberships_and_disabled_users_lose_sessions() {
    let Some(s) = Slapd::start() else { return };
    let t = app(&s, false, "", SessionConfig::default());
    let r = t
        .call(
            Method::PUT,
            "/v1/documents/doc-analysts",
            Some(&t.admin),
            Some(json!({"title": "Liquidity stress scenario",
                        "text": "The quarterly liquidity stress scenario assumes a 30% deposit outflow.",
                        "acl": {"users": [], "groups": ["analysts"]}})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
    // The first sync imports alice, bob and carol (dave is disabled).
    let r = t
        .call(Method::POST, "/v1/acl/sync/ldap", Some(&t.admin), None)
        .await;
    assert_eq!(r.json["users_added"], 3, "{}", r.text);
    let login_r = login(&t, "alice", "alice-pw").await;
    let (cookie, csrf) = (
        cookie_of(&login_r),
        login_r.json["csrf_token"].as_str().unwrap().to_string(),
    );
    let r = retrieve_docs(&t, &cookie, &csrf).await;
    assert_eq!(doc_ids(&r), ["doc-analysts"], "{}", r.text);

    // alice leaves analysts in the directory; after a sync her retrieval no longer finds it.
    s.modify(&format!(
        "dn: cn=analysts,ou=groups,{BASE}\nchangetype: modify\ndelete: member\nmember: {}\n",
        user_dn("alice")
    ));
    let r = t
        .call(Method::POST, "/v1/acl/sync/ldap", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Only alice changed.
    assert_eq!(r.json["users_removed"], 0, "{}", r.text);
    assert_eq!(r.json["memberships_changed"], 1, "{}", r.text);
    assert_eq!(r.json["users_access_changed"], 1, "{}", r.text);
    let r = retrieve_docs(&t, &cookie, &csrf).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(doc_ids(&r).is_empty(), "{}", r.text);
    // A second sync with nothing changed recomputes nobody.
    let r = t
        .call(Method::POST, "/v1/acl/sync/ldap", Some(&t.admin), None)
        .await;
    assert_eq!(
        (
            r.json["memberships_changed"].clone(),
            r.json["users_access_changed"].clone()
        ),
        (json!(0), json!(0))
    );
    // Non-admins cannot trigger a sync.
    let r = with_cookie(
        &t,
        Method::POST,
        "/v1/acl/sync/ldap",
        &cookie,
        Some(&csrf),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // alice is disabled in the directory: the next sync ends her session and her token.
    let token = t
        .state
        .services()
        .unwrap()
        .acl
        .issue_token("test", "alice")
        .unwrap();
    s.modify(&format!(
        "dn: {}\nchangetype: modify\nadd: employeeType\nemployeeType: disabled\n",
        user_dn("alice")
    ));
    let r = t
        .call(Method::POST, "/v1/acl/sync/ldap", Some(&t.admin), None)
        .await;
    assert_eq!(r.json["users_removed"], 1, "{}", r.text);
    with_cookie(&t, Method::GET, "/v1/conversations", &cookie, None, None)
        .await
        .assert_problem(401, "unauthorized", "a valid bearer token is required");
    let r = t
        .call(Method::GET, "/v1/conversations", Some(&token), None)
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // The admin (a local operator) is untouched by directory syncs.
    let r = t
        .call(Method::GET, "/v1/conversations", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
}

#[test]
fn acl_sync_ldap_cli_imports_memberships() {
    let Some(s) = Slapd::start() else { return };
    let data = tempfile::tempdir().unwrap();
    let cfg = s.dir.path().join("airlock.toml");
    std::fs::write(&cfg, ldap_toml(&s, true, "")).unwrap();
    let out = Command::new(BIN)
        .args(["acl", "sync", "--ldap", "--config"])
        .arg(&cfg)
        .arg("--data")
        .arg(data.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(counts["users_added"], 3, "{stdout}");
    let acl = airlock_acl::Acl::open(data.path().join("airlock.db")).unwrap();
    assert_eq!(
        acl.user("carol").unwrap().groups,
        ["analysts", "emea-analysts"]
    );
    assert_eq!(acl.user("bob").unwrap().groups, ["risk"]);
    assert!(
        acl.user("dave").is_none(),
        "disabled users are not imported"
    );
}

/// Issue 42 M1: `"bob "`, `" bob"`, `BOB` and full-width `ｂｏｂ` reach the same directory
/// account, so they count against the same per-user limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn username_variants_count_against_one_account() {
    let Some(s) = Slapd::start() else { return };
    let extra =
        "max_failures_per_user = 2\nmax_failures_per_address = 100\nfailure_window_secs = 600\n";
    let t = app(&s, true, extra, SessionConfig::default());
    // Every spelling signs in as bob.
    for variant in ["bob ", " bob", "ｂｏｂ", "BOB"] {
        let r = login_from(&t, variant, "bob-pw", "10.1.0.1").await;
        assert_eq!(r.status, StatusCode::OK, "{variant:?}: {}", r.text);
        assert_eq!(r.json["user"], "bob", "{variant:?}");
    }
    // Two failures, each under another spelling, from other addresses.
    for (variant, from) in [(" bob", "10.1.0.2"), ("ｂｏｂ ", "10.1.0.3")] {
        assert_eq!(
            login_from(&t, variant, "wrong", from).await.json,
            bad_credentials()
        );
    }
    // Now every spelling is limited, even with the right password.
    for variant in [
        "bob",
        "bob ",
        " bob",
        "ｂｏｂ",
        "BOB",
        "Ｂｏｂ",
        "bob\u{3000}",
    ] {
        let r = login_from(&t, variant, "bob-pw", "10.1.0.4").await;
        r.assert_problem(
            429,
            "login-rate-limited",
            "too many failed sign-ins; retry later",
        );
    }
    // Another account is not affected; a name that is only whitespace is refused up front.
    let r = login_from(&t, "alice", "alice-pw", "10.1.0.4").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = login_from(&t, "\u{3000}", "x", "10.1.0.4").await;
    r.assert_problem(400, "invalid-request", "`username` must not be empty");
    // Characters the directory ignores when matching (RFC 4518 §2.2) would be another name for
    // bob here: refused before the limits and the directory.
    for variant in ["b\u{200B}ob", "bob\u{00AD}", "\u{FEFF}bob", "bo\u{2060}b"] {
        let r = login_from(&t, variant, "bob-pw", "10.1.0.5").await;
        r.assert_problem(
            400,
            "invalid-request",
            "`username` must not contain invisible characters (soft hyphens, zero-width or \
             format characters, variation selectors)",
        );
    }
}

/// Issue 42 M2 (directory side): the directory user `admin` never takes the local admin's
/// roles or groups, at sign-in or in a sync; an entry with two user ids signs in as neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_identities_never_take_a_local_account() {
    let Some(s) = Slapd::start() else { return };
    let t = app(&s, false, "", SessionConfig::default());
    s.modify(&format!(
        "dn: {}\nchangetype: add\nobjectClass: inetOrgPerson\nuid: admin\ncn: admin\nsn: admin\n\
         userPassword: admin-pw\n\n\
         dn: {}\nchangetype: add\nobjectClass: inetOrgPerson\nuid: mallory\nuid: alice\n\
         cn: mallory\nsn: mallory\nuserPassword: mallory-pw\n\n\
         dn: cn=risk,ou=groups,{BASE}\nchangetype: modify\nadd: member\nmember: {}\n",
        user_dn("admin"),
        user_dn("mallory"),
        user_dn("admin"),
    ));
    let acl = t.state.services().unwrap().acl.clone();
    let before = acl.user("admin").unwrap();
    assert!(before.local && before.groups.is_empty());
    let sessions = || -> i64 {
        rusqlite::Connection::open(t._dir.path().join("airlock.db"))
            .unwrap()
            .query_row("SELECT count(*) FROM acl_sessions", [], |r| r.get(0))
            .unwrap()
    };
    // The right directory password for `admin`: refused, nothing changed.
    let r = login(&t, "admin", "admin-pw").await;
    r.assert_problem(
        403,
        "forbidden",
        "this identity has the id of a local account: a directory or OIDC sign-in cannot use it",
    );
    assert!(r.headers.get(header::SET_COOKIE).is_none());
    assert_eq!(acl.user("admin").unwrap(), before);
    assert_eq!(sessions(), 0);
    // Two uid values: refused, whichever comes first.
    let r = login(&t, "mallory", "mallory-pw").await;
    r.assert_problem(
        403,
        "forbidden",
        "the directory entry of this account does not have exactly one user id",
    );
    assert_eq!(sessions(), 0);
    assert!(acl.user("mallory").is_none());
    // A sync leaves the local admin and the two-id entry out.
    let r = t
        .call(Method::POST, "/v1/acl/sync/ldap", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["users_added"], 3, "alice, bob, carol: {}", r.text);
    assert_eq!(acl.user("admin").unwrap(), before);
    assert!(acl.user("mallory").is_none());
    assert_eq!(acl.user("alice").unwrap().groups, ["analysts"]);
    // The local admin still administers.
    let r = t
        .call(Method::POST, "/v1/acl/sync/ldap", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

/// Issue 42 M6: a directory whose size limit is smaller than its user list (AD: 1,000) is
/// synced in pages; a disabled user still loses their session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_sync_pages_past_the_directorys_size_limit() {
    let Some(s) = Slapd::start_with_size_limit(2) else {
        return;
    };
    let t = app(&s, false, "sync_page_size = 2\n", SessionConfig::default());
    let r = t
        .call(Method::POST, "/v1/acl/sync/ldap", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["users_added"], 3, "{}", r.text);
    let login_r = login(&t, "bob", "bob-pw").await;
    assert_eq!(login_r.status, StatusCode::OK, "{}", login_r.text);
    let cookie = cookie_of(&login_r);
    s.modify(&format!(
        "dn: {}\nchangetype: modify\nadd: employeeType\nemployeeType: disabled\n",
        user_dn("bob")
    ));
    let r = t
        .call(Method::POST, "/v1/acl/sync/ldap", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["users_removed"], 1, "{}", r.text);
    with_cookie(&t, Method::GET, "/v1/conversations", &cookie, None, None)
        .await
        .assert_problem(401, "unauthorized", "a valid bearer token is required");
    // A page size of 0 or past 10,000 is refused at start-up.
    for bad in ["sync_page_size = 0\n", "sync_page_size = 10001\n"] {
        let e = ldap_config(&s, false, bad).validate().unwrap_err();
        assert_eq!(e.0, "ldap.sync_page_size", "{bad}");
    }
}
