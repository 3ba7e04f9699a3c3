//! Answer feedback (`POST /v1/feedback`) and the record of served chat completions it refers
//! to, kept in the appliance's SQLite file (`airlock.db`, WAL) next to the ACL and document
//! tables, with its own versioned migrations.
//!
//! Tables: `appliance_schema_migrations`; `chat_completions` (one row per chat completion
//! served: request id, user, time, model alias, rung, bundle version) and `feedback` (one row
//! per user and request id: rating, the user's optional comment, first and last update time).
//! Neither ever holds the question or the answer text: only what the user typed into a
//! comment is stored. The same file holds the server-kept conversations
//! ([`crate::conversations`], migration 2), which do hold text.
//!
//! Both tables are keyed by `(user_id, request_id)`, so a lookup is always scoped to the
//! caller: an id served to someone else and an id never served take the same query path.
//! Every method does blocking SQLite I/O: call it from the blocking pool.

use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// Why the feedback store failed.
#[derive(Debug, thiserror::Error)]
pub enum FeedbackError {
    /// The database file could not be opened or configured.
    #[error("opening the feedback store {path}: {source}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// Cause.
        source: rusqlite::Error,
    },
    /// A statement failed.
    #[error("feedback store: {context}: {source}")]
    Database {
        /// What was being done.
        context: &'static str,
        /// Cause.
        source: rusqlite::Error,
    },
    /// The database was written by a newer build.
    #[error(
        "the feedback tables have schema version {found}; this build supports up to {supported}"
    )]
    SchemaTooNew {
        /// The version found.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
}

fn db(context: &'static str) -> impl FnOnce(rusqlite::Error) -> FeedbackError {
    move |source| FeedbackError::Database { context, source }
}

/// A thumbs-up or thumbs-down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rating {
    /// Helpful.
    Up,
    /// Not helpful.
    Down,
}

impl Rating {
    /// `up` or `down` (the stored value and the metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Rating::Up => "up",
            Rating::Down => "down",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "up" => Some(Rating::Up),
            "down" => Some(Rating::Down),
            _ => None,
        }
    }
}

/// A chat completion as recorded when it is served (no prompt or answer text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionRecord<'a> {
    /// The completion id (= the request id).
    pub request_id: &'a str,
    /// The user it was served to.
    pub user_id: &'a str,
    /// The model alias that generated it.
    pub model: &'a str,
    /// The ladder rung that served it.
    pub rung: u8,
    /// The installed bundle's version.
    pub bundle_version: &'a str,
}

/// Feedback as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feedback {
    /// The completion id the feedback is about.
    pub request_id: String,
    /// The rating.
    pub rating: Rating,
    /// The user's comment, if any.
    pub comment: Option<String>,
    /// When this user first rated this completion (µs since the Unix epoch).
    pub created_us: i64,
    /// When the rating or comment last changed (µs since the Unix epoch).
    pub updated_us: i64,
}

/// What [`FeedbackStore::put_feedback`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// First feedback of this user for this completion.
    Created(Feedback),
    /// The previous rating and comment were replaced.
    Replaced(Feedback),
    /// No completion with this id was served to this user.
    UnknownRequest,
}

/// A feedback row as the operator console lists it, with the completion it rates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedFeedback {
    /// The user who rated.
    pub user_id: String,
    /// The completion id.
    pub request_id: String,
    /// `up` or `down`, as stored.
    pub rating: String,
    /// The user's comment, if any.
    pub comment: Option<String>,
    /// First rated (µs since the Unix epoch).
    pub created_us: i64,
    /// Last changed (µs since the Unix epoch).
    pub updated_us: i64,
    /// The model alias that generated the completion.
    pub model: String,
    /// The ladder rung that served it.
    pub rung: i64,
    /// The bundle version that served it.
    pub bundle_version: String,
}

/// A page of [`FeedbackStore::list_feedback`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedbackPage {
    /// The rows, most recently changed first.
    pub rows: Vec<ListedFeedback>,
    /// Every user's feedback counted by rating (`up`/`down` as stored), whatever the filter.
    pub totals: Vec<(String, i64)>,
}

pub(crate) struct Migration {
    pub(crate) version: i64,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "chat completions served, answer feedback",
        sql: "
CREATE TABLE chat_completions (
    user_id        TEXT NOT NULL,
    request_id     TEXT NOT NULL,
    created_us     INTEGER NOT NULL,
    model          TEXT NOT NULL,
    rung           INTEGER NOT NULL,
    bundle_version TEXT NOT NULL,
    PRIMARY KEY (user_id, request_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX chat_completions_at ON chat_completions(created_us);
CREATE TABLE feedback (
    user_id    TEXT NOT NULL,
    request_id TEXT NOT NULL,
    rating     TEXT NOT NULL CHECK (rating IN ('up', 'down')),
    comment    TEXT,
    created_us INTEGER NOT NULL,
    updated_us INTEGER NOT NULL,
    PRIMARY KEY (user_id, request_id),
    FOREIGN KEY (user_id, request_id) REFERENCES chat_completions(user_id, request_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX feedback_at ON feedback(updated_us);
",
    },
    Migration {
        version: 2,
        name: "conversations kept by the server",
        sql: CONVERSATIONS_SQL,
    },
    Migration {
        version: 3,
        name: "conversation turns record the earlier turns they were answered from",
        sql: PARENTS_SQL,
    },
];

/// The SQL of migration 2: the server-kept conversations ([`crate::conversations`]).
const CONVERSATIONS_SQL: &str = "
CREATE TABLE conversations (
    id         TEXT PRIMARY KEY,
    user_id    TEXT NOT NULL,
    title      TEXT NOT NULL,
    created_us INTEGER NOT NULL,
    updated_us INTEGER NOT NULL
) STRICT;
CREATE INDEX conversations_user ON conversations(user_id, updated_us);
CREATE TABLE conversation_turns (
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    seq             INTEGER NOT NULL,
    question        TEXT NOT NULL,
    answer          TEXT NOT NULL,
    request_id      TEXT NOT NULL,
    created_us      INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, seq)
) STRICT, WITHOUT ROWID;
CREATE TABLE conversation_sources (
    conversation_id TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    doc_id          TEXT NOT NULL,
    version         TEXT NOT NULL,
    cited           INTEGER NOT NULL,
    n               INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, seq, doc_id),
    FOREIGN KEY (conversation_id, seq) REFERENCES conversation_turns(conversation_id, seq)
        ON DELETE CASCADE
) STRICT, WITHOUT ROWID;
CREATE INDEX conversation_sources_doc ON conversation_sources(doc_id);
";

/// The SQL of migration 3: which earlier turns of its thread each turn was answered from (the
/// history fed to the model; [`crate::conversations`]), and a per-thread turn counter so a
/// purged turn's number is never given to another. Turns stored before it get the turn before
/// them as parent, and through it every earlier one: their history is not known, and all of it
/// could have been fed.
const PARENTS_SQL: &str = "
CREATE TABLE conversation_parents (
    conversation_id TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    parent_seq      INTEGER NOT NULL CHECK (parent_seq < seq),
    PRIMARY KEY (conversation_id, seq, parent_seq),
    FOREIGN KEY (conversation_id, seq) REFERENCES conversation_turns(conversation_id, seq)
        ON DELETE CASCADE
) STRICT, WITHOUT ROWID;
CREATE INDEX conversation_parents_parent ON conversation_parents(conversation_id, parent_seq);
INSERT INTO conversation_parents (conversation_id, seq, parent_seq)
    SELECT * FROM (
        SELECT a.conversation_id, a.seq,
               (SELECT MAX(b.seq) FROM conversation_turns b
                 WHERE b.conversation_id = a.conversation_id AND b.seq < a.seq) AS parent_seq
          FROM conversation_turns a)
     WHERE parent_seq IS NOT NULL;
ALTER TABLE conversations ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
UPDATE conversations SET last_seq =
    (SELECT COALESCE(MAX(seq), 0) FROM conversation_turns t WHERE t.conversation_id = conversations.id);
";

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 3;

/// The chat-completion and feedback tables (one connection, serialised by a mutex; SQLite
/// serialises writers anyway and every statement here is a point lookup or upsert).
pub struct FeedbackStore {
    path: PathBuf,
    pub(crate) conn: Mutex<Connection>,
}

impl std::fmt::Debug for FeedbackStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedbackStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl FeedbackStore {
    /// Opens (creating if needed) the tables in the SQLite file at `path` (WAL, foreign keys,
    /// busy timeout) and applies the migrations this build knows.
    pub fn open(path: &Path) -> Result<Self, FeedbackError> {
        let open = |source| FeedbackError::Open {
            path: path.to_owned(),
            source,
        };
        let mut conn = Connection::open(path).map_err(open)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(open)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open)?;
        conn.pragma_update(None, "foreign_keys", true)
            .map_err(open)?;
        // Deleted conversation text (a purge, a deleted thread, retention) is overwritten with
        // zeros in the file instead of lingering in free pages.
        conn.pragma_update(None, "secure_delete", "ON")
            .map_err(open)?;
        migrate(&mut conn)?;
        Ok(FeedbackStore {
            path: path.to_owned(),
            conn: Mutex::new(conn),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records a chat completion as served. A second record with the same `(user, request id)`
    /// (a client reusing its `X-Request-Id`) keeps the first one.
    pub fn record_completion(&self, c: &CompletionRecord<'_>) -> Result<(), FeedbackError> {
        let conn = self.conn.lock();
        conn.prepare_cached(
            "INSERT INTO chat_completions
                 (user_id, request_id, created_us, model, rung, bundle_version)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(user_id, request_id) DO NOTHING",
        )
        .and_then(|mut st| {
            st.execute(params![
                c.user_id,
                c.request_id,
                now_us(),
                c.model,
                i64::from(c.rung),
                c.bundle_version
            ])
        })
        .map_err(db("recording a chat completion"))?;
        Ok(())
    }

    /// Stores `user_id`'s feedback on the completion `request_id`, replacing an earlier one.
    /// The completion must have been served to `user_id`: an id served to another user is
    /// [`PutOutcome::UnknownRequest`], exactly like an id never served (same statements).
    pub fn put_feedback(
        &self,
        user_id: &str,
        request_id: &str,
        rating: Rating,
        comment: Option<&str>,
    ) -> Result<PutOutcome, FeedbackError> {
        let mut conn = self.conn.lock();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("starting a feedback transaction"))?;
        let served: bool = tx
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM chat_completions
                                 WHERE user_id = ?1 AND request_id = ?2)",
            )
            .and_then(|mut st| st.query_row(params![user_id, request_id], |r| r.get(0)))
            .map_err(db("looking up the chat completion"))?;
        if !served {
            return Ok(PutOutcome::UnknownRequest);
        }
        let previous: Option<i64> = tx
            .prepare_cached(
                "SELECT created_us FROM feedback WHERE user_id = ?1 AND request_id = ?2",
            )
            .and_then(|mut st| {
                st.query_row(params![user_id, request_id], |r| r.get(0))
                    .optional()
            })
            .map_err(db("reading earlier feedback"))?;
        let now = now_us();
        tx.prepare_cached(
            "INSERT INTO feedback (user_id, request_id, rating, comment, created_us, updated_us)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5)
             ON CONFLICT(user_id, request_id) DO UPDATE SET
                 rating = excluded.rating,
                 comment = excluded.comment,
                 updated_us = excluded.updated_us",
        )
        .and_then(|mut st| st.execute(params![user_id, request_id, rating.as_str(), comment, now]))
        .map_err(db("storing feedback"))?;
        tx.commit().map_err(db("committing feedback"))?;
        let stored = Feedback {
            request_id: request_id.to_owned(),
            rating,
            comment: comment.map(str::to_owned),
            created_us: previous.unwrap_or(now),
            updated_us: now,
        };
        Ok(match previous {
            None => PutOutcome::Created(stored),
            Some(_) => PutOutcome::Replaced(stored),
        })
    }

    /// `user_id`'s feedback on `request_id`, if any.
    pub fn feedback(
        &self,
        user_id: &str,
        request_id: &str,
    ) -> Result<Option<Feedback>, FeedbackError> {
        let conn = self.conn.lock();
        let row = conn
            .prepare_cached(
                "SELECT rating, comment, created_us, updated_us FROM feedback
                  WHERE user_id = ?1 AND request_id = ?2",
            )
            .and_then(|mut st| {
                st.query_row(params![user_id, request_id], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Option<String>>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, i64>(3)?,
                    ))
                })
                .optional()
            })
            .map_err(db("reading feedback"))?;
        Ok(row.and_then(|(rating, comment, created_us, updated_us)| {
            Some(Feedback {
                request_id: request_id.to_owned(),
                rating: Rating::parse(&rating)?,
                comment,
                created_us,
                updated_us,
            })
        }))
    }

    /// Every user's feedback (with `rating` only, when given), most recently changed first, at
    /// most `limit` rows after skipping `offset`, with the totals by rating: the operator
    /// console's listing.
    pub fn list_feedback(
        &self,
        rating: Option<Rating>,
        limit: usize,
        offset: usize,
    ) -> Result<FeedbackPage, FeedbackError> {
        const CONTEXT: &str = "reading feedback for the console";
        let conn = self.conn.lock();
        let rows = conn
            .prepare_cached(
                "SELECT f.user_id, f.request_id, f.rating, f.comment, f.created_us, f.updated_us,
                        c.model, c.rung, c.bundle_version
                   FROM feedback f JOIN chat_completions c
                        ON c.user_id = f.user_id AND c.request_id = f.request_id
                  WHERE ?1 IS NULL OR f.rating = ?1
                  ORDER BY f.updated_us DESC, f.user_id, f.request_id LIMIT ?2 OFFSET ?3",
            )
            .and_then(|mut st| {
                st.query_map(
                    params![rating.map(Rating::as_str), limit as i64, offset as i64],
                    |r| {
                        Ok(ListedFeedback {
                            user_id: r.get(0)?,
                            request_id: r.get(1)?,
                            rating: r.get(2)?,
                            comment: r.get(3)?,
                            created_us: r.get(4)?,
                            updated_us: r.get(5)?,
                            model: r.get(6)?,
                            rung: r.get(7)?,
                            bundle_version: r.get(8)?,
                        })
                    },
                )?
                .collect::<Result<Vec<_>, _>>()
            })
            .map_err(db(CONTEXT))?;
        let totals = conn
            .prepare_cached("SELECT rating, count(*) FROM feedback GROUP BY rating")
            .and_then(|mut st| {
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(db(CONTEXT))?;
        Ok(FeedbackPage { rows, totals })
    }

    /// Whether a completion `request_id` served to `user_id` is recorded.
    pub fn completion_recorded(
        &self,
        user_id: &str,
        request_id: &str,
    ) -> Result<bool, FeedbackError> {
        let conn = self.conn.lock();
        conn.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM chat_completions WHERE user_id = ?1 AND request_id = ?2)",
        )
        .and_then(|mut st| st.query_row(params![user_id, request_id], |r| r.get(0)))
        .map_err(db("looking up the chat completion"))
    }
}

fn migrate(conn: &mut Connection) -> Result<(), FeedbackError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS appliance_schema_migrations (
             version    INTEGER PRIMARY KEY,
             name       TEXT NOT NULL,
             applied_us INTEGER NOT NULL
         ) STRICT;",
    )
    .map_err(db("creating the migration table"))?;
    for m in MIGRATIONS {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("starting a migration"))?;
        let current: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(version), 0) FROM appliance_schema_migrations",
                [],
                |r| r.get(0),
            )
            .map_err(db("reading the schema version"))?;
        if current > SCHEMA_VERSION {
            return Err(FeedbackError::SchemaTooNew {
                found: current,
                supported: SCHEMA_VERSION,
            });
        }
        if current >= m.version {
            continue;
        }
        tx.execute_batch(m.sql)
            .map_err(db("applying a migration"))?;
        tx.execute(
            "INSERT INTO appliance_schema_migrations (version, name, applied_us)
             VALUES (?1, ?2, ?3)",
            params![m.version, m.name, now_us()],
        )
        .map_err(db("recording a migration"))?;
        tx.commit().map_err(db("committing a migration"))?;
        tracing::info!(
            version = m.version,
            name = m.name,
            "appliance schema migrated"
        );
    }
    Ok(())
}

/// Microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    let ns = time::OffsetDateTime::now_utc().unix_timestamp_nanos();
    i64::try_from(ns / 1000).unwrap_or(i64::MAX)
}

/// `us` (µs since the Unix epoch) as RFC 3339.
pub fn rfc3339_us(us: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, FeedbackStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = FeedbackStore::open(&dir.path().join("airlock.db")).unwrap();
        (dir, s)
    }

    fn served(s: &FeedbackStore, user: &str, id: &str) {
        s.record_completion(&CompletionRecord {
            request_id: id,
            user_id: user,
            model: "airlock-small",
            rung: 0,
            bundle_version: "1.0.0",
        })
        .unwrap();
    }

    #[test]
    fn feedback_needs_a_completion_served_to_the_same_user() {
        let (_d, s) = store();
        served(&s, "alice", "req-1");
        assert_eq!(
            s.put_feedback("bob", "req-1", Rating::Up, None).unwrap(),
            PutOutcome::UnknownRequest
        );
        assert_eq!(
            s.put_feedback("alice", "req-2", Rating::Up, None).unwrap(),
            PutOutcome::UnknownRequest
        );
        assert!(matches!(
            s.put_feedback("alice", "req-1", Rating::Up, None).unwrap(),
            PutOutcome::Created(_)
        ));
        let PutOutcome::Replaced(f) = s
            .put_feedback("alice", "req-1", Rating::Down, Some("too vague"))
            .unwrap()
        else {
            panic!("second feedback must replace");
        };
        assert_eq!(f.rating, Rating::Down);
        let stored = s.feedback("alice", "req-1").unwrap().unwrap();
        assert_eq!(stored.comment.as_deref(), Some("too vague"));
        assert_eq!(stored.created_us, f.created_us);
        assert!(stored.updated_us >= stored.created_us);
        assert_eq!(s.feedback("bob", "req-1").unwrap(), None);
    }

    #[test]
    fn a_reused_request_id_keeps_the_first_record() {
        let (_d, s) = store();
        served(&s, "alice", "dup");
        served(&s, "alice", "dup");
        served(&s, "bob", "dup");
        assert!(s.completion_recorded("alice", "dup").unwrap());
        assert!(s.completion_recorded("bob", "dup").unwrap());
        let n: i64 = s
            .conn
            .lock()
            .query_row("SELECT COUNT(*) FROM chat_completions", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
    }

    #[test]
    fn migrations_are_versioned_idempotent_and_refuse_newer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("airlock.db");
        drop(FeedbackStore::open(&path).unwrap());
        let s = FeedbackStore::open(&path).unwrap();
        let (versions, mode): (i64, String) = {
            let c = s.conn.lock();
            (
                c.query_row(
                    "SELECT COUNT(*) FROM appliance_schema_migrations",
                    [],
                    |r| r.get(0),
                )
                .unwrap(),
                c.query_row("PRAGMA journal_mode", [], |r| r.get(0))
                    .unwrap(),
            )
        };
        assert_eq!(versions, SCHEMA_VERSION);
        assert_eq!(mode, "wal");
        s.conn
            .lock()
            .execute(
                "INSERT INTO appliance_schema_migrations VALUES (99, 'future', 0)",
                [],
            )
            .unwrap();
        drop(s);
        assert!(matches!(
            FeedbackStore::open(&path),
            Err(FeedbackError::SchemaTooNew { found: 99, .. })
        ));
    }

    #[test]
    fn timestamps_format_as_rfc3339() {
        assert_eq!(rfc3339_us(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_us(1_500_000), "1970-01-01T00:00:01.5Z");
    }
}
