//! The published, immutable ACL state readers see. A writer builds a new [`View`] that shares every
//! unchanged user's entry and every unchanged group's bitmap with the previous one and swaps it in
//! with one atomic pointer store, so a reader holding an [`AclSnapshot`] sees one complete state,
//! old or new, never a mix.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::allow::AllowSet;
use crate::model::{Name, Role};
use crate::sets::{AllowCache, CacheUse, Lineages, Part};

/// One user as published: their readable set is the union of their groups' documents and their
/// direct grants (two levels: the bitmaps are shared, not copied per user).
#[derive(Debug)]
pub(crate) struct UserView {
    /// The user's groups, sorted, each with the documents granted to it (`None`: none).
    pub groups: Box<[(Name, Option<Part>)]>,
    /// The documents granted to the user by name.
    pub direct: Option<Part>,
    pub roles: Box<[Role]>,
    pub local: bool,
    pub has_token: bool,
}

impl UserView {
    pub fn lineages(&self) -> Lineages<'_> {
        Lineages {
            groups: &self.groups,
            direct: self.direct.as_ref(),
        }
    }

    /// Whether the user may read the document: a probe per part.
    pub fn can_read(&self, doc_ordinal: u32) -> bool {
        self.lineages()
            .parts()
            .any(|p| p.bits.contains(doc_ordinal))
    }
}

/// SHA-256 of a bearer token → user id and expiry (µs since the epoch; `None`: never).
pub(crate) type TokenMap = HashMap<[u8; 32], (Name, Option<i64>)>;

/// One complete published state.
#[derive(Debug, Default)]
pub(crate) struct View {
    pub generation: u64,
    pub users: HashMap<Name, Arc<UserView>>,
    /// SHA-256 of a bearer token → user id and expiry.
    pub tokens: Arc<TokenMap>,
    /// Materialised unions, shared by every published state of one `Acl`.
    pub cache: Arc<AllowCache>,
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Principal {
    /// The user id.
    pub user_id: String,
    /// The user's roles at authentication time.
    pub roles: Vec<Role>,
}

impl Principal {
    /// Whether the caller may use admin endpoints.
    pub fn is_admin(&self) -> bool {
        self.roles.contains(&Role::Admin)
    }
}

/// A user as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UserInfo {
    /// The user id.
    pub user_id: String,
    /// Group ids, sorted.
    pub groups: Vec<String>,
    /// Roles, sorted.
    pub roles: Vec<Role>,
    /// Created on the appliance, outside the IAM snapshot (a sync never removes it).
    pub local: bool,
    /// Whether a bearer token is currently issued.
    pub has_token: bool,
    /// How many document ordinals the user may read.
    pub readable_documents: u64,
}

/// Where the published readable sets' memory goes ([`AclSnapshot::set_memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetMemory {
    /// Distinct group and direct-grant bitmaps referenced by users.
    pub parts: usize,
    /// Their bytes (roaring serialized size).
    pub part_bytes: usize,
    /// The cache of materialised unions (shared by every state of one `Acl`).
    pub cache: CacheUse,
}

/// A consistent, immutable view of the whole ACL state at one point in time.
///
/// Cheap to clone. Use one snapshot for every decision of one request that must agree with
/// itself; use [`crate::Acl::can_read`] (which loads the newest state) for the generation-time
/// re-check.
#[derive(Clone, Debug)]
pub struct AclSnapshot {
    pub(crate) view: Arc<View>,
}

impl AclSnapshot {
    /// Increases by one with every published change; usable as a cache key component.
    pub fn generation(&self) -> u64 {
        self.view.generation
    }

    /// The documents `user` may read in this state; an unknown user gets the empty set. Take it
    /// once per request: it is the union of the user's group and direct-grant bitmaps, the
    /// bitmap itself for a user with one, otherwise materialised (or found in a bounded cache
    /// shared by users with the same groups and no direct grant).
    pub fn allow_set(&self, user: &str) -> AllowSet {
        match self.view.users.get(user) {
            Some(u) => self.view.cache.allow_set(u.lineages().parts()),
            None => AllowSet::empty(),
        }
    }

    /// Whether `user` may read the document with ordinal `doc_ordinal` in this state.
    pub fn can_read(&self, user: &str, doc_ordinal: u32) -> bool {
        self.view
            .users
            .get(user)
            .is_some_and(|u| u.can_read(doc_ordinal))
    }

    /// The user's groups, sorted, if the user exists (cheaper than [`AclSnapshot::user`], which
    /// counts the readable documents).
    pub fn user_groups(&self, user: &str) -> Option<Vec<String>> {
        let u = self.view.users.get(user)?;
        Some(u.groups.iter().map(|(g, _)| g.to_string()).collect())
    }

    /// Where the readable sets' memory goes in this state: the distinct group and direct-grant
    /// bitmaps the users' entries share, and the cache of materialised unions.
    pub fn set_memory(&self) -> SetMemory {
        let mut parts: HashMap<u64, usize> = HashMap::new();
        for u in self.view.users.values() {
            for p in u.lineages().parts() {
                parts
                    .entry(p.id)
                    .or_insert_with(|| p.bits.serialized_size());
            }
        }
        SetMemory {
            parts: parts.len(),
            part_bytes: parts.values().sum(),
            cache: self.view.cache.usage(),
        }
    }

    /// The user's groups, roles and flags, if the user exists. Counting `readable_documents`
    /// takes the user's set as [`AclSnapshot::allow_set`] does (a union on a cache miss): use
    /// [`AclSnapshot::user_groups`] to walk many users' groups.
    pub fn user(&self, user: &str) -> Option<UserInfo> {
        self.view.users.get_key_value(user).map(|(id, u)| UserInfo {
            user_id: id.to_string(),
            groups: u.groups.iter().map(|(g, _)| g.to_string()).collect(),
            roles: u.roles.to_vec(),
            local: u.local,
            has_token: u.has_token,
            readable_documents: self.view.cache.allow_set(u.lineages().parts()).len(),
        })
    }

    /// Every user id, sorted.
    pub fn user_ids(&self) -> Vec<String> {
        let mut v: Vec<String> = self.view.users.keys().map(|k| k.to_string()).collect();
        v.sort();
        v
    }

    /// Resolves a bearer token to its user (see [`crate::Acl::authenticate`]).
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let digest = crate::token::digest(token);
        let (user, expires) = self.view.tokens.get(&digest)?;
        if expires.is_some_and(|e| crate::store::now_us() >= e) {
            return None;
        }
        let u = self.view.users.get(user)?;
        Some(Principal {
            user_id: user.to_string(),
            roles: u.roles.to_vec(),
        })
    }
}
