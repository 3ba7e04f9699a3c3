//! A generation in flight and its two answer shapes: a complete `chat.completion` and the SSE
//! stream of `chat.completion.chunk` events (keep-alives, cancellation on disconnect, the
//! idle watchdog), plus the answer given without generation when no source is relevant.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use airlock_inference::generate::{
    EngineCounters, Event as GenEvent, FinishReason, Stream, Usage as GenUsage,
};
use airlock_rag::{Attribution, CitedBy, prompt};
use axum::Json;
use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use crate::admission::{QueueSlot, Ticket};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::openai::{
    AirlockResponse, ChatChunk, ChatResponse, ChunkAirlock, ChunkChoice, Delta, PassageUpdate,
    Usage, unix_now,
};
use crate::quota::TokenReservation;
use crate::routes::RUNG_HEADER;

use super::receipt::Closer;
use super::{CITATION_SNIPPET_BYTES, TurnRecorder};

/// The answer when no readable source is relevant enough (see `min_source_similarity`): the
/// system prompt's own abstention, without generation, in the shape the client asked for.
pub(super) fn no_source_answer(
    stream: bool,
    include_usage: bool,
    id: String,
    model: String,
    airlock: AirlockResponse,
) -> Response {
    let usage = Usage {
        prompt_tokens: 0,
        completion_tokens: 0,
        total_tokens: 0,
    };
    if !stream {
        return Json(ChatResponse::answer(
            id,
            model,
            prompt::NO_SOURCE_ANSWER.to_string(),
            "stop",
            usage,
            airlock,
        ))
        .into_response();
    }
    let created = unix_now();
    let cited_by = airlock.cited_by.unwrap_or(CitedBy::NoSource);
    let first = head_event(&id, &model, created, airlock);
    let text = chunk(
        &id,
        &model,
        created,
        Delta {
            role: None,
            content: Some(prompt::NO_SOURCE_ANSWER.to_string()),
        },
        None,
    );
    let mut last = chunk(&id, &model, created, Delta::default(), Some("stop"));
    last.airlock = Some(ChunkAirlock::End {
        cited: Vec::new(),
        cited_by,
        passages: Vec::new(),
    });
    last.usage = Some(usage);
    let mut events: Vec<Result<SseEvent, Infallible>> =
        vec![Ok(data(&first)), Ok(data(&text)), Ok(data(&last))];
    if include_usage {
        events.push(Ok(data(&usage_chunk(&id, &model, created, usage))));
    }
    events.push(Ok(SseEvent::default().data("[DONE]")));
    Sse::new(futures::stream::iter(events)).into_response()
}

/// Adds `X-Airlock-Rung` (also on shed and deadline problems, so clients see why).
pub(super) fn with_rung(mut resp: Response, rung: u8) -> Response {
    resp.headers_mut()
        .insert(RUNG_HEADER, HeaderValue::from(u16::from(rung)));
    resp
}

/// Where a generation's events come from.
pub(super) enum Source {
    /// The in-process engine.
    Local {
        /// The sequence's events (dropping it cancels the sequence).
        stream: Stream,
        /// The engine's counters: its step count tells a slow prefill or a queue (steps
        /// advance) from a stuck engine (they do not).
        engine: std::sync::Arc<EngineCounters>,
    },
    /// A remote generator's upstream stream (dropping it closes the upstream connection); it
    /// enforces its own first-token and between-token timeouts.
    Remote(Box<crate::remote::RemoteStream>),
}

/// One generation in flight: owns the engine stream (dropping it cancels the sequence), the
/// admission ticket and the timing.
pub(super) struct Generation {
    pub(super) source: Source,
    /// The alias of the generator producing it (the `backend` label of token metrics).
    pub(super) backend: String,
    /// How long the generation may make no progress before it is ended.
    pub(super) idle_timeout: Duration,
    pub(super) first: Option<GenEvent>,
    pub(super) ticket: Ticket,
    /// Held from submission until the engine admits the sequence (the ladder's queue-wait
    /// signal and queue depth).
    pub(super) queue: Option<QueueSlot>,
    /// When the engine admitted the sequence (its prefill started).
    pub(super) admitted_at: Option<Instant>,
    pub(super) reservation: Option<TokenReservation>,
    pub(super) prompt_tokens: usize,
    /// Prompt + completion tokens as the engine reported them at the end.
    pub(super) used: Option<usize>,
    pub(super) metrics: Metrics,
    pub(super) t0: Instant,
    pub(super) submitted: Instant,
    pub(super) first_token_at: Option<Instant>,
    pub(super) tokens: usize,
    pub(super) finished: bool,
    /// Adds the answer to the thread it was asked in, when it completes.
    pub(super) recorder: Option<TurnRecorder>,
    /// Completes the answer's receipt before the answer is acknowledged as complete.
    pub(super) receipt: Option<Closer>,
}

impl Generation {
    /// The next event for the client: tokens, preemptions and the end. The engine's admission
    /// event is consumed here (it ends the queue wait).
    async fn next(&mut self) -> Option<GenEvent> {
        loop {
            let ev = match self.first.take() {
                Some(ev) => Some(ev),
                None => self.recv_watched().await,
            };
            if let Some(GenEvent::Admitted { .. }) = ev {
                self.admitted(Instant::now());
                continue;
            }
            self.account(&ev);
            return ev;
        }
    }

    /// The engine admitted the sequence at `at`: the queue wait ends.
    fn admitted(&mut self, at: Instant) {
        if self.admitted_at.is_none() {
            self.admitted_at = Some(at);
        }
        self.queue = None;
    }

    /// When the engine admitted the sequence; the first token's time when the engine's event
    /// was not seen.
    fn admission_time(&self, first_token: Instant) -> Instant {
        self.admitted_at.unwrap_or(first_token)
    }

    fn account(&mut self, ev: &Option<GenEvent>) {
        match ev {
            Some(GenEvent::Token { .. }) => {
                self.tokens += 1;
                if self.first_token_at.is_none() {
                    let now = Instant::now();
                    self.first_token_at = Some(now);
                    self.queue = None;
                    let admitted = self.admission_time(now);
                    self.metrics.ttft.observe((now - self.t0).as_secs_f64());
                    self.metrics
                        .observe_stage("first_token", (now - self.submitted).as_secs_f64());
                    self.metrics
                        .observe_stage("queue_wait", (admitted - self.submitted).as_secs_f64());
                    self.metrics
                        .observe_stage("prefill", (now - admitted).as_secs_f64());
                }
            }
            Some(GenEvent::Done { usage, .. }) => {
                self.finished = true;
                self.queue = None;
                self.used = Some(usage.prompt_tokens + usage.completion_tokens);
                if let Some(first) = self.first_token_at
                    && self.tokens > 1
                {
                    let per = first.elapsed().as_secs_f64() / (self.tokens - 1) as f64;
                    self.metrics.tpot.observe(per);
                }
                self.metrics.rack.count_tokens(
                    &self.backend,
                    usage.prompt_tokens,
                    usage.completion_tokens,
                );
                self.metrics
                    .generated_tokens
                    .inc_by(usage.completion_tokens as u64);
                self.metrics
                    .prompt_tokens
                    .inc_by(usage.prompt_tokens as u64);
            }
            Some(GenEvent::Preempted { .. } | GenEvent::Admitted { .. }) => {}
            None => self.finished = true,
        }
    }
}

impl Generation {
    /// The next engine event. The idle timeout measures the generation's progress, not bytes
    /// on the wire (keep-alive comments flow while a request queues or prefills): the wait
    /// only fails when neither this stream got an event nor the engine completed any step for
    /// `idle_timeout` (a stuck engine), and then ends the generation with an error.
    async fn recv_watched(&mut self) -> Option<GenEvent> {
        let (stream, engine) = match &mut self.source {
            Source::Local { stream, engine } => (stream, engine.clone()),
            Source::Remote(remote) => return remote.recv().await,
        };
        let waited =
            until_stalled(stream.recv(), || engine.snapshot().steps, self.idle_timeout).await;
        match waited {
            Ok(ev) => ev,
            Err(Stalled) => {
                tracing::error!(
                    idle_secs = self.idle_timeout.as_secs(),
                    tokens = self.tokens,
                    "the engine made no progress; ending the generation"
                );
                Some(GenEvent::Done {
                    reason: FinishReason::Error(format!(
                        "no engine progress for {} s",
                        self.idle_timeout.as_secs()
                    )),
                    usage: GenUsage {
                        prompt_tokens: self.prompt_tokens,
                        completion_tokens: self.tokens,
                    },
                    text: None,
                })
            }
        }
    }
}

/// [`until_stalled`] gave up: no progress for the whole idle timeout.
#[derive(Debug, PartialEq, Eq)]
struct Stalled;

/// Awaits `wait` while watching a progress counter (`steps`, sampled a few times per `idle`):
/// `Err(Stalled)` once `wait` has not finished and the counter has not moved for `idle`.
async fn until_stalled<F: std::future::Future>(
    wait: F,
    steps: impl Fn() -> u64,
    idle: Duration,
) -> Result<F::Output, Stalled> {
    let check = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut wait = std::pin::pin!(wait);
    let mut seen = steps();
    let mut progress_at = Instant::now();
    loop {
        if let Ok(out) = tokio::time::timeout(check, &mut wait).await {
            return Ok(out);
        }
        let now = steps();
        if now != seen {
            seen = now;
            progress_at = Instant::now();
        } else if progress_at.elapsed() >= idle {
            return Err(Stalled);
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            r.settle(self.used.unwrap_or(self.prompt_tokens + self.tokens));
        }
        if !self.finished {
            self.metrics.cancelled.inc();
            tracing::info!(
                rung = self.ticket.plan.rung,
                tokens = self.tokens,
                "client went away: generation cancelled"
            );
        }
    }
}

fn finish_reason(r: &FinishReason, remote: bool) -> Result<&'static str, ApiError> {
    match r {
        FinishReason::Stop => Ok("stop"),
        FinishReason::Length => Ok("length"),
        FinishReason::Cancelled => Err(ApiError::NotReady),
        FinishReason::Error(e) if remote => Err(ApiError::UpstreamFailed(e.clone())),
        FinishReason::Error(e) => Err(ApiError::internal(format!("generation failed: {e}"))),
    }
}

impl Generation {
    fn is_remote(&self) -> bool {
        matches!(self.source, Source::Remote(_))
    }
}

pub(super) async fn complete(
    mut generation: Generation,
    id: String,
    model: String,
    airlock: AirlockResponse,
    cite: Option<Attribution>,
    withhold_unsupported: bool,
    quote: bool,
) -> Result<Json<ChatResponse>, ApiError> {
    let mut text = String::new();
    loop {
        match generation.next().await {
            Some(GenEvent::Token { text: piece, .. }) => {
                text.push_str(piece.as_deref().unwrap_or(""))
            }
            Some(GenEvent::Preempted { .. } | GenEvent::Admitted { .. }) => {}
            Some(GenEvent::Done {
                reason,
                usage,
                text: tail,
            }) => {
                text.push_str(tail.as_deref().unwrap_or(""));
                let finish = finish_reason(&reason, generation.is_remote())?;
                let mut airlock = airlock;
                if let Some(cite) = &cite {
                    let c = cite.cited(&text);
                    if c.by == CitedBy::Unsupported {
                        generation.metrics.unsupported_answers.inc();
                        if withhold_unsupported {
                            // A figure or name no source holds: not shown to the user.
                            text = prompt::NO_SOURCE_ANSWER.to_string();
                        }
                    }
                    if !matches!(c.by, CitedBy::Unsupported | CitedBy::NoSource) {
                        // The cited sources' excerpts around what supports the answer.
                        for (n, e) in cite.passages(&text, &c.sources, CITATION_SNIPPET_BYTES) {
                            if let Some(citation) = airlock.citations.iter_mut().find(|c| c.n == n)
                            {
                                citation.snippet = e.snippet;
                                citation.passage = e.passage;
                            }
                        }
                        if quote && let Some(q) = quote_text(cite, &text, &c.sources) {
                            text.push_str(&q);
                        }
                    }
                    airlock.cited = Some(c.sources);
                    airlock.cited_by = Some(c.by);
                }
                // The receipt is complete before the answer is returned, or there is no answer.
                if let Some(r) = generation.receipt.take() {
                    r.close(
                        airlock.cited.as_deref().unwrap_or(&[]),
                        airlock.cited_by,
                        finish,
                    )
                    .await?;
                }
                if let Some(r) = generation.recorder.take() {
                    r.save(text.clone(), airlock.cited.as_deref().unwrap_or(&[]));
                }
                if let Some(t) = airlock.timings_ms.as_mut() {
                    let now = Instant::now();
                    let first = generation.first_token_at.unwrap_or(now);
                    let admitted = generation.admission_time(first);
                    t.first_token = (first - generation.submitted).as_secs_f64() * 1e3;
                    t.queue_wait = (admitted - generation.submitted).as_secs_f64() * 1e3;
                    t.prefill = (first - admitted).as_secs_f64() * 1e3;
                    t.decode = (now - first).as_secs_f64() * 1e3;
                    t.total = (now - generation.t0).as_secs_f64() * 1e3;
                }
                return Ok(Json(ChatResponse::answer(
                    id,
                    model,
                    text,
                    finish,
                    Usage {
                        prompt_tokens: usage.prompt_tokens,
                        completion_tokens: usage.completion_tokens,
                        total_tokens: usage.prompt_tokens + usage.completion_tokens,
                    },
                    airlock,
                )));
            }
            None => return Err(ApiError::internal("engine stream ended without Done")),
        }
    }
}

/// The text that follows an answer with its supporting quote (`quote_supporting_passage`):
/// a blank line, then `> ` the cited source's sentence and its `[n]`.
fn quote_text(cite: &Attribution, answer: &str, cited: &[usize]) -> Option<String> {
    let (n, q) = cite.quote(answer, cited)?;
    Some(format!("\n\n> {q} [{n}]"))
}

fn chunk(
    id: &str,
    model: &str,
    created: u64,
    delta: Delta,
    finish: Option<&'static str>,
) -> ChatChunk {
    ChatChunk {
        id: id.to_string(),
        object: "chat.completion.chunk",
        created,
        model: model.to_string(),
        choices: vec![ChunkChoice {
            index: 0,
            delta,
            finish_reason: finish,
        }],
        airlock: None,
        usage: None,
    }
}

/// A stream's first event: the assistant role, the citations and the rung (timings and the
/// cited sources come later: they are not known yet).
fn head_event(id: &str, model: &str, created: u64, airlock: AirlockResponse) -> ChatChunk {
    let mut first = chunk(
        id,
        model,
        created,
        Delta {
            role: Some("assistant"),
            content: Some(String::new()),
        },
        None,
    );
    first.airlock = Some(ChunkAirlock::Start(Box::new(AirlockResponse {
        timings_ms: None,
        cited: None,
        cited_by: None,
        ..airlock
    })));
    first
}

fn data(c: &ChatChunk) -> SseEvent {
    SseEvent::default().data(serde_json::to_string(c).unwrap_or_default())
}

/// The SSE body: the first event carries the role, citations and rung; then one event per text
/// piece; then the finish reason with usage; then `data: [DONE]`. The caller adds keep-alive
/// comments (`: keep-alive`) for the gaps (queueing, prefill, slow tokens).
/// The chunk `stream_options.include_usage` asks for: no choices, the usage.
fn usage_chunk(id: &str, model: &str, created: u64, usage: Usage) -> ChatChunk {
    let mut c = chunk(id, model, created, Delta::default(), None);
    c.choices.clear();
    c.usage = Some(usage);
    c
}

pub(super) fn sse(
    generation: Generation,
    id: String,
    model: String,
    airlock: AirlockResponse,
    cite: Option<Attribution>,
    include_usage: bool,
    quote: bool,
) -> Sse<impl futures::Stream<Item = Result<SseEvent, Infallible>>> {
    let created = unix_now();
    let first = head_event(&id, &model, created, airlock);
    let head = futures::stream::once(async move { Ok(data(&first)) });
    struct St {
        generation: Generation,
        id: String,
        model: String,
        created: u64,
        done: bool,
        /// The answer so far, kept only to find the cited sources at the end.
        text: String,
        cite: Option<Attribution>,
        include_usage: bool,
        quote: bool,
    }
    let body = futures::stream::unfold(
        St {
            generation,
            id,
            model,
            created,
            done: false,
            text: String::new(),
            cite,
            include_usage,
            quote,
        },
        |mut st| async move {
            if st.done {
                return None;
            }
            loop {
                match st.generation.next().await {
                    Some(GenEvent::Token { text, .. }) => {
                        let piece = text.unwrap_or_default();
                        if piece.is_empty() {
                            continue;
                        }
                        if st.cite.is_some() || st.generation.recorder.is_some() {
                            st.text.push_str(&piece);
                        }
                        let c = chunk(
                            &st.id,
                            &st.model,
                            st.created,
                            Delta {
                                role: None,
                                content: Some(piece),
                            },
                            None,
                        );
                        return Some((vec![Ok(data(&c))], st));
                    }
                    Some(GenEvent::Preempted { .. } | GenEvent::Admitted { .. }) => continue,
                    Some(GenEvent::Done {
                        reason,
                        usage,
                        text,
                    }) => {
                        st.done = true;
                        let mut out = Vec::new();
                        if let Some(t) = text.filter(|t| !t.is_empty()) {
                            if st.cite.is_some() || st.generation.recorder.is_some() {
                                st.text.push_str(&t);
                            }
                            let c = chunk(
                                &st.id,
                                &st.model,
                                st.created,
                                Delta {
                                    role: None,
                                    content: Some(t),
                                },
                                None,
                            );
                            out.push(Ok(data(&c)));
                        }
                        match finish_reason(&reason, st.generation.is_remote()) {
                            Ok(finish) => {
                                let mut c = chunk(
                                    &st.id,
                                    &st.model,
                                    st.created,
                                    Delta::default(),
                                    Some(finish),
                                );
                                let mut cited_now: Vec<usize> = Vec::new();
                                let mut cited_by = None;
                                if let Some(cite) = &st.cite {
                                    let cited = cite.cited(&st.text);
                                    if cited.by == CitedBy::Unsupported {
                                        st.generation.metrics.unsupported_answers.inc();
                                    }
                                    cited_now.clone_from(&cited.sources);
                                    cited_by = Some(cited.by);
                                    let passages = if cited.by == CitedBy::Unsupported {
                                        Vec::new()
                                    } else {
                                        cite.passages(
                                            &st.text,
                                            &cited.sources,
                                            CITATION_SNIPPET_BYTES,
                                        )
                                        .into_iter()
                                        .filter_map(|(n, e)| {
                                            Some(PassageUpdate {
                                                n,
                                                snippet: e.snippet,
                                                passage: e.passage?,
                                            })
                                        })
                                        .collect()
                                    };
                                    // The supporting quote is the answer's last words,
                                    // sent before the finish event.
                                    let quoted = (st.quote
                                        && !matches!(
                                            cited.by,
                                            CitedBy::Unsupported | CitedBy::NoSource
                                        ))
                                    .then(|| quote_text(cite, &st.text, &cited.sources))
                                    .flatten();
                                    if let Some(q) = quoted {
                                        st.text.push_str(&q);
                                        let d = chunk(
                                            &st.id,
                                            &st.model,
                                            st.created,
                                            Delta {
                                                role: None,
                                                content: Some(q),
                                            },
                                            None,
                                        );
                                        out.push(Ok(data(&d)));
                                    }
                                    c.airlock = Some(ChunkAirlock::End {
                                        cited: cited.sources,
                                        cited_by: cited.by,
                                        passages,
                                    });
                                }
                                // The receipt is complete before the finish event, or the
                                // stream ends with an error event instead.
                                if let Some(r) = st.generation.receipt.take()
                                    && let Err(e) = r.close(&cited_now, cited_by, finish).await
                                {
                                    out.push(Ok(SseEvent::default().event("error").data(
                                        serde_json::to_string(&e.problem()).unwrap_or_default(),
                                    )));
                                    out.push(Ok(SseEvent::default().data("[DONE]")));
                                    return Some((out, st));
                                }
                                if let Some(r) = st.generation.recorder.take() {
                                    r.save(std::mem::take(&mut st.text), &cited_now);
                                }
                                let usage = Usage {
                                    prompt_tokens: usage.prompt_tokens,
                                    completion_tokens: usage.completion_tokens,
                                    total_tokens: usage.prompt_tokens + usage.completion_tokens,
                                };
                                c.usage = Some(usage);
                                out.push(Ok(data(&c)));
                                if st.include_usage {
                                    out.push(Ok(data(&usage_chunk(
                                        &st.id, &st.model, st.created, usage,
                                    ))));
                                }
                            }
                            Err(e) => {
                                let (slug, _) = e.slug_status();
                                tracing::error!(error = %e, "generation ended abnormally");
                                out.push(Ok(SseEvent::default().event("error").data(
                                    serde_json::to_string(&e.problem())
                                        .unwrap_or_else(|_| slug.into()),
                                )));
                            }
                        }
                        out.push(Ok(SseEvent::default().data("[DONE]")));
                        return Some((out, st));
                    }
                    None => {
                        st.done = true;
                        return Some((vec![Ok(SseEvent::default().data("[DONE]"))], st));
                    }
                }
            }
        },
    )
    .flat_map(futures::stream::iter);
    Sse::new(head.chain(body))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::{Stalled, until_stalled};

    #[tokio::test]
    async fn a_stuck_engine_ends_the_wait_after_the_idle_timeout() {
        let idle = Duration::from_millis(200);
        let t0 = Instant::now();
        let r = until_stalled(std::future::pending::<()>(), || 7, idle).await;
        assert_eq!(r, Err(Stalled));
        let took = t0.elapsed();
        assert!(took >= idle && took < idle * 4, "{took:?}");
    }

    #[tokio::test]
    async fn engine_steps_keep_a_long_wait_alive() {
        // The awaited event takes 5 idle periods, but the engine steps meanwhile (a queue or a
        // long prefill ahead of it): the wait is not cut.
        let idle = Duration::from_millis(100);
        let steps = AtomicU64::new(0);
        let event = async {
            tokio::time::sleep(idle * 5).await;
            "token"
        };
        let r = until_stalled(event, || steps.fetch_add(1, Ordering::Relaxed), idle).await;
        assert_eq!(r, Ok("token"));
        assert!(steps.load(Ordering::Relaxed) > 5);
        // An event that arrives in time needs no steps.
        let r = until_stalled(async { 1 }, || 0, idle).await;
        assert_eq!(r, Ok(1));
    }
}
