//! The int8 vector index: HNSW over int8 vectors (an own flat-layout graph, [`flat`]), an exact
//! int8 scan for selective users, and full-precision f32 rows on disk (memory-mapped) for
//! rescoring.
//!
//! * **Quantization** ([`Quantizer`]): one global symmetric scale calibrated from the first
//!   vectors inserted (99.99th percentile of `|x_i|` → 127).
//! * **Graph** ([`flat::FlatGraph`], hnswlib's algorithm, `M` 16, `ef_construction` 200 by
//!   default) over the index's own int8 rows (held once, shared with the exact scan) with the
//!   int8 dot product as similarity, vectorised ([`kernels`]). It replaced hnsw_rs (forked in
//!   `vendor/hnsw_rs`, whose layout cost 3.9 KB per chunk); `DistI8Dot`, the int8 distance for
//!   hnsw_rs, remains for its users.
//! * **Search that never collapses** ([`VectorIndex::search`]): estimate the visible chunks from the
//!   caller's [`Visibility`] and pick by estimated cost ([`SearchOptions`]'s cost model) between
//!   an exact scan of the visible chunks and the graph searched with the visibility filter inside
//!   the traversal (expanding through invisible chunks, counting only visible ones), capped at
//!   the exact scan's cost, after which it scans. `k` results come back whenever `k` visible
//!   chunks are indexed.
//! * **Rescoring** ([`VectorIndex::rescore`]): exact f32 dot products from `vectors.f32`.
//! * **Persistence**: a directory of append-only row files (`vectors.f32`, `vectors.i8`,
//!   `chunks.u32`; versioned header, SHA-256 per 4096-row block), the graph dump
//!   (`graph-<n>.flat`, SHA-256) and `vector.meta` (format version, parameters, scale, counts,
//!   checksums; its own SHA-256), replaced atomically by [`VectorIndex::flush`]. Reopening never
//!   rebuilds: row files are verified and the dump reloaded; rows persisted after the last graph
//!   dump are re-inserted into the graph from the int8 rows. An index written before the flat
//!   graph (an hnsw_rs dump `graph-<n>.hnsw.{graph,data}` in its meta) is migrated on open: the
//!   graph is rebuilt from the int8 rows once and the next flush replaces the old dump; the meta
//!   then names no hnsw_rs graph, so a rolled-back binary rebuilds its own graph from the rows.
//! * **Ids**: chunk ids (`u32`). Inserting an id the index holds is a no-op. The index never
//!   deletes in place: dead chunks stay in it, filtered by [`Visibility`], until
//!   [`VectorIndex::compact_into`] writes a new index without them (rows copied, graph compacted
//!   by [`flat::FlatGraph::compacted`], no rebuild), which `airlock reindex` does while at most a
//!   fifth of the entries the graph was built with have been dropped
//!   ([`VectorIndex::dropped_since_build`]). A compacted graph's dump stores its levels (format 2) and is
//!   named in the meta's `flat_graph_levels`, so a binary from before compaction, which reads
//!   only `flat_graph`, rebuilds its graph from the rows instead of refusing the index.
//!
//! Writers: [`VectorIndex::stage`] and [`VectorIndex::commit_flush`] take `&mut self` briefly;
//! [`VectorIndex::link`] and [`VectorIndex::prepare_flush`], the long halves, take `&self` and run
//! beside searches (wrap the index in a lock and serialise writers, as the engine's adapter does).

#[doc(hidden)]
pub mod flat;
mod graph;
pub mod kernels;
mod mmap;
mod quant;
mod rows;
mod search;
pub mod synth;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use roaring::RoaringBitmap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use graph::Graph;
pub use quant::{DistI8Dot, Quantizer};
use rows::{RowFile, RowFileState, RowKind};
pub use search::{PathChoice, SearchOptions, SearchOutcome, SearchPath};

/// Format version of `vector.meta` (and of the directory layout).
pub const FORMAT_VERSION: u32 = 1;
const META_FILE: &str = "vector.meta";
const META_MAGIC: &str = "AIRLOCK-VECTOR-META";
const F32_FILE: &str = "vectors.f32";
const I8_FILE: &str = "vectors.i8";
const IDS_FILE: &str = "chunks.u32";
const NO_SLOT: u32 = u32::MAX;

/// Errors of the vector index.
#[derive(Debug, thiserror::Error)]
pub enum VectorError {
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// File involved.
        path: PathBuf,
        /// What was being done.
        what: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file of the index is damaged or of another format version.
    #[error("vector index file {path} is corrupt: {detail}")]
    Corrupt {
        /// File involved.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A graph dump could not be written or read back.
    #[error("hnsw graph {path}: {detail}")]
    Graph {
        /// Dump base path.
        path: PathBuf,
        /// hnsw_rs's message.
        detail: String,
    },
    /// A directory that should be empty (create) already holds an index.
    #[error("{0} already holds a vector index")]
    AlreadyExists(PathBuf),
    /// A vector of the wrong length (caller mistake).
    #[error("vector for chunk {chunk} has {got} components, the index has {want}")]
    Dimension {
        /// Chunk id (or `u32::MAX` for a query).
        chunk: u32,
        /// Length given.
        got: usize,
        /// Index dimension.
        want: usize,
    },
    /// A vector with NaN or infinite components (caller mistake).
    #[error("vector for chunk {0} has a non-finite component")]
    NonFinite(u32),
    /// Invalid parameters (caller mistake).
    #[error("invalid vector index parameters: {0}")]
    Params(String),
}

/// Build parameters, fixed at [`VectorIndex::create`] and persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VectorParams {
    /// HNSW links per node on upper layers (layer 0 gets twice as many). Default 16.
    pub m: usize,
    /// HNSW candidate list during construction. Default 200.
    pub ef_construction: usize,
    /// Expected number of vectors (an allocation hint only). Default 100,000.
    pub capacity_hint: usize,
    /// [`VectorIndex::flush`] dumps the graph once at least this many points (and at least 1/8 of
    /// the graph) were added since the last dump; rows are durable either way, and undumped rows
    /// are re-inserted on open. Default 4096. [`VectorIndex::checkpoint`] always dumps.
    pub dump_min_new: usize,
}

impl Default for VectorParams {
    fn default() -> Self {
        Self {
            m: 16,
            ef_construction: 200,
            capacity_hint: 100_000,
            dump_min_new: 4096,
        }
    }
}

/// An hnsw_rs graph dump named by indexes written before 2026-12-03 (read to migrate them).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GraphMeta {
    basename: String,
    points: u64,
    graph_sha256: String,
    data_sha256: String,
}

/// The flat graph's dump (`<basename>.flat`): points `0..points` linked.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FlatMeta {
    basename: String,
    points: u64,
    sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    format_version: u32,
    dim: u32,
    params: VectorParams,
    scale: Option<f32>,
    count: u64,
    generation: u64,
    f32_rows: RowFileState,
    i8_rows: RowFileState,
    id_rows: RowFileState,
    /// Always `None` now: a binary from before the flat graph that opens this index (a
    /// rollback) finds no graph dump it can read and rebuilds its graph from the rows.
    graph: Option<GraphMeta>,
    /// A format-1 flat dump (levels drawn from the slots), readable by every flat-graph binary.
    #[serde(default)]
    flat_graph: Option<FlatMeta>,
    /// A format-2 flat dump (levels stored: a compacted graph). Named apart so that a binary from
    /// before compaction, which cannot read format 2, finds no `flat_graph` and rebuilds its
    /// graph from the rows instead of refusing the index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    flat_graph_levels: Option<FlatMeta>,
    /// Rows dropped by compactions since the graph was last built from scratch.
    #[serde(default)]
    dropped_since_build: u64,
}

/// A flush's graph dump written by [`VectorIndex::prepare_flush`], not yet committed.
#[derive(Debug)]
pub struct PreparedFlush {
    graph: Option<FlatMeta>,
}

/// What [`VectorIndex::compact_into`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Rows (and graph points) carried over.
    pub kept: usize,
    /// Rows left behind.
    pub dropped: usize,
}

/// Counts of one [`VectorIndex::insert`] call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InsertReport {
    /// New chunk ids indexed.
    pub added: usize,
    /// Ids skipped because the index (or an earlier item of the batch) already held them.
    pub skipped: usize,
}

/// The int8 vector index of one directory. See the [module docs](self).
pub struct VectorIndex {
    dir: PathBuf,
    dim: usize,
    params: VectorParams,
    quant: Option<Quantizer>,
    /// int8 rows by slot, in memory (the exact scan's data).
    i8_data: Vec<i8>,
    /// Chunk id by slot.
    slot_chunk: Vec<u32>,
    /// Slot by chunk id (`NO_SLOT` when absent).
    chunk_slot: Vec<u32>,
    f32_file: RowFile,
    f32_map: Option<Mmap>,
    i8_file: RowFile,
    id_file: RowFile,
    graph: Graph,
    graph_meta: Option<FlatMeta>,
    /// The hnsw_rs dump of an index opened from before the flat graph, removed at the next
    /// flush that writes a flat dump.
    legacy_graph: Option<GraphMeta>,
    generation: u64,
    /// Rows dropped by compactions since the graph was last built from scratch (persisted).
    dropped_since_build: u64,
}

fn io_err(path: &Path, what: &str) -> impl FnOnce(std::io::Error) -> VectorError {
    let path = path.to_path_buf();
    let what = what.to_string();
    move |source| VectorError::Io { path, what, source }
}

fn sha256_file(path: &Path) -> Result<String, VectorError> {
    let mut f = File::open(path).map_err(io_err(path, "open for checksum"))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(io_err(path, "read for checksum"))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

fn fsync_path(path: &Path) -> Result<(), VectorError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io_err(path, "fsync"))
}

/// The inverse of `slot_chunk` (chunk id → slot, [`NO_SLOT`] for none); a chunk stored twice
/// is corrupt.
fn chunk_slots(dir: &Path, slot_chunk: &[u32]) -> Result<Vec<u32>, VectorError> {
    let mut chunk_slot = Vec::new();
    for (slot, &c) in slot_chunk.iter().enumerate() {
        if chunk_slot.len() <= c as usize {
            chunk_slot.resize(c as usize + 1, NO_SLOT);
        }
        if chunk_slot[c as usize] != NO_SLOT {
            return Err(VectorError::Corrupt {
                path: dir.join(IDS_FILE),
                detail: format!("chunk {c} stored twice"),
            });
        }
        chunk_slot[c as usize] = slot as u32;
    }
    Ok(chunk_slot)
}

/// The graph of the dump `meta` names (checksum and point count checked), or an empty one to
/// rebuild from the rows (an hnsw_rs dump is migrated that way).
fn open_graph(
    dir: &Path,
    meta: &Meta,
    dump: Option<&FlatMeta>,
    dim: usize,
) -> Result<Graph, VectorError> {
    Ok(match dump {
        Some(g) => {
            let p = Graph::dump_file(dir, &g.basename);
            if sha256_file(&p)? != g.sha256 {
                return Err(VectorError::Corrupt {
                    path: p,
                    detail: "checksum mismatch".into(),
                });
            }
            let graph = Graph::load(&p, dim)?;
            if graph.len() as u64 != g.points || g.points > meta.count {
                return Err(VectorError::Corrupt {
                    path: p,
                    detail: format!(
                        "{} points, {} expected (of {} rows)",
                        graph.len(),
                        g.points,
                        meta.count
                    ),
                });
            }
            graph
        }
        None => {
            if meta.graph.is_some() {
                tracing::info!(
                    rows = meta.count,
                    "migrating an hnsw_rs graph dump: rebuilding the graph from the int8 rows once"
                );
            }
            Graph::new(dim, meta.params.m, meta.params.ef_construction)
        }
    })
}

impl VectorIndex {
    /// Creates an empty index in `dir` (created if missing; must not hold an index already).
    pub fn create(dir: &Path, dim: usize, params: VectorParams) -> Result<Self, VectorError> {
        if dim == 0 || dim > 4096 {
            return Err(VectorError::Params(format!("dimension {dim} (1..=4096)")));
        }
        if !(2..=128).contains(&params.m) || params.ef_construction < params.m {
            return Err(VectorError::Params(format!(
                "m {} (2..=128), ef_construction {} (>= m)",
                params.m, params.ef_construction
            )));
        }
        fs::create_dir_all(dir).map_err(io_err(dir, "create index directory"))?;
        if dir.join(META_FILE).exists() {
            return Err(VectorError::AlreadyExists(dir.to_path_buf()));
        }
        let d = dim as u32;
        let f32_file = RowFile::create(&dir.join(F32_FILE), RowKind::F32, d, 4 * dim as u64)?;
        let i8_file = RowFile::create(&dir.join(I8_FILE), RowKind::I8, d, dim as u64)?;
        let id_file = RowFile::create(&dir.join(IDS_FILE), RowKind::ChunkId, d, 4)?;
        let mut index = Self {
            dir: dir.to_path_buf(),
            dim,
            params,
            quant: None,
            i8_data: Vec::new(),
            slot_chunk: Vec::new(),
            chunk_slot: Vec::new(),
            f32_file,
            f32_map: None,
            i8_file,
            id_file,
            graph: Graph::new(dim, params.m, params.ef_construction),
            graph_meta: None,
            legacy_graph: None,
            generation: 0,
            dropped_since_build: 0,
        };
        index.write_meta()?;
        Ok(index)
    }

    /// Opens the index persisted in `dir` (by the last [`flush`](Self::flush)), verifying every
    /// checksum. Rows persisted after the last graph dump are re-inserted into the graph.
    pub fn open(dir: &Path) -> Result<Self, VectorError> {
        let meta = read_meta(&dir.join(META_FILE))?;
        let dim = meta.dim as usize;
        let corrupt = |detail: String| VectorError::Corrupt {
            path: dir.join(META_FILE),
            detail,
        };
        if meta.f32_rows.rows != meta.count
            || meta.i8_rows.rows != meta.count
            || meta.id_rows.rows != meta.count
        {
            return Err(corrupt("row counts disagree".into()));
        }
        let quant = match meta.scale {
            Some(s) => Some(Quantizer::with_scale(s).ok_or_else(|| corrupt(format!("scale {s}")))?),
            None if meta.count == 0 => None,
            None => return Err(corrupt("rows without a quantization scale".into())),
        };
        let f32_file = RowFile::open(
            &dir.join(F32_FILE),
            RowKind::F32,
            meta.dim,
            4 * dim as u64,
            &meta.f32_rows,
        )?;
        let mut i8_file = RowFile::open(
            &dir.join(I8_FILE),
            RowKind::I8,
            meta.dim,
            dim as u64,
            &meta.i8_rows,
        )?;
        let mut id_file = RowFile::open(
            &dir.join(IDS_FILE),
            RowKind::ChunkId,
            meta.dim,
            4,
            &meta.id_rows,
        )?;
        let i8_data: Vec<i8> = i8_file.read_all()?.into_iter().map(|b| b as i8).collect();
        let slot_chunk: Vec<u32> = id_file
            .read_all()?
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let chunk_slot = chunk_slots(dir, &slot_chunk)?;
        let dump = match (&meta.flat_graph, &meta.flat_graph_levels) {
            (Some(_), Some(_)) => return Err(corrupt("two graph dumps named".into())),
            (a, b) => a.as_ref().or(b.as_ref()),
        };
        let mut graph = open_graph(dir, &meta, dump, dim)?;
        graph.reserve(meta.count as usize);
        let f32_map =
            mmap::map_read_only(f32_file.file()).map_err(io_err(&dir.join(F32_FILE), "mmap"))?;
        let index = Self {
            dir: dir.to_path_buf(),
            dim,
            params: meta.params,
            quant,
            i8_data,
            slot_chunk,
            chunk_slot,
            f32_file,
            f32_map,
            i8_file,
            id_file,
            graph,
            graph_meta: dump.cloned(),
            legacy_graph: meta.graph.clone(),
            generation: meta.generation,
            dropped_since_build: meta.dropped_since_build,
        };
        let in_graph = index.graph.len();
        if in_graph < index.slot_chunk.len() {
            tracing::info!(
                rows = index.slot_chunk.len(),
                in_graph,
                "re-inserting rows persisted after the last graph dump"
            );
            index.graph_insert_slots(in_graph..index.slot_chunk.len());
        }
        Ok(index)
    }

    /// Sets the quantization scale from a sample instead of the first inserted batch. Only valid
    /// while the index is empty.
    pub fn calibrate(&mut self, sample: &[&[f32]]) -> Result<(), VectorError> {
        if !self.slot_chunk.is_empty() {
            return Err(VectorError::Params("calibrate on a non-empty index".into()));
        }
        self.quant = Some(Quantizer::calibrate(sample.iter().copied()).ok_or_else(|| {
            VectorError::Params("calibration sample has no non-zero component".into())
        })?);
        Ok(())
    }

    /// Indexes `(chunk id, f32 vector)` pairs. Ids already held (or repeated in the batch) are
    /// skipped, so re-inserting after a crash is harmless. The first batch calibrates the
    /// quantizer unless [`calibrate`](Self::calibrate) was called. Call [`flush`](Self::flush)
    /// to make the batch durable. [`stage`](Self::stage) + [`link`](Self::link) in one call.
    pub fn insert(&mut self, items: &[(u32, &[f32])]) -> Result<InsertReport, VectorError> {
        let (report, slots) = self.stage(items)?;
        self.link(slots);
        Ok(report)
    }

    /// The short, exclusive half of an insert: validates the batch, appends its rows to the row
    /// files and the in-memory maps, and returns the slots still to be linked into the graph by
    /// [`link`](Self::link), the long half, which runs beside searches (`&self`). Until linked,
    /// the rows are found by the exact scan but not by the graph.
    ///
    /// Writers must be serialised by the caller: each staged range is linked before the next
    /// `stage`, `flush` or `checkpoint` (the graph dump records how many slots it holds).
    pub fn stage(
        &mut self,
        items: &[(u32, &[f32])],
    ) -> Result<(InsertReport, std::ops::Range<usize>), VectorError> {
        for &(chunk, v) in items {
            if v.len() != self.dim {
                return Err(VectorError::Dimension {
                    chunk,
                    got: v.len(),
                    want: self.dim,
                });
            }
            if v.iter().any(|x| !x.is_finite()) {
                return Err(VectorError::NonFinite(chunk));
            }
        }
        let mut seen = RoaringBitmap::new();
        let new: Vec<(u32, &[f32])> = items
            .iter()
            .copied()
            .filter(|&(c, _)| !self.contains(c) && seen.insert(c))
            .collect();
        let report = InsertReport {
            added: new.len(),
            skipped: items.len() - new.len(),
        };
        let first_slot = self.slot_chunk.len();
        if new.is_empty() {
            return Ok((report, first_slot..first_slot));
        }
        let quant = match self.quant {
            Some(q) => q,
            None => {
                let q = Quantizer::calibrate(new.iter().map(|(_, v)| *v)).ok_or_else(|| {
                    VectorError::Params("first vectors are all zero: cannot calibrate".into())
                })?;
                self.quant = Some(q);
                q
            }
        };
        let mut f32_bytes = Vec::with_capacity(new.len() * self.dim * 4);
        let i8_start = self.i8_data.len();
        let mut ids = Vec::with_capacity(new.len() * 4);
        let mut q8 = Vec::with_capacity(self.dim);
        for &(chunk, v) in &new {
            f32_bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
            quant.quantize_into(v, &mut q8);
            self.i8_data.extend_from_slice(&q8);
            ids.extend(chunk.to_le_bytes());
            self.push_slot(chunk);
        }
        let i8_bytes: Vec<u8> = self.i8_data[i8_start..].iter().map(|&b| b as u8).collect();
        self.f32_file.append(&f32_bytes)?;
        self.i8_file.append(&i8_bytes)?;
        self.id_file.append(&ids)?;
        self.f32_map = mmap::map_read_only(self.f32_file.file())
            .map_err(io_err(&self.dir.join(F32_FILE), "mmap"))?;
        self.graph.reserve(self.slot_chunk.len());
        Ok((report, first_slot..self.slot_chunk.len()))
    }

    /// The long half of an insert: links staged slots into the graph (in parallel). Takes
    /// `&self`, so searches run beside it; see [`stage`](Self::stage).
    pub fn link(&self, slots: std::ops::Range<usize>) {
        self.graph_insert_slots(slots);
    }

    fn graph_insert_slots(&self, slots: std::ops::Range<usize>) {
        self.graph.insert(&self.i8_data, slots);
    }

    /// Makes all inserted rows durable and commits a new `vector.meta`; dumps the graph when
    /// enough points were added since the last dump (see [`VectorParams::dump_min_new`]).
    /// [`prepare_flush`](Self::prepare_flush) + [`commit_flush`](Self::commit_flush) in one call.
    pub fn flush(&mut self) -> Result<(), VectorError> {
        let prepared = self.prepare_flush(false)?;
        self.commit_flush(prepared)
    }

    /// Like [`flush`](Self::flush), but always dumps the graph if it changed (use at shutdown, so
    /// the next open re-inserts nothing).
    pub fn checkpoint(&mut self) -> Result<(), VectorError> {
        let prepared = self.prepare_flush(true)?;
        self.commit_flush(prepared)
    }

    /// The long half of a flush, beside searches (`&self`): writes the graph dump when one is
    /// due (always when `force` and the graph changed) and flushes the row files' data to disk.
    /// Nothing is committed until [`commit_flush`](Self::commit_flush), the short exclusive half;
    /// no insert may run between the two (writers are serialised by the caller).
    pub fn prepare_flush(&self, force: bool) -> Result<PreparedFlush, VectorError> {
        let dumped = self.graph_meta.as_ref().map_or(0, |g| g.points as usize);
        let new = self.graph.len().saturating_sub(dumped);
        let due = new > 0 && (force || new >= self.params.dump_min_new.max(dumped / 8));
        let graph = if due {
            if self.graph.len() != self.slot_chunk.len() {
                return Err(VectorError::Params(format!(
                    "{} of {} rows linked: link every staged batch before flushing",
                    self.graph.len(),
                    self.slot_chunk.len()
                )));
            }
            let base = format!("graph-{}", self.generation + 1);
            let path = self.graph.dump(&self.dir, &base)?;
            Some(FlatMeta {
                basename: base,
                points: self.graph.len() as u64,
                sha256: sha256_file(&path)?,
            })
        } else {
            None
        };
        // The commit's fsyncs then find (almost) nothing left to write.
        for (file, name) in [
            (self.f32_file.file(), F32_FILE),
            (self.i8_file.file(), I8_FILE),
            (self.id_file.file(), IDS_FILE),
        ] {
            file.sync_data()
                .map_err(io_err(&self.dir.join(name), "flush rows"))?;
        }
        Ok(PreparedFlush { graph })
    }

    /// The short, exclusive half of a flush: checksums the rows written since the last commit,
    /// commits `vector.meta` (naming the new graph dump, if any) and removes the old dump.
    pub fn commit_flush(&mut self, prepared: PreparedFlush) -> Result<(), VectorError> {
        let old = self.graph_meta.clone();
        if let Some(g) = prepared.graph {
            if g.points as usize != self.graph.len() {
                return Err(VectorError::Params(format!(
                    "graph dump holds {} points, the graph {}: an insert ran between \
                     prepare_flush and commit_flush",
                    g.points,
                    self.graph.len()
                )));
            }
            self.generation += 1;
            self.graph_meta = Some(g);
        }
        self.write_meta()?;
        let mut stale = Vec::new();
        if let (Some(old), Some(new)) = (old, &self.graph_meta)
            && old.basename != new.basename
        {
            stale.push(Graph::dump_file(&self.dir, &old.basename));
        }
        if self.graph_meta.is_some()
            && let Some(legacy) = self.legacy_graph.take()
        {
            // The migrated index's hnsw_rs dump (`.hnsw.graph` / `.hnsw.data`).
            for ext in ["hnsw.graph", "hnsw.data"] {
                stale.push(self.dir.join(format!("{}.{ext}", legacy.basename)));
            }
        }
        for p in stale {
            // A leftover old dump only wastes space; the meta no longer points at it.
            if let Err(e) = fs::remove_file(&p) {
                tracing::warn!(path = %p.display(), error = %e, "could not remove old graph dump");
            }
        }
        Ok(())
    }

    fn write_meta(&mut self) -> Result<(), VectorError> {
        let meta = Meta {
            format_version: FORMAT_VERSION,
            dim: self.dim as u32,
            params: self.params,
            scale: self.quant.map(|q| q.scale()),
            count: self.slot_chunk.len() as u64,
            generation: self.generation,
            f32_rows: self.f32_file.sync()?,
            i8_rows: self.i8_file.sync()?,
            id_rows: self.id_file.sync()?,
            graph: if self.graph_meta.is_some() {
                None
            } else {
                self.legacy_graph.clone()
            },
            flat_graph: self
                .graph_meta
                .clone()
                .filter(|_| !self.graph.stores_levels()),
            flat_graph_levels: self
                .graph_meta
                .clone()
                .filter(|_| self.graph.stores_levels()),
            dropped_since_build: self.dropped_since_build,
        };
        let body =
            serde_json::to_vec_pretty(&meta).map_err(|e| VectorError::Params(e.to_string()))?;
        let mut text = format!(
            "{META_MAGIC} {FORMAT_VERSION} {}\n",
            hex::encode(Sha256::digest(&body))
        )
        .into_bytes();
        text.extend_from_slice(&body);
        let tmp = self.dir.join(format!("{META_FILE}.tmp"));
        let path = self.dir.join(META_FILE);
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_err(&tmp, "create meta"))?;
        f.write_all(&text)
            .and_then(|()| f.sync_all())
            .map_err(io_err(&tmp, "write meta"))?;
        fs::rename(&tmp, &path).map_err(io_err(&path, "commit meta"))?;
        fsync_path(&self.dir)
    }

    /// Writes a new index into `dir` (created; must not hold an index) holding only the chunks
    /// `keep` accepts, without rebuilding the graph: the kept rows are copied in slot order
    /// (same parameters, same quantization scale, so the int8 rows are identical) and the graph
    /// is compacted ([`flat::FlatGraph::compacted`]: dropped points leave, the lists that named
    /// them are repaired from their neighbours' lists). The new index is checkpointed (durable,
    /// graph dumped) before it is returned; this one is not changed. Every staged row must be
    /// linked. Costs a copy of the rows plus the repaired lists' distance evaluations: at 1%
    /// dropped, a small fraction of a rebuild (docs/benchmarks/vector.md).
    pub fn compact_into(
        &self,
        dir: &Path,
        keep: &dyn Fn(u32) -> bool,
    ) -> Result<(Self, CompactReport), VectorError> {
        if self.graph.len() != self.slot_chunk.len() {
            return Err(VectorError::Params(format!(
                "{} of {} rows linked: link every staged batch before compacting",
                self.graph.len(),
                self.slot_chunk.len()
            )));
        }
        let mut out = Self::create(dir, self.dim, self.params)?;
        out.quant = self.quant;
        let flags: Vec<bool> = self.slot_chunk.iter().map(|&c| keep(c)).collect();
        let kept = flags.iter().filter(|k| **k).count();
        out.dropped_since_build = self.dropped_since_build + (self.slot_chunk.len() - kept) as u64;
        out.i8_data.reserve_exact(kept * self.dim);
        out.slot_chunk.reserve_exact(kept);
        let rb = 4 * self.dim;
        let mut f32_bytes = Vec::new();
        let mut ids = Vec::new();
        let mut i8_start = 0;
        let mut append = |out: &mut Self, f32_bytes: &mut Vec<u8>, ids: &mut Vec<u8>| {
            let i8_bytes: Vec<u8> = out.i8_data[i8_start..].iter().map(|&b| b as u8).collect();
            i8_start = out.i8_data.len();
            out.f32_file.append(f32_bytes)?;
            out.i8_file.append(&i8_bytes)?;
            out.id_file.append(ids)?;
            f32_bytes.clear();
            ids.clear();
            Ok::<(), VectorError>(())
        };
        for (slot, &chunk) in self.slot_chunk.iter().enumerate() {
            if !flags[slot] {
                continue;
            }
            let map = self.f32_map.as_ref().ok_or_else(|| VectorError::Corrupt {
                path: self.dir.join(F32_FILE),
                detail: "rows without a mapping".into(),
            })?;
            let start = rows::HEADER_LEN as usize + slot * rb;
            f32_bytes.extend_from_slice(&map[start..start + rb]);
            out.i8_data.extend_from_slice(self.i8_row(slot));
            ids.extend(chunk.to_le_bytes());
            out.push_slot(chunk);
            if f32_bytes.len() >= 8 << 20 {
                append(&mut out, &mut f32_bytes, &mut ids)?;
            }
        }
        append(&mut out, &mut f32_bytes, &mut ids)?;
        out.f32_map = mmap::map_read_only(out.f32_file.file())
            .map_err(io_err(&out.dir.join(F32_FILE), "mmap"))?;
        out.graph = self.graph.compacted(&self.i8_data, &flags);
        out.checkpoint()?;
        Ok((
            out,
            CompactReport {
                kept,
                dropped: self.slot_chunk.len() - kept,
            },
        ))
    }

    /// Exact f32 dot products of `query` with the stored vectors of `chunks`, in order; `None` for
    /// ids the index does not hold.
    pub fn rescore(&self, query: &[f32], chunks: &[u32]) -> Result<Vec<Option<f32>>, VectorError> {
        self.check_query(query)?;
        let mut row = vec![0f32; self.dim];
        Ok(chunks
            .iter()
            .map(|&c| {
                self.slot_of(c).map(|slot| {
                    self.read_f32_row(slot, &mut row);
                    kernels::dot_f32(query, &row)
                })
            })
            .collect())
    }

    fn read_f32_row(&self, slot: usize, out: &mut [f32]) {
        let Some(map) = &self.f32_map else { return };
        let rb = 4 * self.dim;
        let start = rows::HEADER_LEN as usize + slot * rb;
        for (o, b) in out.iter_mut().zip(map[start..start + rb].chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }

    /// The stored f32 vector of `chunk`.
    pub fn vector(&self, chunk: u32) -> Option<Vec<f32>> {
        let slot = self.slot_of(chunk)?;
        let mut v = vec![0f32; self.dim];
        self.read_f32_row(slot, &mut v);
        Some(v)
    }

    fn check_query(&self, query: &[f32]) -> Result<(), VectorError> {
        if query.len() != self.dim {
            return Err(VectorError::Dimension {
                chunk: u32::MAX,
                got: query.len(),
                want: self.dim,
            });
        }
        if query.iter().any(|x| !x.is_finite()) {
            return Err(VectorError::NonFinite(u32::MAX));
        }
        Ok(())
    }

    fn slot_of(&self, chunk: u32) -> Option<usize> {
        match self.chunk_slot.get(chunk as usize) {
            Some(&s) if s != NO_SLOT => Some(s as usize),
            _ => None,
        }
    }

    /// Gives `chunk` the next slot (the row just appended to `i8_data`) in both maps.
    fn push_slot(&mut self, chunk: u32) {
        let slot = self.slot_chunk.len() as u32;
        self.slot_chunk.push(chunk);
        if self.chunk_slot.len() <= chunk as usize {
            self.chunk_slot.resize(chunk as usize + 1, NO_SLOT);
        }
        self.chunk_slot[chunk as usize] = slot;
    }

    fn i8_row(&self, slot: usize) -> &[i8] {
        &self.i8_data[slot * self.dim..(slot + 1) * self.dim]
    }

    /// Whether `chunk` is indexed (dead or not).
    pub fn contains(&self, chunk: u32) -> bool {
        self.slot_of(chunk).is_some()
    }

    /// All indexed chunk ids (dead ones included), e.g. for crash repair.
    pub fn ids(&self) -> RoaringBitmap {
        self.slot_chunk.iter().copied().collect()
    }

    /// Heap bytes this index holds (capacity-based): `(int8 rows, slot maps, graph)`; the f32
    /// rows stay on disk (memory-mapped).
    pub fn memory_bytes(&self) -> (usize, usize, usize) {
        (
            self.i8_data.capacity(),
            4 * (self.slot_chunk.capacity() + self.chunk_slot.capacity()),
            self.graph.memory_bytes(),
        )
    }

    /// Rows dropped by [`compact_into`](Self::compact_into) (this index's and its sources')
    /// since its graph was last built from scratch: repairs accumulate, so callers rebuild once
    /// this grows past a fraction of the index (`reindex`: 20%).
    pub fn dropped_since_build(&self) -> u64 {
        self.dropped_since_build
    }

    /// Number of indexed vectors.
    pub fn len(&self) -> usize {
        self.slot_chunk.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.slot_chunk.is_empty()
    }

    /// Vector dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Build parameters.
    pub fn params(&self) -> VectorParams {
        self.params
    }

    /// The quantizer (`None` until the first insert or [`calibrate`](Self::calibrate)).
    pub fn quantizer(&self) -> Option<Quantizer> {
        self.quant
    }

    /// The index directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn read_meta(path: &Path) -> Result<Meta, VectorError> {
    let bytes = fs::read(path).map_err(io_err(path, "read meta"))?;
    let corrupt = |detail: String| VectorError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let nl = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| corrupt("no header line".into()))?;
    let header =
        std::str::from_utf8(&bytes[..nl]).map_err(|_| corrupt("header is not UTF-8".into()))?;
    let body = &bytes[nl + 1..];
    let parts: Vec<&str> = header.split(' ').collect();
    if parts.len() != 3 || parts[0] != META_MAGIC {
        return Err(corrupt("not a vector index meta file".into()));
    }
    if parts[1] != FORMAT_VERSION.to_string() {
        return Err(corrupt(format!(
            "format version {} (this build reads {FORMAT_VERSION})",
            parts[1]
        )));
    }
    if hex::encode(Sha256::digest(body)) != parts[2] {
        return Err(corrupt("checksum mismatch".into()));
    }
    let meta: Meta = serde_json::from_slice(body).map_err(|e| corrupt(e.to_string()))?;
    if meta.format_version != FORMAT_VERSION || meta.dim == 0 {
        return Err(corrupt(format!(
            "format version {} / dim {}",
            meta.format_version, meta.dim
        )));
    }
    Ok(meta)
}
