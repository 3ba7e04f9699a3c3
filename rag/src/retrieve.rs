//! The retrieval half of the request path (DESIGN.md §4): the caller's allow set → hybrid search
//! (BM25 ∥ vector, fusion, rescoring, rerank by rung) → the re-check of every chunk against the
//! CURRENT ACL and tombstones just before the prompt, dropping (counting and auditing) any
//! chunk that fails. Blocking: run it on the blocking pool.

use std::time::Instant;

use airlock_acl::Acl;
use airlock_retrieval::{Retrieval, SearchMode, SearchRequest, SearchResult, Timings};
use serde::Serialize;

use crate::{Count, Error, Meter};

/// What to retrieve.
#[derive(Debug, Clone)]
pub struct RetrieveParams<'a> {
    /// The caller.
    pub user_id: &'a str,
    /// The request id (audit key).
    pub request_id: &'a str,
    /// The query text.
    pub query: &'a str,
    /// Chunks wanted.
    pub k: usize,
    /// Retrievers.
    pub mode: SearchMode,
    /// Cross-encoder rerank (only if the rung allows it and a reranker is installed).
    pub rerank: bool,
    /// The retrieval ends on a multiple of this since it began (zero: at once); non-admins get
    /// the configured quantum, so the time does not depend on documents they cannot read.
    pub time_quantum: std::time::Duration,
}

/// Per-stage milliseconds of one retrieval, as reported in `timings_ms`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StageTimings {
    /// Query embedding.
    pub embed: f64,
    /// BM25.
    pub bm25: f64,
    /// Vector search.
    pub vector: f64,
    /// Rank fusion.
    pub fusion: f64,
    /// Full-precision rescoring.
    pub rescore: f64,
    /// Cross-encoder rerank.
    pub rerank: f64,
    /// Reading chunk texts.
    pub fetch: f64,
    /// The pre-prompt ACL + tombstone re-check.
    pub recheck: f64,
    /// Whole retrieval.
    pub total: f64,
}

impl StageTimings {
    pub(crate) fn from_search(t: &Timings) -> Self {
        StageTimings {
            embed: t.embed_ms,
            bm25: t.bm25_ms,
            vector: t.vector_ms,
            fusion: t.fuse_ms,
            rescore: t.rescore_ms,
            rerank: t.rerank_ms,
            fetch: t.fetch_ms,
            recheck: 0.0,
            total: t.total_ms,
        }
    }

    /// Adds another retrieval's stages (a question retrieved once per facet).
    pub fn add(&mut self, o: &StageTimings) {
        self.embed += o.embed;
        self.bm25 += o.bm25;
        self.vector += o.vector;
        self.fusion += o.fusion;
        self.rescore += o.rescore;
        self.rerank += o.rerank;
        self.fetch += o.fetch;
        self.recheck += o.recheck;
        self.total += o.total;
    }

    /// Records every stage (the appliance's `airlock_retrieval_stage_seconds`).
    pub fn observe(&self, m: &dyn Meter) {
        for (stage, ms) in [
            ("embed", self.embed),
            ("bm25", self.bm25),
            ("vector", self.vector),
            ("fusion", self.fusion),
            ("rescore", self.rescore),
            ("rerank", self.rerank),
            ("fetch", self.fetch),
            ("recheck", self.recheck),
            ("retrieval_total", self.total),
        ] {
            if ms > 0.0 {
                m.stage(stage, ms / 1e3);
            }
        }
    }
}

/// The chunks that survived the re-check, best first, and the timings.
#[derive(Debug)]
pub struct Retrieved {
    /// Chunks safe to show this caller right now.
    pub chunks: Vec<SearchResult>,
    /// Chunks dropped by the re-check.
    pub dropped: usize,
    /// Stage timings.
    pub timings: StageTimings,
}

/// Runs the search for the caller's current allow set, then the re-check. Blocking.
pub fn retrieve(
    acl: &Acl,
    retrieval: &Retrieval,
    metrics: &dyn Meter,
    p: &RetrieveParams<'_>,
) -> Result<Retrieved, Error> {
    let started = Instant::now();
    let allow = acl.allow_set(p.user_id);
    let req = SearchRequest {
        query: p.query,
        k: p.k,
        mode: p.mode,
        rescore: true,
        rerank: p.rerank,
    };
    let resp = retrieval.search(&req, &allow)?;
    let mut timings = StageTimings::from_search(&resp.timings);
    let t = Instant::now();
    let (chunks, dropped_docs) = recheck(acl, retrieval, p.user_id, resp.results);
    timings.recheck = t.elapsed().as_secs_f64() * 1e3;
    timings.total += timings.recheck;
    let dropped = dropped_docs.len();
    if dropped > 0 {
        metrics.count(Count::RecheckDrops, dropped as u64);
        tracing::warn!(
            dropped,
            "re-check dropped chunks that changed access since the search"
        );
        acl.audit_recheck_drop(p.request_id, p.user_id, &dropped_docs)?;
    }
    timings.observe(metrics);
    wait_for_quantum(started, p.time_quantum);
    Ok(Retrieved {
        chunks,
        dropped,
        timings,
    })
}

/// Sleeps until the time since `started` is a whole multiple of `quantum` (at least one). The
/// search reads the postings of the query's words in every document, so its duration grows with
/// how many documents the caller cannot read contain them; rounded up to a quantum, a difference
/// much smaller than the quantum shows only when it crosses a boundary (docs/operations/side-channels.md).
/// Runs on a blocking thread.
fn wait_for_quantum(started: Instant, quantum: std::time::Duration) {
    if quantum.is_zero() {
        return;
    }
    let elapsed = started.elapsed();
    let n = elapsed.as_nanos().div_ceil(quantum.as_nanos()).max(1);
    let until = quantum.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
    if let Some(rest) = until.checked_sub(elapsed) {
        std::thread::sleep(rest);
    }
}

/// The generation-time re-check: keeps a chunk only if the caller may read its document in the
/// CURRENT ACL state and the chunk is still live (not tombstoned or superseded). Returns the
/// kept chunks and the document ids of the dropped ones.
///
/// The ACL state and the chunk snapshot are published separately, so the check reads one ACL
/// state, checks every chunk against it, and starts again if the ACL state changed meanwhile:
/// writers hide a document's old chunks before a new grant is published and show its new
/// chunks only after, so a chunk live under a stable ACL state is readable under that state's
/// grant. When the ACL state keeps changing, nothing is kept.
pub fn recheck(
    acl: &Acl,
    retrieval: &Retrieval,
    user_id: &str,
    results: Vec<SearchResult>,
) -> (Vec<SearchResult>, Vec<String>) {
    const ATTEMPTS: usize = 8;
    for _ in 0..ATTEMPTS {
        let state = acl.snapshot();
        let allow = state.allow_set(user_id);
        let keep: Vec<bool> = results
            .iter()
            .map(|r| retrieval.is_visible(r.chunk_id, &allow))
            .collect();
        if acl.snapshot().generation() != state.generation() {
            continue;
        }
        let mut kept = Vec::with_capacity(results.len());
        let mut dropped = Vec::new();
        for (r, k) in results.into_iter().zip(keep) {
            if k {
                kept.push(r);
            } else {
                dropped.push(r.doc_id);
            }
        }
        return (kept, dropped);
    }
    tracing::warn!("re-check: the ACL state changed during every attempt; dropping all chunks");
    let dropped = results.into_iter().map(|r| r.doc_id).collect();
    (Vec::new(), dropped)
}
