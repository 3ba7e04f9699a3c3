//! Why the answer core could not answer. The route maps each variant to the HTTP error table
//! in one `match` (`routes::chat::refusal`); nothing here knows statuses or problem types.

use std::time::Duration;

use airlock_inference::generate::SubmitError;

/// Every way an answer can fail or be refused.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The server-kept thread named by the request does not exist for this caller (or no
    /// store keeps threads).
    #[error("unknown conversation")]
    UnknownThread,
    /// The request names a model the bundle does not hold.
    #[error("no model `{0}`")]
    UnknownModel(String),
    /// The request names a model that does not chat (an embedder, a reranker).
    #[error("model `{0}` is not a chat model")]
    NotAChatModel(String),
    /// No generator is loaded to answer with.
    #[error("no generator is loaded")]
    NoGenerator,
    /// The generator's chat template or tokenizer failed on the prompt.
    #[error("{0}")]
    Prompt(String),
    /// The engine refused the sequence (queue full, over its budget, context, stopping).
    #[error("{0}")]
    Submit(SubmitError),
    /// The caller's token quota cannot cover the prompt plus the completion.
    #[error("token quota exhausted")]
    OverQuota {
        /// When to retry.
        retry_after: Duration,
    },
    /// The rack is saturated or unhealthy and no local model may take the request: shed at
    /// `rung`.
    #[error("the rack cannot take the request")]
    RackShed {
        /// When to retry.
        retry_after: Duration,
        /// The rung the request was admitted at.
        rung: u8,
    },
    /// Rung 4: nothing was generated before the queue deadline.
    #[error("no output before the queue deadline")]
    QueueDeadline {
        /// The rung the request was admitted at.
        rung: u8,
    },
    /// The generation was cancelled by the engine (shutting down).
    #[error("the generation was cancelled")]
    Cancelled,
    /// A remote generator refused, failed or broke off.
    #[error("{0}")]
    Upstream(String),
    /// The answer's receipt could not be written: no answer without its receipt.
    #[error("{0}")]
    ReceiptUnrecorded(String),
    /// Retrieval, the re-check or the audit failed.
    #[error(transparent)]
    Rag(#[from] airlock_rag::Error),
    /// The document store failed.
    #[error(transparent)]
    Retrieval(#[from] airlock_retrieval::Error),
    /// The store of completions and threads failed.
    #[error(transparent)]
    Feedback(#[from] airlock_evidence::feedback::FeedbackError),
    /// Anything else that is the appliance's fault.
    #[error("{0}")]
    Internal(String),
}

impl AnswerError {
    /// Shorthand for an internal fault with its cause.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        AnswerError::Internal(cause.to_string())
    }
}

/// Runs blocking work (SQLite, models) off the async runtime.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AnswerError> + Send + 'static,
) -> Result<T, AnswerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AnswerError::internal(format!("blocking task failed: {e}")))?
}

impl From<crate::generator::PromptError> for AnswerError {
    fn from(e: crate::generator::PromptError) -> Self {
        AnswerError::Prompt(e.0)
    }
}
