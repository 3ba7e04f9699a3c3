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
