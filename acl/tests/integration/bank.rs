//! The real bank-dev IAM snapshots: v1 then v2 must yield exactly the published (user, doc)
//! gains and losses; bad snapshots apply nothing; re-applying is a no-op.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use airlock_acl::{Acl, Error, SyncCounts};
use serde::Deserialize;

use crate::common::{brute_force_from_rows, doc_ids, published, shared_dir, temp_acl};

fn bank(file: &str) -> PathBuf {
    shared_dir().join("datasets/bank-dev").join(file)
}

fn sync_file(acl: &Acl, file: &str) -> SyncCounts {
    let f = BufReader::new(File::open(bank(file)).unwrap());
    acl.sync_snapshot("test", f).unwrap()
}

#[derive(Deserialize)]
struct Pair {
    user: String,
    doc: String,
}

#[derive(Deserialize)]
struct Changes {
    access_gained: Vec<Pair>,
    access_lost: Vec<Pair>,
}

/// (user, doc id) pairs readable in the current state.
fn pairs(acl: &Acl, names: &BTreeMap<u32, String>) -> BTreeSet<(String, String)> {
    published(acl)
        .into_iter()
        .flat_map(|(u, docs)| {
            docs.into_iter()
                .map(move |d| (u.clone(), names[&d].clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn v1_then_v2_yields_exactly_the_published_changes() {
    let (dir, acl) = temp_acl();
    let db = dir.path().join("airlock.db");

    let c1 = sync_file(&acl, "iam_v1.jsonl");
    assert_eq!(c1.users_added, 60);
    assert_eq!(c1.users_removed, 0);
    // 2497 documents, 8 of them without any grant.
    assert_eq!(c1.grants_changed, 2497 - 8);
    assert_eq!(published(&acl), brute_force_from_rows(&db));
    let names = doc_ids(&db);
    assert_eq!(names.len(), 2497);
    let before = pairs(&acl, &names);

    // Deny by default: the 8 documents without a grant are readable by nobody.
    for d in [
        "doc-00213",
        "doc-00522",
        "doc-00572",
        "doc-00721",
        "doc-00985",
        "doc-01335",
        "doc-02269",
        "doc-02434",
    ] {
        let o = acl.ordinal(d).unwrap().unwrap();
        assert!(
            acl.snapshot()
                .user_ids()
                .iter()
                .all(|u| !acl.can_read(u, o))
        );
    }

    let c2 = sync_file(&acl, "iam_v2.jsonl");
    assert_eq!(published(&acl), brute_force_from_rows(&db));
    let after = pairs(&acl, &doc_ids(&db));

    let changes: Changes =
        serde_json::from_reader(File::open(bank("changes_v1_to_v2.json")).unwrap()).unwrap();
    let expect = |v: &[Pair]| -> BTreeSet<(String, String)> {
        v.iter().map(|p| (p.user.clone(), p.doc.clone())).collect()
    };
    let gained: BTreeSet<_> = after.difference(&before).cloned().collect();
    let lost: BTreeSet<_> = before.difference(&after).cloned().collect();
    assert_eq!(gained.len(), 210);
    assert_eq!(lost.len(), 1326);
    assert_eq!(gained, expect(&changes.access_gained));
    assert_eq!(lost, expect(&changes.access_lost));

    let affected: BTreeSet<&str> = gained
        .iter()
        .chain(&lost)
        .map(|(u, _)| u.as_str())
        .collect();
    assert_eq!(
        c2,
        SyncCounts {
            users_added: 0,
            users_removed: 1,
            // u035 left deal-team, u047 joined hr, u056 (all-staff, treasury) removed.
            memberships_changed: 4,
            // doc-01690 re-permissioned, u056 dropped from three documents.
            grants_changed: 4,
            users_access_changed: affected.len(),
        }
    );
    assert!(acl.user("u056").is_none());
    assert!(acl.allow_set("u056").is_empty());

    // Idempotent: the same snapshot again changes nothing.
    let generation = acl.snapshot().generation();
    let again = sync_file(&acl, "iam_v2.jsonl");
    assert_eq!(again, SyncCounts::default());
    assert_eq!(pairs(&acl, &doc_ids(&db)), after);
    assert!(acl.snapshot().generation() > generation);

    // A restart materialises the same state from the rows.
    drop(acl);
    let reopened = Acl::open(&db).unwrap();
    assert_eq!(pairs(&reopened, &doc_ids(&db)), after);
}

fn rejected(acl: &Acl, input: &str) -> Vec<usize> {
    match acl.sync_snapshot("test", input.as_bytes()) {
        Err(e @ Error::Snapshot { .. }) => {
            assert!(e.is_user_error());
            let Error::Snapshot { errors, .. } = e else {
                unreachable!()
            };
            errors.iter().map(|l| l.line).collect()
        }
        other => panic!("expected a rejected snapshot, got {other:?}"),
    }
}

#[test]
fn bad_snapshots_apply_nothing_and_name_the_line() {
    let (dir, acl) = temp_acl();
    let db = dir.path().join("airlock.db");
    sync_file(&acl, "iam_v1.jsonl");
    let state = published(&acl);
    let generation = acl.snapshot().generation();
    let v2 = std::fs::read_to_string(bank("iam_v2.jsonl")).unwrap();
    let lines: Vec<&str> = v2.lines().collect();

    let with_line = |at: usize, bad: &str| -> String {
        let mut l = lines.clone();
        l.insert(at, bad);
        l.join("\n")
    };
    // A bad JSON line in the middle of an otherwise valid v2.
    assert_eq!(
        rejected(&acl, &with_line(100, "{\"doc\": \"doc-9\", ")),
        [101]
    );
    // An unknown field.
    let e = acl
        .sync_snapshot(
            "test",
            with_line(3, r#"{"user": "u900", "groups": [], "roles": ["admin"]}"#).as_bytes(),
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("line 4: unknown field `roles`"),
        "{e}"
    );
    // A duplicate user line.
    let e = acl
        .sync_snapshot(
            "test",
            with_line(lines.len(), r#"{"user": "u001", "groups": ["treasury"]}"#).as_bytes(),
        )
        .unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "line {}: duplicate user \"u001\" (first on line 1)",
            lines.len() + 1
        )),
        "{e}"
    );
    // A duplicate document line.
    assert_eq!(
        rejected(
            &acl,
            &with_line(
                70,
                r#"{"doc": "doc-00001", "users": ["u008"], "groups": []}"#
            )
        ),
        [71]
    );

    // Nothing was applied, nothing was published, the rows are untouched.
    assert_eq!(published(&acl), state);
    assert_eq!(brute_force_from_rows(&db), state);
    assert_eq!(acl.snapshot().generation(), generation);
    assert!(acl.user("u900").is_none());
    // The failed syncs left no audit entry.
    let syncs = acl
        .audit_query(&airlock_acl::AuditQuery {
            kind: Some(airlock_acl::AuditKind::Sync),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(syncs.len(), 1);
}
