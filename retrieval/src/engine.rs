//! The [`Retrieval`] engine: ingest, search, delete, reconcile, reindex, crash repair.
//!
//! Write path (one writer at a time): validate → chunk → embed (no lock held) → one SQLite
//! transaction (the acknowledgement point) → publish a new visibility snapshot (old chunks dead
//! at once) → index writes (BM25, vector), idempotent by chunk id. A crash between the commit and
//! the index writes is repaired by [`Retrieval::open`], which indexes every committed chunk an
//! index lacks and drops index entries SQLite no longer has.
//!
//! Read path: load the current snapshot (chunk → document map + dead bitmap, an `Arc` swapped by
//! writers) and the current index generation, run the stages, and check every returned chunk
//! against the snapshot again (a dead or disallowed chunk is a bug: `debug_assert!`, and dropped
//! in release builds).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use airlock_acl::AllowSet;
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use roaring::RoaringBitmap;
use rusqlite::Connection;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::bm25::Bm25Index;
use crate::chunker;
use crate::config::RetrievalConfig;
use crate::dense::DenseIndex;
use crate::error::{Error, Result};
use crate::fusion;
use crate::ingest::{self, DocumentInput};
use crate::originals::Originals;
use crate::store::{
    self, ChunkRow, Committed, DocumentInfo, NewChunk, NewDocument, Store, UpsertOutcome,
};
use crate::traits::{Embed, Rerank};
use crate::visibility::{ChunkMap, Visibility};
use crate::write_lock::IndexWriteLock;

/// Which retrievers a search uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchMode {
    /// BM25 only.
    Bm25,
    /// Vector index only.
    Vector,
    /// Both, fused by reciprocal rank.
    Hybrid,
}

impl SearchMode {
    fn name(self) -> &'static str {
        match self {
            SearchMode::Bm25 => "bm25",
            SearchMode::Vector => "vector",
            SearchMode::Hybrid => "hybrid",
        }
    }
}

/// One search.
#[derive(Debug, Clone)]
pub struct SearchRequest<'a> {
    /// Natural-language query.
    pub query: &'a str,
    /// Number of chunks wanted (several may come from one document).
    pub k: usize,
    /// Retrievers to use.
    pub mode: SearchMode,
    /// Rescore candidates with full-precision vectors (vector and hybrid modes).
    pub rescore: bool,
    /// Rerank the top candidates with the configured [`Rerank`] model (ignored without one).
    pub rerank: bool,
}

impl<'a> SearchRequest<'a> {
    /// Hybrid search with rescoring, no rerank: the default request of the API.
    pub fn new(query: &'a str, k: usize) -> Self {
        Self {
            query,
            k,
            mode: SearchMode::Hybrid,
            rescore: true,
            rerank: false,
        }
    }
}

/// The score of one result at each stage it went through (absent: the stage did not see it).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StageScores {
    /// BM25 score.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bm25: Option<f32>,
    /// 1-based rank in the BM25 list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bm25_rank: Option<u32>,
    /// Vector index similarity (int8 approximation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vector: Option<f32>,
    /// 1-based rank in the vector list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vector_rank: Option<u32>,
    /// Reciprocal rank fusion score (hybrid).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rrf: Option<f32>,
    /// Full-precision cosine with the query.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rescore: Option<f32>,
    /// Reranker score.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerank: Option<f32>,
}

/// Milliseconds spent in each stage of one search (0 when skipped).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timings {
    /// Query embedding.
    pub embed_ms: f64,
    /// BM25 retrieval.
    pub bm25_ms: f64,
    /// Vector retrieval.
    pub vector_ms: f64,
    /// Fusion.
    pub fuse_ms: f64,
    /// Full-precision rescoring.
    pub rescore_ms: f64,
    /// Cross-encoder rerank.
    pub rerank_ms: f64,
    /// Reading chunk texts from the store.
    pub fetch_ms: f64,
    /// Whole search.
    pub total_ms: f64,
}

/// One retrieved chunk.
#[derive(Debug, Clone, Serialize)]
pub struct SearchResult {
    /// Chunk id.
    pub chunk_id: u32,
    /// External document id.
    pub doc_id: String,
    /// Document ordinal (for ACL re-checks).
    pub doc_ordinal: u32,
    /// Document title.
    pub title: String,
    /// Position of the chunk in its document (0-based).
    pub position: u32,
    /// Chunk text.
    pub text: String,
    /// Final score (the last stage that ran).
    pub score: f32,
    /// Per-stage scores.
    pub stage_scores: StageScores,
}

/// Results and timings of one search.
#[derive(Debug, Clone, Serialize)]
pub struct SearchResponse {
    /// Best first, at most `k`.
    pub results: Vec<SearchResult>,
    /// Per-stage timings.
    pub timings: Timings,
}

/// Ingest progress, reported through the callback of [`Retrieval::upsert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Documents validated and chunked (`errors` refused, `unchanged` skipped).
    Prepared {
        /// Documents to store.
        docs: usize,
        /// Their chunks.
        chunks: usize,
        /// Documents refused.
        errors: usize,
        /// Documents identical to their stored version.
        unchanged: usize,
    },
    /// Chunks embedded so far.
    Embedded {
        /// Done.
        done: usize,
        /// Total.
        total: usize,
    },
    /// The batch is committed (durable and acknowledged); indexing follows.
    Committed {
        /// Documents committed.
        docs: usize,
        /// Chunks committed.
        chunks: usize,
        /// The committed documents (id, ordinal, version, chunk count, status).
        outcomes: Vec<UpsertOutcome>,
    },
    /// The committed chunks are in the BM25 index; the vector index follows.
    Bm25Indexed {
        /// Chunks indexed.
        chunks: usize,
    },
    /// The committed chunks are searchable.
    Indexed {
        /// Chunks indexed.
        chunks: usize,
    },
}

/// Result of a batch upsert: one entry per stored document, one error per refused one.
#[derive(Debug, Default)]
pub struct IngestReport {
    /// Stored documents, then within each batch first the unchanged ones, then the others in
    /// input order.
    pub outcomes: Vec<UpsertOutcome>,
    /// Refused documents, each error naming its document.
    pub errors: Vec<Error>,
}

/// What a delete did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeleteOutcome {
    /// The document was live and is now tombstoned.
    Deleted,
    /// It was already tombstoned (idempotent delete).
    AlreadyDeleted,
    /// No document with this id was ever stored.
    NotFound,
}

/// Result of [`Retrieval::reconcile`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    /// Live documents absent from the source, now tombstoned (sorted).
    pub orphans_tombstoned: Vec<String>,
    /// Source ids with no live document here (sorted).
    pub missing: Vec<String>,
}

/// Result of [`Retrieval::reindex`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReindexReport {
    /// The new index generation (directory `index/<generation>`).
    pub generation: u64,
    /// Live chunks indexed.
    pub chunks: u64,
    /// Index entries of dead chunks dropped: the larger count of the two indexes (the vector
    /// index keeps every dead row until a reindex; BM25 deletes at write time).
    pub dropped: u64,
    /// How the vector index of the new generation was made.
    pub vector_path: VectorPath,
    /// Wall time.
    pub elapsed_ms: f64,
}

/// How [`Retrieval::reindex`] made the new generation's vector index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VectorPath {
    /// No vector search configured.
    None,
    /// Compacted from the old generation's index (its rows copied, dead entries dropped, the
    /// graph's lists repaired; no rebuild), then any live chunk it lacked inserted.
    Compacted,
    /// Rebuilt from the store (more than [`COMPACT_MAX_DEAD`] churn since the last build).
    Rebuilt,
}

/// [`Retrieval::reindex`] compacts the vector index instead of rebuilding it while at most this
/// fraction of the entries its graph was built with have been dropped (by earlier compactions
/// and this one). Repairs replace a dropped neighbour by its kept neighbours: measured at 1M,
/// recall after compacting 20% away is within ±0.025 of a rebuild's, after a further 40% it is
/// 0.05–0.09 below (docs/benchmarks/vector.md, compaction).
pub const COMPACT_MAX_DEAD: f64 = 0.2;

/// One document removed for good by [`Retrieval::purge`] (ids only, no content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PurgedDocument {
    /// External document id.
    pub doc_id: String,
    /// The version that was tombstoned.
    pub version: String,
    /// When it was tombstoned (Unix milliseconds).
    pub deleted_at_ms: i64,
}

/// Result of [`Retrieval::purge`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PurgeReport {
    /// The documents removed, sorted by id.
    pub purged: Vec<PurgedDocument>,
    /// The index rebuild that dropped them (none when nothing was due).
    pub reindex: Option<ReindexReport>,
    /// Wall time.
    pub elapsed_ms: f64,
}

/// What [`Retrieval::open`] repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RepairReport {
    /// Committed chunks missing from BM25, now indexed.
    pub bm25_added: u64,
    /// BM25 entries of chunks no longer live, removed.
    pub bm25_removed: u64,
    /// Committed chunks missing from the vector index, now indexed.
    pub vector_added: u64,
}

/// Counters for status pages and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Live documents.
    pub live_docs: u64,
    /// Live chunks.
    pub live_chunks: u64,
    /// Dead chunk ids (superseded or tombstoned; indexed until the next reindex).
    pub dead_chunks: u64,
    /// Current index generation.
    pub index_generation: u64,
    /// Whether vector search is available.
    pub vector_index: bool,
}

/// The visibility state searches read: an immutable snapshot, replaced by writers.
pub(crate) struct Snapshot {
    /// Unique in the process (never reused): keys what is cached per snapshot.
    id: u64,
    pub(crate) map: ChunkMap,
    /// Shared with the previous snapshot until a write tombstones something (an ingest batch of
    /// new documents does not copy it).
    pub(crate) dead: Arc<RoaringBitmap>,
    live_chunks: u64,
    live_docs: u64,
}

/// A fresh [`Snapshot::id`].
fn next_snapshot_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Visible chunk sets recently used by searches: (snapshot id, allow set, its visible chunks).
/// Valid for exactly that snapshot and an allow set equal to that one (compared by content), so a
/// write (a new snapshot) or another readable set never reuses one. Timing then depends on
/// whether a caller with the same readable set searched since the last write, never on documents
/// the caller cannot read.
type VisibleSets = Mutex<std::collections::VecDeque<(u64, AllowSet, Arc<RoaringBitmap>)>>;

/// Entries of [`VisibleSets`] (a bitmap over 20M chunks is ~2.5 MB at most).
const VISIBLE_SETS: usize = 16;

/// One generation of derived indexes.
struct Indexes {
    generation: u64,
    bm25: Bm25Index,
    vector: Option<Box<dyn DenseIndex>>,
}

/// Opens the vector index of a generation directory, if vector search is configured. Called with
/// the directory and the embedder's dimension.
pub(crate) type VectorOpener =
    dyn Fn(&Path, usize) -> Result<Option<Box<dyn DenseIndex>>> + Send + Sync;

/// The retrieval engine over one SQLite file and one index directory.
pub struct Retrieval {
    config: RetrievalConfig,
    embedder: Arc<dyn Embed>,
    reranker: Option<Arc<dyn Rerank>>,
    db_path: PathBuf,
    index_root: PathBuf,
    vector_opener: Box<VectorOpener>,
    writer: Mutex<Store>,
    readers: Mutex<Vec<Connection>>,
    snapshot: ArcSwap<Snapshot>,
    indexes: ArcSwap<Indexes>,
    repair: RepairReport,
    originals: Originals,
    visible_sets: VisibleSets,
}

/// An original file a caller may read (see [`Retrieval::original`]).
#[derive(Debug)]
pub struct OriginalFile {
    /// Its media type, as stored.
    pub media_type: String,
    /// SHA-256 of its bytes, lowercase hex.
    pub sha256: String,
    /// The open file.
    pub file: std::fs::File,
    /// Its size in bytes.
    pub len: u64,
}

/// Where the originals of the store whose indexes are under `index_root` live: the sibling
/// directory `originals/` (`<data>/originals`).
pub fn originals_dir(index_root: &Path) -> PathBuf {
    index_root
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join("originals")
}

impl std::fmt::Debug for Retrieval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retrieval")
            .field("db_path", &self.db_path)
            .field("index_root", &self.index_root)
            .finish_non_exhaustive()
    }
}

impl Retrieval {
    /// Opens (creating if needed) the store at `db_path` and the indexes under `index_root`,
    /// then repairs indexes that miss committed chunks (see [`Retrieval::last_repair`]).
    ///
    /// Vector search uses the int8 index of [`crate::vector`]; without one (BM25-only
    /// deployments, tests) use [`Retrieval::open_bm25_only`].
    pub fn open(
        db_path: &Path,
        index_root: &Path,
        config: RetrievalConfig,
        embedder: Arc<dyn Embed>,
        reranker: Option<Arc<dyn Rerank>>,
    ) -> Result<Self> {
        Self::open_with(
            db_path,
            index_root,
            config,
            embedder,
            reranker,
            Box::new(crate::vector_adapter::open),
        )
    }

    /// Like [`Retrieval::open`] without a vector index: `vector` and `hybrid` searches fail with
    /// [`Error::VectorUnavailable`]. Chunking still uses the embedder's tokenizer and chunk
    /// vectors are still computed and stored, so a later [`Retrieval::open`] indexes them.
    pub fn open_bm25_only(
        db_path: &Path,
        index_root: &Path,
        config: RetrievalConfig,
        embedder: Arc<dyn Embed>,
        reranker: Option<Arc<dyn Rerank>>,
    ) -> Result<Self> {
        Self::open_with(
            db_path,
            index_root,
            config,
            embedder,
            reranker,
            Box::new(|_, _| Ok(None)),
        )
    }

    fn open_with(
        db_path: &Path,
        index_root: &Path,
        config: RetrievalConfig,
        embedder: Arc<dyn Embed>,
        reranker: Option<Arc<dyn Rerank>>,
        vector_opener: Box<VectorOpener>,
    ) -> Result<Self> {
        config.validate()?;
        if let Some(parent) = db_path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        std::fs::create_dir_all(index_root).map_err(|e| Error::io(index_root, e))?;
        // Held until the indexes are repaired (see `write_lock`).
        let cross = IndexWriteLock::acquire(index_root)?;
        let store = Store::open(db_path)?;
        let generation = store.meta("index_generation")? as u64;
        remove_other_generations(index_root, generation)?;
        let indexes = open_generation(
            index_root,
            generation,
            &config,
            embedder.dim(),
            &vector_opener,
        )?;
        let snapshot = load_snapshot(&store)?;
        let repair = repair_indexes(&store, &indexes, &snapshot)?;
        let originals = Originals::open(&originals_dir(index_root))?;
        let swept = sweep_originals(&store, &originals)?;
        drop(cross);
        if swept > 0 {
            tracing::warn!(
                files = swept,
                "retrieval: removed original files no document names (an interrupted write)"
            );
        }
        if repair != RepairReport::default() {
            tracing::warn!(
                bm25_added = repair.bm25_added,
                bm25_removed = repair.bm25_removed,
                vector_added = repair.vector_added,
                "retrieval: repaired indexes after an interrupted write"
            );
        }
        Ok(Self {
            config,
            embedder,
            reranker,
            db_path: db_path.to_path_buf(),
            index_root: index_root.to_path_buf(),
            vector_opener,
            writer: Mutex::new(store),
            readers: Mutex::new(Vec::new()),
            snapshot: ArcSwap::from_pointee(snapshot),
            indexes: ArcSwap::from_pointee(indexes),
            repair,
            originals,
            visible_sets: Mutex::new(std::collections::VecDeque::new()),
        })
    }

    /// The cross-process write lock, taken after `self.writer` by every write (see
    /// [`IndexWriteLock`]): `airlock backup` holds it while it copies the store and indexes.
    fn write_lock(&self) -> Result<IndexWriteLock> {
        IndexWriteLock::acquire(&self.index_root)
    }

    /// The name of the configured rerank stage's model, if there is one.
    pub fn reranker_name(&self) -> Option<&str> {
        self.reranker.as_deref().map(|r| r.name())
    }

    /// What the last [`Retrieval::open`] repaired (all zero after a clean shutdown).
    pub fn last_repair(&self) -> &RepairReport {
        &self.repair
    }

    /// The configuration in use.
    pub fn config(&self) -> &RetrievalConfig {
        &self.config
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        let snap = self.snapshot.load();
        let idx = self.indexes.load();
        Stats {
            live_docs: snap.live_docs,
            live_chunks: snap.live_chunks,
            dead_chunks: snap.dead.len(),
            index_generation: idx.generation,
            vector_index: idx.vector.is_some(),
        }
    }

    // ----------------------------------------------------------------------------------------
    // Ingest

    /// Stores a batch of documents: each is validated, chunked, embedded, then all are committed
    /// in one transaction and indexed. A refused document (invalid id, empty, too large) becomes
    /// an entry in [`IngestReport::errors`] and the rest continue; a storage, index or model
    /// failure fails the call (nothing of the batch is acknowledged unless committed).
    pub fn upsert(
        &self,
        docs: Vec<DocumentInput>,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<IngestReport> {
        let mut report = IngestReport::default();
        let existing = self.live_versions(docs.iter().map(|d| d.doc_id.as_str()))?;
        let mut prepared = Vec::with_capacity(docs.len());
        let mut unchanged = 0;
        for doc in docs {
            match self.prepare(doc, &existing) {
                Ok(Ok(p)) => prepared.push(p),
                Ok(Err(same)) => {
                    unchanged += 1;
                    report.outcomes.push(same);
                }
                Err(e) if e.is_user_error() => report.errors.push(e),
                Err(e) => return Err(e),
            }
        }
        let total: usize = prepared.iter().map(|p: &Prepared| p.spans.len()).sum();
        progress(Progress::Prepared {
            docs: prepared.len(),
            chunks: total,
            errors: report.errors.len(),
            unchanged,
        });
        let docs = self.embed_prepared(prepared, total, progress)?;
        let writer = self.writer.lock();
        let _cross = self.write_lock()?;
        self.commit_and_index(writer, docs, &mut report, progress)?;
        Ok(report)
    }

    /// Stores one document; its refusal is the error.
    pub fn upsert_one(&self, doc: DocumentInput) -> Result<UpsertOutcome> {
        let mut r = self.upsert(vec![doc], &mut |_| {})?;
        if let Some(e) = r.errors.pop() {
            return Err(e);
        }
        r.outcomes
            .pop()
            .ok_or_else(|| Error::Corrupt("upsert of one document reported nothing".into()))
    }

    /// Ingests a file or a directory tree (text, Markdown, HTML, JSONL), `batch` documents per
    /// transaction. Unreadable or refused documents are reported, the rest continue.
    pub fn ingest_path(
        &self,
        path: &Path,
        batch: usize,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<IngestReport> {
        let items = ingest::read_path(path, self.config.max_document_bytes)?;
        self.ingest_items(items, batch, progress)
    }

    /// Ingests parsed documents (e.g. from [`ingest::parse_jsonl`]) in batches of `batch`,
    /// carrying parse errors into the report.
    pub fn ingest_items(
        &self,
        items: Vec<Result<DocumentInput>>,
        batch: usize,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<IngestReport> {
        let mut report = IngestReport::default();
        let mut buf = Vec::with_capacity(batch.max(1));
        let mut flush = |buf: &mut Vec<DocumentInput>, report: &mut IngestReport| -> Result<()> {
            if buf.is_empty() {
                return Ok(());
            }
            let r = self.upsert(std::mem::take(buf), progress)?;
            report.outcomes.extend(r.outcomes);
            report.errors.extend(r.errors);
            Ok(())
        };
        for item in items {
            match item {
                Ok(d) => buf.push(d),
                Err(e) if e.is_user_error() => report.errors.push(e),
                Err(e) => return Err(e),
            }
            if buf.len() >= batch.max(1) {
                flush(&mut buf, &mut report)?;
            }
        }
        flush(&mut buf, &mut report)?;
        Ok(report)
    }

    /// (version, ordinal, chunk count) of the live documents among `ids`.
    fn live_versions<'a>(
        &self,
        ids: impl Iterator<Item = &'a str>,
    ) -> Result<HashMap<String, (String, u32, usize)>> {
        self.with_reader(|conn| {
            let mut st = conn.prepare_cached(
                "SELECT version, ordinal, chunk_count FROM documents WHERE doc_id = ?1 AND deleted_at IS NULL",
            )?;
            let mut out = HashMap::new();
            for id in ids {
                let row = rusqlite::OptionalExtension::optional(st.query_row([id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?, r.get::<_, i64>(2)? as usize))
                }))?;
                if let Some(v) = row {
                    out.insert(id.to_owned(), v);
                }
            }
            Ok(out)
        })
    }

    /// Validates and chunks one document; `Err(outcome)` inside `Ok` when it is unchanged.
    fn prepare(
        &self,
        doc: DocumentInput,
        existing: &HashMap<String, (String, u32, usize)>,
    ) -> Result<std::result::Result<Prepared, UpsertOutcome>> {
        ingest::validate_doc_id(&doc.doc_id)?;
        let size = doc.text.len() + doc.title.len();
        if size > self.config.max_document_bytes {
            return Err(Error::DocumentTooLarge {
                doc_id: doc.doc_id,
                bytes: size,
                limit: self.config.max_document_bytes,
            });
        }
        if doc.text.trim().is_empty() {
            return Err(Error::EmptyDocument { doc_id: doc.doc_id });
        }
        let version = content_version(&doc);
        if let Some((v, ordinal, chunks)) = existing.get(&doc.doc_id)
            && *v == version
        {
            return Ok(Err(UpsertOutcome {
                doc_id: doc.doc_id,
                ordinal: *ordinal,
                version,
                chunks: *chunks,
                status: crate::store::UpsertStatus::Unchanged,
            }));
        }
        let title_tokens = if store::index_title(&doc.title).is_empty() {
            0
        } else {
            self.embedder
                .token_spans(store::index_title(&doc.title))?
                .len()
        };
        let budget = self
            .embedder
            .max_tokens()
            .saturating_sub(self.embedder.special_tokens() + title_tokens)
            .max(16);
        let max_tokens = self.config.chunk.target_tokens.min(budget);
        let token_spans = self.embedder.token_spans(&doc.text)?;
        let (spans, extras) = if doc.regions.is_empty() {
            let spans = chunker::chunk(
                &doc.text,
                &token_spans,
                max_tokens,
                self.config.chunk.overlap,
            );
            let extras = vec![(None, None); spans.len()];
            (spans, extras)
        } else {
            let embedder = &self.embedder;
            let header_tokens =
                |h: &str| embedder.token_spans(h).map(|t| t.len()).unwrap_or(h.len());
            chunker::chunk_regions(
                &doc.text,
                &token_spans,
                &doc.regions,
                max_tokens,
                self.config.chunk.overlap,
                &header_tokens,
            )
            .into_iter()
            .map(|c| (c.span, (c.header, Some(c.anchor))))
            .unzip()
        };
        if spans.is_empty() {
            return Err(Error::EmptyDocument { doc_id: doc.doc_id });
        }
        Ok(Ok(Prepared {
            doc,
            version,
            spans,
            extras,
        }))
    }

    fn embed_prepared(
        &self,
        prepared: Vec<Prepared>,
        total: usize,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<NewDocument>> {
        let texts: Vec<String> = prepared
            .iter()
            .flat_map(|p| {
                p.spans.iter().zip(&p.extras).map(|(s, (h, _))| {
                    store::index_text(&p.doc.title, &chunk_text(&p.doc.text, s, h.as_deref()))
                })
            })
            .collect();
        let mut vectors = Vec::with_capacity(total);
        for batch in texts.chunks(self.config.embed_batch) {
            let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
            let v = self.embedder.embed(&refs)?;
            if v.len() != refs.len() || v.iter().any(|x| x.len() != self.embedder.dim()) {
                return Err(Error::Model(crate::ModelError(format!(
                    "embedder returned {} vectors for {} texts (dimension {} expected)",
                    v.len(),
                    refs.len(),
                    self.embedder.dim()
                ))));
            }
            vectors.extend(v);
            progress(Progress::Embedded {
                done: vectors.len(),
                total,
            });
        }
        let mut vectors = vectors.into_iter();
        Ok(prepared
            .into_iter()
            .map(|p| {
                let chunks = p
                    .spans
                    .iter()
                    .zip(&p.extras)
                    .map(|(s, (h, anchor))| NewChunk {
                        text: chunk_text(&p.doc.text, s, h.as_deref()),
                        anchor: anchor
                            .as_ref()
                            .map(|a| serde_json::to_string(a).unwrap_or_default()),
                        token_start: s.token_start,
                        token_end: s.token_end,
                        byte_start: s.byte_start,
                        byte_end: s.byte_end,
                        embedding: vectors.next().unwrap_or_default(),
                    })
                    .collect();
                NewDocument {
                    doc_id: p.doc.doc_id,
                    title: p.doc.title,
                    metadata: p.doc.metadata,
                    version: p.version,
                    chunks,
                    original: p.doc.original,
                }
            })
            .collect())
    }

    fn commit_and_index(
        &self,
        mut store: parking_lot::MutexGuard<'_, Store>,
        docs: Vec<NewDocument>,
        report: &mut IngestReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        if docs.is_empty() {
            return Ok(());
        }
        let mut check = Vec::new();
        let committed = self
            .put_originals(&store, &docs, &mut check)
            .and_then(|()| store.upsert(docs));
        let committed = match committed {
            Ok(c) => c,
            Err(e) => {
                // Nothing committed: the files just written may name nothing.
                let _ = self.drop_unnamed_originals(&store, check);
                return Err(e);
            }
        };
        self.publish_and_index(&store, committed, Publish::All, report, progress)?;
        self.drop_unnamed_originals(&store, check)?;
        drop(store);
        Ok(())
    }

    /// Stores the original files of `docs` (before their rows are committed) and adds to
    /// `check` the digests to look at once the write is over: those the documents name now,
    /// which the write may replace, and the new ones.
    fn put_originals(
        &self,
        store: &Store,
        docs: &[NewDocument],
        check: &mut Vec<String>,
    ) -> Result<()> {
        let ids: Vec<&str> = docs.iter().map(|d| d.doc_id.as_str()).collect();
        check.extend(Store::originals_named(&store.conn, &ids).map_err(|e| store.err(e))?);
        for o in docs.iter().filter_map(|d| d.original.as_ref()) {
            check.push(o.sha256.clone());
            self.originals.put(o)?;
        }
        Ok(())
    }

    /// Removes those of `digests` that no live document names (any more, or after a failed
    /// write, at all).
    fn drop_unnamed_originals(&self, store: &Store, mut digests: Vec<String>) -> Result<()> {
        digests.sort_unstable();
        digests.dedup();
        for d in digests {
            if !Store::original_is_named(&store.conn, &d).map_err(|e| store.err(e))? {
                self.originals.remove(&d)?;
            }
        }
        Ok(())
    }

    /// Makes committed rows visible: the replaced versions' chunks die and the new chunks are
    /// mapped (in one snapshot, or only one of the two with `only`), then the new chunks are
    /// indexed.
    fn publish_and_index(
        &self,
        store: &Store,
        mut committed: Committed,
        only: Publish,
        report: &mut IngestReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        // A document given twice in one batch: its first version's chunks died in the same
        // transaction; they are neither mapped nor indexed.
        if !committed.dead.is_empty() {
            let dead: RoaringBitmap = committed.dead.iter().copied().collect();
            committed.added.retain(|a| !dead.contains(a.0));
        }
        if only != Publish::Additions {
            progress(Progress::Committed {
                docs: committed.outcomes.len(),
                chunks: committed.added.len(),
                outcomes: committed.outcomes.clone(),
            });
        }
        self.publish(store, &committed, only)?;
        if only == Publish::Removals {
            return Ok(());
        }
        // Index (idempotent by chunk id; repaired on open if this does not finish).
        let idx = self.indexes.load_full();
        let bm25_add: Vec<(u32, String)> = committed
            .added
            .iter()
            .map(|(id, _, t, _)| (*id, t.clone()))
            .collect();
        idx.bm25.write(&bm25_add, &committed.dead)?;
        progress(Progress::Bm25Indexed {
            chunks: committed.added.len(),
        });
        if let Some(v) = &idx.vector {
            let items: Vec<(u32, &[f32])> = committed
                .added
                .iter()
                .map(|(id, _, _, e)| (*id, e.as_slice()))
                .collect();
            v.insert(&items)?;
            v.flush()?;
        }
        progress(Progress::Indexed {
            chunks: committed.added.len(),
        });
        report.outcomes.extend(committed.outcomes);
        Ok(())
    }

    /// Publishes a new snapshot: from here on the replaced versions' chunks are dead
    /// ([`Publish::Removals`]), the new chunks are mapped ([`Publish::Additions`]), or both.
    fn publish(&self, store: &Store, committed: &Committed, only: Publish) -> Result<()> {
        let live_docs = store.live_doc_count()?;
        self.publish_counted(committed, only, live_docs);
        Ok(())
    }

    /// [`Retrieval::publish`] with the live document count given (no I/O, cannot fail).
    fn publish_counted(&self, committed: &Committed, only: Publish, live_docs: u64) {
        let old = self.snapshot.load_full();
        let mut map = old.map.clone();
        let mut dead = Arc::clone(&old.dead);
        let mut live_chunks = old.live_chunks;
        if only != Publish::Additions {
            let was_live = committed
                .dead
                .iter()
                .filter(|&&c| old.map.doc_of(c).is_some())
                .count();
            for &ord in &committed.replaced_docs {
                map.remove_doc(ord);
            }
            if !committed.dead.is_empty() {
                Arc::make_mut(&mut dead).extend(committed.dead.iter().copied());
            }
            live_chunks -= was_live as u64;
        }
        if only != Publish::Removals {
            for (id, ord, _, _) in &committed.added {
                map.insert(*id, *ord);
            }
            live_chunks += committed.added.len() as u64;
        }
        self.snapshot.store(Arc::new(Snapshot {
            id: next_snapshot_id(),
            map,
            dead,
            live_chunks,
            live_docs,
        }));
    }

    /// Validates, chunks and embeds one document without storing anything (the refusals of
    /// [`Retrieval::upsert_one`] happen here), for [`Retrieval::upsert_joined`].
    pub fn stage(&self, doc: DocumentInput) -> Result<Staged> {
        let existing = self.live_versions(std::iter::once(doc.doc_id.as_str()))?;
        match self.prepare(doc, &existing)? {
            Err(same) => Ok(Staged {
                doc: None,
                unchanged: Some(same),
            }),
            Ok(p) => {
                let total = p.spans.len();
                let doc = self.embed_prepared(vec![p], total, &mut |_| {})?.pop();
                Ok(Staged {
                    doc,
                    unchanged: None,
                })
            }
        }
    }

    /// Stores a staged document in a transaction of its own ([`Retrieval::upsert_one`] after
    /// [`Retrieval::stage`]).
    pub fn upsert_staged(&self, staged: Staged) -> Result<UpsertOutcome> {
        let mut report = IngestReport::default();
        if let Some(doc) = staged.doc {
            let writer = self.writer.lock();
            let _cross = self.write_lock()?;
            self.commit_and_index(writer, vec![doc], &mut report, &mut |_| {})?;
        }
        report
            .outcomes
            .pop()
            .or(staged.unchanged)
            .ok_or_else(|| Error::Corrupt("upsert of one document reported nothing".into()))
    }

    /// Stores a staged document in another component's SQLite transaction (the document's
    /// grant, written by `airlock-acl`): `commit` opens the transaction on the same database
    /// file, calls [`JointWrite::write`] inside it, commits, then calls
    /// [`JointWrite::hide_replaced`] before it publishes its own change. The old version's
    /// chunks are therefore invisible before the new grant applies, and the new chunks become
    /// visible only after it. When `commit` fails before committing, nothing is stored.
    /// Other writes of this engine wait meanwhile.
    pub fn upsert_joined<E>(
        &self,
        staged: Staged,
        commit: impl FnOnce(&mut JointWrite<'_>) -> std::result::Result<(), E>,
    ) -> std::result::Result<UpsertOutcome, E>
    where
        E: From<Error>,
    {
        let store = self.writer.lock();
        let _cross = self.write_lock()?;
        let mut joint = JointWrite {
            engine: self,
            store: &store,
            doc: staged.doc,
            committed: None,
            hidden: false,
            check: Vec::new(),
        };
        let result = commit(&mut joint);
        let JointWrite {
            committed,
            hidden,
            check,
            ..
        } = joint;
        let mut report = IngestReport::default();
        if let Some(committed) = committed {
            // Rows written: were they committed? Always so once hidden (after the commit);
            // otherwise the store says whether the new version is there.
            let landed = hidden || {
                let o = &committed.outcomes[0];
                let info = Store::document(&store.conn, &o.doc_id).map_err(|e| store.err(e))?;
                info.is_some_and(|i| i.version == o.version && i.deleted_at_ms.is_none())
            };
            if landed {
                let only = if hidden {
                    Publish::Additions
                } else {
                    Publish::All
                };
                self.publish_and_index(&store, committed, only, &mut report, &mut |_| {})?;
            }
        }
        // After a commit, the replaced version's file may be unnamed; after a failure, the new
        // one.
        let dropped = self.drop_unnamed_originals(&store, check);
        result?;
        dropped?;
        drop(store);
        if let Some(outcome) = report.outcomes.pop().or(staged.unchanged) {
            return Ok(outcome);
        }
        Err(Error::Corrupt("a joined upsert stored nothing".into()).into())
    }

    // ----------------------------------------------------------------------------------------
    // Delete, reconcile, reindex

    /// Tombstones a document: `deleted_at` is set and its chunks become dead in one step; it is
    /// never returned again. Idempotent.
    pub fn delete(&self, doc_id: &str) -> Result<DeleteOutcome> {
        let r = self.delete_many(&[doc_id])?;
        Ok(r[0])
    }

    fn delete_many(&self, doc_ids: &[&str]) -> Result<Vec<DeleteOutcome>> {
        let mut store = self.writer.lock();
        let _cross = self.write_lock()?;
        let check = Store::originals_named(&store.conn, doc_ids).map_err(|e| store.err(e))?;
        let deleted = store.delete(doc_ids)?;
        let old = self.snapshot.load_full();
        let mut map = old.map.clone();
        let mut dead = Arc::clone(&old.dead);
        let mut dead_ids = Vec::new();
        let mut out = Vec::with_capacity(doc_ids.len());
        for (id, d) in doc_ids.iter().zip(deleted) {
            match d {
                Some((ord, chunks)) => {
                    map.remove_doc(ord);
                    Arc::make_mut(&mut dead).extend(chunks.iter().copied());
                    dead_ids.extend(chunks);
                    out.push(DeleteOutcome::Deleted);
                }
                None => out.push(
                    match Store::document(&store.conn, id).map_err(|e| store.err(e))? {
                        Some(_) => DeleteOutcome::AlreadyDeleted,
                        None => DeleteOutcome::NotFound,
                    },
                ),
            }
        }
        if out.contains(&DeleteOutcome::Deleted) {
            let live_docs = store.live_doc_count()?;
            self.snapshot.store(Arc::new(Snapshot {
                id: next_snapshot_id(),
                map,
                dead,
                live_chunks: old.live_chunks - dead_ids.len() as u64,
                live_docs,
            }));
            // Dropping them from BM25 now keeps its statistics honest; the dead bitmap already
            // hides them, and repair on open finishes this if it is interrupted.
            self.indexes.load().bm25.write(&[], &dead_ids)?;
        }
        self.drop_unnamed_originals(&store, check)?;
        Ok(out)
    }

    /// Compares the store with the source's current id list: live documents the source no
    /// longer has are tombstoned, source ids with no live document are reported missing.
    ///
    /// An empty list (which would tombstone every document) is refused with
    /// [`Error::InvalidRequest`] unless `allow_empty`; nothing changes then.
    pub fn reconcile(&self, source_ids: &[String], allow_empty: bool) -> Result<ReconcileReport> {
        if source_ids.is_empty() && !allow_empty {
            return Err(Error::InvalidRequest(
                "the source id list is empty: reconciling it would tombstone every document; \
                 nothing was changed (say allow_empty to do it on purpose)"
                    .into(),
            ));
        }
        let live: std::collections::BTreeSet<String> =
            self.writer.lock().live_doc_ids()?.into_iter().collect();
        let source: std::collections::BTreeSet<&str> =
            source_ids.iter().map(String::as_str).collect();
        let orphans: Vec<&str> = live
            .iter()
            .map(String::as_str)
            .filter(|id| !source.contains(id))
            .collect();
        let missing: Vec<String> = source
            .iter()
            .filter(|id| !live.contains(**id))
            .map(|s| (*s).to_owned())
            .collect();
        let outcomes = self.delete_many(&orphans)?;
        let orphans_tombstoned = orphans
            .iter()
            .zip(outcomes)
            .filter(|(_, o)| *o == DeleteOutcome::Deleted)
            .map(|(id, _)| (*id).to_owned())
            .collect();
        Ok(ReconcileReport {
            orphans_tombstoned,
            missing,
        })
    }

    /// Makes every index anew into `index/<generation + 1>/`, switches to it and removes the old
    /// generation. Dead chunks are not carried over: BM25 is rebuilt from the store; the vector
    /// index is compacted from the old one (no graph rebuild) while at most
    /// [`COMPACT_MAX_DEAD`] of the entries its graph was built with have been dropped, else
    /// rebuilt ([`ReindexReport::vector_path`] says which). Writes wait meanwhile; searches continue on the old generation until the
    /// switch.
    pub fn reindex(&self) -> Result<ReindexReport> {
        let store = self.writer.lock();
        let _cross = self.write_lock()?;
        self.reindex_locked(&store)
    }

    /// Physically removes tombstoned documents deleted at or before `deleted_before_ms` (Unix
    /// milliseconds): their rows leave the store, the indexes are rebuilt without them (the old
    /// generation's files are removed), and the database file is vacuumed with its write-ahead
    /// log truncated, so their text is in no file of the index root or the database. Writes
    /// wait meanwhile; searches go on. Nothing is rebuilt when nothing is due.
    pub fn purge(&self, deleted_before_ms: i64) -> Result<PurgeReport> {
        let t = Instant::now();
        let mut store = self.writer.lock();
        let _cross = self.write_lock()?;
        let purged = store.purge(deleted_before_ms)?;
        let reindex = if purged.is_empty() {
            None
        } else {
            let r = self.reindex_locked(&store)?;
            store.vacuum()?;
            Some(r)
        };
        // A tombstoned document's original went with its delete; this also removes any file
        // an interrupted write left behind.
        sweep_originals(&store, &self.originals)?;
        Ok(PurgeReport {
            purged: purged
                .into_iter()
                .map(|(doc_id, version, deleted_at_ms)| PurgedDocument {
                    doc_id,
                    version,
                    deleted_at_ms,
                })
                .collect(),
            reindex,
            elapsed_ms: ms(t),
        })
    }

    fn reindex_locked(&self, store: &Store) -> Result<ReindexReport> {
        let t = Instant::now();
        let old = self.indexes.load_full();
        let old_entries = old.bm25.num_docs();
        let generation = old.generation + 1;
        let dir = self.index_root.join(generation.to_string());
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        }
        let live: RoaringBitmap = store.live_chunks()?.into_iter().map(|(id, _)| id).collect();
        // The vector index is compacted from the old generation's (rows copied, graph repaired)
        // when few of its entries are dead, else rebuilt from the store.
        let mut vector_path = if old.vector.is_some() {
            VectorPath::Rebuilt
        } else {
            VectorPath::None
        };
        let mut vector_dead = 0;
        let compacted = match &old.vector {
            Some(v) => {
                let ids = v.ids()?;
                let dead = ids.len() - ids.intersection_len(&live);
                vector_dead = dead;
                // Churn since the graph was last built, this reindex's dead entries included:
                // repairs accumulate over compactions.
                let before = v.dropped_since_build();
                let churn = (before + dead) as f64 / (ids.len() + before).max(1) as f64;
                if !ids.is_empty() && churn <= COMPACT_MAX_DEAD {
                    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
                    vector_path = VectorPath::Compacted;
                    Some(v.compact_into(&dir.join("vector"), &live)?.0)
                } else {
                    None
                }
            }
            None => None,
        };
        let fresh = match compacted {
            Some(vector) => Indexes {
                generation,
                bm25: Bm25Index::open(&dir.join("bm25"), &self.config.bm25)?,
                vector: Some(vector),
            },
            None => open_generation(
                &self.index_root,
                generation,
                &self.config,
                self.embedder.dim(),
                &self.vector_opener,
            )?,
        };
        // Live chunks the (compacted) vector index lacks; all of them after a rebuild.
        let vec_missing = match &fresh.vector {
            Some(v) => &live - &v.ids()?,
            None => RoaringBitmap::new(),
        };
        let mut chunks = 0u64;
        let mut bm25_batch = Vec::new();
        let mut vec_batch: Vec<(u32, Vec<f32>)> = Vec::new();
        let flush = |b: &mut Vec<(u32, String)>, v: &mut Vec<(u32, Vec<f32>)>| -> Result<()> {
            fresh.bm25.write(b, &[])?;
            if let Some(vi) = &fresh.vector {
                let items: Vec<(u32, &[f32])> =
                    v.iter().map(|(id, e)| (*id, e.as_slice())).collect();
                vi.insert(&items)?;
            }
            b.clear();
            v.clear();
            Ok(())
        };
        store.for_each_chunk(None, |id, text, emb| {
            chunks += 1;
            bm25_batch.push((id, text));
            if vec_missing.contains(id) {
                vec_batch.push((id, emb));
            }
            if bm25_batch.len() >= 20_000 {
                flush(&mut bm25_batch, &mut vec_batch)?;
            }
            Ok(())
        })?;
        flush(&mut bm25_batch, &mut vec_batch)?;
        if let Some(v) = &fresh.vector {
            v.flush()?;
        }
        Store::set_meta(&store.conn, "index_generation", generation as i64)
            .map_err(|e| store.err(e))?;
        self.indexes.store(Arc::new(fresh));
        drop(old);
        let old_dir = self.index_root.join((generation - 1).to_string());
        if old_dir.exists() {
            // Searches still holding the old generation keep their open (mmapped) files.
            std::fs::remove_dir_all(&old_dir).map_err(|e| Error::io(&old_dir, e))?;
        }
        Ok(ReindexReport {
            generation,
            chunks,
            dropped: old_entries.saturating_sub(chunks).max(vector_dead),
            vector_path,
            elapsed_ms: t.elapsed().as_secs_f64() * 1e3,
        })
    }

    // ----------------------------------------------------------------------------------------
    // Read

    /// Admin view of a document (live or tombstoned), `None` if never stored.
    pub fn document(&self, doc_id: &str) -> Result<Option<DocumentInfo>> {
        self.with_reader(|c| Store::document(c, doc_id))
    }

    /// The original file of the live document `doc_id` if `allow` contains it; `None` when the
    /// document is unknown, tombstoned, has no original (given as text) or is not in `allow`,
    /// which the caller cannot tell apart.
    pub fn original(&self, doc_id: &str, allow: &AllowSet) -> Result<Option<OriginalFile>> {
        let Some((ordinal, sha256, media_type)) =
            self.with_reader(|c| Store::original_of(c, doc_id))?
        else {
            return Ok(None);
        };
        if !allow.contains(ordinal) {
            return Ok(None);
        }
        let Some(path) = self.originals.path(&sha256) else {
            return Err(Error::Corrupt(format!(
                "document {doc_id:.80}: stored original is not a digest"
            )));
        };
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            // Replaced or deleted since the row was read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, e)),
        };
        let len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        Ok(Some(OriginalFile {
            media_type,
            sha256,
            file,
            len,
        }))
    }

    /// The SHA-256 of the live document `doc_id`'s original file, if it has one (`airlock
    /// ingest DIR` skips a file whose digest is already stored under its id).
    pub fn original_digest(&self, doc_id: &str) -> Result<Option<String>> {
        Ok(self
            .with_reader(|c| Store::original_of(c, doc_id))?
            .map(|(_, sha256, _)| sha256))
    }

    /// Whether `chunk_id` is live and readable under `allow` right now (the generation-time
    /// re-check of DESIGN §4).
    pub fn is_visible(&self, chunk_id: u32, allow: &AllowSet) -> bool {
        let snap = self.snapshot.load();
        Visibility::new(allow, &snap.map, &snap.dead).visible(chunk_id)
    }

    /// The anchors (page, sheet + rows, slide, heading path) of the chunks among `chunk_ids`
    /// that have one (chunks of extracted files) and whose document `allow` contains; chunks of
    /// text documents, dead chunks and chunks the caller may not see are left out.
    pub fn chunk_anchors(
        &self,
        chunk_ids: &[u32],
        allow: &AllowSet,
    ) -> Result<HashMap<u32, crate::ingest::Anchor>> {
        let rows = self.with_reader(|conn| Store::anchors(conn, chunk_ids))?;
        Ok(rows
            .into_iter()
            .filter(|(_, ordinal, _)| allow.contains(*ordinal))
            .map(|(id, _, a)| (id, a))
            .collect())
    }

    /// The document version (content hash) each of `chunk_ids` belongs to, for the chunks
    /// still stored (a replaced or purged version's chunks are not). What a chat's sources
    /// showed is keyed on it; it is a hash, never content.
    pub fn chunk_versions(&self, chunk_ids: &[u32]) -> Result<HashMap<u32, String>> {
        self.with_reader(|conn| Store::chunk_versions(conn, chunk_ids))
    }

    /// Whether the chunks `allow` may read (live and granted) mention each of `words`, as the
    /// BM25 index analyses text: every term of the word's analysis occurs in one of them.
    /// `None` for a word the analysis drops (a stop word). Nothing about chunks the caller
    /// cannot read decides the answer: a word only they hold is not mentioned.
    pub fn mentions(&self, words: &[&str], allow: &AllowSet) -> Result<Vec<Option<bool>>> {
        let snap = self.snapshot.load_full();
        let idx = self.indexes.load_full();
        let vis = Visibility::new(allow, &snap.map, &snap.dead);
        let set = self.visible_set(&snap, allow, &vis);
        words.iter().map(|w| idx.bm25.mentioned(w, &set)).collect()
    }

    /// Runs one search for a user whose readable documents are `allow`.
    pub fn search(&self, req: &SearchRequest<'_>, allow: &AllowSet) -> Result<SearchResponse> {
        let total = Instant::now();
        let cfg = &self.config.search;
        if req.k == 0 || req.k > cfg.max_k {
            return Err(Error::InvalidRequest(format!(
                "k must be within 1..={}",
                cfg.max_k
            )));
        }
        let mut timings = Timings::default();
        let snap = self.snapshot.load_full();
        let idx = self.indexes.load_full();
        let vis = Visibility::new(allow, &snap.map, &snap.dead);
        let needs_vector = req.mode != SearchMode::Bm25;
        if needs_vector && idx.vector.is_none() {
            return Err(Error::VectorUnavailable(req.mode.name()));
        }
        if req.query.trim().is_empty() || allow.is_empty() {
            timings.total_ms = ms(total);
            return Ok(SearchResponse {
                results: Vec::new(),
                timings,
            });
        }
        let cands = self.candidates(req, &snap, &idx, allow, &vis, &mut timings)?;
        // Texts: enough candidates for the reranker and for k live results.
        let t = Instant::now();
        let want = if req.rerank && self.reranker.is_some() {
            cfg.rerank_depth.max(req.k)
        } else {
            req.k
        };
        let mut rows = self.fetch_rows(&cands, want, &vis)?;
        timings.fetch_ms = ms(t);
        if req.rerank
            && let Some(rr) = &self.reranker
        {
            let t = Instant::now();
            rerank_rows(rr.as_ref(), req.query, &mut rows)?;
            timings.rerank_ms = ms(t);
        }
        rows.truncate(req.k);
        let results: Vec<SearchResult> = rows
            .into_iter()
            .map(|(c, r)| SearchResult {
                chunk_id: c.chunk,
                doc_id: r.doc_id,
                doc_ordinal: r.doc_ordinal,
                title: r.title,
                position: r.position,
                text: r.text,
                score: c.score,
                stage_scores: c.stage,
            })
            .collect();
        debug_assert!(
            results
                .iter()
                .all(|r| !snap.dead.contains(r.chunk_id) && allow.contains(r.doc_ordinal)),
            "dead or disallowed chunk returned"
        );
        timings.total_ms = ms(total);
        Ok(SearchResponse { results, timings })
    }

    /// The first stage of a search: the query embedded (unless BM25 only), BM25 and vector
    /// candidates, fused by the mode, then rescored exactly if asked; each step timed.
    fn candidates(
        &self,
        req: &SearchRequest<'_>,
        snap: &Snapshot,
        idx: &Indexes,
        allow: &AllowSet,
        vis: &Visibility<'_>,
        timings: &mut Timings,
    ) -> Result<Vec<fusion::Candidate>> {
        let cfg = &self.config.search;
        let needs_vector = req.mode != SearchMode::Bm25;
        let n_cand = cfg.candidates.max(req.k);
        let qvec = if needs_vector {
            let t = Instant::now();
            let mut v = self.embedder.embed(&[req.query])?;
            timings.embed_ms = ms(t);
            v.pop()
        } else {
            None
        };
        let bm25_hits = if req.mode != SearchMode::Vector {
            let t = Instant::now();
            let set = self.visible_set(snap, allow, vis);
            let h = idx.bm25.search(
                req.query,
                n_cand,
                vis,
                &set,
                visible_chunk_count(allow, snap),
            )?;
            timings.bm25_ms = ms(t);
            h
        } else {
            Vec::new()
        };
        let vec_hits = match (&idx.vector, &qvec) {
            (Some(v), Some(q)) => {
                let t = Instant::now();
                let h = v.search(q, n_cand, vis)?;
                timings.vector_ms = ms(t);
                h
            }
            _ => Vec::new(),
        };
        let t = Instant::now();
        let mut cands = match req.mode {
            SearchMode::Bm25 => fusion::single(&bm25_hits, fusion::Source::Bm25),
            SearchMode::Vector => fusion::single(&vec_hits, fusion::Source::Vector),
            SearchMode::Hybrid => fusion::rrf(&bm25_hits, &vec_hits, cfg.rrf_k),
        };
        timings.fuse_ms = ms(t);
        if req.rescore
            && let (Some(v), Some(q)) = (&idx.vector, &qvec)
        {
            let t = Instant::now();
            let depth = cfg.rescore_depth.max(req.k).min(cands.len());
            let ids: Vec<u32> = cands[..depth].iter().map(|c| c.chunk).collect();
            let exact = v.rescore(q, &ids)?;
            fusion::apply_rescore(&mut cands, depth, &exact, req.mode, cfg.rrf_k);
            timings.rescore_ms = ms(t);
        }
        Ok(cands)
    }

    /// The stored rows of the first `want` candidates that still have one (a chunk deleted
    /// after the snapshot was taken has none), in candidate order.
    fn fetch_rows(
        &self,
        cands: &[fusion::Candidate],
        want: usize,
        vis: &Visibility<'_>,
    ) -> Result<Vec<(fusion::Candidate, ChunkRow)>> {
        let mut rows = Vec::with_capacity(want);
        self.with_reader(|conn| {
            for c in cands {
                if rows.len() >= want {
                    break;
                }
                if !vis.visible(c.chunk) {
                    debug_assert!(false, "search produced an invisible chunk {}", c.chunk);
                    continue;
                }
                // A chunk deleted after the snapshot was taken has no row: skip it.
                if let Some(row) = Store::chunk(conn, c.chunk)? {
                    rows.push((c.clone(), row));
                }
            }
            Ok(())
        })?;
        Ok(rows)
    }

    /// The chunks `vis` accepts, cached per snapshot and allow set (see [`VisibleSets`]).
    fn visible_set(
        &self,
        snap: &Snapshot,
        allow: &AllowSet,
        vis: &Visibility<'_>,
    ) -> Arc<RoaringBitmap> {
        {
            let sets = self.visible_sets.lock();
            if let Some(e) = sets
                .iter()
                .find(|e| e.0 == snap.id && e.1.bitmap() == allow.bitmap())
            {
                return Arc::clone(&e.2);
            }
        }
        let set = Arc::new(vis.visible_set());
        let mut sets = self.visible_sets.lock();
        sets.retain(|e| e.0 >= snap.id);
        sets.push_front((snap.id, allow.clone(), Arc::clone(&set)));
        sets.truncate(VISIBLE_SETS);
        set
    }

    pub(crate) fn with_reader<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T> {
        let conn = self.readers.lock().pop();
        let conn = match conn {
            Some(c) => c,
            None => store::open_conn(&self.db_path)?,
        };
        let r = f(&conn).map_err(|source| Error::Store {
            path: self.db_path.clone(),
            source,
        });
        let mut pool = self.readers.lock();
        if pool.len() < 8 {
            pool.push(conn);
        }
        r
    }
}

/// Scores `rows` against `query` with the reranker and sorts them by that score (ties by chunk
/// id); a reranker returning another number of scores than passages is an error.
fn rerank_rows(
    rr: &dyn Rerank,
    query: &str,
    rows: &mut [(fusion::Candidate, ChunkRow)],
) -> Result<()> {
    let texts: Vec<String> = rows
        .iter()
        .map(|(_, r)| store::index_text(&r.title, &r.text))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let scores = rr.score(query, &refs)?;
    if scores.len() != rows.len() {
        return Err(Error::Model(crate::ModelError(format!(
            "reranker {} returned {} scores for {} passages",
            rr.name(),
            scores.len(),
            rows.len()
        ))));
    }
    for ((c, _), s) in rows.iter_mut().zip(scores) {
        c.stage.rerank = Some(s);
        c.score = s;
    }
    rows.sort_by(|a, b| {
        b.0.score
            .total_cmp(&a.0.score)
            .then(a.0.chunk.cmp(&b.0.chunk))
    });
    Ok(())
}

/// Which half of a committed write [`Retrieval::publish`] makes visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publish {
    /// The replaced versions die and the new chunks appear, in one snapshot.
    All,
    /// Only the replaced versions die (the new chunks stay unmapped, hence invisible).
    Removals,
    /// Only the new chunks appear (after [`Publish::Removals`]).
    Additions,
}

/// A document validated, chunked and embedded by [`Retrieval::stage`], not yet stored.
pub struct Staged {
    doc: Option<NewDocument>,
    unchanged: Option<UpsertOutcome>,
}

/// The engine's side of a write committed in another component's transaction (see
/// [`Retrieval::upsert_joined`]).
pub struct JointWrite<'a> {
    engine: &'a Retrieval,
    store: &'a Store,
    doc: Option<NewDocument>,
    committed: Option<Committed>,
    hidden: bool,
    /// Originals to look at after the write (see [`Retrieval::put_originals`]).
    check: Vec<String>,
}

impl JointWrite<'_> {
    /// Writes the staged document's rows in `tx` (a transaction on the engine's database file,
    /// committed by the caller). Nothing to write when the document is unchanged.
    pub fn write(&mut self, tx: &rusqlite::Transaction<'_>) -> Result<()> {
        if let Some(doc) = self.doc.take() {
            let docs = vec![doc];
            let ids = [docs[0].doc_id.as_str()];
            self.check
                .extend(Store::originals_named(tx, &ids).map_err(|e| self.store.err(e))?);
            if let Some(o) = &docs[0].original {
                self.check.push(o.sha256.clone());
                self.engine.originals.put(o)?;
            }
            self.committed = Some(Store::upsert_in(tx, &self.store.path, docs)?);
        }
        Ok(())
    }

    /// Called once the transaction is committed: the replaced version's chunks die now, while
    /// the new chunks stay invisible until [`Retrieval::upsert_joined`] returns.
    /// Cannot fail: it does no I/O (the live document count is corrected when the new chunks
    /// appear).
    pub fn hide_replaced(&mut self) {
        if let Some(c) = &self.committed {
            let live_docs = self.engine.snapshot.load().live_docs;
            self.engine.publish_counted(c, Publish::Removals, live_docs);
            self.hidden = true;
        }
    }
}

struct Prepared {
    doc: DocumentInput,
    version: String,
    spans: Vec<chunker::ChunkSpan>,
    /// Per span: the table header to prepend, the anchor (extracted files only).
    extras: Vec<(Option<String>, Option<crate::ingest::Anchor>)>,
}

/// A chunk's stored text: its slice of the document, led by the table header row when it
/// continues a split table.
fn chunk_text(text: &str, s: &chunker::ChunkSpan, header: Option<&str>) -> String {
    let body = &text[s.byte_start..s.byte_end];
    match header {
        Some(h) => format!("{h}\n{body}"),
        None => body.to_owned(),
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// How many chunks `allow` may read in `snap`: the `N` of BM25 over the caller's visible set.
/// Mapped chunks are exactly the live ones, so this is |visible chunks| in O(allowed documents).
fn visible_chunk_count(allow: &AllowSet, snap: &Snapshot) -> u64 {
    (allow.bitmap() & snap.map.docs_with_chunks())
        .iter()
        .map(|d| snap.map.chunks_of(d).len() as u64)
        .sum()
}

/// Content hash of a document version: SHA-256 over title, text and metadata (hex, 128 bits).
fn content_version(doc: &DocumentInput) -> String {
    let mut h = Sha256::new();
    h.update((doc.title.len() as u64).to_le_bytes());
    h.update(doc.title.as_bytes());
    h.update((doc.text.len() as u64).to_le_bytes());
    h.update(doc.text.as_bytes());
    h.update(
        serde_json::Value::Object(doc.metadata.clone())
            .to_string()
            .as_bytes(),
    );
    // A document read from a file: its original is part of the version (documents given as
    // text hash as before).
    if let Some(o) = &doc.original {
        h.update(b"original\0");
        h.update(o.sha256.as_bytes());
        h.update(o.media_type.as_bytes());
    }
    // Extracted files: anchors are part of the version (text-only documents hash as before).
    for r in &doc.regions {
        h.update((r.byte_start as u64).to_le_bytes());
        h.update(
            serde_json::to_string(&r.anchor)
                .unwrap_or_default()
                .as_bytes(),
        );
    }
    hex::encode(&h.finalize()[..16])
}

/// Removes every original no live document names, and leftover temporary files; returns how
/// many files went. Called under the write locks (on open and by purge).
fn sweep_originals(store: &Store, originals: &Originals) -> Result<usize> {
    let (digests, leftovers) = originals.list()?;
    let mut removed = 0;
    for p in leftovers {
        std::fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
        removed += 1;
    }
    for d in digests {
        if !Store::original_is_named(&store.conn, &d).map_err(|e| store.err(e))? {
            originals.remove(&d)?;
            removed += 1;
        }
    }
    Ok(removed)
}

fn load_snapshot(store: &Store) -> Result<Snapshot> {
    let next = store.meta("next_chunk_id")?;
    let next = u32::try_from(next).map_err(|_| Error::Corrupt(format!("next_chunk_id {next}")))?;
    let mut map = ChunkMap::new();
    let mut live = RoaringBitmap::new();
    for (id, ord) in store.live_chunks()? {
        map.insert(id, ord);
        live.insert(id);
    }
    // Every id below `next` without a live row is dead (ids are never reused).
    let mut dead = RoaringBitmap::new();
    dead.insert_range(0..next);
    dead -= &live;
    Ok(Snapshot {
        id: next_snapshot_id(),
        map,
        dead: Arc::new(dead),
        live_chunks: live.len(),
        live_docs: store.live_doc_count()?,
    })
}

fn open_generation(
    root: &Path,
    generation: u64,
    config: &RetrievalConfig,
    dim: usize,
    vector_opener: &VectorOpener,
) -> Result<Indexes> {
    let dir = root.join(generation.to_string());
    let bm25 = Bm25Index::open(&dir.join("bm25"), &config.bm25)?;
    let vector = vector_opener(&dir.join("vector"), dim)?;
    Ok(Indexes {
        generation,
        bm25,
        vector,
    })
}

/// Removes generation directories other than `keep` (left by an interrupted reindex).
fn remove_other_generations(root: &Path, keep: u64) -> Result<()> {
    for entry in std::fs::read_dir(root).map_err(|e| Error::io(root, e))? {
        let entry = entry.map_err(|e| Error::io(root, e))?;
        let name = entry.file_name();
        let Some(g) = name.to_str().and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        if g != keep {
            let p = entry.path();
            tracing::info!(generation = g, "retrieval: removing stale index generation");
            std::fs::remove_dir_all(&p).map_err(|e| Error::io(&p, e))?;
        }
    }
    Ok(())
}

fn repair_indexes(store: &Store, idx: &Indexes, snap: &Snapshot) -> Result<RepairReport> {
    let mut live = RoaringBitmap::new();
    live.insert_range(0..snap.map.chunk_id_bound());
    live -= &*snap.dead;
    let mut report = RepairReport::default();
    let in_bm25 = idx.bm25.chunk_ids()?;
    let missing = &live - &in_bm25;
    let extra = &in_bm25 - &live;
    let mut missing_vec = RoaringBitmap::new();
    if let Some(v) = &idx.vector {
        missing_vec = &live - &v.ids()?;
    }
    if missing.is_empty() && extra.is_empty() && missing_vec.is_empty() {
        return Ok(report);
    }
    let todo = &missing | &missing_vec;
    let mut bm25_add = Vec::new();
    let mut vec_add = Vec::new();
    store.for_each_chunk(Some(&todo), |id, text, emb| {
        if missing.contains(id) {
            bm25_add.push((id, text));
        }
        if missing_vec.contains(id) {
            vec_add.push((id, emb));
        }
        Ok(())
    })?;
    let extra: Vec<u32> = extra.iter().collect();
    idx.bm25.write(&bm25_add, &extra)?;
    if let Some(v) = &idx.vector {
        let items: Vec<(u32, &[f32])> = vec_add.iter().map(|(id, e)| (*id, e.as_slice())).collect();
        v.insert(&items)?;
        v.flush()?;
    }
    report.bm25_added = bm25_add.len() as u64;
    report.bm25_removed = extra.len() as u64;
    report.vector_added = vec_add.len() as u64;
    Ok(report)
}
