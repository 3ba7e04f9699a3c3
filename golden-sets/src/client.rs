//! A small blocking client for the daemon's public HTTP API (the subset evals need).
//!
//! Evals go through the same API as users, so they measure what users get. An `https://` daemon
//! is verified against the CA certificates of [`TlsOptions::ca_file`] only (rustls; no system or
//! built-in roots), and [`Client::with_tls`] may present a client certificate (mTLS).
//!
//! Every request carries `X-Airlock-Priority` ([`Priority::Batch`] unless told otherwise), so an
//! eval yields to employees' questions. A `429` or `503` answer (the daemon shed the request, which
//! changed nothing) is retried after its `Retry-After`, at most [`MAX_RETRIES`] times and waiting
//! at most [`MAX_RETRY_WAIT`] each time; every other failure is returned at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::formats::{Turn, TurnRole};

/// An API failure: the status and the problem `type`/`detail` when the daemon sent one.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The daemon answered with a non-success status.
    #[error("{method} {path}: HTTP {status} {slug}: {detail}")]
    Status {
        /// HTTP method.
        method: &'static str,
        /// Request path.
        path: String,
        /// Status code.
        status: u16,
        /// Problem slug (last segment of the problem `type`).
        slug: String,
        /// Problem detail.
        detail: String,
    },
    /// The request did not complete (connection refused, timeout, bad body).
    #[error("{method} {path}: {message}")]
    Transport {
        /// HTTP method.
        method: &'static str,
        /// Request path.
        path: String,
        /// What happened.
        message: String,
    },
}

impl ApiError {
    /// The HTTP status, if the daemon answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            ApiError::Transport { .. } => None,
        }
    }
}

/// One retrieval result as the API returns it.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct RetrievedChunk {
    /// External document id.
    pub doc_id: String,
    /// Chunk id.
    pub chunk_id: u64,
    /// Document title.
    #[serde(default)]
    pub title: String,
    /// Snippet shown to the user.
    #[serde(default)]
    pub snippet: String,
    /// Final score.
    #[serde(default)]
    pub score: f64,
    /// The chunk's full text (asked for with `include_text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// The result of one retrieval call.
#[derive(Debug, Clone, Deserialize)]
pub struct RetrieveResponse {
    /// Ranked results.
    pub results: Vec<RetrievedChunk>,
    /// Per-stage timings in ms.
    #[serde(default)]
    pub timings_ms: serde_json::Map<String, Value>,
}

/// The parts of a chat completion evals score.
#[derive(Debug, Clone, Default)]
pub struct ChatOutcome {
    /// The answer text.
    pub answer: String,
    /// Citations (`doc_id`, `title`, `snippet`).
    pub citations: Vec<RetrievedChunk>,
    /// The source numbers (`n`, 1-based into `citations`) the answer used, when the daemon
    /// reports them (`airlock.cited`).
    pub cited: Option<Vec<usize>>,
    /// The rung the daemon served at.
    pub rung: Option<u8>,
    /// Bundle version reported by the daemon.
    pub bundle_version: Option<String>,
    /// Wall time of the call in ms.
    pub latency_ms: f64,
    /// The daemon's generation stages in ms (`airlock.timings_ms`: `first_token`, `queue_wait`,
    /// `prefill`, `decode`), when it sends them (to admins, or to everyone where configured, as
    /// on the runner's own daemon); empty otherwise and for an answer given without generation.
    pub stages_ms: Vec<(&'static str, f64)>,
    /// The full text of every citation's chunk (`airlock.source_texts`), when the daemon sent
    /// it.
    pub source_texts: Option<Vec<String>>,
}

/// The generation stages of a chat answer's `timings_ms`, in the order a report lists them.
const CHAT_STAGES: [&str; 4] = ["first_token", "queue_wait", "prefill", "decode"];

/// The priority the eval's requests ask for (`X-Airlock-Priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// Yields to interactive traffic; shed first under load (the default for evals).
    #[default]
    Batch,
    /// Served like an employee's request: for latency measurements.
    Interactive,
}

impl Priority {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Batch => "batch",
            Priority::Interactive => "interactive",
        }
    }
}

/// How many times one request is retried after a `429` or `503` answer.
pub const MAX_RETRIES: u32 = 5;
/// The longest wait before a retry, whatever `Retry-After` asks for.
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);
/// The wait before a retry when the answer has no usable `Retry-After` (delay-seconds).
pub const DEFAULT_RETRY_WAIT: Duration = Duration::from_secs(1);

/// The wait a `Retry-After` header value asks for (delay-seconds; an HTTP date or garbage gets
/// [`DEFAULT_RETRY_WAIT`]), capped at [`MAX_RETRY_WAIT`].
pub fn retry_wait(retry_after: Option<&str>) -> Duration {
    retry_after
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_RETRY_WAIT, Duration::from_secs)
        .min(MAX_RETRY_WAIT)
}

/// Where retry notices go (one line each).
pub type RetryLog = Arc<dyn Fn(&str) + Send + Sync>;

/// The body of a request.
enum Body<'a> {
    None,
    Json(&'a Value),
    Ndjson(&'a str),
    /// A file's bytes with its media type.
    File(&'a [u8], &'a str),
}

/// How an HTTPS daemon is verified, and the client certificate shown to it.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM file of the CA certificate(s) the daemon's certificate must chain to. Required for an
    /// `https://` base: there are no default roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM certificate chain presented to the daemon (its `tls.client_ca` must trust it).
    pub client_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    pub client_key: Option<std::path::PathBuf>,
}

impl TlsOptions {
    /// The ureq TLS configuration: only the CA file's roots; the client certificate if given.
    fn config(&self) -> Result<ureq::tls::TlsConfig, String> {
        use ureq::tls::{PemItem, RootCerts, TlsConfig, TlsProvider, parse_pem};
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()))
        };
        let pem_items = |p: &std::path::Path| -> Result<Vec<PemItem<'static>>, String> {
            parse_pem(&read(p)?)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{}: {e}", p.display()))
        };
        let certs_of =
            |p: &std::path::Path| -> Result<Vec<ureq::tls::Certificate<'static>>, String> {
                let certs: Vec<_> = pem_items(p)?
                    .into_iter()
                    .filter_map(|i| match i {
                        PemItem::Certificate(c) => Some(c),
                        _ => None,
                    })
                    .collect();
                if certs.is_empty() {
                    return Err(format!("{}: no CERTIFICATE in the PEM file", p.display()));
                }
                Ok(certs)
            };
        let roots = match &self.ca_file {
            Some(p) => RootCerts::new_with_certs(&certs_of(p)?),
            // No CA file: nothing is trusted, so every HTTPS handshake fails.
            None => RootCerts::new_with_certs(&[]),
        };
        let client_cert = match (&self.client_cert, &self.client_key) {
            (Some(c), Some(k)) => {
                let key = pem_items(k)?
                    .into_iter()
                    .find_map(|i| match i {
                        PemItem::PrivateKey(k) => Some(k),
                        _ => None,
                    })
                    .ok_or_else(|| format!("{}: no PRIVATE KEY in the PEM file", k.display()))?;
                Some(ureq::tls::ClientCert::new_with_certs(&certs_of(c)?, key))
            }
            (None, None) => None,
            _ => return Err("a client certificate needs both its certificate and key".into()),
        };
        Ok(TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .root_certs(roots)
            .client_cert(client_cert)
            .build())
    }
}

/// A client bound to one daemon.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    priority: Priority,
    retry_log: RetryLog,
}

impl Client {
    /// A client for `base` (e.g. `http://127.0.0.1:8080`), with a generous per-call timeout,
    /// batch priority and retry notices on stderr.
    pub fn new(base: &str, timeout: Duration) -> Self {
        Self::with_tls(base, timeout, &TlsOptions::default())
            .expect("no TLS files to read: cannot fail")
    }

    /// [`Client::new`] verifying an `https://` daemon as `tls` says. Errors: a file of `tls`
    /// cannot be read or holds no certificate (key).
    pub fn with_tls(base: &str, timeout: Duration, tls: &TlsOptions) -> Result<Self, String> {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .tls_config(tls.config()?)
            .build()
            .into();
        Ok(Client {
            base: base.trim_end_matches('/').to_owned(),
            agent,
            priority: Priority::Batch,
            retry_log: Arc::new(|line| eprintln!("{line}")),
        })
    }

    /// `GET /readyz` once: `Err` says why it failed (TLS, connection, status).
    pub fn probe_ready(&self) -> Result<(), ApiError> {
        self.request("GET", "/readyz", None, Body::None, false)
            .map(|_| ())
    }

    /// The same client asking for `priority`.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// The same client sending retry notices to `log`.
    pub fn with_retry_log(mut self, log: RetryLog) -> Self {
        self.retry_log = log;
        self
    }

    fn finish(
        &self,
        method: &'static str,
        path: &str,
        res: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, ApiError> {
        let transport = |message: String| ApiError::Transport {
            method,
            path: path.to_owned(),
            message,
        };
        let mut res = res.map_err(|e| transport(e.to_string()))?;
        let status = res.status().as_u16();
        let text = res
            .body_mut()
            .read_to_string()
            .map_err(|e| transport(e.to_string()))?;
        let body: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).map_err(|e| transport(format!("bad JSON body: {e}")))?
        };
        if (200..300).contains(&status) {
            return Ok(body);
        }
        let slug = body["type"]
            .as_str()
            .and_then(|t| t.rsplit('/').next())
            .unwrap_or("")
            .to_owned();
        Err(ApiError::Status {
            method,
            path: path.to_owned(),
            status,
            slug,
            detail: body["detail"].as_str().unwrap_or("").to_owned(),
        })
    }

    fn send_once(
        &self,
        method: &'static str,
        path: &str,
        token: Option<&str>,
        body: &Body<'_>,
        extra: &[(&str, &str)],
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let url = format!("{}{}", self.base, path);
        let auth = token.map(|t| format!("Bearer {t}"));
        let priority = self.priority.as_str();
        macro_rules! headers {
            ($req:expr) => {{
                let mut req = $req.header("X-Airlock-Priority", priority);
                for (k, v) in extra {
                    req = req.header(*k, *v);
                }
                match &auth {
                    Some(a) => req.header("Authorization", a),
                    None => req,
                }
            }};
        }
        match (method, body) {
            ("GET", _) => headers!(self.agent.get(&url)).call(),
            ("DELETE", _) => headers!(self.agent.delete(&url)).call(),
            (m, b) => {
                let req = if m == "PUT" {
                    self.agent.put(&url)
                } else {
                    self.agent.post(&url)
                };
                let req = headers!(req);
                match b {
                    Body::None => req.send_empty(),
                    Body::Json(v) => req.send_json(v),
                    Body::Ndjson(t) => req.header("Content-Type", "application/x-ndjson").send(*t),
                    Body::File(b, ct) => req.header("Content-Type", *ct).send(*b),
                }
            }
        }
    }

    /// Sends a request, retrying `429` and `503` answers after their `Retry-After` (see the
    /// module docs); `retry: false` sends it once.
    fn request(
        &self,
        method: &'static str,
        path: &str,
        token: Option<&str>,
        body: Body<'_>,
        retry: bool,
    ) -> Result<Value, ApiError> {
        self.request_with(method, path, token, body, retry, &[])
    }

    /// [`Client::request`] with extra request headers.
    fn request_with(
        &self,
        method: &'static str,
        path: &str,
        token: Option<&str>,
        body: Body<'_>,
        retry: bool,
        extra: &[(&str, &str)],
    ) -> Result<Value, ApiError> {
        let mut retries = 0;
        loop {
            let res = self.send_once(method, path, token, &body, extra);
            if let Ok(r) = &res {
                let status = r.status().as_u16();
                if retry && matches!(status, 429 | 503) && retries < MAX_RETRIES {
                    retries += 1;
                    let after = r.headers().get("retry-after").and_then(|v| v.to_str().ok());
                    let wait = retry_wait(after);
                    (self.retry_log)(&format!(
                        "{method} {path}: HTTP {status}, retry {retries}/{MAX_RETRIES} in {} s",
                        wait.as_secs_f64()
                    ));
                    std::thread::sleep(wait);
                    continue;
                }
            }
            return self.finish(method, path, res);
        }
    }

    /// One request to a running daemon (the CLI's operator commands, e.g. `airlock
    /// connectors`): `GET` or `POST` with an optional JSON body, sent once (no retry), the JSON
    /// answer or the problem's status, slug and detail.
    pub fn call(
        &self,
        method: &'static str,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let body = body.map_or(Body::None, Body::Json);
        self.request(method, path, Some(token), body, false)
    }

    fn send_json(
        &self,
        method: &'static str,
        path: &str,
        token: &str,
        body: &Value,
    ) -> Result<Value, ApiError> {
        self.request(method, path, Some(token), Body::Json(body), true)
    }

    /// `GET /readyz` succeeded (asked once: a probe is not retried).
    pub fn ready(&self) -> bool {
        self.request("GET", "/readyz", None, Body::None, false)
            .is_ok()
    }

    /// `GET /v1/info` as `token`: the installed bundle's version, if the daemon reports one.
    pub fn bundle_version(&self, token: &str) -> Result<Option<String>, ApiError> {
        let v = self.request("GET", "/v1/info", Some(token), Body::None, true)?;
        Ok(v["bundle_version"].as_str().map(str::to_owned))
    }

    /// `PUT /v1/documents/{id}` (admin).
    pub fn put_document(
        &self,
        admin: &str,
        doc_id: &str,
        title: &str,
        text: &str,
        metadata: &Value,
    ) -> Result<Value, ApiError> {
        let body = json!({"title": title, "text": text, "metadata": metadata});
        self.send_json("PUT", &format!("/v1/documents/{doc_id}"), admin, &body)
    }

    /// `PUT /v1/documents/{id}` with a file's bytes as the body (admin): the daemon extracts
    /// it under its `[extract]` limits. `doc_id` is percent-encoded into the path (a folder's
    /// relative path keeps its `/`).
    pub fn put_document_file(
        &self,
        admin: &str,
        doc_id: &str,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<Value, ApiError> {
        let path = format!("/v1/documents/{}", percent_encode(doc_id));
        self.request(
            "PUT",
            &path,
            Some(admin),
            Body::File(bytes, media_type),
            true,
        )
    }

    /// `DELETE /v1/documents/{id}` (admin).
    pub fn delete_document(&self, admin: &str, doc_id: &str) -> Result<(), ApiError> {
        let path = format!("/v1/documents/{doc_id}");
        self.request("DELETE", &path, Some(admin), Body::None, true)
            .map(|_| ())
    }

    /// `POST /v1/acl/sync` with a JSON Lines snapshot (admin); returns the counts.
    pub fn acl_sync(&self, admin: &str, ndjson: &str) -> Result<Value, ApiError> {
        self.request(
            "POST",
            "/v1/acl/sync",
            Some(admin),
            Body::Ndjson(ndjson),
            true,
        )
    }

    /// `PUT /v1/acl/users/{id}` (admin).
    pub fn put_user(&self, admin: &str, user: &str, groups: &[String]) -> Result<(), ApiError> {
        self.send_json(
            "PUT",
            &format!("/v1/acl/users/{user}"),
            admin,
            &json!({"groups": groups}),
        )
        .map(|_| ())
    }

    /// `POST /v1/acl/users/{id}/token` (admin): issues (rotates) a user's token.
    pub fn issue_token(&self, admin: &str, user: &str) -> Result<String, ApiError> {
        self.issue_token_approved(admin, None, user)
    }

    /// [`Client::issue_token`], approved first by `approver` (a second admin's token) when
    /// given: the daemon asks a second person's approval for a token of a user with access
    /// (`POST /v1/acl/approvals`, then `X-Airlock-Approval`).
    pub fn issue_token_approved(
        &self,
        admin: &str,
        approver: Option<&str>,
        user: &str,
    ) -> Result<String, ApiError> {
        let path = format!("/v1/acl/users/{user}/token");
        let approval = match approver {
            Some(a) => {
                let body = json!({"action": "token_issue", "user_id": user});
                let v = self.send_json("POST", "/v1/acl/approvals", a, &body)?;
                v["approval"].as_str().map(str::to_owned)
            }
            None => None,
        };
        let extra: Vec<(&str, &str)> = approval
            .as_deref()
            .map(|a| ("X-Airlock-Approval", a))
            .into_iter()
            .collect();
        let v = self.request_with(
            "POST",
            &path,
            Some(admin),
            Body::Json(&json!({})),
            true,
            &extra,
        )?;
        v["token"]
            .as_str()
            .map(str::to_owned)
            .ok_or(ApiError::Transport {
                method: "POST",
                path,
                message: "no token in the response".into(),
            })
    }

    /// `POST /v1/retrieve` as `token`.
    pub fn retrieve(
        &self,
        token: &str,
        query: &str,
        top_k: usize,
        mode: &str,
    ) -> Result<RetrieveResponse, ApiError> {
        self.retrieve_after(token, &[], query, top_k, mode)
    }

    /// `POST /v1/retrieve` as `token` for `query` asked after `history` (sent as `messages`,
    /// so the daemon builds the retrieval query as for a chat).
    pub fn retrieve_after(
        &self,
        token: &str,
        history: &[Turn],
        query: &str,
        top_k: usize,
        mode: &str,
    ) -> Result<RetrieveResponse, ApiError> {
        self.retrieve_as(token, history, query, top_k, mode, false)
    }

    /// [`Client::retrieve_after`], with each chunk's full text when `include_text` (for a
    /// prompt of the client's own: the plain baseline).
    pub fn retrieve_as(
        &self,
        token: &str,
        history: &[Turn],
        query: &str,
        top_k: usize,
        mode: &str,
        include_text: bool,
    ) -> Result<RetrieveResponse, ApiError> {
        let mut body = retrieve_body(history, query, mode);
        body["top_k"] = json!(top_k);
        if include_text {
            body["include_text"] = json!(true);
        }
        self.post_retrieve(token, &body)
    }

    /// `POST /v1/retrieve` with `body`, its response parsed.
    fn post_retrieve(&self, token: &str, body: &Value) -> Result<RetrieveResponse, ApiError> {
        let path = "/v1/retrieve";
        let v = self.send_json("POST", path, token, body)?;
        serde_json::from_value(v).map_err(|e| ApiError::Transport {
            method: "POST",
            path: path.into(),
            message: format!("unexpected retrieve body: {e}"),
        })
    }

    /// The chunks a chat answer to `query` would place in its prompt (`POST /v1/retrieve` with
    /// `prompt_sources`: the chat's source selection, the chat's `top_k`), as `token`.
    pub fn prompt_sources(
        &self,
        token: &str,
        history: &[Turn],
        query: &str,
        mode: &str,
    ) -> Result<RetrieveResponse, ApiError> {
        let mut body = retrieve_body(history, query, mode);
        body["prompt_sources"] = json!(true);
        self.post_retrieve(token, &body)
    }

    /// `POST /v1/chat/completions` (non-streaming, greedy) as `token`.
    pub fn chat(
        &self,
        token: &str,
        model: Option<&str>,
        history: &[Turn],
        question: &str,
        rung: Option<u8>,
        max_tokens: u32,
    ) -> Result<ChatOutcome, ApiError> {
        let body = json!({
            "messages": messages(history, question),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "airlock": {"retrieval": true, "rung": rung, "source_text": true},
        });
        self.completion(token, model, body)
    }

    /// `POST /v1/chat/completions` without retrieval (`airlock.retrieval: false`, greedy): one
    /// user message holding `prompt`, as a client with its own prompt (the plain baseline)
    /// sends it.
    pub fn chat_plain(
        &self,
        token: &str,
        model: Option<&str>,
        prompt: &str,
        rung: Option<u8>,
        max_tokens: u32,
    ) -> Result<ChatOutcome, ApiError> {
        let body = json!({
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "airlock": {"retrieval": false, "rung": rung},
        });
        self.completion(token, model, body)
    }

    fn completion(
        &self,
        token: &str,
        model: Option<&str>,
        mut body: serde_json::Value,
    ) -> Result<ChatOutcome, ApiError> {
        let path = "/v1/chat/completions";
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        let t = Instant::now();
        let v = self.send_json("POST", path, token, &body)?;
        let latency_ms = t.elapsed().as_secs_f64() * 1e3;
        let citations =
            serde_json::from_value(v["airlock"]["citations"].clone()).unwrap_or_default();
        Ok(ChatOutcome {
            answer: v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            citations,
            cited: serde_json::from_value(v["airlock"]["cited"].clone()).ok(),
            rung: v["airlock"]["rung"].as_u64().map(|r| r as u8),
            bundle_version: v["airlock"]["bundle_version"].as_str().map(str::to_owned),
            latency_ms,
            stages_ms: chat_stages(&v["airlock"]["timings_ms"]),
            source_texts: serde_json::from_value(v["airlock"]["source_texts"].clone()).ok(),
        })
    }
}

/// `s` with every byte outside RFC 3986's unreserved set percent-encoded (a path segment).
fn percent_encode(s: &str) -> String {
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

/// The generation stages of `timings_ms` (absent when the answer was given without running the
/// model: its `first_token` is 0 and says nothing about time to first token).
fn chat_stages(t: &serde_json::Value) -> Vec<(&'static str, f64)> {
    if t["first_token"].as_f64().is_none_or(|ms| ms <= 0.0) {
        return Vec::new();
    }
    CHAT_STAGES
        .iter()
        .filter_map(|&k| t[k].as_f64().map(|ms| (k, ms)))
        .collect()
}

/// OpenAI chat messages: the earlier turns, then the question.
fn messages(history: &[Turn], question: &str) -> serde_json::Value {
    let mut out: Vec<serde_json::Value> = history
        .iter()
        .map(|t| {
            let role = match t.role {
                TurnRole::User => "user",
                TurnRole::Assistant => "assistant",
            };
            json!({"role": role, "content": t.content})
        })
        .collect();
    out.push(json!({"role": "user", "content": question}));
    serde_json::Value::Array(out)
}

/// A `POST /v1/retrieve` body for `query` after `history` (a conversation when there is one).
fn retrieve_body(history: &[Turn], query: &str, mode: &str) -> Value {
    if history.is_empty() {
        json!({"query": query, "mode": mode})
    } else {
        json!({"messages": messages(history, query), "mode": mode})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::Mutex;

    /// One request as the server saw it: head (lower-cased) and when it arrived.
    struct Seen {
        head: String,
        at: Instant,
    }

    /// A real HTTP/1.1 server on a loopback port answering the scripted responses (status,
    /// extra header lines, body) in order, one per connection, then closing. Returns its base
    /// URL and what it saw.
    fn server(script: Vec<(u16, &'static str, &'static str)>) -> (String, Arc<Mutex<Vec<Seen>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for (status, headers, body) in script {
                let Ok((stream, _)) = listener.accept() else {
                    return;
                };
                let mut reader = BufReader::new(stream);
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line.to_ascii_lowercase());
                }
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                let mut buf = vec![0; len];
                let _ = reader.read_exact(&mut buf);
                log.lock().unwrap().push(Seen {
                    head,
                    at: Instant::now(),
                });
                let mut stream = reader.into_inner();
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n{body}",
                    body.len()
                );
            }
        });
        (base, seen)
    }

    fn client(base: &str, lines: &Arc<Mutex<Vec<String>>>) -> Client {
        let lines = lines.clone();
        Client::new(base, Duration::from_secs(10))
            .with_retry_log(Arc::new(move |l| lines.lock().unwrap().push(l.to_owned())))
    }

    #[test]
    fn sends_batch_priority_and_retries_503_after_retry_after() {
        let (base, seen) = server(vec![
            (503, "Retry-After: 1\r\n", r#"{"type":"x/overloaded"}"#),
            (200, "", r#"{"results":[]}"#),
        ]);
        let lines = Arc::new(Mutex::new(Vec::new()));
        let r = client(&base, &lines)
            .retrieve("tok", "q", 5, "hybrid")
            .unwrap();
        assert!(r.results.is_empty());
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "one retry");
        for s in seen.iter() {
            assert!(
                s.head.contains("x-airlock-priority: batch\r\n"),
                "{}",
                s.head
            );
            assert!(
                s.head.contains("authorization: bearer tok\r\n"),
                "{}",
                s.head
            );
        }
        let waited = seen[1].at - seen[0].at;
        assert!(waited >= Duration::from_millis(950), "{waited:?}");
        assert_eq!(
            *lines.lock().unwrap(),
            ["POST /v1/retrieve: HTTP 503, retry 1/5 in 1 s"]
        );
    }

    #[test]
    fn retries_429_a_bounded_number_of_times_and_never_other_errors() {
        let script = vec![(429, "Retry-After: 0\r\n", "{}"); MAX_RETRIES as usize + 2];
        let (base, seen) = server(script);
        let lines = Arc::new(Mutex::new(Vec::new()));
        let err = client(&base, &lines).issue_token("adm", "u1").unwrap_err();
        assert_eq!(err.status(), Some(429));
        assert_eq!(seen.lock().unwrap().len(), 1 + MAX_RETRIES as usize);
        assert_eq!(lines.lock().unwrap().len(), MAX_RETRIES as usize);

        for status in [500, 502, 504, 400, 401] {
            let (base, seen) = server(vec![(status, "Retry-After: 0\r\n", "{}"), (200, "", "{}")]);
            let err = client(&base, &lines)
                .put_user("adm", "u1", &[])
                .unwrap_err();
            assert_eq!(err.status(), Some(status));
            assert_eq!(
                seen.lock().unwrap().len(),
                1,
                "HTTP {status} is not retried"
            );
        }
    }

    #[test]
    fn interactive_priority_and_unretried_readiness_probe() {
        let (base, seen) = server(vec![(200, "", "{}")]);
        let lines = Arc::new(Mutex::new(Vec::new()));
        let c = client(&base, &lines).with_priority(Priority::Interactive);
        c.delete_document("adm", "d1").unwrap();
        assert!(
            seen.lock().unwrap()[0]
                .head
                .contains("x-airlock-priority: interactive\r\n")
        );
        let (base, seen) = server(vec![(503, "Retry-After: 0\r\n", "{}"), (200, "", "{}")]);
        assert!(!client(&base, &lines).ready(), "a probe reports, not waits");
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[test]
    fn retry_wait_is_capped_and_defaults() {
        assert_eq!(retry_wait(Some("3")), Duration::from_secs(3));
        assert_eq!(retry_wait(Some(" 0 ")), Duration::ZERO);
        assert_eq!(retry_wait(Some("86400")), MAX_RETRY_WAIT);
        assert_eq!(
            retry_wait(Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            DEFAULT_RETRY_WAIT
        );
        assert_eq!(retry_wait(None), DEFAULT_RETRY_WAIT);
    }
}
