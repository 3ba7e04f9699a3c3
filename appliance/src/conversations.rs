//! Conversations kept by the server, per user (`/v1/conversations`): a user's threads with their
//! turns (question, answer, and the documents shown as sources, with their versions), in the
//! appliance's SQLite file next to the feedback tables (migration 2).
//!
//! Unlike the feedback tables these hold text: questions and answers, which quote documents.
//! They are read back only by their owner, and access changes apply to history: a turn whose
//! sources the owner can no longer read (revoked, deleted, purged) is returned redacted, with
//! no text of it; a redacted turn is never fed back into a prompt either. Removing a user
//! removes their threads; purging a document removes every turn that showed it; threads not
//! updated within the retention (`conversation_retention_days`) are removed.
//!
//! Every lookup is scoped to the caller: another user's thread and a thread that never existed
//! take the same statements and give the same answer. Every method does blocking SQLite I/O.

use rusqlite::{OptionalExtension, TransactionBehavior, params};
use serde::Serialize;

use crate::feedback::{FeedbackError, FeedbackStore};

/// Longest thread title, in bytes (the first question, cut on a word).
pub const MAX_TITLE_BYTES: usize = 120;
/// Most turns one thread keeps; an older turn is not removed, a new one is refused.
pub const MAX_TURNS: usize = 200;
/// Most threads one user keeps; creating another is refused.
pub const MAX_THREADS_PER_USER: usize = 1000;

fn db(context: &'static str) -> impl FnOnce(rusqlite::Error) -> FeedbackError {
    move |source| FeedbackError::Database { context, source }
}

/// A thread as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Thread {
    /// Thread id (`conv-…`).
    pub id: String,
    /// Its title.
    pub title: String,
    /// Created (RFC 3339).
    pub created_at: String,
    /// Last turn added (RFC 3339).
    pub updated_at: String,
    /// Turns in it.
    pub turns: usize,
}

/// A source a turn showed: a document and the version shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TurnSource {
    /// Document id.
    pub doc_id: String,
    /// Its version (content hash) when the turn was answered.
    pub version: String,
    /// Whether the answer cited it.
    pub cited: bool,
}

/// A stored turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTurn {
    /// 1-based position in the thread.
    pub seq: i64,
    /// The question.
    pub question: String,
    /// The answer.
    pub answer: String,
    /// The completion id that answered it.
    pub request_id: String,
    /// When (µs since the epoch).
    pub created_us: i64,
    /// The sources shown.
    pub sources: Vec<TurnSource>,
}

/// What [`FeedbackStore::append_turn`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Added as turn `seq`.
    Added(i64),
    /// No such thread of this user.
    UnknownThread,
    /// The thread holds [`MAX_TURNS`] turns.
    Full,
}

/// A title from a first question: whitespace collapsed, cut on a word at [`MAX_TITLE_BYTES`].
pub fn title_of(question: &str) -> String {
    let one_line = question.split_whitespace().collect::<Vec<_>>().join(" ");
    airlock_rag::prompt::snippet(&one_line, MAX_TITLE_BYTES)
}

impl FeedbackStore {
    /// Creates a thread for `user_id`; `None` when the user holds [`MAX_THREADS_PER_USER`].
    pub fn create_thread(
        &self,
        user_id: &str,
        title: &str,
    ) -> Result<Option<Thread>, FeedbackError> {
        let mut conn = self.conn.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("starting a conversation transaction"))?;
        let held: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM conversations WHERE user_id = ?1",
                params![user_id],
                |r| r.get(0),
            )
            .map_err(db("counting conversations"))?;
        if held as usize >= MAX_THREADS_PER_USER {
            return Ok(None);
        }
        let id = format!("conv-{}", uuid::Uuid::new_v4().simple());
        let now = crate::feedback::now_us();
        let title = title_of(title);
        tx.execute(
            "INSERT INTO conversations (id, user_id, title, created_us, updated_us)
             VALUES (?1, ?2, ?3, ?4, ?4)",
            params![id, user_id, title, now],
        )
        .map_err(db("creating a conversation"))?;
        tx.commit().map_err(db("committing a conversation"))?;
        let at = crate::feedback::rfc3339_us(now);
        Ok(Some(Thread {
            id,
            title,
            created_at: at.clone(),
            updated_at: at,
            turns: 0,
        }))
    }

    /// `user_id`'s threads, most recently updated first.
    pub fn threads(&self, user_id: &str) -> Result<Vec<Thread>, FeedbackError> {
        let conn = self.conn.lock();
        let mut st = conn
            .prepare_cached(
                "SELECT c.id, c.title, c.created_us, c.updated_us,
                        (SELECT COUNT(*) FROM conversation_turns t WHERE t.conversation_id = c.id)
                   FROM conversations c WHERE c.user_id = ?1
                  ORDER BY c.updated_us DESC, c.id",
            )
            .map_err(db("listing conversations"))?;
        let rows = st
            .query_map(params![user_id], |r| {
                Ok(Thread {
                    id: r.get(0)?,
                    title: r.get(1)?,
                    created_at: crate::feedback::rfc3339_us(r.get(2)?),
                    updated_at: crate::feedback::rfc3339_us(r.get(3)?),
                    turns: r.get::<_, i64>(4)? as usize,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(db("listing conversations"))?;
        Ok(rows)
    }

    /// One of `user_id`'s threads with its turns, oldest first; `None` if it is not theirs.
    pub fn thread(
        &self,
        user_id: &str,
        id: &str,
    ) -> Result<Option<(Thread, Vec<StoredTurn>)>, FeedbackError> {
        let conn = self.conn.lock();
        let head = conn
            .prepare_cached(
                "SELECT title, created_us, updated_us FROM conversations
                  WHERE id = ?1 AND user_id = ?2",
            )
            .and_then(|mut st| {
                st.query_row(params![id, user_id], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })
                .optional()
            })
            .map_err(db("reading a conversation"))?;
        let Some((title, created, updated)) = head else {
            return Ok(None);
        };
        let mut turns: Vec<StoredTurn> = conn
            .prepare_cached(
                "SELECT seq, question, answer, request_id, created_us FROM conversation_turns
                  WHERE conversation_id = ?1 ORDER BY seq",
            )
            .and_then(|mut st| {
                st.query_map(params![id], |r| {
                    Ok(StoredTurn {
                        seq: r.get(0)?,
                        question: r.get(1)?,
                        answer: r.get(2)?,
                        request_id: r.get(3)?,
                        created_us: r.get(4)?,
                        sources: Vec::new(),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()
            })
            .map_err(db("reading conversation turns"))?;
        let sources: Vec<(i64, TurnSource)> = conn
            .prepare_cached(
                "SELECT seq, doc_id, version, cited FROM conversation_sources
                  WHERE conversation_id = ?1 ORDER BY seq, n",
            )
            .and_then(|mut st| {
                st.query_map(params![id], |r| {
                    Ok((
                        r.get(0)?,
                        TurnSource {
                            doc_id: r.get(1)?,
                            version: r.get(2)?,
                            cited: r.get::<_, i64>(3)? != 0,
                        },
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()
            })
            .map_err(db("reading conversation sources"))?;
        for (seq, s) in sources {
            if let Some(t) = turns.iter_mut().find(|t| t.seq == seq) {
                t.sources.push(s);
            }
        }
        let thread = Thread {
            id: id.to_string(),
            title,
            created_at: crate::feedback::rfc3339_us(created),
            updated_at: crate::feedback::rfc3339_us(updated),
            turns: turns.len(),
        };
        Ok(Some((thread, turns)))
    }

    /// Adds a turn to one of `user_id`'s threads.
    pub fn append_turn(
        &self,
        user_id: &str,
        id: &str,
        question: &str,
        answer: &str,
        request_id: &str,
        sources: &[TurnSource],
    ) -> Result<Appended, FeedbackError> {
        let mut conn = self.conn.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("starting a conversation transaction"))?;
        let owned: bool = tx
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM conversations WHERE id = ?1 AND user_id = ?2)",
                params![id, user_id],
                |r| r.get(0),
            )
            .map_err(db("looking up a conversation"))?;
        if !owned {
            return Ok(Appended::UnknownThread);
        }
        let last: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM conversation_turns WHERE conversation_id = ?1",
                params![id],
                |r| r.get(0),
            )
            .map_err(db("reading a conversation"))?;
        if last as usize >= MAX_TURNS {
            return Ok(Appended::Full);
        }
        let seq = last + 1;
        let now = crate::feedback::now_us();
        tx.execute(
            "INSERT INTO conversation_turns
                 (conversation_id, seq, question, answer, request_id, created_us)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![id, seq, question, answer, request_id, now],
        )
        .map_err(db("adding a conversation turn"))?;
        for (n, s) in sources.iter().enumerate() {
            tx.execute(
                "INSERT INTO conversation_sources
                     (conversation_id, seq, doc_id, version, cited, n)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT DO UPDATE SET cited = MAX(cited, excluded.cited)",
                params![id, seq, s.doc_id, s.version, i64::from(s.cited), n as i64],
            )
            .map_err(db("adding a conversation source"))?;
        }
        tx.execute(
            "UPDATE conversations SET updated_us = ?2 WHERE id = ?1",
            params![id, now],
        )
        .map_err(db("touching a conversation"))?;
        tx.commit().map_err(db("committing a conversation turn"))?;
        Ok(Appended::Added(seq))
    }

    /// Deletes one of `user_id`'s threads; `false` if it is not theirs.
    pub fn delete_thread(&self, user_id: &str, id: &str) -> Result<bool, FeedbackError> {
        let conn = self.conn.lock();
        let n = conn
            .execute(
                "DELETE FROM conversations WHERE id = ?1 AND user_id = ?2",
                params![id, user_id],
            )
            .map_err(db("deleting a conversation"))?;
        Ok(n > 0)
    }

    /// Removes every thread of `user_id` (the user was removed); returns how many.
    pub fn remove_user_threads(&self, user_id: &str) -> Result<usize, FeedbackError> {
        let conn = self.conn.lock();
        conn.execute(
            "DELETE FROM conversations WHERE user_id = ?1",
            params![user_id],
        )
        .map_err(db("removing a user's conversations"))
    }

    /// Removes every turn that showed one of `doc_ids` (the documents were purged); returns
    /// how many turns went.
    pub fn remove_turns_showing(&self, doc_ids: &[String]) -> Result<usize, FeedbackError> {
        let mut conn = self.conn.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("starting a conversation transaction"))?;
        let mut removed = 0;
        for d in doc_ids {
            removed += tx
                .execute(
                    "DELETE FROM conversation_turns WHERE (conversation_id, seq) IN
                       (SELECT conversation_id, seq FROM conversation_sources WHERE doc_id = ?1)",
                    params![d],
                )
                .map_err(db("removing conversation turns"))?;
        }
        tx.commit()
            .map_err(db("committing conversation removals"))?;
        Ok(removed)
    }

    /// Removes threads not updated since `before_us` (retention); returns how many.
    pub fn expire_threads(&self, before_us: i64) -> Result<usize, FeedbackError> {
        let conn = self.conn.lock();
        conn.execute(
            "DELETE FROM conversations WHERE updated_us < ?1",
            params![before_us],
        )
        .map_err(db("expiring conversations"))
    }

    /// Removes the threads of every user `exists` no longer knows (removed by an IAM sync or
    /// by an operator); returns how many threads went.
    pub fn prune_users(&self, exists: impl Fn(&str) -> bool) -> Result<usize, FeedbackError> {
        let users: Vec<String> = {
            let conn = self.conn.lock();
            let mut st = conn
                .prepare_cached("SELECT DISTINCT user_id FROM conversations")
                .map_err(db("listing conversation owners"))?;
            st.query_map([], |r| r.get(0))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(db("listing conversation owners"))?
        };
        let mut removed = 0;
        for u in users.iter().filter(|u| !exists(u)) {
            removed += self.remove_user_threads(u)?;
        }
        Ok(removed)
    }

    /// Threads in all; for tests and the operator's counts.
    pub fn thread_count(&self) -> Result<usize, FeedbackError> {
        let conn = self.conn.lock();
        conn.query_row("SELECT COUNT(*) FROM conversations", [], |r| {
            r.get::<_, i64>(0)
        })
        .map(|n| n as usize)
        .map_err(db("counting conversations"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, FeedbackStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = FeedbackStore::open(&dir.path().join("airlock.db")).unwrap();
        (dir, s)
    }

    fn src(doc: &str) -> TurnSource {
        TurnSource {
            doc_id: doc.into(),
            version: "v1".into(),
            cited: true,
        }
    }

    #[test]
    fn threads_are_scoped_to_their_owner() {
        let (_d, s) = store();
        let t = s
            .create_thread("alice", "What is   the limit?\nThanks")
            .unwrap()
            .unwrap();
        assert_eq!(t.title, "What is the limit? Thanks");
        assert_eq!(
            s.append_turn("alice", &t.id, "q", "a", "r1", &[src("d1"), src("d2")])
                .unwrap(),
            Appended::Added(1)
        );
        // Bob sees nothing of it, and cannot add to or delete it.
        assert!(s.thread("bob", &t.id).unwrap().is_none());
        assert!(s.threads("bob").unwrap().is_empty());
        assert_eq!(
            s.append_turn("bob", &t.id, "q", "a", "r2", &[]).unwrap(),
            Appended::UnknownThread
        );
        assert!(!s.delete_thread("bob", &t.id).unwrap());
        let (head, turns) = s.thread("alice", &t.id).unwrap().unwrap();
        assert_eq!(head.turns, 1);
        assert_eq!(turns[0].sources.len(), 2);
        assert_eq!(s.threads("alice").unwrap()[0].turns, 1);
        assert!(s.delete_thread("alice", &t.id).unwrap());
        assert!(s.thread("alice", &t.id).unwrap().is_none());
    }

    #[test]
    fn purges_users_and_retention_remove_what_depends_on_them() {
        let (_d, s) = store();
        let a = s.create_thread("alice", "one").unwrap().unwrap();
        s.append_turn("alice", &a.id, "q1", "a1", "r1", &[src("keep")])
            .unwrap();
        s.append_turn(
            "alice",
            &a.id,
            "q2",
            "a2",
            "r2",
            &[src("gone"), src("keep")],
        )
        .unwrap();
        assert_eq!(s.remove_turns_showing(&["gone".into()]).unwrap(), 1);
        let (_, turns) = s.thread("alice", &a.id).unwrap().unwrap();
        assert_eq!(turns.len(), 1);
        assert_eq!(turns[0].question, "q1");
        let b = s.create_thread("bob", "two").unwrap().unwrap();
        assert_eq!(s.remove_user_threads("alice").unwrap(), 1);
        assert!(s.thread("bob", &b.id).unwrap().is_some());
        assert_eq!(s.expire_threads(i64::MAX).unwrap(), 1);
        assert_eq!(s.thread_count().unwrap(), 0);
    }

    #[test]
    fn a_full_thread_refuses_a_turn() {
        let (_d, s) = store();
        let t = s.create_thread("alice", "t").unwrap().unwrap();
        for i in 0..MAX_TURNS {
            assert_eq!(
                s.append_turn("alice", &t.id, "q", "a", &format!("r{i}"), &[])
                    .unwrap(),
                Appended::Added(i as i64 + 1)
            );
        }
        assert_eq!(
            s.append_turn("alice", &t.id, "q", "a", "r", &[]).unwrap(),
            Appended::Full
        );
    }
}
