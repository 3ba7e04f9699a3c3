//! The egress HTTP client: HTTP/1.1 over hyper's client connection on a tokio socket, plain or
//! TLS through [`crate::tls::TlsConnector`] (trusting only the configured CA file). One
//! connection per request, so that dropping a request's response closes its socket at once and
//! the server upstream sees the client go (vLLM and llama.cpp abort a generation on disconnect).
//!
//! Its request and response types are its own, over the `http` crate's plain types
//! ([`Method`], [`StatusCode`], [`HeaderMap`]) and [`Bytes`]: callers never name hyper.

use std::time::Duration;

use bytes::Bytes;
pub use http::{HeaderMap, Method, StatusCode};
use http::{Request, Response, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use crate::tls::TlsConnector;

pub mod whole;

/// One server's endpoint, from its base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// The base URL as configured.
    pub url: String,
    /// `https`.
    pub tls: bool,
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The API root's path without a trailing slash (`/v1`).
    pub root: String,
}

impl Upstream {
    /// Parses `http://host:port/v1` (https too; no user info, query or fragment).
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(format!("`{url}` must start with http:// or https://")),
        };
        let auth = uri
            .authority()
            .ok_or_else(|| format!("`{url}` has no host"))?;
        if auth.as_str().contains('@') {
            return Err(format!("`{url}`: credentials belong in api_key_file"));
        }
        if uri.query().is_some() {
            return Err(format!("`{url}` must not have a query"));
        }
        let host = auth.host().trim_start_matches('[').trim_end_matches(']');
        Ok(Upstream {
            url: url.to_string(),
            tls,
            host: host.to_string(),
            port: auth.port_u16().unwrap_or(if tls { 443 } else { 80 }),
            root: uri.path().trim_end_matches('/').to_string(),
        })
    }

    /// `host:port`, as the `Host` header and the metric label.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Why a request got no response head.
#[derive(Debug)]
pub enum SendError {
    /// No connection was made: the request never reached the upstream (safe to retry).
    Unreached(String),
    /// The connection broke or timed out after the request was sent.
    Broken(String),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Unreached(m) => write!(f, "not reached: {m}"),
            SendError::Broken(m) => write!(f, "failed: {m}"),
        }
    }
}

/// A response whose body is still arriving; dropping it closes the connection.
pub struct Open {
    response: Response<Incoming>,
    conn: tokio::task::JoinHandle<()>,
    /// Kept while the body is read: hyper ends a connection whose sender is gone.
    _sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Open {
    /// The response's status.
    pub fn status(&self) -> StatusCode {
        self.response.status()
    }

    /// The response's headers.
    pub fn headers(&self) -> &HeaderMap {
        self.response.headers()
    }

    /// The body's next bytes (trailers are skipped); `None` at its end. The connection stays
    /// open while the body is read.
    pub async fn data(&mut self) -> Option<Result<Bytes, String>> {
        loop {
            match self.response.body_mut().frame().await? {
                Err(e) => return Some(Err(e.to_string())),
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(Ok(data));
                    }
                }
            }
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        // The connection task owns the socket: aborting it closes the socket now, not when
        // hyper would notice the dropped body.
        self.conn.abort();
    }
}

/// A request to one upstream.
pub struct Call<'a> {
    /// Where.
    pub upstream: &'a Upstream,
    /// `GET` or `POST`.
    pub method: Method,
    /// Below the API root (`/models`, `/chat/completions`).
    pub path: &'a str,
    /// Bearer token.
    pub api_key: Option<&'a str>,
    /// JSON body.
    pub body: Option<Vec<u8>>,
    /// TCP connect limit.
    pub connect_timeout: Duration,
    /// Limit from the request's start to the response head.
    pub head_timeout: Duration,
    /// TLS settings for https upstreams.
    pub tls: Option<&'a TlsConnector>,
}

impl Call<'_> {
    /// Connects, sends, and waits for the response head.
    pub async fn send(self) -> Result<Open, SendError> {
        let up = self.upstream;
        let tcp = tokio::time::timeout(
            self.connect_timeout,
            tokio::net::TcpStream::connect((up.host.as_str(), up.port)),
        )
        .await
        .map_err(|_| {
            SendError::Unreached(format!(
                "connect to {} timed out after {} ms",
                up.authority(),
                self.connect_timeout.as_millis()
            ))
        })?
        .map_err(|e| SendError::Unreached(format!("connect to {}: {e}", up.authority())))?;
        let _ = tcp.set_nodelay(true);
        let uri = format!("{}{}", up.root, self.path);
        let mut req = Request::builder()
            .method(self.method)
            .uri(uri)
            .header(header::HOST, up.authority())
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header(header::USER_AGENT, "airlock");
        if let Some(k) = self.api_key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        if self.body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(self.body.unwrap_or_default())))
            .map_err(|e| SendError::Unreached(format!("building the request: {e}")))?;
        let head = self.head_timeout;
        let fut = async move {
            match (up.tls, self.tls) {
                (true, Some(tls)) => {
                    let stream = tls.connect(&up.host, tcp).await.map_err(|e| {
                        SendError::Unreached(format!("TLS with {}: {e}", up.authority()))
                    })?;
                    exchange(TokioIo::new(stream), req).await
                }
                (true, None) => Err(SendError::Unreached(format!(
                    "{} is https but no CA is configured",
                    up.url
                ))),
                (false, _) => exchange(TokioIo::new(tcp), req).await,
            }
        };
        tokio::time::timeout(head, fut).await.map_err(|_| {
            SendError::Broken(format!(
                "no response head from {} within {} ms",
                up.authority(),
                head.as_millis()
            ))
        })?
    }
}

async fn exchange<IO>(io: IO, req: Request<Full<Bytes>>) -> Result<Open, SendError>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| SendError::Unreached(format!("HTTP handshake: {e}")))?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    match sender.send_request(req).await {
        Ok(response) => Ok(Open {
            response,
            conn,
            _sender: sender,
        }),
        Err(e) => {
            conn.abort();
            // hyper reports a request it could not write as not sent (it never reached the
            // server); anything later broke an exchange in progress.
            if e.is_canceled() || e.is_closed() && !e.is_incomplete_message() {
                Err(SendError::Unreached(format!("sending: {e}")))
            } else {
                Err(SendError::Broken(format!("sending: {e}")))
            }
        }
    }
}

/// Reads a whole (small) body, at most `limit` bytes.
pub async fn read_body(mut open: Open, limit: usize, within: Duration) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let read = async {
        while let Some(data) = open.data().await {
            let data = data?;
            if out.len() + data.len() > limit {
                return Err(format!("body over {limit} bytes"));
            }
            out.extend_from_slice(&data);
        }
        Ok::<(), String>(())
    };
    tokio::time::timeout(within, read)
        .await
        .map_err(|_| format!("body not complete within {} ms", within.as_millis()))??;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::Upstream;

    #[test]
    fn base_urls_parse() {
        let u = Upstream::parse("http://10.1.2.3:8000/v1").unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.port, u.root.as_str()),
            (false, "10.1.2.3", 8000, "/v1")
        );
        let u = Upstream::parse("https://rack.bank.internal/v1/").unwrap();
        assert_eq!((u.tls, u.port, u.root.as_str()), (true, 443, "/v1"));
        assert_eq!(u.authority(), "rack.bank.internal:443");
        let u = Upstream::parse("http://[::1]:9000/v1").unwrap();
        assert_eq!(u.authority(), "[::1]:9000");
        for bad in [
            "ftp://x/v1",
            "10.1.2.3:8000",
            "http://u:p@x/v1",
            "http://x/v1?a=b",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
    }
}
