//! Tokenizers: the embedder's WordPiece `tokenizer.json` with its real limits, and GGUF
//! generators' byte-level BPE rebuilt from `tokenizer.ggml.*` metadata (see [`gguf`]).

pub mod gguf;

use std::path::Path;

use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::error::{Error, Result};

/// Loads a `tokenizer.json` and replaces its built-in truncation and padding: inputs are cut to
/// `max_tokens` (special tokens included) and never padded (batches pad themselves to their own
/// longest member).
///
/// all-MiniLM-L6-v2 ships with truncation 128 and fixed padding 128; sentence-transformers uses
/// 256, so a loader that kept the file's settings would silently embed a different text.
pub fn load_with_limit(path: &Path, max_tokens: usize) -> Result<Tokenizer> {
    let mut tok = load_plain(path)?;
    tok.with_truncation(Some(TruncationParams {
        max_length: max_tokens,
        strategy: TruncationStrategy::LongestFirst,
        stride: 0,
        direction: TruncationDirection::Right,
    }))
    .map_err(|e| Error::invalid(path, format!("truncation {max_tokens}: {e}")))?;
    tok.with_padding(None);
    Ok(tok)
}

/// Loads a `tokenizer.json` without truncation or padding (for span computation and for
/// generators, whose limits are enforced by the caller).
pub fn load_plain(path: &Path) -> Result<Tokenizer> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let mut tok = Tokenizer::from_bytes(&bytes)
        .map_err(|e| Error::invalid(path, format!("not a tokenizer.json: {e}")))?;
    tok.with_truncation(None)
        .map_err(|e| Error::invalid(path, e.to_string()))?;
    tok.with_padding(None);
    Ok(tok)
}
