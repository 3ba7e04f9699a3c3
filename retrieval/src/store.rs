//! The document store: SQLite (WAL) tables for documents and their current chunks, with
//! versioned migrations. SQLite is the source of truth; the indexes are derived from it.
//!
//! Only live chunks have rows: replacing or deleting a document deletes its chunk rows in the
//! same transaction, so a chunk id below `next_chunk_id` without a row is dead. Chunk ids are
//! never reused. Each chunk keeps its f32 embedding so crash repair and `reindex` never need the
//! embedder again.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The schema version this build reads and writes (the number of [`MIGRATIONS`]).
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Schema migrations, applied in order; the index + 1 is the schema version.
const MIGRATIONS: &[&str] = &[
    // v1
    "CREATE TABLE documents (
         ordinal     INTEGER PRIMARY KEY,
         doc_id      TEXT NOT NULL UNIQUE,
         title       TEXT NOT NULL,
         metadata    TEXT NOT NULL,
         version     TEXT NOT NULL,
         chunk_count INTEGER NOT NULL,
         created_at  INTEGER NOT NULL,
         updated_at  INTEGER NOT NULL,
         deleted_at  INTEGER
     ) STRICT;
     CREATE TABLE chunks (
         id          INTEGER PRIMARY KEY,
         doc_ordinal INTEGER NOT NULL REFERENCES documents(ordinal),
         version     TEXT NOT NULL,
         position    INTEGER NOT NULL,
         text        TEXT NOT NULL,
         token_start INTEGER NOT NULL,
         token_end   INTEGER NOT NULL,
         byte_start  INTEGER NOT NULL,
         byte_end    INTEGER NOT NULL,
         embedding   BLOB NOT NULL
     ) STRICT;
     CREATE INDEX chunks_by_doc ON chunks(doc_ordinal, position);
     CREATE TABLE retrieval_meta (
         key   TEXT PRIMARY KEY,
         value INTEGER NOT NULL
     ) STRICT;
     INSERT INTO retrieval_meta (key, value) VALUES ('next_chunk_id', 0), ('index_generation', 0);",
    // v2: where a chunk of an extracted file (PDF, Office, e-mail, CSV) sits in it, as the JSON
    // of `airlock_extract::Anchor`; NULL for text documents and every chunk stored before v2.
    "ALTER TABLE chunks ADD COLUMN anchor TEXT;",
    // v3: the document's original file (`originals/<sha256>`) and its media type; NULL for
    // documents given as text and once the document is tombstoned.
    "ALTER TABLE documents ADD COLUMN original TEXT;
     ALTER TABLE documents ADD COLUMN media_type TEXT;
     CREATE INDEX documents_by_original ON documents(original) WHERE original IS NOT NULL;",
];

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A chunk ready to be stored.
pub(crate) struct NewChunk {
    pub text: String,
    pub token_start: usize,
    pub token_end: usize,
    pub byte_start: usize,
    pub byte_end: usize,
    pub embedding: Vec<f32>,
    /// JSON of the chunk's anchor (extracted files).
    pub anchor: Option<String>,
}

/// A document ready to be stored (validated, chunked, embedded).
pub(crate) struct NewDocument {
    pub doc_id: String,
    pub title: String,
    pub metadata: Map<String, Value>,
    pub version: String,
    pub chunks: Vec<NewChunk>,
    /// The original file (stored in `originals/` before the row is committed).
    pub original: Option<crate::originals::Original>,
}

/// What an upsert did to one document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpsertStatus {
    /// First version of this id (or first since it was deleted).
    Created,
    /// A live document got a new version.
    Replaced,
    /// Same content as the live version: nothing changed.
    Unchanged,
}

/// Result of storing one document.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UpsertOutcome {
    /// External id.
    pub doc_id: String,
    /// ACL ordinal.
    pub ordinal: u32,
    /// Content hash of the stored version.
    pub version: String,
    /// Number of chunks of the stored version.
    pub chunks: usize,
    /// Created, replaced or unchanged.
    pub status: UpsertStatus,
}

/// Store-level result of a committed upsert, for the engine's index writes.
pub(crate) struct Committed {
    pub outcomes: Vec<UpsertOutcome>,
    /// (chunk id, doc ordinal, index text, embedding) of every new chunk.
    pub added: Vec<(u32, u32, String, Vec<f32>)>,
    /// Ordinals whose previous chunks died.
    pub replaced_docs: Vec<u32>,
    pub dead: Vec<u32>,
    pub next_chunk_id: u32,
}

/// Admin view of a document.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DocumentInfo {
    /// External id.
    pub doc_id: String,
    /// ACL ordinal.
    pub ordinal: u32,
    /// Title.
    pub title: String,
    /// Metadata object.
    pub metadata: Map<String, Value>,
    /// Content hash of the current version.
    pub version: String,
    /// Live chunks (0 once deleted).
    pub chunks: usize,
    /// First ingest, ms since the epoch.
    pub created_at_ms: i64,
    /// Last change, ms since the epoch.
    pub updated_at_ms: i64,
    /// Tombstone time, ms since the epoch.
    pub deleted_at_ms: Option<i64>,
}

/// A chunk as returned with a search result.
#[derive(Debug, Clone)]
pub(crate) struct ChunkRow {
    pub doc_id: String,
    pub doc_ordinal: u32,
    pub title: String,
    pub position: u32,
    pub text: String,
}

/// The text a chunk is indexed under (BM25) and embedded as: its document's title line, then
/// the chunk text.
pub(crate) fn index_text(title: &str, text: &str) -> String {
    let title = index_title(title);
    if title.is_empty() {
        text.to_owned()
    } else {
        format!("{title}\n\n{text}")
    }
}

/// Longest title prefix (in bytes) repeated in every chunk's index text.
pub(crate) const INDEX_TITLE_MAX_BYTES: usize = 200;

/// The part of a title that goes into every chunk's index text (cut on a char boundary).
pub(crate) fn index_title(title: &str) -> &str {
    let title = title.trim();
    if title.len() <= INDEX_TITLE_MAX_BYTES {
        return title;
    }
    let mut end = INDEX_TITLE_MAX_BYTES;
    while !title.is_char_boundary(end) {
        end -= 1;
    }
    &title[..end]
}

/// The index generation (`index/<generation>/`) the document store at `db_path` names, read
/// without opening the engine (`airlock backup` reads it from its copy of the database).
pub fn stored_index_generation(db_path: &Path) -> Result<u64> {
    let err = |source| Error::Store {
        path: db_path.to_path_buf(),
        source,
    };
    let conn = Connection::open_with_flags(db_path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(err)?;
    let g: i64 = conn
        .query_row(
            "SELECT value FROM retrieval_meta WHERE key = 'index_generation'",
            [],
            |r| r.get(0),
        )
        .map_err(err)?;
    Ok(g.max(0) as u64)
}

pub(crate) struct Store {
    pub(crate) path: PathBuf,
    pub(crate) conn: Connection,
}

impl Store {
    /// Opens (creating if needed) the database, sets WAL and applies migrations.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let conn = open_conn(path)?;
        let s = Self {
            path: path.to_path_buf(),
            conn,
        };
        s.migrate()?;
        Ok(s)
    }

    pub(crate) fn err(&self, source: rusqlite::Error) -> Error {
        Error::Store {
            path: self.path.clone(),
            source,
        }
    }

    fn migrate(&self) -> Result<()> {
        let e = |s| self.err(s);
        self.conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS retrieval_schema (version INTEGER NOT NULL) STRICT;",
            )
            .map_err(e)?;
        let current: i64 = self
            .conn
            .query_row(
                "SELECT COALESCE(MAX(version), 0) FROM retrieval_schema",
                [],
                |r| r.get(0),
            )
            .map_err(e)?;
        let supported = MIGRATIONS.len() as i64;
        if current > supported {
            return Err(Error::SchemaTooNew {
                path: self.path.clone(),
                found: current,
                supported,
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
            let tx = self.conn.unchecked_transaction().map_err(e)?;
            tx.execute_batch(sql).map_err(e)?;
            tx.execute(
                "INSERT INTO retrieval_schema (version) VALUES (?1)",
                [i as i64 + 1],
            )
            .map_err(e)?;
            tx.commit().map_err(e)?;
        }
        airlock_acl::ordinals::migrate(&self.conn).map_err(e)?;
        Ok(())
    }

    pub(crate) fn meta(&self, key: &str) -> Result<i64> {
        self.conn
            .query_row(
                "SELECT value FROM retrieval_meta WHERE key = ?1",
                [key],
                |r| r.get(0),
            )
            .map_err(|s| self.err(s))
    }

    pub(crate) fn set_meta(conn: &Connection, key: &str, value: i64) -> rusqlite::Result<()> {
        conn.execute(
            "INSERT INTO retrieval_meta (key, value) VALUES (?1, ?2)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )
        .map(|_| ())
    }

    /// (chunk id, doc ordinal) of every live chunk.
    pub(crate) fn live_chunks(&self) -> Result<Vec<(u32, u32)>> {
        let mut st = self
            .conn
            .prepare("SELECT id, doc_ordinal FROM chunks ORDER BY id")
            .map_err(|s| self.err(s))?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(|s| self.err(s))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(|s| self.err(s))
    }

    /// Calls `f(chunk id, index text, embedding)` for live chunks, in id order, optionally only
    /// those in `only`.
    pub(crate) fn for_each_chunk(
        &self,
        only: Option<&roaring::RoaringBitmap>,
        mut f: impl FnMut(u32, String, Vec<f32>) -> Result<()>,
    ) -> Result<()> {
        let mut st = self
            .conn
            .prepare(
                "SELECT c.id, d.title, c.text, c.embedding FROM chunks c
                 JOIN documents d ON d.ordinal = c.doc_ordinal ORDER BY c.id",
            )
            .map_err(|s| self.err(s))?;
        let mut rows = st.query([]).map_err(|s| self.err(s))?;
        while let Some(r) = rows.next().map_err(|s| self.err(s))? {
            let id: u32 = r.get(0).map_err(|s| self.err(s))?;
            if only.is_some_and(|o| !o.contains(id)) {
                continue;
            }
            let title: String = r.get(1).map_err(|s| self.err(s))?;
            let text: String = r.get(2).map_err(|s| self.err(s))?;
            let blob: Vec<u8> = r.get(3).map_err(|s| self.err(s))?;
            f(id, index_text(&title, &text), decode_vector(&blob)?)?;
        }
        Ok(())
    }

    /// Stores a batch in one transaction: new versions replace old ones (whose chunks die),
    /// unchanged documents are skipped. Returns what to index.
    pub(crate) fn upsert(&mut self, docs: Vec<NewDocument>) -> Result<Committed> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|source| Error::Store {
                path: path.clone(),
                source,
            })?;
        let out = Store::upsert_in(&tx, &path, docs)?;
        tx.commit()
            .map_err(|source| Error::Store { path, source })?;
        Ok(out)
    }

    /// The rows of [`Store::upsert`], written in `tx` (which the caller commits: a document and
    /// its grant are written in one transaction). `path` names the file in errors.
    pub(crate) fn upsert_in(
        tx: &rusqlite::Transaction<'_>,
        path: &Path,
        docs: Vec<NewDocument>,
    ) -> Result<Committed> {
        let e = |source| Error::Store {
            path: path.to_path_buf(),
            source,
        };
        let mut next: i64 = tx
            .query_row(
                "SELECT value FROM retrieval_meta WHERE key = 'next_chunk_id'",
                [],
                |r| r.get(0),
            )
            .map_err(e)?;
        let now = now_ms();
        let mut out = Committed {
            outcomes: Vec::with_capacity(docs.len()),
            added: Vec::new(),
            replaced_docs: Vec::new(),
            dead: Vec::new(),
            next_chunk_id: 0,
        };
        for doc in docs {
            let ordinal = airlock_acl::ordinals::ensure(tx, &doc.doc_id).map_err(e)?;
            let existing: Option<(String, Option<i64>)> = tx
                .query_row(
                    "SELECT version, deleted_at FROM documents WHERE ordinal = ?1",
                    [ordinal],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(e)?;
            let status = match &existing {
                Some((v, None)) if *v == doc.version => {
                    let chunks: i64 = tx
                        .query_row(
                            "SELECT chunk_count FROM documents WHERE ordinal = ?1",
                            [ordinal],
                            |r| r.get(0),
                        )
                        .map_err(e)?;
                    out.outcomes.push(UpsertOutcome {
                        doc_id: doc.doc_id,
                        ordinal,
                        version: doc.version,
                        chunks: chunks as usize,
                        status: UpsertStatus::Unchanged,
                    });
                    continue;
                }
                Some((_, None)) => UpsertStatus::Replaced,
                Some((_, Some(_))) | None => UpsertStatus::Created,
            };
            let dead = delete_chunks(tx, ordinal).map_err(e)?;
            if !dead.is_empty() {
                out.replaced_docs.push(ordinal);
            }
            out.dead.extend(dead);
            let metadata = Value::Object(doc.metadata).to_string();
            let (original, media_type) = match &doc.original {
                Some(o) => (Some(o.sha256.as_str()), Some(o.media_type.as_str())),
                None => (None, None),
            };
            tx.execute(
                "INSERT INTO documents (ordinal, doc_id, title, metadata, version, chunk_count, created_at, updated_at, deleted_at, original, media_type)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, NULL, ?8, ?9)
                 ON CONFLICT(ordinal) DO UPDATE SET title = excluded.title, metadata = excluded.metadata,
                     version = excluded.version, chunk_count = excluded.chunk_count,
                     updated_at = excluded.updated_at, deleted_at = NULL,
                     original = excluded.original, media_type = excluded.media_type",
                params![ordinal, doc.doc_id, doc.title, metadata, doc.version, doc.chunks.len() as i64, now, original, media_type],
            )
            .map_err(e)?;
            let mut ins = tx
                .prepare_cached(
                    "INSERT INTO chunks (id, doc_ordinal, version, position, text, token_start, token_end, byte_start, byte_end, embedding, anchor)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                )
                .map_err(e)?;
            let chunks = doc.chunks.len();
            for (pos, c) in doc.chunks.into_iter().enumerate() {
                let id = u32::try_from(next)
                    .map_err(|_| Error::Corrupt("chunk id space (u32) exhausted".into()))?;
                next += 1;
                ins.execute(params![
                    id,
                    ordinal,
                    doc.version,
                    pos as i64,
                    c.text,
                    c.token_start as i64,
                    c.token_end as i64,
                    c.byte_start as i64,
                    c.byte_end as i64,
                    encode_vector(&c.embedding),
                    c.anchor,
                ])
                .map_err(e)?;
                out.added
                    .push((id, ordinal, index_text(&doc.title, &c.text), c.embedding));
            }
            drop(ins);
            out.outcomes.push(UpsertOutcome {
                doc_id: doc.doc_id,
                ordinal,
                version: doc.version,
                chunks,
                status,
            });
        }
        Store::set_meta(tx, "next_chunk_id", next).map_err(e)?;
        out.next_chunk_id = next as u32;
        Ok(out)
    }

    /// Tombstones live documents by id in one transaction: sets `deleted_at` and deletes their
    /// chunk rows. Returns, per id, `Some((ordinal, dead chunk ids))` when it was live, `None`
    /// when already deleted or unknown (see [`Store::document`] to tell those apart).
    pub(crate) fn delete(&mut self, doc_ids: &[&str]) -> Result<Vec<Option<Tombstoned>>> {
        let path = self.path.clone();
        let e = |source| Error::Store {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(e)?;
        let now = now_ms();
        let mut out = Vec::with_capacity(doc_ids.len());
        for id in doc_ids {
            let ordinal: Option<u32> = tx
                .query_row(
                    "SELECT ordinal FROM documents WHERE doc_id = ?1 AND deleted_at IS NULL",
                    [id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(e)?;
            let Some(ordinal) = ordinal else {
                out.push(None);
                continue;
            };
            let dead = delete_chunks(&tx, ordinal).map_err(e)?;
            tx.execute(
                "UPDATE documents SET deleted_at = ?2, updated_at = ?2, chunk_count = 0,
                     original = NULL, media_type = NULL WHERE ordinal = ?1",
                params![ordinal, now],
            )
            .map_err(e)?;
            out.push(Some((ordinal, dead)));
        }
        tx.commit().map_err(e)?;
        Ok(out)
    }

    /// External ids of all live documents.
    pub(crate) fn live_doc_ids(&self) -> Result<Vec<String>> {
        let mut st = self
            .conn
            .prepare("SELECT doc_id FROM documents WHERE deleted_at IS NULL")
            .map_err(|s| self.err(s))?;
        let rows = st.query_map([], |r| r.get(0)).map_err(|s| self.err(s))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(|s| self.err(s))
    }

    /// Removes tombstoned documents deleted at or before `cutoff_ms` for good: their rows go
    /// (in one transaction, with `secure_delete` zeroing the freed space), then the file is
    /// vacuumed and the write-ahead log truncated, so no page of the file keeps their text.
    /// Returns what was removed (sorted by id).
    pub(crate) fn purge(&mut self, cutoff_ms: i64) -> Result<Vec<(String, String, i64)>> {
        let path = self.path.clone();
        let e = |source| Error::Store {
            path: path.clone(),
            source,
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(e)?;
        let purged: Vec<(u32, String, String, i64)> = {
            let mut st = tx
                .prepare(
                    "SELECT ordinal, doc_id, version, deleted_at FROM documents
                     WHERE deleted_at IS NOT NULL AND deleted_at <= ?1 ORDER BY doc_id",
                )
                .map_err(e)?;
            let rows = st
                .query_map([cutoff_ms], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .map_err(e)?;
            rows.collect::<rusqlite::Result<_>>().map_err(e)?
        };
        for (ordinal, ..) in &purged {
            delete_chunks(&tx, *ordinal).map_err(e)?;
            tx.execute("DELETE FROM documents WHERE ordinal = ?1", [ordinal])
                .map_err(e)?;
        }
        tx.commit().map_err(e)?;
        Ok(purged
            .into_iter()
            .map(|(_, id, version, at)| (id, version, at))
            .collect())
    }

    /// Rewrites the database file without free pages and truncates the write-ahead log, so
    /// nothing deleted earlier remains in either file.
    pub(crate) fn vacuum(&self) -> Result<()> {
        // The copy is built in memory: under the daemon's lockdown nothing may be created in
        // the data directory or the temp directory (it costs the database's size in RAM, once).
        self.conn
            .execute_batch(
                "PRAGMA temp_store = MEMORY; VACUUM; PRAGMA wal_checkpoint(TRUNCATE);
                 PRAGMA temp_store = DEFAULT;",
            )
            .map_err(|s| self.err(s))
    }

    /// The original file of a live document: (ordinal, SHA-256, media type).
    pub(crate) fn original_of(
        conn: &Connection,
        doc_id: &str,
    ) -> rusqlite::Result<Option<(u32, String, String)>> {
        conn.query_row(
            "SELECT ordinal, original, media_type FROM documents
             WHERE doc_id = ?1 AND deleted_at IS NULL AND original IS NOT NULL",
            [doc_id],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get::<_, Option<String>>(2)?.unwrap_or_default(),
                ))
            },
        )
        .optional()
    }

    /// The originals the documents `doc_ids` name now (live or not).
    pub(crate) fn originals_named(
        conn: &Connection,
        doc_ids: &[&str],
    ) -> rusqlite::Result<Vec<String>> {
        let mut st = conn.prepare_cached(
            "SELECT original FROM documents WHERE doc_id = ?1 AND original IS NOT NULL",
        )?;
        let mut out = Vec::new();
        for id in doc_ids {
            if let Some(d) = st.query_row([id], |r| r.get(0)).optional()? {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// Whether a live document names the original `sha256`.
    pub(crate) fn original_is_named(conn: &Connection, sha256: &str) -> rusqlite::Result<bool> {
        conn.query_row(
            "SELECT EXISTS(SELECT 1 FROM documents WHERE original = ?1 AND deleted_at IS NULL)",
            [sha256],
            |r| r.get(0),
        )
    }

    /// Number of live documents.
    pub(crate) fn live_doc_count(&self) -> Result<u64> {
        self.conn
            .query_row(
                "SELECT COUNT(*) FROM documents WHERE deleted_at IS NULL",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(|s| self.err(s))
    }

    /// Admin view of one document (live or tombstoned).
    pub(crate) fn document(
        conn: &Connection,
        doc_id: &str,
    ) -> rusqlite::Result<Option<DocumentInfo>> {
        conn.query_row(
            "SELECT ordinal, doc_id, title, metadata, version, chunk_count, created_at, updated_at, deleted_at
             FROM documents WHERE doc_id = ?1",
            [doc_id],
            |r| {
                let meta: String = r.get(3)?;
                let metadata = match serde_json::from_str(&meta) {
                    Ok(Value::Object(m)) => m,
                    _ => Map::new(),
                };
                Ok(DocumentInfo {
                    ordinal: r.get(0)?,
                    doc_id: r.get(1)?,
                    title: r.get(2)?,
                    metadata,
                    version: r.get(4)?,
                    chunks: r.get::<_, i64>(5)? as usize,
                    created_at_ms: r.get(6)?,
                    updated_at_ms: r.get(7)?,
                    deleted_at_ms: r.get(8)?,
                })
            },
        )
        .optional()
    }

    /// The anchors of the live chunks among `ids` that have one.
    pub(crate) fn anchors(
        conn: &Connection,
        ids: &[u32],
    ) -> rusqlite::Result<Vec<(u32, u32, crate::ingest::Anchor)>> {
        let mut st = conn.prepare_cached("SELECT anchor, doc_ordinal FROM chunks WHERE id = ?1")?;
        let mut out = Vec::new();
        for &id in ids {
            let a: Option<(Option<String>, u32)> = st
                .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if let Some((Some(json), ordinal)) = a
                && let Ok(anchor) = serde_json::from_str(&json)
            {
                out.push((id, ordinal, anchor));
            }
        }
        Ok(out)
    }

    /// The version of each of `ids` still stored.
    pub(crate) fn chunk_versions(
        conn: &Connection,
        ids: &[u32],
    ) -> rusqlite::Result<std::collections::HashMap<u32, String>> {
        let mut st = conn.prepare_cached("SELECT version FROM chunks WHERE id = ?1")?;
        let mut out = std::collections::HashMap::with_capacity(ids.len());
        for &id in ids {
            if let Some(v) = st.query_row([id], |r| r.get(0)).optional()? {
                out.insert(id, v);
            }
        }
        Ok(out)
    }

    /// One chunk with its document fields, if live.
    pub(crate) fn chunk(conn: &Connection, id: u32) -> rusqlite::Result<Option<ChunkRow>> {
        let mut st = conn.prepare_cached(
            "SELECT d.doc_id, c.doc_ordinal, d.title, c.position, c.text FROM chunks c
             JOIN documents d ON d.ordinal = c.doc_ordinal WHERE c.id = ?1",
        )?;
        st.query_row([id], |r| {
            Ok(ChunkRow {
                doc_id: r.get(0)?,
                doc_ordinal: r.get(1)?,
                title: r.get(2)?,
                position: r.get(3)?,
                text: r.get(4)?,
            })
        })
        .optional()
    }
}

/// A document tombstoned by [`Store::delete`]: its ordinal and its now dead chunk ids.
pub(crate) type Tombstoned = (u32, Vec<u32>);

fn delete_chunks(tx: &Transaction<'_>, ordinal: u32) -> rusqlite::Result<Vec<u32>> {
    let mut st = tx.prepare_cached("DELETE FROM chunks WHERE doc_ordinal = ?1 RETURNING id")?;
    let rows = st.query_map([ordinal], |r| r.get(0))?;
    rows.collect()
}

/// Opens a connection with the settings every connection to the store uses.
pub(crate) fn open_conn(path: &Path) -> Result<Connection> {
    let e = |source| Error::Store {
        path: path.to_path_buf(),
        source,
    };
    let conn = Connection::open(path).map_err(e)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(e)?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(e)?;
    // NORMAL is durable across process crashes in WAL mode; FULL also across power loss, which
    // an appliance that acknowledges on commit needs.
    conn.pragma_update(None, "synchronous", "FULL").map_err(e)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(e)?;
    // Deleted rows (tombstoned chunks, purged documents) are overwritten with zeros in the
    // file instead of lingering in free pages (`airlock purge` also vacuums what came before).
    conn.pragma_update(None, "secure_delete", "ON").map_err(e)?;
    Ok(conn)
}

fn encode_vector(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn decode_vector(b: &[u8]) -> Result<Vec<f32>> {
    if !b.len().is_multiple_of(4) {
        return Err(Error::Corrupt(format!(
            "embedding blob of {} bytes",
            b.len()
        )));
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(id: &str, version: &str, n: usize) -> NewDocument {
        NewDocument {
            doc_id: id.into(),
            title: format!("title {id}"),
            metadata: Map::new(),
            version: version.into(),
            original: None,
            chunks: (0..n)
                .map(|i| NewChunk {
                    text: format!("chunk {i} of {id}"),
                    token_start: i,
                    token_end: i + 1,
                    byte_start: 0,
                    byte_end: 1,
                    anchor: None,
                    embedding: vec![i as f32, 1.0],
                })
                .collect(),
        }
    }

    #[test]
    fn upsert_replace_delete_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let mut s = Store::open(&path).unwrap();
        let c = s
            .upsert(vec![doc("a", "v1", 2), doc("b", "v1", 3)])
            .unwrap();
        assert_eq!(c.outcomes[0].status, UpsertStatus::Created);
        let ids: Vec<u32> = c.added.iter().map(|a| a.0).collect();
        assert_eq!(ids, vec![0, 1, 2, 3, 4]);
        assert_eq!(c.added[2].1, c.outcomes[1].ordinal);
        assert_eq!(c.added[0].2, "title a\n\nchunk 0 of a");
        let c = s
            .upsert(vec![doc("a", "v1", 2), doc("a", "v2", 1)])
            .unwrap();
        assert_eq!(c.outcomes[0].status, UpsertStatus::Unchanged);
        assert_eq!(c.outcomes[1].status, UpsertStatus::Replaced);
        assert_eq!(c.dead, vec![0, 1]);
        assert_eq!(c.added[0].0, 5);
        let d = s.delete(&["b", "b", "zzz"]).unwrap();
        assert_eq!(d[0].as_ref().unwrap().1, vec![2, 3, 4]);
        assert!(d[1].is_none() && d[2].is_none());
        drop(s);
        let s = Store::open(&path).unwrap();
        assert_eq!(s.live_chunks().unwrap(), vec![(5, 0)]);
        assert_eq!(s.meta("next_chunk_id").unwrap(), 6);
        let b = Store::document(&s.conn, "b").unwrap().unwrap();
        assert!(b.deleted_at_ms.is_some());
        assert_eq!(b.chunks, 0);
        let mut seen = Vec::new();
        s.for_each_chunk(None, |id, text, v| {
            seen.push((id, text, v));
            Ok(())
        })
        .unwrap();
        assert_eq!(
            seen,
            vec![(5, "title a\n\nchunk 0 of a".to_string(), vec![0.0, 1.0])]
        );
        // A later upsert of a deleted id creates a new live version with the same ordinal.
        let mut s = s;
        let c = s.upsert(vec![doc("b", "v1", 1)]).unwrap();
        assert_eq!(c.outcomes[0].status, UpsertStatus::Created);
        assert_eq!(c.outcomes[0].ordinal, b.ordinal);
    }
}
