//! Adapters that fill `airlock-retrieval`'s model seams with `airlock-inference` models (the
//! daemon is the only crate that knows both).

use std::sync::Arc;

use airlock_inference::Embedder;
use airlock_retrieval::{Embed, ModelError};

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
