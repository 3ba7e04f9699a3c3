//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model or artifact file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A model file or its configuration is malformed or not the expected layout.
    #[error("invalid model file {path}: {reason}")]
    InvalidModel {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The bundle catalogue is malformed or does not carry a model that was asked for.
    #[error("catalogue: {0}")]
    Catalogue(String),
    /// The tokenizer failed on an input or could not be built.
    #[error("tokenizer ({model}): {reason}")]
    Tokenizer {
        /// Which model's tokenizer.
        model: String,
        /// The cause reported by the tokenizer.
        reason: String,
    },
    /// A chat template could not be compiled or rendered.
    #[error("chat template ({model}): {reason}")]
    Template {
        /// Which model's template.
        model: String,
        /// The cause.
        reason: String,
    },
    /// A tensor operation failed (an internal fault: shapes or weights do not fit the code).
    #[error("{model}: tensor operation failed: {source}")]
    Tensor {
        /// Which model.
        model: String,
        /// The candle error.
        #[source]
        source: candle_core::Error,
    },
    /// The model's worker thread is gone (it panicked or was shut down).
    #[error("{0}: worker thread stopped")]
    WorkerGone(String),
    /// A bounded work queue is full; retry later (maps to 503 / back-pressure).
    #[error("{0}: queue full")]
    QueueFull(String),
    /// The caller passed an input the model cannot take (user mistake, e.g. an empty batch entry
    /// where one is not allowed).
    #[error("invalid input: {0}")]
    InvalidInput(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::InvalidModel {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn tensor(model: &str) -> impl FnOnce(candle_core::Error) -> Self + '_ {
        move |source| Error::Tensor {
            model: model.to_string(),
            source,
        }
    }

    pub(crate) fn tokenizer(model: &str, reason: impl std::fmt::Display) -> Self {
        Error::Tokenizer {
            model: model.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
