//! Shared BERT plumbing for the embedder and the cross-encoder: config and weight loading from
//! explicit file paths, and token-budgeted batches for the padding-free forward
//! ([`crate::bert_fast`]).

use std::path::Path;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use serde::Deserialize;

use crate::error::{Error, Result};

/// The fields of a Hugging Face BERT `config.json` the forward reads (others are ignored). The
/// names and the activation spellings are candle-transformers' `bert::Config`'s, which the
/// parity tests run beside ours; the product does not link that crate (a build-time cost of
/// every model architecture it carries).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub(crate) struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: HiddenAct,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    /// The weights' prefix when not `bert.` (e.g. `roberta`).
    #[serde(default)]
    pub model_type: Option<String>,
}

/// The feed-forward activation (`hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(rename_all = "lowercase")]
pub(crate) enum HiddenAct {
    /// GELU, exact (erf).
    Gelu,
    /// GELU, tanh approximation.
    GeluApproximate,
    /// ReLU.
    Relu,
}

/// Reads a Hugging Face BERT `config.json`.
pub(crate) fn read_config(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::invalid(path, format!("BERT config: {e}")))
}

/// Reads safetensors weights into memory as f32 (no mmap: the workspace forbids `unsafe`, and
/// the files are small enough to read once at start-up).
pub(crate) fn read_weights(path: &Path, device: &Device) -> Result<VarBuilder<'static>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    VarBuilder::from_buffered_safetensors(bytes, DType::F32, device)
        .map_err(|e| Error::invalid(path, format!("safetensors: {e}")))
}

/// Splits items `0..lens.len()` into consecutive batches of at most `max_batch` items and
/// `max_tokens` tokens in all (the padding-free forward packs a batch's tokens without padding,
/// so only real tokens count). An item longer than `max_tokens` gets a batch of its own.
pub(crate) fn token_batches(
    lens: &[usize],
    max_batch: usize,
    max_tokens: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut batches = Vec::new();
    let (mut first, mut tokens) = (0usize, 0usize);
    for (i, &len) in lens.iter().enumerate() {
        if i > first && (i - first >= max_batch || tokens + len > max_tokens) {
            batches.push(first..i);
            first = i;
            tokens = 0;
        }
        tokens += len;
    }
    if first < lens.len() {
        batches.push(first..lens.len());
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_consecutive_and_bounded() {
        let lens = [3, 256, 10, 200, 256, 7, 12];
        let batches = token_batches(&lens, 2, 10_000);
        assert_eq!(batches, vec![0..2, 2..4, 4..6, 6..7]);
        let capped = token_batches(&lens, 8, 300);
        assert_eq!(capped, vec![0..3, 3..4, 4..7]);
        for b in &capped {
            assert!(b.len() == 1 || lens[b.clone()].iter().sum::<usize>() <= 300);
        }
        // an item above the token cap still gets its own batch
        assert_eq!(token_batches(&[5, 400, 5], 8, 300), vec![0..1, 1..2, 2..3]);
        assert!(token_batches(&[], 8, 300).is_empty());
    }
}
