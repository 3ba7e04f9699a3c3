//! Readers during syncs observe only the complete old or the complete new state.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use roaring::RoaringBitmap;

use crate::common::temp_acl;

const USERS: usize = 40;
const DOCS: usize = 400;

/// State A: user i is in group g(i % 8) and docs of group k are those with d % 8 == k, plus a
/// direct grant of doc i to user i. State B: the groups rotate by one and the direct grants move
/// to doc i + 200. Every user's set differs between A and B, and any mix of rows (some
/// memberships or grants of A, some of B) yields a set that is neither.
fn snapshot(rotate: usize, direct_offset: usize) -> String {
    let mut s = String::new();
    for u in 0..USERS {
        s.push_str(&format!(
            "{{\"user\": \"u{u}\", \"groups\": [\"g{}\"]}}\n",
            (u + rotate) % 8
        ));
    }
    for d in 0..DOCS {
        let users: Vec<String> = (0..USERS)
            .filter(|u| u + direct_offset == d)
            .map(|u| format!("\"u{u}\""))
            .collect();
        s.push_str(&format!(
            "{{\"doc\": \"d{d}\", \"users\": [{}], \"groups\": [\"g{}\"]}}\n",
            users.join(", "),
            (d + rotate * 3) % 8
        ));
    }
    s
}

#[test]
fn readers_never_see_a_mix() {
    let (_d, acl) = temp_acl();
    let a = snapshot(0, 0);
    let b = snapshot(1, 200);
    acl.sync_snapshot("t", a.as_bytes()).unwrap();
    let state = |acl: &airlock_acl::Acl| -> BTreeMap<String, RoaringBitmap> {
        let s = acl.snapshot();
        (0..USERS)
            .map(|u| {
                let id = format!("u{u}");
                let bits = s.allow_set(&id).bitmap().clone();
                (id, bits)
            })
            .collect()
    };
    let sa = state(&acl);
    acl.sync_snapshot("t", b.as_bytes()).unwrap();
    let sb = state(&acl);
    for u in sa.keys() {
        assert_ne!(sa[u], sb[u], "{u} must differ between the states");
        assert!(!sa[u].is_empty());
    }

    let done = AtomicBool::new(false);
    let seen_a = AtomicUsize::new(0);
    let seen_b = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for r in 0..3 {
            let (acl, sa, sb, done, seen_a, seen_b) = (&acl, &sa, &sb, &done, &seen_a, &seen_b);
            scope.spawn(move || {
                while !done.load(Ordering::Acquire) {
                    // One snapshot: every user must come from the same complete state.
                    let s = acl.snapshot();
                    let got: BTreeMap<String, RoaringBitmap> = sa
                        .keys()
                        .map(|u| (u.clone(), s.allow_set(u).bitmap().clone()))
                        .collect();
                    if got == *sa {
                        seen_a.fetch_add(1, Ordering::Relaxed);
                    } else if got == *sb {
                        seen_b.fetch_add(1, Ordering::Relaxed);
                    } else {
                        panic!("reader {r} saw a state that is neither A nor B");
                    }
                    // Single calls against the current state: each user whole, old or new.
                    let u = format!("u{}", r * 7 % USERS);
                    let one = acl.allow_set(&u);
                    assert!(*one.bitmap() == sa[&u] || *one.bitmap() == sb[&u]);
                    let d = u32::try_from(r * 7 % USERS).unwrap();
                    let _ = acl.can_read(&u, d);
                }
            });
        }
        for i in 0..30 {
            let next = if i % 2 == 0 { &a } else { &b };
            let c = acl.sync_snapshot("t", next.as_bytes()).unwrap();
            assert_eq!(c.users_access_changed, USERS);
        }
        done.store(true, Ordering::Release);
    });
    assert!(seen_a.load(Ordering::Relaxed) > 0 && seen_b.load(Ordering::Relaxed) > 0);
    // After an even number of swaps from B we end on B.
    assert_eq!(state(&acl), sb);
}
