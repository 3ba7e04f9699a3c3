//! `POST /v1/chat/completions`: the RAG request path of DESIGN.md §4, OpenAI shapes, non-streaming
//! and SSE. Retrieval and prompt building run on the blocking pool, generation on the engine
//! thread; a client that goes away drops the stream, which cancels the sequence at the engine's
//! next step (hyper notices the closed connection while the answer is pending or streaming and
//! drops the handler or the body, and with it the engine stream).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_inference::Embedder;
use airlock_inference::generate::{
    EngineCounters, Event as GenEvent, FinishReason, GenerateRequest, SamplingParams, Stream,
    Usage as GenUsage,
};
use airlock_retrieval::SearchResult;
use axum::Json;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use crate::admission::{Priority, QueueSlot, Ticket};
use crate::auth::Caller;
use crate::cite::CitedBy;
use crate::error::ApiError;
use crate::extract::{ApiJson, RequestId};
use crate::feedback::CompletionRecord;
use crate::generator::{Generator, submit_error};
use crate::metrics::Metrics;
use crate::openai::{
    AirlockResponse, ChatChunk, ChatRequest, ChatResponse, ChatTimings, ChunkAirlock, ChunkChoice,
    Citation, Delta, Usage, unix_now,
};
use crate::prompt::{self, Role, Source};
use crate::quota::TokenReservation;
use crate::rag::{self, RetrieveParams, StageTimings};
use crate::routes::{REQUEST_ID, RUNG_HEADER, acl::blocking};
use crate::services::Services;
use crate::state::AppState;

/// Longest citation snippet, in bytes.
pub const CITATION_SNIPPET_BYTES: usize = 300;
/// Most chunks a request may ask for.
pub const MAX_TOP_K: usize = 20;
/// Largest `max_tokens` accepted.
pub const MAX_COMPLETION_TOKENS: u32 = 4096;

/// Everything decided before generation starts.
struct Prepared {
    generator: Arc<Generator>,
    prompt: Vec<u32>,
    citations: Vec<Citation>,
    /// The question and the sources' texts, to find which sources the answer used.
    cite: Option<CiteInput>,
    retrieval: Option<StageTimings>,
    sources_ms: f64,
    prompt_ms: f64,
}

/// What [`crate::cite::cited`] needs once the answer is complete.
struct CiteInput {
    question: String,
    sources: Vec<String>,
}

impl CiteInput {
    fn cited(&self, answer: &str) -> crate::cite::Cited {
        let sources: Vec<&str> = self.sources.iter().map(String::as_str).collect();
        crate::cite::cited(answer, &self.question, &sources)
    }
}

pub(crate) fn validate(req: &ChatRequest, default_max: u32) -> Result<SamplingParams, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::InvalidRequest(
            "`messages` must not be empty".into(),
        ));
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
    let conversation: Vec<(Role, String)> = req
        .messages
        .iter()
        .map(|m| (Role::from_openai(&m.role), m.content.clone()))
        .collect();

    // Retrieval, re-check, prompt: blocking work.
    let metrics = state.metrics().clone();
    let k = plan.max_prompt_chunks.map_or(top_k, |cap| top_k.min(cap));
    let floor = state.config().min_source_similarity();
    let check_names = state.config().abstain_on_unmatched_names();
    let focus = state.config().source_focus();
    let semantic = state.config().semantic_focus() && plan.rerank;
    let split_facets = state.config().facet_retrieval();
    let prepared = {
        let services = services.clone();
        let user = caller.user_id.clone();
        let time_quantum = state.config().retrieval_time_quantum_for(caller.admin);
        let rid = request_id.clone();
        blocking(move || {
            let mut sources_ms = 0.0;
            let (sources_owned, citations, retrieval_timings, cite) = if ext.retrieval {
                let query = prompt::last_user_text(&conversation).unwrap_or_default();
                // A question about two subjects is retrieved and focused once per subject.
                let facets = split_facets.then(|| crate::facets::facets(query)).flatten();
                if facets.is_some() {
                    metrics.facet_questions.inc();
                }
                let questions: Vec<&str> = match &facets {
                    Some(f) => f.iter().map(String::as_str).collect(),
                    None => vec![query],
                };
                let mut per_question = Vec::with_capacity(questions.len());
                let mut timings: Option<rag::StageTimings> = None;
                for q in questions {
                    let mut retrieved = rag::retrieve(
                        &services,
                        &metrics,
                        &RetrieveParams {
                            user_id: &user,
                            request_id: &rid,
                            query: q,
                            k,
                            mode: services.default_mode(),
                            rerank: plan.rerank,
                            time_quantum,
                        },
                    )?;
                    let ts = Instant::now();
                    keep_prompt_sources(
                        &mut retrieved.chunks,
                        q,
                        SourceSelection {
                            floor,
                            check_names,
                            focus,
                            embedder: semantic.then_some(services.embedder.as_ref()),
                        },
                        &metrics,
                    );
                    sources_ms += crate::routes::ms_since(ts);
                    match &mut timings {
                        Some(t) => t.add(&retrieved.timings),
                        None => timings = Some(retrieved.timings),
                    }
                    per_question.push(retrieved.chunks);
                }
                let chunks = interleave(per_question, k);
                let citations: Vec<Citation> = chunks
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
                    .collect();
                if !citations.is_empty() {
                    let ids: Vec<&str> = citations.iter().map(|c| c.doc_id.as_str()).collect();
                    services.acl.audit_shown(&rid, &user, &ids)?;
                }
                let cite = CiteInput {
                    question: query.to_string(),
                    sources: chunks.iter().map(|c| c.text.clone()).collect(),
                };
                (Some(chunks), citations, timings, Some(cite))
            } else {
                (None, Vec::new(), None, None)
            };
            let tp = Instant::now();
            let sources: Option<Vec<Source<'_>>> = sources_owned.as_ref().map(|v| {
                v.iter()
                    .map(|c| Source {
                        title: &c.title,
                        text: &c.text,
                    })
                    .collect()
            });
            let built = prompt::build(&conversation, sources.as_deref());
            let prompt = generator.prompt_ids(&built)?;
            Ok(Prepared {
                generator,
                prompt,
                citations,
                cite,
                retrieval: retrieval_timings,
                sources_ms,
                prompt_ms: crate::routes::ms_since(tp),
            })
        })
        .await?
    };
    if ext.retrieval && prepared.citations.is_empty() {
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
        let mut resp = no_source_answer(req.stream, request_id, model_alias, airlock);
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
        sse(generation, id, model_alias, airlock, cite)
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

/// How a chat chooses its prompt sources among the retrieved chunks (docs/OPERATIONS.md §10).
#[derive(Clone, Copy)]
struct SourceSelection<'a> {
    /// `min_source_similarity`.
    floor: f32,
    /// `abstain_on_unmatched_names`.
    check_names: bool,
    /// `source_focus`.
    focus: f32,
    /// The embedder for focus's semantic judgement (`semantic_focus`, full pipeline only).
    embedder: Option<&'a Embedder>,
}

/// Keeps the retrieved chunks that may serve as prompt sources: chunks too far from the
/// question go (without them a small model answers from whatever it was given instead of
/// saying it cannot find it); all go when the question names something none of them
/// mentions (another vendor, person, project), however close their topic; of the rest, the
/// documents missing one of the question's names go when another document has them all
/// ([`crate::focus::naming_all`]); and then the documents that match the question's
/// distinguishing words clearly less well than the best one ([`crate::focus`]: near-copies
/// about another segment, person or branch).
fn keep_prompt_sources(
    chunks: &mut Vec<SearchResult>,
    query: &str,
    sel: SourceSelection,
    metrics: &Metrics,
) {
    let before = chunks.len();
    chunks.retain(|c| c.stage_scores.rescore.is_none_or(|s| s >= sel.floor));
    if chunks.len() < before {
        metrics.below_floor.inc_by((before - chunks.len()) as u64);
    }
    if sel.check_names && !chunks.is_empty() {
        let texts: Vec<String> = chunks
            .iter()
            .map(|c| format!("{}\n{}", c.title, c.text))
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        if !crate::cite::unmatched_names(query, &refs).is_empty() {
            metrics.unmatched_names.inc();
            chunks.clear();
        }
    }
    if sel.focus > 0.0 && chunks.len() > 1 {
        let naming = crate::focus::naming_all(query, &focus_candidates(chunks));
        if let Some(keep) = naming {
            metrics.out_of_focus.inc_by(retain_kept(chunks, keep));
        }
    }
    if sel.focus > 0.0 && chunks.len() > 1 {
        let candidates = focus_candidates(chunks);
        let judgement = sel.embedder.and_then(|e| {
            crate::focus::semantic_judgement(query, &candidates, |t| e.embed(t))
                .unwrap_or_else(|err| {
                    tracing::warn!(error = %err, "semantic focus: embedding failed; lexical focus only");
                    None
                })
        });
        let keep = match judgement {
            Some((cosines, embedded)) => {
                metrics.focus_sentences.inc_by(embedded as u64);
                crate::focus::keep_semantic(query, &candidates, sel.focus, &cosines)
            }
            None => crate::focus::keep(query, &candidates, sel.focus),
        };
        metrics.out_of_focus.inc_by(retain_kept(chunks, keep));
    }
}

/// The prompt sources of a question retrieved once per facet: the lists taken in turn (each
/// facet's best first), a chunk already taken skipped, at most `k`. One list is returned as is.
fn interleave(lists: Vec<Vec<SearchResult>>, k: usize) -> Vec<SearchResult> {
    if lists.len() == 1 {
        return lists.into_iter().next().unwrap_or_default();
    }
    let mut out: Vec<SearchResult> = Vec::new();
    let mut iters: Vec<_> = lists.into_iter().map(Vec::into_iter).collect();
    let mut any = true;
    while any && out.len() < k {
        any = false;
        for it in &mut iters {
            if out.len() >= k {
                break;
            }
            for c in it.by_ref() {
                any = true;
                if !out.iter().any(|o| o.chunk_id == c.chunk_id) {
                    out.push(c);
                    break;
                }
            }
        }
    }
    out
}

/// Keeps the chunks whose flag in `keep` is set (one per chunk, in order); returns how many went.
fn retain_kept(chunks: &mut Vec<SearchResult>, keep: Vec<bool>) -> u64 {
    let before = chunks.len();
    let mut it = keep.into_iter();
    chunks.retain(|_| it.next().unwrap_or(true));
    (before - chunks.len()) as u64
}

/// The chunks as source-focus candidates.
fn focus_candidates(chunks: &[SearchResult]) -> Vec<crate::focus::Candidate<'_>> {
    chunks
        .iter()
        .map(|c| crate::focus::Candidate {
            doc_id: &c.doc_id,
            title: &c.title,
            text: &c.text,
        })
        .collect()
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
fn no_source_answer(stream: bool, id: String, model: String, airlock: AirlockResponse) -> Response {
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
    let events: Vec<Result<SseEvent, Infallible>> = vec![
        Ok(data(&first)),
        Ok(data(&text)),
        Ok(data(&last)),
        Ok(SseEvent::default().data("[DONE]")),
    ];
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
    cite: Option<CiteInput>,
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
fn sse(
    generation: Generation,
    id: String,
    model: String,
    airlock: AirlockResponse,
    cite: Option<CiteInput>,
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
        cite: Option<CiteInput>,
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
                        if st.cite.is_some() {
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
                            if st.cite.is_some() {
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
                                if let Some(cite) = &st.cite {
                                    let cited = cite.cited(&st.text);
                                    if cited.by == CitedBy::Unsupported {
                                        st.generation.metrics.unsupported_answers.inc();
                                    }
                                    c.airlock = Some(ChunkAirlock::End {
                                        cited: cited.sources,
                                        cited_by: cited.by,
                                    });
                                }
                                c.usage = Some(Usage {
                                    prompt_tokens: usage.prompt_tokens,
                                    completion_tokens: usage.completion_tokens,
                                    total_tokens: usage.prompt_tokens + usage.completion_tokens,
                                });
                                out.push(Ok(data(&c)));
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

    use airlock_retrieval::SearchResult;

    use super::{Stalled, interleave, until_stalled};

    fn chunk(id: u32) -> SearchResult {
        SearchResult {
            chunk_id: id,
            doc_id: format!("doc-{id}"),
            doc_ordinal: id,
            title: String::new(),
            position: 0,
            text: String::new(),
            score: 0.0,
            stage_scores: Default::default(),
        }
    }

    #[test]
    fn facet_sources_take_turns_without_repeats_up_to_k() {
        let ids = |v: Vec<SearchResult>| v.iter().map(|c| c.chunk_id).collect::<Vec<_>>();
        let lists = || vec![vec![chunk(1), chunk(2), chunk(3)], vec![chunk(2), chunk(4)]];
        assert_eq!(ids(interleave(lists(), 10)), [1, 2, 3, 4]);
        assert_eq!(ids(interleave(lists(), 3)), [1, 2, 3]);
        // One facet found nothing: the other's sources stand; one list is kept as it is.
        assert_eq!(ids(interleave(vec![vec![], vec![chunk(5)]], 4)), [5]);
        assert_eq!(ids(interleave(vec![vec![chunk(7), chunk(6)]], 1)), [7, 6]);
    }

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
