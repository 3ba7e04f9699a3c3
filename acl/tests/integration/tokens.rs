//! Bearer tokens: issue, rotate, revoke by removal or sync; local operators survive syncs.

use airlock_acl::{Error, NewUser, Role, UserSpec};

use crate::common::temp_acl;

fn admin() -> NewUser {
    NewUser {
        groups: vec![],
        roles: vec![Role::Admin],
        local: true,
    }
}

#[test]
fn rotate_invalidates_the_old_token() {
    let (_d, acl) = temp_acl();
    let t1 = acl.add_user("cli", "admin", &admin()).unwrap();
    let p = acl.authenticate(&t1).unwrap();
    assert_eq!(p.user_id, "admin");
    assert!(p.is_admin());

    let t2 = acl.issue_token("admin", "admin").unwrap();
    assert_ne!(t1, t2);
    assert!(acl.authenticate(&t1).is_none());
    assert_eq!(acl.authenticate(&t2).unwrap().user_id, "admin");
    assert!(acl.authenticate("").is_none());
    assert!(acl.authenticate(&t2[..t2.len() - 1]).is_none());

    assert!(matches!(
        acl.add_user("cli", "admin", &admin()),
        Err(Error::UserExists { .. })
    ));
    let e = acl.issue_token("cli", "nobody").unwrap_err();
    assert!(matches!(e, Error::UnknownUser { .. }) && e.is_user_error());
}

#[test]
fn tokens_are_stored_only_as_sha256_and_survive_restart() {
    let (dir, acl) = temp_acl();
    let t = acl.add_user("cli", "admin", &admin()).unwrap();
    let db = dir.path().join("airlock.db");
    let c = rusqlite::Connection::open(&db).unwrap();
    let stored: String = c
        .query_row(
            "SELECT token_sha256 FROM acl_tokens WHERE user_id = 'admin'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored.len(), 64);
    assert!(
        !stored.contains(&t[4..]),
        "the token itself must not be stored"
    );
    drop(acl);
    let acl = airlock_acl::Acl::open(&db).unwrap();
    assert_eq!(acl.authenticate(&t).unwrap().roles, [Role::Admin]);
}

#[test]
fn removed_users_lose_their_token_and_local_admins_survive_sync() {
    let (_d, acl) = temp_acl();
    let op = acl.add_user("cli", "operator", &admin()).unwrap();
    acl.sync_snapshot(
        "operator",
        &br#"{"user": "alice", "groups": ["risk"]}
{"user": "bob", "groups": ["risk"]}
{"doc": "d1", "users": [], "groups": ["risk"]}
{"doc": "d2", "users": ["operator"], "groups": []}"#[..],
    )
    .unwrap();
    let alice = acl.issue_token("operator", "alice").unwrap();
    let bob = acl.issue_token("operator", "bob").unwrap();
    assert_eq!(acl.authenticate(&alice).unwrap().roles, []);
    let d1 = acl.ordinal("d1").unwrap().unwrap();
    let d2 = acl.ordinal("d2").unwrap().unwrap();
    assert!(acl.can_read("alice", d1));
    // Operators read documents only through grants, like anyone else.
    assert!(!acl.can_read("operator", d1));
    assert!(acl.can_read("operator", d2));

    // The next snapshot drops alice (and does not mention the operator).
    let counts = acl
        .sync_snapshot(
            "operator",
            &br#"{"user": "bob", "groups": ["risk"]}
{"doc": "d1", "users": [], "groups": ["risk"]}
{"doc": "d2", "users": ["operator"], "groups": []}"#[..],
        )
        .unwrap();
    assert_eq!(counts.users_removed, 1);
    assert_eq!(counts.users_access_changed, 1);
    assert!(acl.authenticate(&alice).is_none());
    assert!(!acl.can_read("alice", d1));
    assert!(acl.authenticate(&bob).is_some());
    let p = acl.authenticate(&op).unwrap();
    assert!(p.is_admin());
    assert!(acl.can_read("operator", d2));

    // Re-adding alice by a later snapshot does not revive her old token.
    acl.sync_snapshot(
        "operator",
        &br#"{"user": "alice", "groups": ["risk"]}
{"user": "bob", "groups": ["risk"]}"#[..],
    )
    .unwrap();
    assert!(acl.authenticate(&alice).is_none());
    assert!(
        !acl.can_read("alice", d1),
        "d1 has no line, so no grant any more"
    );

    // Explicit removal revokes at once.
    acl.remove_user("operator", "bob").unwrap();
    assert!(acl.authenticate(&bob).is_none());
    assert!(matches!(
        acl.remove_user("operator", "bob"),
        Err(Error::UnknownUser { .. })
    ));
}

#[test]
fn put_user_sets_groups_and_roles() {
    let (_d, acl) = temp_acl();
    acl.add_user("cli", "root", &admin()).unwrap();
    let out = acl
        .put_user(
            "root",
            "carol",
            &UserSpec {
                groups: vec!["hr".into()],
                roles: None,
            },
        )
        .unwrap();
    assert!(out.created);
    let info = acl.user("carol").unwrap();
    assert_eq!(info.groups, ["hr"]);
    assert!(info.roles.is_empty() && info.local && !info.has_token);
    let t = acl.issue_token("root", "carol").unwrap();
    assert!(!acl.authenticate(&t).unwrap().is_admin());
    acl.put_user(
        "root",
        "carol",
        &UserSpec {
            groups: vec![],
            roles: Some(vec![Role::Admin]),
        },
    )
    .unwrap();
    // Role changes apply to the existing token at once.
    assert!(acl.authenticate(&t).unwrap().is_admin());
    // Absent roles keep the current ones.
    acl.put_user(
        "root",
        "carol",
        &UserSpec {
            groups: vec!["risk".into()],
            roles: None,
        },
    )
    .unwrap();
    assert!(acl.authenticate(&t).unwrap().is_admin());
    let body: UserSpec =
        serde_json::from_str(r#"{"groups": ["risk", "hr"], "roles": ["admin"]}"#).unwrap();
    assert_eq!(body.roles, Some(vec![Role::Admin]));
    assert!(serde_json::from_str::<UserSpec>(r#"{"groups": [], "role": "admin"}"#).is_err());
    assert!(serde_json::from_str::<UserSpec>(r#"{"groups": [], "roles": ["root"]}"#).is_err());
}
