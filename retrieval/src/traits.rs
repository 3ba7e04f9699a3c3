//! The model seams: retrieval needs an embedder and optionally a reranker, and does not care how
//! they run.

/// A model failure reported through [`Embed`] or [`Rerank`] (the message names the model and cause).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ModelError(pub String);

/// A sentence embedder: texts in, L2-normalised vectors out.
pub trait Embed: Send + Sync {
    /// Vector dimension.
    fn dim(&self) -> usize;
    /// Maximum tokens per input (including special tokens); longer inputs are truncated.
    fn max_tokens(&self) -> usize;
    /// Special tokens the embedder adds to every input (`[CLS]` and `[SEP]` for BERT models);
    /// the chunker keeps chunks within `max_tokens() - special_tokens()`.
    fn special_tokens(&self) -> usize {
        2
    }
    /// Byte spans `(start, end)` of the tokens of `text` (no special tokens), used by the chunker
    /// to cut on the embedder's own tokenization.
    fn token_spans(&self, text: &str) -> Result<Vec<(usize, usize)>, ModelError>;
    /// Embeds a batch; one normalised vector of `dim()` per text, in order.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, ModelError>;
}

/// A relevance scorer for (query, passage) pairs, e.g. a cross-encoder.
pub trait Rerank: Send + Sync {
    /// A short identifier of the scorer, reported in stage scores.
    fn name(&self) -> &str;
    /// One score per passage, in order; higher is more relevant.
    fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>, ModelError>;
}
