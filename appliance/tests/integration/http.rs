//! The HTTP layer on real sockets: request ids (F11), every error body a problem (F10), slow
//! clients and connection limits (F4), and the drain on shutdown. Raw bytes over
//! `tokio::net::TcpStream` to `server::serve` on `127.0.0.1:0`, so what hyper itself writes is
//! seen too. Most tests need no models (a daemon still starting serves `/healthz`, 404 and 405).

// Helpers the slow-client and problem tests of the next change use.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use airlock::server::Drained;
use airlock::{AppState, Config};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
        let title = axum::http::StatusCode::from_u16(status)
            .unwrap()
            .canonical_reason()
            .unwrap();
        assert_eq!(
            self.json(),
            json!({"type": format!("https://airlock.local/problems/{slug}"), "title": title,
                   "status": status, "detail": detail}),
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
