//! `POST /v1/chat/completions`: the RAG request path of DESIGN.md §4, OpenAI shapes, non-streaming
//! and SSE. Retrieval and prompt building run on the blocking pool, generation on the engine
//! thread; a client that goes away drops the stream, which cancels the sequence at the engine's
//! next step (hyper notices the closed connection while the answer is pending or streaming and
//! drops the handler or the body, and with it the engine stream).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_inference::generate::{
    EngineCounters, Event as GenEvent, FinishReason, GenerateRequest, SamplingParams, Stream,
    Usage as GenUsage,
};
use airlock_rag::{Ask, Attribution, CitedBy, Purpose, Role, Selection, StageTimings, prompt};
use airlock_retrieval::SearchResult;
use axum::Json;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use crate::admission::{Priority, QueueSlot, Ticket};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, RequestId};
use crate::feedback::CompletionRecord;
use crate::generator::{Generator, submit_error};
use crate::metrics::Metrics;
use crate::openai::{
    AirlockResponse, ChatChunk, ChatRequest, ChatResponse, ChatTimings, ChunkAirlock, ChunkChoice,
    Citation, Delta, Usage, unix_now,
};
use crate::quota::TokenReservation;
use crate::routes::{REQUEST_ID, RUNG_HEADER, acl::blocking};
use crate::services::Services;
use crate::state::AppState;

/// Longest citation snippet, in bytes.
pub const CITATION_SNIPPET_BYTES: usize = 300;
/// Most chunks a request may ask for.
pub const MAX_TOP_K: usize = 20;
/// Most messages a conversation may hold.
pub const MAX_MESSAGES: usize = 256;
/// Largest `max_tokens` accepted.
pub const MAX_COMPLETION_TOKENS: u32 = 4096;

/// Everything decided before generation starts.
struct Prepared {
    generator: Arc<Generator>,
    prompt: Vec<u32>,
    /// The version of each citation's document (only when the turn is kept in a thread).
    versions: Vec<String>,
    citations: Vec<Citation>,
    /// The question and the sources' texts, to find which sources the answer used.
    cite: Option<Attribution>,
    retrieval: Option<StageTimings>,
    sources_ms: f64,
    prompt_ms: f64,
}

/// Adds the answer to a server-kept thread once it is complete.
struct TurnRecorder {
    store: Arc<crate::feedback::FeedbackStore>,
    thread: String,
    user: String,
    question: String,
    request_id: String,
    /// `(doc_id, version)` of each citation, in citation order.
    sources: Vec<(String, String)>,
}

impl TurnRecorder {
    /// Stores the turn (on the blocking pool; a failure is logged, the answer stands).
    fn save(self, answer: String, cited: &[usize]) {
        let sources: Vec<crate::conversations::TurnSource> = self
            .sources
            .iter()
            .enumerate()
            .map(|(i, (doc_id, version))| crate::conversations::TurnSource {
                doc_id: doc_id.clone(),
                version: version.clone(),
                cited: cited.contains(&(i + 1)),
            })
            .collect();
        tokio::task::spawn_blocking(move || {
            match self.store.append_turn(
                &self.user,
                &self.thread,
                &self.question,
                &answer,
                &self.request_id,
                &sources,
            ) {
                Ok(crate::conversations::Appended::Added(_)) => {}
                Ok(other) => tracing::warn!(outcome = ?other, "conversation turn not kept"),
                Err(e) => tracing::error!(error = %e, "conversation turn not kept"),
            }
        });
    }
}

/// The citations of the prompt sources, numbered in prompt order.
fn citations_of(chunks: &[SearchResult]) -> Vec<Citation> {
    chunks
        .iter()
        .enumerate()
        .map(|(i, c)| Citation {
            n: i + 1,
            doc_id: c.doc_id.clone(),
            chunk_id: c.chunk_id,
            title: c.title.clone(),
            snippet: prompt::snippet(&c.text, CITATION_SNIPPET_BYTES),
            score: c.score,
        })
        .collect()
}

pub(crate) fn validate(req: &ChatRequest, default_max: u32) -> Result<SamplingParams, ApiError> {
    if let Some((param, why)) = req.unsupported.refused() {
        return Err(ApiError::UnsupportedParameter { param, why });
    }
    if req.messages.is_empty() {
        return Err(ApiError::InvalidRequest(
            "`messages` must not be empty".into(),
        ));
    }
    if req.messages.len() > MAX_MESSAGES {
        return Err(ApiError::InvalidRequest(format!(
            "`messages` takes at most {MAX_MESSAGES} messages"
        )));
    }
    if !req
        .messages
        .iter()
        .any(|m| Role::from_openai(&m.role) == Role::User && !m.content.trim().is_empty())
    {
        return Err(ApiError::InvalidRequest(
            "`messages` needs a non-empty user message".into(),
        ));
    }
    let max_tokens = req
        .max_completion_tokens
        .or(req.max_tokens)
        .unwrap_or(default_max);
    if !(1..=MAX_COMPLETION_TOKENS).contains(&max_tokens) {
        return Err(ApiError::InvalidRequest(format!(
            "`max_tokens` must be between 1 and {MAX_COMPLETION_TOKENS}"
        )));
    }
    let temperature = req.temperature.unwrap_or(0.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::InvalidRequest(
            "`temperature` must be between 0 and 2".into(),
        ));
    }
    let top_p = req.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::InvalidRequest("`top_p` must be in (0, 1]".into()));
    }
    let stop = req.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 || stop.iter().any(|s| s.is_empty() || s.len() > 64) {
        return Err(ApiError::InvalidRequest(
            "`stop` takes at most 4 non-empty strings of at most 64 bytes".into(),
        ));
    }
    Ok(SamplingParams {
        temperature,
        top_p,
        seed: req.seed,
        max_tokens: max_tokens as usize,
        stop_token_ids: Vec::new(),
        stop_strings: stop,
    })
}

fn pick_generator(
    services: &Services,
    model: Option<&str>,
    small: bool,
) -> Result<Arc<Generator>, ApiError> {
    let named = match model {
        Some(m) => {
            let card = services
                .catalogue
                .iter()
                .find(|c| c.id == m)
                .ok_or_else(|| ApiError::NotFound(format!("no model `{m}`")))?;
            if card.role != "generator" {
                return Err(ApiError::InvalidRequest(format!(
                    "model `{m}` is not a chat model"
                )));
            }
            services.generator(m)
        }
        None => services.default_generator(),
    };
    let chosen = if small {
        services.small_generator()
    } else {
        named
    };
    chosen
        .cloned()
        .ok_or_else(|| ApiError::internal("no generator is loaded"))
}

/// `POST /v1/chat/completions`.
pub async fn completions(
    State(state): State<AppState>,
    caller: Caller,
    priority: Priority,
    RequestId(request_id): RequestId,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let ext = req.airlock.clone().unwrap_or_default();
    if ext.rung.is_some() && !caller.admin {
        return Err(ApiError::Forbidden("forcing a rung needs the admin role"));
    }
    let params = validate(&req, state.config().max_tokens())?;
    let top_k = ext.top_k.unwrap_or(state.config().top_k());
    if !(1..=MAX_TOP_K).contains(&top_k) {
        return Err(ApiError::InvalidRequest(format!(
            "`airlock.top_k` must be between 1 and {MAX_TOP_K}"
        )));
    }
    let services = state.services()?;
    // A server-kept thread: its readable turns are the history (a redacted turn never
    // reaches the prompt), and the answer becomes its next turn.
    let (history, thread) = match ext.conversation_id.clone() {
        Some(id) => {
            crate::routes::conversations::check_id(&id)?;
            let services = services.clone();
            let user = caller.user_id.clone();
            blocking(move || {
                let store = services.feedback.clone().ok_or_else(|| {
                    ApiError::NotFound(crate::routes::conversations::UNKNOWN_THREAD.into())
                })?;
                let Some((_, turns)) = store.thread(&user, &id)? else {
                    return Err(ApiError::NotFound(
                        crate::routes::conversations::UNKNOWN_THREAD.into(),
                    ));
                };
                let views = crate::routes::conversations::views(&services, &user, turns)?;
                let mut history = Vec::new();
                for v in views {
                    if let (Some(q), Some(a)) = (v.question, v.answer) {
                        history.push((Role::User, q));
                        history.push((Role::Assistant, a));
                    }
                }
                Ok((history, Some((store, id))))
            })
            .await?
        }
        None => (Vec::new(), None),
    };
    let ticket = match state.admission().admit(&caller, ext.rung, priority) {
        Ok(t) => t,
        Err(e @ ApiError::CapacityUnavailable { .. }) => {
            let rung = ext.rung.unwrap_or_else(|| state.admission().current_rung());
            return Ok(with_rung(e.into_response(), rung));
        }
        Err(e) => return Err(e),
    };
    let plan = ticket.plan;
    let generator = pick_generator(&services, req.model.as_deref(), plan.small_model)?;
    let model_alias = generator.alias.clone();
    let mut conversation: Vec<(Role, String)> = history;
    conversation.extend(
        req.messages
            .iter()
            .map(|m| (Role::from_openai(&m.role), m.content.clone())),
    );
    let question = prompt::last_user_text(&conversation)
        .unwrap_or_default()
        .to_string();

    // Retrieval, re-check, source selection, prompt: blocking work on the answer path.
    let metrics = state.metrics().clone();
    let k = plan.max_prompt_chunks.map_or(top_k, |cap| top_k.min(cap));
    let selection = Selection {
        floor: state.config().min_source_similarity(),
        check_names: state.config().abstain_on_unmatched_names(),
        focus: state.config().source_focus(),
        semantic: state.config().semantic_focus(),
        facets: state.config().facet_retrieval(),
    };
    let follow_ups = state.config().follow_up_query();
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let prepared = {
        let services = services.clone();
        let user = caller.user_id.clone();
        let time_quantum = state.config().retrieval_time_quantum_for(caller.admin);
        let rid = request_id.clone();
        let keep_turn = thread.is_some();
        blocking(move || {
            let mut versions: Vec<String> = Vec::new();
            let (built, citations, retrieval, attribution, sources_ms) = if ext.retrieval {
                let shown = services.answer_path().run(
                    &Ask {
                        user_id: &user,
                        request_id: &rid,
                        conversation: &conversation,
                        k,
                        mode: services.default_mode(),
                        rerank: plan.rerank,
                        time_quantum,
                        follow_ups,
                        purpose: Purpose::Chat(selection),
                    },
                    &metrics,
                )?;
                let citations = citations_of(&shown.chunks);
                if keep_turn {
                    let ids: Vec<&str> = citations.iter().map(|c| c.doc_id.as_str()).collect();
                    let now = services.answer_path().versions(&ids)?;
                    versions = now.into_iter().map(Option::unwrap_or_default).collect();
                }
                (
                    shown.prompt(&conversation),
                    citations,
                    Some(shown.timings.clone()),
                    Some(shown.attribution()),
                    shown.selection_ms,
                )
            } else {
                (
                    prompt::build(&conversation, None),
                    Vec::new(),
                    None,
                    None,
                    0.0,
                )
            };
            let tp = Instant::now();
            let prompt = generator.prompt_ids(&built)?;
            Ok(Prepared {
                generator,
                prompt,
                versions,
                citations,
                cite: attribution,
                retrieval,
                sources_ms,
                prompt_ms: crate::routes::ms_since(tp),
            })
        })
        .await?
    };
    let mut recorder = thread.map(|(store, thread)| TurnRecorder {
        store,
        thread,
        user: caller.user_id.clone(),
        question: question.clone(),
        request_id: request_id.clone(),
        sources: prepared
            .citations
            .iter()
            .zip(&prepared.versions)
            .map(|(c, v)| (c.doc_id.clone(), v.clone()))
            .collect(),
    });
    if ext.retrieval && prepared.citations.is_empty() {
        if let Some(r) = recorder.take() {
            r.save(prompt::NO_SOURCE_ANSWER.to_string(), &[]);
        }
        // No chunk the caller may read passed the similarity floor: say so without running the
        // model (given no source, a small model invents an answer or loops on "[1] [2] …").
        state.metrics().no_source_answers.inc();
        tracing::info!(
            airlock.rung = plan.rung,
            "no readable source: answered without generation"
        );
        record(
            &services,
            &request_id,
            &caller.user_id,
            &model_alias,
            plan.rung,
        )
        .await?;
        let airlock = AirlockResponse {
            citations: Vec::new(),
            rung: plan.rung,
            bundle_version: Some(services.bundle_version().to_string()),
            timings_ms: state
                .config()
                .shows_stage_timings(caller.admin)
                .then(|| ChatTimings {
                    retrieval: prepared.retrieval,
                    sources: prepared.sources_ms,
                    prompt: prepared.prompt_ms,
                    total: crate::routes::ms_since(t0),
                    ..ChatTimings::default()
                }),
            cited: Some(Vec::new()),
            cited_by: Some(CitedBy::NoSource),
        };
        let id_header = HeaderValue::from_str(&request_id).ok();
        let mut resp =
            no_source_answer(req.stream, include_usage, request_id, model_alias, airlock);
        if let Some(v) = id_header {
            resp.headers_mut().insert(REQUEST_ID, v);
        }
        return Ok(with_rung(resp, plan.rung));
    }
    let prompt_tokens = prepared.prompt.len();
    // Token quota: reserve the most this request can cost; the unused part is refunded when
    // the generation ends (Generation's drop).
    let reservation = state
        .admission()
        .reserve_tokens(&caller, prompt_tokens + params.max_tokens)?;
    let queue = state.admission().enqueue();
    let submitted = Instant::now();
    // The engine admits interactive requests before queued batch/eval ones.
    let mut stream = prepared
        .generator
        .engine()
        .submit_with_priority(
            GenerateRequest {
                prompt: prepared.prompt,
                params,
            },
            priority.engine(),
        )
        .map_err(submit_error)?;
    tracing::info!(
        gen_ai.request.model = %model_alias,
        gen_ai.usage.input_tokens = prompt_tokens,
        airlock.rung = plan.rung,
        airlock.priority = priority.as_str(),
        airlock.citations = prepared.citations.len(),
        "generation queued"
    );

    // Rung 4: a bounded wait for the first output (token or end), else 504. The engine's
    // admission event on the way ends the queue wait but not the deadline.
    let mut queue = Some(queue);
    let mut admitted_at = None;
    let first = match plan.queue_deadline {
        Some(deadline) => {
            let until = tokio::time::Instant::from_std(submitted + deadline);
            loop {
                match tokio::time::timeout_at(until, stream.recv()).await {
                    Ok(Some(GenEvent::Admitted { .. })) => {
                        admitted_at = Some(Instant::now());
                        queue = None;
                    }
                    Ok(ev) => break ev,
                    Err(_) => {
                        // Nothing was generated: the reservation goes back in full.
                        reservation.settle(0);
                        return Ok(with_rung(
                            ApiError::DeadlineExceeded.into_response(),
                            plan.rung,
                        ));
                    }
                }
            }
        }
        None => None,
    };

    // The completion is served from here on: record it (id, user, model, rung, bundle; never
    // text) before its id reaches the client, so the user can rate it, even if stopped early.
    if let Err(e) = record(
        &services,
        &request_id,
        &caller.user_id,
        &model_alias,
        plan.rung,
    )
    .await
    {
        reservation.settle(0);
        return Err(e);
    }

    let generation = Generation {
        engine: prepared.generator.engine().counters(),
        stream,
        idle_timeout: state.config().stream_idle_timeout(),
        first,
        ticket,
        queue,
        admitted_at,
        reservation: Some(reservation),
        prompt_tokens,
        used: None,
        metrics: state.metrics().clone(),
        t0,
        submitted,
        first_token_at: None,
        tokens: 0,
        finished: false,
        recorder,
    };
    let airlock = AirlockResponse {
        citations: prepared.citations,
        rung: plan.rung,
        bundle_version: Some(services.bundle_version().to_string()),
        timings_ms: state
            .config()
            .shows_stage_timings(caller.admin)
            .then(|| ChatTimings {
                retrieval: prepared.retrieval,
                sources: prepared.sources_ms,
                prompt: prepared.prompt_ms,
                ..ChatTimings::default()
            }),
        cited: None,
        cited_by: None,
    };
    let cite = prepared.cite;
    let id = request_id;
    // The completion id and `X-Request-Id` are the same value (the web UI rates answers by
    // either): set it here, since an unusable client id was replaced by a fresh one.
    let id_header = HeaderValue::from_str(&id).ok();
    let mut resp = if req.stream {
        sse(generation, id, model_alias, airlock, cite, include_usage)
            .keep_alive(
                KeepAlive::new()
                    .interval(state.config().sse_keep_alive())
                    .text("keep-alive"),
            )
            .into_response()
    } else {
        let withhold = state.config().withhold_unsupported_answers();
        complete(generation, id, model_alias, airlock, cite, withhold)
            .await?
            .into_response()
    };
    if let Some(v) = id_header {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    Ok(with_rung(resp, plan.rung))
}

/// Records a served completion for feedback (id, user, model, rung, bundle; never text).
async fn record(
    services: &Arc<Services>,
    request_id: &str,
    user_id: &str,
    model: &str,
    rung: u8,
) -> Result<(), ApiError> {
    let Some(store) = services.feedback.clone() else {
        return Ok(());
    };
    let (rid, user, model) = (
        request_id.to_string(),
        user_id.to_string(),
        model.to_string(),
    );
    let bundle_version = services.bundle_version().to_string();
    blocking(move || {
        Ok(store.record_completion(&CompletionRecord {
            request_id: &rid,
            user_id: &user,
            model: &model,
            rung,
            bundle_version: &bundle_version,
        })?)
    })
    .await
}

/// The answer when no readable source is relevant enough (see `min_source_similarity`): the
/// system prompt's own abstention, without generation, in the shape the client asked for.
fn no_source_answer(
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
fn with_rung(mut resp: Response, rung: u8) -> Response {
    resp.headers_mut()
        .insert(RUNG_HEADER, HeaderValue::from(u16::from(rung)));
    resp
}

/// One generation in flight: owns the engine stream (dropping it cancels the sequence), the
/// admission ticket and the timing.
struct Generation {
    stream: Stream,
    /// The engine's counters: its step count tells a slow prefill or a queue (steps advance)
    /// from a stuck engine (they do not).
    engine: std::sync::Arc<EngineCounters>,
    /// How long the generation may make no progress before it is ended.
    idle_timeout: Duration,
    first: Option<GenEvent>,
    ticket: Ticket,
    /// Held from submission until the engine admits the sequence (the ladder's queue-wait
    /// signal and queue depth).
    queue: Option<QueueSlot>,
    /// When the engine admitted the sequence (its prefill started).
    admitted_at: Option<Instant>,
    reservation: Option<TokenReservation>,
    prompt_tokens: usize,
    /// Prompt + completion tokens as the engine reported them at the end.
    used: Option<usize>,
    metrics: Metrics,
    t0: Instant,
    submitted: Instant,
    first_token_at: Option<Instant>,
    tokens: usize,
    finished: bool,
    /// Adds the answer to the thread it was asked in, when it completes.
    recorder: Option<TurnRecorder>,
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
        let engine = self.engine.clone();
        let waited = until_stalled(
            self.stream.recv(),
            || engine.snapshot().steps,
            self.idle_timeout,
        )
        .await;
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

fn finish_reason(r: &FinishReason) -> Result<&'static str, ApiError> {
    match r {
        FinishReason::Stop => Ok("stop"),
        FinishReason::Length => Ok("length"),
        FinishReason::Cancelled => Err(ApiError::NotReady),
        FinishReason::Error(e) => Err(ApiError::internal(format!("generation failed: {e}"))),
    }
}

async fn complete(
    mut generation: Generation,
    id: String,
    model: String,
    airlock: AirlockResponse,
    cite: Option<Attribution>,
    withhold_unsupported: bool,
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
                let finish = finish_reason(&reason)?;
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
                    airlock.cited = Some(c.sources);
                    airlock.cited_by = Some(c.by);
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
    first.airlock = Some(ChunkAirlock::Start(AirlockResponse {
        timings_ms: None,
        cited: None,
        cited_by: None,
        ..airlock
    }));
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

fn sse(
    generation: Generation,
    id: String,
    model: String,
    airlock: AirlockResponse,
    cite: Option<Attribution>,
    include_usage: bool,
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
                        match finish_reason(&reason) {
                            Ok(finish) => {
                                let mut c = chunk(
                                    &st.id,
                                    &st.model,
                                    st.created,
                                    Delta::default(),
                                    Some(finish),
                                );
                                let mut cited_now: Vec<usize> = Vec::new();
                                if let Some(cite) = &st.cite {
                                    let cited = cite.cited(&st.text);
                                    if cited.by == CitedBy::Unsupported {
                                        st.generation.metrics.unsupported_answers.inc();
                                    }
                                    cited_now.clone_from(&cited.sources);
                                    c.airlock = Some(ChunkAirlock::End {
                                        cited: cited.sources,
                                        cited_by: cited.by,
                                    });
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
