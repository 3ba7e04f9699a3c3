//! The writer-side in-memory model: users, memberships, grants and the group → documents and
//! user → directly-granted-documents bitmaps the per-user sets are made of.
//!
//! It mirrors the SQLite rows exactly; it is only mutated after the matching transaction has
//! committed, and only under the writer lock. Readers never see the model itself: they see the
//! published [`crate::view`], which shares the model's group and user bitmaps ([`Part`]s,
//! copied on write) until the next change to them.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use roaring::{MultiOps, RoaringBitmap};
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::sets::Part;

/// A role a user may hold (separation of duties). Deny by default: no role grants document
/// access (grants do); a role only opens the endpoints of its duty (the appliance's route table
/// decides which). A user without roles is an ordinary `user`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Configuration and users: creates users, assigns roles, issues tokens.
    Admin,
    /// Content operations: ingest, document grants, IAM syncs, reconcile, purge, evals.
    Operator,
    /// Oversight: reads the audit log and the metrics; never document content.
    Auditor,
    /// A scrape-only principal (Prometheus): reads `/metrics` and nothing else.
    Metrics,
}

impl Role {
    /// Every role, in order.
    pub const ALL: [Role; 4] = [Role::Admin, Role::Operator, Role::Auditor, Role::Metrics];

    /// The stored and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Auditor => "auditor",
            Role::Metrics => "metrics",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "admin" => Ok(Role::Admin),
            "operator" => Ok(Role::Operator),
            "auditor" => Ok(Role::Auditor),
            "metrics" => Ok(Role::Metrics),
            other => Err(Error::UnknownRole {
                role: other.to_owned(),
            }),
        }
    }
}

/// Interned name (user or group id). Cheap to clone and compare.
pub(crate) type Name = Arc<str>;

/// Who may read one document: sorted, deduplicated users and groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Grant {
    pub users: Box<[Name]>,
    pub groups: Box<[Name]>,
}

impl Grant {
    pub fn is_empty(&self) -> bool {
        self.users.is_empty() && self.groups.is_empty()
    }
}

/// A stored user.
#[derive(Clone, Debug, Default)]
pub(crate) struct UserRecord {
    pub groups: BTreeSet<Name>,
    pub roles: BTreeSet<Role>,
    /// Created on the appliance (CLI, admin API), outside the IAM snapshot: a sync never removes
    /// it.
    pub local: bool,
    /// SHA-256 of the current bearer token.
    pub token: Option<[u8; 32]>,
    /// When the token expires (µs since the epoch; `None`: never).
    pub token_expires_us: Option<i64>,
}

/// The full ACL state, as rows and as bitmaps.
#[derive(Default)]
pub(crate) struct Model {
    names: HashSet<Name>,
    pub users: HashMap<Name, UserRecord>,
    /// Existing users of each group.
    pub group_members: HashMap<Name, HashSet<Name>>,
    /// Non-empty grants by document ordinal.
    pub grants: HashMap<u32, Grant>,
    /// Documents granted to each group (never an empty bitmap).
    pub group_docs: HashMap<Name, Part>,
    /// Documents granted to each user id by name (the id need not exist as a user; never an
    /// empty bitmap).
    pub user_docs: HashMap<Name, Part>,
    /// Cache of `doc_ordinals` (ordinals are never reassigned, so a hit is always right; a miss
    /// is resolved against the table).
    pub ordinals: HashMap<Name, u32>,
}

/// What a change may have affected: users directly, and groups whose documents changed (their
/// members are expanded once at the end, not per document: a group like `all-staff` on 300k
/// documents would otherwise cost members × documents).
#[derive(Clone, Debug, Default)]
pub(crate) struct Touched {
    pub users: HashSet<Name>,
    pub groups: HashSet<Name>,
}

impl Touched {
    /// The touched users plus the current members of the touched groups.
    pub fn users(self, m: &Model) -> HashSet<Name> {
        let mut out = self.users;
        for g in &self.groups {
            if let Some(members) = m.group_members.get(g) {
                out.extend(members.iter().cloned());
            }
        }
        out
    }
}

/// Merges two sorted slices, calling `f(name, added)` for each name in exactly one of them
/// (`added` = only in `new`).
pub(crate) fn sorted_diff(old: &[Name], new: &[Name], mut f: impl FnMut(&Name, bool)) {
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                f(a, false);
                i += 1;
            }
            (Some(_), Some(b)) | (None, Some(b)) => {
                f(b, true);
                j += 1;
            }
            (Some(a), None) => {
                f(a, false);
                i += 1;
            }
            (None, None) => unreachable!("loop condition"),
        }
    }
}

/// Union of a user's directly granted documents and the documents of each of their groups: the
/// whole materialisation kernel. Used for a request's [`crate::AllowSet`] (see `sets`) and by
/// the benchmarks.
pub fn materialise<'a>(
    direct: Option<&'a RoaringBitmap>,
    groups: impl IntoIterator<Item = &'a RoaringBitmap>,
) -> RoaringBitmap {
    direct.into_iter().chain(groups).union()
}

impl Model {
    /// The shared copy of `s`.
    pub fn intern(&mut self, s: &str) -> Name {
        if let Some(n) = self.names.get(s) {
            return n.clone();
        }
        let n: Name = Arc::from(s);
        self.names.insert(n.clone());
        n
    }

    /// Builds a normalised grant (sorted, deduplicated) from raw names.
    pub fn grant_from<S: AsRef<str>>(&mut self, users: &[S], groups: &[S]) -> Grant {
        let mut norm = |xs: &[S]| {
            let mut v: Vec<Name> = xs.iter().map(|x| self.intern(x.as_ref())).collect();
            v.sort();
            v.dedup();
            v.into_boxed_slice()
        };
        let users = norm(users);
        let groups = norm(groups);
        Grant { users, groups }
    }

    /// The readable documents of `user` computed from the model (empty for unknown users): the
    /// flat union the published two-level sets are tested against.
    #[cfg(test)]
    pub fn materialise_user(&self, user: &str) -> RoaringBitmap {
        let Some(rec) = self.users.get(user) else {
            return RoaringBitmap::new();
        };
        materialise(
            self.user_docs.get(user).map(|p| &*p.bits),
            rec.groups
                .iter()
                .filter_map(|g| self.group_docs.get(g).map(|p| &*p.bits)),
        )
    }

    /// Replaces the grant of `ordinal`; records the existing users and the groups whose sets may
    /// change in `affected`. Returns whether the grant changed.
    pub fn set_grant(&mut self, ordinal: u32, new: Grant, affected: &mut Touched) -> bool {
        let old = self.grants.remove(&ordinal).unwrap_or_default();
        if old == new {
            if !new.is_empty() {
                self.grants.insert(ordinal, new);
            }
            return false;
        }
        let users = &self.users;
        let user_docs = &mut self.user_docs;
        sorted_diff(&old.users, &new.users, |u, added| {
            if added {
                user_docs
                    .entry(u.clone())
                    .or_default()
                    .edit()
                    .insert(ordinal);
            } else if let Some(b) = user_docs.get_mut(u) {
                b.edit().remove(ordinal);
                if b.bits.is_empty() {
                    user_docs.remove(u);
                }
            }
            if users.contains_key(u) {
                affected.users.insert(u.clone());
            }
        });
        let group_docs = &mut self.group_docs;
        sorted_diff(&old.groups, &new.groups, |g, added| {
            if added {
                group_docs
                    .entry(g.clone())
                    .or_default()
                    .edit()
                    .insert(ordinal);
            } else if let Some(b) = group_docs.get_mut(g) {
                b.edit().remove(ordinal);
                if b.bits.is_empty() {
                    group_docs.remove(g);
                }
            }
            affected.groups.insert(g.clone());
        });
        if !new.is_empty() {
            self.grants.insert(ordinal, new);
        }
        true
    }

    /// Creates an empty user (no groups, no roles, no token). The caller checked it is new.
    pub fn insert_user(&mut self, user: Name, local: bool) {
        self.users.insert(
            user,
            UserRecord {
                local,
                ..UserRecord::default()
            },
        );
    }

    /// Replaces the groups of an existing user; returns how many memberships changed.
    pub fn set_user_groups(&mut self, user: &Name, groups: BTreeSet<Name>) -> usize {
        let Some(rec) = self.users.get_mut(user) else {
            return 0;
        };
        let mut changed = 0;
        for g in rec.groups.difference(&groups) {
            changed += 1;
            if let Some(m) = self.group_members.get_mut(g) {
                m.remove(user);
                if m.is_empty() {
                    self.group_members.remove(g);
                }
            }
        }
        for g in groups.difference(&rec.groups) {
            changed += 1;
            self.group_members
                .entry(g.clone())
                .or_default()
                .insert(user.clone());
        }
        rec.groups = groups;
        changed
    }

    /// Removes a user with their memberships, roles and token. Grants naming the id stay (they
    /// are document metadata); they give nothing while the user does not exist.
    pub fn remove_user(&mut self, user: &Name) -> Option<UserRecord> {
        self.set_user_groups(user, BTreeSet::new());
        self.users.remove(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(xs: &[&str]) -> Vec<Name> {
        xs.iter().map(|x| Arc::from(*x)).collect()
    }

    #[test]
    fn sorted_diff_reports_both_sides() {
        let mut out = vec![];
        sorted_diff(
            &names(&["a", "c", "d"]),
            &names(&["b", "c", "e"]),
            |n, add| out.push((n.to_string(), add)),
        );
        out.sort();
        assert_eq!(
            out,
            vec![
                ("a".into(), false),
                ("b".into(), true),
                ("d".into(), false),
                ("e".into(), true)
            ]
        );
    }

    #[test]
    fn group_names_are_opaque_and_deny_by_default() {
        let mut m = Model::default();
        let alice = m.intern("alice");
        m.insert_user(alice.clone(), false);
        let hr = m.intern("hr");
        m.set_user_groups(&alice, [hr].into_iter().collect());
        let mut affected = Touched::default();
        let g = m.grant_from(&[] as &[&str], &["hr-newsletter"]);
        m.set_grant(0, g, &mut affected);
        let g = m.grant_from(&[] as &[&str], &["hr"]);
        m.set_grant(1, g, &mut affected);
        // Document 2 has no grant at all.
        assert_eq!(m.materialise_user("alice").iter().collect::<Vec<_>>(), [1]);
        assert!(m.materialise_user("bob").is_empty());
        assert!(affected.users(&m).contains("alice"));
    }

    #[test]
    fn direct_grants_apply_once_the_user_exists() {
        let mut m = Model::default();
        let mut affected = Touched::default();
        let g = m.grant_from(&["bob"], &[] as &[&str]);
        assert!(m.set_grant(7, g.clone(), &mut affected));
        assert!(affected.users.is_empty(), "bob does not exist yet");
        assert!(!m.set_grant(7, g, &mut affected), "same grant is no change");
        let bob = m.intern("bob");
        m.insert_user(bob, true);
        assert_eq!(m.materialise_user("bob").iter().collect::<Vec<_>>(), [7]);
    }

    #[test]
    fn roles_parse() {
        assert_eq!("admin".parse::<Role>().unwrap(), Role::Admin);
        assert!(matches!(
            "root".parse::<Role>(),
            Err(Error::UnknownRole { .. })
        ));
    }
}
