//! Shared helpers: temporary databases, the dataset path, and the brute-force evaluation of
//! every user's readable set straight from the SQLite rows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use airlock_acl::Acl;
use rusqlite::Connection;

/// A fresh ACL on a temporary database file (kept alive by the returned guard).
pub fn temp_acl() -> (tempfile::TempDir, Acl) {
    let dir = tempfile::tempdir().unwrap();
    let acl = Acl::open(dir.path().join("airlock.db")).unwrap();
    (dir, acl)
}

/// `/work/shared` (or `AIRLOCK_SHARED_DIR`).
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("AIRLOCK_SHARED_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    }
}

/// Every existing user → the set of readable ordinals, computed naively from the rows:
/// `d` is readable by `u` iff `u` exists and the grant of `d` names `u` or a group `u` is in.
pub fn brute_force_from_rows(path: &Path) -> BTreeMap<String, BTreeSet<u32>> {
    let c = Connection::open(path).unwrap();
    let strings = |sql: &str| -> Vec<(String, String)> {
        c.prepare(sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let grants = |sql: &str| -> Vec<(u32, String)> {
        c.prepare(sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let users: Vec<String> = c
        .prepare("SELECT user_id FROM acl_users")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let memberships = strings("SELECT user_id, group_id FROM acl_memberships");
    let user_grants = grants("SELECT ordinal, user_id FROM acl_grant_users");
    let group_grants = grants("SELECT ordinal, group_id FROM acl_grant_groups");
    let mut out = BTreeMap::new();
    for u in users {
        let groups: BTreeSet<&str> = memberships
            .iter()
            .filter(|(m, _)| *m == u)
            .map(|(_, g)| g.as_str())
            .collect();
        let mut docs = BTreeSet::new();
        for (d, name) in &user_grants {
            if *name == u {
                docs.insert(*d);
            }
        }
        for (d, g) in &group_grants {
            if groups.contains(g.as_str()) {
                docs.insert(*d);
            }
        }
        out.insert(u, docs);
    }
    out
}

/// Every user's readable set as the ACL currently publishes it (from one consistent snapshot).
pub fn published(acl: &Acl) -> BTreeMap<String, BTreeSet<u32>> {
    let s = acl.snapshot();
    s.user_ids()
        .into_iter()
        .map(|u| {
            let set = s.allow_set(&u).bitmap().iter().collect();
            (u, set)
        })
        .collect()
}

/// Maps ordinal → external document id from the shared table.
pub fn doc_ids(path: &Path) -> BTreeMap<u32, String> {
    let c = Connection::open(path).unwrap();
    c.prepare("SELECT ordinal, doc_id FROM doc_ordinals")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}
