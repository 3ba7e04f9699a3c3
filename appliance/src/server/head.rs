//! The first request head of every connection, read and checked here before hyper sees it.
//!
//! hyper answers a request head it cannot take with a bare status line and an empty body (400
//! malformed, 414 target over 65534 bytes, 431 head too large) and closes a connection whose
//! head does not arrive in time without a word. Reading the first head ourselves lets those
//! answers be problems from the error table. The check is hyper's own (`httparse` with hyper's
//! defaults, then the method, target, `Content-Length` and `Transfer-Encoding` rules of hyper's
//! `Server::parse`) plus our smaller size limits, so a head that passes here is one hyper
//! accepts: it is handed over unchanged, with whatever followed it, through [`Prefixed`].
//! Later requests on a kept-alive connection are parsed by hyper alone (see docs/API.md).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderName, Method, Uri, header};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::error::ApiError;

/// hyper's limit on header fields per request (`DEFAULT_MAX_HEADERS`).
pub const MAX_HEADERS: usize = 100;

/// The limits a first request head is read under.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    /// Largest head (request line and headers) in bytes (`max_header_bytes`).
    pub max_header_bytes: usize,
    /// Longest request target in bytes (`max_uri_bytes`).
    pub max_uri_bytes: usize,
    /// Time for the whole head from the connection's start (`header_read_timeout_secs`).
    pub timeout: Duration,
}

/// How reading the first head ended.
#[derive(Debug)]
pub enum FirstHead {
    /// A complete head hyper accepts: every byte read so far (the head and what followed it).
    Ready(Bytes),
    /// The client went away, sent nothing before the timeout, or the server is stopping:
    /// close without an answer.
    Gone,
    /// Answer this problem and close.
    Refuse(ApiError),
}

/// Reads the first request head from `io` under `limits`; stops early when `stop` turns true.
pub async fn read_first_head<S: AsyncRead + Unpin>(
    io: &mut S,
    limits: &HeadLimits,
    stop: &mut watch::Receiver<bool>,
) -> FirstHead {
    let deadline = tokio::time::Instant::now() + limits.timeout;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        match check(&buf, limits) {
            Ok(true) => return FirstHead::Ready(Bytes::from(buf)),
            Ok(false) => {}
            Err(e) => return FirstHead::Refuse(e),
        }
        let room = (limits.max_header_bytes + 1 - buf.len()).min(8192);
        let start = buf.len();
        buf.resize(start + room, 0);
        let step = tokio::select! {
            r = io.read(&mut buf[start..]) => Step::Read(r),
            () = tokio::time::sleep_until(deadline) => Step::Timeout,
            () = super::stopped(stop) => Step::Stop,
        };
        match step {
            Step::Read(Ok(0) | Err(_)) | Step::Stop => return FirstHead::Gone,
            Step::Read(Ok(n)) => buf.truncate(start + n),
            Step::Timeout if start == 0 => return FirstHead::Gone,
            Step::Timeout => {
                return FirstHead::Refuse(ApiError::RequestTimeout {
                    what: "head",
                    limit_secs: limits.timeout.as_secs(),
                });
            }
        }
    }
}

enum Step {
    Read(io::Result<usize>),
    Timeout,
    Stop,
}

/// `Ok(true)`: a complete, acceptable head is in `buf`; `Ok(false)`: more bytes are needed.
pub fn check(buf: &[u8], limits: &HeadLimits) -> Result<bool, ApiError> {
    if buf.is_empty() {
        return Ok(false);
    }
    let too_large = || {
        ApiError::HeadersTooLarge(format!(
            "the request head exceeds the limit of {} bytes",
            limits.max_header_bytes
        ))
    };
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > limits.max_header_bytes => {
            return Err(too_large());
        }
        Ok(httparse::Status::Partial) => return Ok(false),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(ApiError::HeadersTooLarge(format!(
                "the request has more than {MAX_HEADERS} header fields"
            )));
        }
        Err(e) => return Err(malformed(&e.to_string())),
    };
    if len > limits.max_header_bytes {
        return Err(too_large());
    }
    let path = req.path.unwrap_or_default();
    if path.len() > limits.max_uri_bytes {
        return Err(ApiError::UriTooLong {
            limit: limits.max_uri_bytes,
        });
    }
    Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| malformed("invalid method"))?;
    Uri::try_from(path).map_err(|_| malformed("invalid request target"))?;
    let http11 = req.version == Some(1);
    check_framing(req.headers, http11)?;
    Ok(true)
}

/// hyper's body-framing rules for a request (RFC 9112 §6.3).
fn check_framing(headers: &[httparse::Header<'_>], http11: bool) -> Result<(), ApiError> {
    let mut te = None::<bool>; // Some(last coding is chunked)
    let mut content_length = None::<u64>;
    for h in headers {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| malformed("invalid header name"))?;
        if name == header::TRANSFER_ENCODING {
            if !http11 {
                return Err(malformed("Transfer-Encoding in an HTTP/1.0 request"));
            }
            // hyper reads the value with `HeaderValue::to_str` (visible ASCII and tabs only).
            let visible = h
                .value
                .iter()
                .all(|&b| b == b'\t' || (32..127).contains(&b));
            let chunked = visible
                && std::str::from_utf8(h.value).is_ok_and(|v| {
                    v.rsplit(',')
                        .next()
                        .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"))
                });
            te = Some(chunked);
        } else if name == header::CONTENT_LENGTH && te.is_none() {
            let n = digits(h.value).ok_or_else(|| malformed("invalid Content-Length"))?;
            if content_length.is_some_and(|prev| prev != n) {
                return Err(malformed("conflicting Content-Length headers"));
            }
            content_length = Some(n);
        }
    }
    if te == Some(false) {
        return Err(malformed(
            "Transfer-Encoding whose last coding is not chunked",
        ));
    }
    Ok(())
}

/// A decimal length as hyper reads it: digits only, at most `u64::MAX - 2`.
fn digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut n = 0u64;
    for &b in v {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    (n <= u64::MAX - 2).then_some(n)
}

fn malformed(what: &str) -> ApiError {
    ApiError::InvalidRequest(format!("malformed request head: {what}"))
}

/// Writes `answer`, closes the sending side, and reads what the client still sends for up to a
/// second (at most 64 KiB), so that closing does not reset the connection before the client
/// has read the answer.
pub async fn answer_and_close<S: AsyncRead + AsyncWrite + Unpin>(mut io: S, answer: &[u8]) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        io.write_all(answer).await?;
        io.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < 64 << 10 {
            match io.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<_, io::Error>(())
    })
    .await;
}

/// A stream (TCP, or TLS over TCP) whose first reads return bytes already read from it.
pub struct Prefixed<S = TcpStream> {
    pre: Bytes,
    io: S,
}

impl<S> Prefixed<S> {
    /// `io`, to be read from `pre` first.
    pub fn new(pre: Bytes, io: S) -> Self {
        Prefixed { pre, io }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            let chunk = self.pre.split_to(n);
            buf.put_slice(&chunk);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = HeadLimits {
        max_header_bytes: 1024,
        max_uri_bytes: 128,
        timeout: Duration::from_secs(1),
    };

    fn status(head: &[u8]) -> Result<bool, u16> {
        check(head, &LIMITS).map_err(|e| e.slug_status().1.as_u16())
    }

    #[test]
    fn accepts_what_hyper_accepts() {
        assert_eq!(status(b""), Ok(false));
        assert_eq!(status(b"GET /healthz HTTP/1.1\r\nHost: x\r\n"), Ok(false));
        assert_eq!(
            status(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
            Ok(true)
        );
        assert_eq!(status(b"\r\nGET / HTTP/1.0\r\n\r\n"), Ok(true));
        assert_eq!(
            status(b"POST /v1/retrieve HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"),
            Ok(true)
        );
        assert_eq!(
            status(
                b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: x\r\n\r\n"
            ),
            Ok(true)
        );
    }

    #[test]
    fn refuses_what_hyper_refuses() {
        for bad in [
            &b"GET / HTTP/1.2\r\n\r\n"[..],
            b"G\x01T / HTTP/1.1\r\n\r\n",
            b"GET /a\x7fb HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ] {
            assert_eq!(status(bad), Err(400), "{}", String::from_utf8_lossy(bad));
        }
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(128));
        assert_eq!(status(long.as_bytes()), Err(414));
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(1024));
        assert_eq!(status(big.as_bytes()), Err(431));
        assert_eq!(
            status(&big.as_bytes()[..1030]),
            Err(431),
            "partial, over the limit"
        );
        let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(101));
        assert_eq!(
            check(
                many.as_bytes(),
                &HeadLimits {
                    max_header_bytes: 4096,
                    ..LIMITS
                }
            )
            .map_err(|e| e.slug_status().1.as_u16()),
            Err(431)
        );
    }
}
