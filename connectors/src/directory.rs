//! The identities an access check runs for: users with their tokens (every SID a Windows
//! logon token of theirs would hold), from Active Directory ([`crate::ad`]) or built by hand.
//!
//! Well-known SIDs are mapped explicitly, not looked up:
//! - Everyone (S-1-1-0) and Authenticated Users (S-1-5-11): every enabled user.
//! - BUILTIN\Users (S-1-5-32-545): every enabled user (in a domain it holds Domain Users and
//!   Authenticated Users by default; AD's tokenGroups also reports it).
//! - Domain Users (domain SID + 513): the users whose primary group it is (every account by
//!   default) or who are members; AD's tokenGroups reports the primary group.
//!
//! CREATOR OWNER / CREATOR GROUP are never in a token; OWNER RIGHTS is handled by the check.

use std::collections::{BTreeMap, BTreeSet};

use crate::sid::{Sid, well_known};

/// A user and their token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectoryUser {
    /// The user's SID (objectSid): the principal Airlock grants to.
    pub sid: Sid,
    /// The sign-in name (sAMAccountName).
    pub name: String,
    /// Groups the directory says the user is in (direct ones, or already transitive).
    pub groups: Vec<Sid>,
    /// The primary group (primaryGroupID; Domain Users unless changed).
    pub primary_group: Option<Sid>,
    /// The token: the user's SID, every group (nested ones expanded) and the well-known SIDs.
    /// Filled by [`Directory::expand`].
    pub token: BTreeSet<Sid>,
}

impl DirectoryUser {
    /// A user with these groups and Domain Users as primary group (set by [`Directory::add_user`]).
    pub fn new(sid: Sid, name: &str, groups: Vec<Sid>) -> DirectoryUser {
        DirectoryUser {
            sid,
            name: name.to_owned(),
            groups,
            primary_group: None,
            token: BTreeSet::new(),
        }
    }
}

/// A group and the groups it is itself a member of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectoryGroup {
    /// The group's SID.
    pub sid: Sid,
    /// Its name.
    pub name: String,
    /// Groups this group is a member of (nesting).
    pub member_of: Vec<Sid>,
}

/// Users and groups of one domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directory {
    domain: Sid,
    users: BTreeMap<Sid, DirectoryUser>,
    groups: BTreeMap<Sid, DirectoryGroup>,
}

impl Directory {
    /// An empty directory of the domain `domain` (S-1-5-21-…).
    pub fn new(domain: Sid) -> Directory {
        Directory {
            domain,
            users: BTreeMap::new(),
            groups: BTreeMap::new(),
        }
    }

    /// The domain SID.
    pub fn domain(&self) -> &Sid {
        &self.domain
    }

    /// Domain Users of this domain.
    pub fn domain_users(&self) -> Sid {
        self.domain
            .with_rid(well_known::DOMAIN_USERS_RID)
            .unwrap_or_else(|_| self.domain.clone())
    }

    /// Adds (or replaces) a user; a user without a primary group gets Domain Users.
    pub fn add_user(&mut self, mut user: DirectoryUser) {
        if user.primary_group.is_none() {
            user.primary_group = Some(self.domain_users());
        }
        self.users.insert(user.sid.clone(), user);
    }

    /// Adds (or replaces) a group nested in `member_of`.
    pub fn add_group(&mut self, sid: Sid, name: &str, member_of: &[Sid]) {
        self.groups.insert(
            sid.clone(),
            DirectoryGroup {
                sid,
                name: name.to_owned(),
                member_of: member_of.to_vec(),
            },
        );
    }

    /// Computes every user's token: their SID, their groups and the groups those are in
    /// (transitively, cycles allowed), the primary group, and the well-known SIDs.
    pub fn expand(&mut self) {
        let groups = &self.groups;
        for user in self.users.values_mut() {
            let mut token = BTreeSet::new();
            token.insert(user.sid.clone());
            let mut frontier: Vec<Sid> = user.groups.clone();
            frontier.extend(user.primary_group.clone());
            while let Some(g) = frontier.pop() {
                if token.insert(g.clone())
                    && let Some(group) = groups.get(&g)
                {
                    frontier.extend(group.member_of.iter().cloned());
                }
            }
            token.insert(well_known::everyone());
            token.insert(well_known::authenticated_users());
            token.insert(well_known::builtin_users());
            user.token = token;
        }
    }

    /// Whether `sid` is a user or group of this directory.
    pub fn knows(&self, sid: &Sid) -> bool {
        self.users.contains_key(sid) || self.groups.contains_key(sid)
    }

    /// The users, by SID.
    pub fn users(&self) -> impl Iterator<Item = &DirectoryUser> {
        self.users.values()
    }

    /// A user by SID.
    pub fn user(&self, sid: &Sid) -> Option<&DirectoryUser> {
        self.users.get(sid)
    }

    /// A user by sign-in name (case-insensitive).
    pub fn user_named(&self, name: &str) -> Option<&DirectoryUser> {
        self.users
            .values()
            .find(|u| u.name.eq_ignore_ascii_case(name))
    }

    /// The groups, by SID.
    pub fn groups(&self) -> impl Iterator<Item = &DirectoryGroup> {
        self.groups.values()
    }

    /// A principal's display name: a user's or group's name, a well-known name, else the SID.
    pub fn name_of(&self, sid: &Sid) -> String {
        if let Some(u) = self.users.get(sid) {
            return u.name.clone();
        }
        if let Some(g) = self.groups.get(sid) {
            return g.name.clone();
        }
        let s = sid.to_string();
        match s.as_str() {
            "S-1-1-0" => "Everyone".into(),
            "S-1-5-11" => "Authenticated Users".into(),
            "S-1-5-32-545" => "BUILTIN\\Users".into(),
            "S-1-5-32-544" => "BUILTIN\\Administrators".into(),
            "S-1-3-0" => "CREATOR OWNER".into(),
            "S-1-3-4" => "OWNER RIGHTS".into(),
            _ => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_expanded_through_cycles() {
        let dom: Sid = "S-1-5-21-1-2-3".parse().unwrap();
        let g = |r| dom.with_rid(r).unwrap();
        let mut d = Directory::new(dom.clone());
        d.add_group(g(1201), "a", &[g(1202)]);
        d.add_group(g(1202), "b", &[g(1203), g(1201)]);
        d.add_group(g(1203), "c", &[]);
        d.add_user(DirectoryUser::new(g(1101), "u", vec![g(1201)]));
        d.expand();
        let t = &d.user(&g(1101)).unwrap().token;
        for s in [g(1101), g(1201), g(1202), g(1203), g(513)] {
            assert!(t.contains(&s), "{s}");
        }
        assert!(t.contains(&well_known::everyone()));
        assert!(t.contains(&well_known::authenticated_users()));
        assert!(t.contains(&well_known::builtin_users()));
        assert_eq!(d.user_named("U").unwrap().sid, g(1101));
    }
}
