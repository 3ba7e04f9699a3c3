//! The index's HNSW graph ([`FlatGraph`]: flat arrays over the index's own int8 rows), its dump
//! file and reload.
//!
//! Until 2026-12-03 the graph was hnsw_rs (forked in `vendor/hnsw_rs`); its layout cost 3.9 KB
//! per chunk, a 37.5 s reload at 1M and 0.34× hnswlib's build rate (the history of docs/benchmarks/vector.md, before e5962ea).
//! An index whose meta still names an hnsw_rs dump is migrated on open: the graph is rebuilt from
//! the int8 rows once, and the next flush writes a flat dump (see `VectorIndex::open`).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use super::VectorError;
use super::flat::FlatGraph;

/// An HNSW graph whose points are row slots.
pub(crate) struct Graph {
    flat: FlatGraph,
}

impl Graph {
    /// An empty graph for `dim`-long rows.
    pub fn new(dim: usize, m: usize, ef_construction: usize) -> Self {
        Self {
            flat: FlatGraph::new(dim, m, ef_construction),
        }
    }

    /// Makes room for slots `0..n` (before linking them).
    pub fn reserve(&mut self, n: usize) {
        self.flat.reserve(n);
    }

    /// Links the (reserved) `slots` into the graph in parallel; `rows` are the index's int8 rows.
    pub fn insert(&self, rows: &[i8], slots: std::ops::Range<usize>) {
        self.flat.insert(rows, slots.start as u32..slots.end as u32);
    }

    /// Up to `ef` nearest slots that `allowed` accepts, nearest first, with their int8 dot
    /// products, by the filtered traversal (expands through refused points, counts only accepted
    /// ones). Also returns the distance evaluations made and whether the search ended by its own
    /// rule (`false`: `max_evals` cut it short).
    pub fn search_filtered(
        &self,
        rows: &[i8],
        query: &[i8],
        ef: usize,
        allowed: &dyn Fn(usize) -> bool,
        max_evals: usize,
    ) -> (Vec<(usize, i32)>, usize, bool) {
        let (found, evals, complete) =
            self.flat
                .search_filtered(rows, query, ef, &|s| allowed(s as usize), max_evals);
        let found = found.into_iter().map(|(s, d)| (s as usize, -d)).collect();
        (found, evals, complete)
    }

    /// A copy without the slots `keep` refuses, renumbered in slot order, every list repaired
    /// ([`FlatGraph::compacted`]); `rows` are the current slots' int8 rows.
    pub fn compacted(&self, rows: &[i8], keep: &[bool]) -> Self {
        Self {
            flat: self.flat.compacted(rows, keep),
        }
    }

    /// Whether dumps store the levels (format 2, which binaries from before compaction cannot
    /// read).
    pub fn stores_levels(&self) -> bool {
        self.flat.stores_levels()
    }

    /// The dump file of `basename`.
    pub fn dump_file(dir: &Path, basename: &str) -> PathBuf {
        dir.join(format!("{basename}.flat"))
    }

    /// Writes the dump `dir/<basename>.flat` (fsynced); every point must be linked.
    pub fn dump(&self, dir: &Path, basename: &str) -> Result<PathBuf, VectorError> {
        let path = Self::dump_file(dir, basename);
        let io = |source| VectorError::Io {
            path: path.clone(),
            what: "write graph dump".into(),
            source,
        };
        let file = File::create(&path).map_err(io)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        self.flat.write_to(&mut w).map_err(io)?;
        let file = w.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        Ok(path)
    }

    /// Reads the dump at `path` for `dim`-long rows.
    pub fn load(path: &Path, dim: usize) -> Result<Self, VectorError> {
        let bytes = std::fs::read(path).map_err(|source| VectorError::Io {
            path: path.to_path_buf(),
            what: "read graph dump".into(),
            source,
        })?;
        let flat = FlatGraph::read_from(&bytes, dim).map_err(|detail| VectorError::Corrupt {
            path: path.to_path_buf(),
            detail,
        })?;
        Ok(Self { flat })
    }

    /// Points linked into the graph.
    pub fn len(&self) -> usize {
        self.flat.len()
    }

    /// Heap bytes of the graph's arrays.
    pub fn memory_bytes(&self) -> usize {
        self.flat.memory_bytes()
    }
}
