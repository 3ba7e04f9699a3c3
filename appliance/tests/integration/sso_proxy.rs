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

/// One request; `basic` as `(user, password)`; extra headers.
fn send(
    method: &str,
    url: &str,
    basic: Option<(&str, &str)>,
    headers: &[(&str, &str)],
    body: Option<Value>,
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
    let res = if method == "GET" {
        let mut r = agent.get(url);
        for (k, v) in &hs {
            r = r.header(k, v);
        }
        r.call()
    } else {
        let mut r = agent.post(url);
        for (k, v) in &hs {
            r = r.header(k, v);
        }
        r.send_json(body.unwrap_or(json!({})))
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
            &[],
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
