//! What the engine needs from a vector index. The int8 HNSW / exact-scan index in
//! [`crate::vector`] implements it; keeping the engine on this narrow seam lets the index evolve
//! without touching ingest, fusion or repair.

use std::path::Path;

use roaring::RoaringBitmap;

use crate::error::Result;
use crate::visibility::Visibility;

/// A vector index over chunk ids.
pub(crate) trait DenseIndex: Send + Sync {
    /// Adds vectors (normalised, `dim` long). Callers never insert an id the index holds.
    fn insert(&self, items: &[(u32, &[f32])]) -> Result<()>;
    /// Ids held by the index, dead ones included (for crash repair).
    fn ids(&self) -> Result<RoaringBitmap>;
    /// Top `k` visible chunks by similarity to `query`, best first, as (chunk id, score).
    fn search(&self, query: &[f32], k: usize, vis: &Visibility<'_>) -> Result<Vec<(u32, f32)>>;
    /// Full-precision cosine of `query` with each id's vector, in the order given.
    fn rescore(&self, query: &[f32], ids: &[u32]) -> Result<Vec<(u32, f32)>>;
    /// Makes everything inserted so far durable.
    fn flush(&self) -> Result<()>;
    /// Entries dropped by compactions since the index was last built from scratch.
    fn dropped_since_build(&self) -> u64;
    /// A new, durable index in `dir` holding only the ids in `keep`, made without a rebuild
    /// (the rows copied, the graph compacted), and the number of entries left behind.
    fn compact_into(&self, dir: &Path, keep: &RoaringBitmap) -> Result<(Box<dyn DenseIndex>, u64)>;
}
