//! The append-only audit log of access decisions that matter: documents shown to a user for a
//! request, re-check drops, IAM syncs with their counts, admin changes, sign-ins, and per-answer
//! receipts. Ids only, never content. Triggers in the schema refuse `UPDATE` and `DELETE` on the
//! table.

use rusqlite::{Connection, params, types::Value};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::error::Error;
use crate::store::now_us;

/// What an audit entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// Document ids shown to a user (cited or used as context) for one request.
    Shown,
    /// Documents dropped by the generation-time re-check (access revoked after retrieval).
    RecheckDrop,
    /// An IAM snapshot sync, with its counts.
    Sync,
    /// An admin change: users, roles, tokens, document grants.
    Admin,
    /// A sign-in, a refused sign-in, a logout, or sessions ended because their user was removed
    /// (`{"method", "outcome", ...}`; never a password, cookie or token).
    SignIn,
    /// A per-answer receipt (`{"receipt_id", "phase", ...}`: ids, versions and digests of what
    /// one chat answer was built from; never a question, a prompt or document text).
    Receipt,
}

impl AuditKind {
    /// Stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditKind::Shown => "shown",
            AuditKind::RecheckDrop => "recheck_drop",
            AuditKind::Sync => "sync",
            AuditKind::Admin => "admin",
            AuditKind::SignIn => "sign_in",
            AuditKind::Receipt => "receipt",
        }
    }

    fn parse(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "shown" => AuditKind::Shown,
            "recheck_drop" => AuditKind::RecheckDrop,
            "sync" => AuditKind::Sync,
            "admin" => AuditKind::Admin,
            "sign_in" => AuditKind::SignIn,
            "receipt" => AuditKind::Receipt,
            other => {
                return Err(Error::Corrupt {
                    detail: format!("unknown audit kind {other:?}"),
                });
            }
        })
    }
}

/// One audit entry.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditEntry {
    /// Monotonic sequence number.
    pub seq: i64,
    /// When it was recorded (UTC, microsecond precision).
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// What happened.
    pub kind: AuditKind,
    /// Who made an admin change or ran a sync (`None` for query-time entries).
    pub actor: Option<String>,
    /// The user the entry is about (reader for `shown`/`recheck_drop`, target of an admin
    /// change).
    pub user_id: Option<String>,
    /// The request id, for query-time entries.
    pub request_id: Option<String>,
    /// Kind-specific details as JSON (`{"doc_ids": [...]}`, the sync counts, the admin action).
    pub detail: serde_json::Value,
}

/// A filter over the audit log. All conditions are combined with AND.
#[derive(Clone, Debug, Default)]
pub struct AuditQuery {
    /// Entries about this user or made by this user as actor.
    pub user: Option<String>,
    /// Entries at or after this instant.
    pub since: Option<OffsetDateTime>,
    /// Entries strictly before this instant.
    pub until: Option<OffsetDateTime>,
    /// Only this kind.
    pub kind: Option<AuditKind>,
    /// At most this many entries (oldest first); `None` means 1000.
    pub limit: Option<usize>,
}

/// An entry to append (internal).
pub(crate) struct Record<'a> {
    pub kind: AuditKind,
    pub actor: Option<&'a str>,
    pub user_id: Option<&'a str>,
    pub request_id: Option<&'a str>,
    pub detail: serde_json::Value,
}

/// Appends one entry (inside the caller's transaction when it is part of a change).
pub(crate) fn append(c: &Connection, r: &Record<'_>) -> Result<(), Error> {
    c.prepare_cached(
        "INSERT INTO acl_audit (at_us, kind, actor, user_id, request_id, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut st| {
        st.execute(params![
            now_us(),
            r.kind.as_str(),
            r.actor,
            r.user_id,
            r.request_id,
            r.detail.to_string()
        ])
    })
    .map_err(Error::db("appending to the audit log"))?;
    Ok(())
}

pub(crate) fn to_us(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos() / 1000).unwrap_or(i64::MAX)
}

/// Every kind, in the order the API lists them.
pub const ALL_KINDS: [AuditKind; 6] = [
    AuditKind::Shown,
    AuditKind::RecheckDrop,
    AuditKind::Sync,
    AuditKind::Admin,
    AuditKind::SignIn,
    AuditKind::Receipt,
];

/// Receives every committed audit entry once, in `seq` order: an external copy of the log
/// (the appliance's JSON-lines SIEM file). SQLite stays the record; a sink that fails is
/// offered the same entries again with the next append.
pub trait AuditSink: Send {
    /// Writes `entries` (oldest first); an error leaves them to the next call.
    fn write(&mut self, entries: &[AuditEntry]) -> std::io::Result<()>;
}

/// The receipt lookup index: receipts are found by id without scanning the log. Created with
/// `IF NOT EXISTS` at open rather than by a schema migration: an older build ignores it.
pub(crate) const RECEIPT_INDEX: &str = "CREATE INDEX IF NOT EXISTS acl_audit_receipt \
     ON acl_audit(json_extract(detail, '$.receipt_id')) WHERE kind = 'receipt'";

/// The `receipt` entries of one receipt id, oldest first.
pub(crate) fn receipt(c: &Connection, receipt_id: &str) -> Result<Vec<AuditEntry>, Error> {
    rows(
        c,
        "SELECT seq, at_us, kind, actor, user_id, request_id, detail FROM acl_audit \
         WHERE kind = 'receipt' AND json_extract(detail, '$.receipt_id') = ?1 ORDER BY seq",
        vec![Value::Text(receipt_id.to_owned())],
    )
}

/// The newest `seq` (0 for an empty log), of `kinds` only when given.
pub(crate) fn max_seq(c: &Connection, kinds: Option<&[AuditKind]>) -> Result<i64, Error> {
    let mut sql = String::from("SELECT COALESCE(MAX(seq), 0) FROM acl_audit");
    if let Some(k) = kinds {
        let names: Vec<String> = k.iter().map(|k| format!("'{}'", k.as_str())).collect();
        sql.push_str(&format!(" WHERE kind IN ({})", names.join(",")));
    }
    c.query_row(&sql, [], |r| r.get(0))
        .map_err(Error::db("reading the audit log"))
}

/// Runs a query, oldest entries first.
pub(crate) fn query(c: &Connection, q: &AuditQuery) -> Result<Vec<AuditEntry>, Error> {
    query_after(c, q, 0)
}

/// [`query`] over the entries after `after` (a `seq`) only.
pub(crate) fn query_after(
    c: &Connection,
    q: &AuditQuery,
    after: i64,
) -> Result<Vec<AuditEntry>, Error> {
    let mut sql = String::from(
        "SELECT seq, at_us, kind, actor, user_id, request_id, detail FROM acl_audit WHERE seq > ?",
    );
    let mut args: Vec<Value> = vec![Value::Integer(after)];
    if let Some(u) = &q.user {
        sql.push_str(" AND (user_id = ? OR actor = ?)");
        args.push(Value::Text(u.clone()));
        args.push(Value::Text(u.clone()));
    }
    if let Some(t) = q.since {
        sql.push_str(" AND at_us >= ?");
        args.push(Value::Integer(to_us(t)));
    }
    if let Some(t) = q.until {
        sql.push_str(" AND at_us < ?");
        args.push(Value::Integer(to_us(t)));
    }
    if let Some(k) = q.kind {
        sql.push_str(" AND kind = ?");
        args.push(Value::Text(k.as_str().to_owned()));
    }
    sql.push_str(" ORDER BY seq LIMIT ?");
    let limit = q.limit.unwrap_or(1000);
    args.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
    rows(c, &sql, args)
}

pub(crate) fn rows(c: &Connection, sql: &str, args: Vec<Value>) -> Result<Vec<AuditEntry>, Error> {
    let e = Error::db("querying the audit log");
    let mut st = c.prepare_cached(sql).map_err(e)?;
    let rows = st
        .query_map(rusqlite::params_from_iter(args), |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, Option<String>>(5)?,
                r.get::<_, String>(6)?,
            ))
        })
        .map_err(Error::db("querying the audit log"))?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, at_us, kind, actor, user_id, request_id, detail) =
            row.map_err(Error::db("reading the audit log"))?;
        let at =
            OffsetDateTime::from_unix_timestamp_nanos(i128::from(at_us) * 1000).map_err(|_| {
                Error::Corrupt {
                    detail: format!("audit entry {seq} has timestamp {at_us} out of range"),
                }
            })?;
        let detail = serde_json::from_str(&detail).map_err(|_| Error::Corrupt {
            detail: format!("audit entry {seq} has malformed detail JSON"),
        })?;
        out.push(AuditEntry {
            seq,
            at,
            kind: AuditKind::parse(&kind)?,
            actor,
            user_id,
            request_id,
            detail,
        });
    }
    Ok(out)
}
