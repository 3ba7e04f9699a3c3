//! A server-kept thread (`airlock.conversation_id`) on the answer path: which of its turns the
//! caller may still see (the history fed to the model, by the same rule as what the thread
//! shows), and the turn an answer adds to it.

use std::sync::Arc;

use airlock_evidence::conversations::{SourceNow, StoredTurn, Withheld};
use airlock_evidence::feedback::FeedbackStore;
use airlock_rag::Role;

use crate::services::Services;

use super::{AnswerError, blocking, log_target};

/// For each of `turns` (oldest first), why it is withheld from `user_id` now, or `None` when
/// it may be shown and fed to the model: a turn is readable only while every document of its
/// provenance is readable at the version it saw ([`airlock_evidence::conversations::withheld`]
/// over the answer path's `documents_now`).
pub fn withheld_now(
    services: &Services,
    user_id: &str,
    turns: &[StoredTurn],
) -> Result<Vec<Option<Withheld>>, airlock_rag::Error> {
    let mut docs: Vec<String> = turns
        .iter()
        .flat_map(|t| t.sources.iter().map(|s| s.doc_id.clone()))
        .collect();
    docs.sort_unstable();
    docs.dedup();
    let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
    let now = services.answer_path.documents_now(user_id, &refs)?;
    Ok(airlock_evidence::conversations::withheld(turns, |d| {
        refs.binary_search(&d)
            .ok()
            .map(|i| SourceNow {
                readable: now[i].readable,
                version: now[i].version.clone(),
            })
            .unwrap_or_default()
    }))
}

/// What a thread brings to a chat: its readable turns as the history, the turns the answer is
/// answered from (`conversations::parents_of` the turns fed), and the thread it is added to.
#[derive(Default)]
pub struct History {
    pub(crate) turns: Vec<(Role, String)>,
    pub(crate) parents: Vec<i64>,
    pub(crate) thread: Option<(Arc<FeedbackStore>, String)>,
}

/// The history of `user`'s thread `id` (none without one). A redacted turn never reaches the
/// prompt, and the answer's turn records the turns fed as its parents: its provenance
/// includes theirs. An id the caller does not own is [`AnswerError::UnknownThread`].
pub async fn history(
    services: &Arc<Services>,
    user: &str,
    id: Option<String>,
) -> Result<History, AnswerError> {
    let Some(id) = id else {
        return Ok(History::default());
    };
    let services = services.clone();
    let user = user.to_string();
    blocking(move || {
        let store = services
            .feedback
            .clone()
            .ok_or(AnswerError::UnknownThread)?;
        let Some((_, turns)) = store.thread(&user, &id)? else {
            return Err(AnswerError::UnknownThread);
        };
        let links: Vec<(i64, Vec<i64>)> =
            turns.iter().map(|t| (t.seq, t.parents.clone())).collect();
        let withheld = withheld_now(&services, &user, &turns)?;
        let mut history = Vec::new();
        let mut fed = Vec::new();
        for (t, why) in turns.into_iter().zip(withheld) {
            if why.is_none() {
                history.push((Role::User, t.question));
                history.push((Role::Assistant, t.answer));
                fed.push(t.seq);
            }
        }
        let parents = airlock_evidence::conversations::parents_of(&links, &fed);
        Ok(History {
            turns: history,
            parents,
            thread: Some((store, id)),
        })
    })
    .await
}

/// Adds the answer to a server-kept thread once it is complete.
pub struct TurnRecorder {
    pub(crate) store: Arc<FeedbackStore>,
    pub(crate) thread: String,
    pub(crate) user: String,
    pub(crate) question: String,
    pub(crate) request_id: String,
    /// `(doc_id, version)` of each citation, in citation order.
    pub(crate) sources: Vec<(String, String)>,
    /// The thread's turns it is answered from (`conversations::parents_of` the history fed).
    pub(crate) parents: Vec<i64>,
}

impl TurnRecorder {
    /// Stores the turn (on the blocking pool; a failure is logged, the answer stands).
    pub fn save(self, answer: String, cited: &[usize]) {
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
                Ok(other) => {
                    tracing::warn!(target: log_target::THREAD, outcome = ?other, "conversation turn not kept")
                }
                Err(e) => {
                    tracing::error!(target: log_target::THREAD, error = %e, "conversation turn not kept")
                }
            }
        });
    }
}
