//! Adapters that fill `airlock-retrieval`'s model seams with `airlock-inference` models (the
//! daemon is the only crate that knows both).

use std::sync::Arc;

use airlock_inference::{CrossEncoder, Embedder};
use airlock_retrieval::{Embed, ModelError, Rerank};

/// The MiniLM embedder as retrieval's [`Embed`].
#[derive(Debug, Clone)]
pub struct EmbedAdapter(pub Arc<Embedder>);

impl Embed for EmbedAdapter {
    fn dim(&self) -> usize {
        self.0.dim()
    }

    fn max_tokens(&self) -> usize {
        self.0.max_tokens()
    }

    fn token_spans(&self, text: &str) -> Result<Vec<(usize, usize)>, ModelError> {
        self.0
            .token_spans(text)
            .map_err(|e| ModelError(format!("{}: {e}", self.0.name())))
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.0
            .embed(texts)
            .map_err(|e| ModelError(format!("{}: {e}", self.0.name())))
    }
}

/// A bundle's cross-encoder as retrieval's [`Rerank`] (the rerank stage of rung 0).
#[derive(Debug, Clone)]
pub struct RerankAdapter(pub Arc<CrossEncoder>);

impl Rerank for RerankAdapter {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>, ModelError> {
        self.0
            .score(query, passages)
            .map_err(|e| ModelError(format!("{}: {e}", self.0.name())))
    }
}
