//! Read-only queries for the operator console (`GET /v1/admin/...`): the audit log newest first
//! with a document filter and a cursor, the IAM sync runs, and each group's granted documents.
//! Ids, counts and times only, never content; every query is bounded by its caller's limit.

use std::collections::BTreeMap;

use roaring::RoaringBitmap;
use rusqlite::types::Value;
use time::OffsetDateTime;

use crate::acl::Acl;
use crate::audit::{self, AuditEntry, AuditKind};
use crate::error::Error;

/// A filter over the audit log, read newest first (AND of the conditions).
#[derive(Clone, Debug, Default)]
pub struct AuditSearch {
    /// Entries about this user or made by this user as actor.
    pub user: Option<String>,
    /// Entries naming this document id (`doc_id`, or in `doc_ids` / `documents[].doc_id`).
    pub doc_id: Option<String>,
    /// Entries at or after this instant.
    pub since: Option<OffsetDateTime>,
    /// Entries strictly before this instant.
    pub until: Option<OffsetDateTime>,
    /// Only these kinds (empty: every kind).
    pub kinds: Vec<AuditKind>,
    /// Only `admin` entries with this `detail.action` (e.g. `document_put`).
    pub action: Option<String>,
    /// Only IAM sync runs: full syncs (`sync` entries about no single user) and failed ones
    /// (`admin` entries with `detail.action` = `sync_failed`).
    pub sync_runs: bool,
    /// Entries with a `seq` below this one (the cursor of the next page).
    pub before_seq: Option<i64>,
    /// At most this many entries.
    pub limit: usize,
}

impl Acl {
    /// Audit entries matching `q`, newest first (the console's audit search and histories).
    pub fn audit_search(&self, q: &AuditSearch) -> Result<Vec<AuditEntry>, Error> {
        let mut sql = String::from(
            "SELECT seq, at_us, kind, actor, user_id, request_id, detail FROM acl_audit WHERE 1",
        );
        let mut args: Vec<Value> = Vec::new();
        if let Some(s) = q.before_seq {
            sql.push_str(" AND seq < ?");
            args.push(Value::Integer(s));
        }
        if let Some(u) = &q.user {
            sql.push_str(" AND (user_id = ? OR actor = ?)");
            args.push(Value::Text(u.clone()));
            args.push(Value::Text(u.clone()));
        }
        if let Some(d) = &q.doc_id {
            sql.push_str(
                " AND (json_extract(detail, '$.doc_id') = ? \
                 OR EXISTS (SELECT 1 FROM json_each(detail, '$.doc_ids') WHERE value = ?) \
                 OR EXISTS (SELECT 1 FROM json_each(detail, '$.documents') \
                            WHERE json_extract(value, '$.doc_id') = ?))",
            );
            for _ in 0..3 {
                args.push(Value::Text(d.clone()));
            }
        }
        if let Some(t) = q.since {
            sql.push_str(" AND at_us >= ?");
            args.push(Value::Integer(audit::to_us(t)));
        }
        if let Some(t) = q.until {
            sql.push_str(" AND at_us < ?");
            args.push(Value::Integer(audit::to_us(t)));
        }
        if !q.kinds.is_empty() {
            let marks = vec!["?"; q.kinds.len()].join(",");
            sql.push_str(&format!(" AND kind IN ({marks})"));
            args.extend(q.kinds.iter().map(|k| Value::Text(k.as_str().to_owned())));
        }
        if let Some(a) = &q.action {
            sql.push_str(" AND kind = 'admin' AND json_extract(detail, '$.action') = ?");
            args.push(Value::Text(a.clone()));
        }
        if q.sync_runs {
            sql.push_str(
                " AND ((kind = 'sync' AND user_id IS NULL) OR (kind = 'admin' \
                 AND json_extract(detail, '$.action') = 'sync_failed'))",
            );
        }
        sql.push_str(" ORDER BY seq DESC LIMIT ?");
        args.push(Value::Integer(i64::try_from(q.limit).unwrap_or(i64::MAX)));
        audit::rows(&self.side.lock(), &sql, args)
    }

    /// Every group named by a grant, with the ordinals of the documents it grants (the
    /// console's groups page; members come from [`Acl::snapshot`]).
    pub fn group_grants(&self) -> Result<BTreeMap<String, RoaringBitmap>, Error> {
        let conn = self.side.lock();
        let mut st = conn
            .prepare_cached("SELECT group_id, ordinal FROM acl_grant_groups")
            .map_err(Error::db("reading group grants"))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?)))
            .map_err(Error::db("reading group grants"))?;
        let mut out: BTreeMap<String, RoaringBitmap> = BTreeMap::new();
        for row in rows {
            let (g, ordinal) = row.map_err(Error::db("reading group grants"))?;
            out.entry(g).or_default().insert(ordinal);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DocGrants, NewUser};

    #[test]
    fn the_search_reads_newest_first_by_document_and_pages_with_a_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let acl = Acl::open(dir.path().join("a.db")).unwrap();
        acl.add_user("t", "u1", &NewUser::default()).unwrap();
        for (doc, v) in [("d1", "v1"), ("d2", "v1"), ("d1", "v2")] {
            acl.audit_admin(
                "ops",
                serde_json::json!({"action": "document_put", "doc_id": doc, "version": v}),
            )
            .unwrap();
        }
        acl.audit_shown("r1", "u1", &["d2", "d1"]).unwrap();
        acl.set_document_grants(
            "ops",
            "d1",
            &DocGrants {
                users: vec![],
                groups: vec!["g1".into(), "g2".into()],
            },
        )
        .unwrap();
        let mut q = AuditSearch {
            doc_id: Some("d1".into()),
            limit: 2,
            ..AuditSearch::default()
        };
        let page1 = acl.audit_search(&q).unwrap();
        assert_eq!(page1.len(), 2);
        assert!(page1[0].seq > page1[1].seq, "newest first");
        q.before_seq = Some(page1[1].seq);
        let page2 = acl.audit_search(&q).unwrap();
        let all: Vec<i64> = page1.iter().chain(&page2).map(|e| e.seq).collect();
        // d1: two puts, one shown, one grant change; d2's put is not among them.
        assert_eq!(all.len(), 4, "{all:?}");
        assert!(page2.iter().all(|e| e.seq < page1[1].seq));
        let puts = acl
            .audit_search(&AuditSearch {
                doc_id: Some("d1".into()),
                action: Some("document_put".into()),
                limit: 10,
                ..AuditSearch::default()
            })
            .unwrap();
        let versions: Vec<&str> = puts
            .iter()
            .map(|e| e.detail["version"].as_str().unwrap())
            .collect();
        assert_eq!(versions, ["v2", "v1"]);
        let groups = acl.group_grants().unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups["g1"].len(), 1);
    }
}
