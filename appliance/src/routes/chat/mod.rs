//! `POST /v1/chat/completions`: the RAG request path of DESIGN.md §4, OpenAI shapes, non-streaming
//! and SSE. Retrieval and prompt building run on the blocking pool, generation on the engine
//! thread; a client that goes away drops the stream, which cancels the sequence at the engine's
//! next step (hyper notices the closed connection while the answer is pending or streaming and
//! drops the handler or the body, and with it the engine stream).

use std::sync::Arc;
use std::time::Instant;

use airlock_evidence::feedback::CompletionRecord;
use airlock_inference::generate::{Event as GenEvent, GenerateRequest};
use airlock_rag::{
    Ask, Attribution, CitedBy, FollowUps, Purpose, Role, Selection, StageTimings, prompt,
};
use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::sse::KeepAlive;
use axum::response::{IntoResponse, Response};

use crate::admission::Priority;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, RequestId};
use crate::generator::submit_error;
use crate::openai::{AirlockResponse, ChatRequest, ChatTimings, Citation};
use crate::routes::{REQUEST_ID, acl::blocking};
use crate::services::Services;
use crate::state::AppState;

mod receipt;
mod request;
mod stream;
mod thread;

use request::{Target, pick_generator};
pub(crate) use request::{conversation_of, validate};
use stream::{Generation, Source, complete, no_source_answer, sse, with_rung};
use thread::TurnRecorder;

/// Longest citation snippet, in bytes.
pub const CITATION_SNIPPET_BYTES: usize = 300;
/// Most chunks a request may ask for.
pub const MAX_TOP_K: usize = 20;
/// Most messages a conversation may hold.
pub const MAX_MESSAGES: usize = 256;
/// Largest `max_tokens` accepted.
pub const MAX_COMPLETION_TOKENS: u32 = 4096;

/// Everything decided before generation starts.
pub(super) struct Prepared {
    pub(super) target: Target,
    /// The local generator's prompt token ids (empty for a remote generator).
    pub(super) prompt: Vec<u32>,
    /// The final prompt as messages (system prompt, re-checked sources, question): what a
    /// remote generator is sent.
    pub(super) messages: Vec<(Role, String)>,
    /// The version of each citation's document (only when the turn is kept in a thread).
    pub(super) versions: Vec<String>,
    pub(super) citations: Vec<Citation>,
    /// The question and the sources' texts, to find which sources the answer used.
    pub(super) cite: Option<Attribution>,
    pub(super) retrieval: Option<StageTimings>,
    pub(super) sources_ms: f64,
    pub(super) prompt_ms: f64,
    /// `sha256:<hex>` of the exact prompt the generator is given (the receipt's).
    pub(super) prompt_sha256: String,
    /// The sources shown, with their versions (the receipt's `shown`).
    pub(super) shown: Vec<airlock_evidence::receipts::DocRef>,
    /// The index generation searched and the ACL state, when the sources were chosen.
    pub(super) index_generation: u64,
    pub(super) acl_state_seq: i64,
}
/// How a chat chooses its prompt sources, from the configuration (docs/operations/answer-sources.md):
/// the chat's and `POST /v1/retrieve` with `prompt_sources`.
pub(crate) fn selection(config: &crate::config::Config) -> Selection {
    Selection {
        floor: config.min_source_similarity(),
        check_names: config.abstain_on_unmatched_names(),
        focus: config.source_focus(),
        near_copy: config.source_focus_near_copy(),
        semantic: config.semantic_focus(),
        facets: config.facet_retrieval(),
    }
}

/// The citations of the prompt sources, numbered in prompt order, with their anchors.
/// Each excerpt is cut around the passage that best matches the question (the answer does not
/// exist yet; a finished answer's passages replace them: [`stream`]).
fn citations_of(shown: &airlock_rag::Shown) -> Vec<Citation> {
    let question = shown.stand_alone.as_deref().unwrap_or(&shown.query);
    shown
        .chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let excerpt = airlock_rag::passage::excerpt(&c.text, question, CITATION_SNIPPET_BYTES);
            Citation {
                n: i + 1,
                doc_id: c.doc_id.clone(),
                chunk_id: c.chunk_id,
                title: c.title.clone(),
                snippet: excerpt.snippet,
                passage: excerpt.passage,
                score: c.score,
                anchor: shown.anchors.get(&c.chunk_id).cloned(),
            }
        })
        .collect()
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
    // reaches the prompt, by the same rule as what the thread shows), and the answer becomes
    // its next turn, with those turns as its parents: its provenance includes theirs.
    let (history, parents, thread) = match ext.conversation_id.clone() {
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
                let links: Vec<(i64, Vec<i64>)> =
                    turns.iter().map(|t| (t.seq, t.parents.clone())).collect();
                let views = crate::routes::conversations::views(&services, &user, turns)?;
                let mut history = Vec::new();
                let mut fed = Vec::new();
                for v in views {
                    if let (false, Some(q), Some(a)) = (v.redacted, v.question, v.answer) {
                        history.push((Role::User, q));
                        history.push((Role::Assistant, a));
                        fed.push(v.n);
                    }
                }
                let parents = airlock_evidence::conversations::parents_of(&links, &fed);
                Ok((history, parents, Some((store, id))))
            })
            .await?
        }
        None => (Vec::new(), Vec::new(), None),
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
    let target = pick_generator(&services, req.model.as_deref(), plan.small_model)?;
    let mut model_alias = target.alias().to_string();
    let mut conversation: Vec<(Role, String)> = history;
    conversation.extend(conversation_of(&req.messages)?);
    let question = prompt::last_user_text(&conversation)
        .unwrap_or_default()
        .to_string();

    // Retrieval, re-check, source selection, prompt: blocking work on the answer path.
    let metrics = state.metrics().clone();
    let k = plan.max_prompt_chunks.map_or(top_k, |cap| top_k.min(cap));
    let selection = selection(state.config());
    let follow_ups = state.config().follow_up_query();
    // The rewrite runs on the request's model when it is local, else on the default local one
    // (a rack alias's retrieval query is still made on the appliance).
    let rewriter = match &target {
        Target::Local(g) => Some(g.clone()),
        Target::Remote(_) => services.default_generator().cloned(),
    };
    let rewrite = match (&rewriter, ext.retrieval) {
        (Some(g), true) => {
            crate::rewrite::rewritten(follow_ups, g, &conversation, priority).await?
        }
        _ => None,
    };
    let rewrite_ms = rewrite.as_ref().map(|(_, ms)| *ms);
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let mut prepared = {
        let services = services.clone();
        let user = caller.user_id.clone();
        let time_quantum = state.config().retrieval_time_quantum_for(caller.admin);
        let rid = request_id.clone();
        blocking(move || {
            let mut versions: Vec<String> = Vec::new();
            let (built, citations, retrieval, attribution, sources_ms) = if ext.retrieval {
                // A generator's rewrite is searched as it stands (`Last`); the prompt keeps
                // the conversation as the user wrote it.
                let (searched, follow_ups) = match &rewrite {
                    Some((one, _)) => (one.as_slice(), FollowUps::Last),
                    None => (conversation.as_slice(), follow_ups),
                };
                let shown = services.answer_path.run(
                    &Ask {
                        user_id: &user,
                        request_id: &rid,
                        conversation: searched,
                        k,
                        mode: services.default_mode(),
                        rerank: plan.rerank,
                        time_quantum,
                        follow_ups,
                        purpose: Purpose::Chat(selection),
                    },
                    &metrics,
                )?;
                let citations = citations_of(&shown);
                // The versions shown, those of the chunks themselves (a document replaced
                // since the search has another): kept with a thread's turn and named in the
                // receipt. A chunk gone meanwhile has none ("": no document version matches).
                let chunk_ids: Vec<u32> = citations.iter().map(|c| c.chunk_id).collect();
                let mut of_chunk = services.retrieval.chunk_versions(&chunk_ids)?;
                versions = citations
                    .iter()
                    .map(|c| of_chunk.remove(&c.chunk_id).unwrap_or_default())
                    .collect();
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
            let index_generation = services.retrieval.stats().index_generation;
            let acl_state_seq = services.acl.state_seq();
            let shown: Vec<airlock_evidence::receipts::DocRef> = citations
                .iter()
                .zip(&versions)
                .map(|(c, v)| airlock_evidence::receipts::DocRef {
                    n: c.n,
                    doc_id: c.doc_id.clone(),
                    version: (!v.is_empty()).then(|| v.clone()),
                    chunk_id: c.chunk_id,
                })
                .collect();
            let tp = Instant::now();
            let (prompt, prompt_sha256) = match &target {
                Target::Local(g) => g.prompt_with_digest(&built)?,
                Target::Remote(_) => (Vec::new(), receipt::messages_digest(&built)),
            };
            Ok(Prepared {
                target,
                prompt,
                messages: built,
                versions,
                citations,
                cite: attribution,
                retrieval,
                sources_ms,
                prompt_ms: crate::routes::ms_since(tp),
                prompt_sha256,
                shown,
                index_generation,
                acl_state_seq,
            })
        })
        .await?
    };
    let receipt_id = airlock_evidence::receipts::new_id();
    let served = |prepared: &Prepared, no_source: bool| airlock_evidence::receipts::Served {
        receipt_id: receipt_id.clone(),
        phase: "served".into(),
        bundle: airlock_evidence::receipts::BundleRef {
            version: services.bundle_version().to_string(),
            digest: services.bundle_digest().map(str::to_owned),
        },
        model: receipt::model_ref(&prepared.target),
        index_generation: prepared.index_generation,
        acl_state_seq: prepared.acl_state_seq,
        prompt_sha256: (!no_source).then(|| prepared.prompt_sha256.clone()),
        shown: prepared.shown.clone(),
        cited: no_source.then(Vec::new),
        cited_by: no_source
            .then(|| receipt::cited_by_name(CitedBy::NoSource))
            .flatten(),
    };
    let mut recorder = thread.map(|(store, thread)| TurnRecorder {
        store,
        thread,
        user: caller.user_id.clone(),
        question: question.clone(),
        request_id: request_id.clone(),
        parents,
        sources: prepared
            .citations
            .iter()
            .zip(&prepared.versions)
            .map(|(c, v)| (c.doc_id.clone(), v.clone()))
            .collect(),
    });
    // Stage timings so far (admins, or every caller where configured); the generation's are
    // filled in when it ends.
    let timings_ms = state
        .config()
        .shows_stage_timings(caller.admin)
        .then(|| ChatTimings {
            retrieval: prepared.retrieval.take(),
            query_rewrite: rewrite_ms,
            sources: prepared.sources_ms,
            prompt: prepared.prompt_ms,
            ..ChatTimings::default()
        });
    if ext.retrieval && prepared.citations.is_empty() {
        // The abstention's receipt (complete in one entry) before anything is answered.
        receipt::open(
            &services.acl,
            &request_id,
            &caller.user_id,
            &served(&prepared, true),
        )
        .await?;
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
            timings_ms: timings_ms.map(|t| ChatTimings {
                total: crate::routes::ms_since(t0),
                ..t
            }),
            cited: Some(Vec::new()),
            cited_by: Some(CitedBy::NoSource),
            receipt_id: Some(receipt_id.clone()),
            source_texts: (ext.source_text && !req.stream).then(Vec::new),
        };
        let id_header = HeaderValue::from_str(&request_id).ok();
        let mut resp =
            no_source_answer(req.stream, include_usage, request_id, model_alias, airlock);
        if let Some(v) = id_header {
            resp.headers_mut().insert(REQUEST_ID, v);
        }
        return Ok(with_rung(resp, plan.rung));
    }
    // The rack first: its admission may hand the request to the local small model.
    let submitted = Instant::now();
    let mut fallback: Option<&'static str> = None;
    let mut remote_stream = None;
    if let Target::Remote(r) = &prepared.target {
        // Token quota before anything goes upstream: reserve the estimated prompt plus the
        // most the completion can cost; the upstream's usage settles it.
        let estimate = crate::remote::estimate_tokens(&prepared.messages);
        let reservation = state
            .admission()
            .reserve_tokens(&caller, estimate + params.max_tokens)?;
        let opened = r
            .open(
                ext.conversation_id.as_deref(),
                &prepared.messages,
                &params,
                !req.stream,
                state.metrics(),
            )
            .await;
        match opened {
            Ok(s) => remote_stream = Some((s, reservation, estimate)),
            Err(refusal) => {
                reservation.settle(0);
                let local = services
                    .small_generator()
                    .filter(|_| r.config.fallback_to_local())
                    .cloned();
                let reason = refusal.reason();
                let label = crate::remote::BackendLabel {
                    backend: r.alias.clone(),
                };
                match (local, refusal) {
                    (_, crate::remote::Refusal::Refused(m)) => {
                        return Err(ApiError::UpstreamFailed(m));
                    }
                    (Some(g), _) => {
                        tracing::warn!(backend = %r.alias, fallback = %g.alias, reason,
                            "remote generator unavailable: answering with the local model");
                        state
                            .metrics()
                            .rack
                            .fallbacks
                            .get_or_create(&crate::remote::FallbackLabel {
                                from: r.alias.clone(),
                                reason,
                            })
                            .inc();
                        fallback = Some(reason);
                        model_alias = g.alias.clone();
                        let messages = prepared.messages.clone();
                        let local = g.clone();
                        (prepared.prompt, prepared.prompt_sha256) =
                            blocking(move || local.prompt_with_digest(&messages)).await?;
                        prepared.target = Target::Local(g);
                    }
                    (
                        None,
                        crate::remote::Refusal::Saturated { retry_after }
                        | crate::remote::Refusal::Unhealthy { retry_after },
                    ) => {
                        state.metrics().rack.shed.get_or_create(&label).inc();
                        return Ok(with_rung(
                            ApiError::CapacityUnavailable { retry_after }.into_response(),
                            plan.rung,
                        ));
                    }
                    (None, crate::remote::Refusal::Failed(m)) => {
                        return Err(ApiError::UpstreamFailed(m));
                    }
                }
            }
        }
    }

    let (source, reservation, prompt_tokens, first, queue, admitted_at, submitted) =
        match (remote_stream, &prepared.target) {
            (Some((stream, reservation, estimate)), _) => {
                tracing::info!(
                    gen_ai.request.model = %model_alias,
                    airlock.replica = %stream.replica().upstream.authority(),
                    airlock.rung = plan.rung,
                    airlock.citations = prepared.citations.len(),
                    "generation sent to the rack"
                );
                let admitted = stream.sent_at();
                (
                    Source::Remote(Box::new(stream)),
                    reservation,
                    estimate,
                    None,
                    None,
                    Some(admitted),
                    submitted,
                )
            }
            (None, Target::Remote(_)) => {
                return Err(ApiError::internal("remote target without a stream"));
            }
            (None, Target::Local(generator)) => {
                let generator = generator.clone();
                let prompt_tokens = prepared.prompt.len();
                // Token quota: reserve the most this request can cost; the unused part is
                // refunded when the generation ends (Generation's drop).
                let reservation = state
                    .admission()
                    .reserve_tokens(&caller, prompt_tokens + params.max_tokens)?;
                let queue = state.admission().enqueue();
                let submitted = Instant::now();
                // The engine admits interactive requests before queued batch/eval ones.
                let mut stream = generator
                    .engine()
                    .submit_with_priority(
                        GenerateRequest {
                            prompt: std::mem::take(&mut prepared.prompt),
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

                // Rung 4: a bounded wait for the first output (token or end), else 504. The
                // engine's admission event on the way ends the queue wait but not the deadline.
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
                (
                    Source::Local {
                        stream,
                        engine: generator.engine().counters(),
                    },
                    reservation,
                    prompt_tokens,
                    first,
                    queue,
                    admitted_at,
                    submitted,
                )
            }
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
    // Its receipt, before the answer's first byte: no receipt, no answer.
    if let Err(e) = receipt::open(
        &services.acl,
        &request_id,
        &caller.user_id,
        &served(&prepared, false),
    )
    .await
    {
        reservation.settle(0);
        return Err(e);
    }
    let closer = receipt::Closer {
        acl: services.acl.clone(),
        receipt_id: receipt_id.clone(),
        request_id: request_id.clone(),
        user_id: caller.user_id.clone(),
    };

    let generation = Generation {
        source,
        backend: model_alias.clone(),
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
        receipt: Some(closer),
    };
    let airlock = AirlockResponse {
        citations: prepared.citations,
        rung: plan.rung,
        bundle_version: Some(services.bundle_version().to_string()),
        timings_ms,
        cited: None,
        cited_by: None,
        receipt_id: Some(receipt_id),
        source_texts: (ext.source_text && !req.stream).then(|| {
            prepared
                .cite
                .as_ref()
                .map(|c| c.sources().to_vec())
                .unwrap_or_default()
        }),
    };
    let cite = prepared.cite;
    let id = request_id;
    // The completion id and `X-Request-Id` are the same value (the web UI rates answers by
    // either): set it here, since an unusable client id was replaced by a fresh one.
    let id_header = HeaderValue::from_str(&id).ok();
    let mut resp = if req.stream {
        let quote = state.config().quote_supporting_passage();
        sse(
            generation,
            id,
            model_alias,
            airlock,
            cite,
            include_usage,
            quote,
        )
        .keep_alive(
            KeepAlive::new()
                .interval(state.config().sse_keep_alive())
                .text("keep-alive"),
        )
        .into_response()
    } else {
        let withhold = state.config().withhold_unsupported_answers();
        let quote = state.config().quote_supporting_passage();
        complete(generation, id, model_alias, airlock, cite, withhold, quote)
            .await?
            .into_response()
    };
    if let Some(v) = id_header {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    if fallback.is_some() {
        resp.headers_mut().insert(
            crate::remote::FALLBACK_HEADER,
            HeaderValue::from_static("true"),
        );
    }
    Ok(with_rung(resp, plan.rung))
}

/// Records a served completion for feedback (id, user, model, rung, bundle; never text).
pub(super) async fn record(
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
