//! Read-only listing for the operator console (`GET /v1/admin/documents`): documents by id or
//! title prefix, live or tombstoned, with chunk and anchor counts. Never chunk text.

use rusqlite::types::Value;

use crate::engine::Retrieval;
use crate::error::Result;

/// Which documents a listing returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DocumentStatus {
    /// Live and tombstoned ones.
    #[default]
    All,
    /// Not deleted.
    Live,
    /// Tombstoned (deleted, not yet purged).
    Deleted,
}

/// A listing request: documents whose id or title starts with `prefix` (ASCII case-insensitive),
/// by id, after the cursor `after`, at most `limit`.
#[derive(Clone, Debug, Default)]
pub struct DocumentList {
    /// Exactly this id.
    pub doc_id: Option<String>,
    /// Id or title prefix.
    pub prefix: Option<String>,
    /// Live, deleted or both.
    pub status: DocumentStatus,
    /// Only ids after this one (the last id of the previous page).
    pub after: Option<String>,
    /// At most this many documents.
    pub limit: usize,
}

/// One document as the console lists it: ids, counts and times only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentSummary {
    /// External id.
    pub doc_id: String,
    /// Title.
    pub title: String,
    /// Content hash of the current version.
    pub version: String,
    /// Live chunks (0 once deleted).
    pub chunks: usize,
    /// Live chunks with an anchor (page, sheet + rows, slide, heading path).
    pub anchored_chunks: usize,
    /// First ingest, ms since the epoch.
    pub created_at_ms: i64,
    /// Last change, ms since the epoch.
    pub updated_at_ms: i64,
    /// Tombstone time, ms since the epoch.
    pub deleted_at_ms: Option<i64>,
}

/// `prefix` as a LIKE pattern (its `%`, `_` and `\` taken literally).
fn like_prefix(prefix: &str) -> String {
    let mut p = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

impl Retrieval {
    /// Documents matching `q`, by id (see [`DocumentList`]).
    pub fn list_documents(&self, q: &DocumentList) -> Result<Vec<DocumentSummary>> {
        let mut sql = String::from(
            "SELECT d.doc_id, d.title, d.version, d.chunk_count, d.created_at, d.updated_at, \
             d.deleted_at, CASE WHEN d.deleted_at IS NULL THEN \
               (SELECT count(*) FROM chunks c WHERE c.doc_ordinal = d.ordinal \
                AND c.version = d.version AND c.anchor IS NOT NULL) ELSE 0 END \
             FROM documents d WHERE 1",
        );
        let mut args: Vec<Value> = Vec::new();
        if let Some(p) = q.prefix.as_deref().filter(|p| !p.is_empty()) {
            sql.push_str(" AND (d.doc_id LIKE ? ESCAPE '\\' OR d.title LIKE ? ESCAPE '\\')");
            args.push(Value::Text(like_prefix(p)));
            args.push(Value::Text(like_prefix(p)));
        }
        if let Some(id) = &q.doc_id {
            sql.push_str(" AND d.doc_id = ?");
            args.push(Value::Text(id.clone()));
        }
        match q.status {
            DocumentStatus::All => {}
            DocumentStatus::Live => sql.push_str(" AND d.deleted_at IS NULL"),
            DocumentStatus::Deleted => sql.push_str(" AND d.deleted_at IS NOT NULL"),
        }
        if let Some(a) = &q.after {
            sql.push_str(" AND d.doc_id > ?");
            args.push(Value::Text(a.clone()));
        }
        sql.push_str(" ORDER BY d.doc_id LIMIT ?");
        args.push(Value::Integer(i64::try_from(q.limit).unwrap_or(i64::MAX)));
        self.with_reader(|c| {
            let mut st = c.prepare(&sql)?;
            let rows = st.query_map(rusqlite::params_from_iter(args), |r| {
                Ok(DocumentSummary {
                    doc_id: r.get(0)?,
                    title: r.get(1)?,
                    version: r.get(2)?,
                    chunks: r.get::<_, i64>(3)? as usize,
                    created_at_ms: r.get(4)?,
                    updated_at_ms: r.get(5)?,
                    deleted_at_ms: r.get(6)?,
                    anchored_chunks: r.get::<_, i64>(7)? as usize,
                })
            })?;
            rows.collect()
        })
    }

    /// The ordinals of every live (not deleted) document.
    pub fn live_ordinals(&self) -> Result<Vec<u32>> {
        self.with_reader(|c| {
            let mut st =
                c.prepare_cached("SELECT ordinal FROM documents WHERE deleted_at IS NULL")?;
            let rows = st.query_map([], |r| r.get::<_, u32>(0))?;
            rows.collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::like_prefix;

    #[test]
    fn a_prefix_is_taken_literally() {
        assert_eq!(like_prefix("a%b_c\\"), "a\\%b\\_c\\\\%");
        assert_eq!(like_prefix(""), "%");
    }
}
