//! OIDC sign-in against a real OpenID Provider that is not ours: panva's `oidc-provider`
//! (OpenID Certified, npm; `tests/oidc/provider.mjs` configures it), started on loopback by each
//! test and stopped after. The test drives the provider's own login form with an HTTP client,
//! then hands the provider's redirect to Airlock's callback: the code flow with PKCE, a session
//! that reads exactly what the ID token's groups allow, and every refusal (state, nonce,
//! audience, expiry, HS256, a key the JWKS does not hold, the provider down) changing nothing.
//!
//! Skipped with a loud message when node or the provider package is missing, unless
//! `AIRLOCK_REQUIRE_OIDC` is set (.ci/run sets it and installs `tests/oidc`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use airlock::Config;
use airlock_identity::oidc::{Oidc, OidcConfig};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};

use crate::support::{Resp, TestApp, test_config};

const BIN: &str = env!("CARGO_BIN_EXE_airlock");
const SECRET: &str = "airlock-client-secret-0123456789";
const OTHER_SECRET: &str = "other-app-client-secret-0123456789";

fn provider_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/oidc")
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether the provider can run here; otherwise a loud skip (or a failure under
/// `AIRLOCK_REQUIRE_OIDC`).
pub(crate) fn provider_available(test: &str) -> bool {
    let node = Command::new("node").arg("--version").output().is_ok();
    let pkg = provider_dir().join("node_modules/oidc-provider/package.json");
    if node && pkg.exists() {
        return true;
    }
    let why = format!(
        "{test}: the OIDC provider cannot run (node: {node}, {} present: {}); \
         run `npm ci --prefix tests/oidc`",
        pkg.display(),
        pkg.exists()
    );
    if std::env::var_os("AIRLOCK_REQUIRE_OIDC").is_some() {
        panic!("AIRLOCK_REQUIRE_OIDC is set but {why}");
    }
    eprintln!("\n*** SKIPPED: {why} ***\n");
    false
}

/// One client registration at the provider.
#[derive(Clone)]
pub(crate) struct Client {
    pub id: &'static str,
    pub secret: &'static str,
    pub redirect: String,
    pub alg: &'static str,
}

impl Client {
    pub(crate) fn new(id: &'static str, secret: &'static str, redirect: &str) -> Self {
        Client {
            id,
            secret,
            redirect: redirect.to_string(),
            alg: "RS256",
        }
    }
}

/// The provider process (killed on drop).
pub(crate) struct Provider {
    pub port: u16,
    pub issuer: String,
    clients: Vec<Client>,
    child: Child,
    dir: tempfile::TempDir,
}

/// Runs `node provider.mjs` with its config in `dir` and waits until it listens.
fn spawn(
    dir: &Path,
    issuer: &str,
    port: u16,
    kids: &[&str],
    clients: &[Client],
    clock_offset_secs: i64,
) -> Child {
    let cfg = json!({
        "clock_offset_secs": clock_offset_secs,
        "issuer": issuer,
        "port": port,
        "kids": kids,
        "clients": clients.iter().map(|c| json!({
            "client_id": c.id, "client_secret": c.secret, "redirect_uris": [c.redirect],
            "id_token_signed_response_alg": c.alg,
        })).collect::<Vec<_>>(),
        "accounts": {
            "alice": {"preferred_username": "alice", "name": "Alice", "groups": ["analysts"]},
            "bob": {"preferred_username": "bob", "name": "Bob", "groups": ["risk", "staff"]},
            // The id of the test app's local admin (`sub` is the account id).
            "admin": {"preferred_username": "admin", "name": "Mallory", "groups": ["risk"]},
        },
    });
    let path = dir.join("provider.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let mut child = Command::new("node")
        .arg(provider_dir().join("provider.mjs"))
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node starts");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.starts_with("listening") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        panic!("the OIDC provider did not start");
    }
    child
}

impl Provider {
    /// Starts the provider on `port` (0: a free one) signing with fresh RSA keys named `kids`.
    pub(crate) fn start(port: u16, kids: &[&str], clients: &[Client]) -> Self {
        Self::start_with_clock(port, kids, clients, 0)
    }

    /// [`Provider::start`] with the provider's clock `offset` seconds off.
    pub(crate) fn start_with_clock(
        port: u16,
        kids: &[&str],
        clients: &[Client],
        offset: i64,
    ) -> Self {
        let port = if port == 0 { free_port() } else { port };
        let issuer = format!("http://127.0.0.1:{port}");
        let dir = tempfile::tempdir().unwrap();
        let child = spawn(dir.path(), &issuer, port, kids, clients, offset);
        Provider {
            port,
            issuer,
            clients: clients.to_vec(),
            child,
            dir,
        }
    }

    /// Stops it and starts it again on the same port and issuer with new keys `kids` (fresh
    /// key material even for a kid used before); sessions and codes at the provider are gone.
    pub(crate) fn restart(&mut self, kids: &[&str]) {
        self.stop();
        self.child = spawn(
            self.dir.path(),
            &self.issuer,
            self.port,
            kids,
            &self.clients,
            0,
        );
    }

    pub(crate) fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The `[oidc]` table for `client`, as an operator writes it.
    pub(crate) fn toml(&self, client: &Client, secret_file: &Path) -> String {
        format!(
            "[oidc]\nissuer = \"{}\"\nclient_id = \"{}\"\nclient_secret_file = \"{}\"\n\
             redirect_url = \"{}\"\nuser_claim = \"preferred_username\"\n\
             groups_claim = \"groups\"\ndisplay_name = \"Bank SSO\"\n\
             scopes = [\"openid\", \"profile\", \"groups\"]\n",
            self.issuer,
            client.id,
            secret_file.display(),
            client.redirect
        )
    }

    /// The secret file of `client` (mode 0600), in the provider's directory.
    pub(crate) fn secret_file(&self, client: &Client) -> PathBuf {
        let secret = self.dir.path().join(format!("{}.secret", client.id));
        std::fs::write(&secret, format!("{}\n", client.secret)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        secret
    }

    pub(crate) fn config(&self, client: &Client) -> OidcConfig {
        #[derive(serde::Deserialize)]
        struct T {
            oidc: OidcConfig,
        }
        let toml = self.toml(client, &self.secret_file(client));
        toml::from_str::<T>(&toml).unwrap().oidc
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A user agent at the provider: a cookie jar, no automatic redirects.
pub(crate) struct Browser {
    agent: ureq::Agent,
    jar: BTreeMap<String, String>,
}

impl Browser {
    pub(crate) fn new() -> Self {
        Browser {
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(0)
                .timeout_global(Some(Duration::from_secs(60)))
                .build()
                .into(),
            jar: BTreeMap::new(),
        }
    }

    fn keep(&mut self, r: &ureq::http::Response<ureq::Body>) {
        for c in r.headers().get_all("set-cookie") {
            let c = c.to_str().unwrap();
            let kv = c.split(';').next().unwrap();
            if let Some((k, v)) = kv.split_once('=') {
                self.jar.insert(k.trim().into(), v.trim().into());
            }
        }
    }

    fn cookies(&self) -> String {
        self.jar
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// One request; `(status, Location, body)`.
    fn go(&mut self, method: &str, url: &str, form: Option<&str>) -> (u16, Option<String>, String) {
        let cookies = self.cookies();
        let mut r = match form {
            None => self.agent.get(url).header("cookie", &cookies).call(),
            Some(f) => self
                .agent
                .post(url)
                .header("cookie", &cookies)
                .content_type("application/x-www-form-urlencoded")
                .send(f),
        }
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        self.keep(&r);
        let loc = r
            .headers()
            .get("location")
            .map(|l| l.to_str().unwrap().to_string());
        let body = r.body_mut().read_to_string().unwrap_or_default();
        (r.status().as_u16(), loc, body)
    }

    /// Follows the authorization URL through the provider's login form as `user`, up to the
    /// redirect to the client's callback; returns that callback URL.
    pub(crate) fn sign_in(&mut self, authorize: &str, user: &str, redirect_prefix: &str) -> String {
        let base = authorize.split("/auth").next().unwrap().to_string();
        let abs = |l: &str| {
            if l.starts_with('/') {
                format!("{base}{l}")
            } else {
                l.to_string()
            }
        };
        let mut url = authorize.to_string();
        for _ in 0..10 {
            let (status, loc, body) = self.go("GET", &url, None);
            if let Some(l) = loc {
                let l = abs(&l);
                if l.starts_with(redirect_prefix) {
                    return l;
                }
                url = l;
                continue;
            }
            assert_eq!(status, 200, "{url}: {body}");
            // The provider's login form.
            assert!(
                body.contains("name=\"login\""),
                "no login form at {url}: {body}"
            );
            let (_, loc, body) = self.go(
                "POST",
                &url,
                Some(&format!("prompt=login&login={user}&password=any")),
            );
            url = abs(&loc.unwrap_or_else(|| panic!("login not accepted: {body}")));
        }
        panic!("no redirect to the client after 10 steps");
    }
}

/// The value of `name` in a URL's query.
pub(crate) fn query_param(url: &str, name: &str) -> Option<String> {
    let q = url.split_once('?')?.1;
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// `url` with query parameter `name` set to `value`.
fn with_param(url: &str, name: &str, value: &str) -> String {
    let (base, q) = url.split_once('?').unwrap();
    let q: Vec<String> = q
        .split('&')
        .map(|kv| {
            if kv.split_once('=').is_some_and(|(k, _)| k == name) {
                format!("{name}={value}")
            } else {
                kv.to_string()
            }
        })
        .collect();
    format!("{base}?{}", q.join("&"))
}

const CALLBACK: &str = "http://127.0.0.1:8099/v1/auth/oidc/callback";

async fn app_for(p: &Provider, client: &Client) -> TestApp {
    let cfg = p.config(client);
    let t = TestApp::with_config(Config {
        oidc: Some(cfg.clone()),
        ..test_config()
    });
    t.state
        .set_oidc(Arc::new(Oidc::discover(cfg).await.expect("discovery")));
    t
}

/// `GET /v1/auth/oidc/login`: the authorization URL and the pre-login cookie.
async fn begin(t: &TestApp) -> (String, String) {
    let r = t.call(Method::GET, "/v1/auth/oidc/login", None, None).await;
    assert_eq!(r.status, StatusCode::FOUND, "{}", r.text);
    let set = r.headers.get(header::SET_COOKIE).unwrap().to_str().unwrap();
    assert!(
        set.starts_with("airlock_oidc=")
            && set.contains("; HttpOnly; Secure; SameSite=Lax; Path=/v1/auth/oidc; Max-Age=600"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_string();
    let loc = r.headers.get(header::LOCATION).unwrap().to_str().unwrap();
    (loc.to_string(), cookie)
}

/// Airlock's callback with the provider's redirect URL and a pre-login cookie.
async fn callback(t: &TestApp, redirect: &str, cookie: Option<&str>) -> Resp {
    let path = &redirect[redirect.find("/v1/").unwrap()..];
    let mut b = Request::get(path);
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, c);
    }
    t.send(b.body(Body::empty()).unwrap()).await
}

fn sessions(t: &TestApp) -> i64 {
    rusqlite::Connection::open(t._dir.path().join("airlock.db"))
        .unwrap()
        .query_row("SELECT count(*) FROM acl_sessions", [], |r| r.get(0))
        .unwrap()
}

fn refused(r: &Resp, why: &str) {
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    assert_eq!(
        r.json["type"],
        "https://airlock.local/problems/oidc-refused"
    );
    let detail = r.json["detail"].as_str().unwrap();
    assert!(detail.contains(why), "expected {why:?} in {detail:?}");
    assert!(
        r.headers
            .get(header::SET_COOKIE)
            .is_some_and(|c| c.to_str().unwrap().starts_with("airlock_oidc=;"))
    );
}

/// A full sign-in as `user`: Airlock's login, the provider's form, Airlock's callback.
async fn sign_in(t: &TestApp, user: &str) -> Resp {
    let (authorize, cookie) = begin(t).await;
    let redirect = Browser::new().sign_in(&authorize, user, CALLBACK);
    callback(t, &redirect, Some(&cookie)).await
}

fn session_of(r: &Resp) -> (String, String) {
    assert_eq!(r.status, StatusCode::FOUND, "{}", r.text);
    let loc = r.headers.get(header::LOCATION).unwrap().to_str().unwrap();
    let csrf = loc.strip_prefix("/#csrf_token=").expect(loc).to_string();
    let set: Vec<&str> = r
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    let s = set
        .iter()
        .find(|c| c.starts_with("airlock_session=als_"))
        .unwrap_or_else(|| panic!("{set:?}"));
    assert!(
        s.ends_with("; HttpOnly; Secure; SameSite=Strict; Path=/"),
        "{s}"
    );
    let secret = s.split(';').next().unwrap()["airlock_session=".len()..].to_string();
    (secret, csrf)
}

async fn with_session(
    t: &TestApp,
    method: Method,
    uri: &str,
    session: &str,
    csrf: Option<&str>,
    body: Option<Value>,
) -> Resp {
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::COOKIE, format!("airlock_session={session}"));
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

async fn put_doc(t: &TestApp, id: &str, text: &str, group: &str) {
    let r = t
        .call(
            Method::PUT,
            &format!("/v1/documents/{id}"),
            Some(&t.admin),
            Some(json!({"title": id, "text": text, "acl": {"users": [], "groups": [group]}})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_code_flow_signs_in_and_reads_only_what_the_groups_allow() {
    if !provider_available("oidc_code_flow_signs_in_and_reads_only_what_the_groups_allow") {
        return;
    }
    let client = Client::new("airlock", SECRET, CALLBACK);
    let p = Provider::start(0, &["k1"], std::slice::from_ref(&client));
    let t = app_for(&p, &client).await;
    put_doc(
        &t,
        "liquidity",
        "The liquidity buffer must stay above fifteen percent.",
        "analysts",
    )
    .await;
    put_doc(
        &t,
        "risk-limits",
        "The liquidity risk limit for trading desks is two percent.",
        "risk",
    )
    .await;

    // The redirect carries state, nonce and the S256 challenge; never the verifier.
    let (authorize, cookie) = begin(&t).await;
    assert!(
        authorize.starts_with(&format!("{}/auth?", p.issuer)),
        "{authorize}"
    );
    for (k, v) in [
        ("response_type", Some("code")),
        ("client_id", Some("airlock")),
        ("code_challenge_method", Some("S256")),
        ("scope", Some("openid profile groups")),
        ("redirect_uri", Some(CALLBACK)),
    ] {
        assert_eq!(query_param(&authorize, k).as_deref(), v, "{k}");
    }
    for k in ["state", "nonce", "code_challenge"] {
        assert_eq!(query_param(&authorize, k).unwrap().len(), 43, "{k}");
    }
    assert!(query_param(&authorize, "code_verifier").is_none());
    let redirect = Browser::new().sign_in(&authorize, "alice", CALLBACK);
    assert_eq!(sessions(&t), 0);
    let r = callback(&t, &redirect, Some(&cookie)).await;
    let (session, csrf) = session_of(&r);
    assert_eq!(r.headers.get(header::CACHE_CONTROL).unwrap(), "no-store");
    assert_eq!(sessions(&t), 1);
    // The unknown user exists now, with the ID token's groups as memberships (as a directory
    // sign-in does).
    let alice = t.state.services().unwrap().acl.user("alice").unwrap();
    assert_eq!(alice.groups, vec!["analysts".to_string()]);

    // The session reads what the groups allow, and only that.
    let q = json!({"query": "liquidity buffer risk limit percent", "top_k": 10});
    let r = with_session(
        &t,
        Method::POST,
        "/v1/retrieve",
        &session,
        Some(&csrf),
        Some(q.clone()),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let docs: Vec<&str> = r.json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["doc_id"].as_str().unwrap())
        .collect();
    assert!(docs.contains(&"liquidity"), "{docs:?}");
    assert!(!docs.contains(&"risk-limits"), "{docs:?}");
    // The same CSRF defence as a directory session.
    let r = with_session(
        &t,
        Method::POST,
        "/v1/retrieve",
        &session,
        None,
        Some(q.clone()),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);

    // bob (risk, staff) reads the other document only.
    let (bob, bob_csrf) = session_of(&sign_in(&t, "bob").await);
    let r = with_session(
        &t,
        Method::POST,
        "/v1/retrieve",
        &bob,
        Some(&bob_csrf),
        Some(q),
    )
    .await;
    let docs: Vec<&str> = r.json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["doc_id"].as_str().unwrap())
        .collect();
    assert_eq!(docs.first(), Some(&"risk-limits"), "{}", r.text);
    assert!(!docs.contains(&"liquidity"), "{docs:?}");

    // The callback cannot be replayed: the pre-login entry is used up.
    let before = sessions(&t);
    refused(
        &callback(&t, &redirect, Some(&cookie)).await,
        "no sign-in in progress",
    );
    assert_eq!(sessions(&t), before);

    // Logout ends the OIDC session like any other.
    let r = with_session(
        &t,
        Method::POST,
        "/v1/auth/logout",
        &session,
        Some(&csrf),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let r = with_session(&t, Method::GET, "/v1/conversations", &session, None, None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_refusals_change_nothing() {
    if !provider_available("oidc_refusals_change_nothing") {
        return;
    }
    let airlock = Client::new("airlock", SECRET, CALLBACK);
    let other = Client::new("other-app", OTHER_SECRET, "http://127.0.0.1:8098/cb");
    let hs = Client {
        alg: "HS256",
        ..Client::new("airlock-hs", "airlock-hs-secret-0123456789abcdef", CALLBACK)
    };
    let clients = [airlock.clone(), other.clone(), hs.clone()];
    let p = Provider::start(0, &["k1"], &clients);
    let t = app_for(&p, &airlock).await;
    let nobody = |t: &TestApp| {
        let acl = &t.state.services().unwrap().acl;
        assert!(acl.user("alice").is_none() && acl.user("bob").is_none());
        assert_eq!(sessions(t), 0);
    };

    // No pre-login cookie (a callback the browser did not start here).
    let (authorize, _) = begin(&t).await;
    let redirect = Browser::new().sign_in(&authorize, "alice", CALLBACK);
    refused(
        &callback(&t, &redirect, None).await,
        "no sign-in in progress",
    );
    refused(
        &callback(&t, &redirect, Some("airlock_oidc=forged")).await,
        "no sign-in in progress",
    );

    // State mismatch: B's redirect delivered with A's cookie (login CSRF / a swapped
    // response). A's entry is used up by the attempt.
    let (_, cookie_a) = begin(&t).await;
    let (authorize_b, cookie_b) = begin(&t).await;
    let redirect_b = Browser::new().sign_in(&authorize_b, "alice", CALLBACK);
    refused(
        &callback(&t, &redirect_b, Some(&cookie_a)).await,
        "state does not match",
    );
    refused(
        &callback(&t, &redirect_b, Some(&cookie_a)).await,
        "no sign-in in progress",
    );
    nobody(&t);
    // B itself still completes (and is then used up).
    let r = callback(&t, &redirect_b, Some(&cookie_b)).await;
    session_of(&r);
    assert_eq!(sessions(&t), 1);
    t.state
        .services()
        .unwrap()
        .acl
        .sync_directory("test", &[("admin".to_string(), vec![])])
        .unwrap();
    nobody(&t);

    // Wrong nonce: the authorization request altered on its way to the provider (state and
    // PKCE challenge intact, so the code exchange succeeds and only the nonce check refuses).
    let (authorize, cookie) = begin(&t).await;
    let tampered = with_param(
        &authorize,
        "nonce",
        "an-attackers-nonce-aaaaaaaaaaaaaaaaaaaaaaa",
    );
    let redirect = Browser::new().sign_in(&tampered, "alice", CALLBACK);
    refused(
        &callback(&t, &redirect, Some(&cookie)).await,
        "nonce does not match",
    );
    nobody(&t);

    // A code for another PKCE challenge (a code injected into this browser's sign-in).
    let (authorize, cookie) = begin(&t).await;
    let (other_authorize, _) = begin(&t).await;
    let challenge = query_param(&other_authorize, "code_challenge").unwrap();
    let injected = with_param(&authorize, "code_challenge", &challenge);
    let redirect = Browser::new().sign_in(&injected, "alice", CALLBACK);
    refused(
        &callback(&t, &redirect, Some(&cookie)).await,
        "refused the code (invalid_grant)",
    );
    nobody(&t);

    // The provider's own refusal (the user cancels on its page).
    let (authorize, cookie) = begin(&t).await;
    let mut b = Browser::new();
    let (_, loc, _) = b.go("GET", &authorize, None);
    let mut url = format!("{}{}/abort", p.issuer, loc.unwrap());
    let redirect = loop {
        let (_, loc, body) = b.go("GET", &url, None);
        let l = loc.unwrap_or_else(|| panic!("{url}: {body}"));
        let l = if l.starts_with('/') {
            format!("{}{l}", p.issuer)
        } else {
            l
        };
        if l.starts_with(CALLBACK) {
            break l;
        }
        url = l;
    };
    assert_eq!(
        query_param(&redirect, "error").as_deref(),
        Some("access_denied")
    );
    refused(
        &callback(&t, &redirect, Some(&cookie)).await,
        "refused the sign-in (access_denied)",
    );

    // Wrong audience: a genuine ID token the provider issued to another client (other-app,
    // through its own code flow) is refused by Airlock's verification.
    let verifier = "other-app-verifier-0123456789-0123456789-abcdef";
    let challenge = {
        use base64::Engine;
        use sha2::Digest;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(sha2::Sha256::digest(verifier.as_bytes()))
    };
    let other_authorize = format!(
        "{}/auth?response_type=code&client_id=other-app&redirect_uri={}&scope=openid%20profile%20groups&state=s&nonce=other-nonce&code_challenge={challenge}&code_challenge_method=S256",
        p.issuer,
        airlock_platform::egress::whole::encode(&other.redirect)
    );
    let redirect = Browser::new().sign_in(&other_authorize, "alice", &other.redirect);
    let code = query_param(&redirect, "code").unwrap();
    let mut token = ureq::post(format!("{}/token", p.issuer))
        .header(
            "authorization",
            format!("Basic {}", {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD
                    .encode(format!("other-app:{OTHER_SECRET}"))
            }),
        )
        .send_form([
            ("grant_type", "authorization_code"),
            ("code", code.as_str()),
            ("redirect_uri", other.redirect.as_str()),
            ("code_verifier", verifier),
        ])
        .unwrap();
    let token: Value = token.body_mut().read_json().unwrap();
    let id_token = token["id_token"].as_str().unwrap();
    let err = t
        .state
        .oidc()
        .unwrap()
        .verify(id_token, "other-nonce")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("aud does not contain client_id"),
        "{err}"
    );
    nobody(&t);

    // An ID token signed with HS256 (the provider's per-client setting, keyed by the client
    // secret): refused, whatever the MAC.
    let t_hs = app_for(&p, &hs).await;
    refused(
        &sign_in(&t_hs, "alice").await,
        "symmetric ID-token signatures",
    );
    nobody(&t_hs);

    // An expired ID token: a provider whose clock is two hours behind issues tokens that
    // expired (5-minute lifetime) before they reach Airlock.
    let late = Provider::start_with_clock(0, &["k1"], std::slice::from_ref(&airlock), -7200);
    let t_exp = app_for(&late, &airlock).await;
    refused(&sign_in(&t_exp, "alice").await, "expired");
    nobody(&t_exp);
    drop(late);

    // The provider down at the code exchange: 503, nothing changed.
    let (authorize, cookie) = begin(&t).await;
    let redirect = Browser::new().sign_in(&authorize, "alice", CALLBACK);
    let mut p = p;
    p.stop();
    let r = callback(&t, &redirect, Some(&cookie)).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert_eq!(
        r.json["type"],
        "https://airlock.local/problems/idp-unavailable"
    );
    assert_eq!(
        r.json["detail"],
        "the identity provider is unavailable; retry later"
    );
    nobody(&t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_keys_rotate_and_a_key_the_jwks_did_not_publish_is_refused() {
    if !provider_available("oidc_keys_rotate_and_a_key_the_jwks_did_not_publish_is_refused") {
        return;
    }
    let client = Client::new("airlock", SECRET, CALLBACK);
    let p = Provider::start(0, &["k1"], std::slice::from_ref(&client));
    let t = app_for(&p, &client).await;
    session_of(&sign_in(&t, "alice").await);

    // The provider restarts with another key under the same kid: the token's signature does
    // not verify against the published key Airlock holds (no re-fetch for a known kid).
    let mut p = p;
    p.restart(&["k1"]);
    refused(&sign_in(&t, "bob").await, "signature does not verify");
    assert!(t.state.services().unwrap().acl.user("bob").is_none());

    // A rotation to a new kid: one re-fetch of the JWKS, and sign-in works.
    p.restart(&["k2"]);
    session_of(&sign_in(&t, "bob").await);

    // Another unknown kid right after: the re-fetch is rate-limited, the token refused.
    p.restart(&["k3"]);
    refused(&sign_in(&t, "alice").await, "unknown kid");
    assert_eq!(sessions(&t), 2);
}

/// `airlock serve` refuses a bad `[oidc]` and an unreachable issuer at start, with the reason.
#[test]
fn serve_refuses_an_http_issuer_off_loopback_and_an_unreachable_one() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "x\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = free_port();
    for (issuer, want) in [
        (
            "http://10.1.2.3:8080".to_string(),
            "invalid setting `oidc.issuer`: the issuer 10.1.2.3:8080 is http:// on a non-loopback host: use https://".to_string(),
        ),
        (
            format!("http://127.0.0.1:{port}"),
            format!("refusing to start: OIDC discovery at http://127.0.0.1:{port} failed"),
        ),
    ] {
        let toml = dir.path().join("a.toml");
        std::fs::write(
            &toml,
            format!(
                "[oidc]\nissuer = \"{issuer}\"\nclient_id = \"airlock\"\n\
                 client_secret_file = \"{}\"\n\
                 redirect_url = \"http://127.0.0.1:8080/v1/auth/oidc/callback\"\n",
                secret.display()
            ),
        )
        .unwrap();
        let out = Command::new(BIN)
            .args(["serve", "--data"])
            .arg(dir.path().join("data"))
            .arg("--config")
            .arg(&toml)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains(&want), "{want}\n{stderr}");
    }
}

/// The real binary under strace (`airlock demo` execs `airlock serve`, lockdown required) with
/// `[oidc]`: a full sign-in and a retrieval with the session; every IPv4/IPv6 connect goes to
/// the provider's host:port (discovery, JWKS, the code exchange), nothing else is contacted.
#[test]
fn the_daemon_connects_only_to_the_oidc_provider() {
    use crate::sandbox::{STRACE, inet_connects, stop_traced};
    if !Path::new(STRACE).exists() {
        eprintln!("SKIPPED: {STRACE} is not installed (.ci/run must install strace)");
        return;
    }
    if !provider_available("the_daemon_connects_only_to_the_oidc_provider") {
        return;
    }
    let port = free_port();
    let redirect = format!("http://127.0.0.1:{port}/v1/auth/oidc/callback");
    let client = Client::new("airlock", SECRET, &redirect);
    let p = Provider::start(0, &["k1"], std::slice::from_ref(&client));
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    crate::support::small_staging(&staging);
    let data = dir.path().join("data");
    let secret = dir.path().join("client.secret");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let toml_path = dir.path().join("oidc.toml");
    std::fs::write(&toml_path, p.toml(&client, &secret)).unwrap();
    let log = dir.path().join("strace.txt");
    let (mut strace, logs) =
        crate::sandbox::traced_demo_ready(&log, &data, &staging, &toml_path, port);
    let base = format!("http://127.0.0.1:{port}");
    let tokens: Value =
        serde_json::from_slice(&std::fs::read(data.join("demo/tokens.json")).unwrap()).unwrap();
    let admin = tokens["admin"].as_str().unwrap().to_string();
    let (s, body) = crate::sandbox::http(
        "PUT",
        &format!("{base}/v1/documents/doc-1"),
        &admin,
        Some(json!({
            "title": "Liquidity buffer",
            "text": "The liquidity buffer must stay above fifteen percent of deposits.",
            "acl": {"users": [], "groups": ["analysts"]},
        })),
    );
    assert_eq!(s, 201, "{body}");

    // The sign-in, through the daemon's own routes over HTTP.
    let mut daemon = Browser::new();
    let (s, authorize, body) = daemon.go("GET", &format!("{base}/v1/auth/oidc/login"), None);
    assert_eq!(s, 302, "{body}");
    let cb = Browser::new().sign_in(&authorize.unwrap(), "alice", &redirect);
    let (s, loc, body) = daemon.go("GET", &cb, None);
    assert_eq!(s, 302, "{body}");
    let csrf = loc
        .unwrap()
        .strip_prefix("/#csrf_token=")
        .unwrap()
        .to_string();
    let session = daemon.jar.get("airlock_session").unwrap().clone();
    let mut r = ureq::post(format!("{base}/v1/retrieve"))
        .header("cookie", format!("airlock_session={session}"))
        .header("x-airlock-csrf", &csrf)
        .send_json(json!({"query": "liquidity buffer", "top_k": 3}))
        .unwrap();
    let v: Value = r.body_mut().read_json().unwrap();
    assert_eq!(v["results"][0]["doc_id"], "doc-1", "{v}");

    stop_traced(&mut strace);
    let logs = logs.join().unwrap();
    assert!(
        logs.lines()
            .any(|l| l.contains("egress lockdown active") && l.contains(&p.port.to_string())),
        "the daemon must log its lockdown with the provider's port:\n{logs}"
    );
    let trace = std::fs::read_to_string(&log).unwrap();
    let inet = inet_connects(&trace);
    let provider = format!("sin_port=htons({})", p.port);
    // Discovery + JWKS in the set-up and again in the daemon, then the code exchange.
    assert!(
        inet.len() >= 5,
        "expected discovery, JWKS and the exchange:\n{trace}"
    );
    for l in &inet {
        assert!(
            l.contains(&provider) && l.contains("127.0.0.1"),
            "a connect outside the OIDC provider:\n{l}"
        );
    }
    eprintln!("{} connects, all to 127.0.0.1:{}", inet.len(), p.port);
}

/// The `sign_in` audit entries (oldest first).
async fn oidc_sign_ins(t: &TestApp) -> Vec<Value> {
    let r = t
        .call(
            Method::GET,
            "/v1/audit?kind=sign_in&limit=1000",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let mut e = r.json["entries"].as_array().unwrap().clone();
    e.sort_by_key(|e| e["seq"].as_i64());
    e
}

/// Issue 42 M2 (OIDC side): an OIDC account whose id is the local admin's is refused and
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_identities_never_take_a_local_account() {
    if !provider_available("oidc_identities_never_take_a_local_account") {
        return;
    }
    let client = Client::new("airlock", SECRET, CALLBACK);
    let p = Provider::start(0, &["k1"], std::slice::from_ref(&client));
    let t = app_for(&p, &client).await;
    let acl = t.state.services().unwrap().acl.clone();
    let before = acl.user("admin").unwrap();
    assert!(before.local && before.groups.is_empty());

    // The provider's `admin` (sub = admin): refused, no session, the local admin unchanged.
    let r = sign_in(&t, "admin").await;
    r.assert_problem(
        403,
        "forbidden",
        "this identity has the id of a local account: a directory or OIDC sign-in cannot use it",
    );
    assert_eq!(sessions(&t), 0);
    assert_eq!(acl.user("admin").unwrap(), before);
    let e = oidc_sign_ins(&t).await;
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(
        (&e[0]["user_id"], &e[0]["detail"]["outcome"]),
        (&json!("admin"), &json!("local_account"))
    );
    // The admin token still administers; another account still signs in.
    let r = t
        .call(Method::GET, "/v1/audit?limit=1", Some(&t.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    session_of(&sign_in(&t, "bob").await);
    assert_eq!(acl.user("bob").unwrap().groups, ["risk", "staff"]);
}

/// Issue 42 M7: every OIDC callback writes one `sign_in` entry with the fields a directory
/// sign-in has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_sign_ins_are_audited() {
    if !provider_available("oidc_sign_ins_are_audited") {
        return;
    }
    let client = Client::new("airlock", SECRET, CALLBACK);
    let p = Provider::start(0, &["k1"], std::slice::from_ref(&client));
    let t = app_for(&p, &client).await;
    // A success and a refusal (no pre-login cookie).
    session_of(&sign_in(&t, "alice").await);
    let (authorize, _) = begin(&t).await;
    let redirect = Browser::new().sign_in(&authorize, "bob", CALLBACK);
    refused(
        &callback(&t, &redirect, None).await,
        "no sign-in in progress",
    );

    let e = oidc_sign_ins(&t).await;
    let shape: Vec<(Value, Value, Value, Value, Value)> = e
        .iter()
        .map(|e| {
            (
                e["actor"].clone(),
                e["user_id"].clone(),
                e["detail"]["method"].clone(),
                e["detail"]["outcome"].clone(),
                e["detail"]["client"].clone(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (
                json!("oidc-login"),
                json!("alice"),
                json!("oidc"),
                json!("success"),
                json!("unknown")
            ),
            (
                json!("oidc-login"),
                Value::Null,
                json!("oidc"),
                json!("refused"),
                json!("unknown")
            ),
        ],
        "{e:?}"
    );
    for e in &e {
        assert!(
            e["request_id"].as_str().is_some_and(|r| !r.is_empty()),
            "{e}"
        );
    }
}

/// Issue 42 M5: 10,000 anonymous `GET /v1/auth/oidc/login` from one address keep at most
/// `MAX_PENDING_PER_CLIENT` entries, and a real sign-in from elsewhere still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_started_sign_ins_does_not_lock_others_out() {
    if !provider_available("a_flood_of_started_sign_ins_does_not_lock_others_out") {
        return;
    }
    let client = Client::new("airlock", SECRET, CALLBACK);
    let p = Provider::start(0, &["k1"], std::slice::from_ref(&client));
    let t = app_for(&p, &client).await;
    let from = |ip: &str, i: u32| {
        let mut req = Request::get("/v1/auth/oidc/login")
            .body(Body::empty())
            .unwrap();
        let addr: std::net::SocketAddr = format!("{ip}:{}", 1024 + i % 60000).parse().unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        req
    };
    for i in 0..10_000 {
        let r = t.send(from("203.0.113.7", i)).await;
        assert_eq!(r.status, StatusCode::FOUND, "request {i}: {}", r.text);
    }
    let oidc = t.state.oidc().unwrap().clone();
    assert_eq!(
        oidc.pending_len(),
        airlock_identity::oidc::MAX_PENDING_PER_CLIENT
    );
    // An IPv6 client is one client per /64.
    for i in 0..100 {
        let ip = format!("[2001:db8:1:2::{:x}]", i + 1);
        assert_eq!(t.send(from(&ip, i)).await.status, StatusCode::FOUND);
    }
    assert_eq!(
        oidc.pending_len(),
        2 * airlock_identity::oidc::MAX_PENDING_PER_CLIENT
    );
    // A real sign-in (another client) goes through.
    session_of(&sign_in(&t, "alice").await);
}
