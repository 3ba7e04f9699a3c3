//! `airlock-retrieval`: documents, chunks and the indexes that find them.
//!
//! Owns the document store (SQLite), the chunker and ingest pipeline, the int8 vector index
//! (HNSW + exact scan + f32 rescoring), BM25 (tantivy), hybrid fusion, the optional rerank stage,
//! tombstones and reconciliation. Every search takes an [`airlock_acl::AllowSet`].
//!
//! It does not know `airlock-inference`: models come in through the [`Embed`] and [`Rerank`]
//! traits, which the daemon fills.
#![warn(missing_docs)]

mod traits;
pub mod vector;
pub mod visibility;

pub use traits::{Embed, ModelError, Rerank};
pub use visibility::{ChunkMap, Visibility};
