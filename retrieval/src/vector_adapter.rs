//! Connects [`crate::vector::VectorIndex`] to the engine's [`DenseIndex`] seam: the locks, the
//! engine's candidate count, and a checkpoint when the engine closes.
//!
//! Writes never hold searches up for long: an insert takes the index's write lock only to stage
//! its rows ([`VectorIndex::stage`]: validation, row files, maps) and links them into the graph
//! under the read lock ([`VectorIndex::link`]), beside searches; a flush writes the graph dump
//! under the read lock ([`VectorIndex::prepare_flush`]) and takes the write lock only to commit
//! the meta file. Writers are serialised by their own mutex, which searches never take.

use std::path::Path;

use parking_lot::{Mutex, RwLock};
use roaring::RoaringBitmap;

use crate::dense::DenseIndex;
use crate::error::{Error, Result};
use crate::vector::{SearchOptions, VectorIndex, VectorParams};
use crate::visibility::Visibility;

/// File that marks a complete vector index directory (written last by `VectorIndex::create`).
const META_FILE: &str = "vector.meta";

struct Adapter {
    index: RwLock<VectorIndex>,
    /// Serialises writers (stage + link, prepare + commit); searches take only `index`.
    writer: Mutex<()>,
}

/// Opens the vector index of one generation directory, creating it when absent. A directory
/// left without its meta file by a crash during creation is emptied and created again (the
/// vectors are in SQLite; repair re-inserts them).
pub(crate) fn open(dir: &Path, dim: usize) -> Result<Option<Box<dyn DenseIndex>>> {
    let index = if dir.join(META_FILE).exists() {
        let index = VectorIndex::open(dir)?;
        if index.dim() != dim {
            return Err(Error::Corrupt(format!(
                "vector index {} has dimension {}, the embedder {dim}: run reindex",
                dir.display(),
                index.dim()
            )));
        }
        index
    } else {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        VectorIndex::create(dir, dim, VectorParams::default())?
    };
    Ok(Some(Adapter::boxed(index)))
}

impl DenseIndex for Adapter {
    fn insert(&self, items: &[(u32, &[f32])]) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let _writer = self.writer.lock();
        let (_, slots) = self.index.write().stage(items)?;
        self.index.read().link(slots);
        Ok(())
    }

    fn ids(&self) -> Result<RoaringBitmap> {
        Ok(self.index.read().ids())
    }

    fn search(&self, query: &[f32], k: usize, vis: &Visibility<'_>) -> Result<Vec<(u32, f32)>> {
        // Rescoring is the engine's own stage (over the fused list), so the index returns its
        // int8 ranking here.
        let opts = SearchOptions {
            candidates: k,
            rescore: false,
            ..SearchOptions::default()
        };
        Ok(self.index.read().search(query, k, vis, &opts)?.hits)
    }

    fn rescore(&self, query: &[f32], ids: &[u32]) -> Result<Vec<(u32, f32)>> {
        let scores = self.index.read().rescore(query, ids)?;
        Ok(ids
            .iter()
            .zip(scores)
            .filter_map(|(&id, s)| s.map(|s| (id, s)))
            .collect())
    }

    fn flush(&self) -> Result<()> {
        let _writer = self.writer.lock();
        let prepared = self.index.read().prepare_flush(false)?;
        self.index.write().commit_flush(prepared)?;
        Ok(())
    }

    fn dropped_since_build(&self) -> u64 {
        self.index.read().dropped_since_build()
    }

    fn compact_into(&self, dir: &Path, keep: &RoaringBitmap) -> Result<(Box<dyn DenseIndex>, u64)> {
        // Writers wait (every staged batch is linked); searches go on beside the copy.
        let _writer = self.writer.lock();
        let (index, report) = self.index.read().compact_into(dir, &|c| keep.contains(c))?;
        Ok((Adapter::boxed(index), report.dropped as u64))
    }
}

impl Adapter {
    fn boxed(index: VectorIndex) -> Box<dyn DenseIndex> {
        Box::new(Self {
            index: RwLock::new(index),
            writer: Mutex::new(()),
        })
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        // A full graph dump at close spares the next open from re-inserting recent rows.
        if let Err(e) = self.index.get_mut().checkpoint() {
            tracing::warn!(error = %e, "vector index checkpoint at close failed");
        }
    }
}
