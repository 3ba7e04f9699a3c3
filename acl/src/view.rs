//! The published, immutable ACL state readers see. A writer builds a new [`View`] that shares every
//! unchanged user's entry with the previous one and swaps it in with one atomic pointer store, so
//! a reader holding an [`AclSnapshot`] sees one complete state, old or new, never a mix.

use std::collections::HashMap;
use std::sync::Arc;

use roaring::RoaringBitmap;
use serde::Serialize;

use crate::allow::AllowSet;
use crate::model::{Name, Role};

/// One user as published.
#[derive(Debug)]
pub(crate) struct UserView {
    pub bits: Arc<RoaringBitmap>,
    pub roles: Box<[Role]>,
    pub groups: Box<[Name]>,
    pub local: bool,
    pub has_token: bool,
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

    /// The documents `user` may read in this state; an unknown user gets the empty set.
    pub fn allow_set(&self, user: &str) -> AllowSet {
        match self.view.users.get(user) {
            Some(u) => AllowSet::from_arc(u.bits.clone()),
            None => AllowSet::empty(),
        }
    }

    /// Whether `user` may read the document with ordinal `doc_ordinal` in this state.
    pub fn can_read(&self, user: &str, doc_ordinal: u32) -> bool {
        self.view
            .users
            .get(user)
            .is_some_and(|u| u.bits.contains(doc_ordinal))
    }

    /// The user's groups, roles and flags, if the user exists.
    pub fn user(&self, user: &str) -> Option<UserInfo> {
        self.view.users.get_key_value(user).map(|(id, u)| UserInfo {
            user_id: id.to_string(),
            groups: u.groups.iter().map(|g| g.to_string()).collect(),
            roles: u.roles.to_vec(),
            local: u.local,
            has_token: u.has_token,
            readable_documents: u.bits.len(),
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
