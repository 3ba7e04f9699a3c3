//! An upstream chat-completion stream (SSE) as the engine's events: one `Token` per content
//! delta, then `Done` with the upstream's usage. Timeouts (first token, between tokens) and a
//! stream that ends without its end are `Done` with an error, counted against the replica's
//! breaker. Dropping the stream closes the upstream connection at once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_inference::generate::{Event as GenEvent, FinishReason, Usage};

use super::replica::Replica;
use super::{RemoteGenerator, ReplicaLabel};
use crate::rack_metrics::RackMetrics;
use airlock_platform::egress::Open;

/// A replica slot, held from the pick to the end of the request.
pub struct Lease {
    pub(super) generator: Arc<RemoteGenerator>,
    pub(super) replica: Arc<Replica>,
    /// Whether an outcome was recorded.
    pub(super) settled: bool,
}

impl Lease {
    /// The replica.
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// Records the outcome (once) and counts an error in the metrics.
    pub(super) fn settle(&mut self, error: bool, metrics: &RackMetrics) {
        if self.settled {
            return;
        }
        self.settled = true;
        let label = ReplicaLabel {
            backend: self.generator.alias.clone(),
            replica: self.replica.upstream.authority(),
        };
        if error {
            metrics.errors.get_or_create(&label).inc();
        }
        if self.replica.record(error) {
            metrics.breaker_opened.get_or_create(&label).inc();
            tracing::warn!(backend = %self.generator.alias, replica = %label.replica,
                "circuit breaker opened");
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.settled {
            self.replica.abandoned();
        }
        self.replica.release();
        self.generator.slot_freed();
    }
}

/// An upstream generation in flight.
pub struct RemoteStream {
    pub(super) open: Open,
    pub(super) lease: Lease,
    pub(super) metrics: RackMetrics,
    pub(super) sent_at: Instant,
    pub(super) first_token_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) prompt_estimate: usize,
    pub(super) buf: Vec<u8>,
    pub(super) pending: VecDeque<GenEvent>,
    pub(super) tokens: usize,
    pub(super) last_token_at: Instant,
    pub(super) finish: Option<String>,
    pub(super) usage: Option<Usage>,
    pub(super) ended: bool,
}

impl RemoteStream {
    /// The replica serving it.
    pub fn replica(&self) -> &Arc<Replica> {
        self.lease.replica()
    }

    /// When the request was sent to the replica (its slot was taken).
    pub fn sent_at(&self) -> Instant {
        self.sent_at
    }

    /// The next event; `None` after `Done`.
    pub async fn recv(&mut self) -> Option<GenEvent> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Some(ev);
            }
            if self.ended {
                return None;
            }
            if let Some(end) = event_end(&self.buf) {
                let raw: Vec<u8> = self.buf.drain(..end).collect();
                self.event(&raw);
                continue;
            }
            // Deadlines count from the request and from the last token, not from the last
            // bytes: an engine's SSE pings (llama-cpp-python sends them) are no progress.
            let deadline = if self.tokens == 0 {
                self.sent_at + self.first_token_timeout
            } else {
                self.last_token_at + self.idle_timeout
            };
            let wait = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(wait, self.open.data()).await {
                Err(_) => {
                    let what = if self.tokens == 0 {
                        "no first token"
                    } else {
                        "no token"
                    };
                    self.fail(format!(
                        "{what} from the upstream within {} ms",
                        wait.as_millis()
                    ));
                }
                Ok(None) => {
                    if self.finish.is_some() {
                        self.succeed();
                    } else {
                        self.fail("the upstream stream ended before its end".into());
                    }
                }
                Ok(Some(Err(e))) => self.fail(format!("reading the upstream stream: {e}")),
                Ok(Some(Ok(data))) => {
                    if self.buf.len() + data.len() > 1 << 20 {
                        self.fail("an upstream SSE event over 1 MiB".into());
                    } else {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    fn event(&mut self, raw: &[u8]) {
        match parse_event(raw) {
            Parsed::Nothing => {}
            Parsed::Done => self.succeed(),
            Parsed::Error(e) => self.fail(e),
            Parsed::Chunk {
                piece,
                finish,
                usage,
            } => {
                if usage.is_some() {
                    self.usage = usage;
                }
                if let Some(piece) = piece {
                    if self.tokens == 0 {
                        let ttft = self.sent_at.elapsed();
                        self.lease.replica.observe_ttft(ttft);
                        self.metrics
                            .ttft
                            .get_or_create(&super::BackendLabel {
                                backend: self.lease.generator.alias.clone(),
                            })
                            .observe(ttft.as_secs_f64());
                    }
                    self.tokens += 1;
                    self.last_token_at = Instant::now();
                    self.pending.push_back(GenEvent::Token {
                        id: 0,
                        text: Some(piece),
                        step: 0,
                    });
                }
                if finish.is_some() {
                    self.finish = finish;
                }
            }
        }
    }

    fn succeed(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.lease.settle(false, &self.metrics);
        let reason = match self.finish.as_deref() {
            Some("length") => FinishReason::Length,
            _ => FinishReason::Stop,
        };
        let usage = self.usage.unwrap_or(Usage {
            prompt_tokens: self.prompt_estimate,
            completion_tokens: self.tokens,
        });
        self.pending.push_back(GenEvent::Done {
            reason,
            usage,
            text: None,
        });
    }

    fn fail(&mut self, why: String) {
        if self.ended {
            return;
        }
        self.ended = true;
        tracing::error!(backend = %self.lease.generator.alias,
            replica = %self.lease.replica.upstream.authority(), tokens = self.tokens,
            error = %why, "upstream generation failed");
        self.lease.settle(true, &self.metrics);
        self.pending.push_back(GenEvent::Done {
            reason: FinishReason::Error(why),
            usage: Usage {
                prompt_tokens: self.usage.map_or(self.prompt_estimate, |u| u.prompt_tokens),
                completion_tokens: self.tokens,
            },
            text: None,
        });
    }
}

/// What one SSE event of an OpenAI-compatible chat stream says.
#[derive(Debug, PartialEq)]
#[doc(hidden)]
pub enum Parsed {
    /// A comment (ping) or an event without data.
    Nothing,
    /// `data: [DONE]`.
    Done,
    /// An error object, or data that is not JSON.
    Error(String),
    /// A `chat.completion.chunk`.
    Chunk {
        piece: Option<String>,
        finish: Option<String>,
        usage: Option<Usage>,
    },
}

#[doc(hidden)]
pub fn parse_event(raw: &[u8]) -> Parsed {
    let text = String::from_utf8_lossy(raw);
    // One JSON object per event; multi-line data is joined as the SSE spec says.
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return Parsed::Nothing;
    }
    let data = data.join("\n");
    let data = data.trim();
    if data == "[DONE]" {
        return Parsed::Done;
    }
    let v: serde_json::Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => return Parsed::Error(format!("an upstream event is not JSON: {e}")),
    };
    if let Some(err) = v.get("error") {
        return Parsed::Error(format!("the upstream reported an error: {err}"));
    }
    let usage = v.get("usage").filter(|u| u.is_object()).map(|u| {
        let n = |k: &str| u.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0) as usize;
        Usage {
            prompt_tokens: n("prompt_tokens"),
            completion_tokens: n("completion_tokens"),
        }
    });
    let choice = v.get("choices").and_then(|c| c.get(0));
    let piece = choice
        .and_then(|c| c.pointer("/delta/content"))
        .and_then(serde_json::Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let finish = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_string);
    Parsed::Chunk {
        piece,
        finish,
        usage,
    }
}

/// The end (after the blank line) of the first complete SSE event in `buf`.
#[doc(hidden)]
pub fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::{Parsed, Usage, event_end, parse_event};

    #[test]
    fn chunks_usage_pings_and_errors_parse() {
        let c = parse_event(
            br#"data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#,
        );
        assert_eq!(
            c,
            Parsed::Chunk {
                piece: Some("Hi".into()),
                finish: None,
                usage: None
            }
        );
        // vLLM's last chunk with stream_options.include_usage: no choices, the usage.
        let u = parse_event(
            br#"data: {"choices":[],"usage":{"prompt_tokens":412,"completion_tokens":17,"total_tokens":429}}"#,
        );
        assert_eq!(
            u,
            Parsed::Chunk {
                piece: None,
                finish: None,
                usage: Some(Usage {
                    prompt_tokens: 412,
                    completion_tokens: 17
                })
            }
        );
        let f = parse_event(br#"data: {"choices":[{"delta":{},"finish_reason":"length"}]}"#);
        assert!(matches!(f, Parsed::Chunk { finish: Some(ref r), .. } if r == "length"));
        assert_eq!(parse_event(b": ping - 2024-01-01\r\n"), Parsed::Nothing);
        assert_eq!(parse_event(b"data: [DONE]"), Parsed::Done);
        assert!(matches!(
            parse_event(br#"data: {"error":{"message":"boom"}}"#),
            Parsed::Error(_)
        ));
        assert!(matches!(parse_event(b"data: {oops"), Parsed::Error(_)));
    }

    #[test]
    fn sse_events_end_at_a_blank_line() {
        assert_eq!(event_end(b"data: x\n\ndata: y"), Some(9));
        assert_eq!(event_end(b"data: x\r\n\r\n"), Some(11));
        assert_eq!(event_end(b"data: x\n"), None);
    }
}
