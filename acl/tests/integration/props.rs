//! Property test: for random sequences of grant / revoke / membership / user / snapshot
//! operations, every user's published set (and `can_read` of every document) equals (1) a
//! brute-force evaluation from the SQLite rows and (2) an independent reference model of the
//! operations (the flat union); every change's access-changed count is exact; a restart agrees
//! too.

use std::collections::{BTreeMap, BTreeSet};

use airlock_acl::{Acl, DocGrants, Error, NewUser, UserSpec};
use proptest::prelude::*;

use crate::common::{brute_force_from_rows, published};

const USERS: u8 = 6;
const GROUPS: u8 = 4;
const DOCS: u8 = 10;

#[derive(Clone, Debug)]
enum Op {
    /// Replace a document's grant (an empty one revokes).
    Grant {
        doc: u8,
        users: BTreeSet<u8>,
        groups: BTreeSet<u8>,
    },
    /// `PUT /v1/acl/users/{id}`: set groups, creating a local user if new.
    PutUser {
        user: u8,
        groups: BTreeSet<u8>,
    },
    /// `airlock user add` (not local) — fails if the user exists.
    AddUser {
        user: u8,
        groups: BTreeSet<u8>,
    },
    RemoveUser {
        user: u8,
    },
    Snapshot {
        users: BTreeMap<u8, BTreeSet<u8>>,
        docs: BTreeMap<u8, (BTreeSet<u8>, BTreeSet<u8>)>,
    },
}

fn set(max: u8) -> impl Strategy<Value = BTreeSet<u8>> {
    prop::collection::btree_set(0..max, 0..3)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..DOCS, set(USERS), set(GROUPS))
            .prop_map(|(doc, users, groups)| Op::Grant { doc, users, groups }),
        2 => (0..USERS, set(GROUPS)).prop_map(|(user, groups)| Op::PutUser { user, groups }),
        1 => (0..USERS, set(GROUPS)).prop_map(|(user, groups)| Op::AddUser { user, groups }),
        1 => (0..USERS).prop_map(|user| Op::RemoveUser { user }),
        2 => (
            prop::collection::btree_map(0..USERS, set(GROUPS), 0..5),
            prop::collection::btree_map(0..DOCS, (set(USERS), set(GROUPS)), 0..8),
        )
            .prop_map(|(users, docs)| Op::Snapshot { users, docs }),
    ]
}

/// The reference: rows as plain maps, evaluated naively.
#[derive(Default)]
struct Reference {
    /// user → (groups, local)
    users: BTreeMap<u8, (BTreeSet<u8>, bool)>,
    grants: BTreeMap<u8, (BTreeSet<u8>, BTreeSet<u8>)>,
}

impl Reference {
    fn readable(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.users
            .iter()
            .map(|(u, (groups, _))| {
                let docs = self
                    .grants
                    .iter()
                    .filter(|(_, (us, gs))| us.contains(u) || !gs.is_disjoint(groups))
                    .map(|(d, _)| doc(*d))
                    .collect();
                (user(*u), docs)
            })
            .collect()
    }
}

fn user(u: u8) -> String {
    format!("u{u}")
}
fn group(g: u8) -> String {
    format!("g{g}")
}
fn doc(d: u8) -> String {
    format!("d{d}")
}
fn names(xs: &BTreeSet<u8>, f: fn(u8) -> String) -> Vec<String> {
    xs.iter().map(|x| f(*x)).collect()
}

fn apply(acl: &Acl, r: &mut Reference, op: &Op) {
    match op {
        Op::Grant {
            doc: d,
            users,
            groups,
        } => {
            let before = r.readable();
            let out = acl
                .set_document_grants(
                    "t",
                    &doc(*d),
                    &DocGrants {
                        users: names(users, user),
                        groups: names(groups, group),
                    },
                )
                .unwrap();
            r.grants.insert(*d, (users.clone(), groups.clone()));
            assert_eq!(out.users_access_changed, changed(&before, &r.readable()));
        }
        Op::PutUser { user: u, groups } => {
            let before = r.readable();
            let out = acl
                .put_user(
                    "t",
                    &user(*u),
                    &UserSpec {
                        groups: names(groups, group),
                        roles: None,
                    },
                )
                .unwrap();
            assert_eq!(out.created, !r.users.contains_key(u));
            r.users.entry(*u).or_insert((BTreeSet::new(), true)).0 = groups.clone();
            assert_eq!(
                out.access_changed,
                changed(&before, &r.readable()) > 0,
                "put_user access_changed"
            );
        }
        Op::AddUser { user: u, groups } => {
            let res = acl.add_user(
                "t",
                &user(*u),
                &NewUser {
                    groups: names(groups, group),
                    roles: vec![],
                    local: false,
                },
            );
            if r.users.contains_key(u) {
                assert!(matches!(res, Err(Error::UserExists { .. })));
            } else {
                res.unwrap();
                r.users.insert(*u, (groups.clone(), false));
            }
        }
        Op::RemoveUser { user: u } => {
            let res = acl.remove_user("t", &user(*u));
            if r.users.remove(u).is_some() {
                res.unwrap();
            } else {
                assert!(matches!(res, Err(Error::UnknownUser { .. })));
            }
        }
        Op::Snapshot { users, docs } => {
            let mut text = String::new();
            for (u, gs) in users {
                text.push_str(
                    &serde_json::json!({"user": user(*u), "groups": names(gs, group)}).to_string(),
                );
                text.push('\n');
            }
            for (d, (us, gs)) in docs {
                text.push_str(
                    &serde_json::json!({"doc": doc(*d), "users": names(us, user),
                                        "groups": names(gs, group)})
                    .to_string(),
                );
                text.push('\n');
            }
            // Random snapshots may be empty: applied on purpose here (refusal: grants.rs).
            let on_purpose = airlock_acl::SyncOptions { allow_empty: true };
            let counts = acl
                .sync_snapshot_with("t", text.as_bytes(), on_purpose)
                .unwrap();
            let before = r.readable();
            let removed = r
                .users
                .iter()
                .filter(|(u, (_, local))| !local && !users.contains_key(u))
                .count();
            r.users
                .retain(|u, (_, local)| *local || users.contains_key(u));
            for (u, gs) in users {
                r.users.entry(*u).or_insert((BTreeSet::new(), false)).0 = gs.clone();
            }
            r.grants = docs.clone();
            let after = r.readable();
            let all: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
            let empty = BTreeSet::new();
            let changed = all
                .iter()
                .filter(|u| before.get(**u).unwrap_or(&empty) != after.get(**u).unwrap_or(&empty))
                .count();
            assert_eq!(counts.users_removed, removed);
            assert_eq!(counts.users_access_changed, changed);
            // Idempotent: the same snapshot again is a no-op.
            let again = acl
                .sync_snapshot_with("t", text.as_bytes(), on_purpose)
                .unwrap();
            assert_eq!(again, airlock_acl::SyncCounts::default());
        }
    }
}

/// How many users' readable sets differ between two evaluations (absent: empty).
fn changed(
    before: &BTreeMap<String, BTreeSet<String>>,
    after: &BTreeMap<String, BTreeSet<String>>,
) -> usize {
    let empty = BTreeSet::new();
    let all: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    all.iter()
        .filter(|u| before.get(**u).unwrap_or(&empty) != after.get(**u).unwrap_or(&empty))
        .count()
}

fn check(acl: &Acl, db: &std::path::Path, r: &Reference) {
    let from_rows = brute_force_from_rows(db);
    let published = published(acl);
    assert_eq!(
        published, from_rows,
        "published sets vs brute force from rows"
    );
    let ids = crate::common::doc_ids(db);
    let named: BTreeMap<String, BTreeSet<String>> = published
        .into_iter()
        .map(|(u, ds)| (u, ds.into_iter().map(|d| ids[&d].clone()).collect()))
        .collect();
    let readable = r.readable();
    assert_eq!(named, readable, "published sets vs reference model");
    let empty = BTreeSet::new();
    for (&o, id) in &ids {
        for u in 0..USERS {
            let want = readable.get(&user(u)).unwrap_or(&empty).contains(id);
            assert_eq!(
                acl.can_read(&user(u), o),
                want,
                "can_read({}, {id})",
                user(u)
            );
        }
    }
    for u in 0..USERS {
        if !r.users.contains_key(&u) {
            assert!(acl.allow_set(&user(u)).is_empty());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn published_sets_match_brute_force(ops in prop::collection::vec(op(), 1..14)) {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("airlock.db");
        let acl = Acl::open(&db).unwrap();
        let mut r = Reference::default();
        for op in &ops {
            apply(&acl, &mut r, op);
            check(&acl, &db, &r);
        }
        drop(acl);
        let reopened = Acl::open(&db).unwrap();
        check(&reopened, &db, &r);
    }
}
