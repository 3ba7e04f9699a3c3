//! A generation's two answer shapes: a complete `chat.completion` and the SSE stream of
//! `chat.completion.chunk` events (keep-alives, cancellation on disconnect), plus the answer
//! given without generation when no source is relevant. The generation itself (the engine's
//! events, the idle watchdog, its ticket and metrics) is the answer core's
//! (`airlock_serving::answer::Generation`).

use std::convert::Infallible;
use std::time::Instant;

use airlock_inference::generate::{Event as GenEvent, FinishReason, Usage as GenUsage};
use airlock_rag::{Attribution, CitedBy, prompt};
use axum::Json;
use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use crate::error::ApiError;
use airlock_serving::answer::{
    AnswerError, AnswerMetrics, CITATION_SNIPPET_BYTES, Generation, finish_reason,
};

use crate::openai::{
    AirlockResponse, ChatChunk, ChatResponse, ChunkAirlock, ChunkChoice, Delta, PassageUpdate,
    Usage, unix_now,
};
use crate::routes::RUNG_HEADER;

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

pub(super) async fn complete(
    mut generation: Generation,
    id: String,
    model: String,
    airlock: AirlockResponse,
    cite: Option<Attribution>,
    withhold_unsupported: bool,
    quote: bool,
) -> Result<Json<ChatResponse>, AnswerError> {
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
            None => return Err(AnswerError::internal("engine stream ended without Done")),
        }
    }
}

/// The text that follows an answer with its supporting quote (`quote_supporting_passage`):
/// a blank line, then `> ` the cited source's sentence and its `[n]`.
fn quote_text(cite: &Attribution, answer: &str, cited: &[usize]) -> Option<String> {
    let (n, q) = cite.quote(answer, cited)?;
    Some(format!("\n\n> {q} [{n}]"))
}

/// A content event: `text` as the assistant's next words.
fn text_chunk(id: &str, model: &str, created: u64, text: String) -> ChatChunk {
    chunk(
        id,
        model,
        created,
        Delta {
            role: None,
            content: Some(text),
        },
        None,
    )
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

/// The chunk `stream_options.include_usage` asks for: no choices, the usage.
fn usage_chunk(id: &str, model: &str, created: u64, usage: Usage) -> ChatChunk {
    let mut c = chunk(id, model, created, Delta::default(), None);
    c.choices.clear();
    c.usage = Some(usage);
    c
}

/// The SSE body: the first event carries the role, citations and rung; then one event per text
/// piece; then the finish reason with usage; then `data: [DONE]`. The caller adds keep-alive
/// comments (`: keep-alive`) for the gaps (queueing, prefill, slow tokens).
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
    let body = futures::stream::unfold(
        Body {
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
        next_events,
    )
    .flat_map(futures::stream::iter);
    Sse::new(head.chain(body))
}

/// An SSE body between its events.
struct Body {
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

type Events = Vec<Result<SseEvent, Infallible>>;

impl Body {
    /// Whether the answer's text is kept (to find its cited sources, or for the thread).
    fn keeps_text(&self) -> bool {
        self.cite.is_some() || self.generation.recorder.is_some()
    }

    /// A content event, kept in the answer's text when it is kept.
    fn content(&mut self, piece: String) -> SseEvent {
        if self.keeps_text() {
            self.text.push_str(&piece);
        }
        data(&text_chunk(&self.id, &self.model, self.created, piece))
    }
}

/// The body's next events: a text piece, or the end; nothing after the end.
async fn next_events(mut st: Body) -> Option<(Events, Body)> {
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
                let event = st.content(piece);
                return Some((vec![Ok(event)], st));
            }
            Some(GenEvent::Preempted { .. } | GenEvent::Admitted { .. }) => continue,
            Some(GenEvent::Done {
                reason,
                usage,
                text,
            }) => {
                st.done = true;
                let out = end_events(&mut st, &reason, usage, text).await;
                return Some((out, st));
            }
            None => {
                st.done = true;
                return Some((vec![Ok(SseEvent::default().data("[DONE]"))], st));
            }
        }
    }
}

/// The end of the body: the last text piece, then the finish (or an error event), then
/// `data: [DONE]`.
async fn end_events(
    st: &mut Body,
    reason: &FinishReason,
    usage: GenUsage,
    text: Option<String>,
) -> Events {
    let mut out = Vec::new();
    if let Some(t) = text.filter(|t| !t.is_empty()) {
        out.push(Ok(st.content(t)));
    }
    match finish_reason(reason, st.generation.is_remote()) {
        Ok(finish) => finish_events(st, finish, usage, &mut out).await,
        Err(e) => {
            let e = ApiError::from(e);
            let (slug, _) = e.slug_status();
            tracing::error!(error = %e, "generation ended abnormally");
            out.push(Ok(SseEvent::default().event("error").data(
                serde_json::to_string(&e.problem()).unwrap_or_else(|_| slug.into()),
            )));
        }
    }
    out.push(Ok(SseEvent::default().data("[DONE]")));
    out
}

/// A finished answer's events: the supporting quote (the answer's last words), then the
/// finish event with the cited sources, their passages and the usage, and the usage chunk
/// when asked. The receipt is complete before the finish event, or the stream ends with an
/// error event instead.
async fn finish_events(st: &mut Body, finish: &'static str, usage: GenUsage, out: &mut Events) {
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
        let end = attribute(cite, &st.text, st.quote, &st.generation.metrics);
        if let Some(q) = end.quote {
            st.text.push_str(&q);
            let d = text_chunk(&st.id, &st.model, st.created, q);
            out.push(Ok(data(&d)));
        }
        cited_now.clone_from(&end.cited);
        cited_by = Some(end.cited_by);
        c.airlock = Some(ChunkAirlock::End {
            cited: end.cited,
            cited_by: end.cited_by,
            passages: end.passages,
        });
    }
    if let Some(r) = st.generation.receipt.take()
        && let Err(e) = r.close(&cited_now, cited_by, finish).await
    {
        let e = ApiError::from(e);
        out.push(Ok(SseEvent::default()
            .event("error")
            .data(serde_json::to_string(&e.problem()).unwrap_or_default())));
        return;
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
        out.push(Ok(data(&usage_chunk(&st.id, &st.model, st.created, usage))));
    }
}

/// What a streamed answer cites, found when it ends.
struct Attributed {
    cited: Vec<usize>,
    cited_by: CitedBy,
    /// The cited sources' excerpts around what supports the answer (none when unsupported).
    passages: Vec<PassageUpdate>,
    /// The supporting quote to send as the answer's last words, if any.
    quote: Option<String>,
}

/// The sources `text` cites, their passages and its supporting quote; an unsupported answer
/// is counted.
fn attribute(cite: &Attribution, text: &str, quote: bool, metrics: &AnswerMetrics) -> Attributed {
    let cited = cite.cited(text);
    if cited.by == CitedBy::Unsupported {
        metrics.unsupported_answers.inc();
    }
    let passages = if cited.by == CitedBy::Unsupported {
        Vec::new()
    } else {
        cite.passages(text, &cited.sources, CITATION_SNIPPET_BYTES)
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
    let quoted = (quote && !matches!(cited.by, CitedBy::Unsupported | CitedBy::NoSource))
        .then(|| quote_text(cite, text, &cited.sources))
        .flatten();
    Attributed {
        cited: cited.sources,
        cited_by: cited.by,
        passages,
        quote: quoted,
    }
}
