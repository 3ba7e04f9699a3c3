//! `POST /v1/retrieve`: the retrieval path alone, for apps and evals. Only chunks of documents
//! the caller may read, never tombstoned ones, re-checked like the chat path.

use std::time::Instant;

use airlock_retrieval::{SearchMode, StageScores};
use axum::Json;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::admission::Priority;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, RequestId};
use crate::prompt::snippet;
use crate::rag::{self, RetrieveParams, StageTimings};
use crate::routes::{RUNG_HEADER, acl::blocking};
use crate::state::AppState;

/// Longest snippet, in bytes.
pub const SNIPPET_BYTES: usize = 400;

/// Body of `POST /v1/retrieve`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrieveRequest {
    /// The query.
    pub query: String,
    /// Chunks wanted (default 10).
    #[serde(default = "default_top_k")]
    pub top_k: usize,
    /// `hybrid` (default when the vector index is available, else `bm25`), `bm25` or `vector`.
    #[serde(default)]
    pub mode: Option<SearchMode>,
    /// Cross-encoder rerank when the rung allows it (default true).
    #[serde(default = "yes")]
    pub rerank: bool,
}

fn default_top_k() -> usize {
    10
}
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
    /// Excerpt of the chunk.
    pub snippet: String,
    /// Final score.
    pub score: f32,
    /// Score at each stage.
    pub stage_scores: StageScores,
    /// Where the chunk sits in its original file (extracted PDF, Office, e-mail and CSV files;
    /// absent for text documents): `page`, `sheet`, `rows`, `slide`, `section` (heading path,
    /// outermost first).
    #[serde(flatten)]
    pub anchor: Option<airlock_retrieval::ingest::Anchor>,
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
    priority: Priority,
    RequestId(request_id): RequestId,
    ApiJson(req): ApiJson<RetrieveRequest>,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    if req.query.trim().is_empty() {
        return Err(ApiError::InvalidRequest("`query` must not be empty".into()));
    }
    if !(1..=100).contains(&req.top_k) {
        return Err(ApiError::InvalidRequest(
            "`top_k` must be between 1 and 100".into(),
        ));
    }
    let ticket = state.admission().admit(&caller, None, priority)?;
    let sees_timings = state.config().shows_stage_timings(caller.admin);
    let time_quantum = state.config().retrieval_time_quantum_for(caller.admin);
    let plan = ticket.plan;
    let services = state.services()?;
    let metrics = state.metrics().clone();
    let retrieved = blocking(move || {
        let p = RetrieveParams {
            user_id: &caller.user_id,
            request_id: &request_id,
            query: &req.query,
            k: req.top_k,
            mode: req.mode.unwrap_or_else(|| services.default_mode()),
            rerank: req.rerank && plan.rerank,
            time_quantum,
        };
        let retrieved = rag::retrieve(&services, &metrics, &p)?;
        // Every document shown to the caller is audited, as for chat citations.
        if !retrieved.chunks.is_empty() {
            let mut ids: Vec<&str> = retrieved.chunks.iter().map(|c| c.doc_id.as_str()).collect();
            ids.sort_unstable();
            ids.dedup();
            services
                .acl
                .audit_shown(&request_id, &caller.user_id, &ids)?;
        }
        // Anchors of extracted files, for the caller's documents only (re-checked here).
        let chunk_ids: Vec<u32> = retrieved.chunks.iter().map(|c| c.chunk_id).collect();
        let allow = services.acl.allow_set(&caller.user_id);
        let anchors = services.retrieval.chunk_anchors(&chunk_ids, &allow)?;
        Ok((retrieved, anchors))
    })
    .await?;
    drop(ticket);
    let (retrieved, mut anchors) = retrieved;
    let results = retrieved
        .chunks
        .into_iter()
        .map(|r| RetrieveHit {
            anchor: anchors.remove(&r.chunk_id),
            snippet: snippet(&r.text, SNIPPET_BYTES),
            doc_id: r.doc_id,
            chunk_id: r.chunk_id,
            title: r.title,
            score: r.score,
            stage_scores: r.stage_scores,
        })
        .collect();
    let body = RetrieveResponse {
        results,
        rung: plan.rung,
        timings_ms: sees_timings.then(|| Timings {
            stages: retrieved.timings,
            handler: crate::routes::ms_since(t0),
        }),
    };
    let mut resp = Json(body).into_response();
    resp.headers_mut()
        .insert(RUNG_HEADER, HeaderValue::from(u16::from(plan.rung)));
    Ok(resp)
}
