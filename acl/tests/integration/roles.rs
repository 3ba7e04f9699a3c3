//! Roles (separation of duties): the last admin cannot be removed, demoted or synced away, and a
//! refused change changes nothing.

use airlock_acl::{Error, NewUser, Role, UserSpec};

use crate::common::temp_acl;

fn with_roles(roles: &[Role], local: bool) -> NewUser {
    NewUser {
        groups: vec![],
        roles: roles.to_vec(),
        local,
    }
}

#[test]
fn the_last_admin_cannot_be_removed_demoted_or_synced_away() {
    let (_d, acl) = temp_acl();
    let root = acl
        .add_user("cli", "root", &with_roles(&[Role::Admin], true))
        .unwrap();
    acl.add_user("cli", "ops", &with_roles(&[Role::Operator], true))
        .unwrap();
    let last = |e: Error| {
        assert!(
            matches!(&e, Error::LastAdmin { user_id } if user_id == "root"),
            "{e}"
        );
        assert!(e.is_user_error());
    };
    last(acl.remove_user("cli", "root").unwrap_err());
    last(
        acl.put_user(
            "cli",
            "root",
            &UserSpec {
                groups: vec![],
                roles: Some(vec![Role::Operator]),
            },
        )
        .unwrap_err(),
    );
    // Nothing changed: the token works, the role is there.
    let p = acl.authenticate(&root).unwrap();
    assert_eq!(p.roles, [Role::Admin]);
    // Removing the operator (not an admin) is fine; keeping the admin role is fine.
    acl.remove_user("cli", "ops").unwrap();
    acl.put_user(
        "cli",
        "root",
        &UserSpec {
            groups: vec!["g".into()],
            roles: Some(vec![Role::Admin, Role::Auditor]),
        },
    )
    .unwrap();

    // A snapshot user made admin is the only admin once root hands over: a sync leaving them
    // out is refused as a whole.
    acl.sync_snapshot("cli", r#"{"user": "alice", "groups": ["g"]}"#.as_bytes())
        .unwrap();
    acl.put_user(
        "cli",
        "alice",
        &UserSpec {
            groups: vec!["g".into()],
            roles: Some(vec![Role::Admin]),
        },
    )
    .unwrap();
    acl.remove_user("cli", "root").unwrap();
    let e = acl
        .sync_snapshot("cli", r#"{"user": "bob", "groups": ["g"]}"#.as_bytes())
        .unwrap_err();
    assert!(
        matches!(&e, Error::LastAdmin { user_id } if user_id == "alice"),
        "{e}"
    );
    assert!(acl.user("alice").is_some() && acl.user("bob").is_none());
    // With a second admin, the same changes go through.
    acl.add_user("cli", "root2", &with_roles(&[Role::Admin], true))
        .unwrap();
    acl.sync_snapshot("cli", r#"{"user": "bob", "groups": ["g"]}"#.as_bytes())
        .unwrap();
    assert!(acl.user("alice").is_none());
    last_error_names(acl.remove_user("cli", "root2").unwrap_err(), "root2");
}

fn last_error_names(e: Error, who: &str) {
    assert!(
        matches!(&e, Error::LastAdmin { user_id } if user_id == who),
        "{e}"
    );
}

#[test]
fn every_role_round_trips_through_its_name() {
    for r in Role::ALL {
        assert_eq!(r.as_str().parse::<Role>().unwrap(), r);
        assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
    }
    assert!(matches!(
        "root".parse::<Role>(),
        Err(Error::UnknownRole { .. })
    ));
}
