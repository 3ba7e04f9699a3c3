//! Relevance scorers for (query, passage) pairs.
//!
//! - [`CrossEncoder`]: a BERT cross-encoder in the Hugging Face `BertForSequenceClassification`
//!   layout (`bert.*` + `bert.pooler.dense` with tanh on [CLS] + `classifier`), pairs batched by
//!   length. No packaged cross-encoder exists for the demo bundle, so this path is tested on
//!   generated weights.
//! - [`EmbeddingRescorer`]: the fallback the demo bundle carries: full-precision cosine between
//!   the query and each passage with the bundled embedder (restores the ranking lost to the
//!   first stage's quantized vectors).
//! - [`LlmRelevanceScorer`]: a generator judging relevance from its `yes`/`no` logits, on the
//!   engine's decoder (measured on Cranfield, see `docs/benchmarks/inference-embed.md`).

mod cross;
mod llm;

use std::sync::Arc;

pub use cross::{CrossEncoder, CrossEncoderConfig, CrossEncoderFiles};
pub use llm::{LlmRelevanceScorer, LlmScorerConfig};

use crate::embed::Embedder;
use crate::error::Result;

/// Scores passages by f32 cosine with the query under the bundled embedder.
#[derive(Debug, Clone)]
pub struct EmbeddingRescorer {
    embedder: Arc<Embedder>,
}

impl EmbeddingRescorer {
    /// Wraps an embedder.
    pub fn new(embedder: Arc<Embedder>) -> Self {
        Self { embedder }
    }

    /// One score per passage (cosine in [-1, 1]), in order.
    pub fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        let q = self.embedder.embed(&[query])?.remove(0);
        Ok(self
            .embedder
            .embed(passages)?
            .iter()
            .map(|p| p.iter().zip(&q).map(|(a, b)| a * b).sum())
            .collect())
    }
}
