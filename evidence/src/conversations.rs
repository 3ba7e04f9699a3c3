//! Conversations kept by the server, per user (`/v1/conversations`): a user's threads with their
//! turns (question, answer, the documents shown as sources with the versions shown, and the
//! earlier turns of the thread that were fed to the model as history), in the appliance's
//! SQLite file next to the feedback tables (migrations 2 and 3).
//!
//! Unlike the feedback tables these hold text: questions and answers, which quote documents.
//! They are read back only by their owner, and access changes apply to history. A turn's
//! *provenance* is its own sources (document and version) and, through its parents (the earlier
//! turns fed to the model when it was answered), theirs: a turn that repeats an earlier answer
//! carries that answer's sources. A turn is shown, and fed back into a prompt, only while its
//! owner can read every document of its provenance at the version the turn saw ([`withheld`]);
//! otherwise it is redacted, with no text of it. Keying on the version, not the id, means a
//! document deleted and re-created under the same id (or replaced by a new text) does not bring
//! old turns back. Removing a user removes their threads; purging a document removes every
//! turn whose provenance names it (its text zeroed in the file and the WAL checkpointed away);
//! threads not updated within the retention (`conversation_retention_days`) are removed.
//!
//! The user's own words are not traced: a question is stored and redacted with its turn, and a
//! question asked after an answer has that answer's turn as a parent, but what a user types from
//! elsewhere (another thread, memory) is theirs.
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
    /// The earlier turns (their `seq`) it was answered from: those fed to the model as history
    /// when it was answered, less those one of them descends from ([`parents_of`]).
    pub parents: Vec<i64>,
}

/// The parents to record for a new turn that was fed the turns `fed` (their `seq`) of a thread
/// whose turns are `links` (`(seq, parents)`, ascending): `fed` less every turn that another
/// fed turn descends from, whose provenance is already in that one's. Same provenance, fewer
/// rows: when every earlier turn was fed, the last one alone.
pub fn parents_of(links: &[(i64, Vec<i64>)], fed: &[i64]) -> Vec<i64> {
    let mut implied = std::collections::HashSet::new();
    let parents = |seq: i64| {
        links
            .binary_search_by_key(&seq, |(s, _)| *s)
            .map_or(&[][..], |i| links[i].1.as_slice())
    };
    let mut stack: Vec<i64> = fed.iter().flat_map(|&f| parents(f)).copied().collect();
    while let Some(a) = stack.pop() {
        if implied.insert(a) {
            stack.extend_from_slice(parents(a));
        }
    }
    fed.iter()
        .copied()
        .filter(|f| !implied.contains(f))
        .collect()
}

/// Why a turn is withheld ([`withheld`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Withheld {
    /// A document of its provenance has a newer version than the one the turn saw (the owner
    /// can read the new one).
    Changed,
    /// A document of its provenance is no longer readable by the owner (grant revoked, deleted,
    /// purged, unknown), or a parent turn is gone.
    Unavailable,
}

/// A turn's source as it stands for the turn's owner now ([`withheld`]; the answer path's
/// `documents_now` gives it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceNow {
    /// The owner may read it now (live and granted).
    pub readable: bool,
    /// Its current version (content hash); `None` when it is not stored.
    pub version: Option<String>,
}

/// For each of `turns` (oldest first, as [`FeedbackStore::thread`] returns them), why it is
/// withheld from its owner now, or `None` when it may be shown and fed to the model. `now`
/// gives each document as it stands for the owner. A turn is withheld when a source is not
/// readable at the version it saw, or when a parent is withheld or missing: provenance is
/// transitive.
pub fn withheld(turns: &[StoredTurn], now: impl Fn(&str) -> SourceNow) -> Vec<Option<Withheld>> {
    let mut out: Vec<Option<Withheld>> = Vec::with_capacity(turns.len());
    for (i, t) in turns.iter().enumerate() {
        let mut why = None;
        for s in &t.sources {
            let d = now(&s.doc_id);
            let w = if !d.readable {
                Withheld::Unavailable
            } else if d.version.as_deref() != Some(s.version.as_str()) {
                Withheld::Changed
            } else {
                continue;
            };
            why = why.max(Some(w));
        }
        for p in &t.parents {
            let w = match turns[..i].binary_search_by_key(p, |e| e.seq) {
                Ok(j) => out[j],
                Err(_) => Some(Withheld::Unavailable),
            };
            why = why.max(w);
        }
        out.push(why);
    }
    out
}

/// A turn to add ([`FeedbackStore::append_turn`]).
#[derive(Debug, Clone, Copy)]
pub struct NewTurn<'a> {
    /// The question.
    pub question: &'a str,
    /// The answer.
    pub answer: &'a str,
    /// The completion id that answered it.
    pub request_id: &'a str,
    /// The sources shown, with the versions shown.
    pub sources: &'a [TurnSource],
    /// The earlier turns (their `seq`) it was answered from ([`parents_of`]).
    pub parents: &'a [i64],
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
    /// A parent turn is gone (purged while the answer was made): the turn is not kept.
    ParentGone,
}

/// A title from a first question: whitespace collapsed, cut on a word at [`MAX_TITLE_BYTES`].
pub fn title_of(question: &str) -> String {
    let one_line = question.split_whitespace().collect::<Vec<_>>().join(" ");
    airlock_text::snippet(&one_line, MAX_TITLE_BYTES)
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
                        parents: Vec::new(),
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
        let parents: Vec<(i64, i64)> = conn
            .prepare_cached(
                "SELECT seq, parent_seq FROM conversation_parents
                  WHERE conversation_id = ?1 ORDER BY seq, parent_seq",
            )
            .and_then(|mut st| {
                st.query_map(params![id], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(db("reading conversation parents"))?;
        for (seq, p) in parents {
            if let Ok(i) = turns.binary_search_by_key(&seq, |t| t.seq) {
                turns[i].parents.push(p);
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

    /// Adds a turn to one of `user_id`'s threads: its sources (document and version shown) and
    /// its parents, the earlier turns fed to the model as history (every one must still exist).
    /// Turn numbers are never reused, not even a purged turn's. Two sources of one document with different versions are stored with an empty version,
    /// which no document has: the turn is withheld from then on.
    pub fn append_turn(
        &self,
        user_id: &str,
        id: &str,
        turn: &NewTurn<'_>,
    ) -> Result<Appended, FeedbackError> {
        let NewTurn {
            question,
            answer,
            request_id,
            sources,
            parents,
        } = *turn;
        let mut conn = self.conn.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("starting a conversation transaction"))?;
        let last: Option<i64> = tx
            .query_row(
                "SELECT last_seq FROM conversations WHERE id = ?1 AND user_id = ?2",
                params![id, user_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(db("looking up a conversation"))?;
        let Some(last) = last else {
            return Ok(Appended::UnknownThread);
        };
        if last as usize >= MAX_TURNS {
            return Ok(Appended::Full);
        }
        for p in parents {
            let there: bool = tx
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM conversation_turns
                                     WHERE conversation_id = ?1 AND seq = ?2)",
                    params![id, p],
                    |r| r.get(0),
                )
                .map_err(db("looking up a parent turn"))?;
            if !there {
                return Ok(Appended::ParentGone);
            }
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
                 ON CONFLICT DO UPDATE SET cited = MAX(cited, excluded.cited),
                     version = CASE WHEN version = excluded.version THEN version ELSE '' END",
                params![id, seq, s.doc_id, s.version, i64::from(s.cited), n as i64],
            )
            .map_err(db("adding a conversation source"))?;
        }
        for p in parents {
            tx.execute(
                "INSERT INTO conversation_parents (conversation_id, seq, parent_seq)
                 VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                params![id, seq, p],
            )
            .map_err(db("adding a conversation parent"))?;
        }
        tx.execute(
            "UPDATE conversations SET updated_us = ?2, last_seq = ?3 WHERE id = ?1",
            params![id, now, seq],
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

    /// Removes every turn whose provenance names one of `doc_ids` (the documents were purged):
    /// the turns that showed one, and every later turn answered from one of those (their
    /// descendants through the parents). The freed space is zeroed (`secure_delete`) and the
    /// WAL checkpointed and truncated, so the text is in no file. Returns how many turns went.
    pub fn remove_turns_from(&self, doc_ids: &[String]) -> Result<usize, FeedbackError> {
        let mut conn = self.conn.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("starting a conversation transaction"))?;
        let mut removed = 0;
        for d in doc_ids {
            removed += tx
                .execute(
                    "WITH RECURSIVE gone(cid, seq) AS (
                         SELECT conversation_id, seq FROM conversation_sources WHERE doc_id = ?1
                         UNION
                         SELECT p.conversation_id, p.seq FROM conversation_parents p
                           JOIN gone g ON p.conversation_id = g.cid AND p.parent_seq = g.seq
                     )
                     DELETE FROM conversation_turns
                      WHERE (conversation_id, seq) IN (SELECT cid, seq FROM gone)",
                    params![d],
                )
                .map_err(db("removing conversation turns"))?;
        }
        tx.commit()
            .map_err(db("committing conversation removals"))?;
        if removed > 0 {
            // The removed text is zeroed in the pages written to the WAL; the checkpoint puts
            // them in the file and the truncation drops every older frame that still held it.
            let (busy, _, _): (i64, i64, i64) = conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .map_err(db("checkpointing after conversation removals"))?;
            if busy != 0 {
                tracing::warn!(
                    "the WAL could not be truncated after a purge (a reader held it): removed \
                     conversation text may stay in airlock.db-wal until the next checkpoint"
                );
            }
        }
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

    fn add(
        s: &FeedbackStore,
        user: &str,
        id: &str,
        q: &str,
        sources: &[TurnSource],
        parents: &[i64],
    ) -> Appended {
        s.append_turn(
            user,
            id,
            &NewTurn {
                question: q,
                answer: &format!("answer to {q}"),
                request_id: &format!("r-{q}"),
                sources,
                parents,
            },
        )
        .unwrap()
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
            add(&s, "alice", &t.id, "q", &[src("d1"), src("d2")], &[]),
            Appended::Added(1)
        );
        // Bob sees nothing of it, and cannot add to or delete it.
        assert!(s.thread("bob", &t.id).unwrap().is_none());
        assert!(s.threads("bob").unwrap().is_empty());
        assert_eq!(
            add(&s, "bob", &t.id, "q2", &[], &[]),
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
        add(&s, "alice", &a.id, "q1", &[src("keep")], &[]);
        add(&s, "alice", &a.id, "q2", &[src("gone"), src("keep")], &[1]);
        // Turn 3 has no source of its own but was answered from turn 2 ("repeat that"); turn
        // 4 only from turn 1.
        add(&s, "alice", &a.id, "q3", &[], &[1, 2]);
        add(&s, "alice", &a.id, "q4", &[], &[1]);
        assert_eq!(s.remove_turns_from(&["gone".into()]).unwrap(), 2);
        let (_, turns) = s.thread("alice", &a.id).unwrap().unwrap();
        let left: Vec<&str> = turns.iter().map(|t| t.question.as_str()).collect();
        assert_eq!(left, ["q1", "q4"]);
        assert_eq!(turns[1].parents, [1]);
        // A turn answered from a purged one is not kept; numbers are never reused.
        assert_eq!(
            add(&s, "alice", &a.id, "late", &[], &[1, 3]),
            Appended::ParentGone
        );
        assert_eq!(
            add(&s, "alice", &a.id, "q5", &[], &[1, 4]),
            Appended::Added(5)
        );
        let b = s.create_thread("bob", "two").unwrap().unwrap();
        assert_eq!(s.remove_user_threads("alice").unwrap(), 1);
        assert!(s.thread("bob", &b.id).unwrap().is_some());
        assert_eq!(s.expire_threads(i64::MAX).unwrap(), 1);
        assert_eq!(s.thread_count().unwrap(), 0);
    }

    #[test]
    fn provenance_is_transitive_and_keyed_on_the_version() {
        let (_d, s) = store();
        let t = s.create_thread("alice", "t").unwrap().unwrap();
        add(&s, "alice", &t.id, "q1", &[src("a")], &[]);
        add(&s, "alice", &t.id, "q2", &[src("b")], &[1]);
        add(&s, "alice", &t.id, "q3", &[], &[2]);
        add(&s, "alice", &t.id, "q4", &[src("b")], &[]);
        let (_, turns) = s.thread("alice", &t.id).unwrap().unwrap();
        let doc = |readable: bool, version: &str| SourceNow {
            readable,
            version: Some(version.into()),
        };
        let all = withheld(&turns, |_| doc(true, "v1"));
        assert_eq!(all, [None; 4]);
        // `a` revoked: turn 1, and through it 2 and 3; turn 4 never saw it.
        let w = withheld(&turns, |d| doc(d != "a", "v1"));
        let u = Some(Withheld::Unavailable);
        assert_eq!(w, [u, u, u, None]);
        // `b` re-created under its id with another text: every turn that saw the old one.
        let w = withheld(&turns, |d| doc(true, if d == "b" { "v2" } else { "v1" }));
        let c = Some(Withheld::Changed);
        assert_eq!(w, [None, c, c, c]);
        // Unavailable outweighs changed; an unknown document is unavailable.
        let w = withheld(&turns, |d| match d {
            "a" => SourceNow::default(),
            _ => doc(true, "v2"),
        });
        assert_eq!(w, [u, u, u, c]);
        // A parent that is not there (purged) withholds its children.
        let w = withheld(&turns[2..], |_| doc(true, "v1"));
        assert_eq!(w, [u, None]);
    }

    #[test]
    fn parents_leave_out_what_another_parent_descends_from() {
        let links = |l: &[(i64, &[i64])]| -> Vec<(i64, Vec<i64>)> {
            l.iter().map(|(s, p)| (*s, p.to_vec())).collect()
        };
        // Every earlier turn fed: the last one alone carries the rest.
        let chain = links(&[(1, &[]), (2, &[1]), (3, &[2])]);
        assert_eq!(parents_of(&chain, &[1, 2, 3]), [3]);
        // Turn 2 was answered while turn 1 was redacted: both stay.
        let apart = links(&[(1, &[]), (2, &[]), (3, &[2])]);
        assert_eq!(parents_of(&apart, &[1, 2, 3]), [1, 3]);
        // A redacted turn is not fed: not a parent, whatever descends from it.
        assert_eq!(parents_of(&chain, &[1]), [1]);
        assert_eq!(parents_of(&chain, &[]), Vec::<i64>::new());
    }

    #[test]
    fn one_document_seen_at_two_versions_matches_neither() {
        let (_d, s) = store();
        let t = s.create_thread("alice", "t").unwrap().unwrap();
        let v2 = TurnSource {
            version: "v2".into(),
            ..src("a")
        };
        add(&s, "alice", &t.id, "q", &[src("a"), v2], &[]);
        let (_, turns) = s.thread("alice", &t.id).unwrap().unwrap();
        assert_eq!(turns[0].sources.len(), 1);
        assert_eq!(turns[0].sources[0].version, "");
        for v in ["v1", "v2"] {
            let w = withheld(&turns, |_| SourceNow {
                readable: true,
                version: Some(v.into()),
            });
            assert_eq!(w, [Some(Withheld::Changed)]);
        }
    }

    #[test]
    fn turns_stored_before_parents_were_kept_get_every_earlier_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("airlock.db");
        {
            // A database at schema 2 with a thread of three turns.
            let mut c = rusqlite::Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE appliance_schema_migrations (
                     version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_us INTEGER NOT NULL
                 ) STRICT;",
            )
            .unwrap();
            let tx = c.transaction().unwrap();
            for m in &crate::feedback::MIGRATIONS[..2] {
                tx.execute_batch(m.sql).unwrap();
                tx.execute(
                    "INSERT INTO appliance_schema_migrations VALUES (?1, ?2, 0)",
                    params![m.version, m.name],
                )
                .unwrap();
            }
            tx.execute_batch(
                "INSERT INTO conversations VALUES ('c1', 'alice', 't', 0, 0);
                 INSERT INTO conversation_turns VALUES ('c1', 1, 'q1', 'a1', 'r1', 0);
                 INSERT INTO conversation_turns VALUES ('c1', 2, 'q2', 'a2', 'r2', 0);
                 INSERT INTO conversation_turns VALUES ('c1', 3, 'q3', 'a3', 'r3', 0);
                 INSERT INTO conversation_sources VALUES ('c1', 1, 'a', 'v1', 1, 0);",
            )
            .unwrap();
            tx.commit().unwrap();
        }
        let s = FeedbackStore::open(&path).unwrap();
        let (_, turns) = s.thread("alice", "c1").unwrap().unwrap();
        let parents: Vec<Vec<i64>> = turns.iter().map(|t| t.parents.clone()).collect();
        assert_eq!(parents, [vec![], vec![1], vec![2]]);
        // Their turn count carries over: the next turn is the fourth.
        assert_eq!(add(&s, "alice", "c1", "q4", &[], &[]), Appended::Added(4));
        // A purge of `a` takes the turns that could have repeated it.
        assert_eq!(s.remove_turns_from(&["a".into()]).unwrap(), 3);
    }

    #[test]
    fn a_full_thread_refuses_a_turn() {
        let (_d, s) = store();
        let t = s.create_thread("alice", "t").unwrap().unwrap();
        for i in 0..MAX_TURNS {
            assert_eq!(
                add(&s, "alice", &t.id, &format!("q{i}"), &[], &[]),
                Appended::Added(i as i64 + 1)
            );
        }
        assert_eq!(add(&s, "alice", &t.id, "q", &[], &[]), Appended::Full);
    }
}
