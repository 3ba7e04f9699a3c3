//! `POST /v1/chat/completions`: the RAG request path of DESIGN.md §4, OpenAI shapes, non-streaming
//! and SSE. This is the HTTP adapter: it checks the wire request, admits it, runs the answer
//! core (`airlock_serving::answer`: retrieval and prompt building on the blocking pool,
//! generation on the engine thread or the rack) and shapes its answer or refusal. A client that
//! goes away drops the stream, which cancels the sequence at the engine's next step (hyper
//! notices the closed connection while the answer is pending or streaming and drops the handler
//! or the body, and with it the engine stream).

use std::time::Instant;

use airlock_rag::{CitedBy, Selection};
use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::sse::KeepAlive;
use axum::response::{IntoResponse, Response};

use crate::auth::Caller;
use crate::config::Config;
use crate::error::ApiError;
use crate::extract::{ApiJson, RequestId};
use crate::openai::{AirlockResponse, ChatRequest};
use crate::routes::REQUEST_ID;
use crate::state::AppState;
use airlock_serving::admission::{AdmissionError, Ticket};
use airlock_serving::answer::{self, Answer, Chat, Core, Generated, Given, Settings, Timings};

mod refusal;
mod request;
mod stream;

use refusal::refused;
pub(crate) use request::{conversation_of, validate};
use stream::{complete, no_source_answer, sse, with_rung};

pub use airlock_serving::answer::CITATION_SNIPPET_BYTES;
/// Most chunks a request may ask for.
pub const MAX_TOP_K: usize = 20;
/// Most messages a conversation may hold.
pub const MAX_MESSAGES: usize = 256;
/// Largest `max_tokens` accepted.
pub const MAX_COMPLETION_TOKENS: u32 = 4096;

/// How a chat chooses its prompt sources, from the configuration (docs/operations/answer-sources.md):
/// the chat's and `POST /v1/retrieve` with `prompt_sources`.
pub(crate) fn selection(config: &crate::config::Config) -> Selection {
    Selection {
        floor: config.min_source_similarity(),
        check_names: config.abstain_on_unmatched_names(),
        check_terms: config.abstain_on_unknown_terms(),
        focus: config.source_focus(),
        near_copy: config.source_focus_near_copy(),
        semantic: config.semantic_focus(),
        facets: config.facet_retrieval(),
    }
}

/// `POST /v1/chat/completions`: the wire request checked, the answer core run for the caller
/// (`airlock_serving::answer`), its answer or refusal in OpenAI's shapes.
pub async fn completions(
    State(state): State<AppState>,
    caller: Caller,
    crate::routes::priority::PriorityHeader(priority): crate::routes::priority::PriorityHeader,
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
    if let Some(id) = &ext.conversation_id {
        crate::routes::conversations::check_id(id)?;
    }
    let id = ext.conversation_id.clone();
    let history = match answer::history(&services, &caller.user_id, id).await {
        Ok(h) => h,
        Err(e) => return Ok(refused(e)),
    };
    let ticket = match state.admission().admit(&caller, ext.rung, priority) {
        Ok(t) => t,
        Err(e @ AdmissionError::Shed { .. }) => {
            let rung = ext.rung.unwrap_or_else(|| state.admission().current_rung());
            return Ok(with_rung(ApiError::from(e).into_response(), rung));
        }
        Err(e) => return Err(e.into()),
    };
    let chat = Chat {
        request_id: request_id.clone(),
        messages: conversation_of(&req.messages)?,
        model: req.model.clone(),
        params,
        retrieval: ext.retrieval,
        top_k,
        conversation_id: ext.conversation_id.clone(),
        whole: !req.stream,
        priority,
        t0,
    };
    let metrics = state.metrics().answer();
    let cx = Core {
        services: &services,
        metrics: &metrics,
        admission: state.admission(),
        caller: &caller,
        settings: settings(state.config(), caller.admin),
    };
    let answer = match answer::answer(&cx, ticket, history, chat).await {
        Ok(a) => a,
        Err(e) => return Ok(refused(e)),
    };
    let wire = Wire {
        stream: req.stream,
        include_usage: req.stream_options.as_ref().is_some_and(|o| o.include_usage),
        source_text: ext.source_text && !req.stream,
        bundle_version: services.bundle_version().to_string(),
        request_id,
        t0,
    };
    respond(&state, wire, answer).await
}

/// How the client asked to be answered.
struct Wire {
    stream: bool,
    include_usage: bool,
    /// `airlock.source_text` on a non-streamed answer.
    source_text: bool,
    bundle_version: String,
    request_id: String,
    t0: Instant,
}

/// The answer in the shape the client asked for, with `X-Request-Id`, the rung and, when the
/// rack handed the request to the local model, the fallback header.
async fn respond(state: &AppState, wire: Wire, answer: Answer) -> Result<Response, ApiError> {
    // The completion id and `X-Request-Id` are the same value (the web UI rates answers by
    // either): set it here, since an unusable client id was replaced by a fresh one.
    let id_header = HeaderValue::from_str(&wire.request_id).ok();
    let Answer {
        model,
        rung,
        receipt_id,
        timings,
        given,
    } = answer;
    let mut airlock = AirlockResponse {
        citations: Vec::new(),
        rung,
        bundle_version: Some(wire.bundle_version.clone()),
        timings_ms: timings,
        cited: None,
        cited_by: None,
        receipt_id: Some(receipt_id),
        source_texts: None,
    };
    // An abstention's admission ends with its response.
    let (mut resp, fallback, _held): (Response, _, Option<Ticket>) = match given {
        Given::NoSource { ticket } => {
            airlock.timings_ms = airlock.timings_ms.map(|t| Timings {
                total: crate::routes::ms_since(wire.t0),
                ..t
            });
            airlock.cited = Some(Vec::new());
            airlock.cited_by = Some(CitedBy::NoSource);
            airlock.source_texts = wire.source_text.then(Vec::new);
            let (stream, usage) = (wire.stream, wire.include_usage);
            let resp = no_source_answer(stream, usage, wire.request_id, model, airlock);
            (resp, None, Some(ticket))
        }
        Given::Generated(g) => {
            let fallback = g.fallback;
            (
                generated(state, wire, model, airlock, *g).await?,
                fallback,
                None,
            )
        }
    };
    if let Some(v) = id_header {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    if fallback.is_some() {
        resp.headers_mut().insert(
            airlock_serving::remote::FALLBACK_HEADER,
            HeaderValue::from_static("true"),
        );
    }
    Ok(with_rung(resp, rung))
}

/// A generation's answer: the SSE stream with keep-alive comments, or the whole completion.
async fn generated(
    state: &AppState,
    wire: Wire,
    model: String,
    mut airlock: AirlockResponse,
    g: Generated,
) -> Result<Response, ApiError> {
    let Generated {
        generation,
        citations,
        cite,
        ..
    } = g;
    airlock.citations = citations;
    airlock.source_texts = wire.source_text.then(|| {
        cite.as_ref()
            .map(|c| c.sources().to_vec())
            .unwrap_or_default()
    });
    let config = state.config();
    let id = wire.request_id;
    if wire.stream {
        let quote = config.quote_supporting_passage();
        let body = sse(
            generation,
            id,
            model,
            airlock,
            cite,
            wire.include_usage,
            quote,
        );
        let keep_alive = KeepAlive::new()
            .interval(config.sse_keep_alive())
            .text("keep-alive");
        Ok(body.keep_alive(keep_alive).into_response())
    } else {
        let withhold = config.withhold_unsupported_answers();
        let quote = config.quote_supporting_passage();
        let done = complete(generation, id, model, airlock, cite, withhold, quote).await;
        Ok(done.map_err(ApiError::from)?.into_response())
    }
}

/// What the answer core takes from the configuration, for `admin` or not.
fn settings(config: &Config, admin: bool) -> Settings {
    Settings {
        selection: selection(config),
        follow_ups: config.follow_up_query(),
        time_quantum: config.retrieval_time_quantum_for(admin),
        stage_timings: config.shows_stage_timings(admin),
        idle_timeout: config.stream_idle_timeout(),
    }
}
