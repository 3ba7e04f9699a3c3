//! A small blocking client for the daemon's public HTTP API (the subset evals need).
//!
//! Evals go through the same API as users, so they measure what users get. Loopback only in
//! practice; no TLS is compiled in.

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
}

/// A client bound to one daemon.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
}

impl Client {
    /// A client for `base` (e.g. `http://127.0.0.1:8080`), with a generous per-call timeout.
    pub fn new(base: &str, timeout: Duration) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build()
            .into();
        Client {
            base: base.trim_end_matches('/').to_owned(),
            agent,
        }
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

    fn send_json(
        &self,
        method: &'static str,
        path: &str,
        token: &str,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let url = format!("{}{}", self.base, path);
        let auth = format!("Bearer {token}");
        let res = match method {
            "PUT" => self
                .agent
                .put(&url)
                .header("Authorization", &auth)
                .send_json(body),
            _ => self
                .agent
                .post(&url)
                .header("Authorization", &auth)
                .send_json(body),
        };
        self.finish(method, path, res)
    }

    /// `GET /readyz` succeeded.
    pub fn ready(&self) -> bool {
        let path = "/readyz";
        let res = self.agent.get(format!("{}{path}", self.base)).call();
        self.finish("GET", path, res).is_ok()
    }

    /// `GET /v1/info` as `token`: the installed bundle's version, if the daemon reports one.
    pub fn bundle_version(&self, token: &str) -> Result<Option<String>, ApiError> {
        let path = "/v1/info";
        let res = self
            .agent
            .get(format!("{}{path}", self.base))
            .header("Authorization", &format!("Bearer {token}"))
            .call();
        let v = self.finish("GET", path, res)?;
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

    /// `DELETE /v1/documents/{id}` (admin).
    pub fn delete_document(&self, admin: &str, doc_id: &str) -> Result<(), ApiError> {
        let path = format!("/v1/documents/{doc_id}");
        let res = self
            .agent
            .delete(format!("{}{path}", self.base))
            .header("Authorization", &format!("Bearer {admin}"))
            .call();
        self.finish("DELETE", &path, res).map(|_| ())
    }

    /// `POST /v1/acl/sync` with a JSON Lines snapshot (admin); returns the counts.
    pub fn acl_sync(&self, admin: &str, ndjson: &str) -> Result<Value, ApiError> {
        let path = "/v1/acl/sync";
        let res = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("Authorization", &format!("Bearer {admin}"))
            .header("Content-Type", "application/x-ndjson")
            .send(ndjson);
        self.finish("POST", path, res)
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
        let path = format!("/v1/acl/users/{user}/token");
        let v = self.send_json("POST", &path, admin, &json!({}))?;
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
        let path = "/v1/retrieve";
        let body = if history.is_empty() {
            json!({"query": query, "top_k": top_k, "mode": mode})
        } else {
            json!({"messages": messages(history, query), "top_k": top_k, "mode": mode})
        };
        let v = self.send_json("POST", path, token, &body)?;
        serde_json::from_value(v).map_err(|e| ApiError::Transport {
            method: "POST",
            path: path.into(),
            message: format!("unexpected retrieve body: {e}"),
        })
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
        let path = "/v1/chat/completions";
        let mut body = json!({
            "messages": messages(history, question),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "airlock": {"retrieval": true, "rung": rung},
        });
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
        })
    }
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
