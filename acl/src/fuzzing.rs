//! Fuzz harnesses (not API). Each `pub fn` takes arbitrary bytes and must never panic: a panic
//! is a finding. The same bodies run under `cargo fuzz` (`fuzz/fuzz_targets/acl_snapshot.rs`)
//! and as plain tests over `fuzz/corpus/acl_snapshot/`, `fuzz/regressions/acl_snapshot/` and
//! proptest mutations of them (the tests below).

use std::collections::HashSet;

use crate::error::{Error, IdKind, check_id};
use crate::snapshot::{self, MAX_REPORTED_LINE_ERRORS, Snapshot};

/// Validates `data` as an IAM snapshot exactly as [`crate::Acl::sync_snapshot`] does before it
/// applies anything, without applying it. Returns `(users, documents)` on success.
pub fn validate_snapshot(data: &[u8]) -> Result<(usize, usize), Error> {
    snapshot::parse(data).map(|s| (s.users.len(), s.docs.len()))
}

/// Target `acl_snapshot`: `data` is an IAM snapshot (JSON Lines).
///
/// Invariants: an accepted snapshot has one entry per non-blank line, valid and unique ids, and
/// its re-serialisation parses to the same entries; a refused one is [`Error::Snapshot`] (a
/// user error) naming at most [`MAX_REPORTED_LINE_ERRORS`] distinct lines in order, each a
/// line of the input.
pub fn acl_snapshot(data: &[u8]) {
    let lines = data.split(|&b| b == b'\n').count();
    match snapshot::parse(data) {
        Ok(snap) => {
            let non_blank = data
                .split(|&b| b == b'\n')
                .filter(|l| std::str::from_utf8(l).is_ok_and(|t| !t.trim().is_empty()))
                .count();
            assert_eq!(snap.users.len() + snap.docs.len(), non_blank);
            check_ids(&snap);
            let text = reserialise(&snap);
            let again = snapshot::parse(text.as_bytes()).expect("a snapshot's own JSONL parses");
            assert_eq!(owned(&again), owned(&snap), "snapshot round trip");
        }
        Err(e) => {
            assert!(e.is_user_error(), "{e:?}");
            let Error::Snapshot { errors, total } = e else {
                panic!("a malformed snapshot must be Error::Snapshot, got {e:?}");
            };
            assert!(!errors.is_empty() && errors.len() <= MAX_REPORTED_LINE_ERRORS);
            assert!(total >= errors.len());
            assert!(errors.len() == MAX_REPORTED_LINE_ERRORS || total == errors.len());
            assert!(errors.windows(2).all(|w| w[0].line < w[1].line));
            assert!(errors.iter().all(|l| l.line >= 1 && l.line <= lines));
        }
    }
}

fn check_ids(snap: &Snapshot<'_>) {
    let mut users = HashSet::new();
    for (u, groups) in &snap.users {
        check_id(IdKind::User, u).expect("accepted user id");
        assert!(users.insert(&**u), "duplicate user accepted");
        groups
            .iter()
            .for_each(|g| check_id(IdKind::Group, g).expect("accepted group id"));
    }
    let mut docs = HashSet::new();
    for (d, us, gs) in &snap.docs {
        check_id(IdKind::Document, d).expect("accepted document id");
        assert!(docs.insert(&**d), "duplicate document accepted");
        us.iter()
            .for_each(|u| check_id(IdKind::User, u).expect("accepted user id"));
        gs.iter()
            .for_each(|g| check_id(IdKind::Group, g).expect("accepted group id"));
    }
}

type Owned = (
    Vec<(String, Vec<String>)>,
    Vec<(String, Vec<String>, Vec<String>)>,
);

fn owned(snap: &Snapshot<'_>) -> Owned {
    let strs = |v: &[snapshot::Str<'_>]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    (
        snap.users
            .iter()
            .map(|(u, g)| (u.to_string(), strs(g)))
            .collect(),
        snap.docs
            .iter()
            .map(|(d, u, g)| (d.to_string(), strs(u), strs(g)))
            .collect(),
    )
}

fn reserialise(snap: &Snapshot<'_>) -> String {
    let (users, docs) = owned(snap);
    let mut out = String::new();
    for (user, groups) in users {
        out += &serde_json::json!({ "user": user, "groups": groups }).to_string();
        out.push('\n');
    }
    for (doc, users, groups) in docs {
        out += &serde_json::json!({ "doc": doc, "users": users, "groups": groups }).to_string();
        out.push('\n');
    }
    out
}

#[cfg(test)]
#[path = "../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Acl;

    #[test]
    fn acl_snapshot_corpus_and_mutations() {
        replay::run("acl_snapshot", &[], 3000, acl_snapshot);
    }

    /// What the parse counts is what a sync applies: on a fresh database every accepted corpus
    /// snapshot adds exactly its users, a second sync of it changes nothing, and a refused one
    /// in between changes nothing either.
    #[test]
    fn accepted_corpus_snapshots_sync_their_counts() {
        let mut synced = 0;
        for (path, bytes) in replay::checked_in("acl_snapshot") {
            let Ok((users, _docs)) = validate_snapshot(&bytes) else {
                continue;
            };
            let dir = tempfile::tempdir().unwrap();
            let acl = Acl::open(dir.path().join("airlock.db")).unwrap();
            let counts = acl.sync_snapshot("fuzz", &bytes[..]).unwrap();
            assert_eq!(counts.users_added, users, "{}", path.display());
            assert_eq!(counts.users_removed, 0);
            let refused = acl.sync_snapshot("fuzz", &b"{\"user\": \"\", \"groups\": []}"[..]);
            assert!(matches!(refused, Err(Error::Snapshot { total: 1, .. })));
            let again = acl.sync_snapshot("fuzz", &bytes[..]).unwrap();
            assert_eq!(
                (
                    again.users_added,
                    again.users_removed,
                    again.memberships_changed,
                    again.grants_changed,
                    again.users_access_changed
                ),
                (0, 0, 0, 0, 0),
                "{}",
                path.display()
            );
            synced += 1;
        }
        assert!(synced >= 1, "the corpus has an accepted snapshot");
    }
}
