//! Benchmark access to internals (not API): the BM25 index on its own, for the scale bench
//! (`benches/bm25_scale.rs`), which would otherwise have to ingest millions of chunks through
//! SQLite and the embedder.

use std::path::Path;

use crate::bm25::Bm25Index;
use crate::config::Bm25Config;
use crate::error::Result;
use crate::visibility::Visibility;

/// The engine's BM25 index (tantivy), opened on a directory of its own.
pub struct Bm25 {
    inner: Bm25Index,
}

impl Bm25 {
    /// Opens (or creates) the index in `dir` with the engine's configuration `cfg`.
    pub fn open(dir: &Path, cfg: &Bm25Config) -> Result<Self> {
        Ok(Self {
            inner: Bm25Index::open(dir, cfg)?,
        })
    }

    /// Adds `(chunk id, text)` pairs and commits, as an ingest batch does.
    pub fn write(&self, add: &[(u32, String)]) -> Result<()> {
        self.inner.write(add, &[])
    }

    /// The engine's BM25 search over the chunks `vis` lets through (`visible` of them). The
    /// visible set is built on every call (the engine caches it per snapshot and allow set).
    pub fn search(
        &self,
        query: &str,
        k: usize,
        vis: &Visibility<'_>,
        visible: u64,
    ) -> Result<Vec<(u32, f32)>> {
        self.inner
            .search(query, k, vis, &vis.visible_set(), visible)
    }

    /// Live chunks in the index.
    pub fn num_docs(&self) -> u64 {
        self.inner.num_docs()
    }

    /// Segments of the current searcher.
    pub fn segments(&self) -> usize {
        self.inner.segment_count()
    }
}
