//! [`Acl`]: the handle the daemon holds. Writers (admin changes, syncs) are serialised by one
//! lock and follow the same steps: validate, write rows in one `BEGIN IMMEDIATE` transaction,
//! update the in-memory model, recompute the affected users' bitmaps, append the audit entry,
//! commit, then publish a new [`View`] with one atomic store. Readers only load the published view.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rayon::prelude::*;
use roaring::RoaringBitmap;
use rusqlite::{Connection, Transaction, TransactionBehavior};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::allow::AllowSet;
use crate::audit::{self, AuditEntry, AuditKind, AuditQuery, AuditSink, Record};
use crate::error::{Error, IdKind, check_id};
use crate::model::{Grant, Model, Name, Role, Touched};
use crate::sets::{self, AllowCache};
use crate::view::{AclSnapshot, Principal, TokenMap, UserInfo, UserView, View};
use crate::{ordinals, snapshot, store, token};

/// A new user for [`Acl::add_user`] (`airlock user add ID --groups ... [--admin]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    /// Group ids.
    pub groups: Vec<String>,
    /// Roles (`admin` for an appliance operator).
    #[serde(default)]
    pub roles: Vec<Role>,
    /// Created on the appliance, outside the IAM snapshot: a sync never removes the user or
    /// their token. Set it for operators (`user add --admin`, `airlock demo`).
    #[serde(default)]
    pub local: bool,
}

/// Body of `PUT /v1/acl/users/{user_id}`: `{"groups": [...], "roles": ["admin"]?}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSpec {
    /// The user's complete group list (replaces the current one).
    pub groups: Vec<String>,
    /// The complete role list; absent keeps the current roles (none for a new user).
    #[serde(default)]
    pub roles: Option<Vec<Role>>,
}

/// Result of [`Acl::put_user`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PutUserOutcome {
    /// The user did not exist and was created (as a local user, without a token).
    pub created: bool,
    /// The user's readable set changed.
    pub access_changed: bool,
}

/// Who may read one document: body of `PUT /v1/acl/documents/{doc_id}`, the `acl` object of
/// `PUT /v1/documents/{doc_id}`, and the admin `GET` view. Empty lists: readable by nobody.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DocGrants {
    /// User ids granted by name.
    pub users: Vec<String>,
    /// Group ids whose members may read.
    pub groups: Vec<String>,
}

/// Who makes an admin change, for its audit row: the acting user and, for a change made over
/// HTTP, the request id. A plain `&str` is an actor without a request id (CLI, tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Actor<'a> {
    /// The acting user (or the CLI's fixed actor name).
    pub user_id: &'a str,
    /// The HTTP request that made the change.
    pub request_id: Option<&'a str>,
}

impl<'a> From<&'a str> for Actor<'a> {
    fn from(user_id: &'a str) -> Self {
        Actor {
            user_id,
            request_id: None,
        }
    }
}

impl<'a> From<&'a String> for Actor<'a> {
    fn from(user_id: &'a String) -> Self {
        Actor::from(user_id.as_str())
    }
}

impl UserSpec {
    /// Checks the user id and every group id (what [`Acl::put_user`] refuses), so a caller can
    /// refuse a request before doing any other work.
    pub fn validate(&self, user_id: &str) -> Result<(), Error> {
        check_id(IdKind::User, user_id)?;
        check_ids(IdKind::Group, &self.groups)
    }
}

impl DocGrants {
    /// Checks the document id and every user and group id (what [`Acl::set_document_grants`]
    /// refuses), so a caller can refuse a request before doing any other work.
    pub fn validate(&self, doc_id: &str) -> Result<(), Error> {
        check_id(IdKind::Document, doc_id)?;
        check_ids(IdKind::User, &self.users)?;
        check_ids(IdKind::Group, &self.groups)
    }
}

/// Result of [`Acl::set_document_grants`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GrantOutcome {
    /// The document's ordinal (assigned now if the document had none).
    pub ordinal: u32,
    /// The stored grant differed from the new one.
    pub changed: bool,
    /// How many users gained or lost the document.
    pub users_access_changed: usize,
}

/// Counts returned by an IAM sync (the `POST /v1/acl/sync` response body).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncCounts {
    /// Users in the snapshot that did not exist.
    pub users_added: usize,
    /// Users (not local) that are absent from the snapshot and were removed with their tokens.
    pub users_removed: usize,
    /// (user, group) memberships added or removed, including those of removed users.
    pub memberships_changed: usize,
    /// Documents whose grant (users or groups) changed, including documents absent from the
    /// snapshot that lost their grant.
    pub grants_changed: usize,
    /// Users whose readable set differs afterwards (removed users who could read something
    /// count).
    pub users_access_changed: usize,
}

/// Options of [`Acl::sync_snapshot_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncOptions {
    /// Apply a snapshot with no user and no document line (removes every user but the local
    /// operators, and every grant). Refused otherwise.
    pub allow_empty: bool,
}

/// Users touched by one change, with their new entries computed before the commit.
#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) touched: Touched,
    pub(crate) tokens_changed: bool,
}

struct Prepared {
    users: Vec<(Name, Option<Arc<UserView>>)>,
    access_changed: usize,
    tokens: Option<Arc<TokenMap>>,
}

pub(crate) struct Writer {
    pub(crate) conn: Connection,
    pub(crate) model: Model,
    /// Set when the model may differ from the rows (a failure after it was mutated); the next
    /// writer reloads it first.
    stale: bool,
}

/// The access-control authority: open it once per process on the appliance's SQLite file and
/// share it (`Arc<Acl>`).
///
/// Reads (`allow_set`, `can_read`, `authenticate`, `snapshot`) are lock-free and never touch
/// SQLite. Writes and audit calls do blocking SQLite I/O: call them from a blocking thread
/// (`tokio::task::spawn_blocking`), not from an async task.
pub struct Acl {
    path: PathBuf,
    pub(crate) writer: Mutex<Writer>,
    /// Second connection for audit appends and admin lookups, so query-time audit entries never
    /// wait behind the writer lock (SQLite still serialises the commits themselves).
    pub(crate) side: Mutex<Connection>,
    view: ArcSwap<View>,
    /// Sign-in sessions and token last-use times ([`crate::session`]).
    pub(crate) sessions: Mutex<crate::session::Sessions>,
    /// The `seq` of the audit entry of the newest ACL change in force ([`Acl::state_seq`]).
    state_seq: AtomicI64,
    /// The external copy of the log and the last `seq` it holds ([`Acl::attach_audit_sink`]).
    sink: Mutex<Option<(Box<dyn AuditSink>, i64)>>,
}

impl std::fmt::Debug for Acl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acl")
            .field("path", &self.path)
            .field("generation", &self.view.load().generation)
            .finish_non_exhaustive()
    }
}

/// The user changes that make each listed user's groups what a sync says (an IAM snapshot's
/// users, or the directory's): users to add, memberships to replace and, with
/// `remove_unlisted`, the non-local users it does not list (never the last admin). Both syncs
/// diff, write and apply users through this one piece.
pub(crate) struct Memberships {
    removed: Vec<Name>,
    added: Vec<Name>,
    regrouped: Vec<(Name, BTreeSet<Name>)>,
}

impl Memberships {
    /// Diffs `users` (id, groups) against the model; fills the user counts of `counts`.
    pub(crate) fn diff<U, G, S>(
        m: &mut Model,
        users: U,
        remove_unlisted: bool,
        counts: &mut SyncCounts,
    ) -> Result<Self, Error>
    where
        U: IntoIterator<Item = (S, G)>,
        G: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut desired: Vec<(Name, BTreeSet<Name>)> = Vec::new();
        for (u, gs) in users {
            let u = m.intern(u.as_ref());
            let gs = gs.into_iter().map(|g| m.intern(g.as_ref())).collect();
            desired.push((u, gs));
        }
        let removed: Vec<Name> = if remove_unlisted {
            let named: HashSet<&Name> = desired.iter().map(|(u, _)| u).collect();
            m.users
                .iter()
                .filter(|(u, r)| !r.local && !named.contains(u))
                .map(|(u, _)| u.clone())
                .collect()
        } else {
            Vec::new()
        };
        keep_an_admin(m, &removed.iter().map(|u| &**u).collect::<Vec<_>>())?;
        let mut added = Vec::new();
        let mut regrouped = Vec::new();
        for (u, gs) in desired {
            match m.users.get(&u) {
                None => {
                    counts.memberships_changed += gs.len();
                    added.push(u.clone());
                    regrouped.push((u, gs));
                }
                Some(rec) if rec.groups != gs => {
                    counts.memberships_changed += rec.groups.symmetric_difference(&gs).count();
                    regrouped.push((u, gs));
                }
                Some(_) => {}
            }
        }
        for u in &removed {
            counts.memberships_changed += m.users.get(u).map_or(0, |r| r.groups.len());
        }
        counts.users_added = added.len();
        counts.users_removed = removed.len();
        Ok(Memberships {
            removed,
            added,
            regrouped,
        })
    }

    /// Writes the rows (inside the sync's transaction).
    pub(crate) fn write(&self, tx: &Transaction<'_>, context: &'static str) -> Result<(), Error> {
        for u in &self.removed {
            store::delete_user(tx, u).map_err(Error::db(context))?;
        }
        for u in &self.added {
            store::insert_user(tx, u, false).map_err(Error::db(context))?;
        }
        for (u, gs) in &self.regrouped {
            store::write_memberships(tx, u, gs).map_err(Error::db(context))?;
        }
        Ok(())
    }

    /// Applies the changes to the model once the rows are written.
    pub(crate) fn apply(self, m: &mut Model, p: &mut Pending) {
        for u in self.removed {
            m.remove_user(&u);
            p.touched.users.insert(u);
            p.tokens_changed = true;
        }
        for u in self.added {
            m.insert_user(u, false);
        }
        for (u, gs) in self.regrouped {
            m.set_user_groups(&u, gs);
            p.touched.users.insert(u);
        }
    }
}

/// Refuses a change that would leave no user with the `admin` role: `losing` are the admins it
/// removes or demotes.
fn keep_an_admin(m: &Model, losing: &[&str]) -> Result<(), Error> {
    let is_admin = |u: &str| {
        m.users
            .get(u)
            .is_some_and(|r| r.roles.contains(&Role::Admin))
    };
    let losing: Vec<&str> = losing.iter().copied().filter(|u| is_admin(u)).collect();
    let admins = m
        .users
        .values()
        .filter(|r| r.roles.contains(&Role::Admin))
        .count();
    match losing.first() {
        Some(u) if losing.len() >= admins => Err(Error::LastAdmin {
            user_id: (*u).to_owned(),
        }),
        _ => Ok(()),
    }
}

fn check_ids<S: AsRef<str>>(kind: IdKind, ids: &[S]) -> Result<(), Error> {
    ids.iter().try_for_each(|i| check_id(kind, i.as_ref()))
}

fn user_view(model: &Model, user: &Name) -> Option<Arc<UserView>> {
    let rec = model.users.get(user)?;
    Some(Arc::new(UserView {
        groups: rec
            .groups
            .iter()
            .map(|g| (g.clone(), model.group_docs.get(g).cloned()))
            .collect(),
        direct: model.user_docs.get(user).cloned(),
        roles: rec.roles.iter().copied().collect(),
        local: rec.local,
        has_token: rec.token.is_some(),
    }))
}

fn token_map(model: &Model) -> Arc<TokenMap> {
    Arc::new(
        model
            .users
            .iter()
            .filter_map(|(u, r)| r.token.map(|t| (t, (u.clone(), r.token_expires_us))))
            .collect(),
    )
}

/// Builds the view of every user from scratch (start-up and recovery). No bitmap is copied or
/// united: each user's entry shares the model's group and direct-grant bitmaps.
fn full_view(model: &Model, generation: u64, cache: Arc<AllowCache>) -> View {
    let users = model
        .users
        .keys()
        .filter_map(|u| Some((u.clone(), user_view(model, u)?)))
        .collect();
    View {
        generation,
        users,
        tokens: token_map(model),
        cache,
    }
}

impl Acl {
    /// Opens (creating if needed) the ACL tables in the SQLite file at `path`, applies pending
    /// migrations (including the shared `doc_ordinals` table), loads every row and materialises
    /// every user's bitmap.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref().to_owned();
        let mut conn = store::connect(&path)?;
        store::migrate(&mut conn)?;
        let model = store::load(&conn)?;
        let view = full_view(&model, 0, Arc::new(AllowCache::default()));
        let side = store::connect(&path)?;
        let sessions = crate::session::Sessions::load(&conn)?;
        conn.execute_batch(audit::RECEIPT_INDEX)
            .map_err(Error::db("creating the receipt index"))?;
        let state_seq = audit::max_seq(&conn, Some(&[AuditKind::Admin, AuditKind::Sync]))?;
        tracing::info!(
            users = view.users.len(),
            grants = model.grants.len(),
            "acl state loaded"
        );
        Ok(Self {
            path,
            writer: Mutex::new(Writer {
                conn,
                model,
                stale: false,
            }),
            side: Mutex::new(side),
            view: ArcSwap::from_pointee(view),
            sessions: Mutex::new(sessions),
            state_seq: AtomicI64::new(state_seq),
            sink: Mutex::new(None),
        })
    }

    /// The ACL state version: the audit `seq` of the newest ACL change (users, roles, tokens,
    /// grants, syncs) this process has in force. Replaying the log's `admin` and `sync` entries
    /// up to it gives the state. At open it is the newest `admin`/`sync` entry's `seq` (an
    /// upper bound: no ACL change lies between the true one and it).
    pub fn state_seq(&self) -> i64 {
        self.state_seq.load(Ordering::Acquire)
    }

    /// Copies every audit entry committed from now on, and those after `after` (a `seq`;
    /// `None`: the newest one now), to `sink`, in `seq` order, right after each append.
    /// Entries other processes append (the CLI) are copied with the daemon's next append.
    pub fn attach_audit_sink(
        &self,
        sink: Box<dyn AuditSink>,
        after: Option<i64>,
    ) -> Result<(), Error> {
        let after = match after {
            Some(a) => a,
            None => audit::max_seq(&self.side.lock(), None)?,
        };
        *self.sink.lock() = Some((sink, after));
        self.flush_sink();
        Ok(())
    }

    /// Hands the entries the sink lacks to it. A failing sink is logged and offered them again
    /// next time: SQLite is the record, the sink a copy.
    pub(crate) fn flush_sink(&self) {
        let mut guard = self.sink.lock();
        let Some((sink, after)) = guard.as_mut() else {
            return;
        };
        loop {
            let q = AuditQuery {
                limit: Some(1000),
                ..AuditQuery::default()
            };
            let entries = match audit::query_after(&self.side.lock(), &q, *after) {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!(error = %e, "audit sink: reading new entries failed");
                    return;
                }
            };
            let Some(last) = entries.last().map(|e| e.seq) else {
                return;
            };
            if let Err(e) = sink.write(&entries) {
                tracing::error!(error = %e, after = *after,
                    "audit sink: write failed; the entries are offered again with the next append");
                return;
            }
            *after = last;
            if entries.len() < 1000 {
                return;
            }
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current complete state, for several decisions that must agree with each other.
    pub fn snapshot(&self) -> AclSnapshot {
        AclSnapshot {
            view: self.view.load_full(),
        }
    }

    /// The documents `user` may read now, for one search. An unknown user gets the empty set.
    /// See [`AclSnapshot::allow_set`]: the union of the user's group and direct-grant bitmaps,
    /// materialised once per request or found in the bounded cache.
    pub fn allow_set(&self, user: &str) -> AllowSet {
        self.snapshot().allow_set(user)
    }

    /// Generation-time re-check: may `user` read the document with this ordinal in the *current*
    /// state (not the state the search ran against)? A hash lookup and a bitmap probe, no I/O;
    /// cheap enough per chunk.
    pub fn can_read(&self, user: &str, doc_ordinal: u32) -> bool {
        self.view
            .load()
            .users
            .get(user)
            .is_some_and(|u| u.can_read(doc_ordinal))
    }

    /// Resolves `Authorization: Bearer <token>` to a principal, or `None` (→ 401) for an
    /// unknown, rotated or revoked token, or a removed user. The token is hashed with SHA-256
    /// and the digest looked up; see [`crate::token`] for why this needs no constant-time
    /// comparison of the token itself.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        self.snapshot().authenticate(token)
    }

    /// The user's groups, roles and flags, if the user exists.
    pub fn user(&self, user: &str) -> Option<UserInfo> {
        self.snapshot().user(user)
    }

    /// Creates a user with groups and roles and issues their first bearer token, which is
    /// returned and never retrievable again (`airlock user add`, `airlock demo`).
    /// Errors: [`Error::UserExists`], [`Error::InvalidId`].
    pub fn add_user<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        user_id: &str,
        new: &NewUser,
    ) -> Result<String, Error> {
        let actor = actor.into();
        check_id(IdKind::User, user_id)?;
        check_ids(IdKind::Group, &new.groups)?;
        let (token, digest) = token::generate();
        self.mutate(
            |tx, m, p| {
                if m.users.contains_key(user_id) {
                    return Err(Error::UserExists {
                        user_id: user_id.to_owned(),
                    });
                }
                let u = m.intern(user_id);
                let groups: BTreeSet<Name> = new.groups.iter().map(|g| m.intern(g)).collect();
                let roles: BTreeSet<Role> = new.roles.iter().copied().collect();
                let e = Error::db("adding a user");
                store::insert_user(tx, user_id, new.local).map_err(e)?;
                store::write_memberships(tx, user_id, &groups)
                    .map_err(Error::db("adding a user"))?;
                store::write_roles(tx, user_id, &roles).map_err(Error::db("adding a user"))?;
                store::write_token(tx, user_id, &digest, None)
                    .map_err(Error::db("adding a user"))?;
                m.insert_user(u.clone(), new.local);
                m.set_user_groups(&u, groups);
                if let Some(rec) = m.users.get_mut(&u) {
                    rec.roles = roles;
                    rec.token = Some(digest);
                }
                p.touched.users.insert(u);
                p.tokens_changed = true;
                Ok(())
            },
            |_, _| Record {
                kind: AuditKind::Admin,
                actor: Some(actor.user_id),
                user_id: Some(user_id),
                request_id: actor.request_id,
                detail: json!({"action": "user_add", "groups": new.groups,
                               "roles": new.roles, "local": new.local}),
            },
        )?;
        Ok(token)
    }

    /// `PUT /v1/acl/users/{user_id}`: replaces the user's groups (and roles when given). A new
    /// id is created as a local user without a token (issue one with [`Acl::issue_token`]).
    pub fn put_user<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        user_id: &str,
        spec: &UserSpec,
    ) -> Result<PutUserOutcome, Error> {
        let actor = actor.into();
        check_id(IdKind::User, user_id)?;
        check_ids(IdKind::Group, &spec.groups)?;
        let (created, access_changed) = self.mutate(
            |tx, m, p| {
                let u = m.intern(user_id);
                let created = !m.users.contains_key(user_id);
                let groups: BTreeSet<Name> = spec.groups.iter().map(|g| m.intern(g)).collect();
                let roles: BTreeSet<Role> = match &spec.roles {
                    Some(r) => r.iter().copied().collect(),
                    None => m
                        .users
                        .get(user_id)
                        .map(|r| r.roles.clone())
                        .unwrap_or_default(),
                };
                if !roles.contains(&Role::Admin) {
                    keep_an_admin(m, &[user_id])?;
                }
                if created {
                    store::insert_user(tx, user_id, true).map_err(Error::db("creating a user"))?;
                }
                store::write_memberships(tx, user_id, &groups)
                    .map_err(Error::db("updating a user"))?;
                store::write_roles(tx, user_id, &roles).map_err(Error::db("updating a user"))?;
                if created {
                    m.insert_user(u.clone(), true);
                }
                m.set_user_groups(&u, groups);
                if let Some(rec) = m.users.get_mut(&u) {
                    rec.roles = roles;
                }
                p.touched.users.insert(u);
                Ok(created)
            },
            |created, _| Record {
                kind: AuditKind::Admin,
                actor: Some(actor.user_id),
                user_id: Some(user_id),
                request_id: actor.request_id,
                detail: json!({"action": "user_put", "created": created,
                               "groups": spec.groups, "roles": spec.roles}),
            },
        )?;
        Ok(PutUserOutcome {
            created,
            access_changed: access_changed > 0,
        })
    }

    /// Removes a user (local or not) with memberships, roles and token: their token fails at
    /// once and their set becomes empty. Grants naming the id stay on the documents.
    /// Errors: [`Error::UnknownUser`].
    pub fn remove_user<'a>(&self, actor: impl Into<Actor<'a>>, user_id: &str) -> Result<(), Error> {
        let actor = actor.into();
        self.mutate(
            |tx, m, p| {
                let Some(u) = m.users.get_key_value(user_id).map(|(k, _)| k.clone()) else {
                    return Err(Error::UnknownUser {
                        user_id: user_id.to_owned(),
                    });
                };
                keep_an_admin(m, &[user_id])?;
                store::delete_user(tx, user_id).map_err(Error::db("removing a user"))?;
                m.remove_user(&u);
                p.touched.users.insert(u);
                p.tokens_changed = true;
                Ok(())
            },
            |_, _| Record {
                kind: AuditKind::Admin,
                actor: Some(actor.user_id),
                user_id: Some(user_id),
                request_id: actor.request_id,
                detail: json!({"action": "user_remove"}),
            },
        )
        .map(|_| ())
    }

    /// Issues a new bearer token for an existing user, invalidating the previous one at once
    /// (`POST /v1/acl/users/{id}/token`, `airlock user token ID`). The token is returned once;
    /// only its SHA-256 is stored. Errors: [`Error::UnknownUser`].
    pub fn issue_token<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        user_id: &str,
    ) -> Result<String, Error> {
        self.issue_token_expiring(actor, user_id, None)
    }

    /// [`Acl::issue_token`] with a lifetime: the token authenticates nobody once `ttl` has
    /// passed (`None`: until rotated or revoked). `airlock user token ID --ttl 30d`.
    pub fn issue_token_expiring<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        user_id: &str,
        ttl: Option<std::time::Duration>,
    ) -> Result<String, Error> {
        let actor = actor.into();
        let (token, digest) = token::generate();
        let expires_us = ttl.map(|t| {
            store::now_us().saturating_add(i64::try_from(t.as_micros()).unwrap_or(i64::MAX))
        });
        self.mutate(
            |tx, m, p| {
                let Some(u) = m.users.get_key_value(user_id).map(|(k, _)| k.clone()) else {
                    return Err(Error::UnknownUser {
                        user_id: user_id.to_owned(),
                    });
                };
                store::write_token(tx, user_id, &digest, expires_us)
                    .map_err(Error::db("storing a token"))?;
                if let Some(rec) = m.users.get_mut(&u) {
                    rec.token = Some(digest);
                    rec.token_expires_us = expires_us;
                }
                p.touched.users.insert(u);
                p.tokens_changed = true;
                Ok(())
            },
            |_, _| Record {
                kind: AuditKind::Admin,
                actor: Some(actor.user_id),
                user_id: Some(user_id),
                request_id: actor.request_id,
                detail: json!({"action": "token_issue", "expires_us": expires_us}),
            },
        )?;
        Ok(token)
    }

    /// `PUT /v1/acl/documents/{doc_id}` (and the `acl` of `PUT /v1/documents/{doc_id}`):
    /// replaces who may read the document. Assigns the document's ordinal if it has none yet.
    /// Only the users named in the old or new grant and the members of its old or new groups are
    /// recomputed.
    pub fn set_document_grants<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        doc_id: &str,
        grants: &DocGrants,
    ) -> Result<GrantOutcome, Error> {
        self.set_document_grants_with(actor, doc_id, grants, |_| Ok(()), || {})
    }

    /// [`Acl::set_document_grants`] with another write in the same SQLite transaction: `also`
    /// runs after the grant rows are written and before the commit (an `Err` from it rolls the
    /// grant back with it, and nothing changes), and `before_publish` runs after the commit,
    /// just before the new readable sets are published.
    ///
    /// `PUT /v1/documents/{doc_id}` with an `acl` stores the document's content through
    /// `also`, so content and grant commit together or not at all, and hides the old version's
    /// chunks in `before_publish`, so no reader ever sees the old content under the new grant.
    pub fn set_document_grants_with<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        doc_id: &str,
        grants: &DocGrants,
        also: impl FnOnce(&Transaction<'_>) -> Result<(), Error>,
        before_publish: impl FnOnce(),
    ) -> Result<GrantOutcome, Error> {
        let actor = actor.into();
        grants.validate(doc_id)?;
        let ((ordinal, changed), access_changed) = self.mutate_with(
            |tx, m, p| {
                let (ordinal, fresh) = resolve_ordinal(tx, m, doc_id)?;
                let g = m.grant_from(&grants.users, &grants.groups);
                let old = m.grants.get(&ordinal).cloned().unwrap_or_default();
                let changed = old != g;
                if changed {
                    store::write_grant(tx, ordinal, &old, &g)
                        .map_err(Error::db("writing a document grant"))?;
                }
                // Before the model is touched: an `Err` here leaves it as it was.
                also(tx)?;
                if let Some(id) = fresh {
                    m.ordinals.insert(id, ordinal);
                }
                m.set_grant(ordinal, g, &mut p.touched);
                Ok((ordinal, changed))
            },
            |_, _| Record {
                kind: AuditKind::Admin,
                actor: Some(actor.user_id),
                user_id: None,
                request_id: actor.request_id,
                detail: json!({"action": "document_grants", "doc_id": doc_id,
                               "users": grants.users, "groups": grants.groups}),
            },
            before_publish,
        )?;
        Ok(GrantOutcome {
            ordinal,
            changed,
            users_access_changed: access_changed,
        })
    }

    /// The stored grant of a document for the admin `GET /v1/documents/{doc_id}` view (users and
    /// groups sorted), or `None` if the id has never been seen (no ordinal). A document with an
    /// ordinal but no grant yields empty lists (readable by nobody).
    pub fn document_grants(&self, doc_id: &str) -> Result<Option<DocGrants>, Error> {
        let side = self.side.lock();
        let Some(ordinal) =
            ordinals::lookup(&side, doc_id).map_err(Error::db("looking up a document"))?
        else {
            return Ok(None);
        };
        let (users, groups) =
            store::read_grant(&side, ordinal).map_err(Error::db("reading a document grant"))?;
        Ok(Some(DocGrants { users, groups }))
    }

    /// The ordinal of a document id, if it has one.
    pub fn ordinal(&self, doc_id: &str) -> Result<Option<u32>, Error> {
        ordinals::lookup(&self.side.lock(), doc_id).map_err(Error::db("looking up a document"))
    }

    /// Applies a full JSON Lines IAM snapshot (`POST /v1/acl/sync`, `airlock acl sync FILE`).
    ///
    /// The whole input is parsed and validated first: any malformed line, unknown field, or
    /// user or document named twice rejects the snapshot with [`Error::Snapshot`] naming the
    /// lines, and nothing is applied. Otherwise the diff against the current state is written in
    /// one transaction: users absent from the snapshot are removed with their tokens unless they
    /// are local (operators); the memberships of every named user become the snapshot's; every
    /// document's grant becomes its line's, and documents without a line lose their grant. Local
    /// users keep their roles and token; if the snapshot names one, its groups apply to it.
    /// Only the affected users' bitmaps are recomputed, then the new state is swapped in.
    /// Applying the same snapshot twice changes nothing (all counts zero the second time).
    ///
    /// A snapshot with no line at all (which would remove every user but the local operators,
    /// and every grant) is refused with [`Error::EmptySnapshot`]; see
    /// [`Acl::sync_snapshot_with`] to apply one on purpose.
    pub fn sync_snapshot<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        input: impl Read,
    ) -> Result<SyncCounts, Error> {
        self.sync_snapshot_with(actor, input, SyncOptions::default())
    }

    /// [`Acl::sync_snapshot`] with options (`allow_empty`: apply an empty snapshot).
    pub fn sync_snapshot_with<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        input: impl Read,
        options: SyncOptions,
    ) -> Result<SyncCounts, Error> {
        let actor = actor.into();
        let started = std::time::Instant::now();
        let buf = snapshot::read_all(input)?;
        let snap = snapshot::parse(&buf)?;
        if snap.users.is_empty() && snap.docs.is_empty() && !options.allow_empty {
            return Err(Error::EmptySnapshot);
        }
        tracing::info!(
            parse_ms = started.elapsed().as_millis() as u64,
            users = snap.users.len(),
            docs = snap.docs.len(),
            "acl snapshot parsed"
        );
        let (counts, access_changed) = self.mutate(
            |tx, m, p| apply_snapshot(tx, m, p, &snap),
            |counts, access_changed| Record {
                kind: AuditKind::Sync,
                actor: Some(actor.user_id),
                user_id: None,
                request_id: actor.request_id,
                detail: json!(SyncCounts {
                    users_access_changed: access_changed,
                    ..*counts
                }),
            },
        )?;
        Ok(SyncCounts {
            users_access_changed: access_changed,
            ..counts
        })
    }

    /// Audits an admin change made outside this crate (document writes, deletes, reconcile,
    /// purge): ids and counts only, never content.
    pub fn audit_admin<'a>(
        &self,
        actor: impl Into<Actor<'a>>,
        detail: serde_json::Value,
    ) -> Result<(), Error> {
        let actor = actor.into();
        audit::append(
            &self.side.lock(),
            &Record {
                kind: AuditKind::Admin,
                actor: Some(actor.user_id),
                user_id: None,
                request_id: actor.request_id,
                detail,
            },
        )?;
        self.flush_sink();
        Ok(())
    }

    /// Appends one receipt entry (kind `receipt`) about `user_id`'s answer to `request_id`:
    /// `detail` holds `receipt_id` and ids, versions and digests only. Returns its `seq`.
    pub fn audit_receipt(
        &self,
        request_id: &str,
        user_id: &str,
        detail: serde_json::Value,
    ) -> Result<i64, Error> {
        if detail.get("receipt_id").and_then(|v| v.as_str()).is_none() {
            return Err(Error::Corrupt {
                detail: "a receipt entry needs a receipt_id".into(),
            });
        }
        let seq = {
            let side = self.side.lock();
            audit::append(
                &side,
                &Record {
                    kind: AuditKind::Receipt,
                    actor: None,
                    user_id: Some(user_id),
                    request_id: Some(request_id),
                    detail,
                },
            )?;
            side.last_insert_rowid()
        };
        self.flush_sink();
        Ok(seq)
    }

    /// The `receipt` entries of `receipt_id`, oldest first (empty: no such receipt).
    pub fn receipt_entries(&self, receipt_id: &str) -> Result<Vec<AuditEntry>, Error> {
        audit::receipt(&self.side.lock(), receipt_id)
    }

    /// Audits the document ids shown to `user_id` (used as context or cited) for one request.
    pub fn audit_shown<S: AsRef<str>>(
        &self,
        request_id: &str,
        user_id: &str,
        doc_ids: &[S],
    ) -> Result<(), Error> {
        self.audit_query_time(AuditKind::Shown, request_id, user_id, doc_ids)
    }

    /// Audits documents dropped by the generation-time re-check for one request.
    pub fn audit_recheck_drop<S: AsRef<str>>(
        &self,
        request_id: &str,
        user_id: &str,
        doc_ids: &[S],
    ) -> Result<(), Error> {
        self.audit_query_time(AuditKind::RecheckDrop, request_id, user_id, doc_ids)
    }

    fn audit_query_time<S: AsRef<str>>(
        &self,
        kind: AuditKind,
        request_id: &str,
        user_id: &str,
        doc_ids: &[S],
    ) -> Result<(), Error> {
        check_id(IdKind::Request, request_id)?;
        let ids: Vec<&str> = doc_ids.iter().map(AsRef::as_ref).collect();
        audit::append(
            &self.side.lock(),
            &Record {
                kind,
                actor: None,
                user_id: Some(user_id),
                request_id: Some(request_id),
                detail: json!({ "doc_ids": ids }),
            },
        )?;
        self.flush_sink();
        Ok(())
    }

    /// Audit entries matching `q`, oldest first (`airlock audit --user u017 --since ...`).
    pub fn audit_query(&self, q: &AuditQuery) -> Result<Vec<AuditEntry>, Error> {
        audit::query(&self.side.lock(), q)
    }

    /// [`Acl::audit_query`] over the entries after `after` (a `seq`): pages through the log.
    pub fn audit_query_after(&self, q: &AuditQuery, after: i64) -> Result<Vec<AuditEntry>, Error> {
        audit::query_after(&self.side.lock(), q, after)
    }

    /// When the last full IAM sync (an IAM snapshot or a directory sync; not one user's
    /// sign-in) was applied, Unix microseconds, from the audit log (the daemon's
    /// `airlock_iam_sync_last_success_timestamp_seconds` at start).
    pub fn last_full_sync_us(&self) -> Result<Option<i64>, Error> {
        self.side
            .lock()
            .query_row(
                "SELECT max(at_us) FROM acl_audit WHERE kind = 'sync' AND user_id IS NULL",
                [],
                |r| r.get(0),
            )
            .map_err(Error::db("reading the last sync time"))
    }

    /// The writer protocol. `op` validates, writes rows through `tx`, then mutates the model
    /// (infallibly) and records the touched users; an `Err` from `op` must leave the model
    /// unchanged. Anything failing after `op` marks the model stale (reloaded by the next write).
    /// Returns `op`'s value and how many users' readable sets changed.
    pub(crate) fn mutate<'r, T>(
        &self,
        op: impl FnOnce(&Transaction<'_>, &mut Model, &mut Pending) -> Result<T, Error>,
        record: impl FnOnce(&T, usize) -> Record<'r>,
    ) -> Result<(T, usize), Error> {
        self.mutate_with(op, record, || {})
    }

    /// [`Acl::mutate`] with a hook run after the commit, before the new view is published.
    fn mutate_with<'r, T>(
        &self,
        op: impl FnOnce(&Transaction<'_>, &mut Model, &mut Pending) -> Result<T, Error>,
        record: impl FnOnce(&T, usize) -> Record<'r>,
        before_publish: impl FnOnce(),
    ) -> Result<(T, usize), Error> {
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        if w.stale {
            w.model = store::load(&w.conn)?;
            let old = self.view.load();
            self.view.store(Arc::new(full_view(
                &w.model,
                old.generation + 1,
                old.cache.clone(),
            )));
            w.stale = false;
        }
        let tx = w
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(Error::db("starting a transaction"))?;
        let mut pending = Pending::default();
        let value = op(&tx, &mut w.model, &mut pending)?;
        let users_may_be_gone = pending.tokens_changed;
        // From here on the model is ahead of the rows until the commit succeeds.
        let t = std::time::Instant::now();
        let prepared = prepare(&w.model, &self.view.load(), pending, sets::CANDIDATE_BUDGET);
        let recompute_ms = t.elapsed().as_millis() as u64;
        let rec = record(&value, prepared.access_changed);
        // Sessions of users this change removes end with it: one sign-in entry per user, in the
        // change's transaction.
        let ended = if users_may_be_gone {
            self.sessions.lock().ending(&w.model)
        } else {
            Vec::new()
        };
        let mut change_seq = 0;
        let committed = audit::append(&tx, &rec)
            .map(|()| change_seq = tx.last_insert_rowid())
            .and_then(|()| {
                ended
                    .iter()
                    .try_for_each(|(u, n)| audit::append(&tx, &sessions_ended(&rec, u, *n)))
            })
            .and_then(|()| tx.commit().map_err(Error::db("committing a change")));
        if let Err(e) = committed {
            w.stale = true;
            return Err(e);
        }
        self.state_seq.fetch_max(change_seq, Ordering::AcqRel);
        tracing::info!(
            recompute_ms,
            recomputed = prepared.users.len(),
            access_changed = prepared.access_changed,
            commit_ms = (t.elapsed().as_millis() as u64).saturating_sub(recompute_ms),
            "acl change committed"
        );
        if users_may_be_gone {
            // Sessions of removed users: their rows went with the user's (store::delete_user).
            self.sessions.lock().retain_users(&w.model);
        }
        before_publish();
        let old = self.view.load_full();
        let mut users = old.users.clone();
        for (u, v) in prepared.users {
            match v {
                Some(v) => users.insert(u, v),
                None => users.remove(&u),
            };
        }
        self.view.store(Arc::new(View {
            generation: old.generation + 1,
            users,
            tokens: prepared.tokens.unwrap_or_else(|| old.tokens.clone()),
            cache: old.cache.clone(),
        }));
        drop(guard);
        self.flush_sink();
        Ok((value, prepared.access_changed))
    }
}

/// The audit entry of `n` sessions of `user` ended by the change `cause` (a sync that no longer
/// lists the user, `user remove`).
fn sessions_ended<'r>(cause: &Record<'r>, user: &'r str, n: usize) -> Record<'r> {
    let by = match cause.kind {
        AuditKind::Sync => match cause.detail.get("source").and_then(|s| s.as_str()) {
            Some(source) => format!("{source}_sync"),
            None => "iam_sync".to_owned(),
        },
        _ => cause
            .detail
            .get("action")
            .and_then(|a| a.as_str())
            .unwrap_or(cause.kind.as_str())
            .to_owned(),
    };
    Record {
        kind: AuditKind::SignIn,
        actor: cause.actor,
        user_id: Some(user),
        request_id: cause.request_id,
        detail: json!({"method": "session", "outcome": "sessions_ended", "ended_by": by,
                       "sessions": n}),
    }
}

/// Builds the new entries of the touched users (sharing the model's bitmaps) and counts whose
/// readable set differs from the current view's, without materialising the sets in the common
/// case ([`sets::access_changed`], `budget` probes per user before it compares unions).
fn prepare(model: &Model, current: &View, pending: Pending, budget: usize) -> Prepared {
    let touched: Vec<Name> = pending.touched.users(model).into_iter().collect();
    let users: Vec<(Name, Option<Arc<UserView>>)> = touched
        .into_iter()
        .map(|u| {
            let v = user_view(model, &u);
            (u, v)
        })
        .collect();
    fn lineages<'a>(
        current: &'a View,
        u: &Name,
        new: &'a Option<Arc<UserView>>,
    ) -> (Option<sets::Lineages<'a>>, Option<sets::Lineages<'a>>) {
        (
            current.users.get(u).map(|v| v.lineages()),
            new.as_ref().map(|v| v.lineages()),
        )
    }
    // old ⊕ new of each edited bitmap, once per bitmap however many users share it.
    let mut pairs = HashMap::new();
    for (u, new) in &users {
        if let (Some(o), Some(n)) = lineages(current, u, new) {
            sets::changed_pairs(o, n, |o, n| {
                if let (Some(o), Some(n)) = (o, n) {
                    pairs.insert((o.id, n.id), (o, n));
                }
            });
        }
    }
    let pairs: Vec<_> = pairs.into_values().collect();
    let deltas: sets::Deltas = pairs
        .par_chunks(1.max(pairs.len() / 64))
        .map(|chunk| sets::deltas(chunk.iter().copied()))
        .reduce(sets::Deltas::new, |mut a, b| {
            a.extend(b);
            a
        });
    let access_changed = users
        .par_iter()
        .filter(|(u, new)| {
            let (o, n) = lineages(current, u, new);
            sets::access_changed(o, n, &deltas, budget)
        })
        .count();
    Prepared {
        users,
        access_changed,
        tokens: pending.tokens_changed.then(|| token_map(model)),
    }
}

/// Resolves a document's ordinal, assigning one in `tx` if needed; the second value is the id to
/// add to the cache once the model may be mutated.
fn resolve_ordinal(
    tx: &Transaction<'_>,
    m: &mut Model,
    doc_id: &str,
) -> Result<(u32, Option<Name>), Error> {
    if let Some(&o) = m.ordinals.get(doc_id) {
        return Ok((o, None));
    }
    let o = ordinals::ensure(tx, doc_id).map_err(Error::db("assigning a document ordinal"))?;
    Ok((o, Some(m.intern(doc_id))))
}

/// Sorted, deduplicated view of a line's names.
fn normalised<'s>(xs: &'s [snapshot::Str<'_>]) -> Vec<&'s str> {
    let mut v: Vec<&str> = xs.iter().map(|x| &**x).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn same_names(a: &[Name], b: &[&str]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| &**x == *y)
}

/// The sync diff: rows first, then the model (see [`Acl::sync_snapshot`]).
fn apply_snapshot(
    tx: &Transaction<'_>,
    m: &mut Model,
    p: &mut Pending,
    snap: &snapshot::Snapshot<'_>,
) -> Result<SyncCounts, Error> {
    let started = std::time::Instant::now();
    let mut counts = SyncCounts::default();

    // Users.
    let listed = snap
        .users
        .iter()
        .map(|(u, gs)| (&**u, gs.iter().map(|g| &**g)));
    let users = Memberships::diff(m, listed, true, &mut counts)?;

    // Documents: resolve ordinals (cache first, then the table, assigning new ones).
    let mut ords = Vec::with_capacity(snap.docs.len());
    let mut misses = Vec::new();
    for (i, (d, _, _)) in snap.docs.iter().enumerate() {
        match m.ordinals.get(&**d) {
            Some(&o) => ords.push(o),
            None => {
                ords.push(u32::MAX);
                misses.push(i);
            }
        }
    }
    let fresh = ordinals::ensure_many(tx, misses.iter().map(|&i| &*snap.docs[i].0))
        .map_err(Error::db("assigning document ordinals"))?;
    for (&i, &o) in misses.iter().zip(&fresh) {
        ords[i] = o;
    }
    // Compare every line with the stored grant by name, in parallel, without interning: only
    // the changed ones are built.
    let model: &Model = m;
    let diffs: Vec<(u32, Vec<&str>, Vec<&str>)> = snap
        .docs
        .par_iter()
        .zip(ords.par_iter())
        .filter_map(|((_, users, groups), &o)| {
            let (us, gs) = (normalised(users), normalised(groups));
            let same = match model.grants.get(&o) {
                Some(old) => same_names(&old.users, &us) && same_names(&old.groups, &gs),
                None => us.is_empty() && gs.is_empty(),
            };
            (!same).then_some((o, us, gs))
        })
        .collect();
    let in_snapshot: RoaringBitmap = ords.iter().copied().collect();
    let mut changed_grants: Vec<(u32, Grant)> = diffs
        .into_iter()
        .map(|(o, us, gs)| (o, m.grant_from(&us, &gs)))
        .collect();
    let mut dropped: Vec<u32> = m
        .grants
        .keys()
        .copied()
        .filter(|o| !in_snapshot.contains(*o))
        .collect();
    dropped.sort_unstable();
    changed_grants.extend(dropped.into_iter().map(|o| (o, Grant::default())));
    counts.grants_changed = changed_grants.len();
    let diffed = started.elapsed();

    // Rows.
    let e = || Error::db("applying an IAM snapshot");
    users.write(tx, "applying an IAM snapshot")?;
    let empty = Grant::default();
    for (o, g) in &changed_grants {
        let old = m.grants.get(o).unwrap_or(&empty);
        store::write_grant(tx, *o, old, g).map_err(e())?;
    }
    let written = started.elapsed();

    // Model (infallible from here).
    for (&i, &o) in misses.iter().zip(&fresh) {
        let id = m.intern(&snap.docs[i].0);
        m.ordinals.insert(id, o);
    }
    users.apply(m, p);
    for (o, g) in changed_grants {
        m.set_grant(o, g, &mut p.touched);
    }
    tracing::info!(
        diff_ms = diffed.as_millis() as u64,
        write_ms = (written - diffed).as_millis() as u64,
        model_ms = (started.elapsed() - written).as_millis() as u64,
        "acl snapshot diff applied"
    );
    Ok(counts)
}

#[cfg(test)]
mod two_level_tests {
    //! Property test of the two-level sets against the old flat union: random users, groups,
    //! grants, revocations, membership changes and removals applied to the writer's model and
    //! published the way [`Acl::mutate_with`] publishes them; after every change every user's
    //! `allow_set`, `can_read` and `readable_documents` equal a brute-force evaluation of the
    //! grants, the access-changed count is exact whatever the probe budget, and a snapshot taken
    //! before the change still shows the state it was taken in.

    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;

    const USERS: u8 = 8;
    const GROUPS: u8 = 5;
    /// Ordinals spread over several roaring containers (array and bitmap ones).
    const DOCS: u32 = 24;

    fn ordinal(d: u32) -> u32 {
        // Spread: two containers' worth of keys, and the last documents dense in one container.
        if d < 16 { d * 40_000 } else { 200_000 + d }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Grant {
            doc: u32,
            users: BTreeSet<u8>,
            groups: BTreeSet<u8>,
        },
        /// Grants one group a dense range (many candidates: exceeds small probe budgets).
        GrantRange {
            from: u32,
            len: u32,
            group: u8,
            revoke: bool,
        },
        SetGroups {
            user: u8,
            groups: BTreeSet<u8>,
        },
        AddUser {
            user: u8,
        },
        RemoveUser {
            user: u8,
        },
    }

    fn set(max: u8) -> impl Strategy<Value = BTreeSet<u8>> {
        prop::collection::btree_set(0..max, 0..3)
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..DOCS, set(USERS), set(GROUPS))
                .prop_map(|(doc, users, groups)| Op::Grant { doc, users, groups }),
            1 => (0..300u32, 0..300u32, 0..GROUPS, any::<bool>())
                .prop_map(|(from, len, group, revoke)| Op::GrantRange { from, len, group, revoke }),
            2 => (0..USERS, set(GROUPS)).prop_map(|(user, groups)| Op::SetGroups { user, groups }),
            2 => (0..USERS).prop_map(|user| Op::AddUser { user }),
            1 => (0..USERS).prop_map(|user| Op::RemoveUser { user }),
        ]
    }

    fn uname(u: u8) -> String {
        format!("u{u}")
    }
    fn gname(g: u8) -> String {
        format!("g{g}")
    }

    /// The readable set of every existing user straight from the grants (no group bitmaps).
    fn brute_force(m: &Model) -> BTreeMap<String, RoaringBitmap> {
        m.users
            .iter()
            .map(|(u, rec)| {
                let docs = m
                    .grants
                    .iter()
                    .filter(|(_, g)| {
                        g.users.contains(u) || g.groups.iter().any(|x| rec.groups.contains(x))
                    })
                    .map(|(o, _)| *o)
                    .collect();
                (u.to_string(), docs)
            })
            .collect()
    }

    fn apply(m: &mut Model, op: &Op, p: &mut Pending) {
        match op {
            Op::Grant { doc, users, groups } => {
                let us: Vec<String> = users.iter().map(|u| uname(*u)).collect();
                let gs: Vec<String> = groups.iter().map(|g| gname(*g)).collect();
                let g = m.grant_from(&us, &gs);
                m.set_grant(ordinal(*doc), g, &mut p.touched);
            }
            Op::GrantRange {
                from,
                len,
                group,
                revoke,
            } => {
                for o in 300_000 + from..300_000 + from + len {
                    let gs = if *revoke { vec![] } else { vec![gname(*group)] };
                    let g = m.grant_from(&[] as &[String], &gs);
                    m.set_grant(o, g, &mut p.touched);
                }
            }
            Op::SetGroups { user, groups } => {
                let u = m.intern(&uname(*user));
                let gs = groups.iter().map(|g| m.intern(&gname(*g))).collect();
                if m.users.contains_key(&u) {
                    m.set_user_groups(&u, gs);
                    p.touched.users.insert(u);
                }
            }
            Op::AddUser { user } => {
                let u = m.intern(&uname(*user));
                if !m.users.contains_key(&u) {
                    m.insert_user(u.clone(), false);
                    p.touched.users.insert(u);
                }
            }
            Op::RemoveUser { user } => {
                let u = m.intern(&uname(*user));
                if m.remove_user(&u).is_some() {
                    p.touched.users.insert(u);
                }
            }
        }
    }

    /// Publishes the prepared entries over `old` (what `mutate_with` does).
    fn publish(old: &View, prepared: Prepared) -> View {
        let mut users = old.users.clone();
        for (u, v) in prepared.users {
            match v {
                Some(v) => users.insert(u, v),
                None => users.remove(&u),
            };
        }
        View {
            generation: old.generation + 1,
            users,
            tokens: old.tokens.clone(),
            cache: old.cache.clone(),
        }
    }

    fn check(view: &Arc<View>, expected: &BTreeMap<String, RoaringBitmap>) {
        let snap = AclSnapshot { view: view.clone() };
        let docs: Vec<u32> = (0..DOCS).map(ordinal).chain(300_000..300_600).collect();
        for u in 0..USERS {
            let u = uname(u);
            let empty = RoaringBitmap::new();
            let want = expected.get(&u).unwrap_or(&empty);
            assert_eq!(snap.allow_set(&u).bitmap(), want, "allow_set of {u}");
            // Twice: the second may come from the cache.
            assert_eq!(snap.allow_set(&u).bitmap(), want, "allow_set of {u}, again");
            for &d in &docs {
                assert_eq!(snap.can_read(&u, d), want.contains(d), "can_read({u}, {d})");
            }
            assert_eq!(
                snap.user(&u).map(|i| i.readable_documents),
                expected.get(&u).map(RoaringBitmap::len)
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        #[test]
        fn two_level_sets_equal_the_flat_union(
            ops in prop::collection::vec(op(), 1..24),
            cache_entries in 0usize..4,
        ) {
            let mut m = Model::default();
            // A tiny cache: entries are evicted and reused across changes.
            let cache = Arc::new(AllowCache::new(4096, cache_entries));
            let mut view = Arc::new(full_view(&m, 0, cache));
            let mut before = brute_force(&m);
            for op in &ops {
                let old_snapshot = view.clone();
                let mut p = Pending::default();
                apply(&mut m, op, &mut p);
                let after = brute_force(&m);
                // The old flat kernel agrees with the brute force.
                for (u, want) in &after {
                    prop_assert_eq!(&m.materialise_user(u), want);
                }
                let empty = RoaringBitmap::new();
                let names: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
                let changed = names
                    .iter()
                    .filter(|u| {
                        before.get(**u).unwrap_or(&empty) != after.get(**u).unwrap_or(&empty)
                    })
                    .count();
                let touched = p.touched.clone().users(&m);
                for u in &names {
                    if !touched.contains(u.as_str()) {
                        prop_assert_eq!(before.get(*u), after.get(*u), "{} untouched", u);
                    }
                }
                let mut prepared = None;
                for budget in [0, 1, 3, sets::CANDIDATE_BUDGET] {
                    let pending = Pending { touched: p.touched.clone(), tokens_changed: false };
                    let got = prepare(&m, &view, pending, budget);
                    prop_assert_eq!(got.access_changed, changed, "budget {}", budget);
                    prepared = Some(got);
                }
                view = Arc::new(publish(&view, prepared.unwrap()));
                check(&view, &after);
                // The snapshot taken before the change still shows the old state.
                check(&old_snapshot, &before);
                // A restart (full view from the model) agrees.
                check(&Arc::new(full_view(&m, 0, Arc::new(AllowCache::default()))), &after);
                before = after;
            }
        }
    }
}
