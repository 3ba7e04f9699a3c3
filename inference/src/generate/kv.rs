//! One sequence's KV cache: per layer, keys and values of every processed position.
//!
//! Each sequence owns its cache, so sequences at different positions can share one batched
//! forward step. Storage is token-major (`[pos][kv_head][head_dim]`), so appending a chunk is a
//! plain `extend`, and capacity grows in blocks of [`KV_BLOCK_TOKENS`] so the engine can account
//! the memory it really holds. Keys and values are stored as f16 (the forward rounds them to
//! f16 before they are cached, as llama.cpp's default cache does), so storing them in half
//! precision loses nothing and halves the memory of an f32 cache.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Positions reserved at a time; the accounting unit of [`KvCache::bytes`].
pub const KV_BLOCK_TOKENS: usize = 32;

/// The KV cache of one sequence (all layers).
#[derive(Debug, Clone)]
pub struct KvCache {
    keys: Vec<Vec<f16>>,
    values: Vec<Vec<f16>>,
    /// `n_kv_head * head_dim`: values per position per layer for K (same for V).
    kv_dim: usize,
    len: usize,
    reserved: usize,
}

impl KvCache {
    /// An empty cache for a model with `n_layer` layers and `kv_dim` = `n_kv_head * head_dim`.
    pub fn new(n_layer: usize, kv_dim: usize) -> Self {
        Self {
            keys: vec![Vec::new(); n_layer],
            values: vec![Vec::new(); n_layer],
            kv_dim,
            len: 0,
            reserved: 0,
        }
    }

    /// Number of positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held for one position across all layers (K and V).
    pub fn bytes_per_token(&self) -> usize {
        bytes_per_token(self.keys.len(), self.kv_dim)
    }

    /// Bytes currently reserved by this cache (reserved positions × bytes per position).
    pub fn bytes(&self) -> usize {
        self.reserved * self.bytes_per_token()
    }

    /// Bytes this cache would hold after `extra` more positions.
    pub fn bytes_after(&self, extra: usize) -> usize {
        reserved_for(self.len + extra) * self.bytes_per_token()
    }

    /// Drops every position and frees the memory.
    pub fn clear(&mut self) {
        for v in self.keys.iter_mut().chain(self.values.iter_mut()) {
            *v = Vec::new();
        }
        self.len = 0;
        self.reserved = 0;
    }

    /// Makes room for `extra` more positions (in whole blocks).
    pub(crate) fn reserve(&mut self, extra: usize) {
        let want = reserved_for(self.len + extra);
        if want > self.reserved {
            let floats = want * self.kv_dim;
            for v in self.keys.iter_mut().chain(self.values.iter_mut()) {
                v.reserve_exact(floats - v.len());
            }
            self.reserved = want;
        }
    }

    /// Appends `rows` positions of keys and values (each `rows * kv_dim` floats, already
    /// rounded to f16 so the conversion is exact) to `layer`.
    pub(crate) fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        debug_assert!(
            k.iter()
                .chain(v)
                .all(|&x| f16::from_f32(x).to_f32().to_bits() == x.to_bits() || x.is_nan())
        );
        for (dst, src) in [(&mut self.keys[layer], k), (&mut self.values[layer], v)] {
            let at = dst.len();
            dst.resize(at + src.len(), f16::ZERO);
            dst[at..].convert_from_f32_slice(src);
        }
    }

    /// Marks `rows` appended positions as complete (after every layer got them).
    pub(crate) fn commit(&mut self, rows: usize) {
        self.len += rows;
        debug_assert!(self.keys.iter().all(|k| k.len() == self.len * self.kv_dim));
    }

    /// A new cache holding a copy of the first `len` positions (a shared prompt prefix), with
    /// whole blocks reserved as [`Self::reserve`] does, so [`Self::bytes`] stays exact.
    pub(crate) fn prefix_copy(&self, len: usize) -> Self {
        assert!(
            len <= self.len,
            "prefix of {len} > {} cached positions",
            self.len
        );
        let mut c = Self::new(self.keys.len(), self.kv_dim);
        c.reserve(len);
        let n = len * self.kv_dim;
        for l in 0..self.keys.len() {
            c.keys[l].extend_from_slice(&self.keys[l][..n]);
            c.values[l].extend_from_slice(&self.values[l][..n]);
        }
        c.len = len;
        c
    }

    /// Keys and values of `layer` (token-major).
    pub(crate) fn layer(&self, layer: usize) -> (&[f16], &[f16]) {
        (&self.keys[layer], &self.values[layer])
    }
}

/// Bytes per cached position for `n_layer` layers of `kv_dim` f16 values of K and of V.
pub fn bytes_per_token(n_layer: usize, kv_dim: usize) -> usize {
    2 * n_layer * kv_dim * std::mem::size_of::<f16>()
}

/// Positions reserved for `len` positions (rounded up to whole blocks).
pub fn reserved_for(len: usize) -> usize {
    len.div_ceil(KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounting_rounds_to_blocks_and_clear_frees() {
        let mut c = KvCache::new(2, 4);
        // K and V, 2 layers, 4 values each, 2 bytes per f16 value.
        assert_eq!(c.bytes_per_token(), 2 * 2 * 4 * 2);
        assert_eq!(c.bytes(), 0);
        assert_eq!(c.bytes_after(1), KV_BLOCK_TOKENS * 32);
        c.reserve(3);
        for l in 0..2 {
            c.append(l, &[1.0; 12], &[2.0; 12]);
        }
        c.commit(3);
        assert_eq!(c.len(), 3);
        assert_eq!(c.bytes(), KV_BLOCK_TOKENS * 32);
        // The accounted bytes are the memory really held (f16 storage, whole blocks).
        let held: usize = c
            .keys
            .iter()
            .chain(&c.values)
            .map(|v| v.capacity() * std::mem::size_of_val(&v[0]))
            .sum();
        assert_eq!(held, c.bytes());
        assert_eq!(c.bytes_after(KV_BLOCK_TOKENS - 3), KV_BLOCK_TOKENS * 32);
        assert_eq!(c.bytes_after(KV_BLOCK_TOKENS - 2), 2 * KV_BLOCK_TOKENS * 32);
        assert_eq!(c.layer(1).0.len(), 12);
        assert_eq!(c.layer(1).1[11], f16::from_f32(2.0));
        let p = c.prefix_copy(2);
        assert_eq!((p.len(), p.bytes()), (2, KV_BLOCK_TOKENS * 32));
        assert_eq!(p.layer(1).0, &c.layer(1).0[..8]);
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.bytes(), 0);
    }
}
