//! `POST /v1/retrieve`: the retrieval path alone, for apps and evals. Only chunks of documents
//! the caller may read, never tombstoned ones, re-checked like the chat path.

use std::time::Instant;

use airlock_retrieval::{SearchMode, StageScores};
use axum::Json;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, RequestId};
use crate::openai::ChatMessage;
use crate::routes::{RUNG_HEADER, acl::blocking};
use crate::state::AppState;
use airlock_rag::passage::excerpt;
use airlock_rag::{Ask, FollowUps, Purpose, Role, StageTimings};

/// Longest snippet, in bytes.
pub const SNIPPET_BYTES: usize = 400;

/// Body of `POST /v1/retrieve`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrieveRequest {
    /// The query (or give `messages`).
    #[serde(default)]
    pub query: String,
    /// A conversation instead of `query` (OpenAI chat messages): the retrieval query is built
    /// from it as for a chat, so a follow-up retrieves what the chat would.
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    /// Chunks wanted (default 10; with `prompt_sources`, the chat's `top_k`).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// `hybrid` (default when the vector index is available, else `bm25`), `bm25` or `vector`.
    #[serde(default)]
    pub mode: Option<SearchMode>,
    /// Cross-encoder rerank when the rung allows it (default true).
    #[serde(default = "yes")]
    pub rerank: bool,
    /// Send each chunk's full text as `text` (default false: the snippet only). For clients
    /// that place the chunks in a prompt of their own, as the eval's plain baseline does.
    #[serde(default)]
    pub include_text: bool,
    /// Return the chunks a chat answer to this question would place in its prompt: the
    /// retrieval with the chat's source selection applied (similarity floor, name check, source
    /// focus, facets: docs/operations/answer-sources.md), in prompt order, at most `top_k` (default: the
    /// chat's). What an operator reads to see why an answer did not use a page, and what the
    /// eval's `--sources-only` scores. Default false: the retrieval's ranking.
    #[serde(default)]
    pub prompt_sources: bool,
}

/// `top_k` of a retrieval when the request gives none.
const DEFAULT_TOP_K: usize = 10;
fn yes() -> bool {
    true
}

/// One result.
#[derive(Debug, Serialize)]
pub struct RetrieveHit {
    /// Document id.
    pub doc_id: String,
    /// Chunk id.
    pub chunk_id: u32,
    /// Document title.
    pub title: String,
    /// Excerpt of the chunk around its passage (or its beginning).
    pub snippet: String,
    /// The sentence(s) of the chunk that best match the question, a substring of `snippet`
    /// ([`airlock_rag::passage`]); absent when none shares a content word with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passage: Option<String>,
    /// Final score.
    pub score: f32,
    /// Score at each stage.
    pub stage_scores: StageScores,
    /// Where the chunk sits in its original file (extracted PDF, Office, e-mail and CSV files;
    /// absent for text documents): `page`, `sheet`, `rows`, `slide`, `section` (heading path,
    /// outermost first).
    #[serde(flatten)]
    pub anchor: Option<airlock_retrieval::ingest::Anchor>,
    /// The chunk's full text (`include_text: true` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// Response of `POST /v1/retrieve`.
#[derive(Debug, Serialize)]
pub struct RetrieveResponse {
    /// Best first.
    pub results: Vec<RetrieveHit>,
    /// The rung that served the request.
    pub rung: u8,
    /// Milliseconds per stage (admins only: [`crate::Config::shows_stage_timings`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings_ms: Option<Timings>,
}

/// `timings_ms`: the retrieval stages plus auth and admission.
#[derive(Debug, Serialize)]
pub struct Timings {
    /// The generator's rewrite of a follow-up (`follow_up_query = "rewrite"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query_rewrite: Option<f64>,
    /// Retrieval stages.
    #[serde(flatten)]
    pub stages: StageTimings,
    /// Whole handler after authentication.
    pub handler: f64,
}

/// `POST /v1/retrieve`.
pub async fn retrieve(
    State(state): State<AppState>,
    caller: Caller,
    crate::routes::priority::PriorityHeader(priority): crate::routes::priority::PriorityHeader,
    RequestId(request_id): RequestId,
    ApiJson(req): ApiJson<RetrieveRequest>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let conversation: Vec<(Role, String)> = match (&req.messages, req.query.trim().is_empty()) {
        (Some(_), false) => {
            return Err(ApiError::InvalidRequest(
                "give either `query` or `messages`, not both".into(),
            ));
        }
        (None, true) => {
            return Err(ApiError::InvalidRequest("`query` must not be empty".into()));
        }
        (None, false) => vec![(Role::User, req.query.clone())],
        (Some(m), true) => crate::routes::chat::conversation_of(m)?,
    };
    let top_k = match (req.top_k, req.prompt_sources) {
        (Some(k), _) => k,
        (None, true) => state.config().top_k(),
        (None, false) => DEFAULT_TOP_K,
    };
    if !(1..=100).contains(&top_k) {
        return Err(ApiError::InvalidRequest(
            "`top_k` must be between 1 and 100".into(),
        ));
    }
    let ticket = state.admission().admit(&caller, None, priority)?;
    let sees_timings = state.config().shows_stage_timings(caller.admin);
    let time_quantum = state.config().retrieval_time_quantum_for(caller.admin);
    let follow_ups = state.config().follow_up_query();
    let plan = ticket.plan;
    let purpose = if req.prompt_sources {
        Purpose::Chat(crate::routes::chat::selection(state.config()))
    } else {
        Purpose::Retrieve
    };
    let k = match (req.prompt_sources, plan.max_prompt_chunks) {
        (true, Some(cap)) => top_k.min(cap),
        _ => top_k,
    };
    let services = state.services()?;
    let metrics = state.metrics().clone();
    // `follow_up_query = "rewrite"`: the default generator rewrites a follow-up, as chat does,
    // so that retrieval measures what the chat retrieves.
    let rewrite = match services.default_generator() {
        Some(g) if req.messages.is_some() => {
            airlock_serving::answer::rewrite::rewritten(follow_ups, g, &conversation, priority)
                .await?
        }
        _ => None,
    };
    let query_rewrite = rewrite.as_ref().map(|(_, ms)| *ms);
    let (conversation, follow_ups) = match rewrite {
        Some((one, _)) => (one, FollowUps::Last),
        None => (conversation, follow_ups),
    };
    let retrieved = blocking(move || {
        let ask = Ask {
            user_id: &caller.user_id,
            request_id: &request_id,
            conversation: &conversation,
            k,
            mode: req.mode.unwrap_or_else(|| services.default_mode()),
            rerank: req.rerank && plan.rerank,
            time_quantum,
            follow_ups,
            purpose,
        };
        // Every document shown to the caller is audited by the answer path, as for chat.
        Ok(services.answer_path.run(&ask, &metrics)?)
    })
    .await?;
    drop(ticket);
    let mut retrieved = retrieved;
    let mut anchors = std::mem::take(&mut retrieved.anchors);
    let include_text = req.include_text;
    let question = retrieved
        .stand_alone
        .take()
        .unwrap_or_else(|| retrieved.query.clone());
    let results = retrieved
        .chunks
        .into_iter()
        .map(|r| {
            let excerpt = excerpt(&r.text, &question, SNIPPET_BYTES);
            RetrieveHit {
                anchor: anchors.remove(&r.chunk_id),
                snippet: excerpt.snippet,
                passage: excerpt.passage,
                doc_id: r.doc_id,
                chunk_id: r.chunk_id,
                title: r.title,
                score: r.score,
                stage_scores: r.stage_scores,
                text: include_text.then_some(r.text),
            }
        })
        .collect();
    let body = RetrieveResponse {
        results,
        rung: plan.rung,
        timings_ms: sees_timings.then(|| Timings {
            query_rewrite,
            stages: retrieved.timings,
            handler: crate::routes::ms_since(t0),
        }),
    };
    let mut resp = Json(body).into_response();
    resp.headers_mut()
        .insert(RUNG_HEADER, HeaderValue::from(u16::from(plan.rung)));
    Ok(resp)
}
