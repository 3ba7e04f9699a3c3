//! The HTTP layer on real sockets: request ids (F11), every error body a problem (F10), slow
//! clients and connection limits (F4), and the drain on shutdown. Raw bytes over
//! `tokio::net::TcpStream` to `server::serve` on `127.0.0.1:0`, so what hyper itself writes is
//! seen too. Most tests need no models (a daemon still starting serves `/healthz`, 404 and 405).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use airlock::metrics::LimitLabel;
use airlock::server::Drained;
use airlock::{AppState, Config};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{TestApp, test_config};

/// A daemon on a loopback port until shut down.
struct Server {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<std::io::Result<Drained>>,
}

impl Server {
    async fn start(state: AppState) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let grace = state.config().shutdown_grace();
        let handle = tokio::spawn(airlock::server::serve(
            listener,
            state,
            async move {
                let _ = rx.await;
            },
            grace,
        ));
        Server { addr, stop, handle }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    /// A connection from another loopback address (127.0.0.2), for the per-address limit.
    async fn connect_from(&self, ip: [u8; 4]) -> TcpStream {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::from((ip, 0))).unwrap();
        sock.connect(self.addr).await.unwrap()
    }

    async fn shutdown(self) -> Drained {
        let _ = self.stop.send(());
        self.handle.await.unwrap().unwrap()
    }
}

/// A daemon that is still starting (no models, no stores): `/healthz` 200, API 503.
fn starting(config: Config) -> AppState {
    config.validate().unwrap();
    AppState::starting(config)
}

/// One parsed HTTP/1.1 response.
#[derive(Debug)]
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// Asserts a problem exactly: status, content type, body, and a request id header.
    fn assert_problem(&self, status: u16, slug: &str, detail: &str) {
        let text = String::from_utf8_lossy(&self.body);
        assert_eq!(self.status, status, "{text}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        assert!(self.header("x-request-id").is_some(), "{self:?}");
        assert_eq!(
            self.json(),
            crate::support::problem_json(status, slug, detail),
            "{text}"
        );
    }
}

/// Reads one response (its body by `Content-Length`); `None` if the server closed first.
async fn read_response<R: AsyncRead + Unpin>(sock: &mut R) -> Option<Raw> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout(Duration::from_secs(30), sock.read(&mut tmp))
            .await
            .expect("no response within 30 s")
            .unwrap_or(0);
        if n == 0 {
            assert!(
                buf.is_empty(),
                "closed mid-response: {}",
                String::from_utf8_lossy(&buf)
            );
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_string(), v.trim().to_string())
        })
        .collect();
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let mut rest = buf[head_end..].to_vec();
    let body = if chunked {
        // Chunks until the last (`0`), trailers not used by the daemon.
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                fill(sock, &mut rest).await;
            };
            let size_line = String::from_utf8(rest[..line_end].to_vec()).unwrap();
            let size =
                usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16).unwrap();
            while rest.len() < line_end + 2 + size + 2 {
                fill(sock, &mut rest).await;
            }
            body.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
            rest.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break body;
            }
        }
    } else {
        let len: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map_or(0, |(_, v)| v.parse().unwrap());
        while rest.len() < len {
            fill(sock, &mut rest).await;
        }
        rest.truncate(len);
        rest
    };
    Some(Raw {
        status,
        headers,
        body,
    })
}

/// Reads more of a response body into `buf` (panics on a close or after 30 s).
async fn fill<R: AsyncRead + Unpin>(sock: &mut R, buf: &mut Vec<u8>) {
    let mut tmp = [0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(30), sock.read(&mut tmp))
        .await
        .expect("body within 30 s")
        .unwrap();
    assert!(n > 0, "closed mid-body");
    buf.extend_from_slice(&tmp[..n]);
}

/// Sends `raw` on a new connection and reads one response.
async fn exchange(server: &Server, raw: &[u8]) -> Raw {
    let mut sock = server.connect().await;
    sock.write_all(raw).await.unwrap();
    read_response(&mut sock).await.expect("a response")
}

/// Waits until the server closes `sock` (EOF or reset); returns how long it took and the bytes
/// it sent meanwhile. Panics after `limit`.
async fn wait_closed<R: AsyncRead + Unpin>(sock: &mut R, limit: Duration) -> (Duration, Vec<u8>) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit, sock.read(&mut tmp)).await {
            Err(_) => panic!(
                "still open after {limit:?}: {}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0) | Err(_)) => return (t0.elapsed(), got),
            Ok(Ok(n)) => got.extend_from_slice(&tmp[..n]),
        }
    }
}

fn get(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: airlock\r\n{extra}\r\n").into_bytes()
}

// ---------------------------------------------------------------------------------------------
// F11: request ids

/// A client `X-Request-Id` is kept only when it is 1–64 characters of `[A-Za-z0-9._-]`, on
/// every kind of response (200, 404 fallback, 405, 503 problem, `/readyz`'s JSON 503);
/// otherwise it is replaced by a fresh UUID.
#[tokio::test]
async fn client_request_ids_are_kept_only_when_short_and_printable() {
    let server = Server::start(starting(Config::default())).await;
    let max = "a".repeat(64);
    let over = "a".repeat(65);
    let requests = [
        ("GET", "/healthz", 200),
        ("GET", "/nope", 404),
        ("POST", "/healthz", 405),
        ("GET", "/v1/models", 503),
        ("GET", "/readyz", 503),
    ];
    for (method, path, status) in requests {
        for (id, kept) in [
            ("abc.DEF_123-x", true),
            (max.as_str(), true),
            ("0", true),
            (over.as_str(), false),
            ("has space", false),
            ("semi;colon", false),
            ("a/b", false),
            ("quote\"", false),
            ("", false),
        ] {
            let raw = format!(
                "{method} {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nX-Request-Id: {id}\r\n\
                 Connection: close\r\n\r\n"
            );
            let r = exchange(&server, raw.as_bytes()).await;
            assert_eq!(r.status, status, "{method} {path}");
            let echoed = r.header("x-request-id").expect("request id echoed");
            if kept {
                assert_eq!(echoed, id, "{method} {path}: kept");
            } else {
                assert_ne!(echoed, id, "{method} {path}: {id:?} must be replaced");
                assert!(
                    uuid::Uuid::parse_str(echoed).is_ok(),
                    "fresh UUID: {echoed}"
                );
            }
        }
        // Not visible ASCII (UTF-8 bytes), and an id sent twice: replaced.
        let mut raw =
            format!("{method} {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n").into_bytes();
        raw.extend_from_slice(b"X-Request-Id: \xc3\xbcml\r\nConnection: close\r\n\r\n");
        let r = exchange(&server, &raw).await;
        assert!(uuid::Uuid::parse_str(r.header("x-request-id").unwrap()).is_ok());
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nX-Request-Id: one\r\n\
             X-Request-Id: two\r\nConnection: close\r\n\r\n"
        );
        let r = exchange(&server, raw.as_bytes()).await;
        assert!(uuid::Uuid::parse_str(r.header("x-request-id").unwrap()).is_ok());
    }
    assert_eq!(server.shutdown().await, Drained::Clean);
}

// ---------------------------------------------------------------------------------------------
// F10: every error body is a problem

/// Every kind of bad request, sent over a real socket to the real router, and the exact
/// problem that answers it (status, content type, body; the request id only checked present).
/// The first request head of a connection is checked before hyper (`server/head.rs`); later
/// requests on a kept-alive connection are hyper's, tested below as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_body_is_a_problem() {
    let t = TestApp::with_config(Config {
        body_limit: Some(4096),
        ..test_config()
    });
    let alice = t.user("alice", &["risk"]);
    let server = Server::start(t.state.clone()).await;
    let admin = format!("Authorization: Bearer {}\r\n", t.admin);
    let user = format!("Authorization: Bearer {alice}\r\n");
    let json_body = |method: &str, path: &str, auth: &str, body: &str| {
        format!(
            "{method} {path} HTTP/1.1\r\nHost: a\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    let big_header = format!("X-Big: {}\r\n", "b".repeat(17 << 10));
    let many_headers = "X-Many: y\r\n".repeat(101);
    let long_path = format!("/{}", "p".repeat(8192));
    let big_body = format!("{{\"query\": \"{}\"}}", "q".repeat(5000));
    let cases: Vec<(&str, Vec<u8>, u16, &str, &str)> = vec![
        // The router and its extractors.
        (
            "unknown route",
            get("/nope", "Connection: close\r\n"),
            404,
            "not-found",
            "no such route",
        ),
        (
            "wrong method",
            json_body("POST", "/v1/models", &admin, ""),
            405,
            "method-not-allowed",
            "method POST is not allowed on this route",
        ),
        (
            "path not UTF-8 (unauthenticated route)",
            get("/js/%FF", "Connection: close\r\n"),
            400,
            "invalid-request",
            "Invalid URL: Invalid UTF-8 in `file`",
        ),
        (
            "path not UTF-8 (admin route)",
            get(
                "/v1/documents/%FF%FE",
                &format!("{admin}Connection: close\r\n"),
            ),
            400,
            "invalid-request",
            "Invalid URL: Invalid UTF-8 in `doc_id`",
        ),
        (
            "no token",
            json_body("POST", "/v1/retrieve", "", "{}"),
            401,
            "unauthorized",
            "a valid bearer token is required",
        ),
        (
            "not an admin",
            get("/metrics", &format!("{user}Connection: close\r\n")),
            403,
            "forbidden",
            "this endpoint needs the admin, auditor or metrics role",
        ),
        (
            "malformed JSON",
            json_body("POST", "/v1/retrieve", &admin, "{\"query\": "),
            400,
            "invalid-request",
            "invalid JSON body: EOF while parsing a value at line 1 column 10",
        ),
        (
            "wrong-typed field",
            json_body("POST", "/v1/retrieve", &admin, "{\"query\": 1}"),
            400,
            "invalid-request",
            "invalid JSON body: invalid type: integer `1`, expected a string at line 1 column 11",
        ),
        (
            "body over the limit",
            json_body("POST", "/v1/retrieve", &admin, &big_body),
            413,
            "payload-too-large",
            "the request body exceeds the limit of 4096 bytes",
        ),
        // The request head, before hyper.
        (
            "request target over max_uri_bytes",
            get(&long_path, ""),
            414,
            "uri-too-long",
            "the request target exceeds the limit of 8192 bytes",
        ),
        (
            "head over max_header_bytes",
            get("/healthz", &big_header),
            431,
            "headers-too-large",
            "the request head exceeds the limit of 16384 bytes",
        ),
        (
            "more than 100 header fields",
            get("/healthz", &many_headers),
            431,
            "headers-too-large",
            "the request has more than 100 header fields",
        ),
        (
            "unknown HTTP version",
            b"GET /healthz HTTP/1.2\r\nHost: a\r\n\r\n".to_vec(),
            400,
            "invalid-request",
            "malformed request head: invalid HTTP version",
        ),
        (
            "control byte in the method",
            b"G\x01T /healthz HTTP/1.1\r\n\r\n".to_vec(),
            400,
            "invalid-request",
            "malformed request head: invalid token",
        ),
        (
            "space in a header name",
            get("/healthz", "Bad Name: x\r\n"),
            400,
            "invalid-request",
            "malformed request head: invalid header name",
        ),
        (
            "conflicting Content-Length",
            b"POST /v1/retrieve HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}"
                .to_vec(),
            400,
            "invalid-request",
            "malformed request head: conflicting Content-Length headers",
        ),
        (
            "Transfer-Encoding not ending in chunked",
            b"POST /v1/retrieve HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n".to_vec(),
            400,
            "invalid-request",
            "malformed request head: Transfer-Encoding whose last coding is not chunked",
        ),
        (
            "HTTP/2 preface (HTTP/2 is not served)",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            400,
            "invalid-request",
            "malformed request head: invalid HTTP version",
        ),
    ];
    for (what, raw, status, slug, detail) in cases {
        let r = exchange(&server, &raw).await;
        eprintln!("{what}: {} {}", r.status, String::from_utf8_lossy(&r.body));
        r.assert_problem(status, slug, detail);
    }

    // A kept-alive connection: a later request over max_uri_bytes is refused by the router
    // (problem); a later request head hyper cannot parse gets hyper's own answer, a status line
    // with an empty body, and the connection is closed.
    let mut sock = server.connect().await;
    sock.write_all(&get("/healthz", "")).await.unwrap();
    assert_eq!(read_response(&mut sock).await.unwrap().status, 200);
    sock.write_all(&get(&long_path, "")).await.unwrap();
    read_response(&mut sock).await.unwrap().assert_problem(
        414,
        "uri-too-long",
        "the request target exceeds the limit of 8192 bytes",
    );
    sock.write_all(b"GET /healthz HTTP/1.2\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut sock).await.unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.header("content-length"), Some("0"));
    assert!(r.body.is_empty());
    wait_closed(&mut sock, Duration::from_secs(5)).await;
    assert_eq!(server.shutdown().await, Drained::Clean);
}

// ---------------------------------------------------------------------------------------------
// F4: slow clients and connection limits

/// A quick config: 1-s head and body deadlines.
fn quick() -> Config {
    Config {
        header_read_timeout_secs: Some(1),
        body_read_timeout_secs: Some(1),
        shutdown_grace_secs: Some(5),
        ..test_config()
    }
}

/// A connection that sends nothing is closed silently at the header timeout; one that trickles
/// its head a byte at a time gets `408 request-timeout` at the same deadline; a kept-alive
/// connection idle after a response, or trickling its next head, is closed too (by hyper, no
/// answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_trickling_heads_are_cut_at_the_header_timeout() {
    let server = Server::start(starting(quick())).await;
    let limit = Duration::from_secs(4);

    // Idle from the start: closed with no answer.
    let mut idle = server.connect().await;
    let (after, got) = wait_closed(&mut idle, limit).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(after >= Duration::from_millis(900), "{after:?}");

    // A head trickled one byte every 200 ms: 408 problem at the deadline, then closed.
    let sock = server.connect().await;
    let (mut rd, mut wr) = sock.into_split();
    let trickle = tokio::spawn(async move {
        for b in b"GET /healthz HTTP/1.1\r\nHost: airlock\r\nX-Slow: 1234567890\r\n" {
            if wr.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let t0 = Instant::now();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(limit, rd.read_to_end(&mut got)).await;
    assert!(t0.elapsed() < limit, "trickling head still open");
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{text}"
    );
    assert!(
        text.contains("content-type: application/problem+json"),
        "{text}"
    );
    assert!(
        text.ends_with(
            r#"{"type":"https://airlock.local/problems/request-timeout","title":"Request Timeout","status":408,"detail":"the request head did not arrive within 1 s","error":{"message":"the request head did not arrive within 1 s","type":"invalid_request_error","code":"request_timeout","param":null}}"#
        ),
        "{text}"
    );
    trickle.abort();

    // Kept alive after a response, then idle: closed by hyper's header timeout.
    let mut sock = server.connect().await;
    sock.write_all(&get("/healthz", "")).await.unwrap();
    assert_eq!(read_response(&mut sock).await.unwrap().status, 200);
    let (after, got) = wait_closed(&mut sock, limit).await;
    assert!(got.is_empty());
    assert!(after >= Duration::from_millis(900), "{after:?}");

    // Kept alive, then the next head trickled: closed without an answer.
    let mut sock = server.connect().await;
    sock.write_all(&get("/healthz", "")).await.unwrap();
    assert_eq!(read_response(&mut sock).await.unwrap().status, 200);
    let (mut rd, mut wr) = sock.into_split();
    let trickle = tokio::spawn(async move {
        for b in b"GET /healthz HTTP/1.1\r\nHost: airlock\r\nX-Slow: 1234567890\r\n" {
            if wr.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut got = Vec::new();
    let t0 = Instant::now();
    let _ = tokio::time::timeout(limit, rd.read_to_end(&mut got)).await;
    assert!(t0.elapsed() < limit, "trickling second head still open");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    trickle.abort();
    assert_eq!(server.shutdown().await, Drained::Clean);
}

/// An authenticated request whose body trickles in gets `408 request-timeout` when the body
/// deadline passes, and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_cut_at_the_body_timeout() {
    let t = TestApp::with_config(Config {
        header_read_timeout_secs: Some(30),
        ..quick()
    });
    let server = Server::start(t.state.clone()).await;
    let sock = server.connect().await;
    let (mut rd, mut wr) = sock.into_split();
    let head = format!(
        "POST /v1/retrieve HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 64\r\n\r\n",
        t.admin
    );
    wr.write_all(head.as_bytes()).await.unwrap();
    let trickle = tokio::spawn(async move {
        for _ in 0..64 {
            if wr.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let t0 = Instant::now();
    let r = read_response(&mut rd).await.expect("a 408");
    let elapsed = t0.elapsed();
    assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
    r.assert_problem(
        408,
        "request-timeout",
        "the request body did not arrive within 1 s",
    );
    wait_closed(&mut rd, Duration::from_secs(5)).await;
    assert!(
        t0.elapsed() < Duration::from_secs(6),
        "trickling body still open"
    );
    trickle.abort();
    assert_eq!(server.shutdown().await, Drained::Clean);
}

/// With `max_connections_per_ip` 2 and `max_connections` 3: a third connection from one
/// address is refused while two are open, a connection from another address is still taken up
/// to the global limit, the next one is refused by it, and a place freed is taken again. Each
/// refusal is `503 too-many-connections` with `Retry-After: 1`, then the close; both are
/// counted in `airlock_connections_refused_total{limit}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_limited_per_address_and_in_all() {
    let state = starting(Config {
        max_connections: Some(3),
        max_connections_per_ip: Some(2),
        header_read_timeout_secs: Some(30),
        ..test_config()
    });
    let server = Server::start(state.clone()).await;
    let refused = |limit: &'static str| {
        state
            .metrics()
            .connections_refused
            .get_or_create(&LimitLabel { limit })
            .get()
    };
    // An answered request proves a connection was admitted (and is held: kept alive).
    async fn held(mut sock: TcpStream) -> TcpStream {
        sock.write_all(&get("/healthz", "")).await.unwrap();
        assert_eq!(read_response(&mut sock).await.unwrap().status, 200);
        sock
    }
    async fn assert_refused(mut sock: TcpStream) {
        let r = read_response(&mut sock)
            .await
            .expect("a 503 before the close");
        r.assert_problem(
            503,
            "too-many-connections",
            "too many open connections; retry later",
        );
        assert_eq!(r.header("retry-after"), Some("1"));
        wait_closed(&mut sock, Duration::from_secs(5)).await;
    }
    let a1 = held(server.connect().await).await;
    let _a2 = held(server.connect().await).await;
    assert_refused(server.connect().await).await;
    assert_eq!(refused("per_ip"), 1);

    let _b1 = held(server.connect_from([127, 0, 0, 2]).await).await;
    assert_refused(server.connect_from([127, 0, 0, 2]).await).await;
    assert_eq!(refused("global"), 1);

    // One closes: its place is free again once the server has seen the close.
    drop(a1);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut sock = server.connect().await;
        sock.write_all(&get("/healthz", "")).await.unwrap();
        let r = read_response(&mut sock).await.unwrap();
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503);
        assert!(Instant::now() < deadline, "the freed place was never taken");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.shutdown().await, Drained::Clean);
}

// ---------------------------------------------------------------------------------------------
// Drain

/// Shutdown stops accepting, closes idle kept-alive connections, and lets a request in flight
/// (its body still arriving) finish and answer (here `503 not-ready`: the handler asks for the
/// services, withdrawn when shutdown began), then reports a clean drain; a request that does
/// not finish within the grace is dropped at the deadline (its connection closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_requests_and_drops_them_at_the_deadline() {
    let body = r#"{"query": "anything", "mode": "bm25"}"#;
    for finish in [true, false] {
        let t = TestApp::with_config(Config {
            header_read_timeout_secs: Some(30),
            body_read_timeout_secs: Some(30),
            shutdown_grace_secs: Some(2),
            ..test_config()
        });
        let head = format!(
            "POST /v1/retrieve HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            t.admin,
            body.len()
        );
        let server = Server::start(t.state.clone()).await;
        let addr = server.addr;
        let mut idle = server.connect().await;
        idle.write_all(&get("/healthz", "")).await.unwrap();
        assert_eq!(read_response(&mut idle).await.unwrap().status, 200);
        let mut busy = server.connect().await;
        busy.write_all(head.as_bytes()).await.unwrap();
        busy.write_all(&body.as_bytes()[..5]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;

        let stopping = tokio::spawn(server.shutdown());
        // The idle connection is closed at once; no new connection is served.
        let (after, got) = wait_closed(&mut idle, Duration::from_secs(2)).await;
        assert!(
            got.is_empty() && after < Duration::from_secs(1),
            "{after:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(mut late) = TcpStream::connect(addr).await {
            let _ = late.write_all(&get("/healthz", "")).await;
            let (_, got) = wait_closed(&mut late, Duration::from_secs(2)).await;
            assert!(got.is_empty(), "served after shutdown began");
        }
        if finish {
            busy.write_all(&body.as_bytes()[5..]).await.unwrap();
            let r = read_response(&mut busy)
                .await
                .expect("the in-flight answer");
            r.assert_problem(503, "not-ready", "the appliance is not ready");
            assert_eq!(stopping.await.unwrap(), Drained::Clean);
        } else {
            let (after, got) = wait_closed(&mut busy, Duration::from_secs(5)).await;
            assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
            assert!(after >= Duration::from_millis(1500), "{after:?}");
            assert_eq!(stopping.await.unwrap(), Drained::DeadlineExceeded);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Robustness

/// 320 mutated requests (bytes of the head flipped, inserted, deleted or doubled; a fixed
/// seed), each on its own connection: none is answered with a 5xx, and every error answer to
/// them is a problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_requests_get_problems_and_never_a_server_error() {
    let t = TestApp::with_config(quick());
    let server = Server::start(t.state.clone()).await;
    let auth = format!("Authorization: Bearer {}\r\n", t.admin);
    let bases: Vec<Vec<u8>> = vec![
        get("/healthz", "Accept: */*\r\n"),
        get("/v1/documents/doc%2D1", &auth),
        format!(
            "POST /v1/retrieve?x=1 HTTP/1.1\r\nHost: a\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: 17\r\n\r\n{{\"query\": \"rate\"}}"
        )
        .into_bytes(),
        format!(
            "PUT /v1/acl/users/bob HTTP/1.1\r\nHost: a\r\n{auth}Transfer-Encoding: chunked\r\n\
             \r\n0E\r\n{{\"groups\": []}}\r\n0\r\n\r\n"
        )
        .into_bytes(),
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut cases = Vec::new();
    for i in 0..320 {
        let mut req = bases[i % bases.len()].clone();
        let head_len = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        for _ in 0..(1 + next() % 3) {
            let at = (next() as usize) % head_len.max(1);
            let byte = (next() % 256) as u8;
            match next() % 4 {
                0 => req[at] = byte,
                1 => req.insert(at, byte),
                2 => {
                    req.remove(at);
                }
                _ => {
                    let line_end = req[at..]
                        .iter()
                        .position(|&b| b == b'\n')
                        .map(|p| at + p + 1);
                    if let Some(end) = line_end.filter(|&e| e < head_len) {
                        let line_start = req[..at]
                            .iter()
                            .rposition(|&b| b == b'\n')
                            .map_or(0, |p| p + 1);
                        let line = req[line_start..end].to_vec();
                        req.splice(end..end, line);
                    }
                }
            }
        }
        cases.push(req);
    }
    let mut answered = 0;
    for batch in cases.chunks(32) {
        let mut tasks = tokio::task::JoinSet::new();
        for req in batch.iter().cloned() {
            let mut sock = server.connect().await;
            tasks.spawn(async move {
                let _ = sock.write_all(&req).await;
                // Whatever arrives before the close (the head and body deadlines are 1 s).
                let mut got = Vec::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut got)).await;
                (req, got)
            });
        }
        while let Some(done) = tasks.join_next().await {
            let (req, got) = done.unwrap();
            if got.is_empty() {
                continue;
            }
            answered += 1;
            let text = String::from_utf8_lossy(&got);
            let status: u16 = text
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("not a response: {text}"));
            let sent = String::from_utf8_lossy(&req);
            assert!(status < 500, "{sent:?} -> {text}");
            if status >= 400 {
                let head = &text[..text.find("\r\n\r\n").unwrap_or(text.len())];
                assert!(
                    head.to_ascii_lowercase()
                        .contains("content-type: application/problem+json"),
                    "{sent:?} -> {text}"
                );
            }
        }
    }
    assert!(answered > 200, "only {answered} of 320 answered");
    assert_eq!(server.shutdown().await, Drained::Clean);
}
