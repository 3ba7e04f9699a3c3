//! Trusted-header SSO behind a real nginx (issue 22 point 5). nginx (Debian's) runs on loopback
//! with its own generated config in a temporary prefix, in the foreground, stopped on drop. It
//! authenticates users itself (HTTP Basic here, standing in for the bank's Kerberos/SAML
//! module), sets the user header from `$remote_user`, and proves itself with the shared secret.
//! Requests through nginx are signed in without a token; requests straight to the daemon with a
//! forged user header, without the secret or with a wrong one, are refused.
//!
//! Without nginx the test fails when `AIRLOCK_REQUIRE_NGINX=1` (.ci/run sets it) and is skipped
//! loudly otherwise.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::http::Method;
use serde_json::{Value, json};

use crate::support::{TestApp, test_config};

const HEADER: &str = "X-Remote-User";
const SECRET: &str = "proxy-secret-0123456789abcdef";

/// The nginx binary, if installed.
fn nginx_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// `Some(nginx)`, or `None` after a loud skip message; panics when nginx is required.
pub fn nginx_or_skip(test: &str) -> Option<PathBuf> {
    match nginx_binary() {
        Some(p) => Some(p),
        None if std::env::var("AIRLOCK_REQUIRE_NGINX").as_deref() == Ok("1") => {
            panic!("AIRLOCK_REQUIRE_NGINX=1 but nginx is not installed (apt-get install nginx)")
        }
        None => {
            eprintln!(
                "SKIPPED {test}: nginx is not installed; nothing about the SSO proxy is proven \
                 on this machine (apt-get install nginx, or set AIRLOCK_REQUIRE_NGINX=1 to fail)"
            );
            None
        }
    }
}

/// nginx in front of `upstream`, stopped (and its files removed) on drop.
pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Nginx {
    /// Starts nginx as the SSO proxy of `upstream` (`127.0.0.1:PORT`): HTTP Basic users
    /// `users` (name, password), user header from `$remote_user`, the shared secret.
    pub fn start(bin: &Path, upstream: &str, users: &[(&str, &str)]) -> Nginx {
        let mut dir = tempfile::tempdir().unwrap();
        let mut htpasswd = String::new();
        for (u, pw) in users {
            let out = Command::new("openssl")
                .args(["passwd", "-apr1", pw])
                .output()
                .unwrap();
            assert!(out.status.success(), "openssl passwd");
            htpasswd.push_str(&format!("{u}:{}", String::from_utf8(out.stdout).unwrap()));
        }
        std::fs::write(dir.path().join("htpasswd"), htpasswd).unwrap();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let d = dir.path().display();
            let conf = format!(
                r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port};
        # The bank's SSO module (SPNEGO, SAML) goes here; HTTP Basic stands in for it.
        auth_basic "Airlock";
        auth_basic_user_file {d}/htpasswd;
        location / {{
            proxy_pass http://{upstream};
            proxy_http_version 1.1;
            proxy_buffering off;
            # Replaces whatever the client sent in these headers.
            proxy_set_header {HEADER} $remote_user;
            proxy_set_header X-Airlock-Proxy-Secret "{SECRET}";
            proxy_set_header Authorization "";
        }}
    }}
}}
"#
            );
            let conf_path = dir.path().join("nginx.conf");
            std::fs::write(&conf_path, conf).unwrap();
            let child = Command::new(bin)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(&conf_path)
                .arg("-e")
                .arg(dir.path().join("error.log"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut nginx = Nginx {
                child,
                dir,
                base: format!("http://127.0.0.1:{port}"),
            };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return nginx;
                }
                if nginx.child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let log =
                std::fs::read_to_string(nginx.dir.path().join("error.log")).unwrap_or_default();
            assert!(attempt < 3, "nginx did not start: {log}");
            let _ = nginx.child.kill();
            let _ = nginx.child.wait();
            dir = std::mem::replace(&mut nginx.dir, tempfile::tempdir().unwrap());
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request; `basic` as `(user, password)`; extra headers; a JSON body (POST).
fn send(
    method: &str,
    url: &str,
    basic: Option<(&str, &str)>,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, String) {
    let body = (method != "GET").then(|| {
        (
            "application/json",
            serde_json::to_vec(&body.unwrap_or(json!({}))).unwrap(),
        )
    });
    send_raw(method, url, basic, headers, body)
}

/// A request body: (content type, bytes).
type Body<'a> = (&'a str, Vec<u8>);

/// One request with a body of any media type (`(content type, bytes)`; an empty content type
/// sends none), as a browser's form or `fetch` would send it.
fn send_raw(
    method: &str,
    url: &str,
    basic: Option<(&str, &str)>,
    headers: &[(&str, &str)],
    body: Option<Body<'_>>,
) -> (u16, String) {
    use base64::Engine as _;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into();
    let mut hs: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Some((u, p)) = basic {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
        hs.push(("Authorization".into(), format!("Basic {b}")));
    }
    let res = match (method, body) {
        ("GET", _) => {
            let mut r = agent.get(url);
            for (k, v) in &hs {
                r = r.header(k, v);
            }
            r.call()
        }
        (_, body) => {
            let mut r = match method {
                "POST" => agent.post(url),
                "PUT" => agent.put(url),
                m => panic!("method {m}"),
            };
            for (k, v) in &hs {
                r = r.header(k, v);
            }
            let (ct, bytes) = body.unwrap_or(("", Vec::new()));
            if !ct.is_empty() {
                r = r.header("Content-Type", ct);
            }
            r.send(&bytes[..])
        }
    };
    let mut res = res.unwrap();
    let status = res.status().as_u16();
    (status, res.body_mut().read_to_string().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_nginx_users_are_signed_in_without_a_token_and_forged_headers_are_refused() {
    let Some(bin) = nginx_or_skip("sso_proxy") else {
        return;
    };
    let config = airlock::Config {
        trusted_header: Some(HEADER.into()),
        trusted_header_secret: Some(SECRET.into()),
        ..test_config()
    };
    let app = TestApp::with_config(config);
    app.user("alice", &["payments"]);
    let put = app
        .call(
            Method::PUT,
            "/v1/documents/pay-1",
            Some(&app.admin),
            Some(
                json!({"title": "Cheque clearing", "text": "Cheques clear in two business days.",
                        "acl": {"users": [], "groups": ["payments"]}}),
            ),
        )
        .await;
    assert!(put.status.is_success(), "{}", put.text);
    let served = app.serve().await;
    let upstream = served.base.trim_start_matches("http://").to_owned();
    let direct = served.base.clone();
    tokio::task::spawn_blocking(move || {
        let nginx = Nginx::start(&bin, &upstream, &[("alice", "alice-pw"), ("bob", "bob-pw")]);
        let via = &nginx.base;
        let alice = Some(("alice", "alice-pw"));

        // Through the proxy: signed in as the proxy's user, no bearer token anywhere.
        let (s, body) = send("GET", &format!("{via}/v1/info"), alice, &[], None);
        assert_eq!(s, 200, "{body}");
        let info: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(info["user"], "alice");
        // Writes (POST) signed in by the proxy need the CSRF token /v1/info gives the user.
        let csrf = info["csrf_token"].as_str().unwrap().to_owned();
        // A user header the client forges is replaced by nginx's.
        let (s, body) = send(
            "GET",
            &format!("{via}/v1/info"),
            alice,
            &[(HEADER, "admin"), ("X-Airlock-Proxy-Secret", "guess")],
            None,
        );
        assert_eq!(s, 200, "{body}");
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["user"],
            "alice"
        );
        // Alice's grants decide what she retrieves; her role (none) what she may call.
        let (s, body) = send(
            "POST",
            &format!("{via}/v1/retrieve"),
            alice,
            &[("X-Airlock-CSRF", &csrf)],
            Some(json!({"query": "when do cheques clear", "top_k": 3})),
        );
        assert_eq!(s, 200, "{body}");
        assert!(body.contains("pay-1"), "{body}");
        let (s, _) = send("GET", &format!("{via}/metrics"), alice, &[], None);
        assert_eq!(s, 403);
        // The page tells the UI to use the proxy's sign-in.
        let (s, page) = send("GET", &format!("{via}/"), alice, &[], None);
        assert_eq!(s, 200);
        assert!(page.contains(airlock::routes::ui::SSO_META), "{page}");
        // Authenticated at the proxy but unknown to Airlock: refused.
        let (s, _) = send(
            "GET",
            &format!("{via}/v1/info"),
            Some(("bob", "bob-pw")),
            &[],
            None,
        );
        assert_eq!(s, 401);
        // Not authenticated at the proxy: nginx refuses before the daemon.
        let (s, _) = send("GET", &format!("{via}/v1/info"), None, &[], None);
        assert_eq!(s, 401);

        // Straight to the daemon, bypassing the proxy, with a forged user header.
        for (what, hs) in [
            ("no secret", vec![(HEADER, "alice")]),
            (
                "a wrong secret",
                vec![
                    (HEADER, "alice"),
                    ("X-Airlock-Proxy-Secret", "proxy-secret-0123456789abcdeX"),
                ],
            ),
            (
                "an empty secret",
                vec![(HEADER, "alice"), ("X-Airlock-Proxy-Secret", "")],
            ),
        ] {
            let (s, body) = send("GET", &format!("{direct}/v1/info"), None, &hs, None);
            assert_eq!(s, 401, "{what}: {body}");
            let (s, body) = send(
                "POST",
                &format!("{direct}/v1/retrieve"),
                None,
                &hs,
                Some(json!({"query": "cheques", "top_k": 3})),
            );
            assert_eq!(s, 401, "{what}: {body}");
        }
        // The secret is what makes nginx trusted (so the refusals above are the secret's).
        let (s, body) = send(
            "POST",
            &format!("{direct}/v1/retrieve"),
            None,
            &[
                (HEADER, "alice"),
                ("X-Airlock-Proxy-Secret", SECRET),
                ("X-Airlock-CSRF", &csrf),
            ],
            Some(json!({"query": "cheques", "top_k": 3})),
        );
        assert_eq!(s, 200, "{body}");
        let (s, body) = send(
            "GET",
            &format!("{direct}/v1/info"),
            None,
            &[(HEADER, "alice"), ("X-Airlock-Proxy-Secret", SECRET)],
            None,
        );
        assert_eq!(s, 200, "{body}");
        drop(nginx);
    })
    .await
    .unwrap();
    served.shutdown().await;
}

/// Issue 42 H3: a signed-in operator's browser, tricked by a page on another site, sent
/// `POST /v1/reconcile`, `/v1/purge`, `/v1/acl/sync`, a token rotation and a new conversation
/// through the SSO proxy, and each ran. Now a browser's state-changing request from another
/// site is refused (`Sec-Fetch-Site`, `Origin`), one signed in by the proxy needs the user's
/// CSRF token (from `GET /v1/info`), and JSON routes take only JSON bodies (415); nothing
/// changes on a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_nginx_cross_site_and_tokenless_browser_writes_are_refused() {
    let Some(bin) = nginx_or_skip("sso_proxy csrf") else {
        return;
    };
    let config = airlock::Config {
        trusted_header: Some(HEADER.into()),
        trusted_header_secret: Some(SECRET.into()),
        ..test_config()
    };
    let app = TestApp::with_config(config);
    app.add_user(
        "alice",
        &["payments"],
        vec![airlock_acl::Role::Admin, airlock_acl::Role::Operator],
    );
    app.user("carol", &["payments"]);
    let bob = app.user("bob", &[]);
    let put = app
        .call(
            Method::PUT,
            "/v1/documents/pay-1",
            Some(&app.admin),
            Some(
                json!({"title": "Cheque clearing", "text": "Cheques clear in two business days.",
                        "acl": {"users": [], "groups": ["payments"]}}),
            ),
        )
        .await;
    assert!(put.status.is_success(), "{}", put.text);
    let served = app.serve().await;
    let upstream = served.base.trim_start_matches("http://").to_owned();
    let direct = served.base.clone();
    tokio::task::spawn_blocking(move || {
        let nginx = Nginx::start(
            &bin,
            &upstream,
            &[("alice", "alice-pw"), ("carol", "carol-pw")],
        );
        let via = nginx.base.clone();
        let alice = Some(("alice", "alice-pw"));
        let problem = |(s, body): (u16, String)| -> (u16, String) {
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let slug = v["type"]
                .as_str()
                .unwrap_or("")
                .trim_start_matches("https://airlock.local/problems/")
                .to_owned();
            (s, slug)
        };
        let evil = [
            ("Origin", "http://evil.example"),
            ("Sec-Fetch-Site", "cross-site"),
            ("Sec-Fetch-Mode", "no-cors"),
        ];
        // An older browser (or plain HTTP to a host it does not trust) sends Origin only.
        let evil_origin_only = [("Origin", "http://evil.example")];
        let text = |s: &str| Some(("text/plain", s.as_bytes().to_vec()));
        let attacks: Vec<(&str, String, Option<Body>)> = vec![
            (
                "reconcile everything away",
                format!("{via}/v1/reconcile?allow_empty=true"),
                text(r#"{"source_ids": []}"#),
            ),
            ("purge", format!("{via}/v1/purge"), text("{}")),
            (
                "IAM sync granting carol HR",
                format!("{via}/v1/acl/sync"),
                text(
                    "{\"user\": \"carol\", \"groups\": [\"hr\"]}\n\
                     {\"doc\": \"pay-1\", \"users\": [\"carol\"], \"groups\": []}\n",
                ),
            ),
            (
                "rotate bob's token",
                format!("{via}/v1/acl/users/bob/token"),
                None,
            ),
            (
                "create a conversation",
                format!("{via}/v1/conversations"),
                text("{}"),
            ),
        ];
        for (what, url, body) in &attacks {
            for headers in [&evil[..], &evil_origin_only[..]] {
                // A form's `text/plain`, and a `fetch` of a Blob without a type (no
                // Content-Type at all), which is how the red team's page sent its JSON.
                for ct in ["", "text/plain"] {
                    let body = body.clone().map(|(_, b)| (ct, b));
                    let r = problem(send_raw("POST", url, alice, headers, body));
                    assert_eq!(
                        r,
                        (403, "cross-site".into()),
                        "{what} ({ct:?}) with {headers:?}"
                    );
                }
            }
            // A same-site page (another host of the bank) is refused too.
            let r = problem(send_raw(
                "POST",
                url,
                alice,
                &[
                    ("Origin", "https://wiki.bank.internal"),
                    ("Sec-Fetch-Site", "same-site"),
                ],
                body.clone(),
            ));
            assert_eq!(r, (403, "cross-site".into()), "{what} same-site");
        }

        // The page's own origin, but without the CSRF token: refused.
        let same_origin = [("Origin", via.as_str()), ("Sec-Fetch-Site", "same-origin")];
        let r = problem(send_raw(
            "POST",
            &format!("{via}/v1/acl/users/bob/token"),
            alice,
            &same_origin,
            None,
        ));
        assert_eq!(r, (403, "csrf-failed".into()));
        let r = problem(send(
            "POST",
            &format!("{via}/v1/conversations"),
            alice,
            &same_origin,
            Some(json!({})),
        ));
        assert_eq!(r, (403, "csrf-failed".into()));

        // The CSRF token is the user's: carol's does not sign alice's writes.
        let token_of = |who: (&str, &str)| {
            let (s, body) = send("GET", &format!("{via}/v1/info"), Some(who), &[], None);
            assert_eq!(s, 200, "{body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            v["csrf_token"].as_str().unwrap().to_owned()
        };
        let csrf = token_of(("alice", "alice-pw"));
        let carols = token_of(("carol", "carol-pw"));
        assert_ne!(csrf, carols);
        let with = |t: &str| {
            vec![
                ("Origin".to_owned(), via.clone()),
                ("Sec-Fetch-Site".to_owned(), "same-origin".to_owned()),
                ("X-Airlock-CSRF".to_owned(), t.to_owned()),
            ]
        };
        let hs = with(&carols);
        let hs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let r = problem(send(
            "POST",
            &format!("{via}/v1/conversations"),
            alice,
            &hs,
            Some(json!({})),
        ));
        assert_eq!(r, (403, "csrf-failed".into()));

        // With alice's token but a body a form can send: 415, nothing read.
        let hs = with(&csrf);
        let hs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        for (url, body) in [
            (
                format!("{via}/v1/reconcile?allow_empty=true"),
                text(r#"{"source_ids": []}"#),
            ),
            (
                format!("{via}/v1/conversations"),
                Some(("", b"{}".to_vec())),
            ),
            (
                format!("{via}/v1/acl/sync"),
                Some((
                    "application/x-www-form-urlencoded",
                    b"{\"user\": \"carol\", \"groups\": [\"hr\"]}\n".to_vec(),
                )),
            ),
        ] {
            let r = problem(send_raw("POST", &url, alice, &hs, body));
            assert_eq!(r, (415, "unsupported-media-type".into()), "{url}");
        }

        // Nothing changed: pay-1 is live and carol still reads it (the sync did not run), bob's
        // token was not rotated, alice holds no conversation.
        let (s, body) = send(
            "POST",
            &format!("{via}/v1/retrieve"),
            Some(("carol", "carol-pw")),
            &[("X-Airlock-CSRF", &carols)],
            Some(json!({"query": "when do cheques clear", "top_k": 3})),
        );
        assert_eq!(s, 200, "{body}");
        assert!(body.contains("pay-1"), "{body}");
        let (s, body) = send(
            "GET",
            &format!("{direct}/v1/info"),
            None,
            &[("Authorization", &format!("Bearer {bob}"))],
            None,
        );
        assert_eq!(s, 200, "bob's token still works: {body}");
        let (s, body) = send("GET", &format!("{via}/v1/conversations"), alice, &[], None);
        assert_eq!(s, 200, "{body}");
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["data"],
            json!([]),
            "{body}"
        );

        // The page's own request with its token and JSON: served.
        let (s, body) = send(
            "POST",
            &format!("{via}/v1/conversations"),
            alice,
            &hs,
            Some(json!({"title": "mine"})),
        );
        assert_eq!(s, 201, "{body}");
        drop(nginx);
    })
    .await
    .unwrap();
    served.shutdown().await;
}
