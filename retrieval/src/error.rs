//! The crate's single error type.

use std::path::PathBuf;

/// Everything that can go wrong in `airlock-retrieval`.
///
/// Variants up to [`Error::InvalidRequest`] are caller mistakes (bad document, bad request); the
/// rest are internal faults (storage, index, model). [`Error::is_user_error`] tells them apart.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A document's bytes are not valid UTF-8.
    #[error("document {doc_id}: not valid UTF-8 (first invalid byte at offset {offset})")]
    InvalidUtf8 {
        /// External document id (or file path / JSONL line when no id is known yet).
        doc_id: String,
        /// Byte offset of the first invalid sequence.
        offset: usize,
    },
    /// A document has no text after extraction.
    #[error("document {doc_id}: empty (no text after extraction)")]
    EmptyDocument {
        /// External document id.
        doc_id: String,
    },
    /// A document exceeds the configured size limit.
    #[error("document {doc_id}: {bytes} bytes exceeds the limit of {limit} bytes")]
    DocumentTooLarge {
        /// External document id.
        doc_id: String,
        /// Size of the document.
        bytes: usize,
        /// Configured limit ([`crate::RetrievalConfig::max_document_bytes`]).
        limit: usize,
    },
    /// A document id is empty, too long or contains control characters.
    #[error("invalid document id {doc_id:?}: {reason}")]
    InvalidDocumentId {
        /// The offending id.
        doc_id: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A JSONL line could not be read as a document.
    #[error("{source_name} line {line}: {reason}")]
    InvalidJsonl {
        /// File name or stream label.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        reason: String,
    },
    /// A file has an extension the ingest does not handle.
    #[error(
        "{path}: unsupported file type (expected .txt, .md, .html, .htm, .jsonl, .pdf, .docx, .xlsx, .xlsm, .pptx, .eml, .csv)"
    )]
    UnsupportedFormat {
        /// The file.
        path: PathBuf,
    },
    /// A PDF, Office, e-mail or CSV file was refused by the extractor (no text layer,
    /// encrypted, a limit exceeded, malformed, ...).
    #[error("{doc_id}: not extracted: {reason}")]
    Extraction {
        /// The document (file) refused.
        doc_id: String,
        /// The extractor's reason, for a person.
        reason: String,
        /// Its stable code (`no_text_layer`, `encrypted`, `limit_exceeded`, ...).
        code: &'static str,
    },
    /// A search or configuration value is out of range.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The requested search mode needs a vector index, and none is configured.
    #[error("search mode {0} needs the vector index, which is not available")]
    VectorUnavailable(&'static str),
    /// SQLite failed.
    #[error("document store {path}: {source}")]
    Store {
        /// Database file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: rusqlite::Error,
    },
    /// The store was written by a newer version of this crate.
    #[error("document store {path}: schema version {found} is newer than supported {supported}")]
    SchemaTooNew {
        /// Database file.
        path: PathBuf,
        /// Version found on disk.
        found: i64,
        /// Newest version this build knows.
        supported: i64,
    },
    /// Tantivy failed.
    #[error("BM25 index {path}: {source}")]
    Bm25 {
        /// Index directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: tantivy::TantivyError,
    },
    /// The vector index failed.
    #[error("vector index: {0}")]
    Vector(#[from] crate::vector::VectorError),
    /// The embedder or reranker failed.
    #[error("model: {0}")]
    Model(#[from] crate::ModelError),
    /// A file or directory operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Stored data contradicts itself (a bug or on-disk corruption).
    #[error("inconsistent state: {0}")]
    Corrupt(String),
}

impl Error {
    /// Whether the caller caused this error (bad input), as opposed to an internal fault.
    pub fn is_user_error(&self) -> bool {
        match self {
            Error::InvalidUtf8 { .. }
            | Error::EmptyDocument { .. }
            | Error::DocumentTooLarge { .. }
            | Error::InvalidDocumentId { .. }
            | Error::InvalidJsonl { .. }
            | Error::UnsupportedFormat { .. }
            | Error::Extraction { .. }
            | Error::InvalidRequest(_) => true,
            Error::VectorUnavailable(_)
            | Error::Store { .. }
            | Error::SchemaTooNew { .. }
            | Error::Bm25 { .. }
            | Error::Vector(_)
            | Error::Model(_)
            | Error::Io { .. }
            | Error::Corrupt(_) => false,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
