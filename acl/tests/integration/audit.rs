//! The audit log: what is recorded, queries by user and time range, append-only.

use airlock_acl::{AuditKind, AuditQuery, DocGrants, NewUser, Role};
use time::{Duration, OffsetDateTime};

use crate::common::temp_acl;

#[test]
fn audit_records_decisions_and_is_queryable_and_append_only() {
    let (dir, acl) = temp_acl();
    let start = OffsetDateTime::now_utc() - Duration::seconds(1);
    acl.add_user(
        "cli",
        "admin",
        &NewUser {
            groups: vec![],
            roles: vec![Role::Admin],
            local: true,
        },
    )
    .unwrap();
    acl.sync_snapshot("admin", &br#"{"user": "u017", "groups": ["risk"]}"#[..])
        .unwrap();
    acl.set_document_grants(
        "admin",
        "doc-1",
        &DocGrants {
            users: vec![],
            groups: vec!["risk".into()],
        },
    )
    .unwrap();
    acl.audit_shown("req-1", "u017", &["doc-1"]).unwrap();
    acl.audit_recheck_drop("req-2", "u017", &["doc-2"]).unwrap();
    acl.audit_shown("req-3", "u018", &["doc-3"]).unwrap();

    let all = acl.audit_query(&AuditQuery::default()).unwrap();
    let kinds: Vec<AuditKind> = all.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            AuditKind::Admin,
            AuditKind::Sync,
            AuditKind::Admin,
            AuditKind::Shown,
            AuditKind::RecheckDrop,
            AuditKind::Shown
        ]
    );
    assert!(
        all.windows(2)
            .all(|w| w[0].seq < w[1].seq && w[0].at <= w[1].at)
    );
    assert_eq!(all[1].detail["users_added"], 1);
    assert_eq!(all[1].detail["users_access_changed"], 0);
    assert_eq!(all[2].detail["doc_id"], "doc-1");

    let mine = acl
        .audit_query(&AuditQuery {
            user: Some("u017".into()),
            since: Some(start),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(mine.len(), 2);
    assert_eq!(mine[0].request_id.as_deref(), Some("req-1"));
    assert_eq!(mine[0].detail["doc_ids"][0], "doc-1");
    assert_eq!(mine[1].kind, AuditKind::RecheckDrop);

    // Entries made by an actor are found by that user too.
    let by_admin = acl
        .audit_query(&AuditQuery {
            user: Some("admin".into()),
            kind: Some(AuditKind::Admin),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(by_admin.len(), 2);

    let future = acl
        .audit_query(&AuditQuery {
            since: Some(OffsetDateTime::now_utc() + Duration::hours(1)),
            ..Default::default()
        })
        .unwrap();
    assert!(future.is_empty());
    let past = acl
        .audit_query(&AuditQuery {
            until: Some(start),
            ..Default::default()
        })
        .unwrap();
    assert!(past.is_empty());
    let limited = acl
        .audit_query(&AuditQuery {
            limit: Some(2),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(limited.len(), 2);

    let json = serde_json::to_value(&mine[0]).unwrap();
    assert_eq!(json["kind"], "shown");
    assert!(json["at"].as_str().unwrap().ends_with('Z'));

    // Append-only: the schema refuses edits and deletions.
    let c = rusqlite::Connection::open(dir.path().join("airlock.db")).unwrap();
    assert!(c.execute("UPDATE acl_audit SET user_id = 'x'", []).is_err());
    assert!(c.execute("DELETE FROM acl_audit", []).is_err());
    assert_eq!(acl.audit_query(&AuditQuery::default()).unwrap().len(), 6);
}

/// A sink that keeps what it is given; fails while `fail` is set.
struct Kept {
    seen: std::sync::Arc<parking_lot::Mutex<Vec<i64>>>,
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl airlock_acl::AuditSink for Kept {
    fn write(&mut self, entries: &[airlock_acl::AuditEntry]) -> std::io::Result<()> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("disk full"));
        }
        self.seen.lock().extend(entries.iter().map(|e| e.seq));
        Ok(())
    }
}

#[test]
fn receipts_are_found_by_id_the_state_seq_follows_acl_changes_and_the_sink_gets_every_entry_once() {
    let (dir, acl) = temp_acl();
    acl.sync_snapshot("admin", &br#"{"user": "u017", "groups": ["risk"]}"#[..])
        .unwrap();
    let after_sync = acl.state_seq();
    assert!(after_sync > 0);
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    acl.attach_audit_sink(
        Box::new(Kept {
            seen: seen.clone(),
            fail: fail.clone(),
        }),
        Some(0),
    )
    .unwrap();
    // The backlog after `Some(0)`: the sync's entry.
    assert_eq!(*seen.lock(), vec![after_sync]);

    let r1 = acl
        .audit_receipt(
            "req-1",
            "u017",
            serde_json::json!({"receipt_id": "rcpt-1", "phase": "served"}),
        )
        .unwrap();
    acl.audit_shown("req-1", "u017", &["doc-1"]).unwrap();
    let r2 = acl
        .audit_receipt(
            "req-1",
            "u017",
            serde_json::json!({"receipt_id": "rcpt-1", "phase": "cited"}),
        )
        .unwrap();
    acl.audit_receipt("req-2", "u017", serde_json::json!({"receipt_id": "rcpt-2"}))
        .unwrap();
    assert!(
        acl.audit_receipt("req-3", "u017", serde_json::json!({}))
            .is_err()
    );
    // Query-time entries are not ACL changes.
    assert_eq!(acl.state_seq(), after_sync);
    let got = acl.receipt_entries("rcpt-1").unwrap();
    assert_eq!(got.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![r1, r2]);
    assert!(got.iter().all(|e| e.kind == AuditKind::Receipt));
    assert_eq!(got[0].user_id.as_deref(), Some("u017"));
    assert!(acl.receipt_entries("rcpt-9").unwrap().is_empty());

    // A failing sink loses nothing: the next append hands it the missed entries too.
    fail.store(true, std::sync::atomic::Ordering::SeqCst);
    acl.audit_shown("req-4", "u017", &["doc-1"]).unwrap();
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    acl.sync_snapshot("admin", &br#"{"user": "u018", "groups": ["risk"]}"#[..])
        .unwrap();
    assert!(acl.state_seq() > after_sync);
    let all: Vec<i64> = acl
        .audit_query(&AuditQuery::default())
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(*seen.lock(), all, "every entry once, in order");

    // Reopened: the state seq is the newest admin/sync entry's.
    let newest = acl.state_seq();
    drop(acl);
    let again = airlock_acl::Acl::open(dir.path().join("airlock.db")).unwrap();
    assert_eq!(again.state_seq(), newest);
    assert_eq!(again.receipt_entries("rcpt-2").unwrap().len(), 1);
}
