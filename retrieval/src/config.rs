//! Typed configuration of the retrieval engine (the daemon fills it from its own config file).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Chunking parameters, in tokens of the embedder's tokenizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChunkConfig {
    /// Target chunk length. Capped at the embedder's `max_tokens()` minus its special tokens and
    /// the title line prefixed to every chunk, so with MiniLM (256) the effective size stays
    /// below 256 whatever is set here.
    pub target_tokens: usize,
    /// Overlap between consecutive chunks of one section, as a fraction of the chunk length.
    /// No overlap is added across a heading.
    pub overlap: f32,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        Self {
            target_tokens: 400,
            overlap: 0.15,
        }
    }
}

/// Which stop words the BM25 analyzer removes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopWords {
    /// Tantivy's English list (Lucene's 33 words).
    English,
    /// Keep every word.
    None,
    /// An explicit list (lowercase).
    Custom(Vec<String>),
}

/// Default [`Bm25Config::avg_chunk_tokens`]: a round value between the measured averages of
/// Cranfield (91 tokens per chunk) and bank-dev (113) at the 256-token chunk cap; on both dev
/// sets nDCG@10 moves by at most ±0.013 for values 64–160 (docs/benchmarks/retrieval.md §4).
pub(crate) const AVG_CHUNK_TOKENS: f32 = 100.0;

/// BM25 analysis parameters (tantivy scores with k1 = 1.2, b = 0.75).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Bm25Config {
    /// Snowball English stemming.
    pub stemming: bool,
    /// Stop words removed at index and query time. Changing it needs `reindex`.
    pub stop_words: StopWords,
    /// Tantivy writer memory budget in bytes.
    pub writer_memory_bytes: usize,
    /// Average chunk length, in BM25 tokens (after stop words), used by BM25's length
    /// normalisation. A constant rather than the index's own average, which would depend on
    /// documents the caller cannot read (issue 19, F2); chunks are length-bounded, so one value
    /// fits a deployment. Scoring only: changing it needs no reindex.
    pub avg_chunk_tokens: f32,
}

impl Default for Bm25Config {
    fn default() -> Self {
        Self {
            stemming: true,
            stop_words: StopWords::English,
            writer_memory_bytes: 64 << 20,
            avg_chunk_tokens: AVG_CHUNK_TOKENS,
        }
    }
}

/// Hybrid search parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// Reciprocal rank fusion constant: score = Σ 1 / (rrf_k + rank), ranks 1-based.
    pub rrf_k: f32,
    /// Candidates taken from each of BM25 and the vector index before fusion (at least `k`).
    pub candidates: usize,
    /// How many fused candidates are rescored with full-precision vectors.
    pub rescore_depth: usize,
    /// How many candidates go to the reranker when reranking is requested.
    pub rerank_depth: usize,
    /// Largest `k` a search may ask for.
    pub max_k: usize,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            rrf_k: 60.0,
            candidates: 100,
            rescore_depth: 100,
            rerank_depth: 30,
            max_k: 1000,
        }
    }
}

/// Everything the engine needs besides paths and models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrievalConfig {
    /// Chunking.
    pub chunk: ChunkConfig,
    /// BM25 analysis.
    pub bm25: Bm25Config,
    /// Fusion, rescoring and rerank depths.
    pub search: SearchConfig,
    /// Documents larger than this (bytes, before extraction) are refused.
    pub max_document_bytes: usize,
    /// Chunks per embedder call during ingest.
    pub embed_batch: usize,
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        Self {
            chunk: ChunkConfig::default(),
            bm25: Bm25Config::default(),
            search: SearchConfig::default(),
            max_document_bytes: 8 << 20,
            embed_batch: 32,
        }
    }
}

impl RetrievalConfig {
    /// Checks that every value is usable.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidRequest(format!("retrieval config: {m}")));
        if self.chunk.target_tokens < 16 {
            return bad("chunk.target_tokens must be at least 16");
        }
        if !(0.0..=0.5).contains(&self.chunk.overlap) {
            return bad("chunk.overlap must be within 0.0..=0.5");
        }
        if !(self.search.rrf_k.is_finite() && self.search.rrf_k >= 0.0) {
            return bad("search.rrf_k must be a finite number >= 0");
        }
        if self.search.candidates == 0 || self.search.max_k == 0 {
            return bad("search.candidates and search.max_k must be positive");
        }
        if self.max_document_bytes == 0 || self.embed_batch == 0 {
            return bad("max_document_bytes and embed_batch must be positive");
        }
        if !(self.bm25.avg_chunk_tokens.is_finite() && self.bm25.avg_chunk_tokens >= 1.0) {
            return bad("bm25.avg_chunk_tokens must be a finite number >= 1");
        }
        if self.bm25.writer_memory_bytes < 15 << 20 {
            return bad("bm25.writer_memory_bytes must be at least 15 MiB (tantivy minimum)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_round_trip_through_json() {
        let c = RetrievalConfig::default();
        c.validate().unwrap();
        let s = serde_json::to_string(&c).unwrap();
        let back: RetrievalConfig = serde_json::from_str(&s).unwrap();
        assert_eq!(back, c);
        let partial: RetrievalConfig =
            serde_json::from_str(r#"{"chunk":{"target_tokens":200}}"#).unwrap();
        assert_eq!(partial.chunk.target_tokens, 200);
        assert_eq!(partial.search.rrf_k, 60.0);
        assert!(serde_json::from_str::<RetrievalConfig>(r#"{"chunks":{}}"#).is_err());
    }

    #[test]
    fn validate_rejects_out_of_range_values() {
        let mut c = RetrievalConfig::default();
        c.chunk.overlap = 0.9;
        assert!(c.validate().is_err());
        let mut c = RetrievalConfig::default();
        c.search.rrf_k = f32::NAN;
        assert!(c.validate().is_err());
    }
}
