//! One request whose whole answer is read (the identity provider's discovery, JWKS and token
//! calls): one request per connection over hyper's client connection, extra headers and a form
//! body, TLS with rustls trusting only the configured CA file (`[oidc] ca_file`).
//!
//! Name resolution: [`Dns::Inline`] resolves on the calling thread (`getaddrinfo`), for the
//! discovery that runs before the egress lockdown while the process must stay single-threaded;
//! [`Dns::Tokio`] uses tokio's resolver (a blocking-pool thread) once the daemon runs.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

/// The largest response body read from the identity provider.
pub const BODY_LIMIT: usize = 1 << 20;

/// How host names are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dns {
    /// On the calling thread (no thread is started).
    Inline,
    /// tokio's resolver.
    Tokio,
}

/// An absolute http(s) URL split for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `https`.
    pub tls: bool,
    /// Host name or address (no brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Path and query.
    pub path_and_query: String,
}

/// Whether `host` is a loopback name or address.
pub fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.to_canonical().is_loopback())
}

impl Target {
    /// Parses `http(s)://host[:port]/path[?query]` (no user info, no fragment).
    pub fn parse(url: &str) -> Result<Self, String> {
        if url.contains('#') {
            return Err(format!("`{url}` must not have a fragment"));
        }
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(format!(
                    "`{url}` must start with https:// (or http:// on loopback)"
                ));
            }
        };
        let auth = uri
            .authority()
            .ok_or_else(|| format!("`{url}` has no host"))?;
        if auth.as_str().contains('@') {
            return Err(format!("`{url}` must not contain credentials"));
        }
        let host = auth.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("`{url}` has no host"));
        }
        let path_and_query = uri
            .path_and_query()
            .map_or("/".to_string(), |p| p.as_str().to_string());
        Ok(Target {
            tls,
            host: host.to_string(),
            port: auth.port_u16().unwrap_or(if tls { 443 } else { 80 }),
            path_and_query: if path_and_query.is_empty() {
                "/".into()
            } else {
                path_and_query
            },
        })
    }

    /// `host:port` (brackets around IPv6), the `Host` header.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Plain http is accepted only to loopback.
    pub fn check_scheme(&self, what: &str) -> Result<(), String> {
        if !self.tls && !is_loopback(&self.host) {
            return Err(format!(
                "{what} {} is http:// on a non-loopback host: use https://",
                self.authority()
            ));
        }
        Ok(())
    }
}

/// One request's answer.
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The whole body (at most [`BODY_LIMIT`] bytes).
    pub body: Vec<u8>,
}

/// A request whose whole answer is read.
pub struct Call<'a> {
    /// `GET` or `POST`.
    pub method: Method,
    /// The absolute URL.
    pub url: &'a str,
    /// Extra headers.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// A form body (`application/x-www-form-urlencoded`).
    pub form: Option<String>,
    /// The whole exchange's time limit (connect, TLS, head and body).
    pub timeout: Duration,
    /// Roots for https.
    pub tls: Option<&'a Arc<rustls::ClientConfig>>,
    /// How to resolve names.
    pub dns: Dns,
}

async fn resolve(host: &str, port: u16, dns: Dns) -> Result<Vec<SocketAddr>, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let addrs: Vec<SocketAddr> = match dns {
        Dns::Inline => (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("resolving {host}: {e}"))?
            .collect(),
        Dns::Tokio => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| format!("resolving {host}: {e}"))?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(format!("{host} resolves to no address"));
    }
    Ok(addrs)
}

impl Call<'_> {
    /// Connects, sends and reads the whole answer (any status).
    pub async fn send(self) -> Result<Answer, String> {
        let t = Target::parse(self.url)?;
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.exchange(t))
            .await
            .map_err(|_| format!("no answer within {} ms", timeout.as_millis()))?
    }

    async fn exchange(self, t: Target) -> Result<Answer, String> {
        let mut last = String::new();
        let mut tcp = None;
        for addr in resolve(&t.host, t.port, self.dns).await? {
            match tokio::net::TcpStream::connect(addr).await {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = format!("connect to {addr}: {e}"),
            }
        }
        let tcp = tcp.ok_or(last)?;
        let _ = tcp.set_nodelay(true);
        let mut req = Request::builder()
            .method(self.method)
            .uri(&t.path_and_query)
            .header(header::HOST, t.authority())
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, "airlock");
        for (k, v) in self.headers {
            req = req.header(k, v);
        }
        if self.form.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        let req = req
            .body(Full::new(Bytes::from(self.form.unwrap_or_default())))
            .map_err(|e| format!("building the request: {e}"))?;
        if t.tls {
            let cfg = self.tls.ok_or_else(|| {
                format!("{} is https but no ca_file is configured", t.authority())
            })?;
            let name = rustls::pki_types::ServerName::try_from(t.host.clone())
                .map_err(|e| format!("{}: {e}", t.host))?;
            let stream = tokio_rustls::TlsConnector::from(cfg.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS with {}: {e}", t.authority()))?;
            exchange(TokioIo::new(stream), req).await
        } else {
            exchange(TokioIo::new(tcp), req).await
        }
    }
}

async fn exchange<IO>(io: IO, req: Request<Full<Bytes>>) -> Result<Answer, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let out = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("sending: {e}"))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), BODY_LIMIT)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes()
            .to_vec();
        Ok(Answer { status, body })
    }
    .await;
    conn.abort();
    out
}

/// `application/x-www-form-urlencoded` / query component encoding: everything but the
/// unreserved characters is percent-encoded.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `k1=v1&k2=v2`, each part [`encode`]d.
pub fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_http_is_loopback_only() {
        let t = Target::parse("https://idp.bank.internal/realms/bank").unwrap();
        assert_eq!((t.tls, t.port), (true, 443));
        assert_eq!(t.path_and_query, "/realms/bank");
        assert!(t.check_scheme("issuer").is_ok());
        let t = Target::parse("http://10.1.2.3:8080/").unwrap();
        assert!(t.check_scheme("issuer").is_err());
        for ok in [
            "http://127.0.0.1:9/x",
            "http://localhost:9",
            "http://[::1]:9/",
        ] {
            Target::parse(ok).unwrap().check_scheme("issuer").unwrap();
        }
        assert_eq!(
            Target::parse("http://[::1]:9/").unwrap().authority(),
            "[::1]:9"
        );
        for bad in ["ftp://x", "idp.bank", "https://u:p@idp/", "https://idp/#f"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn forms_are_percent_encoded() {
        assert_eq!(encode("a b+c/é~"), "a%20b%2Bc%2F%C3%A9~");
        assert_eq!(form(&[("a", "1&2"), ("b=", "")]), "a=1%262&b%3D=");
    }
}
