//! Shared BERT plumbing for the embedder and the cross-encoder: config and weight loading from
//! explicit file paths, and length-sorted, padded batches.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::Config;

use crate::error::{Error, Result};

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

/// Groups item indices into batches of at most `max_batch` items and `max_tokens_per_batch`
/// padded tokens, longest first, so that each batch pads only to its own longest member and
/// similar lengths share a batch.
pub(crate) fn length_batches(
    lens: &[usize],
    max_batch: usize,
    max_tokens_per_batch: usize,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut current_max = 0usize;
    for i in order {
        let padded_len = current_max.max(lens[i]);
        let would_be = padded_len * (current.len() + 1);
        if !current.is_empty() && (current.len() >= max_batch || would_be > max_tokens_per_batch) {
            batches.push(std::mem::take(&mut current));
            current_max = 0;
        }
        current_max = current_max.max(lens[i]);
        current.push(i);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// A padded batch ready for `BertModel::forward`.
pub(crate) struct Padded {
    /// Token ids, `[batch, len]` u32.
    pub ids: Tensor,
    /// Segment ids, `[batch, len]` u32.
    pub type_ids: Tensor,
    /// 1 for real tokens, 0 for padding, `[batch, len]` u32.
    pub mask: Tensor,
}

/// Pads `(ids, type_ids)` rows with `pad_id` to the longest row.
pub(crate) fn pad(
    rows: &[(&[u32], &[u32])],
    pad_id: u32,
    device: &Device,
) -> candle_core::Result<Padded> {
    let len = rows.iter().map(|(ids, _)| ids.len()).max().unwrap_or(0);
    let n = rows.len();
    let mut ids = Vec::with_capacity(n * len);
    let mut types = Vec::with_capacity(n * len);
    let mut mask = Vec::with_capacity(n * len);
    for (row_ids, row_types) in rows {
        ids.extend_from_slice(row_ids);
        types.extend_from_slice(row_types);
        mask.extend(std::iter::repeat_n(1u32, row_ids.len()));
        let missing = len - row_ids.len();
        ids.extend(std::iter::repeat_n(pad_id, missing));
        types.extend(std::iter::repeat_n(0u32, missing));
        mask.extend(std::iter::repeat_n(0u32, missing));
    }
    Ok(Padded {
        ids: Tensor::from_vec(ids, (n, len), device)?,
        type_ids: Tensor::from_vec(types, (n, len), device)?,
        mask: Tensor::from_vec(mask, (n, len), device)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_length_sorted_and_bounded() {
        let lens = [3, 256, 10, 200, 256, 7, 12];
        let batches = length_batches(&lens, 2, 10_000);
        let flat: Vec<usize> = batches.iter().flatten().copied().collect();
        let mut sorted = flat.clone();
        sorted.sort();
        assert_eq!(sorted, (0..lens.len()).collect::<Vec<_>>());
        assert!(batches.iter().all(|b| b.len() <= 2));
        let seq: Vec<usize> = flat.iter().map(|&i| lens[i]).collect();
        assert!(seq.windows(2).all(|w| w[0] >= w[1]), "{seq:?}");
        // token cap: 256 * 2 > 300 forces single-item batches for the long ones
        let capped = length_batches(&lens, 8, 300);
        assert!(
            capped
                .iter()
                .all(|b| b.len() * b.iter().map(|&i| lens[i]).max().unwrap() <= 300)
        );
    }
}
