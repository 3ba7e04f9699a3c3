//! `airlock-retrieval`: documents, chunks and the indexes that find them.
//!
//! Owns the document store (SQLite), the chunker and ingest pipeline, the int8 vector index
//! (HNSW + exact scan + f32 rescoring), BM25 (tantivy), hybrid fusion, the optional rerank stage,
//! tombstones and reconciliation. Every search takes an [`airlock_acl::AllowSet`].
//!
//! It does not know `airlock-inference`: models come in through the [`Embed`] and [`Rerank`]
//! traits, which the daemon fills.
//!
//! Entry point: [`Retrieval`] — `open(db, index_dir, config, embedder, reranker)`, then
//! [`Retrieval::upsert`] / [`Retrieval::ingest_path`], [`Retrieval::search`],
//! [`Retrieval::delete`], [`Retrieval::reconcile`], [`Retrieval::reindex`].
#![warn(missing_docs)]

#[doc(hidden)]
pub mod bench_api;
mod bm25;
pub mod chunker;
mod config;
mod console;
mod cow_vec;
mod dense;
mod engine;
mod error;
mod fusion;
#[doc(hidden)]
pub mod fuzzing;
pub mod ingest;
pub mod originals;
pub mod sidecar;
mod store;
mod traits;
pub mod vector;
mod vector_adapter;
pub mod visibility;
mod write_lock;

pub use config::{Bm25Config, ChunkConfig, RetrievalConfig, SearchConfig, StopWords};
pub use console::{DocumentList, DocumentStatus, DocumentSummary};
pub use engine::{
    COMPACT_MAX_DEAD, DeleteOutcome, IngestReport, JointWrite, OriginalFile, Progress, PurgeReport,
    PurgedDocument, ReconcileReport, ReindexReport, RepairReport, Retrieval, SearchMode,
    SearchRequest, SearchResponse, SearchResult, StageScores, Staged, Stats, Timings, VectorPath,
    originals_dir,
};
pub use error::{Error, Result};
pub use ingest::{DocumentInput, SourceFormat};
pub use originals::{Original, sha256_hex};
pub use store::{
    DocumentInfo, SCHEMA_VERSION, UpsertOutcome, UpsertStatus, stored_index_generation,
};
pub use traits::{Embed, ModelError, Rerank};
pub use visibility::{ChunkMap, Visibility};
pub use write_lock::{IndexWriteLock, WRITE_LOCK_FILE};
