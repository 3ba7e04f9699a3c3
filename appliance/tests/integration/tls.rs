//! HTTPS (issue 22 point 1): rustls serving with a test CA made by `openssl` at test time,
//! TLS 1.0/1.1 refused, HSTS, mTLS on the privileged routes, the eval CLI verifying the daemon
//! with its CA file, SIGHUP reload in the real binary, and the refusal to serve plain HTTP off
//! loopback.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::tls::{TlsServer, TlsSettings};
use axum::http::Method;
use serde_json::{Value, json};

use crate::support::airlock_cli as airlock;
use crate::support::{TestApp, small_staging, test_config};

const BIN: &str = env!("CARGO_BIN_EXE_airlock");

/// The key of a test certificate, in each PEM form the daemon takes.
#[derive(Clone, Copy)]
pub enum KeyForm {
    /// EC P-256, PKCS#8 (`BEGIN PRIVATE KEY`).
    EcPkcs8,
    /// EC P-256, SEC1 (`BEGIN EC PRIVATE KEY`).
    EcSec1,
    /// RSA 2048, PKCS#1 (`BEGIN RSA PRIVATE KEY`).
    RsaPkcs1,
}

/// A certificate and its key on disk.
#[derive(Clone)]
pub struct Pair {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// A scratch PKI made with the `openssl` command line.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A fresh directory; panics (loudly) when `openssl` cannot be run.
    pub fn new() -> Self {
        let ok = Command::new("openssl")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            ok,
            "the TLS tests need the `openssl` command line (Debian: openssl)"
        );
        Pki {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn key(&self, name: &str, form: KeyForm) -> PathBuf {
        let key = format!("{name}.key");
        match form {
            KeyForm::EcPkcs8 => self.openssl(&[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                &key,
            ]),
            KeyForm::EcSec1 => self.openssl(&[
                "ecparam",
                "-genkey",
                "-name",
                "prime256v1",
                "-noout",
                "-out",
                &key,
            ]),
            KeyForm::RsaPkcs1 => self.openssl(&["genrsa", "-traditional", "-out", &key, "2048"]),
        }
        self.dir().join(key)
    }

    /// A self-signed CA named `name`.
    pub fn ca(&self, name: &str) -> Pair {
        let key = self.key(name, KeyForm::EcPkcs8);
        let cert = format!("{name}.pem");
        self.openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            key.to_str().unwrap(),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-out",
            &cert,
        ]);
        Pair {
            cert: self.dir().join(cert),
            key,
        }
    }

    /// A leaf signed by `ca`: a server certificate for 127.0.0.1 and localhost, or (`client`)
    /// a client certificate.
    pub fn leaf(&self, ca: &Pair, name: &str, form: KeyForm, client: bool) -> Pair {
        let usage = if client {
            "extendedKeyUsage=clientAuth\n".to_string()
        } else {
            "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n".to_string()
        };
        self.signed(ca, name, form, &usage)
    }

    /// A server certificate signed by `ca` naming only `san` (`DNS:rack.bank.internal`).
    pub fn server_leaf_for(&self, ca: &Pair, name: &str, san: &str) -> Pair {
        let usage = format!("extendedKeyUsage=serverAuth\nsubjectAltName={san}\n");
        self.signed(ca, name, KeyForm::EcPkcs8, &usage)
    }

    fn signed(&self, ca: &Pair, name: &str, form: KeyForm, usage: &str) -> Pair {
        let key = self.key(name, form);
        let csr = format!("{name}.csr");
        self.openssl(&[
            "req",
            "-new",
            "-key",
            key.to_str().unwrap(),
            "-subj",
            &format!("/CN={name}"),
            "-out",
            &csr,
        ]);
        let ext = format!("{name}.ext");
        std::fs::write(
            self.dir().join(&ext),
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{usage}"),
        )
        .unwrap();
        let cert = format!("{name}.pem");
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            ca.cert.to_str().unwrap(),
            "-CAkey",
            ca.key.to_str().unwrap(),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ]);
        Pair {
            cert: self.dir().join(cert),
            key,
        }
    }
}

/// A blocking HTTPS client trusting only `ca`, showing `client` when given.
pub fn agent(ca: &Path, client: Option<&Pair>) -> ureq::Agent {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
    let ca = Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    let client = client.map(|p| {
        let cert = Certificate::from_pem(&std::fs::read(&p.cert).unwrap()).unwrap();
        let key = PrivateKey::from_pem(&std::fs::read(&p.key).unwrap()).unwrap();
        ClientCert::new_with_certs(&[cert], key)
    });
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .root_certs(RootCerts::new_with_certs(&[ca]))
        .client_cert(client)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// `(status, HSTS header, JSON body)` of one request, or the transport error's text.
pub fn call(
    agent: &ureq::Agent,
    method: Method,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Result<(u16, Option<String>, Value), String> {
    let auth = token.map(|t| format!("Bearer {t}"));
    let res = match method.as_str() {
        "GET" => {
            let mut r = agent.get(url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        }
        m => {
            let mut r = match m {
                "PUT" => agent.put(url),
                "POST" => agent.post(url),
                _ => unreachable!("{m}"),
            };
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.send_json(body.unwrap_or(json!({})))
        }
    };
    let mut res = res.map_err(|e| e.to_string())?;
    let hsts = res
        .headers()
        .get("strict-transport-security")
        .map(|v| v.to_str().unwrap().to_owned());
    let json = res.body_mut().read_json::<Value>().unwrap_or(Value::Null);
    Ok((res.status().as_u16(), hsts, json))
}

fn settings(server: &Pair, client_ca: Option<&Pair>) -> TlsSettings {
    TlsSettings {
        cert: Some(server.cert.clone()),
        key: Some(server.key.clone()),
        client_ca: client_ca.map(|c| c.cert.clone()),
    }
}

/// A ClientHello offering only `version` (no `supported_versions` extension), ECDHE suites.
fn client_hello(version: [u8; 2]) -> Vec<u8> {
    let mut body = version.to_vec();
    body.extend([7u8; 32]);
    body.push(0);
    let suites: &[u8] = &[0xc0, 0x2b, 0xc0, 0x2f, 0xc0, 0x13, 0xc0, 0x09, 0x00, 0x2f];
    body.extend((suites.len() as u16).to_be_bytes());
    body.extend(suites);
    body.extend([1, 0]);
    let ext: &[u8] = &[
        0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x1d, 0x00, 0x17, // supported_groups
        0x00, 0x0b, 0x00, 0x02, 0x01, 0x00, // ec_point_formats
        0x00, 0x0d, 0x00, 0x06, 0x00, 0x04, 0x04, 0x03, 0x08, 0x04, // signature_algorithms
    ];
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let mut hs = vec![1u8];
    hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend(body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend((hs.len() as u16).to_be_bytes());
    rec.extend(hs);
    rec
}

/// The first record header (and, for an alert, its level and description) the server answers
/// `hello` with.
fn first_record(addr: &str, hello: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(hello).unwrap();
    let mut buf = vec![0u8; 7];
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    buf.truncate(got);
    buf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_the_ca_answers_with_hsts_and_tls_before_1_2_is_refused() {
    let pki = Pki::new();
    let ca = pki.ca("ca");
    let server = pki.leaf(&ca, "server", KeyForm::EcPkcs8, false);
    let app = TestApp::new();
    let tls = Arc::new(TlsServer::load(&settings(&server, None)).unwrap());
    let served = app.serve_with(Some(tls)).await;
    let base = served.base.clone();
    let admin = app.admin.clone();
    let ca_cert = ca.cert.clone();
    tokio::task::spawn_blocking(move || {
        let a = agent(&ca_cert, None);
        let (status, hsts, _) = call(&a, Method::GET, &format!("{base}/healthz"), None, None)
            .expect("handshake with the test CA");
        assert_eq!(status, 200);
        assert_eq!(hsts.as_deref(), Some("max-age=31536000"));
        let (status, hsts, info) = call(
            &a,
            Method::GET,
            &format!("{base}/v1/info"),
            Some(&admin),
            None,
        )
        .unwrap();
        assert_eq!(status, 200, "{info}");
        assert_eq!(hsts.as_deref(), Some("max-age=31536000"));
        assert_eq!(info["user"], "admin");

        let addr = base.trim_start_matches("https://").to_owned();
        // TLS 1.2 offered alone is served (a ServerHello record) ...
        let r = first_record(&addr, &client_hello([3, 3]));
        assert_eq!(
            r.first(),
            Some(&0x16),
            "TLS 1.2 ServerHello expected: {r:?}"
        );
        // ... TLS 1.1 and 1.0 get a fatal protocol_version alert.
        for v in [[3, 2], [3, 1]] {
            let r = first_record(&addr, &client_hello(v));
            assert_eq!(r.len(), 7, "{v:?}: {r:?}");
            assert_eq!(r[0], 0x15, "{v:?}: an alert record, got {r:?}");
            assert_eq!(
                &r[5..],
                &[2, 70],
                "{v:?}: fatal protocol_version, got {r:?}"
            );
        }
        // Plain HTTP on the HTTPS port gets no HTTP answer.
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert!(
            !out.starts_with(b"HTTP/"),
            "{}",
            String::from_utf8_lossy(&out)
        );

        // A client trusting another CA refuses the daemon.
        let other = pki.ca("other-ca");
        let err = call(
            &agent(&other.cert, None),
            Method::GET,
            &format!("{base}/healthz"),
            None,
            None,
        )
        .expect_err("a client with the wrong CA must refuse the certificate");
        assert!(err.to_lowercase().contains("certificate"), "{err}");
    })
    .await
    .unwrap();
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_client_ca_privileged_routes_need_a_verified_client_certificate() {
    let pki = Pki::new();
    let ca = pki.ca("ca");
    let clients = pki.ca("client-ca");
    let server = pki.leaf(&ca, "server", KeyForm::EcSec1, false);
    let client = pki.leaf(&clients, "ops-laptop", KeyForm::EcPkcs8, true);
    let rogue_ca = pki.ca("rogue-ca");
    let rogue = pki.leaf(&rogue_ca, "rogue", KeyForm::EcPkcs8, true);
    let config = airlock::Config {
        tls: settings(&server, Some(&clients)),
        ..test_config()
    };
    let app = TestApp::with_config(config);
    let user = app.user("u1", &["g1"]);
    let tls = Arc::new(TlsServer::load(&app.state.config().tls).unwrap());
    let served = app.serve_with(Some(tls)).await;
    let base = served.base.clone();
    let admin = app.admin.clone();
    let (ca_cert, client2) = (ca.cert.clone(), client.clone());
    tokio::task::spawn_blocking(move || {
        let bare = agent(&ca_cert, None);
        let with_cert = agent(&ca_cert, Some(&client2));
        // Without a client certificate: the user routes work, the privileged ones are refused
        // (after authentication: no token is still 401) and change nothing.
        let (s, _, _) = call(
            &bare,
            Method::GET,
            &format!("{base}/v1/info"),
            Some(&user),
            None,
        )
        .unwrap();
        assert_eq!(s, 200);
        let (s, _, _) = call(&bare, Method::GET, &format!("{base}/metrics"), None, None).unwrap();
        assert_eq!(s, 401);
        let (s, _, body) = call(
            &bare,
            Method::GET,
            &format!("{base}/metrics"),
            Some(&admin),
            None,
        )
        .unwrap();
        assert_eq!(s, 403, "{body}");
        assert_eq!(body["detail"], airlock::tls::CLIENT_CERT_REQUIRED);
        let (s, _, body) = call(
            &bare,
            Method::PUT,
            &format!("{base}/v1/acl/users/mallory"),
            Some(&admin),
            Some(json!({"groups": ["g1"], "roles": ["admin"]})),
        )
        .unwrap();
        assert_eq!(s, 403, "{body}");
        // With a certificate from the configured client CA: served.
        let (s, _, body) = call(
            &with_cert,
            Method::GET,
            &format!("{base}/metrics"),
            Some(&admin),
            None,
        )
        .unwrap();
        assert_eq!(s, 200, "{body}");
        // A certificate from another CA fails the handshake itself.
        let err = call(
            &agent(&ca_cert, Some(&rogue)),
            Method::GET,
            &format!("{base}/v1/info"),
            Some(&user),
            None,
        )
        .expect_err("a client certificate from an unknown CA must fail the handshake");
        eprintln!("rogue client certificate: {err}");
    })
    .await
    .unwrap();
    assert!(
        app.state.services().unwrap().acl.user("mallory").is_none(),
        "the refused PUT changed nothing"
    );
    served.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eval_cli_verifies_the_daemon_with_its_ca_file_and_shows_its_client_certificate() {
    let pki = Pki::new();
    let ca = pki.ca("ca");
    let wrong = pki.ca("wrong-ca");
    let clients = pki.ca("client-ca");
    let server = pki.leaf(&ca, "server", KeyForm::EcPkcs8, false);
    let client = pki.leaf(&clients, "eval-runner", KeyForm::EcSec1, true);
    let config = airlock::Config {
        tls: settings(&server, Some(&clients)),
        ..test_config()
    };
    let app = TestApp::with_config(config);
    let tls = Arc::new(TlsServer::load(&app.state.config().tls).unwrap());
    let served = app.serve_with(Some(tls)).await;
    let tmp = tempfile::tempdir().unwrap();
    let tokens = tmp.path().join("tokens.json");
    // A second admin approves the tokens of the set's users (four eyes).
    let approver = app.local_user("approver", vec![airlock_acl::Role::Admin]);
    std::fs::write(
        &tokens,
        serde_json::to_vec(&json!({"admin": app.admin, "approver": approver})).unwrap(),
    )
    .unwrap();
    let set = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../golden-sets/fixtures/mini");
    let out_dir = tmp.path().join("out");
    let base = served.base.clone();
    let run = move |extra: Vec<String>| {
        let mut args: Vec<String> = [
            "eval",
            "run",
            "--set",
            set.to_str().unwrap(),
            "--against",
            &base,
            "--tokens",
            tokens.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
            "--no-answers",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra);
        airlock(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let p = |x: &Path| x.to_str().unwrap().to_owned();
    let (ca_s, wrong_s) = (p(&ca.cert), p(&wrong.cert));
    let (cc, ck) = (p(&client.cert), p(&client.key));
    let out_dir = tmp.path().join("out");
    let acl_users = |app: &TestApp| app.state.services().unwrap().acl.user("u1").is_some();
    let (no_ca, wrong_ca, no_cert, ok) = tokio::task::spawn_blocking(move || {
        let no_ca = run(vec![]);
        let wrong_ca = run(vec!["--ca-file".into(), wrong_s]);
        let no_cert = run(vec!["--ca-file".into(), ca_s.clone()]);
        let ok = run(vec![
            "--ca-file".into(),
            ca_s,
            "--client-cert".into(),
            cc,
            "--client-key".into(),
            ck,
        ]);
        (no_ca, wrong_ca, no_cert, ok)
    })
    .await
    .unwrap();
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!no_ca.status.success());
    assert!(stderr(&no_ca).contains("--ca-file"), "{}", stderr(&no_ca));
    assert!(!wrong_ca.status.success());
    let e = stderr(&wrong_ca);
    assert!(
        e.contains("not ready") && e.to_lowercase().contains("certificate"),
        "{e}"
    );
    // The right CA but no client certificate: the admin routes the runner needs refuse it.
    assert!(!no_cert.status.success());
    assert!(stderr(&no_cert).contains("403"), "{}", stderr(&no_cert));
    assert!(ok.status.success(), "{}", stderr(&ok));
    let report: airlock_eval::gate::Report =
        serde_json::from_slice(&std::fs::read(out_dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report.leaks(), 0);
    assert_eq!(report.overall.cases, 21);
    assert!(acl_users(&app));
    served.shutdown().await;
}

/// `airlock serve` in its own process group, stopped (SIGTERM, then SIGKILL) on drop.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` every 200 ms until it returns true or `secs` pass.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

#[test]
fn sighup_reloads_the_certificate_files_in_the_real_daemon() {
    let pki = Pki::new();
    let ca1 = pki.ca("ca-2025");
    let ca2 = pki.ca("ca-2026");
    let first = pki.leaf(&ca1, "server-2025", KeyForm::EcPkcs8, false);
    let second = pki.leaf(&ca2, "server-2026", KeyForm::RsaPkcs1, false);
    // The daemon's files: replaced in place later, as an operator's renewal would.
    let live = Pair {
        cert: pki.dir().join("live-cert.pem"),
        key: pki.dir().join("live-key.pem"),
    };
    std::fs::copy(&first.cert, &live.cert).unwrap();
    std::fs::copy(&first.key, &live.key).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    small_staging(&staging);
    let data = dir.path().join("data");
    let setup = airlock(&[
        "demo",
        "--data",
        data.to_str().unwrap(),
        "--setup-only",
        "--no-sample-data",
        "--staging",
        staging.to_str().unwrap(),
    ]);
    assert!(setup.status.success());

    let mut attempt = 0;
    let (daemon, base) = loop {
        attempt += 1;
        let port = free_port();
        let log = dir.path().join(format!("serve-{attempt}.log"));
        let child = Command::new(BIN)
            .args(["serve", "--data", data.to_str().unwrap(), "--port"])
            .arg(port.to_string())
            .env("AIRLOCK_TLS_CERT", &live.cert)
            .env("AIRLOCK_TLS_KEY", &live.key)
            .env("AIRLOCK_LOG", "info")
            .env_remove("AIRLOCK_CONFIG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let daemon = Daemon { child, log };
        let base = format!("https://127.0.0.1:{port}");
        let a1 = agent(&ca1.cert, None);
        let up = eventually(120, || {
            call(&a1, Method::GET, &format!("{base}/healthz"), None, None).is_ok()
                || daemon.log().contains("binding")
        });
        if up && !daemon.log().contains("binding") {
            break (daemon, base);
        }
        assert!(attempt < 3, "the daemon did not come up: {}", daemon.log());
    };
    let healthz = format!("{base}/healthz");
    let (a1, a2) = (agent(&ca1.cert, None), agent(&ca2.cert, None));
    assert!(
        call(&a2, Method::GET, &healthz, None, None).is_err(),
        "not yet the new one"
    );

    // Renewal: new files, then SIGHUP; new connections get the new certificate.
    std::fs::copy(&second.cert, &live.cert).unwrap();
    std::fs::copy(&second.key, &live.key).unwrap();
    daemon.signal("-HUP");
    assert!(
        eventually(30, || call(&a2, Method::GET, &healthz, None, None).is_ok()),
        "the new certificate was not served after SIGHUP: {}",
        daemon.log()
    );
    let err = call(&a1, Method::GET, &healthz, None, None).expect_err("old chain still served");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    assert!(
        daemon.log().contains("TLS certificate reloaded"),
        "{}",
        daemon.log()
    );

    // A broken renewal keeps the certificate that works (and the daemon keeps running).
    std::fs::write(&live.key, "not a key").unwrap();
    daemon.signal("-HUP");
    assert!(
        eventually(30, || daemon.log().contains("TLS reload failed")),
        "{}",
        daemon.log()
    );
    assert_eq!(call(&a2, Method::GET, &healthz, None, None).unwrap().0, 200);
    drop(daemon);
}

#[test]
fn serve_refuses_plain_http_off_loopback_and_unusable_tls_files() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let out = airlock(&["serve", "--data", data, "--bind", "0.0.0.0", "--port", "0"]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("invalid setting `bind`") && e.contains("0.0.0.0 is not a loopback address"),
        "{e}"
    );
    // Explicitly allowed, the same address passes the check (and the start-up fails later, for
    // want of an installed bundle).
    let out = airlock(&[
        "serve",
        "--data",
        data,
        "--bind",
        "0.0.0.0",
        "--port",
        "0",
        "--allow-plain-http",
        "true",
    ]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!e.contains("loopback"), "{e}");
    // A key file that is not a key: refused before binding.
    let pki = Pki::new();
    let ca = pki.ca("ca");
    let server = pki.leaf(&ca, "server", KeyForm::EcPkcs8, false);
    let bad = pki.dir().join("bad.key");
    std::fs::write(&bad, "-----BEGIN NOTHING-----\n").unwrap();
    let out = airlock(&[
        "serve",
        "--data",
        data,
        "--port",
        "0",
        "--tls-cert",
        server.cert.to_str().unwrap(),
        "--tls-key",
        bad.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("refusing to start") && e.contains("tls.key"),
        "{e}"
    );
    // A key without its certificate is a configuration error.
    let out = airlock(&["serve", "--data", data, "--tls-key", bad.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("invalid setting `tls.cert`"), "{e}");
}
