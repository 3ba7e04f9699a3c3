//! Document grants through the admin API: opaque group names, deny by default, only affected
//! users recomputed, the admin view of a document's grant.

use airlock_acl::{DocGrants, NewUser, UserSpec};

use crate::common::{brute_force_from_rows, published, temp_acl};

fn spec(groups: &[&str]) -> UserSpec {
    UserSpec {
        groups: groups.iter().map(|g| g.to_string()).collect(),
        roles: None,
    }
}

#[test]
fn grants_follow_groups_and_names_exactly() {
    let (dir, acl) = temp_acl();
    acl.put_user("root", "ann", &spec(&["hr"])).unwrap();
    acl.put_user("root", "ben", &spec(&["hr-newsletter"]))
        .unwrap();
    acl.put_user("root", "cid", &spec(&[])).unwrap();

    let g = |users: &[&str], groups: &[&str]| DocGrants {
        users: users.iter().map(|s| s.to_string()).collect(),
        groups: groups.iter().map(|s| s.to_string()).collect(),
    };
    let hr = acl
        .set_document_grants("root", "hr-1", &g(&[], &["hr"]))
        .unwrap();
    assert!(hr.changed);
    assert_eq!(hr.users_access_changed, 1, "only ann is a member of hr");
    let news = acl
        .set_document_grants("root", "news-1", &g(&["cid"], &["hr-newsletter"]))
        .unwrap();
    let none = acl
        .set_document_grants("root", "secret", &g(&[], &[]))
        .unwrap();
    assert!(
        !none.changed,
        "an empty grant on a new document is no change"
    );

    assert!(acl.can_read("ann", hr.ordinal));
    assert!(
        !acl.can_read("ann", news.ordinal),
        "hr-newsletter grants nothing of hr"
    );
    assert!(!acl.can_read("ben", hr.ordinal));
    assert!(acl.can_read("ben", news.ordinal));
    assert!(acl.can_read("cid", news.ordinal));
    for u in ["ann", "ben", "cid", "nobody"] {
        assert!(!acl.can_read(u, none.ordinal));
    }
    assert!(acl.allow_set("nobody").is_empty());
    assert_eq!(
        published(&acl),
        brute_force_from_rows(&dir.path().join("airlock.db"))
    );

    // Same grant again: no change, nobody recomputed.
    let again = acl
        .set_document_grants("root", "hr-1", &g(&[], &["hr"]))
        .unwrap();
    assert_eq!((again.changed, again.users_access_changed), (false, 0));

    // A membership change moves access with it.
    let out = acl.put_user("root", "ben", &spec(&["hr"])).unwrap();
    assert!(out.access_changed);
    assert!(acl.can_read("ben", hr.ordinal) && !acl.can_read("ben", news.ordinal));

    // The admin view lists the stored grant; unknown ids are None.
    let view = acl.document_grants("news-1").unwrap().unwrap();
    assert_eq!(view, g(&["cid"], &["hr-newsletter"]));
    assert_eq!(acl.document_grants("secret").unwrap(), Some(g(&[], &[])));
    assert_eq!(acl.document_grants("never-seen").unwrap(), None);

    // A grant naming a user before the user exists applies when the user is created.
    let early = acl
        .set_document_grants("root", "early", &g(&["dee"], &[]))
        .unwrap();
    assert_eq!(early.users_access_changed, 0);
    acl.add_user("root", "dee", &NewUser::default()).unwrap();
    assert!(acl.can_read("dee", early.ordinal));
    assert_eq!(
        published(&acl),
        brute_force_from_rows(&dir.path().join("airlock.db"))
    );
}

#[test]
fn invalid_ids_are_user_errors() {
    let (_d, acl) = temp_acl();
    let e = acl
        .set_document_grants(
            "root",
            "doc\n1",
            &DocGrants {
                users: vec![],
                groups: vec![],
            },
        )
        .unwrap_err();
    assert!(e.is_user_error(), "{e}");
    let e = acl.put_user("root", "", &spec(&[])).unwrap_err();
    assert!(e.is_user_error());
    assert!(acl.snapshot().user_ids().is_empty());
}

#[test]
fn users_with_the_same_groups_share_one_bitmap() {
    let (_d, acl) = temp_acl();
    acl.sync_snapshot(
        "t",
        &br#"{"user": "a", "groups": ["risk", "all"]}
{"user": "b", "groups": ["all", "risk"]}
{"user": "c", "groups": ["all", "risk"]}
{"doc": "d1", "users": [], "groups": ["risk"]}
{"doc": "d2", "users": ["c"], "groups": []}"#[..],
    )
    .unwrap();
    let s = acl.snapshot();
    let (a, b, c) = (s.allow_set("a"), s.allow_set("b"), s.allow_set("c"));
    assert!(std::ptr::eq(a.bitmap(), b.bitmap()));
    assert!(
        !std::ptr::eq(a.bitmap(), c.bitmap()),
        "c has a grant by name"
    );
    assert_eq!(a.len(), 1);
    assert_eq!(c.len(), 2);
}

#[test]
fn an_empty_snapshot_is_applied_only_on_purpose() {
    let (_dir, acl) = temp_acl();
    acl.put_user("root", "ann", &spec(&["hr"])).unwrap();
    let g = DocGrants {
        users: vec![],
        groups: vec!["hr".into()],
    };
    acl.set_document_grants("root", "hr-1", &g).unwrap();
    let ord = acl.ordinal("hr-1").unwrap().unwrap();
    for empty in ["", "\n", "  \n\n \t\n"] {
        let e = acl.sync_snapshot("root", empty.as_bytes()).unwrap_err();
        assert!(matches!(e, airlock_acl::Error::EmptySnapshot), "{e}");
        assert!(e.is_user_error());
        assert!(
            acl.can_read("ann", ord),
            "a refused empty snapshot changed access"
        );
    }
    let counts = acl
        .sync_snapshot_with(
            "root",
            &b""[..],
            airlock_acl::SyncOptions { allow_empty: true },
        )
        .unwrap();
    assert_eq!(counts.grants_changed, 1);
    assert!(!acl.can_read("ann", ord));
}

/// A joined write that fails rolls the grant back with it, and the published state is as before.
#[test]
fn a_failed_joined_write_changes_nothing() {
    let (_dir, acl) = temp_acl();
    acl.put_user("root", "ann", &spec(&["hr"])).unwrap();
    let g = DocGrants {
        users: vec![],
        groups: vec!["hr".into()],
    };
    let mut published_hook = false;
    let e = acl
        .set_document_grants_with(
            "root",
            "doc-1",
            &g,
            |_| {
                Err(airlock_acl::Error::Joined {
                    source: "disk full".into(),
                })
            },
            || published_hook = true,
        )
        .unwrap_err();
    assert!(matches!(e, airlock_acl::Error::Joined { .. }));
    assert!(!published_hook);
    assert_eq!(acl.document_grants("doc-1").unwrap(), None);
    assert!(acl.allow_set("ann").is_empty());
    // The next write works from the unchanged state.
    acl.set_document_grants("root", "doc-1", &g).unwrap();
    assert_eq!(acl.allow_set("ann").len(), 1);
}
