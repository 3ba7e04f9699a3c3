//! What a response says about an answer besides its text: the sources shown ([`Citation`])
//! and the milliseconds per stage ([`Timings`]). Their serde shapes are the API's (API.md: the
//! `airlock` extension's `citations` and `timings_ms`); the binary puts them on the wire as
//! they are.

use serde::{Deserialize, Serialize};

/// One citation: a chunk that was placed in the prompt as source `[n]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Citation {
    /// The source number in the prompt (1-based).
    pub n: usize,
    /// The document.
    pub doc_id: String,
    /// The chunk.
    pub chunk_id: u32,
    /// The document title.
    pub title: String,
    /// A short excerpt of the chunk around its supporting passage (or the chunk's beginning
    /// when no sentence of it matches the question or answer).
    pub snippet: String,
    /// The sentence(s) of the chunk that best support the answer (a non-streaming response;
    /// a stream sends them on its last event, `passages`) or, before the answer exists, best
    /// match the question: a substring of `snippet` ([`airlock_rag::passage`]). Absent when no
    /// sentence shares a content word with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passage: Option<String>,
    /// Final retrieval score.
    pub score: f32,
    /// Where the chunk sits in its original file (`page`, `sheet`, `rows`, `slide`, `section`;
    /// absent for text documents), as in `/v1/retrieve` results.
    #[serde(flatten, default)]
    pub anchor: Option<airlock_retrieval::ingest::Anchor>,
}

/// Per-stage milliseconds of one chat completion.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Timings {
    /// Retrieval stages (absent with `retrieval: false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retrieval: Option<airlock_rag::StageTimings>,
    /// The generator's rewrite of a follow-up into a stand-alone question
    /// (`follow_up_query = "rewrite"`; absent otherwise and on a first turn).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query_rewrite: Option<f64>,
    /// Choosing the prompt's sources among the retrieved chunks: similarity floor, name check,
    /// source focus (with its semantic judgement at the full-pipeline rung).
    pub sources: f64,
    /// Prompt building: sources, chat template, tokenization.
    pub prompt: f64,
    /// From submission to the engine until the first generated token (queue + prefill).
    pub first_token: f64,
    /// From submission until the engine admitted the sequence (waiting for a batch slot).
    pub queue_wait: f64,
    /// From the engine's admission until the first generated token (the prompt's prefill,
    /// shared with whatever else the engine runs).
    pub prefill: f64,
    /// From the first token to the last.
    pub decode: f64,
    /// Whole handler after authentication.
    pub total: f64,
}
