//! The turn a chat adds to a server-kept thread (`airlock.conversation_id`).

use std::sync::Arc;

/// Adds the answer to a server-kept thread once it is complete.
pub(super) struct TurnRecorder {
    pub(super) store: Arc<airlock_evidence::feedback::FeedbackStore>,
    pub(super) thread: String,
    pub(super) user: String,
    pub(super) question: String,
    pub(super) request_id: String,
    /// `(doc_id, version)` of each citation, in citation order.
    pub(super) sources: Vec<(String, String)>,
    /// The thread's turns it is answered from (`conversations::parents_of` the history fed).
    pub(super) parents: Vec<i64>,
}

impl TurnRecorder {
    /// Stores the turn (on the blocking pool; a failure is logged, the answer stands).
    pub(super) fn save(self, answer: String, cited: &[usize]) {
        let sources: Vec<airlock_evidence::conversations::TurnSource> = self
            .sources
            .iter()
            .enumerate()
            .map(
                |(i, (doc_id, version))| airlock_evidence::conversations::TurnSource {
                    doc_id: doc_id.clone(),
                    version: version.clone(),
                    cited: cited.contains(&(i + 1)),
                },
            )
            .collect();
        tokio::task::spawn_blocking(move || {
            let turn = airlock_evidence::conversations::NewTurn {
                question: &self.question,
                answer: &answer,
                request_id: &self.request_id,
                sources: &sources,
                parents: &self.parents,
            };
            match self.store.append_turn(&self.user, &self.thread, &turn) {
                Ok(airlock_evidence::conversations::Appended::Added(_)) => {}
                Ok(other) => tracing::warn!(outcome = ?other, "conversation turn not kept"),
                Err(e) => tracing::error!(error = %e, "conversation turn not kept"),
            }
        });
    }
}
