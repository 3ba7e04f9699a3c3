//! Who may read a file: Windows' access check (MS-DTYP 2.5.3.2 "Access Check Algorithm
//! Pseudocode") for one right, evaluated for every user of the directory.
//!
//! For a user's token (their SID, every group they are in, nested ones included, and the
//! well-known SIDs [`crate::directory`] adds), the DACL's ACEs are walked in stored order:
//! inherit-only ACEs are skipped; an ACE whose SID is not in the token is skipped; its mask has
//! its generic bits mapped to file rights; the first ACE that mentions the right decides — an
//! allow grants it, a deny refuses it. No ACE mentioning it: refused. A NULL DACL grants
//! everyone everything; an empty DACL grants nobody anything. The owner's implicit rights
//! (READ_CONTROL, WRITE_DAC) do not include reading data, so the owner is not a reader by
//! ownership alone (OWNER RIGHTS, S-1-3-4, stands for the owner when it appears in an ACE).
//! The share's own permissions are checked the same way and both must allow.

use std::collections::BTreeSet;

use crate::directory::Directory;
use crate::sd::{AceKind, SecurityDescriptor};
use crate::sid::{Sid, well_known};

/// FILE_READ_DATA (files) / FILE_LIST_DIRECTORY (folders): what reading a document needs.
pub const FILE_READ_DATA: u32 = 0x0000_0001;
/// FILE_TRAVERSE (folders) / FILE_EXECUTE (files).
pub const FILE_TRAVERSE: u32 = 0x0000_0020;
/// GENERIC_READ.
pub const GENERIC_READ: u32 = 0x8000_0000;
/// GENERIC_WRITE.
pub const GENERIC_WRITE: u32 = 0x4000_0000;
/// GENERIC_EXECUTE.
pub const GENERIC_EXECUTE: u32 = 0x2000_0000;
/// GENERIC_ALL.
pub const GENERIC_ALL: u32 = 0x1000_0000;
/// FILE_GENERIC_READ: READ_CONTROL | SYNCHRONIZE | FILE_READ_DATA | FILE_READ_EA |
/// FILE_READ_ATTRIBUTES.
pub const FILE_GENERIC_READ: u32 = 0x0012_0089;
/// FILE_GENERIC_WRITE.
pub const FILE_GENERIC_WRITE: u32 = 0x0012_0116;
/// FILE_GENERIC_EXECUTE.
pub const FILE_GENERIC_EXECUTE: u32 = 0x0012_00A0;
/// FILE_ALL_ACCESS.
pub const FILE_ALL_ACCESS: u32 = 0x001F_01FF;

/// Maps an ACE mask's generic bits to file rights (the file system's GENERIC_MAPPING).
pub fn map_generic(mask: u32) -> u32 {
    let mut out = mask & !(GENERIC_READ | GENERIC_WRITE | GENERIC_EXECUTE | GENERIC_ALL);
    if mask & GENERIC_READ != 0 {
        out |= FILE_GENERIC_READ;
    }
    if mask & GENERIC_WRITE != 0 {
        out |= FILE_GENERIC_WRITE;
    }
    if mask & GENERIC_EXECUTE != 0 {
        out |= FILE_GENERIC_EXECUTE;
    }
    if mask & GENERIC_ALL != 0 {
        out |= FILE_ALL_ACCESS;
    }
    out
}

/// Whether a token (a set of SIDs) is granted `right` (one bit) by `sd`, whose owner is
/// `sd.owner`. Windows' order-dependent evaluation: the first applicable ACE naming the right
/// decides.
pub fn is_granted(sd: &SecurityDescriptor, token: &BTreeSet<Sid>, right: u32) -> bool {
    let Some(dacl) = &sd.dacl else {
        return true;
    };
    let owner_rights = well_known::owner_rights();
    let is_owner = sd.owner.as_ref().is_some_and(|o| token.contains(o));
    for ace in &dacl.aces {
        if !ace.applies_to_object() {
            continue;
        }
        let Some(sid) = &ace.sid else { continue };
        let matches = token.contains(sid) || (is_owner && *sid == owner_rights);
        if !matches || map_generic(ace.mask) & right == 0 {
            continue;
        }
        match ace.kind {
            AceKind::Allow => return true,
            AceKind::Deny | AceKind::DenyUnevaluated(_) => return false,
            AceKind::AllowUnevaluated(_) | AceKind::Other(_) => {}
        }
    }
    false
}

/// The users who may read a document: their user SIDs.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Readers {
    /// The users' SIDs, sorted.
    pub users: BTreeSet<Sid>,
}

impl Readers {
    /// The users in both.
    pub fn intersect(&self, other: &Readers) -> Readers {
        Readers {
            users: self.users.intersection(&other.users).cloned().collect(),
        }
    }
    /// The readers' sign-in names (sAMAccountName) in `directory`, sorted: the user ids a
    /// document grant names when the daemon's `[ldap]` sign-in uses `user_id_attr =
    /// "sAMAccountName"` against the same domain (canonicalise them as sign-in does). A SID
    /// the directory no longer has is left out (it cannot sign in).
    pub fn user_names(&self, directory: &Directory) -> Vec<String> {
        let mut out: Vec<String> = self
            .users
            .iter()
            .filter_map(|s| directory.user(s).map(|u| u.name.clone()))
            .collect();
        out.sort();
        out
    }

    /// Whether `user` is among the readers.
    pub fn contains(&self, user: &Sid) -> bool {
        self.users.contains(user)
    }
}

/// The users of `directory` holding `right` under `sd` and under the share's permissions
/// (`share_sd`; `None` when the share has no ACL of its own, which allows everyone).
pub fn users_granted(
    sd: &SecurityDescriptor,
    share_sd: Option<&SecurityDescriptor>,
    directory: &Directory,
    right: u32,
) -> Readers {
    let users = directory
        .users()
        .filter(|u| {
            is_granted(sd, &u.token, right)
                && share_sd.is_none_or(|s| is_granted(s, &u.token, right))
        })
        .map(|u| u.sid.clone())
        .collect();
    Readers { users }
}

/// The users who may read the file described by `sd` through a share with `share_sd`:
/// FILE_READ_DATA granted by both.
pub fn effective_readers(
    sd: &SecurityDescriptor,
    share_sd: Option<&SecurityDescriptor>,
    directory: &Directory,
) -> Readers {
    users_granted(sd, share_sd, directory, FILE_READ_DATA)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::{Directory, DirectoryUser};
    use crate::sd::{Ace, CONTAINER_INHERIT_ACE, INHERIT_ONLY_ACE, OBJECT_INHERIT_ACE};

    fn sid(s: &str) -> Sid {
        s.parse().unwrap()
    }
    const D: &str = "S-1-5-21-10-20-30";
    fn dom(rid: u32) -> Sid {
        sid(D).with_rid(rid).unwrap()
    }

    /// alice (1101) in finance (1201), which is nested in staff (1202); bob (1102) in staff;
    /// carol (1103) in nothing but Domain Users.
    fn directory() -> Directory {
        let mut d = Directory::new(sid(D));
        d.add_group(dom(1201), "finance", &[dom(1202)]);
        d.add_group(dom(1202), "staff", &[]);
        d.add_user(DirectoryUser::new(dom(1101), "alice", vec![dom(1201)]));
        d.add_user(DirectoryUser::new(dom(1102), "bob", vec![dom(1202)]));
        d.add_user(DirectoryUser::new(dom(1103), "carol", vec![]));
        d.expand();
        d
    }

    fn names(r: &Readers, d: &Directory) -> Vec<String> {
        r.users
            .iter()
            .map(|s| d.user(s).unwrap().name.clone())
            .collect()
    }

    fn sd(aces: Vec<Ace>) -> SecurityDescriptor {
        SecurityDescriptor::with_dacl(Some(aces))
    }

    #[test]
    fn an_explicit_deny_before_an_allow_wins() {
        let d = directory();
        let s = sd(vec![
            Ace::deny(dom(1101), 0, FILE_READ_DATA),
            Ace::allow(dom(1202), 0, FILE_GENERIC_READ),
        ]);
        assert_eq!(names(&effective_readers(&s, None, &d), &d), ["bob"]);
        assert_eq!(effective_readers(&s, None, &d).user_names(&d), ["bob"]);
        // A deny of another right (write) does not refuse reading.
        let s = sd(vec![
            Ace::deny(dom(1101), 0, 0x2),
            Ace::allow(dom(1202), 0, FILE_GENERIC_READ),
        ]);
        assert_eq!(
            names(&effective_readers(&s, None, &d), &d),
            ["alice", "bob"]
        );
    }

    #[test]
    fn order_decides_an_allow_before_a_deny_grants() {
        // AccessCheck walks the ACEs in stored order; a non-canonical DACL (allow first) grants.
        let d = directory();
        let s = sd(vec![
            Ace::allow(dom(1101), 0, FILE_READ_DATA),
            Ace::deny(dom(1202), 0, FILE_READ_DATA),
        ]);
        assert_eq!(names(&effective_readers(&s, None, &d), &d), ["alice"]);
    }

    #[test]
    fn a_deny_on_a_group_reaches_members_of_nested_groups() {
        let d = directory();
        let s = sd(vec![
            Ace::deny(dom(1202), 0, GENERIC_ALL),
            Ace::allow(well_known::everyone(), 0, FILE_GENERIC_READ),
        ]);
        assert_eq!(names(&effective_readers(&s, None, &d), &d), ["carol"]);
    }

    #[test]
    fn inherit_only_aces_do_not_apply_to_the_object() {
        let d = directory();
        let s = sd(vec![
            Ace::deny(
                dom(1101),
                OBJECT_INHERIT_ACE | INHERIT_ONLY_ACE,
                FILE_READ_DATA,
            ),
            Ace::allow(
                dom(1103),
                OBJECT_INHERIT_ACE | CONTAINER_INHERIT_ACE | INHERIT_ONLY_ACE,
                FILE_READ_DATA,
            ),
            Ace::allow(dom(1201), OBJECT_INHERIT_ACE, FILE_READ_DATA),
        ]);
        assert_eq!(names(&effective_readers(&s, None, &d), &d), ["alice"]);
    }

    #[test]
    fn generic_rights_map_to_file_rights() {
        let d = directory();
        assert_eq!(map_generic(GENERIC_READ) & FILE_READ_DATA, FILE_READ_DATA);
        assert_eq!(map_generic(GENERIC_ALL), FILE_ALL_ACCESS);
        assert_eq!(map_generic(GENERIC_WRITE) & FILE_READ_DATA, 0);
        assert_eq!(map_generic(GENERIC_EXECUTE) & FILE_READ_DATA, 0);
        let s = sd(vec![
            Ace::allow(dom(1101), 0, GENERIC_READ),
            Ace::allow(dom(1102), 0, GENERIC_ALL),
            Ace::allow(dom(1103), 0, GENERIC_WRITE | GENERIC_EXECUTE | 0x0012_0080),
        ]);
        assert_eq!(
            names(&effective_readers(&s, None, &d), &d),
            ["alice", "bob"]
        );
    }

    #[test]
    fn a_null_dacl_is_everyone_an_empty_dacl_is_nobody() {
        let d = directory();
        let null = SecurityDescriptor::with_dacl(None);
        assert_eq!(
            names(&effective_readers(&null, None, &d), &d),
            ["alice", "bob", "carol"]
        );
        assert!(effective_readers(&sd(vec![]), None, &d).users.is_empty());
    }

    #[test]
    fn well_known_sids_reach_every_domain_user() {
        let d = directory();
        for w in [
            well_known::everyone(),
            well_known::authenticated_users(),
            well_known::builtin_users(),
            dom(well_known::DOMAIN_USERS_RID),
        ] {
            let s = sd(vec![Ace::allow(w.clone(), 0, FILE_READ_DATA)]);
            assert_eq!(
                names(&effective_readers(&s, None, &d), &d),
                ["alice", "bob", "carol"],
                "{w}"
            );
        }
        // CREATOR OWNER on the object itself matches nobody.
        let s = sd(vec![Ace::allow(
            well_known::creator_owner(),
            0,
            FILE_READ_DATA,
        )]);
        assert!(effective_readers(&s, None, &d).users.is_empty());
    }

    #[test]
    fn the_owner_reads_only_through_an_ace() {
        let d = directory();
        let mut s = sd(vec![Ace::allow(
            well_known::builtin_administrators(),
            0,
            FILE_ALL_ACCESS,
        )]);
        s.owner = Some(dom(1103));
        assert!(effective_readers(&s, None, &d).users.is_empty());
        s.dacl.as_mut().unwrap().aces.push(Ace::allow(
            well_known::owner_rights(),
            0,
            FILE_READ_DATA,
        ));
        assert_eq!(names(&effective_readers(&s, None, &d), &d), ["carol"]);
    }

    #[test]
    fn the_share_acl_is_intersected() {
        let d = directory();
        let file = sd(vec![Ace::allow(
            well_known::everyone(),
            0,
            FILE_GENERIC_READ,
        )]);
        let share = sd(vec![
            Ace::deny(dom(1102), 0, GENERIC_ALL),
            Ace::allow(dom(1202), 0, GENERIC_READ),
        ]);
        assert_eq!(
            names(&effective_readers(&file, Some(&share), &d), &d),
            ["alice"]
        );
    }

    #[test]
    fn unevaluated_conditional_aces_never_grant_but_always_deny() {
        let d = directory();
        let mut s = sd(vec![
            Ace::allow(dom(1101), 0, FILE_READ_DATA),
            Ace::allow(dom(1102), 0, FILE_READ_DATA),
        ]);
        s.dacl.as_mut().unwrap().aces[0].kind = AceKind::AllowUnevaluated(0x09);
        s.dacl.as_mut().unwrap().aces.insert(
            0,
            Ace {
                kind: AceKind::DenyUnevaluated(0x0A),
                flags: 0,
                mask: FILE_READ_DATA,
                sid: Some(dom(1102)),
            },
        );
        assert!(effective_readers(&s, None, &d).users.is_empty());
    }
}
