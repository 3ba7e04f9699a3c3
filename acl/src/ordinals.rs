//! External document id ↔ dense `u32` ordinal, shared by ACL grants and the document store.
//!
//! Ordinals are assigned once and never reused, so a bitmap bit always means the same document.
//! The table lives in the shared SQLite file; callers pass their own connection or transaction.

use rusqlite::{Connection, OptionalExtension, params};

/// Creates the ordinal table if it does not exist (idempotent).
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS doc_ordinals (
             ordinal INTEGER PRIMARY KEY,
             doc_id  TEXT NOT NULL UNIQUE
         ) STRICT;",
    )
}

/// Returns the ordinal of `doc_id`, assigning the next free one if it has none yet.
pub fn ensure(conn: &Connection, doc_id: &str) -> rusqlite::Result<u32> {
    if let Some(o) = lookup(conn, doc_id)? {
        return Ok(o);
    }
    let next: i64 = conn.query_row(
        "SELECT COALESCE(MAX(ordinal) + 1, 0) FROM doc_ordinals",
        [],
        |r| r.get(0),
    )?;
    let next =
        u32::try_from(next).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(0, next))?;
    conn.execute(
        "INSERT INTO doc_ordinals (ordinal, doc_id) VALUES (?1, ?2)",
        params![next, doc_id],
    )?;
    Ok(next)
}

/// Like [`ensure`] for many ids at once (prepared statements, one `MAX` query): returns the
/// ordinals in input order. Call it inside a transaction so concurrent writers cannot interleave.
pub fn ensure_many<'a>(
    conn: &Connection,
    doc_ids: impl IntoIterator<Item = &'a str>,
) -> rusqlite::Result<Vec<u32>> {
    let mut find = conn.prepare_cached("SELECT ordinal FROM doc_ordinals WHERE doc_id = ?1")?;
    let mut add =
        conn.prepare_cached("INSERT INTO doc_ordinals (ordinal, doc_id) VALUES (?1, ?2)")?;
    let mut next: Option<i64> = None;
    let mut out = Vec::new();
    for id in doc_ids {
        if let Some(o) = find.query_row(params![id], |r| r.get(0)).optional()? {
            out.push(o);
            continue;
        }
        let n = match next {
            Some(n) => n,
            None => conn.query_row(
                "SELECT COALESCE(MAX(ordinal) + 1, 0) FROM doc_ordinals",
                [],
                |r| r.get(0),
            )?,
        };
        let o = u32::try_from(n).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(0, n))?;
        add.execute(params![o, id])?;
        next = Some(n + 1);
        out.push(o);
    }
    Ok(out)
}

/// The ordinal of `doc_id`, if it has one.
pub fn lookup(conn: &Connection, doc_id: &str) -> rusqlite::Result<Option<u32>> {
    conn.query_row(
        "SELECT ordinal FROM doc_ordinals WHERE doc_id = ?1",
        params![doc_id],
        |r| r.get(0),
    )
    .optional()
}

/// The external id of an ordinal, if assigned.
pub fn doc_id(conn: &Connection, ordinal: u32) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT doc_id FROM doc_ordinals WHERE ordinal = ?1",
        params![ordinal],
        |r| r.get(0),
    )
    .optional()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_are_dense_stable_and_unique() {
        let c = Connection::open_in_memory().unwrap();
        migrate(&c).unwrap();
        assert_eq!(ensure(&c, "a").unwrap(), 0);
        assert_eq!(ensure(&c, "b").unwrap(), 1);
        assert_eq!(ensure(&c, "a").unwrap(), 0);
        assert_eq!(lookup(&c, "c").unwrap(), None);
        assert_eq!(doc_id(&c, 1).unwrap().as_deref(), Some("b"));
        assert_eq!(ensure_many(&c, ["b", "c", "d", "c"]).unwrap(), [1, 2, 3, 2]);
        assert_eq!(ensure(&c, "e").unwrap(), 4);
    }
}
