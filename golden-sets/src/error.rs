//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong reading sets or reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A line of a set file is malformed (user mistake: names the file and line).
    #[error("{path}:{line}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A set is inconsistent as a whole (e.g. duplicate case id, qrels naming unknown queries).
    #[error("{path}: {message}")]
    Invalid {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}
